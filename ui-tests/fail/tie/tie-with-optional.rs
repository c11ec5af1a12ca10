//! A tied field is not read from the file, so it cannot be missing from it.

use nnx::{Module, Tensor};

#[derive(Module)]
struct Model {
    wte: Tensor,
    #[nnx(optional)]
    #[nnx(tie = "wte")]
    head: Tensor,
}

fn main() {}
