//! `rope_permute` needs the GGUF key that counts the heads.

use nnx::{Module, Tensor};

#[derive(Module)]
struct Attention {
    #[nnx(gguf = "attn_q", rope_permute)]
    q: Tensor,
}

fn main() {}
