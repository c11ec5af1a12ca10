//! The error type of nnx-core and the structured report of a failed load.

use std::fmt;

use crate::DType;

/// Result with the nnx-core [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in nnx-core. Each variant carries the values needed to say
/// what was expected, what was found and what to do.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
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
    #[error("cannot concatenate: {reason}")]
    Concat {
        /// What disagrees.
        reason: String,
    },
    /// A BOOL tensor holding a byte other than 0 or 1.
    #[error("BOOL element {index} holds byte {value}, not 0 or 1: the data is not a valid boolean tensor")]
    InvalidBool {
        /// Element index.
        index: usize,
        /// The byte found.
        value: u8,
    },
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
    /// A partial load in which no key of the source matched the module.
    #[error(
        "no key of the state dict matches `{target}` (the module has {module_keys:?}..., the dict has {dict_keys:?}...): check the prefix, or allow it with `LoadOptions {{ allow_no_match: true }}`"
    )]
    NoMatch {
        /// The module's type name.
        target: String,
        /// The first keys of the module.
        module_keys: Vec<String>,
        /// The first keys of the source.
        dict_keys: Vec<String>,
    },
    /// A strict or partial load that found problems; nothing was changed.
    #[error(transparent)]
    Load(#[from] LoadError),
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
}

/// One problem found while matching a set of named tensors against a module.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Problem {
    /// The module has the key; the source does not.
    Missing {
        /// The full key.
        key: String,
        /// A near-miss name the source does have.
        suggestion: Option<String>,
    },
    /// The source has the key; the module does not.
    Unexpected {
        /// The full key.
        key: String,
        /// A near-miss name the module does have.
        suggestion: Option<String>,
    },
    /// Both have the key with different dtypes.
    DType {
        /// The full key.
        key: String,
        /// The module's dtype.
        expected: DType,
        /// The source's dtype.
        found: DType,
    },
    /// Both have the key with different shapes.
    Shape {
        /// The full key.
        key: String,
        /// The module's shape.
        expected: Vec<usize>,
        /// The source's shape.
        found: Vec<usize>,
    },
}

impl Problem {
    /// The full key the problem is about.
    pub fn key(&self) -> &str {
        match self {
            Problem::Missing { key, .. }
            | Problem::Unexpected { key, .. }
            | Problem::DType { key, .. }
            | Problem::Shape { key, .. } => key,
        }
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Problem::Missing { key, suggestion } => {
                write!(f, "missing `{key}`")?;
                if let Some(near) = suggestion {
                    write!(f, " (did you mean `{near}`?)")?;
                }
                Ok(())
            }
            Problem::Unexpected { key, suggestion } => {
                write!(f, "unexpected `{key}`")?;
                if let Some(near) = suggestion {
                    write!(f, " (did you mean `{near}`?)")?;
                }
                Ok(())
            }
            Problem::DType { key, expected, found } => {
                write!(f, "`{key}`: expected dtype {expected}, found {found}")
            }
            Problem::Shape { key, expected, found } => {
                write!(f, "`{key}`: expected shape {expected:?}, found {found:?}")
            }
        }
    }
}

/// A load that was refused, with every problem found. The target was left unchanged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadError {
    /// What was being loaded from (a file name or `state dict`).
    pub source: String,
    /// The type name of the module loaded into.
    pub target: String,
    /// Every problem, in the module's walk order followed by unexpected keys.
    pub problems: Vec<Problem>,
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let count = self.problems.len();
        write!(
            f,
            "cannot load {} into `{}`: {count} problem{}",
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
