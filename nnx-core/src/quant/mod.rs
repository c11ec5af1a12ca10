//! Quantized weight encodings: MLX affine quantization (2 to 8 bits per value with a scale and
//! a bias per group) and the SeedLM encodings SEED4 and SEED4P4 (blocks of 8 values rebuilt
//! from a 16-bit generator seed and a few 4-bit coefficients), with the layers that compute
//! directly on them: [`QuantizedLinear`] and [`SeedLinear`].
//!
//! ```
//! use nnx_core::Tensor;
//! use nnx_core::quant::{AffineSpec, AffineWeight};
//!
//! let values: Vec<f32> = (0..128).map(|i| (i as f32 - 64.0) / 100.0).collect();
//! let weight = Tensor::from_vec(values.clone(), &[2, 64])?;
//! let quantized = AffineWeight::quantize(&weight, AffineSpec::new(8, 64)?)?;
//! let restored = quantized.dequantize()?.to_vec::<f32>()?;
//! assert!(restored.iter().zip(&values).all(|(a, b)| (a - b).abs() < 0.003));
//! # Ok::<(), nnx_core::Error>(())
//! ```

mod affine;
#[cfg(feature = "kernels")]
mod gemv;
pub mod ggml;
#[cfg(feature = "kernels")]
pub(crate) mod linear;
#[cfg(feature = "kernels")]
mod matmul;
mod seed;

pub use affine::{AFFINE_BITS, AFFINE_GROUP_SIZES, AffineSpec, AffineWeight};
#[cfg(feature = "kernels")]
pub use linear::{QuantizedLinear, SeedLinear};
#[cfg(feature = "gpu")]
pub(crate) use linear::{check_input, check_one_slice, check_slice};
pub use seed::{
    BLOCK, EncodeOptions, R32, SeedEncoding, SeedWeight, lfsr_states, lfsr_step, pack_seed_codes, seed_exp_bias,
};

use crate::error::Result;
use crate::{DType, Device, Element, Tensor};

/// Runs `read` over the elements of `tensor` as a slice of `T`, copying only when the tensor
/// is a strided view.
fn with_slice<T: Element, R>(tensor: &Tensor, read: impl FnOnce(&[T]) -> R) -> Result<R> {
    let contiguous = tensor.contiguous();
    let slice = contiguous.as_slice::<T>()?.expect("a contiguous tensor borrows its elements");
    Ok(read(slice))
}

/// Checks that a stream has the dtype and shape the other streams call for (on any device: only
/// its dtype and shape are read).
pub(crate) fn check_stream<D: Device>(
    stream: &'static str,
    tensor: &Tensor<D>,
    dtype: DType,
    shape: &[usize],
) -> Result<()> {
    if tensor.dtype() != dtype || tensor.shape() != shape {
        return Err(crate::Error::QuantStream {
            stream,
            expected_dtype: dtype,
            expected_shape: shape.to_vec(),
            found_dtype: tensor.dtype(),
            found_shape: tensor.shape().to_vec(),
        });
    }
    Ok(())
}

/// Rounds an f32 to the nearest bfloat16, ties to even, and widens it back (NaN stays NaN).
#[inline(always)]
fn round_bf16(value: f32) -> f32 {
    let bits = value.to_bits();
    let rounded = bits.wrapping_add(0x7fff + ((bits >> 16) & 1)) & 0xffff_0000;
    let nan = (bits & 0xffff_0000) | 0x0040_0000;
    f32::from_bits(if value.is_nan() { nan } else { rounded })
}

/// How a value computed in f32 is rounded to the storage dtype of scales and biases.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Rounding {
    /// Kept as is.
    F32,
    /// To bfloat16, nearest-even.
    BF16,
    /// To IEEE half, nearest-even.
    F16,
}

impl Rounding {
    fn of(dtype: DType) -> Rounding {
        match dtype {
            DType::BF16 => Rounding::BF16,
            DType::F16 => Rounding::F16,
            _ => Rounding::F32,
        }
    }

    #[inline(always)]
    fn apply(self, value: f32) -> f32 {
        match self {
            Rounding::F32 => value,
            Rounding::BF16 => round_bf16(value),
            Rounding::F16 => half::f16::from_f32(value).to_f32(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_rounding_is_nearest_even() {
        let ties = [f32::from_bits(0x3f80_8000), f32::from_bits(0x3f81_8000), f32::from_bits(0xbf80_c000)];
        for value in [1.0f32, -3.3e-5, 65504.0, f32::INFINITY, 1e-40].into_iter().chain(ties) {
            assert_eq!(round_bf16(value), half::bf16::from_f32(value).to_f32(), "{value}");
        }
        assert!(round_bf16(f32::NAN).is_nan());
    }
}
