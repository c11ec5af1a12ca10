//! Layers with PyTorch names and layouts: `Linear` (`weight` `[out, in]`, `bias`),
//! `Embedding`, `LayerNorm` and `RmsNorm`, each buildable as meta, zeros or seeded random.

use crate::module::{Field, ImportRule, Module, Step, Visitor, VisitorMut};
use crate::{DType, HoldsTensors, Tensor};

/// How a layer's tensors are created.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Init {
    /// Dtype and shape only, no storage: for models whose weights are loaded or imported next.
    Meta,
    /// Every element zero.
    Zeros,
    /// PyTorch's default initialisation, from a deterministic generator seeded with the value.
    Seeded(u64),
}

impl Init {
    /// A different but reproducible seed for a sub-part (layer `salt` of a model): meta and
    /// zeros are unchanged.
    pub fn fork(self, salt: u64) -> Init {
        match self {
            Init::Seeded(seed) => Init::Seeded(splitmix(seed ^ splitmix(salt.wrapping_add(0x5851_f42d_4c95_7f2d)))),
            other => other,
        }
    }
}

fn splitmix(mut state: u64) -> u64 {
    state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A small deterministic generator (SplitMix64): the same seed gives the same weights on every
/// platform.
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        splitmix(self.0.wrapping_sub(0x9e37_79b9_7f4a_7c15))
    }

    /// Uniform in `[0, 1)` with 24 bits of precision.
    fn unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }
}

/// Values from `value(rng)` as a tensor of `dtype`.
///
/// # Panics
/// When `dtype` is not f16, bf16, f32 or f64: random weights need a float dtype.
fn filled(dtype: DType, shape: &[usize], init: Init, mut value: impl FnMut(&mut Rng) -> f32) -> Tensor {
    match init {
        Init::Meta => Tensor::meta(dtype, shape),
        Init::Zeros => Tensor::zeros(dtype, shape),
        Init::Seeded(seed) => {
            assert!(
                dtype.is_castable_float(),
                "seeded initialisation needs a float dtype (f16, bf16, f32, f64), not {dtype}"
            );
            let mut rng = Rng(seed);
            let data: Vec<f32> = (0..shape.iter().product::<usize>()).map(|_| value(&mut rng)).collect();
            Tensor::from_vec(data, shape).and_then(|t| t.to_dtype(dtype)).expect("shape and dtype were checked")
        }
    }
}

fn constant(dtype: DType, shape: &[usize], init: Init, value: f32) -> Tensor {
    filled(dtype, shape, init, |_| value)
}

const WEIGHT: Field = Field { ident: "weight", segment: "weight", rule: ImportRule::NONE };
const BIAS: Field = Field { ident: "bias", segment: "bias", rule: ImportRule::NONE };

/// Walks `weight` and an optional `bias`, the state of every layer here.
macro_rules! weight_and_bias {
    ($layer:ty, $bias:ident) => {
        impl Module for $layer {
            fn walk(&self, visitor: &mut dyn Visitor) {
                visitor.enter(Step::Field(&WEIGHT));
                self.weight.walk(visitor);
                visitor.leave();
                weight_and_bias!(@bias self, visitor, walk, $bias);
            }

            fn walk_mut(&mut self, visitor: &mut dyn VisitorMut) {
                visitor.enter(Step::Field(&WEIGHT));
                self.weight.walk_mut(visitor);
                visitor.leave();
                weight_and_bias!(@bias self, visitor, walk_mut, $bias);
            }
        }

        impl HoldsTensors for $layer {}
    };
    (@bias $self:ident, $visitor:ident, $walk:ident, bias) => {
        if $self.bias.is_some() {
            $visitor.enter(Step::Field(&BIAS));
            $self.bias.$walk($visitor);
            $visitor.leave();
        }
    };
    (@bias $self:ident, $visitor:ident, $walk:ident, no_bias) => {};
}

/// `y = x W^T + b`, with `weight` stored `[out_features, in_features]` as in PyTorch.
#[derive(Clone, Debug)]
pub struct Linear {
    /// `[out_features, in_features]`.
    pub weight: Tensor,
    /// `[out_features]`, when the layer has a bias.
    pub bias: Option<Tensor>,
}

impl Linear {
    /// A layer from `in_features` to `out_features`; seeded weights and bias are uniform in
    /// `±1/sqrt(in_features)` as PyTorch draws them.
    ///
    /// # Panics
    /// When `init` is [`Init::Seeded`] and `dtype` is not a float dtype.
    pub fn new(in_features: usize, out_features: usize, bias: bool, dtype: DType, init: Init) -> Linear {
        let bound = 1.0 / (in_features.max(1) as f32).sqrt();
        let uniform = move |rng: &mut Rng| (rng.unit() * 2.0 - 1.0) * bound;
        Linear {
            weight: filled(dtype, &[out_features, in_features], init, uniform),
            bias: bias.then(|| filled(dtype, &[out_features], init.fork(1), uniform)),
        }
    }

    /// The input width.
    pub fn in_features(&self) -> usize {
        self.weight.shape().get(1).copied().unwrap_or(0)
    }

    /// The output width.
    pub fn out_features(&self) -> usize {
        self.weight.shape().first().copied().unwrap_or(0)
    }
}

weight_and_bias!(Linear, bias);

/// A lookup table of `num_embeddings` rows of width `embedding_dim`.
#[derive(Clone, Debug)]
pub struct Embedding {
    /// `[num_embeddings, embedding_dim]`.
    pub weight: Tensor,
}

impl Embedding {
    /// A table; seeded rows are standard normal as in PyTorch.
    ///
    /// # Panics
    /// When `init` is [`Init::Seeded`] and `dtype` is not a float dtype.
    pub fn new(num_embeddings: usize, embedding_dim: usize, dtype: DType, init: Init) -> Embedding {
        let normal = |rng: &mut Rng| {
            // Box-Muller; `1 - unit` is in (0, 1], so the logarithm is finite.
            let radius = (-2.0 * (1.0 - rng.unit()).ln()).sqrt();
            radius * (std::f32::consts::TAU * rng.unit()).cos()
        };
        Embedding { weight: filled(dtype, &[num_embeddings, embedding_dim], init, normal) }
    }
}

weight_and_bias!(Embedding, no_bias);

/// Layer normalisation over the last axis with a learned scale (`weight`) and shift (`bias`).
#[derive(Clone, Debug)]
pub struct LayerNorm {
    /// `[dim]`, ones when initialised.
    pub weight: Tensor,
    /// `[dim]`, zeros when initialised, when the layer has a bias.
    pub bias: Option<Tensor>,
    /// Added to the variance before the square root.
    pub eps: f32,
}

impl LayerNorm {
    /// A norm over `dim` features; seeded initialisation gives weight ones and bias zeros as
    /// in PyTorch.
    pub fn new(dim: usize, bias: bool, eps: f32, dtype: DType, init: Init) -> LayerNorm {
        LayerNorm {
            weight: constant(dtype, &[dim], init, 1.0),
            bias: bias.then(|| constant(dtype, &[dim], init, 0.0)),
            eps,
        }
    }
}

weight_and_bias!(LayerNorm, bias);

/// Root-mean-square normalisation over the last axis with a learned scale (`weight`).
#[derive(Clone, Debug)]
pub struct RmsNorm {
    /// `[dim]`, ones when initialised.
    pub weight: Tensor,
    /// Added to the mean square before the square root.
    pub eps: f32,
}

impl RmsNorm {
    /// A norm over `dim` features; seeded initialisation gives weight ones.
    pub fn new(dim: usize, eps: f32, dtype: DType, init: Init) -> RmsNorm {
        RmsNorm { weight: constant(dtype, &[dim], init, 1.0), eps }
    }
}

weight_and_bias!(RmsNorm, no_bias);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeded_init_is_reproducible_and_bounded() {
        let a = Linear::new(16, 4, true, DType::F32, Init::Seeded(7));
        let b = Linear::new(16, 4, true, DType::F32, Init::Seeded(7));
        let values = a.weight.to_vec::<f32>().unwrap();
        assert_eq!(values, b.weight.to_vec::<f32>().unwrap());
        assert!(values.iter().all(|v| v.abs() <= 0.25));
        assert_ne!(values[..4], a.bias.unwrap().to_vec::<f32>().unwrap()[..]);
        let c = Linear::new(16, 4, true, DType::F32, Init::Seeded(8));
        assert_ne!(values, c.weight.to_vec::<f32>().unwrap());
    }

    #[test]
    fn meta_layers_allocate_nothing() {
        let layer = Embedding::new(50_000, 4096, DType::BF16, Init::Meta);
        assert!(layer.weight.is_meta());
        assert_eq!(layer.weight.shape(), &[50_000, 4096]);
    }

    #[test]
    fn norms_start_at_identity() {
        let norm = LayerNorm::new(3, true, 1e-5, DType::F32, Init::Seeded(1));
        assert_eq!(norm.weight.to_vec::<f32>().unwrap(), [1.0; 3]);
        assert_eq!(norm.bias.unwrap().to_vec::<f32>().unwrap(), [0.0; 3]);
    }
}
