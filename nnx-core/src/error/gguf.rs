//! Why a GGUF file cannot be read, for [`super::Error::Gguf`]: the checks of ggml's own reader,
//! each naming the key or tensor it is about.

/// Why a GGUF file cannot be read.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum GgufProblem {
    /// The file does not start with `GGUF`.
    #[error("it starts with {found:02x?}, not the magic `GGUF`: this is not a GGUF file")]
    Magic {
        /// The first bytes.
        found: Vec<u8>,
    },
    /// A version written by a big-endian machine.
    #[error(
        "its version field reads {version}, which is a byte-swapped version: the file is big-endian; convert it with `gguf-convert-endian FILE little` (from the `gguf` Python package) and open that"
    )]
    BigEndian {
        /// The version as read little-endian.
        version: u32,
    },
    /// A version nnx does not read.
    #[error("it is GGUF version {version}; nnx reads versions 2 and 3: convert it with a current llama.cpp")]
    Version {
        /// The version found.
        version: u32,
    },
    /// The file ends inside its header.
    #[error(
        "it ends at byte {file_len} inside {what}, which needs bytes up to {needed}: the file is truncated; download it again"
    )]
    Truncated {
        /// What was being read.
        what: String,
        /// The byte offset it needs.
        needed: u64,
        /// The file's length.
        file_len: u64,
    },
    /// More tensors or metadata entries than the file could describe.
    #[error("it declares {count} {what}, more than its {file_len} bytes can hold: the file is damaged")]
    Count {
        /// `tensors` or `metadata entries`.
        what: &'static str,
        /// The count declared.
        count: u64,
        /// The file's length.
        file_len: u64,
    },
    /// A string longer than ggml accepts.
    #[error("{what} is a string of {len} bytes, over ggml's limit of {limit}: the file is damaged")]
    StringTooLong {
        /// Which string.
        what: String,
        /// Its declared length.
        len: u64,
        /// The limit.
        limit: u64,
    },
    /// Text that is not UTF-8.
    #[error("{what} is not UTF-8 text: the file is damaged")]
    NotUtf8 {
        /// Which string.
        what: String,
    },
    /// An array longer than ggml accepts.
    #[error("metadata `{key}` is an array of {count} values, over ggml's limit of {limit}: the file is damaged")]
    ArrayTooLong {
        /// The key.
        key: String,
        /// The declared count.
        count: u64,
        /// The limit.
        limit: u64,
    },
    /// Arrays nested deeper than nnx follows.
    #[error("metadata `{key}` nests arrays deeper than {limit} levels: the file is damaged")]
    NestedTooDeep {
        /// The key.
        key: String,
        /// The most levels read.
        limit: usize,
    },
    /// More metadata than nnx keeps for one file.
    #[error(
        "its metadata takes {asked} bytes in memory, over the limit of {limit}: the file is damaged or not a model"
    )]
    MetadataTooLarge {
        /// The bytes asked for so far.
        asked: u64,
        /// The limit.
        limit: u64,
    },
    /// A metadata key that is empty.
    #[error("metadata entry {index} has an empty key: the file is damaged")]
    EmptyKey {
        /// The entry's position.
        index: u64,
    },
    /// A metadata key given twice.
    #[error("metadata key `{key}` is given twice: the file is damaged; rewrite it with one value per key")]
    DuplicateKey {
        /// The key.
        key: String,
    },
    /// A metadata value type that GGUF does not define.
    #[error(
        "metadata `{key}` has value type {type_id}, which GGUF does not define (0 to 12): the file is damaged or newer than nnx"
    )]
    ValueType {
        /// The key.
        key: String,
        /// The type id found.
        type_id: u32,
    },
    /// A boolean that is neither 0 nor 1.
    #[error("metadata `{key}` is a boolean stored as {value}, not 0 or 1: the file is damaged")]
    Bool {
        /// The key.
        key: String,
        /// The byte found.
        value: u8,
    },
    /// `general.alignment` unusable.
    #[error("`general.alignment` is {found}; it must be a non-zero power of two stored as UINT32")]
    Alignment {
        /// What was found, described.
        found: String,
    },
    /// A tensor name longer than ggml's 63 bytes.
    #[error("tensor `{name}` has a name of {len} bytes; ggml allows at most 63")]
    NameTooLong {
        /// The name.
        name: String,
        /// Its length in bytes.
        len: usize,
    },
    /// A tensor named twice.
    #[error("tensor `{name}` is listed twice: the file is damaged")]
    DuplicateTensor {
        /// The name.
        name: String,
    },
    /// More than four dimensions.
    #[error("tensor `{name}` has {dims} dimensions; ggml allows at most 4")]
    Dims {
        /// The tensor.
        name: String,
        /// Its dimension count.
        dims: u32,
    },
    /// A shape whose sizes overflow.
    #[error(
        "tensor `{name}` has dimensions {ne:?} (ggml order) whose product or byte size overflows: the file is damaged"
    )]
    Overflow {
        /// The tensor.
        name: String,
        /// Its `ne`, innermost first.
        ne: Vec<u64>,
    },
    /// A type id ggml does not define.
    #[error(
        "tensor `{name}` has ggml type id {type_id}, which is not a tensor type ggml defines (it may be removed or newer than nnx)"
    )]
    TensorType {
        /// The tensor.
        name: String,
        /// The id found.
        type_id: u32,
    },
    /// Rows that do not hold whole blocks.
    #[error(
        "tensor `{name}` of type {ty} has rows of {row} values, not a multiple of its block of {block}: the file is damaged"
    )]
    PartialBlock {
        /// The tensor.
        name: String,
        /// The type's name.
        ty: &'static str,
        /// Values per row (`ne[0]`).
        row: u64,
        /// Values per block.
        block: usize,
    },
    /// A tensor's data not where the infos before it put it.
    #[error(
        "tensor `{name}` starts at data offset {found}, but the tensors before it end at {expected} (padded to {alignment}): ggml requires the data contiguous and in info order"
    )]
    Offset {
        /// The tensor.
        name: String,
        /// The offset the earlier tensors give.
        expected: u64,
        /// The offset stored.
        found: u64,
        /// The alignment.
        alignment: u64,
    },
    /// A tensor's data past the end of the file.
    #[error(
        "tensor `{name}` needs bytes up to {end}, but the file has {file_len}: the file is truncated; download it again"
    )]
    DataPastEnd {
        /// The tensor.
        name: String,
        /// The end of its data in the file.
        end: u64,
        /// The file's length.
        file_len: u64,
    },
    /// A tensor whose type nnx cannot decode, asked for as floats.
    #[error("tensor `{name}` is stored as {ty}, which nnx cannot decode to floats: {hint}")]
    Undecodable {
        /// The tensor.
        name: String,
        /// The type's name.
        ty: &'static str,
        /// What to do.
        hint: &'static str,
    },
    /// Shards of a split file that do not fit together.
    #[error("shard `{shard}` of a split GGUF file: {message}")]
    Split {
        /// The shard's file name.
        shard: String,
        /// What is wrong.
        message: String,
    },
}
