// The prelude of every kernel (prepended to its source, before `float.wgsl`): the index of an
// invocation in the grid, and the index arithmetic of strided views.
//
// Sizes and strides of up to eight axes travel in uniform blocks as `array<vec4<u32>, 2>`
// (uniform arrays need 16-byte elements).

// The flat index of this invocation in a grid of 256-wide workgroups folded into x and y.
fn invocation(group: vec3<u32>, groups: vec3<u32>, local: u32) -> u32 {
    return (group.y * groups.x + group.x) * 256u + local;
}

// The flat index of this workgroup.
fn flat_group(group: vec3<u32>, groups: vec3<u32>) -> u32 {
    return group.y * groups.x + group.x;
}

// Entry `i` of eight values packed in two vec4s (uniform arrays need 16-byte elements).
fn axis(values: array<vec4<u32>, 2>, i: u32) -> u32 {
    return values[i / 4u][i % 4u];
}

// The storage index of element `e` (row-major) of a view of `rank` axes starting at `offset`.
fn strided_index(e: u32, rank: u32, offset: u32, shape: array<vec4<u32>, 2>,
                 strides: array<vec4<u32>, 2>) -> u32 {
    var rest = e;
    var at = offset;
    for (var i = i32(rank) - 1; i >= 0; i--) {
        let size = axis(shape, u32(i));
        at += (rest % size) * axis(strides, u32(i));
        rest /= size;
    }
    return at;
}

// The storage indices of element `e` (row-major) in two views of one shape, `first` and
// `second`, starting at `offsets.x` and `offsets.y`: one walk over the axes for both.
fn strided_pair(e: u32, rank: u32, offsets: vec2<u32>, shape: array<vec4<u32>, 2>,
                first: array<vec4<u32>, 2>, second: array<vec4<u32>, 2>) -> vec2<u32> {
    var rest = e;
    var at = offsets;
    for (var i = i32(rank) - 1; i >= 0; i--) {
        let size = axis(shape, u32(i));
        let index = rest % size;
        rest /= size;
        at += index * vec2<u32>(axis(first, u32(i)), axis(second, u32(i)));
    }
    return at;
}
