//! Writing GGUF version 3: metadata, tensor infos and aligned data, atomically (written beside
//! the target and renamed), optionally split into shards named as llama.cpp names them.

use std::io::Write;
use std::path::{Path, PathBuf};

use nnx_core::Tensor;

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
        let problem = if name.len() > MAX_NAME_BYTES {
            Some(GgufProblem::NameTooLong { len: name.len(), name: name.clone() })
        } else if self.tensors.iter().any(|(other, _)| *other == name) {
            Some(GgufProblem::DuplicateTensor { name: name.clone() })
        } else if tensor.shape.len() > MAX_DIMS {
            Some(GgufProblem::Dims { name: name.clone(), dims: tensor.shape.len() as u32 })
        } else {
            let cols = tensor.shape.last().copied().unwrap_or(1);
            let rows: usize = tensor.shape[..tensor.shape.len().saturating_sub(1)].iter().product();
            match tensor.ty.row_bytes(cols).and_then(|row| row.checked_mul(rows)) {
                Some(bytes) if bytes == tensor.data.byte_len() => None,
                Some(_) | None if !cols.is_multiple_of(tensor.ty.block_size()) => Some(GgufProblem::PartialBlock {
                    name: name.clone(),
                    ty: tensor.ty.name(),
                    row: cols as u64,
                    block: tensor.ty.block_size(),
                }),
                _ => Some(GgufProblem::Overflow {
                    name: name.clone(),
                    ne: tensor.shape.iter().rev().map(|&n| n as u64).collect(),
                }),
            }
        };
        if let Some(problem) = problem {
            return Err(Error::Gguf { path: PathBuf::from("the GGUF being written"), problem });
        }
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

fn write_file(
    path: &Path,
    metadata: &Metadata,
    tensors: &[&(String, GgmlTensor)],
    alignment: Option<u32>,
) -> Result<()> {
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
    for (name, tensor) in tensors {
        put_string(&mut head, name);
        head.extend_from_slice(&(tensor.shape.len() as u32).to_le_bytes());
        for &n in tensor.shape.iter().rev() {
            head.extend_from_slice(&(n as u64).to_le_bytes());
        }
        head.extend_from_slice(&tensor.ty.id().to_le_bytes());
        head.extend_from_slice(&offset.to_le_bytes());
        offset = pad(offset + tensor.data.byte_len() as u64, alignment).expect("sizes of tensors in memory fit");
    }
    let data_start = pad(head.len() as u64, alignment).expect("a header in memory fits");
    head.resize(data_start as usize, 0);
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
