//! SeedLM SEED4 / SEED4P4 against the NanoSeedLM reference: the LFSR, every decoded fixture bit
//! for bit (the page-aligned shard included), the encoder's error against the reference
//! encoder's, and `SeedLinear`.

use nnx::quant::{EncodeOptions, R32, SeedEncoding, SeedLinear, SeedWeight, lfsr_states};
use nnx::{Archive, DType, Tensor};

use crate::util::fixtures;

fn seedlm() -> std::path::PathBuf {
    fixtures().join("seedlm")
}

fn hex(text: &str) -> u64 {
    u64::from_str_radix(text.trim_start_matches("0x").trim_start_matches("0X"), 16).unwrap()
}

#[test]
fn lfsr_matches_the_reference_values() {
    let text = std::fs::read_to_string(seedlm().join("lfsr_reference.json")).unwrap();
    let reference: serde_json::Value = serde_json::from_str(&text).unwrap();
    for (seed, states) in reference["states_after_seed"].as_object().unwrap() {
        let expected: Vec<u16> = states.as_array().unwrap().iter().map(|s| hex(s.as_str().unwrap()) as u16).collect();
        assert_eq!(lfsr_states(hex(seed) as u16, expected.len()), expected, "seed {seed}");
    }
    assert_eq!(u64::from(R32.to_bits()), hex(reference["R32"]["f32_bits"].as_str().unwrap()));
    let mut hash: u64 = 0x1465_0FB0_739D_0383;
    for seed in 1..=u16::MAX {
        for state in lfsr_states(seed, 24) {
            hash = (hash ^ u64::from(state)).wrapping_mul(1_099_511_628_211);
        }
    }
    assert_eq!(hash, hex(reference["fnv_all_seeds"]["value"].as_str().unwrap()));
}

/// The encoded weight stored under `prefix` in `archive`.
fn seed_weight(archive: &Archive, prefix: &str, encoding: SeedEncoding) -> SeedWeight {
    let get = |stream: &str| archive.try_get(&format!("{prefix}.{stream}")).unwrap();
    let codes = (encoding == SeedEncoding::Seed4P4).then(|| get("codes"));
    SeedWeight::new(encoding, get("seeds"), get(encoding.coefficient_stream()), get("exp_bias"), codes).unwrap()
}

const CASES: [&str; 4] = ["1x4x64", "2x8x128", "1x16x256", "mixed_2x8x128"];

fn case_file(encoding: SeedEncoding, case: &str) -> std::path::PathBuf {
    let stem = if encoding == SeedEncoding::Seed4 { "seed4" } else { "seed4p4" };
    seedlm().join(format!("{stem}_{case}.safetensors"))
}

fn bits(tensor: &Tensor) -> Vec<u16> {
    bytemuck_u16(&tensor.to_bytes().unwrap())
}

fn bytemuck_u16(bytes: &[u8]) -> Vec<u16> {
    bytes.chunks_exact(2).map(|pair| u16::from_le_bytes([pair[0], pair[1]])).collect()
}

#[test]
fn decode_matches_every_reference_decode() {
    let mut values = 0;
    for encoding in [SeedEncoding::Seed4, SeedEncoding::Seed4P4] {
        for case in CASES {
            let archive = Archive::open(case_file(encoding, case)).unwrap();
            let decoded = seed_weight(&archive, "w", encoding).decode().unwrap();
            let reference = archive.try_get("w.decoded").unwrap();
            assert_eq!(decoded.dtype(), DType::BF16);
            assert_eq!(decoded.shape(), reference.shape(), "{case}");
            assert!(bits(&decoded) == bits(&reference), "{} {case}: decode differs", encoding.name());
            values += decoded.len();
        }
    }
    let shard = Archive::open(seedlm().join("shard")).unwrap();
    for (prefix, encoding) in [("seed4", SeedEncoding::Seed4), ("seed4p4", SeedEncoding::Seed4P4)] {
        let decoded = seed_weight(&shard, prefix, encoding).decode().unwrap();
        let reference = shard.try_get(&format!("{prefix}.decoded")).unwrap();
        assert!(bits(&decoded) == bits(&reference), "shard {prefix}: decode differs");
        values += decoded.len();
    }
    assert_eq!(values, 147_968);
}

#[test]
fn streams_are_checked_before_decoding() {
    let archive = Archive::open(case_file(SeedEncoding::Seed4P4, "1x4x64")).unwrap();
    let get = |stream: &str| archive.try_get(&format!("w.{stream}")).unwrap();
    let missing_codes = SeedWeight::new(SeedEncoding::Seed4P4, get("seeds"), get("coefs"), get("exp_bias"), None);
    assert!(matches!(missing_codes, Err(nnx::Error::QuantStream { stream: "codes", .. })));
    let swapped = SeedWeight::new(SeedEncoding::Seed4, get("seeds"), get("exp_bias"), get("coefs"), None);
    assert!(matches!(swapped, Err(nnx::Error::QuantStream { stream: "nibbles", .. })));
}

fn squared_error(a: &Tensor, b: &Tensor) -> f64 {
    let a = a.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap();
    let b = b.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap();
    a.iter().zip(&b).map(|(x, y)| (f64::from(*x) - f64::from(*y)).powi(2)).sum()
}

#[test]
fn encoder_error_is_within_five_percent_of_the_reference() {
    for encoding in [SeedEncoding::Seed4, SeedEncoding::Seed4P4] {
        let archive = Archive::open(case_file(encoding, "1x4x64")).unwrap();
        let source = archive.try_get("w.source").unwrap();
        let reference = squared_error(&archive.try_get("w.decoded").unwrap(), &source);
        let finished = std::sync::atomic::AtomicU64::new(0);
        let progress = |blocks: u64| {
            finished.fetch_add(blocks, std::sync::atomic::Ordering::Relaxed);
        };
        let options = EncodeOptions { progress: Some(&progress) };
        let encoded = SeedWeight::encode(&source, encoding, &options).unwrap();
        assert_eq!(finished.into_inner(), 32);
        let ours = squared_error(&encoded.decode().unwrap(), &source);
        assert!(ours <= reference * 1.05, "{}: error {ours} vs reference {reference}", encoding.name());
        let exp_bias = archive.try_get("w.exp_bias").unwrap().to_vec::<i32>().unwrap();
        assert_eq!(encoded.exp_bias.to_vec::<i32>().unwrap(), exp_bias, "{}", encoding.name());
    }
}

#[test]
fn seed_linear_decodes_inside_the_product() {
    let archive = Archive::open(case_file(SeedEncoding::Seed4P4, "mixed_2x8x128")).unwrap();
    let weight = seed_weight(&archive, "w", SeedEncoding::Seed4P4);
    let decoded = archive.try_get("w.decoded").unwrap().to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap();
    let layer = SeedLinear::new(weight, None).unwrap();
    let x = Tensor::from_vec((0..3 * 128).map(|i| ((i % 19) as f32 - 9.0) / 4.0).collect(), &[3, 128]).unwrap();
    let xs = x.to_vec::<f32>().unwrap();
    assert!(layer.forward(&x).is_err(), "two slices need `forward_slice`");
    for slice in 0..2 {
        let y = layer.forward_slice(&x, slice).unwrap();
        assert_eq!(y.shape(), &[3, 8]);
        for (at, value) in y.to_vec::<f32>().unwrap().into_iter().enumerate() {
            let (row, col) = (at / 8, at % 8);
            let w = &decoded[(slice * 8 + col) * 128..(slice * 8 + col + 1) * 128];
            let expected: f64 = w.iter().zip(&xs[row * 128..]).map(|(a, b)| f64::from(*a) * f64::from(*b)).sum();
            assert!((f64::from(value) - expected).abs() <= 1e-4 * (1.0 + expected.abs()), "{value} vs {expected}");
        }
    }
}

#[test]
fn nanoseedlm_folder_is_read_by_encoding() {
    use nnx::quantized::{QuantizedFolder, WeightEncoding};
    let folder = QuantizedFolder::open(seedlm().join("shard")).unwrap();
    assert_eq!(folder.weights(), ["seed4", "seed4p4"]);
    assert_eq!(folder.encoding("seed4").unwrap(), WeightEncoding::Seed(SeedEncoding::Seed4));
    assert_eq!(folder.encoding("seed4p4").unwrap(), WeightEncoding::Seed(SeedEncoding::Seed4P4));
    let decoded = folder.weight("seed4p4").unwrap().to_float(DType::BF16).unwrap().reshape(&[2, 32, 1024]).unwrap();
    assert!(bits(&decoded) == bits(&folder.archive().try_get("seed4p4.decoded").unwrap()));
    assert!(folder.encoding("seed4.decoded").is_err());
}

#[test]
fn written_folders_keep_streams_together_on_pages_with_an_overlay() {
    use nnx::quantized::{EncodedWeight, OVERLAY_FILE, QuantizedFolder, WeightEncoding, save_folder};
    let shard = QuantizedFolder::open(seedlm().join("shard")).unwrap();
    let mut archive = Archive::new();
    for name in ["seed4", "seed4p4"] {
        for (entry, tensor) in shard.weight(name).unwrap().streams(name) {
            archive.insert(entry, tensor);
        }
    }
    let plain = Tensor::from_vec(vec![0.5f32; 64 * 64], &[64, 64]).unwrap().to_dtype(DType::BF16).unwrap();
    for (entry, tensor) in EncodedWeight::Float(plain).streams("embed") {
        archive.insert(entry, tensor);
    }
    let dir = crate::util::scratch();
    // 40000 bytes: a shard holds one seed weight at most, so a split would show.
    save_folder(dir.path(), &archive, None, Some(40_000)).unwrap();
    let index: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("model.safetensors.index.json")).unwrap())
            .unwrap();
    let map = index["weight_map"].as_object().unwrap();
    for stem in ["seed4", "seed4p4"] {
        let shards: std::collections::BTreeSet<&str> = map
            .iter()
            .filter(|(name, _)| name.starts_with(&format!("{stem}.")))
            .map(|(_, s)| s.as_str().unwrap())
            .collect();
        assert_eq!(shards.len(), 1, "{stem} is split: {shards:?}");
    }
    let written = Archive::open(dir.path()).unwrap();
    for name in written.names() {
        let info = written.info(name).unwrap();
        let location = info.location.unwrap();
        assert_eq!(written.metadata().get("format").map(String::as_str), Some("mlx"));
        if info.bytes.is_multiple_of(16384) {
            assert_eq!(location.file_offset % 16384, 0, "{name} is not on a page");
        }
    }

    let mut overlay = Archive::new();
    overlay.insert("layers.0.self_attn.mla.kv_a", Tensor::zeros(DType::BF16, &[4, 8]));
    overlay.save(dir.path().join(OVERLAY_FILE)).unwrap();
    let folder = QuantizedFolder::open(dir.path()).unwrap();
    assert!(folder.archive().contains("layers.0.self_attn.mla.kv_a"));
    assert_eq!(folder.encoding("embed").unwrap(), WeightEncoding::Float(DType::BF16));
    let decoded = folder.weight("seed4").unwrap().to_float(DType::BF16).unwrap().reshape(&[2, 32, 1024]).unwrap();
    assert!(bits(&decoded) == bits(&shard.archive().try_get("seed4.decoded").unwrap()));

    let mut clash = Archive::new();
    clash.insert("seed4.exp_bias", Tensor::zeros(DType::I32, &[2]));
    clash.save(dir.path().join(OVERLAY_FILE)).unwrap();
    assert!(matches!(QuantizedFolder::open(dir.path()), Err(nnx::Error::Duplicate { .. })));
}
