//! A generic struct over any `Module`, with lifetimes and const generics beside the type
//! parameter, and a field whose type only uses a const parameter.

use std::marker::PhantomData;

use nnx::nn::{Init, Linear};
use nnx::{DType, Module, Tensor};

#[derive(Module)]
struct Mlp {
    fc1: Linear,
    fc2: Linear,
}

#[derive(Module)]
struct AdamState<M: Module> {
    mu: M,
    nu: M,
    step: Tensor,
}

#[derive(Module)]
struct Stack<'a, M, const N: usize>
where
    M: Module,
{
    layers: [M; N],
    #[nnx(dtype = "f32")]
    scales: [Tensor; N],
    #[nnx(skip)]
    name: &'a str,
    #[nnx(skip)]
    marker: PhantomData<M>,
}

fn mlp(init: Init) -> Mlp {
    Mlp { fc1: Linear::builder(2, 3).init(init).build(), fc2: Linear::builder(3, 1).bias(false).init(init).build() }
}

fn keys<M: Module>(module: &M) -> Vec<String> {
    module.flat_state_dict().keys().map(str::to_string).collect()
}

fn main() {
    let state = AdamState { mu: mlp(Init::Zeros), nu: mlp(Init::Zeros), step: Tensor::zeros(DType::I64, &[]) };
    assert_eq!(
        keys(&state),
        ["mu.fc1.weight", "mu.fc1.bias", "mu.fc2.weight", "nu.fc1.weight", "nu.fc1.bias", "nu.fc2.weight", "step"]
    );

    let twin = AdamState { mu: mlp(Init::Meta), nu: mlp(Init::Meta), step: Tensor::zeros(DType::I64, &[]) };
    let nested = AdamState { mu: state, nu: twin, step: Tensor::zeros(DType::I64, &[]) };
    let nested_keys = keys(&nested);
    assert_eq!(nested_keys.len(), 7 + 7 + 1);
    assert_eq!(nested_keys[7], "nu.mu.fc1.weight");

    let stack: Stack<'_, Tensor, 2> = Stack {
        layers: [Tensor::zeros(DType::F32, &[1]), Tensor::zeros(DType::F32, &[1])],
        scales: [Tensor::zeros(DType::F32, &[1]), Tensor::zeros(DType::F32, &[1])],
        name: "stack",
        marker: PhantomData,
    };
    assert_eq!(stack.name, "stack");
    assert_eq!(keys(&stack), ["layers.0", "layers.1", "scales.0", "scales.1"]);
}
