//! An adapter checked against a module: its factors turned to the module's layout, and every
//! module and saved tensor matched through the module's import mapping to the model tensors it
//! changes, with their shapes, before anything is computed.

use std::collections::{BTreeMap, HashMap};

use nnx_core::{DType, ImportOp, Module, Tensor, for_each_entry_named};

use super::merge::scaled;
use super::report::{AdapterProblem, AdapterReport, module_problem, no_target};
use super::{Adapter, AdapterFormat, LoraKind};

impl Adapter {
    /// This adapter in the layout `model` reads its weights from. MLX-LM's factors are in the
    /// model's own `[out, in]` layout whatever the checkpoint stores (mlx-lm turns GPT-2's
    /// `Conv1D` weights, stored `[in, out]`, when it loads them), so every module whose source
    /// weight the model's import mapping transposes gets `fan_in_fan_out`, as PEFT records it
    /// for the same weights. mlx-lm names every module under `model.` (GPT-2's `h.0.attn.c_attn`
    /// is `model.h.0.attn.c_attn`), while a transformers checkpoint may keep another root
    /// (`transformer.h.0.attn.c_attn`): a module whose weight the model does not read under its
    /// own name takes the one source that ends with its name after `model.`. PEFT and GGUF
    /// adapters are in their files' layout already and come back as they are. [`Adapter::check`], [`Adapter::merge_into`] and
    /// [`Adapter::attachments`] apply this themselves; [`Adapter::merge_archive`], which sees
    /// no model, needs it applied first.
    pub fn in_model_layout<M: Module + ?Sized>(&self, model: &M) -> Adapter {
        let mut adapter = self.clone();
        if self.format != AdapterFormat::Mlx {
            return adapter;
        }
        let mut transposed: HashMap<String, bool> = HashMap::new();
        for_each_entry_named(model, self.format.naming(), |slot, _| {
            if slot.tie.is_none() {
                let turns = slot.ops.iter().filter(|op| matches!(op, ImportOp::Transpose)).count();
                transposed.insert(slot.source.to_string(), turns % 2 == 1);
            }
        });
        for module in &mut adapter.modules {
            let mut source = format!("{}.weight", module.source);
            if !transposed.contains_key(&source)
                && let Some(rest) = module.source.strip_prefix("model.")
            {
                let (whole, suffix) = (format!("{rest}.weight"), format!(".{rest}.weight"));
                let mut found = transposed.keys().filter(|key| **key == whole || key.ends_with(&suffix));
                if let (Some(only), None) = (found.next(), found.next()) {
                    source = only.clone();
                    module.source = only.trim_end_matches(".weight").to_string();
                }
            }
            module.fan_in_fan_out = module.kind == LoraKind::Projection && transposed.get(&source) == Some(&true);
        }
        adapter
    }

    /// Checks that every module and saved tensor of the adapter has its target in `model`
    /// (through the model's import mapping for the adapter's naming) with the right shape,
    /// and lists what it finds. Changes nothing.
    pub fn check<M: Module + ?Sized>(&self, model: &M) -> AdapterReport {
        self.in_model_layout(model).plan(model, false).0
    }

    /// [`Adapter::check`], rotary rows taken as stored when `stored_rope_rows`.
    pub(super) fn check_with<M: Module + ?Sized>(&self, model: &M, stored_rope_rows: bool) -> AdapterReport {
        let mut report = self.plan(model, true).0;
        if stored_rope_rows {
            report.problems.retain(|problem| !matches!(problem, AdapterProblem::Unusable { reason, .. } if reason.contains("rotary order")));
        }
        report.problems.retain(
            |problem| !matches!(problem, AdapterProblem::Unusable { reason, .. } if reason.contains("trained a bias")),
        );
        report
    }

    /// The report and, for every model tensor the adapter changes, how.
    /// `attach`: for run time, where a weight packed in ggml blocks (U8 rows) takes the
    /// factors beside it (its rows checked); a merge needs float weights.
    pub(super) fn plan<M: Module + ?Sized>(
        &self,
        model: &M,
        attach: bool,
    ) -> (AdapterReport, BTreeMap<String, Vec<Change>>) {
        // Each source name with the model tensors read from it, their operations and shapes.
        let mut by_source: HashMap<String, Vec<Target>> = HashMap::new();
        let mut sources = Vec::new();
        for_each_entry_named(model, self.format.naming(), |slot, tensor| {
            if slot.tie.is_some() {
                return;
            }
            sources.push(slot.source.to_string());
            by_source.entry(slot.source.to_string()).or_default().push(Target {
                name: slot.name.to_string(),
                ops: slot.ops.to_vec(),
                shape: tensor.shape().to_vec(),
                packed: tensor.dtype() == DType::U8,
            });
        });
        let mut report = AdapterReport::default();
        let mut changes: BTreeMap<String, Vec<Change>> = BTreeMap::new();
        let unexpected = |report: &mut AdapterReport, name: &str| {
            let problem = no_target(&report.problems, name, sources.iter().map(String::as_str));
            report.problems.push(problem);
        };
        for (index, module) in self.modules.iter().enumerate() {
            let weight = format!("{}.weight", module.source);
            let Some(targets) = by_source.get(&weight) else {
                unexpected(&mut report, &weight);
                continue;
            };
            if let Some(problem) = module_problem(module) {
                report.problems.push(problem);
                continue;
            }
            // The shapes are checked on a meta delta; a merge computes it when it applies it.
            let delta = Tensor::meta(DType::F32, &module.delta_shape());
            if module.magnitude.is_some() && (targets.len() != 1 || !targets[0].ops.is_empty()) {
                let reason = "DoRA normalises whole rows of the stored weight, which this model splits or reorders";
                report.problems.push(AdapterProblem::Unusable { module: weight, reason: reason.to_string() });
                continue;
            }
            let mut deltas = vec![(weight, delta, module.magnitude.clone(), Some(index))];
            if let Some(bias) = &module.bias {
                match scaled(bias, module.scale) {
                    Ok(delta) => deltas.push((format!("{}.bias", module.source), delta, None, None)),
                    Err(error) => {
                        let module = format!("{}.bias", module.source);
                        report.problems.push(AdapterProblem::Unusable { module, reason: error.to_string() });
                    }
                }
            }
            for (source, delta, magnitude, lazy) in deltas {
                let Some(targets) = by_source.get(&source) else {
                    if source.ends_with(".bias") {
                        let reason = "the adapter trained a bias (`lora_bias`) for a layer that has none in this model: merge into the files with `Adapter::merge_archive` (`nnx lora merge`), which adds it, and load them into a model whose layer has a bias";
                        report.problems.push(AdapterProblem::Unusable { module: source, reason: reason.into() });
                    } else {
                        unexpected(&mut report, &source);
                    }
                    continue;
                };
                for target in targets {
                    let fits = |piece: &Tensor| match target.packed {
                        true => attach && piece.shape().first() == target.shape.first(),
                        false => piece.shape() == target.shape.as_slice(),
                    };
                    match through_ops(&delta, &target.ops) {
                        Ok(_) if target.packed && !attach => {
                            let reason = "the weight is stored in ggml blocks: merge into the file (`merge_gguf`, `nnx lora merge`) or apply the adapter at run time";
                            report
                                .problems
                                .push(AdapterProblem::Unusable { module: source.clone(), reason: reason.into() });
                        }
                        Ok(piece) if fits(&piece) => {
                            report.matched.push(target.name.clone());
                            let magnitude = magnitude.clone();
                            let change = match lazy {
                                Some(module) => Change::Module { module, ops: target.ops.clone(), magnitude },
                                None => Change::Add { delta: piece, magnitude },
                            };
                            changes.entry(target.name.clone()).or_default().push(change);
                        }
                        Ok(piece) => report.problems.push(AdapterProblem::Shape {
                            module: source.clone(),
                            target: target.name.clone(),
                            expected: target.shape.clone(),
                            found: piece.shape().to_vec(),
                        }),
                        Err(reason) => {
                            report.problems.push(AdapterProblem::Unusable { module: source.clone(), reason });
                        }
                    }
                }
            }
        }
        for (name, tensor) in &self.saved {
            match by_source.get(name).map(Vec::as_slice) {
                Some([target]) if target.ops.is_empty() && target.shape == tensor.shape() => {
                    report.replaced.push(target.name.clone());
                    changes.entry(target.name.clone()).or_default().insert(0, Change::Replace(tensor.clone()));
                }
                Some([target]) => report.problems.push(AdapterProblem::Shape {
                    module: name.clone(),
                    target: target.name.clone(),
                    expected: target.shape.clone(),
                    found: tensor.shape().to_vec(),
                }),
                _ => unexpected(&mut report, name),
            }
        }
        (report, changes)
    }
}

/// A model tensor read from a source entry, as the walk reports it.
struct Target {
    name: String,
    ops: Vec<ImportOp>,
    shape: Vec<usize>,
    /// Rows of ggml blocks (U8): only the row count is the delta's.
    packed: bool,
}

/// How a merge changes one model tensor.
pub(super) enum Change {
    /// `W + delta`, then DoRA's row scaling when there is a magnitude.
    Add { delta: Tensor, magnitude: Option<Tensor> },
    /// As `Add`, with module `module`'s delta read through `ops`, computed when applied.
    Module { module: usize, ops: Vec<ImportOp>, magnitude: Option<Tensor> },
    /// A whole new value (a saved module).
    Replace(Tensor),
}

/// `delta` as the model reads its source entry: split pieces narrowed, transposes applied; or
/// why it cannot be.
pub(super) fn through_ops(delta: &Tensor, ops: &[ImportOp]) -> std::result::Result<Tensor, String> {
    let mut tensor = delta.clone();
    for op in ops {
        tensor = match op {
            ImportOp::Split(split) => {
                let rank = tensor.rank() as isize;
                let axis = usize::try_from(if split.axis < 0 { rank + split.axis } else { split.axis }).unwrap_or(0);
                let piece = tensor.shape().get(axis).copied().unwrap_or(0) / split.parts.max(1);
                tensor.narrow(axis, split.index * piece, piece).map_err(|error| error.to_string())?
            }
            ImportOp::Transpose if tensor.rank() >= 2 => {
                let rank = tensor.rank();
                tensor.transpose(rank - 2, rank - 1).map_err(|error| error.to_string())?
            }
            ImportOp::Transpose => tensor,
            ImportOp::Offset(_) => tensor,
            ImportOp::RopePermute(key) => {
                return Err(format!(
                    "the model reorders this weight's rows from llama.cpp's rotary order (grouped by `{key}`), which a delta in transformers' order does not follow: merge into a model imported from transformers names"
                ));
            }
        };
    }
    Ok(if tensor.is_meta() { tensor } else { tensor.contiguous() })
}
