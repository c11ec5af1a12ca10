//! A quantized folder made from arbitrary bytes: opening it and dequantizing every weight may
//! fail but must never panic.
//!
//! Input layout: a little-endian `u16` length `n`, then `n` bytes of `config.json` (no
//! `config.json` when `n` is 0), then the bytes of `model.safetensors`. A length past the end
//! takes everything that is left. The same `model.safetensors` is also opened as a single file,
//! whose `quantization` metadata stands in for the configuration.

#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use nnx::DType;
use nnx::quantized::QuantizedFolder;

fn read_every_weight(path: &Path) {
    let folder = match QuantizedFolder::open(path) {
        Ok(folder) => folder,
        Err(error) => {
            let _ = error.to_string();
            return;
        }
    };
    if let Some(quantization) = folder.quantization() {
        let _ = quantization.to_json();
    }
    for name in folder.weights() {
        let _ = folder.streams_of(&name);
        nnx_fuzz::report(folder.encoding(&name));
        match folder.weight(&name) {
            Ok(weight) => {
                let _ = weight.encoding();
                let _ = weight.streams(&name);
                match weight.to_float(DType::F32) {
                    Ok(float) => nnx_fuzz::read_tensor(&float),
                    Err(error) => {
                        let _ = error.to_string();
                    }
                }
            }
            Err(error) => {
                let _ = error.to_string();
            }
        }
        nnx_fuzz::report(folder.quantized_linear(&name));
        nnx_fuzz::report(folder.seed_linear(&name));
    }
}

fuzz_target!(|data: &[u8]| {
    let (config, model) = match data {
        [low, high, rest @ ..] => rest.split_at(usize::from(u16::from_le_bytes([*low, *high])).min(rest.len())),
        _ => (&[][..], data),
    };
    let dir = nnx_fuzz::scratch("quantized");
    let config_path = dir.join("config.json");
    if config.is_empty() {
        let _ = std::fs::remove_file(&config_path);
    } else {
        nnx_fuzz::write(&config_path, config);
    }
    let model_path = dir.join("model.safetensors");
    nnx_fuzz::write(&model_path, model);
    read_every_weight(dir);
    read_every_weight(&model_path);
});
