// Products with a quantized weight, `out[m, n] = x[m, k] · W[n, k]ᵀ (+ bias[n])` in f32, the
// weight decoded 8 values at a time by the encoding's `weight_unit` and never stored. `x` is
// contiguous f32 and `k` a multiple of 8, so inputs are read four at a time.
//
// `matvec` (a few input rows, `m <= 4`): each workgroup owns 8 output features, 32
// invocations each; an invocation walks every 32nd unit of 8 values of its feature's weight
// row, decodes it once and multiplies it with every input row; the 32 partial sums meet in
// workgroup memory. `tiled` (more rows): each workgroup computes a 32 x 64 tile of `out`
// stepping through k 32 at a time, every invocation decoding one unit of the weight tile into
// workgroup memory and accumulating a 2 x 4 block.

@group(0) @binding(STREAMS + 2u) var<storage, read> x: array<f32>;
@group(0) @binding(STREAMS + 3u) var<storage, read> bias: array<u32>;

fn read_bias(i: u32) -> f32 {
    let kind = params.product.bias_kind;
    return decode(kind, i, bias[first_word(kind, i)], bias[second_word(kind, i)]);
}

// `value` plus the bias of output feature `column`, as the bits `out` holds.
fn finished(value: f32, column: u32) -> u32 {
    let product = params.product;
    if product.bias_kind == 4u {
        return bitcast<u32>(value);
    }
    return bitcast<u32>(value + read_bias(product.bias_offset + column * product.bias_stride));
}

// Inputs `at..at + 4`.
fn read_x(at: u32) -> vec4<f32> {
    return vec4<f32>(x[at], x[at + 1u], x[at + 2u], x[at + 3u]);
}

// `w · x[at..at + 8]`.
fn dot_unit(w: Unit, at: u32) -> f32 {
    return dot(w.low, read_x(at)) + dot(w.high, read_x(at + 4u));
}

// Output features per `matvec` workgroup, and invocations per feature.
const FEATURES: u32 = 8u;
const LANES: u32 = 32u;

// One vector of partial sums (one per input row) per invocation.
var<workgroup> partial: array<vec4<f32>, 256>;

@compute @workgroup_size(256)
fn matvec(@builtin(workgroup_id) group: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
          @builtin(local_invocation_index) local: u32) {
    let product = params.product;
    let row = flat_group(group, groups) * FEATURES + local / LANES;
    let lane = local % LANES;
    let stride = product.k;
    var sums = vec4<f32>(0.0);
    if row < product.n {
        for (var first = lane * 8u; first < product.k; first += LANES * 8u) {
            let w = weight_unit(row, first);
            let at = product.x_offset + first;
            sums.x += dot_unit(w, at);
            if product.m > 1u {
                sums.y += dot_unit(w, at + stride);
            }
            if product.m > 2u {
                sums.z += dot_unit(w, at + 2u * stride);
            }
            if product.m > 3u {
                sums.w += dot_unit(w, at + 3u * stride);
            }
        }
    }
    partial[local] = sums;
    workgroupBarrier();
    for (var step = LANES / 2u; step > 0u; step >>= 1u) {
        if lane < step {
            partial[local] += partial[local + step];
        }
        workgroupBarrier();
    }
    if lane == 0u && row < product.n {
        let total = partial[local];
        for (var i = 0u; i < product.m; i++) {
            out[i * product.n + row] = finished(total[i], row);
        }
    }
}

// The output tile of `tiled` is TILE_M x TILE_N, through k DEPTH at a time.
const TILE_M: u32 = 32u;
const TILE_N: u32 = 64u;
const DEPTH: u32 = 32u;

// Depth-major: `[DEPTH][TILE_M]` and `[DEPTH][TILE_N]` (12 KiB together).
var<workgroup> tile_x: array<f32, 1024>;
var<workgroup> tile_w: array<f32, 2048>;

// Writes `values`, row `row` and columns `column + 16 j` of the tile, where they are in `out`.
fn store(row: u32, column: u32, values: vec4<f32>) {
    let product = params.product;
    if row >= product.m {
        return;
    }
    for (var j = 0u; j < 4u; j++) {
        let at = column + 16u * j;
        if at < product.n {
            out[row * product.n + at] = finished(values[j], at);
        }
    }
}

@compute @workgroup_size(256)
fn tiled(@builtin(workgroup_id) group: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
         @builtin(local_invocation_index) local: u32) {
    // Uniform up to the loop, so the early return keeps the barriers in uniform control flow.
    let product = params.product;
    let flat = flat_group(group, groups);
    let tiles_n = (product.n + TILE_N - 1u) / TILE_N;
    let tiles_m = (product.m + TILE_M - 1u) / TILE_M;
    if flat >= tiles_m * tiles_n {
        return;
    }
    let row0 = (flat / tiles_n) * TILE_M;
    let column0 = (flat % tiles_n) * TILE_N;
    let tx = local % 16u;
    let ty = local / 16u;
    // The 4 inputs this invocation loads (row `local / 8`, depth `(local % 8) * 4`) and the
    // weight unit it decodes (feature `local / 4`, depth `(local % 4) * 8`).
    let input_row = local / 8u;
    let input_depth = (local % 8u) * 4u;
    let feature = local / 4u;
    let unit = (local % 4u) * 8u;
    var top = vec4<f32>(0.0);
    var bottom = vec4<f32>(0.0);
    for (var k0 = 0u; k0 < product.k; k0 += DEPTH) {
        var inputs = vec4<f32>(0.0);
        if row0 + input_row < product.m && k0 + input_depth < product.k {
            inputs = read_x(product.x_offset + (row0 + input_row) * product.k + k0 + input_depth);
        }
        for (var j = 0u; j < 4u; j++) {
            tile_x[(input_depth + j) * TILE_M + input_row] = inputs[j];
        }
        var w = Unit(vec4<f32>(0.0), vec4<f32>(0.0));
        if column0 + feature < product.n && k0 + unit < product.k {
            w = weight_unit(column0 + feature, k0 + unit);
        }
        for (var j = 0u; j < 4u; j++) {
            tile_w[(unit + j) * TILE_N + feature] = w.low[j];
            tile_w[(unit + 4u + j) * TILE_N + feature] = w.high[j];
        }
        workgroupBarrier();
        for (var depth = 0u; depth < DEPTH; depth++) {
            let weights = vec4<f32>(tile_w[depth * TILE_N + tx], tile_w[depth * TILE_N + tx + 16u],
                                    tile_w[depth * TILE_N + tx + 32u], tile_w[depth * TILE_N + tx + 48u]);
            top = fma(vec4<f32>(tile_x[depth * TILE_M + ty]), weights, top);
            bottom = fma(vec4<f32>(tile_x[depth * TILE_M + ty + 16u]), weights, bottom);
        }
        workgroupBarrier();
    }
    store(row0 + ty, column0 + tx, top);
    store(row0 + ty + 16u, column0 + tx, bottom);
}
