//! Round trips through the `nnx` binary: GGUF files to SafeTensors and back (metadata with its
//! types, tensor names, ggml types and what `nnx run` generates), with and without `--type` on
//! the way back; the warning and summary of requantizing a quantized file; and `nnx quantize`'s
//! output names and the other files of a folder it copies.

use std::path::{Path, PathBuf};

use nnx::Archive;
use nnx::gguf::Value;
use nnx::quant::ggml::GgmlType;

use crate::util::{fixtures, nnx_ok, run_nnx, scratch, text};

/// The prompt of the model fixtures' goldens.
const PROMPT: &str = "the café and the dog";

/// A GGUF file of the model fixtures (`tests/fixtures/models/`), written by llama.cpp.
fn model(case: &str, file: &str) -> PathBuf {
    fixtures().join("models").join(case).join(file)
}

/// `gguf` converted to SafeTensors in a folder `case` of `dir`, then back to GGUF with the
/// extra `flags`.
fn round_trip(gguf: &Path, dir: &Path, case: &str, flags: &[&str]) -> PathBuf {
    let dir = dir.join(case);
    std::fs::create_dir_all(&dir).unwrap();
    let stem = gguf.file_stem().unwrap().to_str().unwrap();
    let safetensors = dir.join(format!("{stem}.safetensors"));
    let back = dir.join(format!("{stem}-back{}.gguf", flags.join("")));
    nnx_ok(&["convert", text(gguf), text(&safetensors)]);
    let mut args = vec!["convert", text(&safetensors), text(&back)];
    args.extend(flags);
    nnx_ok(&args);
    back
}

/// The metadata of a GGUF file, typed, in file order.
fn metadata(path: &Path) -> Vec<(String, Value)> {
    let archive = Archive::open(path).unwrap_or_else(|error| panic!("`{}`: {error}", path.display()));
    let metadata = archive.gguf_metadata().unwrap_or_else(|| panic!("`{}` has GGUF metadata", path.display()));
    metadata.iter().map(|(key, value)| (key.to_string(), value.clone())).collect()
}

/// The tensor names of a GGUF file with their ggml types, in file order.
fn tensors(path: &Path) -> Vec<(String, GgmlType)> {
    let archive = Archive::open(path).unwrap();
    archive.names().map(|name| (name.to_string(), archive.ggml_type(name).unwrap())).collect()
}

/// The ids `nnx run --json` generates greedily from [`PROMPT`] with `model`.
fn generated(model: &Path) -> Vec<u32> {
    let out =
        nnx_ok(&["run", text(model), "--json", "--max-new-tokens", "8", "--temperature", "0", "--prompt", PROMPT]);
    let value: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|error| panic!("{error}: {out}"));
    crate::util::json_field(&value, "generated_ids")
}

/// `found` has the keys of `expected` in its order with equal typed values, but the `changed`
/// keys, which must be there with a value of the same type.
fn assert_same_metadata(found: &[(String, Value)], expected: &[(String, Value)], changed: &[&str], what: &str) {
    let keys = |entries: &[(String, Value)]| entries.iter().map(|(key, _)| key.clone()).collect::<Vec<_>>();
    assert_eq!(keys(found), keys(expected), "{what}: the keys, in order");
    for ((key, value), (_, wanted)) in found.iter().zip(expected) {
        assert_eq!(value.value_type(), wanted.value_type(), "{what}: the type of `{key}`");
        if !changed.contains(&key.as_str()) {
            assert_eq!(value, wanted, "{what}: the value of `{key}`");
        }
    }
    assert!(found.iter().any(|(key, _)| key == "tokenizer.ggml.tokens"), "{what}: the vocabulary is kept");
}

#[test]
fn roundtrip_gguf_to_safetensors_and_back_keeps_metadata_names_types_and_generation() {
    let dir = scratch();
    let cases = [
        ("llama3", "model-f32.gguf", "llama"),
        ("llama3", "model-q8_0.gguf", "llama"),
        ("qwen2", "model-f32.gguf", "qwen2"),
        ("gemma3", "model-q4_k_m.gguf", "gemma3"),
        ("llama3-wide", "model-q4_k_m.gguf", "llama"),
    ];
    for (case, file, architecture) in cases {
        let original = model(case, file);
        let what = format!("{case}/{file}");
        let back = round_trip(&original, dir.path(), case, &[]);
        let expected = metadata(&original);
        let found = metadata(&back);
        assert_same_metadata(&found, &expected, &[], &what);
        assert!(found.contains(&("general.architecture".into(), Value::String(architecture.into()))), "{what}");
        assert_eq!(tensors(&back), tensors(&original), "{what}: tensor names, ggml types and order");
        if !file.contains("q4_k") {
            // Floats are copied, and Q8_0 blocks decoded and encoded again give the same bytes:
            // the file is the one llama.cpp wrote.
            assert!(std::fs::read(&back).unwrap() == std::fs::read(&original).unwrap(), "{what}: the same bytes");
        }
        assert_eq!(generated(&back), generated(&original), "{what}: the ids `nnx run` generates");
    }
}

#[test]
fn roundtrip_with_type_q8_0_on_the_way_back_keeps_metadata_and_runs() {
    let dir = scratch();
    for case in ["llama3", "qwen2"] {
        let original = model(case, "model-f32.gguf");
        let back = round_trip(&original, dir.path(), case, &["--type", "q8_0"]);
        let found = metadata(&back);
        assert_same_metadata(&found, &metadata(&original), &["general.file_type"], case);
        let file_type = found.iter().find(|(key, _)| key == "general.file_type").map(|(_, value)| value.clone());
        assert_eq!(file_type, Some(Value::U32(7)), "{case}: llama.cpp's MOSTLY_Q8_0");
        // Matrices in Q8_0; norms, biases and rope factors (one axis) keep their F32.
        let archive = Archive::open(&back).unwrap();
        for (name, ty) in tensors(&back) {
            let rank = archive.info(&name).unwrap().shape.len();
            let expected = if rank == 1 { GgmlType::F32 } else { GgmlType::Q8_0 };
            assert_eq!(ty, expected, "{case}: {name}");
        }
        // The weights llama-quantize made Q8_0 from the same floats: the same generation.
        let generated_back = generated(&back);
        assert!(!generated_back.is_empty(), "{case}: `nnx run` generates");
        assert_eq!(generated_back, generated(&model(case, "model-q8_0.gguf")), "{case}");
    }
}

#[test]
fn roundtrip_requantizing_a_quantized_gguf_warns_and_says_why_the_output_is_larger() {
    let dir = scratch();
    let original = model("llama3-wide", "model-q4_k_m.gguf");
    let output = dir.path().join("q8_0.gguf");
    let (code, stdout, stderr) = run_nnx(&["convert", text(&original), text(&output), "--type", "q8_0"]);
    assert_eq!(code, 0, "{stderr}");
    let warning = stderr.lines().find(|line| line.starts_with("nnx: warning: requantizing")).unwrap_or_else(|| {
        panic!("a warning on stderr: {stderr}");
    });
    assert!(warning.contains("13 from Q4_K to Q8_0") && warning.contains("3 from Q6_K to Q8_0"), "{warning}");
    assert!(warning.contains("loses quality"), "{warning}");
    assert_eq!(stdout.lines().count(), 1, "one summary line: {stdout}");
    assert!(stdout.contains("larger than the input"), "{stdout}");
    assert!(stdout.contains("13 from Q4_K (4.5 bits per weight) to Q8_0 (8.5)"), "{stdout}");
    let output_bytes = std::fs::metadata(&output).unwrap().len();
    assert!(output_bytes > std::fs::metadata(&original).unwrap().len());

    // The values of a SafeTensors file decoded from the same file are quantized again too.
    let safetensors = dir.path().join("decoded.safetensors");
    nnx_ok(&["convert", text(&original), text(&safetensors)]);
    let (code, _, stderr) = run_nnx(&["convert", text(&safetensors), text(&output), "--type", "q8_0"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stderr.contains("warning: requantizing") && stderr.contains("decoded from"), "{stderr}");

    // Floats quantized once: no warning, and a smaller file.
    let (code, stdout, stderr) =
        run_nnx(&["convert", text(&model("llama3", "model-f32.gguf")), text(&output), "--type", "q8_0"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(!stderr.contains("warning"), "{stderr}");
    assert!(!stdout.contains("larger"), "{stdout}");
}

#[test]
fn roundtrip_quantize_of_a_gguf_writes_safetensors_and_refuses_a_gguf_name() {
    let dir = scratch();
    let input = model("llama3", "model-f32.gguf");
    let output = dir.path().join("model-q4");
    let summary = nnx_ok(&["quantize", text(&input), text(&output), "--encoding", "q4"]);
    let written = dir.path().join("model-q4.safetensors");
    assert!(summary.contains(text(&written)), "{summary}");
    assert!(summary.contains("nnx convert") && summary.contains("--type q4_k_m"), "{summary}");
    assert!(!output.exists());
    assert!(Archive::open(&written).unwrap().contains("blk.0.attn_q.scales"));

    let gguf = dir.path().join("model-q4.gguf");
    let (code, _, stderr) = run_nnx(&["quantize", text(&input), text(&gguf), "--encoding", "q8"]);
    assert_eq!(code, 1, "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("`nnx convert") && stderr.contains("--type q8_0"), "{stderr}");
    assert!(!gguf.exists());
}

#[test]
fn roundtrip_quantize_of_a_folder_copies_its_other_files() {
    let dir = scratch();
    let input = fixtures().join("models").join("llama3");
    let folder = dir.path().join("base");
    std::fs::create_dir(&folder).unwrap();
    for file in std::fs::read_dir(&input).unwrap() {
        let file = file.unwrap().path();
        std::fs::copy(&file, folder.join(file.file_name().unwrap())).unwrap();
    }
    std::fs::write(folder.join("chat_template.jinja"), "{{ messages }}").unwrap();
    #[cfg(unix)]
    std::os::unix::fs::symlink("tokenizer.json", folder.join("alias.json")).unwrap();
    let output = dir.path().join("q4");
    nnx_ok(&["quantize", text(&folder), text(&output), "--encoding", "q4", "--group-size", "32"]);
    for file in ["tokenizer.json", "tokenizer_config.json", "tokenizer.model", "generation_config.json"] {
        assert_eq!(std::fs::read(output.join(file)).unwrap(), std::fs::read(folder.join(file)).unwrap(), "{file}");
    }
    assert_eq!(std::fs::read_to_string(output.join("chat_template.jinja")).unwrap(), "{{ messages }}");
    #[cfg(unix)]
    assert_eq!(std::fs::read_link(output.join("alias.json")).unwrap(), Path::new("tokenizer.json"));
    // Weights of other formats stay behind, and `config.json` is the quantized model's.
    assert!(!output.join("model-f32.gguf").exists() && !output.join("model.safetensors").exists());
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(output.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["quantization"]["bits"], 4);
    // The folder runs as it is, with its own tokenizer.
    assert!(!generated(&output).is_empty());
}
