//! Pretrained folders from the Hugging Face Hub: the shared cache that `huggingface_hub`
//! writes and reads, and (with the `hub` feature) the client that downloads into it.

use std::path::{Path, PathBuf};

use crate::Result;

/// The local folder that holds the pretrained model `source`: `source` itself when it is a
/// folder on disk.
///
/// # Errors
/// [`crate::Error::Io`] when `source` is not a folder.
pub fn pretrained_folder(source: &Path) -> Result<PathBuf> {
    if source.is_dir() {
        return Ok(source.to_path_buf());
    }
    Err(crate::Error::Io {
        action: "open the pretrained folder",
        path: source.to_path_buf(),
        source: std::io::Error::new(std::io::ErrorKind::NotFound, "no such folder"),
    })
}
