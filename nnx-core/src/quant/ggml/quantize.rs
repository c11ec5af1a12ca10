//! Encoding f32 rows into ggml's block types, bit-exact with the reference quantizers that GGUF
//! files are written with.
//!
//! Two references, because the files in the wild come from two writers:
//!
//! - Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, MXFP4, TQ1_0, TQ2_0, F16 and BF16 follow the `gguf` Python
//!   package (0.19.0), which converters such as `convert_hf_to_gguf.py` call. It works in numpy
//!   float32, one whole-array operation at a time, so each step here is one f32 operation that
//!   rounds on its own, in numpy's order (`1 / d` then a multiply, never a division per value).
//! - Q2_K to Q6_K, IQ4_NL and IQ4_XS follow ggml's C quantizers as `llama-quantize` runs them
//!   without an importance matrix (see `quantize_k.rs`).
//!
//! Each block is encoded on its own, so a row of any number of whole blocks works, and rows of a
//! tensor can be encoded independently.

#[path = "quantize_k.rs"]
mod k;

use super::grids::KVALUES_FP4;
use super::{GgmlType, check_row};
use crate::error::{Error, Result};

/// Names the types [`quantize_row`] encodes, for the error of one it does not.
const SUPPORTED: &str = "quantize_row encodes F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, \
                         Q6_K, IQ4_NL, IQ4_XS, MXFP4, TQ1_0 and TQ2_0";

/// One block's encoder: `values` is one block, `out` its bytes.
type BlockFn = fn(&[f32], &mut [u8]);

fn encoder(ty: GgmlType) -> Option<BlockFn> {
    use GgmlType as T;
    Some(match ty {
        T::F32 => |x, o| o.copy_from_slice(&x[0].to_le_bytes()),
        T::F16 => |x, o| o.copy_from_slice(&f16_bits_numpy(x[0]).to_le_bytes()),
        T::BF16 => |x, o| o.copy_from_slice(&bf16_bits(x[0]).to_le_bytes()),
        T::Q4_0 => q4_0,
        T::Q4_1 => q4_1,
        T::Q5_0 => q5_0,
        T::Q5_1 => q5_1,
        T::Q8_0 => q8_0,
        T::MXFP4 => mxfp4,
        T::TQ1_0 => tq1_0,
        T::TQ2_0 => tq2_0,
        T::Q2_K => k::q2_k,
        T::Q3_K => k::q3_k,
        T::Q4_K => k::q4_k,
        T::Q5_K => k::q5_k,
        T::Q6_K => k::q6_k,
        T::IQ4_NL => k::iq4_nl,
        T::IQ4_XS => k::iq4_xs,
        _ => return None,
    })
}

/// Whether [`quantize_row`] encodes `ty`.
pub fn can_quantize(ty: GgmlType) -> bool {
    encoder(ty).is_some()
}

/// Encodes `values` (whole blocks of `ty`) into `out`, which must be exactly
/// `ty.row_bytes(values.len())` bytes.
///
/// The bytes are those the reference writers produce for the same floats (see the module
/// documentation); NaN and infinite inputs give whatever the reference's arithmetic gives and are
/// only matched for F32, F16 and BF16.
///
/// # Errors
///
/// [`Error::GgmlUnsupported`] for a type without an encoder (see [`can_quantize`]);
/// [`Error::GgmlRow`] when `values` is not whole blocks or `out` is not their size.
pub fn quantize_row(ty: GgmlType, values: &[f32], out: &mut [u8]) -> Result<()> {
    let Some(encode) = encoder(ty) else {
        return Err(Error::GgmlUnsupported { op: "quantize_row", ty: ty.name(), hint: SUPPORTED });
    };
    check_row("quantize_row", ty, out.len(), values.len())?;
    for (block, bytes) in values.chunks_exact(ty.block_size()).zip(out.chunks_exact_mut(ty.type_size())) {
        encode(block, bytes);
    }
    Ok(())
}

/// f32 to IEEE half as numpy's `astype(np.float16)` does it: round to nearest even, overflow to
/// infinity, and a NaN keeps its sign and the top ten bits of its payload (signalling stays
/// signalling), becoming `0x7c01` if those bits are all zero.
fn f16_bits_numpy(x: f32) -> u16 {
    let b = x.to_bits();
    if x.is_nan() {
        let payload = ((b >> 13) & 0x3ff) as u16;
        return ((b >> 16) & 0x8000) as u16 | 0x7c00 | payload.max(1);
    }
    f16_bits_finite_or_inf(b)
}

/// f32 to IEEE half as ggml's software conversion does it: the same rounding as numpy, but every
/// NaN becomes the quiet `0x7e00` with the input's sign.
fn f16_bits_ggml(x: f32) -> u16 {
    let b = x.to_bits();
    if x.is_nan() {
        return ((b >> 16) & 0x8000) as u16 | 0x7e00;
    }
    f16_bits_finite_or_inf(b)
}

/// Round-to-nearest-even f32 to f16 of a non-NaN value given by its bits.
fn f16_bits_finite_or_inf(b: u32) -> u16 {
    let sign = ((b >> 16) & 0x8000) as u16;
    let exp = (b >> 23) & 0xff;
    let man = b & 0x7f_ffff;
    // |x| >= 2^16 (including infinity) is past f16's largest finite value even before rounding.
    if exp >= 143 {
        return sign | 0x7c00;
    }
    // |x| < 2^-25 is below half the smallest subnormal: zero.
    if exp < 102 {
        return sign;
    }
    // Value = m * 2^(exp - 150); f16 counts in units of 2^-24 when subnormal, else keeps 10 bits.
    let (m, shift) = if exp < 113 { (man | 0x80_0000, 126 - exp) } else { (man, 13) };
    let mut q = m >> shift;
    if exp >= 113 {
        q |= (exp - 112) << 10;
    }
    let rem = m & ((1 << shift) - 1);
    let half = 1 << (shift - 1);
    if rem > half || (rem == half && q & 1 == 1) {
        // A carry out of the mantissa bumps the exponent, up to infinity: what rounding wants.
        q += 1;
    }
    sign | q as u16
}

/// f32 to bfloat16 as gguf-py (and ggml) do it: round to nearest even on the bits, and a NaN is
/// truncated with its quiet bit forced so that truncation cannot make it infinite.
fn bf16_bits(x: f32) -> u16 {
    let b = x.to_bits();
    if b & 0x7fff_ffff > 0x7f80_0000 {
        return ((b >> 16) | 0x40) as u16;
    }
    ((u64::from(b) + 0x7fff + u64::from((b >> 16) & 1)) >> 16) as u16
}

/// numpy's float-to-`uint8` cast on x86: through a 32-bit integer conversion, whose result for
/// NaN and out-of-range values is `i32::MIN`, of which the cast keeps the low byte.
fn np_u8(v: f32) -> u8 {
    if v.is_finite() && v.abs() < 2_147_483_648.0 { v as i32 as u8 } else { 0 }
}

/// The first value of largest magnitude, with its sign (numpy's `argmax` of `abs`).
fn signed_absmax(x: &[f32]) -> f32 {
    let mut best = x[0];
    for &v in &x[1..] {
        if v.abs() > best.abs() {
            best = v;
        }
    }
    best
}

fn absmax(x: &[f32]) -> f32 {
    x.iter().fold(0.0f32, |m, v| if v.abs() > m { v.abs() } else { m })
}

/// The row's min and max as numpy reduces along the last axis: of equal values the last is kept,
/// which decides the sign of a zero (ggml's C keeps the first; gguf-py is the reference here).
fn min_max(x: &[f32]) -> (f32, f32) {
    x.iter().fold((x[0], x[0]), |(lo, hi), &v| (if v <= lo { v } else { lo }, if v >= hi { v } else { hi }))
}

/// gguf-py's `np.where(d == 0, 0, 1 / d)`.
fn inverse(d: f32) -> f32 {
    if d == 0.0 { 0.0 } else { 1.0 / d }
}

/// Packs 32 four-bit codes, the first half in the low nibbles.
fn pack_nibbles(q: &[u8; 32], out: &mut [u8]) {
    for j in 0..16 {
        out[j] = (q[j] & 0xf) | (q[j + 16] << 4);
    }
}

/// The fifth bits of 32 five-bit codes, value `j` in bit `j` (numpy's little-endian `packbits`).
fn high_bits(q: &[u8; 32]) -> [u8; 4] {
    let bits = q.iter().enumerate().fold(0u32, |acc, (j, &v)| acc | (u32::from(v >> 4) << j));
    bits.to_le_bytes()
}

/// Codes `trunc(v + offset)` clipped to `max`, the symmetric types' rounding of `x * id`.
fn codes(x: &[f32], f: impl Fn(f32) -> f32, max: u8) -> [u8; 32] {
    let mut q = [0u8; 32];
    for (q, &v) in q.iter_mut().zip(x) {
        *q = np_u8(f(v).trunc()).min(max);
    }
    q
}

fn q4_0(x: &[f32], out: &mut [u8]) {
    let d = signed_absmax(x) / -8.0;
    let id = inverse(d);
    let q = codes(x, |v| v * id + 8.5, 15);
    out[..2].copy_from_slice(&f16_bits_numpy(d).to_le_bytes());
    pack_nibbles(&q, &mut out[2..]);
}

fn q4_1(x: &[f32], out: &mut [u8]) {
    let (min, max) = min_max(x);
    let d = (max - min) / 15.0;
    let id = inverse(d);
    let q = codes(x, |v| (v - min) * id + 0.5, 15);
    out[..2].copy_from_slice(&f16_bits_numpy(d).to_le_bytes());
    out[2..4].copy_from_slice(&f16_bits_numpy(min).to_le_bytes());
    pack_nibbles(&q, &mut out[4..]);
}

fn q5_0(x: &[f32], out: &mut [u8]) {
    let d = signed_absmax(x) / -16.0;
    let id = inverse(d);
    let q = codes(x, |v| v * id + 16.5, 31);
    out[..2].copy_from_slice(&f16_bits_numpy(d).to_le_bytes());
    out[2..6].copy_from_slice(&high_bits(&q));
    pack_nibbles(&q, &mut out[6..]);
}

fn q5_1(x: &[f32], out: &mut [u8]) {
    let (min, max) = min_max(x);
    let d = (max - min) / 31.0;
    let id = inverse(d);
    let q = codes(x, |v| (v - min) * id + 0.5, 31);
    out[..2].copy_from_slice(&f16_bits_numpy(d).to_le_bytes());
    out[2..4].copy_from_slice(&f16_bits_numpy(min).to_le_bytes());
    out[4..8].copy_from_slice(&high_bits(&q));
    pack_nibbles(&q, &mut out[8..]);
}

fn q8_0(x: &[f32], out: &mut [u8]) {
    let d = absmax(x) / 127.0;
    let id = inverse(d);
    out[..2].copy_from_slice(&f16_bits_numpy(d).to_le_bytes());
    for (o, &v) in out[2..].iter_mut().zip(x) {
        // gguf-py's `np_roundf` is exactly round-half-away-from-zero; |v * id| <= 127 (up to
        // rounding), so the int8 cast keeps the value.
        *o = (v * id).round() as i8 as u8;
    }
}

/// MXFP4: a shared power-of-two exponent from the block's largest magnitude, then per value the
/// first E2M1 code whose scaled value is nearest.
fn mxfp4(x: &[f32], out: &mut [u8]) {
    let amax = absmax(x);
    // numpy takes log2 in float32: rounding it can carry a value just below 2^k up to k, which
    // floor then keeps, so round the (correctly rounded) f64 logarithm to f32 before the floor.
    let e = if amax > 0.0 { np_u8(((f64::from(amax).log2() as f32).floor() - 2.0) + 127.0) } else { 0 };
    let d = e8m0_half(e);
    let mut q = [0u8; 32];
    for (q, &v) in q.iter_mut().zip(x) {
        let mut best = 0;
        let mut best_err = f32::INFINITY;
        for (i, &k) in KVALUES_FP4.iter().enumerate() {
            let err = (d * f32::from(k) - v).abs();
            // numpy's argmin: the first minimum, and a NaN error wins outright.
            if err < best_err || (err.is_nan() && !best_err.is_nan()) {
                best = i as u8;
                best_err = err;
            }
        }
        *q = best;
    }
    out[0] = e;
    pack_nibbles(&q, &mut out[1..]);
}

/// Repacks MXFP4 blocks stored as OCP pairs (PyTorch's and the safetensors checkpoints'
/// layout: `codes` 16 bytes a block, value `2i` in byte `i`'s low nibble and `2i + 1` in its
/// high one; `scales` one E8M0 byte a block) into ggml's MXFP4 blocks (`out`, 17 bytes a block:
/// the exponent, then value `j` in byte `j`'s low nibble and `j + 16` in its high one). The
/// codes and exponents are kept as they are: nothing is decoded.
///
/// # Errors
/// [`Error::GgmlRow`] when `codes`, `scales` and `out` are not the same number of blocks.
pub fn mxfp4_from_pairs(codes: &[u8], scales: &[u8], out: &mut [u8]) -> Result<()> {
    let ty = GgmlType::MXFP4;
    if codes.len() != scales.len() * 16 {
        return Err(Error::GgmlRow {
            op: "mxfp4_from_pairs",
            ty: ty.name(),
            block_size: 32,
            values: scales.len() * 32,
            bytes: codes.len(),
        });
    }
    check_row("mxfp4_from_pairs", ty, out.len(), scales.len() * 32)?;
    for ((pair, &scale), block) in codes.chunks_exact(16).zip(scales).zip(out.chunks_exact_mut(17)) {
        let code = |value: usize| (pair[value / 2] >> (4 * (value % 2))) & 0xf;
        let mut q = [0u8; 32];
        for (value, q) in q.iter_mut().enumerate() {
            *q = code(value);
        }
        block[0] = scale;
        pack_nibbles(&q, &mut block[1..]);
    }
    Ok(())
}

/// Half of the E8M0 scale `2^(e - 127)`, the factor of the doubled E2M1 values.
fn e8m0_half(e: u8) -> f32 {
    let bits = if e < 2 { 0x0020_0000u32 << e } else { u32::from(e - 1) << 23 };
    f32::from_bits(bits)
}

/// Ternary codes 0, 1, 2 for `round(x / max|x|) + 1`, with the scale.
fn ternary(x: &[f32]) -> ([u8; 256], f32) {
    let d = absmax(x);
    let id = inverse(d);
    let mut q = [0u8; 256];
    for (q, &v) in q.iter_mut().zip(x) {
        *q = ((v * id).round() as i8 + 1) as u8;
    }
    (q, d)
}

/// TQ1_0: five ternary digits per byte as a fixed-point fraction of 243 (rounded up so the
/// decoder's multiply-by-3 recovers each digit), 48 bytes of five then 4 bytes of four.
fn tq1_0(x: &[f32], out: &mut [u8]) {
    let (q, d) = ternary(x);
    let pack = |digits: &mut dyn Iterator<Item = u8>| -> u8 {
        let n = digits.fold(0u16, |acc, t| acc * 3 + u16::from(t));
        (n * 256).div_ceil(243) as u8
    };
    for j in 0..32 {
        out[j] = pack(&mut (0..5).map(|k| q[k * 32 + j]));
    }
    for j in 0..16 {
        out[32 + j] = pack(&mut (0..5).map(|k| q[160 + k * 16 + j]));
    }
    for j in 0..4 {
        // Four digits, the fifth (lowest) place left zero.
        out[48 + j] = pack(&mut (0..4).map(|k| q[240 + k * 4 + j]).chain(std::iter::once(0)));
    }
    out[52..54].copy_from_slice(&f16_bits_numpy(d).to_le_bytes());
}

/// TQ2_0: ternary codes in 2 bits, four 32-value stretches per 32 bytes.
fn tq2_0(x: &[f32], out: &mut [u8]) {
    let (q, d) = ternary(x);
    for half in 0..2 {
        for j in 0..32 {
            let base = half * 128 + j;
            out[half * 32 + j] = (0..4).fold(0, |acc, k| acc | (q[base + k * 32] << (2 * k)));
        }
    }
    out[64..66].copy_from_slice(&f16_bits_numpy(d).to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    macro_rules! golden {
        ($name:literal, $ext:literal) => {
            (
                $name,
                include_bytes!(concat!(
                    env!("CARGO_MANIFEST_DIR"),
                    "/../tests/fixtures/gguf/quantize/",
                    $name,
                    ".input.f32"
                )) as &[u8],
                include_bytes!(concat!(
                    env!("CARGO_MANIFEST_DIR"),
                    "/../tests/fixtures/gguf/quantize/",
                    $name,
                    ".",
                    $ext
                )) as &[u8],
            )
        };
    }

    /// Inputs and outputs of gguf-py's `quantize`.
    const GGUF_PY: &[(&str, &[u8], &[u8])] = &[
        golden!("Q4_0", "gguf_py"),
        golden!("Q4_1", "gguf_py"),
        golden!("Q5_0", "gguf_py"),
        golden!("Q5_1", "gguf_py"),
        golden!("Q8_0", "gguf_py"),
        golden!("MXFP4", "gguf_py"),
        golden!("TQ1_0", "gguf_py"),
        golden!("TQ2_0", "gguf_py"),
        golden!("F16", "gguf_py"),
        golden!("BF16", "gguf_py"),
    ];

    /// Inputs and outputs of llama.cpp's `ggml_quantize_chunk` without an importance matrix.
    const LLAMA_CPP: &[(&str, &[u8], &[u8])] = &[
        golden!("Q2_K", "llamacpp"),
        golden!("Q3_K", "llamacpp"),
        golden!("Q4_K", "llamacpp"),
        golden!("Q5_K", "llamacpp"),
        golden!("Q6_K", "llamacpp"),
        golden!("IQ4_NL", "llamacpp"),
        golden!("IQ4_XS", "llamacpp"),
    ];

    fn floats(bytes: &[u8]) -> Vec<f32> {
        bytes.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect()
    }

    /// Encodes the golden input row by row and names the first differing block.
    fn check_golden(name: &str, input: &[u8], expected: &[u8]) {
        let ty = GgmlType::from_name(name).unwrap();
        let x = floats(input);
        let row = if ty.block_size() == 1 { x.len() } else { 256 };
        let row_bytes = ty.row_bytes(row).unwrap();
        assert_eq!(x.len() / row * row_bytes, expected.len(), "{name}: golden size");
        let mut out = vec![0u8; expected.len()];
        for (xs, o) in x.chunks(row).zip(out.chunks_mut(row_bytes)) {
            quantize_row(ty, xs, o).unwrap();
        }
        let ts = ty.type_size();
        for (b, (got, want)) in out.chunks(ts).zip(expected.chunks(ts)).enumerate() {
            assert_eq!(got, want, "{name}: block {b} (row {}) differs", b * ts / row_bytes);
        }
    }

    #[test]
    fn matches_gguf_py() {
        for &(name, input, expected) in GGUF_PY {
            check_golden(name, input, expected);
        }
    }

    #[test]
    fn matches_llama_cpp() {
        for &(name, input, expected) in LLAMA_CPP {
            check_golden(name, input, expected);
        }
    }

    #[test]
    fn whole_tensor_equals_rows() {
        // Blocks are independent: one call over all rows gives the rows' bytes end to end.
        for &(name, input, expected) in GGUF_PY.iter().chain(LLAMA_CPP) {
            let ty = GgmlType::from_name(name).unwrap();
            let x = floats(input);
            let mut out = vec![0u8; expected.len()];
            quantize_row(ty, &x, &mut out).unwrap();
            assert!(out == expected, "{name}");
        }
    }

    #[test]
    fn f32_is_its_bytes() {
        let x = [1.5f32, -0.0, f32::NAN, f32::MIN_POSITIVE];
        let mut out = [0u8; 16];
        quantize_row(GgmlType::F32, &x, &mut out).unwrap();
        let want: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(out[..], want[..]);
    }

    #[test]
    fn f16_rounding_agrees_with_half() {
        // Finite values and infinities: the same round-to-nearest-even as the `half` crate.
        let mut state = 0x1234_5678u32;
        for _ in 0..200_000 {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            let x = f32::from_bits(state);
            if !x.is_nan() {
                assert_eq!(f16_bits_numpy(x), half::f16::from_f32(x).to_bits(), "{x:e} ({state:#x})");
                assert_eq!(f16_bits_ggml(x), f16_bits_numpy(x));
            }
        }
        assert_eq!(f16_bits_ggml(f32::from_bits(0xff80_0001)), 0xfe00);
    }

    #[test]
    fn errors() {
        let mut out = [0u8; 144];
        let err = quantize_row(GgmlType::Q4_K, &[0.0; 255], &mut out).unwrap_err();
        assert!(matches!(err, Error::GgmlRow { op: "quantize_row", ty: "Q4_K", values: 255, .. }), "{err}");
        let err = quantize_row(GgmlType::Q4_K, &[0.0; 256], &mut out[..143]).unwrap_err();
        assert!(matches!(err, Error::GgmlRow { bytes: 143, .. }), "{err}");
        let err = quantize_row(GgmlType::Q4_0, &[0.0; 48], &mut [0u8; 27]).unwrap_err();
        assert!(matches!(err, Error::GgmlRow { block_size: 32, .. }), "{err}");

        let err = quantize_row(GgmlType::IQ2_XXS, &[0.0; 256], &mut [0u8; 66]).unwrap_err();
        let Error::GgmlUnsupported { op, ty, hint } = &err else { panic!("{err}") };
        assert_eq!((*op, *ty), ("quantize_row", "IQ2_XXS"));
        // The hint lists exactly the types that can be quantized.
        for t in GgmlType::all() {
            let listed = hint.split([' ', ',']).any(|w| w == t.name());
            assert_eq!(listed, can_quantize(t), "{t} in {hint:?}");
        }
        assert!(!can_quantize(GgmlType::Q8_K) && !can_quantize(GgmlType::NVFP4));
        // Empty rows are whole blocks too.
        quantize_row(GgmlType::Q6_K, &[], &mut []).unwrap();
    }

    #[test]
    fn round_trip_error_is_small() {
        // Types without a decoder yet are skipped.
        let x: Vec<f32> = (0..1024).map(|i| ((i * 7919 % 1000) as f32 / 500.0 - 1.0) * 3.0).collect();
        for ty in GgmlType::all().filter(|&t| can_quantize(t)) {
            let mut bytes = vec![0u8; ty.row_bytes(x.len()).unwrap()];
            quantize_row(ty, &x, &mut bytes).unwrap();
            let mut back = vec![0f32; x.len()];
            if super::super::dequantize_row(ty, &bytes, &mut back).is_err() {
                continue;
            }
            let err = (x.iter().zip(&back).map(|(a, b)| (a - b) * (a - b)).sum::<f32>() / x.len() as f32).sqrt();
            let rms = (x.iter().map(|a| a * a).sum::<f32>() / x.len() as f32).sqrt();
            // Uniform values lose about 2^-bits of their rms at `bits` bits per value; ternary
            // types keep only the sign of values below half the block's maximum.
            let bits = match ty {
                GgmlType::F32 => 24,
                GgmlType::F16 => 11,
                GgmlType::BF16 | GgmlType::Q8_0 => 8,
                GgmlType::Q6_K => 6,
                GgmlType::Q5_0 | GgmlType::Q5_1 | GgmlType::Q5_K => 5,
                GgmlType::Q3_K | GgmlType::MXFP4 => 3,
                GgmlType::Q2_K => 2,
                GgmlType::TQ1_0 | GgmlType::TQ2_0 => 1,
                _ => 4,
            };
            let bound = 1.5 * 0.5f32.powi(bits);
            assert!(err / rms < bound, "{ty}: relative rms error {}", err / rms);
        }
    }

    #[test]
    fn mxfp4_pairs_keep_every_value_in_its_place() {
        // Two blocks whose 64 values are each a different (code, position) pair, decoded by the
        // OCP definition: 2^(e - 127) times the E2M1 value of the code.
        const E2M1: [f32; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
        let codes_of: Vec<u8> = (0..64u32).map(|value| ((value * 7 + value / 5) % 16) as u8).collect();
        let scales = [127u8, 130];
        let pairs: Vec<u8> = codes_of.chunks_exact(2).map(|two| two[0] | (two[1] << 4)).collect();
        let mut blocks = [0u8; 34];
        mxfp4_from_pairs(&pairs, &scales, &mut blocks).unwrap();
        let mut decoded = [0f32; 64];
        crate::quant::ggml::dequantize_row(GgmlType::MXFP4, &blocks, &mut decoded).unwrap();
        for (value, (&code, &found)) in codes_of.iter().zip(&decoded).enumerate() {
            let sign = if code & 8 != 0 { -1.0 } else { 1.0 };
            let expected = sign * E2M1[usize::from(code & 7)] * 2f32.powi(i32::from(scales[value / 32]) - 127);
            assert_eq!(found, expected, "value {value}");
        }
        assert!(mxfp4_from_pairs(&pairs[..16], &scales, &mut blocks).is_err(), "codes for one block, two scales");
        assert!(mxfp4_from_pairs(&pairs, &scales, &mut blocks[..17]).is_err(), "room for one block");
    }
}
