//! GPT-2: import a Hugging Face folder into a meta model (views of the mapped file), run the
//! forward pass and decode greedily.
//!
//! ```text
//! cargo run --release --example gpt2 -- [--model DIR] [--ids 3,14,15] [--steps 8]
//! ```
//!
//! `DIR` defaults to the tiny GPT-2 of the shared test fixtures.

use std::path::PathBuf;

use clap::Parser;
use nnx::models::CausalLm;
use nnx::models::gpt2::{Gpt2, Gpt2Config};
use nnx::nn::Init;
use nnx::{Archive, DType};

#[derive(Parser)]
struct Args {
    /// A folder with `config.json` and `model.safetensors`.
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/../shared/fixtures/gpt2-tiny"))]
    model: PathBuf,
    /// Prompt token ids, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "3,14,15,92,65,35,89,79,32,38")]
    ids: Vec<u32>,
    /// Tokens to generate.
    #[arg(long, default_value_t = 8)]
    steps: usize,
}

fn main() -> nnx::Result<()> {
    let args = Args::parse();
    let config = Gpt2Config::from_file(args.model.join("config.json"))?;
    let mut model = Gpt2::new(&config, DType::F32, Init::Meta);
    let report = Archive::open(&args.model)?.import_into(&mut model, "")?;
    println!("imported {} tensors ({} tied) from {}", report.imported.len(), report.tied.len(), args.model.display());
    let logits = model.logits(&args.ids)?;
    let last = logits.argmax_last()?;
    println!("argmax per position: {last:?}");
    let generated = model.generate(&args.ids, args.steps)?;
    println!("greedy: {:?}", &generated[args.ids.len()..]);
    Ok(())
}
