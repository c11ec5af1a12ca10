//! A tied field is not read from the file, so nothing is transposed.

use nnx::{Module, Tensor};

#[derive(Module)]
struct Model {
    wte: Tensor,
    #[nnx(tie = "wte", transpose)]
    head: Tensor,
}

fn main() {}
