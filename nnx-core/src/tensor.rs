//! `Tensor`: a cheap handle to shared storage plus a layout (shape, strides, offset), with views
//! that never copy, typed access, and float casts.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use half::{bf16, f16};
use rayon::prelude::*;

use crate::DType;
use crate::device::{Device, DeviceStorage, Host, HostStorage};
use crate::element::Element;
use crate::error::{Error, Result};
use crate::storage::{AlignedBuf, ByteSource, Storage};

/// Element count above which casts and copies are split across threads.
const PARALLEL_ELEMENTS: usize = 1 << 16;

/// An n-dimensional array of one [`DType`].
///
/// A `Tensor` is a handle: cloning it shares the storage. Views ([`transpose`](Tensor::transpose),
/// [`narrow`](Tensor::narrow), [`split`](Tensor::split), ...) share it too and only change the
/// layout. The storage is an owned buffer, bytes of a mapped file, or nothing at all for
/// [meta](Tensor::meta) tensors, which carry a dtype and shape for building models before their
/// weights are known.
///
/// The device is a type parameter: `Tensor` alone is `Tensor<Host>`, a tensor in host memory.
pub struct Tensor<D: Device = Host> {
    storage: Arc<D::Storage>,
    dtype: DType,
    shape: Vec<usize>,
    /// Strides in elements, one per axis.
    strides: Vec<usize>,
    /// Offset of the first element, in elements.
    offset: usize,
    /// The device the storage lives on.
    device: D,
}

fn contiguous_strides(shape: &[usize]) -> Vec<usize> {
    let mut strides = vec![0; shape.len()];
    let mut step = 1usize;
    for (stride, &size) in strides.iter_mut().zip(shape).rev() {
        *stride = step;
        step = step.saturating_mul(size);
    }
    strides
}

/// The number of elements of `shape`, or `None` when it overflows `usize`. A shape with a zero
/// axis holds no elements whatever its other axes, so the product is never formed for it.
pub(crate) fn checked_len(shape: &[usize]) -> Option<usize> {
    if shape.contains(&0) {
        return Some(0);
    }
    shape.iter().try_fold(1usize, |acc, &size| acc.checked_mul(size))
}

pub(crate) fn element_count(dtype: DType, shape: &[usize]) -> Result<usize> {
    // Bits rather than bytes, so that sub-byte dtypes are checked too (rounded up to a byte).
    let bytes = checked_len(shape)
        .and_then(|count| Some((count, (count as u64).checked_mul(dtype.bits() as u64)?.div_ceil(8))));
    match bytes {
        Some((count, bytes)) if bytes <= isize::MAX as u64 => Ok(count),
        _ => Err(Error::TooLarge { dtype, shape: shape.to_vec() }),
    }
}

/// Packed byte length of `count` elements, rounding sub-byte dtypes up to whole bytes.
fn packed_bytes(dtype: DType, count: usize) -> usize {
    (count * dtype.bits()).div_ceil(8)
}

impl Tensor {
    fn with_storage(storage: Storage, dtype: DType, shape: &[usize]) -> Tensor {
        Tensor {
            storage: Arc::new(HostStorage(storage)),
            dtype,
            shape: shape.to_vec(),
            strides: contiguous_strides(shape),
            offset: 0,
            device: Host,
        }
    }

    /// Builds a tensor that owns `data`, laid out row-major in `shape`.
    ///
    /// # Errors
    /// [`Error::ElementCount`] when `data.len()` is not the product of `shape`.
    ///
    /// # Examples
    /// ```
    /// use nnx_core::Tensor;
    /// let t = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3])?;
    /// assert_eq!(t.transpose(0, 1)?.contiguous().to_vec::<f32>()?, [1.0, 4.0, 2.0, 5.0, 3.0, 6.0]);
    /// # Ok::<(), nnx_core::Error>(())
    /// ```
    pub fn from_vec<T: Element>(data: Vec<T>, shape: &[usize]) -> Result<Tensor> {
        let expected = element_count(T::DTYPE, shape)?;
        if expected != data.len() {
            return Err(Error::ElementCount { shape: shape.to_vec(), expected, found: data.len() });
        }
        let bytes: &[u8] = if T::DTYPE == DType::Bool {
            // SAFETY: `T` is `bool` here (the only element type with dtype Bool), whose values are
            // the bytes 0 and 1, so viewing the slice as bytes is sound.
            unsafe { std::slice::from_raw_parts(data.as_ptr().cast::<u8>(), data.len()) }
        } else {
            // SAFETY: every other element type is a plain number without padding or invalid bit
            // patterns, so its memory is `size_of::<T>() * len` initialised bytes.
            unsafe { std::slice::from_raw_parts(data.as_ptr().cast::<u8>(), std::mem::size_of_val(data.as_slice())) }
        };
        Ok(Tensor::with_storage(Storage::Owned(AlignedBuf::from_bytes(bytes)), T::DTYPE, shape))
    }

    /// Builds an owned tensor from its packed row-major bytes.
    ///
    /// # Errors
    /// [`Error::ByteLength`] when `bytes` is not the size `dtype` and `shape` need;
    /// [`Error::InvalidBool`] for a BOOL byte other than 0 or 1.
    pub fn from_bytes(dtype: DType, shape: &[usize], bytes: &[u8]) -> Result<Tensor> {
        let count = element_count(dtype, shape)?;
        let expected = packed_bytes(dtype, count);
        if bytes.len() != expected {
            return Err(Error::ByteLength {
                dtype,
                shape: shape.to_vec(),
                expected: expected as u64,
                found: bytes.len() as u64,
            });
        }
        check_bools(dtype, bytes)?;
        Ok(Tensor::with_storage(Storage::Owned(AlignedBuf::from_bytes(bytes)), dtype, shape))
    }

    /// Builds a tensor over `source.bytes()[start..start + len]` without copying: the tensor
    /// keeps `source` alive. This is how tensors sit on the pages of a mapped file.
    ///
    /// # Errors
    /// [`Error::SharedRange`] when the range is outside the source, [`Error::ByteLength`] when
    /// it does not fit dtype and shape, [`Error::Misaligned`] when the first byte is not aligned
    /// for `dtype` (copy those bytes with [`Tensor::from_bytes`] instead), and
    /// [`Error::InvalidBool`] for a BOOL byte other than 0 or 1.
    pub fn from_shared(
        source: Arc<dyn ByteSource>,
        start: usize,
        len: usize,
        dtype: DType,
        shape: &[usize],
    ) -> Result<Tensor> {
        let all = source.bytes();
        let end = start.checked_add(len).filter(|&end| end <= all.len());
        let Some(end) = end else {
            return Err(Error::SharedRange { start, end: start.saturating_add(len), len: all.len() });
        };
        let count = element_count(dtype, shape)?;
        let expected = packed_bytes(dtype, count);
        if len != expected {
            return Err(Error::ByteLength {
                dtype,
                shape: shape.to_vec(),
                expected: expected as u64,
                found: len as u64,
            });
        }
        let address = all[start..].as_ptr() as usize;
        if !address.is_multiple_of(dtype.alignment()) {
            return Err(Error::Misaligned { dtype, address, alignment: dtype.alignment() });
        }
        check_bools(dtype, &all[start..end])?;
        Ok(Tensor::with_storage(Storage::Shared { source, start, len }, dtype, shape))
    }

    /// A tensor of zeros (all bits zero, which is 0 for every numeric dtype and `false`).
    ///
    /// # Panics
    /// When the element count of `shape` overflows `usize` (no memory could hold it).
    pub fn zeros(dtype: DType, shape: &[usize]) -> Tensor {
        let count = checked_len(shape).expect("the shape of a tensor of zeros fits in memory");
        Tensor::with_storage(Storage::Owned(AlignedBuf::zeroed(packed_bytes(dtype, count))), dtype, shape)
    }

    /// A tensor of `dtype` and `shape` whose bytes `fill` writes in place: an owned tensor
    /// built without a second buffer (a 500 MB quantized weight is made once, not made and
    /// copied). The bytes start zeroed.
    ///
    /// # Errors
    /// [`Error::TooLarge`] when the shape's bytes overflow, [`Error::Allocation`] when the
    /// memory is refused, [`Error::InvalidBool`] for BOOL bytes other than 0 or 1, and the
    /// errors of `fill`.
    pub fn filled(dtype: DType, shape: &[usize], fill: impl FnOnce(&mut [u8]) -> Result<()>) -> Result<Tensor> {
        let count = element_count(dtype, shape)?;
        let bytes = packed_bytes(dtype, count);
        let mut buf = AlignedBuf::try_zeroed(bytes).ok_or(Error::Allocation { op: "Tensor::filled", bytes })?;
        // The fill writes the buffer whole, most often: a page fault per 2 MiB, not per 4 KiB.
        advise_huge_pages(buf.as_mut_bytes());
        fill(buf.as_mut_bytes())?;
        check_bools(dtype, buf.as_bytes())?;
        Ok(Tensor::with_storage(Storage::Owned(buf), dtype, shape))
    }

    /// A tensor with a dtype and a shape and no storage: building a model of meta tensors
    /// allocates nothing, and importing into it later makes each tensor a view of the file.
    pub fn meta(dtype: DType, shape: &[usize]) -> Tensor {
        Tensor::with_storage(Storage::Meta, dtype, shape)
    }

    /// Whether the tensor's elements are pages of a mapped file.
    pub fn is_mapped(&self) -> bool {
        matches!(&self.storage.0, Storage::Shared { source, .. } if source.is_file_mapping())
    }
}

impl<D: Device> Tensor<D> {
    /// A contiguous tensor over `storage` on `device`.
    #[cfg_attr(not(feature = "gpu"), allow(dead_code))]
    pub(crate) fn from_parts(storage: Arc<D::Storage>, dtype: DType, shape: &[usize], device: D) -> Tensor<D> {
        Tensor { storage, dtype, shape: shape.to_vec(), strides: contiguous_strides(shape), offset: 0, device }
    }

    /// The storage, for the device's kernels.
    #[cfg_attr(not(feature = "gpu"), allow(dead_code))]
    pub(crate) fn storage(&self) -> &D::Storage {
        &self.storage
    }

    /// The storage, for writing in place: `Some` only when no other tensor (clone or view)
    /// shares it, so that a write is seen through this handle alone.
    #[cfg_attr(not(feature = "kernels"), allow(dead_code))]
    pub(crate) fn storage_mut(&mut self) -> Option<&mut D::Storage> {
        Arc::get_mut(&mut self.storage)
    }

    /// This contiguous tensor's elements viewed in `shape`, which the caller has checked holds
    /// as many (a device's `reshape`); nothing is copied.
    #[cfg_attr(not(feature = "gpu"), allow(dead_code))]
    pub(crate) fn contiguous_view(&self, shape: &[usize]) -> Tensor<D> {
        debug_assert!(self.is_contiguous() && checked_len(shape) == Some(self.len()), "a contiguous view");
        Tensor {
            storage: self.storage.clone(),
            dtype: self.dtype,
            shape: shape.to_vec(),
            strides: contiguous_strides(shape),
            offset: self.offset,
            device: self.device.clone(),
        }
    }

    /// The size of each axis.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The strides of each axis, in elements.
    pub fn strides(&self) -> &[usize] {
        &self.strides
    }

    /// The offset of the first element in the storage, in elements.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// The number of axes.
    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The number of elements (`usize::MAX` for a meta tensor whose shape overflows it).
    pub fn len(&self) -> usize {
        checked_len(&self.shape).unwrap_or(usize::MAX)
    }

    /// Whether the tensor has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes the elements take when packed (what a file stores).
    pub fn byte_len(&self) -> usize {
        packed_bytes(self.dtype, self.len())
    }

    /// Whether the tensor has no storage.
    pub fn is_meta(&self) -> bool {
        self.storage.is_meta()
    }

    /// The device the elements live on.
    pub fn device(&self) -> &D {
        &self.device
    }

    /// Whether two tensors share one storage (views of each other, or clones).
    pub fn shares_storage(&self, other: &Tensor<D>) -> bool {
        Arc::ptr_eq(&self.storage, &other.storage)
    }

    /// Whether the elements lie row-major without gaps, so the tensor is one byte range.
    pub fn is_contiguous(&self) -> bool {
        let mut step = 1usize;
        for (&size, &stride) in self.shape.iter().zip(&self.strides).rev() {
            if size != 1 && stride != step {
                return false;
            }
            // Saturating as `contiguous_strides` is: the axes outside a zero-size axis of an
            // empty tensor may multiply past `usize::MAX`.
            step = step.saturating_mul(size);
        }
        true
    }

    fn check_axis(&self, axis: usize) -> Result<()> {
        if axis < self.rank() {
            Ok(())
        } else {
            Err(Error::AxisOutOfRange { axis, rank: self.rank(), shape: self.shape.clone() })
        }
    }

    fn check_strided(&self, op: &'static str) -> Result<()> {
        if self.dtype.size_in_bytes().is_some() { Ok(()) } else { Err(Error::SubByte { op, dtype: self.dtype }) }
    }

    /// A view with axes `a` and `b` swapped; nothing is copied.
    ///
    /// # Errors
    /// [`Error::AxisOutOfRange`] for an axis past the rank; [`Error::SubByte`] for F4/F6.
    pub fn transpose(&self, a: usize, b: usize) -> Result<Tensor<D>> {
        self.check_axis(a)?;
        self.check_axis(b)?;
        let mut axes: Vec<usize> = (0..self.rank()).collect();
        axes.swap(a, b);
        self.permute(&axes)
    }

    /// A view whose axis `i` is axis `axes[i]` of this tensor; nothing is copied.
    ///
    /// # Errors
    /// [`Error::BadPermutation`] when `axes` is not a permutation of `0..rank`;
    /// [`Error::SubByte`] for F4/F6.
    pub fn permute(&self, axes: &[usize]) -> Result<Tensor<D>> {
        let mut seen = vec![false; self.rank()];
        let valid = axes.len() == self.rank()
            && axes.iter().all(|&axis| axis < seen.len() && !std::mem::replace(&mut seen[axis], true));
        if !valid {
            return Err(Error::BadPermutation { axes: axes.to_vec(), rank: self.rank(), shape: self.shape.clone() });
        }
        if axes.iter().enumerate().all(|(i, &axis)| i == axis) {
            return Ok(self.clone());
        }
        self.check_strided("permute")?;
        Ok(Tensor {
            storage: self.storage.clone(),
            dtype: self.dtype,
            shape: axes.iter().map(|&axis| self.shape[axis]).collect(),
            strides: axes.iter().map(|&axis| self.strides[axis]).collect(),
            offset: self.offset,
            device: self.device.clone(),
        })
    }

    /// A view of `len` indices of `axis` starting at `start`; nothing is copied.
    ///
    /// # Errors
    /// [`Error::AxisOutOfRange`], [`Error::NarrowOutOfRange`]; [`Error::SubByte`] for F4/F6
    /// unless the view is the whole tensor.
    pub fn narrow(&self, axis: usize, start: usize, len: usize) -> Result<Tensor<D>> {
        self.check_axis(axis)?;
        let size = self.shape[axis];
        if start.checked_add(len).is_none_or(|end| end > size) {
            return Err(Error::NarrowOutOfRange { axis, start, len, size, shape: self.shape.clone() });
        }
        if start == 0 && len == size {
            return Ok(self.clone());
        }
        self.check_strided("narrow")?;
        let mut view = self.clone();
        view.offset += start * self.strides[axis];
        view.shape[axis] = len;
        Ok(view)
    }

    /// A view of this contiguous tensor's elements with its own layout: element
    /// `(i_0, i_1, ...)` of the view is element `offset + sum(i_k * strides[k])` of this tensor
    /// read row-major. Nothing is copied; views may overlap or repeat elements (a zero stride).
    /// This is how a checkpoint's tensor is laid over a storage that several tensors share.
    ///
    /// # Errors
    /// [`Error::LengthMismatch`] when `strides` and `shape` differ in length,
    /// [`Error::StridedOutOfRange`] when an element of the view lies past this tensor's
    /// elements, [`Error::SubByte`] for F4/F6, [`Error::BadShape`] when this tensor is not
    /// contiguous.
    ///
    /// # Examples
    /// ```
    /// use nnx_core::Tensor;
    /// let storage = Tensor::from_vec((0..6).map(|v| v as f32).collect(), &[6])?;
    /// let view = storage.as_strided(&[2, 2], &[1, 3], 1)?;
    /// assert_eq!(view.to_vec::<f32>()?, [1.0, 4.0, 2.0, 5.0]);
    /// assert!(view.shares_storage(&storage));
    /// # Ok::<(), nnx_core::Error>(())
    /// ```
    pub fn as_strided(&self, shape: &[usize], strides: &[usize], offset: usize) -> Result<Tensor<D>> {
        if strides.len() != shape.len() {
            return Err(Error::LengthMismatch {
                op: "as_strided",
                what: "strides",
                expected: shape.len(),
                found: strides.len(),
                shape: shape.to_vec(),
            });
        }
        if !self.is_contiguous() {
            return Err(Error::BadShape {
                op: "as_strided",
                expected: "with contiguous strides",
                shape: self.shape.clone(),
            });
        }
        self.check_strided("as_strided")?;
        element_count(self.dtype, shape)?;
        let out_of_range =
            || Error::StridedOutOfRange { shape: shape.to_vec(), strides: strides.to_vec(), offset, len: self.len() };
        if !shape.contains(&0) {
            let last = shape.iter().zip(strides).try_fold(offset, |at, (&size, &stride)| {
                (size - 1).checked_mul(stride).and_then(|step| at.checked_add(step))
            });
            if last.is_none_or(|last| last >= self.len()) {
                return Err(out_of_range());
            }
        } else if offset > self.len() {
            return Err(out_of_range());
        }
        Ok(Tensor {
            storage: self.storage.clone(),
            dtype: self.dtype,
            shape: shape.to_vec(),
            strides: strides.to_vec(),
            offset: self.offset + offset,
            device: self.device.clone(),
        })
    }

    /// `parts` equal views along `axis`, in order; nothing is copied.
    ///
    /// # Errors
    /// [`Error::NotDivisible`] when `parts` is zero or does not divide the axis.
    pub fn split(&self, axis: usize, parts: usize) -> Result<Vec<Tensor<D>>> {
        self.check_axis(axis)?;
        let size = self.shape[axis];
        if parts == 0 || !size.is_multiple_of(parts) {
            return Err(Error::NotDivisible { axis, size, parts, shape: self.shape.clone() });
        }
        let piece = size / parts;
        (0..parts).map(|index| self.narrow(axis, index * piece, piece)).collect()
    }
}

impl Tensor {
    /// The same elements in another shape: a view when the tensor is contiguous (or meta),
    /// otherwise a contiguous copy first.
    ///
    /// # Errors
    /// [`Error::Reshape`] when the element counts differ; [`Error::Expansion`] and
    /// [`Error::Allocation`] as for [`to_bytes`](Tensor::to_bytes).
    pub fn reshape(&self, shape: &[usize]) -> Result<Tensor> {
        let to_len = element_count(self.dtype, shape)?;
        if to_len != self.len() {
            return Err(Error::Reshape { from: self.shape.clone(), from_len: self.len(), to: shape.to_vec(), to_len });
        }
        let base = self.contiguous_within(self.expansion_limit())?;
        Ok(Tensor {
            storage: base.storage,
            dtype: base.dtype,
            shape: shape.to_vec(),
            strides: contiguous_strides(shape),
            offset: base.offset,
            device: Host,
        })
    }

    /// How many times the bytes of its storage a view may take once materialized by
    /// [`to_bytes`](Tensor::to_bytes), [`to_vec`](Tensor::to_vec), [`to_dtype`](Tensor::to_dtype)
    /// and [`reshape`](Tensor::reshape), beyond [`Tensor::EXPANSION_ALLOWANCE`]. A view that
    /// repeats its elements (a zero stride) can describe far more elements than its storage
    /// holds: a file of a few hundred bytes can describe gigabytes. Transposes, slices and the
    /// broadcasts models use stay far below the limit; a larger copy is asked for explicitly
    /// with [`contiguous_within`](Tensor::contiguous_within).
    pub const EXPANSION_FACTOR: usize = 16;

    /// Bytes a view may take once materialized whatever its storage holds, so that small
    /// storages broadcast to ordinary sizes (a bias repeated over a batch) always materialize.
    pub const EXPANSION_ALLOWANCE: usize = 64 << 20;

    /// The bytes of the storage this tensor is a view of (0 for a meta tensor).
    pub fn stored_bytes(&self) -> usize {
        self.storage.0.bytes().map_or(0, <[u8]>::len)
    }

    /// The most bytes this tensor may take once materialized without an explicit limit:
    /// [`Tensor::EXPANSION_FACTOR`] times [`stored_bytes`](Tensor::stored_bytes), plus
    /// [`Tensor::EXPANSION_ALLOWANCE`].
    pub fn expansion_limit(&self) -> usize {
        self.stored_bytes().saturating_mul(Tensor::EXPANSION_FACTOR).saturating_add(Tensor::EXPANSION_ALLOWANCE)
    }

    /// Checks that materializing this tensor takes at most `limit` bytes (always true of a
    /// contiguous one, which materializes as the bytes it already has).
    ///
    /// # Errors
    /// [`Error::Expansion`] naming the bytes asked and the limit.
    pub fn check_expansion(&self, limit: usize) -> Result<()> {
        if self.is_contiguous() || self.is_meta() || self.byte_len() <= limit {
            return Ok(());
        }
        Err(Error::Expansion {
            shape: self.shape.clone(),
            strides: self.strides.clone(),
            bytes: self.byte_len(),
            stored: self.stored_bytes(),
            limit,
        })
    }

    /// [`contiguous`](Tensor::contiguous) for views whose layout comes from a file: the copy
    /// may take at most `limit` bytes ([`expansion_limit`](Tensor::expansion_limit) is the
    /// default every materializing method applies; `usize::MAX` lifts it), and a refused
    /// allocation is an error rather than an abort.
    ///
    /// # Errors
    /// [`Error::Expansion`] past `limit`, [`Error::Allocation`] when memory is refused.
    ///
    /// # Examples
    /// ```
    /// use nnx_core::Tensor;
    /// let one = Tensor::from_vec(vec![1.0f32], &[1])?;
    /// let repeated = one.as_strided(&[1 << 20], &[0], 0)?;
    /// assert!(repeated.contiguous_within(1 << 10).is_err());
    /// assert_eq!(repeated.contiguous_within(usize::MAX)?.len(), 1 << 20);
    /// # Ok::<(), nnx_core::Error>(())
    /// ```
    pub fn contiguous_within(&self, limit: usize) -> Result<Tensor> {
        if self.is_contiguous() {
            return Ok(self.clone());
        }
        if self.is_meta() {
            return Ok(Tensor::meta(self.dtype, &self.shape));
        }
        self.check_expansion(limit)?;
        let mut buf = AlignedBuf::try_zeroed(self.byte_len())
            .ok_or(Error::Allocation { op: "materialize a view", bytes: self.byte_len() })?;
        advise_huge_pages(buf.as_mut_bytes());
        self.gather_into(buf.as_mut_bytes());
        Ok(Tensor::with_storage(Storage::Owned(buf), self.dtype, &self.shape))
    }

    /// This tensor if it is contiguous, otherwise an owned row-major copy of its elements.
    /// Meta tensors stay meta (with row-major strides).
    ///
    /// No limit applies: this is for tensors the program built itself. For a view read from a
    /// file, whose strides may repeat a few bytes into gigabytes, use
    /// [`contiguous_within`](Tensor::contiguous_within).
    pub fn contiguous(&self) -> Tensor {
        if self.is_contiguous() {
            return self.clone();
        }
        if self.is_meta() {
            return Tensor::meta(self.dtype, &self.shape);
        }
        let mut buf = AlignedBuf::zeroed(self.byte_len());
        advise_huge_pages(buf.as_mut_bytes());
        self.gather_into(buf.as_mut_bytes());
        Tensor::with_storage(Storage::Owned(buf), self.dtype, &self.shape)
    }

    /// An owned, contiguous copy that shares nothing (detached from any file mapping).
    /// A meta tensor stays meta.
    pub fn copy(&self) -> Tensor {
        if self.is_meta() {
            return Tensor::meta(self.dtype, &self.shape);
        }
        let bytes = self.to_bytes_cow();
        Tensor::with_storage(Storage::Owned(AlignedBuf::from_bytes(&bytes)), self.dtype, &self.shape)
    }

    /// The elements as packed row-major bytes: borrowed when the tensor is contiguous, copied
    /// otherwise (within [`expansion_limit`](Tensor::expansion_limit)).
    ///
    /// # Errors
    /// [`Error::Meta`] for a meta tensor; [`Error::Expansion`] and [`Error::Allocation`] for a
    /// copy past the limit or refused memory.
    pub fn to_bytes(&self) -> Result<Cow<'_, [u8]>> {
        if self.is_meta() {
            return Err(Error::Meta { op: "to_bytes" });
        }
        if self.is_contiguous() {
            return Ok(self.to_bytes_cow());
        }
        self.check_expansion(self.expansion_limit())?;
        let mut out = Vec::new();
        out.try_reserve_exact(self.byte_len())
            .map_err(|_| Error::Allocation { op: "materialize a view", bytes: self.byte_len() })?;
        out.resize(self.byte_len(), 0);
        self.gather_into(&mut out);
        Ok(Cow::Owned(out))
    }

    fn to_bytes_cow(&self) -> Cow<'_, [u8]> {
        let all = self.storage.0.bytes().expect("callers exclude meta tensors");
        if self.is_contiguous() {
            let start = packed_bytes(self.dtype, self.offset);
            Cow::Borrowed(&all[start..start + self.byte_len()])
        } else {
            let mut out = vec![0u8; self.byte_len()];
            self.gather_into(&mut out);
            Cow::Owned(out)
        }
    }

    /// Copies the elements of a strided (byte-sized) view row-major into `out`.
    fn gather_into(&self, out: &mut [u8]) {
        let size = self.dtype.size_in_bytes().expect("sub-byte tensors are always contiguous");
        let all = self.storage.0.bytes().expect("callers exclude meta tensors");
        if self.is_empty() {
            return;
        }
        let rank = self.rank();
        let inner = self.shape[rank - 1];
        let inner_stride = self.strides[rank - 1];
        let row_bytes = inner * size;
        let rows = self.len() / inner;
        let copy_row = |row: usize, dst: &mut [u8]| {
            // Offset of the row's first element: decompose the row index over the outer axes.
            let mut rest = row;
            let mut at = self.offset;
            for axis in (0..rank - 1).rev() {
                at += (rest % self.shape[axis]) * self.strides[axis];
                rest /= self.shape[axis];
            }
            if inner_stride == 1 {
                dst.copy_from_slice(&all[at * size..at * size + row_bytes]);
            } else {
                for (i, chunk) in dst.chunks_exact_mut(size).enumerate() {
                    let src = (at + i * inner_stride) * size;
                    chunk.copy_from_slice(&all[src..src + size]);
                }
            }
        };
        if self.len() >= PARALLEL_ELEMENTS {
            out.par_chunks_mut(row_bytes).enumerate().for_each(|(row, dst)| copy_row(row, dst));
        } else {
            for (row, dst) in out.chunks_mut(row_bytes).enumerate().take(rows) {
                copy_row(row, dst);
            }
        }
    }

    /// The elements, row-major, as a `Vec<T>`.
    ///
    /// # Errors
    /// [`Error::DTypeMismatch`] unless `T` is the tensor's dtype; [`Error::Meta`] for a meta
    /// tensor; [`Error::Expansion`] and [`Error::Allocation`] as for
    /// [`to_bytes`](Tensor::to_bytes).
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        if T::DTYPE != self.dtype {
            return Err(Error::DTypeMismatch { expected: T::DTYPE, found: self.dtype });
        }
        let bytes = self.to_bytes()?;
        check_bools(self.dtype, &bytes)?;
        let mut out: Vec<T> = Vec::new();
        out.try_reserve_exact(self.len()).map_err(|_| Error::Allocation { op: "to_vec", bytes: bytes.len() })?;
        assert_eq!(bytes.len(), self.len() * std::mem::size_of::<T>(), "packed bytes of the tensor's elements");
        // SAFETY: `out` has capacity for `len` elements of `T`, and `bytes` holds exactly
        // `len * size_of::<T>()` bytes (asserted above). The bytes are a valid `T` each: plain
        // numbers accept every bit pattern and BOOL bytes were checked just now to be 0 or 1.
        // The copy is bytewise, so the alignment of `bytes` does not matter.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), out.as_mut_ptr().cast::<u8>(), bytes.len());
            out.set_len(self.len());
        }
        Ok(out)
    }

    /// A contiguous tensor's elements as a slice of `T`, borrowed from the storage.
    ///
    /// `Ok(None)` for a view that is not one contiguous range: call [`Tensor::contiguous`]
    /// first.
    ///
    /// # Errors
    /// [`Error::DTypeMismatch`] unless `T` is the tensor's dtype, [`Error::Meta`] for a meta
    /// tensor, [`Error::InvalidBool`] for a BOOL byte other than 0 or 1.
    pub fn as_slice<T: Element>(&self) -> Result<Option<&[T]>> {
        if T::DTYPE != self.dtype {
            return Err(Error::DTypeMismatch { expected: T::DTYPE, found: self.dtype });
        }
        if self.is_meta() {
            return Err(Error::Meta { op: "as_slice" });
        }
        if !self.is_contiguous() {
            return Ok(None);
        }
        let bytes = self.to_bytes_cow();
        let Cow::Borrowed(bytes) = bytes else { return Ok(None) };
        check_bools(self.dtype, bytes)?;
        let address = bytes.as_ptr() as usize;
        if !address.is_multiple_of(std::mem::align_of::<T>()) {
            return Err(Error::Misaligned { dtype: self.dtype, address, alignment: std::mem::align_of::<T>() });
        }
        assert_eq!(bytes.len(), self.len() * std::mem::size_of::<T>(), "packed bytes of the tensor's elements");
        // SAFETY: `bytes` is `len * size_of::<T>()` bytes (asserted above), borrowed from the
        // storage for as long as `self`; its start is aligned for `T` (checked just now, and
        // guaranteed anyway by 8-aligned owned buffers and the alignment check of
        // `from_shared`); each element is a valid `T`: plain numbers accept every bit pattern
        // and BOOL bytes were checked just now to be 0 or 1.
        Ok(Some(unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast::<T>(), self.len()) }))
    }

    /// The same values in another float dtype (f16, bf16, f32, f64). The same dtype returns
    /// this tensor unchanged (shared, no copy). Large tensors convert on all cores.
    ///
    /// # Errors
    /// [`Error::NotCastable`] for any other pair of dtypes; bytes are never reinterpreted.
    /// A meta tensor casts to a meta tensor of the new dtype. [`Error::Expansion`] and
    /// [`Error::Allocation`] as for [`to_bytes`](Tensor::to_bytes).
    pub fn to_dtype(&self, dtype: DType) -> Result<Tensor> {
        if dtype == self.dtype {
            return Ok(self.clone());
        }
        if !self.dtype.is_castable_float() || !dtype.is_castable_float() {
            return Err(Error::NotCastable { from: self.dtype, to: dtype });
        }
        if self.is_meta() {
            return Ok(Tensor::meta(dtype, &self.shape));
        }
        let source = self.contiguous_within(self.expansion_limit())?;
        let count = self.len();
        let out_bytes = packed_bytes(dtype, count);
        let mut buf =
            AlignedBuf::try_zeroed(out_bytes).ok_or(Error::Allocation { op: "to_dtype", bytes: out_bytes })?;
        advise_huge_pages(buf.as_mut_bytes());
        let input = source.to_bytes_cow();
        convert(self.dtype, &input, dtype, buf.as_mut_bytes());
        Ok(Tensor::with_storage(Storage::Owned(buf), dtype, &self.shape))
    }
}

fn check_bools(dtype: DType, bytes: &[u8]) -> Result<()> {
    if dtype == DType::Bool
        && let Some((index, &value)) = bytes.iter().enumerate().find(|(_, b)| **b > 1)
    {
        return Err(Error::InvalidBool { index, value });
    }
    Ok(())
}

/// The size of a transparent huge page on the targets that [`advise_huge_pages`] serves.
#[cfg(target_os = "linux")]
const HUGE_PAGE_BYTES: usize = 2 << 20;

/// Asks the kernel to back the huge-page-aligned part of a fresh buffer, before it is first
/// written, with transparent huge pages where the system leaves them to `madvise` (the common
/// default). A cast or gather fills every byte of its output, so this costs no memory; it
/// replaces one page fault per 4 KiB with one per 2 MiB, which on a 1 GiB checkpoint is most of
/// the time a cast to f32 takes. Only a hint: refusals are ignored and the bytes are unchanged.
#[cfg(target_os = "linux")]
pub(crate) fn advise_huge_pages(bytes: &mut [u8]) {
    let start = (bytes.as_ptr() as usize).next_multiple_of(HUGE_PAGE_BYTES);
    let end = (bytes.as_ptr() as usize + bytes.len()) / HUGE_PAGE_BYTES * HUGE_PAGE_BYTES;
    if end >= start + 2 * HUGE_PAGE_BYTES {
        // SAFETY: `[start, end)` is page-aligned and lies inside `bytes`, which this function
        // borrows mutably, so no other code uses that memory now. `MADV_HUGEPAGE` changes only
        // which physical pages back the range, never its contents, and the result is ignored
        // because a refusal leaves the buffer as it was.
        unsafe {
            libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE);
        }
    }
}

/// Elsewhere the hint is not given.
#[cfg(not(target_os = "linux"))]
pub(crate) fn advise_huge_pages(_bytes: &mut [u8]) {}

/// Converts packed float elements between two castable float dtypes.
fn convert(from: DType, input: &[u8], to: DType, output: &mut [u8]) {
    let in_size = from.size_in_bytes().expect("castable floats are byte-sized");
    let out_size = to.size_in_bytes().expect("castable floats are byte-sized");
    let chunk = 1 << 14;
    let count = input.len() / in_size;
    if count >= PARALLEL_ELEMENTS {
        input
            .par_chunks(chunk * in_size)
            .zip(output.par_chunks_mut(chunk * out_size))
            .for_each(|(src, dst)| convert_chunk(from, src, to, dst));
    } else {
        convert_chunk(from, input, to, output);
    }
}

/// Reads a slice of `T` from unaligned bytes, borrowing when the bytes happen to be aligned.
fn pod_slice<T: bytemuck::Pod>(bytes: &[u8]) -> Cow<'_, [T]> {
    match bytemuck::try_cast_slice(bytes) {
        Ok(slice) => Cow::Borrowed(slice),
        Err(_) => Cow::Owned(bytemuck::pod_collect_to_vec(bytes)),
    }
}

fn convert_chunk(from: DType, input: &[u8], to: DType, output: &mut [u8]) {
    use half::slice::HalfFloatSliceExt;
    let out_words = output.len();
    match (from, to) {
        // bf16 is the top half of an f32: widening is a shift, exact for every value (NaN too).
        (DType::BF16, DType::F32) => {
            let src = pod_slice::<u16>(input);
            let dst: &mut [u32] = bytemuck::cast_slice_mut(output);
            for (d, &s) in dst.iter_mut().zip(src.iter()) {
                *d = u32::from(s) << 16;
            }
        }
        (DType::F16, DType::F32) => {
            let src = pod_slice::<f16>(input);
            src.convert_to_f32_slice(bytemuck::cast_slice_mut(output));
        }
        (DType::F32, DType::F16) => {
            let src = pod_slice::<f32>(input);
            bytemuck::cast_slice_mut::<u8, f16>(output).convert_from_f32_slice(&src);
        }
        (DType::F32, DType::BF16) => {
            let src = pod_slice::<f32>(input);
            bytemuck::cast_slice_mut::<u8, bf16>(output).convert_from_f32_slice(&src);
        }
        (DType::F16, DType::F64) => {
            pod_slice::<f16>(input).convert_to_f64_slice(bytemuck::cast_slice_mut(output));
        }
        (DType::BF16, DType::F64) => {
            pod_slice::<bf16>(input).convert_to_f64_slice(bytemuck::cast_slice_mut(output));
        }
        (DType::F64, DType::F16) => {
            let src = pod_slice::<f64>(input);
            bytemuck::cast_slice_mut::<u8, f16>(output).convert_from_f64_slice(&src);
        }
        (DType::F64, DType::BF16) => {
            let src = pod_slice::<f64>(input);
            bytemuck::cast_slice_mut::<u8, bf16>(output).convert_from_f64_slice(&src);
        }
        (DType::F32, DType::F64) => {
            let dst: &mut [f64] = bytemuck::cast_slice_mut(output);
            for (d, &s) in dst.iter_mut().zip(pod_slice::<f32>(input).iter()) {
                *d = f64::from(s);
            }
        }
        (DType::F64, DType::F32) => {
            let dst: &mut [f32] = bytemuck::cast_slice_mut(output);
            for (d, &s) in dst.iter_mut().zip(pod_slice::<f64>(input).iter()) {
                *d = s as f32;
            }
        }
        // f16 <-> bf16 go through f32, which holds both exactly.
        (DType::F16 | DType::BF16, DType::BF16 | DType::F16) => {
            let mut wide = vec![0u8; out_words * 2];
            convert_chunk(from, input, DType::F32, &mut wide);
            convert_chunk(DType::F32, &wide, to, output);
        }
        _ => unreachable!("`to_dtype` only converts among f16, bf16, f32 and f64"),
    }
}

// Cloning shares the storage, on every device.
impl<D: Device> Clone for Tensor<D> {
    fn clone(&self) -> Tensor<D> {
        Tensor {
            storage: Arc::clone(&self.storage),
            dtype: self.dtype,
            shape: self.shape.clone(),
            strides: self.strides.clone(),
            offset: self.offset,
            device: self.device.clone(),
        }
    }
}

impl<D: Device> fmt::Debug for Tensor<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tensor")
            .field("device", &self.device)
            .field("dtype", &self.dtype)
            .field("shape", &self.shape)
            .field("strides", &self.strides)
            .field("offset", &self.offset)
            .field("meta", &self.storage.is_meta())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strided_views_are_checked_against_the_elements() {
        let base = Tensor::from_vec((0..6).collect::<Vec<i32>>(), &[6]).unwrap();
        let transposed = base.as_strided(&[3, 2], &[1, 3], 0).unwrap();
        assert_eq!(transposed.to_vec::<i32>().unwrap(), [0, 3, 1, 4, 2, 5]);
        assert!(transposed.shares_storage(&base));
        let repeated = base.as_strided(&[2, 3], &[0, 1], 3).unwrap();
        assert_eq!(repeated.to_vec::<i32>().unwrap(), [3, 4, 5, 3, 4, 5]);
        let scalar = base.as_strided(&[], &[], 5).unwrap();
        assert_eq!(scalar.to_vec::<i32>().unwrap(), [5]);
        assert!(base.as_strided(&[0, 5], &[5, 1], 6).is_ok());
        assert!(matches!(base.as_strided(&[3, 2], &[1, 3], 1), Err(Error::StridedOutOfRange { len: 6, .. })));
        assert!(matches!(base.as_strided(&[], &[], 6), Err(Error::StridedOutOfRange { .. })));
        assert!(matches!(base.as_strided(&[2], &[usize::MAX], 0), Err(Error::StridedOutOfRange { .. })));
        assert!(matches!(base.as_strided(&[2], &[1, 1], 0), Err(Error::LengthMismatch { .. })));
        assert!(matches!(transposed.as_strided(&[1], &[1], 0), Err(Error::BadShape { .. })));
    }

    #[test]
    fn views_share_storage() {
        let t = Tensor::from_vec((0..24).map(|v| v as f32).collect(), &[2, 3, 4]).unwrap();
        let v = t.transpose(0, 2).unwrap();
        assert!(v.shares_storage(&t));
        assert!(!v.is_contiguous());
        assert_eq!(v.shape(), &[4, 3, 2]);
        let parts = t.split(2, 2).unwrap();
        assert_eq!(parts[1].contiguous().to_vec::<f32>().unwrap()[..2], [2.0, 3.0]);
    }

    #[test]
    fn casts_between_floats() {
        let t = Tensor::from_vec(vec![1.5f32, -2.25, 65504.0], &[3]).unwrap();
        let h = t.to_dtype(DType::F16).unwrap();
        assert_eq!(h.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap(), [1.5, -2.25, 65504.0]);
        let b = t.to_dtype(DType::BF16).unwrap().to_dtype(DType::F64).unwrap();
        assert_eq!(b.to_vec::<f64>().unwrap(), [1.5, -2.25, 65536.0]);
        assert!(matches!(Tensor::zeros(DType::I32, &[2]).to_dtype(DType::F32), Err(Error::NotCastable { .. })));
    }

    #[test]
    fn wrong_element_type_is_refused() {
        let t = Tensor::zeros(DType::F32, &[2]);
        assert!(matches!(t.to_vec::<i32>(), Err(Error::DTypeMismatch { .. })));
        assert!(matches!(Tensor::meta(DType::F32, &[2]).to_vec::<f32>(), Err(Error::Meta { .. })));
        assert!(matches!(Tensor::from_bytes(DType::Bool, &[2], &[0, 2]), Err(Error::InvalidBool { index: 1, .. })));
    }

    // The tests below walk every `unsafe` path of tensors (typed reads of owned and shared
    // storage, views, gathers, casts) on small data, so that Miri checks them quickly.

    /// Bytes owned by the test, shared the way a file mapping is.
    struct Bytes(AlignedBuf);

    // SAFETY: the buffer is owned, never written after construction and never reallocated.
    unsafe impl ByteSource for Bytes {
        fn bytes(&self) -> &[u8] {
            self.0.as_bytes()
        }

        fn is_file_mapping(&self) -> bool {
            false
        }
    }

    fn source(bytes: &[u8]) -> Arc<dyn ByteSource> {
        Arc::new(Bytes(AlignedBuf::from_bytes(bytes)))
    }

    fn le_bytes(values: &[f32]) -> Vec<u8> {
        values.iter().flat_map(|value| value.to_le_bytes()).collect()
    }

    #[test]
    fn shared_tensors_are_borrowed_typed_and_viewed() {
        let values: Vec<f32> = (0..12).map(|v| v as f32).collect();
        let mut bytes = vec![0u8; 8];
        bytes.extend(le_bytes(&values));
        let shared = source(&bytes);
        let t = Tensor::from_shared(shared.clone(), 8, 48, DType::F32, &[3, 4]).unwrap();
        let slice = t.as_slice::<f32>().unwrap().unwrap();
        assert_eq!(slice, values.as_slice());
        assert_eq!(slice.as_ptr().cast::<u8>(), shared.bytes()[8..].as_ptr(), "the slice borrows the source");
        assert_eq!(t.to_vec::<f32>().unwrap(), values);

        let columns = t.transpose(0, 1).unwrap();
        assert_eq!(columns.as_slice::<f32>().unwrap(), None, "a strided view is not one range");
        assert_eq!(columns.contiguous().to_vec::<f32>().unwrap(), [0., 4., 8., 1., 5., 9., 2., 6., 10., 3., 7., 11.]);
        let middle = t.narrow(1, 1, 2).unwrap().narrow(0, 1, 2).unwrap();
        assert_eq!(middle.to_vec::<f32>().unwrap(), [5., 6., 9., 10.]);
        let last_row = t.narrow(0, 2, 1).unwrap();
        assert_eq!(last_row.as_slice::<f32>().unwrap().unwrap(), [8., 9., 10., 11.]);
        let parts = t.split(1, 2).unwrap();
        assert_eq!(
            parts[1].permute(&[1, 0]).unwrap().contiguous().to_vec::<f32>().unwrap(),
            [2., 6., 10., 3., 7., 11.]
        );
        assert_eq!(columns.reshape(&[12]).unwrap().to_vec::<f32>().unwrap()[..4], [0., 4., 8., 1.]);

        let detached = middle.copy();
        assert!(!detached.shares_storage(&t));
        drop((t, columns, parts, last_row, middle));
        assert_eq!(detached.as_slice::<f32>().unwrap().unwrap(), [5., 6., 9., 10.]);
    }

    #[test]
    fn shared_tensors_check_range_length_alignment_and_bools() {
        let shared = source(&[0, 1, 1, 0, 2, 0, 0, 0]);
        assert!(matches!(
            Tensor::from_shared(shared.clone(), 6, 4, DType::U8, &[4]),
            Err(Error::SharedRange { start: 6, end: 10, len: 8 })
        ));
        assert!(matches!(
            Tensor::from_shared(shared.clone(), usize::MAX, 2, DType::U8, &[2]),
            Err(Error::SharedRange { .. })
        ));
        assert!(matches!(Tensor::from_shared(shared.clone(), 0, 3, DType::U8, &[4]), Err(Error::ByteLength { .. })));
        assert!(matches!(Tensor::from_shared(shared.clone(), 1, 4, DType::F32, &[1]), Err(Error::Misaligned { .. })));
        assert!(matches!(
            Tensor::from_shared(shared.clone(), 0, 5, DType::Bool, &[5]),
            Err(Error::InvalidBool { index: 4, value: 2 })
        ));
        let flags = Tensor::from_shared(shared, 0, 4, DType::Bool, &[2, 2]).unwrap();
        assert_eq!(flags.as_slice::<bool>().unwrap().unwrap(), [false, true, true, false]);
        assert_eq!(flags.transpose(0, 1).unwrap().to_vec::<bool>().unwrap(), [false, true, true, false]);
    }

    #[test]
    fn every_element_type_round_trips() {
        fn round_trip<T: Element + PartialEq + fmt::Debug>(values: Vec<T>) {
            let shape = [values.len()];
            let t = Tensor::from_vec(values.clone(), &shape).unwrap();
            assert_eq!(t.as_slice::<T>().unwrap().unwrap(), values.as_slice());
            assert_eq!(t.to_vec::<T>().unwrap(), values);
            let again = Tensor::from_bytes(T::DTYPE, &shape, &t.to_bytes().unwrap()).unwrap();
            assert_eq!(again.to_vec::<T>().unwrap(), values);
        }
        round_trip(vec![1.5f32, -0.0, f32::MAX]);
        round_trip(vec![1.5f64, f64::MIN_POSITIVE]);
        round_trip(vec![f16::from_f32(0.5), f16::MAX]);
        round_trip(vec![bf16::from_f32(-3.0), bf16::MIN]);
        round_trip(vec![0u8, 255]);
        round_trip(vec![-128i8, 127]);
        round_trip(vec![u16::MAX, 1]);
        round_trip(vec![i16::MIN, 2]);
        round_trip(vec![u32::MAX, 3]);
        round_trip(vec![i32::MIN, 4]);
        round_trip(vec![u64::MAX, 5]);
        round_trip(vec![i64::MIN, 6]);
        round_trip(vec![true, false, true]);
        round_trip(Vec::<f32>::new());
    }

    #[test]
    fn casts_of_shared_strided_views() {
        let values = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
        let t = Tensor::from_shared(source(&le_bytes(&values)), 0, 24, DType::F32, &[2, 3]).unwrap();
        let half = t.transpose(0, 1).unwrap().to_dtype(DType::BF16).unwrap();
        assert_eq!(half.shape(), &[3, 2]);
        assert_eq!(half.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap(), [1., 4., 2., 5., 3., 6.]);
        let sixteen = t.to_dtype(DType::F16).unwrap();
        assert_eq!(sixteen.as_slice::<f16>().unwrap().unwrap()[5], f16::from_f32(6.0));
    }
}
