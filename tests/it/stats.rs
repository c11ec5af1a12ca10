//! `nnx stats` against numpy on the same data: a SafeTensors file read by the `safetensors`
//! package and a Q8_0/Q4_K_M GGUF file decoded by the `gguf` package, every statistic computed
//! in float64 by numpy (`min`, `max`, `mean`, `std`, `histogram(bins=16)`), and `--check` on
//! files with NaN, infinities and all-zero tensors.

use std::path::Path;
use std::process::Command;

use nnx::{Archive, Tensor};
use serde_json::Value;

use crate::util::{fixtures, nnx_binary, scratch};

/// Prints numpy's statistics of every float tensor of a SafeTensors or GGUF file as JSON.
const SCRIPT: &str = r#"
import json, sys
import numpy as np

path = sys.argv[1]
if path.endswith(".gguf"):
    from gguf import GGUFReader
    from gguf.quants import dequantize
    reader = GGUFReader(path)
    tensors = {t.name: dequantize(t.data, t.tensor_type).astype(np.float64) for t in reader.tensors}
else:
    import ml_dtypes
    from safetensors.numpy import load_file
    tensors = {name: a.astype(np.float64) for name, a in load_file(path).items()}

out = {}
for name, a in tensors.items():
    x = a.reshape(-1)
    f = x[np.isfinite(x)]
    hist = np.histogram(f, bins=16, range=(f.min(), f.max()))[0] if f.size else np.zeros(16, int)
    out[name] = {"count": int(x.size), "min": float(f.min()), "max": float(f.max()), "mean": float(f.mean()),
                 "std": float(f.std()), "absmax": float(np.abs(f).max()), "zero_fraction": float((x == 0).mean()),
                 "nans": int(np.isnan(x).sum()), "infs": int(np.isinf(x).sum()), "histogram": [int(v) for v in hist]}
print(json.dumps(out))
"#;

fn numpy_stats(path: &Path) -> Value {
    let output = Command::new(crate::python::interpreter()).arg("-c").arg(SCRIPT).arg(path).output().unwrap();
    assert!(
        output.status.success(),
        "numpy's statistics of {} failed (run scripts/setup.sh for the Python packages): {}",
        path.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

fn nnx_stats(path: &Path, check: bool) -> (Option<i32>, Value, String) {
    let mut command = Command::new(nnx_binary());
    command.arg("stats").arg(path).arg("--json");
    if check {
        command.arg("--check");
    }
    let output = command.output().unwrap();
    let value = serde_json::from_slice(&output.stdout).unwrap_or(Value::Null);
    (output.status.code(), value, String::from_utf8_lossy(&output.stderr).into_owned())
}

/// Every tensor of `path` as numpy computes it: counts and histogram equal, min/max/absmax
/// equal, mean and std within f64 summation-order rounding.
fn assert_matches_numpy(path: &Path) -> usize {
    let reference = numpy_stats(path);
    let (code, ours, stderr) = nnx_stats(path, false);
    assert_eq!(code, Some(0), "{stderr}");
    let tensors = ours["tensors"].as_array().unwrap();
    assert_eq!(tensors.len(), reference.as_object().unwrap().len(), "{}", path.display());
    for tensor in tensors {
        let name = tensor["name"].as_str().unwrap();
        let expected = &reference[name];
        for key in ["count", "nans", "infs", "histogram", "min", "max", "absmax", "zero_fraction"] {
            assert_eq!(tensor[key], expected[key], "{}: `{name}` {key}", path.display());
        }
        for key in ["mean", "std"] {
            let (a, b) = (tensor[key].as_f64().unwrap(), expected[key].as_f64().unwrap());
            assert!(
                (a - b).abs() <= 1e-12 * b.abs().max(1e-3),
                "{}: `{name}` {key} {a} vs numpy's {b}",
                path.display()
            );
        }
    }
    tensors.len()
}

#[test]
fn statistics_equal_numpys_for_safetensors_and_gguf_blocks() {
    assert_eq!(assert_matches_numpy(&fixtures().join("gpt2-tiny").join("model.safetensors")), 28);
    let models = fixtures().join("models");
    // Q8_0 and the K-quant mixture, decoded block by block, against gguf-py's decoders.
    assert!(assert_matches_numpy(&models.join("llama3").join("model-q8_0.gguf")) > 20);
    assert!(assert_matches_numpy(&models.join("llama3-wide").join("model-q4_k_m.gguf")) > 20);
}

#[test]
fn check_flags_nan_infinite_and_all_zero_tensors() {
    let dir = scratch();
    let mut archive = Archive::new();
    archive.insert("fine", Tensor::from_vec(vec![1.0f32, -2.0, 0.5, 0.0], &[2, 2]).unwrap());
    // A weight matrix of zeros is flagged (a bias or norm vector of zeros is not).
    archive.insert("zeros", Tensor::from_vec(vec![0.0f32; 6], &[2, 3]).unwrap());
    archive.insert("broken", Tensor::from_vec(vec![1.0f32, f32::NAN, f32::INFINITY, -3.0], &[4]).unwrap());
    let path = dir.path().join("broken.safetensors");
    archive.save(&path).unwrap();
    let (code, value, _) = nnx_stats(&path, true);
    assert_eq!(code, Some(1), "--check fails");
    let by_name = |name: &str| value["tensors"].as_array().unwrap().iter().find(|t| t["name"] == name).unwrap().clone();
    let broken = by_name("broken");
    assert_eq!(
        (broken["nans"].as_u64(), broken["infs"].as_u64(), broken["count"].as_u64()),
        (Some(1), Some(1), Some(4))
    );
    assert_eq!(
        (broken["min"].as_f64(), broken["max"].as_f64(), broken["mean"].as_f64()),
        (Some(-3.0), Some(1.0), Some(-1.0))
    );
    assert_eq!(by_name("zeros")["zero_fraction"].as_f64(), Some(1.0));
    // The table names what the check found; without `--check` the status is 0.
    let output = Command::new(nnx_binary()).arg("stats").arg(&path).output().unwrap();
    let text = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(0));
    assert!(
        text.contains("check: `broken`: 1 NaN, 1 infinite") && text.contains("check: `zeros`: all zeros"),
        "{text}"
    );

    let mut clean = Archive::new();
    clean.insert("fine", Tensor::from_vec(vec![1.0f32, 2.0], &[2]).unwrap());
    let path = dir.path().join("clean.safetensors");
    clean.save(&path).unwrap();
    assert_eq!(nnx_stats(&path, true).0, Some(0));
}

#[test]
fn quantized_folders_are_decoded_whole_weights() {
    // mlx-lm's 4-bit folder: each weight once (its streams are not tensors of their own).
    let (code, value, stderr) = nnx_stats(&fixtures().join("lora").join("mlx-affine").join("base"), false);
    assert_eq!(code, Some(0), "{stderr}");
    let tensors = value["tensors"].as_array().unwrap();
    let q = tensors.iter().find(|t| t["name"] == "model.layers.0.self_attn.q_proj").unwrap();
    assert_eq!(q["encoding"], "MLX affine 4-bit/32");
    assert_eq!(q["shape"], serde_json::json!([64, 64]));
    assert!(!tensors.iter().any(|t| t["name"].as_str().unwrap().ends_with(".scales")));
    assert_eq!(tensors.len(), 7 * 2 + 2 + 5, "projections, embedding, head and norms");
}
