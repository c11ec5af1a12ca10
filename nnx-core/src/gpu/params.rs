//! What the kernels' Rust side shares: float kinds, sizes checked into the 32-bit words of a
//! uniform block, layouts with their axes merged, host data uploaded as words, and output
//! buffers.

use super::Gpu;
use super::dispatch::{Binding, Launch};
use crate::error::{Error, Result};
use crate::{DType, Device, Tensor};

/// The `float.wgsl` prelude, prepended to every kernel's source.
macro_rules! kernel_source {
    ($($file:literal),+) => {
        concat!(include_str!("float.wgsl"), $(include_str!($file)),+)
    };
}
pub(crate) use kernel_source;

/// The most axes a strided kernel reads through (after merging, see [`collapse`]).
pub(crate) const MAX_AXES: usize = 8;

/// The kind of a missing optional operand (bias, weight).
pub(crate) const ABSENT: u32 = 4;

/// The largest index or size the kernels take: their indices are u32 and f64 words sit at
/// twice an element's index, so sizes stay below 2^31.
const MAX_INDEX: usize = i32::MAX as usize;

/// How a float dtype's elements sit in the words a kernel reads (see `float.wgsl`).
pub(crate) fn float_kind(dtype: DType) -> Option<u32> {
    match dtype {
        DType::F32 => Some(0),
        DType::F16 => Some(1),
        DType::BF16 => Some(2),
        DType::F64 => Some(3),
        _ => None,
    }
}

/// The float kind of a tensor's elements.
pub(crate) fn kind(tensor: &Tensor<Gpu>, op: &'static str) -> Result<u32> {
    float_kind(tensor.dtype()).ok_or(Error::NotFloat { op, dtype: tensor.dtype() })
}

/// `value` as a parameter word, refusing what the kernels cannot index.
pub(crate) fn word(gpu: &Gpu, op: &'static str, value: usize) -> Result<u32> {
    if value > MAX_INDEX {
        return Err(gpu.fail(
            op,
            format!("a size or index of {value} elements is past what the kernels address (2^31 - 1): split the work"),
        ));
    }
    Ok(value as u32)
}

/// The stride of an axis of `size` as a parameter word: 0 for an axis never stepped along,
/// whatever its stride.
pub(crate) fn step(gpu: &Gpu, op: &'static str, size: usize, stride: usize) -> Result<u32> {
    if size <= 1 { Ok(0) } else { word(gpu, op, stride) }
}

/// `values` as parameter words, padded with `fill` to [`MAX_AXES`].
pub(crate) fn axes(gpu: &Gpu, op: &'static str, values: &[usize], fill: u32) -> Result<Vec<u32>> {
    let mut words = values.iter().map(|&value| word(gpu, op, value)).collect::<Result<Vec<u32>>>()?;
    words.resize(MAX_AXES, fill);
    Ok(words)
}

/// The number of elements of `shape`, refusing one the kernels cannot index.
pub(crate) fn count(gpu: &Gpu, op: &'static str, shape: &[usize]) -> Result<usize> {
    let count = crate::tensor::checked_len(shape).unwrap_or(usize::MAX);
    word(gpu, op, count)?;
    Ok(count)
}

/// The largest element index a view of `shape` and `strides` reaches from `offset` (checked),
/// so that every index a kernel forms from them fits its words.
pub(crate) fn reach(gpu: &Gpu, op: &'static str, offset: usize, shape: &[usize], strides: &[usize]) -> Result<()> {
    if shape.contains(&0) {
        return Ok(());
    }
    let last = shape
        .iter()
        .zip(strides)
        .try_fold(offset, |at, (&size, &stride)| (size - 1).checked_mul(stride).and_then(|step| at.checked_add(step)));
    word(gpu, op, last.unwrap_or(usize::MAX)).map(|_| ())
}

/// The buffer of a tensor that has data.
pub(crate) fn storage<'a>(tensor: &'a Tensor<Gpu>, op: &'static str) -> Result<&'a wgpu::Buffer> {
    tensor.buffer().ok_or(Error::Meta { op })
}

/// Refuses operands that live on different GPUs (their buffers cannot meet in one dispatch).
pub(crate) fn same_device(op: &'static str, first: &Tensor<Gpu>, others: &[Option<&Tensor<Gpu>>]) -> Result<()> {
    let gpu = first.device();
    match others.iter().flatten().find(|other| other.device() != gpu) {
        Some(other) => Err(gpu.fail(
            op,
            format!("an operand lives on `{}`: move it with `to_host()?.to_device(..)` first", other.device().name()),
        )),
        None => Ok(()),
    }
}

/// A shape and the strides of each operand through it, with axes of size 1 dropped and
/// neighbouring axes merged where every operand steps through them as one, so that a contiguous
/// tensor is one axis and a strided kernel does the least index arithmetic.
///
/// # Errors
/// [`Error::Gpu`] when more than [`MAX_AXES`] axes remain.
pub(crate) fn collapse(
    gpu: &Gpu,
    op: &'static str,
    shape: &[usize],
    strides: &[&[usize]],
) -> Result<(Vec<usize>, Vec<Vec<usize>>)> {
    // Innermost first: (size, the stride of each operand).
    let mut merged: Vec<(usize, Vec<usize>)> = Vec::new();
    for axis in (0..shape.len()).rev() {
        let size = shape[axis];
        if size == 1 {
            continue;
        }
        let outer: Vec<usize> = strides.iter().map(|strides| strides[axis]).collect();
        match merged.last_mut() {
            Some((inner_size, inner)) if outer.iter().zip(inner.iter()).all(|(&o, &i)| o == i * *inner_size) => {
                *inner_size *= size;
            }
            _ => merged.push((size, outer)),
        }
    }
    if merged.len() > MAX_AXES {
        return Err(gpu.fail(
            op,
            format!("a view of shape {shape:?} has more than {MAX_AXES} axes that cannot be merged: make it contiguous first"),
        ));
    }
    merged.reverse();
    let sizes = merged.iter().map(|(size, _)| *size).collect();
    let strides = (0..strides.len()).map(|operand| merged.iter().map(|(_, s)| s[operand]).collect()).collect();
    Ok((sizes, strides))
}

/// A fresh storage buffer for `count` f32 values (zeros, as wgpu initialises every buffer).
pub(crate) fn output(gpu: &Gpu, count: usize) -> Result<wgpu::Buffer> {
    gpu.buffer(count as u64 * 4, "output")
}

/// A storage buffer holding `words`, uploaded from the host.
pub(crate) fn upload(gpu: &Gpu, words: &[u32]) -> Result<wgpu::Buffer> {
    let buffer = gpu.buffer(words.len() as u64 * 4, "upload")?;
    if !words.is_empty() {
        let bytes: Vec<u8> = words.iter().flat_map(|word| word.to_le_bytes()).collect();
        gpu.queue().write_buffer(&buffer, 0, &bytes);
    }
    Ok(buffer)
}

/// Launches a kernel over `invocations` with 256-wide workgroups.
pub(crate) fn launch(
    gpu: &Gpu,
    key: &'static str,
    source: &'static str,
    params: &[u32],
    buffers: &[Binding<'_>],
    invocations: u64,
) -> Result<()> {
    gpu.launch(&Launch { key, source, entry: "main", params, buffers, invocations })
}
