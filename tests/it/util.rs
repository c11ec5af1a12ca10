//! Helpers shared by the integration tests: locating the fixtures and scratch folders.

use std::path::PathBuf;

/// The golden fixtures (`tests/fixtures` in the repository, or `NNX_FIXTURES`), or a panic
/// that says where they were looked for.
pub fn fixtures() -> PathBuf {
    let dir = std::env::var_os("NNX_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests").join("fixtures"));
    assert!(
        dir.join("README.md").is_file(),
        "fixtures not found at `{}`: they live in the repository's `tests/fixtures`, or set NNX_FIXTURES",
        dir.display()
    );
    dir
}

/// A fresh scratch folder, removed when dropped.
pub fn scratch() -> tempfile::TempDir {
    tempfile::tempdir().expect("a scratch folder can be created")
}

/// Where `scripts/setup.sh` installs what the tests compare against: `NNX_CACHE`, else
/// `~/.cache/nnx`.
pub fn cache_dir() -> PathBuf {
    std::env::var_os("NNX_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache").join("nnx"))
}

/// Runs the `nnx` binary with `args`: exit status (-1 when killed), stdout and stderr.
pub fn run_nnx<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> (i32, String, String) {
    let output =
        std::process::Command::new(env!("CARGO_BIN_EXE_nnx")).args(args).output().expect("the nnx binary runs");
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// The field `key` of a JSON reference file, deserialized as `T` (a panic names the key).
pub fn json_field<T: serde::de::DeserializeOwned>(value: &serde_json::Value, key: &str) -> T {
    serde_json::from_value(value[key].clone()).unwrap_or_else(|error| panic!("reference field `{key}`: {error}"))
}

/// The largest absolute difference between `ours` and `expected`, after checking that they
/// have the same length (a zip alone would silently compare a prefix).
pub fn max_abs_diff(ours: &[f32], expected: &[f32], what: &str) -> f32 {
    assert_eq!(ours.len(), expected.len(), "{what}: {} values, the reference has {}", ours.len(), expected.len());
    ours.iter().zip(expected).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max)
}

/// The example binary `name`, which `cargo test` builds beside the test binaries.
pub fn example_binary(name: &str) -> PathBuf {
    let deps = std::env::current_exe().unwrap().parent().unwrap().to_path_buf();
    let binary = deps.parent().unwrap().join("examples").join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    assert!(
        binary.is_file(),
        "the {name} example is not built at `{}`: run `cargo test` (it builds examples)",
        binary.display()
    );
    binary
}
