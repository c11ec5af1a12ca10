//! Qwen2 and Qwen3 as Hugging Face stores them (`model.layers.N.self_attn.q_proj`, ...) and as
//! llama.cpp's converter writes them to GGUF (`blk.N.attn_q`, ...): Llama's decoder (RMSNorm,
//! a SwiGLU MLP, grouped-query attention, half-split rotary embeddings) with biases on the
//! query, key and value projections (Qwen2, and Qwen3 when `attention_bias` says), per-head
//! RMSNorms of the queries and keys (Qwen3), and an `lm_head` that may be the token embedding;
//! Qwen3-MoE routes each token to its top-k SwiGLU experts instead of one MLP on its sparse
//! layers.

use std::path::Path;

pub use super::decoder::Mlp;
use super::decoder::{GgufKeys, Pass, Rotary, SLIDING, check_layer_types, unusable};
use super::moe::{Moe, Routing};
use super::{DecoderConfig, Dense, Project, RopeParameters, TokenEmbedding, Weights};
use crate::gguf::Metadata;
use crate::nn::{Init, Linear, RmsNorm};
use crate::quant::ggml::GgmlLinear;
use crate::{Compute, DType, Device, Host, Module, Tensor};

/// The fields of a Qwen2, Qwen3 or Qwen3-MoE `config.json` (`model_type` `qwen2`, `qwen3` or
/// `qwen3_moe`) that shape the model.
///
/// The fields nnx does not use are kept in [`extra`](QwenConfig::extra), so a configuration
/// read and written again loses none of them.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(remote = "Self")]
pub struct QwenConfig {
    /// `qwen2`, `qwen3` or `qwen3_moe`: Qwen3 normalizes queries and keys per head and has a
    /// bias on its projections only when [`attention_bias`](QwenConfig::attention_bias) says;
    /// Qwen3-MoE is Qwen3 with experts.
    pub model_type: String,
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
    /// Key/value heads (grouped-query attention); defaults to the query heads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_key_value_heads: Option<usize>,
    /// Width of one head; defaults to `hidden_size / num_attention_heads` (Qwen3 gives it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head_dim: Option<usize>,
    /// The longest sequence the model was trained for; generation caps its cache there
    /// (32768 when absent, transformers' default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_position_embeddings: Option<usize>,
    /// RMSNorm epsilon.
    #[serde(default = "super::config::default_epsilon")]
    pub rms_norm_eps: f32,
    /// Whether `lm_head` is the token embedding (the checkpoint then has no `lm_head`).
    #[serde(default)]
    pub tie_word_embeddings: bool,
    /// Qwen3: whether the query, key, value and output projections have biases (default
    /// false). Qwen2 ignores it, as transformers does: its query, key and value projections
    /// always have biases, its output projection never.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attention_bias: Option<bool>,
    /// Rotary base (older configs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_theta: Option<f32>,
    /// Rotary settings (transformers 5): the base and the scaling.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_parameters: Option<RopeParameters>,
    /// Whether the layers [`layer_types`](QwenConfig::layer_types) marks as sliding attend to
    /// the last [`sliding_window`](QwenConfig::sliding_window) keys only.
    #[serde(default)]
    pub use_sliding_window: bool,
    /// The keys a sliding layer sees, itself included.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sliding_window: Option<usize>,
    /// Without `layer_types`: the layers from this one on slide (transformers' default 28).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_window_layers: Option<usize>,
    /// `sliding_attention` or `full_attention`, one per layer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layer_types: Option<Vec<String>>,
    /// Rotary scaling (older configs; newer ones put it in `rope_parameters`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_scaling: Option<RopeParameters>,
    /// Qwen3-MoE: the experts of a sparse layer (default 128); `num_local_experts` in newer
    /// configs.
    #[serde(default, alias = "num_local_experts", skip_serializing_if = "Option::is_none")]
    pub num_experts: Option<usize>,
    /// Qwen3-MoE: the experts each token is routed to (default 8).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_experts_per_tok: Option<usize>,
    /// Qwen3-MoE: the width of one expert's MLP (default 768).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moe_intermediate_size: Option<usize>,
    /// Qwen3-MoE: whether the chosen experts' weights are divided by their sum (default false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub norm_topk_prob: Option<bool>,
    /// Qwen3-MoE: layer `i` is sparse when `(i + 1) % decoder_sparse_step == 0` (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decoder_sparse_step: Option<usize>,
    /// Qwen3-MoE: the layers with one dense MLP instead of experts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mlp_only_layers: Option<Vec<usize>>,
    /// Every other field of the file (`hidden_act`, token ids, ...), as read (within a
    /// bound): nnx does not use them and writes them back.
    #[serde(flatten, skip_deserializing)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

super::extra::keeps_extra!(QwenConfig);

impl QwenConfig {
    /// Reads a `config.json` and [checks](QwenConfig::check) it.
    ///
    /// # Errors
    /// [`crate::Error::Io`], [`crate::Error::Config`], or [`crate::Error::ConfigField`] naming
    /// the first field that cannot make a model.
    pub fn from_file(path: impl AsRef<Path>) -> crate::Result<QwenConfig> {
        super::read_config(path.as_ref(), QwenConfig::check)
    }

    /// The configuration llama.cpp's hyperparameters describe (`general.architecture` `qwen2`
    /// or `qwen3`): `{arch}.block_count`, `.embedding_length`, `.feed_forward_length`,
    /// `.attention.head_count` (and `_kv`), `.attention.key_length`,
    /// `.attention.layer_norm_rms_epsilon`, `.rope.freq_base`, `.rope.scaling.*`,
    /// `.context_length`, and the length of `tokenizer.ggml.tokens`.
    ///
    /// The metadata does not say whether the output projection is the token embedding: `tied`
    /// says whether the file lacks `output.weight` (llama.cpp then uses the embedding).
    ///
    /// # Errors
    /// [`crate::Error::NoEntry`] naming a key that is missing, [`crate::Error::Config`] for
    /// another architecture or rope scaling, and the errors of [`QwenConfig::check`].
    pub fn from_gguf(metadata: &Metadata, tied: bool) -> crate::Result<QwenConfig> {
        QwenConfig::from_gguf_at(metadata, tied, &GgufKeys::origin())
    }

    /// [`QwenConfig::from_gguf`] with errors naming `origin`, the file.
    pub(crate) fn from_gguf_at(metadata: &Metadata, tied: bool, origin: &Path) -> crate::Result<QwenConfig> {
        let keys = GgufKeys::new(metadata, &["qwen2", "qwen3", "qwen3moe"], "`QwenConfig::from_gguf`", origin)?;
        let moe = keys.arch() == "qwen3moe";
        let hidden_size = keys.required_size("embedding_length")?;
        let num_attention_heads = keys.required_size("attention.head_count")?;
        let rope = keys.rope(None)?;
        let rope_parameters = rope.factor.is_some().then_some(rope);
        let config = QwenConfig {
            model_type: if moe { "qwen3_moe".into() } else { keys.arch().to_string() },
            vocab_size: keys.vocab_size()?,
            hidden_size,
            intermediate_size: keys.required_size("feed_forward_length")?,
            num_hidden_layers: keys.required_size("block_count")?,
            num_attention_heads,
            num_key_value_heads: keys.size("attention.head_count_kv")?,
            head_dim: keys.size("attention.key_length")?,
            max_position_embeddings: keys.size("context_length")?,
            rms_norm_eps: keys.required_number("attention.layer_norm_rms_epsilon")?,
            tie_word_embeddings: tied,
            attention_bias: None,
            rope_theta: keys.number("rope.freq_base")?,
            rope_parameters,
            use_sliding_window: false,
            sliding_window: None,
            max_window_layers: None,
            layer_types: None,
            rope_scaling: None,
            num_experts: if moe { Some(keys.required_size("expert_count")?) } else { None },
            num_experts_per_tok: if moe { Some(keys.required_size("expert_used_count")?) } else { None },
            moe_intermediate_size: if moe { Some(keys.required_size("expert_feed_forward_length")?) } else { None },
            // llama.cpp renormalizes the chosen experts' weights of every Qwen3-MoE.
            norm_topk_prob: moe.then_some(true),
            decoder_sparse_step: None,
            mlp_only_layers: None,
            extra: serde_json::Map::new(),
        };
        config.check(keys.path())?;
        Ok(config)
    }

    /// Checks that the configuration makes a model: `model_type` `qwen2` or `qwen3`, every
    /// size at least 1, the key/value heads dividing the query heads, the query heads dividing
    /// `hidden_size` when `head_dim` is not given, an even head width, at most
    /// [`MAX_LAYERS`](super::MAX_LAYERS) layers, weights small enough to address, one
    /// `layer_types` entry per layer, a positive sliding window when one is used, and a rope
    /// scaling nnx computes (`default`, `linear` or `llama3`). `path` names the file in the error.
    ///
    /// # Errors
    /// [`crate::Error::ConfigField`] naming the first field at fault, or
    /// [`crate::Error::Config`] for another model type or rope scaling.
    pub fn check(&self, path: &Path) -> crate::Result<()> {
        if !matches!(self.model_type.as_str(), "qwen2" | "qwen3" | "qwen3_moe") {
            return Err(unusable(
                path,
                format!("`model_type` is `{}`; `QwenConfig` reads `qwen2`, `qwen3` and `qwen3_moe`", self.model_type),
            ));
        }
        let checks = super::Checks::new(path);
        super::config::check(self, &checks, 6, &[])?;
        if let Some(types) = &self.layer_types {
            check_layer_types(types, self.num_hidden_layers, path)?;
        }
        if self.use_sliding_window {
            checks.positive("sliding_window", self.sliding_window.unwrap_or(0))?;
        }
        if self.is_moe() {
            let (experts, inner, hidden) = (self.experts(), self.moe_inner(), self.hidden_size);
            checks.positive("num_experts", experts)?;
            checks.positive("num_experts_per_tok", self.routing().top_k)?;
            checks.at_most("num_experts_per_tok", self.routing().top_k, experts)?;
            checks.positive("moe_intermediate_size", inner)?;
            checks.positive("decoder_sparse_step", self.decoder_sparse_step.unwrap_or(1))?;
            let sizes = [("num_experts", experts), ("moe_intermediate_size", inner), ("hidden_size", hidden)];
            checks.addressable(&sizes, self.num_hidden_layers, &[&[3, experts, inner, hidden]], &[])?;
        }
        Ok(())
    }

    /// Whether the model is Qwen3 or Qwen3-MoE (per-head query and key norms).
    pub fn is_qwen3(&self) -> bool {
        self.model_type == "qwen3" || self.is_moe()
    }

    /// Whether the model is Qwen3-MoE (experts on its sparse layers).
    pub fn is_moe(&self) -> bool {
        self.model_type == "qwen3_moe"
    }

    /// Whether layer `layer` routes to experts: a Qwen3-MoE layer not in `mlp_only_layers`,
    /// every `decoder_sparse_step`-th.
    pub fn is_sparse(&self, layer: usize) -> bool {
        let dense = self.mlp_only_layers.as_ref().is_some_and(|layers| layers.contains(&layer));
        self.is_moe() && !dense && (layer + 1).is_multiple_of(self.decoder_sparse_step.unwrap_or(1).max(1))
    }

    /// The experts of a sparse layer.
    pub fn experts(&self) -> usize {
        self.num_experts.unwrap_or(128)
    }

    /// How a sparse layer's router picks its experts.
    pub fn routing(&self) -> Routing {
        Routing { top_k: self.num_experts_per_tok.unwrap_or(8), normalize: self.norm_topk_prob.unwrap_or(false) }
    }

    fn moe_inner(&self) -> usize {
        self.moe_intermediate_size.unwrap_or(768)
    }

    /// Whether the query, key and value projections have biases (and, for Qwen3, the output
    /// projection): always for Qwen2, [`attention_bias`](QwenConfig::attention_bias) for Qwen3.
    pub fn qkv_bias(&self) -> bool {
        !self.is_qwen3() || self.attention_bias.unwrap_or(false)
    }

    /// Whether the output projection of attention has a bias (Qwen3 with `attention_bias`).
    pub fn output_bias(&self) -> bool {
        self.is_qwen3() && self.attention_bias.unwrap_or(false)
    }

    /// The keys layer `layer` sees: `Some(window)` when it slides, `None` for all of them.
    pub fn window(&self, layer: usize) -> Option<usize> {
        let window = self.sliding_window.filter(|_| self.use_sliding_window)?;
        let sliding = match &self.layer_types {
            Some(types) => types.get(layer).is_some_and(|kind| kind == SLIDING),
            None => layer >= self.max_window_layers.unwrap_or(28),
        };
        sliding.then_some(window)
    }
}

super::config::decoder_config!(QwenConfig, context: 32_768);

/// Grouped-query self-attention with biased projections (Qwen2) and per-head query and key
/// norms (Qwen3), its projections stored as `W` says.
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
    /// Qwen3: RMSNorm of each query head (over `head_dim`), before the rotary embedding.
    #[nnx(gguf = "attn_q_norm")]
    pub q_norm: Option<RmsNorm<D>>,
    /// Qwen3: RMSNorm of each key head (over `head_dim`), before the rotary embedding.
    #[nnx(gguf = "attn_k_norm")]
    pub k_norm: Option<RmsNorm<D>>,
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
    /// Norm before the MLP.
    #[nnx(from = "post_attention_layernorm", gguf = "ffn_norm")]
    pub mlp_norm: RmsNorm<D>,
    /// Feed-forward network; `None` on a sparse layer.
    #[nnx(gguf = "")]
    pub mlp: Option<Mlp<D, W>>,
    /// Qwen3-MoE: the experts of a sparse layer, in place of `mlp`.
    #[nnx(from = "mlp", gguf = "")]
    pub moe: Option<Moe<D, W>>,
}

/// Qwen2 or Qwen3 with its language-model head. `W` is how the projections (and the head) are
/// stored: [`Dense`] as published, or packed by
/// [`Quantize::quantize`](super::Quantize::quantize) or [`Qwen::map_weights`].
#[derive(Module, Clone, Debug)]
pub struct Qwen<D: Device = Host, W: Weights = Dense> {
    /// Token embeddings.
    #[nnx(from = "model.embed_tokens", gguf = "token_embd")]
    pub embed: TokenEmbedding<D>,
    /// The layers.
    #[nnx(from = "model.layers", gguf = "blk")]
    pub layers: Vec<Layer<D, W>>,
    /// Final norm.
    #[nnx(from = "model.norm", gguf = "output_norm")]
    pub norm: RmsNorm<D>,
    /// Output projection; `None` when it is the token embedding
    /// ([`QwenConfig::tie_word_embeddings`]).
    #[nnx(gguf = "output")]
    pub lm_head: Option<W::Layer<D>>,
    /// The configuration.
    #[nnx(skip)]
    pub config: QwenConfig,
}

impl Qwen {
    /// A model of `config` in `dtype`; [`Init::Meta`] allocates nothing, for importing.
    pub fn new(config: &QwenConfig, dtype: DType, init: Init) -> Qwen {
        let (hidden, head_dim) = (config.hidden_size, config.head_dim());
        let (q_width, kv_width) = (config.num_attention_heads * head_dim, config.kv_heads() * head_dim);
        let linear = |input: usize, output: usize, bias: bool, init: Init| {
            Linear::builder(input, output).bias(bias).dtype(dtype).init(init).build()
        };
        let norm = |dim: usize| RmsNorm::builder(dim).eps(config.rms_norm_eps).dtype(dtype).init(init).build();
        let (qkv_bias, output_bias) = (config.qkv_bias(), config.output_bias());
        let layers = (0..config.num_hidden_layers)
            .map(|layer| {
                let init = init.at(&format!("layers.{layer}"));
                Layer {
                    attn_norm: norm(hidden),
                    attn: Attention {
                        q: linear(hidden, q_width, qkv_bias, init.at("attn.q")),
                        k: linear(hidden, kv_width, qkv_bias, init.at("attn.k")),
                        v: linear(hidden, kv_width, qkv_bias, init.at("attn.v")),
                        o: linear(q_width, hidden, output_bias, init.at("attn.o")),
                        q_norm: config.is_qwen3().then(|| norm(head_dim)),
                        k_norm: config.is_qwen3().then(|| norm(head_dim)),
                    },
                    mlp_norm: norm(hidden),
                    mlp: (!config.is_sparse(layer)).then(|| Mlp {
                        gate: linear(hidden, config.intermediate_size, false, init.at("mlp.gate")),
                        up: linear(hidden, config.intermediate_size, false, init.at("mlp.up")),
                        down: linear(config.intermediate_size, hidden, false, init.at("mlp.down")),
                    }),
                    moe: config.is_sparse(layer).then(|| {
                        let (experts, routing) = (config.experts(), config.routing());
                        Moe::new(hidden, config.moe_inner(), experts, routing, dtype, init.at("moe"))
                    }),
                }
            })
            .collect();
        Qwen {
            embed: TokenEmbedding::new(config.vocab_size, hidden, dtype, init.at("embed")),
            layers,
            norm: norm(hidden),
            lm_head: (!config.tie_word_embeddings)
                .then(|| linear(hidden, config.vocab_size, false, init.at("lm_head"))),
            config: config.clone(),
        }
    }
}

impl<D: Device, W: Weights> Qwen<D, W>
where
    Tensor<D>: Compute,
    W::Layer<D>: Project<D>,
    GgmlLinear<D>: Project<D>,
{
    fn run(&self, ids: &[u32], mut pass: Pass<'_, D>) -> crate::Result<Tensor<D>> {
        let config = &self.config;
        let (heads, kv_heads, head_dim) = (config.num_attention_heads, config.kv_heads(), config.head_dim());
        let rotary = Rotary { theta: config.theta(), factors: config.rope_factors(), scale: config.rope_scale() };
        let mut h = self.embed.forward(ids)?;
        for (index, layer) in self.layers.iter().enumerate() {
            let attn = &layer.attn;
            let x = layer.attn_norm.forward(&h)?;
            let [q, k, v] = super::project_all([&attn.q, &attn.k, &attn.v], &x)?;
            let q = pass.heads(&q, heads, head_dim, attn.q_norm.as_ref(), Some(&rotary))?;
            let k = pass.heads(&k, kv_heads, head_dim, attn.k_norm.as_ref(), Some(&rotary))?;
            let v = pass.heads(&v, kv_heads, head_dim, None, None)?;
            let context = pass.attend(index, &q, k, v, config.window(index))?;
            h = h.add(&attn.o.project(&context)?)?;
            let x = layer.mlp_norm.forward(&h)?;
            if let Some(mlp) = &layer.mlp {
                h = h.add(&mlp.forward(&x, Compute::silu)?)?;
            }
            if let Some(moe) = &layer.moe {
                h = h.add(&moe.forward(&x)?)?;
            }
        }
        let x = self.norm.forward(&pass.finish(h)?)?;
        match &self.lm_head {
            Some(head) => head.project(&x),
            None => self.embed.project(&x),
        }
    }
}

super::decoder::causal_lm!(Qwen);

/// A folder of `Qwen2ForCausalLM` (`model_type` `qwen2`), in the dtype of its weights.
///
/// `save_pretrained` writes the `model_type` and architecture of this implementation, so one
/// type serves one model type: a Qwen3 folder is refused here (it would be saved as Qwen2).
/// Load it with [`QwenConfig::from_file`], [`Qwen::new`] and
/// [`Archive::import_into`](crate::Archive::import_into).
impl crate::Pretrained for Qwen {
    type Config = QwenConfig;
    const MODEL_TYPE: &'static str = "qwen2";
    const ARCHITECTURE: &'static str = "Qwen2ForCausalLM";

    fn config(&self) -> &QwenConfig {
        &self.config
    }

    fn build(config: &QwenConfig, dtype: DType) -> crate::Result<Qwen> {
        Ok(Qwen::new(config, dtype, Init::Meta))
    }

    fn check_config(config: &QwenConfig, path: &Path) -> crate::Result<()> {
        config.check(path)?;
        if config.model_type != Self::MODEL_TYPE {
            return Err(unusable(
                path,
                format!(
                    "`model_type` is `{}`, and `Qwen::from_pretrained` reads `qwen2` folders (a save would \
                     label the model `qwen2`): load it with `QwenConfig::from_file`, `Qwen::new` and \
                     `Archive::import_into`",
                    config.model_type
                ),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::{Array, Value};
    use crate::models::decoder::FULL;

    fn config(model_type: &str) -> QwenConfig {
        serde_json::from_value(serde_json::json!({
            "model_type": model_type,
            "vocab_size": 32,
            "hidden_size": 16,
            "intermediate_size": 24,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 6,
            "tie_word_embeddings": true,
            "rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1000.0},
        }))
        .unwrap()
    }

    #[test]
    fn map_weights_names_each_projection_by_its_model_path() {
        let mut untied = config("qwen3");
        untied.tie_word_embeddings = false;
        let model = Qwen::new(&untied, DType::F32, Init::Meta);
        let paths = std::cell::RefCell::new(Vec::new());
        let same = model
            .map_weights::<Dense>(|path, layer| {
                paths.borrow_mut().push(path.to_string());
                Ok(layer.clone())
            })
            .unwrap();
        let expected: Vec<String> = (0..2)
            .flat_map(|layer| {
                ["attn.q", "attn.k", "attn.v", "attn.o", "mlp.gate", "mlp.up", "mlp.down"]
                    .map(|projection| format!("layers.{layer}.{projection}"))
            })
            .chain(["lm_head".to_string()])
            .collect();
        assert_eq!(paths.into_inner(), expected);
        assert!(same.layers[1].attn.q_norm.is_some());
        assert_eq!(same.config, model.config);
    }

    #[test]
    fn qwen3_has_head_norms_and_no_biases_qwen2_biases() {
        let qwen3 = Qwen::new(&config("qwen3"), DType::F32, Init::Seeded(1));
        let names: Vec<String> = qwen3.flat_state_dict().keys().map(str::to_string).collect();
        assert!(names.contains(&"layers.0.attn.q_norm.weight".to_string()), "{names:?}");
        assert!(!names.iter().any(|name| name.ends_with("bias") || name.starts_with("lm_head")), "{names:?}");
        assert_eq!(qwen3.layers[0].attn.q.weight.shape(), [24, 16]);
        let mut qwen2 = config("qwen2");
        qwen2.head_dim = None;
        let qwen2 = Qwen::new(&qwen2, DType::F32, Init::Meta);
        assert!(qwen2.layers[0].attn.q.bias.is_some() && qwen2.layers[0].attn.o.bias.is_none());
        assert!(qwen2.layers[0].attn.q_norm.is_none());
    }

    #[test]
    fn the_cache_gives_the_logits_of_the_full_pass() {
        let mut config = config("qwen3");
        config.use_sliding_window = true;
        config.sliding_window = Some(3);
        config.max_window_layers = Some(1);
        let model = Qwen::new(&config, DType::F32, Init::Seeded(3));
        let ids = [1u32, 5, 9, 2, 30, 7];
        let full = model.forward(&ids).unwrap().to_vec::<f32>().unwrap();
        let mut cache = super::super::CausalLm::new_cache(&model, 1, 8).unwrap();
        model.forward_with_cache(&ids[..4], &mut cache).unwrap();
        model.forward_with_cache(&ids[4..5], &mut cache).unwrap();
        let last = model.forward_with_cache(&ids[5..], &mut cache).unwrap().to_vec::<f32>().unwrap();
        let expected = &full[5 * 32..];
        let difference = last.iter().zip(expected).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
        assert!(difference < 1e-5, "{difference}");
    }

    #[test]
    fn checks_refuse_what_cannot_make_a_model() {
        let path = Path::new("config.json");
        let mut bad = config("qwen3");
        bad.rope_parameters.as_mut().unwrap().rope_type = Some("dynamic".into());
        assert!(matches!(bad.check(path), Err(crate::Error::Config { .. })));
        let mut bad = config("qwen3");
        bad.layer_types = Some(vec![FULL.into()]);
        assert!(matches!(bad.check(path), Err(crate::Error::ConfigField { field, .. }) if field == "layer_types"));
        assert!(matches!(config("llama").check(path), Err(crate::Error::Config { .. })));
        assert_eq!(config("qwen3").rope_factors(), Some(vec![2.0; 3]));
    }

    #[test]
    fn gguf_metadata_makes_the_configuration() {
        let mut metadata = Metadata::new();
        metadata.set("general.architecture", Value::String("qwen3".into()));
        for (key, value) in [
            ("block_count", 2u32),
            ("embedding_length", 16),
            ("feed_forward_length", 24),
            ("attention.head_count", 4),
            ("attention.head_count_kv", 2),
            ("attention.key_length", 6),
            ("context_length", 64),
        ] {
            metadata.set(format!("qwen3.{key}"), Value::U32(value));
        }
        metadata.set("tokenizer.ggml.tokens", Value::Array(Array::String(vec!["a".into(); 32])));
        let error = QwenConfig::from_gguf(&metadata, false).unwrap_err();
        assert!(
            matches!(&error, crate::Error::NoEntry { name, .. } if name == "qwen3.attention.layer_norm_rms_epsilon"),
            "{error}"
        );
        metadata.set("qwen3.attention.layer_norm_rms_epsilon", Value::F32(1e-6));
        metadata.set("qwen3.rope.freq_base", Value::F32(1e6));
        let config = QwenConfig::from_gguf(&metadata, false).unwrap();
        assert!(config.is_qwen3() && !config.qkv_bias());
        assert_eq!((config.vocab_size, config.head_dim(), config.kv_heads(), config.theta()), (32, 6, 2, 1e6));
        assert_eq!((config.context_length(), config.rope_factors()), (64, None));
        metadata.set("general.architecture", Value::String("llama".into()));
        assert!(matches!(QwenConfig::from_gguf(&metadata, false), Err(crate::Error::Config { .. })));
    }
}
