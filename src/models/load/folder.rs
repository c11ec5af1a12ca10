//! What a transformers or mlx-community folder holds and how its weights are read: dense, MLX
//! affine (with mlx-lm's per-module overrides) or SEED, the quantized embedding's hook, and the
//! model paths' source stems.

use std::collections::HashMap;

use nnx_core::quant::{AffineSpec, QuantizedLinear, SeedLinear};

use super::super::CausalLm;
use super::Files;
use super::device::Target;
use crate::nn::Linear;
use crate::quantized::QuantizedFolder;
use crate::{DType, Device, ImportOptions, Module, Naming, Result};

/// How the projections are stored.
#[derive(Clone, Copy)]
pub(super) enum Kind {
    Dense(DType),
    Affine(AffineSpec),
    /// SeedLM weights (`.seeds`, `.nibbles` or `.coefs`, `.exp_bias`), as `nnx quantize` writes.
    Seed,
}

/// What the loader reads of a folder's `config.json` before the family's own configuration: the
/// family, and MLX's quantization. Typed, so that the other fields are skipped as they are read
/// rather than built into values.
#[derive(serde::Deserialize)]
pub(super) struct FolderConfig {
    #[serde(default)]
    model_type: Option<String>,
    /// A multimodal checkpoint's language model (`Qwen3_5ForConditionalGeneration`).
    #[serde(default)]
    text_config: Option<TextConfig>,
    #[serde(default)]
    quantization: Option<Quantization>,
}

/// The `text_config` of a multimodal checkpoint: its language model's family.
#[derive(serde::Deserialize)]
struct TextConfig {
    #[serde(default)]
    model_type: Option<String>,
}

impl FolderConfig {
    /// The family's `model_type`: the file's own, or, where that is no family nnx builds (a
    /// multimodal wrapper), its `text_config`'s.
    pub(super) fn model_type(&self) -> Option<&str> {
        let text = self.text_config.as_ref().and_then(|text| text.model_type.as_deref());
        match self.model_type.as_deref() {
            Some(own) if super::super::family::from_model_type(own).is_some() || text.is_none() => Some(own),
            _ => text,
        }
    }
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
    pub(super) fn dtype(self) -> DType {
        match self {
            Kind::Dense(dtype) => dtype,
            Kind::Affine(_) | Kind::Seed => DType::BF16,
        }
    }
}

/// The source stem (`model.layers.0.self_attn.q_proj`) of each projection's model path
/// (`layers.0.attn.q`) under one naming.
pub(super) struct Stems(HashMap<String, String>);

impl Stems {
    pub(super) fn new<M: Module>(model: &M, naming: Naming) -> Stems {
        let mut stems = HashMap::new();
        crate::for_each_entry_named(model, naming, |slot, _| {
            if let (Some(path), Some(stem)) = (slot.name.strip_suffix(".weight"), slot.source.strip_suffix(".weight")) {
                stems.insert(path.to_string(), stem.to_string());
            }
        });
        Stems(stems)
    }

    /// The stem of `path`; the path itself when the model has no such projection.
    pub(super) fn of(&self, path: &str) -> String {
        self.0.get(path).cloned().unwrap_or_else(|| path.to_string())
    }
}

impl Files {
    /// The plan of importing into `dense`, or into the MLX affine or SEED layers over it, as
    /// [`Files::assemble`] builds them.
    #[allow(clippy::type_complexity)]
    pub(super) fn plan_folder<M: Module, A: Module, S: Module>(
        &self,
        dense: &M,
        kind: Kind,
        options: &ImportOptions,
        affine: impl FnOnce(&M, &dyn Fn(&str, &Linear) -> Result<QuantizedLinear>) -> Result<A>,
        seed: impl FnOnce(&M, &dyn Fn(&str, &Linear) -> Result<SeedLinear>) -> Result<S>,
    ) -> Result<crate::ImportPlan> {
        match kind {
            Kind::Seed => {
                let packed = seed(dense, &self.seed_layers(dense)?)?;
                self.archive.import_plan_with(&packed, "", &self.quantized_embedding()?)
            }
            Kind::Affine(spec) => {
                let meta = self.affine_meta(dense, spec)?;
                let quantized = affine(dense, &meta)?;
                self.archive.import_plan_with(&quantized, "", &self.quantized_embedding()?)
            }
            Kind::Dense(_) => self.archive.import_plan_with(dense, "", options),
        }
    }
}

impl Files {
    /// The dense model as it is, or with MLX affine layers over it (`affine` is the family's
    /// `map_weights::<Affine>`).
    #[allow(clippy::type_complexity)]
    pub(super) fn assemble<D: Device, T: Target<D>, M, A, S>(
        &self,
        dense: M,
        kind: Kind,
        options: &ImportOptions,
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
            Kind::Dense(_) => target.finish_with(dense, &self.archive, options),
        }
    }

    /// For `map_weights::<Seed>`: each projection of `dense` as the folder stores it (the
    /// import then checks every stream).
    pub(super) fn seed_layers<M: Module>(
        &self,
        dense: &M,
    ) -> Result<impl Fn(&str, &Linear) -> Result<SeedLinear> + use<M>> {
        let folder = QuantizedFolder::open(&self.path)?;
        let stems = Stems::new(dense, Naming::Transformers);
        Ok(move |path: &str, _: &Linear| folder.seed_linear(&stems.of(path)))
    }

    /// For `map_weights::<Affine>`: the meta MLX affine layer of each projection of `dense`,
    /// with the bits and group size the folder gives that module (mlx-lm's mixed precision
    /// writes per-module overrides in `quantization`; without one the streams' shapes say),
    /// else `default`; scales and biases in the dtype the folder stores them in.
    pub(super) fn affine_meta<M: Module>(
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
    pub(super) fn quantized_embedding(&self) -> Result<ImportOptions> {
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
    pub(super) fn folder_kind(&self, config: &FolderConfig) -> Result<Kind> {
        if self.archive.names().any(|name| name.ends_with(".seeds")) {
            return Ok(Kind::Seed);
        }
        if let Some(quantization) = &config.quantization {
            let (Some(bits), Some(group)) = (quantization.bits, quantization.group_size) else {
                return Err(super::super::decoder::unusable(
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
        // A published checkpoint's weights, decoded to f32, are rounded to this dtype as each
        // is imported (as the publisher's code rounds them to the scales' dtype).
        Ok(Kind::Dense(dtype))
    }
}
