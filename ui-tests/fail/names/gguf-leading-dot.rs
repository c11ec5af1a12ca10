//! A GGUF path starting with a dot: `gguf = ""` is the way to add no segment.

use nnx::{Module, Tensor};

#[derive(Module)]
struct Layer {
    #[nnx(gguf = ".x")]
    weight: Tensor,
}

fn main() {}
