//! The contract every backend shares: the checks of an operation's operands (dtypes, ranks,
//! shapes, lengths) and the sizes they give, so that the host and the GPU refuse the same calls
//! with the same errors and compute the same shapes. Nothing here reads a tensor's elements.

// Without the `kernels` feature no backend computes, and most checks have no caller.
#![cfg_attr(not(feature = "kernels"), allow(dead_code))]

use crate::error::{Error, Result};
use crate::{DType, Device, Tensor};

// Operands of any operation.

/// Refuses meta tensors and tensors that are not f16, bf16, f32 or f64 (on any device: the GPU
/// kernels check their operands with the same helpers as the CPU ones).
pub(crate) fn check_float<D: Device>(tensor: &Tensor<D>, op: &'static str) -> Result<()> {
    if !tensor.dtype().is_castable_float() {
        return Err(Error::NotFloat { op, dtype: tensor.dtype() });
    }
    if tensor.is_meta() {
        return Err(Error::Meta { op });
    }
    Ok(())
}

/// The size of the last axis, refusing rank 0 for `op`.
pub(crate) fn last_axis(shape: &[usize], op: &'static str) -> Result<usize> {
    shape.last().copied().ok_or_else(|| Error::BadShape {
        op,
        expected: "[.., dim] (rank 1 or more)",
        shape: shape.to_vec(),
    })
}

/// Checks the input of `argmax_last` and returns the width of its rows.
pub(crate) fn check_argmax<D: Device>(tensor: &Tensor<D>) -> Result<usize> {
    const OP: &str = "argmax_last";
    let width = last_axis(tensor.shape(), OP)?;
    if width == 0 {
        return Err(Error::BadShape { op: OP, expected: "[.., dim] with dim > 0", shape: tensor.shape().to_vec() });
    }
    Ok(width)
}

// Broadcasting and parameters.

/// The shape two shapes broadcast to under numpy's rules, or `None` when they do not.
pub(crate) fn broadcast_shape(lhs: &[usize], rhs: &[usize]) -> Option<Vec<usize>> {
    let rank = lhs.len().max(rhs.len());
    let mut shape = vec![0; rank];
    for (axis, size) in shape.iter_mut().enumerate() {
        let a = (axis + lhs.len()).checked_sub(rank).map_or(1, |at| lhs[at]);
        let b = (axis + rhs.len()).checked_sub(rank).map_or(1, |at| rhs[at]);
        *size = match (a, b) {
            (a, b) if a == b => a,
            (1, b) => b,
            (a, 1) => a,
            _ => return None,
        };
    }
    Some(shape)
}

/// The strides that read an operand of `shape` and `strides` as if it had the broadcast shape
/// `to`: missing leading axes and axes of size 1 that grow get stride 0.
pub(crate) fn broadcast_strides(shape: &[usize], strides: &[usize], to: &[usize]) -> Vec<usize> {
    let lead = to.len() - shape.len();
    (0..to.len())
        .map(|axis| match axis.checked_sub(lead) {
            Some(at) if shape[at] == to[axis] => strides[at],
            _ => 0,
        })
        .collect()
}

/// Checks a rank-1 parameter (`weight`, `bias`) of `width` elements beside `input`.
pub(crate) fn check_parameter<D: Device>(
    tensor: Option<&Tensor<D>>,
    width: usize,
    input: &Tensor<D>,
    op: &'static str,
    reason: &'static str,
) -> Result<()> {
    let Some(tensor) = tensor else { return Ok(()) };
    if tensor.shape() != [width] {
        return Err(Error::ShapeMismatch { op, lhs: input.shape().to_vec(), rhs: tensor.shape().to_vec(), reason });
    }
    check_float(tensor, op)
}

/// Checks the operands of an elementwise `op` and returns the shape they broadcast to.
pub(crate) fn check_broadcast<D: Device>(lhs: &Tensor<D>, rhs: &Tensor<D>, op: &'static str) -> Result<Vec<usize>> {
    check_float(lhs, op)?;
    check_float(rhs, op)?;
    broadcast_shape(lhs.shape(), rhs.shape()).ok_or_else(|| Error::ShapeMismatch {
        op,
        lhs: lhs.shape().to_vec(),
        rhs: rhs.shape().to_vec(),
        reason: "each axis (counted from the last) must be equal or 1 in one of them",
    })
}

// Matrix products.

/// Whether the leading axes of `shape` (all but the last) fold into one axis of stride
/// `strides[rank - 2]`, so a stack of matrices is one tall matrix.
pub(crate) fn rows_fold(shape: &[usize], strides: &[usize]) -> bool {
    // Axes of size 1 are never stepped along, whatever their stride.
    let axes: Vec<(usize, usize)> = shape[..shape.len() - 1]
        .iter()
        .zip(strides)
        .filter(|(size, _)| **size != 1)
        .map(|(&size, &stride)| (size, stride))
        .collect();
    axes.windows(2).all(|pair| pair[0].1 == pair[1].0 * pair[1].1)
}

/// The sizes of a checked matrix product: the broadcast batch axes and `m × k · k × n`.
pub(crate) struct MatmulShape {
    pub(crate) batch: Vec<usize>,
    pub(crate) m: usize,
    pub(crate) k: usize,
    pub(crate) n: usize,
}

/// Checks the operands of `matmul` (on any device) and returns the product's sizes.
pub(crate) fn check_matmul<D: Device>(lhs: &Tensor<D>, rhs: &Tensor<D>) -> Result<MatmulShape> {
    const OP: &str = "matmul";
    check_float(lhs, OP)?;
    check_float(rhs, OP)?;
    for operand in [lhs, rhs] {
        if operand.rank() < 2 {
            return Err(Error::BadShape {
                op: OP,
                expected: "[.., rows, columns] (rank 2 or more)",
                shape: operand.shape().to_vec(),
            });
        }
    }
    let (left_rank, right_rank) = (lhs.rank(), rhs.rank());
    let (m, k) = (lhs.shape()[left_rank - 2], lhs.shape()[left_rank - 1]);
    let (inner, n) = (rhs.shape()[right_rank - 2], rhs.shape()[right_rank - 1]);
    let mismatch =
        |reason| Error::ShapeMismatch { op: OP, lhs: lhs.shape().to_vec(), rhs: rhs.shape().to_vec(), reason };
    if inner != k {
        return Err(mismatch("the last axis of the left operand must equal the second-to-last of the right"));
    }
    let Some(batch) = broadcast_shape(&lhs.shape()[..left_rank - 2], &rhs.shape()[..right_rank - 2]) else {
        return Err(mismatch("the batch axes (all but the last two) do not broadcast"));
    };
    Ok(MatmulShape { batch, m, k, n })
}

/// Checks the operands of `linear` (on any device) and returns `(in_features, out_features)`.
pub(crate) fn check_linear<D: Device>(
    x: &Tensor<D>,
    weight: &Tensor<D>,
    bias: Option<&Tensor<D>>,
) -> Result<(usize, usize)> {
    const OP: &str = "linear";
    check_float(x, OP)?;
    check_float(weight, OP)?;
    if weight.rank() != 2 {
        return Err(Error::BadShape {
            op: OP,
            expected: "[out_features, in_features]",
            shape: weight.shape().to_vec(),
        });
    }
    let Some(&width) = x.shape().last() else {
        return Err(Error::BadShape { op: OP, expected: "[.., in_features] (rank 1 or more)", shape: vec![] });
    };
    let (out_features, in_features) = (weight.shape()[0], weight.shape()[1]);
    if width != in_features {
        return Err(Error::ShapeMismatch {
            op: OP,
            lhs: x.shape().to_vec(),
            rhs: weight.shape().to_vec(),
            reason: "the last axis of the input must equal the second axis of the `[out, in]` weight",
        });
    }
    check_parameter(bias, out_features, weight, OP, "the bias must be `[out_features]`")?;
    Ok((width, out_features))
}

// Attention blocks.

/// Checks an embedding lookup (on any device) and returns the width of the table's rows.
pub(crate) fn check_embedding<D: Device>(weight: &Tensor<D>, ids: &[u32]) -> Result<usize> {
    const OP: &str = "embedding";
    check_float(weight, OP)?;
    let &[rows, dim] = weight.shape() else {
        return Err(Error::BadShape { op: OP, expected: "[vocab, dim]", shape: weight.shape().to_vec() });
    };
    if let Some((position, &id)) = ids.iter().enumerate().find(|&(_, &id)| id as usize >= rows) {
        return Err(Error::IndexOutOfRange { op: OP, id: id as usize, position, rows, shape: weight.shape().to_vec() });
    }
    Ok(dim)
}

/// Checks a rotary embedding's input (on any device) and returns its `head_dim`; `factors`, when
/// given, must hold one factor per frequency (`head_dim / 2`).
pub(crate) fn check_rotary<D: Device>(
    x: &Tensor<D>,
    positions: &[usize],
    factors: Option<&[f32]>,
    op: &'static str,
) -> Result<usize> {
    check_float(x, op)?;
    let &[_, _, seq, head_dim] = x.shape() else {
        return Err(Error::BadShape { op, expected: "[batch, heads, seq, head_dim]", shape: x.shape().to_vec() });
    };
    if !head_dim.is_multiple_of(2) {
        return Err(Error::BadShape {
            op,
            expected: "[batch, heads, seq, head_dim] with an even head_dim",
            shape: x.shape().to_vec(),
        });
    }
    if positions.len() != seq {
        return Err(Error::LengthMismatch {
            op,
            what: "positions (one per sequence index)",
            expected: seq,
            found: positions.len(),
            shape: x.shape().to_vec(),
        });
    }
    if let Some(factors) = factors
        && factors.len() != head_dim / 2
    {
        return Err(Error::LengthMismatch {
            op,
            what: "frequency factors (one per frequency, head_dim / 2)",
            expected: head_dim / 2,
            found: factors.len(),
            shape: x.shape().to_vec(),
        });
    }
    Ok(head_dim)
}

/// The rotary frequencies `1 / theta^(2i / head_dim)` for `i < head_dim / 2`, in f32 as
/// transformers computes `inv_freq` (a power of the f32 exponent, then its reciprocal).
pub(crate) fn inverse_frequencies(head_dim: usize, theta: f32) -> impl Iterator<Item = f32> {
    (0..head_dim / 2).map(move |i| 1.0 / theta.powf((2 * i) as f32 / head_dim as f32))
}

/// The cosines and sines of rotary embedding, `[positions.len(), head_dim / 2]` each, computed
/// in f32 as transformers does (shared by the devices, so they rotate by the same angles). Each
/// frequency is divided by its entry of `factors` (checked by [`check_rotary`]) before the
/// angles, as transformers scales `inv_freq` and llama.cpp applies `rope_freqs`.
pub(crate) fn rotary_tables(
    positions: &[usize],
    head_dim: usize,
    theta: f32,
    factors: Option<&[f32]>,
) -> (Vec<f32>, Vec<f32>) {
    let half = head_dim / 2;
    let frequencies: Vec<f32> = inverse_frequencies(head_dim, theta)
        .enumerate()
        .map(|(i, frequency)| factors.map_or(frequency, |factors| frequency / factors[i]))
        .collect();
    let mut cos = Vec::with_capacity(positions.len() * half);
    let mut sin = Vec::with_capacity(positions.len() * half);
    for &position in positions {
        for &frequency in &frequencies {
            let angle = position as f32 * frequency;
            cos.push(angle.cos());
            sin.push(angle.sin());
        }
    }
    (cos, sin)
}

/// The sizes of a checked attention call.
pub(crate) struct AttentionShape {
    pub(crate) batch: usize,
    pub(crate) heads: usize,
    pub(crate) kv_heads: usize,
    pub(crate) seq_q: usize,
    pub(crate) seq_k: usize,
    pub(crate) d: usize,
    pub(crate) d_v: usize,
}

/// Checks the operands of attention (`op`: plain or windowed, on any device) and returns their
/// sizes.
pub(crate) fn check_attention<D: Device>(
    q: &Tensor<D>,
    k: &Tensor<D>,
    v: &Tensor<D>,
    key_mask: Option<&[bool]>,
    op: &'static str,
) -> Result<AttentionShape> {
    for tensor in [q, k, v] {
        check_float(tensor, op)?;
        if tensor.rank() != 4 {
            return Err(Error::BadShape {
                op,
                expected: "[batch, heads, seq, head_dim]",
                shape: tensor.shape().to_vec(),
            });
        }
    }
    let (batch, heads, seq_q, d) = (q.shape()[0], q.shape()[1], q.shape()[2], q.shape()[3]);
    let (kv_heads, seq_k, d_v) = (k.shape()[1], k.shape()[2], v.shape()[3]);
    let mismatch = |lhs: &Tensor<D>, rhs: &Tensor<D>, reason| Error::ShapeMismatch {
        op,
        lhs: lhs.shape().to_vec(),
        rhs: rhs.shape().to_vec(),
        reason,
    };
    if k.shape()[0] != batch || k.shape()[3] != d {
        return Err(mismatch(q, k, "`q` and `k` must agree in batch and head_dim"));
    }
    if v.shape()[..3] != k.shape()[..3] {
        return Err(mismatch(k, v, "`k` and `v` must agree in batch, kv_heads and seq"));
    }
    if kv_heads == 0 || !heads.is_multiple_of(kv_heads) {
        return Err(mismatch(q, k, "the kv_heads of `k` must divide the heads of `q`"));
    }
    if let Some(mask) = key_mask
        && mask.len() != batch * seq_k
    {
        return Err(Error::LengthMismatch {
            op,
            what: "key_mask entries (batch * seq_k)",
            expected: batch * seq_k,
            found: mask.len(),
            shape: k.shape().to_vec(),
        });
    }
    Ok(AttentionShape { batch, heads, kv_heads, seq_q, seq_k, d, d_v })
}

// Normalisation and pooling.

/// Checks the shape of mean pooling's input and mask (on any device): `[batch, seq, dim]`.
pub(crate) fn check_mean_pool<D: Device>(x: &Tensor<D>, mask: &[bool]) -> Result<[usize; 3]> {
    const OP: &str = "mean_pool";
    let &[batch, seq, dim] = x.shape() else {
        return Err(Error::BadShape { op: OP, expected: "[batch, seq, dim]", shape: x.shape().to_vec() });
    };
    if mask.len() != batch * seq {
        return Err(Error::LengthMismatch {
            op: OP,
            what: "mask entries (batch * seq)",
            expected: batch * seq,
            found: mask.len(),
            shape: x.shape().to_vec(),
        });
    }
    Ok([batch, seq, dim])
}

// Key/value caches.

/// Checks a `write_slice` (on any device): an f32 destination with data, `values` of the same
/// rank agreeing on every axis but `axis`, and room for them from `start`.
pub(crate) fn check_write_slice<D: Device>(
    destination: &Tensor<D>,
    axis: usize,
    start: usize,
    values: &Tensor<D>,
) -> Result<()> {
    const OP: &str = "write_slice";
    check_float(values, OP)?;
    check_float(destination, OP)?;
    if destination.dtype() != DType::F32 {
        return Err(Error::DTypeMismatch { expected: DType::F32, found: destination.dtype() });
    }
    let shape = destination.shape();
    if axis >= shape.len() {
        return Err(Error::AxisOutOfRange { axis, rank: shape.len(), shape: shape.to_vec() });
    }
    let agree = values.rank() == shape.len()
        && values.shape().iter().zip(shape).enumerate().all(|(at, (found, size))| at == axis || found == size);
    if !agree {
        return Err(Error::ShapeMismatch {
            op: OP,
            lhs: shape.to_vec(),
            rhs: values.shape().to_vec(),
            reason: "the values must have the destination's rank and sizes on every axis but the one written along",
        });
    }
    let len = values.shape()[axis];
    if start.checked_add(len).is_none_or(|end| end > shape[axis]) {
        return Err(Error::NarrowOutOfRange { axis, start, len, size: shape[axis], shape: shape.to_vec() });
    }
    Ok(())
}

/// The shape of zeros made by `new_zeros` (on any device), checked to be addressable as f32.
pub(crate) fn check_new_zeros(shape: &[usize]) -> Result<usize> {
    crate::tensor::element_count(DType::F32, shape)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcasting_follows_numpy() {
        assert_eq!(broadcast_shape(&[2, 1, 3], &[4, 1]), Some(vec![2, 4, 3]));
        assert_eq!(broadcast_shape(&[], &[5]), Some(vec![5]));
        assert_eq!(broadcast_shape(&[2, 3], &[3, 3]), None);
        assert_eq!(broadcast_strides(&[4, 1], &[1, 1], &[2, 4, 3]), [0, 1, 0]);
    }
}
