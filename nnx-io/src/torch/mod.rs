//! PyTorch checkpoints (`torch.save`: the zip format, the legacy format; or a state dict
//! written by `pickle`, its storages pickled inside it) read
//! without executing anything: [`pickle`] reads the object with a restricted unpickler, the
//! containers ([`zip`], [`legacy`]) say where each storage's bytes lie, and this module turns
//! the value tree into named tensors (views of the mapped file) and metadata.

mod legacy;
pub(crate) mod pickle;
pub(crate) mod write;
pub(crate) mod zip;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::Arc;

use nnx_core::{ByteSource, Tensor};

use self::pickle::{Container, MAX_DEPTH, StorageRef, TensorRecord, Unpickled, Value, unpickle};
use self::zip::{Record, ZipRecords};
use crate::archive::Archive;
use crate::budget::TextBudget;
use crate::error::{Error, Result, ShardProblem, TorchProblem};
use crate::format::{TorchContainer, torch_container};
use crate::mapping::Mapping;

/// The tensors and plain values of a checkpoint.
pub(crate) struct Checkpoint {
    /// Tensors by dict path, in the pickle's order.
    pub(crate) entries: Vec<(String, Tensor)>,
    /// Plain values (integers, floats, strings, booleans) by dict path, as text.
    pub(crate) metadata: BTreeMap<String, String>,
}

/// The archive of the PyTorch checkpoint at `path`: its tensors (views of the mapped file)
/// and plain values.
///
/// # Errors
/// As [`read`].
pub(crate) fn open(path: &Path) -> Result<Archive> {
    let checkpoint = read(path)?;
    let mut archive = Archive::named(path, checkpoint.metadata);
    for (name, tensor) in checkpoint.entries {
        archive.insert(name, tensor);
    }
    Ok(archive)
}

/// The archive of a shard index of PyTorch checkpoints (`pytorch_model.bin.index.json`):
/// every shard is read (a pickle parse each; tensor bytes stay mapped) and checked against
/// the index.
///
/// # Errors
/// The errors of reading the index and the shards, [`Error::MissingShard`], and
/// [`Error::ShardMismatch`] for an entry the index puts in another shard or a shard lacks.
pub(crate) fn open_index(path: &Path) -> Result<Archive> {
    let index = crate::safetensors::index::ShardIndex::read(path)?;
    let mut shards = Vec::with_capacity(index.shards.len());
    for shard in &index.shards {
        if !shard.is_file() {
            return Err(Error::MissingShard { index: path.to_path_buf(), shard: shard.clone() });
        }
        shards.push(open(shard)?);
    }
    let placed: HashMap<&str, usize> = index.weight_map.iter().map(|(name, at)| (name.as_str(), *at)).collect();
    for (at, shard) in shards.iter().enumerate() {
        if let Some(name) = shard.names().find(|name| placed.get(name).is_some_and(|&other| other != at)) {
            return Err(Error::ShardMismatch {
                index: path.to_path_buf(),
                shard: index.shards[at].clone(),
                problem: ShardProblem::ElsewhereInIndex {
                    name: name.to_string(),
                    other: index.shards[placed[name]].clone(),
                },
            });
        }
    }
    let mut archive = Archive::named(path, index.metadata.clone());
    for (name, at) in &index.weight_map {
        let Some(slot) = shards[*at].slots.get(name) else {
            return Err(Error::ShardMismatch {
                index: path.to_path_buf(),
                shard: index.shards[*at].clone(),
                problem: ShardProblem::MissingEntry { name: name.clone() },
            });
        };
        archive.push(name.clone(), slot.store.clone(), slot.at);
    }
    Ok(archive)
}

/// Maps the checkpoint at `path` and reads its pickle; tensors become views of the mapping
/// (copies only for legacy storages whose bytes are not aligned for their dtype).
///
/// # Errors
/// [`Error::Io`], or [`Error::Torch`] saying what is wrong (a refused global among them).
pub(crate) fn read(path: &Path) -> Result<Checkpoint> {
    let file = File::open(path).map_err(Error::io("open", path))?;
    let mapped = Arc::new(Mapping::new(&file, path)?);
    // Opening reads the central directory, one local header per record and the pickle: a few
    // bytes here and there. Without this hint every header touched would read ahead megabytes
    // of tensor data, half the file for a 1 GiB checkpoint on a cold cache. The usual
    // read-ahead is restored once the headers are read, for the tensors. Only a hint.
    #[cfg(unix)]
    mapped.advise(memmap2::Advice::Random);
    let refuse = |problem| Error::Torch { path: path.to_path_buf(), problem };
    let bytes = mapped.bytes();
    let (unpickled, records) = match torch_container(bytes) {
        Some(TorchContainer::Zip) => read_zip(bytes, 0).map_err(refuse)?,
        Some(TorchContainer::Legacy) => legacy::read(bytes).map_err(refuse)?,
        Some(TorchContainer::Pickle) | None => {
            let unpickled = unpickle(bytes, 0).map_err(|error| {
                refuse(TorchProblem::Pickle {
                    pickle: "the pickle".into(),
                    offset: error.offset,
                    problem: error.problem,
                })
            })?;
            (unpickled, HashMap::new())
        }
    };
    let mut walk = Walk {
        unpickled: &unpickled,
        tensors: Vec::new(),
        metadata: BTreeMap::new(),
        visits: 0,
        budget: TextBudget::new(),
    };
    if !matches!(unpickled.root, Value::Dict(_)) {
        return Err(refuse(TorchProblem::NotADict));
    }
    walk.value(&unpickled.root, "", 0).map_err(refuse)?;
    let Walk { tensors, metadata, .. } = walk;

    let mut names = HashSet::with_capacity(tensors.len());
    let source: Arc<dyn ByteSource> = mapped.clone();
    let mut builder = Builder { path, source, records: &records, storages: HashMap::new() };
    let mut entries = Vec::with_capacity(tensors.len());
    for (name, record) in tensors {
        if !names.insert(name.clone()) || metadata.contains_key(&name) {
            return Err(refuse(TorchProblem::DuplicateName { name }));
        }
        let tensor = builder.tensor(&name, &record)?;
        entries.push((name, tensor));
    }
    #[cfg(unix)]
    mapped.advise(memmap2::Advice::Normal);
    Ok(Checkpoint { entries, metadata })
}

/// What one item of a distributed checkpoint holds: each is a `torch.save` zip of its own,
/// laid in a `.distcp` file at `start..start + len`, whose pickle is a tensor (a chunk) or a
/// plain value (a step counter, a learning rate).
pub(crate) enum Item {
    /// The chunk, a view of the mapped file, and the file offset of its storage's first byte.
    Tensor(Tensor, usize),
    /// Plain values by path under the item's name.
    Values(BTreeMap<String, String>),
}

/// Reads the item named `name` at `start..start + len` of `mapped` (the file at `path`, which
/// the caller has checked holds that range) as [`read`] reads a checkpoint, with nothing run.
///
/// # Errors
/// [`Error::Torch`] naming `path` for a zip or pickle that cannot be read, a global refused
/// by name among them.
pub(crate) fn read_item(mapped: &Arc<Mapping>, path: &Path, start: usize, len: usize, name: &str) -> Result<Item> {
    let refuse = |problem| Error::Torch { path: path.to_path_buf(), problem };
    let (unpickled, records) = read_zip(&mapped.bytes()[start..start + len], start).map_err(refuse)?;
    if let Value::Tensor(record) = &unpickled.root {
        let source: Arc<dyn ByteSource> = mapped.clone();
        let mut builder = Builder { path, source, records: &records, storages: HashMap::new() };
        let storage = records.get(&*record.storage.key).map_or(start, |record| record.start);
        return builder.tensor(name, record).map(|tensor| Item::Tensor(tensor, storage));
    }
    let mut walk = Walk {
        unpickled: &unpickled,
        tensors: Vec::new(),
        metadata: BTreeMap::new(),
        visits: 0,
        budget: TextBudget::new(),
    };
    walk.value(&unpickled.root, name, 0).map_err(refuse)?;
    Ok(Item::Values(walk.metadata))
}

/// The pickle of the `torch.save` zip `bytes` and where each storage it names lies, as offsets
/// from `base` (where `bytes` start in their file).
fn read_zip(bytes: &[u8], base: usize) -> std::result::Result<(Unpickled, HashMap<String, Record>), TorchProblem> {
    let zip = ZipRecords::read(bytes)?;
    let pickle = zip.get("data.pkl").ok_or(TorchProblem::NoDataPickle)?;
    if let Some(order) = zip.get("byteorder")
        && &bytes[order.start..order.start + order.len] == b"big"
    {
        return Err(TorchProblem::BigEndian);
    }
    let unpickled =
        unpickle(&bytes[pickle.start..pickle.start + pickle.len], 0).map_err(|error| TorchProblem::Pickle {
            pickle: format!("`{}`", zip.name("data.pkl")),
            offset: error.offset,
            problem: error.problem,
        })?;
    let mut records = HashMap::new();
    for storage in unpickled.storages.iter().filter(|storage| storage.inline.is_none()) {
        if let Some(record) = zip.get(&format!("data/{}", storage.key)) {
            records.insert(storage.key.to_string(), Record { start: base + record.start, len: record.len });
        }
    }
    Ok((unpickled, records))
}

/// The most values a walk of the tree visits: far more than any checkpoint holds, few enough
/// that a tree sharing one big list many times over is refused quickly.
const MAX_VISITS: usize = 1 << 20;

/// Collects the tensors and plain values of the tree by dict path.
///
/// The memo lets a pickle name one value any number of times at the cost of a few bytes each,
/// while every visit here makes a path and, for a plain value, its text. So the paths and texts
/// kept are counted against [`MAX_METADATA_BYTES`](crate::budget::MAX_METADATA_BYTES): memory follows what the checkpoint holds,
/// never how often it refers to it.
struct Walk<'a> {
    unpickled: &'a Unpickled,
    tensors: Vec<(String, Rc<TensorRecord>)>,
    metadata: BTreeMap<String, String>,
    visits: usize,
    budget: TextBudget,
}

fn join(prefix: &str, key: &str) -> String {
    if prefix.is_empty() { key.to_string() } else { format!("{prefix}.{key}") }
}

impl Walk<'_> {
    fn value(&mut self, value: &Value, name: &str, depth: usize) -> std::result::Result<(), TorchProblem> {
        self.visits += 1;
        if depth > MAX_DEPTH || self.visits > MAX_VISITS {
            return Err(TorchProblem::TooDeep { name: name.to_string() });
        }
        let unpickled = self.unpickled;
        match value {
            Value::Tensor(record) => {
                self.take(name, 0)?;
                self.tensors.push((name.to_string(), record.clone()));
            }
            Value::Dict(id) => {
                let Container::Dict(pairs) = &unpickled.containers[*id] else { return Ok(()) };
                for (key, item) in pairs {
                    let key = match key {
                        Value::Str(key) => key.to_string(),
                        Value::Int(key) => key.to_string(),
                        _ => continue,
                    };
                    self.value(item, &join(name, &key), depth + 1)?;
                }
            }
            Value::List(id) => {
                let Container::List(items) = &unpickled.containers[*id] else { return Ok(()) };
                for (at, item) in items.iter().enumerate() {
                    self.value(item, &join(name, &at.to_string()), depth + 1)?;
                }
            }
            Value::Tuple(tuple) => {
                for (at, item) in tuple.items.iter().enumerate() {
                    self.value(item, &join(name, &at.to_string()), depth + 1)?;
                }
            }
            Value::Int(value) => self.plain(name, || value.to_string(), 20)?,
            Value::Float(value) => self.plain(name, || format!("{value:?}"), 24)?,
            Value::Bool(value) => self.plain(name, || value.to_string(), 5)?,
            Value::Str(value) => self.plain(name, || value.to_string(), value.len())?,
            Value::None | Value::Global(_) | Value::Storage(_) | Value::Bytes(_) | Value::Object(_) => {}
        }
        Ok(())
    }

    /// Counts an entry named `name` holding `text` bytes, before anything is made for it.
    fn take(&mut self, name: &str, text: usize) -> std::result::Result<(), TorchProblem> {
        self.budget.take_entry(name.len().saturating_add(text)).map_err(|asked| TorchProblem::TooMuchText {
            name: name.to_string(),
            asked,
            limit: self.budget.limit,
        })
    }

    /// Keeps a plain value as text; `len` is at least the length of that text.
    fn plain(
        &mut self,
        name: &str,
        text: impl FnOnce() -> String,
        len: usize,
    ) -> std::result::Result<(), TorchProblem> {
        if !name.is_empty() {
            self.take(name, len)?;
            self.metadata.insert(name.to_string(), text());
        }
        Ok(())
    }
}

/// Builds each storage once, as a one-dimensional tensor over its bytes, and each tensor as a
/// view of its storage.
struct Builder<'a> {
    path: &'a Path,
    source: Arc<dyn ByteSource>,
    records: &'a HashMap<String, Record>,
    /// Storages built so far: by key for records of the file, by address for inline ones.
    storages: HashMap<StorageKey, Tensor>,
}

/// Names a storage: a file's record keys are unique in it; a storage pickled inside the pickle
/// is one value, however often the memo hands it out.
#[derive(Clone, PartialEq, Eq, Hash)]
enum StorageKey {
    Record(Rc<str>),
    Inline(*const u8),
}

impl Builder<'_> {
    fn path(&self) -> PathBuf {
        self.path.to_path_buf()
    }

    fn refuse(&self, problem: TorchProblem) -> Error {
        Error::Torch { path: self.path(), problem }
    }

    /// The whole storage `key` as a one-dimensional tensor, checked against its bytes.
    fn root(&mut self, name: &str, storage: &StorageRef) -> Result<Tensor> {
        let cache_key = match &storage.inline {
            Some(bytes) => StorageKey::Inline(bytes.as_ptr()),
            None => StorageKey::Record(storage.key.clone()),
        };
        if let Some(root) = self.storages.get(&cache_key) {
            if root.dtype() != storage.dtype {
                return Err(self.refuse(TorchProblem::StorageDType { key: storage.key.to_string() }));
            }
            return Ok(root.clone());
        }
        let size = storage.dtype.size_in_bytes().expect("storage dtypes are whole bytes");
        let size_error = |bytes: usize| {
            self.refuse(TorchProblem::StorageSize {
                key: storage.key.to_string(),
                dtype: storage.dtype,
                numel: storage.numel,
                bytes,
            })
        };
        let shape = [storage.numel];
        let data_error = |source| Error::Data { path: self.path(), name: name.to_string(), source: Box::new(source) };
        if let Some(bytes) = &storage.inline {
            if !bytes.len().is_multiple_of(size) || bytes.len() / size != storage.numel {
                return Err(size_error(bytes.len()));
            }
            let root = Tensor::from_bytes(storage.dtype, &shape, bytes).map_err(data_error)?;
            self.storages.insert(cache_key, root.clone());
            return Ok(root);
        }
        let record = *self
            .records
            .get(&*storage.key)
            .ok_or_else(|| self.refuse(TorchProblem::MissingStorage { key: storage.key.to_string() }))?;
        if !record.len.is_multiple_of(size) || record.len / size != storage.numel {
            return Err(size_error(record.len));
        }
        let root = match Tensor::from_shared(self.source.clone(), record.start, record.len, storage.dtype, &shape) {
            Ok(root) => root,
            Err(nnx_core::Error::Misaligned { .. }) => {
                let bytes = &self.source.bytes()[record.start..record.start + record.len];
                Tensor::from_bytes(storage.dtype, &shape, bytes).map_err(data_error)?
            }
            Err(error) => return Err(data_error(error)),
        };
        self.storages.insert(cache_key, root.clone());
        Ok(root)
    }

    fn tensor(&mut self, name: &str, record: &TensorRecord) -> Result<Tensor> {
        let storage = &record.storage;
        let mut base = self.root(name, storage)?;
        let layout_error = |storage: usize| TorchProblem::TensorLayout {
            name: name.to_string(),
            shape: record.shape.clone(),
            strides: record.strides.clone(),
            offset: record.offset,
            storage,
        };
        if let Some((offset, len)) = storage.view {
            let whole = base.len();
            base = base.as_strided(&[len], &[1], offset).map_err(|_| self.refuse(layout_error(whole)))?;
        }
        base.as_strided(&record.shape, &record.strides, record.offset)
            .map_err(|_| self.refuse(layout_error(base.len())))
    }
}
