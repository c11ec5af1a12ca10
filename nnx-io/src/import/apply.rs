//! Carrying out a valid import plan: hooks run, entries are read as views (split, transposed,
//! cut for a rank, cast when asked), ties resolved, and the model's tensors replaced at once.

use std::collections::HashMap;
use std::sync::Arc;

use nnx_core::{
    DType, Device, HookError, ImportOp, Module, Problem, ProblemKind, ProblemSource, Tensor, for_each_entry,
    for_each_entry_mut,
};

use super::plan::{Action, resolve_axis};
use super::{HookContext, ImportOptions, ImportReport};
use crate::archive::Archive;
use crate::error::{Error, Result};

/// The part of a stored entry of `shape` that a model tensor reads: one `(start, len)` per
/// stored axis, and whether the last two axes are then swapped. Splits (`split`, and a rank's
/// cut along `parallel`) narrow an axis; a transpose swaps which stored axis the last two view
/// axes are. Reading the box and swapping gives the same tensor as narrowing views of the whole
/// entry, and lets a remote entry fetch only the box's bytes.
fn entry_box(
    shape: &[usize],
    ops: &[ImportOp],
    parallel: Option<(usize, usize, usize)>,
) -> (Vec<(usize, usize)>, bool) {
    let rank = shape.len();
    let mut boxed: Vec<(usize, usize)> = shape.iter().map(|&size| (0, size)).collect();
    // The stored axis behind each view axis.
    let mut axes: Vec<usize> = (0..rank).collect();
    let cut = |boxed: &mut Vec<(usize, usize)>, stored: usize, parts: usize, index: usize| {
        let piece = boxed[stored].1 / parts.max(1);
        boxed[stored] = (boxed[stored].0 + index * piece, piece);
    };
    for op in ops {
        match op {
            ImportOp::Split(split) => {
                let axis = resolve_axis(split.axis, rank).expect("checked by the plan");
                cut(&mut boxed, axes[axis], split.parts, split.index);
            }
            ImportOp::Transpose if rank >= 2 => axes.swap(rank - 2, rank - 1),
            ImportOp::Transpose | ImportOp::RopePermute(_) | ImportOp::Offset(_) => {}
        }
    }
    if let Some((axis, world, at)) = parallel {
        cut(&mut boxed, axes[axis], world, at);
    }
    let swapped = rank >= 2 && axes[rank - 1] != rank - 1;
    (boxed, swapped)
}

/// `tensor` with its rows back in the order the model reads: llama.cpp's converter stores each
/// of `heads` groups of rotary rows as `[half, 2]` pairs, the model as `[2, half]`. Rows are
/// moved whole, so packed rows of ggml blocks move as well as rows of floats.
pub(super) fn unpermute_rope_rows(tensor: &Tensor, heads: usize) -> Result<Tensor> {
    reorder_rope_rows(tensor, heads, false)
}

/// `tensor`'s rows moved between the two rotary orders: into the model's `[2, half]` groups
/// (`to_stored` false), or into llama.cpp's stored `[half, 2]` pairs (`to_stored` true, what
/// its converter does to a transformers weight).
pub(crate) fn reorder_rope_rows(tensor: &Tensor, heads: usize, to_stored: bool) -> Result<Tensor> {
    let rows = tensor.shape().first().copied().unwrap_or(0);
    let half = rows / (2 * heads).max(1);
    let bytes = tensor.contiguous().to_bytes()?.into_owned();
    let row_bytes = bytes.len() / rows.max(1);
    let mut out = vec![0u8; bytes.len()];
    for group in 0..heads {
        for pair in 0..2 {
            for i in 0..half {
                let model = (group * 2 * half + pair * half + i) * row_bytes;
                let stored = (group * 2 * half + i * 2 + pair) * row_bytes;
                let (to, from) = if to_stored { (stored, model) } else { (model, stored) };
                out[to..to + row_bytes].copy_from_slice(&bytes[from..from + row_bytes]);
            }
        }
    }
    Tensor::from_bytes(tensor.dtype(), tensor.shape(), &out)
}

/// `tensor` plus `value` everywhere, computed in f32 and given back in the tensor's dtype.
pub(super) fn add_constant(tensor: &Tensor, value: f32) -> Result<Tensor> {
    let values: Vec<f32> = tensor.to_dtype(DType::F32)?.to_vec::<f32>()?.into_iter().map(|x| x + value).collect();
    Tensor::from_vec(values, tensor.shape())?.to_dtype(tensor.dtype())
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
    pub fn import_into<D: Device, M: Module<D> + ?Sized>(&self, module: &mut M, prefix: &str) -> Result<ImportReport> {
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
    pub fn import_into_with<D: Device, M: Module<D> + ?Sized>(
        &self,
        module: &mut M,
        prefix: &str,
        options: &ImportOptions,
    ) -> Result<ImportReport> {
        let mut plan = self.plan(module, prefix, options)?;
        let mut devices: Vec<D> = Vec::with_capacity(plan.rows.len());
        for_each_entry(module, |_, tensor| devices.push(tensor.device().clone()));
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
        // Every entry read, at once: for a remote archive, one batch of range requests that
        // fetches only the parts the model (or this rank) uses.
        let mut swaps = Vec::new();
        let mut wants = Vec::new();
        for row in &plan.rows {
            let Action::Read { parallel_axis, .. } = &row.action else { continue };
            if row.packed.is_some() {
                continue;
            }
            let (_, shape) = self.spec(&row.source)?.ok_or_else(|| self.no_entry_error(&row.source))?;
            let parallel = match (parallel_axis, &options.placement) {
                (Some(axis), Some(placement)) => Some((*axis, placement.world_size, placement.rank)),
                _ => None,
            };
            let (boxed, swapped) = entry_box(&shape, &row.ops, parallel);
            wants.push((row.source.as_str(), Some(boxed)));
            swaps.push(swapped);
        }
        let mut read = self.read_batch(&wants)?.into_iter().zip(swaps);
        let mut values: Vec<Option<Tensor<D>>> = Vec::with_capacity(plan.rows.len());
        for (row, device) in plan.rows.iter().zip(&devices) {
            values.push(match &row.action {
                Action::Read { cast, .. } => {
                    let mut tensor = if row.packed.is_some() {
                        self.ggml(&row.source)?.data.reshape(&row.model_shape)?
                    } else {
                        let (tensor, swapped) = read.next().expect("one read per reading row");
                        let tensor = if swapped { swap_last_two(tensor) } else { tensor };
                        // The plan allows a stored shape that differs by axes of length one.
                        if tensor.shape() == row.model_shape.as_slice() {
                            tensor
                        } else {
                            tensor.reshape(&row.model_shape)?
                        }
                    };
                    if let Some(heads) = row.heads.filter(|_| !options.stored_rope_rows) {
                        tensor = unpermute_rope_rows(&tensor, heads)?;
                    }
                    if let Some(dtype) = cast {
                        tensor = tensor.to_dtype(*dtype)?;
                        report.cast.push(row.name.clone());
                    }
                    for op in &row.ops {
                        if let ImportOp::Offset(value) = op {
                            tensor = add_constant(&tensor, *value)?;
                        }
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
}
