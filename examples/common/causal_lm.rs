//! What the GPT-2 and Llama examples share: the command line, loading the model with
//! [`nnx::models::load`] (a transformers folder, a GGUF file, an mlx-community folder or an
//! `hf://` path), and generating from a text prompt (or token ids) on the CPU or a GPU,
//! streaming the text as the tokens arrive.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, ValueEnum};
use nnx::generate::{GenerationConfig, Generator, Sampling, TextStream, Tokenizer};
use nnx::models::{CausalLm, LoadedModel};

/// The command line of the causal language model examples.
#[derive(Parser)]
pub struct Args {
    /// A transformers or mlx-community folder, a GGUF file, or an `hf://` path to either
    /// (default: the example's fixture).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// The prompt, encoded with the model's tokenizer.
    #[arg(long, conflicts_with = "ids")]
    pub prompt: Option<String>,
    /// The prompt as token ids, comma-separated.
    #[arg(long, value_delimiter = ',')]
    pub ids: Vec<u32>,
    /// Tokens to generate (default: the folder's `generation_config.json`, else 32).
    #[arg(long, visible_alias = "steps")]
    pub max_new_tokens: Option<usize>,
    /// Draw tokens at this temperature; 0 chooses the most likely token (greedy).
    #[arg(long)]
    pub temperature: Option<f32>,
    /// Draw among the K most likely tokens only.
    #[arg(long)]
    pub top_k: Option<usize>,
    /// Draw among the most likely tokens whose probability reaches P only.
    #[arg(long)]
    pub top_p: Option<f32>,
    /// Penalise tokens already in the text (1 is none).
    #[arg(long)]
    pub repetition_penalty: Option<f32>,
    /// The seed of the draws.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Stop once the generated text contains this string (repeatable).
    #[arg(long)]
    pub stop: Vec<String>,
    /// Where the model computes.
    #[arg(long, value_enum, default_value_t = Device::Cpu)]
    pub device: Device,
    /// The GPU adapter, in the order of `nnx::Gpu::adapters` (with `--device gpu`).
    #[arg(long, default_value_t = 0)]
    pub gpu_index: usize,
    /// Print one JSON object (prompt and generated ids, tokens per second) instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Where the model computes.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Device {
    /// nnx's CPU kernels.
    Cpu,
    /// A wgpu adapter (`--gpu-index`).
    Gpu,
}

/// Parses the command line, loads the model and generates, reporting an error on stderr with
/// exit code 1.
pub fn main(fixture: &str, default_ids: &[u32]) -> ExitCode {
    let args = match Args::try_parse() {
        Ok(args) => args,
        Err(error) => {
            let _ = error.print();
            return ExitCode::from(if error.use_stderr() { 1 } else { 0 });
        }
    };
    let model = args
        .model
        .clone()
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(fixture));
    match run(&args, &model.to_string_lossy(), default_ids) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {}", error.to_string().replace('\n', "; "));
            ExitCode::from(1)
        }
    }
}

fn run(args: &Args, source: &str, default_ids: &[u32]) -> nnx::Result<()> {
    match args.device {
        Device::Cpu => generate(args, &nnx::models::load(source)?, source, default_ids),
        #[cfg(feature = "gpu")]
        Device::Gpu => {
            let gpu = nnx::Gpu::open(args.gpu_index)?;
            eprintln!("loading the model onto {}", nnx::Device::name(&gpu));
            generate(args, &nnx::models::load_with(source, &nnx::models::LoadOptions::on(gpu))?, source, default_ids)
        }
        #[cfg(not(feature = "gpu"))]
        Device::Gpu => {
            eprintln!("error: `--device gpu` needs the `gpu` feature; build with `--features gpu`");
            std::process::exit(1);
        }
    }
}

/// The model's generation settings with the command line's on top.
fn settings(args: &Args, mut config: GenerationConfig) -> nnx::Result<GenerationConfig> {
    if let Some(max_new_tokens) = args.max_new_tokens {
        config.max_new_tokens = max_new_tokens;
    }
    let (folder_temperature, folder_top_k, folder_top_p, folder_min_p) = match config.sampling {
        Sampling::Random { temperature, top_k, top_p, min_p } => (Some(temperature), top_k, top_p, min_p),
        Sampling::Greedy => (None, None, None, None),
    };
    let drawing = args
        .temperature
        .map_or(folder_temperature.is_some() || args.top_k.is_some() || args.top_p.is_some(), |temperature| {
            temperature > 0.0
        });
    config.sampling = if drawing {
        Sampling::Random {
            temperature: args.temperature.or(folder_temperature).unwrap_or(1.0),
            top_k: args.top_k.or(folder_top_k),
            top_p: args.top_p.or(folder_top_p),
            min_p: folder_min_p,
        }
    } else {
        Sampling::Greedy
    };
    if let Some(penalty) = args.repetition_penalty {
        config.repetition_penalty = penalty;
    }
    config.seed = args.seed;
    config.stop_strings = args.stop.clone();
    Ok(config)
}

/// Generates for one prompt on the model's device, streaming text to stdout and the speeds
/// to stderr, or printing one JSON object.
fn generate<D: nnx::Device>(args: &Args, loaded: &LoadedModel<D>, source: &str, default_ids: &[u32]) -> nnx::Result<()>
where
    Box<dyn CausalLm<Device = D>>: CausalLm<Device = D>,
{
    eprintln!("loaded {} ({}, {} weights)", source, loaded.architecture, loaded.weights);
    let tokenizer: Option<&Tokenizer> = Some(&loaded.tokenizer);
    let prompt = match &args.prompt {
        Some(text) => loaded.tokenizer.encode(text)?,
        None if args.ids.is_empty() => default_ids.to_vec(),
        None => args.ids.clone(),
    };
    let prompt = prompt.as_slice();
    let config = settings(args, loaded.generation.clone())?;
    let mut generator = Generator::new(&loaded.model, &[prompt], config)?;
    if let Some(tokenizer) = tokenizer {
        generator = generator.with_tokenizer(tokenizer);
    }
    let mut stream = tokenizer.map(|tokenizer| TextStream::new(tokenizer, prompt));
    let mut stdout = std::io::stdout().lock();
    let mut write = |text: &str| {
        // A closed pipe (`| head`) ends the output, not the program with a panic.
        let _ = stdout.write_all(text.as_bytes()).and_then(|()| stdout.flush());
    };
    if !args.json {
        match tokenizer {
            Some(tokenizer) => write(&tokenizer.decode(prompt)?),
            None => write(&format!("prompt ids: {prompt:?}\ngenerated ids:")),
        }
    }
    while let Some(tokens) = generator.step()? {
        let Some(token) = tokens[0] else { continue };
        if args.json {
            continue;
        }
        match &mut stream {
            Some(stream) => write(&stream.push(token)?),
            None => write(&format!(" {token}")),
        }
    }
    if let Some(stream) = &mut stream
        && !args.json
    {
        write(&stream.finish()?);
    }
    let timings = generator.timings();
    let generated = generator.generated(0).to_vec();
    if args.json {
        let mut object = serde_json::json!({
            "prompt_ids": prompt,
            "generated_ids": generated,
            "prefill_tokens_per_s": timings.prefill_tokens_per_second(),
            "decode_tokens_per_s": timings.decode_tokens_per_second(),
        });
        if let Some(tokenizer) = tokenizer {
            object["text"] = tokenizer.decode(&generated)?.into();
        }
        write(&format!("{object}\n"));
    } else {
        write("\n");
    }
    eprintln!(
        "prefill: {} tokens in {:.1} ms ({:.1} tokens/s); decode: {} tokens in {:.1} ms ({:.1} tokens/s); stopped: {:?}",
        timings.prefill_tokens,
        timings.prefill.as_secs_f64() * 1e3,
        timings.prefill_tokens_per_second(),
        timings.decode_tokens,
        timings.decode.as_secs_f64() * 1e3,
        timings.decode_tokens_per_second(),
        generator.finish_reason(0),
    );
    Ok(())
}
