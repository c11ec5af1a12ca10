//! A misspelt `gguf` is refused with a suggestion and the list of field attributes.

use nnx::{Module, Tensor};

#[derive(Module)]
struct Attention {
    #[nnx(guff = "attn_q")]
    q: Tensor,
}

fn main() {}
