//! The one error of nnx: every public function of every nnx crate returns [`Error`], from a
//! tensor operation to a Hub download, so a program matches on one type. Each variant carries
//! the values needed to say what was expected, what was found and what to do; the problem
//! types it names (one module per subject) and the structured report of a failed load live
//! here too.

use std::fmt;
use std::path::PathBuf;

use crate::DType;

mod archive;
mod dcp;
mod file_kind;
mod gguf;
mod header;
mod hub;
mod orbax;
mod remote;
mod report;
mod torch;

pub use archive::{ConfigProblem, ConfigRule, ExportProblem, IndexProblem, ShardProblem, UnsavableProblem};
pub use dcp::DcpProblem;
pub use file_kind::FileKind;
pub use gguf::GgufProblem;
pub use header::HeaderProblem;
pub use hub::{HubProblem, Missing, Offline};
pub use orbax::OrbaxProblem;
pub use remote::RemoteProblem;
pub use report::{
    DidYouMean, HookError, LoadAction, LoadError, OpChain, Problem, ProblemKind, ProblemSource, SourceOp,
};
pub use torch::{PickleLimit, PickleProblem, TorchProblem, ZipRecordProblem};

/// Result with nnx's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in nnx.
///
/// Its `Debug` is its message with the causes the message does not already quote, as
/// `anyhow` shows an error, so that `fn main() -> nnx::Result<()>` and `unwrap` print what
/// went wrong instead of a dump of the variant; match on the variant for its fields.
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    // Tensors and shapes
    /// A buffer's length does not match the shape it was given.
    #[error("shape {shape:?} holds {expected} elements but {found} were given: pass a shape whose product is {found}")]
    ElementCount {
        /// The requested shape.
        shape: Vec<usize>,
        /// Elements the shape holds.
        expected: usize,
        /// Elements supplied.
        found: usize,
    },
    /// A byte buffer's length does not match dtype and shape.
    #[error("a {dtype} tensor of shape {shape:?} takes {expected} bytes but {found} were given")]
    ByteLength {
        /// The dtype of the tensor.
        dtype: DType,
        /// The shape of the tensor.
        shape: Vec<usize>,
        /// Bytes the dtype and shape need.
        expected: u64,
        /// Bytes supplied.
        found: u64,
    },
    /// A shape whose element or byte count does not fit in memory addresses.
    #[error("shape {shape:?} of dtype {dtype} is too large to address")]
    TooLarge {
        /// The dtype of the tensor.
        dtype: DType,
        /// The shape of the tensor.
        shape: Vec<usize>,
    },
    /// Typed access with a type that is not the tensor's dtype.
    #[error("tensor is {found}, not {expected}: read it as its own dtype or cast it with `to_dtype` first")]
    DTypeMismatch {
        /// The dtype asked for.
        expected: DType,
        /// The tensor's dtype.
        found: DType,
    },
    /// A cast between dtypes other than f16, bf16, f32 and f64.
    #[error(
        "cannot cast {from} to {to}: only f16, bf16, f32 and f64 convert into each other, and bytes are never reinterpreted"
    )]
    NotCastable {
        /// The tensor's dtype.
        from: DType,
        /// The dtype asked for.
        to: DType,
    },
    /// An axis past the tensor's rank.
    #[error("axis {axis} is out of range for a tensor of rank {rank} (shape {shape:?})")]
    AxisOutOfRange {
        /// The axis given.
        axis: usize,
        /// The tensor's rank.
        rank: usize,
        /// The tensor's shape.
        shape: Vec<usize>,
    },
    /// A permutation that is not one of the tensor's axes.
    #[error("{axes:?} is not a permutation of the {rank} axes of shape {shape:?}")]
    BadPermutation {
        /// The axes given.
        axes: Vec<usize>,
        /// The tensor's rank.
        rank: usize,
        /// The tensor's shape.
        shape: Vec<usize>,
    },
    /// A narrow past the end of an axis.
    #[error("cannot take {len} elements from {start} along axis {axis} of size {size} (shape {shape:?})")]
    NarrowOutOfRange {
        /// The axis narrowed.
        axis: usize,
        /// The first index kept.
        start: usize,
        /// The number of indices kept.
        len: usize,
        /// The size of the axis.
        size: usize,
        /// The tensor's shape.
        shape: Vec<usize>,
    },
    /// A split into pieces that do not divide the axis.
    #[error("axis {axis} of shape {shape:?} has size {size}, which {parts} does not divide into equal pieces")]
    NotDivisible {
        /// The axis split.
        axis: usize,
        /// Its size.
        size: usize,
        /// The number of pieces asked for.
        parts: usize,
        /// The tensor's shape.
        shape: Vec<usize>,
    },
    /// A reshape to a shape with another element count.
    #[error("cannot reshape {from:?} ({from_len} elements) into {to:?} ({to_len} elements)")]
    Reshape {
        /// The tensor's shape.
        from: Vec<usize>,
        /// Its element count.
        from_len: usize,
        /// The shape asked for.
        to: Vec<usize>,
        /// That shape's element count.
        to_len: usize,
    },
    /// An operation that needs data on a tensor that has none.
    #[error(
        "`{op}` needs data but the tensor is meta (dtype and shape only): load or import weights into the model first"
    )]
    Meta {
        /// The operation attempted.
        op: &'static str,
    },
    /// A strided view of a dtype narrower than a byte.
    #[error(
        "`{op}` cannot make a strided view of {dtype}, whose elements are smaller than a byte: work on the packed bytes instead"
    )]
    SubByte {
        /// The operation attempted.
        op: &'static str,
        /// The tensor's dtype.
        dtype: DType,
    },
    /// Tensors that cannot be joined.
    #[error("cannot concatenate: {problem}")]
    Concat {
        /// What disagrees.
        problem: ConcatProblem,
    },
    /// A BOOL tensor holding a byte other than 0 or 1.
    #[error("BOOL element {index} holds byte {value}, not 0 or 1: the data is not a valid boolean tensor")]
    InvalidBool {
        /// Element index.
        index: usize,
        /// The byte found.
        value: u8,
    },

    // Storage, views and memory
    /// Bytes shared with an owner that are out of its range.
    #[error("bytes {start}..{end} are outside the {len} bytes of their source")]
    SharedRange {
        /// First byte.
        start: usize,
        /// One past the last byte.
        end: usize,
        /// Bytes in the source.
        len: usize,
    },
    /// Shared bytes whose address does not suit the dtype.
    #[error(
        "bytes at address {address:#x} are not aligned to {alignment} for {dtype}: copy them instead of sharing them"
    )]
    Misaligned {
        /// The dtype.
        dtype: DType,
        /// The address of the first byte.
        address: usize,
        /// The alignment the dtype needs.
        alignment: usize,
    },
    /// A strided view that reaches past the elements it is laid over.
    #[error(
        "a view of shape {shape:?}, strides {strides:?} and offset {offset} reaches past the {len} elements it is laid over"
    )]
    StridedOutOfRange {
        /// The view's shape.
        shape: Vec<usize>,
        /// The view's strides, in elements.
        strides: Vec<usize>,
        /// The view's first element.
        offset: usize,
        /// The elements available.
        len: usize,
    },
    /// Materializing a view that repeats its elements into far more bytes than it is stored in
    /// (a zero stride over a small storage), past the limit of the call.
    #[error(
        "materializing a view of shape {shape:?} (strides {strides:?}) takes {bytes} bytes, over the limit of {limit} bytes for the {stored} bytes it is stored in: the view repeats its elements; if that copy is meant, ask for it with `Tensor::contiguous_within` and a larger limit"
    )]
    Expansion {
        /// The view's shape.
        shape: Vec<usize>,
        /// The view's strides, in elements.
        strides: Vec<usize>,
        /// The bytes the copy would take.
        bytes: usize,
        /// The bytes of the storage under the view.
        stored: usize,
        /// The most bytes allowed.
        limit: usize,
    },
    /// Memory the system refused for a copy whose size comes from a file.
    #[error("cannot allocate {bytes} bytes to {op}: free memory, or read the entry in smaller pieces")]
    Allocation {
        /// What the memory was for.
        op: &'static str,
        /// The bytes asked for.
        bytes: usize,
    },

    // Kernels
    /// Two operands of a kernel whose shapes do not fit together.
    #[error("`{op}` cannot combine shapes {lhs:?} and {rhs:?}: {reason}")]
    ShapeMismatch {
        /// The operation attempted.
        op: &'static str,
        /// The shape of the first operand.
        lhs: Vec<usize>,
        /// The shape of the second operand.
        rhs: Vec<usize>,
        /// Which axes disagree and how they should relate.
        reason: &'static str,
    },
    /// A kernel that computes in floating point given a tensor of another dtype.
    #[error("`{op}` needs a float tensor (f16, bf16, f32 or f64), not {dtype}: convert the values first")]
    NotFloat {
        /// The operation attempted.
        op: &'static str,
        /// The tensor's dtype.
        dtype: DType,
    },
    /// A kernel given a tensor whose rank or layout it does not take.
    #[error("`{op}` needs a tensor of shape {expected}, found {shape:?}")]
    BadShape {
        /// The operation attempted.
        op: &'static str,
        /// The shape the operation takes, in words.
        expected: &'static str,
        /// The tensor's shape.
        shape: Vec<usize>,
    },
    /// A list argument (ids, positions, mask) whose length does not match the tensor.
    #[error("`{op}` needs {expected} {what} for shape {shape:?}, but {found} were given")]
    LengthMismatch {
        /// The operation attempted.
        op: &'static str,
        /// What the list holds.
        what: &'static str,
        /// The entries needed.
        expected: usize,
        /// The entries given.
        found: usize,
        /// The shape of the tensor the list goes with.
        shape: Vec<usize>,
    },
    /// A lookup of a row that the table does not have.
    #[error("`{op}`: id {id} at position {position} is out of range for a table of {rows} rows (shape {shape:?})")]
    IndexOutOfRange {
        /// The operation attempted.
        op: &'static str,
        /// The id asked for.
        id: usize,
        /// Where in the list of ids it was.
        position: usize,
        /// Rows in the table.
        rows: usize,
        /// The table's shape.
        shape: Vec<usize>,
    },

    // Quantization and ggml blocks
    /// Affine quantization parameters MLX does not define.
    #[error(
        "affine quantization with {bits} bits and group size {group_size} is not supported: use bits 2, 3, 4, 5, 6 or 8 and group size 32, 64 or 128"
    )]
    QuantSpec {
        /// The bits per value asked for.
        bits: u32,
        /// The group size asked for.
        group_size: usize,
    },
    /// A weight whose last axis cannot be cut into whole quantization groups or blocks.
    #[error(
        "a weight of shape {shape:?} cannot be quantized in groups of {multiple}: its last axis must be a multiple of {multiple}; pick another group size or leave it unquantized"
    )]
    QuantColumns {
        /// The weight's shape.
        shape: Vec<usize>,
        /// The group or block size the last axis must be a multiple of.
        multiple: usize,
    },
    /// A stream of a quantized weight with the wrong dtype or shape for the others.
    #[error(
        "quantized stream `{stream}` is {found_dtype} {found_shape:?} but {expected_dtype} {expected_shape:?} was expected: the streams do not belong together or the file is damaged"
    )]
    QuantStream {
        /// Which stream (`weight`, `scales`, `seeds`, ...).
        stream: &'static str,
        /// The dtype the other streams call for.
        expected_dtype: DType,
        /// The shape the other streams call for.
        expected_shape: Vec<usize>,
        /// The stream's dtype.
        found_dtype: DType,
        /// The stream's shape.
        found_shape: Vec<usize>,
    },
    /// A stream of a quantized weight whose shape describes a weight too large to address.
    #[error(
        "quantized stream `{stream}` of shape {shape:?} describes a weight too large to address ({values} values per element of its last axis): the file is damaged; write the weight again"
    )]
    QuantTooLarge {
        /// Which stream (`scales`, `seeds`).
        stream: &'static str,
        /// The stream's shape.
        shape: Vec<usize>,
        /// Weight values per element of the stream's last axis (the group or block size).
        values: usize,
    },
    /// Bytes that are not whole ggml blocks for the values asked of them.
    #[error(
        "{op}: {values} values of {ty} take whole blocks of {block_size} values, but {bytes} bytes were given: pass a row length divisible by {block_size} and its blocks' bytes"
    )]
    GgmlRow {
        /// The operation.
        op: &'static str,
        /// The ggml type's name.
        ty: &'static str,
        /// Values per block of the type.
        block_size: usize,
        /// Values asked for.
        values: usize,
        /// Bytes given.
        bytes: usize,
    },
    /// A ggml type that an operation does not handle.
    #[error("{op} does not handle ggml type {ty}: {hint}")]
    GgmlUnsupported {
        /// The operation.
        op: &'static str,
        /// The ggml type's name.
        ty: &'static str,
        /// What to use instead.
        hint: &'static str,
    },
    /// A pattern that is not a regular expression.
    #[error("`{pattern}` is not a regular expression: {message}")]
    Pattern {
        /// The pattern.
        pattern: String,
        /// The parser's message.
        message: String,
    },
    /// A quantized weight whose streams do not fit together.
    #[error("weight `{name}` in {origin}: {source}")]
    QuantizedWeight {
        /// The archive.
        origin: String,
        /// The weight's name (its module path).
        name: String,
        /// What does not fit.
        source: Box<Error>,
    },
    /// Entries that make up no weight encoding nnx knows.
    #[error(
        "`{name}` in {origin} is not a weight nnx can read (entries found: {found:?}): a weight is `NAME.weight` (float), `NAME.weight` (U32) with `NAME.scales` and `NAME.biases` (affine), or `NAME.seeds` with `NAME.nibbles` (SEED4) or `NAME.coefs` and `NAME.codes` (SEED4P4), plus `NAME.exp_bias`"
    )]
    UnknownEncoding {
        /// The archive.
        origin: String,
        /// The weight's name (its module path).
        name: String,
        /// The entries under that name.
        found: Vec<String>,
    },
    /// An affine weight whose bits and group size are not given and cannot be told apart.
    #[error(
        "cannot tell the bits and group size of the affine weight `{name}` in {origin}: add `\"quantization\": {{\"bits\": B, \"group_size\": G}}` to config.json"
    )]
    UnknownAffineSpec {
        /// The archive.
        origin: String,
        /// The weight's name (its module path).
        name: String,
    },

    // The GPU
    /// No GPU adapter at the index asked for.
    #[error(
        "no GPU adapter {index}: found {}; pick one of those, or install a Vulkan driver (Mesa's `mesa-vulkan-drivers` provides a software one)",
        if found.is_empty() { "none".to_string() } else { found.join(", ") }
    )]
    NoAdapter {
        /// The index asked for.
        index: usize,
        /// The adapters found, as `index: name (backend, type)`.
        found: Vec<String>,
    },
    /// The GPU refused an operation (out of memory, a lost device, a failed transfer).
    #[error("the GPU `{device}` failed to {action}: {message}")]
    Gpu {
        /// The adapter.
        device: String,
        /// What was being done.
        action: &'static str,
        /// The driver's or wgpu's message.
        message: String,
    },

    // Files and formats
    /// The operating system refused a file operation.
    #[error("cannot {action} `{path}`: {source}")]
    Io {
        /// What was being done (`open`, `map`, `write`, ...).
        action: &'static str,
        /// The file or folder.
        path: PathBuf,
        /// The system's error.
        source: std::io::Error,
    },
    /// The file is some other format.
    #[error("`{path}` is not a SafeTensors file: it looks like {kind}; {}", kind.advice())]
    NotSafeTensors {
        /// The file.
        path: PathBuf,
        /// What it looks like instead.
        kind: FileKind,
    },
    /// The header breaks the SafeTensors specification.
    #[error("`{path}` has an invalid SafeTensors header: {problem}")]
    Header {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        problem: HeaderProblem,
    },
    /// A PyTorch checkpoint that cannot be read (or that does more than hold tensors).
    #[error("`{path}` is not a readable PyTorch checkpoint: {problem}")]
    Torch {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        problem: TorchProblem,
    },
    /// A distributed checkpoint (PyTorch DCP) that cannot be read.
    #[error("`{path}` is not a readable distributed checkpoint: {problem}")]
    Dcp {
        /// The checkpoint's folder.
        path: PathBuf,
        /// What is wrong.
        problem: DcpProblem,
    },
    /// A GGUF file that cannot be read, or a GGUF file that cannot be written.
    #[error("`{path}` is not a usable GGUF file: {problem}")]
    Gguf {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        problem: GgufProblem,
    },
    /// A file of an Orbax checkpoint (its pytree metadata, OCDBT database or zarr arrays) that
    /// cannot be read.
    #[error("cannot read `{key}` from `{path}` of an Orbax checkpoint: {problem}")]
    Orbax {
        /// The file.
        path: PathBuf,
        /// The key read (`params.dense.kernel/zarr.json`, an OCDBT key, a pytree entry).
        key: String,
        /// What is wrong.
        problem: OrbaxProblem,
    },

    // Archives, shards and loads
    /// A sharded index that cannot be used.
    #[error("`{path}` is not a usable shard index: {problem}")]
    Index {
        /// The index file.
        path: PathBuf,
        /// What is wrong.
        problem: IndexProblem,
    },
    /// A shard named by an index is not there.
    #[error("shard `{shard}` named by `{index}` does not exist: download or copy the missing shard next to the index")]
    MissingShard {
        /// The index file.
        index: PathBuf,
        /// The missing shard.
        shard: PathBuf,
    },
    /// A shard that disagrees with its index.
    #[error("shard `{shard}` disagrees with `{index}`: {problem}")]
    ShardMismatch {
        /// The index file.
        index: PathBuf,
        /// The shard.
        shard: PathBuf,
        /// What is wrong.
        problem: ShardProblem,
    },
    /// A folder whose weights would be shards without their index.
    #[error(
        "`{shard}` in `{dir}` is a shard but the folder has no `model.safetensors.index.json` or single `*.safetensors.index.json` to read it through (a sharded save interrupted before its index leaves such files): save the checkpoint again, or pass the path of its index or of one file"
    )]
    ShardWithoutIndex {
        /// The folder.
        dir: PathBuf,
        /// A shard file found in it.
        shard: PathBuf,
    },
    /// A folder with nothing nnx can open.
    #[error(
        "`{path}` holds no `model.safetensors`, `pytorch_model.bin`, shard index or `*.safetensors` file: pass the path of the weights file"
    )]
    EmptyFolder {
        /// The folder.
        path: PathBuf,
    },
    /// The same name in two archives joined together.
    #[error("`{name}` is in both {first} and {second}: a name may be defined once; rename or drop one of them")]
    Duplicate {
        /// The entry name.
        name: String,
        /// Where it was found first.
        first: String,
        /// Where it was found again.
        second: String,
    },
    /// An entry that is not in the archive.
    #[error("{origin} has no entry `{name}`{}", DidYouMean(suggestion.as_deref()))]
    NoEntry {
        /// The archive.
        origin: String,
        /// The name asked for.
        name: String,
        /// A near-miss name the archive does have.
        suggestion: Option<String>,
    },
    /// An entry whose dtype or shape is not what the caller asked for.
    #[error("`{name}` in {origin}: expected {expected_dtype} {expected_shape:?}, found {found_dtype} {found_shape:?}")]
    EntryMismatch {
        /// The archive.
        origin: String,
        /// The entry.
        name: String,
        /// The dtype asked for.
        expected_dtype: DType,
        /// The shape asked for.
        expected_shape: Vec<usize>,
        /// The dtype stored.
        found_dtype: DType,
        /// The shape stored.
        found_shape: Vec<usize>,
    },
    /// A float was asked for but the entry holds something else.
    #[error(
        "`{name}` in {origin} is {dtype}, not a float that casts (F16, BF16, F32, F64): read it with `tensor` as stored"
    )]
    EntryNotFloat {
        /// The archive.
        origin: String,
        /// The entry.
        name: String,
        /// The stored dtype.
        dtype: DType,
    },
    /// An archive that cannot be written as SafeTensors.
    #[error("cannot save `{name}`: {problem}")]
    Unsavable {
        /// The entry.
        name: String,
        /// Why.
        problem: UnsavableProblem,
    },
    /// Entry data that is not valid for its dtype (a BOOL byte other than 0 or 1).
    #[error("`{name}` in `{path}` holds invalid data: {source}")]
    Data {
        /// The file.
        path: PathBuf,
        /// The entry.
        name: String,
        /// What is wrong with the data.
        source: Box<Error>,
    },
    /// A load or import that found problems (a partial load that matched nothing among them);
    /// nothing was changed.
    #[error(transparent)]
    Load(#[from] LoadError),
    /// A model that cannot be written back in its source layout.
    #[error("cannot export `{target}`: {}", ExportProblem::list(problems))]
    Export {
        /// The model's type name.
        target: String,
        /// Every problem.
        problems: Vec<ExportProblem>,
    },

    // Models and configs
    /// A configuration file that cannot be used.
    #[error("`{path}` is not a usable model configuration: {problem}")]
    Config {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        problem: ConfigProblem,
    },
    /// A configuration field whose value cannot make a model or a quantization.
    #[error("`{path}` is not a usable configuration: field `{field}` is {found}, but {rule}; correct that field")]
    ConfigField {
        /// The configuration file (or the weights file whose metadata holds it).
        path: PathBuf,
        /// The field, as a JSON path (`n_head`, `quantization.bits`).
        field: String,
        /// The value found.
        found: u64,
        /// What the value must satisfy.
        rule: ConfigRule,
    },
    /// A configuration number that cannot make a model: not finite, or outside the range its
    /// meaning allows.
    #[error(
        "`{path}` is not a usable configuration: field `{field}` is {found}, but it must be {expected}; correct that field"
    )]
    ConfigNumber {
        /// The configuration file (or the weights file whose metadata holds it).
        path: PathBuf,
        /// The field, as a JSON path (`rope_theta`, `rope_scaling.factor`).
        field: String,
        /// The value found.
        found: f64,
        /// What the value must be (`a finite number above 0`).
        expected: &'static str,
    },
    /// An encoder (`model_type` `bert`, `general.architecture` `nomic-bert`, ...) given where a
    /// model that generates text is needed: it computes embeddings.
    #[error("`{path}` names an encoder ({key} `{found}`), which computes embeddings and generates no text: {remedy}")]
    Encoder {
        /// The file that names the architecture (`config.json`, the GGUF file).
        path: PathBuf,
        /// The key that names it (`model_type`, `general.architecture`), in backticks.
        key: &'static str,
        /// The architecture.
        found: String,
        /// What to do instead.
        remedy: &'static str,
    },

    // Text generation: caches, settings, tokenizers, chat templates
    /// A key/value cache without room for the positions a forward pass adds.
    #[error(
        "the key/value cache holds {capacity} positions per sequence but {needed} are needed: create it with a larger capacity (up to the model's context length) or generate fewer tokens"
    )]
    CacheFull {
        /// Positions the cache holds per sequence.
        capacity: usize,
        /// Positions the pass needs (those cached plus the new ones).
        needed: usize,
    },
    /// A text generation setting outside the values it takes.
    #[error("the generation setting `{setting}` is {value}, but it must be {rule}")]
    GenerationSetting {
        /// The setting (`temperature`, `top_p`, ...).
        setting: &'static str,
        /// Its value, as given.
        value: String,
        /// The values it takes.
        rule: &'static str,
    },
    /// A tokenizer that cannot be read or that fails on the text given.
    #[error("the tokenizer `{path}` failed: {source}")]
    Tokenizer {
        /// The tokenizer file (`tokenizer.json`).
        path: PathBuf,
        /// The tokenizer's error.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A chat template that cannot be read, compiled or rendered, or that refused the
    /// conversation (its `raise_exception`).
    #[error("the chat template of {origin}{} {failure}: {message}; {remedy}", line.map(|line| format!(" (line {line})")).unwrap_or_default())]
    Template {
        /// Where the template came from (a file, a GGUF key).
        origin: String,
        /// The template's line at fault, when known.
        line: Option<usize>,
        /// What went wrong: `does not compile`, `refused the conversation`, ...
        failure: &'static str,
        /// The engine's message, or the template's own (control characters escaped).
        message: String,
        /// What to do about it.
        remedy: &'static str,
    },

    // The Hub and remote stores
    /// A Hub repository, or its snapshot in the cache, cannot be had.
    #[error("Hub repository `{repo}`: {problem}")]
    Hub {
        /// The repository id (`org/name`).
        repo: String,
        /// What went wrong.
        problem: HubProblem,
    },
    /// A remote location (an object store, an HTTP server, the Hub) that cannot be read.
    #[error("`{url}`: {problem}")]
    Remote {
        /// The location, without credentials.
        url: String,
        /// What went wrong.
        problem: RemoteProblem,
    },

    // Adapters
    /// An adapter file (LoRA factors and their configuration) that cannot be read.
    #[error("the adapter `{path}`: `{entry}` {problem}")]
    Adapter {
        /// The file or folder.
        path: PathBuf,
        /// The entry or configuration key.
        entry: String,
        /// What is wrong and what to do.
        problem: String,
    },
    /// An adapter that does not fit a model: every module without a target or with a target of
    /// another shape. The model is unchanged.
    #[error("the adapter `{path}` does not fit `{target}`, which is unchanged: {}", list_problems(problems))]
    AdapterMismatch {
        /// The adapter.
        path: PathBuf,
        /// The model's type name.
        target: String,
        /// Every problem, in adapter order.
        problems: Vec<String>,
    },
}

/// Why tensors cannot be concatenated, for [`Error::Concat`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConcatProblem {
    /// The list of tensors is empty.
    Empty,
    /// A tensor whose dtype or shape does not join the first one along the axis.
    Disagrees {
        /// The axis joined along.
        axis: usize,
        /// The first tensor's dtype.
        expected_dtype: DType,
        /// The first tensor's shape.
        expected_shape: Vec<usize>,
        /// The disagreeing tensor's dtype.
        found_dtype: DType,
        /// The disagreeing tensor's shape.
        found_shape: Vec<usize>,
    },
}

impl fmt::Display for ConcatProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConcatProblem::Empty => f.write_str("no tensors were given"),
            ConcatProblem::Disagrees { axis, expected_dtype, expected_shape, found_dtype, found_shape } => write!(
                f,
                "{found_dtype} {found_shape:?} does not join {expected_dtype} {expected_shape:?} along axis {axis}"
            ),
        }
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let message = self.to_string();
        f.write_str(&message)?;
        let mut source = std::error::Error::source(self);
        let mut first = true;
        while let Some(cause) = source {
            let text = cause.to_string();
            if !message.contains(&text) {
                f.write_str(if first { "\n\nCaused by:\n    " } else { "\n    " })?;
                f.write_str(&text)?;
                first = false;
            }
            source = cause.source();
        }
        Ok(())
    }
}

impl Error {
    /// The error of an I/O `action` on `path`, for `map_err`.
    #[doc(hidden)]
    pub fn io(action: &'static str, path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Error {
        let path = path.into();
        move |source| Error::Io { action, path, source }
    }
}

/// `problems` joined for one message.
fn list_problems(problems: &[String]) -> String {
    problems.join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_is_the_message_as_main_prints_it() {
        let shape = Error::ElementCount { shape: vec![2, 3], expected: 6, found: 5 };
        assert_eq!(format!("{shape:?}"), shape.to_string());
        assert!(!format!("{shape:?}").contains("ElementCount"));
        // A cause the message already quotes is not repeated.
        let source = std::io::Error::new(std::io::ErrorKind::NotFound, "no such file");
        let io = Error::Io { action: "read", path: PathBuf::from("model.safetensors"), source };
        assert_eq!(format!("{io:?}"), "cannot read `model.safetensors`: no such file");
    }
}
