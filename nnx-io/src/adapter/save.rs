//! An adapter written in PEFT's layout, which `PeftModel.from_pretrained` loads.

use std::path::Path;

use serde_json::Value;

use super::report::problem;
use super::{Adapter, AdapterFormat, LoraKind, LoraModule, PEFT_PREFIX};
use crate::archive::Archive;
use crate::error::{Error, Result};

impl Adapter {
    /// Writes the adapter in PEFT's layout into the folder `dir` (created if needed):
    /// `adapter_config.json` (`r` the largest rank, `lora_alpha` and per-module `rank_pattern`
    /// / `alpha_pattern` entries that give every module its rank and scale, `use_dora`,
    /// `lora_bias`, `fan_in_fan_out`, `target_modules`, `modules_to_save`) and
    /// `adapter_model.safetensors` (`base_model.model.<path>.lora_A.weight` ...), which PEFT's
    /// `PeftModel.from_pretrained` loads. An MLX-LM adapter becomes a PEFT one this way.
    ///
    /// # Errors
    /// [`Error::Adapter`] for a GGUF adapter (its names are llama.cpp's, not the module paths
    /// PEFT needs) or modules that mix `fan_in_fan_out`; the errors of writing.
    pub fn save_peft(&self, dir: impl AsRef<Path>) -> Result<()> {
        let dir = dir.as_ref();
        if self.format == AdapterFormat::Gguf {
            return Err(problem(
                &self.path,
                "",
                "is a GGUF adapter, named by llama.cpp's tensor names: PEFT needs the model's module paths (save the PEFT or MLX-LM adapter it was converted from)",
            ));
        }
        let fan_in_fan_out = self.modules.iter().any(|module| module.fan_in_fan_out);
        if let Some(other) =
            self.modules.iter().find(|m| m.fan_in_fan_out != fan_in_fan_out && m.kind == LoraKind::Projection)
        {
            return Err(problem(
                &self.path,
                &other.source,
                "differs from the other modules in `fan_in_fan_out`, which PEFT sets once per adapter",
            ));
        }
        let (_, rank) = self.ranks();
        let alpha = |module: &LoraModule| f64::from(module.scale) * module.rank() as f64;
        let lora_alpha = self.modules.first().map_or(8.0, alpha);
        let (mut rank_pattern, mut alpha_pattern) = (serde_json::Map::new(), serde_json::Map::new());
        let mut targets: Vec<String> = Vec::new();
        let mut archive = Archive::new();
        for module in &self.modules {
            // Each key a regular expression for this one module's whole path.
            let key = regex::escape(&module.source);
            if module.rank() != rank {
                rank_pattern.insert(key.clone(), Value::from(module.rank()));
            }
            if alpha(module) != lora_alpha {
                alpha_pattern.insert(key, Value::from(alpha(module)));
            }
            let last = module.source.rsplit('.').next().unwrap_or(&module.source).to_string();
            if !targets.contains(&last) {
                targets.push(last);
            }
            let stem = format!("{PEFT_PREFIX}{}", module.source);
            let (a, b) = match module.kind {
                LoraKind::Projection => ("lora_A.weight", "lora_B.weight"),
                LoraKind::Lookup => ("lora_embedding_A", "lora_embedding_B"),
            };
            archive.insert(format!("{stem}.{a}"), module.a.clone());
            archive.insert(format!("{stem}.{b}"), module.b.clone());
            if let Some(magnitude) = &module.magnitude {
                archive.insert(format!("{stem}.lora_magnitude_vector"), magnitude.clone());
            }
            if let Some(bias) = &module.bias {
                archive.insert(format!("{stem}.lora_B.bias"), bias.clone());
            }
        }
        targets.sort();
        let mut saved: Vec<&str> = Vec::new();
        for (name, tensor) in &self.saved {
            let stem = name.rsplit_once('.').map_or(name.as_str(), |(stem, _)| stem);
            // The saved weight of an adapted module is its base layer's, as PEFT names it.
            if self.modules.iter().any(|module| module.source == stem) {
                let field = &name[stem.len()..];
                archive.insert(format!("{PEFT_PREFIX}{stem}.base_layer{field}"), tensor.clone());
                continue;
            }
            archive.insert(format!("{PEFT_PREFIX}{name}"), tensor.clone());
            if !saved.contains(&stem) {
                saved.push(stem);
            }
        }
        let config = serde_json::json!({
            "peft_type": "LORA",
            "task_type": self.config.get("task_type").cloned().unwrap_or(Value::Null),
            "base_model_name_or_path": self.config.get("base_model_name_or_path").cloned().unwrap_or(Value::Null),
            "r": rank,
            "lora_alpha": lora_alpha,
            "lora_dropout": 0.0,
            "target_modules": targets,
            "rank_pattern": rank_pattern,
            "alpha_pattern": alpha_pattern,
            "use_rslora": false,
            "use_dora": self.modules.iter().any(|module| module.magnitude.is_some()),
            "lora_bias": self.modules.iter().any(|module| module.bias.is_some()),
            "bias": "none",
            "fan_in_fan_out": fan_in_fan_out,
            "modules_to_save": if saved.is_empty() { Value::Null } else { Value::from(saved) },
            "inference_mode": true,
        });
        std::fs::create_dir_all(dir).map_err(Error::io("create", dir))?;
        let text = serde_json::to_string_pretty(&config).expect("a JSON value serializes") + "\n";
        crate::fs::write_atomic(dir.join("adapter_config.json"), text.as_bytes())?;
        archive.save(dir.join("adapter_model.safetensors"))
    }
}
