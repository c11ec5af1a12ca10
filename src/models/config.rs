//! What the decoder configurations (Llama, Qwen2/3, Gemma 3) share: the rotary settings object
//! of `config.json`, the sizes each one checks, and [`DecoderConfig`], whose provided methods read
//! the head width, key/value heads, rotary base, scaling and context from them, so that a family
//! gives only its defaults and where it keeps its fields.

use super::Checks;
use super::decoder::{MAX_CONTEXT, MAX_HEAD_DIM, unusable};

/// The `rope_parameters` object of newer configs, and the `rope_scaling` object of older ones:
/// the rotary base and how the frequencies are scaled.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(remote = "Self")]
pub struct RopeParameters {
    /// Rotary base.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_theta: Option<f32>,
    /// The scaling: `default`, `linear`, `llama3`, ...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_type: Option<String>,
    /// The scaling under its older name (`type`).
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// The factor the context is stretched by.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub factor: Option<f64>,
    /// Llama 3: below this many wavelengths per original context, frequencies are divided by
    /// `factor`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub low_freq_factor: Option<f64>,
    /// Llama 3: above this many, they are kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub high_freq_factor: Option<f64>,
    /// Llama 3 and YaRN: the context the model was first trained for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub original_max_position_embeddings: Option<usize>,
    /// YaRN: the rotations per original context below which frequencies are kept (default 32).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub beta_fast: Option<f64>,
    /// YaRN: the rotations above which they are divided by `factor` (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub beta_slow: Option<f64>,
    /// YaRN: whether the ramp's ends are rounded to whole dimensions (default true, as
    /// llama.cpp always does).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub truncate: Option<bool>,
    /// YaRN: the factor cosines and sines are multiplied by (default `0.1 ln(factor) + 1`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attention_factor: Option<f64>,
    /// Every other field of the object, as read (within a bound).
    #[serde(flatten, skip_deserializing)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

super::extra::keeps_extra!(RopeParameters);

impl RopeParameters {
    /// The scaling's name: `rope_type`, else the older `type`.
    pub fn scaling(&self) -> Option<&str> {
        self.rope_type.as_deref().or(self.kind.as_deref())
    }

    /// The base `theta` scaled linearly by `factor` when given (as llama.cpp's hyperparameters
    /// say it), else unscaled.
    pub(crate) fn linear(theta: Option<f32>, factor: Option<f32>) -> RopeParameters {
        RopeParameters {
            rope_theta: theta,
            rope_type: Some(if factor.is_some() { "linear" } else { "default" }.into()),
            factor: factor.map(f64::from),
            ..RopeParameters::default()
        }
    }

    /// Checks a scaling in the object `field`: one nnx computes (`default`, `linear`,
    /// `llama3`, `yarn`), a finite positive `factor`, for Llama 3's finite positive frequency
    /// factors, the high one above the low one (the smoothing divides by their difference), and
    /// a positive original context; for YaRN's finite betas and attention factor.
    ///
    /// # Errors
    /// [`crate::Error::Config`] for another scaling, [`crate::Error::ConfigNumber`] or
    /// [`crate::Error::ConfigField`] naming the number at fault.
    pub(crate) fn check(&self, field: &str, checks: &Checks<'_>) -> crate::Result<()> {
        let number = |name: &str, value: f64| checks.finite_positive(&format!("{field}.{name}"), value);
        match self.scaling().unwrap_or("default") {
            "default" => Ok(()),
            "linear" => number("factor", self.factor.unwrap_or(1.0)),
            "llama3" => {
                let (low, high) = (self.low_freq_factor.unwrap_or(1.0), self.high_freq_factor.unwrap_or(4.0));
                number("factor", self.factor.unwrap_or(8.0))?;
                number("low_freq_factor", low)?;
                number("high_freq_factor", high)?;
                if high <= low {
                    return Err(crate::Error::ConfigNumber {
                        path: checks.path().to_path_buf(),
                        field: format!("{field}.high_freq_factor"),
                        found: high,
                        expected: "above `low_freq_factor`",
                    });
                }
                checks.positive(
                    &format!("{field}.original_max_position_embeddings"),
                    self.original_max_position_embeddings.unwrap_or(8192),
                )
            }
            "yarn" => {
                number("factor", self.factor.unwrap_or(1.0))?;
                number("beta_fast", self.beta_fast.unwrap_or(32.0))?;
                number("beta_slow", self.beta_slow.unwrap_or(1.0))?;
                number("attention_factor", self.attention_factor.unwrap_or(1.0))?;
                checks.positive(
                    &format!("{field}.original_max_position_embeddings"),
                    self.original_max_position_embeddings.unwrap_or(1),
                )
            }
            other => Err(unusable(
                checks.path(),
                format!(
                    "`{field}` asks for `{other}` rotary embeddings; nnx computes the `default`, `linear`, \
                     `llama3` and `yarn` ones: remove the scaling to run the model at its original context length"
                ),
            )),
        }
    }

    /// The divisor of each of the `head_dim / 2` rotary frequencies of a head turned by base
    /// `theta`: Llama 3's smoothed scaling, YaRN's blend (its original context `context` when
    /// the object gives none) or linear scaling, `None` unscaled. llama.cpp's converter writes
    /// Llama 3's numbers to a GGUF file as `rope_freqs.weight`.
    pub fn factors(&self, head_dim: usize, theta: f32, context: usize) -> Option<Vec<f32>> {
        match self.scaling()? {
            "yarn" => Some(self.yarn_factors(head_dim, theta, context)),
            "llama3" => Some(nnx_core::llama3_rope_factors(
                head_dim,
                theta,
                self.factor.unwrap_or(8.0) as f32,
                self.low_freq_factor.unwrap_or(1.0) as f32,
                self.high_freq_factor.unwrap_or(4.0) as f32,
                self.original_max_position_embeddings.unwrap_or(8192),
            )),
            "linear" => Some(vec![self.factor.unwrap_or(1.0) as f32; head_dim / 2]),
            _ => None,
        }
    }

    /// YaRN: pair `i` turns at `1 / divisor` of its unscaled frequency, the divisor blending
    /// from 1 (pairs that turn more than `beta_fast` times over the original context) to
    /// `factor` (fewer than `beta_slow` times) along a linear ramp, as transformers and
    /// llama.cpp compute it.
    fn yarn_factors(&self, head_dim: usize, theta: f32, context: usize) -> Vec<f32> {
        let factor = self.factor.unwrap_or(1.0);
        let original = self.original_max_position_embeddings.unwrap_or(context) as f64;
        let (dim, base) = (head_dim as f64, f64::from(theta));
        let corrected =
            |rotations: f64| dim * (original / (rotations * 2.0 * std::f64::consts::PI)).ln() / (2.0 * base.ln());
        let (mut low, mut high) = (corrected(self.beta_fast.unwrap_or(32.0)), corrected(self.beta_slow.unwrap_or(1.0)));
        if self.truncate.unwrap_or(true) {
            (low, high) = (low.floor(), high.ceil());
        }
        let (low, high) = (low.max(0.0), high.min(dim - 1.0));
        let span = if high == low { 0.001 } else { high - low };
        (0..head_dim / 2)
            .map(|pair| {
                let kept = 1.0 - ((pair as f64 - low) / span).clamp(0.0, 1.0);
                (1.0 / ((1.0 - kept) / factor + kept)) as f32
            })
            .collect()
    }

    /// The factor a scaling multiplies cosines and sines by: YaRN's `attention_factor`, else
    /// `0.1 ln(factor) + 1`; 1 for the others.
    pub fn attention_scale(&self) -> f32 {
        match self.scaling() {
            Some("yarn") => {
                let factor = self.factor.unwrap_or(1.0);
                let default = if factor > 1.0 { 0.1 * factor.ln() + 1.0 } else { 1.0 };
                self.attention_factor.unwrap_or(default) as f32
            }
            _ => 1.0,
        }
    }
}

/// The sizes of a decoder configuration as its file gives them (the optional ones absent when
/// it does not), which [`DecoderConfig`]'s provided methods complete and every family checks.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Dims {
    /// Vocabulary size.
    pub vocab: usize,
    /// Width of the residual stream.
    pub hidden: usize,
    /// Width of the MLP.
    pub inner: usize,
    /// Number of layers.
    pub layers: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads, when given.
    pub kv_heads: Option<usize>,
    /// Width of one head, when given.
    pub head_dim: Option<usize>,
    /// The longest sequence the model was trained for, when given.
    pub context: Option<usize>,
    /// The RMSNorm epsilon.
    pub eps: f32,
}

/// Where a configuration keeps the rotary settings of its global layers.
#[derive(Clone, Copy, Debug)]
pub struct Rope<'a> {
    /// The top-level `rope_theta` of older configs.
    pub theta: Option<f32>,
    /// The settings object of newer configs, with the field it is in (`rope_parameters`).
    pub parameters: Option<(&'static str, &'a RopeParameters)>,
    /// The `rope_scaling` object of older configs.
    pub scaling: Option<&'a RopeParameters>,
}

/// A decoder family's configuration: where it keeps its sizes and rotary settings, and its
/// defaults; the rest is read the same way for every family.
pub trait DecoderConfig {
    /// The context when the file gives none (transformers' default for the family).
    const DEFAULT_CONTEXT: usize;
    /// The global layers' rotary base when the file gives none.
    const DEFAULT_THETA: f32 = 10_000.0;

    /// The sizes as the file gives them.
    fn dims(&self) -> Dims;

    /// The global layers' rotary settings.
    fn rope(&self) -> Rope<'_>;

    /// Width of one head: `head_dim`, else `hidden_size / num_attention_heads`.
    fn head_dim(&self) -> usize {
        let dims = self.dims();
        dims.head_dim.unwrap_or(dims.hidden / dims.heads.max(1))
    }

    /// Key/value heads: `num_key_value_heads`, else the query heads.
    fn kv_heads(&self) -> usize {
        let dims = self.dims();
        dims.kv_heads.unwrap_or(dims.heads)
    }

    /// `max_position_embeddings`, else [`DecoderConfig::DEFAULT_CONTEXT`]; generation caps its
    /// cache there (rotary positions themselves have no limit).
    fn context_length(&self) -> usize {
        self.dims().context.unwrap_or(Self::DEFAULT_CONTEXT)
    }

    /// The global layers' rotary base: `rope_parameters.rope_theta`, else `rope_theta`, else
    /// [`DecoderConfig::DEFAULT_THETA`].
    fn theta(&self) -> f32 {
        let rope = self.rope();
        rope.parameters.and_then(|(_, settings)| settings.rope_theta).or(rope.theta).unwrap_or(Self::DEFAULT_THETA)
    }

    /// The global layers' settings that scale, with the field they are in: `rope_parameters`
    /// (newer configs) when it names a scaling, else `rope_scaling` (older ones).
    fn rope_scaling(&self) -> Option<(&'static str, &RopeParameters)> {
        let rope = self.rope();
        match rope.parameters {
            Some((field, settings)) if settings.scaling().is_some() => Some((field, settings)),
            _ => rope.scaling.map(|scaling| ("rope_scaling", scaling)),
        }
    }

    /// The divisor of each rotary frequency of the global layers (see
    /// [`RopeParameters::factors`]), `None` unscaled.
    fn rope_factors(&self) -> Option<Vec<f32>> {
        let (_, settings) = self.rope_scaling()?;
        settings.factors(self.head_dim(), self.theta(), self.context_length())
    }

    /// The factor the global layers' rotary embedding multiplies queries and keys by (YaRN's
    /// attention factor; 1 for the other scalings).
    fn rope_scale(&self) -> f32 {
        self.rope_scaling().map_or(1.0, |(_, settings)| settings.attention_scale())
    }
}

/// [`DecoderConfig`] for a configuration `$config` with transformers' field names
/// (`vocab_size`, `hidden_size`, `intermediate_size`, `num_hidden_layers`,
/// `num_attention_heads`, optional `num_key_value_heads`, `head_dim` and
/// `max_position_embeddings`, `rms_norm_eps`, and `rope_theta`, `rope_parameters`,
/// `rope_scaling`) and the family's defaults.
macro_rules! decoder_config {
    ($config:ty, context: $context:expr $(, theta: $theta:expr)?) => {
        impl $crate::models::DecoderConfig for $config {
            const DEFAULT_CONTEXT: usize = $context;
            $(const DEFAULT_THETA: f32 = $theta;)?

            fn dims(&self) -> $crate::models::Dims {
                $crate::models::Dims {
                    vocab: self.vocab_size,
                    hidden: self.hidden_size,
                    inner: self.intermediate_size,
                    layers: self.num_hidden_layers,
                    heads: self.num_attention_heads,
                    kv_heads: self.num_key_value_heads,
                    head_dim: self.head_dim,
                    context: self.max_position_embeddings,
                    eps: self.rms_norm_eps,
                }
            }

            fn rope(&self) -> $crate::models::Rope<'_> {
                let parameters = self.rope_parameters.as_ref().map(|rope| ("rope_parameters", rope));
                $crate::models::Rope { theta: self.rope_theta, parameters, scaling: self.rope_scaling.as_ref() }
            }
        }
    };
}
pub(crate) use decoder_config;

/// The checks every decoder configuration shares, so that nothing is ever sized from a value
/// that cannot make a model: sizes at least 1, the key/value heads dividing the query heads, an
/// even head width of at most [`MAX_HEAD_DIM`], a bounded layer count and context, addressable
/// weights (`vectors` hidden-sized vectors per layer: norms, biases), finite positive rotary
/// bases (the global one, and `thetas` named by their fields), a finite epsilon, and a rope
/// scaling nnx computes.
pub(crate) fn check<C: DecoderConfig>(
    config: &C,
    checks: &Checks<'_>,
    vectors: usize,
    thetas: &[(&'static str, f32)],
) -> crate::Result<()> {
    let dims = config.dims();
    checks.positive("vocab_size", dims.vocab)?;
    checks.positive("hidden_size", dims.hidden)?;
    checks.positive("intermediate_size", dims.inner)?;
    checks.positive("num_attention_heads", dims.heads)?;
    if let Some(kv_heads) = dims.kv_heads {
        checks.positive("num_key_value_heads", kv_heads)?;
        checks.divides("num_key_value_heads", kv_heads, ("num_attention_heads", dims.heads))?;
    }
    let width = match dims.head_dim {
        Some(head_dim) => {
            checks.positive("head_dim", head_dim)?;
            "head_dim"
        }
        None => {
            checks.divides("num_attention_heads", dims.heads, ("hidden_size", dims.hidden))?;
            "hidden_size / num_attention_heads"
        }
    };
    let head_dim = config.head_dim();
    checks.even(width, head_dim, "rotary position embeddings turn pairs of values")?;
    checks.at_most(width, head_dim, MAX_HEAD_DIM)?;
    checks.at_most("num_hidden_layers", dims.layers, super::MAX_LAYERS)?;
    if let Some(context) = dims.context {
        checks.positive("max_position_embeddings", context)?;
        checks.at_most("max_position_embeddings", context, MAX_CONTEXT)?;
    }
    checks.finite_non_negative("rms_norm_eps", dims.eps)?;
    checks.finite_positive("rope_theta", config.theta())?;
    for &(field, theta) in thetas {
        checks.finite_positive(field, theta)?;
    }
    let (heads, kv_heads, hidden, inner) = (dims.heads, config.kv_heads(), dims.hidden, dims.inner);
    checks.addressable(&[("num_attention_heads", heads), ("head_dim", head_dim)], 1, &[&[heads, head_dim]], &[])?;
    checks.addressable(
        &[
            ("vocab_size", dims.vocab),
            ("hidden_size", hidden),
            ("intermediate_size", inner),
            ("num_attention_heads", heads),
            ("head_dim", head_dim),
        ],
        dims.layers,
        &[&[2, hidden, heads, head_dim], &[2, hidden, kv_heads, head_dim], &[3, hidden, inner], &[vectors, hidden]],
        &[&[2, dims.vocab, hidden], &[1, hidden]],
    )?;
    match config.rope_scaling() {
        Some((field, settings)) => settings.check(field, checks),
        None => Ok(()),
    }
}

/// RMSNorm's epsilon when a configuration gives none.
pub(crate) fn default_epsilon() -> f32 {
    1e-6
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::gguf::{Metadata, Value};
    use crate::models::llama::LlamaConfig;

    fn llama(rope: serde_json::Value) -> LlamaConfig {
        let mut config = serde_json::json!({
            "vocab_size": 32, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "rope_theta": 500000.0,
        });
        config.as_object_mut().unwrap().extend(rope.as_object().unwrap().clone());
        serde_json::from_value(config).unwrap()
    }

    #[test]
    fn provided_methods_read_the_checked_shape() {
        let config = llama(serde_json::json!({}));
        assert_eq!((config.head_dim(), config.kv_heads(), config.context_length()), (16, 2, 2048));
        assert_eq!((config.theta(), config.rope_factors()), (500_000.0, None));
        // `rope_parameters` wins over the older fields, and its scaling over `rope_scaling`.
        let config = llama(serde_json::json!({
            "max_position_embeddings": 4096,
            "rope_parameters": {"rope_theta": 1000.0, "rope_type": "linear", "factor": 4.0},
            "rope_scaling": {"type": "linear", "factor": 2.0},
        }));
        assert_eq!((config.theta(), config.context_length()), (1000.0, 4096));
        assert_eq!(config.rope_factors(), Some(vec![4.0; 8]));
        let config = llama(serde_json::json!({
            "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 32},
        }));
        let expected = nnx_core::llama3_rope_factors(16, 500_000.0, 8.0, 1.0, 4.0, 32);
        assert_eq!(config.rope_scaling().map(|(field, _)| field), Some("rope_scaling"));
        assert_eq!(config.rope_factors(), Some(expected));
    }

    #[test]
    fn yarn_blends_kept_and_divided_frequencies_along_a_ramp() {
        let yarn: RopeParameters = serde_json::from_value(serde_json::json!({
            "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128,
            "beta_fast": 32.0, "beta_slow": 1.0,
        }))
        .unwrap();
        // head_dim 16, base 150000: the ramp runs from dimension -0.30 to 2.02, rounded to 0
        // and 3 (llama.cpp's rounding, transformers' default), else kept as it is.
        let truncated = yarn.factors(16, 150_000.0, 512).unwrap();
        assert_eq!(truncated.len(), 8);
        assert_eq!(truncated[0], 1.0);
        assert!((truncated[1] - 1.0 / (1.0 / 3.0 / 4.0 + 2.0 / 3.0)).abs() < 1e-6, "{truncated:?}");
        assert!(truncated[3..].iter().all(|&factor| factor == 4.0), "{truncated:?}");
        let exact = RopeParameters { truncate: Some(false), ..yarn.clone() }.factors(16, 150_000.0, 512).unwrap();
        assert!(exact[1] != truncated[1] && exact[3..] == truncated[3..], "{exact:?}");
        assert!((yarn.attention_scale() - (0.1 * 4f32.ln() + 1.0)).abs() < 1e-6);
    }

    #[test]
    fn a_scaling_nnx_does_not_compute_is_refused_by_name() {
        let path = Path::new("config.json");
        let config = llama(serde_json::json!({"rope_scaling": {"rope_type": "dynamic", "factor": 4.0}}));
        let error = config.check(path).unwrap_err().to_string();
        assert!(error.contains("`rope_scaling` asks for `dynamic`") && error.contains("config.json"), "{error}");
        let config = llama(serde_json::json!({
            "rope_parameters": {"rope_type": "llama3", "low_freq_factor": 4.0, "high_freq_factor": 1.0},
        }));
        assert!(matches!(
            config.check(path),
            Err(crate::Error::ConfigNumber { field, .. }) if field == "rope_parameters.high_freq_factor"
        ));
        let config = llama(serde_json::json!({"rope_parameters": {"rope_type": "linear", "factor": -1.0}}));
        assert!(config.check(path).is_err());
    }

    #[test]
    fn llama_gguf_reads_linear_rope_scaling() {
        let mut metadata = Metadata::new();
        metadata.set("general.architecture", Value::String("llama".into()));
        for (key, value) in
            [("block_count", 2u32), ("embedding_length", 64), ("feed_forward_length", 96), ("attention.head_count", 4)]
        {
            metadata.set(format!("llama.{key}"), Value::U32(value));
        }
        metadata.set("tokenizer.ggml.tokens", Value::Array(crate::gguf::Array::String(vec!["t".into(); 32])));
        assert_eq!(LlamaConfig::from_gguf(&metadata, true).unwrap().rope_factors(), None);
        metadata.set("llama.rope.scaling.type", Value::String("linear".into()));
        metadata.set("llama.rope.scaling.factor", Value::F32(2.0));
        assert_eq!(LlamaConfig::from_gguf(&metadata, true).unwrap().rope_factors(), Some(vec![2.0; 8]));
    }
}
