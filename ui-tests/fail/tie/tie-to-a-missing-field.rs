//! A one-segment tie names a sibling: a misspelt one is caught here, not at import.

use nnx::nn::Linear;
use nnx::Module;

#[derive(Module)]
struct Mlp {
    fc1: Linear,
    fc2: Linear,
    #[nnx(tie = "fc3")]
    head: Linear,
}

fn main() {}
