//! Text in and out of generation: a model folder's `tokenizer.json`, and [`TextStream`], which
//! turns tokens into text as they arrive without ever printing half a character.

use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde::de::{Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use crate::{Error, Result};

/// The longest token nnx accepts, in bytes, in a `tokenizer.json` and in a GGUF vocabulary.
/// Trained tokens are at most a few hundred bytes (runs of spaces or dashes); every token is a
/// key of several maps, and an added token a path through an automaton of tens of bytes per
/// byte, so one token of megabytes would cost a hundred times its size.
pub(crate) const MAX_TOKEN_BYTES: usize = 4096;

/// The most added tokens (special, control, user-defined) a tokenizer may have: vocabularies in
/// use have up to a few thousand (Gemma 3: about 6,400).
pub(crate) const MAX_ADDED_TOKENS: usize = 1 << 18;

/// The most text all added tokens together may hold, in bytes: the automaton that finds them in
/// the text takes tens of bytes per byte of theirs. Vocabularies in use need under 100 KiB.
pub(crate) const MAX_ADDED_BYTES: usize = 1 << 20;

/// The most tokens a `tokenizer.json` model's vocabulary may have: eight times the largest in
/// use (262,144).
const MAX_VOCABULARY: usize = 1 << 21;

/// The most text a `tokenizer.json` model's vocabulary may hold: sixteen times the largest in
/// use (about 2 MiB); a Unigram model keeps a trie node of tens of bytes per byte of it.
const MAX_VOCABULARY_BYTES: usize = 32 << 20;

/// The longest regular expression nnx compiles from a `tokenizer.json` normalizer or
/// pre-tokenizer: the longest in use (DeepSeek's letter classes) have about 2 KiB.
const MAX_PATTERN_BYTES: usize = 16 << 10;

/// The largest `tokenizer.json` nnx reads: Gemma 3's, among the largest in use, is 33 MiB.
const MAX_TOKENIZER_JSON_BYTES: u64 = 256 << 20;

/// The tokenizer of a model folder (`tokenizer.json`, as Hugging Face's `tokenizers` writes
/// it), with its errors naming the file.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    path: PathBuf,
}

impl Tokenizer {
    /// Reads `folder/tokenizer.json`.
    ///
    /// # Errors
    /// [`Error::Tokenizer`] when the file is missing or not a tokenizer.
    pub fn from_folder(folder: impl AsRef<Path>) -> Result<Tokenizer> {
        Tokenizer::from_file(folder.as_ref().join("tokenizer.json"))
    }

    /// Reads a `tokenizer.json`.
    ///
    /// The file is checked before it is built: its tokens, added tokens and regular expressions
    /// must stay within limits far above those of real tokenizers (tokens of at most 4 KiB,
    /// 1 MiB of added tokens, regular expressions of at most 16 KiB), so that a small hostile
    /// file cannot make the tokenizer take gigabytes. The padding and truncation the file may
    /// set (BERT's to 128 tokens, say) are left out, as transformers leaves them out of a call
    /// that does not ask for them: a text's ids are its own.
    ///
    /// # Errors
    /// [`Error::Tokenizer`] when the file is missing, not a tokenizer, or past those limits.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Tokenizer> {
        let path = path.as_ref().to_path_buf();
        let error = |source: Box<dyn std::error::Error + Send + Sync>| Error::Tokenizer { path: path.clone(), source };
        let size = std::fs::metadata(&path).map_err(|source| error(source.into()))?.len();
        if size > MAX_TOKENIZER_JSON_BYTES {
            return Err(error(
                format!(
                    "the file is {size} bytes, more than the {} MiB nnx reads as a `tokenizer.json` (the largest in use are under 40 MiB): it is not a tokenizer",
                    MAX_TOKENIZER_JSON_BYTES >> 20
                )
                .into(),
            ));
        }
        let bytes = std::fs::read(&path).map_err(|source| error(source.into()))?;
        check_tokenizer_json(&bytes).map_err(|message| error(message.into()))?;
        let mut inner = tokenizers::Tokenizer::from_bytes(&bytes).map_err(error)?;
        inner.with_padding(None);
        inner.with_truncation(None).map_err(error)?;
        Ok(Tokenizer { inner, path })
    }

    /// The tokenizer a GGUF file's `tokenizer.ggml.*` metadata describes, built to give the ids
    /// llama.cpp gives for the same text (control tokens written in the text are matched):
    /// `gpt2` vocabularies as byte-level BPE split by the regular expressions
    /// `tokenizer.ggml.pre` names, `llama` ones as SentencePiece merged by score with byte
    /// fallback. `origin` is the file, which errors name.
    ///
    /// # Examples
    /// ```no_run
    /// use std::path::Path;
    /// use nnx::generate::Tokenizer;
    /// let path = Path::new("model.gguf");
    /// let archive = nnx::Archive::open(path)?;
    /// let metadata = archive.gguf_metadata().expect("a GGUF file");
    /// let tokenizer = Tokenizer::from_gguf(metadata, path)?;
    /// let ids = tokenizer.encode("Once upon a time")?;
    /// # Ok::<(), nnx::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::Tokenizer`] naming the key at fault: no `tokenizer.ggml.model` or `tokens`, a
    /// model other than `gpt2` and `llama`, a `tokenizer.ggml.pre` nnx does not know (the
    /// message lists those it knows), values of the wrong type, or a BOS/EOS token to add that
    /// no id names.
    pub fn from_gguf(metadata: &crate::gguf::Metadata, origin: &Path) -> Result<Tokenizer> {
        let inner = super::gguf_tokenizer::tokenizer_from_gguf(metadata, origin)?;
        Ok(Tokenizer { inner, path: origin.to_path_buf() })
    }

    /// The token ids of `text`, with the special tokens the tokenizer adds (such as a
    /// beginning-of-sequence token).
    ///
    /// # Errors
    /// [`Error::Tokenizer`] when the tokenizer fails on the text.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let encoding = self.inner.encode(text, true).map_err(|source| self.error(source))?;
        Ok(encoding.get_ids().to_vec())
    }

    /// The text of `ids`, special tokens left out. Bytes that do not form whole UTF-8
    /// characters (a character split across tokens) decode as U+FFFD.
    ///
    /// # Errors
    /// [`Error::Tokenizer`] when the tokenizer fails on the ids.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.inner.decode(ids, true).map_err(|source| self.error(source))
    }

    /// The number of tokens, special tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    fn error(&self, source: tokenizers::Error) -> Error {
        Error::Tokenizer { path: self.path.clone(), source }
    }
}

/// The parts of a `tokenizer.json` whose size [`check_tokenizer_json`] bounds, read without
/// keeping their text: the `tokenizers` crate builds maps and automata many times the size of
/// its tokens and patterns, so they are measured before it sees them.
#[derive(Deserialize)]
struct Outline {
    #[serde(default)]
    added_tokens: Vec<AddedOutline>,
    #[serde(default)]
    normalizer: serde_json::Value,
    #[serde(default)]
    pre_tokenizer: serde_json::Value,
    #[serde(default)]
    model: Option<ModelOutline>,
}

#[derive(Deserialize)]
struct AddedOutline {
    content: Length,
}

#[derive(Deserialize)]
struct ModelOutline {
    #[serde(default)]
    vocab: Option<VocabularyOutline>,
}

/// The byte length of a string, read without keeping it.
struct Length(usize);

impl<'de> Deserialize<'de> for Length {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> std::result::Result<Length, D::Error> {
        struct Measure;
        impl Visitor<'_> for Measure {
            type Value = Length;
            fn expecting(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                formatter.write_str("a string")
            }
            fn visit_str<E: serde::de::Error>(self, text: &str) -> std::result::Result<Length, E> {
                Ok(Length(text.len()))
            }
        }
        deserializer.deserialize_str(Measure)
    }
}

/// A model's vocabulary, measured: a map of token to id (BPE, WordPiece, WordLevel) or a list
/// of `[token, score]` pairs (Unigram).
#[derive(Default)]
struct VocabularyOutline {
    count: usize,
    bytes: usize,
    /// The index and length of the first token longer than [`MAX_TOKEN_BYTES`].
    too_long: Option<(usize, usize)>,
}

impl VocabularyOutline {
    fn add(&mut self, Length(length): Length) {
        if length > MAX_TOKEN_BYTES && self.too_long.is_none() {
            self.too_long = Some((self.count, length));
        }
        self.count += 1;
        self.bytes += length;
    }
}

impl<'de> Deserialize<'de> for VocabularyOutline {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> std::result::Result<VocabularyOutline, D::Error> {
        struct Measure;
        impl<'de> Visitor<'de> for Measure {
            type Value = VocabularyOutline;
            fn expecting(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                formatter.write_str("a map of tokens to ids or a list of [token, score] pairs")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> std::result::Result<VocabularyOutline, A::Error> {
                let mut outline = VocabularyOutline::default();
                while let Some((token, IgnoredAny)) = map.next_entry::<Length, IgnoredAny>()? {
                    outline.add(token);
                }
                Ok(outline)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> std::result::Result<VocabularyOutline, A::Error> {
                let mut outline = VocabularyOutline::default();
                while let Some((token, IgnoredAny)) = seq.next_element::<(Length, IgnoredAny)>()? {
                    outline.add(token);
                }
                Ok(outline)
            }
        }
        deserializer.deserialize_any(Measure)
    }
}

/// Refuses a `tokenizer.json` whose vocabulary, added tokens or regular expressions pass the
/// limits above, in words that name the entry. A file that is not JSON, or not shaped like a
/// tokenizer, passes: the `tokenizers` crate then says what is wrong with it. JSON nested
/// deeper than 128 levels is refused by `serde_json` before anything recurses further.
fn check_tokenizer_json(bytes: &[u8]) -> std::result::Result<(), String> {
    let Ok(outline) = serde_json::from_slice::<Outline>(bytes) else { return Ok(()) };
    if outline.added_tokens.len() > MAX_ADDED_TOKENS {
        return Err(format!(
            "`added_tokens` holds {} tokens, more than the {MAX_ADDED_TOKENS} nnx matches in the text (tokenizers in use have at most a few thousand): the file is damaged or hostile",
            outline.added_tokens.len()
        ));
    }
    let mut bytes = 0;
    for (index, AddedOutline { content: Length(length) }) in outline.added_tokens.iter().enumerate() {
        bytes += length;
        if *length > MAX_TOKEN_BYTES || bytes > MAX_ADDED_BYTES {
            return Err(format!(
                "`added_tokens` entry {index} has a `content` of {length} bytes, and the entries up to it {bytes} bytes: nnx accepts tokens of up to {MAX_TOKEN_BYTES} bytes and {} KiB of added tokens in all (tokenizers in use need under 100 KiB); the file is damaged or hostile",
                MAX_ADDED_BYTES >> 10
            ));
        }
    }
    if let Some(vocabulary) = outline.model.and_then(|model| model.vocab) {
        if let Some((index, length)) = vocabulary.too_long {
            return Err(format!(
                "token {index} of `model.vocab` is {length} bytes long, more than the {MAX_TOKEN_BYTES} nnx accepts (trained tokens have at most a few hundred): the file is damaged or hostile"
            ));
        }
        if vocabulary.count > MAX_VOCABULARY || vocabulary.bytes > MAX_VOCABULARY_BYTES {
            return Err(format!(
                "`model.vocab` holds {} tokens of {} bytes, past the {MAX_VOCABULARY} tokens or {} MiB nnx reads (the largest vocabularies in use have 262,144 tokens of about 2 MiB): the file is damaged or hostile",
                vocabulary.count,
                vocabulary.bytes,
                MAX_VOCABULARY_BYTES >> 20
            ));
        }
    }
    for (entry, value) in [("normalizer", &outline.normalizer), ("pre_tokenizer", &outline.pre_tokenizer)] {
        check_patterns(entry, value)?;
    }
    Ok(())
}

/// Refuses a regular expression longer than [`MAX_PATTERN_BYTES`] anywhere in `value` (the
/// `{"Regex": ...}` patterns of `Split` and `Replace`, inside `Sequence`s at any depth), and a
/// `Precompiled` normalizer that [`check_precompiled`] refuses.
fn check_patterns(entry: &str, value: &serde_json::Value) -> std::result::Result<(), String> {
    match value {
        serde_json::Value::Object(object) => {
            if let Some(serde_json::Value::String(pattern)) = object.get("Regex")
                && pattern.len() > MAX_PATTERN_BYTES
            {
                return Err(format!(
                    "a regular expression of `{entry}` is {} bytes long, more than the {} KiB nnx compiles (those in use have at most a few KiB): the file is damaged or hostile",
                    pattern.len(),
                    MAX_PATTERN_BYTES >> 10
                ));
            }
            if object.get("type").and_then(serde_json::Value::as_str) == Some("Precompiled") {
                let charsmap = object.get("precompiled_charsmap").and_then(serde_json::Value::as_str).unwrap_or("");
                check_precompiled(charsmap).map_err(|problem| {
                    format!(
                        "the `Precompiled` normalizer of `{entry}` has a `precompiled_charsmap` that {problem}: the file is damaged; take `tokenizer.json` again from the model's repository"
                    )
                })?;
            }
            object.values().try_for_each(|value| check_patterns(entry, value))
        }
        serde_json::Value::Array(items) => items.iter().try_for_each(|value| check_patterns(entry, value)),
        _ => Ok(()),
    }
}

/// Checks a SentencePiece `precompiled_charsmap` (base64 of a little-endian `u32` byte length,
/// that many bytes of darts-clone double-array units, then NUL-separated UTF-8 replacements)
/// as the `tokenizers` crate reads it: it panics on base64 it cannot decode, and indexes the
/// array and the replacements unchecked when it normalizes. Every state the text can reach is
/// walked once, with each of the 255 bytes, and every index it would read must be in bounds.
/// Tries are built in blocks of 256 units, so a trained one passes.
fn check_precompiled(charsmap: &str) -> std::result::Result<(), &'static str> {
    let bytes = base64_decode(charsmap).ok_or("is not base64")?;
    let length = bytes.get(..4).ok_or("is shorter than its length")?;
    let trie_bytes = u32::from_le_bytes(length.try_into().map_err(|_| "is shorter than its length")?) as usize;
    let units_end = 4 + trie_bytes / 4 * 4;
    let trie = bytes.get(4..units_end).ok_or("is shorter than the trie it announces")?;
    let units: Vec<usize> =
        trie.chunks_exact(4).map(|unit| u32::from_le_bytes([unit[0], unit[1], unit[2], unit[3]]) as usize).collect();
    let normalized = std::str::from_utf8(&bytes[units_end..]).map_err(|_| "has replacements that are not UTF-8")?;
    let offset = |unit: usize| (unit >> 10) << ((unit & (1 << 9)) >> 6);
    let root = *units.first().ok_or("has an empty trie")?;
    let mut seen = vec![false; units.len()];
    let mut pending = vec![offset(root)];
    while let Some(position) = pending.pop() {
        let Some(seen) = seen.get_mut(position) else { return Err("has a trie that points past its end") };
        if std::mem::replace(seen, true) {
            continue;
        }
        for byte in 1..=255usize {
            let unit = *units.get(position ^ byte).ok_or("has a trie that points past its end")?;
            if unit & ((1 << 31) | 0xFF) != byte {
                continue;
            }
            let next = position ^ byte ^ offset(unit);
            let Some(&leaf) = units.get(next) else { return Err("has a trie that points past its end") };
            if (unit >> 8) & 1 == 1 && !normalized.is_char_boundary(leaf & ((1 << 31) - 1)) {
                return Err("has a replacement that starts outside its text");
            }
            pending.push(next);
        }
    }
    Ok(())
}

/// Standard base64 with optional padding; `None` for anything else.
fn base64_decode(text: &str) -> Option<Vec<u8>> {
    let digit = |byte: u8| -> Option<u32> {
        Some(match byte {
            b'A'..=b'Z' => byte - b'A',
            b'a'..=b'z' => byte - b'a' + 26,
            b'0'..=b'9' => byte - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    };
    let text = text.trim_end_matches('=').as_bytes();
    let mut out = Vec::with_capacity(text.len() / 4 * 3 + 2);
    for chunk in text.chunks(4) {
        let mut bits = 0u32;
        for &byte in chunk {
            bits = bits << 6 | digit(byte)?;
        }
        bits <<= 6 * (4 - chunk.len() as u32);
        let decoded = bits.to_be_bytes();
        match chunk.len() {
            4 => out.extend_from_slice(&decoded[1..4]),
            3 => out.extend_from_slice(&decoded[1..3]),
            2 => out.push(decoded[1]),
            _ => return None,
        }
    }
    Some(out)
}

/// Generated tokens turned into text as they arrive: [`push`](TextStream::push) returns the
/// characters a token completes. A character whose bytes are split across tokens comes out
/// whole, with the token that ends it.
///
/// Only a short window of tokens is decoded at each push: the text of a window that starts at
/// the last token of the previous text extends that token's text, which holds for byte-level
/// BPE and SentencePiece decoders.
///
/// # Examples
/// ```no_run
/// use nnx::generate::{TextStream, Tokenizer};
/// let tokenizer = Tokenizer::from_folder("tests/fixtures/gpt2-tiny")?;
/// let prompt = tokenizer.encode("Once upon a time")?;
/// let mut stream = TextStream::new(&tokenizer, &prompt);
/// for token in [11u32, 12, 13] {
///     print!("{}", stream.push(token)?);
/// }
/// print!("{}", stream.finish()?);
/// # Ok::<(), nnx::Error>(())
/// ```
pub struct TextStream<'a> {
    tokenizer: &'a Tokenizer,
    /// The tokens of the window: the last token of the text returned so far, then the new ones.
    window: Vec<u32>,
    /// The bytes of the window's text already returned.
    returned: usize,
}

impl<'a> TextStream<'a> {
    /// A stream whose first token follows `context` (the prompt): its last token is decoded
    /// with the new ones, so that a leading space comes out as it would inside the text.
    pub fn new(tokenizer: &'a Tokenizer, context: &[u32]) -> TextStream<'a> {
        let mut stream = TextStream { tokenizer, window: context.last().copied().into_iter().collect(), returned: 0 };
        stream.returned = stream.window_text().map_or(0, |text| text.len());
        stream
    }

    fn window_text(&self) -> Result<String> {
        self.tokenizer.decode(&self.window)
    }

    /// The text `token` completes: empty while it ends inside a character.
    ///
    /// # Errors
    /// [`Error::Tokenizer`] when the tokenizer fails on the tokens.
    pub fn push(&mut self, token: u32) -> Result<String> {
        self.window.push(token);
        let text = self.window_text()?;
        if text.ends_with(char::REPLACEMENT_CHARACTER) {
            return Ok(String::new());
        }
        let new = text.get(self.returned..).unwrap_or_default().to_string();
        // The next window starts at this token, whose text ends on a whole character.
        self.window.drain(..self.window.len() - 1);
        self.returned = self.window_text()?.len();
        Ok(new)
    }

    /// The text of the tokens still held back (bytes that never completed a character come out
    /// as U+FFFD); the stream is then empty.
    ///
    /// # Errors
    /// [`Error::Tokenizer`] when the tokenizer fails on the tokens.
    pub fn finish(&mut self) -> Result<String> {
        let text = self.window_text()?;
        let rest = text.get(self.returned..).unwrap_or_default().to_string();
        self.window.drain(..self.window.len().saturating_sub(1));
        self.returned = self.window_text()?.len();
        Ok(rest)
    }
}
