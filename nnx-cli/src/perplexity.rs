//! `nnx perplexity MODEL --file TEXT`: the perplexity of a model on a text, computed as
//! llama.cpp's `llama-perplexity` computes it (`perplexity` in `tools/perplexity/perplexity.cpp`),
//! so that the two numbers compare.
//!
//! The whole text, less one newline at its end (which llama.cpp's `-f` drops), is tokenized
//! with the BOS the model adds and cut into non-overlapping chunks of `ctx` tokens (a rest
//! shorter than `ctx` is left out). Each chunk is computed from scratch, its first token
//! replaced by the BOS when the model adds one; only the second half is scored: the logits at
//! positions `ctx/2 ..= ctx-2` predict the tokens after them, as `-log_softmax` in f64. The
//! perplexity is `exp` of the mean over every chunk. One difference: special tokens written in
//! the text (`<|im_end|>`) are read as such here, and as plain text by llama.cpp.

use std::path::PathBuf;

use nnx::models::CausalLm;

use crate::common::{CliError, progress_bar};

/// The context when `--ctx` is not given (capped at the model's): llama.cpp's long-standing
/// default for this tool. Its newest `llama-perplexity` has no default and asks for
/// `--ctx-size`.
const DEFAULT_CTX: usize = 512;

/// The arguments of `nnx perplexity`.
#[derive(clap::Args)]
pub struct Args {
    /// A GGUF file, a transformers or mlx-community folder, or an `hf://` path to either.
    model: String,
    /// The text to score (UTF-8); it must hold at least two chunks of `--ctx` tokens.
    #[arg(long)]
    file: PathBuf,
    /// Tokens per chunk, at least 3 and at most the model's context. Default: 512, or the
    /// model's context when it is shorter.
    #[arg(long, value_name = "N")]
    ctx: Option<usize>,
    /// Print one JSON object: `perplexity`, `chunks`, `ctx` and `tokens` (of the whole text).
    #[arg(long)]
    json: bool,
}

/// The negative log-likelihood of `token` under `logits`, as llama.cpp's `log_softmax`
/// computes it: the maximum and the differences in f32, the sum of their exponentials in f64.
fn negative_log_likelihood(logits: &[f32], token: usize) -> f64 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&logit| f64::from((logit - max).exp())).sum();
    -(f64::from(logits[token] - max) - sum.ln())
}

/// Scores the chunks and prints the perplexity.
pub fn run(args: Args) -> Result<String, CliError> {
    let mut text = std::fs::read_to_string(&args.file)
        .map_err(|error| CliError(format!("cannot read `{}`: {error}", args.file.display())))?;
    // llama.cpp's `-f` drops one newline at the end of the file.
    if text.ends_with('\n') {
        text.pop();
    }
    let loaded = nnx::models::load(&args.model)?;
    let context = loaded.model.context_length();
    let ctx = args.ctx.unwrap_or(DEFAULT_CTX.min(context));
    if ctx < 3 {
        return Err(CliError(format!(
            "`--ctx {ctx}` leaves no token to score (the second half of each chunk, but its last, is scored): give at least 3"
        )));
    }
    if ctx > context {
        return Err(CliError(format!(
            "`--ctx {ctx}` is past the model's context of {context} tokens: give at most {context}"
        )));
    }
    let mut tokens = loaded.tokenizer.encode(&text)?;
    if tokens.len() < 2 * ctx {
        return Err(CliError(format!(
            "`{}` tokenizes to only {} tokens, and a context of {ctx} needs at least {}: give a longer text or a smaller `--ctx`",
            args.file.display(),
            tokens.len(),
            2 * ctx
        )));
    }
    let chunks = tokens.len() / ctx;
    let first = ctx / 2;
    let bar = if args.json { indicatif::ProgressBar::hidden() } else { progress_bar(chunks as u64, "chunks") };
    let mut total = 0.0f64;
    let mut count = 0usize;
    for chunk in 0..chunks {
        let start = chunk * ctx;
        let window = &mut tokens[start..start + ctx];
        let original = window[0];
        if let Some(bos) = loaded.bos_token_id {
            window[0] = bos;
        }
        let logits = loaded.model.logits(window)?.to_f32_vec()?;
        window[0] = original;
        let vocab = logits.len() / ctx;
        for position in first..ctx - 1 {
            let next = tokens[start + position + 1] as usize;
            if next >= vocab {
                return Err(CliError(format!("token {next} is past the model's {vocab} logits")));
            }
            total += negative_log_likelihood(&logits[position * vocab..(position + 1) * vocab], next);
        }
        count += ctx - 1 - first;
        bar.set_message(format!("perplexity {:.4}", (total / count as f64).exp()));
        bar.inc(1);
    }
    bar.finish_and_clear();
    let perplexity = (total / count as f64).exp();
    if args.json {
        let value =
            serde_json::json!({ "perplexity": perplexity, "chunks": chunks, "ctx": ctx, "tokens": tokens.len() });
        return Ok(serde_json::to_string(&value).expect("the report serializes") + "\n");
    }
    Ok(format!("perplexity: {perplexity:.4} ({chunks} chunks of {ctx} tokens)\n"))
}
