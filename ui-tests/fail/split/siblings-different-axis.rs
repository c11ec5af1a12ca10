//! Siblings cutting one source must agree on the axis.

use nnx::{Module, Tensor};

#[derive(Module)]
struct Attention {
    #[nnx(from = "c_attn", split(axis = -1, parts = 2, index = 0))]
    q: Tensor,
    #[nnx(from = "c_attn", split(axis = 0, parts = 2, index = 1))]
    k: Tensor,
}

fn main() {}
