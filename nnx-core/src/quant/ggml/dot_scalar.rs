//! The portable kernels, the reference for the vector ones: each weight block is unpacked
//! once into small integers (`i8`, in value order), and each 32 of them meet an activation
//! block in an integer dot product that the compiler vectorises for the baseline target; one
//! float multiply-add per 32 values then scales it. A port to another instruction set (NEON's
//! `sdot`) replaces [`dot32`] and the unpacking, block by block, and keeps the rest.

use super::{Act, f16_at, scales_mins};
use crate::quant::ggml::GgmlType;
use crate::quant::ggml::dequant::e8m0_half;
use crate::quant::ggml::grids::KVALUES_FP4;

/// The outputs of one weight row of `ty` for `N` activation rows.
pub(super) fn tile<const N: usize>(ty: GgmlType, weight: &[u8], acts: &[Act<'_>; N]) -> [f32; N] {
    match ty {
        GgmlType::Q4_0 => q4_0(weight, acts),
        GgmlType::Q4_1 => q4_1(weight, acts),
        GgmlType::Q5_0 => q5_0(weight, acts),
        GgmlType::Q5_1 => q5_1(weight, acts),
        GgmlType::Q8_0 => q8_0(weight, acts),
        GgmlType::MXFP4 => mxfp4(weight, acts),
        GgmlType::Q4_K => q4_k(weight, acts),
        GgmlType::Q5_K => q5_k(weight, acts),
        GgmlType::Q6_K => q6_k(weight, acts),
        _ => unreachable!("{ty} has no integer kernel"),
    }
}

/// `sum w_i x_i` over 32 values.
#[inline(always)]
fn dot32(w: &[i8; 32], x: &[i8; 32]) -> i32 {
    w.iter().zip(x).map(|(&w, &x)| i32::from(w) * i32::from(x)).sum()
}

/// `sum w_i x_i` over each half of 32 values.
#[inline(always)]
fn dot16x2(w: &[i8; 32], x: &[i8; 32]) -> [i32; 2] {
    let half = |at: usize| (at..at + 16).map(|i| i32::from(w[i]) * i32::from(x[i])).sum();
    [half(0), half(16)]
}

/// The 4-bit values of 16 bytes: low nibbles are values 0-15, high nibbles 16-31, each plus
/// the matching bit of `high` times 16.
#[inline(always)]
fn nibbles(packed: &[u8], high: u32) -> [i8; 32] {
    let mut q = [0i8; 32];
    for (j, &byte) in packed[..16].iter().enumerate() {
        let fifth = |bit: usize| (((high >> bit) & 1) << 4) as i8;
        q[j] = (byte & 0xf) as i8 + fifth(j);
        q[j + 16] = (byte >> 4) as i8 + fifth(j + 16);
    }
    q
}

/// The 32-value types, whose values are `d * q + c` with a constant `c` per block (a minimum,
/// or `-8 d` for an offset of 8): per block, `d * dx * dot + c * dx * sum(x)`. `unpack` gives
/// a block's `(d, c, integers)`.
#[inline(always)]
fn small<const N: usize, const BYTES: usize>(
    weight: &[u8],
    acts: &[Act<'_>; N],
    unpack: impl Fn(&[u8; BYTES]) -> (f32, f32, [i8; 32]),
) -> [f32; N] {
    let mut out = [0f32; N];
    for (b, block) in weight.as_chunks::<BYTES>().0.iter().enumerate() {
        let (d, c, q) = unpack(block);
        for (out, act) in out.iter_mut().zip(acts) {
            *out += d * act.d[b] * dot32(&q, &act.q[b]) as f32 + c * act.ds[b];
        }
    }
    out
}

fn q4_0<const N: usize>(weight: &[u8], acts: &[Act<'_>; N]) -> [f32; N] {
    small::<N, 18>(weight, acts, |block| {
        let d = f16_at(block, 0);
        (d, -8.0 * d, nibbles(&block[2..], 0))
    })
}

/// MXFP4: an E8M0 exponent, then Q4_0's nibble order of E2M1 codes, looked up as doubled
/// integers (the scale halved).
fn mxfp4<const N: usize>(weight: &[u8], acts: &[Act<'_>; N]) -> [f32; N] {
    small::<N, 17>(weight, acts, |block| {
        let q = nibbles(&block[1..], 0).map(|code| KVALUES_FP4[code as usize]);
        (e8m0_half(block[0]), 0.0, q)
    })
}

fn q4_1<const N: usize>(weight: &[u8], acts: &[Act<'_>; N]) -> [f32; N] {
    small::<N, 20>(weight, acts, |block| (f16_at(block, 0), f16_at(block, 2), nibbles(&block[4..], 0)))
}

fn q5_0<const N: usize>(weight: &[u8], acts: &[Act<'_>; N]) -> [f32; N] {
    small::<N, 22>(weight, acts, |block| {
        let d = f16_at(block, 0);
        let high = u32::from_le_bytes([block[2], block[3], block[4], block[5]]);
        (d, -16.0 * d, nibbles(&block[6..], high))
    })
}

fn q5_1<const N: usize>(weight: &[u8], acts: &[Act<'_>; N]) -> [f32; N] {
    small::<N, 24>(weight, acts, |block| {
        let high = u32::from_le_bytes([block[4], block[5], block[6], block[7]]);
        (f16_at(block, 0), f16_at(block, 2), nibbles(&block[8..], high))
    })
}

fn q8_0<const N: usize>(weight: &[u8], acts: &[Act<'_>; N]) -> [f32; N] {
    small::<N, 34>(weight, acts, |block| (f16_at(block, 0), 0.0, std::array::from_fn(|i| block[2 + i] as i8)))
}

/// Q4_K and Q5_K: per sub-block of 32, `d * scale * dot - dmin * min * sum(x)`. Chunk `c` of
/// 64 values reads bytes `32c..32c + 32` of `qs`: low nibbles are its first 32 values, high
/// nibbles the next 32; Q5_K's fifth bits are bits `2c` and `2c + 1` of `qh`.
#[inline(always)]
fn k_quant<const N: usize, const BYTES: usize>(weight: &[u8], acts: &[Act<'_>; N], fifth: bool) -> [f32; N] {
    let mut out = [0f32; N];
    for (s, block) in weight.as_chunks::<BYTES>().0.iter().enumerate() {
        let (d, dmin) = (f16_at(block, 0), f16_at(block, 2));
        let (scales, mins) = scales_mins(block[4..16].try_into().expect("12 bytes of scales"));
        let (qh, qs) = if fifth { (&block[16..48], &block[48..]) } else { (&block[..0], &block[16..]) };
        let mut q = [[0i8; 32]; 8];
        for c in 0..4 {
            for l in 0..32 {
                let byte = qs[32 * c + l];
                let high = |bit: usize| if fifth { ((qh[l] >> bit) & 1) << 4 } else { 0 };
                q[2 * c][l] = ((byte & 0xf) | high(2 * c)) as i8;
                q[2 * c + 1][l] = ((byte >> 4) | high(2 * c + 1)) as i8;
            }
        }
        for (out, act) in out.iter_mut().zip(acts) {
            for (j, q) in q.iter().enumerate() {
                let b = 8 * s + j;
                *out += d * f32::from(scales[j]) * act.d[b] * dot32(q, &act.q[b]) as f32
                    - dmin * f32::from(mins[j]) * act.ds[b];
            }
        }
    }
    out
}

fn q4_k<const N: usize>(weight: &[u8], acts: &[Act<'_>; N]) -> [f32; N] {
    k_quant::<N, 144>(weight, acts, false)
}

fn q5_k<const N: usize>(weight: &[u8], acts: &[Act<'_>; N]) -> [f32; N] {
    k_quant::<N, 176>(weight, acts, true)
}

/// Q6_K: per group of 16, `d * scale * (q - 32)` with `q` unsigned 6 bits. Each half of 128
/// values reads 64 bytes of `ql` and 32 of `qh`: for `l` in `0..32`, values `l`, `l + 32`,
/// `l + 64`, `l + 96` are the low nibble of `ql[l]`, of `ql[l + 32]`, the high nibble of
/// `ql[l]`, of `ql[l + 32]`, over bit pairs 0-1, 2-3, 4-5, 6-7 of `qh[l]`.
fn q6_k<const N: usize>(weight: &[u8], acts: &[Act<'_>; N]) -> [f32; N] {
    let mut out = [0f32; N];
    for (s, block) in weight.as_chunks::<210>().0.iter().enumerate() {
        let (ql, qh, scales) = (&block[..128], &block[128..192], &block[192..208]);
        let d = f16_at(block, 208);
        let mut q = [[0i8; 32]; 8];
        for h in 0..2 {
            let (ql, qh) = (&ql[64 * h..64 * h + 64], &qh[32 * h..32 * h + 32]);
            for l in 0..32 {
                let high = |k: usize| ((qh[l] >> (2 * k)) & 3) << 4;
                q[4 * h][l] = ((ql[l] & 0xf) | high(0)) as i8;
                q[4 * h + 1][l] = ((ql[l + 32] & 0xf) | high(1)) as i8;
                q[4 * h + 2][l] = ((ql[l] >> 4) | high(2)) as i8;
                q[4 * h + 3][l] = ((ql[l + 32] >> 4) | high(3)) as i8;
            }
        }
        for (out, act) in out.iter_mut().zip(acts) {
            for (j, q) in q.iter().enumerate() {
                let b = 8 * s + j;
                let [first, second] = [i32::from(scales[2 * j] as i8), i32::from(scales[2 * j + 1] as i8)];
                let [dot_first, dot_second] = dot16x2(q, &act.q[b]);
                let [sum_first, sum_second] = act.sums[b].map(i32::from);
                let total = first * (dot_first - 32 * sum_first) + second * (dot_second - 32 * sum_second);
                *out += d * act.d[b] * total as f32;
            }
        }
    }
    out
}
