//! One part is no split.

use nnx::{Module, Tensor};

#[derive(Module)]
struct Attention {
    #[nnx(from = "c_attn", split(axis = -1, parts = 1, index = 0))]
    q: Tensor,
}

fn main() {}
