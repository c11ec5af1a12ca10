//! A PEFT adapter folder: `adapter_config.json` and `adapter_model.safetensors` (or `.bin`),
//! its per-module ranks and scales.

use std::collections::BTreeMap;
use std::path::Path;

use nnx_core::Tensor;
use serde_json::Value;

use super::patterns::Patterns;
use super::{config_number, describe, f32_of, factor_rank, shown, whole_rank};
use crate::adapter::report::problem;
use crate::adapter::{Adapter, AdapterFormat, LoraKind, LoraModule, PEFT_PREFIX};
use crate::archive::Archive;
use crate::error::Result;

/// A PEFT folder.
pub(super) fn read_peft(dir: &Path, config: Value) -> Result<Adapter> {
    let config_path = dir.join("adapter_config.json");
    if let Some(kind) = config.get("peft_type").and_then(Value::as_str)
        && kind != "LORA"
    {
        return Err(problem(
            &config_path,
            "peft_type",
            &format!("is `{}`; nnx reads LoRA adapters (`LORA`, DoRA included)", shown(kind)),
        ));
    }
    // Every number the scales come from is checked, and every pattern compiled, before the
    // factors are read.
    let rank = match config.get("r") {
        None | Some(Value::Null) => 8,
        Some(value) => whole_rank(value).ok_or_else(|| {
            problem(
                &config_path,
                "r",
                &format!("is {}, expected the factors' rank, a whole number of at least 1", describe(value)),
            )
        })?,
    };
    let alpha = config_number(&config_path, &config, "lora_alpha")?.unwrap_or(8.0);
    let rank_patterns = Patterns::read(&config_path, &config, "rank_pattern")?;
    let alpha_patterns = Patterns::read(&config_path, &config, "alpha_pattern")?;
    let file = ["adapter_model.safetensors", "adapter_model.bin"]
        .iter()
        .map(|name| dir.join(name))
        .find(|path| path.is_file())
        .ok_or_else(|| {
            problem(
                dir,
                "adapter_model.safetensors",
                "is missing (nor is there `adapter_model.bin`): PEFT's `save_pretrained` writes it",
            )
        })?;
    let archive = Archive::open(&file)?;
    let flag = |key: &str| config.get(key).and_then(Value::as_bool).unwrap_or(false);
    let (rslora, fan_in_fan_out) = (flag("use_rslora"), flag("fan_in_fan_out"));

    // Every entry by module path and role.
    #[derive(Default)]
    struct Parts {
        a: Option<(String, Tensor)>,
        b: Option<(String, Tensor)>,
        bias: Option<Tensor>,
        magnitude: Option<Tensor>,
        embedding: bool,
    }
    let mut parts: BTreeMap<String, Parts> = BTreeMap::new();
    let mut order = Vec::new();
    let mut saved = BTreeMap::new();
    for name in archive.names() {
        let Some(path) = name.strip_prefix(PEFT_PREFIX) else {
            return Err(problem(
                &file,
                name,
                &format!(
                    "does not start with `{PEFT_PREFIX}`, as PEFT names every entry: rename the entries or the adapter would match nothing"
                ),
            ));
        };
        let tensor = f32_of(&file, name, archive.try_get(name)?)?;
        let roles: [(&str, u8); 7] = [
            (".lora_A.weight", 0),
            (".lora_B.weight", 1),
            (".lora_B.bias", 2),
            (".lora_embedding_A", 3),
            (".lora_embedding_B", 4),
            (".lora_magnitude_vector.weight", 5),
            (".lora_magnitude_vector", 5),
        ];
        let Some((stem, role)) =
            roles.iter().find_map(|&(suffix, role)| path.strip_suffix(suffix).map(|stem| (stem, role)))
        else {
            // A whole module (`modules_to_save`) under its own name; PEFT also saves the weight
            // of an adapted embedding as `<path>.base_layer.weight`.
            let path = path.replace(".base_layer.", ".");
            saved.insert(path, tensor);
            continue;
        };
        if !parts.contains_key(stem) {
            order.push(stem.to_string());
        }
        let entry = parts.entry(stem.to_string()).or_default();
        match role {
            0 | 3 => entry.a = Some((name.to_string(), tensor)),
            1 | 4 => entry.b = Some((name.to_string(), tensor)),
            2 => entry.bias = Some(tensor),
            _ => entry.magnitude = Some(tensor),
        }
        entry.embedding |= role == 3 || role == 4;
    }
    let mut modules = Vec::with_capacity(order.len());
    for stem in order {
        let parts = parts.remove(&stem).expect("every stem has parts");
        let (Some((a_name, a)), Some((b_name, b))) = (parts.a, parts.b) else {
            return Err(problem(&file, &stem, "has only one of `lora_A` and `lora_B`: the file is incomplete"));
        };
        let r = factor_rank(&file, (&a_name, &a), (&b_name, &b))?;
        let configured = rank_patterns.value(&stem).map_or(rank, |value| value as usize);
        if configured != r {
            return Err(problem(
                &file,
                &a_name,
                &format!(
                    "has rank {r}, but the config gives this module r = {configured}: the config does not belong to these weights"
                ),
            ));
        }
        let alpha = alpha_patterns.value(&stem).unwrap_or(alpha);
        let scale = if rslora { alpha / (r as f64).sqrt() } else { alpha / r as f64 } as f32;
        if !scale.is_finite() {
            return Err(problem(
                &config_path,
                "lora_alpha",
                &format!(
                    "gives `{}` the scale {alpha} / {r}, past what f32 holds: the config is damaged",
                    shown(&stem)
                ),
            ));
        }
        let kind = if parts.embedding { LoraKind::Lookup } else { LoraKind::Projection };
        modules.push(LoraModule {
            source: stem,
            kind,
            a,
            b,
            scale,
            fan_in_fan_out: fan_in_fan_out && kind == LoraKind::Projection,
            magnitude: parts.magnitude,
            bias: parts.bias,
        });
    }
    Ok(Adapter { path: dir.to_path_buf(), format: AdapterFormat::Peft, modules, saved, config })
}
