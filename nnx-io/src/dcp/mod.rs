//! PyTorch Distributed Checkpoints (`torch.distributed.checkpoint`, "DCP"): a folder of
//! `.metadata` (the global shape of every tensor, its chunks, and where each chunk's bytes lie)
//! and `__R_I.distcp` files, each a run of independent `torch.save` zips, one per chunk or
//! non-tensor item. Every tensor is one entry of its global shape: a view of the file where one
//! chunk covers it, else assembled from its chunks when read, holding one tensor at a time.
//! Nothing is executed: `.metadata` goes through the restricted unpickler with DCP's own
//! dataclasses admitted, items through the unpickler of state dicts.

mod metadata;
mod write;

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use nnx_core::error::DcpProblem;
use nnx_core::{ByteSource, DType, Tensor};

use crate::archive::{Archive, EntryLocation};
use crate::error::{Error, Result, TorchProblem};
use crate::mapping::Mapping;
use crate::source::{DataError, Source};
use crate::torch::{Item, read_item};

/// The file of a checkpoint's metadata: its presence makes a folder a DCP checkpoint.
pub(crate) const METADATA: &str = ".metadata";

/// The largest `.metadata` read: thousands of times the metadata of the largest published
/// training runs.
const MAX_METADATA_BYTES: u64 = 1 << 30;

/// Whether `dir` holds a distributed checkpoint.
pub(crate) fn is_checkpoint(dir: &Path) -> bool {
    dir.join(METADATA).is_file()
}

/// One file the items lie in, mapped (or, for a SafeTensors file, opened) on first use.
struct ItemFile {
    name: String,
    path: PathBuf,
    size: u64,
    /// Whether the file is a SafeTensors file rather than a run of `torch.save` zips.
    is_safetensors: bool,
    mapping: Mutex<Option<Arc<Mapping>>>,
    safetensors: Mutex<Option<Archive>>,
}

impl ItemFile {
    fn new(name: String, path: PathBuf, size: u64) -> Result<ItemFile> {
        let is_safetensors = safetensors_file(&path)?;
        Ok(ItemFile { name, path, size, is_safetensors, mapping: Mutex::new(None), safetensors: Mutex::new(None) })
    }

    /// `read` of the file opened as SafeTensors, opened on first use.
    fn with_safetensors<T>(&self, read: impl FnOnce(&Archive) -> Result<T>) -> Result<T> {
        let mut slot = self.safetensors.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if slot.is_none() {
            *slot = Some(crate::safetensors::open(&self.path)?);
        }
        read(slot.as_ref().expect("opened above"))
    }
}

/// Where one chunk's values lie.
#[derive(Clone, Debug)]
enum Stored {
    /// A `torch.save` zip at `start..start + len` of the file.
    Torch { start: usize, len: usize },
    /// The entry `name` of the file, a SafeTensors file (the HF storage layout, or DCP's
    /// SafeTensors serialization format).
    SafeTensors { name: String },
}

/// One chunk of a tensor: where it lands and where its values lie.
#[derive(Clone, Debug)]
struct Piece {
    offsets: Vec<usize>,
    sizes: Vec<usize>,
    file: usize,
    stored: Stored,
}

struct Entry {
    name: String,
    dtype: DType,
    shape: Vec<usize>,
    pieces: Vec<Piece>,
}

/// The tensors of a checkpoint, each read from its pieces.
struct Checkpoint {
    folder: PathBuf,
    files: Vec<ItemFile>,
    entries: Vec<Entry>,
}

/// Opens the checkpoint in `dir`: reads `.metadata` and the non-tensor items (as metadata);
/// tensors are read when asked for.
///
/// # Errors
/// [`Error::Io`], [`Error::Torch`] for a `.metadata` pickle that cannot be read or names a
/// global nnx does not admit (named), [`Error::Dcp`] for metadata that does not describe a
/// readable checkpoint (chunks that do not tile their tensor, items past their file's end).
pub(crate) fn open(dir: &Path) -> Result<Archive> {
    let metadata_path = dir.join(METADATA);
    let refuse = |problem| Error::Dcp { path: dir.to_path_buf(), problem };
    let file = File::open(&metadata_path).map_err(Error::io("open", &metadata_path))?;
    let len = file.metadata().map_err(Error::io("read", &metadata_path))?.len();
    if len > MAX_METADATA_BYTES {
        return Err(refuse(DcpProblem::Metadata {
            at: "the file".into(),
            expected: "at most 1 GiB",
            found: format!("{len} bytes"),
        }));
    }
    let mapped = Mapping::new(&file, &metadata_path)?;
    let unpickled = crate::torch::pickle::unpickle_dcp_metadata(mapped.bytes()).map_err(|error| Error::Torch {
        path: metadata_path.clone(),
        problem: TorchProblem::Pickle { pickle: "`.metadata`".into(), offset: error.offset, problem: error.problem },
    })?;
    let meta = metadata::decode(&unpickled).map_err(refuse)?;
    drop(unpickled);

    let mut files: Vec<ItemFile> = Vec::new();
    let mut file_numbers: BTreeMap<String, usize> = BTreeMap::new();
    let mut place = |name: &str, offsets: &[usize]| -> Result<Piece> {
        let key = (name.to_string(), offsets.to_vec());
        let info = meta
            .storage
            .get(&key)
            .ok_or_else(|| refuse(DcpProblem::Unplaced { name: name.to_string(), offsets: offsets.to_vec() }))?;
        if !info.transforms.is_empty() {
            return Err(refuse(DcpProblem::Transform { name: name.to_string(), descriptors: info.transforms.clone() }));
        }
        let number = match file_numbers.get(&info.relative_path) {
            Some(&number) => number,
            None => {
                let relative = &info.relative_path;
                let plain = !relative.is_empty()
                    && !relative.contains(['/', '\\'])
                    && relative != "."
                    && relative != ".."
                    && relative != METADATA;
                if !plain {
                    return Err(refuse(DcpProblem::File {
                        file: relative.clone(),
                        problem: "is not a file of the folder",
                    }));
                }
                let path = dir.join(relative);
                let size = std::fs::metadata(&path)
                    .ok()
                    .filter(std::fs::Metadata::is_file)
                    .ok_or_else(|| refuse(DcpProblem::File { file: relative.clone(), problem: "is missing" }))?
                    .len();
                files.push(ItemFile::new(relative.clone(), path, size)?);
                file_numbers.insert(relative.clone(), files.len() - 1);
                files.len() - 1
            }
        };
        if files[number].is_safetensors {
            return Ok(Piece {
                offsets: Vec::new(),
                sizes: Vec::new(),
                file: number,
                stored: Stored::SafeTensors { name: name.to_string() },
            });
        }
        let size = files[number].size;
        if info.offset.checked_add(info.length).is_none_or(|end| end > size) {
            return Err(refuse(DcpProblem::PastEnd {
                name: name.to_string(),
                file: info.relative_path.clone(),
                offset: info.offset,
                length: info.length,
                size,
            }));
        }
        // Both are within the file's size, which a mapping holds.
        let stored = Stored::Torch { start: info.offset as usize, len: info.length as usize };
        Ok(Piece { offsets: Vec::new(), sizes: Vec::new(), file: number, stored })
    };

    let mut entries = Vec::with_capacity(meta.tensors.len());
    for tensor in &meta.tensors {
        check_chunks(tensor).map_err(refuse)?;
        let mut pieces = Vec::with_capacity(tensor.chunks.len());
        for (offsets, sizes) in &tensor.chunks {
            let mut piece = place(&tensor.name, offsets)?;
            piece.offsets.clone_from(offsets);
            piece.sizes.clone_from(sizes);
            pieces.push(piece);
        }
        entries.push(Entry { name: tensor.name.clone(), dtype: tensor.dtype, shape: tensor.size.clone(), pieces });
    }
    let mut objects = Vec::with_capacity(meta.objects.len());
    for name in &meta.objects {
        objects.push((name.clone(), place(name, &[])?));
    }
    let checkpoint = Checkpoint { folder: dir.to_path_buf(), files, entries };

    let mut text = BTreeMap::new();
    if let Some(version) = &meta.version {
        text.insert("dcp.version".to_string(), version.clone());
    }
    for (name, piece) in &objects {
        match checkpoint.item(name, piece) {
            Ok(Item::Values(values)) => text.extend(values),
            Ok(Item::Tensor(..)) => {
                return Err(refuse(DcpProblem::Metadata {
                    at: format!("state_dict_metadata['{name}']"),
                    expected: "a BytesStorageMetadata for a value that is not a tensor",
                    found: "a tensor".into(),
                }));
            }
            // Torch runs whatever such an item's pickle names; nnx reads none of it and says so.
            Err(Error::Dcp { problem: DcpProblem::Item { problem, .. }, .. }) => {
                text.insert(name.clone(), format!("(not read: {problem})"));
            }
            Err(error) => return Err(error),
        }
    }

    let mut archive = Archive::named(dir, text);
    let checkpoint = Arc::new(checkpoint);
    for (at, entry) in checkpoint.entries.iter().enumerate() {
        archive.push(entry.name.clone(), checkpoint.clone(), at);
    }
    Ok(archive)
}

/// Whether `name` is a file of the HF storage layout of a distributed checkpoint:
/// `shard-0000R-model-0000I-of-0000N.safetensors`, R the rank plus one.
pub(crate) fn is_hf_shard(name: &str) -> bool {
    let Some(stem) = name.strip_suffix(".safetensors") else { return false };
    let parts: Vec<&str> = stem.split('-').collect();
    let number = |part: &str| part.len() == 5 && part.bytes().all(|b| b.is_ascii_digit());
    matches!(parts[..], ["shard", rank, "model", file, "of", count] if number(rank) && number(file) && number(count))
}

/// Whether `dir` holds a distributed checkpoint in the HF storage layout: files named as
/// [`is_hf_shard`] says, and no `.metadata`.
pub(crate) fn is_hf_checkpoint(dir: &Path) -> bool {
    std::fs::read_dir(dir)
        .is_ok_and(|items| items.flatten().any(|item| item.file_name().to_str().is_some_and(is_hf_shard)))
}

/// Opens a checkpoint of the HF storage layout: every `shard-*` file's chunks, placed by the
/// `DCP_SHARDING_INFO` of its metadata; a tensor's global shape spans its chunks.
///
/// # Errors
/// [`Error::Io`], the errors of reading SafeTensors headers, and [`Error::Dcp`] for sharding
/// information that is missing or does not tile a tensor.
pub(crate) fn open_hf(dir: &Path) -> Result<Archive> {
    let refuse = |problem| Error::Dcp { path: dir.to_path_buf(), problem };
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map_err(Error::io("list", dir))?
        .flatten()
        .filter_map(|item| item.file_name().to_str().filter(|name| is_hf_shard(name)).map(str::to_string))
        .collect();
    names.sort();
    let mut files = Vec::with_capacity(names.len());
    let mut tensors: Vec<metadata::TensorMeta> = Vec::new();
    let mut pieces: Vec<Vec<Piece>> = Vec::new();
    let mut numbers: BTreeMap<String, usize> = BTreeMap::new();
    for (number, file_name) in names.iter().enumerate() {
        let path = dir.join(file_name);
        let archive = crate::safetensors::open(&path)?;
        let info = archive.metadata().get("DCP_SHARDING_INFO").ok_or_else(|| {
            refuse(DcpProblem::Metadata {
                at: format!("`{file_name}`'s metadata"),
                expected: "a `DCP_SHARDING_INFO` key",
                found: "none".into(),
            })
        })?;
        let sharding: BTreeMap<String, serde_json::Value> = serde_json::from_str(info).map_err(|error| {
            refuse(DcpProblem::Metadata {
                at: format!("`{file_name}`'s `DCP_SHARDING_INFO`"),
                expected: "a JSON object of entries",
                found: error.to_string(),
            })
        })?;
        for name in archive.names() {
            let at = format!("`{file_name}`'s `DCP_SHARDING_INFO` for `{name}`");
            let offsets: Vec<usize> = sharding
                .get(name)
                .and_then(|entry| entry.get("saved_offsets"))
                .and_then(|offsets| serde_json::from_value(offsets.clone()).ok())
                .ok_or_else(|| {
                    refuse(DcpProblem::Metadata { at: at.clone(), expected: "`saved_offsets`", found: "none".into() })
                })?;
            let (dtype, sizes) = archive.entry_spec(name)?.expect("the file lists the entry");
            if offsets.len() != sizes.len() {
                return Err(refuse(DcpProblem::Metadata {
                    at,
                    expected: "one offset per axis of the entry",
                    found: format!("{offsets:?} for shape {sizes:?}"),
                }));
            }
            let index = *numbers.entry(name.to_string()).or_insert_with(|| {
                tensors.push(metadata::TensorMeta {
                    name: name.to_string(),
                    dtype,
                    size: vec![0; sizes.len()],
                    chunks: Vec::new(),
                });
                pieces.push(Vec::new());
                tensors.len() - 1
            });
            let tensor = &mut tensors[index];
            if tensor.dtype != dtype || tensor.size.len() != sizes.len() {
                return Err(refuse(DcpProblem::Chunks {
                    name: name.to_string(),
                    problem: format!(
                        "disagree: {} of {} axes in one file, {dtype} of {} axes in `{file_name}`",
                        tensor.dtype,
                        tensor.size.len(),
                        sizes.len()
                    ),
                }));
            }
            for ((size, &offset), &len) in tensor.size.iter_mut().zip(&offsets).zip(&sizes) {
                *size = (*size).max(offset.saturating_add(len));
            }
            tensor.chunks.push((offsets.clone(), sizes.clone()));
            pieces[index].push(Piece {
                offsets,
                sizes,
                file: number,
                stored: Stored::SafeTensors { name: name.to_string() },
            });
        }
        let size = std::fs::metadata(&path).map_err(Error::io("read", &path))?.len();
        let file = ItemFile::new(file_name.clone(), path, size)?;
        *file.safetensors.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(archive);
        files.push(file);
    }
    if tensors.len() > metadata::MAX_ENTRIES {
        return Err(refuse(DcpProblem::Limit { what: "entries", found: tensors.len(), max: metadata::MAX_ENTRIES }));
    }
    let mut entries = Vec::with_capacity(tensors.len());
    for (tensor, pieces) in tensors.iter().zip(pieces) {
        check_chunks(tensor).map_err(refuse)?;
        entries.push(Entry { name: tensor.name.clone(), dtype: tensor.dtype, shape: tensor.size.clone(), pieces });
    }
    let checkpoint = Arc::new(Checkpoint { folder: dir.to_path_buf(), files, entries });
    let mut archive = Archive::named(dir, BTreeMap::new());
    for (at, entry) in checkpoint.entries.iter().enumerate() {
        archive.push(entry.name.clone(), checkpoint.clone(), at);
    }
    Ok(archive)
}

/// Whether the file at `path` is a SafeTensors file (DCP's SafeTensors serialization writes
/// each rank's chunks as one) rather than a run of `torch.save` zips: its first eight bytes are
/// a header length and the header starts with `{`.
fn safetensors_file(path: &Path) -> Result<bool> {
    use std::io::Read;
    let mut head = [0u8; 9];
    let mut file = File::open(path).map_err(Error::io("open", path))?;
    let read = file.read(&mut head).map_err(Error::io("read", path))?;
    Ok(read == head.len() && head[8] == b'{' && &head[..4] != b"PK\x03\x04")
}

/// The optimizer state of a training checkpoint under nnx's optimizer paths: torch's
/// `optim.state.PARAM.exp_avg` and `.exp_avg_sq` (Adam's moments, as DCP flattens an optimizer's
/// state dict) become `mu.PARAM` and `nu.PARAM`, and any other state `NAME.PARAM`
/// (`step.PARAM`, `momentum_buffer.PARAM`), so that they load into an optimizer state whose
/// structure nests the model's. Entries outside `optim.state.` are left out: the model's are
/// [`Archive::select`]`("model")`'s (or the checkpoint's own prefix).
///
/// ```
/// use nnx_core::Tensor;
/// use nnx_io::Archive;
///
/// let mut checkpoint = Archive::new();
/// checkpoint.insert("model.l1.w", Tensor::from_vec(vec![1.0f32, 2.0], &[2])?);
/// checkpoint.insert("optim.state.model.l1.w.exp_avg", Tensor::from_vec(vec![0.1f32, 0.2], &[2])?);
/// checkpoint.insert("optim.state.model.l1.w.exp_avg_sq", Tensor::from_vec(vec![0.01f32, 0.04], &[2])?);
/// let state = nnx_io::dcp::optimizer_state(&checkpoint)?;
/// assert_eq!(state.names().collect::<Vec<_>>(), ["mu.model.l1.w", "nu.model.l1.w"]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Errors
/// [`Error::Duplicate`] when two entries map to one path.
pub fn optimizer_state(checkpoint: &Archive) -> Result<Archive> {
    checkpoint.renamed(|name| {
        let rest = name.strip_prefix("optim.state.")?;
        let (param, state) = rest.rsplit_once('.')?;
        Some(match state {
            "exp_avg" => format!("mu.{param}"),
            "exp_avg_sq" => format!("nu.{param}"),
            other => format!("{other}.{param}"),
        })
    })
}

/// Checks that the chunks of `tensor` lie inside it, have its rank, and cover it exactly once.
fn check_chunks(tensor: &metadata::TensorMeta) -> std::result::Result<(), DcpProblem> {
    let name = &tensor.name;
    let bad = |problem: String| DcpProblem::Chunks { name: name.clone(), problem };
    let total: u128 = tensor.size.iter().map(|&n| n as u128).product();
    let mut covered: u128 = 0;
    for (offsets, sizes) in &tensor.chunks {
        if offsets.len() != tensor.size.len() || sizes.len() != tensor.size.len() {
            return Err(bad(format!(
                "include one at {offsets:?} of size {sizes:?}, not of the tensor's {} axes",
                tensor.size.len()
            )));
        }
        if offsets.iter().zip(sizes).zip(&tensor.size).any(|((&o, &s), &n)| o.checked_add(s).is_none_or(|end| end > n))
        {
            return Err(bad(format!(
                "include one at {offsets:?} of size {sizes:?}, outside the tensor's {:?}",
                tensor.size
            )));
        }
        covered += sizes.iter().map(|&n| n as u128).product::<u128>();
    }
    if total == 0 {
        return Ok(());
    }
    // Chunks sorted along the first axis, each compared with those that start before it ends.
    let mut order: Vec<usize> =
        (0..tensor.chunks.len()).filter(|&i| tensor.chunks[i].1.iter().all(|&n| n > 0)).collect();
    let first = |i: usize| tensor.chunks[i].0.first().copied().unwrap_or(0);
    let end = |i: usize| first(i) + tensor.chunks[i].1.first().copied().unwrap_or(1);
    order.sort_by_key(|&i| first(i));
    for (k, &a) in order.iter().enumerate() {
        for &b in order[k + 1..].iter().take_while(|&&b| first(b) < end(a)) {
            let (oa, sa) = &tensor.chunks[a];
            let (ob, sb) = &tensor.chunks[b];
            let overlap = oa.iter().zip(sa).zip(ob.iter().zip(sb)).all(|((&x, &m), (&y, &n))| x < y + n && y < x + m);
            if overlap {
                return Err(bad(format!("overlap: one at {oa:?} of size {sa:?} and one at {ob:?} of size {sb:?}")));
            }
        }
    }
    if covered != total {
        return Err(bad(format!(
            "cover {covered} of its {total} elements (shape {:?}): some of it was never saved",
            tensor.size
        )));
    }
    Ok(())
}

impl Checkpoint {
    fn mapping(&self, number: usize) -> Result<Arc<Mapping>> {
        let file = &self.files[number];
        let mut slot = file.mapping.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(mapping) = &*slot {
            return Ok(mapping.clone());
        }
        let opened = File::open(&file.path).map_err(Error::io("open", &file.path))?;
        let mapping = Arc::new(Mapping::new(&opened, &file.path)?);
        if (mapping.bytes().len() as u64) < file.size {
            return Err(Error::Dcp {
                path: self.folder.clone(),
                problem: DcpProblem::File {
                    file: file.name.clone(),
                    problem: "changed since the checkpoint was opened",
                },
            });
        }
        *slot = Some(mapping.clone());
        Ok(mapping)
    }

    /// What the item of `piece` holds.
    fn item(&self, name: &str, piece: &Piece) -> Result<Item> {
        let file = &self.files[piece.file];
        let (start, len) = match &piece.stored {
            Stored::Torch { start, len } => (*start, *len),
            Stored::SafeTensors { name } => {
                return file.with_safetensors(|archive| archive.try_get(name)).map(|tensor| Item::Tensor(tensor, 0));
            }
        };
        let mapping = self.mapping(piece.file)?;
        read_item(&mapping, &file.path, start, len, name).map_err(|error| match error {
            Error::Torch { problem, .. } => Error::Dcp {
                path: self.folder.clone(),
                problem: DcpProblem::Item {
                    name: name.to_string(),
                    file: file.name.clone(),
                    offset: start as u64,
                    problem: Box::new(problem),
                },
            },
            other => other,
        })
    }

    /// The chunk of `piece`, checked against what `.metadata` says of it.
    fn chunk(&self, entry: &Entry, piece: &Piece) -> Result<Tensor> {
        let tensor = match self.item(&entry.name, piece)? {
            Item::Tensor(tensor, _) => tensor,
            Item::Values(_) => {
                return Err(self.wrong_chunk(entry, piece, "a value that is not a tensor".into()));
            }
        };
        if tensor.dtype() != entry.dtype || tensor.shape() != piece.sizes {
            let found = format!("{} {:?}", tensor.dtype(), tensor.shape());
            return Err(self.wrong_chunk(entry, piece, found));
        }
        Ok(tensor)
    }

    fn wrong_chunk(&self, entry: &Entry, piece: &Piece, found: String) -> Error {
        Error::Dcp {
            path: self.folder.clone(),
            problem: DcpProblem::ItemTensor {
                name: entry.name.clone(),
                offsets: piece.offsets.clone(),
                expected: format!("{} {:?}", entry.dtype, piece.sizes),
                found,
            },
        }
    }

    /// Box `boxed` of entry `at`, read from the chunks it meets only (a rank's slice reads that
    /// rank's bytes): a view of the chunk where one holds the whole box, else the parts of each
    /// chunk copied into place.
    fn assemble_box(&self, at: usize, boxed: &[(usize, usize)]) -> Result<Tensor> {
        let entry = &self.entries[at];
        let data_error =
            |error| Error::Data { path: self.folder.clone(), name: entry.name.clone(), source: Box::new(error) };
        // Each chunk the box meets, and the part of the box it holds.
        let mut parts = Vec::new();
        for piece in &entry.pieces {
            let meet: Option<Vec<(usize, usize)>> = boxed
                .iter()
                .zip(piece.offsets.iter().zip(&piece.sizes))
                .map(|(&(start, len), (&offset, &size))| {
                    let (from, to) = (start.max(offset), (start + len).min(offset + size));
                    (from < to).then_some((from, to - from))
                })
                .collect();
            if let Some(meet) = meet {
                parts.push((piece, meet));
            }
        }
        let narrowed = |piece: &Piece, meet: &[(usize, usize)]| -> Result<Tensor> {
            let mut chunk = self.chunk(entry, piece)?;
            for (axis, (&(from, len), &offset)) in meet.iter().zip(&piece.offsets).enumerate() {
                if chunk.shape()[axis] != len {
                    chunk = chunk.narrow(axis, from - offset, len).map_err(data_error)?;
                }
            }
            Ok(chunk)
        };
        let shape: Vec<usize> = boxed.iter().map(|&(_, len)| len).collect();
        if let [(piece, meet)] = &parts[..]
            && meet.as_slice() == boxed
        {
            return narrowed(piece, meet);
        }
        let element = entry.dtype.size_in_bytes().expect("torch dtypes are whole bytes");
        let mut pieces = Vec::with_capacity(parts.len());
        for (piece, meet) in &parts {
            let part = narrowed(piece, meet)?;
            let bytes = part.to_bytes().map_err(data_error)?.into_owned();
            let placed = Piece {
                offsets: meet.iter().zip(boxed).map(|(&(from, _), &(start, _))| from - start).collect(),
                sizes: meet.iter().map(|&(_, len)| len).collect(),
                file: piece.file,
                stored: piece.stored.clone(),
            };
            pieces.push((placed, bytes));
        }
        Tensor::filled(entry.dtype, &shape, |out| {
            for (placed, bytes) in &pieces {
                place(out, &shape, placed, bytes, element);
            }
            Ok(())
        })
        .map_err(data_error)
    }

    /// Entry `at`: the chunk itself where one covers it, else its chunks copied into place.
    fn assemble(&self, at: usize) -> Result<Tensor> {
        let entry = &self.entries[at];
        if let [piece] = &entry.pieces[..]
            && piece.sizes == entry.shape
        {
            return self.chunk(entry, piece);
        }
        let chunks = entry.pieces.iter().map(|piece| self.chunk(entry, piece)).collect::<Result<Vec<_>>>()?;
        let element = entry.dtype.size_in_bytes().expect("torch dtypes are whole bytes");
        let mut failed = None;
        let made = Tensor::filled(entry.dtype, &entry.shape, |out| {
            for (piece, chunk) in entry.pieces.iter().zip(&chunks) {
                match chunk.to_bytes() {
                    Ok(bytes) => place(out, &entry.shape, piece, &bytes, element),
                    Err(error) => {
                        failed = Some(error);
                        break;
                    }
                }
            }
            Ok(())
        })
        .map_err(|error| Error::Data {
            path: self.folder.clone(),
            name: entry.name.clone(),
            source: Box::new(error),
        })?;
        if let Some(error) = failed {
            return Err(Error::Data { path: self.folder.clone(), name: entry.name.clone(), source: Box::new(error) });
        }
        Ok(made)
    }
}

/// Copies the row-major `bytes` of `piece` into its place in `out`, a row-major tensor of
/// `shape`, one run of the last axis at a time.
fn place(out: &mut [u8], shape: &[usize], piece: &Piece, bytes: &[u8], element: usize) {
    let rank = shape.len();
    if rank == 0 {
        out.copy_from_slice(bytes);
        return;
    }
    let run = piece.sizes[rank - 1] * element;
    if run == 0 {
        return;
    }
    let mut strides = vec![element; rank];
    for axis in (0..rank - 1).rev() {
        strides[axis] = strides[axis + 1] * shape[axis + 1];
    }
    let mut index = vec![0usize; rank - 1];
    for source in bytes.chunks_exact(run) {
        let target: usize = (0..rank).map(|axis| piece.offsets[axis] * strides[axis]).sum::<usize>()
            + index.iter().zip(&strides).map(|(&i, &stride)| i * stride).sum::<usize>();
        out[target..target + run].copy_from_slice(source);
        for axis in (0..rank - 1).rev() {
            index[axis] += 1;
            if index[axis] < piece.sizes[axis] {
                break;
            }
            index[axis] = 0;
        }
    }
}

impl Source for Checkpoint {
    fn spec(&self, at: usize) -> (DType, &[usize]) {
        (self.entries[at].dtype, &self.entries[at].shape)
    }

    fn tensor(&self, at: usize) -> Result<Tensor> {
        self.assemble(at)
    }

    fn tensor_box(&self, at: usize, boxed: Option<&[(usize, usize)]>) -> Result<Tensor> {
        match boxed {
            Some(boxed) if boxed.iter().zip(&self.entries[at].shape).any(|(&cut, &len)| cut != (0, len)) => {
                self.assemble_box(at, boxed)
            }
            _ => self.assemble(at),
        }
    }

    fn path(&self) -> Option<&Path> {
        Some(&self.folder)
    }

    fn location(&self, _at: usize) -> Option<EntryLocation> {
        None
    }

    fn stored_bytes(&self, at: usize) -> usize {
        let entry = &self.entries[at];
        entry.shape.iter().product::<usize>() * entry.dtype.size_in_bytes().unwrap_or(1)
    }

    fn made_when_read(&self, _at: usize) -> bool {
        true
    }

    fn data(&self, at: usize) -> std::result::Result<Cow<'_, [u8]>, DataError> {
        crate::source::made_data(self.tensor(at))
    }

    fn stored_pieces(&self, at: usize) -> Result<Vec<crate::plan::StoredPiece>> {
        use crate::plan::{PieceLayout, StoredPiece};
        let entry = &self.entries[at];
        let element = entry.dtype.size_in_bytes().expect("torch dtypes are whole bytes");
        let mut pieces = Vec::with_capacity(entry.pieces.len());
        for piece in &entry.pieces {
            let file = &self.files[piece.file];
            let layout = match &piece.stored {
                Stored::Torch { start, len } => match self.item(&entry.name, piece)? {
                    // A chunk saved row-major is read by rows; one saved in another order
                    // (a transposed local tensor) is read whole.
                    Item::Tensor(tensor, storage) if tensor.is_contiguous() => {
                        PieceLayout::RowMajor { start: (storage + tensor.offset() * element) as u64, element }
                    }
                    // The span of its storage that it covers.
                    Item::Tensor(tensor, storage) => {
                        let last: usize = tensor
                            .shape()
                            .iter()
                            .zip(tensor.strides())
                            .map(|(&n, &stride)| n.saturating_sub(1) * stride)
                            .sum();
                        let span = if tensor.is_empty() { 0 } else { last + 1 };
                        PieceLayout::Whole {
                            start: (storage + tensor.offset() * element) as u64,
                            len: (span * element) as u64,
                        }
                    }
                    Item::Values(_) => PieceLayout::Whole { start: *start as u64, len: *len as u64 },
                },
                Stored::SafeTensors { name } => {
                    let location = file.with_safetensors(|archive| archive.info(name))?.location;
                    let start = location.map_or(0, |location| location.file_offset as u64);
                    PieceLayout::RowMajor { start, element }
                }
            };
            pieces.push(StoredPiece {
                file: file.path.clone(),
                offsets: piece.offsets.clone(),
                sizes: piece.sizes.clone(),
                layout,
            });
        }
        Ok(pieces)
    }

    fn release(&self, at: usize) {
        for piece in &self.entries[at].pieces {
            let file = &self.files[piece.file];
            match &piece.stored {
                Stored::Torch { start, len } => {
                    let slot = file.mapping.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                    if let Some(mapping) = &*slot {
                        mapping.release(*start, *len);
                    }
                }
                Stored::SafeTensors { name } => {
                    let slot = file.safetensors.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                    if let Some(archive) = &*slot {
                        archive.release(name);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use nnx_core::DType;
    use nnx_core::error::DcpProblem;

    use super::check_chunks;
    use super::metadata::TensorMeta;

    fn tensor(size: &[usize], chunks: &[(&[usize], &[usize])]) -> TensorMeta {
        TensorMeta {
            name: "w".into(),
            dtype: DType::F32,
            size: size.to_vec(),
            chunks: chunks.iter().map(|(offsets, sizes)| (offsets.to_vec(), sizes.to_vec())).collect(),
        }
    }

    fn problem(tensor: &TensorMeta) -> String {
        match check_chunks(tensor) {
            Err(DcpProblem::Chunks { problem, .. }) => problem,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn chunks_must_cover_their_tensor_exactly_once() {
        // Row pieces, uneven and one empty, and 2-D blocks tile their tensors.
        check_chunks(&tensor(&[5], &[(&[0], &[2]), (&[2], &[2]), (&[4], &[1]), (&[5], &[0])])).unwrap();
        check_chunks(&tensor(
            &[4, 4],
            &[(&[0, 0], &[2, 2]), (&[0, 2], &[2, 2]), (&[2, 0], &[2, 2]), (&[2, 2], &[2, 2])],
        ))
        .unwrap();
        check_chunks(&tensor(&[], &[(&[], &[])])).unwrap();
        // Overlapping blocks, a gap, a piece past the end, a piece of another rank.
        let overlap = problem(&tensor(&[4, 4], &[(&[0, 0], &[3, 4]), (&[2, 0], &[2, 4])]));
        assert!(overlap.contains("overlap"), "{overlap}");
        let gap = problem(&tensor(&[4, 4], &[(&[0, 0], &[2, 4])]));
        assert!(gap.contains("cover 8 of its 16 elements"), "{gap}");
        let outside = problem(&tensor(&[4], &[(&[2], &[3])]));
        assert!(outside.contains("outside"), "{outside}");
        let rank = problem(&tensor(&[4, 4], &[(&[0], &[4])]));
        assert!(rank.contains("axes"), "{rank}");
    }
}
