//! A tied field is not read from the file, so `gguf` on it would be ignored.

use nnx::{Module, Tensor};

#[derive(Module)]
struct Model {
    wte: Tensor,
    #[nnx(tie = "wte", gguf = "attn_q")]
    head: Tensor,
}

fn main() {}
