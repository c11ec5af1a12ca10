//! `nnx convert` and `nnx diff`: PyTorch checkpoints converted to SafeTensors that the reference
//! Python `safetensors` package reads with the values PyTorch wrote, dtype casts that leave
//! integers alone, sharded and page-aligned outputs, selections, and `diff` across formats with
//! each kind of difference and its exit status.

use std::path::{Path, PathBuf};
use std::process::Command;

use half::bf16;
use nnx::{Archive, DType, Tensor};
use serde_json::Value;

use crate::util::{cache_dir, fixtures, run_nnx as nnx, scratch, text};

fn torch_fixture(name: &str) -> PathBuf {
    fixtures().join("torch").join(name)
}

/// Runs `nnx convert IN OUT EXTRA...`, which must succeed quietly (stderr is not a terminal, so
/// no progress bar is drawn).
fn convert(input: &Path, output: &Path, extra: &[&str]) {
    let mut args = vec!["convert", text(input), text(output)];
    args.extend_from_slice(extra);
    let (code, out, err) = nnx(&args);
    assert_eq!(code, 0, "convert {args:?}: {err}");
    assert!(err.is_empty(), "nothing on stderr off a terminal: {err}");
    assert!(out.starts_with("converted "), "{out}");
}

/// The interpreter of the cross-implementation tests: `NNX_PYTHON`, else the venv under the
/// cache folder, else `python3`. It must import `safetensors`, `numpy` and `ml_dtypes`.
fn python() -> String {
    if let Ok(python) = std::env::var("NNX_PYTHON") {
        return python;
    }
    let python = cache_dir().join("venv").join("bin").join("python");
    if python.is_file() { python.display().to_string() } else { "python3".into() }
}

/// Reads a `.safetensors` file with `safetensors.numpy`: metadata, and per tensor its numpy
/// dtype name, shape and values (floats widened to float64, bools as 0 and 1).
const READ: &str = r#"
import json, sys
import numpy as np
import ml_dtypes
from safetensors import safe_open
from safetensors.numpy import load_file

path = sys.argv[1]
tensors = {}
for name, arr in load_file(path).items():
    flat = arr.reshape(-1)
    if arr.dtype == np.bool_:
        values = flat.astype(np.int64).tolist()
    elif arr.dtype.kind == "f" or arr.dtype.name == "bfloat16":
        values = flat.astype(np.float64).tolist()
    else:
        values = flat.tolist()
    tensors[name] = {"dtype": arr.dtype.name, "shape": list(arr.shape), "values": values}
with safe_open(path, framework="np") as f:
    metadata = f.metadata() or {}
print(json.dumps({"metadata": metadata, "tensors": tensors}))
"#;

fn read_in_python(path: &Path) -> Value {
    let python = python();
    let output = Command::new(&python).arg("-c").arg(READ).arg(path).output().unwrap_or_else(|error| {
        panic!("`{python}` cannot be run ({error}): run `scripts/setup.sh`, or set NNX_PYTHON to a Python with safetensors, numpy and ml_dtypes")
    });
    assert!(
        output.status.success(),
        "python could not read `{}` (it needs safetensors, numpy and ml_dtypes; see `scripts/setup.sh`):\n{}",
        path.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("the script prints JSON")
}

fn expected() -> serde_json::Map<String, Value> {
    let text = std::fs::read_to_string(torch_fixture("expected.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// Whether `found` (an element of a numpy `dtype` array, widened to f64) is the value `wanted`
/// that `expected.json` writes in decimal; F64 values are written rounded to F32 precision.
/// Both sides pass through decimal JSON, so floats are compared once rounded to F32.
fn same_value(dtype: &str, found: f64, wanted: f64) -> bool {
    match dtype {
        "float64" | "float32" => found as f32 == wanted as f32,
        "float16" => found as f32 == f32::from(half::f16::from_f64(wanted)),
        "bfloat16" => found as f32 == f32::from(bf16::from_f64(wanted)),
        _ => found == wanted,
    }
}

/// Checks what Python reads in `path` against `expected.json`, names under `prefix`.
fn check_in_python(path: &Path, prefix: &str) -> Value {
    let read = read_in_python(path);
    let tensors = read["tensors"].as_object().unwrap();
    let expected = expected();
    let mut names: Vec<&String> = tensors.keys().collect();
    names.sort();
    let mut wanted_names: Vec<String> = expected.keys().map(|name| format!("{prefix}{name}")).collect();
    wanted_names.sort();
    assert_eq!(names, wanted_names.iter().collect::<Vec<_>>(), "{}: every tensor and nothing else", path.display());
    for (name, entry) in &expected {
        let full = format!("{prefix}{name}");
        let found = &tensors[&full];
        let dtype = entry["dtype"].as_str().unwrap();
        assert_eq!(found["dtype"], dtype, "`{full}`");
        assert_eq!(found["shape"], entry["shape"], "`{full}`");
        let found: Vec<f64> = serde_json::from_value(found["values"].clone()).unwrap();
        let wanted: Vec<f64> = serde_json::from_value(entry["values"].clone()).unwrap();
        assert_eq!(found.len(), wanted.len(), "`{full}`");
        for (at, (&found, &wanted)) in found.iter().zip(&wanted).enumerate() {
            assert!(same_value(dtype, found, wanted), "`{full}`[{at}]: python reads {found}, PyTorch wrote {wanted}");
        }
    }
    read
}

#[test]
fn converted_checkpoints_read_in_python_as_pytorch_wrote_them() {
    let dir = scratch();
    for (name, prefix) in [("state_zip.pt", ""), ("state_legacy.pt", ""), ("nested_zip.pt", "model.")] {
        let output = dir.path().join(name.replace(".pt", ".safetensors"));
        convert(&torch_fixture(name), &output, &[]);
        let read = check_in_python(&output, prefix);
        assert_eq!(read["metadata"]["format"], "pt", "{name}");
        if name == "nested_zip.pt" {
            // The checkpoint's plain values travel as metadata.
            assert_eq!(read["metadata"]["epoch"], "3");
            assert_eq!(read["metadata"]["name"], "run-1");
        }
    }
}

#[test]
fn dtype_casts_float_entries_and_leaves_integers_and_bools_alone() {
    let dir = scratch();
    let input = torch_fixture("state_zip.pt");
    let output = dir.path().join("bf16.safetensors");
    convert(&input, &output, &["--dtype", "bf16"]);
    let original = Archive::open(&input).unwrap();
    let converted = Archive::open(&output).unwrap();
    assert_eq!(converted.names().collect::<Vec<_>>(), original.names().collect::<Vec<_>>());
    let mut floats = 0;
    for name in original.names() {
        let before = original.try_get(name).unwrap();
        let after = converted.try_get(name).unwrap();
        assert_eq!(after.shape(), before.shape(), "`{name}`");
        if before.dtype().is_castable_float() {
            floats += 1;
            assert_eq!(after.dtype(), DType::BF16, "`{name}` is cast");
            let wanted = before.to_dtype(DType::BF16).unwrap().to_vec::<bf16>().unwrap();
            assert_eq!(after.to_vec::<bf16>().unwrap(), wanted, "`{name}`");
        } else {
            assert_eq!(after.dtype(), before.dtype(), "`{name}` is not cast");
            assert_eq!(after.to_bytes().unwrap(), before.contiguous().to_bytes().unwrap(), "`{name}`");
        }
    }
    assert!(floats > 0 && floats < original.len(), "the fixture holds floats and integers");
    // Python sees bfloat16 for the floats and the integer dtypes unchanged.
    let read = read_in_python(&output);
    assert_eq!(read["tensors"]["steps"]["dtype"], "int64");
    assert_eq!(read["tensors"]["mask"]["dtype"], "bool");
    assert_eq!(read["tensors"]["f64"]["dtype"], "bfloat16");
}

#[test]
fn max_shard_size_writes_a_folder_with_its_index_that_reopens_equal() {
    let dir = scratch();
    let input = torch_fixture("nested_zip.pt");
    let output = dir.path().join("sharded");
    convert(&input, &output, &["--max-shard-size", "200"]);
    let index_path = output.join("model.safetensors.index.json");
    let index: Value = serde_json::from_str(&std::fs::read_to_string(&index_path).unwrap()).unwrap();
    let shards: std::collections::BTreeSet<&str> =
        index["weight_map"].as_object().unwrap().values().map(|shard| shard.as_str().unwrap()).collect();
    assert!(shards.len() > 1, "several shards: {shards:?}");
    for shard in &shards {
        assert!(output.join(shard).is_file(), "{shard}");
    }
    assert_eq!(index["metadata"]["epoch"], "3", "metadata kept in the index");
    let reopened = Archive::open(&output).unwrap();
    assert_eq!(reopened.metadata().get("name").map(String::as_str), Some("run-1"));
    let (code, out, err) = nnx(&["diff", text(&input), text(&output)]);
    assert_eq!(code, 0, "{out}{err}");
    // Units are accepted too.
    let (code, _, err) = nnx(&["convert", text(&input), text(&dir.path().join("units")), "--max-shard-size", "1KiB"]);
    assert_eq!(code, 0, "{err}");
    assert!(dir.path().join("units/model.safetensors.index.json").is_file());
}

#[test]
fn page_align_puts_the_data_on_a_page() {
    let dir = scratch();
    let output = dir.path().join("aligned.safetensors");
    convert(&torch_fixture("state_legacy.pt"), &output, &["--page-align"]);
    let bytes = std::fs::read(&output).unwrap();
    let header = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    assert_eq!((8 + header) % (16 * 1024), 0, "data starts on a 16 KiB page");
    check_in_python(&output, "");
}

#[test]
fn select_keeps_the_entries_under_the_prefix_with_their_names_whole() {
    let dir = scratch();
    let input = torch_fixture("nested_zip.pt");
    let output = dir.path().join("encoder.safetensors");
    convert(&input, &output, &["--select", "model.encoder"]);
    let selected = Archive::open(&output).unwrap();
    let names: Vec<&str> = selected.names().collect();
    let wanted: Vec<String> =
        expected().keys().filter(|name| name.starts_with("encoder.")).map(|name| format!("model.{name}")).collect();
    assert_eq!(names.len(), wanted.len(), "{names:?}");
    assert!(wanted.iter().all(|name| selected.contains(name)), "{names:?}");
    assert_eq!(selected.metadata().get("epoch").map(String::as_str), Some("3"));
    // A trailing dot means the same prefix.
    let dotted = dir.path().join("dotted.safetensors");
    convert(&input, &dotted, &["--select", "model.encoder."]);
    assert_eq!(Archive::open(&dotted).unwrap().len(), wanted.len());
    // A prefix is a whole name part: `model.enc` selects nothing, and that is an error.
    let (code, out, err) =
        nnx(&["convert", text(&input), text(&dir.path().join("none.safetensors")), "--select", "model.enc"]);
    assert_eq!(code, 1, "{err}");
    assert!(out.is_empty());
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("matches no entry") && err.contains("nested_zip.pt"), "{err}");
}

#[test]
fn convert_errors_are_one_line_naming_the_file() {
    let dir = scratch();
    let absent = dir.path().join("absent.pt");
    let output = dir.path().join("out.safetensors");
    let (code, out, err) = nnx(&["convert", text(&absent), text(&output)]);
    assert_eq!(code, 1, "{err}");
    assert!(out.is_empty());
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("error: ") && err.contains("absent.pt"), "{err}");

    let malicious = torch_fixture("malicious.pkl");
    let (code, _, err) = nnx(&["convert", text(&malicious), text(&output)]);
    assert_eq!(code, 1, "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("malicious.pkl"), "{err}");
    assert!(!output.exists(), "nothing written");

    let nowhere = dir.path().join("missing-folder").join("out.safetensors");
    let (code, _, err) = nnx(&["convert", text(&torch_fixture("state_zip.pt")), text(&nowhere)]);
    assert_eq!(code, 1, "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("missing-folder"), "{err}");

    let (code, _, err) =
        nnx(&["convert", text(&torch_fixture("state_zip.pt")), text(&output), "--max-shard-size", "12parsecs"]);
    assert_eq!(code, 1, "{err}");
}

#[test]
fn gpt2_checkpoint_converts_to_its_safetensors_twin_but_the_tied_head() {
    let dir = scratch();
    let bin = fixtures().join("gpt2-tiny/pytorch_model.bin");
    let twin = fixtures().join("gpt2-tiny/model.safetensors");
    let output = dir.path().join("gpt2.safetensors");
    convert(&bin, &output, &[]);
    let (code, out, err) = nnx(&["diff", text(&bin), text(&output)]);
    assert_eq!(code, 0, "a checkpoint equals its conversion: {out}{err}");
    assert!(out.contains("equal"), "{out}");

    let (code, out, err) = nnx(&["diff", text(&output), text(&twin), "--json"]);
    assert_eq!(code, 1, "{err}");
    let report: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(report["equal"], false);
    assert_eq!(report["only_in_a"], serde_json::json!(["lm_head.weight"]), "the checkpoint stores the tied head");
    assert_eq!(report["only_in_b"], serde_json::json!([]));
    let common = report["common"].as_array().unwrap();
    assert_eq!(common.len(), Archive::open(&twin).unwrap().len());
    assert!(common.iter().all(|entry| entry["equal"] == true && entry["differing"] == 0), "{out}");

    let (code, out, _) = nnx(&["diff", text(&bin), text(&twin)]);
    assert_eq!(code, 1);
    assert!(out.lines().any(|line| line.starts_with("lm_head.weight") && line.contains("only in A")), "{out}");
}

/// Saves `entries` as a SafeTensors file `name` in `dir`.
fn save(dir: &Path, name: &str, entries: Vec<(&str, Tensor)>) -> PathBuf {
    let mut archive = Archive::new();
    for (entry, tensor) in entries {
        archive.insert(entry, tensor);
    }
    let path = dir.join(name);
    archive.save(&path).unwrap();
    path
}

/// Two files with one difference of each kind, and entries equal in both (NaN included).
fn differing_pair(dir: &Path) -> (PathBuf, PathBuf) {
    let f32s = |values: &[f32], shape: &[usize]| Tensor::from_vec(values.to_vec(), shape).unwrap();
    let a = save(
        dir,
        "a.safetensors",
        vec![
            ("same", f32s(&[1.0, f32::NAN, f32::INFINITY], &[3])),
            ("only_a", f32s(&[0.0], &[1])),
            ("dtype", f32s(&[1.0, 2.0], &[2])),
            ("shape", f32s(&[1.0, 2.0, 3.0, 4.0], &[2, 2])),
            ("values", f32s(&[1.0, 2.0, 3.0, 4.0], &[4])),
            ("ints", Tensor::from_vec(vec![i64::MAX, 5, 7], &[3]).unwrap()),
        ],
    );
    let b = save(
        dir,
        "b.safetensors",
        vec![
            ("same", f32s(&[1.0, f32::NAN, f32::INFINITY], &[3])),
            ("only_b", f32s(&[0.0], &[1])),
            ("dtype", Tensor::from_vec(vec![half::f16::from_f32(1.0), half::f16::from_f32(2.0)], &[2]).unwrap()),
            ("shape", f32s(&[1.0, 2.0, 3.0, 4.0], &[4])),
            ("values", f32s(&[1.0, 2.5, 3.0, 4.25], &[4])),
            ("ints", Tensor::from_vec(vec![i64::MAX - 1, 5, 7], &[3]).unwrap()),
        ],
    );
    (a, b)
}

#[test]
fn diff_reports_each_kind_of_difference_as_a_table() {
    let dir = scratch();
    let (a, b) = differing_pair(dir.path());
    let (code, out, err) = nnx(&["diff", text(&a), text(&b)]);
    assert_eq!(code, 1, "{err}");
    let row = |name: &str| out.lines().find(|line| line.starts_with(&format!("{name} "))).unwrap_or_default();
    assert!(row("only_a").contains("only in A"), "{out}");
    assert!(row("only_b").contains("only in B"), "{out}");
    assert!(row("dtype").contains("dtype") && row("dtype").contains("F16"), "{out}");
    assert!(row("shape").contains("shape") && row("shape").contains("[2, 2]"), "{out}");
    assert!(row("values").contains("values") && row("values").contains("2/4"), "{out}");
    assert!(row("ints").contains("1/3"), "integers compared exactly: {out}");
    assert!(row("same").is_empty(), "NaN equals NaN: {out}");
    assert!(out.trim_end().ends_with("1 of 5 common tensors equal"), "{out}");

    let (code, out, err) = nnx(&["diff", text(&a), text(&a)]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.lines().last(), Some("equal: 6 tensors"), "{out}");
}

#[test]
fn diff_json_is_one_object_and_atol_forgives_small_float_differences() {
    let dir = scratch();
    let (a, b) = differing_pair(dir.path());
    let (code, out, err) = nnx(&["diff", text(&a), text(&b), "--json"]);
    assert_eq!(code, 1, "{err}");
    assert_eq!(out.lines().count(), 1, "{out}");
    let report: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(report["equal"], false);
    assert_eq!(report["only_in_a"], serde_json::json!(["only_a"]));
    assert_eq!(report["only_in_b"], serde_json::json!(["only_b"]));
    let entry =
        |name: &str| report["common"].as_array().unwrap().iter().find(|entry| entry["name"] == name).unwrap().clone();
    assert_eq!(entry("dtype")["dtype_differs"], true);
    assert_eq!(entry("dtype")["differing"], 0, "the values are the same in both dtypes");
    assert_eq!(entry("shape")["shape_differs"], true);
    assert_eq!(entry("shape")["compared"], false);
    assert_eq!(entry("values")["max_abs_diff"], 0.5);
    assert_eq!(entry("values")["differing"], 2);
    assert_eq!(entry("ints")["differing"], 1);
    assert_eq!(entry("same")["equal"], true);

    // With a tolerance the float values agree; integers must still be equal.
    let (code, out, _) = nnx(&["diff", text(&a), text(&b), "--json", "--atol", "0.5"]);
    assert_eq!(code, 1);
    let report: Value = serde_json::from_str(&out).unwrap();
    let values = report["common"].as_array().unwrap().iter().find(|entry| entry["name"] == "values").unwrap();
    assert_eq!(values["differing"], 0);
    assert_eq!(values["equal"], true);
    let ints = report["common"].as_array().unwrap().iter().find(|entry| entry["name"] == "ints").unwrap();
    assert_eq!(ints["differing"], 1);

    // Files that differ only by float values within the tolerance are equal.
    let near = save(dir.path(), "near.safetensors", vec![("x", Tensor::from_vec(vec![1.0f32, 2.0], &[2]).unwrap())]);
    let far = save(dir.path(), "far.safetensors", vec![("x", Tensor::from_vec(vec![1.0f32, 2.001], &[2]).unwrap())]);
    assert_eq!(nnx(&["diff", text(&near), text(&far)]).0, 1);
    assert_eq!(nnx(&["diff", text(&near), text(&far), "--atol", "0.01"]).0, 0);
}

#[test]
fn diff_errors_exit_two_with_one_line() {
    let dir = scratch();
    let present = fixtures().join("gpt2-tiny/model.safetensors");
    let absent = dir.path().join("absent.safetensors");
    let (code, out, err) = nnx(&["diff", text(&present), text(&absent)]);
    assert_eq!(code, 2, "{err}");
    assert!(out.is_empty());
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("error: ") && err.contains("absent.safetensors"), "{err}");
    assert_eq!(nnx(&["diff", text(&present)]).0, 2, "a missing operand");
    assert_eq!(nnx(&["diff", text(&present), text(&present), "--atol", "-1"]).0, 2, "a negative tolerance");
}
