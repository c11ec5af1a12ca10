//! SafeTensors, the format nnx writes: the header (`header`), a file mapped with it
//! (`mapped`), shard indexes (`index`), files and indexes in stores (`remote`, with the
//! `remote` feature) and atomic, optionally page-aligned or sharded saves (`write`). The
//! archives of a file, an index and a folder's files are opened here.

pub(crate) mod header;
pub(crate) mod index;
pub(crate) mod mapped;
#[cfg(feature = "remote")]
pub(crate) mod remote;
pub(crate) mod write;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use self::index::{Shard, ShardIndex};
use self::mapped::MappedFile;
use crate::archive::Archive;
use crate::error::Result;
use crate::source::Store;

/// The archive of the SafeTensors file at `path`: its entries over the mapped file, in the
/// header's order, and its `__metadata__`.
///
/// # Errors
/// As [`MappedFile::open`].
pub(crate) fn open(path: &Path) -> Result<Archive> {
    let file = MappedFile::open(path)?;
    let mut archive = Archive::named(&file.path, file.header.metadata.clone());
    let store: Arc<dyn Store> = file.clone();
    for (at, entry) in file.header.entries.iter().enumerate() {
        archive.push(entry.name.clone(), store.clone(), at);
    }
    Ok(archive)
}

/// The archive of the shard index at `path`: every entry of its weight map, each shard mapped
/// when one of its entries is first needed.
///
/// # Errors
/// As [`ShardIndex::read`].
pub(crate) fn open_index(path: &Path) -> Result<Archive> {
    let index = Arc::new(ShardIndex::read(path)?);
    let mut archive = Archive::named(path, index.metadata.clone());
    let shards: Vec<Arc<dyn Store>> =
        (0..index.shards.len()).map(|at| Arc::new(Shard::new(index.clone(), at)) as Arc<dyn Store>).collect();
    for (name, shard) in &index.weight_map {
        // A shard finds its entries by name when it is mapped.
        archive.push(name.clone(), shards[*shard].clone(), 0);
    }
    Ok(archive)
}

/// The union of the SafeTensors `files` of the folder `dir`, named after the folder.
///
/// # Errors
/// The errors of opening a file, and [`crate::Error::Duplicate`] for a name in two files.
pub(crate) fn open_files(dir: &Path, files: &[PathBuf]) -> Result<Archive> {
    let archives = files.iter().map(|path| open(path)).collect::<Result<Vec<_>>>()?;
    let mut archive = Archive::union(archives)?;
    archive.set_origin(dir);
    Ok(archive)
}
