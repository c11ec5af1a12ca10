// Embedding lookup: row `ids[r]` of a `[vocab, dim]` table, read through its strides, into row
// `r` of a contiguous f32 output. One invocation per output element.

struct Params {
    count: u32,
    dim: u32,
    kind: u32,
    offset: u32,
    row_stride: u32,
    column_stride: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> table: array<u32>;
@group(0) @binding(2) var<storage, read> ids: array<u32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) group: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
        @builtin(local_invocation_index) local: u32) {
    let e = invocation(group, groups, local);
    if e >= params.count {
        return;
    }
    let row = e / params.dim;
    let column = e % params.dim;
    let i = params.offset + ids[row] * params.row_stride + column * params.column_stride;
    let kind = params.kind;
    out[e] = decode(kind, i, table[first_word(kind, i)], table[second_word(kind, i)]);
}
