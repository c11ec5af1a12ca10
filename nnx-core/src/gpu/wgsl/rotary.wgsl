// Rotary position embedding (`rotate_half`: feature `i` pairs with `i + head_dim/2`) of a
// `[batch, heads, seq, head_dim]` input read through its strides, with cosines and sines
// computed on the host (`[seq, half]` each, one after the other in `table`) so that both
// devices turn by the same angles. One invocation per pair of features.

struct Params {
    pairs: u32,
    half: u32,
    kind: u32,
    offset: u32,
    shape: vec4<u32>,
    strides: vec4<u32>,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> x: array<u32>;
@group(0) @binding(2) var<storage, read> table: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

fn read_x(i: u32) -> f32 {
    let kind = params.kind;
    return decode(kind, i, x[first_word(kind, i)], x[second_word(kind, i)]);
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) group: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
        @builtin(local_invocation_index) local: u32) {
    let p = invocation(group, groups, local);
    if p >= params.pairs {
        return;
    }
    let half = params.half;
    let feature = p % half;
    // The row: (batch, head, position) flattened.
    let row = p / half;
    let position = row % params.shape.z;
    let head = (row / params.shape.z) % params.shape.y;
    let batch = row / (params.shape.z * params.shape.y);
    let base = params.offset + batch * params.strides.x + head * params.strides.y + position * params.strides.z;
    let x1 = read_x(base + feature * params.strides.w);
    let x2 = read_x(base + (feature + half) * params.strides.w);
    let at = position * half + feature;
    let cosine = table[at];
    let sine = table[params.shape.z * half + at];
    let first = row * 2u * half + feature;
    out[first] = x1 * cosine - x2 * sine;
    out[first + half] = x2 * cosine + x1 * sine;
}
