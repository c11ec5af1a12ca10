//! Matrix-vector products straight from packed weights, the product of one token in a decode
//! loop: each packed value is unpacked into a register and multiplied once, and the float
//! weight is never written, so the product reads a fraction of the bytes an f32 weight takes.
//!
//! - MLX affine with f32 scales: `y_r = sum_g scale_g * (sum_i q_i x_i) + bias_g * (sum_i x_i)`,
//!   as MLX's own `qmv` computes it; it differs from the dequantized weight's product only by
//!   f32 rounding.
//! - MLX affine with bf16 scales (4 bits): every value is rounded as the dequantized weight is,
//!   `bf16(bf16(q * scale) + bias)`, so one row's product uses the same weights as a batch's.
//!   Other widths and f16 scales take the decoding product.
//! - SEED4 and SEED4P4: each block's values are decoded in a register bit for bit as the
//!   decoder does.

use rayon::prelude::*;

/// Output rows per parallel task.
const ROWS_PER_TASK: usize = 16;

/// `y = W x` for the `[rows, columns]` weight packed in `words` (`BITS` = 2, 4 or 8 bits per
/// value, little-endian within each u32 word) with one scale and bias per `group` values, and
/// `x` of `columns` values.
pub(crate) fn affine_gemv(
    bits: u32,
    group: usize,
    rounding: super::Rounding,
    words: &[u32],
    scales: &[f32],
    biases: &[f32],
    x: &[f32],
) -> Option<Vec<f32>> {
    let columns = x.len();
    let groups = columns / group;
    let rows = scales.len() / groups.max(1);
    if columns == 0 || !columns.is_multiple_of(group) || scales.len() != rows * groups {
        return None;
    }
    // The sum of each group of x is shared by every row.
    let x_sums: Vec<f32> = x.chunks_exact(group).map(|chunk| chunk.iter().sum()).collect();
    let row_words = columns * bits as usize / 32;
    let mut y = vec![0f32; rows];
    let bf16 = match rounding {
        super::Rounding::F32 => false,
        super::Rounding::BF16 => true,
        super::Rounding::F16 => return None,
    };
    // The 4-bit AVX2 kernel reads x in its unpacking order; the others in the stored order.
    #[cfg(target_arch = "x86_64")]
    let q4 = (bits == 4 && group.is_multiple_of(64) && avx2::available()).then(|| avx2::nibble_order(x));
    #[cfg(not(target_arch = "x86_64"))]
    let q4: Option<Vec<f32>> = None;
    let (kernel, x): (RowKernel, &[f32]) = match &q4 {
        #[cfg(target_arch = "x86_64")]
        Some(ordered) => (if bf16 { avx2::q4_row::<true> } else { avx2::q4_row::<false> }, ordered),
        _ if bf16 => return None,
        _ => (select(bits)?, x),
    };
    y.par_chunks_mut(ROWS_PER_TASK).enumerate().for_each(|(task, out)| {
        let first = task * ROWS_PER_TASK;
        for (at, value) in out.iter_mut().enumerate() {
            let row = first + at;
            let words = &words[row * row_words..(row + 1) * row_words];
            let scales = &scales[row * groups..(row + 1) * groups];
            let biases = &biases[row * groups..(row + 1) * groups];
            *value = kernel(group, words, scales, biases, x, &x_sums);
        }
    });
    Some(y)
}

type RowKernel = fn(usize, &[u32], &[f32], &[f32], &[f32], &[f32]) -> f32;

/// The row kernel for `bits`, compiled for AVX2 and FMA where the processor has them (the
/// unpacking then runs eight lanes at a time), else for the baseline.
fn select(bits: u32) -> Option<RowKernel> {
    #[cfg(target_arch = "x86_64")]
    if avx2::available() {
        return match bits {
            2 => Some(avx2::row::<2>),
            4 => Some(avx2::row::<4>),
            8 => Some(avx2::row::<8>),
            _ => None,
        };
    }
    match bits {
        2 => Some(row::<2>),
        4 => Some(row::<4>),
        8 => Some(row::<8>),
        _ => None,
    }
}

/// One output value: per group, the dot product of the packed values with x, scaled, plus the
/// bias times the group's sum of x.
#[inline(always)]
fn row<const BITS: u32>(group: usize, words: &[u32], scales: &[f32], biases: &[f32], x: &[f32], x_sums: &[f32]) -> f32 {
    let per_word = (32 / BITS) as usize;
    let mask = (1u32 << BITS) - 1;
    let group_words = group / per_word;
    let mut total = 0f32;
    for (g, ((&scale, &bias), &x_sum)) in scales.iter().zip(biases).zip(x_sums).enumerate() {
        let words = &words[g * group_words..(g + 1) * group_words];
        let x = &x[g * group..(g + 1) * group];
        // Four sets of eight independent sums (one set per 256-bit register, so that the
        // additions of consecutive words do not wait on each other); a word's values go to
        // consecutive lanes.
        let mut lanes = [[0f32; 8]; 4];
        for (index, (&word, x)) in words.iter().zip(x.chunks_exact(per_word)).enumerate() {
            let lanes = &mut lanes[index % 4];
            for (at, &x) in x.iter().enumerate() {
                let q = ((word >> (at as u32 * BITS)) & mask) as f32;
                lanes[at % 8] += q * x;
            }
        }
        let lanes: [f32; 8] = std::array::from_fn(|lane| lanes.iter().map(|set| set[lane]).sum());
        let dot: f32 = lanes.iter().sum();
        total += scale * dot + bias * x_sum;
    }
    total
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    /// Whether the processor has AVX2 and FMA.
    pub(super) fn available() -> bool {
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
    }

    /// `x` reordered for [`q4_row`]: each run of 64 values (8 words of 4-bit values) as the
    /// kernel unpacks them, low nibbles of every byte first (values `8w + 2b`), then high
    /// nibbles (`8w + 2b + 1`), 8 bytes (two words) at a time.
    pub(super) fn nibble_order(x: &[f32]) -> Vec<f32> {
        let mut out = Vec::with_capacity(x.len());
        for run in x.chunks_exact(64) {
            for nibble in 0..2 {
                for byte in 0..32 {
                    let (word, within) = (byte / 4, byte % 4);
                    out.push(run[word * 8 + 2 * within + nibble]);
                }
            }
        }
        out
    }

    /// One output value of a SEED weight: per block, the basis pairs from the table times the
    /// coefficient pairs (two `madd` of i16 pairs and one add: the decoder's exact integer sums,
    /// value `c` in lane `c`), times the block's scale, rounded to bf16 in integer arithmetic,
    /// times `x`. Two blocks per step, each into an accumulator of its own.
    pub(super) fn seed_row(
        slice: &super::SeedSlice<'_>,
        table: &[[i16; 32]],
        scales: &[f32; 16],
        row: usize,
        x: &[f32],
    ) -> f32 {
        // SAFETY: callers check `available` first.
        unsafe { seed_row_avx2(slice, table, scales, row, x) }
    }

    /// Blocks ahead whose basis rows are fetched early.
    const PREFETCH: usize = 16;

    /// Multipliers that move each coefficient nibble of a block's 16-bit word to the top of its
    /// i16 lane (an arithmetic shift right by 12 then sign-extends it): `[q0, q1]` and
    /// `[q2, q3]` pairs in every 32-bit lane. A zero multiplier leaves SEED4's missing `q3` 0.
    fn nibble_multipliers(coefficients: usize) -> [__m256i; 2] {
        // SAFETY: plain register constructors; AVX is enabled wherever this is inlined.
        let pair = |low: i16, high: i16| unsafe { _mm256_set1_epi32(i32::from(low as u16) | (i32::from(high) << 16)) };
        if coefficients == 3 {
            // Bits 4-7, 8-11, 12-15 (bits 0-3 are the exponent code).
            [pair(1 << 8, 1 << 4), pair(1, 0)]
        } else {
            // Bits 0-3, 4-7, 8-11, 12-15.
            [pair(1 << 12, 1 << 8), pair(1 << 4, 1)]
        }
    }

    /// One block of a SEED row: its 8 weights decoded from the basis pairs and the coefficient
    /// word, times `x`, added to `sum`.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn seed_block(
        basis: &[i16; 32],
        word: u16,
        multipliers: [__m256i; 2],
        scale: f32,
        x: &[f32],
        sum: __m256,
    ) -> __m256 {
        let word = _mm256_set1_epi16(word as i16);
        let q_low = _mm256_srai_epi16::<12>(_mm256_mullo_epi16(word, multipliers[0]));
        let q_high = _mm256_srai_epi16::<12>(_mm256_mullo_epi16(word, multipliers[1]));
        assert_eq!(x.len(), 8);
        // SAFETY: `basis` holds 32 i16 (two 256-bit loads) and `x` 8 values; the loads are
        // unaligned.
        unsafe {
            let sums = _mm256_add_epi32(
                _mm256_madd_epi16(_mm256_loadu_si256(basis.as_ptr().cast::<__m256i>()), q_low),
                _mm256_madd_epi16(_mm256_loadu_si256(basis.as_ptr().add(16).cast::<__m256i>()), q_high),
            );
            let values = _mm256_mul_ps(_mm256_cvtepi32_ps(sums), _mm256_set1_ps(scale));
            // Round to bf16, ties to even: add 0x7fff plus the lowest kept bit, then clear the
            // low half (the values are finite: the exponent is in the normal range).
            let bits = _mm256_castps_si256(values);
            let lowest = _mm256_and_si256(_mm256_srli_epi32::<16>(bits), _mm256_set1_epi32(1));
            let rounded = _mm256_add_epi32(bits, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lowest));
            let rounded = _mm256_and_si256(rounded, _mm256_set1_epi32(0xffff_0000_u32 as i32));
            _mm256_fmadd_ps(_mm256_castsi256_ps(rounded), _mm256_loadu_ps(x.as_ptr()), sum)
        }
    }

    #[target_feature(enable = "avx2,fma")]
    fn seed_row_avx2(
        slice: &super::SeedSlice<'_>,
        table: &[[i16; 32]],
        scales: &[f32; 16],
        row: usize,
        x: &[f32],
    ) -> f32 {
        let first = slice.first_block + row * slice.blocks;
        let seeds = &slice.seeds[first..first + slice.blocks];
        let words = &slice.words[first..first + slice.blocks];
        assert_eq!(x.len(), slice.blocks * 8, "one x value per weight column");
        let [low_multiplier, high_multiplier] = nibble_multipliers(slice.coefficients);
        let code = |j: usize| -> usize {
            if slice.coefficients == 3 {
                usize::from(words[j] & 0xf)
            } else {
                let g = first + j;
                usize::from(slice.codes[g / 2] >> (4 * (g % 2))) & 0xf
            }
        };
        // One block's 8 weights times its 8 values of x, added to `sum`. (A macro, not a
        // closure: closures do not take the function's target features and are not inlined.)
        macro_rules! block {
            ($j:expr, $sum:expr) => {{
                let j = $j;
                // The basis rows are scattered over the table: ask for a later block's early.
                if let Some(&later) = seeds.get(j + PREFETCH) {
                    _mm_prefetch::<_MM_HINT_T0>(table[usize::from(later)].as_ptr().cast::<i8>());
                }
                seed_block(
                    &table[usize::from(seeds[j])],
                    words[j],
                    [low_multiplier, high_multiplier],
                    scales[code(j)],
                    &x[8 * j..8 * j + 8],
                    $sum,
                )
            }};
        }
        let mut a = _mm256_setzero_ps();
        let mut b = _mm256_setzero_ps();
        let pairs = slice.blocks / 2;
        for pair in 0..pairs {
            a = block!(2 * pair, a);
            b = block!(2 * pair + 1, b);
        }
        if slice.blocks % 2 == 1 {
            a = block!(slice.blocks - 1, a);
        }
        let mut lanes = [0f32; 8];
        // SAFETY: `lanes` holds 8 f32.
        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), _mm256_add_ps(a, b)) };
        lanes.iter().sum()
    }

    /// One output value of a 4-bit weight whose groups are multiples of 64 values: 8 words at
    /// a time are split into low and high nibbles with two masks, widened 8 bytes at a time and
    /// multiplied with `x` in [`nibble_order`]; the scale multiplies each group's sum in a
    /// register, and the sum across lanes is taken once per row.
    ///
    /// With `BF16`, each value is rounded as the dequantized bf16 weight is instead,
    /// `bf16(bf16(q * scale) + bias)`, and the bias is added per value.
    pub(super) fn q4_row<const BF16: bool>(
        group: usize,
        words: &[u32],
        scales: &[f32],
        biases: &[f32],
        x: &[f32],
        x_sums: &[f32],
    ) -> f32 {
        // SAFETY: callers check `available` first.
        unsafe { q4_row_avx2::<BF16>(group, words, scales, biases, x, x_sums) }
    }

    /// Rounds finite f32 lanes to bf16, ties to even.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn round_bf16(values: __m256) -> __m256 {
        let bits = _mm256_castps_si256(values);
        let lowest = _mm256_and_si256(_mm256_srli_epi32::<16>(bits), _mm256_set1_epi32(1));
        let added = _mm256_add_epi32(bits, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lowest));
        _mm256_castsi256_ps(_mm256_and_si256(added, _mm256_set1_epi32(0xffff_0000_u32 as i32)))
    }

    /// The weights of 8 packed values: their values as f32, or with `BF16` the bf16 weights.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn weight<const BF16: bool>(values: __m256, scale: __m256, bias: __m256) -> __m256 {
        if BF16 { round_bf16(_mm256_add_ps(round_bf16(_mm256_mul_ps(values, scale)), bias)) } else { values }
    }

    /// The weights of the low 8 bytes of `bytes`, each one value (a function with the
    /// kernel's target features, so that it is inlined where a closure would be called).
    #[inline]
    #[target_feature(enable = "avx2")]
    fn widen<const BF16: bool>(bytes: __m128i, scale: __m256, bias: __m256) -> __m256 {
        weight::<BF16>(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes)), scale, bias)
    }

    #[target_feature(enable = "avx2,fma")]
    fn q4_row_avx2<const BF16: bool>(
        group: usize,
        words: &[u32],
        scales: &[f32],
        biases: &[f32],
        x: &[f32],
        x_sums: &[f32],
    ) -> f32 {
        let runs = group / 64;
        assert!(words.len() == scales.len() * runs * 8 && x.len() == scales.len() * group, "whole groups");
        let mask = _mm256_set1_epi8(0x0f);
        let mut sums = _mm256_setzero_ps();
        let mut biased = 0f32;
        for (g, ((&scale, &bias), &x_sum)) in scales.iter().zip(biases).zip(x_sums).enumerate() {
            // Four chains of additions, so that each waits on its own previous product only.
            let [mut a, mut b, mut c, mut d] = [_mm256_setzero_ps(); 4];
            let (scale_lanes, bias_lanes) = (_mm256_set1_ps(scale), _mm256_set1_ps(bias));
            for run in 0..runs {
                let at = g * runs + run;
                // SAFETY: the assert above keeps words `8 at..8 at + 8` and values
                // `64 at..64 at + 64` in range; the loads are unaligned.
                unsafe {
                    let packed = _mm256_loadu_si256(words.as_ptr().add(at * 8).cast::<__m256i>());
                    let x = x.as_ptr().add(at * 64);
                    for (half, nibbles) in
                        [_mm256_and_si256(packed, mask), _mm256_and_si256(_mm256_srli_epi16::<4>(packed), mask)]
                            .iter()
                            .enumerate()
                    {
                        let low = _mm256_castsi256_si128(*nibbles);
                        let high = _mm256_extracti128_si256::<1>(*nibbles);
                        let x = x.add(half * 32);
                        a = _mm256_fmadd_ps(widen::<BF16>(low, scale_lanes, bias_lanes), _mm256_loadu_ps(x), a);
                        b = _mm256_fmadd_ps(
                            widen::<BF16>(_mm_srli_si128::<8>(low), scale_lanes, bias_lanes),
                            _mm256_loadu_ps(x.add(8)),
                            b,
                        );
                        c = _mm256_fmadd_ps(
                            widen::<BF16>(high, scale_lanes, bias_lanes),
                            _mm256_loadu_ps(x.add(16)),
                            c,
                        );
                        d = _mm256_fmadd_ps(
                            widen::<BF16>(_mm_srli_si128::<8>(high), scale_lanes, bias_lanes),
                            _mm256_loadu_ps(x.add(24)),
                            d,
                        );
                    }
                }
            }
            let group_sum = _mm256_add_ps(_mm256_add_ps(a, b), _mm256_add_ps(c, d));
            if BF16 {
                sums = _mm256_add_ps(group_sum, sums);
            } else {
                sums = _mm256_fmadd_ps(scale_lanes, group_sum, sums);
                biased += bias * x_sum;
            }
        }
        let mut lanes = [0f32; 8];
        // SAFETY: `lanes` holds 8 f32.
        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), sums) };
        biased + lanes.iter().sum::<f32>()
    }

    /// [`super::row`] compiled with AVX2 and FMA.
    pub(super) fn row<const BITS: u32>(
        group: usize,
        words: &[u32],
        scales: &[f32],
        biases: &[f32],
        x: &[f32],
        x_sums: &[f32],
    ) -> f32 {
        // SAFETY: `select` hands out this function only after detecting AVX2 and FMA.
        unsafe { row_avx2::<BITS>(group, words, scales, biases, x, x_sums) }
    }

    #[target_feature(enable = "avx2,fma")]
    fn row_avx2<const BITS: u32>(
        group: usize,
        words: &[u32],
        scales: &[f32],
        biases: &[f32],
        x: &[f32],
        x_sums: &[f32],
    ) -> f32 {
        super::row::<BITS>(group, words, scales, biases, x, x_sums)
    }
}

/// The streams of one slice of a SEED weight, for [`seed_gemv`] (whose kernel is x86-64's).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) struct SeedSlice<'a> {
    /// Coefficients per block: 3 (SEED4) or 4 (SEED4P4).
    pub(crate) coefficients: usize,
    /// All seeds and coefficient words of the weight.
    pub(crate) seeds: &'a [u16],
    pub(crate) words: &'a [u16],
    /// SEED4P4's exponent codes, two per byte.
    pub(crate) codes: &'a [u8],
    /// The first block of the slice, its rows and blocks per row.
    pub(crate) first_block: usize,
    pub(crate) rows: usize,
    pub(crate) blocks: usize,
    /// The slice's exponent bias.
    pub(crate) exp_bias: i32,
}

/// `y = W x` for one slice of a SEED4 or SEED4P4 weight, each block's 8 values decoded in a
/// register exactly as [`super::SeedWeight::decode`] decodes them (the same integer sums, the
/// same f32 product and bf16 rounding) and multiplied with `x` there. `None` where the AVX2
/// kernel does not apply (no AVX2, or exponents outside the normal range); the caller then
/// decodes rows into memory.
pub(crate) fn seed_gemv(slice: &SeedSlice<'_>, x: &[f32]) -> Option<Vec<f32>> {
    #[cfg(target_arch = "x86_64")]
    {
        let normal = slice.exp_bias >= -126 && slice.exp_bias <= 127 - 15;
        if !avx2::available() || !normal || x.len() != slice.blocks * super::seed::BLOCK {
            return None;
        }
        let table = seed_table(slice.coefficients);
        let scales: [f32; 16] = std::array::from_fn(|code| super::seed::block_scale(slice.exp_bias + code as i32));
        let mut y = vec![0f32; slice.rows];
        y.par_chunks_mut(ROWS_PER_TASK).enumerate().for_each(|(task, out)| {
            for (at, value) in out.iter_mut().enumerate() {
                *value = avx2::seed_row(slice, table, &scales, task * ROWS_PER_TASK + at, x);
            }
        });
        Some(y)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (slice, x);
        None
    }
}

/// For every seed, its block's basis as i16 `S[c][p] = state - 32768` in the order of the
/// register kernel: first the pairs `(S[c][0], S[c][1])` for c = 0..8, then the pairs
/// `(S[c][2], S[c][3])` (zero past `coefficients`). The LFSR runs once per seed, not once per
/// block.
#[cfg(target_arch = "x86_64")]
fn seed_table(coefficients: usize) -> &'static [[i16; 32]] {
    use std::sync::OnceLock;
    static TABLES: [OnceLock<Vec<[i16; 32]>>; 2] = [OnceLock::new(), OnceLock::new()];
    let build = || {
        (0..=u16::MAX)
            .map(|seed| {
                let bits = super::seed::sequence_bits(seed);
                std::array::from_fn(|at| {
                    let (c, p) = ((at % 16) / 2, 2 * (at / 16) + at % 2);
                    if p < coefficients {
                        (((bits >> (c * coefficients + p + 1)) & 0xffff) as i32 - 32768) as i16
                    } else {
                        0
                    }
                })
            })
            .collect()
    };
    TABLES[usize::from(coefficients == 4)].get_or_init(build)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Tensor;
    use crate::quant::{AffineSpec, AffineWeight, Rounding};

    #[test]
    fn products_equal_the_dequantized_weight_times_x() {
        let (rows, columns) = (37, 256);
        let values: Vec<f32> = (0..rows * columns).map(|i| ((i * 7919) % 997) as f32 / 500.0 - 1.0).collect();
        let source = Tensor::from_vec(values, &[rows, columns]).unwrap();
        let x: Vec<f32> = (0..columns).map(|i| ((i * 31) % 17) as f32 / 8.0 - 1.0).collect();
        for bits in [2, 4, 8] {
            for group in [32, 64, 128] {
                let weight = AffineWeight::quantize(&source, AffineSpec::new(bits, group).unwrap()).unwrap();
                let dense = weight.dequantize().unwrap().to_vec::<f32>().unwrap();
                let words = weight.weight.to_vec::<u32>().unwrap();
                let (scales, biases) = (weight.scales.to_vec::<f32>().unwrap(), weight.biases.to_vec::<f32>().unwrap());
                let y = affine_gemv(bits, group, Rounding::F32, &words, &scales, &biases, &x).unwrap();
                for (row, &value) in y.iter().enumerate() {
                    let expected: f32 =
                        dense[row * columns..(row + 1) * columns].iter().zip(&x).map(|(w, x)| w * x).sum();
                    assert!(
                        (value - expected).abs() <= 1e-4 * (1.0 + expected.abs()),
                        "Q{bits} g{group} row {row}: {value} vs {expected}"
                    );
                }
                // The baseline kernel agrees with the one selected.
                let baseline = match bits {
                    2 => row::<2>,
                    4 => row::<4>,
                    _ => row::<8>,
                };
                let groups = columns / group;
                let x_sums: Vec<f32> = x.chunks_exact(group).map(|chunk| chunk.iter().sum()).collect();
                let row_words = columns * bits as usize / 32;
                let first = baseline(group, &words[..row_words], &scales[..groups], &biases[..groups], &x, &x_sums);
                assert!((first - y[0]).abs() <= 1e-5 * (1.0 + first.abs()));
            }
        }
        assert!(affine_gemv(3, 64, Rounding::F32, &[], &[], &[], &[0.0; 64]).is_none());
    }

    #[test]
    fn one_row_products_use_the_dequantized_weight_for_every_scale_dtype() {
        use crate::quant::QuantizedLinear;
        let (rows, columns) = (29, 384);
        let values: Vec<f32> = (0..rows * columns).map(|i| ((i * 7919) % 991) as f32 / 400.0 - 1.2).collect();
        let x: Vec<f32> = (0..columns).map(|i| ((i * 37) % 19) as f32 / 9.0 - 1.0).collect();
        let input = Tensor::from_vec(x.clone(), &[1, columns]).unwrap();
        for dtype in [crate::DType::F32, crate::DType::BF16, crate::DType::F16] {
            let source = Tensor::from_vec(values.clone(), &[rows, columns]).unwrap().to_dtype(dtype).unwrap();
            for (bits, group) in [(4, 64), (4, 128), (4, 32), (2, 64), (8, 128), (3, 64)] {
                let weight = AffineWeight::quantize(&source, AffineSpec::new(bits, group).unwrap()).unwrap();
                let dense = weight.dequantize().unwrap().to_f32_vec().unwrap();
                let layer = QuantizedLinear::new(weight, None).unwrap();
                let y = layer.forward(&input).unwrap().to_vec::<f32>().unwrap();
                for (row, &value) in y.iter().enumerate() {
                    let products = dense[row * columns..(row + 1) * columns].iter().zip(&x);
                    let expected: f64 = products.clone().map(|(w, x)| f64::from(*w) * f64::from(*x)).sum();
                    let scale: f64 = products.map(|(w, x)| f64::from((w * x).abs())).sum();
                    assert!(
                        (f64::from(value) - expected).abs() <= 2e-6 * (1.0 + scale),
                        "{dtype:?} Q{bits} g{group} row {row}: {value} vs {expected}"
                    );
                }
            }
        }
    }

    #[test]
    fn seed_products_use_the_decoded_weight() {
        use crate::quant::{SeedEncoding, SeedLinear, SeedWeight};
        let (slices, rows, columns) = (2, 19, 96);
        let blocks = columns / 8;
        let count = slices * rows * blocks;
        let seeds: Vec<u16> = (0..count).map(|i| (i as u16).wrapping_mul(40503).max(1)).collect();
        let words: Vec<u16> = (0..count).map(|i| (i as u16).wrapping_mul(25173).wrapping_add(13849)).collect();
        let codes: Vec<u8> = (0..count / 2).map(|i| (i as u8).wrapping_mul(37)).collect();
        let x: Vec<f32> = (0..columns).map(|i| ((i * 13) % 23) as f32 / 11.0 - 1.0).collect();
        let input = Tensor::from_vec(x.clone(), &[1, columns]).unwrap();
        for encoding in [SeedEncoding::Seed4, SeedEncoding::Seed4P4] {
            // A normal exponent range (the register kernel) and one past it (decoding rows).
            for bias in [-20, -140, 100] {
                let weight = SeedWeight::new(
                    encoding,
                    Tensor::from_vec(seeds.clone(), &[slices, rows, blocks]).unwrap(),
                    Tensor::from_vec(words.clone(), &[slices, rows, blocks]).unwrap(),
                    Tensor::from_vec(vec![bias, bias + 3], &[slices]).unwrap(),
                    (encoding == SeedEncoding::Seed4P4)
                        .then(|| Tensor::from_vec(codes.clone(), &[slices, rows, blocks / 2]).unwrap()),
                )
                .unwrap();
                let dense = weight.decode().unwrap().to_vec::<half::bf16>().unwrap();
                let layer = SeedLinear::new(weight, None).unwrap();
                for slice in 0..slices {
                    let y = layer.forward_slice(&input, slice).unwrap().to_vec::<f32>().unwrap();
                    for (row, &value) in y.iter().enumerate() {
                        let at = (slice * rows + row) * columns;
                        let expected: f64 = dense[at..at + columns]
                            .iter()
                            .zip(&x)
                            .map(|(w, x)| f64::from(w.to_f32()) * f64::from(*x))
                            .sum();
                        let scale: f64 = dense[at..at + columns]
                            .iter()
                            .zip(&x)
                            .map(|(w, x)| f64::from((w.to_f32() * x).abs()))
                            .sum();
                        assert!(
                            (f64::from(value) - expected).abs() <= 1e-5 * (1.0 + scale),
                            "{encoding:?} bias {bias} slice {slice} row {row}: {value} vs {expected}"
                        );
                    }
                }
            }
        }
    }
}
