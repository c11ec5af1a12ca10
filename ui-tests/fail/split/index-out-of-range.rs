//! The piece index must be below the number of parts.

use nnx::{Module, Tensor};

#[derive(Module)]
struct Attention {
    #[nnx(from = "c_attn", split(axis = -1, parts = 3, index = 3))]
    v: Tensor,
}

fn main() {}
