//! An offset of zero changes nothing, so it is almost surely a mistake.

use nnx::{Module, Tensor};

#[derive(Module)]
struct Norm {
    #[nnx(offset = 0.0)]
    weight: Tensor,
}

fn main() {}
