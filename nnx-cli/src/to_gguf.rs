//! `nnx convert IN OUT.gguf --type TYPE|MIXTURE [--tensor-type PATTERN=TYPE]...`: SafeTensors,
//! PyTorch or GGUF weights to a GGUF file, each tensor given the type llama.cpp's rules choose
//! (kept packed when it already has it, decoded and quantized otherwise).

use std::borrow::Cow;
use std::path::Path;

use nnx::gguf::{GgmlTensor, GgufWriter, Metadata, Recipe, TypePlan, Value, ggml_type_of};
use nnx::quant::ggml::GgmlType;
use nnx::{Archive, DType};
use rayon::prelude::*;

use crate::common::{CliError, progress_bar};
use crate::convert::expansion;

/// Keys of a GGUF input that describe the input's own encoding or layout, not the model.
const DROPPED: &[&str] = &["general.file_type", "general.quantization_version", "general.alignment"];

/// Parses a `--tensor-type PATTERN=TYPE` override.
pub fn parse_override(text: &str) -> Result<(String, GgmlType), String> {
    let (pattern, ty) =
        text.rsplit_once('=').ok_or_else(|| format!("`{text}` is not PATTERN=TYPE (for example `attn_v=q8_0`)"))?;
    let ty = GgmlType::from_name(ty)
        .filter(|&ty| nnx::quant::ggml::can_quantize(ty))
        .ok_or_else(|| format!("`{ty}` is not a type nnx quantizes to: use one of {}", Recipe::names()))?;
    Ok((pattern.to_string(), ty))
}

/// Parses a `--type` value.
pub fn parse_recipe(text: &str) -> Result<Recipe, String> {
    Recipe::parse(text)
        .ok_or_else(|| format!("`{text}` is not a type or mixture nnx writes: use one of {}", Recipe::names()))
}

/// Writes `archive` (read from `input`) to the GGUF file `output`; returns the summary line.
pub fn convert(
    archive: &Archive,
    input: &Path,
    output: &Path,
    recipe: Recipe,
    overrides: &[(String, GgmlType)],
) -> Result<String, CliError> {
    let metadata = archive.gguf_metadata().map_or_else(|| Cow::Owned(Metadata::new()), Cow::Borrowed);
    write(archive, metadata, input, output, recipe, overrides)
}

/// Writes a transformers folder of an architecture nnx exports as llama.cpp's converter
/// does (see [`nnx::models::gguf`]); `None` for other inputs.
pub fn convert_folder(
    input: &Path,
    output: &Path,
    recipe: Recipe,
    overrides: &[(String, GgmlType)],
) -> Result<Option<String>, CliError> {
    if !input.is_dir() {
        return Ok(None);
    }
    let export = nnx::models::gguf::export(input).map_err(|error| match (&error, expansion(&error)) {
        (nnx::Error::Data { path, name, .. }, Some(layout)) => CliError(format!(
            "cannot write `{name}` of `{}` to GGUF: {layout}: if the copy is meant, convert the weights to SafeTensors with `nnx convert --allow-expansion` first",
            path.display()
        )),
        _ => CliError::from(error),
    })?;
    let Some(export) = export else { return Ok(None) };
    let mut summary = write(&export.tensors, Cow::Owned(export.metadata), input, output, recipe, overrides)?;
    for note in &export.notes {
        summary.push_str(&format!("note: {note}\n"));
    }
    Ok(Some(summary))
}

/// Writes `archive` with `metadata` (borrowed from the input, or the export's own, moved into
/// the writer: a GGUF file's metadata, a vocabulary of a million strings say, is copied at most
/// once on its way to the output).
fn write(
    archive: &Archive,
    metadata: Cow<'_, Metadata>,
    input: &Path,
    output: &Path,
    recipe: Recipe,
    overrides: &[(String, GgmlType)],
) -> Result<String, CliError> {
    // llama-quantize's order: tensors outside the layers first, then layer by layer, each
    // group by name. Its per-layer choices count tensors in this order.
    let mut names: Vec<&str> = archive.names().collect();
    names.sort_by_key(|name| (layer_of(name), *name));
    let overrides: Vec<(&str, GgmlType)> = overrides.iter().map(|(pattern, ty)| (pattern.as_str(), *ty)).collect();
    let mut plan = TypePlan::new(recipe, &metadata, &names, &overrides)?;
    // The plan walks tensors in file order, as llama.cpp's counters do; the work runs in
    // parallel after.
    let mut jobs = Vec::with_capacity(names.len());
    for name in &names {
        let info = archive.info(name)?;
        let stored = match archive.ggml_type(name).or_else(|| ggml_type_of(info.dtype)) {
            Some(ty) => ty,
            None => {
                return Err(CliError(format!(
                    "cannot write `{name}` of `{}` to GGUF: its dtype {} has no ggml type (GGUF stores f32, f16, bf16, f64 and i8 to i64)",
                    input.display(),
                    info.dtype
                )));
            }
        };
        let float = info.dtype.is_castable_float();
        let ty = if float { plan.next(name, &info.shape, stored) } else { stored };
        jobs.push((*name, stored, ty, info.bytes as u64));
    }
    let total: u64 = jobs.iter().map(|job| job.3).sum();
    let bar = progress_bar(total, "bytes");
    let tensors: Vec<GgmlTensor> = jobs
        .par_iter()
        .map(|&(name, stored, ty, bytes)| {
            let fail = |error: nnx::Error| match expansion(&error) {
                Some(layout) => CliError(format!(
                    "cannot write `{name}` of `{}` as {ty}: {layout}: if the copy is meant, convert it to SafeTensors with `nnx convert --allow-expansion` first",
                    input.display()
                )),
                None => CliError(format!("cannot write `{name}` of `{}` as {ty}: {error}", input.display())),
            };
            let tensor = if ty == stored {
                archive.ggml(name).map_err(fail)?
            } else {
                let values = archive.try_get(name).and_then(|t| t.to_dtype(DType::F32)).map_err(fail)?;
                GgmlTensor::quantize(&values, ty).map_err(fail)?
            };
            bar.inc(bytes);
            Ok(tensor)
        })
        .collect::<Result<_, CliError>>()?;
    bar.finish_and_clear();

    let mut writer = GgufWriter::new();
    let out = writer.metadata_mut();
    *out = metadata.into_owned();
    let dropped: Vec<String> = out
        .iter()
        .map(|(key, _)| key)
        .filter(|key| DROPPED.contains(key) || key.starts_with("split."))
        .map(str::to_string)
        .collect();
    for key in dropped {
        out.remove(&key);
    }
    if !out.contains("general.architecture") {
        // Readers such as llama.cpp's require it; weights from elsewhere are named as stored,
        // so they are not any architecture llama.cpp runs.
        out.set("general.architecture", Value::String("nnx".into()));
    }
    out.set("general.file_type", Value::U32(recipe.file_type()));
    let quantized = tensors.iter().any(|tensor| tensor.ty.is_quantized());
    if quantized {
        out.set("general.quantization_version", Value::U32(2));
    }
    let mut counts: std::collections::BTreeMap<GgmlType, usize> = std::collections::BTreeMap::new();
    for ((name, ..), tensor) in jobs.iter().zip(tensors) {
        *counts.entry(tensor.ty).or_default() += 1;
        writer.add(*name, tensor)?;
    }
    writer.write(output)?;
    let counts: Vec<String> = counts.iter().map(|(ty, n)| format!("{n} {ty}")).collect();
    Ok(format!(
        "converted {} tensors from {} into {} ({})\n",
        names.len(),
        input.display(),
        output.display(),
        counts.join(", ")
    ))
}

/// The layer of a `blk.N.` tensor; -1 for the others, which llama.cpp orders first.
fn layer_of(name: &str) -> i64 {
    name.strip_prefix("blk.").and_then(|rest| rest.split('.').next()?.parse().ok()).unwrap_or(-1)
}
