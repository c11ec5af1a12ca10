//! Hostile adapters: LoRA factors whose shapes, scales or patterns describe far more work than
//! the file holds, each refused before any product is computed; and adapters that must work.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::hostile_files::stride_zero_checkpoint;
use crate::util::{Bounded, fixtures, run_nnx_bounded, scratch, text};

/// The address space each run may use.
const MEMORY: u64 = 3 << 30;

/// How long a run may take.
const TIMEOUT: Duration = Duration::from_secs(60);

/// The LoRA key of the first layer's query projection, as PEFT names it.
const Q_PROJ: &str = "base_model.model.model.layers.0.self_attn.q_proj";

/// Runs `nnx` with `args` under [`MEMORY`] and [`TIMEOUT`], printing its peak memory and time
/// as `case`.
fn run(case: &str, args: &[&str]) -> Bounded {
    let start = Instant::now();
    let bounded = run_nnx_bounded(args, &[], MEMORY, TIMEOUT);
    eprintln!("{case}: peak_memory {} MiB, {:.2} s", bounded.peak_memory >> 20, start.elapsed().as_secs_f64());
    bounded
}

fn base() -> PathBuf {
    fixtures().join("models/llama3")
}

/// A SafeTensors file of F32 zeros, one entry per `(name, shape)`.
fn safetensors(entries: &[(&str, &[usize])]) -> Vec<u8> {
    let mut header = serde_json::Map::new();
    let mut offset = 0usize;
    for (name, shape) in entries {
        let bytes = shape.iter().product::<usize>() * 4;
        header.insert(
            name.to_string(),
            serde_json::json!({"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + bytes]}),
        );
        offset += bytes;
    }
    let mut header = serde_json::to_vec(&serde_json::Value::Object(header)).unwrap();
    while !header.len().is_multiple_of(8) {
        header.push(b' ');
    }
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&header);
    out.resize(out.len() + offset, 0);
    out
}

/// A PEFT adapter folder under `dir` with `config` as its `adapter_config.json` and `weights`
/// as its `adapter_model.safetensors`.
fn peft(dir: &Path, name: &str, config: &serde_json::Value, weights: &[u8]) -> PathBuf {
    let adapter = dir.join(name);
    std::fs::create_dir_all(&adapter).unwrap();
    std::fs::write(adapter.join("adapter_config.json"), serde_json::to_vec(config).unwrap()).unwrap();
    std::fs::write(adapter.join("adapter_model.safetensors"), weights).unwrap();
    adapter
}

/// A rank-1 PEFT config for `q_proj` with `extra` members on top.
fn config(extra: serde_json::Value) -> serde_json::Value {
    let mut config = serde_json::json!({
        "peft_type": "LORA",
        "r": 1,
        "lora_alpha": 8,
        "target_modules": ["q_proj"],
    });
    for (key, value) in extra.as_object().unwrap() {
        config[key] = value.clone();
    }
    config
}

/// Rank-1 factors of the right shapes for the fixture's `q_proj` ([64, 64]).
fn fitting_factors() -> Vec<u8> {
    let (a, b) = (format!("{Q_PROJ}.lora_A.weight"), format!("{Q_PROJ}.lora_B.weight"));
    safetensors(&[(&a, &[1, 64]), (&b, &[64, 1])])
}

#[test]
fn hostile_adapters_factors_for_a_huge_product_are_refused() {
    let dir = scratch();
    let (a, b) = (format!("{Q_PROJ}.lora_A.weight"), format!("{Q_PROJ}.lora_B.weight"));
    // 800 KB of factors whose product B A is [100000, 100000], 40 GB of F32.
    let weights = safetensors(&[(&a, &[1, 100_000]), (&b, &[100_000, 1])]);
    let adapter = peft(dir.path(), "huge", &config(serde_json::json!({})), &weights);
    let out = dir.path().join("merged");

    let merged = run("huge product merge", &["lora", "merge", text(&base()), text(&adapter), text(&out)]);
    merged.assert_refused("q_proj");
    assert!(merged.stderr.contains("[100000, 100000]") && merged.stderr.contains("[64, 64]"), "{}", merged.stderr);
    assert!(merged.peak_memory < 1 << 30, "{} bytes", merged.peak_memory);
    assert!(!out.join("model.safetensors").exists());

    let ran = run(
        "huge product run --lora",
        &["run", text(&base()), "--lora", text(&adapter), "--prompt", "hi", "--max-new-tokens", "1"],
    );
    ran.assert_refused("q_proj");
    assert!(ran.stderr.contains("[100000, 100000]"), "{}", ran.stderr);
    assert!(ran.peak_memory < 1 << 30, "{} bytes", ran.peak_memory);
}

#[test]
fn hostile_adapters_a_stride_zero_factor_is_refused() {
    let dir = scratch();
    let adapter = dir.path().join("stride0");
    std::fs::create_dir_all(&adapter).unwrap();
    std::fs::write(adapter.join("adapter_config.json"), serde_json::to_vec(&config(serde_json::json!({}))).unwrap())
        .unwrap();
    let name = format!("{Q_PROJ}.lora_A.weight");
    std::fs::write(adapter.join("adapter_model.bin"), stride_zero_checkpoint(&name)).unwrap();
    let out = dir.path().join("merged");

    let inspected = run("stride-0 lora inspect", &["lora", "inspect", text(&adapter)]);
    inspected.assert_refused(&name);
    let merged = run("stride-0 lora merge", &["lora", "merge", text(&base()), text(&adapter), text(&out)]);
    merged.assert_refused(&name);
    assert!(!out.join("model.safetensors").exists());
    let ran = run(
        "stride-0 run --lora",
        &["run", text(&base()), "--lora", text(&adapter), "--prompt", "hi", "--max-new-tokens", "1"],
    );
    ran.assert_refused(&name);
    for bounded in [&inspected, &merged, &ran] {
        assert!(bounded.stderr.contains("34359738368 bytes"), "{}", bounded.stderr);
        assert!(bounded.peak_memory < 1 << 30, "{} bytes", bounded.peak_memory);
    }
}

#[test]
fn hostile_adapters_bad_rank_patterns_are_refused_by_key_quickly() {
    let dir = scratch();
    let cases = [
        ("invalid rank_pattern", "q_proj(", "unclosed group"),
        ("huge rank_pattern", "((a{100}){100}){100}", "compiles to more than"),
    ];
    for (case, key, why) in cases {
        let adapter =
            peft(dir.path(), case, &config(serde_json::json!({"rank_pattern": {key: 2}})), &fitting_factors());
        let start = Instant::now();
        let inspected = run(case, &["lora", "inspect", text(&adapter)]);
        inspected.assert_refused(key);
        assert!(inspected.stderr.contains("`rank_pattern`") && inspected.stderr.contains(why), "{}", inspected.stderr);
        assert!(start.elapsed() < Duration::from_secs(60));
    }
}

#[test]
fn hostile_adapters_scales_past_f32_and_rank_zero_are_refused() {
    let dir = scratch();
    let cases = [
        ("lora_alpha 1e39", serde_json::json!({"lora_alpha": 1e39}), "`lora_alpha`"),
        ("r 0", serde_json::json!({"r": 0}), "`r`"),
    ];
    for (case, extra, named) in cases {
        let adapter = peft(dir.path(), case, &config(extra), &fitting_factors());
        let inspected = run(&format!("{case} lora inspect"), &["lora", "inspect", text(&adapter)]);
        inspected.assert_refused(named);
        let out = dir.path().join(format!("{case} merged"));
        let merged = run(&format!("{case} lora merge"), &["lora", "merge", text(&base()), text(&adapter), text(&out)]);
        merged.assert_refused(named);
        assert!(!out.join("model.safetensors").exists());
    }
}

/// A copy of the base folder's files in `dir/base`, to put links beside.
#[cfg(unix)]
fn base_copy(dir: &Path) -> PathBuf {
    let folder = dir.join("base");
    std::fs::create_dir_all(&folder).unwrap();
    for name in
        ["config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]
    {
        std::fs::copy(base().join(name), folder.join(name)).unwrap();
    }
    folder
}

#[cfg(unix)]
#[test]
fn hostile_adapters_a_link_out_of_the_base_folder_is_not_copied() {
    let elsewhere = scratch();
    let secret = elsewhere.path().join("secret.txt");
    std::fs::write(&secret, "not the model's").unwrap();
    let dir = scratch();
    let folder = base_copy(dir.path());
    std::os::unix::fs::symlink(&secret, folder.join("notes.txt")).unwrap();
    let adapter = peft(dir.path(), "adapter", &config(serde_json::json!({})), &fitting_factors());
    let out = dir.path().join("merged");

    let merged = run("link out of the base", &["lora", "merge", text(&folder), text(&adapter), text(&out)]);
    if merged.code == Some(1) {
        merged.assert_refused("notes.txt");
        assert!(merged.stderr.contains("outside the base folder"), "{}", merged.stderr);
        assert!(!out.join("model.safetensors").exists());
    } else {
        assert_eq!(merged.code, Some(0), "{}", merged.stderr);
    }
    // Whatever the outcome, no regular file of the output holds the target's contents.
    if out.exists() {
        for entry in std::fs::read_dir(&out).unwrap() {
            let path = entry.unwrap().path();
            let kind = std::fs::symlink_metadata(&path).unwrap().file_type();
            if kind.is_file() {
                assert_ne!(
                    std::fs::read(&path).unwrap(),
                    b"not the model's",
                    "{} copies the link's target",
                    path.display()
                );
            }
        }
    }
}

#[cfg(unix)]
#[test]
fn hostile_adapters_a_relative_link_inside_the_base_folder_stays_a_link() {
    let dir = scratch();
    let folder = base_copy(dir.path());
    std::os::unix::fs::symlink("tokenizer_config.json", folder.join("alias.json")).unwrap();
    let adapter = peft(dir.path(), "adapter", &config(serde_json::json!({})), &fitting_factors());
    let out = dir.path().join("merged");

    let merged = run("link inside the base", &["lora", "merge", text(&folder), text(&adapter), text(&out)]);
    assert_eq!(merged.code, Some(0), "{}", merged.stderr);
    assert!(out.join("model.safetensors").is_file());
    assert!(std::fs::symlink_metadata(out.join("tokenizer_config.json")).unwrap().file_type().is_file());
    let link = out.join("alias.json");
    assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink());
    assert_eq!(std::fs::read_link(&link).unwrap(), Path::new("tokenizer_config.json"));
}
