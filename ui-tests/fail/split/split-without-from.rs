//! `split` names a piece of a fused source, so the source must be named.

use nnx::{Module, Tensor};

#[derive(Module)]
struct Attention {
    #[nnx(split(axis = -1, parts = 3, index = 0))]
    q: Tensor,
}

fn main() {}
