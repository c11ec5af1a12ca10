//! Telling what a file is when it is not SafeTensors, so the error can say what to do.

pub use crate::error::FileKind;

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|window| window == needle)
}

/// Whether the file starts as SafeTensors does: a plausible header length, then `{`. Such a file
/// is a damaged SafeTensors file whatever its first bytes resemble (a header of 640 bytes starts
/// with `80 02`, the start of a pickle).
pub(crate) fn looks_like_safetensors(bytes: &[u8]) -> bool {
    match (bytes.first_chunk::<8>(), bytes.get(8)) {
        (Some(prefix), Some(b'{')) => u64::from_le_bytes(*prefix) <= crate::header::MAX_HEADER_BYTES,
        _ => false,
    }
}

/// Recognises a few formats from their first and last bytes; `None` when the file looks like
/// none of them (a damaged SafeTensors file, most likely).
pub fn sniff(bytes: &[u8]) -> Option<FileKind> {
    if looks_like_safetensors(bytes) {
        return None;
    }
    if bytes.starts_with(b"PK\x03\x04") || bytes.starts_with(b"PK\x05\x06") {
        // The central directory at the end names the members.
        let tail = &bytes[bytes.len().saturating_sub(64 * 1024)..];
        return Some(if contains(tail, b"data.pkl") {
            FileKind::PyTorchZip
        } else if contains(tail, b".npy") {
            FileKind::Npz
        } else {
            FileKind::Zip
        });
    }
    if bytes.starts_with(b"GGUF") {
        return Some(FileKind::Gguf);
    }
    if bytes.starts_with(b"\x93NUMPY") {
        return Some(FileKind::Npy);
    }
    if bytes.starts_with(b"\x89HDF\r\n\x1a\n") {
        return Some(FileKind::Hdf5);
    }
    // Pickle protocol 2+ starts with PROTO (0x80) and the protocol number.
    if bytes.len() >= 2 && bytes[0] == 0x80 && (2..=5).contains(&bytes[1]) {
        return Some(FileKind::Pickle);
    }
    let head = &bytes[..bytes.len().min(512)];
    let printable = head.iter().all(|&b| b.is_ascii_graphic() || b.is_ascii_whitespace());
    if !head.is_empty() && printable {
        return Some(FileKind::Text);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recognises_common_formats() {
        assert_eq!(sniff(b"GGUF\x03\x00\x00\x00"), Some(FileKind::Gguf));
        assert_eq!(sniff(b"\x93NUMPY\x01\x00"), Some(FileKind::Npy));
        assert_eq!(sniff(b"\x80\x02\x8a\x0alo"), Some(FileKind::Pickle));
        assert_eq!(sniff(b"version https://git-lfs.github.com/spec/v1\n"), Some(FileKind::Text));
        assert_eq!(sniff(b"PK\x03\x04....archive/data.pkl...."), Some(FileKind::PyTorchZip));
        assert_eq!(sniff(b"\x10\x00\x00\x00\x00\x00\x00\x00{\x00"), None);
        // A SafeTensors header of 0x280 bytes starts with the bytes of a pickle's PROTO 2.
        assert_eq!(sniff(b"\x80\x02\x00\x00\x00\x00\x00\x00{\"a\""), None);
    }
}
