//! Unions are refused.

use nnx::Module;

#[derive(Module)]
union Bits {
    float: f32,
    int: u32,
}

fn main() {}
