//! A source path with an empty segment between two dots.

use nnx::{Module, Tensor};

#[derive(Module)]
struct Layer {
    #[nnx(from = "attn..weight")]
    weight: Tensor,
}

fn main() {}
