//! An unknown dtype name lists the valid ones.

use nnx::{Module, Tensor};

#[derive(Module)]
struct Layer {
    #[nnx(dtype = "u33")]
    ids: Tensor,
}

fn main() {}
