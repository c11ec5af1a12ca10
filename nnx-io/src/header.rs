//! Parsing and validating a SafeTensors header in one pass over its JSON: entry order kept,
//! duplicate and empty names caught, every offset checked with checked arithmetic, and no
//! allocation sized by what the file claims.

use std::collections::{BTreeMap, HashSet};
use std::fmt;

use nnx_core::DType;

pub use crate::error::HeaderProblem;
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, Visitor};

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
        let mut fail = |problem: HeaderProblem| {
            *self.problem = Some(problem);
            de::Error::custom("invalid header")
        };
        while let Some(name) = map.next_key::<String>()? {
            if !seen.insert(name.clone()) {
                return Err(fail(HeaderProblem::DuplicateName { name }));
            }
            if name == "__metadata__" {
                let value: serde_json::Value = map.next_value()?;
                match value {
                    serde_json::Value::Null => {}
                    serde_json::Value::Object(object) => {
                        for (key, value) in object {
                            match value {
                                serde_json::Value::String(text) => {
                                    metadata.insert(key, text);
                                }
                                other => {
                                    return Err(fail(HeaderProblem::BadMetadata {
                                        key: Some(key),
                                        found: json_kind(&other).into(),
                                    }));
                                }
                            }
                        }
                    }
                    other => {
                        return Err(fail(HeaderProblem::BadMetadata { key: None, found: json_kind(&other).into() }));
                    }
                }
                continue;
            }
            if name.is_empty() {
                return Err(fail(HeaderProblem::EmptyName));
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

fn json_kind(value: &serde_json::Value) -> &'static str {
    match value {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
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
