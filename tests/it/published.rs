//! Checkpoints published already quantized (`tests/fixtures/published`, made by the publishers'
//! own code: compressed-tensors, transformers, GPTQ and AWQ packers): every weight decoded as the
//! publisher's code decodes it, the model run as its dequantized twin runs in transformers,
//! converted to GGUF and SafeTensors, and listed by `nnx inspect` with its scheme; damaged streams
//! named.

use std::path::{Path, PathBuf};

use nnx::models::CausalLm;
use nnx::nn::Init;
use nnx::{Archive, DType};

use crate::util::{fixtures, json_field, max_abs_diff};

/// The scheme folders, each with `dequantized.safetensors` and `reference.json`.
fn schemes() -> Vec<PathBuf> {
    let mut all: Vec<PathBuf> = std::fs::read_dir(fixtures().join("published"))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|dir| dir.join("dequantized.safetensors").is_file())
        .collect();
    all.sort();
    assert!(all.len() >= 9, "the fixture folders: {all:?}");
    all
}

fn name(dir: &Path) -> String {
    dir.file_name().unwrap().to_string_lossy().into_owned()
}

/// The distance between two values in units in the last place of `dtype` (both values are of
/// it): 0 for equal bits.
fn ulps(a: f32, b: f32, dtype: DType) -> u32 {
    let bits = |value: f32| -> i32 {
        match dtype {
            DType::BF16 => i32::from(half::bf16::from_f32(value).to_bits() as i16),
            DType::F16 => i32::from(half::f16::from_f32(value).to_bits() as i16),
            _ => value.to_bits() as i32,
        }
    };
    // Sign-magnitude to a line of integers.
    let line = |bits: i64, width: u32| if bits < 0 { -(bits & ((1 << (width - 1)) - 1)) } else { bits };
    let width = if dtype == DType::F32 { 32 } else { 16 };
    let (a, b) = (line(bits(a) as i64, width), line(bits(b) as i64, width));
    (a - b).unsigned_abs() as u32
}

#[test]
fn every_weight_decodes_as_its_publishers_code_decodes_it() {
    for dir in schemes() {
        let scheme = name(&dir);
        let decoded = nnx::published::open(&dir).unwrap();
        let reference = Archive::open(dir.join("dequantized.safetensors")).unwrap();
        let (mut values, mut exact, mut worst) = (0usize, 0usize, 0u32);
        for weight in reference.names() {
            let expected = reference.try_get(weight).unwrap().to_vec::<f32>().unwrap();
            let info = decoded.info(weight).unwrap_or_else(|error| panic!("{scheme}: {error}"));
            assert!(decoded.encoding(weight).is_some(), "{scheme}: `{weight}` is decoded");
            let ours = decoded.float(weight, DType::F32, &info.shape).unwrap().to_vec::<f32>().unwrap();
            assert_eq!(ours.len(), expected.len(), "{scheme}: `{weight}`");
            for (a, b) in ours.iter().zip(&expected) {
                let distance = ulps(*a, *b, info.dtype);
                values += 1;
                exact += usize::from(distance == 0);
                worst = worst.max(distance);
            }
        }
        println!("{scheme}: {exact} of {values} values bit for bit, the others within {worst} ulp");
        if scheme.contains("nvfp4") {
            // compressed-tensors divides the E4M3 scale by the global scale first, then
            // multiplies by the E2M1 value, rounding twice; nnx rounds the exact product once.
            assert!(worst <= 1 && exact < values, "{scheme}: {worst} ulp");
        } else {
            assert_eq!(exact, values, "{scheme}: {worst} ulp at most");
        }
        // The streams are not listed beside the weights they make.
        for entry in decoded.names() {
            for stream in ["_scale", "_scale_inv", "qweight", "qzeros", "g_idx", "_packed", "weight_shape", "_blocks"] {
                assert!(!entry.ends_with(stream), "{scheme}: `{entry}` is listed");
            }
        }
    }
}

/// The folder's model in F32, its weights imported from the decoded archive.
fn twin(dir: &Path) -> Box<dyn CausalLm<Device = nnx::Host>> {
    use nnx::models::llama::{Llama, LlamaConfig};
    use nnx::models::qwen::{Qwen, QwenConfig};
    let archive = nnx::published::open(dir).unwrap();
    let config = dir.join("config.json");
    let text = std::fs::read_to_string(&config).unwrap();
    if text.contains("\"qwen3\"") {
        let mut model = Qwen::new(&QwenConfig::from_file(&config).unwrap(), DType::F32, Init::Meta);
        archive.import_into(&mut model, "").unwrap();
        Box::new(model)
    } else {
        let mut model = Llama::new(&LlamaConfig::from_file(&config).unwrap(), DType::F32, Init::Meta);
        archive.import_into(&mut model, "").unwrap();
        Box::new(model)
    }
}

/// The argmax loop transformers' reference runs: the whole sequence each step.
fn greedy(model: &dyn CausalLm<Device = nnx::Host>, ids: &[u32], steps: usize) -> Vec<u32> {
    let mut all = ids.to_vec();
    for _ in 0..steps {
        let logits = model.logits(&all).unwrap().to_dtype(DType::F32).unwrap();
        let vocab = logits.shape()[1];
        let values = logits.to_vec::<f32>().unwrap();
        let last = &values[values.len() - vocab..];
        let best = (0..vocab).fold(0, |best, at| if last[at] > last[best] { at } else { best });
        all.push(best as u32);
    }
    all.split_off(ids.len())
}

#[test]
fn each_scheme_runs_as_its_dequantized_twin() {
    for dir in schemes() {
        let scheme = name(&dir);
        let reference: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap()).unwrap();
        let ids: Vec<u32> = json_field(&reference, "ids");
        let expected: Vec<f32> = json_field::<Vec<Vec<f32>>>(&reference, "logits").concat();
        let model = twin(&dir);
        let logits = model.logits(&ids).unwrap().to_vec::<f32>().unwrap();
        let difference = max_abs_diff(&logits, &expected, &scheme);
        println!("{scheme}: logits within {difference:e} of the dequantized twin in transformers");
        assert!(difference <= 1e-4, "{scheme}: logits differ by {difference}");
        let steps: Vec<u32> = json_field(&reference, "greedy");
        assert_eq!(greedy(model.as_ref(), &ids, steps.len()), steps, "{scheme}: greedy decoding");
        // What `nnx run` loads: the folder in the dtype of its weights (BF16 beside BF16
        // decoded weights, F32 beside GPTQ's F16), the same model within BF16's rounding.
        let loaded = nnx::models::load(dir.to_str().unwrap()).unwrap_or_else(|error| panic!("{scheme}: {error}"));
        let run = loaded.model.logits(&ids).unwrap().to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap();
        let difference = max_abs_diff(&run, &expected, &scheme);
        println!("{scheme}: `nnx run`'s model ({}) within {difference:e}", loaded.weights);
        assert!(difference <= 0.1, "{scheme}: the loaded model's logits differ by {difference}");
    }
}

#[test]
fn published_checkpoints_convert_to_safetensors_and_gguf() {
    let scratch = tempfile::tempdir().unwrap();
    for dir in schemes() {
        let scheme = name(&dir);
        let reference = Archive::open(dir.join("dequantized.safetensors")).unwrap();
        // To SafeTensors: the decoded weights, nothing of the streams.
        let out = scratch.path().join(format!("{scheme}.safetensors"));
        let (code, _, stderr) = crate::util::run_nnx(&["convert".as_ref(), dir.as_os_str(), out.as_os_str()]);
        assert_eq!(code, 0, "{scheme}: {stderr}");
        let written = Archive::open(&out).unwrap();
        for weight in reference.names() {
            let info = written.info(weight).unwrap();
            let ours = written.float(weight, DType::F32, &info.shape).unwrap().to_vec::<f32>().unwrap();
            let theirs = reference.try_get(weight).unwrap().to_vec::<f32>().unwrap();
            let worst = ours.iter().zip(&theirs).map(|(a, b)| ulps(*a, *b, info.dtype)).max().unwrap_or(0);
            assert!(worst <= 1, "{scheme}: `{weight}` written {worst} ulp away");
        }
        // To GGUF Q8_0, as llama.cpp's converter names a transformers folder's tensors.
        let gguf = scratch.path().join(format!("{scheme}.gguf"));
        let args = ["convert".as_ref(), dir.as_os_str(), gguf.as_os_str(), "--type".as_ref(), "q8_0".as_ref()];
        let (code, _, stderr) = crate::util::run_nnx(&args);
        assert_eq!(code, 0, "{scheme}: {stderr}");
        // Llama folders are written as llama.cpp's converter writes them; other families keep
        // transformers' names.
        let file = Archive::open(&gguf).unwrap();
        let down = ["blk.0.ffn_down.weight", "model.layers.0.mlp.down_proj.weight"]
            .into_iter()
            .find(|name| file.contains(name))
            .unwrap_or_else(|| panic!("{scheme}: no down projection in {:?}", file.names().collect::<Vec<_>>()));
        let packed = file.ggml(down).unwrap();
        assert_eq!(packed.ty.name(), "Q8_0", "{scheme}");
        let ours = packed.dequantize().unwrap().to_vec::<f32>().unwrap();
        let theirs = reference.try_get("model.layers.0.mlp.down_proj.weight").unwrap().to_vec::<f32>().unwrap();
        let scale = theirs.iter().fold(0f32, |max, value| max.max(value.abs()));
        let difference = max_abs_diff(&ours, &theirs, &scheme);
        assert!(difference <= scale / 100.0, "{scheme}: Q8_0 of the decoded weight is {difference} away");
    }
}

#[test]
fn inspect_names_each_scheme_and_its_bits_per_weight() {
    for dir in schemes() {
        let scheme = name(&dir);
        let (code, stdout, stderr) = crate::util::run_nnx(&["inspect".as_ref(), dir.as_os_str()]);
        assert_eq!(code, 0, "{scheme}: {stderr}");
        let expected = match scheme.as_str() {
            "fp8-block" => "FP8 E4M3 block 128x128",
            "ct-fp8-channel" => "FP8 E4M3 channel",
            "ct-fp8-tensor" => "FP8 E4M3 block",
            "ct-nvfp4" => "NVFP4",
            "ct-w4a16" => "INT4 group 32",
            "ct-w4a16-asym" => "INT4 group 32 asym",
            "gptq" => "GPTQ 4-bit",
            "gptq-8bit" => "GPTQ 8-bit",
            "awq" => "AWQ 4-bit group 32",
            other => panic!("a scheme without an expected name: {other}"),
        };
        assert!(stdout.contains(expected), "{scheme}: {stdout}");
        assert!(stdout.contains("q_proj.weight"), "{scheme}: {stdout}");
    }
}

/// Copies the folder `scheme` with `change` made to its `model.safetensors` entries.
fn damaged(scheme: &str, into: &Path, change: impl Fn(&str, nnx::Tensor) -> Option<nnx::Tensor>) -> PathBuf {
    let source = fixtures().join("published").join(scheme);
    let dir = into.join(scheme);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(source.join("config.json"), dir.join("config.json")).unwrap();
    let archive = Archive::open(source.join("model.safetensors")).unwrap();
    let mut out = Archive::new();
    for name in archive.names() {
        if let Some(tensor) = change(name, archive.try_get(name).unwrap()) {
            out.insert(name, tensor);
        }
    }
    out.save(dir.join("model.safetensors")).unwrap();
    dir
}

#[test]
fn a_missing_or_misshapen_scale_is_named() {
    let scratch = tempfile::tempdir().unwrap();
    let weight = "model.layers.0.self_attn.q_proj";
    // A missing scale.
    let dir = damaged("fp8-block", scratch.path(), |name, tensor| {
        (name != format!("{weight}.weight_scale_inv")).then_some(tensor)
    });
    let error = nnx::published::open(&dir).unwrap_err().to_string();
    assert!(error.contains(weight) && error.contains("weight_scale_inv"), "{error}");
    let (code, _, stderr) = crate::util::run_nnx(&["inspect".as_ref(), dir.as_os_str()]);
    assert_eq!(code, 1);
    assert!(stderr.contains(&format!("{weight}.weight_scale_inv")), "{stderr}");
    // A scale of the wrong shape.
    let dir = damaged("gptq", &scratch.path().join("b"), |name, tensor| {
        if name == format!("{weight}.scales") {
            Some(tensor.narrow(1, 0, 8).unwrap().contiguous())
        } else {
            Some(tensor)
        }
    });
    let error = nnx::published::open(&dir).unwrap_err().to_string();
    assert!(error.contains(weight) && error.contains("`scales`"), "{error}");
    let error = nnx::models::load(dir.to_str().unwrap()).unwrap_err().to_string();
    assert!(error.contains(weight), "{error}");
}
