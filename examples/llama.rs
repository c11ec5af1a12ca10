//! Llama: import a Hugging Face folder into a meta model (views of the mapped file), run the
//! forward pass and decode greedily.
//!
//! ```text
//! cargo run --release --example llama -- [--model DIR] [--ids 1,17,200] [--steps 8]
//! ```
//!
//! `DIR` defaults to the tiny Llama (BF16 weights, kept as BF16) of the shared test fixtures.

use std::path::PathBuf;

use clap::Parser;
use nnx::models::CausalLm;
use nnx::models::llama::{Llama, LlamaConfig};
use nnx::nn::Init;
use nnx::{Archive, DType};

#[derive(Parser)]
struct Args {
    /// A folder with `config.json` and `model.safetensors`.
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/../shared/fixtures/llama-tiny"))]
    model: PathBuf,
    /// Prompt token ids, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,17,200,33,5,99,250,7")]
    ids: Vec<u32>,
    /// Tokens to generate.
    #[arg(long, default_value_t = 8)]
    steps: usize,
}

fn main() -> nnx::Result<()> {
    let args = Args::parse();
    let config = LlamaConfig::from_file(args.model.join("config.json"))?;
    let mut model = Llama::new(&config, DType::BF16, Init::Meta);
    let report = Archive::open(&args.model)?.import_into(&mut model, "")?;
    println!("imported {} tensors from {}", report.imported.len(), args.model.display());
    let logits = model.logits(&args.ids)?;
    let last = logits.argmax_last()?;
    println!("argmax per position: {last:?}");
    let generated = model.generate(&args.ids, args.steps)?;
    println!("greedy: {:?}", &generated[args.ids.len()..]);
    Ok(())
}
