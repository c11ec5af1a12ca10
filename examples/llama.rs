//! Llama: load a Hugging Face folder (grouped-query attention, BF16 weights kept as BF16 views
//! of the file) with `nnx::models::load` and generate text, streamed as it comes. The same
//! command runs whatever the loader does: a GGUF file of Llama, Mistral, Qwen2/3 or Gemma 3,
//! or an mlx-community folder.
//!
//! ```text
//! cargo run --release --example llama -- [--model DIR|FILE.gguf|hf://...] [--prompt TEXT | --ids 1,17,200]
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

fn main() -> ExitCode {
    causal_lm::main("llama-tiny", &[1, 17, 200, 33, 5, 99, 250, 7])
}
