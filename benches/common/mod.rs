//! What the benchmarks share: where the cache of `scripts/setup.sh` is and which Python runs
//! the peers.

use std::path::PathBuf;

/// The cache that `scripts/setup.sh` fills: `NNX_CACHE`, else `~/.cache/nnx`.
pub fn cache_dir() -> PathBuf {
    std::env::var_os("NNX_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache").join("nnx"))
}

/// The Python that runs a peer: `NNX_PYTHON`, else the virtual environment in [`cache_dir`]
/// when it exists, else `python3`.
pub fn python() -> PathBuf {
    if let Some(path) = std::env::var_os("NNX_PYTHON") {
        return PathBuf::from(path);
    }
    let venv = cache_dir().join("venv").join("bin").join("python");
    if venv.exists() { venv } else { PathBuf::from("python3") }
}

/// Deterministic values in `[-0.02, 0.02)` (a xorshift generator seeded by `seed`): weights of
/// the scale of a trained model's, the same in every run.
#[allow(dead_code)]
pub fn values(count: usize, seed: u64) -> Vec<f32> {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..count)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            ((state >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.04
        })
        .collect()
}

/// The threads of the rayon pool that nnx's kernels run on.
pub fn rayon_threads() -> usize {
    rayon::current_num_threads()
}

/// Runs the candle peer (`benches/candle-peer`, its own package, built in release mode on
/// first use into its `target` folder or `NNX_CANDLE_PEER_TARGET`) with `args`, and parses the
/// one JSON object it prints; an error is its last line of stderr.
pub fn candle_peer(args: &[std::ffi::OsString]) -> Result<serde_json::Value, String> {
    let package = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("benches").join("candle-peer");
    let target = std::env::var_os("NNX_CANDLE_PEER_TARGET").map_or_else(|| package.join("target"), PathBuf::from);
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let output = std::process::Command::new(cargo)
        .args(["run", "--release", "--quiet", "--manifest-path"])
        .arg(package.join("Cargo.toml"))
        .arg("--target-dir")
        .arg(target)
        .arg("--")
        .args(args)
        .output()
        .map_err(|error| format!("cargo did not start: {error}"))?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        return Err(stderr.lines().rev().find(|line| !line.trim().is_empty()).unwrap_or("no message").to_string());
    }
    serde_json::from_slice(&output.stdout).map_err(|error| format!("printed no result ({error})"))
}
