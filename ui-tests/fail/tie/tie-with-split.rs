//! A tied field is not read from the file, so it is no piece of a source.

use nnx::{Module, Tensor};

#[derive(Module)]
struct Model {
    wte: Tensor,
    #[nnx(tie = "wte", split(axis = 0, parts = 2, index = 0))]
    head: Tensor,
}

fn main() {}
