//! Writing GGUF version 3: metadata, tensor infos and aligned data, atomically (written beside
//! the target and renamed), optionally split into shards named as llama.cpp names them.

use std::io::Write;
use std::path::{Path, PathBuf};

use nnx_core::Tensor;
use nnx_core::quant::ggml::GgmlType;

use super::header::{DEFAULT_ALIGNMENT, MAGIC, MAX_DIMS, MAX_NAME_BYTES, pad};
use super::value::{Array, Metadata, Value};
use super::{GgmlTensor, VERSION, ggml_type_of};
use crate::error::{Error, GgufProblem, Result};
use crate::fs;

/// The file name of shard `n` of `total` of a split file (`NAME-00001-of-00003.gguf`).
pub fn shard_file_name(base: &str, n: usize, total: usize) -> String {
    format!("{base}-{n:05}-of-{total:05}.gguf")
}

/// A GGUF file being put together: metadata and tensors in the order they are added.
///
/// ```
/// use nnx_core::Tensor;
/// use nnx_core::quant::ggml::GgmlType;
/// use nnx_io::gguf::{GgmlTensor, GgufWriter, Value};
///
/// let dir = std::env::temp_dir().join(format!("nnx-doc-gguf-{}", std::process::id()));
/// std::fs::create_dir_all(&dir)?;
/// let weight = Tensor::from_vec((0..512).map(|i| i as f32 / 512.0).collect::<Vec<_>>(), &[2, 256])?;
/// let mut writer = GgufWriter::new();
/// writer.metadata_mut().set("general.architecture", Value::String("llama".into()));
/// writer.add("blk.0.ffn_up.weight", GgmlTensor::quantize(&weight, GgmlType::Q8_0)?)?;
/// writer.write(dir.join("tiny.gguf"))?;
///
/// let archive = nnx_io::Archive::open(dir.join("tiny.gguf"))?;
/// assert_eq!(archive.ggml_type("blk.0.ffn_up.weight"), Some(GgmlType::Q8_0));
/// # std::fs::remove_dir_all(&dir)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, Default)]
pub struct GgufWriter {
    metadata: Metadata,
    tensors: Vec<(String, GgmlTensor)>,
    alignment: Option<u32>,
}

impl GgufWriter {
    /// A writer with no metadata and no tensors.
    pub fn new() -> GgufWriter {
        GgufWriter::default()
    }

    /// The metadata to write (`general.alignment` is written from [`GgufWriter::set_alignment`]).
    pub fn metadata_mut(&mut self) -> &mut Metadata {
        &mut self.metadata
    }

    /// The metadata to write.
    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    /// Aligns tensor data to `alignment` bytes instead of 32.
    ///
    /// # Errors
    /// [`Error::Gguf`] with [`GgufProblem::Alignment`] unless it is a non-zero power of two.
    pub fn set_alignment(&mut self, alignment: u32) -> Result<()> {
        if !alignment.is_power_of_two() {
            return Err(Error::Gguf {
                path: PathBuf::new(),
                problem: GgufProblem::Alignment { found: alignment.to_string() },
            });
        }
        self.alignment = Some(alignment);
        Ok(())
    }

    /// Adds a tensor kept as ggml stores it, after the others.
    ///
    /// # Errors
    /// [`Error::Gguf`] for a name over 63 bytes or given before, more than 4 dimensions, or
    /// bytes that are not the tensor's blocks.
    pub fn add(&mut self, name: impl Into<String>, tensor: GgmlTensor) -> Result<()> {
        let name = name.into();
        if self.tensors.iter().any(|(other, _)| *other == name) {
            let problem = GgufProblem::DuplicateTensor { name };
            return Err(Error::Gguf { path: PathBuf::from("the GGUF being written"), problem });
        }
        check_tensor(&name, tensor.ty, &tensor.shape, Some(tensor.data.byte_len()))?;
        self.tensors.push((name, tensor));
        Ok(())
    }

    /// Adds a tensor stored as it is (F32, F16, BF16, F64, I8 to I64).
    ///
    /// # Errors
    /// [`Error::Unsavable`]-like [`Error::GgmlUnsupported`] for a dtype GGUF has no type for,
    /// and the errors of [`GgufWriter::add`].
    pub fn add_tensor(&mut self, name: impl Into<String>, tensor: &Tensor) -> Result<()> {
        let Some(ty) = ggml_type_of(tensor.dtype()) else {
            return Err(Error::GgmlUnsupported {
                op: "GgufWriter::add_tensor",
                ty: tensor.dtype().as_str(),
                hint: "GGUF stores f32, f16, bf16, f64 and i8 to i64 as they are: cast the tensor first",
            });
        };
        let data = Tensor::from_vec(tensor.to_bytes()?.into_owned(), &[tensor.byte_len()])?;
        self.add(name, GgmlTensor { ty, shape: tensor.shape().to_vec(), data })
    }

    /// The tensors added so far, in order.
    pub fn tensors(&self) -> impl Iterator<Item = (&str, &GgmlTensor)> {
        self.tensors.iter().map(|(name, tensor)| (name.as_str(), tensor))
    }

    /// Writes one file at `path`, replacing it atomically.
    ///
    /// # Errors
    /// [`Error::Io`] when the file cannot be written; the target is then unchanged.
    pub fn write(&self, path: impl AsRef<Path>) -> Result<()> {
        let all: Vec<&(String, GgmlTensor)> = self.tensors.iter().collect();
        write_file(path.as_ref(), &self.metadata, &all, self.alignment)
    }

    /// Writes shards of at most `max_tensors` tensors and about `max_bytes` bytes of data each
    /// (a tensor larger than that gets a shard of its own), named
    /// `BASE-00001-of-0000N.gguf` in `dir`, with llama.cpp's `split.*` keys; the metadata goes
    /// in the first shard. One shard is written as `BASE-00001-of-00001.gguf`.
    ///
    /// # Errors
    /// As [`GgufWriter::write`].
    pub fn write_split(&self, dir: &Path, base: &str, max_tensors: usize, max_bytes: u64) -> Result<Vec<PathBuf>> {
        let mut shards: Vec<Vec<&(String, GgmlTensor)>> = vec![Vec::new()];
        let mut bytes = 0u64;
        for item in &self.tensors {
            let size = item.1.data.byte_len() as u64;
            let current = shards.last().expect("one shard at least");
            if !current.is_empty() && (current.len() >= max_tensors.max(1) || bytes + size > max_bytes) {
                shards.push(Vec::new());
                bytes = 0;
            }
            bytes += size;
            shards.last_mut().expect("one shard at least").push(item);
        }
        let total = shards.len();
        let mut paths = Vec::with_capacity(total);
        for (index, shard) in shards.iter().enumerate() {
            let mut metadata = if index == 0 { self.metadata.clone() } else { Metadata::new() };
            metadata.set("split.no", Value::U16(index as u16));
            metadata.set("split.count", Value::U16(total as u16));
            metadata.set("split.tensors.count", Value::I32(self.tensors.len() as i32));
            let path = dir.join(shard_file_name(base, index + 1, total));
            write_file(&path, &metadata, shard, self.alignment)?;
            paths.push(path);
        }
        Ok(paths)
    }
}

/// The bytes of a tensor named `name` of `ty` and `shape`, when they make a GGUF tensor (a
/// name of at most 63 bytes, at most 4 dimensions, rows of whole blocks) and, where `bytes` is
/// given, it is that size.
fn check_tensor(name: &str, ty: GgmlType, shape: &[usize], bytes: Option<usize>) -> Result<u64> {
    let fail = |problem| Err(Error::Gguf { path: PathBuf::from("the GGUF being written"), problem });
    if name.len() > MAX_NAME_BYTES {
        return fail(GgufProblem::NameTooLong { len: name.len(), name: name.to_string() });
    }
    if shape.len() > MAX_DIMS {
        return fail(GgufProblem::Dims { name: name.to_string(), dims: shape.len() as u32 });
    }
    let cols = shape.last().copied().unwrap_or(1);
    let rows = shape[..shape.len().saturating_sub(1)].iter().try_fold(1usize, |rows, &n| rows.checked_mul(n));
    match ty.row_bytes(cols).zip(rows).and_then(|(row, rows)| row.checked_mul(rows)) {
        Some(size) if bytes.is_none_or(|bytes| bytes == size) => Ok(size as u64),
        Some(_) | None if !cols.is_multiple_of(ty.block_size()) => fail(GgufProblem::PartialBlock {
            name: name.to_string(),
            ty: ty.name(),
            row: cols as u64,
            block: ty.block_size(),
        }),
        _ => {
            fail(GgufProblem::Overflow { name: name.to_string(), ne: shape.iter().rev().map(|&n| n as u64).collect() })
        }
    }
}

/// One tensor of a GGUF file written as it is made ([`write_streaming`]): its name, ggml type
/// and shape, from which the header is written before any tensor exists.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedTensor {
    /// The name.
    pub name: String,
    /// The ggml type it is written as.
    pub ty: GgmlType,
    /// The shape, outermost first.
    pub shape: Vec<usize>,
    /// The bytes making it reads (an input tensor it is quantized from, whose pages stay
    /// resident while it is made), counted against the window beside its own; 0 for none.
    pub reads: u64,
}

/// The most bytes of made tensors [`write_streaming`] holds at once beside the one being
/// written: tensors are made in parallel in groups of about this size, then written in order
/// and dropped.
pub const STREAM_WINDOW: u64 = 256 << 20;

/// Writes a GGUF file at `path` (replacing it atomically) of `metadata` and the tensors of
/// `plan`, in order, each made by `make(index)` only when its group comes: the header is
/// written first from the planned types and shapes, then the tensors are made by rayon's
/// threads in groups of at most `window` bytes read and made ([`STREAM_WINDOW`] is a good one;
/// one tensor alone where it is larger) and written. Memory is bounded by one group, whatever the file's size. The bytes are those
/// of [`GgufWriter::write`] with the same tensors.
///
/// # Errors
/// [`Error::Gguf`] for a plan that does not make a GGUF file (as [`GgufWriter::add`]) or a made
/// tensor whose type, shape or size is not its plan's; the errors of `make`; [`Error::Io`]
/// when the file cannot be written. The target is then unchanged.
pub fn write_streaming(
    path: &Path,
    metadata: &Metadata,
    alignment: Option<u32>,
    plan: &[PlannedTensor],
    window: u64,
    make: impl Fn(usize) -> Result<GgmlTensor> + Sync,
) -> Result<()> {
    use rayon::prelude::*;
    let mut seen = std::collections::HashSet::new();
    let mut sizes = Vec::with_capacity(plan.len());
    for tensor in plan {
        if !seen.insert(tensor.name.as_str()) {
            let problem = GgufProblem::DuplicateTensor { name: tensor.name.clone() };
            return Err(Error::Gguf { path: PathBuf::from("the GGUF being written"), problem });
        }
        sizes.push(check_tensor(&tensor.name, tensor.ty, &tensor.shape, None)?);
    }
    let infos: Vec<(&str, GgmlType, &[usize], u64)> = plan
        .iter()
        .zip(&sizes)
        .map(|(tensor, &size)| (tensor.name.as_str(), tensor.ty, tensor.shape.as_slice(), size))
        .collect();
    let (head, alignment) = header(metadata, &infos, alignment)?;
    fs::write_atomic_with(path, |out: &mut dyn Write| {
        out.write_all(&head).map_err(Error::io("write", path))?;
        let mut written = 0u64;
        let mut start = 0;
        while start < plan.len() {
            // A group's cost: what its tensors read while they are made, and what they make.
            let cost = |at: usize| sizes[at].saturating_add(plan[at].reads);
            let mut end = start + 1;
            let mut bytes = cost(start);
            while end < plan.len() && bytes.saturating_add(cost(end)) <= window {
                bytes += cost(end);
                end += 1;
            }
            let made: Vec<GgmlTensor> = (start..end).into_par_iter().map(&make).collect::<Result<_>>()?;
            for (at, tensor) in (start..end).zip(made) {
                let planned = &plan[at];
                if tensor.ty != planned.ty
                    || tensor.shape != planned.shape
                    || tensor.data.byte_len() as u64 != sizes[at]
                {
                    return Err(Error::Gguf {
                        path: path.to_path_buf(),
                        problem: GgufProblem::Overflow {
                            name: planned.name.clone(),
                            ne: tensor.shape.iter().rev().map(|&n| n as u64).collect(),
                        },
                    });
                }
                let data = tensor.bytes().map_err(|source| Error::Data {
                    path: path.to_path_buf(),
                    name: planned.name.clone(),
                    source: Box::new(source),
                })?;
                out.write_all(&data).map_err(Error::io("write", path))?;
                written += data.len() as u64;
                let padded = pad(written, alignment).expect("sizes checked to fit");
                out.write_all(&vec![0u8; (padded - written) as usize]).map_err(Error::io("write", path))?;
                written = padded;
            }
            start = end;
        }
        Ok(())
    })
}

/// Where [`write_streaming_split`] writes its shards and how large they get.
#[derive(Clone, Copy, Debug)]
pub struct Shards<'a> {
    /// The folder.
    pub dir: &'a Path,
    /// The base of the names: `BASE-00001-of-0000N.gguf`.
    pub base: &'a str,
    /// The bytes of tensor data a shard holds at most (a tensor larger than that gets a shard
    /// of its own).
    pub max_bytes: u64,
}

/// [`write_streaming`] into shards, named as llama.cpp names them with its `split.*` keys and
/// the metadata in the first shard, as [`GgufWriter::write_split`] writes them: the same bytes.
/// Each shard is written as its tensors are made.
///
/// # Errors
/// As [`write_streaming`], for the first shard that fails; the shards written before it stay.
pub fn write_streaming_split(
    shards: Shards<'_>,
    metadata: &Metadata,
    alignment: Option<u32>,
    plan: &[PlannedTensor],
    window: u64,
    make: impl Fn(usize) -> Result<GgmlTensor> + Sync,
) -> Result<Vec<PathBuf>> {
    // Each shard's first tensor and the one after its last.
    let mut cuts: Vec<(usize, usize)> = Vec::new();
    let mut bytes = 0u64;
    for (at, tensor) in plan.iter().enumerate() {
        let size = check_tensor(&tensor.name, tensor.ty, &tensor.shape, None)?;
        match cuts.last_mut() {
            Some(last) if bytes.saturating_add(size) <= shards.max_bytes => last.1 = at + 1,
            _ => {
                cuts.push((at, at + 1));
                bytes = 0;
            }
        }
        bytes = bytes.saturating_add(size);
    }
    if cuts.is_empty() {
        cuts.push((0, 0));
    }
    let total = cuts.len();
    let mut paths = Vec::with_capacity(total);
    for (index, (first, end)) in cuts.into_iter().enumerate() {
        let mut keys = if index == 0 { metadata.clone() } else { Metadata::new() };
        keys.set("split.no", Value::U16(index as u16));
        keys.set("split.count", Value::U16(total as u16));
        keys.set("split.tensors.count", Value::I32(plan.len() as i32));
        let path = shards.dir.join(shard_file_name(shards.base, index + 1, total));
        write_streaming(&path, &keys, alignment, &plan[first..end], window, |at| make(first + at))?;
        paths.push(path);
    }
    Ok(paths)
}

/// The header of a GGUF file of `metadata` and tensors `(name, type, shape, bytes)`, padded to
/// where the data starts, and the alignment of the data.
fn header(
    metadata: &Metadata,
    tensors: &[(&str, GgmlType, &[usize], u64)],
    alignment: Option<u32>,
) -> Result<(Vec<u8>, u64)> {
    // `general.alignment` is written from `alignment` alone, last, as `Metadata::set` would
    // place it; the rest is written as it is, not copied (a vocabulary can be most of a file).
    let aligned = alignment.filter(|&a| u64::from(a) != DEFAULT_ALIGNMENT).map(Value::U32);
    let kept = || metadata.iter().filter(|(key, _)| *key != "general.alignment");
    let alignment = alignment.map_or(DEFAULT_ALIGNMENT, u64::from);
    let mut head = Vec::new();
    head.extend_from_slice(MAGIC);
    head.extend_from_slice(&VERSION.to_le_bytes());
    head.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    head.extend_from_slice(&((kept().count() + usize::from(aligned.is_some())) as u64).to_le_bytes());
    for (key, value) in kept().chain(aligned.as_ref().map(|value| ("general.alignment", value))) {
        put_string(&mut head, key);
        head.extend_from_slice(&value.value_type().id().to_le_bytes());
        put_value(&mut head, value);
    }
    let mut offset = 0u64;
    for &(name, ty, shape, bytes) in tensors {
        put_string(&mut head, name);
        head.extend_from_slice(&(shape.len() as u32).to_le_bytes());
        for &n in shape.iter().rev() {
            head.extend_from_slice(&(n as u64).to_le_bytes());
        }
        head.extend_from_slice(&ty.id().to_le_bytes());
        head.extend_from_slice(&offset.to_le_bytes());
        offset = offset.checked_add(bytes).and_then(|end| pad(end, alignment)).ok_or_else(|| Error::Gguf {
            path: PathBuf::from("the GGUF being written"),
            problem: GgufProblem::Overflow {
                name: name.to_string(),
                ne: shape.iter().rev().map(|&n| n as u64).collect(),
            },
        })?;
    }
    let data_start = pad(head.len() as u64, alignment).expect("a header in memory fits");
    head.resize(data_start as usize, 0);
    Ok((head, alignment))
}

fn write_file(
    path: &Path,
    metadata: &Metadata,
    tensors: &[&(String, GgmlTensor)],
    alignment: Option<u32>,
) -> Result<()> {
    let infos: Vec<(&str, GgmlType, &[usize], u64)> = tensors
        .iter()
        .map(|(name, tensor)| (name.as_str(), tensor.ty, tensor.shape.as_slice(), tensor.data.byte_len() as u64))
        .collect();
    let (head, alignment) = header(metadata, &infos, alignment)?;
    fs::write_atomic_with(path, |out: &mut dyn Write| {
        out.write_all(&head).map_err(Error::io("write", path))?;
        let mut written = 0u64;
        for (name, tensor) in tensors {
            let bytes = tensor.bytes().map_err(|source| Error::Data {
                path: path.to_path_buf(),
                name: name.clone(),
                source: Box::new(source),
            })?;
            out.write_all(&bytes).map_err(Error::io("write", path))?;
            written += bytes.len() as u64;
            let padded = pad(written, alignment).expect("sizes of tensors in memory fit");
            out.write_all(&vec![0u8; (padded - written) as usize]).map_err(Error::io("write", path))?;
            written = padded;
        }
        Ok(())
    })
}

fn put_string(out: &mut Vec<u8>, text: &str) {
    out.extend_from_slice(&(text.len() as u64).to_le_bytes());
    out.extend_from_slice(text.as_bytes());
}

fn put_value(out: &mut Vec<u8>, value: &Value) {
    match value {
        Value::U8(v) => out.push(*v),
        Value::I8(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::U16(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::I16(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::U32(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::I32(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::F32(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::Bool(v) => out.push(u8::from(*v)),
        Value::String(v) => put_string(out, v),
        Value::Array(v) => put_array(out, v),
        Value::U64(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::I64(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::F64(v) => out.extend_from_slice(&v.to_le_bytes()),
    }
}

fn put_array(out: &mut Vec<u8>, array: &Array) {
    out.extend_from_slice(&array.element_type().id().to_le_bytes());
    out.extend_from_slice(&(array.len() as u64).to_le_bytes());
    macro_rules! numbers {
        ($v:expr) => {
            for x in $v {
                out.extend_from_slice(&x.to_le_bytes());
            }
        };
    }
    match array {
        Array::U8(v) => out.extend_from_slice(v),
        Array::I8(v) => numbers!(v),
        Array::U16(v) => numbers!(v),
        Array::I16(v) => numbers!(v),
        Array::U32(v) => numbers!(v),
        Array::I32(v) => numbers!(v),
        Array::F32(v) => numbers!(v),
        Array::Bool(v) => out.extend(v.iter().map(|&b| u8::from(b))),
        Array::String(v) => v.iter().for_each(|text| put_string(out, text)),
        Array::Array(v) => v.iter().for_each(|inner| put_array(out, inner)),
        Array::U64(v) => numbers!(v),
        Array::I64(v) => numbers!(v),
        Array::F64(v) => numbers!(v),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nnx_core::DType;

    fn tensor(at: usize) -> GgmlTensor {
        let values: Vec<f32> = (0..64 * (at + 1)).map(|v| (v as f32 * 0.37 + at as f32).sin()).collect();
        let values = Tensor::from_vec(values, &[at + 1, 64]).unwrap();
        let ty = if at.is_multiple_of(2) { GgmlType::Q8_0 } else { GgmlType::F32 };
        GgmlTensor::quantize(&values, ty).unwrap()
    }

    #[test]
    fn a_streamed_file_is_the_written_one_byte_for_byte() {
        let dir = std::env::temp_dir().join(format!("nnx-stream-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut writer = GgufWriter::new();
        writer.metadata_mut().set("general.architecture", Value::String("nnx".into()));
        let plan: Vec<PlannedTensor> = (0..9)
            .map(|at| {
                let made = tensor(at);
                writer.add(format!("t{at}"), made.clone()).unwrap();
                PlannedTensor { name: format!("t{at}"), ty: made.ty, shape: made.shape, reads: 0 }
            })
            .collect();
        writer.write(dir.join("whole.gguf")).unwrap();
        // Groups of about 600 bytes: several tensors a group, and groups of one.
        write_streaming(&dir.join("streamed.gguf"), writer.metadata(), None, &plan, 600, |at| Ok(tensor(at))).unwrap();
        assert_eq!(std::fs::read(dir.join("whole.gguf")).unwrap(), std::fs::read(dir.join("streamed.gguf")).unwrap());
        // A made tensor that is not its plan fails the write and leaves the target as it was.
        let wrong =
            write_streaming(&dir.join("streamed.gguf"), writer.metadata(), None, &plan, 600, |at| Ok(tensor(at ^ 1)));
        assert!(wrong.is_err());
        assert_eq!(std::fs::read(dir.join("whole.gguf")).unwrap(), std::fs::read(dir.join("streamed.gguf")).unwrap());
        // Split: the shards of `write_split`, byte for byte.
        let whole = writer.write_split(&dir, "whole", usize::MAX, 1500).unwrap();
        let streamed = write_streaming_split(
            Shards { dir: &dir, base: "streamed", max_bytes: 1500 },
            writer.metadata(),
            None,
            &plan,
            600,
            |at| Ok(tensor(at)),
        )
        .unwrap();
        assert!(whole.len() > 2, "several shards");
        assert_eq!(whole.len(), streamed.len());
        for (a, b) in whole.iter().zip(&streamed) {
            assert_eq!(std::fs::read(a).unwrap(), std::fs::read(b).unwrap());
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn blocks_decode_into_any_float_dtype_a_few_rows_at_a_time_as_through_f32() {
        // Rows of 4096 values: chunks of 256 rows, the last one partial.
        let values: Vec<f32> = (0..4096 * 300).map(|v| (v as f32 * 0.013).sin()).collect();
        let values = Tensor::from_vec(values, &[300, 4096]).unwrap();
        for ty in [GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q6_K] {
            let packed = GgmlTensor::quantize(&values, ty).unwrap();
            for dtype in [DType::F32, DType::F16, DType::BF16] {
                let whole = packed.dequantize().unwrap().to_dtype(dtype).unwrap();
                let rows = packed.dequantize_to(dtype).unwrap();
                assert_eq!(rows.shape(), [300, 4096]);
                assert_eq!(rows.to_bytes().unwrap(), whole.to_bytes().unwrap(), "{ty:?} to {dtype}");
            }
        }
    }
}
