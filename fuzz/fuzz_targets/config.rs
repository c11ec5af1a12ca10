//! A `config.json` of arbitrary bytes: every model configuration reader and the quantization
//! reader may refuse it but must never panic, and a configuration they accept builds a meta
//! model (dtypes and shapes, no storage) without panicking.

#![no_main]

use libfuzzer_sys::fuzz_target;
use nnx::models::bert::{Bert, BertConfig};
use nnx::models::gpt2::{Gpt2, Gpt2Config};
use nnx::models::llama::{DecoderConfig, Llama, LlamaConfig};
use nnx::nn::Init;
use nnx::quantized::QuantizationConfig;
use nnx::{DType, Module};

/// Meta models are built only up to this many layers: each layer is a handful of small structs
/// even without storage, and a configuration may claim billions.
const MAX_LAYERS: usize = 64;

fn walk(model: &impl Module) {
    let _ = nnx::module_specs(model);
}

fuzz_target!(|data: &[u8]| {
    let path = nnx_fuzz::scratch("config").join("config.json");
    nnx_fuzz::write(&path, data);

    match Gpt2Config::from_file(&path) {
        Ok(config) => {
            let _ = config.inner();
            if config.n_layer <= MAX_LAYERS {
                walk(&Gpt2::new(&config, DType::F32, Init::Meta));
            }
        }
        Err(error) => {
            let _ = error.to_string();
        }
    }
    match LlamaConfig::from_file(&path) {
        Ok(config) => {
            let _ = (config.head_dim(), config.theta(), config.kv_heads());
            if config.num_hidden_layers <= MAX_LAYERS {
                walk(&Llama::new(&config, DType::BF16, Init::Meta));
            }
        }
        Err(error) => {
            let _ = error.to_string();
        }
    }
    match BertConfig::from_file(&path) {
        Ok(config) => {
            if config.num_hidden_layers <= MAX_LAYERS {
                walk(&Bert::new(&config, DType::F32, Init::Meta));
            }
        }
        Err(error) => {
            let _ = error.to_string();
        }
    }
    if let Ok(value) = serde_json::from_slice::<serde_json::Value>(data) {
        match QuantizationConfig::from_config(&value, &path) {
            Ok(Some(config)) => {
                let _ = config.spec_for("model.layers.0.self_attn.q_proj");
                let _ = config.to_json();
            }
            Ok(None) => {}
            Err(error) => {
                let _ = error.to_string();
            }
        }
    }
});
