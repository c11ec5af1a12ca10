//! Carrying out a valid import plan: hooks run, entries are read as views (split, transposed,
//! cut for a rank, cast when asked), ties resolved, and the model's tensors replaced at once.

use std::collections::HashMap;
use std::sync::Arc;

use nnx_core::__private::{for_each_entry_on, for_each_entry_on_mut};
use nnx_core::{Device, HookError, ImportOp, ModuleOn, Problem, ProblemKind, ProblemSource, Tensor};

use super::plan::{Action, resolve_axis};
use super::{HookContext, ImportOptions, ImportReport};
use crate::archive::Archive;
use crate::error::{Error, Result};

/// Applies the ops to a stored tensor as views: split is a narrow, transpose swaps the last
/// two axes. Nothing is copied.
fn apply_ops(ops: &[ImportOp], mut tensor: Tensor) -> Result<Tensor> {
    for op in ops {
        match op {
            ImportOp::Split(split) => {
                let axis = resolve_axis(split.axis, tensor.rank()).expect("checked by the plan");
                tensor = tensor.split(axis, split.parts)?.swap_remove(split.index);
            }
            ImportOp::Transpose => tensor = swap_last_two(tensor),
        }
    }
    Ok(tensor)
}

/// The view with the last two axes swapped; tensors of rank below 2 are returned as they are.
pub(super) fn swap_last_two(tensor: Tensor) -> Tensor {
    match tensor.rank() {
        rank if rank >= 2 => tensor.transpose(rank - 2, rank - 1).unwrap_or(tensor),
        _ => tensor,
    }
}

impl Archive {
    /// Imports `module` from the entries under `prefix`, following the import attributes; see
    /// [`Archive::import_into_with`].
    ///
    /// # Errors
    /// As [`Archive::import_into_with`].
    pub fn import_into<D: Device, M: ModuleOn<D> + ?Sized>(
        &self,
        module: &mut M,
        prefix: &str,
    ) -> Result<ImportReport> {
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
    /// A model on a device (a meta model [placed](nnx_core::Place) there) is imported straight
    /// onto it: each tensor is built on the host (a view of the file, transposed or cast when
    /// asked), moved to the device and its host copy dropped before the next, so the host holds
    /// at most one tensor's cast at a time.
    ///
    /// # Errors
    /// [`Error::Load`] with every problem (a hook's own error among them, as
    /// [`ProblemKind::HookFailed`]); the error of opening a shard.
    pub fn import_into_with<D: Device, M: ModuleOn<D> + ?Sized>(
        &self,
        module: &mut M,
        prefix: &str,
        options: &ImportOptions,
    ) -> Result<ImportReport> {
        let mut plan = self.plan_on(module, prefix, options)?;
        let mut devices: Vec<D> = Vec::with_capacity(plan.rows.len());
        for_each_entry_on(module, |_, tensor| devices.push(tensor.device().clone()));
        if !plan.is_valid() {
            return Err(Error::Load(plan.error()));
        }
        // Hooks run after the headers check out; their results are checked like the rest.
        let mut hooked: HashMap<usize, Tensor> = HashMap::new();
        for row in &plan.rows {
            let Action::Hook(at) = row.action else { continue };
            let context = HookContext {
                name: &row.name,
                source: &row.source,
                dtype: row.model_dtype,
                shape: &row.model_shape,
                prefix,
            };
            let problem =
                |kind| Problem::new(&row.name, kind).with_source(ProblemSource::Hook { source: row.source.clone() });
            match (options.hooks[at].function)(self, &context) {
                Err(error) => {
                    plan.problems.push(problem(ProblemKind::HookFailed { error: HookError(Arc::new(error)) }))
                }
                Ok(tensor) if tensor.dtype() != row.model_dtype || tensor.shape() != row.model_shape => {
                    plan.problems.push(problem(ProblemKind::HookMismatch {
                        expected_dtype: row.model_dtype,
                        expected_shape: row.model_shape.clone(),
                        found_dtype: tensor.dtype(),
                        found_shape: tensor.shape().to_vec(),
                    }))
                }
                Ok(tensor) => {
                    hooked.insert(at, tensor);
                }
            }
        }
        if !plan.is_valid() {
            return Err(Error::Load(plan.error()));
        }
        let mut report = ImportReport { unused: plan.unused.clone(), ..ImportReport::default() };
        let mut values: Vec<Option<Tensor<D>>> = Vec::with_capacity(plan.rows.len());
        for (row, device) in plan.rows.iter().zip(&devices) {
            values.push(match &row.action {
                Action::Read { cast, parallel_axis } => {
                    let mut tensor = apply_ops(&row.ops, self.try_get(&row.source)?)?;
                    if let (Some(axis), Some(placement)) = (parallel_axis, &options.placement) {
                        tensor = tensor.split(*axis, placement.world_size)?.swap_remove(placement.rank);
                    }
                    if let Some(dtype) = cast {
                        tensor = tensor.to_dtype(*dtype)?;
                        report.cast.push(row.name.clone());
                    }
                    report.imported.push(row.name.clone());
                    // On the host this shares the tensor; elsewhere it moves it, and the host
                    // copy is dropped here, before the next tensor is built.
                    Some(report.place(device, &row.name, &tensor)?)
                }
                Action::Hook(at) => {
                    report.imported.push(row.name.clone());
                    match hooked.remove(at) {
                        Some(tensor) => Some(report.place(device, &row.name, &tensor)?),
                        None => None,
                    }
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
        let mut resolved: Vec<Tensor<D>> = Vec::with_capacity(values.len());
        let mut values = values.into_iter();
        for_each_entry_on(module, |_, tensor| resolved.push(values.next().flatten().unwrap_or_else(|| tensor.clone())));
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
        for_each_entry_on_mut(module, |_, tensor| {
            if let Some(value) = resolved.next() {
                *tensor = value;
            }
        });
        Ok(report)
    }
}
