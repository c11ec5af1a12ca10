//! All three `split` parameters are required.

use nnx::{Module, Tensor};

#[derive(Module)]
struct Attention {
    #[nnx(from = "c_attn", split(parts = 3, index = 0))]
    q: Tensor,
}

fn main() {}
