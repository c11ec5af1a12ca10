//! A distributed checkpoint's `.metadata` of arbitrary bytes beside the `.distcp` files of the
//! `sharded` fixture: opening the folder and reading every entry may fail but must never panic,
//! run anything, or allocate past the memory limit (the pickle names chunks, offsets, files).

#![no_main]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use nnx::Archive;

/// The scratch folder holding the fixture's item files, copied once.
fn folder() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = nnx_fuzz::scratch("dcp").join("checkpoint");
        std::fs::create_dir_all(&dir).expect("the scratch folder can be created");
        let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/dcp/sharded");
        for rank in 0..4 {
            let name = format!("__{rank}_0.distcp");
            std::fs::copy(fixture.join(&name), dir.join(&name)).expect("the fixture's items can be copied");
        }
        dir
    })
}

fuzz_target!(|data: &[u8]| {
    let dir = folder();
    nnx_fuzz::write(&dir.join(".metadata"), data);
    match Archive::open(dir) {
        Ok(archive) => nnx_fuzz::read_every_entry(&archive),
        Err(error) => {
            let _ = error.to_string();
        }
    }
});
