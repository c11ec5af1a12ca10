//! A SafeTensors file of arbitrary bytes: opening it and reading every entry (headers, stored
//! tensors, bytes, typed elements, float casts) may fail but must never panic.

#![no_main]

use libfuzzer_sys::fuzz_target;
use nnx::Archive;

fuzz_target!(|data: &[u8]| {
    let path = nnx_fuzz::scratch("header").join("input.safetensors");
    nnx_fuzz::write(&path, data);
    match Archive::open(&path) {
        Ok(archive) => nnx_fuzz::read_every_entry(&archive),
        Err(error) => {
            let _ = error.to_string();
        }
    }
});
