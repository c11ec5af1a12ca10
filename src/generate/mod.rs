//! Text generation with any [`CausalLm`]: the prompt is computed once into a [`KvCache`], then
//! one token per step, chosen greedily or drawn ([`Sampling`]) with a repetition penalty and a
//! seed, until an end-of-sequence token, a stop string or `max_new_tokens`.
//!
//! ```
//! use nnx::generate::{GenerationConfig, Generator, Sampling};
//! use nnx::models::gpt2::{Gpt2, Gpt2Config};
//! use nnx::nn::Init;
//! use nnx::DType;
//!
//! let config: Gpt2Config = serde_json::from_str(
//!     r#"{"vocab_size": 16, "n_positions": 32, "n_embd": 8, "n_layer": 1, "n_head": 2}"#,
//! )
//! .expect("a configuration");
//! let model = Gpt2::new(&config, DType::F32, Init::Seeded(1));
//! let settings = GenerationConfig {
//!     max_new_tokens: 5,
//!     sampling: Sampling::Random { temperature: 0.8, top_k: Some(8), top_p: Some(0.9), min_p: None },
//!     seed: 42,
//!     ..GenerationConfig::default()
//! };
//! // Two prompts of different lengths decode together (left-padded in one cache).
//! let generation = Generator::new(&model, &[vec![1, 2, 3], vec![4]], settings)?.run()?;
//! assert_eq!(generation.sequences[0].len(), 5);
//! # Ok::<(), nnx::Error>(())
//! ```

mod cache;
mod causal;
#[cfg(feature = "text")]
mod channels;
#[cfg(feature = "text")]
mod chat;
#[cfg(feature = "text")]
mod gguf_tokenizer;
mod sample;
#[cfg(feature = "text")]
mod text;

use std::path::Path;
use std::time::{Duration, Instant};

pub use cache::{KvCache, LayerMemory, RecurrentState};
pub use causal::CausalLm;
pub(crate) use causal::{cached_rows, check_capacity};
#[cfg(feature = "text")]
pub use channels::{ANALYSIS, Channels, Piece};
#[cfg(feature = "text")]
pub use chat::{ChatTemplate, Message};
#[cfg(feature = "text")]
pub use text::{TextStream, Tokenizer};

use crate::error::ConfigProblem;
use crate::{Error, Result};
use sample::Rng;

/// How the next token is chosen from the model's logits.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub enum Sampling {
    /// The most likely token, every step.
    #[default]
    Greedy,
    /// A token drawn from the softmax of the logits divided by `temperature` (0 is greedy),
    /// among the `top_k` most likely tokens (ties with the k-th kept), the tokens at least
    /// `min_p` times as likely as the most likely one, and the smallest set of most likely
    /// tokens whose probability reaches `top_p`.
    Random {
        /// Divides the logits: below 1 sharpens the distribution, above 1 flattens it.
        temperature: f32,
        /// Keep only the `top_k` most likely tokens (at least 1).
        top_k: Option<usize>,
        /// Keep only the most likely tokens whose probability together reaches `top_p`, in
        /// `(0, 1]`.
        top_p: Option<f32>,
        /// Keep only the tokens whose probability before the temperature is at least `min_p`
        /// times the most likely token's (llama.cpp's min-p, which also filters before its
        /// temperature), in `[0, 1]`.
        min_p: Option<f32>,
    },
}

/// What to generate and when to stop.
///
/// [`GenerationConfig::from_folder`] reads a model folder's `generation_config.json` (and the
/// end-of-sequence ids of `config.json`) as transformers does.
#[derive(Clone, Debug, PartialEq)]
pub struct GenerationConfig {
    /// The most tokens to generate per sequence.
    pub max_new_tokens: usize,
    /// How each token is chosen.
    pub sampling: Sampling,
    /// Divides the positive logits (multiplies the negative ones) of every token already in the
    /// sequence, prompt included; 1 leaves them alone, above 1 discourages repetition.
    pub repetition_penalty: f32,
    /// The seed of the draws: the same seed, model and prompt give the same tokens.
    pub seed: u64,
    /// Tokens that end a sequence (kept as its last token).
    pub eos_token_ids: Vec<u32>,
    /// Texts that end a sequence once its decoded tokens contain one (the tokens that complete
    /// it are kept); needs a decoder ([`Generator::with_decoder`]).
    pub stop_strings: Vec<String>,
}

impl Default for GenerationConfig {
    /// 32 greedy tokens, no penalty, seed 0, no stop condition but the length.
    fn default() -> GenerationConfig {
        GenerationConfig {
            max_new_tokens: 32,
            sampling: Sampling::Greedy,
            repetition_penalty: 1.0,
            seed: 0,
            eos_token_ids: Vec::new(),
            stop_strings: Vec::new(),
        }
    }
}

/// The fields of `generation_config.json` and `config.json` generation reads.
#[derive(Default)]
struct FileSettings {
    eos_token_ids: Option<Vec<u32>>,
    max_new_tokens: Option<usize>,
    do_sample: Option<bool>,
    temperature: Option<f32>,
    top_k: Option<usize>,
    top_p: Option<f32>,
    min_p: Option<f32>,
    repetition_penalty: Option<f32>,
}

/// Those fields as the file gives them, each a [`Setting`]; every other field is skipped as it is
/// read, so that a large `config.json` costs no more than its text.
#[derive(serde::Deserialize)]
struct FileFields {
    #[serde(default)]
    eos_token_id: Setting,
    #[serde(default)]
    max_new_tokens: Setting,
    #[serde(default)]
    do_sample: Setting,
    #[serde(default)]
    temperature: Setting,
    #[serde(default)]
    top_k: Setting,
    #[serde(default)]
    top_p: Setting,
    #[serde(default)]
    min_p: Setting,
    #[serde(default)]
    repetition_penalty: Setting,
}

/// One setting's value: a scalar, or a list of unsigned integers (token ids, `None` for an
/// entry that is not one); anything else is consumed without being built, and named in the
/// error of the field that wanted another type.
#[derive(Default)]
enum Setting {
    #[default]
    Null,
    Bool(bool),
    Unsigned(u64),
    Number(f64),
    List(Vec<Option<u64>>),
    Other,
}

impl<'de> serde::Deserialize<'de> for Setting {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> std::result::Result<Setting, D::Error> {
        deserializer.deserialize_any(SettingVisitor { list: true })
    }
}

/// Reads a [`Setting`]; inside a list (`list` false), a nested list is consumed, not built.
struct SettingVisitor {
    list: bool,
}

impl<'de> serde::de::Visitor<'de> for SettingVisitor {
    type Value = Setting;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a generation setting")
    }

    fn visit_bool<E>(self, value: bool) -> std::result::Result<Setting, E> {
        Ok(Setting::Bool(value))
    }

    fn visit_u64<E>(self, value: u64) -> std::result::Result<Setting, E> {
        Ok(Setting::Unsigned(value))
    }

    fn visit_i64<E>(self, value: i64) -> std::result::Result<Setting, E> {
        Ok(u64::try_from(value).map_or(Setting::Number(value as f64), Setting::Unsigned))
    }

    fn visit_f64<E>(self, value: f64) -> std::result::Result<Setting, E> {
        Ok(Setting::Number(value))
    }

    fn visit_str<E>(self, _: &str) -> std::result::Result<Setting, E> {
        Ok(Setting::Other)
    }

    fn visit_unit<E>(self) -> std::result::Result<Setting, E> {
        Ok(Setting::Null)
    }

    fn visit_none<E>(self) -> std::result::Result<Setting, E> {
        Ok(Setting::Null)
    }

    fn visit_some<D: serde::Deserializer<'de>>(self, deserializer: D) -> std::result::Result<Setting, D::Error> {
        deserializer.deserialize_any(self)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> std::result::Result<Setting, A::Error> {
        if !self.list {
            while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
            return Ok(Setting::Other);
        }
        let mut ids = Vec::new();
        while let Some(item) = seq.next_element_seed(ListItem)? {
            ids.push(item);
        }
        Ok(Setting::List(ids))
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> std::result::Result<Setting, A::Error> {
        while map.next_entry::<serde::de::IgnoredAny, serde::de::IgnoredAny>()?.is_some() {}
        Ok(Setting::Other)
    }
}

/// One entry of a list setting: its unsigned integer, or `None`.
struct ListItem;

impl<'de> serde::de::DeserializeSeed<'de> for ListItem {
    type Value = Option<u64>;

    fn deserialize<D: serde::Deserializer<'de>>(self, deserializer: D) -> std::result::Result<Option<u64>, D::Error> {
        match deserializer.deserialize_any(SettingVisitor { list: false })? {
            Setting::Unsigned(value) => Ok(Some(value)),
            _ => Ok(None),
        }
    }
}

impl FileSettings {
    /// The settings of `path`; `None` when the file does not exist.
    fn read(path: &Path) -> Result<Option<FileSettings>> {
        let text = match nnx_io::config::read_text(path) {
            Ok(text) => text,
            Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(error) => return Err(error),
        };
        let fields: FileFields = serde_json::from_str(&text).map_err(|error| Error::Config {
            path: path.to_path_buf(),
            problem: ConfigProblem::NotJson { message: error.to_string() },
        })?;
        let wrong = |field: &str, expected: &str| Error::Config {
            path: path.to_path_buf(),
            problem: ConfigProblem::NotModelConfig { message: format!("field `{field}` must be {expected}") },
        };
        let count = |name: &str, value: &Setting| -> Result<Option<usize>> {
            match value {
                Setting::Null => Ok(None),
                Setting::Unsigned(n) => Ok(Some(usize::try_from(*n).unwrap_or(usize::MAX))),
                _ => Err(wrong(name, "a non-negative integer")),
            }
        };
        let float = |name: &str, value: &Setting| -> Result<Option<f32>> {
            match value {
                Setting::Null => Ok(None),
                Setting::Unsigned(n) => Ok(Some(*n as f32)),
                Setting::Number(x) => Ok(Some(*x as f32)),
                _ => Err(wrong(name, "a number")),
            }
        };
        let ids = "a token id or a list of token ids";
        let id =
            |value: Option<u64>| value.and_then(|id| u32::try_from(id).ok()).ok_or_else(|| wrong("eos_token_id", ids));
        let eos_token_ids = match &fields.eos_token_id {
            Setting::Null => None,
            Setting::List(list) => Some(list.iter().map(|&value| id(value)).collect::<Result<Vec<u32>>>()?),
            Setting::Unsigned(value) => Some(vec![id(Some(*value))?]),
            _ => return Err(wrong("eos_token_id", ids)),
        };
        let do_sample = match fields.do_sample {
            Setting::Null => None,
            Setting::Bool(value) => Some(value),
            _ => return Err(wrong("do_sample", "true or false")),
        };
        Ok(Some(FileSettings {
            eos_token_ids,
            max_new_tokens: count("max_new_tokens", &fields.max_new_tokens)?,
            do_sample,
            temperature: float("temperature", &fields.temperature)?,
            top_k: count("top_k", &fields.top_k)?,
            top_p: float("top_p", &fields.top_p)?,
            min_p: float("min_p", &fields.min_p)?,
            repetition_penalty: float("repetition_penalty", &fields.repetition_penalty)?,
        }))
    }
}

impl GenerationConfig {
    /// The settings of a model folder as transformers reads them: `generation_config.json`
    /// (`max_new_tokens`, `do_sample` with `temperature`, `top_k` (default 50, 0 for none),
    /// `top_p` and `min_p`, `repetition_penalty`, `eos_token_id`), with `eos_token_id` of `config.json`
    /// when the first has none; an id or a list of ids. What neither file sets keeps its
    /// [default](GenerationConfig::default); `max_length`, which counts the prompt, is not
    /// read.
    ///
    /// # Errors
    /// [`Error::Io`] for a file that exists but cannot be read, [`Error::Config`] for one that
    /// is not JSON or whose fields have the wrong type, [`Error::GenerationSetting`] for
    /// values [`GenerationConfig::check`] refuses.
    pub fn from_folder(folder: impl AsRef<Path>) -> Result<GenerationConfig> {
        let folder = folder.as_ref();
        let generation = FileSettings::read(&folder.join("generation_config.json"))?.unwrap_or_default();
        let model = FileSettings::read(&folder.join("config.json"))?.unwrap_or_default();
        let mut config = GenerationConfig {
            eos_token_ids: generation.eos_token_ids.or(model.eos_token_ids).unwrap_or_default(),
            ..GenerationConfig::default()
        };
        if let Some(max_new_tokens) = generation.max_new_tokens {
            config.max_new_tokens = max_new_tokens;
        }
        if generation.do_sample == Some(true) {
            config.sampling = Sampling::Random {
                temperature: generation.temperature.unwrap_or(1.0),
                top_k: Some(generation.top_k.unwrap_or(50)).filter(|&k| k > 0),
                top_p: generation.top_p.filter(|&p| p != 1.0),
                min_p: generation.min_p.filter(|&p| p != 0.0),
            };
        }
        if let Some(penalty) = generation.repetition_penalty {
            config.repetition_penalty = penalty;
        }
        config.check()?;
        Ok(config)
    }

    /// Checks the settings: a finite temperature of at least 0, `top_k` at least 1, `top_p`
    /// in `(0, 1]`, `min_p` in `[0, 1]`, a finite positive repetition penalty.
    ///
    /// # Errors
    /// [`Error::GenerationSetting`] naming the first setting at fault.
    pub fn check(&self) -> Result<()> {
        let fail = |setting: &'static str, value: String, rule: &'static str| -> Result<()> {
            Err(Error::GenerationSetting { setting, value, rule })
        };
        if let Sampling::Random { temperature, top_k, top_p, min_p } = self.sampling {
            if !(temperature.is_finite() && temperature >= 0.0) {
                return fail("temperature", temperature.to_string(), "a finite number of at least 0 (0 is greedy)");
            }
            if top_k == Some(0) {
                return fail("top_k", "0".into(), "at least 1 (or no limit)");
            }
            if let Some(p) = top_p
                && !(p > 0.0 && p <= 1.0)
            {
                return fail("top_p", p.to_string(), "in (0, 1]");
            }
            if let Some(p) = min_p
                && !(0.0..=1.0).contains(&p)
            {
                return fail("min_p", p.to_string(), "in [0, 1]");
            }
        }
        let penalty = self.repetition_penalty;
        if !(penalty.is_finite() && penalty > 0.0) {
            return fail("repetition_penalty", penalty.to_string(), "a finite number above 0 (1 is no penalty)");
        }
        Ok(())
    }
}

/// Why a sequence stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// It produced one of the end-of-sequence tokens.
    EndOfSequence,
    /// Its text came to contain a stop string.
    StopString,
    /// It reached `max_new_tokens`.
    Length,
    /// The model's context is full.
    Context,
}

/// Time spent computing, and tokens computed, in the two phases of a generation.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Timings {
    /// Prompt tokens computed in the prefill (padding not counted).
    pub prefill_tokens: usize,
    /// The time of the prefill.
    pub prefill: Duration,
    /// Tokens computed one step at a time (one per unfinished sequence and step).
    pub decode_tokens: usize,
    /// The time of those steps.
    pub decode: Duration,
}

impl Timings {
    /// Prompt tokens per second.
    pub fn prefill_tokens_per_second(&self) -> f64 {
        self.prefill_tokens as f64 / self.prefill.as_secs_f64().max(f64::MIN_POSITIVE)
    }

    /// Generated tokens computed per second after the prefill.
    pub fn decode_tokens_per_second(&self) -> f64 {
        self.decode_tokens as f64 / self.decode.as_secs_f64().max(f64::MIN_POSITIVE)
    }
}

/// What a finished [`Generator`] produced.
#[derive(Clone, Debug, PartialEq)]
pub struct Generation {
    /// The generated tokens of each sequence, without its prompt.
    pub sequences: Vec<Vec<u32>>,
    /// Why each sequence stopped.
    pub finish_reasons: Vec<FinishReason>,
    /// Tokens and time of the prefill and the decoding steps.
    pub timings: Timings,
}

/// One sequence of a batch being generated.
struct Sequence {
    prompt: Vec<u32>,
    generated: Vec<u32>,
    finish: Option<FinishReason>,
    rng: Rng,
}

/// Turns token ids into text, for stop strings.
type Decoder<'a> = Box<dyn Fn(&[u32]) -> Result<String> + 'a>;

/// Generates tokens for a batch of prompts with one [`CausalLm`], a step at a time.
///
/// The prompts are left-padded to the longest and computed together once (the prefill); each
/// [`step`](Generator::step) then chooses one token per unfinished sequence and computes them
/// together, through the model's [`KvCache`] on its own device. Sequence `i` draws from
/// stream `i` of the seed: the same prompt twice in a batch gives two different draws, and the
/// first sequence of a batch draws as it would alone.
pub struct Generator<'a, M: CausalLm> {
    model: &'a M,
    config: GenerationConfig,
    cache: crate::generate::KvCache<M::Device>,
    sequences: Vec<Sequence>,
    /// The logits of the last position of each sequence, `batch * vocab`.
    logits: Vec<f32>,
    /// The tokens chosen last step, to compute next.
    pending: Option<Vec<u32>>,
    decoder: Option<Decoder<'a>>,
    timings: Timings,
}

impl<'a, M: CausalLm> Generator<'a, M> {
    /// A generator for `prompts` (at least one, each of at least one token), with a cache of
    /// the longest prompt plus `max_new_tokens`, capped at the model's context length. Nothing
    /// is computed until the first [`step`](Generator::step).
    ///
    /// # Errors
    /// [`Error::GenerationSetting`] for settings [`GenerationConfig::check`] refuses,
    /// [`Error::BadShape`] for no prompt or an empty one, [`Error::CacheFull`]
    /// when the longest prompt does not fit the model's context, or the device's error when it
    /// cannot hold the cache.
    pub fn new<P: AsRef<[u32]>>(model: &'a M, prompts: &[P], config: GenerationConfig) -> Result<Generator<'a, M>> {
        config.check()?;
        let lengths: Vec<usize> = prompts.iter().map(|prompt| prompt.as_ref().len()).collect();
        if lengths.is_empty() || lengths.contains(&0) {
            return Err(Error::BadShape {
                op: "generate",
                expected: "one or more prompts of at least one token each",
                shape: lengths,
            });
        }
        let longest = lengths.iter().copied().max().unwrap_or(0);
        let context = model.context_length();
        if longest > context {
            return Err(Error::CacheFull { capacity: context, needed: longest });
        }
        // The last token chosen is never computed, so the cache needs one row less than that.
        let capacity = (longest + config.max_new_tokens.saturating_sub(1)).min(context);
        let mut cache = model.new_cache(prompts.len(), capacity)?;
        cache.set_padding(&lengths.iter().map(|&length| longest - length).collect::<Vec<_>>())?;
        let sequences = prompts
            .iter()
            .enumerate()
            .map(|(index, prompt)| Sequence {
                prompt: prompt.as_ref().to_vec(),
                generated: Vec::new(),
                finish: (config.max_new_tokens == 0).then_some(FinishReason::Length),
                rng: Rng::new(config.seed, index as u64),
            })
            .collect();
        Ok(Generator {
            model,
            config,
            cache,
            sequences,
            logits: Vec::new(),
            pending: None,
            decoder: None,
            timings: Timings::default(),
        })
    }

    /// Sets the decoder that turns a sequence's generated tokens into text, which stop strings
    /// are looked for in.
    pub fn with_decoder(mut self, decoder: impl Fn(&[u32]) -> Result<String> + 'a) -> Generator<'a, M> {
        self.decoder = Some(Box::new(decoder));
        self
    }

    /// Decodes with `tokenizer` (skipping special tokens), for stop strings.
    #[cfg(feature = "text")]
    pub fn with_tokenizer(self, tokenizer: &'a Tokenizer) -> Generator<'a, M> {
        self.with_decoder(move |ids| tokenizer.decode(ids))
    }

    /// Computes what is pending (the prompts, or the tokens of the last step) and chooses the
    /// next token of every unfinished sequence: one entry per sequence, `None` for one that had
    /// finished before this step. `Ok(None)` once every sequence has finished.
    ///
    /// # Errors
    /// The model's errors; [`Error::GenerationSetting`] when stop strings are set without
    /// a decoder; the decoder's errors.
    pub fn step(&mut self) -> Result<Option<Vec<Option<u32>>>> {
        if self.is_finished() {
            return Ok(None);
        }
        if !self.config.stop_strings.is_empty() && self.decoder.is_none() {
            return Err(Error::GenerationSetting {
                setting: "stop_strings",
                value: format!("{:?}", self.config.stop_strings),
                rule: "given with a decoder (`Generator::with_decoder` or `with_tokenizer`)",
            });
        }
        self.compute()?;
        let vocab = self.logits.len() / self.sequences.len();
        let mut chosen = Vec::with_capacity(self.sequences.len());
        for (index, sequence) in self.sequences.iter_mut().enumerate() {
            if sequence.finish.is_some() {
                chosen.push(None);
                continue;
            }
            let row = &mut self.logits[index * vocab..(index + 1) * vocab];
            if self.config.repetition_penalty != 1.0 {
                sample::penalize(row, &sequence.prompt, self.config.repetition_penalty);
                sample::penalize(row, &sequence.generated, self.config.repetition_penalty);
            }
            let token = sample::choose(row, &self.config.sampling, &mut sequence.rng);
            sequence.generated.push(token);
            chosen.push(Some(token));
            sequence.finish = if self.config.eos_token_ids.contains(&token) {
                Some(FinishReason::EndOfSequence)
            } else if sequence.generated.len() >= self.config.max_new_tokens {
                Some(FinishReason::Length)
            } else if self.cache.len() >= self.cache.capacity() {
                Some(FinishReason::Context)
            } else {
                None
            };
            if sequence.finish.is_none()
                && let Some(decoder) = &self.decoder
                && !self.config.stop_strings.is_empty()
            {
                let text = decoder(&sequence.generated)?;
                if self.config.stop_strings.iter().any(|stop| text.contains(stop.as_str())) {
                    sequence.finish = Some(FinishReason::StopString);
                }
            }
        }
        // A finished sequence keeps computing its last token (its results are not used), so
        // that the batch stays one block.
        let next = self.sequences.iter().map(|sequence| sequence.generated.last().copied().unwrap_or(0)).collect();
        self.pending = Some(next);
        Ok(Some(chosen))
    }

    /// Runs the prefill, or the last step's tokens, through the model.
    fn compute(&mut self) -> Result<()> {
        let start = Instant::now();
        match self.pending.take() {
            None if self.logits.is_empty() => {
                let longest = self.sequences.iter().map(|sequence| sequence.prompt.len()).max().unwrap_or(0);
                let mut ids = Vec::with_capacity(longest * self.sequences.len());
                for sequence in &self.sequences {
                    // Padding slots take token 0: any id the model knows, since no query sees them.
                    ids.extend(std::iter::repeat_n(0, longest - sequence.prompt.len()));
                    ids.extend_from_slice(&sequence.prompt);
                }
                self.logits = self.model.forward_cached(&ids, &mut self.cache)?.to_f32_vec()?;
                self.timings.prefill += start.elapsed();
                self.timings.prefill_tokens +=
                    self.sequences.iter().map(|sequence| sequence.prompt.len()).sum::<usize>();
            }
            None => {}
            Some(tokens) => {
                self.logits = self.model.forward_cached(&tokens, &mut self.cache)?.to_f32_vec()?;
                self.timings.decode += start.elapsed();
                self.timings.decode_tokens +=
                    self.sequences.iter().filter(|sequence| sequence.finish.is_none()).count();
            }
        }
        Ok(())
    }

    /// Whether every sequence has finished.
    pub fn is_finished(&self) -> bool {
        self.sequences.iter().all(|sequence| sequence.finish.is_some())
    }

    /// The tokens generated so far for sequence `index` (in the order of the prompts).
    ///
    /// # Panics
    /// When `index` is not a sequence of the batch.
    pub fn generated(&self, index: usize) -> &[u32] {
        &self.sequences[index].generated
    }

    /// Why sequence `index` stopped, or `None` while it runs.
    ///
    /// # Panics
    /// When `index` is not a sequence of the batch.
    pub fn finish_reason(&self, index: usize) -> Option<FinishReason> {
        self.sequences[index].finish
    }

    /// Tokens and time so far.
    pub fn timings(&self) -> Timings {
        self.timings
    }

    /// Steps until every sequence has finished.
    ///
    /// # Errors
    /// As [`Generator::step`].
    pub fn run(mut self) -> Result<Generation> {
        while self.step()?.is_some() {}
        Ok(Generation {
            finish_reasons: self
                .sequences
                .iter()
                .map(|sequence| sequence.finish.unwrap_or(FinishReason::Length))
                .collect(),
            sequences: self.sequences.into_iter().map(|sequence| sequence.generated).collect(),
            timings: self.timings,
        })
    }
}
