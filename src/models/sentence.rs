//! Sentence embeddings from a sentence-transformers folder (`config.json`, `model.safetensors`,
//! `tokenizer.json`, `sentence_bert_config.json`): tokenize, run the BERT encoder, mean-pool
//! over the attention mask, L2-normalise.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use tokenizers::{Tokenizer, TruncationParams};

use super::bert::{Batch, Bert, BertConfig, FusedBert};
use crate::error::ConfigProblem;
use crate::nn::Init;
use crate::{Archive, DType, Error, ImportReport, Result};

/// The folder's own sequence limit, which differs from the one saved in `tokenizer.json`.
#[derive(serde::Deserialize)]
struct SentenceBertConfig {
    max_seq_length: usize,
}

/// A sentence encoder: a tokenizer and a BERT model imported from a sentence-transformers folder.
pub struct SentenceEncoder {
    tokenizer: Tokenizer,
    model: Bert,
    /// The model prepared for the fused CPU kernels, made on the first CPU encode.
    fused: OnceLock<FusedBert>,
    /// The model placed on a GPU, which then computes the embeddings.
    #[cfg(feature = "gpu")]
    placed: Option<Bert<crate::Gpu>>,
    folder: PathBuf,
    report: ImportReport,
}

impl SentenceEncoder {
    /// Loads the folder: the weights are imported as views of the mapped `model.safetensors`
    /// (or loaded, when the folder was written by [`crate::Pretrained::save_pretrained`]).
    ///
    /// # Errors
    /// A missing or unreadable file (named), [`Error::Tokenizer`] for a `tokenizer.json` the
    /// tokenizer cannot read, or [`Error::Load`] for weights that do not fit the configuration.
    pub fn from_folder(folder: impl AsRef<Path>) -> Result<SentenceEncoder> {
        let folder = folder.as_ref().to_path_buf();
        let config = BertConfig::from_file(folder.join("config.json"))?;
        let sentence_config = folder.join("sentence_bert_config.json");
        let max_length = match nnx_io::config::read_text(&sentence_config) {
            Ok(text) => {
                let max_length = serde_json::from_str::<SentenceBertConfig>(&text)
                    .map_err(|error| Error::Config {
                        path: sentence_config.clone(),
                        problem: ConfigProblem::NotModelConfig { message: error.to_string() },
                    })?
                    .max_seq_length;
                super::Checks::new(&sentence_config).positive("max_seq_length", max_length)?;
                max_length
            }
            Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
                config.max_position_embeddings
            }
            Err(error) => return Err(error),
        };
        let tokenizer_path = folder.join("tokenizer.json");
        let text_error = |source| Error::Tokenizer { path: tokenizer_path.clone(), source };
        let mut tokenizer = Tokenizer::from_file(&tokenizer_path).map_err(text_error)?;
        // Padding is done per batch (to the longest sentence); truncation follows the model.
        tokenizer.with_padding(None);
        tokenizer
            .with_truncation(Some(TruncationParams { max_length, ..TruncationParams::default() }))
            .map_err(text_error)?;
        let mut model = Bert::new(&config, DType::F32, Init::Meta);
        // A folder that `save_pretrained` wrote is in the model's own names; one from
        // sentence-transformers in transformers' names.
        let report = crate::pretrained::load_weights(&Archive::open(&folder)?, &mut model)?;
        Ok(SentenceEncoder {
            tokenizer,
            model,
            fused: OnceLock::new(),
            #[cfg(feature = "gpu")]
            placed: None,
            folder,
            report,
        })
    }

    /// The folder this encoder was loaded from.
    pub fn folder(&self) -> &Path {
        &self.folder
    }

    /// What the import read (entries such as the pooler are listed as unused); empty for a
    /// folder in the model's own names.
    pub fn import_report(&self) -> &ImportReport {
        &self.report
    }

    /// The model.
    pub fn model(&self) -> &Bert {
        &self.model
    }

    /// Computes the embeddings on `gpu` from now on: the model is placed there once.
    ///
    /// # Errors
    /// The device's error when the weights cannot be placed.
    #[cfg(feature = "gpu")]
    pub fn on_gpu(mut self, gpu: &crate::Gpu) -> Result<SentenceEncoder> {
        self.placed = Some(self.model.place(gpu)?);
        Ok(self)
    }

    /// Token ids of each sentence, with the special tokens.
    ///
    /// # Errors
    /// The tokenizer's error, as [`Error::Tokenizer`] naming `tokenizer.json`.
    pub fn tokenize(&self, sentences: &[&str]) -> Result<Vec<Vec<u32>>> {
        let encodings = self
            .tokenizer
            .encode_batch(sentences.to_vec(), true)
            .map_err(|source| Error::Tokenizer { path: self.folder.join("tokenizer.json"), source })?;
        Ok(encodings.iter().map(|encoding| encoding.get_ids().to_vec()).collect())
    }

    /// The model prepared for the fused CPU kernels, made once.
    ///
    /// # Errors
    /// As [`FusedBert::new`].
    pub fn fused(&self) -> Result<&FusedBert> {
        if let Some(fused) = self.fused.get() {
            return Ok(fused);
        }
        let fused = FusedBert::new(&self.model)?;
        Ok(self.fused.get_or_init(|| fused))
    }

    /// Unit-length embeddings of `sentences`, in order, computed `batch_size` sentences at a
    /// time: on the CPU by [`FusedBert::embed`] (the sentences packed without padding), on a
    /// GPU by [`Bert::embed`] on batches padded to their longest sentence.
    ///
    /// # Errors
    /// As [`SentenceEncoder::tokenize`], [`FusedBert::new`] and [`Bert::embed`].
    pub fn encode(&self, sentences: &[&str], batch_size: usize) -> Result<Vec<Vec<f32>>> {
        let ids = self.tokenize(sentences)?;
        #[cfg(feature = "gpu")]
        let placed = self.placed.as_ref();
        #[cfg(not(feature = "gpu"))]
        let placed: Option<&Bert> = None;
        let Some(placed) = placed else {
            return self.fused()?.embed(&ids, batch_size);
        };
        let pad = self.tokenizer.token_to_id("[PAD]").unwrap_or(0);
        let hidden = self.model.config.hidden_size;
        let mut out = Vec::with_capacity(sentences.len());
        for chunk in ids.chunks(batch_size.max(1)) {
            let batch = Batch::pad(chunk, pad);
            let embeddings = crate::Compute::to_f32_vec(&placed.embed(&batch)?)?;
            out.extend(embeddings.chunks(hidden).map(<[f32]>::to_vec));
        }
        Ok(out)
    }
}
