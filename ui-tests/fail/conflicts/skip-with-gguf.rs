//! A skipped field is never walked: `gguf` on it would be ignored.

use nnx::{Module, Tensor};

#[derive(Module)]
struct Layer {
    #[nnx(skip, gguf = "attn_q")]
    cache: Tensor,
}

fn main() {}
