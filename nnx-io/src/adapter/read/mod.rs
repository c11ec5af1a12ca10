//! Reading an adapter: [`Adapter::open`] tells a PEFT folder, an MLX-LM folder and a GGUF LoRA
//! file apart and hands each to its reader; the checks the readers share (factors that are
//! floats stored whole, factor ranks, config numbers) and the quoting of what they refuse.

use std::path::Path;

use nnx_core::{DType, Tensor};
use serde_json::Value;

use super::Adapter;
use super::report::problem;
use crate::error::{Error, Result};

mod gguf;
mod mlx;
mod patterns;
mod peft;

use gguf::read_gguf;
use mlx::read_mlx;
use peft::read_peft;

impl Adapter {
    /// Reads the adapter at `path`: a folder with `adapter_config.json` (PEFT or MLX-LM, told
    /// apart by the config), or a GGUF LoRA file.
    ///
    /// # Errors
    /// [`Error::Adapter`] naming the file and entry for a config or tensor that does not make
    /// an adapter; the errors of reading the files.
    pub fn open(path: impl AsRef<Path>) -> Result<Adapter> {
        let path = path.as_ref();
        if path.is_file() {
            if path.extension().is_some_and(|extension| extension == "gguf") {
                return read_gguf(path);
            }
            return match path.parent() {
                Some(dir) if dir.join("adapter_config.json").is_file() => Adapter::open(dir),
                _ => Err(problem(
                    path,
                    "",
                    "is not an adapter: expected a folder with `adapter_config.json` or a GGUF LoRA file",
                )),
            };
        }
        let config_path = path.join("adapter_config.json");
        let text = std::fs::read_to_string(&config_path).map_err(Error::io("read", &config_path))?;
        let config: Value = serde_json::from_str(&text).map_err(|error| {
            problem(&config_path, "", &format!("is not JSON ({error}): fix or regenerate the file"))
        })?;
        if config.get("lora_parameters").is_some() { read_mlx(path, config) } else { read_peft(path, config) }
    }

    /// [`Adapter::open`] for a local path or an `hf://` one: `hf://owner/repo[@revision]` is
    /// an adapter repository (its `adapter_config.json` and factors fetched into the Hub cache,
    /// or found there offline), `hf://owner/repo/file.gguf` a GGUF LoRA file.
    ///
    /// # Errors
    /// As [`Adapter::open`], and the Hub's errors (a repository without `adapter_config.json`
    /// named).
    pub fn open_source(source: &str) -> Result<Adapter> {
        if !source.starts_with("hf://") || source.ends_with(".gguf") || source.ends_with(".json") {
            return Adapter::open(crate::hub::local_path(source)?);
        }
        let repo = source.trim_end_matches('/');
        let config = crate::hub::local_path(&format!("{repo}/adapter_config.json"))?;
        let dir = config.parent().map(Path::to_path_buf).unwrap_or_default();
        let mut last = None;
        for weights in ["adapter_model.safetensors", "adapters.safetensors", "adapter_model.bin"] {
            match crate::hub::local_path(&format!("{repo}/{weights}")) {
                Ok(_) => return Adapter::open(&dir),
                Err(error) => last = Some(error),
            }
        }
        Err(last.unwrap_or_else(|| problem(&dir, "adapter_model.safetensors", "is missing from the repository")))
    }
}

/// `name`'s tensor from `path` as F32 on the host, owned and contiguous. A factor must be a
/// float whose values are all in the file: a view that repeats a few stored bytes into
/// gigabytes (a zero stride, which a `torch.save` checkpoint can describe) is refused before
/// anything is copied.
fn f32_of(path: &Path, name: &str, tensor: Tensor) -> Result<Tensor> {
    if !tensor.dtype().is_castable_float() {
        return Err(problem(
            path,
            name,
            &format!(
                "is {}: LoRA factors and saved modules are floats (F32, F16, BF16); the file is damaged or not an adapter",
                tensor.dtype()
            ),
        ));
    }
    let limit = tensor.expansion_limit();
    if tensor.check_expansion(limit).is_err() {
        return Err(problem(
            path,
            name,
            &format!(
                "is a view of shape {:?} that repeats the {} bytes it is stored in into {} bytes: an adapter stores each factor whole; save it again (PEFT's `save_pretrained`)",
                tensor.shape(),
                tensor.stored_bytes(),
                tensor.byte_len()
            ),
        ));
    }
    tensor.to_dtype(DType::F32)?.contiguous_within(limit)
}

/// A JSON value as an error quotes it: numbers and booleans as written, a string shortened,
/// anything larger by its kind.
fn describe(value: &Value) -> String {
    match value {
        Value::Null => "null".into(),
        Value::Bool(_) | Value::Number(_) => value.to_string(),
        Value::String(text) => format!("the string `{}`", shown(text)),
        Value::Array(_) => "an array".into(),
        Value::Object(_) => "an object".into(),
    }
}

/// `text` as an error quotes it: printable, and cut after 80 characters.
fn shown(text: &str) -> String {
    let printable = nnx_core::text::printable(text);
    match printable.char_indices().nth(80) {
        Some((end, _)) => format!("{}...", &printable[..end]),
        None => printable.into_owned(),
    }
}

/// The number `key` of the config at `path`, `None` when absent, an error unless finite.
fn config_number(path: &Path, config: &Value, key: &str) -> Result<Option<f64>> {
    match config.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(value) => match value.as_f64() {
            Some(number) if number.is_finite() => Ok(Some(number)),
            _ => Err(problem(path, key, &format!("is {}, expected a finite number", describe(value)))),
        },
    }
}

/// A rank as a config gives it: a whole number of at least 1 (JSON may write it `8.0`).
fn whole_rank(value: &Value) -> Option<usize> {
    let number = value.as_f64()?;
    (number >= 1.0 && number.fract() == 0.0 && number <= u32::MAX as f64).then_some(number as usize)
}

/// The rank `r` of the factors `A` `[r, in]` and `B` `[out, r]` read from `path`, or the error
/// naming both entries when they are not such a pair (a rank of 0 included).
fn factor_rank(path: &Path, (a_name, a): (&str, &Tensor), (b_name, b): (&str, &Tensor)) -> Result<usize> {
    let r = a.shape().first().copied().unwrap_or(0);
    if a.rank() != 2 || b.rank() != 2 || b.shape()[1] != r || r == 0 {
        return Err(problem(
            path,
            b_name,
            &format!(
                "is {:?} beside `{a_name}` {:?}: expected `A` [r, in] and `B` [out, r] of the same rank r of at least 1",
                b.shape(),
                a.shape()
            ),
        ));
    }
    Ok(r)
}
