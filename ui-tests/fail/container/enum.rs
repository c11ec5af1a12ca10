//! Enums are refused; the type still works as a field elsewhere (no follow-up errors).

use nnx::{Module, Tensor};

#[derive(Module)]
enum Activation {
    Gelu,
    Relu,
}

#[derive(Module)]
struct Block {
    weight: Tensor,
    activation: Activation,
}

fn main() {}
