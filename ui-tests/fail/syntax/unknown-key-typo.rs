//! A misspelt key is refused, naming the key it was likely meant to be.

use nnx::{Module, Tensor};

#[derive(Module)]
struct Layer {
    #[nnx(tranpose)]
    weight: Tensor,
}

fn main() {}
