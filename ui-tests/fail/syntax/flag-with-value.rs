//! `transpose` is a flag and takes no value.

use nnx::{Module, Tensor};

#[derive(Module)]
struct Layer {
    #[nnx(transpose = true)]
    weight: Tensor,
}

fn main() {}
