//! Tuple-struct fields are named by their index; a rename replaces the index.

use nnx::{DType, Module, Tensor};

#[derive(Module)]
struct Pair(Tensor, #[nnx(rename = "second")] Tensor, #[nnx(skip)] f32);

#[derive(Module)]
struct Wrapper(Pair);

fn main() {
    let wrapper = Wrapper(Pair(Tensor::zeros(DType::F32, &[2]), Tensor::zeros(DType::F32, &[3]), 0.5));
    assert_eq!((wrapper.0).2, 0.5);
    let keys: Vec<String> = wrapper.flat_state_dict().keys().map(str::to_string).collect();
    assert_eq!(keys, ["0.0", "0.second"]);
}
