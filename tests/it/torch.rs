//! PyTorch checkpoints: every fixture against the values PyTorch wrote beside it, mapped views
//! and shared storages, nested checkpoints, hostile files (globals, limits, lying zip records)
//! and the GPT-2 checkpoint imported like its SafeTensors twin.

use std::path::{Path, PathBuf};

use half::{bf16, f16};
use nnx::error::{PickleLimit, PickleProblem, ShardProblem, TorchProblem, ZipRecordProblem};
use nnx::models::gpt2::{Gpt2, Gpt2Config};
use nnx::nn::Init;
use nnx::{Archive, DType, Error, Module, Tensor};
use serde_json::Value;

use crate::hostile::{ALLOCATION_LIMIT, largest_allocation};
use crate::util::{fixtures, scratch};

fn torch_fixture(name: &str) -> PathBuf {
    fixtures().join("torch").join(name)
}

fn expected() -> serde_json::Map<String, Value> {
    let text = std::fs::read_to_string(torch_fixture("expected.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn dtype_of(name: &str) -> DType {
    match name {
        "float64" => DType::F64,
        "float32" => DType::F32,
        "float16" => DType::F16,
        "bfloat16" => DType::BF16,
        "int64" => DType::I64,
        "int32" => DType::I32,
        "int16" => DType::I16,
        "int8" => DType::I8,
        "uint8" => DType::U8,
        "bool" => DType::Bool,
        other => panic!("expected.json names dtype `{other}`"),
    }
}

/// The elements as f64, row-major, whatever the dtype.
fn values(tensor: &Tensor) -> Vec<f64> {
    match tensor.dtype() {
        DType::F64 => tensor.to_vec::<f64>().unwrap(),
        DType::F32 => tensor.to_vec::<f32>().unwrap().into_iter().map(f64::from).collect(),
        DType::F16 => tensor.to_vec::<f16>().unwrap().into_iter().map(f64::from).collect(),
        DType::BF16 => tensor.to_vec::<bf16>().unwrap().into_iter().map(f64::from).collect(),
        DType::I64 => tensor.to_vec::<i64>().unwrap().into_iter().map(|v| v as f64).collect(),
        DType::I32 => tensor.to_vec::<i32>().unwrap().into_iter().map(f64::from).collect(),
        DType::I16 => tensor.to_vec::<i16>().unwrap().into_iter().map(f64::from).collect(),
        DType::I8 => tensor.to_vec::<i8>().unwrap().into_iter().map(f64::from).collect(),
        DType::U8 => tensor.to_vec::<u8>().unwrap().into_iter().map(f64::from).collect(),
        DType::Bool => tensor.to_vec::<bool>().unwrap().into_iter().map(|v| f64::from(u8::from(v))).collect(),
        other => panic!("no fixture holds {other}"),
    }
}

/// Whether `found` (an element of a `dtype` tensor) is the value `wanted` that the JSON writes
/// in decimal: equal once `wanted` is rounded to `dtype`. `expected.json` writes F64 values
/// rounded to F32 precision, so those are compared as F32.
fn same_value(dtype: DType, found: f64, wanted: f64) -> bool {
    match dtype {
        DType::F64 => found as f32 == wanted as f32,
        DType::F32 => found == f64::from(wanted as f32),
        DType::F16 => found == f64::from(f16::from_f64(wanted)),
        DType::BF16 => found == f64::from(bf16::from_f64(wanted)),
        _ => found == wanted,
    }
}

/// Checks every tensor of `expected.json` in `archive` under `prefix`: dtype, shape, values.
fn check_against_expected(archive: &Archive, prefix: &str, what: &str) {
    let expected = expected();
    let names: Vec<String> = expected.keys().map(|name| format!("{prefix}{name}")).collect();
    let mut found: Vec<&str> = archive.names().collect();
    found.sort_unstable();
    assert_eq!(found, names, "{what}: every tensor and nothing else");
    for (name, entry) in &expected {
        let full = format!("{prefix}{name}");
        let tensor = archive.try_get(&full).unwrap();
        assert_eq!(tensor.dtype(), dtype_of(entry["dtype"].as_str().unwrap()), "{what}: `{full}`");
        let shape: Vec<usize> = serde_json::from_value(entry["shape"].clone()).unwrap();
        assert_eq!(tensor.shape(), shape, "{what}: `{full}`");
        let wanted: Vec<f64> = serde_json::from_value(entry["values"].clone()).unwrap();
        let found = values(&tensor);
        assert_eq!(found.len(), wanted.len(), "{what}: `{full}`");
        for (at, (&found, &wanted)) in found.iter().zip(&wanted).enumerate() {
            assert!(same_value(tensor.dtype(), found, wanted), "{what}: `{full}`[{at}] is {found}, not {wanted}");
        }
        let typed = archive.tensor(&full, tensor.dtype(), &shape).unwrap();
        assert!(typed.shares_storage(&tensor), "{what}: `{full}` is read once");
    }
}

#[test]
fn every_fixture_matches_what_pytorch_wrote() {
    check_against_expected(&Archive::open(torch_fixture("state_zip.pt")).unwrap(), "", "zip");
    check_against_expected(&Archive::open(torch_fixture("state_legacy.pt")).unwrap(), "", "legacy");
    check_against_expected(&Archive::open(torch_fixture("nested_zip.pt")).unwrap(), "model.", "nested");
}

#[test]
fn zip_checkpoints_are_mapped_views_of_the_file() {
    for name in ["state_zip.pt", "nested_zip.pt"] {
        let archive = Archive::open(torch_fixture(name)).unwrap();
        for entry in archive.names() {
            assert!(archive.try_get(entry).unwrap().is_mapped(), "{name}: `{entry}` is a view of the file");
        }
    }
    // Legacy storages lie at any byte offset: the aligned ones are mapped, the others copied.
    let legacy = Archive::open(torch_fixture("state_legacy.pt")).unwrap();
    assert!(legacy.try_get("u8").unwrap().is_mapped());
    assert!(legacy.try_get("mask").unwrap().is_mapped());
}

#[test]
fn shared_storages_stay_shared_with_offsets_and_strides_as_views() {
    for name in ["state_zip.pt", "state_legacy.pt"] {
        let archive = Archive::open(torch_fixture(name)).unwrap();
        let a = archive.try_get("shared.a").unwrap();
        let b = archive.try_get("shared.b").unwrap();
        let t = archive.try_get("shared.t").unwrap();
        assert!(a.shares_storage(&b) && a.shares_storage(&t), "{name}: one storage");
        assert_eq!(b.offset() - a.offset(), 8, "{name}: `shared.b` starts 8 elements in");
        assert_eq!(t.strides(), [1, 4], "{name}: `shared.t` is a transposed view");
        assert!(!t.is_contiguous());
        assert_eq!(t.contiguous().to_vec::<f32>().unwrap(), a.transpose(0, 1).unwrap().to_vec::<f32>().unwrap());
    }
}

#[test]
fn nested_checkpoints_name_tensors_by_path_and_keep_plain_values() {
    let archive = Archive::open(torch_fixture("nested_zip.pt")).unwrap();
    assert!(archive.names().all(|name| name.starts_with("model.")));
    assert!(archive.contains("model.encoder.fc1.weight"));
    assert_eq!(archive.metadata().get("epoch").map(String::as_str), Some("3"));
    assert_eq!(archive.metadata().get("name").map(String::as_str), Some("run-1"));
    let model = archive.select("model");
    assert_eq!(model.len(), expected().len());
}

/// The file the hostile fixtures' shell command (`echo pwned > FILE`) would create, read from
/// the command inside `malicious.pkl`.
fn payload_target() -> std::path::PathBuf {
    let bytes = std::fs::read(torch_fixture("malicious.pkl")).unwrap();
    let at = bytes.windows(2).position(|pair| pair == b"> ").expect("the payload redirects to a file") + 2;
    let path: Vec<u8> =
        bytes[at..].iter().copied().take_while(|byte| byte.is_ascii_alphanumeric() || b"/-_.".contains(byte)).collect();
    assert!(path.len() > 1, "the payload names its file");
    std::path::PathBuf::from(String::from_utf8(path).unwrap())
}

#[test]
fn malicious_pickles_are_refused_by_the_global_they_name_and_run_nothing() {
    let target = payload_target();
    let existed = target.exists();
    for name in ["malicious.pkl", "malicious_zip.pt"] {
        let path = torch_fixture(name);
        let error = Archive::open(&path).unwrap_err();
        match &error {
            Error::Torch {
                path: at,
                problem: TorchProblem::Pickle { problem: PickleProblem::ForbiddenGlobal { module, name: global }, .. },
            } => {
                assert_eq!(at, &path);
                assert_eq!((module.as_str(), global.as_str()), ("posix", "system"), "{name}");
            }
            other => panic!("{name}: expected a refused global, got {other:?}"),
        }
        let message = error.to_string();
        assert!(message.contains("`posix.system`") && message.contains(name), "{message}");
        assert!(message.contains("nothing was run"), "{message}");
    }
    if !existed {
        assert!(!target.exists(), "the command of the malicious pickle ran");
    }
}

/// Writes `bytes` as `name` in `dir`, opens it, and returns the error with the largest
/// allocation made on the way.
fn open_error(dir: &Path, name: &str, bytes: &[u8]) -> Error {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    let (opened, largest) = largest_allocation(|| Archive::open(&path));
    assert!(largest < ALLOCATION_LIMIT, "{name}: allocated a block of {largest} bytes");
    let error = opened.err().unwrap_or_else(|| panic!("{name}: expected an error"));
    assert!(error.to_string().contains(&format!("`{}`", path.display())), "{name}: {error}");
    error
}

/// `bytes` with the first occurrence of `from` replaced by `to` (of the same length).
fn patched(bytes: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    assert_eq!(from.len(), to.len());
    let at = bytes.windows(from.len()).position(|window| window == from).expect("the pattern is in the file");
    let mut out = bytes.to_vec();
    out[at..at + to.len()].copy_from_slice(to);
    out
}

fn pickle_problem(error: &Error) -> &PickleProblem {
    match error {
        Error::Torch { problem: TorchProblem::Pickle { problem, .. }, .. } => problem,
        other => panic!("expected a pickle problem, got {other:?}"),
    }
}

fn torch_problem(error: &Error) -> &TorchProblem {
    match error {
        Error::Torch { problem, .. } => problem,
        other => panic!("expected a checkpoint problem, got {other:?}"),
    }
}

#[test]
fn pickles_past_the_limits_are_refused() {
    let dir = scratch();
    let deep_marks = [b"\x80\x02".as_slice(), &[b'('; 100_000]].concat();
    let error = open_error(dir.path(), "marks.pkl", &deep_marks);
    assert!(matches!(pickle_problem(&error), PickleProblem::Limit { limit: PickleLimit::Depth { .. } }), "{error}");

    let deep_tuples = [b"\x80\x02N".as_slice(), &[0x85; 100_000], b"."].concat();
    let error = open_error(dir.path(), "tuples.pkl", &deep_tuples);
    assert!(matches!(pickle_problem(&error), PickleProblem::Limit { limit: PickleLimit::Depth { .. } }), "{error}");

    let huge_memo = b"\x80\x02}r\xff\xff\xff\x7f.";
    let error = open_error(dir.path(), "memo.pkl", huge_memo);
    assert!(matches!(pickle_problem(&error), PickleProblem::Limit { limit: PickleLimit::Memo { .. } }), "{error}");

    // The highest slot taken costs no more than slot 0.
    let high_memo = dir.path().join("high_memo.pkl");
    std::fs::write(&high_memo, b"\x80\x02}r\xff\xff\x0f\x00.").unwrap();
    let (opened, largest) = largest_allocation(|| Archive::open(&high_memo));
    assert!(opened.unwrap().is_empty());
    assert!(largest < 4096, "a high memo slot allocated {largest} bytes");

    // Lists nested a thousand deep through the memo: built in a few bytes, refused by depth.
    let mut nested = b"\x80\x02}q\x00X\x01\x00\x00\x00aq\x01]q\x02".to_vec();
    for _ in 0..1000 {
        nested.extend(b"]q\x03h\x02h\x03a0q\x020");
    }
    nested.extend(b"s.");
    let error = open_error(dir.path(), "nested.pkl", &nested);
    assert!(matches!(torch_problem(&error), TorchProblem::TooDeep { .. }), "{error}");

    // One list fetched from the memo 20 000 times costs a reference each, not a copy; walking
    // its two million items is refused.
    let mut shared = b"\x80\x02}X\x01\x00\x00\x00a]q\x00(".to_vec();
    shared.extend([b'N'; 100]);
    shared.extend(b"e0(");
    for _ in 0..20_000 {
        shared.extend(b"h\x00");
    }
    shared.extend(b"ts.");
    let error = open_error(dir.path(), "shared.pkl", &shared);
    assert!(matches!(torch_problem(&error), TorchProblem::TooDeep { .. }), "{error}");
}

#[test]
fn tensors_that_reach_past_their_storage_are_refused() {
    let dir = scratch();
    let original = std::fs::read(torch_fixture("state_zip.pt")).unwrap();
    // `encoder.fc1.weight` has size (8, 4) over 32 elements; (9, 4) reaches past them.
    let bytes = patched(&original, b"K\x08K\x04\x86", b"K\x09K\x04\x86");
    let error = open_error(dir.path(), "shape.pt", &bytes);
    match torch_problem(&error) {
        TorchProblem::TensorLayout { name, shape, storage, .. } => {
            assert_eq!((name.as_str(), shape.as_slice(), *storage), ("encoder.fc1.weight", [9, 4].as_slice(), 32));
        }
        other => panic!("expected a layout problem, got {other:?}"),
    }
    // The storage claims 33 elements where its record holds 32.
    let bytes = patched(&original, b"K\x20t", b"K\x21t");
    let error = open_error(dir.path(), "numel.pt", &bytes);
    assert!(matches!(torch_problem(&error), TorchProblem::StorageSize { numel: 33, bytes: 128, .. }), "{error}");
}

/// The offset of the central directory entry of `record` in a zip.
fn central_entry(bytes: &[u8], record: &str) -> usize {
    let name = record.as_bytes();
    (0..bytes.len() - 46)
        .find(|&at| {
            bytes[at..].starts_with(b"PK\x01\x02")
                && bytes.get(at + 46..at + 46 + name.len()) == Some(name)
                && u16::from_le_bytes([bytes[at + 28], bytes[at + 29]]) as usize == name.len()
        })
        .expect("the record is in the central directory")
}

#[test]
fn zip_records_that_lie_are_refused_without_large_allocations() {
    let dir = scratch();
    let original = std::fs::read(torch_fixture("state_zip.pt")).unwrap();
    let entry = central_entry(&original, "state_zip/data/0");

    // Both sizes claim 2 GB: the bytes would lie past the end of the file.
    let mut bytes = original.clone();
    bytes[entry + 20..entry + 24].copy_from_slice(&0x7fff_ffffu32.to_le_bytes());
    bytes[entry + 24..entry + 28].copy_from_slice(&0x7fff_ffffu32.to_le_bytes());
    let error = open_error(dir.path(), "past_end.pt", &bytes);
    assert!(
        matches!(torch_problem(&error), TorchProblem::ZipRecord { problem: ZipRecordProblem::PastEnd { .. }, .. }),
        "{error}"
    );

    // A record that would inflate 128 bytes into 2 GB: sizes differ, nothing is inflated.
    let mut bytes = original.clone();
    bytes[entry + 24..entry + 28].copy_from_slice(&0x7fff_ffffu32.to_le_bytes());
    let error = open_error(dir.path(), "sizes.pt", &bytes);
    assert!(
        matches!(torch_problem(&error), TorchProblem::ZipRecord { problem: ZipRecordProblem::Sizes { .. }, .. }),
        "{error}"
    );

    // A deflated record: compression method 8 in the central directory.
    let mut bytes = original.clone();
    bytes[entry + 10..entry + 12].copy_from_slice(&8u16.to_le_bytes());
    let error = open_error(dir.path(), "deflated.pt", &bytes);
    match torch_problem(&error) {
        TorchProblem::ZipRecord { record, problem: ZipRecordProblem::Compressed { method: 8 } } => {
            assert_eq!(record, "state_zip/data/0");
        }
        other => panic!("expected a compressed record, got {other:?}"),
    }
    assert!(error.to_string().contains("save it again"), "{error}");

    // Truncated in the middle of the records.
    let error = open_error(dir.path(), "truncated.pt", &original[..original.len() / 2]);
    assert!(matches!(torch_problem(&error), TorchProblem::Zip { .. }), "{error}");
}

#[test]
fn safetensors_files_under_other_names_are_still_safetensors() {
    // A header of 0x280 bytes starts with `80 02`, the start of a pickle.
    let dir = scratch();
    let mut header = r#"{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#.to_string();
    header.extend(std::iter::repeat_n(' ', 0x280 - header.len()));
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend(header.as_bytes());
    bytes.extend(2.5f32.to_le_bytes());
    let path = dir.path().join("model.bin");
    std::fs::write(&path, &bytes).unwrap();
    assert_eq!(Archive::open(&path).unwrap().try_get("w").unwrap().to_vec::<f32>().unwrap(), [2.5]);
}

#[test]
fn the_top_folder_of_a_zip_may_have_any_name() {
    let dir = scratch();
    let original = std::fs::read(torch_fixture("state_zip.pt")).unwrap();
    // Rename every `state_zip/` to `archive_x/` (same length) in local and central headers.
    let mut bytes = original.clone();
    let mut at = 0;
    while let Some(found) = bytes[at..].windows(10).position(|window| window == b"state_zip/") {
        bytes[at + found..at + found + 10].copy_from_slice(b"archive_x/");
        at += found + 10;
    }
    let path = dir.path().join("renamed.pt");
    std::fs::write(&path, &bytes).unwrap();
    check_against_expected(&Archive::open(&path).unwrap(), "", "renamed");
}

/// `BINUNICODE` of `text`.
fn unicode(text: &str) -> Vec<u8> {
    [b"X".as_slice(), &(text.len() as u32).to_le_bytes(), text.as_bytes()].concat()
}

#[test]
fn legacy_storage_views_and_small_integer_dtypes_read() {
    // A legacy file by hand: one I16 storage of 4 elements, viewed from element 1 (3 elements),
    // and a tensor of 2 elements from element 1 of that view.
    let mut bytes = b"\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19\x2e".to_vec();
    bytes.extend(b"\x80\x02M\xe9\x03.\x80\x02}.");
    bytes.extend(b"\x80\x02}");
    bytes.extend(unicode("x"));
    bytes.extend(b"ctorch._utils\n_rebuild_tensor_v2\n((");
    bytes.extend(unicode("storage"));
    bytes.extend(b"ctorch\nShortStorage\n");
    bytes.extend(unicode("k"));
    bytes.extend(unicode("cpu"));
    bytes.extend(b"K\x04");
    bytes.extend(unicode("k"));
    bytes.extend(b"K\x01K\x03\x87tQK\x01K\x02\x85K\x01\x85\x89ccollections\nOrderedDict\n)RtRs.");
    bytes.extend(b"\x80\x02](");
    bytes.extend(unicode("k"));
    bytes.extend(b"e.");
    bytes.extend(4u64.to_le_bytes());
    for value in [10i16, 20, 30, -40] {
        bytes.extend(value.to_le_bytes());
    }
    let dir = scratch();
    let path = dir.path().join("view.pt");
    std::fs::write(&path, &bytes).unwrap();
    let archive = Archive::open(&path).unwrap();
    let x = archive.try_get("x").unwrap();
    assert_eq!((x.dtype(), x.shape()), (DType::I16, [2].as_slice()));
    assert_eq!(x.to_vec::<i16>().unwrap(), [30, -40]);

    // The same file with the view reaching one element past the storage.
    let past = patched(&bytes, b"K\x01K\x03\x87", b"K\x02K\x03\x87");
    let error = open_error(dir.path(), "past.pt", &past);
    assert!(matches!(torch_problem(&error), TorchProblem::TensorLayout { storage: 4, .. }), "{error}");
}

/// Reads every entry of `archive` and every element, ignoring errors.
fn read_all(archive: &Archive) {
    for name in archive.names() {
        if let Ok(tensor) = archive.try_get(name) {
            values_or_nothing(&tensor);
        }
    }
}

fn values_or_nothing(tensor: &Tensor) -> Option<Vec<f64>> {
    match tensor.dtype() {
        DType::F64 | DType::F32 | DType::F16 | DType::BF16 => {
            Some(tensor.to_dtype(DType::F32).ok()?.to_vec::<f32>().ok()?.into_iter().map(f64::from).collect())
        }
        DType::Bool => Some(tensor.to_vec::<bool>().ok()?.into_iter().map(|v| f64::from(u8::from(v))).collect()),
        _ => Some(vec![tensor.contiguous().to_bytes().ok()?.len() as f64]),
    }
}

#[test]
fn damaged_checkpoints_give_errors_not_panics() {
    let dir = scratch();
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for name in ["state_zip.pt", "state_legacy.pt", "nested_zip.pt", "malicious.pkl"] {
        let original = std::fs::read(torch_fixture(name)).unwrap();
        let path = dir.path().join(name);
        for _ in 0..500 {
            let mut bytes = original.clone();
            for _ in 0..1 + next() % 4 {
                let at = (next() % bytes.len() as u64) as usize;
                bytes[at] = next() as u8;
            }
            if next() % 8 == 0 {
                bytes.truncate((next() % bytes.len() as u64) as usize);
            }
            std::fs::write(&path, &bytes).unwrap();
            let (opened, largest) = largest_allocation(|| Archive::open(&path).map(|archive| read_all(&archive)));
            assert!(largest < ALLOCATION_LIMIT, "{name}: a damaged copy allocated {largest} bytes");
            if let Err(error) = opened {
                assert!(!error.to_string().is_empty());
            }
        }
    }
}

/// What `pickle` writes for a float storage: a legacy checkpoint of that storage alone.
fn storage_blob(values: &[f32]) -> Vec<u8> {
    let mut blob = b"\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19\x2e".to_vec();
    blob.extend(b"\x80\x02M\xe9\x03.\x80\x02}.\x80\x02(");
    blob.extend(unicode("storage"));
    blob.extend(b"ctorch\nFloatStorage\n");
    blob.extend(unicode("0"));
    blob.extend(unicode("cpu"));
    blob.extend([b'K', values.len() as u8]);
    blob.extend(b"NtQ.\x80\x02](");
    blob.extend(unicode("0"));
    blob.extend(b"e.");
    blob.extend((values.len() as u64).to_le_bytes());
    for value in values {
        blob.extend(value.to_le_bytes());
    }
    blob
}

#[test]
fn state_dicts_written_by_pickle_read_with_their_storages_inside() {
    // `pickle.dump(state_dict, f, protocol=2)`: each storage is `_load_from_bytes(bytes)`, the
    // bytes written as `_codecs.encode(text, 'latin1')`; two tensors share the storage.
    let text: String = storage_blob(&[1.5, -2.0, 3.25]).iter().map(|&b| char::from(b)).collect();
    let rebuild = b"ctorch._utils\n_rebuild_tensor_v2\n(".as_slice();
    let hooks = b"\x89ccollections\nOrderedDict\n)RtR".as_slice();
    let mut bytes = b"\x80\x02}".to_vec();
    bytes.extend(unicode("w"));
    bytes.extend(rebuild);
    bytes.extend(b"ctorch.storage\n_load_from_bytes\n(c_codecs\nencode\n(");
    bytes.extend(unicode(&text));
    bytes.extend(unicode("latin1"));
    bytes.extend(b"tRtRq\x00K\x00K\x03\x85K\x01\x85");
    bytes.extend(hooks);
    bytes.extend(b"s");
    bytes.extend(unicode("v"));
    bytes.extend(rebuild);
    bytes.extend(b"h\x00K\x01K\x02\x85K\x01\x85");
    bytes.extend(hooks);
    bytes.extend(b"s.");
    let dir = scratch();
    let path = dir.path().join("pickled.pkl");
    std::fs::write(&path, &bytes).unwrap();
    let archive = Archive::open(&path).unwrap();
    let w = archive.try_get("w").unwrap();
    let v = archive.try_get("v").unwrap();
    assert_eq!(w.to_vec::<f32>().unwrap(), [1.5, -2.0, 3.25]);
    assert_eq!(v.to_vec::<f32>().unwrap(), [-2.0, 3.25]);
    assert!(w.shares_storage(&v), "one storage, fetched twice from the memo");

    // A pickled storage whose own pickle loads another storage is refused.
    let mut blob = b"\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19\x2e".to_vec();
    blob.extend(b"\x80\x02M\xe9\x03.\x80\x02}.\x80\x02ctorch.storage\n_load_from_bytes\n(C\x00tR.");
    let mut bytes = b"\x80\x03}".to_vec();
    bytes.extend(unicode("w"));
    bytes.extend(rebuild);
    bytes.extend(b"ctorch.storage\n_load_from_bytes\n(B");
    bytes.extend((blob.len() as u32).to_le_bytes());
    bytes.extend(&blob);
    bytes.extend(b"tRK\x00K\x01\x85K\x01\x85");
    bytes.extend(hooks);
    bytes.extend(b"s.");
    let error = open_error(dir.path(), "nested.pkl", &bytes);
    assert!(matches!(pickle_problem(&error), PickleProblem::InlineStorage { .. }), "{error}");

    // One memoized blob loaded again and again: each load copies the storage, so the copies
    // are bounded by the pickle's size.
    let blob = storage_blob(&[0.5; 64]);
    let mut bytes = b"\x80\x03ctorch.storage\n_load_from_bytes\nq\x01(B".to_vec();
    bytes.extend((blob.len() as u32).to_le_bytes());
    bytes.extend(&blob);
    bytes.extend(b"tq\x02R0");
    for _ in 0..100 {
        bytes.extend(b"h\x01h\x02R0");
    }
    bytes.extend(b"}.");
    let error = open_error(dir.path(), "reloaded.pkl", &bytes);
    assert!(matches!(pickle_problem(&error), PickleProblem::Limit { limit: PickleLimit::MadeBytes { .. } }), "{error}");
}

#[test]
fn folders_and_indexes_of_pytorch_checkpoints_open() {
    let dir = scratch();
    std::fs::copy(fixtures().join("gpt2-tiny/pytorch_model.bin"), dir.path().join("pytorch_model.bin")).unwrap();
    let from_folder = Archive::open(dir.path()).unwrap();
    let direct = Archive::open(fixtures().join("gpt2-tiny/pytorch_model.bin")).unwrap();
    assert_eq!(from_folder.names().collect::<Vec<_>>(), direct.names().collect::<Vec<_>>());
    assert_eq!(direct.names().next(), Some("transformer.wte.weight"), "names in the pickle's order");

    let weight_map: serde_json::Map<String, Value> =
        direct.names().map(|name| (name.to_string(), Value::from("pytorch_model.bin"))).collect();
    let index = serde_json::json!({ "metadata": { "total_size": 0 }, "weight_map": weight_map });
    std::fs::write(dir.path().join("pytorch_model.bin.index.json"), index.to_string()).unwrap();
    let from_index = Archive::open(dir.path()).unwrap();
    let mut names: Vec<&str> = direct.names().collect();
    names.sort_unstable();
    assert_eq!(from_index.names().collect::<Vec<_>>(), names);
    assert!(from_index.try_get("transformer.wte.weight").unwrap().is_mapped());

    let index = serde_json::json!({ "weight_map": { "transformer.wte.weight": "pytorch_model-00002-of-00002.bin" } });
    std::fs::write(dir.path().join("pytorch_model.bin.index.json"), index.to_string()).unwrap();
    assert!(matches!(Archive::open(dir.path()), Err(Error::MissingShard { .. })));

    // Two copies as two shards: the first holds an entry the index puts in the second.
    for shard in ["pytorch_model-00001-of-00002.bin", "pytorch_model-00002-of-00002.bin"] {
        std::fs::copy(dir.path().join("pytorch_model.bin"), dir.path().join(shard)).unwrap();
    }
    let weight_map: serde_json::Map<String, Value> = direct
        .names()
        .map(|name| {
            let shard = if name == "transformer.wte.weight" { "00002" } else { "00001" };
            (name.to_string(), Value::from(format!("pytorch_model-{shard}-of-00002.bin")))
        })
        .collect();
    let index = serde_json::json!({ "weight_map": weight_map });
    std::fs::write(dir.path().join("pytorch_model.bin.index.json"), index.to_string()).unwrap();
    match Archive::open(dir.path()) {
        Err(Error::ShardMismatch { problem: ShardProblem::ElsewhereInIndex { name, .. }, .. }) => {
            assert_eq!(name, "transformer.wte.weight");
        }
        other => panic!("expected an entry in the wrong shard, got {other:?}"),
    }
}

#[test]
fn gpt2_pytorch_checkpoint_imports_like_its_safetensors_twin() {
    let dir = fixtures().join("gpt2-tiny");
    let config = Gpt2Config::from_file(dir.join("config.json")).unwrap();
    let safetensors = Archive::open(dir.join("model.safetensors")).unwrap();
    let torch = Archive::open(dir.join("pytorch_model.bin")).unwrap();

    let lm_head = torch.try_get("lm_head.weight").unwrap();
    assert!(lm_head.shares_storage(&torch.try_get("transformer.wte.weight").unwrap()));

    let mut expected = Gpt2::new(&config, DType::F32, Init::Meta);
    safetensors.import_into(&mut expected, "").unwrap();
    let mut model = Gpt2::new(&config, DType::F32, Init::Meta);
    let plan = torch.import_plan(&model, "").unwrap();
    assert!(plan.is_valid(), "{plan}");
    torch.import_into(&mut model, "").unwrap();

    let expected = expected.flat_state_dict();
    let imported = model.flat_state_dict();
    assert_eq!(
        imported.iter().map(|(name, _)| name.to_string()).collect::<Vec<_>>(),
        expected.iter().map(|(name, _)| name.to_string()).collect::<Vec<_>>()
    );
    for ((name, ours), (_, theirs)) in imported.iter().zip(expected.iter()) {
        assert_eq!(ours.dtype(), theirs.dtype(), "`{name}`");
        assert_eq!(ours.shape(), theirs.shape(), "`{name}`");
        assert_eq!(ours.to_vec::<f32>().unwrap(), theirs.to_vec::<f32>().unwrap(), "`{name}`");
        assert_eq!(ours.is_mapped(), theirs.is_mapped(), "`{name}`: a view of the file where the entry allows");
    }
    assert!(model.lm_head.weight.shares_storage(&model.wte.weight));
}
