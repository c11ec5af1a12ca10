//! `rename` is one segment; a dot would make it two.

use nnx::{Module, Tensor};

#[derive(Module)]
struct Layer {
    #[nnx(rename = "attn.weight")]
    weight: Tensor,
}

fn main() {}
