//! The contract every format's entries implement, so that an archive holds sources and never
//! asks which format an entry came from: a mapped SafeTensors file, a shard mapped on first use,
//! a tensor in memory (those of a PyTorch checkpoint among them) and, with the `remote` feature,
//! a file in a store.

use std::borrow::Cow;
use std::path::Path;

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

    /// The file in a store this store reads from, without opening anything.
    #[cfg(feature = "remote")]
    fn remote(&self) -> Option<&std::sync::Arc<crate::remote::RemoteFile>> {
        None
    }
}

impl<S: Source> Store for S {
    fn open(&self, _: &str, at: usize) -> Result<(&dyn Source, usize)> {
        Ok((self, at))
    }

    #[cfg(feature = "remote")]
    fn remote(&self) -> Option<&std::sync::Arc<crate::remote::RemoteFile>> {
        Source::remote(self)
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

    /// Whether entry `at` has no data to write (a tensor of the meta device).
    fn is_meta(&self, _at: usize) -> bool {
        false
    }

    /// Entry `at`'s packed bytes, for writers: borrowed from a mapping where they lie in one.
    /// Errors of tensors in memory are `nnx_core` errors that the writer names.
    fn data(&self, at: usize) -> std::result::Result<Cow<'_, [u8]>, DataError>;

    /// Entry `at` kept as ggml stores it; `None` for formats without ggml types.
    fn ggml(&self, _at: usize) -> Option<Result<crate::gguf::GgmlTensor>> {
        None
    }

    /// The file in a store this source reads from, so that reads of many entries go out as one
    /// batch of range requests.
    #[cfg(feature = "remote")]
    fn remote(&self) -> Option<&std::sync::Arc<crate::remote::RemoteFile>> {
        None
    }
}

/// Why an entry's bytes could not be had.
pub(crate) enum DataError {
    /// The tensor could not be packed; the caller says which entry of which file.
    Tensor(nnx_core::Error),
    /// An error that already says all.
    Io(crate::Error),
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

/// The box `boxed` of `tensor` (a view), or the tensor when it already has that shape.
pub(crate) fn narrow_to(mut tensor: Tensor, boxed: Option<&[(usize, usize)]>) -> Result<Tensor> {
    for (axis, &(start, len)) in boxed.unwrap_or_default().iter().enumerate() {
        if tensor.shape()[axis] != len {
            tensor = tensor.narrow(axis, start, len)?;
        }
    }
    Ok(tensor)
}

/// Reads entries at once, each whole or a box of it (one `(start, len)` per stored axis):
/// views for files and memory, and one batch of range requests for every entry in a store
/// (only the bytes of the boxes, neighbours coalesced, several requests in flight).
///
/// # Errors
/// The errors of `locate`, of reading an entry or of a transfer.
pub(crate) fn read_batch<'a>(
    wants: &[Want<'_>],
    locate: impl Fn(&str) -> Result<(&'a dyn Source, usize)>,
) -> Result<Vec<Tensor>> {
    let mut out: Vec<Option<Tensor>> = vec![None; wants.len()];
    #[cfg(feature = "remote")]
    let mut remote = Vec::new();
    for (index, (name, boxed)) in wants.iter().enumerate() {
        let (source, at) = locate(name)?;
        #[cfg(feature = "remote")]
        if let Some(file) = source.remote() {
            remote.push((index, file.clone(), at, boxed.as_deref()));
            continue;
        }
        out[index] = Some(narrow_to(source.tensor(at)?, boxed.as_deref())?);
    }
    #[cfg(feature = "remote")]
    for (index, tensor) in crate::remote::read_batch(&remote)? {
        out[index] = Some(tensor);
    }
    Ok(out.into_iter().map(|tensor| tensor.expect("every entry was read")).collect())
}
