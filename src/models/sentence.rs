//! Sentence embeddings from a sentence-transformers folder (`config.json`, `model.safetensors`,
//! `tokenizer.json`, `sentence_bert_config.json`, `modules.json`): tokenize, run the BERT
//! encoder, pool the token states as the folder's `Pooling` module says ([`Pooling`]) and
//! L2-normalise when a `Normalize` module follows. A folder without `modules.json` is pooled by
//! the mean over the attention mask and normalised.

use std::io::Read;
use std::path::{Component, Path, PathBuf};
use std::sync::OnceLock;

use serde_json::Value;
use tokenizers::{Tokenizer, TruncationParams};

use super::bert::{Batch, Bert, BertConfig, FusedBert};
use crate::error::ConfigProblem;
use crate::nn::Init;
use crate::{Archive, DType, Error, ImportReport, Result};

/// The largest `modules.json` or `Pooling` `config.json` read: published ones are a few hundred
/// bytes, so a larger file is damaged or not one of them, and is refused before it is read.
pub const MAX_MODULE_FILE_BYTES: u64 = 64 << 10;

/// The folder's own sequence limit, which differs from the one saved in `tokenizer.json`.
#[derive(serde::Deserialize)]
struct SentenceBertConfig {
    max_seq_length: usize,
}

/// How the last hidden states of a sentence's tokens become its embedding: the mode of a
/// sentence-transformers `Pooling` module, whose `config.json` sets one `pooling_mode_*` key to
/// `true` (or names the mode in `pooling_mode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Pooling {
    /// The first token's state, `[CLS]` (`pooling_mode_cls_token`).
    Cls,
    /// The largest value of each dimension over the tokens (`pooling_mode_max_tokens`).
    Max,
    /// The states averaged over the tokens (`pooling_mode_mean_tokens`), the default.
    Mean,
    /// The states summed and divided by the square root of the number of tokens
    /// (`pooling_mode_mean_sqrt_len_tokens`).
    MeanSqrtLength,
    /// The states averaged with the weights 1, 2, 3, ... of their positions
    /// (`pooling_mode_weightedmean_tokens`).
    WeightedMean,
    /// The last token's state (`pooling_mode_lasttoken`).
    LastToken,
}

impl Pooling {
    /// Every mode, in the order sentence-transformers concatenates them when several are set.
    pub const ALL: [Pooling; 6] =
        [Pooling::Cls, Pooling::Max, Pooling::Mean, Pooling::MeanSqrtLength, Pooling::WeightedMean, Pooling::LastToken];

    /// The `config.json` key that selects the mode (`pooling_mode_mean_tokens`).
    pub fn key(self) -> &'static str {
        match self {
            Pooling::Cls => "pooling_mode_cls_token",
            Pooling::Max => "pooling_mode_max_tokens",
            Pooling::Mean => "pooling_mode_mean_tokens",
            Pooling::MeanSqrtLength => "pooling_mode_mean_sqrt_len_tokens",
            Pooling::WeightedMean => "pooling_mode_weightedmean_tokens",
            Pooling::LastToken => "pooling_mode_lasttoken",
        }
    }

    /// The mode's name as sentence-transformers' `pooling_mode` spells it (`cls`, `max`,
    /// `mean`, `mean_sqrt_len_tokens`, `weightedmean`, `lasttoken`).
    pub fn name(self) -> &'static str {
        match self {
            Pooling::Cls => "cls",
            Pooling::Max => "max",
            Pooling::Mean => "mean",
            Pooling::MeanSqrtLength => "mean_sqrt_len_tokens",
            Pooling::WeightedMean => "weightedmean",
            Pooling::LastToken => "lasttoken",
        }
    }

    /// The embedding of one sentence from the last hidden states of its tokens: `states` holds
    /// `hidden` values per token, token by token, without padding (values past the last whole
    /// token are ignored). A sentence without tokens pools to zeros.
    ///
    /// # Examples
    /// ```
    /// use nnx::models::sentence::Pooling;
    ///
    /// let states = [1.0, -2.0, 3.0, 4.0];
    /// assert_eq!(Pooling::Cls.pool(&states, 2), [1.0, -2.0]);
    /// assert_eq!(Pooling::Mean.pool(&states, 2), [2.0, 1.0]);
    /// assert_eq!(Pooling::Max.pool(&states, 2), [3.0, 4.0]);
    /// ```
    pub fn pool(self, states: &[f32], hidden: usize) -> Vec<f32> {
        let mut pooled = vec![0.0f32; hidden];
        if hidden == 0 {
            return pooled;
        }
        let rows = states.chunks_exact(hidden);
        let count = rows.len();
        if count == 0 {
            return pooled;
        }
        let add = |pooled: &mut [f32], row: &[f32], weight: f32| {
            pooled.iter_mut().zip(row).for_each(|(p, &x)| *p += weight * x);
        };
        match self {
            Pooling::Cls => pooled.copy_from_slice(&states[..hidden]),
            Pooling::LastToken => pooled.copy_from_slice(&states[(count - 1) * hidden..count * hidden]),
            Pooling::Max => {
                pooled.fill(f32::NEG_INFINITY);
                for row in rows {
                    pooled.iter_mut().zip(row).for_each(|(p, &x)| *p = p.max(x));
                }
            }
            // In the order of `FusedBert::embed`, so that mean pooling gives the same floats
            // with or without normalisation after it.
            Pooling::Mean => {
                for row in rows {
                    pooled.iter_mut().zip(row).for_each(|(p, &x)| *p += x);
                }
                let inverse = 1.0 / (count as f32).max(1e-9);
                pooled.iter_mut().for_each(|p| *p *= inverse);
            }
            Pooling::MeanSqrtLength => {
                rows.for_each(|row| add(&mut pooled, row, 1.0));
                let divisor = (count as f32).max(1e-9).sqrt();
                pooled.iter_mut().for_each(|p| *p /= divisor);
            }
            Pooling::WeightedMean => {
                let mut total = 0.0f32;
                for (at, row) in rows.enumerate() {
                    let weight = (at + 1) as f32;
                    total += weight;
                    add(&mut pooled, row, weight);
                }
                let divisor = total.max(1e-9);
                pooled.iter_mut().for_each(|p| *p /= divisor);
            }
        }
        pooled
    }
}

/// Scales `values` to unit length as sentence-transformers' `Normalize` module does (a vector
/// shorter than 1e-12 is divided by 1e-12), in the order of [`FusedBert::embed`].
fn normalize(values: &mut [f32]) {
    let divisor = values.iter().map(|&x| x * x).sum::<f32>().sqrt().max(1e-12);
    values.iter_mut().for_each(|v| *v /= divisor);
}

/// A sentence encoder: a tokenizer and a BERT model imported from a sentence-transformers folder,
/// with the pooling and normalisation its `modules.json` declares.
pub struct SentenceEncoder {
    tokenizer: Tokenizer,
    model: Bert,
    /// The model prepared for the fused CPU kernels, made on the first CPU encode.
    fused: OnceLock<FusedBert>,
    /// The model placed on a GPU, which then computes the embeddings.
    #[cfg(feature = "gpu")]
    placed: Option<Bert<crate::Gpu>>,
    pooling: Pooling,
    normalize: bool,
    folder: PathBuf,
    report: ImportReport,
}

impl SentenceEncoder {
    /// Loads the folder: the weights are imported as views of the mapped `model.safetensors`
    /// (or loaded, when the folder was written by [`crate::Pretrained::save_pretrained`]). The
    /// head is read from `modules.json` and its `Pooling` module's `config.json`, each at most
    /// [`MAX_MODULE_FILE_BYTES`]: the modules must be a `Transformer` (the folder itself), a
    /// `Pooling` with one mode, and optionally a `Normalize`, in that order. Without
    /// `modules.json`, the embeddings are mean-pooled and normalised.
    ///
    /// # Errors
    /// A missing or unreadable file (named), [`Error::Tokenizer`] for a `tokenizer.json` the
    /// tokenizer cannot read, [`Error::Load`] for weights that do not fit the configuration,
    /// and [`Error::Config`] for a `config.json` of another encoder than BERT or a
    /// `modules.json` or pooling `config.json` nnx cannot follow (too large, not JSON, another
    /// module such as `Dense`, several pooling modes, a `word_embedding_dimension` that is not
    /// the model's), naming the file and the key.
    pub fn from_folder(folder: impl AsRef<Path>) -> Result<SentenceEncoder> {
        let folder = folder.as_ref().to_path_buf();
        let config_path = folder.join("config.json");
        let config = BertConfig::from_file(&config_path)?;
        check_bert(&config, &config_path)?;
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
        let (pooling, normalize) = read_head(&folder, config.hidden_size)?;
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
            pooling,
            normalize,
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

    /// How the token states become an embedding: the folder's `Pooling` module, or
    /// [`Pooling::Mean`] for a folder without `modules.json`.
    pub fn pooling(&self) -> Pooling {
        self.pooling
    }

    /// Whether the embeddings are scaled to unit length: the folder's `modules.json` lists a
    /// `Normalize` module, or the folder has no `modules.json`.
    pub fn normalize(&self) -> bool {
        self.normalize
    }

    /// The number of values in an embedding: the model's `hidden_size`.
    pub fn dimension(&self) -> usize {
        self.model.config.hidden_size
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

    /// The embeddings of `sentences`, in order, pooled as [`SentenceEncoder::pooling`] says and
    /// normalised when [`SentenceEncoder::normalize`] says so, computed `batch_size` sentences
    /// at a time: on the CPU by [`FusedBert`] (the sentences packed without padding), on a GPU
    /// by [`Bert`] on batches padded to their longest sentence. Mean pooling with
    /// normalisation is [`FusedBert::embed`] and [`Bert::embed`]; the other heads pool the
    /// last hidden states of [`FusedBert::embed_with`] and [`Bert::forward`].
    ///
    /// # Errors
    /// As [`SentenceEncoder::tokenize`], [`FusedBert::new`] and [`Bert::embed`].
    pub fn encode(&self, sentences: &[&str], batch_size: usize) -> Result<Vec<Vec<f32>>> {
        let ids = self.tokenize(sentences)?;
        let hidden = self.model.config.hidden_size;
        let mean_normalized = self.pooling == Pooling::Mean && self.normalize;
        #[cfg(feature = "gpu")]
        let placed = self.placed.as_ref();
        #[cfg(not(feature = "gpu"))]
        let placed: Option<&Bert> = None;
        let Some(placed) = placed else {
            let fused = self.fused()?;
            if mean_normalized {
                return fused.embed(&ids, batch_size);
            }
            return fused.embed_with(&ids, batch_size, |states| self.head(states));
        };
        let pad = self.tokenizer.token_to_id("[PAD]").unwrap_or(0);
        let mut out = Vec::with_capacity(sentences.len());
        for chunk in ids.chunks(batch_size.max(1)) {
            let batch = Batch::pad(chunk, pad);
            if mean_normalized {
                let embeddings = crate::Compute::to_f32_vec(&placed.embed(&batch)?)?;
                out.extend(embeddings.chunks(hidden).map(<[f32]>::to_vec));
                continue;
            }
            // `[batch, seq, hidden]`: each sentence's tokens first, then its padding.
            let states = crate::Compute::to_f32_vec(&placed.forward(&batch)?)?;
            for (sentence, padded) in chunk.iter().zip(states.chunks(batch.seq * hidden)) {
                out.push(self.head(&padded[..sentence.len() * hidden]));
            }
        }
        Ok(out)
    }

    /// The embedding of one sentence from its token states, by the folder's head.
    fn head(&self, states: &[f32]) -> Vec<f32> {
        let mut embedding = self.pooling.pool(states, self.model.config.hidden_size);
        if self.normalize {
            normalize(&mut embedding);
        }
        embedding
    }
}

/// Refuses a `config.json` of an encoder that [`Bert`] would compute wrongly without an error:
/// RoBERTa's weights import into it, but its positions start at 2.
fn check_bert(config: &BertConfig, path: &Path) -> Result<()> {
    let rules = [
        (
            "model_type",
            "bert",
            "`bert`",
            "nnx embeds with BERT encoders only; embed this model with sentence-transformers",
        ),
        (
            "position_embedding_type",
            "absolute",
            "`absolute`",
            "nnx computes BERT's absolute positions only; embed this model with sentence-transformers",
        ),
    ];
    for (key, wanted, expected, remedy) in rules {
        match config.extra.get(key) {
            None | Some(Value::Null) => {}
            Some(Value::String(found)) if found == wanted => {}
            found => return Err(unusable(path, key, expected, describe(found), remedy)),
        }
    }
    Ok(())
}

/// The pooling and normalisation a folder declares: read from `modules.json` and its `Pooling`
/// module's `config.json`; mean pooling and normalisation when there is no `modules.json`.
fn read_head(folder: &Path, hidden: usize) -> Result<(Pooling, bool)> {
    let modules_path = folder.join("modules.json");
    let text = match read_module_file(&modules_path) {
        Ok(text) => text,
        Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            return Ok((Pooling::Mean, true));
        }
        Err(error) => return Err(error),
    };
    let (pooling_folder, normalize) = parse_modules(&text, &modules_path)?;
    let pooling_path = folder.join(pooling_folder).join("config.json");
    let pooling = parse_pooling(&read_module_file(&pooling_path)?, &pooling_path, hidden)?;
    Ok((pooling, normalize))
}

/// The text of a small sentence-transformers file: a plain file (a link to one is followed) of
/// at most [`MAX_MODULE_FILE_BYTES`], checked before it is read, and the read stops past it.
fn read_module_file(path: &Path) -> Result<String> {
    let io = |source| Error::Io { action: "read", path: path.to_path_buf(), source };
    let metadata = std::fs::metadata(path).map_err(io)?;
    let too_large = |bytes: u64| {
        unusable(
            path,
            "",
            "a file of at most 64 KiB, as sentence-transformers writes it",
            format!("{bytes} bytes"),
            "check that it is the file sentence-transformers saved, or remove `modules.json` for mean pooling and normalisation",
        )
    };
    if !metadata.is_file() {
        return Err(unusable(
            path,
            "",
            "a file",
            "a folder or another kind of entry".into(),
            "put the file sentence-transformers saved there",
        ));
    }
    if metadata.len() > MAX_MODULE_FILE_BYTES {
        return Err(too_large(metadata.len()));
    }
    let mut text = String::new();
    std::fs::File::open(path).map_err(io)?.take(MAX_MODULE_FILE_BYTES + 1).read_to_string(&mut text).map_err(io)?;
    if text.len() as u64 > MAX_MODULE_FILE_BYTES {
        return Err(too_large(text.len() as u64));
    }
    Ok(text)
}

/// What to do about a `modules.json` nnx cannot follow.
const FIX_MODULES: &str = "write the list sentence-transformers saves (`Transformer`, `Pooling`, then `Normalize` when the embeddings are normalised), or remove `modules.json` for mean pooling and normalisation";

/// The folder of the `Pooling` module (relative to the model folder) and whether a `Normalize`
/// module follows it, from the text of `modules.json` at `path`.
fn parse_modules(text: &str, path: &Path) -> Result<(PathBuf, bool)> {
    let modules: Value = serde_json::from_str(text).map_err(|error| Error::Config {
        path: path.to_path_buf(),
        problem: ConfigProblem::NotJson { message: error.to_string() },
    })?;
    let Value::Array(modules) = &modules else {
        return Err(unusable(path, "", "a list of modules", describe(Some(&modules)), FIX_MODULES));
    };
    let (mut transformer, mut pooling, mut normalize) = (false, None, false);
    for (at, module) in modules.iter().enumerate() {
        let type_key = format!("[{at}].type");
        let class = module.get("type").and_then(Value::as_str).ok_or_else(|| {
            unusable(path, &type_key, "a module's class name", describe(module.get("type")), FIX_MODULES)
        })?;
        let name = class.strip_prefix("sentence_transformers.").and_then(|rest| rest.rsplit('.').next());
        let path_key = format!("[{at}].path");
        let module_path = module.get("path");
        match name {
            Some("Transformer") if !transformer && pooling.is_none() => {
                let at_top = matches!(module_path, None | Some(Value::Null))
                    || matches!(module_path, Some(Value::String(folder)) if folder.is_empty());
                if !at_top {
                    return Err(unusable(
                        path,
                        &path_key,
                        "`\"\"` (the model's files at the top of the folder)",
                        describe(module_path),
                        "give nnx the folder that holds the model's `config.json` and weights",
                    ));
                }
                transformer = true;
            }
            Some("Pooling") if transformer && pooling.is_none() => {
                let folder = module_path
                    .and_then(Value::as_str)
                    .map(Path::new)
                    .filter(|folder| {
                        folder.components().next().is_some()
                            && folder.components().all(|part| matches!(part, Component::Normal(_) | Component::CurDir))
                    })
                    .ok_or_else(|| {
                        unusable(
                            path,
                            &path_key,
                            "a folder inside the model folder (`1_Pooling`)",
                            describe(module_path),
                            "name the folder of the pooling's `config.json`, as sentence-transformers saves it",
                        )
                    })?;
                pooling = Some(folder.to_path_buf());
            }
            Some("Normalize") if pooling.is_some() && !normalize => normalize = true,
            Some("Transformer" | "Pooling" | "Normalize") => {
                return Err(unusable(
                    path,
                    &type_key,
                    "the modules `Transformer`, `Pooling` and `Normalize`, each once and in that order",
                    describe(module.get("type")),
                    FIX_MODULES,
                ));
            }
            _ => {
                return Err(unusable(
                    path,
                    &type_key,
                    "`sentence_transformers.models.Transformer`, `Pooling` or `Normalize`, the modules nnx computes",
                    describe(module.get("type")),
                    "embed this model with sentence-transformers, which computes its other modules",
                ));
            }
        }
    }
    let pooling = pooling.ok_or_else(|| {
        unusable(
            path,
            "",
            "a list with a `sentence_transformers.models.Pooling` module",
            "a list without one".into(),
            FIX_MODULES,
        )
    })?;
    Ok((pooling, normalize))
}

/// The mode of a `Pooling` module from the text of its `config.json` at `path`, as
/// sentence-transformers reads it: `pooling_mode` names the mode, else the `pooling_mode_*`
/// keys set to `true` (mean when its key is absent, the others off); `hidden` is the model's
/// width, which `word_embedding_dimension` must equal.
fn parse_pooling(text: &str, path: &Path, hidden: usize) -> Result<Pooling> {
    const FIX: &str = "set the mode the model was trained with to `true` and the others to `false`, as sentence-transformers saves them";
    let config: Value = serde_json::from_str(text).map_err(|error| Error::Config {
        path: path.to_path_buf(),
        problem: ConfigProblem::NotJson { message: error.to_string() },
    })?;
    let Value::Object(config) = &config else {
        return Err(unusable(path, "", "an object of `pooling_mode_*` keys", describe(Some(&config)), FIX));
    };
    if let Some(dimension) = config.get("word_embedding_dimension")
        && dimension.as_u64() != Some(hidden as u64)
    {
        return Err(unusable(
            path,
            "word_embedding_dimension",
            "the model's `hidden_size`",
            format!("{}, while `hidden_size` is {hidden}", describe(Some(dimension))),
            "check that the pooling and the folder's `config.json` are the same model's",
        ));
    }
    match config.get("pooling_mode") {
        None | Some(Value::Null) => {}
        Some(mode) => {
            return mode
                .as_str()
                .and_then(|name| Pooling::ALL.into_iter().find(|pooling| pooling.name() == name.to_lowercase()))
                .ok_or_else(|| {
                    unusable(
                        path,
                        "pooling_mode",
                        "`cls`, `max`, `mean`, `mean_sqrt_len_tokens`, `weightedmean` or `lasttoken`",
                        describe(Some(mode)),
                        "name one of these modes, or remove `pooling_mode` to use the `pooling_mode_*` keys",
                    )
                });
        }
    }
    for (key, value) in config {
        let known = Pooling::ALL.iter().any(|pooling| pooling.key() == key);
        if key.starts_with("pooling_mode_") && !known && value != &Value::Bool(false) {
            return Err(unusable(
                path,
                key,
                "`false` (nnx computes `pooling_mode_cls_token`, `pooling_mode_max_tokens`, `pooling_mode_mean_tokens`, `pooling_mode_mean_sqrt_len_tokens`, `pooling_mode_weightedmean_tokens` and `pooling_mode_lasttoken`)",
                describe(Some(value)),
                "embed this model with the library that wrote its pooling",
            ));
        }
    }
    let mut chosen = Vec::new();
    for pooling in Pooling::ALL {
        let on = match config.get(pooling.key()) {
            None => pooling == Pooling::Mean,
            Some(Value::Bool(on)) => *on,
            found => return Err(unusable(path, pooling.key(), "`true` or `false`", describe(found), FIX)),
        };
        if on {
            chosen.push(pooling);
        }
    }
    match chosen[..] {
        [pooling] => Ok(pooling),
        [] => Err(unusable(path, "", "one `pooling_mode_*` key set to `true`", "none set".into(), FIX)),
        [first, second, ..] => Err(unusable(
            path,
            second.key(),
            "`false` (nnx pools with one mode)",
            format!("`true`, as is `{}`", first.key()),
            "nnx does not concatenate poolings as sentence-transformers does; embed this model with sentence-transformers",
        )),
    }
}

/// A JSON value in a few words for an error: a scalar as it is written, a string quoted and
/// cut to 64 characters, a list or an object by its kind.
fn describe(value: Option<&Value>) -> String {
    match value {
        None => "missing".into(),
        Some(Value::String(text)) => {
            let mut shown: String = text.chars().take(64).collect();
            if shown.len() < text.len() {
                shown.push_str("...");
            }
            format!("the string `{shown}`")
        }
        Some(Value::Array(_)) => "a list".into(),
        Some(Value::Object(_)) => "an object".into(),
        Some(scalar) => format!("`{scalar}`"),
    }
}

/// The error of a sentence-transformers file at `path` whose `key` (empty for the whole file)
/// nnx cannot follow.
fn unusable(path: &Path, key: &str, expected: &'static str, found: String, remedy: &'static str) -> Error {
    Error::Config {
        path: path.to_path_buf(),
        problem: ConfigProblem::Unusable { key: key.to_string(), expected, found, remedy },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two tokens of width 3, then a third.
    const STATES: [f32; 9] = [1.0, -2.0, 4.0, 3.0, 0.0, -1.0, 2.0, 5.0, 0.5];

    #[test]
    fn each_pooling_mode_computes_what_sentence_transformers_computes() {
        assert_eq!(Pooling::Cls.pool(&STATES, 3), [1.0, -2.0, 4.0]);
        assert_eq!(Pooling::LastToken.pool(&STATES, 3), [2.0, 5.0, 0.5]);
        assert_eq!(Pooling::Max.pool(&STATES, 3), [3.0, 5.0, 4.0]);
        assert_eq!(Pooling::Mean.pool(&STATES, 3), [2.0, 1.0, 3.5 * (1.0 / 3.0)]);
        let root = 3.0f32.sqrt();
        assert_eq!(Pooling::MeanSqrtLength.pool(&STATES, 3), [6.0 / root, 3.0 / root, 3.5 / root]);
        // Weights 1, 2, 3 over a total of 6.
        assert_eq!(Pooling::WeightedMean.pool(&STATES, 3), [13.0 / 6.0, 13.0 / 6.0, 3.5 / 6.0]);
        for pooling in Pooling::ALL {
            assert_eq!(pooling.pool(&[], 3), [0.0; 3], "{pooling:?} of no tokens");
            assert!(pooling.pool(&STATES, 0).is_empty());
        }
    }

    #[test]
    fn modules_give_the_pooling_folder_and_the_normalisation() {
        let path = Path::new("modules.json");
        let modules = |normalize: &str| {
            format!(
                r#"[{{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"}},
                    {{"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}}{normalize}]"#
            )
        };
        let normalized = modules(r#", {"path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}"#);
        assert_eq!(parse_modules(&normalized, path).unwrap(), (PathBuf::from("1_Pooling"), true));
        assert_eq!(parse_modules(&modules(""), path).unwrap(), (PathBuf::from("1_Pooling"), false));
    }

    #[test]
    fn modules_nnx_cannot_follow_are_refused_by_key() {
        let path = Path::new("modules.json");
        let transformer = r#"{"path": "", "type": "sentence_transformers.models.Transformer"}"#;
        let pooling = r#"{"path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}"#;
        let cases = [
            ("{}".to_string(), "the file is an object"),
            (format!("[{transformer}]"), "a list without one"),
            (
                format!("[{transformer}, {{\"path\": \"../up\", \"type\": \"sentence_transformers.models.Pooling\"}}]"),
                "`[1].path`",
            ),
            (
                format!("[{transformer}, {{\"path\": \"/etc\", \"type\": \"sentence_transformers.models.Pooling\"}}]"),
                "`[1].path`",
            ),
            (format!("[{transformer}, {pooling}, {{\"type\": \"sentence_transformers.models.Dense\"}}]"), "`[2].type`"),
            (format!("[{pooling}, {transformer}]"), "`[0].type`"),
            (format!("[{transformer}, {pooling}, {pooling}]"), "`[2].type`"),
            (format!("[{transformer}, {{\"type\": 7}}]"), "`[1].type` is `7`"),
            ("[".to_string(), "not valid JSON"),
        ];
        for (text, expected) in cases {
            let error = parse_modules(&text, path).unwrap_err().to_string();
            assert!(error.contains(expected) && error.contains("modules.json"), "{text}: {error}");
        }
    }

    #[test]
    fn pooling_configs_are_read_as_sentence_transformers_reads_them() {
        let path = Path::new("1_Pooling/config.json");
        let read = |text: &str| parse_pooling(text, path, 4);
        assert_eq!(
            read(r#"{"word_embedding_dimension": 4, "pooling_mode_mean_tokens": true}"#).unwrap(),
            Pooling::Mean
        );
        // Mean pooling is on unless its key says otherwise.
        assert_eq!(read("{}").unwrap(), Pooling::Mean);
        let cls = r#"{"pooling_mode_cls_token": true, "pooling_mode_mean_tokens": false, "include_prompt": true}"#;
        assert_eq!(read(cls).unwrap(), Pooling::Cls);
        assert_eq!(read(r#"{"pooling_mode": "LastToken"}"#).unwrap(), Pooling::LastToken);
        for pooling in Pooling::ALL {
            let mut config = serde_json::Map::new();
            for other in Pooling::ALL {
                config.insert(other.key().into(), Value::Bool(other == pooling));
            }
            assert_eq!(read(&Value::Object(config).to_string()).unwrap(), pooling);
        }
    }

    #[test]
    fn pooling_configs_nnx_cannot_follow_are_refused_by_key() {
        let path = Path::new("1_Pooling/config.json");
        let cases = [
            (r#"{"pooling_mode_cls_token": "yes"}"#, "`pooling_mode_cls_token` is the string `yes`"),
            (
                r#"{"pooling_mode_cls_token": true}"#,
                "`pooling_mode_mean_tokens` is `true`, as is `pooling_mode_cls_token`",
            ),
            (r#"{"pooling_mode_mean_tokens": false}"#, "none set"),
            (r#"{"word_embedding_dimension": 384}"#, "`word_embedding_dimension` is `384`, while `hidden_size` is 4"),
            (r#"{"pooling_mode_new_tokens": true}"#, "`pooling_mode_new_tokens`"),
            (r#"{"pooling_mode": "sum"}"#, "`pooling_mode` is the string `sum`"),
            ("[]", "the file is a list"),
            ("", "not valid JSON"),
        ];
        for (text, expected) in cases {
            let error = parse_pooling(text, path, 4).unwrap_err().to_string();
            assert!(error.contains(expected) && error.contains("1_Pooling/config.json"), "{text}: {error}");
        }
    }
}
