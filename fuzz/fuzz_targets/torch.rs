//! A PyTorch checkpoint of arbitrary bytes (zip, legacy or bare pickle): opening it and reading
//! every entry may fail but must never panic, run anything, or allocate past the memory limit.

#![no_main]

use libfuzzer_sys::fuzz_target;
use nnx::Archive;

fuzz_target!(|data: &[u8]| {
    let path = nnx_fuzz::scratch("torch").join("input.pt");
    nnx_fuzz::write(&path, data);
    match Archive::open(&path) {
        Ok(archive) => nnx_fuzz::read_every_entry(&archive),
        Err(error) => {
            let _ = error.to_string();
        }
    }
});
