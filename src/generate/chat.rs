//! Chat templates: the Jinja program a model ships to turn a conversation into its prompt,
//! rendered as transformers' `apply_chat_template` renders it, so that a prompt built here is
//! the one the model was trained on, byte for byte.
//!
//! transformers compiles templates in a sandboxed Jinja environment with `trim_blocks` and
//! `lstrip_blocks`, the loop controls (`break`, `continue`), a `raise_exception(message)`
//! function, a `strftime_now(format)` function and its own `tojson` filter (Python's
//! `json.dumps`, without HTML escaping); templates also call Python's string and dict methods
//! (`.strip()`, `.split()`, `.startswith()`, `.items()`). The same is set up here on
//! minijinja, with Python's method names from minijinja-contrib.

use std::fmt::Write as _;
use std::path::Path;
use std::sync::{Arc, mpsc};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use minijinja::formatting::FormatStyle;
use minijinja::value::{Kwargs, Rest, Serde, StringInput, Value, ValueKind, ValueOrKwargs};
use minijinja::{Environment, ErrorKind, State};
use serde::Serialize;

use crate::gguf::Metadata;
use crate::{Error, Result};

// Templates come from downloaded model files, so every render is bounded. The published
// templates of `tests/fixtures/chat/` are at most 6 KB with at most 40 tokens in one tag, and
// use about 60 fuel a message plus one per 14 bytes of content (1,000 messages of 2 KB: under
// 200,000); the limits below leave room for longer conversations than any context holds.

/// The largest template source compiled: published templates are a few KB.
const MAX_SOURCE_BYTES: usize = 1 << 20;

/// The most tokens one tag (`{{ ... }}`, `{% ... %}`) may hold: each can add a level to the
/// syntax tree, which the engine compiles and drops recursively, so this bounds its stack.
const MAX_TAG_TOKENS: usize = 2_000;

/// The fuel of one render, plus one per [`BYTES_PER_FUEL`] bytes of the conversation up to as
/// much again: minijinja charges one per instruction and one per 64 bytes of data a template
/// makes, so this bounds both its time and its memory (32 MB of strings at most). It also
/// bounds how deep a value a loop can nest, which [`RENDER_STACK_BYTES`] is sized for.
const FUEL: u64 = 250_000;

/// The bytes of conversation that pay for one more fuel: nearly twice what the published
/// templates spend on their messages' text.
const BYTES_PER_FUEL: u64 = 8;

/// The largest rendered prompt: about a million tokens, past the context of published models,
/// and the most that `tojson`, `format`, `indent` and Python's string methods may make at once.
const MAX_OUTPUT_BYTES: usize = 4 << 20;

/// The stack of the thread templates are compiled and rendered on. Printing, comparing and
/// dropping a nested value recurse in the engine (about 400 bytes a level); twice [`FUEL`] lets
/// a template nest one at most about 320,000 levels deep, which needs some 130 MiB. Reserving the
/// stack costs address space only; its pages are touched as used.
const RENDER_STACK_BYTES: usize = 256 << 20;

/// How long a render may take. Fuel stops runaway loops within milliseconds; the engine's own
/// walks over a shared value (`a ~ ''`, `a == b` on a list that holds itself twice, 48 times
/// over) cost no fuel, so a deadline bounds them.
const RENDER_TIME_LIMIT: Duration = Duration::from_secs(5);

/// The most characters of a template's `raise_exception` message kept in the error.
const MAX_MESSAGE_CHARS: usize = 1_000;

/// The name a template is compiled under: the environment holds one.
const NAME: &str = "chat_template";

/// Markers that end a model's turn, as templates emit them after each message; the
/// generation should stop on the ones its template uses (besides the end-of-sequence token).
const END_OF_TURN: &[&str] = &[
    "<|eot_id|>",
    "<|eom_id|>",
    "<|im_end|>",
    "<end_of_turn>",
    "<turn|>",
    "<|end|>",
    "<|END_OF_TURN_TOKEN|>",
    "<end_of_utterance>",
    "<|endoftext|>",
];

/// One message of a conversation, as templates read it (`message.role`, `message.content`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Message {
    /// Who speaks: `system`, `user` or `assistant` (some templates know others, like `tool`).
    pub role: String,
    /// What is said.
    pub content: String,
}

impl Message {
    /// A message of `role` saying `content`.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Message {
        Message { role: role.into(), content: content.into() }
    }
}

/// A compiled chat template with the special tokens it is rendered with.
///
/// ```
/// use nnx::generate::{ChatTemplate, Message};
///
/// let template = ChatTemplate::new(
///     "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content | trim }}<|im_end|>\n{% endfor %}\
///      {% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
///     "",
///     "<|endoftext|>",
/// )?;
/// let prompt = template.render(&[Message::new("user", " Hello ")], true)?;
/// assert_eq!(prompt, "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n");
/// assert_eq!(template.stop_strings(), ["<|endoftext|>", "<|im_end|>"]);
/// # Ok::<(), nnx::Error>(())
/// ```
pub struct ChatTemplate {
    /// Shared with the thread each render runs on.
    environment: Arc<Environment<'static>>,
    origin: String,
    source: String,
    bos_token: String,
    eos_token: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("origin", &self.origin)
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .finish_non_exhaustive()
    }
}

impl ChatTemplate {
    /// Compiles `source` to be rendered with these beginning- and end-of-sequence tokens (an
    /// empty one is left undefined, as transformers leaves a tokenizer's missing tokens).
    ///
    /// # Errors
    /// [`Error::Template`] naming the line of a syntax error, or a source past 1 MiB (`is too
    /// large`) or with a tag of over 2,000 tokens (`nests too deeply`).
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<ChatTemplate> {
        ChatTemplate::compile("the given source", source, bos_token, eos_token)
    }

    /// The template of a GGUF file's metadata (`tokenizer.chat_template`), with the tokens
    /// `tokenizer.ggml.bos_token_id` and `tokenizer.ggml.eos_token_id` name in
    /// `tokenizer.ggml.tokens`; `None` when the file has no template.
    ///
    /// # Errors
    /// [`Error::Template`] for a template that is not a string or does not compile.
    pub fn from_gguf(metadata: &Metadata) -> Result<Option<ChatTemplate>> {
        const KEY: &str = "tokenizer.chat_template";
        let origin = format!("the GGUF key `{KEY}`");
        let Some(value) = metadata.get(KEY) else { return Ok(None) };
        let Some(source) = value.as_str() else {
            return Err(Error::Template {
                origin,
                line: None,
                failure: "cannot be read",
                message: "the value is not a string".into(),
                remedy: "write the template as a string, or pass one to `ChatTemplate::new`",
            });
        };
        let tokens = metadata.get("tokenizer.ggml.tokens").and_then(|tokens| tokens.as_array());
        let token = |key: &str| -> String {
            let id = metadata.u64(key).and_then(|id| usize::try_from(id).ok());
            match (tokens, id) {
                (Some(tokens), Some(id)) => {
                    tokens.get(id).and_then(|token| token.as_str().map(String::from)).unwrap_or_default()
                }
                _ => String::new(),
            }
        };
        let (bos, eos) = (token("tokenizer.ggml.bos_token_id"), token("tokenizer.ggml.eos_token_id"));
        ChatTemplate::compile(&origin, source, &bos, &eos).map(Some)
    }

    /// The template of a model folder as transformers loads it: `chat_template.jinja` when
    /// there is one, else `chat_template` of `tokenizer_config.json` (a string, or a list of
    /// `{name, template}` of which the one named `default` is taken); the tokens are
    /// `bos_token` and `eos_token` of `tokenizer_config.json` (strings, or objects with a
    /// `content`). `None` when the folder has no template.
    ///
    /// # Errors
    /// [`Error::Io`] for a file that exists but cannot be read, [`Error::Config`] for a
    /// `tokenizer_config.json` that is not JSON, [`Error::Template`] for a `chat_template` of
    /// another shape, a list without `default`, or a template that does not compile.
    pub fn from_folder(dir: &Path) -> Result<Option<ChatTemplate>> {
        let config_path = dir.join("tokenizer_config.json");
        let config = match read_optional(&config_path)? {
            Some(text) => serde_json::from_str::<serde_json::Value>(&text).map_err(|error| Error::Config {
                path: config_path.clone(),
                problem: crate::error::ConfigProblem::NotJson { message: error.to_string() },
            })?,
            None => serde_json::Value::Null,
        };
        let token = |key: &str| -> String {
            match config.get(key) {
                Some(serde_json::Value::String(token)) => token.clone(),
                Some(serde_json::Value::Object(token)) => {
                    token.get("content").and_then(|content| content.as_str()).unwrap_or_default().to_string()
                }
                _ => String::new(),
            }
        };
        let (bos, eos) = (token("bos_token"), token("eos_token"));
        let jinja_path = dir.join("chat_template.jinja");
        if let Some(source) = read_optional(&jinja_path)? {
            return ChatTemplate::compile(&format!("`{}`", jinja_path.display()), &source, &bos, &eos).map(Some);
        }
        let origin = format!("`{}` entry `chat_template`", config_path.display());
        let wrong = |message: String| Error::Template {
            origin: origin.clone(),
            line: None,
            failure: "cannot be read",
            message,
            remedy: "give `chat_template` as a string or a list of `{\"name\", \"template\"}` with one named `default`",
        };
        let source = match config.get("chat_template") {
            None | Some(serde_json::Value::Null) => return Ok(None),
            Some(serde_json::Value::String(source)) => source.as_str(),
            Some(serde_json::Value::Array(named)) => named
                .iter()
                .find(|entry| entry.get("name").and_then(|name| name.as_str()) == Some("default"))
                .and_then(|entry| entry.get("template"))
                .and_then(|template| template.as_str())
                .ok_or_else(|| wrong("`chat_template` is a list with no template named `default`".into()))?,
            Some(_) => return Err(wrong("`chat_template` is neither a string nor a list".into())),
        };
        ChatTemplate::compile(&origin, source, &bos, &eos).map(Some)
    }

    /// Sets up transformers' environment and compiles `source` in it, on the render thread.
    fn compile(origin: &str, source: &str, bos_token: &str, eos_token: &str) -> Result<ChatTemplate> {
        if source.len() > MAX_SOURCE_BYTES {
            return Err(limit_error(
                origin,
                None,
                Exceeded {
                    failure: "is too large",
                    message: format!("{} bytes, past the {MAX_SOURCE_BYTES} nnx compiles", source.len()),
                    remedy: "use the template published with the model; a chat template is a few KB",
                },
            ));
        }
        if let Some((line, tokens)) = crowded_tag(source) {
            return Err(limit_error(
                origin,
                Some(line),
                Exceeded {
                    failure: "nests too deeply",
                    message: format!("a tag of over {tokens} tokens, past the {MAX_TAG_TOKENS} nnx allows in one tag"),
                    remedy: "split the expression over several `{% set %}` tags",
                },
            ));
        }
        let prepared = without_generation_tags(source);
        let compile_origin = origin.to_string();
        let environment = on_render_thread(origin, move || {
            let mut environment = Environment::new();
            let syntax = minijinja::syntax::SyntaxConfig::builder()
                .trim_blocks(true)
                .lstrip_blocks(true)
                .build()
                .map_err(|error| template_error(&compile_origin, &error))?;
            environment.set_syntax(syntax);
            environment.set_fuel(Some(FUEL));
            environment.set_unknown_method_callback(python_method);
            environment.add_function("raise_exception", raise_exception);
            environment.add_function("strftime_now", strftime_now);
            environment.add_filter("tojson", tojson);
            add_bounded_filters(&mut environment);
            environment.add_template_owned(NAME, prepared).map_err(|error| template_error(&compile_origin, &error))?;
            Ok(environment)
        })?;
        Ok(ChatTemplate {
            environment: Arc::new(environment),
            origin: origin.to_string(),
            source: source.to_string(),
            bos_token: bos_token.to_string(),
            eos_token: eos_token.to_string(),
        })
    }

    /// The prompt of `messages`, ending with the opening of the assistant's turn when
    /// `add_generation_prompt` (what a generation continues from). The template sees
    /// `messages`, `add_generation_prompt`, `bos_token`, `eos_token`, and `tools` and
    /// `documents` as none, as transformers passes them for a plain conversation.
    ///
    /// # Errors
    /// [`Error::Template`] with the template's own message when it refuses the conversation
    /// (`raise_exception`, e.g. roles that do not alternate), or the engine's when rendering
    /// fails, with the line; or the bound a template passed: `runs too long` (its fuel, or a
    /// 5 s deadline), `writes too much` (a prompt past 4 MiB), `nests too deeply` (a value past
    /// 512 levels in `tojson` and the filters that walk values).
    pub fn render(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String> {
        let environment = Arc::clone(&self.environment);
        let messages = messages.to_vec();
        let origin = self.origin.clone();
        // transformers passes the tokens its tokenizer has; a missing one stays undefined.
        let tokens: Vec<(&'static str, String)> = [("bos_token", &self.bos_token), ("eos_token", &self.eos_token)]
            .into_iter()
            .filter(|(_, token)| !token.is_empty())
            .map(|(name, token)| (name, token.clone()))
            .collect();
        let conversation: usize = messages.iter().map(|message| message.role.len() + message.content.len()).sum();
        let fuel = FUEL + (conversation as u64 / BYTES_PER_FUEL).min(FUEL);
        on_render_thread(&self.origin, move || {
            // A clone shares the compiled template; only its fuel differs.
            let mut environment = (*environment).clone();
            environment.set_fuel(Some(fuel));
            let mut context: Vec<(&str, Value)> = vec![
                ("messages", Value::from(Serde(&messages))),
                ("add_generation_prompt", Value::from(add_generation_prompt)),
                ("tools", Value::from(())),
                ("documents", Value::from(())),
            ];
            for (name, token) in &tokens {
                context.push((name, Value::from(token.as_str())));
            }
            let context = Value::from_pairs(context);
            let template = environment.get_template(NAME).map_err(|error| template_error(&origin, &error))?;
            let mut output = BoundedOutput::default();
            match template.render_captured_to(context, &mut output) {
                Ok(_) => String::from_utf8(output.bytes).map_err(|_| {
                    limit_error(
                        &origin,
                        None,
                        Exceeded {
                            failure: "failed to render",
                            message: "the engine wrote text that is not UTF-8".into(),
                            remedy: "report the template to the nnx maintainers",
                        },
                    )
                }),
                Err(_) if output.passed => Err(limit_error(
                    &origin,
                    None,
                    Exceeded {
                        failure: "writes too much",
                        message: format!("the prompt passed the {MAX_OUTPUT_BYTES} bytes nnx allows"),
                        remedy: "shorten the conversation, or check the template for a runaway loop or a huge value",
                    },
                )),
                Err(error) => Err(template_error(&origin, &error)),
            }
        })
    }

    /// Whether the template writes turns of channels (gpt-oss's harmony format, `<|channel|>`),
    /// whose messages [`Channels`](crate::generate::Channels) follows.
    pub fn has_channels(&self) -> bool {
        self.source.contains("<|channel|>")
    }

    /// The texts that end the assistant's turn: the end-of-sequence token, then each
    /// end-of-turn marker the template emits (`<|eot_id|>`, `<|im_end|>`, `<end_of_turn>`, ...),
    /// for [`GenerationConfig::stop_strings`](crate::generate::GenerationConfig::stop_strings)
    /// when the model's end-of-sequence ids miss them.
    ///
    /// A template of channels (gpt-oss's harmony format, `<|channel|>`) ends a turn on
    /// `<|return|>` or `<|call|>`: its `<|end|>` closes one message of the turn (the analysis
    /// before the final answer), not the turn.
    pub fn stop_strings(&self) -> Vec<String> {
        let mut stops: Vec<String> = Vec::new();
        let markers: &[&str] = if self.has_channels() { &["<|return|>", "<|call|>"] } else { END_OF_TURN };
        let candidates = std::iter::once(self.eos_token.as_str())
            .chain(markers.iter().copied().filter(|marker| self.source.contains(marker)));
        for stop in candidates {
            if !stop.is_empty() && !stops.iter().any(|seen| seen == stop) {
                stops.push(stop.to_string());
            }
        }
        stops
    }
}

/// The text of `path`, or `None` when it does not exist.
fn read_optional(path: &Path) -> Result<Option<String>> {
    match nnx_io::config::read_text(path) {
        Ok(text) => Ok(Some(text)),
        Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(error) => Err(error),
    }
}

/// The message a template gave `raise_exception`, carried through minijinja's error as its
/// source so that it is told apart from the engine's errors.
#[derive(Debug)]
struct Raised(String);

impl std::fmt::Display for Raised {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Raised {}

/// nnx's error for a minijinja error of the template from `origin`.
fn template_error(origin: &str, error: &minijinja::Error) -> Error {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    let causes: Vec<&(dyn std::error::Error + 'static)> = std::iter::from_fn(|| {
        let current = source?;
        source = current.source();
        Some(current)
    })
    .collect();
    let raised = causes.iter().find_map(|error| error.downcast_ref::<Raised>());
    let exceeded = causes.iter().find_map(|error| error.downcast_ref::<Exceeded>());
    let (failure, message, remedy) = if let Some(Raised(message)) = raised {
        (
            "refused the conversation",
            message.clone(),
            "change the messages as the template's message asks (roles, order, content)",
        )
    } else if let Some(exceeded) = exceeded {
        (exceeded.failure, exceeded.message.clone(), exceeded.remedy)
    } else {
        let message = match error.detail() {
            Some(detail) => format!("{}: {detail}", error.kind()),
            None => error.kind().to_string(),
        };
        match error.kind() {
            ErrorKind::SyntaxError => {
                ("does not compile", message, "correct the template, or pass another one to `ChatTemplate::new`")
            }
            ErrorKind::OutOfFuel => (
                "runs too long",
                format!(
                    "it used up the fuel nnx allows a render ({FUEL}, plus one per {BYTES_PER_FUEL} bytes of the \
                     conversation up to twice that; one per instruction, one per 64 bytes of data it makes)"
                ),
                "shorten the conversation, or check the template for a runaway loop or a huge value",
            ),
            _ => (
                "failed to render",
                message,
                "check that the messages have the fields the template reads, or pass a template written for them",
            ),
        }
    };
    Error::Template {
        origin: origin.to_string(),
        line: error.line(),
        failure,
        message: nnx_core::text::printable(&message).into_owned(),
        remedy,
    }
}

/// A bound of nnx's that a template passed, carried through minijinja's error as its source
/// (like [`Raised`]) so that the error says which bound it was.
#[derive(Debug)]
struct Exceeded {
    /// What went wrong, as [`Error::Template`] words it: `writes too much`, ...
    failure: &'static str,
    /// Which bound, and by how much.
    message: String,
    /// What to do about it.
    remedy: &'static str,
}

impl std::fmt::Display for Exceeded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Exceeded {}

impl Exceeded {
    /// The engine error that carries this one.
    fn into_engine(self) -> minijinja::Error {
        minijinja::Error::new(ErrorKind::InvalidOperation, self.message.clone()).with_source(self)
    }
}

/// nnx's error for a bound of nnx's passed outside the engine.
fn limit_error(origin: &str, line: Option<usize>, exceeded: Exceeded) -> Error {
    Error::Template {
        origin: origin.to_string(),
        line,
        failure: exceeded.failure,
        message: exceeded.message,
        remedy: exceeded.remedy,
    }
}

/// What a value made by one filter or method may hold, refused past [`MAX_OUTPUT_BYTES`].
fn too_large(what: &str, bytes: u64) -> minijinja::Error {
    Exceeded {
        failure: "writes too much",
        message: format!("{what} would make {bytes} bytes, past the {MAX_OUTPUT_BYTES} nnx allows"),
        remedy: "check the template for a huge width, count or repetition",
    }
    .into_engine()
}

/// Runs `work` on a thread of its own with a [`RENDER_STACK_BYTES`] stack, whatever the
/// caller's stack, and gives up on it after [`RENDER_TIME_LIMIT`] (it is left to finish on its
/// own: a thread cannot be stopped from outside).
fn on_render_thread<T: Send + 'static>(origin: &str, work: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    let (sender, receiver) = mpsc::sync_channel(1);
    let spawned =
        std::thread::Builder::new().name("nnx-chat-template".into()).stack_size(RENDER_STACK_BYTES).spawn(move || {
            let _ = sender.send(work());
        });
    if let Err(error) = spawned {
        return Err(limit_error(
            origin,
            None,
            Exceeded {
                failure: "cannot be rendered",
                message: format!("no thread with a {} MiB stack could be started: {error}", RENDER_STACK_BYTES >> 20),
                remedy: "raise the process's address-space limit (`ulimit -v`)",
            },
        ));
    }
    match receiver.recv_timeout(RENDER_TIME_LIMIT) {
        Ok(result) => result,
        Err(mpsc::RecvTimeoutError::Timeout) => Err(limit_error(
            origin,
            None,
            Exceeded {
                failure: "runs too long",
                message: format!("it did not finish within the {} s nnx allows a render", RENDER_TIME_LIMIT.as_secs()),
                remedy: "check the template for a value that holds itself many times over",
            },
        )),
        Err(mpsc::RecvTimeoutError::Disconnected) => Err(limit_error(
            origin,
            None,
            Exceeded {
                failure: "failed to render",
                message: "the engine stopped without a result".into(),
                remedy: "report the template to the nnx maintainers",
            },
        )),
    }
}

/// The rendered prompt, refused once it passes [`MAX_OUTPUT_BYTES`]: the engine stops writing
/// (and printing a value) at the first refused write.
#[derive(Default)]
struct BoundedOutput {
    bytes: Vec<u8>,
    /// Whether a write was refused.
    passed: bool,
}

impl std::io::Write for BoundedOutput {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.bytes.len() + buf.len() > MAX_OUTPUT_BYTES {
            self.passed = true;
            return Err(std::io::Error::other("the prompt is too large"));
        }
        self.bytes.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The line of the first tag (`{{ ... }}` or `{% ... %}`) of `source` that holds more than
/// [`MAX_TAG_TOKENS`] tokens, and that count, read as minijinja's lexer reads tags: strings
/// whole, a tag ending only where its brackets balance; comments and `raw` blocks skipped.
fn crowded_tag(source: &str) -> Option<(usize, usize)> {
    let bytes = source.as_bytes();
    let line_at = |at: usize| 1 + bytes[..at.min(bytes.len())].iter().filter(|&&b| b == b'\n').count();
    let mut at = 0;
    while let Some(offset) = source.get(at..).and_then(|rest| rest.find('{')) {
        let start = at + offset;
        let end = match bytes.get(start + 1) {
            Some(b'#') => {
                at = source[start + 2..].find("#}").map_or(bytes.len(), |end| start + 2 + end + 2);
                continue;
            }
            Some(b'{') => b'}',
            Some(b'%') => b'%',
            _ => {
                at = start + 1;
                continue;
            }
        };
        let mut cursor = start + 2;
        let mut balance = 0isize;
        let mut tokens = 0usize;
        let mut first_word: Option<&str> = None;
        while cursor < bytes.len() {
            let byte = bytes[cursor];
            if balance == 0 && byte == end && bytes.get(cursor + 1) == Some(&b'}') {
                cursor += 2;
                break;
            }
            match byte {
                b'\'' | b'"' => {
                    cursor += 1;
                    while cursor < bytes.len() && bytes[cursor] != byte {
                        cursor += if bytes[cursor] == b'\\' { 2 } else { 1 };
                    }
                    cursor += 1;
                }
                b if b.is_ascii_alphanumeric() || b == b'_' || b >= 0x80 => {
                    let word_start = cursor;
                    while cursor < bytes.len()
                        && (bytes[cursor].is_ascii_alphanumeric() || bytes[cursor] == b'_' || bytes[cursor] >= 0x80)
                    {
                        cursor += 1;
                    }
                    if tokens == 0 {
                        first_word = source.get(word_start..cursor);
                    }
                }
                b if b.is_ascii_whitespace() => {
                    cursor += 1;
                    continue;
                }
                b => {
                    balance += match b {
                        b'(' | b'[' | b'{' => 1,
                        b')' | b']' | b'}' => -1,
                        _ => 0,
                    };
                    cursor += 1;
                    // `-` and `+` right after the opening are whitespace control, not tokens.
                    if tokens == 0 && cursor == start + 3 && (b == b'-' || b == b'+') {
                        continue;
                    }
                }
            }
            tokens += 1;
            if tokens > MAX_TAG_TOKENS {
                return Some((line_at(start), MAX_TAG_TOKENS));
            }
        }
        at = cursor;
        // A raw block's body is text: skip to its end tag.
        if end == b'%' && first_word == Some("raw") {
            at = source[at.min(source.len())..].find("endraw").map_or(bytes.len(), |end| at + end);
        }
    }
    None
}

/// Visits `value` and everything it holds, one fuel an item, refusing nesting past
/// [`MAX_DEPTH`]: run before the engine's own walks (printing, joining, sorting), which do not
/// charge fuel and would otherwise follow a list that holds itself twice, 48 levels over, for
/// ever. Returns the bytes `pprint` would write at most.
fn check_walkable(state: &State<'_, '_>, value: &Value) -> std::result::Result<u64, minijinja::Error> {
    let mut pending: Vec<(Value, usize)> = vec![(value.clone(), 0)];
    let mut printed: u64 = 0;
    while let Some((value, depth)) = pending.pop() {
        state.consume_fuel(1)?;
        if depth > MAX_DEPTH {
            return Err(nested_too_deeply());
        }
        printed = printed.saturating_add(depth as u64 * 4 + 8 + value.as_str().map_or(0, |text| text.len() as u64));
        match value.kind() {
            ValueKind::Seq | ValueKind::Iterable => {
                for item in value.try_iter()? {
                    pending.push((item, depth + 1));
                }
            }
            ValueKind::Map => {
                for key in value.try_iter()? {
                    let item = value.get_item(&key)?;
                    pending.push((key, depth + 1));
                    pending.push((item, depth + 1));
                }
            }
            _ => {}
        }
    }
    Ok(printed)
}

/// The error for a value nested past [`MAX_DEPTH`].
fn nested_too_deeply() -> minijinja::Error {
    Exceeded {
        failure: "nests too deeply",
        message: format!("a value nests past the {MAX_DEPTH} levels nnx allows"),
        remedy: "check the template for a value built inside itself",
    }
    .into_engine()
}

/// The builtin filters that walk a whole value (printing, joining, comparing it), each after
/// [`check_walkable`], and those whose arguments size their result (`format` widths, `indent`),
/// each after checking the size against [`MAX_OUTPUT_BYTES`].
fn add_bounded_filters(environment: &mut Environment<'static>) {
    use minijinja::filters;
    // `{{ value }}` prints a list or a map by recursing through it: checked first, as the
    // filters that walk a value are, so that a value a loop nested a hundred thousand levels
    // deep is refused by name instead of exhausting the stack.
    environment.set_formatter(|out, state, value| {
        if matches!(value.kind(), ValueKind::Seq | ValueKind::Map | ValueKind::Iterable) {
            check_walkable(state, value)?;
        }
        minijinja::escape_formatter(out, state, value)
    });
    environment.add_filter("string", |state: &State<'_, '_>, value: &Value| {
        check_walkable(state, value)?;
        filters::string(state, value)
    });
    environment.add_filter(
        "join",
        |state: &mut State<'_, '_>,
         value: &Value,
         joiner: Option<StringInput<'_>>,
         attribute: Option<&str>,
         kwargs: Kwargs| {
            check_walkable(state, value)?;
            filters::join(state, value, joiner, attribute, kwargs)
        },
    );
    environment.add_filter("pprint", |state: &State<'_, '_>, value: &Value| {
        let printed = check_walkable(state, value)?;
        if printed > MAX_OUTPUT_BYTES as u64 {
            return Err(too_large("`pprint`", printed));
        }
        Ok(filters::pprint(value))
    });
    environment.add_filter("sort", |state: &State<'_, '_>, value: Value, kwargs: Kwargs| {
        check_walkable(state, &value)?;
        filters::sort(state, value, kwargs)
    });
    environment.add_filter("unique", |state: &State<'_, '_>, value: Value, kwargs: Kwargs| {
        check_walkable(state, &value)?;
        filters::unique(state, value, kwargs)
    });
    environment.add_filter("min", |state: &State<'_, '_>, value: Value, kwargs: Kwargs| {
        check_walkable(state, &value)?;
        filters::min(state, value, kwargs)
    });
    environment.add_filter("max", |state: &State<'_, '_>, value: Value, kwargs: Kwargs| {
        check_walkable(state, &value)?;
        filters::max(state, value, kwargs)
    });
    environment.add_filter("format", |state: &mut State<'_, '_>, format: &Value, args: Rest<ValueOrKwargs>| {
        let values: Vec<Value> = args.iter().map(|arg| arg.clone().into_value()).collect();
        check_format(state, format.as_str().unwrap_or_default(), FormatStyle::Printf, &values)?;
        filters::format(state, format, args)
    });
    environment.add_filter(
        "indent",
        |value: StringInput<'_>, width: Option<Value>, first: Option<bool>, blank: Option<bool>, kwargs: Kwargs| {
            // Jinja takes a width or the text to indent with.
            let unit = match &width {
                Some(width) => match width.as_str() {
                    Some(text) => text.len() as u64,
                    None => u64::try_from(width.clone()).unwrap_or(u64::MAX),
                },
                None => 4,
            };
            let text = value.as_str();
            let lines = text.bytes().filter(|&b| b == b'\n').count() as u64 + 1;
            let bytes = unit.saturating_mul(lines).saturating_add(text.len() as u64);
            if bytes > MAX_OUTPUT_BYTES as u64 {
                return Err(too_large("`indent`", bytes));
            }
            let width = match width {
                Some(width) if width.as_str().is_some() => {
                    return Ok(Value::from(indent_with(text, width.as_str().unwrap_or_default(), first, blank)));
                }
                Some(width) => Some(usize::try_from(width)?),
                None => None,
            };
            filters::indent(value, width, first, blank, kwargs)
        },
    );
}

/// Jinja's `indent` with a string: `prefix` before every line but the first (unless
/// `first`), blank lines left alone (unless `blank`).
fn indent_with(text: &str, prefix: &str, first: Option<bool>, blank: Option<bool>) -> String {
    let mut out = String::with_capacity(text.len());
    for (at, line) in text.split('\n').enumerate() {
        if at > 0 {
            out.push('\n');
        }
        if (at > 0 || first == Some(true)) && (blank == Some(true) || !line.trim().is_empty()) {
            out.push_str(prefix);
        }
        out.push_str(line);
    }
    out
}

/// Refuses a `format` whose widths or precisions (printf's `%10.3f`, Python's `{:>10}`, or a
/// `*` taken from the arguments) would make more than [`MAX_OUTPUT_BYTES`], and arguments that
/// [`check_walkable`] refuses (they are printed).
fn check_format(
    state: &State<'_, '_>,
    format: &str,
    style: FormatStyle,
    args: &[Value],
) -> std::result::Result<(), minijinja::Error> {
    for arg in args {
        check_walkable(state, arg)?;
    }
    let bytes = format.as_bytes();
    let mut widest: u64 = 0;
    let mut starred = false;
    let mut at = 0;
    while at < bytes.len() {
        let in_spec = match style {
            FormatStyle::Printf => bytes[at] == b'%',
            FormatStyle::StrFormat => bytes[at] == b'{',
        };
        at += 1;
        if !in_spec {
            continue;
        }
        // The field: up to its conversion letter (printf) or its closing brace.
        while at < bytes.len() {
            let byte = bytes[at];
            if byte.is_ascii_digit() {
                let start = at;
                while at < bytes.len() && bytes[at].is_ascii_digit() {
                    at += 1;
                }
                let number: u64 = format[start..at].parse().unwrap_or(u64::MAX);
                widest = widest.max(number);
                continue;
            }
            starred |= byte == b'*';
            at += 1;
            let done = match style {
                FormatStyle::Printf => byte.is_ascii_alphabetic() || byte == b'%',
                FormatStyle::StrFormat => byte == b'}',
            };
            if done {
                break;
            }
        }
    }
    if starred {
        for arg in args {
            if let Ok(number) = i64::try_from(arg.clone()) {
                widest = widest.max(number.unsigned_abs());
            }
        }
    }
    if widest > MAX_OUTPUT_BYTES as u64 {
        return Err(too_large("a `format` width or precision", widest));
    }
    Ok(())
}

/// Python's string and dict methods (minijinja-contrib's), with the ones whose result can
/// outgrow their input bounded first: `replace` by its result's size, `split` charged for the
/// items it makes, `format` by its widths, `join` by [`check_walkable`].
fn python_method(
    state: &mut State<'_, '_>,
    value: &Value,
    method: &str,
    args: &[Value],
) -> std::result::Result<Value, minijinja::Error> {
    if let Some(text) = value.as_str() {
        match method {
            "replace" => {
                if let (Some(old), Some(new)) =
                    (args.first().and_then(Value::as_str), args.get(1).and_then(Value::as_str))
                {
                    let count = if old.is_empty() { text.chars().count() + 1 } else { text.matches(old).count() };
                    let count = match args.get(2).map(|limit| i64::try_from(limit.clone())) {
                        Some(Ok(limit)) if limit >= 0 => count.min(limit as usize),
                        _ => count,
                    };
                    let bytes = (text.len() as u64)
                        .saturating_add((count as u64).saturating_mul(new.len() as u64))
                        .saturating_sub((count as u64).saturating_mul(old.len() as u64));
                    if bytes > MAX_OUTPUT_BYTES as u64 {
                        return Err(too_large("`str.replace`", bytes));
                    }
                }
            }
            // An item per character at most, each a value of 32 bytes of fuel.
            "split" | "rsplit" | "splitlines" => state.consume_fuel(text.len() as u64 / 2)?,
            "format" => check_format(state, text, FormatStyle::StrFormat, args)?,
            "join" => {
                for arg in args {
                    check_walkable(state, arg)?;
                }
            }
            _ => {}
        }
    }
    minijinja_contrib::pycompat::unknown_method_callback(state, value, method, args)
}

/// transformers' `raise_exception(message)`: fails the render with the template's message
/// (its first [`MAX_MESSAGE_CHARS`] characters).
fn raise_exception(state: &State<'_, '_>, message: Value) -> std::result::Result<Value, minijinja::Error> {
    let message = match message.as_str() {
        Some(text) => text.to_string(),
        None => {
            check_walkable(state, &message)?;
            message.to_string()
        }
    };
    let message = match message.char_indices().nth(MAX_MESSAGE_CHARS) {
        Some((end, _)) => format!("{}...", &message[..end]),
        None => message,
    };
    Err(minijinja::Error::new(ErrorKind::InvalidOperation, message.clone()).with_source(Raised(message)))
}

/// transformers' `tojson`: Python's `json.dumps(value, ensure_ascii=False, indent=None,
/// separators=None, sort_keys=False)`, those parameters taken positionally or by name. Jinja's
/// own filter differs (it escapes `<`, `>`, `&` and `'`, and sorts keys), and so would the
/// models' prompts.
fn tojson(
    state: &State<'_, '_>,
    value: &Value,
    args: Rest<Value>,
    kwargs: Kwargs,
) -> std::result::Result<String, minijinja::Error> {
    const NAMES: [&str; 4] = ["ensure_ascii", "indent", "separators", "sort_keys"];
    if args.len() > NAMES.len() {
        return Err(minijinja::Error::new(ErrorKind::TooManyArguments, "tojson takes at most 4 arguments"));
    }
    let mut options: [Value; 4] = Default::default();
    for (at, name) in NAMES.iter().enumerate() {
        let keyword: Option<Value> = kwargs.get(name)?;
        options[at] = match (args.get(at), keyword) {
            (Some(_), Some(_)) => {
                return Err(minijinja::Error::new(
                    ErrorKind::InvalidOperation,
                    format!("tojson got multiple values for argument '{name}'"),
                ));
            }
            (Some(value), None) => value.clone(),
            (None, Some(value)) => value,
            (None, None) => Value::from(()),
        };
    }
    kwargs.assert_all_used()?;
    let [ensure_ascii, indent, separators, sort_keys] = options;
    let indent = match indent.kind() {
        ValueKind::None | ValueKind::Undefined => None,
        ValueKind::String => Some(indent.as_str().unwrap_or_default().to_string()),
        // Python repeats a space `indent` times (`True` once, a negative number never).
        ValueKind::Bool => Some(" ".repeat(usize::from(indent.is_true()))),
        ValueKind::Number if indent.is_integer() => {
            let width = i64::try_from(indent.clone())?.max(0) as u64;
            if width > MAX_INDENT as u64 {
                return Err(minijinja::Error::new(
                    ErrorKind::InvalidOperation,
                    format!("tojson's indent of {width} is past the {MAX_INDENT} nnx allows"),
                ));
            }
            Some(" ".repeat(width as usize))
        }
        _ => {
            return Err(minijinja::Error::new(
                ErrorKind::InvalidOperation,
                "tojson's indent must be an integer or a string",
            ));
        }
    };
    let (item_separator, key_separator) = match separators.kind() {
        ValueKind::None | ValueKind::Undefined => {
            (if indent.is_some() { "," } else { ", " }.to_string(), ": ".to_string())
        }
        _ => {
            let parts: Vec<Value> = separators.try_iter()?.collect();
            match parts.as_slice() {
                [item, key] if item.as_str().is_some() && key.as_str().is_some() => {
                    (item.as_str().unwrap_or_default().to_string(), key.as_str().unwrap_or_default().to_string())
                }
                _ => {
                    return Err(minijinja::Error::new(
                        ErrorKind::InvalidOperation,
                        "tojson's separators must be two strings (item separator, key separator)",
                    ));
                }
            }
        }
    };
    let dumper = Dumper {
        ensure_ascii: ensure_ascii.is_true(),
        indent,
        item_separator,
        key_separator,
        sort_keys: sort_keys.is_true(),
    };
    let mut out = String::new();
    dumper.value(state, &mut out, value, 0)?;
    Ok(out)
}

/// Python's JSON encoder, over minijinja's values.
struct Dumper {
    ensure_ascii: bool,
    indent: Option<String>,
    item_separator: String,
    key_separator: String,
    sort_keys: bool,
}

/// Nesting past this is refused, as Python refuses it (its recursion limit).
const MAX_DEPTH: usize = 512;

/// The widest `tojson` indent: a wider one only serves to exhaust memory.
const MAX_INDENT: usize = 256;

impl Dumper {
    /// Writes `value` at `depth`, one fuel an item (the engine does not charge a filter's
    /// work, and a list that holds itself twice over is walked item by item), refused once the
    /// text passes [`MAX_OUTPUT_BYTES`].
    fn value(
        &self,
        state: &State<'_, '_>,
        out: &mut String,
        value: &Value,
        depth: usize,
    ) -> std::result::Result<(), minijinja::Error> {
        if depth > MAX_DEPTH {
            return Err(nested_too_deeply());
        }
        state.consume_fuel(1)?;
        if out.len() > MAX_OUTPUT_BYTES {
            return Err(too_large("`tojson`", out.len() as u64));
        }
        match value.kind() {
            ValueKind::None => out.push_str("null"),
            ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
            ValueKind::Number if value.is_integer() => {
                let _ = write!(out, "{value}");
            }
            ValueKind::Number => out.push_str(&python_float(f64::try_from(value.clone())?)),
            ValueKind::String => self.string(out, value.as_str().unwrap_or_default()),
            ValueKind::Seq | ValueKind::Iterable => {
                let items: Vec<Value> = value.try_iter()?.collect();
                self.container(out, '[', ']', items.len(), depth, |out, at| {
                    self.value(state, out, &items[at], depth + 1)
                })?;
            }
            ValueKind::Map => {
                let mut pairs: Vec<(String, Value)> = Vec::new();
                for key in value.try_iter()? {
                    let item = value.get_item(&key)?;
                    pairs.push((json_key(&key)?, item));
                }
                if self.sort_keys {
                    pairs.sort_by(|a, b| a.0.cmp(&b.0));
                }
                self.container(out, '{', '}', pairs.len(), depth, |out, at| {
                    let (key, item) = &pairs[at];
                    self.string(out, key);
                    out.push_str(&self.key_separator);
                    self.value(state, out, item, depth + 1)
                })?;
            }
            kind => {
                return Err(minijinja::Error::new(
                    ErrorKind::InvalidOperation,
                    format!("tojson: a value of type {kind} is not JSON serializable"),
                ));
            }
        }
        Ok(())
    }

    /// `open`, the `count` items written by `item` separated (and indented) as Python does,
    /// `close`.
    fn container(
        &self,
        out: &mut String,
        open: char,
        close: char,
        count: usize,
        depth: usize,
        mut item: impl FnMut(&mut String, usize) -> std::result::Result<(), minijinja::Error>,
    ) -> std::result::Result<(), minijinja::Error> {
        out.push(open);
        if count == 0 {
            out.push(close);
            return Ok(());
        }
        let newline = |out: &mut String, level: usize| {
            if let Some(indent) = &self.indent {
                out.push('\n');
                for _ in 0..level {
                    out.push_str(indent);
                }
            }
        };
        for at in 0..count {
            if at > 0 {
                out.push_str(&self.item_separator);
            }
            newline(out, depth + 1);
            item(out, at)?;
        }
        newline(out, depth);
        out.push(close);
        Ok(())
    }

    /// A JSON string as Python writes it: `"`, `\` and controls escaped, and with
    /// `ensure_ascii` everything past `~` as `\uXXXX` (surrogate pairs past the BMP).
    fn string(&self, out: &mut String, text: &str) {
        out.push('"');
        for c in text.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                '\u{8}' => out.push_str("\\b"),
                '\u{c}' => out.push_str("\\f"),
                c if (c as u32) < 0x20 || (self.ensure_ascii && (c as u32) > 0x7e) => {
                    let mut units = [0u16; 2];
                    for unit in c.encode_utf16(&mut units) {
                        let _ = write!(out, "\\u{unit:04x}");
                    }
                }
                c => out.push(c),
            }
        }
        out.push('"');
    }
}

/// A map key as Python's JSON encoder writes it: strings as they are, numbers, booleans and
/// none as their JSON text.
fn json_key(key: &Value) -> std::result::Result<String, minijinja::Error> {
    Ok(match key.kind() {
        ValueKind::String => key.as_str().unwrap_or_default().to_string(),
        ValueKind::Number if key.is_integer() => key.to_string(),
        ValueKind::Number => python_float(f64::try_from(key.clone())?),
        ValueKind::Bool => (if key.is_true() { "true" } else { "false" }).to_string(),
        ValueKind::None => "null".to_string(),
        kind => {
            return Err(minijinja::Error::new(
                ErrorKind::InvalidOperation,
                format!("tojson: keys must be str, int, float, bool or None, not {kind}"),
            ));
        }
    })
}

/// A float as Python's `repr` writes it (and so `json.dumps`): the shortest digits that read
/// back, positional from 1e-4 to below 1e16, else with an exponent of at least two digits;
/// `NaN` and `Infinity` as Python's JSON writes them.
fn python_float(x: f64) -> String {
    if x.is_nan() {
        return "NaN".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    // Rust's `{:e}` gives the shortest round-trip digits: `d.ddde±x`.
    let scientific = format!("{x:e}");
    let (mantissa, exponent) = scientific.split_once('e').unwrap_or((&scientific, "0"));
    let exponent: i32 = exponent.parse().unwrap_or(0);
    let (sign, mantissa) = mantissa.strip_prefix('-').map_or(("", mantissa), |rest| ("-", rest));
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    if (-4..16).contains(&exponent) {
        let point = exponent + 1;
        let text = if point <= 0 {
            format!("0.{}{digits}", "0".repeat(point.unsigned_abs() as usize))
        } else if point as usize >= digits.len() {
            format!("{digits}{}.0", "0".repeat(point as usize - digits.len()))
        } else {
            format!("{}.{}", &digits[..point as usize], &digits[point as usize..])
        };
        format!("{sign}{text}")
    } else {
        let mantissa = if digits.len() > 1 { format!("{}.{}", &digits[..1], &digits[1..]) } else { digits };
        let exponent_sign = if exponent < 0 { '-' } else { '+' };
        format!("{sign}{mantissa}e{exponent_sign}{:02}", exponent.unsigned_abs())
    }
}

/// transformers' `strftime_now(format)`: the current time formatted as C's `strftime` does,
/// in UTC (transformers uses the machine's local time, which servers usually keep in UTC).
/// The directives of the C locale and glibc's `-` (no padding) are known; others are written
/// as they are, as glibc writes them.
/// A format of over a KiB is refused: each directive can write 24 bytes, and dates are short.
fn strftime_now(format: &str) -> std::result::Result<String, minijinja::Error> {
    const MAX_FORMAT: usize = 1 << 10;
    if format.len() > MAX_FORMAT {
        return Err(too_large("`strftime_now` with a format of over 1 KiB", format.len() as u64 * 12));
    }
    let seconds = SystemTime::now().duration_since(UNIX_EPOCH).map(|elapsed| elapsed.as_secs()).unwrap_or(0);
    Ok(strftime(format, seconds as i64))
}

/// `format` for the UTC time `seconds` after the Unix epoch.
fn strftime(format: &str, seconds: i64) -> String {
    const DAYS: [&str; 7] = ["Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday"];
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    let days = seconds.div_euclid(86_400);
    let in_day = seconds.rem_euclid(86_400);
    let (hour, minute, second) = (in_day / 3600, in_day % 3600 / 60, in_day % 60);
    let (year, month, day) = civil_from_days(days);
    let weekday = (days + 4).rem_euclid(7) as usize;
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    const BEFORE: [i64; 12] = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let yday = BEFORE[month as usize - 1] + day + i64::from(leap && month > 2);
    let hour12 = if hour % 12 == 0 { 12 } else { hour % 12 };
    let mut out = String::new();
    let mut chars = format.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let unpadded = chars.peek() == Some(&'-');
        if unpadded {
            chars.next();
        }
        let number = |out: &mut String, value: i64, width: usize, pad: char| {
            if unpadded {
                let _ = write!(out, "{value}");
            } else if pad == '0' {
                let _ = write!(out, "{value:0width$}");
            } else {
                let _ = write!(out, "{value:>width$}");
            }
        };
        match chars.next() {
            Some('a') => out.push_str(&DAYS[weekday][..3]),
            Some('A') => out.push_str(DAYS[weekday]),
            Some('b' | 'h') => out.push_str(&MONTHS[month as usize - 1][..3]),
            Some('B') => out.push_str(MONTHS[month as usize - 1]),
            Some('d') => number(&mut out, day, 2, '0'),
            Some('e') => number(&mut out, day, 2, ' '),
            Some('m') => number(&mut out, month, 2, '0'),
            Some('y') => number(&mut out, year.rem_euclid(100), 2, '0'),
            Some('Y') => {
                let _ = write!(out, "{year}");
            }
            Some('H') => number(&mut out, hour, 2, '0'),
            Some('I') => number(&mut out, hour12, 2, '0'),
            Some('M') => number(&mut out, minute, 2, '0'),
            Some('S') => number(&mut out, second, 2, '0'),
            Some('j') => number(&mut out, yday, 3, '0'),
            Some('p') => out.push_str(if hour < 12 { "AM" } else { "PM" }),
            Some('u') => number(&mut out, if weekday == 0 { 7 } else { weekday as i64 }, 1, '0'),
            Some('w') => number(&mut out, weekday as i64, 1, '0'),
            Some('F') => out.push_str(&strftime("%Y-%m-%d", seconds)),
            Some('T') => out.push_str(&strftime("%H:%M:%S", seconds)),
            Some('D' | 'x') => out.push_str(&strftime("%m/%d/%y", seconds)),
            Some('X') => out.push_str(&strftime("%H:%M:%S", seconds)),
            Some('R') => out.push_str(&strftime("%H:%M", seconds)),
            Some('c') => out.push_str(&strftime("%a %b %e %H:%M:%S %Y", seconds)),
            Some('Z') => out.push_str("UTC"),
            Some('z') => out.push_str("+0000"),
            Some('s') => {
                let _ = write!(out, "{seconds}");
            }
            Some('n') => out.push('\n'),
            Some('t') => out.push('\t'),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                if unpadded {
                    out.push('-');
                }
                out.push(other);
            }
            None => {
                out.push('%');
                if unpadded {
                    out.push('-');
                }
            }
        }
    }
    out
}

/// The proleptic Gregorian date `days` after 1970-01-01 (Howard Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// `source` with transformers' `{% generation %}` and `{% endgeneration %}` tags (which mark
/// the assistant's tokens for training masks, and render their body) written as an always-true
/// `if`, which renders alike, whitespace control and line numbers included.
fn without_generation_tags(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(at) = rest.find("{%") {
        out.push_str(&rest[..at]);
        let tag = &rest[at..];
        // The closing `%}` comes after the opening `{%` (`{%}` is an opening brace, then `%}`).
        let Some(end) = tag[2..].find("%}").map(|end| end + 2) else { break };
        let inner = &tag[2..end];
        let (open, body) = match inner.strip_prefix(['-', '+']) {
            Some(body) => (&inner[..1], body),
            None => ("", inner),
        };
        let (body, close) = match body.strip_suffix(['-', '+']) {
            Some(body) => (body, &inner[inner.len() - 1..]),
            None => (body, ""),
        };
        let replacement = match body.trim() {
            "generation" => Some("if true"),
            "endgeneration" => Some("endif"),
            _ => None,
        };
        match replacement {
            Some(replacement) => {
                let leading = &body[..body.len() - body.trim_start().len()];
                let trailing = &body[body.trim_end().len()..];
                let _ = write!(out, "{{%{open}{leading}{replacement}{trailing}{close}%}}");
            }
            None => out.push_str(&tag[..end + 2]),
        }
        rest = &tag[end + 2..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_are_written_as_python_writes_them() {
        let cases = [
            (1.0, "1.0"),
            (0.5, "0.5"),
            (-2.25, "-2.25"),
            (100.0, "100.0"),
            (1e15, "1000000000000000.0"),
            (1e16, "1e+16"),
            (1.5e-7, "1.5e-07"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (1e100, "1e+100"),
            (0.1 + 0.2, "0.30000000000000004"),
            (-0.0, "-0.0"),
            (f64::NAN, "NaN"),
            (f64::NEG_INFINITY, "-Infinity"),
        ];
        for (x, python) in cases {
            assert_eq!(python_float(x), python, "{x}");
        }
    }

    #[test]
    fn strftime_follows_c() {
        // 2024-07-26 13:05:09 UTC, a Friday, day 208 of a leap year.
        let t = 1_721_999_109;
        assert_eq!(strftime("%d %b %Y", t), "26 Jul 2024");
        assert_eq!(strftime("%A %B %-d, %y %H:%M:%S %I%p %j %%", t), "Friday July 26, 24 13:05:09 01PM 208 %");
        assert_eq!(strftime("%F %T %e %Q", 0), "1970-01-01 00:00:00  1 %Q");
        assert_eq!(civil_from_days(-1), (1969, 12, 31));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
    }

    #[test]
    fn crowded_tags_are_found_as_the_lexer_reads_tags() {
        let chain = format!("{{{{ 1{} }}}}", "+1".repeat(MAX_TAG_TOKENS));
        assert_eq!(crowded_tag(&format!("line\n{chain}")), Some((2, MAX_TAG_TOKENS)));
        // `}}` inside a dict or a string does not end the tag; the chain after it still counts.
        assert!(crowded_tag(&format!("{{{{ {{'a': {{}}}} ~ '}}}}'{} }}}}", " ~ 1".repeat(MAX_TAG_TOKENS))).is_some());
        // Comments and raw blocks are text, however many tokens they would hold.
        let many = "x ".repeat(MAX_TAG_TOKENS + 1);
        assert_eq!(crowded_tag(&format!("{{# {many} #}}{{% raw %}}{{{{ {many} }}}}{{% endraw %}}ok")), None);
        assert_eq!(crowded_tag(&format!("{{{{ {} }}}}", "1 + ".repeat(MAX_TAG_TOKENS / 2 - 1) + "1")), None);
    }

    #[test]
    fn format_widths_are_read_before_formatting() {
        let environment = Environment::new();
        let template = environment.template_from_str("").unwrap();
        let state = template.new_state();
        let check = |format: &str, style, args: &[Value]| check_format(&state, format, style, args).is_ok();
        assert!(check("%5d %-10.3f %%", FormatStyle::Printf, &[Value::from(1), Value::from(2.5)]));
        assert!(!check("%999999999d", FormatStyle::Printf, &[Value::from(1)]));
        assert!(!check("%*d", FormatStyle::Printf, &[Value::from(999_999_999), Value::from(1)]));
        assert!(check("{} {:>10} {0}", FormatStyle::StrFormat, &[Value::from(1)]));
        assert!(!check("{:.999999999}", FormatStyle::StrFormat, &[Value::from(1.5)]));
        // Numbers in the text around the fields are text.
        assert!(check("in 999999999 years: {}", FormatStyle::StrFormat, &[Value::from(1)]));
    }

    #[test]
    fn raised_messages_are_shortened() {
        let template = ChatTemplate::new("{{ raise_exception('x' * 100000) }}", "", "").unwrap();
        let error = template.render(&[], false).unwrap_err();
        let Error::Template { failure, message, .. } = error else { panic!("{error:?}") };
        assert_eq!(failure, "refused the conversation");
        assert_eq!(message.len(), MAX_MESSAGE_CHARS + 3);
    }

    #[test]
    fn generation_tags_become_ifs() {
        assert_eq!(
            without_generation_tags(
                "a{% generation %}b{%- endgeneration -%}c{% if x %}{% endif %}{%generation%}{%+endgeneration+%}"
            ),
            "a{% if true %}b{%- endif -%}c{% if x %}{% endif %}{%if true%}{%+endif+%}"
        );
        // `{%}` opens a tag and its `%}` is not that tag's end.
        assert_eq!(without_generation_tags("{%}{% generation %}x"), "{%}{% generation %}x");
        assert_eq!(without_generation_tags("{%}"), "{%}");
        assert!(ChatTemplate::new("{%}{{ 1 }}", "", "").is_err());
    }
}
