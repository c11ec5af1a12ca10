//! `nnx embed MODEL [TEXT...]`: sentence embeddings with an encoder
//! ([`nnx::models::sentence::SentenceEncoder`]), pooled and normalised as the folder's
//! `modules.json` says. By default a summary of each embedding and, for two texts or more, their
//! cosine similarities; with `--json` one object holding the embeddings.

use std::io::BufRead;
use std::path::PathBuf;

use nnx::models::sentence::SentenceEncoder;

use crate::common::CliError;
use crate::run::DeviceChoice;

/// The values of each embedding the summary shows.
const SHOWN: usize = 4;

/// The characters of each text the summary shows.
const SHOWN_CHARS: usize = 60;

/// The arguments of `nnx embed`.
#[derive(clap::Args)]
pub struct Args {
    /// A sentence-transformers folder (`config.json`, `model.safetensors`, `tokenizer.json`,
    /// `modules.json`), or a Hub repository (`org/name`, `hf://org/name@revision`).
    #[arg(value_name = "MODEL")]
    model: PathBuf,
    /// The texts to embed (default: standard input, one text per line).
    #[arg(value_name = "TEXT")]
    texts: Vec<String>,
    /// Texts per forward pass.
    #[arg(long, value_name = "N", default_value_t = 32)]
    batch_size: usize,
    /// Print one JSON object: `model`, `dimension`, `pooling` (sentence-transformers' name of the
    /// mode), `normalized` and `embeddings` (an array of floats per text, in order).
    #[arg(long)]
    json: bool,
    /// Where the embeddings are computed.
    #[arg(long, value_enum, default_value_t = DeviceChoice::Cpu)]
    pub device: DeviceChoice,
}

/// Embeds the texts and renders them.
pub fn run(args: Args) -> Result<String, CliError> {
    if args.batch_size == 0 {
        return Err(CliError("`--batch-size` is 0: give at least 1".into()));
    }
    let encoder = SentenceEncoder::from_folder(nnx::hub::pretrained_folder(&args.model)?)?;
    let encoder = match args.device {
        DeviceChoice::Cpu => encoder,
        DeviceChoice::Gpu => on_gpu(encoder)?,
    };
    let texts = if args.texts.is_empty() { read_stdin()? } else { args.texts };
    if texts.is_empty() {
        return Err(CliError("no text to embed: give the texts after MODEL, or one per line on standard input".into()));
    }
    let borrowed: Vec<&str> = texts.iter().map(String::as_str).collect();
    let embeddings = encoder.encode(&borrowed, args.batch_size)?;
    let model = args.model.to_string_lossy();
    if args.json {
        let object = serde_json::json!({
            "model": model,
            "dimension": encoder.dimension(),
            "pooling": encoder.pooling().name(),
            "normalized": encoder.normalize(),
            "embeddings": embeddings,
        });
        return Ok(object.to_string() + "\n");
    }
    Ok(summary(&model, &encoder, &texts, &embeddings))
}

/// The encoder placed on adapter `NNX_GPU` (0 by default).
#[cfg(feature = "gpu")]
fn on_gpu(encoder: SentenceEncoder) -> Result<SentenceEncoder, CliError> {
    let index = std::env::var("NNX_GPU").ok().and_then(|index| index.parse().ok()).unwrap_or(0);
    let gpu = nnx::Gpu::open(index)
        .map_err(|error| CliError(format!("`--device gpu`: {error}; embed on the CPU with `--device cpu`")))?;
    Ok(encoder.on_gpu(&gpu)?)
}

/// Without the `gpu` feature: the error that says so.
#[cfg(not(feature = "gpu"))]
fn on_gpu(_: SentenceEncoder) -> Result<SentenceEncoder, CliError> {
    Err(CliError(
        "`--device gpu`: this nnx was built without the `gpu` feature; install it with \
         `cargo install --path nnx-cli --features gpu`, or embed with `--device cpu`"
            .into(),
    ))
}

/// The lines of standard input, one text each.
fn read_stdin() -> Result<Vec<String>, CliError> {
    std::io::stdin()
        .lock()
        .lines()
        .collect::<Result<_, _>>()
        .map_err(|error| CliError(format!("cannot read the texts from standard input: {error}")))
}

/// The readable rendering: the model's head, each text with its dimension, first values and
/// norm, then the cosine similarities when there are two texts or more.
fn summary(model: &str, encoder: &SentenceEncoder, texts: &[String], embeddings: &[Vec<f32>]) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let normalized = if encoder.normalize() { "normalized" } else { "not normalized" };
    let _ = writeln!(
        out,
        "{}: {} dimensions, {} pooling, {normalized}",
        nnx::text::printable(model),
        encoder.dimension(),
        encoder.pooling().name()
    );
    for (at, (text, embedding)) in texts.iter().zip(embeddings).enumerate() {
        let mut shown: String = text.chars().take(SHOWN_CHARS).collect();
        if shown.len() < text.len() {
            shown.push_str("...");
        }
        let head: Vec<String> = embedding.iter().take(SHOWN).map(|value| format!("{value:+.4}")).collect();
        let more = if embedding.len() > SHOWN { ", ..." } else { "" };
        let _ = writeln!(
            out,
            "{at:>3}: {shown:?}\n     dimension {}, norm {:.4}, [{}{more}]",
            embedding.len(),
            norm(embedding),
            head.join(", ")
        );
    }
    if embeddings.len() > 1 {
        let _ = writeln!(out, "\ncosine similarity");
        let header: Vec<String> = (0..embeddings.len()).map(|at| format!("{at:>7}")).collect();
        let _ = writeln!(out, "     {}", header.join(""));
        for (at, a) in embeddings.iter().enumerate() {
            let row: Vec<String> = embeddings.iter().map(|b| format!("{:>7.4}", cosine(a, b))).collect();
            let _ = writeln!(out, "{at:>3}: {}", row.join(""));
        }
    }
    out
}

/// The Euclidean length of `values`, summed in f64.
fn norm(values: &[f32]) -> f64 {
    values.iter().map(|&x| f64::from(x) * f64::from(x)).sum::<f64>().sqrt()
}

/// The cosine similarity of `a` and `b`, summed in f64; 0 when either is all zeros.
fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(&x, &y)| f64::from(x) * f64::from(y)).sum();
    let lengths = norm(a) * norm(b);
    if lengths == 0.0 { 0.0 } else { dot / lengths }
}
