//! Opening and importing a GGUF file of about 1 GB (the shapes of a 1.5B model in Q4_K with a
//! Q6_K output), nnx against candle's `gguf_file` reader on the same file in the same run.

use std::path::{Path, PathBuf};
use std::time::Instant;

use nnx::gguf::{GgmlTensor, GgufWriter, Value};
use nnx::quant::ggml::GgmlType;
use nnx::{Archive, Tensor};

const RUNS: usize = 5;

/// Layers, width, MLP width and vocabulary of Qwen2.5-1.5B.
const LAYERS: usize = 28;
const WIDTH: usize = 1536;
const MLP: usize = 8960;
const KV: usize = 256;
const VOCAB: usize = 151_936;

/// Blocks of `ty` for a `[rows, cols]` tensor: bytes from a fixed generator, each block's f16
/// scales set to small finite values so that the tensor decodes to finite numbers.
fn blocks(ty: GgmlType, rows: usize, cols: usize, seed: u64) -> nnx::Result<GgmlTensor> {
    let row = ty.row_bytes(cols).expect("the benchmark's rows hold whole blocks");
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut bytes: Vec<u8> = (0..rows * row)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect();
    let scale = half::f16::from_f32(0.01).to_le_bytes();
    let at = match ty {
        GgmlType::Q6_K => ty.type_size() - 2,
        _ => 0,
    };
    for block in bytes.chunks_exact_mut(ty.type_size()) {
        block[at..at + 2].copy_from_slice(&scale);
        if ty == GgmlType::Q4_K {
            block[2..4].copy_from_slice(&scale);
        }
    }
    Ok(GgmlTensor { ty, shape: vec![rows, cols], data: Tensor::from_vec(bytes, &[rows * row])? })
}

/// The benchmark's file, written once under `target/`.
fn model_file() -> nnx::Result<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("target").join("bench-data");
    let path = dir.join("gguf-1.5b-q4_k.gguf");
    if path.is_file() {
        return Ok(path);
    }
    std::fs::create_dir_all(&dir).map_err(nnx::Error::io("create", &dir))?;
    eprintln!("writing {} (once)", path.display());
    let mut writer = GgufWriter::new();
    writer.metadata_mut().set("general.architecture", Value::String("qwen2".into()));
    writer.metadata_mut().set("qwen2.block_count", Value::U32(LAYERS as u32));
    let norm = Tensor::from_vec(vec![1f32; WIDTH], &[WIDTH])?;
    writer.add("token_embd.weight", blocks(GgmlType::Q4_K, VOCAB, WIDTH, 1)?)?;
    let mut seed = 2;
    for i in 0..LAYERS {
        let mut add = |part: &str, ty, rows, cols| -> nnx::Result<()> {
            seed += 1;
            writer.add(format!("blk.{i}.{part}.weight"), blocks(ty, rows, cols, seed)?)
        };
        add("attn_q", GgmlType::Q4_K, WIDTH, WIDTH)?;
        add("attn_k", GgmlType::Q4_K, KV, WIDTH)?;
        add("attn_v", GgmlType::Q6_K, KV, WIDTH)?;
        add("attn_output", GgmlType::Q4_K, WIDTH, WIDTH)?;
        add("ffn_gate", GgmlType::Q4_K, MLP, WIDTH)?;
        add("ffn_up", GgmlType::Q4_K, MLP, WIDTH)?;
        add("ffn_down", GgmlType::Q6_K, WIDTH, MLP)?;
        writer.add_tensor(format!("blk.{i}.attn_norm.weight"), &norm)?;
        writer.add_tensor(format!("blk.{i}.ffn_norm.weight"), &norm)?;
    }
    writer.add_tensor("output_norm.weight", &norm)?;
    writer.add("output.weight", blocks(GgmlType::Q6_K, VOCAB, WIDTH, 99)?)?;
    writer.write(&path)?;
    Ok(path)
}

fn median(mut times: Vec<f64>) -> f64 {
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

/// candle 0.11 in `benches/candle-peer` (built in release mode on first use): open and import
/// medians in milliseconds.
fn candle(path: &Path) -> Result<(f64, f64), String> {
    eprintln!("running the candle peer (its first build takes minutes)");
    let result = crate::common::candle_peer(&["gguf".into(), path.into(), RUNS.to_string().into()])?;
    let number = |key: &str| result[key].as_f64().ok_or_else(|| format!("no `{key}` in its result"));
    Ok((number("open_ms")?, number("import_ms")?))
}

/// Prints the table: open (header only), import (every tensor ready: nnx's are views of the
/// mapped file, candle's are read into memory) and, for nnx, every byte touched once (what the
/// first product pays when the pages are cached).
pub fn run(peers: bool) -> nnx::Result<()> {
    let path = model_file()?;
    let size = std::fs::metadata(&path).map_err(nnx::Error::io("read", &path))?.len();
    // Read once so both readers find the file in the page cache.
    let _ = std::fs::read(&path);
    let (mut opens, mut imports, mut touched) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..RUNS {
        let start = Instant::now();
        let archive = Archive::open(&path)?;
        opens.push(start.elapsed().as_secs_f64() * 1e3);
        let start = Instant::now();
        let tensors: Vec<GgmlTensor> = archive.names().map(|name| archive.ggml(name)).collect::<nnx::Result<_>>()?;
        imports.push(start.elapsed().as_secs_f64() * 1e3);
        let start = Instant::now();
        let mut sum = 0u64;
        for tensor in &tensors {
            let bytes = tensor.bytes()?;
            sum = bytes.iter().step_by(4096).fold(sum, |acc, &b| acc.wrapping_add(u64::from(b)));
        }
        std::hint::black_box(sum);
        touched.push(start.elapsed().as_secs_f64() * 1e3);
    }
    let (open, import, touch) = (median(opens), median(imports), median(touched));
    let theirs = if peers { candle(&path) } else { Err("not run (`--no-peers`)".into()) };
    println!("\n### Open and import of a {:.2} GB GGUF ({} tensors, Q4_K/Q6_K)\n", size as f64 / 1e9, 4 + LAYERS * 9);
    println!("| step | nnx (ms) | candle 0.11 (ms) | nnx speed-up |");
    println!("|---|---|---|---|");
    match &theirs {
        Ok((their_open, their_import)) => {
            println!("| open (header) | {open:.2} | {their_open:.2} | {:.0}x |", their_open / open);
            println!(
                "| import (every tensor ready) | {import:.2} | {their_import:.1} | {:.0}x |",
                their_import / import
            );
            println!(
                "| import + every page touched | {:.1} | {their_import:.1} | {:.1}x |",
                import + touch,
                their_import / (import + touch)
            );
        }
        Err(why) => {
            println!("| open (header) | {open:.2} | - | - |");
            println!("| import (every tensor ready) | {import:.2} | - | - |");
            println!("| import + every page touched | {:.1} | - | - |", import + touch);
            println!("\ncandle: {why}");
        }
    }
    println!();
    Ok(())
}
