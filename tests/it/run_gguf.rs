//! Llama, Mistral, Qwen2, Qwen3 and Gemma 3 loaded by `nnx::models::load` from the GGUF files
//! llama.cpp's own converter and quantizer made of small random models
//! (`tests/fixtures/models/`, made by `scripts/models/make_goldens.sh`): F32 files against the
//! transformers logits of the same weights, quantized files against llama.cpp's logits and
//! greedy tokens on the same file.

use std::path::PathBuf;

use nnx::models::CausalLm;
use serde_json::Value;

use crate::util::{fixtures, max_abs_diff};

const CASES: [&str; 5] = ["llama3", "mistral", "qwen2", "qwen3", "gemma3"];

fn case(name: &str) -> PathBuf {
    fixtures().join("models").join(name)
}

fn json(path: PathBuf) -> Value {
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

fn floats(value: &Value) -> Vec<f32> {
    value
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|row| row.as_array().unwrap())
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

fn ids(value: &Value) -> Vec<u32> {
    value.as_array().unwrap().iter().map(|id| id.as_u64().unwrap() as u32).collect()
}

/// All-position logits of `file` in `case` for the reference ids.
fn logits(case_name: &str, file: &str) -> (Vec<f32>, nnx::models::LoadedModel) {
    let reference = json(case(case_name).join("reference.json"));
    let loaded = nnx::models::load(case(case_name).join(file).to_str().unwrap()).unwrap();
    let logits = loaded.model.logits(&ids(&reference["ids"])).unwrap().to_vec::<f32>().unwrap();
    (logits, loaded)
}

#[test]
fn f32_gguf_files_give_the_transformers_logits_of_their_weights() {
    for name in CASES {
        let reference = json(case(name).join("reference.json"));
        let (ours, loaded) = logits(name, "model-f32.gguf");
        let architecture = if name.starts_with("llama") || name == "mistral" { "llama" } else { name };
        assert_eq!(loaded.architecture, architecture);
        let diff = max_abs_diff(&ours, &floats(&reference["logits"]), name);
        println!("{name} model-f32.gguf vs transformers: max abs difference {diff:e}");
        assert!(diff <= 1e-4, "{name}: the F32 GGUF logits differ from transformers' by {diff}");
    }
}

#[test]
fn f32_gguf_files_give_llama_cpps_logits() {
    // llama.cpp's own logits with an F32 key/value cache: the same arithmetic up to rounding
    // (Gemma's GELU reads an F16 table in ggml, hence its wider bound).
    for name in CASES {
        let expected = json(case(name).join("llamacpp.json"));
        let (ours, _) = logits(name, "model-f32.gguf");
        let diff = max_abs_diff(&ours, &floats(&expected["model-f32.gguf"]["logits_kv_f32"]), name);
        println!("{name} model-f32.gguf vs llama.cpp: max abs difference {diff:e}");
        let bound = if name == "gemma3" { 1e-2 } else { 1e-4 };
        assert!(diff <= bound, "{name}: logits differ from llama.cpp's by {diff}");
    }
}

#[test]
fn quantized_gguf_files_decode_as_llama_cpp_does() {
    let mut files = Vec::new();
    for name in CASES.iter().chain(&["llama3-wide"]) {
        for file in ["model-q8_0.gguf", "model-q4_k_m.gguf"] {
            if case(name).join(file).exists() {
                files.push((*name, file));
            }
        }
    }
    assert!(files.len() >= 7, "the quantized fixtures are present");
    for (name, file) in files {
        let expected = &json(case(name).join("llamacpp.json"))[file];
        let (ours, loaded) = logits(name, file);
        let theirs = floats(&expected["logits"]);
        let diff = max_abs_diff(&ours, &theirs, name);
        let scale = theirs.iter().fold(0f32, |m, x| m.max(x.abs()));
        println!(
            "{name} {file} ({}) vs llama.cpp: max abs difference {diff:e} of logits up to {scale}",
            loaded.weights
        );
        // llama.cpp rounds activations to 8-bit blocks (and keys and values to F16) inside its
        // products; nnx multiplies f32 activations by the same weight blocks.
        assert!(diff <= 0.05 * scale, "{name} {file}: logits differ from llama.cpp's by {diff}");
    }
}
