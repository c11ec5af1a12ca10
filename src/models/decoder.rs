//! The pieces the decoder families (Llama, Qwen2/3, Gemma 3) share: the checks of a
//! configuration's shape, the rotary embedding of a group of layers, llama.cpp's GGUF
//! hyperparameters, the sliding/full layer types, and one forward pass's positions, masks and
//! cache.

use std::path::{Path, PathBuf};

use super::{Dense, RopeParameters, Weights};
use crate::generate::KvCache;
use crate::gguf::Metadata;
use crate::nn::RmsNorm;
use crate::{Compute, Device, Host, Module, Tensor};

/// The widest attention head a configuration may ask for. Published models use 64 to 256 (a
/// few 512); a width past this is a damaged file, and rotary tables are sized from it.
pub(crate) const MAX_HEAD_DIM: usize = 1 << 16;

/// The longest context a configuration may claim. Published models claim up to about 10
/// million positions; caches are sized from it.
pub(crate) const MAX_CONTEXT: usize = 1 << 26;

/// A configuration that is not the model's: [`crate::Error::Config`] naming `path`.
pub(crate) fn unusable(path: &Path, message: String) -> crate::Error {
    crate::Error::Config { path: path.to_path_buf(), problem: crate::error::ConfigProblem::NotModelConfig { message } }
}

/// The rotary embedding of a group of layers: its base, when it scales the divisor of each
/// frequency, and the factor the turned values are multiplied by (YaRN's; else 1).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Rotary {
    pub(crate) theta: f32,
    pub(crate) factors: Option<Vec<f32>>,
    pub(crate) scale: f32,
}

impl Rotary {
    /// `x` `[batch, heads, seq, head_dim]` turned to `positions`.
    pub(crate) fn apply<T: Compute>(&self, x: &T, positions: &[usize]) -> crate::Result<T> {
        let turned = match &self.factors {
            Some(factors) => Compute::rotary_scaled(x, positions, self.theta, factors)?,
            None => Compute::rotary(x, positions, self.theta)?,
        };
        if self.scale == 1.0 { Ok(turned) } else { turned.scale(self.scale) }
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

    pub(crate) fn missing_in(origin: &Path, key: &str) -> crate::Error {
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

    /// The rotary settings of `{arch}.rope.*`: the base `theta` with the scaling of
    /// `rope.scaling.*` (llama.cpp's type defaults to linear; a factor of 0 or 1, or none, means
    /// no scaling): linear, or YaRN with its original context and betas (llama.cpp rounds the
    /// ramp's ends, so `truncate` is set).
    ///
    /// # Errors
    /// [`crate::Error::Config`] for another scaling type or a value of the wrong type,
    /// [`crate::Error::ConfigNumber`] for a factor that is not finite and positive.
    pub(crate) fn rope(&self, theta: Option<f32>) -> crate::Result<RopeParameters> {
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
        let unscaled = RopeParameters::linear(theta, None);
        let factor = match (kind, factor) {
            ("none", _) | (_, None) => return Ok(unscaled),
            (_, Some(factor)) if factor == 0.0 || factor == 1.0 => return Ok(unscaled),
            (_, Some(factor)) => factor,
        };
        super::Checks::new(&self.origin).finite_positive(&self.key(suffix), factor)?;
        match kind {
            "linear" => Ok(RopeParameters::linear(theta, Some(factor))),
            "yarn" => Ok(RopeParameters {
                rope_type: Some("yarn".into()),
                original_max_position_embeddings: self.size("rope.scaling.original_context_length")?,
                beta_fast: self.number("rope.scaling.yarn_beta_fast")?.map(f64::from),
                beta_slow: self.number("rope.scaling.yarn_beta_slow")?.map(f64::from),
                truncate: Some(true),
                ..RopeParameters::linear(theta, Some(factor))
            }),
            kind => Err(unusable(
                &self.origin,
                format!(
                    "`{}` is `{kind}` with factor {factor}; nnx computes linear and YaRN rope scaling",
                    self.key("rope.scaling.type")
                ),
            )),
        }
    }

    /// One `layer_types` entry per block, as llama.cpp marks them: none slides unless
    /// `attention.sliding_window` is set (and not 0); then those `attention.sliding_window_pattern`
    /// marks, one flag per block or a period `n` (block `i` slides unless `i % n == n - 1`;
    /// `period` when absent).
    ///
    /// # Errors
    /// [`crate::Error::ConfigField`] for more blocks than [`MAX_LAYERS`](super::MAX_LAYERS),
    /// [`crate::Error::Config`] for a pattern of the wrong type or length.
    pub(crate) fn layer_types(&self, period: usize) -> crate::Result<Vec<String>> {
        let layers = self.required_size("block_count")?;
        super::Checks::new(&self.origin).at_most(&self.key("block_count"), layers, super::MAX_LAYERS)?;
        let window = self.size("attention.sliding_window")?.filter(|&window| window > 0);
        let suffix = "attention.sliding_window_pattern";
        let sliding: Vec<bool> = match self.value(suffix) {
            _ if window.is_none() => vec![false; layers],
            Some(crate::gguf::Value::Array(array)) => {
                let flags: Option<Vec<bool>> = (0..array.len())
                    .map(|at| array.get(at).and_then(|flag| flag.as_bool().or(flag.as_u64().map(|n| n != 0))))
                    .collect();
                match flags {
                    Some(flags) if flags.len() == layers => flags,
                    _ => {
                        return Err(crate::Error::Config {
                            path: self.origin.clone(),
                            problem: crate::error::ConfigProblem::WrongType {
                                key: self.key(suffix),
                                expected: "a period, or one flag per block",
                                found: format!("an array of {} values for {layers} blocks", array.len()),
                            },
                        });
                    }
                }
            }
            _ => {
                let period = self.size(suffix)?.unwrap_or(period);
                (0..layers).map(|layer| period == 0 || layer % period < period - 1).collect()
            }
        };
        Ok(sliding.into_iter().map(|sliding| if sliding { SLIDING } else { FULL }.to_string()).collect())
    }

    /// Checks the hyperparameters against the tensors the file holds, before anything is sized
    /// from them: `block_count` against the `blk.N` tensors, `embedding_length` and the
    /// vocabulary against `token_embd.weight`, the heads and head widths against the rows of
    /// `blk.0`'s projections, `feed_forward_length` against `blk.0.ffn_up.weight`, and
    /// `rope.dimension_count` against the head width (whole heads, or at most a head where
    /// `heads` says rotary turns part of it; none of the head checks where the heads differ
    /// per layer). `shape` gives an entry's `[rows, columns]`; an entry the file lacks is left
    /// to the import to name.
    ///
    /// # Errors
    /// [`crate::Error::ConfigField`] naming the file, the key and what the tensors say; the
    /// errors of reading the keys.
    #[cfg(feature = "text")]
    pub(crate) fn check_tensors<'n>(
        &self,
        names: impl Iterator<Item = &'n str>,
        shape: impl Fn(&str) -> Option<Vec<usize>>,
        heads: Heads,
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
        if heads == Heads::PerLayer {
            // The family's own reader sizes each layer, and the import checks each tensor.
            return Ok(());
        }
        let partial_rotary = heads == Heads::Partial;
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
        // A mixture of experts may have no dense MLP, and then no `feed_forward_length`.
        if let Some(inner) = self.size("feed_forward_length")?
            && let Some((up_rows, _)) = rows("blk.0.ffn_up.weight")
            && up_rows != inner
        {
            let entry = format!("`blk.0.ffn_up.weight` has {up_rows} rows");
            return Err(fail("feed_forward_length", inner, up_rows, entry));
        }
        if let Some(rotated) = self.size("rope.dimension_count")?
            && (rotated > head_dim || (rotated != head_dim && !partial_rotary))
        {
            let entry = format!("nnx turns whole heads of {head_dim}");
            return Err(fail("rope.dimension_count", rotated, head_dim, entry));
        }
        Ok(())
    }
}

/// How a family's GGUF files shape their attention heads, for
/// [`GgufKeys::check_tensors`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Heads {
    /// One width for every layer's heads, all of it turned by rotary.
    Whole,
    /// One width, rotary turning part of it (`rope.dimension_count` below the width).
    Partial,
    /// Widths and counts per layer (Gemma 4's global and sliding layers).
    PerLayer,
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

    /// [`Pass::heads`] normalized by `norm`, with rotary turning only the first `rotated`
    /// values of each head (Qwen3.5's partial rotary; all of them when `rotated` is the head's
    /// width).
    pub(crate) fn heads_partial(
        &self,
        t: &Tensor<D>,
        heads: usize,
        head_dim: usize,
        norm: &RmsNorm<D>,
        rotary: &Rotary,
        rotated: usize,
    ) -> crate::Result<Tensor<D>> {
        if rotated >= head_dim {
            return self.heads(t, heads, head_dim, Some(norm), Some(rotary));
        }
        let rows = t.shape()[0];
        let seq = rows / self.batch;
        let t = norm.forward(&Compute::reshape(t, &[rows, heads, head_dim])?)?;
        let mut joined = Compute::reshape(&t, &[1, rows, heads, head_dim])?.permute(&[0, 2, 1, 3])?.contiguous()?;
        let turned = rotary.apply(&joined.narrow(3, 0, rotated)?.contiguous()?, &self.positions)?;
        joined.write_slice(3, 0, &turned)?;
        Compute::reshape(&joined, &[heads, self.batch, seq, head_dim])?.permute(&[1, 0, 2, 3])
    }

    /// Which rows of the pass (`batch * seq`, row-major) are padding, or `None` when none is.
    pub(crate) fn padded_rows(&self) -> Option<Vec<bool>> {
        let cache = self.cache.as_deref()?;
        let seq = self.positions.len() / self.batch.max(1);
        let filled = cache.len();
        let padded: Vec<bool> = cache
            .padding()
            .iter()
            .flat_map(|&padding| (filled..filled + seq).map(move |slot| slot < padding))
            .collect();
        padded.contains(&true).then_some(padded)
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
        self.attend_with(layer, q, k, v, window, None)
    }

    /// [`Pass::attend`] with one sink logit per query head beside the scores (gpt-oss).
    pub(crate) fn attend_with_sinks(
        &mut self,
        layer: usize,
        q: &Tensor<D>,
        k: Tensor<D>,
        v: Tensor<D>,
        window: Option<usize>,
        sinks: &[f32],
    ) -> crate::Result<Tensor<D>> {
        self.attend_with(layer, q, k, v, window, Some(sinks))
    }

    /// The keys and values `q` may attend to at layer `layer`: `k` and `v` appended to the
    /// cache's (when there is a cache), as `[batch, kv_heads, keys, head_dim]` views.
    pub(crate) fn keys_values(
        &mut self,
        layer: usize,
        k: Tensor<D>,
        v: Tensor<D>,
    ) -> crate::Result<(Tensor<D>, Tensor<D>)> {
        match self.cache.as_deref_mut() {
            Some(cache) => cache.update(layer, &k, &v),
            None => Ok((k, v)),
        }
    }

    /// Attention of `q` over `keys` and `values` as [`Pass::keys_values`] gives them (another
    /// layer's, where a layer shares them), causal, over the last `window` keys when given.
    pub(crate) fn attend_over(
        &self,
        q: &Tensor<D>,
        keys: &Tensor<D>,
        values: &Tensor<D>,
        window: Option<usize>,
    ) -> crate::Result<Tensor<D>> {
        let key_mask = self.key_mask.as_deref();
        let context = match window {
            Some(window) => Compute::attention_windowed(q, keys, values, key_mask, window)?,
            None => Compute::attention(q, keys, values, true, key_mask)?,
        };
        let (heads, seq, head_dim) = (q.shape()[1], q.shape()[2], q.shape()[3]);
        Compute::reshape(&context.permute(&[0, 2, 1, 3])?, &[self.batch * seq, heads * head_dim])
    }

    fn attend_with(
        &mut self,
        layer: usize,
        q: &Tensor<D>,
        k: Tensor<D>,
        v: Tensor<D>,
        window: Option<usize>,
        sinks: Option<&[f32]>,
    ) -> crate::Result<Tensor<D>> {
        let (keys, values) = self.keys_values(layer, k, v)?;
        let key_mask = self.key_mask.as_deref();
        let context = match (window, sinks) {
            (window, Some(sinks)) => {
                Compute::attention_sinks(q, &keys, &values, key_mask, window.unwrap_or(usize::MAX), sinks)?
            }
            (Some(window), None) => Compute::attention_windowed(q, &keys, &values, key_mask, window)?,
            (None, None) => Compute::attention(q, &keys, &values, true, key_mask)?,
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

/// A decoder family `$model`'s `forward` and `forward_with_cache` over its `run`, and its
/// [`CausalLm`](super::CausalLm): the cache shaped by its configuration's key/value heads and
/// head width ([`DecoderConfig`](super::DecoderConfig)), in the dtype its embedding computes in.
macro_rules! causal_lm {
    ($model:ident) => {
        $crate::models::decoder::causal_lm!($model, memory: keys_values_everywhere);

        impl<D: $crate::Device, W: $crate::models::Weights> $model<D, W> {
            /// Keys and values on every layer.
            fn keys_values_everywhere(&self) -> Vec<$crate::generate::LayerMemory> {
                vec![$crate::generate::LayerMemory::KeysValues; self.layers.len()]
            }
        }
    };
    ($model:ident, memory: $memory:ident) => {
        impl<D: $crate::Device, W: $crate::models::Weights> $model<D, W>
        where
            $crate::Tensor<D>: $crate::Compute,
            W::Layer<D>: $crate::models::Project<D>,
            $crate::quant::ggml::GgmlLinear<D>: $crate::models::Project<D>,
        {
            /// Logits for every position of one sequence, `[ids.len(), vocab]` in F32 (weights
            /// of any float dtype; activations in f32), on the model's device.
            ///
            /// # Errors
            /// A token id past the vocabulary.
            pub fn forward(&self, ids: &[u32]) -> $crate::Result<$crate::Tensor<D>> {
                self.run(ids, $crate::models::decoder::Pass::alone(ids.len()))
            }

            /// The logits of the last token of each row of `ids` (one row per sequence of
            /// `cache`, row-major), `[batch, vocab]` in F32 on the model's device, computing
            /// only the new positions: their keys and values go into `cache` (one entry per
            /// key/value head, shared by its group of query heads; sliding layers keep every
            /// position too and look at their window), and rotary angles count from each
            /// sequence's first real token (see [`KvCache`](crate::generate::KvCache)).
            ///
            /// # Errors
            /// A token id past the vocabulary, `ids` that are not whole rows, or
            /// [`Error::CacheFull`](crate::Error::CacheFull).
            pub fn forward_with_cache(
                &self,
                ids: &[u32],
                cache: &mut $crate::generate::KvCache<D>,
            ) -> $crate::Result<$crate::Tensor<D>> {
                self.run(ids, $crate::models::decoder::Pass::cached(ids, cache)?)
            }
        }

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

            /// [`DecoderConfig::context_length`](crate::models::DecoderConfig::context_length).
            fn context_length(&self) -> usize {
                $crate::models::DecoderConfig::context_length(&self.config)
            }

            fn new_cache(&self, batch: usize, capacity: usize) -> $crate::Result<$crate::generate::KvCache<D>> {
                use $crate::models::DecoderConfig;
                $crate::generate::check_capacity(capacity, self.context_length())?;
                $crate::generate::KvCache::hybrid(
                    self.embed.cache_like(&self.norm.weight),
                    &self.$memory(),
                    batch,
                    self.config.kv_heads(),
                    self.config.head_dim(),
                    capacity,
                )
            }

            fn forward_cached(
                &self,
                ids: &[u32],
                cache: &mut $crate::generate::KvCache<D>,
            ) -> $crate::Result<$crate::Tensor> {
                // A decoded step on the host: the pool's workers stay awake between its many
                // short products (a prompt's products are long enough to wake them).
                let host = std::any::TypeId::of::<D>() == std::any::TypeId::of::<$crate::Host>();
                let _awake = (host && ids.len() < 16).then($crate::parallel::Awake::new);
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

impl<D: Device, W: Weights> Mlp<D, W>
where
    Tensor<D>: Compute,
    W::Layer<D>: super::Project<D>,
{
    /// `down(act(gate(x)) * up(x))` on `x` `[rows, hidden]`.
    ///
    /// # Errors
    /// A last axis of `x` that is not `hidden`.
    pub fn forward(&self, x: &Tensor<D>, act: fn(&Tensor<D>) -> crate::Result<Tensor<D>>) -> crate::Result<Tensor<D>> {
        let [gate, up] = super::project_all([&self.gate, &self.up], x)?;
        super::Project::project(&self.down, &act(&gate)?.mul(&up)?)
    }
}
