//! Merging an adapter: into a module's weights (and back out), into an archive's entries (float
//! weights and MLX affine streams), and into a GGUF file's ggml blocks, each `W + s * B A`
//! computed in f32 once every module fits.

use std::collections::HashMap;
use std::path::PathBuf;

use nnx_core::{DType, Module, Tensor, for_each_entry_mut, for_each_entry_named};

use super::plan::{Change, through_ops};
use super::report::{AdapterProblem, AdapterReport, model_name, module_problem, no_target, problem};
use super::{Adapter, LoraModule};
use crate::archive::Archive;
use crate::error::{Error, Result};

impl Adapter {
    /// Merges the adapter into `model`: each target weight becomes `W + s * B A` (DoRA's
    /// magnitudes applied, biases added, saved tensors replacing theirs), computed in f32 and
    /// cast back to the weight's dtype. Nothing changes unless every module fits.
    ///
    /// The returned [`Merged`] holds the weights as they were, so that
    /// [`Merged::unmerge`] restores them bit for bit.
    ///
    /// # Errors
    /// [`Error::AdapterMismatch`] listing every module that has no target, a target of
    /// another shape, or one packed in ggml blocks (merge those into the file with
    /// [`Adapter::merge_gguf`], or attach the adapter at run time).
    pub fn merge_into<M: Module + ?Sized>(&self, model: &mut M) -> Result<Merged> {
        let adapter = self.in_model_layout(model);
        let (report, targets) = adapter.plan(model, false);
        if !report.problems.is_empty() {
            return Err(self.mismatch(model_name::<M>(), &report.problems));
        }
        // The new value of every model tensor that changes, computed before any is replaced.
        let mut current: HashMap<String, Tensor> = HashMap::new();
        for_each_entry_named(model, self.format.naming(), |slot, tensor| {
            if targets.contains_key(slot.name) {
                current.insert(slot.name.to_string(), tensor.clone());
            }
        });
        let mut updated: HashMap<String, Tensor> = HashMap::new();
        for (name, changes) in &targets {
            let mut value = current[name].clone();
            // A saved copy of the weight first (PEFT saves an adapted embedding's), then deltas.
            for change in changes {
                value = match change {
                    Change::Replace(tensor) => tensor.to_dtype(value.dtype())?,
                    Change::Add { delta, magnitude } => add_delta(&value, delta, magnitude.as_ref())?,
                    Change::Module { module, ops, magnitude } => {
                        let delta = through_ops(&adapter.modules[*module].delta()?, ops)
                            .map_err(|reason| problem(&self.path, &adapter.modules[*module].source, &reason))?;
                        add_delta(&value, &delta, magnitude.as_ref())?
                    }
                };
            }
            updated.insert(name.clone(), value);
        }
        let mut originals = Vec::new();
        for_each_entry_mut(model, |slot, tensor| {
            if let Some(value) = updated.remove(slot.name) {
                originals.push((slot.name.to_string(), std::mem::replace(tensor, value)));
            }
        });
        Ok(Merged { originals, report })
    }

    /// The entries of `base` (a model's weights under their source names, as the adapter
    /// names them) with the adapter merged in: each target `W + s * B A` (DoRA's magnitudes
    /// applied, trained biases added, saved modules replacing theirs) in the entry's dtype,
    /// every other entry a view of `base`. What `nnx lora merge` writes.
    ///
    /// # Errors
    /// [`Error::AdapterMismatch`] listing every module without an entry or with an entry of
    /// another shape or a dtype that is not a float (nothing is merged then); the errors of
    /// reading the entries.
    pub fn merge_archive(&self, base: &Archive) -> Result<Archive> {
        let mut merged = base.select("");
        let mut problems = Vec::new();
        let names: Vec<&str> = base.names().collect();
        // Saved modules first: an adapted embedding's saved copy is the weight its delta adds to.
        let mut replaced: HashMap<String, Tensor> = HashMap::new();
        for (name, tensor) in &self.saved {
            match base.entry_spec(name)? {
                Some((dtype, shape)) if shape == tensor.shape() && dtype.is_castable_float() => {
                    replaced.insert(name.clone(), tensor.to_dtype(dtype)?);
                }
                Some((_, shape)) => problems.push(AdapterProblem::Shape {
                    module: name.clone(),
                    target: name.clone(),
                    expected: shape,
                    found: tensor.shape().to_vec(),
                }),
                None => problems.push(no_target(&problems, name, names.iter().copied())),
            }
        }
        // The merged value of entry `name`, or `None` with the problem recorded. A module's
        // delta is computed only once its shape is the entry's, the entry a float whose bytes
        // are in the file, and no problem found so far (nothing is merged then anyway): the
        // factors alone can describe a product of any size.
        let merge = |name: &str, change: Change, problems: &mut Vec<AdapterProblem>| -> Result<Option<Tensor>> {
            let Some((dtype, shape)) = base.entry_spec(name)? else {
                problems.push(no_target(problems, name, names.iter().copied()));
                return Ok(None);
            };
            let found = match &change {
                Change::Add { delta, .. } => delta.shape().to_vec(),
                Change::Replace(tensor) => tensor.shape().to_vec(),
                Change::Module { module, .. } => self.modules[*module].delta_shape(),
            };
            if found != shape {
                let (module, target) = (name.to_string(), name.to_string());
                problems.push(AdapterProblem::Shape { module, target, expected: shape, found });
                return Ok(None);
            }
            if !dtype.is_castable_float() {
                let reason = format!("is {dtype}; merging needs float weights (decode quantized ones first)");
                problems.push(AdapterProblem::Unusable { module: name.to_string(), reason });
                return Ok(None);
            }
            if !problems.is_empty() {
                return Ok(None);
            }
            let weight = match replaced.get(name) {
                Some(saved) => saved.clone(),
                None => base.try_get(name)?,
            };
            weight.check_expansion(weight.expansion_limit()).map_err(|error| Error::Data {
                path: PathBuf::from(base.origin()),
                name: name.to_string(),
                source: Box::new(error),
            })?;
            Ok(Some(match change {
                Change::Add { delta, magnitude } => add_delta(&weight, &delta, magnitude.as_ref())?,
                Change::Module { module, magnitude, .. } => {
                    add_delta(&weight, &self.modules[module].delta()?, magnitude.as_ref())?
                }
                Change::Replace(tensor) => tensor.to_dtype(dtype)?,
            }))
        };
        let mut values = Vec::new();
        for (index, module) in self.modules.iter().enumerate() {
            if let Some(problem) = module_problem(module) {
                problems.push(problem);
                continue;
            }
            let (weight, magnitude) = (format!("{}.weight", module.source), module.magnitude.clone());
            if let Some(streams) = affine_streams(base, &module.source)? {
                match merge_affine(base, &module.source, streams, module)? {
                    Ok(entries) => values.extend(entries.into_iter().map(|(name, tensor)| (name, Some(tensor)))),
                    Err(problem) => problems.push(problem),
                }
                continue;
            }
            let change = Change::Module { module: index, ops: Vec::new(), magnitude };
            values.push((weight.clone(), merge(&weight, change, &mut problems)?));
            if let Some(bias) = &module.bias {
                let delta = scaled(bias, module.scale)?;
                let name = format!("{}.bias", module.source);
                let value = match (base.contains(&name), base.entry_spec(&weight)?) {
                    // A layer without a bias gets the trained one, as PEFT's merge gives it one.
                    (false, Some((dtype, _))) if dtype.is_castable_float() => {
                        // One value per output, as `B` has rows.
                        let rows = module.b.shape()[0];
                        if delta.shape() == [rows] {
                            Some(delta.to_dtype(dtype)?)
                        } else {
                            let (module, target, found) = (name.clone(), name.clone(), delta.shape().to_vec());
                            problems.push(AdapterProblem::Shape { module, target, expected: vec![rows], found });
                            None
                        }
                    }
                    _ => merge(&name, Change::Add { delta, magnitude: None }, &mut problems)?,
                };
                values.push((name, value));
            }
        }
        for (name, tensor) in &replaced {
            if !values.iter().any(|(merged, _)| merged == name) {
                values.push((name.clone(), Some(tensor.clone())));
            }
        }
        if !problems.is_empty() {
            return Err(self.mismatch(base.origin().to_string(), &problems));
        }
        for (name, value) in values {
            if let Some(value) = value {
                merged.insert(name, value);
            }
        }
        Ok(merged)
    }

    /// The GGUF file `base` with this GGUF-named adapter merged in (see
    /// [`Adapter::renamed_for_gguf`] for others): each target decoded, `W + s B A` added (DoRA's
    /// magnitudes applied), and encoded again in its own ggml type, as llama.cpp's
    /// `llama-export-lora` does; every other tensor and the metadata as they are.
    ///
    /// # Errors
    /// [`Error::AdapterMismatch`] listing modules without a tensor or with another shape, trained
    /// biases and saved modules (GGUF merges carry neither); [`Error::GgmlUnsupported`] for a
    /// target in a type nnx does not encode.
    pub fn merge_gguf(&self, base: &Archive) -> Result<crate::gguf::GgufWriter> {
        let metadata = base.gguf_metadata().ok_or_else(|| {
            problem(
                &self.path,
                "",
                &format!("cannot be merged as GGUF into {}, which is not a GGUF file", base.origin()),
            )
        })?;
        let mut problems = Vec::new();
        let mut merged: HashMap<String, crate::gguf::GgmlTensor> = HashMap::new();
        let names: Vec<&str> = base.names().collect();
        for module in &self.modules {
            let name = format!("{}.weight", module.source);
            if module.bias.is_some() {
                let reason = "a trained bias is not merged into GGUF files (merge into the transformers folder)";
                problems.push(AdapterProblem::Unusable {
                    module: format!("{}.bias", module.source),
                    reason: reason.into(),
                });
            }
            if !base.contains(&name) {
                problems.push(no_target(&problems, &name, names.iter().copied()));
                continue;
            }
            if let Some(problem) = module_problem(module) {
                problems.push(problem);
                continue;
            }
            let stored = base.ggml(&name)?;
            // The delta is computed once it is known to have the stored tensor's shape, and
            // only while nothing is refused (then nothing is merged).
            let found = module.delta_shape();
            if found != stored.shape.as_slice() {
                let (target, expected) = (name.clone(), stored.shape.clone());
                problems.push(AdapterProblem::Shape { module: name, target, expected, found });
                continue;
            }
            if !problems.is_empty() {
                continue;
            }
            let delta = module.delta()?;
            let weight = stored.dequantize()?;
            let value = add_delta(&weight, &delta, module.magnitude.as_ref())?;
            merged.insert(name, crate::gguf::GgmlTensor::quantize(&value, stored.ty)?);
        }
        for name in self.saved.keys() {
            let reason = "a saved module is merged under transformers names only";
            problems.push(AdapterProblem::Unusable { module: name.clone(), reason: reason.into() });
        }
        if !problems.is_empty() {
            return Err(self.mismatch(base.origin().to_string(), &problems));
        }
        let mut writer = crate::gguf::GgufWriter::new();
        *writer.metadata_mut() = metadata.clone();
        // The writer aligns as it writes; the base's own alignment key would contradict it.
        writer.metadata_mut().remove("general.alignment");
        for name in base.names() {
            let tensor = match merged.remove(name) {
                Some(tensor) => tensor,
                None => base.ggml(name)?,
            };
            writer.add(name, tensor)?;
        }
        Ok(writer)
    }
}

/// A merge that can be taken back: the weights as they were before it.
#[derive(Debug)]
pub struct Merged {
    originals: Vec<(String, Tensor)>,
    /// What the merge matched and replaced.
    pub report: AdapterReport,
}

impl Merged {
    /// Puts back the weights the merge changed, bit for bit (the originals were kept, not
    /// recomputed, so the result does not depend on rounding).
    pub fn unmerge<M: Module + ?Sized>(self, model: &mut M) {
        let mut originals: HashMap<String, Tensor> = self.originals.into_iter().collect();
        for_each_entry_mut(model, |slot, tensor| {
            if let Some(original) = originals.remove(slot.name) {
                *tensor = original;
            }
        });
    }
}

/// The names of `stem`'s MLX affine streams (`weight` U32 with `scales` and `biases`), when
/// `base` stores it so.
fn affine_streams(base: &Archive, stem: &str) -> Result<Option<[String; 3]>> {
    let names = [format!("{stem}.weight"), format!("{stem}.scales"), format!("{stem}.biases")];
    let packed = matches!(base.entry_spec(&names[0])?, Some((DType::U32, _)));
    Ok((packed && base.contains(&names[1]) && base.contains(&names[2])).then_some(names))
}

/// `module` merged into the MLX affine weight `streams` of `base`, as `mlx_lm.fuse` does: the
/// weight decoded (in the scales' dtype), the delta cast to that dtype and added, and the sum
/// quantized again with the same bits and group size (inferred from the streams' shapes and
/// the delta's width). The three new streams, or the problem.
#[allow(clippy::type_complexity)]
fn merge_affine(
    base: &Archive,
    stem: &str,
    streams: [String; 3],
    module: &LoraModule,
) -> Result<std::result::Result<Vec<(String, Tensor)>, AdapterProblem>> {
    let [weight, scales, biases] = streams;
    let (packed, groups) = (base.try_get(&weight)?, base.try_get(&scales)?);
    // Everything is checked on the delta's shape; the delta is computed last.
    let delta_shape = module.delta_shape();
    let (columns, words, count) =
        (delta_shape[1], packed.shape().get(1).copied().unwrap_or(0), groups.shape().get(1).copied().unwrap_or(0));
    let bits = words.checked_mul(32).and_then(|bits| bits.checked_div(columns)).map(u32::try_from);
    let spec = match (bits, columns.checked_div(count)) {
        (Some(Ok(bits)), Some(group)) if packed.rank() == 2 && groups.rank() == 2 && columns % count == 0 => {
            nnx_core::quant::AffineSpec::new(bits, group)
        }
        _ => {
            let reason =
                format!("{delta_shape:?} does not fit its packed weight of {words} words with {count} groups a row");
            return Ok(Err(AdapterProblem::Unusable { module: weight, reason }));
        }
    };
    let affine =
        match spec.and_then(|spec| nnx_core::quant::AffineWeight::new(packed, groups, base.try_get(&biases)?, spec)) {
            Ok(affine) if affine.shape() == delta_shape => affine,
            Ok(affine) => {
                let (target, expected, found) = (weight.clone(), affine.shape(), delta_shape);
                return Ok(Err(AdapterProblem::Shape { module: weight, target, expected, found }));
            }
            Err(error) => return Ok(Err(AdapterProblem::Unusable { module: weight, reason: error.to_string() })),
        };
    if module.magnitude.is_some() || module.bias.is_some() {
        let reason = "DoRA magnitudes and trained biases are not merged into quantized weights";
        return Ok(Err(AdapterProblem::Unusable { module: format!("{stem}.weight"), reason: reason.into() }));
    }
    let delta = module.delta()?;
    let dtype = affine.dtype();
    let sum = add_delta(&affine.dequantize()?, &delta.to_dtype(dtype)?.to_dtype(DType::F32)?, None)?;
    let fused = nnx_core::quant::AffineWeight::quantize(&sum, affine.spec())?;
    Ok(Ok(vec![(weight, fused.weight), (scales, fused.scales), (biases, fused.biases)]))
}

/// `tensor * scale` in f32 (a trained bias, read from the file whole).
pub(super) fn scaled(tensor: &Tensor, scale: f32) -> Result<Tensor> {
    let values: Vec<f32> = tensor.to_dtype(DType::F32)?.to_vec::<f32>()?.into_iter().map(|v| v * scale).collect();
    Tensor::from_vec(values, tensor.shape())
}

/// `weight + delta` in f32, rows rescaled to `magnitude` (DoRA: `m / ||W + ΔW||` per row), in
/// the weight's dtype.
fn add_delta(weight: &Tensor, delta: &Tensor, magnitude: Option<&Tensor>) -> Result<Tensor> {
    // The common case in one pass and one allocation: each stored value widened, the delta
    // added and the sum rounded back, read straight from the (mapped) weight.
    // Both are as large as the weight honestly is (callers check a view from a file first).
    let weight_view = weight.contiguous_within(weight.expansion_limit())?;
    let delta_view = delta.contiguous_within(delta.expansion_limit())?;
    if magnitude.is_none()
        && let Some(deltas) = delta_view.as_slice::<f32>().ok().flatten()
    {
        macro_rules! added {
            ($ty:ty) => {
                if let Some(values) = weight_view.as_slice::<$ty>().ok().flatten() {
                    let sums: Vec<$ty> =
                        values.iter().zip(deltas).map(|(&w, &d)| <$ty>::from_f32(f32::from(w) + d)).collect();
                    return Tensor::from_vec(sums, weight.shape());
                }
            };
        }
        match weight.dtype() {
            DType::BF16 => added!(half::bf16),
            DType::F16 => added!(half::f16),
            DType::F32 => {
                if let Some(values) = weight_view.as_slice::<f32>().ok().flatten() {
                    let sums: Vec<f32> = values.iter().zip(deltas).map(|(&w, &d)| w + d).collect();
                    return Tensor::from_vec(sums, weight.shape());
                }
            }
            _ => {}
        }
    }
    let mut values = weight.to_dtype(DType::F32)?.to_vec::<f32>()?;
    for (value, d) in values.iter_mut().zip(delta.to_vec::<f32>()?) {
        *value += d;
    }
    if let Some(magnitude) = magnitude {
        let magnitude = magnitude.to_dtype(DType::F32)?.to_vec::<f32>()?;
        let width = values.len() / magnitude.len().max(1);
        for (row, m) in values.chunks_exact_mut(width.max(1)).zip(magnitude) {
            let norm = row.iter().map(|&v| f64::from(v) * f64::from(v)).sum::<f64>().sqrt();
            let factor = (f64::from(m) / norm) as f32;
            row.iter_mut().for_each(|v| *v *= factor);
        }
    }
    Tensor::from_vec(values, weight.shape())?.to_dtype(weight.dtype())
}
