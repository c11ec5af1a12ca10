//! Two siblings taking the same piece of one source.

use nnx::{Module, Tensor};

#[derive(Module)]
struct Attention {
    #[nnx(from = "c_attn", split(axis = -1, parts = 3, index = 0))]
    q: Tensor,
    #[nnx(from = "c_attn", split(axis = -1, parts = 3, index = 0))]
    k: Tensor,
}

fn main() {}
