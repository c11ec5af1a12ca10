//! An offset beyond `f32` would import every value as infinity.

use nnx::{Module, Tensor};

#[derive(Module)]
struct Norm {
    #[nnx(offset = 1e40)]
    weight: Tensor,
}

fn main() {}
