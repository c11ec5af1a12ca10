//! Importing weights laid out by someone else: each tensor follows the import rules recorded by
//! the derive (`from`, `split`, `transpose`, `tie`, `optional`, `dtype`), everything is checked
//! from headers first, and tensors become views of the mapped file. Export is the inverse.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::fmt;

use nnx_core::{
    DType, Module, Op, Tensor, for_each_entry, for_each_entry_mut, join, render_columns, suggest, under_prefix,
};

use crate::archive::Archive;
use crate::error::{Error, Result};

/// Code that supplies one model tensor from the archive, for mappings the attributes cannot
/// express (a permutation of attention heads, say). It gets the archive and what the model
/// expects, and returns the tensor; nnx checks its dtype and shape before using it.
pub type ImportHook = Box<dyn Fn(&Archive, &HookContext<'_>) -> Result<Tensor> + Send + Sync>;

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
    hooks: Vec<(String, Vec<String>, ImportHook)>,
}

impl fmt::Debug for ImportOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let hooks: Vec<&str> = self.hooks.iter().map(|(name, _, _)| name.as_str()).collect();
        f.debug_struct("ImportOptions")
            .field("strict_coverage", &self.strict_coverage)
            .field("placement", &self.placement)
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
        self.hooks.push((name.into(), reads.into_iter().map(Into::into).collect(), Box::new(hook)));
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
}

/// One problem found while planning an import.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImportProblem {
    /// The model path (or path prefix, for a whole missing subtree).
    pub name: String,
    /// The source entry, with its stored shape and the operations applied, as printed.
    pub source: String,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for ImportProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.source.is_empty() {
            write!(f, "{}: {}", self.name, self.message)
        } else {
            write!(f, "{} <- {}: {}", self.name, self.source, self.message)
        }
    }
}

/// An import that was refused, with every problem found; the model was left unchanged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImportError {
    /// The archive.
    pub origin: String,
    /// The model's type name.
    pub target: String,
    /// Every problem, in walk order, then unused entries under strict coverage.
    pub problems: Vec<ImportProblem>,
}

impl fmt::Display for ImportError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let count = self.problems.len();
        write!(
            f,
            "cannot import {} into `{}`: {count} problem{}",
            self.origin,
            self.target,
            if count == 1 { "" } else { "s" }
        )?;
        for problem in &self.problems {
            write!(f, "\n  {problem}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ImportError {}

/// How one model tensor gets its value.
#[derive(Debug, Clone)]
enum Action {
    /// Read the source entry, apply the ops, cut for the placement, cast if `cast`.
    Read { cast: Option<DType> },
    /// The same tensor as the model tensor at this path.
    Tie(String),
    /// Given by a hook.
    Hook(usize),
    /// Optional and absent: keep the value.
    Keep,
    /// Found a problem; nothing will be done.
    Invalid,
}

/// The plan for one model tensor.
#[derive(Debug, Clone)]
struct Row {
    name: String,
    source: String,
    ops: Vec<Op>,
    optional: bool,
    required: Option<DType>,
    model_dtype: DType,
    model_shape: Vec<usize>,
    stored: Option<(DType, Vec<usize>)>,
    parallel_axis: Option<usize>,
    action: Action,
}

/// An import planned from headers: what each model tensor reads and how, without reading data.
#[derive(Debug, Clone)]
pub struct ImportPlan {
    origin: String,
    target: String,
    rows: Vec<Row>,
    problems: Vec<ImportProblem>,
    unused: Vec<String>,
}

fn shape_text(shape: &[usize]) -> String {
    format!("{shape:?}")
}

fn ops_text(ops: &[Op], rank: usize) -> String {
    let mut text = String::new();
    for op in ops {
        match op {
            Op::Split(split) => text.push_str(&format!(" split({}, {}/{})", split.axis, split.index + 1, split.parts)),
            Op::Transpose if rank >= 2 => text.push_str(" transpose"),
            Op::Transpose => {}
        }
    }
    text
}

/// Applies the ops to a stored shape: the shape the model tensor will have, or what is wrong.
fn apply_shape(ops: &[Op], shape: &[usize]) -> Result<Vec<usize>, String> {
    let mut shape = shape.to_vec();
    for op in ops {
        match op {
            Op::Split(split) => {
                let axis = resolve_axis(split.axis, shape.len()).ok_or_else(|| {
                    format!("split axis {} does not exist in a rank-{} entry", split.axis, shape.len())
                })?;
                if !shape[axis].is_multiple_of(split.parts) {
                    return Err(format!(
                        "axis {} of size {} does not divide into {} pieces",
                        split.axis, shape[axis], split.parts
                    ));
                }
                shape[axis] /= split.parts;
            }
            Op::Transpose => {
                let rank = shape.len();
                if rank >= 2 {
                    shape.swap(rank - 2, rank - 1);
                }
            }
        }
    }
    Ok(shape)
}

fn resolve_axis(axis: isize, rank: usize) -> Option<usize> {
    let resolved = if axis < 0 { rank as isize + axis } else { axis };
    (0..rank as isize).contains(&resolved).then_some(resolved as usize)
}

/// Applies the ops to a stored tensor as views: split is a narrow, transpose swaps the last
/// two axes. Nothing is copied.
fn apply_ops(ops: &[Op], mut tensor: Tensor) -> Result<Tensor> {
    for op in ops {
        match op {
            Op::Split(split) => {
                let axis = resolve_axis(split.axis, tensor.rank()).expect("checked by the plan");
                tensor = tensor.split(axis, split.parts)?.swap_remove(split.index);
            }
            Op::Transpose => tensor = swap_last_two(tensor),
        }
    }
    Ok(tensor)
}

/// The view with the last two axes swapped; tensors of rank below 2 are returned as they are.
fn swap_last_two(tensor: Tensor) -> Tensor {
    match tensor.rank() {
        rank if rank >= 2 => tensor.transpose(rank - 2, rank - 1).unwrap_or(tensor),
        _ => tensor,
    }
}

/// Undoes the transposes among `ops` (in reverse order), for export; splits are undone by
/// concatenation elsewhere.
fn undo_transposes(ops: &[Op], tensor: Tensor) -> Tensor {
    ops.iter().rev().fold(tensor, |tensor, op| match op {
        Op::Transpose => swap_last_two(tensor),
        Op::Split(_) => tensor,
    })
}

impl ImportPlan {
    /// Whether the import would succeed.
    pub fn is_valid(&self) -> bool {
        self.problems.is_empty()
    }

    /// Every problem found.
    pub fn problems(&self) -> &[ImportProblem] {
        &self.problems
    }

    /// Entries under the prefix that the model does not read.
    pub fn unused(&self) -> &[String] {
        &self.unused
    }

    fn error(&self) -> ImportError {
        ImportError { origin: self.origin.clone(), target: self.target.clone(), problems: self.problems.clone() }
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
            let (source, ops, dtype, shape, bytes) = match (&row.action, &row.stored) {
                (Action::Tie(target), _) => {
                    (format!("tie {target}"), String::new(), String::new(), String::new(), String::new())
                }
                (Action::Hook(_), _) => {
                    (format!("hook ({})", row.source), String::new(), String::new(), String::new(), String::new())
                }
                (Action::Keep, _) => (
                    format!("{} (absent, optional)", row.source),
                    String::new(),
                    String::new(),
                    String::new(),
                    String::new(),
                ),
                (_, Some((dtype, shape))) => {
                    // Bytes this tensor reads: its piece of the entry, before any cast.
                    let elements: usize = row.model_shape.iter().product();
                    let bytes = dtype.storage_bytes(elements as u64).unwrap_or(0);
                    let mut ops = ops_text(&row.ops, shape.len()).trim_start().to_string();
                    if let Some(axis) = row.parallel_axis {
                        ops.push_str(&format!("{}shard(axis {axis})", if ops.is_empty() { "" } else { " " }));
                    }
                    let dtype_text = if *dtype == row.model_dtype {
                        dtype.to_string()
                    } else {
                        format!("{dtype} -> {}", row.model_dtype)
                    };
                    (row.source.clone(), ops, dtype_text, shape_text(shape), bytes.to_string())
                }
                (_, None) => (row.source.clone(), String::new(), "?".into(), "?".into(), String::new()),
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

/// Finds the deepest numbered path prefix of `source` that no entry lies under, such as
/// `transformer.h.12` when the file has layers 0 to 11, and describes the layers it does have.
fn missing_subtree(archive: &Archive, source: &str) -> Option<(String, String)> {
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
        let have = match (indices.first(), indices.last()) {
            (Some(first), Some(last)) => format!("the file has {parent}.{first} .. {parent}.{last}"),
            _ => format!("the file has nothing under {parent}"),
        };
        return Some((prefix, have));
    }
    None
}

impl Archive {
    /// Plans importing `module` from the entries under `prefix`, reading headers only: what
    /// each tensor reads, the operations on the way, and every problem.
    ///
    /// # Errors
    /// Only the error of opening a shard; problems with the mapping are in the plan.
    pub fn import_plan<M: Module + ?Sized>(&self, module: &M, prefix: &str) -> Result<ImportPlan> {
        self.plan(module, prefix, &ImportOptions::default())
    }

    fn plan<M: Module + ?Sized>(&self, module: &M, prefix: &str, options: &ImportOptions) -> Result<ImportPlan> {
        let mut rows = Vec::new();
        for_each_entry(module, |entry, tensor| {
            rows.push(Row {
                name: entry.name.to_string(),
                source: join(prefix, entry.source),
                ops: entry.ops.to_vec(),
                optional: entry.optional,
                required: entry.dtype,
                model_dtype: tensor.dtype(),
                model_shape: tensor.shape().to_vec(),
                stored: None,
                parallel_axis: None,
                action: match entry.tie {
                    Some(target) => Action::Tie(target.to_string()),
                    None => Action::Read { cast: None },
                },
            });
        });
        let mut problems = Vec::new();
        let mut used: HashSet<String> = HashSet::new();
        let hooks: HashMap<&str, usize> =
            options.hooks.iter().enumerate().map(|(at, (name, _, _))| (name.as_str(), at)).collect();
        let model_index: HashMap<String, usize> =
            rows.iter().enumerate().map(|(at, row)| (row.name.clone(), at)).collect();
        let mut reported_subtrees: HashSet<String> = HashSet::new();

        for (at, hook) in options.hooks.iter().enumerate() {
            let (name, reads, _) = hook;
            match model_index.get(name) {
                Some(&row) => rows[row].action = Action::Hook(at),
                None => problems.push(ImportProblem {
                    name: name.clone(),
                    source: String::new(),
                    message: format!(
                        "a hook is given for `{name}`, which is not a tensor of the model{}",
                        suggest(name, rows.iter().map(|row| row.name.as_str()))
                            .map(|near| format!(" (did you mean `{near}`?)"))
                            .unwrap_or_default()
                    ),
                }),
            }
            for read in reads {
                let full = join(prefix, read);
                if self.spec(&full)?.is_none() {
                    problems.push(ImportProblem {
                        name: name.clone(),
                        source: full.clone(),
                        message: "the hook reads this entry, which the archive lacks".into(),
                    });
                }
                used.insert(full);
            }
        }

        for row in &mut rows {
            if hooks.contains_key(row.name.as_str()) {
                continue;
            }
            if let Action::Tie(_) = row.action {
                continue;
            }
            let Some((dtype, shape)) = self.spec(&row.source)? else {
                if row.optional {
                    row.action = Action::Keep;
                    continue;
                }
                row.action = Action::Invalid;
                if let Some((subtree, have)) = missing_subtree(self, &row.source) {
                    if reported_subtrees.insert(subtree.clone()) {
                        let model_prefix = model_prefix_for(&row.name, &row.source, &subtree);
                        problems.push(ImportProblem {
                            name: model_prefix,
                            source: subtree,
                            message: format!("no such entries ({have})"),
                        });
                    }
                    continue;
                }
                let near = suggest(&row.source, self.names())
                    .map(|near| format!(" (did you mean `{near}`?)"))
                    .unwrap_or_default();
                problems.push(ImportProblem {
                    name: row.name.clone(),
                    source: row.source.clone(),
                    message: format!("no such entry{near}"),
                });
                continue;
            };
            used.insert(row.source.clone());
            let described = format!("{} {}{}", row.source, shape_text(&shape), ops_text(&row.ops, shape.len()));
            row.stored = Some((dtype, shape.clone()));
            let problem =
                |message: String| ImportProblem { name: row.name.clone(), source: described.clone(), message };
            let strided =
                row.ops.iter().any(|op| matches!(op, Op::Split(_)) || (*op == Op::Transpose && shape.len() >= 2));
            let shaped = if strided && dtype.size_in_bytes().is_none() {
                Err(format!("{dtype} packs elements below a byte, so it cannot be split or transposed as a view"))
            } else {
                apply_shape(&row.ops, &shape)
            };
            let mut result = match shaped {
                Ok(result) => result,
                Err(message) => {
                    problems.push(problem(message));
                    row.action = Action::Invalid;
                    continue;
                }
            };
            if let Some(placement) = &options.placement
                && let Some(axis) = placement.axis(&row.name, result.len())
            {
                if placement.world_size == 0
                    || result[axis] % placement.world_size != 0
                    || placement.rank >= placement.world_size
                {
                    problems.push(problem(format!(
                        "axis {axis} of size {} does not cut into {} equal pieces for rank {}",
                        result[axis], placement.world_size, placement.rank
                    )));
                    row.action = Action::Invalid;
                    continue;
                }
                result[axis] /= placement.world_size;
                row.parallel_axis = Some(axis);
            }
            if let Some(required) = row.required
                && (dtype != required || row.model_dtype != required)
            {
                let found = if dtype != required { dtype } else { row.model_dtype };
                problems.push(problem(format!("the field requires {required}, found {found}")));
                row.action = Action::Invalid;
                continue;
            }
            let cast = if dtype == row.model_dtype {
                None
            } else if dtype.is_castable_float() && row.model_dtype.is_castable_float() && row.required.is_none() {
                Some(row.model_dtype)
            } else {
                problems
                    .push(problem(format!("expected dtype {}, found {dtype} (only floats are cast)", row.model_dtype)));
                row.action = Action::Invalid;
                continue;
            };
            if result != row.model_shape {
                problems.push(problem(format!(
                    "expected {}, found {}",
                    shape_text(&row.model_shape),
                    shape_text(&result)
                )));
                row.action = Action::Invalid;
                continue;
            }
            row.action = Action::Read { cast };
        }

        // Ties: the target must be a tensor of the model with the same dtype and shape.
        let snapshot: Vec<(String, DType, Vec<usize>)> =
            rows.iter().map(|row| (row.name.clone(), row.model_dtype, row.model_shape.clone())).collect();
        for row in &mut rows {
            let Action::Tie(target) = &row.action else { continue };
            match model_index.get(target) {
                None => {
                    let near = suggest(target, snapshot.iter().map(|(name, _, _)| name.as_str()))
                        .map(|near| format!(" (did you mean `{near}`?)"))
                        .unwrap_or_default();
                    problems.push(ImportProblem {
                        name: row.name.clone(),
                        source: format!("tie {target}"),
                        message: format!("`{target}` is not a tensor of the model{near}"),
                    });
                    row.action = Action::Invalid;
                }
                Some(&other) => {
                    let (_, dtype, shape) = &snapshot[other];
                    if *dtype != row.model_dtype || *shape != row.model_shape {
                        problems.push(ImportProblem {
                            name: row.name.clone(),
                            source: format!("tie {target}"),
                            message: format!(
                                "expected {} {}, found {dtype} {}",
                                row.model_dtype,
                                shape_text(&row.model_shape),
                                shape_text(shape)
                            ),
                        });
                        row.action = Action::Invalid;
                    }
                }
            }
        }

        let unused: Vec<String> = self
            .names()
            .filter(|name| under_prefix(name, prefix).is_some() && !used.contains(*name))
            .map(str::to_string)
            .collect();
        if options.strict_coverage {
            for name in &unused {
                problems.push(ImportProblem {
                    name: name.clone(),
                    source: String::new(),
                    message: "entry is not read by the model (strict coverage)".into(),
                });
            }
        }
        // Problems in walk order: they were pushed in that order already, hooks first.
        Ok(ImportPlan {
            origin: self.origin().to_string(),
            target: module.module_name().to_string(),
            rows,
            problems,
            unused,
        })
    }

    /// Imports `module` from the entries under `prefix`, following the import attributes; see
    /// [`Archive::import_into_with`].
    ///
    /// # Errors
    /// As [`Archive::import_into_with`].
    pub fn import_into<M: Module + ?Sized>(&self, module: &mut M, prefix: &str) -> Result<ImportReport> {
        self.import_into_with(module, prefix, &ImportOptions::default())
    }

    /// Imports `module` from the entries under `prefix` (`""` for all): each tensor reads its
    /// source entry (`from`, relative to the parent's source), takes its piece (`split`), swaps
    /// its last two axes (`transpose`), is another tensor (`tie`, read once) or may be absent
    /// (`optional`). A float entry of another float dtype than the model's is cast; otherwise the
    /// tensor is a view of the mapped file, so importing into a meta model allocates nothing.
    ///
    /// The whole mapping is checked from headers before any byte is read; on failure the model
    /// is unchanged and the error lists every problem with the op chain and shapes.
    ///
    /// # Errors
    /// [`Error::Import`] with every problem; a hook's own error; the error of opening a shard.
    pub fn import_into_with<M: Module + ?Sized>(
        &self,
        module: &mut M,
        prefix: &str,
        options: &ImportOptions,
    ) -> Result<ImportReport> {
        let mut plan = self.plan(module, prefix, options)?;
        if !plan.is_valid() {
            return Err(Error::Import(plan.error()));
        }
        // Hooks run after the headers check out; their results are checked like the rest.
        let mut hooked: HashMap<usize, Tensor> = HashMap::new();
        for row in &plan.rows {
            if let Action::Hook(at) = row.action {
                let (_, _, hook) = &options.hooks[at];
                let context = HookContext {
                    name: &row.name,
                    source: &row.source,
                    dtype: row.model_dtype,
                    shape: &row.model_shape,
                    prefix,
                };
                let tensor = hook(self, &context)?;
                if tensor.dtype() != row.model_dtype || tensor.shape() != row.model_shape {
                    plan.problems.push(ImportProblem {
                        name: row.name.clone(),
                        source: format!("hook ({})", row.source),
                        message: format!(
                            "expected {} {}, found {} {}",
                            row.model_dtype,
                            shape_text(&row.model_shape),
                            tensor.dtype(),
                            shape_text(tensor.shape())
                        ),
                    });
                }
                hooked.insert(at, tensor);
            }
        }
        if !plan.is_valid() {
            return Err(Error::Import(plan.error()));
        }
        let mut report = ImportReport { unused: plan.unused.clone(), ..ImportReport::default() };
        let mut values: Vec<Option<Tensor>> = Vec::with_capacity(plan.rows.len());
        for row in &plan.rows {
            values.push(match &row.action {
                Action::Read { cast } => {
                    let mut tensor = apply_ops(&row.ops, self.try_get(&row.source)?)?;
                    if let (Some(axis), Some(placement)) = (row.parallel_axis, &options.placement) {
                        tensor = tensor.split(axis, placement.world_size)?.swap_remove(placement.rank);
                    }
                    if let Some(dtype) = cast {
                        tensor = tensor.to_dtype(*dtype)?;
                        report.cast.push(row.name.clone());
                    }
                    report.imported.push(row.name.clone());
                    Some(tensor)
                }
                Action::Hook(at) => {
                    report.imported.push(row.name.clone());
                    hooked.remove(at)
                }
                Action::Keep => {
                    report.absent.push(row.name.clone());
                    None
                }
                Action::Tie(_) => {
                    report.tied.push(row.name.clone());
                    None
                }
                Action::Invalid => unreachable!("a valid plan has no invalid rows"),
            });
        }
        // What each tensor becomes: its new value, or the one it has (kept, or a tie resolved
        // below). Tied tensors then share the final tensor of their target, following chains
        // of ties; a cycle of ties keeps the values the model has.
        let mut resolved: Vec<Tensor> = Vec::with_capacity(values.len());
        let mut values = values.into_iter();
        for_each_entry(module, |_, tensor| resolved.push(values.next().flatten().unwrap_or_else(|| tensor.clone())));
        let index: HashMap<&str, usize> =
            plan.rows.iter().enumerate().map(|(at, row)| (row.name.as_str(), at)).collect();
        for at in 0..plan.rows.len() {
            let mut target = at;
            for _ in 0..plan.rows.len() {
                match &plan.rows[target].action {
                    Action::Tie(name) => target = index[name.as_str()],
                    _ => break,
                }
            }
            resolved[at] = resolved[target].clone();
        }
        let mut resolved = resolved.into_iter();
        for_each_entry_mut(module, |_, tensor| {
            if let Some(value) = resolved.next() {
                *tensor = value;
            }
        });
        Ok(report)
    }

    /// The inverse of [`Archive::import_into`]: the module's tensors written back in the source
    /// layout under `prefix`: split pieces concatenated, transposes undone, tied tensors left out
    /// (their target is written once under its own source name).
    ///
    /// # Errors
    /// [`Error::Export`] when split pieces are missing or a tensor is meta.
    pub fn export_from<M: Module + ?Sized>(module: &M, prefix: &str) -> Result<Archive> {
        struct Group {
            axis: isize,
            parts: usize,
            pieces: Vec<Option<Tensor>>,
            before: Vec<Op>,
            names: Vec<String>,
        }
        let mut order: Vec<String> = Vec::new();
        let mut whole: HashMap<String, Tensor> = HashMap::new();
        let mut groups: HashMap<String, Group> = HashMap::new();
        let mut problems: Vec<String> = Vec::new();
        for_each_entry(module, |entry, tensor| {
            if entry.tie.is_some() {
                return;
            }
            let source = join(prefix, entry.source);
            let splits = entry.ops.iter().filter(|op| matches!(op, Op::Split(_))).count();
            if splits > 1 {
                problems.push(format!(
                    "`{}` is split more than once on its way from `{source}`; export cannot rebuild it",
                    entry.name
                ));
                return;
            }
            // Undo the ops after the split (transposes) on this piece.
            let position = entry.ops.iter().position(|op| matches!(op, Op::Split(_)));
            let (before, after) = entry.ops.split_at(position.unwrap_or(0));
            let (before, after) = if position.is_some() { (before, &after[1..]) } else { (entry.ops, &[][..]) };
            match position.map(|at| entry.ops[at]) {
                None => {
                    if !whole.contains_key(&source) {
                        order.push(source.clone());
                    }
                    whole.insert(source, undo_transposes(before, tensor.clone()));
                }
                Some(Op::Split(split)) => {
                    let piece = undo_transposes(after, tensor.clone());
                    let group = groups.entry(source.clone()).or_insert_with(|| {
                        order.push(source.clone());
                        Group {
                            axis: split.axis,
                            parts: split.parts,
                            pieces: vec![None; split.parts],
                            before: before.to_vec(),
                            names: Vec::new(),
                        }
                    });
                    if group.parts != split.parts || group.axis != split.axis || split.index >= group.parts {
                        problems.push(format!("`{}` splits `{source}` differently from its siblings", entry.name));
                        return;
                    }
                    group.pieces[split.index] = Some(piece);
                    group.names.push(entry.name.to_string());
                }
                Some(Op::Transpose) => unreachable!("position points at a split"),
            }
        });
        let mut archive = Archive::new();
        for source in order {
            let tensor = if let Some(tensor) = whole.remove(&source) {
                tensor
            } else if let Some(group) = groups.remove(&source) {
                let missing: Vec<String> = group
                    .pieces
                    .iter()
                    .enumerate()
                    .filter(|(_, piece)| piece.is_none())
                    .map(|(at, _)| format!("{}/{}", at + 1, group.parts))
                    .collect();
                if !missing.is_empty() {
                    problems.push(format!(
                        "`{source}` lacks pieces {} (the model has {})",
                        missing.join(", "),
                        group.names.join(", ")
                    ));
                    continue;
                }
                let pieces: Vec<Tensor> = group.pieces.into_iter().flatten().collect();
                let axis = resolve_axis(group.axis, pieces[0].rank()).unwrap_or(0);
                let joined = Tensor::concat(&pieces, axis)?;
                undo_transposes(&group.before, joined)
            } else {
                continue;
            };
            if tensor.is_meta() {
                problems.push(format!(
                    "`{source}` would be written from a meta tensor (no data): import or load weights first"
                ));
                continue;
            }
            archive.insert(source, tensor);
        }
        if !problems.is_empty() {
            return Err(Error::Export { target: module.module_name().to_string(), problems });
        }
        Ok(archive)
    }
}

/// The model path prefix that corresponds to the missing source `subtree` of one tensor: the
/// model name with as many trailing segments removed as the source has below the subtree.
fn model_prefix_for(name: &str, source: &str, subtree: &str) -> String {
    let below = source.split('.').count() - subtree.split('.').count();
    let segments: Vec<&str> = name.split('.').collect();
    segments[..segments.len().saturating_sub(below).max(1)].join(".")
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

    #[test]
    fn model_prefixes_follow_the_source() {
        assert_eq!(
            model_prefix_for("h.12.attn.q.weight", "transformer.h.12.attn.c_attn.weight", "transformer.h.12"),
            "h.12"
        );
    }
}
