//! The kernels for AVX2 with FMA and F16C: the portable kernels' arithmetic, 32 values to a
//! register. A weight block's integers are unpacked into a register once for the whole tile of
//! activation rows; `maddubs` multiplies them with an activation block's bytes (an unsigned by
//! a signed byte, adjacent pairs summed to 16 bits, which cannot saturate for these ranges: at
//! most `2 * 128 * 127`), `madd` sums pairs again to 8 lanes of 32 bits, and one fused
//! multiply-add scales those lanes into the row's float sums. Weights unpack unsigned (offsets
//! and minimums go through the activation sums), except Q8_0's, whose signs move onto the
//! activations (`|w| * sign(w) x`). The 32-value types go 8 blocks at a time, so that their f16
//! scales widen in one instruction and meet 8 activation scales in one multiplication. Blocks
//! alternate between two sets of sums so that consecutive additions do not wait on each other.

use std::arch::x86_64::*;

use super::{Act, scales_mins};
use crate::quant::ggml::GgmlType;

/// The kernels' instruction levels above AVX2, FMA and F16C, each including the one below.
/// [`VNNI`]: AVX-VNNI, whose `vpdpbusd` does `maddubs` and `madd` in one instruction (and
/// without their 16-bit intermediate).
const PLAIN: u8 = 0;
/// See [`PLAIN`].
const VNNI: u8 = 1;
/// [`VNNI`] and AVX-512 BW and VL: the fifth bits of Q5_0 and Q5_1 go from a mask register
/// straight into a masked byte addition (2 instructions instead of 6).
const MASKS: u8 = 2;

/// Proof that the processor has AVX2, FMA and F16C: only [`Avx2::detect`] makes one. It also
/// holds the highest level ([`PLAIN`], [`VNNI`], [`MASKS`]) the processor has.
#[derive(Clone, Copy, Debug)]
pub(super) struct Avx2 {
    level: u8,
}

impl Avx2 {
    /// The proof, where the processor has the instructions.
    pub(super) fn detect() -> Option<Avx2> {
        let found =
            is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c");
        let masks = is_x86_feature_detected!("avx512bw") && is_x86_feature_detected!("avx512vl");
        let level = match (is_x86_feature_detected!("avxvnni"), masks) {
            (true, true) => MASKS,
            (true, false) => VNNI,
            (false, _) => PLAIN,
        };
        found.then_some(Avx2 { level })
    }

    /// The kernels of every level up to this one, for comparing them.
    #[cfg(test)]
    pub(super) fn levels(self) -> Vec<Avx2> {
        (PLAIN..=self.level).map(|level| Avx2 { level }).collect()
    }

    /// The outputs of one weight row of `ty` for `N` activation rows.
    pub(super) fn tile<const N: usize>(self, ty: GgmlType, weight: &[u8], acts: &[Act<'_>; N]) -> [f32; N] {
        match self.level {
            PLAIN => self.kernel::<N, PLAIN>(ty, weight, acts),
            VNNI => self.kernel::<N, VNNI>(ty, weight, acts),
            _ => self.kernel::<N, MASKS>(ty, weight, acts),
        }
    }

    /// The outputs of the weight rows of `ty` in `weight` (`out.len()` of them) for one
    /// activation row.
    pub(super) fn rows(self, ty: GgmlType, weight: &[u8], act: Act<'_>, out: &mut [f32]) {
        // SAFETY: as in `kernel`.
        unsafe {
            match self.level {
                PLAIN => rows::<PLAIN>(ty, weight, act, out),
                VNNI => rows::<VNNI>(ty, weight, act, out),
                _ => rows::<MASKS>(ty, weight, act, out),
            }
        }
    }

    /// The outputs of the F32, F16 or BF16 rows in `weight` (`out.len()` of them) for the
    /// activation row `x`, each value widened in a register and multiplied there (no decoded
    /// copy of the row), with the bytes ahead asked for as in [`rows`].
    pub(super) fn float_rows(self, ty: GgmlType, weight: &[u8], x: &[f32], out: &mut [f32]) {
        // SAFETY: `self` exists, so `detect` found AVX2, FMA and F16C.
        unsafe {
            match ty {
                GgmlType::F32 => float_rows::<4>(weight, x, out),
                GgmlType::F16 => float_rows::<2>(weight, x, out),
                GgmlType::BF16 => float_rows::<{ BF16 }>(weight, x, out),
                _ => unreachable!("{ty} is not a float type"),
            }
        }
    }

    /// [`Avx2::tile`] on the instructions of `LEVEL`.
    fn kernel<const N: usize, const LEVEL: u8>(self, ty: GgmlType, weight: &[u8], acts: &[Act<'_>; N]) -> [f32; N] {
        // SAFETY: `self` exists, so `detect` found AVX2, FMA and F16C, all the kernels enable,
        // and those of `LEVEL` where it is above `PLAIN`.
        unsafe {
            match ty {
                GgmlType::Q4_0 => small::<Q4_0, 18, N, LEVEL>(weight, acts),
                GgmlType::Q4_1 => small::<Q4_1, 20, N, LEVEL>(weight, acts),
                GgmlType::Q5_0 => small::<Q5_0, 22, N, LEVEL>(weight, acts),
                GgmlType::Q5_1 => small::<Q5_1, 24, N, LEVEL>(weight, acts),
                GgmlType::Q8_0 => small::<Q8_0, 34, N, LEVEL>(weight, acts),
                GgmlType::MXFP4 => small::<MXFP4, 17, N, LEVEL>(weight, acts),
                GgmlType::Q4_K => k_quant::<N, 144, false, LEVEL>(weight, acts),
                GgmlType::Q5_K => k_quant::<N, 176, true, LEVEL>(weight, acts),
                GgmlType::Q6_K => q6_k(weight, acts),
                _ => unreachable!("{ty} has no integer kernel"),
            }
        }
    }
}

/// How far ahead of the row being multiplied [`rows`] asks for the weight's bytes. A
/// decoded token reads every weight once, from memory rather than cache, and the hardware's
/// own prefetching follows rows of a few hundred bytes poorly: asking 2 KiB ahead nearly
/// doubles the bytes per second of a product of rows of 576 Q8_0 values.
const PREFETCH_AHEAD: usize = 2048;

/// [`Avx2::rows`], each type's row kernel inlined into its loop over the rows, with the bytes
/// [`PREFETCH_AHEAD`] of each row asked for before it is multiplied.
#[target_feature(enable = "avx2,fma,f16c")]
fn rows<const LEVEL: u8>(ty: GgmlType, weight: &[u8], act: Act<'_>, out: &mut [f32]) {
    let row_bytes = (weight.len() / out.len().max(1)).max(1);
    let acts = [act];
    let rows = weight.chunks_exact(row_bytes).zip(out).enumerate().map(|(i, pair)| {
        let ahead = weight.get(i * row_bytes + PREFETCH_AHEAD..).unwrap_or_default();
        for line in ahead[..row_bytes.min(ahead.len())].chunks(64) {
            _mm_prefetch::<_MM_HINT_T0>(line.as_ptr().cast());
        }
        pair
    });
    match ty {
        GgmlType::Q4_0 => rows.for_each(|(row, out)| *out = small::<Q4_0, 18, 1, LEVEL>(row, &acts)[0]),
        GgmlType::Q4_1 => rows.for_each(|(row, out)| *out = small::<Q4_1, 20, 1, LEVEL>(row, &acts)[0]),
        GgmlType::Q5_0 => rows.for_each(|(row, out)| *out = small::<Q5_0, 22, 1, LEVEL>(row, &acts)[0]),
        GgmlType::Q5_1 => rows.for_each(|(row, out)| *out = small::<Q5_1, 24, 1, LEVEL>(row, &acts)[0]),
        GgmlType::Q8_0 => rows.for_each(|(row, out)| *out = small::<Q8_0, 34, 1, LEVEL>(row, &acts)[0]),
        GgmlType::MXFP4 => rows.for_each(|(row, out)| *out = small::<MXFP4, 17, 1, LEVEL>(row, &acts)[0]),
        GgmlType::Q4_K => rows.for_each(|(row, out)| *out = k_quant::<1, 144, false, LEVEL>(row, &acts)[0]),
        GgmlType::Q5_K => rows.for_each(|(row, out)| *out = k_quant::<1, 176, true, LEVEL>(row, &acts)[0]),
        GgmlType::Q6_K => rows.for_each(|(row, out)| *out = q6_k(row, &acts)[0]),
        _ => unreachable!("{ty} has no integer kernel"),
    }
}

/// [`float_rows`]'s width parameter for BF16 (2 bytes like F16, widened differently).
const BF16: usize = 3;

/// 8 values of a float row at value `at`: F32 (`W` 4), F16 (`W` 2) or BF16 (`W` [`BF16`]).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn widen8<const W: usize>(row: &[u8], at: usize) -> __m256 {
    match W {
        4 => _mm256_castsi256_ps(load256(&row[4 * at..])),
        2 => _mm256_cvtph_ps(load128(&row[2 * at..])),
        _ => _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(load128(&row[2 * at..])))),
    }
}

/// [`Avx2::float_rows`]: 32 values a step in four sums, a tail of fewer than 32 one at a time.
#[target_feature(enable = "avx2,fma,f16c")]
fn float_rows<const W: usize>(weight: &[u8], x: &[f32], out: &mut [f32]) {
    let row_bytes = (weight.len() / out.len().max(1)).max(1);
    let width = x.len();
    let whole = width / 32 * 32;
    for (i, (row, out)) in weight.chunks_exact(row_bytes).zip(out).enumerate() {
        let ahead = weight.get(i * row_bytes + PREFETCH_AHEAD..).unwrap_or_default();
        for line in ahead[..row_bytes.min(ahead.len())].chunks(64) {
            _mm_prefetch::<_MM_HINT_T0>(line.as_ptr().cast());
        }
        let mut sums = [_mm256_setzero_ps(); 4];
        for at in (0..whole).step_by(32) {
            for (k, sum) in sums.iter_mut().enumerate() {
                let xs = load_scales(&x[at + 8 * k..]);
                *sum = _mm256_fmadd_ps(widen8::<W>(row, at + 8 * k), xs, *sum);
            }
        }
        let mut total = hsum(_mm256_add_ps(_mm256_add_ps(sums[0], sums[1]), _mm256_add_ps(sums[2], sums[3])));
        for at in whole..width {
            let value = match W {
                4 => f32::from_le_bytes([row[4 * at], row[4 * at + 1], row[4 * at + 2], row[4 * at + 3]]),
                2 => half(row, 2 * at),
                _ => f32::from_bits(u32::from(u16::from_le_bytes([row[2 * at], row[2 * at + 1]])) << 16),
            };
            total += value * x[at];
        }
        *out = total;
    }
}

/// The f16 stored little-endian at `at`, widened by the F16C instruction.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn half(bytes: &[u8], at: usize) -> f32 {
    let bits = u16::from_le_bytes([bytes[at], bytes[at + 1]]);
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits))))
}

/// The first 16 bytes of `bytes`.
#[inline]
#[target_feature(enable = "avx2")]
fn load128(bytes: &[u8]) -> __m128i {
    let bytes: &[u8; 16] = bytes.first_chunk().expect("16 bytes to load");
    // SAFETY: the load reads the 16 bytes of `bytes` and takes any alignment.
    unsafe { _mm_loadu_si128(bytes.as_ptr().cast()) }
}

/// The first 32 bytes of `bytes`.
#[inline]
#[target_feature(enable = "avx2")]
fn load256(bytes: &[u8]) -> __m256i {
    let bytes: &[u8; 32] = bytes.first_chunk().expect("32 bytes to load");
    // SAFETY: the load reads the 32 bytes of `bytes` and takes any alignment.
    unsafe { _mm256_loadu_si256(bytes.as_ptr().cast()) }
}

/// An activation block's 32 integers.
#[inline]
#[target_feature(enable = "avx2")]
fn load_act(q: &[i8; 32]) -> __m256i {
    // SAFETY: the load reads the 32 bytes of `q` and takes any alignment.
    unsafe { _mm256_loadu_si256(q.as_ptr().cast()) }
}

/// The scales of 8 consecutive activation blocks.
#[inline]
#[target_feature(enable = "avx2")]
fn load_scales(d: &[f32]) -> __m256 {
    let d: &[f32; 8] = d.first_chunk().expect("8 scales to load");
    // SAFETY: the load reads the 8 floats of `d` and takes any alignment.
    unsafe { _mm256_loadu_ps(d.as_ptr()) }
}

/// The 16 half sums of 8 consecutive activation blocks, as 16-bit lanes.
#[inline]
#[target_feature(enable = "avx2")]
fn load_sums(sums: &[[i16; 2]]) -> __m256i {
    let sums: &[[i16; 2]; 8] = sums.first_chunk().expect("8 blocks of sums to load");
    // SAFETY: the load reads the 32 bytes of `sums` and takes any alignment.
    unsafe { _mm256_loadu_si256(sums.as_ptr().cast()) }
}

/// The lanes of `v`.
#[inline]
#[target_feature(enable = "avx2")]
fn lanes(v: __m256) -> [f32; 8] {
    let mut out = [0f32; 8];
    // SAFETY: the store writes the 8 floats of `out` and takes any alignment.
    unsafe { _mm256_storeu_ps(out.as_mut_ptr(), v) };
    out
}

/// 8 bytes as 8 float lanes.
#[inline]
#[target_feature(enable = "avx2")]
fn widen(bytes: [u8; 8]) -> __m256 {
    _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(i64::from_le_bytes(bytes))))
}

/// The sum of the lanes of `v`.
#[inline]
#[target_feature(enable = "avx2")]
fn hsum(v: __m256) -> f32 {
    let quad = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let pair = _mm_add_ps(quad, _mm_movehl_ps(quad, quad));
    _mm_cvtss_f32(_mm_add_ss(pair, _mm_movehdup_ps(pair)))
}

/// `sum w_i x_i` over 32 byte pairs, in 8 lanes of 4 products: `w` unsigned, `x` signed. From
/// [`VNNI`] on, one `vpdpbusd` (VEX-encoded, AVX-VNNI), written as assembly so that the kernels
/// need not be compiled once per set of target features; the caller must have checked for
/// AVX-VNNI.
#[inline]
#[target_feature(enable = "avx2")]
fn dot_unsigned<const LEVEL: u8>(w: __m256i, x: __m256i) -> __m256i {
    if LEVEL >= VNNI {
        let mut sums = _mm256_setzero_si256();
        // SAFETY: the instruction only reads and writes the three registers; `Avx2::kernel`
        // runs `VNNI` and `MASKS` kernels only where `detect` found AVX-VNNI.
        unsafe {
            std::arch::asm!(
                "{{vex}} vpdpbusd {sums}, {w}, {x}",
                sums = inout(ymm_reg) sums,
                w = in(ymm_reg) w,
                x = in(ymm_reg) x,
                options(pure, nomem, nostack, preserves_flags),
            );
        }
        sums
    } else {
        _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1))
    }
}

/// `sum w_i x_i` over 32 byte pairs, in 8 lanes of 4 products, both signed.
#[inline]
#[target_feature(enable = "avx2")]
fn dot_signed<const LEVEL: u8>(w: __m256i, x: __m256i) -> __m256i {
    dot_unsigned::<LEVEL>(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w))
}

/// 16 in byte `i` where bit `i` of `high` is set: byte `i` takes byte `i / 8` of the word,
/// keeps bit `i % 8`, and compares.
#[inline]
#[target_feature(enable = "avx2")]
fn fifth_bits(high: u32) -> __m256i {
    let spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32(high as i32),
        _mm256_set_epi64x(0x0303_0303_0303_0303, 0x0202_0202_0202_0202, 0x0101_0101_0101_0101, 0),
    );
    let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201_u64 as i64);
    _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit), _mm256_set1_epi8(0x10))
}

/// `q` plus 16 in byte `i` where bit `i` of `high` is set: the word becomes a mask register
/// and one masked byte addition applies it (AVX-512 BW and VL, written as assembly like
/// [`dot_unsigned`]; the caller must have checked for them).
#[inline]
#[target_feature(enable = "avx2")]
fn add_sixteen_where(q: __m256i, high: u32) -> __m256i {
    let mut q = q;
    // SAFETY: the instructions read `high` and the two vector registers and write `q` and the
    // clobbered `k1`; `Avx2::kernel` runs `MASKS` kernels only where `detect` found AVX-512 BW
    // and VL.
    unsafe {
        std::arch::asm!(
            "kmovd k1, {high:e}",
            "vpaddb {q}{{k1}}, {q}, {sixteen}",
            high = in(reg) high,
            q = inout(ymm_reg) q,
            sixteen = in(ymm_reg) _mm256_set1_epi8(16),
            out("k1") _,
            options(pure, nomem, nostack, preserves_flags),
        );
    }
    q
}

/// The 32-value types, as the const parameter of [`small`] (each compiled on its own).
const Q4_0: u8 = 0;
const Q4_1: u8 = 1;
const Q5_0: u8 = 2;
const Q5_1: u8 = 3;
const Q8_0: u8 = 4;
/// MXFP4: E2M1 codes looked up as signed integers, the doubled values of
/// [`KVALUES_FP4`](crate::quant::ggml::grids::KVALUES_FP4), under a halved E8M0 scale.
const MXFP4: u8 = 5;

/// [`KVALUES_FP4`](crate::quant::ggml::grids::KVALUES_FP4) as the bytes of a lookup register.
const FP4_BYTES: [u8; 16] = {
    let mut bytes = [0u8; 16];
    let mut i = 0;
    while i < 16 {
        bytes[i] = crate::quant::ggml::grids::KVALUES_FP4[i] as u8;
        i += 1;
    }
    bytes
};

/// A block's 32 integers in value order: unsigned for the 4- and 5-bit types, signed for
/// Q8_0. The 16 bytes of nibbles fill both halves of the register (a load, no shuffle), and
/// shifting the high half's 32-bit lanes by 4 brings its high nibbles down.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn unpack<const T: u8, const B: usize, const LEVEL: u8>(block: &[u8; B]) -> __m256i {
    let (high, qs) = match T {
        MXFP4 => {
            let packed = _mm256_broadcastsi128_si256(load128(&block[1..]));
            let shifts = _mm256_set_epi32(4, 4, 4, 4, 0, 0, 0, 0);
            let codes = _mm256_and_si256(_mm256_srlv_epi32(packed, shifts), _mm256_set1_epi8(0x0f));
            let table = _mm256_broadcastsi128_si256(load128(&FP4_BYTES));
            return _mm256_shuffle_epi8(table, codes);
        }
        Q4_0 => (None, 2),
        Q4_1 => (None, 4),
        Q5_0 => (Some(2), 6),
        Q5_1 => (Some(4), 8),
        _ => return load256(&block[2..]),
    };
    let packed = _mm256_broadcastsi128_si256(load128(&block[qs..]));
    let shifts = _mm256_set_epi32(4, 4, 4, 4, 0, 0, 0, 0);
    let q = _mm256_and_si256(_mm256_srlv_epi32(packed, shifts), _mm256_set1_epi8(0x0f));
    match high {
        Some(at) => {
            let high = u32::from_le_bytes([block[at], block[at + 1], block[at + 2], block[at + 3]]);
            if LEVEL >= MASKS { add_sixteen_where(q, high) } else { _mm256_or_si256(q, fifth_bits(high)) }
        }
        None => q,
    }
}

/// The f16 at byte `at` of each of 8 blocks, widened.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn halves<const B: usize>(group: &[[u8; B]; 8], at: usize) -> __m256 {
    let bits = |k: usize| i16::from_le_bytes([group[k][at], group[k][at + 1]]);
    _mm256_cvtph_ps(_mm_set_epi16(bits(7), bits(6), bits(5), bits(4), bits(3), bits(2), bits(1), bits(0)))
}

/// The halved E8M0 scales of 8 MXFP4 blocks (their first bytes), widened.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn exponents<const B: usize>(group: &[[u8; B]; 8]) -> __m256 {
    let d = |k: usize| crate::quant::ggml::dequant::e8m0_half(group[k][0]);
    _mm256_set_ps(d(7), d(6), d(5), d(4), d(3), d(2), d(1), d(0))
}

/// Sums of the activation rows of a tile: two sets for the blocks' products, taken in turn
/// so that consecutive additions do not wait on each other, and one for the constant terms.
type Sums<const N: usize> = [[__m256; N]; 3];

/// Adds a group of 8 blocks of a 32-value type, the blocks `first..first + 8` of the rows of
/// `acts`, to the sums of each activation row. A block's values are `d * q + c`, with `c` its
/// minimum or `-offset * d`, so it adds `d * dx * dot + c * dx * sum(x)`; the blocks' scales
/// and minimums are widened 8 at a time, and multiplied with 8 activation blocks' `dx` and
/// `dx * sum(x)` at once.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn small_group<const T: u8, const B: usize, const N: usize, const LEVEL: u8>(
    group: &[[u8; B]; 8],
    acts: &[Act<'_>; N],
    first: usize,
    sums: Sums<N>,
) -> Sums<N> {
    let [mut even, mut odd, mut constants] = sums;
    let d = if T == MXFP4 { exponents(group) } else { halves(group, 0) };
    let constant = match T {
        Q4_0 => Some(_mm256_mul_ps(d, _mm256_set1_ps(-8.0))),
        Q5_0 => Some(_mm256_mul_ps(d, _mm256_set1_ps(-16.0))),
        Q4_1 | Q5_1 => Some(halves(group, 2)),
        _ => None,
    };
    let mut steps = [[0f32; 8]; N];
    let mut xs: [&[[i8; 32]; 8]; N] = [&[[0; 32]; 8]; N];
    for r in 0..N {
        steps[r] = lanes(_mm256_mul_ps(d, load_scales(&acts[r].d[first..])));
        if let Some(constant) = constant {
            constants[r] = _mm256_fmadd_ps(constant, load_scales(&acts[r].ds[first..]), constants[r]);
        }
        xs[r] = acts[r].q[first..].first_chunk().expect("8 activation blocks");
    }
    let add = |k: usize, r: usize, w: __m256i, sum: __m256| -> __m256 {
        let x = load_act(&xs[r][k]);
        let products = if T == Q8_0 || T == MXFP4 { dot_signed::<LEVEL>(w, x) } else { dot_unsigned::<LEVEL>(w, x) };
        _mm256_fmadd_ps(_mm256_cvtepi32_ps(products), _mm256_set1_ps(steps[r][k]), sum)
    };
    for pair in 0..4 {
        let (first_block, second_block) =
            (unpack::<T, B, LEVEL>(&group[2 * pair]), unpack::<T, B, LEVEL>(&group[2 * pair + 1]));
        for r in 0..N {
            even[r] = add(2 * pair, r, first_block, even[r]);
            odd[r] = add(2 * pair + 1, r, second_block, odd[r]);
        }
    }
    [even, odd, constants]
}

/// Rows of the 32-value type `T`, `B` bytes a block, 8 blocks at a time. A row's last blocks,
/// when fewer than 8, go one at a time (rows of 576 values, common in small models, end in 2).
#[target_feature(enable = "avx2,fma,f16c")]
fn small<const T: u8, const B: usize, const N: usize, const LEVEL: u8>(weight: &[u8], acts: &[Act<'_>; N]) -> [f32; N] {
    let mut sums = [[_mm256_setzero_ps(); N]; 3];
    let (groups, tail) = weight.as_chunks::<B>().0.as_chunks::<8>();
    for (g, group) in groups.iter().enumerate() {
        sums = small_group::<T, B, N, LEVEL>(group, acts, 8 * g, sums);
    }
    let mut constants = [0f32; N];
    for (k, block) in tail.iter().enumerate() {
        let k = 8 * groups.len() + k;
        let d = if T == MXFP4 { crate::quant::ggml::dequant::e8m0_half(block[0]) } else { half(block, 0) };
        let constant = match T {
            Q4_0 => -8.0 * d,
            Q5_0 => -16.0 * d,
            Q4_1 | Q5_1 => half(block, 2),
            _ => 0.0,
        };
        let w = unpack::<T, B, LEVEL>(block);
        for r in 0..N {
            let x = load_act(&acts[r].q[k]);
            let products =
                if T == Q8_0 || T == MXFP4 { dot_signed::<LEVEL>(w, x) } else { dot_unsigned::<LEVEL>(w, x) };
            sums[0][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(products), _mm256_set1_ps(d * acts[r].d[k]), sums[0][r]);
            constants[r] += constant * acts[r].ds[k];
        }
    }
    let mut out = [0f32; N];
    for r in 0..N {
        out[r] = hsum(_mm256_add_ps(_mm256_add_ps(sums[0][r], sums[1][r]), sums[2][r])) + constants[r];
    }
    out
}

/// Q4_K (`FIFTH` false, 144 bytes) and Q5_K (`FIFTH` true, 176 bytes) rows. Per super-block,
/// the 8 sub-blocks' `d * scale * dx` are one vector product per activation row, and the
/// minimums' share `dmin * min * dx * sum(x)` is taken off the sums with one more. Chunk `c`
/// unpacks 32 bytes of `qs` into two registers (low and high nibbles, sub-blocks `2c` and
/// `2c + 1`); Q5_K's fifth bits come from bits `2c`, `2c + 1` of `qh`, shifted down by 2 per
/// chunk (16-bit shifts: the bits that cross into the neighbouring byte are masked off).
#[target_feature(enable = "avx2,fma,f16c")]
fn k_quant<const N: usize, const BYTES: usize, const FIFTH: bool, const LEVEL: u8>(
    weight: &[u8],
    acts: &[Act<'_>; N],
) -> [f32; N] {
    let low4 = _mm256_set1_epi8(0x0f);
    let bit4 = _mm256_set1_epi8(0x10);
    let mut even = [_mm256_setzero_ps(); N];
    let mut odd = [_mm256_setzero_ps(); N];
    for (s, block) in weight.as_chunks::<BYTES>().0.iter().enumerate() {
        let (d, dmin) = (half(block, 0), half(block, 2));
        let (scales, mins) = scales_mins(block[4..16].try_into().expect("12 bytes of scales"));
        let scales = _mm256_mul_ps(_mm256_set1_ps(d), widen(scales));
        let mins = _mm256_mul_ps(_mm256_set1_ps(dmin), widen(mins));
        let mut steps = [[0f32; 8]; N];
        for r in 0..N {
            steps[r] = lanes(_mm256_mul_ps(scales, load_scales(&acts[r].d[8 * s..])));
            odd[r] = _mm256_fnmadd_ps(mins, load_scales(&acts[r].ds[8 * s..]), odd[r]);
        }
        let (qh, qs) = if FIFTH { (&block[16..48], &block[48..]) } else { (&block[..0], &block[16..]) };
        let mut high = if FIFTH { load256(qh) } else { _mm256_setzero_si256() };
        for c in 0..4 {
            let bits = load256(&qs[32 * c..]);
            let mut low = _mm256_and_si256(bits, low4);
            let mut top = _mm256_and_si256(_mm256_srli_epi16::<4>(bits), low4);
            if FIFTH {
                low = _mm256_or_si256(low, _mm256_and_si256(_mm256_slli_epi16::<4>(high), bit4));
                top = _mm256_or_si256(top, _mm256_and_si256(_mm256_slli_epi16::<3>(high), bit4));
                high = _mm256_srli_epi16::<2>(high);
            }
            let b = 8 * s + 2 * c;
            for r in 0..N {
                let products = _mm256_cvtepi32_ps(dot_unsigned::<LEVEL>(low, load_act(&acts[r].q[b])));
                even[r] = _mm256_fmadd_ps(products, _mm256_set1_ps(steps[r][2 * c]), even[r]);
                let products = _mm256_cvtepi32_ps(dot_unsigned::<LEVEL>(top, load_act(&acts[r].q[b + 1])));
                odd[r] = _mm256_fmadd_ps(products, _mm256_set1_ps(steps[r][2 * c + 1]), odd[r]);
            }
        }
    }
    let mut out = [0f32; N];
    for r in 0..N {
        out[r] = hsum(_mm256_add_ps(even[r], odd[r]));
    }
    out
}

/// A shuffle that fills the low half of a register with 16-bit lane `2k` of each half and the
/// high half with lane `2k + 1`: the scales of the two groups of 16 of Q6_K's `k`-th 32 values.
#[inline]
#[target_feature(enable = "avx2")]
fn scale_pair(k: i16) -> __m256i {
    let lane = |i: i16| _mm_set1_epi16(((2 * i + 1) << 8) | (2 * i));
    _mm256_set_m128i(lane(2 * k + 1), lane(2 * k))
}

/// Q6_K rows. The unsigned 6-bit values (0-63) meet the activations in `maddubs`, and `madd`
/// with the groups' scales (16-bit, 8 lanes per group of 16) sums them; the `- 32` is taken
/// off per super-block through the activation half sums, one `madd` with the 16 scales.
#[target_feature(enable = "avx2,fma,f16c")]
fn q6_k<const N: usize>(weight: &[u8], acts: &[Act<'_>; N]) -> [f32; N] {
    let low4 = _mm256_set1_epi8(0x0f);
    let bits45 = _mm256_set1_epi8(0x30);
    let pairs = [scale_pair(0), scale_pair(1), scale_pair(2), scale_pair(3)];
    let mut even = [_mm256_setzero_ps(); N];
    let mut odd = [_mm256_setzero_ps(); N];
    for (s, block) in weight.as_chunks::<210>().0.iter().enumerate() {
        let d = half(block, 208);
        let scales = _mm256_cvtepi8_epi16(load128(&block[192..]));
        let mut steps = [[0f32; 8]; N];
        for r in 0..N {
            let step = _mm256_mul_ps(_mm256_set1_ps(d), load_scales(&acts[r].d[8 * s..]));
            steps[r] = lanes(step);
            let offsets = _mm256_cvtepi32_ps(_mm256_madd_epi16(scales, load_sums(&acts[r].sums[8 * s..])));
            odd[r] = _mm256_fnmadd_ps(_mm256_mul_ps(step, _mm256_set1_ps(32.0)), offsets, odd[r]);
        }
        for h in 0..2 {
            let ql0 = load256(&block[64 * h..]);
            let ql1 = load256(&block[64 * h + 32..]);
            let qh = load256(&block[128 + 32 * h..]);
            let q = [
                _mm256_or_si256(_mm256_and_si256(ql0, low4), _mm256_and_si256(_mm256_slli_epi16::<4>(qh), bits45)),
                _mm256_or_si256(_mm256_and_si256(ql1, low4), _mm256_and_si256(_mm256_slli_epi16::<2>(qh), bits45)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(ql0), low4), _mm256_and_si256(qh, bits45)),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16::<4>(ql1), low4),
                    _mm256_and_si256(_mm256_srli_epi16::<2>(qh), bits45),
                ),
            ];
            let group_scales = u64::from_le_bytes(block[192 + 8 * h..200 + 8 * h].try_into().expect("8 scales"));
            let group_scales = _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(_mm_cvtsi64_si128(group_scales as i64)));
            for k in 0..4 {
                let scale = _mm256_shuffle_epi8(group_scales, pairs[k]);
                let b = 8 * s + 4 * h + k;
                let sums = if k % 2 == 0 { &mut even } else { &mut odd };
                for r in 0..N {
                    let products = _mm256_madd_epi16(_mm256_maddubs_epi16(q[k], load_act(&acts[r].q[b])), scale);
                    let step = _mm256_set1_ps(steps[r][4 * h + k]);
                    sums[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(products), step, sums[r]);
                }
            }
        }
    }
    let mut out = [0f32; N];
    for r in 0..N {
        out[r] = hsum(_mm256_add_ps(even[r], odd[r]));
    }
    out
}
