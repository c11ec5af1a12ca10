// The second part of every kernel's prelude (after `prelude.wgsl`): how tensors' floats sit in
// 32-bit words, and conversions between them and f32 in integer arithmetic (so no `shader-f16`
// or `f64` feature is needed).
//
// A tensor's bytes are stored exactly as on the host: f32 one per word, f16 and bf16 two per
// word (element 2i in the low half), f64 one per two words (low word first). WGSL cannot pass
// a storage buffer to a function, so each kernel declares one `read_<name>(i) -> f32` per
// binding from `first_word`, `second_word` and `decode`.
//
// Kinds (the `*_kind` parameters): 0 f32, 1 f16, 2 bf16, 3 f64.

// The word holding element `i` (for f64, its low word).
fn first_word(kind: u32, i: u32) -> u32 {
    switch kind {
        case 1u, 2u: {
            return i >> 1u;
        }
        case 3u: {
            return i << 1u;
        }
        default: {
            return i;
        }
    }
}

// The high word of f64 element `i`; the element's only word for the other kinds.
fn second_word(kind: u32, i: u32) -> u32 {
    if kind == 3u {
        return (i << 1u) + 1u;
    }
    return first_word(kind, i);
}

// Element `i`, as f32, from its words `low` and `high` (`first_word`, `second_word`).
fn decode(kind: u32, i: u32, low: u32, high: u32) -> f32 {
    let odd = (i & 1u) == 1u;
    switch kind {
        case 1u: {
            let pair = unpack2x16float(low);
            return select(pair.x, pair.y, odd);
        }
        case 2u: {
            return bitcast<f32>(select(low << 16u, low & 0xffff0000u, odd));
        }
        case 3u: {
            return bitcast<f32>(f64_to_f32(low, high));
        }
        default: {
            return bitcast<f32>(low);
        }
    }
}

// Rounds `2^exponent * significand / 2^30` (the leading one at bit 30, bit 0 sticky: set when
// any lower bit of the exact value was) to the nearest float with `fraction` fraction bits and
// `width` exponent bits, ties to even, as the host's `half` crate and `as` casts do; overflow
// gives infinity and underflow subnormals or zero. Returns the bits without the sign.
fn round_float(exponent: i32, significand: u32, fraction: u32, width: u32) -> u32 {
    let top = (1u << width) - 1u;
    let biased = exponent + i32(top >> 1u);
    if biased >= i32(top) {
        return top << fraction;
    }
    var shift = 30u - fraction;
    var base = 0u;
    if biased >= 1 {
        // The kept bits include the leading one, which adds the first exponent step.
        base = u32(biased - 1) << fraction;
    } else {
        shift += u32(1 - biased);
        if shift >= 32u {
            return 0u;
        }
    }
    let kept = significand >> shift;
    let dropped = significand & ((1u << shift) - 1u);
    let half = 1u << (shift - 1u);
    var bits = base + kept;
    // A carry out of the fraction steps the exponent (and reaches infinity at the top).
    if dropped > half || (dropped == half && (kept & 1u) == 1u) {
        bits += 1u;
    }
    return bits;
}

// f32 `bits` in the narrower format (`fraction`, `width` as in `round_float`; 10, 5 for f16
// and 7, 8 for bf16), in the low bits. A NaN stays a NaN (quiet, with the top of its payload).
fn narrow_f32(bits: u32, fraction: u32, width: u32) -> u32 {
    let sign = (bits >> 31u) << (fraction + width);
    let exponent = (bits >> 23u) & 0xffu;
    let mantissa = bits & 0x7fffffu;
    let infinity = ((1u << width) - 1u) << fraction;
    if exponent == 0xffu {
        let nan = select(0u, 1u << (fraction - 1u), mantissa != 0u);
        return sign | infinity | nan | (mantissa >> (23u - fraction));
    }
    if exponent == 0u {
        if mantissa == 0u {
            return sign;
        }
        // A subnormal f32: move its leading one to bit 30.
        let leading = 31u - countLeadingZeros(mantissa);
        return sign | round_float(i32(leading) - 149, mantissa << (30u - leading), fraction, width);
    }
    return sign | round_float(i32(exponent) - 127, (0x800000u | mantissa) << 7u, fraction, width);
}

// The f32 bits nearest to the f64 in `low`, `high`.
fn f64_to_f32(low: u32, high: u32) -> u32 {
    let sign = high & 0x80000000u;
    let exponent = (high >> 20u) & 0x7ffu;
    let mantissa = high & 0xfffffu;
    if exponent == 0x7ffu {
        let nan = select(0u, 0x400000u, (mantissa | low) != 0u);
        return sign | 0x7f800000u | nan | (mantissa << 3u) | (low >> 29u);
    }
    if exponent == 0u {
        // Zero, or an f64 subnormal: far below the smallest f32.
        return sign;
    }
    let sticky = select(0u, 1u, (low & 0x3fffffu) != 0u);
    let significand = 0x40000000u | (mantissa << 10u) | (low >> 22u) | sticky;
    return sign | round_float(i32(exponent) - 1023, significand, 23u, 8u);
}

// The bf16 bits of the f64 in `low`, `high`, rounded from the high word alone as the host's
// `half` crate does (its low 32 bits never decide a bf16).
fn f64_to_bf16(high: u32) -> u32 {
    let sign = (high >> 16u) & 0x8000u;
    let exponent = (high >> 20u) & 0x7ffu;
    let mantissa = high & 0xfffffu;
    if exponent == 0x7ffu {
        return sign | 0x7f80u | select(0u, 0x40u, mantissa != 0u) | (mantissa >> 13u);
    }
    if exponent == 0u {
        return sign;
    }
    return sign | round_float(i32(exponent) - 1023, 0x40000000u | (mantissa << 10u), 7u, 8u);
}

// The f64 holding exactly the f32 `bits`, as (low, high) words.
fn widen_f32(bits: u32) -> vec2<u32> {
    let sign = bits & 0x80000000u;
    let exponent = (bits >> 23u) & 0xffu;
    var mantissa = bits & 0x7fffffu;
    var wide = exponent + 896u;
    if exponent == 0xffu {
        // Infinity, or a NaN made quiet as the host's conversion does.
        wide = 0x7ffu;
        if mantissa != 0u {
            mantissa |= 0x400000u;
        }
    } else if exponent == 0u {
        if mantissa == 0u {
            return vec2<u32>(0u, sign);
        }
        // A subnormal f32 is a normal f64: move its leading one to the hidden bit.
        let shift = countLeadingZeros(mantissa) - 8u;
        mantissa = (mantissa << shift) & 0x7fffffu;
        wide = 897u - shift;
    }
    return vec2<u32>(mantissa << 29u, sign | (wide << 20u) | (mantissa >> 3u));
}
