//! `#[nnx(crate = "...")]` names the `nnx` crate when it is reachable only under another path.

mod reexport {
    pub use ::nnx as weights;
}

mod inner {
    use nnx::{DType, Tensor};

    #[derive(nnx::Module)]
    #[nnx(crate = "crate::reexport::weights")]
    pub struct Layer {
        #[nnx(dtype = "f32")]
        pub weight: Tensor,
    }

    pub fn layer() -> Layer {
        Layer { weight: Tensor::zeros(DType::F32, &[2]) }
    }
}

extern crate nnx as renamed;

#[derive(renamed::Module)]
#[nnx(crate = "renamed")]
struct Outer {
    layer: inner::Layer,
}

fn main() {
    use nnx::Module;
    let outer = Outer { layer: inner::layer() };
    let keys: Vec<String> = outer.flat_state_dict().keys().map(str::to_string).collect();
    assert_eq!(keys, ["layer.weight"]);
}
