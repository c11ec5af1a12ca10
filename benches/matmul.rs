//! Square f32 matmul throughput of nnx beside numpy (OpenBLAS) measured in the same run, and
//! the throughput of a bf16-input matmul.
//!
//! `cargo bench --bench matmul`. numpy runs in a Python subprocess: `NNX_PYTHON` if set, else
//! the virtual environment of `scripts/setup.sh` (under `NNX_CACHE`, default `~/.cache/nnx`)
//! when it exists, else `python3`. Without Python or numpy its column reads "not run" and the
//! reason is printed. Both sides print their thread counts (numpy's through `threadpoolctl`
//! when installed).

#[allow(dead_code)]
mod common;

use std::hint::black_box;
use std::process::Command;
use std::time::{Duration, Instant};

use nnx::{DType, Tensor};

/// The square sizes measured.
const SIZES: [usize; 3] = [512, 1024, 2048];

/// The size at which the bf16-input product is measured.
const BF16_SIZE: usize = 1024;

/// Time spent measuring each case, after one warm-up run.
const BUDGET: Duration = Duration::from_secs(2);

/// The numpy side: for each size given on the command line, one line `size gflops`, the
/// best of repeated runs within the same time budget as nnx. The first line describes the BLAS.
const NUMPY_SCRIPT: &str = r#"
import sys, time, json
import numpy as np
try:
    from threadpoolctl import threadpool_info
    info = [{k: d.get(k) for k in ("internal_api", "version", "num_threads", "architecture")} for d in threadpool_info()]
except Exception:
    try:
        blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        info = {k: blas.get(k) for k in ("name", "version", "openblas configuration")}
    except Exception as error:
        info = "unknown (%s)" % error
print("numpy %s, BLAS: %s" % (np.__version__, json.dumps(info)))
try:
    from threadpoolctl import threadpool_info
    print("threads", ",".join(str(d["num_threads"]) for d in threadpool_info() if d.get("user_api") == "blas") or "unknown")
except Exception:
    print("threads unknown (threadpoolctl is not installed)")
rng = np.random.default_rng(0)
budget = float(sys.argv[1])
for n in map(int, sys.argv[2:]):
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    a @ b
    best = float("inf")
    start = time.perf_counter()
    while time.perf_counter() - start < budget or best == float("inf"):
        t = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t)
    print(n, 2.0 * n ** 3 / best / 1e9, flush=True)
"#;

/// A deterministic square matrix with values in `[-1, 1)`.
fn matrix(size: usize, seed: u32) -> Tensor {
    let values = (0..size * size)
        .map(|index| {
            let hash = (index as u32).wrapping_mul(2_654_435_761).wrapping_add(seed.wrapping_mul(40_503));
            (hash >> 8) as f32 / (1u32 << 24) as f32 * 2.0 - 1.0
        })
        .collect();
    Tensor::from_vec(values, &[size, size]).expect("the values fill the shape")
}

/// GFLOP/s of `lhs · rhs` (square, `size`), best of repeated runs.
fn measure(lhs: &Tensor, rhs: &Tensor, size: usize) -> f64 {
    black_box(lhs.matmul(rhs).expect("square operands multiply"));
    let mut best = Duration::MAX;
    let start = Instant::now();
    while start.elapsed() < BUDGET || best == Duration::MAX {
        let began = Instant::now();
        black_box(lhs.matmul(rhs).expect("square operands multiply"));
        best = best.min(began.elapsed());
    }
    2.0 * (size as f64).powi(3) / best.as_secs_f64() / 1e9
}

/// What numpy measured, or why it did not run.
struct Numpy {
    /// numpy and its BLAS.
    config: String,
    /// The BLAS threads.
    threads: String,
    /// GFLOP/s by size.
    results: Vec<(usize, f64)>,
}

/// numpy's GFLOP/s for each size, or why it did not run.
fn numpy() -> Result<Numpy, String> {
    let python = common::python();
    let mut command = Command::new(&python);
    command.arg("-c").arg(NUMPY_SCRIPT).arg(BUDGET.as_secs_f64().to_string());
    command.args(SIZES.iter().map(usize::to_string));
    // Settings that pin OpenBLAS to a slower kernel or cache size are left out of the
    // measurement, so numpy runs as it would by default.
    command.env_remove("OPENBLAS_CORETYPE").env_remove("OPENBLAS_L2_SIZE");
    let output = match command.output() {
        Ok(output) => output,
        Err(error) => return Err(format!("cannot run {}: {error}", python.display())),
    };
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        return Err(format!("{} failed: {}", python.display(), stderr.lines().last().unwrap_or("")));
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let mut lines = stdout.lines();
    let config = lines.next().ok_or_else(|| format!("{} printed nothing", python.display()))?.to_string();
    let threads = lines.next().and_then(|line| line.strip_prefix("threads ")).unwrap_or("unknown").to_string();
    let results = lines
        .filter_map(|line| {
            let (size, gflops) = line.split_once(' ')?;
            Some((size.parse().ok()?, gflops.trim().parse().ok()?))
        })
        .collect();
    Ok(Numpy { config: format!("{config} (via {})", python.display()), threads, results })
}

fn main() {
    println!("square matmul, f32, best of {} s per case\n", BUDGET.as_secs());
    let nnx: Vec<(usize, f64)> = SIZES
        .iter()
        .map(|&size| {
            let (lhs, rhs) = (matrix(size, 1), matrix(size, 2));
            (size, measure(&lhs, &rhs, size))
        })
        .collect();
    let numpy = numpy();
    let numpy_threads = numpy.as_ref().map_or("-", |numpy| numpy.threads.as_str());
    println!(
        "| size | nnx GFLOP/s ({} rayon threads) | numpy GFLOP/s ({numpy_threads} BLAS threads) |",
        common::rayon_threads()
    );
    println!("|---:|---:|---:|");
    for &(size, gflops) in &nnx {
        let reference = numpy
            .as_ref()
            .ok()
            .and_then(|numpy| numpy.results.iter().find(|(n, _)| *n == size))
            .map_or_else(|| "not run".to_string(), |(_, gflops)| format!("{gflops:.1}"));
        println!("| {size} | {gflops:.1} | {reference} |");
    }
    match &numpy {
        Ok(numpy) => println!("\nnumpy: {}", numpy.config),
        Err(reason) => println!("\nnumpy: not run ({reason}); scripts/setup.sh installs it"),
    }
    let (lhs, rhs) = (matrix(BF16_SIZE, 1), matrix(BF16_SIZE, 2));
    let to_bf16 = |tensor: &Tensor| tensor.to_dtype(DType::BF16).expect("f32 casts to bf16");
    let gflops = measure(&to_bf16(&lhs), &to_bf16(&rhs), BF16_SIZE);
    println!("\nnnx bf16 inputs (f32 accumulation), {BF16_SIZE}: {gflops:.1} GFLOP/s");
}
