//! An empty source name.

use nnx::{Module, Tensor};

#[derive(Module)]
struct Layer {
    #[nnx(from = "")]
    weight: Tensor,
}

fn main() {}
