//! `crate` belongs on the struct, not on a field.

use nnx::{Module, Tensor};

#[derive(Module)]
struct Layer {
    #[nnx(crate = "nnx")]
    weight: Tensor,
}

fn main() {}
