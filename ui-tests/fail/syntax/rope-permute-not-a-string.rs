//! `rope_permute` takes the key as a string, not as a bare word.

use nnx::{Module, Tensor};

#[derive(Module)]
struct Attention {
    #[nnx(gguf = "attn_q", rope_permute = head_count)]
    q: Tensor,
}

fn main() {}
