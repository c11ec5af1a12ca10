//! Matrix products: batched, broadcasting `matmul` and PyTorch's `linear`, on the `gemm` crate.

use gemm::Parallelism;
use rayon::prelude::*;

use super::{Dense, f32_tensor, f32_values, parameter, strided_offset};
use crate::error::Result;
use crate::shape::{MatmulShape, broadcast_strides, check_linear, check_matmul, rows_fold};
use crate::{Host, OnDevice, Tensor};

/// One matrix operand of a product: where it starts in its block and its row and column strides.
#[derive(Clone, Copy)]
pub(crate) struct Matrix<'a> {
    pub(crate) data: &'a [f32],
    pub(crate) start: usize,
    pub(crate) row_stride: usize,
    pub(crate) column_stride: usize,
}

/// Multiply-adds below which threading a single product costs more than it saves.
const THREADED_WORK: usize = 1 << 20;

/// `dst = lhs · rhs` for an `m × k` `lhs` and a `k × n` `rhs`, into a row-major `m × n` `dst`.
///
/// `threads` > 1 lets `gemm` split the product across rayon threads.
pub(crate) fn product(lhs: Matrix<'_>, rhs: Matrix<'_>, m: usize, k: usize, n: usize, dst: &mut [f32], threads: usize) {
    assert_eq!(dst.len(), m * n, "the destination holds the product");
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        dst.fill(0.0);
        return;
    }
    // The last element each operand reads must lie in its block.
    let last = |matrix: &Matrix<'_>, rows: usize, columns: usize| {
        matrix.start + (rows - 1) * matrix.row_stride + (columns - 1) * matrix.column_stride
    };
    assert!(last(&lhs, m, k) < lhs.data.len(), "the left operand lies in its block");
    assert!(last(&rhs, k, n) < rhs.data.len(), "the right operand lies in its block");
    let parallelism =
        if threads > 1 && m * n * k >= THREADED_WORK { Parallelism::Rayon(threads) } else { Parallelism::None };
    // SAFETY: `dst` is an exclusively borrowed row-major m × n buffer (checked length), so row
    // stride n covers exactly its elements; the operands were checked above.
    unsafe { product_strided(lhs, rhs, m, k, n, dst.as_mut_ptr(), n, parallelism) }
}

/// `dst = lhs · rhs` as [`product`] does, into the `m × n` block at `dst` whose rows are
/// `dst_row_stride` apart (columns adjacent): one block of columns of a wider output.
///
/// # Safety
/// Each operand's elements `start + i * row_stride + j * column_stride` (`i` below its rows,
/// `j` below its columns) lie in its slice; `dst + i * dst_row_stride + j` for `i < m`, `j <
/// n` are valid for writes and no other thread reads or writes them during the call.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn product_strided(
    lhs: Matrix<'_>,
    rhs: Matrix<'_>,
    m: usize,
    k: usize,
    n: usize,
    dst: *mut f32,
    dst_row_stride: usize,
    parallelism: Parallelism,
) {
    // SAFETY: the caller's contract; `read_dst` is false, so `dst` is written and never read,
    // and `T` is f32, which `gemm` supports.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst,
            1,
            dst_row_stride as isize,
            false,
            lhs.data.as_ptr().add(lhs.start),
            lhs.column_stride as isize,
            lhs.row_stride as isize,
            rhs.data.as_ptr().add(rhs.start),
            rhs.column_stride as isize,
            rhs.row_stride as isize,
            0.0f32,
            1.0f32,
            false,
            false,
            false,
            parallelism,
        );
    }
}

impl Tensor {
    /// The matrix product over the last two axes: `[.., m, k] x [.., k, n] -> [.., m, n]`, with
    /// the leading (batch) axes broadcast by numpy's rules.
    ///
    /// Inputs of any float dtype are read as f32 and the product accumulates in f32. Transposed
    /// and permuted views are read through their strides without a copy. A single large product
    /// is split across threads; a batch of products runs its matrices in parallel.
    ///
    /// # Errors
    /// [`Error::BadShape`](crate::Error::BadShape) when an operand has rank below 2,
    /// [`Error::ShapeMismatch`](crate::Error::ShapeMismatch) when the inner sizes differ or the
    /// batch axes do not broadcast, [`Error::NotFloat`](crate::Error::NotFloat),
    /// [`Error::Meta`](crate::Error::Meta).
    ///
    /// # Examples
    /// ```
    /// use nnx_core::Tensor;
    /// let a = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[2, 2])?;
    /// let b = Tensor::from_vec(vec![1.0f32, 0.0, 1.0, 1.0], &[2, 2])?;
    /// assert_eq!(a.matmul(&b)?.to_vec::<f32>()?, [3.0, 2.0, 7.0, 4.0]);
    /// # Ok::<(), nnx_core::Error>(())
    /// ```
    pub fn matmul(&self, rhs: &impl OnDevice<Host>) -> Result<Tensor> {
        const OP: &str = "matmul";
        let rhs = rhs.on_device();
        let MatmulShape { batch, m, k, n } = check_matmul(self, rhs)?;
        let (left_rank, right_rank) = (self.rank(), rhs.rank());
        let mut shape = batch.clone();
        shape.extend([m, n]);
        let left = Dense::new(self, OP)?;
        let right = Dense::new(rhs, OP)?;
        let threads = rayon::current_num_threads();
        let mut out = vec![0.0f32; shape.iter().product()];
        let right_strides = right.strides();
        let right_matrix = |start| Matrix {
            data: right.data(),
            start,
            row_stride: right_strides[right_rank - 2],
            column_stride: right_strides[right_rank - 1],
        };

        // A stack of left matrices times one right matrix is one tall product.
        let right_is_single = rhs.shape()[..right_rank - 2].iter().all(|&size| size == 1);
        if right_is_single && rows_fold(left.shape(), left.strides()) {
            // The stride between consecutive rows of the tall matrix: that of the innermost
            // leading axis that is stepped along.
            let fold_stride =
                (0..left_rank - 1).rev().find(|&axis| left.shape()[axis] != 1).map_or(0, |axis| left.strides()[axis]);
            let left_matrix = Matrix {
                data: left.data(),
                start: 0,
                row_stride: fold_stride,
                column_stride: left.strides()[left_rank - 1],
            };
            let rows = out.len().checked_div(n).unwrap_or(0);
            product(left_matrix, right_matrix(0), rows, k, n, &mut out, threads);
            return f32_tensor(out, &shape);
        }

        let batches: usize = batch.iter().product();
        let left_batch = broadcast_strides(&self.shape()[..left_rank - 2], &left.strides()[..left_rank - 2], &batch);
        let right_batch = broadcast_strides(&rhs.shape()[..right_rank - 2], &right_strides[..right_rank - 2], &batch);
        let run = |index: usize, dst: &mut [f32], threads: usize| {
            let left_matrix = Matrix {
                data: left.data(),
                start: strided_offset(index, &batch, &left_batch),
                row_stride: left.strides()[left_rank - 2],
                column_stride: left.strides()[left_rank - 1],
            };
            let right_start = strided_offset(index, &batch, &right_batch);
            product(left_matrix, right_matrix(right_start), m, k, n, dst, threads);
        };
        let size = m * n;
        if size == 0 {
            return f32_tensor(out, &shape);
        }
        if batches >= threads && threads > 1 && batches * size * k >= THREADED_WORK {
            out.par_chunks_mut(size).enumerate().for_each(|(index, dst)| run(index, dst, 1));
        } else {
            for (index, dst) in out.chunks_mut(size).enumerate() {
                run(index, dst, threads);
            }
        }
        f32_tensor(out, &shape)
    }

    /// PyTorch's linear layer: `x · weightᵀ + bias` for `x` `[.., in]`, `weight`
    /// `[out, in]` and `bias` `[out]`, giving `[.., out]`. The weight is read through its
    /// strides; its transpose is never built.
    ///
    /// # Errors
    /// [`Error::BadShape`](crate::Error::BadShape) for a weight that is not rank 2 or an `x` of
    /// rank 0, [`Error::ShapeMismatch`](crate::Error::ShapeMismatch) when the widths or the bias
    /// disagree, [`Error::NotFloat`](crate::Error::NotFloat), [`Error::Meta`](crate::Error::Meta).
    ///
    /// # Examples
    /// ```
    /// use nnx_core::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0], &[1, 2])?;
    /// let weight = Tensor::from_vec(vec![1.0f32, 1.0, 0.0, 1.0, 1.0, 0.0], &[3, 2])?;
    /// let bias = Tensor::from_vec(vec![0.5f32, 0.0, -1.0], &[3])?;
    /// assert_eq!(x.linear(&weight, Some(&bias))?.to_vec::<f32>()?, [3.5, 2.0, 0.0]);
    /// # Ok::<(), nnx_core::Error>(())
    /// ```
    pub fn linear(&self, weight: &impl OnDevice<Host>, bias: Option<&Tensor>) -> Result<Tensor> {
        const OP: &str = "linear";
        let weight = weight.on_device();
        let (width, out_features) = check_linear(self, weight, bias)?;
        let bias = parameter(bias, out_features, weight, OP, "the bias must be `[out_features]`")?;
        let rows = self.len().checked_div(width).unwrap_or_else(|| self.shape()[..self.rank() - 1].iter().product());
        let input = self.reshape(&[rows, width])?;
        // A few rows (a decoding step) stream the weight once, in its stored dtype.
        let few_rows = if rows <= super::gemv::MAX_ROWS {
            super::gemv::product(&f32_values(&input, OP)?, rows, weight)?
        } else {
            None
        };
        let mut out = match few_rows {
            Some(out) => out,
            None => input.matmul(&weight.transpose(0, 1)?)?.to_vec::<f32>()?,
        };
        if let Some(bias) = bias
            && out_features > 0
        {
            let add = |row: &mut [f32]| row.iter_mut().zip(&bias).for_each(|(value, &b)| *value += b);
            if out.len() >= super::PARALLEL_ELEMENTS {
                out.par_chunks_mut(out_features).for_each(add);
            } else {
                out.chunks_mut(out_features).for_each(add);
            }
        }
        let mut shape = self.shape().to_vec();
        *shape.last_mut().expect("rank is at least 1") = out_features;
        f32_tensor(out, &shape)
    }
}

#[cfg(test)]
mod tests {
    use half::{bf16, f16};

    use super::super::testing::{assert_close, cast, random};
    use super::*;
    use crate::DType;
    use crate::Error;

    /// The product of row-major f64 matrices, `[batch, m, k] x [batch, k, n]`.
    fn reference(a: &[f64], b: &[f64], batch: usize, m: usize, k: usize, n: usize) -> Vec<f64> {
        let mut out = vec![0.0; batch * m * n];
        for t in 0..batch {
            for i in 0..m {
                for j in 0..n {
                    out[(t * m + i) * n + j] =
                        (0..k).map(|p| a[(t * m + i) * k + p] * b[(t * k + p) * n + j]).sum::<f64>();
                }
            }
        }
        out
    }

    fn f64s(tensor: &Tensor) -> Vec<f64> {
        tensor.to_f32_vec().unwrap().into_iter().map(f64::from).collect()
    }

    #[test]
    fn rank_two_products_match_the_reference() {
        for (m, k, n) in [(1, 1, 1), (3, 5, 7), (17, 33, 9), (64, 128, 96), (130, 70, 257)] {
            let a = random(&[m, k], 1);
            let b = random(&[k, n], 2);
            let out = a.matmul(&b).unwrap();
            assert_eq!(out.shape(), [m, n]);
            assert_close(&out.to_vec::<f32>().unwrap(), &reference(&f64s(&a), &f64s(&b), 1, m, k, n), 1e-5);
        }
    }

    #[test]
    fn large_products_use_threads_and_stay_exact() {
        let (m, k, n) = (200, 300, 250);
        let a = random(&[m, k], 3);
        let b = random(&[k, n], 4);
        let out = a.matmul(&b).unwrap().to_vec::<f32>().unwrap();
        assert_close(&out, &reference(&f64s(&a), &f64s(&b), 1, m, k, n), 1e-5);
    }

    #[test]
    fn batches_broadcast() {
        let a = random(&[2, 1, 4, 5], 5);
        let b = random(&[3, 5, 6], 6);
        let out = a.matmul(&b).unwrap();
        assert_eq!(out.shape(), [2, 3, 4, 6]);
        let values = out.to_vec::<f32>().unwrap();
        let (av, bv) = (f64s(&a), f64s(&b));
        for i in 0..2 {
            for j in 0..3 {
                let expected = reference(&av[i * 20..(i + 1) * 20], &bv[j * 30..(j + 1) * 30], 1, 4, 5, 6);
                let start = (i * 3 + j) * 24;
                assert_close(&values[start..start + 24], &expected, 1e-5);
            }
        }
        // A stack of matrices times one matrix folds into a single product.
        let c = random(&[5, 6], 7);
        let stacked = a.matmul(&c).unwrap();
        assert_eq!(stacked.shape(), [2, 1, 4, 6]);
        assert_close(&stacked.to_vec::<f32>().unwrap(), &reference(&av, &f64s(&c), 1, 8, 5, 6), 1e-5);
    }

    #[test]
    fn many_batches_run_in_parallel() {
        let a = random(&[16, 40, 50], 8);
        let b = random(&[16, 50, 60], 9);
        let out = a.matmul(&b).unwrap().to_vec::<f32>().unwrap();
        assert_close(&out, &reference(&f64s(&a), &f64s(&b), 16, 40, 50, 60), 1e-5);
    }

    #[test]
    fn transposed_views_are_read_in_place() {
        let a = random(&[7, 9], 10);
        let bt = random(&[11, 9], 11);
        let b = bt.transpose(0, 1).unwrap();
        let expected = reference(&f64s(&a), &f64s(&b.contiguous()), 1, 7, 9, 11);
        assert_close(&a.matmul(&b).unwrap().to_vec::<f32>().unwrap(), &expected, 1e-5);
        let at = a.contiguous().transpose(0, 1).unwrap().contiguous().transpose(0, 1).unwrap();
        assert!(!at.is_contiguous());
        assert_close(&at.matmul(&b).unwrap().to_vec::<f32>().unwrap(), &expected, 1e-5);
        // Batched, with permuted heads: [batch, seq, heads, d] viewed as [batch, heads, seq, d].
        let q = random(&[2, 5, 3, 4], 12).permute(&[0, 2, 1, 3]).unwrap();
        let k = random(&[2, 5, 3, 4], 13).permute(&[0, 2, 3, 1]).unwrap();
        let scores = q.matmul(&k).unwrap();
        assert_eq!(scores.shape(), [2, 3, 5, 5]);
        let (qv, kv) = (f64s(&q.contiguous()), f64s(&k.contiguous()));
        assert_close(&scores.to_vec::<f32>().unwrap(), &reference(&qv, &kv, 6, 5, 4, 5), 1e-5);
    }

    #[test]
    fn half_precision_inputs_accumulate_in_f32() {
        let a = random(&[6, 40], 14);
        let b = random(&[40, 8], 15);
        for dtype in [DType::BF16, DType::F16, DType::F64] {
            let (ah, bh) = (cast(&a, dtype), cast(&b, dtype));
            let out = ah.matmul(&bh.contiguous()).unwrap();
            assert_eq!(out.dtype(), DType::F32);
            assert_close(&out.to_vec::<f32>().unwrap(), &reference(&f64s(&ah), &f64s(&bh), 1, 6, 40, 8), 1e-5);
        }
        let mixed = cast(&a, DType::BF16).matmul(&cast(&b, DType::F16)).unwrap();
        let expected = reference(&f64s(&cast(&a, DType::BF16)), &f64s(&cast(&b, DType::F16)), 1, 6, 40, 8);
        assert_close(&mixed.to_vec::<f32>().unwrap(), &expected, 1e-5);
        let one = Tensor::from_vec(vec![bf16::from_f32(2.0)], &[1, 1]).unwrap();
        let other = Tensor::from_vec(vec![f16::from_f32(3.0)], &[1, 1]).unwrap();
        assert_eq!(one.matmul(&other).unwrap().to_vec::<f32>().unwrap(), [6.0]);
    }

    #[test]
    fn empty_and_bad_shapes() {
        let empty = Tensor::zeros(DType::F32, &[3, 0]).matmul(&Tensor::zeros(DType::F32, &[0, 4])).unwrap();
        assert_eq!(empty.to_vec::<f32>().unwrap(), [0.0; 12]);
        let a = random(&[2, 3], 16);
        assert!(matches!(a.matmul(&random(&[4, 2], 17)), Err(Error::ShapeMismatch { .. })));
        assert!(matches!(random(&[2, 2, 3], 1).matmul(&random(&[3, 3, 2], 2)), Err(Error::ShapeMismatch { .. })));
        assert!(matches!(a.matmul(&random(&[3], 18)), Err(Error::BadShape { .. })));
        let message = a.matmul(&random(&[4, 2], 17)).unwrap_err().to_string();
        assert!(message.contains("[2, 3]") && message.contains("[4, 2]"), "{message}");
    }

    #[test]
    fn linear_matches_pytorch() {
        let x = random(&[2, 3, 10], 19);
        let weight = random(&[4, 10], 20);
        let bias = random(&[4], 21);
        let out = x.linear(&weight, Some(&bias)).unwrap();
        assert_eq!(out.shape(), [2, 3, 4]);
        let mut expected = reference(&f64s(&x), &f64s(&weight.transpose(0, 1).unwrap().contiguous()), 1, 6, 10, 4);
        let bias_values = f64s(&bias);
        for (index, value) in expected.iter_mut().enumerate() {
            *value += bias_values[index % 4];
        }
        assert_close(&out.to_vec::<f32>().unwrap(), &expected, 1e-5);
        // bf16 weights, no bias, a rank-1 input.
        let row = random(&[10], 22);
        let bf = cast(&weight, DType::BF16);
        let out = row.linear(&bf, None).unwrap();
        assert_eq!(out.shape(), [4]);
        let expected = reference(&f64s(&row), &f64s(&bf.transpose(0, 1).unwrap().contiguous()), 1, 1, 10, 4);
        assert_close(&out.to_vec::<f32>().unwrap(), &expected, 1e-5);
        // A weight stored transposed (`[in, out]`) and viewed back as `[out, in]`.
        let stored = weight.transpose(0, 1).unwrap().contiguous();
        let viewed = stored.transpose(0, 1).unwrap();
        assert_close(
            &x.linear(&viewed, None).unwrap().to_vec::<f32>().unwrap(),
            &f64s(&x.linear(&weight, None).unwrap()),
            1e-6,
        );
        assert!(matches!(x.linear(&random(&[4, 9], 23), None), Err(Error::ShapeMismatch { .. })));
        assert!(matches!(x.linear(&weight, Some(&random(&[5], 24))), Err(Error::ShapeMismatch { .. })));
    }
}
