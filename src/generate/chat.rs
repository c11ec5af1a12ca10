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
use std::time::{SystemTime, UNIX_EPOCH};

use minijinja::value::{Kwargs, Rest, Serde, Value, ValueKind};
use minijinja::{Environment, ErrorKind};
use serde::Serialize;

use crate::gguf::Metadata;
use crate::{Error, Result};

/// The instructions one render may run: far more than any published template needs for a long
/// conversation, and a bound on a hostile one (templates come from model files).
const FUEL: u64 = 50_000_000;

/// The name a template is compiled under: the environment holds one.
const NAME: &str = "chat_template";

/// Markers that end a model's turn, as templates emit them after each message; the
/// generation should stop on the ones its template uses (besides the end-of-sequence token).
const END_OF_TURN: &[&str] = &[
    "<|eot_id|>",
    "<|eom_id|>",
    "<|im_end|>",
    "<end_of_turn>",
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
    environment: Environment<'static>,
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
    /// [`Error::Template`] naming the line of a syntax error.
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
        let origin = format!("`{}`", config_path.display());
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

    /// Sets up transformers' environment and compiles `source` in it.
    fn compile(origin: &str, source: &str, bos_token: &str, eos_token: &str) -> Result<ChatTemplate> {
        let mut environment = Environment::new();
        let syntax = minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|error| template_error(origin, &error))?;
        environment.set_syntax(syntax);
        environment.set_fuel(Some(FUEL));
        environment.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        environment.add_function("raise_exception", raise_exception);
        environment.add_function("strftime_now", strftime_now);
        environment.add_filter("tojson", tojson);
        environment
            .add_template_owned(NAME, without_generation_tags(source))
            .map_err(|error| template_error(origin, &error))?;
        Ok(ChatTemplate {
            environment,
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
    /// fails, with the line.
    pub fn render(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String> {
        let mut context: Vec<(&str, Value)> = vec![
            ("messages", Value::from(Serde(messages))),
            ("add_generation_prompt", Value::from(add_generation_prompt)),
            ("tools", Value::from(())),
            ("documents", Value::from(())),
        ];
        // transformers passes the tokens its tokenizer has; a missing one stays undefined.
        for (name, token) in [("bos_token", &self.bos_token), ("eos_token", &self.eos_token)] {
            if !token.is_empty() {
                context.push((name, Value::from(token.as_str())));
            }
        }
        let context = Value::from_pairs(context);
        let template = self.environment.get_template(NAME).map_err(|error| template_error(&self.origin, &error))?;
        template.render(context).map_err(|error| template_error(&self.origin, &error))
    }

    /// The texts that end the assistant's turn: the end-of-sequence token, then each
    /// end-of-turn marker the template emits (`<|eot_id|>`, `<|im_end|>`, `<end_of_turn>`, ...),
    /// for [`GenerationConfig::stop_strings`](crate::generate::GenerationConfig::stop_strings)
    /// when the model's end-of-sequence ids miss them.
    pub fn stop_strings(&self) -> Vec<String> {
        let mut stops: Vec<String> = Vec::new();
        let candidates = std::iter::once(self.eos_token.as_str())
            .chain(END_OF_TURN.iter().copied().filter(|marker| self.source.contains(marker)));
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
    let raised = std::iter::from_fn(|| {
        let current = source?;
        source = current.source();
        Some(current)
    })
    .find_map(|error| error.downcast_ref::<Raised>());
    let (failure, message, remedy) = if let Some(Raised(message)) = raised {
        (
            "refused the conversation",
            message.clone(),
            "change the messages as the template's message asks (roles, order, content)",
        )
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
                format!("{message} after {FUEL} instructions"),
                "shorten the conversation, or check the template for a runaway loop",
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

/// transformers' `raise_exception(message)`: fails the render with the template's message.
fn raise_exception(message: String) -> std::result::Result<Value, minijinja::Error> {
    Err(minijinja::Error::new(ErrorKind::InvalidOperation, message.clone()).with_source(Raised(message)))
}

/// transformers' `tojson`: Python's `json.dumps(value, ensure_ascii=False, indent=None,
/// separators=None, sort_keys=False)`, those parameters taken positionally or by name. Jinja's
/// own filter differs (it escapes `<`, `>`, `&` and `'`, and sorts keys), and so would the
/// models' prompts.
fn tojson(value: &Value, args: Rest<Value>, kwargs: Kwargs) -> std::result::Result<String, minijinja::Error> {
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
    dumper.value(&mut out, value, 0)?;
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
    fn value(&self, out: &mut String, value: &Value, depth: usize) -> std::result::Result<(), minijinja::Error> {
        if depth > MAX_DEPTH {
            return Err(minijinja::Error::new(ErrorKind::InvalidOperation, "tojson: the value nests too deeply"));
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
                self.container(out, '[', ']', items.len(), depth, |out, at| self.value(out, &items[at], depth + 1))?;
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
                    self.value(out, item, depth + 1)
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
fn strftime_now(format: String) -> String {
    let seconds = SystemTime::now().duration_since(UNIX_EPOCH).map(|elapsed| elapsed.as_secs()).unwrap_or(0);
    strftime(&format, seconds as i64)
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
        let Some(end) = tag.find("%}") else { break };
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
    fn generation_tags_become_ifs() {
        assert_eq!(
            without_generation_tags(
                "a{% generation %}b{%- endgeneration -%}c{% if x %}{% endif %}{%generation%}{%+endgeneration+%}"
            ),
            "a{% if true %}b{%- endif -%}c{% if x %}{% endif %}{%if true%}{%+endif+%}"
        );
    }
}
