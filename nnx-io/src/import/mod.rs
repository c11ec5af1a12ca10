//! Importing weights laid out by someone else: each tensor follows the import rules recorded by
//! the derive (`from`, `split`, `transpose`, `tie`, `optional`, `dtype`), everything is checked
//! from headers first, and tensors become views of the mapped file. Export is the inverse.
//!
//! [`plan`] turns the model walk and the archive's headers into one action or problem per
//! tensor, [`apply`] carries a valid plan out, [`export`] writes a model back in its source
//! layout; this file holds the options and the report.

mod apply;

pub(crate) use apply::reorder_rope_rows;
mod export;
mod plan;

use std::fmt;

use nnx_core::{DType, Device, LoadError, Naming, Placement, Problem, Tensor};

use crate::archive::Archive;
use crate::error::Result;

pub use plan::{ImportPlan, PlanRow};

/// Code that supplies one model tensor from the archive, for mappings the attributes cannot
/// express (a permutation of attention heads, say). It gets the archive and what the model
/// expects, and returns the tensor; nnx checks its dtype and shape before using it.
pub type ImportHook = Box<dyn Fn(&Archive, &HookContext<'_>) -> Result<Tensor> + Send + Sync>;

/// The report of a refused import: the same type as every refused load.
pub type ImportError = LoadError;

/// One problem of an import: the same type as every load problem.
pub type ImportProblem = Problem;

/// What a hook is asked for.
#[derive(Debug, Clone, Copy)]
pub struct HookContext<'a> {
    /// The model path of the tensor.
    pub name: &'a str,
    /// The source path the attributes give (prefix included).
    pub source: &'a str,
    /// The dtype the model holds.
    pub dtype: DType,
    /// The shape the model holds.
    pub shape: &'a [usize],
    /// The import prefix.
    pub prefix: &'a str,
}

/// A hook registered with [`ImportOptions::hook`].
pub(crate) struct Hook {
    /// The model path of the tensor it supplies.
    pub(crate) name: String,
    /// The entries it reads, relative to the import prefix.
    pub(crate) reads: Vec<String>,
    /// The code.
    pub(crate) function: ImportHook,
}

/// Tensor-parallel placement: layers matched by `column` are cut along their output axis
/// (axis 0 of every tensor under them), layers matched by `row` along their input axis (the
/// last axis of rank-2+ tensors; biases stay whole), and this rank keeps piece `rank` of
/// `world_size`. Patterns match layer paths segment by segment: `*` is one segment, `**` any
/// number (`h.*.attn.q`, `**.mlp.up`).
#[derive(Debug, Clone, Default)]
pub struct TensorParallel {
    /// Number of ranks.
    pub world_size: usize,
    /// This rank.
    pub rank: usize,
    /// Column-parallel layers (cut along the output axis).
    pub column: Vec<String>,
    /// Row-parallel layers (cut along the input axis).
    pub row: Vec<String>,
}

fn glob(pattern: &[&str], path: &[&str]) -> bool {
    match (pattern.split_first(), path.split_first()) {
        (None, None) => true,
        (Some((&"**", rest)), _) => glob(rest, path) || (!path.is_empty() && glob(pattern, &path[1..])),
        (Some((segment, rest)), Some((head, tail))) => (*segment == "*" || segment == head) && glob(rest, tail),
        _ => false,
    }
}

impl TensorParallel {
    /// The axis this rank cuts `name` (a model tensor path of `rank` axes) along, if any.
    fn axis(&self, name: &str, rank: usize) -> Option<usize> {
        let segments: Vec<&str> = name.split('.').collect();
        let layer = &segments[..segments.len().saturating_sub(1)];
        let matches =
            |patterns: &[String]| patterns.iter().any(|pattern| glob(&pattern.split('.').collect::<Vec<_>>(), layer));
        if matches(&self.column) && rank >= 1 {
            Some(0)
        } else if matches(&self.row) && rank >= 2 {
            Some(rank - 1)
        } else {
            None
        }
    }
}

/// Options of [`Archive::import_into_with`].
#[derive(Default)]
pub struct ImportOptions {
    /// Entries under the prefix that the model does not read are an error, not a report line.
    pub strict_coverage: bool,
    /// Cut chosen weights for one rank of a tensor-parallel group.
    pub placement: Option<TensorParallel>,
    /// Which of the recorded source names to follow; `None` picks GGUF names for GGUF files
    /// and transformers names for everything else.
    pub naming: Option<Naming>,
    /// Rows that `rope_permute` would reorder keep the file's order (llama.cpp's rotary pairs
    /// side by side), for a model that rotates its outputs in that order: the import then
    /// reads the entries as they are, with no reordered copy. The head count is still checked.
    pub stored_rope_rows: bool,
    hooks: Vec<Hook>,
}

impl fmt::Debug for ImportOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let hooks: Vec<&str> = self.hooks.iter().map(|hook| hook.name.as_str()).collect();
        f.debug_struct("ImportOptions")
            .field("strict_coverage", &self.strict_coverage)
            .field("placement", &self.placement)
            .field("naming", &self.naming)
            .field("stored_rope_rows", &self.stored_rope_rows)
            .field("hooks", &hooks)
            .finish()
    }
}

impl ImportOptions {
    /// Makes entries under the prefix that the model does not read an error.
    pub fn with_strict_coverage(mut self) -> ImportOptions {
        self.strict_coverage = true;
        self
    }

    /// Follows `naming`'s source names whatever the file, such as GGUF names in a SafeTensors
    /// file converted from GGUF with its names kept.
    pub fn with_naming(mut self, naming: Naming) -> ImportOptions {
        self.naming = Some(naming);
        self
    }

    /// Keeps the rows of `rope_permute` entries in the file's order (see
    /// [`ImportOptions::stored_rope_rows`]).
    pub fn with_stored_rope_rows(mut self) -> ImportOptions {
        self.stored_rope_rows = true;
        self
    }

    /// Imports this rank's slices of a tensor-parallel group.
    pub fn with_placement(mut self, placement: TensorParallel) -> ImportOptions {
        self.placement = Some(placement);
        self
    }

    /// Supplies the model tensor `name` by code instead of by its attributes. `reads` lists the
    /// entries (relative to the import prefix) the hook reads, so that they are checked to
    /// exist first and counted as used.
    pub fn hook(
        mut self,
        name: impl Into<String>,
        reads: impl IntoIterator<Item = impl Into<String>>,
        hook: impl Fn(&Archive, &HookContext<'_>) -> Result<Tensor> + Send + Sync + 'static,
    ) -> ImportOptions {
        self.hooks.push(Hook {
            name: name.into(),
            reads: reads.into_iter().map(Into::into).collect(),
            function: Box::new(hook),
        });
        self
    }
}

/// What an import did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ImportReport {
    /// Model tensors read from the archive (views, or casts), in walk order.
    pub imported: Vec<String>,
    /// Model tensors that are another tensor (`tie`).
    pub tied: Vec<String>,
    /// `optional` model tensors the archive lacks; they kept their values.
    pub absent: Vec<String>,
    /// Model tensors cast to the model's float dtype.
    pub cast: Vec<String>,
    /// Entries under the prefix that nothing read.
    pub unused: Vec<String>,
    /// Model tensors on a device placed over the pages of the mapped file, with no copy (a
    /// page-aligned entry, read as stored, on a device that can import host pages).
    pub zero_copy: Vec<String>,
    /// Model tensors on a device copied into its memory: a tensor also in `cast` was cast on
    /// the host first; the others were uploaded straight from the file's pages.
    pub uploaded: Vec<String>,
}

impl ImportReport {
    /// `tensor` on `device`, recorded under `name` as zero-copy or uploaded (nothing is
    /// recorded for the host, where the tensor is shared).
    pub(crate) fn place<D: Device>(&mut self, device: &D, name: &str, tensor: &Tensor) -> nnx_core::Result<Tensor<D>> {
        let (placed, placement) = device.transfer(tensor)?;
        match placement {
            Placement::ZeroCopy => self.zero_copy.push(name.to_string()),
            Placement::Uploaded => self.uploaded.push(name.to_string()),
            Placement::Shared => {}
        }
        Ok(placed)
    }

    /// How the model tensor `name` was placed: [`Placement::Shared`] for one imported into a
    /// host model, `None` for a tensor the import did not read (tied, absent or unknown).
    pub fn placement(&self, name: &str) -> Option<Placement> {
        let has = |names: &[String]| names.iter().any(|seen| seen == name);
        if has(&self.zero_copy) {
            Some(Placement::ZeroCopy)
        } else if has(&self.uploaded) {
            Some(Placement::Uploaded)
        } else if has(&self.imported) {
            Some(Placement::Shared)
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_match_segments() {
        let pattern = |text: &'static str| text.split('.').collect::<Vec<_>>();
        assert!(glob(&pattern("h.*.attn.q"), &pattern("h.3.attn.q")));
        assert!(!glob(&pattern("h.*.attn.q"), &pattern("h.3.attn.k")));
        assert!(glob(&pattern("**.mlp.up"), &pattern("model.h.0.mlp.up")));
        assert!(glob(&pattern("**"), &pattern("a.b")));
    }
}
