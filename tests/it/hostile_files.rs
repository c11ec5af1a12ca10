//! Small files that describe huge things: a pickle that refers to one string a hundred thousand
//! times, JSON whose values are millions of tiny items, a tensor repeated by a zero stride, and
//! names that hold terminal control sequences. Each runs the `nnx` binary in a child process
//! under an address-space limit and a timeout, and prints the peak memory it reached.

use std::path::{Path, PathBuf};
use std::time::Duration;

use nnx::error::TorchProblem;
use nnx::{Archive, Error};

use crate::util::{Bounded, run_nnx_bounded, scratch, text};

/// The address space each run may use: far below what the hostile inputs used to take, enough
/// for the binary's threads and mappings.
const MEMORY: u64 = 3 << 30;

/// How long a run may take.
const TIMEOUT: Duration = Duration::from_secs(60);

/// Runs `nnx` with `args` under [`MEMORY`] and [`TIMEOUT`], printing its peak memory as `case`.
fn run(case: &str, args: &[&str]) -> Bounded {
    let bounded = run_nnx_bounded(args, &[], MEMORY, TIMEOUT);
    eprintln!("{case}: peak_memory {} MiB", bounded.peak_memory >> 20);
    bounded
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

/// A SafeTensors file of one F32 entry `name` holding `[1.0]`, with `header_extra` (a JSON
/// member and a comma, or nothing) before it in the header.
pub(crate) fn safetensors(header_extra: &str, name: &str) -> Vec<u8> {
    let header = format!(r#"{{{header_extra}"{name}":{{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}}}"#);
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend_from_slice(&1.0f32.to_le_bytes());
    bytes
}

/// The CRC-32 of `bytes`, which a zip's directory records.
fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &byte in bytes {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            crc = if crc & 1 == 1 { (crc >> 1) ^ 0xEDB8_8320 } else { crc >> 1 };
        }
    }
    !crc
}

/// A zip of `records` stored uncompressed, as `torch.save` writes them.
pub(crate) fn stored_zip(records: &[(&str, &[u8])]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut directory = Vec::new();
    for (name, data) in records {
        let offset = out.len() as u32;
        let fields = |out: &mut Vec<u8>| {
            out.extend_from_slice(&[20, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
            out.extend_from_slice(&crc32(data).to_le_bytes());
            out.extend_from_slice(&(data.len() as u32).to_le_bytes());
            out.extend_from_slice(&(data.len() as u32).to_le_bytes());
            out.extend_from_slice(&(name.len() as u16).to_le_bytes());
            out.extend_from_slice(&[0, 0]);
        };
        out.extend_from_slice(b"PK\x03\x04");
        fields(&mut out);
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(data);
        directory.extend_from_slice(b"PK\x01\x02\x14\x00");
        fields(&mut directory);
        // Comment length, first disk, internal and external attributes.
        directory.extend_from_slice(&[0; 10]);
        directory.extend_from_slice(&offset.to_le_bytes());
        directory.extend_from_slice(name.as_bytes());
    }
    let directory_offset = out.len() as u32;
    out.extend_from_slice(&directory);
    out.extend_from_slice(b"PK\x05\x06\0\0\0\0");
    out.extend_from_slice(&(records.len() as u16).to_le_bytes());
    out.extend_from_slice(&(records.len() as u16).to_le_bytes());
    out.extend_from_slice(&(directory.len() as u32).to_le_bytes());
    out.extend_from_slice(&directory_offset.to_le_bytes());
    out.extend_from_slice(&[0, 0]);
    out
}

/// `BINUNICODE`: a string of any length.
pub(crate) fn string(text: &str) -> Vec<u8> {
    let mut bytes = vec![b'X'];
    bytes.extend_from_slice(&(text.len() as u32).to_le_bytes());
    bytes.extend_from_slice(text.as_bytes());
    bytes
}

/// A `torch.save` zip whose one tensor `name` views a storage of one F32 element with shape
/// `[2^33]` and stride 0: about 630 bytes that describe 32 GiB.
pub(crate) fn stride_zero_checkpoint(name: &str) -> Vec<u8> {
    let mut pickle = b"\x80\x02}".to_vec();
    pickle.extend(string(name));
    pickle.extend_from_slice(b"ctorch._utils\n_rebuild_tensor_v2\n(");
    // The persistent id ('storage', FloatStorage, '0', 'cpu', 1).
    pickle.push(b'(');
    pickle.extend(string("storage"));
    pickle.extend_from_slice(b"ctorch\nFloatStorage\n");
    pickle.extend(string("0"));
    pickle.extend(string("cpu"));
    pickle.extend_from_slice(b"K\x01tQ");
    // Offset 0, shape (2^33,), stride (0,), no grad, no hooks.
    pickle.extend_from_slice(b"K\x00\x8a\x05\x00\x00\x00\x00\x02\x85K\x00\x85\x89ccollections\nOrderedDict\n)R");
    pickle.extend_from_slice(b"tRs.");
    stored_zip(&[
        ("archive/data.pkl", &pickle),
        ("archive/byteorder", b"little"),
        ("archive/data/0", &1.0f32.to_le_bytes()),
    ])
}

#[test]
fn hostile_files_a_memoized_string_referenced_everywhere_is_refused_by_size() {
    // {o: {i: <memo 1> for i in 0..250} for o in 0..400}: the 10 KB string is in the file
    // once and referred to 100,000 times, 1 GB of metadata text if each use were copied.
    let big = "x".repeat(10 << 10);
    let mut pickle = b"\x80\x02}(".to_vec();
    for outer in 0..400u16 {
        pickle.push(b'M');
        pickle.extend_from_slice(&outer.to_le_bytes());
        pickle.extend_from_slice(b"}(");
        for inner in 0..250u8 {
            pickle.extend_from_slice(&[b'K', inner]);
            if outer == 0 && inner == 0 {
                pickle.extend(string(&big));
                pickle.extend_from_slice(b"q\x01");
            } else {
                pickle.extend_from_slice(b"h\x01");
            }
        }
        pickle.push(b'u');
    }
    pickle.extend_from_slice(b"u.");
    let dir = scratch();
    let path = write(dir.path(), "amplified.bin", &pickle);
    assert!(pickle.len() < 520 << 10, "{} bytes", pickle.len());

    let bounded = run("pickle amplification", &["inspect", text(&path)]);
    bounded.assert_refused(text(&path));
    assert!(bounded.stderr.contains("over the 67108864-byte limit"), "{}", bounded.stderr);
    assert!(bounded.peak_memory < 512 << 20, "{} bytes", bounded.peak_memory);

    match Archive::open(&path) {
        Err(Error::Torch { path: at, problem: TorchProblem::TooMuchText { name, asked, limit } }) => {
            assert_eq!(at, path);
            assert!(name.contains('.'), "{name}");
            assert!(asked > limit && limit == 64 << 20, "{asked} {limit}");
        }
        other => panic!("expected TooMuchText, got {other:?}"),
    }
}

#[test]
fn hostile_files_a_shard_index_of_millions_of_tiny_entries_stays_bounded() {
    let dir = scratch();
    std::fs::write(dir.path().join("a.safetensors"), safetensors("", "x")).unwrap();
    let mut index = String::from(r#"{"weight_map":{"x":"a.safetensors""#);
    let mut at = 0u64;
    while index.len() < 63_000_000 {
        index.push_str(&format!(r#","e{at}":"a""#));
        at += 1;
    }
    index.push_str("}}");
    let path = write(dir.path(), "model.safetensors.index.json", index.as_bytes());
    let bounded = run("index of tiny entries", &["inspect", text(&path)]);
    bounded.assert_refused(text(&path));
    assert!(bounded.stderr.contains("`weight_map` reaches"), "{}", bounded.stderr);
    assert!(bounded.peak_memory < 1 << 30, "{} bytes", bounded.peak_memory);
}

#[test]
fn hostile_files_index_metadata_of_huge_nested_arrays_is_kept_as_text() {
    let dir = scratch();
    std::fs::write(dir.path().join("a.safetensors"), safetensors("", "x")).unwrap();
    let row = format!("[{}0]", "0,".repeat(999));
    let rows = vec![row; 30_000].join(",");
    let index = format!(r#"{{"metadata":{{"total_size":4,"rows":[{rows}]}},"weight_map":{{"x":"a.safetensors"}}}}"#);
    let path = write(dir.path(), "model.safetensors.index.json", index.as_bytes());
    let archive = Archive::open(&path).unwrap();
    assert_eq!(archive.metadata()["rows"].len(), rows.len() + 2);
    assert!(!archive.metadata().contains_key("total_size"));
    drop(archive);
    let bounded = run("index metadata of nested arrays", &["inspect", "--json", text(&path)]);
    assert_eq!(bounded.code, Some(0), "{}", bounded.stderr);
    assert!(bounded.peak_memory < 1 << 30, "{} bytes", bounded.peak_memory);
}

#[test]
fn hostile_files_safetensors_metadata_of_tiny_values_is_refused_in_little_memory() {
    let zeros = "0,".repeat(48_000_000);
    let metadata = format!(r#""__metadata__":{{"a":[{zeros}0]}},"#);
    let dir = scratch();
    let path = write(dir.path(), "metadata.safetensors", &safetensors(&metadata, "w"));
    let bounded = run("safetensors metadata of tiny values", &["inspect", text(&path)]);
    bounded.assert_refused(text(&path));
    assert!(bounded.stderr.contains("`__metadata__` value `a` is an array, not a string"), "{}", bounded.stderr);
    assert!(bounded.peak_memory < 512 << 20, "{} bytes", bounded.peak_memory);
}

#[test]
fn hostile_files_safetensors_metadata_of_millions_of_entries_is_refused() {
    let mut metadata = String::from(r#""__metadata__":{"#);
    let mut at = 0u64;
    while metadata.len() < 90_000_000 {
        metadata.push_str(&format!(r#""k{at}":"","#));
        at += 1;
    }
    metadata.push_str(r#""last":""},"#);
    let dir = scratch();
    let path = write(dir.path(), "entries.safetensors", &safetensors(&metadata, "w"));
    let bounded = run("safetensors metadata of many entries", &["inspect", text(&path)]);
    bounded.assert_refused(text(&path));
    assert!(bounded.stderr.contains("over the 67108864-byte limit for metadata"), "{}", bounded.stderr);
    assert!(bounded.peak_memory < 1 << 30, "{} bytes", bounded.peak_memory);
}

#[test]
fn hostile_files_a_stride_zero_view_is_inspected_but_not_converted() {
    let dir = scratch();
    let bytes = stride_zero_checkpoint("w");
    let path = write(dir.path(), "bomb.pt", &bytes);
    let out = dir.path().join("out.safetensors");

    let inspected = run("stride-0 inspect", &["inspect", text(&path)]);
    assert_eq!(inspected.code, Some(0), "{}", inspected.stderr);
    assert!(inspected.stdout.contains("[8589934592]"), "{}", inspected.stdout);

    let converted = run("stride-0 convert", &["convert", text(&path), text(&out)]);
    converted.assert_refused(text(&path));
    assert!(converted.stderr.contains("`w`") && converted.stderr.contains("--allow-expansion"), "{}", converted.stderr);
    assert!(converted.stderr.contains("34359738368 bytes"), "{}", converted.stderr);
    assert!(!out.exists());

    let cast = run("stride-0 convert --dtype", &["convert", "--dtype", "bf16", text(&path), text(&out)]);
    cast.assert_refused(text(&path));

    // Asked for, the copy is attempted and the memory refused without an abort.
    let allowed = run("stride-0 convert --allow-expansion", &["convert", "--allow-expansion", text(&path), text(&out)]);
    allowed.assert_refused(text(&path));
    assert!(allowed.stderr.contains("cannot allocate 34359738368 bytes"), "{}", allowed.stderr);

    let archive = Archive::open(&path).unwrap();
    let tensor = archive.try_get("w").unwrap();
    assert_eq!(tensor.shape(), [1 << 33]);
    assert!(matches!(tensor.to_bytes(), Err(nnx::Error::Expansion { bytes, .. }) if bytes == 1 << 35));
    assert!(tensor.to_vec::<f32>().is_err());
    assert!(tensor.reshape(&[1 << 32, 2]).is_err());
    let small = tensor.narrow(0, 0, 1000).unwrap();
    assert_eq!(small.to_vec::<f32>().unwrap(), vec![1.0; 1000]);

    // Through the archive, the error names the file and the entry.
    let cast = archive.float("w", nnx::DType::BF16, &[1 << 33]);
    let Err(Error::Data { path: named, name, source }) = cast else { panic!("a data error: {cast:?}") };
    assert_eq!((named.as_path(), name.as_str()), (path.as_path(), "w"));
    assert!(matches!(*source, nnx::Error::Expansion { .. }), "{source}");
    let saved = archive.save(dir.path().join("copy.safetensors"));
    assert!(matches!(&saved, Err(Error::Data { name, .. }) if name == "w"), "{saved:?}");
}

#[test]
fn hostile_files_control_sequences_in_names_and_metadata_are_escaped() {
    let dir = scratch();
    let metadata = r#""__metadata__":{"note\u001b[2J":"clear\u001b[2J\u0007"},"#;
    let path = write(dir.path(), "escape.safetensors", &safetensors(metadata, "w\\u001b[2J"));
    let other = write(dir.path(), "other.safetensors", &safetensors("", "v\\u001b]0;title\\u0007"));

    let inspected = run("escape inspect", &["inspect", text(&path)]);
    assert_eq!(inspected.code, Some(0), "{}", inspected.stderr);
    assert!(!inspected.stdout.contains('\u{1b}') && !inspected.stdout.contains('\u{7}'), "{:?}", inspected.stdout);
    assert!(inspected.stdout.contains("w\\u{1b}[2J"), "{}", inspected.stdout);
    assert!(inspected.stdout.contains("note\\u{1b}[2J = clear\\u{1b}[2J\\u{7}"), "{}", inspected.stdout);

    let json = run("escape inspect --json", &["inspect", "--json", text(&path)]);
    assert_eq!(json.code, Some(0), "{}", json.stderr);
    assert!(!json.stdout.contains('\u{1b}'), "{:?}", json.stdout);

    let diffed = run("escape diff", &["diff", text(&path), text(&other)]);
    assert_eq!(diffed.code, Some(1), "{}", diffed.stderr);
    assert!(!diffed.stdout.contains('\u{1b}') && !diffed.stdout.contains('\u{7}'), "{:?}", diffed.stdout);

    // An error that quotes the file's own text: a refused global whose module is a control
    // sequence.
    let hostile = write(dir.path(), "escape.bin", b"\x80\x02c\x1b[2Jevil\nsystem\n.");
    let refused = run("escape error", &["inspect", text(&hostile)]);
    refused.assert_refused(text(&hostile));
    assert!(!refused.stderr.contains('\u{1b}'), "{:?}", refused.stderr);
    assert!(refused.stderr.contains("\\u{1b}[2Jevil.system"), "{}", refused.stderr);
}

#[test]
fn hostile_files_a_config_larger_than_any_configuration_is_refused_before_it_is_read() {
    use nnx::Pretrained;
    let dir = scratch();
    // 17 MiB of spaces: valid JSON around `{}`, far past what any configuration holds.
    let mut config = vec![b' '; 17 << 20];
    config.extend_from_slice(b"{}");
    let path = write(dir.path(), "config.json", &config);
    match nnx::models::gpt2::Gpt2::from_pretrained_folder(dir.path()) {
        Err(error @ Error::Config { problem: nnx::error::ConfigProblem::TooLarge { .. }, .. }) => {
            let message = error.to_string();
            assert!(message.contains(text(&path)) && message.contains("16777216-byte limit"), "{message}");
        }
        other => panic!("expected a refused configuration, got {:?}", other.err()),
    }
}

#[test]
fn hostile_files_gguf_metadata_of_millions_of_empty_strings_is_refused_in_little_memory() {
    // One array of 12 million empty strings: 8 bytes each in the file, far more once read.
    let count = 12_000_000u64;
    let mut bytes = b"GGUF".to_vec();
    bytes.extend_from_slice(&3u32.to_le_bytes());
    bytes.extend_from_slice(&0u64.to_le_bytes());
    bytes.extend_from_slice(&1u64.to_le_bytes());
    bytes.extend_from_slice(&(b"a.b".len() as u64).to_le_bytes());
    bytes.extend_from_slice(b"a.b");
    bytes.extend_from_slice(&9u32.to_le_bytes());
    bytes.extend_from_slice(&8u32.to_le_bytes());
    bytes.extend_from_slice(&count.to_le_bytes());
    bytes.resize(bytes.len() + count as usize * 8, 0);
    let dir = scratch();
    let path = write(dir.path(), "strings.gguf", &bytes);
    let bounded = run("gguf metadata of empty strings", &["inspect", text(&path)]);
    bounded.assert_refused(text(&path));
    assert!(bounded.stderr.contains("its metadata takes"), "{}", bounded.stderr);
    assert!(bounded.peak_memory < 640 << 20, "{} bytes", bounded.peak_memory);
}
