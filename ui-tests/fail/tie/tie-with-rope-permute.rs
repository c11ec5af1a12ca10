//! A tied field is not read from the file, so `rope_permute` on it would be ignored.

use nnx::{Module, Tensor};

#[derive(Module)]
struct Model {
    wte: Tensor,
    #[nnx(tie = "wte", rope_permute = "head_count")]
    head: Tensor,
}

fn main() {}
