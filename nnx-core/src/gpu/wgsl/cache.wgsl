// In-place writes into an f32 tensor (`write_slice`): the values, of any float kind and read
// through their strides, land in a strided region of the destination, such as the rows of a
// key/value cache after the ones already filled. One invocation per value.

struct Params {
    count: u32,
    rank: u32,
    kind: u32,
    source_offset: u32,
    // The destination's first written element.
    destination_offset: u32,
    padding_0: u32,
    padding_1: u32,
    padding_2: u32,
    shape: array<vec4<u32>, 2>,
    source_strides: array<vec4<u32>, 2>,
    destination_strides: array<vec4<u32>, 2>,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> source: array<u32>;
@group(0) @binding(2) var<storage, read_write> destination: array<f32>;

fn read_source(i: u32) -> f32 {
    let kind = params.kind;
    return decode(kind, i, source[first_word(kind, i)], source[second_word(kind, i)]);
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) group: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
        @builtin(local_invocation_index) local: u32) {
    let e = invocation(group, groups, local);
    if e >= params.count {
        return;
    }
    let offsets = vec2<u32>(params.source_offset, params.destination_offset);
    let at = strided_pair(e, params.rank, offsets, params.shape, params.source_strides, params.destination_strides);
    destination[at.y] = read_source(at.x);
}
