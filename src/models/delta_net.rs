//! The Gated DeltaNet of Qwen3.5's linear-attention layers, on the host: a short causal
//! convolution over the projected queries, keys and values (its last inputs kept from step to
//! step), then the gated delta rule, a linear attention whose state matrix per value head
//! decays by `exp(g)` each token and moves toward the token's value along its key by `beta`.
//!
//! A prompt runs the rule in chunks of [`CHUNK`] tokens (the form transformers and the
//! flash-linear-attention kernels compute: a triangular solve per chunk, then products with the
//! state), a decoded token one step of the recurrence; both give the same numbers up to float
//! rounding, and both carry the state on.

use rayon::prelude::*;

/// Tokens per chunk of a prompt (transformers' and llama.cpp's chunk).
pub(crate) const CHUNK: usize = 64;

/// The l2 norm's epsilon, added to the sum of squares (transformers' constant; llama.cpp adds
/// `rms_norm_eps`, which is the same value in every published Qwen3.5).
const L2_EPS: f32 = 1e-6;

/// The shape of one layer's DeltaNet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct DeltaDims {
    /// Query/key heads.
    pub(crate) key_heads: usize,
    /// Value heads (a multiple of the key heads).
    pub(crate) value_heads: usize,
    /// Width of a query/key head.
    pub(crate) key_dim: usize,
    /// Width of a value head.
    pub(crate) value_dim: usize,
    /// Taps of the causal convolution.
    pub(crate) kernel: usize,
    /// How value heads share key heads: `true` for llama.cpp's tiled order (value head `h`
    /// reads key head `h % key_heads`, as its converter reorders them), `false` for
    /// transformers' grouped order (`h / (value_heads / key_heads)`).
    pub(crate) tiled: bool,
}

impl DeltaDims {
    /// Channels of the convolution: queries, keys, then values.
    pub(crate) fn channels(&self) -> usize {
        2 * self.key_heads * self.key_dim + self.value_heads * self.value_dim
    }

    /// Values of the convolution's remembered inputs, per sequence.
    pub(crate) fn conv_state(&self) -> usize {
        self.kernel.saturating_sub(1) * self.channels()
    }

    /// Values of the state matrices, per sequence.
    pub(crate) fn state(&self) -> usize {
        self.value_heads * self.key_dim * self.value_dim
    }

    /// The key head value head `head` reads.
    fn key_head(&self, head: usize) -> usize {
        match self.tiled {
            true => head % self.key_heads,
            false => head / (self.value_heads / self.key_heads).max(1),
        }
    }
}

fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// PyTorch's softplus (threshold 20: above it, `x` itself).
fn softplus(x: f32) -> f32 {
    if x > 20.0 { x } else { x.exp().ln_1p() }
}

/// The decay `g` (log space, at most 0) and the rate `beta` of each token and value head, from
/// the projections `a` and `b` (`[tokens, value_heads]`): `g = decay * softplus(a + dt_bias)`
/// with `decay = -exp(A_log)` per head, `beta = sigmoid(b)`.
pub(crate) fn gates(a: &[f32], b: &[f32], decay: &[f32], dt_bias: &[f32]) -> (Vec<f32>, Vec<f32>) {
    let heads = decay.len();
    let g = a.iter().enumerate().map(|(at, &a)| decay[at % heads] * softplus(a + dt_bias[at % heads])).collect();
    (g, b.iter().map(|&b| sigmoid(b)).collect())
}

/// The causal depthwise convolution of `x` (`[tokens, channels]`, replaced by the output)
/// with `weight` (`[channels, kernel]`, tap `kernel - 1` on the newest input), after the
/// inputs remembered in `state` (`[kernel - 1, channels]`, oldest first), then SiLU; `state`
/// then holds the last `kernel - 1` inputs.
pub(crate) fn conv_silu(x: &mut [f32], weight: &[f32], state: &mut [f32], dims: &DeltaDims) {
    let (channels, kernel) = (dims.channels(), dims.kernel);
    let remembered = kernel - 1;
    let tokens = x.len() / channels;
    // The inputs in time order: the remembered ones, then the new ones.
    let mut inputs = Vec::with_capacity((remembered + tokens) * channels);
    inputs.extend_from_slice(state);
    inputs.extend_from_slice(x);
    for (t, out) in x.chunks_exact_mut(channels).enumerate() {
        for (c, out) in out.iter_mut().enumerate() {
            let taps = &weight[c * kernel..(c + 1) * kernel];
            let sum: f32 = taps.iter().enumerate().map(|(tap, &w)| inputs[(t + tap) * channels + c] * w).sum();
            *out = silu(sum);
        }
    }
    state.copy_from_slice(&inputs[tokens * channels..]);
}

/// Each `width` values of `x` divided by their l2 norm.
fn l2_normalize(x: &mut [f32], width: usize) {
    for row in x.chunks_exact_mut(width) {
        let inverse = 1.0 / (row.iter().map(|v| v * v).sum::<f32>() + L2_EPS).sqrt();
        row.iter_mut().for_each(|v| *v *= inverse);
    }
}

/// The gated delta rule over `tokens` tokens of the convolved `mixed` (`[tokens, channels]`:
/// queries, keys, values) with decays `g` and rates `beta` (`[tokens, value_heads]`), from and
/// into `state` (`[value_heads, key_dim, value_dim]`); the output `[tokens, value_heads,
/// value_dim]`. Queries and keys are l2-normalized, queries scaled by `1 / sqrt(key_dim)`; more
/// than one token runs in chunks, one token as one step.
pub(crate) fn delta_rule(mixed: &[f32], g: &[f32], beta: &[f32], state: &mut [f32], dims: &DeltaDims) -> Vec<f32> {
    let DeltaDims { key_heads, value_heads, key_dim, value_dim, .. } = *dims;
    let channels = dims.channels();
    let tokens = mixed.len() / channels;
    let key_width = key_heads * key_dim;
    let mut q = Vec::with_capacity(tokens * key_width);
    let mut k = Vec::with_capacity(tokens * key_width);
    for row in mixed.chunks_exact(channels) {
        q.extend_from_slice(&row[..key_width]);
        k.extend_from_slice(&row[key_width..2 * key_width]);
    }
    l2_normalize(&mut q, key_dim);
    l2_normalize(&mut k, key_dim);
    let scale = 1.0 / (key_dim as f32).sqrt();
    q.iter_mut().for_each(|v| *v *= scale);
    let mut out = vec![0f32; tokens * value_heads * value_dim];
    let heads: Vec<Vec<f32>> = state
        .par_chunks_mut(key_dim * value_dim)
        .enumerate()
        .map(|(head, state)| {
            let source = dims.key_head(head);
            let head_q: Vec<&[f32]> =
                (0..tokens).map(|t| &q[(t * key_heads + source) * key_dim..][..key_dim]).collect();
            let head_k: Vec<&[f32]> =
                (0..tokens).map(|t| &k[(t * key_heads + source) * key_dim..][..key_dim]).collect();
            let value_at = 2 * key_width + head * value_dim;
            let head_v: Vec<&[f32]> = (0..tokens).map(|t| &mixed[t * channels + value_at..][..value_dim]).collect();
            let head_g: Vec<f32> = (0..tokens).map(|t| g[t * value_heads + head]).collect();
            let head_beta: Vec<f32> = (0..tokens).map(|t| beta[t * value_heads + head]).collect();
            let inputs = HeadInputs { q: &head_q, k: &head_k, v: &head_v, g: &head_g, beta: &head_beta };
            match tokens {
                1 => recurrent(&inputs, state, key_dim, value_dim),
                _ => chunked(&inputs, state, key_dim, value_dim),
            }
        })
        .collect();
    for (head, values) in heads.iter().enumerate() {
        for (t, row) in values.chunks_exact(value_dim).enumerate() {
            out[(t * value_heads + head) * value_dim..][..value_dim].copy_from_slice(row);
        }
    }
    out
}

/// One value head's inputs, token by token.
struct HeadInputs<'a> {
    q: &'a [&'a [f32]],
    k: &'a [&'a [f32]],
    v: &'a [&'a [f32]],
    g: &'a [f32],
    beta: &'a [f32],
}

/// The rule one token at a time: `S <- S exp(g)`, then `S += k (beta (v - S^T k))^T`, and the
/// output `S^T q`. `state` is `[key_dim, value_dim]`; the output `[tokens, value_dim]`.
fn recurrent(inputs: &HeadInputs<'_>, state: &mut [f32], key_dim: usize, value_dim: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(inputs.q.len() * value_dim);
    let mut delta = vec![0f32; value_dim];
    for t in 0..inputs.q.len() {
        let decay = inputs.g[t].exp();
        state.iter_mut().for_each(|s| *s *= decay);
        let (k, v) = (inputs.k[t], inputs.v[t]);
        delta.copy_from_slice(v);
        for (i, row) in state.chunks_exact(value_dim).enumerate() {
            for (d, s) in delta.iter_mut().zip(row) {
                *d -= s * k[i];
            }
        }
        delta.iter_mut().for_each(|d| *d *= inputs.beta[t]);
        for (i, row) in state.chunks_exact_mut(value_dim).enumerate() {
            for (s, d) in row.iter_mut().zip(&delta) {
                *s += k[i] * d;
            }
        }
        let q = inputs.q[t];
        let mut o = vec![0f32; value_dim];
        for (i, row) in state.chunks_exact(value_dim).enumerate() {
            for (o, s) in o.iter_mut().zip(row) {
                *o += s * q[i];
            }
        }
        debug_assert_eq!(key_dim, q.len());
        out.extend_from_slice(&o);
    }
    out
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(a, b)| a * b).sum()
}

/// The rule over [`CHUNK`] tokens at a time (the WY form): within a chunk, the delta rule's
/// updates are condensed by solving the unit lower-triangular system `(I + tril(beta_t k_t .
/// k_s e^{c_t - c_s}, -1)) U = beta v` (and the same for the decayed keys), so that the state
/// is read and written once per chunk. `c` is the running sum of `g` within the chunk.
fn chunked(inputs: &HeadInputs<'_>, state: &mut [f32], key_dim: usize, value_dim: usize) -> Vec<f32> {
    let tokens = inputs.q.len();
    let mut out = Vec::with_capacity(tokens * value_dim);
    for start in (0..tokens).step_by(CHUNK) {
        let len = CHUNK.min(tokens - start);
        let range = start..start + len;
        let (q, k, v) = (&inputs.q[range.clone()], &inputs.k[range.clone()], &inputs.v[range.clone()]);
        let beta = &inputs.beta[range.clone()];
        let mut cum = Vec::with_capacity(len);
        let mut running = 0f32;
        for &g in &inputs.g[range] {
            running += g;
            cum.push(running);
        }
        // The strictly lower system and its solutions: U (new values) and W (decayed keys).
        let mut system = vec![0f32; len * len];
        for t in 0..len {
            for s in 0..t {
                system[t * len + s] = beta[t] * dot(k[t], k[s]) * (cum[t] - cum[s]).exp();
            }
        }
        let mut u = vec![0f32; len * value_dim];
        let mut w = vec![0f32; len * key_dim];
        for t in 0..len {
            let (done, row) = u.split_at_mut(t * value_dim);
            for (x, &value) in row[..value_dim].iter_mut().zip(v[t]) {
                *x = value * beta[t];
            }
            let (done_w, row_w) = w.split_at_mut(t * key_dim);
            let decayed = cum[t].exp() * beta[t];
            for (x, &key) in row_w[..key_dim].iter_mut().zip(k[t]) {
                *x = key * decayed;
            }
            for s in 0..t {
                let a = system[t * len + s];
                if a != 0.0 {
                    for (x, y) in row[..value_dim].iter_mut().zip(&done[s * value_dim..(s + 1) * value_dim]) {
                        *x -= a * y;
                    }
                    for (x, y) in row_w[..key_dim].iter_mut().zip(&done_w[s * key_dim..(s + 1) * key_dim]) {
                        *x -= a * y;
                    }
                }
            }
        }
        // The values the state does not already predict: U - W S.
        for t in 0..len {
            let row = &mut u[t * value_dim..(t + 1) * value_dim];
            for (i, s_row) in state.chunks_exact(value_dim).enumerate() {
                let weight = w[t * key_dim + i];
                for (x, s) in row.iter_mut().zip(s_row) {
                    *x -= weight * s;
                }
            }
        }
        // Outputs: the decayed query's read of the state, plus the chunk's own attention.
        for t in 0..len {
            let mut o = vec![0f32; value_dim];
            let decay = cum[t].exp();
            for (i, s_row) in state.chunks_exact(value_dim).enumerate() {
                let weight = q[t][i] * decay;
                for (o, s) in o.iter_mut().zip(s_row) {
                    *o += weight * s;
                }
            }
            for s in 0..=t {
                let weight = dot(q[t], k[s]) * (cum[t] - cum[s]).exp();
                for (o, x) in o.iter_mut().zip(&u[s * value_dim..(s + 1) * value_dim]) {
                    *o += weight * x;
                }
            }
            out.extend_from_slice(&o);
        }
        // The state at the chunk's end.
        let last = cum[len - 1];
        let decay = last.exp();
        state.iter_mut().for_each(|s| *s *= decay);
        for s in 0..len {
            let weight = (last - cum[s]).exp();
            for (i, s_row) in state.chunks_exact_mut(value_dim).enumerate() {
                let key = k[s][i] * weight;
                for (x, y) in s_row.iter_mut().zip(&u[s * value_dim..(s + 1) * value_dim]) {
                    *x += key * y;
                }
            }
        }
    }
    out
}

/// The gated RMSNorm after the rule: each value head's `value_dim` outputs normalized (with
/// `eps`), times `weight`, times `silu(z)` of the same place (`out` and `z` `[tokens,
/// value_heads * value_dim]`).
pub(crate) fn gated_norm(out: &mut [f32], z: &[f32], weight: &[f32], eps: f32) {
    let width = weight.len();
    for (row, z) in out.chunks_exact_mut(width).zip(z.chunks_exact(width)) {
        let inverse = 1.0 / (row.iter().map(|v| v * v).sum::<f32>() / width as f32 + eps).sqrt();
        for ((x, w), z) in row.iter_mut().zip(weight).zip(z) {
            *x = *x * inverse * w * silu(*z);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dims(tiled: bool) -> DeltaDims {
        DeltaDims { key_heads: 2, value_heads: 4, key_dim: 8, value_dim: 8, kernel: 4, tiled }
    }

    fn values(len: usize, seed: f32) -> Vec<f32> {
        (0..len).map(|i| ((i as f32 * 0.731 + seed).sin() * 1.3).tan().clamp(-2.0, 2.0)).collect()
    }

    #[test]
    fn a_prompt_in_chunks_equals_the_recurrence_token_by_token() {
        // 150 tokens: two whole chunks and a part, against 150 single steps.
        for tiled in [false, true] {
            let dims = dims(tiled);
            let tokens = 150;
            let mixed = values(tokens * dims.channels(), 0.3);
            let g: Vec<f32> = values(tokens * dims.value_heads, 1.1).iter().map(|v| -0.2 * v.abs()).collect();
            let beta: Vec<f32> = values(tokens * dims.value_heads, 2.7).iter().map(|v| sigmoid(*v)).collect();
            let mut chunked_state = values(dims.state(), 4.0).iter().map(|v| 0.1 * v).collect::<Vec<_>>();
            let mut stepped_state = chunked_state.clone();
            let chunked = delta_rule(&mixed, &g, &beta, &mut chunked_state, &dims);
            let mut stepped = Vec::new();
            for t in 0..tokens {
                let row = &mixed[t * dims.channels()..(t + 1) * dims.channels()];
                let heads = dims.value_heads;
                let out = delta_rule(
                    row,
                    &g[t * heads..(t + 1) * heads],
                    &beta[t * heads..(t + 1) * heads],
                    &mut stepped_state,
                    &dims,
                );
                stepped.extend(out);
            }
            let diff = chunked.iter().zip(&stepped).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
            assert!(diff < 1e-5, "outputs differ by {diff}");
            let diff = chunked_state.iter().zip(&stepped_state).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
            assert!(diff < 1e-5, "states differ by {diff}");
        }
    }

    #[test]
    fn the_convolution_carries_its_inputs_across_calls() {
        let dims = DeltaDims { key_heads: 1, value_heads: 1, key_dim: 1, value_dim: 1, kernel: 3, tiled: false };
        // Three channels of tap weights [1, 2, 3] (newest last) over inputs 1, 2, 3, 4.
        let weight: Vec<f32> = (0..3).flat_map(|_| [1.0, 2.0, 3.0]).collect();
        let inputs: Vec<f32> = (1..=4).flat_map(|t| [t as f32; 3]).collect();
        let mut whole = inputs.clone();
        let mut state = vec![0.0; dims.conv_state()];
        conv_silu(&mut whole, &weight, &mut state, &dims);
        let mut split = inputs.clone();
        let mut state_split = vec![0.0; dims.conv_state()];
        let (first, second) = split.split_at_mut(6);
        conv_silu(first, &weight, &mut state_split, &dims);
        conv_silu(second, &weight, &mut state_split, &dims);
        assert_eq!(whole, split);
        assert_eq!(state, state_split);
        // Token 3: 1 * 1 + 2 * 2 + 3 * 3 = 14.
        assert!((whole[6] - silu(14.0)).abs() < 1e-6);
        assert_eq!(state, vec![3.0, 3.0, 3.0, 4.0, 4.0, 4.0]);
    }
}
