//! A GGUF tokenizer from arbitrary metadata: building it from `tokenizer.ggml.*` keys, encoding
//! a short text and decoding the ids may fail but must never panic, hang or take memory far
//! beyond the vocabulary's size.
//!
//! The input is read as: a byte of flags (bit 0: `llama` rather than `gpt2`; bit 1: scores;
//! bit 2: token types; bit 3: merges; bit 4: `add_bos_token`; bit 5: `add_space_prefix`;
//! bit 6: an unknown model name; bit 7: a BOS id past the vocabulary), a byte choosing the
//! pre-tokenizer, then sections split by NUL bytes: the tokens (one per line), the merges (one
//! per line), one byte per token giving its type and score, and the text to encode.

#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use nnx::generate::Tokenizer;
use nnx::gguf::{Array, Metadata, Value};

/// Pre-tokenizer names: known ones and one that is not.
const PRE: &[&str] = &["default", "gpt-2", "llama-bpe", "qwen2", "deepseek-llm", "tekken", "no-such-pre"];

fn lines(bytes: &[u8]) -> Vec<String> {
    bytes.split(|&byte| byte == b'\n').map(|line| String::from_utf8_lossy(line).into_owned()).collect()
}

fuzz_target!(|data: &[u8]| {
    let [flags, pre, rest @ ..] = data else { return };
    let mut sections = rest.split(|&byte| byte == 0);
    let tokens = lines(sections.next().unwrap_or_default());
    let merges = lines(sections.next().unwrap_or_default());
    let kinds = sections.next().unwrap_or_default();
    let text = String::from_utf8_lossy(sections.next().unwrap_or_default()).into_owned();

    let mut metadata = Metadata::new();
    let model = match (flags & 64 != 0, flags & 1 != 0) {
        (true, _) => "t5",
        (false, true) => "llama",
        (false, false) => "gpt2",
    };
    metadata.set("tokenizer.ggml.model", Value::String(model.into()));
    metadata.set("tokenizer.ggml.pre", Value::String(PRE[usize::from(*pre) % PRE.len()].into()));
    let count = tokens.len();
    // One value per token, taken from the type bytes cyclically, so that short inputs still give
    // arrays of the right length; a type byte past 200 makes the array one value short.
    let kind = |index: usize| kinds.get(index % kinds.len().max(1)).copied().unwrap_or(1);
    let short = usize::from(kinds.first().is_some_and(|&byte| byte > 200));
    if flags & 2 != 0 {
        let scores = (0..count - short.min(count)).map(|index| -f32::from(kind(index.wrapping_mul(7))) - index as f32);
        metadata.set("tokenizer.ggml.scores", Value::Array(Array::F32(scores.collect())));
    }
    if flags & 4 != 0 {
        let types = (0..count).map(|index| i32::from(kind(index) % 7));
        metadata.set("tokenizer.ggml.token_type", Value::Array(Array::I32(types.collect())));
    }
    metadata.set("tokenizer.ggml.tokens", Value::Array(Array::String(tokens)));
    if flags & 8 != 0 {
        metadata.set("tokenizer.ggml.merges", Value::Array(Array::String(merges)));
    }
    metadata.set("tokenizer.ggml.add_bos_token", Value::Bool(flags & 16 != 0));
    metadata.set("tokenizer.ggml.add_space_prefix", Value::Bool(flags & 32 != 0));
    let bos = if flags & 128 != 0 { u32::MAX } else { 1 };
    metadata.set("tokenizer.ggml.bos_token_id", Value::U32(bos));
    metadata.set("tokenizer.ggml.eos_token_id", Value::U32(2));
    metadata.set("tokenizer.ggml.padding_token_id", Value::U32(u32::from(*pre)));

    match Tokenizer::from_gguf(&metadata, Path::new("fuzz.gguf")) {
        Ok(tokenizer) => {
            let _ = tokenizer.vocab_size();
            if let Ok(ids) = tokenizer.encode(&text) {
                let _ = tokenizer.decode(&ids);
            }
        }
        Err(error) => {
            let _ = error.to_string();
        }
    }
});
