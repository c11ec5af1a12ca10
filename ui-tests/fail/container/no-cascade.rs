//! A bad attribute is the only error: the type is still a `Module` wherever it is used.

use nnx::{Module, Tensor};

#[derive(Module)]
struct Layer {
    #[nnx(rename = "")]
    weight: Tensor,
}

#[derive(Module)]
struct Model {
    #[nnx(from = "layer")]
    layers: Vec<Layer>,
}

fn keys(model: &Model) -> usize {
    model.flat_state_dict().len()
}

fn main() {
    let _ = keys;
}
