//! GGUF benchmark: opening and importing a GGUF file of about 1 GB against candle 0.11's
//! `gguf_file` reader on the same file (`benches/candle-peer`, skipped with `--no-peers`), and
//! products that read ggml's packed blocks directly
//! (`nnx::quant::ggml::matvec`) against nnx's own f32 product (`Tensor::linear`, which for one
//! input row streams the weight once) on the same shapes, printed as markdown tables.
//!
//! Run with `cargo bench --bench gguf`. One activation row (a decoding step) times weights of
//! 4096 x 4096 and 11008 x 4096 (output x input features, LLaMA-7B's attention and MLP up
//! projections). The products take turns, one run of each per round, after a warm-up round;
//! each reports the median of its runs, and GB/s counts the bytes of the stored weight it
//! reads.

#[allow(dead_code)]
mod common;

use common::values;
#[path = "gguf/open.rs"]
mod open;

use std::hint::black_box;
use std::time::{Duration, Instant};

use half::f16;
use nnx::Tensor;
use nnx::quant::ggml::{GgmlType, matvec};

/// Timed runs per product.
const RUNS: usize = 21;

/// The weights' shapes, output x input features.
const SHAPES: [(usize, usize); 2] = [(4096, 4096), (11008, 4096)];

/// The block types measured.
const TYPES: [GgmlType; 5] = [GgmlType::Q4_0, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K];

/// `rows` rows of `cols` values of `ty`: pseudo-random bytes (the time a product takes does
/// not depend on the values) with finite, normal f16 scales.
fn blocks(ty: GgmlType, rows: usize, cols: usize, seed: u64) -> Vec<u8> {
    let bytes = rows * ty.row_bytes(cols).expect("whole blocks");
    let mut out: Vec<u8> = values(bytes / 4 + 1, seed).iter().flat_map(|v| (v.to_bits() >> 5).to_le_bytes()).collect();
    out.truncate(bytes);
    let scales: &[usize] = match ty {
        GgmlType::Q6_K => &[208],
        GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q4_1 | GgmlType::Q5_1 => &[0, 2],
        _ => &[0],
    };
    for (index, block) in out.chunks_exact_mut(ty.type_size()).enumerate() {
        for &at in scales {
            let scale = 1e-3 * (1.0 + (index % 7) as f32);
            block[at..at + 2].copy_from_slice(&f16::from_f32(scale).to_le_bytes());
        }
    }
    out
}

/// The median time of each of `runs`, after one warm-up round. The products take turns, one
/// run of each per round, so that whatever else the machine does in the meantime slows them
/// alike.
fn medians(runs: &mut [Box<dyn FnMut() + '_>]) -> Vec<Duration> {
    runs.iter_mut().for_each(|run| run());
    let mut times = vec![Vec::with_capacity(RUNS); runs.len()];
    for _ in 0..RUNS {
        for (run, times) in runs.iter_mut().zip(&mut times) {
            let start = Instant::now();
            run();
            times.push(start.elapsed());
        }
    }
    times
        .into_iter()
        .map(|mut times| {
            times.sort();
            times[RUNS / 2]
        })
        .collect()
}

/// One-row products of each block type against the f32 product, one table per shape.
fn products(shapes: &[(usize, usize)]) {
    println!("## One-row products from ggml blocks ({} rayon threads)\n", common::rayon_threads());
    for &(rows, cols) in shapes {
        let x = values(cols, 7);
        let weight = Tensor::from_vec(values(rows * cols, 1), &[rows, cols]).unwrap();
        let input = Tensor::from_vec(x.clone(), &[1, cols]).unwrap();
        let encoded: Vec<Vec<u8>> = TYPES.iter().map(|&ty| blocks(ty, rows, cols, 3)).collect();
        let mut outputs = vec![vec![0f32; rows]; TYPES.len()];
        let mut runs: Vec<Box<dyn FnMut() + '_>> = vec![Box::new(|| {
            black_box(input.linear(&weight, None).unwrap());
        })];
        for ((&ty, blocks), y) in TYPES.iter().zip(&encoded).zip(&mut outputs) {
            let x = &x;
            runs.push(Box::new(move || {
                matvec(ty, blocks, rows, cols, x, y).unwrap();
                black_box(&*y);
            }));
        }
        let times = medians(&mut runs);
        let f32_time = times[0];
        let gigabytes = |bytes: usize, time: Duration| bytes as f64 / time.as_secs_f64() / 1e9;
        println!("{rows} x {cols} (output x input), one input row:\n");
        println!("| type | ms | GB/s of weight | speed-up vs f32 |");
        println!("|---|---:|---:|---:|");
        println!(
            "| F32 (`Tensor::linear`) | {:.3} | {:.1} | 1.00x |",
            f32_time.as_secs_f64() * 1e3,
            gigabytes(rows * cols * 4, f32_time)
        );
        for ((ty, blocks), time) in TYPES.iter().zip(&encoded).zip(&times[1..]) {
            println!(
                "| {ty} | {:.3} | {:.1} | {:.2}x |",
                time.as_secs_f64() * 1e3,
                gigabytes(blocks.len(), *time),
                f32_time.as_secs_f64() / time.as_secs_f64()
            );
        }
        println!();
    }
}

fn main() -> nnx::Result<()> {
    let peers = !std::env::args().any(|arg| arg == "--no-peers");
    open::run(peers)?;
    products(&SHAPES);
    Ok(())
}
