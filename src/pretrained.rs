//! `Pretrained`: a model saved as a pretrained folder (`config.json`, `model.safetensors` or its
//! shards, a `README.md` model card) and loaded from one, in nnx's own names or in the layout of
//! the checkpoints its import attributes describe. A save replaces the folder as a whole.

use std::collections::{HashMap, HashSet};
use std::fs;
use std::path::Path;

use nnx_io::fs::{TargetFolder, copy_synced, restore_folder, sync_folder, temporary_target, write_atomic};

use crate::error::ConfigProblem;
use crate::{
    Archive, DType, Error, ImportReport, Module, Result, SaveOptions, Tensor, for_each_entry, for_each_entry_mut,
};

/// The configuration file of a pretrained folder.
const CONFIG_FILE: &str = "config.json";
/// The model card of a pretrained folder.
const CARD_FILE: &str = "README.md";
/// The weights file of a pretrained folder (or the stem of its shards).
const WEIGHTS_FILE: &str = "model.safetensors";

/// Options of [`Pretrained::save_pretrained_with`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PretrainedOptions {
    /// Split the weights into shards of at most this many data bytes once they hold more
    /// (`model-00001-of-0000N.safetensors` and `model.safetensors.index.json`, as
    /// [`SaveOptions::max_shard_bytes`] writes them); weights that fit stay one
    /// `model.safetensors`. `None` (the default) never shards.
    pub max_shard_bytes: Option<u64>,
    /// Page-align the weights files ([`SaveOptions::page_align`]).
    pub page_align: bool,
}

/// A model that is saved as, and loaded from, a pretrained folder: `config.json` (its
/// configuration with `model_type`, `architectures` and `dtype`, as transformers writes it),
/// `model.safetensors` (or shards and `model.safetensors.index.json`) and a `README.md` model
/// card.
///
/// A model implements four items (the configuration type, [`Pretrained::config`],
/// [`Pretrained::build`] and the two names) and gets the rest:
///
/// - [`save_pretrained`](Pretrained::save_pretrained) writes the weights in the model's own
///   names (its state-dict paths; a `tie` that still holds is written once), and replaces the
///   folder atomically: a crash or a kill at any moment leaves the old folder or the new one.
///   Files of the old folder that the save neither writes nor makes stale (`tokenizer.json`,
///   vocabularies, other configurations) are carried into the new one.
/// - [`from_pretrained`](Pretrained::from_pretrained) reads `config.json`, builds the model in
///   the stored float dtype and loads the weights as views of the mapped files: strictly when
///   they are in the model's own names (what `save_pretrained` writes), else by
///   [importing](Archive::import_into) them through the model's import attributes, which is how
///   a folder written by transformers loads.
///
/// [`crate::models`]' GPT-2, Llama and BERT implement it. So can a model of your own:
///
/// ```
/// use nnx::nn::{Init, LayerNorm, Linear};
/// use nnx::{DType, Module, Pretrained};
///
/// #[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
/// struct ClassifierConfig {
///     width: usize,
///     classes: usize,
/// }
///
/// #[derive(Module)]
/// struct Classifier {
///     norm: LayerNorm,
///     head: Linear,
///     #[nnx(skip)]
///     config: ClassifierConfig,
/// }
///
/// impl Classifier {
///     fn new(config: &ClassifierConfig, dtype: DType, init: Init) -> Classifier {
///         Classifier {
///             norm: LayerNorm::builder(config.width).dtype(dtype).init(init.at("norm")).build(),
///             head: Linear::builder(config.width, config.classes).dtype(dtype).init(init.at("head")).build(),
///             config: config.clone(),
///         }
///     }
/// }
///
/// impl Pretrained for Classifier {
///     type Config = ClassifierConfig;
///     const MODEL_TYPE: &'static str = "classifier";
///     const ARCHITECTURE: &'static str = "Classifier";
///
///     fn config(&self) -> &ClassifierConfig {
///         &self.config
///     }
///
///     fn build(config: &ClassifierConfig, dtype: DType) -> nnx::Result<Classifier> {
///         Ok(Classifier::new(config, dtype, Init::Meta))
///     }
/// }
///
/// let dir = std::env::temp_dir().join(format!("nnx-doc-pretrained-{}", std::process::id()));
/// let config = ClassifierConfig { width: 8, classes: 3 };
/// let trained = Classifier::new(&config, DType::F32, Init::Seeded(7));
/// trained.save_pretrained(&dir)?;
///
/// let loaded = Classifier::from_pretrained(&dir)?;
/// assert_eq!(loaded.config, config);
/// assert!(loaded.head.weight.is_mapped()); // the weights are the file's pages
/// assert_eq!(loaded.head.weight.to_vec::<f32>()?, trained.head.weight.to_vec::<f32>()?);
/// let card = std::fs::read_to_string(dir.join("README.md"))?;
/// assert!(card.starts_with("---\nlibrary_name: nnx\n") && card.contains("parameters: 43\n"));
/// # std::fs::remove_dir_all(&dir)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub trait Pretrained: Module + Sized {
    /// The configuration, read from and written to `config.json`. It must serialize to a JSON
    /// object; fields it does not know are ignored when reading unless it keeps them (as the
    /// configurations of [`crate::models`] do, in a `#[serde(flatten)]` map).
    type Config: serde::Serialize + serde::de::DeserializeOwned;

    /// The `model_type` of `config.json` and the card's tag (`"gpt2"`).
    const MODEL_TYPE: &'static str;

    /// The entry of `architectures` in `config.json` and the card's architecture
    /// (`"GPT2LMHeadModel"`).
    const ARCHITECTURE: &'static str;

    /// The configuration the model was built from.
    fn config(&self) -> &Self::Config;

    /// The model of `config` with its tensors in `dtype` and no storage ([`Init::Meta`]): the
    /// weights are loaded into it next.
    ///
    /// [`Init::Meta`]: crate::nn::Init::Meta
    ///
    /// # Errors
    /// Whatever the model cannot be built from; the configurations of [`crate::models`] are
    /// checked before (see [`Pretrained::check_config`]) and never fail here.
    fn build(config: &Self::Config, dtype: DType) -> Result<Self>;

    /// Checks a configuration read from `path` before a model is built from it. The default
    /// accepts every configuration that parses.
    ///
    /// # Errors
    /// [`Error::ConfigField`] naming `path` and the field at fault.
    fn check_config(config: &Self::Config, path: &Path) -> Result<()> {
        let _ = (config, path);
        Ok(())
    }

    /// Saves the model as the pretrained folder `dir` (created when missing, replaced as a
    /// whole when present); see [`Pretrained::save_pretrained_with`].
    ///
    /// # Errors
    /// As [`Pretrained::save_pretrained_with`].
    fn save_pretrained(&self, dir: impl AsRef<Path>) -> Result<()> {
        self.save_pretrained_with(dir, &PretrainedOptions::default())
    }

    /// Saves the model as the pretrained folder `dir`: `config.json`, the weights in the model's
    /// own names (`model.safetensors`, or shards past [`PretrainedOptions::max_shard_bytes`])
    /// and a `README.md` model card.
    ///
    /// Everything is written into a new folder beside `dir` (`.NAME.pretrained-tmp-...`), put
    /// on disk, and then swapped with `dir` in one step (`renameat2` with `RENAME_EXCHANGE` on
    /// Linux); where the file system cannot exchange folders, `dir` is renamed aside
    /// (`.NAME.pretrained-old-...`) and the new folder renamed in, and the next
    /// `save_pretrained` or `from_pretrained` of `dir` puts a folder left aside by a crash back.
    /// Either way a crash or a kill leaves the complete old folder or the complete new one.
    ///
    /// Files of the old folder are carried into the new one (hard links, else copies), except
    /// what the save replaces: `config.json`, `README.md`, weights (`model*.safetensors`,
    /// `model*.safetensors.index.json`, `pytorch_model*.bin` and their index, `tf_model*.h5`,
    /// `flax_model*.msgpack`) and temporary files of interrupted saves. Tensors mapped from the
    /// old folder (a model loaded from `dir` and saved over it) keep their pages.
    ///
    /// One writer at a time is assumed per folder: a save removes the temporary folders that
    /// interrupted saves of `dir` left.
    ///
    /// # Errors
    /// Before anything is written: [`Error::Unsavable`] for meta tensors, [`Error::Config`]
    /// for a configuration that does not serialize to a JSON object, [`Error::Io`] when `dir`
    /// is a file or is (or holds) the working folder, which the removal of the old folder
    /// would take away. [`Error::Io`] when writing fails, in which case `dir` is left as it
    /// was.
    fn save_pretrained_with(&self, dir: impl AsRef<Path>, options: &PretrainedOptions) -> Result<()> {
        save(self, dir.as_ref(), options)
    }

    /// Loads the pretrained model `source`: the folder [`crate::hub::pretrained_folder`] finds
    /// for it, read by [`Pretrained::from_pretrained_folder`].
    ///
    /// # Errors
    /// The error of [`crate::hub::pretrained_folder`], or as
    /// [`Pretrained::from_pretrained_folder`].
    fn from_pretrained(source: impl AsRef<Path>) -> Result<Self> {
        let source = source.as_ref();
        // A local folder that a crashed save left aside is put back before it is looked for.
        restore_folder(source)?;
        let dir = crate::hub::pretrained_folder(source)?;
        Self::from_pretrained_folder(dir)
    }

    /// Loads the model from the pretrained folder `dir`: `config.json` is read and
    /// [checked](Pretrained::check_config), the model is [built](Pretrained::build) in the dtype
    /// of its first stored float weight (else the `dtype`/`torch_dtype` of `config.json`, else
    /// F32), and the weights (`model.safetensors`, shards with their index, or a PyTorch
    /// checkpoint; see [`Archive::open`]) are loaded as views of the mapped files: strictly
    /// ([`Archive::load_into`]) when they are in the model's own names, else imported through
    /// its import attributes ([`Archive::import_into`]).
    ///
    /// # Errors
    /// [`Error::Io`] naming `config.json` when it cannot be read, [`Error::Config`] when it is
    /// not the model's configuration, [`Error::ConfigField`] naming the file and the field
    /// that cannot make a model, [`Error::EmptyFolder`] naming `dir` when it holds no weights,
    /// [`Error::Load`] listing every weight that is missing, unexpected or of another shape,
    /// or the error of reading the weights files.
    fn from_pretrained_folder(dir: impl AsRef<Path>) -> Result<Self> {
        load(dir.as_ref())
    }

    /// Publishes the model as the Hub repository `repo` (`org/name`): creates it if needed,
    /// then commits what [`Pretrained::save_pretrained`] writes, in one commit on `main`,
    /// through `HF_ENDPOINT` with the token of `HF_TOKEN` or the token file.
    ///
    /// # Errors
    /// [`Error::Hub`] for a bad id, a missing or read-only token (it says to set `HF_TOKEN`) or
    /// the server's refusal; the errors of [`Pretrained::save_pretrained`].
    #[cfg(feature = "hub")]
    fn push_to_hub(&self, repo: &str) -> Result<crate::hub::CommitInfo> {
        push(self, repo)
    }
}

/// Saves into a fresh temporary folder and uploads it; the folder is removed either way.
#[cfg(feature = "hub")]
fn push<M: Pretrained>(model: &M, repo: &str) -> Result<crate::hub::CommitInfo> {
    use std::sync::atomic::{AtomicU64, Ordering};

    let id = crate::hub::RepoId::parse(repo)?;
    let hub = crate::hub::Hub::from_env()?;
    static PUSHES: AtomicU64 = AtomicU64::new(0);
    let staging = std::env::temp_dir().join(format!(
        "nnx-push-{}-{}-{}",
        std::process::id(),
        PUSHES.fetch_add(1, Ordering::Relaxed),
        id.folder_name()
    ));
    let outcome = model.save_pretrained(&staging).and_then(|()| {
        let message = format!("Upload {} with nnx", M::ARCHITECTURE);
        hub.upload_folder(&id, &staging, "main", &message)
    });
    let _ = fs::remove_dir_all(&staging);
    outcome
}

// Saving.

/// The weights a save writes: the model's tensors by their paths, a tied tensor left out while
/// it is still the tensor it is tied to.
struct Weights {
    archive: Archive,
    /// The elements written (tied tensors once).
    parameters: u64,
    /// The dtype of the first float tensor (else of the first tensor).
    dtype: Option<DType>,
    /// The bytes written.
    bytes: u64,
    /// The first tensor without storage, which cannot be saved.
    meta: Option<String>,
}

impl Weights {
    fn of<M: Module>(model: &M) -> Weights {
        let mut slots: Vec<(String, Option<String>, Tensor)> = Vec::new();
        for_each_entry(model, |slot, tensor| {
            slots.push((slot.name.to_string(), slot.tie.map(str::to_string), tensor.clone()));
        });
        let by_name: HashMap<&str, &Tensor> = slots.iter().map(|(name, _, tensor)| (name.as_str(), tensor)).collect();
        let mut weights = Weights { archive: Archive::new(), parameters: 0, dtype: None, bytes: 0, meta: None };
        let mut first = None;
        for (name, tie, tensor) in &slots {
            let tied = tie.as_deref().and_then(|target| by_name.get(target));
            if tied.is_some_and(|target| target.shares_storage(tensor)) {
                continue;
            }
            weights.parameters += tensor.len() as u64;
            weights.bytes += tensor.byte_len() as u64;
            if weights.dtype.is_none() && tensor.dtype().is_castable_float() {
                weights.dtype = Some(tensor.dtype());
            }
            first = first.or(Some(tensor.dtype()));
            if weights.meta.is_none() && tensor.is_meta() {
                weights.meta = Some(name.clone());
            }
            weights.archive.insert(name.clone(), tensor.clone());
        }
        weights.dtype = weights.dtype.or(first);
        weights
    }
}

fn save<M: Pretrained>(model: &M, dir: &Path, options: &PretrainedOptions) -> Result<()> {
    // Everything that can be refused without touching the disk is, first.
    let weights = Weights::of(model);
    if let Some(name) = weights.meta {
        return Err(Error::Unsavable { name, problem: crate::error::UnsavableProblem::Meta });
    }
    let config = config_json::<M>(model, weights.dtype, &dir.join(CONFIG_FILE))?;
    let card = model_card::<M>(weights.parameters, weights.dtype);
    let target = TargetFolder::resolve(dir)?;

    // Removed with what it holds on any error.
    let staged = target.stage()?;
    let sharded = options.max_shard_bytes.filter(|&limit| weights.bytes > limit);
    let save = SaveOptions { page_align: options.page_align, max_shard_bytes: sharded, ..SaveOptions::default() };
    weights.archive.save_with(staged.path().join(WEIGHTS_FILE), &save)?;
    write_atomic(staged.path().join(CONFIG_FILE), config.as_bytes())?;
    write_atomic(staged.path().join(CARD_FILE), card.as_bytes())?;
    if target.exists()? {
        carry(target.path(), staged.path(), true)?;
        // Last, so that a folder without write permission is written first.
        copy_permissions(target.path(), staged.path());
    }
    staged.commit()
}

/// `config.json`: the configuration's fields, then `model_type`, `architectures` and the dtype
/// under both names transformers has used (`dtype`, and `torch_dtype` before 4.56), sorted.
fn config_json<M: Pretrained>(model: &M, dtype: Option<DType>, path: &Path) -> Result<String> {
    let refuse = |message: String| Error::Config {
        path: path.to_path_buf(),
        problem: ConfigProblem::NotSerializableObject { message },
    };
    // Through text, so that f32 fields are written as the f32 they are (`1e-5`, not the
    // f64 nearest to it).
    let text = serde_json::to_string(model.config()).map_err(|error| refuse(error.to_string()))?;
    let value: serde_json::Value = serde_json::from_str(&text).map_err(|error| refuse(error.to_string()))?;
    let serde_json::Value::Object(mut fields) = value else {
        return Err(refuse(format!("it is written as `{}`", abbreviate(&text))));
    };
    fields.insert("model_type".into(), M::MODEL_TYPE.into());
    fields.insert("architectures".into(), vec![serde_json::Value::from(M::ARCHITECTURE)].into());
    if let Some(dtype) = dtype {
        fields.insert("dtype".into(), torch_name(dtype).into());
        fields.insert("torch_dtype".into(), torch_name(dtype).into());
    }
    let mut text = serde_json::to_string_pretty(&fields).map_err(|error| refuse(error.to_string()))?;
    text.push('\n');
    Ok(text)
}

/// The first 40 characters of `text`, for messages.
fn abbreviate(text: &str) -> String {
    match text.char_indices().nth(40) {
        Some((at, _)) => format!("{}...", &text[..at]),
        None => text.to_string(),
    }
}

/// The name PyTorch (and so transformers' `config.json`) gives `dtype`.
fn torch_name(dtype: DType) -> String {
    match dtype.numpy_name() {
        Some(name) => name.to_string(),
        None if dtype == DType::F4 => "float4_e2m1fn_x2".to_string(),
        None => dtype.as_str().to_ascii_lowercase(),
    }
}

/// The float dtype a `dtype`/`torch_dtype` value of `config.json` names (`"bfloat16"`,
/// `"torch.float16"`).
fn from_torch_name(name: &str) -> Option<DType> {
    match name.strip_prefix("torch.").unwrap_or(name) {
        "float32" | "float" => Some(DType::F32),
        "float16" | "half" => Some(DType::F16),
        "bfloat16" => Some(DType::BF16),
        "float64" | "double" => Some(DType::F64),
        _ => None,
    }
}

/// The model card: YAML front matter for the Hub, then what the model is and how to load it.
fn model_card<M: Pretrained>(parameters: u64, dtype: Option<DType>) -> String {
    let (model_type, architecture) = (yaml_scalar(M::MODEL_TYPE), yaml_scalar(M::ARCHITECTURE));
    let dtype_name = dtype.map_or_else(|| "none".to_string(), torch_name);
    let stored = dtype.map_or_else(String::new, |dtype| format!(" (`{dtype}` in SafeTensors)"));
    let loader = std::any::type_name::<M>();
    format!(
        "---\n\
         library_name: nnx\n\
         tags:\n\
         - nnx\n\
         - safetensors\n\
         - {model_type}\n\
         model_type: {model_type}\n\
         architecture: {architecture}\n\
         parameters: {parameters}\n\
         dtype: {dtype_name}\n\
         ---\n\
         \n\
         # {title}\n\
         \n\
         A `{arch}` model (`model_type` `{kind}`) with {grouped} parameters ({short}) in \
         {dtype_name}{stored}, saved by [nnx](https://github.com/nnx-rs/nnx). `config.json` holds \
         its configuration, `model.safetensors` (or its shards, listed by \
         `model.safetensors.index.json`) its weights, named by their paths in the model.\n\
         \n\
         ## Load it with nnx\n\
         \n\
         ```rust\n\
         use nnx::Pretrained;\n\
         \n\
         let model = {loader}::from_pretrained(\"path/to/this/folder\")?;\n\
         ```\n\
         \n\
         The weights are mapped, not read: the model's tensors are the file's pages.\n",
        title = M::ARCHITECTURE,
        arch = M::ARCHITECTURE,
        kind = M::MODEL_TYPE,
        grouped = grouped(parameters),
        short = short_count(parameters),
    )
}

/// `text` as a YAML scalar: as it is when plain, else double-quoted (a JSON string is a YAML
/// double-quoted scalar).
fn yaml_scalar(text: &str) -> String {
    let plain = text.chars().next().is_some_and(|first| first.is_ascii_alphabetic())
        && text.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
        && !matches!(text.to_ascii_lowercase().as_str(), "true" | "false" | "yes" | "no" | "on" | "off" | "null");
    if plain { text.to_string() } else { serde_json::Value::from(text).to_string() }
}

/// `1234567` as `1,234,567`.
fn grouped(count: u64) -> String {
    let digits = count.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (at, digit) in digits.chars().enumerate() {
        if at > 0 && (digits.len() - at).is_multiple_of(3) {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

/// `1234567` as `1.2M`.
fn short_count(count: u64) -> String {
    let units = [(1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")];
    let value = count as f64;
    match units.iter().find(|(scale, _)| value >= *scale) {
        Some((scale, unit)) => format!("{:.1}{unit}", value / scale),
        None => count.to_string(),
    }
}

/// Whether the file `name` at the top of a pretrained folder is one a save writes or makes
/// stale: the configuration, the card, weights in any format, temporary files of saves.
fn replaced_by_save(name: &str) -> bool {
    let weights = |stem: &str, ends: &[&str]| name.starts_with(stem) && ends.iter().any(|end| name.ends_with(end));
    matches!(name, CONFIG_FILE | CARD_FILE)
        || weights("model", &[".safetensors", ".safetensors.index.json"])
        || weights("pytorch_model", &[".bin", ".bin.index.json"])
        || weights("tf_model", &[".h5"])
        || weights("flax_model", &[".msgpack", ".msgpack.index.json"])
        || temporary_target(name).is_some()
}

/// Carries the files of the old folder `from` into the new folder `to` (hard links, else
/// copies), except those the save replaces (`top`: at the top of the folder) and those it
/// already wrote.
fn carry(from: &Path, to: &Path, top: bool) -> Result<()> {
    let listing =
        fs::read_dir(from).map_err(|source| Error::Io { action: "list", path: from.to_path_buf(), source })?;
    for item in listing {
        let item = item.map_err(|source| Error::Io { action: "list", path: from.to_path_buf(), source })?;
        let name = item.file_name();
        if top && name.to_str().is_some_and(replaced_by_save) {
            continue;
        }
        let (source, target) = (item.path(), to.join(&name));
        if fs::symlink_metadata(&target).is_ok() {
            continue;
        }
        let kind = item.file_type().map_err(|source| Error::Io { action: "inspect", path: item.path(), source })?;
        if kind.is_dir() {
            fs::create_dir(&target).map_err(|source| Error::Io { action: "create", path: target.clone(), source })?;
            carry(&source, &target, false)?;
            sync_folder(&target)?;
            copy_permissions(&source, &target);
        } else if fs::hard_link(&source, &target).is_err() && (kind.is_file() || kind.is_symlink()) {
            // Another file system, or one without hard links: a copy, put on disk.
            copy_synced(&source, &target)?;
        }
    }
    Ok(())
}

/// Gives the folder `to` the permissions of the folder `from`, where the system allows.
fn copy_permissions(from: &Path, to: &Path) {
    if let Ok(meta) = fs::metadata(from) {
        let _ = fs::set_permissions(to, meta.permissions());
    }
}

// Loading.

fn load<M: Pretrained>(dir: &Path) -> Result<M> {
    restore_folder(dir)?;
    let path = dir.join(CONFIG_FILE);
    let text = nnx_io::config::read_text(&path)?;
    let raw: serde_json::Value = serde_json::from_str(&text).map_err(|error| Error::Config {
        path: path.clone(),
        problem: ConfigProblem::NotJson { message: error.to_string() },
    })?;
    let config: M::Config = serde_json::from_str(&text).map_err(|error| Error::Config {
        path: path.clone(),
        problem: ConfigProblem::NotModelConfig { message: error.to_string() },
    })?;
    M::check_config(&config, &path)?;
    let archive = Archive::open(dir)?;
    let probe = M::build(&config, DType::F32)?;
    let own = in_model_names(&probe, &archive);
    let config_dtype = ["dtype", "torch_dtype"].iter().find_map(|key| raw.get(key)?.as_str().and_then(from_torch_name));
    let dtype = stored_dtype(&probe, &archive, own).or(config_dtype).unwrap_or(DType::F32);
    let mut model = if dtype == DType::F32 { probe } else { M::build(&config, dtype)? };
    load_layout(&archive, &mut model, own)?;
    Ok(model)
}

/// Loads `model` from `archive`, in the model's own names when the archive uses them (see
/// [`Pretrained::from_pretrained_folder`]), else through its import attributes. The report is
/// that of the import (empty for a load in the model's own names).
///
/// # Errors
/// [`Error::Load`] listing every problem, or the error of reading a shard.
#[cfg_attr(not(feature = "text"), allow(dead_code))]
pub(crate) fn load_weights<M: Module>(archive: &Archive, model: &mut M) -> Result<ImportReport> {
    let own = in_model_names(model, archive);
    load_layout(archive, model, own)
}

fn load_layout<M: Module>(archive: &Archive, model: &mut M, own: bool) -> Result<ImportReport> {
    if own {
        load_own(archive, model)?;
        Ok(ImportReport::default())
    } else {
        archive.import_into(model, "")
    }
}

/// Whether `archive` names the weights of `model` by the model's own paths rather than by the
/// sources of its import attributes: more of its own paths than of its sources are there (a
/// model without import attributes has the same for both, and is loaded by its own paths once
/// any of them is there).
fn in_model_names<M: Module>(model: &M, archive: &Archive) -> bool {
    let (mut own, mut source) = (0usize, 0usize);
    for_each_entry(model, |slot, _| {
        if slot.tie.is_none() {
            own += usize::from(archive.contains(slot.name));
            source += usize::from(archive.contains(slot.source));
        }
    });
    own > 0 && own >= source
}

/// The stored dtype of the first entry `model` reads, when it is a float that casts.
fn stored_dtype<M: Module>(model: &M, archive: &Archive, own: bool) -> Option<DType> {
    let mut names = Vec::new();
    for_each_entry(model, |slot, _| {
        if slot.tie.is_none() && slot.dtype.is_none() {
            names.push(if own { slot.name.to_string() } else { slot.source.to_string() });
        }
    });
    let dtype = names.iter().find_map(|name| archive.info(name).ok())?.dtype;
    dtype.is_castable_float().then_some(dtype)
}

/// A strict load in the model's own names, where a tied tensor that the archive does not hold
/// (a save writes it once, under the name it is tied to) is the tensor it is tied to.
fn load_own<M: Module>(archive: &Archive, model: &mut M) -> Result<()> {
    let mut ties: HashMap<String, String> = HashMap::new();
    for_each_entry(model, |slot, _| {
        if let Some(target) = slot.tie.filter(|_| !archive.contains(slot.name)) {
            ties.insert(slot.name.to_string(), target.to_string());
        }
    });
    if ties.is_empty() {
        return archive.load_into(model, "");
    }
    let mut complete = archive.clone();
    for (name, target) in &ties {
        if let Some(tensor) = archive.get(target) {
            complete.insert(name.clone(), tensor);
        }
    }
    complete.load_into(model, "")?;
    let targets: HashSet<&str> = ties.values().map(String::as_str).collect();
    let mut loaded: HashMap<String, Tensor> = HashMap::new();
    for_each_entry(model, |slot, tensor| {
        if targets.contains(slot.name) {
            loaded.insert(slot.name.to_string(), tensor.clone());
        }
    });
    for_each_entry_mut(model, |slot, tensor| {
        if let Some(shared) = ties.get(slot.name).and_then(|target| loaded.get(target)) {
            *tensor = shared.clone();
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_save_replaces_weights_and_keeps_the_other_files() {
        for stale in [
            "config.json",
            "README.md",
            "model.safetensors",
            "model-00001-of-00002.safetensors",
            "model.safetensors.index.json",
            "pytorch_model.bin",
            "pytorch_model-00001-of-00002.bin",
            "pytorch_model.bin.index.json",
            "tf_model.h5",
            "flax_model.msgpack",
            ".model.safetensors.tmp-1-2",
        ] {
            assert!(replaced_by_save(stale), "{stale}");
        }
        for kept in
            ["tokenizer.json", "vocab.txt", "generation_config.json", "modules.json", "adapter_model.safetensors"]
        {
            assert!(!replaced_by_save(kept), "{kept}");
        }
    }

    #[test]
    fn dtype_names_are_those_of_pytorch() {
        assert_eq!(torch_name(DType::BF16), "bfloat16");
        assert_eq!(torch_name(DType::F32), "float32");
        for dtype in [DType::F16, DType::BF16, DType::F32, DType::F64] {
            assert_eq!(from_torch_name(&torch_name(dtype)), Some(dtype));
        }
        assert_eq!(from_torch_name("torch.bfloat16"), Some(DType::BF16));
        assert_eq!(from_torch_name("auto"), None);
    }

    #[test]
    fn counts_read_well() {
        assert_eq!(grouped(0), "0");
        assert_eq!(grouped(999), "999");
        assert_eq!(grouped(1000), "1,000");
        assert_eq!(grouped(22_713_216), "22,713,216");
        assert_eq!(short_count(22_713_216), "22.7M");
        assert_eq!(short_count(512), "512");
        assert_eq!(yaml_scalar("gpt2"), "gpt2");
        assert_eq!(yaml_scalar("my model"), "\"my model\"");
        assert_eq!(yaml_scalar("yes"), "\"yes\"");
    }
}
