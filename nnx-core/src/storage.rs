//! Where a tensor's bytes live: an owned aligned buffer, bytes shared with an owner such as a
//! file mapping, or nowhere (meta tensors).

use std::fmt;
use std::sync::Arc;

/// Bytes owned by someone else that tensors may point into without copying.
///
/// nnx-io implements it for memory-mapped files; a tensor built over it keeps the owner (and so
/// the mapping) alive until the tensor and all its views are dropped.
///
/// # Safety
///
/// Tensors check a source's range, alignment and contents once, when
/// [`Tensor::from_shared`](crate::Tensor::from_shared) builds them, and then hand out typed
/// slices of it ([`Tensor::as_slice`](crate::Tensor::as_slice)). An implementation must
/// therefore guarantee, for as long as the value lives:
///
/// - every call of [`bytes`](ByteSource::bytes) returns the same slice: the same start address
///   and the same length;
/// - nothing writes those bytes while the value is shared (no interior mutability over them,
///   no writable mapping of them elsewhere in the process).
///
/// A read-only mapping of a file satisfies this as long as the file is not changed in place
/// while it is mapped; nnx's own saves never do that (they write a new file and rename it over
/// the old one). BOOL elements are checked again on every typed read, so even a file changed
/// in place by another program cannot produce an invalid `bool`.
pub unsafe trait ByteSource: Send + Sync + 'static {
    /// The whole byte range of the owner: the same slice on every call.
    fn bytes(&self) -> &[u8];

    /// Whether the bytes are pages of a mapped file, reported by [`crate::Tensor::is_mapped`].
    fn is_file_mapping(&self) -> bool {
        true
    }
}

/// An owned byte buffer whose start is aligned to 8 bytes, enough for every element type.
#[derive(Clone)]
pub(crate) struct AlignedBuf {
    words: Vec<u64>,
    len: usize,
}

impl AlignedBuf {
    pub(crate) fn zeroed(len: usize) -> AlignedBuf {
        AlignedBuf { words: vec![0u64; len.div_ceil(8)], len }
    }

    /// [`AlignedBuf::zeroed`] that reports a refused allocation instead of aborting: for
    /// buffers whose size comes from a file.
    pub(crate) fn try_zeroed(len: usize) -> Option<AlignedBuf> {
        let count = len.div_ceil(8);
        if count == 0 {
            return Some(AlignedBuf { words: Vec::new(), len });
        }
        // Zeroed by the allocator (`calloc`): a large buffer comes as fresh pages the kernel
        // zeroes when first touched, rather than being written with zeros and then written again
        // by whoever fills it.
        let layout = std::alloc::Layout::array::<u64>(count).ok()?;
        // SAFETY: the layout has a non-zero size (count > 0).
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) }.cast::<u64>();
        if ptr.is_null() {
            return None;
        }
        // SAFETY: `ptr` was allocated by the global allocator with the layout of `count` u64s
        // (what a `Vec<u64>` of that capacity uses), and all of its bytes are zero, a valid u64.
        let words = unsafe { Vec::from_raw_parts(ptr, count, count) };
        Some(AlignedBuf { words, len })
    }

    pub(crate) fn from_bytes(bytes: &[u8]) -> AlignedBuf {
        let mut buf = AlignedBuf::zeroed(bytes.len());
        buf.as_mut_bytes().copy_from_slice(bytes);
        buf
    }

    pub(crate) fn as_bytes(&self) -> &[u8] {
        &bytemuck::cast_slice(&self.words)[..self.len]
    }

    pub(crate) fn as_mut_bytes(&mut self) -> &mut [u8] {
        &mut bytemuck::cast_slice_mut(&mut self.words)[..self.len]
    }
}

/// The storage behind one or more tensor views.
pub(crate) enum Storage {
    Owned(AlignedBuf),
    Shared { source: Arc<dyn ByteSource>, start: usize, len: usize },
    Meta,
}

impl Storage {
    /// The storage's bytes; `None` for meta storage.
    pub(crate) fn bytes(&self) -> Option<&[u8]> {
        match self {
            Storage::Owned(buf) => Some(buf.as_bytes()),
            // In range: `Tensor::from_shared` checked `start + len` against the source, whose
            // slice never changes (the `ByteSource` contract).
            Storage::Shared { source, start, len } => Some(&source.bytes()[*start..*start + *len]),
            Storage::Meta => None,
        }
    }
}

impl fmt::Debug for Storage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Storage::Owned(buf) => write!(f, "Owned({} bytes)", buf.len),
            Storage::Shared { start, len, source } => {
                write!(f, "Shared({len} bytes at {start}, mapped: {})", source.is_file_mapping())
            }
            Storage::Meta => f.write_str("Meta"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owned_buffers_are_aligned_for_every_element_type() {
        for len in [0, 1, 7, 8, 9, 64] {
            let bytes: Vec<u8> = (0..len as u8).collect();
            let buf = AlignedBuf::from_bytes(&bytes);
            assert_eq!(buf.as_bytes(), bytes.as_slice());
            assert!((buf.as_bytes().as_ptr() as usize).is_multiple_of(8));
            assert_eq!(buf.clone().as_bytes(), bytes.as_slice());
        }
    }

    #[test]
    fn storage_bytes_are_the_shared_range() {
        struct Owned(Vec<u8>);
        // SAFETY: the vector is never written or reallocated after construction.
        unsafe impl ByteSource for Owned {
            fn bytes(&self) -> &[u8] {
                &self.0
            }
        }
        let storage = Storage::Shared { source: Arc::new(Owned((0..10).collect())), start: 2, len: 5 };
        assert_eq!(storage.bytes(), Some(&[2u8, 3, 4, 5, 6][..]));
        assert_eq!(Storage::Meta.bytes(), None);
        assert_eq!(format!("{storage:?}"), "Shared(5 bytes at 2, mapped: true)");
    }
}
