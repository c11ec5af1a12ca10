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

/// A checkpoint of distributed training, told from a folder's names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum TrainingCheckpoint {
    /// A PyTorch distributed checkpoint: `.metadata` and `.distcp` files.
    Dcp,
    /// A PyTorch distributed checkpoint in the HF storage layout (`shard-*-model-*.safetensors`).
    DcpHf,
    /// An Orbax checkpoint (OCDBT or one folder per array, zarr v2 or zarr3).
    Orbax,
}

impl TrainingCheckpoint {
    /// The format's name, for listings.
    pub fn name(self) -> &'static str {
        match self {
            TrainingCheckpoint::Dcp => "PyTorch distributed checkpoint (DCP)",
            TrainingCheckpoint::DcpHf => "PyTorch distributed checkpoint (DCP, HF storage layout)",
            TrainingCheckpoint::Orbax => "Orbax checkpoint",
        }
    }
}

/// What kind of training checkpoint the folder `dir` holds, as [`crate::Archive::open`] tells
/// it; `None` for anything else (a file among them).
pub fn training_checkpoint(dir: &std::path::Path) -> Option<TrainingCheckpoint> {
    if !dir.is_dir() {
        return None;
    }
    match crate::format::detect(dir).ok()? {
        crate::format::Holds::Dcp(_) => Some(TrainingCheckpoint::Dcp),
        crate::format::Holds::DcpHf(_) => Some(TrainingCheckpoint::DcpHf),
        crate::format::Holds::Orbax(_) => Some(TrainingCheckpoint::Orbax),
        _ => None,
    }
}
