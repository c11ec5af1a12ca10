//! A field that holds no tensors needs `skip`.

use nnx::{Module, Tensor};

#[derive(Module)]
struct Layer {
    weight: Tensor,
    hidden_size: usize,
}

fn main() {}
