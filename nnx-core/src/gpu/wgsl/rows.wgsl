// Row kernels over the last axis of a contiguous input: softmax, layer norm, RMS norm and L2
// normalisation. One workgroup per row; each invocation strides over the row's columns and the
// sums meet in `reduce_sum`. Output is contiguous f32.

struct Params {
    rows: u32,
    width: u32,
    // 0 softmax, 1 layer norm, 2 RMS norm, 3 L2 normalisation.
    op: u32,
    eps: u32,
    x_kind: u32,
    x_offset: u32,
    // 4 when there is no weight (bias).
    weight_kind: u32,
    weight_offset: u32,
    weight_stride: u32,
    bias_kind: u32,
    bias_offset: u32,
    bias_stride: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> x: array<u32>;
@group(0) @binding(2) var<storage, read> weight: array<u32>;
@group(0) @binding(3) var<storage, read> bias: array<u32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;

fn read_x(i: u32) -> f32 {
    let kind = params.x_kind;
    return decode(kind, i, x[first_word(kind, i)], x[second_word(kind, i)]);
}

fn read_weight(i: u32) -> f32 {
    let kind = params.weight_kind;
    return decode(kind, i, weight[first_word(kind, i)], weight[second_word(kind, i)]);
}

fn read_bias(i: u32) -> f32 {
    let kind = params.bias_kind;
    return decode(kind, i, bias[first_word(kind, i)], bias[second_word(kind, i)]);
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) group: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
        @builtin(local_invocation_index) local: u32) {
    let row = flat_group(group, groups);
    if row >= params.rows {
        return;
    }
    let width = params.width;
    let start = params.x_offset + row * width;
    let first = row * width;
    switch params.op {
        case 0u: {
            // Softmax: `-inf` entries weigh nothing; a row of them gives zeros.
            var largest = LOWEST;
            for (var j = local; j < width; j += 256u) {
                let value = read_x(start + j);
                if !is_negative_infinity(value) {
                    largest = max(largest, value);
                }
            }
            largest = reduce_max(local, largest);
            var sum = 0.0;
            for (var j = local; j < width; j += 256u) {
                let value = read_x(start + j);
                if !is_negative_infinity(value) {
                    sum += exp(value - largest);
                }
            }
            sum = reduce_sum(local, sum);
            let inverse = select(1.0 / sum, 0.0, sum == 0.0);
            for (var j = local; j < width; j += 256u) {
                let value = read_x(start + j);
                out[first + j] = select(exp(value - largest) * inverse, 0.0, is_negative_infinity(value));
            }
        }
        case 1u: {
            var sum = 0.0;
            for (var j = local; j < width; j += 256u) {
                sum += read_x(start + j);
            }
            let mean = reduce_sum(local, sum) / f32(width);
            var squares = 0.0;
            for (var j = local; j < width; j += 256u) {
                let centred = read_x(start + j) - mean;
                squares += centred * centred;
            }
            let variance = reduce_sum(local, squares) / f32(width);
            let inverse = 1.0 / sqrt(variance + bitcast<f32>(params.eps));
            for (var j = local; j < width; j += 256u) {
                var value = (read_x(start + j) - mean) * inverse;
                if params.weight_kind != 4u {
                    value *= read_weight(params.weight_offset + j * params.weight_stride);
                }
                if params.bias_kind != 4u {
                    value += read_bias(params.bias_offset + j * params.bias_stride);
                }
                out[first + j] = value;
            }
        }
        case 2u: {
            var squares = 0.0;
            for (var j = local; j < width; j += 256u) {
                let value = read_x(start + j);
                squares += value * value;
            }
            let inverse = 1.0 / sqrt(reduce_sum(local, squares) / f32(width) + bitcast<f32>(params.eps));
            for (var j = local; j < width; j += 256u) {
                var value = read_x(start + j) * inverse;
                if params.weight_kind != 4u {
                    value *= read_weight(params.weight_offset + j * params.weight_stride);
                }
                out[first + j] = value;
            }
        }
        default: {
            var squares = 0.0;
            for (var j = local; j < width; j += 256u) {
                let value = read_x(start + j);
                squares += value * value;
            }
            let divisor = max(sqrt(reduce_sum(local, squares)), 1e-12);
            for (var j = local; j < width; j += 256u) {
                out[first + j] = read_x(start + j) / divisor;
            }
        }
    }
}
