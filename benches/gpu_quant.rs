//! Quantized kernels on the GPU beside the host's, in the same run: MLX affine Q4 and Q8 (group
//! 64, bf16 scales as in mlx-lm checkpoints) dequantized and multiplied with 1 and 32 input
//! rows, and SEED4 / SEED4P4 decoded and multiplied with one input row, on a `SIZE x SIZE`
//! weight; and, for reference, the dense kernels on the same weight in bf16. Decodes report
//! GB/s (packed streams read plus values written), products GFLOP/s (`2 m n k`, counted on the
//! logical weight).
//!
//! `cargo bench --bench gpu_quant`. The adapter is `NNX_GPU` (default 0); without one the bench
//! says why and exits successfully. `NNX_BENCH_SIZE` sets the size (default 4096, a multiple of
//! 128). Every case runs once to warm up (kernels compile on the first launch), then is timed
//! for up to [`BUDGET`] (at most [`MAX_RUNS`] runs) and reports its best run. GPU work is
//! asynchronous, so each timed GPU run ends by reading back one row of its result. On Mesa's
//! lavapipe (a CPU rasterizer) the GPU column measures shaders compiled for the same cores.

#[allow(dead_code)]
mod common;

use common::values;

use std::hint::black_box;
use std::time::{Duration, Instant};

use nnx::quant::{AffineSpec, AffineWeight, QuantizedLinear, SeedEncoding, SeedLinear, SeedWeight, pack_seed_codes};

use nnx::{DType, Device, Error, Gpu, Tensor};

/// The errors of tensors and devices.
type Result<T> = std::result::Result<T, Error>;

/// Rows and columns of the weight unless `NNX_BENCH_SIZE` says otherwise.
const SIZE: usize = 4096;
/// How long each side of a case is timed after its warm-up run.
const BUDGET: Duration = Duration::from_millis(1500);
/// The most timed runs of one side of a case.
const MAX_RUNS: usize = 10;

/// The best of the timed runs of `run`, after one warm-up run.
fn best(mut run: impl FnMut() -> Result<()>) -> Result<Duration> {
    run()?;
    let started = Instant::now();
    let mut best = Duration::MAX;
    for _ in 0..MAX_RUNS {
        let began = Instant::now();
        run()?;
        best = best.min(began.elapsed());
        if started.elapsed() >= BUDGET {
            break;
        }
    }
    Ok(best)
}

/// The unit a case's work is counted in.
#[derive(Clone, Copy)]
enum Unit {
    Bytes,
    Flops,
}

/// One row of the table.
struct Case {
    name: String,
    work: f64,
    unit: Unit,
    gpu: Result<Duration>,
    cpu: Result<Duration>,
}

impl Case {
    fn cell(&self, time: &Result<Duration>) -> String {
        match time {
            Ok(time) => {
                let rate = self.work / time.as_secs_f64() / 1e9;
                let unit = match self.unit {
                    Unit::Bytes => "GB/s",
                    Unit::Flops => "GFLOP/s",
                };
                format!("{:.2} ms | {rate:.2} {unit}", time.as_secs_f64() * 1e3)
            }
            Err(_) => "failed | -".to_string(),
        }
    }
}

/// Times a GPU decode: the whole output, synchronised by reading its first row back.
fn gpu_decode(decode: impl Fn() -> Result<Tensor<Gpu>>) -> Result<Duration> {
    best(|| {
        let out = decode()?;
        out.reshape(&[out.len()])?.narrow(0, 0, 8)?.to_host()?;
        Ok(())
    })
}

/// Times a GPU product, synchronised by reading its first row back.
fn gpu_product(product: impl Fn() -> Result<Tensor<Gpu>>) -> Result<Duration> {
    best(|| {
        product()?.narrow(0, 0, 1)?.to_host()?;
        Ok(())
    })
}

/// Times a host computation.
fn cpu<T>(run: impl Fn() -> Result<T>) -> Result<Duration> {
    best(|| {
        black_box(run()?);
        Ok(())
    })
}

/// The bytes of a tensor's elements.
fn size(tensor: &Tensor) -> f64 {
    tensor.byte_len() as f64
}

fn affine_cases(gpu: &Gpu, n: usize, bits: u32, cases: &mut Vec<Case>) -> Result<()> {
    let source = Tensor::from_vec(values(n * n, u64::from(bits)), &[n, n])?.to_dtype(DType::BF16)?;
    let weight = AffineWeight::quantize(&source, AffineSpec::new(bits, 64)?)?;
    let streams = size(&weight.weight) + size(&weight.scales) + size(&weight.biases);
    let placed = weight.place(gpu)?;
    cases.push(Case {
        name: format!("Q{bits} g64 dequantize to bf16"),
        work: streams + (n * n * 2) as f64,
        unit: Unit::Bytes,
        gpu: gpu_decode(|| placed.dequantize()),
        cpu: cpu(|| weight.dequantize()),
    });
    let layer = QuantizedLinear::new(weight, None)?;
    let device = layer.place(gpu)?;
    for m in [1, 32] {
        let x = Tensor::from_vec(values(m * n, 7 + m as u64), &[m, n])?;
        let on_device = x.to_device(gpu)?;
        cases.push(Case {
            name: format!("Q{bits} g64 matmul, m = {m}"),
            work: 2.0 * (m * n * n) as f64,
            unit: Unit::Flops,
            gpu: gpu_product(|| device.forward(&on_device)),
            cpu: cpu(|| layer.forward(&x)),
        });
    }
    Ok(())
}

/// The products of the same weight in bf16 with the dense kernels, for reference.
fn dense_cases(gpu: &Gpu, n: usize, cases: &mut Vec<Case>) -> Result<()> {
    let weight = Tensor::from_vec(values(n * n, 1), &[n, n])?.to_dtype(DType::BF16)?;
    let on_device = weight.to_device(gpu)?;
    for m in [1, 32] {
        let x = Tensor::from_vec(values(m * n, 7 + m as u64), &[m, n])?;
        let x_device = x.to_device(gpu)?;
        cases.push(Case {
            name: format!("dense bf16 linear, m = {m} (reference)"),
            work: 2.0 * (m * n * n) as f64,
            unit: Unit::Flops,
            gpu: gpu_product(|| x_device.linear(&on_device, None)),
            cpu: cpu(|| x.linear(&weight, None)),
        });
    }
    Ok(())
}

/// A seed weight with random streams (decoding costs the same for any values).
fn seed_weight(encoding: SeedEncoding, n: usize) -> Result<SeedWeight> {
    let blocks = n * n / 8;
    let seeds: Vec<u16> = values(blocks, 3).iter().map(|v| ((v.to_bits() >> 7) as u16).max(1)).collect();
    let words: Vec<u16> = values(blocks, 4).iter().map(|v| (v.to_bits() >> 5) as u16).collect();
    let shape = [1, n, n / 8];
    let codes = (encoding == SeedEncoding::Seed4P4).then(|| {
        let codes: Vec<u8> = (0..blocks).map(|g| (g % 16) as u8).collect();
        Tensor::from_vec(pack_seed_codes(&codes), &[1, n, n / 16])
    });
    SeedWeight::new(
        encoding,
        Tensor::from_vec(seeds, &shape)?,
        Tensor::from_vec(words, &shape)?,
        Tensor::from_vec(vec![-20i32], &[1])?,
        codes.transpose()?,
    )
}

fn seed_cases(gpu: &Gpu, n: usize, encoding: SeedEncoding, cases: &mut Vec<Case>) -> Result<()> {
    let weight = seed_weight(encoding, n)?;
    let streams = size(&weight.seeds) + size(&weight.coefficients) + weight.codes.as_ref().map_or(0.0, size);
    let placed = weight.place(gpu)?;
    cases.push(Case {
        name: format!("{} decode to bf16", encoding.name()),
        work: streams + (n * n * 2) as f64,
        unit: Unit::Bytes,
        gpu: gpu_decode(|| placed.decode()),
        cpu: cpu(|| weight.decode()),
    });
    let layer = SeedLinear::new(weight, None)?;
    let device = layer.place(gpu)?;
    let x = Tensor::from_vec(values(n, 11), &[1, n])?;
    let on_device = x.to_device(gpu)?;
    cases.push(Case {
        name: format!("{} matmul, m = 1", encoding.name()),
        work: 2.0 * (n * n) as f64,
        unit: Unit::Flops,
        gpu: gpu_product(|| device.forward(&on_device)),
        cpu: cpu(|| layer.forward(&x)),
    });
    Ok(())
}

fn main() {
    let index = std::env::var("NNX_GPU").ok().and_then(|index| index.parse().ok()).unwrap_or(0);
    let gpu = match Gpu::open(index) {
        Ok(gpu) => gpu,
        Err(error) => {
            println!("no GPU to run on: {error}");
            return;
        }
    };
    let n = std::env::var("NNX_BENCH_SIZE").ok().and_then(|size| size.parse().ok()).unwrap_or(SIZE);
    assert!(n > 0 && n.is_multiple_of(128), "NNX_BENCH_SIZE must be a positive multiple of 128, not {n}");
    let started = Instant::now();
    let mut cases = Vec::new();
    let run = |result: Result<()>| {
        if let Err(error) = result {
            println!("a case could not be set up: {error}");
        }
    };
    for bits in [4, 8] {
        run(affine_cases(&gpu, n, bits, &mut cases));
    }
    for encoding in [SeedEncoding::Seed4, SeedEncoding::Seed4P4] {
        run(seed_cases(&gpu, n, encoding, &mut cases));
    }
    run(dense_cases(&gpu, n, &mut cases));

    println!(
        "| operation ({n} x {n}) | GPU time | GPU rate | host time | host rate ({} threads) | GPU / host |",
        common::rayon_threads()
    );
    println!("|---|---:|---:|---:|---:|---:|");
    for case in &cases {
        let ratio = match (&case.gpu, &case.cpu) {
            (Ok(gpu), Ok(cpu)) => format!("{:.2}x", cpu.as_secs_f64() / gpu.as_secs_f64()),
            _ => "-".to_string(),
        };
        println!("| {} | {} | {} | {ratio} |", case.name, case.cell(&case.gpu), case.cell(&case.cpu));
    }
    for case in &cases {
        for (side, result) in [("GPU", &case.gpu), ("host", &case.cpu)] {
            if let Err(error) = result {
                println!("{} on the {side}: {}", case.name, error.to_string().replace('\n', "; "));
            }
        }
    }
    println!(
        "\nGPU: {} ({:?}); best of up to {MAX_RUNS} runs each; {:.0} s in all",
        gpu.name(),
        gpu.info().backend,
        started.elapsed().as_secs_f64()
    );
}
