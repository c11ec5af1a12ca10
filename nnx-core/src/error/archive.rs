//! What goes wrong with archives, shard indexes, configurations and exports, for the variants
//! of [`Error`] that name them.

use std::path::PathBuf;

/// Why a shard index cannot be used, for [`Error::Index`](super::Error::Index).
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
    /// the 64 MiB that nnx-io keeps of a file's text.
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

/// How a shard disagrees with its index, for [`Error::ShardMismatch`](super::Error::ShardMismatch).
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

/// Why an entry cannot be saved, for [`Error::Unsavable`](super::Error::Unsavable).
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

/// Why a configuration file cannot be used, for [`Error::Config`](super::Error::Config).
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
    /// A field nnx cannot follow in a file beside the weights (a sentence-transformers
    /// `modules.json` or pooling `config.json`, the encoder's `config.json`).
    Unusable {
        /// The field, as a JSON path (`pooling_mode_cls_token`, `[2].type`); empty for the whole
        /// file.
        key: String,
        /// What nnx needs there.
        expected: &'static str,
        /// What the file holds, in a few words.
        found: String,
        /// What to do.
        remedy: &'static str,
    },
    /// A GGUF metadata key whose value is not of the type its meaning needs.
    WrongType {
        /// The key (`llama.block_count`).
        key: String,
        /// What nnx reads it as (`an unsigned integer`).
        expected: &'static str,
        /// What the file holds, in a few words (`a string`).
        found: String,
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
            ConfigProblem::Unusable { key, expected, found, remedy } => {
                if key.is_empty() {
                    f.write_str("the file")?;
                } else {
                    write!(f, "`{key}`")?;
                }
                write!(f, " is {found}, but nnx needs {expected}: {remedy}")
            }
            ConfigProblem::WrongType { key, expected, found } => write!(
                f,
                "`{key}` is {found}, but it must be {expected}: correct the key (llama.cpp's `gguf_set_metadata.py`) or convert the model again"
            ),
        }
    }
}

/// Why a tensor cannot be written back in its source layout, for [`Error::Export`](super::Error::Export).
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
    pub(super) fn list(problems: &[ExportProblem]) -> String {
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

/// What a configuration field must satisfy, for [`Error::ConfigField`](super::Error::ConfigField).
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
    /// The size the file's tensors hold.
    Tensors {
        /// The size the tensors hold.
        holds: u64,
        /// Which tensors, and how they say it (`` `blk.0.attn_q.weight` has 64 rows ``).
        entry: String,
    },
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
            ConfigRule::Tensors { holds, entry } => write!(f, "the file's tensors say {holds} ({entry})"),
        }
    }
}
