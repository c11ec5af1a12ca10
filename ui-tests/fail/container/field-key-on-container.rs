//! `skip` belongs on a field, not on the struct.

use nnx::{Module, Tensor};

#[derive(Module)]
#[nnx(skip)]
struct Layer {
    weight: Tensor,
}

fn main() {}
