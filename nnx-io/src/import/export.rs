//! Export, the inverse of import: a model's tensors written back in their source layout.

use std::collections::HashMap;

use nnx_core::__private::{for_each_entry, join};
use nnx_core::{ImportOp, Module, Tensor};

use super::apply::{add_constant, swap_last_two};
use super::plan::resolve_axis;
use crate::archive::Archive;
use crate::error::{Error, ExportProblem, Result};

/// Undoes the transposes and offsets among `ops` (in reverse order), for export; splits are
/// undone by concatenation elsewhere, and the rotary permutation belongs to GGUF names, which
/// export does not write.
fn undo_transposes(ops: &[ImportOp], tensor: Tensor) -> Result<Tensor> {
    ops.iter().rev().try_fold(tensor, |tensor, op| match op {
        ImportOp::Transpose => Ok(swap_last_two(tensor)),
        ImportOp::Offset(value) if !tensor.is_meta() => add_constant(&tensor, -value),
        ImportOp::Split(_) | ImportOp::RopePermute(_) | ImportOp::Offset(_) => Ok(tensor),
    })
}

impl Archive {
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
            before: Vec<ImportOp>,
            names: Vec<String>,
        }
        let mut order: Vec<String> = Vec::new();
        let mut whole: HashMap<String, Tensor> = HashMap::new();
        let mut groups: HashMap<String, Group> = HashMap::new();
        let mut problems: Vec<ExportProblem> = Vec::new();
        let mut failed: Option<Error> = None;
        for_each_entry(module, |slot, tensor| {
            if slot.tie.is_some() {
                return;
            }
            let source = join(prefix, slot.source);
            let splits = slot.ops.iter().filter(|op| matches!(op, ImportOp::Split(_))).count();
            if splits > 1 {
                problems.push(ExportProblem::SplitTwice { name: slot.name.to_string(), source });
                return;
            }
            // Undo the ops after the split (transposes) on this piece.
            let position = slot.ops.iter().position(|op| matches!(op, ImportOp::Split(_)));
            let (before, after) = slot.ops.split_at(position.unwrap_or(0));
            let (before, after) = if position.is_some() { (before, &after[1..]) } else { (slot.ops, &[][..]) };
            match position.map(|at| slot.ops[at]) {
                None => {
                    if !whole.contains_key(&source) {
                        order.push(source.clone());
                    }
                    match undo_transposes(before, tensor.clone()) {
                        Ok(tensor) => {
                            whole.insert(source, tensor);
                        }
                        Err(error) => failed = failed.take().or(Some(error)),
                    }
                }
                Some(ImportOp::Split(split)) => {
                    let piece = match undo_transposes(after, tensor.clone()) {
                        Ok(piece) => piece,
                        Err(error) => {
                            failed = failed.take().or(Some(error));
                            return;
                        }
                    };
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
                        problems.push(ExportProblem::SplitDiffers { name: slot.name.to_string(), source });
                        return;
                    }
                    group.pieces[split.index] = Some(piece);
                    group.names.push(slot.name.to_string());
                }
                Some(_) => unreachable!("position points at a split"),
            }
        });
        if let Some(error) = failed {
            return Err(error);
        }
        let mut archive = Archive::new();
        for source in order {
            let tensor = if let Some(tensor) = whole.remove(&source) {
                tensor
            } else if let Some(group) = groups.remove(&source) {
                let missing: Vec<usize> =
                    group.pieces.iter().enumerate().filter(|(_, piece)| piece.is_none()).map(|(at, _)| at).collect();
                if !missing.is_empty() {
                    problems.push(ExportProblem::MissingPieces {
                        source,
                        missing,
                        parts: group.parts,
                        present: group.names,
                    });
                    continue;
                }
                let pieces: Vec<Tensor> = group.pieces.into_iter().flatten().collect();
                let axis = resolve_axis(group.axis, pieces[0].rank()).unwrap_or(0);
                let joined = Tensor::concat(&pieces, axis)?;
                undo_transposes(&group.before, joined)?
            } else {
                continue;
            };
            if tensor.is_meta() {
                problems.push(ExportProblem::Meta { source });
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
