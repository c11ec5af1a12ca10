//! Writing into preallocated tensors, for key/value caches: a decoding step writes its new rows
//! after the cached ones instead of concatenating, which would copy the whole cache every token.

use super::{Dense, strided_offset};
use crate::device::HostStorage;
use crate::error::Result;
use crate::shape::{check_new_zeros, check_write_slice};
use crate::storage::Storage;
use crate::{DType, Tensor};

impl Tensor {
    /// A tensor of f32 zeros of `shape` on this tensor's device (the host here): how code
    /// generic over [`Compute`](crate::Compute) allocates a buffer it fills later, such as a
    /// key/value cache.
    ///
    /// # Errors
    /// [`Error::TooLarge`](crate::Error::TooLarge) when `shape` cannot be addressed.
    pub fn new_zeros(&self, shape: &[usize]) -> Result<Tensor> {
        check_new_zeros(shape)?;
        Ok(Tensor::zeros(DType::F32, shape))
    }

    /// Writes `values` (any float dtype, converted to f32) into the indices
    /// `start..start + values.shape()[axis]` of `axis`, in place: `self` must be f32 and
    /// `values` must match it on every other axis.
    ///
    /// The write goes into this tensor's storage when no other tensor shares it and it is not
    /// borrowed from a file; otherwise this handle first becomes an owned copy (copy on write),
    /// so that no clone or view ever sees the change.
    ///
    /// # Errors
    /// [`Error::DTypeMismatch`](crate::Error::DTypeMismatch) unless `self` is f32,
    /// [`Error::AxisOutOfRange`](crate::Error::AxisOutOfRange),
    /// [`Error::ShapeMismatch`](crate::Error::ShapeMismatch) when the other axes disagree,
    /// [`Error::NarrowOutOfRange`](crate::Error::NarrowOutOfRange) when the values do not fit from
    /// `start`, [`Error::NotFloat`](crate::Error::NotFloat), [`Error::Meta`](crate::Error::Meta).
    ///
    /// # Examples
    /// ```
    /// use nnx_core::Tensor;
    /// let mut cache = Tensor::zeros(nnx_core::DType::F32, &[2, 4]);
    /// let row = Tensor::from_vec(vec![1.0f32, 2.0], &[2, 1])?;
    /// cache.write_slice(1, 2, &row)?;
    /// assert_eq!(cache.to_vec::<f32>()?, [0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 2.0, 0.0]);
    /// # Ok::<(), nnx_core::Error>(())
    /// ```
    pub fn write_slice(&mut self, axis: usize, start: usize, values: &Tensor) -> Result<()> {
        const OP: &str = "write_slice";
        check_write_slice(self, axis, start, values)?;
        if values.is_empty() {
            return Ok(());
        }
        let source = Dense::new(values, OP)?;
        if !matches!(self.storage_mut(), Some(HostStorage(Storage::Owned(_)))) {
            *self = self.copy();
        }
        let (shape, strides) = (values.shape().to_vec(), self.strides().to_vec());
        let base = self.offset() + start * strides[axis];
        let Some(HostStorage(Storage::Owned(buffer))) = self.storage_mut() else {
            unreachable!("an owned copy is held by this handle alone");
        };
        let destination: &mut [f32] = bytemuck::cast_slice_mut(buffer.as_mut_bytes());
        let (source_data, source_strides) = (source.data(), source.strides());
        let rank = shape.len();
        let (width, source_step, destination_step) = (shape[rank - 1], source_strides[rank - 1], strides[rank - 1]);
        for row in 0..values.len() / width {
            let from = strided_offset(row * width, &shape, source_strides);
            let to = base + strided_offset(row * width, &shape, &strides);
            for i in 0..width {
                destination[to + i * destination_step] = source_data[from + i * source_step];
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{cast, random};
    use super::*;
    use crate::Error;

    #[test]
    fn writes_land_in_place_along_any_axis() {
        let mut cache = Tensor::zeros(DType::F32, &[2, 3, 6, 4]);
        let address = cache.as_slice::<f32>().unwrap().unwrap().as_ptr();
        let rows = random(&[2, 3, 2, 4], 1);
        cache.write_slice(2, 3, &rows).unwrap();
        assert_eq!(cache.as_slice::<f32>().unwrap().unwrap().as_ptr(), address, "no copy");
        assert_eq!(cache.narrow(2, 3, 2).unwrap().contiguous().to_vec::<f32>().unwrap(), rows.to_vec::<f32>().unwrap());
        assert!(cache.narrow(2, 0, 3).unwrap().contiguous().to_vec::<f32>().unwrap().iter().all(|&v| v == 0.0));
        // Permuted bf16 values (`[batch, seq, heads, d]` projections viewed per head).
        let heads = cast(&random(&[2, 1, 3, 4], 2), DType::BF16);
        cache.write_slice(2, 5, &heads.permute(&[0, 2, 1, 3]).unwrap()).unwrap();
        assert_eq!(
            cache.narrow(2, 5, 1).unwrap().contiguous().to_vec::<f32>().unwrap(),
            heads.permute(&[0, 2, 1, 3]).unwrap().to_f32_vec().unwrap()
        );
    }

    #[test]
    fn a_shared_destination_is_copied_before_the_write() {
        let mut cache = Tensor::zeros(DType::F32, &[3, 2]);
        let view = cache.narrow(0, 0, 2).unwrap();
        let clone = cache.clone();
        cache.write_slice(0, 1, &Tensor::from_vec(vec![5.0f32, 6.0], &[1, 2]).unwrap()).unwrap();
        assert_eq!(cache.to_vec::<f32>().unwrap(), [0.0, 0.0, 5.0, 6.0, 0.0, 0.0]);
        assert!(!cache.shares_storage(&clone));
        assert!(view.contiguous().to_vec::<f32>().unwrap().iter().all(|&v| v == 0.0));
        assert!(clone.to_vec::<f32>().unwrap().iter().all(|&v| v == 0.0));
    }

    #[test]
    fn writes_that_do_not_fit_are_refused() {
        let mut cache = Tensor::zeros(DType::F32, &[2, 4]);
        let column = random(&[2, 1], 3);
        assert!(matches!(cache.write_slice(1, 4, &column), Err(Error::NarrowOutOfRange { start: 4, .. })));
        assert!(matches!(cache.write_slice(2, 0, &column), Err(Error::AxisOutOfRange { .. })));
        assert!(matches!(cache.write_slice(1, 0, &random(&[3, 1], 4)), Err(Error::ShapeMismatch { .. })));
        let mut half = Tensor::zeros(DType::BF16, &[2, 4]);
        assert!(matches!(half.write_slice(1, 0, &column), Err(Error::DTypeMismatch { .. })));
        assert!(matches!(cache.new_zeros(&[usize::MAX, 2]), Err(Error::TooLarge { .. })));
    }
}
