//! A tied field is not read from the file, so it has no source name.

use nnx::{Module, Tensor};

#[derive(Module)]
struct Model {
    wte: Tensor,
    #[nnx(tie = "wte", from = "lm_head")]
    head: Tensor,
}

fn main() {}
