//! Why a PyTorch checkpoint cannot be read, for [`super::Error::Torch`].

use std::fmt;

use crate::DType;

/// Why a PyTorch checkpoint cannot be read.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum TorchProblem {
    /// The pickle stream is broken or does something a state dict never does.
    Pickle {
        /// The pickle (`data.pkl` of a zip, or `the main pickle` of a legacy file).
        pickle: String,
        /// Offset of the opcode in the pickle's bytes.
        offset: usize,
        /// What is wrong.
        problem: PickleProblem,
    },
    /// The zip's central directory cannot be read.
    Zip {
        /// The zip reader's message.
        message: String,
    },
    /// A zip record that cannot be used as it is.
    ZipRecord {
        /// The record's name.
        record: String,
        /// What is wrong.
        problem: ZipRecordProblem,
    },
    /// A zip without a `data.pkl` record under one top folder.
    NoDataPickle,
    /// Records under more than one top folder.
    TopFolders {
        /// The first top folder.
        first: String,
        /// Another one.
        second: String,
    },
    /// A checkpoint written on a big-endian machine.
    BigEndian,
    /// A legacy file whose header pickles are not what `torch.save` writes.
    LegacyHeader,
    /// A storage the pickle names but the file does not hold.
    MissingStorage {
        /// The storage's key.
        key: String,
    },
    /// A storage whose bytes disagree with what the pickle says.
    StorageSize {
        /// The storage's key.
        key: String,
        /// The element type.
        dtype: DType,
        /// Elements the pickle says it holds.
        numel: usize,
        /// Bytes the file holds for it.
        bytes: usize,
    },
    /// The same storage key named with two element types.
    StorageDType {
        /// The storage's key.
        key: String,
    },
    /// A tensor whose shape, strides and offset reach past its storage.
    TensorLayout {
        /// The tensor's name.
        name: String,
        /// Shape.
        shape: Vec<usize>,
        /// Strides, in elements.
        strides: Vec<usize>,
        /// First element.
        offset: usize,
        /// Elements in the storage.
        storage: usize,
    },
    /// The pickled object is not a dict.
    NotADict,
    /// A tensor name given twice.
    DuplicateName {
        /// The name.
        name: String,
    },
    /// Names and plain values whose text passes the 64 MiB that nnx-io keeps of a file's text: a value
    /// the pickle refers to far more often than any checkpoint does.
    TooMuchText {
        /// The entry at which the limit was passed.
        name: String,
        /// The bytes asked for up to and including that entry.
        asked: usize,
        /// The most accepted.
        limit: usize,
    },
    /// Dicts nested deeper than a checkpoint ever is, or more values than one ever has.
    TooDeep {
        /// Where the walk stopped.
        name: String,
    },
}

/// What is wrong with a zip record, for [`TorchProblem::ZipRecord`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ZipRecordProblem {
    /// Compressed, where `torch.save` stores records as they are.
    Compressed {
        /// The zip compression method (8 for deflate).
        method: u16,
    },
    /// The stored and uncompressed sizes differ.
    Sizes {
        /// Stored bytes.
        compressed: u64,
        /// Uncompressed bytes.
        uncompressed: u64,
    },
    /// The record's bytes lie past the end of the file.
    PastEnd {
        /// The first byte.
        start: u64,
        /// The bytes claimed.
        len: u64,
        /// The file's size.
        file: u64,
    },
    /// A name that is not UTF-8.
    Name,
}

/// What is wrong in a pickle stream, for [`TorchProblem::Pickle`].
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum PickleProblem {
    /// A global other than the few a state dict needs.
    ForbiddenGlobal {
        /// Its module.
        module: String,
        /// Its name.
        name: String,
    },
    /// An opcode outside what `torch.save` writes.
    UnknownOpcode {
        /// The opcode byte.
        opcode: u8,
    },
    /// A pickle protocol above 5.
    Protocol {
        /// The protocol number.
        protocol: u8,
    },
    /// The stream ends before `STOP`.
    Truncated,
    /// Text that is not UTF-8.
    NotUtf8,
    /// An opcode that needs more values than there are.
    StackUnderflow,
    /// An opcode that needs a mark when there is none.
    NoMark,
    /// A memo slot read before it was written.
    MemoMissing {
        /// The slot.
        index: usize,
    },
    /// An integer wider than 64 bits.
    LargeInteger {
        /// Its bytes.
        bytes: usize,
    },
    /// A negative integer, or one too large, where a size or offset is needed.
    NegativeOrHuge {
        /// The value.
        value: i64,
    },
    /// A text persistent id (protocol 0), which `torch.save` never writes.
    TextPersistentId {
        /// The id.
        id: String,
    },
    /// Values that do not fit the opcode.
    Unexpected {
        /// The opcode.
        opcode: &'static str,
        /// What it needs.
        expected: &'static str,
    },
    /// A storage pickled inside the pickle (`torch.storage._load_from_bytes`) that cannot be
    /// read.
    InlineStorage {
        /// What is wrong with it.
        problem: Box<TorchProblem>,
    },
    /// A limit that keeps memory bounded.
    Limit {
        /// Which one.
        limit: PickleLimit,
    },
}

/// A limit of the unpickler, for [`PickleProblem::Limit`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PickleLimit {
    /// A memo slot past the largest one taken.
    Memo {
        /// The slot.
        index: usize,
        /// The largest slot plus one.
        max: usize,
    },
    /// Marks or tuples nested too deeply.
    Depth {
        /// The deepest nesting taken.
        max: usize,
    },
    /// Too many values on the stack.
    Stack {
        /// The most taken.
        max: usize,
    },
    /// Too many items in all containers together.
    Items {
        /// The most taken.
        max: usize,
    },
    /// More bytes made from strings and pickled storages than twice what the pickle holds.
    MadeBytes {
        /// The most taken: twice the pickle's size.
        max: usize,
    },
}

impl fmt::Display for PickleLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PickleLimit::Memo { index, max } => write!(f, "memo slot {index} (at most {max} slots are taken)"),
            PickleLimit::Depth { max } => write!(f, "nesting deeper than {max}"),
            PickleLimit::Stack { max } => write!(f, "more than {max} values on the stack"),
            PickleLimit::Items { max } => write!(f, "more than {max} container items"),
            PickleLimit::MadeBytes { max } => {
                write!(f, "more than {max} bytes made from strings and pickled storages (twice the pickle's size)")
            }
        }
    }
}

impl fmt::Display for PickleProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PickleProblem::ForbiddenGlobal { module, name } => write!(
                f,
                "it calls the global `{module}.{name}`, which a state dict never needs; nothing was run: load it in Python only if you trust its source"
            ),
            PickleProblem::UnknownOpcode { opcode } => write!(f, "opcode {opcode:#04x} is not one `torch.save` writes"),
            PickleProblem::Protocol { protocol } => {
                write!(f, "pickle protocol {protocol} is not supported (at most 5)")
            }
            PickleProblem::Truncated => f.write_str("the stream ends early: the file is truncated"),
            PickleProblem::NotUtf8 => f.write_str("a string is not UTF-8"),
            PickleProblem::StackUnderflow => f.write_str("an opcode needs more values than were pushed"),
            PickleProblem::NoMark => f.write_str("an opcode needs a mark and there is none"),
            PickleProblem::MemoMissing { index } => write!(f, "memo slot {index} is read before it is written"),
            PickleProblem::LargeInteger { bytes } => write!(f, "an integer of {bytes} bytes is wider than 64 bits"),
            PickleProblem::NegativeOrHuge { value } => write!(f, "{value} is not a usable size or offset"),
            PickleProblem::TextPersistentId { id } => write!(f, "text persistent id `{id}` is not a storage"),
            PickleProblem::Unexpected { opcode, expected } => write!(f, "`{opcode}` needs {expected}"),
            PickleProblem::InlineStorage { problem } => write!(f, "a storage pickled inside it: {problem}"),
            PickleProblem::Limit { limit } => {
                write!(f, "{limit}: no checkpoint needs that much; the file is damaged or hostile")
            }
        }
    }
}

impl fmt::Display for ZipRecordProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ZipRecordProblem::Compressed { method } => {
                write!(
                    f,
                    "it is compressed (zip method {method}); `torch.save` stores records uncompressed: save it again with `torch.save`"
                )
            }
            ZipRecordProblem::Sizes { compressed, uncompressed } => {
                write!(f, "it is stored as {compressed} bytes but claims {uncompressed}")
            }
            ZipRecordProblem::PastEnd { start, len, file } => {
                write!(
                    f,
                    "its {len} bytes from offset {start} reach past the end of the file ({file} bytes): the file is truncated"
                )
            }
            ZipRecordProblem::Name => f.write_str("its name is not UTF-8"),
        }
    }
}

impl fmt::Display for TorchProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TorchProblem::Pickle { pickle, offset, problem } => write!(f, "at byte {offset} of {pickle}: {problem}"),
            TorchProblem::Zip { message } => write!(f, "its zip directory cannot be read ({message})"),
            TorchProblem::ZipRecord { record, problem } => write!(f, "record `{record}`: {problem}"),
            TorchProblem::NoDataPickle => {
                f.write_str("the zip has no `data.pkl` record: it is not a `torch.save` checkpoint")
            }
            TorchProblem::TopFolders { first, second } => {
                write!(f, "records lie under two top folders, `{first}` and `{second}`: a checkpoint has one")
            }
            TorchProblem::BigEndian => {
                f.write_str("it was written on a big-endian machine: save it again on a little-endian one")
            }
            TorchProblem::LegacyHeader => f.write_str("its legacy header is not what `torch.save` writes"),
            TorchProblem::MissingStorage { key } => write!(f, "storage `{key}` is named but the file does not hold it"),
            TorchProblem::StorageSize { key, dtype, numel, bytes } => {
                write!(
                    f,
                    "storage `{key}` should hold {numel} {dtype} elements but the file holds {bytes} bytes for it"
                )
            }
            TorchProblem::StorageDType { key } => write!(f, "storage `{key}` is named with two element types"),
            TorchProblem::TensorLayout { name, shape, strides, offset, storage } => write!(
                f,
                "tensor `{name}` (shape {shape:?}, strides {strides:?}, offset {offset}) reaches past its storage of {storage} elements"
            ),
            TorchProblem::NotADict => f.write_str("the pickled object is not a dict of tensors"),
            TorchProblem::DuplicateName { name } => write!(f, "`{name}` is given twice"),
            TorchProblem::TooMuchText { name, asked, limit } => write!(
                f,
                "its entry names and plain values reach {asked} bytes at `{name}`, over the {limit}-byte limit: no checkpoint needs that much (a value is referred to over and over); the file is damaged or hostile, load it in Python only if you trust its source"
            ),
            TorchProblem::TooDeep { name } => {
                write!(f, "values nest too deeply or are too many at `{name}`: no checkpoint does that")
            }
        }
    }
}
