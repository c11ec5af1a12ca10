//! A tie path ending with a dot.

use nnx::{Module, Tensor};

#[derive(Module)]
struct Model {
    wte: Tensor,
    #[nnx(tie = "wte.")]
    head: Tensor,
}

fn main() {}
