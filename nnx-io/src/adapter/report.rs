//! What an adapter found in a model and why it does not fit ([`AdapterReport`],
//! [`AdapterProblem`]), and the errors every part of the adapter module returns: an entry that
//! does not make an adapter, and a mismatch that lists the first problems and counts the rest.

use std::path::Path;

use super::{Adapter, LoraModule};
use crate::error::Error;

/// What an adapter found in a model.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AdapterReport {
    /// Model tensors a module's delta (or trained bias) lands on, in adapter order.
    pub matched: Vec<String>,
    /// Model tensors a saved module replaces.
    pub replaced: Vec<String>,
    /// Everything that does not fit.
    pub problems: Vec<AdapterProblem>,
}

/// Why an adapter does not fit a model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdapterProblem {
    /// No model tensor is read from this source name.
    NoTarget {
        /// The adapter's source name (`model.layers.0.self_attn.q_proj.weight`).
        module: String,
        /// The model's closest source name, if one is close.
        suggestion: Option<String>,
    },
    /// The delta's shape is not the target's.
    Shape {
        /// The adapter's source name.
        module: String,
        /// The model tensor.
        target: String,
        /// The model tensor's shape.
        expected: Vec<usize>,
        /// The delta's shape as the model would read it.
        found: Vec<usize>,
    },
    /// A module that cannot be applied here.
    Unusable {
        /// The adapter's source name.
        module: String,
        /// Why.
        reason: String,
    },
}

impl std::fmt::Display for AdapterProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AdapterProblem::NoTarget { module, suggestion } => {
                write!(f, "`{module}` has no target in the model{}", nnx_core::error::DidYouMean(suggestion.as_deref()))
            }
            AdapterProblem::Shape { module, target, expected, found } => {
                write!(f, "`{module}` gives `{target}` a delta of {found:?}, but it is {expected:?}")
            }
            AdapterProblem::Unusable { module, reason } => write!(f, "`{module}`: {reason}"),
        }
    }
}

/// An [`Error::Adapter`] for `entry` of `path`.
pub(super) fn problem(path: &Path, entry: &str, problem: &str) -> Error {
    Error::Adapter { path: path.to_path_buf(), entry: entry.to_string(), problem: problem.to_string() }
}

/// Problems past this many are counted, not listed, and get no suggestion (the costly part of
/// a missing target): an adapter for another model can name thousands of modules.
const LISTED_PROBLEMS: usize = 20;

/// The problem of `module`, which nothing in the model or file is read from, with the nearest
/// of `candidates` while few problems are listed.
pub(super) fn no_target<'a>(
    problems: &[AdapterProblem],
    module: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> AdapterProblem {
    let suggestion =
        if problems.len() < LISTED_PROBLEMS { nnx_core::__private::suggest(module, candidates) } else { None };
    AdapterProblem::NoTarget { module: module.to_string(), suggestion }
}

/// What is wrong with `module` whatever it is merged into: a scale that is not a finite number
/// (an overflowing `--lora ADAPTER:SCALE`), or DoRA magnitudes that are not one per output row.
pub(super) fn module_problem(module: &LoraModule) -> Option<AdapterProblem> {
    let source = format!("{}.weight", module.source);
    if !module.scale.is_finite() {
        let reason = format!("its scale is {}, not a finite number: give a smaller multiplier", module.scale);
        return Some(AdapterProblem::Unusable { module: source, reason });
    }
    let rows = module.b.shape()[0];
    if let Some(magnitude) = &module.magnitude
        && magnitude.shape() != [rows]
    {
        let reason = format!(
            "its DoRA magnitude is {:?}, expected one value per output row ([{rows}]): the file is damaged",
            magnitude.shape()
        );
        return Some(AdapterProblem::Unusable { module: source, reason });
    }
    None
}

impl Adapter {
    /// The error for `problems` of this adapter on `target`.
    /// The first [`LISTED_PROBLEMS`] are listed and the rest counted, so that an adapter of
    /// thousands of modules for another model gives a readable error.
    pub(super) fn mismatch(&self, target: String, problems: &[AdapterProblem]) -> Error {
        let mut listed: Vec<String> = problems.iter().take(LISTED_PROBLEMS).map(ToString::to_string).collect();
        if problems.len() > LISTED_PROBLEMS {
            listed.push(format!("and {} more problems", problems.len() - LISTED_PROBLEMS));
        }
        Error::AdapterMismatch { path: self.path.clone(), target, problems: listed }
    }
}

/// `M`'s type name without its path, for messages.
pub(super) fn model_name<M: ?Sized>() -> String {
    nnx_core::__private::short_type_name(std::any::type_name::<M>()).to_string()
}
