// What the quantized kernels share (after float.wgsl, before `affine.wgsl` or `seed.wgsl` and
// `qmatmul.wgsl`): the shape of a product, the output binding, and rounding to a storage
// format in integer arithmetic so that decoded values equal the host's bit for bit.
//
// An encoding's file declares `STREAMS` (its stream bindings, 1..=STREAMS), its `Params` (with
// a `product: Product` first), a decode entry point, and `weight_unit(row, first) -> Unit`:
// the weight values `first..first + 8` of output row `row`, which `qmatmul.wgsl` multiplies.
// Values go four to a vector, so that a CPU rasterizer runs them as SIMD lanes and a GPU keeps
// them in registers. The output follows the streams, so that a decode
// binds 1..=STREAMS + 1 and a product 1..=STREAMS + 3.

// y = x W^T (+ bias): `x` is `[m, k]` from `x_offset`, `W` is `[n, k]`. Zero in decodes.
// `x` is f32.
struct Product {
    m: u32,
    n: u32,
    k: u32,
    x_offset: u32,
    // 4 when there is no bias.
    bias_kind: u32,
    bias_offset: u32,
    bias_stride: u32,
    // Uniform blocks are read in 16-byte rows.
    _pad: u32,
}

// Decoded values as storage words, or the f32 results of a product.
@group(0) @binding(STREAMS + 1u) var<storage, read_write> out: array<u32>;

// Eight decoded values: storage bits (`Bits`) or their f32 values (`Unit`), `low` holding
// values 0..4.
struct Bits {
    low: vec4<u32>,
    high: vec4<u32>,
}

struct Unit {
    low: vec4<f32>,
    high: vec4<f32>,
}

// The fields of `width` bits (below 32) at bit offsets `at` (below 64) of the 64-bit value
// `high:low`. Shift amounts are kept below 32, where WGSL defines them.
fn fields(low: u32, high: u32, at: vec4<u32>, width: u32) -> vec4<u32> {
    let in_high = at >= vec4<u32>(32u);
    let spills = !in_high & (at + width > vec4<u32>(32u));
    let from_low = vec4<u32>(low) >> (at & vec4<u32>(31u));
    let from_high = vec4<u32>(high) >> ((at - vec4<u32>(32u)) & vec4<u32>(31u));
    let carried = vec4<u32>(high) << ((vec4<u32>(32u) - at) & vec4<u32>(31u));
    let value = select(from_low, from_high, in_high) | select(vec4<u32>(0u), carried, spills);
    return value & vec4<u32>((1u << width) - 1u);
}

// The 16 bits of each value rounded to bfloat16, nearest even, a NaN kept quiet: the host's
// `round_bf16`, step for step.
fn bf16_bits(value: vec4<f32>) -> vec4<u32> {
    let bits = bitcast<vec4<u32>>(value);
    let nan = (bits & vec4<u32>(0x7fffffffu)) > vec4<u32>(0x7f800000u);
    let rounded = (bits + vec4<u32>(0x7fffu) + ((bits >> vec4<u32>(16u)) & vec4<u32>(1u))) >> vec4<u32>(16u);
    return select(rounded, (bits >> vec4<u32>(16u)) | vec4<u32>(0x40u), nan);
}

// The values in the storage format of float kind `kind` (0 f32, 1 f16, 2 bf16), in the low
// bits.
fn narrow(kind: u32, value: vec4<f32>) -> vec4<u32> {
    switch kind {
        case 1u: {
            let bits = bitcast<vec4<u32>>(value);
            return vec4<u32>(narrow_f32(bits.x, 10u, 5u), narrow_f32(bits.y, 10u, 5u), narrow_f32(bits.z, 10u, 5u),
                             narrow_f32(bits.w, 10u, 5u));
        }
        case 2u: {
            return bf16_bits(value);
        }
        default: {
            return bitcast<vec4<u32>>(value);
        }
    }
}

// The f32 equal to each value of kind `kind` stored as `bits` (exact: every f16 and bf16 is an
// f32).
fn widen(kind: u32, bits: vec4<u32>) -> vec4<f32> {
    switch kind {
        case 1u: {
            return vec4<f32>(unpack2x16float(bits.x | (bits.y << 16u)), unpack2x16float(bits.z | (bits.w << 16u)));
        }
        case 2u: {
            return bitcast<vec4<f32>>(bits << vec4<u32>(16u));
        }
        default: {
            return bitcast<vec4<f32>>(bits);
        }
    }
}

// Pairs of 16-bit values packed as storage words, the first of each pair in the low half.
fn pairs(bits: vec4<u32>) -> vec2<u32> {
    return vec2<u32>(bits.x | (bits.y << 16u), bits.z | (bits.w << 16u));
}
