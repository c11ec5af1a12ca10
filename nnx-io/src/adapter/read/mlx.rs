//! An MLX-LM adapter folder: `adapter_config.json` with `lora_parameters`, and
//! `adapters.safetensors` with factors in MLX's `x @ lora_a @ lora_b` orientation.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value;

use super::{config_number, describe, f32_of, shown};
use crate::adapter::report::problem;
use crate::adapter::{Adapter, AdapterFormat, LoraKind, LoraModule};
use crate::archive::Archive;
use crate::error::Result;

/// An MLX-LM folder.
pub(super) fn read_mlx(dir: &Path, config: Value) -> Result<Adapter> {
    let config_path = dir.join("adapter_config.json");
    if let Some(kind) = config.get("fine_tune_type").and_then(Value::as_str)
        && kind != "lora"
    {
        let kind = shown(kind);
        return Err(problem(
            &config_path,
            "fine_tune_type",
            &format!("is `{kind}`; nnx reads MLX-LM's `lora` adapters (fuse a `{kind}` one with mlx_lm first)"),
        ));
    }
    let scale = match config_number(&config_path, &config["lora_parameters"], "scale") {
        Ok(scale) => scale.unwrap_or(20.0) as f32,
        Err(_) => {
            let found = describe(&config["lora_parameters"]["scale"]);
            return Err(problem(
                &config_path,
                "lora_parameters.scale",
                &format!("is {found}, expected a finite number"),
            ));
        }
    };
    if !scale.is_finite() {
        return Err(problem(&config_path, "lora_parameters.scale", "is past what f32 holds: the config is damaged"));
    }
    let file = dir.join("adapters.safetensors");
    let archive = Archive::open(&file)?;
    let mut stems: Vec<&str> = archive.names().filter_map(|name| name.strip_suffix(".lora_a")).collect();
    stems.sort_unstable();
    for name in archive.names() {
        if !name.ends_with(".lora_a") && !name.ends_with(".lora_b") {
            return Err(problem(
                &file,
                name,
                "is not a LoRA factor (`.lora_a` or `.lora_b`): nnx reads MLX-LM's LoRA layers",
            ));
        }
    }
    let mut modules = Vec::with_capacity(stems.len());
    for stem in stems {
        let a_name = format!("{stem}.lora_a");
        let b_name = format!("{stem}.lora_b");
        if !archive.contains(&b_name) {
            return Err(problem(&file, &a_name, &format!("has no `{b_name}` beside it: the file is incomplete")));
        }
        // MLX keeps `x @ lora_a @ lora_b`: `lora_a` [in, r], `lora_b` [r, out].
        let a = f32_of(&file, &a_name, archive.try_get(&a_name)?)?;
        let b = f32_of(&file, &b_name, archive.try_get(&b_name)?)?;
        if a.rank() != 2 || b.rank() != 2 || a.shape()[1] != b.shape()[0] || a.shape()[1] == 0 {
            return Err(problem(
                &file,
                &b_name,
                &format!(
                    "is {:?} beside `{a_name}` {:?}: expected [in, r] and [r, out] of the same rank r of at least 1",
                    b.shape(),
                    a.shape()
                ),
            ));
        }
        modules.push(LoraModule {
            source: stem.to_string(),
            kind: LoraKind::Projection,
            a: a.transpose(0, 1)?.contiguous(),
            b: b.transpose(0, 1)?.contiguous(),
            scale,
            // Set per model by `Adapter::in_model_layout`: MLX-LM's factors are in the model's
            // layout, whatever the checkpoint's.
            fan_in_fan_out: false,
            magnitude: None,
            bias: None,
        });
    }
    Ok(Adapter { path: dir.to_path_buf(), format: AdapterFormat::Mlx, modules, saved: BTreeMap::new(), config })
}
