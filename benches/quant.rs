//! Quantization benchmark: nnx against MLX on its CPU backend, on a 4096 x 4096 f32 matrix,
//! printed as a markdown table.
//!
//! Run with `cargo bench --bench quant`. MLX is timed in the same run by the Python of
//! `NNX_PYTHON`, else of the virtual environment of `scripts/setup.sh` (under `NNX_CACHE`,
//! default `~/.cache/nnx`; install MLX there with `pip install mlx mlx-cpu`); its column reads
//! `not run`, with the reason printed, when that Python or MLX is missing, and `n/a` for steps
//! MLX has no counterpart of. Every step runs once as a warm-up and reports the median of the
//! timed runs that follow.

#[allow(dead_code)]
mod common;

use common::values;

use std::hint::black_box;
use std::process::Command;
use std::time::{Duration, Instant};

use nnx::quant::{AffineSpec, AffineWeight, EncodeOptions, QuantizedLinear, SeedEncoding, SeedLinear, SeedWeight};
use nnx::{DType, Tensor};

/// Rows and columns of the matrix.
const SIZE: usize = 4096;
/// Timed runs per step.
const RUNS: usize = 7;

fn median(mut run: impl FnMut()) -> Duration {
    run();
    let mut times: Vec<Duration> = (0..RUNS)
        .map(|_| {
            let start = Instant::now();
            run();
            start.elapsed()
        })
        .collect();
    times.sort();
    times[RUNS / 2]
}

fn ms(duration: Duration) -> String {
    format!("{:.2} ms", duration.as_secs_f64() * 1e3)
}

/// The MLX timings, in milliseconds by step name, or why MLX did not run.
fn mlx() -> Result<serde_json::Value, String> {
    let python = common::python();
    let script = format!(
        r#"
import json, time
import mlx.core as mx
mx.set_default_device(mx.cpu)
N = {SIZE}
RUNS = {RUNS}
w = (mx.random.uniform(shape=(N, N), key=mx.random.key(0)) - 0.5) * 0.04
mx.eval(w)
def med(f):
    mx.eval(f())
    times = []
    for _ in range(RUNS):
        t = time.perf_counter(); mx.eval(f()); times.append(time.perf_counter() - t)
    times.sort()
    return times[RUNS // 2] * 1e3
out = {{}}
out["quantize"] = med(lambda: mx.quantize(w, group_size=64, bits=4))
wq, s, b = mx.quantize(w, group_size=64, bits=4)
mx.eval(wq, s, b)
out["dequantize"] = med(lambda: mx.dequantize(wq, s, b, group_size=64, bits=4))
for m in (1, 32):
    x = mx.random.uniform(shape=(m, N), key=mx.random.key(m))
    mx.eval(x)
    out[f"qmm{{m}}"] = med(lambda: mx.quantized_matmul(x, wq, s, b, transpose=True, group_size=64, bits=4))
    out[f"mm{{m}}"] = med(lambda: x @ w.T)
out["version"] = mx.__version__
print(json.dumps(out))
"#
    );
    let output = Command::new(&python)
        .arg("-c")
        .arg(script)
        .output()
        .map_err(|error| format!("cannot run {}: {error}", python.display()))?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        return Err(format!("{} failed: {}", python.display(), stderr.lines().last().unwrap_or("")));
    }
    serde_json::from_slice(&output.stdout).map_err(|error| format!("{} printed no result: {error}", python.display()))
}

fn main() {
    let mlx = mlx();
    let mlx_ms = |key: &str| match &mlx {
        Ok(times) => times[key].as_f64().map_or("n/a".to_string(), |value| format!("{value:.2} ms")),
        Err(_) => "not run".to_string(),
    };
    let weight = Tensor::from_vec(values(SIZE * SIZE, 1), &[SIZE, SIZE]).unwrap();
    let spec = AffineSpec::new(4, 64).unwrap();
    let mut rows: Vec<[String; 3]> = Vec::new();

    let quantize = median(|| {
        black_box(AffineWeight::quantize(&weight, spec).unwrap());
    });
    rows.push(["quantize Q4 g64".into(), ms(quantize), mlx_ms("quantize")]);
    let quantized = AffineWeight::quantize(&weight, spec).unwrap();
    let dequantize = median(|| {
        black_box(quantized.dequantize().unwrap());
    });
    rows.push(["dequantize Q4 g64 to f32".into(), ms(dequantize), mlx_ms("dequantize")]);

    let layer = QuantizedLinear::new(quantized.clone(), None).unwrap();
    for m in [1, 32] {
        let x = Tensor::from_vec(values(m * SIZE, 7 + m as u64), &[m, SIZE]).unwrap();
        let fused = median(|| {
            black_box(layer.forward(&x).unwrap());
        });
        rows.push([format!("Q4 g64 matmul, batch {m}"), ms(fused), mlx_ms(&format!("qmm{m}"))]);
        let full = median(|| {
            black_box(x.linear(&weight, None).unwrap());
        });
        rows.push([format!("f32 matmul, batch {m}"), ms(full), mlx_ms(&format!("mm{m}"))]);
    }

    // SEED4 decode on streams of the matrix's size (random seeds and coefficients: decoding
    // costs the same for any values).
    let blocks = SIZE * SIZE / 8;
    let seeds: Vec<u16> = values(blocks, 3).iter().map(|v| ((v.to_bits() >> 7) as u16).max(1)).collect();
    let words: Vec<u16> = values(blocks, 4).iter().map(|v| (v.to_bits() >> 5) as u16 & 0xfff7).collect();
    let seed = SeedWeight::new(
        SeedEncoding::Seed4,
        Tensor::from_vec(seeds, &[1, SIZE, SIZE / 8]).unwrap(),
        Tensor::from_vec(words, &[1, SIZE, SIZE / 8]).unwrap(),
        Tensor::from_vec(vec![-20i32], &[1]).unwrap(),
        None,
    )
    .unwrap();
    let decode = median(|| {
        black_box(seed.decode().unwrap());
    });
    let rate = (SIZE * SIZE) as f64 / decode.as_secs_f64() / 1e9;
    rows.push(["SEED4 decode to BF16".into(), format!("{} ({rate:.2} Gweights/s)", ms(decode)), "n/a".into()]);
    let seed_layer = SeedLinear::new(seed, None).unwrap();
    let x = Tensor::from_vec(values(SIZE, 11), &[1, SIZE]).unwrap();
    let seed_matmul = median(|| {
        black_box(seed_layer.forward(&x).unwrap());
    });
    rows.push(["SEED4 matmul, batch 1".into(), ms(seed_matmul), "n/a".into()]);

    let source = Tensor::from_vec(values(64 * 64, 5), &[64, 64]).unwrap().to_dtype(DType::F32).unwrap();
    for encoding in [SeedEncoding::Seed4, SeedEncoding::Seed4P4] {
        let start = Instant::now();
        black_box(SeedWeight::encode(&source, encoding, &EncodeOptions::default()).unwrap());
        let per_second = (64 * 64 / 8) as f64 / start.elapsed().as_secs_f64();
        rows.push([
            format!("{} encoder (65535 seeds per block)", encoding.name()),
            format!("{per_second:.0} blocks/s"),
            "n/a".into(),
        ]);
    }

    println!("| operation ({SIZE} x {SIZE}) | nnx ({} rayon threads) | MLX (CPU) |", common::rayon_threads());
    println!("|---|---:|---:|");
    for [name, ours, theirs] in rows {
        println!("| {name} | {ours} | {theirs} |");
    }
    match &mlx {
        Ok(times) => println!(
            "\nMLX {} via {}; MLX does not report its CPU thread count",
            times["version"].as_str().unwrap_or("?"),
            common::python().display()
        ),
        Err(reason) => println!("\nMLX not run ({reason})"),
    }
}
