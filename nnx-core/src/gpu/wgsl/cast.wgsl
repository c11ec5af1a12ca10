// Float casts among f16, bf16, f32 and f64, rounding as the host does. One invocation writes
// one unit of the contiguous output: a word of two f16/bf16 elements, one f32, or the two words
// of one f64. The input is read through its strides.

struct Params {
    count: u32,
    rank: u32,
    in_kind: u32,
    out_kind: u32,
    offset: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
    shape: array<vec4<u32>, 2>,
    strides: array<vec4<u32>, 2>,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> source: array<u32>;
@group(0) @binding(2) var<storage, read_write> words: array<u32>;

// The storage index of element `e` of the view.
fn source_index(e: u32) -> u32 {
    return strided_index(e, params.rank, params.offset, params.shape, params.strides);
}

// Element `e` of the view in the output format, in the low bits (f64 elements are handled by
// the caller).
fn convert(e: u32) -> u32 {
    let kind = params.in_kind;
    let i = source_index(e);
    let low = source[first_word(kind, i)];
    let high = source[second_word(kind, i)];
    if kind == 3u && params.out_kind == 2u {
        return f64_to_bf16(high);
    }
    let value = bitcast<u32>(decode(kind, i, low, high));
    switch params.out_kind {
        case 1u: {
            return narrow_f32(value, 10u, 5u);
        }
        case 2u: {
            return narrow_f32(value, 7u, 8u);
        }
        default: {
            return value;
        }
    }
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) group: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
        @builtin(local_invocation_index) local: u32) {
    let unit = invocation(group, groups, local);
    switch params.out_kind {
        case 1u, 2u: {
            let e = unit * 2u;
            if e >= params.count {
                return;
            }
            var word = convert(e);
            if e + 1u < params.count {
                word |= convert(e + 1u) << 16u;
            }
            words[unit] = word;
        }
        case 3u: {
            if unit >= params.count {
                return;
            }
            let i = source_index(unit);
            let kind = params.in_kind;
            let value = decode(kind, i, source[first_word(kind, i)], source[second_word(kind, i)]);
            let wide = widen_f32(bitcast<u32>(value));
            words[unit * 2u] = wide.x;
            words[unit * 2u + 1u] = wide.y;
        }
        default: {
            if unit >= params.count {
                return;
            }
            words[unit] = convert(unit);
        }
    }
}
