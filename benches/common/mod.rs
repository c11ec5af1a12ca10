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

/// The threads of the rayon pool that nnx's kernels run on.
pub fn rayon_threads() -> usize {
    rayon::current_num_threads()
}
