//! Why a distributed checkpoint (PyTorch DCP) cannot be read, for [`super::Error::Dcp`].

use std::fmt;

use super::TorchProblem;

/// Why a distributed checkpoint cannot be read.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum DcpProblem {
    /// `.metadata` holds something other than what `torch.distributed.checkpoint.save` writes.
    Metadata {
        /// Where in it (`state_dict_metadata['model.w'].size`).
        at: String,
        /// What a checkpoint holds there.
        expected: &'static str,
        /// What this one holds.
        found: String,
    },
    /// A tensor chunk or item whose bytes `storage_data` does not place.
    Unplaced {
        /// The entry.
        name: String,
        /// The chunk's offsets in the global tensor (empty for a non-tensor item).
        offsets: Vec<usize>,
    },
    /// A file `storage_data` names that is not a plain file of the folder.
    File {
        /// The name as `.metadata` gives it.
        file: String,
        /// What is wrong (missing, or a path out of the folder).
        problem: &'static str,
    },
    /// Item bytes that reach past the end of their file.
    PastEnd {
        /// The entry.
        name: String,
        /// The file.
        file: String,
        /// Where the item starts.
        offset: u64,
        /// Its bytes.
        length: u64,
        /// The file's size.
        size: u64,
    },
    /// Chunks that do not cover their tensor exactly once.
    Chunks {
        /// The entry.
        name: String,
        /// What is wrong.
        problem: String,
    },
    /// An item whose tensor is not the chunk `.metadata` describes.
    ItemTensor {
        /// The entry.
        name: String,
        /// The chunk's offsets.
        offsets: Vec<usize>,
        /// The dtype and shape `.metadata` gives.
        expected: String,
        /// What the item holds.
        found: String,
    },
    /// An item that cannot be read as `torch.save` wrote it.
    Item {
        /// The entry.
        name: String,
        /// The file.
        file: String,
        /// Where the item starts.
        offset: u64,
        /// What is wrong.
        problem: Box<TorchProblem>,
    },
    /// Items written through stream transforms (compression, say) that nnx does not undo.
    Transform {
        /// The entry.
        name: String,
        /// The transforms `.metadata` names.
        descriptors: Vec<String>,
    },
    /// More entries or chunks than any checkpoint has.
    Limit {
        /// What was counted.
        what: &'static str,
        /// How many there are.
        found: usize,
        /// The most read.
        max: usize,
    },
}

impl fmt::Display for DcpProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DcpProblem::Metadata { at, expected, found } => write!(
                f,
                "`.metadata` holds {found} at {at} where `torch.distributed.checkpoint.save` writes {expected}: the file is damaged or not a checkpoint's"
            ),
            DcpProblem::Unplaced { name, offsets } if offsets.is_empty() => {
                write!(f, "`.metadata` does not say where item `{name}` lies: the checkpoint is incomplete")
            }
            DcpProblem::Unplaced { name, offsets } => write!(
                f,
                "`.metadata` does not say where the chunk of `{name}` at {offsets:?} lies: the checkpoint is incomplete"
            ),
            DcpProblem::File { file, problem } => {
                write!(f, "`.metadata` places items in `{file}`, which {problem}: copy the whole checkpoint folder")
            }
            DcpProblem::PastEnd { name, file, offset, length, size } => write!(
                f,
                "item `{name}` lies at {offset}..{} of `{file}`, past its end ({size} bytes): the file is truncated; copy it again",
                offset.saturating_add(*length)
            ),
            DcpProblem::Chunks { name, problem } => {
                write!(f, "the chunks of `{name}` {problem}: the checkpoint is damaged or incomplete")
            }
            DcpProblem::ItemTensor { name, offsets, expected, found } => write!(
                f,
                "the chunk of `{name}` at {offsets:?} should be {expected} as `.metadata` says, but its item holds {found}"
            ),
            DcpProblem::Item { name, file, offset, problem } => {
                write!(f, "item `{name}` at byte {offset} of `{file}`: {problem}")
            }
            DcpProblem::Transform { name, descriptors } => write!(
                f,
                "item `{name}` was written through the stream transforms {descriptors:?}, which nnx does not undo: save it without `_extensions`"
            ),
            DcpProblem::Limit { what, found, max } => write!(
                f,
                "it has {found} {what}, more than the {max} nnx reads: no checkpoint has that many; the file is damaged or hostile"
            ),
        }
    }
}
