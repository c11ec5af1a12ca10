//! Models written with the derive, shared by the tests: an MLP, containers, a tuple struct and
//! an optimizer state. (GPT-2 and Llama live in `nnx::models`.)

use nnx::nn::{Init, Linear};
use nnx::{DType, Module, Tensor};

#[derive(Module, Clone)]
pub struct Mlp {
    pub fc1: Linear,
    pub fc2: Linear,
    #[nnx(skip)]
    pub hidden: usize,
}

impl Mlp {
    pub fn new(input: usize, hidden: usize, output: usize, init: Init) -> Mlp {
        Mlp {
            fc1: Linear::builder(input, hidden).init(init.at("fc1")).build(),
            fc2: Linear::builder(hidden, output).init(init.at("fc2")).build(),
            hidden,
        }
    }
}

#[derive(Module)]
pub struct AdamState<M: Module> {
    pub mu: M,
    pub nu: M,
    pub step: Tensor,
}

/// A tuple struct: fields are named by index.
#[derive(Module)]
pub struct Pair(pub Linear, #[nnx(rename = "second")] pub Linear);

/// Containers: `Vec`, arrays, `Option` (absent when `None`), `Box`, and a raw tensor with a
/// required dtype.
#[derive(Module)]
pub struct Containers {
    pub layers: Vec<Mlp>,
    pub heads: [Linear; 2],
    pub adapter: Option<Linear>,
    pub missing: Option<Linear>,
    pub boxed: Box<Pair>,
    #[nnx(dtype = "i64")]
    pub positions: Tensor,
}

impl Containers {
    pub fn new(init: Init) -> Containers {
        Containers {
            layers: (0..2).map(|layer| Mlp::new(4, 8, 4, init.at(&format!("layers.{layer}")))).collect(),
            heads: [
                Linear::builder(4, 2).bias(false).init(init.at("heads.0")).build(),
                Linear::builder(4, 3).bias(false).dtype(DType::BF16).init(init.at("heads.1")).build(),
            ],
            adapter: Some(Linear::builder(4, 4).dtype(DType::F16).init(init.at("adapter")).build()),
            missing: None,
            boxed: Box::new(Pair(
                Linear::builder(2, 2).init(init.at("boxed.0")).build(),
                Linear::builder(2, 1).bias(false).init(init.at("boxed.second")).build(),
            )),
            positions: match init {
                Init::Meta => Tensor::meta(DType::I64, &[4]),
                _ => Tensor::from_vec(vec![0i64, 1, 2, 3], &[4]).unwrap(),
            },
        }
    }
}
