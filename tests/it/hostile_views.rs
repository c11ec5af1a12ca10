//! Hostile views: tensors repeated by zero strides and other small files that describe huge
//! materialized tensors, on every command that materializes a view; report arithmetic over
//! hostile shapes, counts and keys; configurations far larger than any model's; and a GGUF file
//! of mostly metadata converted with little memory. Each runs the `nnx` binary in a child
//! process under an address-space limit and a timeout, and prints the peak memory it reached.

use std::path::{Path, PathBuf};
use std::time::Duration;

use nnx::gguf::{Array, GgufWriter, Value as GgufValue};
use serde_json::Value;

use crate::hostile_files::{safetensors, stored_zip, stride_zero_checkpoint, string};
use crate::util::{Bounded, run_nnx_bounded, scratch, text};

/// The address space each run may use.
const MEMORY: u64 = 3 << 30;

/// How long a run may take.
const TIMEOUT: Duration = Duration::from_secs(60);

/// Runs `nnx` with `args` under [`MEMORY`] and [`TIMEOUT`], printing its peak memory and time
/// as `case`.
fn run(case: &str, args: &[&str]) -> Bounded {
    let started = std::time::Instant::now();
    let bounded = run_nnx_bounded(args, &[], MEMORY, TIMEOUT);
    eprintln!("{case}: peak_memory {} MiB, {:.1} s", bounded.peak_memory >> 20, started.elapsed().as_secs_f64());
    bounded
}

/// Asserts a run that succeeded, showing its stderr otherwise.
fn assert_ok(bounded: &Bounded, case: &str) {
    assert!(!bounded.timed_out, "{case}: ran past its timeout:\n{}", bounded.stderr);
    assert_eq!(bounded.code, Some(0), "{case}:\n{}", bounded.stderr);
    assert!(!bounded.stderr.contains("panicked"), "{case}:\n{}", bounded.stderr);
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

/// One tensor of a hand-written `torch.save` checkpoint: a view of shape `shape` and strides
/// `strides` over a storage of F32 `values`.
struct View<'a> {
    name: &'a str,
    shape: &'a [u64],
    strides: &'a [u64],
    values: &'a [f32],
}

/// A tuple of integers, each as an 8-byte `LONG1`.
fn tuple(items: &[u64]) -> Vec<u8> {
    let mut bytes = vec![b'('];
    for &item in items {
        bytes.extend_from_slice(b"\x8a\x08");
        bytes.extend_from_slice(&item.to_le_bytes());
    }
    bytes.push(b't');
    bytes
}

/// A `torch.save` zip of `views`, each over its own storage, as `torch.save` writes a dict.
fn checkpoint(views: &[View<'_>]) -> Vec<u8> {
    let mut pickle = b"\x80\x02}(".to_vec();
    let mut records: Vec<(String, Vec<u8>)> = Vec::new();
    for (at, view) in views.iter().enumerate() {
        let key = at.to_string();
        pickle.extend(string(view.name));
        pickle.extend_from_slice(b"ctorch._utils\n_rebuild_tensor_v2\n(");
        pickle.push(b'(');
        pickle.extend(string("storage"));
        pickle.extend_from_slice(b"ctorch\nFloatStorage\n");
        pickle.extend(string(&key));
        pickle.extend(string("cpu"));
        pickle.extend_from_slice(b"\x8a\x08");
        pickle.extend_from_slice(&(view.values.len() as u64).to_le_bytes());
        pickle.extend_from_slice(b"tQK\x00");
        pickle.extend(tuple(view.shape));
        pickle.extend(tuple(view.strides));
        pickle.extend_from_slice(b"\x89ccollections\nOrderedDict\n)RtR");
        let data: Vec<u8> = view.values.iter().flat_map(|value| value.to_le_bytes()).collect();
        records.push((format!("archive/data/{key}"), data));
    }
    pickle.extend_from_slice(b"u.");
    let mut all: Vec<(&str, &[u8])> = vec![("archive/data.pkl", &pickle), ("archive/byteorder", b"little")];
    all.extend(records.iter().map(|(name, data)| (name.as_str(), data.as_slice())));
    stored_zip(&all)
}

/// A SafeTensors file of F32 entries, each `(name, shape, values)`.
fn safetensors_of(entries: &[(&str, &[usize], &[f32])]) -> Vec<u8> {
    let mut header = serde_json::Map::new();
    let mut data = Vec::new();
    for (name, shape, values) in entries {
        let start = data.len();
        data.extend(values.iter().flat_map(|value| value.to_le_bytes()));
        header.insert(
            name.to_string(),
            serde_json::json!({ "dtype": "F32", "shape": shape, "data_offsets": [start, data.len()] }),
        );
    }
    let header = Value::Object(header).to_string();
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend_from_slice(&data);
    bytes
}

/// A transformers Llama `config.json` of `layers` blocks with tied embeddings.
fn llama_config(layers: usize) -> String {
    serde_json::json!({
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": 64,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": true,
    })
    .to_string()
}

#[test]
fn hostile_views_stats_of_a_stride_zero_view_count_its_repeats_without_materializing() {
    let dir = scratch();
    let path = write(dir.path(), "bomb.pt", &stride_zero_checkpoint("w"));

    let table = run("stride-0 stats", &["stats", text(&path)]);
    assert_ok(&table, "stats");
    assert!(table.stdout.contains("total: 1 tensors, 8589934592 values"), "{}", table.stdout);
    assert!(table.peak_memory < 256 << 20, "{} bytes", table.peak_memory);

    let json = run("stride-0 stats --json", &["stats", "--json", text(&path)]);
    assert_ok(&json, "stats --json");
    let value: Value = serde_json::from_str(&json.stdout).unwrap();
    let stats = &value["tensors"][0];
    assert_eq!(stats["name"], "w");
    assert_eq!(stats["count"], 1u64 << 33);
    assert_eq!(
        (stats["min"].as_f64(), stats["max"].as_f64(), stats["mean"].as_f64()),
        (Some(1.0), Some(1.0), Some(1.0))
    );
    assert_eq!(stats["std"].as_f64(), Some(0.0));
    assert_eq!(stats["histogram"][0], 1u64 << 33);

    let out = dir.path().join("page.html");
    let page = run("stride-0 inspect --html --stats", &["inspect", text(&path), "--html", text(&out), "--stats"]);
    assert_ok(&page, "inspect --html --stats");
    assert!(out.is_file());
    let report = run("stride-0 inspect --json --stats", &["inspect", text(&path), "--json", "--stats"]);
    assert_ok(&report, "inspect --json --stats");
    let value: Value = serde_json::from_str(&report.stdout).unwrap();
    assert_eq!(value["stats"][0]["count"], 1u64 << 33);
}

#[test]
fn hostile_views_stats_of_a_strided_view_match_its_values() {
    // A transpose and a broadcast of a small storage: the walk in pieces gives what the values
    // are, as a contiguous copy would.
    let values: Vec<f32> = (0..6).map(|v| v as f32).collect();
    let dir = scratch();
    let path = write(
        dir.path(),
        "views.pt",
        &checkpoint(&[
            View { name: "t", shape: &[3, 2], strides: &[1, 3], values: &values },
            View { name: "b", shape: &[4, 3], strides: &[0, 1], values: &values[..3] },
        ]),
    );
    let json = run("strided stats", &["stats", "--json", text(&path)]);
    assert_ok(&json, "stats");
    let value: Value = serde_json::from_str(&json.stdout).unwrap();
    let tensors = value["tensors"].as_array().unwrap();
    let find = |name: &str| tensors.iter().find(|stats| stats["name"] == name).unwrap();
    let t = find("t");
    assert_eq!((t["count"].as_u64(), t["mean"].as_f64(), t["max"].as_f64()), (Some(6), Some(2.5), Some(5.0)));
    let b = find("b");
    assert_eq!(
        (b["count"].as_u64(), b["mean"].as_f64(), b["zero_fraction"].as_f64()),
        (Some(12), Some(1.0), Some(1.0 / 3.0))
    );
    let expected_std = (2.0f64 / 3.0).sqrt();
    assert!((b["std"].as_f64().unwrap() - expected_std).abs() < 1e-12, "{}", b["std"]);
}

#[test]
fn hostile_views_stats_of_overlapping_strides_are_refused_by_name() {
    // [2^16, 2^16] with strides [1, 1] over 2^17 values: 2^32 values that overlap, no axis of
    // stride 0 to count once.
    let storage = vec![0.5f32; 1 << 17];
    let dir = scratch();
    let path = write(
        dir.path(),
        "overlap.pt",
        &checkpoint(&[View { name: "w", shape: &[1 << 16, 1 << 16], strides: &[1, 1], values: &storage }]),
    );
    let refused = run("overlapping stats", &["stats", text(&path)]);
    refused.assert_refused(text(&path));
    assert!(refused.stderr.contains("`w`") && refused.stderr.contains("17179869184 bytes"), "{}", refused.stderr);
    let inspected = run("overlapping inspect --json --stats", &["inspect", text(&path), "--json", "--stats"]);
    inspected.assert_refused(text(&path));
}

#[test]
fn hostile_views_stats_of_nan_and_infinity_only_tensors_are_reported() {
    let dir = scratch();
    let path = write(
        dir.path(),
        "nan.safetensors",
        &safetensors_of(&[
            ("nan", &[2], &[f32::NAN, f32::NAN]),
            ("inf", &[2], &[f32::INFINITY, f32::NEG_INFINITY]),
            ("huge", &[2], &[f32::MAX, -f32::MAX]),
        ]),
    );
    let json = run("nan stats", &["stats", "--json", text(&path)]);
    assert_ok(&json, "stats");
    let value: Value = serde_json::from_str(&json.stdout).unwrap();
    let tensors = value["tensors"].as_array().unwrap();
    let find = |name: &str| tensors.iter().find(|stats| stats["name"] == name).unwrap();
    assert_eq!((find("nan")["nans"].as_u64(), find("nan")["min"].as_f64()), (Some(2), None));
    assert_eq!(find("inf")["infs"], 2);
    assert_eq!(find("huge")["absmax"].as_f64().map(|value| value as f32), Some(f32::MAX));
    let table = run("nan stats table", &["stats", text(&path)]);
    assert_ok(&table, "stats table");
    let checked = run("nan stats --check", &["stats", "--check", text(&path)]);
    assert_eq!(checked.code, Some(1), "{}", checked.stderr);
    assert!(checked.stdout.contains("check: `nan`: 2 NaN, 0 infinite"), "{}", checked.stdout);
    let page = run("nan inspect --json --stats", &["inspect", text(&path), "--json", "--stats"]);
    assert_ok(&page, "inspect");
}

#[test]
fn hostile_views_convert_of_a_folder_with_a_stride_zero_view_to_gguf_is_refused() {
    let dir = scratch();
    let folder = dir.path().join("llama");
    std::fs::create_dir(&folder).unwrap();
    std::fs::write(folder.join("config.json"), llama_config(0)).unwrap();
    // The embedding repeats one value into 2^31 (8 GiB); the norm is honest.
    let weights = checkpoint(&[
        View { name: "model.embed_tokens.weight", shape: &[1 << 16, 1 << 15], strides: &[0, 0], values: &[1.0] },
        View { name: "model.norm.weight", shape: &[32], strides: &[1], values: &[1.0; 32] },
    ]);
    let bin = write(&folder, "pytorch_model.bin", &weights);
    assert!(std::fs::metadata(&bin).unwrap().len() < 4 << 10);
    let out = dir.path().join("out.gguf");
    let refused = run("stride-0 folder convert to gguf", &["convert", text(&folder), text(&out)]);
    refused.assert_refused(text(&bin));
    assert!(refused.stderr.contains("`model.embed_tokens.weight`"), "{}", refused.stderr);
    assert!(refused.stderr.contains("8589934592 bytes"), "{}", refused.stderr);
    assert!(!out.exists());

    // The query projection, which the export permutes: refused the same way.
    std::fs::write(folder.join("config.json"), llama_config(1)).unwrap();
    let honest = |name: &'static str, shape: &'static [u64]| {
        let count = shape.iter().product::<u64>() as usize;
        (name, shape, count)
    };
    let parts = [
        honest("model.embed_tokens.weight", &[64, 32]),
        honest("model.norm.weight", &[32]),
        honest("model.layers.0.input_layernorm.weight", &[32]),
        honest("model.layers.0.post_attention_layernorm.weight", &[32]),
        honest("model.layers.0.mlp.down_proj.weight", &[32, 64]),
        honest("model.layers.0.mlp.gate_proj.weight", &[64, 32]),
        honest("model.layers.0.mlp.up_proj.weight", &[64, 32]),
        honest("model.layers.0.self_attn.k_proj.weight", &[16, 32]),
        honest("model.layers.0.self_attn.o_proj.weight", &[32, 32]),
        honest("model.layers.0.self_attn.v_proj.weight", &[16, 32]),
    ];
    let storage = vec![0.25f32; 64 * 64];
    let strides: Vec<Vec<u64>> = parts
        .iter()
        .map(|(_, shape, _)| match shape.len() {
            1 => vec![1],
            _ => vec![shape[1], 1],
        })
        .collect();
    let mut views: Vec<View<'_>> = parts
        .iter()
        .zip(&strides)
        .map(|((name, shape, count), strides)| View {
            name,
            shape,
            strides: strides.as_slice(),
            values: &storage[..*count],
        })
        .collect();
    views.push(View {
        name: "model.layers.0.self_attn.q_proj.weight",
        shape: &[1 << 16, 1 << 15],
        strides: &[0, 0],
        values: &[1.0],
    });
    let bin = write(&folder, "pytorch_model.bin", &checkpoint(&views));
    let refused = run("stride-0 q_proj convert to gguf", &["convert", text(&folder), text(&out), "--type", "q8_0"]);
    refused.assert_refused(text(&bin));
    assert!(refused.stderr.contains("`model.layers.0.self_attn.q_proj.weight`"), "{}", refused.stderr);
    assert!(!out.exists());

    // With an honest query projection the folder converts.
    views.pop();
    let q_strides = [32u64, 1];
    views.push(View {
        name: "model.layers.0.self_attn.q_proj.weight",
        shape: &[32, 32],
        strides: &q_strides,
        values: &storage[..1024],
    });
    write(&folder, "pytorch_model.bin", &checkpoint(&views));
    let converted = run("honest folder convert to gguf", &["convert", text(&folder), text(&out)]);
    assert_ok(&converted, "convert");
    assert!(converted.stdout.contains("converted 11 tensors"), "{}", converted.stdout);
}

#[test]
fn hostile_views_convert_of_a_stride_zero_view_to_gguf_and_diff_are_refused() {
    let dir = scratch();
    let path = write(dir.path(), "bomb.pt", &stride_zero_checkpoint("w"));
    let out = dir.path().join("out.gguf");
    for ty in ["f16", "f32", "q8_0"] {
        let refused =
            run(&format!("stride-0 convert to gguf --type {ty}"), &["convert", text(&path), text(&out), "--type", ty]);
        refused.assert_refused(text(&path));
        assert!(refused.stderr.contains("`w`") && refused.stderr.contains("34359738368 bytes"), "{}", refused.stderr);
        assert!(!out.exists());
    }
    let other = write(dir.path(), "other.pt", &stride_zero_checkpoint("w"));
    // `diff` exits 2 on error, as `diff` does; otherwise its refusal is every command's.
    for args in [vec!["diff"], vec!["diff", "--json"]] {
        let mut args = args;
        args.extend([text(&path), text(&other)]);
        let diffed = run(&format!("stride-0 {}", args[..args.len() - 2].join(" ")), &args);
        assert!(!diffed.timed_out && diffed.code == Some(2), "{:?}: {}", diffed.code, diffed.stderr);
        let errors: Vec<&str> = diffed.stderr.lines().filter(|line| line.starts_with("error:")).collect();
        assert_eq!(errors.len(), 1, "{}", diffed.stderr);
        assert!(errors[0].contains(text(&path)) && errors[0].contains("`w`"), "{}", errors[0]);
    }
}

#[test]
fn hostile_views_quantize_and_dequantize_of_a_stride_zero_view_are_refused() {
    let dir = scratch();
    let path = write(
        dir.path(),
        "bomb.pt",
        &checkpoint(&[View { name: "a.weight", shape: &[1 << 16, 1 << 16], strides: &[0, 0], values: &[1.0] }]),
    );
    let out = dir.path().join("out.safetensors");
    let quantized = run("stride-0 quantize", &["quantize", text(&path), text(&out), "--encoding", "q4"]);
    quantized.assert_refused(text(&path));
    assert!(!out.exists());
    let dequantized = run("stride-0 dequantize", &["dequantize", text(&path), text(&out)]);
    dequantized.assert_refused(text(&path));
    assert!(!out.exists());
}

#[test]
fn hostile_views_report_totals_of_huge_views_saturate() {
    // Sixteen views of 2^60 bytes each (the most bits a shape may describe): their sum passes
    // `u64::MAX`.
    let dir = scratch();
    let names: Vec<String> = (0..16).map(|at| format!("model.layers.{at}.mlp.up_proj.weight")).collect();
    let views: Vec<View<'_>> =
        names.iter().map(|name| View { name, shape: &[1 << 29, 1 << 29], strides: &[0, 0], values: &[1.0] }).collect();
    let path = write(dir.path(), "huge.pt", &checkpoint(&views));
    let table = run("huge views inspect", &["inspect", text(&path)]);
    assert_ok(&table, "inspect");
    assert!(table.stdout.contains(&format!("total: 16 entries, {} bytes", u64::MAX)), "{}", table.stdout);
    let json = run("huge views inspect --json --stats", &["inspect", text(&path), "--json", "--stats"]);
    assert_ok(&json, "inspect --json --stats");
    let value: Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(value["total_bytes"], u64::MAX);
    assert_eq!(value["parameters"], 1u64 << 62);
    assert_eq!(value["stats"][0]["count"], 1u64 << 58);
    let stats = run("huge views stats", &["stats", text(&path)]);
    assert_ok(&stats, "stats");
    assert!(stats.stdout.contains(&format!("total: 16 tensors, {} values", 1u64 << 62)), "{}", stats.stdout);
    let page_path = dir.path().join("huge.html");
    let page = run("huge views inspect --html", &["inspect", text(&path), "--html", text(&page_path), "--stats"]);
    assert_ok(&page, "inspect --html");
}

#[test]
fn hostile_views_report_of_hostile_names_and_gguf_keys_does_not_overflow() {
    let dir = scratch();
    // A block index of `usize::MAX`, a name of control characters and a 100,000-part name.
    let deep = vec!["a"; 100_000].join(".");
    let last = format!("model.layers.{}.mlp.up_proj.weight", usize::MAX);
    let path = write(
        dir.path(),
        "names.safetensors",
        &safetensors_of(&[
            (&last, &[1], &[1.0]),
            ("model.layers.0.mlp.up_proj.weight", &[1], &[1.0]),
            ("bell\u{7}\u{1b}[2J.weight", &[1], &[1.0]),
            (&deep, &[1], &[1.0]),
        ]),
    );
    let json = run("hostile names inspect --json", &["inspect", text(&path), "--json", "--stats"]);
    assert_ok(&json, "inspect --json");
    assert!(!json.stdout.contains('\u{1b}') && !json.stdout.contains('\u{7}'), "raw control characters");
    let value: Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(value["quant_map"]["layers"], u64::MAX);
    let table = run("hostile names inspect", &["inspect", text(&path)]);
    assert_ok(&table, "inspect");
    assert!(!table.stdout.contains('\u{1b}'), "raw control characters");

    // GGUF keys that multiply past `u64::MAX` in the memory plan.
    let mut writer = GgufWriter::new();
    let metadata = writer.metadata_mut();
    metadata.set("general.architecture", GgufValue::String("llama".into()));
    for key in ["block_count", "attention.head_count", "embedding_length", "context_length", "attention.key_length"] {
        metadata.set(format!("llama.{key}"), GgufValue::U64(u64::MAX));
    }
    let weight = nnx::Tensor::from_vec(vec![1.0f32; 32], &[32]).unwrap();
    writer.add_tensor("blk.0.attn_norm.weight", &weight).unwrap();
    let gguf = dir.path().join("keys.gguf");
    writer.write(&gguf).unwrap();
    let json = run("hostile gguf keys inspect --json", &["inspect", text(&gguf), "--json", "--ctx", "4096"]);
    assert_ok(&json, "inspect --json");
    let value: Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(value["memory"]["total_bytes"], u64::MAX);
}

#[test]
fn hostile_views_configs_far_larger_than_any_are_left_out_of_the_report() {
    let dir = scratch();
    std::fs::write(dir.path().join("model.safetensors"), safetensors("", "w")).unwrap();
    // 17 MiB of spaces around an object: past the size limit of configurations.
    let mut huge = vec![b' '; 17 << 20];
    huge.extend_from_slice(b"{}");
    std::fs::write(dir.path().join("config.json"), &huge).unwrap();
    std::fs::write(dir.path().join("tokenizer_config.json"), &huge).unwrap();
    drop(huge);
    let out = dir.path().join("page.html");
    let page = run("huge configs inspect --html", &["inspect", text(dir.path()), "--html", text(&out)]);
    assert_ok(&page, "inspect --html");
    assert!(page.peak_memory < 256 << 20, "{} bytes", page.peak_memory);
    let json = run("huge configs inspect --json", &["inspect", text(dir.path()), "--json"]);
    assert_ok(&json, "inspect --json");
    let value: Value = serde_json::from_str(&json.stdout).unwrap();
    let findings = value["validation"].to_string();
    assert!(findings.contains("config.json") && findings.contains("16777216-byte limit"), "{findings}");
    assert!(findings.contains("tokenizer_config.json"), "{findings}");

    // Under the limit, millions of tiny values: summarised, not built whole.
    let zeros = "0,".repeat(3_500_000);
    let config = format!(
        r#"{{"model_type":"llama","num_hidden_layers":2,"num_attention_heads":4,"hidden_size":32,"a":[{zeros}0],"b":{{"c":[[{zeros}0]]}}}}"#
    );
    std::fs::write(dir.path().join("config.json"), &config).unwrap();
    let template = format!(r#"{{"added_tokens_decoder":[{zeros}0],"chat_template":"{{{{ messages }}}}"}}"#);
    std::fs::write(dir.path().join("tokenizer_config.json"), &template).unwrap();
    let json = run("tiny-value configs inspect --json", &["inspect", text(dir.path()), "--json"]);
    assert_ok(&json, "inspect --json");
    assert!(json.peak_memory < 256 << 20, "{} bytes", json.peak_memory);
    let value: Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(value["chat_template"], "{{ messages }}");
    assert_eq!(value["memory"]["layers"], 2);
    let rows = value["metadata"].as_array().unwrap();
    let a = rows.iter().find(|row| row["key"] == "config.json: a").unwrap();
    assert_eq!((a["length"].as_u64(), a["folded"].as_bool()), (Some(3_500_001), Some(true)));
    assert_eq!(a["value"].as_array().unwrap().len(), 64);
}

/// A GGUF file whose metadata is one array of `count` strings of 100 bytes, with one tensor.
fn metadata_heavy_gguf(path: &Path, count: usize) -> u64 {
    let mut writer = GgufWriter::new();
    let metadata = writer.metadata_mut();
    metadata.set("general.architecture", GgufValue::String("llama".into()));
    let strings: Vec<String> = (0..count).map(|at| format!("{at:0100}")).collect();
    metadata.set("nnx.test.strings", GgufValue::Array(Array::String(strings)));
    let weight = nnx::Tensor::from_vec((0..4096).map(|v| v as f32 / 4096.0).collect::<Vec<_>>(), &[16, 256]).unwrap();
    writer.add_tensor("blk.0.ffn_up.weight", &weight).unwrap();
    writer.write(path).unwrap();
    std::fs::metadata(path).unwrap().len()
}

#[test]
fn hostile_views_convert_of_a_metadata_heavy_gguf_copies_the_metadata_once() {
    let dir = scratch();
    let path = dir.path().join("heavy.gguf");
    let bytes = metadata_heavy_gguf(&path, 300_000);
    assert!((30 << 20..40 << 20).contains(&bytes), "{bytes} bytes");
    // Opening the file (what `inspect` does) is the baseline: reading its metadata costs what
    // it costs; converting it may add one copy and the header written from it.
    let opened = run("metadata-heavy gguf inspect", &["inspect", text(&path)]);
    assert_ok(&opened, "inspect");
    let out = dir.path().join("out.gguf");
    let converted =
        run("metadata-heavy gguf convert --type q8_0", &["convert", text(&path), text(&out), "--type", "q8_0"]);
    assert_ok(&converted, "convert");
    let growth = converted.peak_memory.saturating_sub(opened.peak_memory);
    eprintln!("metadata {} MiB: converting takes {} MiB more than opening", bytes >> 20, growth >> 20);
    assert!(growth < 3 * bytes, "converting took {growth} bytes more than opening, for {bytes} bytes of metadata");
    let archive = nnx::Archive::open(&out).unwrap();
    let strings = archive.gguf_metadata().unwrap().get("nnx.test.strings").unwrap().as_array().unwrap().len();
    assert_eq!(strings, 300_000);
    assert_eq!(archive.ggml_type("blk.0.ffn_up.weight"), Some(nnx::quant::ggml::GgmlType::Q8_0));
}
