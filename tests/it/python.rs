//! Cross-implementation checks with the reference Python `safetensors` package: files nnx
//! writes (plain, page-aligned, sharded) read back in Python with the same bytes, files Python
//! writes open in nnx with the same bytes, and MLX's unpadded files read alike in both.
//!
//! The interpreter is `$NNX_PYTHON` (else `python3`) and must import `safetensors`, `numpy` and
//! `ml_dtypes`; without them these tests fail and say how to install them.

use std::path::Path;
use std::process::Command;
use std::sync::OnceLock;

use half::{bf16, f16};
use nnx::{Archive, DType, SaveOptions, Tensor};
use serde_json::Value;

use crate::util::{fixtures, scratch};

/// The page of page-aligned files.
const PAGE: usize = 16 * 1024;

/// The Python side: `read PATH` describes a `.safetensors` file or a shard index, `write FOLDER`
/// writes a file with `safetensors.numpy.save_file` and describes what it wrote. Each tensor is
/// described by its numpy dtype name, shape, row-major bytes in hex and values.
const SCRIPT: &str = r#"
import json, os, struct, sys
import numpy as np
import ml_dtypes
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

PAGE = 16384
FLOATS = ("float16", "bfloat16", "float32", "float64")

def describe(arr):
    flat = arr.reshape(-1)
    values = flat.astype(np.float64).tolist() if arr.dtype.name in FLOATS else flat.tolist()
    return {"dtype": arr.dtype.name, "shape": list(arr.shape), "hex": arr.tobytes(order="C").hex(), "values": values}

def read_file(path):
    tensors = {name: describe(arr) for name, arr in load_file(path).items()}
    with safe_open(path, framework="np") as f:
        metadata = f.metadata() or {}
        for name in f.keys():
            assert f.get_tensor(name).tobytes().hex() == tensors[name]["hex"], name
    with open(path, "rb") as fh:
        length = struct.unpack("<Q", fh.read(8))[0]
        header = json.loads(fh.read(length))
    data_start = 8 + length
    offsets = {k: v["data_offsets"] for k, v in header.items() if k != "__metadata__"}
    page_sized = {
        k: (data_start + begin) % PAGE == 0
        for k, (begin, end) in offsets.items()
        if end > begin and (end - begin) % PAGE == 0
    }
    return {
        "metadata": metadata,
        "tensors": tensors,
        "data_start": data_start,
        "data_start_on_page": data_start % PAGE == 0,
        "page_sized": page_sized,
    }

def read_index(path):
    with open(path) as fh:
        index = json.load(fh)
    folder = os.path.dirname(path)
    shards, tensors = {}, {}
    for name, shard in index["weight_map"].items():
        if shard not in shards:
            shards[shard] = read_file(os.path.join(folder, shard))
        tensors[name] = shards[shard]["tensors"][name]
    for shard, described in shards.items():
        for name in described["tensors"]:
            assert index["weight_map"][name] == shard, (name, shard)
    return {"metadata": index.get("metadata", {}), "weight_map": index["weight_map"], "shards": shards, "tensors": tensors}

def write(folder):
    arrays = {
        "f32": (np.arange(12, dtype=np.float32) * 0.25 - 1).reshape(3, 4),
        "f16": np.array([0.5, -1.5, 65504, 6e-5], dtype=np.float16),
        "bf16": np.array([[1.0, -2.5], [3.140625, 1e30]], dtype=ml_dtypes.bfloat16),
        "f64": np.array([np.pi, -0.0, 1e-300]),
        "i64": np.array([np.iinfo(np.int64).min, -1, np.iinfo(np.int64).max], dtype=np.int64),
        "i32": np.arange(-3, 3, dtype=np.int32).reshape(2, 3),
        "i16": np.array([-32768, 32767], dtype=np.int16),
        "u8": np.arange(250, 256, dtype=np.uint8),
        "i8": np.array([-128, 0, 127], dtype=np.int8),
        "bool": np.array([[True, False, True]]),
        "u16": np.array([0, 65535], dtype=np.uint16),
        "u32": np.array([4294967295], dtype=np.uint32),
        "u64": np.array([2**64 - 1], dtype=np.uint64),
        "scalar": np.array(7.5, dtype=np.float32),
        "empty": np.zeros((0, 5), dtype=np.float32),
        "transposed": np.ascontiguousarray(np.arange(6, dtype=np.float32).reshape(2, 3).T),
    }
    path = os.path.join(folder, "python.safetensors")
    metadata = {"format": "np", "config": json.dumps({"layers": 2, "name": "tiny"})}
    save_file(arrays, path, metadata=metadata)
    print(json.dumps({"path": path, "metadata": metadata, "tensors": {k: describe(v) for k, v in arrays.items()}}))

mode, target = sys.argv[1], sys.argv[2]
if mode == "write":
    write(target)
elif target.endswith(".json"):
    print(json.dumps(read_index(target)))
else:
    print(json.dumps(read_file(target)))
"#;

/// The interpreter named by `NNX_PYTHON`, else the one `scripts/setup.sh` installs under
/// `$NNX_CACHE` (default `~/.cache/nnx`), else `python3`.
pub(crate) fn interpreter() -> String {
    if let Ok(python) = std::env::var("NNX_PYTHON") {
        return python;
    }
    let python = crate::util::cache_dir().join("venv").join("bin").join("python");
    if python.is_file() { python.display().to_string() } else { "python3".into() }
}

/// Fails (never skips) when the interpreter cannot import the reference packages.
fn require_python() {
    static CHECKED: OnceLock<Result<(), String>> = OnceLock::new();
    let checked = CHECKED.get_or_init(|| {
        let python = interpreter();
        let output = Command::new(&python).args(["-c", "import safetensors, numpy, ml_dtypes"]).output();
        match output {
            Ok(output) if output.status.success() => Ok(()),
            Ok(output) => {
                Err(format!("`{python}` cannot import them: {}", String::from_utf8_lossy(&output.stderr).trim()))
            }
            Err(error) => Err(format!("`{python}` cannot be run: {error}")),
        }
    });
    if let Err(why) = checked {
        panic!(
            "the cross-implementation tests need Python with `safetensors`, `numpy` and `ml_dtypes`; {why}. \
             Run `scripts/setup.sh` (or `.ci/run`), or `pip install safetensors numpy ml_dtypes` and set NNX_PYTHON to that interpreter"
        );
    }
}

/// Runs the script in `mode` on `target` and parses what it prints.
fn python(mode: &str, target: &Path) -> Value {
    require_python();
    let output = Command::new(interpreter())
        .arg("-c")
        .arg(SCRIPT)
        .arg(mode)
        .arg(target)
        .output()
        .expect("the interpreter ran a moment ago");
    assert!(
        output.status.success(),
        "python `{mode}` on `{}` failed:\n{}",
        target.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("the script prints JSON")
}

/// The numpy name of a dtype, as the Python side reports it.
fn numpy_name(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "float32",
        DType::F16 => "float16",
        DType::BF16 => "bfloat16",
        DType::F64 => "float64",
        DType::I64 => "int64",
        DType::I32 => "int32",
        DType::I16 => "int16",
        DType::I8 => "int8",
        DType::U8 => "uint8",
        DType::U16 => "uint16",
        DType::U32 => "uint32",
        DType::U64 => "uint64",
        DType::Bool => "bool",
        other => panic!("no numpy dtype for {other} in these tests"),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// A tensor's values, row-major, as Python's JSON would print them (floats widened to f64).
fn values(tensor: &Tensor) -> Vec<Value> {
    fn all<T: nnx::Element>(tensor: &Tensor, to: impl Fn(T) -> Value) -> Vec<Value> {
        tensor.to_vec::<T>().unwrap().into_iter().map(to).collect()
    }
    match tensor.dtype() {
        DType::F32 => all(tensor, |v: f32| f64::from(v).into()),
        DType::F16 => all(tensor, |v: f16| v.to_f64().into()),
        DType::BF16 => all(tensor, |v: bf16| v.to_f64().into()),
        DType::F64 => all(tensor, |v: f64| v.into()),
        DType::I64 => all(tensor, |v: i64| v.into()),
        DType::I32 => all(tensor, |v: i32| v.into()),
        DType::I16 => all(tensor, |v: i16| v.into()),
        DType::I8 => all(tensor, |v: i8| v.into()),
        DType::U8 => all(tensor, |v: u8| v.into()),
        DType::U16 => all(tensor, |v: u16| v.into()),
        DType::U32 => all(tensor, |v: u32| v.into()),
        DType::U64 => all(tensor, |v: u64| v.into()),
        DType::Bool => all(tensor, |v: bool| v.into()),
        other => panic!("no values for {other} in these tests"),
    }
}

/// Two JSON values equal, floats within a relative 1e-12 (JSON float text may round by an ulp).
fn same_value(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) if x.is_f64() || y.is_f64() => {
            let (x, y) = (x.as_f64().unwrap(), y.as_f64().unwrap());
            x == y || (x - y).abs() <= 1e-12 * x.abs().max(y.abs())
        }
        _ => a == b,
    }
}

/// Checks a tensor against Python's description of the same entry: dtype, shape, bytes, values.
fn assert_described(name: &str, tensor: &Tensor, described: &Value) {
    assert_eq!(described["dtype"], numpy_name(tensor.dtype()), "{name}: dtype");
    let shape: Vec<usize> = serde_json::from_value(described["shape"].clone()).unwrap();
    assert_eq!(shape, tensor.shape(), "{name}: shape");
    assert_eq!(described["hex"], hex(&tensor.to_bytes().unwrap()), "{name}: bytes");
    let expected = described["values"].as_array().unwrap();
    let found = values(tensor);
    assert_eq!(expected.len(), found.len(), "{name}: element count");
    for (at, (expected, found)) in expected.iter().zip(&found).enumerate() {
        assert!(same_value(expected, found), "{name}[{at}]: python {expected}, nnx {found}");
    }
}

fn bytes_of<T: Copy, const N: usize>(values: &[T], to_le: impl Fn(T) -> [u8; N]) -> Vec<u8> {
    values.iter().flat_map(|&value| to_le(value)).collect()
}

/// What nnx writes: name, tensor (some of them strided views) and the bytes a reader must find,
/// computed here from the values, not by nnx.
fn written() -> Vec<(&'static str, Tensor, Vec<u8>)> {
    let f32s: Vec<f32> = (0..6).map(|i| i as f32 * 0.5 - 1.0).collect();
    let f16s = [0.5f32, -1.5, 65504.0, 6.1035156e-5].map(f16::from_f32);
    let bf16s = [1.0f32, -2.5, 3.140625, 1e30].map(bf16::from_f32);
    let f64s = [std::f64::consts::PI, -0.0, 1e-300];
    let i64s = [i64::MIN, -1, i64::MAX];
    let u8s = [0u8, 1, 254, 255];
    let i8s = [-128i8, -1, 0, 127];
    let u16s = [0u16, 1, 65535];
    let grid: Vec<i32> = (0..16).collect();
    let page: Vec<f32> = (0..64 * 64).map(|i| i as f32).collect();
    let page_transposed: Vec<f32> = (0..64).flat_map(|i| (0..64).map(move |j| (j * 64 + i) as f32)).collect();
    let wide: Vec<u8> = (0..2 * PAGE).map(|i| (i % 251) as u8).collect();
    vec![
        ("f32", Tensor::from_vec(f32s.clone(), &[2, 3]).unwrap(), bytes_of(&f32s, f32::to_le_bytes)),
        (
            "f32.transposed",
            Tensor::from_vec((1..=6).map(|i| i as f32).collect(), &[2, 3]).unwrap().transpose(0, 1).unwrap(),
            bytes_of(&[1.0f32, 4.0, 2.0, 5.0, 3.0, 6.0], f32::to_le_bytes),
        ),
        ("f16", Tensor::from_vec(f16s.to_vec(), &[4]).unwrap(), bytes_of(&f16s, |v| v.to_bits().to_le_bytes())),
        ("bf16", Tensor::from_vec(bf16s.to_vec(), &[2, 2]).unwrap(), bytes_of(&bf16s, |v| v.to_bits().to_le_bytes())),
        ("f64", Tensor::from_vec(f64s.to_vec(), &[3]).unwrap(), bytes_of(&f64s, f64::to_le_bytes)),
        ("i64", Tensor::from_vec(i64s.to_vec(), &[3]).unwrap(), bytes_of(&i64s, i64::to_le_bytes)),
        (
            "i32.narrowed",
            Tensor::from_vec(grid, &[4, 4]).unwrap().narrow(1, 1, 2).unwrap(),
            bytes_of(&[1i32, 2, 5, 6, 9, 10, 13, 14], i32::to_le_bytes),
        ),
        ("u8", Tensor::from_vec(u8s.to_vec(), &[2, 2]).unwrap(), u8s.to_vec()),
        ("i8", Tensor::from_vec(i8s.to_vec(), &[4]).unwrap(), bytes_of(&i8s, i8::to_le_bytes)),
        ("bool", Tensor::from_vec(vec![true, false, true], &[3]).unwrap(), vec![1, 0, 1]),
        ("u16", Tensor::from_vec(u16s.to_vec(), &[3]).unwrap(), bytes_of(&u16s, u16::to_le_bytes)),
        ("scalar", Tensor::from_vec(vec![42.5f32], &[]).unwrap(), 42.5f32.to_le_bytes().to_vec()),
        ("empty", Tensor::from_vec(Vec::<f32>::new(), &[0, 4]).unwrap(), Vec::new()),
        (
            "empty.transposed",
            Tensor::from_vec(Vec::<i64>::new(), &[3, 0]).unwrap().transpose(0, 1).unwrap(),
            Vec::new(),
        ),
        (
            "page.f32",
            Tensor::from_vec(page, &[64, 64]).unwrap().transpose(0, 1).unwrap(),
            bytes_of(&page_transposed, f32::to_le_bytes),
        ),
        ("page.u8", Tensor::from_vec(wide.clone(), &[2, PAGE]).unwrap(), wide),
    ]
}

/// The archive of [`written`], with metadata (a config stored as a JSON string).
fn archive() -> Archive {
    let mut archive = Archive::new();
    for (name, tensor, _) in written() {
        archive.insert(name, tensor);
    }
    archive.set_metadata("format", "pt");
    archive.set_metadata("config", r#"{"hidden": 64, "name": "tïny \"quoted\""}"#);
    archive
}

fn options() -> SaveOptions {
    SaveOptions { metadata: [("written_by".to_string(), "nnx".to_string())].into(), ..SaveOptions::default() }
}

/// Checks Python's reading of a file (or index) nnx wrote from [`archive`].
fn assert_read_back(described: &Value) {
    let tensors = described["tensors"].as_object().unwrap();
    let expected = written();
    assert_eq!(tensors.len(), expected.len(), "python sees {:?}", tensors.keys().collect::<Vec<_>>());
    for (name, tensor, bytes) in &expected {
        let entry = &tensors[*name];
        assert_eq!(entry["hex"], hex(bytes), "{name}: bytes");
        assert_described(name, tensor, entry);
    }
}

fn assert_metadata(metadata: &Value) {
    assert_eq!(metadata["format"], "pt");
    assert_eq!(metadata["config"], r#"{"hidden": 64, "name": "tïny \"quoted\""}"#);
    assert_eq!(metadata["written_by"], "nnx");
}

#[test]
fn python_reads_what_nnx_writes() {
    let dir = scratch();
    let path = dir.path().join("model.safetensors");
    archive().save_with(&path, &options()).unwrap();
    let described = python("read", &path);
    assert_read_back(&described);
    assert_metadata(&described["metadata"]);
    assert_eq!(described["metadata"].as_object().unwrap().len(), 3);
    assert_eq!(described["data_start"].as_u64().unwrap() % 8, 0, "the header is padded to 8 bytes");
}

#[test]
fn python_reads_page_aligned_files_with_pages_in_place() {
    let dir = scratch();
    let path = dir.path().join("paged.safetensors");
    archive().save_with(&path, &SaveOptions { page_align: true, ..options() }).unwrap();
    let described = python("read", &path);
    assert_read_back(&described);
    assert_metadata(&described["metadata"]);
    assert_eq!(described["data_start_on_page"], true, "8 + header length = {}", described["data_start"]);
    let page_sized = described["page_sized"].as_object().unwrap();
    let mut names: Vec<&str> = page_sized.keys().map(String::as_str).collect();
    names.sort();
    assert_eq!(names, ["page.f32", "page.u8"]);
    for (name, on_page) in page_sized {
        assert_eq!(on_page, &true, "`{name}` does not start on a page");
    }
}

#[test]
fn python_reads_sharded_checkpoints() {
    let dir = scratch();
    let path = dir.path().join("model.safetensors");
    archive().save_with(&path, &SaveOptions { max_shard_bytes: Some(20_000), ..options() }).unwrap();
    let index = dir.path().join("model.safetensors.index.json");
    let described = python("read", &index);
    assert_read_back(&described);
    let total: usize = written().iter().map(|(_, _, bytes)| bytes.len()).sum();
    assert_eq!(described["metadata"]["total_size"].as_u64(), Some(total as u64));
    assert_metadata(&described["metadata"]);
    let shards = described["shards"].as_object().unwrap();
    // 20 000 bytes hold the small entries and one page, not two pages.
    assert!(shards.len() >= 2, "one shard for {total} bytes: {:?}", shards.keys());
    for (shard, contents) in shards {
        assert!(shard.starts_with("model-") && shard.ends_with(&format!("-of-{:05}.safetensors", shards.len())));
        assert_metadata(&contents["metadata"]);
    }
    let weight_map = described["weight_map"].as_object().unwrap();
    assert_eq!(weight_map.len(), written().len());
    assert_ne!(described["weight_map"]["page.f32"], described["weight_map"]["page.u8"]);
}

#[test]
fn nnx_reads_what_python_writes() {
    let dir = scratch();
    let described = python("write", dir.path());
    let path = dir.path().join("python.safetensors");
    let archive = Archive::open(&path).unwrap();
    let tensors = described["tensors"].as_object().unwrap();
    assert_eq!(archive.len(), tensors.len());
    for (name, entry) in tensors {
        let tensor = archive.try_get(name).unwrap();
        assert_described(name, &tensor, entry);
        // The reference writer pads its header to 8 bytes and orders entries by alignment, so
        // every entry is aligned and sits on the mapped pages.
        assert!(tensor.is_mapped(), "`{name}` was copied");
    }
    let metadata: std::collections::BTreeMap<String, String> =
        serde_json::from_value(described["metadata"].clone()).unwrap();
    assert_eq!(archive.metadata(), &metadata);
    assert_eq!(archive.try_get("u64").unwrap().to_vec::<u64>().unwrap(), [u64::MAX]);
    assert_eq!(archive.try_get("bf16").unwrap().to_vec::<bf16>().unwrap()[2], bf16::from_f32(3.140625));
}

#[test]
fn nnx_and_python_read_mlx_files_alike() {
    let mut unaligned = Vec::new();
    for file in ["affine_f32", "affine_bf16", "affine_f16"] {
        let path = fixtures().join("mlx").join(format!("{file}.safetensors"));
        let described = python("read", &path);
        let data_start = described["data_start"].as_u64().unwrap() as usize;
        assert_ne!(data_start % 8, 0, "{file}: MLX does not pad its header");
        let archive = Archive::open(&path).unwrap();
        let tensors = described["tensors"].as_object().unwrap();
        assert_eq!(archive.len(), tensors.len(), "{file}");
        assert_eq!(archive.metadata()["format"], "mlx");
        for (name, entry) in tensors {
            let info = archive.info(name).unwrap();
            let location = info.location.expect("a file entry has a location");
            assert_eq!(location.file_offset, data_start + location.data_offsets.0, "{file}: {name}");
            let aligned = location.file_offset.is_multiple_of(info.dtype.alignment());
            let tensor = archive.try_get(name).unwrap();
            assert_eq!(tensor.is_mapped(), aligned, "{file}: `{name}` at file offset {}", location.file_offset);
            if !aligned {
                unaligned.push(format!("{file}: {name}"));
            }
            assert_described(&format!("{file}: {name}"), &tensor, entry);
        }
        // The dequantized matrix, value by value, in its own dtype.
        let dequantized = archive.try_get("q4g64.dequantized").unwrap();
        let expected = tensors["q4g64.dequantized"]["values"].as_array().unwrap();
        assert_eq!(dequantized.shape(), [6, 256]);
        let found = dequantized.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap();
        assert_eq!(found.len(), expected.len());
        for (at, (found, expected)) in found.into_iter().zip(expected).enumerate() {
            assert!(
                same_value(&found.into(), expected),
                "{file}: q4g64.dequantized[{at}]: nnx {found}, python {expected}"
            );
        }
    }
    // MLX does not pad its header, so in the half-precision files some U32 entries start on an
    // odd 2-byte boundary: they are copied, not mapped, and still read the same as in Python.
    assert!(!unaligned.is_empty(), "the MLX fixtures should hold unaligned entries");
}
