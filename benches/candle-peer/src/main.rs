//! Benchmark peer of `cargo bench --bench generate`: greedy generation with candle-transformers'
//! Llama and its key/value cache, on the same folder (`config.json`, `model.safetensors`) and
//! prompt as nnx, printed as one JSON object.
//!
//! ```text
//! candle-peer llama DIR f32|bf16 ID,ID,... NEW_TOKENS RUNS
//! candle-peer gguf FILE RUNS
//! ```
//!
//! `gguf` is the peer of `cargo bench --bench gguf`: it opens a GGUF file with candle's
//! `gguf_file` reader and reads every tensor into a `QTensor`, printing the median times.
//!
//! The model computes in the dtype given (the file's). A short warm-up generation runs first;
//! then `RUNS` timed generations, each computing the prompt at once (prefill) and
//! `NEW_TOKENS - 1` more tokens one at a time (decode); the medians are printed.

use std::error::Error;
use std::path::PathBuf;
use std::time::Instant;

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::llama::{Cache, Config, Llama, LlamaConfig};

/// The greedy continuation of `prompt`: the generated ids, and the prefill and decode times.
fn generate(
    model: &Llama,
    config: &Config,
    dtype: DType,
    prompt: &[u32],
    new_tokens: usize,
) -> Result<(Vec<u32>, f64, f64), Box<dyn Error>> {
    let device = Device::Cpu;
    let mut cache = Cache::new(true, dtype, config, &device)?;
    let argmax =
        |logits: Tensor| -> Result<u32, Box<dyn Error>> { Ok(logits.squeeze(0)?.argmax(0)?.to_scalar::<u32>()?) };
    let start = Instant::now();
    let logits = model.forward(&Tensor::new(prompt, &device)?.unsqueeze(0)?, 0, &mut cache)?;
    let mut generated = vec![argmax(logits)?];
    let prefill = start.elapsed().as_secs_f64();
    let start = Instant::now();
    for position in prompt.len()..prompt.len() + new_tokens - 1 {
        let last = *generated.last().expect("one token was generated");
        let logits = model.forward(&Tensor::new(&[last], &device)?.unsqueeze(0)?, position, &mut cache)?;
        generated.push(argmax(logits)?);
    }
    Ok((generated, prefill, start.elapsed().as_secs_f64()))
}

/// Median milliseconds of opening `path` (the header) and of importing every tensor.
fn gguf(path: &str, runs: usize) -> Result<(), Box<dyn Error>> {
    use candle_core::quantized::gguf_file::Content;
    let (mut opens, mut imports) = (Vec::new(), Vec::new());
    let mut bytes = 0usize;
    for _ in 0..runs.max(1) {
        let start = Instant::now();
        let mut file = std::fs::File::open(path)?;
        let content = Content::read(&mut file)?;
        opens.push(start.elapsed().as_secs_f64() * 1e3);
        let start = Instant::now();
        bytes = 0;
        for name in content.tensor_infos.keys() {
            let tensor = content.tensor(&mut file, name, &Device::Cpu)?;
            bytes += tensor.storage_size_in_bytes();
        }
        imports.push(start.elapsed().as_secs_f64() * 1e3);
    }
    let median = |mut times: Vec<f64>| {
        times.sort_by(f64::total_cmp);
        times[times.len() / 2]
    };
    let result = serde_json::json!({"open_ms": median(opens), "import_ms": median(imports), "bytes": bytes});
    println!("{result}");
    Ok(())
}

fn main() -> Result<(), Box<dyn Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let [kind, path, runs] = args.as_slice() {
        if kind == "gguf" {
            return gguf(path, runs.parse()?);
        }
    }
    let [model_kind, folder, dtype, ids, new_tokens, runs] = args.as_slice() else {
        return Err("usage: candle-peer llama DIR f32|bf16 ID,ID,... NEW_TOKENS RUNS".into());
    };
    if model_kind != "llama" {
        return Err(format!("unknown model `{model_kind}`: only `llama`").into());
    }
    let folder = PathBuf::from(folder);
    let dtype = match dtype.as_str() {
        "f32" => DType::F32,
        "bf16" => DType::BF16,
        other => return Err(format!("unknown dtype `{other}`: f32 or bf16").into()),
    };
    let prompt: Vec<u32> = ids.split(',').map(str::parse).collect::<Result<_, _>>()?;
    let new_tokens: usize = new_tokens.parse()?;
    let runs: usize = runs.parse()?;
    if prompt.is_empty() || new_tokens < 2 || runs == 0 {
        return Err("a prompt of one token or more, two new tokens or more and one run or more".into());
    }
    let config: LlamaConfig = serde_json::from_slice(&std::fs::read(folder.join("config.json"))?)?;
    let config = config.into_config(false);
    // SAFETY: the benchmark wrote the file before starting this process and leaves it alone
    // until the process ends, so the mapped bytes do not change while they are read.
    let weights =
        unsafe { VarBuilder::from_mmaped_safetensors(&[folder.join("model.safetensors")], dtype, &Device::Cpu)? };
    let model = Llama::load(weights, &config)?;
    generate(&model, &config, dtype, &prompt[..prompt.len().min(8)], 4)?;
    let (mut prefill_rates, mut decode_rates, mut generated) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..runs {
        let (ids, prefill, decode) = generate(&model, &config, dtype, &prompt, new_tokens)?;
        prefill_rates.push(prompt.len() as f64 / prefill);
        decode_rates.push((new_tokens - 1) as f64 / decode);
        generated = ids;
    }
    let median = |mut rates: Vec<f64>| {
        rates.sort_by(f64::total_cmp);
        rates[rates.len() / 2]
    };
    let result = serde_json::json!({
        "threads": candle_core::utils::get_num_threads(),
        "prefill_tokens_per_s": median(prefill_rates),
        "decode_tokens_per_s": median(decode_rates),
        "generated_ids": generated,
    });
    println!("{result}");
    Ok(())
}
