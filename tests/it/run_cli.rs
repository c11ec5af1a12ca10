//! `nnx run` and `nnx perplexity` on the model fixtures (`tests/fixtures/models/`): prompt ids
//! and greedy ids against llama.cpp (GGUF files) and transformers (the folders), perplexity
//! against `llama-perplexity`, and the errors of a text too short and of `--chat` without a
//! template.

use std::path::{Path, PathBuf};

use crate::util::{fixtures, json_field, run_nnx as nnx, scratch};

/// The fixture cases, each a transformers folder with llama.cpp conversions beside it.
const CASES: &[&str] = &["llama3", "mistral", "qwen2", "qwen3", "gemma3", "llama3-wide"];

/// The tokens generated in the greedy comparisons (the goldens hold 12).
const STEPS: usize = 12;

fn folder(case: &str) -> PathBuf {
    fixtures().join("models").join(case)
}

fn read_json(path: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|error| panic!("`{}`: {error}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|error| panic!("`{}`: {error}", path.display()))
}

/// The end-of-sequence ids of a case's `generation_config.json` (an id or a list).
fn eos_ids(case: &str) -> Vec<u32> {
    let config = read_json(&folder(case).join("generation_config.json"));
    match &config["eos_token_id"] {
        serde_json::Value::Array(ids) => ids.iter().map(|id| id.as_u64().unwrap() as u32).collect(),
        id => vec![id.as_u64().unwrap() as u32],
    }
}

/// The output of `nnx run MODEL --prompt PROMPT --temperature 0 --json` and more `flags`.
fn run_json(model: &Path, prompt: &str, flags: &[&str]) -> serde_json::Value {
    let steps = STEPS.to_string();
    let mut args = vec!["run", model.to_str().unwrap(), "--prompt", prompt, "--temperature", "0"];
    args.extend(["--max-new-tokens", &steps, "--json"]);
    args.extend(flags);
    let (code, out, err) = nnx(&args);
    assert_eq!(code, 0, "nnx {args:?}: {err}");
    assert_eq!(out.lines().count(), 1, "one JSON line: {out}");
    let value: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|error| panic!("{error}: {out}"));
    for key in ["prefill_tokens_per_s", "decode_tokens_per_s"] {
        assert!(value[key].as_f64().is_some_and(|speed| speed >= 0.0), "{key}: {out}");
    }
    value
}

/// `generated` is the greedy continuation `expected`: all of it, or (since `nnx run` stops at
/// an end-of-sequence id, which the goldens run past) its first tokens up to such an id.
fn assert_greedy(generated: &[u32], expected: &[u32], eos: &[u32], what: &str) {
    let stop = expected.iter().position(|id| eos.contains(id)).map_or(expected.len(), |at| at + 1);
    assert_eq!(generated, &expected[..stop], "{what}: greedy ids (end-of-sequence ids {eos:?})");
}

/// A model's greedy continuation as `nnx run` gives it, checked against `expected` when the
/// prompt's ids are `golden_ids` (the ids the golden continues); `false` when they are not.
fn check_run(model: &Path, prompt: &str, expected_prompt: &[u32], golden: (&[u32], &[u32]), case: &str) -> bool {
    let what = model.display();
    let value = run_json(model, prompt, &[]);
    let prompt_ids: Vec<u32> = json_field(&value, "prompt_ids");
    assert_eq!(prompt_ids, expected_prompt, "{what}: prompt ids");
    let generated: Vec<u32> = json_field(&value, "generated_ids");
    assert!(value["text"].is_string(), "{what}: `text` is a string");
    let (golden_ids, golden_greedy) = golden;
    if prompt_ids != golden_ids {
        println!("{what}: no golden continues the prompt's own ids; prompt ids checked only");
        return false;
    }
    assert_greedy(&generated, golden_greedy, &eos_ids(case), &what.to_string());
    true
}

#[test]
fn run_gguf_tokenizes_and_decodes_greedily_as_llama_cpp() {
    let mut compared = Vec::new();
    for case in CASES {
        let dir = folder(case);
        let model = dir.join("model-q8_0.gguf");
        let goldens = read_json(&dir.join("llamacpp.json"));
        let golden = &goldens["model-q8_0.gguf"];
        let prompt = goldens["prompt"].as_str().unwrap();
        let tokens: Vec<u32> = json_field(golden, "tokens");
        let ids: Vec<u32> = json_field(&goldens, "ids");
        let greedy: Vec<u32> = json_field(golden, "greedy");
        if check_run(&model, prompt, &tokens, (&ids, &greedy), case) {
            compared.push(*case);
        }
    }
    println!("greedy ids compared with llama.cpp for {compared:?}");
    assert!(!compared.is_empty(), "no case has a llama.cpp golden for its prompt's own ids");
}

#[test]
fn run_folder_tokenizes_and_decodes_greedily_as_transformers() {
    let mut compared = Vec::new();
    for case in CASES {
        let dir = folder(case);
        let reference = read_json(&dir.join("reference.json"));
        let prompt = reference["prompt"].as_str().unwrap();
        let prompt_ids: Vec<u32> = json_field(&reference, "prompt_ids");
        let ids: Vec<u32> = json_field(&reference, "ids");
        let greedy: Vec<u32> = json_field(&reference, "greedy");
        if check_run(&dir, prompt, &prompt_ids, (&ids, &greedy), case) {
            compared.push(*case);
        }
    }
    println!("greedy ids compared with transformers for {compared:?}");
    assert!(!compared.is_empty(), "no case has a transformers golden for its prompt's own ids");
}

#[test]
fn run_chat_prompt_starts_with_one_bos() {
    for case in CASES {
        let dir = folder(case);
        let bos = read_json(&dir.join("generation_config.json"))["bos_token_id"].as_u64().unwrap() as u32;
        for model in [dir.clone(), dir.join("model-q8_0.gguf")] {
            let value = run_json(&model, "Hello there", &["--chat", "--max-new-tokens", "2"]);
            let prompt_ids: Vec<u32> = json_field(&value, "prompt_ids");
            let plain: Vec<u32> =
                json_field(&run_json(&model, "Hello there", &["--max-new-tokens", "1"]), "prompt_ids");
            let adds_bos = plain.first() == Some(&bos);
            let count = prompt_ids.iter().filter(|&&id| id == bos).count();
            if adds_bos {
                assert_eq!(prompt_ids[0], bos, "{}: {prompt_ids:?}", model.display());
                assert_eq!(
                    count,
                    1,
                    "{}: one BOS, not the template's and the tokenizer's: {prompt_ids:?}",
                    model.display()
                );
            }
            assert!(
                prompt_ids.len() > plain.len() + 2,
                "{}: the template wraps the prompt: {prompt_ids:?}",
                model.display()
            );
        }
    }
}

#[test]
fn perplexity_is_llama_perplexity() {
    let text = fixtures().join("models/perplexity.txt");
    let mut compared = Vec::new();
    for case in CASES {
        let dir = folder(case);
        let model = dir.join("model-f32.gguf");
        let goldens = read_json(&dir.join("llamacpp.json"));
        let golden = &goldens["model-f32.gguf"];
        if !model.is_file() || golden["perplexity"].is_null() {
            continue;
        }
        let expected = golden["perplexity"].as_f64().unwrap();
        let ctx = golden["perplexity_ctx"].as_u64().unwrap().to_string();
        let args = ["perplexity", model.to_str().unwrap(), "--file", text.to_str().unwrap(), "--ctx", &ctx, "--json"];
        let (code, out, err) = nnx(&args);
        assert_eq!(code, 0, "{case}: {err}");
        let value: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|error| panic!("{error}: {out}"));
        let perplexity = value["perplexity"].as_f64().unwrap();
        let chunks = value["chunks"].as_u64().unwrap();
        let tokens = value["tokens"].as_u64().unwrap();
        assert_eq!(value["ctx"].as_u64().unwrap().to_string(), ctx);
        assert_eq!(chunks, tokens / value["ctx"].as_u64().unwrap(), "{case}: whole chunks");
        let relative = (perplexity - expected).abs() / expected;
        println!("{case}: perplexity {perplexity:.4}, llama.cpp {expected:.4} ({relative:.1e} relative)");
        assert!(relative <= 1e-3, "{case}: perplexity {perplexity}, llama-perplexity {expected}");
        compared.push(*case);
    }
    assert!(compared.len() >= 5, "llama-perplexity goldens found only for {compared:?}");

    // The text line.
    let model = folder("qwen2").join("model-f32.gguf");
    let (code, out, err) =
        nnx(&["perplexity", model.to_str().unwrap(), "--file", text.to_str().unwrap(), "--ctx", "16"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("perplexity: ") && out.trim_end().ends_with("chunks of 16 tokens)"), "{out}");
}

#[test]
fn perplexity_refuses_a_text_shorter_than_two_chunks() {
    let dir = scratch();
    let short = dir.path().join("short.txt");
    std::fs::write(&short, "the café and the dog").unwrap();
    let model = folder("llama3").join("model-f32.gguf");
    let (code, out, err) =
        nnx(&["perplexity", model.to_str().unwrap(), "--file", short.to_str().unwrap(), "--ctx", "16"]);
    assert_eq!(code, 1, "{err}");
    assert!(out.is_empty(), "{out}");
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    // llama.cpp's tokens of the text: 15 with the BOS.
    assert!(err.contains("tokenizes to only 15 tokens") && err.contains("at least 32"), "{err}");

    let (code, _, err) = nnx(&["perplexity", model.to_str().unwrap(), "--file", short.to_str().unwrap(), "--ctx", "2"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("at least 3"), "{err}");
}

#[test]
fn run_chat_needs_a_template() {
    let dir = scratch();
    let source = folder("llama3");
    for file in ["config.json", "generation_config.json", "model.safetensors", "tokenizer.json"] {
        std::fs::copy(source.join(file), dir.path().join(file)).unwrap();
    }
    let mut config = read_json(&source.join("tokenizer_config.json"));
    config.as_object_mut().unwrap().remove("chat_template");
    std::fs::write(dir.path().join("tokenizer_config.json"), config.to_string()).unwrap();
    let model = dir.path().to_str().unwrap();

    let (code, out, err) = nnx(&["run", model, "--prompt", "the dog", "--chat", "--max-new-tokens", "2"]);
    assert_eq!(code, 1, "{err}");
    assert!(out.is_empty(), "{out}");
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    assert!(err.starts_with("error: ") && err.contains("no chat template"), "{err}");

    // Without `--chat` the same folder continues the prompt.
    let (code, out, err) = nnx(&["run", model, "--prompt", "the dog", "--max-new-tokens", "3", "--temperature", "0"]);
    assert_eq!(code, 0, "{err}");
    assert!(!out.is_empty() && err.contains("tok/s"), "{out}{err}");
}
