//! Running GGUF files (`cargo bench --bench run [-- FILE.gguf ...]`): nnx's prompt processing
//! and text generation speed side by side with llama.cpp's `llama-bench` on the same files and
//! threads, printed as one markdown table with the peak resident memory of each side.
//!
//! The files are the ones named on the command line, else every `.gguf` in
//! `$NNX_CACHE/bench-models/` (`scripts/models/bench_models.sh` makes a random Llama of 135M
//! parameters in SmolLM-135M's shape there, in F16, Q8_0 and Q4_K_M); with none, the bench says
//! how to make them and exits.
//!
//! The tests are llama-bench's: `pp128` computes a prompt of 128 tokens at once into an empty
//! cache, `tg64` computes 64 tokens one step at a time from an empty cache (each step one token
//! through [`CausalLm::forward_cached`], its logits not sampled: the next id is pseudo-random,
//! as llama-bench's are). Each test warms up (`pp` once, `tg` for [`WARM_UP_STEPS`] steps), then
//! runs [`REPETITIONS`] times, or twice at least once [`BUDGET_SECONDS`] have passed; tokens/s
//! are the mean ± sample standard deviation of the runs' rates, as llama-bench reports them.
//! nnx runs on a rayon pool of [`THREADS`] threads, llama-bench with `-t` [`THREADS`].
//!
//! Each file is measured in a child process (this bench re-run with `NNX_BENCH_RUN_FILE`), so
//! that its peak RSS (`VmHWM`, read at its end) is that file's alone; llama-bench's is the
//! `ru_maxrss` that `wait4` returns for it. Both map the file, so the mapped weights they touch
//! count. To profile one file and test, run the bench binary with `NNX_BENCH_RUN_FILE=FILE` and
//! `NNX_BENCH_RUN_TEST=tg64` (or `pp128`): it measures that alone and prints its JSON.
//! llama-bench is `NNX_LLAMA_BENCH`, else `$NNX_CACHE/llama.cpp/bin/llama-bench`
//! (`scripts/llamacpp/build.sh` builds it), run as `llama-bench -m FILE -p 128 -n 64 -t 2 -r 3
//! -o json`; without it, or with `-- --no-peers`, the table has nnx alone. Both sides run in turn
//! for `--rounds N` rounds (default 3), their runs pooled, so that a machine whose speed drifts
//! weighs on both alike.

#[allow(dead_code)]
mod common;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use nnx::models::CausalLm;

/// Threads of both sides.
const THREADS: usize = 2;
/// Prompt tokens of `pp`.
const PROMPT: usize = 128;
/// Tokens of `tg`.
const GENERATED: usize = 64;
/// Timed runs of each test on the nnx side, after one warm-up run.
const REPETITIONS: usize = 5;
/// The time after which a slow test stops repeating (after 2 runs at least), so that the whole
/// bench stays within minutes.
const BUDGET_SECONDS: f64 = 20.0;
/// Decoding steps of the warm-up before `tg` (llama-bench warms up with one).
const WARM_UP_STEPS: usize = 4;
/// Timed runs of each test on the llama.cpp side (`-r`), after its own warm-up run.
const PEER_REPETITIONS: usize = 3;
/// Rounds of both sides in turn, each round every file once on each side.
const ROUNDS: usize = 3;
/// The environment variable that makes this bench the child measuring one file.
const CHILD: &str = "NNX_BENCH_RUN_FILE";
/// With [`CHILD`]: run only this test (`pp128` or `tg64`), for profiling one of them.
const ONLY: &str = "NNX_BENCH_RUN_TEST";

/// Tokens per second of some runs.
#[derive(Clone, Debug, Default)]
struct Rates(Vec<f64>);

impl Rates {
    fn mean(&self) -> f64 {
        self.0.iter().sum::<f64>() / self.0.len().max(1) as f64
    }

    /// The sample standard deviation, as llama-bench computes it.
    fn std(&self) -> f64 {
        if self.0.len() < 2 {
            return 0.0;
        }
        let mean = self.mean();
        (self.0.iter().map(|rate| (rate - mean).powi(2)).sum::<f64>() / (self.0.len() - 1) as f64).sqrt()
    }

    fn cell(&self) -> String {
        format!("{:.2} ± {:.2}", self.mean(), self.std())
    }
}

/// One side's measurement of one file.
#[derive(Clone, Debug, Default)]
struct Measured {
    prompt: Rates,
    generation: Rates,
    peak_rss_kib: u64,
}

impl Measured {
    /// The runs of `self` and `next` together, and the higher peak.
    fn pool(mut self, next: Measured) -> Measured {
        self.prompt.0.extend(next.prompt.0);
        self.generation.0.extend(next.generation.0);
        self.peak_rss_kib = self.peak_rss_kib.max(next.peak_rss_kib);
        self
    }
}

/// Pseudo-random token ids below `vocab`, past the first few (special) ones.
fn ids(count: usize, vocab: usize, seed: u64) -> Vec<u32> {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..count)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (3 + state % (vocab.max(4) as u64 - 3)) as u32
        })
        .collect()
}

/// `pp`: the prompt at once into a fresh cache.
fn prompt_processing(model: &dyn CausalLm<Device = nnx::Host>, prompt: &[u32]) -> nnx::Result<f64> {
    let mut cache = model.new_cache(1, prompt.len())?;
    let start = Instant::now();
    std::hint::black_box(model.forward_cached(prompt, &mut cache)?);
    Ok(prompt.len() as f64 / start.elapsed().as_secs_f64())
}

/// `tg`: one token per step from an empty cache.
fn text_generation(model: &dyn CausalLm<Device = nnx::Host>, tokens: &[u32]) -> nnx::Result<f64> {
    let mut cache = model.new_cache(1, tokens.len())?;
    let start = Instant::now();
    for token in tokens {
        std::hint::black_box(model.forward_cached(std::slice::from_ref(token), &mut cache)?);
    }
    Ok(tokens.len() as f64 / start.elapsed().as_secs_f64())
}

/// The rates of [`REPETITIONS`] runs of `test`, or of fewer (at least 2) once the runs have
/// taken [`BUDGET_SECONDS`].
fn repeat(mut test: impl FnMut() -> nnx::Result<f64>) -> nnx::Result<Rates> {
    let start = Instant::now();
    let mut rates = Vec::with_capacity(REPETITIONS);
    while rates.len() < REPETITIONS && (rates.len() < 2 || start.elapsed().as_secs_f64() < BUDGET_SECONDS) {
        rates.push(test()?);
    }
    Ok(Rates(rates))
}

/// The peak resident set of this process in KiB (`VmHWM`), 0 where `/proc` has none.
fn peak_rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// The child: loads `file`, runs the tests and prints one JSON object.
fn child(file: &str) -> nnx::Result<()> {
    // The model runs on one of the pool's threads, as llama.cpp's main thread computes beside
    // its workers: a product then splits between two threads instead of being handed across.
    let pool = rayon::ThreadPoolBuilder::new().num_threads(THREADS).build().expect("a rayon pool");
    pool.install(|| measure(file))
}

/// Loads `file`, runs the tests and prints one JSON object.
fn measure(file: &str) -> nnx::Result<()> {
    let start = Instant::now();
    let loaded = nnx::models::load(file)?;
    let load_seconds = start.elapsed().as_secs_f64();
    let model = loaded.model.as_ref();
    let vocab = *model.forward_cached(&[3], &mut model.new_cache(1, 1)?)?.shape().last().unwrap_or(&4);
    let prompt = ids(PROMPT, vocab, 1);
    let tokens = ids(GENERATED, vocab, 2);
    let only = std::env::var(ONLY).ok();
    let wanted = |test: &str| only.as_deref().is_none_or(|only| only == test);
    let mut measured = Measured::default();
    if wanted(&format!("pp{PROMPT}")) {
        prompt_processing(model, &prompt)?;
        measured.prompt = repeat(|| prompt_processing(model, &prompt))?;
    }
    if wanted(&format!("tg{GENERATED}")) {
        text_generation(model, &tokens[..WARM_UP_STEPS])?;
        measured.generation = repeat(|| text_generation(model, &tokens))?;
    }
    let result = serde_json::json!({
        "weights": loaded.weights,
        "threads": rayon::current_num_threads(),
        "load_seconds": load_seconds,
        "prompt": measured.prompt.0,
        "generation": measured.generation.0,
        "peak_rss_kib": peak_rss_kib(),
    });
    println!("{result}");
    Ok(())
}

/// Runs `command` to its end, returning its stdout and its peak RSS in KiB (`ru_maxrss` from
/// `wait4`), or the last line of its stderr when it fails.
fn run_measured(mut command: Command) -> Result<(Vec<u8>, u64), String> {
    let mut process = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|error| format!("did not start: {error}"))?;
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    let mut err_pipe = process.stderr.take().expect("piped stderr");
    let reader = std::thread::spawn(move || {
        let _ = err_pipe.read_to_end(&mut stderr);
        stderr
    });
    let _ = process.stdout.take().expect("piped stdout").read_to_end(&mut stdout);
    let stderr = reader.join().unwrap_or_default();
    let mut status = 0;
    // SAFETY: `rusage` is plain data, for which all zeros is a valid value.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: the pid is our own child, not yet waited for (`process` is never waited on), and
    // both out-pointers are valid for writes.
    let waited = unsafe { libc::wait4(process.id() as libc::pid_t, &mut status, 0, &mut usage) };
    if waited < 0 {
        return Err(format!("wait4 failed: {}", std::io::Error::last_os_error()));
    }
    if !libc::WIFEXITED(status) || libc::WEXITSTATUS(status) != 0 {
        let stderr = String::from_utf8_lossy(&stderr);
        let last = stderr.lines().rev().find(|line| !line.trim().is_empty()).unwrap_or("no message");
        return Err(format!("failed (status {status}): {last}"));
    }
    Ok((stdout, usage.ru_maxrss as u64))
}

/// nnx on `file`, in a child process.
fn nnx_side(file: &Path) -> Result<(Measured, String), String> {
    let exe = std::env::current_exe().map_err(|error| error.to_string())?;
    let mut command = Command::new(exe);
    command.env(CHILD, file);
    let (stdout, _) = run_measured(command)?;
    let result: serde_json::Value =
        serde_json::from_slice(&stdout).map_err(|error| format!("printed no result ({error})"))?;
    let rates = |key: &str| Rates(serde_json::from_value(result[key].clone()).unwrap_or_default());
    let measured = Measured {
        prompt: rates("prompt"),
        generation: rates("generation"),
        peak_rss_kib: result["peak_rss_kib"].as_u64().unwrap_or(0),
    };
    let weights = result["weights"].as_str().unwrap_or("?").trim_start_matches("ggml ").to_string();
    eprintln!(
        "  nnx: loaded in {:.2} s, {} threads",
        result["load_seconds"].as_f64().unwrap_or(0.0),
        result["threads"]
    );
    Ok((measured, weights))
}

/// llama-bench, when it is there.
fn llama_bench() -> Option<PathBuf> {
    let path = std::env::var_os("NNX_LLAMA_BENCH")
        .map(PathBuf::from)
        .unwrap_or_else(|| common::cache_dir().join("llama.cpp").join("bin").join("llama-bench"));
    path.is_file().then_some(path)
}

/// llama-bench on `file`: its JSON's `samples_ts` of the `pp` and `tg` tests.
fn llama_side(bench: &Path, file: &Path) -> Result<Measured, String> {
    let mut command = Command::new(bench);
    command.arg("-m").arg(file);
    for (flag, value) in [("-p", PROMPT), ("-n", GENERATED), ("-t", THREADS), ("-r", PEER_REPETITIONS)] {
        command.args([flag, &value.to_string()]);
    }
    command.args(["-o", "json"]);
    let (stdout, peak_rss_kib) = run_measured(command)?;
    let tests: Vec<serde_json::Value> =
        serde_json::from_slice(&stdout).map_err(|error| format!("printed no JSON ({error})"))?;
    let mut measured = Measured { peak_rss_kib, ..Measured::default() };
    for test in &tests {
        let rates = Rates(serde_json::from_value(test["samples_ts"].clone()).unwrap_or_default());
        match (test["n_prompt"].as_u64(), test["n_gen"].as_u64()) {
            (Some(n), Some(0)) if n == PROMPT as u64 => measured.prompt = rates,
            (Some(0), Some(n)) if n == GENERATED as u64 => measured.generation = rates,
            _ => {}
        }
    }
    Ok(measured)
}

/// The files to measure: the arguments ending in `.gguf`, else the bench-models folder's.
fn files(folder: &Path) -> Vec<PathBuf> {
    let named: Vec<PathBuf> =
        std::env::args().skip(1).filter(|arg| arg.ends_with(".gguf")).map(PathBuf::from).collect();
    if !named.is_empty() {
        return named;
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir(folder)
        .into_iter()
        .flatten()
        .filter_map(|entry| entry.ok().map(|entry| entry.path()))
        .filter(|path| path.extension().is_some_and(|extension| extension == "gguf"))
        .collect();
    found.sort();
    found
}

/// Rounds of both sides in turn (`--rounds N`, default [`ROUNDS`]): a machine whose speed
/// drifts (other work, turbo, a shared host) then weighs on both sides alike.
fn rounds() -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|arg| arg == "--rounds")
        .and_then(|at| args.get(at + 1))
        .and_then(|value| value.parse().ok())
        .filter(|&rounds: &usize| rounds > 0)
        .unwrap_or(ROUNDS)
}

fn mib(kib: u64) -> String {
    if kib == 0 { "-".to_string() } else { format!("{:.0}", kib as f64 / 1024.0) }
}

fn main() -> nnx::Result<()> {
    if let Some(file) = std::env::var_os(CHILD) {
        return child(&file.to_string_lossy());
    }
    let folder = common::cache_dir().join("bench-models");
    let files = files(&folder);
    if files.is_empty() {
        println!(
            "no GGUF files named and none in {}: make them with `scripts/models/bench_models.sh` \
             (a random Llama of 135M parameters in F16, Q8_0 and Q4_K_M), or name files: \
             `cargo bench --bench run -- FILE.gguf ...`",
            folder.display()
        );
        return Ok(());
    }
    let peers = !std::env::args().any(|arg| arg == "--no-peers");
    let bench = if peers { llama_bench() } else { None };
    let rounds = rounds();
    // Per file: nnx's runs with its weights, and llama-bench's, pooled over the rounds; a side
    // that fails keeps its first failure.
    type Ours = Option<Result<(Measured, String), String>>;
    type Theirs = Option<Result<Measured, String>>;
    let mut measured: Vec<(Ours, Theirs)> = files.iter().map(|_| (None, None)).collect();
    for round in 0..rounds {
        for (file, (ours, theirs)) in files.iter().zip(&mut measured) {
            eprintln!("{} (round {} of {rounds})", file.display(), round + 1);
            if !matches!(ours, Some(Err(_))) {
                *ours = Some(match (ours.take(), nnx_side(file)) {
                    (Some(Ok((pooled, weights))), Ok((next, _))) => Ok((pooled.pool(next), weights)),
                    (_, next) => next,
                });
            }
            if let Some(bench) = &bench
                && !matches!(theirs, Some(Err(_)))
            {
                eprintln!("  llama-bench");
                *theirs = Some(match (theirs.take(), llama_side(bench, file)) {
                    (Some(Ok(pooled)), Ok(next)) => Ok(pooled.pool(next)),
                    (_, next) => next,
                });
            }
        }
    }
    let mut rows = Vec::new();
    for (file, (ours, theirs)) in files.iter().zip(measured) {
        let name = file.file_name().map_or_else(|| file.display().to_string(), |name| name.to_string_lossy().into());
        let (ours, weights) = match ours.unwrap_or_else(|| Err("not run".to_string())) {
            Ok(measured) => measured,
            Err(reason) => {
                rows.push(format!("| {name} | - | - | nnx {reason} | - | - | - |"));
                continue;
            }
        };
        for (test, ours_rates, pick) in [
            (format!("pp{PROMPT}"), &ours.prompt, (|m: &Measured| m.prompt.clone()) as fn(&Measured) -> Rates),
            (format!("tg{GENERATED}"), &ours.generation, |m: &Measured| m.generation.clone()),
        ] {
            let (their_cell, ratio, their_rss) = match &theirs {
                Some(Ok(theirs)) if !pick(theirs).0.is_empty() => {
                    let rates = pick(theirs);
                    (rates.cell(), format!("{:.2}", ours_rates.mean() / rates.mean()), mib(theirs.peak_rss_kib))
                }
                Some(Ok(_)) => ("no such test in its output".to_string(), "-".to_string(), "-".to_string()),
                Some(Err(reason)) => (format!("llama-bench {reason}"), "-".to_string(), "-".to_string()),
                None => ("not run".to_string(), "-".to_string(), "-".to_string()),
            };
            rows.push(format!(
                "| {name} | {weights} | {test} | {} | {their_cell} | {ratio} | {} / {their_rss} |",
                ours_rates.cell(),
                mib(ours.peak_rss_kib)
            ));
        }
    }
    println!(
        "\n{THREADS} threads, {rounds} round(s) of both sides in turn; nnx: mean ± std of {REPETITIONS} runs a \
         round (2 for a test slower than {BUDGET_SECONDS} s), llama.cpp (llama-bench): of {PEER_REPETITIONS} runs a \
         round; peak RSS: the highest of the rounds{}\n",
        if bench.is_none() { " (not run: no llama-bench, or `--no-peers`)" } else { "" }
    );
    println!(
        "| file | types (tensors) | test | nnx tok/s | llama.cpp tok/s | nnx / llama.cpp | peak RSS MiB nnx / llama.cpp |"
    );
    println!("|---|---|---|---:|---:|---:|---:|");
    for row in rows {
        println!("{row}");
    }
    Ok(())
}
