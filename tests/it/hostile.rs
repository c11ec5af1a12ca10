//! Hostile and invalid files: a corpus of damaged SafeTensors files, other formats and broken
//! shard indexes, each with the exact error it must give; and a property test that mutated
//! files never panic. A tracking allocator checks that no file makes nnx allocate what the
//! file merely claims.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::path::Path;

use nnx::error::{FileKind, HeaderProblem, ShardProblem};
use nnx::{Archive, Error};
use proptest::prelude::*;

use crate::util::{fixtures, scratch};

// ---------------------------------------------------------------------------------------------
// The largest single allocation made by the current thread.

thread_local! {
    static LARGEST_ALLOCATION: Cell<usize> = const { Cell::new(0) };
}

fn note_allocation(size: usize) {
    // `try_with`: allocations made while the thread is being torn down are not tracked.
    let _ = LARGEST_ALLOCATION.try_with(|largest| largest.set(largest.get().max(size)));
}

/// The system allocator, recording per thread the largest block asked for.
struct Tracking;

// SAFETY: every call is forwarded unchanged to the system allocator; the bookkeeping only reads
// the requested size and touches a thread-local `Cell` that never allocates.
unsafe impl GlobalAlloc for Tracking {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note_allocation(layout.size());
        // SAFETY: the caller's contract for `alloc` is passed on as it is.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note_allocation(layout.size());
        // SAFETY: the caller's contract for `alloc_zeroed` is passed on as it is.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note_allocation(new_size);
        // SAFETY: the caller's contract for `realloc` is passed on as it is.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract for `dealloc` is passed on as it is.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Tracking = Tracking;

/// Runs `work` and returns its value with the largest single allocation it made on this thread.
pub(crate) fn largest_allocation<T>(work: impl FnOnce() -> T) -> (T, usize) {
    LARGEST_ALLOCATION.with(|largest| largest.set(0));
    let value = work();
    (value, LARGEST_ALLOCATION.with(Cell::get))
}

/// No hostile file here is larger than a few KiB; nothing nnx allocates for it may be near the
/// sizes the files claim (100 MB and more).
pub(crate) const ALLOCATION_LIMIT: usize = 1 << 20;

// ---------------------------------------------------------------------------------------------
// Building files.

/// A file: the 8-byte little-endian length of `header`, `header`, then `data`.
pub(crate) fn file(header: &str, data: &[u8]) -> Vec<u8> {
    with_length(header.len() as u64, header.as_bytes(), data)
}

/// A file whose length prefix says `declared`, whatever follows.
fn with_length(declared: u64, header: &[u8], data: &[u8]) -> Vec<u8> {
    let mut bytes = declared.to_le_bytes().to_vec();
    bytes.extend_from_slice(header);
    bytes.extend_from_slice(data);
    bytes
}

/// The JSON of one entry.
pub(crate) fn entry(dtype: &str, shape: &str, begin: u64, end: u64) -> String {
    format!(r#"{{"dtype":"{dtype}","shape":{shape},"data_offsets":[{begin},{end}]}}"#)
}

/// A header of one F32 entry `w` of shape [2] (8 bytes), with `data` after it.
fn one_entry(data: &[u8]) -> Vec<u8> {
    file(&format!(r#"{{"w":{}}}"#, entry("F32", "[2]", 0, 8)), data)
}

/// A minimal zip: a local file header for `member`, then an end-of-central-directory record
/// naming it again (as a central directory would).
fn zip(members: &[&str]) -> Vec<u8> {
    let mut bytes = Vec::new();
    for member in members {
        bytes.extend_from_slice(b"PK\x03\x04\x14\x00\x00\x00\x00\x00");
        bytes.extend_from_slice(&[0; 16]);
        bytes.extend_from_slice(&(member.len() as u16).to_le_bytes());
        bytes.extend_from_slice(&[0, 0]);
        bytes.extend_from_slice(member.as_bytes());
        bytes.extend_from_slice(&[0x80, 0x02, b'.']);
    }
    for member in members {
        bytes.extend_from_slice(b"PK\x01\x02");
        bytes.extend_from_slice(&[0; 42]);
        bytes.extend_from_slice(member.as_bytes());
    }
    bytes.extend_from_slice(b"PK\x05\x06");
    bytes.extend_from_slice(&[0; 18]);
    bytes
}

// ---------------------------------------------------------------------------------------------
// The corpus.

/// What opening a file must give.
pub(crate) enum Expect {
    /// `Error::Header` with exactly this problem.
    Problem(HeaderProblem),
    /// `Error::Header` with a problem that passes the check (for parser messages, which are
    /// serde_json's wording).
    ProblemLike(Box<dyn Fn(&HeaderProblem) -> bool>),
    /// `Error::NotSafeTensors` of this kind.
    Kind(FileKind),
    /// Opening succeeds, but reading entry `name` gives `Error::Data`.
    BadData(&'static str),
}

/// One hostile file: a name, its bytes, the error it must give and words its message must hold
/// (besides the file's path).
pub(crate) struct Case {
    pub(crate) name: &'static str,
    pub(crate) bytes: Vec<u8>,
    pub(crate) expect: Expect,
    pub(crate) says: &'static [&'static str],
}

fn case(name: &'static str, bytes: Vec<u8>, expect: Expect, says: &'static [&'static str]) -> Case {
    Case { name, bytes, expect, says }
}

fn like(accept: impl Fn(&HeaderProblem) -> bool + 'static) -> Expect {
    Expect::ProblemLike(Box::new(accept))
}

fn bad_entry(name: &'static str, field_words: &'static str) -> impl Fn(&HeaderProblem) -> bool {
    move |problem| matches!(problem, HeaderProblem::BadEntry { name: found, message } if found == name && message.contains(field_words))
}

pub(crate) fn corpus() -> Vec<Case> {
    use Expect::{BadData, Kind, Problem};
    use HeaderProblem as P;

    let w = entry("F32", "[2]", 0, 8);
    let eight = [0u8; 8];
    let mut cases = vec![
        case("empty file", Vec::new(), Problem(P::Empty), &["empty", "write it again"]),
        case("1 byte", vec![0; 1], Problem(P::TooShort { len: 1 }), &["1 bytes", "truncated"]),
        case("2 bytes", vec![0; 2], Problem(P::TooShort { len: 2 }), &["2 bytes", "truncated"]),
        case("3 bytes", vec![0; 3], Problem(P::TooShort { len: 3 }), &["3 bytes", "truncated"]),
        case("4 bytes", vec![0; 4], Problem(P::TooShort { len: 4 }), &["4 bytes", "truncated"]),
        case("5 bytes", vec![0; 5], Problem(P::TooShort { len: 5 }), &["5 bytes", "truncated"]),
        case("6 bytes", vec![0; 6], Problem(P::TooShort { len: 6 }), &["6 bytes", "truncated"]),
        case("7 bytes", vec![7, 0, 0, 0, 0, 0, 0], Problem(P::TooShort { len: 7 }), &["7 bytes", "truncated"]),
        case(
            "header length past the end of the file",
            with_length(1000, b"{}", &[]),
            Problem(P::PastEnd { declared: 1000, file_len: 10 }),
            &["1000 bytes", "only 10", "truncated"],
        ),
        case(
            "header length over 100 MB in a small file",
            with_length(200_000_000, b"{}", &[]),
            Problem(P::TooLarge { declared: 200_000_000, limit: 100_000_000 }),
            &["200000000", "limit"],
        ),
        case(
            "header length u64::MAX",
            with_length(u64::MAX, b"{}", &[]),
            Problem(P::TooLarge { declared: u64::MAX, limit: 100_000_000 }),
            &["18446744073709551615"],
        ),
        case(
            "header length one past the 100 MB limit",
            with_length(100_000_001, b"{}", &[]),
            Problem(P::TooLarge { declared: 100_000_001, limit: 100_000_000 }),
            &["100000001"],
        ),
        case(
            "header not UTF-8",
            with_length(6, b"{\"a\xff\":", &[]),
            Problem(P::InvalidUtf8 { at: 3 }),
            &["not UTF-8", "offset 3"],
        ),
        case(
            "header not JSON",
            file("hello!!!", &[]),
            like(|p: &HeaderProblem| matches!(p, P::InvalidJson { .. })),
            &["not a JSON object"],
        ),
        case(
            "header empty (length 0)",
            file("", &[]),
            like(|p: &HeaderProblem| matches!(p, P::InvalidJson { .. })),
            &["not a JSON object"],
        ),
        case(
            "header is a JSON array",
            file("[]      ", &[]),
            like(|p: &HeaderProblem| matches!(p, P::InvalidJson { message } if message.contains("sequence"))),
            &["not a JSON object"],
        ),
        case(
            "header is a JSON string",
            file(r#""weights""#, &[]),
            like(|p: &HeaderProblem| matches!(p, P::InvalidJson { message } if message.contains("string"))),
            &["not a JSON object"],
        ),
        case(
            "header is a JSON number",
            file("42      ", &[]),
            like(|p: &HeaderProblem| matches!(p, P::InvalidJson { message } if message.contains("integer"))),
            &["not a JSON object"],
        ),
        case(
            "trailing garbage after the JSON object",
            file(&format!(r#"{{"w":{w}}} garbage"#), &eight),
            like(|p: &HeaderProblem| matches!(p, P::InvalidJson { message } if message.contains("trailing"))),
            &["not a JSON object"],
        ),
        case(
            "a second JSON object after the first",
            file(&format!(r#"{{"w":{w}}}{{}}"#), &eight),
            like(|p: &HeaderProblem| matches!(p, P::InvalidJson { message } if message.contains("trailing"))),
            &["not a JSON object"],
        ),
        case(
            "duplicate name, identical entries",
            file(&format!(r#"{{"w":{w},"w":{w}}}"#), &eight),
            Problem(P::DuplicateName { name: "w".into() }),
            &["`w` appears twice"],
        ),
        case(
            "duplicate name, differing entries",
            file(&format!(r#"{{"w":{w},"w":{}}}"#, entry("F32", "[2]", 8, 16)), &[0; 16]),
            Problem(P::DuplicateName { name: "w".into() }),
            &["`w` appears twice"],
        ),
        case(
            "duplicate __metadata__",
            file(&format!(r#"{{"__metadata__":{{"a":"1"}},"w":{w},"__metadata__":{{"a":"2"}}}}"#), &eight),
            Problem(P::DuplicateName { name: "__metadata__".into() }),
            &["`__metadata__` appears twice"],
        ),
        case("empty name", file(&format!(r#"{{"":{w}}}"#), &eight), Problem(P::EmptyName), &["empty name"]),
        case(
            "missing dtype",
            file(r#"{"w":{"shape":[2],"data_offsets":[0,8]}}"#, &eight),
            like(bad_entry("w", "missing field `dtype`")),
            &["entry `w`", "dtype"],
        ),
        case(
            "missing shape",
            file(r#"{"w":{"dtype":"F32","data_offsets":[0,8]}}"#, &eight),
            like(bad_entry("w", "missing field `shape`")),
            &["entry `w`", "shape"],
        ),
        case(
            "missing data_offsets",
            file(r#"{"w":{"dtype":"F32","shape":[2]}}"#, &eight),
            like(bad_entry("w", "missing field `data_offsets`")),
            &["entry `w`", "data_offsets"],
        ),
        case(
            "entry is not an object",
            file(r#"{"w":[1,2,3]}"#, &[]),
            like(bad_entry("w", "invalid type")),
            &["entry `w`"],
        ),
        case(
            "shape as a string",
            file(r#"{"w":{"dtype":"F32","shape":"[2]","data_offsets":[0,8]}}"#, &eight),
            like(bad_entry("w", "invalid type: string")),
            &["entry `w`"],
        ),
        case(
            "negative dimension",
            file(r#"{"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}}"#, &eight),
            like(bad_entry("w", "invalid value: integer `-2`")),
            &["entry `w`"],
        ),
        case(
            "float offsets",
            file(r#"{"w":{"dtype":"F32","shape":[2],"data_offsets":[0.0,8.0]}}"#, &eight),
            like(bad_entry("w", "invalid type: floating point")),
            &["entry `w`"],
        ),
        case(
            "three data_offsets",
            file(r#"{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8,8]}}"#, &eight),
            like(bad_entry("w", "trailing")),
            &["entry `w`"],
        ),
        case(
            "unknown dtype F128",
            file(&format!(r#"{{"w":{}}}"#, entry("F128", "[2]", 0, 32)), &[0; 32]),
            Problem(P::UnknownDType { name: "w".into(), dtype: "F128".into() }),
            &["`F128`", "does not define"],
        ),
        case(
            "lowercase dtype f32",
            file(&format!(r#"{{"w":{}}}"#, entry("f32", "[2]", 0, 8)), &eight),
            Problem(P::UnknownDType { name: "w".into(), dtype: "f32".into() }),
            &["`f32`"],
        ),
        case(
            "__metadata__ is an array",
            file(&format!(r#"{{"__metadata__":["a"],"w":{w}}}"#), &eight),
            Problem(P::BadMetadata { key: None, found: "an array".into() }),
            &["`__metadata__` is an array"],
        ),
        case(
            "__metadata__ value is a number",
            file(&format!(r#"{{"__metadata__":{{"layers":12}},"w":{w}}}"#), &eight),
            Problem(P::BadMetadata { key: Some("layers".into()), found: "a number".into() }),
            &["`layers` is a number", "JSON strings"],
        ),
        case(
            "__metadata__ value is a nested object",
            file(&format!(r#"{{"__metadata__":{{"config":{{"layers":"12"}}}},"w":{w}}}"#), &eight),
            Problem(P::BadMetadata { key: Some("config".into()), found: "an object".into() }),
            &["`config` is an object"],
        ),
        case(
            "shape whose element count overflows u64",
            file(&format!(r#"{{"w":{}}}"#, entry("U8", "[4294967296,4294967296]", 0, 8)), &eight),
            Problem(P::Overflow { name: "w".into(), shape: vec![1 << 32, 1 << 32] }),
            &["entry `w`", "overflows"],
        ),
        case(
            "shape whose byte size overflows u64",
            file(&format!(r#"{{"w":{}}}"#, entry("F64", "[2305843009213693952]", 0, 8)), &eight),
            Problem(P::Overflow { name: "w".into(), shape: vec![1 << 61] }),
            &["entry `w`", "overflows"],
        ),
        case(
            "data_offsets reversed",
            file(&format!(r#"{{"w":{}}}"#, entry("F32", "[0]", 8, 0)), &eight),
            Problem(P::Reversed { name: "w".into(), begin: 8, end: 0 }),
            &["[8, 0]", "ending before it begins"],
        ),
        case(
            "byte length too small for the shape",
            file(&format!(r#"{{"w":{}}}"#, entry("F32", "[2]", 0, 4)), &[0; 4]),
            Problem(P::ByteLength { name: "w".into(), dtype: nnx::DType::F32, shape: vec![2], expected: 8, found: 4 }),
            &["takes 8 bytes", "span 4"],
        ),
        case(
            "byte length too large for the shape",
            file(&format!(r#"{{"w":{}}}"#, entry("F32", "[2]", 0, 12)), &[0; 12]),
            Problem(P::ByteLength { name: "w".into(), dtype: nnx::DType::F32, shape: vec![2], expected: 8, found: 12 }),
            &["takes 8 bytes", "span 12"],
        ),
        case(
            "hole between entries",
            file(&format!(r#"{{"a":{},"b":{}}}"#, entry("F32", "[1]", 0, 4), entry("F32", "[1]", 8, 12)), &[0; 12]),
            Problem(P::Hole { name: "b".into(), expected: 4, found: 8 }),
            &["entry `b`", "hole"],
        ),
        case(
            "hole before the first entry",
            file(&format!(r#"{{"a":{}}}"#, entry("F32", "[1]", 4, 8)), &eight),
            Problem(P::Hole { name: "a".into(), expected: 0, found: 4 }),
            &["entry `a`", "hole"],
        ),
        case(
            "overlapping entries",
            file(&format!(r#"{{"a":{},"b":{}}}"#, entry("F32", "[2]", 0, 8), entry("F32", "[2]", 4, 12)), &[0; 12]),
            Problem(P::Overlap { name: "b".into(), other: "a".into() }),
            &["`a` and `b` share bytes"],
        ),
        case(
            "two entries on the same bytes",
            file(&format!(r#"{{"a":{w},"b":{w}}}"#), &eight),
            Problem(P::Overlap { name: "b".into(), other: "a".into() }),
            &["`a` and `b` share bytes"],
        ),
        case(
            "entry data past the end of the file (truncated)",
            one_entry(&[0; 5]),
            like(
                |p: &HeaderProblem| matches!(p, P::DataPastEnd { name, end, file_len } if name == "w" && *end == *file_len as u64 + 3),
            ),
            &["entry `w`", "truncated"],
        ),
        case(
            "trailing bytes after the last entry",
            one_entry(&[0; 12]),
            Problem(P::Trailing { bytes: 4 }),
            &["4 bytes follow the last entry"],
        ),
        case(
            "F4 tensor with an odd element count",
            file(&format!(r#"{{"w":{}}}"#, entry("F4", "[3]", 0, 2)), &[0; 2]),
            Problem(P::PartialByte { name: "w".into(), dtype: nnx::DType::F4, shape: vec![3] }),
            &["entry `w`", "whole bytes"],
        ),
        case(
            "F6 tensor that does not fill whole bytes",
            file(&format!(r#"{{"w":{}}}"#, entry("F6_E2M3", "[2]", 0, 2)), &[0; 2]),
            Problem(P::PartialByte { name: "w".into(), dtype: nnx::DType::F6E2M3, shape: vec![2] }),
            &["entry `w`", "whole bytes"],
        ),
        case(
            "header of 0x280 bytes (starts like a pickle) with truncated data",
            {
                let mut header = format!(r#"{{"w":{w}}}"#);
                header.extend(std::iter::repeat_n(' ', 0x280 - header.len()));
                file(&header, &[0; 4])
            },
            like(|p: &HeaderProblem| matches!(p, P::DataPastEnd { name, .. } if name == "w")),
            &["entry `w`", "truncated"],
        ),
        case(
            "BOOL entry holding a byte 2",
            file(&format!(r#"{{"flags":{}}}"#, entry("BOOL", "[4]", 0, 4)), &[0, 1, 2, 0]),
            BadData("flags"),
            &["`flags`", "invalid data"],
        ),
        case(
            "PyTorch zip checkpoint",
            zip(&["archive/version", "archive/data.pkl", "archive/data/0"]),
            Kind(FileKind::PyTorchZip),
            &["PyTorch checkpoint", "safetensors.torch.save_file"],
        ),
        case(
            "legacy pickle checkpoint",
            b"\x80\x02\x8a\x0al\xfc\x9cF\xf9 j\xa8P\x19.\x80\x02M\xe9\x03.".to_vec(),
            Kind(FileKind::Pickle),
            &["pickle", "safetensors.torch.save_file"],
        ),
        case(
            "GGUF file",
            [b"GGUF\x03\x00\x00\x00".as_slice(), &[0; 24]].concat(),
            Kind(FileKind::Gguf),
            &["GGUF", "download the SafeTensors weights"],
        ),
        case(
            "NumPy .npy array",
            [b"\x93NUMPY\x01\x00v\x00".as_slice(), b"{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }"]
                .concat(),
            Kind(FileKind::Npy),
            &["`.npy`", "safetensors.numpy.save_file"],
        ),
        case(
            "NumPy .npz archive",
            zip(&["arr_0.npy", "arr_1.npy"]),
            Kind(FileKind::Npz),
            &["`.npz`", "safetensors.numpy.save_file"],
        ),
        case(
            "other zip archive",
            zip(&["model/model.safetensors"]),
            Kind(FileKind::Zip),
            &["zip archive", "unpack it"],
        ),
        case(
            "HDF5 file",
            [b"\x89HDF\r\n\x1a\n".as_slice(), &[0; 40]].concat(),
            Kind(FileKind::Hdf5),
            &["HDF5", "export the weights"],
        ),
        case(
            "Git LFS pointer",
            b"version https://git-lfs.github.com/spec/v1\n\
              oid sha256:4d7a214614ab2935c943f9e0ff69d22eadbb8f32b1258daaa5e2ca24d17e2393\n\
              size 548105171\n"
                .to_vec(),
            Kind(FileKind::Text),
            &["text file", "Git LFS pointer", "download the file itself"],
        ),
        case(
            "HTML error page",
            b"<!DOCTYPE html>\n<html><body>404 Not Found</body></html>\n".to_vec(),
            Kind(FileKind::Text),
            &["text file", "error page"],
        ),
    ];
    // A zero-size entry still has a place: inside another entry's bytes is an overlap.
    cases.push(case(
        "zero-size entry inside another entry",
        file(&format!(r#"{{"a":{},"e":{}}}"#, entry("F32", "[2]", 0, 8), entry("F32", "[0]", 4, 4)), &eight),
        Problem(P::Overlap { name: "e".into(), other: "a".into() }),
        &["`a` and `e` share bytes"],
    ));
    cases
}

/// Opens `path` and checks the outcome against `expect`; panics with the case's name.
fn check(name: &str, path: &Path, expect: &Expect, says: &[&str]) {
    let (outcome, largest) = largest_allocation(|| {
        let opened = Archive::open(path);
        match (expect, opened) {
            (Expect::BadData(entry), Ok(archive)) => archive.try_get(entry).map(drop),
            (_, opened) => opened.map(drop),
        }
    });
    assert!(largest < ALLOCATION_LIMIT, "{name}: allocated a block of {largest} bytes");
    let error = match outcome {
        Ok(()) => panic!("{name}: expected an error, got none"),
        Err(error) => error,
    };
    match (expect, &error) {
        (Expect::Problem(expected), Error::Header { path: at, problem }) => {
            assert_eq!(problem, expected, "{name}");
            assert_eq!(at, path, "{name}");
        }
        (Expect::ProblemLike(accept), Error::Header { path: at, problem }) => {
            assert!(accept(problem), "{name}: unexpected problem {problem:?}");
            assert_eq!(at, path, "{name}");
        }
        (Expect::Kind(expected), Error::NotSafeTensors { path: at, kind }) => {
            assert_eq!(kind, expected, "{name}");
            assert_eq!(at, path, "{name}");
            assert!(error.to_string().contains(&expected.to_string()), "{name}: {error}");
            assert!(error.to_string().contains(expected.advice()), "{name}: {error}");
        }
        (Expect::BadData(entry), Error::Data { path: at, name: found, source }) => {
            assert_eq!(found, entry, "{name}");
            assert_eq!(at, path, "{name}");
            assert!(matches!(**source, nnx::Error::InvalidBool { .. }), "{name}: {source:?}");
        }
        (_, other) => panic!("{name}: unexpected error {other:?}"),
    }
    let message = error.to_string();
    assert!(message.contains(&format!("`{}`", path.display())), "{name}: message does not name the file: {message}");
    for words in says {
        assert!(message.contains(words), "{name}: message lacks {words:?}: {message}");
    }
}

#[test]
fn the_allocation_tracker_sees_large_blocks() {
    let (block, largest) = largest_allocation(|| vec![0u8; 2 * ALLOCATION_LIMIT]);
    assert!(largest >= block.len(), "tracked {largest} bytes for a block of {}", block.len());
}

#[test]
fn corpus_of_hostile_files_gives_exact_errors() {
    let dir = scratch();
    let cases = corpus();
    assert!(cases.len() >= 34, "the corpus shrank to {} cases", cases.len());
    for (at, case) in cases.iter().enumerate() {
        let path = dir.path().join(format!("case-{at:02}.safetensors"));
        std::fs::write(&path, &case.bytes).unwrap();
        check(case.name, &path, &case.expect, case.says);
    }
}

#[test]
fn bool_entry_with_valid_bytes_reads() {
    let dir = scratch();
    let path = dir.path().join("flags.safetensors");
    std::fs::write(&path, file(&format!(r#"{{"flags":{}}}"#, entry("BOOL", "[4]", 0, 4)), &[0, 1, 1, 0])).unwrap();
    let archive = Archive::open(&path).unwrap();
    assert_eq!(archive.try_get("flags").unwrap().to_vec::<bool>().unwrap(), [false, true, true, false]);
}

#[test]
fn pytorch_fixtures_named_as_safetensors_are_recognised() {
    let torch = fixtures().join("torch");
    let dir = scratch();
    for (name, kind) in [("state_zip.pt", FileKind::PyTorchZip), ("state_legacy.pt", FileKind::Pickle)] {
        // Read as checkpoints under their own names; a `.safetensors` name says the file is
        // expected to be SafeTensors, and the error says what it is instead.
        assert!(Archive::open(torch.join(name)).is_ok(), "{name}");
        let name = format!("{name}.safetensors");
        let path = dir.path().join(&name);
        std::fs::copy(torch.join(name.trim_end_matches(".safetensors")), &path).unwrap();
        match Archive::open(&path) {
            Err(Error::NotSafeTensors { path: at, kind: found }) => {
                assert_eq!(found, kind, "{name}");
                assert_eq!(at, path);
            }
            other => panic!("{name}: expected NotSafeTensors, got {other:?}"),
        }
        let message = Archive::open(&path).unwrap_err().to_string();
        assert!(message.contains(&name) && message.contains("PyTorch"), "{message}");
        assert!(message.contains("safetensors.torch.save_file"), "{message}");
    }
}

// ---------------------------------------------------------------------------------------------
// Shard indexes.

/// A SafeTensors file of F32 [1] entries, named `names`, with values 0, 1, ...
fn shard_bytes(names: &[&str]) -> Vec<u8> {
    let entries: Vec<String> = names
        .iter()
        .enumerate()
        .map(|(at, name)| format!(r#""{name}":{}"#, entry("F32", "[1]", at as u64 * 4, at as u64 * 4 + 4)))
        .collect();
    let data: Vec<u8> = (0..names.len()).flat_map(|at| (at as f32).to_le_bytes()).collect();
    file(&format!("{{{}}}", entries.join(",")), &data)
}

/// Writes `index` as `model.safetensors.index.json` and each shard beside it.
fn sharded(dir: &Path, index: &str, shards: &[(&str, &[&str])]) -> std::path::PathBuf {
    for (name, entries) in shards {
        std::fs::write(dir.join(name), shard_bytes(entries)).unwrap();
    }
    let path = dir.join("model.safetensors.index.json");
    std::fs::write(&path, index).unwrap();
    path
}

/// Opening must fail with `Error::Index` whose reason holds `words`.
fn index_error(index: &str, words: &str) {
    let dir = scratch();
    let path = sharded(dir.path(), index, &[("a.safetensors", &["x"])]);
    match Archive::open(&path) {
        Err(error @ Error::Index { .. }) => {
            let Error::Index { path: at, problem } = &error else { unreachable!() };
            assert_eq!(at, &path);
            let reason = problem.to_string();
            assert!(reason.contains(words), "{reason}");
            let message = error.to_string();
            assert!(message.contains("model.safetensors.index.json") && message.contains(words), "{message}");
        }
        other => panic!("expected an index error for {index:?}, got {other:?}"),
    }
}

#[test]
fn index_that_is_not_json() {
    index_error("weight_map: x -> a.safetensors", "not JSON");
}

#[test]
fn index_that_is_a_json_array() {
    index_error(r#"[{"weight_map": {"x": "a.safetensors"}}]"#, "not a JSON object");
}

#[test]
fn index_without_weight_map() {
    index_error(r#"{"metadata": {"total_size": 4}}"#, "no `weight_map`");
}

#[test]
fn index_with_weight_map_not_an_object_of_strings() {
    index_error(r#"{"weight_map": {"x": 1}}"#, "not an object of strings");
}

#[test]
fn index_listing_a_name_twice() {
    index_error(r#"{"weight_map": {"x": "a.safetensors", "x": "b.safetensors"}}"#, "`x` is listed twice");
}

#[test]
fn index_listing_a_name_twice_in_one_shard() {
    index_error(r#"{"weight_map": {"x": "a.safetensors", "x": "a.safetensors"}}"#, "`x` is listed twice");
}

#[test]
fn index_with_two_weight_maps() {
    index_error(r#"{"weight_map": {"x": "a.safetensors"}, "weight_map": {"y": "a.safetensors"}}"#, "`weight_map`");
}

#[test]
fn index_naming_a_shard_with_a_slash() {
    index_error(r#"{"weight_map": {"x": "../a.safetensors"}}"#, "not a file name beside the index");
    index_error(r#"{"weight_map": {"x": "/etc/a.safetensors"}}"#, "not a file name beside the index");
    index_error(r#"{"weight_map": {"x": "sub\\a.safetensors"}}"#, "not a file name beside the index");
}

#[test]
fn missing_shard_is_reported_when_needed() {
    let dir = scratch();
    let index = r#"{"weight_map": {"x": "a.safetensors", "y": "gone.safetensors"}}"#;
    let path = sharded(dir.path(), index, &[("a.safetensors", &["x"])]);
    let archive = Archive::open(&path).expect("shards are opened when needed, not at open");
    assert_eq!(archive.try_get("x").unwrap().to_vec::<f32>().unwrap(), [0.0]);
    match archive.try_get("y") {
        Err(error @ Error::MissingShard { .. }) => {
            let Error::MissingShard { index, shard } = &error else { unreachable!() };
            assert_eq!(index, &path);
            assert_eq!(shard, &dir.path().join("gone.safetensors"));
            let message = error.to_string();
            assert!(message.contains(&dir.path().join("gone.safetensors").display().to_string()), "{message}");
            assert!(message.contains("download or copy the missing shard"), "{message}");
        }
        other => panic!("expected MissingShard, got {other:?}"),
    }
}

#[test]
fn name_in_two_shards_is_a_mismatch() {
    let dir = scratch();
    // `y` is in shard a, but the index puts it in shard b (which also has it).
    let index = r#"{"weight_map": {"x": "a.safetensors", "y": "b.safetensors"}}"#;
    let path = sharded(dir.path(), index, &[("a.safetensors", &["x", "y"]), ("b.safetensors", &["y"])]);
    let archive = Archive::open(&path).unwrap();
    match archive.try_get("x") {
        Err(error @ Error::ShardMismatch { .. }) => {
            let Error::ShardMismatch { index, shard, problem } = &error else { unreachable!() };
            assert_eq!(index, &path);
            assert_eq!(shard, &dir.path().join("a.safetensors"));
            let ShardProblem::ElsewhereInIndex { name, other } = problem else { panic!("{problem:?}") };
            assert_eq!((name.as_str(), other), ("y", &dir.path().join("b.safetensors")));
            let reason = problem.to_string();
            assert!(reason.contains("`y`") && reason.contains("b.safetensors"), "{reason}");
            assert!(error.to_string().contains("a.safetensors"), "{error}");
        }
        other => panic!("expected ShardMismatch, got {other:?}"),
    }
    // Shard b agrees with the index on its own.
    assert_eq!(archive.try_get("y").unwrap().to_vec::<f32>().unwrap(), [0.0]);
}

#[test]
fn index_entry_missing_from_its_shard() {
    let dir = scratch();
    let index = r#"{"weight_map": {"x": "a.safetensors", "z": "a.safetensors"}}"#;
    let path = sharded(dir.path(), index, &[("a.safetensors", &["x"])]);
    let archive = Archive::open(&path).unwrap();
    assert_eq!(archive.try_get("x").unwrap().to_vec::<f32>().unwrap(), [0.0]);
    match archive.try_get("z") {
        Err(error @ Error::ShardMismatch { .. }) => {
            let Error::ShardMismatch { shard, problem, .. } = &error else { unreachable!() };
            assert_eq!(shard, &dir.path().join("a.safetensors"));
            assert_eq!(problem, &ShardProblem::MissingEntry { name: "z".into() });
            let reason = problem.to_string();
            assert!(reason.contains("`z`") && reason.contains("no such entry"), "{reason}");
        }
        other => panic!("expected ShardMismatch, got {other:?}"),
    }
}

#[test]
fn damaged_shard_names_the_shard() {
    let dir = scratch();
    let index = r#"{"weight_map": {"x": "a.safetensors"}}"#;
    let path = sharded(dir.path(), index, &[]);
    std::fs::write(dir.path().join("a.safetensors"), one_entry(&[0; 3])).unwrap();
    let archive = Archive::open(&path).unwrap();
    match archive.try_get("x") {
        Err(Error::Header { path, problem: HeaderProblem::DataPastEnd { name, .. } }) => {
            assert_eq!(path, dir.path().join("a.safetensors"));
            assert_eq!(name, "w");
        }
        other => panic!("expected a header error for the shard, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// Mutations of a valid file.

/// A small valid file with entries of several dtypes and alignments.
fn valid_file() -> Vec<u8> {
    let header = format!(
        r#"{{"__metadata__":{{"format":"pt"}},"a":{},"b":{},"c":{},"d":{},"e":{}}}"#,
        entry("F32", "[2,2]", 0, 16),
        entry("BF16", "[3]", 16, 22),
        entry("BOOL", "[2]", 22, 24),
        entry("F4", "[4]", 24, 26),
        entry("I64", "[]", 26, 34),
    );
    let mut data: Vec<u8> = [1.0f32, 2.0, 3.0, 4.0].iter().flat_map(|v| v.to_le_bytes()).collect();
    data.extend_from_slice(&[0x80, 0x3f, 0, 0x40, 0x40, 0x40]);
    data.extend_from_slice(&[1, 0]);
    data.extend_from_slice(&[0x12, 0x34]);
    data.extend_from_slice(&(-7i64).to_le_bytes());
    file(&header, &data)
}

#[test]
fn the_mutation_seed_is_valid() {
    let dir = scratch();
    let path = dir.path().join("valid.safetensors");
    std::fs::write(&path, valid_file()).unwrap();
    let archive = Archive::open(&path).unwrap();
    assert_eq!(archive.names().collect::<Vec<_>>(), ["a", "b", "c", "d", "e"]);
    for name in ["a", "b", "c", "d", "e"] {
        archive.try_get(name).unwrap();
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn mutated_files_never_panic(
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..6),
        cut in proptest::option::of(any::<prop::sample::Index>()),
        insert in proptest::option::of((any::<prop::sample::Index>(), proptest::collection::vec(any::<u8>(), 1..4))),
    ) {
        let mut bytes = valid_file();
        for (at, value) in edits {
            let at = at.index(bytes.len());
            bytes[at] = value;
        }
        if let Some((at, extra)) = insert {
            let at = at.index(bytes.len());
            bytes.splice(at..at, extra);
        }
        if let Some(cut) = cut {
            bytes.truncate(cut.index(bytes.len()));
        }
        let dir = scratch();
        let path = dir.path().join("mutated.safetensors");
        std::fs::write(&path, &bytes).unwrap();
        let (_, largest) = largest_allocation(|| {
            if let Ok(archive) = Archive::open(&path) {
                for name in archive.names() {
                    if let Ok(tensor) = archive.try_get(name) {
                        let _ = tensor.to_bytes();
                        let _ = archive.info(name);
                    }
                }
            }
        });
        prop_assert!(largest < ALLOCATION_LIMIT, "allocated a block of {} bytes", largest);
    }
}
