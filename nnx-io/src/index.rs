//! Sharded checkpoints: reading `model.safetensors.index.json` (each shard opened only when
//! one of its entries is needed) and checking shards against it.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, Visitor};

use crate::error::{Error, IndexProblem, Result, ShardProblem};
use crate::mapped::MappedFile;

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

/// Reads `weight_map` in order, refusing a name listed twice. The reason for a refusal is parked
/// in `problem` so that it survives serde's error with its own wording.
struct WeightMapVisitor<'a> {
    problem: &'a mut Option<IndexProblem>,
}

impl<'de> Visitor<'de> for WeightMapVisitor<'_> {
    type Value = Vec<(String, String)>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object mapping entry names to shard file names")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut seen = HashSet::new();
        let mut pairs = Vec::new();
        while let Some((name, shard)) = map.next_entry::<String, String>()? {
            if !seen.insert(name.clone()) {
                *self.problem = Some(IndexProblem::DuplicateName { name });
                return Err(de::Error::custom("duplicate entry"));
            }
            pairs.push((name, shard));
        }
        Ok(pairs)
    }
}

impl<'de> DeserializeSeed<'de> for WeightMapVisitor<'_> {
    type Value = Vec<(String, String)>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl ShardIndex {
    /// Reads and checks the index at `path` (the shards themselves are opened later).
    ///
    /// # Errors
    /// [`Error::Io`] when it cannot be read, [`Error::Index`] when it is not a usable index.
    pub(crate) fn read(path: &Path) -> Result<ShardIndex> {
        let text = std::fs::read_to_string(path).map_err(Error::io("read", path))?;
        ShardIndex::parse(path, &text)
    }

    /// Checks the index `text` read from `path` (a file, or the URL of a remote one); shard
    /// names are taken relative to the folder of `path`.
    ///
    /// # Errors
    /// [`Error::Index`] when it is not a usable index.
    pub(crate) fn parse(path: &Path, text: &str) -> Result<ShardIndex> {
        let invalid = |problem: IndexProblem| Error::Index { path: path.to_path_buf(), problem };
        let value: serde_json::Value = serde_json::from_str(text)
            .map_err(|error| invalid(IndexProblem::NotJson { message: error.to_string() }))?;
        let serde_json::Value::Object(object) = value else {
            return Err(invalid(IndexProblem::NotObject));
        };
        let mut metadata = BTreeMap::new();
        match object.get("metadata") {
            None | Some(serde_json::Value::Null) => {}
            Some(serde_json::Value::Object(values)) => {
                for (key, value) in values.iter().filter(|(key, _)| *key != "total_size") {
                    let text = match value {
                        serde_json::Value::String(text) => text.clone(),
                        other => other.to_string(),
                    };
                    metadata.insert(key.clone(), text);
                }
            }
            Some(_) => return Err(invalid(IndexProblem::MetadataNotObject)),
        }
        if !object.contains_key("weight_map") {
            return Err(invalid(IndexProblem::NoWeightMap));
        }
        // Parse `weight_map` again from the text to keep its order and catch duplicate names,
        // which a JSON object silently drops.
        let mut problem = None;
        let pairs = weight_map_pairs(text, &mut problem).map_err(|error| match problem.take() {
            Some(problem) => invalid(problem),
            None => invalid(IndexProblem::WeightMapNotStrings { message: error.to_string() }),
        })?;
        let dir = path.parent().unwrap_or(Path::new("."));
        let mut shards: Vec<PathBuf> = Vec::new();
        let mut shard_numbers: HashMap<String, usize> = HashMap::new();
        let mut weight_map = Vec::with_capacity(pairs.len());
        let mut lookup = HashMap::with_capacity(pairs.len());
        for (name, shard) in pairs {
            if shard.is_empty() || shard.contains('/') || shard.contains('\\') || shard == ".." {
                return Err(invalid(IndexProblem::BadShardName { name, shard }));
            }
            let number = *shard_numbers.entry(shard.clone()).or_insert_with(|| {
                shards.push(dir.join(&shard));
                shards.len() - 1
            });
            lookup.insert(name.clone(), number);
            weight_map.push((name, number));
        }
        Ok(ShardIndex { path: path.to_path_buf(), metadata, weight_map, lookup, shards })
    }
}

fn weight_map_pairs(text: &str, problem: &mut Option<IndexProblem>) -> serde_json::Result<Vec<(String, String)>> {
    struct Top<'a> {
        problem: &'a mut Option<IndexProblem>,
    }
    impl<'de> Visitor<'de> for Top<'_> {
        type Value = Vec<(String, String)>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a shard index object")
        }

        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut pairs = None;
            while let Some(key) = map.next_key::<String>()? {
                if key == "weight_map" {
                    // A JSON object keeps only one of two equal keys; which one differs between
                    // readers, so an index that has two weight maps is refused.
                    if pairs.is_some() {
                        *self.problem = Some(IndexProblem::WeightMapTwice);
                        return Err(de::Error::custom("duplicate weight map"));
                    }
                    pairs = Some(map.next_value_seed(WeightMapVisitor { problem: &mut *self.problem })?);
                } else {
                    map.next_value::<de::IgnoredAny>()?;
                }
            }
            Ok(pairs.unwrap_or_default())
        }
    }
    let mut deserializer = serde_json::Deserializer::from_str(text);
    deserializer.deserialize_map(Top { problem })
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
    fn open(&self) -> Result<&(Arc<MappedFile>, HashMap<String, usize>)> {
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

    /// The mapped file and entry number of `name`.
    pub(crate) fn locate(&self, name: &str) -> Result<(&Arc<MappedFile>, usize)> {
        let (file, names) = self.open()?;
        match names.get(name) {
            Some(&at) => Ok((file, at)),
            None => Err(self.mismatch(ShardProblem::MissingEntry { name: name.to_string() })),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{shard_file_name, shard_stem};

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
