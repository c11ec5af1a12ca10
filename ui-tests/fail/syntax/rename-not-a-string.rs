//! `rename` takes a string literal.

use nnx::{Module, Tensor};

#[derive(Module)]
struct Layer {
    #[nnx(rename = 3)]
    weight: Tensor,
}

fn main() {}
