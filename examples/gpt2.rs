//! GPT-2: load a Hugging Face folder (fused `c_attn`, Conv1D layout, `lm_head` tied to the
//! token embedding) with `nnx::models::load` and generate text, streamed as it comes.
//!
//! ```text
//! cargo run --release --example gpt2 -- [--model DIR|FILE.gguf|hf://...] [--prompt TEXT | --ids 3,14,15]
//!     [--max-new-tokens N] [--temperature T] [--top-k K] [--top-p P]
//!     [--repetition-penalty R] [--seed S] [--stop TEXT]... [--device cpu|gpu] [--json]
//! ```
//!
//! `DIR` defaults to the tiny GPT-2 of the test fixtures (`tests/fixtures`), whose
//! `tokenizer.json` is a small byte-level BPE (`scripts/make_tokenizers.py`). Without
//! `--temperature`, `--top-k` or `--top-p` decoding is greedy, unless the folder's
//! `generation_config.json` samples. Prefill and decode speeds go to stderr; `--json` prints
//! `{"prompt_ids", "generated_ids", "prefill_tokens_per_s", "decode_tokens_per_s", "text"}`.

#[path = "common/causal_lm.rs"]
mod causal_lm;

use std::process::ExitCode;

fn main() -> ExitCode {
    causal_lm::main("gpt2-tiny", &[3, 14, 15, 92, 65, 35, 89, 79, 32, 38])
}
