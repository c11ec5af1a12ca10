//! Row kernels on the GPU (`rows.wgsl`, one workgroup per row): softmax, layer and RMS
//! normalisation, L2 normalisation; and mean pooling (`pool.wgsl`).

use super::{
    ABSENT, count, kernel_source, kind, launch, output, reach, same_device, step, storage, uniform, upload, word,
};
use crate::error::{Error, Result};
use crate::gpu::Gpu;
use crate::gpu::dispatch::Binding;
use crate::shape::{check_float, check_mean_pool, check_parameter, last_axis};
use crate::{DType, Tensor};

const ROWS: &str = kernel_source!("reduce.wgsl", "rows.wgsl");
const POOL: &str = kernel_source!("pool.wgsl");

uniform! {
    /// The parameters of `rows.wgsl`.
    struct RowsParams {
        rows: u32,
        width: u32,
        /// A [`RowOp`].
        op: u32,
        /// As f32 bits.
        eps: u32,
        x_kind: u32,
        x_offset: u32,
        /// [`ABSENT`] when there is no weight (bias).
        weight_kind: u32,
        weight_offset: u32,
        weight_stride: u32,
        bias_kind: u32,
        bias_offset: u32,
        bias_stride: u32,
    }
}

uniform! {
    /// The parameters of `pool.wgsl`.
    struct PoolParams {
        count: u32,
        seq: u32,
        dim: u32,
        kind: u32,
        offset: u32,
        batch_stride: u32,
        seq_stride: u32,
        dim_stride: u32,
    }
}

/// The operations of `rows.wgsl`, by their code there.
#[derive(Clone, Copy)]
enum RowOp {
    Softmax = 0,
    LayerNorm = 1,
    RmsNorm = 2,
    L2Normalize = 3,
}

/// A rank-1 parameter of a row kernel as `(binding, kind, offset, stride)`, or the absent kind.
fn parameter<'a>(
    tensor: Option<&'a Tensor<Gpu>>,
    fallback: Binding<'a>,
    op: &'static str,
) -> Result<(Binding<'a>, u32, usize, usize)> {
    match tensor {
        Some(tensor) => {
            reach(tensor.device(), op, tensor.offset(), tensor.shape(), tensor.strides())?;
            Ok((storage(tensor, op)?.into(), kind(tensor, op)?, tensor.offset(), tensor.strides()[0]))
        }
        None => Ok((fallback, ABSENT, 0, 0)),
    }
}

impl Tensor<Gpu> {
    /// `op` over each row of the last axis (`width` wide, checked by the caller).
    fn rows(
        &self,
        name: &'static str,
        op: RowOp,
        width: usize,
        weight: Option<&Tensor<Gpu>>,
        bias: Option<&Tensor<Gpu>>,
        eps: f32,
    ) -> Result<Tensor<Gpu>> {
        check_float(self, name)?;
        same_device(name, self, &[weight, bias])?;
        let gpu = self.device();
        let elements = count(gpu, name, self.shape())?;
        let out = output(gpu, elements)?;
        if elements > 0 {
            let x = self.contiguous()?;
            reach(gpu, name, x.offset(), x.shape(), x.strides())?;
            let buffer = storage(&x, name)?;
            let (weight_binding, weight_kind, weight_offset, weight_stride) = parameter(weight, buffer.into(), name)?;
            let (bias_binding, bias_kind, bias_offset, bias_stride) = parameter(bias, buffer.into(), name)?;
            let rows = elements / width;
            let params = RowsParams {
                rows: word(gpu, name, rows)?,
                width: word(gpu, name, width)?,
                op: op as u32,
                eps: eps.to_bits(),
                x_kind: kind(&x, name)?,
                x_offset: word(gpu, name, x.offset())?,
                weight_kind,
                weight_offset: word(gpu, name, weight_offset)?,
                weight_stride: step(gpu, name, width, weight_stride)?,
                bias_kind,
                bias_offset: word(gpu, name, bias_offset)?,
                bias_stride: step(gpu, name, width, bias_stride)?,
            };
            let buffers = [buffer.into(), weight_binding, bias_binding, (&out).into()];
            launch(gpu, "rows", ROWS, &params, &buffers, rows as u64 * 256)?;
        }
        Ok(gpu.tensor(Some(out), DType::F32, self.shape()))
    }

    /// The softmax along `axis`, computed stably; a slice of `-inf` gives zeros (see
    /// [`Tensor::softmax`]).
    ///
    /// # Errors
    /// [`Error::AxisOutOfRange`], [`Error::NotFloat`], [`Error::Meta`], [`Error::Gpu`].
    pub fn softmax(&self, axis: usize) -> Result<Tensor<Gpu>> {
        const OP: &str = "softmax";
        if axis >= self.rank() {
            return Err(Error::AxisOutOfRange { axis, rank: self.rank(), shape: self.shape().to_vec() });
        }
        if axis + 1 == self.rank() {
            return self.softmax_last();
        }
        // Move the axis last, take row softmaxes, and move it back.
        check_float(self, OP)?;
        let moved = self.transpose(axis, self.rank() - 1)?;
        moved.softmax_last()?.transpose(axis, self.rank() - 1)?.contiguous()
    }

    /// The softmax along the last axis.
    ///
    /// # Errors
    /// [`Error::BadShape`] for rank 0, [`Error::NotFloat`], [`Error::Meta`], [`Error::Gpu`].
    pub fn softmax_last(&self) -> Result<Tensor<Gpu>> {
        const OP: &str = "softmax_last";
        let width = last_axis(self.shape(), OP)?;
        self.rows(OP, RowOp::Softmax, width, None, None, 0.0)
    }

    /// Layer normalisation over the last axis as PyTorch computes it (see
    /// [`Tensor::layer_norm`]).
    ///
    /// # Errors
    /// [`Error::BadShape`] for rank 0, [`Error::ShapeMismatch`] when `weight` or `bias` is not
    /// `[dim]`, [`Error::NotFloat`], [`Error::Meta`], [`Error::Gpu`].
    pub fn layer_norm(
        &self,
        weight: Option<&Tensor<Gpu>>,
        bias: Option<&Tensor<Gpu>>,
        eps: f32,
    ) -> Result<Tensor<Gpu>> {
        const OP: &str = "layer_norm";
        let width = last_axis(self.shape(), OP)?;
        check_parameter(weight, width, self, OP, "the weight must be `[dim]` for an input `[.., dim]`")?;
        check_parameter(bias, width, self, OP, "the bias must be `[dim]` for an input `[.., dim]`")?;
        self.rows(OP, RowOp::LayerNorm, width, weight, bias, eps)
    }

    /// RMS normalisation over the last axis as Llama computes it (see [`Tensor::rms_norm`]).
    ///
    /// # Errors
    /// [`Error::BadShape`] for rank 0, [`Error::ShapeMismatch`] when `weight` is not `[dim]`,
    /// [`Error::NotFloat`], [`Error::Meta`], [`Error::Gpu`].
    pub fn rms_norm(&self, weight: Option<&Tensor<Gpu>>, eps: f32) -> Result<Tensor<Gpu>> {
        const OP: &str = "rms_norm";
        let width = last_axis(self.shape(), OP)?;
        check_parameter(weight, width, self, OP, "the weight must be `[dim]` for an input `[.., dim]`")?;
        self.rows(OP, RowOp::RmsNorm, width, weight, None, eps)
    }

    /// Each row of the last axis divided by its Euclidean norm, `x / max(‖x‖, 1e-12)`.
    ///
    /// # Errors
    /// [`Error::BadShape`] for rank 0, [`Error::NotFloat`], [`Error::Meta`], [`Error::Gpu`].
    pub fn l2_normalize(&self) -> Result<Tensor<Gpu>> {
        const OP: &str = "l2_normalize";
        let width = last_axis(self.shape(), OP)?;
        self.rows(OP, RowOp::L2Normalize, width, None, None, 0.0)
    }

    /// Mean pooling, `[batch, seq, dim]` to `[batch, dim]` over the positions whose `mask`
    /// entry is true (see [`Tensor::mean_pool`]).
    ///
    /// # Errors
    /// [`Error::BadShape`] unless `x` has rank 3, [`Error::LengthMismatch`] when `mask` does not
    /// have `batch * seq` entries, [`Error::NotFloat`], [`Error::Meta`], [`Error::Gpu`].
    pub fn mean_pool(&self, mask: &[bool]) -> Result<Tensor<Gpu>> {
        const OP: &str = "mean_pool";
        let [batch, seq, dim] = check_mean_pool(self, mask)?;
        check_float(self, OP)?;
        let gpu = self.device();
        let elements = count(gpu, OP, &[batch, dim])?;
        let out = output(gpu, elements)?;
        if elements > 0 {
            reach(gpu, OP, self.offset(), self.shape(), self.strides())?;
            let words: Vec<u32> = mask.iter().map(|&keep| u32::from(keep)).collect();
            let mask = upload(gpu, &words)?;
            let strides = self.strides();
            let params = PoolParams {
                count: word(gpu, OP, elements)?,
                seq: word(gpu, OP, seq)?,
                dim: word(gpu, OP, dim)?,
                kind: kind(self, OP)?,
                offset: word(gpu, OP, self.offset())?,
                batch_stride: step(gpu, OP, batch, strides[0])?,
                seq_stride: step(gpu, OP, seq, strides[1])?,
                dim_stride: step(gpu, OP, dim, strides[2])?,
            };
            let buffers = [storage(self, OP)?.into(), (&mask).into(), (&out).into()];
            launch(gpu, "pool", POOL, &params, &buffers, elements as u64)?;
        }
        Ok(gpu.tensor(Some(out), DType::F32, &[batch, dim]))
    }
}

#[cfg(test)]
#[test]
fn parameter_blocks_match_the_shaders() {
    super::assert_layout::<RowsParams>(ROWS, "Params");
    super::assert_layout::<PoolParams>(POOL, "Params");
}
