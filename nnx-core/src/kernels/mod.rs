//! CPU kernels for transformer inference: matmul (with a matrix-vector path for decoding),
//! elementwise ops and activations, normalisations, softmax, embeddings, rotary embeddings,
//! attention, in-place writes into key/value caches, and fused encoder steps over packed token
//! rows (`fused`: bias, GELU, residual and layer norm applied to each block of a product while
//! it is in cache; attention without padding).
//!
//! Every kernel takes tensors of any float dtype (f16, bf16, f32, f64), computes in f32 and
//! returns an owned, contiguous f32 tensor. Work above [`PARALLEL_ELEMENTS`] elements is split
//! across threads with rayon. Operands are read through their strides where that saves a copy:
//! a transposed weight goes into matmul as it is.

#[cfg(feature = "kernels")]
mod attention;
#[cfg(feature = "kernels")]
mod cache;
#[cfg(feature = "kernels")]
mod elementwise;
#[cfg(feature = "kernels")]
pub mod fused;
#[cfg(feature = "kernels")]
mod gemv;
#[cfg(feature = "kernels")]
pub(crate) mod matmul;
#[cfg(feature = "kernels")]
mod norm;

#[cfg(feature = "kernels")]
pub use attention::llama3_rope_factors;

use crate::error::Result;
#[cfg(feature = "kernels")]
use crate::shape::check_parameter;
use crate::shape::{check_argmax, check_float};
use crate::{DType, Tensor};

/// Element count above which a kernel splits its rows across threads.
#[cfg(feature = "kernels")]
pub(crate) const PARALLEL_ELEMENTS: usize = 1 << 16;

/// An f32 view of a tensor: an f32 block holding its elements and the stride of each of the
/// tensor's axes into that block.
///
/// An f32 tensor is read in place through its own strides, whatever its layout (a narrowed
/// view such as the filled rows of a key/value cache costs no copy). A tensor of another dtype
/// whose elements are one dense block in some axis order (a contiguous tensor, a transpose or
/// permutation of one) is converted without a gather; other views are made contiguous first.
#[cfg(feature = "kernels")]
pub(crate) struct Dense {
    block: Tensor,
    shape: Vec<usize>,
    strides: Vec<usize>,
}

#[cfg(feature = "kernels")]
impl Dense {
    /// The f32 view of `tensor`, for the operation `op` (named in errors).
    pub(crate) fn new(tensor: &Tensor, op: &'static str) -> Result<Dense> {
        check_float(tensor, op)?;
        if tensor.dtype() == DType::F32 {
            let (shape, strides) = (tensor.shape().to_vec(), tensor.strides().to_vec());
            return Ok(Dense { block: tensor.clone(), shape, strides });
        }
        let rank = tensor.rank();
        // The axes by decreasing stride: the order in which a permuted block is row-major.
        let mut order: Vec<usize> = (0..rank).collect();
        order.sort_by(|&a, &b| tensor.strides()[b].cmp(&tensor.strides()[a]).then(a.cmp(&b)));
        let permuted = tensor.permute(&order)?;
        let (block, order) = if permuted.is_contiguous() {
            (permuted.to_dtype(DType::F32)?, order)
        } else {
            (tensor.contiguous().to_dtype(DType::F32)?, (0..rank).collect())
        };
        let mut strides = vec![0; rank];
        for (position, &axis) in order.iter().enumerate() {
            strides[axis] = block.strides()[position];
        }
        Ok(Dense { block, shape: tensor.shape().to_vec(), strides })
    }

    /// The elements of the block's storage from its first element on; element `index` of the
    /// tensor is at `sum(index[i] * strides[i])`.
    pub(crate) fn data(&self) -> &[f32] {
        let bytes = self.block.storage().0.bytes().expect("the block has data, checked when it was built");
        let values: &[f32] = bytemuck::try_cast_slice(&bytes[..bytes.len() / 4 * 4])
            .expect("f32 storage is aligned for f32, checked when the tensor was built");
        values.get(self.block.offset()..).unwrap_or(&[])
    }

    /// The tensor's shape.
    pub(crate) fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The stride of each axis into [`Dense::data`], in elements.
    pub(crate) fn strides(&self) -> &[usize] {
        &self.strides
    }
}

/// The values of a float tensor as f32, row-major, in a fresh vector.
pub(crate) fn f32_values(tensor: &Tensor, op: &'static str) -> Result<Vec<f32>> {
    check_float(tensor, op)?;
    tensor.to_dtype(DType::F32)?.to_vec::<f32>()
}

/// An owned f32 buffer that a tensor can sit on without a copy.
struct OwnedValues(Vec<f32>);

// SAFETY: the vector is owned, never resized or written after construction (the field is
// private and only read here), so `bytes` returns the same slice on every call.
unsafe impl crate::ByteSource for OwnedValues {
    fn bytes(&self) -> &[u8] {
        bytemuck::cast_slice(&self.0)
    }

    fn is_file_mapping(&self) -> bool {
        false
    }
}

/// An f32 tensor over `values`, laid out row-major in `shape`, without copying them.
pub(crate) fn f32_tensor(values: Vec<f32>, shape: &[usize]) -> Result<Tensor> {
    let len = values.len() * 4;
    Tensor::from_shared(std::sync::Arc::new(OwnedValues(values)), 0, len, DType::F32, shape)
}

/// The offset of the element at flat row-major index `flat` of `shape`, through `strides`.
#[cfg(feature = "kernels")]
pub(crate) fn strided_offset(mut flat: usize, shape: &[usize], strides: &[usize]) -> usize {
    let mut at = 0;
    for (&size, &stride) in shape.iter().zip(strides).rev() {
        if size > 0 {
            at += (flat % size) * stride;
            flat /= size;
        }
    }
    at
}

/// The values of a rank-1 parameter (`weight`, `bias`) of `width` elements, as f32.
#[cfg(feature = "kernels")]
pub(crate) fn parameter(
    tensor: Option<&Tensor>,
    width: usize,
    input: &Tensor,
    op: &'static str,
    reason: &'static str,
) -> Result<Option<Vec<f32>>> {
    check_parameter(tensor, width, input, op, reason)?;
    tensor.map(|tensor| f32_values(tensor, op)).transpose()
}

impl Tensor {
    /// The values as f32, row-major, whatever the float dtype.
    ///
    /// # Errors
    /// [`Error::NotFloat`](crate::Error::NotFloat) for a dtype other than f16, bf16, f32 and f64;
    /// [`Error::Meta`](crate::Error::Meta) for a meta tensor.
    ///
    /// # Examples
    /// ```
    /// use nnx_core::{DType, Tensor};
    /// let t = Tensor::from_vec(vec![1.0f32, 2.5], &[2])?.to_dtype(DType::BF16)?;
    /// assert_eq!(t.to_f32_vec()?, [1.0, 2.5]);
    /// # Ok::<(), nnx_core::Error>(())
    /// ```
    pub fn to_f32_vec(&self) -> Result<Vec<f32>> {
        f32_values(self, "to_f32_vec")
    }

    /// The index of the largest value along the last axis, for each row (the first one on
    /// ties).
    ///
    /// # Errors
    /// [`Error::BadShape`](crate::Error::BadShape) for rank 0 or an empty last axis;
    /// [`Error::NotFloat`](crate::Error::NotFloat), [`Error::Meta`](crate::Error::Meta).
    ///
    /// # Examples
    /// ```
    /// use nnx_core::Tensor;
    /// let logits = Tensor::from_vec(vec![0.1f32, 0.7, 0.2, 3.0, -1.0, 3.0], &[2, 3])?;
    /// assert_eq!(logits.argmax_last()?, [1, 0]);
    /// # Ok::<(), nnx_core::Error>(())
    /// ```
    pub fn argmax_last(&self) -> Result<Vec<usize>> {
        let width = check_argmax(self)?;
        let values = f32_values(self, "argmax_last")?;
        Ok(values
            .chunks_exact(width)
            .map(|row| {
                let mut best = 0;
                for (index, &value) in row.iter().enumerate() {
                    if value > row[best] {
                        best = index;
                    }
                }
                best
            })
            .collect())
    }
}

#[cfg(test)]
pub(crate) mod testing {
    //! Helpers shared by the kernel tests.

    use crate::{DType, Tensor};

    /// A deterministic pseudo-random f32 in `[-1, 1)` for each index and seed.
    pub(crate) fn values(count: usize, seed: u64) -> Vec<f32> {
        let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0xdead_beef;
        (0..count)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    /// A pseudo-random f32 tensor of `shape`.
    pub(crate) fn random(shape: &[usize], seed: u64) -> Tensor {
        Tensor::from_vec(values(shape.iter().product(), seed), shape).unwrap()
    }

    /// `tensor` in `dtype`.
    pub(crate) fn cast(tensor: &Tensor, dtype: DType) -> Tensor {
        tensor.to_dtype(dtype).unwrap()
    }

    /// Asserts that two sequences agree within `tolerance` (absolute plus relative).
    pub(crate) fn assert_close(found: &[f32], expected: &[f64], tolerance: f64) {
        assert_eq!(found.len(), expected.len(), "lengths differ");
        for (index, (&f, &e)) in found.iter().zip(expected).enumerate() {
            let error = (f64::from(f) - e).abs();
            assert!(error <= tolerance * (1.0 + e.abs()), "element {index}: found {f}, expected {e} (error {error})");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::testing::random;
    use super::*;
    use crate::Error;

    #[test]
    fn dense_reads_transposes_in_place() {
        let t = random(&[3, 4, 5], 1);
        let view = t.permute(&[2, 0, 1]).unwrap();
        let dense = Dense::new(&view, "test").unwrap();
        assert_eq!(dense.strides(), [1, 20, 5]);
        assert_eq!(dense.data().as_ptr(), t.as_slice::<f32>().unwrap().unwrap().as_ptr());
        let expected = view.contiguous().to_vec::<f32>().unwrap();
        for (flat, &value) in expected.iter().enumerate() {
            assert_eq!(dense.data()[strided_offset(flat, dense.shape(), dense.strides())], value);
        }
    }

    #[test]
    fn dense_reads_narrowed_f32_views_in_place() {
        // The first rows of a preallocated `[batch, heads, capacity, d]` cache.
        let t = random(&[2, 3, 8, 4], 3);
        let view = t.narrow(2, 0, 5).unwrap().narrow(1, 1, 2).unwrap();
        let dense = Dense::new(&view, "test").unwrap();
        assert_eq!(dense.strides(), t.strides());
        let expected = view.contiguous().to_vec::<f32>().unwrap();
        for (flat, &value) in expected.iter().enumerate() {
            assert_eq!(dense.data()[strided_offset(flat, dense.shape(), dense.strides())], value);
        }
    }

    #[test]
    fn dense_gathers_narrowed_views() {
        let t = random(&[4, 6], 2).to_dtype(DType::BF16).unwrap();
        let view = t.narrow(1, 1, 3).unwrap().transpose(0, 1).unwrap();
        let dense = Dense::new(&view, "test").unwrap();
        let expected = view.to_f32_vec().unwrap();
        for (flat, &value) in expected.iter().enumerate() {
            assert_eq!(dense.data()[strided_offset(flat, dense.shape(), dense.strides())], value);
        }
    }

    #[test]
    fn argmax_and_refusals() {
        let t = Tensor::from_vec(vec![1.0f32, 5.0, 5.0, -2.0], &[2, 2]).unwrap();
        assert_eq!(t.argmax_last().unwrap(), [1, 0]);
        let ints = Tensor::from_vec(vec![1i32], &[1]).unwrap();
        assert!(matches!(ints.argmax_last(), Err(Error::NotFloat { .. })));
        assert!(matches!(Tensor::meta(DType::F32, &[2]).to_f32_vec(), Err(Error::Meta { .. })));
        assert!(matches!(Tensor::zeros(DType::F32, &[2, 0]).argmax_last(), Err(Error::BadShape { .. })));
    }
}
