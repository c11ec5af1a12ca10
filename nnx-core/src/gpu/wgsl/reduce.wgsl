// Workgroup reductions for the row kernels (prepended after float.wgsl): one workgroup of 256
// invocations reduces one row. Call from uniform control flow only (they hold barriers).

var<workgroup> scratch: array<f32, 256>;

fn reduce_sum(local: u32, value: f32) -> f32 {
    scratch[local] = value;
    workgroupBarrier();
    for (var step = 128u; step > 0u; step >>= 1u) {
        if local < step {
            scratch[local] += scratch[local + step];
        }
        workgroupBarrier();
    }
    let total = scratch[0];
    workgroupBarrier();
    return total;
}

fn reduce_max(local: u32, value: f32) -> f32 {
    scratch[local] = value;
    workgroupBarrier();
    for (var step = 128u; step > 0u; step >>= 1u) {
        if local < step {
            scratch[local] = max(scratch[local], scratch[local + step]);
        }
        workgroupBarrier();
    }
    let total = scratch[0];
    workgroupBarrier();
    return total;
}

// The lowest finite f32: where a maximum starts, so that `-inf` (a masked score) never enters
// arithmetic (WGSL lets implementations assume there are no infinities).
const LOWEST: f32 = -3.40282347e+38;

// Whether `x` is `-inf`, by its bits.
fn is_negative_infinity(x: f32) -> bool {
    return bitcast<u32>(x) == 0xff800000u;
}
