//! The `nnx` command line: `inspect` as a table and as JSON, and one-line errors with exit
//! status 1 on bad input.

use crate::util::{fixtures, run_nnx as nnx, scratch};

#[test]
fn inspect_lists_entries_metadata_and_totals() {
    let path = fixtures().join("gpt2-tiny/model.safetensors");
    let (code, out, _) = nnx(&["inspect", path.to_str().unwrap()]);
    assert_eq!(code, 0);
    assert!(out.contains("28 entries"), "{out}");
    assert!(out.contains("format = pt"), "{out}");
    assert!(
        out.lines().any(|line| line.starts_with("transformer.wte.weight")
            && line.contains("F32")
            && line.contains("[512, 64]")
            && line.contains("131072")),
        "{out}"
    );
    assert!(out.trim_end().ends_with("total: 28 entries, 547840 bytes"), "{out}");
}

#[test]
fn inspect_json_is_one_parseable_object() {
    let path = fixtures().join("seedlm/shard");
    let (code, out, _) = nnx(&["inspect", path.to_str().unwrap(), "--json"]);
    assert_eq!(code, 0);
    let value: serde_json::Value = serde_json::from_str(&out).unwrap();
    let entries = value["entries"].as_array().unwrap();
    assert_eq!(value["count"], entries.len());
    let total: u64 = entries.iter().map(|entry| entry["bytes"].as_u64().unwrap()).sum();
    assert_eq!(value["total_bytes"], total);
    assert!(entries.iter().all(|entry| entry["file"].as_str().unwrap().ends_with("model-00001-of-00001.safetensors")));
    assert!(entries.iter().all(|entry| entry["data_offsets"].as_array().unwrap().len() == 2));
}

#[test]
fn bad_input_gets_one_line_and_status_one() {
    let dir = scratch();
    let truncated = dir.path().join("truncated.safetensors");
    let full = std::fs::read(fixtures().join("gpt2-tiny/model.safetensors")).unwrap();
    std::fs::write(&truncated, &full[..full.len() / 2]).unwrap();
    let misnamed = dir.path().join("state_zip.safetensors");
    std::fs::copy(fixtures().join("torch/state_zip.pt"), &misnamed).unwrap();
    let empty = scratch();
    let cases = [
        (truncated.to_str().unwrap().to_string(), "truncated"),
        (misnamed.to_str().unwrap().to_string(), "PyTorch checkpoint"),
        (dir.path().join("absent.safetensors").to_str().unwrap().to_string(), "cannot open"),
        (empty.path().to_str().unwrap().to_string(), "holds no `model.safetensors`"),
    ];
    for (path, words) in cases {
        let (code, out, err) = nnx(&["inspect", &path]);
        assert_eq!(code, 1, "{path}: {err}");
        assert!(out.is_empty());
        assert_eq!(err.lines().count(), 1, "one line: {err}");
        assert!(err.starts_with("error: ") && err.contains(words), "{err}");
    }
    let (code, _, err) = nnx(&["inspect"]);
    assert_eq!(code, 1, "{err}");
    let (code, _, _) = nnx(&["frobnicate"]);
    assert_eq!(code, 1);
}
