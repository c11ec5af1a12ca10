//! The report of one checkpoint that `nnx inspect --json` prints and `nnx inspect --html`
//! draws: the files with their sha256, every entry with its type (dtype, ggml type or
//! quantized encoding), parameters and place in the model (block index and role), the
//! parameters and effective bits per weight of each type, a quantization map of blocks by
//! role, what was checked, the typed metadata and chat template, a memory plan (weights and KV
//! cache for a context and batch), and on request the statistics of every tensor and the
//! import plan into one of the architectures nnx builds.
//!
//! Everything is data from headers, except the sha256 of each file and the statistics, which
//! read the values. The page takes this object as it is, so the two never disagree.

use std::collections::{BTreeMap, HashMap};
use std::io::Read;
use std::path::{Path, PathBuf};

use nnx::gguf::{Array, Value as GgufValue};
use nnx::quantized::{EncodedWeight, QuantizedFolder};
use nnx::stats::TensorStats;
use nnx::{Archive, EntryInfo};
use rayon::prelude::*;
use serde_json::{Value, json};
use sha2::Digest;

use crate::common::CliError;

/// Array items kept in the report; longer arrays (a vocabulary) are cut and marked folded.
const ARRAY_ITEMS: usize = 64;

/// Context length of the memory plan when neither `--ctx` nor the model says one.
const DEFAULT_CTX: usize = 4096;

/// A tensor is noted as having outliers when a value lies this many standard deviations from
/// the mean (and the tensor is large enough for that to mean something). Trained language
/// models have such values (a few outlier features carry large magnitudes), so the note is
/// information, not a problem.
const OUTLIER_SIGMAS: f64 = 25.0;

/// The names `--model` takes: the families of `nnx::models::family` by name or `model_type`.
fn architectures() -> Vec<&'static str> {
    nnx::models::family::names()
}

/// The names a GGUF file is planned into (its blocks read as the floats they decode to): the
/// families whose models read llama.cpp's names.
fn gguf_architectures() -> Vec<&'static str> {
    let gguf = |name: &&str| nnx::models::family::from_name(name).is_some_and(|family| family.network.reads_gguf());
    architectures().into_iter().filter(gguf).collect()
}

/// The help of `--model`, from the family table.
pub fn model_help() -> String {
    format!(
        "Add the import plan into this architecture: {} (shaped by the files' own config; a GGUF file into {})",
        architectures().join(", "),
        gguf_architectures().join(", ")
    )
}

/// `names` as a list of code spans.
fn listed(names: &[&str]) -> String {
    names.iter().map(|name| format!("`{name}`")).collect::<Vec<_>>().join(", ")
}

/// The roles of the quantization map, in the order of a block's computation.
const ROLES: [&str; 24] = [
    "embed",
    "pos_embed",
    "attn_norm",
    "q",
    "k",
    "v",
    "qkv",
    "q_norm",
    "k_norm",
    "o",
    "mixer",
    "post_attn_norm",
    "ffn_norm",
    "gate",
    "up",
    "down",
    "router",
    "experts",
    "shared_expert",
    "post_ffn_norm",
    "per_layer",
    "norm",
    "output",
    "other",
];

/// What the report holds beyond the headers.
pub struct Options {
    /// Compute every tensor's statistics (reads all values).
    pub stats: bool,
    /// Plan the import into this architecture.
    pub model: Option<String>,
    /// The memory plan's context length (default: the model's, at most 4096).
    pub ctx: Option<usize>,
    /// The memory plan's batch.
    pub batch: usize,
    /// Show a progress bar while computing statistics.
    pub progress: bool,
}

/// One entry as the report lists it.
pub struct Entry {
    /// Name, dtype, shape, bytes and place in its file.
    pub info: EntryInfo,
    /// The dtype, ggml type or encoding.
    ty: String,
    /// Values of the weight (0 for the scales and biases of an encoded weight).
    parameters: u64,
    /// The encoded weight's main entry, for its other streams.
    part_of: Option<String>,
    layer: Option<usize>,
    role: &'static str,
}

/// The parameters, bytes and tensors of one type (a dtype, ggml type or encoding).
pub struct TypeTotal {
    /// The type's name (`F32`, `Q4_K`, `MLX affine 4-bit/64`).
    pub ty: String,
    /// Tensors of this type (an encoded weight counts once, whatever its streams).
    pub tensors: u64,
    /// Their values.
    pub parameters: u64,
    /// Their bytes, every stream included.
    pub bytes: u64,
}

impl TypeTotal {
    /// Bytes per value in bits; `None` when the type holds no values.
    pub fn bits_per_weight(&self) -> Option<f64> {
        bits_per_weight(self.bytes, self.parameters)
    }
}

/// The entries of a checkpoint, each with its type and parameters, and the totals: what the
/// text of `nnx inspect` summarises and the report holds.
pub struct Summary {
    /// Every entry, in the archive's order.
    pub entries: Vec<Entry>,
    /// Bytes of all entries.
    pub total_bytes: u64,
    /// Values of all weights (an encoded weight's, not its scales').
    pub parameters: u64,
    /// Per type, largest first.
    pub types: Vec<TypeTotal>,
}

impl Summary {
    /// Reads the headers of `archive`, opened from `path`: a quantized folder's weights merged
    /// with their streams, or, when its streams do not describe their weights, listed entry by
    /// entry (the listing shows what the files hold, however damaged).
    ///
    /// # Errors
    /// An entry that cannot be described.
    pub fn of(path: &Path, archive: &Archive) -> Result<Summary, CliError> {
        match crate::stats::quantized_folder(path, archive) {
            Ok(Some(folder)) => {
                Summary::with_folder(archive, Some(&folder)).or_else(|_| Summary::with_folder(archive, None))
            }
            _ => Summary::with_folder(archive, None),
        }
    }

    fn with_folder(archive: &Archive, folder: Option<&QuantizedFolder>) -> Result<Summary, CliError> {
        let entries = entries(archive, folder)?;
        // Sums saturate: a hostile header may describe entries whose sizes add past `u64::MAX`.
        let total_bytes = entries.iter().fold(0u64, |total, entry| total.saturating_add(entry.info.bytes as u64));
        let parameters = entries.iter().fold(0u64, |total, entry| total.saturating_add(entry.parameters));
        let types = type_totals(&entries);
        Ok(Summary { entries, total_bytes, parameters, types })
    }

    /// Bits per weight of the whole checkpoint; `None` when it holds no values.
    pub fn bits_per_weight(&self) -> Option<f64> {
        bits_per_weight(self.total_bytes, self.parameters)
    }
}

/// `bytes` spread over `parameters` values, in bits.
fn bits_per_weight(bytes: u64, parameters: u64) -> Option<f64> {
    (parameters > 0).then(|| bytes as f64 * 8.0 / parameters as f64)
}

/// The report of `archive`, opened from `path` (as the user named it: `source`).
pub fn build(source: &Path, path: &Path, archive: &Archive, options: &Options) -> Result<Value, CliError> {
    let folder = crate::stats::quantized_folder(path, archive)?;
    let Summary { entries, total_bytes, parameters, types } = Summary::with_folder(archive, folder.as_ref())?;
    let files = files(path, &entries)?;
    let mut validation = validate(archive, folder.as_ref(), &entries, &files);

    let stats = if options.stats {
        let mut collected = crate::stats::collect(path, archive, folder.as_ref(), options.progress)?;
        for stats in &mut collected {
            // An encoded weight's statistics are named by its stem; the page finds the entry.
            let weight = format!("{}.weight", stats.name);
            if !archive.contains(&stats.name) && archive.contains(&weight) {
                stats.name = weight;
            }
        }
        validation.extend(stats_findings(&collected));
        Some(collected.iter().map(stats_json).collect::<Vec<_>>())
    } else {
        None
    };
    let plan = match &options.model {
        Some(architecture) => {
            let plan = plan(path, archive, architecture)?;
            validation.push(plan.finding());
            Some(plan.json())
        }
        None => None,
    };
    // A GGUF file carries its own configuration; a `config.json` beside it may be another's.
    let config = if archive.gguf_metadata().is_some() { None } else { config_json(path, &mut validation) };
    let memory = memory_plan(archive, config.as_ref().map(|config| &config.value), total_bytes, options);

    let chat_template = chat_template(path, archive, &mut validation);
    let entry_values: Vec<Value> = entries.iter().map(|entry| entry_json(archive, path, entry)).collect();
    Ok(json!({
        "version": 1,
        "path": source.to_string_lossy(),
        "format": format_name(path, archive, folder.as_ref(), files.len()),
        "files": files,
        "count": entries.len(),
        "total_bytes": total_bytes,
        "parameters": parameters,
        "bits_per_weight": bits_per_weight(total_bytes, parameters),
        "types": types.iter().map(type_json).collect::<Vec<_>>(),
        "validation": validation,
        "entries": entry_values,
        "quant_map": quant_map(&entries),
        "stats": stats,
        "plan": plan,
        "memory": memory,
        "metadata": metadata(archive, config.as_ref()),
        "chat_template": chat_template,
    }))
}

/// The import plan into one architecture, as the report holds it and the text of `nnx
/// inspect --model` lists it.
pub struct Plan {
    /// The architecture planned for (`llama`).
    pub architecture: String,
    /// The model type it builds (`Llama`).
    pub target: String,
    /// Each model tensor with its entry, operations and types; a GGUF block type is shown as
    /// stored (`Q4_K`), not as the floats it decodes to.
    pub rows: Vec<nnx::PlanRow>,
    /// Entries the model does not read.
    pub unexpected: Vec<String>,
    /// Every problem.
    pub problems: Vec<String>,
}

impl Plan {
    /// The finding that sums the plan up: valid, or how many problems it has.
    pub fn finding(&self) -> Value {
        let (target, architecture) = (&self.target, &self.architecture);
        match self.problems.len() {
            0 => finding("ok", format!("the import plan into {target} ({architecture}) is valid")),
            problems => {
                finding("error", format!("the import plan into {target} ({architecture}) has {problems} problems"))
            }
        }
    }

    fn json(&self) -> Value {
        json!({
            "architecture": self.architecture,
            "target": self.target,
            "valid": self.problems.is_empty(),
            "rows": self.rows,
            "unexpected": self.unexpected,
            "problems": self.problems,
        })
    }
}

/// Checks a `--model` value against the family table, before any file is read.
///
/// # Errors
/// A name nnx plans no import into, with the nearest name and every name.
pub fn parse_architecture(text: &str) -> Result<String, String> {
    let names = architectures();
    if names.contains(&text) {
        return Ok(text.to_string());
    }
    let near = nearest_architecture(text, &names);
    Err(format!(
        "`{text}` is not an architecture nnx plans imports into{}: give one of {}",
        nnx::error::DidYouMean(near.as_deref()),
        listed(&names)
    ))
}

/// The architecture `text` likely means: the same name in other case, a name a small edit
/// away, or one with two neighbouring letters swapped (`bret`), which an edit distance counts
/// as two edits.
fn nearest_architecture(text: &str, names: &[&str]) -> Option<String> {
    let lower = text.to_ascii_lowercase();
    if names.contains(&lower.as_str()) {
        return Some(lower);
    }
    nnx::__private::suggest(&lower, names.iter().copied())
        .or_else(|| names.iter().find(|name| swapped_neighbours(&lower, name)).map(|name| name.to_string()))
}

/// Whether `a` is `b` with two neighbouring characters swapped.
fn swapped_neighbours(a: &str, b: &str) -> bool {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    let differ: Vec<usize> = (0..a.len().min(b.len())).filter(|&at| a[at] != b[at]).collect();
    a.len() == b.len() && matches!(differ[..], [i, j] if j == i + 1 && a[i] == b[j] && a[j] == b[i])
}

/// The plan of importing the checkpoint at `path` (opened as `archive`) into `architecture`
/// (a name of the family table).
///
/// # Errors
/// An architecture a GGUF file is not planned into; the errors of
/// [`nnx::models::import_plan`] (a configuration it cannot read, files it cannot open).
pub fn plan(path: &Path, archive: &Archive, architecture: &str) -> Result<Plan, CliError> {
    let gguf = gguf_architectures();
    if archive.gguf_metadata().is_some() && !gguf.contains(&architecture) {
        return Err(CliError(format!(
            "`--model {architecture}` plans the import of a transformers folder: a GGUF file is planned into {}; give one of these, or the folder with `config.json`",
            listed(&gguf)
        )));
    }
    let (architecture, plan) = nnx::models::import_plan(&path.to_string_lossy(), Some(architecture))?;
    let mut rows = plan.rows();
    for row in &mut rows {
        // The plan reads a GGUF block as the floats it decodes to; the row says what is stored.
        if row.stored_dtype.is_some()
            && let Some(ty) = archive.ggml_type(&row.source)
        {
            row.stored_dtype = Some(ty.name().to_string());
        }
    }
    Ok(Plan {
        architecture,
        target: plan.target().to_string(),
        rows,
        unexpected: plan.unused().to_vec(),
        problems: plan.problems().iter().map(ToString::to_string).collect(),
    })
}

/// Every entry of `archive` with its type, parameters, block and role; the streams of each of
/// `folder`'s encoded weights merged into its main entry.
fn entries(archive: &Archive, folder: Option<&QuantizedFolder>) -> Result<Vec<Entry>, CliError> {
    // The streams of each encoded weight: its main entry carries the values, the others are
    // part of it.
    let mut encoded: HashMap<String, (String, String, u64)> = HashMap::new();
    if let Some(folder) = folder {
        for name in folder.weights() {
            let weight = folder.weight(&name)?;
            let values = match &weight {
                EncodedWeight::Float(_) => continue,
                EncodedWeight::Affine(_) => {
                    let info = archive.info(&format!("{name}.weight"))?;
                    let bits = match weight.encoding() {
                        nnx::quantized::WeightEncoding::Affine(spec) => spec.bits as u64,
                        _ => 32,
                    };
                    values_of(&info.shape).saturating_mul(32) / bits.max(1)
                }
                EncodedWeight::Seed(seed) => values_of(&seed.shape()),
            };
            let streams = folder.streams_of(&name);
            let main = streams.iter().find(|stream| stream.ends_with(".weight")).unwrap_or(&streams[0]).clone();
            let ty = crate::stats::encoding_name(weight.encoding());
            for stream in streams {
                encoded.insert(stream, (main.clone(), ty.clone(), values));
            }
        }
    }
    let names: Vec<&str> = archive.names().collect();
    let gemma_norms =
        names.iter().any(|name| name.contains("pre_feedforward_layernorm") || name.contains("post_ffw_norm"));
    names
        .iter()
        .map(|name| {
            let info = archive.info(name)?;
            let values = values_of(&info.shape);
            let (ty, parameters, part_of) = match (encoded.get(*name), archive.ggml_type(name)) {
                (Some((main, ty, values)), _) if main == name => (ty.clone(), *values, None),
                (Some((main, ty, _)), _) => (ty.clone(), 0, Some(main.clone())),
                (None, Some(ggml)) => (ggml.name().to_string(), values, None),
                // A published checkpoint's weight, decoded when read: named by its scheme, its
                // bytes those of its streams.
                (None, None) => (archive.encoding(name).unwrap_or_else(|| info.dtype.to_string()), values, None),
            };
            let (layer, rest) = split_layer(part_of.as_deref().unwrap_or(name));
            let role = role(layer.is_some(), &rest, gemma_norms);
            Ok(Entry { info, ty, parameters, part_of, layer, role })
        })
        .collect()
}

/// The values a shape holds, saturating at `u64::MAX` (a header may describe more than any
/// file holds: the report counts them without overflowing).
fn values_of(shape: &[usize]) -> u64 {
    if shape.contains(&0) {
        return 0;
    }
    shape.iter().fold(1u64, |product, &size| product.saturating_mul(size as u64))
}

/// The block index of a tensor path (`layers.3`, `blk.3`, `h.3`, `layer.3`, `blocks.3`) and
/// the rest of the path after it.
fn split_layer(name: &str) -> (Option<usize>, String) {
    let segments: Vec<&str> = name.split('.').collect();
    for (at, pair) in segments.windows(2).enumerate() {
        if matches!(pair[0], "layers" | "blk" | "h" | "layer" | "blocks" | "block")
            && let Ok(index) = pair[1].parse::<usize>()
        {
            return (Some(index), segments[at + 2..].join("."));
        }
    }
    (None, name.to_string())
}

/// The role of a tensor in its block (or outside blocks) from the names llama.cpp,
/// transformers and mlx-lm give.
fn role(in_block: bool, rest: &str, gemma_norms: bool) -> &'static str {
    let segments: Vec<&str> = rest.split('.').collect();
    let has = |names: &[&str]| segments.iter().any(|segment| names.contains(segment));
    let last_stem = segments.iter().rev().find(|segment| !matches!(**segment, "weight" | "bias")).copied();
    if !in_block {
        return match last_stem {
            Some("token_embd" | "embed_tokens" | "wte" | "word_embeddings" | "tok_embeddings") => "embed",
            Some("wpe" | "position_embeddings" | "token_type_embeddings") => "pos_embed",
            Some("output" | "lm_head") => "output",
            Some("output_norm" | "norm" | "ln_f" | "final_layernorm" | "final_norm") => "norm",
            _ => "other",
        };
    }
    let attention = has(&["attn", "self_attn", "attention"]);
    // A hybrid's recurrent layers (Qwen3.5's Gated DeltaNet: `linear_attn.*`, llama.cpp's
    // `ssm_*` and the output gate `attn_gate`), a mixture's router, experts and shared
    // expert, and Gemma 4's per-layer embedding inputs: the map shows each layer's kind.
    let stem = last_stem.unwrap_or_default();
    if has(&["linear_attn"]) || stem.starts_with("ssm_") || stem == "attn_gate" {
        return "mixer";
    }
    if stem.ends_with("_shexp") || has(&["shared_expert", "shared_expert_gate"]) {
        return "shared_expert";
    }
    if stem == "ffn_gate_inp" || has(&["router"]) {
        return "router";
    }
    if stem.ends_with("_exps") || has(&["experts"]) {
        return "experts";
    }
    if matches!(
        stem,
        "inp_gate"
            | "proj"
            | "post_norm"
            | "per_layer_input_gate"
            | "per_layer_projection"
            | "post_per_layer_input_norm"
    ) {
        return "per_layer";
    }
    match last_stem {
        Some("q_norm" | "attn_q_norm") => "q_norm",
        Some("k_norm" | "attn_k_norm") => "k_norm",
        Some("attn_qkv" | "c_attn" | "qkv_proj" | "query_key_value" | "wqkv") => "qkv",
        Some("attn_q" | "q_proj" | "query" | "wq" | "q") => "q",
        Some("attn_k" | "k_proj" | "key" | "wk" | "k") => "k",
        Some("attn_v" | "v_proj" | "value" | "wv" | "v") => "v",
        Some("attn_output" | "o_proj" | "out_proj" | "wo" | "o") => "o",
        Some("c_proj" | "dense") if attention => "o",
        Some("ffn_gate" | "gate_proj" | "w1" | "gate") => "gate",
        Some("ffn_up" | "up_proj" | "c_fc" | "fc1" | "w3" | "up") => "up",
        Some("dense") if has(&["intermediate"]) => "up",
        Some("ffn_down" | "down_proj" | "fc2" | "w2" | "c_proj" | "dense" | "down") => "down",
        Some("input_layernorm" | "attn_norm" | "ln_1" | "attention_norm") => "attn_norm",
        Some("LayerNorm") if attention => "attn_norm",
        Some("post_attention_layernorm") if gemma_norms => "post_attn_norm",
        Some("post_attention_norm") => "post_attn_norm",
        Some("post_attention_layernorm" | "ffn_norm" | "ln_2" | "pre_feedforward_layernorm" | "LayerNorm") => {
            "ffn_norm"
        }
        Some("post_feedforward_layernorm" | "post_ffw_norm") => "post_ffn_norm",
        _ => "other",
    }
}

/// Each file of the checkpoint with its size and sha256 (`null` for remote files, which
/// would have to be downloaded whole).
fn files(path: &Path, entries: &[Entry]) -> Result<Vec<Value>, CliError> {
    let mut paths: Vec<PathBuf> = Vec::new();
    for entry in entries {
        if let Some(location) = &entry.info.location
            && !paths.contains(&location.path)
        {
            paths.push(location.path.clone());
        }
    }
    if paths.is_empty() && path.is_file() {
        paths.push(path.to_path_buf());
    }
    // The pieces of a training checkpoint are assembled from many files: all of them.
    if paths.is_empty() && nnx::sniff::training_checkpoint(path).is_some() {
        folder_files(path, &mut paths, 0)?;
        paths.sort();
    }
    let base = if path.is_dir() { path } else { path.parent().unwrap_or(Path::new("")) };
    paths
        .par_iter()
        .map(|file| {
            let name = file.strip_prefix(base).unwrap_or(file).to_string_lossy().into_owned();
            if !file.is_file() {
                return Ok(json!({ "name": name, "bytes": null, "sha256": null }));
            }
            let (bytes, sha256) =
                sha256(file).map_err(|source| nnx::Error::Io { action: "read", path: file.clone(), source })?;
            Ok(json!({ "name": name, "bytes": bytes, "sha256": sha256 }))
        })
        .collect()
}

/// The files under `dir`, down to a depth no checkpoint reaches and up to a count none has.
fn folder_files(dir: &Path, paths: &mut Vec<PathBuf>, depth: usize) -> Result<(), CliError> {
    const MAX_FILES: usize = 1 << 20;
    if depth > 16 {
        return Ok(());
    }
    let list =
        std::fs::read_dir(dir).map_err(|source| nnx::Error::Io { action: "list", path: dir.to_path_buf(), source })?;
    for item in list.flatten() {
        let (path, kind) = (item.path(), item.file_type());
        if paths.len() >= MAX_FILES {
            break;
        }
        match kind {
            Ok(kind) if kind.is_dir() => folder_files(&path, paths, depth + 1)?,
            Ok(kind) if kind.is_file() => paths.push(path),
            _ => {}
        }
    }
    Ok(())
}

/// The size and hex sha256 of a file, read in 1 MiB pieces.
fn sha256(path: &Path) -> std::io::Result<(u64, String)> {
    let mut file = std::fs::File::open(path)?;
    let mut hasher = sha2::Sha256::new();
    let mut buffer = vec![0u8; 1 << 20];
    let mut bytes = 0u64;
    loop {
        let read = file.read(&mut buffer)?;
        if read == 0 {
            break;
        }
        bytes += read as u64;
        hasher.update(&buffer[..read]);
    }
    let digest = hasher.finalize();
    Ok((bytes, digest.iter().map(|byte| format!("{byte:02x}")).collect()))
}

fn format_name(path: &Path, archive: &Archive, folder: Option<&QuantizedFolder>, files: usize) -> String {
    if archive.gguf_metadata().is_some() {
        return if files > 1 { format!("GGUF ({files} splits)") } else { "GGUF".to_string() };
    }
    if let Some(kind) = nnx::sniff::training_checkpoint(path) {
        return format!("{} ({files} files)", kind.name());
    }
    if let Some(folder) = folder {
        let seed = folder.archive().names().any(|name| name.ends_with(".seeds"));
        return if seed { "SEED folder (SafeTensors)" } else { "MLX affine folder (SafeTensors)" }.to_string();
    }
    let extension = path.extension().and_then(|extension| extension.to_str()).unwrap_or_default();
    if matches!(extension, "pt" | "pth" | "bin" | "ckpt") {
        return "PyTorch checkpoint".to_string();
    }
    if files > 1 { format!("SafeTensors ({files} shards)") } else { "SafeTensors".to_string() }
}

fn finding(level: &str, message: String) -> Value {
    json!({ "level": level, "message": message })
}

/// What opening checked, and what the encoded weights' streams say.
fn validate(archive: &Archive, folder: Option<&QuantizedFolder>, entries: &[Entry], files: &[Value]) -> Vec<Value> {
    let mut findings = Vec::new();
    let what = if archive.gguf_metadata().is_some() { "ggml type, shape" } else { "dtype, shape" };
    findings.push(finding(
        "ok",
        format!(
            "{} entries in {} file(s): every entry's {what} and byte range read from the headers and checked against its file",
            entries.len(),
            files.len()
        ),
    ));
    if let Some(folder) = folder {
        let (mut good, mut bad) = (0, Vec::new());
        for entry in entries.iter().filter(|entry| entry.part_of.is_none() && entry.ty != entry.info.dtype.to_string())
        {
            let stem = entry.info.name.rsplit_once('.').map_or(entry.info.name.as_str(), |(stem, _)| stem);
            match folder.encoding(stem) {
                Ok(_) => good += 1,
                Err(error) => bad.push(error.to_string()),
            }
        }
        findings.push(finding("ok", format!("{good} quantized weights: their streams fit each other")));
        findings.extend(bad.into_iter().map(|message| finding("error", message)));
    }
    let empty: Vec<&str> =
        entries.iter().filter(|entry| entry.info.shape.contains(&0)).map(|entry| entry.info.name.as_str()).collect();
    if !empty.is_empty() {
        findings.push(finding("warning", format!("{} entries hold no values: {}", empty.len(), first_ten(&empty))));
    }
    findings
}

/// Per type: tensors, parameters and bytes, largest first.
fn type_totals(entries: &[Entry]) -> Vec<TypeTotal> {
    let mut by_type: BTreeMap<&str, (u64, u64, u64)> = BTreeMap::new();
    for entry in entries {
        let row = by_type.entry(&entry.ty).or_default();
        row.0 += u64::from(entry.part_of.is_none());
        row.1 = row.1.saturating_add(entry.parameters);
        row.2 = row.2.saturating_add(entry.info.bytes as u64);
    }
    let mut rows: Vec<TypeTotal> = by_type
        .into_iter()
        .map(|(ty, (tensors, parameters, bytes))| TypeTotal { ty: ty.to_string(), tensors, parameters, bytes })
        .collect();
    rows.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.ty.cmp(&b.ty)));
    rows
}

fn type_json(total: &TypeTotal) -> Value {
    json!({
        "type": total.ty,
        "tensors": total.tensors,
        "parameters": total.parameters,
        "bytes": total.bytes,
        "bits_per_weight": total.bits_per_weight(),
    })
}

fn entry_json(archive: &Archive, path: &Path, entry: &Entry) -> Value {
    let info = &entry.info;
    let mut value = json!({
        "name": info.name,
        "type": entry.ty,
        "dtype": info.dtype.to_string(),
        "shape": info.shape,
        "parameters": entry.parameters,
        "bytes": info.bytes,
        "layer": entry.layer,
        "role": entry.role,
        "part_of": entry.part_of,
    });
    if let Some(ty) = archive.ggml_type(&info.name) {
        value["ggml_type"] = json!(ty.name());
        value["bits_per_weight"] = json!(ty.bits_per_weight());
    }
    if let Some(location) = &info.location {
        let base = if path.is_dir() { path } else { path.parent().unwrap_or(Path::new("")) };
        value["file"] = json!(location.path.strip_prefix(base).unwrap_or(&location.path).to_string_lossy());
        value["data_offsets"] = json!([location.data_offsets.0, location.data_offsets.1]);
        value["file_offset"] = json!(location.file_offset);
    }
    value
}

/// One cell per block and role (the first weight found there), and the roles present.
fn quant_map(entries: &[Entry]) -> Value {
    // The bytes of each encoded weight's other streams, which its bits per weight include.
    let mut parts: HashMap<&str, u64> = HashMap::new();
    for entry in entries {
        if let Some(main) = &entry.part_of {
            let part = parts.entry(main).or_default();
            *part = part.saturating_add(entry.info.bytes as u64);
        }
    }
    let mut cells = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for entry in entries {
        let name = &entry.info.name;
        let weight = !name.ends_with(".bias") && entry.part_of.is_none() && entry.parameters > 0;
        if weight && seen.insert((entry.layer, entry.role)) {
            let bytes = (entry.info.bytes as u64).saturating_add(parts.get(name.as_str()).copied().unwrap_or(0));
            cells.push(json!({
                "layer": entry.layer,
                "role": entry.role,
                "type": entry.ty,
                "tensor": name,
                "bits_per_weight": bytes as f64 * 8.0 / entry.parameters as f64,
            }));
        }
    }
    let roles: Vec<&str> = ROLES.iter().copied().filter(|role| seen.iter().any(|(_, seen)| seen == role)).collect();
    // Block indices come from names: one past the largest, which a hostile name makes huge (the
    // page draws only the blocks that have cells when they are sparse).
    let layers = entries.iter().filter_map(|entry| entry.layer).max().map_or(0, |last| last.saturating_add(1));
    json!({ "roles": roles, "layers": layers, "cells": cells })
}

/// A tensor's statistics with what is wrong with it (`problem`: NaN, infinities, a weight of
/// zeros) and its far tails (`outlier`, a note).
fn stats_json(stats: &TensorStats) -> Value {
    let mut value = serde_json::to_value(stats).expect("stats serialize");
    value["problem"] = json!(stats.problem());
    value["outlier"] = json!(outlier(stats));
    value
}

/// The value of a tensor that lies far in its tails, when one does: [`OUTLIER_SIGMAS`] or
/// more standard deviations from the mean, in a tensor of 1024 values or more.
fn outlier(stats: &TensorStats) -> Option<String> {
    let (sigmas, value) = stats.farthest()?;
    (stats.count >= 1024 && sigmas >= OUTLIER_SIGMAS)
        .then(|| format!("value {value:.4} lies {sigmas:.0} std from the mean"))
}

/// The first ten of `items`, joined, and how many more there are: a finding names a few and
/// counts the rest, however many tensors it is about.
fn first_ten(items: &[impl std::fmt::Display]) -> String {
    let listed = items.iter().take(10).map(ToString::to_string).collect::<Vec<_>>().join(", ");
    if items.len() > 10 { format!("{listed} and {} more", items.len() - 10) } else { listed }
}

/// What the statistics found, each kind in one finding that names the first tensors: NaN or
/// infinities (errors), weights of zeros (warnings), and as information the biases and norms
/// that are zeros and the tensors with far tails, both usual in trained models.
pub fn stats_findings(stats: &[TensorStats]) -> Vec<Value> {
    let named = |names: Vec<String>| first_ten(&names);
    let quoted = |stats: &TensorStats| format!("`{}`", stats.name);
    let broken: Vec<String> = stats
        .iter()
        .filter(|stats| stats.nans > 0 || stats.infs > 0)
        .map(|stats| format!("{} ({} NaN, {} infinite)", quoted(stats), stats.nans, stats.infs))
        .collect();
    let zeros: Vec<String> =
        stats.iter().filter(|stats| stats.problem().as_deref() == Some("all zeros")).map(quoted).collect();
    let zero_vectors: Vec<String> =
        stats.iter().filter(|stats| stats.all_zeros() && stats.zeros_are_normal()).map(quoted).collect();
    let tails: Vec<String> = stats.iter().filter(|stats| outlier(stats).is_some()).map(quoted).collect();
    let mut findings = Vec::new();
    if !broken.is_empty() {
        findings
            .push(finding("error", format!("{} tensors hold NaN or infinite values: {}", broken.len(), named(broken))));
    }
    if !zeros.is_empty() {
        findings.push(finding("warning", format!("{} tensors are all zeros: {}", zeros.len(), named(zeros))));
    }
    if findings.is_empty() {
        findings
            .push(finding("ok", format!("{} tensors: no NaN, no infinities, no weight matrix of zeros", stats.len())));
    }
    if !zero_vectors.is_empty() {
        findings.push(finding(
            "info",
            format!(
                "{} biases or norm vectors are all zeros, as a trained model may have them: {}",
                zero_vectors.len(),
                named(zero_vectors)
            ),
        ));
    }
    if !tails.is_empty() {
        findings.push(finding(
            "info",
            format!(
                "{} tensors have values {OUTLIER_SIGMAS} or more std from their mean, as trained language models have (a few outlier features): {}",
                tails.len(),
                named(tails)
            ),
        ));
    }
    findings
}

/// Nodes (scalars, arrays, objects) kept from a configuration file: far more than any model's
/// `config.json` has, so that a file of millions of tiny values is summarised, not built whole.
const CONFIG_NODES: usize = 1 << 16;

/// A configuration file as the report shows it: its top-level keys with their values, arrays
/// cut to [`ARRAY_ITEMS`] items (at any depth), and what was left out.
struct Config {
    /// The object, cut.
    value: Value,
    /// The length of each top-level array, before it was cut.
    lengths: HashMap<String, usize>,
    /// Top-level keys left out once [`CONFIG_NODES`] were kept.
    omitted: usize,
}

/// The text of the configuration file `file`, within the size limit of configurations, or
/// `None` when there is none; a file that cannot be read or is too large adds a warning to
/// `findings` and is left out.
fn config_text(file: &Path, findings: &mut Vec<Value>) -> Option<String> {
    if !file.is_file() {
        return None;
    }
    match nnx::config::read_text(file) {
        Ok(text) => Some(text),
        Err(error) => {
            findings.push(finding("warning", format!("{error}: left out of the report")));
            None
        }
    }
}

/// `config.json` of a folder, or beside a file, read within the size limit of configurations
/// and parsed bounded (see [`Config`]); a file too large or not JSON adds a warning to
/// `findings` and is left out.
fn config_json(path: &Path, findings: &mut Vec<Value>) -> Option<Config> {
    let dir = if path.is_dir() { path } else { path.parent()? };
    let file = dir.join("config.json");
    let text = config_text(&file, findings)?;
    let budget = std::cell::Cell::new(CONFIG_NODES);
    let mut deserializer = serde_json::Deserializer::from_str(&text);
    let parsed = serde::de::DeserializeSeed::deserialize(TopLevel { budget: &budget }, &mut deserializer)
        .and_then(|config| deserializer.end().map(|()| config));
    match parsed {
        Ok(config) => {
            if config.omitted > 0 {
                findings.push(finding(
                    "warning",
                    format!(
                        "`{}` holds more than {CONFIG_NODES} values: {} top-level keys after them are left out of the report",
                        file.display(),
                        config.omitted
                    ),
                ));
            }
            Some(config)
        }
        Err(error) => {
            findings.push(finding(
                "warning",
                format!("`{}` is not valid JSON ({error}): left out of the report", file.display()),
            ));
            None
        }
    }
}

/// Parses the top level of a configuration into a [`Config`].
struct TopLevel<'a> {
    budget: &'a std::cell::Cell<usize>,
}

impl<'de> serde::de::DeserializeSeed<'de> for TopLevel<'_> {
    type Value = Config;

    fn deserialize<D: serde::Deserializer<'de>>(self, deserializer: D) -> Result<Config, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for TopLevel<'_> {
    type Value = Config;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Config, A::Error> {
        let mut config = Config { value: Value::Object(serde_json::Map::new()), lengths: HashMap::new(), omitted: 0 };
        let mut object = serde_json::Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if !take(self.budget) {
                map.next_value::<serde::de::IgnoredAny>()?;
                config.omitted += 1;
                continue;
            }
            let (value, length) = map.next_value_seed(Bounded { budget: self.budget })?;
            if let Some(length) = length {
                config.lengths.insert(key.clone(), length);
            }
            object.insert(key, value);
        }
        config.value = Value::Object(object);
        Ok(config)
    }

    // Not an object: no keys to show, and nothing kept.
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Config, A::Error> {
        while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
        Ok(Config { value: Value::Null, lengths: HashMap::new(), omitted: 0 })
    }

    fn visit_bool<E>(self, _: bool) -> Result<Config, E> {
        Ok(Config { value: Value::Null, lengths: HashMap::new(), omitted: 0 })
    }

    fn visit_i64<E>(self, _: i64) -> Result<Config, E> {
        Ok(Config { value: Value::Null, lengths: HashMap::new(), omitted: 0 })
    }

    fn visit_u64<E>(self, _: u64) -> Result<Config, E> {
        Ok(Config { value: Value::Null, lengths: HashMap::new(), omitted: 0 })
    }

    fn visit_f64<E>(self, _: f64) -> Result<Config, E> {
        Ok(Config { value: Value::Null, lengths: HashMap::new(), omitted: 0 })
    }

    fn visit_str<E>(self, _: &str) -> Result<Config, E> {
        Ok(Config { value: Value::Null, lengths: HashMap::new(), omitted: 0 })
    }

    fn visit_unit<E>(self) -> Result<Config, E> {
        Ok(Config { value: Value::Null, lengths: HashMap::new(), omitted: 0 })
    }
}

/// Takes one node from `budget`; `false` once it is spent.
fn take(budget: &std::cell::Cell<usize>) -> bool {
    let left = budget.get();
    budget.set(left.saturating_sub(1));
    left > 0
}

/// Parses one JSON value into a [`Value`] with arrays cut to [`ARRAY_ITEMS`] items and at most
/// the nodes left in `budget`; what is not kept is skipped unbuilt ([`serde::de::IgnoredAny`]).
/// Gives the value and, for an array, its length before the cut.
struct Bounded<'a> {
    budget: &'a std::cell::Cell<usize>,
}

impl<'de> serde::de::DeserializeSeed<'de> for Bounded<'_> {
    type Value = (Value, Option<usize>);

    fn deserialize<D: serde::Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for Bounded<'_> {
    type Value = (Value, Option<usize>);

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, value: bool) -> Result<Self::Value, E> {
        Ok((Value::Bool(value), None))
    }

    fn visit_i64<E>(self, value: i64) -> Result<Self::Value, E> {
        Ok((json!(value), None))
    }

    fn visit_u64<E>(self, value: u64) -> Result<Self::Value, E> {
        Ok((json!(value), None))
    }

    fn visit_f64<E>(self, value: f64) -> Result<Self::Value, E> {
        Ok((json!(value), None))
    }

    fn visit_str<E>(self, value: &str) -> Result<Self::Value, E> {
        Ok((Value::String(value.to_string()), None))
    }

    fn visit_string<E>(self, value: String) -> Result<Self::Value, E> {
        Ok((Value::String(value), None))
    }

    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok((Value::Null, None))
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let (mut items, mut length) = (Vec::new(), 0usize);
        loop {
            let more = if items.len() < ARRAY_ITEMS && take(self.budget) {
                seq.next_element_seed(Bounded { budget: self.budget })?.map(|(item, _)| items.push(item)).is_some()
            } else {
                seq.next_element::<serde::de::IgnoredAny>()?.is_some()
            };
            if !more {
                break;
            }
            length += 1;
        }
        Ok((Value::Array(items), Some(length)))
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut object = serde_json::Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if take(self.budget) {
                let (value, _) = map.next_value_seed(Bounded { budget: self.budget })?;
                object.insert(key, value);
            } else {
                map.next_value::<serde::de::IgnoredAny>()?;
            }
        }
        Ok((Value::Object(object), None))
    }
}

/// Weights plus KV cache for the context and batch asked for, from the GGUF keys or
/// `config.json` (its `text_config` for multimodal models).
fn memory_plan(archive: &Archive, config: Option<&Value>, weights: u64, options: &Options) -> Option<Value> {
    let (source, architecture, layers, kv_heads, key_dim, value_dim, context) = if let Some(metadata) =
        archive.gguf_metadata()
    {
        let arch = metadata.architecture()?.to_string();
        let key = |name: &str| metadata.u64(&format!("{arch}.{name}"));
        let layers = key("block_count")?;
        let heads = key("attention.head_count")?;
        let embedding = key("embedding_length")?;
        let kv_heads = key("attention.head_count_kv").unwrap_or(heads);
        let key_dim = key("attention.key_length").unwrap_or(embedding / heads.max(1));
        let value_dim = key("attention.value_length").unwrap_or(key_dim);
        let context = key("context_length");
        ("GGUF keys", arch.clone(), layers, kv_heads, key_dim, value_dim, context)
    } else {
        let config = config?;
        let encoder = config.get("model_type").and_then(Value::as_str).is_some_and(|kind| {
            let ours = nnx::models::family::from_model_type(kind);
            ours.is_some_and(|family| !family.generates()) || nnx::models::family::ENCODERS.contains(&kind)
        });
        if encoder {
            // An encoder keeps no cache between calls.
            return None;
        }
        let text = config.get("text_config").filter(|text| text.get("num_hidden_layers").is_some()).unwrap_or(config);
        let number = |names: &[&str]| names.iter().find_map(|name| text.get(*name).and_then(Value::as_u64));
        let layers = number(&["num_hidden_layers", "n_layer", "num_layers"])?;
        let heads = number(&["num_attention_heads", "n_head"])?;
        let hidden = number(&["hidden_size", "n_embd", "d_model"])?;
        let kv_heads = number(&["num_key_value_heads"]).unwrap_or(heads);
        let head_dim = number(&["head_dim"]).unwrap_or(hidden / heads.max(1));
        let architecture = config.get("model_type").and_then(Value::as_str).unwrap_or_default().to_string();
        let context = number(&["max_position_embeddings", "n_positions", "n_ctx"]);
        ("config.json", architecture, layers, kv_heads, head_dim, head_dim, context)
    };
    let ctx = options.ctx.unwrap_or_else(|| context.map_or(DEFAULT_CTX, |context| (context as usize).min(DEFAULT_CTX)));
    let recurrent = recurrent_layers(archive, config, layers);
    let attention_layers = recurrent.as_ref().map_or(layers, |(count, _)| layers.saturating_sub(*count));
    // Saturating: the keys come from the file, and a hostile one describes any size.
    let values = [ctx as u64, options.batch as u64, kv_heads, key_dim.saturating_add(value_dim)]
        .iter()
        .fold(attention_layers, |product, &factor| product.saturating_mul(factor));
    let state_bytes =
        recurrent.as_ref().map_or(0, |(_, per_sequence)| per_sequence.saturating_mul(options.batch as u64));
    let kv = [(nnx::DType::F32, "nnx's cache"), (nnx::DType::F16, "llama.cpp's default cache type")];
    let kv: Vec<Value> = kv
        .iter()
        .map(|(dtype, note)| json!({ "dtype": dtype.to_string(), "bytes": dtype.storage_bytes(values).unwrap_or(0), "note": note }))
        .collect();
    let experts = experts(archive, config);
    Some(json!({
        "source": source,
        "architecture": architecture,
        "experts": experts,
        "ctx": ctx,
        "batch": options.batch,
        "context_length": context,
        "layers": layers,
        "kv_heads": kv_heads,
        "head_dim": key_dim,
        "weights_bytes": weights,
        "kv": kv,
        "recurrent": recurrent.map(|(count, per_sequence)| json!({
            "layers": count,
            "attention_layers": attention_layers,
            "bytes": state_bytes,
            "bytes_per_sequence": per_sequence,
        })),
        "total_bytes": weights.saturating_add(values.saturating_mul(4)).saturating_add(state_bytes),
    }))
}

/// A hybrid's recurrent (Gated DeltaNet) layers: how many, and the bytes of the state each
/// sequence keeps in all of them (its convolution's last inputs and its f32 state matrices),
/// from the GGUF keys (`{arch}.attention.recurrent_layers`, `.ssm.*`) or `config.json`
/// (`layer_types`, `linear_*`). `None` for a model without them.
fn recurrent_layers(archive: &Archive, config: Option<&Value>, layers: u64) -> Option<(u64, u64)> {
    let (count, kernel, key_heads, key_dim, value_width) = match archive.gguf_metadata() {
        Some(metadata) => {
            let arch = metadata.architecture()?.to_string();
            let key = |name: &str| metadata.u64(&format!("{arch}.{name}"));
            let count = match metadata.get(&format!("{arch}.attention.recurrent_layers")) {
                Some(GgufValue::Array(array)) => (0..array.len())
                    .filter(|&at| array.get(at).and_then(|flag| flag.as_bool()) == Some(true))
                    .count() as u64,
                _ => {
                    let interval = key("full_attention_interval")?.max(1);
                    (0..layers).filter(|layer| (layer + 1) % interval != 0).count() as u64
                }
            };
            (count, key("ssm.conv_kernel")?, key("ssm.group_count")?, key("ssm.state_size")?, key("ssm.inner_size")?)
        }
        None => {
            let config = config?;
            let text =
                config.get("text_config").filter(|text| text.get("num_hidden_layers").is_some()).unwrap_or(config);
            let types = text.get("layer_types")?.as_array()?;
            let count = types.iter().filter(|kind| kind.as_str() == Some("linear_attention")).count() as u64;
            let number = |name: &str| text.get(name).and_then(Value::as_u64);
            let value_width = number("linear_num_value_heads")?.saturating_mul(number("linear_value_head_dim")?);
            let kernel = number("linear_conv_kernel_dim").unwrap_or(4);
            (count, kernel, number("linear_num_key_heads")?, number("linear_key_head_dim")?, value_width)
        }
    };
    if count == 0 {
        return None;
    }
    let channels = key_heads.saturating_mul(key_dim).saturating_mul(2).saturating_add(value_width);
    let conv = kernel.saturating_sub(1).saturating_mul(channels);
    let state = key_dim.saturating_mul(value_width);
    Some((count, count.saturating_mul(conv.saturating_add(state)).saturating_mul(4)))
}

/// A mixture of experts' share of the weights: how many experts a layer has and a token uses
/// (the GGUF keys `{arch}.expert_count` and `.expert_used_count`, or `config.json`'s
/// `num_experts`/`num_local_experts` and `num_experts_per_tok`), the bytes of the expert
/// stacks (GGUF `*_exps.*`, transformers `*.experts.*`), and the part of them one token reads.
/// `None` for a dense model.
fn experts(archive: &Archive, config: Option<&Value>) -> Option<Value> {
    let (count, used) = match archive.gguf_metadata() {
        Some(metadata) => {
            let arch = metadata.architecture()?.to_string();
            (metadata.u64(&format!("{arch}.expert_count"))?, metadata.u64(&format!("{arch}.expert_used_count"))?)
        }
        None => {
            let config = config?;
            let text =
                config.get("text_config").filter(|text| text.get("num_hidden_layers").is_some()).unwrap_or(config);
            let number = |names: &[&str]| names.iter().find_map(|name| text.get(*name).and_then(Value::as_u64));
            (number(&["num_experts", "num_local_experts"])?, number(&["num_experts_per_tok"])?)
        }
    };
    if count == 0 {
        return None;
    }
    let stacked = |name: &str| name.contains("_exps.") || name.contains(".experts.");
    let bytes: u64 = archive
        .names()
        .filter(|name| stacked(name))
        .filter_map(|name| archive.info(name).ok())
        .map(|info| info.bytes as u64)
        .sum();
    let per_token = (u128::from(bytes) * u128::from(used.min(count)) / u128::from(count)) as u64;
    Some(json!({ "count": count, "per_token": used, "bytes": bytes, "bytes_per_token": per_token }))
}

/// The metadata, typed: GGUF values with their types (long arrays cut to their first items),
/// SafeTensors `__metadata__` strings, and `config.json`'s keys.
fn metadata(archive: &Archive, config: Option<&Config>) -> Vec<Value> {
    let mut rows = Vec::new();
    if let Some(metadata) = archive.gguf_metadata() {
        for (key, value) in metadata.iter() {
            let (ty, value, length) = match value {
                GgufValue::Array(array) => (
                    format!("array<{}>", array.element_type().name().to_lowercase()),
                    array_json(array),
                    Some(array.len()),
                ),
                other => (other.value_type().name().to_lowercase(), gguf_json(other), None),
            };
            rows.push(json!({
                "key": key,
                "type": ty,
                "value": value,
                "length": length,
                "folded": length.is_some_and(|length| length > ARRAY_ITEMS),
            }));
        }
    } else {
        for (key, value) in archive.metadata() {
            rows.push(json!({ "key": key, "type": "string", "value": value, "length": null, "folded": false }));
        }
    }
    if let Some(Config { value: Value::Object(object), lengths, .. }) = config {
        for (key, value) in object {
            let ty = match value {
                Value::Array(_) => "json array",
                Value::Object(_) => "json object",
                Value::String(_) => "json string",
                Value::Number(_) => "json number",
                Value::Bool(_) => "json bool",
                Value::Null => "json null",
            };
            let length = lengths.get(key).copied();
            rows.push(json!({
                "key": format!("config.json: {key}"),
                "type": ty,
                "value": value,
                "length": length,
                "folded": length.is_some_and(|length| length > ARRAY_ITEMS),
            }));
        }
    }
    rows
}

fn gguf_json(value: &GgufValue) -> Value {
    match value {
        GgufValue::U8(v) => json!(v),
        GgufValue::I8(v) => json!(v),
        GgufValue::U16(v) => json!(v),
        GgufValue::I16(v) => json!(v),
        GgufValue::U32(v) => json!(v),
        GgufValue::I32(v) => json!(v),
        // As the f32 reads (`1e-6`), not as the f64 it widens to (`9.99999997e-7`).
        GgufValue::F32(v) => json!(v.to_string().parse::<f64>().ok()),
        GgufValue::Bool(v) => json!(v),
        GgufValue::String(v) => json!(v),
        GgufValue::Array(array) => array_json(array),
        GgufValue::U64(v) => json!(v),
        GgufValue::I64(v) => json!(v),
        GgufValue::F64(v) => json!(v),
    }
}

/// The first items of an array.
fn array_json(array: &Array) -> Value {
    Value::Array(
        (0..array.len().min(ARRAY_ITEMS)).filter_map(|at| array.get(at)).map(|item| gguf_json(&item)).collect(),
    )
}

/// The chat template: the GGUF key, or a folder's `chat_template.jinja` or
/// `tokenizer_config.json` (each read within the size limit of configurations, the latter
/// parsed for its `chat_template` alone; a file too large or not JSON adds a warning to
/// `findings`).
fn chat_template(path: &Path, archive: &Archive, findings: &mut Vec<Value>) -> Option<String> {
    if let Some(metadata) = archive.gguf_metadata() {
        return metadata.str("tokenizer.chat_template").map(str::to_string);
    }
    let dir = if path.is_dir() { path } else { path.parent()? };
    if let Some(text) = config_text(&dir.join("chat_template.jinja"), findings) {
        return Some(text);
    }
    let file = dir.join("tokenizer_config.json");
    let text = config_text(&file, findings)?;
    match serde_json::from_str::<TokenizerConfig>(&text) {
        Ok(config) => config.chat_template.and_then(|template| template.0),
        Err(error) => {
            findings.push(finding(
                "warning",
                format!(
                    "`{}` is not valid JSON ({error}): its chat template is left out of the report",
                    file.display()
                ),
            ));
            None
        }
    }
}

/// The one field of `tokenizer_config.json` the report shows; the others (a vocabulary of added
/// tokens among them) are skipped unbuilt.
#[derive(serde::Deserialize)]
struct TokenizerConfig {
    chat_template: Option<ChatTemplate>,
}

/// A chat template: one text, or named templates, each shown under its name; anything else is
/// no template.
struct ChatTemplate(Option<String>);

impl<'de> serde::Deserialize<'de> for ChatTemplate {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<ChatTemplate, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = ChatTemplate;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a template or a list of named templates")
            }

            fn visit_str<E>(self, text: &str) -> Result<ChatTemplate, E> {
                Ok(ChatTemplate(Some(text.to_string())))
            }

            fn visit_string<E>(self, text: String) -> Result<ChatTemplate, E> {
                Ok(ChatTemplate(Some(text)))
            }

            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<ChatTemplate, A::Error> {
                let mut named = Vec::new();
                while let Some(item) = seq.next_element::<NamedTemplate>()? {
                    if let (Some(name), Some(template)) = (item.name, item.template) {
                        named.push(format!("{{# {name} #}}\n{template}"));
                    }
                }
                Ok(ChatTemplate(Some(named.join("\n"))))
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<ChatTemplate, A::Error> {
                while map.next_entry::<serde::de::IgnoredAny, serde::de::IgnoredAny>()?.is_some() {}
                Ok(ChatTemplate(None))
            }

            fn visit_bool<E>(self, _: bool) -> Result<ChatTemplate, E> {
                Ok(ChatTemplate(None))
            }

            fn visit_i64<E>(self, _: i64) -> Result<ChatTemplate, E> {
                Ok(ChatTemplate(None))
            }

            fn visit_u64<E>(self, _: u64) -> Result<ChatTemplate, E> {
                Ok(ChatTemplate(None))
            }

            fn visit_f64<E>(self, _: f64) -> Result<ChatTemplate, E> {
                Ok(ChatTemplate(None))
            }

            fn visit_unit<E>(self) -> Result<ChatTemplate, E> {
                Ok(ChatTemplate(None))
            }
        }
        deserializer.deserialize_any(Visit)
    }
}

/// One named template: its name and text when both are strings; any other item is skipped.
#[derive(Default)]
struct NamedTemplate {
    name: Option<String>,
    template: Option<String>,
}

impl<'de> serde::Deserialize<'de> for NamedTemplate {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<NamedTemplate, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = NamedTemplate;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a named template")
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<NamedTemplate, A::Error> {
                let mut item = NamedTemplate::default();
                while let Some(key) = map.next_key::<String>()? {
                    match key.as_str() {
                        "name" => item.name = map.next_value::<Text>()?.0,
                        "template" => item.template = map.next_value::<Text>()?.0,
                        _ => {
                            map.next_value::<serde::de::IgnoredAny>()?;
                        }
                    }
                }
                Ok(item)
            }

            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<NamedTemplate, A::Error> {
                while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
                Ok(NamedTemplate::default())
            }

            fn visit_str<E>(self, _: &str) -> Result<NamedTemplate, E> {
                Ok(NamedTemplate::default())
            }

            fn visit_bool<E>(self, _: bool) -> Result<NamedTemplate, E> {
                Ok(NamedTemplate::default())
            }

            fn visit_i64<E>(self, _: i64) -> Result<NamedTemplate, E> {
                Ok(NamedTemplate::default())
            }

            fn visit_u64<E>(self, _: u64) -> Result<NamedTemplate, E> {
                Ok(NamedTemplate::default())
            }

            fn visit_f64<E>(self, _: f64) -> Result<NamedTemplate, E> {
                Ok(NamedTemplate::default())
            }

            fn visit_unit<E>(self) -> Result<NamedTemplate, E> {
                Ok(NamedTemplate::default())
            }
        }
        deserializer.deserialize_any(Visit)
    }
}

/// A string, or `None` for any other value (skipped unbuilt).
struct Text(Option<String>);

impl<'de> serde::Deserialize<'de> for Text {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Text, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = Text;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a string")
            }

            fn visit_str<E>(self, text: &str) -> Result<Text, E> {
                Ok(Text(Some(text.to_string())))
            }

            fn visit_string<E>(self, text: String) -> Result<Text, E> {
                Ok(Text(Some(text)))
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Text, A::Error> {
                while map.next_entry::<serde::de::IgnoredAny, serde::de::IgnoredAny>()?.is_some() {}
                Ok(Text(None))
            }

            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Text, A::Error> {
                while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
                Ok(Text(None))
            }

            fn visit_bool<E>(self, _: bool) -> Result<Text, E> {
                Ok(Text(None))
            }

            fn visit_i64<E>(self, _: i64) -> Result<Text, E> {
                Ok(Text(None))
            }

            fn visit_u64<E>(self, _: u64) -> Result<Text, E> {
                Ok(Text(None))
            }

            fn visit_f64<E>(self, _: f64) -> Result<Text, E> {
                Ok(Text(None))
            }

            fn visit_unit<E>(self) -> Result<Text, E> {
                Ok(Text(None))
            }
        }
        deserializer.deserialize_any(Visit)
    }
}
