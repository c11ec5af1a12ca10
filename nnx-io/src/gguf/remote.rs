//! GGUF files in an object store or on the Hub: the header read with range requests that grow
//! until it is whole, tensors fetched through the store's client (its batches, its cache and
//! its counts) only when they are read, and the shards of a split set
//! (`NAME-00001-of-00003.gguf`) found beside the one named.

use std::borrow::Cow;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use nnx_core::quant::ggml::GgmlType;
use nnx_core::{DType, Tensor};
use object_store::path::Path as ObjectPath;

use super::header::{self, Header};
use super::{decode, join_split, missing_shard, plain_dtype, shard_part, split_names};
use crate::archive::{Archive, EntryLocation};
use crate::error::{Error, GgufProblem, RemoteProblem, Result};
use crate::remote::{Client, fetch_bytes, fetch_entry};
use crate::source::{DataError, FetchedObject, Source};

/// The first bytes asked for: the header of most files, tokenizer vocabularies included.
const FIRST_READ: u64 = 4 << 20;
/// The most header bytes fetched: far beyond any model's metadata and tensor infos.
const MAX_HEADER_READ: u64 = 512 << 20;

/// A GGUF file in a store: its header, and the object its tensors are fetched from.
pub(crate) struct RemoteGguf {
    object: FetchedObject,
    /// The file's URL, as a path for the errors and listings that name files.
    url: PathBuf,
    header: Header,
}

impl RemoteGguf {
    /// Reads the header: the first 4 MiB, then the bytes after them that it turns out to need
    /// (each read at least doubling what was read, and reaching the end of the value being
    /// read), up to 512 MiB in all. No byte is fetched twice.
    ///
    /// # Errors
    /// [`Error::Remote`] for a failed transfer or an object that changes between two reads,
    /// [`Error::Gguf`] for a header that breaks ggml's checks or needs more than 512 MiB.
    pub(crate) fn open(client: &Arc<Client>, path: &ObjectPath) -> Result<Arc<RemoteGguf>> {
        let url = PathBuf::from(client.url(path));
        let (first, meta) = client.range_blocking(path, 0..FIRST_READ, true)?;
        let mut bytes = first.to_vec();
        drop(first);
        let header = loop {
            match header::parse(&bytes, meta.size) {
                Ok(header) => break header,
                Err(GgufProblem::Truncated { needed, .. })
                    if (bytes.len() as u64) < meta.size
                        && needed <= meta.size
                        && (bytes.len() as u64) < MAX_HEADER_READ =>
                {
                    let have = bytes.len() as u64;
                    let asked = needed.max(have.saturating_mul(2)).min(MAX_HEADER_READ).min(meta.size);
                    let (more, again) = client.range_blocking(path, have..asked, false)?;
                    if again.size != meta.size || again.e_tag != meta.e_tag {
                        let message = "the object changed while its header was read: open it again".to_string();
                        let url = client.url(path);
                        return Err(Error::Remote { url, problem: RemoteProblem::Transfer { message } });
                    }
                    bytes.try_reserve_exact(more.len()).map_err(|_| Error::Remote {
                        url: client.url(path),
                        problem: RemoteProblem::NoMemory { bytes: asked },
                    })?;
                    bytes.extend_from_slice(&more);
                }
                Err(problem) => return Err(Error::Gguf { path: url, problem }),
            }
        };
        drop(bytes);
        Ok(Arc::new(RemoteGguf { object: client.object(path, &meta), url, header }))
    }

    /// The file offsets of tensor `at`.
    fn range(&self, at: usize) -> Range<u64> {
        self.header.file_range(at)
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
        fetch_entry(self, &self.object, at)
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
        if plain_dtype(self.header.tensors[at].ty).is_some() {
            return Ok(Cow::Owned(fetch_bytes(&self.object, self.range(at)).map_err(DataError::Io)?));
        }
        let tensor = self.tensor(at).map_err(DataError::Io)?;
        let bytes = tensor.to_bytes().map_err(DataError::Tensor)?.into_owned();
        Ok(Cow::Owned(bytes))
    }

    fn ggml_type(&self, at: usize) -> Option<GgmlType> {
        Some(self.header.tensors[at].ty)
    }

    /// The packed blocks, fetched now.
    fn packed(&self, at: usize) -> Result<Tensor> {
        let bytes = fetch_bytes(&self.object, self.range(at))?;
        let len = bytes.len();
        Tensor::from_vec(bytes, &[len]).map_err(|error| self.data_error(at, error))
    }

    fn fetched(&self) -> Option<&FetchedObject> {
        Some(&self.object)
    }

    /// Plain tensors are cut at bytes as SafeTensors entries are; block tensors are fetched
    /// whole (their values cannot be cut at a byte) and narrowed once decoded.
    fn byte_ranges(&self, at: usize, boxed: Option<&[(usize, usize)]>) -> (Vec<Range<u64>>, Vec<usize>) {
        let info = &self.header.tensors[at];
        match (plain_dtype(info.ty).and_then(|dtype| dtype.size_in_bytes()), boxed) {
            (Some(element), Some(boxed)) => (
                crate::source::box_ranges(&info.shape, boxed, element, self.range(at).start),
                boxed.iter().map(|&(_, len)| len).collect(),
            ),
            _ => (std::iter::once(self.range(at)).collect(), info.shape.clone()),
        }
    }

    /// Plain bytes as a tensor of their dtype; blocks decoded to f32, bit-exact with ggml.
    fn assemble(&self, at: usize, shape: &[usize], bytes: &[u8]) -> Result<Tensor> {
        let info = &self.header.tensors[at];
        match plain_dtype(info.ty) {
            Some(dtype) => Tensor::from_bytes(dtype, shape, bytes),
            None => decode(info.ty, shape, bytes),
        }
        .map_err(|error| self.data_error(at, error))
    }
}

/// The archive of the GGUF file at `path` in `client`'s store, with every shard of its set
/// when its name makes it a shard of a split one (`NAME-00001-of-00003.gguf`): every tensor,
/// and the metadata of the first shard, typed and as text. Only the headers are fetched.
///
/// # Errors
/// [`Error::Gguf`] for a missing shard, a shard out of its set or a header that breaks
/// ggml's checks, and [`Error::Remote`] for a failed transfer.
pub(crate) fn open(client: Arc<Client>, path: ObjectPath) -> Result<Archive> {
    let name = path.filename().unwrap_or_default().to_string();
    let paths: Vec<ObjectPath> = match split_names(&name) {
        Some(names) => {
            let parent: ObjectPath = path.parts().take(path.parts().count().saturating_sub(1)).collect();
            names.iter().map(|name| parent.child(name.as_str())).collect()
        }
        None => vec![path],
    };
    let mut parts = Vec::with_capacity(paths.len());
    let mut first_metadata = None;
    for (index, path) in paths.iter().enumerate() {
        let file = RemoteGguf::open(&client, path).map_err(|error| match error {
            Error::Remote { problem: RemoteProblem::NotFound, .. } if paths.len() > 1 => {
                missing_shard(Path::new(&client.url(path)), paths.len())
            }
            other => other,
        })?;
        parts.push(shard_part(&file.url, &file.header, file.clone(), index, paths.len())?);
        if index == 0 {
            first_metadata = Some(file.header.metadata.clone());
        }
    }
    join_split(parts, first_metadata.unwrap_or_default())
}
