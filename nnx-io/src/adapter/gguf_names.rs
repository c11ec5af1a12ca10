//! An adapter renamed for a GGUF base: transformers module paths turned into llama.cpp's tensor
//! names through a model's two namings, and the rows of q and k put in llama.cpp's rotary
//! order, as `convert_lora_to_gguf.py` does.

use std::collections::HashMap;

use nnx_core::{DType, ImportOp, Module, Naming, for_each_entry_named};

use super::report::{AdapterProblem, model_name, module_problem, no_target, problem};
use super::{Adapter, AdapterFormat};
use crate::error::Result;

impl Adapter {
    /// This adapter under GGUF names (`blk.0.attn_q`), for merging into a GGUF file of
    /// `model`'s architecture: each module's transformers path is found in `model`'s walk and
    /// renamed to the GGUF source of the same model tensor, and `B`'s rows of q and k are put
    /// in llama.cpp's rotary pair order (their groups counted by `metadata`'s head counts), as
    /// llama.cpp's `convert_lora_to_gguf.py` does. A GGUF adapter is returned as it is.
    ///
    /// # Errors
    /// [`Error::AdapterMismatch`](crate::Error::AdapterMismatch) for modules `model` does not
    /// have, or whose GGUF tensor the model reads split or transposed;
    /// [`Error::Adapter`](crate::Error::Adapter) for a missing head count.
    pub fn renamed_for_gguf<M: Module + ?Sized>(&self, model: &M, metadata: &crate::gguf::Metadata) -> Result<Adapter> {
        if self.format == AdapterFormat::Gguf {
            return Ok(self.clone());
        }
        let mut paths: HashMap<String, String> = HashMap::new();
        for_each_entry_named(model, self.format.naming(), |slot, _| {
            paths.insert(slot.source.to_string(), slot.name.to_string());
        });
        // Each model tensor's GGUF source, operations and shape (of rows only when the model
        // keeps the tensor in ggml blocks, U8 `[rows, bytes]`).
        let mut gguf: HashMap<String, (String, Vec<ImportOp>, Vec<usize>, bool)> = HashMap::new();
        for_each_entry_named(model, Naming::Gguf, |slot, tensor| {
            let packed = tensor.dtype() == DType::U8;
            gguf.insert(
                slot.name.to_string(),
                (slot.source.to_string(), slot.ops.to_vec(), tensor.shape().to_vec(), packed),
            );
        });
        let mut problems = Vec::new();
        let mut renamed = self.in_model_layout(model);
        renamed.format = AdapterFormat::Gguf;
        renamed.saved.clear();
        for name in self.saved.keys() {
            let reason = "a saved module is merged under transformers names only";
            problems.push(AdapterProblem::Unusable { module: name.clone(), reason: reason.into() });
        }
        for module in &mut renamed.modules {
            let source = format!("{}.weight", module.source);
            let Some((target, ops, shape, packed)) = paths.get(&source).and_then(|path| gguf.get(path)) else {
                problems.push(no_target(&problems, &source, paths.keys().map(String::as_str)));
                continue;
            };
            if module.fan_in_fan_out || ops.iter().any(|op| matches!(op, ImportOp::Split(_) | ImportOp::Transpose)) {
                let reason = "the GGUF tensor is split or transposed on the way to the model";
                problems.push(AdapterProblem::Unusable { module: source, reason: reason.into() });
                continue;
            }
            if let Some(problem) = module_problem(module) {
                problems.push(problem);
                continue;
            }
            // The shapes before the rows of q and k are reordered by them.
            let found = module.delta_shape();
            let fits = if *packed { found.first() == shape.first() } else { found == *shape };
            if !fits {
                let (target, expected) = (target.clone(), shape.clone());
                problems.push(AdapterProblem::Shape { module: source, target, expected, found });
                continue;
            }
            for op in ops {
                if let ImportOp::RopePermute(key) = op {
                    let arch = metadata.architecture().unwrap_or_default();
                    let key = format!("{arch}.attention.{key}");
                    let heads = metadata.u64(&key).ok_or_else(|| {
                        problem(
                            &self.path,
                            &key,
                            "is missing from the base's metadata: it counts the rotary groups of q and k",
                        )
                    })?;
                    let rows = module.b.shape()[0];
                    match usize::try_from(heads) {
                        Ok(heads) if heads > 0 && rows.is_multiple_of(2 * heads) => {
                            module.b = crate::import::reorder_rope_rows(&module.b, heads, true)?;
                        }
                        _ => {
                            let reason = format!(
                                "its {rows} rows of `B` do not split into the base's {heads} rotary groups (`{key}`) of pairs: the adapter belongs to another model"
                            );
                            problems.push(AdapterProblem::Unusable { module: source.clone(), reason });
                        }
                    }
                }
            }
            module.source = target.strip_suffix(".weight").unwrap_or(target).to_string();
        }
        if !problems.is_empty() {
            return Err(self.mismatch(model_name::<M>(), &problems));
        }
        Ok(renamed)
    }
}
