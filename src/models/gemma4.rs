//! Gemma 4's text model (transformers' `Gemma4ForCausalLM`, llama.cpp's `gemma4`): Gemma 3's
//! sliding and global layers, with heads of their own width and count on the global layers
//! (whose keys may serve as their values), "proportional" rotary on a fraction of a global
//! head, no scaling of the attention scores (query and key norms stand for it), values
//! normalized without a weight, per-layer embeddings (a packed table looked up per token,
//! joined with a projection of the embedded token, and fed to every layer through a gate), a
//! scale on each layer's output, and keys and values shared: the last layers reuse those of
//! the last earlier layer of their kind.
//!
//! Its norms multiply by `w` as stored (unlike Gemma 3's `1 + w`), in both formats.

use std::path::Path;

use super::decoder::{GgufKeys, Pass, Rotary, SLIDING, check_layer_types, unusable};
use super::moe::{Experts, Routing};
use super::{DecoderConfig, Dense, Project, RopeParameters, TokenEmbedding, Weights};
use crate::generate::LayerMemory;
use crate::gguf::Metadata;
use crate::nn::{Init, Linear, RmsNorm};
use crate::quant::ggml::GgmlLinear;
use crate::{Compute, DType, Device, Host, Module, Tensor};

pub use super::decoder::Mlp;
pub use super::gemma3::Gemma3RopeParameters as Gemma4RopeParameters;

/// One layer's own attention shape in `per_layer_config` (the global layers').
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LayerShape {
    /// Width of one head.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head_dim: Option<usize>,
    /// Key/value heads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_key_value_heads: Option<usize>,
}

/// The fields of a Gemma 4 text `config.json` (`model_type` `gemma4_text`) that shape the
/// model; absent fields take transformers' defaults.
///
/// The fields nnx does not use are kept in [`extra`](Gemma4Config::extra), so a configuration
/// read and written again loses none of them.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(remote = "Self")]
pub struct Gemma4Config {
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Width of the residual stream.
    pub hidden_size: usize,
    /// Width of the MLP (twice that on the shared layers with `use_double_wide_mlp`).
    pub intermediate_size: usize,
    /// Number of layers.
    pub num_hidden_layers: usize,
    /// Query heads (every layer).
    pub num_attention_heads: usize,
    /// Key/value heads of the sliding layers (and of the global ones without their own).
    #[serde(default = "default_kv_heads")]
    pub num_key_value_heads: usize,
    /// Width of a sliding layer's head (256).
    #[serde(default = "default_head_dim")]
    pub head_dim: usize,
    /// Width of a global layer's head (hub configs; 512).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub global_head_dim: Option<usize>,
    /// Key/value heads of a global layer (hub configs), taken where `attention_k_eq_v` is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_global_key_value_heads: Option<usize>,
    /// Per-layer attention shapes (as transformers writes the two fields above), by layer index.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_layer_config: Option<std::collections::BTreeMap<String, LayerShape>>,
    /// Whether a global layer's keys are also its values (it has no value projection).
    #[serde(default)]
    pub attention_k_eq_v: bool,
    /// The keys a sliding layer sees, itself included (512).
    #[serde(default = "default_window")]
    pub sliding_window: usize,
    /// `sliding_attention` or `full_attention`, one per layer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layer_types: Option<Vec<String>>,
    /// The longest sequence the model was trained for (131072).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_position_embeddings: Option<usize>,
    /// RMSNorm epsilon.
    #[serde(default = "super::config::default_epsilon")]
    pub rms_norm_eps: f32,
    /// Whether `lm_head` is the token embedding (default true).
    #[serde(default = "default_true")]
    pub tie_word_embeddings: bool,
    /// Whether the attention projections have biases (Gemma 4's have none; refused).
    #[serde(default)]
    pub attention_bias: bool,
    /// Rotary settings per layer type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_parameters: Option<Gemma4RopeParameters>,
    /// `logits = tanh(logits / c) * c` when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub final_logit_softcapping: Option<f32>,
    /// Rows of the per-layer embedding table.
    #[serde(default = "default_vocab")]
    pub vocab_size_per_layer_input: usize,
    /// Width of one layer's embedding (256; 0 for none).
    #[serde(default = "default_per_layer")]
    pub hidden_size_per_layer_input: usize,
    /// The last layers that reuse earlier layers' keys and values.
    #[serde(default)]
    pub num_kv_shared_layers: usize,
    /// Whether the shared layers' MLPs are twice as wide.
    #[serde(default)]
    pub use_double_wide_mlp: bool,
    /// Whether every layer has a mixture of experts beside its MLP (Gemma 4 26B-A4B).
    #[serde(default)]
    pub enable_moe_block: bool,
    /// The experts of each layer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_experts: Option<usize>,
    /// The experts each token is routed to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_k_experts: Option<usize>,
    /// The width of one expert's MLP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moe_intermediate_size: Option<usize>,
    /// Every other field of the file, as read (within a bound): nnx does not use them and
    /// writes them back.
    #[serde(flatten, skip_deserializing)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

super::extra::keeps_extra!(Gemma4Config);

fn default_kv_heads() -> usize {
    4
}

fn default_head_dim() -> usize {
    256
}

fn default_window() -> usize {
    512
}

fn default_true() -> bool {
    true
}

fn default_vocab() -> usize {
    262_144
}

fn default_per_layer() -> usize {
    256
}

/// A GGUF value of one number per block, or one number for all (`{arch}.<key>`).
fn per_block(keys: &GgufKeys<'_>, suffix: &str, blocks: usize) -> crate::Result<Option<Vec<usize>>> {
    match keys.value(suffix) {
        Some(crate::gguf::Value::Array(array)) => {
            let values: Option<Vec<usize>> =
                (0..array.len()).map(|at| array.get(at)?.as_u64().and_then(|v| usize::try_from(v).ok())).collect();
            match values {
                Some(values) if values.len() == blocks => Ok(Some(values)),
                _ => Err(unusable(
                    keys.path(),
                    format!(
                        "`{}` holds {} values; nnx reads one number per block ({blocks})",
                        keys.key(suffix),
                        array.len()
                    ),
                )),
            }
        }
        _ => Ok(keys.size(suffix)?.map(|value| vec![value; blocks])),
    }
}

impl Gemma4Config {
    /// Reads a `config.json` (a text model's, or a published multimodal checkpoint's, whose
    /// `text_config` describes the language model) and [checks](Gemma4Config::check) it.
    ///
    /// # Errors
    /// [`crate::Error::Io`], [`crate::Error::Config`], or [`crate::Error::ConfigField`] naming
    /// the first field that cannot make a model.
    pub fn from_file(path: impl AsRef<Path>) -> crate::Result<Gemma4Config> {
        super::read_text_config(path.as_ref(), Gemma4Config::check)
    }

    /// The configuration llama.cpp's hyperparameters describe (`general.architecture`
    /// `gemma4`): the decoder's keys, the global layers' `.attention.key_length` and the sliding
    /// ones' `_swa`, `.attention.head_count_kv` and `.feed_forward_length` per block,
    /// `.attention.sliding_window(_pattern)`, `.attention.shared_kv_layers`,
    /// `.embedding_length_per_layer_input`, `.rope.freq_base(_swa)` and
    /// `.final_logit_softcapping` (30 when absent, as llama.cpp has it). What the keys do not
    /// say comes from the file's tensors: `rotated`, how many of a global head's values turn
    /// (its `rope_freqs.weight`), and `keys_are_values`, whether the global layers lack
    /// `attn_v`. `tied` says whether the file lacks `output.weight`.
    ///
    /// # Errors
    /// [`crate::Error::NoEntry`] naming a key that is missing, [`crate::Error::Config`] for
    /// another architecture, and the errors of [`Gemma4Config::check`].
    pub fn from_gguf(
        metadata: &Metadata,
        tied: bool,
        rotated: Option<usize>,
        keys_are_values: bool,
    ) -> crate::Result<Gemma4Config> {
        Gemma4Config::from_gguf_at(metadata, tied, rotated, keys_are_values, &GgufKeys::origin())
    }

    /// [`Gemma4Config::from_gguf`] with errors naming `origin`, the file.
    pub(crate) fn from_gguf_at(
        metadata: &Metadata,
        tied: bool,
        rotated: Option<usize>,
        keys_are_values: bool,
        origin: &Path,
    ) -> crate::Result<Gemma4Config> {
        let keys = GgufKeys::new(metadata, &["gemma4"], "`Gemma4Config::from_gguf`", origin)?;
        let blocks = keys.required_size("block_count")?;
        super::Checks::new(keys.path()).at_most(&keys.key("block_count"), blocks, super::MAX_LAYERS)?;
        let hidden = keys.required_size("embedding_length")?;
        let heads = keys.required_size("attention.head_count")?;
        let global = keys.required_size("attention.key_length")?;
        let local = keys.size("attention.key_length_swa")?.unwrap_or(global);
        let kv = per_block(&keys, "attention.head_count_kv", blocks)?.unwrap_or_else(|| vec![heads; blocks]);
        let inner = per_block(&keys, "feed_forward_length", blocks)?
            .ok_or_else(|| GgufKeys::missing_in(keys.path(), &keys.key("feed_forward_length")))?;
        let shared = keys.size("attention.shared_kv_layers")?.unwrap_or(0);
        let sliding: Vec<bool> = keys.layer_types(6)?.iter().map(|kind| kind == SLIDING).collect();
        let local_kv = (0..blocks).find(|&at| sliding[at]).map_or(kv[0], |at| kv[at]);
        let per_layer_config = (0..blocks)
            .filter(|&at| !sliding[at])
            .map(|at| (at.to_string(), LayerShape { head_dim: Some(global), num_key_value_heads: Some(kv[at]) }))
            .collect();
        let rope = |theta: Option<f32>, full: bool| {
            let mut rope = RopeParameters { rope_theta: theta, ..RopeParameters::default() };
            if full {
                rope.rope_type = Some("proportional".into());
                let fraction = rotated.map_or(1.0, |rotated| rotated as f64 / global.max(1) as f64);
                rope.extra.insert("partial_rotary_factor".into(), serde_json::json!(fraction));
            }
            rope
        };
        let config = Gemma4Config {
            vocab_size: keys.vocab_size()?,
            hidden_size: hidden,
            intermediate_size: inner[0],
            num_hidden_layers: blocks,
            num_attention_heads: heads,
            num_key_value_heads: local_kv,
            head_dim: local,
            global_head_dim: None,
            num_global_key_value_heads: None,
            per_layer_config: Some(per_layer_config),
            attention_k_eq_v: keys_are_values,
            sliding_window: keys.size("attention.sliding_window")?.unwrap_or(512),
            layer_types: Some(keys.layer_types(6)?),
            max_position_embeddings: keys.size("context_length")?,
            rms_norm_eps: keys.required_number("attention.layer_norm_rms_epsilon")?,
            tie_word_embeddings: tied,
            attention_bias: false,
            rope_parameters: Some(Gemma4RopeParameters {
                full_attention: Some(rope(keys.number("rope.freq_base")?, true)),
                sliding_attention: Some(rope(keys.number("rope.freq_base_swa")?, false)),
                extra: serde_json::Map::new(),
            }),
            final_logit_softcapping: Some(keys.number("final_logit_softcapping")?.unwrap_or(30.0)),
            vocab_size_per_layer_input: keys.vocab_size()?,
            hidden_size_per_layer_input: keys.size("embedding_length_per_layer_input")?.unwrap_or(0),
            num_kv_shared_layers: shared,
            use_double_wide_mlp: inner.iter().any(|&width| width != inner[0]),
            enable_moe_block: keys.size("expert_count")?.is_some_and(|experts| experts > 0),
            num_experts: keys.size("expert_count")?,
            top_k_experts: keys.size("expert_used_count")?,
            moe_intermediate_size: keys.size("expert_feed_forward_length")?,
            extra: serde_json::Map::new(),
        };
        config.check(keys.path())?;
        Ok(config)
    }

    /// Checks that the configuration makes a model: the decoder's shape, one `layer_types`
    /// entry per layer, the global layers' heads, a positive window, fewer shared layers than
    /// layers with an earlier layer of each kind to share from, a per-layer table of the
    /// vocabulary's rows, experts that can be routed to and addressed, and no biases.
    /// `path` names the file in the error.
    ///
    /// # Errors
    /// [`crate::Error::ConfigField`] naming the first field at fault, [`crate::Error::Config`]
    /// for what nnx does not compute.
    pub fn check(&self, path: &Path) -> crate::Result<()> {
        let checks = super::Checks::new(path);
        super::config::check(self, &checks, 8, &[])?;
        if let Some(types) = &self.layer_types {
            check_layer_types(types, self.num_hidden_layers, path)?;
        }
        checks.positive("sliding_window", self.sliding_window)?;
        if self.attention_bias {
            return Err(unusable(path, "`attention_bias` is true; Gemma 4 has no attention biases".into()));
        }
        if self.enable_moe_block {
            let (experts, top_k, inner) =
                (self.experts(), self.top_k_experts.unwrap_or(0), self.moe_intermediate_size.unwrap_or(0));
            checks.positive("num_experts", experts)?;
            checks.positive("top_k_experts", top_k)?;
            checks.at_most("top_k_experts", top_k, experts)?;
            checks.positive("moe_intermediate_size", inner)?;
            let sizes = [("num_experts", experts), ("moe_intermediate_size", inner), ("hidden_size", self.hidden_size)];
            checks.addressable(&sizes, self.num_hidden_layers, &[&[3, experts, inner, self.hidden_size]], &[])?;
        }
        for layer in 0..self.num_hidden_layers {
            let (kv_heads, head_dim) = (self.kv_heads_of(layer), self.head_dim_of(layer));
            checks.positive("num_key_value_heads", kv_heads)?;
            checks.positive("head_dim", head_dim)?;
            checks.even("head_dim", head_dim, "rotary position embeddings turn pairs of values")?;
            checks.at_most("head_dim", head_dim, super::decoder::MAX_HEAD_DIM)?;
            if !self.num_attention_heads.is_multiple_of(kv_heads) {
                return Err(unusable(
                    path,
                    format!(
                        "layer {layer} has {kv_heads} key/value heads, which do not divide the {} query heads",
                        self.num_attention_heads
                    ),
                ));
            }
        }
        checks.at_most("num_kv_shared_layers", self.num_kv_shared_layers, self.num_hidden_layers.saturating_sub(1))?;
        for layer in self.first_shared()..self.num_hidden_layers {
            if self.source_of(layer).is_none() {
                return Err(unusable(
                    path,
                    format!("shared layer {layer} has no earlier layer of its kind to take its keys and values from"),
                ));
            }
        }
        if self.hidden_size_per_layer_input > 0 && self.vocab_size_per_layer_input != self.vocab_size {
            return Err(unusable(
                path,
                format!(
                    "`vocab_size_per_layer_input` ({}) differs from `vocab_size` ({}); nnx looks both up by token",
                    self.vocab_size_per_layer_input, self.vocab_size
                ),
            ));
        }
        let per_layer = self.hidden_size_per_layer_input;
        let sizes = [("vocab_size", self.vocab_size), ("hidden_size_per_layer_input", per_layer)];
        checks.addressable(&sizes, 1, &[&[self.vocab_size, self.num_hidden_layers, per_layer]], &[])
    }

    fn experts(&self) -> usize {
        self.num_experts.unwrap_or(0)
    }

    /// Whether layer `layer` is a sliding layer.
    pub fn is_sliding(&self, layer: usize) -> bool {
        match &self.layer_types {
            Some(types) => types.get(layer).is_some_and(|kind| kind == SLIDING),
            None => !(layer + 1).is_multiple_of(6) && layer + 1 != self.num_hidden_layers,
        }
    }

    fn shape_of(&self, layer: usize) -> Option<&LayerShape> {
        self.per_layer_config.as_ref()?.get(&layer.to_string())
    }

    /// Width of layer `layer`'s heads.
    pub fn head_dim_of(&self, layer: usize) -> usize {
        if self.is_sliding(layer) {
            return self.head_dim;
        }
        self.shape_of(layer).and_then(|shape| shape.head_dim).or(self.global_head_dim).unwrap_or(512)
    }

    /// Key/value heads of layer `layer`.
    pub fn kv_heads_of(&self, layer: usize) -> usize {
        if self.is_sliding(layer) {
            return self.num_key_value_heads;
        }
        let global = self.num_global_key_value_heads.filter(|_| self.attention_k_eq_v);
        self.shape_of(layer).and_then(|shape| shape.num_key_value_heads).or(global).unwrap_or(self.num_key_value_heads)
    }

    /// The first layer that reuses an earlier layer's keys and values.
    pub fn first_shared(&self) -> usize {
        self.num_hidden_layers - self.num_kv_shared_layers.min(self.num_hidden_layers)
    }

    /// The layer whose keys and values layer `layer` reuses: for a shared layer, the last
    /// layer of its kind before the shared ones; `None` for a layer with its own.
    pub fn source_of(&self, layer: usize) -> Option<usize> {
        let first = self.first_shared();
        if layer < first {
            return None;
        }
        (0..first).rev().find(|&at| self.is_sliding(at) == self.is_sliding(layer))
    }

    /// Width of layer `layer`'s MLP.
    pub fn inner_of(&self, layer: usize) -> usize {
        match self.use_double_wide_mlp && layer >= self.first_shared() {
            true => 2 * self.intermediate_size,
            false => self.intermediate_size,
        }
    }

    fn rope_parameters_of(&self, sliding: bool) -> Option<&RopeParameters> {
        let rope = self.rope_parameters.as_ref()?;
        if sliding { rope.sliding_attention.as_ref() } else { rope.full_attention.as_ref() }
    }

    /// The rotary settings of sliding or global layers: the base, and on global layers the
    /// frequency divisors of "proportional" rotary (1 for the first `partial_rotary_factor`
    /// of the head's frequencies, practically infinite for the rest, which stay unturned).
    fn rotary(&self, sliding: bool, head_dim: usize) -> Rotary {
        let rope = self.rope_parameters_of(sliding);
        let theta = rope.and_then(|rope| rope.rope_theta).unwrap_or(if sliding { 10_000.0 } else { 1_000_000.0 });
        let fraction = rope
            .and_then(|rope| rope.extra.get("partial_rotary_factor"))
            .and_then(serde_json::Value::as_f64)
            .unwrap_or(1.0);
        let factors = (!sliding && fraction < 1.0).then(|| {
            let turned = (fraction * head_dim as f64 / 2.0) as usize;
            (0..head_dim / 2).map(|at| if at < turned { 1.0 } else { 1e30 }).collect()
        });
        Rotary { theta, factors, scale: 1.0 }
    }
}

impl DecoderConfig for Gemma4Config {
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
        let parameters = self.rope_parameters_of(false).map(|rope| ("rope_parameters.full_attention", rope));
        super::Rope {
            theta: None,
            parameters: parameters.filter(|(_, rope)| rope.rope_type.as_deref() != Some("proportional")),
            scaling: None,
        }
    }
}

/// Self-attention of one layer: no value projection where the keys serve as values, and no
/// key projection or key norm where the layer shares another's keys and values.
#[derive(Module, Clone, Debug)]
pub struct Attention<D: Device = Host, W: Weights = Dense> {
    /// `hidden -> heads * head_dim`.
    #[nnx(from = "q_proj", gguf = "attn_q")]
    pub q: W::Layer<D>,
    /// `hidden -> kv_heads * head_dim`.
    #[nnx(from = "k_proj", gguf = "attn_k")]
    pub k: Option<W::Layer<D>>,
    /// `hidden -> kv_heads * head_dim`.
    #[nnx(from = "v_proj", gguf = "attn_v")]
    pub v: Option<W::Layer<D>>,
    /// `heads * head_dim -> hidden`.
    #[nnx(from = "o_proj", gguf = "attn_output")]
    pub o: W::Layer<D>,
    /// Per-head query norm.
    #[nnx(gguf = "attn_q_norm")]
    pub q_norm: RmsNorm<D>,
    /// Per-head key norm.
    #[nnx(gguf = "attn_k_norm")]
    pub k_norm: Option<RmsNorm<D>>,
}

/// The router of a layer's experts: `softmax(proj(rms(x) * scale / sqrt(hidden)))`, the top
/// `k` renormalized, each chosen expert's weight times its own scale.
#[derive(Module, Clone, Debug)]
pub struct Router<D: Device = Host, W: Weights = Dense> {
    /// `hidden -> experts`.
    #[nnx(gguf = "ffn_gate_inp")]
    pub proj: W::Layer<D>,
    /// The scale of each normed input value, `[hidden]`.
    #[nnx(gguf = "ffn_gate_inp.scale")]
    pub scale: Tensor<D>,
    /// Each expert's scale, `[experts]`.
    #[nnx(gguf = "ffn_down_exps.scale")]
    pub per_expert_scale: Tensor<D>,
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
    /// Norm of the attention's output.
    #[nnx(from = "post_attention_layernorm", gguf = "post_attention_norm")]
    pub post_attn_norm: RmsNorm<D>,
    /// Norm before the MLP.
    #[nnx(from = "pre_feedforward_layernorm", gguf = "ffn_norm")]
    pub mlp_norm: RmsNorm<D>,
    /// The MLP (tanh GELU).
    #[nnx(gguf = "")]
    pub mlp: Mlp<D, W>,
    /// Norm of the MLP's output.
    #[nnx(from = "post_feedforward_layernorm", gguf = "post_ffw_norm")]
    pub post_mlp_norm: RmsNorm<D>,
    /// `hidden -> per_layer`: the gate of the layer's own embedding.
    #[nnx(from = "per_layer_input_gate", gguf = "inp_gate")]
    pub input_gate: Option<W::Layer<D>>,
    /// `per_layer -> hidden`.
    #[nnx(from = "per_layer_projection", gguf = "proj")]
    pub input_projection: Option<W::Layer<D>>,
    /// Norm of the projected embedding.
    #[nnx(from = "post_per_layer_input_norm", gguf = "post_norm")]
    pub input_norm: Option<RmsNorm<D>>,
    /// The scale of the layer's output, `[1]`.
    #[nnx(gguf = "layer_output_scale.weight")]
    pub layer_scalar: Tensor<D>,
    /// The experts' router (a mixture of experts).
    #[nnx(gguf = "")]
    pub router: Option<Router<D, W>>,
    /// The experts' gate and up projections, `[experts, 2 * inner, hidden]` (gate first).
    #[nnx(from = "experts.gate_up_proj", gguf = "ffn_gate_up_exps")]
    pub experts_gate_up: Option<Experts<D>>,
    /// The experts' down projections, `[experts, hidden, inner]`.
    #[nnx(from = "experts.down_proj", gguf = "ffn_down_exps")]
    pub experts_down: Option<Experts<D>>,
    /// Norm of the experts' input.
    #[nnx(from = "pre_feedforward_layernorm_2", gguf = "pre_ffw_norm_2")]
    pub experts_norm: Option<RmsNorm<D>>,
    /// Norm of the MLP's output before it joins the experts'.
    #[nnx(from = "post_feedforward_layernorm_1", gguf = "post_ffw_norm_1")]
    pub mlp_out_norm: Option<RmsNorm<D>>,
    /// Norm of the experts' output.
    #[nnx(from = "post_feedforward_layernorm_2", gguf = "post_ffw_norm_2")]
    pub experts_out_norm: Option<RmsNorm<D>>,
}

/// Gemma 4's text model with its language-model head.
#[derive(Module, Clone, Debug)]
pub struct Gemma4<D: Device = Host, W: Weights = Dense> {
    /// Token embeddings.
    #[nnx(from = "model.embed_tokens", gguf = "token_embd")]
    pub embed: TokenEmbedding<D>,
    /// The per-layer embeddings, `[vocab, layers * per_layer]`.
    #[nnx(from = "model.embed_tokens_per_layer", gguf = "per_layer_token_embd")]
    pub per_layer_embed: Option<TokenEmbedding<D>>,
    /// `hidden -> layers * per_layer`: the embedded token's share of the layers' embeddings.
    #[nnx(from = "model.per_layer_model_projection", gguf = "per_layer_model_proj")]
    pub per_layer_projection: Option<W::Layer<D>>,
    /// Norm of each layer's projected share (`[per_layer]`, one for all layers).
    #[nnx(from = "model.per_layer_projection_norm", gguf = "per_layer_proj_norm")]
    pub per_layer_norm: Option<RmsNorm<D>>,
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
    pub config: Gemma4Config,
}

impl Gemma4 {
    /// A model of `config` with its projections and embeddings in `dtype` and its norms and
    /// layer scales in F32; [`Init::Meta`] allocates nothing, for importing.
    pub fn new(config: &Gemma4Config, dtype: DType, init: Init) -> Gemma4 {
        let (hidden, heads, per_layer) =
            (config.hidden_size, config.num_attention_heads, config.hidden_size_per_layer_input);
        let layers_count = config.num_hidden_layers;
        let linear = |input: usize, output: usize, init: Init| {
            Linear::builder(input, output).bias(false).dtype(dtype).init(init).build()
        };
        let norm = |dim: usize| RmsNorm::builder(dim).eps(config.rms_norm_eps).dtype(DType::F32).init(init).build();
        let vector = |shape: &[usize], value: f32| match init {
            Init::Meta => Tensor::meta(DType::F32, shape),
            _ => Tensor::from_vec(vec![value; shape.iter().product()], shape).expect("the shape's values"),
        };
        let (moe, experts, expert_inner) =
            (config.enable_moe_block, config.experts(), config.moe_intermediate_size.unwrap_or(0));
        let layers = (0..layers_count)
            .map(|layer| {
                let init = init.at(&format!("layers.{layer}"));
                let (head_dim, kv_heads) = (config.head_dim_of(layer), config.kv_heads_of(layer));
                let own = config.source_of(layer).is_none();
                // A global layer whose keys serve as values has no value projection.
                let values = own && (config.is_sliding(layer) || !config.attention_k_eq_v);
                let inner = config.inner_of(layer);
                Layer {
                    attn_norm: norm(hidden),
                    attn: Attention {
                        q: linear(hidden, heads * head_dim, init.at("attn.q")),
                        k: own.then(|| linear(hidden, kv_heads * head_dim, init.at("attn.k"))),
                        v: values.then(|| linear(hidden, kv_heads * head_dim, init.at("attn.v"))),
                        o: linear(heads * head_dim, hidden, init.at("attn.o")),
                        q_norm: norm(head_dim),
                        k_norm: own.then(|| norm(head_dim)),
                    },
                    post_attn_norm: norm(hidden),
                    mlp_norm: norm(hidden),
                    mlp: Mlp {
                        gate: linear(hidden, inner, init.at("mlp.gate")),
                        up: linear(hidden, inner, init.at("mlp.up")),
                        down: linear(inner, hidden, init.at("mlp.down")),
                    },
                    post_mlp_norm: norm(hidden),
                    input_gate: (per_layer > 0).then(|| linear(hidden, per_layer, init.at("input_gate"))),
                    input_projection: (per_layer > 0).then(|| linear(per_layer, hidden, init.at("input_projection"))),
                    input_norm: (per_layer > 0).then(|| norm(hidden)),
                    layer_scalar: vector(&[1], 1.0),
                    router: moe.then(|| Router {
                        proj: linear(hidden, experts, init.at("router.proj")),
                        scale: vector(&[hidden], 1.0),
                        per_expert_scale: vector(&[experts], 1.0),
                    }),
                    experts_gate_up: moe
                        .then(|| Experts::new(experts, 2 * expert_inner, hidden, dtype, init.at("experts_gate_up"))),
                    experts_down: moe
                        .then(|| Experts::new(experts, hidden, expert_inner, dtype, init.at("experts_down"))),
                    experts_norm: moe.then(|| norm(hidden)),
                    mlp_out_norm: moe.then(|| norm(hidden)),
                    experts_out_norm: moe.then(|| norm(hidden)),
                }
            })
            .collect();
        let table = layers_count * per_layer;
        Gemma4 {
            embed: TokenEmbedding::new(config.vocab_size, hidden, dtype, init.at("embed")),
            per_layer_embed: (per_layer > 0).then(|| {
                TokenEmbedding::new(config.vocab_size_per_layer_input, table, dtype, init.at("per_layer_embed"))
            }),
            per_layer_projection: (per_layer > 0).then(|| linear(hidden, table, init.at("per_layer_projection"))),
            per_layer_norm: (per_layer > 0).then(|| norm(per_layer)),
            layers,
            norm: norm(hidden),
            lm_head: (!config.tie_word_embeddings).then(|| linear(hidden, config.vocab_size, init.at("lm_head"))),
            config: config.clone(),
        }
    }
}

impl<D: Device, W: Weights> Gemma4<D, W> {
    /// What each layer keeps between steps: its own keys and values (its heads' width and
    /// count), or nothing where it shares another layer's.
    pub fn layer_memory(&self) -> Vec<LayerMemory> {
        (0..self.layers.len())
            .map(|layer| match self.config.source_of(layer) {
                Some(_) => LayerMemory::Shared,
                None => LayerMemory::Attention {
                    kv_heads: self.config.kv_heads_of(layer),
                    head_dim: self.config.head_dim_of(layer),
                },
            })
            .collect()
    }
}

impl<D: Device, W: Weights> Gemma4<D, W>
where
    Tensor<D>: Compute,
    W::Layer<D>: Project<D>,
    GgmlLinear<D>: Project<D>,
{
    /// Each layer's embedding of each token, `[rows, layers, per_layer]`: the table's row
    /// (times `sqrt(per_layer)`) and the normed projection of the embedded token `x` (times
    /// `hidden^-1/2`), summed and scaled by `2^-1/2`.
    fn per_layer_inputs(&self, ids: &[u32], x: &Tensor<D>) -> crate::Result<Option<Tensor<D>>> {
        let (Some(table), Some(projection), Some(norm)) =
            (&self.per_layer_embed, &self.per_layer_projection, &self.per_layer_norm)
        else {
            return Ok(None);
        };
        let (rows, layers, width) = (ids.len(), self.layers.len(), self.config.hidden_size_per_layer_input);
        let tokens = table.forward(ids)?.scale((width as f32).sqrt())?;
        let tokens = Compute::reshape(&tokens, &[rows, layers, width])?;
        let projected = projection.project(x)?.scale(1.0 / (self.config.hidden_size as f32).sqrt())?;
        let projected = norm.forward(&Compute::reshape(&projected, &[rows, layers, width])?)?;
        Ok(Some(projected.add(&tokens)?.scale(std::f32::consts::FRAC_1_SQRT_2)?))
    }

    /// The experts on `x` (`[rows, hidden]`, normed for them), routed from the residual
    /// stream `stream`: each row's top `k` experts by `router`, their tanh-GELU SwiGLU outputs
    /// summed by the renormalized router weights times each expert's scale, the rows grouped
    /// by expert so that each expert runs once.
    fn experts(
        &self,
        router: &Router<D, W>,
        [gate_up, down]: [&Experts<D>; 2],
        x: &Tensor<D>,
        stream: &Tensor<D>,
    ) -> crate::Result<Tensor<D>> {
        let config = &self.config;
        let (rows, hidden) = (x.shape()[0], x.shape()[1]);
        let normed = Compute::rms_norm(stream, None, config.rms_norm_eps)?;
        let scaled = normed.mul(&router.scale)?.scale(1.0 / (hidden as f32).sqrt())?;
        let logits = Compute::to_f32_vec(&router.proj.project(&scaled)?)?;
        let expert_scale = Compute::to_f32_vec(&router.per_expert_scale)?;
        let experts = expert_scale.len();
        let routing = Routing { top_k: config.top_k_experts.unwrap_or(1), normalize: true };
        let mut routed: Vec<Vec<(u32, f32)>> = vec![Vec::new(); experts];
        for (row, logits) in logits.chunks_exact(experts.max(1)).enumerate() {
            for (expert, weight) in routing.route(logits) {
                routed[expert].push((row as u32, weight * expert_scale[expert]));
            }
        }
        let x = Compute::to_dtype(x, DType::F32)?;
        let inner = gate_up.weight.shape()[1] / 2;
        let mut out = vec![0f32; rows * hidden];
        for (expert, tokens) in routed.iter().enumerate().filter(|(_, tokens)| !tokens.is_empty()) {
            let ids: Vec<u32> = tokens.iter().map(|&(row, _)| row).collect();
            let xs = if ids.len() == rows { x.clone() } else { Compute::embedding(&x, &ids)? };
            let both = Compute::to_f32_vec(&gate_up.project(expert, &xs)?)?;
            let gated: Vec<f32> = both
                .chunks_exact(2 * inner)
                .flat_map(|row| row[..inner].iter().zip(&row[inner..]).map(|(&g, &u)| gelu_tanh(g) * u))
                .collect();
            let gated = x.upload_like(&Tensor::from_vec(gated, &[ids.len(), inner])?)?;
            let values = Compute::to_f32_vec(&down.project(expert, &gated)?)?;
            for (&(row, weight), values) in tokens.iter().zip(values.chunks_exact(hidden)) {
                let sum = &mut out[row as usize * hidden..][..hidden];
                sum.iter_mut().zip(values).for_each(|(sum, value)| *sum += weight * value);
            }
        }
        x.upload_like(&Tensor::from_vec(out, &[rows, hidden])?)
    }

    fn run(&self, ids: &[u32], mut pass: Pass<'_, D>) -> crate::Result<Tensor<D>> {
        let config = &self.config;
        let heads = config.num_attention_heads;
        // transformers multiplies by `hidden_size ** 0.5` rounded to the weights' dtype.
        let embed_scale = (config.hidden_size as f64).sqrt() as f32;
        let mut h = self.embed.forward(ids)?.scale(embed_scale)?;
        let per_layer = self.per_layer_inputs(ids, &h)?;
        let rows = h.shape()[0];
        // The keys and values of the layers the shared ones read, by layer.
        let mut kept: Vec<Option<(Tensor<D>, Tensor<D>)>> = vec![None; self.layers.len()];
        for (index, layer) in self.layers.iter().enumerate() {
            let attn = &layer.attn;
            let (head_dim, kv_heads, sliding) =
                (config.head_dim_of(index), config.kv_heads_of(index), config.is_sliding(index));
            let rotary = config.rotary(sliding, head_dim);
            let x = layer.attn_norm.forward(&h)?;
            // Scores are not scaled: undo the kernel's division by sqrt(head_dim).
            let q = pass.heads(&attn.q.project(&x)?, heads, head_dim, Some(&attn.q_norm), Some(&rotary))?;
            let q = q.scale((head_dim as f32).sqrt())?;
            let (keys, values) = match (config.source_of(index), &attn.k, &attn.k_norm) {
                (Some(source), _, _) => kept[source].clone().expect("a shared layer's source comes before it"),
                (None, Some(k_proj), Some(k_norm)) => {
                    let k = k_proj.project(&x)?;
                    // Where the keys serve as values, the values are the keys before their norm.
                    let v = match &attn.v {
                        Some(v_proj) => v_proj.project(&x)?,
                        None => k.clone(),
                    };
                    let k = pass.heads(&k, kv_heads, head_dim, Some(k_norm), Some(&rotary))?;
                    let v = pass.heads(&v, kv_heads, head_dim, None, None)?;
                    let v = Compute::rms_norm(&v, None, config.rms_norm_eps)?;
                    let (keys, values) = pass.keys_values(index, k, v)?;
                    if (config.first_shared()..self.layers.len()).any(|shared| config.source_of(shared) == Some(index))
                    {
                        kept[index] = Some((keys.clone(), values.clone()));
                    }
                    (keys, values)
                }
                _ => unreachable!("a layer with its own keys has their projection and norm"),
            };
            let window = sliding.then_some(config.sliding_window);
            let context = pass.attend_over(&q, &keys, &values, window)?;
            h = h.add(&layer.post_attn_norm.forward(&attn.o.project(&context)?)?)?;
            let mut x = layer.mlp.forward(&layer.mlp_norm.forward(&h)?, Compute::gelu_tanh)?;
            if let (Some(router), Some(gate_up), Some(down), Some(norm), Some(mlp_out), Some(experts_out)) = (
                &layer.router,
                &layer.experts_gate_up,
                &layer.experts_down,
                &layer.experts_norm,
                &layer.mlp_out_norm,
                &layer.experts_out_norm,
            ) {
                let routed = self.experts(router, [gate_up, down], &norm.forward(&h)?, &h)?;
                x = mlp_out.forward(&x)?.add(&experts_out.forward(&routed)?)?;
            }
            h = h.add(&layer.post_mlp_norm.forward(&x)?)?;
            if let (Some(inputs), Some(gate), Some(projection), Some(norm)) =
                (&per_layer, &layer.input_gate, &layer.input_projection, &layer.input_norm)
            {
                let width = config.hidden_size_per_layer_input;
                let mine = Compute::reshape(&inputs.narrow(1, index, 1)?.contiguous()?, &[rows, width])?;
                let gated = gate.project(&h)?.gelu_tanh()?.mul(&mine)?;
                h = h.add(&norm.forward(&projection.project(&gated)?)?)?;
            }
            let scale = Compute::to_f32_vec(&layer.layer_scalar)?.first().copied().unwrap_or(1.0);
            if scale != 1.0 {
                h = h.scale(scale)?;
            }
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

/// GELU's tanh form, as transformers' `gelu_pytorch_tanh`.
fn gelu_tanh(x: f32) -> f32 {
    0.5 * x * (1.0 + (0.797_884_6 * (x + 0.044_715 * x * x * x)).tanh())
}

super::decoder::causal_lm!(Gemma4, memory: layer_memory);
