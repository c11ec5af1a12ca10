//! A skipped field is not part of the state: a rename on it would be ignored.

use nnx::{Module, Tensor};

#[derive(Module)]
struct Layer {
    weight: Tensor,
    #[nnx(skip, rename = "hidden")]
    hidden_size: usize,
}

fn main() {}
