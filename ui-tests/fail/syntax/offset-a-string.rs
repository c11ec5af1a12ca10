//! `offset` takes a number literal, not a string holding one.

use nnx::{Module, Tensor};

#[derive(Module)]
struct Norm {
    #[nnx(offset = "1")]
    weight: Tensor,
}

fn main() {}
