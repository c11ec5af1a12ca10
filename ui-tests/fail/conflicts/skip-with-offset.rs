//! A skipped field is never walked: `offset` on it would be ignored.

use nnx::{Module, Tensor};

#[derive(Module)]
struct Layer {
    #[nnx(skip, offset = 1.0)]
    cache: Tensor,
}

fn main() {}
