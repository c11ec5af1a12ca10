//! Linear layers over quantized weights: [`QuantizedLinear`] (MLX affine, the layout of mlx-lm
//! checkpoints) and [`SeedLinear`] (SEED4 / SEED4P4). Their `forward` decodes the weight a tile
//! of rows at a time inside the matrix product.
//!
//! Both are generic over the device like [`Linear`]: `place` moves the streams as they are
//! (packed words stay U32, U16 and U8), and the GPU versions decode inside their kernels (see
//! `nnx_core::gpu`).

use super::affine::{AffineSpec, AffineWeight};
use super::check_stream;
use super::matmul::fused_matmul;
use super::seed::{SeedEncoding, SeedWeight};
use crate::error::{Error, Result};
use crate::module::{FieldInfo, ImportRule, Module, PathStep, Place, Placer, Visitor, VisitorMut};
use crate::nn::Linear;
use crate::{DType, Device, Host, Tensor};

pub(crate) const fn field(name: &'static str) -> FieldInfo {
    FieldInfo { ident: name, segment: name, rule: ImportRule::NONE }
}

const WEIGHT: FieldInfo = field("weight");
const SCALES: FieldInfo = field("scales");
const BIASES: FieldInfo = field("biases");
const BIAS: FieldInfo = field("bias");
const SEEDS: FieldInfo = field("seeds");
const NIBBLES: FieldInfo = field("nibbles");
const COEFS: FieldInfo = field("coefs");
const EXP_BIAS: FieldInfo = field("exp_bias");
const CODES: FieldInfo = field("codes");

pub(crate) fn visit<D: Device>(visitor: &mut dyn Visitor<D>, field: &'static FieldInfo, tensor: &Tensor<D>) {
    visitor.enter(PathStep::Field(field));
    visitor.tensor(tensor);
    visitor.leave();
}

pub(crate) fn visit_mut<D: Device>(visitor: &mut dyn VisitorMut<D>, field: &'static FieldInfo, tensor: &mut Tensor<D>) {
    visitor.enter(PathStep::Field(field));
    visitor.tensor(tensor);
    visitor.leave();
}

/// Checks an input `[.., features]` of a float dtype, on any device.
pub(crate) fn check_input<D: Device>(
    op: &'static str,
    x: &Tensor<D>,
    features: usize,
    weight_shape: &[usize],
) -> Result<()> {
    if !x.dtype().is_castable_float() {
        return Err(Error::NotFloat { op, dtype: x.dtype() });
    }
    if x.shape().last() != Some(&features) {
        return Err(Error::ShapeMismatch {
            op,
            lhs: x.shape().to_vec(),
            rhs: weight_shape.to_vec(),
            reason: "the last axis of the input must be the layer's input width",
        });
    }
    Ok(())
}

/// Checks that `slice` is one of the `slices` of a weight of logical shape `shape`.
pub(crate) fn check_slice(slice: usize, shape: [usize; 3]) -> Result<()> {
    if slice >= shape[0] {
        return Err(Error::NarrowOutOfRange { axis: 0, start: slice, len: 1, size: shape[0], shape: shape.to_vec() });
    }
    Ok(())
}

/// Checks that a weight has one slice, for `forward`.
pub(crate) fn check_one_slice(shape: [usize; 3]) -> Result<()> {
    if shape[0] != 1 {
        return Err(Error::BadShape {
            op: "SeedLinear::forward",
            expected: "[1, out, in] (pick an expert with `forward_slice`)",
            shape: shape.to_vec(),
        });
    }
    Ok(())
}

/// The input as f32 `[rows, features]`, checking its last axis.
pub(crate) fn input(
    op: &'static str,
    x: &Tensor,
    features: usize,
    weight_shape: &[usize],
) -> Result<(Vec<f32>, usize)> {
    check_input(op, x, features, weight_shape)?;
    let values = x.to_f32_vec()?;
    let rows = values.len() / features.max(1);
    Ok((values, rows))
}

/// Adds the bias to every row and builds the `[.., out]` output.
pub(crate) fn output(x: &Tensor, mut values: Vec<f32>, bias: Option<&Tensor>, out_features: usize) -> Result<Tensor> {
    if let Some(bias) = bias {
        let bias = bias.to_f32_vec()?;
        for row in values.chunks_exact_mut(out_features) {
            for (value, b) in row.iter_mut().zip(&bias) {
                *value += b;
            }
        }
    }
    let mut shape = x.shape().to_vec();
    *shape.last_mut().expect("the input has a last axis") = out_features;
    Tensor::from_vec(values, &shape)
}

/// A linear layer with an MLX affine-quantized weight, named as mlx-lm names it: `weight` (U32
/// `[out, in * bits / 32]`), `scales` and `biases` (`[out, in / group_size]`) and an optional
/// `bias` (`[out]`).
///
/// Built on the host; [`QuantizedLinear::place`] moves it to a device with its weight still
/// packed, where `forward` decodes it inside the product.
#[derive(Clone, Debug)]
pub struct QuantizedLinear<D: Device = Host> {
    /// The packed values.
    pub weight: Tensor<D>,
    /// One scale per group.
    pub scales: Tensor<D>,
    /// One bias per group (of the quantization, not the layer's `bias`).
    pub biases: Tensor<D>,
    /// The layer's bias, added after the product.
    pub bias: Option<Tensor<D>>,
    /// Bits and group size.
    pub spec: AffineSpec,
}

impl<D: Device> QuantizedLinear<D> {
    /// A layer from a quantized rank-2 weight and an optional bias.
    ///
    /// # Errors
    /// [`Error::BadShape`] for a weight that is not rank 2; [`Error::QuantStream`] for a bias
    /// that is not `[out]`.
    pub fn new(weight: AffineWeight<D>, bias: Option<Tensor<D>>) -> Result<QuantizedLinear<D>> {
        let shape = weight.shape();
        if shape.len() != 2 {
            return Err(Error::BadShape { op: "QuantizedLinear", expected: "[out, in]", shape });
        }
        if let Some(bias) = &bias {
            check_stream("bias", bias, bias.dtype(), &shape[..1])?;
        }
        let spec = weight.spec();
        Ok(QuantizedLinear { weight: weight.weight, scales: weight.scales, biases: weight.biases, bias, spec })
    }

    /// The weight's streams, checked against each other.
    ///
    /// # Errors
    /// [`Error::QuantStream`] when the fields were replaced by tensors that do not fit.
    pub fn affine(&self) -> Result<AffineWeight<D>> {
        AffineWeight::new(self.weight.clone(), self.scales.clone(), self.biases.clone(), self.spec)
    }

    /// The input width.
    pub fn in_features(&self) -> usize {
        self.scales.shape().get(1).map_or(0, |groups| groups * self.spec.group_size)
    }

    /// The output width.
    pub fn out_features(&self) -> usize {
        self.scales.shape().first().copied().unwrap_or(0)
    }
}

impl QuantizedLinear {
    /// A layer of meta tensors with the shapes of a quantized `[out_features, in_features]`
    /// weight, scales and biases of `dtype`: the target of a load from a checkpoint.
    ///
    /// # Errors
    /// [`Error::QuantColumns`] when `in_features` is not a multiple of the group size.
    pub fn meta(
        in_features: usize,
        out_features: usize,
        bias: bool,
        spec: AffineSpec,
        dtype: DType,
    ) -> Result<QuantizedLinear> {
        if in_features == 0 || !in_features.is_multiple_of(spec.group_size) {
            return Err(Error::QuantColumns { shape: vec![out_features, in_features], multiple: spec.group_size });
        }
        let groups = [out_features, in_features / spec.group_size];
        Ok(QuantizedLinear {
            weight: Tensor::meta(DType::U32, &[out_features, spec.packed_columns(in_features)]),
            scales: Tensor::meta(dtype, &groups),
            biases: Tensor::meta(dtype, &groups),
            bias: bias.then(|| Tensor::meta(dtype, &[out_features])),
            spec,
        })
    }

    /// Quantizes a [`Linear`] layer's weight (the bias is kept as is).
    ///
    /// # Errors
    /// [`Error::QuantSpec`], [`Error::QuantColumns`], [`Error::NotFloat`].
    pub fn from_linear(linear: &Linear, bits: u32, group_size: usize) -> Result<QuantizedLinear> {
        let weight = AffineWeight::quantize(&linear.weight, AffineSpec::new(bits, group_size)?)?;
        QuantizedLinear::new(weight, linear.bias.clone())
    }

    /// This layer on the device `to`, each stream as it is (the packed words stay U32); a
    /// meta layer gives a meta layer there.
    ///
    /// # Errors
    /// The device's error when a stream cannot be moved.
    pub fn place<To: Device>(&self, to: &To) -> Result<QuantizedLinear<To>> {
        self.place_with(&mut Placer::new(to))
    }

    /// A float [`Linear`] with the dequantized weight (MLX's values) cast to `dtype`, and the
    /// bias cast to `dtype`.
    ///
    /// # Errors
    /// As [`QuantizedLinear::affine`]; [`Error::NotCastable`] for a non-float `dtype`.
    pub fn to_linear(&self, dtype: DType) -> Result<Linear> {
        let weight = self.affine()?.dequantize()?.to_dtype(dtype)?;
        let bias = self.bias.as_ref().map(|bias| bias.to_dtype(dtype)).transpose()?;
        Ok(Linear { weight, bias })
    }

    /// `y = x W^T + b` for `x` `[.., in]` of any float dtype, giving f32 `[.., out]`. The weight
    /// is dequantized (to MLX's values) a tile of rows at a time inside the product; the full
    /// float weight is never built.
    ///
    /// # Errors
    /// [`Error::ShapeMismatch`] when the last axis of `x` is not the input width,
    /// [`Error::NotFloat`] for a non-float input, [`Error::QuantStream`], [`Error::Meta`].
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let affine = self.affine()?;
        let (k, n) = (self.in_features(), self.out_features());
        let (values, m) = input("QuantizedLinear::forward", x, k, &[n, k])?;
        let decoder = affine.decoder()?;
        // One row (a token being decoded) multiplies the packed values directly.
        let y = match (m, n) {
            (1, 1..) => decoder.gemv(&values),
            _ => None,
        };
        let y =
            y.unwrap_or_else(|| fused_matmul(&values, m, k, n, |first, count, out| decoder.rows(first, count, out)));
        output(x, y, self.bias.as_ref(), n)
    }
}

#[cfg(feature = "gpu")]
impl QuantizedLinear<crate::gpu::Gpu> {
    /// A float [`Linear`] on the device with the dequantized weight (MLX's values) and the bias,
    /// both cast to `dtype`.
    ///
    /// # Errors
    /// As `QuantizedLinear<Gpu>::dequantize`;
    /// [`Error::NotCastable`](crate::Error::NotCastable) for a non-float `dtype`.
    pub fn to_linear(&self, dtype: DType) -> Result<Linear<crate::gpu::Gpu>> {
        let weight = self.dequantize()?.to_dtype(dtype)?;
        let bias = self.bias.as_ref().map(|bias| bias.to_dtype(dtype)).transpose()?;
        Ok(Linear { weight, bias })
    }
}

#[diagnostic::do_not_recommend]
impl<D: Device> Module<D> for QuantizedLinear<D> {
    fn walk(&self, visitor: &mut dyn Visitor<D>) {
        visit(visitor, &WEIGHT, &self.weight);
        visit(visitor, &SCALES, &self.scales);
        visit(visitor, &BIASES, &self.biases);
        if let Some(bias) = &self.bias {
            visit(visitor, &BIAS, bias);
        }
    }

    fn walk_mut(&mut self, visitor: &mut dyn VisitorMut<D>) {
        visit_mut(visitor, &WEIGHT, &mut self.weight);
        visit_mut(visitor, &SCALES, &mut self.scales);
        visit_mut(visitor, &BIASES, &mut self.biases);
        if let Some(bias) = &mut self.bias {
            visit_mut(visitor, &BIAS, bias);
        }
    }
}

impl<To: Device> Place<To> for QuantizedLinear {
    type Placed = QuantizedLinear<To>;

    fn place_with(&self, placer: &mut Placer<'_, To>) -> Result<QuantizedLinear<To>> {
        Ok(QuantizedLinear {
            weight: placer.tensor(&self.weight)?,
            scales: placer.tensor(&self.scales)?,
            biases: placer.tensor(&self.biases)?,
            bias: self.bias.as_ref().map(|bias| placer.tensor(bias)).transpose()?,
            spec: self.spec,
        })
    }
}

/// A linear layer with a SEED4 or SEED4P4 weight, named as NanoSeedLM names it: `seeds`,
/// `nibbles` or `coefs`, `exp_bias`, `codes` (SEED4P4) and an optional `bias`. The weight is
/// `[slices, out, in]`; a dense layer has one slice, and the slices of a mixture-of-experts
/// layer are its experts.
///
/// Built on the host; [`SeedLinear::place`] moves it to a device with its streams still packed,
/// where `forward` and `forward_slice` decode the blocks inside the product.
#[derive(Clone, Debug)]
pub struct SeedLinear<D: Device = Host> {
    /// The weight's streams.
    pub weight: SeedWeight<D>,
    /// The layer's bias, added after the product.
    pub bias: Option<Tensor<D>>,
}

impl<D: Device> SeedLinear<D> {
    /// A layer from an encoded weight and an optional bias `[out]`.
    ///
    /// # Errors
    /// [`Error::QuantStream`] for a bias of another shape.
    pub fn new(weight: SeedWeight<D>, bias: Option<Tensor<D>>) -> Result<SeedLinear<D>> {
        if let Some(bias) = &bias {
            check_stream("bias", bias, bias.dtype(), &weight.shape()[1..2])?;
        }
        Ok(SeedLinear { weight, bias })
    }

    /// The input width.
    pub fn in_features(&self) -> usize {
        self.weight.shape()[2]
    }

    /// The output width.
    pub fn out_features(&self) -> usize {
        self.weight.shape()[1]
    }
}

impl SeedLinear {
    /// This layer on the device `to`, each stream as it is (U16, I32 and U8); a meta layer
    /// gives a meta layer there.
    ///
    /// # Errors
    /// The device's error when a stream cannot be moved.
    pub fn place<To: Device>(&self, to: &To) -> Result<SeedLinear<To>> {
        self.place_with(&mut Placer::new(to))
    }

    /// Encodes a [`Linear`] layer's weight with the exhaustive seed search (slow: 65535 seeds
    /// per block of 8 values, on all cores).
    ///
    /// # Errors
    /// As [`SeedWeight::encode`].
    pub fn from_linear(linear: &Linear, encoding: SeedEncoding) -> Result<SeedLinear> {
        let weight = SeedWeight::encode(&linear.weight, encoding, &Default::default())?;
        SeedLinear::new(weight, linear.bias.clone())
    }

    /// `y = x W^T + b` for a one-slice weight; see [`SeedLinear::forward_slice`].
    ///
    /// # Errors
    /// [`Error::BadShape`] when the weight has more than one slice, and as
    /// [`SeedLinear::forward_slice`].
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        check_one_slice(self.weight.shape())?;
        self.forward_slice(x, 0)
    }

    /// `y = x W_s^T + b` with slice (expert) `slice` of the weight, for `x` `[.., in]` of any
    /// float dtype, giving f32 `[.., out]`. Blocks are decoded a tile of rows at a time inside
    /// the product.
    ///
    /// # Errors
    /// [`Error::ShapeMismatch`] for another input width, [`Error::NarrowOutOfRange`] for a
    /// slice past the last, [`Error::NotFloat`], [`Error::Meta`].
    pub fn forward_slice(&self, x: &Tensor, slice: usize) -> Result<Tensor> {
        let shape = self.weight.shape();
        check_slice(slice, shape)?;
        let (k, n) = (shape[2], shape[1]);
        let (values, m) = input("SeedLinear::forward", x, k, &[n, k])?;
        // One row (a token being decoded) decodes each block in registers.
        let y = match m {
            1 => self.weight.gemv(slice, &values)?,
            _ => None,
        };
        let y = match y {
            Some(y) => y,
            None => {
                let decoder = self.weight.decoder()?;
                debug_assert_eq!(decoder.columns(), k);
                fused_matmul(&values, m, k, n, |first, count, out| decoder.rows(slice * n + first, count, out))
            }
        };
        output(x, y, self.bias.as_ref(), n)
    }
}

#[diagnostic::do_not_recommend]
impl<D: Device> Module<D> for SeedLinear<D> {
    fn walk(&self, visitor: &mut dyn Visitor<D>) {
        visit(visitor, &SEEDS, &self.weight.seeds);
        let coefficients = if self.weight.encoding == SeedEncoding::Seed4 { &NIBBLES } else { &COEFS };
        visit(visitor, coefficients, &self.weight.coefficients);
        visit(visitor, &EXP_BIAS, &self.weight.exp_bias);
        if let Some(codes) = &self.weight.codes {
            visit(visitor, &CODES, codes);
        }
        if let Some(bias) = &self.bias {
            visit(visitor, &BIAS, bias);
        }
    }

    fn walk_mut(&mut self, visitor: &mut dyn VisitorMut<D>) {
        visit_mut(visitor, &SEEDS, &mut self.weight.seeds);
        let coefficients = if self.weight.encoding == SeedEncoding::Seed4 { &NIBBLES } else { &COEFS };
        visit_mut(visitor, coefficients, &mut self.weight.coefficients);
        visit_mut(visitor, &EXP_BIAS, &mut self.weight.exp_bias);
        if let Some(codes) = &mut self.weight.codes {
            visit_mut(visitor, &CODES, codes);
        }
        if let Some(bias) = &mut self.bias {
            visit_mut(visitor, &BIAS, bias);
        }
    }
}

impl<To: Device> Place<To> for SeedLinear {
    type Placed = SeedLinear<To>;

    fn place_with(&self, placer: &mut Placer<'_, To>) -> Result<SeedLinear<To>> {
        Ok(SeedLinear {
            weight: self.weight.place_with(placer)?,
            bias: self.bias.as_ref().map(|bias| placer.tensor(bias)).transpose()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nn::Init;

    #[test]
    fn forward_matches_the_dequantized_layer() {
        let linear = Linear::builder(128, 24).init(Init::Seeded(3)).build();
        let layer = QuantizedLinear::from_linear(&linear, 4, 64).unwrap();
        let dense = layer.to_linear(DType::F32).unwrap();
        let x = Tensor::from_vec((0..3 * 128).map(|i| ((i % 17) as f32 - 8.0) / 8.0).collect(), &[3, 128]).unwrap();
        let y = layer.forward(&x).unwrap();
        assert_eq!(y.shape(), &[3, 24]);
        let w = dense.weight.to_vec::<f32>().unwrap();
        let b = dense.bias.unwrap().to_vec::<f32>().unwrap();
        let xs = x.to_vec::<f32>().unwrap();
        for (at, &value) in y.to_vec::<f32>().unwrap().iter().enumerate() {
            let (row, col) = (at / 24, at % 24);
            let expected: f32 = (0..128).map(|i| xs[row * 128 + i] * w[col * 128 + i]).sum::<f32>() + b[col];
            assert!((value - expected).abs() < 1e-4, "{value} vs {expected}");
        }
        let keys: Vec<String> = layer.flat_state_dict().keys().map(str::to_string).collect();
        assert_eq!(keys, ["weight", "scales", "biases", "bias"]);
    }

    #[test]
    fn wrong_input_width_is_an_error() {
        let layer =
            QuantizedLinear::from_linear(&Linear::builder(64, 4).bias(false).init(Init::Seeded(1)).build(), 8, 64)
                .unwrap();
        let x = Tensor::zeros(DType::F32, &[2, 32]);
        assert!(matches!(layer.forward(&x), Err(Error::ShapeMismatch { .. })));
    }
}
