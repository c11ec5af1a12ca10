//! The pieces the decoder families (Llama, Qwen2/3, Gemma 3) share: the checks of a
//! configuration's shape, the rotary embedding of a group of layers, llama.cpp's GGUF
//! hyperparameters, the sliding/full layer types, and one forward pass's positions, masks and
//! cache.

use std::path::{Path, PathBuf};

use super::llama::RopeParameters;
use super::{Dense, Weights};
use crate::generate::KvCache;
use crate::gguf::Metadata;
use crate::nn::RmsNorm;
use crate::{Compute, Device, Host, Module, Tensor};

/// The checks every decoder configuration (Llama, Qwen, Gemma 3) shares: sizes at least 1, the
/// key/value heads dividing the query heads, an even head width of at most [`MAX_HEAD_DIM`], a
/// bounded layer count and context, addressable weights, finite positive rotary bases and a
/// finite epsilon, so that nothing is ever sized from a value that cannot make a model.
pub(crate) struct Shape<'a> {
    pub(crate) hidden: usize,
    pub(crate) inner: usize,
    pub(crate) layers: usize,
    pub(crate) heads: usize,
    pub(crate) kv_heads: Option<usize>,
    pub(crate) head_dim: Option<usize>,
    pub(crate) vocab: usize,
    /// Hidden-sized vectors per layer (norms, biases) the weights bound counts.
    pub(crate) vectors: usize,
    /// `max_position_embeddings`, when the file gives it.
    pub(crate) context: Option<usize>,
    /// The RMSNorm epsilon.
    pub(crate) eps: f32,
    /// Each rotary base with the field that gives it.
    pub(crate) thetas: &'a [(&'static str, f32)],
}

/// The widest attention head a configuration may ask for. Published models use 64 to 256 (a
/// few 512); a width past this is a damaged file, and rotary tables are sized from it.
pub(crate) const MAX_HEAD_DIM: usize = 1 << 16;

/// The longest context a configuration may claim. Published models claim up to about 10
/// million positions; caches are sized from it.
pub(crate) const MAX_CONTEXT: usize = 1 << 26;

impl Shape<'_> {
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
                checks.at_most("head_dim", head_dim, MAX_HEAD_DIM)?;
                head_dim
            }
            None => {
                checks.divides("num_attention_heads", self.heads, ("hidden_size", self.hidden))?;
                checks.even(
                    "hidden_size / num_attention_heads",
                    self.hidden / self.heads,
                    "rotary position embeddings turn pairs of values",
                )?;
                checks.at_most("hidden_size / num_attention_heads", self.hidden / self.heads, MAX_HEAD_DIM)?;
                self.hidden / self.heads
            }
        };
        checks.at_most("num_hidden_layers", self.layers, super::MAX_LAYERS)?;
        if let Some(context) = self.context {
            checks.positive("max_position_embeddings", context)?;
            checks.at_most("max_position_embeddings", context, MAX_CONTEXT)?;
        }
        checks.finite_non_negative("rms_norm_eps", self.eps)?;
        for &(field, theta) in self.thetas {
            checks.finite_positive(field, theta)?;
        }
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

/// The factor of a linear rope scaling given by `settings`, or `None` for the default rotary
/// embedding; `field` names the object in errors.
///
/// # Errors
/// [`crate::Error::Config`] for another rope type (nnx computes `default` and `linear`),
/// [`crate::Error::ConfigNumber`] for a factor that is not a finite positive number.
pub(crate) fn linear_rope_factor(settings: &RopeParameters, field: &str, path: &Path) -> crate::Result<Option<f32>> {
    match settings.scaling().unwrap_or("default") {
        "default" => Ok(None),
        "linear" => {
            let factor = settings.factor.unwrap_or(1.0);
            super::Checks::new(path).finite_positive(&format!("{field}.factor"), factor)?;
            Ok(Some(factor as f32))
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
/// file and the key: a key that is missing, or present with a value of another type (which is
/// not taken for missing).
pub(crate) struct GgufKeys<'a> {
    metadata: &'a Metadata,
    arch: &'a str,
    origin: PathBuf,
}

impl<'a> GgufKeys<'a> {
    /// The keys of `metadata`, whose `general.architecture` must be one of `architectures`;
    /// errors name `origin` (the file, or [`GgufKeys::origin`]).
    pub(crate) fn new(
        metadata: &'a Metadata,
        architectures: &[&str],
        reader: &str,
        origin: &Path,
    ) -> crate::Result<GgufKeys<'a>> {
        let missing = |key: &str| GgufKeys::missing_in(origin, key);
        let arch = metadata.architecture().ok_or_else(|| missing("general.architecture"))?;
        if !architectures.contains(&arch) {
            return Err(unusable(
                origin,
                format!(
                    "`general.architecture` is `{arch}`; {reader} reads {}",
                    architectures.iter().map(|arch| format!("`{arch}`")).collect::<Vec<_>>().join(" and ")
                ),
            ));
        }
        Ok(GgufKeys { metadata, arch, origin: origin.to_path_buf() })
    }

    /// The architecture.
    pub(crate) fn arch(&self) -> &'a str {
        self.arch
    }

    /// What errors about GGUF metadata name as the configuration file when no file is known.
    pub(crate) fn origin() -> PathBuf {
        PathBuf::from("GGUF metadata")
    }

    /// The file (or [`GgufKeys::origin`]) errors name.
    pub(crate) fn path(&self) -> &Path {
        &self.origin
    }

    fn missing_in(origin: &Path, key: &str) -> crate::Error {
        let origin = if origin == GgufKeys::origin() {
            "the GGUF metadata".to_string()
        } else {
            format!("the GGUF metadata of `{}`", origin.display())
        };
        crate::Error::NoEntry { origin, name: key.to_string(), suggestion: None }
    }

    fn missing(&self, key: &str) -> crate::Error {
        GgufKeys::missing_in(&self.origin, key)
    }

    fn wrong_type(&self, key: &str, expected: &'static str, found: &crate::gguf::Value) -> crate::Error {
        let text = found.to_string();
        let shown = match text.char_indices().nth(40) {
            Some((at, _)) => format!("{}...", &text[..at]),
            None => text,
        };
        crate::Error::Config {
            path: self.origin.clone(),
            problem: crate::error::ConfigProblem::WrongType {
                key: key.to_string(),
                expected,
                found: format!("{} `{shown}`", found.value_type().name()),
            },
        }
    }

    /// The full key of `{arch}.{suffix}`.
    pub(crate) fn key(&self, suffix: &str) -> String {
        format!("{}.{suffix}", self.arch)
    }

    /// `{arch}.{suffix}` as a size, when present. A per-layer array (as llama.cpp writes for
    /// some models) is one size when it has one entry per block and they are all equal.
    ///
    /// # Errors
    /// [`crate::Error::Config`] for a value of another type, or a per-layer array of another
    /// length or of unequal sizes (nnx runs layers of one shape).
    pub(crate) fn size(&self, suffix: &str) -> crate::Result<Option<usize>> {
        let key = self.key(suffix);
        let Some(value) = self.metadata.get(&key) else { return Ok(None) };
        if let Some(size) = value.as_usize() {
            return Ok(Some(size));
        }
        const ONE: &str = "an unsigned integer, or one equal integer per block";
        let Some(array) = value.as_array() else { return Err(self.wrong_type(&key, ONE, value)) };
        let sizes: Option<Vec<usize>> = (0..array.len()).map(|at| array.get(at).and_then(|v| v.as_usize())).collect();
        let blocks = self.metadata.get(&self.key("block_count")).and_then(|blocks| blocks.as_usize());
        match sizes.as_deref() {
            Some([first, rest @ ..]) if Some(array.len()) == blocks && rest.iter().all(|size| size == first) => {
                Ok(Some(*first))
            }
            _ => Err(self.wrong_type(&key, ONE, value)),
        }
    }

    /// `{arch}.{suffix}` as a size.
    ///
    /// # Errors
    /// [`crate::Error::NoEntry`] when it is missing; as [`GgufKeys::size`].
    pub(crate) fn required_size(&self, suffix: &str) -> crate::Result<usize> {
        self.size(suffix)?.ok_or_else(|| self.missing(&self.key(suffix)))
    }

    /// `{arch}.{suffix}` as a number, when present.
    ///
    /// # Errors
    /// [`crate::Error::Config`] for a value that is not a number.
    pub(crate) fn number(&self, suffix: &str) -> crate::Result<Option<f32>> {
        let key = self.key(suffix);
        match self.metadata.get(&key) {
            None => Ok(None),
            Some(value) => match value.as_f64() {
                Some(number) => Ok(Some(number as f32)),
                None => Err(self.wrong_type(&key, "a number", value)),
            },
        }
    }

    /// `{arch}.{suffix}` as a number.
    ///
    /// # Errors
    /// [`crate::Error::NoEntry`] when it is missing; as [`GgufKeys::number`].
    pub(crate) fn required_number(&self, suffix: &str) -> crate::Result<f32> {
        self.number(suffix)?.ok_or_else(|| self.missing(&self.key(suffix)))
    }

    /// `{arch}.{suffix}` as it is stored, when present.
    pub(crate) fn value(&self, suffix: &str) -> Option<&'a crate::gguf::Value> {
        self.metadata.get(&self.key(suffix))
    }

    /// The vocabulary size: the length of `tokenizer.ggml.tokens`.
    ///
    /// # Errors
    /// [`crate::Error::NoEntry`] when it is missing, [`crate::Error::Config`] when it is not
    /// an array.
    pub(crate) fn vocab_size(&self) -> crate::Result<usize> {
        const TOKENS: &str = "tokenizer.ggml.tokens";
        match self.metadata.get(TOKENS) {
            None => Err(self.missing(TOKENS)),
            Some(tokens) => match tokens.as_array() {
                Some(tokens) => Ok(tokens.len()),
                None => Err(self.wrong_type(TOKENS, "an array of strings", tokens)),
            },
        }
    }

    /// The linear rope scaling factor of `{arch}.rope.scaling.*` (llama.cpp's type defaults
    /// to linear, and a factor of 0 or none means no scaling).
    ///
    /// # Errors
    /// [`crate::Error::Config`] for another scaling type or a value of the wrong type,
    /// [`crate::Error::ConfigNumber`] for a factor that is not finite and positive.
    pub(crate) fn linear_rope_factor(&self) -> crate::Result<Option<f32>> {
        let (factor, suffix) = match self.number("rope.scaling.factor")? {
            Some(factor) => (Some(factor), "rope.scaling.factor"),
            None => (self.number("rope.scale_linear")?, "rope.scale_linear"),
        };
        let kind = match self.value("rope.scaling.type") {
            Some(kind) => {
                kind.as_str().ok_or_else(|| self.wrong_type(&self.key("rope.scaling.type"), "a string", kind))?
            }
            None => "linear",
        };
        match (kind, factor) {
            ("none", _) | (_, None) => Ok(None),
            (_, Some(factor)) if factor == 0.0 || factor == 1.0 => Ok(None),
            ("linear", Some(factor)) => {
                super::Checks::new(&self.origin).finite_positive(&self.key(suffix), factor)?;
                Ok(Some(factor))
            }
            (kind, Some(factor)) => Err(unusable(
                &self.origin,
                format!(
                    "`{}` is `{kind}` with factor {factor}; nnx computes linear rope scaling only",
                    self.key("rope.scaling.type")
                ),
            )),
        }
    }

    /// Checks the hyperparameters against the tensors the file holds, before anything is sized
    /// from them: `block_count` against the `blk.N` tensors, `embedding_length` and the
    /// vocabulary against `token_embd.weight`, the heads and head widths against the rows of
    /// `blk.0`'s projections, `feed_forward_length` against `blk.0.ffn_up.weight`, and
    /// `rope.dimension_count` against the head width (nnx turns whole heads). `shape` gives an
    /// entry's `[rows, columns]`; an entry the file lacks is left to the import to name.
    ///
    /// # Errors
    /// [`crate::Error::ConfigField`] naming the file, the key and what the tensors say; the
    /// errors of reading the keys.
    #[cfg(feature = "text")]
    pub(crate) fn check_tensors<'n>(
        &self,
        names: impl Iterator<Item = &'n str>,
        shape: impl Fn(&str) -> Option<Vec<usize>>,
    ) -> crate::Result<()> {
        let fail = |suffix: &str, found: usize, holds: usize, entry: String| crate::Error::ConfigField {
            path: self.origin.clone(),
            field: self.key(suffix),
            found: found as u64,
            rule: crate::error::ConfigRule::Tensors { holds: holds as u64, entry },
        };
        let blocks = names
            .filter_map(|name| name.strip_prefix("blk.")?.split('.').next()?.parse::<usize>().ok())
            .max()
            .map_or(0, |last| last.saturating_add(1));
        let block_count = self.required_size("block_count")?;
        if block_count != blocks {
            let entry = match blocks {
                0 => "there are no `blk.N` tensors".to_string(),
                _ => format!("`blk.0` .. `blk.{}`", blocks - 1),
            };
            return Err(fail("block_count", block_count, blocks, entry));
        }
        let hidden = self.required_size("embedding_length")?;
        let rows = |name: &str| shape(name).filter(|shape| shape.len() == 2).map(|shape| (shape[0], shape[1]));
        if let Some((vocab, width)) = rows("token_embd.weight") {
            if width != hidden {
                let entry = format!("`token_embd.weight` is [{vocab}, {width}]");
                return Err(fail("embedding_length", hidden, width, entry));
            }
            let tokens = self.vocab_size()?;
            if tokens != vocab {
                return Err(crate::Error::ConfigField {
                    path: self.origin.clone(),
                    field: "tokenizer.ggml.tokens".into(),
                    found: tokens as u64,
                    rule: crate::error::ConfigRule::Tensors {
                        holds: vocab as u64,
                        entry: format!("`token_embd.weight` is [{vocab}, {width}]"),
                    },
                });
            }
        }
        let heads = self.required_size("attention.head_count")?;
        let key_length = self.size("attention.key_length")?;
        let head_dim = key_length.unwrap_or(hidden / heads.max(1));
        if let Some((q_rows, _)) = rows("blk.0.attn_q.weight")
            && heads.checked_mul(head_dim) != Some(q_rows)
        {
            let entry = format!("`blk.0.attn_q.weight`: its {q_rows} rows do not form {heads} heads of {head_dim}");
            return Err(match key_length {
                Some(key_length) if heads > 0 && q_rows.is_multiple_of(heads) => {
                    fail("attention.key_length", key_length, q_rows / heads, entry)
                }
                _ => fail("attention.head_count", heads, q_rows.checked_div(head_dim).unwrap_or(0), entry),
            });
        }
        let kv_heads = self.size("attention.head_count_kv")?.unwrap_or(heads);
        if let Some((k_rows, _)) = rows("blk.0.attn_k.weight")
            && kv_heads.checked_mul(head_dim) != Some(k_rows)
        {
            let entry = format!("`blk.0.attn_k.weight`: its {k_rows} rows do not form {kv_heads} heads of {head_dim}");
            return Err(fail("attention.head_count_kv", kv_heads, k_rows.checked_div(head_dim).unwrap_or(0), entry));
        }
        if let Some(value_length) = self.size("attention.value_length")?
            && value_length != head_dim
        {
            // The cache holds keys and values of one width.
            let entry = format!("nnx runs values as wide as keys, {head_dim}");
            return Err(fail("attention.value_length", value_length, head_dim, entry));
        }
        if let Some((v_rows, _)) = rows("blk.0.attn_v.weight")
            && kv_heads.checked_mul(head_dim) != Some(v_rows)
        {
            let entry = format!("`blk.0.attn_v.weight`: its {v_rows} rows do not form {kv_heads} heads of {head_dim}");
            return Err(fail("attention.head_count_kv", kv_heads, v_rows.checked_div(head_dim).unwrap_or(0), entry));
        }
        let inner = self.required_size("feed_forward_length")?;
        if let Some((up_rows, _)) = rows("blk.0.ffn_up.weight")
            && up_rows != inner
        {
            let entry = format!("`blk.0.ffn_up.weight` has {up_rows} rows");
            return Err(fail("feed_forward_length", inner, up_rows, entry));
        }
        if let Some(rotated) = self.size("rope.dimension_count")?
            && rotated != head_dim
        {
            let entry = format!("nnx turns whole heads of {head_dim}");
            return Err(fail("rope.dimension_count", rotated, head_dim, entry));
        }
        Ok(())
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
                $crate::generate::check_capacity(capacity, self.context_length())?;
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

/// The gated feed-forward network: `down(act(gate(x)) * up(x))` (SiLU for Llama and Qwen, tanh
/// GELU for Gemma 3), shared by the decoders: one set of import names.
#[derive(Module, Clone, Debug)]
pub struct Mlp<D: Device = Host, W: Weights = Dense> {
    /// Gate projection.
    #[nnx(from = "gate_proj", gguf = "ffn_gate")]
    pub gate: W::Layer<D>,
    /// Up projection.
    #[nnx(from = "up_proj", gguf = "ffn_up")]
    pub up: W::Layer<D>,
    /// Down projection.
    #[nnx(from = "down_proj", gguf = "ffn_down")]
    pub down: W::Layer<D>,
}
