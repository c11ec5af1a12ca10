//! GGUF, the format of llama.cpp: metadata and tensors of ggml types, read over the mapped
//! file and written atomically.
//!
//! Opening reads and checks the header only (every check of ggml's own reader). Plain tensors
//! (F32, F16, BF16, F64, integers) are views of the file's pages; block-quantized tensors are
//! decoded to f32 when asked for as tensors, and stay packed through [`GgmlTensor`] for the
//! products that read the blocks directly. Shapes read outermost first (`[rows, cols]`), the
//! reverse of ggml's `ne`.

mod header;
mod mixture;
#[cfg(feature = "remote")]
pub(crate) mod remote;
mod value;
mod write;

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use nnx_core::quant::ggml::{GgmlType, dequantize_row};
use nnx_core::{ByteSource, DType, Tensor};

pub use header::{DEFAULT_ALIGNMENT, MAX_DIMS, MAX_NAME_BYTES, TensorInfo};
pub use mixture::{Mixture, Recipe, TypePlan, fallback, may_quantize};
pub use value::{Array, Metadata, Value, ValueType};
pub use write::{
    GgufWriter, PlannedTensor, STREAM_WINDOW, Shards, shard_file_name, write_streaming, write_streaming_split,
};

use crate::archive::{Archive, EntryLocation};
use crate::error::{Error, GgufProblem, Result};
use crate::mapping::Mapping;
use crate::source::{DataError, Source, Store};

/// The GGUF format version nnx writes.
pub const VERSION: u32 = 3;

/// The dtype of a plain ggml type; `None` for block types.
pub fn plain_dtype(ty: GgmlType) -> Option<DType> {
    Some(match ty {
        GgmlType::F32 => DType::F32,
        GgmlType::F16 => DType::F16,
        GgmlType::BF16 => DType::BF16,
        GgmlType::F64 => DType::F64,
        GgmlType::I8 => DType::I8,
        GgmlType::I16 => DType::I16,
        GgmlType::I32 => DType::I32,
        GgmlType::I64 => DType::I64,
        _ => return None,
    })
}

/// The ggml type of a dtype GGUF stores as it is; `None` for dtypes it has no type for.
pub fn ggml_type_of(dtype: DType) -> Option<GgmlType> {
    Some(match dtype {
        DType::F32 => GgmlType::F32,
        DType::F16 => GgmlType::F16,
        DType::BF16 => GgmlType::BF16,
        DType::F64 => GgmlType::F64,
        DType::I8 => GgmlType::I8,
        DType::I16 => GgmlType::I16,
        DType::I32 => GgmlType::I32,
        DType::I64 => GgmlType::I64,
        _ => return None,
    })
}

/// A tensor kept as ggml stores it: the type, the shape and the packed bytes (a view of the
/// file's pages when it comes from a file).
#[derive(Clone, Debug)]
pub struct GgmlTensor {
    /// The ggml type.
    pub ty: GgmlType,
    /// The shape, outermost first.
    pub shape: Vec<usize>,
    /// The packed bytes, a U8 tensor of one axis.
    pub data: Tensor,
}

/// Values widened to f32 at a time by [`GgmlTensor::quantize`] (per thread): 4 MiB.
const QUANTIZE_CHUNK_VALUES: usize = 1 << 20;

impl GgmlTensor {
    /// Packs floats as `ty` (a type [`nnx_core::quant::ggml::can_quantize`] takes), rows along
    /// the last axis.
    ///
    /// # Errors
    /// [`Error::GgmlRow`] when the last axis does not hold whole blocks,
    /// [`Error::GgmlUnsupported`] for a type nnx does not quantize to, and the errors of
    /// reading `tensor` as f32.
    pub fn quantize(tensor: &Tensor, ty: GgmlType) -> Result<GgmlTensor> {
        use rayon::prelude::*;
        // Within the view's expansion limit: a view read from a file may repeat a few bytes
        // into gigabytes.
        tensor.check_expansion(tensor.expansion_limit())?;
        let shape = tensor.shape().to_vec();
        let bytes = packed_len(ty, &shape)?;
        let (count, cols) = (shape.iter().product::<usize>(), shape.last().copied().unwrap_or(1).max(1));
        // The blocks are written where the tensor keeps them: no second copy of the output.
        let data = Tensor::filled(DType::U8, &[bytes], |out| {
            if count == 0 {
                return Ok(());
            }
            // A few rows at a time, widened to f32 on the way: never the whole tensor in f32
            // (a 500 MB BF16 tensor would take 1 GB). Rows are whole blocks, so the bytes are
            // those of one pass over all the values.
            let rows = count / cols;
            let flat = match tensor.reshape(&[rows, cols]) {
                Ok(flat) => flat,
                Err(_) => tensor.contiguous_within(tensor.expansion_limit())?.reshape(&[rows, cols])?,
            };
            let row_bytes = bytes / rows;
            let per_chunk = (QUANTIZE_CHUNK_VALUES / cols).max(1);
            out.par_chunks_mut(per_chunk * row_bytes).enumerate().try_for_each(|(at, dst)| -> Result<()> {
                let part = flat.narrow(0, at * per_chunk, dst.len() / row_bytes)?.to_dtype(DType::F32)?.contiguous();
                nnx_core::quant::ggml::quantize_row(ty, part.as_slice::<f32>()?.unwrap_or_default(), dst)?;
                Ok(())
            })
        })?;
        Ok(GgmlTensor { ty, shape, data })
    }

    /// The values decoded to f32 with the shape, bit-exact with ggml.
    ///
    /// # Errors
    /// [`Error::GgmlUnsupported`] for a type without a decoder.
    pub fn dequantize(&self) -> Result<Tensor> {
        let bytes = self.data.to_bytes()?;
        decode(self.ty, &self.shape, &bytes)
    }

    /// The values decoded to `dtype` (f32, f16, bf16 or f64) a few rows at a time, in parallel:
    /// never the whole tensor in f32 on the way (a 1 GB Q8_0 embedding would take 4 GB), the
    /// values those of [`GgmlTensor::dequantize`] cast.
    ///
    /// # Errors
    /// As [`GgmlTensor::dequantize`], and [`Error::NotCastable`] for another dtype.
    pub fn dequantize_to(&self, dtype: DType) -> Result<Tensor> {
        use rayon::prelude::*;
        if !dtype.is_castable_float() {
            return Err(Error::NotCastable { from: DType::F32, to: dtype });
        }
        let bytes = self.data.to_bytes()?;
        let (count, cols) = (self.shape.iter().product::<usize>(), self.shape.last().copied().unwrap_or(1).max(1));
        let rows = count / cols;
        if count == 0 || bytes.len() != packed_len(self.ty, &self.shape)? {
            return decode(self.ty, &self.shape, &bytes)?.to_dtype(dtype);
        }
        let (row_bytes, size) = (bytes.len() / rows, dtype.size_in_bytes().unwrap_or(4));
        let per_chunk = (QUANTIZE_CHUNK_VALUES / cols).max(1);
        if dtype == DType::F32 {
            // Straight into the output, which is aligned for f32: no value copied twice.
            return Tensor::filled(dtype, &self.shape, |out| {
                out.par_chunks_mut(per_chunk * cols * size).enumerate().try_for_each(|(at, dst)| -> Result<()> {
                    let chunk_rows = dst.len() / (cols * size);
                    let packed = &bytes[at * per_chunk * row_bytes..][..chunk_rows * row_bytes];
                    match bytemuck::try_cast_slice_mut::<u8, f32>(dst) {
                        Ok(values) => nnx_core::quant::ggml::dequantize_row(self.ty, packed, values),
                        Err(_) => {
                            let values = decode(self.ty, &[chunk_rows, cols], packed)?;
                            dst.copy_from_slice(&values.to_bytes()?);
                            Ok(())
                        }
                    }
                })
            });
        }
        Tensor::filled(dtype, &self.shape, |out| {
            out.par_chunks_mut(per_chunk * cols * size).enumerate().try_for_each(|(at, dst)| -> Result<()> {
                let chunk_rows = dst.len() / (cols * size);
                let packed = &bytes[at * per_chunk * row_bytes..][..chunk_rows * row_bytes];
                let values = decode(self.ty, &[chunk_rows, cols], packed)?.to_dtype(dtype)?;
                dst.copy_from_slice(&values.to_bytes()?);
                Ok(())
            })
        })
    }

    /// The packed bytes.
    ///
    /// # Errors
    /// The error of reading a meta tensor.
    pub fn bytes(&self) -> Result<Cow<'_, [u8]>> {
        self.data.to_bytes()
    }
}

/// Bytes of a tensor of `ty` and `shape`, rows along the last axis.
fn packed_len(ty: GgmlType, shape: &[usize]) -> Result<usize> {
    let cols = shape.last().copied().unwrap_or(1);
    let rows = shape[..shape.len().saturating_sub(1)]
        .iter()
        .try_fold(1usize, |count, &extent| count.checked_mul(extent))
        .ok_or(Error::TooLarge { dtype: DType::U8, shape: shape.to_vec() })?;
    let row_bytes = ty.row_bytes(cols).ok_or(Error::GgmlRow {
        op: "GgmlTensor::quantize",
        ty: ty.name(),
        block_size: ty.block_size(),
        values: cols,
        bytes: 0,
    })?;
    rows.checked_mul(row_bytes).ok_or(Error::TooLarge { dtype: DType::U8, shape: shape.to_vec() })
}

/// The f32 tensor of `shape` that `bytes` of `ty` hold.
fn decode(ty: GgmlType, shape: &[usize], bytes: &[u8]) -> Result<Tensor> {
    // A hostile shape may overflow before a zero extent makes it empty: counted checked.
    let values = shape
        .iter()
        .try_fold(1usize, |count, &extent| count.checked_mul(extent))
        .ok_or(Error::TooLarge { dtype: DType::F32, shape: shape.to_vec() })?;
    let mut out = Vec::new();
    out.try_reserve_exact(values)
        .map_err(|_| Error::Allocation { op: "decoding a GGUF tensor", bytes: values.saturating_mul(4) })?;
    out.resize(values, 0f32);
    dequantize_row(ty, bytes, &mut out)?;
    Tensor::from_vec(out, shape)
}

/// A GGUF file opened over its mapping.
pub(crate) struct GgufFile {
    pub(crate) path: PathBuf,
    mapping: Arc<Mapping>,
    pub(crate) header: header::Header,
}

impl GgufFile {
    /// Maps `path` and reads its header.
    ///
    /// # Errors
    /// [`Error::Io`], and [`Error::Gguf`] naming the first check of ggml's reader that fails.
    pub(crate) fn open(path: &Path) -> Result<Arc<GgufFile>> {
        let file = File::open(path).map_err(Error::io("open", path))?;
        let len = file.metadata().map_err(Error::io("open", path))?.len();
        if len == 0 {
            return Err(Error::Gguf { path: path.to_path_buf(), problem: GgufProblem::Magic { found: Vec::new() } });
        }
        let mapping = Arc::new(Mapping::new(&file, path)?);
        let header =
            header::parse(mapping.bytes(), len).map_err(|problem| Error::Gguf { path: path.to_path_buf(), problem })?;
        Ok(Arc::new(GgufFile { path: path.to_path_buf(), mapping, header }))
    }

    fn bytes_of(&self, at: usize) -> &[u8] {
        let range = self.header.file_range(at);
        &self.mapping.bytes()[range.start as usize..range.end as usize]
    }

    /// Tensor `at`'s bytes as a tensor of `dtype` and `shape` over the mapped pages.
    fn view(&self, at: usize, dtype: DType, shape: &[usize]) -> nnx_core::Result<Tensor> {
        let range = self.header.file_range(at);
        let source: Arc<dyn ByteSource> = self.mapping.clone();
        Tensor::from_shared(source, range.start as usize, (range.end - range.start) as usize, dtype, shape)
    }

    fn data_error(&self, at: usize, source: nnx_core::Error) -> Error {
        Error::Data { path: self.path.clone(), name: self.header.tensors[at].name.clone(), source: Box::new(source) }
    }

    fn undecodable(&self, at: usize) -> Error {
        let info = &self.header.tensors[at];
        Error::Gguf {
            path: self.path.clone(),
            problem: GgufProblem::Undecodable {
                name: info.name.clone(),
                ty: info.ty.name(),
                hint: "it is an activation type of ggml's products that files do not store; read its blocks with `Archive::ggml`",
            },
        }
    }
}

impl Source for GgufFile {
    fn spec(&self, at: usize) -> (DType, &[usize]) {
        let info = &self.header.tensors[at];
        (info.dtype(), &info.shape)
    }

    fn tensor(&self, at: usize) -> Result<Tensor> {
        let info = &self.header.tensors[at];
        if let Some(dtype) = plain_dtype(info.ty) {
            return match self.view(at, dtype, &info.shape) {
                Ok(tensor) => Ok(tensor),
                Err(nnx_core::Error::Misaligned { .. }) => Tensor::from_bytes(dtype, &info.shape, self.bytes_of(at))
                    .map_err(|error| self.data_error(at, error)),
                Err(error) => Err(self.data_error(at, error)),
            };
        }
        decode(info.ty, &info.shape, self.bytes_of(at)).map_err(|error| match error {
            nnx_core::Error::GgmlUnsupported { .. } => self.undecodable(at),
            error => self.data_error(at, error),
        })
    }

    fn path(&self) -> Option<&Path> {
        Some(&self.path)
    }

    fn location(&self, at: usize) -> Option<EntryLocation> {
        Some(self.header.location(&self.path, at))
    }

    fn release(&self, at: usize) {
        if let Some(location) = self.location(at) {
            self.mapping.release(location.file_offset, self.stored_bytes(at));
        }
    }

    fn stored_bytes(&self, at: usize) -> usize {
        self.header.tensors[at].bytes as usize
    }

    fn data(&self, at: usize) -> std::result::Result<Cow<'_, [u8]>, DataError> {
        if plain_dtype(self.header.tensors[at].ty).is_some() {
            return Ok(Cow::Borrowed(self.bytes_of(at)));
        }
        let tensor = self.tensor(at).map_err(DataError::Io)?;
        let bytes = tensor.to_bytes().map_err(DataError::Tensor)?.into_owned();
        Ok(Cow::Owned(bytes))
    }

    fn ggml_type(&self, at: usize) -> Option<GgmlType> {
        Some(self.header.tensors[at].ty)
    }

    /// The packed blocks, a view of the file.
    fn packed(&self, at: usize) -> Result<Tensor> {
        let info = &self.header.tensors[at];
        self.view(at, DType::U8, &[info.bytes as usize]).map_err(|error| self.data_error(at, error))
    }
}

/// The file names of every shard of a split GGUF file named like `NAME-00001-of-00003.gguf`,
/// in order, when `name` is one of them.
pub(crate) fn split_names(name: &str) -> Option<Vec<String>> {
    let stem = name.strip_suffix(".gguf")?;
    let (head, count) = stem.rsplit_once("-of-")?;
    let (base, number) = head.rsplit_once('-')?;
    let well_formed = |digits: &str| digits.len() == 5 && digits.bytes().all(|b| b.is_ascii_digit());
    if !well_formed(number) || !well_formed(count) {
        return None;
    }
    let total: usize = count.parse().ok()?;
    if total == 0 {
        return None;
    }
    Some((1..=total).map(|n| shard_file_name(base, n, total)).collect())
}

/// The shards of a split GGUF file named like `NAME-00001-of-00003.gguf`: every shard's
/// path, in order, when `path` is one of them.
pub(crate) fn split_siblings(path: &Path) -> Option<Vec<PathBuf>> {
    let names = split_names(path.file_name()?.to_str()?)?;
    let dir = path.parent().unwrap_or(Path::new(""));
    Some(names.iter().map(|name| dir.join(name)).collect())
}

/// Checks that the file at `path`, whose metadata is `metadata`, is shard `index` of `count`
/// of a split set (by its `split.*` keys); a file without them must be alone.
///
/// # Errors
/// [`Error::Gguf`] with [`GgufProblem::Split`] saying what does not fit.
pub(crate) fn check_split(path: &Path, metadata: &Metadata, index: usize, count: usize) -> Result<()> {
    let shard = || path.file_name().unwrap_or_default().to_string_lossy().into_owned();
    let fail = |message: String| {
        Err(Error::Gguf { path: path.to_path_buf(), problem: GgufProblem::Split { shard: shard(), message } })
    };
    match (metadata.u64("split.no"), metadata.u64("split.count")) {
        (None, None) if count == 1 => Ok(()),
        (None, None) => fail(format!(
            "its name makes it shard {} of {count}, but it has no `split.no` and `split.count` keys",
            index + 1
        )),
        (Some(no), Some(total)) if no == index as u64 && total == count as u64 => Ok(()),
        (no, total) => fail(format!(
            "its name makes it shard {} of {count}, but its keys say `split.no` {} of `split.count` {}: the set is mixed up; download it again",
            index + 1,
            no.map_or("missing".to_string(), |n| n.to_string()),
            total.map_or("missing".to_string(), |n| n.to_string()),
        )),
    }
}

/// The error of a shard of a split set that is not there.
pub(crate) fn missing_shard(path: &Path, count: usize) -> Error {
    let shard = path.file_name().unwrap_or_default().to_string_lossy().into_owned();
    Error::Gguf {
        path: path.to_path_buf(),
        problem: GgufProblem::Split {
            shard,
            message: format!("it is missing from the {count} shards of the set: download every shard"),
        },
    }
}

/// The archive of a GGUF file or of the shards of a split one: every tensor, and the metadata
/// of the first shard, typed and as text.
///
/// # Errors
/// [`Error::Gguf`] for a missing shard, a shard out of its set or a header that breaks ggml's
/// checks, and [`Error::Io`].
pub(crate) fn open(paths: &[PathBuf]) -> Result<Archive> {
    let mut parts = Vec::with_capacity(paths.len());
    let mut first_metadata = None;
    for (index, path) in paths.iter().enumerate() {
        if !path.is_file() {
            return Err(missing_shard(path, paths.len()));
        }
        let file = GgufFile::open(path)?;
        parts.push(shard_part(path, &file.header, file.clone(), index, paths.len())?);
        if index == 0 {
            first_metadata = Some(file.header.metadata.clone());
        }
    }
    join_split(parts, first_metadata.unwrap_or_default())
}

/// Shard `index` of a set of `count` (`path`, local or remote, with its `header`) as a part of
/// the set's archive, checked against its place in the set: every tensor of the header, read
/// from `store`.
pub(crate) fn shard_part(
    path: &Path,
    header: &header::Header,
    store: Arc<dyn Store>,
    index: usize,
    count: usize,
) -> Result<Archive> {
    check_split(path, &header.metadata, index, count)?;
    let mut part = Archive::named(path, BTreeMap::new());
    for (at, info) in header.tensors.iter().enumerate() {
        part.push(info.name.clone(), store.clone(), at);
    }
    Ok(part)
}

/// The archive of the parts of a GGUF set (one part for a single file) with `metadata`, the
/// first shard's.
fn join_split(mut parts: Vec<Archive>, metadata: Metadata) -> Result<Archive> {
    let mut archive = if parts.len() == 1 { parts.pop().expect("one part") } else { Archive::union(parts)? };
    archive.set_gguf_metadata(metadata);
    Ok(archive)
}

/// What archives know of GGUF files.
impl Archive {
    /// Sets the typed metadata of a GGUF file, and its text form as [`Archive::metadata`].
    pub(crate) fn set_gguf_metadata(&mut self, metadata: Metadata) {
        let text = metadata.iter().map(|(key, value)| (key.to_string(), value.to_string())).collect();
        self.set_typed_metadata(text, metadata);
    }

    /// The typed metadata of a GGUF file (every value type, nested arrays); `None` for other
    /// formats. [`Archive::metadata`] has the same keys as text, long arrays summarised.
    pub fn gguf_metadata(&self) -> Option<&Metadata> {
        self.typed_metadata()
    }

    /// The ggml type entry `name` is stored as in a GGUF file, from the header (no tensor byte
    /// is read, in a store neither); `None` for other entries.
    pub fn ggml_type(&self, name: &str) -> Option<GgmlType> {
        let (source, at) = self.require(name).ok()?;
        source.ggml_type(at)
    }

    /// Entry `name` as ggml stores it, its blocks a view of the file: what products that read
    /// packed blocks take. Entries of other formats in a dtype GGUF has a type for (f32, f16,
    /// bf16, f64, i8 to i64) are given as that type.
    ///
    /// # Errors
    /// [`Error::NoEntry`], [`Error::GgmlUnsupported`] for another dtype, and the error of
    /// reading the entry.
    pub fn ggml(&self, name: &str) -> Result<GgmlTensor> {
        let (source, at) = self.require(name)?;
        let (dtype, shape) = source.spec(at);
        let Some(ty) = source.ggml_type(at).or_else(|| ggml_type_of(dtype)) else {
            return Err(Error::GgmlUnsupported {
                op: "Archive::ggml",
                ty: dtype.as_str(),
                hint: "only GGUF entries and plain f32, f16, bf16, f64 and integer entries have a ggml type",
            });
        };
        Ok(GgmlTensor { ty, shape: shape.to_vec(), data: source.packed(at)? })
    }
}
