//! A misspelt `split` parameter.

use nnx::{Module, Tensor};

#[derive(Module)]
struct Attention {
    #[nnx(from = "c_attn", split(axes = -1, parts = 3, index = 0))]
    q: Tensor,
}

fn main() {}
