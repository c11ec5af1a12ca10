//! What people bring from other tools: `nnx run` with llama.cpp's and mlx-lm's flags, the chat
//! template used for `--prompt` by default, the context of `-c`, stop strings, and the GPU
//! adapter named; `nnx tokenize` without the padding a `tokenizer.json` may set. Checked on
//! the model fixtures against their transformers goldens and on all-MiniLM-L6-v2 against
//! sentence-transformers' ids.

use crate::run_cli::{assert_greedy, eos_ids, folder, golden_text, read_json, run_json};
use crate::util::{json_field, nnx_binary, run_nnx as nnx};

/// `nnx run` with `args` and `--json`: the one JSON object it prints.
fn run(args: &[&str]) -> serde_json::Value {
    let mut args = args.to_vec();
    args.push("--json");
    let (code, out, err) = nnx(&args);
    assert_eq!(code, 0, "nnx {args:?}: {err}");
    serde_json::from_str(&out).unwrap_or_else(|error| panic!("{error}: {out}"))
}

fn generated(value: &serde_json::Value) -> Vec<u32> {
    json_field(value, "generated_ids")
}

/// The llama3 fixture folder and the text whose greedy continuation its goldens hold.
fn llama3() -> (std::path::PathBuf, String, Vec<u32>) {
    let dir = folder("llama3");
    let reference = read_json(&dir.join("reference.json"));
    let text = golden_text("llama3", reference["prompt"].as_str().unwrap()).unwrap();
    (dir, text, json_field(&reference, "greedy"))
}

#[test]
fn newcomer_run_takes_llama_cpp_and_mlx_lm_flags() {
    let (dir, text, greedy) = llama3();
    let model = dir.to_str().unwrap();
    let long = run_json(&dir, &text, 12, &[]);
    assert_greedy(&generated(&long), &greedy, &eos_ids("llama3"), "--prompt --max-new-tokens --temperature 0");
    let short = run(&["run", "-m", model, "-p", &text, "-n", "12", "--temp", "0", "--raw"]);
    assert_eq!(generated(&short), generated(&long), "-m -p -n --temp");
    let mlx = run(&["run", "--model", model, "--prompt", &text, "--max-tokens", "12", "--temp", "0", "--raw"]);
    assert_eq!(generated(&mlx), generated(&long), "--model --max-tokens");
    // A negative temperature is greedy, as in llama.cpp; one thread computes the same ids.
    let negative = run(&["run", model, "-p", &text, "-n", "12", "--temp", "-1", "--raw", "-t", "1"]);
    assert_eq!(generated(&negative), generated(&long), "--temp -1 -t 1");
    // min-p 1 keeps only the most likely token, however hot the draw; top-k 0 is no limit.
    let hot = ["--temp", "5", "--min-p", "1", "--top-k", "0", "--top-p", "1", "-s", "7", "--raw"];
    let mut args = vec!["run", model, "-p", &text, "-n", "12"];
    args.extend(hot);
    assert_eq!(generated(&run(&args)), generated(&long), "--min-p 1 at temperature 5");
    // Without min-p the same draw leaves the greedy path.
    let drawn = run(&["run", model, "-p", &text, "-n", "12", "--temp", "5", "-s", "7", "--raw"]);
    assert_ne!(generated(&drawn), generated(&long), "a draw at temperature 5");

    let (code, _, err) = nnx(&["run", model, "-p", "hi", "--min-p", "2"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.starts_with("error: ") && err.contains("min_p") && err.contains("[0, 1]"), "{err}");
}

#[test]
fn newcomer_run_ctx_size_bounds_the_prompt_and_what_follows() {
    let (dir, text, greedy) = llama3();
    let model = dir.to_str().unwrap();
    let prompt: Vec<u32> = json_field(&run_json(&dir, &text, 1, &[]), "prompt_ids");
    // `-n -1` generates until the context of `-c` is full.
    let context = (prompt.len() + 3).to_string();
    let value = run(&["run", model, "-p", &text, "-n", "-1", "-c", &context, "--temp", "0", "--raw"]);
    let ids = generated(&value);
    assert!(ids.len() <= 3, "{ids:?}");
    assert_greedy(&ids, &greedy[..3], &eos_ids("llama3"), "-n -1 -c P+3");
    // A prompt longer than `-c` is refused, naming that context.
    let context = (prompt.len() - 1).to_string();
    let (code, out, err) = nnx(&["run", model, "-p", &text, "-c", &context, "--raw"]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(err.contains(&format!("longer than the context of {context} tokens")), "{err}");
    // More than the model's context is its own context, said once.
    let (code, _, err) = nnx(&["run", model, "-p", &text, "-n", "1", "-c", "100000000", "--raw"]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("past the model's context"), "{err}");
}

#[test]
fn newcomer_run_prompt_goes_through_the_chat_template() {
    let dir = folder("llama3");
    for model in [dir.clone(), dir.join("model-q8_0.gguf")] {
        let model = model.to_str().unwrap();
        let prompt_ids = |flags: &[&str]| -> Vec<u32> {
            let mut args = vec!["run", model, "-p", "Hello there", "-n", "1", "--temp", "0"];
            args.extend(flags);
            json_field(&run(&args), "prompt_ids")
        };
        let default = prompt_ids(&[]);
        assert_eq!(default, prompt_ids(&["--chat"]), "{model}: `--prompt` uses the template as `--chat` does");
        let raw = prompt_ids(&["--raw"]);
        assert!(default.len() >= raw.len() + 2, "{model}: the template wraps the prompt: {default:?} {raw:?}");
        let system = prompt_ids(&["--system", "Answer in one word."]);
        assert!(system.len() > default.len(), "{model}: the system message is rendered: {system:?}");
        assert_eq!(system.last(), default.last(), "{model}: the generation prompt still ends it");
    }
    // `--system` needs a template; `--raw` says there is none to use.
    let (code, _, err) = nnx(&["run", dir.to_str().unwrap(), "-p", "hi", "--raw", "--system", "x"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("--system") && err.contains("--raw"), "{err}");
}

#[test]
fn newcomer_run_stops_at_a_stop_string() {
    let (dir, text, _) = llama3();
    let full = run_json(&dir, &text, 12, &[]);
    let whole = full["text"].as_str().unwrap().to_string();
    let chars: Vec<char> = whole.chars().collect();
    assert!(chars.len() >= 4, "the golden continuation has text: {whole:?}");
    let stop: String = chars[chars.len() / 2..chars.len() / 2 + 2].iter().collect();
    let at = whole.find(&stop).unwrap();
    let stopped = run_json(&dir, &text, 12, &["--stop", &stop]);
    assert_eq!(stopped["text"].as_str().unwrap(), &whole[..at], "the text ends before `{stop}`");
    assert!(generated(&stopped).len() < generated(&full).len(), "fewer tokens");
    let ids = generated(&stopped);
    assert_eq!(ids[..], generated(&full)[..ids.len()], "the same tokens up to the stop");
}

#[test]
fn newcomer_tokenize_leaves_out_the_padding_of_the_tokenizer_file() {
    let folder = crate::minilm::model_folder();
    let reference = crate::minilm::reference();
    // The folder's tokenizer.json pads every text to 128 tokens; transformers does not apply it
    // unless asked, and sentence-transformers' ids are the text's own.
    for (sentence, ids) in reference.sentences.iter().zip(&reference.ids).take(4) {
        let out = crate::util::nnx_ok(&["tokenize", folder.to_str().unwrap(), sentence]);
        let got: Vec<u32> = serde_json::from_str(&out).unwrap();
        assert_eq!(&got, ids, "{sentence:?}");
    }
}

#[test]
fn newcomer_gpu_run_names_its_adapter() {
    let Some(gpu) = crate::gpu::gpu() else { return };
    let dir = folder("llama3");
    let output = std::process::Command::new(nnx_binary())
        .args(["run", dir.to_str().unwrap(), "-p", "the dog", "-n", "1", "--raw", "--device", "gpu"])
        .env_remove("XDG_RUNTIME_DIR")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{err}");
    assert!(err.contains(&format!("nnx: running on GPU adapter {}", gpu.description())), "{err}");
    assert_eq!(gpu.is_software(), err.contains("computes on the CPU (a software driver)"), "{err}");
    // Without a runtime folder in the environment, no driver line about it reads as an error.
    assert!(!err.contains("XDG_RUNTIME_DIR"), "{err}");
}
