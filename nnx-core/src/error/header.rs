//! What is wrong with a SafeTensors header, for [`super::Error::Header`].

use std::fmt;

use crate::DType;

/// What is wrong with a header. Each message says what was found and what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum HeaderProblem {
    /// The file is empty.
    Empty,
    /// Fewer than the 8 bytes of the length prefix.
    TooShort {
        /// Bytes in the file.
        len: usize,
    },
    /// A header length over the limit (`nnx_io::header::MAX_HEADER_BYTES`).
    TooLarge {
        /// The declared length.
        declared: u64,
        /// The largest header accepted.
        limit: u64,
    },
    /// A header length that runs past the end of the file.
    PastEnd {
        /// The declared length.
        declared: u64,
        /// Bytes in the file.
        file_len: usize,
    },
    /// The header is not UTF-8.
    InvalidUtf8 {
        /// Byte offset in the header of the first invalid byte.
        at: usize,
    },
    /// The header is not JSON, or not an object.
    InvalidJson {
        /// The parser's message.
        message: String,
    },
    /// A name used twice.
    DuplicateName {
        /// The name.
        name: String,
    },
    /// An entry named `""`.
    EmptyName,
    /// An entry that is not `{"dtype", "shape", "data_offsets"}`.
    BadEntry {
        /// The entry.
        name: String,
        /// The parser's message.
        message: String,
    },
    /// A dtype the format does not define.
    UnknownDType {
        /// The entry.
        name: String,
        /// The dtype text.
        dtype: String,
    },
    /// `__metadata__` that is not an object of strings.
    BadMetadata {
        /// The metadata key at fault, if one.
        key: Option<String>,
        /// What the value was.
        found: String,
    },
    /// `__metadata__` whose keys and values pass the 64 MiB that nnx-io keeps of a file's text.
    MetadataTooLarge {
        /// The key at which the limit was passed.
        key: String,
        /// The bytes asked for up to and including that key.
        asked: usize,
        /// The most accepted.
        limit: usize,
    },
    /// A shape whose element or byte count overflows.
    Overflow {
        /// The entry.
        name: String,
        /// Its shape.
        shape: Vec<u64>,
    },
    /// Sub-byte elements that do not fill whole bytes.
    PartialByte {
        /// The entry.
        name: String,
        /// Its dtype.
        dtype: DType,
        /// Its shape.
        shape: Vec<usize>,
    },
    /// `data_offsets` with end before begin.
    Reversed {
        /// The entry.
        name: String,
        /// Declared begin.
        begin: u64,
        /// Declared end.
        end: u64,
    },
    /// Offsets whose length disagrees with dtype and shape.
    ByteLength {
        /// The entry.
        name: String,
        /// Its dtype.
        dtype: DType,
        /// Its shape.
        shape: Vec<usize>,
        /// Bytes dtype and shape need.
        expected: u64,
        /// Bytes the offsets span.
        found: u64,
    },
    /// Bytes no entry covers.
    Hole {
        /// The entry after the gap.
        name: String,
        /// Where the data should have continued.
        expected: usize,
        /// Where the entry starts.
        found: usize,
    },
    /// Two entries sharing bytes.
    Overlap {
        /// The later entry.
        name: String,
        /// The entry it overlaps.
        other: String,
    },
    /// Entry data past the end of the file.
    DataPastEnd {
        /// The entry.
        name: String,
        /// Its end, as a file offset.
        end: u64,
        /// Bytes in the file.
        file_len: usize,
    },
    /// Bytes after the last entry.
    Trailing {
        /// How many.
        bytes: usize,
    },
}

impl fmt::Display for HeaderProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const DAMAGED: &str = "the file is damaged or was not written by a SafeTensors writer; write it again";
        match self {
            HeaderProblem::Empty => {
                write!(f, "the file is empty (0 bytes): it was truncated or never written; write it again")
            }
            HeaderProblem::TooShort { len } => write!(
                f,
                "the file has {len} bytes, fewer than the 8-byte header length; it is truncated: download or write it again"
            ),
            HeaderProblem::TooLarge { declared, limit } => {
                write!(f, "the header claims {declared} bytes, over the {limit}-byte limit; {DAMAGED}")
            }
            HeaderProblem::PastEnd { declared, file_len } => write!(
                f,
                "the header claims {declared} bytes but the file has only {file_len}; it is truncated: download or write it again"
            ),
            HeaderProblem::InvalidUtf8 { at } => {
                write!(f, "the header is not UTF-8 (invalid byte at header offset {at}); {DAMAGED}")
            }
            HeaderProblem::InvalidJson { message } => {
                write!(f, "the header is not a JSON object ({message}); {DAMAGED}")
            }
            HeaderProblem::DuplicateName { name } => {
                write!(f, "the name `{name}` appears twice; rename one of the entries when writing")
            }
            HeaderProblem::EmptyName => write!(f, "an entry has an empty name; give every tensor a name when writing"),
            HeaderProblem::BadEntry { name, message } => {
                write!(f, "entry `{name}` is not {{\"dtype\", \"shape\", \"data_offsets\"}} ({message}); {DAMAGED}")
            }
            HeaderProblem::UnknownDType { name, dtype } => {
                write!(f, "entry `{name}` has dtype `{dtype}`, which SafeTensors does not define; {DAMAGED}")
            }
            HeaderProblem::BadMetadata { key: Some(key), found } => write!(
                f,
                "`__metadata__` value `{key}` is {found}, not a string; store structured values as JSON strings"
            ),
            HeaderProblem::BadMetadata { key: None, found } => {
                write!(f, "`__metadata__` is {found}, not an object of strings; store it as string keys and values")
            }
            HeaderProblem::MetadataTooLarge { key, asked, limit } => write!(
                f,
                "`__metadata__` reaches {asked} bytes at key `{key}`, over the {limit}-byte limit for metadata; {DAMAGED}, with less metadata"
            ),
            HeaderProblem::Overflow { name, shape } => {
                write!(f, "entry `{name}` has shape {shape:?}, whose size overflows; {DAMAGED}")
            }
            HeaderProblem::PartialByte { name, dtype, shape } => {
                write!(f, "entry `{name}` ({dtype} {shape:?}) does not fill whole bytes; pad the tensor to whole bytes")
            }
            HeaderProblem::Reversed { name, begin, end } => {
                write!(f, "entry `{name}` has data_offsets [{begin}, {end}], ending before it begins; {DAMAGED}")
            }
            HeaderProblem::ByteLength { name, dtype, shape, expected, found } => write!(
                f,
                "entry `{name}` is {dtype} {shape:?}, which takes {expected} bytes, but its data_offsets span {found}; {DAMAGED}"
            ),
            HeaderProblem::Hole { name, expected, found } => write!(
                f,
                "entry `{name}` starts at data byte {found} but the previous entry ends at {expected}, leaving a hole; {DAMAGED}"
            ),
            HeaderProblem::Overlap { name, other } => {
                write!(f, "entries `{other}` and `{name}` share bytes; {DAMAGED}")
            }
            HeaderProblem::DataPastEnd { name, end, file_len } => write!(
                f,
                "entry `{name}` ends at file byte {end} but the file has only {file_len}; it is truncated: download or write it again"
            ),
            HeaderProblem::Trailing { bytes } => write!(f, "{bytes} bytes follow the last entry; {DAMAGED}"),
        }
    }
}
