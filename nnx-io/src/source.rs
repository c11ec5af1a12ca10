//! The contract every format's entries implement, so that an archive holds sources and never
//! asks which format an entry came from: a mapped file, a shard mapped on first use, a tensor
//! in memory, or a file whose bytes are fetched (one in a store), read through the [`Fetcher`]
//! of its store so that reads of many entries go out together.

use std::any::Any;
use std::borrow::Cow;
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

use nnx_core::quant::ggml::GgmlType;
use nnx_core::{DType, Tensor};

use crate::archive::{EntryLocation, Want};
use crate::error::Result;

/// What an archive holds for its entries: a [`Source`], or a source opened on first use (a
/// shard of an index).
pub(crate) trait Store: Send + Sync {
    /// The source that holds entry `at` (named `name`) and its number there.
    ///
    /// # Errors
    /// The error of opening the source.
    fn open(&self, name: &str, at: usize) -> Result<(&dyn Source, usize)>;

    /// The object this store's bytes are fetched from, without opening anything; `None` for
    /// files on disk and tensors in memory.
    #[cfg_attr(not(feature = "remote"), expect(dead_code, reason = "asked only for transfer counts"))]
    fn fetched(&self) -> Option<&FetchedObject> {
        None
    }
}

impl<S: Source> Store for S {
    fn open(&self, _: &str, at: usize) -> Result<(&dyn Source, usize)> {
        Ok((self, at))
    }

    fn fetched(&self) -> Option<&FetchedObject> {
        Source::fetched(self)
    }
}

/// Entries of one format, each known by its number in the source: what the archive asks of
/// every format.
pub(crate) trait Source: Send + Sync {
    /// Dtype and shape of entry `at`, from headers.
    fn spec(&self, at: usize) -> (DType, &[usize]);

    /// Entry `at` as a tensor: a view of the file where it can be one.
    fn tensor(&self, at: usize) -> Result<Tensor>;

    /// The file the entries lie in, named by errors about their data; `None` for tensors in
    /// memory, which the archive names instead.
    fn path(&self) -> Option<&Path>;

    /// Where entry `at`'s bytes lie; `None` for tensors in memory.
    fn location(&self, at: usize) -> Option<EntryLocation>;

    /// The bytes entry `at` stores.
    fn stored_bytes(&self, at: usize) -> usize;

    /// Entry `at` made when it is read (decoded, cast, derived), for writers, which write its
    /// bytes from the tensor itself rather than from a copy; `None` for entries whose
    /// [`Source::data`] borrows or packs what is stored.
    fn made(&self, at: usize) -> Option<Result<Tensor>> {
        self.made_when_read(at).then(|| self.tensor(at))
    }

    /// Whether entry `at` is made when read ([`Source::made`] gives it), told without making
    /// it: a reader that only looks at an entry (its layout, say) skips such entries rather than
    /// make them twice.
    fn made_when_read(&self, _at: usize) -> bool {
        false
    }

    /// The bytes [`Source::data`] gives for entry `at`: those it stores, except for entries
    /// decoded or made when read, whose data is their dtype and shape's.
    fn data_bytes(&self, at: usize) -> usize {
        self.stored_bytes(at)
    }

    /// Whether entry `at` has no data to write (a tensor of the meta device).
    fn is_meta(&self, _at: usize) -> bool {
        false
    }

    /// Entry `at`'s bytes in its dtype, for writers: borrowed from a mapping where they lie in
    /// one. Errors of tensors in memory are `nnx_core` errors that the writer names.
    fn data(&self, at: usize) -> std::result::Result<Cow<'_, [u8]>, DataError>;

    /// The ggml type entry `at` is stored as, from the header; `None` for formats without
    /// ggml types.
    fn ggml_type(&self, _at: usize) -> Option<GgmlType> {
        None
    }

    /// Entry `at`'s bytes as they are stored, as a U8 tensor of one axis: the packed blocks of
    /// an entry with a ggml type (a view of the file where the format gives one), else a copy
    /// of [`Source::data`].
    ///
    /// # Errors
    /// The error of reading the bytes.
    fn packed(&self, at: usize) -> Result<Tensor> {
        let bytes = self.data(at).map_err(DataError::into_error)?;
        Tensor::from_bytes(nnx_core::DType::U8, &[bytes.len()], &bytes)
    }

    /// The object the bytes are fetched from, for a source whose bytes are fetched rather than
    /// mapped (a file in a store); `None` for the others.
    fn fetched(&self) -> Option<&FetchedObject> {
        None
    }

    /// How entry `at` is encoded where it is decoded when read (a published checkpoint's FP8
    /// or GPTQ weight, say), for listings; `None` for entries stored as they read.
    fn encoding(&self, _at: usize) -> Option<String> {
        None
    }

    /// Box `boxed` of entry `at` (one `(start, len)` per axis; the whole entry for `None`):
    /// by default the entry narrowed, which reads it whole for sources that make their entries;
    /// a source assembled from pieces reads only the pieces the box meets.
    ///
    /// # Errors
    /// The errors of [`Source::tensor`].
    fn tensor_box(&self, at: usize, boxed: Option<&[(usize, usize)]>) -> Result<Tensor> {
        narrow_to(self.tensor(at)?, boxed)
    }

    /// Where entry `at`'s values lie, piece by piece, for read plans: by default one piece, the
    /// whole entry at its [`Source::location`], row-major where its dtype is whole bytes (read
    /// whole otherwise); none for entries in memory.
    ///
    /// # Errors
    /// The errors of reading the headers that place the pieces.
    fn stored_pieces(&self, at: usize) -> Result<Vec<crate::plan::StoredPiece>> {
        let Some(location) = self.location(at) else { return Ok(Vec::new()) };
        let (dtype, shape) = self.spec(at);
        let start = location.file_offset as u64;
        let layout = match (dtype.size_in_bytes(), self.ggml_type(at)) {
            (Some(element), None) => crate::plan::PieceLayout::RowMajor { start, element },
            _ => crate::plan::PieceLayout::Whole { start, len: self.stored_bytes(at) as u64 },
        };
        Ok(vec![crate::plan::StoredPiece {
            file: location.path,
            offsets: vec![0; shape.len()],
            sizes: shape.to_vec(),
            layout,
        }])
    }

    /// Drops entry `at`'s mapped pages from resident memory, where the source maps a file;
    /// nothing otherwise.
    fn release(&self, _at: usize) {}

    /// The byte ranges of the file that hold box `boxed` of entry `at` (one `(start, len)` per
    /// axis; the whole entry for `None`), in the order of its values, and the shape of what
    /// they hold: the box, or the whole entry when its values cannot be cut at a byte
    /// (sub-byte dtypes). What a fetched source asks its fetcher for.
    fn byte_ranges(&self, at: usize, boxed: Option<&[(usize, usize)]>) -> (Vec<Range<u64>>, Vec<usize>) {
        let (dtype, shape) = self.spec(at);
        let start = self.location(at).map_or(0, |location| location.file_offset as u64);
        match (dtype.size_in_bytes(), boxed) {
            (Some(element), Some(boxed)) => {
                (box_ranges(shape, boxed, element, start), boxed.iter().map(|&(_, len)| len).collect())
            }
            _ => (std::iter::once(start..start + self.stored_bytes(at) as u64).collect(), shape.to_vec()),
        }
    }

    /// The tensor of `shape` that `bytes` hold: the bytes of [`Source::byte_ranges`], joined.
    ///
    /// # Errors
    /// Bytes that do not make a tensor of entry `at`'s dtype.
    fn assemble(&self, at: usize, shape: &[usize], bytes: &[u8]) -> Result<Tensor> {
        Tensor::from_bytes(self.spec(at).0, shape, bytes)
    }
}

/// The bytes of an entry made when read (`made`, the source's [`Source::tensor`]): what
/// [`Source::data`] gives for sources whose entries are made rather than stored.
pub(crate) fn made_data(made: Result<Tensor>) -> std::result::Result<Cow<'static, [u8]>, DataError> {
    let tensor = made.map_err(DataError::Io)?;
    tensor.to_bytes().map(|bytes| Cow::Owned(bytes.into_owned())).map_err(DataError::Tensor)
}

/// Why an entry's bytes could not be had.
pub(crate) enum DataError {
    /// The tensor could not be packed; the caller says which entry of which file.
    Tensor(nnx_core::Error),
    /// An error that already says all.
    Io(crate::Error),
}

impl DataError {
    /// The error as it is, for callers that have no entry to name.
    fn into_error(self) -> crate::Error {
        match self {
            DataError::Tensor(error) | DataError::Io(error) => error,
        }
    }
}

/// A tensor in memory is a source of one entry.
impl Source for Tensor {
    fn spec(&self, _: usize) -> (DType, &[usize]) {
        (self.dtype(), self.shape())
    }

    fn tensor(&self, _: usize) -> Result<Tensor> {
        Ok(self.clone())
    }

    fn path(&self) -> Option<&Path> {
        None
    }

    fn location(&self, _: usize) -> Option<EntryLocation> {
        None
    }

    fn stored_bytes(&self, _: usize) -> usize {
        self.byte_len()
    }

    fn is_meta(&self, _: usize) -> bool {
        Tensor::is_meta(self)
    }

    fn data(&self, _: usize) -> std::result::Result<Cow<'_, [u8]>, DataError> {
        self.to_bytes().map_err(DataError::Tensor)
    }
}

/// An object whose bytes are fetched (a file in a store): the fetcher of its store, its name
/// there, and its version (an ETag, else its size and date), so that bytes kept from another
/// version are never used.
#[derive(Clone)]
#[cfg_attr(not(feature = "remote"), expect(dead_code, reason = "only fetchers read the name and version"))]
pub(crate) struct FetchedObject {
    /// The fetcher of the object's store, shared by every object of it.
    pub(crate) fetcher: Arc<dyn Fetcher>,
    /// The object's name in its store.
    pub(crate) name: String,
    /// The object's version.
    pub(crate) version: String,
}

/// Fetches byte ranges of the objects of one store: what the sources of files in a store read
/// through, so that the reads of many entries go out as one batch (neighbours coalesced,
/// several requests in flight). It is `Any` so that the transport that implements it can find
/// its own fetchers behind an archive's sources again (for their transfer counts).
pub(crate) trait Fetcher: Any + Send + Sync {
    /// Fetches the ranges of every request (objects of this fetcher's store) together, and
    /// hands `take` each request's number and its bytes: those of its ranges, in order, joined.
    ///
    /// # Errors
    /// The errors of a transfer, and those of `take`.
    fn fetch(
        &self,
        requests: &[(&FetchedObject, Vec<Range<u64>>)],
        take: &mut dyn FnMut(usize, &[u8]) -> Result<()>,
    ) -> Result<()>;
}

/// The box `boxed` of `tensor` (a view), or the tensor when it already has that shape.
pub(crate) fn narrow_to(mut tensor: Tensor, boxed: Option<&[(usize, usize)]>) -> Result<Tensor> {
    for (axis, &(start, len)) in boxed.unwrap_or_default().iter().enumerate() {
        if tensor.shape()[axis] != len {
            tensor = tensor.narrow(axis, start, len)?;
        }
    }
    Ok(tensor)
}

/// The reads of a batch that go through one fetcher.
struct Batch<'a> {
    fetcher: &'a Arc<dyn Fetcher>,
    requests: Vec<(&'a FetchedObject, Vec<Range<u64>>)>,
    /// Per request: its place in the batch, its source and entry, and the shape its bytes hold.
    reads: Vec<(usize, &'a dyn Source, usize, Vec<usize>)>,
}

/// Reads entries at once, each whole or a box of it (one `(start, len)` per stored axis):
/// views for files and memory, and for files in stores one batch per store, fetching only
/// the bytes of the boxes.
///
/// # Errors
/// The errors of `locate`, of reading an entry or of a transfer.
pub(crate) fn read_batch<'a>(
    wants: &[Want<'_>],
    locate: impl Fn(&str) -> Result<(&'a dyn Source, usize)>,
) -> Result<Vec<Tensor>> {
    let mut out: Vec<Option<Tensor>> = vec![None; wants.len()];
    let mut batches: Vec<Batch<'a>> = Vec::new();
    for (index, (name, boxed)) in wants.iter().enumerate() {
        let (source, at) = locate(name)?;
        let Some(object) = source.fetched() else {
            out[index] = Some(source.tensor_box(at, boxed.as_deref())?);
            continue;
        };
        let (ranges, shape) = source.byte_ranges(at, boxed.as_deref());
        let batch = match batches.iter().position(|batch| Arc::ptr_eq(batch.fetcher, &object.fetcher)) {
            Some(found) => &mut batches[found],
            None => {
                batches.push(Batch { fetcher: &object.fetcher, requests: Vec::new(), reads: Vec::new() });
                batches.last_mut().expect("a batch was pushed")
            }
        };
        batch.requests.push((object, ranges));
        batch.reads.push((index, source, at, shape));
    }
    for batch in &batches {
        batch.fetcher.fetch(&batch.requests, &mut |request, bytes| {
            let (index, source, at, shape) = &batch.reads[request];
            let tensor = source.assemble(*at, shape, bytes)?;
            out[*index] = Some(narrow_to(tensor, wants[*index].1.as_deref())?);
            Ok(())
        })?;
    }
    Ok(out.into_iter().map(|tensor| tensor.expect("every entry was read")).collect())
}

/// The byte ranges of a file holding the box `boxed` (one `(start, len)` per axis) of an
/// entry of `shape` and `element` bytes per value starting at file offset `base`, in
/// row-major order of the box: one range per row of the outer axes down to the innermost cut
/// axis.
pub(crate) fn box_ranges(shape: &[usize], boxed: &[(usize, usize)], element: usize, base: u64) -> Vec<Range<u64>> {
    let count: usize = boxed.iter().map(|(_, len)| len).product();
    if count == 0 {
        return Vec::new();
    }
    let mut strides = vec![element as u64; shape.len()];
    for axis in (0..shape.len().saturating_sub(1)).rev() {
        strides[axis] = strides[axis + 1] * shape[axis + 1] as u64;
    }
    // The innermost axis that is cut: the axes inside it are whole, so each of its runs is
    // contiguous.
    let Some(cut) = (0..shape.len()).rev().find(|&axis| boxed[axis] != (0, shape[axis])) else {
        let total: u64 = shape.iter().map(|&size| size as u64).product::<u64>() * element as u64;
        return std::iter::once(base..base + total).collect();
    };
    let run = boxed[cut].1 as u64 * strides[cut];
    let inner = base + boxed[cut].0 as u64 * strides[cut];
    let mut ranges = Vec::with_capacity(boxed[..cut].iter().map(|(_, len)| len).product());
    let mut index = vec![0usize; cut];
    loop {
        let offset: u64 = (0..cut).map(|axis| (boxed[axis].0 + index[axis]) as u64 * strides[axis]).sum();
        ranges.push(inner + offset..inner + offset + run);
        // The next index of the outer axes, last axis fastest.
        let mut axis = cut;
        loop {
            if axis == 0 {
                return ranges;
            }
            axis -= 1;
            index[axis] += 1;
            if index[axis] < boxed[axis].1 {
                break;
            }
            index[axis] = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[allow(clippy::single_range_in_vec_init)]
    fn boxes_become_one_range_per_row_of_the_outer_axes() {
        // A whole entry is one range.
        assert_eq!(box_ranges(&[4, 6], &[(0, 4), (0, 6)], 2, 100), [100..148]);
        // Rows 1..3: one range.
        assert_eq!(box_ranges(&[4, 6], &[(1, 2), (0, 6)], 2, 0), [12..36]);
        // Columns 3..6 of every row: one range per row.
        assert_eq!(box_ranges(&[2, 6], &[(0, 2), (3, 3)], 4, 0), [12..24, 36..48]);
        // A cut middle axis of a rank-3 entry.
        assert_eq!(box_ranges(&[2, 4, 3], &[(1, 1), (2, 2), (0, 3)], 1, 8), [8 + 18..8 + 24]);
        assert_eq!(box_ranges(&[2, 0], &[(0, 2), (0, 0)], 4, 0), Vec::<Range<u64>>::new());
        assert_eq!(box_ranges(&[], &[], 4, 8), [8..12]);
    }
}
