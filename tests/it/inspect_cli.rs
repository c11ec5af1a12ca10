//! `nnx inspect`, `nnx stats` and `nnx diff` as a newcomer meets them: a mistyped `--model`
//! answered with the names it takes, GGUF block types shown as stored (import plan, `diff`),
//! zero biases and far tails that are normal in trained models not reported as problems, and
//! the text listing with the summary the report has (parameters, per-type totals, bits per
//! weight, statistics, import plan, shapes in ggml's order, `general.file_type` named).

use std::path::Path;

use nnx::{Archive, Tensor};
use serde_json::Value;

use crate::util::{fixtures, nnx_ok, run_nnx, scratch, text};

/// The report `nnx inspect --json` prints, with `extra` flags.
fn report(path: &Path, extra: &[&str]) -> Value {
    let mut args = vec!["inspect", text(path), "--json"];
    args.extend_from_slice(extra);
    serde_json::from_str(&nnx_ok(&args)).unwrap()
}

#[test]
fn inspect_cli_mistyped_model_is_answered_with_every_architecture() {
    let folder = fixtures().join("models/llama3");
    for extra in [&["--json"][..], &[]] {
        let mut args = vec!["inspect", text(&folder), "--model", "bret"];
        args.extend_from_slice(extra);
        let (code, out, err) = run_nnx(&args);
        assert_eq!(code, 1, "{err}");
        assert!(out.is_empty(), "{out}");
        assert!(err.contains("`bret` is not an architecture") && err.contains("(did you mean `bert`?)"), "{err}");
        for name in ["llama", "mistral", "qwen2", "qwen3", "gemma3", "gpt2", "bert"] {
            assert!(err.contains(&format!("`{name}`")), "{name}: {err}");
        }
        // The flag is wrong, not the file.
        assert!(!err.contains("config.json") && !err.contains("model_type"), "{err}");
    }
    // A GGUF file is planned into the decoders llama.cpp's files describe, and says so.
    let gguf = folder.join("model-q8_0.gguf");
    let (code, _, err) = run_nnx(&["inspect", text(&gguf), "--json", "--model", "bert"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("GGUF") && err.contains("`llama`") && !err.contains("general.architecture"), "{err}");
}

#[test]
fn inspect_cli_plan_and_diff_show_ggml_types_as_stored() {
    let folder = fixtures().join("models/llama3");
    let q8 = folder.join("model-q8_0.gguf");
    let archive = Archive::open(&q8).unwrap();
    let stored = archive.ggml_type("blk.0.attn_q.weight").unwrap().name();
    assert_eq!(stored, "Q8_0");
    // The plan reads the blocks as F32 and says they are stored as Q8_0.
    let value = report(&q8, &["--model", "llama"]);
    let rows = value["plan"]["rows"].as_array().unwrap();
    let q = rows.iter().find(|row| row["source"] == "blk.0.attn_q.weight").unwrap();
    assert_eq!((q["stored_dtype"].as_str(), q["dtype"].as_str()), (Some("Q8_0"), Some("F32")), "{q}");
    let norm = rows.iter().find(|row| row["source"] == "blk.0.attn_norm.weight").unwrap();
    assert_eq!(norm["stored_dtype"], "F32", "{norm}");
    for row in rows.iter().filter(|row| row["stored_dtype"].is_string()) {
        let source = row["source"].as_str().unwrap();
        assert_eq!(row["stored_dtype"], archive.ggml_type(source).unwrap().name(), "{source}");
    }

    // diff of the Q8_0 file against the F32 one: the A side as stored, compared as F32.
    let f32 = folder.join("model-f32.gguf");
    let (code, out, err) = run_nnx(&["diff", text(&q8), text(&f32)]);
    assert_eq!(code, 1, "{err}");
    let row = out.lines().find(|line| line.starts_with("blk.0.attn_q.weight ")).unwrap();
    assert!(row.contains("Q8_0 [") && row.contains("F32 ["), "{row}");
    assert!(out.contains("ggml block types are compared as the floats they decode to"), "{out}");
    let (code, out, err) = run_nnx(&["diff", text(&q8), text(&f32), "--json"]);
    assert_eq!(code, 1, "{err}");
    let value: Value = serde_json::from_str(&out).unwrap();
    let common = value["common"].as_array().unwrap();
    let q = common.iter().find(|entry| entry["name"] == "blk.0.attn_q.weight").unwrap();
    assert_eq!((q["a"]["ggml_type"].as_str(), q["a"]["dtype"].as_str()), (Some("Q8_0"), Some("F32")), "{q}");
    assert!(q["b"].get("ggml_type").is_none(), "F32 is stored as its dtype: {q}");
    assert_eq!(q["dtype_differs"], false, "compared as the floats the blocks decode to");
}

#[test]
fn inspect_cli_zero_biases_pass_the_check_and_zero_weights_fail_it() {
    let dir = scratch();
    let mut archive = Archive::new();
    archive.insert("dense.weight", Tensor::from_vec(vec![1.0f32, -2.0, 0.5, 3.0], &[2, 2]).unwrap());
    archive.insert("dense.bias", Tensor::from_vec(vec![0.0f32; 2], &[2]).unwrap());
    archive.insert("norm.weight", Tensor::from_vec(vec![0.0f32; 2], &[2]).unwrap());
    let healthy = dir.path().join("healthy.safetensors");
    archive.save(&healthy).unwrap();
    let (code, out, err) = run_nnx(&["stats", text(&healthy), "--check"]);
    assert_eq!(code, 0, "a zero bias and a zero norm vector are normal: {out}{err}");
    assert!(!out.contains("check:"), "{out}");

    archive.insert("embed.weight", Tensor::from_vec(vec![0.0f32; 6], &[3, 2]).unwrap());
    let broken = dir.path().join("broken.safetensors");
    archive.save(&broken).unwrap();
    let (code, out, _) = run_nnx(&["stats", text(&broken), "--check"]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("check: `embed.weight`: all zeros") && !out.contains("check: `dense.bias`"), "{out}");
    // The report: the weight a warning, the bias and the norm information.
    let value = report(&broken, &["--stats"]);
    let findings = value["validation"].as_array().unwrap();
    let at = |level: &str| -> Vec<&str> {
        findings.iter().filter(|f| f["level"] == level).map(|f| f["message"].as_str().unwrap()).collect()
    };
    assert_eq!(at("warning"), ["1 tensors are all zeros: `embed.weight`"], "{findings:?}");
    assert!(at("info").iter().any(|m| m.contains("`dense.bias`, `norm.weight`")), "{findings:?}");
    let stats = value["stats"].as_array().unwrap();
    let problem = |name: &str| stats.iter().find(|s| s["name"] == name).unwrap()["problem"].clone();
    assert_eq!((problem("embed.weight"), problem("dense.bias")), (Value::from("all zeros"), Value::Null));

    // all-MiniLM-L6-v2 holds `pooler.dense.bias` as zeros: it passes.
    let minilm = crate::minilm::model_folder();
    let (code, out, err) = run_nnx(&["stats", text(&minilm), "--check"]);
    assert_eq!(code, 0, "{out}{err}");
    let value = report(&minilm, &["--stats"]);
    let findings = value["validation"].as_array().unwrap();
    assert!(!findings.iter().any(|f| f["level"] == "warning" || f["level"] == "error"), "{findings:?}");
    assert!(findings.iter().any(|f| f["message"].as_str().unwrap().contains("`pooler.dense.bias`")), "{findings:?}");
}

#[test]
fn inspect_cli_far_tails_are_information_not_problems() {
    // 4095 values of a narrow normal-looking spread and one 100 times larger: a single outlier
    // feature, as trained language models have.
    let mut values: Vec<f32> = (0..4096).map(|at| ((at % 17) as f32 - 8.0) * 0.01).collect();
    values[100] = 40.0;
    let dir = scratch();
    let path = dir.path().join("tails.safetensors");
    let mut archive = Archive::new();
    archive.insert("layers.0.mlp.down.weight", Tensor::from_vec(values, &[64, 64]).unwrap());
    archive.save(&path).unwrap();
    let value = report(&path, &["--stats"]);
    let stats = &value["stats"][0];
    assert!(stats["outlier"].as_str().unwrap().starts_with("value 40.0000 lies"), "the data is kept: {stats}");
    assert!(stats["problem"].is_null(), "{stats}");
    let findings = value["validation"].as_array().unwrap();
    assert!(!findings.iter().any(|f| f["level"] == "warning" || f["level"] == "error"), "{findings:?}");
    let info = findings.iter().find(|f| f["level"] == "info").unwrap()["message"].as_str().unwrap();
    assert!(info.starts_with("1 tensors have values 25 or more std from their mean"), "{info}");
    assert_eq!(run_nnx(&["stats", text(&path), "--check"]).0, 0);
}

#[test]
fn inspect_cli_text_has_the_summary_ggml_shapes_and_file_type() {
    let path = fixtures().join("models/llama3-wide/model-q4_k_m.gguf");
    let value = report(&path, &[]);
    let out = nnx_ok(&["inspect", text(&path)]);
    // `general.file_type` named as llama.cpp names it.
    assert!(out.contains("  general.file_type = 15 (MOSTLY_Q4_K_M)\n"), "{out}");
    // Shapes in ggml's order (`ne`, as gguf-dump prints them), said in the header.
    let header = out.lines().find(|line| line.starts_with("name ")).unwrap();
    assert!(header.contains("shape (ggml ne)"), "{header}");
    for entry in value["entries"].as_array().unwrap() {
        let name = entry["name"].as_str().unwrap();
        let mut ne: Vec<u64> = entry["shape"].as_array().unwrap().iter().map(|size| size.as_u64().unwrap()).collect();
        ne.reverse();
        let row = out.lines().find(|line| line.starts_with(&format!("{name} "))).unwrap();
        assert!(row.contains(&format!("{ne:?}")), "{name}: {row}");
    }
    // Parameters, per-type totals and bits per weight: the report's numbers.
    let types = value["types"].as_array().unwrap();
    for ty in types {
        let expected = [
            ty["type"].as_str().unwrap().to_string(),
            ty["tensors"].to_string(),
            ty["parameters"].to_string(),
            ty["bytes"].to_string(),
        ];
        let found = out.lines().any(|line| line.split_whitespace().take(4).eq(expected.iter().map(String::as_str)));
        assert!(found, "{expected:?}: {out}");
    }
    let bits = value["bits_per_weight"].as_f64().unwrap();
    let summary = format!(
        "parameters: {}, {} bits per weight",
        value["parameters"],
        format!("{bits:.4}").trim_end_matches('0').trim_end_matches('.')
    );
    assert!(out.contains(&summary), "{summary}: {out}");
    assert!(out.trim_end().ends_with(&format!("total: {} entries, {} bytes", value["count"], value["total_bytes"])));

    // `--stats` and `--model` work without `--json`.
    let out = nnx_ok(&["inspect", text(&path), "--stats", "--model", "llama"]);
    assert!(out.contains("statistics:\n") && out.contains("\nok: "), "{out}");
    assert!(out.lines().any(|line| line.starts_with("blk.0.attn_q.weight ") && line.contains("Q4_K")), "{out}");
    assert!(out.contains("import plan into Llama (llama): valid"), "{out}");
    let plan_row = out.lines().find(|line| line.starts_with("layers.0.attn.q.weight ")).unwrap();
    assert!(
        plan_row.contains(" blk.0.attn_q.weight ") && plan_row.contains("Q4_K [") && plan_row.contains("F32 ["),
        "{plan_row}"
    );

    // A SafeTensors folder: row-major shapes, its types and parameters.
    let out = nnx_ok(&["inspect", text(&fixtures().join("gpt2-tiny/model.safetensors"))]);
    assert!(out.lines().any(|line| line.starts_with("name ") && line.contains(" shape ") && !line.contains("ggml")));
    assert!(out.lines().any(|line| line.split_whitespace().eq(["F32", "28", "136960", "547840", "32"])), "{out}");
    assert!(out.contains("parameters: 136960, 32 bits per weight"), "{out}");
}
