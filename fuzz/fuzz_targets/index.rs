//! A shard index of arbitrary bytes beside two small valid shards: opening the folder and the
//! index and reading every entry may fail but must never panic.
//!
//! The shards are `model-00001-of-00002.safetensors` (entries `embed.weight`, F32 [2, 2], and
//! `layers.0.weight`, BF16 [2]) and `model-00002-of-00002.safetensors` (`layers.1.weight`, F16
//! [3], `head.mask`, BOOL [2], `head.ids`, I64 [1]).

#![no_main]

use std::path::Path;
use std::sync::Once;

use libfuzzer_sys::fuzz_target;
use nnx::Archive;

fn write_shards(dir: &Path) {
    let first = nnx_fuzz::safetensors(&[
        ("embed.weight", "F32", &[2, 2], &[0; 16]),
        ("layers.0.weight", "BF16", &[2], &[0x80, 0x3f, 0, 0x40]),
    ]);
    let second = nnx_fuzz::safetensors(&[
        ("layers.1.weight", "F16", &[3], &[0, 0x3c, 0, 0x40, 0, 0x42]),
        ("head.mask", "BOOL", &[2], &[1, 0]),
        ("head.ids", "I64", &[1], &[7, 0, 0, 0, 0, 0, 0, 0]),
    ]);
    nnx_fuzz::write(&dir.join("model-00001-of-00002.safetensors"), &first);
    nnx_fuzz::write(&dir.join("model-00002-of-00002.safetensors"), &second);
}

fuzz_target!(|data: &[u8]| {
    static SHARDS: Once = Once::new();
    let dir = nnx_fuzz::scratch("index");
    SHARDS.call_once(|| write_shards(dir));
    let index = dir.join("model.safetensors.index.json");
    nnx_fuzz::write(&index, data);
    for path in [dir, index.as_path()] {
        match Archive::open(path) {
            Ok(archive) => nnx_fuzz::read_every_entry(&archive),
            Err(error) => {
                let _ = error.to_string();
            }
        }
    }
});
