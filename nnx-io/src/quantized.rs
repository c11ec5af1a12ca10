//! Folders of quantized weights: mlx-lm checkpoints (MLX affine with a `quantization` entry in
//! `config.json`) and NanoSeedLM folders (page-aligned shards holding BF16, affine, SEED4 and
//! SEED4P4 weights, with an optional overlay file of extra entries). Each weight's encoding is
//! told from the entries present, and every stream's dtype and shape is checked from the headers
//! before any of its bytes are read.

use std::collections::BTreeMap;
use std::path::Path;

use nnx_core::quant::{AFFINE_BITS, AFFINE_GROUP_SIZES, AffineSpec, AffineWeight, SeedEncoding, SeedWeight};
#[cfg(feature = "kernels")]
use nnx_core::quant::{QuantizedLinear, SeedLinear};
use nnx_core::{DType, Tensor};
use serde_json::{Map, Value};

use crate::archive::Archive;
use crate::error::{ConfigProblem, ConfigRule, Error, Result};
use crate::format;
use crate::fs::write_atomic;
use crate::safetensors::write::SaveOptions;

pub use crate::format::OVERLAY_FILE;

/// The default shard size of [`save_folder`]: 5 GiB.
pub const DEFAULT_SHARD_BYTES: u64 = 5 << 30;

/// How one logical weight is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightEncoding {
    /// `NAME.weight` in a float dtype.
    Float(DType),
    /// MLX affine: `NAME.weight` (U32), `NAME.scales`, `NAME.biases`.
    Affine(AffineSpec),
    /// `NAME.seeds` with `NAME.nibbles` (SEED4) or `NAME.coefs` and `NAME.codes` (SEED4P4).
    Seed(SeedEncoding),
}

/// One logical weight, read with its encoding.
#[derive(Clone, Debug)]
pub enum EncodedWeight {
    /// A float tensor.
    Float(Tensor),
    /// An MLX affine-quantized weight.
    Affine(AffineWeight),
    /// A SEED4 or SEED4P4 weight.
    Seed(SeedWeight),
}

impl EncodedWeight {
    /// The encoding.
    pub fn encoding(&self) -> WeightEncoding {
        match self {
            EncodedWeight::Float(tensor) => WeightEncoding::Float(tensor.dtype()),
            EncodedWeight::Affine(weight) => WeightEncoding::Affine(weight.spec()),
            EncodedWeight::Seed(weight) => WeightEncoding::Seed(weight.encoding),
        }
    }

    /// The float weight in `dtype`: affine weights as MLX dequantizes them (in the dtype of
    /// their scales, then cast), seed weights as the reference decodes them (BF16, then cast).
    /// A seed weight of one slice becomes `[rows, columns]`; several slices stay
    /// `[slices, rows, columns]`.
    ///
    /// # Errors
    /// The errors of decoding and casting.
    pub fn to_float(&self, dtype: DType) -> Result<Tensor> {
        let tensor = match self {
            EncodedWeight::Float(tensor) => tensor.clone(),
            EncodedWeight::Affine(weight) => weight.dequantize()?,
            EncodedWeight::Seed(weight) => {
                let decoded = weight.decode()?;
                match weight.shape() {
                    [1, rows, columns] => decoded.reshape(&[rows, columns])?,
                    _ => decoded,
                }
            }
        };
        tensor.to_dtype(dtype)
    }

    /// The stored entries of the weight named `name` (a module path), in stream order.
    pub fn streams(&self, name: &str) -> Vec<(String, Tensor)> {
        let entry = |stream: &str, tensor: &Tensor| (format!("{name}.{stream}"), tensor.clone());
        match self {
            EncodedWeight::Float(tensor) => vec![entry("weight", tensor)],
            EncodedWeight::Affine(weight) => {
                vec![entry("weight", &weight.weight), entry("scales", &weight.scales), entry("biases", &weight.biases)]
            }
            EncodedWeight::Seed(weight) => {
                let mut streams = vec![
                    entry("seeds", &weight.seeds),
                    entry(weight.encoding.coefficient_stream(), &weight.coefficients),
                    entry("exp_bias", &weight.exp_bias),
                ];
                if let Some(codes) = &weight.codes {
                    streams.push(entry("codes", codes));
                }
                streams
            }
        }
    }
}

/// The `quantization` (or `quantization_config`) entry of an mlx-lm `config.json`: the default
/// bits and group size, and per-module overrides keyed by module path (`false` for a module
/// left in float).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QuantizationConfig {
    /// Bits and group size of every quantized module without an override.
    pub default: AffineSpec,
    /// Per-module settings: a spec, or `None` for a module that is not quantized.
    pub overrides: BTreeMap<String, Option<AffineSpec>>,
}

impl QuantizationConfig {
    /// A configuration without overrides.
    pub fn new(default: AffineSpec) -> QuantizationConfig {
        QuantizationConfig { default, overrides: BTreeMap::new() }
    }

    /// Reads the `quantization` or `quantization_config` object of a model configuration;
    /// `Ok(None)` when there is neither.
    ///
    /// # Errors
    /// [`Error::Config`] for a malformed entry (missing `bits` or `group_size`, a `mode` other
    /// than `affine`), [`Error::ConfigField`] for unsupported values.
    pub fn from_config(config: &Value, path: &Path) -> Result<Option<QuantizationConfig>> {
        let Some(entry) = config.get("quantization").or_else(|| config.get("quantization_config")) else {
            return Ok(None);
        };
        let problem = |problem: ConfigProblem| Error::Config { path: path.to_path_buf(), problem };
        let object = entry.as_object().ok_or_else(|| problem(ConfigProblem::QuantizationNotObject))?;
        // A publisher's scheme (FP8, GPTQ, compressed-tensors, ...): see `crate::published`.
        if object.contains_key("quant_method") && !config.get("quantization").is_some_and(Value::is_object) {
            return Ok(None);
        }
        if let Some(mode) = object.get("mode").and_then(Value::as_str)
            && mode != "affine"
        {
            return Err(problem(ConfigProblem::QuantizationMode { mode: mode.to_string() }));
        }
        let spec = |object: &Map<String, Value>, at: &str| -> Result<AffineSpec> {
            // Each value is checked against the supported ones while it is still a u64, so that
            // a value too wide for the spec's fields is refused rather than truncated.
            let number = |key: &'static str, allowed: Vec<u64>| {
                let found = object
                    .get(key)
                    .and_then(Value::as_u64)
                    .ok_or_else(|| problem(ConfigProblem::QuantizationField { at: at.to_string(), key }))?;
                if allowed.contains(&found) {
                    Ok(found)
                } else {
                    Err(Error::ConfigField {
                        path: path.to_path_buf(),
                        field: format!("quantization{at}.{key}"),
                        found,
                        rule: ConfigRule::OneOf { allowed },
                    })
                }
            };
            let bits = number("bits", AFFINE_BITS.iter().map(|&bits| u64::from(bits)).collect())?;
            let group_size = number("group_size", AFFINE_GROUP_SIZES.iter().map(|&size| size as u64).collect())?;
            // Both are among the supported values, which fit the spec's fields.
            AffineSpec::new(bits as u32, group_size as usize)
        };
        let default = spec(object, "")?;
        let mut overrides = BTreeMap::new();
        for (key, value) in object {
            match value {
                Value::Object(inner) => {
                    overrides.insert(key.clone(), Some(spec(inner, &format!(".{key}"))?));
                }
                Value::Bool(false) => {
                    overrides.insert(key.clone(), None);
                }
                _ => {}
            }
        }
        Ok(Some(QuantizationConfig { default, overrides }))
    }

    /// The spec of the module at `path`: its override, else the default; `None` for a module
    /// marked `false`.
    pub fn spec_for(&self, path: &str) -> Option<AffineSpec> {
        match self.overrides.get(path) {
            Some(spec) => *spec,
            None => Some(self.default),
        }
    }

    /// The JSON object mlx-lm writes: `{"group_size": G, "bits": B, "mode": "affine", ...}`.
    pub fn to_json(&self) -> Value {
        let spec = |spec: &AffineSpec| serde_json::json!({"group_size": spec.group_size, "bits": spec.bits});
        let mut object = Map::new();
        object.insert("group_size".into(), self.default.group_size.into());
        object.insert("bits".into(), self.default.bits.into());
        object.insert("mode".into(), "affine".into());
        for (path, value) in &self.overrides {
            object.insert(path.clone(), value.as_ref().map_or(Value::Bool(false), spec));
        }
        Value::Object(object)
    }
}

/// A folder (or file) of possibly quantized weights, opened from headers only.
///
/// ```
/// use nnx_core::quant::{AffineSpec, AffineWeight};
/// use nnx_core::Tensor;
/// use nnx_io::quantized::{EncodedWeight, QuantizedFolder, WeightEncoding, save_folder};
/// use nnx_io::Archive;
///
/// let dir = std::env::temp_dir().join(format!("nnx-doc-quantized-{}", std::process::id()));
/// let weight = Tensor::from_vec((0..256).map(|i| i as f32 / 256.0).collect(), &[2, 128])?;
/// let quantized = AffineWeight::quantize(&weight, AffineSpec::new(4, 64)?)?;
/// let mut archive = Archive::new();
/// for (name, tensor) in EncodedWeight::Affine(quantized).streams("proj") {
///     archive.insert(name, tensor);
/// }
/// let config = serde_json::json!({"quantization": {"group_size": 64, "bits": 4}});
/// save_folder(&dir, &archive, Some(&config), None)?;
///
/// let folder = QuantizedFolder::open(&dir)?;
/// assert_eq!(folder.weights(), ["proj"]);
/// assert_eq!(folder.encoding("proj")?, WeightEncoding::Affine(AffineSpec::new(4, 64)?));
/// # std::fs::remove_dir_all(&dir)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug)]
pub struct QuantizedFolder {
    archive: Archive,
    config: Option<Value>,
    quantization: Option<QuantizationConfig>,
}

impl QuantizedFolder {
    /// Opens a folder (its shard index, `model.safetensors`, or its `model*.safetensors`
    /// files, with `config.json` when present and [`OVERLAY_FILE`] as an overlay when present)
    /// or a single file (whose `quantization` metadata, if any, is read as JSON).
    ///
    /// # Errors
    /// The errors of [`Archive::open`] and [`Archive::union`] (an entry both in the folder and
    /// the overlay), [`Error::Config`] for an unusable `config.json`.
    pub fn open(path: impl AsRef<Path>) -> Result<QuantizedFolder> {
        let path = path.as_ref();
        if !path.is_dir() {
            let archive = Archive::open(path)?;
            let config = match archive.metadata().get("quantization") {
                Some(text) => {
                    let entry: Value = serde_json::from_str(text).map_err(|error| Error::Config {
                        path: path.to_path_buf(),
                        problem: ConfigProblem::QuantizationMetadataNotJson { message: error.to_string() },
                    })?;
                    Some(serde_json::json!({ "quantization": entry }))
                }
                None => None,
            };
            return QuantizedFolder::from_parts(archive, config, path);
        }
        let overlay = path.join(OVERLAY_FILE);
        QuantizedFolder::open_with_overlay(path, overlay.is_file().then_some(overlay.as_path()))
    }

    /// Opens the folder `dir` and joins the entries of `overlay` to it (a union: a name in both
    /// is an error).
    ///
    /// # Errors
    /// As [`QuantizedFolder::open`].
    pub fn open_with_overlay(dir: impl AsRef<Path>, overlay: Option<&Path>) -> Result<QuantizedFolder> {
        let dir = dir.as_ref();
        let mut archive = open_model_files(dir)?;
        if let Some(overlay) = overlay {
            archive = Archive::union([archive, Archive::open(overlay)?])?;
        }
        let config_path = dir.join("config.json");
        let config = if config_path.is_file() {
            let text = crate::config::read_text(&config_path)?;
            Some(serde_json::from_str(&text).map_err(|error| Error::Config {
                path: config_path.clone(),
                problem: ConfigProblem::NotJson { message: error.to_string() },
            })?)
        } else {
            None
        };
        QuantizedFolder::from_parts(archive, config, &config_path)
    }

    /// A folder view of an archive and an optional model configuration.
    ///
    /// # Errors
    /// [`Error::Config`] for a malformed `quantization` entry.
    pub fn from_parts(archive: Archive, config: Option<Value>, config_path: &Path) -> Result<QuantizedFolder> {
        let quantization = match &config {
            Some(config) => QuantizationConfig::from_config(config, config_path)?,
            None => None,
        };
        Ok(QuantizedFolder { archive, config, quantization })
    }

    /// All entries (the overlay's included).
    pub fn archive(&self) -> &Archive {
        &self.archive
    }

    /// The model configuration, when the folder has one.
    pub fn config(&self) -> Option<&Value> {
        self.config.as_ref()
    }

    /// The `quantization` entry of the configuration.
    pub fn quantization(&self) -> Option<&QuantizationConfig> {
        self.quantization.as_ref()
    }

    /// The names (module paths) of every logical weight: each `NAME` with a `NAME.weight` or a
    /// `NAME.seeds` entry, in entry order.
    pub fn weights(&self) -> Vec<String> {
        let mut seen = std::collections::HashSet::new();
        self.archive
            .names()
            .filter_map(|name| name.strip_suffix(".weight").or_else(|| name.strip_suffix(".seeds")))
            .filter(|stem| seen.insert(stem.to_string()))
            .map(str::to_string)
            .collect()
    }

    /// The entries that belong to the weight `name`: `name.*` with a weight-stream suffix.
    pub fn streams_of(&self, name: &str) -> Vec<String> {
        const STREAMS: [&str; 8] = ["weight", "scales", "biases", "seeds", "nibbles", "coefs", "exp_bias", "codes"];
        STREAMS.iter().map(|stream| format!("{name}.{stream}")).filter(|entry| self.archive.contains(entry)).collect()
    }

    fn meta(&self, name: &str, stream: &str) -> Result<Option<Tensor>> {
        let entry = format!("{name}.{stream}");
        if !self.archive.contains(&entry) {
            return Ok(None);
        }
        let info = self.archive.info(&entry)?;
        Ok(Some(Tensor::meta(info.dtype, &info.shape)))
    }

    fn unknown(&self, name: &str) -> Error {
        Error::UnknownEncoding {
            origin: self.archive.origin().to_string(),
            name: name.to_string(),
            found: self.streams_of(name),
        }
    }

    /// How the weight `name` is stored, from headers alone. Affine bits and group size come
    /// from the configuration (its override for `name`, else its default) or, without one,
    /// from the shapes, trying group sizes 64, 32 and 128 in that order.
    ///
    /// # Errors
    /// [`Error::UnknownEncoding`], [`Error::UnknownAffineSpec`], and
    /// [`Error::QuantizedWeight`] for a stream whose dtype or shape does not fit.
    pub fn encoding(&self, name: &str) -> Result<WeightEncoding> {
        Ok(self.check(name)?.encoding())
    }

    /// An error of putting the streams of `name` together, naming the archive and the weight.
    fn streams_error(&self, name: &str) -> impl FnOnce(nnx_core::Error) -> Error {
        let (origin, name) = (self.archive.origin().to_string(), name.to_string());
        move |source| Error::QuantizedWeight { origin, name, source: Box::new(source) }
    }

    /// Checks every stream of `name` from headers; the result holds meta tensors.
    fn check(&self, name: &str) -> Result<EncodedWeight> {
        if let Some(seeds) = self.meta(name, "seeds")? {
            let exp_bias = self.meta(name, "exp_bias")?.ok_or_else(|| self.unknown(name))?;
            let (encoding, coefficients) = match (self.meta(name, "nibbles")?, self.meta(name, "coefs")?) {
                (Some(nibbles), None) => (SeedEncoding::Seed4, nibbles),
                (None, Some(coefs)) => (SeedEncoding::Seed4P4, coefs),
                _ => return Err(self.unknown(name)),
            };
            let codes = self.meta(name, "codes")?;
            let weight =
                SeedWeight::new(encoding, seeds, coefficients, exp_bias, codes).map_err(self.streams_error(name))?;
            return Ok(EncodedWeight::Seed(weight));
        }
        let Some(weight) = self.meta(name, "weight")? else { return Err(self.unknown(name)) };
        match (self.meta(name, "scales")?, self.meta(name, "biases")?) {
            (Some(scales), Some(biases)) => {
                let spec = self.affine_spec(name, &weight, &scales)?;
                let weight = AffineWeight::new(weight, scales, biases, spec).map_err(self.streams_error(name))?;
                Ok(EncodedWeight::Affine(weight))
            }
            (None, None) if weight.dtype().is_castable_float() => Ok(EncodedWeight::Float(weight)),
            _ => Err(self.unknown(name)),
        }
    }

    fn affine_spec(&self, name: &str, weight: &Tensor, scales: &Tensor) -> Result<AffineSpec> {
        // A module is quantized when its `.scales` entry exists, even if the configuration's
        // overrides say otherwise; the default spec then applies.
        if let Some(config) = &self.quantization {
            return Ok(config.spec_for(name).unwrap_or(config.default));
        }
        let packed = weight.shape().last().copied().unwrap_or(0) as u128;
        let groups = scales.shape().last().copied().unwrap_or(0) as u128;
        for group_size in [64, 32, 128] {
            // In u128, where shapes of any size multiply without overflow.
            let columns = groups * group_size as u128;
            if columns > 0 && (packed * 32).is_multiple_of(columns) {
                let bits = u32::try_from(packed * 32 / columns).unwrap_or(u32::MAX);
                if let Ok(spec) = AffineSpec::new(bits, group_size) {
                    return Ok(spec);
                }
            }
        }
        Err(Error::UnknownAffineSpec { origin: self.archive.origin().to_string(), name: name.to_string() })
    }

    /// The weight `name` with its streams, checked from headers before any byte is read.
    ///
    /// # Errors
    /// As [`QuantizedFolder::encoding`], and the errors of opening shards.
    pub fn weight(&self, name: &str) -> Result<EncodedWeight> {
        let get = |stream: &str| self.archive.try_get(&format!("{name}.{stream}"));
        Ok(match self.check(name)? {
            EncodedWeight::Float(_) => EncodedWeight::Float(get("weight")?),
            EncodedWeight::Affine(meta) => EncodedWeight::Affine(
                AffineWeight::new(get("weight")?, get("scales")?, get("biases")?, meta.spec())
                    .map_err(self.streams_error(name))?,
            ),
            EncodedWeight::Seed(meta) => {
                let codes = meta.codes.as_ref().map(|_| get("codes")).transpose()?;
                EncodedWeight::Seed(
                    SeedWeight::new(
                        meta.encoding,
                        get("seeds")?,
                        get(meta.encoding.coefficient_stream())?,
                        get("exp_bias")?,
                        codes,
                    )
                    .map_err(self.streams_error(name))?,
                )
            }
        })
    }

    #[cfg(feature = "kernels")]
    fn bias(&self, name: &str) -> Result<Option<Tensor>> {
        let entry = format!("{name}.bias");
        self.archive.contains(&entry).then(|| self.archive.try_get(&entry)).transpose()
    }

    /// The affine-quantized linear layer at `name`, with `name.bias` when present.
    ///
    /// # Errors
    /// As [`QuantizedFolder::weight`]; [`Error::UnknownEncoding`] when the weight is not affine.
    #[cfg(feature = "kernels")]
    pub fn quantized_linear(&self, name: &str) -> Result<QuantizedLinear> {
        match self.weight(name)? {
            EncodedWeight::Affine(weight) => {
                QuantizedLinear::new(weight, self.bias(name)?).map_err(self.streams_error(name))
            }
            _ => Err(self.unknown(name)),
        }
    }

    /// The SEED4 / SEED4P4 linear layer at `name`, with `name.bias` when present.
    ///
    /// # Errors
    /// As [`QuantizedFolder::weight`]; [`Error::UnknownEncoding`] when the weight is not a seed
    /// weight.
    #[cfg(feature = "kernels")]
    pub fn seed_linear(&self, name: &str) -> Result<SeedLinear> {
        match self.weight(name)? {
            EncodedWeight::Seed(weight) => SeedLinear::new(weight, self.bias(name)?).map_err(self.streams_error(name)),
            _ => Err(self.unknown(name)),
        }
    }
}

/// The model files of a folder, without the overlay file (see [`format::detect_quantized`]).
fn open_model_files(dir: &Path) -> Result<Archive> {
    format::build(format::detect_quantized(dir)?)
}

/// Writes `archive` as a model folder: page-aligned shards `model-0000K-of-0000N.safetensors`
/// of at most `max_shard_bytes` (default [`DEFAULT_SHARD_BYTES`]) with
/// `model.safetensors.index.json`, metadata `{"format": "mlx"}`, all streams of one weight in
/// one shard, and `config.json` when `config` is given (written atomically after the weights).
///
/// # Errors
/// [`Error::Io`] when the folder cannot be created or written, and the errors of
/// [`Archive::save_with`].
pub fn save_folder(
    dir: impl AsRef<Path>,
    archive: &Archive,
    config: Option<&Value>,
    max_shard_bytes: Option<u64>,
) -> Result<()> {
    let dir = dir.as_ref();
    std::fs::create_dir_all(dir).map_err(Error::io("create", dir))?;
    let options = SaveOptions {
        metadata: [("format".to_string(), "mlx".to_string())].into(),
        page_align: true,
        max_shard_bytes: Some(max_shard_bytes.unwrap_or(DEFAULT_SHARD_BYTES)),
        group_streams: true,
    };
    archive.save_with(dir.join("model.safetensors"), &options)?;
    if let Some(config) = config {
        let path = dir.join("config.json");
        let text = serde_json::to_string_pretty(config).expect("JSON values always serialize") + "\n";
        write_atomic(&path, text.as_bytes())?;
    }
    Ok(())
}
