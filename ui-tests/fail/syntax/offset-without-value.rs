//! `offset` needs the constant the source subtracted.

use nnx::{Module, Tensor};

#[derive(Module)]
struct Norm {
    #[nnx(offset)]
    weight: Tensor,
}

fn main() {}
