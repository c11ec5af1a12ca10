//! The GGUF header: metadata and tensor infos, read and checked as ggml's own reader checks
//! them (`gguf.cpp`) before any tensor byte is touched.

use std::collections::HashSet;

use nnx_core::quant::ggml::GgmlType;

use super::value::{Array, Metadata, Value, ValueType};
use crate::error::GgufProblem;

/// `GGUF` as a little-endian u32.
pub(crate) const MAGIC: &[u8; 4] = b"GGUF";
/// The alignment of tensor data when `general.alignment` is not set.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml's longest string (`GGUF_MAX_STRING_LENGTH`).
const MAX_STRING: u64 = 1 << 30;
/// ggml's longest array (`GGUF_MAX_ARRAY_ELEMENTS`).
const MAX_ARRAY: u64 = 1 << 30;
/// ggml's longest tensor name is `GGML_MAX_NAME - 1`.
pub const MAX_NAME_BYTES: usize = 63;
/// ggml's most dimensions (`GGML_MAX_DIMS`).
pub const MAX_DIMS: usize = 4;
/// How deep nested arrays are followed: far beyond any file's, short of the stack's limit.
const MAX_NESTING: usize = 8;
/// The most memory the metadata of one file may take once read (tokenizer vocabularies of
/// 256k tokens with merges take about 20 MB); counted per value so that millions of empty
/// strings cost what they take, not what they store.
pub(crate) const MAX_METADATA_BYTES: u64 = 256 << 20;

/// One tensor info, with the shape in nnx's order (ggml's `ne` reversed).
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    /// The tensor's name.
    pub name: String,
    /// Its ggml type.
    pub ty: GgmlType,
    /// Its shape, outermost first (`[rows, cols]` for a matrix).
    pub shape: Vec<usize>,
    /// Offset of its data from the start of the data section.
    pub offset: u64,
    /// Bytes of its data.
    pub bytes: u64,
}

impl TensorInfo {
    /// The dtype the tensor is read as: its own for plain types, f32 (decoded) for blocks.
    pub fn dtype(&self) -> nnx_core::DType {
        super::plain_dtype(self.ty).unwrap_or(nnx_core::DType::F32)
    }
}

/// A parsed, checked header.
#[derive(Debug, Clone)]
pub(crate) struct Header {
    pub(crate) metadata: Metadata,
    pub(crate) tensors: Vec<TensorInfo>,
    /// File offset of the data section.
    pub(crate) data_start: u64,
}

impl Header {
    /// The file offsets of tensor `at`'s data.
    pub(crate) fn file_range(&self, at: usize) -> std::ops::Range<u64> {
        let info = &self.tensors[at];
        let start = self.data_start + info.offset;
        start..start + info.bytes
    }

    /// Where tensor `at` lies in the file `path`, for listings.
    pub(crate) fn location(&self, path: &std::path::Path, at: usize) -> crate::archive::EntryLocation {
        let info = &self.tensors[at];
        let begin = info.offset as usize;
        crate::archive::EntryLocation {
            path: path.to_path_buf(),
            data_offsets: (begin, begin + info.bytes as usize),
            file_offset: (self.data_start + info.offset) as usize,
        }
    }
}

struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
    memory: u64,
    /// The whole file's length: `bytes` may be only its first part (a file in a store).
    file_len: u64,
}

type Parse<T> = std::result::Result<T, GgufProblem>;

impl<'a> Cursor<'a> {
    fn take(&mut self, len: u64, what: &dyn Fn() -> String) -> Parse<&'a [u8]> {
        let end = (self.at as u64).checked_add(len).filter(|&end| end <= self.bytes.len() as u64);
        let Some(end) = end else {
            return Err(GgufProblem::Truncated {
                what: what(),
                needed: (self.at as u64).saturating_add(len),
                file_len: self.file_len,
            });
        };
        let slice = &self.bytes[self.at..end as usize];
        self.at = end as usize;
        Ok(slice)
    }

    fn array<const N: usize>(&mut self, what: &dyn Fn() -> String) -> Parse<[u8; N]> {
        let slice = self.take(N as u64, what)?;
        Ok(slice.try_into().expect("take gives N bytes"))
    }

    fn u32(&mut self, what: &dyn Fn() -> String) -> Parse<u32> {
        self.array(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: &dyn Fn() -> String) -> Parse<u64> {
        self.array(what).map(u64::from_le_bytes)
    }

    fn remaining(&self) -> u64 {
        (self.bytes.len() - self.at) as u64
    }

    /// Counts `bytes` of memory the header takes once read.
    fn spend(&mut self, bytes: u64) -> Parse<()> {
        self.memory = self.memory.saturating_add(bytes);
        if self.memory > MAX_METADATA_BYTES {
            return Err(GgufProblem::MetadataTooLarge { asked: self.memory, limit: MAX_METADATA_BYTES });
        }
        Ok(())
    }

    fn string(&mut self, what: &dyn Fn() -> String) -> Parse<String> {
        let len = self.u64(what)?;
        if len > MAX_STRING {
            return Err(GgufProblem::StringTooLong { what: what(), len, limit: MAX_STRING });
        }
        self.spend(len + 24)?;
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| GgufProblem::NotUtf8 { what: what() })
    }

    fn value(&mut self, key: &str, ty: ValueType, depth: usize) -> Parse<Value> {
        let what = || format!("the value of metadata `{key}`");
        Ok(match ty {
            ValueType::U8 => Value::U8(self.array::<1>(&what)?[0]),
            ValueType::I8 => Value::I8(i8::from_le_bytes(self.array(&what)?)),
            ValueType::U16 => Value::U16(u16::from_le_bytes(self.array(&what)?)),
            ValueType::I16 => Value::I16(i16::from_le_bytes(self.array(&what)?)),
            ValueType::U32 => Value::U32(u32::from_le_bytes(self.array(&what)?)),
            ValueType::I32 => Value::I32(i32::from_le_bytes(self.array(&what)?)),
            ValueType::F32 => Value::F32(f32::from_le_bytes(self.array(&what)?)),
            ValueType::U64 => Value::U64(u64::from_le_bytes(self.array(&what)?)),
            ValueType::I64 => Value::I64(i64::from_le_bytes(self.array(&what)?)),
            ValueType::F64 => Value::F64(f64::from_le_bytes(self.array(&what)?)),
            ValueType::Bool => Value::Bool(self.bool(key)?),
            ValueType::String => Value::String(self.string(&what)?),
            ValueType::Array => Value::Array(self.array_value(key, depth)?),
        })
    }

    fn bool(&mut self, key: &str) -> Parse<bool> {
        match self.array::<1>(&|| format!("the value of metadata `{key}`"))?[0] {
            0 => Ok(false),
            1 => Ok(true),
            value => Err(GgufProblem::Bool { key: key.to_string(), value }),
        }
    }

    fn value_type(&mut self, key: &str) -> Parse<ValueType> {
        let type_id = self.u32(&|| format!("the value type of metadata `{key}`"))?;
        ValueType::from_id(type_id).ok_or_else(|| GgufProblem::ValueType { key: key.to_string(), type_id })
    }

    fn array_value(&mut self, key: &str, depth: usize) -> Parse<Array> {
        if depth >= MAX_NESTING {
            return Err(GgufProblem::NestedTooDeep { key: key.to_string(), limit: MAX_NESTING });
        }
        let ty = self.value_type(key)?;
        let count = self.u64(&|| format!("the length of array `{key}`"))?;
        if count > MAX_ARRAY {
            return Err(GgufProblem::ArrayTooLong { key: key.to_string(), count, limit: MAX_ARRAY });
        }
        // Every element takes at least one byte of the file, so a count past the bytes left is
        // damage, caught before anything is reserved for it.
        let least = ty.fixed_size().unwrap_or(8) as u64;
        if count.saturating_mul(least) > self.remaining() {
            let needed = (self.at as u64).saturating_add(count.saturating_mul(least));
            return Err(GgufProblem::Truncated {
                what: format!("array `{key}` of {count} {}", ty.name()),
                needed,
                file_len: self.file_len,
            });
        }
        let n = count as usize;
        self.spend(32 + count * ty.fixed_size().unwrap_or(0) as u64)?;
        let what = || format!("array `{key}`");
        macro_rules! numbers {
            ($variant:ident, $t:ty) => {{
                let bytes = self.take(count * size_of::<$t>() as u64, &what)?;
                Array::$variant(
                    bytes
                        .chunks_exact(size_of::<$t>())
                        .map(|chunk| <$t>::from_le_bytes(chunk.try_into().expect("chunks of the size")))
                        .collect(),
                )
            }};
        }
        Ok(match ty {
            ValueType::U8 => Array::U8(self.take(count, &what)?.to_vec()),
            ValueType::I8 => numbers!(I8, i8),
            ValueType::U16 => numbers!(U16, u16),
            ValueType::I16 => numbers!(I16, i16),
            ValueType::U32 => numbers!(U32, u32),
            ValueType::I32 => numbers!(I32, i32),
            ValueType::F32 => numbers!(F32, f32),
            ValueType::U64 => numbers!(U64, u64),
            ValueType::I64 => numbers!(I64, i64),
            ValueType::F64 => numbers!(F64, f64),
            ValueType::Bool => Array::Bool((0..n).map(|_| self.bool(key)).collect::<Parse<_>>()?),
            ValueType::String => {
                // Grown as strings are read and counted, never reserved from the count alone.
                let mut strings = Vec::with_capacity(n.min(1 << 12));
                for i in 0..n {
                    strings.push(self.string(&|| format!("element {i} of array `{key}`"))?);
                }
                Array::String(strings)
            }
            ValueType::Array => {
                let mut arrays = Vec::with_capacity(n.min(1 << 12));
                for _ in 0..n {
                    self.spend(32)?;
                    arrays.push(self.array_value(key, depth + 1)?);
                }
                Array::Array(arrays)
            }
        })
    }
}

/// Reads and checks the header of a GGUF file of `file_len` bytes whose first bytes (all of
/// them, for a mapped file) are `bytes`.
///
/// # Errors
/// The [`GgufProblem`] of the first check that fails; [`GgufProblem::Truncated`] with a
/// `needed` offset within the file when `bytes` end before the header does.
pub(crate) fn parse(bytes: &[u8], file_len: u64) -> Parse<Header> {
    let mut cursor = Cursor { bytes, at: 0, memory: 0, file_len };
    let magic = cursor.take(4, &|| "the magic".into()).map_err(|_| GgufProblem::Magic { found: bytes.to_vec() })?;
    if magic != MAGIC {
        return Err(GgufProblem::Magic { found: magic.to_vec() });
    }
    let version = cursor.u32(&|| "the version".into())?;
    if version & 0xFFFF == 0 && version != 0 {
        return Err(GgufProblem::BigEndian { version });
    }
    if !(2..=3).contains(&version) {
        return Err(GgufProblem::Version { version });
    }
    let n_tensors = cursor.u64(&|| "the tensor count".into())?;
    let n_kv = cursor.u64(&|| "the metadata count".into())?;
    // The smallest metadata entry takes 13 bytes (empty key, type, one byte), the smallest
    // tensor info 24 (empty name, no dimensions, type, offset).
    if n_kv > file_len / 13 {
        return Err(GgufProblem::Count { what: "metadata entries", count: n_kv, file_len });
    }
    if n_tensors > file_len / 24 {
        return Err(GgufProblem::Count { what: "tensors", count: n_tensors, file_len });
    }

    let mut metadata = Metadata::new();
    for index in 0..n_kv {
        let key = cursor.string(&|| format!("the key of metadata entry {index}"))?;
        if key.is_empty() {
            return Err(GgufProblem::EmptyKey { index });
        }
        if metadata.contains(&key) {
            return Err(GgufProblem::DuplicateKey { key });
        }
        let ty = cursor.value_type(&key)?;
        let value = cursor.value(&key, ty, 0)?;
        metadata.set(key, value);
    }

    let alignment = match metadata.get("general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some(Value::U32(a)) if a.is_power_of_two() => u64::from(*a),
        Some(Value::U32(a)) => return Err(GgufProblem::Alignment { found: a.to_string() }),
        Some(other) => {
            return Err(GgufProblem::Alignment { found: format!("{other} stored as {}", other.value_type().name()) });
        }
    };

    let mut tensors = Vec::with_capacity(n_tensors.min(1 << 16) as usize);
    let mut names = HashSet::new();
    let mut expected_offset = 0u64;
    for index in 0..n_tensors {
        let name = cursor.string(&|| format!("the name of tensor {index}"))?;
        cursor.spend(96)?;
        let info = tensor_info(&mut cursor, name, index)?;
        if !names.insert(info.name.clone()) {
            return Err(GgufProblem::DuplicateTensor { name: info.name });
        }
        if info.offset != expected_offset {
            return Err(GgufProblem::Offset {
                name: info.name,
                expected: expected_offset,
                found: info.offset,
                alignment,
            });
        }
        expected_offset = pad(info.offset + info.bytes, alignment)
            .ok_or_else(|| GgufProblem::Overflow { name: info.name.clone(), ne: Vec::new() })?;
        tensors.push(info);
    }
    let data_start = pad(cursor.at as u64, alignment).unwrap_or(u64::MAX);
    for info in &tensors {
        let end = data_start.saturating_add(info.offset).saturating_add(info.bytes);
        if end > file_len {
            return Err(GgufProblem::DataPastEnd { name: info.name.clone(), end, file_len });
        }
    }
    Ok(Header { metadata, tensors, data_start })
}

/// `offset` rounded up to a multiple of `alignment` (a power of two).
pub(crate) fn pad(offset: u64, alignment: u64) -> Option<u64> {
    offset.checked_add(alignment - 1).map(|end| end & !(alignment - 1))
}

fn tensor_info(cursor: &mut Cursor<'_>, name: String, index: u64) -> Parse<TensorInfo> {
    if name.len() > MAX_NAME_BYTES {
        return Err(GgufProblem::NameTooLong { len: name.len(), name });
    }
    let what = || format!("the info of tensor {index} `{name}`");
    let dims = cursor.u32(&what)?;
    if dims as usize > MAX_DIMS {
        return Err(GgufProblem::Dims { name, dims });
    }
    let mut ne = Vec::with_capacity(dims as usize);
    for _ in 0..dims {
        ne.push(cursor.u64(&what)?);
    }
    let type_id = cursor.u32(&what)?;
    let offset = cursor.u64(&what)?;
    let overflow = || GgufProblem::Overflow { name: name.clone(), ne: ne.clone() };
    // ggml reads the dimensions as signed 64-bit numbers and keeps their product there.
    let mut values = 1i64;
    for &n in &ne {
        let n = i64::try_from(n).map_err(|_| overflow())?;
        values = values.checked_mul(n).ok_or_else(overflow)?;
    }
    let Some(ty) = GgmlType::from_id(type_id) else {
        return Err(GgufProblem::TensorType { name, type_id });
    };
    let row = ne.first().copied().unwrap_or(1);
    if row % ty.block_size() as u64 != 0 {
        return Err(GgufProblem::PartialBlock { name, ty: ty.name(), row, block: ty.block_size() });
    }
    let bytes = (values as u64 / ty.block_size() as u64).checked_mul(ty.type_size() as u64).ok_or_else(overflow)?;
    let mut shape = Vec::with_capacity(ne.len());
    for &n in ne.iter().rev() {
        shape.push(usize::try_from(n).map_err(|_| overflow())?);
    }
    usize::try_from(bytes).map_err(|_| overflow())?;
    Ok(TensorInfo { name, ty, shape, offset, bytes })
}
