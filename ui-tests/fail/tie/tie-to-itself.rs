//! A field cannot share its own tensor.

use nnx::{Module, Tensor};

#[derive(Module)]
struct Model {
    wte: Tensor,
    #[nnx(tie = "head")]
    head: Tensor,
}

fn main() {}
