//! The pieces the decoder families (Llama, Qwen2/3, Gemma 3) share: the checks of a
//! configuration's shape, the rotary embedding of a group of layers, llama.cpp's GGUF
//! hyperparameters, the sliding/full layer types, and one forward pass's positions, masks and
//! cache.

use std::path::{Path, PathBuf};

use crate::generate::KvCache;
use crate::gguf::Metadata;
use crate::nn::RmsNorm;
use crate::{Compute, Device, Tensor};

/// The checks every decoder configuration (Llama, Qwen, Gemma 3) shares: sizes at least 1, the
/// key/value heads dividing the query heads, an even head width, a bounded layer count and
/// addressable weights.
pub(crate) struct Shape {
    pub(crate) hidden: usize,
    pub(crate) inner: usize,
    pub(crate) layers: usize,
    pub(crate) heads: usize,
    pub(crate) kv_heads: Option<usize>,
    pub(crate) head_dim: Option<usize>,
    pub(crate) vocab: usize,
    /// Hidden-sized vectors per layer (norms, biases) the weights bound counts.
    pub(crate) vectors: usize,
}

impl Shape {
    pub(crate) fn check(&self, checks: &super::Checks<'_>) -> crate::Result<()> {
        checks.positive("vocab_size", self.vocab)?;
        checks.positive("hidden_size", self.hidden)?;
        checks.positive("intermediate_size", self.inner)?;
        checks.positive("num_attention_heads", self.heads)?;
        if let Some(kv_heads) = self.kv_heads {
            checks.positive("num_key_value_heads", kv_heads)?;
            checks.divides("num_key_value_heads", kv_heads, ("num_attention_heads", self.heads))?;
        }
        let head_dim = match self.head_dim {
            Some(head_dim) => {
                checks.positive("head_dim", head_dim)?;
                checks.even("head_dim", head_dim, "rotary position embeddings turn pairs of values")?;
                head_dim
            }
            None => {
                checks.divides("num_attention_heads", self.heads, ("hidden_size", self.hidden))?;
                checks.even(
                    "hidden_size / num_attention_heads",
                    self.hidden / self.heads,
                    "rotary position embeddings turn pairs of values",
                )?;
                self.hidden / self.heads
            }
        };
        checks.at_most("num_hidden_layers", self.layers, super::MAX_LAYERS)?;
        let kv_heads = self.kv_heads.unwrap_or(self.heads);
        checks.addressable(
            &[("num_attention_heads", self.heads), ("head_dim", head_dim)],
            1,
            &[&[self.heads, head_dim]],
            &[],
        )?;
        checks.addressable(
            &[
                ("vocab_size", self.vocab),
                ("hidden_size", self.hidden),
                ("intermediate_size", self.inner),
                ("num_attention_heads", self.heads),
                ("head_dim", head_dim),
            ],
            self.layers,
            &[
                &[2, self.hidden, self.heads, head_dim],
                &[2, self.hidden, kv_heads, head_dim],
                &[3, self.hidden, self.inner],
                &[self.vectors, self.hidden],
            ],
            &[&[2, self.vocab, self.hidden], &[1, self.hidden]],
        )
    }
}

/// A configuration that is not the model's: [`crate::Error::Config`] naming `path`.
pub(crate) fn unusable(path: &Path, message: String) -> crate::Error {
    crate::Error::Config { path: path.to_path_buf(), problem: crate::error::ConfigProblem::NotModelConfig { message } }
}

/// The factor of a linear rope scaling given by `settings` (`rope_type`, or the older `type`,
/// and `factor`), or `None` for the default rotary embedding; `field` names the object in
/// errors.
///
/// # Errors
/// [`crate::Error::Config`] for another rope type (nnx computes `default` and `linear`),
/// [`crate::Error::ConfigField`] for a factor that is not a positive number.
pub(crate) fn linear_rope_factor(
    settings: &serde_json::Map<String, serde_json::Value>,
    field: &str,
    path: &Path,
) -> crate::Result<Option<f32>> {
    let kind = settings.get("rope_type").or_else(|| settings.get("type")).and_then(|kind| kind.as_str());
    match kind.unwrap_or("default") {
        "default" => Ok(None),
        "linear" => {
            let factor = settings.get("factor").and_then(serde_json::Value::as_f64).unwrap_or(1.0) as f32;
            if factor > 0.0 && factor.is_finite() {
                Ok(Some(factor))
            } else {
                Err(crate::Error::ConfigField {
                    path: path.to_path_buf(),
                    field: format!("{field}.factor"),
                    found: factor.max(0.0) as u64,
                    rule: crate::error::ConfigRule::Positive,
                })
            }
        }
        other => Err(unusable(
            path,
            format!(
                "`{field}` asks for `{other}` rotary embeddings; nnx computes the `default` and `linear` ones: \
                 remove the scaling to run the model at its original context length"
            ),
        )),
    }
}

/// The rotary embedding of a group of layers: its base and, for linear scaling, the factor
/// every frequency is divided by.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Rotary {
    pub(crate) theta: f32,
    pub(crate) factors: Option<Vec<f32>>,
}

impl Rotary {
    /// The base `theta` with every frequency of a `head_dim`-wide head divided by `factor`.
    pub(crate) fn new(theta: f32, factor: Option<f32>, head_dim: usize) -> Rotary {
        Rotary { theta, factors: factor.map(|factor| vec![factor; head_dim / 2]) }
    }

    /// `x` `[batch, heads, seq, head_dim]` turned to `positions`.
    pub(crate) fn apply<T: Compute>(&self, x: &T, positions: &[usize]) -> crate::Result<T> {
        match &self.factors {
            Some(factors) => Compute::rotary_scaled(x, positions, self.theta, factors),
            None => Compute::rotary(x, positions, self.theta),
        }
    }
}

/// Reads llama.cpp's hyperparameters `{arch}.*` from GGUF metadata, each failure naming the
/// key.
pub(crate) struct GgufKeys<'a> {
    metadata: &'a Metadata,
    arch: &'a str,
}

impl<'a> GgufKeys<'a> {
    /// The keys of `metadata`, whose `general.architecture` must be one of `architectures`.
    pub(crate) fn new(metadata: &'a Metadata, architectures: &[&str], reader: &str) -> crate::Result<GgufKeys<'a>> {
        let arch = metadata.architecture().ok_or_else(|| GgufKeys::missing("general.architecture"))?;
        if !architectures.contains(&arch) {
            return Err(unusable(
                &GgufKeys::origin(),
                format!(
                    "`general.architecture` is `{arch}`; {reader} reads {}",
                    architectures.iter().map(|arch| format!("`{arch}`")).collect::<Vec<_>>().join(" and ")
                ),
            ));
        }
        Ok(GgufKeys { metadata, arch })
    }

    /// The architecture.
    pub(crate) fn arch(&self) -> &'a str {
        self.arch
    }

    /// What errors about GGUF metadata name as the configuration file.
    pub(crate) fn origin() -> PathBuf {
        PathBuf::from("GGUF metadata")
    }

    fn missing(key: &str) -> crate::Error {
        crate::Error::NoEntry { origin: "the GGUF metadata".into(), name: key.to_string(), suggestion: None }
    }

    fn key(&self, suffix: &str) -> String {
        format!("{}.{suffix}", self.arch)
    }

    /// `{arch}.{suffix}` as a size, when present.
    pub(crate) fn size(&self, suffix: &str) -> Option<usize> {
        self.metadata.get(&self.key(suffix))?.as_usize()
    }

    /// `{arch}.{suffix}` as a size.
    pub(crate) fn required_size(&self, suffix: &str) -> crate::Result<usize> {
        self.size(suffix).ok_or_else(|| GgufKeys::missing(&self.key(suffix)))
    }

    /// `{arch}.{suffix}` as a number, when present.
    pub(crate) fn number(&self, suffix: &str) -> Option<f32> {
        Some(self.metadata.f64(&self.key(suffix))? as f32)
    }

    /// `{arch}.{suffix}` as a number.
    pub(crate) fn required_number(&self, suffix: &str) -> crate::Result<f32> {
        self.number(suffix).ok_or_else(|| GgufKeys::missing(&self.key(suffix)))
    }

    /// `{arch}.{suffix}` as it is stored, when present.
    pub(crate) fn value(&self, suffix: &str) -> Option<&'a crate::gguf::Value> {
        self.metadata.get(&self.key(suffix))
    }

    /// The vocabulary size: the length of `tokenizer.ggml.tokens`.
    pub(crate) fn vocab_size(&self) -> crate::Result<usize> {
        const TOKENS: &str = "tokenizer.ggml.tokens";
        let tokens = self.metadata.get(TOKENS).and_then(|tokens| tokens.as_array());
        tokens.map(|tokens| tokens.len()).ok_or_else(|| GgufKeys::missing(TOKENS))
    }

    /// The linear rope scaling factor of `{arch}.rope.scaling.*` (llama.cpp's type defaults
    /// to linear, and a factor of 0 or none means no scaling).
    ///
    /// # Errors
    /// [`crate::Error::Config`] for another scaling type.
    pub(crate) fn linear_rope_factor(&self) -> crate::Result<Option<f32>> {
        let factor = self.number("rope.scaling.factor").or_else(|| self.number("rope.scale_linear"));
        let kind = self.value("rope.scaling.type").and_then(|kind| kind.as_str()).unwrap_or("linear");
        match (kind, factor) {
            ("none", _) | (_, None) => Ok(None),
            (_, Some(factor)) if factor == 0.0 || factor == 1.0 => Ok(None),
            ("linear", Some(factor)) if factor > 0.0 && factor.is_finite() => Ok(Some(factor)),
            (kind, Some(factor)) => Err(unusable(
                &GgufKeys::origin(),
                format!(
                    "`{}` is `{kind}` with factor {factor}; nnx computes linear rope scaling only",
                    self.key("rope.scaling.type")
                ),
            )),
        }
    }
}

/// The `layer_types` entry of a layer with a sliding window.
pub(crate) const SLIDING: &str = "sliding_attention";
/// The `layer_types` entry of a layer that sees every key.
pub(crate) const FULL: &str = "full_attention";

/// One entry per layer, each `sliding_attention` or `full_attention`.
pub(crate) fn check_layer_types(types: &[String], layers: usize, path: &Path) -> crate::Result<()> {
    if types.len() != layers {
        return Err(crate::Error::ConfigField {
            path: path.to_path_buf(),
            field: "layer_types".into(),
            found: types.len() as u64,
            rule: crate::error::ConfigRule::OneOf { allowed: vec![layers as u64] },
        });
    }
    match types.iter().position(|kind| kind != SLIDING && kind != FULL) {
        Some(at) => Err(unusable(
            path,
            format!("`layer_types[{at}]` is `{}`; each entry is `{SLIDING}` or `{FULL}`", types[at]),
        )),
        None => Ok(()),
    }
}

/// Where the keys and values of one pass come from: the pass alone, or a cache the pass is
/// appended to.
pub(crate) struct Pass<'a, D: Device> {
    /// Sequences, each `seq` of the ids.
    pub(crate) batch: usize,
    /// The rotary position of each id, row-major.
    pub(crate) positions: Vec<usize>,
    /// The keys each query may see (padding hidden), `batch * (cached + seq)` row-major.
    pub(crate) key_mask: Option<Vec<bool>>,
    /// The cache, when decoding.
    pub(crate) cache: Option<&'a mut KvCache<D>>,
}

impl<'a, D: Device> Pass<'a, D>
where
    Tensor<D>: Compute,
{
    /// One sequence of `seq` ids, without a cache.
    pub(crate) fn alone(seq: usize) -> Pass<'a, D> {
        Pass { batch: 1, positions: (0..seq).collect(), key_mask: None, cache: None }
    }

    /// Rows of `ids` after the positions `cache` holds.
    pub(crate) fn cached(ids: &[u32], cache: &'a mut KvCache<D>) -> crate::Result<Pass<'a, D>> {
        let batch = cache.batch();
        let seq = super::cached_rows(ids, batch)?;
        Ok(Pass { batch, positions: cache.positions(seq), key_mask: cache.key_mask(seq), cache: Some(cache) })
    }

    /// `t` `[batch * seq, heads * head_dim]` as `[batch, heads, seq, head_dim]`, each head
    /// normalized by `norm` and turned by `rotary` when given.
    pub(crate) fn heads(
        &self,
        t: &Tensor<D>,
        heads: usize,
        head_dim: usize,
        norm: Option<&RmsNorm<D>>,
        rotary: Option<&Rotary>,
    ) -> crate::Result<Tensor<D>> {
        let rows = t.shape()[0];
        let seq = rows / self.batch;
        let t = match norm {
            Some(norm) => norm.forward(&Compute::reshape(t, &[rows, heads, head_dim])?)?,
            None => t.clone(),
        };
        match rotary {
            // Rotary takes one position per row of its sequence axis, so the batch joins that
            // axis while the positions are applied (each sequence has its own).
            Some(rotary) => {
                let joined = Compute::reshape(&t, &[1, rows, heads, head_dim])?.permute(&[0, 2, 1, 3])?;
                let turned = rotary.apply(&joined, &self.positions)?;
                Compute::reshape(&turned, &[heads, self.batch, seq, head_dim])?.permute(&[1, 0, 2, 3])
            }
            None => Compute::reshape(&t, &[self.batch, seq, heads, head_dim])?.permute(&[0, 2, 1, 3]),
        }
    }

    /// Attention of `q` over `k` and `v` (appended to the cache's layer `layer` first, when
    /// there is a cache), causal, over the last `window` keys when given; the result as
    /// `[batch * seq, heads * head_dim]`.
    pub(crate) fn attend(
        &mut self,
        layer: usize,
        q: &Tensor<D>,
        k: Tensor<D>,
        v: Tensor<D>,
        window: Option<usize>,
    ) -> crate::Result<Tensor<D>> {
        let (keys, values) = match self.cache.as_deref_mut() {
            Some(cache) => cache.update(layer, &k, &v)?,
            None => (k, v),
        };
        let key_mask = self.key_mask.as_deref();
        let context = match window {
            Some(window) => Compute::attention_windowed(q, &keys, &values, key_mask, window)?,
            None => Compute::attention(q, &keys, &values, true, key_mask)?,
        };
        let (heads, seq, head_dim) = (q.shape()[1], q.shape()[2], q.shape()[3]);
        Compute::reshape(&context.permute(&[0, 2, 1, 3])?, &[self.batch * seq, heads * head_dim])
    }

    /// Marks the pass's `seq` positions as cached, and keeps the last row of each sequence of
    /// `h` `[batch * seq, hidden]`; without a cache, `h` as it is.
    pub(crate) fn finish(&mut self, h: Tensor<D>) -> crate::Result<Tensor<D>> {
        let Some(cache) = self.cache.as_deref_mut() else { return Ok(h) };
        let (rows, hidden) = (h.shape()[0], h.shape()[1]);
        let seq = rows / self.batch;
        cache.advance(seq)?;
        let last = Compute::reshape(&h, &[self.batch, seq, hidden])?.narrow(1, seq - 1, 1)?;
        Compute::reshape(&last, &[self.batch, hidden])
    }
}

/// The [`CausalLm`](super::CausalLm) of a decoder family `$model` whose `forward` and
/// `forward_with_cache` give the hidden states' logits: the cache is shaped by its config's
/// key/value heads and head width (`config => KV_HEADS, HEAD_DIM`), in the dtype its embedding
/// computes in.
macro_rules! causal_lm {
    ($model:ident, $config:ident, $c:ident => $kv_heads:expr, $head_dim:expr) => {
        impl<D: $crate::Device, W: $crate::models::Weights> $crate::models::CausalLm for $model<D, W>
        where
            $crate::Tensor<D>: $crate::Compute,
            W::Layer<D>: $crate::models::Project<D>,
            $crate::quant::ggml::GgmlLinear<D>: $crate::models::Project<D>,
        {
            type Device = D;

            fn logits(&self, ids: &[u32]) -> $crate::Result<$crate::Tensor> {
                $crate::Compute::to_host(&self.forward(ids)?)
            }

            #[doc = concat!("[`", stringify!($config), "::context_length`].")]
            fn context_length(&self) -> usize {
                self.config.context_length()
            }

            fn new_cache(&self, batch: usize, capacity: usize) -> $crate::Result<$crate::generate::KvCache<D>> {
                $crate::models::check_capacity(capacity, self.context_length())?;
                let $c = &self.config;
                $crate::generate::KvCache::new(
                    self.embed.cache_like(&self.norm.weight),
                    self.layers.len(),
                    batch,
                    $kv_heads,
                    $head_dim,
                    capacity,
                )
            }

            fn forward_cached(
                &self,
                ids: &[u32],
                cache: &mut $crate::generate::KvCache<D>,
            ) -> $crate::Result<$crate::Tensor> {
                $crate::Compute::to_host(&self.forward_with_cache(ids, cache)?)
            }
        }
    };
}
pub(crate) use causal_lm;
