//! [`Compute`]: the kernels every device runs, as one trait, so that a model's forward pass is
//! written once, generic over `T: Compute`, and runs on the host or (with the `gpu` feature)
//! on the GPU.

use crate::error::Result;
use crate::{DType, Host, Tensor};

/// The operations of a forward pass, implemented by `Tensor` (the host, with the CPU kernels)
/// and `Tensor<Gpu>` (the WGSL kernels).
///
/// Write model code once against `T: Compute`: the same function runs on either device and a
/// host/GPU mix does not compile. Each method has the meaning, the checks and the errors of the
/// host method of the same name (see [`Tensor`]): kernels return contiguous f32 tensors on the
/// operands' device, layout methods return views. Host slices (`ids`, `positions`, masks) stay
/// slices on every device.
///
/// # Examples
/// ```
/// use nnx_core::{Compute, Result, Tensor};
///
/// /// A two-layer perceptron, for any device.
/// fn mlp<T: Compute>(x: &T, hidden: &T, output: &T) -> Result<T> {
///     x.linear(hidden, None)?.gelu()?.linear(output, None)
/// }
///
/// let x = Tensor::from_vec(vec![1.0f32, -1.0], &[1, 2])?;
/// let hidden = Tensor::from_vec(vec![1.0f32, 0.0, 0.0, 1.0], &[2, 2])?;
/// let output = Tensor::from_vec(vec![1.0f32, 1.0], &[1, 2])?;
/// let y = mlp(&x, &hidden, &output)?;
/// assert_eq!(y.shape(), [1, 1]);
/// assert!((y.to_f32_vec()?[0] - 0.6827).abs() < 1e-4);
/// # Ok::<(), nnx_core::Error>(())
/// ```
pub trait Compute: Sized + Clone {
    /// The rows `ids` of an embedding table `[vocab, dim]` ([`Tensor::embedding`]).
    ///
    /// # Errors
    /// As [`Tensor::embedding`], and the device's errors.
    fn embedding(weight: &Self, ids: &[u32]) -> Result<Self>;

    /// Rotary position embedding of `[batch, heads, seq, head_dim]` ([`Tensor::rotary`]).
    ///
    /// # Errors
    /// As [`Tensor::rotary`], and the device's errors.
    fn rotary(&self, positions: &[usize], theta: f32) -> Result<Self>;

    /// Rotary position embedding whose frequency `i` (of `head_dim / 2`) is
    /// `theta^(-2i/head_dim) / factors[i]`: llama.cpp's `rope_freqs` tensor, Llama 3's rope
    /// scaling and linear scaling (every factor the same) ([`Tensor::rotary_scaled`]).
    ///
    /// # Errors
    /// As [`Tensor::rotary_scaled`], and the device's errors.
    fn rotary_scaled(&self, positions: &[usize], theta: f32, factors: &[f32]) -> Result<Self>;

    /// Scaled dot-product attention with grouped-query heads and causal and padding masks
    /// ([`Tensor::attention`]).
    ///
    /// # Errors
    /// As [`Tensor::attention`], and the device's errors.
    fn attention(q: &Self, k: &Self, v: &Self, causal: bool, key_mask: Option<&[bool]>) -> Result<Self>;

    /// Causal attention where a query also sees at most the `window` most recent keys, itself
    /// included: the local layers of Gemma 3 and Mistral ([`Tensor::attention_windowed`]).
    ///
    /// # Errors
    /// As [`Tensor::attention_windowed`], and the device's errors.
    fn attention_windowed(q: &Self, k: &Self, v: &Self, key_mask: Option<&[bool]>, window: usize) -> Result<Self>;

    /// Causal attention with one sink logit per query head, over at most `window` recent keys
    /// (`usize::MAX` for all): gpt-oss ([`Tensor::attention_sinks`]).
    ///
    /// # Errors
    /// As [`Tensor::attention_sinks`], and the device's errors.
    fn attention_sinks(
        q: &Self,
        k: &Self,
        v: &Self,
        key_mask: Option<&[bool]>,
        window: usize,
        sinks: &[f32],
    ) -> Result<Self>;

    /// `self + rhs` with numpy broadcasting ([`Tensor::add`]).
    ///
    /// # Errors
    /// As [`Tensor::add`], and the device's errors.
    fn add(&self, rhs: &Self) -> Result<Self>;

    /// `self - rhs` with numpy broadcasting.
    ///
    /// # Errors
    /// As [`Tensor::add`], and the device's errors.
    fn sub(&self, rhs: &Self) -> Result<Self>;

    /// `self * rhs` with numpy broadcasting.
    ///
    /// # Errors
    /// As [`Tensor::add`], and the device's errors.
    fn mul(&self, rhs: &Self) -> Result<Self>;

    /// `self / rhs` with numpy broadcasting.
    ///
    /// # Errors
    /// As [`Tensor::add`], and the device's errors.
    fn div(&self, rhs: &Self) -> Result<Self>;

    /// Every element times `factor`.
    ///
    /// # Errors
    /// As [`Tensor::scale`], and the device's errors.
    fn scale(&self, factor: f32) -> Result<Self>;

    /// Every element plus `value`.
    ///
    /// # Errors
    /// As [`Tensor::add_scalar`], and the device's errors.
    fn add_scalar(&self, value: f32) -> Result<Self>;

    /// GELU in its exact (erf) form.
    ///
    /// # Errors
    /// As [`Tensor::gelu`], and the device's errors.
    fn gelu(&self) -> Result<Self>;

    /// GELU's tanh approximation.
    ///
    /// # Errors
    /// As [`Tensor::gelu_tanh`], and the device's errors.
    fn gelu_tanh(&self) -> Result<Self>;

    /// SiLU, `x · sigmoid(x)`.
    ///
    /// # Errors
    /// As [`Tensor::silu`], and the device's errors.
    fn silu(&self) -> Result<Self>;

    /// `max(x, 0)`.
    ///
    /// # Errors
    /// As [`Tensor::relu`], and the device's errors.
    fn relu(&self) -> Result<Self>;

    /// The hyperbolic tangent.
    ///
    /// # Errors
    /// As [`Tensor::tanh`], and the device's errors.
    fn tanh(&self) -> Result<Self>;

    /// The batched, broadcasting matrix product ([`Tensor::matmul`]).
    ///
    /// # Errors
    /// As [`Tensor::matmul`], and the device's errors.
    fn matmul(&self, rhs: &Self) -> Result<Self>;

    /// `x · weightᵀ + bias` ([`Tensor::linear`]).
    ///
    /// # Errors
    /// As [`Tensor::linear`], and the device's errors.
    fn linear(&self, weight: &Self, bias: Option<&Self>) -> Result<Self>;

    /// The softmax along `axis`.
    ///
    /// # Errors
    /// As [`Tensor::softmax`], and the device's errors.
    fn softmax(&self, axis: usize) -> Result<Self>;

    /// The softmax along the last axis.
    ///
    /// # Errors
    /// As [`Tensor::softmax_last`], and the device's errors.
    fn softmax_last(&self) -> Result<Self>;

    /// Layer normalisation over the last axis ([`Tensor::layer_norm`]).
    ///
    /// # Errors
    /// As [`Tensor::layer_norm`], and the device's errors.
    fn layer_norm(&self, weight: Option<&Self>, bias: Option<&Self>, eps: f32) -> Result<Self>;

    /// RMS normalisation over the last axis ([`Tensor::rms_norm`]).
    ///
    /// # Errors
    /// As [`Tensor::rms_norm`], and the device's errors.
    fn rms_norm(&self, weight: Option<&Self>, eps: f32) -> Result<Self>;

    /// Each row of the last axis divided by its Euclidean norm.
    ///
    /// # Errors
    /// As [`Tensor::l2_normalize`], and the device's errors.
    fn l2_normalize(&self) -> Result<Self>;

    /// Mean pooling of `[batch, seq, dim]` over the positions `mask` keeps.
    ///
    /// # Errors
    /// As [`Tensor::mean_pool`], and the device's errors.
    fn mean_pool(&self, mask: &[bool]) -> Result<Self>;

    /// The same values in another float dtype.
    ///
    /// # Errors
    /// As [`Tensor::to_dtype`], and the device's errors.
    fn to_dtype(&self, dtype: DType) -> Result<Self>;

    /// The index of the largest value of each row of the last axis.
    ///
    /// # Errors
    /// As [`Tensor::argmax_last`], and the device's errors.
    fn argmax_last(&self) -> Result<Vec<usize>>;

    /// The values as f32, row-major, on the host.
    ///
    /// # Errors
    /// As [`Tensor::to_f32_vec`], and the device's errors.
    fn to_f32_vec(&self) -> Result<Vec<f32>>;

    /// The same elements in another shape: a view when contiguous, otherwise a copy first.
    ///
    /// # Errors
    /// As [`Tensor::reshape`], and the device's errors.
    fn reshape(&self, shape: &[usize]) -> Result<Self>;

    /// A view with the axes permuted.
    ///
    /// # Errors
    /// As [`Tensor::permute`].
    fn permute(&self, axes: &[usize]) -> Result<Self>;

    /// A view with axes `a` and `b` swapped.
    ///
    /// # Errors
    /// As [`Tensor::transpose`].
    fn transpose(&self, a: usize, b: usize) -> Result<Self>;

    /// A view of `len` indices of `axis` from `start`.
    ///
    /// # Errors
    /// As [`Tensor::narrow`].
    fn narrow(&self, axis: usize, start: usize, len: usize) -> Result<Self>;

    /// A tensor of f32 zeros of `shape` on this tensor's device ([`Tensor::new_zeros`]).
    ///
    /// # Errors
    /// As [`Tensor::new_zeros`], and the device's errors.
    fn new_zeros(&self, shape: &[usize]) -> Result<Self>;

    /// Writes `values` along `axis` from `start` into this f32 tensor, in place unless another
    /// tensor shares its storage (then into a copy) ([`Tensor::write_slice`]).
    ///
    /// # Errors
    /// As [`Tensor::write_slice`], and the device's errors.
    fn write_slice(&mut self, axis: usize, start: usize, values: &Self) -> Result<()>;

    /// This tensor if contiguous, otherwise a row-major copy on the same device.
    ///
    /// # Errors
    /// The device's errors (the host never fails).
    fn contiguous(&self) -> Result<Self>;

    /// The size of each axis.
    fn shape(&self) -> &[usize];

    /// The element type.
    fn dtype(&self) -> DType;

    /// A host tensor with the same elements (the tensor itself on the host).
    ///
    /// # Errors
    /// The device's errors when the transfer fails.
    fn to_host(&self) -> Result<Tensor>;

    /// `host`'s elements on this tensor's device (on the host, `host` itself): where a model
    /// computes a step on the host that the device has no kernel for.
    ///
    /// # Errors
    /// The device's errors when the transfer fails.
    fn upload_like(&self, host: &Tensor) -> Result<Self>;
}

/// The methods whose inherent versions have the trait's signatures on every device.
/// (`Self::name` resolves to the inherent method, which takes precedence over the trait's; the
/// `unconditional_recursion` lint would catch a missing one.) `embedding`, `attention` and
/// `attention_windowed` take no receiver and are inherent on the host only (one inherent
/// associated function per device would make the host's `Tensor::attention(..)` ambiguous), so
/// each device writes them.
macro_rules! delegate {
    () => {
        fn rotary(&self, positions: &[usize], theta: f32) -> Result<Self> {
            Self::rotary(self, positions, theta)
        }

        fn rotary_scaled(&self, positions: &[usize], theta: f32, factors: &[f32]) -> Result<Self> {
            Self::rotary_scaled(self, positions, theta, factors)
        }

        fn add(&self, rhs: &Self) -> Result<Self> {
            Self::add(self, rhs)
        }

        fn sub(&self, rhs: &Self) -> Result<Self> {
            Self::sub(self, rhs)
        }

        fn mul(&self, rhs: &Self) -> Result<Self> {
            Self::mul(self, rhs)
        }

        fn div(&self, rhs: &Self) -> Result<Self> {
            Self::div(self, rhs)
        }

        fn scale(&self, factor: f32) -> Result<Self> {
            Self::scale(self, factor)
        }

        fn add_scalar(&self, value: f32) -> Result<Self> {
            Self::add_scalar(self, value)
        }

        fn gelu(&self) -> Result<Self> {
            Self::gelu(self)
        }

        fn gelu_tanh(&self) -> Result<Self> {
            Self::gelu_tanh(self)
        }

        fn silu(&self) -> Result<Self> {
            Self::silu(self)
        }

        fn relu(&self) -> Result<Self> {
            Self::relu(self)
        }

        fn tanh(&self) -> Result<Self> {
            Self::tanh(self)
        }

        fn matmul(&self, rhs: &Self) -> Result<Self> {
            Self::matmul(self, rhs)
        }

        fn linear(&self, weight: &Self, bias: Option<&Self>) -> Result<Self> {
            Self::linear(self, weight, bias)
        }

        fn softmax(&self, axis: usize) -> Result<Self> {
            Self::softmax(self, axis)
        }

        fn softmax_last(&self) -> Result<Self> {
            Self::softmax_last(self)
        }

        fn layer_norm(&self, weight: Option<&Self>, bias: Option<&Self>, eps: f32) -> Result<Self> {
            Self::layer_norm(self, weight, bias, eps)
        }

        fn rms_norm(&self, weight: Option<&Self>, eps: f32) -> Result<Self> {
            Self::rms_norm(self, weight, eps)
        }

        fn l2_normalize(&self) -> Result<Self> {
            Self::l2_normalize(self)
        }

        fn mean_pool(&self, mask: &[bool]) -> Result<Self> {
            Self::mean_pool(self, mask)
        }

        fn to_dtype(&self, dtype: DType) -> Result<Self> {
            Self::to_dtype(self, dtype)
        }

        fn argmax_last(&self) -> Result<Vec<usize>> {
            Self::argmax_last(self)
        }

        fn to_f32_vec(&self) -> Result<Vec<f32>> {
            Self::to_f32_vec(self)
        }

        fn reshape(&self, shape: &[usize]) -> Result<Self> {
            Self::reshape(self, shape)
        }

        fn permute(&self, axes: &[usize]) -> Result<Self> {
            Self::permute(self, axes)
        }

        fn transpose(&self, a: usize, b: usize) -> Result<Self> {
            Self::transpose(self, a, b)
        }

        fn narrow(&self, axis: usize, start: usize, len: usize) -> Result<Self> {
            Self::narrow(self, axis, start, len)
        }

        fn new_zeros(&self, shape: &[usize]) -> Result<Self> {
            Self::new_zeros(self, shape)
        }

        fn write_slice(&mut self, axis: usize, start: usize, values: &Self) -> Result<()> {
            Self::write_slice(self, axis, start, values)
        }

        fn shape(&self) -> &[usize] {
            Self::shape(self)
        }

        fn dtype(&self) -> DType {
            Self::dtype(self)
        }
    };
}

impl Compute for Tensor<Host> {
    delegate!();

    fn embedding(weight: &Self, ids: &[u32]) -> Result<Self> {
        Tensor::<Host>::embedding(weight, ids)
    }

    fn attention(q: &Self, k: &Self, v: &Self, causal: bool, key_mask: Option<&[bool]>) -> Result<Self> {
        Tensor::<Host>::attention(q, k, v, causal, key_mask)
    }

    fn attention_windowed(q: &Self, k: &Self, v: &Self, key_mask: Option<&[bool]>, window: usize) -> Result<Self> {
        Tensor::<Host>::attention_windowed(q, k, v, key_mask, window)
    }

    fn attention_sinks(
        q: &Self,
        k: &Self,
        v: &Self,
        key_mask: Option<&[bool]>,
        window: usize,
        sinks: &[f32],
    ) -> Result<Self> {
        Tensor::<Host>::attention_sinks(q, k, v, key_mask, window, sinks)
    }

    fn contiguous(&self) -> Result<Self> {
        Ok(Tensor::<Host>::contiguous(self))
    }

    fn to_host(&self) -> Result<Tensor> {
        Ok(self.clone())
    }

    fn upload_like(&self, host: &Tensor) -> Result<Self> {
        Ok(host.clone())
    }
}

#[cfg(feature = "gpu")]
impl Compute for Tensor<crate::Gpu> {
    delegate!();

    fn embedding(weight: &Self, ids: &[u32]) -> Result<Self> {
        crate::gpu::embedding(weight, ids)
    }

    fn attention(q: &Self, k: &Self, v: &Self, causal: bool, key_mask: Option<&[bool]>) -> Result<Self> {
        crate::gpu::attention(q, k, v, causal, key_mask)
    }

    fn attention_windowed(q: &Self, k: &Self, v: &Self, key_mask: Option<&[bool]>, window: usize) -> Result<Self> {
        crate::gpu::attention_windowed(q, k, v, key_mask, window)
    }

    /// Computed on the host (the GPU has no sink kernel yet): the operands are read back and
    /// the result uploaded.
    fn attention_sinks(
        q: &Self,
        k: &Self,
        v: &Self,
        key_mask: Option<&[bool]>,
        window: usize,
        sinks: &[f32],
    ) -> Result<Self> {
        let [q_host, k_host, v_host] = [q, k, v].map(Tensor::<crate::Gpu>::to_host);
        Tensor::<Host>::attention_sinks(&q_host?, &k_host?, &v_host?, key_mask, window, sinks)?.to_device(q.device())
    }

    fn contiguous(&self) -> Result<Self> {
        Tensor::<crate::Gpu>::contiguous(self)
    }

    fn to_host(&self) -> Result<Tensor> {
        Tensor::<crate::Gpu>::to_host(self)
    }

    fn upload_like(&self, host: &Tensor) -> Result<Self> {
        host.to_device(self.device())
    }
}
