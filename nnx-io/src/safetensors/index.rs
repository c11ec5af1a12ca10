//! Sharded checkpoints: reading `model.safetensors.index.json` (each shard opened only when
//! one of its entries is needed) and checking shards against it.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, Visitor};

use super::mapped::MappedFile;
use crate::budget::TextBudget;
use crate::error::{Error, IndexProblem, Result, ShardProblem};
use crate::source::{Source, Store};

/// A parsed shard index.
pub(crate) struct ShardIndex {
    pub(crate) path: PathBuf,
    /// `metadata`, every value as a string, except `total_size`: it describes the index's own
    /// shards and is written anew whenever shards are.
    pub(crate) metadata: BTreeMap<String, String>,
    /// Entry name -> shard number, in the index's order.
    pub(crate) weight_map: Vec<(String, usize)>,
    /// Shard number -> name.
    lookup: HashMap<String, usize>,
    /// Shard paths, in order of first mention.
    pub(crate) shards: Vec<PathBuf>,
}

/// The largest shard index read: an index lists names and file names only, a few megabytes for
/// the largest models; anything far past that is damaged or hostile.
pub const MAX_INDEX_BYTES: u64 = 64 << 20;

/// Parks `problem` where the caller finds it, and gives serde an error to unwind with.
fn park<E: de::Error>(slot: &mut Option<IndexProblem>, problem: IndexProblem) -> E {
    *slot = Some(problem);
    E::custom("invalid shard index")
}

/// `weight_map` read in order, straight into what the index keeps: a name listed twice is
/// refused, shard file names are numbered as they first appear, and the names are counted
/// against [`MAX_METADATA_BYTES`](crate::budget::MAX_METADATA_BYTES) so that millions of tiny entries cannot exhaust memory.
struct WeightMap {
    /// Entry name -> shard number, in order.
    pairs: Vec<(String, usize)>,
    lookup: HashMap<String, usize>,
    /// Shard file names, in order of first mention.
    shards: Vec<String>,
    /// The first entry whose shard is not a plain file name, reported once the map is read.
    bad_shard: Option<(String, String)>,
}

struct WeightMapSeed<'a> {
    problem: &'a mut Option<IndexProblem>,
}

impl<'de> Visitor<'de> for WeightMapSeed<'_> {
    type Value = WeightMap;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object mapping entry names to shard file names")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<WeightMap, A::Error> {
        let mut budget = TextBudget::new();
        let mut numbers: HashMap<String, usize> = HashMap::new();
        let mut found = WeightMap { pairs: Vec::new(), lookup: HashMap::new(), shards: Vec::new(), bad_shard: None };
        while let Some((name, shard)) = map.next_entry::<String, String>()? {
            if let Err(asked) = budget.take_entry(name.len()) {
                let problem = IndexProblem::TooLarge { field: "weight_map", key: name, asked, limit: budget.limit };
                return Err(park(self.problem, problem));
            }
            if found.bad_shard.is_none()
                && (shard.is_empty() || shard.contains('/') || shard.contains('\\') || shard == "..")
            {
                found.bad_shard = Some((name.clone(), shard.clone()));
            }
            let number = match numbers.get(&shard) {
                Some(&number) => number,
                None => {
                    found.shards.push(shard.clone());
                    numbers.insert(shard, found.shards.len() - 1);
                    found.shards.len() - 1
                }
            };
            if found.lookup.insert(name.clone(), number).is_some() {
                return Err(park(self.problem, IndexProblem::DuplicateName { name }));
            }
            found.pairs.push((name, number));
        }
        Ok(found)
    }
}

impl<'de> DeserializeSeed<'de> for WeightMapSeed<'_> {
    type Value = WeightMap;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<WeightMap, D::Error> {
        deserializer.deserialize_map(self)
    }
}

/// `metadata`: `null`, or an object whose values are kept as text (a string as it is, any other
/// value as compact JSON), counted against [`MAX_METADATA_BYTES`](crate::budget::MAX_METADATA_BYTES) as they are written.
struct MetadataSeed<'a> {
    problem: &'a mut Option<IndexProblem>,
}

impl<'de> Visitor<'de> for MetadataSeed<'_> {
    type Value = BTreeMap<String, String>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object")
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(BTreeMap::new())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut metadata = BTreeMap::new();
        let mut budget = TextBudget::new();
        while let Some(key) = map.next_key::<String>()? {
            // `total_size` describes the index's own shards and is written anew with them.
            if key == "total_size" {
                map.next_value::<de::IgnoredAny>()?;
                continue;
            }
            let room = budget.room().saturating_sub(key.len());
            let mut text = String::new();
            let written = map.next_value_seed(CompactJson { out: &mut text, room, top: true });
            if written.is_err() && text.len() > room {
                let asked = budget.asked(key.len() + text.len());
                let problem = IndexProblem::TooLarge { field: "metadata", key, asked, limit: budget.limit };
                return Err(park(self.problem, problem));
            }
            written?;
            if let Err(asked) = budget.take_entry(key.len() + text.len()) {
                let problem = IndexProblem::TooLarge { field: "metadata", key, asked, limit: budget.limit };
                return Err(park(self.problem, problem));
            }
            metadata.insert(key, text);
        }
        Ok(metadata)
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
        Err(park(self.problem, IndexProblem::MetadataNotObject))
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
        Err(park(self.problem, IndexProblem::MetadataNotObject))
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
        Err(park(self.problem, IndexProblem::MetadataNotObject))
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
        Err(park(self.problem, IndexProblem::MetadataNotObject))
    }

    fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
        Err(park(self.problem, IndexProblem::MetadataNotObject))
    }

    fn visit_seq<A: de::SeqAccess<'de>>(self, _: A) -> Result<Self::Value, A::Error> {
        Err(park(self.problem, IndexProblem::MetadataNotObject))
    }
}

impl<'de> DeserializeSeed<'de> for MetadataSeed<'_> {
    type Value = BTreeMap<String, String>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

/// Writes a JSON value as compact text into `out` as it is read, without building it: a string
/// at the top as its bare text, anything else as JSON. Fails once `out` passes `room` bytes.
struct CompactJson<'a> {
    out: &'a mut String,
    room: usize,
    top: bool,
}

impl CompactJson<'_> {
    fn push<E: de::Error>(&mut self, text: &str) -> Result<(), E> {
        self.out.push_str(text);
        if self.out.len() > self.room { Err(E::custom("metadata value too large")) } else { Ok(()) }
    }

    fn nested(&mut self) -> CompactJson<'_> {
        CompactJson { out: self.out, room: self.room, top: false }
    }
}

impl<'de> DeserializeSeed<'de> for CompactJson<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for CompactJson<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_unit<E: de::Error>(mut self) -> Result<(), E> {
        self.push("null")
    }

    fn visit_bool<E: de::Error>(mut self, value: bool) -> Result<(), E> {
        self.push(if value { "true" } else { "false" })
    }

    fn visit_i64<E: de::Error>(mut self, value: i64) -> Result<(), E> {
        self.push(&value.to_string())
    }

    fn visit_u64<E: de::Error>(mut self, value: u64) -> Result<(), E> {
        self.push(&value.to_string())
    }

    fn visit_f64<E: de::Error>(mut self, value: f64) -> Result<(), E> {
        // As serde_json writes it, so that the text is what a JSON value would print.
        let text = serde_json::to_string(&value).map_err(E::custom)?;
        self.push(&text)
    }

    fn visit_str<E: de::Error>(mut self, value: &str) -> Result<(), E> {
        if self.top {
            return self.push(value);
        }
        let text = serde_json::to_string(value).map_err(E::custom)?;
        self.push(&text)
    }

    fn visit_seq<A: de::SeqAccess<'de>>(mut self, mut seq: A) -> Result<(), A::Error> {
        self.push("[")?;
        let mut first = true;
        loop {
            if !first {
                self.push(",")?;
            }
            if seq.next_element_seed(self.nested())?.is_none() {
                if !first {
                    self.out.pop();
                }
                break;
            }
            first = false;
        }
        self.push("]")
    }

    fn visit_map<A: MapAccess<'de>>(mut self, mut map: A) -> Result<(), A::Error> {
        self.push("{")?;
        let mut first = true;
        while let Some(key) = map.next_key::<String>()? {
            if !first {
                self.push(",")?;
            }
            first = false;
            let key = serde_json::to_string(&key).map_err(de::Error::custom)?;
            self.push(&key)?;
            self.push(":")?;
            map.next_value_seed(self.nested())?;
        }
        self.push("}")
    }
}

/// What the first pass over an index finds besides `weight_map`.
struct Top {
    metadata: BTreeMap<String, String>,
    weight_maps: usize,
}

struct TopSeed<'a> {
    problem: &'a mut Option<IndexProblem>,
}

impl<'de> Visitor<'de> for TopSeed<'_> {
    type Value = Top;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a shard index object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Top, A::Error> {
        let mut top = Top { metadata: BTreeMap::new(), weight_maps: 0 };
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "metadata" => top.metadata = map.next_value_seed(MetadataSeed { problem: &mut *self.problem })?,
                "weight_map" => {
                    top.weight_maps += 1;
                    map.next_value::<de::IgnoredAny>()?;
                }
                _ => {
                    map.next_value::<de::IgnoredAny>()?;
                }
            }
        }
        Ok(top)
    }
}

/// `weight_map` of the index `text`, which is an object; refuses an index with two of them: a
/// JSON object keeps only one of two equal keys, and which one differs between readers.
fn weight_map(text: &str, problem: &mut Option<IndexProblem>) -> serde_json::Result<Option<WeightMap>> {
    struct Only<'a> {
        problem: &'a mut Option<IndexProblem>,
    }
    impl<'de> Visitor<'de> for Only<'_> {
        type Value = Option<WeightMap>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a shard index object")
        }

        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut found = None;
            while let Some(key) = map.next_key::<String>()? {
                if key != "weight_map" {
                    map.next_value::<de::IgnoredAny>()?;
                } else if found.is_some() {
                    return Err(park(self.problem, IndexProblem::WeightMapTwice));
                } else {
                    found = Some(map.next_value_seed(WeightMapSeed { problem: &mut *self.problem })?);
                }
            }
            Ok(found)
        }
    }
    let mut deserializer = serde_json::Deserializer::from_str(text);
    deserializer.deserialize_map(Only { problem })
}

impl ShardIndex {
    /// Reads and checks the index at `path` (the shards themselves are opened later).
    ///
    /// # Errors
    /// [`Error::Io`] when it cannot be read, [`Error::Index`] when it is not a usable index
    /// (among them an index over [`MAX_INDEX_BYTES`]).
    pub(crate) fn read(path: &Path) -> Result<ShardIndex> {
        let text = crate::fs::read_text_within(path, MAX_INDEX_BYTES)?.map_err(|bytes| Error::Index {
            path: path.to_path_buf(),
            problem: IndexProblem::FileTooLarge { bytes, limit: MAX_INDEX_BYTES },
        })?;
        ShardIndex::parse(path, &text)
    }

    /// Checks the index `text` read from `path` (a file, or the URL of a remote one); shard
    /// names are taken relative to the folder of `path`. Nothing is built from the JSON beyond
    /// what the index keeps, so memory follows the entries, not the shape of the text.
    ///
    /// # Errors
    /// [`Error::Index`] when it is not a usable index.
    pub(crate) fn parse(path: &Path, text: &str) -> Result<ShardIndex> {
        let invalid = |problem: IndexProblem| Error::Index { path: path.to_path_buf(), problem };
        // The syntax first, in a pass that builds nothing, so that broken JSON is reported as
        // such wherever the break is.
        serde_json::from_str::<de::IgnoredAny>(text)
            .map_err(|error| invalid(IndexProblem::NotJson { message: error.to_string() }))?;
        if !text.trim_start().starts_with('{') {
            return Err(invalid(IndexProblem::NotObject));
        }
        let mut problem = None;
        let mut deserializer = serde_json::Deserializer::from_str(text);
        let top = deserializer
            .deserialize_map(TopSeed { problem: &mut problem })
            .map_err(|error| invalid(problem.take().unwrap_or(IndexProblem::NotJson { message: error.to_string() })))?;
        if top.weight_maps == 0 {
            return Err(invalid(IndexProblem::NoWeightMap));
        }
        let found = weight_map(text, &mut problem).map_err(|error| match problem.take() {
            Some(problem) => invalid(problem),
            None => invalid(IndexProblem::WeightMapNotStrings { message: error.to_string() }),
        })?;
        let WeightMap { pairs, lookup, shards, bad_shard } = found.unwrap_or_else(|| WeightMap {
            pairs: Vec::new(),
            lookup: HashMap::new(),
            shards: Vec::new(),
            bad_shard: None,
        });
        if let Some((name, shard)) = bad_shard {
            return Err(invalid(IndexProblem::BadShardName { name, shard }));
        }
        let dir = path.parent().unwrap_or(Path::new("."));
        let shards = shards.iter().map(|shard| dir.join(shard)).collect();
        Ok(ShardIndex { path: path.to_path_buf(), metadata: top.metadata, weight_map: pairs, lookup, shards })
    }
}

/// The file name of shard `number` (from 1) of `count` for the checkpoint `stem`:
/// `model-00001-of-00003.safetensors`, or for `generation` 2 and up a variant such as
/// `model-00001-of-00003-v2.safetensors` (a save uses one when the standard names are still in
/// use by the index it replaces).
pub(crate) fn shard_file_name(stem: &str, number: usize, count: usize, generation: usize) -> String {
    match generation {
        0 | 1 => format!("{stem}-{number:05}-of-{count:05}.safetensors"),
        _ => format!("{stem}-{number:05}-of-{count:05}-v{generation}.safetensors"),
    }
}

/// The checkpoint stem of a shard file name written by [`shard_file_name`] (or by another
/// writer of the `STEM-K-of-N.safetensors` convention): `Some("model")` for
/// `model-00002-of-00003.safetensors` and `model-00002-of-00003-v2.safetensors`.
pub(crate) fn shard_stem(file_name: &str) -> Option<&str> {
    let digits = |text: &str| !text.is_empty() && text.bytes().all(|byte| byte.is_ascii_digit());
    let mut rest = file_name.strip_suffix(".safetensors")?;
    if let Some((head, generation)) = rest.rsplit_once("-v")
        && digits(generation)
    {
        rest = head;
    }
    let (head, count) = rest.rsplit_once("-of-")?;
    let (stem, number) = head.rsplit_once('-')?;
    (digits(count) && digits(number) && !stem.is_empty()).then_some(stem)
}

/// One shard of an index, mapped on first use.
pub(crate) struct Shard {
    index: Arc<ShardIndex>,
    at: usize,
    opened: OnceLock<(Arc<MappedFile>, HashMap<String, usize>)>,
}

impl Shard {
    pub(crate) fn new(index: Arc<ShardIndex>, at: usize) -> Shard {
        Shard { index, at, opened: OnceLock::new() }
    }

    fn path(&self) -> &Path {
        &self.index.shards[self.at]
    }

    fn mismatch(&self, problem: ShardProblem) -> Error {
        Error::ShardMismatch { index: self.index.path.clone(), shard: self.path().to_path_buf(), problem }
    }

    /// Maps the shard and checks it against the index: an entry the index puts in another
    /// shard is an error (a name in two shards).
    fn map(&self) -> Result<&(Arc<MappedFile>, HashMap<String, usize>)> {
        if let Some(opened) = self.opened.get() {
            return Ok(opened);
        }
        let path = self.path();
        if !path.exists() {
            return Err(Error::MissingShard { index: self.index.path.clone(), shard: path.to_path_buf() });
        }
        let file = MappedFile::open(path)?;
        let mut names = HashMap::with_capacity(file.header.entries.len());
        for (at, entry) in file.header.entries.iter().enumerate() {
            if let Some(&other) = self.index.lookup.get(&entry.name)
                && other != self.at
            {
                return Err(self.mismatch(ShardProblem::ElsewhereInIndex {
                    name: entry.name.clone(),
                    other: self.index.shards[other].clone(),
                }));
            }
            names.insert(entry.name.clone(), at);
        }
        Ok(self.opened.get_or_init(|| (file, names)))
    }
}

impl Store for Shard {
    /// The mapped file and entry number of `name`, mapping the shard on first use.
    fn open(&self, name: &str, _: usize) -> Result<(&dyn Source, usize)> {
        let (file, names) = self.map()?;
        match names.get(name) {
            Some(&at) => Ok((&**file, at)),
            None => Err(self.mismatch(ShardProblem::MissingEntry { name: name.to_string() })),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::{ShardIndex, shard_file_name, shard_stem};
    use crate::error::{Error, IndexProblem};

    fn problem(text: &str) -> IndexProblem {
        match ShardIndex::parse(Path::new("dir/model.safetensors.index.json"), text) {
            Err(Error::Index { problem, .. }) => problem,
            Err(other) => panic!("{other}"),
            Ok(_) => panic!("{text} is accepted"),
        }
    }

    #[test]
    fn metadata_values_are_kept_as_text_and_entries_in_order() {
        let text = r#"{"metadata": {"total_size": 8, "format": "pt", "sizes": [1, 2.5, {"b": null, "a": true}], "n": -3},
            "weight_map": {"z": "b.safetensors", "y": "a.safetensors", "x": "b.safetensors"}}"#;
        let index = ShardIndex::parse(Path::new("dir/model.safetensors.index.json"), text).unwrap();
        let metadata: Vec<(&str, &str)> = index.metadata.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert_eq!(metadata, [("format", "pt"), ("n", "-3"), ("sizes", r#"[1,2.5,{"b":null,"a":true}]"#)]);
        assert_eq!(index.weight_map, [("z".to_string(), 0), ("y".to_string(), 1), ("x".to_string(), 0)]);
        assert_eq!(index.shards, [Path::new("dir/b.safetensors"), Path::new("dir/a.safetensors")]);
    }

    #[test]
    fn problems_keep_their_order_whatever_the_order_of_the_text() {
        assert!(matches!(problem(r#"{"weight_map": {"x": 1}, "metadata": 2}"#), IndexProblem::MetadataNotObject));
        assert!(matches!(problem(r#"{"metadata": [], "weight_map": 1"#), IndexProblem::NotJson { .. }));
        assert!(matches!(problem("[]"), IndexProblem::NotObject));
        assert!(matches!(
            problem(r#"{"weight_map": {"x": "../a", "x": "b"}}"#),
            IndexProblem::DuplicateName { name } if name == "x"
        ));
        assert!(matches!(problem(r#"{"weight_map": {"x": "../a"}}"#), IndexProblem::BadShardName { .. }));
    }

    #[test]
    fn metadata_past_the_limit_is_refused_while_it_is_written() {
        // Each `1e15` is written as 18 bytes: more text than the index holds.
        let values = vec!["1e15"; (crate::budget::MAX_METADATA_BYTES / 18) + 1].join(",");
        let text = format!(r#"{{"metadata": {{"a": [{values}]}}, "weight_map": {{}}}}"#);
        assert!(matches!(
            problem(&text),
            IndexProblem::TooLarge { field: "metadata", key, limit, .. }
                if key == "a" && limit == crate::budget::MAX_METADATA_BYTES
        ));
    }

    #[test]
    fn shard_names_round_trip_to_their_stem() {
        for generation in [1, 2, 7] {
            let name = shard_file_name("model", 2, 3, generation);
            assert_eq!(shard_stem(&name), Some("model"), "{name}");
        }
        assert_eq!(shard_file_name("model", 2, 3, 1), "model-00002-of-00003.safetensors");
        assert_eq!(shard_file_name("model", 2, 3, 2), "model-00002-of-00003-v2.safetensors");
        assert_eq!(shard_stem("my-model-00001-of-00002.safetensors"), Some("my-model"));
    }

    #[test]
    fn other_names_are_not_shards() {
        for name in [
            "model.safetensors",
            "model-00001-of-00003.safetensors.index.json",
            ".model-00001-of-00003.safetensors.tmp-12-0",
            "model-0001-of-.safetensors",
            "-00001-of-00003.safetensors",
            "model-v2.safetensors",
            "model-00001-of-00003-vx.safetensors",
        ] {
            assert_eq!(shard_stem(name), None, "{name}");
        }
    }
}
