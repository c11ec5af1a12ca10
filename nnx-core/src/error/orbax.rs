//! Why an Orbax checkpoint cannot be read, for [`super::Error::Orbax`]: its pytree metadata, its
//! OCDBT database (manifest, version tree, B+tree nodes) and its zarr arrays (metadata, chunks,
//! shard indexes), each problem saying what was expected and what was found.

/// Why a file of an Orbax checkpoint cannot be read.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum OrbaxProblem {
    /// An OCDBT record that does not start with the magic number of its kind.
    #[error(
        "{what} starts with {found:#010x}, not the magic {expected:#010x}: the reference points at something else or the file is damaged"
    )]
    Magic {
        /// The record (`the manifest`, `a B+tree node`, ...).
        what: &'static str,
        /// The magic number of the kind.
        expected: u32,
        /// The first four bytes, big-endian.
        found: u32,
    },
    /// Data that ends before what it declares.
    #[error("{what} needs bytes up to {needed} but only {available} are there: the file is truncated or damaged")]
    Truncated {
        /// What was being read.
        what: String,
        /// The byte offset it needs.
        needed: u64,
        /// The bytes there are.
        available: u64,
    },
    /// An OCDBT record whose header length is not its length.
    #[error("{what} declares {declared} bytes in its header but {found} were read for it: the file is damaged")]
    Length {
        /// The record.
        what: &'static str,
        /// The length in its header.
        declared: u64,
        /// The bytes read for it.
        found: u64,
    },
    /// A CRC-32C checksum that does not match the bytes it covers.
    #[error(
        "{what} has the crc32c checksum {stored:#010x} but its bytes sum to {computed:#010x}: the file is damaged; copy the checkpoint again"
    )]
    Checksum {
        /// The record (`a B+tree node`, `the shard index`, ...).
        what: &'static str,
        /// The checksum stored.
        stored: u32,
        /// The checksum of the bytes.
        computed: u32,
    },
    /// A format version or compression method this reader does not know.
    #[error("{what} is {found}, but nnx reads {expected}: write the checkpoint with a released orbax-checkpoint")]
    Unknown {
        /// The field (`the manifest's version`, `the compression format of a B+tree node`).
        what: &'static str,
        /// The value found.
        found: u64,
        /// The values read.
        expected: &'static str,
    },
    /// Compressed data that does not decompress.
    #[error("{what} does not decompress as zstd: {message}")]
    Zstd {
        /// What was compressed.
        what: &'static str,
        /// The decoder's message.
        message: String,
    },
    /// Data that decompresses (or expands) to more than the limit for its kind.
    #[error("{what} takes more than {limit} bytes once decoded, over the limit for it: the file is damaged or hostile")]
    TooLarge {
        /// What was being decoded.
        what: &'static str,
        /// The most bytes accepted.
        limit: u64,
    },
    /// A count or length larger than the bytes that hold it could describe.
    #[error("{what} is {count}, more than the {available} bytes left could hold: the file is damaged")]
    Count {
        /// The count (`the number of entries of a B+tree node`).
        what: &'static str,
        /// The value declared.
        count: u64,
        /// The bytes left to describe it.
        available: u64,
    },
    /// A field of an OCDBT record that breaks the format's rules.
    #[error("{what}: the file is damaged")]
    Malformed {
        /// The rule broken, with the values found.
        what: String,
    },
    /// A data file path that leaves the checkpoint's folder.
    #[error("the data file path `{path}` is not a relative path inside the checkpoint: the file is damaged or hostile")]
    DataPath {
        /// The path as stored.
        path: String,
    },
    /// A reference to bytes past the end of the file (or shard) that should hold them.
    #[error(
        "a reference points at bytes {offset}..{end} of {what}, which has {len} bytes: the file is truncated or damaged"
    )]
    PastEnd {
        /// The file or shard referred to.
        what: &'static str,
        /// The first byte.
        offset: u64,
        /// One past the last byte.
        end: u64,
        /// The bytes there are.
        len: u64,
    },
    /// A JSON document (`_METADATA`, `.zarray`, `zarr.json`) that is not JSON or lacks a field.
    #[error("{what} is not usable: {message}")]
    Json {
        /// The document.
        what: &'static str,
        /// The parser's message or the field missing.
        message: String,
    },
    /// A metadata field whose value nnx does not read.
    #[error("the {field} is {found}, which nnx does not read: it reads {expected}")]
    Unsupported {
        /// The field (`codec`, `data type`, `order`).
        field: &'static str,
        /// The value found.
        found: String,
        /// What it reads.
        expected: &'static str,
    },
    /// An array whose shape (or chunk shape) does not fit the others.
    #[error("the {what} is {found:?}, but {expected}: the metadata is damaged")]
    Shape {
        /// Which shape (`chunk shape`, `inner chunk shape`).
        what: &'static str,
        /// The shape found.
        found: Vec<u64>,
        /// What it must be.
        expected: String,
    },
    /// An array whose values cannot be addressed.
    #[error(
        "the array claims shape {shape:?} of {dtype}, whose bytes overflow what memory can address: the metadata is damaged or hostile"
    )]
    Enormous {
        /// The shape.
        shape: Vec<u64>,
        /// The data type, as stored.
        dtype: String,
    },
    /// A chunk whose decoded bytes are not its shape's.
    #[error(
        "the chunk decodes to {found} bytes, but a chunk of shape {shape:?} takes {expected}: the chunk is damaged"
    )]
    ChunkSize {
        /// The chunk's shape.
        shape: Vec<usize>,
        /// The bytes it takes.
        expected: u64,
        /// The bytes decoded (capped one past `expected`).
        found: u64,
    },
    /// An array named by the pytree metadata with no zarr metadata in the checkpoint.
    #[error(
        "`_METADATA` names the array but the checkpoint holds no `.zarray` or `zarr.json` for it: the checkpoint is incomplete; copy it again"
    )]
    MissingArray,
    /// A global array the system refused the memory for.
    #[error(
        "the global value needs {bytes} bytes, which the system refused: free memory, or read a smaller checkpoint"
    )]
    Memory {
        /// The bytes asked for.
        bytes: u64,
    },
}
