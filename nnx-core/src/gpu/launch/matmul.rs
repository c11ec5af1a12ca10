//! Matrix products on the GPU (`matmul.wgsl`): batched, broadcasting `matmul` and PyTorch's
//! `linear`, tiled 64 x 64 x 16 in workgroup memory with f32 accumulation. Operands are read
//! through their strides in their own dtype; a weight too large for one storage binding is
//! multiplied a block of rows at a time.

use super::{
    ABSENT, Axes, MAX_AXES, axes, count, kernel_source, kind, launch, output, reach, same_device, step, storage,
    uniform, word,
};
use crate::error::Result;
use crate::gpu::Gpu;
use crate::gpu::dispatch::Binding;
use crate::shape::{MatmulShape, broadcast_strides, check_linear, check_matmul, rows_fold};
use crate::{DType, OnDevice, Tensor};

const MATMUL: &str = kernel_source!("matmul.wgsl");

uniform! {
    /// The parameters of `matmul.wgsl`.
    struct MatmulParams {
        m: u32,
        n: u32,
        k: u32,
        /// Products in the batch.
        batches: u32,
        a_kind: u32,
        a_offset: u32,
        a_row: u32,
        a_column: u32,
        b_kind: u32,
        b_offset: u32,
        b_row: u32,
        b_column: u32,
        /// [`ABSENT`] when there is no bias.
        bias_kind: u32,
        bias_offset: u32,
        bias_stride: u32,
        batch_rank: u32,
        out_offset: u32,
        out_row: u32,
        out_batch: u32,
        tiles_n: u32,
        batch_shape: Axes,
        a_batch: Axes,
        b_batch: Axes,
    }
}

/// The output tile of one workgroup is `TILE x TILE`.
const TILE: usize = 64;

/// One operand of a product: where its matrices lie in a binding.
#[derive(Clone)]
pub(crate) struct Operand<'a> {
    pub(crate) binding: Binding<'a>,
    /// The float kind of its elements.
    pub(crate) kind: u32,
    /// The first element, counted from the start of the binding.
    pub(crate) offset: usize,
    /// The stride of each batch axis of the product (0 where the operand is broadcast).
    pub(crate) batch: Vec<usize>,
    pub(crate) row: usize,
    pub(crate) column: usize,
}

impl<'a> Operand<'a> {
    /// The last two axes of `tensor` as matrices, its leading axes broadcast to `batch`.
    fn of(tensor: &'a Tensor<Gpu>, batch: &[usize], op: &'static str) -> Result<Operand<'a>> {
        let rank = tensor.rank();
        Ok(Operand {
            binding: storage(tensor, op)?.into(),
            kind: kind(tensor, op)?,
            offset: tensor.offset(),
            batch: broadcast_strides(&tensor.shape()[..rank - 2], &tensor.strides()[..rank - 2], batch),
            row: tensor.strides()[rank - 2],
            column: tensor.strides()[rank - 1],
        })
    }
}

/// A bias added to each row of a product: `[n]` elements `offset + i * stride`.
pub(crate) struct Bias<'a> {
    pub(crate) binding: Binding<'a>,
    pub(crate) kind: u32,
    pub(crate) offset: usize,
    pub(crate) stride: usize,
}

/// Where a product's `[batch.., m, n]` f32 result goes: element `(i, j)` of matrix `t` (the
/// flat batch index) at `offset + (t * m + i) * row + j`.
pub(crate) struct Destination<'a> {
    pub(crate) buffer: &'a wgpu::Buffer,
    pub(crate) offset: usize,
    pub(crate) row: usize,
}

/// `a · b (+ bias)` over the batch axes `batch`, `m x k` times `k x n`, into `out`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn product(
    gpu: &Gpu,
    op: &'static str,
    a: Operand<'_>,
    b: Operand<'_>,
    bias: Option<Bias<'_>>,
    batch: &[usize],
    [m, k, n]: [usize; 3],
    out: Destination<'_>,
) -> Result<()> {
    // Axes of size 1 are never stepped along.
    let kept: Vec<usize> = (0..batch.len()).filter(|&axis| batch[axis] != 1).collect();
    let mut shape: Vec<usize> = kept.iter().map(|&axis| batch[axis]).collect();
    let mut a_batch: Vec<usize> = kept.iter().map(|&axis| a.batch[axis]).collect();
    let mut b_batch: Vec<usize> = kept.iter().map(|&axis| b.batch[axis]).collect();
    // Trailing batch axes along which `b` is broadcast and `a`'s matrices follow each other
    // fold into the rows: a stack of matrices times one matrix is one tall product.
    let mut m = m;
    while let (Some(&size), Some(&a_stride), Some(&0)) = (shape.last(), a_batch.last(), b_batch.last()) {
        if a_stride != m * a.row {
            break;
        }
        m *= size;
        shape.pop();
        a_batch.pop();
        b_batch.pop();
    }
    let batches: usize = shape.iter().product();
    if batches * m * n == 0 {
        return Ok(());
    }
    if shape.len() > MAX_AXES {
        return Err(gpu.fail(op, format!("a product over more than {MAX_AXES} batch axes: reshape it first")));
    }
    let tiles_n = n.div_ceil(TILE);
    let groups = batches * m.div_ceil(TILE) * tiles_n;
    let (bias_binding, bias_kind, bias_offset, bias_stride) = match &bias {
        Some(bias) => (bias.binding, bias.kind, bias.offset, bias.stride),
        None => (a.binding, ABSENT, 0, 0),
    };
    let params = MatmulParams {
        m: word(gpu, op, m)?,
        n: word(gpu, op, n)?,
        k: word(gpu, op, k)?,
        batches: word(gpu, op, batches)?,
        a_kind: a.kind,
        a_offset: word(gpu, op, a.offset)?,
        a_row: step(gpu, op, m, a.row)?,
        a_column: step(gpu, op, k, a.column)?,
        b_kind: b.kind,
        b_offset: word(gpu, op, b.offset)?,
        b_row: step(gpu, op, k, b.row)?,
        b_column: step(gpu, op, n, b.column)?,
        bias_kind,
        bias_offset: word(gpu, op, bias_offset)?,
        bias_stride: step(gpu, op, n, bias_stride)?,
        batch_rank: shape.len() as u32,
        out_offset: word(gpu, op, out.offset)?,
        out_row: word(gpu, op, out.row)?,
        out_batch: word(gpu, op, m * out.row)?,
        tiles_n: word(gpu, op, tiles_n)?,
        batch_shape: axes(gpu, op, &shape, 1)?,
        a_batch: axes(gpu, op, &a_batch, 0)?,
        b_batch: axes(gpu, op, &b_batch, 0)?,
    };
    let buffers = [a.binding, b.binding, bias_binding, out.buffer.into()];
    launch(gpu, "matmul", MATMUL, &params, &buffers, word(gpu, op, groups)? as u64 * 256)
}

impl Tensor<Gpu> {
    /// The matrix product over the last two axes, `[.., m, k] x [.., k, n] -> [.., m, n]`,
    /// with the batch axes broadcast (see [`Tensor::matmul`]). Operands of any float dtype
    /// are read through their strides; the product accumulates in f32.
    ///
    /// # Errors
    /// [`Error::BadShape`](crate::Error::BadShape) when an operand has rank below 2,
    /// [`Error::ShapeMismatch`](crate::Error::ShapeMismatch) when the inner sizes differ or
    /// the batch axes do not broadcast, [`Error::NotFloat`](crate::Error::NotFloat),
    /// [`Error::Meta`](crate::Error::Meta); [`Error::Gpu`](crate::Error::Gpu) when an operand
    /// exceeds a storage binding or the device fails.
    pub fn matmul(&self, rhs: &impl OnDevice<Gpu>) -> Result<Tensor<Gpu>> {
        const OP: &str = "matmul";
        let rhs = rhs.on_device();
        let MatmulShape { batch, m, k, n } = check_matmul(self, rhs)?;
        same_device(OP, self, &[Some(rhs)])?;
        let gpu = self.device();
        let mut shape = batch.clone();
        shape.extend([m, n]);
        let out = output(gpu, count(gpu, OP, &shape)?)?;
        reach(gpu, OP, self.offset(), self.shape(), self.strides())?;
        reach(gpu, OP, rhs.offset(), rhs.shape(), rhs.strides())?;
        let (a, b) = (Operand::of(self, &batch, OP)?, Operand::of(rhs, &batch, OP)?);
        product(gpu, OP, a, b, None, &batch, [m, k, n], Destination { buffer: &out, offset: 0, row: n })?;
        Ok(gpu.tensor(Some(out), DType::F32, &shape))
    }

    /// PyTorch's linear layer, `x · weightᵀ + bias` (see [`Tensor::linear`]), with the
    /// weight read in place through its strides and the bias added as each tile is written.
    /// A weight larger than one storage binding is multiplied a block of rows at a time.
    ///
    /// # Errors
    /// [`Error::BadShape`](crate::Error::BadShape),
    /// [`Error::ShapeMismatch`](crate::Error::ShapeMismatch),
    /// [`Error::NotFloat`](crate::Error::NotFloat), [`Error::Meta`](crate::Error::Meta) as on
    /// the host; [`Error::Gpu`](crate::Error::Gpu) when an operand exceeds a storage binding
    /// (a weight whose rows are not its outer axis) or the device fails.
    pub fn linear(&self, weight: &impl OnDevice<Gpu>, bias: Option<&Tensor<Gpu>>) -> Result<Tensor<Gpu>> {
        const OP: &str = "linear";
        let weight = weight.on_device();
        let (width, out_features) = check_linear(self, weight, bias)?;
        same_device(OP, self, &[Some(weight), bias])?;
        let gpu = self.device();
        let mut shape = self.shape().to_vec();
        *shape.last_mut().expect("`check_linear` refuses rank 0") = out_features;
        let out = output(gpu, count(gpu, OP, &shape)?)?;
        let rows = self.shape()[..self.rank() - 1].iter().product::<usize>();
        // The input as one `[rows, width]` matrix: in place when its leading axes fold.
        let input = if rows_fold(self.shape(), self.strides()) { self.clone() } else { self.contiguous()? };
        let row_stride = (0..input.rank().saturating_sub(1))
            .rev()
            .find(|&axis| input.shape()[axis] != 1)
            .map_or(width, |axis| input.strides()[axis]);
        let column_stride = input.strides()[input.rank() - 1];
        reach(gpu, OP, input.offset(), input.shape(), input.strides())?;
        reach(gpu, OP, weight.offset(), weight.shape(), weight.strides())?;
        let (weight_row, weight_column) = (weight.strides()[0], weight.strides()[1]);
        let weight_kind = kind(weight, OP)?;
        let weight_buffer = storage(weight, OP)?;
        let bias = match bias {
            Some(bias) => {
                reach(gpu, OP, bias.offset(), bias.shape(), bias.strides())?;
                Some((storage(bias, OP)?, kind(bias, OP)?, bias.offset(), bias.strides()[0]))
            }
            None => None,
        };
        let a = Operand {
            binding: storage(&input, OP)?.into(),
            kind: kind(&input, OP)?,
            offset: input.offset(),
            batch: Vec::new(),
            row: row_stride,
            column: column_stride,
        };
        // Blocks of output features (weight rows) whose elements fit one binding each.
        for (first, block, binding, offset) in weight_blocks(gpu, weight, weight_buffer, out_features, width)? {
            // `weightᵀ`: rows over the input features, columns over the output features.
            let b = Operand {
                binding,
                kind: weight_kind,
                offset,
                batch: Vec::new(),
                row: weight_column,
                column: weight_row,
            };
            let bias = bias.map(|(buffer, kind, offset, stride)| Bias {
                binding: buffer.into(),
                kind,
                offset: offset + first * stride,
                stride,
            });
            let destination = Destination { buffer: &out, offset: first, row: out_features };
            product(gpu, OP, a.clone(), b, bias, &[], [rows, width, block], destination)?;
        }
        Ok(gpu.tensor(Some(out), DType::F32, &shape))
    }
}

/// The weight of `linear` as blocks of rows: `(first row, rows, binding, offset of the first
/// row's first element in the binding)`. One block over the whole buffer when it fits a
/// binding; otherwise byte ranges (aligned as bindings need) of as many rows as fit.
fn weight_blocks<'a>(
    gpu: &Gpu,
    weight: &Tensor<Gpu>,
    buffer: &'a wgpu::Buffer,
    rows: usize,
    width: usize,
) -> Result<Vec<(usize, usize, Binding<'a>, usize)>> {
    const OP: &str = "linear";
    let limit = gpu.binding_limit();
    if buffer.size() <= limit || rows == 0 || width == 0 {
        return Ok(vec![(0, rows, buffer.into(), weight.offset())]);
    }
    let size = weight.dtype().size_in_bytes().unwrap_or(4) as u64;
    let alignment = u64::from(gpu.limits().min_storage_buffer_offset_alignment).max(size).max(4);
    let (row_stride, column_stride) = (weight.strides()[0] as u64, weight.strides()[1] as u64);
    // Elements one row spans, and the bytes a block may use for the rows after its first.
    let row_span = (width as u64 - 1) * column_stride + 1;
    let room = limit.checked_sub(alignment + row_span * size + 4).filter(|_| row_stride > 0);
    let Some(room) = room else {
        return Err(gpu.fail(
            OP,
            format!(
                "the weight {:?} takes {} bytes, more than the adapter's largest storage binding ({limit} bytes), \
                 and its rows are not its outer axis: store it `[out_features, in_features]` row-major",
                weight.shape(),
                buffer.size()
            ),
        ));
    };
    let per_block = (room / (row_stride * size) + 1).min(rows as u64) as usize;
    let mut blocks = Vec::new();
    for first in (0..rows).step_by(per_block) {
        let block = per_block.min(rows - first);
        let start = (weight.offset() + first * weight.strides()[0]) as u64;
        let last = start + (block as u64 - 1) * row_stride + row_span - 1;
        let byte_start = start * size / alignment * alignment;
        let byte_end = ((last + 1) * size).div_ceil(4) * 4;
        let binding = Binding { buffer, range: Some((byte_start, byte_end.min(buffer.size()) - byte_start)) };
        blocks.push((first, block, binding, (start - byte_start / size) as usize));
    }
    Ok(blocks)
}

#[cfg(test)]
#[test]
fn parameter_blocks_match_the_shaders() {
    super::assert_layout::<MatmulParams>(MATMUL, "Params");
}
