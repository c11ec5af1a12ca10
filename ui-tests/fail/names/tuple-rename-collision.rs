//! In a tuple struct, a rename onto another field's index.

use nnx::{Module, Tensor};

#[derive(Module)]
struct Pair(Tensor, #[nnx(rename = "0")] Tensor);

fn main() {}
