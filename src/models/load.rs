//! One loader for the model files people download: a GGUF file (llama.cpp's names, ggml
//! blocks kept packed), a transformers folder (safetensors, sharded or not) or an
//! mlx-community folder (MLX affine weights), local or `hf://`. The architecture comes from
//! `general.architecture` or `config.json`'s `model_type`, the weights kind from the files.

mod decoder;
mod device;
mod folder;

use std::path::{Path, PathBuf};

use decoder::{DecoderModel, LoadsOn};
#[cfg(feature = "gpu")]
use device::GpuTarget;
use device::{HostTarget, Target, ggml_summary};
use folder::{FolderConfig, Kind};

use super::CausalLm;
use super::family::{self, Network};
use super::gemma3::{Gemma3, Gemma3Config};
use super::gemma4::{Gemma4, Gemma4Config};
use super::gpt_oss::{GptOss, GptOssConfig};
use super::gpt2::{Gpt2, Gpt2Config};
use super::llama::{Llama, LlamaConfig};
use super::qwen::{Qwen, QwenConfig};
use super::qwen35::{Qwen35, Qwen35Config};
use crate::generate::{ChatTemplate, GenerationConfig, KvCache, Tokenizer};
use crate::{Archive, DType, Device, Error, Host, Module, Result, Tensor};

/// A model ready to run, with what running it needs from its files.
pub struct LoadedModel<D: Device = Host> {
    /// The model, on its device.
    pub model: Box<dyn CausalLm<Device = D>>,
    /// The family's name in [`super::family::FAMILIES`] (`llama`, `qwen3`, ...).
    pub architecture: String,
    /// How the weights are stored, in a few words (`bf16`, `ggml q8_0 (14), f32 (5)`).
    pub weights: String,
    /// The tokenizer of the files.
    pub tokenizer: Tokenizer,
    /// The chat template, when the files have one.
    pub chat_template: Option<ChatTemplate>,
    /// End-of-sequence ids and sampling defaults from the files.
    pub generation: GenerationConfig,
    /// The BOS the tokenizer adds in front of a text, if any.
    pub bos_token_id: Option<u32>,
}

impl<D: Device> std::fmt::Debug for LoadedModel<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedModel")
            .field("architecture", &self.architecture)
            .field("weights", &self.weights)
            .field("chat_template", &self.chat_template.is_some())
            .field("generation", &self.generation)
            .field("bos_token_id", &self.bos_token_id)
            .finish_non_exhaustive()
    }
}

impl<D: crate::Device> CausalLm for Box<dyn CausalLm<Device = D>> {
    type Device = D;

    fn logits(&self, ids: &[u32]) -> Result<Tensor> {
        (**self).logits(ids)
    }

    fn context_length(&self) -> usize {
        (**self).context_length()
    }

    fn new_cache(&self, batch: usize, capacity: usize) -> Result<KvCache<D>> {
        (**self).new_cache(batch, capacity)
    }

    fn forward_cached(&self, ids: &[u32], cache: &mut KvCache<D>) -> Result<Tensor> {
        (**self).forward_cached(ids, cache)
    }
}

/// Where and how [`load_with`] loads a model: the device it computes on, and LoRA adapters each
/// with its multiplier (`nnx run --lora ADAPTER:SCALE`).
///
/// ```no_run
/// use nnx::models::{LoadOptions, load_with};
/// let adapter = nnx::adapter::Adapter::open("adapter/")?;
/// let loaded = load_with("model.gguf", &LoadOptions::default().adapter(adapter, 0.5))?;
/// # Ok::<(), nnx::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct LoadOptions<D: Device = Host> {
    /// The device the model computes on.
    pub device: D,
    /// Adapters in the order they apply: merged into a folder's float weights (MLX affine ones
    /// decoded and quantized again, as `mlx_lm.fuse` does), applied at run time beside a GGUF
    /// file's blocks (on the host).
    pub adapters: Vec<(crate::adapter::Adapter, f32)>,
}

impl Default for LoadOptions<Host> {
    /// The host, no adapters.
    fn default() -> LoadOptions<Host> {
        LoadOptions::on(Host)
    }
}

impl<D: Device> LoadOptions<D> {
    /// No adapters, on `device`.
    pub fn on(device: D) -> LoadOptions<D> {
        LoadOptions { device, adapters: Vec::new() }
    }

    /// These options with `adapter` applied after the others, its scale multiplied by `scale`.
    #[must_use]
    pub fn adapter(mut self, adapter: crate::adapter::Adapter, scale: f32) -> LoadOptions<D> {
        self.adapters.push((adapter, scale));
        self
    }
}

/// A device models load onto: the host, and a GPU with the `gpu` feature.
pub trait LoadDevice: Device + sealed::Loads {}

impl LoadDevice for Host {}

#[cfg(feature = "gpu")]
impl LoadDevice for crate::Gpu {}

mod sealed {
    use super::{LoadOptions, LoadedModel};

    /// How a device loads; sealed, since the loader's steps are written per device.
    pub trait Loads: crate::Device + Sized {
        fn load(source: &str, options: &LoadOptions<Self>) -> crate::Result<LoadedModel<Self>>;
    }
}

impl sealed::Loads for Host {
    fn load(source: &str, options: &LoadOptions<Host>) -> Result<LoadedModel<Host>> {
        Files::open(source)?.merged(&options.adapters)?.load_on(&HostTarget)
    }
}

#[cfg(feature = "gpu")]
impl sealed::Loads for crate::Gpu {
    /// The model is built on the GPU as meta tensors and each weight is uploaded as it is
    /// imported (adapters merged on the host first).
    fn load(source: &str, options: &LoadOptions<crate::Gpu>) -> Result<LoadedModel<crate::Gpu>> {
        Files::open(source)?.merged(&options.adapters)?.load_on(&GpuTarget(options.device.clone()))
    }
}

/// Loads `source` as `options` say: a GGUF file (or a folder holding one), a transformers or
/// mlx-community folder, or an `hf://` path to either.
///
/// GGUF projections stay in their ggml blocks (Q4_K, Q8_0, ... and F32/F16/BF16), read by
/// products that decode inside the product, and so does the token embedding ([`super::TokenEmbedding`]:
/// a lookup decodes its rows, a tied head multiplies its blocks); norms are decoded to f32. Folders
/// load in the dtype of their weights (BF16 views of the file), or as MLX affine layers when
/// `config.json` has a `quantization` key. On a GPU the model is built there as meta tensors
/// and each weight is uploaded as it is imported.
///
/// Adapters must each find their modules' entries in the files, with their shapes
/// ([`Adapter::merge_archive`](crate::adapter::Adapter::merge_archive)); merged weights keep the
/// files' dtype.
///
/// # Errors
/// [`Error::Encoder`] for an encoder such as BERT (it computes embeddings:
/// [`SentenceEncoder`](super::sentence::SentenceEncoder)), [`Error::Config`] for another
/// architecture nnx does not run, the errors of reading the files,
/// and the import's [`Error::Load`] listing every tensor that does not fit;
/// [`Error::AdapterMismatch`] for an adapter that does not fit the files, [`Error::Adapter`] for
/// one on a SEED folder (merge it into the float folder with `nnx lora merge`) or on a GGUF
/// file on a GPU (applied at run time on the host only); the device's errors.
pub fn load_with<D: LoadDevice>(source: &str, options: &LoadOptions<D>) -> Result<LoadedModel<D>> {
    <D as sealed::Loads>::load(source, options)
}

/// [`load_with`] on the host without adapters: the common case.
///
/// # Errors
/// As [`load_with`].
pub fn load(source: &str) -> Result<LoadedModel> {
    load_with(source, &LoadOptions::default())
}

/// The opened files of one model.
struct Files {
    /// The GGUF file or the folder.
    path: PathBuf,
    archive: Archive,
    /// Adapters applied at run time (to a GGUF file's blocks), with their multipliers.
    adapters: Vec<(crate::adapter::Adapter, f32)>,
}

impl Files {
    fn open(source: &str) -> Result<Files> {
        let path = crate::hub::local_path(source)?;
        let mut archive = Archive::open(&path)?;
        // A checkpoint published quantized loads as its float twin, decoded as each weight is
        // imported; gpt-oss's MXFP4 experts are read as they are stored (see `decoder.rs`).
        match crate::published::Scheme::of(&path)? {
            Some(crate::published::Scheme::Mxfp4) | None => {}
            Some(scheme) => archive = crate::published::decoded(&archive, &scheme, &path)?,
        }
        let archive = super::text_model_view(archive)?;
        Ok(Files { path, archive, adapters: Vec::new() })
    }

    /// These files with `adapters`: merged into a folder's weights, in turn (MLX affine ones
    /// decoded and quantized again); kept beside a GGUF file's blocks, applied at run time.
    fn merged(mut self, adapters: &[(crate::adapter::Adapter, f32)]) -> Result<Files> {
        if self.archive.gguf_metadata().is_some() {
            self.adapters = adapters.to_vec();
            return Ok(self);
        }
        for (adapter, scale) in adapters {
            if self.archive.names().any(|name| name.ends_with(".seeds")) {
                return Err(Error::Adapter {
                    path: adapter.path.clone(),
                    entry: String::new(),
                    problem: format!(
                        "cannot be merged at load into `{}`, whose weights are SEED streams: merge it into the float folder with `nnx lora merge` and quantize the result",
                        self.path.display()
                    ),
                });
            }
            let adapter = super::lora::in_files_layout(adapter, &self.path);
            self.archive = adapter.scaled(*scale).merge_archive(&self.archive)?;
        }
        Ok(self)
    }
}

impl Files {
    /// The model of these files on `target`'s device.
    fn load_on<D: Device, T: Target<D>>(&self, target: &T) -> Result<LoadedModel<D>>
    where
        dyn DecoderModel: LoadsOn<D, T>,
        Gpt2: crate::Place<D>,
        <Gpt2 as crate::Place<D>>::Placed: Module<D> + CausalLm<Device = D> + 'static,
    {
        match self.archive.gguf_metadata() {
            Some(metadata) => self.load_gguf(metadata, target),
            None => self.load_folder(target),
        }
    }

    fn load_gguf<D: Device, T: Target<D>>(&self, metadata: &crate::gguf::Metadata, target: &T) -> Result<LoadedModel<D>>
    where
        dyn DecoderModel: LoadsOn<D, T>,
    {
        let architecture = metadata.architecture().unwrap_or_default().to_string();
        let model = match MetaModel::from_gguf(self, metadata, &architecture)? {
            MetaModel::Decoder(dense) => LoadsOn::<D, T>::gguf(dense, self, target)?,
            MetaModel::Gpt2(_) | MetaModel::Bert(_) => {
                return Err(unknown_architecture(&self.path, "`general.architecture`", &architecture));
            }
        };
        let tokenizer = Tokenizer::from_gguf(metadata, &self.path)?;
        let mut generation = GenerationConfig::default();
        for key in ["tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"] {
            if let Some(id) = metadata.u64(key).and_then(|id| u32::try_from(id).ok())
                && !generation.eos_token_ids.contains(&id)
            {
                generation.eos_token_ids.push(id);
            }
        }
        let adds_bos = metadata.get("tokenizer.ggml.add_bos_token").and_then(|add| add.as_bool());
        let bos = metadata.u64("tokenizer.ggml.bos_token_id").and_then(|id| u32::try_from(id).ok());
        Ok(LoadedModel {
            model,
            architecture,
            weights: ggml_summary(&self.archive),
            tokenizer,
            chat_template: ChatTemplate::from_gguf(metadata)?,
            generation,
            bos_token_id: bos.filter(|_| adds_bos.unwrap_or(false)),
        })
    }

    fn load_folder<D: Device, T: Target<D>>(&self, target: &T) -> Result<LoadedModel<D>>
    where
        dyn DecoderModel: LoadsOn<D, T>,
        Gpt2: crate::Place<D>,
        <Gpt2 as crate::Place<D>>::Placed: Module<D> + CausalLm<Device = D> + 'static,
    {
        let dir = &self.path;
        let config_path = dir.join("config.json");
        let probe: FolderConfig = super::read_config(&config_path, |_, _| Ok(()))?;
        let model_type = probe.model_type().unwrap_or_default().to_string();
        let kind = self.folder_kind(&probe)?;
        let architecture = family::from_name(&model_type).map_or("", |family| family.name);
        let model = match MetaModel::from_config(&config_path, &model_type, kind.dtype())? {
            MetaModel::Decoder(dense) => LoadsOn::<D, T>::folder(dense, self, kind, target)?,
            MetaModel::Gpt2(dense) => target.finish(dense, &self.archive)?,
            // An encoder: nnx plans its import but has no causal model to run.
            MetaModel::Bert(_) => return Err(unknown_architecture(&config_path, "`model_type`", &model_type)),
        };
        let tokenizer = Tokenizer::from_folder(dir)?;
        let bos_token_id = tokenizer.encode("")?.first().copied();
        Ok(LoadedModel {
            model,
            architecture: architecture.to_string(),
            weights: match kind {
                Kind::Dense(dtype) => dtype.to_string().to_lowercase(),
                Kind::Affine(spec) => format!("mlx affine {}-bit, groups of {}", spec.bits, spec.group_size),
                Kind::Seed => "seed".to_string(),
            },
            tokenizer,
            chat_template: ChatTemplate::from_folder(dir)?,
            generation: GenerationConfig::from_folder(dir)?,
            bos_token_id,
        })
    }
}

/// The error for an architecture nnx does not run, named by `key` (in backticks) in the file at
/// `path`: an encoder is told apart, with where to compute its embeddings instead.
fn unknown_architecture(path: &Path, key: &'static str, found: &str) -> Error {
    let gguf = key == "`general.architecture`";
    let ours = if gguf { family::from_gguf_architecture(found) } else { family::from_model_type(found) };
    if ours.is_some_and(|family| !family.generates()) || family::ENCODERS.contains(&found) {
        let remedy = match ours {
            Some(_) if !gguf => "embed text with it by running `nnx embed MODEL TEXT...` instead",
            _ if gguf => {
                "`nnx embed MODEL TEXT...` embeds text with the sentence-transformers folder of a BERT encoder, not with a GGUF file: run it on the folder the file was converted from"
            }
            _ => {
                "`nnx embed MODEL TEXT...` embeds text with BERT encoders (`model_type` `bert`), not this one yet: embed with sentence-transformers"
            }
        };
        return Error::Encoder { path: path.to_path_buf(), key, found: found.to_string(), remedy };
    }
    let advice = if gguf {
        "convert the model with llama.cpp's converter as one of these, or run its transformers folder"
    } else {
        "convert the model to one of these or load it with its own type"
    };
    super::decoder::unusable(path, format!("{key} is `{found}`; nnx runs {}: {advice}", family::supported(gguf)))
}

/// `adapter` (PEFT or MLX-LM) with llama.cpp's names for the GGUF file at `path`, open as
/// `archive`: renamed through the mapping of the family its `general.architecture` names, q and
/// k turned to the file's rotary row order, as [`Adapter::merge_gguf`](crate::adapter::Adapter::merge_gguf)
/// merges it.
///
/// # Errors
/// [`Error::Config`] for a file that is not GGUF or of an architecture nnx does not build;
/// the errors of reading its keys and of renaming.
pub fn adapter_for_gguf(
    path: &Path,
    archive: &Archive,
    adapter: &crate::adapter::Adapter,
) -> Result<crate::adapter::Adapter> {
    let Some(metadata) = archive.gguf_metadata() else {
        return Err(super::decoder::unusable(
            path,
            "it is not a GGUF file: a GGUF adapter renaming needs the GGUF base".into(),
        ));
    };
    let architecture = metadata.architecture().unwrap_or_default();
    let Some(family) = family::from_gguf_architecture(architecture) else {
        return Err(unknown_architecture(path, "`general.architecture`", architecture));
    };
    MetaModel::from_gguf_at(path, archive, metadata, family)?.gguf_adapter(adapter, metadata)
}

/// The import plan of `source` (as [`load`] takes it) into the model nnx builds for
/// `architecture` (the files' own when `None`: `general.architecture` or `model_type`; `bert`
/// too, which nnx encodes with rather than runs), from
/// headers alone: each model tensor's entry and the renames, transposes, splits, rotary
/// permutations and ties on the way, and every missing, unexpected or mismatched tensor. A
/// GGUF file is planned into the dense model (its blocks read as the floats they decode to);
/// a folder into the model [`load`] builds for it, MLX affine or SEED layers included.
///
/// Returns the architecture planned for and the plan.
///
/// # Errors
/// [`Error::Encoder`] for an encoder nnx does not build (one other than BERT, or a GGUF
/// encoder), [`Error::Config`] for another architecture nnx does not build or a config it
/// cannot read; the
/// errors of opening the files. Problems with the mapping are in the plan.
pub fn import_plan(source: &str, architecture: Option<&str>) -> Result<(String, crate::ImportPlan)> {
    let files = Files::open(source)?;
    let archive = &files.archive;
    if let Some(metadata) = archive.gguf_metadata() {
        let Some(asked) = architecture else {
            let architecture = metadata.architecture().unwrap_or_default().to_string();
            let plan = MetaModel::from_gguf(&files, metadata, &architecture)?.plan_dense(archive)?;
            return Ok((architecture, plan));
        };
        let Some(family) = family::from_name(asked) else {
            return Err(unknown_architecture(&files.path, "the architecture asked for", asked));
        };
        let plan = MetaModel::from_gguf_at(&files.path, archive, metadata, family)?.plan_dense(archive)?;
        return Ok((asked.to_string(), plan));
    }
    let config_path = files.path.join("config.json");
    let probe: FolderConfig = super::read_config(&config_path, |_, _| Ok(()))?;
    let model_type = probe.model_type().unwrap_or_default();
    let architecture = architecture.unwrap_or(model_type).to_string();
    let kind = files.folder_kind(&probe)?;
    let meta = MetaModel::from_config(&config_path, &architecture, kind.dtype())?;
    let plan = match &meta {
        MetaModel::Decoder(dense) => dense.plan_folder(&files, kind)?,
        other => other.plan_dense(archive)?,
    };
    Ok((architecture, plan))
}

/// `adapter` in the layout the model files whose `config.json` (at `config_path`) names
/// `model_type` store their weights in ([`crate::adapter::Adapter::in_model_layout`]).
///
/// # Errors
/// The errors of reading the configuration, or a `model_type` of no family.
pub(super) fn adapter_layout(
    config_path: &Path,
    model_type: &str,
    adapter: &crate::adapter::Adapter,
) -> Result<crate::adapter::Adapter> {
    Ok(MetaModel::from_config(config_path, model_type, DType::F32)?.adapter_layout(adapter))
}

/// A family's dense model with meta tensors, built from the files' own account of its shape
/// (the GGUF keys or `config.json`) before a byte of weights is read: the loader packs or
/// quantizes it as the files store it, the import plan reports on it, and both name the
/// families alike.
enum MetaModel {
    /// Llama, Qwen or Gemma 3.
    Decoder(Box<dyn DecoderModel>),
    Gpt2(Gpt2),
    Bert(super::bert::Bert),
}

impl MetaModel {
    /// The decoder `architecture` (`general.architecture`, or the caller's) describes in
    /// `metadata`, in f32, tied when the file has no `output.weight`.
    ///
    /// The hyperparameters are checked against the file's tensors first
    /// ([`GgufKeys::check_tensors`](super::decoder::GgufKeys::check_tensors)), so that nothing
    /// is sized from a value the tensors do not bear out.
    fn from_gguf(files: &Files, metadata: &crate::gguf::Metadata, architecture: &str) -> Result<MetaModel> {
        let family = family::from_gguf_architecture(architecture).filter(|family| family.generates());
        let Some(family) = family else {
            return Err(unknown_architecture(&files.path, "`general.architecture`", architecture));
        };
        MetaModel::from_gguf_at(&files.path, &files.archive, metadata, family)
    }

    /// The model of `family` the GGUF file at `path` (open as `archive`) describes; a family
    /// whose model does not read GGUF names is refused by name.
    fn from_gguf_at(
        path: &Path,
        archive: &Archive,
        metadata: &crate::gguf::Metadata,
        family: &family::Family,
    ) -> Result<MetaModel> {
        let tied = !archive.contains("output.weight");
        let gguf_family = |name: &str| family::from_gguf_architecture(name).filter(|family| family.generates());
        if let Some(own) = metadata.architecture().filter(|own| gguf_family(own).is_some()) {
            let keys = super::decoder::GgufKeys::new(metadata, &[own], "nnx", path)?;
            let shape = |name: &str| archive.entry_spec(name).ok().flatten().map(|(_, shape)| shape);
            keys.check_tensors(archive.names(), shape, family.network.heads())?;
        }
        let meta = crate::nn::Init::Meta;
        Ok(match family.network {
            Network::Llama => {
                let mut dense = Llama::new(&LlamaConfig::from_gguf_at(metadata, tied, path)?, DType::F32, meta);
                // Llama 3's rope scaling is in the file only as `rope_freqs.weight`.
                if let Some((_, shape)) = archive.entry_spec("rope_freqs.weight")? {
                    dense.rope_freqs = Some(Tensor::meta(DType::F32, &shape));
                }
                MetaModel::Decoder(Box::new(dense))
            }
            Network::Qwen => MetaModel::Decoder(Box::new(Qwen::new(
                &QwenConfig::from_gguf_at(metadata, tied, path)?,
                DType::F32,
                meta,
            ))),
            Network::Gemma3 => MetaModel::Decoder(Box::new(Gemma3::new(
                &Gemma3Config::from_gguf_at(metadata, tied, path)?,
                DType::F32,
                meta,
            ))),
            Network::GptOss => MetaModel::Decoder(Box::new(GptOss::new(
                &GptOssConfig::from_gguf_at(metadata, tied, path)?,
                DType::F32,
                meta,
            ))),
            Network::Qwen35 => MetaModel::Decoder(Box::new(Qwen35::new(
                &Qwen35Config::from_gguf_at(metadata, tied, path)?,
                DType::F32,
                meta,
            ))),
            Network::Gemma4 => {
                // The global layers' rotated share is in the file as `rope_freqs.weight`: one
                // divisor per frequency, 1 for the turned ones.
                let rotated = match archive.get("rope_freqs.weight") {
                    Some(freqs) => {
                        Some(2 * freqs.to_dtype(DType::F32)?.to_vec::<f32>()?.iter().filter(|&&f| f == 1.0).count())
                    }
                    None => None,
                };
                // Where the global layers' keys serve as values, they have no `attn_v`.
                let global =
                    (0..).map(|at| format!("blk.{at}.attn_q.weight")).take_while(|q| archive.contains(q)).count();
                let keys_are_values = (0..global).any(|at| {
                    archive.contains(&format!("blk.{at}.attn_k.weight"))
                        && !archive.contains(&format!("blk.{at}.attn_v.weight"))
                });
                let config = Gemma4Config::from_gguf_at(metadata, tied, rotated, keys_are_values, path)?;
                MetaModel::Decoder(Box::new(Gemma4::new(&config, DType::F32, meta)))
            }
            Network::Gpt2 | Network::Bert => {
                return Err(super::decoder::unusable(
                    path,
                    format!(
                        "nnx reads `{}` models from transformers folders, not from GGUF files: give the folder",
                        family.name
                    ),
                ));
            }
        })
    }

    /// The model `model_type` (`config.json`'s, or the caller's) names, built from
    /// `config_path` in `dtype`.
    fn from_config(config_path: &Path, model_type: &str, dtype: DType) -> Result<MetaModel> {
        let meta = crate::nn::Init::Meta;
        let Some(family) = family::from_name(model_type) else {
            return Err(unknown_architecture(config_path, "`model_type`", model_type));
        };
        Ok(match family.network {
            Network::Llama => {
                MetaModel::Decoder(Box::new(Llama::new(&LlamaConfig::from_file(config_path)?, dtype, meta)))
            }
            Network::Qwen => MetaModel::Decoder(Box::new(Qwen::new(&QwenConfig::from_file(config_path)?, dtype, meta))),
            Network::Gemma3 => {
                MetaModel::Decoder(Box::new(Gemma3::new(&Gemma3Config::from_file(config_path)?, dtype, meta)))
            }
            Network::GptOss => {
                MetaModel::Decoder(Box::new(GptOss::new(&GptOssConfig::from_file(config_path)?, dtype, meta)))
            }
            Network::Qwen35 => {
                MetaModel::Decoder(Box::new(Qwen35::new(&Qwen35Config::from_file(config_path)?, dtype, meta)))
            }
            Network::Gemma4 => {
                MetaModel::Decoder(Box::new(Gemma4::new(&Gemma4Config::from_file(config_path)?, dtype, meta)))
            }
            Network::Gpt2 => MetaModel::Gpt2(Gpt2::new(&Gpt2Config::from_file(config_path)?, dtype, meta)),
            Network::Bert => {
                MetaModel::Bert(super::bert::Bert::new(&super::bert::BertConfig::from_file(config_path)?, dtype, meta))
            }
        })
    }

    /// `adapter` renamed to the GGUF file's names and q/k row order
    /// ([`crate::adapter::Adapter::renamed_for_gguf`]).
    fn gguf_adapter(
        &self,
        adapter: &crate::adapter::Adapter,
        metadata: &crate::gguf::Metadata,
    ) -> Result<crate::adapter::Adapter> {
        match self {
            MetaModel::Decoder(dense) => dense.gguf_adapter(adapter, metadata),
            MetaModel::Gpt2(dense) => adapter.renamed_for_gguf(dense, metadata),
            MetaModel::Bert(dense) => adapter.renamed_for_gguf(dense, metadata),
        }
    }

    /// `adapter` in the layout the model's files store its weights in
    /// ([`crate::adapter::Adapter::in_model_layout`]).
    fn adapter_layout(&self, adapter: &crate::adapter::Adapter) -> crate::adapter::Adapter {
        match self {
            MetaModel::Decoder(dense) => dense.adapter_layout(adapter),
            MetaModel::Gpt2(dense) => adapter.in_model_layout(dense),
            MetaModel::Bert(dense) => adapter.in_model_layout(dense),
        }
    }

    /// The plan of importing the files into the dense model as it is.
    fn plan_dense(&self, archive: &Archive) -> Result<crate::ImportPlan> {
        match self {
            MetaModel::Decoder(dense) => dense.plan_dense(archive),
            MetaModel::Gpt2(dense) => archive.import_plan(dense, ""),
            MetaModel::Bert(dense) => archive.import_plan(dense, ""),
        }
    }
}
