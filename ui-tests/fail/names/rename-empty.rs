//! A tensor name needs non-empty segments.

use nnx::{Module, Tensor};

#[derive(Module)]
struct Layer {
    #[nnx(rename = "")]
    weight: Tensor,
}

fn main() {}
