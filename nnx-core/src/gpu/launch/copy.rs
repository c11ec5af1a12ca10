//! Gathering a strided view into a contiguous buffer (`copy.wgsl`), for any dtype whose
//! elements are whole bytes: what `contiguous` does on the device.

use super::{Axes, MAX_AXES, kernel_source, launch, uniform};
use crate::Tensor;
use crate::error::{Error, Result};
use crate::gpu::Gpu;

const COPY: &str = kernel_source!("copy.wgsl");

uniform! {
    /// The parameters of `copy.wgsl`.
    struct CopyParams {
        rank: u32,
        /// The size of an element in bytes (1, 2, 4 or 8).
        bytes: u32,
        offset: u32,
        count: u32,
        shape: Axes,
        strides: Axes,
    }
}

impl Tensor<Gpu> {
    /// This tensor if it is contiguous, otherwise a row-major copy made on the device.
    ///
    /// # Errors
    /// [`Error::Gpu`] when the device cannot hold the copy; [`Error::SubByte`] for F4/F6
    /// views.
    pub fn contiguous(&self) -> Result<Tensor<Gpu>> {
        if self.is_contiguous() || self.is_meta() {
            return Ok(if self.is_contiguous() {
                self.clone()
            } else {
                Tensor::meta_on(self.device(), self.dtype(), self.shape())
            });
        }
        let gpu = self.device();
        let bytes = self.dtype().size_in_bytes().ok_or(Error::SubByte { op: "contiguous", dtype: self.dtype() })?;
        let rank = self.rank();
        let (Ok(count), Ok(offset)) = (u32::try_from(self.len()), u32::try_from(self.offset())) else {
            return Err(gpu.fail("copy a view", "views of more than 2^32 elements are not supported yet"));
        };
        if rank > MAX_AXES || self.strides().iter().any(|&stride| stride > u32::MAX as usize) {
            return Err(gpu.fail("copy a view", format!("a view of rank {rank} with strides {:?}", self.strides())));
        }
        // Strides fit u32 (checked above), and so do sizes of a view of at most 2^32 elements.
        let padded = |values: &[usize]| -> Axes {
            let mut words = [1; MAX_AXES];
            for (word, &value) in words.iter_mut().zip(values) {
                *word = value as u32;
            }
            words
        };
        let params = CopyParams {
            rank: rank as u32,
            bytes: bytes as u32,
            offset,
            count,
            shape: padded(self.shape()),
            strides: padded(self.strides()),
        };
        let out = gpu.buffer(self.byte_len() as u64, "contiguous")?;
        let source = self.buffer().ok_or_else(|| gpu.fail("copy a view", "no buffer"))?;
        let words = (self.byte_len() as u64).div_ceil(4);
        launch(gpu, "copy", COPY, &params, &[source.into(), (&out).into()], words)?;
        Ok(gpu.tensor(Some(out), self.dtype(), self.shape()))
    }
}

#[cfg(test)]
#[test]
fn parameter_blocks_match_the_shaders() {
    super::assert_layout::<CopyParams>(COPY, "Params");
}
