//! Planning an import from headers alone: one [`Action`] or one [`Problem`] per model tensor,
//! decided by [`Planner::plan_row`], and the plan's table.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::fmt;

use nnx_core::__private::{for_each_entry_named, join, render_columns, suggest, under_prefix};
use nnx_core::quant::ggml::GgmlType;
use nnx_core::{
    DType, Device, ImportOp, LoadAction, LoadError, Module, Naming, OpChain, Problem, ProblemKind, ProblemSource,
    SourceOp, TensorSlot,
};

use super::{Hook, ImportOptions};
use crate::archive::Archive;
use crate::error::Result;

/// How one model tensor gets its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Action {
    /// Read the source entry, apply the ops, cut along `parallel_axis` for the placement, cast
    /// to `cast`.
    Read {
        /// The model's float dtype, when the entry is another float.
        cast: Option<DType>,
        /// The axis the placement cuts, if any.
        parallel_axis: Option<usize>,
    },
    /// The same tensor as the model tensor at this path.
    Tie(String),
    /// Given by the hook at this position of [`ImportOptions`]'s hooks.
    Hook(usize),
    /// Optional and absent: keep the value.
    Keep,
    /// Found a problem; nothing will be done.
    Invalid,
}

/// The plan for one model tensor: what the walk says about it, what the headers say, and the
/// action decided.
#[derive(Debug, Clone)]
pub(super) struct Row {
    pub(super) name: String,
    pub(super) source: String,
    pub(super) ops: Vec<ImportOp>,
    optional: bool,
    required: Option<DType>,
    tie: Option<String>,
    pub(super) model_dtype: DType,
    pub(super) model_shape: Vec<usize>,
    stored: Option<(DType, Vec<usize>)>,
    /// For a U8 model tensor over a GGUF entry: the entry's ggml type, whose blocks are read as
    /// they are stored, one row of bytes per row of values.
    pub(super) packed: Option<GgmlType>,
    /// The head count of a `rope_permute`, from the GGUF metadata.
    pub(super) heads: Option<usize>,
    pub(super) action: Action,
}

impl Row {
    /// The row of one model tensor, before the archive is consulted.
    fn new(slot: &TensorSlot<'_>, prefix: &str, dtype: DType, shape: &[usize]) -> Row {
        Row {
            name: slot.name.to_string(),
            source: join(prefix, slot.source),
            ops: slot.ops.to_vec(),
            optional: slot.optional,
            required: slot.dtype,
            tie: slot.tie.map(str::to_string),
            model_dtype: dtype,
            model_shape: shape.to_vec(),
            stored: None,
            packed: None,
            heads: None,
            action: Action::Invalid,
        }
    }
}

/// An import planned from headers: what each model tensor reads and how, without reading data.
#[derive(Debug, Clone)]
pub struct ImportPlan {
    origin: String,
    target: String,
    pub(super) rows: Vec<Row>,
    pub(super) problems: Vec<Problem>,
    pub(super) unused: Vec<String>,
}

/// The import operations as data for a [`Problem`].
pub(super) fn source_ops(ops: &[ImportOp]) -> Vec<SourceOp> {
    ops.iter()
        .map(|op| match op {
            ImportOp::Split(split) => SourceOp::Split { axis: split.axis, index: split.index, parts: split.parts },
            ImportOp::Transpose => SourceOp::Transpose,
            ImportOp::RopePermute(key) => SourceOp::RopePermute { key },
            ImportOp::Offset(value) => SourceOp::Offset { value: *value },
        })
        .collect()
}

/// Applies the ops to a stored shape: the shape the model tensor will have, or what is wrong.
fn apply_shape(ops: &[ImportOp], shape: &[usize]) -> Result<Vec<usize>, ProblemKind> {
    let mut shape = shape.to_vec();
    for op in ops {
        match op {
            ImportOp::Split(split) => {
                let axis = resolve_axis(split.axis, shape.len())
                    .ok_or(ProblemKind::SplitAxisOutOfRange { axis: split.axis, rank: shape.len() })?;
                if !shape[axis].is_multiple_of(split.parts) {
                    return Err(ProblemKind::NotDivisible { axis: split.axis, size: shape[axis], parts: split.parts });
                }
                shape[axis] /= split.parts;
            }
            ImportOp::Transpose => {
                let rank = shape.len();
                if rank >= 2 {
                    shape.swap(rank - 2, rank - 1);
                }
            }
            ImportOp::RopePermute(_) | ImportOp::Offset(_) => {}
        }
    }
    Ok(shape)
}

/// `axis` (negative counts from the end) as an index into `rank` axes, if it is one.
pub(super) fn resolve_axis(axis: isize, rank: usize) -> Option<usize> {
    let resolved = if axis < 0 { rank as isize + axis } else { axis };
    (0..rank as isize).contains(&resolved).then_some(resolved as usize)
}

/// Finds the deepest numbered path prefix of `source` that no entry lies under, such as
/// `transformer.h.12` when the file has layers 0 to 11: that prefix, and the problem naming
/// the layers the file does have.
fn missing_subtree(archive: &Archive, source: &str) -> Option<(String, ProblemKind)> {
    let segments: Vec<&str> = source.split('.').collect();
    for end in 1..segments.len() {
        if segments[end - 1].parse::<usize>().is_err() {
            continue;
        }
        let prefix = segments[..end].join(".");
        if archive.names().any(|name| under_prefix(name, &prefix).is_some()) {
            continue;
        }
        let parent = segments[..end - 1].join(".");
        let indices: BTreeSet<usize> = archive
            .names()
            .filter_map(|name| under_prefix(name, &parent))
            .filter_map(|rest| rest.split('.').next()?.parse().ok())
            .collect();
        let present = indices.first().zip(indices.last()).map(|(first, last)| (*first, *last));
        return Some((prefix, ProblemKind::MissingSubtree { parent, present }));
    }
    None
}

/// The model path prefix that corresponds to the missing source `subtree` of one tensor: the
/// model name with as many trailing segments removed as the source has below the subtree.
fn model_prefix_for(name: &str, source: &str, subtree: &str) -> String {
    let below = source.split('.').count() - subtree.split('.').count();
    let segments: Vec<&str> = name.split('.').collect();
    segments[..segments.len().saturating_sub(below).max(1)].join(".")
}

/// What every row is planned against: the archive, the options and the model's tensors.
struct Planner<'a> {
    archive: &'a Archive,
    options: &'a ImportOptions,
    /// Model path -> (dtype, shape), for ties.
    model: HashMap<&'a str, (DType, &'a [usize])>,
    /// The model paths in walk order, for suggestions.
    names: Vec<&'a str>,
    /// Model path -> hook position.
    hooks: HashMap<&'a str, usize>,
}

impl Planner<'_> {
    /// The file's `general.architecture`, which prefixes its model keys.
    fn architecture(&self) -> &str {
        self.archive.gguf_metadata().and_then(|metadata| metadata.str("general.architecture")).unwrap_or("?")
    }

    /// The action for one model tensor, or the one problem that stops it. Reads nothing but
    /// the headers already looked up in `row.stored`.
    fn plan_row(&self, row: &Row) -> Result<Action, Box<Problem>> {
        if let Some(&at) = self.hooks.get(row.name.as_str()) {
            return Ok(Action::Hook(at));
        }
        if let Some(target) = &row.tie {
            return self.plan_tie(row, target);
        }
        let Some((dtype, shape)) = &row.stored else {
            if row.optional {
                return Ok(Action::Keep);
            }
            if let Some((subtree, kind)) = missing_subtree(self.archive, &row.source) {
                let source = ProblemSource::Entry { name: subtree.clone(), stored: None, ops: Vec::new() };
                let name = model_prefix_for(&row.name, &row.source, &subtree);
                return Err(Box::new(Problem::new(name, kind).with_source(source)));
            }
            let kind = ProblemKind::Missing { suggestion: suggest(&row.source, self.archive.names()) };
            let source = ProblemSource::Entry { name: row.source.clone(), stored: None, ops: source_ops(&row.ops) };
            return Err(Box::new(Problem::new(&row.name, kind).with_source(source)));
        };
        let (dtype, shape) = (*dtype, shape.as_slice());
        let fail = |kind: ProblemKind| {
            let source = ProblemSource::Entry {
                name: row.source.clone(),
                stored: Some((dtype, shape.to_vec())),
                ops: source_ops(&row.ops),
            };
            Err(Box::new(Problem::new(&row.name, kind).with_source(source)))
        };
        let strided = row
            .ops
            .iter()
            .any(|op| matches!(op, ImportOp::Split(_)) || (*op == ImportOp::Transpose && shape.len() >= 2));
        if strided && dtype.size_in_bytes().is_none() {
            return fail(ProblemKind::SubByte { dtype });
        }
        let mut result = match apply_shape(&row.ops, shape) {
            Ok(result) => result,
            Err(kind) => return fail(kind),
        };
        for op in &row.ops {
            match op {
                ImportOp::RopePermute(key) => {
                    let Some(heads) = row.heads else {
                        let key = format!("{}.attention.{key}", self.architecture());
                        return fail(ProblemKind::MetadataKey { key, needed_for: "`rope_permute` groups the rows by" });
                    };
                    let rows = shape.first().copied().unwrap_or(0);
                    if !rows.is_multiple_of(2 * heads) {
                        return fail(ProblemKind::RopeRows { rows, heads });
                    }
                }
                ImportOp::Offset(_) if !row.model_dtype.is_castable_float() => {
                    return fail(ProblemKind::OffsetNotFloat { dtype: row.model_dtype });
                }
                _ => {}
            }
        }
        let mut parallel_axis = None;
        if let Some(placement) = &self.options.placement
            && let Some(axis) = placement.axis(&row.name, result.len())
        {
            if placement.world_size == 0
                || !result[axis].is_multiple_of(placement.world_size)
                || placement.rank >= placement.world_size
            {
                return fail(ProblemKind::NotDivisibleForRank {
                    axis,
                    size: result[axis],
                    world_size: placement.world_size,
                    rank: placement.rank,
                });
            }
            result[axis] /= placement.world_size;
            parallel_axis = Some(axis);
        }
        if let Some(required) = row.required
            && (dtype != required || row.model_dtype != required)
        {
            let found = if dtype != required { dtype } else { row.model_dtype };
            return fail(ProblemKind::RequiredDType { required, found });
        }
        let cast = if dtype == row.model_dtype {
            None
        } else if dtype.is_castable_float() && row.model_dtype.is_castable_float() && row.required.is_none() {
            Some(row.model_dtype)
        } else {
            return fail(ProblemKind::NotCastable { expected: row.model_dtype, found: dtype });
        };
        // Axes of length one are layout, not data: an entry stored `[C, 1, K]` (a depthwise
        // convolution's weight in PyTorch) reads into a model tensor `[C, K]`, and back.
        if result != row.model_shape && !same_but_unit_axes(&result, &row.model_shape) {
            return fail(ProblemKind::Shape { expected: row.model_shape.clone(), found: result });
        }
        Ok(Action::Read { cast, parallel_axis })
    }

    /// A tie: the target must be a tensor of the model with the same dtype and shape.
    fn plan_tie(&self, row: &Row, target: &str) -> Result<Action, Box<Problem>> {
        let problem =
            |kind| Box::new(Problem::new(&row.name, kind).with_source(ProblemSource::Tie { target: target.into() }));
        match self.model.get(target) {
            None => Err(problem(ProblemKind::TieTargetMissing {
                target: target.into(),
                suggestion: suggest(target, self.names.iter().copied()),
            })),
            Some(&(dtype, shape)) if dtype != row.model_dtype || shape != row.model_shape.as_slice() => {
                Err(problem(ProblemKind::TieMismatch {
                    expected_dtype: row.model_dtype,
                    expected_shape: row.model_shape.clone(),
                    found_dtype: dtype,
                    found_shape: shape.to_vec(),
                }))
            }
            Some(_) => Ok(Action::Tie(target.into())),
        }
    }

    /// The problems of one hook: a path that is no tensor of the model, entries it reads that
    /// the archive lacks.
    fn plan_hook(&self, hook: &Hook, prefix: &str) -> Result<Vec<Problem>> {
        let mut problems = Vec::new();
        if !self.model.contains_key(hook.name.as_str()) {
            let suggestion = suggest(&hook.name, self.names.iter().copied());
            problems.push(Problem::new(&hook.name, ProblemKind::HookTargetMissing { suggestion }));
        }
        for read in &hook.reads {
            let full = join(prefix, read);
            if self.archive.spec(&full)?.is_none() {
                let source = ProblemSource::Entry { name: full, stored: None, ops: Vec::new() };
                problems.push(Problem::new(&hook.name, ProblemKind::HookReadMissing).with_source(source));
            }
        }
        Ok(problems)
    }
}

/// One model tensor of an [`ImportPlan`] as data: what `nnx inspect --model` draws.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct PlanRow {
    /// The model path (`layers.0.attn.q.weight`).
    pub field: String,
    /// The entry it reads (`model.layers.0.self_attn.q_proj.weight`).
    pub source: String,
    /// `read`, `tie` (the same tensor as another field), `hook` (given by code), `keep`
    /// (optional and absent) or `invalid` (see `problem`).
    pub action: &'static str,
    /// The operations on the way, in order (`split(0, 1/3)`, `transpose`, `rope_permute(..)`,
    /// `shard(axis 0)`).
    pub ops: Vec<String>,
    /// The entry's dtype and shape as stored, when it exists.
    pub stored_dtype: Option<String>,
    /// See `stored_dtype`.
    pub stored_shape: Option<Vec<usize>>,
    /// The model tensor's dtype.
    pub dtype: String,
    /// The model tensor's shape.
    pub shape: Vec<usize>,
    /// The field it is tied to.
    pub tie: Option<String>,
    /// What is wrong with this row, when something is.
    pub problem: Option<String>,
}

impl ImportPlan {
    /// The plan row by row, as data, with each row's problems.
    pub fn rows(&self) -> Vec<PlanRow> {
        self.rows
            .iter()
            .map(|row| {
                let (action, tie) = match &row.action {
                    Action::Read { .. } => ("read", None),
                    Action::Tie(target) => ("tie", Some(target.clone())),
                    Action::Hook(_) => ("hook", None),
                    Action::Keep => ("keep", None),
                    Action::Invalid => ("invalid", None),
                };
                let rank = row.stored.as_ref().map_or(row.model_shape.len(), |(_, shape)| shape.len());
                let mut ops: Vec<String> = source_ops(&row.ops)
                    .iter()
                    .map(|op| OpChain { ops: std::slice::from_ref(op), rank }.to_string().trim().to_string())
                    .filter(|op| !op.is_empty())
                    .collect();
                if let Action::Read { parallel_axis: Some(axis), .. } = row.action {
                    ops.push(format!("shard(axis {axis})"));
                }
                let problems: Vec<String> = self
                    .problems
                    .iter()
                    .filter(|problem| problem.name == row.name)
                    .map(|problem| problem.kind.to_string())
                    .collect();
                PlanRow {
                    field: row.name.clone(),
                    source: row.source.clone(),
                    action,
                    ops,
                    stored_dtype: row.stored.as_ref().map(|(dtype, _)| dtype.to_string()),
                    stored_shape: row.stored.as_ref().map(|(_, shape)| shape.clone()),
                    dtype: row.model_dtype.to_string(),
                    shape: row.model_shape.clone(),
                    tie,
                    problem: (!problems.is_empty()).then(|| problems.join("; ")),
                }
            })
            .collect()
    }

    /// The name of the model type the plan imports into.
    pub fn target(&self) -> &str {
        &self.target
    }

    /// Whether the import would succeed.
    pub fn is_valid(&self) -> bool {
        self.problems.is_empty()
    }

    /// Every problem found.
    pub fn problems(&self) -> &[Problem] {
        &self.problems
    }

    /// Entries under the prefix that the model does not read.
    pub fn unused(&self) -> &[String] {
        &self.unused
    }

    /// The refusal of this plan, with every problem.
    pub(super) fn error(&self) -> LoadError {
        LoadError {
            action: LoadAction::Import,
            source: self.origin.clone(),
            target: self.target.clone(),
            problems: self.problems.clone(),
        }
    }
}

impl fmt::Display for ImportPlan {
    /// A table of model path <- source entry, operations, dtype, shape and bytes, then the
    /// entries left unused and the problems.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut rows = Vec::new();
        let mut entries = HashSet::new();
        let mut total = 0u64;
        for row in &self.rows {
            if let (Action::Read { .. }, Some((dtype, shape))) = (&row.action, &row.stored)
                && entries.insert(row.source.as_str())
            {
                total += dtype.storage_bytes(shape.iter().product::<usize>() as u64).unwrap_or(0);
            }
            let blank = || (String::new(), String::new(), String::new(), String::new());
            let (source, (ops, dtype, shape, bytes)) = match (&row.action, &row.stored) {
                (Action::Tie(target), _) => (ProblemSource::Tie { target: target.clone() }.to_string(), blank()),
                (Action::Hook(_), _) => (ProblemSource::Hook { source: row.source.clone() }.to_string(), blank()),
                (Action::Keep, _) => (format!("{} (absent, optional)", row.source), blank()),
                (action, Some((dtype, shape))) => {
                    // Bytes this tensor reads: its piece of the entry, before any cast.
                    let elements: usize = row.model_shape.iter().product();
                    let bytes = dtype.storage_bytes(elements as u64).unwrap_or(0);
                    let ops = source_ops(&row.ops);
                    let mut ops = OpChain { ops: &ops, rank: shape.len() }.to_string().trim_start().to_string();
                    if let Action::Read { parallel_axis: Some(axis), .. } = action {
                        ops.push_str(&format!("{}shard(axis {axis})", if ops.is_empty() { "" } else { " " }));
                    }
                    let dtype_text = if *dtype == row.model_dtype {
                        dtype.to_string()
                    } else {
                        format!("{dtype} -> {}", row.model_dtype)
                    };
                    (row.source.clone(), (ops, dtype_text, format!("{shape:?}"), bytes.to_string()))
                }
                (_, None) => (row.source.clone(), (String::new(), "?".into(), "?".into(), String::new())),
            };
            rows.push(vec![row.name.clone(), "<-".into(), source, ops, dtype, shape, bytes]);
        }
        writeln!(
            f,
            "import {} into `{}`: {} tensors from {} entries ({total} bytes)",
            self.origin,
            self.target,
            self.rows.len(),
            entries.len()
        )?;
        f.write_str(&render_columns(&["model", "", "source", "ops", "dtype", "stored shape", "bytes"], &rows))?;
        if !self.unused.is_empty() {
            writeln!(f, "unused entries ({}):", self.unused.len())?;
            for name in &self.unused {
                writeln!(f, "  {name}")?;
            }
        }
        if !self.problems.is_empty() {
            writeln!(f, "problems ({}):", self.problems.len())?;
            for problem in &self.problems {
                writeln!(f, "  {problem}")?;
            }
        }
        Ok(())
    }
}

impl Archive {
    /// Plans importing `module` from the entries under `prefix`, reading headers only: what
    /// each tensor reads, the operations on the way, and every problem.
    ///
    /// # Errors
    /// Only the error of opening a shard; problems with the mapping are in the plan.
    pub fn import_plan<D: Device, M: Module<D> + ?Sized>(&self, module: &M, prefix: &str) -> Result<ImportPlan> {
        self.plan(module, prefix, &ImportOptions::default())
    }

    /// [`Archive::import_plan`] with options (hooks, naming, placement), as an import with
    /// them would go.
    ///
    /// # Errors
    /// As [`Archive::import_plan`].
    pub fn import_plan_with<D: Device, M: Module<D> + ?Sized>(
        &self,
        module: &M,
        prefix: &str,
        options: &ImportOptions,
    ) -> Result<ImportPlan> {
        self.plan(module, prefix, options)
    }

    /// [`Archive::import_plan`] with options. The plan reads only names, dtypes and shapes,
    /// which every device's tensors have, so a module on any device is planned alike.
    pub(super) fn plan<D: Device, M: Module<D> + ?Sized>(
        &self,
        module: &M,
        prefix: &str,
        options: &ImportOptions,
    ) -> Result<ImportPlan> {
        let mut rows = Vec::new();
        for_each_entry_named(module, self.naming(options), |slot, tensor| {
            rows.push(Row::new(&slot, prefix, tensor.dtype(), tensor.shape()))
        });
        self.plan_rows(rows, module.module_name(), prefix, options)
    }

    /// The naming an import follows: the options', else GGUF names for a GGUF file.
    pub(super) fn naming(&self, options: &ImportOptions) -> Naming {
        options.naming.unwrap_or(if self.gguf_metadata().is_some() { Naming::Gguf } else { Naming::Transformers })
    }

    /// `{arch}.attention.<key>` of the GGUF metadata, when it is a positive integer.
    fn head_count(&self, key: &str) -> Option<usize> {
        let metadata = self.gguf_metadata()?;
        let arch = metadata.str("general.architecture")?;
        metadata
            .u64(&format!("{arch}.attention.{key}"))
            .and_then(|heads| usize::try_from(heads).ok())
            .filter(|&heads| heads > 0)
    }

    /// A U8 `[.., rows, row_bytes]` model tensor over a GGUF entry of `[.., rows, values]` (a
    /// matrix, or a stack of them such as a layer's experts): the entry's ggml type when its rows
    /// of blocks are exactly that many bytes.
    fn packed_type(&self, source: &str, model: (DType, &[usize]), stored: &(DType, Vec<usize>)) -> Option<GgmlType> {
        self.gguf_metadata()?;
        let (DType::U8, [outer @ .., row_bytes]) = model else { return None };
        let [stored_outer @ .., values] = stored.1.as_slice() else { return None };
        let ty = self.ggml_type(source)?;
        (!outer.is_empty() && stored_outer == outer && ty.row_bytes(*values) == Some(*row_bytes)).then_some(ty)
    }

    fn plan_rows(&self, mut rows: Vec<Row>, target: &str, prefix: &str, options: &ImportOptions) -> Result<ImportPlan> {
        let hooked: HashSet<&str> = options.hooks.iter().map(|hook| hook.name.as_str()).collect();
        let mut used: HashSet<String> = HashSet::new();
        for row in &mut rows {
            if row.tie.is_none() && !hooked.contains(row.name.as_str()) {
                row.stored = self.spec(&row.source)?;
                if let Some(stored) = &row.stored {
                    used.insert(row.source.clone());
                    row.packed = self.packed_type(&row.source, (row.model_dtype, &row.model_shape), stored);
                    if row.packed.is_some() {
                        row.stored = Some((DType::U8, row.model_shape.clone()));
                    }
                }
                if let Some(ImportOp::RopePermute(key)) =
                    row.ops.iter().find(|op| matches!(op, ImportOp::RopePermute(_)))
                {
                    row.heads = self.head_count(key);
                }
            }
        }

        let planner = Planner {
            archive: self,
            options,
            model: rows.iter().map(|row| (row.name.as_str(), (row.model_dtype, row.model_shape.as_slice()))).collect(),
            names: rows.iter().map(|row| row.name.as_str()).collect(),
            hooks: options.hooks.iter().enumerate().map(|(at, hook)| (hook.name.as_str(), at)).collect(),
        };
        // Problems in walk order, hooks first; a missing subtree is reported once.
        let mut problems = Vec::new();
        for hook in &options.hooks {
            problems.extend(planner.plan_hook(hook, prefix)?);
            used.extend(hook.reads.iter().map(|read| join(prefix, read)));
        }
        let mut reported_subtrees: HashSet<String> = HashSet::new();
        let planned: Vec<Result<Action, Box<Problem>>> = rows.iter().map(|row| planner.plan_row(row)).collect();
        for (row, planned) in rows.iter_mut().zip(planned) {
            row.action = match planned {
                Ok(action) => action,
                Err(problem) => {
                    let repeated = match (&problem.kind, &problem.source) {
                        (ProblemKind::MissingSubtree { .. }, Some(ProblemSource::Entry { name, .. })) => {
                            !reported_subtrees.insert(name.clone())
                        }
                        _ => false,
                    };
                    if !repeated {
                        problems.push(*problem);
                    }
                    Action::Invalid
                }
            };
        }

        let unused: Vec<String> = self
            .names()
            .filter(|name| under_prefix(name, prefix).is_some() && !used.contains(*name))
            .map(str::to_string)
            .collect();
        if options.strict_coverage {
            problems.extend(unused.iter().map(|name| Problem::new(name, ProblemKind::Unused)));
        }
        Ok(ImportPlan { origin: self.origin().to_string(), target: target.to_string(), rows, problems, unused })
    }
}

/// Whether two shapes hold the same values in the same order once their axes of length one are
/// left out.
fn same_but_unit_axes(a: &[usize], b: &[usize]) -> bool {
    a.iter().filter(|&&size| size != 1).eq(b.iter().filter(|&&size| size != 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_prefixes_follow_the_source() {
        assert_eq!(
            model_prefix_for("h.12.attn.q.weight", "transformer.h.12.attn.c_attn.weight", "transformer.h.12"),
            "h.12"
        );
    }
}
