//! `nnx convert IN OUT.gguf --type TYPE|MIXTURE [--tensor-type PATTERN=TYPE]...`: SafeTensors,
//! PyTorch or GGUF weights to a GGUF file, each tensor given the type llama.cpp's rules choose
//! (kept packed when it already has it, decoded and quantized otherwise).
//!
//! A SafeTensors file written from a GGUF file carries the GGUF metadata with its value types
//! under the `__metadata__` key [`CARRIED`] (see [`carry`]), with the ggml type of each tensor
//! that was decoded to floats: the way back writes the same keys and values, and without
//! `--type` gives each tensor the type it had.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::path::Path;

use nnx::Archive;
use nnx::gguf::{
    Array, GgmlTensor, Metadata, PlannedTensor, Recipe, STREAM_WINDOW, Shards, TypePlan, Value, ValueType, fallback,
    ggml_type_of, may_quantize, write_streaming, write_streaming_split,
};
use nnx::quant::ggml::{GgmlType, can_quantize};
use serde_json::{Map, Value as Json};

use crate::common::{CliError, progress_bar};
use crate::convert::expansion;

/// The `__metadata__` key under which a SafeTensors file written from a GGUF file keeps the
/// GGUF metadata with its value types, and the ggml types of the tensors decoded to floats.
pub const CARRIED: &str = "gguf";

/// The key of the output's `LlamaFileType`.
const FILE_TYPE: &str = "general.file_type";

/// The key that says which version of the block formats quantized tensors use.
const QUANTIZATION_VERSION: &str = "general.quantization_version";

/// The key of the input's data alignment: the writer lays out the output with its own.
const ALIGNMENT: &str = "general.alignment";

/// The type `--type` stands for when it is not given (and the input carries no types).
const DEFAULT_TYPE: GgmlType = GgmlType::F16;

/// Where the GGUF output goes: one file, or with `split` shards of at most that many bytes of
/// tensor data named `STEM-00001-of-0000N.gguf` beside it, as llama.cpp's `--split-max-size`
/// names them.
#[derive(Clone, Copy)]
pub struct Output<'a> {
    /// The `.gguf` file named on the command line.
    pub path: &'a Path,
    /// The most tensor bytes a shard holds.
    pub split: Option<u64>,
}

/// Parses a `--tensor-type PATTERN=TYPE` override.
pub fn parse_override(text: &str) -> Result<(String, GgmlType), String> {
    let (pattern, ty) =
        text.rsplit_once('=').ok_or_else(|| format!("`{text}` is not PATTERN=TYPE (for example `attn_v=q8_0`)"))?;
    let ty = GgmlType::from_name(ty)
        .filter(|&ty| can_quantize(ty))
        .ok_or_else(|| format!("`{ty}` is not a type nnx quantizes to: use one of {}", Recipe::names()))?;
    Ok((pattern.to_string(), ty))
}

/// Parses a `--type` value.
pub fn parse_recipe(text: &str) -> Result<Recipe, String> {
    Recipe::parse(text)
        .ok_or_else(|| format!("`{text}` is not a type or mixture nnx writes: use one of {}", Recipe::names()))
}

/// How each tensor's type is chosen.
enum Choice<'a> {
    /// By a recipe, as llama-quantize chooses.
    Recipe(Recipe),
    /// The type each tensor had in the GGUF file the input was written from (the recorded type
    /// of a tensor decoded to floats, the stored type of the others), in that file's order.
    Restore(&'a Carried),
}

/// Writes `archive` (read from `input`) to the GGUF file `output`; returns the summary line.
/// Without a `recipe`, a SafeTensors file written from a GGUF file gets back the types it had
/// there, and other weights are written as F16.
pub fn convert(
    archive: &Archive,
    input: &Path,
    output: Output<'_>,
    recipe: Option<Recipe>,
    overrides: &[(String, GgmlType)],
) -> Result<String, CliError> {
    if let Some(metadata) = archive.gguf_metadata() {
        let choice = Choice::Recipe(recipe.unwrap_or(Recipe::Pure(DEFAULT_TYPE)));
        return write(archive, Cow::Borrowed(metadata), &BTreeMap::new(), input, output, choice, overrides);
    }
    let Some(carried) = carried(archive, input)? else {
        let choice = Choice::Recipe(recipe.unwrap_or(Recipe::Pure(DEFAULT_TYPE)));
        let mut summary =
            write(archive, Cow::Owned(Metadata::new()), &BTreeMap::new(), input, output, choice, overrides)?;
        if archive.metadata().contains_key("general.architecture") {
            summary.push_str(&format!(
                "note: `{}` holds GGUF keys as text only, without their types and arrays, so they are left out: convert the GGUF file it came from to SafeTensors again to carry them\n",
                input.display()
            ));
        }
        return Ok(summary);
    };
    let choice = match recipe {
        Some(recipe) => Choice::Recipe(recipe),
        None => Choice::Restore(&carried),
    };
    write(archive, Cow::Borrowed(&carried.metadata), &carried.types, input, output, choice, overrides)
}

/// Writes a transformers folder of an architecture nnx exports as llama.cpp's converter
/// does (see [`nnx::models::gguf`]); `None` for other inputs.
pub fn convert_folder(
    input: &Path,
    output: Output<'_>,
    recipe: Option<Recipe>,
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
    let choice = Choice::Recipe(recipe.unwrap_or(Recipe::Pure(DEFAULT_TYPE)));
    let metadata = Cow::Owned(export.metadata);
    let mut summary = write(&export.tensors, metadata, &BTreeMap::new(), input, output, choice, overrides)?;
    for note in &export.notes {
        summary.push_str(&format!("note: {note}\n"));
    }
    Ok(Some(summary))
}

/// Writes `archive` with `metadata` (borrowed from the input, or the export's own, moved into
/// the writer: a GGUF file's metadata, a vocabulary of a million strings say, is copied at most
/// once on its way to the output). `decoded` names the tensors whose values were decoded from
/// a quantized type, with that type.
fn write(
    archive: &Archive,
    metadata: Cow<'_, Metadata>,
    decoded: &BTreeMap<String, GgmlType>,
    input: &Path,
    output: Output<'_>,
    choice: Choice<'_>,
    overrides: &[(String, GgmlType)],
) -> Result<String, CliError> {
    // llama-quantize's order: tensors outside the layers first, then layer by layer, each
    // group by name. Its per-layer choices count tensors in this order.
    let mut names: Vec<&str> = archive.names().collect();
    names.sort_by_key(|name| (layer_of(name), *name));
    if let Choice::Restore(carried) = &choice {
        // The order of the file the input was written from, where it is known; no counter
        // depends on it then.
        let place: BTreeMap<&str, usize> =
            carried.order.iter().enumerate().map(|(at, name)| (name.as_str(), at)).collect();
        names.sort_by_key(|name| place.get(name).copied().unwrap_or(usize::MAX));
    }
    let overrides: Vec<(&str, GgmlType)> = overrides.iter().map(|(pattern, ty)| (pattern.as_str(), *ty)).collect();
    let recipe = match choice {
        Choice::Recipe(recipe) => recipe,
        // The plan only gives the overrides then.
        Choice::Restore(_) => Recipe::Pure(DEFAULT_TYPE),
    };
    let mut plan = TypePlan::new(recipe, &metadata, &names, &overrides)?;
    // The plan walks tensors in file order, as llama.cpp's counters do; the work runs in
    // parallel after.
    let mut jobs = Vec::with_capacity(names.len());
    let mut unwritable: BTreeMap<GgmlType, usize> = BTreeMap::new();
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
        let ty = match &choice {
            _ if !float => stored,
            Choice::Recipe(_) => plan.next(name, &info.shape, stored),
            Choice::Restore(carried) => {
                let had = carried.types.get(*name).copied().unwrap_or(stored);
                let wanted = plan.overridden(name).filter(|_| may_quantize(name, &info.shape)).unwrap_or(had);
                if wanted == stored {
                    stored
                } else if can_quantize(wanted) {
                    fallback(wanted, info.shape.last().copied().unwrap_or(1))
                } else {
                    *unwritable.entry(wanted).or_default() += 1;
                    DEFAULT_TYPE
                }
            }
        };
        let origin = decoded.get(*name).copied().unwrap_or(stored);
        jobs.push(Job { name, stored, origin, ty, shape: info.shape, bytes: info.bytes as u64 });
    }
    warn_requantizing(&jobs, input, !decoded.is_empty());
    let mut out = metadata.into_owned();
    let split: Vec<String> =
        out.iter().map(|(key, _)| key).filter(|key| key.starts_with("split.")).map(str::to_string).collect();
    for key in split.iter().map(String::as_str).chain([ALIGNMENT]) {
        out.remove(key);
    }
    if !out.contains("general.architecture") {
        // Readers such as llama.cpp's require it; weights from elsewhere are named as stored,
        // so they are not any architecture llama.cpp runs.
        out.set("general.architecture", Value::String("nnx".into()));
    }
    // Keys set again keep their place, so that a file written back has the input's order.
    match choice {
        Choice::Recipe(recipe) => out.set(FILE_TYPE, Value::U32(recipe.file_type())),
        // The file's own type, as it was; a guess from its tensors when it had none.
        Choice::Restore(_) if out.contains(FILE_TYPE) => {}
        Choice::Restore(_) => out.set(FILE_TYPE, Value::U32(Recipe::Pure(dominant(&jobs)).file_type())),
    }
    // Required with quantized tensors; kept where the input had it (llama.cpp's converter
    // writes it for float files too).
    if jobs.iter().any(|job| job.ty.is_quantized()) {
        out.set(QUANTIZATION_VERSION, Value::U32(2));
    }
    // Written as made: the header from the plan, then each group of tensors quantized in
    // parallel and written in order, so that memory holds one group, not the file.
    let plan: Vec<PlannedTensor> = jobs
        .iter()
        .map(|job| PlannedTensor {
            name: job.name.to_string(),
            ty: job.ty,
            shape: job.shape.clone(),
            reads: if job.ty == job.stored { 0 } else { job.bytes },
        })
        .collect();
    let total: u64 = jobs.iter().map(|job| job.bytes).sum();
    let bar = progress_bar(total, "bytes");
    let failure: std::sync::Mutex<Option<CliError>> = std::sync::Mutex::new(None);
    let make = |at: usize| -> nnx::Result<GgmlTensor> {
        let Job { name, stored, ty, bytes, .. } = jobs[at];
        let fail = |error: nnx::Error| {
            let message = match expansion(&error) {
                Some(layout) => format!(
                    "cannot write `{name}` of `{}` as {ty}: {layout}: if the copy is meant, convert it to SafeTensors with `nnx convert --allow-expansion` first",
                    input.display()
                ),
                None => format!("cannot write `{name}` of `{}` as {ty}: {error}", input.display()),
            };
            failure.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get_or_insert(CliError(message));
            error
        };
        let tensor = if ty == stored {
            // Copied out of the input, so that its pages can go: the copy is what the window
            // counts for it.
            let kept = archive.ggml(name).map_err(fail)?;
            if kept.data.is_mapped() {
                let bytes = kept.bytes().map_err(fail)?;
                let data = nnx::Tensor::from_bytes(nnx::DType::U8, &[bytes.len()], &bytes).map_err(fail)?;
                drop(bytes);
                GgmlTensor { data, ..kept }
            } else {
                kept
            }
        } else {
            // Widened to f32 a few rows at a time by the quantizer, not here as a whole.
            let values = archive.try_get(name).map_err(fail)?;
            GgmlTensor::quantize(&values, ty).map_err(fail)?
        };
        // Done with the input's pages: resident memory stays at the tensors in hand.
        archive.release(name);
        bar.inc(bytes);
        Ok(tensor)
    };
    let (written, target) = match output.split {
        None => {
            (write_streaming(output.path, &out, None, &plan, STREAM_WINDOW, make), output.path.display().to_string())
        }
        Some(max_bytes) => {
            let dir = output.path.parent().filter(|dir| !dir.as_os_str().is_empty()).unwrap_or(Path::new("."));
            let base = output.path.file_stem().map_or_else(|| "model".into(), |stem| stem.to_string_lossy());
            let shards = Shards { dir, base: &base, max_bytes };
            match write_streaming_split(shards, &out, None, &plan, STREAM_WINDOW, make) {
                Ok(paths) => {
                    let first = paths.first().map(|path| path.display().to_string()).unwrap_or_default();
                    (Ok(()), format!("{} shards ({first} ...)", paths.len()))
                }
                Err(error) => (Err(error), String::new()),
            }
        }
    };
    bar.finish_and_clear();
    if let Err(error) = written {
        return Err(failure
            .into_inner()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .unwrap_or_else(|| error.into()));
    }
    let mut counts: BTreeMap<GgmlType, usize> = BTreeMap::new();
    for job in &jobs {
        *counts.entry(job.ty).or_default() += 1;
    }
    let counts: Vec<String> = counts.iter().map(|(ty, n)| format!("{n} {ty}")).collect();
    let mut summary = format!(
        "converted {} tensors from {} into {} ({}){}\n",
        names.len(),
        input.display(),
        target,
        counts.join(", "),
        growth(&jobs)
    );
    for (ty, count) in unwritable {
        summary.push_str(&format!(
            "note: {count} tensors were {ty} in the GGUF file `{}` was written from, a type nnx does not quantize to: they are written as {DEFAULT_TYPE}; pass `--type` to choose another\n",
            input.display()
        ));
    }
    Ok(summary)
}

/// One tensor to write.
struct Job<'a> {
    /// Its name.
    name: &'a str,
    /// The ggml type the input stores it as.
    stored: GgmlType,
    /// The type its values were quantized to before: the stored type, or the type of a GGUF
    /// file a SafeTensors input was decoded from.
    origin: GgmlType,
    /// The type it is written as.
    ty: GgmlType,
    /// Its shape.
    shape: Vec<usize>,
    /// Its bytes as a tensor, for the progress bar.
    bytes: u64,
}

/// Bytes of a tensor of `shape` stored as `ty` (rows that do not hold whole blocks counted as
/// if they did: only comparisons use it).
fn packed_bytes(ty: GgmlType, shape: &[usize]) -> f64 {
    let values: f64 = shape.iter().map(|&extent| extent as f64).product();
    values * ty.bits_per_weight() / 8.0
}

/// Prints a warning on stderr, as llama-quantize does, when tensors already quantized are
/// quantized again to another type: each quantization loses detail, and the second one adds
/// its error to the first. `decoded` says the input holds values decoded from those types.
fn warn_requantizing(jobs: &[Job<'_>], input: &Path, decoded: bool) {
    let mut changes: BTreeMap<(GgmlType, GgmlType), usize> = BTreeMap::new();
    for job in jobs.iter().filter(|job| job.origin.is_quantized() && job.ty.is_quantized() && job.ty != job.origin) {
        *changes.entry((job.origin, job.ty)).or_default() += 1;
    }
    if changes.is_empty() {
        return;
    }
    let changes: Vec<String> =
        changes.iter().map(|((from, to), count)| format!("{count} from {from} to {to}")).collect();
    let holds = if decoded { "holds values decoded from quantized types" } else { "is already quantized" };
    eprintln!(
        "nnx: warning: requantizing tensors of `{}` ({}): it {holds}, and quantizing again loses quality; quantize the original F32, F16 or BF16 weights instead where you have them",
        nnx::text::printable(&input.display().to_string()),
        changes.join(", ")
    );
}

/// Why the output's tensors take more bytes than the input's, for the summary line: the types
/// of more bits per weight they go to; empty when they take no more.
fn growth(jobs: &[Job<'_>]) -> String {
    let before: f64 = jobs.iter().map(|job| packed_bytes(job.stored, &job.shape)).sum();
    let after: f64 = jobs.iter().map(|job| packed_bytes(job.ty, &job.shape)).sum();
    if after <= before {
        return String::new();
    }
    let mut wider: BTreeMap<(GgmlType, GgmlType), usize> = BTreeMap::new();
    for job in jobs.iter().filter(|job| job.ty.bits_per_weight() > job.stored.bits_per_weight()) {
        *wider.entry((job.stored, job.ty)).or_default() += 1;
    }
    let reasons: Vec<String> = wider
        .iter()
        .map(|((from, to), count)| {
            format!(
                "{count} from {from} ({} bits per weight) to {to} ({})",
                from.bits_per_weight(),
                to.bits_per_weight()
            )
        })
        .collect();
    format!(
        "; larger than the input, {:.2} MB of tensors against {:.2} MB, as tensors go to types of more bits per weight: {}",
        after / 1e6,
        before / 1e6,
        reasons.join(", ")
    )
}

/// The type most of the quantizable tensors have, for a `general.file_type`.
fn dominant(jobs: &[Job<'_>]) -> GgmlType {
    let mut counts: BTreeMap<GgmlType, usize> = BTreeMap::new();
    for job in jobs.iter().filter(|job| may_quantize(job.name, &job.shape)) {
        *counts.entry(job.ty).or_default() += 1;
    }
    counts.into_iter().max_by_key(|&(_, count)| count).map_or(DEFAULT_TYPE, |(ty, _)| ty)
}

/// The layer of a `blk.N.` tensor; -1 for the others, which llama.cpp orders first.
fn layer_of(name: &str) -> i64 {
    name.strip_prefix("blk.").and_then(|rest| rest.split('.').next()?.parse().ok()).unwrap_or(-1)
}

/// What a SafeTensors file written from a GGUF file carries for the way back.
pub struct Carried {
    /// The GGUF metadata, with its value types and order.
    pub metadata: Metadata,
    /// The ggml type of each tensor stored in the GGUF file in a block type and decoded to
    /// floats, by name.
    pub types: BTreeMap<String, GgmlType>,
    /// The names of the GGUF file's tensors, in its order.
    pub order: Vec<String>,
}

/// The text of [`CARRIED`] for a SafeTensors file written from a GGUF file of `metadata` and
/// the tensors `names` (in its order), of which `decoded` were stored in those block types: a
/// JSON object with `metadata`, an array of `{"key", "type", "value"}` in file order (arrays
/// with an `element_type`, nested arrays as `{"element_type", "value"}`; floats as text, so
/// that every value comes back bit for bit), `tensor_types`, the type name of each decoded
/// tensor, and `tensor_order`, the names.
pub fn carry(metadata: &Metadata, names: &[&str], decoded: &[(&str, GgmlType)]) -> String {
    let entries: Vec<Json> = metadata
        .iter()
        .map(|(key, value)| {
            let mut entry = Map::new();
            entry.insert("key".into(), key.into());
            entry.insert("type".into(), value.value_type().name().into());
            if let Value::Array(array) = value {
                entry.insert("element_type".into(), array.element_type().name().into());
            }
            entry.insert("value".into(), value_json(value));
            Json::Object(entry)
        })
        .collect();
    let types: Map<String, Json> = decoded.iter().map(|(name, ty)| (name.to_string(), ty.name().into())).collect();
    let mut carried = Map::new();
    carried.insert("metadata".into(), Json::Array(entries));
    carried.insert("tensor_types".into(), Json::Object(types));
    carried.insert("tensor_order".into(), names.iter().map(|&name| Json::from(name)).collect());
    Json::Object(carried).to_string()
}

/// A value as JSON: integers, booleans and strings as they are, floats as their shortest text
/// (`"1e-5"`, `"NaN"`), arrays as their elements.
fn value_json(value: &Value) -> Json {
    match value {
        Value::U8(v) => (*v).into(),
        Value::I8(v) => (*v).into(),
        Value::U16(v) => (*v).into(),
        Value::I16(v) => (*v).into(),
        Value::U32(v) => (*v).into(),
        Value::I32(v) => (*v).into(),
        Value::U64(v) => (*v).into(),
        Value::I64(v) => (*v).into(),
        Value::F32(v) => format!("{v:?}").into(),
        Value::F64(v) => format!("{v:?}").into(),
        Value::Bool(v) => (*v).into(),
        Value::String(v) => v.as_str().into(),
        Value::Array(array) => (0..array.len())
            .filter_map(|at| array.get(at))
            .map(|element| match &element {
                Value::Array(inner) => {
                    let mut nested = Map::new();
                    nested.insert("element_type".into(), inner.element_type().name().into());
                    nested.insert("value".into(), value_json(&element));
                    Json::Object(nested)
                }
                scalar => value_json(scalar),
            })
            .collect(),
    }
}

/// What `archive` (read from `input`) carries under [`CARRIED`]; `None` when it has no such
/// key.
///
/// # Errors
/// A [`CliError`] naming the entry that is not what [`carry`] writes.
pub fn carried(archive: &Archive, input: &Path) -> Result<Option<Carried>, CliError> {
    let Some(text) = archive.metadata().get(CARRIED) else { return Ok(None) };
    let fail = |problem: String| {
        CliError(format!(
            "the `{CARRIED}` metadata of `{}` is not the GGUF metadata `nnx convert` writes: {problem}: convert the GGUF file to SafeTensors again, or remove the key",
            input.display()
        ))
    };
    let carried: Json = serde_json::from_str(text).map_err(|error| fail(format!("it is not JSON ({error})")))?;
    let entries = carried["metadata"].as_array().ok_or_else(|| fail("it has no `metadata` array".into()))?;
    let mut metadata = Metadata::new();
    for (at, entry) in entries.iter().enumerate() {
        let key = entry["key"].as_str().ok_or_else(|| fail(format!("entry {at} has no `key` string")))?;
        let typed = |field: &str| entry[field].as_str().and_then(value_type);
        let value = match typed("type") {
            Some(ValueType::Array) => typed("element_type").and_then(|element| array(element, &entry["value"])),
            Some(ty) => scalar(ty, &entry["value"]),
            None => None,
        };
        let value = value.ok_or_else(|| {
            fail(format!("entry `{key}` is not a `type` of GGUF with a `value` of that type: {entry}"))
        })?;
        metadata.set(key, value);
    }
    let mut types = BTreeMap::new();
    if let Some(named) = carried["tensor_types"].as_object() {
        for (name, ty) in named {
            let ty = ty
                .as_str()
                .and_then(GgmlType::from_name)
                .ok_or_else(|| fail(format!("tensor `{name}` has the type {ty}, which ggml does not name")))?;
            types.insert(name.clone(), ty);
        }
    }
    let order = match &carried["tensor_order"] {
        Json::Null => Vec::new(),
        names => names
            .as_array()
            .and_then(|names| names.iter().map(string).collect::<Option<Vec<String>>>())
            .ok_or_else(|| fail("its `tensor_order` is not an array of names".into()))?,
    };
    Ok(Some(Carried { metadata, types, order }))
}

/// The value type GGUF names `name` (`UINT32`).
fn value_type(name: &str) -> Option<ValueType> {
    (0..=12).filter_map(ValueType::from_id).find(|ty| ty.name() == name)
}

/// An integer of JSON that fits `T`.
fn integer<T: TryFrom<u64> + TryFrom<i64>>(json: &Json) -> Option<T> {
    match json.as_u64() {
        Some(value) => T::try_from(value).ok(),
        None => T::try_from(json.as_i64()?).ok(),
    }
}

/// A float written as text.
fn float<T: std::str::FromStr>(json: &Json) -> Option<T> {
    json.as_str()?.parse().ok()
}

/// A string.
fn string(json: &Json) -> Option<String> {
    json.as_str().map(str::to_string)
}

/// A scalar value of type `ty`; `None` when `json` is not one.
fn scalar(ty: ValueType, json: &Json) -> Option<Value> {
    Some(match ty {
        ValueType::U8 => Value::U8(integer(json)?),
        ValueType::I8 => Value::I8(integer(json)?),
        ValueType::U16 => Value::U16(integer(json)?),
        ValueType::I16 => Value::I16(integer(json)?),
        ValueType::U32 => Value::U32(integer(json)?),
        ValueType::I32 => Value::I32(integer(json)?),
        ValueType::U64 => Value::U64(integer(json)?),
        ValueType::I64 => Value::I64(integer(json)?),
        ValueType::F32 => Value::F32(float(json)?),
        ValueType::F64 => Value::F64(float(json)?),
        ValueType::Bool => Value::Bool(json.as_bool()?),
        ValueType::String => Value::String(string(json)?),
        ValueType::Array => return None,
    })
}

/// An array value of `element` elements; `None` when `json` is not one.
fn array(element: ValueType, json: &Json) -> Option<Value> {
    fn all<T>(items: &[Json], one: impl Fn(&Json) -> Option<T>) -> Option<Vec<T>> {
        items.iter().map(one).collect()
    }
    let items = json.as_array()?;
    let nested = |item: &Json| {
        let element = item["element_type"].as_str().and_then(value_type)?;
        match array(element, &item["value"])? {
            Value::Array(inner) => Some(inner),
            _ => None,
        }
    };
    Some(Value::Array(match element {
        ValueType::U8 => Array::U8(all(items, integer)?),
        ValueType::I8 => Array::I8(all(items, integer)?),
        ValueType::U16 => Array::U16(all(items, integer)?),
        ValueType::I16 => Array::I16(all(items, integer)?),
        ValueType::U32 => Array::U32(all(items, integer)?),
        ValueType::I32 => Array::I32(all(items, integer)?),
        ValueType::U64 => Array::U64(all(items, integer)?),
        ValueType::I64 => Array::I64(all(items, integer)?),
        ValueType::F32 => Array::F32(all(items, float)?),
        ValueType::F64 => Array::F64(all(items, float)?),
        ValueType::Bool => Array::Bool(all(items, Json::as_bool)?),
        ValueType::String => Array::String(all(items, string)?),
        ValueType::Array => Array::Array(all(items, nested)?),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn carried_metadata_comes_back_with_every_type_and_bit() {
        let mut metadata = Metadata::new();
        metadata.set("general.architecture", Value::String("llama".into()));
        metadata.set("a.u8", Value::U8(255));
        metadata.set("a.i8", Value::I8(-128));
        metadata.set("a.u16", Value::U16(65535));
        metadata.set("a.i16", Value::I16(-32768));
        metadata.set("a.u32", Value::U32(u32::MAX));
        metadata.set("a.i32", Value::I32(i32::MIN));
        metadata.set("a.u64", Value::U64(u64::MAX));
        metadata.set("a.i64", Value::I64(i64::MIN));
        metadata.set("a.f32", Value::F32(1e-5));
        metadata.set("a.f32_nan", Value::F32(f32::NAN));
        metadata.set("a.f64", Value::F64(0.1 + 0.2));
        metadata.set("a.bool", Value::Bool(true));
        metadata.set("a.scores", Value::Array(Array::F32(vec![-1.5, f32::INFINITY, f32::MIN_POSITIVE, 3.4e38])));
        metadata.set("a.tokens", Value::Array(Array::String(vec!["<s>".into(), "\"\\\n".into(), String::new()])));
        metadata.set("a.empty", Value::Array(Array::I32(Vec::new())));
        let nested = Array::Array(vec![Array::U32(vec![1, 2]), Array::String(vec!["x".into()]), Array::Array(vec![])]);
        metadata.set("a.nested", Value::Array(nested));
        metadata.set("a.last", Value::F64(-0.0));
        let names = ["token_embd.weight", "blk.0.attn_q.weight"];
        let text = carry(&metadata, &names, &[("blk.0.attn_q.weight", GgmlType::Q4_K)]);
        let mut archive = Archive::new();
        archive.set_metadata(CARRIED, text);
        let back = carried(&archive, Path::new("x.safetensors")).unwrap().unwrap();
        let keys = |metadata: &Metadata| metadata.iter().map(|(key, _)| key.to_string()).collect::<Vec<_>>();
        assert_eq!(keys(&back.metadata), keys(&metadata), "the keys and their order");
        for (key, value) in metadata.iter() {
            let found = back.metadata.get(key).unwrap();
            assert_eq!(found.value_type(), value.value_type(), "{key}");
            // Bit for bit, NaN and the sign of zero included.
            assert_eq!(format!("{found:?}"), format!("{value:?}"), "{key}");
        }
        assert_eq!(back.types.get("blk.0.attn_q.weight"), Some(&GgmlType::Q4_K));
        assert_eq!(back.order, names);
    }

    #[test]
    fn carried_metadata_that_is_not_what_convert_writes_is_refused_by_entry() {
        let refused = |text: &str| {
            let mut archive = Archive::new();
            archive.set_metadata(CARRIED, text);
            carried(&archive, Path::new("x.safetensors")).err().unwrap().0
        };
        assert!(refused("{").contains("not JSON"));
        assert!(refused(r#"{"metadata": 1}"#).contains("no `metadata` array"));
        let error = refused(r#"{"metadata": [{"key": "llama.block_count", "type": "UINT8", "value": 256}]}"#);
        assert!(error.contains("`llama.block_count`") && error.contains("convert the GGUF file"), "{error}");
        let error =
            refused(r#"{"metadata": [{"key": "k", "type": "ARRAY", "element_type": "FLOAT32", "value": [1]}]}"#);
        assert!(error.contains("`k`"), "{error}");
        let error = refused(r#"{"metadata": [], "tensor_types": {"w": "Q9_9"}}"#);
        assert!(error.contains("`w`"), "{error}");
        let error = refused(r#"{"metadata": [], "tensor_order": [1]}"#);
        assert!(error.contains("`tensor_order`"), "{error}");
    }
}
