//! A Hub answer of arbitrary bytes: the revision listing, `preupload`, git-LFS batch, commit
//! and error parsers may refuse it but must never panic, and a listing they accept names a
//! commit and only file names that stay inside the cache.

#![no_main]

use libfuzzer_sys::fuzz_target;
use nnx::hub::fuzzing;

fuzz_target!(|data: &[u8]| {
    if let Ok((commit, files)) = fuzzing::revision_listing(data) {
        assert!(commit.len() == 40 && commit.bytes().all(|b| b.is_ascii_hexdigit()), "{commit:?}");
        for file in &files {
            assert!(fuzzing::safe_name(file), "{file:?}");
        }
    }
    let _ = fuzzing::preupload_answer(data);
    let _ = fuzzing::lfs_batch_answer(data);
    let _ = fuzzing::commit_answer(data);
    let _ = fuzzing::error_message(data);
    if let Ok(name) = std::str::from_utf8(data) {
        let _ = fuzzing::safe_name(name);
    }
});
