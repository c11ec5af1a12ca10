//! Kernels of transformer attention blocks: embedding lookup, rotary position embedding and
//! scaled dot-product attention with grouped-query heads, causal and padding masks.

use rayon::prelude::*;

use super::matmul::{Matrix, product};
use super::norm::softmax_row;
use super::{Dense, PARALLEL_ELEMENTS, f32_tensor, f32_values};
use crate::error::Result;
use crate::shape::{
    AttentionShape, check_attention, check_embedding, check_rotary, inverse_frequencies, rotary_tables,
};
use crate::{DType, Tensor};

impl Tensor {
    /// The rows `ids` of an embedding table `weight` `[vocab, dim]`, as `[ids.len(), dim]`
    /// f32. Only the rows asked for are read (and converted, for a half-precision table).
    ///
    /// # Errors
    /// [`Error::BadShape`](crate::Error::BadShape) unless `weight` has rank 2,
    /// [`Error::IndexOutOfRange`](crate::Error::IndexOutOfRange) naming the first id past the
    /// table, [`Error::NotFloat`](crate::Error::NotFloat), [`Error::Meta`](crate::Error::Meta).
    ///
    /// # Examples
    /// ```
    /// use nnx_core::Tensor;
    /// let table = Tensor::from_vec(vec![0.0f32, 0.5, 1.0, 1.5, 2.0, 2.5], &[3, 2])?;
    /// assert_eq!(Tensor::embedding(&table, &[2, 0])?.to_vec::<f32>()?, [2.0, 2.5, 0.0, 0.5]);
    /// assert!(Tensor::embedding(&table, &[3]).is_err());
    /// # Ok::<(), nnx_core::Error>(())
    /// ```
    pub fn embedding(weight: &Tensor, ids: &[u32]) -> Result<Tensor> {
        let dim = check_embedding(weight, ids)?;
        let shape = [ids.len(), dim];
        if weight.is_contiguous() {
            let size = weight.dtype().size_in_bytes().expect("float dtypes are byte-sized");
            let bytes = weight.to_bytes()?;
            let row_bytes = dim * size;
            let mut gathered = Vec::with_capacity(ids.len() * row_bytes);
            for &id in ids {
                let start = id as usize * row_bytes;
                gathered.extend_from_slice(&bytes[start..start + row_bytes]);
            }
            return Tensor::from_bytes(weight.dtype(), &shape, &gathered)?.to_dtype(DType::F32);
        }
        let mut out = Vec::with_capacity(ids.len() * dim);
        for &id in ids {
            out.extend(weight.narrow(0, id as usize, 1)?.to_f32_vec()?);
        }
        f32_tensor(out, &shape)
    }

    /// Rotary position embedding of `x` `[batch, heads, seq, head_dim]` at `positions` (one per
    /// sequence index), in the convention of Hugging Face's Llama: feature `i` pairs with
    /// `i + head_dim/2` (`rotate_half`), the frequencies are `theta^(-2i/head_dim)`, and
    /// frequencies, angles, cosines and sines are computed in f32 as transformers does.
    ///
    /// # Errors
    /// [`Error::BadShape`](crate::Error::BadShape) unless `x` has rank 4 and an even `head_dim`,
    /// [`Error::LengthMismatch`](crate::Error::LengthMismatch) when `positions` does not have `seq`
    /// entries, [`Error::NotFloat`](crate::Error::NotFloat), [`Error::Meta`](crate::Error::Meta).
    ///
    /// # Examples
    /// ```
    /// use nnx_core::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 0.0, 1.0, 0.0], &[1, 1, 2, 2])?;
    /// // Position 0 is unchanged; with head_dim 2 the frequency is 1, so position 1 turns by
    /// // one radian.
    /// let out = x.rotary(&[0, 1], 10_000.0)?.to_vec::<f32>()?;
    /// assert_eq!(out[..2], [1.0, 0.0]);
    /// assert_eq!(out[2..], [1.0f32.cos(), 1.0f32.sin()]);
    /// # Ok::<(), nnx_core::Error>(())
    /// ```
    pub fn rotary(&self, positions: &[usize], theta: f32) -> Result<Tensor> {
        self.rotate(positions, theta, None, "rotary")
    }

    /// [`Tensor::rotary`] with each frequency divided by a factor: frequency `i` (of
    /// `head_dim / 2`) is `theta^(-2i/head_dim) / factors[i]`. This is llama.cpp's `rope_freqs`
    /// tensor, Llama 3's rope scaling (factors from [`llama3_rope_factors`](crate::llama3_rope_factors))
    /// and linear scaling (every factor the same); the division happens in f32 after the
    /// frequency, as transformers scales `inv_freq`, so factors of 1 give [`Tensor::rotary`]
    /// exactly.
    ///
    /// # Errors
    /// As [`Tensor::rotary`], and [`Error::LengthMismatch`](crate::Error::LengthMismatch) when
    /// `factors` does not have `head_dim / 2` entries.
    ///
    /// # Examples
    /// ```
    /// use nnx_core::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 0.0], &[1, 1, 1, 2])?;
    /// // A factor of 2 halves the frequency: position 2 turns by one radian.
    /// let out = x.rotary_scaled(&[2], 10_000.0, &[2.0])?.to_vec::<f32>()?;
    /// assert_eq!(out, [1.0f32.cos(), 1.0f32.sin()]);
    /// assert!(x.rotary_scaled(&[2], 10_000.0, &[2.0, 2.0]).is_err());
    /// # Ok::<(), nnx_core::Error>(())
    /// ```
    pub fn rotary_scaled(&self, positions: &[usize], theta: f32, factors: &[f32]) -> Result<Tensor> {
        self.rotate(positions, theta, Some(factors), "rotary_scaled")
    }

    /// Rotary embedding with optional frequency factors, for `op`.
    fn rotate(&self, positions: &[usize], theta: f32, factors: Option<&[f32]>, op: &'static str) -> Result<Tensor> {
        let head_dim = check_rotary(self, positions, factors, op)?;
        let (seq, half) = (positions.len(), head_dim / 2);
        let (cos, sin) = rotary_tables(positions, head_dim, theta, factors);
        let mut values = f32_values(self, op)?;
        if head_dim == 0 {
            return f32_tensor(values, self.shape());
        }
        let rotate = |row: usize, features: &mut [f32]| {
            let at = (row % seq) * half;
            let (cos, sin) = (&cos[at..at + half], &sin[at..at + half]);
            let (first, second) = features.split_at_mut(half);
            for i in 0..half {
                let (x1, x2) = (first[i], second[i]);
                first[i] = x1 * cos[i] - x2 * sin[i];
                second[i] = x2 * cos[i] + x1 * sin[i];
            }
        };
        if values.len() >= PARALLEL_ELEMENTS {
            values.par_chunks_mut(head_dim).enumerate().for_each(|(row, features)| rotate(row, features));
        } else {
            values.chunks_mut(head_dim).enumerate().for_each(|(row, features)| rotate(row, features));
        }
        f32_tensor(values, self.shape())
    }

    /// Scaled dot-product attention, `softmax(q kᵀ / sqrt(d) + mask) v`.
    ///
    /// `q` is `[batch, heads, seq_q, d]`; `k` is `[batch, kv_heads, seq_k, d]` and `v`
    /// `[batch, kv_heads, seq_k, d_v]`, where `kv_heads` divides `heads` and query head `h`
    /// reads key/value head `h / (heads / kv_heads)` (grouped-query attention). With `causal`,
    /// query `i` sees keys `j <= i + seq_k - seq_q` (the queries are the last `seq_q`
    /// positions). `key_mask`, `batch * seq_k` entries row-major, marks the keys to attend to
    /// (`false` for padding). A query that may see no key gets zeros. The result is
    /// `[batch, heads, seq_q, d_v]`; heads run in parallel and the operands are read through
    /// their strides, so permuted `[batch, seq, heads, d]` views need no copy.
    ///
    /// # Errors
    /// [`Error::BadShape`](crate::Error::BadShape) unless all three have rank 4,
    /// [`Error::ShapeMismatch`](crate::Error::ShapeMismatch) when their sizes disagree or
    /// `kv_heads` does not divide `heads`, [`Error::LengthMismatch`](crate::Error::LengthMismatch)
    /// for a `key_mask` of the wrong length, [`Error::NotFloat`](crate::Error::NotFloat),
    /// [`Error::Meta`](crate::Error::Meta).
    ///
    /// # Examples
    /// ```
    /// use nnx_core::Tensor;
    /// let q = Tensor::from_vec(vec![1.0f32, 0.0, 0.0, 1.0], &[1, 1, 2, 2])?;
    /// let v = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[1, 1, 2, 2])?;
    /// // Causal: the first query sees only the first key.
    /// let out = Tensor::attention(&q, &q, &v, true, None)?.to_vec::<f32>()?;
    /// assert_eq!(out[..2], [1.0, 2.0]);
    /// # Ok::<(), nnx_core::Error>(())
    /// ```
    pub fn attention(q: &Tensor, k: &Tensor, v: &Tensor, causal: bool, key_mask: Option<&[bool]>) -> Result<Tensor> {
        attend(q, k, v, key_mask, Scores { causal, window: usize::MAX, sinks: None }, "attention")
    }

    /// [`Tensor::attention`] with the causal mask on, where a query also sees at most the
    /// `window` most recent keys, itself included: the query at key index `p` (the queries are
    /// the last `seq_q` of the `seq_k` keys) sees keys `j` with `p - window < j <= p`, as in the
    /// local layers of Gemma 3 and Mistral. A `window` of `seq_k` or more is plain causal
    /// attention; a `window` of 0 hides every key, so every query gets zeros.
    ///
    /// # Errors
    /// As [`Tensor::attention`].
    ///
    /// # Examples
    /// ```
    /// use nnx_core::Tensor;
    /// let q = Tensor::from_vec(vec![1.0f32; 3], &[1, 1, 3, 1])?;
    /// let v = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], &[1, 1, 3, 1])?;
    /// // With a window of 1 each query sees only its own key.
    /// let out = Tensor::attention_windowed(&q, &q, &v, None, 1)?.to_vec::<f32>()?;
    /// assert_eq!(out, [1.0, 2.0, 3.0]);
    /// # Ok::<(), nnx_core::Error>(())
    /// ```
    pub fn attention_windowed(
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        key_mask: Option<&[bool]>,
        window: usize,
    ) -> Result<Tensor> {
        attend(q, k, v, key_mask, Scores { causal: true, window, sinks: None }, "attention_windowed")
    }

    /// Causal attention with a learned sink per query head (gpt-oss): each head's softmax
    /// takes one more logit, `sinks[h]`, whose weight goes to no value, so that a query may
    /// attend to nothing much. With `window`, a query also sees at most that many recent keys
    /// (`usize::MAX` for all).
    ///
    /// # Errors
    /// As [`Tensor::attention`], and [`Error::LengthMismatch`](crate::Error::LengthMismatch)
    /// unless there is one sink per query head.
    ///
    /// # Examples
    /// ```
    /// use nnx_core::Tensor;
    /// let q = Tensor::from_vec(vec![0.0f32, 0.0], &[1, 1, 1, 2])?;
    /// let v = Tensor::from_vec(vec![1.0f32, 2.0], &[1, 1, 1, 2])?;
    /// // One key of score 0 beside a sink of logit 0: half the weight goes to the sink.
    /// let out = Tensor::attention_sinks(&q, &q, &v, None, usize::MAX, &[0.0])?.to_vec::<f32>()?;
    /// assert_eq!(out, [0.5, 1.0]);
    /// # Ok::<(), nnx_core::Error>(())
    /// ```
    pub fn attention_sinks(
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        key_mask: Option<&[bool]>,
        window: usize,
        sinks: &[f32],
    ) -> Result<Tensor> {
        attend(q, k, v, key_mask, Scores { causal: true, window, sinks: Some(sinks) }, "attention_sinks")
    }
}

/// The frequency factors of Llama 3's rope scaling, one per rotary frequency (`head_dim / 2`),
/// for [`Tensor::rotary_scaled`].
///
/// Transformers' `_compute_llama3_parameters` leaves the frequencies whose wavelength
/// `2π / frequency` is under `original_context / high_freq_factor` as they are, divides those
/// whose wavelength is over `original_context / low_freq_factor` by `factor`, and blends the two
/// in between (`smooth = (original_context / wavelength - low_freq_factor) / (high_freq_factor -
/// low_freq_factor)`); each factor here is the old frequency over the new one,
/// `1 / ((1 - smooth) / factor + smooth)` in the blend. This is also what llama.cpp's converter
/// stores as `rope_freqs.weight`, computed as it does, in f32.
///
/// # Examples
/// ```
/// // Llama 3.1 8B: 500000, factor 8, low 1, high 4, original context 8192.
/// let factors = nnx_core::llama3_rope_factors(128, 500_000.0, 8.0, 1.0, 4.0, 8192);
/// assert_eq!(factors.len(), 64);
/// assert_eq!((factors[0], factors[63]), (1.0, 8.0));
/// ```
pub fn llama3_rope_factors(
    head_dim: usize,
    theta: f32,
    factor: f32,
    low_freq_factor: f32,
    high_freq_factor: f32,
    original_context: usize,
) -> Vec<f32> {
    let context = original_context as f32;
    let (low_freq_wavelength, high_freq_wavelength) = (context / low_freq_factor, context / high_freq_factor);
    inverse_frequencies(head_dim, theta)
        .map(|frequency| {
            let wavelength = 2.0 * std::f32::consts::PI / frequency;
            if wavelength < high_freq_wavelength {
                1.0
            } else if wavelength > low_freq_wavelength {
                factor
            } else {
                let smooth = (context / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor);
                1.0 / ((1.0 - smooth) / factor + smooth)
            }
        })
        .collect()
}

/// Attention (see [`Tensor::attention`]) where, under the causal mask, the query at key index
/// `p` sees only the keys after `p - window` (`usize::MAX` for no window), for `op`.
/// What a query's softmax sees beside the key mask: the causal mask, at most `window` recent
/// keys under it, and a sink logit per query head.
struct Scores<'a> {
    causal: bool,
    window: usize,
    sinks: Option<&'a [f32]>,
}

fn attend(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    key_mask: Option<&[bool]>,
    Scores { causal, window, sinks }: Scores<'_>,
    op: &'static str,
) -> Result<Tensor> {
    let AttentionShape { batch, heads, kv_heads, seq_q, seq_k, d, d_v } = check_attention(q, k, v, key_mask, op)?;
    if let Some(sinks) = sinks
        && sinks.len() != heads
    {
        let (what, shape) = ("sinks, one per query head", q.shape().to_vec());
        return Err(crate::Error::LengthMismatch { op, what, expected: heads, found: sinks.len(), shape });
    }
    let (q, k, v) = (Dense::new(q, op)?, Dense::new(k, op)?, Dense::new(v, op)?);
    let group = heads / kv_heads.max(1);
    let scale = 1.0 / (d as f32).sqrt();
    let mut out = vec![0.0f32; batch * heads * seq_q * d_v];
    let head_size = seq_q * d_v;
    if head_size == 0 {
        return f32_tensor(out, &[batch, heads, seq_q, d_v]);
    }
    // Keys query `i` may see under the causal mask: `i + shift - window < j <= i + shift`
    // (a window past `seq_k` hides nothing more).
    let shift = seq_k as isize - seq_q as isize;
    let window = window.min(seq_k) as isize;
    let run = |index: usize, dst: &mut [f32], threads: usize| {
        let (b, h) = (index / heads, index % heads);
        let kv = h / group;
        let (qs, ks, vs) = (q.strides(), k.strides(), v.strides());
        let query = Matrix { data: q.data(), start: b * qs[0] + h * qs[1], row_stride: qs[2], column_stride: qs[3] };
        // `kᵀ`: rows are features, columns are keys.
        let keys = Matrix { data: k.data(), start: b * ks[0] + kv * ks[1], row_stride: ks[3], column_stride: ks[2] };
        let values = Matrix { data: v.data(), start: b * vs[0] + kv * vs[1], row_stride: vs[2], column_stride: vs[3] };
        let mut scores = vec![0.0f32; seq_q * seq_k];
        product(query, keys, seq_q, d, seq_k, &mut scores, threads);
        if seq_k == 0 {
            dst.fill(0.0);
            return;
        }
        let sink = sinks.map(|sinks| sinks[h]);
        let mask = key_mask.map(|mask| &mask[b * seq_k..(b + 1) * seq_k]);
        for (i, row) in scores.chunks_mut(seq_k).enumerate() {
            let last_visible = i as isize + shift;
            let first_visible = last_visible - window + 1;
            for (j, score) in row.iter_mut().enumerate() {
                let key = j as isize;
                let hidden =
                    (causal && (key > last_visible || key < first_visible)) || mask.is_some_and(|mask| !mask[j]);
                *score = if hidden { f32::NEG_INFINITY } else { *score * scale };
            }
            match sink {
                Some(sink) => softmax_row_with_sink(row, sink),
                None => softmax_row(row),
            }
        }
        let weights = Matrix { data: &scores, start: 0, row_stride: seq_k, column_stride: 1 };
        product(weights, values, seq_q, seq_k, d_v, dst, threads);
    };
    let threads = rayon::current_num_threads();
    if batch * heads >= threads && threads > 1 {
        out.par_chunks_mut(head_size).enumerate().for_each(|(index, dst)| run(index, dst, 1));
    } else {
        out.chunks_mut(head_size).enumerate().for_each(|(index, dst)| run(index, dst, threads));
    }
    f32_tensor(out, &[batch, heads, seq_q, d_v])
}

/// The softmax of `row` beside one more logit, `sink`, whose share is dropped: the row's
/// weights sum to less than 1 by the sink's share.
fn softmax_row_with_sink(row: &mut [f32], sink: f32) {
    let max = row.iter().fold(sink, |max, &value| max.max(value));
    let mut sum = (sink - max).exp();
    for value in row.iter_mut() {
        *value = (*value - max).exp();
        sum += *value;
    }
    let inverse = 1.0 / sum;
    row.iter_mut().for_each(|value| *value *= inverse);
}

#[cfg(test)]
mod tests {
    use super::super::testing::{assert_close, cast, random};
    use super::*;
    use crate::Error;

    fn f64s(tensor: &Tensor) -> Vec<f64> {
        tensor.contiguous().to_f32_vec().unwrap().into_iter().map(f64::from).collect()
    }

    /// Attention computed directly in f64, one query at a time.
    fn reference(q: &Tensor, k: &Tensor, v: &Tensor, causal: bool, key_mask: Option<&[bool]>) -> Vec<f64> {
        windowed_reference(q, k, v, causal, key_mask, usize::MAX)
    }

    /// [`reference`] where, under the causal mask, the query at key index `p` also drops the
    /// keys `j <= p - window`.
    fn windowed_reference(
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        causal: bool,
        key_mask: Option<&[bool]>,
        window: usize,
    ) -> Vec<f64> {
        let [batch, heads, seq_q, d] = q.shape().try_into().unwrap();
        let [_, kv_heads, seq_k, _] = k.shape().try_into().unwrap();
        let d_v = v.shape()[3];
        let (qv, kv, vv) = (f64s(q), f64s(k), f64s(v));
        let mut out = Vec::new();
        for b in 0..batch {
            for h in 0..heads {
                let g = h / (heads / kv_heads);
                for i in 0..seq_q {
                    let visible: Vec<usize> = (0..seq_k)
                        .filter(|&j| !causal || j + seq_q <= i + seq_k)
                        .filter(|&j| !causal || j.saturating_add(window).saturating_add(seq_q) > i + seq_k)
                        .filter(|&j| key_mask.is_none_or(|m| m[b * seq_k + j]))
                        .collect();
                    let scores: Vec<f64> = visible
                        .iter()
                        .map(|&j| {
                            (0..d)
                                .map(|p| {
                                    qv[((b * heads + h) * seq_q + i) * d + p]
                                        * kv[((b * kv_heads + g) * seq_k + j) * d + p]
                                })
                                .sum::<f64>()
                                / (d as f64).sqrt()
                        })
                        .collect();
                    let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let total: f64 = scores.iter().map(|s| (s - max).exp()).sum();
                    for e in 0..d_v {
                        out.push(
                            visible
                                .iter()
                                .zip(&scores)
                                .map(|(&j, s)| (s - max).exp() / total * vv[((b * kv_heads + g) * seq_k + j) * d_v + e])
                                .sum(),
                        );
                    }
                }
            }
        }
        out
    }

    #[test]
    fn plain_attention_matches_reference() {
        let q = random(&[2, 3, 5, 8], 1);
        let k = random(&[2, 3, 7, 8], 2);
        let v = random(&[2, 3, 7, 4], 3);
        let out = Tensor::attention(&q, &k, &v, false, None).unwrap();
        assert_eq!(out.shape(), [2, 3, 5, 4]);
        assert_close(&out.to_vec::<f32>().unwrap(), &reference(&q, &k, &v, false, None), 1e-5);
    }

    #[test]
    fn grouped_query_causal_with_padding() {
        let q = random(&[2, 8, 6, 16], 4);
        let k = random(&[2, 2, 6, 16], 5);
        let v = random(&[2, 2, 6, 16], 6);
        let mask = [true, true, true, true, false, false, false, true, true, true, true, true];
        let out = Tensor::attention(&q, &k, &v, true, Some(&mask)).unwrap();
        assert_close(&out.to_vec::<f32>().unwrap(), &reference(&q, &k, &v, true, Some(&mask)), 1e-5);
        // The first query of the second sequence sees only a padded key: zeros, not NaN.
        let values = out.to_vec::<f32>().unwrap();
        let start = 8 * 6 * 16;
        assert!(values[start..start + 16].iter().all(|&x| x == 0.0));
        assert!(values.iter().all(|x| x.is_finite()));
    }

    #[test]
    fn causal_aligns_at_the_end_and_masks_fully() {
        // Two new queries against five keys (a cache of three).
        let q = random(&[1, 2, 2, 4], 7);
        let k = random(&[1, 1, 5, 4], 8);
        let v = random(&[1, 1, 5, 4], 9);
        let out = Tensor::attention(&q, &k, &v, true, None).unwrap();
        assert_close(&out.to_vec::<f32>().unwrap(), &reference(&q, &k, &v, true, None), 1e-5);
        let none = Tensor::attention(&q, &k, &v, false, Some(&[false; 5])).unwrap();
        assert!(none.to_vec::<f32>().unwrap().iter().all(|&x| x == 0.0));
    }

    #[test]
    fn strided_and_half_precision_operands() {
        // `[batch, seq, heads, d]` projections viewed as `[batch, heads, seq, d]`.
        let q = cast(&random(&[2, 5, 4, 8], 10), DType::BF16).permute(&[0, 2, 1, 3]).unwrap();
        let k = random(&[2, 5, 2, 8], 11).permute(&[0, 2, 1, 3]).unwrap();
        let v = cast(&random(&[2, 5, 2, 8], 12), DType::F16).permute(&[0, 2, 1, 3]).unwrap();
        let out = Tensor::attention(&q, &k, &v, true, None).unwrap();
        assert_eq!(out.dtype(), DType::F32);
        assert_close(&out.to_vec::<f32>().unwrap(), &reference(&q, &k, &v, true, None), 1e-5);
        // Many heads of a longer sequence, so heads run in parallel.
        let q = random(&[1, 12, 64, 32], 13);
        let k = random(&[1, 4, 64, 32], 14);
        let out = Tensor::attention(&q, &k, &k, true, None).unwrap();
        assert_close(&out.to_vec::<f32>().unwrap(), &reference(&q, &k, &k, true, None), 1e-5);
    }

    #[test]
    fn attention_refuses_bad_shapes() {
        let q = random(&[1, 3, 2, 4], 1);
        let k = random(&[1, 2, 2, 4], 2);
        assert!(matches!(Tensor::attention(&q, &k, &k, false, None), Err(Error::ShapeMismatch { .. })));
        let k = random(&[1, 1, 2, 5], 3);
        assert!(matches!(Tensor::attention(&q, &k, &k, false, None), Err(Error::ShapeMismatch { .. })));
        let k = random(&[1, 1, 2, 4], 4);
        assert!(matches!(Tensor::attention(&q, &k, &k, false, Some(&[true])), Err(Error::LengthMismatch { .. })));
        assert!(matches!(Tensor::attention(&random(&[3, 2, 4], 5), &k, &k, false, None), Err(Error::BadShape { .. })));
    }

    #[test]
    fn rotary_matches_the_formula() {
        let (batch, heads, seq, head_dim) = (2, 3, 4, 8);
        let x = random(&[batch, heads, seq, head_dim], 15);
        let positions = [0, 1, 5, 17];
        let theta = 10_000.0f32;
        let out = x.rotary(&positions, theta).unwrap().to_vec::<f32>().unwrap();
        let values = f64s(&x);
        let half = head_dim / 2;
        let mut expected = vec![0.0; values.len()];
        for row in 0..batch * heads * seq {
            let position = positions[row % seq] as f64;
            for i in 0..half {
                let angle = position * f64::from(theta).powf(-2.0 * i as f64 / head_dim as f64);
                let (x1, x2) = (values[row * head_dim + i], values[row * head_dim + half + i]);
                expected[row * head_dim + i] = x1 * angle.cos() - x2 * angle.sin();
                expected[row * head_dim + half + i] = x2 * angle.cos() + x1 * angle.sin();
            }
        }
        assert_close(&out, &expected, 1e-5);
        let half_precision = cast(&x, DType::BF16).rotary(&positions, theta).unwrap();
        assert_eq!(half_precision.dtype(), DType::F32);
        assert!(matches!(x.rotary(&[0, 1], theta), Err(Error::LengthMismatch { .. })));
        assert!(matches!(random(&[1, 1, 2, 3], 16).rotary(&[0, 1], theta), Err(Error::BadShape { .. })));
    }

    #[test]
    fn windowed_attention_matches_reference() {
        // (heads, kv_heads, seq_q, seq_k, window): prefill, decoding against a cache, a window
        // of one, windows at and past the keys, and more queries than keys.
        let cases = [
            (4, 2, 7, 7, 3),
            (4, 1, 1, 9, 4),
            (2, 2, 3, 8, 1),
            (6, 3, 5, 11, 5),
            (2, 1, 4, 4, 4),
            (2, 2, 6, 4, 2),
            (3, 3, 5, 5, 0),
        ];
        for (seed, &(heads, kv_heads, seq_q, seq_k, window)) in cases.iter().enumerate() {
            let seed = 100 + 3 * seed as u64;
            let q = random(&[2, heads, seq_q, 8], seed);
            let k = random(&[2, kv_heads, seq_k, 8], seed + 1);
            let v = random(&[2, kv_heads, seq_k, 4], seed + 2);
            let out = Tensor::attention_windowed(&q, &k, &v, None, window).unwrap().to_vec::<f32>().unwrap();
            assert_close(&out, &windowed_reference(&q, &k, &v, true, None, window), 1e-5);
            // Padding at the start of the first sequence and in the middle of the second.
            let mask: Vec<bool> =
                (0..2 * seq_k).map(|j| if j < seq_k { j > 0 } else { j != seq_k + seq_k / 2 }).collect();
            let out = Tensor::attention_windowed(&q, &k, &v, Some(&mask), window).unwrap().to_vec::<f32>().unwrap();
            let expected = windowed_reference(&q, &k, &v, true, Some(&mask), window);
            assert_close(&out, &expected, 1e-5);
            assert!(out.iter().all(|x| x.is_finite()));
        }
    }

    #[test]
    fn sinks_take_their_share_of_each_heads_softmax() {
        // Zero queries score every key alike: a query seeing `n` keys gives each the weight
        // `1 / (n + exp(sink))`, the sink taking the rest.
        let (heads, kv_heads, seq, window) = (4, 2, 6, 3);
        let q = Tensor::zeros(DType::F32, &[1, heads, seq, 8]);
        let k = random(&[1, kv_heads, seq, 8], 41);
        let v = random(&[1, kv_heads, seq, 4], 42);
        let sinks = [0.0f32, 1.5, -2.0, 0.25];
        let out = Tensor::attention_sinks(&q, &k, &v, None, window, &sinks).unwrap().to_vec::<f32>().unwrap();
        let values = f64s(&v);
        let mut expected = Vec::new();
        for (h, sink) in sinks.iter().enumerate() {
            let g = h / (heads / kv_heads);
            for i in 0..seq {
                let visible: Vec<usize> = (i.saturating_sub(window - 1)..=i).collect();
                let denominator = visible.len() as f64 + f64::from(*sink).exp();
                for e in 0..4 {
                    let sum: f64 = visible.iter().map(|&j| values[(g * seq + j) * 4 + e]).sum();
                    expected.push(sum / denominator);
                }
            }
        }
        assert_close(&out, &expected, 1e-5);
        // A sink of -inf takes nothing.
        let q = random(&[1, heads, seq, 8], 43);
        let none = Tensor::attention_sinks(&q, &k, &v, None, window, &[f32::NEG_INFINITY; 4]).unwrap();
        let windowed = Tensor::attention_windowed(&q, &k, &v, None, window).unwrap();
        assert_close(&none.to_vec::<f32>().unwrap(), &f64s(&windowed), 1e-6);
        assert!(matches!(
            Tensor::attention_sinks(&q, &k, &v, None, window, &[0.0; 3]),
            Err(Error::LengthMismatch { expected: 4, found: 3, .. })
        ));
    }

    #[test]
    fn a_window_over_every_key_is_causal_attention() {
        let q = random(&[1, 4, 3, 8], 20);
        let k = random(&[1, 2, 6, 8], 21);
        let v = random(&[1, 2, 6, 8], 22);
        let mask = [true, false, true, true, true, true];
        let causal = Tensor::attention(&q, &k, &v, true, Some(&mask)).unwrap().to_vec::<f32>().unwrap();
        for window in [6, 7, usize::MAX] {
            let windowed = Tensor::attention_windowed(&q, &k, &v, Some(&mask), window).unwrap();
            assert_eq!(windowed.to_vec::<f32>().unwrap(), causal);
        }
        let error = Tensor::attention_windowed(&q, &k, &v, Some(&[true]), 2).unwrap_err();
        assert!(matches!(error, Error::LengthMismatch { op: "attention_windowed", .. }));
    }

    #[test]
    fn rotary_scaled_divides_each_frequency() {
        let (batch, heads, seq, head_dim) = (1, 2, 3, 8);
        let x = random(&[batch, heads, seq, head_dim], 23);
        let positions = [0, 7, 4000];
        let theta = 500_000.0f32;
        assert_eq!(
            x.rotary_scaled(&positions, theta, &[1.0; 4]).unwrap().to_vec::<f32>().unwrap(),
            x.rotary(&positions, theta).unwrap().to_vec::<f32>().unwrap()
        );
        let factors = [1.0f32, 2.5, 8.0, 0.5];
        let out = x.rotary_scaled(&positions, theta, &factors).unwrap().to_vec::<f32>().unwrap();
        let values = f64s(&x);
        let half = head_dim / 2;
        let mut expected = vec![0.0; values.len()];
        for row in 0..batch * heads * seq {
            let position = positions[row % seq] as f64;
            for i in 0..half {
                let frequency = f64::from(theta).powf(-2.0 * i as f64 / head_dim as f64) / f64::from(factors[i]);
                let angle = position * frequency;
                let (x1, x2) = (values[row * head_dim + i], values[row * head_dim + half + i]);
                expected[row * head_dim + i] = x1 * angle.cos() - x2 * angle.sin();
                expected[row * head_dim + half + i] = x2 * angle.cos() + x1 * angle.sin();
            }
        }
        // Position 4000 turns by thousands of radians, where f32 angles are good to about 1e-4.
        assert_close(&out, &expected, 1e-3);
        let error = x.rotary_scaled(&positions, theta, &[1.0; 8]).unwrap_err();
        assert!(matches!(error, Error::LengthMismatch { op: "rotary_scaled", expected: 4, found: 8, .. }));
    }

    #[test]
    fn llama3_factors_match_the_converters() {
        // From numpy in f32, as llama.cpp's `LlamaModel.generate_extra_tensors` computes them.
        // With an original context of 32 (wavelengths 6.28, 32.4, 167, ..) no frequency is
        // between the wavelengths 8 and 32, so the first stays and the rest are divided by 8.
        assert_eq!(llama3_rope_factors(16, 500_000.0, 8.0, 1.0, 4.0, 32), [1.0, 8.0, 8.0, 8.0, 8.0, 8.0, 8.0, 8.0]);
        // Blended: wavelength 32.4 between 16 and 64, smooth = (64 / 32.4 - 1) / 3.
        let factors = llama3_rope_factors(16, 500_000.0, 8.0, 1.0, 4.0, 64);
        assert_eq!(factors, [1.0, 2.442_259_6, 8.0, 8.0, 8.0, 8.0, 8.0, 8.0]);
        let factors = llama3_rope_factors(16, 500_000.0, 8.0, 1.0, 4.0, 8192);
        assert_eq!(factors, [1.0, 1.0, 1.0, 1.0, 2.694_53, 8.0, 8.0, 8.0]);
    }

    #[test]
    fn embedding_gathers_rows() {
        let table = random(&[10, 6], 17);
        let ids = [3u32, 0, 9, 3];
        let out = Tensor::embedding(&table, &ids).unwrap();
        assert_eq!(out.shape(), [4, 6]);
        let values = table.to_vec::<f32>().unwrap();
        let expected: Vec<f64> =
            ids.iter().flat_map(|&id| values[id as usize * 6..id as usize * 6 + 6].to_vec()).map(f64::from).collect();
        assert_close(&out.to_vec::<f32>().unwrap(), &expected, 0.0);
        let bf16_table = cast(&table, DType::BF16);
        let half = Tensor::embedding(&bf16_table, &ids).unwrap();
        assert_eq!(half.dtype(), DType::F32);
        let viewed = table.transpose(0, 1).unwrap().contiguous().transpose(0, 1).unwrap();
        assert_eq!(Tensor::embedding(&viewed, &ids).unwrap().to_vec::<f32>().unwrap(), out.to_vec::<f32>().unwrap());
        let error = Tensor::embedding(&table, &[1, 10]).unwrap_err();
        assert!(matches!(error, Error::IndexOutOfRange { id: 10, position: 1, .. }));
        assert!(error.to_string().contains("10"));
    }
}
