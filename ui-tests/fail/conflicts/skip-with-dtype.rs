//! A skipped field is never walked: a dtype on it would be ignored.

use nnx::{Module, Tensor};

#[derive(Module)]
struct Layer {
    #[nnx(skip)]
    #[nnx(dtype = "f32")]
    cache: Tensor,
}

fn main() {}
