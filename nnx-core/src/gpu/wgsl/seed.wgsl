// SeedLM SEED4 and SEED4P4: block `g` (8 values of the flat `[slices * rows, columns]` weight)
// is rebuilt from its 16-bit LFSR seed and P 4-bit coefficients:
// `w_c = bf16(f32(sum_p S[c][p] * q_p) * R32 * 2^e)` with `S[c][p]` the state `c * P + p + 1`
// after the seed, less 32768. Integer sums and one f32 product, so the values equal the
// host's bit for bit.
//
// `COEFFICIENTS`, P (3 for SEED4 with the exponent code in the coefficient word, 4 for SEED4P4
// with the codes in `codes`), is a constant put before this file (see `quant.rs`): each
// encoding compiles to its own kernels.

const STREAMS: u32 = 4u;

// The f32 nearest to 1/32767 (bits 0x38000100).
const R32: f32 = 0x1.0002p-15f;

struct Params {
    product: Product,
    // Decode: the blocks to decode.
    blocks: u32,
    // Rows of one slice.
    rows: u32,
    // Blocks of one row (columns / 8).
    row_blocks: u32,
    // Product: the flat row of the slice's first row.
    first_row: u32,
    // In elements of each stream.
    seeds_offset: u32,
    coefficients_offset: u32,
    exp_bias_offset: u32,
    codes_offset: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
// U16 seeds and coefficient words, two per word (element 2i in the low half).
@group(0) @binding(1) var<storage, read> seeds: array<u32>;
@group(0) @binding(2) var<storage, read> coefficient_words: array<u32>;
// I32, one per slice.
@group(0) @binding(3) var<storage, read> exp_bias: array<i32>;
// U8 exponent codes, two per byte (SEED4P4; any buffer for SEED4), four bytes per word.
@group(0) @binding(4) var<storage, read> codes: array<u32>;

fn read_seed(g: u32) -> u32 {
    let i = params.seeds_offset + g;
    return (seeds[i >> 1u] >> ((i & 1u) * 16u)) & 0xffffu;
}

fn read_coefficient_word(g: u32) -> u32 {
    let i = params.coefficients_offset + g;
    return (coefficient_words[i >> 1u] >> ((i & 1u) * 16u)) & 0xffffu;
}

// The exponent code of block `g` of a SEED4P4 weight: the low nibble of byte `g / 2` for even
// `g`, the high one for odd `g`.
fn read_code(g: u32) -> u32 {
    let i = params.codes_offset + g / 2u;
    let byte = (codes[i >> 2u] >> ((i & 3u) * 8u)) & 0xffu;
    return (byte >> ((g & 1u) * 4u)) & 0xfu;
}

// The 4-bit two's-complement field at bit `shift` of `word`.
fn nibble(word: u32, shift: u32) -> i32 {
    return bitcast<i32>(word << (28u - shift)) >> 28u;
}

// `R32 * 2^e` as the host computes it: exact in the normal range; below it the host's
// `powi` gives 2^-127 for -127 and 0 under that, above it infinity.
fn block_scale(e: i32) -> f32 {
    var power = 0.0;
    if e > 127 {
        power = bitcast<f32>(0x7f800000u);
    } else if e >= -126 {
        power = bitcast<f32>(u32(e + 127) << 23u);
    } else if e == -127 {
        power = bitcast<f32>(0x00400000u);
    }
    return R32 * power;
}

// Bits `at..at + 32` of the 64-bit value `high:low` (`at` below 64; bits past 63 are zero).
fn window(low: u32, high: u32, at: u32) -> u32 {
    if at >= 32u {
        return high >> (at - 32u);
    }
    if at == 0u {
        return low;
    }
    return (low >> at) | (high << (32u - at));
}

// `isum_c = sum_p S[c][p] * q_p` for value `c` of a block whose register output is
// `high:low`; with 3 coefficients the fourth state is read but multiplied by zero.
fn block_sum(low: u32, high: u32, c: u32, q: vec4<i32>) -> i32 {
    let first = c * COEFFICIENTS + 1u;
    let states = fields(low, high, vec4<u32>(first, first + 1u, first + 2u, first + 3u), 16u);
    return dot(vec4<i32>(states) - vec4<i32>(32768), q);
}

// The bf16 bits of the 8 values of block `g`.
fn block_bits(g: u32) -> Bits {
    let word = read_coefficient_word(g);
    var q = vec4<i32>(0);
    var code = 0u;
    if COEFFICIENTS == 3u {
        code = word & 0xfu;
        q = vec4<i32>(nibble(word, 4u), nibble(word, 8u), nibble(word, 12u), 0);
    } else {
        code = read_code(g);
        q = vec4<i32>(nibble(word, 0u), nibble(word, 4u), nibble(word, 8u), nibble(word, 12u));
    }
    let slice = g / params.row_blocks / params.rows;
    let bias = exp_bias[params.exp_bias_offset + slice];
    // Saturating, as the host adds: a bias near the top of i32 gives infinity, not a wrap.
    var e = 2147483647;
    if bias <= 2147483647 - i32(code) {
        e = bias + i32(code);
    }
    let scale = block_scale(e);
    // The register's output from the seed on, four bits a round (new bit `16 + i` is the xor
    // of bits `i`, `i + 1`, `i + 3` and `i + 12`): bits `k..k + 16` are the state after `k`
    // steps, up to the 32 states a block uses.
    var low = read_seed(g);
    for (var known = 16u; known < 32u; known += 4u) {
        let next = low ^ (low >> 1u) ^ (low >> 3u) ^ (low >> 12u);
        low |= ((next >> (known - 16u)) & 0xfu) << known;
    }
    var high = 0u;
    for (var known = 32u; known < 48u; known += 4u) {
        let i = known - 16u;
        let next = window(low, high, i) ^ window(low, high, i + 1u) ^ window(low, high, i + 3u)
            ^ window(low, high, i + 12u);
        high |= (next & 0xfu) << (known - 32u);
    }
    let sums_low = vec4<i32>(block_sum(low, high, 0u, q), block_sum(low, high, 1u, q),
                             block_sum(low, high, 2u, q), block_sum(low, high, 3u, q));
    let sums_high = vec4<i32>(block_sum(low, high, 4u, q), block_sum(low, high, 5u, q),
                              block_sum(low, high, 6u, q), block_sum(low, high, 7u, q));
    return Bits(bf16_bits(vec4<f32>(sums_low) * scale), bf16_bits(vec4<f32>(sums_high) * scale));
}

fn weight_unit(row: u32, first: u32) -> Unit {
    let bits = block_bits((params.first_row + row) * params.row_blocks + first / 8u);
    return Unit(bitcast<vec4<f32>>(bits.low << vec4<u32>(16u)), bitcast<vec4<f32>>(bits.high << vec4<u32>(16u)));
}

// One invocation per block: 4 words of two bf16 each (element 2i in the low half).
@compute @workgroup_size(256)
fn decode_blocks(@builtin(workgroup_id) group: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
                 @builtin(local_invocation_index) local: u32) {
    let g = invocation(group, groups, local);
    if g >= params.blocks {
        return;
    }
    let values = block_bits(g);
    let low = pairs(values.low);
    let high = pairs(values.high);
    out[g * 4u] = low.x;
    out[g * 4u + 1u] = low.y;
    out[g * 4u + 2u] = high.x;
    out[g * 4u + 3u] = high.y;
}
