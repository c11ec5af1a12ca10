//! An adapter applied at run time instead of merged: each module's factors cut and turned to
//! the model weights it reaches ([`Attachment`]), `y = W x + s B (A x)`.

use std::collections::HashMap;

use nnx_core::{ImportOp, Module, Tensor, for_each_entry_named};

use super::report::{AdapterProblem, model_name};
use super::{Adapter, LoraKind, LoraModule};
use crate::error::{Error, Result};

impl Adapter {
    /// The factors of every module as `model` reads its weights, for applying the adapter at
    /// run time (`y = W x + s B (A x)`) instead of merging it: for each model weight a module
    /// reaches, `A` `[r, in]` and `B` `[out, r]` in the model's own layout (a split source cut
    /// down to the model's piece, a transposed one turned), its scale and trained bias.
    /// `stored_rope_rows`: the model keeps q and k in llama.cpp's rotary pair order (a GGUF
    /// file's, see `ImportOptions::with_stored_rope_rows`), as a GGUF adapter's factors are.
    ///
    /// # Errors
    /// [`Error::AdapterMismatch`] as for [`Adapter::merge_into`], and for modules that only
    /// merge: DoRA (its row norms need the merged weight), embeddings and saved modules.
    pub fn attachments<M: Module + ?Sized>(&self, model: &M, stored_rope_rows: bool) -> Result<Vec<Attachment>> {
        let adapter = self.in_model_layout(model);
        let mut report = adapter.check_with(model, stored_rope_rows);
        let mut by_source: HashMap<String, Vec<(String, Vec<ImportOp>)>> = HashMap::new();
        for_each_entry_named(model, self.format.naming(), |slot, _| {
            if slot.tie.is_none() {
                by_source.entry(slot.source.to_string()).or_default().push((slot.name.to_string(), slot.ops.to_vec()));
            }
        });
        let mut attachments = Vec::new();
        for module in &adapter.modules {
            let source = format!("{}.weight", module.source);
            let only_merges = match (module.kind, &module.magnitude) {
                (LoraKind::Lookup, _) => Some("an embedding's factors are merged, not applied at run time"),
                (_, Some(_)) => Some("DoRA normalises the merged weight's rows: merge it instead"),
                _ => None,
            };
            if let Some(reason) = only_merges {
                report.problems.push(AdapterProblem::Unusable { module: source, reason: reason.into() });
                continue;
            }
            if !report.problems.is_empty() {
                // Refused anyway: no factors are cut or turned.
                continue;
            }
            for (name, ops) in by_source.get(&source).into_iter().flatten() {
                match factors_through(module, ops, stored_rope_rows) {
                    Ok((a, b, bias)) => attachments.push(Attachment {
                        target: name.clone(),
                        module: module.source.clone(),
                        a,
                        b,
                        scale: module.scale,
                        bias,
                    }),
                    Err(reason) => report.problems.push(AdapterProblem::Unusable { module: source.clone(), reason }),
                }
            }
        }
        for name in self.saved.keys() {
            let reason = "a saved module replaces a weight, which only a merge does";
            report.problems.push(AdapterProblem::Unusable { module: name.clone(), reason: reason.into() });
        }
        if !report.problems.is_empty() {
            return Err(self.mismatch(model_name::<M>(), &report.problems));
        }
        Ok(attachments)
    }
}

/// One adapter module's factors on one model weight, for applying at run time.
#[derive(Debug, Clone)]
pub struct Attachment {
    /// The model weight (`layers.0.attn.q.weight`).
    pub target: String,
    /// The adapter's module the factors come from, in its naming (`model.layers.0.self_attn.q_proj`).
    pub module: String,
    /// `A`, F32 `[r, in]` in the model's layout.
    pub a: Tensor,
    /// `B`, F32 `[out, r]` in the model's layout.
    pub b: Tensor,
    /// The scale of `B (A x)`.
    pub scale: f32,
    /// A trained bias, added times the scale.
    pub bias: Option<Tensor>,
}

/// `module`'s factors as the model reads the weight through `ops`: `(A [r, in], B [out, r])`
/// with `B A` the model's piece of the delta. The source delta is `B A`, or its transpose with
/// `fan_in_fan_out`; a split cuts `B`'s rows or `A`'s columns, whichever holds that axis.
#[allow(clippy::type_complexity)]
fn factors_through(
    module: &LoraModule,
    ops: &[ImportOp],
    stored_rope_rows: bool,
) -> std::result::Result<(Tensor, Tensor, Option<Tensor>), String> {
    let fail = |error: Error| error.to_string();
    let (mut a, mut b, mut bias) = (module.a.clone(), module.b.clone(), module.bias.clone());
    // Whether the source tensor is `(B A)ᵀ` rather than `B A`.
    let mut transposed = module.fan_in_fan_out;
    for op in ops {
        match op {
            ImportOp::Split(split) => {
                let axis = if split.axis < 0 { 2 + split.axis } else { split.axis };
                // Axis 0 of `B A` is B's rows; axis 1 is A's columns.
                let rows_of_b = (axis == 0) != transposed;
                let (tensor, axis) = if rows_of_b { (&mut b, 0) } else { (&mut a, 1) };
                let piece = tensor.shape()[axis] / split.parts.max(1);
                *tensor = tensor.narrow(axis, split.index * piece, piece).map_err(fail)?.contiguous();
                // A trained bias has one value per output: B's rows.
                if rows_of_b && let Some(values) = &bias {
                    bias = Some(values.narrow(0, split.index * piece, piece).map_err(fail)?.contiguous());
                }
            }
            ImportOp::Transpose => transposed = !transposed,
            ImportOp::Offset(_) => {}
            ImportOp::RopePermute(_) if stored_rope_rows => {}
            ImportOp::RopePermute(key) => {
                return Err(format!(
                    "the model reorders this weight's rows from llama.cpp's rotary order (grouped by `{key}`): attach to a model that keeps them as stored"
                ));
            }
        }
    }
    if transposed {
        // The model's weight is `(B A)ᵀ = Aᵀ Bᵀ`: `Bᵀ` is its `A`, `Aᵀ` its `B`.
        return Ok((
            b.transpose(0, 1).map_err(fail)?.contiguous(),
            a.transpose(0, 1).map_err(fail)?.contiguous(),
            bias,
        ));
    }
    Ok((a, b, bias))
}
