//! The kernels' launchers, one file per op family, and what they share: shader sources with the
//! prelude, parameter blocks (`#[repr(C)]` structs laid out as each shader's `struct Params`),
//! sizes checked into the kernels' 32-bit words, layouts with their axes merged, and output
//! buffers.
//!
//! A launcher checks its operands with `crate::shape` (the host's checks), fills its parameter
//! block and runs its shader through `Gpu::launch`.

mod attention;
mod copy;
mod elementwise;
mod ggml;
mod matmul;
mod norm;
mod quant;

pub(crate) use attention::{attention, attention_windowed, embedding};

use crate::error::{Error, Result};
use crate::gpu::Gpu;
use crate::gpu::dispatch::{Binding, Launch};
use crate::{DType, Device, Tensor};

/// A kernel's source: the prelude (`wgsl/prelude.wgsl`: the grid and strided indices;
/// `wgsl/float.wgsl`: floats in 32-bit words) and then the named files of `wgsl/`, joined when
/// nnx compiles.
macro_rules! kernel_source {
    ($($file:literal),+) => {
        concat!(
            include_str!("../wgsl/prelude.wgsl"),
            include_str!("../wgsl/float.wgsl"),
            $(include_str!(concat!("../wgsl/", $file))),+
        )
    };
}
pub(crate) use kernel_source;

/// A kernel's parameter block: `#[repr(C)]`, plain old data, its fields in the order, types and
/// offsets of the shader's `struct Params` (checked by the tests of this module). The names and
/// offsets of its fields are listed for that check.
pub(crate) trait Uniform: bytemuck::Pod {
    /// Each field's name and byte offset, in order.
    #[cfg(test)]
    const FIELDS: &'static [(&'static str, usize)];
}

/// Declares a parameter block: the struct, its plain-old-data derives and its [`Uniform`] impl.
macro_rules! uniform {
    ($(#[$meta:meta])* struct $name:ident { $($(#[$field_meta:meta])* $field:ident: $ty:ty,)* }) => {
        $(#[$meta])*
        #[repr(C)]
        #[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
        pub(crate) struct $name {
            $($(#[$field_meta])* pub(crate) $field: $ty,)*
        }

        impl $crate::gpu::launch::Uniform for $name {
            #[cfg(test)]
            const FIELDS: &'static [(&'static str, usize)] =
                &[$((stringify!($field), std::mem::offset_of!($name, $field))),*];
        }
    };
}
pub(crate) use uniform;

/// Up to [`MAX_AXES`] sizes or strides, as a shader's `array<vec4<u32>, 2>`.
pub(crate) type Axes = [u32; MAX_AXES];

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

/// `values` (at most [`MAX_AXES`]) as parameter words, padded with `fill`.
pub(crate) fn axes(gpu: &Gpu, op: &'static str, values: &[usize], fill: u32) -> Result<Axes> {
    let mut words = [fill; MAX_AXES];
    for (word_at, &value) in words.iter_mut().zip(values) {
        *word_at = word(gpu, op, value)?;
    }
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

/// Launches the entry point `main` of a kernel over `invocations` with 256-wide workgroups.
pub(crate) fn launch<P: Uniform>(
    gpu: &Gpu,
    key: &'static str,
    source: &'static str,
    params: &P,
    buffers: &[Binding<'_>],
    invocations: u64,
) -> Result<()> {
    gpu.launch(&Launch { key, source, entry: "main", params: bytemuck::bytes_of(params), buffers, invocations })
}

/// Checks that the parameter block `P` is laid out as the struct `name` of the WGSL `source`
/// under the uniform address space's rules: the same fields in the same order at the same
/// offsets, and the same size once padded to the 16-byte rows that `Gpu::launch` uploads.
#[cfg(test)]
pub(crate) fn assert_layout<P: Uniform>(source: &str, name: &str) {
    let (size, fields) = wgsl_layout::uniform_struct(source, name);
    let found: Vec<(String, usize)> = P::FIELDS.iter().map(|&(field, offset)| (field.to_string(), offset)).collect();
    assert_eq!(found, fields, "the fields of `{}` against the WGSL struct `{name}`", std::any::type_name::<P>());
    assert_eq!(size_of::<P>().next_multiple_of(16), size, "the size of `{}`", std::any::type_name::<P>());
}

/// The layout of a WGSL struct in the uniform address space, for the types parameter blocks use
/// (scalars, vectors, arrays of them and other structs of the same source).
#[cfg(test)]
mod wgsl_layout {
    /// The members of struct `name` in `source`: `(name, type)` in order.
    fn members<'a>(source: &'a str, name: &str) -> Vec<(&'a str, &'a str)> {
        let start =
            source.find(&format!("struct {name} {{")).unwrap_or_else(|| panic!("no `struct {name}` in the shader"));
        let body = &source[start..];
        let body = &body[body.find('{').unwrap() + 1..body.find("\n}").unwrap()];
        body.lines()
            .map(|line| line.split("//").next().unwrap().trim())
            .filter(|line| !line.is_empty())
            .map(|line| {
                let (field, ty) = line.trim_end_matches(',').split_once(':').expect("a `name: type` member");
                (field.trim(), ty.trim())
            })
            .collect()
    }

    /// `(size, alignment)` of `ty` in the uniform address space.
    fn size_align(source: &str, ty: &str) -> (usize, usize) {
        match ty {
            "u32" | "i32" | "f32" => (4, 4),
            _ if ty.starts_with("vec") => {
                let lanes: usize = ty[3..4].parse().unwrap();
                match lanes {
                    2 => (8, 8),
                    3 => (12, 16),
                    _ => (16, 16),
                }
            }
            _ if ty.starts_with("array<") => {
                let inner = &ty["array<".len()..ty.len() - 1];
                let (element, count) = inner.rsplit_once(',').unwrap();
                let (size, align) = size_align(source, element.trim());
                let stride = size.next_multiple_of(align);
                assert!(stride.is_multiple_of(16), "uniform arrays need 16-byte elements: `{ty}`");
                (stride * count.trim().parse::<usize>().unwrap(), align.next_multiple_of(16))
            }
            _ => {
                let (size, _) = uniform_struct(source, ty);
                (size, 16)
            }
        }
    }

    /// The size of struct `name` in the uniform address space and each member's offset.
    pub(super) fn uniform_struct(source: &str, name: &str) -> (usize, Vec<(String, usize)>) {
        let (mut end, mut align, mut fields) = (0usize, 4usize, Vec::new());
        for (field, ty) in members(source, name) {
            let (size, member_align) = size_align(source, ty);
            let offset = end.next_multiple_of(member_align);
            fields.push((field.to_string(), offset));
            // A struct member takes whole 16-byte rows.
            end = offset + if ty.starts_with(char::is_uppercase) { size.next_multiple_of(16) } else { size };
            align = align.max(member_align);
        }
        (end.next_multiple_of(align.max(16)), fields)
    }
}
