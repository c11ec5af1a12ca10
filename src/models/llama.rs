//! Llama (and Mistral, the same decoder) as transformers stores it
//! (`model.layers.N.self_attn.q_proj`, ...) and as llama.cpp's converter writes it to GGUF
//! (`blk.N.attn_q`, its query and key rows in llama.cpp's rotary order): grouped-query attention
//! (fewer key/value heads than query heads), RMSNorm, a SwiGLU MLP, Llama 3's rope scaling, and
//! an `lm_head` of its own or tied to the embedding. BF16 checkpoints import as BF16 views of
//! the file.

use std::path::Path;

pub use super::decoder::Mlp;
use super::decoder::{Pass, Rotary};
use super::{Dense, Project, TokenEmbedding, Weights};
use crate::generate::KvCache;
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
    #[serde(default = "default_epsilon")]
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
    /// Llama 3: the context the model was first trained for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub original_max_position_embeddings: Option<usize>,
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

    /// Linear scaling by `factor`, as llama.cpp's hyperparameters give it.
    pub(crate) fn linear(theta: Option<f32>, factor: f32) -> RopeParameters {
        RopeParameters {
            rope_theta: theta,
            rope_type: Some("linear".into()),
            factor: Some(f64::from(factor)),
            ..RopeParameters::default()
        }
    }
}

fn default_epsilon() -> f32 {
    1e-6
}

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
    /// [`MAX_LAYERS`](super::MAX_LAYERS) layers, and weights small enough to address. `path`
    /// names the file in the error.
    ///
    /// # Errors
    /// [`crate::Error::ConfigField`] naming the first field at fault.
    pub fn check(&self, path: &Path) -> crate::Result<()> {
        let checks = super::Checks::new(path);
        let thetas = [("rope_theta", self.theta())];
        super::decoder::Shape {
            hidden: self.hidden_size,
            inner: self.intermediate_size,
            layers: self.num_hidden_layers,
            heads: self.num_attention_heads,
            kv_heads: self.num_key_value_heads,
            head_dim: self.head_dim,
            vocab: self.vocab_size,
            vectors: 2,
            context: self.max_position_embeddings,
            eps: self.rms_norm_eps,
            thetas: &thetas,
        }
        .check(&checks)?;
        self.check_rope_scaling(&checks)
    }

    /// The rope scaling's numbers: a finite positive `factor`, and for Llama 3's scaling
    /// finite positive frequency factors, the high one above the low one (the smoothing
    /// divides by their difference), and a positive original context.
    fn check_rope_scaling(&self, checks: &super::Checks<'_>) -> crate::Result<()> {
        let Some((field, settings)) = self.rope_scaling() else { return Ok(()) };
        match settings.scaling() {
            Some("linear") => checks.finite_positive(&format!("{field}.factor"), settings.factor.unwrap_or(1.0)),
            Some("llama3") => {
                let (low, high) = (settings.low_freq_factor.unwrap_or(1.0), settings.high_freq_factor.unwrap_or(4.0));
                checks.finite_positive(&format!("{field}.factor"), settings.factor.unwrap_or(8.0))?;
                checks.finite_positive(&format!("{field}.low_freq_factor"), low)?;
                checks.finite_positive(&format!("{field}.high_freq_factor"), high)?;
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
                    settings.original_max_position_embeddings.unwrap_or(8192),
                )
            }
            _ => Ok(()),
        }
    }

    /// Width of one head.
    pub fn head_dim(&self) -> usize {
        self.head_dim.unwrap_or(self.hidden_size / self.num_attention_heads.max(1))
    }

    /// The rotary base: `rope_parameters.rope_theta`, else `rope_theta`, else 10000.
    pub fn theta(&self) -> f32 {
        self.rope_parameters.as_ref().and_then(|rope| rope.rope_theta).or(self.rope_theta).unwrap_or(10_000.0)
    }

    /// The divisor of each rotary frequency, `head_dim / 2` of them: Llama 3's rope scaling
    /// (`rope_type` `llama3`) or linear scaling (`factor`), else all 1. llama.cpp's converter
    /// writes the same numbers to a GGUF file as `rope_freqs.weight`.
    pub fn rope_factors(&self) -> Vec<f32> {
        let pairs = self.head_dim() / 2;
        let Some((_, settings)) = self.rope_scaling() else { return vec![1.0; pairs] };
        match settings.scaling() {
            Some("llama3") => nnx_core::llama3_rope_factors(
                self.head_dim(),
                self.theta(),
                settings.factor.unwrap_or(8.0) as f32,
                settings.low_freq_factor.unwrap_or(1.0) as f32,
                settings.high_freq_factor.unwrap_or(4.0) as f32,
                settings.original_max_position_embeddings.unwrap_or(8192),
            ),
            Some("linear") => vec![settings.factor.unwrap_or(1.0) as f32; pairs],
            _ => vec![1.0; pairs],
        }
    }

    /// The rope settings that scale, with the field they are in: `rope_parameters` (newer
    /// configs) when it names a scaling, else `rope_scaling` (older ones).
    fn rope_scaling(&self) -> Option<(&'static str, &RopeParameters)> {
        match &self.rope_parameters {
            Some(rope) if rope.scaling().is_some() => Some(("rope_parameters", rope)),
            _ => self.rope_scaling.as_ref().map(|scaling| ("rope_scaling", scaling)),
        }
    }

    /// The configuration llama.cpp's hyperparameters describe (`general.architecture`
    /// `llama`, which Mistral's files use too), for the model that [`Llama::new`] builds.
    /// `tied` says whether the file lacks `output.weight` (the head is the embedding). Llama 3's
    /// rope scaling is not in the metadata: the file's `rope_freqs.weight` holds it.
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
            rope_parameters: None,
            rope_scaling: None,
            extra,
        };
        config.check(keys.path())?;
        Ok(config)
    }

    /// Key/value heads.
    pub fn kv_heads(&self) -> usize {
        self.num_key_value_heads.unwrap_or(self.num_attention_heads)
    }

    /// `max_position_embeddings`, or 2048 when absent.
    pub fn context_length(&self) -> usize {
        self.max_position_embeddings.unwrap_or(2048)
    }
}

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
    /// rope: from the configuration ([`LlamaConfig::rope_factors`]), and stored in a GGUF file
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
        let factors = config.rope_factors();
        let rope_freqs = factors.iter().any(|&factor| factor != 1.0).then(|| {
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
    /// Logits for every position of one sequence, `[ids.len(), vocab]` in F32 (weights of any
    /// float dtype; activations in f32), on the model's device.
    ///
    /// # Errors
    /// A token id past the vocabulary.
    pub fn forward(&self, ids: &[u32]) -> crate::Result<Tensor<D>> {
        self.run(ids, Pass::alone(ids.len()))
    }

    /// The logits of the last token of each row of `ids` (one row per sequence of `cache`,
    /// row-major), `[batch, vocab]` in F32 on the model's device, computing only the new
    /// positions: their keys and values go into `cache` (one entry per key/value head, shared
    /// by its group of query heads), and rotary angles count from each sequence's first real
    /// token (see [`KvCache`]).
    ///
    /// # Errors
    /// A token id past the vocabulary, `ids` that are not whole rows, or
    /// [`Error::CacheFull`](crate::Error::CacheFull).
    pub fn forward_with_cache(&self, ids: &[u32], cache: &mut KvCache<D>) -> crate::Result<Tensor<D>> {
        self.run(ids, Pass::cached(ids, cache)?)
    }

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
        let rotary = Rotary { theta: config.theta(), factors };
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
            let x = layer.mlp_norm.forward(&h)?;
            let [gate, up] = super::project_all([&layer.mlp.gate, &layer.mlp.up], &x)?;
            let gated = gate.silu()?.mul(&up)?;
            h = h.add(&layer.mlp.down.project(&gated)?)?;
        }
        let x = self.norm.forward(&pass.finish(h)?)?;
        match &self.lm_head {
            Some(head) => head.project(&x),
            None => self.embed.project(&x),
        }
    }
}

super::decoder::causal_lm!(Llama, LlamaConfig, config => config.kv_heads(), config.head_dim());

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
