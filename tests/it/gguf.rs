//! GGUF against the reference `gguf` Python package (0.19): files it writes, with every tensor
//! type it decodes and every metadata value type, open in nnx with the same values bit for bit;
//! files nnx writes read back in Python with the same metadata, shapes, offsets and bytes.
//! Hostile headers (one per check of ggml's reader) are refused with errors that name the key
//! or tensor.

use std::path::Path;
use std::process::Command;

use nnx::error::GgufProblem;
use nnx::gguf::{Array, GgmlTensor, GgufWriter, Value};
use nnx::quant::ggml::GgmlType;
use nnx::{Archive, DType, Error, Tensor};
use serde_json::Value as Json;

use crate::python::interpreter;
use crate::util::scratch;

/// `write PATH`: a GGUF file of one tensor per type the package decodes and metadata of every
/// value type, and a description with each tensor's decoded values as f32 hex. `read PATH`: the
/// description of a file.
const SCRIPT: &str = r#"
import json, sys
import numpy as np
import gguf
from gguf import GGUFReader, GGUFWriter, GGMLQuantizationType as T
from gguf.quants import quantize, dequantize
from gguf.constants import GGML_QUANT_SIZES

PLAIN = (T.F64, T.I8, T.I16, T.I32, T.I64)

def decoded(t):
    data = np.asarray(t.data)
    if t.tensor_type in PLAIN:
        # The package leaves these to numpy, whose cast is what ggml's conversion does.
        return data.astype(np.float32).tobytes().hex()
    try:
        return dequantize(data, t.tensor_type).astype(np.float32).tobytes().hex()
    except NotImplementedError:
        return None

def plain(value):
    return value.item() if hasattr(value, "item") else value.tolist()

def describe(path):
    reader = GGUFReader(path)
    metadata = {}
    for name, field in reader.fields.items():
        if name.startswith("GGUF."):
            continue
        types = [t.name for t in field.types]
        metadata[name] = {"types": types, "value": field.contents()}
    tensors = {}
    for t in reader.tensors:
        tensors[t.name] = {
            "type": t.tensor_type.name,
            "ne": [int(n) for n in t.shape],
            "offset": int(t.data_offset),
            "bytes": int(t.n_bytes),
            "raw": np.asarray(t.data).tobytes().hex() if t.n_bytes <= 4096 else None,
            "f32": decoded(t),
        }
    return {"metadata": metadata, "tensors": tensors, "alignment": reader.alignment}

def write(path):
    rng = np.random.default_rng(7)
    w = GGUFWriter(path, "llama")
    w.add_uint8("t.u8", 200); w.add_int8("t.i8", -5); w.add_uint16("t.u16", 60000)
    w.add_int16("t.i16", -30000); w.add_uint32("t.u32", 4000000000); w.add_int32("t.i32", -2000000000)
    w.add_float32("t.f32", 0.1); w.add_bool("t.bool", True); w.add_string("t.str", "h\u00e9llo \u2603")
    w.add_uint64("t.u64", 2**63 + 5); w.add_int64("t.i64", -2**62); w.add_float64("t.f64", 1 / 3)
    w.add_array("t.ints", [1, -2, 3]); w.add_array("t.strs", ["a", "", "bc"])
    w.add_array("t.floats", [0.5, -1.25]); w.add_array("t.bools", [True, False])
    w.add_array("t.nested", [[1, 2], [3]])
    written = []
    for ty in T:
        block, size = GGML_QUANT_SIZES[ty]
        if ty in (T.F32, T.F16, T.F64, T.I8, T.I16, T.I32, T.I64):
            dtype = {T.F32: np.float32, T.F16: np.float16, T.F64: np.float64, T.I8: np.int8,
                     T.I16: np.int16, T.I32: np.int32, T.I64: np.int64}[ty]
            data = (rng.standard_normal((3, 8)) * 100).astype(dtype)
            w.add_tensor(ty.name.lower(), data)
            written.append(ty.name)
            continue
        rows, cols = 3, 256
        floats = rng.standard_normal((rows, cols)).astype(np.float32)
        try:
            raw = quantize(floats, ty)
        except NotImplementedError:
            # Random blocks, kept only where they decode to finite values.
            raw = np.zeros((rows, cols // block * size), dtype=np.uint8)
            try:
                for r in range(rows):
                    for b in range(cols // block):
                        for _ in range(1000):
                            blk = rng.integers(0, 256, size, dtype=np.uint8)
                            if np.isfinite(dequantize(blk, ty)).all():
                                break
                        raw[r, b * size:(b + 1) * size] = blk
            except NotImplementedError:
                continue
        w.add_tensor(ty.name.lower(), raw, raw_dtype=ty)
        written.append(ty.name)
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    return written

mode, path = sys.argv[1], sys.argv[2]
if mode == "write":
    written = write(path)
    out = describe(path)
    out["written"] = written
    print(json.dumps(out, default=plain))
else:
    print(json.dumps(describe(path), default=plain))
"#;

fn python(mode: &str, path: &Path) -> Json {
    let python = interpreter();
    let output = Command::new(&python)
        .args(["-c", SCRIPT, mode, path.to_str().unwrap()])
        .output()
        .unwrap_or_else(|error| panic!("`{python}` cannot be run ({error}): run scripts/setup.sh"));
    assert!(
        output.status.success(),
        "the `gguf` package failed (run scripts/setup.sh, which installs gguf 0.19): {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

fn hex(text: &str) -> Vec<u8> {
    (0..text.len()).step_by(2).map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap()).collect()
}

fn f32_bits(bytes: &[u8]) -> Vec<u32> {
    bytes.chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).collect()
}

#[test]
fn files_the_gguf_package_writes_open_with_every_type_decoded_bit_for_bit() {
    let dir = scratch();
    let path = dir.path().join("every-type.gguf");
    let described = python("write", &path);
    let archive = Archive::open(&path).unwrap();
    let written: Vec<&str> = described["written"].as_array().unwrap().iter().map(|n| n.as_str().unwrap()).collect();
    // Every type nnx knows that the package can decode is in the file.
    for ty in GgmlType::all().filter(|ty| !matches!(ty, GgmlType::Q8_1 | GgmlType::Q8_K)) {
        assert!(written.contains(&ty.name()), "the package wrote no {ty} tensor: {written:?}");
    }
    for (name, tensor) in described["tensors"].as_object().unwrap() {
        let ty = GgmlType::from_name(tensor["type"].as_str().unwrap()).unwrap();
        assert_eq!(archive.ggml_type(name), Some(ty), "{name}");
        let ne: Vec<usize> = tensor["ne"].as_array().unwrap().iter().map(|n| n.as_u64().unwrap() as usize).collect();
        let shape: Vec<usize> = ne.iter().rev().copied().collect();
        let info = archive.info(name).unwrap();
        assert_eq!(info.shape, shape, "{name}: shapes read outermost first");
        assert_eq!(info.location.as_ref().unwrap().file_offset as u64, tensor["offset"].as_u64().unwrap(), "{name}");
        assert_eq!(info.bytes as u64, tensor["bytes"].as_u64().unwrap(), "{name}");
        let packed = archive.ggml(name).unwrap();
        if let Some(raw) = tensor["raw"].as_str() {
            assert_eq!(packed.bytes().unwrap().as_ref(), hex(raw).as_slice(), "{name}: packed bytes as stored");
        }
        let expected = f32_bits(&hex(tensor["f32"].as_str().expect("every written type decodes")));
        let decoded = packed.dequantize().unwrap();
        assert_eq!(decoded.shape(), shape.as_slice());
        let found = f32_bits(&decoded.to_bytes().unwrap());
        assert!(found == expected, "{name} ({ty}): decoded values differ from the gguf package");
        if info.dtype.is_castable_float() {
            let float = archive.float(name, DType::F32, &shape).unwrap();
            assert!(f32_bits(&float.to_bytes().unwrap()) == expected, "{name} ({ty}): as floats");
        }
        if ty.is_quantized() {
            assert!(!archive.try_get(name).unwrap().is_mapped(), "{name}: decoded values are not the file's bytes");
        } else {
            assert!(archive.try_get(name).unwrap().is_mapped(), "{name}: a plain tensor is a view of the file");
        }
    }

    let metadata = archive.gguf_metadata().unwrap();
    assert_eq!(metadata.architecture(), Some("llama"));
    assert_eq!(metadata.get("t.u8"), Some(&Value::U8(200)));
    assert_eq!(metadata.get("t.i8"), Some(&Value::I8(-5)));
    assert_eq!(metadata.get("t.u16"), Some(&Value::U16(60000)));
    assert_eq!(metadata.get("t.i16"), Some(&Value::I16(-30000)));
    assert_eq!(metadata.get("t.u32"), Some(&Value::U32(4_000_000_000)));
    assert_eq!(metadata.get("t.i32"), Some(&Value::I32(-2_000_000_000)));
    assert_eq!(metadata.get("t.f32"), Some(&Value::F32(0.1)));
    assert_eq!(metadata.get("t.bool"), Some(&Value::Bool(true)));
    assert_eq!(metadata.str("t.str"), Some("h\u{e9}llo \u{2603}"));
    assert_eq!(metadata.get("t.u64"), Some(&Value::U64((1 << 63) + 5)));
    assert_eq!(metadata.get("t.i64"), Some(&Value::I64(-(1 << 62))));
    assert_eq!(metadata.get("t.f64"), Some(&Value::F64(1.0 / 3.0)));
    assert_eq!(metadata.get("t.ints"), Some(&Value::Array(Array::I32(vec![1, -2, 3]))));
    assert_eq!(metadata.get("t.strs").unwrap().as_array().unwrap().as_strings().unwrap(), ["a", "", "bc"]);
    assert_eq!(metadata.get("t.floats"), Some(&Value::Array(Array::F32(vec![0.5, -1.25]))));
    assert_eq!(metadata.get("t.bools"), Some(&Value::Array(Array::Bool(vec![true, false]))));
    assert_eq!(
        metadata.get("t.nested"),
        Some(&Value::Array(Array::Array(vec![Array::I32(vec![1, 2]), Array::I32(vec![3])])))
    );
    assert_eq!(archive.metadata()["t.strs"], r#"["a", "", "bc"]"#);
}

#[test]
fn files_nnx_writes_read_back_in_the_gguf_package() {
    let dir = scratch();
    let path = dir.path().join("nnx.gguf");
    let values: Vec<f32> = (0..4 * 256).map(|i| ((i * 37 % 101) as f32 - 50.0) / 17.0).collect();
    let weight = Tensor::from_vec(values, &[4, 256]).unwrap();
    let mut writer = GgufWriter::new();
    writer.set_alignment(64).unwrap();
    let metadata = writer.metadata_mut();
    metadata.set("general.architecture", Value::String("llama".into()));
    metadata.set("t.u64", Value::U64(u64::MAX));
    metadata.set("t.f64", Value::F64(-2.5));
    metadata.set("t.bool", Value::Bool(false));
    metadata.set("t.tokens", Value::Array(Array::String(vec!["<s>".into(), "\u{2581}a".into()])));
    metadata.set("t.nested", Value::Array(Array::Array(vec![Array::U8(vec![1, 2]), Array::U8(vec![])])));
    for ty in [GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1] {
        writer.add(format!("w.{}", ty.name().to_lowercase()), GgmlTensor::quantize(&weight, ty).unwrap()).unwrap();
    }
    writer.add_tensor("plain.f16", &weight.to_dtype(DType::F16).unwrap()).unwrap();
    writer.add_tensor("plain.i32", &Tensor::from_vec(vec![1i32, -2, 3], &[3]).unwrap()).unwrap();
    writer.write(&path).unwrap();

    let described = python("read", &path);
    assert_eq!(described["alignment"], 64);
    let metadata = &described["metadata"];
    assert_eq!(metadata["general.architecture"]["value"], "llama");
    assert_eq!(metadata["t.u64"]["value"], u64::MAX);
    assert_eq!(metadata["t.u64"]["types"][0], "UINT64");
    assert_eq!(metadata["t.f64"]["value"], -2.5);
    assert_eq!(metadata["t.bool"]["value"], false);
    assert_eq!(metadata["t.tokens"]["value"], serde_json::json!(["<s>", "\u{2581}a"]));
    assert_eq!(metadata["general.alignment"]["value"], 64);
    let archive = Archive::open(&path).unwrap();
    for (name, tensor) in described["tensors"].as_object().unwrap() {
        assert_eq!(tensor["offset"].as_u64().unwrap() % 64, 0, "{name} is aligned");
        let packed = archive.ggml(name).unwrap();
        let ne: Vec<usize> = tensor["ne"].as_array().unwrap().iter().map(|n| n.as_u64().unwrap() as usize).collect();
        assert_eq!(ne.iter().rev().copied().collect::<Vec<_>>(), packed.shape, "{name}");
        assert_eq!(tensor["type"].as_str().unwrap(), packed.ty.name(), "{name}");
        if let Some(raw) = tensor["raw"].as_str() {
            assert_eq!(hex(raw), packed.bytes().unwrap().as_ref(), "{name}");
        }
        if !archive.info(name).unwrap().dtype.is_castable_float() {
            continue;
        }
        let f32_hex = tensor["f32"].as_str().unwrap();
        let decoded = archive.float(name, DType::F32, &packed.shape).unwrap();
        assert_eq!(f32_bits(&hex(f32_hex)), f32_bits(&decoded.to_bytes().unwrap()), "{name}");
    }
}

/// A GGUF header: magic, version, counts, then `body` (metadata and tensor infos).
fn header(version: u32, tensors: u64, kvs: u64, body: &[u8]) -> Vec<u8> {
    let mut bytes = b"GGUF".to_vec();
    bytes.extend_from_slice(&version.to_le_bytes());
    bytes.extend_from_slice(&tensors.to_le_bytes());
    bytes.extend_from_slice(&kvs.to_le_bytes());
    bytes.extend_from_slice(body);
    bytes
}

fn string(text: &str) -> Vec<u8> {
    let mut bytes = (text.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(text.as_bytes());
    bytes
}

fn kv_u32(key: &str, value: u32) -> Vec<u8> {
    [string(key), 4u32.to_le_bytes().to_vec(), value.to_le_bytes().to_vec()].concat()
}

fn info(name: &str, ne: &[u64], ty: u32, offset: u64) -> Vec<u8> {
    let mut bytes = string(name);
    bytes.extend_from_slice(&(ne.len() as u32).to_le_bytes());
    for n in ne {
        bytes.extend_from_slice(&n.to_le_bytes());
    }
    bytes.extend_from_slice(&ty.to_le_bytes());
    bytes.extend_from_slice(&offset.to_le_bytes());
    bytes
}

fn open_problem(bytes: &[u8]) -> GgufProblem {
    let dir = scratch();
    let path = dir.path().join("hostile.gguf");
    std::fs::write(&path, bytes).unwrap();
    match Archive::open(&path) {
        Err(Error::Gguf { path: named, problem }) => {
            assert_eq!(named, path, "the error names the file");
            problem
        }
        other => panic!("expected a GGUF error, got {other:?}"),
    }
}

#[test]
fn every_check_of_ggmls_reader_refuses_a_hostile_header_with_a_named_problem() {
    let padded = |mut bytes: Vec<u8>, data: usize| {
        let start = bytes.len().div_ceil(32) * 32;
        bytes.resize(start + data, 0);
        bytes
    };
    let f32_info = |name: &str, offset| info(name, &[4], 0, offset);

    assert!(matches!(open_problem(&header(1, 0, 0, &[])), GgufProblem::Version { version: 1 }));
    assert!(matches!(open_problem(&header(4, 0, 0, &[])), GgufProblem::Version { version: 4 }));
    assert!(matches!(open_problem(&header(3 << 24, 0, 0, &[])), GgufProblem::BigEndian { .. }));
    assert!(matches!(open_problem(b"GGUX\x03\0\0\0"), GgufProblem::Magic { .. }));
    assert!(matches!(open_problem(&header(3, 0, u64::MAX, &[])), GgufProblem::Count { what: "metadata entries", .. }));
    assert!(matches!(open_problem(&header(3, 1 << 40, 0, &[])), GgufProblem::Count { what: "tensors", .. }));
    // A string that claims more bytes than ggml allows, and one past the end of the file.
    let long = [(2u64 << 30).to_le_bytes().to_vec(), vec![b'a'; 64]].concat();
    assert!(matches!(open_problem(&header(3, 0, 1, &long)), GgufProblem::StringTooLong { .. }));
    let past = [100u64.to_le_bytes().to_vec(), vec![b'a'; 64]].concat();
    assert!(matches!(open_problem(&header(3, 0, 1, &past)), GgufProblem::Truncated { .. }));
    assert!(matches!(open_problem(&header(3, 0, 1, &kv_u32("", 1))), GgufProblem::EmptyKey { index: 0 }));
    let twice = [kv_u32("a.b", 1), kv_u32("a.b", 2)].concat();
    assert!(matches!(open_problem(&header(3, 0, 2, &twice)), GgufProblem::DuplicateKey { key } if key == "a.b"));
    let unknown = [string("a.b"), 13u32.to_le_bytes().to_vec(), vec![0; 8]].concat();
    assert!(matches!(open_problem(&header(3, 0, 1, &unknown)), GgufProblem::ValueType { type_id: 13, .. }));
    let bad_bool = [string("a.b"), 7u32.to_le_bytes().to_vec(), vec![2]].concat();
    assert!(matches!(open_problem(&header(3, 0, 1, &bad_bool)), GgufProblem::Bool { value: 2, .. }));
    // An array of 2^31 u8 elements: over ggml's limit, refused before anything is reserved.
    let huge =
        [string("a.b"), 9u32.to_le_bytes().to_vec(), 0u32.to_le_bytes().to_vec(), (1u64 << 31).to_le_bytes().to_vec()]
            .concat();
    assert!(matches!(open_problem(&header(3, 0, 1, &huge)), GgufProblem::ArrayTooLong { .. }));
    let mut deep = [string("a.b"), 9u32.to_le_bytes().to_vec()].concat();
    for _ in 0..20 {
        deep.extend_from_slice(&9u32.to_le_bytes());
        deep.extend_from_slice(&1u64.to_le_bytes());
    }
    assert!(matches!(open_problem(&header(3, 0, 1, &deep)), GgufProblem::NestedTooDeep { .. }));
    for alignment in [0, 48] {
        let body = kv_u32("general.alignment", alignment);
        assert!(matches!(open_problem(&header(3, 0, 1, &body)), GgufProblem::Alignment { .. }), "{alignment}");
    }
    let name = "x".repeat(64);
    assert!(matches!(
        open_problem(&padded(header(3, 1, 0, &f32_info(&name, 0)), 16)),
        GgufProblem::NameTooLong { len: 64, .. }
    ));
    let dup = [f32_info("w", 0), f32_info("w", 32)].concat();
    assert!(matches!(open_problem(&padded(header(3, 2, 0, &dup), 64)), GgufProblem::DuplicateTensor { .. }));
    let five = info("w", &[1, 1, 1, 1, 1], 0, 0);
    assert!(matches!(open_problem(&padded(header(3, 1, 0, &five), 4)), GgufProblem::Dims { dims: 5, .. }));
    let overflow = info("w", &[1 << 40, 1 << 40], 0, 0);
    assert!(matches!(open_problem(&padded(header(3, 1, 0, &overflow), 4)), GgufProblem::Overflow { .. }));
    let removed = info("w", &[32], 4, 0);
    assert!(matches!(open_problem(&padded(header(3, 1, 0, &removed), 32)), GgufProblem::TensorType { type_id: 4, .. }));
    let partial = info("w", &[100, 2], GgmlType::Q4_K.id(), 0);
    assert!(matches!(
        open_problem(&padded(header(3, 1, 0, &partial), 4096)),
        GgufProblem::PartialBlock { row: 100, block: 256, .. }
    ));
    // The second tensor must start where the first ends, padded to the alignment.
    let gap = [f32_info("a", 0), f32_info("b", 64)].concat();
    assert!(matches!(
        open_problem(&padded(header(3, 2, 0, &gap), 128)),
        GgufProblem::Offset { expected: 32, found: 64, .. }
    ));
    let short = f32_info("a", 0);
    assert!(matches!(open_problem(&padded(header(3, 1, 0, &short), 8)), GgufProblem::DataPastEnd { .. }));

    // A well-formed file of the same shape opens.
    let dir = scratch();
    let path = dir.path().join("good.gguf");
    let mut good = padded(header(3, 1, 0, &f32_info("a", 0)), 0);
    good.extend(1.5f32.to_le_bytes().iter().cycle().take(16));
    std::fs::write(&path, &good).unwrap();
    let archive = Archive::open(&path).unwrap();
    assert_eq!(archive.try_get("a").unwrap().to_vec::<f32>().unwrap(), [1.5; 4]);
}

#[test]
fn split_files_open_as_one_and_a_missing_shard_is_named() {
    let dir = scratch();
    let mut writer = GgufWriter::new();
    writer.metadata_mut().set("general.architecture", Value::String("llama".into()));
    for i in 0..5 {
        writer.add_tensor(format!("blk.{i}.w"), &Tensor::from_vec(vec![i as f32; 64], &[2, 32]).unwrap()).unwrap();
    }
    let paths = writer.write_split(dir.path(), "tiny-F32", 2, u64::MAX).unwrap();
    let names: Vec<String> = paths.iter().map(|p| p.file_name().unwrap().to_string_lossy().into_owned()).collect();
    assert_eq!(names, ["tiny-F32-00001-of-00003.gguf", "tiny-F32-00002-of-00003.gguf", "tiny-F32-00003-of-00003.gguf"]);
    for opened in [Archive::open(&paths[1]).unwrap(), Archive::open(dir.path()).unwrap()] {
        assert_eq!(opened.len(), 5);
        assert_eq!(opened.gguf_metadata().unwrap().architecture(), Some("llama"));
        assert_eq!(opened.float("blk.4.w", DType::F32, &[2, 32]).unwrap().to_vec::<f32>().unwrap(), vec![4.0; 64]);
    }
    std::fs::remove_file(&paths[2]).unwrap();
    match Archive::open(&paths[0]) {
        Err(Error::Gguf { problem: GgufProblem::Split { shard, .. }, .. }) => {
            assert_eq!(shard, "tiny-F32-00003-of-00003.gguf");
        }
        other => panic!("expected the missing shard named, got {other:?}"),
    }
}

#[test]
fn the_command_line_converts_to_gguf_and_back_with_types_the_gguf_package_reads() {
    let dir = scratch();
    let input = crate::util::fixtures().join("llama-tiny").join("model.safetensors");
    let gguf = dir.path().join("tiny-q8_0.gguf");
    let (code, stdout, stderr) = crate::util::run_nnx(&[
        "convert".as_ref(),
        input.as_os_str(),
        gguf.as_os_str(),
        "--type".as_ref(),
        "q8_0".as_ref(),
        "--tensor-type".as_ref(),
        "embed_tokens=q4_0".as_ref(),
    ]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("converted 21 tensors"), "{stdout}");

    let source = Archive::open(&input).unwrap();
    let archive = Archive::open(&gguf).unwrap();
    assert_eq!(archive.gguf_metadata().unwrap().u64("general.file_type"), Some(7));
    assert_eq!(archive.gguf_metadata().unwrap().u64("general.quantization_version"), Some(2));
    // 2-D weights take Q8_0 (the override gives the embedding Q4_0); rows of 176 values hold no
    // whole 32-blocks and fall back to F16 as llama.cpp does; 1-D norms keep their BF16.
    assert_eq!(archive.ggml_type("model.layers.0.self_attn.q_proj.weight"), Some(GgmlType::Q8_0));
    assert_eq!(archive.ggml_type("model.embed_tokens.weight"), Some(GgmlType::Q4_0));
    assert_eq!(archive.ggml_type("model.layers.0.mlp.down_proj.weight"), Some(GgmlType::F16));
    assert_eq!(archive.ggml_type("model.layers.0.input_layernorm.weight"), Some(GgmlType::BF16));
    for name in source.names() {
        let shape = source.info(name).unwrap().shape;
        let original = source.float(name, DType::F32, &shape).unwrap().to_vec::<f32>().unwrap();
        let stored = archive.float(name, DType::F32, &shape).unwrap().to_vec::<f32>().unwrap();
        let scale = original.iter().fold(0f32, |m, v| m.max(v.abs()));
        let worst = original.iter().zip(&stored).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        assert!(worst <= scale / 6.0, "{name}: error {worst} against values up to {scale}");
    }
    let described = python("read", &gguf);
    assert_eq!(described["tensors"]["model.layers.0.self_attn.q_proj.weight"]["type"], "Q8_0");
    assert_eq!(described["tensors"]["model.embed_tokens.weight"]["ne"], serde_json::json!([64, 256]));

    // Back to SafeTensors: every tensor decoded to f32 bit for bit, names as stored.
    let back = dir.path().join("back.safetensors");
    let (code, _, stderr) = crate::util::run_nnx(&["convert".as_ref(), gguf.as_os_str(), back.as_os_str()]);
    assert_eq!(code, 0, "{stderr}");
    let restored = Archive::open(&back).unwrap();
    assert_eq!(restored.metadata().get("general.file_type").map(String::as_str), Some("7"));
    for name in archive.names() {
        let shape = archive.info(name).unwrap().shape;
        let expected = archive.float(name, DType::F32, &shape).unwrap();
        let found = restored.try_get(name).unwrap();
        if archive.ggml_type(name).unwrap().is_quantized() {
            assert_eq!(found.dtype(), DType::F32, "{name}");
        }
        let found = found.to_dtype(DType::F32).unwrap();
        assert_eq!(f32_bits(&found.to_bytes().unwrap()), f32_bits(&expected.to_bytes().unwrap()), "{name}");
    }

    // diff compares the GGUF file with its decoded copy: equal.
    let (code, stdout, stderr) = crate::util::run_nnx(&["diff".as_ref(), gguf.as_os_str(), back.as_os_str()]);
    assert_eq!(code, 0, "{stdout}{stderr}");

    // Requantized from GGUF to GGUF, metadata kept; inspect shows types and bits per weight.
    let requantized = dir.path().join("tiny-q4_0.gguf");
    let (code, _, stderr) = crate::util::run_nnx(&[
        "convert".as_ref(),
        gguf.as_os_str(),
        requantized.as_os_str(),
        "--type".as_ref(),
        "q4_0".as_ref(),
    ]);
    assert_eq!(code, 0, "{stderr}");
    let archive = Archive::open(&requantized).unwrap();
    assert_eq!(archive.ggml_type("model.layers.1.self_attn.o_proj.weight"), Some(GgmlType::Q4_0));
    assert_eq!(archive.gguf_metadata().unwrap().u64("general.file_type"), Some(2));
    let (code, table, _) = crate::util::run_nnx(&["inspect".as_ref(), requantized.as_os_str()]);
    assert_eq!(code, 0);
    let row = table.lines().find(|line| line.starts_with("model.layers.1.self_attn.o_proj.weight")).unwrap();
    assert!(row.contains("Q4_0") && row.contains("4.5"), "{row}");

    let (code, _, stderr) = crate::util::run_nnx(&[
        "convert".as_ref(),
        gguf.as_os_str(),
        requantized.as_os_str(),
        "--type".as_ref(),
        "iq2_xxs".as_ref(),
    ]);
    assert_ne!(code, 0);
    assert!(stderr.contains("q4_k_m"), "the error lists what is offered: {stderr}");
}

/// Checks a GGUF file written from `llama-tiny` against its SafeTensors checkpoint in numpy:
/// llama.cpp's names, the q/k permutation of its converter, norms in f32, and the tokenizer.
const LLAMA_CHECK: &str = r#"
import json, sys
import numpy as np
from gguf import GGUFReader
from safetensors.numpy import load_file

gguf_path, folder = sys.argv[1], sys.argv[2]
reader = GGUFReader(gguf_path)
import ml_dtypes
hf = {k: np.asarray(v).astype(np.float32) for k, v in load_file(folder + "/model.safetensors").items()}
config = json.load(open(folder + "/config.json"))
tensors = {t.name: t for t in reader.tensors}

def permute(w, n_head):
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)

def value(t):
    return np.asarray(t.data).reshape([int(n) for n in reversed(t.shape)]).astype(np.float32)

checked = 0
for i in range(config["num_hidden_layers"]):
    pairs = {
        f"blk.{i}.attn_q.weight": permute(hf[f"model.layers.{i}.self_attn.q_proj.weight"], config["num_attention_heads"]),
        f"blk.{i}.attn_k.weight": permute(hf[f"model.layers.{i}.self_attn.k_proj.weight"], config["num_key_value_heads"]),
        f"blk.{i}.attn_v.weight": hf[f"model.layers.{i}.self_attn.v_proj.weight"],
        f"blk.{i}.ffn_down.weight": hf[f"model.layers.{i}.mlp.down_proj.weight"],
        f"blk.{i}.attn_norm.weight": hf[f"model.layers.{i}.input_layernorm.weight"],
    }
    for name, expected in pairs.items():
        assert np.array_equal(value(tensors[name]), expected), name
        checked += 1
assert tensors["blk.0.attn_norm.weight"].tensor_type.name == "F32"
assert np.array_equal(value(tensors["output.weight"]), hf["lm_head.weight"])
fields = reader.fields
tokens = fields["tokenizer.ggml.tokens"].contents()
tokenizer = json.load(open(folder + "/tokenizer.json"))
for token, id in tokenizer["model"]["vocab"].items():
    assert tokens[id] == token, (id, token)
print(json.dumps({
    "checked": checked,
    "architecture": fields["general.architecture"].contents(),
    "heads_kv": int(fields["llama.attention.head_count_kv"].contents()),
    "model": fields["tokenizer.ggml.model"].contents(),
    "types": [int(t) for t in fields["tokenizer.ggml.token_type"].contents()[:4]],
}))
"#;

#[test]
fn a_transformers_llama_converts_as_llama_cpps_converter_writes_it() {
    let dir = scratch();
    let folder = crate::util::fixtures().join("llama-tiny");
    let gguf = dir.path().join("llama-tiny-f32.gguf");
    let (code, stdout, stderr) = crate::util::run_nnx(&[
        "convert".as_ref(),
        folder.as_os_str(),
        gguf.as_os_str(),
        "--type".as_ref(),
        "f32".as_ref(),
    ]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("converted 21 tensors"), "{stdout}");
    let output = Command::new(interpreter())
        .args(["-c", LLAMA_CHECK, gguf.to_str().unwrap(), folder.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let checked: Json = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(checked["checked"], 10);
    assert_eq!(checked["architecture"], "llama");
    assert_eq!(checked["heads_kv"], 2);
    assert_eq!(checked["model"], "gpt2");
    assert_eq!(checked["types"], serde_json::json!([3, 3, 3, 1]), "special tokens are control tokens");
    let archive = Archive::open(&gguf).unwrap();
    assert!(archive.contains("blk.1.ffn_gate.weight") && archive.contains("output_norm.weight"));
    assert_eq!(archive.gguf_metadata().unwrap().u64("llama.block_count"), Some(2));
}

/// The tensors of the Llama in `tests/fixtures/gguf/llamacpp/mixtures.json`: names and shapes
/// in the order of llama.cpp's converter, values from the integer formula of
/// `scripts/llamacpp/mixture_goldens.py`.
fn formula_llama() -> GgufWriter {
    let (layers, width, mlp, heads, kv_heads, head_dim, vocab) =
        (8usize, 256usize, 512usize, 4usize, 2usize, 64usize, 256usize);
    let mut shapes: Vec<(String, Vec<usize>)> = vec![("token_embd.weight".into(), vec![vocab, width])];
    for i in 0..layers {
        for (part, shape) in [
            ("attn_norm", vec![width]),
            ("ffn_down", vec![width, mlp]),
            ("ffn_gate", vec![mlp, width]),
            ("ffn_up", vec![mlp, width]),
            ("ffn_norm", vec![width]),
            ("attn_k", vec![kv_heads * head_dim, width]),
            ("attn_output", vec![width, heads * head_dim]),
            ("attn_q", vec![heads * head_dim, width]),
            ("attn_v", vec![kv_heads * head_dim, width]),
        ] {
            shapes.push((format!("blk.{i}.{part}.weight"), shape));
        }
    }
    shapes.push(("output_norm.weight".into(), vec![width]));
    shapes.push(("output.weight".into(), vec![vocab, width]));
    let mut writer = GgufWriter::new();
    let metadata = writer.metadata_mut();
    metadata.set("general.architecture", Value::String("llama".into()));
    for (key, value) in [
        ("llama.block_count", layers),
        ("llama.embedding_length", width),
        ("llama.feed_forward_length", mlp),
        ("llama.attention.head_count", heads),
        ("llama.attention.head_count_kv", kv_heads),
    ] {
        metadata.set(key, Value::U32(value as u32));
    }
    for (index, (name, shape)) in shapes.iter().enumerate() {
        let count: usize = shape.iter().product();
        let values: Vec<f32> = (0..count as u64)
            .map(|i| {
                let h = (i.wrapping_mul(2_654_435_761).wrapping_add(index as u64 * 40503 + 12345)) & 0xFFFF_FFFF;
                (((h % 20001) as i64 - 10000) as f64 / 100000.0) as f32
            })
            .collect();
        writer.add_tensor(name.as_str(), &Tensor::from_vec(values, shape).unwrap()).unwrap();
    }
    writer
}

fn fnv1a(bytes: &[u8]) -> String {
    let hash = bytes.iter().fold(0xCBF2_9CE4_8422_2325u64, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01B3));
    format!("{hash:016x}")
}

#[test]
fn every_mixture_is_what_llama_quantize_writes_byte_for_byte() {
    let goldens: Json = serde_json::from_str(
        &std::fs::read_to_string(crate::util::fixtures().join("gguf/llamacpp/mixtures.json")).unwrap(),
    )
    .unwrap();
    let dir = scratch();
    let input = dir.path().join("f32.gguf");
    formula_llama().write(&input).unwrap();
    for (mixture, expected) in goldens["mixtures"].as_object().unwrap() {
        let output = dir.path().join(format!("{mixture}.gguf"));
        let (code, _, stderr) = crate::util::run_nnx(&[
            "convert".as_ref(),
            input.as_os_str(),
            output.as_os_str(),
            "--type".as_ref(),
            mixture.as_ref(),
        ]);
        assert_eq!(code, 0, "{mixture}: {stderr}");
        let archive = Archive::open(&output).unwrap();
        let found: Vec<(String, String, String)> = archive
            .names()
            .map(|name| {
                let packed = archive.ggml(name).unwrap();
                (name.to_string(), packed.ty.name().to_string(), fnv1a(&packed.bytes().unwrap()))
            })
            .collect();
        let expected: Vec<(String, String, String)> = serde_json::from_value(expected.clone()).unwrap();
        for (ours, theirs) in found.iter().zip(&expected) {
            assert_eq!(ours, theirs, "{mixture}: tensor (name, type, bytes) differs from llama-quantize's");
        }
        assert_eq!(found.len(), expected.len(), "{mixture}");
    }
}

/// `nnx convert --type` of the mixtures of experts' F32 files against llama-quantize's files of
/// the same mixture (`tests/fixtures/models/{qwen3moe,gpt-oss}`): every tensor's name, type and
/// bytes, the expert stacks included (MXFP4 for `mxfp4_moe`, Q5_0/Q5_1/F16 where Q4_K's blocks do
/// not fit the experts' rows), and llama.cpp's file type.
#[test]
fn moe_hybrid_and_gemma4_files_convert_as_llama_quantize_does() {
    let dir = scratch();
    let cases = [
        ("qwen3moe", &["q8_0", "q4_k_m"][..]),
        ("gpt-oss", &["q8_0", "q4_k_m", "mxfp4_moe"][..]),
        ("qwen35", &["q8_0", "q4_k_m"][..]),
        ("qwen35moe", &["q8_0", "q4_k_m"][..]),
        ("gemma4", &["q8_0", "q4_k_m"][..]),
        ("gemma4moe", &["q8_0", "q4_k_m"][..]),
    ];
    for (case, mixtures) in cases {
        let folder = crate::util::fixtures().join("models").join(case);
        for mixture in mixtures {
            let output = dir.path().join(format!("{case}-{mixture}.gguf"));
            let input = folder.join("model-f32.gguf");
            let args = ["convert".as_ref(), input.as_os_str(), output.as_os_str(), "--type".as_ref(), mixture.as_ref()];
            let (code, _, stderr) = crate::util::run_nnx(&args);
            assert_eq!(code, 0, "{case} {mixture}: {stderr}");
            let ours = Archive::open(&output).unwrap();
            let theirs = Archive::open(folder.join(format!("model-{mixture}.gguf"))).unwrap();
            let tensors = |archive: &Archive| -> Vec<(String, String, String)> {
                let mut all: Vec<_> = archive
                    .names()
                    .map(|name| {
                        let packed = archive.ggml(name).unwrap();
                        (name.to_string(), packed.ty.name().to_string(), fnv1a(&packed.bytes().unwrap()))
                    })
                    .collect();
                all.sort();
                all
            };
            assert_eq!(tensors(&ours), tensors(&theirs), "{case} {mixture}: tensors differ from llama-quantize's");
            let file_type = |archive: &Archive| archive.gguf_metadata().unwrap().get("general.file_type").cloned();
            assert_eq!(file_type(&ours), file_type(&theirs), "{case} {mixture}");
        }
    }
}

/// `--split-max-size` writes the shards as they are made: llama.cpp's names and `split.*` keys,
/// no shard over the size but for a tensor larger than it, and the set opens as the one file
/// llama-quantize writes, tensor for tensor.
#[test]
fn a_split_conversion_is_llama_quantizes_file_in_shards() {
    let dir = scratch();
    let folder = crate::util::fixtures().join("models/qwen3moe");
    let input = folder.join("model-f32.gguf");
    let output = dir.path().join("moe.gguf");
    let args = [
        "convert".as_ref(),
        input.as_os_str(),
        output.as_os_str(),
        "--type".as_ref(),
        "q8_0".as_ref(),
        "--split-max-size".as_ref(),
        "60KB".as_ref(),
    ];
    let (code, stdout, stderr) = crate::util::run_nnx(&args);
    assert_eq!(code, 0, "{stderr}");
    assert!(!output.exists(), "shards only: {stdout}");
    let mut shards: Vec<std::path::PathBuf> =
        std::fs::read_dir(dir.path()).unwrap().map(|entry| entry.unwrap().path()).collect();
    shards.sort();
    let count = shards.len();
    assert!(count >= 4, "{count} shards: {stdout}");
    for (at, shard) in shards.iter().enumerate() {
        let name = shard.file_name().unwrap().to_string_lossy().into_owned();
        assert_eq!(name, format!("moe-{:05}-of-{count:05}.gguf", at + 1));
        // Each shard as the reference package reads it.
        let one = python("read", shard);
        let keys = one["metadata"].as_object().unwrap();
        assert_eq!(keys["split.no"]["value"], at, "{name}");
        assert_eq!(keys["split.count"]["value"], count, "{name}");
        let tensors = one["tensors"].as_object().unwrap();
        let data: u64 = tensors.values().map(|info| info["bytes"].as_u64().unwrap()).sum();
        assert!(data <= 60_000 || tensors.len() == 1, "{name}: {data} bytes");
        // The model's keys go with the first shard only, as llama.cpp writes them.
        assert_eq!(keys.contains_key("general.architecture"), at == 0, "{name}");
    }
    let ours = Archive::open(&shards[0]).unwrap();
    let theirs = Archive::open(folder.join("model-q8_0.gguf")).unwrap();
    assert_eq!(ours.len(), theirs.len());
    for name in theirs.names() {
        let (a, b) = (ours.ggml(name).unwrap(), theirs.ggml(name).unwrap());
        assert_eq!((a.ty, fnv1a(&a.bytes().unwrap())), (b.ty, fnv1a(&b.bytes().unwrap())), "{name}");
    }
}

#[test]
fn qwen35_and_gemma4_folders_convert_to_the_gguf_files_llama_cpps_converter_writes() {
    // Names, shapes and values of every tensor (Qwen3.5's `1 + w` norms, `-exp(A_log)`, tiled
    // value heads and stacked experts; Gemma 4's rotary divisors and layer scales), the
    // hyperparameters and the tokenizer, and the logits, against the converter's F32 files.
    // qwen35-mtp: the folder with its multi-token-prediction head (`mtp.safetensors` joined to
    // it), against the converter's file that keeps the head.
    for case in ["qwen35", "qwen35moe", "gemma4", "gemma4moe", "qwen35-mtp"] {
        let dir = scratch();
        let (folder, gguf) = match case {
            "qwen35-mtp" => (mtp_folder(dir.path()), "model-mtp-f32.gguf"),
            _ => (crate::util::fixtures().join("models").join(case), "model-f32.gguf"),
        };
        let output = dir.path().join("ours.gguf");
        let args = ["convert".as_ref(), folder.as_os_str(), output.as_os_str()];
        let (code, _, stderr) = crate::util::run_nnx(&args);
        assert_eq!(code, 0, "{case}: {stderr}");
        let fixture = crate::util::fixtures().join("models").join(case.trim_end_matches("-mtp"));
        let (ours, theirs) = (Archive::open(&output).unwrap(), Archive::open(fixture.join(gguf)).unwrap());
        let mut names: Vec<&str> = ours.names().collect();
        let mut expected: Vec<&str> = theirs.names().collect();
        names.sort();
        expected.sort();
        assert_eq!(names, expected, "{case}");
        for name in names {
            let values = |archive: &Archive| {
                let tensor = archive.get(name).unwrap();
                (tensor.shape().to_vec(), tensor.to_dtype(nnx::DType::F32).unwrap().to_vec::<f32>().unwrap())
            };
            let ((shape, ours), (expected_shape, theirs)) = (values(&ours), values(&theirs));
            assert_eq!(shape, expected_shape, "{case}: {name}");
            let diff = ours.iter().zip(&theirs).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
            // The same values (the converter works in float32, which can move the last bit).
            assert!(diff <= 1e-6, "{case}: {name} differs by {diff}");
        }
        let keys = |archive: &Archive| {
            let metadata = archive.gguf_metadata().unwrap();
            let arch = metadata.architecture().unwrap().to_string();
            let mut keys: Vec<(String, String)> = metadata
                .iter()
                .filter(|(key, _)| key.starts_with(&format!("{arch}.")))
                .map(|(key, value)| (key.to_string(), format!("{value:?}")))
                .collect();
            keys.sort();
            keys
        };
        assert_eq!(keys(&ours), keys(&theirs), "{case}: hyperparameters");
        for key in ["model", "pre", "tokens", "token_type", "merges", "bos_token_id", "eos_token_id", "add_bos_token"] {
            let key = format!("tokenizer.ggml.{key}");
            let value = |archive: &Archive| archive.gguf_metadata().unwrap().get(&key).cloned();
            // (A flag the converter leaves out takes the reader's default, which nnx writes.)
            if value(&theirs).is_some() || !key.ends_with("add_bos_token") {
                assert_eq!(value(&ours), value(&theirs), "{case}: {key}");
            }
        }
        // The file runs as the converter's does.
        let reference: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(fixture.join("reference.json")).unwrap()).unwrap();
        let ids: Vec<u32> = serde_json::from_value(reference["ids"].clone()).unwrap();
        let logits = |path: &std::path::Path| {
            let loaded = nnx::models::load(path.to_str().unwrap()).unwrap();
            loaded.model.logits(&ids).unwrap().to_vec::<f32>().unwrap()
        };
        let (a, b) = (logits(&output), logits(&fixture.join(gguf)));
        let diff = a.iter().zip(&b).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(diff <= 1e-4, "{case}: the converted file's logits differ by {diff}");
    }
}

/// The qwen35 fixture's folder with its multi-token-prediction head, in `dir`.
fn mtp_folder(dir: &std::path::Path) -> std::path::PathBuf {
    let source = crate::util::fixtures().join("models").join("qwen35");
    let folder = dir.join("qwen35-mtp");
    std::fs::create_dir(&folder).unwrap();
    for file in ["tokenizer.json", "tokenizer_config.json", "generation_config.json"] {
        std::fs::copy(source.join(file), folder.join(file)).unwrap();
    }
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(source.join("config.json")).unwrap()).unwrap();
    config["mtp_num_hidden_layers"] = 1.into();
    std::fs::write(folder.join("config.json"), config.to_string()).unwrap();
    let parts =
        [source.join("model.safetensors"), source.join("mtp.safetensors")].map(|path| Archive::open(path).unwrap());
    Archive::union(parts).unwrap().save(folder.join("model.safetensors")).unwrap();
    folder
}
