//! Text in and out of generation: a model folder's `tokenizer.json`, and [`TextStream`], which
//! turns tokens into text as they arrive without ever printing half a character.

use std::path::{Path, PathBuf};

use crate::{Error, Result};

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
    /// # Errors
    /// [`Error::Tokenizer`] when the file is missing or not a tokenizer.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Tokenizer> {
        let path = path.as_ref().to_path_buf();
        let inner = tokenizers::Tokenizer::from_file(&path)
            .map_err(|source| Error::Tokenizer { path: path.clone(), source })?;
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
