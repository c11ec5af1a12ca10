//! The error type of nnx-io: every variant names the file and entry, says what was expected
//! and found, and says what to do.

use std::path::PathBuf;

use nnx_core::DType;

use crate::header::HeaderProblem;
use crate::sniff::FileKind;

/// Result with the nnx-io [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong reading or writing archives.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
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
    /// A sharded index that cannot be used.
    #[error("`{path}` is not a usable shard index: {reason}")]
    Index {
        /// The index file.
        path: PathBuf,
        /// What is wrong and what to do.
        reason: String,
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
    #[error("shard `{shard}` disagrees with `{index}`: {reason}")]
    ShardMismatch {
        /// The index file.
        index: PathBuf,
        /// The shard.
        shard: PathBuf,
        /// What is wrong.
        reason: String,
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
        "`{path}` holds no `model.safetensors`, shard index or `*.safetensors` file: pass the path of the weights file"
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
    #[error("{origin} has no entry `{name}`{}", suggestion.as_ref().map(|near| format!(" (did you mean `{near}`?)")).unwrap_or_default())]
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
    NotFloat {
        /// The archive.
        origin: String,
        /// The entry.
        name: String,
        /// The stored dtype.
        dtype: DType,
    },
    /// An archive that cannot be written as SafeTensors.
    #[error("cannot save `{name}`: {reason}")]
    Unsavable {
        /// The entry.
        name: String,
        /// Why, and what to do.
        reason: String,
    },
    /// Entry data that is not valid for its dtype (a BOOL byte other than 0 or 1).
    #[error("`{name}` in `{path}` holds invalid data: {source}")]
    Data {
        /// The file.
        path: PathBuf,
        /// The entry.
        name: String,
        /// What is wrong with the data.
        source: Box<nnx_core::Error>,
    },
    /// An import that found problems; the model was left unchanged.
    #[error(transparent)]
    Import(#[from] crate::import::ImportError),
    /// A model that cannot be written back in its source layout.
    #[error("cannot export `{target}`: {}", problems.join("; "))]
    Export {
        /// The model's type name.
        target: String,
        /// Every problem.
        problems: Vec<String>,
    },
    /// A configuration file that cannot be used.
    #[error("`{path}` is not a usable model configuration: {reason}")]
    Config {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
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
    /// A quantized weight whose streams do not fit together.
    #[error("weight `{name}` in {origin}: {source}")]
    QuantizedWeight {
        /// The archive.
        origin: String,
        /// The weight's name (its module path).
        name: String,
        /// What does not fit.
        source: Box<nnx_core::Error>,
    },
    /// A load that found problems; the module was left unchanged.
    #[error(transparent)]
    Load(#[from] nnx_core::LoadError),
    /// A tensor operation failed.
    #[error(transparent)]
    Tensor(#[from] nnx_core::Error),
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
}

/// What a configuration field must satisfy, for [`Error::ConfigField`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigRule {
    /// At least 1.
    Positive,
    /// At most `limit`.
    AtMost {
        /// The largest value accepted.
        limit: u64,
    },
    /// A divisor of another field.
    Divides {
        /// The other field.
        field: &'static str,
        /// Its value.
        value: u64,
    },
    /// An even number.
    Even {
        /// Why it must be even.
        reason: &'static str,
    },
    /// One of a fixed set of values.
    OneOf {
        /// The values accepted.
        allowed: Vec<u64>,
    },
    /// Small enough that the weights it implies can be addressed.
    Addressable,
}

impl std::fmt::Display for ConfigRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConfigRule::Positive => f.write_str("it must be at least 1"),
            ConfigRule::AtMost { limit } => write!(f, "it must be at most {limit}"),
            ConfigRule::Divides { field, value } => write!(f, "it must divide `{field}` ({value})"),
            ConfigRule::Even { reason } => write!(f, "it must be even ({reason})"),
            ConfigRule::OneOf { allowed } => {
                let allowed: Vec<String> = allowed.iter().map(u64::to_string).collect();
                write!(f, "it must be one of {}", allowed.join(", "))
            }
            ConfigRule::Addressable => f.write_str("the weights it implies are too large to address"),
        }
    }
}

impl Error {
    pub(crate) fn io(action: &'static str, path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Error {
        let path = path.into();
        move |source| Error::Io { action, path, source }
    }
}
