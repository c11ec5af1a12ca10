//! Hostile model files: hyperparameters and configs that describe sizes the tensors do not hold,
//! each refused before anything is allocated for them.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::util::{Bounded, run_nnx_bounded, scratch};

/// The address space each run may use: far below what the hostile sizes would take.
const MEMORY: u64 = 3 << 30;

/// How long a run may take.
const TIMEOUT: Duration = Duration::from_secs(60);

/// A fixture model folder.
fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/models").join(name)
}

/// Runs `nnx run MODEL --prompt PROMPT --max-new-tokens 1` bounded, printing its peak memory
/// and time as `case`.
fn run(case: &str, model: &Path, prompt: &str) -> Bounded {
    let args = [
        "run".to_string(),
        model.to_str().unwrap().to_string(),
        "--prompt".into(),
        prompt.to_string(),
        "--max-new-tokens".into(),
        "1".into(),
    ];
    let start = Instant::now();
    let bounded = run_nnx_bounded(&args, &[], MEMORY, TIMEOUT);
    eprintln!("{case}: peak_memory {} MiB, {:.2} s", bounded.peak_memory >> 20, start.elapsed().as_secs_f64());
    for line in bounded.stderr.lines().filter(|line| line.starts_with("error:")) {
        eprintln!("{case}: {line}");
    }
    bounded
}

/// `source` rewritten to `dir/name` with the metadata `key` set to `value`.
pub fn rewritten_gguf(source: &Path, key: &str, value: nnx::gguf::Value, dir: &Path, name: &str) -> PathBuf {
    let archive = nnx::Archive::open(source).unwrap();
    let mut writer = nnx::gguf::GgufWriter::new();
    *writer.metadata_mut() = archive.gguf_metadata().unwrap().clone();
    writer.metadata_mut().set(key, value);
    writer.metadata_mut().remove("general.alignment");
    for name in archive.names() {
        writer.add(name, archive.ggml(name).unwrap()).unwrap();
    }
    let path = dir.join(name);
    writer.write(&path).unwrap();
    path
}

/// A copy of the transformers folder of `models/llama3` in `dir/name` (without its GGUF
/// files), its `config.json` changed by `edit`.
fn llama_folder(dir: &Path, name: &str, edit: impl FnOnce(&mut serde_json::Value)) -> PathBuf {
    let source = fixture("llama3");
    let folder = dir.join(name);
    std::fs::create_dir(&folder).unwrap();
    for entry in std::fs::read_dir(&source).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|ext| ext == "gguf") {
            continue;
        }
        std::fs::copy(&path, folder.join(path.file_name().unwrap())).unwrap();
    }
    let config_path = folder.join("config.json");
    let mut config: serde_json::Value = serde_json::from_slice(&std::fs::read(&config_path).unwrap()).unwrap();
    edit(&mut config);
    std::fs::write(&config_path, serde_json::to_vec(&config).unwrap()).unwrap();
    folder
}

#[test]
fn a_gemma3_gguf_of_2_to_the_40_blocks_is_refused() {
    let dir = scratch();
    let path = rewritten_gguf(
        &fixture("gemma3").join("model-f32.gguf"),
        "gemma3.block_count",
        nnx::gguf::Value::U64(1 << 40),
        dir.path(),
        "many-blocks.gguf",
    );
    run("gemma3 block_count 2^40", &path, "hi").assert_refused("gemma3.block_count");
}

#[test]
fn a_llama_gguf_with_a_key_length_of_2_to_the_40_is_refused() {
    let dir = scratch();
    let path = rewritten_gguf(
        &fixture("llama3").join("model-f32.gguf"),
        "llama.attention.key_length",
        nnx::gguf::Value::U64(1 << 40),
        dir.path(),
        "long-keys.gguf",
    );
    run("llama key_length 2^40", &path, "hi").assert_refused("llama.attention.key_length");
}

#[test]
fn a_config_of_2_to_the_40_layers_is_refused() {
    let dir = scratch();
    let folder = llama_folder(dir.path(), "many-layers", |config| {
        config["num_hidden_layers"] = serde_json::json!(1u64 << 40);
    });
    run("config num_hidden_layers 2^40", &folder, "hi").assert_refused("num_hidden_layers");
}

#[test]
fn a_config_with_a_rotary_base_of_zero_or_below_is_refused() {
    let dir = scratch();
    for (case, theta) in [("zero", 0.0), ("negative", -1.0)] {
        let folder = llama_folder(dir.path(), &format!("theta-{case}"), |config| {
            config["rope_parameters"]["rope_theta"] = serde_json::json!(theta);
            config["rope_theta"] = serde_json::json!(theta);
        });
        run(&format!("config rope_theta {theta}"), &folder, "hi").assert_refused("rope_theta");
    }
}

#[test]
fn a_config_of_2_to_the_62_positions_is_refused() {
    let dir = scratch();
    let folder = llama_folder(dir.path(), "many-positions", |config| {
        config["max_position_embeddings"] = serde_json::json!(1u64 << 62);
    });
    run("config max_position_embeddings 2^62", &folder, "hi").assert_refused("max_position_embeddings");
}

#[test]
fn a_config_with_an_unknown_key_of_millions_of_tiny_values_stays_bounded() {
    let dir = scratch();
    let folder = llama_folder(dir.path(), "padded", |config| {
        let items: Vec<serde_json::Value> = (0..300_000).map(|_| serde_json::json!({ "a": [] })).collect();
        config["padding"] = serde_json::Value::Array(items);
    });
    let size = std::fs::metadata(folder.join("config.json")).unwrap().len();
    assert!(size > 2_500_000, "{size}");
    let bounded = run("config unknown key of 300,000 items", &folder, "hi");
    if bounded.code == Some(1) {
        bounded.assert_refused("padding");
    } else {
        assert_eq!(bounded.code, Some(0), "nnx must work or refuse:\n{}", bounded.stderr);
    }
    assert!(bounded.peak_memory < 200 << 20, "peak memory {} MiB", bounded.peak_memory >> 20);
}

#[test]
fn a_prompt_longer_than_the_context_is_refused_naming_the_context() {
    let dir = scratch();
    let prompt = "hello world ".repeat(1_000);
    let gguf = fixture("llama3").join("model-f32.gguf");
    let bounded = run("prompt past the context (gguf)", &gguf, &prompt);
    bounded.assert_refused("longer than the context of");
    let folder = llama_folder(dir.path(), "short-context", |config| {
        config["max_position_embeddings"] = serde_json::json!(8);
    });
    let bounded = run("prompt past the context (folder)", &folder, &prompt);
    bounded.assert_refused("longer than the context of 8 tokens");
}
