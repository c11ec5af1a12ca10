//! The K-quants (Q2_K to Q6_K) and IQ4_NL / IQ4_XS as ggml's C reference quantizers encode them
//! without an importance matrix, which is what `llama-quantize` writes when given none.
//!
//! Bit-exactness rests on doing the same f32 operations in the same order as the C compiled
//! without fast-math: sums accumulate left to right, `a * b * c` is `(a * b) * c`, divisions
//! stay divisions, nothing is fused, and integers enter products converted to f32. Rounding to
//! an integer is ggml's `nearest_int` (see [`nearest_int`]), not `f32::round`. Scales are stored
//! as f16 and read back as f16 before the final codes are chosen, as the C does.

use super::super::grids::KVALUES_IQ4NL;
use super::f16_bits_ggml;

/// Groups whose largest magnitude is below this are treated as all zero.
const GROUP_MAX_EPS: f32 = 1e-15;

/// ggml's `nearest_int`: adding 1.5 * 2^23 leaves the integer in the low mantissa bits, rounded
/// half to even by the f32 add itself. Only meaningful for |x| < 2^22, as in the C.
fn nearest_int(x: f32) -> i32 {
    let bits = (x + 12_582_912.0).to_bits() as i32;
    (bits & 0x007f_ffff) - 0x0040_0000
}

fn f16_to_f32(bits: u16) -> f32 {
    half::f16::from_bits(bits).to_f32()
}

/// The scale stored as f16, and that f16 read back.
fn store_f16(out: &mut [u8], x: f32) -> f32 {
    let bits = f16_bits_ggml(x);
    out.copy_from_slice(&bits.to_le_bytes());
    f16_to_f32(bits)
}

/// The first value of largest magnitude, with its sign, and that magnitude (strictly greater
/// replaces, so the first of equal magnitudes wins and an all-zero group gives zero).
fn signed_absmax(x: &[f32]) -> (f32, f32) {
    let (mut max, mut amax) = (0.0f32, 0.0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    (max, amax)
}

/// Signed codes in `[-nmax, nmax)` for a group of 16, weighted by `x^2`, trying 19 scales around
/// `nmax / max` and keeping the best weighted least-squares fit (`make_qx_quants`, RMSE type 1).
/// Writes the codes offset by `nmax` and returns the scale.
fn make_qx_quants(nmax: i32, x: &[f32], codes: &mut [u8]) -> f32 {
    let (max, amax) = signed_absmax(x);
    if amax < GROUP_MAX_EPS {
        codes.fill(0);
        return 0.0;
    }
    let level = |iscale: f32, v: f32| nearest_int(iscale * v).clamp(-nmax, nmax - 1);
    let sums = |iscale: f32| {
        let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
        for &v in x {
            let l = level(iscale, v) as f32;
            let w = v * v;
            sumlx += w * v * l;
            suml2 += w * l * l;
        }
        (sumlx, suml2)
    };
    let mut iscale = -(nmax as f32) / max;
    for (c, &v) in codes.iter_mut().zip(x) {
        *c = (level(iscale, v) + nmax) as u8;
    }
    let (sumlx, suml2) = sums(iscale);
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in (-9..=9).filter(|&is| is != 0) {
        iscale = -(nmax as f32 + 0.1 * is as f32) / max;
        let (sumlx, suml2) = sums(iscale);
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            for (c, &v) in codes.iter_mut().zip(x) {
                *c = (level(iscale, v) + nmax) as u8;
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// Q3_K's per-group search (`make_q3_quants` with RMSE): start from `nmax / max`, then up to five
/// passes of moving single codes to their optimum for the others' fit, keeping a move only when
/// it improves the `x^2`-weighted fit. Writes codes offset by `nmax` (zeros for an all-zero
/// group) and returns the scale.
fn make_q3_quants(nmax: i32, x: &[f32], codes: &mut [i8]) -> f32 {
    let (max, amax) = signed_absmax(x);
    if amax < GROUP_MAX_EPS {
        codes.fill(0);
        return 0.0;
    }
    let iscale = -(nmax as f32) / max;
    let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
    for (c, &v) in codes.iter_mut().zip(x) {
        let l = nearest_int(iscale * v).clamp(-nmax, nmax - 1);
        *c = l as i8;
        let w = v * v;
        sumlx += w * v * l as f32;
        suml2 += w * l as f32 * l as f32;
    }
    for _ in 0..5 {
        let mut changed = false;
        for (c, &v) in codes.iter_mut().zip(x) {
            let w = v * v;
            let l = f32::from(*c);
            let mut slx = sumlx - w * v * l;
            if slx > 0.0 {
                let mut sl2 = suml2 - w * l * l;
                let new_l = nearest_int(v * sl2 / slx).clamp(-nmax, nmax - 1);
                if new_l != i32::from(*c) {
                    slx += w * v * new_l as f32;
                    sl2 += w * new_l as f32 * new_l as f32;
                    if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                        *c = new_l as i8;
                        sumlx = slx;
                        suml2 = sl2;
                        changed = true;
                    }
                }
            }
        }
        if !changed {
            break;
        }
    }
    for c in codes.iter_mut() {
        *c += nmax as i8;
    }
    if suml2 > 0.0 { sumlx / suml2 } else { 0.0 }
}

/// The search settings of [`make_qkx2_quants`] for one K type.
struct Qkx2 {
    nmax: i32,
    rmin: f32,
    rdelta: f32,
    nstep: i32,
    use_mad: bool,
}

/// Codes in `[0, nmax]` for `x ~ scale * code - min` (`make_qkx2_quants`): start from the
/// group's range, then for `nstep + 1` stretched ranges take the weighted least-squares scale
/// and min of their codes, keeping whichever has the least weighted error (absolute or squared).
/// Returns `(scale, min)` with `min >= 0`.
fn make_qkx2_quants(p: &Qkx2, x: &[f32], weights: &[f32], codes: &mut [u8]) -> (f32, f32) {
    let n = x.len();
    let (mut min, mut max) = (x[0], x[0]);
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        let w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        codes.fill(0);
        return (0.0, -min);
    }
    let nmax = p.nmax as f32;
    let error = |scale: f32, min: f32, codes: &[u8]| {
        let mut err = 0.0f32;
        for i in 0..n {
            let diff = scale * f32::from(codes[i]) + min - x[i];
            err += weights[i] * if p.use_mad { diff.abs() } else { diff * diff };
        }
        err
    };
    let mut iscale = nmax / (max - min);
    let mut scale = 1.0 / iscale;
    for i in 0..n {
        codes[i] = nearest_int(iscale * (x[i] - min)).clamp(0, p.nmax) as u8;
    }
    let mut best_error = error(scale, min, codes);
    let mut aux = [0u8; 32];
    let aux = &mut aux[..n];
    for is in 0..=p.nstep {
        iscale = (p.rmin + p.rdelta * is as f32 + nmax) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0.0f32, 0.0f32, 0.0f32);
        for i in 0..n {
            let l = nearest_int(iscale * (x[i] - min)).clamp(0, p.nmax);
            aux[i] = l as u8;
            let (w, l) = (weights[i], l as f32);
            sum_l += w * l;
            sum_l2 += w * l * l;
            sum_xl += w * l * x[i];
        }
        let det = sum_w * sum_l2 - sum_l * sum_l;
        if det > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let cur_error = error(this_scale, this_min, aux);
            if cur_error < best_error {
                codes.copy_from_slice(aux);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// Two-bit codes of 256 values, four 32-value stretches per 32 bytes (Q2_K's and Q3_K's `qs`).
fn pack_2bit(codes: &[u8; 256], out: &mut [u8]) {
    for half in 0..2 {
        for l in 0..32 {
            let j = half * 128 + l;
            out[half * 32 + l] = codes[j] | (codes[j + 32] << 2) | (codes[j + 64] << 4) | (codes[j + 96] << 6);
        }
    }
}

/// Q2_K: 16 groups of 16 with 4-bit scale and min each (`x ~ d * sc * q - dmin * m`), the group
/// fits minimising absolute error weighted by `|x|`.
pub(super) fn q2_k(x: &[f32], out: &mut [u8]) {
    const P: Qkx2 = Qkx2 { nmax: 3, rmin: -0.5, rdelta: 0.1, nstep: 15, use_mad: true };
    let mut codes = [0u8; 256];
    let mut scales = [0f32; 16];
    let mut mins = [0f32; 16];
    let (mut max_scale, mut max_min) = (0.0f32, 0.0f32);
    for j in 0..16 {
        let xs = &x[16 * j..16 * j + 16];
        let weights: [f32; 16] = std::array::from_fn(|l| xs[l].abs());
        (scales[j], mins[j]) = make_qkx2_quants(&P, xs, &weights, &mut codes[16 * j..16 * j + 16]);
        if scales[j] > max_scale {
            max_scale = scales[j];
        }
        if mins[j] > max_min {
            max_min = mins[j];
        }
    }
    let (sc, rest) = out.split_at_mut(16);
    let (qs, dd) = rest.split_at_mut(64);
    sc.fill(0);
    let d = if max_scale > 0.0 {
        let iscale = 15.0 / max_scale;
        for j in 0..16 {
            sc[j] = nearest_int(iscale * scales[j]) as u8;
        }
        store_f16(&mut dd[..2], max_scale / 15.0)
    } else {
        store_f16(&mut dd[..2], 0.0)
    };
    let dmin = if max_min > 0.0 {
        let iscale = 15.0 / max_min;
        for j in 0..16 {
            sc[j] |= (nearest_int(iscale * mins[j]) << 4) as u8;
        }
        store_f16(&mut dd[2..], max_min / 15.0)
    } else {
        store_f16(&mut dd[2..], 0.0)
    };
    for ((&s, xs), cs) in sc.iter().zip(x.chunks_exact(16)).zip(codes.chunks_exact_mut(16)) {
        let dl = d * f32::from(s & 0xf);
        if dl == 0.0 {
            continue;
        }
        let ml = dmin * f32::from(s >> 4);
        for (c, &v) in cs.iter_mut().zip(xs) {
            *c = nearest_int((v + ml) / dl).clamp(0, 3) as u8;
        }
    }
    pack_2bit(&codes, qs);
}

/// Q3_K: 16 groups of 16 with signed 6-bit scales, 3-bit codes split into 2 low bits and a high
/// bit mask.
pub(super) fn q3_k(x: &[f32], out: &mut [u8]) {
    let mut codes = [0i8; 256];
    let mut scales = [0f32; 16];
    let (mut max_scale, mut amax) = (0.0f32, 0.0f32);
    for j in 0..16 {
        scales[j] = make_q3_quants(4, &x[16 * j..16 * j + 16], &mut codes[16 * j..16 * j + 16]);
        if scales[j].abs() > amax {
            amax = scales[j].abs();
            max_scale = scales[j];
        }
    }
    let (hmask, rest) = out.split_at_mut(32);
    let (qs, rest) = rest.split_at_mut(64);
    let (sc, dd) = rest.split_at_mut(12);
    sc.fill(0);
    let d = if max_scale != 0.0 {
        let iscale = -32.0 / max_scale;
        for j in 0..16 {
            let l = ((nearest_int(iscale * scales[j]) as i8).clamp(-32, 31) + 32) as u8;
            if j < 8 {
                sc[j] = l & 0xf;
            } else {
                sc[j - 8] |= (l & 0xf) << 4;
            }
            sc[j % 4 + 8] |= (l >> 4) << (2 * (j / 4));
        }
        store_f16(dd, 1.0 / iscale)
    } else {
        store_f16(dd, 0.0)
    };
    for j in 0..16 {
        let low = if j < 8 { sc[j] & 0xf } else { sc[j - 8] >> 4 };
        let s = (low | (((sc[8 + j % 4] >> (2 * (j / 4))) & 3) << 4)) as i8 - 32;
        let dl = d * f32::from(s);
        if dl == 0.0 {
            continue;
        }
        for i in 16 * j..16 * j + 16 {
            codes[i] = nearest_int(x[i] / dl).clamp(-4, 3) as i8 + 4;
        }
    }
    hmask.fill(0);
    let mut low = [0u8; 256];
    for (j, &c) in codes.iter().enumerate() {
        // High bit of value j goes to byte j % 32, bit j / 32.
        let mut c = c as u8;
        if c > 3 {
            hmask[j % 32] |= 1 << (j / 32);
            c -= 4;
        }
        low[j] = c;
    }
    pack_2bit(&low, qs);
}

/// Q4_K and Q5_K share their scales: 8 groups of 32, each with a 6-bit scale and 6-bit min
/// packed into 12 bytes, fitted minimising squared error weighted by `rms(x) + |x|`. Writes `d`,
/// `dmin` and the 12 scale bytes into `head` and returns the final codes in `[0, nmax]`.
fn k_scales_and_codes(x: &[f32], p: &Qkx2, head: &mut [u8]) -> [u8; 256] {
    let mut codes = [0u8; 256];
    let mut scales = [0f32; 8];
    let mut mins = [0f32; 8];
    let (mut max_scale, mut max_min) = (0.0f32, 0.0f32);
    for j in 0..8 {
        let xs = &x[32 * j..32 * j + 32];
        let mut sum_x2 = 0.0f32;
        for &v in xs {
            sum_x2 += v * v;
        }
        let av_x = (sum_x2 / 32.0).sqrt();
        let weights: [f32; 32] = std::array::from_fn(|l| av_x + xs[l].abs());
        (scales[j], mins[j]) = make_qkx2_quants(p, xs, &weights, &mut codes[32 * j..32 * j + 32]);
        if scales[j] > max_scale {
            max_scale = scales[j];
        }
        if mins[j] > max_min {
            max_min = mins[j];
        }
    }
    let inv_scale = if max_scale > 0.0 { 63.0 / max_scale } else { 0.0 };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let (dd, sc) = head.split_at_mut(4);
    for j in 0..8 {
        let ls = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        let lm = (nearest_int(inv_min * mins[j]) as u8).min(63);
        if j < 4 {
            sc[j] = ls;
            sc[j + 4] = lm;
        } else {
            sc[j + 4] = (ls & 0xf) | ((lm & 0xf) << 4);
            sc[j - 4] |= (ls >> 4) << 6;
            sc[j] |= (lm >> 4) << 6;
        }
    }
    let d = store_f16(&mut dd[..2], max_scale / 63.0);
    let dmin = store_f16(&mut dd[2..], max_min / 63.0);
    for j in 0..8 {
        let (s, m) = if j < 4 {
            (sc[j] & 63, sc[j + 4] & 63)
        } else {
            ((sc[j + 4] & 0xf) | ((sc[j - 4] >> 6) << 4), (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4))
        };
        let dl = d * f32::from(s);
        if dl == 0.0 {
            continue;
        }
        let ml = dmin * f32::from(m);
        for i in 32 * j..32 * j + 32 {
            codes[i] = nearest_int((x[i] + ml) / dl).clamp(0, p.nmax) as u8;
        }
    }
    codes
}

/// Q4_K: `d, dmin`, 12 scale bytes, then 4-bit codes, 32 bytes per 64 values (low nibbles the
/// first 32).
pub(super) fn q4_k(x: &[f32], out: &mut [u8]) {
    const P: Qkx2 = Qkx2 { nmax: 15, rmin: -1.0, rdelta: 0.1, nstep: 20, use_mad: false };
    let (head, qs) = out.split_at_mut(16);
    let codes = k_scales_and_codes(x, &P, head);
    for (c, q) in codes.chunks_exact(64).zip(qs.chunks_exact_mut(32)) {
        for l in 0..32 {
            q[l] = c[l] | (c[l + 32] << 4);
        }
    }
}

/// Q5_K: Q4_K's layout with a fifth bit per value in `qh` (bit `2k` or `2k + 1` for the k-th
/// 64-value stretch's low or high half).
pub(super) fn q5_k(x: &[f32], out: &mut [u8]) {
    const P: Qkx2 = Qkx2 { nmax: 31, rmin: -0.5, rdelta: 0.1, nstep: 15, use_mad: false };
    let (head, rest) = out.split_at_mut(16);
    let (qh, qs) = rest.split_at_mut(32);
    let codes = k_scales_and_codes(x, &P, head);
    qh.fill(0);
    for (k, (c, q)) in codes.chunks_exact(64).zip(qs.chunks_exact_mut(32)).enumerate() {
        for j in 0..32 {
            let (lo, hi) = (c[j], c[j + 32]);
            qh[j] |= ((lo >> 4) << (2 * k)) | ((hi >> 4) << (2 * k + 1));
            q[j] = (lo & 0xf) | ((hi & 0xf) << 4);
        }
    }
}

/// Q6_K: 16 groups of 16 with signed 8-bit scales, 6-bit codes as 4 low bits in `ql` and 2 high
/// bits in `qh`.
pub(super) fn q6_k(x: &[f32], out: &mut [u8]) {
    let mut codes = [0u8; 256];
    let mut scales = [0f32; 16];
    let (mut max_scale, mut max_abs) = (0.0f32, 0.0f32);
    for ib in 0..16 {
        scales[ib] = make_qx_quants(32, &x[16 * ib..16 * ib + 16], &mut codes[16 * ib..16 * ib + 16]);
        if scales[ib].abs() > max_abs {
            max_abs = scales[ib].abs();
            max_scale = scales[ib];
        }
    }
    if max_abs < GROUP_MAX_EPS {
        out.fill(0);
        return;
    }
    let (ql, rest) = out.split_at_mut(128);
    let (qh, rest) = rest.split_at_mut(64);
    let (sc, dd) = rest.split_at_mut(16);
    let iscale = -128.0 / max_scale;
    let d = store_f16(dd, 1.0 / iscale);
    for ib in 0..16 {
        sc[ib] = nearest_int(iscale * scales[ib]).min(127) as i8 as u8;
    }
    for ((&s, xs), cs) in sc.iter().zip(x.chunks_exact(16)).zip(codes.chunks_exact_mut(16)) {
        let dl = d * f32::from(s as i8);
        if dl == 0.0 {
            continue;
        }
        for (c, &v) in cs.iter_mut().zip(xs) {
            *c = (nearest_int(v / dl).clamp(-32, 31) + 32) as u8;
        }
    }
    for (c, (ql, qh)) in codes.chunks_exact(128).zip(ql.chunks_exact_mut(64).zip(qh.chunks_exact_mut(32))) {
        for l in 0..32 {
            ql[l] = (c[l] & 0xf) | ((c[l + 64] & 0xf) << 4);
            ql[l + 32] = (c[l + 32] & 0xf) | ((c[l + 96] & 0xf) << 4);
            qh[l] = (c[l] >> 4) | ((c[l + 32] >> 4) << 2) | ((c[l + 64] >> 4) << 4) | ((c[l + 96] >> 4) << 6);
        }
    }
}

/// The index of the IQ4 codebook value nearest `x` (ties to the upper one), by bisection as
/// ggml's `best_index_int8` does.
fn best_index(x: f32) -> u8 {
    let v = |i: usize| f32::from(KVALUES_IQ4NL[i]);
    if x <= v(0) {
        return 0;
    }
    if x >= v(15) {
        return 15;
    }
    let (mut lo, mut hi) = (0, 15);
    while hi - lo > 1 {
        let mid = (lo + hi) / 2;
        if x < v(mid) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    if x - v(hi - 1) < v(hi) - x { (hi - 1) as u8 } else { hi as u8 }
}

/// The scale of one 32-value IQ4 block: from `max / -127`, try 15 scales `(t - 127) / max` for
/// `t` in `-7..=7` and keep the best `x^2`-weighted least-squares fit (ggml's
/// `quantize_row_iq4_nl_impl` with no importance matrix and 7 tries). `None` for an all-zero
/// block.
fn iq4_block_scale(x: &[f32]) -> Option<f32> {
    let (max, amax) = signed_absmax(x);
    if amax < GROUP_MAX_EPS {
        return None;
    }
    let v0 = KVALUES_IQ4NL[0];
    let fit = |id: f32| {
        let (mut sumqx, mut sumq2) = (0.0f32, 0.0f32);
        for &v in x {
            let q = f32::from(KVALUES_IQ4NL[usize::from(best_index(id * v))]);
            let w = v * v;
            sumqx += w * q * v;
            sumq2 += w * q * q;
        }
        (sumqx, sumq2)
    };
    let d = -max / f32::from(v0);
    let (sumqx, sumq2) = fit(1.0 / d);
    let mut d = if sumq2 > 0.0 { sumqx / sumq2 } else { 0.0 };
    let mut best = d * sumqx;
    for t in -7..=7 {
        let (sumqx, sumq2) = fit((t + i32::from(v0)) as f32 / max);
        if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
            d = sumqx / sumq2;
            best = d * sumqx;
        }
    }
    Some(d)
}

/// Packs 32 four-bit IQ4 codes, the first 16 in the low nibbles.
fn pack_iq4(x: &[f32], inv: f32, out: &mut [u8]) {
    let codes: [u8; 32] = std::array::from_fn(|j| best_index(inv * x[j]));
    for j in 0..16 {
        out[j] = codes[j] | (codes[j + 16] << 4);
    }
}

/// IQ4_NL: an f16 scale and 32 indices into the non-linear codebook, chosen with the f32 scale.
pub(super) fn iq4_nl(x: &[f32], out: &mut [u8]) {
    let d = iq4_block_scale(x).unwrap_or(0.0);
    store_f16(&mut out[..2], d);
    let inv = if d != 0.0 { 1.0 / d } else { 0.0 };
    pack_iq4(x, inv, &mut out[2..]);
}

/// IQ4_XS: IQ4_NL's blocks of 32 under one f16 scale, each with a 6-bit signed block scale
/// (low 4 bits in `scales_l`, high 2 in `scales_h`).
pub(super) fn iq4_xs(x: &[f32], out: &mut [u8]) {
    let mut scales = [0f32; 8];
    let (mut max_scale, mut amax_scale) = (0.0f32, 0.0f32);
    for (ib, s) in scales.iter_mut().enumerate() {
        if let Some(d) = iq4_block_scale(&x[32 * ib..32 * ib + 32]) {
            *s = d;
            if d.abs() > amax_scale {
                amax_scale = d.abs();
                max_scale = d;
            }
        }
    }
    let (head, qs) = out.split_at_mut(8);
    // An all-zero block stores -0.0, as the C's `-max_scale / 32` does.
    let d = -max_scale / 32.0;
    store_f16(&mut head[..2], d);
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut scales_h = 0u16;
    let scales_l = &mut head[4..8];
    for ib in 0..8 {
        let l = nearest_int(id * scales[ib]).clamp(-32, 31);
        let dl = d * l as f32;
        let idl = if dl != 0.0 { 1.0 / dl } else { 0.0 };
        pack_iq4(&x[32 * ib..32 * ib + 32], idl, &mut qs[16 * ib..16 * ib + 16]);
        let l = (l + 32) as u8;
        if ib % 2 == 0 {
            scales_l[ib / 2] = l & 0xf;
        } else {
            scales_l[ib / 2] |= (l & 0xf) << 4;
        }
        scales_h |= u16::from(l >> 4) << (2 * (ib % 8));
    }
    head[2..4].copy_from_slice(&scales_h.to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_int_rounds_half_to_even() {
        let cases = [(0.5, 0), (1.5, 2), (2.5, 2), (-0.5, 0), (-1.5, -2), (-2.5, -2), (2.4999998, 2), (-7.6, -8)];
        for (x, want) in cases {
            assert_eq!(nearest_int(x), want, "{x}");
        }
    }

    #[test]
    fn best_index_picks_the_nearest_value() {
        for i in -200..200 {
            let x = i as f32 * 0.75;
            let got = KVALUES_IQ4NL[usize::from(best_index(x))];
            let nearest = KVALUES_IQ4NL.iter().map(|&v| (f32::from(v) - x).abs()).fold(f32::INFINITY, f32::min);
            assert_eq!((f32::from(got) - x).abs(), nearest, "{x}");
        }
    }
}
