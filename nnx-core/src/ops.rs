//! Operations that build new tensors from several: concatenation.

use crate::Tensor;
use crate::error::{ConcatProblem, Error, Result};

impl Tensor {
    /// Joins tensors of one dtype along `axis`; every other axis must agree. The result is
    /// owned and contiguous (meta when every input is meta).
    ///
    /// # Errors
    /// [`Error::Concat`] for an empty list, mixed dtypes or disagreeing shapes,
    /// [`Error::AxisOutOfRange`] for an axis past the rank, [`Error::Meta`] when some inputs
    /// have data and others do not.
    ///
    /// # Examples
    /// ```
    /// use nnx_core::Tensor;
    /// let a = Tensor::from_vec(vec![1i32, 2, 3, 4], &[2, 2])?;
    /// let b = Tensor::from_vec(vec![5i32, 6], &[2, 1])?;
    /// let joined = Tensor::concat(&[a, b], 1)?;
    /// assert_eq!(joined.to_vec::<i32>()?, [1, 2, 5, 3, 4, 6]);
    /// # Ok::<(), nnx_core::Error>(())
    /// ```
    pub fn concat(tensors: &[Tensor], axis: usize) -> Result<Tensor> {
        let Some(first) = tensors.first() else {
            return Err(Error::Concat { problem: ConcatProblem::Empty });
        };
        if axis >= first.rank() {
            return Err(Error::AxisOutOfRange { axis, rank: first.rank(), shape: first.shape().to_vec() });
        }
        let mut shape = first.shape().to_vec();
        shape[axis] = 0;
        for tensor in tensors {
            let agrees = tensor.rank() == first.rank()
                && tensor.shape().iter().zip(first.shape()).enumerate().all(|(at, (a, b))| at == axis || a == b);
            if tensor.dtype() != first.dtype() || !agrees {
                return Err(Error::Concat {
                    problem: ConcatProblem::Disagrees {
                        axis,
                        expected_dtype: first.dtype(),
                        expected_shape: first.shape().to_vec(),
                        found_dtype: tensor.dtype(),
                        found_shape: tensor.shape().to_vec(),
                    },
                });
            }
            shape[axis] += tensor.shape()[axis];
        }
        let metas = tensors.iter().filter(|tensor| tensor.is_meta()).count();
        if metas == tensors.len() {
            return Ok(Tensor::meta(first.dtype(), &shape));
        }
        if metas > 0 {
            return Err(Error::Meta { op: "concat" });
        }
        // Row-major: the output is `outer` runs, each the inputs' blocks after one another.
        let outer: usize = shape[..axis].iter().product();
        let pieces: Vec<_> = tensors.iter().map(|tensor| tensor.to_bytes()).collect::<Result<_>>()?;
        let blocks: Vec<usize> = pieces.iter().map(|bytes| bytes.len().checked_div(outer).unwrap_or(0)).collect();
        let mut out = Vec::with_capacity(pieces.iter().map(|bytes| bytes.len()).sum());
        for run in 0..outer {
            for (bytes, &block) in pieces.iter().zip(&blocks) {
                out.extend_from_slice(&bytes[run * block..(run + 1) * block]);
            }
        }
        Tensor::from_bytes(first.dtype(), &shape, &out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn concat_undoes_split() {
        let t = Tensor::from_vec((0..24).collect::<Vec<i32>>(), &[2, 3, 4]).unwrap();
        for axis in 0..3 {
            let size = t.shape()[axis];
            let parts = if size.is_multiple_of(2) { 2 } else { size };
            let pieces = t.split(axis, parts).unwrap();
            assert_eq!(Tensor::concat(&pieces, axis).unwrap().to_vec::<i32>().unwrap(), t.to_vec::<i32>().unwrap());
        }
        assert!(Tensor::concat(&[], 0).is_err());
        let other = Tensor::zeros(crate::DType::F32, &[2, 3, 4]);
        assert!(Tensor::concat(&[t, other], 0).is_err());
    }
}
