//! Weight kinds: how a model stores its projections ([`Weights`]: [`Dense`], [`Affine`],
//! [`Seed`], [`Ggml`]), the one operation every kind of projection layer offers ([`Project`]),
//! and the conversion of a model from one kind to another that `#[derive(Module)]` generates
//! ([`MapWeights`], with [`Quantize`] on top of it).

use std::fmt::Debug;

use crate::error::Result;
use crate::nn::Linear;
use crate::quant::ggml::GgmlLinear;
use crate::quant::{QuantizedLinear, SeedLinear};
use crate::{Compute, Device, Host, Tensor};

/// A layer that maps the last axis of its input, dense or packed: what a model's projections
/// need, so that one model definition runs over either.
pub trait Project<D: Device> {
    /// `x W^T + b` in f32, for `x` `[.., in]`.
    ///
    /// # Errors
    /// The layer's own `forward` errors (a width that does not match, a meta weight).
    fn project(&self, x: &Tensor<D>) -> Result<Tensor<D>>;

    /// [`Project::project`] of each of `layers` on the same `x` (a layer's q, k and v, or the
    /// gate and up projections); a kind of layer that can run them together overrides it
    /// (ggml layers decoding a token share one parallel pass).
    ///
    /// # Errors
    /// As [`Project::project`].
    fn project_many(layers: &[&Self], x: &Tensor<D>) -> Result<Vec<Tensor<D>>>
    where
        Self: Sized,
    {
        layers.iter().map(|layer| layer.project(x)).collect()
    }
}

impl<D: Device> Project<D> for Linear<D>
where
    Tensor<D>: Compute,
{
    fn project(&self, x: &Tensor<D>) -> Result<Tensor<D>> {
        self.forward(x)
    }
}

impl Project<Host> for QuantizedLinear {
    fn project(&self, x: &Tensor) -> Result<Tensor> {
        self.forward(x)
    }
}

impl Project<Host> for GgmlLinear {
    fn project(&self, x: &Tensor) -> Result<Tensor> {
        self.forward(x)
    }

    fn project_many(layers: &[&Self], x: &Tensor) -> Result<Vec<Tensor>> {
        GgmlLinear::forward_many(layers, x)
    }
}

impl Project<Host> for SeedLinear {
    fn project(&self, x: &Tensor) -> Result<Tensor> {
        self.forward(x)
    }
}

#[cfg(feature = "gpu")]
impl Project<crate::Gpu> for QuantizedLinear<crate::Gpu> {
    fn project(&self, x: &Tensor<crate::Gpu>) -> Result<Tensor<crate::Gpu>> {
        self.forward(x)
    }
}

#[cfg(feature = "gpu")]
impl Project<crate::Gpu> for GgmlLinear<crate::Gpu> {
    fn project(&self, x: &Tensor<crate::Gpu>) -> Result<Tensor<crate::Gpu>> {
        self.forward(x)
    }
}

#[cfg(feature = "gpu")]
impl Project<crate::Gpu> for SeedLinear<crate::Gpu> {
    fn project(&self, x: &Tensor<crate::Gpu>) -> Result<Tensor<crate::Gpu>> {
        self.forward(x)
    }
}

/// How a model stores its projection weights: the type parameter `W: Weights` of a model
/// struct. [`Dense`] is the published checkpoint; [`Affine`], [`Seed`] and [`Ggml`] are
/// packed, read without ever writing the float weight. A struct deriving `Module` with such a
/// parameter gets a `map_weights` method that converts it to another kind (see [`MapWeights`]).
pub trait Weights: Clone + Debug + 'static {
    /// One projection on device `D`.
    type Layer<D: Device>: Clone + Debug;
}

/// Float weights ([`Linear`]).
#[derive(Clone, Copy, Debug)]
pub struct Dense;

/// MLX affine quantized weights ([`QuantizedLinear`]), in the layout of MLX's own
/// `QuantizedLinear`: `weight` (packed U32), `scales`, `biases`.
#[derive(Clone, Copy, Debug)]
pub struct Affine;

/// SeedLM weights ([`SeedLinear`]).
#[derive(Clone, Copy, Debug)]
pub struct Seed;

/// ggml block weights ([`GgmlLinear`]), as GGUF files store them: Q4_0, Q8_0, the K-quants,
/// IQ4 and the rest, each projection its own type.
#[derive(Clone, Copy, Debug)]
pub struct Ggml;

impl Weights for Dense {
    type Layer<D: Device> = Linear<D>;
}

impl Weights for Affine {
    type Layer<D: Device> = QuantizedLinear<D>;
}

impl Weights for Seed {
    type Layer<D: Device> = SeedLinear<D>;
}

impl Weights for Ggml {
    type Layer<D: Device> = GgmlLinear<D>;
}

/// The function a conversion applies to each projection: given its model path
/// (`layers.0.attn.q`) and the layer of kind `W`, the layer of kind `V`.
pub type Convert<'a, W, V> = dyn Fn(&str, &<W as Weights>::Layer<Host>) -> Result<<V as Weights>::Layer<Host>> + 'a;

/// A host module whose projections are stored as `W`, converted to `V`: implemented by
/// `#[derive(Module)]` for a struct with a weights parameter (`S<Host, W>` becomes
/// `S<Host, V>`), and by `Vec`, `Option` and `Box` of such modules. Models call the generated
/// inherent `map_weights`, which starts the walk at the empty path.
#[diagnostic::on_unimplemented(
    message = "`map_weights` cannot convert `{Self}` from `{W}` to `{V}`",
    label = "not a module generic over the weights parameter",
    note = "a field naming the weights parameter is `W::Layer<D>`, a struct deriving `Module` with a `W: Weights` parameter, or an `Option`, `Vec` or `Box` of those"
)]
pub trait MapWeights<W: Weights, V: Weights> {
    /// The same module with its projections of kind `V`.
    type Mapped;

    /// This module converted, its projections named under `path` (the empty path at the
    /// root), every other field cloned.
    ///
    /// # Errors
    /// The first error of `convert`.
    fn map_weights_at(&self, path: &str, convert: &Convert<'_, W, V>) -> Result<Self::Mapped>;
}

/// A container whose items a conversion maps one by one, naming each as the walk does: an
/// `Option` and a `Box` under the container's own path, the items of a `Vec` under
/// `path.{index}`. The generated `map_weights` goes through it for a field that wraps
/// projections or modules.
#[diagnostic::on_unimplemented(
    message = "`map_weights` cannot convert the items of `{Self}`",
    label = "not an `Option`, `Vec` or `Box`",
    note = "a field naming the weights parameter is `W::Layer<D>`, a struct deriving `Module` with a `W: Weights` parameter, or an `Option`, `Vec` or `Box` of those"
)]
pub trait MapEach<T> {
    /// The container of the mapped items.
    type Out<U>;

    /// Each item through `map`, given its path.
    ///
    /// # Errors
    /// The first error of `map`.
    fn map_each<U>(&self, path: &str, map: &mut dyn FnMut(&str, &T) -> Result<U>) -> Result<Self::Out<U>>;
}

impl<T> MapEach<T> for Option<T> {
    type Out<U> = Option<U>;

    fn map_each<U>(&self, path: &str, map: &mut dyn FnMut(&str, &T) -> Result<U>) -> Result<Option<U>> {
        self.as_ref().map(|item| map(path, item)).transpose()
    }
}

impl<T> MapEach<T> for Box<T> {
    type Out<U> = Box<U>;

    fn map_each<U>(&self, path: &str, map: &mut dyn FnMut(&str, &T) -> Result<U>) -> Result<Box<U>> {
        map(path, self).map(Box::new)
    }
}

impl<T> MapEach<T> for Vec<T> {
    type Out<U> = Vec<U>;

    fn map_each<U>(&self, path: &str, map: &mut dyn FnMut(&str, &T) -> Result<U>) -> Result<Vec<U>> {
        self.iter().enumerate().map(|(index, item)| map(&crate::state::join(path, &index.to_string()), item)).collect()
    }
}

/// MLX affine quantization of a whole model: every projection of a [`Dense`] model (and an
/// untied head) to [`Affine`], the embedding and norms as they are. Provided for every module
/// that converts from [`Dense`] to [`Affine`], which `#[derive(Module)]` makes of each model.
pub trait Quantize: MapWeights<Dense, Affine> {
    /// This model with every projection quantized to MLX affine `bits`-bit values in groups of
    /// `group_size` (as `mlx.nn.quantize` does). A decoded token then reads about `bits / 32`
    /// of the f32 weight bytes.
    ///
    /// # Errors
    /// As [`QuantizedLinear::from_linear`]: an unsupported width or group, or a width not a
    /// multiple of the group.
    fn quantize(&self, bits: u32, group_size: usize) -> Result<Self::Mapped> {
        self.map_weights_at("", &|_, linear| QuantizedLinear::from_linear(linear, bits, group_size))
    }
}

impl<M: MapWeights<Dense, Affine> + ?Sized> Quantize for M {}
