//! Decoding of every block type to f32, bit-exact with the `gguf` Python package.
//!
//! gguf-py decodes with float32 numpy, one whole-array operation after another, so every
//! operation rounds on its own and none is fused. Each decoder here does the same f32 operations
//! in the same order (`(d * sc) * q - dmin * m`), though the order could not change a bit
//! anyway: an f16 scale times the small integers of a block needs at most 24 significant bits,
//! so every product is exact and only the final `+ m` or `- dmin * m` of Q4_1, Q5_1, Q2_K, Q4_K
//! and Q5_K rounds (which is also why a fused multiply-add gives the same bits).

use half::f16;

use super::grids::{
    IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID, KSIGNS_IQ2XS, KVALUES_FP4, KVALUES_IQ4NL,
};
use super::{GgmlType, check_row};
use crate::error::{Error, Result};

/// Decodes `bytes`, whole blocks of `ty`, into `out` (`out.len()` values).
///
/// The result has the same f32 bits as `gguf.quants.dequantize` of the `gguf` Python package
/// (and, for the integer types and F64, as numpy's `astype(float32)`): a NaN or infinite scale
/// gives NaN or infinite values, never an error.
///
/// # Errors
/// [`Error::GgmlRow`](crate::Error::GgmlRow) when `bytes` are not the blocks of `out.len()`
/// values; [`Error::GgmlUnsupported`](crate::Error::GgmlUnsupported) for Q8_1 and Q8_K, which
/// only ever hold activations inside ggml's products.
pub fn dequantize_row(ty: GgmlType, bytes: &[u8], out: &mut [f32]) -> Result<()> {
    check_row("dequantize_row", ty, bytes.len(), out.len())?;
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the processor has the features `dequantize_avx2` is compiled for.
        return unsafe { dequantize_avx2(ty, bytes, out) };
    }
    dequantize_any(ty, bytes, out)
}

/// [`dequantize_any`] compiled for AVX2: the same operations in the same order (no
/// contraction into fused multiply-adds: Rust never contracts), so the same bits, eight lanes
/// at a time where the compiler vectorizes the decoders' loops.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dequantize_avx2(ty: GgmlType, bytes: &[u8], out: &mut [f32]) -> Result<()> {
    dequantize_any(ty, bytes, out)
}

/// The decoders' dispatch, inlined into each instruction-set variant of [`dequantize_row`].
#[inline(always)]
fn dequantize_any(ty: GgmlType, bytes: &[u8], out: &mut [f32]) -> Result<()> {
    const OP: &str = "dequantize_row";
    match ty {
        GgmlType::F32 => elements(bytes, out, f32::from_le_bytes),
        GgmlType::F16 => f16_row(bytes, out),
        GgmlType::BF16 => elements(bytes, out, |b| f32::from_bits(u32::from(u16::from_le_bytes(b)) << 16)),
        GgmlType::F64 => elements(bytes, out, |b| f64::from_le_bytes(b) as f32),
        GgmlType::I8 => elements(bytes, out, |b| f32::from(i8::from_le_bytes(b))),
        GgmlType::I16 => elements(bytes, out, |b| f32::from(i16::from_le_bytes(b))),
        GgmlType::I32 => elements(bytes, out, |b| i32::from_le_bytes(b) as f32),
        GgmlType::I64 => elements(bytes, out, |b| i64::from_le_bytes(b) as f32),
        GgmlType::Q4_0 => blocks(bytes, out, q4_0),
        GgmlType::Q4_1 => blocks(bytes, out, q4_1),
        GgmlType::Q5_0 => blocks(bytes, out, q5_0),
        GgmlType::Q5_1 => blocks(bytes, out, q5_1),
        GgmlType::Q8_0 => blocks(bytes, out, q8_0),
        GgmlType::Q2_K => blocks(bytes, out, q2_k),
        GgmlType::Q3_K => blocks(bytes, out, q3_k),
        GgmlType::Q4_K => blocks(bytes, out, q4_k),
        GgmlType::Q5_K => blocks(bytes, out, q5_k),
        GgmlType::Q6_K => blocks(bytes, out, q6_k),
        GgmlType::IQ2_XXS => blocks(bytes, out, iq2_xxs),
        GgmlType::IQ2_XS => blocks(bytes, out, iq2_xs),
        GgmlType::IQ2_S => blocks(bytes, out, iq2_s),
        GgmlType::IQ3_XXS => blocks(bytes, out, iq3_xxs),
        GgmlType::IQ3_S => blocks(bytes, out, iq3_s),
        GgmlType::IQ1_S => blocks(bytes, out, iq1_s),
        GgmlType::IQ1_M => blocks(bytes, out, iq1_m),
        GgmlType::IQ4_NL => blocks(bytes, out, iq4_nl),
        GgmlType::IQ4_XS => blocks(bytes, out, iq4_xs),
        GgmlType::TQ1_0 => blocks(bytes, out, tq1_0),
        GgmlType::TQ2_0 => blocks(bytes, out, tq2_0),
        GgmlType::MXFP4 => blocks(bytes, out, mxfp4),
        GgmlType::NVFP4 => blocks(bytes, out, nvfp4),
        GgmlType::Q8_1 | GgmlType::Q8_K => {
            return Err(Error::GgmlUnsupported {
                op: OP,
                ty: ty.name(),
                hint: "Q8_1 and Q8_K are the activations ggml quantizes inside its products, never stored weights",
            });
        }
    }
    Ok(())
}

/// Decodes a plain type, `N` bytes per value.
fn elements<const N: usize>(bytes: &[u8], out: &mut [f32], decode: impl Fn([u8; N]) -> f32) {
    let (values, rest) = bytes.as_chunks::<N>();
    debug_assert!(rest.is_empty() && values.len() == out.len());
    for (y, &x) in out.iter_mut().zip(values) {
        *y = decode(x);
    }
}

/// Decodes a block type, `B` bytes per block of `N` values.
#[inline(always)]
fn blocks<const B: usize, const N: usize>(bytes: &[u8], out: &mut [f32], decode: fn(&[u8; B], &mut [f32; N])) {
    let (xs, x_rest) = bytes.as_chunks::<B>();
    let (ys, y_rest) = out.as_chunks_mut::<N>();
    debug_assert!(x_rest.is_empty() && y_rest.is_empty() && xs.len() == ys.len());
    for (x, y) in xs.iter().zip(ys) {
        decode(x, y);
    }
}

/// f16 to f32 as numpy converts it: exactly, with a NaN keeping its payload and its quiet bit
/// as they were (the `half` crate sets the quiet bit, which would change a signalling NaN).
/// F16 values, converted by the processor's instructions where it has them (F16C, eight at a
/// time, checking for NaNs in the same pass; else the `half` crate), then NaNs redone by
/// [`f16_to_f32`], which keeps their payload as the `gguf` package does (the instructions quiet
/// them).
fn f16_row(bytes: &[u8], out: &mut [f32]) {
    use half::slice::HalfFloatSliceExt;
    let Ok(halves) = bytemuck::try_cast_slice::<u8, f16>(bytes) else {
        return elements(bytes, out, |b| f16_to_f32(u16::from_le_bytes(b)));
    };
    #[cfg(target_arch = "x86_64")]
    let nan = if std::arch::is_x86_feature_detected!("avx") && std::arch::is_x86_feature_detected!("f16c") {
        // SAFETY: both features were detected.
        unsafe { f16_row_f16c(halves, out) }
    } else {
        halves.convert_to_f32_slice(out);
        out.iter().any(|value| value.is_nan())
    };
    #[cfg(not(target_arch = "x86_64"))]
    let nan = {
        halves.convert_to_f32_slice(out);
        out.iter().any(|value| value.is_nan())
    };
    if nan {
        for (value, half) in out.iter_mut().zip(halves) {
            *value = f16_to_f32(half.to_bits());
        }
    }
}

/// [`f16_row`] on F16C: converts `halves` into `out` (the same length) and says whether any
/// value is a NaN. Half of a prompt's F16 products went to this conversion through a call per
/// eight values; inlined here it is a load, a convert and a store.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx,f16c")]
fn f16_row_f16c(halves: &[f16], out: &mut [f32]) -> bool {
    use std::arch::x86_64::{__m128i, _CMP_UNORD_Q, _mm_loadu_si128, _mm256_cmp_ps, _mm256_cvtph_ps};
    use std::arch::x86_64::{_mm256_movemask_ps, _mm256_or_ps, _mm256_setzero_ps, _mm256_storeu_ps};
    let (whole, tail) = halves.as_chunks::<8>();
    let (out_whole, out_tail) = out.as_chunks_mut::<8>();
    let mut nan = _mm256_setzero_ps();
    for (eight, out) in whole.iter().zip(out_whole) {
        // SAFETY: `eight` is 16 bytes and `out` 8 floats; both unaligned accesses are allowed.
        unsafe {
            let values = _mm256_cvtph_ps(_mm_loadu_si128(eight.as_ptr().cast::<__m128i>()));
            nan = _mm256_or_ps(nan, _mm256_cmp_ps::<_CMP_UNORD_Q>(values, values));
            _mm256_storeu_ps(out.as_mut_ptr(), values);
        }
    }
    let mut any = _mm256_movemask_ps(nan) != 0;
    for (half, out) in tail.iter().zip(out_tail) {
        *out = half.to_f32();
        any |= out.is_nan();
    }
    any
}

fn f16_to_f32(bits: u16) -> f32 {
    if bits & 0x7C00 == 0x7C00 && bits & 0x03FF != 0 {
        f32::from_bits((u32::from(bits & 0x8000) << 16) | 0x7F80_0000 | (u32::from(bits & 0x03FF) << 13))
    } else {
        f16::from_bits(bits).to_f32()
    }
}

fn u16_at(x: &[u8], i: usize) -> u16 {
    u16::from_le_bytes([x[i], x[i + 1]])
}

fn u32_at(x: &[u8], i: usize) -> u32 {
    u32::from_le_bytes([x[i], x[i + 1], x[i + 2], x[i + 3]])
}

/// The f16 at byte `i`, as f32.
fn f16_at(x: &[u8], i: usize) -> f32 {
    f16_to_f32(u16_at(x, i))
}

/// `1.0` or `-1.0` as bit `t` of `signs` is clear or set. gguf-py multiplies by this factor rather
/// than negating, which keeps a NaN's sign as it was.
fn sign(signs: u8, t: usize) -> f32 {
    if (signs >> t) & 1 == 0 { 1.0 } else { -1.0 }
}

/// `d * (q - 8)`: the 16 low nibbles are values 0-15, the high nibbles values 16-31.
#[inline(always)]
fn q4_0(x: &[u8; 18], y: &mut [f32; 32]) {
    let d = f16_at(x, 0);
    for (l, &q) in x[2..].iter().enumerate() {
        y[l] = d * (i32::from(q & 0xF) - 8) as f32;
        y[l + 16] = d * (i32::from(q >> 4) - 8) as f32;
    }
}

/// `d * q + m`, nibbles as in Q4_0.
#[inline(always)]
fn q4_1(x: &[u8; 20], y: &mut [f32; 32]) {
    let (d, m) = (f16_at(x, 0), f16_at(x, 2));
    for (l, &q) in x[4..].iter().enumerate() {
        y[l] = d * f32::from(q & 0xF) + m;
        y[l + 16] = d * f32::from(q >> 4) + m;
    }
}

/// The 5-bit values of Q5_0 and Q5_1: nibbles as in Q4_0, fifth bit of value `i` in bit `i` of
/// the little-endian `qh`.
fn q5_values(qh: u32, qs: &[u8]) -> [u8; 32] {
    let mut q = [0; 32];
    for (l, &b) in qs.iter().enumerate() {
        let high = |i: usize| (((qh >> i) & 1) as u8) << 4;
        q[l] = (b & 0xF) | high(l);
        q[l + 16] = (b >> 4) | high(l + 16);
    }
    q
}

/// `d * (q - 16)`.
#[inline(always)]
fn q5_0(x: &[u8; 22], y: &mut [f32; 32]) {
    let d = f16_at(x, 0);
    for (y, q) in y.iter_mut().zip(q5_values(u32_at(x, 2), &x[6..])) {
        *y = d * (i32::from(q) - 16) as f32;
    }
}

/// `d * q + m`.
#[inline(always)]
fn q5_1(x: &[u8; 24], y: &mut [f32; 32]) {
    let (d, m) = (f16_at(x, 0), f16_at(x, 2));
    for (y, q) in y.iter_mut().zip(q5_values(u32_at(x, 4), &x[8..])) {
        *y = d * f32::from(q) + m;
    }
}

/// `q * d` with `i8` values.
#[inline(always)]
fn q8_0(x: &[u8; 34], y: &mut [f32; 32]) {
    let d = f16_at(x, 0);
    for (y, &q) in y.iter_mut().zip(&x[2..]) {
        *y = f32::from(q as i8) * d;
    }
}

/// The 2-bit field of value `i` (0-255) of the K types and TQ2_0: each 32 bytes of `qs` hold 128
/// values, four 32-value runs at shifts 0, 2, 4 and 6.
fn crumb(qs: &[u8], i: usize) -> u8 {
    (qs[32 * (i / 128) + i % 32] >> (2 * ((i % 128) / 32))) & 3
}

/// 16 groups of 16: `(d * sc) * q - dmin * m` with 4-bit `sc` (low nibble) and `m` (high).
#[inline(always)]
fn q2_k(x: &[u8; 84], y: &mut [f32; 256]) {
    let (scales, qs) = (&x[..16], &x[16..80]);
    let (d, dmin) = (f16_at(x, 80), f16_at(x, 82));
    for (g, (y, &sc)) in y.as_chunks_mut::<16>().0.iter_mut().zip(scales).enumerate() {
        let dl = d * f32::from(sc & 0xF);
        let ml = dmin * f32::from(sc >> 4);
        for (t, y) in y.iter_mut().enumerate() {
            *y = dl * f32::from(crumb(qs, 16 * g + t)) - ml;
        }
    }
}

/// 16 groups of 16: `(d * (sc - 32)) * (q - 4 * !h)`, with 6-bit `sc` split into low nibbles
/// (bytes 0-7, low then high halves) and 2-bit high parts (bytes 8-11, at shifts 0, 2, 4, 6),
/// and the high bit `h` of value `i` in bit `i / 32` of `hmask[i % 32]`.
#[inline(always)]
fn q3_k(x: &[u8; 110], y: &mut [f32; 256]) {
    let (hmask, qs, packed) = (&x[..32], &x[32..96], &x[96..108]);
    let d = f16_at(x, 108);
    let mut dl = [0.0; 16];
    for (g, dl) in dl.iter_mut().enumerate() {
        let low = (packed[g % 8] >> (4 * (g / 8))) & 0xF;
        let high = (packed[8 + g % 4] >> (2 * (g / 4))) & 3;
        *dl = d * (i32::from(low | (high << 4)) - 32) as f32;
    }
    for (i, y) in y.iter_mut().enumerate() {
        let offset = if (hmask[i % 32] >> (i / 32)) & 1 == 0 { 4 } else { 0 };
        *y = dl[i / 16] * (i32::from(crumb(qs, i)) - offset) as f32;
    }
}

/// The eight 6-bit scales and mins of Q4_K and Q5_K, packed in 12 bytes: the low six bits of
/// bytes 0-3 (scales) and 4-7 (mins) for groups 0-3; for groups 4-7, nibbles of bytes 8-11 with
/// the top two bits of bytes 0-7 above them.
#[inline(always)]
fn scales_mins_k4(packed: &[u8]) -> ([u8; 8], [u8; 8]) {
    let (mut sc, mut m) = ([0; 8], [0; 8]);
    for j in 0..4 {
        sc[j] = packed[j] & 0x3F;
        m[j] = packed[j + 4] & 0x3F;
        sc[j + 4] = (packed[j + 8] & 0xF) | ((packed[j] >> 6) << 4);
        m[j + 4] = (packed[j + 8] >> 4) | ((packed[j + 4] >> 6) << 4);
    }
    (sc, m)
}

/// 8 groups of 32: `(d * sc) * q - dmin * m`; group `g` takes the low (even `g`) or high nibbles
/// of bytes `32 * (g / 2)..`.
#[inline(always)]
fn q4_k(x: &[u8; 144], y: &mut [f32; 256]) {
    let (d, dmin) = (f16_at(x, 0), f16_at(x, 2));
    let (sc, m) = scales_mins_k4(&x[4..16]);
    let qs = &x[16..];
    for (g, y) in y.as_chunks_mut::<32>().0.iter_mut().enumerate() {
        let dl = d * f32::from(sc[g]);
        let ml = dmin * f32::from(m[g]);
        let shift = 4 * (g % 2);
        for (y, &q) in y.iter_mut().zip(&qs[32 * (g / 2)..][..32]) {
            *y = dl * f32::from((q >> shift) & 0xF) - ml;
        }
    }
}

/// As Q4_K with a fifth bit: that of value `l` of group `g` is bit `g` of `qh[l]`.
#[inline(always)]
fn q5_k(x: &[u8; 176], y: &mut [f32; 256]) {
    let (d, dmin) = (f16_at(x, 0), f16_at(x, 2));
    let (sc, m) = scales_mins_k4(&x[4..16]);
    let (qh, qs) = (&x[16..48], &x[48..]);
    for (g, y) in y.as_chunks_mut::<32>().0.iter_mut().enumerate() {
        let dl = d * f32::from(sc[g]);
        let ml = dmin * f32::from(m[g]);
        let shift = 4 * (g % 2);
        for (l, (y, &q)) in y.iter_mut().zip(&qs[32 * (g / 2)..][..32]).enumerate() {
            let q = ((q >> shift) & 0xF) | (((qh[l] >> g) & 1) << 4);
            *y = dl * f32::from(q) - ml;
        }
    }
}

/// 16 groups of 16: `(d * sc) * (q - 32)` with `i8` scales. Each half of 128 values takes 64
/// bytes of low nibbles (values 0-63 low, 64-127 high) and 32 bytes of 2-bit high parts (four
/// runs of 32 at shifts 0, 2, 4, 6).
#[inline(always)]
fn q6_k(x: &[u8; 210], y: &mut [f32; 256]) {
    let (ql, qh, scales) = (&x[..128], &x[128..192], &x[192..208]);
    let d = f16_at(x, 208);
    for (g, (y, &sc)) in y.as_chunks_mut::<16>().0.iter_mut().zip(scales).enumerate() {
        let dl = d * f32::from(sc as i8);
        for (t, y) in y.iter_mut().enumerate() {
            let (half, r) = (g / 8, 16 * (g % 8) + t);
            let low = (ql[64 * half + r % 64] >> (4 * (r / 64))) & 0xF;
            let high = (qh[32 * half + r % 32] >> (2 * (r / 32))) & 3;
            *y = dl * (i32::from(low | (high << 4)) - 32) as f32;
        }
    }
}

/// Writes `values` lattice magnitudes, value `t` from byte `t` of `point`, scaled by `db` and
/// signed by bit `t` of `signs`: `(db * grid) * sign`.
fn signed_point(y: &mut [f32], point: &[u8], db: f32, signs: u8) {
    for (t, (y, &g)) in y.iter_mut().zip(point).enumerate() {
        *y = db * f32::from(g) * sign(signs, t);
    }
}

/// 8 groups of 32, each two little-endian u32: the first holds four lattice indices (one a byte),
/// the second four 7-bit sign indices and, in its top 4 bits, the scale `s`:
/// `db = (d * (0.5 + s)) * 0.25`.
fn iq2_xxs(x: &[u8; 66], y: &mut [f32; 256]) {
    let d = f16_at(x, 0);
    for (ib, y) in y.as_chunks_mut::<32>().0.iter_mut().enumerate() {
        let (grid, aux) = (u32_at(x, 2 + 8 * ib), u32_at(x, 6 + 8 * ib));
        let db = d * (0.5 + (aux >> 28) as f32) * 0.25;
        for (k, y) in y.as_chunks_mut::<8>().0.iter_mut().enumerate() {
            let point = IQ2XXS_GRID[((grid >> (8 * k)) & 0xFF) as usize].to_le_bytes();
            let signs = KSIGNS_IQ2XS[((aux >> (7 * k)) & 0x7F) as usize];
            signed_point(y, &point, db, signs);
        }
    }
}

/// 32 little-endian u16, each a 9-bit lattice index and a 7-bit sign index; 16 4-bit scales
/// (low nibble first), one per 16 values: `db = (d * (0.5 + s)) * 0.25`.
fn iq2_xs(x: &[u8; 74], y: &mut [f32; 256]) {
    let d = f16_at(x, 0);
    let scales = &x[66..];
    for (k, y) in y.as_chunks_mut::<8>().0.iter_mut().enumerate() {
        let q = u16_at(x, 2 + 2 * k);
        let s = (scales[k / 4] >> (4 * ((k / 2) % 2))) & 0xF;
        let db = d * (0.5 + f32::from(s)) * 0.25;
        let point = IQ2XS_GRID[usize::from(q & 0x1FF)].to_le_bytes();
        signed_point(y, &point, db, KSIGNS_IQ2XS[usize::from(q >> 9)]);
    }
}

/// 32 lattice indices of 10 bits (a byte, and two bits from `qh` at shifts 0, 2, 4, 6), one
/// explicit sign byte each, and scales as in IQ2_XS.
fn iq2_s(x: &[u8; 82], y: &mut [f32; 256]) {
    let d = f16_at(x, 0);
    let (qs, signs, qh, scales) = (&x[2..34], &x[34..66], &x[66..74], &x[74..82]);
    for (k, y) in y.as_chunks_mut::<8>().0.iter_mut().enumerate() {
        let s = (scales[k / 4] >> (4 * ((k / 2) % 2))) & 0xF;
        let db = d * (0.5 + f32::from(s)) * 0.25;
        let index = usize::from(qs[k]) | (usize::from((qh[k / 4] >> (2 * (k % 4))) & 3) << 8);
        signed_point(y, &IQ2S_GRID[index].to_le_bytes(), db, signs[k]);
    }
}

/// 64 byte indices into a lattice of 4-value points, then one little-endian u32 per 32 values
/// with four 7-bit sign indices (one per 8 values) and the scale `s` in its top 4 bits:
/// `db = (d * (0.5 + s)) * 0.5`.
fn iq3_xxs(x: &[u8; 98], y: &mut [f32; 256]) {
    let d = f16_at(x, 0);
    let qs = &x[2..66];
    for (ib, y) in y.as_chunks_mut::<32>().0.iter_mut().enumerate() {
        let aux = u32_at(x, 66 + 4 * ib);
        let db = d * (0.5 + (aux >> 28) as f32) * 0.5;
        for (k, y) in y.as_chunks_mut::<8>().0.iter_mut().enumerate() {
            let signs = KSIGNS_IQ2XS[((aux >> (7 * k)) & 0x7F) as usize];
            let mut point = [0; 8];
            point[..4].copy_from_slice(&IQ3XXS_GRID[usize::from(qs[8 * ib + 2 * k])].to_le_bytes());
            point[4..].copy_from_slice(&IQ3XXS_GRID[usize::from(qs[8 * ib + 2 * k + 1])].to_le_bytes());
            signed_point(y, &point, db, signs);
        }
    }
}

/// 64 lattice indices of 9 bits (a byte, and bit `i % 8` of `qh[i / 8]`) into 4-value points,
/// one explicit sign bit per value, one 4-bit scale per 32 values: `db = d * (1 + 2 * s)`.
fn iq3_s(x: &[u8; 110], y: &mut [f32; 256]) {
    let d = f16_at(x, 0);
    let (qs, qh, signs, scales) = (&x[2..66], &x[66..74], &x[74..106], &x[106..110]);
    for (k, y) in y.as_chunks_mut::<8>().0.iter_mut().enumerate() {
        let ib = k / 4;
        let s = (scales[ib / 2] >> (4 * (ib % 2))) & 0xF;
        let db = d * f32::from(1 + 2 * s);
        let mut point = [0; 8];
        for (half, part) in point.as_chunks_mut::<4>().0.iter_mut().enumerate() {
            let i = 2 * k + half;
            let index = usize::from(qs[i]) | (usize::from((qh[i / 8] >> (i % 8)) & 1) << 8);
            *part = IQ3S_GRID[index].to_le_bytes();
        }
        signed_point(y, &point, db, signs[k]);
    }
}

/// Writes a point of IQ1's lattice: `dl * (grid + delta)`.
fn shifted_point(y: &mut [f32; 8], index: usize, dl: f32, delta: f32) {
    for (y, g) in y.iter_mut().zip(IQ1S_GRID[index].to_le_bytes()) {
        *y = dl * (f32::from(g as i8) + delta);
    }
}

/// IQ1's offset from the lattice: `-0.125` where the flag is set.
fn iq1_delta(negative: bool) -> f32 {
    if negative { -0.125 } else { 0.125 }
}

/// 32 lattice indices of 11 bits (a byte, and 3 bits of the group's u16 at shifts 0, 3, 6, 9);
/// per 32 values a little-endian u16 whose bits 12-14 are the scale `s` and bit 15 the sign of
/// the offset: `dl = d * (2 * s + 1)`.
fn iq1_s(x: &[u8; 50], y: &mut [f32; 256]) {
    let d = f16_at(x, 0);
    let qs = &x[2..34];
    for (ib, y) in y.as_chunks_mut::<32>().0.iter_mut().enumerate() {
        let qh = u16_at(x, 34 + 2 * ib);
        let dl = d * f32::from(2 * ((qh >> 12) & 7) + 1);
        let delta = iq1_delta(qh & 0x8000 != 0);
        for (k, y) in y.as_chunks_mut::<8>().0.iter_mut().enumerate() {
            let index = usize::from(qs[4 * ib + k]) | (usize::from((qh >> (3 * k)) & 7) << 8);
            shifted_point(y, index, dl, delta);
        }
    }
}

/// 32 lattice indices of 11 bits (a byte, and the low 3 bits of a nibble of `qh` whose fourth bit
/// is the sign of that point's offset); 16 3-bit scales, one per 16 values, in the low 12 bits
/// of four little-endian u16 whose top nibbles together are the f16 `d`:
/// `dl = d * (2 * s + 1)`.
fn iq1_m(x: &[u8; 56], y: &mut [f32; 256]) {
    let (qs, qh) = (&x[..32], &x[32..48]);
    let sc = [u16_at(x, 48), u16_at(x, 50), u16_at(x, 52), u16_at(x, 54)];
    let d = f16_to_f32((sc[0] >> 12) | ((sc[1] >> 8) & 0x00F0) | ((sc[2] >> 4) & 0x0F00) | (sc[3] & 0xF000));
    for (k, y) in y.as_chunks_mut::<8>().0.iter_mut().enumerate() {
        let g = k / 2;
        let s = (sc[g / 4] >> (3 * (g % 4))) & 7;
        let dl = d * f32::from(2 * s + 1);
        let nibble = (qh[k / 2] >> (4 * (k % 2))) & 0xF;
        let index = usize::from(qs[k]) | (usize::from(nibble & 7) << 8);
        shifted_point(y, index, dl, iq1_delta(nibble & 8 != 0));
    }
}

/// `d * kvalues[q]`, nibbles as in Q4_0.
#[inline(always)]
fn iq4_nl(x: &[u8; 18], y: &mut [f32; 32]) {
    let d = f16_at(x, 0);
    for (l, &q) in x[2..].iter().enumerate() {
        y[l] = d * f32::from(KVALUES_IQ4NL[usize::from(q & 0xF)]);
        y[l + 16] = d * f32::from(KVALUES_IQ4NL[usize::from(q >> 4)]);
    }
}

/// 8 groups of 32 as IQ4_NL blocks, each with a 6-bit scale: the nibble of `scales_l` (low
/// first) below two bits of the little-endian u16 `scales_h`: `(d * (s - 32)) * kvalues[q]`.
#[inline(always)]
fn iq4_xs(x: &[u8; 136], y: &mut [f32; 256]) {
    let d = f16_at(x, 0);
    let scales_h = u16_at(x, 2);
    let (scales_l, qs) = (&x[4..8], &x[8..]);
    for (ib, y) in y.as_chunks_mut::<32>().0.iter_mut().enumerate() {
        let low = (scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF;
        let high = ((scales_h >> (2 * ib)) & 3) as u8;
        let dl = d * (i32::from(low | (high << 4)) - 32) as f32;
        for (l, &q) in qs[16 * ib..][..16].iter().enumerate() {
            y[l] = dl * f32::from(KVALUES_IQ4NL[usize::from(q & 0xF)]);
            y[l + 16] = dl * f32::from(KVALUES_IQ4NL[usize::from(q >> 4)]);
        }
    }
}

/// The trit at position `k` of a TQ1_0 byte: multiplying by 3^k (mod 256) brings it to the top,
/// where `(b * 3) >> 8` reads it.
fn trit(b: u8, k: u32) -> f32 {
    let top = b.wrapping_mul(3u8.pow(k));
    (((i32::from(top) * 3) >> 8) - 1) as f32
}

/// Ternary values five to a byte: values `32k + l` from byte `l` (0-31), `160 + 16k + l` from
/// byte `32 + l` (0-15), `240 + 4k + l` from `qh[l]` (four to a byte); `d * (t - 1)`.
fn tq1_0(x: &[u8; 54], y: &mut [f32; 256]) {
    let (qs, qh) = (&x[..48], &x[48..52]);
    let d = f16_at(x, 52);
    let runs: [(&[u8], u32, usize); 3] = [(&qs[..32], 5, 0), (&qs[32..], 5, 160), (qh, 4, 240)];
    for (bytes, trits, start) in runs {
        for k in 0..trits {
            for (l, &b) in bytes.iter().enumerate() {
                y[start + k as usize * bytes.len() + l] = d * trit(b, k);
            }
        }
    }
}

/// Ternary values in 2 bits each, laid out as the K types' 2-bit fields: `d * (q - 1)`.
fn tq2_0(x: &[u8; 66], y: &mut [f32; 256]) {
    let d = f16_at(x, 64);
    for (i, y) in y.iter_mut().enumerate() {
        *y = d * (i32::from(crumb(&x[..64], i)) - 1) as f32;
    }
}

/// Half the value of an E8M0 exponent byte, `2^(e - 128)`, built from its bits (subnormal for
/// `e < 2`; 255, NaN in the OCP format, is `2^127` here as in ggml).
pub(super) fn e8m0_half(e: u8) -> f32 {
    f32::from_bits(if e < 2 { 0x0020_0000 << e } else { u32::from(e - 1) << 23 })
}

/// Half the value of an unsigned E4M3 scale (bias 7, the top bit ignored); `0x7F`, its NaN, is 0.
fn ue4m3_half(x: u8) -> f32 {
    if x == 0 || x == 0x7F {
        return 0.0;
    }
    let (exp, man) = (u32::from((x >> 3) & 0xF), f32::from(x & 7));
    let raw = if exp == 0 { man * (1.0 / 512.0) } else { (1.0 + man / 8.0) * f32::from_bits((exp + 120) << 23) };
    raw * 0.5
}

/// `d * kvalues[q]` with the E8M0 scale halved, nibbles as in Q4_0.
fn mxfp4(x: &[u8; 17], y: &mut [f32; 32]) {
    let d = e8m0_half(x[0]);
    for (l, &q) in x[1..].iter().enumerate() {
        y[l] = d * f32::from(KVALUES_FP4[usize::from(q & 0xF)]);
        y[l + 16] = d * f32::from(KVALUES_FP4[usize::from(q >> 4)]);
    }
}

/// Four groups of 16, each with a UE4M3 scale and 8 bytes: low nibbles are values 0-7, high
/// nibbles values 8-15.
fn nvfp4(x: &[u8; 36], y: &mut [f32; 64]) {
    for (s, y) in y.as_chunks_mut::<16>().0.iter_mut().enumerate() {
        let d = ue4m3_half(x[s]);
        for (l, &q) in x[4 + 8 * s..][..8].iter().enumerate() {
            y[l] = d * f32::from(KVALUES_FP4[usize::from(q & 0xF)]);
            y[l + 8] = d * f32::from(KVALUES_FP4[usize::from(q >> 4)]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One test per decoded type against the bytes and gguf-py's decoding of them in
    /// `tests/fixtures/gguf/types` (2 rows of 256 values), and the list of those types.
    macro_rules! fixtures {
        ($($test:ident: $ty:ident),* $(,)?) => {
            const WITH_FIXTURES: &[GgmlType] = &[$(GgmlType::$ty),*];
            $(
                #[test]
                fn $test() {
                    matches_fixture(
                        GgmlType::$ty,
                        include_bytes!(concat!(
                            env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/gguf/types/", stringify!($ty), ".blocks"
                        )),
                        include_bytes!(concat!(
                            env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/gguf/types/", stringify!($ty), ".f32"
                        )),
                    );
                }
            )*
        };
    }

    fixtures! {
        f32: F32, f16: F16, bf16: BF16, f64: F64, i8: I8, i16: I16, i32: I32, i64: I64,
        q4_0: Q4_0, q4_1: Q4_1, q5_0: Q5_0, q5_1: Q5_1, q8_0: Q8_0,
        q2_k: Q2_K, q3_k: Q3_K, q4_k: Q4_K, q5_k: Q5_K, q6_k: Q6_K,
        iq1_s: IQ1_S, iq1_m: IQ1_M, iq2_xxs: IQ2_XXS, iq2_xs: IQ2_XS, iq2_s: IQ2_S,
        iq3_xxs: IQ3_XXS, iq3_s: IQ3_S, iq4_nl: IQ4_NL, iq4_xs: IQ4_XS,
        tq1_0: TQ1_0, tq2_0: TQ2_0, mxfp4: MXFP4, nvfp4: NVFP4,
    }

    const ROWS: usize = 2;
    const COLS: usize = 256;

    fn matches_fixture(ty: GgmlType, blocks: &[u8], expected: &[u8]) {
        let row_bytes = ty.row_bytes(COLS).expect("256 values are whole blocks of every type");
        assert_eq!(blocks.len(), ROWS * row_bytes, "{ty}: fixture size");
        assert_eq!(expected.len(), ROWS * COLS * 4, "{ty}: expected size");
        let expected: Vec<f32> = expected.as_chunks::<4>().0.iter().map(|b| f32::from_le_bytes(*b)).collect();
        // Row by row, as a reader decodes a tensor.
        let mut out = vec![f32::NAN; ROWS * COLS];
        for (x, y) in blocks.chunks_exact(row_bytes).zip(out.chunks_exact_mut(COLS)) {
            dequantize_row(ty, x, y).unwrap();
        }
        let wrong: Vec<_> = (0..out.len()).filter(|&i| out[i].to_bits() != expected[i].to_bits()).collect();
        if let Some(&i) = wrong.first() {
            panic!(
                "{ty}: {} of {} values differ; first at {i}: got {} ({:#010x}), gguf-py gives {} ({:#010x})",
                wrong.len(),
                out.len(),
                out[i],
                out[i].to_bits(),
                expected[i],
                expected[i].to_bits()
            );
        }
    }

    #[test]
    fn every_decoded_type_has_a_fixture() {
        for ty in GgmlType::all() {
            let bytes = vec![0; ty.row_bytes(COLS).unwrap()];
            let decoded = dequantize_row(ty, &bytes, &mut [0.0; COLS]).is_ok();
            assert_eq!(decoded, WITH_FIXTURES.contains(&ty), "{ty}: decoded without a fixture, or the reverse");
        }
    }

    #[test]
    fn activation_types_are_refused() {
        for ty in [GgmlType::Q8_1, GgmlType::Q8_K] {
            let bytes = vec![0; ty.row_bytes(COLS).unwrap()];
            let err = dequantize_row(ty, &bytes, &mut [0.0; COLS]).unwrap_err();
            assert!(
                matches!(err, Error::GgmlUnsupported { op: "dequantize_row", ty: name, .. } if name == ty.name()),
                "{err}"
            );
        }
    }

    #[test]
    fn wrong_lengths_are_refused() {
        let row = |ty: GgmlType, bytes: usize, values: usize| {
            let err = dequantize_row(ty, &vec![0; bytes], &mut vec![0.0; values]).unwrap_err();
            assert!(matches!(err, Error::GgmlRow { op: "dequantize_row", .. }), "{ty}: {err}");
        };
        row(GgmlType::Q4_K, 143, 256);
        row(GgmlType::Q4_K, 145, 256);
        row(GgmlType::Q4_K, 144, 255);
        row(GgmlType::Q4_0, 18, 16);
        row(GgmlType::F32, 7, 2);
        row(GgmlType::Q8_K, 291, 256);
        // Empty rows are whole blocks of nothing.
        for ty in WITH_FIXTURES {
            dequantize_row(*ty, &[], &mut []).unwrap();
        }
    }

    /// Scales that are NaN, infinite or huge (every byte `0xFF`, `0x7C` or `0x7B`) decode to
    /// NaN or infinite values without panicking.
    #[test]
    fn any_bytes_decode() {
        for ty in WITH_FIXTURES.iter().copied() {
            for fill in [0x00, 0xFF, 0x7C, 0x7B, 0x80] {
                let bytes = vec![fill; ty.row_bytes(COLS).unwrap()];
                let mut out = [0.0; COLS];
                dequantize_row(ty, &bytes, &mut out).unwrap();
            }
        }
        let mut out = [0.0; 32];
        dequantize_row(GgmlType::Q4_0, &[0xFF; 18], &mut out).unwrap();
        assert!(out.iter().all(|v| v.is_nan()));
    }

    #[test]
    fn f16_nan_keeps_its_bits() {
        for (h, f) in [(0x7C01u16, 0x7F80_2000u32), (0xFE00, 0xFFC0_0000), (0x7C00, 0x7F80_0000), (0x0001, 0x3380_0000)]
        {
            assert_eq!(f16_to_f32(h).to_bits(), f, "{h:#06x}");
        }
    }

    #[test]
    fn scale_bytes() {
        assert_eq!(e8m0_half(0).to_bits(), 0x0020_0000);
        assert_eq!(e8m0_half(127), 0.5); // 2^0, halved
        assert_eq!(e8m0_half(255), 2f32.powi(127));
        assert_eq!(ue4m3_half(0x38), 0.5); // exponent 7: 1.0
        assert_eq!(ue4m3_half(0x01), 2f32.powi(-10));
        assert_eq!(ue4m3_half(0x7E), 224.0);
        assert_eq!(ue4m3_half(0x7F), 0.0);
        assert_eq!(ue4m3_half(0xFF), 240.0);
    }
}
