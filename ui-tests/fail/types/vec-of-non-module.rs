//! A container of values that hold no tensors is reported for the element type.

use nnx::{Module, Tensor};

#[derive(Module)]
struct Layer {
    weight: Tensor,
    sizes: Vec<usize>,
}

fn main() {}
