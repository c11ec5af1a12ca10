//! SafeTensors files and shard indexes in an object store or on the Hub: a file's header read
//! with two range requests (its 8-byte length, then the header), its entries fetched through
//! the store's client when they are read, only the bytes of the boxes asked for.

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use nnx_core::{DType, Tensor};
use object_store::path::Path as ObjectPath;

use super::header::{self, Header};
use super::index::ShardIndex;
use crate::archive::{Archive, EntryLocation};
use crate::error::{Error, RemoteProblem, Result, ShardProblem};
use crate::remote::{Client, MAX_INDEX_BYTES, fetch_bytes, fetch_entry};
use crate::source::{DataError, FetchedObject, Source, Store};

/// A SafeTensors file in a store: its header, and the object its entries are fetched from.
pub(crate) struct RemoteFile {
    /// The object, fetched through its store's client.
    object: FetchedObject,
    /// The file's URL, as a path for the errors and listings that name files.
    url: PathBuf,
    header: Header,
}

impl RemoteFile {
    /// Fetches the header length, then the header, and validates it against the object's
    /// size. The header's length is checked against [`header::MAX_HEADER_BYTES`] before it is
    /// asked for, as for local files.
    ///
    /// # Errors
    /// [`Error::Remote`] for a failed transfer, [`Error::Header`] for a header that breaks the
    /// specification, [`Error::NotSafeTensors`] for a file of another format.
    pub(crate) fn open(client: &Arc<Client>, path: ObjectPath) -> Result<Arc<RemoteFile>> {
        let url_text = client.url(&path);
        let url = PathBuf::from(&url_text);
        let (first, meta) = match client.range_blocking(&path, 0..8, true) {
            Ok(found) => found,
            // An empty object has no byte 0 to ask for: the store refuses the range.
            Err(error @ Error::Remote { problem: RemoteProblem::Transfer { .. }, .. }) => {
                if client.head_size(&path) == Some(0) {
                    return Err(Error::Header { path: url, problem: crate::HeaderProblem::Empty });
                }
                return Err(error);
            }
            Err(error) => return Err(error),
        };
        let file_len = usize::try_from(meta.size).unwrap_or(usize::MAX);
        let Some(prefix) = first.first_chunk::<8>() else {
            return Err(Error::Header { path: url, problem: crate::HeaderProblem::TooShort { len: first.len() } });
        };
        let declared =
            header::declared_len(*prefix, file_len).map_err(|problem| Error::Header { path: url.clone(), problem })?;
        let text =
            if declared == 0 { Bytes::new() } else { client.range_blocking(&path, 8..8 + declared as u64, false)?.0 };
        let mut bytes = Vec::new();
        bytes.try_reserve_exact(8 + text.len()).map_err(|_| Error::Remote {
            url: url_text.clone(),
            problem: RemoteProblem::NoMemory { bytes: 8 + text.len() as u64 },
        })?;
        bytes.extend_from_slice(prefix);
        bytes.extend_from_slice(&text);
        drop(text);
        let header = header::parse_prefix(&bytes, file_len).map_err(|problem| match crate::format::sniff(&bytes) {
            Some(kind) => Error::NotSafeTensors { path: url.clone(), kind },
            None => Error::Header { path: url.clone(), problem },
        })?;
        Ok(Arc::new(RemoteFile { object: client.object(&path, &meta), url, header }))
    }

    /// The file offsets of entry `at`.
    fn entry_range(&self, at: usize) -> std::ops::Range<u64> {
        let entry = &self.header.entries[at];
        let start = (self.header.data_start + entry.begin) as u64;
        start..start + (entry.end - entry.begin) as u64
    }

    /// The entries of this file, in its order.
    fn archive(self: &Arc<Self>) -> Archive {
        let mut archive = Archive::named(&self.url, self.header.metadata.clone());
        let store: Arc<dyn Store> = self.clone();
        for (at, entry) in self.header.entries.iter().enumerate() {
            archive.push(entry.name.clone(), store.clone(), at);
        }
        archive
    }
}

/// A file in a store is a source whose entries are fetched when read.
impl Source for RemoteFile {
    fn spec(&self, at: usize) -> (DType, &[usize]) {
        let entry = &self.header.entries[at];
        (entry.dtype, &entry.shape)
    }

    fn tensor(&self, at: usize) -> Result<Tensor> {
        fetch_entry(self, &self.object, at)
    }

    fn path(&self) -> Option<&Path> {
        Some(&self.url)
    }

    fn location(&self, at: usize) -> Option<EntryLocation> {
        let entry = &self.header.entries[at];
        let file_offset = self.header.data_start + entry.begin;
        Some(EntryLocation { path: self.url.clone(), data_offsets: (entry.begin, entry.end), file_offset })
    }

    fn stored_bytes(&self, at: usize) -> usize {
        let entry = &self.header.entries[at];
        entry.end - entry.begin
    }

    fn data(&self, at: usize) -> std::result::Result<Cow<'_, [u8]>, DataError> {
        Ok(Cow::Owned(fetch_bytes(&self.object, self.entry_range(at)).map_err(DataError::Io)?))
    }

    fn fetched(&self) -> Option<&FetchedObject> {
        Some(&self.object)
    }

    /// Fetched bytes of entry `at` (all of it, or a box of `shape`) as an owned tensor of its
    /// dtype, errors naming the entry.
    fn assemble(&self, at: usize, shape: &[usize], bytes: &[u8]) -> Result<Tensor> {
        let entry = &self.header.entries[at];
        Tensor::from_bytes(entry.dtype, shape, bytes).map_err(|source| Error::Data {
            path: self.url.clone(),
            name: entry.name.clone(),
            source: Box::new(source),
        })
    }
}

/// The archive of the SafeTensors file at `path` in `client`'s store.
///
/// # Errors
/// As [`RemoteFile::open`].
pub(crate) fn open(client: Arc<Client>, path: ObjectPath) -> Result<Archive> {
    Ok(RemoteFile::open(&client, path)?.archive())
}

/// The archive of the shard index at `path` in `client`'s store: the index read whole (at most
/// [`MAX_INDEX_BYTES`]), then each shard's header; every entry from the shard the index names,
/// which must hold it.
///
/// # Errors
/// [`Error::Index`] for an unusable index, [`Error::MissingShard`] for a shard the store does
/// not have, [`Error::ShardMismatch`] for an entry missing from its shard, and the errors of
/// [`RemoteFile::open`].
pub(crate) fn open_index(client: Arc<Client>, path: ObjectPath) -> Result<Archive> {
    let url = client.url(&path);
    let text = client.get_whole(&path, MAX_INDEX_BYTES, "shard index")?;
    let text = std::str::from_utf8(&text).map_err(|_| Error::Index {
        path: url.clone().into(),
        problem: crate::IndexProblem::NotJson { message: "not UTF-8".into() },
    })?;
    let index = ShardIndex::parse(Path::new(&url), text)?;
    let parent: ObjectPath = path.parts().take(path.parts().count().saturating_sub(1)).collect();
    let mut files = Vec::with_capacity(index.shards.len());
    for shard in &index.shards {
        let file_name = shard.file_name().and_then(|name| name.to_str()).unwrap_or_default();
        let file = RemoteFile::open(&client, parent.child(file_name)).map_err(|error| match error {
            Error::Remote { problem: RemoteProblem::NotFound, .. } => {
                Error::MissingShard { index: url.clone().into(), shard: shard.clone() }
            }
            other => other,
        })?;
        files.push(file);
    }
    let mut archive = Archive::named(&index.path, index.metadata.clone());
    let positions: Vec<HashMap<&str, usize>> = files
        .iter()
        .map(|file| file.header.entries.iter().enumerate().map(|(at, entry)| (entry.name.as_str(), at)).collect())
        .collect();
    let stores: Vec<Arc<dyn Store>> = files.iter().map(|file| file.clone() as Arc<dyn Store>).collect();
    for (name, shard) in &index.weight_map {
        let Some(&at) = positions[*shard].get(name.as_str()) else {
            return Err(Error::ShardMismatch {
                index: index.path.clone(),
                shard: index.shards[*shard].clone(),
                problem: ShardProblem::MissingEntry { name: name.clone() },
            });
        };
        archive.push(name.clone(), stores[*shard].clone(), at);
    }
    Ok(archive)
}
