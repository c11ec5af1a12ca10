//! llama.cpp's GGUF LoRA file: `adapter.type = lora`, `adapter.lora.alpha`, and factors under
//! the base's GGUF tensor names.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value;

use super::{f32_of, factor_rank, shown};
use crate::adapter::report::problem;
use crate::adapter::{Adapter, AdapterFormat, LoraKind, LoraModule};
use crate::archive::Archive;
use crate::error::Result;

/// A GGUF LoRA file.
pub(super) fn read_gguf(path: &Path) -> Result<Adapter> {
    let archive = Archive::open(path)?;
    let metadata = archive
        .gguf_metadata()
        .ok_or_else(|| problem(path, "", "is not a GGUF file: a GGUF LoRA holds `adapter.type = lora`"))?;
    match metadata.str("adapter.type") {
        Some("lora") => {}
        found => {
            return Err(problem(
                path,
                "adapter.type",
                &format!(
                    "is {:?}, expected \"lora\": convert the adapter with llama.cpp's `convert_lora_to_gguf.py`",
                    found.map(shown)
                ),
            ));
        }
    }
    // llama.cpp's converter writes FLOAT32; any finite number is taken, anything else refused
    // rather than read as "no alpha" (a scale of 1).
    let alpha = match metadata.get("adapter.lora.alpha") {
        None => 0.0,
        Some(value) => match value.as_f64() {
            Some(alpha) if alpha.is_finite() => alpha,
            found => {
                let found = found.map_or_else(|| "not a number".to_string(), |alpha| alpha.to_string());
                return Err(problem(
                    path,
                    "adapter.lora.alpha",
                    &format!(
                        "is {found} ({}), expected a finite number: llama.cpp's `convert_lora_to_gguf.py` writes `lora_alpha` as FLOAT32",
                        value.value_type().name()
                    ),
                ));
            }
        },
    };
    let mut config = serde_json::Map::new();
    for (key, value) in metadata.iter().filter(|(key, _)| key.starts_with("adapter.") || key.starts_with("general.")) {
        let value = value.as_f64().map(Value::from).or_else(|| value.as_str().map(Value::from)).unwrap_or(Value::Null);
        config.insert(key.to_string(), value);
    }
    for name in archive.names() {
        if !name.ends_with(".lora_a") && !name.ends_with(".lora_b") {
            return Err(problem(path, name, "is not a LoRA factor (`.lora_a` or `.lora_b`)"));
        }
    }
    let mut stems: Vec<&str> = archive.names().filter_map(|name| name.strip_suffix(".weight.lora_a")).collect();
    stems.sort_unstable();
    let mut modules = Vec::with_capacity(stems.len());
    for stem in stems {
        let a_name = format!("{stem}.weight.lora_a");
        let b_name = format!("{stem}.weight.lora_b");
        if !archive.contains(&b_name) {
            return Err(problem(path, &a_name, &format!("has no `{b_name}` beside it: the file is incomplete")));
        }
        let a = f32_of(path, &a_name, archive.ggml(&a_name)?.dequantize()?)?;
        let b = f32_of(path, &b_name, archive.ggml(&b_name)?.dequantize()?)?;
        let r = factor_rank(path, (&a_name, &a), (&b_name, &b))?;
        // llama.cpp scales by alpha / r, or by 1 when the file gives no alpha.
        let scale = if alpha == 0.0 { 1.0 } else { (alpha / r as f64) as f32 };
        if !scale.is_finite() {
            return Err(problem(path, "adapter.lora.alpha", &format!("is {alpha}, past what an f32 scale holds")));
        }
        modules.push(LoraModule {
            source: stem.to_string(),
            kind: LoraKind::Projection,
            a,
            b,
            scale,
            fan_in_fan_out: false,
            magnitude: None,
            bias: None,
        });
    }
    Ok(Adapter {
        path: path.to_path_buf(),
        format: AdapterFormat::Gguf,
        modules,
        saved: BTreeMap::new(),
        config: Value::Object(config),
    })
}
