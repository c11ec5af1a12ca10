//! Where a tensor's bytes live: an owned aligned buffer, bytes shared with an owner such as a
//! file mapping, or nowhere (meta tensors).

use std::fmt;
use std::sync::Arc;

/// Bytes owned by someone else that tensors may point into without copying.
///
/// nnx-io implements it for memory-mapped files; a tensor built over it keeps the owner (and so
/// the mapping) alive until the tensor and all its views are dropped.
pub trait ByteSource: Send + Sync + 'static {
    /// The whole byte range of the owner.
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
