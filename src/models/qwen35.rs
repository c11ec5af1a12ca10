//! Qwen3.5 and Qwen3.6 (transformers' `Qwen3_5ForCausalLM` and `Qwen3_5MoeForCausalLM`,
//! llama.cpp's `qwen35` and `qwen35moe`): a hybrid decoder whose layers are mostly Gated
//! DeltaNet linear attention (three of every four in the published models), with a gated
//! full-attention layer between them (per-head query and key norms, rotary on a fraction of
//! each head, the output scaled by `sigmoid` of a gate the query projection also gives), and a
//! SwiGLU MLP or (Qwen3.5-MoE) routed experts beside a shared expert behind a sigmoid gate.
//!
//! The norms multiply by `1 + w` and checkpoints store `w`, so they import with `offset = 1.0`
//! (llama.cpp's converter adds the one; the DeltaNet's own gated norm multiplies by `w`).
//! The two formats also store the DeltaNet differently, which [`Qwen35::gguf_layout`] records:
//! llama.cpp's converter reorders the value heads so that value head `h` reads key head
//! `h % key_heads` (transformers' read `h / (value_heads / key_heads)`), and stores
//! `-exp(A_log)` where transformers stores `A_log`.

use std::path::Path;

use super::decoder::{GgufKeys, Pass, Rotary, unusable};
use super::delta_net::{self, DeltaDims};
use super::moe::{Moe, Routing};
use super::{DecoderConfig, Dense, Project, RopeParameters, TokenEmbedding, Weights};
use crate::generate::LayerMemory;
use crate::gguf::Metadata;
use crate::nn::{Init, Linear, RmsNorm};
use crate::quant::ggml::GgmlLinear;
use crate::{Compute, DType, Device, Host, Module, Tensor};

pub use super::decoder::Mlp;

/// The `layer_types` entry of a Gated DeltaNet layer.
pub const LINEAR: &str = "linear_attention";

/// The fields of a Qwen3.5 text `config.json` (`model_type` `qwen3_5_text` or
/// `qwen3_5_moe_text`; a `qwen3_5` / `qwen3_5_moe` file's `text_config`) that shape the model.
///
/// The fields nnx does not use are kept in [`extra`](Qwen35Config::extra), so a configuration
/// read and written again loses none of them.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(remote = "Self")]
pub struct Qwen35Config {
    /// `qwen3_5_text` or `qwen3_5_moe_text` (experts in place of the MLP).
    pub model_type: String,
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Width of the residual stream.
    pub hidden_size: usize,
    /// Width of the MLP (dense models).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub intermediate_size: Option<usize>,
    /// Number of layers.
    pub num_hidden_layers: usize,
    /// Query heads of the full-attention layers.
    pub num_attention_heads: usize,
    /// Key/value heads of the full-attention layers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_key_value_heads: Option<usize>,
    /// Width of a full-attention head (256 when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head_dim: Option<usize>,
    /// The longest sequence the model was trained for (32768 when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_position_embeddings: Option<usize>,
    /// RMSNorm epsilon.
    #[serde(default = "super::config::default_epsilon")]
    pub rms_norm_eps: f32,
    /// Whether `lm_head` is the token embedding.
    #[serde(default)]
    pub tie_word_embeddings: bool,
    /// Rotary base (older configs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_theta: Option<f32>,
    /// Rotary settings: the base, `partial_rotary_factor` and (for images) `mrope_section`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_parameters: Option<RopeParameters>,
    /// Rotary scaling (older configs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_scaling: Option<RopeParameters>,
    /// The fraction of each head that rotary turns (older configs keep it here; 0.25).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partial_rotary_factor: Option<f32>,
    /// `linear_attention` or `full_attention`, one per layer (without it, every
    /// `full_attention_interval`-th layer is full).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layer_types: Option<Vec<String>>,
    /// Without `layer_types`: layer `i` is full when `(i + 1) % interval == 0` (default 4).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub full_attention_interval: Option<usize>,
    /// Taps of the DeltaNet's causal convolution (4).
    #[serde(default = "default_kernel")]
    pub linear_conv_kernel_dim: usize,
    /// Width of a DeltaNet key head (128).
    #[serde(default = "default_linear_dim")]
    pub linear_key_head_dim: usize,
    /// Width of a DeltaNet value head (128).
    #[serde(default = "default_linear_dim")]
    pub linear_value_head_dim: usize,
    /// DeltaNet key heads (16).
    #[serde(default = "default_key_heads")]
    pub linear_num_key_heads: usize,
    /// DeltaNet value heads (32), a multiple of the key heads.
    #[serde(default = "default_value_heads")]
    pub linear_num_value_heads: usize,
    /// Qwen3.5-MoE: the experts of each layer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_experts: Option<usize>,
    /// Qwen3.5-MoE: the experts each token is routed to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_experts_per_tok: Option<usize>,
    /// Qwen3.5-MoE: the width of one expert's MLP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moe_intermediate_size: Option<usize>,
    /// Qwen3.5-MoE: the width of the shared expert's MLP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared_expert_intermediate_size: Option<usize>,
    /// The layers of the multi-token-prediction head, which nnx keeps in the files but does
    /// not run (GGUF: `{arch}.nextn_predict_layers`, the last blocks).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtp_num_hidden_layers: Option<usize>,
    /// Every other field of the file, as read (within a bound): nnx does not use them and
    /// writes them back.
    #[serde(flatten, skip_deserializing)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

super::extra::keeps_extra!(Qwen35Config);

fn default_kernel() -> usize {
    4
}

fn default_linear_dim() -> usize {
    128
}

fn default_key_heads() -> usize {
    16
}

fn default_value_heads() -> usize {
    32
}

impl Qwen35Config {
    /// Reads a `config.json` (a text model's, or a published multimodal checkpoint's, whose
    /// `text_config` describes the language model) and [checks](Qwen35Config::check) it.
    ///
    /// # Errors
    /// [`crate::Error::Io`], [`crate::Error::Config`], or [`crate::Error::ConfigField`] naming
    /// the first field that cannot make a model.
    pub fn from_file(path: impl AsRef<Path>) -> crate::Result<Qwen35Config> {
        super::read_text_config(path.as_ref(), Qwen35Config::check)
    }

    /// The configuration llama.cpp's hyperparameters describe (`general.architecture` `qwen35`
    /// or `qwen35moe`): the decoder's keys, `.rope.dimension_count` (the rotated width),
    /// `.ssm.conv_kernel`, `.ssm.state_size` (key head width), `.ssm.group_count` (key heads),
    /// `.ssm.time_step_rank` (value heads), `.ssm.inner_size` (their width in all),
    /// `.attention.recurrent_layers` (else `.full_attention_interval`) and the expert keys.
    /// `tied` says whether the file lacks `output.weight`.
    ///
    /// # Errors
    /// [`crate::Error::NoEntry`] naming a key that is missing, [`crate::Error::Config`] for
    /// another architecture, and the errors of [`Qwen35Config::check`].
    pub fn from_gguf(metadata: &Metadata, tied: bool) -> crate::Result<Qwen35Config> {
        Qwen35Config::from_gguf_at(metadata, tied, &GgufKeys::origin())
    }

    /// [`Qwen35Config::from_gguf`] with errors naming `origin`, the file.
    pub(crate) fn from_gguf_at(metadata: &Metadata, tied: bool, origin: &Path) -> crate::Result<Qwen35Config> {
        let keys = GgufKeys::new(metadata, &["qwen35", "qwen35moe"], "`Qwen35Config::from_gguf`", origin)?;
        let moe = keys.arch() == "qwen35moe";
        let blocks = keys.required_size("block_count")?;
        super::Checks::new(keys.path()).at_most(&keys.key("block_count"), blocks, super::MAX_LAYERS)?;
        // llama.cpp's converter keeps the multi-token-prediction head as the last blocks; the
        // model is the blocks before it.
        let predict = keys.size("nextn_predict_layers")?.unwrap_or(0);
        let Some(layers) = blocks.checked_sub(predict).filter(|&layers| layers > 0) else {
            return Err(unusable(
                keys.path(),
                format!(
                    "`{}` ({predict}) leaves none of the {blocks} blocks (`{}`) to the model",
                    keys.key("nextn_predict_layers"),
                    keys.key("block_count")
                ),
            ));
        };
        let head_dim = keys.size("attention.key_length")?;
        let heads = keys.required_size("attention.head_count")?;
        let hidden = keys.required_size("embedding_length")?;
        let width = head_dim.unwrap_or(hidden / heads.max(1));
        let rotated = keys.size("rope.dimension_count")?.unwrap_or(width);
        let (value_heads, inner) = (keys.required_size("ssm.time_step_rank")?, keys.required_size("ssm.inner_size")?);
        let recurrent = match keys.value("attention.recurrent_layers") {
            Some(crate::gguf::Value::Array(array)) if array.len() == blocks => {
                (0..layers).map(|at| array.get(at).and_then(|flag| flag.as_bool()).unwrap_or(false)).collect()
            }
            _ => {
                let interval = keys.size("full_attention_interval")?.unwrap_or(4).max(1);
                (0..layers).map(|layer| (layer + 1) % interval != 0).collect::<Vec<bool>>()
            }
        };
        let mut rope = keys.rope(keys.number("rope.freq_base")?)?;
        rope.extra.insert("partial_rotary_factor".into(), serde_json::json!(rotated as f64 / width.max(1) as f64));
        let config = Qwen35Config {
            model_type: if moe { "qwen3_5_moe_text" } else { "qwen3_5_text" }.to_string(),
            vocab_size: keys.vocab_size()?,
            hidden_size: hidden,
            intermediate_size: if moe { None } else { Some(keys.required_size("feed_forward_length")?) },
            num_hidden_layers: layers,
            num_attention_heads: heads,
            num_key_value_heads: keys.size("attention.head_count_kv")?,
            head_dim,
            max_position_embeddings: keys.size("context_length")?,
            rms_norm_eps: keys.required_number("attention.layer_norm_rms_epsilon")?,
            tie_word_embeddings: tied,
            rope_theta: None,
            rope_parameters: Some(rope),
            rope_scaling: None,
            partial_rotary_factor: None,
            layer_types: Some(recurrent.iter().map(|&linear| if linear { LINEAR } else { FULL }.to_string()).collect()),
            full_attention_interval: None,
            linear_conv_kernel_dim: keys.required_size("ssm.conv_kernel")?,
            linear_key_head_dim: keys.required_size("ssm.state_size")?,
            linear_value_head_dim: inner / value_heads.max(1),
            linear_num_key_heads: keys.required_size("ssm.group_count")?,
            linear_num_value_heads: value_heads,
            num_experts: if moe { Some(keys.required_size("expert_count")?) } else { None },
            num_experts_per_tok: if moe { Some(keys.required_size("expert_used_count")?) } else { None },
            moe_intermediate_size: if moe { Some(keys.required_size("expert_feed_forward_length")?) } else { None },
            shared_expert_intermediate_size: keys.size("expert_shared_feed_forward_length")?.filter(|_| moe),
            mtp_num_hidden_layers: (predict > 0).then_some(predict),
            extra: serde_json::Map::new(),
        };
        if value_heads == 0 || inner % value_heads != 0 {
            return Err(unusable(
                keys.path(),
                format!(
                    "`{}` ({inner}) is not a whole number of {value_heads} value heads",
                    keys.key("ssm.inner_size")
                ),
            ));
        }
        config.check(keys.path())?;
        Ok(config)
    }

    /// Checks that the configuration makes a model: the decoder's shape, one `layer_types`
    /// entry per layer (each `linear_attention` or `full_attention`), a rotated width that is
    /// an even part of the head, DeltaNet heads that divide evenly, and (MoE) experts that can
    /// be routed to and addressed. `path` names the file in the error.
    ///
    /// # Errors
    /// [`crate::Error::ConfigField`] naming the first field at fault, [`crate::Error::Config`]
    /// for another `model_type` or a rope scaling nnx does not compute.
    pub fn check(&self, path: &Path) -> crate::Result<()> {
        if !matches!(self.model_type.as_str(), "qwen3_5_text" | "qwen3_5_moe_text") {
            return Err(unusable(
                path,
                format!(
                    "`model_type` is `{}`; `Qwen35Config` reads `qwen3_5_text` and `qwen3_5_moe_text` (a `qwen3_5` \
                     file's `text_config`)",
                    self.model_type
                ),
            ));
        }
        let checks = super::Checks::new(path);
        super::config::check(self, &checks, 6, &[])?;
        if let Some(types) = &self.layer_types {
            if types.len() != self.num_hidden_layers {
                return Err(crate::Error::ConfigField {
                    path: path.to_path_buf(),
                    field: "layer_types".into(),
                    found: types.len() as u64,
                    rule: crate::error::ConfigRule::OneOf { allowed: vec![self.num_hidden_layers as u64] },
                });
            }
            if let Some(at) = types.iter().position(|kind| kind != LINEAR && kind != FULL) {
                return Err(unusable(
                    path,
                    format!("`layer_types[{at}]` is `{}`; each entry is `{LINEAR}` or `{FULL}`", types[at]),
                ));
            }
        }
        let rotated = self.rotated();
        if rotated == 0 || !rotated.is_multiple_of(2) || rotated > self.head_dim() {
            let factor = self.partial_rotary_factor();
            return Err(unusable(
                path,
                format!(
                    "`partial_rotary_factor` {factor} turns {rotated} of each head's {} values; rotary turns an even \
                     number of them, at least 2",
                    self.head_dim()
                ),
            ));
        }
        for (field, value) in [
            ("linear_conv_kernel_dim", self.linear_conv_kernel_dim),
            ("linear_key_head_dim", self.linear_key_head_dim),
            ("linear_value_head_dim", self.linear_value_head_dim),
            ("linear_num_key_heads", self.linear_num_key_heads),
            ("linear_num_value_heads", self.linear_num_value_heads),
        ] {
            checks.positive(field, value)?;
        }
        checks.at_most("linear_conv_kernel_dim", self.linear_conv_kernel_dim, 64)?;
        if !self.linear_num_value_heads.is_multiple_of(self.linear_num_key_heads) {
            return Err(unusable(
                path,
                format!(
                    "`linear_num_value_heads` ({}) is not a multiple of `linear_num_key_heads` ({})",
                    self.linear_num_value_heads, self.linear_num_key_heads
                ),
            ));
        }
        let dims = self.delta_dims(false);
        let sizes = [("linear_num_value_heads", dims.value_heads), ("linear_value_head_dim", dims.value_dim)];
        checks.addressable(
            &sizes,
            self.num_hidden_layers,
            &[&[dims.channels(), self.hidden_size], &[dims.state()]],
            &[],
        )?;
        if self.is_moe() {
            let (experts, inner, hidden) = (self.num_experts.unwrap_or(0), self.moe_inner(), self.hidden_size);
            checks.positive("num_experts", experts)?;
            checks.positive("num_experts_per_tok", self.routing().top_k)?;
            checks.at_most("num_experts_per_tok", self.routing().top_k, experts)?;
            checks.positive("moe_intermediate_size", inner)?;
            let sizes = [("num_experts", experts), ("moe_intermediate_size", inner), ("hidden_size", hidden)];
            checks.addressable(&sizes, self.num_hidden_layers, &[&[3, experts, inner, hidden]], &[])?;
        }
        Ok(())
    }

    /// Whether the model is Qwen3.5-MoE.
    pub fn is_moe(&self) -> bool {
        self.model_type == "qwen3_5_moe_text"
    }

    /// Whether layer `layer` is a Gated DeltaNet layer.
    pub fn is_linear(&self, layer: usize) -> bool {
        match &self.layer_types {
            Some(types) => types.get(layer).is_some_and(|kind| kind == LINEAR),
            None => !(layer + 1).is_multiple_of(self.full_attention_interval.unwrap_or(4).max(1)),
        }
    }

    /// The fraction of each full-attention head that rotary turns (0.25 when absent).
    pub fn partial_rotary_factor(&self) -> f32 {
        let from_rope = self
            .rope_parameters
            .as_ref()
            .and_then(|rope| rope.extra.get("partial_rotary_factor"))
            .and_then(serde_json::Value::as_f64);
        from_rope.map(|factor| factor as f32).or(self.partial_rotary_factor).unwrap_or(0.25)
    }

    /// The values of each full-attention head that rotary turns (its first ones).
    pub fn rotated(&self) -> usize {
        (self.head_dim() as f32 * self.partial_rotary_factor()).round() as usize
    }

    /// The DeltaNet's shape; `tiled`: the value heads in llama.cpp's order.
    pub(crate) fn delta_dims(&self, tiled: bool) -> DeltaDims {
        DeltaDims {
            key_heads: self.linear_num_key_heads,
            value_heads: self.linear_num_value_heads,
            key_dim: self.linear_key_head_dim,
            value_dim: self.linear_value_head_dim,
            kernel: self.linear_conv_kernel_dim,
            tiled,
        }
    }

    fn moe_inner(&self) -> usize {
        self.moe_intermediate_size.unwrap_or(512)
    }

    fn routing(&self) -> Routing {
        Routing { top_k: self.num_experts_per_tok.unwrap_or(8), normalize: true }
    }
}

/// The `layer_types` entry of a full-attention layer.
const FULL: &str = super::decoder::FULL;

impl DecoderConfig for Qwen35Config {
    const DEFAULT_CONTEXT: usize = 32_768;
    const DEFAULT_THETA: f32 = 10_000_000.0;

    fn dims(&self) -> super::Dims {
        super::Dims {
            vocab: self.vocab_size,
            hidden: self.hidden_size,
            inner: self.intermediate_size.unwrap_or(self.moe_inner()),
            layers: self.num_hidden_layers,
            heads: self.num_attention_heads,
            kv_heads: self.num_key_value_heads,
            head_dim: Some(self.head_dim.unwrap_or(256)),
            context: self.max_position_embeddings,
            eps: self.rms_norm_eps,
        }
    }

    fn rope(&self) -> super::Rope<'_> {
        let parameters = self.rope_parameters.as_ref().map(|rope| ("rope_parameters", rope));
        super::Rope { theta: self.rope_theta, parameters, scaling: self.rope_scaling.as_ref() }
    }
}

/// A Gated DeltaNet layer's token mixer.
#[derive(Module, Clone, Debug)]
pub struct LinearAttention<D: Device = Host, W: Weights = Dense> {
    /// `hidden -> channels`: queries, keys and values before the convolution.
    #[nnx(from = "in_proj_qkv", gguf = "attn_qkv")]
    pub qkv: W::Layer<D>,
    /// `hidden -> value_heads * value_dim`: the output gate.
    #[nnx(from = "in_proj_z", gguf = "attn_gate")]
    pub z: W::Layer<D>,
    /// `hidden -> value_heads`: the update rate, through a sigmoid.
    #[nnx(from = "in_proj_b", gguf = "ssm_beta")]
    pub b: W::Layer<D>,
    /// `hidden -> value_heads`: the decay's step, through a softplus.
    #[nnx(from = "in_proj_a", gguf = "ssm_alpha")]
    pub a: W::Layer<D>,
    /// The causal convolution's taps, `[channels, kernel]` (transformers stores `[channels,
    /// 1, kernel]`).
    #[nnx(from = "conv1d.weight", gguf = "ssm_conv1d.weight")]
    pub conv: Tensor<D>,
    /// The decay step's bias per value head, `[value_heads]`.
    #[nnx(gguf = "ssm_dt.bias")]
    pub dt_bias: Tensor<D>,
    /// Per value head: `A_log` (transformers) or `-exp(A_log)` (GGUF), `[value_heads]`.
    #[nnx(from = "A_log", gguf = "ssm_a")]
    pub decay: Tensor<D>,
    /// The gated norm of each value head's output (`x * w`, `[value_dim]`).
    #[nnx(gguf = "ssm_norm")]
    pub norm: RmsNorm<D>,
    /// `value_heads * value_dim -> hidden`.
    #[nnx(from = "out_proj", gguf = "ssm_out")]
    pub out: W::Layer<D>,
}

/// A full-attention layer: grouped-query attention whose query projection also gives a gate
/// per value (each head's query, then its gate).
#[derive(Module, Clone, Debug)]
pub struct Attention<D: Device = Host, W: Weights = Dense> {
    /// `hidden -> heads * 2 * head_dim`.
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
    /// Per-head query norm.
    #[nnx(gguf = "attn_q_norm", offset = 1.0)]
    pub q_norm: RmsNorm<D>,
    /// Per-head key norm.
    #[nnx(gguf = "attn_k_norm", offset = 1.0)]
    pub k_norm: RmsNorm<D>,
}

/// Qwen3.5-MoE's shared expert: an MLP every token goes through, scaled by `sigmoid` of its
/// own gate.
#[derive(Module, Clone, Debug)]
pub struct SharedExpert<D: Device = Host, W: Weights = Dense> {
    /// The MLP.
    #[nnx(from = "shared_expert", gguf = "")]
    pub mlp: SharedMlp<D, W>,
    /// The gate's weights, `[1, hidden]` (F32).
    #[nnx(from = "shared_expert_gate.weight", gguf = "ffn_gate_inp_shexp.weight")]
    pub gate: Tensor<D>,
}

/// The shared expert's SwiGLU MLP, under llama.cpp's `_shexp` names.
#[derive(Module, Clone, Debug)]
pub struct SharedMlp<D: Device = Host, W: Weights = Dense> {
    /// Gate projection.
    #[nnx(from = "gate_proj", gguf = "ffn_gate_shexp")]
    pub gate: W::Layer<D>,
    /// Up projection.
    #[nnx(from = "up_proj", gguf = "ffn_up_shexp")]
    pub up: W::Layer<D>,
    /// Down projection.
    #[nnx(from = "down_proj", gguf = "ffn_down_shexp")]
    pub down: W::Layer<D>,
}

/// One decoder layer: a Gated DeltaNet or a full-attention layer, then an MLP or experts.
#[derive(Module, Clone, Debug)]
pub struct Layer<D: Device = Host, W: Weights = Dense> {
    /// Norm before the token mixer.
    #[nnx(from = "input_layernorm", gguf = "attn_norm", offset = 1.0)]
    pub attn_norm: RmsNorm<D>,
    /// The Gated DeltaNet, on a linear-attention layer.
    #[nnx(from = "linear_attn", gguf = "")]
    pub linear: Option<LinearAttention<D, W>>,
    /// Gated self-attention, on a full-attention layer.
    #[nnx(from = "self_attn", gguf = "")]
    pub attn: Option<Attention<D, W>>,
    /// Norm before the MLP.
    #[nnx(from = "post_attention_layernorm", gguf = "post_attention_norm", offset = 1.0)]
    pub mlp_norm: RmsNorm<D>,
    /// The MLP of a dense model.
    #[nnx(gguf = "")]
    pub mlp: Option<Mlp<D, W>>,
    /// Qwen3.5-MoE: the routed experts.
    #[nnx(from = "mlp", gguf = "")]
    pub moe: Option<Moe<D, W>>,
    /// Qwen3.5-MoE: the shared expert.
    #[nnx(from = "mlp", gguf = "")]
    pub shared: Option<SharedExpert<D, W>>,
}

/// Qwen3.5 (dense or MoE) with its language-model head.
#[derive(Module, Clone, Debug)]
pub struct Qwen35<D: Device = Host, W: Weights = Dense> {
    /// Token embeddings.
    #[nnx(from = "model.embed_tokens", gguf = "token_embd")]
    pub embed: TokenEmbedding<D>,
    /// The layers.
    #[nnx(from = "model.layers", gguf = "blk")]
    pub layers: Vec<Layer<D, W>>,
    /// Final norm.
    #[nnx(from = "model.norm", gguf = "output_norm", offset = 1.0)]
    pub norm: RmsNorm<D>,
    /// Output projection; `None` when it is the token embedding.
    #[nnx(gguf = "output")]
    pub lm_head: Option<W::Layer<D>>,
    /// Whether the DeltaNet weights are as llama.cpp's converter stores them (value heads
    /// tiled over the key heads, `-exp(A_log)`), rather than as transformers does.
    #[nnx(skip)]
    pub gguf_layout: bool,
    /// The configuration.
    #[nnx(skip)]
    pub config: Qwen35Config,
}

impl Qwen35 {
    /// A model of `config` in `dtype` (the norms and the DeltaNet's convolution, gates and
    /// decays in F32, as computed); [`Init::Meta`] allocates nothing, for importing. The layout is
    /// transformers'.
    pub fn new(config: &Qwen35Config, dtype: DType, init: Init) -> Qwen35 {
        let (hidden, head_dim, heads) = (config.hidden_size, config.head_dim(), config.num_attention_heads);
        let kv_width = config.kv_heads() * head_dim;
        let dims = config.delta_dims(false);
        let value_width = dims.value_heads * dims.value_dim;
        let linear = |input: usize, output: usize, init: Init| {
            Linear::builder(input, output).bias(false).dtype(dtype).init(init).build()
        };
        // In F32 whatever `dtype`: the stored `w` gets its one added on import, which BF16
        // would round.
        let norm = |dim: usize| RmsNorm::builder(dim).eps(config.rms_norm_eps).dtype(DType::F32).init(init).build();
        let vector = |shape: &[usize]| match init {
            Init::Meta => Tensor::meta(DType::F32, shape),
            _ => Tensor::zeros(DType::F32, shape),
        };
        let layers = (0..config.num_hidden_layers)
            .map(|layer| {
                let init = init.at(&format!("layers.{layer}"));
                let linear_layer = config.is_linear(layer);
                Layer {
                    attn_norm: norm(hidden),
                    linear: linear_layer.then(|| LinearAttention {
                        qkv: linear(hidden, dims.channels(), init.at("linear.qkv")),
                        z: linear(hidden, value_width, init.at("linear.z")),
                        b: linear(hidden, dims.value_heads, init.at("linear.b")),
                        a: linear(hidden, dims.value_heads, init.at("linear.a")),
                        conv: vector(&[dims.channels(), dims.kernel]),
                        dt_bias: vector(&[dims.value_heads]),
                        decay: vector(&[dims.value_heads]),
                        norm: norm(dims.value_dim),
                        out: linear(value_width, hidden, init.at("linear.out")),
                    }),
                    attn: (!linear_layer).then(|| Attention {
                        q: linear(hidden, heads * head_dim * 2, init.at("attn.q")),
                        k: linear(hidden, kv_width, init.at("attn.k")),
                        v: linear(hidden, kv_width, init.at("attn.v")),
                        o: linear(heads * head_dim, hidden, init.at("attn.o")),
                        q_norm: norm(head_dim),
                        k_norm: norm(head_dim),
                    }),
                    mlp_norm: norm(hidden),
                    mlp: (!config.is_moe()).then(|| {
                        let inner = config.intermediate_size.unwrap_or(0);
                        Mlp {
                            gate: linear(hidden, inner, init.at("mlp.gate")),
                            up: linear(hidden, inner, init.at("mlp.up")),
                            down: linear(inner, hidden, init.at("mlp.down")),
                        }
                    }),
                    moe: config.is_moe().then(|| {
                        let experts = config.num_experts.unwrap_or(0);
                        Moe::new(hidden, config.moe_inner(), experts, config.routing(), dtype, init.at("moe"))
                    }),
                    shared: config.is_moe().then(|| {
                        let inner = config.shared_expert_intermediate_size.unwrap_or(config.moe_inner());
                        SharedExpert {
                            mlp: SharedMlp {
                                gate: linear(hidden, inner, init.at("shared.mlp.gate")),
                                up: linear(hidden, inner, init.at("shared.mlp.up")),
                                down: linear(inner, hidden, init.at("shared.mlp.down")),
                            },
                            gate: vector(&[1, hidden]),
                        }
                    }),
                }
            })
            .collect();
        Qwen35 {
            embed: TokenEmbedding::new(config.vocab_size, hidden, dtype, init.at("embed")),
            layers,
            norm: norm(hidden),
            lm_head: (!config.tie_word_embeddings).then(|| linear(hidden, config.vocab_size, init.at("lm_head"))),
            gguf_layout: false,
            config: config.clone(),
        }
    }
}

impl<D: Device, W: Weights> Qwen35<D, W> {
    /// What each layer keeps between steps: keys and values on a full-attention layer, the
    /// convolution's last inputs and the state matrices on a DeltaNet layer.
    pub fn layer_memory(&self) -> Vec<LayerMemory> {
        let dims = self.config.delta_dims(self.gguf_layout);
        let recurrent = LayerMemory::Recurrent { conv: dims.conv_state(), state: dims.state() };
        self.layers
            .iter()
            .map(|layer| if layer.linear.is_some() { recurrent } else { LayerMemory::KeysValues })
            .collect()
    }
}

/// `t`'s values on the host.
fn host<D: Device>(t: &Tensor<D>) -> crate::Result<Vec<f32>>
where
    Tensor<D>: Compute,
{
    Compute::to_f32_vec(t)
}

impl<D: Device, W: Weights> Qwen35<D, W>
where
    Tensor<D>: Compute,
    W::Layer<D>: Project<D>,
    GgmlLinear<D>: Project<D>,
{
    fn run(&self, ids: &[u32], mut pass: Pass<'_, D>) -> crate::Result<Tensor<D>> {
        let config = &self.config;
        let (heads, kv_heads, head_dim) = (config.num_attention_heads, config.kv_heads(), config.head_dim());
        let rotary = Rotary { theta: config.theta(), factors: None, scale: 1.0 };
        let rotated = config.rotated();
        let mut h = self.embed.forward(ids)?;
        for (index, layer) in self.layers.iter().enumerate() {
            let x = layer.attn_norm.forward(&h)?;
            let mixed = match (&layer.linear, &layer.attn) {
                (Some(linear), _) => self.delta_net(linear, index, &x, &mut pass)?,
                (None, Some(attn)) => {
                    let rows = x.shape()[0];
                    let [q, k, v] = super::project_all([&attn.q, &attn.k, &attn.v], &x)?;
                    // Each head's query, then its gate.
                    let halves = Compute::reshape(&q, &[rows, heads, 2, head_dim])?;
                    let query = Compute::reshape(&halves.narrow(2, 0, 1)?.contiguous()?, &[rows, heads * head_dim])?;
                    let gate = host(&halves.narrow(2, 1, 1)?.contiguous()?)?;
                    let q = pass.heads_partial(&query, heads, head_dim, &attn.q_norm, &rotary, rotated)?;
                    let k = pass.heads_partial(&k, kv_heads, head_dim, &attn.k_norm, &rotary, rotated)?;
                    let v = pass.heads(&v, kv_heads, head_dim, None, None)?;
                    let context = pass.attend(index, &q, k, v, None)?;
                    let mut gated = host(&context)?;
                    for (value, gate) in gated.iter_mut().zip(&gate) {
                        *value /= 1.0 + (-gate).exp();
                    }
                    let gated = context.upload_like(&Tensor::from_vec(gated, &[rows, heads * head_dim])?)?;
                    attn.o.project(&gated)?
                }
                (None, None) => unreachable!("every layer has a token mixer"),
            };
            h = h.add(&mixed)?;
            let x = layer.mlp_norm.forward(&h)?;
            let ffn = match (&layer.mlp, &layer.moe) {
                (Some(mlp), _) => mlp.forward(&x, Compute::silu)?,
                (None, Some(moe)) => {
                    let routed = moe.forward(&x)?;
                    match &layer.shared {
                        Some(shared) => routed.add(&self.shared(shared, &x)?)?,
                        None => routed,
                    }
                }
                (None, None) => unreachable!("every layer has a feed-forward network"),
            };
            h = h.add(&ffn)?;
        }
        let x = self.norm.forward(&pass.finish(h)?)?;
        match &self.lm_head {
            Some(head) => head.project(&x),
            None => self.embed.project(&x),
        }
    }

    /// The shared expert on `x`, each row scaled by `sigmoid(gate . x)`.
    fn shared(&self, shared: &SharedExpert<D, W>, x: &Tensor<D>) -> crate::Result<Tensor<D>> {
        let mlp = &shared.mlp;
        let [gate, up] = super::project_all([&mlp.gate, &mlp.up], x)?;
        let out = mlp.down.project(&gate.silu()?.mul(&up)?)?;
        let weight = host(&shared.gate)?;
        let (rows, hidden) = (x.shape()[0], x.shape()[1]);
        let mut values = host(&out)?;
        for (row, (out, x)) in values.chunks_exact_mut(hidden).zip(host(x)?.chunks_exact(hidden)).enumerate() {
            let logit: f32 = x.iter().zip(&weight).map(|(x, w)| x * w).sum();
            let scale = 1.0 / (1.0 + (-logit).exp());
            out.iter_mut().for_each(|value| *value *= scale);
            debug_assert!(row < rows);
        }
        out.upload_like(&Tensor::from_vec(values, &[rows, hidden])?)
    }

    /// The Gated DeltaNet of layer `index` on `x` (`[batch * seq, hidden]`), each sequence
    /// from and into its state in the pass's cache (a fresh state without one); padding rows
    /// enter as zeros, which leave the state at zero.
    fn delta_net(
        &self,
        linear: &LinearAttention<D, W>,
        index: usize,
        x: &Tensor<D>,
        pass: &mut Pass<'_, D>,
    ) -> crate::Result<Tensor<D>> {
        let config = &self.config;
        let dims = config.delta_dims(self.gguf_layout);
        let (rows, hidden) = (x.shape()[0], x.shape()[1]);
        let x = match pass.padded_rows() {
            Some(padded) => {
                let mut values = host(x)?;
                for (row, padded) in values.chunks_exact_mut(hidden).zip(&padded) {
                    if *padded {
                        row.fill(0.0);
                    }
                }
                x.upload_like(&Tensor::from_vec(values, &[rows, hidden])?)?
            }
            None => x.clone(),
        };
        let [qkv, z, a, b] = super::project_all([&linear.qkv, &linear.z, &linear.a, &linear.b], &x)?;
        let mut mixed = host(&qkv)?;
        let mut decay = host(&linear.decay)?;
        if !self.gguf_layout {
            decay.iter_mut().for_each(|a_log| *a_log = -a_log.exp());
        }
        let (g, beta) = delta_net::gates(&host(&a)?, &host(&b)?, &decay, &host(&linear.dt_bias)?);
        let weight = host(&linear.conv)?;
        let (channels, heads) = (dims.channels(), dims.value_heads);
        let seq = rows / pass.batch.max(1);
        let mut out = Vec::with_capacity(rows * heads * dims.value_dim);
        let mut fresh = (vec![0f32; dims.conv_state()], vec![0f32; dims.state()]);
        for sequence in 0..pass.batch {
            let (conv_state, state) = match pass.cache.as_deref_mut().and_then(|cache| cache.recurrent_mut(index)) {
                Some(memory) => (
                    &mut memory.conv[sequence * dims.conv_state()..(sequence + 1) * dims.conv_state()],
                    &mut memory.state[sequence * dims.state()..(sequence + 1) * dims.state()],
                ),
                None => {
                    fresh.0.fill(0.0);
                    fresh.1.fill(0.0);
                    (&mut fresh.0[..], &mut fresh.1[..])
                }
            };
            let tokens = sequence * seq..(sequence + 1) * seq;
            let inputs = &mut mixed[tokens.start * channels..tokens.end * channels];
            delta_net::conv_silu(inputs, &weight, conv_state, &dims);
            let gates = tokens.start * heads..tokens.end * heads;
            out.extend(delta_net::delta_rule(inputs, &g[gates.clone()], &beta[gates], state, &dims));
        }
        delta_net::gated_norm(&mut out, &host(&z)?, &host(&linear.norm.weight)?, config.rms_norm_eps);
        let out = x.upload_like(&Tensor::from_vec(out, &[rows, heads * dims.value_dim])?)?;
        linear.out.project(&out)
    }
}

super::decoder::causal_lm!(Qwen35, memory: layer_memory);
