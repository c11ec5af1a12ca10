//! `Vec` and array elements add their index; `Option` adds nothing (and `None` has no tensors);
//! `Box` is transparent. The walk is mutable too.

use nnx::nn::{Init, LayerNorm, Linear};
use nnx::{DType, Module, Tensor};

#[derive(Module)]
struct Block {
    norm: LayerNorm,
    #[nnx(optional)]
    gate: Option<Tensor>,
}

#[derive(Module)]
struct Model {
    blocks: Vec<Block>,
    heads: [Linear; 2],
    extra: Option<Box<Tensor>>,
    missing: Option<Tensor>,
    boxed: Box<Block>,
    #[nnx(from = "deep")]
    nested: Vec<[Option<Box<Tensor>>; 1]>,
}

fn block(gate: bool) -> Block {
    Block {
        norm: LayerNorm::builder(2).bias(false).init(Init::Zeros).build(),
        gate: gate.then(|| Tensor::zeros(DType::F32, &[2])),
    }
}

fn main() {
    let linear = || Linear::builder(2, 2).bias(false).init(Init::Zeros).build();
    let mut model = Model {
        blocks: vec![block(true), block(false)],
        heads: [linear(), linear()],
        extra: Some(Box::new(Tensor::zeros(DType::F32, &[1]))),
        missing: None,
        boxed: Box::new(block(false)),
        nested: vec![[Some(Box::new(Tensor::zeros(DType::F32, &[1])))]],
    };
    let mut entries = Vec::new();
    nnx::for_each_entry(&model, |entry, _| entries.push((entry.name.to_string(), entry.source.to_string())));
    let names: Vec<&str> = entries.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(
        names,
        [
            "blocks.0.norm.weight",
            "blocks.0.gate",
            "blocks.1.norm.weight",
            "heads.0.weight",
            "heads.1.weight",
            "extra",
            "boxed.norm.weight",
            "nested.0.0",
        ]
    );
    assert_eq!(entries.last().map(|(_, source)| source.as_str()), Some("deep.0.0"));

    let mut visited = 0;
    nnx::for_each_entry_mut(&mut model, |entry, tensor| {
        assert!(!entry.name.is_empty());
        *tensor = Tensor::zeros(DType::F16, tensor.shape());
        visited += 1;
    });
    assert_eq!(visited, 8);
    nnx::for_each_entry(&model, |_, tensor| assert_eq!(tensor.dtype(), DType::F16));
}
