//! A key that is not close to any known one lists the keys there are.

use nnx::{Module, Tensor};

#[derive(Module)]
struct Layer {
    #[nnx(weights = "w")]
    weight: Tensor,
}

fn main() {}
