//! `#[nnx]` takes its keys in parentheses.

use nnx::{Module, Tensor};

#[derive(Module)]
struct Layer {
    #[nnx = "skip"]
    weight: Tensor,
}

fn main() {}
