// ggml block types (after `quant.wgsl`, before `qmatmul.wgsl`): a weight `[n, k]` stored as
// GGUF stores it, `n` rows of `row_bytes` bytes, each row `k / BLOCK` blocks of `TYPE_SIZE`
// bytes laid end to end (one value per "block" for F32, F16 and BF16). Nothing in a block is
// aligned, so the bytes are read from 32-bit words with `u32_at`, `u16_at` and `bytes8`.
//
// `GGML` (the type's ggml id), `BLOCK` and `TYPE_SIZE` are constants put before the prelude
// (see `ggml.rs`): each type compiles to its own kernels, the others' decoders folded away.
//
// Decoded values equal the host's (`quant/ggml/dequant.rs`) bit for bit: f16 scales are widened
// in integer arithmetic (exact for subnormals and NaN payloads on any adapter), and each value
// is the host's f32 operations in the host's order. The only rounding steps that a fused
// multiply-add could change are the `+ m` and `- dmin * m` of Q4_1, Q5_1, Q2_K, Q4_K and Q5_K,
// whose products are exact (an f16 times small integers needs at most 24 bits), so fusion
// cannot change a bit there either.

const STREAMS: u32 = 1u;

struct Params {
    product: Product,
    // Decode: the units of 8 values to decode (`n * ceil(k / 8)`).
    units: u32,
    // Values per row (`k`).
    columns: u32,
    // Bytes per row.
    row_bytes: u32,
    // The byte of the buffer where the first row starts.
    weight_offset: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
// U8 blocks, four bytes per word (byte 4i in the low bits).
@group(0) @binding(1) var<storage, read> blocks: array<u32>;

// The little-endian u32 at byte `i` (two words when it straddles them).
fn u32_at(i: u32) -> u32 {
    let shift = (i & 3u) * 8u;
    let low = blocks[i >> 2u];
    if shift == 0u {
        return low;
    }
    return (low >> shift) | (blocks[(i >> 2u) + 1u] << (32u - shift));
}

// The little-endian u16 at byte `i`.
fn u16_at(i: u32) -> u32 {
    let shift = (i & 3u) * 8u;
    var value = blocks[i >> 2u] >> shift;
    if shift == 24u {
        value |= blocks[(i >> 2u) + 1u] << 8u;
    }
    return value & 0xffffu;
}

fn byte_at(i: u32) -> u32 {
    return (blocks[i >> 2u] >> ((i & 3u) * 8u)) & 0xffu;
}

// The four bytes of a word, low byte first.
fn unpack_bytes(word: u32) -> vec4<u32> {
    return (vec4<u32>(word) >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(0xffu);
}

// Bytes `i..i + 8`.
fn bytes8(i: u32) -> Bits {
    return Bits(unpack_bytes(u32_at(i)), unpack_bytes(u32_at(i + 4u)));
}

// The `width`-bit fields at bit `shift` of eight bytes.
fn field8(bytes: Bits, shift: u32, width: u32) -> Bits {
    let mask = vec4<u32>((1u << width) - 1u);
    return Bits((bytes.low >> vec4<u32>(shift)) & mask, (bytes.high >> vec4<u32>(shift)) & mask);
}

// Eight fields as f32, less `offset`.
fn centered(q: Bits, offset: i32) -> Unit {
    return Unit(vec4<f32>(vec4<i32>(q.low) - vec4<i32>(offset)), vec4<f32>(vec4<i32>(q.high) - vec4<i32>(offset)));
}

fn as_f32(q: Bits) -> Unit {
    return Unit(vec4<f32>(q.low), vec4<f32>(q.high));
}

// The f32 bits of the f16 `bits`, exactly (as the host's `f16_to_f32`, NaN payloads and quiet
// bits kept): no float instruction, so no adapter's treatment of subnormals or NaN matters.
fn f16_to_f32_bits(bits: u32) -> u32 {
    let sign = (bits & 0x8000u) << 16u;
    let exponent = (bits >> 10u) & 0x1fu;
    let mantissa = bits & 0x3ffu;
    if exponent == 0x1fu {
        return sign | 0x7f800000u | (mantissa << 13u);
    }
    if exponent != 0u {
        return sign | ((exponent + 112u) << 23u) | (mantissa << 13u);
    }
    if mantissa == 0u {
        return sign;
    }
    // A subnormal `mantissa * 2^-24` is the normal f32 `1.f * 2^(top - 24)`.
    let top = firstLeadingBit(mantissa);
    return sign | ((top + 103u) << 23u) | ((mantissa << (23u - top)) & 0x7fffffu);
}

// The f16 at byte `i`, as f32.
fn f16_at(i: u32) -> f32 {
    return bitcast<f32>(f16_to_f32_bits(u16_at(i)));
}

// IQ4_NL's codebook (`KVALUES_IQ4NL`), four i8 to a word.
const IQ4NL: vec4<u32> = vec4<u32>(0xbfad9881u, 0xf6eaddcfu, 0x26190d01u, 0x71594535u);

// MXFP4's E2M1 values, doubled (`KVALUES_FP4`), four i8 to a word.
const FP4: vec4<u32> = vec4<u32>(0x03020100u, 0x0c080604u, 0xfdfeff00u, 0xf4f8fafcu);

// Entry `q` (a 4-bit code) of a codebook of 16 i8, four to a word.
fn codebook_value(book: vec4<u32>, q: u32) -> f32 {
    return f32(bitcast<i32>((book[q >> 2u] >> ((q & 3u) * 8u)) << 24u) >> 24u);
}

fn codebook_values(book: vec4<u32>, q: Bits) -> Unit {
    return Unit(
        vec4<f32>(codebook_value(book, q.low.x), codebook_value(book, q.low.y), codebook_value(book, q.low.z),
                  codebook_value(book, q.low.w)),
        vec4<f32>(codebook_value(book, q.high.x), codebook_value(book, q.high.y), codebook_value(book, q.high.z),
                  codebook_value(book, q.high.w)),
    );
}

// Half an E8M0 exponent byte's value, `2^(e - 128)`, from its bits as the host builds it.
fn e8m0_half(e: u32) -> f32 {
    if e < 2u {
        return bitcast<f32>(0x00200000u << e);
    }
    return bitcast<f32>((e - 1u) << 23u);
}

fn scale(d: f32, q: Unit) -> Unit {
    return Unit(d * q.low, d * q.high);
}

// `dl * q - ml`, one rounding each (an exact product, see the top of this file).
fn scale_less(dl: f32, q: Unit, ml: f32) -> Unit {
    return Unit(dl * q.low - ml, dl * q.high - ml);
}

// `d * q + m`, an exact product then one rounding.
fn scale_plus(d: f32, q: Unit, m: f32) -> Unit {
    return Unit(d * q.low + m, d * q.high + m);
}

// The 4-bit values `i..i + 8` of a 32-value block whose 16 bytes start at `qs`: low nibbles are
// values 0-15, high nibbles values 16-31.
fn nibbles32(qs: u32, i: u32) -> Bits {
    return field8(bytes8(qs + (i & 15u)), (i >> 4u) * 4u, 4u);
}

// The fifth bits of values `i..i + 8` (bit `v` of the little-endian `qh`), at bit 4.
fn high_bits32(qh: u32, i: u32) -> Bits {
    let at = vec4<u32>(i) + vec4<u32>(0u, 1u, 2u, 3u);
    return Bits(((vec4<u32>(qh) >> at) & vec4<u32>(1u)) << vec4<u32>(4u),
                ((vec4<u32>(qh) >> (at + vec4<u32>(4u))) & vec4<u32>(1u)) << vec4<u32>(4u));
}

fn or_bits(a: Bits, b: Bits) -> Bits {
    return Bits(a.low | b.low, a.high | b.high);
}

// The 2-bit fields of values `i..i + 8` of a 256-value block (as `crumb` on the host): each 32
// bytes hold 128 values, four 32-value runs at shifts 0, 2, 4 and 6.
fn crumbs(qs: u32, i: u32) -> Bits {
    return field8(bytes8(qs + 32u * (i / 128u) + (i & 31u)), 2u * ((i & 127u) / 32u), 2u);
}

// Block types, each as `values(x, i)`: values `i..i + 8` of the block at byte `x`.

fn q4_0(x: u32, i: u32) -> Unit {
    return scale(f16_at(x), centered(nibbles32(x + 2u, i), 8));
}

fn q4_1(x: u32, i: u32) -> Unit {
    return scale_plus(f16_at(x), as_f32(nibbles32(x + 4u, i)), f16_at(x + 2u));
}

fn q5_0(x: u32, i: u32) -> Unit {
    let q = or_bits(nibbles32(x + 6u, i), high_bits32(u32_at(x + 2u), i));
    return scale(f16_at(x), centered(q, 16));
}

fn q5_1(x: u32, i: u32) -> Unit {
    let q = or_bits(nibbles32(x + 8u, i), high_bits32(u32_at(x + 4u), i));
    return scale_plus(f16_at(x), as_f32(q), f16_at(x + 2u));
}

fn q8_0(x: u32, i: u32) -> Unit {
    let q = bytes8(x + 2u + i);
    let signed = Unit(vec4<f32>(bitcast<vec4<i32>>(q.low << vec4<u32>(24u)) >> vec4<u32>(24u)),
                      vec4<f32>(bitcast<vec4<i32>>(q.high << vec4<u32>(24u)) >> vec4<u32>(24u)));
    return scale(f16_at(x), signed);
}

// 16 groups of 16: `(d * sc) * q - dmin * m`.
fn q2_k(x: u32, i: u32) -> Unit {
    let sc = byte_at(x + i / 16u);
    let dl = f16_at(x + 80u) * f32(sc & 0xfu);
    let ml = f16_at(x + 82u) * f32(sc >> 4u);
    return scale_less(dl, as_f32(crumbs(x + 16u, i)), ml);
}

// 16 groups of 16: `(d * (sc - 32)) * (q - 4 * !h)`.
fn q3_k(x: u32, i: u32) -> Unit {
    let g = i / 16u;
    let low = (byte_at(x + 96u + (g & 7u)) >> (4u * (g / 8u))) & 0xfu;
    let high = (byte_at(x + 104u + (g & 3u)) >> (2u * (g / 4u))) & 3u;
    let dl = f16_at(x + 108u) * f32(i32(low | (high << 4u)) - 32);
    let h = field8(bytes8(x + (i & 31u)), i / 32u, 1u);
    let q = crumbs(x + 32u, i);
    let offset = Bits((vec4<u32>(1u) - h.low) * vec4<u32>(4u), (vec4<u32>(1u) - h.high) * vec4<u32>(4u));
    return scale(dl, Unit(vec4<f32>(vec4<i32>(q.low) - vec4<i32>(offset.low)),
                          vec4<f32>(vec4<i32>(q.high) - vec4<i32>(offset.high))));
}

// Scale and min of group `g` of Q4_K and Q5_K, from their 12 packed bytes at `at`.
fn scale_min_k4(at: u32, g: u32) -> vec2<u32> {
    if g < 4u {
        return vec2<u32>(byte_at(at + g) & 0x3fu, byte_at(at + g + 4u) & 0x3fu);
    }
    let j = g - 4u;
    let packed = byte_at(at + j + 8u);
    return vec2<u32>((packed & 0xfu) | ((byte_at(at + j) >> 6u) << 4u),
                     (packed >> 4u) | ((byte_at(at + j + 4u) >> 6u) << 4u));
}

// The 4-bit values `i..i + 8` of a Q4_K or Q5_K block: group `g` takes the low (even `g`) or
// high nibbles of bytes `32 * (g / 2)..` of `qs`.
fn nibbles256(qs: u32, i: u32) -> Bits {
    let g = i / 32u;
    return field8(bytes8(qs + 32u * (g / 2u) + (i & 31u)), 4u * (g & 1u), 4u);
}

// 8 groups of 32: `(d * sc) * q - dmin * m`.
fn q4_k(x: u32, i: u32) -> Unit {
    let sm = scale_min_k4(x + 4u, i / 32u);
    return scale_less(f16_at(x) * f32(sm.x), as_f32(nibbles256(x + 16u, i)), f16_at(x + 2u) * f32(sm.y));
}

// As Q4_K with a fifth bit: that of value `l` of group `g` is bit `g` of `qh[l]`.
fn q5_k(x: u32, i: u32) -> Unit {
    let g = i / 32u;
    let sm = scale_min_k4(x + 4u, g);
    let high = field8(bytes8(x + 16u + (i & 31u)), g, 1u);
    let q = or_bits(nibbles256(x + 48u, i), Bits(high.low << vec4<u32>(4u), high.high << vec4<u32>(4u)));
    return scale_less(f16_at(x) * f32(sm.x), as_f32(q), f16_at(x + 2u) * f32(sm.y));
}

// 16 groups of 16: `(d * sc) * (q - 32)` with i8 scales.
fn q6_k(x: u32, i: u32) -> Unit {
    let sc = bitcast<i32>(byte_at(x + 192u + i / 16u) << 24u) >> 24u;
    let dl = f16_at(x + 208u) * f32(sc);
    let half = i / 128u;
    let r = i & 127u;
    let low = field8(bytes8(x + 64u * half + (r & 63u)), 4u * (r / 64u), 4u);
    let high = field8(bytes8(x + 128u + 32u * half + (r & 31u)), 2u * (r / 32u), 2u);
    return scale(dl, centered(Bits(low.low | (high.low << vec4<u32>(4u)), low.high | (high.high << vec4<u32>(4u))), 32));
}

fn iq4_nl(x: u32, i: u32) -> Unit {
    return scale(f16_at(x), codebook_values(IQ4NL, nibbles32(x + 2u, i)));
}

// An E8M0 exponent, then Q4_0's nibble order of E2M1 codes.
fn mxfp4(x: u32, i: u32) -> Unit {
    return scale(e8m0_half(byte_at(x)), codebook_values(FP4, nibbles32(x + 1u, i)));
}

// 8 groups of 32 as IQ4_NL blocks with 6-bit scales: `(d * (s - 32)) * kvalues[q]`.
fn iq4_xs(x: u32, i: u32) -> Unit {
    let ib = i / 32u;
    let low = (byte_at(x + 4u + ib / 2u) >> (4u * (ib & 1u))) & 0xfu;
    let high = (u16_at(x + 2u) >> (2u * ib)) & 3u;
    let dl = f16_at(x) * f32(i32(low | (high << 4u)) - 32);
    return scale(dl, codebook_values(IQ4NL, nibbles32(x + 8u + 16u * ib, i & 31u)));
}

// Plain types: values `x / TYPE_SIZE..` as f32 bits, read straight from their bytes.

fn f32_bits(x: u32) -> Bits {
    return Bits(vec4<u32>(u32_at(x), u32_at(x + 4u), u32_at(x + 8u), u32_at(x + 12u)),
                vec4<u32>(u32_at(x + 16u), u32_at(x + 20u), u32_at(x + 24u), u32_at(x + 28u)));
}

fn f16_bits(x: u32) -> Bits {
    let h = Bits(vec4<u32>(u16_at(x), u16_at(x + 2u), u16_at(x + 4u), u16_at(x + 6u)),
                 vec4<u32>(u16_at(x + 8u), u16_at(x + 10u), u16_at(x + 12u), u16_at(x + 14u)));
    if GGML == 30u {
        return Bits(h.low << vec4<u32>(16u), h.high << vec4<u32>(16u));
    }
    return Bits(vec4<u32>(f16_to_f32_bits(h.low.x), f16_to_f32_bits(h.low.y), f16_to_f32_bits(h.low.z),
                          f16_to_f32_bits(h.low.w)),
                vec4<u32>(f16_to_f32_bits(h.high.x), f16_to_f32_bits(h.high.y), f16_to_f32_bits(h.high.z),
                          f16_to_f32_bits(h.high.w)));
}

// The f32 bits of values `first..first + 8` of row `row` (`first` a multiple of 8; values past
// the row are whatever the bytes after it hold, and the caller ignores them).
fn unit_bits(row: u32, first: u32) -> Bits {
    let x = params.weight_offset + row * params.row_bytes + (first / BLOCK) * TYPE_SIZE;
    let i = first % BLOCK;
    var values = Unit(vec4<f32>(0.0), vec4<f32>(0.0));
    switch GGML {
        case 0u: {
            return f32_bits(x);
        }
        case 1u, 30u: {
            return f16_bits(x);
        }
        case 2u: {
            values = q4_0(x, i);
        }
        case 3u: {
            values = q4_1(x, i);
        }
        case 6u: {
            values = q5_0(x, i);
        }
        case 7u: {
            values = q5_1(x, i);
        }
        case 8u: {
            values = q8_0(x, i);
        }
        case 10u: {
            values = q2_k(x, i);
        }
        case 11u: {
            values = q3_k(x, i);
        }
        case 12u: {
            values = q4_k(x, i);
        }
        case 13u: {
            values = q5_k(x, i);
        }
        case 14u: {
            values = q6_k(x, i);
        }
        case 20u: {
            values = iq4_nl(x, i);
        }
        case 23u: {
            values = iq4_xs(x, i);
        }
        case 39u: {
            values = mxfp4(x, i);
        }
        default: {}
    }
    return Bits(bitcast<vec4<u32>>(values.low), bitcast<vec4<u32>>(values.high));
}

// Products read the weight through this (see `qmatmul.wgsl`); they run only with `k` a
// multiple of 8, so every value is the row's.
fn weight_unit(row: u32, first: u32) -> Unit {
    let bits = unit_bits(row, first);
    return Unit(bitcast<vec4<f32>>(bits.low), bitcast<vec4<f32>>(bits.high));
}

// One invocation per 8 values of a row, written as f32 words of the `[n, k]` output.
@compute @workgroup_size(256)
fn dequantize(@builtin(workgroup_id) group: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
              @builtin(local_invocation_index) local: u32) {
    let index = invocation(group, groups, local);
    if index >= params.units {
        return;
    }
    let columns = params.columns;
    let per_row = (columns + 7u) / 8u;
    let row = index / per_row;
    let first = (index % per_row) * 8u;
    let bits = unit_bits(row, first);
    let at = row * columns + first;
    for (var j = 0u; j < 4u; j++) {
        if first + j < columns {
            out[at + j] = bits.low[j];
        }
        if first + 4u + j < columns {
            out[at + 4u + j] = bits.high[j];
        }
    }
}
