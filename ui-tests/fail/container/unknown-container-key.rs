//! A misspelt container key.

use nnx::{Module, Tensor};

#[derive(Module)]
#[nnx(crat = "nnx")]
struct Layer {
    weight: Tensor,
}

fn main() {}
