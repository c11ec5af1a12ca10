//! The candle peer of `cargo bench --bench minilm`: sentence embeddings of a sentence-transformers
//! BERT folder with candle-transformers' `BertModel`, mean pooling over the attention mask and L2
//! normalisation, on candle's CPU backend in f32.
//!
//! ```text
//! candle-bert-peer FOLDER BATCH
//! ```
//!
//! It speaks lines on stdin and stdout. The first line in is a JSON object of named corpora
//! (`{"short": [...], "long": [...]}`); the peer loads the model, encodes each corpus once as a
//! warm-up and answers with one JSON line: candle's version and thread count, the load time and
//! the embedding of each corpus' first text (so the caller can check it against its own). Then
//! each line in names a corpus, and the peer answers `{"seconds": ...}`, the time of one pass; a
//! count after the name (`long 4`) encodes only the first texts, as a warm-up. A pass is what a caller of an `encode(sentences)` waits for: tokenizing, padding each batch to
//! its longest sentence, the model, pooling and normalising, with the embeddings copied out. As
//! sentence-transformers does, the sentences are sorted by length before batching (less padding)
//! and the embeddings returned in input order.
//!
//! `cargo bench --bench minilm` builds and runs it with `cargo run --release --manifest-path
//! benches/candle-bert-peer/Cargo.toml -- FOLDER 32`.

use std::collections::BTreeMap;
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::bert::{BertModel, Config};
use tokenizers::{PaddingParams, Tokenizer, TruncationParams};

/// The peer's failure: what it was doing and the underlying message.
#[derive(Debug)]
struct Failure(String);

impl<E: std::fmt::Display> From<E> for Failure {
    fn from(error: E) -> Failure {
        Failure(error.to_string())
    }
}

/// The sequence limit of the folder (`sentence_bert_config.json`), else the position table's.
fn max_length(folder: &Path, config: &Config) -> usize {
    std::fs::read_to_string(folder.join("sentence_bert_config.json"))
        .ok()
        .and_then(|text| serde_json::from_str::<serde_json::Value>(&text).ok())
        .and_then(|value| value["max_seq_length"].as_u64())
        .map_or(config.max_position_embeddings, |length| length as usize)
}

/// A loaded model and tokenizer.
struct Encoder {
    model: BertModel,
    tokenizer: Tokenizer,
}

impl Encoder {
    fn load(folder: &Path) -> Result<Encoder, Failure> {
        let config: Config = serde_json::from_str(&std::fs::read_to_string(folder.join("config.json"))?)?;
        let mut tokenizer = Tokenizer::from_file(folder.join("tokenizer.json"))?;
        tokenizer.with_padding(Some(PaddingParams::default()));
        tokenizer.with_truncation(Some(TruncationParams {
            max_length: max_length(folder, &config),
            ..TruncationParams::default()
        }))?;
        // SAFETY: the weights file is not modified while the benchmark runs.
        let weights = unsafe {
            VarBuilder::from_mmaped_safetensors(&[folder.join("model.safetensors")], DType::F32, &Device::Cpu)?
        };
        Ok(Encoder { model: BertModel::load(weights, &config)?, tokenizer })
    }

    /// Unit-length embeddings of one batch, padded to its longest sentence.
    fn encode_batch(&self, sentences: &[&str]) -> Result<Vec<Vec<f32>>, Failure> {
        let encodings = self.tokenizer.encode_batch(sentences.to_vec(), true)?;
        let rows = |field: fn(&tokenizers::Encoding) -> &[u32]| -> Result<Tensor, Failure> {
            let rows: Vec<Tensor> = encodings
                .iter()
                .map(|encoding| Tensor::new(field(encoding), &Device::Cpu))
                .collect::<Result<_, _>>()?;
            Ok(Tensor::stack(&rows, 0)?)
        };
        let ids = rows(tokenizers::Encoding::get_ids)?;
        let types = rows(tokenizers::Encoding::get_type_ids)?;
        let mask = rows(tokenizers::Encoding::get_attention_mask)?;
        let hidden = self.model.forward(&ids, &types, Some(&mask))?;
        // Mean over the real tokens, then L2 normalisation.
        let mask = mask.to_dtype(DType::F32)?.unsqueeze(2)?;
        let summed = hidden.broadcast_mul(&mask)?.sum(1)?;
        let counts = mask.sum(1)?.clamp(1e-9f32, f32::MAX)?;
        let mean = summed.broadcast_div(&counts)?;
        let norm = mean.sqr()?.sum_keepdim(1)?.sqrt()?.clamp(1e-12f32, f32::MAX)?;
        Ok(mean.broadcast_div(&norm)?.to_vec2::<f32>()?)
    }

    /// Embeddings of `sentences` in input order, in batches of `batch` sorted by length.
    fn encode(&self, sentences: &[&str], batch: usize) -> Result<Vec<Vec<f32>>, Failure> {
        let lengths: Vec<usize> = self
            .tokenizer
            .encode_batch(sentences.to_vec(), true)?
            .iter()
            .map(|encoding| encoding.get_attention_mask().iter().filter(|&&flag| flag == 1).count())
            .collect();
        let mut order: Vec<usize> = (0..sentences.len()).collect();
        order.sort_by_key(|&index| std::cmp::Reverse(lengths[index]));
        let mut out = vec![Vec::new(); sentences.len()];
        for chunk in order.chunks(batch.max(1)) {
            let texts: Vec<&str> = chunk.iter().map(|&index| sentences[index]).collect();
            for (&index, embedding) in chunk.iter().zip(self.encode_batch(&texts)?) {
                out[index] = embedding;
            }
        }
        Ok(out)
    }
}

fn run() -> Result<(), Failure> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [folder, batch] = args.as_slice() else {
        return Err(Failure("usage: candle-bert-peer FOLDER BATCH, with the corpora on stdin".into()));
    };
    let (folder, batch) = (PathBuf::from(folder), batch.parse::<usize>()?);
    let mut lines = std::io::stdin().lock().lines();
    let corpora: BTreeMap<String, Vec<String>> =
        serde_json::from_str(&lines.next().ok_or_else(|| Failure("no corpora on stdin".into()))??)?;
    let corpora: BTreeMap<&str, Vec<&str>> =
        corpora.iter().map(|(name, texts)| (name.as_str(), texts.iter().map(String::as_str).collect())).collect();
    let start = Instant::now();
    let encoder = Encoder::load(&folder)?;
    let load_ms = start.elapsed().as_secs_f64() * 1e3;
    let mut first = serde_json::Map::new();
    for (name, sentences) in &corpora {
        let embedding = encoder.encode(sentences, batch)?.into_iter().next().unwrap_or_default();
        first.insert(name.to_string(), serde_json::json!(embedding));
    }
    let mut stdout = std::io::stdout().lock();
    let ready = serde_json::json!({
        "version": "candle-transformers 0.11, CPU, f32",
        "threads": candle_core::utils::get_num_threads(),
        "load_ms": load_ms,
        "first": first,
    });
    writeln!(stdout, "{ready}")?;
    stdout.flush()?;
    for line in lines {
        let line = line?;
        let mut words = line.split_whitespace();
        let Some(name) = words.next() else { continue };
        let sentences = corpora.get(name).ok_or_else(|| Failure(format!("no corpus `{name}`")))?;
        let count = words.next().map(str::parse::<usize>).transpose()?.unwrap_or(sentences.len());
        let sentences = &sentences[..count.min(sentences.len())];
        let start = Instant::now();
        let embeddings = encoder.encode(sentences, batch)?;
        let seconds = start.elapsed().as_secs_f64();
        std::hint::black_box(embeddings);
        writeln!(stdout, "{}", serde_json::json!({ "seconds": seconds }))?;
        stdout.flush()?;
    }
    Ok(())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure(message)) => {
            eprintln!("error: {message}");
            ExitCode::from(1)
        }
    }
}
