//! Products of a weight stored in ggml blocks with f32 activations, read straight from the
//! packed bytes: no dequantized copy of the weight is ever made, so a product reads the
//! weight's bytes once (4.5 bits a value for Q4_0 against 32 for f32).
//!
//! For Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, MXFP4, Q4_K, Q5_K and Q6_K the activations are first rounded to
//! 8 bits in blocks of 32 values, each block with an f32 scale `d = amax / 127` and the integer
//! sums of its two halves (the way ggml rounds them to Q8_0 / Q8_K, with a finer scale than
//! Q8_K's one per 256). Each weight block's 32 small integers then meet the activation block's
//! in an exact integer dot product, and only that sum is scaled by the two blocks' scales in
//! f32. Offsets and minimums (Q4_0's `q - 8`, the minimums of Q4_1 and Q4_K, Q6_K's `q - 32`)
//! are applied once per block through the activation sums instead of to every value.
//!
//! The error this brings is documented on [`matvec`].
//!
//! Every other type (F32, F16, BF16 and the remaining block types) is decoded one weight row at
//! a time with [`dequantize_row`](super::dequantize_row) into a scratch row and multiplied in
//! f32 with the unrounded activations.
//!
//! The integer kernels come in two builds with the same block arithmetic: a portable one, the
//! reference, and one for AVX2 with FMA and F16C chosen at run time. Outputs are computed for
//! up to [`TILE`] activation rows at a time, so that each weight block is unpacked once and
//! used for all of them; rows of the weight are split across rayon's threads.

#[cfg(target_arch = "x86_64")]
#[path = "dot_avx2.rs"]
mod avx2;
#[path = "dot_scalar.rs"]
mod scalar;

use rayon::prelude::*;

use super::{GgmlType, check_row};
use crate::error::{Error, Result};

/// Activation rows multiplied together with each weight row (the kernels keep this many sets
/// of sums in registers).
const TILE: usize = 4;

/// The most weight rows one parallel task computes.
const MAX_ROWS_PER_TASK: usize = 256;

/// Weight rows per parallel task of a product of `rows` rows of `ty`. The integer kernels'
/// rows are short (a few hundred bytes) and each task costs a steal, so they go in two long
/// runs per thread, which the processor also prefetches better. The float rows (F16: twice
/// the bytes a value, widened on the way) in eight per thread, so that threads finishing at
/// different speeds still end together: with two runs F16 decoded 6 % slower, with eight the
/// integer types 5-15 % slower (a Llama of 135M parameters, two threads).
fn rows_per_task(ty: GgmlType, rows: usize) -> usize {
    let runs = if has_kernel(ty) { 2 } else { 8 };
    let limit = if has_kernel(ty) { MAX_ROWS_PER_TASK } else { 16 };
    (rows / (rayon::current_num_threads() * runs)).clamp(1, limit)
}

/// Weight values below which a product runs on the calling thread: smaller products finish
/// before rayon would have handed out the work.
const SERIAL_VALUES: usize = 1 << 16;

/// `y = W x`: `y[r] = sum_c W[r, c] * x[c]` for the `rows x cols` weight `weight`, stored row
/// by row in blocks of `ty` (each row [`GgmlType::row_bytes`]`(cols)` bytes).
///
/// For Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, MXFP4, Q4_K, Q5_K and Q6_K, `x` is first rounded to 8 bits per
/// value in blocks of 32 (scale `amax / 127` per block, as ggml rounds activations to Q8_0),
/// and the blocks meet in exact integer dot products. Each rounded value is within half a step,
/// `amax / 254`, of its value, so an output is within `sum_b amax_b / 254 * sum_{i in b} |w_i|`
/// of the exact product, plus f32 rounding of the per-block sums (near `1e-6 * sum |w_i x_i|`
/// for rows of a few thousand values). The roundings are independent, so the typical error is
/// far below that bound: the root of `sum_b (amax_b / 440)^2 * sum_{i in b} w_i^2`, about 0.3%
/// of the outputs' magnitude for random weights. A NaN or infinity in `x` makes every output
/// NaN; a block of `x` whose largest magnitude is below 2^-121 counts as zeros. Other types
/// (F32, F16, BF16, the other block types) are decoded a row at a time and multiplied in f32
/// with `x` as given.
///
/// # Errors
/// [`Error::GgmlRow`] when `cols` is not a whole number of blocks or `weight` is not `rows`
/// rows of them; [`Error::LengthMismatch`] when `x` is not `cols` values or `y` not `rows`;
/// [`Error::GgmlUnsupported`] for a type that cannot be decoded.
///
/// # Examples
/// ```
/// use nnx_core::quant::ggml::{GgmlType, matvec};
///
/// // Two Q8_0 rows of 32 values: scale 0.5 (f16 0x3800), then the integers.
/// let mut weight = Vec::new();
/// for q in [1i8, -2] {
///     weight.extend_from_slice(&0x3800u16.to_le_bytes());
///     weight.extend(std::iter::repeat_n(q as u8, 32));
/// }
/// let mut y = [0.0; 2];
/// matvec(GgmlType::Q8_0, &weight, 2, 32, &[1.0; 32], &mut y)?;
/// assert_eq!(y, [16.0, -32.0]);
/// # Ok::<(), nnx_core::Error>(())
/// ```
pub fn matvec(ty: GgmlType, weight: &[u8], rows: usize, cols: usize, x: &[f32], y: &mut [f32]) -> Result<()> {
    Operands { ty, weight, rows, cols, x, m: 1 }.run("matvec", Isa::best(), y)
}

/// [`matvec`] of several weights with one input (a layer's q, k and v projections): `x` is
/// rounded once, and the rows of all the weights are shared out in one parallel pass, so that
/// the threads meet once rather than once per weight. `weights` holds each weight's type,
/// blocks and row count, and `ys` its output; every output equals [`matvec`]'s bit for bit.
///
/// # Errors
/// As [`matvec`], for the first weight whose operands do not fit.
///
/// # Examples
/// ```
/// use nnx_core::quant::ggml::{GgmlType, matvec_many};
///
/// // A Q8_0 row of 32 values with scale 0.5 (f16 0x3800) and the integers 1, then one of 2.
/// let row = |q: u8| [0x3800u16.to_le_bytes().to_vec(), vec![q; 32]].concat();
/// let (a, b) = (row(1), row(2));
/// let (mut ya, mut yb) = ([0.0], [0.0]);
/// let weights = [(GgmlType::Q8_0, &a[..], 1), (GgmlType::Q8_0, &b[..], 1)];
/// matvec_many(&weights, 32, &[1.0; 32], &mut [&mut ya[..], &mut yb[..]])?;
/// assert_eq!((ya, yb), ([16.0], [32.0]));
/// # Ok::<(), nnx_core::Error>(())
/// ```
pub fn matvec_many(weights: &[(GgmlType, &[u8], usize)], cols: usize, x: &[f32], ys: &mut [&mut [f32]]) -> Result<()> {
    if weights.len() != ys.len() {
        return Err(Error::LengthMismatch {
            op: "matvec_many",
            what: "outputs",
            expected: weights.len(),
            found: ys.len(),
            shape: vec![weights.len()],
        });
    }
    let mut row_bytes = Vec::with_capacity(weights.len());
    for (&(ty, weight, rows), y) in weights.iter().zip(ys.iter()) {
        row_bytes.push(Operands { ty, weight, rows, cols, x, m: 1 }.check("matvec_many", y.len())?);
    }
    let values: usize = weights.iter().map(|&(_, _, rows)| rows * cols).sum();
    if cols == 0 || !weights.iter().all(|&(ty, ..)| has_kernel(ty)) || values < SERIAL_VALUES {
        for (&(ty, weight, rows), y) in weights.iter().zip(ys.iter_mut()) {
            matvec(ty, weight, rows, cols, x, y)?;
        }
        return Ok(());
    }
    let isa = Isa::best();
    let acts = Activations::quantize(x, 1, cols);
    let act = acts.row(0);
    let total: usize = weights.iter().map(|&(_, _, rows)| rows).sum();
    // Every weight here has an integer kernel.
    let per_task = rows_per_task(weights[0].0, total);
    // Each task: a weight, its first row, and the outputs of its rows.
    let mut tasks = Vec::with_capacity(total / per_task + weights.len());
    for (index, y) in ys.iter_mut().enumerate() {
        for (chunk, out) in y.chunks_mut(per_task).enumerate() {
            tasks.push((index, chunk * per_task, out));
        }
    }
    tasks.into_par_iter().for_each(|(index, first, out)| {
        let (ty, weight, _) = weights[index];
        let bytes = row_bytes[index];
        rows_into(isa, ty, &weight[first * bytes..(first + out.len()) * bytes], act, out);
    });
    Ok(())
}

/// `y = x Wᵀ` for `m` activation rows (a prompt's tokens): `x` is `m x cols` and `y`
/// `m x rows`, both row-major, and `weight` as for [`matvec`].
///
/// Below 16 rows each activation row is rounded once, and every weight block is unpacked once
/// per tile of 4 activation rows while a few weight rows stay in cache for all the tiles; row
/// `i` of `y` then equals [`matvec`] of row `i` of `x`, bit for bit. From 16 rows on (a
/// prompt), the weight is decoded 256 rows at a time and multiplied in f32 by the matrix
/// kernels, without rounding the activations: the decoding is shared by every row, and the
/// matrix kernels' register tiles do several times the work per loaded value.
///
/// # Errors
/// As [`matvec`], with `x` of `m * cols` values and `y` of `m * rows`.
pub fn matmul(ty: GgmlType, weight: &[u8], rows: usize, cols: usize, x: &[f32], m: usize, y: &mut [f32]) -> Result<()> {
    let operands = Operands { ty, weight, rows, cols, x, m };
    if m >= GEMM_ROWS && rows > 0 && cols > 0 {
        return operands.panels("matmul", y);
    }
    operands.run("matmul", Isa::best(), y)
}

/// Activation rows from which a product decodes the weight, panel by panel, and multiplies in
/// f32 with the matrix kernels: the decoding is shared by all the rows, and a matrix product
/// keeps far more sums in registers than the row kernels' tiles of four (a prompt's prefill).
const GEMM_ROWS: usize = 16;

/// The most weight rows one task decodes and multiplies for [`GEMM_ROWS`] and more activation
/// rows: small enough to stay in cache beside the activations.
const PANEL_ROWS: usize = 128;

/// The fewest: below this the matrix kernels' register tiles go partly unused.
const MIN_PANEL_ROWS: usize = 32;

/// Weight rows per task for a product of `rows` on `threads` threads: about four tasks per
/// thread, so that the threads finish together, in multiples of 16 rows.
fn panel_rows(rows: usize, threads: usize) -> usize {
    (rows / (4 * threads.max(1))).next_multiple_of(16).clamp(MIN_PANEL_ROWS, PANEL_ROWS)
}

/// The instructions the integer kernels run on.
#[derive(Clone, Copy, Debug)]
enum Isa {
    /// The portable kernels.
    Scalar,
    /// AVX2, FMA and F16C, detected.
    #[cfg(target_arch = "x86_64")]
    Avx2(avx2::Avx2),
}

impl Isa {
    /// The fastest the processor has.
    fn best() -> Isa {
        #[cfg(target_arch = "x86_64")]
        if let Some(avx2) = avx2::Avx2::detect() {
            return Isa::Avx2(avx2);
        }
        Isa::Scalar
    }
}

/// Whether `ty` has integer kernels.
fn has_kernel(ty: GgmlType) -> bool {
    use GgmlType::*;
    matches!(ty, Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | MXFP4 | Q4_K | Q5_K | Q6_K)
}

/// One activation row rounded to 8 bits: per block of 32 values the integers, the scale, the
/// sums of the two halves of 16 (Q6_K's groups) and the scale times the block's sum (what a
/// weight's offset or minimum multiplies).
#[derive(Clone, Copy)]
struct Act<'a> {
    q: &'a [[i8; 32]],
    d: &'a [f32],
    sums: &'a [[i16; 2]],
    ds: &'a [f32],
}

/// Activation rows rounded to 8 bits, all rows' blocks end to end.
struct Activations {
    blocks: usize,
    q: Vec<[i8; 32]>,
    d: Vec<f32>,
    sums: Vec<[i16; 2]>,
    ds: Vec<f32>,
}

impl Activations {
    /// Rounds the `m` rows of `cols` values (a multiple of 32) in `x`.
    fn quantize(x: &[f32], m: usize, cols: usize) -> Activations {
        let count = m * cols / 32;
        let mut q = vec![[0i8; 32]; count];
        let mut d = vec![0f32; count];
        let mut sums = vec![[0i16; 2]; count];
        let (values, _) = x.as_chunks::<32>();
        if x.len() >= SERIAL_VALUES {
            let slots = q.par_iter_mut().zip(d.par_iter_mut().zip(sums.par_iter_mut()));
            values.par_iter().zip(slots).for_each(|(x, (q, (d, sums)))| (*q, *d, *sums) = quantize_block(x));
        } else {
            let slots = q.iter_mut().zip(d.iter_mut().zip(&mut sums));
            values.iter().zip(slots).for_each(|(x, (q, (d, sums)))| (*q, *d, *sums) = quantize_block(x));
        }
        let ds = d.iter().zip(&sums).map(|(&d, &[a, b])| d * f32::from(a + b)).collect();
        Activations { blocks: cols / 32, q, d, sums, ds }
    }

    /// Row `i`.
    fn row(&self, i: usize) -> Act<'_> {
        let range = i * self.blocks..(i + 1) * self.blocks;
        Act {
            q: &self.q[range.clone()],
            d: &self.d[range.clone()],
            sums: &self.sums[range.clone()],
            ds: &self.ds[range],
        }
    }
}

/// One block of 32 activations rounded to the nearest multiple of `amax / 127`: the integers,
/// that scale, and the sums of the two halves.
fn quantize_block(x: &[f32; 32]) -> ([i8; 32], f32, [i16; 2]) {
    if x.iter().any(|v| !v.is_finite()) {
        return ([0; 32], f32::NAN, [0; 2]);
    }
    let amax = x.iter().fold(0f32, |max, v| max.max(v.abs()));
    let inverse = 127.0 / amax;
    if !inverse.is_finite() {
        return ([0; 32], 0.0, [0; 2]);
    }
    // Adding 1.5 * 2^23 leaves the integer nearest to a value of magnitude at most 2^22 in the
    // low mantissa bits (ties to even): a rounding that vectorises, unlike `f32::round`.
    let q: [i8; 32] = std::array::from_fn(|i| ((x[i] * inverse + 12_582_912.0).to_bits() as i32 - 0x4b40_0000) as i8);
    let sum = |range: std::ops::Range<usize>| q[range].iter().map(|&v| i16::from(v)).sum::<i16>();
    (q, amax / 127.0, [sum(0..16), sum(16..32)])
}

/// The f16 stored little-endian at `at`.
#[inline(always)]
fn f16_at(bytes: &[u8], at: usize) -> f32 {
    half::f16::from_le_bytes([bytes[at], bytes[at + 1]]).to_f32()
}

/// The 6-bit scales and minimums of a Q4_K or Q5_K block's 8 sub-blocks, from their 12 bytes:
/// sub-blocks 0-3 keep theirs in the low 6 bits of bytes 0-3 (scales) and 4-7 (minimums);
/// sub-blocks 4-7 have their low 4 bits in the nibbles of bytes 8-11 and their top 2 bits in
/// the top bits of bytes 0-7. Each word below holds four sub-blocks, one per byte.
#[inline(always)]
fn scales_mins(packed: &[u8; 12]) -> ([u8; 8], [u8; 8]) {
    let word = |i: usize| u32::from_le_bytes([packed[4 * i], packed[4 * i + 1], packed[4 * i + 2], packed[4 * i + 3]]);
    let (a, b, c) = (word(0), word(1), word(2));
    let low6 = 0x3f3f_3f3f;
    let low4 = 0x0f0f_0f0f;
    let top2 = 0x0303_0303;
    let scales = [a & low6, (c & low4) | (((a >> 6) & top2) << 4)];
    let mins = [b & low6, ((c >> 4) & low4) | (((b >> 6) & top2) << 4)];
    let bytes = |pair: [u32; 2]| {
        let mut out = [0u8; 8];
        out[..4].copy_from_slice(&pair[0].to_le_bytes());
        out[4..].copy_from_slice(&pair[1].to_le_bytes());
        out
    };
    (bytes(scales), bytes(mins))
}

/// The outputs of one weight row for `N` activation rows.
fn tile<const N: usize>(isa: Isa, ty: GgmlType, weight: &[u8], acts: &[Act<'_>; N]) -> [f32; N] {
    match isa {
        Isa::Scalar => scalar::tile(ty, weight, acts),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2(avx2) => avx2.tile(ty, weight, acts),
    }
}

/// [`tile`] for 1 to [`TILE`] activation rows, into `out`.
fn tile_into(isa: Isa, ty: GgmlType, weight: &[u8], acts: &[Act<'_>], out: &mut [f32]) {
    match *acts {
        [a] => out.copy_from_slice(&tile(isa, ty, weight, &[a])),
        [a, b] => out.copy_from_slice(&tile(isa, ty, weight, &[a, b])),
        [a, b, c] => out.copy_from_slice(&tile(isa, ty, weight, &[a, b, c])),
        [a, b, c, d] => out.copy_from_slice(&tile(isa, ty, weight, &[a, b, c, d])),
        _ => unreachable!("tiles hold 1 to {TILE} rows"),
    }
}

/// The outputs of consecutive weight rows (`weight` holds `out.len()` of them) for one
/// activation row: the type is dispatched once and the rows run in one vector function.
fn rows_into(isa: Isa, ty: GgmlType, weight: &[u8], act: Act<'_>, out: &mut [f32]) {
    match isa {
        Isa::Scalar => {
            let row_bytes = weight.len() / out.len().max(1);
            for (row, out) in weight.chunks_exact(row_bytes.max(1)).zip(out) {
                *out = scalar::tile(ty, row, &[act])[0];
            }
        }
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2(avx2) => avx2.rows(ty, weight, act, out),
    }
}

/// The operands of a product other than its output.
struct Operands<'a> {
    ty: GgmlType,
    weight: &'a [u8],
    rows: usize,
    cols: usize,
    x: &'a [f32],
    m: usize,
}

impl Operands<'_> {
    /// Checks the lengths of the operands and of an output of `y` values; returns the bytes of
    /// a weight row.
    fn check(&self, op: &'static str, y: usize) -> Result<usize> {
        let Operands { ty, weight, rows, cols, x, m } = *self;
        let (Some(row_bytes), Some(values)) = (ty.row_bytes(cols), rows.checked_mul(cols)) else {
            return Err(Error::GgmlRow {
                op,
                ty: ty.name(),
                block_size: ty.block_size(),
                values: cols,
                bytes: weight.len(),
            });
        };
        check_row(op, ty, weight.len(), values)?;
        let mismatch = |what, expected: Option<usize>, found, width| match expected {
            Some(expected) if expected == found => Ok(()),
            _ => Err(Error::LengthMismatch {
                op,
                what,
                expected: expected.unwrap_or(usize::MAX),
                found,
                shape: vec![m, width],
            }),
        };
        mismatch("input values", m.checked_mul(cols), x.len(), cols)?;
        mismatch("output values", m.checked_mul(rows), y, rows)?;
        Ok(row_bytes)
    }

    /// The product into `y` through f32, in one parallel pass: each task decodes a panel of
    /// weight rows (at most [`PANEL_ROWS`]) into its thread's scratch and multiplies every
    /// activation row with it on that thread, writing its block of `y`'s columns in place.
    /// Exact up to f32 rounding: activations are not rounded to 8 bits here.
    fn panels(&self, op: &'static str, y: &mut [f32]) -> Result<()> {
        use crate::kernels::matmul::{Matrix, product_strided};

        /// `y`, shared by tasks that write disjoint blocks of its columns.
        #[derive(Clone, Copy)]
        struct Output(*mut f32);
        impl Output {
            /// Column `column` of `y`'s first row (a method, so that closures take the
            /// whole `Output` rather than its pointer).
            fn column(self, column: usize) -> *mut f32 {
                self.0.wrapping_add(column)
            }
        }
        // SAFETY: the tasks write disjoint columns of `y`, which outlives the parallel pass.
        unsafe impl Send for Output {}
        // SAFETY: as for `Send`: no two tasks touch the same element.
        unsafe impl Sync for Output {}

        thread_local! {
            static DECODED: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
        }

        let row_bytes = self.check(op, y.len())?;
        let Operands { ty, weight, rows, cols, x, m } = *self;
        let panel = panel_rows(rows, rayon::current_num_threads());
        let output = Output(y.as_mut_ptr());
        weight.par_chunks(panel * row_bytes).enumerate().try_for_each(|(index, bytes)| {
            let (first, count) = (index * panel, bytes.len() / row_bytes);
            DECODED.with_borrow_mut(|decoded| -> Result<()> {
                decoded.resize(count * cols, 0.0);
                for (out, row) in decoded.chunks_exact_mut(cols).zip(bytes.chunks_exact(row_bytes)) {
                    super::dequantize_row(ty, row, out)?;
                }
                let lhs = Matrix { data: x, start: 0, row_stride: cols, column_stride: 1 };
                // The panel's transpose: `cols x count`, read down its rows.
                let rhs = Matrix { data: decoded, start: 0, row_stride: 1, column_stride: cols };
                // SAFETY: `x` is `m x cols` and the panel `count x cols` (checked lengths), so
                // both operands lie in their slices; this task alone writes columns `first..first
                // + count` of the `m x rows` output `y`, which is borrowed for the whole pass.
                unsafe {
                    product_strided(lhs, rhs, m, cols, count, output.column(first), rows, gemm::Parallelism::None);
                }
                Ok(())
            })
        })
    }

    /// The product into `y`, on the given instructions.
    fn run(&self, op: &'static str, isa: Isa, y: &mut [f32]) -> Result<()> {
        let row_bytes = self.check(op, y.len())?;
        let Operands { ty, weight, rows, cols, x, m } = *self;
        if y.is_empty() {
            return Ok(());
        }
        if cols == 0 {
            y.fill(0.0);
            return Ok(());
        }
        // Tasks take whole weight rows and write `rows x m` outputs (weight row by weight row),
        // which for one activation row is `y` itself.
        let mut transposed = Vec::new();
        let out: &mut [f32] = if m == 1 {
            &mut *y
        } else {
            transposed = vec![0f32; rows * m];
            &mut transposed
        };
        let per_task = rows_per_task(ty, rows);
        let parallel = rows.saturating_mul(cols) >= SERIAL_VALUES && rows > per_task;
        if has_kernel(ty) {
            let acts = Activations::quantize(x, m, cols);
            let acts: Vec<Act<'_>> = (0..m).map(|i| acts.row(i)).collect();
            let task = |(index, out): (usize, &mut [f32])| {
                let first = index * per_task;
                let count = out.len() / m;
                if let [act] = acts[..] {
                    let rows = &weight[first * row_bytes..(first + count) * row_bytes];
                    return rows_into(isa, ty, rows, act, out);
                }
                // Activation tiles outside, weight rows inside: the task's weight rows stay in
                // cache while each tile of activations passes over them.
                for (start, acts) in acts.chunks(TILE).enumerate() {
                    let start = start * TILE;
                    let mut sums = [0f32; TILE];
                    for j in 0..count {
                        let row = &weight[(first + j) * row_bytes..(first + j + 1) * row_bytes];
                        tile_into(isa, ty, row, acts, &mut sums[..acts.len()]);
                        out[j * m + start..j * m + start + acts.len()].copy_from_slice(&sums[..acts.len()]);
                    }
                }
            };
            if parallel {
                out.par_chunks_mut(per_task * m).enumerate().for_each(task);
            } else {
                out.chunks_mut(per_task * m).enumerate().for_each(task);
            }
        } else {
            let task = |(index, out): (usize, &mut [f32])| -> Result<()> {
                let first = index * per_task;
                #[cfg(target_arch = "x86_64")]
                if let (Isa::Avx2(avx2), 1) = (isa, m)
                    && matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16)
                {
                    let rows = &weight[first * row_bytes..(first + out.len()) * row_bytes];
                    avx2.float_rows(ty, rows, x, out);
                    return Ok(());
                }
                let mut decoded = vec![0f32; cols];
                for (j, out) in out.chunks_exact_mut(m).enumerate() {
                    super::dequantize_row(
                        ty,
                        &weight[(first + j) * row_bytes..(first + j + 1) * row_bytes],
                        &mut decoded,
                    )?;
                    for (value, x) in out.iter_mut().zip(x.chunks_exact(cols)) {
                        *value = dot_f32(&decoded, x);
                    }
                }
                Ok(())
            };
            if parallel {
                out.par_chunks_mut(per_task * m).enumerate().try_for_each(task)?;
            } else {
                out.chunks_mut(per_task * m).enumerate().try_for_each(task)?;
            }
        }
        if m > 1 {
            let scatter = |(i, y): (usize, &mut [f32])| {
                for (r, value) in y.iter_mut().enumerate() {
                    *value = transposed[r * m + i];
                }
            };
            if parallel {
                y.par_chunks_mut(rows).enumerate().for_each(scatter);
            } else {
                y.chunks_mut(rows).enumerate().for_each(scatter);
            }
        }
        Ok(())
    }
}

/// The dot product of two f32 rows of equal length, in 16 independent sums (which the compiler
/// keeps in vector registers).
fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0f32; 16];
    let (a_chunks, a_tail) = a.as_chunks::<16>();
    let (b_chunks, b_tail) = b.as_chunks::<16>();
    for (a, b) in a_chunks.iter().zip(b_chunks) {
        for lane in 0..16 {
            lanes[lane] += a[lane] * b[lane];
        }
    }
    let tail: f32 = a_tail.iter().zip(b_tail).map(|(a, b)| a * b).sum();
    lanes.iter().sum::<f32>() + tail
}

#[cfg(test)]
mod tests {
    use half::f16;

    use super::*;

    /// The types with integer kernels.
    const KERNEL_TYPES: [GgmlType; 9] = [
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::MXFP4,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
    ];

    /// Relative f32 rounding allowed against the magnitude of the terms a kernel adds: each
    /// block's term is a product of three or four rounded f32 factors (`2^-24` each), and the
    /// running sums over the 24-48 blocks of a test row add one rounding per block, so about
    /// `50 * 6e-8 = 3e-6`; the tolerance leaves three times that.
    const ROUNDING: f64 = 1e-5;

    /// A xorshift generator: the tests need no statistical quality, only repeatable values.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }

        /// Uniform in `[-1, 1)`.
        fn unit(&mut self) -> f32 {
            (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        }

        fn byte(&mut self) -> u8 {
            (self.next() >> 32) as u8
        }
    }

    /// The portable kernels, then the vector ones where the processor has them, at every
    /// level it has (AVX2 alone, with AVX-VNNI, with AVX-512 masks).
    fn isas() -> Vec<Isa> {
        #[cfg(target_arch = "x86_64")]
        if let Some(avx2) = avx2::Avx2::detect() {
            return std::iter::once(Isa::Scalar).chain(avx2.levels().into_iter().map(Isa::Avx2)).collect();
        }
        vec![Isa::Scalar]
    }

    /// Byte offsets of a block's f16 fields.
    fn half_fields(ty: GgmlType) -> &'static [usize] {
        match ty {
            GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => &[0],
            GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
            GgmlType::Q6_K => &[208],
            GgmlType::MXFP4 => &[],
            _ => unreachable!(),
        }
    }

    /// `rows` rows of `cols` values of `ty`: random bytes in every integer field (any bytes
    /// are valid blocks) and finite f16 scales of either sign.
    fn weight(ty: GgmlType, rows: usize, cols: usize, rng: &mut Rng) -> Vec<u8> {
        let mut bytes: Vec<u8> = (0..rows * ty.row_bytes(cols).unwrap()).map(|_| rng.byte()).collect();
        for block in bytes.chunks_exact_mut(ty.type_size()) {
            for &at in half_fields(ty) {
                block[at..at + 2].copy_from_slice(&f16::from_f32(rng.unit() * 0.05).to_le_bytes());
            }
            if ty == GgmlType::MXFP4 {
                // Exponents from 2^-10 to 2^-4, as published weights have.
                block[0] = 117 + rng.byte() % 7;
            }
        }
        bytes
    }

    /// Activations with block magnitudes from 0.01 to 100.
    fn activations(count: usize, rng: &mut Rng) -> Vec<f32> {
        let mut x: Vec<f32> = (0..count).map(|_| rng.unit()).collect();
        for block in x.chunks_mut(32) {
            let scale = 10f32.powi((rng.next() % 5) as i32 - 2);
            block.iter_mut().for_each(|v| *v *= scale);
        }
        x
    }

    fn f16_at(bytes: &[u8], at: usize) -> f64 {
        f64::from(f16::from_le_bytes([bytes[at], bytes[at + 1]]).to_f32())
    }

    /// The 6-bit scale and minimum of sub-block `j` of a Q4_K / Q5_K block.
    fn scale_min(s: &[u8], j: usize) -> (f64, f64) {
        let (sc, m) = if j < 4 {
            (s[j] & 63, s[j + 4] & 63)
        } else {
            ((s[j + 4] & 0xf) | ((s[j - 4] >> 6) << 4), (s[j + 4] >> 4) | ((s[j] >> 6) << 4))
        };
        (f64::from(sc), f64::from(m))
    }

    /// A block's values, decoded from the layouts ggml documents, each with the magnitude of
    /// the terms a kernel computes for it separately (`|d q| + |m|` where a minimum or an
    /// offset is applied through the activation sums).
    fn decode(ty: GgmlType, block: &[u8]) -> Vec<(f64, f64)> {
        let mut out = Vec::new();
        match ty {
            GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q5_1 => {
                let d = f16_at(block, 0);
                let m = if matches!(ty, GgmlType::Q4_1 | GgmlType::Q5_1) { f16_at(block, 2) } else { 0.0 };
                let (high, qs): (u32, &[u8]) = match ty {
                    GgmlType::Q4_0 => (0, &block[2..]),
                    GgmlType::Q4_1 => (0, &block[4..]),
                    GgmlType::Q5_0 => (u32::from_le_bytes(block[2..6].try_into().unwrap()), &block[6..]),
                    _ => (u32::from_le_bytes(block[4..8].try_into().unwrap()), &block[8..]),
                };
                let offset = match ty {
                    GgmlType::Q4_0 => 8.0,
                    GgmlType::Q5_0 => 16.0,
                    _ => 0.0,
                };
                for i in 0..32 {
                    let nibble = if i < 16 { qs[i] & 0xf } else { qs[i - 16] >> 4 };
                    let q = f64::from(nibble) + f64::from((high >> i) & 1) * 16.0;
                    out.push((d * (q - offset) + m, (d * q).abs() + (d * offset).abs() + m.abs()));
                }
            }
            GgmlType::Q8_0 => {
                let d = f16_at(block, 0);
                out.extend(block[2..].iter().map(|&q| (d * f64::from(q as i8), (d * f64::from(q as i8)).abs())));
            }
            GgmlType::MXFP4 => {
                // OCP microscaling: 2^(e - 127) times the E2M1 value of each code (sign bit 3).
                const E2M1: [f64; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
                let d = 2f64.powi(i32::from(block[0]) - 127);
                for i in 0..32 {
                    let code = if i < 16 { block[1 + i] & 0xf } else { block[1 + i - 16] >> 4 };
                    let value = d * E2M1[usize::from(code & 7)] * if code & 8 != 0 { -1.0 } else { 1.0 };
                    out.push((value, value.abs()));
                }
            }
            GgmlType::Q4_K | GgmlType::Q5_K => {
                let (d, dmin) = (f16_at(block, 0), f16_at(block, 2));
                let scales = &block[4..16];
                let (qh, qs) =
                    if ty == GgmlType::Q5_K { (&block[16..48], &block[48..]) } else { (&[0u8; 32][..], &block[16..]) };
                for c in 0..4 {
                    for half in 0..2 {
                        let (sc, m) = scale_min(scales, 2 * c + half);
                        for l in 0..32 {
                            let byte = qs[32 * c + l];
                            let nibble = if half == 0 { byte & 0xf } else { byte >> 4 };
                            let fifth = if qh[l] & (1 << (2 * c + half)) != 0 { 16.0 } else { 0.0 };
                            let q = f64::from(nibble) + fifth;
                            out.push((d * sc * q - dmin * m, (d * sc * q).abs() + (dmin * m).abs()));
                        }
                    }
                }
            }
            GgmlType::Q6_K => {
                let d = f16_at(block, 208);
                let mut values = [(0.0, 0.0); 256];
                for h in 0..2 {
                    let (ql, qh, sc) = (&block[64 * h..], &block[128 + 32 * h..], &block[192 + 8 * h..]);
                    for l in 0..32 {
                        let q = [
                            (ql[l] & 0xf) | ((qh[l] & 3) << 4),
                            (ql[l + 32] & 0xf) | (((qh[l] >> 2) & 3) << 4),
                            (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4),
                            (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4),
                        ];
                        for (k, &q) in q.iter().enumerate() {
                            let scale = d * f64::from(sc[l / 16 + 2 * k] as i8);
                            let q = f64::from(q);
                            values[128 * h + 32 * k + l] =
                                (scale * (q - 32.0), (scale * q).abs() + (scale * 32.0).abs());
                        }
                    }
                }
                out.extend(values);
            }
            _ => unreachable!(),
        }
        out
    }

    /// The decoded weight, `rows x cols` (value, magnitude) pairs.
    fn decode_weight(ty: GgmlType, weight: &[u8]) -> Vec<(f64, f64)> {
        weight.chunks_exact(ty.type_size()).flat_map(|block| decode(ty, block)).collect()
    }

    /// The activations as the kernels see them: `q * d` per value.
    fn rounded(x: &[f32], m: usize, cols: usize) -> Vec<f64> {
        let acts = Activations::quantize(x, m, cols);
        acts.q.iter().zip(&acts.d).flat_map(|(q, &d)| q.map(|q| f64::from(q) * f64::from(d))).collect()
    }

    /// `(sum w x, sum mag |x|)` of one weight row and one activation row.
    fn reference(w: &[(f64, f64)], x: &[f64]) -> (f64, f64) {
        w.iter().zip(x).fold((0.0, 0.0), |(sum, size), (&(w, mag), &x)| (sum + w * x, size + mag * x.abs()))
    }

    fn run(isa: Isa, ty: GgmlType, weight: &[u8], rows: usize, cols: usize, x: &[f32], m: usize) -> Vec<f32> {
        let mut y = vec![f32::NAN; m * rows];
        Operands { ty, weight, rows, cols, x, m }.run("matmul", isa, &mut y).unwrap();
        y
    }

    #[test]
    fn kernels_compute_the_product_with_the_rounded_activations() {
        let mut rng = Rng(0x1234_5678_9abc_def1);
        for ty in KERNEL_TYPES {
            // Rows of 32-value types that end in fewer than 8 blocks too (3 and 2).
            let tails: &[usize] = if ty.block_size() == 32 { &[96, 576] } else { &[] };
            for cols in [256, 768].into_iter().chain(tails.iter().copied()) {
                let rows = 37;
                let weight = weight(ty, rows, cols, &mut rng);
                let decoded = decode_weight(ty, &weight);
                let x = activations(3 * cols, &mut rng);
                let xq = rounded(&x, 3, cols);
                for isa in isas() {
                    let y = run(isa, ty, &weight, rows, cols, &x, 3);
                    for i in 0..3 {
                        for r in 0..rows {
                            let (expected, size) =
                                reference(&decoded[r * cols..(r + 1) * cols], &xq[i * cols..(i + 1) * cols]);
                            let found = f64::from(y[i * rows + r]);
                            assert!(
                                (found - expected).abs() <= ROUNDING * size,
                                "{ty} {isa:?} cols {cols} row {i}, {r}: {found} against {expected} (terms {size})"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn products_stay_within_the_activation_rounding_bound() {
        let mut rng = Rng(0x0f0f_1234_4321_f0f0);
        for ty in KERNEL_TYPES {
            let (rows, cols) = (29, 512);
            let weight = weight(ty, rows, cols, &mut rng);
            let decoded = decode_weight(ty, &weight);
            let x = activations(cols, &mut rng);
            let exact: Vec<f64> = x.iter().map(|&v| f64::from(v)).collect();
            let mut y = vec![0.0; rows];
            matvec(ty, &weight, rows, cols, &x, &mut y).unwrap();
            let (mut error_squares, mut value_squares) = (0.0, 0.0);
            for (r, &found) in y.iter().enumerate() {
                let w = &decoded[r * cols..(r + 1) * cols];
                let (expected, size) = reference(w, &exact);
                // Each rounded activation is within half a step, `amax / 254`, of its value
                // (with slack for the f32 reciprocal used to round).
                let bound: f64 = w
                    .chunks(32)
                    .zip(x.chunks(32))
                    .map(|(w, x)| {
                        let amax = x.iter().fold(0f32, |max, v| max.max(v.abs()));
                        f64::from(amax) / 254.0 * (1.0 + 1e-4) * w.iter().map(|(w, _)| w.abs()).sum::<f64>()
                    })
                    .sum();
                let error = (f64::from(found) - expected).abs();
                assert!(error <= bound + ROUNDING * size, "{ty} row {r}: {found} against {expected}, bound {bound}");
                error_squares += error * error;
                value_squares += expected * expected;
            }
            // The errors of independent roundings mostly cancel: well under 1% of the outputs.
            assert!(
                (error_squares / value_squares).sqrt() < 0.01,
                "{ty}: relative error {}",
                (error_squares / value_squares).sqrt()
            );
        }
    }

    #[test]
    fn vector_and_portable_kernels_agree() {
        let isas = isas();
        if isas.len() < 2 {
            return;
        }
        let mut rng = Rng(0xdead_beef_0bad_cafe);
        for ty in KERNEL_TYPES {
            let (rows, cols, m) = (23, 1024, 5);
            let weight = weight(ty, rows, cols, &mut rng);
            let decoded = decode_weight(ty, &weight);
            let x = activations(m * cols, &mut rng);
            let xq = rounded(&x, m, cols);
            let portable = run(isas[0], ty, &weight, rows, cols, &x, m);
            let vector = run(isas[1], ty, &weight, rows, cols, &x, m);
            for i in 0..m {
                for r in 0..rows {
                    let (_, size) = reference(&decoded[r * cols..(r + 1) * cols], &xq[i * cols..(i + 1) * cols]);
                    let (a, b) = (portable[i * rows + r], vector[i * rows + r]);
                    assert!(f64::from(a - b).abs() <= 2.0 * ROUNDING * size, "{ty} {i}, {r}: {a} against {b}");
                }
            }
        }
    }

    #[test]
    fn products_sharing_an_input_are_each_matvec_bit_for_bit() {
        let mut rng = Rng(0x0f0f_1234_5678_9abc);
        let cols = 512;
        // Enough rows in all to run in parallel, of three types, one of them without kernels.
        let shapes = [(GgmlType::Q8_0, 150), (GgmlType::Q4_K, 37), (GgmlType::Q5_0, 64)];
        let weights: Vec<Vec<u8>> = shapes.iter().map(|&(ty, rows)| weight(ty, rows, cols, &mut rng)).collect();
        let x = activations(cols, &mut rng);
        let mut ys: Vec<Vec<f32>> = shapes.iter().map(|&(_, rows)| vec![0.0; rows]).collect();
        let operands: Vec<(GgmlType, &[u8], usize)> =
            shapes.iter().zip(&weights).map(|(&(ty, rows), weight)| (ty, weight.as_slice(), rows)).collect();
        let mut outputs: Vec<&mut [f32]> = ys.iter_mut().map(Vec::as_mut_slice).collect();
        matvec_many(&operands, cols, &x, &mut outputs).unwrap();
        for (&(ty, weight, rows), y) in operands.iter().zip(&ys) {
            let mut alone = vec![0.0; rows];
            matvec(ty, weight, rows, cols, &x, &mut alone).unwrap();
            assert_eq!(y, &alone, "{ty}");
        }
        // A type without kernels among them: each runs alone, with the same results.
        let f16: Vec<u8> = (0..8 * cols).flat_map(|i| f16::from_f32((i % 7) as f32 / 7.0).to_le_bytes()).collect();
        let mut mixed = [vec![0.0; 150], vec![0.0; 8]];
        let [first, second] = &mut mixed;
        matvec_many(&[operands[0], (GgmlType::F16, &f16, 8)], cols, &x, &mut [first, second]).unwrap();
        assert_eq!(mixed[0], ys[0]);
        // An output of the wrong length is named, and so is a missing one.
        let mut short = vec![0.0; 149];
        let error = matvec_many(&operands[..1], cols, &x, &mut [&mut short[..]]).unwrap_err();
        assert!(matches!(error, Error::LengthMismatch { what: "output values", expected: 150, found: 149, .. }));
        let error = matvec_many(&operands, cols, &x, &mut []).unwrap_err();
        assert!(matches!(error, Error::LengthMismatch { what: "outputs", expected: 3, found: 0, .. }));
    }

    #[test]
    fn matmul_rows_are_matvec_bit_for_bit() {
        let mut rng = Rng(0x5555_aaaa_3333_cccc);
        for ty in KERNEL_TYPES {
            let (rows, cols) = (41, 512);
            let weight = weight(ty, rows, cols, &mut rng);
            for m in [1, 3, 17] {
                let x = activations(m * cols, &mut rng);
                for isa in isas() {
                    let batched = run(isa, ty, &weight, rows, cols, &x, m);
                    for (i, x) in x.chunks(cols).enumerate() {
                        let single = run(isa, ty, &weight, rows, cols, x, 1);
                        assert_eq!(&batched[i * rows..(i + 1) * rows], &single[..], "{ty} {isa:?} m {m} row {i}");
                    }
                }
            }
        }
    }

    #[test]
    fn prompts_multiply_decoded_panels_exactly() {
        let mut rng = Rng(0x2468_ace0_1357_9bdf);
        for ty in KERNEL_TYPES {
            // More rows than one panel, and a panel left over.
            let (rows, cols, m) = (PANEL_ROWS + 44, 256, GEMM_ROWS + 3);
            let weight = weight(ty, rows, cols, &mut rng);
            let decoded = decode_weight(ty, &weight);
            let x = activations(m * cols, &mut rng);
            let mut y = vec![f32::NAN; m * rows];
            matmul(ty, &weight, rows, cols, &x, m, &mut y).unwrap();
            let exact: Vec<f64> = x.iter().map(|&v| f64::from(v)).collect();
            for i in 0..m {
                for r in 0..rows {
                    let (expected, size) =
                        reference(&decoded[r * cols..(r + 1) * cols], &exact[i * cols..(i + 1) * cols]);
                    let found = f64::from(y[i * rows + r]);
                    assert!((found - expected).abs() <= ROUNDING * size, "{ty} {i}, {r}: {found} against {expected}");
                }
            }
        }
    }

    #[test]
    fn large_products_split_across_threads_the_same() {
        let mut rng = Rng(0x7777_1111_2222_8888);
        let (ty, rows, cols, m) = (GgmlType::Q4_K, 300, 2048, 6);
        let weight = weight(ty, rows, cols, &mut rng);
        let x = activations(m * cols, &mut rng);
        let mut y = vec![0.0; m * rows];
        matmul(ty, &weight, rows, cols, &x, m, &mut y).unwrap();
        let decoded = decode_weight(ty, &weight);
        let xq = rounded(&x, m, cols);
        for i in 0..m {
            for r in 0..rows {
                let (expected, size) = reference(&decoded[r * cols..(r + 1) * cols], &xq[i * cols..(i + 1) * cols]);
                assert!((f64::from(y[i * rows + r]) - expected).abs() <= 2.0 * ROUNDING * size);
            }
        }
    }

    #[test]
    fn other_types_decode_each_row() {
        let mut rng = Rng(0x0123_4567_89ab_cdef);
        // 100 values: three steps of the vector kernels' 32 and a tail of 4.
        let (rows, cols) = (9, 100);
        let values: Vec<f32> = (0..rows * cols).map(|_| rng.unit()).collect();
        let x = activations(2 * cols, &mut rng);
        let encodings: [(GgmlType, Vec<u8>); 3] = [
            (GgmlType::F32, values.iter().flat_map(|v| v.to_le_bytes()).collect()),
            (GgmlType::F16, values.iter().flat_map(|&v| f16::from_f32(v).to_le_bytes()).collect()),
            (GgmlType::BF16, values.iter().flat_map(|&v| half::bf16::from_f32(v).to_le_bytes()).collect()),
        ];
        for (ty, weight) in encodings {
            let mut y = vec![0.0; 2 * rows];
            let result = matmul(ty, &weight, rows, cols, &x, 2, &mut y);
            let mut row = vec![0f32; cols];
            let mut decoded = Vec::new();
            for bytes in weight.chunks_exact(ty.row_bytes(cols).unwrap()) {
                if super::super::dequantize_row(ty, bytes, &mut row).is_err() {
                    // A type the decoder does not handle fails the product the same way.
                    assert!(matches!(result, Err(Error::GgmlUnsupported { .. })), "{ty}: {result:?}");
                    decoded.clear();
                    break;
                }
                decoded.extend(row.iter().map(|&v| (f64::from(v), f64::from(v.abs()))));
            }
            if decoded.is_empty() {
                continue;
            }
            result.unwrap();
            let exact: Vec<f64> = x.iter().map(|&v| f64::from(v)).collect();
            for i in 0..2 {
                // One activation row alone takes the row kernels.
                let mut alone = vec![0.0; rows];
                matvec(ty, &weight, rows, cols, &x[i * cols..(i + 1) * cols], &mut alone).unwrap();
                for r in 0..rows {
                    let (expected, size) =
                        reference(&decoded[r * cols..(r + 1) * cols], &exact[i * cols..(i + 1) * cols]);
                    assert!((f64::from(y[i * rows + r]) - expected).abs() <= ROUNDING * size, "{ty} {i}, {r}");
                    assert!((f64::from(alone[r]) - expected).abs() <= ROUNDING * size, "{ty} {i}, {r} alone");
                }
            }
        }
    }

    #[test]
    fn the_reference_decoder_agrees_with_dequantize_row() {
        let mut rng = Rng(0x2468_ace0_1357_9bdf);
        for ty in KERNEL_TYPES {
            let cols = 512;
            let weight = weight(ty, 3, cols, &mut rng);
            let mut decoded = vec![0f32; 3 * cols];
            if super::super::dequantize_row(ty, &weight, &mut decoded).is_err() {
                continue;
            }
            for (i, (&found, &(expected, size))) in decoded.iter().zip(&decode_weight(ty, &weight)).enumerate() {
                assert!(
                    (f64::from(found) - expected).abs() <= 1e-6 * size,
                    "{ty} value {i}: {found} against {expected}"
                );
            }
        }
    }

    #[test]
    fn block_types_without_kernels_decode_each_row() {
        let mut rng = Rng(0x1111_2222_3333_4444);
        let cols = 512;
        // Q2_K: f16 `d`, `dmin` at 80 and 82; IQ4_NL: f16 `d` at 0.
        for (ty, halves) in [(GgmlType::Q2_K, &[80, 82][..]), (GgmlType::IQ4_NL, &[0][..])] {
            let rows = 5;
            let mut weight: Vec<u8> = (0..rows * ty.row_bytes(cols).unwrap()).map(|_| rng.byte()).collect();
            for block in weight.chunks_exact_mut(ty.type_size()) {
                for &at in halves {
                    block[at..at + 2].copy_from_slice(&f16::from_f32(rng.unit() * 0.05).to_le_bytes());
                }
            }
            let x = activations(3 * cols, &mut rng);
            let mut y = vec![0.0; 3 * rows];
            let result = matmul(ty, &weight, rows, cols, &x, 3, &mut y);
            let mut decoded = vec![0f32; rows * cols];
            if super::super::dequantize_row(ty, &weight, &mut decoded).is_err() {
                assert!(result.is_err(), "{ty}");
                continue;
            }
            result.unwrap();
            let decoded: Vec<(f64, f64)> = decoded.iter().map(|&v| (f64::from(v), f64::from(v.abs()))).collect();
            let exact: Vec<f64> = x.iter().map(|&v| f64::from(v)).collect();
            for i in 0..3 {
                for r in 0..rows {
                    let (expected, size) =
                        reference(&decoded[r * cols..(r + 1) * cols], &exact[i * cols..(i + 1) * cols]);
                    assert!((f64::from(y[i * rows + r]) - expected).abs() <= ROUNDING * size, "{ty} {i}, {r}");
                }
            }
        }
    }

    #[test]
    fn wrong_lengths_are_errors() {
        let ty = GgmlType::Q4_K;
        let weight = vec![0u8; 3 * 144];
        let x = vec![0.0; 256];
        let mut y = vec![0.0; 3];
        assert!(matvec(ty, &weight, 3, 256, &x, &mut y).is_ok());
        // A row that is not whole blocks, a weight a byte short or long, a wrong row count.
        assert!(matches!(matvec(ty, &weight, 3, 200, &x[..200], &mut y), Err(Error::GgmlRow { .. })));
        assert!(matches!(matvec(ty, &weight[1..], 3, 256, &x, &mut y), Err(Error::GgmlRow { .. })));
        assert!(matches!(
            matvec(ty, &[weight.clone(), vec![0]].concat(), 3, 256, &x, &mut y),
            Err(Error::GgmlRow { .. })
        ));
        assert!(matches!(matvec(ty, &weight, 2, 256, &x, &mut y[..2]), Err(Error::GgmlRow { .. })));
        assert!(matches!(matvec(ty, &weight, usize::MAX, 256, &x, &mut y), Err(Error::GgmlRow { .. })));
        // Activations or outputs of the wrong length.
        assert!(matches!(matvec(ty, &weight, 3, 256, &x[1..], &mut y), Err(Error::LengthMismatch { .. })));
        assert!(matches!(matvec(ty, &weight, 3, 256, &x, &mut y[1..]), Err(Error::LengthMismatch { .. })));
        assert!(matches!(matmul(ty, &weight, 3, 256, &x, 2, &mut y), Err(Error::LengthMismatch { .. })));
        let mut y2 = vec![0.0; 6];
        assert!(matches!(
            matmul(ty, &weight, 3, 256, &[x.clone(), x.clone()].concat(), 2, &mut y),
            Err(Error::LengthMismatch { .. })
        ));
        assert!(matmul(ty, &weight, 3, 256, &[x.clone(), x].concat(), 2, &mut y2).is_ok());
    }

    #[test]
    fn empty_products_and_rows() {
        let mut y = vec![1.0; 4];
        matvec(GgmlType::Q4_0, &[], 4, 0, &[], &mut y).unwrap();
        assert_eq!(y, [0.0; 4]);
        matvec(GgmlType::Q4_0, &[], 0, 64, &[0.0; 64], &mut []).unwrap();
        matmul(GgmlType::Q4_0, &[0; 36], 1, 64, &[], 0, &mut []).unwrap();
    }

    #[test]
    fn non_finite_activations_give_nan() {
        let mut rng = Rng(99);
        for ty in KERNEL_TYPES {
            let weight = weight(ty, 3, 256, &mut rng);
            let mut x = activations(256, &mut rng);
            x[70] = f32::INFINITY;
            for isa in isas() {
                assert!(run(isa, ty, &weight, 3, 256, &x, 1).iter().all(|v| v.is_nan()), "{ty} {isa:?}");
            }
        }
    }

    #[test]
    fn rounding_keeps_small_blocks_and_zeros() {
        let mut x = [0f32; 32];
        assert_eq!(quantize_block(&x), ([0; 32], 0.0, [0, 0]));
        x[3] = -2.0;
        x[20] = 1.0;
        let (q, d, sums) = quantize_block(&x);
        assert_eq!((q[3], q[20], d, sums), (-127, 64, 2.0 / 127.0, [-127, 64]));
        x[5] = 1e-38;
        x[3] = 0.0;
        x[20] = 0.0;
        assert_eq!(quantize_block(&x).1, 0.0);
    }
}
