//! `split` takes its three parameters in parentheses.

use nnx::{Module, Tensor};

#[derive(Module)]
struct Layer {
    #[nnx(from = "c_attn", split = 3)]
    weight: Tensor,
}

fn main() {}
