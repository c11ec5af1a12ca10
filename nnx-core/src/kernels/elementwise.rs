//! Elementwise kernels: arithmetic with numpy broadcasting, scalar arithmetic and activations.

use rayon::prelude::*;

use super::{Dense, PARALLEL_ELEMENTS, f32_tensor, f32_values, strided_offset};
#[cfg(doc)]
use crate::error::Error;
use crate::error::Result;
use crate::shape::{broadcast_strides, check_broadcast};
use crate::{Host, OnDevice, Tensor};

/// `sqrt(2 / pi)`, the scale inside GPT-2's tanh approximation of GELU.
const SQRT_2_OVER_PI: f32 = 0.797_884_6;

/// Applies `f` to every value of a fresh buffer, on all cores when it is large.
fn map_in_place(values: &mut [f32], f: impl Fn(f32) -> f32 + Sync) {
    if values.len() >= PARALLEL_ELEMENTS {
        values.par_chunks_mut(1 << 14).for_each(|chunk| chunk.iter_mut().for_each(|value| *value = f(*value)));
    } else {
        values.iter_mut().for_each(|value| *value = f(*value));
    }
}

impl Tensor {
    /// `f` applied to every element, as an f32 tensor of the same shape.
    fn unary(&self, op: &'static str, f: impl Fn(f32) -> f32 + Sync) -> Result<Tensor> {
        let mut values = f32_values(self, op)?;
        map_in_place(&mut values, f);
        f32_tensor(values, self.shape())
    }

    /// `f(lhs, rhs)` elementwise over the broadcast shape of the two operands.
    fn binary(&self, rhs: &Tensor, op: &'static str, f: impl Fn(f32, f32) -> f32 + Sync) -> Result<Tensor> {
        let shape = check_broadcast(self, rhs, op)?;
        // The common case, equal shapes: one pass over both value lists.
        if self.shape() == rhs.shape() {
            let mut values = f32_values(self, op)?;
            let other = f32_values(rhs, op)?;
            let combine = |(a, &b): (&mut f32, &f32)| *a = f(*a, b);
            if values.len() >= PARALLEL_ELEMENTS {
                values.par_iter_mut().zip(other.par_iter()).for_each(combine);
            } else {
                values.iter_mut().zip(other.iter()).for_each(combine);
            }
            return f32_tensor(values, &shape);
        }
        let left = Dense::new(self, op)?;
        let right = Dense::new(rhs, op)?;
        let left_strides = broadcast_strides(left.shape(), left.strides(), &shape);
        let right_strides = broadcast_strides(right.shape(), right.strides(), &shape);
        let len: usize = shape.iter().product();
        let mut out = vec![0.0f32; len];
        let Some(&width) = shape.last() else {
            return f32_tensor(out, &shape);
        };
        if width == 0 {
            return f32_tensor(out, &shape);
        }
        let (left_data, right_data) = (left.data(), right.data());
        let (left_step, right_step) = (left_strides[shape.len() - 1], right_strides[shape.len() - 1]);
        let fill_row = |row: usize, dst: &mut [f32]| {
            let a = strided_offset(row * width, &shape, &left_strides);
            let b = strided_offset(row * width, &shape, &right_strides);
            match (left_step, right_step) {
                (1, 1) => {
                    let (a, b) = (&left_data[a..a + width], &right_data[b..b + width]);
                    dst.iter_mut().zip(a.iter().zip(b)).for_each(|(d, (&x, &y))| *d = f(x, y));
                }
                (1, 0) => {
                    let y = right_data[b];
                    dst.iter_mut().zip(&left_data[a..a + width]).for_each(|(d, &x)| *d = f(x, y));
                }
                (0, 1) => {
                    let x = left_data[a];
                    dst.iter_mut().zip(&right_data[b..b + width]).for_each(|(d, &y)| *d = f(x, y));
                }
                _ => {
                    for (i, d) in dst.iter_mut().enumerate() {
                        *d = f(left_data[a + i * left_step], right_data[b + i * right_step]);
                    }
                }
            }
        };
        if len >= PARALLEL_ELEMENTS {
            out.par_chunks_mut(width).enumerate().for_each(|(row, dst)| fill_row(row, dst));
        } else {
            out.chunks_mut(width).enumerate().for_each(|(row, dst)| fill_row(row, dst));
        }
        f32_tensor(out, &shape)
    }

    /// `self + rhs` elementwise, with numpy broadcasting.
    ///
    /// # Errors
    /// [`Error::ShapeMismatch`] when the shapes do not broadcast, [`Error::NotFloat`],
    /// [`Error::Meta`].
    ///
    /// # Examples
    /// ```
    /// use nnx_core::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[2, 2])?;
    /// let row = Tensor::from_vec(vec![10.0f32, 20.0], &[2])?;
    /// assert_eq!(x.add(&row)?.to_vec::<f32>()?, [11.0, 22.0, 13.0, 24.0]);
    /// # Ok::<(), nnx_core::Error>(())
    /// ```
    pub fn add(&self, rhs: &impl OnDevice<Host>) -> Result<Tensor> {
        self.binary(rhs.on_device(), "add", |a, b| a + b)
    }

    /// `self - rhs` elementwise, with numpy broadcasting.
    ///
    /// # Errors
    /// As [`Tensor::add`].
    pub fn sub(&self, rhs: &impl OnDevice<Host>) -> Result<Tensor> {
        self.binary(rhs.on_device(), "sub", |a, b| a - b)
    }

    /// `self * rhs` elementwise, with numpy broadcasting.
    ///
    /// # Errors
    /// As [`Tensor::add`].
    pub fn mul(&self, rhs: &impl OnDevice<Host>) -> Result<Tensor> {
        self.binary(rhs.on_device(), "mul", |a, b| a * b)
    }

    /// `self / rhs` elementwise, with numpy broadcasting (IEEE division: `x / 0` is infinite).
    ///
    /// # Errors
    /// As [`Tensor::add`].
    pub fn div(&self, rhs: &impl OnDevice<Host>) -> Result<Tensor> {
        self.binary(rhs.on_device(), "div", |a, b| a / b)
    }

    /// Every element times `factor`.
    ///
    /// # Errors
    /// [`Error::NotFloat`], [`Error::Meta`].
    pub fn scale(&self, factor: f32) -> Result<Tensor> {
        self.unary("scale", |x| x * factor)
    }

    /// Every element plus `value`.
    ///
    /// # Errors
    /// [`Error::NotFloat`], [`Error::Meta`].
    pub fn add_scalar(&self, value: f32) -> Result<Tensor> {
        self.unary("add_scalar", |x| x + value)
    }

    /// GELU in its exact form, `x/2 · (1 + erf(x / √2))` (PyTorch's default `gelu`).
    ///
    /// # Errors
    /// [`Error::NotFloat`], [`Error::Meta`].
    pub fn gelu(&self) -> Result<Tensor> {
        self.unary("gelu", |x| 0.5 * x * (1.0 + libm::erff(x * std::f32::consts::FRAC_1_SQRT_2)))
    }

    /// GELU's tanh approximation, `x/2 · (1 + tanh(√(2/π) · (x + 0.044715 x³)))` (GPT-2's
    /// `gelu_new`, PyTorch's `gelu(approximate="tanh")`).
    ///
    /// # Errors
    /// [`Error::NotFloat`], [`Error::Meta`].
    pub fn gelu_tanh(&self) -> Result<Tensor> {
        self.unary("gelu_tanh", |x| 0.5 * x * (1.0 + (SQRT_2_OVER_PI * (x + 0.044_715 * x * x * x)).tanh()))
    }

    /// SiLU (swish), `x · sigmoid(x)`.
    ///
    /// # Errors
    /// [`Error::NotFloat`], [`Error::Meta`].
    pub fn silu(&self) -> Result<Tensor> {
        self.unary("silu", |x| x / (1.0 + (-x).exp()))
    }

    /// `max(x, 0)`.
    ///
    /// # Errors
    /// [`Error::NotFloat`], [`Error::Meta`].
    pub fn relu(&self) -> Result<Tensor> {
        self.unary("relu", |x| x.max(0.0))
    }

    /// The hyperbolic tangent.
    ///
    /// # Errors
    /// [`Error::NotFloat`], [`Error::Meta`].
    pub fn tanh(&self) -> Result<Tensor> {
        self.unary("tanh", f32::tanh)
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{assert_close, cast, random};
    use super::*;
    use crate::DType;
    use crate::error::Error;
    use crate::shape::broadcast_shape;

    /// `f(a, b)` over numpy-broadcast operands, computed index by index in f64.
    fn reference(a: &Tensor, b: &Tensor, f: impl Fn(f64, f64) -> f64) -> Vec<f64> {
        let shape = broadcast_shape(a.shape(), b.shape()).unwrap();
        let av = a.contiguous().to_f32_vec().unwrap();
        let bv = b.contiguous().to_f32_vec().unwrap();
        let index = |flat: usize, of: &[usize]| {
            // Row-major index of the broadcast element in an operand of shape `of`.
            let mut rest = flat;
            let mut coordinates = vec![0; shape.len()];
            for axis in (0..shape.len()).rev() {
                coordinates[axis] = rest % shape[axis];
                rest /= shape[axis];
            }
            let lead = shape.len() - of.len();
            of.iter()
                .enumerate()
                .fold(0, |at, (axis, &size)| at * size + if size == 1 { 0 } else { coordinates[lead + axis] })
        };
        (0..shape.iter().product())
            .map(|flat| f(f64::from(av[index(flat, a.shape())]), f64::from(bv[index(flat, b.shape())])))
            .collect()
    }

    #[test]
    fn arithmetic_broadcasts() {
        let cases: [(&[usize], &[usize]); 5] =
            [(&[2, 3, 4], &[2, 3, 4]), (&[2, 3, 4], &[4]), (&[2, 1, 4], &[3, 1]), (&[1], &[5, 2]), (&[3, 1], &[1, 3])];
        for (index, (a_shape, b_shape)) in cases.into_iter().enumerate() {
            let a = random(a_shape, index as u64);
            let b = random(b_shape, 100 + index as u64).add_scalar(3.0).unwrap();
            assert_close(&a.add(&b).unwrap().to_f32_vec().unwrap(), &reference(&a, &b, |x, y| x + y), 1e-6);
            assert_close(&a.sub(&b).unwrap().to_f32_vec().unwrap(), &reference(&a, &b, |x, y| x - y), 1e-6);
            assert_close(&a.mul(&b).unwrap().to_f32_vec().unwrap(), &reference(&a, &b, |x, y| x * y), 1e-6);
            assert_close(&a.div(&b).unwrap().to_f32_vec().unwrap(), &reference(&a, &b, |x, y| x / y), 1e-6);
        }
    }

    #[test]
    fn arithmetic_on_views_and_half_precision() {
        let a = random(&[4, 6], 1).transpose(0, 1).unwrap();
        let b = cast(&random(&[4], 2), DType::BF16);
        let sum = a.add(&b).unwrap();
        assert_eq!((sum.shape(), sum.dtype()), (&[6, 4][..], DType::F32));
        assert_close(&sum.to_f32_vec().unwrap(), &reference(&a, &b, |x, y| x + y), 1e-6);
        let c = cast(&random(&[6, 1], 3), DType::F16);
        assert_close(&a.mul(&c).unwrap().to_f32_vec().unwrap(), &reference(&a, &c, |x, y| x * y), 1e-6);
        let big = random(&[300, 300], 4);
        let column = random(&[300, 1], 5);
        assert_close(&big.sub(&column).unwrap().to_f32_vec().unwrap(), &reference(&big, &column, |x, y| x - y), 1e-6);
        assert_close(
            &big.mul(&big.transpose(0, 1).unwrap()).unwrap().to_f32_vec().unwrap(),
            &reference(&big, &big.transpose(0, 1).unwrap(), |x, y| x * y),
            1e-6,
        );
    }

    #[test]
    fn arithmetic_refuses_bad_shapes() {
        let error = random(&[2, 3], 1).add(&random(&[2], 2)).unwrap_err();
        assert!(matches!(error, Error::ShapeMismatch { op: "add", .. }));
        assert!(error.to_string().contains("[2, 3]"));
        let ints = Tensor::from_vec(vec![1i64, 2], &[2]).unwrap();
        assert!(matches!(ints.mul(&random(&[2], 3)), Err(Error::NotFloat { .. })));
    }

    #[test]
    fn scalars_and_activations() {
        let x = Tensor::from_vec(vec![-3.0f32, -1.0, -0.5, 0.0, 0.5, 1.0, 3.0], &[7]).unwrap();
        let values: Vec<f64> = x.to_f32_vec().unwrap().into_iter().map(f64::from).collect();
        let check = |found: Tensor, f: &dyn Fn(f64) -> f64| {
            assert_close(&found.to_f32_vec().unwrap(), &values.iter().map(|&v| f(v)).collect::<Vec<_>>(), 2e-6);
        };
        check(x.scale(2.5).unwrap(), &|v| v * 2.5);
        check(x.add_scalar(-1.0).unwrap(), &|v| v - 1.0);
        check(x.relu().unwrap(), &|v| v.max(0.0));
        check(x.tanh().unwrap(), &f64::tanh);
        check(x.silu().unwrap(), &|v| v / (1.0 + (-v).exp()));
        let c = (2.0 / std::f64::consts::PI).sqrt();
        check(x.gelu_tanh().unwrap(), &|v| 0.5 * v * (1.0 + (c * (v + 0.044715 * v * v * v)).tanh()));
        // GELU against `x/2 · (1 + erf(x / √2))` evaluated in f64.
        let exact = [
            -0.004_049_694_1,
            -0.158_655_253_9,
            -0.154_268_769_4,
            0.0,
            0.345_731_230_6,
            0.841_344_746_1,
            2.995_950_305_9,
        ];
        check(x.gelu().unwrap(), &|v| exact[values.iter().position(|&w| w == v).unwrap()]);
        let large = random(&[100_000], 9);
        let relu = large.relu().unwrap().to_f32_vec().unwrap();
        assert!(relu.iter().zip(large.to_f32_vec().unwrap()).all(|(&r, v)| r == v.max(0.0)));
        assert_eq!(cast(&x, DType::BF16).relu().unwrap().dtype(), DType::F32);
    }
}
