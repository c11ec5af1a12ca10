//! Row-wise kernels: softmax, layer and RMS normalisation, L2 normalisation and mean pooling.

use rayon::prelude::*;

use super::{PARALLEL_ELEMENTS, f32_tensor, f32_values, parameter};
use crate::Tensor;
use crate::error::{Error, Result};
use crate::shape::{check_mean_pool, last_axis};

/// Applies `f` to each row of `width` values, on all cores when there are many values.
fn for_each_row(values: &mut [f32], width: usize, f: impl Fn(&mut [f32]) + Sync + Send) {
    if width == 0 {
        return;
    }
    if values.len() >= PARALLEL_ELEMENTS {
        values.par_chunks_mut(width).for_each(f);
    } else {
        values.chunks_mut(width).for_each(f);
    }
}

/// A numerically stable softmax of one row, in place. A row with no finite maximum (all
/// `-inf`, as after masking everything) becomes zeros.
pub(crate) fn softmax_row(row: &mut [f32]) {
    let max = row.iter().fold(f32::NEG_INFINITY, |max, &value| max.max(value));
    if max == f32::NEG_INFINITY {
        row.fill(0.0);
        return;
    }
    let mut sum = 0.0f32;
    for value in row.iter_mut() {
        *value = (*value - max).exp();
        sum += *value;
    }
    let inverse = 1.0 / sum;
    row.iter_mut().for_each(|value| *value *= inverse);
}

impl Tensor {
    /// The softmax along `axis`, computed stably (the row maximum is subtracted first). A slice
    /// whose values are all `-inf` gives zeros.
    ///
    /// # Errors
    /// [`Error::AxisOutOfRange`], [`Error::NotFloat`], [`Error::Meta`].
    ///
    /// # Examples
    /// ```
    /// use nnx_core::Tensor;
    /// let x = Tensor::from_vec(vec![0.0f32, 0.0, 1000.0, 1000.0], &[2, 2])?;
    /// assert_eq!(x.softmax(0)?.to_vec::<f32>()?, [0.0, 0.0, 1.0, 1.0]);
    /// assert_eq!(x.softmax(1)?.to_vec::<f32>()?, [0.5, 0.5, 0.5, 0.5]);
    /// # Ok::<(), nnx_core::Error>(())
    /// ```
    pub fn softmax(&self, axis: usize) -> Result<Tensor> {
        const OP: &str = "softmax";
        if axis >= self.rank() {
            return Err(Error::AxisOutOfRange { axis, rank: self.rank(), shape: self.shape().to_vec() });
        }
        if axis + 1 == self.rank() {
            return self.softmax_last();
        }
        // Move the axis last, take row softmaxes, and move it back.
        let moved = self.transpose(axis, self.rank() - 1)?;
        let mut values = f32_values(&moved, OP)?;
        for_each_row(&mut values, self.shape()[axis], softmax_row);
        f32_tensor(values, moved.shape())?.transpose(axis, self.rank() - 1).map(|back| back.contiguous())
    }

    /// The softmax along the last axis (see [`Tensor::softmax`]).
    ///
    /// # Errors
    /// [`Error::BadShape`] for rank 0, [`Error::NotFloat`], [`Error::Meta`].
    pub fn softmax_last(&self) -> Result<Tensor> {
        const OP: &str = "softmax_last";
        let width = last_axis(self.shape(), OP)?;
        let mut values = f32_values(self, OP)?;
        for_each_row(&mut values, width, softmax_row);
        f32_tensor(values, self.shape())
    }

    /// Layer normalisation over the last axis as PyTorch computes it: `(x - mean) /
    /// sqrt(var + eps) * weight + bias`, with the biased variance, in f32.
    ///
    /// # Errors
    /// [`Error::BadShape`] for rank 0, [`Error::ShapeMismatch`] when `weight` or `bias` is not
    /// `[dim]`, [`Error::NotFloat`], [`Error::Meta`].
    ///
    /// # Examples
    /// ```
    /// use nnx_core::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 3.0], &[1, 2])?;
    /// assert_eq!(x.layer_norm(None, None, 0.0)?.to_vec::<f32>()?, [-1.0, 1.0]);
    /// # Ok::<(), nnx_core::Error>(())
    /// ```
    pub fn layer_norm(&self, weight: Option<&Tensor>, bias: Option<&Tensor>, eps: f32) -> Result<Tensor> {
        const OP: &str = "layer_norm";
        let width = last_axis(self.shape(), OP)?;
        let weight = parameter(weight, width, self, OP, "the weight must be `[dim]` for an input `[.., dim]`")?;
        let bias = parameter(bias, width, self, OP, "the bias must be `[dim]` for an input `[.., dim]`")?;
        let mut values = f32_values(self, OP)?;
        for_each_row(&mut values, width, |row| {
            let mean = row.iter().sum::<f32>() / width as f32;
            let variance = row.iter().map(|&x| (x - mean) * (x - mean)).sum::<f32>() / width as f32;
            let inverse = 1.0 / (variance + eps).sqrt();
            row.iter_mut().for_each(|x| *x = (*x - mean) * inverse);
            if let Some(weight) = &weight {
                row.iter_mut().zip(weight).for_each(|(x, &w)| *x *= w);
            }
            if let Some(bias) = &bias {
                row.iter_mut().zip(bias).for_each(|(x, &b)| *x += b);
            }
        });
        f32_tensor(values, self.shape())
    }

    /// RMS normalisation over the last axis as Llama computes it: `x / sqrt(mean(x²) + eps) *
    /// weight`, in f32.
    ///
    /// # Errors
    /// [`Error::BadShape`] for rank 0, [`Error::ShapeMismatch`] when `weight` is not `[dim]`,
    /// [`Error::NotFloat`], [`Error::Meta`].
    ///
    /// # Examples
    /// ```
    /// use nnx_core::Tensor;
    /// let x = Tensor::from_vec(vec![2.0f32, -2.0, 2.0, -2.0], &[1, 4])?;
    /// let weight = Tensor::from_vec(vec![1.0f32, 1.0, 0.5, 3.0], &[4])?;
    /// assert_eq!(x.rms_norm(Some(&weight), 0.0)?.to_vec::<f32>()?, [1.0, -1.0, 0.5, -3.0]);
    /// # Ok::<(), nnx_core::Error>(())
    /// ```
    pub fn rms_norm(&self, weight: Option<&Tensor>, eps: f32) -> Result<Tensor> {
        const OP: &str = "rms_norm";
        let width = last_axis(self.shape(), OP)?;
        let weight = parameter(weight, width, self, OP, "the weight must be `[dim]` for an input `[.., dim]`")?;
        let mut values = f32_values(self, OP)?;
        for_each_row(&mut values, width, |row| {
            let mean_square = row.iter().map(|&x| x * x).sum::<f32>() / width as f32;
            let inverse = 1.0 / (mean_square + eps).sqrt();
            match &weight {
                Some(weight) => row.iter_mut().zip(weight).for_each(|(x, &w)| *x = *x * inverse * w),
                None => row.iter_mut().for_each(|x| *x *= inverse),
            }
        });
        f32_tensor(values, self.shape())
    }

    /// Each row of the last axis divided by its Euclidean norm: `x / max(‖x‖, 1e-12)`.
    ///
    /// # Errors
    /// [`Error::BadShape`] for rank 0, [`Error::NotFloat`], [`Error::Meta`].
    pub fn l2_normalize(&self) -> Result<Tensor> {
        const OP: &str = "l2_normalize";
        let width = last_axis(self.shape(), OP)?;
        let mut values = f32_values(self, OP)?;
        for_each_row(&mut values, width, |row| {
            let norm = row.iter().map(|&x| x * x).sum::<f32>().sqrt();
            let divisor = norm.max(1e-12);
            row.iter_mut().for_each(|x| *x /= divisor);
        });
        f32_tensor(values, self.shape())
    }

    /// Mean pooling as sentence-transformers does it: `x` `[batch, seq, dim]` to `[batch, dim]`,
    /// the mean over the positions whose `mask` entry (`batch * seq` of them, row-major) is
    /// true. A row with no true entry gives zeros.
    ///
    /// # Errors
    /// [`Error::BadShape`] unless `x` has rank 3, [`Error::LengthMismatch`] when `mask` does not
    /// have `batch * seq` entries, [`Error::NotFloat`], [`Error::Meta`].
    ///
    /// # Examples
    /// ```
    /// use nnx_core::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 100.0, 100.0], &[1, 3, 2])?;
    /// assert_eq!(x.mean_pool(&[true, true, false])?.to_vec::<f32>()?, [2.0, 3.0]);
    /// # Ok::<(), nnx_core::Error>(())
    /// ```
    pub fn mean_pool(&self, mask: &[bool]) -> Result<Tensor> {
        const OP: &str = "mean_pool";
        let [batch, seq, dim] = check_mean_pool(self, mask)?;
        let values = f32_values(self, OP)?;
        let mut out = vec![0.0f32; batch * dim];
        if dim > 0 {
            out.chunks_mut(dim).enumerate().for_each(|(b, pooled)| {
                let mut count = 0.0f32;
                for s in (0..seq).filter(|&s| mask[b * seq + s]) {
                    count += 1.0;
                    let row = &values[(b * seq + s) * dim..(b * seq + s + 1) * dim];
                    pooled.iter_mut().zip(row).for_each(|(p, &x)| *p += x);
                }
                let inverse = 1.0 / count.max(1e-9);
                pooled.iter_mut().for_each(|p| *p *= inverse);
            });
        }
        f32_tensor(out, &[batch, dim])
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{assert_close, cast, random};
    use super::*;
    use crate::DType;

    fn f64s(tensor: &Tensor) -> Vec<f64> {
        tensor.to_f32_vec().unwrap().into_iter().map(f64::from).collect()
    }

    /// Softmax of each row of `width` values, in f64.
    fn softmax_rows(values: &[f64], width: usize) -> Vec<f64> {
        values
            .chunks(width)
            .flat_map(|row| {
                let max = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let sum: f64 = row.iter().map(|x| (x - max).exp()).sum();
                row.iter().map(move |x| (x - max).exp() / sum)
            })
            .collect()
    }

    #[test]
    fn softmax_along_each_axis() {
        let x = random(&[3, 4, 5], 1).scale(10.0).unwrap();
        let last = x.softmax_last().unwrap();
        assert_close(&last.to_vec::<f32>().unwrap(), &softmax_rows(&f64s(&x), 5), 1e-6);
        assert_eq!(x.softmax(2).unwrap().to_vec::<f32>().unwrap(), last.to_vec::<f32>().unwrap());
        let middle = x.softmax(1).unwrap();
        assert_eq!(middle.shape(), [3, 4, 5]);
        let moved = x.transpose(1, 2).unwrap();
        let expected =
            f32_tensor(softmax_rows(&f64s(&moved), 4).into_iter().map(|v| v as f32).collect(), moved.shape())
                .unwrap()
                .transpose(1, 2)
                .unwrap();
        assert_close(&middle.to_vec::<f32>().unwrap(), &f64s(&expected), 1e-6);
        assert!(matches!(x.softmax(3), Err(Error::AxisOutOfRange { .. })));
    }

    #[test]
    fn softmax_is_stable_and_handles_masked_rows() {
        let x = Tensor::from_vec(vec![1e4f32, 1e4 + 1.0, f32::NEG_INFINITY, f32::NEG_INFINITY], &[2, 2]).unwrap();
        let out = x.softmax_last().unwrap().to_vec::<f32>().unwrap();
        assert_close(&out[..2], &[0.268_941_421, 0.731_058_579], 1e-6);
        assert_eq!(out[2..], [0.0, 0.0]);
        let large = random(&[300, 500], 2);
        let sums: Vec<f32> =
            large.softmax_last().unwrap().to_vec::<f32>().unwrap().chunks(500).map(|r| r.iter().sum()).collect();
        assert!(sums.iter().all(|s| (s - 1.0).abs() < 1e-5));
    }

    #[test]
    fn layer_norm_known_values() {
        let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, -1.0, -1.0, -1.0, -1.0], &[2, 4]).unwrap();
        let weight = Tensor::from_vec(vec![1.0f32, 2.0, 0.5, -1.0], &[4]).unwrap();
        let bias = Tensor::from_vec(vec![0.0f32, 0.1, 0.2, 0.3], &[4]).unwrap();
        let out = x.layer_norm(Some(&weight), Some(&bias), 1e-5).unwrap();
        // Row 1: mean 2.5, biased variance 1.25.
        let scale = 1.0 / (1.25f64 + 1e-5).sqrt();
        let expected = [-1.5 * scale, 0.1 - scale, 0.2 + 0.25 * scale, 0.3 - 1.5 * scale, 0.0, 0.1, 0.2, 0.3];
        assert_close(&out.to_vec::<f32>().unwrap(), &expected, 1e-6);
        let half = cast(&x, DType::BF16).layer_norm(None, None, 1e-5).unwrap();
        assert_eq!(half.dtype(), DType::F32);
        assert!(matches!(
            x.layer_norm(Some(&bias.narrow(0, 0, 3).unwrap()), None, 1e-5),
            Err(Error::ShapeMismatch { .. })
        ));
    }

    #[test]
    fn layer_norm_matches_reference_on_large_input() {
        let x = random(&[256, 384], 3).add_scalar(2.0).unwrap();
        let out = x.layer_norm(None, None, 1e-12).unwrap().to_vec::<f32>().unwrap();
        let expected: Vec<f64> = f64s(&x)
            .chunks(384)
            .flat_map(|row| {
                let mean = row.iter().sum::<f64>() / 384.0;
                let variance = row.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / 384.0;
                row.iter().map(move |x| (x - mean) / (variance + 1e-12).sqrt())
            })
            .collect();
        assert_close(&out, &expected, 1e-4);
    }

    #[test]
    fn rms_norm_known_values() {
        let x = Tensor::from_vec(vec![1.0f32, -2.0, 3.0, -4.0], &[1, 4]).unwrap();
        let weight = Tensor::from_vec(vec![1.0f32, 0.5, 2.0, 1.0], &[4]).unwrap();
        let out = x.rms_norm(Some(&cast(&weight, DType::BF16)), 1e-6).unwrap();
        // mean(x²) = 7.5.
        let inverse = 1.0 / (7.5f64 + 1e-6).sqrt();
        assert_close(&out.to_vec::<f32>().unwrap(), &[inverse, -inverse, 6.0 * inverse, -4.0 * inverse], 1e-6);
        assert!(matches!(x.rms_norm(Some(&x), 1e-6), Err(Error::ShapeMismatch { .. })));
        assert!(matches!(Tensor::zeros(DType::F32, &[]).rms_norm(None, 1e-6), Err(Error::BadShape { .. })));
    }

    #[test]
    fn l2_normalize_rows() {
        let x = Tensor::from_vec(vec![3.0f32, 4.0, 0.0, 0.0], &[2, 2]).unwrap();
        assert_eq!(x.l2_normalize().unwrap().to_vec::<f32>().unwrap(), [0.6, 0.8, 0.0, 0.0]);
    }

    #[test]
    fn mean_pool_with_padding() {
        let x = random(&[2, 3, 4], 4);
        let mask = [true, true, true, true, false, false];
        let out = x.mean_pool(&mask).unwrap();
        assert_eq!(out.shape(), [2, 4]);
        let v = f64s(&x);
        let expected: Vec<f64> =
            (0..4).map(|d| (v[d] + v[4 + d] + v[8 + d]) / 3.0).chain((0..4).map(|d| v[12 + d])).collect();
        assert_close(&out.to_vec::<f32>().unwrap(), &expected, 1e-6);
        let none = x.mean_pool(&[false; 6]).unwrap().to_vec::<f32>().unwrap();
        assert!(none.iter().all(|&v| v == 0.0));
        assert!(matches!(x.mean_pool(&[true; 5]), Err(Error::LengthMismatch { .. })));
        assert!(matches!(random(&[2, 3], 5).mean_pool(&[true; 6]), Err(Error::BadShape { .. })));
    }
}
