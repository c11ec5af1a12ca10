//! A struct with a weights parameter gets `map_weights`: each `W::Layer<D>` (alone, in an
//! `Option`, `Vec` or `Box`, or in a nested module) is converted with its path, named as the
//! walk names it (`rename` included), and every other field is cloned. `quantize` is provided
//! for every such model.

use nnx::models::{Affine, Dense, Quantize, Weights};
use nnx::nn::{Init, Linear, RmsNorm};
use nnx::{DType, Device, Host, Module};

#[derive(Module, Clone, Debug)]
struct Block<D: Device = Host, W: Weights = Dense> {
    norm: RmsNorm<D>,
    #[nnx(rename = "proj")]
    projection: W::Layer<D>,
    experts: Vec<W::Layer<D>>,
}

#[derive(Module, Clone, Debug)]
struct Model<D: Device = Host, W: Weights = Dense> {
    blocks: Vec<Block<D, W>>,
    boxed: Box<Block<D, W>>,
    head: Option<<W as Weights>::Layer<D>>,
    tied: Option<W::Layer<D>>,
    #[nnx(skip)]
    name: String,
}

fn linear() -> Linear {
    Linear::builder(32, 4).bias(false).dtype(DType::F32).init(Init::Zeros).build()
}

fn block() -> Block {
    Block { norm: RmsNorm::builder(4).build(), projection: linear(), experts: vec![linear(), linear()] }
}

fn main() -> nnx::Result<()> {
    let model = Model {
        blocks: vec![block(), block()],
        boxed: Box::new(block()),
        head: Some(linear()),
        tied: None,
        name: "m".into(),
    };
    let seen = std::cell::RefCell::new(Vec::new());
    let same: Model<Host, Dense> = model.map_weights(|path, layer| {
        seen.borrow_mut().push(path.to_string());
        Ok(layer.clone())
    })?;
    assert_eq!(
        seen.into_inner(),
        [
            "blocks.0.proj",
            "blocks.0.experts.0",
            "blocks.0.experts.1",
            "blocks.1.proj",
            "blocks.1.experts.0",
            "blocks.1.experts.1",
            "boxed.proj",
            "boxed.experts.0",
            "boxed.experts.1",
            "head",
        ]
    );
    assert_eq!(same.name, "m");
    assert_eq!(same.flat_state_dict().len(), model.flat_state_dict().len());

    let quantized: Model<Host, Affine> = model.quantize(4, 32)?;
    assert_eq!(quantized.blocks[1].experts.len(), 2);
    assert!(quantized.tied.is_none() && quantized.head.is_some());
    Ok(())
}
