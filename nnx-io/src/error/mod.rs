//! The error type of nnx-io: every variant names the file and entry, says what was expected
//! and found, and says what to do.

use std::path::PathBuf;

use nnx_core::{DType, DidYouMean};

mod file_kind;
mod header;
mod hub;
mod remote;
mod torch;

pub use file_kind::FileKind;
pub use header::HeaderProblem;
pub use hub::{HubProblem, Missing, Offline};
pub use remote::RemoteProblem;
pub use torch::{PickleLimit, PickleProblem, TorchProblem, ZipRecordProblem};

/// Result with the nnx-io [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong reading or writing archives.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
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
    NotFloat {
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
        source: Box<nnx_core::Error>,
    },
    /// A model that cannot be written back in its source layout.
    #[error("cannot export `{target}`: {}", ExportProblem::list(problems))]
    Export {
        /// The model's type name.
        target: String,
        /// Every problem.
        problems: Vec<ExportProblem>,
    },
    /// A configuration file that cannot be used.
    #[error("`{path}` is not a usable model configuration: {problem}")]
    Config {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        problem: ConfigProblem,
    },
    /// A tokenizer that cannot be read or that fails on the text given.
    #[error("the tokenizer `{path}` failed: {source}")]
    Tokenizer {
        /// The tokenizer file (`tokenizer.json`).
        path: PathBuf,
        /// The tokenizer's error.
        source: Box<dyn std::error::Error + Send + Sync>,
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
    /// A load or import that found problems (state dict, [`crate::Archive::load_into`],
    /// [`crate::Archive::import_into`]); the module was left unchanged.
    #[error(transparent)]
    Load(#[from] nnx_core::LoadError),
    /// A tensor operation failed. Never holds [`nnx_core::Error::Load`]: converting one gives
    /// [`Error::Load`].
    #[error(transparent)]
    Tensor(nnx_core::Error),
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

/// Why a shard index cannot be used, for [`Error::Index`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum IndexProblem {
    /// The text is not JSON.
    NotJson {
        /// The JSON parser's message.
        message: String,
    },
    /// The JSON is not an object.
    NotObject,
    /// `metadata` is there but not an object.
    MetadataNotObject,
    /// There is no `weight_map`.
    NoWeightMap,
    /// `weight_map` appears twice.
    WeightMapTwice,
    /// `weight_map` is not an object of strings.
    WeightMapNotStrings {
        /// The JSON parser's message.
        message: String,
    },
    /// An entry listed twice in `weight_map`.
    DuplicateName {
        /// The entry.
        name: String,
    },
    /// An index file larger than `nnx_io::index::MAX_INDEX_BYTES`.
    FileTooLarge {
        /// The file's size.
        bytes: u64,
        /// The largest index read.
        limit: u64,
    },
    /// `metadata` or `weight_map` whose text (with a fixed cost per entry) passes
    /// `nnx_io::header::MAX_METADATA_BYTES`.
    TooLarge {
        /// `metadata` or `weight_map`.
        field: &'static str,
        /// The key at which the limit was passed.
        key: String,
        /// The bytes asked for up to and including that key.
        asked: usize,
        /// The most accepted.
        limit: usize,
    },
    /// A shard name that is not a file name beside the index.
    BadShardName {
        /// The entry that names it.
        name: String,
        /// The shard name.
        shard: String,
    },
}

impl std::fmt::Display for IndexProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            IndexProblem::NotJson { message } => write!(f, "not JSON ({message})"),
            IndexProblem::NotObject => f.write_str("the index is not a JSON object"),
            IndexProblem::MetadataNotObject => f.write_str("`metadata` is not an object"),
            IndexProblem::NoWeightMap => f.write_str("it has no `weight_map`: is it a shard index?"),
            IndexProblem::WeightMapTwice => f.write_str("`weight_map` appears twice: keep one weight map"),
            IndexProblem::WeightMapNotStrings { message } => {
                write!(f, "`weight_map` is not an object of strings ({message})")
            }
            IndexProblem::DuplicateName { name } => {
                write!(f, "`{name}` is listed twice in `weight_map`: an entry may be in one shard only")
            }
            IndexProblem::FileTooLarge { bytes, limit } => write!(
                f,
                "it is {bytes} bytes, over the {limit}-byte limit for an index (which lists names and file names only): the file is damaged or not an index"
            ),
            IndexProblem::TooLarge { field, key, asked, limit } => write!(
                f,
                "`{field}` reaches {asked} bytes at `{key}`, over the {limit}-byte limit: no checkpoint needs that much; the file is damaged or hostile, write the index again"
            ),
            IndexProblem::BadShardName { name, shard } => {
                write!(f, "`{name}` names shard `{shard}`, which is not a file name beside the index")
            }
        }
    }
}

/// How a shard disagrees with its index, for [`Error::ShardMismatch`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ShardProblem {
    /// The shard holds an entry the index puts in another shard.
    ElsewhereInIndex {
        /// The entry.
        name: String,
        /// The shard the index names for it.
        other: PathBuf,
    },
    /// The index puts an entry in this shard, which lacks it.
    MissingEntry {
        /// The entry.
        name: String,
    },
}

impl std::fmt::Display for ShardProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ShardProblem::ElsewhereInIndex { name, other } => write!(
                f,
                "`{name}` is in this shard but the index puts it in `{}`: a name may be in one shard only",
                other.display()
            ),
            ShardProblem::MissingEntry { name } => {
                write!(f, "the index puts `{name}` in this shard but the shard has no such entry")
            }
        }
    }
}

/// Why an entry cannot be saved, for [`Error::Unsavable`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum UnsavableProblem {
    /// A meta tensor: dtype and shape only, no data.
    Meta,
}

impl std::fmt::Display for UnsavableProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UnsavableProblem::Meta => {
                f.write_str("it is a meta tensor (dtype and shape only, no data): load or import weights before saving")
            }
        }
    }
}

/// Why a configuration file cannot be used, for [`Error::Config`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigProblem {
    /// The file is not JSON, or not JSON of the expected shape.
    NotJson {
        /// The JSON parser's message.
        message: String,
    },
    /// The file is JSON but not the model's own configuration (a field is missing or of
    /// another type).
    NotModelConfig {
        /// The JSON parser's message.
        message: String,
    },
    /// A configuration file larger than any configuration is.
    TooLarge {
        /// The file's size.
        bytes: u64,
        /// The largest configuration read.
        limit: u64,
    },
    /// The `quantization` metadata of a weights file is not JSON.
    QuantizationMetadataNotJson {
        /// The JSON parser's message.
        message: String,
    },
    /// The `quantization` entry is not an object.
    QuantizationNotObject,
    /// A quantization mode other than `affine`.
    QuantizationMode {
        /// The mode given.
        mode: String,
    },
    /// A quantization entry without an integer field it needs.
    QuantizationField {
        /// Where the entry is (`""` for the top level, `.NAME` for a per-layer override).
        at: String,
        /// The field (`bits`, `group_size`).
        key: &'static str,
    },
    /// A configuration being saved that does not serialize to a JSON object (a struct with
    /// named fields, or a map with string keys), which is what `config.json` holds.
    NotSerializableObject {
        /// What serializing gave, or the serializer's message.
        message: String,
    },
}

impl std::fmt::Display for ConfigProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConfigProblem::NotJson { message } => write!(f, "not valid JSON ({message})"),
            ConfigProblem::NotModelConfig { message } => {
                write!(f, "{message}: check that it is the model's own `config.json`")
            }
            ConfigProblem::TooLarge { bytes, limit } => write!(
                f,
                "it is {bytes} bytes, over the {limit}-byte limit for a configuration: check that it is the model's own `config.json`"
            ),
            ConfigProblem::QuantizationMetadataNotJson { message } => {
                write!(f, "the `quantization` metadata is not JSON ({message})")
            }
            ConfigProblem::QuantizationNotObject => f.write_str("`quantization` must be an object"),
            ConfigProblem::QuantizationMode { mode } => {
                write!(f, "quantization mode `{mode}` is not supported: nnx reads `affine`")
            }
            ConfigProblem::QuantizationField { at, key } => {
                write!(f, "`quantization{at}` needs an integer `{key}` (for example 4 bits, group size 64)")
            }
            ConfigProblem::NotSerializableObject { message } => write!(
                f,
                "the configuration does not serialize to a JSON object ({message}): make it a struct with named fields that derives `Serialize`"
            ),
        }
    }
}

/// Why a tensor cannot be written back in its source layout, for [`Error::Export`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ExportProblem {
    /// A tensor split more than once on its way from its source entry.
    SplitTwice {
        /// The model path.
        name: String,
        /// The source entry.
        source: String,
    },
    /// A piece whose split disagrees with the other pieces of its source entry.
    SplitDiffers {
        /// The model path.
        name: String,
        /// The source entry.
        source: String,
    },
    /// A source entry some of whose pieces no tensor of the model holds.
    MissingPieces {
        /// The source entry.
        source: String,
        /// The missing pieces, from 0.
        missing: Vec<usize>,
        /// The number of pieces.
        parts: usize,
        /// The model paths of the pieces present.
        present: Vec<String>,
    },
    /// A tensor with no data.
    Meta {
        /// The source entry.
        source: String,
    },
}

impl ExportProblem {
    fn list(problems: &[ExportProblem]) -> String {
        problems.iter().map(ExportProblem::to_string).collect::<Vec<_>>().join("; ")
    }
}

impl std::fmt::Display for ExportProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ExportProblem::SplitTwice { name, source } => {
                write!(f, "`{name}` is split more than once on its way from `{source}`; export cannot rebuild it")
            }
            ExportProblem::SplitDiffers { name, source } => {
                write!(f, "`{name}` splits `{source}` differently from its siblings")
            }
            ExportProblem::MissingPieces { source, missing, parts, present } => {
                let missing: Vec<String> = missing.iter().map(|at| format!("{}/{parts}", at + 1)).collect();
                write!(f, "`{source}` lacks pieces {} (the model has {})", missing.join(", "), present.join(", "))
            }
            ExportProblem::Meta { source } => {
                write!(f, "`{source}` would be written from a meta tensor (no data): import or load weights first")
            }
        }
    }
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

impl From<nnx_core::Error> for Error {
    /// A refused load keeps its report ([`Error::Load`]) whichever crate produced it; every
    /// other tensor error becomes [`Error::Tensor`].
    fn from(error: nnx_core::Error) -> Error {
        match error {
            nnx_core::Error::Load(report) => Error::Load(report),
            other => Error::Tensor(other),
        }
    }
}

impl Error {
    pub(crate) fn io(action: &'static str, path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Error {
        let path = path.into();
        move |source| Error::Io { action, path, source }
    }
}

#[cfg(test)]
mod tests {
    use nnx_core::{LoadAction, LoadError, Problem, ProblemKind};

    use super::*;

    #[test]
    fn a_load_report_keeps_its_variant_through_the_tensor_error() {
        let report = LoadError {
            action: LoadAction::Load,
            source: "state dict".into(),
            target: "Mlp".into(),
            problems: vec![Problem::new("fc.weight", ProblemKind::Missing { suggestion: None })],
        };
        let error: Error = nnx_core::Error::Load(report.clone()).into();
        assert!(matches!(&error, Error::Load(found) if *found == report), "{error:?}");
        let error: Error = nnx_core::Error::Meta { op: "to_vec" }.into();
        assert!(matches!(error, Error::Tensor(nnx_core::Error::Meta { .. })), "{error:?}");
    }
}
