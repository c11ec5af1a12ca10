// MLX affine quantization: value `c` of the flat `[rows, columns]` weight is the `bits`-wide
// field at bit `c * bits` of the little-endian word stream (32 values fill exactly `bits`
// words, so 3-, 5- and 6-bit values may straddle two words), and its group `c / group` gives
// the scale and bias. Dequantized values are `T(T(q * scale) + bias)` with `T` the dtype of the
// scales, each step rounded as MLX rounds it.
//
// `KIND`, the float kind of scales and biases and so of the dequantized values (0 f32, 1 f16,
// 2 bf16), is a constant put before this file (see `quant.rs`): each kind compiles to its own
// kernels, without the others' rounding.

const STREAMS: u32 = 3u;

struct Params {
    product: Product,
    // Decode: the values to dequantize (a multiple of 32).
    count: u32,
    bits: u32,
    group: u32,
    // In elements of each stream.
    weight_offset: u32,
    scales_offset: u32,
    biases_offset: u32,
    // Always 0; see `dequantize_values`.
    opaque: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> weight: array<u32>;
@group(0) @binding(2) var<storage, read> scales: array<u32>;
@group(0) @binding(3) var<storage, read> biases: array<u32>;

fn read_scale(g: u32) -> f32 {
    let i = params.scales_offset + g;
    let word = scales[first_word(KIND, i)];
    return decode(KIND, i, word, word);
}

fn read_group_bias(g: u32) -> f32 {
    let i = params.biases_offset + g;
    let word = biases[first_word(KIND, i)];
    return decode(KIND, i, word, word);
}

// The storage bits of `T(T(q * scale) + bias)`. The product goes through its storage bits and
// an exclusive or with `params.opaque`, a zero the compiler cannot see: it can then neither
// fuse the multiply and the add into one FMA nor skip the product's own rounding, which would
// change hundreds of values of a matrix.
fn dequantize_values(q: vec4<u32>, scale: f32, bias: f32) -> vec4<u32> {
    let product = widen(KIND, narrow(KIND, vec4<f32>(q) * scale) ^ vec4<u32>(params.opaque));
    return narrow(KIND, product + bias);
}

// The storage bits of values `e..e + 8` of the flat weight (`e` a multiple of 8). They are
// `8 * bits` bits from a byte boundary, so they lie in at most two words.
fn unit_bits(e: u32) -> Bits {
    let bits = params.bits;
    let word = params.weight_offset + (e >> 5u) * bits + (((e & 31u) * bits) >> 5u);
    let shift = ((e & 31u) * bits) & 31u;
    var low = weight[word] >> shift;
    var high = 0u;
    if shift + 8u * bits > 32u {
        let next = weight[word + 1u];
        if shift > 0u {
            low |= next << (32u - shift);
        }
        high = next >> shift;
    }
    let g = e / params.group;
    let scale = read_scale(g);
    let bias = read_group_bias(g);
    let at = vec4<u32>(0u, 1u, 2u, 3u) * bits;
    return Bits(
        dequantize_values(fields(low, high, at, bits), scale, bias),
        dequantize_values(fields(low, high, at + vec4<u32>(4u * bits), bits), scale, bias),
    );
}

fn weight_unit(row: u32, first: u32) -> Unit {
    let bits = unit_bits(row * params.product.k + first);
    return Unit(widen(KIND, bits.low), widen(KIND, bits.high));
}

// One invocation per 8 values: 8 words of f32, or 4 words of two f16 or bf16 each (element
// 2i in the low half).
@compute @workgroup_size(256)
fn dequantize(@builtin(workgroup_id) group: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
              @builtin(local_invocation_index) local: u32) {
    let e = invocation(group, groups, local) * 8u;
    if e >= params.count {
        return;
    }
    let values = unit_bits(e);
    if KIND == 0u {
        for (var j = 0u; j < 4u; j++) {
            out[e + j] = values.low[j];
            out[e + 4u + j] = values.high[j];
        }
    } else {
        let low = pairs(values.low);
        let high = pairs(values.high);
        let at = e / 2u;
        out[at] = low.x;
        out[at + 1u] = low.y;
        out[at + 2u] = high.x;
        out[at + 3u] = high.y;
    }
}
