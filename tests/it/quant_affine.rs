//! MLX affine quantization against MLX's own output: every `qBgG.*` entry of the fixtures for
//! f32, bf16 and f16 sources, bit for bit; and `QuantizedLinear` built from them.

use nnx::nn::Linear;
use nnx::quant::{AFFINE_BITS, AFFINE_GROUP_SIZES, AffineSpec, AffineWeight, QuantizedLinear};
use nnx::{Archive, DType, Tensor};

use crate::util::fixtures;

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
    let linear = Linear::new(128, 16, true, DType::BF16, nnx::nn::Init::Seeded(5));
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
