//! MLX affine quantization against MLX's own output: every `qBgG.*` entry of the fixtures for
//! f32, bf16 and f16 sources, bit for bit; and `QuantizedLinear` built from them.

use nnx::nn::Linear;
use nnx::quant::{AFFINE_BITS, AFFINE_GROUP_SIZES, AffineSpec, AffineWeight, QuantizedLinear};
use nnx::{Archive, DType, Tensor};

use crate::util::{self, fixtures, text};

fn fixture(dtype: &str) -> Archive {
    Archive::open(fixtures().join("mlx").join(format!("affine_{dtype}.safetensors"))).unwrap()
}

/// The raw bytes of a tensor, for bit-for-bit comparison (NaN-safe, sign of zero included).
fn bytes(tensor: &Tensor) -> Vec<u8> {
    tensor.to_bytes().unwrap().into_owned()
}

fn cases() -> impl Iterator<Item = (u32, usize)> {
    AFFINE_BITS.into_iter().flat_map(|bits| AFFINE_GROUP_SIZES.into_iter().map(move |group| (bits, group)))
}

#[test]
fn quantize_reproduces_mlx_bit_for_bit() {
    for dtype in ["f32", "bf16", "f16"] {
        let archive = fixture(dtype);
        let source = archive.try_get("source").unwrap();
        let mut checked = 0;
        for (bits, group) in cases() {
            let name = format!("q{bits}g{group}");
            let quantized = AffineWeight::quantize(&source, AffineSpec::new(bits, group).unwrap()).unwrap();
            for (stream, ours) in
                [("weight", &quantized.weight), ("scales", &quantized.scales), ("biases", &quantized.biases)]
            {
                let theirs = archive.try_get(&format!("{name}.{stream}")).unwrap();
                assert_eq!(ours.dtype(), theirs.dtype(), "{dtype} {name}.{stream}");
                assert_eq!(ours.shape(), theirs.shape(), "{dtype} {name}.{stream}");
                assert!(bytes(ours) == bytes(&theirs), "{dtype} {name}.{stream} differs from MLX");
            }
            checked += 1;
        }
        assert_eq!(checked, 18);
    }
}

#[test]
fn dequantize_reproduces_mlx_bit_for_bit() {
    for dtype in ["f32", "bf16", "f16"] {
        let archive = fixture(dtype);
        for (bits, group) in cases() {
            let name = format!("q{bits}g{group}");
            let get = |stream: &str| archive.try_get(&format!("{name}.{stream}")).unwrap();
            let weight =
                AffineWeight::new(get("weight"), get("scales"), get("biases"), AffineSpec::new(bits, group).unwrap())
                    .unwrap();
            let ours = weight.dequantize().unwrap();
            let theirs = get("dequantized");
            assert_eq!(ours.dtype(), theirs.dtype(), "{dtype} {name}");
            assert_eq!(ours.shape(), theirs.shape(), "{dtype} {name}");
            assert!(bytes(&ours) == bytes(&theirs), "{dtype} {name}: dequantized values differ from MLX");
        }
    }
}

#[test]
fn quantized_linear_from_fixture_matches_its_dequantized_weight() {
    let archive = fixture("bf16");
    let source = archive.try_get("source").unwrap();
    let linear = Linear { weight: source.clone(), bias: None };
    let layer = QuantizedLinear::from_linear(&linear, 4, 64).unwrap();
    assert!(bytes(&layer.weight) == bytes(&archive.try_get("q4g64.weight").unwrap()));
    let dense = layer.to_linear(DType::BF16).unwrap();
    assert!(bytes(&dense.weight) == bytes(&archive.try_get("q4g64.dequantized").unwrap()));

    let rows = source.shape()[1];
    let x = Tensor::from_vec((0..2 * rows).map(|i| ((i % 23) as f32 - 11.0) / 16.0).collect(), &[2, rows]).unwrap();
    let y = layer.forward(&x).unwrap().to_vec::<f32>().unwrap();
    let w = dense.weight.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap();
    let xs = x.to_vec::<f32>().unwrap();
    let out = source.shape()[0];
    for (at, value) in y.iter().enumerate() {
        let (row, col) = (at / out, at % out);
        let expected: f64 = (0..rows).map(|i| f64::from(xs[row * rows + i]) * f64::from(w[col * rows + i])).sum();
        assert!((f64::from(*value) - expected).abs() < 1e-4, "{value} vs {expected}");
    }
}

#[test]
fn quantized_linear_round_trips_through_an_archive() {
    let linear = Linear::builder(128, 16).dtype(DType::BF16).init(nnx::nn::Init::Seeded(5)).build();
    let layer = QuantizedLinear::from_linear(&linear, 3, 32).unwrap();
    let dir = crate::util::scratch();
    let path = dir.path().join("layer.safetensors");
    Archive::from_module(&layer, "proj").save(&path).unwrap();
    let mut loaded = QuantizedLinear::meta(128, 16, true, layer.spec, DType::BF16).unwrap();
    Archive::open(&path).unwrap().load_into(&mut loaded, "proj").unwrap();
    let x = Tensor::from_vec((0..128).map(|i| i as f32 / 128.0).collect(), &[1, 128]).unwrap();
    assert_eq!(
        loaded.forward(&x).unwrap().to_vec::<f32>().unwrap(),
        layer.forward(&x).unwrap().to_vec::<f32>().unwrap()
    );
}

/// Writes an mlx-lm style folder: `model.safetensors` with two quantized layers of different
/// specs and one float layer, and `config.json` under `key` with a per-module override.
fn mlx_lm_folder(dir: &std::path::Path, key: &str) -> (Linear, Linear) {
    use nnx::nn::Init;
    let q = Linear::builder(128, 64).init(Init::Seeded(1)).build();
    let k = Linear::builder(128, 64).bias(false).init(Init::Seeded(2)).build();
    let v = Linear::builder(128, 64).bias(false).init(Init::Seeded(3)).build();
    let mut archive = Archive::new();
    let mut put = |name: &str, layer: &QuantizedLinear| {
        for (stream, tensor) in [("weight", &layer.weight), ("scales", &layer.scales), ("biases", &layer.biases)] {
            archive.insert(format!("{name}.{stream}"), tensor.clone());
        }
        if let Some(bias) = &layer.bias {
            archive.insert(format!("{name}.bias"), bias.clone());
        }
    };
    put("layers.0.q", &QuantizedLinear::from_linear(&q, 4, 64).unwrap());
    put("layers.0.k", &QuantizedLinear::from_linear(&k, 8, 32).unwrap());
    archive.insert("layers.0.v.weight", v.weight.clone());
    archive.save(dir.join("model.safetensors")).unwrap();
    let config = serde_json::json!({
        "model_type": "test",
        key: { "group_size": 64, "bits": 4, "layers.0.k": { "group_size": 32, "bits": 8 }, "layers.0.v": false }
    });
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    (q, k)
}

#[test]
fn mlx_lm_folders_follow_per_module_overrides() {
    use nnx::quantized::{QuantizedFolder, WeightEncoding};
    for key in ["quantization", "quantization_config"] {
        let dir = crate::util::scratch();
        let (q, k) = mlx_lm_folder(dir.path(), key);
        let folder = QuantizedFolder::open(dir.path()).unwrap();
        assert_eq!(folder.encoding("layers.0.q").unwrap(), WeightEncoding::Affine(AffineSpec::new(4, 64).unwrap()));
        assert_eq!(folder.encoding("layers.0.k").unwrap(), WeightEncoding::Affine(AffineSpec::new(8, 32).unwrap()));
        assert_eq!(folder.encoding("layers.0.v").unwrap(), WeightEncoding::Float(DType::F32));
        // The fused kernel of the loaded layer equals the float layer on its dequantized weight.
        let x = Tensor::from_vec((0..2 * 128).map(|i| (i % 17) as f32 * 0.1 - 0.8).collect(), &[2, 128]).unwrap();
        for (name, original) in [("layers.0.q", &q), ("layers.0.k", &k)] {
            let layer = folder.quantized_linear(name).unwrap();
            assert_eq!(layer.bias.is_some(), original.bias.is_some(), "{name}");
            let fused = layer.forward(&x).unwrap().to_vec::<f32>().unwrap();
            let dense = layer.to_linear(DType::F32).unwrap().forward(&x).unwrap().to_vec::<f32>().unwrap();
            let reference = original.forward(&x).unwrap().to_vec::<f32>().unwrap();
            assert_eq!(fused.len(), 2 * 64, "{name}: outputs");
            assert!(util::max_abs_diff(&fused, &dense, name) < 1e-4, "{name}: fused vs dequantized");
            // Each tolerance is the encoding's own: rounding to the nearest level moves a weight
            // by at most half its group's scale, so output (i, j) moves by at most
            // sum_k |x[i, k]| * scale[j, k / group] / 2, a bound 16 times tighter for Q8 than Q4.
            let group = layer.spec.group_size;
            let scales = layer.scales.to_vec::<f32>().unwrap();
            let inputs = x.to_vec::<f32>().unwrap();
            let groups = 128 / group;
            assert_eq!(reference.len(), fused.len(), "{name}: outputs");
            for (at, (a, c)) in fused.iter().zip(&reference).enumerate() {
                let (row, column) = (at / 64, at % 64);
                let bound: f32 = (0..128)
                    .map(|k| inputs[row * 128 + k].abs() * scales[column * groups + k / group].abs() / 2.0)
                    .sum();
                assert!(
                    (a - c).abs() <= bound * 1.001 + 1e-5,
                    "{name}[{at}]: quantized {a} vs float {c}, bound {bound}"
                );
            }
        }
    }
}

#[test]
fn a_config_that_contradicts_the_streams_is_refused() {
    let dir = crate::util::scratch();
    mlx_lm_folder(dir.path(), "quantization");
    // `layers.0.q` holds 4-bit words; a configuration saying 8 bits expects twice as many.
    let config = serde_json::json!({ "quantization": { "group_size": 64, "bits": 4, "layers.0.q": { "group_size": 64, "bits": 8 } } });
    std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
    let folder = nnx::quantized::QuantizedFolder::open(dir.path()).unwrap();
    let message = folder.encoding("layers.0.q").unwrap_err().to_string();
    assert!(message.contains("weight") && message.contains("[64, 32]") && message.contains("[64, 16]"), "{message}");
    assert!(folder.encoding("layers.0.k").is_ok(), "the other layers are unaffected");
}

/// Logits of a folder as `nnx::models::load` runs it.
fn folder_logits(dir: &std::path::Path, ids: &[u32]) -> Vec<f32> {
    let loaded = nnx::models::load(dir.to_str().unwrap()).unwrap();
    loaded.model.logits(ids).unwrap().to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap()
}

#[test]
fn mixed_precision_folders_load_each_module_with_its_own_bits() {
    // Attention in 8 bits, then everything else in 4 over it: the second pass writes per-module
    // overrides for the first's modules, and the loader gives each layer its own spec.
    let dir = util::scratch();
    let (eight, mixed, floats) = (dir.path().join("eight"), dir.path().join("mixed"), dir.path().join("floats"));
    let base = fixtures().join("models/llama3");
    util::nnx_ok(&["quantize", text(&base), text(&eight), "--encoding", "q8", "--pattern", "*self_attn*"]);
    util::nnx_ok(&["quantize", text(&eight), text(&mixed), "--encoding", "q4"]);
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(mixed.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["quantization"]["bits"], 8);
    assert_eq!(config["quantization"]["model.layers.0.mlp.up_proj"]["bits"], 4, "{}", config["quantization"]);
    // The same values as floats: `nnx dequantize` decodes each weight with its own spec.
    util::nnx_ok(&["dequantize", text(&mixed), text(&floats), "--dtype", "f32"]);
    for file in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(base.join(file), mixed.join(file)).unwrap();
        std::fs::copy(base.join(file), floats.join(file)).unwrap();
    }
    let ids = [1, 15, 27, 99, 3, 250];
    let (ours, expected) = (folder_logits(&mixed, &ids), folder_logits(&floats, &ids));
    let scale = expected.iter().fold(0f32, |top, value| top.max(value.abs()));
    let diff = util::max_abs_diff(&ours, &expected, "mixed-precision logits");
    assert!(diff <= 1e-3 * scale.max(1.0), "{diff} (logits reach {scale})");
}
