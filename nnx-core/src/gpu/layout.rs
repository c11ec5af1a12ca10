//! Reshapes of GPU tensors, and the reads that end on the host (`to_f32_vec`, `argmax_last`).

use super::Gpu;
use crate::error::{Error, Result};
use crate::{Tensor, tensor};

impl Tensor<Gpu> {
    /// The same elements in another shape: a view when the tensor is contiguous (or meta),
    /// otherwise a contiguous copy made on the device first.
    ///
    /// # Errors
    /// [`Error::Reshape`] when the element counts differ; [`Error::Gpu`] when the copy fails.
    pub fn reshape(&self, shape: &[usize]) -> Result<Tensor<Gpu>> {
        let to_len = tensor::element_count(self.dtype(), shape)?;
        if to_len != self.len() {
            return Err(Error::Reshape {
                from: self.shape().to_vec(),
                from_len: self.len(),
                to: shape.to_vec(),
                to_len,
            });
        }
        Ok(self.contiguous()?.contiguous_view(shape))
    }

    /// The values as f32, row-major, on the host, whatever the float dtype.
    ///
    /// # Errors
    /// [`Error::NotFloat`], [`Error::Meta`]; [`Error::Gpu`] when the transfer fails.
    pub fn to_f32_vec(&self) -> Result<Vec<f32>> {
        self.to_host()?.to_f32_vec()
    }

    /// The index of the largest value along the last axis, for each row (the first one on
    /// ties), read back to the host.
    ///
    /// # Errors
    /// [`Error::BadShape`] for rank 0 or an empty last axis; [`Error::NotFloat`],
    /// [`Error::Meta`], [`Error::Gpu`].
    pub fn argmax_last(&self) -> Result<Vec<usize>> {
        self.to_host()?.argmax_last()
    }
}
