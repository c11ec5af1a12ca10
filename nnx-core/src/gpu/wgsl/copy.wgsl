// Gathers a strided view into a contiguous buffer. One invocation writes one 32-bit word of
// the output, which holds 4 / bytes elements (bytes 1, 2 or 4) or half of one (bytes 8).

struct Params {
    rank: u32,
    bytes: u32,
    offset: u32,
    count: u32,
    shape: array<vec4<u32>, 2>,
    strides: array<vec4<u32>, 2>,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> words_in: array<u32>;
@group(0) @binding(2) var<storage, read_write> words_out: array<u32>;

// The source element of output element `e`.
fn source_of(e: u32) -> u32 {
    return strided_index(e, params.rank, params.offset, params.shape, params.strides);
}

// `bytes` bytes of element `s` of the source, in the low bits.
fn read_element(s: u32) -> u32 {
    let bit = (s * params.bytes % 4u) * 8u;
    let word = words_in[s * params.bytes / 4u] >> bit;
    if params.bytes == 4u {
        return word;
    }
    return word & ((1u << (params.bytes * 8u)) - 1u);
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) group: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
        @builtin(local_invocation_index) local: u32) {
    let w = invocation(group, groups, local);
    if params.bytes == 8u {
        let e = w / 2u;
        if e >= params.count {
            return;
        }
        words_out[w] = words_in[source_of(e) * 2u + w % 2u];
        return;
    }
    let per_word = 4u / params.bytes;
    var word = 0u;
    var any = false;
    for (var j = 0u; j < per_word; j++) {
        let e = w * per_word + j;
        if e < params.count {
            word |= read_element(source_of(e)) << (j * params.bytes * 8u);
            any = true;
        }
    }
    if any {
        words_out[w] = word;
    }
}
