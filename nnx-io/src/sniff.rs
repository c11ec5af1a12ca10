//! Telling what a file is when it is not SafeTensors, so the error can say what to do. The
//! public face of the crate's format detection.

pub use crate::error::FileKind;

/// Recognises a few formats from their first and last bytes; `None` when the file looks like
/// none of them (a damaged SafeTensors file, most likely).
///
/// ```
/// use nnx_io::sniff::{FileKind, sniff};
///
/// assert_eq!(sniff(b"GGUF\x03\x00\x00\x00"), Some(FileKind::Gguf));
/// ```
pub fn sniff(bytes: &[u8]) -> Option<FileKind> {
    crate::format::sniff(bytes)
}
