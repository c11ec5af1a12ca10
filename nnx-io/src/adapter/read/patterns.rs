//! PEFT's `rank_pattern` and `alpha_pattern`: each key matched against module paths as PEFT
//! matches it, plain paths without a regex engine and the rest compiled once within bounds.

use std::path::Path;

use serde_json::Value;

use super::{describe, shown, whole_rank};
use crate::adapter::report::problem;
use crate::error::Result;

/// The most bytes one `rank_pattern` or `alpha_pattern` key may compile to (and its matcher's
/// cache take): module patterns are short, and a key that repeats groups into megabytes is a
/// hostile config, which compiled once per module used to take minutes.
const PATTERN_BYTES: usize = 1 << 18;

/// How deeply a pattern key may nest groups and repetitions.
const PATTERN_NESTING: u32 = 32;

/// The most keys of one pattern map compiled as regular expressions (plain module paths, the
/// usual keys, are matched without compiling anything).
const PATTERN_REGEXES: usize = 256;

/// One key of PEFT's `rank_pattern` or `alpha_pattern`, matched as PEFT matches it: the key is
/// a regular expression for the module's whole path or its last dotted parts,
/// `^(.*\.)?(key)$`.
enum PatternKey {
    /// A key of plain characters, `.` (any character but a newline, `None`) and escaped
    /// punctuation (`model.layers.0.mlp.down_proj`, `model\.layers\.0\.q_proj`, `down_proj`):
    /// it matches a fixed number of characters at the end, so no regex engine is needed.
    Plain(Vec<Option<char>>),
    /// Any other regular expression, compiled once within [`PATTERN_BYTES`].
    Regex(regex::Regex),
}

impl PatternKey {
    /// The key as a [`PatternKey::Plain`], when it is one.
    fn plain(key: &str) -> Option<Vec<Option<char>>> {
        let mut pattern = Vec::new();
        let mut chars = key.chars();
        while let Some(c) = chars.next() {
            match c {
                '.' => pattern.push(None),
                // `\<` and `\>` are word boundaries, not characters.
                '\\' => match chars.next() {
                    Some(escaped) if escaped.is_ascii_punctuation() && !matches!(escaped, '<' | '>') => {
                        pattern.push(Some(escaped));
                    }
                    _ => return None,
                },
                c if c.is_alphanumeric() || c == '_' || c == '-' => pattern.push(Some(c)),
                _ => return None,
            }
        }
        Some(pattern)
    }

    fn matches(&self, module: &str) -> bool {
        match self {
            PatternKey::Regex(regex) => regex.is_match(module),
            PatternKey::Plain(pattern) => {
                let chars: Vec<char> = module.chars().collect();
                let Some(start) = chars.len().checked_sub(pattern.len()) else { return false };
                let tail = pattern
                    .iter()
                    .zip(&chars[start..])
                    .all(|(want, &found)| want.map_or(found != '\n', |want| want == found));
                // Before the key: nothing, or `.*\.` (a dot, and no newline before it).
                tail && (start == 0 || (chars[start - 1] == '.' && !chars[..start - 1].contains(&'\n')))
            }
        }
    }
}

/// PEFT's per-module `rank_pattern` or `alpha_pattern`: each key compiled once, with its value;
/// the first key (in the config's order) that matches a module gives its value.
pub(super) struct Patterns {
    keys: Vec<(PatternKey, f64)>,
}

impl Patterns {
    /// The map `field` of the config at `path` (none when absent). `rank_pattern` values are
    /// ranks (whole numbers of at least 1), `alpha_pattern` values finite numbers.
    ///
    /// # Errors
    /// [`Error::Adapter`](crate::Error::Adapter) naming the config and `field` for a value of
    /// another kind, a key that is not a regular expression or compiles past
    /// [`PATTERN_BYTES`], and more than [`PATTERN_REGEXES`] keys that need compiling.
    pub(super) fn read(path: &Path, config: &Value, field: &str) -> Result<Patterns> {
        let entries = match config.get(field) {
            None | Some(Value::Null) => return Ok(Patterns { keys: Vec::new() }),
            Some(Value::Object(entries)) => entries,
            Some(other) => {
                let found = describe(other);
                return Err(problem(
                    path,
                    field,
                    &format!("is {found}, expected an object of module patterns and values"),
                ));
            }
        };
        let mut regexes = 0;
        let mut keys = Vec::with_capacity(entries.len());
        for (key, value) in entries {
            let number = match field {
                "rank_pattern" => whole_rank(value).map(|rank| rank as f64),
                _ => value.as_f64().filter(|alpha| alpha.is_finite()),
            };
            let Some(number) = number else {
                let expected = if field == "rank_pattern" { "a whole number of at least 1" } else { "a finite number" };
                return Err(problem(
                    path,
                    field,
                    &format!("gives key `{}` {}, expected {expected}", shown(key), describe(value)),
                ));
            };
            if let Some(pattern) = PatternKey::plain(key) {
                keys.push((PatternKey::Plain(pattern), number));
                continue;
            }
            regexes += 1;
            if regexes > PATTERN_REGEXES {
                return Err(problem(
                    path,
                    field,
                    &format!(
                        "has more than {PATTERN_REGEXES} keys that are regular expressions: name the modules by their paths, or merge keys into fewer expressions"
                    ),
                ));
            }
            let regex = regex::RegexBuilder::new(&format!(r"^(.*\.)?({key})$"))
                .size_limit(PATTERN_BYTES)
                .dfa_size_limit(PATTERN_BYTES)
                .nest_limit(PATTERN_NESTING)
                .build()
                .map_err(|error| {
                    let why = match error {
                        regex::Error::CompiledTooBig(limit) => format!("it compiles to more than {limit} bytes"),
                        // A syntax error's last line says what is wrong, after a picture of
                        // where; one line is kept.
                        other => {
                            let text = other.to_string();
                            let last = text.lines().next_back().unwrap_or_default();
                            shown(last.trim().trim_start_matches("error: "))
                        }
                    };
                    problem(
                        path,
                        field,
                        &format!(
                            "key `{}` is not a usable regular expression ({why}): give the module's path, or a short expression of at most {PATTERN_NESTING} nested groups",
                            shown(key)
                        ),
                    )
                })?;
            keys.push((PatternKey::Regex(regex), number));
        }
        Ok(Patterns { keys })
    }

    /// The value of the first key that matches `module`.
    pub(super) fn value(&self, module: &str) -> Option<f64> {
        self.keys.iter().find(|(key, _)| key.matches(module)).map(|&(_, value)| value)
    }
}
