//! Orbax checkpoints (what `orbax-checkpoint` writes for a JAX pytree), read without JAX: each
//! array becomes one entry of its global shape and dtype, named by its pytree path joined by `.`
//! (`params.dense.kernel`), Python scalars included as the 0-d arrays orbax stores them as.
//!
//! The names come from `_METADATA`'s tree; each array's zarr metadata (`NAME/zarr.json` or
//! `NAME/.zarray`) is read at open, from the OCDBT database (`manifest.ocdbt`, the default) or
//! from one folder per array. An entry's chunks are read and assembled when the entry is read,
//! so that an archive holds one array at a time. A step folder of a `CheckpointManager` (items
//! in subfolders) opens as its items: one item's names as they are, several prefixed by the
//! item's folder name.

mod ocdbt;
mod zarr;

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use nnx_core::{DType, Tensor};
use serde_json::Value as Json;

use crate::archive::{Archive, EntryLocation};
use crate::error::{Error, OrbaxProblem, Result};
use crate::source::{DataError, Source, Store};

/// The pytree metadata: one entry per leaf, keyed by its path.
const METADATA: &str = "_METADATA";
/// The checkpoint's own metadata (times, handler), also in a manager's step folder.
const CHECKPOINT_METADATA: &str = "_CHECKPOINT_METADATA";
/// The most bytes of `_METADATA` read.
const MAX_METADATA_BYTES: u64 = 64 << 20;
/// The value types of `_METADATA` whose leaves orbax stores as zarr arrays.
const ARRAY_TYPES: [&str; 3] = ["jax.Array", "np.ndarray", "scalar"];

/// A problem with a file of a checkpoint, before the file and key are known.
pub(crate) type Parse<T> = std::result::Result<T, OrbaxProblem>;

/// The error of `found` at `key` of the file `path`.
pub(crate) fn problem(path: &Path, key: &str, found: OrbaxProblem) -> Error {
    Error::Orbax { path: path.to_path_buf(), key: key.to_string(), problem: found }
}

/// Whether `folder` is an Orbax checkpoint: it holds `_METADATA`, `_CHECKPOINT_METADATA` or an
/// OCDBT `manifest.ocdbt`.
pub(crate) fn is_orbax(folder: &Path) -> bool {
    [METADATA, CHECKPOINT_METADATA, ocdbt::MANIFEST].iter().any(|name| folder.join(name).is_file())
}

/// The archive of the Orbax checkpoint in `folder`: entries made when read.
///
/// # Errors
/// [`Error::Io`] for files that cannot be read, [`Error::Orbax`] naming the file and key of
/// metadata that cannot be used, [`Error::Duplicate`] for two leaves of one name.
pub(crate) fn open(folder: &Path) -> Result<Archive> {
    if !folder.join(METADATA).is_file() && !folder.join(ocdbt::MANIFEST).is_file() {
        let mut items = Vec::new();
        for item in std::fs::read_dir(folder).map_err(Error::io("list", folder))? {
            let path = item.map_err(Error::io("list", folder))?.path();
            if path.is_dir() && (path.join(METADATA).is_file() || path.join(ocdbt::MANIFEST).is_file()) {
                items.push(path);
            }
        }
        items.sort();
        match &items[..] {
            [] => {}
            [item] => return open_item(item),
            _ => {
                let mut archives = Vec::with_capacity(items.len());
                for item in &items {
                    let prefix = item.file_name().unwrap_or_default().to_string_lossy().into_owned();
                    archives.push(open_item(item)?.renamed(|name| Some(format!("{prefix}.{name}")))?);
                }
                let mut joined = Archive::union(archives)?;
                joined.set_origin(folder);
                return Ok(joined);
            }
        }
    }
    open_item(folder)
}

/// The archive of one checkpoint folder (an item of a manager's step, or a checkpoint saved by
/// a `Checkpointer`).
fn open_item(folder: &Path) -> Result<Archive> {
    let store = if folder.join(ocdbt::MANIFEST).is_file() {
        KeyValues::Ocdbt(ocdbt::Database::open(folder)?)
    } else {
        KeyValues::Folder(folder.to_path_buf())
    };
    let leaves = match tree(folder)? {
        Some(leaves) => leaves,
        None => store.array_names()?.into_iter().map(|name| (name, true)).collect(),
    };
    let mut arrays = Vec::with_capacity(leaves.len());
    for (name, is_array) in leaves {
        match zarr::metadata(&name, |key| store.get(key))? {
            Some((meta, path)) => arrays.push(Array { name, meta, path }),
            None if is_array => return Err(problem(&folder.join(METADATA), &name, OrbaxProblem::MissingArray)),
            None => {}
        }
    }
    let names: Vec<String> = arrays.iter().map(|array| array.name.clone()).collect();
    let checkpoint: Arc<dyn Store> = Arc::new(Checkpoint { folder: folder.to_path_buf(), store, arrays });
    let mut archive = Archive::named(folder, BTreeMap::new());
    for (at, name) in names.into_iter().enumerate() {
        if archive.contains(&name) {
            let origin = archive.origin().to_string();
            return Err(Error::Duplicate { name, first: origin.clone(), second: origin });
        }
        archive.push(name, checkpoint.clone(), at);
    }
    Ok(archive)
}

/// A key of a pytree path: a sequence index, or a dict key (or attribute name).
#[derive(PartialEq, Eq, PartialOrd, Ord)]
enum Part {
    Index(u64),
    Name(String),
}

impl std::fmt::Display for Part {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Part::Index(index) => write!(f, "{index}"),
            Part::Name(name) => f.write_str(name),
        }
    }
}

/// The `key_type` of a sequence index in `_METADATA` (dict keys are 2).
const SEQUENCE_KEY: u64 = 1;

/// The leaves `_METADATA` names, in pytree order (dict keys sorted as JAX flattens a dict,
/// sequence indexes in order), each with whether orbax stores it as an array; `None` when there
/// is no `_METADATA`.
fn tree(folder: &Path) -> Result<Option<Vec<(String, bool)>>> {
    let path = folder.join(METADATA);
    if !path.is_file() {
        return Ok(None);
    }
    let len = std::fs::metadata(&path).map_err(Error::io("read", &path))?.len();
    if len > MAX_METADATA_BYTES {
        let too_large = OrbaxProblem::TooLarge { what: "`_METADATA`", limit: MAX_METADATA_BYTES };
        return Err(problem(&path, "tree_metadata", too_large));
    }
    let bytes = std::fs::read(&path).map_err(Error::io("read", &path))?;
    let json = |message: String| problem(&path, "tree_metadata", OrbaxProblem::Json { what: "`_METADATA`", message });
    let doc: Json = serde_json::from_slice(&bytes).map_err(|error| json(error.to_string()))?;
    let Some(leaves) = doc.get("tree_metadata").and_then(Json::as_object) else {
        return Err(json("it has no `tree_metadata` object".into()));
    };
    let mut found = Vec::with_capacity(leaves.len());
    for (leaf, value) in leaves {
        let Some(keys) = value.get("key_metadata").and_then(Json::as_array) else {
            return Err(json(format!("the leaf `{leaf}` has no `key_metadata` list")));
        };
        let mut parts = Vec::with_capacity(keys.len());
        for key in keys {
            match key.get("key") {
                Some(Json::String(text)) => parts.push(match text.parse() {
                    Ok(index) if key.get("key_type").and_then(Json::as_u64) == Some(SEQUENCE_KEY) => Part::Index(index),
                    _ => Part::Name(text.clone()),
                }),
                Some(Json::Number(number)) => parts.push(match number.as_u64() {
                    Some(index) => Part::Index(index),
                    None => Part::Name(number.to_string()),
                }),
                _ => return Err(json(format!("the leaf `{leaf}` has a key that is not a string or a number"))),
            }
        }
        let name = parts.iter().map(Part::to_string).collect::<Vec<_>>().join(".");
        // The name is a key of the store and a folder name: one plain path component.
        if name.is_empty() || name == "." || name == ".." || name.contains(['/', '\\']) {
            return Err(json(format!("the leaf `{leaf}` is named `{name}`, which cannot name an array")));
        }
        let value_type = value.get("value_metadata").and_then(|meta| meta.get("value_type")).and_then(Json::as_str);
        let is_array = value_type.is_some_and(|kind| ARRAY_TYPES.contains(&kind));
        found.push((parts, name, is_array));
    }
    found.sort();
    Ok(Some(found.into_iter().map(|(_, name, is_array)| (name, is_array)).collect()))
}

/// Where a checkpoint keeps its keys (`NAME/zarr.json`, `NAME/c/0/1`, ...).
enum KeyValues {
    /// An OCDBT database.
    Ocdbt(ocdbt::Database),
    /// One file per key under the checkpoint's folder.
    Folder(PathBuf),
}

impl KeyValues {
    /// The value of `key`, `None` when there is none.
    fn get(&self, key: &str) -> Result<Option<Value>> {
        match self {
            KeyValues::Ocdbt(database) => database.get(key),
            KeyValues::Folder(folder) => {
                let path = folder.join(key);
                match std::fs::symlink_metadata(&path) {
                    Ok(meta) if meta.is_file() => Ok(Some(Value::File { path, offset: 0, len: meta.len() })),
                    _ => Ok(None),
                }
            }
        }
    }

    /// Every key under the array `name` (relative to `name/`) and its value.
    fn under(&self, name: &str) -> Result<Vec<(String, Value)>> {
        let mut found = Vec::new();
        match self {
            KeyValues::Ocdbt(database) => {
                let prefix = format!("{name}/");
                database.scan(&prefix, &mut |key, value| {
                    found.push((key[prefix.len()..].to_string(), value));
                    Ok(())
                })?;
            }
            KeyValues::Folder(folder) => {
                // Chunk keys are at most `c` and one folder per axis deep.
                let mut pending = vec![(folder.join(name), String::new(), 0usize)];
                while let Some((dir, relative, depth)) = pending.pop() {
                    let Ok(listing) = std::fs::read_dir(&dir) else { continue };
                    for item in listing {
                        let item = item.map_err(Error::io("list", &dir))?;
                        let Ok(file_name) = item.file_name().into_string() else { continue };
                        let key = if relative.is_empty() { file_name } else { format!("{relative}/{file_name}") };
                        let Ok(meta) = item.metadata() else { continue };
                        if meta.is_file() {
                            found.push((key, Value::File { path: item.path(), offset: 0, len: meta.len() }));
                        } else if meta.is_dir() && depth < 65 {
                            pending.push((item.path(), key, depth + 1));
                        }
                    }
                }
            }
        }
        Ok(found)
    }

    /// The arrays of a checkpoint without `_METADATA`: every name with zarr metadata, sorted.
    fn array_names(&self) -> Result<Vec<String>> {
        let mut names = Vec::new();
        match self {
            KeyValues::Ocdbt(database) => database.scan("", &mut |key, _| {
                if let Some(name) = key.strip_suffix("/zarr.json").or_else(|| key.strip_suffix("/.zarray"))
                    && !name.contains('/')
                    && names.last() != Some(&name.to_string())
                {
                    names.push(name.to_string());
                }
                Ok(())
            })?,
            KeyValues::Folder(folder) => {
                for item in std::fs::read_dir(folder).map_err(Error::io("list", folder))? {
                    let path = item.map_err(Error::io("list", folder))?.path();
                    if path.join("zarr.json").is_file() || path.join(".zarray").is_file() {
                        names.extend(path.file_name().and_then(|name| name.to_str()).map(str::to_string));
                    }
                }
            }
        }
        names.sort();
        names.dedup();
        Ok(names)
    }
}

/// A stored value: bytes held (a value inside an OCDBT node), or a range of a file.
pub(crate) enum Value {
    /// Bytes read already, from the file `path`.
    Bytes { bytes: Vec<u8>, path: PathBuf },
    /// Bytes `offset..offset + len` of the file `path`.
    File { path: PathBuf, offset: u64, len: u64 },
}

impl Value {
    /// The file the value lies in, for errors.
    pub(crate) fn path(&self) -> &Path {
        match self {
            Value::Bytes { path, .. } | Value::File { path, .. } => path,
        }
    }

    /// The value's length.
    pub(crate) fn len(&self) -> u64 {
        match self {
            Value::Bytes { bytes, .. } => bytes.len() as u64,
            Value::File { len, .. } => *len,
        }
    }

    /// Bytes `start..start + len` of the value, which the caller has checked lie inside it.
    pub(crate) fn read(&self, key: &str, start: u64, len: u64) -> Result<Vec<u8>> {
        debug_assert!(start.checked_add(len).is_some_and(|end| end <= self.len()), "a range of the value");
        match self {
            Value::Bytes { bytes, .. } => Ok(bytes[start as usize..(start + len) as usize].to_vec()),
            Value::File { path, offset, .. } => read_file_range(path, key, "the data file", offset + start, len),
        }
    }
}

/// Bytes `offset..offset + len` of the file `path` (`what`, for errors), checked against the
/// file's length before anything is allocated.
pub(crate) fn read_file_range(path: &Path, key: &str, what: &'static str, offset: u64, len: u64) -> Result<Vec<u8>> {
    let mut file = File::open(path).map_err(Error::io("open", path))?;
    let file_len = file.metadata().map_err(Error::io("read", path))?.len();
    let end = offset.checked_add(len).filter(|&end| end <= file_len);
    if end.is_none() {
        return Err(problem(
            path,
            key,
            OrbaxProblem::PastEnd { what, offset, end: offset.saturating_add(len), len: file_len },
        ));
    }
    let mut bytes = Vec::new();
    let size = usize::try_from(len).unwrap_or(usize::MAX);
    bytes.try_reserve_exact(size).map_err(|_| problem(path, key, OrbaxProblem::Memory { bytes: len }))?;
    file.seek(SeekFrom::Start(offset)).map_err(Error::io("read", path))?;
    file.take(len).read_to_end(&mut bytes).map_err(Error::io("read", path))?;
    if bytes.len() as u64 != len {
        let truncated = OrbaxProblem::Truncated {
            what: what.to_string(),
            needed: offset + len,
            available: offset + bytes.len() as u64,
        };
        return Err(problem(path, key, truncated));
    }
    Ok(bytes)
}

/// The zstd frames of `data` decompressed, no more than `limit` bytes.
///
/// # Errors
/// [`OrbaxProblem::Zstd`] for data that is not zstd, [`OrbaxProblem::TooLarge`] past `limit`.
pub(crate) fn zstd_decode(data: &[u8], limit: u64, what: &'static str) -> Parse<Vec<u8>> {
    let out = zstd_decode_capped(data, limit, what)?;
    if out.len() as u64 > limit {
        return Err(OrbaxProblem::TooLarge { what, limit });
    }
    Ok(out)
}

/// The zstd frames of `data` decompressed, stopping one byte past `cap` (which the caller
/// tells from a value of `cap` bytes or fewer).
///
/// # Errors
/// [`OrbaxProblem::Zstd`] for data that is not zstd.
pub(crate) fn zstd_decode_capped(data: &[u8], cap: u64, what: &'static str) -> Parse<Vec<u8>> {
    let failed = |message: String| OrbaxProblem::Zstd { what, message };
    let limit = cap.saturating_add(1);
    let mut out = Vec::with_capacity(usize::try_from(cap.min(1 << 20)).unwrap_or(0));
    let mut rest = data;
    // Frame after frame, as a stream of concatenated frames decodes.
    while !rest.is_empty() && (out.len() as u64) < limit {
        let mut decoder =
            ruzstd::decoding::StreamingDecoder::new(&mut rest).map_err(|error| failed(error.to_string()))?;
        let left = limit - out.len() as u64;
        (&mut decoder).take(left).read_to_end(&mut out).map_err(|error| failed(error.to_string()))?;
    }
    Ok(out)
}

/// One array of a checkpoint: its entry name (its key in the store too), its zarr metadata and
/// the file that holds the metadata.
struct Array {
    name: String,
    meta: zarr::ArrayMeta,
    path: PathBuf,
}

/// An opened checkpoint: the source of its entries, each assembled from its chunks when read.
struct Checkpoint {
    folder: PathBuf,
    store: KeyValues,
    arrays: Vec<Array>,
}

impl Checkpoint {
    /// The global value of array `at`: the fill value where no chunk is stored.
    fn read(&self, at: usize) -> Result<Tensor> {
        let array = &self.arrays[at];
        let chunks = self.store.under(&array.name)?;
        let meta = &array.meta;
        Tensor::filled(meta.dtype, &meta.shape, |out| meta.assemble(out, &array.name, chunks)).map_err(|error| {
            match error {
                Error::Allocation { bytes, .. } => {
                    problem(&array.path, &array.name, OrbaxProblem::Memory { bytes: bytes as u64 })
                }
                Error::InvalidBool { .. } => {
                    Error::Data { path: array.path.clone(), name: array.name.clone(), source: Box::new(error) }
                }
                other => other,
            }
        })
    }

    fn bytes(&self, at: usize) -> usize {
        let meta = &self.arrays[at].meta;
        meta.shape.iter().product::<usize>() * meta.dtype.size_in_bytes().unwrap_or(1)
    }
}

impl Source for Checkpoint {
    fn spec(&self, at: usize) -> (DType, &[usize]) {
        let meta = &self.arrays[at].meta;
        (meta.dtype, &meta.shape)
    }

    fn tensor(&self, at: usize) -> Result<Tensor> {
        self.read(at)
    }

    fn path(&self) -> Option<&Path> {
        Some(&self.folder)
    }

    fn location(&self, _at: usize) -> Option<EntryLocation> {
        None
    }

    fn stored_bytes(&self, at: usize) -> usize {
        self.bytes(at)
    }

    /// Each stored chunk (a shard, for zarr3's `sharding_indexed`) is compressed: read whole.
    /// Values kept inside an OCDBT node are read with the node, and counted at their size.
    fn stored_pieces(&self, at: usize) -> Result<Vec<crate::plan::StoredPiece>> {
        use crate::plan::{PieceLayout, StoredPiece};
        let array = &self.arrays[at];
        let mut pieces = Vec::new();
        for (key, value) in self.store.under(&array.name)? {
            let Some((offsets, sizes)) = array.meta.chunk_box(&key) else { continue };
            let (file, layout) = match value {
                Value::File { path, offset, len } => (path, PieceLayout::Whole { start: offset, len }),
                Value::Bytes { bytes, path } => (path, PieceLayout::Inline { len: bytes.len() as u64 }),
            };
            pieces.push(StoredPiece { file, offsets, sizes, layout });
        }
        Ok(pieces)
    }

    fn made_when_read(&self, _at: usize) -> bool {
        true
    }

    fn data(&self, at: usize) -> std::result::Result<Cow<'_, [u8]>, DataError> {
        crate::source::made_data(self.tensor(at))
    }
}
