//! `dtype` on a field whose type is a module without tensors.

use nnx::Module;

#[derive(Module)]
struct Gelu;

#[derive(Module)]
struct Block {
    #[nnx(dtype = "f32")]
    activation: Gelu,
}

fn main() {}
