//! A skipped field is never walked: `rope_permute` on it would be ignored.

use nnx::{Module, Tensor};

#[derive(Module)]
struct Layer {
    #[nnx(skip, rope_permute = "head_count")]
    cache: Tensor,
}

fn main() {}
