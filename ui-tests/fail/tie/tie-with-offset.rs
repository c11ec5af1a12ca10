//! A tied field is not read from the file, so `offset` on it would be ignored.

use nnx::{Module, Tensor};

#[derive(Module)]
struct Model {
    wte: Tensor,
    #[nnx(tie = "wte", offset = 1.0)]
    head: Tensor,
}

fn main() {}
