//! What the benchmarks share: where the cache of `scripts/setup.sh` is and which Python runs
//! the peers.

use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

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

/// Writes a SafeTensors file of BF16 `entries` (name, shape) with pseudo-random finite values,
/// a few MiB at a time.
pub fn write_safetensors(path: &Path, entries: &[(String, Vec<usize>)], seed: u64) {
    let mut header = serde_json::Map::new();
    let mut offset = 0u64;
    for (name, shape) in entries {
        let bytes = shape.iter().product::<usize>() as u64 * 2;
        header.insert(
            name.clone(),
            serde_json::json!({"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + bytes]}),
        );
        offset += bytes;
    }
    let mut text = serde_json::Value::Object(header).to_string();
    while !text.len().is_multiple_of(8) {
        text.push(' ');
    }
    let mut out = BufWriter::with_capacity(8 << 20, std::fs::File::create(path).expect("create"));
    out.write_all(&(text.len() as u64).to_le_bytes()).expect("write");
    out.write_all(text.as_bytes()).expect("write");
    let mut state = seed | 1;
    let mut chunk = vec![0u8; 8 << 20];
    let mut left = offset;
    while left > 0 {
        for bytes in chunk.chunks_exact_mut(8) {
            // xorshift64: four BF16 values of random sign and mantissa, exponents 2^-8 to 2^-5.
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let mut word = state;
            for value in bytes.chunks_exact_mut(2) {
                let bits = (word & 0x807F) as u16 | ((0x77 + ((word >> 7) & 3) as u16) << 7);
                value.copy_from_slice(&bits.to_le_bytes());
                word >>= 16;
            }
        }
        let take = left.min(chunk.len() as u64) as usize;
        out.write_all(&chunk[..take]).expect("write");
        left -= take as u64;
    }
    out.flush().expect("flush");
}

/// Runs `command` under GNU time: wall seconds and peak RSS in bytes, or why it failed.
pub fn measured(command: &mut Command) -> Result<(f64, u64), String> {
    let report = std::env::temp_dir().join(format!("nnx-convert-bench-time-{}", std::process::id()));
    let program = command.get_program().to_owned();
    let args: Vec<_> = command.get_args().map(ToOwned::to_owned).collect();
    let mut timed = Command::new("/usr/bin/time");
    timed.arg("-f").arg("%M").arg("-o").arg(&report).arg(program).args(args);
    for (key, value) in command.get_envs() {
        if let Some(value) = value {
            timed.env(key, value);
        }
    }
    let start = Instant::now();
    let output = timed.output().map_err(|error| format!("cannot run: {error}"))?;
    let seconds = start.elapsed().as_secs_f64();
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        return Err(format!("failed: {}", stderr.lines().rev().take(3).collect::<Vec<_>>().join(" / ")));
    }
    let kib: u64 = std::fs::read_to_string(&report)
        .ok()
        .and_then(|text| text.lines().last()?.trim().parse().ok())
        .ok_or("no GNU time report (install `time`)")?;
    let _ = std::fs::remove_file(report);
    Ok((seconds, kib * 1024))
}

pub fn gb(bytes: u64) -> String {
    format!("{:.2} GB", bytes as f64 / 1e9)
}

/// The release `nnx` binary beside the running bench (`target/release/nnx`), or `NNX_BINARY`.
pub fn nnx_binary() -> PathBuf {
    if let Some(binary) = std::env::var_os("NNX_BINARY") {
        return PathBuf::from(binary);
    }
    let exe = std::env::current_exe().expect("the bench's path");
    let release = exe.parent().and_then(Path::parent).expect("target/release");
    release.join(format!("nnx{}", std::env::consts::EXE_SUFFIX))
}

/// The FNV-1a hash of `bytes`: a fingerprint to compare two outputs by.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xCBF2_9CE4_8422_2325u64, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01B3))
}
