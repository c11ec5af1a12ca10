//! Gemma 3's text model (transformers' `Gemma3ForCausalLM`) as Hugging Face stores it and as
//! llama.cpp's converter writes it to GGUF: grouped-query attention with per-head query and key
//! norms, local layers that see a sliding window of keys with their own rotary base, global
//! layers with the (possibly scaled) long-context base, norms after attention and after the
//! MLP as well as before, a tanh-GELU gated MLP, embeddings scaled by `sqrt(hidden_size)` and
//! an optional final logit soft cap.
//!
//! Gemma's RMSNorm multiplies by `1 + w`; transformers checkpoints store `w`. nnx's norms hold
//! the multiplier, so every norm here imports with `offset = 1.0` (GGUF files store `1 + w`
//! already) and is kept in F32 whatever the model's dtype, as transformers computes it.

use std::path::Path;

use super::decoder::Mlp;
use super::decoder::{GgufKeys, Pass, Rotary, SLIDING, check_layer_types};
use super::{DecoderConfig, Dense, Project, RopeParameters, TokenEmbedding, Weights};
use crate::gguf::Metadata;
use crate::nn::{Init, Linear, RmsNorm};
use crate::quant::ggml::GgmlLinear;
use crate::{Compute, DType, Device, Host, Module, Tensor};

/// The fields of a Gemma 3 text `config.json` (`model_type` `gemma3_text`) that shape the
/// model; absent fields take transformers' defaults.
///
/// The fields nnx does not use are kept in [`extra`](Gemma3Config::extra), so a configuration
/// read and written again loses none of them.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(remote = "Self")]
pub struct Gemma3Config {
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Width of the residual stream.
    pub hidden_size: usize,
    /// Width of the MLP.
    pub intermediate_size: usize,
    /// Number of layers.
    pub num_hidden_layers: usize,
    /// Query heads.
    pub num_attention_heads: usize,
    /// Key/value heads (grouped-query attention; default 4).
    #[serde(default = "default_size::<4>")]
    pub num_key_value_heads: usize,
    /// Width of one head (default 256).
    #[serde(default = "default_size::<256>")]
    pub head_dim: usize,
    /// Attention scores are scaled by `query_pre_attn_scalar ** -0.5` (default 256).
    #[serde(default = "default_head_dim_f32")]
    pub query_pre_attn_scalar: f32,
    /// The keys a local layer sees, itself included (default 4096); `null` for none.
    #[serde(default = "default_window")]
    pub sliding_window: Option<usize>,
    /// `sliding_attention` or `full_attention`, one per layer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layer_types: Option<Vec<String>>,
    /// Without `layer_types`: layer `i` is global when `(i + 1) % pattern == 0` (default 6).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sliding_window_pattern: Option<usize>,
    /// The longest sequence the model was trained for (default 131072).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_position_embeddings: Option<usize>,
    /// RMSNorm epsilon.
    #[serde(default = "super::config::default_epsilon")]
    pub rms_norm_eps: f32,
    /// Whether `lm_head` is the token embedding (default true; the checkpoint then has no
    /// `lm_head`).
    #[serde(default = "default_true")]
    pub tie_word_embeddings: bool,
    /// Whether the attention projections have biases.
    #[serde(default)]
    pub attention_bias: bool,
    /// The global layers' rotary base (older configs; default 1e6).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_theta: Option<f32>,
    /// The local layers' rotary base (older configs; default 1e4).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_local_base_freq: Option<f32>,
    /// Rotary settings per layer type (transformers 5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_parameters: Option<Gemma3RopeParameters>,
    /// `logits = tanh(logits / c) * c` when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub final_logit_softcapping: Option<f32>,
    /// Gemma 2's cap of attention scores; Gemma 3 has none, and a configuration that sets it
    /// is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attn_logit_softcapping: Option<f32>,
    /// The global layers' rotary scaling (older configs; newer ones put it in
    /// `rope_parameters`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_scaling: Option<RopeParameters>,
    /// Every other field of the file (`model_type`, `hidden_activation`, token ids, ...), as
    /// read (within a bound): nnx does not use them and writes them back.
    #[serde(flatten, skip_deserializing)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

super::extra::keeps_extra!(Gemma3Config);

/// The `rope_parameters` object of a Gemma 3 configuration: one set of rotary settings per
/// layer type.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(remote = "Self")]
pub struct Gemma3RopeParameters {
    /// The global layers' settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub full_attention: Option<RopeParameters>,
    /// The local layers' settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sliding_attention: Option<RopeParameters>,
    /// Every other field of the object, as read (within a bound).
    #[serde(flatten, skip_deserializing)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

super::extra::keeps_extra!(Gemma3RopeParameters);

fn default_size<const N: usize>() -> usize {
    N
}

fn default_head_dim_f32() -> f32 {
    256.0
}

fn default_window() -> Option<usize> {
    Some(4096)
}

fn default_true() -> bool {
    true
}

/// llama.cpp's sliding-window pattern when the file gives none.
const DEFAULT_PATTERN: usize = 6;

impl Gemma3Config {
    /// Reads a `config.json` and [checks](Gemma3Config::check) it.
    ///
    /// # Errors
    /// [`crate::Error::Io`], [`crate::Error::Config`], or [`crate::Error::ConfigField`] naming
    /// the first field that cannot make a model.
    pub fn from_file(path: impl AsRef<Path>) -> crate::Result<Gemma3Config> {
        super::read_config(path.as_ref(), Gemma3Config::check)
    }

    /// The configuration llama.cpp's hyperparameters describe (`general.architecture`
    /// `gemma3`), read as llama.cpp reads them: `gemma3.block_count`, `.embedding_length`,
    /// `.feed_forward_length`, `.attention.head_count` (and `_kv`), `.attention.key_length`,
    /// `.attention.layer_norm_rms_epsilon`, `.context_length`, `.final_logit_softcapping`, the
    /// length of `tokenizer.ggml.tokens`, and:
    ///
    /// - local layers only when `.attention.sliding_window` is set (and not 0): then the
    ///   layers `.attention.sliding_window_pattern` marks (an array with one flag per layer,
    ///   or a period `n`: layer `i` is local unless `i % n == n - 1`; 6 when absent);
    /// - global layers turn by `.rope.freq_base` with `.rope.scaling.*` (linear), local ones
    ///   by `.rope.freq_base_swa` (10000 when absent), unscaled;
    /// - attention scores are scaled by `1/sqrt(head_dim)`, except for the 62-layer model
    ///   (27B), scaled by `1/sqrt(hidden / heads)`: GGUF files do not carry
    ///   `query_pre_attn_scalar`, and this is llama.cpp's rule.
    ///
    /// The metadata does not say whether the output projection is the token embedding: `tied`
    /// says whether the file lacks `output.weight` (llama.cpp then uses the embedding).
    ///
    /// # Errors
    /// [`crate::Error::NoEntry`] naming a key that is missing, [`crate::Error::Config`] for
    /// another architecture or rope scaling, and the errors of [`Gemma3Config::check`].
    pub fn from_gguf(metadata: &Metadata, tied: bool) -> crate::Result<Gemma3Config> {
        Gemma3Config::from_gguf_at(metadata, tied, &GgufKeys::origin())
    }

    /// [`Gemma3Config::from_gguf`] with errors naming `origin`, the file.
    pub(crate) fn from_gguf_at(metadata: &Metadata, tied: bool, origin: &Path) -> crate::Result<Gemma3Config> {
        let keys = GgufKeys::new(metadata, &["gemma3"], "`Gemma3Config::from_gguf`", origin)?;
        let hidden_size = keys.required_size("embedding_length")?;
        let num_attention_heads = keys.required_size("attention.head_count")?;
        let num_hidden_layers = keys.required_size("block_count")?;
        let layer_types = keys.layer_types(DEFAULT_PATTERN)?;
        let head_dim = keys.size("attention.key_length")?.unwrap_or(hidden_size / num_attention_heads.max(1));
        let theta = |suffix: &str| keys.number(suffix).map(|theta| Some(theta.unwrap_or(10_000.0)));
        let rope_parameters = Gemma3RopeParameters {
            full_attention: Some(keys.rope(theta("rope.freq_base")?)?),
            sliding_attention: Some(RopeParameters::linear(theta("rope.freq_base_swa")?, None)),
            extra: serde_json::Map::new(),
        };
        let query_pre_attn_scalar =
            if num_hidden_layers == 62 { hidden_size / num_attention_heads.max(1) } else { head_dim } as f32;
        let config = Gemma3Config {
            vocab_size: keys.vocab_size()?,
            hidden_size,
            intermediate_size: keys.required_size("feed_forward_length")?,
            num_hidden_layers,
            num_attention_heads,
            num_key_value_heads: keys.size("attention.head_count_kv")?.unwrap_or(num_attention_heads),
            head_dim,
            query_pre_attn_scalar,
            sliding_window: keys.size("attention.sliding_window")?.filter(|&window| window > 0),
            layer_types: Some(layer_types),
            sliding_window_pattern: None,
            max_position_embeddings: keys.size("context_length")?,
            rms_norm_eps: keys.required_number("attention.layer_norm_rms_epsilon")?,
            tie_word_embeddings: tied,
            attention_bias: false,
            rope_theta: None,
            rope_local_base_freq: None,
            rope_parameters: Some(rope_parameters),
            final_logit_softcapping: keys.number("final_logit_softcapping")?.filter(|&cap| cap != 0.0),
            attn_logit_softcapping: None,
            rope_scaling: None,
            extra: serde_json::Map::new(),
        };
        config.check(keys.path())?;
        Ok(config)
    }

    /// Checks that the configuration makes a model: every size at least 1, the key/value heads
    /// dividing the query heads, an even head width, at most [`MAX_LAYERS`](super::MAX_LAYERS)
    /// layers, weights small enough to address, one `layer_types` entry per layer, positive
    /// windows, scalars and caps, rope scalings nnx computes (`default`, `linear`, `llama3`), and no
    /// `attn_logit_softcapping` (Gemma 3 does not cap attention scores). `path` names the file
    /// in the error.
    ///
    /// # Errors
    /// [`crate::Error::ConfigField`] naming the first field at fault, or
    /// [`crate::Error::Config`] for a rope scaling nnx does not compute or an unknown layer
    /// type.
    pub fn check(&self, path: &Path) -> crate::Result<()> {
        let checks = super::Checks::new(path);
        let field = |field: &str, found: f32, rule: crate::error::ConfigRule| crate::Error::ConfigField {
            path: path.to_path_buf(),
            field: field.to_string(),
            found: found.max(0.0).ceil() as u64,
            rule,
        };
        if let Some(cap) = self.attn_logit_softcapping {
            // Gemma 2 capped attention scores; Gemma 3 replaced that with the query and key
            // norms, and transformers' converter asserts the field is null.
            return Err(field("attn_logit_softcapping", cap, crate::error::ConfigRule::AtMost { limit: 0 }));
        }
        super::config::check(self, &checks, 6, &[("rope_local_base_freq", self.rope_of(true).0)])?;
        checks.finite_positive("query_pre_attn_scalar", self.query_pre_attn_scalar)?;
        if let Some(cap) = self.final_logit_softcapping {
            checks.finite_positive("final_logit_softcapping", cap)?;
        }
        if let Some(window) = self.sliding_window {
            checks.positive("sliding_window", window)?;
        }
        if let Some(pattern) = self.sliding_window_pattern {
            checks.positive("sliding_window_pattern", pattern)?;
        }
        if let Some(types) = &self.layer_types {
            check_layer_types(types, self.num_hidden_layers, path)?;
        }
        match self.local_rope() {
            Some(local) if local.scaling().is_some() => local.check("rope_parameters.sliding_attention", &checks),
            _ => Ok(()),
        }
    }

    /// Whether layer `layer` is local (sees a sliding window of keys): its `layer_types`
    /// entry, else every layer but each `sliding_window_pattern`-th.
    pub fn is_sliding(&self, layer: usize) -> bool {
        match &self.layer_types {
            Some(types) => types.get(layer).is_some_and(|kind| kind == SLIDING),
            None => !(layer + 1).is_multiple_of(self.sliding_window_pattern.unwrap_or(DEFAULT_PATTERN).max(1)),
        }
    }

    /// The keys layer `layer` sees: `Some(window)` when it is local, `None` for all of them.
    pub fn window(&self, layer: usize) -> Option<usize> {
        self.sliding_window.filter(|_| self.is_sliding(layer))
    }

    fn local_rope(&self) -> Option<&RopeParameters> {
        self.rope_parameters.as_ref()?.sliding_attention.as_ref()
    }

    /// The rotary base and frequency divisors of local (`sliding`) or global layers: the
    /// global ones as [`DecoderConfig`] reads them, the local ones from
    /// `rope_parameters.sliding_attention`, else `rope_local_base_freq` (1e4), never scaled by
    /// the older `rope_scaling`.
    pub fn rope_of(&self, sliding: bool) -> (f32, Option<Vec<f32>>) {
        if !sliding {
            return (self.theta(), self.rope_factors());
        }
        let local = self.local_rope();
        let theta = local.and_then(|rope| rope.rope_theta).or(self.rope_local_base_freq).unwrap_or(10_000.0);
        (theta, local.and_then(|rope| rope.factors(self.head_dim, theta, self.context_length())))
    }
}

impl DecoderConfig for Gemma3Config {
    const DEFAULT_CONTEXT: usize = 131_072;
    const DEFAULT_THETA: f32 = 1_000_000.0;

    fn dims(&self) -> super::Dims {
        super::Dims {
            vocab: self.vocab_size,
            hidden: self.hidden_size,
            inner: self.intermediate_size,
            layers: self.num_hidden_layers,
            heads: self.num_attention_heads,
            kv_heads: Some(self.num_key_value_heads),
            head_dim: Some(self.head_dim),
            context: self.max_position_embeddings,
            eps: self.rms_norm_eps,
        }
    }

    fn rope(&self) -> super::Rope<'_> {
        let full = self.rope_parameters.as_ref().and_then(|rope| rope.full_attention.as_ref());
        let parameters = full.map(|rope| ("rope_parameters.full_attention", rope));
        super::Rope { theta: self.rope_theta, parameters, scaling: self.rope_scaling.as_ref() }
    }
}

/// Grouped-query self-attention with per-head query and key norms.
#[derive(Module, Clone, Debug)]
pub struct Attention<D: Device = Host, W: Weights = Dense> {
    /// `hidden -> heads * head_dim`.
    #[nnx(from = "q_proj", gguf = "attn_q")]
    pub q: W::Layer<D>,
    /// `hidden -> kv_heads * head_dim`.
    #[nnx(from = "k_proj", gguf = "attn_k")]
    pub k: W::Layer<D>,
    /// `hidden -> kv_heads * head_dim`.
    #[nnx(from = "v_proj", gguf = "attn_v")]
    pub v: W::Layer<D>,
    /// `heads * head_dim -> hidden`.
    #[nnx(from = "o_proj", gguf = "attn_output")]
    pub o: W::Layer<D>,
    /// RMSNorm of each query head (over `head_dim`), before the rotary embedding.
    #[nnx(gguf = "attn_q_norm", offset = 1.0)]
    pub q_norm: RmsNorm<D>,
    /// RMSNorm of each key head (over `head_dim`), before the rotary embedding.
    #[nnx(gguf = "attn_k_norm", offset = 1.0)]
    pub k_norm: RmsNorm<D>,
}

/// One decoder layer: attention and the MLP, each between a norm before and a norm after.
#[derive(Module, Clone, Debug)]
pub struct Layer<D: Device = Host, W: Weights = Dense> {
    /// Norm before attention.
    #[nnx(from = "input_layernorm", gguf = "attn_norm", offset = 1.0)]
    pub attn_norm: RmsNorm<D>,
    /// Self-attention.
    #[nnx(from = "self_attn", gguf = "")]
    pub attn: Attention<D, W>,
    /// Norm of the attention's output, before the residual sum.
    #[nnx(from = "post_attention_layernorm", gguf = "post_attention_norm", offset = 1.0)]
    pub post_attn_norm: RmsNorm<D>,
    /// Norm before the MLP.
    #[nnx(from = "pre_feedforward_layernorm", gguf = "ffn_norm", offset = 1.0)]
    pub mlp_norm: RmsNorm<D>,
    /// Feed-forward network (tanh GELU).
    #[nnx(gguf = "")]
    pub mlp: Mlp<D, W>,
    /// Norm of the MLP's output, before the residual sum.
    #[nnx(from = "post_feedforward_layernorm", gguf = "post_ffw_norm", offset = 1.0)]
    pub post_mlp_norm: RmsNorm<D>,
}

/// Gemma 3's text model with its language-model head. `W` is how the projections (and an
/// untied head) are stored: [`Dense`] as published, or packed by
/// [`Quantize::quantize`](super::Quantize::quantize) or [`Gemma3::map_weights`].
#[derive(Module, Clone, Debug)]
pub struct Gemma3<D: Device = Host, W: Weights = Dense> {
    /// Token embeddings (scaled by `sqrt(hidden_size)` on the way in).
    #[nnx(from = "model.embed_tokens", gguf = "token_embd")]
    pub embed: TokenEmbedding<D>,
    /// The layers.
    #[nnx(from = "model.layers", gguf = "blk")]
    pub layers: Vec<Layer<D, W>>,
    /// Final norm.
    #[nnx(from = "model.norm", gguf = "output_norm", offset = 1.0)]
    pub norm: RmsNorm<D>,
    /// Output projection; `None` when it is the token embedding
    /// ([`Gemma3Config::tie_word_embeddings`]).
    #[nnx(gguf = "output")]
    pub lm_head: Option<W::Layer<D>>,
    /// The configuration.
    #[nnx(skip)]
    pub config: Gemma3Config,
}

impl Gemma3 {
    /// A model of `config` with its projections and embedding in `dtype` and its norms (the
    /// multipliers `1 + w`) in F32; [`Init::Meta`] allocates nothing, for importing.
    pub fn new(config: &Gemma3Config, dtype: DType, init: Init) -> Gemma3 {
        let (hidden, head_dim) = (config.hidden_size, config.head_dim);
        let (q_width, kv_width) = (config.num_attention_heads * head_dim, config.num_key_value_heads * head_dim);
        let bias = config.attention_bias;
        let linear = |input: usize, output: usize, bias: bool, init: Init| {
            Linear::builder(input, output).bias(bias).dtype(dtype).init(init).build()
        };
        let norm = |dim: usize| RmsNorm::builder(dim).eps(config.rms_norm_eps).dtype(DType::F32).init(init).build();
        let layers = (0..config.num_hidden_layers)
            .map(|layer| {
                let init = init.at(&format!("layers.{layer}"));
                Layer {
                    attn_norm: norm(hidden),
                    attn: Attention {
                        q: linear(hidden, q_width, bias, init.at("attn.q")),
                        k: linear(hidden, kv_width, bias, init.at("attn.k")),
                        v: linear(hidden, kv_width, bias, init.at("attn.v")),
                        o: linear(q_width, hidden, bias, init.at("attn.o")),
                        q_norm: norm(head_dim),
                        k_norm: norm(head_dim),
                    },
                    post_attn_norm: norm(hidden),
                    mlp_norm: norm(hidden),
                    mlp: Mlp {
                        gate: linear(hidden, config.intermediate_size, false, init.at("mlp.gate")),
                        up: linear(hidden, config.intermediate_size, false, init.at("mlp.up")),
                        down: linear(config.intermediate_size, hidden, false, init.at("mlp.down")),
                    },
                    post_mlp_norm: norm(hidden),
                }
            })
            .collect();
        Gemma3 {
            embed: TokenEmbedding::new(config.vocab_size, hidden, dtype, init.at("embed")),
            layers,
            norm: norm(hidden),
            lm_head: (!config.tie_word_embeddings)
                .then(|| linear(hidden, config.vocab_size, false, init.at("lm_head"))),
            config: config.clone(),
        }
    }
}

impl<D: Device, W: Weights> Gemma3<D, W>
where
    Tensor<D>: Compute,
    W::Layer<D>: Project<D>,
    GgmlLinear<D>: Project<D>,
{
    fn run(&self, ids: &[u32], mut pass: Pass<'_, D>) -> crate::Result<Tensor<D>> {
        let config = &self.config;
        let (heads, kv_heads, head_dim) = (config.num_attention_heads, config.num_key_value_heads, config.head_dim);
        let [global, local] = [false, true].map(|sliding| {
            let (theta, factors) = config.rope_of(sliding);
            let scale = match sliding {
                true => config.local_rope().map_or(1.0, RopeParameters::attention_scale),
                false => config.rope_scale(),
            };
            Rotary { theta, factors, scale }
        });
        // The attention kernel divides scores by sqrt(head_dim); Gemma divides them by
        // sqrt(query_pre_attn_scalar).
        let query_scale = (head_dim as f32 / config.query_pre_attn_scalar).sqrt();
        // transformers multiplies by `hidden_size ** 0.5` rounded to the activations' dtype.
        let embed_scale = (config.hidden_size as f64).sqrt() as f32;
        let mut h = self.embed.forward(ids)?.scale(embed_scale)?;
        for (index, layer) in self.layers.iter().enumerate() {
            let attn = &layer.attn;
            let rotary = if config.is_sliding(index) { &local } else { &global };
            let x = layer.attn_norm.forward(&h)?;
            let [q, k, v] = super::project_all([&attn.q, &attn.k, &attn.v], &x)?;
            let q = pass.heads(&q, heads, head_dim, Some(&attn.q_norm), Some(rotary))?;
            let q = if query_scale == 1.0 { q } else { q.scale(query_scale)? };
            let k = pass.heads(&k, kv_heads, head_dim, Some(&attn.k_norm), Some(rotary))?;
            let v = pass.heads(&v, kv_heads, head_dim, None, None)?;
            let context = pass.attend(index, &q, k, v, config.window(index))?;
            h = h.add(&layer.post_attn_norm.forward(&attn.o.project(&context)?)?)?;
            let x = layer.mlp.forward(&layer.mlp_norm.forward(&h)?, Compute::gelu_tanh)?;
            h = h.add(&layer.post_mlp_norm.forward(&x)?)?;
        }
        let x = self.norm.forward(&pass.finish(h)?)?;
        let logits = match &self.lm_head {
            Some(head) => head.project(&x)?,
            None => self.embed.project(&x)?,
        };
        match config.final_logit_softcapping {
            Some(cap) => logits.scale(1.0 / cap)?.tanh()?.scale(cap),
            None => Ok(logits),
        }
    }
}

super::decoder::causal_lm!(Gemma3);

/// A folder of `Gemma3ForCausalLM` (`model_type` `gemma3_text`), its projections in the dtype
/// of its weights and its norms in F32.
impl crate::Pretrained for Gemma3 {
    type Config = Gemma3Config;
    const MODEL_TYPE: &'static str = "gemma3_text";
    const ARCHITECTURE: &'static str = "Gemma3ForCausalLM";

    fn config(&self) -> &Gemma3Config {
        &self.config
    }

    fn build(config: &Gemma3Config, dtype: DType) -> crate::Result<Gemma3> {
        Ok(Gemma3::new(config, dtype, Init::Meta))
    }

    fn check_config(config: &Gemma3Config, path: &Path) -> crate::Result<()> {
        config.check(path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::{Array, Value};

    fn config() -> Gemma3Config {
        serde_json::from_value(serde_json::json!({
            "model_type": "gemma3_text",
            "vocab_size": 32,
            "hidden_size": 16,
            "intermediate_size": 24,
            "num_hidden_layers": 3,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 8,
            "query_pre_attn_scalar": 16,
            "sliding_window": 2,
            "sliding_window_pattern": 3,
            "final_logit_softcapping": 5.0,
            "rope_parameters": {
                "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e6},
                "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
            },
        }))
        .unwrap()
    }

    #[test]
    fn layers_and_rotary_follow_the_configuration() {
        let config = config();
        assert_eq!((0..3).map(|layer| config.is_sliding(layer)).collect::<Vec<_>>(), [true, true, false]);
        assert_eq!((config.window(0), config.window(2)), (Some(2), None));
        assert_eq!(config.rope_of(false), (1e6, Some(vec![4.0; 4])));
        assert_eq!(config.rope_of(true), (1e4, None));
        let model = Gemma3::new(&config, DType::BF16, Init::Seeded(1));
        assert_eq!((model.layers[0].attn_norm.weight.dtype(), model.embed.weight.dtype()), (DType::F32, DType::BF16));
        assert!(model.lm_head.is_none());
    }

    #[test]
    fn the_cache_gives_the_logits_of_the_full_pass() {
        let model = Gemma3::new(&config(), DType::F32, Init::Seeded(5));
        let ids = [1u32, 5, 9, 2, 30, 7];
        let full = model.forward(&ids).unwrap().to_vec::<f32>().unwrap();
        assert!(full.iter().all(|logit| logit.abs() <= 5.0), "the logits are capped");
        let mut cache = super::super::CausalLm::new_cache(&model, 1, 8).unwrap();
        model.forward_with_cache(&ids[..3], &mut cache).unwrap();
        model.forward_with_cache(&ids[3..5], &mut cache).unwrap();
        let last = model.forward_with_cache(&ids[5..], &mut cache).unwrap().to_vec::<f32>().unwrap();
        let difference = last.iter().zip(&full[5 * 32..]).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
        assert!(difference < 1e-5, "{difference}");
    }

    #[test]
    fn attention_softcapping_is_refused() {
        let mut config = config();
        config.attn_logit_softcapping = Some(50.0);
        let error = config.check(Path::new("config.json")).unwrap_err();
        assert!(
            matches!(&error, crate::Error::ConfigField { field, .. } if field == "attn_logit_softcapping"),
            "{error}"
        );
    }

    #[test]
    fn gguf_metadata_makes_the_configuration() {
        let mut metadata = Metadata::new();
        metadata.set("general.architecture", Value::String("gemma3".into()));
        for (key, value) in [
            ("block_count", 7u32),
            ("embedding_length", 16),
            ("feed_forward_length", 24),
            ("attention.head_count", 4),
            ("attention.head_count_kv", 2),
            ("attention.key_length", 8),
            ("attention.sliding_window", 4),
            ("context_length", 64),
        ] {
            metadata.set(format!("gemma3.{key}"), Value::U32(value));
        }
        metadata.set("gemma3.attention.layer_norm_rms_epsilon", Value::F32(1e-6));
        metadata.set("gemma3.rope.freq_base", Value::F32(1e6));
        metadata.set("gemma3.rope.scaling.type", Value::String("linear".into()));
        metadata.set("gemma3.rope.scaling.factor", Value::F32(8.0));
        let error = Gemma3Config::from_gguf(&metadata, true).unwrap_err();
        assert!(matches!(&error, crate::Error::NoEntry { name, .. } if name == "tokenizer.ggml.tokens"), "{error}");
        metadata.set("tokenizer.ggml.tokens", Value::Array(Array::String(vec!["a".into(); 32])));
        let config = Gemma3Config::from_gguf(&metadata, true).unwrap();
        let sliding: Vec<bool> = (0..7).map(|layer| config.is_sliding(layer)).collect();
        assert_eq!(sliding, [true, true, true, true, true, false, true]);
        assert_eq!(config.rope_of(false), (1e6, Some(vec![8.0; 4])));
        assert_eq!(config.rope_of(true), (1e4, None));
        assert_eq!((config.query_pre_attn_scalar, config.window(0), config.window(5)), (8.0, Some(4), None));
        metadata.set("gemma3.attention.sliding_window_pattern", Value::Array(Array::Bool(vec![false; 7])));
        assert!(!Gemma3Config::from_gguf(&metadata, true).unwrap().is_sliding(0));
    }
}
