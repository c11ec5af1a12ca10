//! A GGUF file in an object store or on the Hub: the header read with range requests that grow
//! until it is whole, each tensor fetched with one range request when it is read.

use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use nnx_core::{DType, Tensor};
use object_store::path::Path as ObjectPath;

use super::header::{self, Header};
use super::{GgmlTensor, decode, plain_dtype};
use crate::archive::{Archive, EntryLocation};
use crate::error::{Error, GgufProblem, Result};
use crate::remote::Client;
use crate::source::{DataError, Source};

/// The first bytes asked for: the header of most files, tokenizer vocabularies included.
const FIRST_READ: u64 = 4 << 20;
/// The most header bytes fetched: far beyond any model's metadata and tensor infos.
const MAX_HEADER_READ: u64 = 512 << 20;

/// A GGUF file in a store.
pub(crate) struct RemoteGguf {
    client: Arc<Client>,
    path: ObjectPath,
    url: PathBuf,
    header: Header,
}

impl RemoteGguf {
    /// Reads the header: the first 4 MiB, then as much more as it turns out to need (each
    /// read at least four times the last), up to 512 MiB.
    ///
    /// # Errors
    /// [`Error::Remote`] for a failed transfer, [`Error::Gguf`] for a header that breaks
    /// ggml's checks or needs more than 512 MiB.
    pub(crate) fn open(client: Arc<Client>, path: ObjectPath) -> Result<Arc<RemoteGguf>> {
        let url = PathBuf::from(client.url(&path));
        let mut asked = FIRST_READ;
        let header = loop {
            let (bytes, meta) = client.range_blocking(&path, 0..asked, true)?;
            match header::parse(&bytes, meta.size) {
                Ok(header) => break header,
                Err(GgufProblem::Truncated { needed, .. })
                    if (bytes.len() as u64) < meta.size && needed <= meta.size && asked < MAX_HEADER_READ =>
                {
                    asked = needed.max(asked.saturating_mul(4)).min(MAX_HEADER_READ).min(meta.size);
                }
                Err(problem) => return Err(Error::Gguf { path: url, problem }),
            }
        };
        Ok(Arc::new(RemoteGguf { client, path, url, header }))
    }

    /// The archive of this file's tensors, with its metadata typed and as text.
    pub(crate) fn archive(self: &Arc<Self>) -> Archive {
        let mut archive = Archive::named(&self.url, Default::default());
        for (at, info) in self.header.tensors.iter().enumerate() {
            archive.push(info.name.clone(), self.clone(), at);
        }
        archive.set_gguf_metadata(self.header.metadata.clone());
        archive
    }

    fn fetch(&self, at: usize) -> Result<bytes::Bytes> {
        Ok(self.client.range_blocking(&self.path, self.header.file_range(at), false)?.0)
    }

    fn data_error(&self, at: usize, source: nnx_core::Error) -> Error {
        Error::Data { path: self.url.clone(), name: self.header.tensors[at].name.clone(), source: Box::new(source) }
    }
}

impl Source for RemoteGguf {
    fn spec(&self, at: usize) -> (DType, &[usize]) {
        let info = &self.header.tensors[at];
        (info.dtype(), &info.shape)
    }

    fn tensor(&self, at: usize) -> Result<Tensor> {
        let info = &self.header.tensors[at];
        let bytes = self.fetch(at)?;
        match plain_dtype(info.ty) {
            Some(dtype) => Tensor::from_bytes(dtype, &info.shape, &bytes),
            None => decode(info.ty, &info.shape, &bytes),
        }
        .map_err(|error| self.data_error(at, error))
    }

    fn path(&self) -> Option<&Path> {
        Some(&self.url)
    }

    fn location(&self, at: usize) -> Option<EntryLocation> {
        Some(self.header.location(&self.url, at))
    }

    fn stored_bytes(&self, at: usize) -> usize {
        self.header.tensors[at].bytes as usize
    }

    fn data(&self, at: usize) -> std::result::Result<Cow<'_, [u8]>, DataError> {
        let tensor = self.tensor(at).map_err(DataError::Io)?;
        let bytes = tensor.to_bytes().map_err(DataError::Tensor)?.into_owned();
        Ok(Cow::Owned(bytes))
    }

    fn ggml(&self, at: usize) -> Option<Result<GgmlTensor>> {
        let info = &self.header.tensors[at];
        Some(self.fetch(at).and_then(|bytes| {
            let data = Tensor::from_vec(bytes.to_vec(), &[bytes.len()]).map_err(|error| self.data_error(at, error))?;
            Ok(GgmlTensor { ty: info.ty, shape: info.shape.clone(), data })
        }))
    }
}
