//! `Archive`: named tensors over the sources every format registers (files mapped, not read;
//! shards opened on first use; files in stores fetched when used; modules in memory), with
//! strict prefix-scoped loading that validates everything before reading a byte. Which format
//! a path holds is `format.rs`'s answer; each format's constructors live in its own module.

use std::any::Any;
use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use nnx_core::__private::{compare_specs, for_each_entry, for_each_entry_mut, join, suggest, under_prefix};
use nnx_core::error::{Problem, ProblemKind};
use nnx_core::{DType, FlatStateDict, LoadAction, LoadError, Module, Tensor, TensorSpec, module_specs};

use crate::error::{Error, Result, UnsavableProblem};
use crate::format;
use crate::source::{self, DataError, Source, Store};

/// An entry to read, whole or a box of it: one `(start, len)` per stored axis.
pub(crate) type Want<'a> = (&'a str, Option<Vec<(usize, usize)>>);

/// Where an entry's data is: the store that holds it and the entry's number there.
#[derive(Clone)]
pub(crate) struct Slot {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) at: usize,
}

/// An entry found in an archive, ready to read: its source and its number there.
type Located<'a> = (&'a dyn Source, usize);

/// The file an entry lies in, for errors about its data; `origin` (the archive's name,
/// quoted) for tensors held in memory, such as those of a PyTorch checkpoint.
fn data_path(source: &dyn Source, origin: &str) -> PathBuf {
    source.path().map_or_else(|| PathBuf::from(origin.trim_matches('`')), Path::to_path_buf)
}

/// Where an entry's bytes lie in a file, for listings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EntryLocation {
    /// The file.
    pub path: PathBuf,
    /// Byte offsets `[begin, end)` relative to the data section.
    pub data_offsets: (usize, usize),
    /// Offset of the first byte in the file.
    pub file_offset: usize,
}

/// What an archive says about one entry without reading it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EntryInfo {
    /// Full name.
    pub name: String,
    /// Element type.
    pub dtype: DType,
    /// Shape.
    pub shape: Vec<usize>,
    /// Stored bytes.
    pub bytes: usize,
    /// Where the bytes are, for entries backed by a file.
    pub location: Option<EntryLocation>,
}

/// A set of named tensors, stored in a SafeTensors file, a sharded checkpoint, or memory.
///
/// Opening maps files and reads only headers: entries aligned for their dtype become tensors
/// over the mapped pages ([`Tensor::is_mapped`]) with nothing copied; the others are copied on
/// first use. Names are listed in the order of the header (walk order for files nnx wrote).
///
/// ```
/// use nnx_core::nn::{Init, Linear};
/// use nnx_io::Archive;
///
/// let dir = std::env::temp_dir().join(format!("nnx-doc-archive-{}", std::process::id()));
/// std::fs::create_dir_all(&dir)?;
/// let path = dir.join("layer.safetensors");
/// let layer = Linear::builder(3, 2).init(Init::Seeded(0)).build();
/// Archive::from_module(&layer, "head").save(&path)?;
///
/// let mut restored = Linear::builder(3, 2).init(Init::Meta).build();
/// let archive = Archive::open(&path)?;
/// archive.load_into(&mut restored, "head")?;
/// assert!(restored.weight.is_mapped());
/// assert_eq!(restored.weight.to_vec::<f32>()?, layer.weight.to_vec::<f32>()?);
/// # std::fs::remove_dir_all(&dir)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Default)]
pub struct Archive {
    names: Vec<String>,
    pub(crate) slots: HashMap<String, Slot>,
    metadata: BTreeMap<String, String>,
    origin: String,
    /// The metadata in the format's own types, for formats whose values are typed (those of a
    /// GGUF file), which the format's module reads back.
    typed_metadata: Option<Arc<dyn Any + Send + Sync>>,
}

impl fmt::Debug for Archive {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Archive").field("origin", &self.origin).field("entries", &self.names.len()).finish()
    }
}

impl Archive {
    /// An empty archive.
    pub fn new() -> Archive {
        Archive { origin: "the archive".into(), ..Archive::default() }
    }

    /// Opens a `.safetensors` file, a PyTorch checkpoint (`.bin`, `.pt`, `.pth`), a shard index
    /// (`*.index.json`) or a folder holding one of them (`model.safetensors.index.json`, then
    /// `model.safetensors`, then `pytorch_model.bin.index.json`, then `pytorch_model.bin`, then
    /// any single SafeTensors index, then every `*.safetensors` file as a union, then its GGUF
    /// file), or a GGUF file (with every shard of a split one, `NAME-00001-of-00003.gguf`).
    /// With the `remote` feature, a URL (`s3://`, `gs://`, `az://`, `http(s)://`, `hf://`) is
    /// read where it is, with range requests and the default remote options.
    ///
    /// PyTorch checkpoints (the zip format, the legacy format before PyTorch 1.6, or a bare
    /// pickle) are read without executing anything: a restricted unpickler knows the few
    /// globals a state dict needs and refuses every other one by name. Their tensors are views
    /// of the mapped file, with storage offsets and strides kept and shared storages shared.
    /// Nested checkpoints name tensors by dict path (`model.encoder.fc1.weight`) and give their
    /// plain values (integers, floats, strings, booleans) as [`Archive::metadata`]. Any file not
    /// named `.safetensors` that starts as a zip or a pickle is read as a checkpoint.
    ///
    /// In a folder, only these names are read: the temporary files of a save in progress or
    /// interrupted (`.NAME.tmp-...`) never are, and shard files (`STEM-00001-of-00003...`) are
    /// read only through an index that names them, so shards left by an interrupted save are
    /// never taken for a checkpoint.
    ///
    /// Files are mapped, not read: opening costs a header parse. A shard is opened only when
    /// one of its entries is needed. Mapped files must not be changed in place by another
    /// program while tensors from them are alive (nnx itself never does: saves write a new
    /// file and rename it).
    ///
    /// # Errors
    /// [`Error::Io`] when the path cannot be opened, [`Error::NotSafeTensors`] for other formats
    /// (saying what the file looks like), [`Error::Header`] for a header that breaks the
    /// specification, [`Error::Index`] for an unusable index, [`Error::Torch`] for a PyTorch
    /// checkpoint that cannot be read or that names a global other than those of a state dict,
    /// [`Error::EmptyFolder`].
    pub fn open(path: impl AsRef<Path>) -> Result<Archive> {
        format::open(path.as_ref())
    }

    /// An archive named after `path` (an index, say), with `metadata` and no entries yet.
    pub(crate) fn named(path: &Path, metadata: BTreeMap<String, String>) -> Archive {
        Archive { origin: format!("`{}`", path.display()), metadata, ..Archive::default() }
    }

    /// Adds entry `name`, number `at` of `store`, after the others.
    pub(crate) fn push(&mut self, name: String, store: Arc<dyn Store>, at: usize) {
        self.names.push(name.clone());
        self.slots.insert(name, Slot { store, at });
    }

    /// Names the archive after `path` (a folder whose files it joins), for messages.
    pub(crate) fn set_origin(&mut self, path: &Path) {
        self.origin = format!("`{}`", path.display());
    }

    /// Sets the metadata of a format whose values are typed: `typed`, which
    /// [`Archive::typed_metadata`] gives back to the format's module, and its text form as
    /// [`Archive::metadata`].
    pub(crate) fn set_typed_metadata<T: Any + Send + Sync>(&mut self, text: BTreeMap<String, String>, typed: T) {
        self.metadata = text;
        self.typed_metadata = Some(Arc::new(typed));
    }

    /// The typed metadata set by [`Archive::set_typed_metadata`], when it is a `T`.
    pub(crate) fn typed_metadata<T: Any>(&self) -> Option<&T> {
        self.typed_metadata.as_deref()?.downcast_ref()
    }

    /// The tensors of `module`, named by their paths under `prefix` (`""` for none). Tensors
    /// are shared, not copied.
    pub fn from_module<M: Module + ?Sized>(module: &M, prefix: &str) -> Archive {
        let mut archive = Archive::new();
        for_each_entry(module, |entry, tensor| archive.insert(join(prefix, entry.name), tensor.clone()));
        archive
    }

    /// The tensors of a state dict, in its order.
    pub fn from_flat_state_dict(dict: &FlatStateDict) -> Archive {
        let mut archive = Archive::new();
        for (name, tensor) in dict.iter() {
            archive.insert(name, tensor.clone());
        }
        archive
    }

    /// Adds or replaces one entry.
    pub fn insert(&mut self, name: impl Into<String>, tensor: Tensor) {
        let name = name.into();
        if self.slots.insert(name.clone(), Slot { store: Arc::new(tensor), at: 0 }).is_none() {
            self.names.push(name);
        }
    }

    /// Adds entry `name` of `from` under the name `new`, read from where `from` reads it:
    /// nothing is read or copied, and [`Archive::release`] of it releases `from`'s pages.
    ///
    /// # Errors
    /// [`Error::NoEntry`] when `from` has no entry `name`.
    pub fn insert_entry(&mut self, new: impl Into<String>, from: &Archive, name: &str) -> Result<()> {
        let slot = from.slots.get(name).ok_or_else(|| from.no_entry(name))?.clone();
        let new = new.into();
        if self.slots.insert(new.clone(), slot).is_none() {
            self.names.push(new);
        }
        Ok(())
    }

    /// Adds entry `name` of `dtype` and `shape`, made by `make` from the entries `reads` of
    /// `from` only when it is read (a transposed or permuted copy, say), so that an archive of
    /// many such entries holds none of them until each is used; [`Archive::release`] of it
    /// releases the pages of `reads`.
    pub fn insert_derived(
        &mut self,
        name: impl Into<String>,
        (dtype, shape): (DType, Vec<usize>),
        from: &Archive,
        reads: Vec<String>,
        make: impl Fn(&Archive) -> Result<Tensor> + Send + Sync + 'static,
    ) {
        let name = name.into();
        let derived = Derived { from: from.clone(), reads, dtype, shape, make: Box::new(make), name: name.clone() };
        if self.slots.insert(name.clone(), Slot { store: Arc::new(derived), at: 0 }).is_none() {
            self.names.push(name);
        }
    }

    /// Sets one metadata value (saved in `__metadata__`).
    pub fn set_metadata(&mut self, key: impl Into<String>, value: impl Into<String>) {
        self.metadata.insert(key.into(), value.into());
    }

    /// Joins archives into one (for example a model file and a file of extra entries).
    ///
    /// # Errors
    /// [`Error::Duplicate`] when a name is in two of them; metadata keys keep the first value.
    pub fn union(archives: impl IntoIterator<Item = Archive>) -> Result<Archive> {
        let mut joined = Archive::new();
        let mut origins: HashMap<String, String> = HashMap::new();
        let mut described = Vec::new();
        for archive in archives {
            for name in &archive.names {
                if let Some(first) = origins.get(name) {
                    return Err(Error::Duplicate {
                        name: name.clone(),
                        first: first.clone(),
                        second: archive.origin.clone(),
                    });
                }
                origins.insert(name.clone(), archive.origin.clone());
                joined.names.push(name.clone());
                joined.slots.insert(name.clone(), archive.slots[name].clone());
            }
            for (key, value) in &archive.metadata {
                joined.metadata.entry(key.clone()).or_insert_with(|| value.clone());
            }
            described.push(archive.origin);
        }
        joined.origin = if described.is_empty() { "the archive".into() } else { described.join(" + ") };
        Ok(joined)
    }

    /// A view of the entries under new names: `rename` gives each entry's new name, or `None`
    /// to leave it out. Nothing is read or copied.
    ///
    /// # Errors
    /// [`Error::Duplicate`] when two entries get the same name.
    pub fn renamed(&self, rename: impl Fn(&str) -> Option<String>) -> Result<Archive> {
        let mut renamed = Archive {
            metadata: self.metadata.clone(),
            origin: self.origin.clone(),
            typed_metadata: self.typed_metadata.clone(),
            ..Archive::default()
        };
        for name in &self.names {
            let Some(new) = rename(name) else { continue };
            if renamed.slots.insert(new.clone(), self.slots[name].clone()).is_some() {
                return Err(Error::Duplicate { name: new, first: self.origin.clone(), second: self.origin.clone() });
            }
            renamed.names.push(new);
        }
        Ok(renamed)
    }

    /// The entries named `prefix` or `prefix.*`, names kept whole.
    pub fn select(&self, prefix: &str) -> Archive {
        let mut selected = Archive {
            metadata: self.metadata.clone(),
            origin: self.origin.clone(),
            typed_metadata: self.typed_metadata.clone(),
            ..Archive::default()
        };
        for name in self.names.iter().filter(|name| under_prefix(name, prefix).is_some()) {
            selected.names.push(name.clone());
            selected.slots.insert(name.clone(), self.slots[name].clone());
        }
        selected
    }

    /// Describes where the archive came from, for messages (a quoted path, or `the archive`).
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// The entry names, in order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.names.iter().map(String::as_str)
    }

    /// The number of entries.
    pub fn len(&self) -> usize {
        self.names.len()
    }

    /// Whether there are no entries.
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// Whether the archive has an entry `name`.
    pub fn contains(&self, name: &str) -> bool {
        self.slots.contains_key(name)
    }

    /// The `__metadata__` strings (for shard indexes, the index's `metadata`).
    pub fn metadata(&self) -> &BTreeMap<String, String> {
        &self.metadata
    }

    fn locate(&self, name: &str) -> Result<Option<Located<'_>>> {
        self.slots.get(name).map(|slot| slot.store.open(name, slot.at)).transpose()
    }

    /// Dtype and shape of entry `name` as the headers give them (block tensors of a GGUF file
    /// as the floats they decode to), `None` when there is no such entry.
    ///
    /// # Errors
    /// The error of opening the shard that holds it.
    pub fn entry_spec(&self, name: &str) -> Result<Option<(DType, Vec<usize>)>> {
        self.spec(name)
    }

    /// Dtype and shape of `name` from headers, `None` when there is no such entry.
    pub(crate) fn spec(&self, name: &str) -> Result<Option<(DType, Vec<usize>)>> {
        Ok(self.locate(name)?.map(|(source, at)| {
            let (dtype, shape) = source.spec(at);
            (dtype, shape.to_vec())
        }))
    }

    pub(crate) fn no_entry_error(&self, name: &str) -> Error {
        self.no_entry(name)
    }

    fn no_entry(&self, name: &str) -> Error {
        Error::NoEntry { origin: self.origin.clone(), name: name.to_string(), suggestion: suggest(name, self.names()) }
    }

    /// Entry `name`'s source and its number there.
    ///
    /// # Errors
    /// [`Error::NoEntry`] (with a did-you-mean suggestion), or the error of opening its shard.
    pub(crate) fn require(&self, name: &str) -> Result<Located<'_>> {
        self.locate(name)?.ok_or_else(|| self.no_entry(name))
    }

    /// Lets the kernel drop entry `name`'s pages from the process's resident memory, where it
    /// lies in a mapped file (they are read from the file again if used later): a writer done
    /// with an entry keeps resident memory at what it still reads. Nothing for entries held in
    /// memory, or names the archive lacks.
    pub fn release(&self, name: &str) {
        if let Ok(Some((source, at))) = self.locate(name) {
            source.release(at);
        }
    }

    /// Whether entry `name` is made when it is read (decoded, cast, assembled from the chunks
    /// of a distributed checkpoint) rather than a view of stored bytes; `false` for names it
    /// lacks. Checks that look at a tensor's layout skip such entries: making them is a copy.
    pub fn made_when_read(&self, name: &str) -> bool {
        self.locate(name).ok().flatten().is_some_and(|(source, at)| source.made_when_read(at))
    }

    /// How entry `name` is encoded where the archive decodes it when read (the weights of a
    /// checkpoint published quantized, see [`crate::published`]): `FP8 E4M3, a scale per
    /// 128x128 block`, `GPTQ 4-bit`; `None` for entries read as stored and names it lacks.
    pub fn encoding(&self, name: &str) -> Option<String> {
        let (source, at) = self.locate(name).ok()??;
        source.encoding(at)
    }

    /// Lists `names` in this order, each an entry it already has (`None`) or entry `at` of
    /// `store` (`Some(at)`).
    pub(crate) fn reorder(&mut self, names: Vec<(String, Option<usize>)>, store: &Arc<dyn Store>) -> Result<()> {
        self.names.clear();
        for (name, at) in names {
            if let Some(at) = at
                && self.slots.insert(name.clone(), Slot { store: store.clone(), at }).is_some()
            {
                return Err(Error::Duplicate { name, first: self.origin.clone(), second: self.origin.clone() });
            }
            self.names.push(name);
        }
        Ok(())
    }

    /// The entry `name` as stored: over the mapped file when possible. `None` when there is no
    /// such entry or it cannot be read; [`Archive::try_get`] says why.
    pub fn get(&self, name: &str) -> Option<Tensor> {
        self.try_get(name).ok()
    }

    /// The entry `name` as stored.
    ///
    /// # Errors
    /// [`Error::NoEntry`] (with a did-you-mean suggestion), or the error of opening its shard.
    pub fn try_get(&self, name: &str) -> Result<Tensor> {
        let (source, at) = self.require(name)?;
        source.tensor(at)
    }

    /// Dtype, shape, size and location of one entry, from headers only.
    ///
    /// # Errors
    /// As [`Archive::try_get`].
    pub fn info(&self, name: &str) -> Result<EntryInfo> {
        let (source, at) = self.require(name)?;
        let (dtype, shape) = source.spec(at);
        let (bytes, location) = (source.stored_bytes(at), source.location(at));
        Ok(EntryInfo { name: name.to_string(), dtype, shape: shape.to_vec(), bytes, location })
    }

    /// The entry `name`, which must have exactly `dtype` and `shape`.
    ///
    /// # Errors
    /// [`Error::NoEntry`], or [`Error::EntryMismatch`] saying what is stored.
    pub fn tensor(&self, name: &str, dtype: DType, shape: &[usize]) -> Result<Tensor> {
        let (source, at) = self.require(name)?;
        let (found_dtype, found_shape) = source.spec(at);
        if found_dtype != dtype || found_shape != shape {
            return Err(self.mismatch(name, dtype, shape, found_dtype, found_shape));
        }
        source.tensor(at)
    }

    /// The float entry `name` with `shape`, cast to `dtype` when stored in another float dtype
    /// (f16, bf16, f32, f64); never a reinterpretation of bytes.
    ///
    /// # Errors
    /// [`Error::NoEntry`], [`Error::EntryNotFloat`] for non-float entries or targets,
    /// [`Error::EntryMismatch`] for another shape, [`Error::Data`] when the cast would
    /// materialize a view past its expansion limit.
    pub fn float(&self, name: &str, dtype: DType, shape: &[usize]) -> Result<Tensor> {
        let (source, at) = self.require(name)?;
        let (found_dtype, found_shape) = source.spec(at);
        if !found_dtype.is_castable_float() || !dtype.is_castable_float() {
            let dtype = if found_dtype.is_castable_float() { dtype } else { found_dtype };
            return Err(Error::EntryNotFloat { origin: self.origin.clone(), name: name.to_string(), dtype });
        }
        if found_shape != shape {
            return Err(self.mismatch(name, dtype, shape, found_dtype, found_shape));
        }
        // A view of a file (a stride-0 one, say) may describe far more values than the file
        // stores: the cast refuses to materialize past its limit, and the error names the entry.
        source.tensor(at)?.to_dtype(dtype).map_err(|error| Error::Data {
            path: data_path(source, &self.origin),
            name: name.to_string(),
            source: Box::new(error),
        })
    }

    fn mismatch(&self, name: &str, dtype: DType, shape: &[usize], found_dtype: DType, found_shape: &[usize]) -> Error {
        Error::EntryMismatch {
            origin: self.origin.clone(),
            name: name.to_string(),
            expected_dtype: dtype,
            expected_shape: shape.to_vec(),
            found_dtype,
            found_shape: found_shape.to_vec(),
        }
    }

    /// Dtype and shape of every entry under `prefix`, from headers (opening the shards that
    /// hold them and no others).
    pub fn specs(&self, prefix: &str) -> Result<Vec<TensorSpec>> {
        let mut specs = Vec::new();
        for name in self.names.iter().filter(|name| under_prefix(name, prefix).is_some()) {
            let (source, at) = self.require(name)?;
            let (dtype, shape) = source.spec(at);
            specs.push(TensorSpec { name: name.clone(), dtype, shape: shape.to_vec() });
        }
        Ok(specs)
    }

    /// Every entry as a flat state dict (tensors over the mapped file where possible).
    ///
    /// # Errors
    /// The error of opening a shard, or of reading invalid BOOL data.
    pub fn to_flat_state_dict(&self) -> Result<FlatStateDict> {
        self.names.iter().map(|name| Ok((name.clone(), self.try_get(name)?))).collect()
    }

    /// Loads `module` from the entries under `prefix` (`""` for all), strictly: every module
    /// tensor must be there with its exact dtype and shape, and every entry under the prefix
    /// must belong to the module. Entries outside the prefix are ignored.
    ///
    /// Everything is checked from headers before any tensor byte is read; on failure the
    /// module is unchanged and the error lists every problem with did-you-mean suggestions.
    /// Loaded tensors are views of the mapped file (copies only for unaligned entries).
    ///
    /// # Errors
    /// [`Error::Load`] with every problem, or the error of opening a shard.
    pub fn load_into<M: Module + ?Sized>(&self, module: &mut M, prefix: &str) -> Result<()> {
        // The common case first: every module tensor is there with its dtype and shape and the
        // prefix holds nothing else. Only when that fails are the full specs compared, to name
        // every problem.
        let mut names = Vec::new();
        let mut fits = true;
        for_each_entry(module, |entry, tensor| {
            let name = join(prefix, entry.name);
            fits = fits && matches!(self.spec_fits(&name, tensor.dtype(), tensor.shape()), Ok(true));
            names.push(name);
        });
        let owned = self.names.iter().filter(|name| under_prefix(name, prefix).is_some()).count();
        if !fits || owned != names.len() {
            let mut expected = module_specs(module);
            for spec in &mut expected {
                spec.name = join(prefix, &spec.name);
            }
            let mut problems = compare_specs(&expected, &self.specs(prefix)?, true);
            if owned == 0 && !prefix.is_empty() && !names.is_empty() {
                let kind =
                    ProblemKind::PrefixNotFound { prefix: prefix.to_string(), suggestion: self.prefix_of(module) };
                problems.insert(0, Problem::new("", kind));
            }
            if !problems.is_empty() {
                let source = self.origin.clone();
                return Err(LoadError {
                    action: LoadAction::Load,
                    source,
                    target: module.module_name().into(),
                    problems,
                }
                .into());
            }
        }
        let wants: Vec<Want<'_>> = names.iter().map(|name| (name.as_str(), None)).collect();
        let mut tensors = self.read_batch(&wants)?.into_iter();
        for_each_entry_mut(module, |_, tensor| {
            if let Some(loaded) = tensors.next() {
                *tensor = loaded;
            }
        });
        Ok(())
    }

    /// The prefix under which this archive holds the first of `module`'s names (`""` for none),
    /// if every other name is there too: what a load given another prefix meant.
    fn prefix_of<M: Module + ?Sized>(&self, module: &M) -> Option<String> {
        let mut first = None;
        for_each_entry(module, |entry, _| {
            if first.is_none() {
                first = Some(entry.name.to_string());
            }
        });
        let first = first?;
        let suffix = format!(".{first}");
        let candidates = self.names.iter().filter_map(|name| {
            if *name == first { Some(String::new()) } else { name.strip_suffix(&suffix).map(str::to_string) }
        });
        let mut found = None;
        // A few candidates are enough for a real file; a hostile one of many look-alike names
        // costs no more.
        for candidate in candidates.take(64) {
            let mut all = true;
            for_each_entry(module, |entry, _| all = all && self.contains(&join(&candidate, entry.name)));
            if all {
                found = Some(candidate);
                break;
            }
        }
        found
    }

    /// Reads entries at once, each whole or a box of it (see [`source::read_batch`]).
    ///
    /// # Errors
    /// [`Error::NoEntry`], the errors of opening a shard or of a transfer.
    pub(crate) fn read_batch(&self, wants: &[Want<'_>]) -> Result<Vec<Tensor>> {
        source::read_batch(wants, |name| self.require(name))
    }

    /// Whether `name` is stored with exactly `dtype` and `shape` (from headers).
    fn spec_fits(&self, name: &str, dtype: DType, shape: &[usize]) -> Result<bool> {
        Ok(self.locate(name)?.is_some_and(|(source, at)| source.spec(at) == (dtype, shape)))
    }

    /// Every entry in order with what a writer needs; meta tensors are refused here, before
    /// anything is written.
    pub(crate) fn write_items(&self) -> Result<Vec<WriteItem<'_>>> {
        let mut items = Vec::with_capacity(self.names.len());
        for name in &self.names {
            let (source, at) = self.require(name)?;
            if source.is_meta(at) {
                return Err(Error::Unsavable { name: name.clone(), problem: UnsavableProblem::Meta });
            }
            let (dtype, shape) = source.spec(at);
            let bytes = source.data_bytes(at);
            let path = data_path(source, &self.origin);
            items.push(WriteItem { name, dtype, shape: shape.to_vec(), bytes, source: (source, at), path });
        }
        Ok(items)
    }
}

/// One entry on its way into a file.
pub(crate) struct WriteItem<'a> {
    pub(crate) name: &'a str,
    pub(crate) dtype: DType,
    pub(crate) shape: Vec<usize>,
    pub(crate) bytes: usize,
    source: Located<'a>,
    /// The file the entry comes from, named when its data cannot be had.
    path: PathBuf,
}

impl<'a> WriteItem<'a> {
    /// Lets the kernel drop the entry's mapped pages once it is written (see
    /// [`Archive::release`]).
    pub(crate) fn release(&self) {
        let (source, at) = self.source;
        source.release(at);
    }

    /// The entry made when it is read, whose bytes are written from it; `None` for entries
    /// whose [`WriteItem::data`] is what is stored.
    pub(crate) fn made(&self) -> Option<Result<Tensor>> {
        let (source, at) = self.source;
        source.made(at)
    }

    /// The entry's packed bytes: borrowed from the mapping or a contiguous tensor.
    pub(crate) fn data(&self) -> Result<Cow<'a, [u8]>> {
        let (source, at) = self.source;
        source.data(at).map_err(|error| match error {
            DataError::Tensor(source) => {
                Error::Data { path: self.path.clone(), name: self.name.to_string(), source: Box::new(source) }
            }
            DataError::Io(error) => error,
        })
    }
}

/// How a derived entry is made from the archive it reads.
type Make = Box<dyn Fn(&Archive) -> Result<Tensor> + Send + Sync>;

/// An entry made from others when it is read ([`Archive::insert_derived`]).
struct Derived {
    from: Archive,
    reads: Vec<String>,
    dtype: DType,
    shape: Vec<usize>,
    make: Make,
    name: String,
}

impl Source for Derived {
    fn spec(&self, _: usize) -> (DType, &[usize]) {
        (self.dtype, &self.shape)
    }

    fn tensor(&self, _: usize) -> Result<Tensor> {
        let tensor = (self.make)(&self.from)?;
        if tensor.dtype() != self.dtype || tensor.shape() != self.shape {
            return Err(Error::EntryMismatch {
                origin: self.from.origin.clone(),
                name: self.name.clone(),
                expected_dtype: self.dtype,
                expected_shape: self.shape.clone(),
                found_dtype: tensor.dtype(),
                found_shape: tensor.shape().to_vec(),
            });
        }
        Ok(tensor)
    }

    fn path(&self) -> Option<&Path> {
        None
    }

    fn location(&self, _: usize) -> Option<EntryLocation> {
        None
    }

    fn stored_bytes(&self, _: usize) -> usize {
        self.reads.iter().filter_map(|name| self.from.info(name).ok()).map(|info| info.bytes).sum()
    }

    fn data_bytes(&self, _: usize) -> usize {
        let count: usize = self.shape.iter().product();
        count.saturating_mul(self.dtype.size_in_bytes().unwrap_or(1))
    }

    fn made_when_read(&self, _at: usize) -> bool {
        true
    }

    fn data(&self, at: usize) -> std::result::Result<Cow<'_, [u8]>, source::DataError> {
        source::made_data(self.tensor(at))
    }

    fn release(&self, _: usize) {
        for name in &self.reads {
            self.from.release(name);
        }
    }

    fn encoding(&self, _: usize) -> Option<String> {
        self.reads.first().and_then(|name| self.from.encoding(name))
    }
}
