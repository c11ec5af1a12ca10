//! A rename onto a sibling's name would give two tensors one name.

use nnx::{Module, Tensor};

#[derive(Module)]
struct Layer {
    bias: Tensor,
    #[nnx(rename = "bias")]
    weight: Tensor,
}

fn main() {}
