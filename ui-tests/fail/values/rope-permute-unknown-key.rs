//! `rope_permute` names one of the two GGUF head counts; a near miss is refused with the
//! likely one.

use nnx::{Module, Tensor};

#[derive(Module)]
struct Attention {
    #[nnx(gguf = "attn_q", rope_permute = "heads")]
    q: Tensor,
}

fn main() {}
