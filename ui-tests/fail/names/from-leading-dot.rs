//! A source path starting with a dot.

use nnx::{Module, Tensor};

#[derive(Module)]
struct Layer {
    #[nnx(from = ".weight")]
    weight: Tensor,
}

fn main() {}
