//! Llama as Hugging Face stores it (`model.layers.N.self_attn.q_proj`, ...): grouped-query
//! attention (fewer key/value heads than query heads), RMSNorm, a SwiGLU MLP, and an `lm_head`
//! of its own. BF16 checkpoints import as BF16 views of the file.

use std::path::Path;

use super::{Affine, Dense, Project, Weights};
use crate::generate::KvCache;
use crate::nn::{Embedding, Init, Linear, RmsNorm};
use crate::{Compute, DType, Device, Host, Module, Tensor};

/// The fields of a Llama `config.json` that shape the model.
///
/// The fields nnx does not use are kept in [`extra`](LlamaConfig::extra), so a configuration
/// read and written again ([`crate::Pretrained::save_pretrained`]) loses none of them.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
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
    /// Every other field of the file (`model_type`, `hidden_act`, token ids, ...), as read:
    /// nnx does not use them and writes them back.
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

/// The `rope_parameters` object of newer configs.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RopeParameters {
    /// Rotary base.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_theta: Option<f32>,
    /// Every other field of the object (`rope_type`, scaling factors, ...), as read.
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
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
        checks.positive("vocab_size", self.vocab_size)?;
        checks.positive("hidden_size", self.hidden_size)?;
        checks.positive("intermediate_size", self.intermediate_size)?;
        checks.positive("num_attention_heads", self.num_attention_heads)?;
        if let Some(kv_heads) = self.num_key_value_heads {
            checks.positive("num_key_value_heads", kv_heads)?;
            checks.divides("num_key_value_heads", kv_heads, ("num_attention_heads", self.num_attention_heads))?;
        }
        match self.head_dim {
            Some(head_dim) => {
                checks.positive("head_dim", head_dim)?;
                checks.even("head_dim", head_dim, "rotary position embeddings turn pairs of values")?;
            }
            None => {
                let heads = self.num_attention_heads;
                checks.divides("num_attention_heads", heads, ("hidden_size", self.hidden_size))?;
                checks.even(
                    "hidden_size / num_attention_heads",
                    self.hidden_size / heads,
                    "rotary position embeddings turn pairs of values",
                )?;
            }
        }
        if let Some(context) = self.max_position_embeddings {
            checks.positive("max_position_embeddings", context)?;
        }
        checks.at_most("num_hidden_layers", self.num_hidden_layers, super::MAX_LAYERS)?;
        let (hidden, inner, head_dim) = (self.hidden_size, self.intermediate_size, self.head_dim());
        // The attention widths are computed even for a model without layers.
        checks.addressable(
            &[("num_attention_heads", self.num_attention_heads), ("head_dim", head_dim)],
            1,
            &[&[self.num_attention_heads, head_dim]],
            &[],
        )?;
        checks.addressable(
            &[
                ("vocab_size", self.vocab_size),
                ("hidden_size", hidden),
                ("intermediate_size", inner),
                ("num_attention_heads", self.num_attention_heads),
                ("head_dim", head_dim),
            ],
            self.num_hidden_layers,
            &[
                &[2, hidden, self.num_attention_heads, head_dim],
                &[2, hidden, self.kv_heads(), head_dim],
                &[3, hidden, inner],
                &[2, hidden],
            ],
            &[&[2, self.vocab_size, hidden], &[1, hidden]],
        )
    }

    /// Width of one head.
    pub fn head_dim(&self) -> usize {
        self.head_dim.unwrap_or(self.hidden_size / self.num_attention_heads.max(1))
    }

    /// The rotary base: `rope_parameters.rope_theta`, else `rope_theta`, else 10000.
    pub fn theta(&self) -> f32 {
        self.rope_parameters.as_ref().and_then(|rope| rope.rope_theta).or(self.rope_theta).unwrap_or(10_000.0)
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
    /// `hidden -> heads * head_dim`.
    #[nnx(from = "q_proj")]
    pub q: W::Layer<D>,
    /// `hidden -> kv_heads * head_dim`.
    #[nnx(from = "k_proj")]
    pub k: W::Layer<D>,
    /// `hidden -> kv_heads * head_dim`.
    #[nnx(from = "v_proj")]
    pub v: W::Layer<D>,
    /// `heads * head_dim -> hidden`.
    #[nnx(from = "o_proj")]
    pub o: W::Layer<D>,
}

/// The SwiGLU feed-forward network: `down(silu(gate(x)) * up(x))`.
#[derive(Module, Clone, Debug)]
pub struct Mlp<D: Device = Host, W: Weights = Dense> {
    /// Gate projection.
    #[nnx(from = "gate_proj")]
    pub gate: W::Layer<D>,
    /// Up projection.
    #[nnx(from = "up_proj")]
    pub up: W::Layer<D>,
    /// Down projection.
    #[nnx(from = "down_proj")]
    pub down: W::Layer<D>,
}

/// One decoder layer.
#[derive(Module, Clone, Debug)]
pub struct Layer<D: Device = Host, W: Weights = Dense> {
    /// Norm before attention.
    #[nnx(from = "input_layernorm")]
    pub attn_norm: RmsNorm<D>,
    /// Self-attention.
    #[nnx(from = "self_attn")]
    pub attn: Attention<D, W>,
    /// Norm before the MLP.
    #[nnx(from = "post_attention_layernorm")]
    pub mlp_norm: RmsNorm<D>,
    /// Feed-forward network.
    pub mlp: Mlp<D, W>,
}

/// Llama with its language-model head. `W` is how the projections (and the head) are stored:
/// [`Dense`] as published, or packed by [`Llama::quantize`] or [`Llama::map_weights`].
#[derive(Module, Clone, Debug)]
pub struct Llama<D: Device = Host, W: Weights = Dense> {
    /// Token embeddings.
    #[nnx(from = "model.embed_tokens")]
    pub embed: Embedding<D>,
    /// The layers.
    #[nnx(from = "model.layers")]
    pub layers: Vec<Layer<D, W>>,
    /// Final norm.
    #[nnx(from = "model.norm")]
    pub norm: RmsNorm<D>,
    /// Output projection.
    pub lm_head: W::Layer<D>,
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
        Llama {
            embed: Embedding::builder(config.vocab_size, hidden).dtype(dtype).init(init.at("embed")).build(),
            layers,
            norm: norm(),
            lm_head: linear(hidden, config.vocab_size, init.at("lm_head")),
            config: config.clone(),
        }
    }

    /// This model with every projection and the head quantized to MLX affine `bits`-bit values
    /// in groups of `group_size` (as `mlx.nn.quantize` does; the embedding and norms stay as
    /// they are). A decoded token then reads about `bits / 32` of the f32 weight bytes.
    ///
    /// # Errors
    /// As [`QuantizedLinear::from_linear`](crate::quant::QuantizedLinear::from_linear): an
    /// unsupported width or group, or a width not a multiple of the group.
    pub fn quantize(&self, bits: u32, group_size: usize) -> crate::Result<Llama<Host, Affine>> {
        self.map_weights(|linear| crate::quant::QuantizedLinear::from_linear(linear, bits, group_size))
    }
}

impl<W: Weights> Llama<Host, W> {
    /// This model with every projection and the head turned into the layers of `V` by
    /// `convert`: for example [`SeedLinear::from_linear`](crate::quant::SeedLinear::from_linear)
    /// for [`Seed`](super::Seed), or
    /// [`QuantizedLinear::to_linear`](crate::quant::QuantizedLinear::to_linear) back to
    /// [`Dense`]. The embedding, norms and configuration are cloned.
    ///
    /// # Errors
    /// The first error of `convert`.
    pub fn map_weights<V: Weights>(
        &self,
        convert: impl Fn(&W::Layer<Host>) -> crate::Result<V::Layer<Host>>,
    ) -> crate::Result<Llama<Host, V>> {
        let layers = self
            .layers
            .iter()
            .map(|layer| {
                let (attn, mlp) = (&layer.attn, &layer.mlp);
                Ok(Layer {
                    attn_norm: layer.attn_norm.clone(),
                    attn: Attention {
                        q: convert(&attn.q)?,
                        k: convert(&attn.k)?,
                        v: convert(&attn.v)?,
                        o: convert(&attn.o)?,
                    },
                    mlp_norm: layer.mlp_norm.clone(),
                    mlp: Mlp { gate: convert(&mlp.gate)?, up: convert(&mlp.up)?, down: convert(&mlp.down)? },
                })
            })
            .collect::<crate::Result<Vec<_>>>()?;
        Ok(Llama {
            embed: self.embed.clone(),
            layers,
            norm: self.norm.clone(),
            lm_head: convert(&self.lm_head)?,
            config: self.config.clone(),
        })
    }
}

impl<D: Device, W: Weights> Llama<D, W>
where
    Tensor<D>: Compute,
    W::Layer<D>: Project<D>,
{
    /// Logits for every position of one sequence, `[ids.len(), vocab]` in F32 (weights of any
    /// float dtype; activations in f32), on the model's device.
    ///
    /// # Errors
    /// A token id past the vocabulary.
    pub fn forward(&self, ids: &[u32]) -> crate::Result<Tensor<D>> {
        let config = &self.config;
        let (seq, head_dim) = (ids.len(), config.head_dim());
        let positions: Vec<usize> = (0..seq).collect();
        let split_heads = |t: Tensor<D>, heads: usize| -> crate::Result<Tensor<D>> {
            Compute::contiguous(&Compute::reshape(&t, &[1, seq, heads, head_dim])?.permute(&[0, 2, 1, 3])?)
        };
        let mut h = self.embed.forward(ids)?;
        for layer in &self.layers {
            let x = layer.attn_norm.forward(&h)?;
            let q = split_heads(layer.attn.q.project(&x)?, config.num_attention_heads)?
                .rotary(&positions, config.theta())?;
            let k = split_heads(layer.attn.k.project(&x)?, config.kv_heads())?.rotary(&positions, config.theta())?;
            let v = split_heads(layer.attn.v.project(&x)?, config.kv_heads())?;
            let context = Compute::attention(&q, &k, &v, true, None)?;
            let merged =
                Compute::reshape(&context.permute(&[0, 2, 1, 3])?, &[seq, config.num_attention_heads * head_dim])?;
            h = h.add(&layer.attn.o.project(&merged)?)?;
            let x = layer.mlp_norm.forward(&h)?;
            let gated = layer.mlp.gate.project(&x)?.silu()?.mul(&layer.mlp.up.project(&x)?)?;
            h = h.add(&layer.mlp.down.project(&gated)?)?;
        }
        self.lm_head.project(&self.norm.forward(&h)?)
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
        let config = &self.config;
        let batch = cache.batch();
        let seq = super::cached_rows(ids, batch)?;
        let (head_dim, hidden) = (config.head_dim(), config.hidden_size);
        let positions = cache.positions(seq);
        let key_mask = cache.key_mask(seq);
        // `[batch * seq, heads * head_dim]` as `[batch, heads, seq, head_dim]`, rotated. Rotary
        // takes one position per row of its sequence axis, so the batch joins that axis while
        // the positions are applied (each sequence has its own).
        let rotated_heads = |t: Tensor<D>, heads: usize| -> crate::Result<Tensor<D>> {
            let rows = Compute::reshape(&t, &[1, batch * seq, heads, head_dim])?.permute(&[0, 2, 1, 3])?;
            let rotated = rows.rotary(&positions, config.theta())?;
            Compute::reshape(&rotated, &[heads, batch, seq, head_dim])?.permute(&[1, 0, 2, 3])
        };
        let split_heads = |t: Tensor<D>, heads: usize| -> crate::Result<Tensor<D>> {
            Compute::reshape(&t, &[batch, seq, heads, head_dim])?.permute(&[0, 2, 1, 3])
        };
        let mut h = self.embed.forward(ids)?;
        for (index, layer) in self.layers.iter().enumerate() {
            let x = layer.attn_norm.forward(&h)?;
            let q = rotated_heads(layer.attn.q.project(&x)?, config.num_attention_heads)?;
            let k = rotated_heads(layer.attn.k.project(&x)?, config.kv_heads())?;
            let v = split_heads(layer.attn.v.project(&x)?, config.kv_heads())?;
            let (keys, values) = cache.update(index, &k, &v)?;
            let context = Compute::attention(&q, &keys, &values, true, key_mask.as_deref())?;
            let merged = Compute::reshape(
                &context.permute(&[0, 2, 1, 3])?,
                &[batch * seq, config.num_attention_heads * head_dim],
            )?;
            h = h.add(&layer.attn.o.project(&merged)?)?;
            let x = layer.mlp_norm.forward(&h)?;
            let gated = layer.mlp.gate.project(&x)?.silu()?.mul(&layer.mlp.up.project(&x)?)?;
            h = h.add(&layer.mlp.down.project(&gated)?)?;
        }
        cache.advance(seq)?;
        let last =
            Compute::reshape(&Compute::reshape(&h, &[batch, seq, hidden])?.narrow(1, seq - 1, 1)?, &[batch, hidden])?;
        self.lm_head.project(&self.norm.forward(&last)?)
    }
}

impl<D: Device, W: Weights> super::CausalLm for Llama<D, W>
where
    Tensor<D>: Compute,
    W::Layer<D>: Project<D>,
{
    type Device = D;

    fn logits(&self, ids: &[u32]) -> crate::Result<Tensor> {
        Compute::to_host(&self.forward(ids)?)
    }

    /// [`LlamaConfig::context_length`].
    fn context_length(&self) -> usize {
        self.config.context_length()
    }

    fn new_cache(&self, batch: usize, capacity: usize) -> crate::Result<KvCache<D>> {
        super::check_capacity(capacity, self.context_length())?;
        let config = &self.config;
        KvCache::new(&self.embed.weight, self.layers.len(), batch, config.kv_heads(), config.head_dim(), capacity)
    }

    fn forward_cached(&self, ids: &[u32], cache: &mut KvCache<D>) -> crate::Result<Tensor> {
        Compute::to_host(&self.forward_with_cache(ids, cache)?)
    }
}

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
