//! Llama: import a Hugging Face folder (grouped-query attention, BF16 weights kept as BF16
//! views of the file) into a meta model and generate text, streamed as it comes.
//!
//! ```text
//! cargo run --release --example llama -- [--model DIR] [--prompt TEXT | --ids 1,17,200]
//!     [--max-new-tokens N] [--temperature T] [--top-k K] [--top-p P]
//!     [--repetition-penalty R] [--seed S] [--stop TEXT]... [--device cpu|gpu] [--json]
//! ```
//!
//! `DIR` defaults to the tiny Llama of the test fixtures (`tests/fixtures`), whose
//! `tokenizer.json` is byte-level with `<s>` added in front (`scripts/make_tokenizers.py`).
//! Decoding stops at the folder's `eos_token_id`. Without `--temperature`, `--top-k` or
//! `--top-p` decoding is greedy, unless the folder's `generation_config.json` samples. Prefill
//! and decode speeds go to stderr; `--json` prints `{"prompt_ids", "generated_ids",
//! "prefill_tokens_per_s", "decode_tokens_per_s", "text"}`.

#[path = "common/causal_lm.rs"]
mod causal_lm;

use std::process::ExitCode;

use nnx::DType;
use nnx::models::llama::{Llama, LlamaConfig};
use nnx::nn::Init;

fn main() -> ExitCode {
    causal_lm::main("llama-tiny", &[1, 17, 200, 33, 5, 99, 250, 7], |folder| {
        let config = LlamaConfig::from_file(folder.join("config.json"))?;
        // BF16 checkpoints import as views of the file; other dtypes are cast on import.
        Ok(Llama::new(&config, DType::BF16, Init::Meta))
    })
}
