//! `transpose` on a configuration field.

use nnx::{Module, Tensor};

#[derive(Module)]
struct Layer {
    weight: Tensor,
    #[nnx(transpose)]
    hidden_size: usize,
}

fn main() {}
