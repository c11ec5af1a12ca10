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
        #[diagnostic::do_not_recommend]
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

        #[diagnostic::do_not_recommend]
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

impl Linear {
    /// `x · weightᵀ + bias` for `x` `[.., in_features]`, giving `[.., out_features]` in f32.
    ///
    /// # Errors
    /// As [`Tensor::linear`].
    ///
    /// # Examples
    /// ```
    /// use nnx_core::nn::{Init, Linear};
    /// use nnx_core::{DType, Tensor};
    /// let layer = Linear::new(4, 2, true, DType::F32, Init::Zeros);
    /// let y = layer.forward(&Tensor::zeros(DType::F32, &[3, 4]))?;
    /// assert_eq!(y.shape(), [3, 2]);
    /// # Ok::<(), nnx_core::Error>(())
    /// ```
    pub fn forward(&self, x: &Tensor) -> crate::Result<Tensor> {
        x.linear(&self.weight, self.bias.as_ref())
    }
}

impl Embedding {
    /// The rows `ids` of the table, as `[ids.len(), embedding_dim]` in f32.
    ///
    /// # Errors
    /// As [`Tensor::embedding`].
    pub fn forward(&self, ids: &[u32]) -> crate::Result<Tensor> {
        Tensor::embedding(&self.weight, ids)
    }
}

impl LayerNorm {
    /// Layer normalisation of `x` over its last axis with this layer's weight, bias and eps.
    ///
    /// # Errors
    /// As [`Tensor::layer_norm`].
    pub fn forward(&self, x: &Tensor) -> crate::Result<Tensor> {
        x.layer_norm(Some(&self.weight), self.bias.as_ref(), self.eps)
    }
}

impl RmsNorm {
    /// RMS normalisation of `x` over its last axis with this layer's weight and eps.
    ///
    /// # Errors
    /// As [`Tensor::rms_norm`].
    pub fn forward(&self, x: &Tensor) -> crate::Result<Tensor> {
        x.rms_norm(Some(&self.weight), self.eps)
    }
}

#[cfg(test)]
mod forward_tests {
    use super::*;

    #[test]
    fn layers_forward() {
        let linear = Linear::new(3, 2, true, DType::F32, Init::Seeded(3));
        let x = Tensor::from_vec(vec![1.0f32, -1.0, 2.0, 0.5, 0.0, 1.0], &[2, 3]).unwrap();
        let w = linear.weight.to_vec::<f32>().unwrap();
        let b = linear.bias.as_ref().unwrap().to_vec::<f32>().unwrap();
        let xs = x.to_vec::<f32>().unwrap();
        let y = linear.forward(&x).unwrap().to_vec::<f32>().unwrap();
        for row in 0..2 {
            for out in 0..2 {
                let expected: f32 = (0..3).map(|i| xs[row * 3 + i] * w[out * 3 + i]).sum::<f32>() + b[out];
                assert!((y[row * 2 + out] - expected).abs() < 1e-6);
            }
        }
        let embedding = Embedding::new(5, 3, DType::BF16, Init::Seeded(4));
        assert_eq!(embedding.forward(&[4, 1]).unwrap().shape(), [2, 3]);
        let norm = LayerNorm::new(3, true, 1e-5, DType::F32, Init::Seeded(1));
        let normed = norm.forward(&x).unwrap().to_vec::<f32>().unwrap();
        assert!(normed[..3].iter().sum::<f32>().abs() < 1e-5);
        let rms = RmsNorm::new(3, 1e-6, DType::F32, Init::Seeded(1));
        let scaled = rms.forward(&x).unwrap().to_vec::<f32>().unwrap();
        let mean_square = scaled[..3].iter().map(|v| v * v).sum::<f32>() / 3.0;
        assert!((mean_square - 1.0).abs() < 1e-4);
    }
}
