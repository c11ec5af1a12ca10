//! One loader for the model files people download: a GGUF file (llama.cpp's names, ggml
//! blocks kept packed), a transformers folder (safetensors, sharded or not) or an
//! mlx-community folder (MLX affine weights), local or `hf://`. The architecture comes from
//! `general.architecture` or `config.json`'s `model_type`, the weights kind from the files.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use nnx_core::quant::ggml::{GgmlLinear, GgmlType};
use nnx_core::quant::{AffineSpec, QuantizedLinear, SeedLinear};

use super::family::{self, Network};
use super::gemma3::{Gemma3, Gemma3Config};
use super::gpt2::{Gpt2, Gpt2Config};
use super::llama::{Llama, LlamaConfig};
use super::qwen::{Qwen, QwenConfig};
use super::{Affine, CausalLm, Ggml, Seed, TokenEmbedding};
use crate::generate::{ChatTemplate, GenerationConfig, KvCache, Tokenizer};
use crate::nn::Linear;
use crate::quantized::QuantizedFolder;
use crate::{Archive, DType, Device, Error, Host, ImportOptions, Module, Naming, Result, Tensor};

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

/// Loads `source` on the host: a GGUF file (or a folder holding one), a transformers or
/// mlx-community folder, or an `hf://` path to either.
///
/// GGUF projections stay in their ggml blocks (Q4_K, Q8_0, ... and F32/F16/BF16), read by
/// products that decode inside the product, and so does the token embedding ([`super::TokenEmbedding`]:
/// a lookup decodes its rows, a tied head multiplies its blocks); norms are decoded to f32. Folders
/// load in the dtype of their weights (BF16 views of the file), or as MLX affine layers when
/// `config.json` has a `quantization` key.
///
/// # Errors
/// [`Error::Encoder`] for an encoder such as BERT (it computes embeddings:
/// [`SentenceEncoder`](super::sentence::SentenceEncoder)), [`Error::Config`] for another
/// architecture nnx does not run, the errors of reading the files,
/// and the import's [`Error::Load`] listing every tensor that does not fit.
pub fn load(source: &str) -> Result<LoadedModel> {
    Files::open(source)?.load_host(&HostTarget)
}

/// [`load`] with LoRA adapters merged into the weights first, each with its multiplier
/// (`nnx run --lora ADAPTER:SCALE`): every adapter's modules must find their entries in the
/// files, with their shapes ([`Adapter::merge_archive`](crate::adapter::Adapter::merge_archive)),
/// and the merged weights keep the files' dtype.
///
/// # Errors
/// As [`load`]; [`Error::AdapterMismatch`] for an adapter that does not fit the files;
/// [`Error::Adapter`] for a GGUF file or a SEED folder, whose packed weights are not merged
/// into here (`nnx lora merge` writes a merged GGUF file); MLX affine weights are decoded,
/// merged and quantized again as `mlx_lm.fuse` does.
pub fn load_with_adapters(source: &str, adapters: &[(crate::adapter::Adapter, f32)]) -> Result<LoadedModel> {
    Files::open(source)?.merged(adapters)?.load_host(&HostTarget)
}

/// [`load_with_adapters`] onto a GPU (the adapters merged on the host, the merged weights
/// uploaded).
///
/// # Errors
/// As [`load_with_adapters`] and [`load_on`].
#[cfg(feature = "gpu")]
pub fn load_on_with_adapters(
    source: &str,
    gpu: &crate::Gpu,
    adapters: &[(crate::adapter::Adapter, f32)],
) -> Result<LoadedModel<crate::Gpu>> {
    Files::open(source)?.merged(adapters)?.load_gpu(&GpuTarget(gpu.clone()))
}

/// [`load`] onto a GPU: the model is built there as meta tensors and each weight is uploaded
/// as it is imported.
///
/// # Errors
/// As [`load`], and the device's errors.
#[cfg(feature = "gpu")]
pub fn load_on(source: &str, gpu: &crate::Gpu) -> Result<LoadedModel<crate::Gpu>> {
    Files::open(source)?.load_gpu(&GpuTarget(gpu.clone()))
}

/// The device a model is imported onto: a meta model is placed there, then imported, so that
/// each weight goes to the device as it is read.
trait Target<D: Device> {
    fn device(&self) -> &D;

    fn finish<M>(&self, model: M, archive: &Archive) -> Result<Box<dyn CausalLm<Device = D>>>
    where
        M: Module + crate::Place<D>,
        M::Placed: Module<D> + CausalLm<Device = D> + 'static,
    {
        self.finish_with(model, archive, &ImportOptions::default())
    }

    fn finish_with<M>(
        &self,
        model: M,
        archive: &Archive,
        options: &ImportOptions,
    ) -> Result<Box<dyn CausalLm<Device = D>>>
    where
        M: Module + crate::Place<D>,
        M::Placed: Module<D> + CausalLm<Device = D> + 'static,
    {
        let mut placed = model.place_with(&mut crate::Placer::new(self.device()))?;
        archive.import_into_with(&mut placed, "", options)?;
        Ok(Box::new(placed))
    }

    /// Whether the token embedding stays in the file's ggml blocks ([`TokenEmbedding`]): on
    /// the host a lookup decodes a row where it is mapped and a tied head multiplies the same
    /// blocks, so the table is neither copied nor widened. A GPU would read each looked-up row
    /// back, so there the table is decoded to f32 once and a tied head gets its own blocks.
    const PACKED_EMBEDDING: bool;

    /// [`Target::finish`] for a model of ggml layers whose head `head` picks: a GGUF file
    /// without `output.weight` ties the head to `token_embd.weight`. Without
    /// [`Target::PACKED_EMBEDDING`] the embedding is decoded to f32 for lookups and the head
    /// gets `token_embd`'s blocks, so that the largest product of a decoded token reads the
    /// packed rows either way.
    fn finish_ggml<M>(
        &self,
        model: M,
        archive: &Archive,
        options: &ImportOptions,
        adapters: &[(crate::adapter::Adapter, f32)],
        head: fn(&mut M::Placed) -> &mut Option<GgmlLinear<D>>,
    ) -> Result<Box<dyn CausalLm<Device = D>>>
    where
        M: Module + crate::Place<D>,
        M::Placed: Module<D> + CausalLm<Device = D> + AttachLora<D> + 'static,
        GgmlLinear: crate::Place<D, Placed = GgmlLinear<D>>,
    {
        let mut placed = model.place_with(&mut crate::Placer::new(self.device()))?;
        archive.import_into_with(&mut placed, "", options)?;
        let slot = head(&mut placed);
        if slot.is_none() && !Self::PACKED_EMBEDDING {
            let embedding = archive.ggml("token_embd.weight")?;
            let (ty, shape) = (embedding.ty, embedding.shape.clone());
            let [vocab, hidden] = shape[..] else {
                return Err(Error::BadShape { op: "load", expected: "a token embedding of [vocab, hidden]", shape });
            };
            let row_bytes = embedding.data.shape()[0] / vocab.max(1);
            let layer: GgmlLinear = GgmlLinear::new(embedding.data.reshape(&[vocab, row_bytes])?, None, ty, hidden)?;
            *slot = Some(crate::Place::place_with(&layer, &mut crate::Placer::new(self.device()))?);
        }
        if !adapters.is_empty() {
            let metadata = archive.gguf_metadata().ok_or(Error::Meta { op: "load" })?;
            return placed.attach(adapters, metadata);
        }
        Ok(Box::new(placed))
    }
}

/// A model of ggml layers that takes LoRA adapters at run time ([`super::lora`]): on the host,
/// each projection keeps its blocks and adds the adapters' low-rank products.
trait AttachLora<D: Device>: Sized {
    fn attach(
        self,
        adapters: &[(crate::adapter::Adapter, f32)],
        metadata: &crate::gguf::Metadata,
    ) -> Result<Box<dyn CausalLm<Device = D>>>;
}

/// The adapters for a GGUF model, each with its multiplier set: renamed to the file's names and
/// q/k row order where the model keeps them (`stored_rope_rows`).
fn attach_to<M>(
    model: &M,
    adapters: &[(crate::adapter::Adapter, f32)],
    metadata: &crate::gguf::Metadata,
    stored_rope_rows: bool,
) -> Result<super::lora::LoraLayers>
where
    M: Module,
{
    let renamed: Vec<crate::adapter::Adapter> = adapters
        .iter()
        .map(
            |(adapter, _)| {
                if stored_rope_rows { adapter.renamed_for_gguf(model, metadata) } else { Ok(adapter.clone()) }
            },
        )
        .collect::<Result<_>>()?;
    let refs: Vec<&crate::adapter::Adapter> = renamed.iter().collect();
    let layers = super::lora::LoraLayers::new(model, &refs, stored_rope_rows)?;
    for (index, (_, scale)) in adapters.iter().enumerate() {
        layers.switches().set(index, *scale);
    }
    Ok(layers)
}

macro_rules! attach_lora {
    ($($family:ident, $rows:expr);*) => {$(
        impl AttachLora<Host> for $family<Host, Ggml> {
            fn attach(
                self,
                adapters: &[(crate::adapter::Adapter, f32)],
                metadata: &crate::gguf::Metadata,
            ) -> Result<Box<dyn CausalLm<Device = Host>>> {
                #[allow(clippy::redundant_closure_call)]
                let stored = ($rows)(&self);
                let layers = attach_to(&self, adapters, metadata, stored)?;
                let model = self.map_weights::<super::lora::Lora<Ggml>>(|path, layer| Ok(layers.layer(path, layer)))?;
                Ok(Box::new(model))
            }
        }

        #[cfg(feature = "gpu")]
        impl AttachLora<crate::Gpu> for $family<crate::Gpu, Ggml> {
            fn attach(
                self,
                adapters: &[(crate::adapter::Adapter, f32)],
                _: &crate::gguf::Metadata,
            ) -> Result<Box<dyn CausalLm<Device = crate::Gpu>>> {
                let path = adapters.first().map(|(adapter, _)| adapter.path.clone()).unwrap_or_default();
                Err(Error::Adapter {
                    path,
                    entry: String::new(),
                    problem: "is applied at run time on the host only: run with `--device cpu`, or write the merged model with `nnx lora merge` and run that on the GPU".into(),
                })
            }
        }
    )*};
}

attach_lora!(Llama, |model: &Llama<Host, Ggml>| model.stored_rope_rows; Qwen, |_: &Qwen<Host, Ggml>| false; Gemma3, |_: &Gemma3<Host, Ggml>| false);

struct HostTarget;

impl Target<Host> for HostTarget {
    const PACKED_EMBEDDING: bool = true;

    fn device(&self) -> &Host {
        &Host
    }
}

#[cfg(feature = "gpu")]
struct GpuTarget(crate::Gpu);

#[cfg(feature = "gpu")]
impl Target<crate::Gpu> for GpuTarget {
    const PACKED_EMBEDDING: bool = false;

    fn device(&self) -> &crate::Gpu {
        &self.0
    }
}

/// How the projections are stored.
#[derive(Clone, Copy)]
enum Kind {
    Dense(DType),
    Affine(AffineSpec),
    /// SeedLM weights (`.seeds`, `.nibbles` or `.coefs`, `.exp_bias`), as `nnx quantize` writes.
    Seed,
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
        let archive = Archive::open(&path)?;
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

/// `$body` with `$dense` bound to a decoder [`MetaModel`]'s model, written once for the three
/// types, and the arms given for the other families.
macro_rules! each_decoder {
    ($family:expr, |$dense:ident| $body:expr, $($rest:tt)*) => {
        match $family {
            MetaModel::Llama($dense) => $body,
            MetaModel::Qwen($dense) => $body,
            MetaModel::Gemma3($dense) => $body,
            $($rest)*
        }
    };
}

/// The loading steps for one device: the families' bounds on their device hold for the host
/// and the GPU by name, not for any `D`, so the steps are written once and stamped per device.
macro_rules! loader {
    ($device:ty, $target:ty, $load:ident, $gguf:ident, $folder:ident) => {
        impl Files {
            fn $load(&self, target: &$target) -> Result<LoadedModel<$device>> {
                match self.archive.gguf_metadata() {
                    Some(metadata) => self.$gguf(metadata, target),
                    None => self.$folder(target),
                }
            }

            fn $gguf(&self, metadata: &crate::gguf::Metadata, target: &$target) -> Result<LoadedModel<$device>> {
                let archive = &self.archive;
                let architecture = metadata.architecture().unwrap_or_default().to_string();
                let model = match MetaModel::from_gguf(self, metadata, &architecture)? {
                    MetaModel::Llama(mut dense) => {
                        pack_embedding::<$device, $target>(archive, &mut dense.embed)?;
                        // q and k keep the file's rotary pair order (no reordered copy).
                        dense.stored_rope_rows = true;
                        let ggml = dense.map_weights::<Ggml>(ggml_meta(archive, &dense)?)?;
                        let options = ImportOptions::default().with_stored_rope_rows();
                        target.finish_ggml(
                            ggml,
                            archive,
                            &options,
                            &self.adapters,
                            |model: &mut Llama<$device, Ggml>| &mut model.lm_head,
                        )?
                    }
                    MetaModel::Qwen(mut dense) => {
                        pack_embedding::<$device, $target>(archive, &mut dense.embed)?;
                        let ggml = dense.map_weights::<Ggml>(ggml_meta(archive, &dense)?)?;
                        target.finish_ggml(
                            ggml,
                            archive,
                            &ImportOptions::default(),
                            &self.adapters,
                            |model: &mut Qwen<$device, Ggml>| &mut model.lm_head,
                        )?
                    }
                    MetaModel::Gemma3(mut dense) => {
                        pack_embedding::<$device, $target>(archive, &mut dense.embed)?;
                        let ggml = dense.map_weights::<Ggml>(ggml_meta(archive, &dense)?)?;
                        target.finish_ggml(
                            ggml,
                            archive,
                            &ImportOptions::default(),
                            &self.adapters,
                            |model: &mut Gemma3<$device, Ggml>| &mut model.lm_head,
                        )?
                    }
                    MetaModel::Gpt2(_) | MetaModel::Bert(_) => {
                        return Err(unknown_architecture(&self.path, "`general.architecture`", &architecture));
                    }
                };
                let tokenizer = Tokenizer::from_gguf(metadata, &self.path)?;
                let mut generation = GenerationConfig::default();
                for key in ["tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"]
                {
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
                    weights: ggml_summary(archive),
                    tokenizer,
                    chat_template: ChatTemplate::from_gguf(metadata)?,
                    generation,
                    bos_token_id: bos.filter(|_| adds_bos.unwrap_or(false)),
                })
            }

            fn $folder(&self, target: &$target) -> Result<LoadedModel<$device>> {
                let dir = &self.path;
                let config_path = dir.join("config.json");
                let probe: FolderConfig = super::read_config(&config_path, |_, _| Ok(()))?;
                let model_type = probe.model_type.clone().unwrap_or_default();
                let kind = self.folder_kind(&probe)?;
                let archive = &self.archive;
                let meta = MetaModel::from_config(&config_path, &model_type, kind.dtype())?;
                let architecture = family::from_name(&model_type).map_or("", |family| family.name);
                let model = each_decoder!(meta, |dense| self.assemble(
                    dense,
                    kind,
                    target,
                    |dense, f| dense.map_weights::<Affine>(f),
                    |dense, f| dense.map_weights::<Seed>(f),
                )?,
                    MetaModel::Gpt2(dense) => target.finish(dense, archive)?,
                    // An encoder: nnx plans its import but has no causal model to run.
                    MetaModel::Bert(_) => return Err(unknown_architecture(&config_path, "`model_type`", &model_type)),
                );
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
    };
}

loader!(Host, HostTarget, load_host, load_gguf_host, load_folder_host);
#[cfg(feature = "gpu")]
loader!(crate::Gpu, GpuTarget, load_gpu, load_gguf_gpu, load_folder_gpu);

impl Files {
    /// The dense model as it is, or with MLX affine layers over it (`affine` is the family's
    /// `map_weights::<Affine>`).
    #[allow(clippy::type_complexity)]
    fn assemble<D: Device, T: Target<D>, M, A, S>(
        &self,
        dense: M,
        kind: Kind,
        target: &T,
        affine: impl FnOnce(&M, &dyn Fn(&str, &Linear) -> Result<QuantizedLinear>) -> Result<A>,
        seed: impl FnOnce(&M, &dyn Fn(&str, &Linear) -> Result<SeedLinear>) -> Result<S>,
    ) -> Result<Box<dyn CausalLm<Device = D>>>
    where
        M: Module + crate::Place<D>,
        M::Placed: Module<D> + CausalLm<Device = D> + 'static,
        A: Module + crate::Place<D>,
        A::Placed: Module<D> + CausalLm<Device = D> + 'static,
        S: Module + crate::Place<D>,
        S::Placed: Module<D> + CausalLm<Device = D> + 'static,
    {
        match kind {
            Kind::Seed => {
                let packed = seed(&dense, &self.seed_layers(&dense)?)?;
                target.finish_with(packed, &self.archive, &self.quantized_embedding()?)
            }
            Kind::Affine(spec) => {
                let meta = self.affine_meta(&dense, spec)?;
                let quantized = affine(&dense, &meta)?;
                target.finish_with(quantized, &self.archive, &self.quantized_embedding()?)
            }
            Kind::Dense(_) => target.finish(dense, &self.archive),
        }
    }

    /// For `map_weights::<Seed>`: each projection of `dense` as the folder stores it (the
    /// import then checks every stream).
    fn seed_layers<M: Module>(&self, dense: &M) -> Result<impl Fn(&str, &Linear) -> Result<SeedLinear> + use<M>> {
        let folder = QuantizedFolder::open(&self.path)?;
        let stems = Stems::new(dense, Naming::Transformers);
        Ok(move |path: &str, _: &Linear| folder.seed_linear(&stems.of(path)))
    }

    /// For `map_weights::<Affine>`: the meta MLX affine layer of each projection of `dense`,
    /// with the bits and group size the folder gives that module (mlx-lm's mixed precision
    /// writes per-module overrides in `quantization`; without one the streams' shapes say),
    /// else `default`; scales and biases in the dtype the folder stores them in.
    fn affine_meta<M: Module>(
        &self,
        dense: &M,
        default: AffineSpec,
    ) -> Result<impl Fn(&str, &Linear) -> Result<QuantizedLinear> + use<M>> {
        let folder = QuantizedFolder::open(&self.path)?;
        // mlx-lm keeps the model's dtype for scales and biases.
        let scales = self
            .archive
            .names()
            .find(|name| name.ends_with(".scales"))
            .and_then(|name| self.archive.entry_spec(name).ok().flatten())
            .map_or(DType::BF16, |(dtype, _)| dtype);
        let stems = Stems::new(dense, Naming::Transformers);
        Ok(move |path: &str, linear: &Linear| {
            let [out, features] = linear.weight.shape() else { unreachable!("a linear weight is 2-D") };
            // A module the folder lacks or stores otherwise is named by the import.
            let spec = match folder.encoding(&stems.of(path)) {
                Ok(crate::quantized::WeightEncoding::Affine(spec)) => spec,
                _ => default,
            };
            QuantizedLinear::meta(*features, *out, linear.bias.is_some(), spec, scales)
        })
    }

    /// mlx-lm quantizes the token embedding too (`embed_tokens.weight` packed, with `scales` and
    /// `biases`), and so does `nnx quantize` (affine or SEED streams): the model's float
    /// embedding is then imported through a hook that decodes it.
    fn quantized_embedding(&self) -> Result<ImportOptions> {
        const STEM: &str = "model.embed_tokens";
        let options = ImportOptions::default();
        if matches!(self.archive.entry_spec(&format!("{STEM}.weight"))?, Some((dtype, _)) if dtype.is_castable_float())
        {
            return Ok(options);
        }
        let folder = QuantizedFolder::open(&self.path)?;
        let reads = folder.streams_of(STEM);
        if reads.is_empty() {
            return Ok(options);
        }
        Ok(options.hook("embed.weight", reads, move |_, context| folder.weight(STEM)?.to_float(context.dtype)))
    }

    /// Dense in the dtype of the embedding, or MLX affine when `config.json` says
    /// `quantization`.
    fn folder_kind(&self, config: &FolderConfig) -> Result<Kind> {
        if self.archive.names().any(|name| name.ends_with(".seeds")) {
            return Ok(Kind::Seed);
        }
        if let Some(quantization) = &config.quantization {
            let (Some(bits), Some(group)) = (quantization.bits, quantization.group_size) else {
                return Err(super::decoder::unusable(
                    &self.path.join("config.json"),
                    "`quantization` needs integer `bits` and `group_size`, as mlx-lm writes them".into(),
                ));
            };
            return Ok(Kind::Affine(AffineSpec::new(bits as u32, group as usize)?));
        }
        let dtype = self
            .archive
            .names()
            .find(|name| name.ends_with("embed_tokens.weight") || name.ends_with("wte.weight"))
            .and_then(|name| self.archive.entry_spec(name).ok().flatten())
            .map(|(dtype, _)| dtype)
            .filter(|dtype| dtype.is_castable_float())
            .unwrap_or(DType::F32);
        Ok(Kind::Dense(dtype))
    }
}

/// What the loader reads of a folder's `config.json` before the family's own configuration: the
/// family, and MLX's quantization. Typed, so that the other fields are skipped as they are read
/// rather than built into values.
#[derive(serde::Deserialize)]
struct FolderConfig {
    #[serde(default)]
    model_type: Option<String>,
    #[serde(default)]
    quantization: Option<Quantization>,
}

/// The model-wide settings of MLX's `quantization` (per-module overrides are read with the
/// weights).
#[derive(serde::Deserialize)]
struct Quantization {
    #[serde(default)]
    bits: Option<u64>,
    #[serde(default)]
    group_size: Option<u64>,
}

impl Kind {
    fn dtype(self) -> DType {
        match self {
            Kind::Dense(dtype) => dtype,
            Kind::Affine(_) | Kind::Seed => DType::BF16,
        }
    }
}

/// Makes `embed` a meta table of `token_embd.weight`'s ggml blocks where the target keeps
/// them packed ([`Target::PACKED_EMBEDDING`]); the import then fills it with the file's bytes.
fn pack_embedding<D: Device, T: Target<D>>(archive: &Archive, embed: &mut TokenEmbedding) -> Result<()> {
    if !T::PACKED_EMBEDDING {
        return Ok(());
    }
    let [vocab, hidden] = embed.weight.shape()[..] else { unreachable!("a token embedding is 2-D") };
    // A missing entry is named by the import.
    if let Some(ty) = archive.ggml_type("token_embd.weight") {
        *embed = TokenEmbedding::packed_meta(vocab, hidden, ty)?;
    }
    Ok(())
}

/// For `map_weights`: the meta [`GgmlLinear`] of each dense projection of `dense`, of the
/// ggml type and shape its GGUF entry has.
fn ggml_meta<'a, M: Module>(
    archive: &'a Archive,
    dense: &M,
) -> Result<impl Fn(&str, &Linear) -> Result<GgmlLinear> + 'a> {
    let stems = Stems::new(dense, Naming::Gguf);
    Ok(move |path: &str, linear: &Linear| {
        let source = format!("{}.weight", stems.of(path));
        let [out, features] = linear.weight.shape() else { unreachable!("a linear weight is 2-D") };
        // Every entry of a GGUF file has a ggml type; a missing one is named by the import.
        let ty = archive.ggml_type(&source).unwrap_or(GgmlType::F32);
        let row_bytes = ty.row_bytes(*features).ok_or(Error::GgmlRow {
            op: "load",
            ty: ty.name(),
            block_size: ty.block_size(),
            values: *features,
            bytes: 0,
        })?;
        let bias = linear.bias.as_ref().map(|_| Tensor::meta(DType::F32, &[*out]));
        GgmlLinear::new(Tensor::meta(DType::U8, &[*out, row_bytes]), bias, ty, *features)
    })
}

/// The source stem (`model.layers.0.self_attn.q_proj`) of each projection's model path
/// (`layers.0.attn.q`) under one naming.
struct Stems(HashMap<String, String>);

impl Stems {
    fn new<M: Module>(model: &M, naming: Naming) -> Stems {
        let mut stems = HashMap::new();
        crate::for_each_entry_named(model, naming, |slot, _| {
            if let (Some(path), Some(stem)) = (slot.name.strip_suffix(".weight"), slot.source.strip_suffix(".weight")) {
                stems.insert(path.to_string(), stem.to_string());
            }
        });
        Stems(stems)
    }

    /// The stem of `path`; the path itself when the model has no such projection.
    fn of(&self, path: &str) -> String {
        self.0.get(path).cloned().unwrap_or_else(|| path.to_string())
    }
}

/// `ggml q8_0 (14), f32 (5)`: the types of a GGUF file's tensors, most common first.
fn ggml_summary(archive: &Archive) -> String {
    let mut counts: HashMap<&'static str, usize> = HashMap::new();
    for name in archive.names() {
        if let Some(ty) = archive.ggml_type(name) {
            *counts.entry(ty.name()).or_default() += 1;
        }
    }
    let mut counts: Vec<(&str, usize)> = counts.into_iter().collect();
    counts.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    let parts: Vec<String> = counts.iter().map(|(ty, count)| format!("{} ({count})", ty.to_lowercase())).collect();
    format!("ggml {}", parts.join(", "))
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
    let model_type = probe.model_type.as_deref().unwrap_or_default();
    let architecture = architecture.unwrap_or(model_type).to_string();
    let kind = files.folder_kind(&probe)?;
    let meta = MetaModel::from_config(&config_path, &architecture, kind.dtype())?;
    let plan = each_decoder!(meta, |dense| files.plan_folder(
        dense,
        kind,
        |dense, f| dense.map_weights::<Affine>(f),
        |dense, f| dense.map_weights::<Seed>(f),
    )?,
        other => other.plan_dense(archive)?,
    );
    Ok((architecture, plan))
}

/// A family's dense model with meta tensors, built from the files' own account of its shape
/// (the GGUF keys or `config.json`) before a byte of weights is read: the loader packs or
/// quantizes it as the files store it, the import plan reports on it, and both name the
/// families alike.
pub(super) enum MetaModel {
    Llama(Llama),
    Qwen(Qwen),
    Gemma3(Gemma3),
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
            keys.check_tensors(archive.names(), |name| {
                archive.entry_spec(name).ok().flatten().map(|(_, shape)| shape)
            })?;
        }
        let meta = crate::nn::Init::Meta;
        Ok(match family.network {
            Network::Llama => {
                let mut dense = Llama::new(&LlamaConfig::from_gguf_at(metadata, tied, path)?, DType::F32, meta);
                // Llama 3's rope scaling is in the file only as `rope_freqs.weight`.
                if let Some((_, shape)) = archive.entry_spec("rope_freqs.weight")? {
                    dense.rope_freqs = Some(Tensor::meta(DType::F32, &shape));
                }
                MetaModel::Llama(dense)
            }
            Network::Qwen => {
                MetaModel::Qwen(Qwen::new(&QwenConfig::from_gguf_at(metadata, tied, path)?, DType::F32, meta))
            }
            Network::Gemma3 => {
                MetaModel::Gemma3(Gemma3::new(&Gemma3Config::from_gguf_at(metadata, tied, path)?, DType::F32, meta))
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
    pub(super) fn from_config(config_path: &Path, model_type: &str, dtype: DType) -> Result<MetaModel> {
        let meta = crate::nn::Init::Meta;
        let Some(family) = family::from_name(model_type) else {
            return Err(unknown_architecture(config_path, "`model_type`", model_type));
        };
        Ok(match family.network {
            Network::Llama => MetaModel::Llama(Llama::new(&LlamaConfig::from_file(config_path)?, dtype, meta)),
            Network::Qwen => MetaModel::Qwen(Qwen::new(&QwenConfig::from_file(config_path)?, dtype, meta)),
            Network::Gemma3 => MetaModel::Gemma3(Gemma3::new(&Gemma3Config::from_file(config_path)?, dtype, meta)),
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
            MetaModel::Llama(dense) => adapter.renamed_for_gguf(dense, metadata),
            MetaModel::Qwen(dense) => adapter.renamed_for_gguf(dense, metadata),
            MetaModel::Gemma3(dense) => adapter.renamed_for_gguf(dense, metadata),
            MetaModel::Gpt2(dense) => adapter.renamed_for_gguf(dense, metadata),
            MetaModel::Bert(dense) => adapter.renamed_for_gguf(dense, metadata),
        }
    }

    /// `adapter` in the layout the model's files store its weights in
    /// ([`crate::adapter::Adapter::in_model_layout`]).
    pub(super) fn adapter_layout(&self, adapter: &crate::adapter::Adapter) -> crate::adapter::Adapter {
        match self {
            MetaModel::Llama(dense) => adapter.in_model_layout(dense),
            MetaModel::Qwen(dense) => adapter.in_model_layout(dense),
            MetaModel::Gemma3(dense) => adapter.in_model_layout(dense),
            MetaModel::Gpt2(dense) => adapter.in_model_layout(dense),
            MetaModel::Bert(dense) => adapter.in_model_layout(dense),
        }
    }

    /// The plan of importing the files into the dense model as it is.
    fn plan_dense(&self, archive: &Archive) -> Result<crate::ImportPlan> {
        match self {
            MetaModel::Llama(dense) => archive.import_plan(dense, ""),
            MetaModel::Qwen(dense) => archive.import_plan(dense, ""),
            MetaModel::Gemma3(dense) => archive.import_plan(dense, ""),
            MetaModel::Gpt2(dense) => archive.import_plan(dense, ""),
            MetaModel::Bert(dense) => archive.import_plan(dense, ""),
        }
    }
}

impl Files {
    /// The plan of importing into `dense`, or into the MLX affine or SEED layers over it, as
    /// [`Files::assemble`] builds them.
    #[allow(clippy::type_complexity)]
    fn plan_folder<M: Module, A: Module, S: Module>(
        &self,
        dense: M,
        kind: Kind,
        affine: impl FnOnce(&M, &dyn Fn(&str, &Linear) -> Result<QuantizedLinear>) -> Result<A>,
        seed: impl FnOnce(&M, &dyn Fn(&str, &Linear) -> Result<SeedLinear>) -> Result<S>,
    ) -> Result<crate::ImportPlan> {
        match kind {
            Kind::Seed => {
                let packed = seed(&dense, &self.seed_layers(&dense)?)?;
                self.archive.import_plan_with(&packed, "", &self.quantized_embedding()?)
            }
            Kind::Affine(spec) => {
                let meta = self.affine_meta(&dense, spec)?;
                let quantized = affine(&dense, &meta)?;
                self.archive.import_plan_with(&quantized, "", &self.quantized_embedding()?)
            }
            Kind::Dense(_) => self.archive.import_plan(&dense, ""),
        }
    }
}
