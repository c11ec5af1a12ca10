//! Matrix-vector products for `linear` with a few input rows (a decoding step): the weight is
//! read once in its stored dtype (f32, bf16 or f16, never converted as a whole), split across
//! threads by output features. A weight stored `[out, in]` gives each output feature as a dot
//! product with one weight row; one stored `[in, out]` and viewed transposed (a Conv1D weight,
//! as GPT-2 stores them) adds each input feature times its row to the outputs of a block.
//!
//! A general product packs both operands into blocks first, which for one input row costs as
//! much memory traffic as the product itself; here the weight streams through once, so decoding
//! runs at the speed memory delivers the weights.

use half::{bf16, f16};
use rayon::prelude::*;

use crate::error::Result;
use crate::{DType, Tensor};

/// The most input rows that take this path; more rows reuse each weight row often enough for
/// the blocked product to win.
pub(crate) const MAX_ROWS: usize = 8;

/// Accumulator lanes of one dot product: four 8-wide (AVX2) or two 16-wide (AVX-512) vectors,
/// enough independent sums to hide the latency of fused multiply-adds.
const LANES: usize = 32;

/// Elements of an f16 weight row widened at a time: f16 has no cheap per-element widening, so
/// a stretch of the row is widened at once (with F16C where the CPU has it).
const F16_BLOCK: usize = 256;

/// A weight element widened to f32.
trait Widen: Copy + Send + Sync {
    fn widen(self) -> f32;
}

impl Widen for f32 {
    #[inline(always)]
    fn widen(self) -> f32 {
        self
    }
}

impl Widen for bf16 {
    /// A bf16 is the high half of an f32: widening is a shift, which vectorises.
    #[inline(always)]
    fn widen(self) -> f32 {
        f32::from_bits(u32::from(self.to_bits()) << 16)
    }
}

/// `acc + a * b`, fused where the target has fused multiply-add (without it, `mul_add` is a
/// slow library call).
#[inline(always)]
fn multiply_add<const FUSED: bool>(a: f32, b: f32, acc: f32) -> f32 {
    if FUSED { a.mul_add(b, acc) } else { acc + a * b }
}

/// The dot product of `x` and `w` (equal lengths), in [`LANES`] independent sums.
#[inline(always)]
fn dot<W: Widen, const FUSED: bool>(x: &[f32], w: &[W]) -> f32 {
    let mut acc = [0.0f32; LANES];
    let (x_chunks, x_tail) = x.as_chunks::<LANES>();
    let (w_chunks, w_tail) = w.as_chunks::<LANES>();
    for (xs, ws) in x_chunks.iter().zip(w_chunks) {
        for lane in 0..LANES {
            acc[lane] = multiply_add::<FUSED>(xs[lane], ws[lane].widen(), acc[lane]);
        }
    }
    let mut tail = 0.0f32;
    for (&a, &b) in x_tail.iter().zip(w_tail) {
        tail = multiply_add::<FUSED>(a, b.widen(), tail);
    }
    // Pairwise, so that the rounding does not grow with the lane count.
    let mut width = LANES;
    while width > 1 {
        width /= 2;
        for lane in 0..width {
            acc[lane] += acc[lane + width];
        }
    }
    acc[0] + tail
}

/// The elements of a weight, in its stored dtype.
#[derive(Clone, Copy)]
enum Elements<'a> {
    F32(&'a [f32]),
    BF16(&'a [bf16]),
    F16(&'a [f16]),
}

/// The weight of a product and how its elements are laid out.
#[derive(Clone, Copy)]
enum Weight<'a> {
    /// `[out, in]` row-major: an output feature's coefficients are one contiguous row.
    Rows(Elements<'a>),
    /// `[in, out]` row-major (f32 or bf16), `out` wide: an input feature's coefficients for
    /// every output are one contiguous row.
    Columns(Elements<'a>, usize),
}

/// `dst[j * rows + r] = x[r] · w[.., first + j]` for the output features of one block of a
/// `[in, out]` weight: each row of coefficients is read once and added, times its input, to
/// the block's sums.
#[inline(always)]
fn columns<W: Widen, const FUSED: bool>(
    x: &[f32],
    rows: usize,
    width: usize,
    (w, out_features): (&[W], usize),
    first: usize,
    dst: &mut [f32],
) {
    let count = dst.len() / rows;
    // `sums[r * count + j]`: input row `r`, output feature `first + j`.
    let mut sums = vec![0.0f32; rows * count];
    for i in 0..width {
        let coefficients = &w[i * out_features + first..i * out_features + first + count];
        for (r, sums) in sums.chunks_exact_mut(count).enumerate() {
            let input = x[r * width + i];
            for (sum, &coefficient) in sums.iter_mut().zip(coefficients) {
                *sum = multiply_add::<FUSED>(input, coefficient.widen(), *sum);
            }
        }
    }
    for (j, out) in dst.chunks_exact_mut(rows).enumerate() {
        for (r, value) in out.iter_mut().enumerate() {
            *value = sums[r * count + j];
        }
    }
}

/// `dst[j * rows + r] = x[r] · weight[first + j]` for the output features of one block
/// (`dst` holds `rows` values per feature).
#[inline(always)]
fn block<const FUSED: bool>(x: &[f32], rows: usize, width: usize, weight: Weight<'_>, first: usize, dst: &mut [f32]) {
    let features = dst.len() / rows;
    let weight = match weight {
        Weight::Columns(Elements::F32(w), out) => return columns::<f32, FUSED>(x, rows, width, (w, out), first, dst),
        Weight::Columns(Elements::BF16(w), out) => return columns::<bf16, FUSED>(x, rows, width, (w, out), first, dst),
        Weight::Columns(Elements::F16(_), _) => unreachable!("f16 `[in, out]` weights take the blocked product"),
        Weight::Rows(elements) => elements,
    };
    match weight {
        Elements::F32(w) => {
            for (j, out) in dst.chunks_exact_mut(rows).enumerate() {
                let row = &w[(first + j) * width..(first + j + 1) * width];
                for (r, value) in out.iter_mut().enumerate() {
                    *value = dot::<f32, FUSED>(&x[r * width..(r + 1) * width], row);
                }
            }
        }
        Elements::BF16(w) => {
            for (j, out) in dst.chunks_exact_mut(rows).enumerate() {
                let row = &w[(first + j) * width..(first + j + 1) * width];
                for (r, value) in out.iter_mut().enumerate() {
                    *value = dot::<bf16, FUSED>(&x[r * width..(r + 1) * width], row);
                }
            }
        }
        Elements::F16(w) => {
            // Each weight row is widened a block of columns at a time (with the F16C
            // instructions where the CPU has them) and then dotted as f32.
            let mut widened = [0.0f32; F16_BLOCK];
            let mut sums = [0.0f32; MAX_ROWS];
            for j in 0..features {
                let row = &w[(first + j) * width..(first + j + 1) * width];
                sums[..rows].fill(0.0);
                for (at, part) in row.chunks(F16_BLOCK).enumerate() {
                    let widened = &mut widened[..part.len()];
                    half::slice::HalfFloatSliceExt::convert_to_f32_slice(part, widened);
                    let columns = at * F16_BLOCK..at * F16_BLOCK + part.len();
                    for (r, sum) in sums[..rows].iter_mut().enumerate() {
                        *sum += dot::<f32, FUSED>(&x[r * width..][columns.clone()], widened);
                    }
                }
                dst[j * rows..(j + 1) * rows].copy_from_slice(&sums[..rows]);
            }
        }
    }
}

/// [`block`] compiled for AVX-512 with fused multiply-add: 16-wide vectors, half the
/// instructions per weight row, which keeps more loads in flight.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
fn block_avx512(x: &[f32], rows: usize, width: usize, weight: Weight<'_>, first: usize, dst: &mut [f32]) {
    block::<true>(x, rows, width, weight, first, dst);
}

/// [`block`] compiled for AVX2 with fused multiply-add.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn block_avx2(x: &[f32], rows: usize, width: usize, weight: Weight<'_>, first: usize, dst: &mut [f32]) {
    block::<true>(x, rows, width, weight, first, dst);
}

/// [`block`] with the best instructions the CPU has.
fn block_dispatch(x: &[f32], rows: usize, width: usize, weight: Weight<'_>, first: usize, dst: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU has AVX-512F and FMA, detected just now.
        unsafe { block_avx512(x, rows, width, weight, first, dst) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU has AVX2 and FMA, detected just now.
        unsafe { block_avx2(x, rows, width, weight, first, dst) };
        return;
    }
    // Fused multiply-add is part of the baseline of 64-bit Arm.
    block::<{ cfg!(target_arch = "aarch64") }>(x, rows, width, weight, first, dst);
}

/// The elements of a contiguous tensor in a dtype the kernels read.
fn elements(tensor: &Tensor) -> Result<Option<Elements<'_>>> {
    Ok(match tensor.dtype() {
        DType::F32 => tensor.as_slice::<f32>()?.map(Elements::F32),
        DType::BF16 => tensor.as_slice::<bf16>()?.map(Elements::BF16),
        DType::F16 => tensor.as_slice::<f16>()?.map(Elements::F16),
        _ => None,
    })
}

/// `x · weightᵀ` for `x` `[rows, in]` (f32, row-major, at most [`MAX_ROWS`] rows) and an
/// `[out, in]` weight, as `[rows, out]` row-major. The weight is contiguous in f32, bf16 or
/// f16, or the transposed view of a contiguous `[in, out]` tensor in f32 or bf16; `None` for
/// another layout or dtype, which the blocked product handles.
pub(crate) fn product(x: &[f32], rows: usize, weight: &Tensor) -> Result<Option<Vec<f32>>> {
    let &[out_features, width] = weight.shape() else { return Ok(None) };
    debug_assert!(rows <= MAX_ROWS && x.len() == rows * width, "`x` holds `rows` rows of the weight's width");
    if rows == 0 || out_features == 0 {
        return Ok(None);
    }
    let threads = rayon::current_num_threads().max(1);
    let stored = weight.transpose(0, 1)?;
    let (weight, per_task) = if weight.is_contiguous() {
        // Several tasks per thread, each at least a few KiB of weights.
        let Some(elements) = elements(weight)? else { return Ok(None) };
        (Weight::Rows(elements), out_features.div_ceil(threads * 4).max(16))
    } else if stored.is_contiguous() && weight.dtype() != DType::F16 {
        // One wide block per thread, so that each row of coefficients is read in long runs.
        let Some(elements) = elements(&stored)? else { return Ok(None) };
        (Weight::Columns(elements, out_features), out_features.div_ceil(threads).next_multiple_of(16))
    } else {
        return Ok(None);
    };
    let mut by_feature = vec![0.0f32; out_features * rows];
    by_feature.par_chunks_mut(per_task * rows).enumerate().for_each(|(task, dst)| {
        block_dispatch(x, rows, width, weight, task * per_task, dst);
    });
    if rows == 1 {
        return Ok(Some(by_feature));
    }
    let mut out = vec![0.0f32; rows * out_features];
    for (j, values) in by_feature.chunks_exact(rows).enumerate() {
        for (r, &value) in values.iter().enumerate() {
            out[r * out_features + j] = value;
        }
    }
    Ok(Some(out))
}

#[cfg(test)]
mod tests {
    use super::super::testing::{assert_close, cast, random};
    use super::*;

    fn reference(x: &Tensor, weight: &Tensor) -> Vec<f64> {
        let (x, w) = (x.to_f32_vec().unwrap(), weight.to_f32_vec().unwrap());
        let (out_features, width) = (weight.shape()[0], weight.shape()[1]);
        let rows = x.len() / width;
        let mut out = Vec::new();
        for r in 0..rows {
            for j in 0..out_features {
                out.push((0..width).map(|i| f64::from(x[r * width + i]) * f64::from(w[j * width + i])).sum());
            }
        }
        out
    }

    #[test]
    fn every_weight_dtype_matches_the_reference() {
        // Widths with and without a tail past the lanes; more features than one task takes.
        for (rows, width, out_features) in [(1, 1, 1), (1, 96, 300), (3, 77, 50), (8, 300, 129), (2, 640, 33)] {
            let x = random(&[rows, width], 1);
            let weight = random(&[out_features, width], 2);
            for dtype in [DType::F32, DType::BF16, DType::F16] {
                let weight = cast(&weight, dtype);
                let out = product(&x.to_vec::<f32>().unwrap(), rows, &weight).unwrap().unwrap();
                assert_close(&out, &reference(&x, &weight), 1e-5);
            }
        }
    }

    #[test]
    fn every_instruction_set_computes_the_same_block() {
        let (rows, width, out_features) = (3, 100, 20);
        let x = random(&[rows, width], 5);
        let weight = random(&[out_features, width], 6);
        type Block = fn(&[f32], usize, usize, Weight<'_>, usize, &mut [f32]);
        // Only x86-64 adds variants to the portable one.
        #[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut))]
        let mut variants: Vec<(&str, Block)> = vec![("portable", block::<false>)];
        #[cfg(target_arch = "x86_64")]
        {
            if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
                variants.push(("avx2", |x, rows, width, weight, first, dst| {
                    // SAFETY: listed only when the CPU has AVX2 and FMA.
                    unsafe { block_avx2(x, rows, width, weight, first, dst) }
                }));
            }
            if std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("fma") {
                variants.push(("avx512", |x, rows, width, weight, first, dst| {
                    // SAFETY: listed only when the CPU has AVX-512F and FMA.
                    unsafe { block_avx512(x, rows, width, weight, first, dst) }
                }));
            }
        }
        for (name, variant) in variants {
            for dtype in [DType::F32, DType::BF16, DType::F16] {
                let weight = cast(&weight, dtype);
                let expected = reference(&x, &weight);
                let mut by_feature = vec![0.0f32; rows * out_features];
                let stored = Weight::Rows(elements(&weight).unwrap().unwrap());
                variant(&x.to_vec::<f32>().unwrap(), rows, width, stored, 0, &mut by_feature);
                for (at, &expected) in expected.iter().enumerate() {
                    let found = f64::from(by_feature[(at % out_features) * rows + at / out_features]);
                    assert!((found - expected).abs() <= 1e-5 * (1.0 + expected.abs()), "{name} {dtype:?} element {at}");
                }
            }
        }
    }

    #[test]
    fn transposed_weights_match_the_reference() {
        // `[in, out]` storage viewed as `[out, in]`, with blocks of output features per thread.
        for (rows, width, out_features) in [(1, 1, 1), (1, 70, 300), (3, 64, 50), (8, 33, 129)] {
            let x = random(&[rows, width], 3);
            let stored = random(&[width, out_features], 4);
            for dtype in [DType::F32, DType::BF16] {
                let weight = cast(&stored, dtype).transpose(0, 1).unwrap();
                let out = product(&x.to_vec::<f32>().unwrap(), rows, &weight).unwrap().unwrap();
                assert_close(&out, &reference(&x, &weight.contiguous()), 1e-5);
            }
        }
    }

    #[test]
    fn other_layouts_are_left_to_the_blocked_product() {
        let weight = random(&[4, 6], 3);
        let x = vec![1.0f32; 4];
        assert!(product(&x, 1, &cast(&weight, DType::F16).transpose(0, 1).unwrap()).unwrap().is_none());
        assert!(product(&[1.0f32; 3], 1, &weight.narrow(1, 0, 3).unwrap()).unwrap().is_none());
        assert!(product(&[1.0f32; 6], 1, &cast(&weight, DType::F64)).unwrap().is_none());
    }

    #[test]
    fn linear_takes_this_path_for_few_rows_and_agrees_with_the_blocked_product() {
        let weight = cast(&random(&[70, 50], 4), DType::BF16);
        let bias = random(&[70], 5);
        let few = random(&[2, 50], 6);
        let many = Tensor::from_vec(
            [few.to_vec::<f32>().unwrap(), random(&[MAX_ROWS, 50], 7).to_vec().unwrap()].concat(),
            &[MAX_ROWS + 2, 50],
        )
        .unwrap();
        let fast = few.linear(&weight, Some(&bias)).unwrap().to_vec::<f32>().unwrap();
        let blocked = many.linear(&weight, Some(&bias)).unwrap().to_vec::<f32>().unwrap();
        assert_close(&fast, &blocked[..2 * 70].iter().map(|&v| f64::from(v)).collect::<Vec<_>>(), 1e-5);
    }
}
