//! A GGUF file of arbitrary bytes: opening it, reading its metadata and every tensor (decoded
//! to floats and kept packed) may fail but must never panic.

#![no_main]

use libfuzzer_sys::fuzz_target;
use nnx::Archive;

fuzz_target!(|data: &[u8]| {
    let path = nnx_fuzz::scratch("gguf").join("input.gguf");
    nnx_fuzz::write(&path, data);
    match Archive::open(&path) {
        Ok(archive) => {
            if let Some(metadata) = archive.gguf_metadata() {
                for (key, value) in metadata.iter() {
                    let _ = format!("{key}={value}");
                }
            }
            let names: Vec<String> = archive.names().map(str::to_string).collect();
            for name in &names {
                let _ = archive.ggml_type(name);
                if let Ok(packed) = archive.ggml(name) {
                    let _ = packed.dequantize();
                }
            }
            nnx_fuzz::read_every_entry(&archive);
        }
        Err(error) => {
            let _ = error.to_string();
        }
    }
});
