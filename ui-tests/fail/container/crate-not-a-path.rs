//! `crate` takes a path.

use nnx::{Module, Tensor};

#[derive(Module)]
#[nnx(crate = "not a path")]
struct Layer {
    weight: Tensor,
}

fn main() {}
