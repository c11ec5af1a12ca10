//! Parsing and validating a SafeTensors header in one pass over its JSON: entry order kept,
//! duplicate and empty names caught, every offset checked with checked arithmetic, and no
//! allocation sized by what the file claims.

use std::collections::{BTreeMap, HashSet};
use std::fmt;

use nnx_core::DType;

pub use crate::error::HeaderProblem;
use serde::Deserialize;
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, Visitor};

use crate::budget::TextBudget;

/// The largest header accepted, as in the reference implementation.
pub const MAX_HEADER_BYTES: u64 = 100_000_000;

/// One tensor entry of a header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderEntry {
    /// The entry's name.
    pub name: String,
    /// Its dtype.
    pub dtype: DType,
    /// Its shape.
    pub shape: Vec<usize>,
    /// First byte, relative to the start of the data section.
    pub begin: usize,
    /// One past the last byte, relative to the start of the data section.
    pub end: usize,
}

/// A parsed, validated header.
#[derive(Debug, Clone, Default)]
pub struct Header {
    /// Offset of the data section in the file (8 + header length).
    pub data_start: usize,
    /// Entries in the order the header lists them.
    pub entries: Vec<HeaderEntry>,
    /// `__metadata__` (empty when absent or `null`).
    pub metadata: BTreeMap<String, String>,
}

/// An entry as written in the JSON, before validation.
#[derive(serde::Deserialize)]
struct RawEntry {
    dtype: String,
    shape: Vec<u64>,
    data_offsets: [u64; 2],
}

/// Collects the top-level object in order; a problem found on the way is parked in `problem`
/// so that it survives serde's string errors with its structure.
struct HeaderVisitor<'a> {
    problem: &'a mut Option<HeaderProblem>,
    current: &'a mut Option<String>,
}

type RawHeader = (Vec<(String, RawEntry)>, BTreeMap<String, String>);

impl<'de> Visitor<'de> for HeaderVisitor<'_> {
    type Value = RawHeader;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object of entries")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawHeader, A::Error> {
        let mut entries = Vec::new();
        let mut metadata = BTreeMap::new();
        let mut seen = HashSet::new();
        fn fail<E: de::Error>(slot: &mut Option<HeaderProblem>, problem: HeaderProblem) -> E {
            *slot = Some(problem);
            E::custom("invalid header")
        }
        while let Some(name) = map.next_key::<String>()? {
            if !seen.insert(name.clone()) {
                return Err(fail(self.problem, HeaderProblem::DuplicateName { name }));
            }
            if name == "__metadata__" {
                metadata = map.next_value_seed(MetadataSeed { problem: &mut *self.problem })?;
                continue;
            }
            if name.is_empty() {
                return Err(fail(self.problem, HeaderProblem::EmptyName));
            }
            *self.current = Some(name.clone());
            let entry: RawEntry = map.next_value()?;
            *self.current = None;
            entries.push((name, entry));
        }
        Ok((entries, metadata))
    }
}

impl<'de> DeserializeSeed<'de> for HeaderVisitor<'_> {
    type Value = RawHeader;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<RawHeader, D::Error> {
        deserializer.deserialize_map(self)
    }
}

/// Reads `__metadata__`: `null`, or an object whose values are all strings. Nothing but the
/// strings kept is built: a value of another kind is skipped unread (its kind kept for the
/// message), so a huge array costs no memory, and the text kept is counted against
/// [`MAX_METADATA_BYTES`](crate::budget::MAX_METADATA_BYTES).
struct MetadataSeed<'a> {
    problem: &'a mut Option<HeaderProblem>,
}

impl<'de> DeserializeSeed<'de> for MetadataSeed<'_> {
    type Value = BTreeMap<String, String>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl MetadataSeed<'_> {
    fn refuse<E: de::Error>(self, key: Option<String>, found: JsonKind) -> E {
        *self.problem = Some(HeaderProblem::BadMetadata { key, found: found.0.into() });
        E::custom("invalid metadata")
    }
}

impl<'de> Visitor<'de> for MetadataSeed<'_> {
    type Value = BTreeMap<String, String>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object of strings")
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(BTreeMap::new())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut metadata = BTreeMap::new();
        let mut budget = TextBudget::new();
        while let Some(key) = map.next_key::<String>()? {
            match map.next_value::<StringOrKind>()? {
                StringOrKind::String(text) => {
                    if let Err(asked) = budget.take_entry(key.len() + text.len()) {
                        *self.problem = Some(HeaderProblem::MetadataTooLarge { key, asked, limit: budget.limit });
                        return Err(de::Error::custom("metadata too large"));
                    }
                    metadata.insert(key, text);
                }
                StringOrKind::Other(found) => return Err(self.refuse(Some(key), found)),
            }
        }
        Ok(metadata)
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
        Err(self.refuse(None, JsonKind::BOOL))
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
        Err(self.refuse(None, JsonKind::NUMBER))
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
        Err(self.refuse(None, JsonKind::NUMBER))
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
        Err(self.refuse(None, JsonKind::NUMBER))
    }

    fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
        Err(self.refuse(None, JsonKind::STRING))
    }

    fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        // Skipped rather than read, so that the refusal costs no memory.
        while seq.next_element::<de::IgnoredAny>()?.is_some() {}
        Err(self.refuse(None, JsonKind::ARRAY))
    }
}

/// What kind of JSON value was found, for messages.
#[derive(Clone, Copy)]
pub(crate) struct JsonKind(pub(crate) &'static str);

impl JsonKind {
    const BOOL: JsonKind = JsonKind("a boolean");
    const NUMBER: JsonKind = JsonKind("a number");
    const STRING: JsonKind = JsonKind("a string");
    const ARRAY: JsonKind = JsonKind("an array");
    const OBJECT: JsonKind = JsonKind("an object");
    const NULL: JsonKind = JsonKind("null");
}

/// A JSON string, or the kind of any other value, which is skipped without being built.
pub(crate) enum StringOrKind {
    String(String),
    Other(JsonKind),
}

impl<'de> Deserialize<'de> for StringOrKind {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Kind;
        impl<'de> Visitor<'de> for Kind {
            type Value = StringOrKind;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any JSON value")
            }

            fn visit_unit<E: de::Error>(self) -> Result<StringOrKind, E> {
                Ok(StringOrKind::Other(JsonKind::NULL))
            }

            fn visit_bool<E: de::Error>(self, _: bool) -> Result<StringOrKind, E> {
                Ok(StringOrKind::Other(JsonKind::BOOL))
            }

            fn visit_i64<E: de::Error>(self, _: i64) -> Result<StringOrKind, E> {
                Ok(StringOrKind::Other(JsonKind::NUMBER))
            }

            fn visit_u64<E: de::Error>(self, _: u64) -> Result<StringOrKind, E> {
                Ok(StringOrKind::Other(JsonKind::NUMBER))
            }

            fn visit_f64<E: de::Error>(self, _: f64) -> Result<StringOrKind, E> {
                Ok(StringOrKind::Other(JsonKind::NUMBER))
            }

            fn visit_str<E: de::Error>(self, text: &str) -> Result<StringOrKind, E> {
                Ok(StringOrKind::String(text.to_string()))
            }

            fn visit_string<E: de::Error>(self, text: String) -> Result<StringOrKind, E> {
                Ok(StringOrKind::String(text))
            }

            fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<StringOrKind, A::Error> {
                while seq.next_element::<de::IgnoredAny>()?.is_some() {}
                Ok(StringOrKind::Other(JsonKind::ARRAY))
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<StringOrKind, A::Error> {
                while map.next_entry::<de::IgnoredAny, de::IgnoredAny>()?.is_some() {}
                Ok(StringOrKind::Other(JsonKind::OBJECT))
            }
        }
        deserializer.deserialize_any(Kind)
    }
}

/// Parses and validates the header at the start of `file`, a whole SafeTensors file.
///
/// # Errors
/// The first [`HeaderProblem`] found; nothing is allocated from the file's claimed sizes.
pub fn parse(file: &[u8]) -> Result<Header, HeaderProblem> {
    parse_prefix(file, file.len())
}

/// The header length a file declares in its first 8 bytes, checked against the limit and the
/// file's length: what a remote reader fetches next.
///
/// # Errors
/// [`HeaderProblem::TooLarge`] or [`HeaderProblem::PastEnd`].
#[cfg_attr(not(feature = "remote"), allow(dead_code))]
pub(crate) fn declared_len(first: [u8; 8], file_len: usize) -> Result<usize, HeaderProblem> {
    let declared = u64::from_le_bytes(first);
    if declared > MAX_HEADER_BYTES {
        return Err(HeaderProblem::TooLarge { declared, limit: MAX_HEADER_BYTES });
    }
    if 8 + declared > file_len as u64 {
        return Err(HeaderProblem::PastEnd { declared, file_len });
    }
    Ok(declared as usize)
}

/// [`parse`] for the first bytes of a file of `file_len` bytes (at least the length and the
/// header, as a remote reader fetches them).
pub(crate) fn parse_prefix(file: &[u8], file_len: usize) -> Result<Header, HeaderProblem> {
    if file.is_empty() {
        return Err(HeaderProblem::Empty);
    }
    let Some(prefix) = file.first_chunk::<8>() else {
        return Err(HeaderProblem::TooShort { len: file.len() });
    };
    let declared = u64::from_le_bytes(*prefix);
    if declared > MAX_HEADER_BYTES {
        return Err(HeaderProblem::TooLarge { declared, limit: MAX_HEADER_BYTES });
    }
    let data_start = 8 + declared as usize;
    let Some(text) = file.get(8..data_start) else {
        return Err(HeaderProblem::PastEnd { declared, file_len });
    };
    let text = std::str::from_utf8(text).map_err(|error| HeaderProblem::InvalidUtf8 { at: error.valid_up_to() })?;
    let mut problem = None;
    let mut current = None;
    let mut deserializer = serde_json::Deserializer::from_str(text);
    let parsed = HeaderVisitor { problem: &mut problem, current: &mut current }
        .deserialize(&mut deserializer)
        .and_then(|raw| deserializer.end().map(|()| raw));
    let (raw, metadata) = match parsed {
        Ok(raw) => raw,
        Err(error) => {
            return Err(match (problem, current) {
                (Some(problem), _) => problem,
                (None, Some(name)) => HeaderProblem::BadEntry { name, message: error.to_string() },
                (None, None) => HeaderProblem::InvalidJson { message: error.to_string() },
            });
        }
    };
    let mut entries = Vec::with_capacity(raw.len());
    for (name, entry) in raw {
        entries.push(validate_entry(name, entry)?);
    }
    check_coverage(&entries, data_start, file_len)?;
    Ok(Header { data_start, entries, metadata })
}

fn validate_entry(name: String, raw: RawEntry) -> Result<HeaderEntry, HeaderProblem> {
    let Ok(dtype) = raw.dtype.parse::<DType>() else {
        return Err(HeaderProblem::UnknownDType { name, dtype: raw.dtype });
    };
    // Lowercase spellings are ours to accept in code, not in files.
    if dtype.as_str() != raw.dtype {
        return Err(HeaderProblem::UnknownDType { name, dtype: raw.dtype });
    }
    let count = raw.shape.iter().try_fold(1u64, |acc, &size| acc.checked_mul(size));
    let bytes = count.and_then(|count| count.checked_mul(dtype.bits() as u64));
    let shape: Option<Vec<usize>> = raw.shape.iter().map(|&size| usize::try_from(size).ok()).collect();
    let (Some(bytes), Some(shape)) = (bytes.filter(|&bits| bits / 8 <= isize::MAX as u64), shape) else {
        return Err(HeaderProblem::Overflow { name, shape: raw.shape });
    };
    if bytes % 8 != 0 {
        return Err(HeaderProblem::PartialByte { name, dtype, shape });
    }
    let expected = bytes / 8;
    let [begin, end] = raw.data_offsets;
    if end < begin {
        return Err(HeaderProblem::Reversed { name, begin, end });
    }
    if end - begin != expected {
        return Err(HeaderProblem::ByteLength { name, dtype, shape, expected, found: end - begin });
    }
    let (Ok(begin), Ok(end)) = (usize::try_from(begin), usize::try_from(end)) else {
        return Err(HeaderProblem::Overflow { name, shape: raw.shape });
    };
    Ok(HeaderEntry { name, dtype, shape, begin, end })
}

/// The entries, sorted by offset, must tile the data section exactly: no hole, no overlap,
/// nothing past the end of the file and nothing after the last entry.
fn check_coverage(entries: &[HeaderEntry], data_start: usize, file_len: usize) -> Result<(), HeaderProblem> {
    let mut order: Vec<usize> = (0..entries.len()).collect();
    order.sort_by_key(|&at| (entries[at].begin, entries[at].end));
    let mut cursor = 0usize;
    let mut previous: Option<&HeaderEntry> = None;
    for &at in &order {
        let entry = &entries[at];
        if entry.begin > cursor {
            return Err(HeaderProblem::Hole { name: entry.name.clone(), expected: cursor, found: entry.begin });
        }
        if entry.begin < cursor {
            let other = previous.map(|p| p.name.clone()).unwrap_or_default();
            return Err(HeaderProblem::Overlap { name: entry.name.clone(), other });
        }
        let file_end = data_start as u64 + entry.end as u64;
        if file_end > file_len as u64 {
            return Err(HeaderProblem::DataPastEnd { name: entry.name.clone(), end: file_end, file_len });
        }
        cursor = entry.end;
        previous = Some(entry);
    }
    let trailing = file_len - data_start - cursor;
    if trailing > 0 {
        return Err(HeaderProblem::Trailing { bytes: trailing });
    }
    Ok(())
}
