//! Text generation speed (`cargo bench --bench generate`): prefill and decode tokens per second
//! of greedy decoding with a Llama of 134M parameters (hidden 768, 12 layers, 12 heads,
//! intermediate 2048, vocabulary 32000, untied output; random weights), a prompt of 128 tokens
//! and 64 new tokens, with F32 and with BF16 weights, for nnx and, in the same run, for
//! candle-transformers' Llama on the same file and prompt (`benches/candle-peer`, built here
//! with cargo), printed as a markdown table with both sides' threads. A last row is nnx with
//! the F32 model's projections and head quantized to MLX affine Q4 (groups of 64), compared
//! with candle's F32 decoding (candle reads no MLX-quantized checkpoint).
//!
//! The checkpoints (`config.json` and `model.safetensors`, 536 MiB in F32 and 268 MiB in BF16)
//! are written once into `nnx-bench-generate/` under `NNX_BENCH_DIR`, else the system temporary
//! folder, and reused by later runs. The candle peer builds into `NNX_CANDLE_PEER_TARGET`, else
//! `benches/candle-peer/target`; when it cannot be built or run, the table says why.
//! `-- --no-peers` measures nnx alone.
//!
//! Each side runs a short warm-up generation, then three timed generations and reports the
//! medians: the prefill computes the prompt at once, and each of the other 63 tokens is one
//! decoding step through the key/value cache. The machine's other load moves the numbers of
//! both sides; the two run one after the other on the same file.

#[allow(dead_code)]
mod common;

use std::path::{Path, PathBuf};

use nnx::generate::{GenerationConfig, Generator};
use nnx::models::llama::{Llama, LlamaConfig};
use nnx::models::{CausalLm, Quantize};
use nnx::nn::Init;
use nnx::{Archive, DType};

/// Prompt tokens.
const PROMPT: usize = 128;
/// Generated tokens: the first comes from the prefill, the others from decoding steps.
const NEW_TOKENS: usize = 64;
/// Timed generations per side; the medians are reported.
const RUNS: usize = 3;
/// nnx's decoding should be at least this many times as fast as candle's.
const TARGET: f64 = 1.2;

/// The benchmark model, in the fields both readers take.
const CONFIG: &str = r#"{
  "architectures": ["LlamaForCausalLM"],
  "model_type": "llama",
  "hidden_size": 768,
  "intermediate_size": 2048,
  "num_hidden_layers": 12,
  "num_attention_heads": 12,
  "num_key_value_heads": 12,
  "vocab_size": 32000,
  "max_position_embeddings": 2048,
  "rms_norm_eps": 1e-05,
  "rope_theta": 10000.0,
  "tie_word_embeddings": false,
  "bos_token_id": 1,
  "eos_token_id": 2
}"#;

/// The folder holding the checkpoint in `dtype`, written on first use.
fn checkpoint(dtype: DType) -> nnx::Result<PathBuf> {
    let root = std::env::var_os("NNX_BENCH_DIR").map_or_else(std::env::temp_dir, PathBuf::from);
    let folder = root.join("nnx-bench-generate").join(format!("{dtype:?}").to_lowercase());
    let weights = folder.join("model.safetensors");
    if weights.is_file() && std::fs::read_to_string(folder.join("config.json")).is_ok_and(|text| text == CONFIG) {
        return Ok(folder);
    }
    eprintln!("writing the {dtype:?} checkpoint into {}", folder.display());
    let io = |source, path: &Path| nnx::Error::Io { action: "write", path: path.to_path_buf(), source };
    std::fs::create_dir_all(&folder).map_err(|source| io(source, &folder))?;
    let config: LlamaConfig = serde_json::from_str(CONFIG).expect("the benchmark configuration parses");
    let model = Llama::new(&config, dtype, Init::Seeded(2024));
    Archive::export_from(&model, "")?.save(&weights)?;
    std::fs::write(folder.join("config.json"), CONFIG).map_err(|source| io(source, &folder))?;
    Ok(folder)
}

/// The prompt: pseudo-random ids past the special tokens.
fn prompt() -> Vec<u32> {
    let mut state = 0x2545_f491_4f6c_dd1du64;
    (0..PROMPT)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            3 + (state % 31_997) as u32
        })
        .collect()
}

/// One side's result.
struct Measured {
    threads: usize,
    prefill: f64,
    decode: f64,
    generated: Vec<u32>,
}

/// nnx: the folder imported as views of the mapped file.
fn nnx_model(folder: &Path, dtype: DType) -> nnx::Result<Llama> {
    let config = LlamaConfig::from_file(folder.join("config.json"))?;
    let mut model = Llama::new(&config, dtype, Init::Meta);
    Archive::open(folder)?.import_into(&mut model, "")?;
    Ok(model)
}

/// nnx: a warm-up, then the timed generations.
fn nnx_side(model: &impl CausalLm, prompt: &[u32]) -> nnx::Result<Measured> {
    let greedy = |max_new_tokens| GenerationConfig { max_new_tokens, ..GenerationConfig::default() };
    Generator::new(model, &[&prompt[..8]], greedy(4))?.run()?;
    let (mut prefill, mut decode, mut generated) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..RUNS {
        let generation = Generator::new(model, &[prompt], greedy(NEW_TOKENS))?.run()?;
        prefill.push(generation.timings.prefill_tokens_per_second());
        decode.push(generation.timings.decode_tokens_per_second());
        generated = generation.sequences.into_iter().next().unwrap_or_default();
    }
    Ok(Measured { threads: common::rayon_threads(), prefill: median(prefill), decode: median(decode), generated })
}

/// The median of some rates.
fn median(mut rates: Vec<f64>) -> f64 {
    rates.sort_by(f64::total_cmp);
    rates[rates.len() / 2]
}

/// candle-transformers, in `benches/candle-peer` (built in release mode on first use).
fn candle_side(folder: &Path, dtype: DType, prompt: &[u32]) -> Result<Measured, String> {
    let ids: Vec<String> = prompt.iter().map(u32::to_string).collect();
    eprintln!("running the candle peer with {dtype:?} weights (its first build takes minutes)");
    let args = [
        "llama".into(),
        folder.into(),
        format!("{dtype:?}").to_lowercase().into(),
        ids.join(",").into(),
        NEW_TOKENS.to_string().into(),
        RUNS.to_string().into(),
    ];
    let result = common::candle_peer(&args)?;
    let number = |key: &str| result[key].as_f64().ok_or_else(|| format!("no `{key}` in its result"));
    Ok(Measured {
        threads: number("threads")? as usize,
        prefill: number("prefill_tokens_per_s")?,
        decode: number("decode_tokens_per_s")?,
        generated: serde_json::from_value(result["generated_ids"].clone()).map_err(|error| error.to_string())?,
    })
}

/// How far two greedy continuations agree.
fn agreement(ours: &[u32], theirs: &[u32]) -> String {
    match ours.iter().zip(theirs).position(|(a, b)| a != b) {
        None if ours.len() == theirs.len() => "all tokens equal".to_string(),
        None => "lengths differ".to_string(),
        Some(first) => format!("equal up to token {first} of {}", ours.len()),
    }
}

fn main() -> nnx::Result<()> {
    let peers = !std::env::args().any(|arg| arg == "--no-peers");
    let prompt = prompt();
    let mut rows = Vec::new();
    let mut notes = Vec::new();
    let mut candle_f32 = None;
    let mut quantized = None;
    for dtype in [DType::F32, DType::BF16] {
        let folder = checkpoint(dtype)?;
        let model = nnx_model(&folder, dtype)?;
        let ours = nnx_side(&model, &prompt)?;
        if dtype == DType::F32 {
            quantized = Some((model.quantize(4, 64)?, ours.generated.clone()));
        }
        let theirs = if peers { candle_side(&folder, dtype, &prompt) } else { Err("not run (`--no-peers`)".into()) };
        rows.push(format!(
            "| {dtype:?} | nnx | {} | {:.1} | {:.2} | {} |",
            ours.threads,
            ours.prefill,
            ours.decode,
            match &theirs {
                Ok(theirs) => format!("{:.2}x (target {TARGET}x)", ours.decode / theirs.decode),
                Err(_) => "-".to_string(),
            }
        ));
        match &theirs {
            Ok(theirs) => {
                if dtype == DType::F32 {
                    candle_f32 = Some(theirs.decode);
                }
                rows.push(format!(
                    "| {dtype:?} | candle-transformers | {} | {:.1} | {:.2} | 1.00x |",
                    theirs.threads, theirs.prefill, theirs.decode
                ));
                notes.push(format!(
                    "{dtype:?}: greedy ids of nnx and candle: {}",
                    agreement(&ours.generated, &theirs.generated)
                ));
            }
            Err(reason) => rows.push(format!("| {dtype:?} | candle-transformers | - | - | - | not run: {reason} |")),
        }
    }
    if let Some((model, float_ids)) = quantized {
        let ours = nnx_side(&model, &prompt)?;
        rows.push(format!(
            "| Q4 g64 (MLX affine, from F32) | nnx | {} | {:.1} | {:.2} | {} |",
            ours.threads,
            ours.prefill,
            ours.decode,
            candle_f32.map_or("-".to_string(), |theirs| format!("{:.2}x candle F32", ours.decode / theirs)),
        ));
        notes.push(format!("Q4 g64: greedy ids against nnx's F32 ones: {}", agreement(&ours.generated, &float_ids)));
    }
    println!(
        "Llama 134M (hidden 768, 12 layers, 12 heads, vocabulary 32000), prompt {PROMPT}, {NEW_TOKENS} new tokens, \
         greedy, medians of {RUNS} runs\n"
    );
    println!("| weights | implementation | threads | prefill tokens/s | decode tokens/s | decode vs candle |");
    println!("|---|---|---|---|---|---|");
    for row in rows {
        println!("{row}");
    }
    println!();
    for note in notes {
        println!("{note}");
    }
    Ok(())
}
