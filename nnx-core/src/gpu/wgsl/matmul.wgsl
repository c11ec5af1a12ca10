// Batched matrix products, `out[.., m, n] = a[.., m, k] · b[.., k, n] (+ bias[n])`, tiled in
// workgroup memory with f32 accumulation. Each workgroup of 16 x 16 invocations computes a
// 64 x 64 tile of one product, each invocation a 4 x 4 block (rows `ty + 16i`, columns
// `tx + 16j`), stepping through k 16 at a time. Operands are read through their strides in
// their own float kind, so transposed weights and permuted heads need no copy.

struct Params {
    m: u32,
    n: u32,
    k: u32,
    // Products in the batch.
    batches: u32,
    a_kind: u32,
    a_offset: u32,
    a_row: u32,
    a_column: u32,
    b_kind: u32,
    b_offset: u32,
    b_row: u32,
    b_column: u32,
    // 4 when there is no bias.
    bias_kind: u32,
    bias_offset: u32,
    bias_stride: u32,
    batch_rank: u32,
    out_offset: u32,
    out_row: u32,
    out_batch: u32,
    tiles_n: u32,
    batch_shape: array<vec4<u32>, 2>,
    a_batch: array<vec4<u32>, 2>,
    b_batch: array<vec4<u32>, 2>,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> a: array<u32>;
@group(0) @binding(2) var<storage, read> b: array<u32>;
@group(0) @binding(3) var<storage, read> bias: array<u32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;

const TILE: u32 = 64u;
const DEPTH: u32 = 16u;

// Tiles of a and b, depth-major: `[DEPTH][TILE]` each (8 KiB together).
var<workgroup> tile_a: array<f32, 1024>;
var<workgroup> tile_b: array<f32, 1024>;

fn read_a(i: u32) -> f32 {
    let kind = params.a_kind;
    return decode(kind, i, a[first_word(kind, i)], a[second_word(kind, i)]);
}

fn read_b(i: u32) -> f32 {
    let kind = params.b_kind;
    return decode(kind, i, b[first_word(kind, i)], b[second_word(kind, i)]);
}

fn read_bias(i: u32) -> f32 {
    let kind = params.bias_kind;
    return decode(kind, i, bias[first_word(kind, i)], bias[second_word(kind, i)]);
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) group: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
        @builtin(local_invocation_index) local: u32) {
    // Everything up to the tile loop is uniform across the workgroup, so the early return
    // keeps the barriers below in uniform control flow.
    let flat = flat_group(group, groups);
    let tiles_m = (params.m + TILE - 1u) / TILE;
    let per_product = tiles_m * params.tiles_n;
    let product = flat / per_product;
    if product >= params.batches {
        return;
    }
    let tile = flat % per_product;
    let row0 = (tile / params.tiles_n) * TILE;
    let column0 = (tile % params.tiles_n) * TILE;
    let offsets = vec2<u32>(params.a_offset, params.b_offset);
    let base = strided_pair(product, params.batch_rank, offsets, params.batch_shape, params.a_batch, params.b_batch);
    let base_a = base.x;
    let base_b = base.y;
    // Neighbouring invocations load neighbouring elements of whichever axis is dense.
    let a_depth_dense = params.a_column == 1u;
    let b_columns_dense = params.b_column == 1u || params.b_row != 1u;
    let tx = local % 16u;
    let ty = local / 16u;
    var sums: array<f32, 16>;
    for (var k0 = 0u; k0 < params.k; k0 += DEPTH) {
        for (var q = 0u; q < 4u; q++) {
            let e = local + q * 256u;
            var row = e % TILE;
            var depth = e / TILE;
            if a_depth_dense {
                row = e / DEPTH;
                depth = e % DEPTH;
            }
            var value = 0.0;
            if row0 + row < params.m && k0 + depth < params.k {
                value = read_a(base_a + (row0 + row) * params.a_row + (k0 + depth) * params.a_column);
            }
            tile_a[depth * TILE + row] = value;
            var column = e / DEPTH;
            depth = e % DEPTH;
            if b_columns_dense {
                column = e % TILE;
                depth = e / TILE;
            }
            value = 0.0;
            if column0 + column < params.n && k0 + depth < params.k {
                value = read_b(base_b + (k0 + depth) * params.b_row + (column0 + column) * params.b_column);
            }
            tile_b[depth * TILE + column] = value;
        }
        workgroupBarrier();
        for (var depth = 0u; depth < DEPTH; depth++) {
            var left: array<f32, 4>;
            var right: array<f32, 4>;
            for (var i = 0u; i < 4u; i++) {
                left[i] = tile_a[depth * TILE + ty + 16u * i];
                right[i] = tile_b[depth * TILE + tx + 16u * i];
            }
            for (var i = 0u; i < 4u; i++) {
                for (var j = 0u; j < 4u; j++) {
                    sums[i * 4u + j] = fma(left[i], right[j], sums[i * 4u + j]);
                }
            }
        }
        workgroupBarrier();
    }
    let base_out = params.out_offset + product * params.out_batch;
    for (var i = 0u; i < 4u; i++) {
        let row = row0 + ty + 16u * i;
        if row >= params.m {
            break;
        }
        for (var j = 0u; j < 4u; j++) {
            let column = column0 + tx + 16u * j;
            if column >= params.n {
                break;
            }
            var value = sums[i * 4u + j];
            if params.bias_kind != 4u {
                value += read_bias(params.bias_offset + column * params.bias_stride);
            }
            out[base_out + row * params.out_row + column] = value;
        }
    }
}
