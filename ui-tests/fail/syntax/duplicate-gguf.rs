//! A field has one GGUF name: a second `gguf` is refused on its own tokens.

use nnx::{Module, Tensor};

#[derive(Module)]
struct Attention {
    #[nnx(gguf = "attn_q")]
    #[nnx(gguf = "attn_k")]
    q: Tensor,
}

fn main() {}
