//! Layers with PyTorch names and layouts: `Linear` (`weight` `[out, in]`, `bias`),
//! `Embedding`, `LayerNorm` and `RmsNorm`, each built with a builder as meta, zeros or seeded
//! random tensors.
//!
//! # Seeds
//!
//! Under [`Init::Seeded`]`(seed)` every tensor draws from its own generator, seeded by
//! [`path_seed`]`(seed, path)` where `path` is the tensor's path in the model
//! (`h.0.attn.q.weight`). A layer knows the last segment (`weight`, `bias`); the model tells it
//! the rest with [`Init::at`], using the same path segments as the state dict:
//!
//! ```
//! use nnx_core::nn::{Init, Linear};
//!
//! let init = Init::Seeded(7);
//! let q = Linear::builder(4, 4).init(init.at("attn.q")).build();
//! let k = Linear::builder(4, 4).init(init.at("attn.k")).build();
//! assert_ne!(q.weight.to_vec::<f32>()?, k.weight.to_vec::<f32>()?);
//! # Ok::<(), nnx_core::Error>(())
//! ```

use nnx_derive::Module;

#[cfg(feature = "kernels")]
use crate::OnDevice;
use crate::{DType, Device, Host, Tensor};

/// How a layer's tensors are created.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Init {
    /// Dtype and shape only, no storage: for models whose weights are loaded or imported next.
    Meta,
    /// Every element zero.
    Zeros,
    /// PyTorch's default initialisation, from deterministic generators: each tensor's generator
    /// is seeded by [`path_seed`] from this seed and the tensor's path.
    Seeded(u64),
}

impl Init {
    /// The initialisation of the part at `path` (dotted, relative to where `self` applies):
    /// a seeded init moves its seed down the path, as [`path_seed`] does; meta and zeros are
    /// unchanged. `init.at("a").at("b")` is `init.at("a.b")`.
    ///
    /// # Examples
    /// ```
    /// use nnx_core::nn::{Init, path_seed};
    /// assert_eq!(Init::Seeded(3).at("h.0").at("mlp"), Init::Seeded(path_seed(3, "h.0.mlp")));
    /// assert_eq!(Init::Meta.at("h.0"), Init::Meta);
    /// ```
    #[must_use]
    pub fn at(self, path: &str) -> Init {
        match self {
            Init::Seeded(seed) => Init::Seeded(path_seed(seed, path)),
            other => other,
        }
    }
}

/// The seed of the tensor at `path` (a dotted model path such as `h.0.attn.q.weight`) under
/// [`Init::Seeded`]`(seed)`: each segment, in order, is hashed (64-bit FNV-1a) and mixed into the
/// seed (SplitMix64). Empty segments are ignored, so `path_seed(s, "a.b")` is
/// `path_seed(path_seed(s, "a"), "b")` and `path_seed(s, "")` is `s`.
pub fn path_seed(seed: u64, path: &str) -> u64 {
    path.split('.').filter(|segment| !segment.is_empty()).fold(seed, |seed, segment| {
        let hash = segment
            .bytes()
            .fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3));
        splitmix(seed ^ hash)
    })
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

/// The tensor `name` of a layer, with values from `value(rng)` when seeded.
///
/// # Panics
/// When `init` is seeded and `dtype` is not f16, bf16, f32 or f64: random weights need a float
/// dtype.
fn filled(name: &str, dtype: DType, shape: &[usize], init: Init, mut value: impl FnMut(&mut Rng) -> f32) -> Tensor {
    match init.at(name) {
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

/// A tensor of one value (zeros or metadata when `init` says so).
fn constant(dtype: DType, shape: &[usize], init: Init, value: f32) -> Tensor {
    match init {
        Init::Meta => Tensor::meta(dtype, shape),
        Init::Zeros => Tensor::zeros(dtype, shape),
        Init::Seeded(_) => filled("", dtype, shape, init, |_| value),
    }
}

/// `y = x W^T + b`, with `weight` stored `[out_features, in_features]` as in PyTorch.
///
/// # Examples
/// ```
/// use nnx_core::nn::{Init, Linear};
/// use nnx_core::DType;
///
/// let layer = Linear::builder(4, 16).bias(false).dtype(DType::BF16).init(Init::Seeded(0)).build();
/// assert_eq!(layer.weight.shape(), [16, 4]);
/// assert!(layer.bias.is_none());
/// ```
#[derive(Clone, Debug, Module)]
#[nnx(crate = "crate")]
pub struct Linear<D: Device = Host> {
    /// `[out_features, in_features]`.
    pub weight: Tensor<D>,
    /// `[out_features]`, when the layer has a bias.
    pub bias: Option<Tensor<D>>,
}

/// Builds a [`Linear`]: with a bias, in f32, zero-initialised, unless told otherwise.
#[derive(Clone, Copy, Debug)]
#[must_use = "a builder does nothing until `build` is called"]
pub struct LinearBuilder {
    in_features: usize,
    out_features: usize,
    bias: bool,
    dtype: DType,
    init: Init,
}

impl LinearBuilder {
    /// Whether the layer has a bias (default: yes).
    pub fn bias(mut self, bias: bool) -> Self {
        self.bias = bias;
        self
    }

    /// The dtype of its tensors (default: f32).
    pub fn dtype(mut self, dtype: DType) -> Self {
        self.dtype = dtype;
        self
    }

    /// How its tensors are created (default: [`Init::Zeros`]). Seeded weight and bias are
    /// uniform in `±1/sqrt(in_features)`, as PyTorch draws them.
    pub fn init(mut self, init: Init) -> Self {
        self.init = init;
        self
    }

    /// The layer.
    ///
    /// # Panics
    /// When the init is [`Init::Seeded`] and the dtype is not a float dtype.
    pub fn build(self) -> Linear {
        let LinearBuilder { in_features, out_features, bias, dtype, init } = self;
        let bound = 1.0 / (in_features.max(1) as f32).sqrt();
        let uniform = move |rng: &mut Rng| (rng.unit() * 2.0 - 1.0) * bound;
        Linear {
            weight: filled("weight", dtype, &[out_features, in_features], init, uniform),
            bias: bias.then(|| filled("bias", dtype, &[out_features], init, uniform)),
        }
    }
}

impl Linear {
    /// A builder for a layer from `in_features` to `out_features`.
    pub fn builder(in_features: usize, out_features: usize) -> LinearBuilder {
        LinearBuilder { in_features, out_features, bias: true, dtype: DType::F32, init: Init::Zeros }
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

/// A lookup table of `num_embeddings` rows of width `embedding_dim`.
#[derive(Clone, Debug, Module)]
#[nnx(crate = "crate")]
pub struct Embedding<D: Device = Host> {
    /// `[num_embeddings, embedding_dim]`.
    pub weight: Tensor<D>,
}

/// Builds an [`Embedding`]: in f32, zero-initialised, unless told otherwise.
#[derive(Clone, Copy, Debug)]
#[must_use = "a builder does nothing until `build` is called"]
pub struct EmbeddingBuilder {
    num_embeddings: usize,
    embedding_dim: usize,
    dtype: DType,
    init: Init,
}

impl EmbeddingBuilder {
    /// The dtype of the table (default: f32).
    pub fn dtype(mut self, dtype: DType) -> Self {
        self.dtype = dtype;
        self
    }

    /// How the table is created (default: [`Init::Zeros`]). Seeded rows are standard normal,
    /// as in PyTorch.
    pub fn init(mut self, init: Init) -> Self {
        self.init = init;
        self
    }

    /// The table.
    ///
    /// # Panics
    /// When the init is [`Init::Seeded`] and the dtype is not a float dtype.
    pub fn build(self) -> Embedding {
        let normal = |rng: &mut Rng| {
            // Box-Muller; `1 - unit` is in (0, 1], so the logarithm is finite.
            let radius = (-2.0 * (1.0 - rng.unit()).ln()).sqrt();
            radius * (std::f32::consts::TAU * rng.unit()).cos()
        };
        let shape = [self.num_embeddings, self.embedding_dim];
        Embedding { weight: filled("weight", self.dtype, &shape, self.init, normal) }
    }
}

impl Embedding {
    /// A builder for a table of `num_embeddings` rows of width `embedding_dim`.
    pub fn builder(num_embeddings: usize, embedding_dim: usize) -> EmbeddingBuilder {
        EmbeddingBuilder { num_embeddings, embedding_dim, dtype: DType::F32, init: Init::Zeros }
    }
}

/// Layer normalisation over the last axis with a learned scale (`weight`) and shift (`bias`).
#[derive(Clone, Debug, Module)]
#[nnx(crate = "crate")]
pub struct LayerNorm<D: Device = Host> {
    /// `[dim]`, ones when initialised.
    pub weight: Tensor<D>,
    /// `[dim]`, zeros when initialised, when the layer has a bias.
    pub bias: Option<Tensor<D>>,
    /// Added to the variance before the square root.
    #[nnx(skip)]
    pub eps: f32,
}

/// Builds a [`LayerNorm`]: with a bias, `eps` 1e-5, in f32, zero-initialised, unless told
/// otherwise.
#[derive(Clone, Copy, Debug)]
#[must_use = "a builder does nothing until `build` is called"]
pub struct LayerNormBuilder {
    dim: usize,
    bias: bool,
    eps: f32,
    dtype: DType,
    init: Init,
}

impl LayerNormBuilder {
    /// Whether the norm has a bias (default: yes).
    pub fn bias(mut self, bias: bool) -> Self {
        self.bias = bias;
        self
    }

    /// Added to the variance before the square root (default: 1e-5, as in PyTorch).
    pub fn eps(mut self, eps: f32) -> Self {
        self.eps = eps;
        self
    }

    /// The dtype of its tensors (default: f32).
    pub fn dtype(mut self, dtype: DType) -> Self {
        self.dtype = dtype;
        self
    }

    /// How its tensors are created (default: [`Init::Zeros`]). Seeded initialisation gives
    /// weight ones and bias zeros, as in PyTorch.
    pub fn init(mut self, init: Init) -> Self {
        self.init = init;
        self
    }

    /// The norm.
    pub fn build(self) -> LayerNorm {
        let LayerNormBuilder { dim, bias, eps, dtype, init } = self;
        LayerNorm {
            weight: constant(dtype, &[dim], init, 1.0),
            bias: bias.then(|| constant(dtype, &[dim], init, 0.0)),
            eps,
        }
    }
}

impl LayerNorm {
    /// A builder for a norm over `dim` features.
    pub fn builder(dim: usize) -> LayerNormBuilder {
        LayerNormBuilder { dim, bias: true, eps: 1e-5, dtype: DType::F32, init: Init::Zeros }
    }
}

/// Root-mean-square normalisation over the last axis with a learned scale (`weight`).
#[derive(Clone, Debug, Module)]
#[nnx(crate = "crate")]
pub struct RmsNorm<D: Device = Host> {
    /// `[dim]`, ones when initialised.
    pub weight: Tensor<D>,
    /// Added to the mean square before the square root.
    #[nnx(skip)]
    pub eps: f32,
}

/// Builds an [`RmsNorm`]: `eps` 1e-6, in f32, zero-initialised, unless told otherwise.
#[derive(Clone, Copy, Debug)]
#[must_use = "a builder does nothing until `build` is called"]
pub struct RmsNormBuilder {
    dim: usize,
    eps: f32,
    dtype: DType,
    init: Init,
}

impl RmsNormBuilder {
    /// Added to the mean square before the square root (default: 1e-6).
    pub fn eps(mut self, eps: f32) -> Self {
        self.eps = eps;
        self
    }

    /// The dtype of its weight (default: f32).
    pub fn dtype(mut self, dtype: DType) -> Self {
        self.dtype = dtype;
        self
    }

    /// How its weight is created (default: [`Init::Zeros`]). Seeded initialisation gives ones.
    pub fn init(mut self, init: Init) -> Self {
        self.init = init;
        self
    }

    /// The norm.
    pub fn build(self) -> RmsNorm {
        RmsNorm { weight: constant(self.dtype, &[self.dim], self.init, 1.0), eps: self.eps }
    }
}

impl RmsNorm {
    /// A builder for a norm over `dim` features.
    pub fn builder(dim: usize) -> RmsNormBuilder {
        RmsNormBuilder { dim, eps: 1e-6, dtype: DType::F32, init: Init::Zeros }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Module as _;

    #[test]
    fn seeds_follow_the_path() {
        assert_eq!(path_seed(5, ""), 5);
        assert_eq!(path_seed(5, "a.b"), path_seed(path_seed(5, "a"), "b"));
        assert_eq!(Init::Seeded(5).at("a").at("b.c"), Init::Seeded(path_seed(5, "a.b.c")));
        assert_ne!(path_seed(5, "a.b"), path_seed(5, "b.a"));
        assert_ne!(path_seed(5, "q"), path_seed(5, "k"));
        let init = Init::Seeded(1);
        let q = Linear::builder(4, 4).init(init.at("q")).build();
        let k = Linear::builder(4, 4).init(init.at("k")).build();
        assert_ne!(q.weight.to_vec::<f32>().unwrap(), k.weight.to_vec::<f32>().unwrap());
        let again = Linear::builder(4, 4).init(Init::Seeded(path_seed(1, "q"))).build();
        assert_eq!(q.weight.to_vec::<f32>().unwrap(), again.weight.to_vec::<f32>().unwrap());
    }

    #[test]
    fn builders_default_and_walk() {
        let layer = Linear::builder(3, 2).build();
        assert_eq!(layer.weight.dtype(), DType::F32);
        assert_eq!(layer.weight.to_vec::<f32>().unwrap(), [0.0; 6]);
        let names: Vec<String> = layer.flat_state_dict().keys().map(str::to_string).collect();
        assert_eq!(names, ["weight", "bias"]);
        let norm = LayerNorm::builder(3).bias(false).eps(1e-6).dtype(DType::BF16).init(Init::Meta).build();
        assert!(norm.weight.is_meta() && norm.bias.is_none());
        assert_eq!((norm.eps, norm.weight.dtype()), (1e-6, DType::BF16));
    }

    #[test]
    fn seeded_init_is_reproducible_and_bounded() {
        let a = Linear::builder(16, 4).init(Init::Seeded(7)).build();
        let b = Linear::builder(16, 4).init(Init::Seeded(7)).build();
        let values = a.weight.to_vec::<f32>().unwrap();
        assert_eq!(values, b.weight.to_vec::<f32>().unwrap());
        assert!(values.iter().all(|v| v.abs() <= 0.25));
        assert_ne!(values[..4], a.bias.unwrap().to_vec::<f32>().unwrap()[..]);
        let c = Linear::builder(16, 4).init(Init::Seeded(8)).build();
        assert_ne!(values, c.weight.to_vec::<f32>().unwrap());
    }

    #[test]
    fn meta_layers_allocate_nothing() {
        let layer = Embedding::builder(50_000, 4096).dtype(DType::BF16).init(Init::Meta).build();
        assert!(layer.weight.is_meta());
        assert_eq!(layer.weight.shape(), &[50_000, 4096]);
    }

    #[test]
    fn norms_start_at_identity() {
        let norm = LayerNorm::builder(3).init(Init::Seeded(1)).build();
        assert_eq!(norm.weight.to_vec::<f32>().unwrap(), [1.0; 3]);
        assert_eq!(norm.bias.unwrap().to_vec::<f32>().unwrap(), [0.0; 3]);
    }
}

#[cfg(feature = "kernels")]
impl<D: Device> Linear<D>
where
    Tensor<D>: crate::Compute,
{
    /// `x · weightᵀ + bias` for `x` `[.., in_features]`, giving `[.., out_features]` in f32.
    ///
    /// # Errors
    /// As [`Tensor::linear`].
    ///
    /// # Examples
    /// ```
    /// use nnx_core::nn::{Init, Linear};
    /// use nnx_core::{DType, Tensor};
    /// let layer = Linear::builder(4, 2).build();
    /// let y = layer.forward(&Tensor::zeros(DType::F32, &[3, 4]))?;
    /// assert_eq!(y.shape(), [3, 2]);
    /// # Ok::<(), nnx_core::Error>(())
    /// ```
    pub fn forward(&self, x: &impl OnDevice<D>) -> crate::Result<Tensor<D>> {
        crate::Compute::linear(x.on_device(), &self.weight, self.bias.as_ref())
    }
}

#[cfg(feature = "kernels")]
impl<D: Device> Embedding<D>
where
    Tensor<D>: crate::Compute,
{
    /// The rows `ids` of the table, as `[ids.len(), embedding_dim]` in f32.
    ///
    /// # Errors
    /// As [`Tensor::embedding`].
    pub fn forward(&self, ids: &[u32]) -> crate::Result<Tensor<D>> {
        crate::Compute::embedding(&self.weight, ids)
    }
}

#[cfg(feature = "kernels")]
impl<D: Device> LayerNorm<D>
where
    Tensor<D>: crate::Compute,
{
    /// Layer normalisation of `x` over its last axis with this layer's weight, bias and eps.
    ///
    /// # Errors
    /// As [`Tensor::layer_norm`].
    pub fn forward(&self, x: &impl OnDevice<D>) -> crate::Result<Tensor<D>> {
        crate::Compute::layer_norm(x.on_device(), Some(&self.weight), self.bias.as_ref(), self.eps)
    }
}

#[cfg(feature = "kernels")]
impl<D: Device> RmsNorm<D>
where
    Tensor<D>: crate::Compute,
{
    /// RMS normalisation of `x` over its last axis with this layer's weight and eps.
    ///
    /// # Errors
    /// As [`Tensor::rms_norm`].
    pub fn forward(&self, x: &impl OnDevice<D>) -> crate::Result<Tensor<D>> {
        crate::Compute::rms_norm(x.on_device(), Some(&self.weight), self.eps)
    }
}

/// The layers prepared for the fused CPU kernels: the kernels take tensors, the layers give
/// theirs here, so that the kernels never depend on the layers.
#[cfg(feature = "kernels")]
impl crate::fused::FusedLinear {
    /// Prepares `layer`.
    ///
    /// # Errors
    /// As [`FusedLinear::concat`](crate::fused::FusedLinear::concat).
    pub fn new(layer: &Linear) -> crate::Result<crate::fused::FusedLinear> {
        crate::fused::FusedLinear::concat(&[layer])
    }

    /// One layer computing the outputs of `layers`, side by side, from the same input: the
    /// query, key and value projections of attention become one product with three times the
    /// outputs. A layer without a bias contributes zeros to the concatenated bias.
    ///
    /// # Errors
    /// [`Error::Concat`](crate::Error::Concat) for no layers, [`Error::BadShape`](crate::Error::BadShape)
    /// for a weight that is not rank 2, [`Error::ShapeMismatch`](crate::Error::ShapeMismatch) when the
    /// layers' `in_features` differ or a bias is not `[out_features]`,
    /// [`Error::NotFloat`](crate::Error::NotFloat), [`Error::Meta`](crate::Error::Meta).
    ///
    /// # Examples
    /// ```
    /// use nnx_core::fused::{Epilogue, FusedLinear};
    /// use nnx_core::nn::{Init, Linear};
    /// let (q, k) = (Linear::builder(4, 2).init(Init::Seeded(1)).build(), Linear::builder(4, 3).init(Init::Seeded(2)).build());
    /// let both = FusedLinear::concat(&[&q, &k])?;
    /// let x = [0.5f32, -1.0, 2.0, 0.0];
    /// let mut out = [0.0f32; 5];
    /// both.forward_into(&x, &mut out, Epilogue::Bias);
    /// let input = nnx_core::Tensor::from_vec(x.to_vec(), &[1, 4])?;
    /// let expected = q.forward(&input)?.to_vec::<f32>()?;
    /// assert!(out[..2].iter().zip(&expected).all(|(a, b)| (a - b).abs() < 1e-6));
    /// # Ok::<(), nnx_core::Error>(())
    /// ```
    pub fn concat(layers: &[&Linear]) -> crate::Result<crate::fused::FusedLinear> {
        let parts: Vec<(&Tensor, Option<&Tensor>)> =
            layers.iter().map(|layer| (&layer.weight, layer.bias.as_ref())).collect();
        crate::fused::FusedLinear::from_layers(&parts)
    }
}

#[cfg(feature = "kernels")]
impl crate::fused::FusedLayerNorm {
    /// Prepares `norm`.
    ///
    /// # Errors
    /// [`Error::BadShape`](crate::Error::BadShape) for a weight that is not rank 1,
    /// [`Error::ShapeMismatch`](crate::Error::ShapeMismatch) for a bias of another shape,
    /// [`Error::NotFloat`](crate::Error::NotFloat), [`Error::Meta`](crate::Error::Meta).
    pub fn new(norm: &LayerNorm) -> crate::Result<crate::fused::FusedLayerNorm> {
        crate::fused::FusedLayerNorm::from_parts(&norm.weight, norm.bias.as_ref(), norm.eps)
    }
}

#[cfg(feature = "kernels")]
#[cfg(test)]
mod forward_tests {
    use super::*;

    #[test]
    fn layers_forward() {
        let linear = Linear::builder(3, 2).init(Init::Seeded(3)).build();
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
        let embedding = Embedding::builder(5, 3).dtype(DType::BF16).init(Init::Seeded(4)).build();
        assert_eq!(embedding.forward(&[4, 1]).unwrap().shape(), [2, 3]);
        let norm = LayerNorm::builder(3).init(Init::Seeded(1)).build();
        let normed = norm.forward(&x).unwrap().to_vec::<f32>().unwrap();
        assert!(normed[..3].iter().sum::<f32>().abs() < 1e-5);
        let rms = RmsNorm::builder(3).init(Init::Seeded(1)).build();
        let scaled = rms.forward(&x).unwrap().to_vec::<f32>().unwrap();
        let mean_square = scaled[..3].iter().map(|v| v * v).sum::<f32>() / 3.0;
        assert!((mean_square - 1.0).abs() < 1e-4);
    }
}
