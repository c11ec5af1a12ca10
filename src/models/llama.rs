//! Llama (and Mistral, the same decoder) as transformers stores it
//! (`model.layers.N.self_attn.q_proj`, ...) and as llama.cpp's converter writes it to GGUF
//! (`blk.N.attn_q`, its query and key rows in llama.cpp's rotary order): grouped-query attention
//! (fewer key/value heads than query heads), RMSNorm, a SwiGLU MLP, Llama 3's rope scaling, and
//! an `lm_head` of its own or tied to the embedding. BF16 checkpoints import as BF16 views of
//! the file.

use std::path::Path;

pub use super::decoder::Mlp;
use super::decoder::{Pass, Rotary};
pub use super::{DecoderConfig, RopeParameters};
use super::{Dense, Project, TokenEmbedding, Weights};
use crate::nn::{Init, Linear, RmsNorm};
use crate::quant::ggml::GgmlLinear;
use crate::{Compute, DType, Device, Host, Module, Tensor};

/// The fields of a Llama `config.json` that shape the model.
///
/// The fields nnx does not use are kept in [`extra`](LlamaConfig::extra), so a configuration
/// read and written again ([`crate::Pretrained::save_pretrained`]) loses none of them.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(remote = "Self")]
pub struct LlamaConfig {
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
    /// Width of one head; defaults to `hidden_size / num_attention_heads`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head_dim: Option<usize>,
    /// The longest sequence the model was trained for; generation caps its cache there
    /// (2048 when absent: rotary positions themselves have no limit).
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
    /// Rotary settings (newer configs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_parameters: Option<RopeParameters>,
    /// Rotary scaling (older configs; newer ones put it in `rope_parameters`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_scaling: Option<RopeParameters>,
    /// Every other field of the file (`model_type`, `hidden_act`, token ids, ...), as read
    /// (within a bound): nnx does not use them and writes them back.
    #[serde(flatten, skip_deserializing)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

super::extra::keeps_extra!(LlamaConfig);

impl LlamaConfig {
    /// Reads a `config.json` and [checks](LlamaConfig::check) it.
    ///
    /// # Errors
    /// [`crate::Error::Io`], [`crate::Error::Config`], or [`crate::Error::ConfigField`] naming
    /// the first field that cannot make a model.
    pub fn from_file(path: impl AsRef<Path>) -> crate::Result<LlamaConfig> {
        super::read_config(path.as_ref(), LlamaConfig::check)
    }

    /// Checks that the configuration makes a model: every size at least 1, the key/value heads
    /// dividing the query heads, the query heads dividing `hidden_size` when `head_dim` is not
    /// given, an even head width (rotary embeddings turn pairs of values), at most
    /// [`MAX_LAYERS`](super::MAX_LAYERS) layers, weights small enough to address, and a rope
    /// scaling nnx computes with numbers that make one. `path` names the file in the error.
    ///
    /// # Errors
    /// [`crate::Error::ConfigField`] naming the first field at fault, [`crate::Error::Config`]
    /// for a rope scaling nnx does not compute.
    pub fn check(&self, path: &Path) -> crate::Result<()> {
        super::config::check(self, &super::Checks::new(path), 2, &[])
    }

    /// The configuration llama.cpp's hyperparameters describe (`general.architecture`
    /// `llama`, which Mistral's files use too), for the model that [`Llama::new`] builds.
    /// `tied` says whether the file lacks `output.weight` (the head is the embedding). Linear
    /// rope scaling is `rope.scaling.*`; Llama 3's is not in the metadata: the file's
    /// `rope_freqs.weight` holds it.
    ///
    /// # Errors
    /// [`crate::Error::NoEntry`] naming a missing key, [`crate::Error::Config`] for a key of
    /// the wrong type, [`crate::Error::ConfigField`] naming the first value that cannot make a
    /// model.
    pub fn from_gguf(metadata: &crate::gguf::Metadata, tied: bool) -> crate::Result<LlamaConfig> {
        LlamaConfig::from_gguf_at(metadata, tied, &super::decoder::GgufKeys::origin())
    }

    /// [`LlamaConfig::from_gguf`] with errors naming `origin`, the file.
    pub(crate) fn from_gguf_at(
        metadata: &crate::gguf::Metadata,
        tied: bool,
        origin: &Path,
    ) -> crate::Result<LlamaConfig> {
        let keys = super::decoder::GgufKeys::new(metadata, &["llama"], "`LlamaConfig::from_gguf`", origin)?;
        let heads = keys.required_size("attention.head_count")?;
        let mut extra = serde_json::Map::new();
        extra.insert("model_type".into(), "llama".into());
        let config = LlamaConfig {
            vocab_size: keys.vocab_size()?,
            hidden_size: keys.required_size("embedding_length")?,
            intermediate_size: keys.required_size("feed_forward_length")?,
            num_hidden_layers: keys.required_size("block_count")?,
            num_attention_heads: heads,
            num_key_value_heads: Some(keys.size("attention.head_count_kv")?.unwrap_or(heads)),
            head_dim: keys.size("attention.key_length")?,
            max_position_embeddings: keys.size("context_length")?,
            rms_norm_eps: keys.number("attention.layer_norm_rms_epsilon")?.unwrap_or(1e-5),
            tie_word_embeddings: tied,
            rope_theta: Some(keys.number("rope.freq_base")?.unwrap_or(10_000.0)),
            rope_parameters: Some(keys.rope(None)?).filter(|rope| rope.factor.is_some()),
            rope_scaling: None,
            extra,
        };
        config.check(keys.path())?;
        Ok(config)
    }
}

super::config::decoder_config!(LlamaConfig, context: 2048);

/// Grouped-query self-attention, its projections stored as `W` says.
#[derive(Module, Clone, Debug)]
pub struct Attention<D: Device = Host, W: Weights = Dense> {
    /// `hidden -> heads * head_dim`; llama.cpp stores its rows in rotary pair order.
    #[nnx(from = "q_proj", gguf = "attn_q", rope_permute = "head_count")]
    pub q: W::Layer<D>,
    /// `hidden -> kv_heads * head_dim`; llama.cpp stores its rows in rotary pair order.
    #[nnx(from = "k_proj", gguf = "attn_k", rope_permute = "head_count_kv")]
    pub k: W::Layer<D>,
    /// `hidden -> kv_heads * head_dim`.
    #[nnx(from = "v_proj", gguf = "attn_v")]
    pub v: W::Layer<D>,
    /// `heads * head_dim -> hidden`.
    #[nnx(from = "o_proj", gguf = "attn_output")]
    pub o: W::Layer<D>,
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
    /// Feed-forward network.
    #[nnx(gguf = "")]
    pub mlp: Mlp<D, W>,
}

/// Llama with its language-model head. `W` is how the projections (and the head) are stored:
/// [`Dense`] as published, or packed by
/// [`Quantize::quantize`](super::Quantize::quantize) or [`Llama::map_weights`].
#[derive(Module, Clone, Debug)]
pub struct Llama<D: Device = Host, W: Weights = Dense> {
    /// Token embeddings.
    #[nnx(from = "model.embed_tokens", gguf = "token_embd")]
    pub embed: TokenEmbedding<D>,
    /// The layers.
    #[nnx(from = "model.layers", gguf = "blk")]
    pub layers: Vec<Layer<D, W>>,
    /// Final norm.
    #[nnx(from = "model.norm", gguf = "output_norm")]
    pub norm: RmsNorm<D>,
    /// Output projection; `None` when it is the embedding (`tie_word_embeddings`).
    #[nnx(gguf = "output")]
    pub lm_head: Option<W::Layer<D>>,
    /// The divisor of each rotary frequency (F32 `[head_dim / 2]`) where the model scales its
    /// rope: from the configuration ([`DecoderConfig::rope_factors`]), and stored in a GGUF file
    /// of Llama 3 (whose metadata does not say it), which the loader then reads.
    #[nnx(optional, gguf = "rope_freqs.weight")]
    pub rope_freqs: Option<Tensor<D>>,
    /// Whether `q`'s and `k`'s rows are in llama.cpp's rotary pair order, as a GGUF file
    /// stores them (imported with
    /// [`ImportOptions::with_stored_rope_rows`](crate::ImportOptions::with_stored_rope_rows)):
    /// each head's outputs are then put back in halves order before the rotation, so that
    /// the weights are the file's bytes as they are rather than a reordered copy.
    #[nnx(skip)]
    pub stored_rope_rows: bool,
    /// The configuration.
    #[nnx(skip)]
    pub config: LlamaConfig,
}

impl Llama {
    /// A model of `config` in `dtype`; [`Init::Meta`] allocates nothing, for importing.
    pub fn new(config: &LlamaConfig, dtype: DType, init: Init) -> Llama {
        let hidden = config.hidden_size;
        let (q_width, kv_width) =
            (config.num_attention_heads * config.head_dim(), config.kv_heads() * config.head_dim());
        let linear = |input: usize, output: usize, init: Init| {
            Linear::builder(input, output).bias(false).dtype(dtype).init(init).build()
        };
        let norm = || RmsNorm::builder(hidden).eps(config.rms_norm_eps).dtype(dtype).init(init).build();
        let layers = (0..config.num_hidden_layers)
            .map(|layer| {
                let init = init.at(&format!("layers.{layer}"));
                Layer {
                    attn_norm: norm(),
                    attn: Attention {
                        q: linear(hidden, q_width, init.at("attn.q")),
                        k: linear(hidden, kv_width, init.at("attn.k")),
                        v: linear(hidden, kv_width, init.at("attn.v")),
                        o: linear(q_width, hidden, init.at("attn.o")),
                    },
                    mlp_norm: norm(),
                    mlp: Mlp {
                        gate: linear(hidden, config.intermediate_size, init.at("mlp.gate")),
                        up: linear(hidden, config.intermediate_size, init.at("mlp.up")),
                        down: linear(config.intermediate_size, hidden, init.at("mlp.down")),
                    },
                }
            })
            .collect();
        let rope_freqs =
            config.rope_factors().filter(|factors| factors.iter().any(|&factor| factor != 1.0)).map(|factors| {
                let pairs = factors.len();
                Tensor::from_vec(factors, &[pairs]).expect("one factor per rotary pair")
            });
        Llama {
            embed: TokenEmbedding::new(config.vocab_size, hidden, dtype, init.at("embed")),
            layers,
            norm: norm(),
            lm_head: (!config.tie_word_embeddings).then(|| linear(hidden, config.vocab_size, init.at("lm_head"))),
            rope_freqs,
            stored_rope_rows: false,
            config: config.clone(),
        }
    }
}

impl<D: Device, W: Weights> Llama<D, W>
where
    Tensor<D>: Compute,
    W::Layer<D>: Project<D>,
    GgmlLinear<D>: Project<D>,
{
    /// `t` `[rows, heads * head_dim]` with each head in halves order (the rotation's pairs
    /// `head_dim / 2` apart): as it is, or from pair order where [`Llama::stored_rope_rows`].
    fn halves_order(&self, t: Tensor<D>, heads: usize, head_dim: usize) -> crate::Result<Tensor<D>> {
        if !self.stored_rope_rows {
            return Ok(t);
        }
        let rows = t.shape()[0];
        let halves = Compute::reshape(&t, &[rows, heads, head_dim / 2, 2])?.permute(&[0, 1, 3, 2])?;
        Compute::reshape(&Compute::contiguous(&halves)?, &[rows, heads * head_dim])
    }

    fn run(&self, ids: &[u32], mut pass: Pass<'_, D>) -> crate::Result<Tensor<D>> {
        let config = &self.config;
        let (heads, kv_heads, head_dim) = (config.num_attention_heads, config.kv_heads(), config.head_dim());
        // The divisors are read once a pass, on the host, where the rotation reads them.
        let factors = match &self.rope_freqs {
            Some(factors) => Some(Compute::to_host(factors)?.to_dtype(DType::F32)?.to_vec::<f32>()?),
            None => None,
        };
        let rotary = Rotary { theta: config.theta(), factors, scale: config.rope_scale() };
        let mut h = self.embed.forward(ids)?;
        for (index, layer) in self.layers.iter().enumerate() {
            let attn = &layer.attn;
            let x = layer.attn_norm.forward(&h)?;
            let [q, k, v] = super::project_all([&attn.q, &attn.k, &attn.v], &x)?;
            let q = self.halves_order(q, heads, head_dim)?;
            let q = pass.heads(&q, heads, head_dim, None, Some(&rotary))?;
            let k = self.halves_order(k, kv_heads, head_dim)?;
            let k = pass.heads(&k, kv_heads, head_dim, None, Some(&rotary))?;
            let v = pass.heads(&v, kv_heads, head_dim, None, None)?;
            let context = pass.attend(index, &q, k, v, None)?;
            h = h.add(&attn.o.project(&context)?)?;
            h = h.add(&layer.mlp.forward(&layer.mlp_norm.forward(&h)?, Compute::silu)?)?;
        }
        let x = self.norm.forward(&pass.finish(h)?)?;
        match &self.lm_head {
            Some(head) => head.project(&x),
            None => self.embed.project(&x),
        }
    }
}

super::decoder::causal_lm!(Llama);

/// A folder of `LlamaForCausalLM` (`model_type` `llama`), in the dtype of its weights (BF16
/// checkpoints load as BF16 views of the file).
impl crate::Pretrained for Llama {
    type Config = LlamaConfig;
    const MODEL_TYPE: &'static str = "llama";
    const ARCHITECTURE: &'static str = "LlamaForCausalLM";

    fn config(&self) -> &LlamaConfig {
        &self.config
    }

    fn build(config: &LlamaConfig, dtype: DType) -> crate::Result<Llama> {
        Ok(Llama::new(config, dtype, Init::Meta))
    }

    fn check_config(config: &LlamaConfig, path: &Path) -> crate::Result<()> {
        config.check(path)
    }
}
