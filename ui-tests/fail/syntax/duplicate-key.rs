//! A key written twice on one field, here across two attributes.

use nnx::{Module, Tensor};

#[derive(Module)]
struct Layer {
    #[nnx(from = "w")]
    #[nnx(from = "kernel")]
    weight: Tensor,
}

fn main() {}
