//! A GGUF path with an empty segment between two dots.

use nnx::{Module, Tensor};

#[derive(Module)]
struct Layer {
    #[nnx(gguf = "a..b")]
    weight: Tensor,
}

fn main() {}
