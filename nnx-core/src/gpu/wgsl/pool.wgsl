// Mean pooling: `[batch, seq, dim]` (read through its strides) to `[batch, dim]`, the mean over
// the positions whose mask word is 1; a row with none gives zeros. One invocation per output
// element, summing positions in order as the host does.

struct Params {
    count: u32,
    seq: u32,
    dim: u32,
    kind: u32,
    offset: u32,
    batch_stride: u32,
    seq_stride: u32,
    dim_stride: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> x: array<u32>;
@group(0) @binding(2) var<storage, read> mask: array<u32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

fn read_x(i: u32) -> f32 {
    let kind = params.kind;
    return decode(kind, i, x[first_word(kind, i)], x[second_word(kind, i)]);
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) group: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
        @builtin(local_invocation_index) local: u32) {
    let e = invocation(group, groups, local);
    if e >= params.count {
        return;
    }
    let batch = e / params.dim;
    let feature = e % params.dim;
    let base = params.offset + batch * params.batch_stride + feature * params.dim_stride;
    var sum = 0.0;
    var count = 0.0;
    for (var s = 0u; s < params.seq; s++) {
        if mask[batch * params.seq + s] != 0u {
            sum += read_x(base + s * params.seq_stride);
            count += 1.0;
        }
    }
    out[e] = sum * (1.0 / max(count, 1e-9));
}
