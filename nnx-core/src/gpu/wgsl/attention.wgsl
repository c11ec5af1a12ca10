// The attention weights, in place: each row of scores `q · kᵀ` (one query) is scaled by
// `1/sqrt(d)`, keys hidden by the causal mask (and its window) or the padding mask are dropped,
// and the rest go through a stable softmax. A query that sees no key gets zeros. One workgroup
// per row.

struct Params {
    rows: u32,
    seq_q: u32,
    seq_k: u32,
    // Queries per batch element (heads * seq_q), to find a row's batch element.
    per_batch: u32,
    scale: u32,
    causal: u32,
    // Query `i` sees keys `j <= i + shift` under the causal mask (`seq_k - seq_q`, as i32).
    shift: u32,
    has_mask: u32,
    // Under the causal mask query `i` also sees only keys `j > i + shift - window` (at most
    // `seq_k`, which hides nothing more).
    window: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read_write> scores: array<f32>;
// One word per key (`batch * seq_k`, 1 to attend, 0 for padding).
@group(0) @binding(2) var<storage, read> key_mask: array<u32>;

fn visible(batch: u32, query: u32, key: u32) -> bool {
    if params.causal != 0u {
        let last = i32(query) + bitcast<i32>(params.shift);
        if i32(key) > last || i32(key) <= last - i32(params.window) {
            return false;
        }
    }
    return params.has_mask == 0u || key_mask[batch * params.seq_k + key] != 0u;
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) group: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
        @builtin(local_invocation_index) local: u32) {
    let row = flat_group(group, groups);
    if row >= params.rows {
        return;
    }
    let width = params.seq_k;
    let first = row * width;
    let batch = row / params.per_batch;
    let query = row % params.seq_q;
    let scale = bitcast<f32>(params.scale);
    var largest = LOWEST;
    for (var j = local; j < width; j += 256u) {
        if visible(batch, query, j) {
            largest = max(largest, scores[first + j] * scale);
        }
    }
    largest = reduce_max(local, largest);
    var sum = 0.0;
    for (var j = local; j < width; j += 256u) {
        if visible(batch, query, j) {
            sum += exp(scores[first + j] * scale - largest);
        }
    }
    sum = reduce_sum(local, sum);
    let inverse = select(1.0 / sum, 0.0, sum == 0.0);
    for (var j = local; j < width; j += 256u) {
        var weight = 0.0;
        if visible(batch, query, j) {
            weight = exp(scores[first + j] * scale - largest) * inverse;
        }
        scores[first + j] = weight;
    }
}
