//! `split` parameters are integer literals, not strings.

use nnx::{Module, Tensor};

#[derive(Module)]
struct Attention {
    #[nnx(from = "c_attn", split(axis = -1, parts = "3", index = 0))]
    q: Tensor,
}

fn main() {}
