//! Checkpoints published already quantized, read as the float weights they stand for: block and
//! channel FP8 (`quant_method` `fp8`, as DeepSeek-V3 and Qwen3-FP8 ship), compressed-tensors
//! (`float-quantized` FP8 and INT8, `nvfp4-pack-quantized`, `mxfp4-pack-quantized`,
//! `pack-quantized` INT1-8 with group scales and zero points), GPTQ (v1 and v2 zeros, `g_idx`
//! act-order, 2, 4 and 8 bits), AWQ (GEMM packing) and gpt-oss's MXFP4 pairs.
//!
//! [`decoded`] gives an archive where each quantized weight is one F32 entry of its float shape,
//! decoded when read by the publisher's own formula computed in f32 (the publisher's code gives
//! it rounded to the scales' dtype, BF16 or F16), with the streams it is made of (scales, zero
//! points, activation scales) no longer listed: loading, conversion and statistics then treat
//! the checkpoint as its dequantized twin. Every stream's dtype and shape is checked from the
//! headers when the archive is made, so a missing or misshapen scale is named before any weight
//! is read.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use half::f16;
use nnx_core::{DType, Tensor};
use rayon::prelude::*;
use serde_json::Value;

use crate::archive::{Archive, EntryLocation};
use crate::error::{ConfigProblem, Error, Result};
use crate::source::{DataError, Source};

/// How a checkpoint says it was quantized: its `config.json`'s `quantization_config`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Scheme {
    /// `quant_method` `fp8`: FP8 weights with `weight_scale_inv`, per block of `block`
    /// (`weight_block_size`) or per tensor.
    Fp8 {
        /// Rows and columns of a scale's block, when the checkpoint gives them.
        block: Option<[usize; 2]>,
    },
    /// `quant_method` `compressed-tensors` in one of the formats nnx reads.
    CompressedTensors {
        /// The format (`float-quantized`, `nvfp4-pack-quantized`, `pack-quantized`, ...).
        format: String,
        /// The weights' `block_structure`, where the scheme scales blocks.
        block: Option<[usize; 2]>,
        /// The weights' `num_bits`, where every group agrees.
        bits: Option<u32>,
    },
    /// `quant_method` `gptq`.
    Gptq {
        /// Bits per weight.
        bits: u32,
        /// Whether zeros are stored as they are (`checkpoint_format` `gptq_v2`) rather than
        /// less one (v1, as AutoGPTQ writes them).
        v2: bool,
    },
    /// `quant_method` `awq`, GEMM packing.
    Awq {
        /// Bits per weight.
        bits: u32,
    },
    /// `quant_method` `mxfp4`: gpt-oss's `*_blocks` and `*_scales` pairs.
    Mxfp4,
}

/// The compressed-tensors formats nnx decodes (`dense` has nothing to decode).
const COMPRESSED_FORMATS: &[&str] = &[
    "dense",
    "float-quantized",
    "naive-quantized",
    "int-quantized",
    "pack-quantized",
    "nvfp4-pack-quantized",
    "mxfp4-pack-quantized",
    "mixed-precision",
];

impl Scheme {
    /// The scheme of a model configuration (`config.json` read as JSON); `None` without a
    /// `quantization_config` that names a `quant_method` (an MLX or unquantized folder).
    ///
    /// # Errors
    /// [`Error::Config`] for a method or format nnx does not decode, or GPTQ/AWQ settings it
    /// cannot follow, naming the field.
    pub fn from_config(config: &Value, path: &Path) -> Result<Option<Scheme>> {
        let Some(entry) = config.get("quantization_config") else { return Ok(None) };
        let Some(method) = entry.get("quant_method").and_then(Value::as_str) else { return Ok(None) };
        let unusable = |key: &str, expected: &'static str, found: String, remedy: &'static str| Error::Config {
            path: path.to_path_buf(),
            problem: ConfigProblem::Unusable { key: format!("quantization_config.{key}"), expected, found, remedy },
        };
        let pair = |value: Option<&Value>| -> Option<[usize; 2]> {
            let list = value?.as_array()?;
            match list.as_slice() {
                [rows, cols] => {
                    Some([rows.as_u64()? as usize, cols.as_u64()? as usize]).filter(|b| b[0] > 0 && b[1] > 0)
                }
                _ => None,
            }
        };
        let bits = |allowed: &[u64]| -> Result<u32> {
            match entry.get("bits").and_then(Value::as_u64) {
                Some(bits) if allowed.contains(&bits) => Ok(bits as u32),
                found => Err(unusable(
                    "bits",
                    "2, 4 or 8 bits (values packed whole into 32-bit words)",
                    found.map_or("missing".into(), |bits| format!("{bits}")),
                    "convert the checkpoint with its publisher's tools to another bit width",
                )),
            }
        };
        let scheme = match method {
            "fp8" => Scheme::Fp8 { block: pair(entry.get("weight_block_size")) },
            "compressed-tensors" => {
                let format = entry.get("format").and_then(Value::as_str).unwrap_or("dense").to_string();
                let groups: Vec<&Value> = entry
                    .get("config_groups")
                    .and_then(Value::as_object)
                    .map(|g| g.values().collect())
                    .unwrap_or_default();
                // Each group may name its own format (mixed precision).
                for group in &groups {
                    let format = group.get("format").and_then(Value::as_str).unwrap_or(&format);
                    if !COMPRESSED_FORMATS.contains(&format) {
                        return Err(unusable(
                            "format",
                            "one of the compressed-tensors formats float-quantized, naive-quantized, pack-quantized, nvfp4-pack-quantized, mxfp4-pack-quantized",
                            format!("`{format}`"),
                            "decompress the checkpoint with compressed-tensors (`ModelCompressor.decompress`) and save it again",
                        ));
                    }
                }
                if !COMPRESSED_FORMATS.contains(&format.as_str()) {
                    return Err(unusable(
                        "format",
                        "one of the compressed-tensors formats float-quantized, naive-quantized, pack-quantized, nvfp4-pack-quantized, mxfp4-pack-quantized",
                        format!("`{format}`"),
                        "decompress the checkpoint with compressed-tensors (`ModelCompressor.decompress`) and save it again",
                    ));
                }
                let weights = |key: &'static str| groups.iter().filter_map(move |g| g.get("weights")?.get(key));
                let block = weights("block_structure").find_map(|value| pair(Some(value)));
                let all_bits: HashSet<u64> = weights("num_bits").filter_map(Value::as_u64).collect();
                let bits = match all_bits.len() {
                    1 => all_bits.into_iter().next().map(|bits| bits as u32),
                    _ => None,
                };
                Scheme::CompressedTensors { format, block, bits }
            }
            "gptq" => {
                let format = entry.get("checkpoint_format").and_then(Value::as_str).unwrap_or("gptq");
                if !["gptq", "gptq_v2"].contains(&format) {
                    return Err(unusable(
                        "checkpoint_format",
                        "`gptq` or `gptq_v2`",
                        format!("`{format}`"),
                        "save the checkpoint again in the GPTQ format (gptqmodel's `save` with `format=\"gptq\"`)",
                    ));
                }
                Scheme::Gptq { bits: bits(&[2, 4, 8])?, v2: format == "gptq_v2" }
            }
            "awq" => {
                let version = entry.get("version").and_then(Value::as_str).unwrap_or("gemm").to_ascii_lowercase();
                if version != "gemm" {
                    return Err(unusable(
                        "version",
                        "AWQ's `gemm` packing",
                        format!("`{version}`"),
                        "save the checkpoint again with AutoAWQ's GEMM version",
                    ));
                }
                Scheme::Awq { bits: bits(&[4])? }
            }
            "mxfp4" => Scheme::Mxfp4,
            other => {
                return Err(unusable(
                    "quant_method",
                    "fp8, compressed-tensors, gptq, awq or mxfp4",
                    format!("`{other}`"),
                    "dequantize the checkpoint with its publisher's tools and save it as BF16 or F16 SafeTensors",
                ));
            }
        };
        Ok(Some(scheme))
    }

    /// The scheme of the checkpoint at `path`: from the `config.json` of the folder, or of the
    /// folder that holds the file; `None` when there is none or it names no `quant_method`.
    ///
    /// # Errors
    /// [`Error::Io`] or [`Error::Config`] for a `config.json` that cannot be read, and the
    /// errors of [`Scheme::from_config`].
    pub fn of(path: &Path) -> Result<Option<Scheme>> {
        /// Only the one field: the rest of a configuration is skipped unread, so a hostile one
        /// of millions of values costs no memory here.
        #[derive(serde::Deserialize)]
        struct Quantization {
            #[serde(default)]
            quantization_config: Option<Value>,
        }
        let folder = if path.is_dir() { path } else { path.parent().unwrap_or(Path::new(".")) };
        let config = folder.join("config.json");
        if !config.is_file() {
            return Ok(None);
        }
        // A configuration too large or not JSON is reported by the reader of the model's
        // configuration, which says more about it (and `inspect` lists it as a finding).
        let text = match crate::config::read_text(&config) {
            Ok(text) => text,
            Err(Error::Config { .. }) => return Ok(None),
            Err(error) => return Err(error),
        };
        let Ok(Quantization { quantization_config: Some(entry) }) = serde_json::from_str::<Quantization>(&text) else {
            return Ok(None);
        };
        drop(text);
        Scheme::from_config(&serde_json::json!({ "quantization_config": entry }), &config)
    }
}

/// How one weight of a published checkpoint is stored, told from its streams.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Encoding {
    /// `NAME.weight` of 8-bit values (FP8 E4M3 or E5M2, or INT8) times a scale per block of
    /// `block` (rows, columns; one block for a per-tensor scale, a row for a per-channel one),
    /// less a zero point where there is one.
    Scaled {
        /// The values' dtype.
        values: DType,
        /// The rows and columns one scale covers.
        block: [usize; 2],
        /// The scale's stream (`weight_scale_inv` or `weight_scale`).
        scale: &'static str,
        /// Whether a zero point is subtracted.
        zero: bool,
    },
    /// NVFP4: E2M1 pairs (`weight_packed`), an E4M3 scale per 16 (`weight_scale`) and a global
    /// scale dividing them (`weight_global_scale`).
    Nvfp4,
    /// compressed-tensors' MXFP4: E2M1 pairs and an E8M0 exponent per 32.
    PackedMxfp4,
    /// compressed-tensors' `pack-quantized`: `bits`-bit integers packed densely into 32-bit
    /// words along the row, a scale (and zero point, packed along the columns) per `group`.
    PackedInt {
        /// Bits per value.
        bits: u32,
        /// Values per scale along a row.
        group: usize,
        /// Whether a zero point is subtracted.
        zero: bool,
    },
    /// GPTQ: `qweight` packed along the input, `qzeros` along the output, a scale per group
    /// of inputs chosen by `g_idx`.
    Gptq {
        /// Bits per value.
        bits: u32,
        /// Whether zeros are stored less one (v1).
        v1: bool,
    },
    /// AWQ (GEMM): `qweight` and `qzeros` packed along the output in AWQ's order.
    Awq {
        /// Values per scale along the input.
        group: usize,
    },
    /// gpt-oss's MXFP4 pairs (`NAME_blocks`, `NAME_scales`), decoded as transformers lays the
    /// stack out: `[experts, input, output]`.
    Mxfp4,
}

impl Encoding {
    /// A short name for listings and type totals (`FP8 E4M3 block 128x128`, `GPTQ 4-bit`).
    pub fn describe(&self) -> String {
        match self {
            Encoding::Scaled { values, block, zero, .. } => {
                let kind = match values {
                    DType::F8E4M3 => "FP8 E4M3",
                    DType::F8E5M2 => "FP8 E5M2",
                    _ => "INT8",
                };
                let zero = if *zero { " asym" } else { "" };
                match block {
                    [1, columns] => format!("{kind} channel{zero} (group {columns})"),
                    [rows, columns] => format!("{kind} block {rows}x{columns}{zero}"),
                }
            }
            Encoding::Nvfp4 => "NVFP4".into(),
            Encoding::PackedMxfp4 | Encoding::Mxfp4 => "MXFP4".into(),
            Encoding::PackedInt { bits, group, zero } => {
                format!("INT{bits} group {group}{}", if *zero { " asym" } else { "" })
            }
            Encoding::Gptq { bits, v1 } => format!("GPTQ {bits}-bit{}", if *v1 { "" } else { " v2" }),
            Encoding::Awq { group } => format!("AWQ 4-bit group {group}"),
        }
    }
}

/// One decoded weight: what it is made of and what it gives.
struct Weight {
    /// Its name in the decoded archive.
    name: String,
    encoding: Encoding,
    /// The streams it is read from, in the order [`decode`] takes them.
    streams: Vec<String>,
    /// The streams it consumes without reading (activation scales, `weight_shape`).
    extra: Vec<String>,
    shape: Vec<usize>,
    stored: usize,
}

/// The weights of a published checkpoint, decoded when read.
struct Decoded {
    inner: Archive,
    path: Option<PathBuf>,
    weights: Vec<Weight>,
}

/// A stream's dtype and shape.
type Spec = (DType, Vec<usize>);

/// The streams a weight's encoding adds beside `NAME.weight`, whatever the scheme, which the
/// decoded archive does not list: activation scales and zero points are for quantized
/// activations, which the decoded twin does not use.
const ACTIVATION_STREAMS: &[&str] =
    &["input_scale", "input_zero_point", "input_global_scale", "output_scale", "output_zero_point"];

/// The archive of `archive`'s entries with every weight of `scheme` decoded (see the module's
/// documentation); `path` names the checkpoint in errors.
///
/// # Errors
/// [`Error::QuantizedWeight`] naming the weight for a stream that is missing or of the wrong
/// dtype or shape, and the errors of opening the shards that hold them.
pub fn decoded(archive: &Archive, scheme: &Scheme, path: &Path) -> Result<Archive> {
    let mut weights = Vec::new();
    let mut consumed: HashSet<String> = HashSet::new();
    let spec = |name: &str| -> Result<Option<Spec>> { archive.spec(name) };
    for name in archive.names() {
        let found = find(archive, scheme, name, &spec)?;
        if let Some(weight) = found {
            consumed.extend(weight.streams.iter().cloned());
            consumed.extend(weight.extra.iter().cloned());
            weights.push(weight);
        }
    }
    let mut out = archive.renamed(|name| (!consumed.contains(name)).then(|| name.to_string()))?;
    // Each decoded weight takes the place of its first stream.
    let order: HashMap<&str, usize> = archive.names().enumerate().map(|(at, name)| (name, at)).collect();
    let firsts: Vec<usize> = weights
        .iter()
        .map(|w| w.streams.iter().filter_map(|s| order.get(s.as_str())).copied().min().unwrap_or(0))
        .collect();
    let source = Arc::new(Decoded { inner: archive.clone(), path: Some(path.to_path_buf()), weights });
    let mut placed: Vec<(usize, String, usize)> =
        source.weights.iter().enumerate().map(|(at, w)| (firsts[at], w.name.clone(), at)).collect();
    placed.sort();
    out.insert_sources(&order, placed, source)?;
    Ok(out)
}

/// Opens `path` (a folder or a file in one) and, where its `config.json` names a published
/// scheme, decodes it ([`decoded`]).
///
/// # Errors
/// The errors of [`Archive::open`], [`Scheme::of`] and [`decoded`].
pub fn open(path: &Path) -> Result<Archive> {
    let archive = Archive::open(path)?;
    match Scheme::of(path)? {
        Some(scheme) => decoded(&archive, &scheme, path),
        None => Ok(archive),
    }
}

/// The weight whose anchor stream is `name`, when it is one under `scheme`.
fn find(
    archive: &Archive,
    scheme: &Scheme,
    name: &str,
    spec: &impl Fn(&str) -> Result<Option<Spec>>,
) -> Result<Option<Weight>> {
    let origin = archive.origin();
    let weight_error = |base: &str, source: Error| Error::QuantizedWeight {
        origin: origin.to_string(),
        name: base.to_string(),
        source: Box::new(source),
    };
    // A stream the weight needs: its spec, or an error naming it.
    let need = |base: &str, stream: &str| -> Result<Spec> {
        let full = format!("{base}.{stream}");
        spec(&full)?.ok_or_else(|| weight_error(base, archive.no_entry_error(&full)))
    };
    let extras = |base: &str, streams: &[&str]| -> Result<Vec<String>> {
        let mut found = Vec::new();
        for stream in streams.iter().chain(ACTIVATION_STREAMS) {
            let full = format!("{base}.{stream}");
            if spec(&full)?.is_some() {
                found.push(full);
            }
        }
        Ok(found)
    };
    let wrong = |base: &str, stream: &'static str, expected: Spec, found: Spec| {
        weight_error(
            base,
            Error::QuantStream {
                stream,
                expected_dtype: expected.0,
                expected_shape: expected.1,
                found_dtype: found.0,
                found_shape: found.1,
            },
        )
    };
    let bytes = |names: &[String]| -> Result<usize> { names.iter().map(|name| Ok(archive.info(name)?.bytes)).sum() };
    match scheme {
        Scheme::Fp8 { .. } | Scheme::CompressedTensors { .. } => {
            let scale_stream = if matches!(scheme, Scheme::Fp8 { .. }) { "weight_scale_inv" } else { "weight_scale" };
            if let Some(base) = name.strip_suffix(".weight_packed") {
                let (packed_dtype, packed) = need(base, "weight_packed")?;
                let (scale_dtype, scale) = need(base, "weight_scale")?;
                let global = spec(&format!("{base}.weight_global_scale"))?;
                if packed_dtype == DType::U8 {
                    let [prefix @ .., rows, half] = packed.as_slice() else {
                        return Err(wrong(base, "weight_packed", (DType::U8, vec![0, 0]), (packed_dtype, packed)));
                    };
                    let columns = half * 2;
                    let (encoding, group, expected_scale) = match global {
                        Some(_) => (Encoding::Nvfp4, 16, DType::F8E4M3),
                        None => (Encoding::PackedMxfp4, 32, DType::U8),
                    };
                    let mut shape = prefix.to_vec();
                    shape.extend([*rows, columns.div_ceil(group)]);
                    if scale_dtype != expected_scale || scale != shape {
                        return Err(wrong(base, "weight_scale", (expected_scale, shape), (scale_dtype, scale)));
                    }
                    let mut streams = vec![format!("{base}.weight_packed"), format!("{base}.weight_scale")];
                    if let Some((global_dtype, global_shape)) = global {
                        if global_dtype != DType::F32 || global_shape.iter().product::<usize>() != 1 {
                            return Err(wrong(
                                base,
                                "weight_global_scale",
                                (DType::F32, vec![1]),
                                (global_dtype, global_shape),
                            ));
                        }
                        streams.push(format!("{base}.weight_global_scale"));
                    }
                    let mut out = prefix.to_vec();
                    out.extend([*rows, columns]);
                    let stored = bytes(&streams)?;
                    return Ok(Some(Weight {
                        name: format!("{base}.weight"),
                        encoding,
                        extra: extras(base, &[])?,
                        streams,
                        shape: out,
                        stored,
                    }));
                }
                // Integers packed into 32-bit words.
                if packed_dtype != DType::I32 {
                    return Err(wrong(base, "weight_packed", (DType::I32, packed.clone()), (packed_dtype, packed)));
                }
                let full_shape = weight_shape(archive, base)?;
                let [prefix @ .., rows, words] = packed.as_slice() else {
                    return Err(wrong(base, "weight_packed", (DType::I32, vec![0, 0]), (packed_dtype, packed)));
                };
                let columns = *full_shape.last().unwrap_or(&0);
                let mut leading = prefix.to_vec();
                leading.push(*rows);
                if full_shape.len() != packed.len() || full_shape[..full_shape.len() - 1] != leading[..] {
                    let mut expected = leading.clone();
                    expected.push(columns);
                    return Err(weight_error(
                        base,
                        Error::QuantStream {
                            stream: "weight_shape",
                            expected_dtype: DType::I64,
                            expected_shape: expected,
                            found_dtype: DType::I64,
                            found_shape: full_shape,
                        },
                    ));
                }
                let bits = match scheme {
                    Scheme::CompressedTensors { bits: Some(bits), .. } => *bits,
                    _ => (1..=8).find(|&bits| (columns * bits as usize).div_ceil(32) == *words).unwrap_or(0),
                };
                if !(1..=8).contains(&bits) || (columns * bits as usize).div_ceil(32) != *words {
                    let expected = {
                        let mut shape = leading.clone();
                        shape.push((columns * bits.clamp(1, 8) as usize).div_ceil(32));
                        shape
                    };
                    return Err(wrong(base, "weight_packed", (DType::I32, expected), (packed_dtype, packed)));
                }
                let [.., groups] = scale.as_slice() else {
                    return Err(wrong(base, "weight_scale", (DType::BF16, leading.clone()), (scale_dtype, scale)));
                };
                let group = if *groups == 0 { 0 } else { columns.div_ceil(*groups) };
                let mut expected_scale = leading.clone();
                expected_scale.push(if group == 0 { 1 } else { columns.div_ceil(group) });
                if !scale_dtype.is_castable_float() || scale != expected_scale || group == 0 {
                    return Err(wrong(base, "weight_scale", (DType::BF16, expected_scale), (scale_dtype, scale)));
                }
                let mut streams = vec![format!("{base}.weight_packed"), format!("{base}.weight_scale")];
                let zero = spec(&format!("{base}.weight_zero_point"))?;
                if let Some((zero_dtype, zero_shape)) = zero.clone() {
                    let mut expected = prefix.to_vec();
                    expected.extend([(rows * bits as usize).div_ceil(32), *groups]);
                    if zero_dtype != DType::I32 || zero_shape != expected {
                        return Err(wrong(base, "weight_zero_point", (DType::I32, expected), (zero_dtype, zero_shape)));
                    }
                    streams.push(format!("{base}.weight_zero_point"));
                }
                let stored = bytes(&streams)?;
                return Ok(Some(Weight {
                    name: format!("{base}.weight"),
                    encoding: Encoding::PackedInt { bits, group, zero: zero.is_some() },
                    extra: extras(base, &["weight_shape"])?,
                    streams,
                    shape: full_shape,
                    stored,
                }));
            }
            let Some(base) = name.strip_suffix(&format!(".{scale_stream}")) else {
                // 8-bit values whose scale is missing would read as they are stored.
                if let Some(base) = name.strip_suffix(".weight")
                    && let Some((DType::F8E4M3 | DType::F8E5M2, _)) = spec(name)?
                {
                    need(base, scale_stream)?;
                }
                return Ok(None);
            };
            if spec(&format!("{base}.weight_packed"))?.is_some() {
                // A packed weight's scale: the packed stream anchors it.
                return Ok(None);
            }
            let (values, shape) = need(base, "weight")?;
            let (scale_dtype, scale) = need(base, scale_stream)?;
            if ![DType::F8E4M3, DType::F8E5M2, DType::I8].contains(&values) || shape.len() < 2 {
                return Err(wrong(base, "weight", (DType::F8E4M3, shape.clone()), (values, shape)));
            }
            let [prefix @ .., rows, columns] = shape.as_slice() else { unreachable!("checked to be 2-D at least") };
            let configured = match scheme {
                Scheme::Fp8 { block } | Scheme::CompressedTensors { block, .. } => *block,
                _ => None,
            };
            let block = scale_block(*rows, *columns, prefix, &scale, configured);
            let Some(block) = block.filter(|_| scale_dtype.is_castable_float()) else {
                let expected = match configured {
                    Some([r, c]) => {
                        let mut expected = prefix.to_vec();
                        expected.extend([rows.div_ceil(r), columns.div_ceil(c)]);
                        expected
                    }
                    None => vec![*rows, 1],
                };
                let stream = if scale_stream == "weight_scale" { "weight_scale" } else { "weight_scale_inv" };
                return Err(wrong(base, stream, (DType::F32, expected), (scale_dtype, scale)));
            };
            let mut streams = vec![format!("{base}.weight"), format!("{base}.{scale_stream}")];
            let zero_name = format!("{base}.weight_zero_point");
            let zero = match spec(&zero_name)? {
                // Symmetric schemes save zero points of zeros; only integers subtract one.
                Some((dtype, zero_shape)) if values == DType::I8 => {
                    if zero_shape != scale
                        || !matches!(dtype, DType::I8 | DType::I32 | DType::F32 | DType::BF16 | DType::F16)
                    {
                        return Err(wrong(base, "weight_zero_point", (DType::I8, scale.clone()), (dtype, zero_shape)));
                    }
                    streams.push(zero_name);
                    true
                }
                _ => false,
            };
            let mut extra = extras(base, &[])?;
            if !zero && spec(&format!("{base}.weight_zero_point"))?.is_some() {
                extra.push(format!("{base}.weight_zero_point"));
            }
            let stored = bytes(&streams)?;
            Ok(Some(Weight {
                name: format!("{base}.weight"),
                encoding: Encoding::Scaled {
                    values,
                    block,
                    scale: if scale_stream == "weight_scale" { "weight_scale" } else { "weight_scale_inv" },
                    zero,
                },
                extra,
                streams,
                shape,
                stored,
            }))
        }
        Scheme::Gptq { bits, v2 } => {
            let Some(base) = name.strip_suffix(".qweight") else { return Ok(None) };
            let per_word = 32 / *bits as usize;
            let (qdtype, qweight) = need(base, "qweight")?;
            let (sdtype, scales) = need(base, "scales")?;
            let (zdtype, qzeros) = need(base, "qzeros")?;
            let (&[words, out], &[groups, scale_out]) = (qweight.as_slice(), scales.as_slice()) else {
                return Err(wrong(base, "scales", (DType::F16, vec![1, 0]), (sdtype, scales)));
            };
            if qdtype != DType::I32 {
                return Err(wrong(base, "qweight", (DType::I32, qweight.clone()), (qdtype, qweight)));
            }
            let input = words * per_word;
            if !sdtype.is_castable_float() || scale_out != out || groups == 0 {
                return Err(wrong(base, "scales", (DType::F16, vec![groups.max(1), out]), (sdtype, scales)));
            }
            let expected_zeros = vec![groups, out.div_ceil(per_word)];
            if zdtype != DType::I32 || qzeros != expected_zeros {
                return Err(wrong(base, "qzeros", (DType::I32, expected_zeros), (zdtype, qzeros)));
            }
            let mut streams = vec![format!("{base}.qweight"), format!("{base}.qzeros"), format!("{base}.scales")];
            if let Some((gdtype, g_idx)) = spec(&format!("{base}.g_idx"))? {
                if gdtype != DType::I32 || g_idx != [input] {
                    return Err(wrong(base, "g_idx", (DType::I32, vec![input]), (gdtype, g_idx)));
                }
                streams.push(format!("{base}.g_idx"));
            }
            let stored = bytes(&streams)?;
            Ok(Some(Weight {
                name: format!("{base}.weight"),
                encoding: Encoding::Gptq { bits: *bits, v1: !v2 },
                extra: extras(base, &[])?,
                streams,
                shape: vec![out, input],
                stored,
            }))
        }
        Scheme::Awq { .. } => {
            let Some(base) = name.strip_suffix(".qweight") else { return Ok(None) };
            let (qdtype, qweight) = need(base, "qweight")?;
            let (sdtype, scales) = need(base, "scales")?;
            let (zdtype, qzeros) = need(base, "qzeros")?;
            let (&[input, words], &[groups, out]) = (qweight.as_slice(), scales.as_slice()) else {
                return Err(wrong(base, "scales", (DType::F16, vec![1, 0]), (sdtype, scales)));
            };
            if qdtype != DType::I32 {
                return Err(wrong(base, "qweight", (DType::I32, qweight.clone()), (qdtype, qweight)));
            }
            if !sdtype.is_castable_float() || out != words * 8 || groups == 0 || !input.is_multiple_of(groups) {
                return Err(wrong(base, "scales", (DType::F16, vec![groups.max(1), words * 8]), (sdtype, scales)));
            }
            if zdtype != DType::I32 || qzeros != [groups, words] {
                return Err(wrong(base, "qzeros", (DType::I32, vec![groups, words]), (zdtype, qzeros)));
            }
            let streams = vec![format!("{base}.qweight"), format!("{base}.qzeros"), format!("{base}.scales")];
            let stored = bytes(&streams)?;
            Ok(Some(Weight {
                name: format!("{base}.weight"),
                encoding: Encoding::Awq { group: input / groups },
                extra: extras(base, &[])?,
                streams,
                shape: vec![out, input],
                stored,
            }))
        }
        Scheme::Mxfp4 => {
            let Some(base) = name.strip_suffix("_blocks") else { return Ok(None) };
            let (bdtype, blocks) = spec(name)?.expect("listed");
            let scales_name = format!("{base}_scales");
            let (sdtype, scales) =
                spec(&scales_name)?.ok_or_else(|| weight_error(base, archive.no_entry_error(&scales_name)))?;
            let (&[experts, rows, groups, 16], true) = (blocks.as_slice(), bdtype == DType::U8) else {
                return Err(wrong(
                    base,
                    "blocks",
                    (DType::U8, vec![blocks.first().copied().unwrap_or(0), 0, 0, 16]),
                    (bdtype, blocks),
                ));
            };
            if sdtype != DType::U8 || scales != [experts, rows, groups] {
                return Err(wrong(base, "scales", (DType::U8, vec![experts, rows, groups]), (sdtype, scales)));
            }
            let streams = vec![name.to_string(), scales_name];
            let stored = bytes(&streams)?;
            Ok(Some(Weight {
                name: base.to_string(),
                encoding: Encoding::Mxfp4,
                extra: Vec::new(),
                streams,
                shape: vec![experts, groups * 32, rows],
                stored,
            }))
        }
    }
}

/// compressed-tensors' `weight_shape` of `base`: the weight's shape before packing.
fn weight_shape(archive: &Archive, base: &str) -> Result<Vec<usize>> {
    let name = format!("{base}.weight_shape");
    let tensor = archive.try_get(&name).map_err(|error| Error::QuantizedWeight {
        origin: archive.origin().to_string(),
        name: base.to_string(),
        source: Box::new(error),
    })?;
    let values: Vec<i64> = match tensor.dtype() {
        DType::I64 => tensor.to_vec::<i64>()?,
        DType::I32 => tensor.to_vec::<i32>()?.into_iter().map(i64::from).collect(),
        dtype => {
            return Err(Error::QuantizedWeight {
                origin: archive.origin().to_string(),
                name: base.to_string(),
                source: Box::new(Error::QuantStream {
                    stream: "weight_shape",
                    expected_dtype: DType::I64,
                    expected_shape: vec![2],
                    found_dtype: dtype,
                    found_shape: tensor.shape().to_vec(),
                }),
            });
        }
    };
    if values.len() > 4 || values.iter().any(|&v| !(0..1 << 40).contains(&v)) {
        return Err(Error::QuantizedWeight {
            origin: archive.origin().to_string(),
            name: base.to_string(),
            source: Box::new(Error::QuantStream {
                stream: "weight_shape",
                expected_dtype: DType::I64,
                expected_shape: vec![2],
                found_dtype: tensor.dtype(),
                found_shape: tensor.shape().to_vec(),
            }),
        });
    }
    Ok(values.into_iter().map(|v| v as usize).collect())
}

/// The rows and columns one scale of shape `scale` covers in a weight `[prefix.., rows,
/// columns]`: the whole matrix for one scale, a row for a per-channel scale, a group of a row,
/// or the configured block; `None` when the scale fits none of them.
fn scale_block(
    rows: usize,
    columns: usize,
    prefix: &[usize],
    scale: &[usize],
    configured: Option<[usize; 2]>,
) -> Option<[usize; 2]> {
    if let [scale_prefix @ .., scale_rows, scale_columns] = scale
        && scale_prefix == prefix
        && let Some([r, c]) = configured
        && *scale_rows == rows.div_ceil(r)
        && *scale_columns == columns.div_ceil(c)
    {
        return Some([r, c]);
    }
    let count: usize = scale.iter().product();
    if count == 1 && prefix.is_empty() {
        return Some([rows, columns]);
    }
    let [scale_prefix @ .., scale_rows, scale_columns] = scale else { return None };
    if scale_prefix != prefix {
        return None;
    }
    match (*scale_rows, *scale_columns) {
        (1, 1) => Some([rows, columns]),
        (r, 1) if r == rows => Some([1, columns]),
        (r, groups) if r == rows && groups > 0 && columns.is_multiple_of(groups) => Some([1, columns / groups]),
        _ => None,
    }
}

impl Archive {
    /// Adds the weights of `source`, each `(first, name, at)`: placed before the entry that was
    /// at `first` in the archive this one was made from (`order` gives those places).
    fn insert_sources(
        &mut self,
        order: &HashMap<&str, usize>,
        placed: Vec<(usize, String, usize)>,
        source: Arc<Decoded>,
    ) -> Result<()> {
        let kept: Vec<String> = self.names().map(str::to_string).collect();
        let mut names = Vec::with_capacity(kept.len() + placed.len());
        let mut placed = placed.into_iter().peekable();
        for name in kept {
            let at = order.get(name.as_str()).copied().unwrap_or(usize::MAX);
            while let Some((_, new, index)) = placed.next_if(|(first, ..)| *first < at) {
                names.push((new, Some(index)));
            }
            names.push((name, None));
        }
        names.extend(placed.map(|(_, new, index)| (new, Some(index))));
        let store: Arc<dyn crate::source::Store> = source;
        self.reorder(names, &store)
    }
}

impl Source for Decoded {
    fn spec(&self, at: usize) -> (DType, &[usize]) {
        (DType::F32, &self.weights[at].shape)
    }

    fn tensor(&self, at: usize) -> Result<Tensor> {
        let weight = &self.weights[at];
        let streams: Vec<Tensor> = weight.streams.iter().map(|name| self.inner.try_get(name)).collect::<Result<_>>()?;
        decode(weight, &streams).map_err(|error| Error::QuantizedWeight {
            origin: self.inner.origin().to_string(),
            name: weight.name.clone(),
            source: Box::new(error),
        })
    }

    fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    fn location(&self, _at: usize) -> Option<EntryLocation> {
        None
    }

    fn stored_bytes(&self, at: usize) -> usize {
        self.weights[at].stored
    }

    fn data_bytes(&self, at: usize) -> usize {
        self.weights[at].shape.iter().product::<usize>().saturating_mul(4)
    }

    fn made_when_read(&self, _at: usize) -> bool {
        true
    }

    fn data(&self, at: usize) -> std::result::Result<Cow<'_, [u8]>, DataError> {
        crate::source::made_data(self.tensor(at))
    }

    fn release(&self, at: usize) {
        for name in &self.weights[at].streams {
            self.inner.release(name);
        }
    }

    fn encoding(&self, at: usize) -> Option<String> {
        Some(self.weights[at].encoding.describe())
    }
}

/// A stream's bytes, as stored.
fn bytes_of(tensor: &Tensor) -> Result<Cow<'_, [u8]>> {
    tensor.to_bytes()
}

/// A little-endian 32-bit word of `bytes`.
fn word(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[4 * at..4 * at + 4].try_into().expect("four bytes"))
}

/// The `bits`-bit value at bit `bit` of the little-endian words `words` (which may span two).
fn field(words: &[u8], bit: usize, bits: u32) -> u32 {
    let (at, shift) = (bit / 32, (bit % 32) as u32);
    let low = u64::from(word(words, at));
    let high = if shift + bits > 32 { u64::from(word(words, at + 1)) << 32 } else { 0 };
    (((low | high) >> shift) & ((1 << bits) - 1)) as u32
}

/// FP8 E4M3 (the `fn` variant: no infinities, `S.1111.111` is NaN).
fn e4m3(byte: u8) -> f32 {
    let sign = if byte & 0x80 != 0 { -1.0 } else { 1.0 };
    let (exponent, mantissa) = (i32::from((byte >> 3) & 0xF), f32::from(byte & 7));
    match exponent {
        0 => sign * mantissa / 8.0 * 2f32.powi(-6),
        15 if byte & 7 == 7 => f32::NAN,
        _ => sign * (1.0 + mantissa / 8.0) * 2f32.powi(exponent - 7),
    }
}

/// FP8 E5M2: the high byte of an IEEE half.
fn e5m2(byte: u8) -> f32 {
    f16::from_bits(u16::from(byte) << 8).to_f32()
}

/// E2M1 (FP4) codes as values.
const E2M1: [f32; 16] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0];

/// A stream of floats (F32, F16, BF16, F64) widened to f32.
fn floats(tensor: &Tensor) -> Result<Vec<f32>> {
    tensor.to_dtype(DType::F32)?.to_vec::<f32>()
}

/// A stream of integers or floats (a zero point) as f32.
fn numbers(tensor: &Tensor) -> Result<Vec<f32>> {
    Ok(match tensor.dtype() {
        DType::I8 => tensor.to_vec::<i8>()?.into_iter().map(f32::from).collect(),
        DType::I32 => tensor.to_vec::<i32>()?.into_iter().map(|v| v as f32).collect(),
        _ => floats(tensor)?,
    })
}

/// The weight decoded from its streams (in [`Weight::streams`]'s order) by the publisher's
/// formula computed in f32: the publisher's own result in its dtype (BF16 or F16) is this value
/// rounded. Rows are decoded in parallel.
fn decode(weight: &Weight, streams: &[Tensor]) -> Result<Tensor> {
    let columns = *weight.shape.last().expect("2-D at least");
    let count: usize = weight.shape.iter().product();
    let mut out = vec![0f32; count];
    let rows = |out: &mut Vec<f32>, value: &(dyn Fn(usize, usize) -> f32 + Sync)| {
        out.par_chunks_mut(columns.max(1)).enumerate().for_each(|(row, values)| {
            for (column, slot) in values.iter_mut().enumerate() {
                *slot = value(row, column);
            }
        });
    };
    match &weight.encoding {
        Encoding::Scaled { values, block, zero, .. } => {
            let raw = bytes_of(&streams[0])?;
            let scale = floats(&streams[1])?;
            let zeros = if *zero { numbers(&streams[2])? } else { Vec::new() };
            let rows_per = weight.shape[weight.shape.len() - 2];
            let (scale_rows, scale_columns) = (rows_per.div_ceil(block[0]), columns.div_ceil(block[1]));
            let value = |byte: u8| match values {
                DType::F8E4M3 => e4m3(byte),
                DType::F8E5M2 => e5m2(byte),
                _ => f32::from(byte as i8),
            };
            rows(&mut out, &|row, column| {
                let (matrix, r) = (row / rows_per, row % rows_per);
                let at = (matrix * scale_rows + r / block[0]) * scale_columns + column / block[1];
                let at = if scale.len() == 1 { 0 } else { at };
                let q = value(raw[row * columns + column]);
                let q = if *zero { q - zeros[at] } else { q };
                q * scale[at]
            });
        }
        Encoding::Nvfp4 | Encoding::PackedMxfp4 => {
            let packed = bytes_of(&streams[0])?;
            let nv = matches!(weight.encoding, Encoding::Nvfp4);
            let group = if nv { 16 } else { 32 };
            let scales = bytes_of(&streams[1])?;
            let global = if nv { floats(&streams[2])?[0] } else { 1.0 };
            let groups = columns.div_ceil(group);
            let half_row = columns.div_ceil(2);
            rows(&mut out, &|row, column| {
                let byte = packed[row * half_row + column / 2];
                let code = if column % 2 == 0 { byte & 0xF } else { byte >> 4 };
                let scale = scales[row * groups + column / group];
                if nv {
                    // E2M1 times E4M3 is exact in f32; one division by the global scale.
                    E2M1[usize::from(code)] * e4m3(scale) / global
                } else {
                    E2M1[usize::from(code)] * e8m0(scale)
                }
            });
        }
        Encoding::PackedInt { bits, group, zero } => {
            let packed = bytes_of(&streams[0])?;
            let scale = floats(&streams[1])?;
            let zeros = if *zero { Some(bytes_of(&streams[2])?) } else { None };
            let offset = 1i32 << (bits - 1);
            let words = (columns * *bits as usize).div_ceil(32);
            let groups = columns.div_ceil(*group);
            let rows_per = weight.shape[weight.shape.len() - 2];
            let zero_words = (rows_per * *bits as usize).div_ceil(32);
            rows(&mut out, &|row, column| {
                let q = field(&packed[row * words * 4..][..words * 4], column * *bits as usize, *bits) as i32 - offset;
                let g = column / group;
                let z = match &zeros {
                    // Packed along the rows: column g of a [words, groups] matrix per matrix.
                    Some(zeros) => {
                        let (matrix, r) = (row / rows_per, row % rows_per);
                        let bit = r * *bits as usize;
                        let base = matrix * zero_words * groups;
                        let at = base + (bit / 32) * groups + g;
                        let shift = (bit % 32) as u32;
                        let low = u64::from(word(zeros, at));
                        let high = if shift + bits > 32 { u64::from(word(zeros, at + groups)) << 32 } else { 0 };
                        (((low | high) >> shift) & ((1 << bits) - 1)) as i32 - offset
                    }
                    None => 0,
                };
                (q - z) as f32 * scale[row * groups + g]
            });
        }
        Encoding::Gptq { bits, v1 } => {
            let qweight = bytes_of(&streams[0])?;
            let qzeros = bytes_of(&streams[1])?;
            let scales = floats(&streams[2])?;
            let input = columns;
            let out_features = weight.shape[0];
            let per_word = 32 / *bits as usize;
            let mask = (1u32 << bits) - 1;
            let g_idx: Vec<usize> = match streams.get(3) {
                Some(g_idx) => {
                    let groups = scales.len() / out_features;
                    let values = g_idx.to_vec::<i32>()?;
                    if let Some((at, &bad)) = values.iter().enumerate().find(|&(_, &g)| g < 0 || g as usize >= groups) {
                        return Err(Error::IndexOutOfRange {
                            op: "GPTQ g_idx",
                            id: bad.max(0) as usize,
                            position: at,
                            rows: groups,
                            shape: vec![groups, out_features],
                        });
                    }
                    values.into_iter().map(|g| g as usize).collect()
                }
                None => {
                    let groups = scales.len() / out_features;
                    let group = input.div_ceil(groups);
                    (0..input).map(|i| i / group).collect()
                }
            };
            let zero_words = out_features.div_ceil(per_word);
            // v1 stores each word of zeros less a one in every field, borrowing across fields
            // where a zero was 0: the word is added back whole, as GPTQ's loaders do.
            let ones = if *v1 { (0..per_word).fold(0u32, |ones, at| ones | 1 << (*bits as usize * at)) } else { 0 };
            rows(&mut out, &|o, i| {
                let q = (word(&qweight, (i / per_word) * out_features + o) >> (*bits as usize * (i % per_word))) & mask;
                let g = g_idx[i];
                let zeros = word(&qzeros, g * zero_words + o / per_word).wrapping_add(ones);
                let z = (zeros >> (*bits as usize * (o % per_word))) & mask;
                (q as i32 - z as i32) as f32 * scales[g * out_features + o]
            });
        }
        Encoding::Awq { group } => {
            // AWQ packs output columns 0, 2, 4, 6, 1, 3, 5, 7 into nibbles 0-7: column k of a
            // word is in nibble REVERSE[k].
            const REVERSE: [usize; 8] = [0, 4, 1, 5, 2, 6, 3, 7];
            let qweight = bytes_of(&streams[0])?;
            let qzeros = bytes_of(&streams[1])?;
            let scales = floats(&streams[2])?;
            let out_features = weight.shape[0];
            let words = out_features / 8;
            let nibble =
                |bytes: &[u8], row: usize, o: usize| (word(bytes, row * words + o / 8) >> (4 * REVERSE[o % 8])) & 0xF;
            rows(&mut out, &|o, i| {
                let g = i / group;
                (nibble(&qweight, i, o) as i32 - nibble(&qzeros, g, o) as i32) as f32 * scales[g * out_features + o]
            });
        }
        Encoding::Mxfp4 => {
            let blocks = bytes_of(&streams[0])?;
            let scales = bytes_of(&streams[1])?;
            let [_, input, output] = weight.shape[..] else { unreachable!("a stack is 3-D") };
            // Rows of the decoded stack are inputs: element (e, i, o) is value i of stored row o.
            rows(&mut out, &|row, o| {
                let (expert, i) = (row / input, row % input);
                let stored = expert * output + o;
                let byte = blocks[stored * input / 2 + i / 2];
                let code = if i % 2 == 0 { byte & 0xF } else { byte >> 4 };
                E2M1[usize::from(code)] * e8m0(scales[stored * (input / 32) + i / 32])
            });
        }
    }
    Tensor::from_vec(out, &weight.shape)
}

/// An E8M0 scale: two to the power of the byte less 127.
fn e8m0(byte: u8) -> f32 {
    if byte == 0xFF { f32::NAN } else { 2f32.powi(i32::from(byte) - 127) }
}

/// What each decoded weight is made of, for listings: its name and encoding.
pub fn encodings(archive: &Archive) -> BTreeMap<String, String> {
    archive.names().filter_map(|name| Some((name.to_string(), archive.encoding(name)?))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fp8_codes_decode_to_their_values() {
        // E4M3: the largest finite value, the smallest subnormal, one, a negative, NaN.
        assert_eq!(e4m3(0x7E), 448.0);
        assert_eq!(e4m3(0x01), 2f32.powi(-9));
        assert_eq!(e4m3(0x38), 1.0);
        assert_eq!(e4m3(0xC4), -3.0);
        assert!(e4m3(0x7F).is_nan());
        // E5M2: the largest finite value and one.
        assert_eq!(e5m2(0x7B), 57344.0);
        assert_eq!(e5m2(0x3C), 1.0);
        assert_eq!(e8m0(127), 1.0);
        assert_eq!(e8m0(120), 2f32.powi(-7));
    }

    #[test]
    fn dense_packing_reads_values_across_words() {
        // Values 0..32 of 5 bits each, packed from bit 0 up: some span two words.
        let mut words = [0u32; 5];
        for value in 0..32u32 {
            let bit = value as usize * 5;
            words[bit / 32] |= value << (bit % 32);
            if bit % 32 + 5 > 32 {
                words[bit / 32 + 1] |= value >> (32 - bit % 32);
            }
        }
        let bytes: Vec<u8> = words.iter().flat_map(|word| word.to_le_bytes()).collect();
        for value in 0..32u32 {
            assert_eq!(field(&bytes, value as usize * 5, 5), value);
        }
    }

    #[test]
    fn scales_cover_tensors_channels_groups_and_configured_blocks() {
        assert_eq!(scale_block(64, 256, &[], &[1], None), Some([64, 256]));
        assert_eq!(scale_block(64, 256, &[], &[], None), Some([64, 256]));
        assert_eq!(scale_block(64, 256, &[], &[64, 1], None), Some([1, 256]));
        assert_eq!(scale_block(64, 256, &[], &[64, 8], None), Some([1, 32]));
        // DeepSeek's 128x128 blocks, the last ones partial.
        assert_eq!(scale_block(200, 300, &[], &[2, 3], Some([128, 128])), Some([128, 128]));
        assert_eq!(scale_block(200, 300, &[], &[3, 3], Some([128, 128])), None);
        assert_eq!(scale_block(64, 256, &[], &[64, 7], None), None);
    }

    #[test]
    fn schemes_are_read_from_the_configuration_and_others_refused_by_name() {
        let path = Path::new("config.json");
        let read = |text: &str| Scheme::from_config(&serde_json::from_str(text).unwrap(), path);
        assert_eq!(read(r#"{"model_type": "llama"}"#).unwrap(), None);
        // MLX writes `quantization_config` without a method.
        assert_eq!(read(r#"{"quantization_config": {"bits": 4, "group_size": 64}}"#).unwrap(), None);
        assert_eq!(
            read(r#"{"quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}"#).unwrap(),
            Some(Scheme::Fp8 { block: Some([128, 128]) })
        );
        assert_eq!(
            read(r#"{"quantization_config": {"quant_method": "gptq", "bits": 4, "checkpoint_format": "gptq_v2"}}"#)
                .unwrap(),
            Some(Scheme::Gptq { bits: 4, v2: true })
        );
        let refused = read(r#"{"quantization_config": {"quant_method": "bitsandbytes"}}"#).unwrap_err().to_string();
        assert!(refused.contains("quantization_config.quant_method") && refused.contains("bitsandbytes"), "{refused}");
        let refused = read(r#"{"quantization_config": {"quant_method": "gptq", "bits": 3}}"#).unwrap_err().to_string();
        assert!(refused.contains("quantization_config.bits") && refused.contains('3'), "{refused}");
        let refused = read(r#"{"quantization_config": {"quant_method": "compressed-tensors", "format": "marlin-24"}}"#)
            .unwrap_err()
            .to_string();
        assert!(refused.contains("marlin-24"), "{refused}");
    }
}
