//! [`GgmlLinear`]: a linear layer whose weight stays in ggml blocks, as GGUF files store it,
//! and whose products read the blocks directly.

use super::{GgmlType, dequantize_row, matmul, quantize_row};
use crate::error::{Error, Result};
use crate::module::{FieldInfo, Module, Place, Placer, Visitor, VisitorMut};
use crate::nn::Linear;
use crate::quant::linear::{field, input, output, visit, visit_mut};
use crate::{DType, Device, Host, Tensor};

const WEIGHT: FieldInfo = field("weight");
const BIAS: FieldInfo = field("bias");

/// A linear layer with a weight of a ggml type: `weight` holds the blocks of `out` rows of `in`
/// values as U8 `[out, row_bytes]` (one row of blocks per output feature, the layout of a GGUF
/// tensor `[out, in]`), and `bias` is an optional float `[out]`.
///
/// `forward` never writes the float weight: one-row inputs (decoding) and batches (prefill)
/// read the packed blocks inside the product. [`GgmlLinear::place`] moves the blocks to a
/// device as they are.
#[derive(Clone, Debug)]
pub struct GgmlLinear<D: Device = Host> {
    /// The packed blocks, U8 `[out, row_bytes]`.
    pub weight: Tensor<D>,
    /// The layer's bias, added after the product.
    pub bias: Option<Tensor<D>>,
    /// The ggml type of the blocks.
    pub ty: GgmlType,
    /// Values per row (the input width).
    pub in_features: usize,
}

impl<D: Device> GgmlLinear<D> {
    /// A layer from the packed rows of a `[out, in]` weight of type `ty`.
    ///
    /// # Errors
    /// [`Error::GgmlRow`] when `weight` is not U8 `[out, row_bytes]` for `in_features` values of
    /// `ty`; [`Error::ShapeMismatch`] for a bias that is not `[out]`.
    pub fn new(weight: Tensor<D>, bias: Option<Tensor<D>>, ty: GgmlType, in_features: usize) -> Result<GgmlLinear<D>> {
        let row_bytes = ty.row_bytes(in_features);
        let fits = weight.dtype() == DType::U8 && weight.rank() == 2 && Some(weight.shape()[1]) == row_bytes;
        if !fits {
            return Err(Error::GgmlRow {
                op: "GgmlLinear::new",
                ty: ty.name(),
                block_size: ty.block_size(),
                values: in_features,
                bytes: weight.shape().get(1).copied().unwrap_or(0),
            });
        }
        let out = weight.shape()[0];
        if let Some(bias) = &bias
            && bias.shape() != [out]
        {
            return Err(Error::ShapeMismatch {
                op: "GgmlLinear::new",
                lhs: bias.shape().to_vec(),
                rhs: vec![out],
                reason: "the bias must have one value per output feature",
            });
        }
        Ok(GgmlLinear { weight, bias, ty, in_features })
    }

    /// The output width.
    pub fn out_features(&self) -> usize {
        self.weight.shape()[0]
    }
}

impl GgmlLinear {
    /// Packs the weight of `linear` as `ty` (ggml's reference quantizer), keeping its bias.
    ///
    /// # Errors
    /// [`Error::GgmlRow`] when the input width does not hold whole blocks of `ty`;
    /// [`Error::GgmlUnsupported`] for a type nnx does not quantize to.
    pub fn from_linear(linear: &Linear, ty: GgmlType) -> Result<GgmlLinear> {
        let [out, features] = linear.weight.shape() else {
            return Err(Error::BadShape {
                op: "GgmlLinear::from_linear",
                expected: "a rank-2 weight [out, in]",
                shape: linear.weight.shape().to_vec(),
            });
        };
        let (out, features) = (*out, *features);
        let values = linear.weight.to_f32_vec()?;
        let row_bytes = ty.row_bytes(features).ok_or(Error::GgmlRow {
            op: "GgmlLinear::from_linear",
            ty: ty.name(),
            block_size: ty.block_size(),
            values: features,
            bytes: 0,
        })?;
        let mut packed = vec![0u8; out * row_bytes];
        if !values.is_empty() {
            quantize_row(ty, &values, &mut packed)?;
        }
        GgmlLinear::new(Tensor::from_vec(packed, &[out, row_bytes])?, linear.bias.clone(), ty, features)
    }

    /// The weight decoded to f32 `[out, in]`, bit-exact with ggml.
    ///
    /// # Errors
    /// [`Error::GgmlUnsupported`] for a type without a decoder.
    pub fn dequantize(&self) -> Result<Tensor> {
        let bytes = self.weight.to_bytes()?;
        let mut values = vec![0f32; self.out_features() * self.in_features];
        dequantize_row(self.ty, &bytes, &mut values)?;
        Tensor::from_vec(values, &[self.out_features(), self.in_features])
    }

    /// A float [`Linear`] with the decoded weight cast to `dtype`, and the bias cast to `dtype`.
    ///
    /// # Errors
    /// As [`GgmlLinear::dequantize`]; [`Error::NotCastable`] for a non-float `dtype`.
    pub fn to_linear(&self, dtype: DType) -> Result<Linear> {
        let weight = self.dequantize()?.to_dtype(dtype)?;
        let bias = self.bias.as_ref().map(|bias| bias.to_dtype(dtype)).transpose()?;
        Ok(Linear { weight, bias })
    }

    /// `y = x W^T + b` for `x` `[.., in]` of any float dtype, giving f32 `[.., out]`, reading
    /// the blocks inside the product (see [`matmul`] for its tolerance).
    ///
    /// # Errors
    /// [`Error::ShapeMismatch`] when the last axis of `x` is not the input width,
    /// [`Error::NotFloat`] for a non-float input, [`Error::Meta`] for a meta weight.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let (k, n) = (self.in_features, self.out_features());
        let (values, m) = input("GgmlLinear::forward", x, k, &[n, k])?;
        let weight = self.weight.contiguous();
        let bytes = weight.as_slice::<u8>()?.ok_or(Error::Meta { op: "GgmlLinear::forward" })?;
        let mut y = vec![0f32; m * n];
        if m > 0 && n > 0 {
            matmul(self.ty, bytes, n, k, &values, m, &mut y)?;
        }
        output(x, y, self.bias.as_ref(), n)
    }

    /// [`GgmlLinear::forward`] of several layers on one input (a layer's q, k and v): for one
    /// row of input (decoding a token) the row is rounded once and all the layers' rows share
    /// one parallel pass (see [`matvec_many`](super::matvec_many)); otherwise each layer runs
    /// alone. The outputs equal each layer's `forward`.
    ///
    /// # Errors
    /// As [`GgmlLinear::forward`], for the first layer that fails.
    pub fn forward_many(layers: &[&GgmlLinear], x: &Tensor) -> Result<Vec<Tensor>> {
        let Some(first) = layers.first() else { return Ok(Vec::new()) };
        let k = first.in_features;
        let one_row = x.shape().last() == Some(&k) && x.shape().iter().product::<usize>() == k;
        if !one_row || layers.iter().any(|layer| layer.in_features != k || layer.weight.is_meta()) {
            return layers.iter().map(|layer| layer.forward(x)).collect();
        }
        let (values, _) = input("GgmlLinear::forward_many", x, k, &[first.out_features(), k])?;
        let weights: Vec<Tensor> = layers.iter().map(|layer| layer.weight.contiguous()).collect();
        let mut products = Vec::with_capacity(layers.len());
        for (layer, weight) in layers.iter().zip(&weights) {
            let bytes = weight.as_slice::<u8>()?.ok_or(Error::Meta { op: "GgmlLinear::forward_many" })?;
            products.push((layer.ty, bytes, layer.out_features()));
        }
        let mut ys: Vec<Vec<f32>> = layers.iter().map(|layer| vec![0f32; layer.out_features()]).collect();
        let mut outputs: Vec<&mut [f32]> = ys.iter_mut().map(Vec::as_mut_slice).collect();
        super::matvec_many(&products, k, &values, &mut outputs)?;
        layers.iter().zip(ys).map(|(layer, y)| output(x, y, layer.bias.as_ref(), layer.out_features())).collect()
    }

    /// This layer on the device `to`, its blocks as they are.
    ///
    /// # Errors
    /// The device's error when a tensor cannot be moved.
    pub fn place<To: Device>(&self, to: &To) -> Result<GgmlLinear<To>> {
        self.place_with(&mut Placer::new(to))
    }
}

#[diagnostic::do_not_recommend]
impl<D: Device> Module<D> for GgmlLinear<D> {
    fn walk(&self, visitor: &mut dyn Visitor<D>) {
        visit(visitor, &WEIGHT, &self.weight);
        if let Some(bias) = &self.bias {
            visit(visitor, &BIAS, bias);
        }
    }

    fn walk_mut(&mut self, visitor: &mut dyn VisitorMut<D>) {
        visit_mut(visitor, &WEIGHT, &mut self.weight);
        if let Some(bias) = &mut self.bias {
            visit_mut(visitor, &BIAS, bias);
        }
    }
}

impl<To: Device> Place<To> for GgmlLinear {
    type Placed = GgmlLinear<To>;

    fn place_with(&self, placer: &mut Placer<'_, To>) -> Result<GgmlLinear<To>> {
        Ok(GgmlLinear {
            weight: placer.tensor(&self.weight)?,
            bias: self.bias.as_ref().map(|bias| placer.tensor(bias)).transpose()?,
            ty: self.ty,
            in_features: self.in_features,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nn::Init;

    #[test]
    fn a_packed_layer_computes_what_its_decoded_weight_computes() {
        let linear = Linear::builder(256, 24).bias(true).init(Init::Seeded(3)).build();
        let x =
            Tensor::from_vec((0..3 * 256).map(|i| ((i * 7 % 19) as f32 - 9.0) / 10.0).collect::<Vec<_>>(), &[3, 256])
                .unwrap();
        for ty in [GgmlType::Q4_0, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::IQ4_NL] {
            let layer = GgmlLinear::from_linear(&linear, ty).unwrap();
            let dense = layer.to_linear(DType::F32).unwrap();
            let expected = dense.forward(&x).unwrap().to_vec::<f32>().unwrap();
            let found = layer.forward(&x).unwrap().to_vec::<f32>().unwrap();
            let scale = expected.iter().fold(0f32, |m, v| m.max(v.abs()));
            for (e, f) in expected.iter().zip(&found) {
                assert!((e - f).abs() <= 0.02 * scale.max(1.0), "{ty}: {e} vs {f}");
            }
            let names: Vec<String> = layer.flat_state_dict().iter().map(|(name, _)| name.to_string()).collect();
            assert_eq!(names, ["weight", "bias"]);
        }
        assert!(matches!(
            GgmlLinear::from_linear(&Linear::builder(100, 2).build(), GgmlType::Q4_K),
            Err(Error::GgmlRow { .. })
        ));
    }
}
