//! `nnx quantize` and `nnx dequantize` run as a program on generated files: round trips, equality
//! with the library functions, and one-line errors.

use std::path::Path;

use nnx::quant::{AffineSpec, AffineWeight, SeedEncoding, SeedWeight};
use nnx::{Archive, DType, Tensor};

use crate::util::{run_nnx as run, scratch};

fn values(count: usize, seed: u32) -> Vec<f32> {
    let mut state = seed.wrapping_mul(2_654_435_761).max(1);
    (0..count)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            (state as f32 / u32::MAX as f32 - 0.5) * 0.1
        })
        .collect()
}

/// A small model file: a 2-D weight with a bias, a norm weight (rank 1) and a 2-D weight whose
/// last axis fits no group.
fn model(path: &Path) -> Tensor {
    let weight = Tensor::from_vec(values(16 * 128, 1), &[16, 128]).unwrap();
    let mut archive = Archive::new();
    archive.insert("proj.weight", weight.clone());
    archive.insert("proj.bias", Tensor::from_vec(values(16, 2), &[16]).unwrap());
    archive.insert("norm.weight", Tensor::from_vec(vec![1.0f32; 128], &[128]).unwrap());
    archive.insert("odd.weight", Tensor::from_vec(values(4 * 20, 3), &[4, 20]).unwrap());
    archive.save(path).unwrap();
    weight
}

fn bytes(tensor: &Tensor) -> Vec<u8> {
    tensor.to_bytes().unwrap().into_owned()
}

#[test]
fn q4_round_trip_equals_the_library() {
    let dir = scratch();
    let (input, quantized, restored) =
        (dir.path().join("in.safetensors"), dir.path().join("q4.safetensors"), dir.path().join("out.safetensors"));
    let weight = model(&input);
    let (code, _, stderr) =
        run(&["quantize", input.to_str().unwrap(), quantized.to_str().unwrap(), "--encoding", "q4"]);
    assert_eq!(code, 0, "{stderr}");

    let archive = Archive::open(&quantized).unwrap();
    let expected = AffineWeight::quantize(&weight, AffineSpec::new(4, 64).unwrap()).unwrap();
    assert!(bytes(&archive.try_get("proj.weight").unwrap()) == bytes(&expected.weight));
    assert!(bytes(&archive.try_get("proj.scales").unwrap()) == bytes(&expected.scales));
    assert!(bytes(&archive.try_get("proj.biases").unwrap()) == bytes(&expected.biases));
    assert_eq!(archive.try_get("norm.weight").unwrap().dtype(), DType::F32);
    assert_eq!(archive.try_get("odd.weight").unwrap().shape(), &[4, 20]);
    let config: serde_json::Value = serde_json::from_str(&archive.metadata()["quantization"]).unwrap();
    assert_eq!(config["bits"], 4);
    assert_eq!(config["group_size"], 64);

    let (code, _, stderr) = run(&["dequantize", quantized.to_str().unwrap(), restored.to_str().unwrap()]);
    assert_eq!(code, 0, "{stderr}");
    let restored = Archive::open(&restored).unwrap();
    let names: Vec<&str> = restored.names().collect();
    assert_eq!(names, ["proj.weight", "proj.bias", "norm.weight", "odd.weight"]);
    let decoded = restored.try_get("proj.weight").unwrap();
    assert!(bytes(&decoded) == bytes(&expected.dequantize().unwrap()));
    let original = weight.to_vec::<f32>().unwrap();
    let scales = expected.scales.to_vec::<f32>().unwrap();
    let decoded = decoded.to_vec::<f32>().unwrap();
    assert_eq!(decoded.len(), original.len(), "restored values");
    for (at, (a, b)) in decoded.iter().zip(&original).enumerate() {
        assert!((a - b).abs() <= scales[at / 64].abs() + 1e-6, "{a} vs {b}");
    }
}

#[test]
fn seed4_folder_round_trip_equals_the_library() {
    let dir = scratch();
    let input = dir.path().join("in.safetensors");
    let (folder, restored) = (dir.path().join("seed"), dir.path().join("restored"));
    model(&input);
    let mut small = Archive::new();
    let weight = Tensor::from_vec(values(2 * 64, 9), &[2, 64]).unwrap();
    small.insert("mlp.weight", weight.clone());
    small.save(&input).unwrap();
    let (code, _, stderr) =
        run(&["quantize", input.to_str().unwrap(), &format!("{}/", folder.display()), "--encoding", "seed4p4"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(folder.join("model.safetensors.index.json").is_file());
    let archive = Archive::open(&folder).unwrap();
    assert_eq!(archive.try_get("mlp.seeds").unwrap().shape(), &[1, 2, 8]);
    let library = SeedWeight::encode(&weight, SeedEncoding::Seed4P4, &Default::default()).unwrap();
    assert!(bytes(&archive.try_get("mlp.seeds").unwrap()) == bytes(&library.seeds));

    let (code, _, stderr) =
        run(&["dequantize", folder.to_str().unwrap(), restored.to_str().unwrap(), "--dtype", "f32"]);
    assert_eq!(code, 0, "{stderr}");
    let decoded = Archive::open(&restored).unwrap().try_get("mlp.weight").unwrap();
    assert_eq!(decoded.shape(), &[2, 64]);
    let expected = library.decode().unwrap().to_dtype(DType::F32).unwrap().reshape(&[2, 64]).unwrap();
    assert!(bytes(&decoded) == bytes(&expected));
}

#[test]
fn bad_input_is_one_line_and_exit_one() {
    let dir = scratch();
    let input = dir.path().join("in.safetensors");
    model(&input);
    let out = dir.path().join("out.safetensors");
    let missing = dir.path().join("missing.safetensors");
    let (input, out, missing) = (input.to_str().unwrap(), out.to_str().unwrap(), missing.to_str().unwrap());
    let cases: [&[&str]; 4] = [
        &["quantize", missing, out, "--encoding", "q4"],
        &["quantize", input, out, "--encoding", "q4", "--group-size", "48"],
        &["quantize", input, out, "--encoding", "q8", "--pattern", "odd.*"],
        &["dequantize", missing, out],
    ];
    for args in cases {
        let (code, _, stderr) = run(args);
        assert_eq!(code, 1, "{args:?}: {stderr}");
        assert!(stderr.starts_with("error: ") && stderr.trim_end().lines().count() == 1, "{args:?}: {stderr}");
    }
    let (code, _, _) = run(&["quantize", input, out, "--encoding", "q3"]);
    assert_eq!(code, 1);
}
