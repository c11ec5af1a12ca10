//! gpt-oss (transformers' `GptOssForCausalLM`, llama.cpp's `gpt-oss`): grouped-query attention
//! with biases and a learned sink logit per head, YaRN rotary scaling, sliding-window layers
//! alternating with full ones, and on every layer a mixture of experts with biases, routed by a
//! biased router (softmax over the chosen logits) through gpt-oss's clamped SwiGLU.

use std::path::Path;

use super::decoder::{GgufKeys, Pass, Rotary, SLIDING, check_layer_types};
use super::moe::{Activation, Experts, Routing, routed};
use super::{DecoderConfig, Dense, Project, RopeParameters, TokenEmbedding, Weights};
use crate::gguf::Metadata;
use crate::nn::{Init, Linear, RmsNorm};
use crate::quant::ggml::GgmlLinear;
use crate::{Compute, DType, Device, Host, Module, Tensor};

/// The fields of a gpt-oss `config.json` (`model_type` `gpt_oss`) that shape the model.
///
/// The fields nnx does not use are kept in [`extra`](GptOssConfig::extra), so a configuration
/// read and written again loses none of them.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(remote = "Self")]
pub struct GptOssConfig {
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Width of the residual stream.
    pub hidden_size: usize,
    /// Width of one expert's MLP.
    pub intermediate_size: usize,
    /// Number of layers.
    pub num_hidden_layers: usize,
    /// Query heads.
    pub num_attention_heads: usize,
    /// Key/value heads; defaults to the query heads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_key_value_heads: Option<usize>,
    /// Width of one head; defaults to `hidden_size / num_attention_heads`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head_dim: Option<usize>,
    /// The longest sequence the model was trained for (131072 when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_position_embeddings: Option<usize>,
    /// RMSNorm epsilon.
    #[serde(default = "super::config::default_epsilon")]
    pub rms_norm_eps: f32,
    /// Whether `lm_head` is the token embedding.
    #[serde(default)]
    pub tie_word_embeddings: bool,
    /// Whether the attention projections have biases (gpt-oss's do).
    #[serde(default = "yes")]
    pub attention_bias: bool,
    /// Rotary base (older configs; 150000 when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_theta: Option<f32>,
    /// Rotary settings: the base and YaRN's scaling.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_parameters: Option<RopeParameters>,
    /// Rotary scaling (older configs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_scaling: Option<RopeParameters>,
    /// The keys a sliding layer sees, itself included (128).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sliding_window: Option<usize>,
    /// `sliding_attention` or `full_attention`, one per layer (without it the even layers
    /// slide).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layer_types: Option<Vec<String>>,
    /// The experts of each layer.
    #[serde(alias = "num_experts")]
    pub num_local_experts: usize,
    /// The experts each token is routed to.
    pub num_experts_per_tok: usize,
    /// The clamp of the experts' SwiGLU (default 7).
    #[serde(default = "default_limit")]
    pub swiglu_limit: f32,
    /// The slope of the experts' SwiGLU sigmoid (default 1.702).
    #[serde(default = "default_alpha")]
    pub swiglu_alpha: f32,
    /// Every other field of the file, as read (within a bound): nnx does not use them and
    /// writes them back.
    #[serde(flatten, skip_deserializing)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

super::extra::keeps_extra!(GptOssConfig);

fn yes() -> bool {
    true
}

fn default_limit() -> f32 {
    7.0
}

fn default_alpha() -> f32 {
    1.702
}

impl GptOssConfig {
    /// Reads a `config.json` and [checks](GptOssConfig::check) it.
    ///
    /// # Errors
    /// [`crate::Error::Io`], [`crate::Error::Config`], or [`crate::Error::ConfigField`] naming
    /// the first field that cannot make a model.
    pub fn from_file(path: impl AsRef<Path>) -> crate::Result<GptOssConfig> {
        super::read_config(path.as_ref(), GptOssConfig::check)
    }

    /// The configuration llama.cpp's hyperparameters describe (`general.architecture`
    /// `gpt-oss`): the decoder's keys, `.expert_count`, `.expert_used_count`,
    /// `.expert_feed_forward_length`, `.attention.sliding_window` (the even layers slide, as
    /// llama.cpp has it) and YaRN's `.rope.scaling.*`. `tied` says whether the file lacks
    /// `output.weight`.
    ///
    /// # Errors
    /// [`crate::Error::NoEntry`] naming a key that is missing, [`crate::Error::Config`] for
    /// another architecture, and the errors of [`GptOssConfig::check`].
    pub fn from_gguf(metadata: &Metadata, tied: bool) -> crate::Result<GptOssConfig> {
        GptOssConfig::from_gguf_at(metadata, tied, &GgufKeys::origin())
    }

    /// [`GptOssConfig::from_gguf`] with errors naming `origin`, the file.
    pub(crate) fn from_gguf_at(metadata: &Metadata, tied: bool, origin: &Path) -> crate::Result<GptOssConfig> {
        let keys = GgufKeys::new(metadata, &["gpt-oss"], "`GptOssConfig::from_gguf`", origin)?;
        let config = GptOssConfig {
            vocab_size: keys.vocab_size()?,
            hidden_size: keys.required_size("embedding_length")?,
            intermediate_size: keys.required_size("expert_feed_forward_length")?,
            num_hidden_layers: keys.required_size("block_count")?,
            num_attention_heads: keys.required_size("attention.head_count")?,
            num_key_value_heads: keys.size("attention.head_count_kv")?,
            head_dim: keys.size("attention.key_length")?,
            max_position_embeddings: keys.size("context_length")?,
            rms_norm_eps: keys.required_number("attention.layer_norm_rms_epsilon")?,
            tie_word_embeddings: tied,
            attention_bias: true,
            rope_theta: None,
            rope_parameters: Some(keys.rope(Some(keys.number("rope.freq_base")?.unwrap_or(150_000.0)))?),
            rope_scaling: None,
            sliding_window: keys.size("attention.sliding_window")?.filter(|&window| window > 0),
            layer_types: Some(keys.layer_types(2)?),
            num_local_experts: keys.required_size("expert_count")?,
            num_experts_per_tok: keys.required_size("expert_used_count")?,
            swiglu_limit: 7.0,
            swiglu_alpha: 1.702,
            extra: serde_json::Map::new(),
        };
        config.check(keys.path())?;
        Ok(config)
    }

    /// Checks that the configuration makes a model: the decoder's shape, one `layer_types`
    /// entry per layer, a positive window, at least one expert per token and no more than
    /// there are, finite positive SwiGLU constants, and addressable experts. `path` names the
    /// file in the error.
    ///
    /// # Errors
    /// [`crate::Error::ConfigField`] naming the first field at fault, [`crate::Error::Config`]
    /// for a rope scaling nnx does not compute.
    pub fn check(&self, path: &Path) -> crate::Result<()> {
        let checks = super::Checks::new(path);
        super::config::check(self, &checks, 4, &[])?;
        if let Some(types) = &self.layer_types {
            check_layer_types(types, self.num_hidden_layers, path)?;
        }
        if let Some(window) = self.sliding_window {
            checks.positive("sliding_window", window)?;
        }
        let (experts, inner, hidden) = (self.num_local_experts, self.intermediate_size, self.hidden_size);
        checks.positive("num_local_experts", experts)?;
        checks.positive("num_experts_per_tok", self.num_experts_per_tok)?;
        checks.at_most("num_experts_per_tok", self.num_experts_per_tok, experts)?;
        checks.finite_positive("swiglu_limit", self.swiglu_limit)?;
        checks.finite_positive("swiglu_alpha", self.swiglu_alpha)?;
        let sizes = [("num_local_experts", experts), ("intermediate_size", inner), ("hidden_size", hidden)];
        checks.addressable(&sizes, self.num_hidden_layers, &[&[3, experts, inner, hidden]], &[])
    }

    /// The keys layer `layer` sees: `Some(window)` when it slides (its `layer_types` entry,
    /// else an even layer), `None` for all of them.
    pub fn window(&self, layer: usize) -> Option<usize> {
        let sliding = match &self.layer_types {
            Some(types) => types.get(layer).is_some_and(|kind| kind == SLIDING),
            None => layer.is_multiple_of(2),
        };
        self.sliding_window.filter(|_| sliding)
    }
}

super::config::decoder_config!(GptOssConfig, context: 131_072, theta: 150_000.0);

/// Grouped-query self-attention with biased projections and a sink logit per head.
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
    /// One logit per query head beside its scores, whose share of the softmax goes to no
    /// value (F32 `[heads]`).
    #[nnx(gguf = "attn_sinks.weight")]
    pub sinks: Tensor<D>,
}

/// The mixture of experts of one layer.
#[derive(Module, Clone, Debug)]
pub struct Mlp<D: Device = Host, W: Weights = Dense> {
    /// The router: `hidden -> experts` logits, with a bias.
    #[nnx(gguf = "ffn_gate_inp")]
    pub router: W::Layer<D>,
    /// Gate projections with biases, `hidden -> inner` each.
    #[nnx(gguf = "ffn_gate_exps")]
    pub gate: Experts<D>,
    /// Up projections with biases, `hidden -> inner` each.
    #[nnx(gguf = "ffn_up_exps")]
    pub up: Experts<D>,
    /// Down projections with biases, `inner -> hidden` each.
    #[nnx(gguf = "ffn_down_exps")]
    pub down: Experts<D>,
}

/// One decoder layer.
#[derive(Module, Clone, Debug)]
pub struct Layer<D: Device = Host, W: Weights = Dense> {
    /// Norm before attention.
    #[nnx(from = "input_layernorm", gguf = "attn_norm")]
    pub attn_norm: RmsNorm<D>,
    /// Self-attention.
    #[nnx(from = "self_attn", gguf = "")]
    pub attn: Attention<D, W>,
    /// Norm before the experts.
    #[nnx(from = "post_attention_layernorm", gguf = "post_attention_norm")]
    pub mlp_norm: RmsNorm<D>,
    /// The experts.
    #[nnx(from = "mlp", gguf = "")]
    pub mlp: Mlp<D, W>,
}

/// gpt-oss with its language-model head. `W` is how the attention projections, the routers and
/// the head are stored; the experts are [`Experts`] stacks (from a GGUF file, its blocks as
/// they are, MXFP4 included).
#[derive(Module, Clone, Debug)]
pub struct GptOss<D: Device = Host, W: Weights = Dense> {
    /// Token embeddings.
    #[nnx(from = "model.embed_tokens", gguf = "token_embd")]
    pub embed: TokenEmbedding<D>,
    /// The layers.
    #[nnx(from = "model.layers", gguf = "blk")]
    pub layers: Vec<Layer<D, W>>,
    /// Final norm.
    #[nnx(from = "model.norm", gguf = "output_norm")]
    pub norm: RmsNorm<D>,
    /// Output projection; `None` when it is the token embedding.
    #[nnx(gguf = "output")]
    pub lm_head: Option<W::Layer<D>>,
    /// The configuration.
    #[nnx(skip)]
    pub config: GptOssConfig,
}

impl GptOss {
    /// A model of `config` with its projections and embedding in `dtype` and its sinks in F32;
    /// [`Init::Meta`] allocates nothing, for importing.
    pub fn new(config: &GptOssConfig, dtype: DType, init: Init) -> GptOss {
        let (hidden, head_dim, inner) = (config.hidden_size, config.head_dim(), config.intermediate_size);
        let (heads, experts) = (config.num_attention_heads, config.num_local_experts);
        let (q_width, kv_width) = (heads * head_dim, config.kv_heads() * head_dim);
        let bias = config.attention_bias;
        let linear = |input: usize, output: usize, bias: bool, init: Init| {
            Linear::builder(input, output).bias(bias).dtype(dtype).init(init).build()
        };
        let norm = || RmsNorm::builder(hidden).eps(config.rms_norm_eps).dtype(dtype).init(init).build();
        let stack = |out, input, init: Init| Experts::new(experts, out, input, dtype, init).with_bias(dtype);
        let layers = (0..config.num_hidden_layers)
            .map(|layer| {
                let init = init.at(&format!("layers.{layer}"));
                Layer {
                    attn_norm: norm(),
                    attn: Attention {
                        q: linear(hidden, q_width, bias, init.at("attn.q")),
                        k: linear(hidden, kv_width, bias, init.at("attn.k")),
                        v: linear(hidden, kv_width, bias, init.at("attn.v")),
                        o: linear(q_width, hidden, bias, init.at("attn.o")),
                        sinks: match init {
                            Init::Meta => Tensor::meta(DType::F32, &[heads]),
                            _ => Tensor::zeros(DType::F32, &[heads]),
                        },
                    },
                    mlp_norm: norm(),
                    mlp: Mlp {
                        router: linear(hidden, experts, true, init.at("mlp.router")),
                        gate: stack(inner, hidden, init.at("mlp.gate")),
                        up: stack(inner, hidden, init.at("mlp.up")),
                        down: stack(hidden, inner, init.at("mlp.down")),
                    },
                }
            })
            .collect();
        GptOss {
            embed: TokenEmbedding::new(config.vocab_size, hidden, dtype, init.at("embed")),
            layers,
            norm: norm(),
            lm_head: (!config.tie_word_embeddings)
                .then(|| linear(hidden, config.vocab_size, false, init.at("lm_head"))),
            config: config.clone(),
        }
    }
}

impl<D: Device, W: Weights> GptOss<D, W>
where
    Tensor<D>: Compute,
    W::Layer<D>: Project<D>,
    GgmlLinear<D>: Project<D>,
{
    fn run(&self, ids: &[u32], mut pass: Pass<'_, D>) -> crate::Result<Tensor<D>> {
        let config = &self.config;
        let (heads, kv_heads, head_dim) = (config.num_attention_heads, config.kv_heads(), config.head_dim());
        let rotary = Rotary { theta: config.theta(), factors: config.rope_factors(), scale: config.rope_scale() };
        let routing = Routing { top_k: config.num_experts_per_tok, normalize: true };
        let activation = Activation::ClampedSwiglu { alpha: config.swiglu_alpha, limit: config.swiglu_limit };
        let mut h = self.embed.forward(ids)?;
        for (index, layer) in self.layers.iter().enumerate() {
            let attn = &layer.attn;
            let x = layer.attn_norm.forward(&h)?;
            let [q, k, v] = super::project_all([&attn.q, &attn.k, &attn.v], &x)?;
            let q = pass.heads(&q, heads, head_dim, None, Some(&rotary))?;
            let k = pass.heads(&k, kv_heads, head_dim, None, Some(&rotary))?;
            let v = pass.heads(&v, kv_heads, head_dim, None, None)?;
            let sinks = Compute::to_f32_vec(&attn.sinks)?;
            let context = pass.attend_with_sinks(index, &q, k, v, config.window(index), &sinks)?;
            h = h.add(&attn.o.project(&context)?)?;
            let x = layer.mlp_norm.forward(&h)?;
            let mlp = &layer.mlp;
            let logits = Compute::to_f32_vec(&mlp.router.project(&x)?)?;
            h = h.add(&routed(&logits, &x, [&mlp.gate, &mlp.up, &mlp.down], routing, activation)?)?;
        }
        let x = self.norm.forward(&pass.finish(h)?)?;
        match &self.lm_head {
            Some(head) => head.project(&x),
            None => self.embed.project(&x),
        }
    }
}

super::decoder::causal_lm!(GptOss);
