//! Published model architectures written with the derive's import attributes, so that their
//! Hugging Face checkpoints import as they are: [`bert`], [`gpt2`] and [`llama`].

pub mod bert;
mod config;
mod decoder;
mod delta_net;
mod extra;
pub mod family;
pub mod gemma3;
pub mod gemma4;
pub mod gguf;
pub mod gpt2;
pub mod gpt_oss;
pub mod llama;
#[cfg(feature = "text")]
mod load;
pub mod lora;
pub mod moe;
pub mod qwen;
pub mod qwen35;
#[cfg(feature = "text")]
pub mod sentence;

#[cfg(feature = "text")]
pub use load::{LoadDevice, LoadOptions, LoadedModel, adapter_for_gguf, import_plan, load, load_with};

pub use config::{DecoderConfig, Dims, Rope, RopeParameters};

/// The trait generation drives, defined beside it in [`crate::generate`] and implemented by
/// every model here.
pub use crate::generate::CausalLm;
pub(crate) use crate::generate::{cached_rows, check_capacity};

use std::path::Path;

use nnx_core::quant::ggml::{GgmlLinear, GgmlType};
use nnx_core::{Compute, DType, Device, Host, Tensor};

use crate::Module;

// The weight kinds and the projection contract live beside the layers they describe, in
// `nnx-core`; the models name them here.
pub use nnx_core::{Affine, Dense, Ggml, MapWeights, Project, Quantize, Seed, Weights};

/// The token embedding of a decoder: a float table `[vocab, hidden]`, or (from a GGUF file)
/// the packed ggml rows `U8 [vocab, row_bytes]` exactly as the file stores them. A packed
/// table decodes only the rows a pass looks up, and a tied head multiplies the same mapped
/// blocks, so the largest tensor of a small model is never held twice or widened to f32.
#[derive(Module, Clone, Debug)]
pub struct TokenEmbedding<D: Device = Host> {
    /// The table: float `[vocab, hidden]`, or U8 `[vocab, row_bytes]` when [`Self::ggml`] is
    /// set.
    pub weight: Tensor<D>,
    /// The ggml type of the rows and their width in values, when the table is packed.
    #[nnx(skip)]
    pub ggml: Option<(GgmlType, usize)>,
}

impl TokenEmbedding {
    /// A float table of `vocab` rows of `hidden` values.
    pub fn new(vocab: usize, hidden: usize, dtype: DType, init: crate::nn::Init) -> TokenEmbedding {
        let table = crate::nn::Embedding::builder(vocab, hidden).dtype(dtype).init(init).build();
        TokenEmbedding { weight: table.weight, ggml: None }
    }

    /// A meta table of `vocab` rows of `hidden` values packed as `ty`, for importing the
    /// blocks of a GGUF entry as they are.
    ///
    /// # Errors
    /// [`Error::GgmlRow`](crate::Error::GgmlRow) when `hidden` is not a whole number of `ty`'s
    /// blocks.
    pub fn packed_meta(vocab: usize, hidden: usize, ty: GgmlType) -> crate::Result<TokenEmbedding> {
        let row_bytes = ty.row_bytes(hidden).ok_or(crate::Error::GgmlRow {
            op: "TokenEmbedding::packed_meta",
            ty: ty.name(),
            block_size: ty.block_size(),
            values: hidden,
            bytes: 0,
        })?;
        Ok(TokenEmbedding { weight: Tensor::meta(DType::U8, &[vocab, row_bytes]), ggml: Some((ty, hidden)) })
    }
}

impl<D: Device> TokenEmbedding<D> {
    /// The tensor a key/value cache takes its dtype and device from: the float table, or
    /// `float` (an f32 norm weight) beside a packed one.
    pub(crate) fn cache_like<'a>(&'a self, float: &'a Tensor<D>) -> &'a Tensor<D> {
        if self.ggml.is_some() { float } else { &self.weight }
    }
}

impl<D: Device> TokenEmbedding<D>
where
    Tensor<D>: Compute,
    GgmlLinear<D>: Project<D>,
{
    /// The rows `ids` as `[ids.len(), hidden]` in f32. Packed rows are decoded one by one
    /// (each a view of the table; on a GPU, a read of that row).
    ///
    /// # Errors
    /// [`Error::IndexOutOfRange`](crate::Error::IndexOutOfRange) for an id past the table; a
    /// packed row that does not decode.
    pub fn forward(&self, ids: &[u32]) -> crate::Result<Tensor<D>> {
        let Some((ty, hidden)) = self.ggml else { return Compute::embedding(&self.weight, ids) };
        let rows = self.weight.shape()[0];
        let mut values = vec![0f32; ids.len() * hidden];
        for (position, (&id, out)) in ids.iter().zip(values.chunks_exact_mut(hidden.max(1))).enumerate() {
            let id = id as usize;
            if id >= rows {
                let shape = self.weight.shape().to_vec();
                return Err(crate::Error::IndexOutOfRange { op: "TokenEmbedding::forward", id, position, rows, shape });
            }
            let row = Compute::to_host(&Compute::narrow(&self.weight, 0, id, 1)?)?.contiguous();
            let bytes = row.as_slice::<u8>()?.ok_or(crate::Error::Meta { op: "TokenEmbedding::forward" })?;
            nnx_core::quant::ggml::dequantize_row(ty, bytes, out)?;
        }
        let host = Tensor::from_vec(values, &[ids.len(), hidden])?;
        crate::Placer::new(self.weight.device()).tensor(&host)
    }

    /// `x` times the table's transpose: a head tied to this embedding, `[.., vocab]` in f32.
    /// A packed table multiplies its blocks in place (see
    /// [`GgmlLinear::forward`](nnx_core::quant::ggml::GgmlLinear::forward)).
    ///
    /// # Errors
    /// A last axis of `x` that is not the table's width.
    pub fn project(&self, x: &Tensor<D>) -> crate::Result<Tensor<D>> {
        match self.ggml {
            Some((ty, hidden)) => GgmlLinear::new(self.weight.clone(), None, ty, hidden)?.project(x),
            None => Compute::linear(x, &self.weight, None),
        }
    }
}

/// The outputs of `N` layers on one input, through [`Project::project_many`].
pub(crate) fn project_all<D: Device, L: Project<D>, const N: usize>(
    layers: [&L; N],
    x: &Tensor<D>,
) -> crate::Result<[Tensor<D>; N]> {
    let outputs = L::project_many(&layers, x)?;
    Ok(outputs.try_into().unwrap_or_else(|_| unreachable!("one output per layer")))
}

/// Reads and parses a `config.json`, then runs the configuration's `check` on it, so that no
/// model is ever built from fields that cannot make one.
pub(crate) fn read_config<T: serde::de::DeserializeOwned>(
    path: &Path,
    check: impl FnOnce(&T, &Path) -> crate::Result<()>,
) -> crate::Result<T> {
    let text = nnx_io::config::read_text(path)?;
    let config = serde_json::from_str(&text).map_err(|error| crate::Error::Config {
        path: path.to_path_buf(),
        problem: crate::error::ConfigProblem::NotModelConfig { message: error.to_string() },
    })?;
    check(&config, path)?;
    Ok(config)
}

/// Where a multimodal checkpoint keeps its language model's entries.
const LANGUAGE_MODEL: &str = "model.language_model.";

/// A folder's entries as a `*ForCausalLM` checkpoint names them: a multimodal checkpoint (Qwen3.5
/// and Gemma 4 as published, `*ForConditionalGeneration`) keeps its language model under
/// `model.language_model.` and its vision and audio towers beside it; the text model is read
/// as llama.cpp's converter reads it, the towers left out. Other archives come back as they are.
///
/// # Errors
/// [`crate::Error::Duplicate`] when a renamed entry meets one of the same name.
pub(crate) fn text_model_view(archive: crate::Archive) -> crate::Result<crate::Archive> {
    if archive.gguf_metadata().is_some() || !archive.names().any(|name| name.starts_with(LANGUAGE_MODEL)) {
        return Ok(archive);
    }
    const TOWERS: [&str; 5] =
        ["model.visual.", "model.vision_tower.", "model.audio_tower.", "model.embed_vision.", "model.embed_audio."];
    archive.renamed(|name| match name.strip_prefix(LANGUAGE_MODEL) {
        Some(rest) => Some(format!("model.{rest}")),
        None if TOWERS.iter().any(|tower| name.starts_with(tower)) => None,
        None => Some(name.to_string()),
    })
}

/// [`read_config`] of a language model's configuration that a multimodal checkpoint may wrap:
/// its `text_config` when it has one (with the file's `tie_word_embeddings` where the text
/// model's lacks it), else the file itself.
pub(crate) fn read_text_config<T: serde::de::DeserializeOwned>(
    path: &Path,
    check: impl FnOnce(&T, &Path) -> crate::Result<()>,
) -> crate::Result<T> {
    /// A multimodal file: the language model's fields in `text_config`.
    #[derive(serde::Deserialize)]
    struct Wrapped {
        text_config: Option<serde_json::Value>,
        #[serde(default)]
        tie_word_embeddings: Option<bool>,
    }
    let wrapped: Wrapped = read_config(path, |_, _| Ok(()))?;
    let Some(mut text) = wrapped.text_config else {
        return read_config(path, check);
    };
    if let (Some(object), Some(tied)) = (text.as_object_mut(), wrapped.tie_word_embeddings) {
        object.entry("tie_word_embeddings").or_insert(tied.into());
    }
    let config: T = serde_json::from_value(text).map_err(|error| crate::Error::Config {
        path: path.to_path_buf(),
        problem: crate::error::ConfigProblem::NotModelConfig { message: format!("`text_config`: {error}") },
    })?;
    check(&config, path)?;
    Ok(config)
}

/// The most layers a configuration may ask for. The largest published models have a few
/// hundred; a value far past that is a damaged file, and building it would exhaust memory.
pub const MAX_LAYERS: usize = 1 << 12;

/// The most elements the weights of one model may hold: their bytes in f64 must be
/// addressable.
const MAX_ELEMENTS: u128 = (isize::MAX as u128) / 8;

/// Checks of the fields of one `config.json`; each failure is [`crate::Error::ConfigField`]
/// naming the file and the field.
pub(crate) struct Checks<'a> {
    path: &'a Path,
}

impl<'a> Checks<'a> {
    pub(crate) fn new(path: &'a Path) -> Checks<'a> {
        Checks { path }
    }

    /// The file the checks name.
    pub(crate) fn path(&self) -> &'a Path {
        self.path
    }

    fn fail(&self, field: &str, found: usize, rule: crate::error::ConfigRule) -> crate::Error {
        crate::Error::ConfigField { path: self.path.to_path_buf(), field: field.to_string(), found: found as u64, rule }
    }

    /// `value` is at least 1.
    pub(crate) fn positive(&self, field: &str, value: usize) -> crate::Result<()> {
        if value == 0 { Err(self.fail(field, value, crate::error::ConfigRule::Positive)) } else { Ok(()) }
    }

    /// `value` is at most `limit`.
    pub(crate) fn at_most(&self, field: &str, value: usize, limit: usize) -> crate::Result<()> {
        if value > limit {
            Err(self.fail(field, value, crate::error::ConfigRule::AtMost { limit: limit as u64 }))
        } else {
            Ok(())
        }
    }

    /// `value` (already checked positive) divides the field `whole`.
    pub(crate) fn divides(&self, field: &str, value: usize, whole: (&'static str, usize)) -> crate::Result<()> {
        if whole.1.is_multiple_of(value) {
            Ok(())
        } else {
            Err(self.fail(field, value, crate::error::ConfigRule::Divides { field: whole.0, value: whole.1 as u64 }))
        }
    }

    /// `value` is even, for `reason`.
    pub(crate) fn even(&self, field: &str, value: usize, reason: &'static str) -> crate::Result<()> {
        if value.is_multiple_of(2) {
            Ok(())
        } else {
            Err(self.fail(field, value, crate::error::ConfigRule::Even { reason }))
        }
    }

    /// `value` is a finite number above 0 (a rotary base, a scaling factor).
    pub(crate) fn finite_positive(&self, field: &str, value: impl Into<f64>) -> crate::Result<()> {
        let value = value.into();
        if value > 0.0 && value.is_finite() {
            Ok(())
        } else {
            Err(self.number(field, value, "a finite number above 0"))
        }
    }

    /// `value` is a finite number of at least 0 (an epsilon).
    pub(crate) fn finite_non_negative(&self, field: &str, value: impl Into<f64>) -> crate::Result<()> {
        let value = value.into();
        if value >= 0.0 && value.is_finite() {
            Ok(())
        } else {
            Err(self.number(field, value, "a finite number of at least 0"))
        }
    }

    fn number(&self, field: &str, found: f64, expected: &'static str) -> crate::Error {
        crate::Error::ConfigNumber { path: self.path.to_path_buf(), field: field.to_string(), found, expected }
    }

    /// The weights hold `layers` times the products of `per_layer`, plus the products of
    /// `shared`, elements: that must be addressable. A failure names the largest of `fields`.
    pub(crate) fn addressable(
        &self,
        fields: &[(&'static str, usize)],
        layers: usize,
        per_layer: &[&[usize]],
        shared: &[&[usize]],
    ) -> crate::Result<()> {
        let sum = |terms: &[&[usize]]| -> u128 {
            terms
                .iter()
                .map(|factors| factors.iter().fold(1u128, |product, &factor| product.saturating_mul(factor as u128)))
                .fold(0u128, u128::saturating_add)
        };
        let total = sum(per_layer).saturating_mul(layers as u128).saturating_add(sum(shared));
        if total <= MAX_ELEMENTS {
            return Ok(());
        }
        let (field, value) = fields.iter().copied().max_by_key(|&(_, value)| value).unwrap_or(("", 0));
        Err(self.fail(field, value, crate::error::ConfigRule::Addressable))
    }
}
