//! The report of a failed load or import ([`LoadError`]): every [`Problem`] found, what is wrong
//! ([`ProblemKind`]), where the value comes from ([`ProblemSource`], its [`SourceOp`]s), and the
//! wording every nnx error shares for a near-miss name ([`DidYouMean`]).

use std::fmt;

use crate::DType;

/// Renders ` (did you mean `NAME`?)` for a suggestion and nothing without one: the one place
/// that words a near-miss name, for every error of nnx.
#[derive(Debug, Clone, Copy)]
pub struct DidYouMean<'a>(pub Option<&'a str>);

impl fmt::Display for DidYouMean<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(near) => write!(f, " (did you mean `{near}`?)"),
            None => Ok(()),
        }
    }
}

/// One operation on the way from a stored entry to a model tensor, as data.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub enum SourceOp {
    /// Piece `index` of `parts` along `axis` (negative counts from the last axis).
    Split {
        /// The axis cut.
        axis: isize,
        /// The piece kept, from 0.
        index: usize,
        /// The number of pieces.
        parts: usize,
    },
    /// The last two axes swapped.
    Transpose,
    /// llama.cpp's rotary row order undone, the rows grouped by the heads the GGUF key
    /// `{arch}.attention.<key>` counts.
    RopePermute {
        /// The key's last segment: `head_count` or `head_count_kv`.
        key: &'static str,
    },
    /// A constant added to every value.
    Offset {
        /// The constant.
        value: f32,
    },
}

// Offsets are finite (the derive refuses any other), so equality is reflexive.
impl Eq for SourceOp {}

/// Renders import operations as ` split(AXIS, PIECE/PARTS) transpose`, each with a leading
/// space; a transpose of an entry of rank below 2 does nothing and is left out.
#[derive(Debug, Clone, Copy)]
pub struct OpChain<'a> {
    /// The operations, in order.
    pub ops: &'a [SourceOp],
    /// The rank of the stored entry.
    pub rank: usize,
}

impl fmt::Display for OpChain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for op in self.ops {
            match op {
                SourceOp::Split { axis, index, parts } => write!(f, " split({axis}, {}/{parts})", index + 1)?,
                SourceOp::Transpose if self.rank >= 2 => f.write_str(" transpose")?,
                SourceOp::Transpose => {}
                SourceOp::RopePermute { key } => write!(f, " rope_permute({key})")?,
                SourceOp::Offset { value } => write!(f, " offset({value})")?,
            }
        }
        Ok(())
    }
}

/// Where the value of a model tensor comes from, for a [`Problem`] of an import.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProblemSource {
    /// An archive entry: its full name, its stored dtype and shape when it exists, and the
    /// operations applied to it.
    Entry {
        /// The entry's full name (or path prefix, for a whole missing subtree).
        name: String,
        /// Its stored dtype and shape, when the archive has it.
        stored: Option<(DType, Vec<usize>)>,
        /// The operations applied, in order.
        ops: Vec<SourceOp>,
    },
    /// Another tensor of the model (`tie`).
    Tie {
        /// The model path of the tied-to tensor.
        target: String,
    },
    /// A hook given for the tensor.
    Hook {
        /// The source path the attributes give.
        source: String,
    },
}

impl fmt::Display for ProblemSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProblemSource::Entry { name, stored, ops } => {
                f.write_str(name)?;
                let Some((_, shape)) = stored else { return Ok(()) };
                write!(f, " {shape:?}{}", OpChain { ops, rank: shape.len() })
            }
            ProblemSource::Tie { target } => write!(f, "tie {target}"),
            ProblemSource::Hook { source } => write!(f, "hook ({source})"),
        }
    }
}

/// An error returned by an import hook, shared so that a [`Problem`] stays cloneable. Two are
/// equal when they are the same error.
#[derive(Debug, Clone)]
pub struct HookError(pub std::sync::Arc<dyn std::error::Error + Send + Sync>);

impl PartialEq for HookError {
    fn eq(&self, other: &HookError) -> bool {
        std::sync::Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for HookError {}

impl fmt::Display for HookError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// What is wrong, for one [`Problem`]: a program matches these without reading text.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProblemKind {
    /// The model has the tensor; the source does not.
    Missing {
        /// A near-miss name the source does have.
        suggestion: Option<String>,
    },
    /// The source has the entry; the model does not read it.
    Unexpected {
        /// A near-miss name the model does have.
        suggestion: Option<String>,
    },
    /// Both have the name with different dtypes.
    DType {
        /// The model's dtype.
        expected: DType,
        /// The source's dtype.
        found: DType,
    },
    /// Both have the name with different shapes (after the import operations).
    Shape {
        /// The model's shape.
        expected: Vec<usize>,
        /// The source's shape.
        found: Vec<usize>,
    },
    /// A load under a prefix that names no entry of the source.
    PrefixNotFound {
        /// The prefix given.
        prefix: String,
        /// The prefix under which the source holds the module's names, if one does.
        suggestion: Option<String>,
    },
    /// A partial load in which no key of the source matched the module.
    NoMatch {
        /// The first keys of the module.
        module_keys: Vec<String>,
        /// The first keys of the source.
        source_keys: Vec<String>,
    },
    /// A numbered subtree (a layer) of which the file has no entry at all.
    MissingSubtree {
        /// The path above the numbered segment (`transformer.h`).
        parent: String,
        /// The first and last numbers the file has under `parent`, if any.
        present: Option<(usize, usize)>,
    },
    /// A `split` along an axis the entry does not have.
    SplitAxisOutOfRange {
        /// The axis given.
        axis: isize,
        /// The rank of the entry at that point.
        rank: usize,
    },
    /// A `split` into pieces that do not divide the axis.
    NotDivisible {
        /// The axis given.
        axis: isize,
        /// Its size.
        size: usize,
        /// The number of pieces.
        parts: usize,
    },
    /// A tensor-parallel cut into pieces that do not divide the axis, or a rank past the group.
    NotDivisibleForRank {
        /// The axis cut.
        axis: usize,
        /// Its size.
        size: usize,
        /// The number of ranks.
        world_size: usize,
        /// This rank.
        rank: usize,
    },
    /// An entry of a dtype packing elements below a byte, which cannot be split or transposed
    /// as a view.
    SubByte {
        /// The stored dtype.
        dtype: DType,
    },
    /// A GGUF metadata key an import operation needs (`rope_permute` counts heads with one),
    /// absent or not a positive integer.
    MetadataKey {
        /// The full key, such as `llama.attention.head_count`.
        key: String,
        /// What the import needs it for.
        needed_for: &'static str,
    },
    /// Rows that do not form whole rotary groups: `rope_permute` needs `2 * heads` to divide
    /// the rows.
    RopeRows {
        /// Rows of the entry.
        rows: usize,
        /// The heads the rows are grouped by.
        heads: usize,
    },
    /// An `offset` on a tensor that does not hold floats.
    OffsetNotFloat {
        /// The model tensor's dtype.
        dtype: DType,
    },
    /// An entry of another dtype than the model's where one of them is not a float.
    NotCastable {
        /// The model's dtype.
        expected: DType,
        /// The stored dtype.
        found: DType,
    },
    /// A field whose `dtype` attribute the stored entry or the model does not meet.
    RequiredDType {
        /// The dtype the field requires.
        required: DType,
        /// The dtype found instead.
        found: DType,
    },
    /// A `tie` to a path that is not a tensor of the model.
    TieTargetMissing {
        /// The path tied to.
        target: String,
        /// A near-miss tensor of the model.
        suggestion: Option<String>,
    },
    /// A `tie` to a tensor of another dtype or shape.
    TieMismatch {
        /// The tied tensor's dtype.
        expected_dtype: DType,
        /// The tied tensor's shape.
        expected_shape: Vec<usize>,
        /// The target's dtype.
        found_dtype: DType,
        /// The target's shape.
        found_shape: Vec<usize>,
    },
    /// A hook given for a path that is not a tensor of the model.
    HookTargetMissing {
        /// A near-miss tensor of the model.
        suggestion: Option<String>,
    },
    /// An entry a hook declares it reads, which the archive lacks.
    HookReadMissing,
    /// A hook that failed with its own error.
    HookFailed {
        /// The hook's error.
        error: HookError,
    },
    /// A hook that returned a tensor of another dtype or shape than the model's.
    HookMismatch {
        /// The model's dtype.
        expected_dtype: DType,
        /// The model's shape.
        expected_shape: Vec<usize>,
        /// The returned dtype.
        found_dtype: DType,
        /// The returned shape.
        found_shape: Vec<usize>,
    },
    /// An entry under the prefix that the model does not read, refused by strict coverage.
    Unused,
}

/// One problem found while matching named tensors (a state dict, an archive) against a model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// The model path (or path prefix, for a missing subtree); the entry name for entries the
    /// model does not read; empty for a load that matched nothing.
    pub name: String,
    /// For imports, where the value comes from: entry, operations, tie or hook.
    pub source: Option<ProblemSource>,
    /// What is wrong.
    pub kind: ProblemKind,
}

impl Problem {
    /// A problem about `name` with no import source.
    pub fn new(name: impl Into<String>, kind: ProblemKind) -> Problem {
        Problem { name: name.into(), source: None, kind }
    }

    /// The same problem with an import source.
    pub fn with_source(mut self, source: ProblemSource) -> Problem {
        self.source = Some(source);
        self
    }

    /// The full key (model path, or entry name) the problem is about.
    pub fn key(&self) -> &str {
        &self.name
    }

    /// What is wrong.
    pub fn kind(&self) -> &ProblemKind {
        &self.kind
    }
}

impl fmt::Display for ProblemKind {
    /// The problem in words, without the name it is about.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProblemKind::Missing { suggestion } => write!(f, "no such entry{}", DidYouMean(suggestion.as_deref())),
            ProblemKind::Unexpected { suggestion } => {
                write!(f, "not a tensor of the model{}", DidYouMean(suggestion.as_deref()))
            }
            ProblemKind::DType { expected, found } => write!(f, "expected dtype {expected}, found {found}"),
            ProblemKind::Shape { expected, found } => write!(f, "expected {expected:?}, found {found:?}"),
            ProblemKind::PrefixNotFound { prefix, suggestion: Some(near) } => write!(
                f,
                "no entry is under the prefix `{prefix}` (did you mean `{near}`? the file holds the model's names under it)"
            ),
            ProblemKind::PrefixNotFound { prefix, suggestion: None } => write!(
                f,
                "no entry is under the prefix `{prefix}`, and no prefix holds the model's names: check the prefix (`\"\"` for none) and that the file is this model's"
            ),
            ProblemKind::NoMatch { module_keys, source_keys } => write!(
                f,
                "no key of the state dict matches the module (the module has {module_keys:?}..., the dict has {source_keys:?}...): check the prefix, or allow it with `LoadOptions {{ allow_no_match: true }}`"
            ),
            ProblemKind::MissingSubtree { parent, present: Some((first, last)) } => {
                write!(f, "no such entries (the file has {parent}.{first} .. {parent}.{last})")
            }
            ProblemKind::MissingSubtree { parent, present: None } => {
                write!(f, "no such entries (the file has nothing under {parent})")
            }
            ProblemKind::SplitAxisOutOfRange { axis, rank } => {
                write!(f, "split axis {axis} does not exist in a rank-{rank} entry")
            }
            ProblemKind::NotDivisible { axis, size, parts } => {
                write!(f, "axis {axis} of size {size} does not divide into {parts} pieces")
            }
            ProblemKind::NotDivisibleForRank { axis, size, world_size, rank } => {
                write!(f, "axis {axis} of size {size} does not cut into {world_size} equal pieces for rank {rank}")
            }
            ProblemKind::SubByte { dtype } => {
                write!(f, "{dtype} packs elements below a byte, so it cannot be split or transposed as a view")
            }
            ProblemKind::NotCastable { expected, found } => {
                write!(f, "expected dtype {expected}, found {found} (only floats are cast)")
            }
            ProblemKind::MetadataKey { key, needed_for } => write!(
                f,
                "the GGUF metadata has no positive integer `{key}`, which {needed_for}: \
                 convert the file with a converter that writes it"
            ),
            ProblemKind::RopeRows { rows, heads } => write!(
                f,
                "{rows} rows do not form {heads} heads of rotary pairs (2 * {heads} must divide them): \
                 the file's head count does not match this tensor"
            ),
            ProblemKind::OffsetNotFloat { dtype } => {
                write!(
                    f,
                    "`offset` adds a constant to floats, but the model holds {dtype}: give the field a float dtype"
                )
            }
            ProblemKind::RequiredDType { required, found } => write!(f, "the field requires {required}, found {found}"),
            ProblemKind::TieTargetMissing { target, suggestion } => {
                write!(f, "`{target}` is not a tensor of the model{}", DidYouMean(suggestion.as_deref()))
            }
            ProblemKind::TieMismatch { expected_dtype, expected_shape, found_dtype, found_shape }
            | ProblemKind::HookMismatch { expected_dtype, expected_shape, found_dtype, found_shape } => {
                write!(f, "expected {expected_dtype} {expected_shape:?}, found {found_dtype} {found_shape:?}")
            }
            ProblemKind::HookTargetMissing { suggestion } => write!(
                f,
                "a hook is given for this path, which is not a tensor of the model{}",
                DidYouMean(suggestion.as_deref())
            ),
            ProblemKind::HookReadMissing => f.write_str("the hook reads this entry, which the archive lacks"),
            ProblemKind::HookFailed { error } => write!(f, "the hook failed: {error}"),
            ProblemKind::Unused => f.write_str("entry is not read by the model (strict coverage)"),
        }
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = &self.name;
        let Some(source) = &self.source else {
            // State-dict loads name the key in backticks.
            return match &self.kind {
                ProblemKind::Missing { suggestion } => {
                    write!(f, "missing `{name}`{}", DidYouMean(suggestion.as_deref()))
                }
                ProblemKind::Unexpected { suggestion } => {
                    write!(f, "unexpected `{name}`{}", DidYouMean(suggestion.as_deref()))
                }
                ProblemKind::Shape { expected, found } => {
                    write!(f, "`{name}`: expected shape {expected:?}, found {found:?}")
                }
                ProblemKind::DType { .. } => write!(f, "`{name}`: {}", self.kind),
                ProblemKind::NoMatch { .. } | ProblemKind::PrefixNotFound { .. } => write!(f, "{}", self.kind),
                kind => write!(f, "{name}: {kind}"),
            };
        };
        write!(f, "{name} <- {source}: {}", self.kind)
    }
}

/// Whether a [`LoadError`] comes from a state-dict load or an import.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum LoadAction {
    /// A state-dict or archive load by name.
    #[default]
    Load,
    /// An import following the model's import rules.
    Import,
}

/// A load or import that was refused, with every problem found. The target was left unchanged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadError {
    /// Whether it was a load or an import.
    pub action: LoadAction,
    /// What was being loaded from (a file name or `state dict`).
    pub source: String,
    /// The type name of the module loaded into.
    pub target: String,
    /// Every problem, in the module's walk order followed by unexpected keys.
    pub problems: Vec<Problem>,
}

impl LoadError {
    /// The problems' kinds, in order: what a program matches.
    pub fn kinds(&self) -> impl Iterator<Item = &ProblemKind> {
        self.problems.iter().map(|problem| &problem.kind)
    }
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let count = self.problems.len();
        let verb = match self.action {
            LoadAction::Load => "load",
            LoadAction::Import => "import",
        };
        write!(
            f,
            "cannot {verb} {} into `{}`: {count} problem{}",
            self.source,
            self.target,
            if count == 1 { "" } else { "s" }
        )?;
        if count == 0 {
            f.write_str(" (nothing under the given prefix matches the module: check the prefix)")?;
        }
        for problem in &self.problems {
            write!(f, "\n  {problem}")?;
        }
        Ok(())
    }
}

impl std::error::Error for LoadError {}
