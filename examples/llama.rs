//! Llama: import a Hugging Face folder (grouped-query attention, BF16 weights kept as BF16
//! views of the file) into a meta model, run the forward pass and decode greedily.
//!
//! ```text
//! cargo run --release --example llama -- [--model DIR] [--ids 1,17,200] [--steps 8]
//! ```
//!
//! `DIR` defaults to the tiny Llama of the test fixtures (`tests/fixtures`).

#[path = "common/causal_lm.rs"]
mod causal_lm;

use nnx::DType;
use nnx::models::llama::{Llama, LlamaConfig};
use nnx::nn::Init;

fn main() -> nnx::Result<()> {
    let run = causal_lm::Run::from_args("llama-tiny", &[1, 17, 200, 33, 5, 99, 250, 7]);
    let config = LlamaConfig::from_file(run.folder.join("config.json"))?;
    run.run(Llama::new(&config, DType::BF16, Init::Meta))
}
