//! A misspelt head count is refused, naming the key it was likely meant to be.

use nnx::{Module, Tensor};

#[derive(Module)]
struct Attention {
    #[nnx(gguf = "attn_k", rope_permute = "head_count_vk")]
    k: Tensor,
}

fn main() {}
