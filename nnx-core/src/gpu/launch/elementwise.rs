//! Elementwise kernels on the GPU (`elementwise.wgsl`): arithmetic with numpy broadcasting,
//! scalar arithmetic and activations, and float casts (`cast.wgsl`). Operands are read through
//! their strides, so views and broadcasts cost no copy.

use super::{
    Axes, axes, collapse, count, float_kind, kernel_source, kind, launch, output, reach, same_device, storage, uniform,
    word,
};
use crate::error::{Error, Result};
use crate::gpu::Gpu;
use crate::shape::{broadcast_strides, check_broadcast, check_float};
use crate::{DType, OnDevice, Tensor};

const ELEMENTWISE: &str = kernel_source!("elementwise.wgsl");
const CAST: &str = kernel_source!("cast.wgsl");

uniform! {
    /// The parameters of `elementwise.wgsl`.
    struct ElementwiseParams {
        count: u32,
        rank: u32,
        op: u32,
        /// The scalar of `scale` and `add_scalar`, as f32 bits.
        scalar: u32,
        a_kind: u32,
        a_offset: u32,
        b_kind: u32,
        b_offset: u32,
        shape: Axes,
        a_strides: Axes,
        b_strides: Axes,
    }
}

uniform! {
    /// The parameters of `cast.wgsl`.
    struct CastParams {
        count: u32,
        rank: u32,
        in_kind: u32,
        out_kind: u32,
        offset: u32,
        _pad0: u32,
        _pad1: u32,
        _pad2: u32,
        shape: Axes,
        strides: Axes,
    }
}

/// The operations of `elementwise.wgsl`, by their code there.
#[derive(Clone, Copy)]
enum Op {
    Add = 0,
    Sub = 1,
    Mul = 2,
    Div = 3,
    Scale = 4,
    AddScalar = 5,
    Gelu = 6,
    GeluTanh = 7,
    Silu = 8,
    Relu = 9,
    Tanh = 10,
}

/// `op` over the broadcast shape `shape`, reading `a` and `b` through `a_strides` and
/// `b_strides` (a unary op passes `a` twice).
#[allow(clippy::too_many_arguments)]
fn run(
    name: &'static str,
    op: Op,
    scalar: f32,
    a: &Tensor<Gpu>,
    b: &Tensor<Gpu>,
    shape: &[usize],
    a_strides: &[usize],
    b_strides: &[usize],
) -> Result<Tensor<Gpu>> {
    let gpu = a.device();
    let elements = count(gpu, name, shape)?;
    let out = output(gpu, elements)?;
    if elements > 0 {
        reach(gpu, name, a.offset(), shape, a_strides)?;
        reach(gpu, name, b.offset(), shape, b_strides)?;
        let (sizes, strides) = collapse(gpu, name, shape, &[a_strides, b_strides])?;
        let params = ElementwiseParams {
            count: word(gpu, name, elements)?,
            rank: sizes.len() as u32,
            op: op as u32,
            scalar: scalar.to_bits(),
            a_kind: kind(a, name)?,
            a_offset: word(gpu, name, a.offset())?,
            b_kind: kind(b, name)?,
            b_offset: word(gpu, name, b.offset())?,
            shape: axes(gpu, name, &sizes, 1)?,
            a_strides: axes(gpu, name, &strides[0], 0)?,
            b_strides: axes(gpu, name, &strides[1], 0)?,
        };
        let buffers = [storage(a, name)?.into(), storage(b, name)?.into(), (&out).into()];
        launch(gpu, "elementwise", ELEMENTWISE, &params, &buffers, elements as u64)?;
    }
    Ok(gpu.tensor(Some(out), DType::F32, shape))
}

impl Tensor<Gpu> {
    fn binary(&self, rhs: &Tensor<Gpu>, name: &'static str, op: Op) -> Result<Tensor<Gpu>> {
        let shape = check_broadcast(self, rhs, name)?;
        same_device(name, self, &[Some(rhs)])?;
        let a_strides = broadcast_strides(self.shape(), self.strides(), &shape);
        let b_strides = broadcast_strides(rhs.shape(), rhs.strides(), &shape);
        run(name, op, 0.0, self, rhs, &shape, &a_strides, &b_strides)
    }

    fn unary(&self, name: &'static str, op: Op, scalar: f32) -> Result<Tensor<Gpu>> {
        check_float(self, name)?;
        run(name, op, scalar, self, self, self.shape(), self.strides(), self.strides())
    }

    /// `self + rhs` elementwise, with numpy broadcasting, on the GPU (see [`Tensor::add`]).
    ///
    /// # Errors
    /// [`Error::ShapeMismatch`] when the shapes do not broadcast, [`Error::NotFloat`],
    /// [`Error::Meta`]; [`Error::Gpu`] when the device fails or the operands live on
    /// different GPUs.
    pub fn add(&self, rhs: &impl OnDevice<Gpu>) -> Result<Tensor<Gpu>> {
        self.binary(rhs.on_device(), "add", Op::Add)
    }

    /// `self - rhs` elementwise, with numpy broadcasting.
    ///
    /// # Errors
    /// As [`Tensor::<Gpu>::add`].
    pub fn sub(&self, rhs: &impl OnDevice<Gpu>) -> Result<Tensor<Gpu>> {
        self.binary(rhs.on_device(), "sub", Op::Sub)
    }

    /// `self * rhs` elementwise, with numpy broadcasting.
    ///
    /// # Errors
    /// As [`Tensor::<Gpu>::add`].
    pub fn mul(&self, rhs: &impl OnDevice<Gpu>) -> Result<Tensor<Gpu>> {
        self.binary(rhs.on_device(), "mul", Op::Mul)
    }

    /// `self / rhs` elementwise, with numpy broadcasting.
    ///
    /// # Errors
    /// As [`Tensor::<Gpu>::add`].
    pub fn div(&self, rhs: &impl OnDevice<Gpu>) -> Result<Tensor<Gpu>> {
        self.binary(rhs.on_device(), "div", Op::Div)
    }

    /// Every element times `factor`.
    ///
    /// # Errors
    /// [`Error::NotFloat`], [`Error::Meta`], [`Error::Gpu`].
    pub fn scale(&self, factor: f32) -> Result<Tensor<Gpu>> {
        self.unary("scale", Op::Scale, factor)
    }

    /// Every element plus `value`.
    ///
    /// # Errors
    /// [`Error::NotFloat`], [`Error::Meta`], [`Error::Gpu`].
    pub fn add_scalar(&self, value: f32) -> Result<Tensor<Gpu>> {
        self.unary("add_scalar", Op::AddScalar, value)
    }

    /// GELU in its exact form, `x/2 · (1 + erf(x / √2))`, with the host's erf approximation.
    ///
    /// # Errors
    /// [`Error::NotFloat`], [`Error::Meta`], [`Error::Gpu`].
    pub fn gelu(&self) -> Result<Tensor<Gpu>> {
        self.unary("gelu", Op::Gelu, 0.0)
    }

    /// GELU's tanh approximation (GPT-2's `gelu_new`).
    ///
    /// # Errors
    /// [`Error::NotFloat`], [`Error::Meta`], [`Error::Gpu`].
    pub fn gelu_tanh(&self) -> Result<Tensor<Gpu>> {
        self.unary("gelu_tanh", Op::GeluTanh, 0.0)
    }

    /// SiLU (swish), `x · sigmoid(x)`.
    ///
    /// # Errors
    /// [`Error::NotFloat`], [`Error::Meta`], [`Error::Gpu`].
    pub fn silu(&self) -> Result<Tensor<Gpu>> {
        self.unary("silu", Op::Silu, 0.0)
    }

    /// `max(x, 0)`.
    ///
    /// # Errors
    /// [`Error::NotFloat`], [`Error::Meta`], [`Error::Gpu`].
    pub fn relu(&self) -> Result<Tensor<Gpu>> {
        self.unary("relu", Op::Relu, 0.0)
    }

    /// The hyperbolic tangent.
    ///
    /// # Errors
    /// [`Error::NotFloat`], [`Error::Meta`], [`Error::Gpu`].
    pub fn tanh(&self) -> Result<Tensor<Gpu>> {
        self.unary("tanh", Op::Tanh, 0.0)
    }

    /// The same values in another float dtype (f16, bf16, f32, f64), rounded to nearest-even
    /// as the host's casts round; the result is contiguous. The same dtype returns this tensor
    /// unchanged; a meta tensor casts to a meta tensor.
    ///
    /// # Errors
    /// [`Error::NotCastable`] for any other pair of dtypes; [`Error::Gpu`].
    pub fn to_dtype(&self, dtype: DType) -> Result<Tensor<Gpu>> {
        const OP: &str = "to_dtype";
        if dtype == self.dtype() {
            return Ok(self.clone());
        }
        if !self.dtype().is_castable_float() || !dtype.is_castable_float() {
            return Err(Error::NotCastable { from: self.dtype(), to: dtype });
        }
        let gpu = self.device();
        if self.is_meta() {
            return Ok(Tensor::meta_on(gpu, dtype, self.shape()));
        }
        let elements = count(gpu, OP, self.shape())?;
        let out = gpu.buffer(self.len() as u64 * dtype.size_in_bytes().unwrap_or(4) as u64, OP)?;
        if elements > 0 {
            reach(gpu, OP, self.offset(), self.shape(), self.strides())?;
            let (sizes, strides) = collapse(gpu, OP, self.shape(), &[self.strides()])?;
            let params = CastParams {
                count: word(gpu, OP, elements)?,
                rank: sizes.len() as u32,
                in_kind: kind(self, OP)?,
                out_kind: float_kind(dtype).ok_or(Error::NotCastable { from: self.dtype(), to: dtype })?,
                offset: word(gpu, OP, self.offset())?,
                shape: axes(gpu, OP, &sizes, 1)?,
                strides: axes(gpu, OP, &strides[0], 0)?,
                ..CastParams::default()
            };
            // One invocation per output word of f16/bf16 pairs, per element otherwise.
            let units = if matches!(dtype, DType::F16 | DType::BF16) { elements.div_ceil(2) } else { elements };
            launch(gpu, "cast", CAST, &params, &[storage(self, OP)?.into(), (&out).into()], units as u64)?;
        }
        Ok(gpu.tensor(Some(out), dtype, self.shape()))
    }
}

#[cfg(test)]
#[test]
fn parameter_blocks_match_the_shaders() {
    super::assert_layout::<ElementwiseParams>(ELEMENTWISE, "Params");
    super::assert_layout::<CastParams>(CAST, "Params");
}
