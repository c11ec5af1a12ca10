//! Fused CPU kernels for transformer encoders, over packed token rows.
//!
//! A batch of sequences of different lengths is one `[tokens, width]` matrix with the sequences
//! one after another and no padding, so the products never compute a padded row and attention
//! never scores a padded key. A linear layer computes its product in blocks of rows, one block
//! per rayon task, and gives each block its bias and GELU, or its residual and layer norm, while
//! the block is still in cache, where the unfused path makes one more pass over the whole output
//! per step. The caller owns the buffers and reuses them from layer to layer: large fresh
//! buffers cost page faults on every allocation.
//!
//! The row loops (GELU, exponentials, sums, layer norm, the scores of short sequences) are
//! written to vectorize and run compiled for AVX-512 or AVX2 when the CPU has it; the default
//! x86-64 target has only SSE2. GELU and the exponential are polynomial approximations accurate
//! to a few parts in 10⁷, not calls to `libm`.

use gemm::Parallelism;
use rayon::prelude::*;

use super::matmul::Matrix;
use super::{Dense, f32_values};
use crate::Tensor;
use crate::error::{ConcatProblem, Error, Result};
use crate::shape::{check_float, check_parameter};

/// Rows per block of a fused linear layer: a block of a 1536-wide output stays in a 2 MiB cache
/// while its epilogue runs, and `gemm` packs its operands once per block.
const BLOCK_ROWS: usize = 256;
/// Blocks are not made smaller than this to occupy more threads.
const MIN_BLOCK_ROWS: usize = 16;
/// Multiply-adds below which threading a single product costs more than it saves.
const THREADED_WORK: usize = 1 << 20;
/// Sequences up to this length get their attention scores from plain loops; longer ones from
/// matrix products.
const DIRECT_KEYS: usize = 48;
/// Queries per attention task of a long sequence.
const QUERY_BLOCK: usize = 64;
/// Independent accumulators in the row sums: enough for one AVX-512 register.
const LANES: usize = 16;

/// What a [`FusedLinear`] does to each row of its product before storing it.
#[derive(Clone, Copy, Debug)]
pub enum Epilogue<'a> {
    /// `out = x · weightᵀ + bias`.
    Bias,
    /// `out = gelu(x · weightᵀ + bias)`, GELU in its exact (erf) form as BERT uses it.
    Gelu,
    /// `out = norm(out + x · weightᵀ + bias)`: `out` holds the residual on entry, as in a
    /// post-norm transformer layer (BERT's attention output and feed-forward output).
    ResidualLayerNorm(&'a FusedLayerNorm),
}

/// A linear layer prepared for fused products: its weight transposed to `[in_features,
/// out_features]` in f32, and its bias in f32. The transpose is a copy, made once: `gemm`
/// multiplies blocks of a few dozen rows by a row-major `[in, out]` operand up to three times as
/// fast as by the transposed view of an `[out, in]` weight.
pub struct FusedLinear {
    /// `[in_features, out_features]`, row-major.
    weight: Vec<f32>,
    /// `[out_features]`, zeros for a layer without a bias.
    bias: Vec<f32>,
    in_features: usize,
}

impl std::fmt::Debug for FusedLinear {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("FusedLinear")
            .field("in_features", &self.in_features())
            .field("out_features", &self.out_features())
            .finish()
    }
}

impl FusedLinear {
    /// The layer computing the outputs of the linear layers `(weight, bias)`, side by side: what
    /// [`FusedLinear::concat`] builds from [`crate::nn::Linear`]s.
    pub(crate) fn from_layers(layers: &[(&Tensor, Option<&Tensor>)]) -> Result<FusedLinear> {
        const OP: &str = "fused_linear";
        let Some(&(first, _)) = layers.first() else {
            return Err(Error::Concat { problem: ConcatProblem::Empty });
        };
        let mut weights = Vec::with_capacity(layers.len());
        let mut bias = Vec::new();
        for &(weight, layer_bias) in layers {
            check_float(weight, OP)?;
            if weight.rank() != 2 {
                return Err(Error::BadShape {
                    op: OP,
                    expected: "[out_features, in_features]",
                    shape: weight.shape().to_vec(),
                });
            }
            if weight.shape()[1] != first.shape()[1] {
                return Err(Error::ShapeMismatch {
                    op: OP,
                    lhs: first.shape().to_vec(),
                    rhs: weight.shape().to_vec(),
                    reason: "the layers must have the same `in_features`",
                });
            }
            let out_features = weight.shape()[0];
            check_parameter(layer_bias, out_features, weight, OP, "the bias must be `[out_features]`")?;
            match layer_bias {
                Some(values) => bias.extend(f32_values(values, OP)?),
                None => bias.resize(bias.len() + out_features, 0.0),
            }
            weights.push(Dense::new(weight, OP)?);
        }
        let (in_features, out_features) = (first.shape()[1], bias.len());
        let mut transposed = vec![0.0f32; in_features * out_features];
        let mut column = 0;
        for weight in &weights {
            let (rows, strides, data) = (weight.shape()[0], weight.strides(), weight.data());
            for (input, row) in transposed.chunks_exact_mut(out_features).enumerate() {
                for (output, value) in row[column..column + rows].iter_mut().enumerate() {
                    *value = data[output * strides[0] + input * strides[1]];
                }
            }
            column += rows;
        }
        Ok(FusedLinear { weight: transposed, bias, in_features })
    }

    /// The input width.
    pub fn in_features(&self) -> usize {
        self.in_features
    }

    /// The output width.
    pub fn out_features(&self) -> usize {
        self.bias.len()
    }

    /// `out = epilogue(input · weightᵀ + bias)` for `input` `[rows, in_features]` and `out`
    /// `[rows, out_features]`, both row-major. Blocks of rows run on rayon's threads.
    ///
    /// # Panics
    /// When `out` is not a whole number of rows, `input` does not hold as many rows, or the
    /// norm of [`Epilogue::ResidualLayerNorm`] is not `out_features` wide.
    pub fn forward_into(&self, input: &[f32], out: &mut [f32], epilogue: Epilogue<'_>) {
        let (k, n) = (self.in_features(), self.out_features());
        if n == 0 {
            assert!(out.is_empty(), "a layer without outputs writes nothing");
            return;
        }
        assert_eq!(out.len() % n, 0, "the output holds whole rows of `out_features`");
        let rows = out.len() / n;
        assert_eq!(input.len(), rows * k, "the input holds as many rows of `in_features` as the output");
        if let Epilogue::ResidualLayerNorm(norm) = epilogue {
            assert_eq!(norm.weight.len(), n, "the norm is as wide as the output");
        }
        let weight = Matrix { data: &self.weight, start: 0, row_stride: n, column_stride: 1 };
        let accumulate = matches!(epilogue, Epilogue::ResidualLayerNorm(_));
        let threads = rayon::current_num_threads();
        let block = block_rows(rows, threads);
        let run = |first: usize, dst: &mut [f32], parallelism: Parallelism| {
            let count = dst.len() / n;
            let lhs = Matrix { data: input, start: first * k, row_stride: k, column_stride: 1 };
            multiply_into(lhs, weight, [count, k, n], dst, n, accumulate, parallelism);
            finish(dst, n, Some(&self.bias), epilogue);
        };
        if block < rows {
            out.par_chunks_mut(block * n)
                .enumerate()
                .for_each(|(index, dst)| run(index * block, dst, Parallelism::None));
        } else if threads > 1 && rows * k * n >= THREADED_WORK {
            run(0, out, Parallelism::Rayon(threads));
        } else {
            run(0, out, Parallelism::None);
        }
    }
}

/// A layer norm prepared for fused kernels: weight and bias as f32.
#[derive(Clone, Debug)]
pub struct FusedLayerNorm {
    weight: Vec<f32>,
    /// Zeros for a norm without a bias.
    bias: Vec<f32>,
    eps: f32,
}

impl FusedLayerNorm {
    /// The layer norm of `weight`, `bias` and `eps`: what [`FusedLayerNorm::new`] builds from a
    /// [`crate::nn::LayerNorm`].
    pub(crate) fn from_parts(weight: &Tensor, bias: Option<&Tensor>, eps: f32) -> Result<FusedLayerNorm> {
        const OP: &str = "fused_layer_norm";
        let &[width] = weight.shape() else {
            return Err(Error::BadShape { op: OP, expected: "[dim]", shape: weight.shape().to_vec() });
        };
        check_parameter(bias, width, weight, OP, "the bias must be `[dim]` like the weight")?;
        let bias = match bias {
            Some(bias) => f32_values(bias, OP)?,
            None => vec![0.0; width],
        };
        Ok(FusedLayerNorm { weight: f32_values(weight, OP)?, bias, eps })
    }

    /// The width of the rows it normalises.
    pub fn width(&self) -> usize {
        self.weight.len()
    }

    /// Normalises each row of `rows` (`[count, width]`, row-major) in place, as
    /// [`crate::Tensor::layer_norm`] does.
    ///
    /// # Panics
    /// When `rows` is not a whole number of rows.
    pub fn forward_in_place(&self, rows: &mut [f32]) {
        let width = self.width();
        if width == 0 {
            return;
        }
        assert_eq!(rows.len() % width, 0, "the values are whole rows of the norm's width");
        let epilogue = Epilogue::ResidualLayerNorm(self);
        if rows.len() >= super::PARALLEL_ELEMENTS {
            rows.par_chunks_mut(BLOCK_ROWS * width).for_each(|block| finish(block, width, None, epilogue));
        } else {
            finish(rows, width, None, epilogue);
        }
    }
}

/// Bidirectional multi-head attention over packed sequences: `softmax(q kᵀ / √d) v` for each
/// sequence and head, no query seeing a key of another sequence.
///
/// `qkv` is `[tokens, 3 · width]`, each row the token's query, key and value side by side (as
/// a [`FusedLinear::concat`] of the three projections computes them), each of them `heads`
/// heads of `width / heads`; the sequences, of `lengths` tokens, lie one after another.
/// `out`, `[tokens, width]`, receives each head's context in the head's columns, ready for the
/// output projection. Sequences and blocks of queries run on rayon's threads.
///
/// # Panics
/// When `heads` is 0 or does not divide the width, or the buffers do not hold
/// `sum(lengths)` rows.
///
/// # Examples
/// ```
/// use nnx_core::fused::packed_attention;
/// // One head of width 1, two sequences: a token alone attends to itself.
/// let qkv = [1.0f32, 1.0, 5.0, /* second sequence */ 0.0, 0.0, 2.0, 0.0, 0.0, 4.0];
/// let mut out = [0.0f32; 3];
/// packed_attention(&qkv, &[1, 2], 1, &mut out);
/// assert_eq!(out, [5.0, 3.0, 3.0]);
/// ```
pub fn packed_attention(qkv: &[f32], lengths: &[usize], heads: usize, out: &mut [f32]) {
    assert!(heads > 0, "attention has at least one head");
    let tokens: usize = lengths.iter().sum();
    if tokens == 0 {
        assert!(qkv.is_empty() && out.is_empty(), "no tokens, no values");
        return;
    }
    assert_eq!(out.len() % tokens, 0, "the output holds one row per token");
    let width = out.len() / tokens;
    assert_eq!(width % heads, 0, "the heads divide the width");
    assert_eq!(qkv.len(), 3 * out.len(), "each token has a query, a key and a value as wide as the output");
    let shape = HeadShape { width, heads, head_dim: width / heads };
    // One task per sequence, or per block of queries of a long one; each owns its output rows.
    let mut tasks = Vec::new();
    let mut rest = out;
    let mut start = 0;
    for &length in lengths {
        let block = if length <= DIRECT_KEYS { length.max(1) } else { QUERY_BLOCK };
        let mut first = 0;
        while first < length {
            let count = block.min(length - first);
            let (rows, tail) = rest.split_at_mut(count * width);
            tasks.push((Sequence { start, length, first_query: first }, rows));
            rest = tail;
            first += count;
        }
        start += length;
    }
    tasks.into_par_iter().for_each_init(Vec::new, |scores, (sequence, rows)| {
        attend(qkv, shape, sequence, rows, scores);
    });
}

/// The widths of packed attention.
#[derive(Clone, Copy)]
struct HeadShape {
    width: usize,
    heads: usize,
    head_dim: usize,
}

/// One attention task: the sequence's first row and length, and its first query of the task.
#[derive(Clone, Copy)]
struct Sequence {
    start: usize,
    length: usize,
    first_query: usize,
}

/// Rows per block for `rows` rows on `threads` threads: blocks of at most [`BLOCK_ROWS`] and,
/// where the rows allow, at least [`MIN_BLOCK_ROWS`], as many as a multiple of the threads, of
/// equal size.
fn block_rows(rows: usize, threads: usize) -> usize {
    let blocks = rows.div_ceil(BLOCK_ROWS).next_multiple_of(threads.max(1)).min(rows / MIN_BLOCK_ROWS).max(1);
    rows.div_ceil(blocks).max(1)
}

/// `dst = lhs · rhs`, or `dst += lhs · rhs` with `accumulate`, for an `m × k` `lhs` and a
/// `k × n` `rhs`, into the rows of `dst` that start `dst_stride` apart.
fn multiply_into(
    lhs: Matrix<'_>,
    rhs: Matrix<'_>,
    [m, k, n]: [usize; 3],
    dst: &mut [f32],
    dst_stride: usize,
    accumulate: bool,
    parallelism: Parallelism,
) {
    if m == 0 || n == 0 {
        return;
    }
    assert!(n <= dst_stride && (m - 1) * dst_stride + n <= dst.len(), "the destination holds the product");
    if k == 0 {
        if !accumulate {
            dst.chunks_mut(dst_stride).for_each(|row| row[..n].fill(0.0));
        }
        return;
    }
    let last = |matrix: &Matrix<'_>, rows: usize, columns: usize| {
        matrix.start + (rows - 1) * matrix.row_stride + (columns - 1) * matrix.column_stride
    };
    assert!(last(&lhs, m, k) < lhs.data.len(), "the left operand lies in its block");
    assert!(last(&rhs, k, n) < rhs.data.len(), "the right operand lies in its block");
    // SAFETY: `dst` is exclusively borrowed and element (i, j) of the product, at `i *
    // dst_stride + j` for i < m and j < n <= dst_stride, lies in it (checked above). Each
    // operand's elements `start + i * row_stride + j * column_stride` lie in its slice: the
    // largest such offset was checked and strides are non-negative. The operands are shared
    // borrows that do not alias `dst`. With `accumulate`, `dst` is read and its elements are
    // initialised f32 values; otherwise it is only written. `T` is f32, which `gemm` supports.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            dst_stride as isize,
            accumulate,
            lhs.data.as_ptr().add(lhs.start),
            lhs.column_stride as isize,
            lhs.row_stride as isize,
            rhs.data.as_ptr().add(rhs.start),
            rhs.column_stride as isize,
            rhs.row_stride as isize,
            1.0f32,
            1.0f32,
            false,
            false,
            false,
            parallelism,
        );
    }
}

/// Runs `$generic(args)` compiled for AVX-512 or AVX2 when the CPU has it, else as built.
macro_rules! widest_simd {
    ($avx512:ident, $avx2:ident, $generic:ident ( $($arg:expr),* )) => {{
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
            {
                // SAFETY: the CPU has every feature the function is compiled for (checked above).
                return unsafe { $avx512($($arg),*) };
            }
            if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
                // SAFETY: the CPU has every feature the function is compiled for (checked above).
                return unsafe { $avx2($($arg),*) };
            }
        }
        $generic($($arg),*)
    }};
}

/// The epilogue on rows of `width` values: the bias, when there is one, then the activation or
/// the layer norm. For [`Epilogue::ResidualLayerNorm`] the rows already hold the residual plus
/// the product.
fn finish(rows: &mut [f32], width: usize, bias: Option<&[f32]>, epilogue: Epilogue<'_>) {
    widest_simd!(finish_avx512, finish_avx2, finish_generic(rows, width, bias, epilogue))
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
fn finish_avx512(rows: &mut [f32], width: usize, bias: Option<&[f32]>, epilogue: Epilogue<'_>) {
    finish_generic(rows, width, bias, epilogue);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn finish_avx2(rows: &mut [f32], width: usize, bias: Option<&[f32]>, epilogue: Epilogue<'_>) {
    finish_generic(rows, width, bias, epilogue);
}

#[inline(always)]
fn finish_generic(rows: &mut [f32], width: usize, bias: Option<&[f32]>, epilogue: Epilogue<'_>) {
    for row in rows.chunks_exact_mut(width) {
        if let Some(bias) = bias {
            for (x, &b) in row.iter_mut().zip(bias) {
                *x += b;
            }
        }
        match epilogue {
            Epilogue::Bias => {}
            Epilogue::Gelu => {
                for x in row.iter_mut() {
                    *x = gelu(*x);
                }
            }
            Epilogue::ResidualLayerNorm(norm) => layer_norm_row(row, norm),
        }
    }
}

/// The attention of one task into its output rows.
fn attend(qkv: &[f32], shape: HeadShape, sequence: Sequence, rows: &mut [f32], scores: &mut Vec<f32>) {
    widest_simd!(attend_avx512, attend_avx2, attend_generic(qkv, shape, sequence, rows, scores))
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
fn attend_avx512(qkv: &[f32], shape: HeadShape, sequence: Sequence, rows: &mut [f32], scores: &mut Vec<f32>) {
    attend_generic(qkv, shape, sequence, rows, scores);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn attend_avx2(qkv: &[f32], shape: HeadShape, sequence: Sequence, rows: &mut [f32], scores: &mut Vec<f32>) {
    attend_generic(qkv, shape, sequence, rows, scores);
}

#[inline(always)]
fn attend_generic(qkv: &[f32], shape: HeadShape, sequence: Sequence, rows: &mut [f32], scores: &mut Vec<f32>) {
    let HeadShape { width, heads, head_dim } = shape;
    let Sequence { start, length, first_query } = sequence;
    let stride = 3 * width;
    let queries = rows.len() / width;
    let scale = 1.0 / (head_dim as f32).sqrt();
    // Where a token's query, key or value of head `head` starts in `qkv`.
    let at = |token: usize, part: usize, head: usize| (start + token) * stride + part * width + head * head_dim;
    if length <= DIRECT_KEYS {
        scores.resize(length, 0.0);
        for (query, row) in rows.chunks_exact_mut(width).enumerate() {
            for head in 0..heads {
                let q = &qkv[at(first_query + query, 0, head)..][..head_dim];
                for (key, score) in scores.iter_mut().enumerate() {
                    *score = dot(q, &qkv[at(key, 1, head)..][..head_dim]);
                }
                softmax_scaled(scores, scale);
                let context = &mut row[head * head_dim..][..head_dim];
                context.fill(0.0);
                for (key, &weight) in scores.iter().enumerate() {
                    let value = &qkv[at(key, 2, head)..][..head_dim];
                    for (c, &v) in context.iter_mut().zip(value) {
                        *c += weight * v;
                    }
                }
            }
        }
        return;
    }
    scores.resize(queries * length, 0.0);
    for head in 0..heads {
        let q = Matrix { data: qkv, start: at(first_query, 0, head), row_stride: stride, column_stride: 1 };
        // `kᵀ`: rows are features, columns are keys.
        let keys = Matrix { data: qkv, start: at(0, 1, head), row_stride: 1, column_stride: stride };
        multiply_into(q, keys, [queries, head_dim, length], scores, length, false, Parallelism::None);
        for row in scores.chunks_exact_mut(length) {
            softmax_scaled(row, scale);
        }
        let weights = Matrix { data: scores, start: 0, row_stride: length, column_stride: 1 };
        let values = Matrix { data: qkv, start: at(0, 2, head), row_stride: stride, column_stride: 1 };
        multiply_into(
            weights,
            values,
            [queries, length, head_dim],
            &mut rows[head * head_dim..],
            width,
            false,
            Parallelism::None,
        );
    }
}

// The helpers below are `for` loops, not iterator adaptors: an adaptor's closure can end up
// in a function of its own, compiled without the vector instructions of its caller.

/// `lanes` folded by `combine` in halves (8 pairs, then 4, 2, 1): four vector steps, where
/// folding them in order would be sixteen dependent scalar ones.
#[inline(always)]
fn reduce(mut lanes: [f32; LANES], combine: impl Fn(f32, f32) -> f32) -> f32 {
    let mut width = LANES / 2;
    while width > 0 {
        for at in 0..width {
            lanes[at] = combine(lanes[at], lanes[at + width]);
        }
        width /= 2;
    }
    lanes[0]
}

/// The sum of `values`, in [`LANES`] independent accumulators so that it vectorizes.
#[inline(always)]
fn sum(values: &[f32]) -> f32 {
    let mut lanes = [0.0f32; LANES];
    let chunks = values.chunks_exact(LANES);
    let tail = chunks.remainder();
    for chunk in chunks {
        for (lane, &x) in lanes.iter_mut().zip(chunk) {
            *lane += x;
        }
    }
    let mut total = reduce(lanes, |a, b| a + b);
    for &x in tail {
        total += x;
    }
    total
}

/// The dot product of two slices of equal length, vectorized as [`sum`] is.
#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0.0f32; LANES];
    let (chunks, others) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let mut total = 0.0;
    for (&x, &y) in chunks.remainder().iter().zip(others.remainder()) {
        total += x * y;
    }
    for (chunk, other) in chunks.zip(others) {
        for (lane, (&x, &y)) in lanes.iter_mut().zip(chunk.iter().zip(other)) {
            *lane += x * y;
        }
    }
    total + reduce(lanes, |a, b| a + b)
}

/// The largest of `values` (`-inf` for none).
#[inline(always)]
fn max(values: &[f32]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let chunks = values.chunks_exact(LANES);
    let tail = chunks.remainder();
    for chunk in chunks {
        for (lane, &x) in lanes.iter_mut().zip(chunk) {
            *lane = lane.max(x);
        }
    }
    let mut largest = reduce(lanes, f32::max);
    for &x in tail {
        largest = largest.max(x);
    }
    largest
}

/// `softmax(scale · row)` in place, for a row of finite values and a positive scale.
#[inline(always)]
fn softmax_scaled(row: &mut [f32], scale: f32) {
    let largest = max(row);
    for x in row.iter_mut() {
        *x = exp((*x - largest) * scale);
    }
    let inverse = 1.0 / sum(row);
    for x in row.iter_mut() {
        *x *= inverse;
    }
}

/// Layer norm of one row, in the order of operations of [`crate::Tensor::layer_norm`].
#[inline(always)]
fn layer_norm_row(row: &mut [f32], norm: &FusedLayerNorm) {
    let width = row.len() as f32;
    let mean = sum(row) / width;
    let mut lanes = [0.0f32; LANES];
    let chunks = row.chunks_exact(LANES);
    let mut squares = 0.0;
    for &x in chunks.remainder() {
        squares += (x - mean) * (x - mean);
    }
    for chunk in chunks {
        for (lane, &x) in lanes.iter_mut().zip(chunk) {
            *lane += (x - mean) * (x - mean);
        }
    }
    squares += reduce(lanes, |a, b| a + b);
    let inverse = 1.0 / (squares / width + norm.eps).sqrt();
    for ((x, &weight), &bias) in row.iter_mut().zip(&norm.weight).zip(&norm.bias) {
        *x = (*x - mean) * inverse * weight + bias;
    }
}

/// `e^x` without a library call, so that loops of it vectorize: `x = n ln 2 + r` with `|r| <=
/// ln 2 / 2`, `e^r` from its Taylor series to degree 7 (relative error below 10⁻⁸ before
/// rounding) and `2^n` built in the exponent bits. Inputs are clamped to `[-87, 88]`, where
/// `e^x` is a normal f32, so `e^x` below `e^-87` comes out as about 1.6 · 10⁻³⁸, not 0.
#[inline(always)]
fn exp(x: f32) -> f32 {
    // Adding 1.5 · 2^23 rounds to an integer held in the low bits of the mantissa.
    const ROUND: f32 = 12_582_912.0;
    // ln 2 in two parts (Cody and Waite): `n · LN_2_HIGH` is exact for the `n` that occur.
    const LN_2_HIGH: f32 = 0.693_359_4;
    const LN_2_LOW: f32 = -2.121_944_4e-4;
    let x = x.clamp(-87.0, 88.0);
    let shifted = x * std::f32::consts::LOG2_E + ROUND;
    let n = shifted - ROUND;
    let r = (x - n * LN_2_HIGH) - n * LN_2_LOW;
    let polynomial = 1.0
        + r * (1.0
            + r * (1.0 / 2.0
                + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0 + r * (1.0 / 5040.0)))))));
    let power = f32::from_bits(shifted.to_bits().wrapping_sub(ROUND.to_bits()).wrapping_add(127) << 23);
    polynomial * power
}

/// GELU in its exact form, `x/2 · (1 + erf(x / √2))`, with `erfc` of Abramowitz and Stegun's
/// 7.1.26 (absolute error below 1.5 · 10⁻⁷): for `z = |x| / √2`, `1 + erf(x / √2)` is `2 -
/// erfc(z)` for positive `x` and `erfc(z)` for negative `x`, which keeps its relative accuracy
/// where GELU is tiny.
#[inline(always)]
fn gelu(x: f32) -> f32 {
    const P: f32 = 0.327_591_1;
    const A: [f32; 5] = [0.254_829_6, -0.284_496_74, 1.421_413_7, -1.453_152_1, 1.061_405_4];
    let z = (x * std::f32::consts::FRAC_1_SQRT_2).abs();
    let t = 1.0 / (1.0 + P * z);
    let erfc = t * (A[0] + t * (A[1] + t * (A[2] + t * (A[3] + t * A[4])))) * exp(-z * z);
    let one_plus_erf = if x >= 0.0 { 2.0 - erfc } else { erfc };
    0.5 * x * one_plus_erf
}

#[cfg(test)]
mod tests {
    use super::super::testing::{assert_close, random, values};
    use super::*;
    use crate::nn::{Init, LayerNorm, Linear};

    fn f64s(values: &[f32]) -> Vec<f64> {
        values.iter().map(|&x| f64::from(x)).collect()
    }

    #[test]
    fn exp_and_gelu_match_the_library_functions() {
        let inputs: Vec<f32> = (-4000..=4000).map(|i| i as f32 / 100.0).collect();
        for &x in &inputs {
            let expected = f64::from(x).exp();
            let found = f64::from(exp(x));
            assert!((found - expected).abs() <= 4e-7 * expected, "exp({x}): {found} vs {expected}");
            let erf = libm::erf(f64::from(x) / std::f64::consts::SQRT_2);
            let gelu_expected = 0.5 * f64::from(x) * (1.0 + erf);
            let gelu_found = f64::from(gelu(x));
            assert!((gelu_found - gelu_expected).abs() <= 2e-7 * (1.0 + f64::from(x).abs()), "gelu({x}): {gelu_found}");
        }
        assert_eq!(exp(0.0), 1.0);
        assert!(exp(-1000.0) < 2e-38 && exp(-1000.0) > 0.0);
        assert!(exp(f32::NAN).is_nan() && gelu(f32::NAN).is_nan());
    }

    #[test]
    fn row_sums_vectorize_without_changing_the_result() {
        let row = values(37, 1);
        let other = values(37, 2);
        let expected: f64 = row.iter().map(|&x| f64::from(x)).sum();
        assert!((f64::from(sum(&row)) - expected).abs() < 1e-5);
        let expected_dot: f64 = row.iter().zip(&other).map(|(&x, &y)| f64::from(x) * f64::from(y)).sum();
        assert!((f64::from(dot(&row, &other)) - expected_dot).abs() < 1e-5);
        assert_eq!(max(&row), row.iter().copied().fold(f32::NEG_INFINITY, f32::max));
        assert_eq!(max(&[]), f32::NEG_INFINITY);
    }

    #[test]
    fn blocks_cover_the_rows_evenly() {
        for threads in 1..=4 {
            for rows in 0..600 {
                let block = block_rows(rows, threads);
                assert!((1..=BLOCK_ROWS).contains(&block));
                let blocks = rows.div_ceil(block);
                assert!(
                    blocks <= 1 || block >= MIN_BLOCK_ROWS,
                    "{rows} rows on {threads} threads: {block} rows a block"
                );
                if rows >= threads * MIN_BLOCK_ROWS {
                    assert!(blocks >= threads, "{rows} rows on {threads} threads: {blocks} blocks");
                }
            }
        }
    }

    fn linear(input: usize, output: usize, seed: u64) -> Linear {
        Linear::builder(input, output).init(Init::Seeded(seed)).build()
    }

    fn norm(width: usize, seed: u64) -> LayerNorm {
        let mut norm = LayerNorm::builder(width).eps(1e-12).build();
        norm.weight = random(&[width], seed).add_scalar(1.0).unwrap();
        norm.bias = Some(random(&[width], seed + 1));
        norm
    }

    /// Each epilogue against the unfused kernels (`linear`, `gelu`, `add`, `layer_norm`), for
    /// row counts that make one block, several, and blocks with a remainder.
    #[test]
    fn epilogues_match_the_unfused_path() {
        let (input, output) = (48, 40);
        let layer = linear(input, output, 3);
        let fused = FusedLinear::new(&layer).unwrap();
        let layer_norm = norm(output, 5);
        let fused_norm = FusedLayerNorm::new(&layer_norm).unwrap();
        for rows in [1, 7, 33, 300] {
            let x = random(&[rows, input], 7);
            let residual = random(&[rows, output], 8);
            let xs = x.to_vec::<f32>().unwrap();
            let product = layer.forward(&x).unwrap();

            let mut out = vec![f32::NAN; rows * output];
            fused.forward_into(&xs, &mut out, Epilogue::Bias);
            assert_close(&out, &f64s(&product.to_vec::<f32>().unwrap()), 1e-5);

            fused.forward_into(&xs, &mut out, Epilogue::Gelu);
            assert_close(&out, &f64s(&product.gelu().unwrap().to_vec::<f32>().unwrap()), 1e-5);

            let mut out = residual.to_vec::<f32>().unwrap();
            fused.forward_into(&xs, &mut out, Epilogue::ResidualLayerNorm(&fused_norm));
            let expected =
                product.add(&residual).unwrap().layer_norm(Some(&layer_norm.weight), layer_norm.bias.as_ref(), 1e-12);
            assert_close(&out, &f64s(&expected.unwrap().to_vec::<f32>().unwrap()), 1e-4);
        }
    }

    #[test]
    fn concatenated_layers_give_each_layer_its_columns() {
        let (q, k, mut v) = (linear(24, 8, 1), linear(24, 8, 2), linear(24, 16, 3));
        v.bias = None;
        let fused = FusedLinear::concat(&[&q, &k, &v]).unwrap();
        assert_eq!((fused.in_features(), fused.out_features()), (24, 32));
        let x = random(&[70, 24], 4);
        let mut out = vec![0.0; 70 * 32];
        fused.forward_into(&x.to_vec::<f32>().unwrap(), &mut out, Epilogue::Bias);
        let mut columns = 0;
        for layer in [&q, &k, &v] {
            let expected = layer.forward(&x).unwrap().to_vec::<f32>().unwrap();
            let width = layer.out_features();
            let found: Vec<f32> = out.chunks(32).flat_map(|row| row[columns..columns + width].to_vec()).collect();
            assert_close(&found, &f64s(&expected), 1e-5);
            columns += width;
        }
        assert!(matches!(FusedLinear::concat(&[&q, &linear(12, 8, 5)]), Err(Error::ShapeMismatch { .. })));
        assert!(matches!(FusedLinear::concat(&[]), Err(Error::Concat { .. })));
    }

    #[test]
    fn layer_norm_in_place_matches_the_kernel() {
        let layer_norm = norm(96, 11);
        let fused = FusedLayerNorm::new(&layer_norm).unwrap();
        let x = random(&[700, 96], 12).scale(3.0).unwrap();
        let mut values = x.to_vec::<f32>().unwrap();
        fused.forward_in_place(&mut values);
        let expected = x.layer_norm(Some(&layer_norm.weight), layer_norm.bias.as_ref(), 1e-12).unwrap();
        assert_close(&values, &f64s(&expected.to_vec::<f32>().unwrap()), 1e-5);
    }

    /// Packed attention against the unfused kernel on a padded batch: each sequence's rows
    /// must equal the rows of its real tokens there, for short sequences (plain loops) and
    /// long ones (products, several query blocks).
    #[test]
    fn packed_attention_matches_padded_attention() {
        let (heads, head_dim) = (4, 8);
        let width = heads * head_dim;
        for lengths in [vec![5, 1, 12], vec![130, 49, 3, 70]] {
            let (batch, seq) = (lengths.len(), *lengths.iter().max().unwrap());
            let padded = random(&[batch, seq, 3 * width], 21);
            let values = padded.to_vec::<f32>().unwrap();
            let mask: Vec<bool> = lengths.iter().flat_map(|&length| (0..seq).map(move |at| at < length)).collect();
            let mut qkv = Vec::new();
            for (index, &length) in lengths.iter().enumerate() {
                qkv.extend_from_slice(&values[index * seq * 3 * width..][..length * 3 * width]);
            }
            let tokens: usize = lengths.iter().sum();
            let mut out = vec![f32::NAN; tokens * width];
            packed_attention(&qkv, &lengths, heads, &mut out);

            let part = |index: usize| {
                padded
                    .narrow(2, index * width, width)
                    .unwrap()
                    .reshape(&[batch, seq, heads, head_dim])
                    .unwrap()
                    .permute(&[0, 2, 1, 3])
                    .unwrap()
            };
            let context = Tensor::attention(&part(0), &part(1), &part(2), false, Some(&mask)).unwrap();
            let context = context.permute(&[0, 2, 1, 3]).unwrap().contiguous().to_vec::<f32>().unwrap();
            let mut expected = Vec::new();
            for (index, &length) in lengths.iter().enumerate() {
                expected.extend(f64s(&context[index * seq * width..][..length * width]));
            }
            assert_close(&out, &expected, 1e-5);
        }
    }

    /// The epilogue and attention compiled for each instruction set this CPU has agree with the
    /// build's own code (the dispatch picks only one of them).
    #[test]
    fn every_instruction_set_gives_the_same_rows() {
        let layer_norm = FusedLayerNorm::new(&norm(40, 31)).unwrap();
        let bias = values(40, 32);
        let input = values(40 * 9, 33).iter().map(|x| x * 4.0).collect::<Vec<f32>>();
        let (shape, sequence) =
            (HeadShape { width: 16, heads: 2, head_dim: 8 }, Sequence { start: 3, length: 60, first_query: 5 });
        let short = Sequence { start: 1, length: 20, first_query: 2 };
        let qkv = values(70 * 48, 34);
        type Finish = fn(&mut [f32], usize, Option<&[f32]>, Epilogue<'_>);
        type Attend = fn(&[f32], HeadShape, Sequence, &mut [f32], &mut Vec<f32>);
        // Only x86-64 adds variants to the portable one.
        #[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut))]
        let mut variants: Vec<(Finish, Attend)> = vec![(finish, attend)];
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
                variants.push((
                    // SAFETY: the CPU has AVX2 and FMA (checked above).
                    |rows, width, bias, epilogue| unsafe { finish_avx2(rows, width, bias, epilogue) },
                    // SAFETY: as for `finish_avx2`.
                    |qkv, shape, task, rows, scores| unsafe { attend_avx2(qkv, shape, task, rows, scores) },
                ));
            }
        }
        let run = |(finish, attend): (Finish, Attend)| {
            let mut rows = Vec::new();
            for epilogue in [Epilogue::Bias, Epilogue::Gelu, Epilogue::ResidualLayerNorm(&layer_norm)] {
                let mut block = input.clone();
                finish(&mut block, 40, Some(&bias), epilogue);
                rows.extend(block);
            }
            for task in [sequence, short] {
                let mut out = vec![0.0; 16 * 7];
                attend(&qkv, shape, task, &mut out, &mut Vec::new());
                rows.extend(out);
            }
            rows
        };
        let expected = f64s(&run((finish_generic, attend_generic)));
        for variant in variants {
            assert_close(&run(variant), &expected, 1e-6);
        }
    }

    #[test]
    fn attention_without_tokens_does_nothing() {
        packed_attention(&[], &[], 2, &mut []);
        packed_attention(&[], &[0, 0], 2, &mut []);
    }
}
