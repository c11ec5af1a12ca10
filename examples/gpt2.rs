//! GPT-2: import a Hugging Face folder (fused `c_attn`, Conv1D layout, `lm_head` tied to the
//! token embedding) into a meta model, run the forward pass and decode greedily.
//!
//! ```text
//! cargo run --release --example gpt2 -- [--model DIR] [--ids 3,14,15] [--steps 8]
//! ```
//!
//! `DIR` defaults to the tiny GPT-2 of the test fixtures (`tests/fixtures`).

#[path = "common/causal_lm.rs"]
mod causal_lm;

use nnx::DType;
use nnx::models::gpt2::{Gpt2, Gpt2Config};
use nnx::nn::Init;

fn main() -> nnx::Result<()> {
    let run = causal_lm::Run::from_args("gpt2-tiny", &[3, 14, 15, 92, 65, 35, 89, 79, 32, 38]);
    let config = Gpt2Config::from_file(run.folder.join("config.json"))?;
    run.run(Gpt2::new(&config, DType::F32, Init::Meta))
}
