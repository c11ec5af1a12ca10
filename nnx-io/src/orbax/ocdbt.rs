//! OCDBT, the key-value database orbax-checkpoint stores arrays in by default: `manifest.ocdbt`
//! names the latest version's B+tree root, whose nodes lie in data files (`d/<hex>`, or another
//! process's `ocdbt.process_N/d/<hex>`) beside the values too large to sit inside a leaf. Only
//! the nodes on the way to the keys asked for are read; every record's magic, length and crc32c
//! are checked before it is decompressed, and every count and length is bounded by the bytes
//! that hold it.

use std::collections::HashMap;
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex};

use super::{Parse, Value, problem, read_file_range};
use crate::error::{OrbaxProblem, Result};

/// The manifest's file name, in the checkpoint's folder.
pub(crate) const MANIFEST: &str = "manifest.ocdbt";

const MANIFEST_MAGIC: u32 = 0x0cdb_3a2a;
const BTREE_MAGIC: u32 = 0x0cdb_20de;
/// The most bytes a manifest may take, encoded or decoded.
const MAX_MANIFEST_BYTES: u64 = 64 << 20;
/// The most bytes a B+tree node may take, encoded or decoded, whatever the manifest allows
/// (orbax-checkpoint configures nodes of up to 100 MB).
const MAX_NODE_BYTES: u64 = 256 << 20;
/// The least limit on a node: the default of tensorstore, whose nodes may pass the configured
/// size by an entry.
const MIN_NODE_BYTES: u64 = 8 << 20;
/// The most entries of one B+tree node (tensorstore's own limit).
const MAX_ARITY: u64 = 1 << 20;
/// The longest key and data file path.
const MAX_KEY_BYTES: u64 = 65_535;
/// The most nodes one walk reads, and the most entries it looks at: a tree whose nodes refer to
/// the same nodes over and over ends in an error, in bounded time.
const MAX_VISITS: usize = 1 << 20;
const MAX_EXAMINED: usize = 1 << 26;
/// The most bytes of decoded nodes kept for the next scans.
const CACHE_BYTES: usize = 64 << 20;

/// A data file, as a node names it: the base path (which the files its own nodes name are
/// relative to) and the rest of the path, both relative to the database's folder.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct DataFile {
    base: String,
    relative: String,
}

/// Bytes of a data file: a node or a value.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Reference {
    file: DataFile,
    offset: u64,
    length: u64,
}

/// A decoded B+tree node: its height and entries, keys relative to the prefix of the path that
/// reached it.
struct Node {
    height: u8,
    entries: Entries,
    /// The bytes it holds, for the cache's budget.
    weight: usize,
}

enum Entries {
    Leaf(Vec<(Vec<u8>, Stored)>),
    Interior(Vec<Child>),
}

/// A child of an interior node: its first key, the length of that key's prefix that every key
/// under it shares (and that its keys leave out), and where it lies.
struct Child {
    key: Vec<u8>,
    common: usize,
    node: Reference,
}

/// A node on the way down a walk: the next child to walk and the prefix its keys leave out.
struct Frame {
    node: Arc<Node>,
    path: PathBuf,
    next: usize,
    inherited: Vec<u8>,
}

/// Whether `inherited` then `key` starts with `prefix`, without joining them.
fn starts_with(inherited: &[u8], key: &[u8], prefix: &[u8]) -> bool {
    inherited.len() + key.len() >= prefix.len() && inherited.iter().chain(key).zip(prefix).all(|(a, b)| a == b)
}

/// Whether `inherited` then `key` sorts at or before `prefix`, without joining them.
fn less_or_equal(inherited: &[u8], key: &[u8], prefix: &[u8]) -> bool {
    inherited.iter().chain(key).cmp(prefix.iter()).is_le()
}

/// A leaf's value: inside the node, or bytes of a data file.
enum Stored {
    Inline(Vec<u8>),
    Indirect(Reference),
}

/// An OCDBT database: its folder and the root of its latest version.
pub(crate) struct Database {
    folder: PathBuf,
    root: Option<(Reference, u8)>,
    /// The most bytes a node may take, encoded or decoded, and spell out as keys and paths once
    /// their prefix compression is undone (so that a small hostile file cannot make a huge
    /// allocation): twice the manifest's `max_decoded_node_bytes`, within [`MIN_NODE_BYTES`]
    /// and [`MAX_NODE_BYTES`].
    node_limit: u64,
    cache: Mutex<Cache>,
}

#[derive(Default)]
struct Cache {
    nodes: HashMap<Reference, Arc<Node>>,
    bytes: usize,
}

impl Database {
    /// Opens the database in `folder` from its `manifest.ocdbt` (or, for a numbered manifest,
    /// the latest `manifest.XXXXXXXXXXXXXXXX`): only the manifest is read.
    ///
    /// # Errors
    /// [`crate::Error::Io`] when the manifest cannot be read, [`crate::Error::Orbax`] when it
    /// breaks the format.
    pub(crate) fn open(folder: &Path) -> Result<Database> {
        let path = folder.join(MANIFEST);
        let (root, node_bytes) = match read_manifest(&path)? {
            Manifest::Single { root, node_bytes } => (root, node_bytes),
            Manifest::Numbered => {
                let latest = latest_numbered(folder)?.ok_or_else(|| {
                    problem(&path, MANIFEST, OrbaxProblem::Malformed {
                        what: "the manifest says its versions are in numbered manifests, but the folder has no `manifest.XXXXXXXXXXXXXXXX`".into(),
                    })
                })?;
                match read_manifest(&latest)? {
                    Manifest::Single { root, node_bytes } => (root, node_bytes),
                    Manifest::Numbered => {
                        let what = "a numbered manifest refers to numbered manifests again".into();
                        return Err(problem(&latest, MANIFEST, OrbaxProblem::Malformed { what }));
                    }
                }
            }
        };
        let node_limit = node_bytes.saturating_mul(2).clamp(MIN_NODE_BYTES, MAX_NODE_BYTES);
        Ok(Database { folder: folder.to_path_buf(), root, node_limit, cache: Mutex::default() })
    }

    /// The value of `key`, or `None` when the database has no such key.
    ///
    /// # Errors
    /// The errors of reading the nodes on the way.
    pub(crate) fn get(&self, key: &str) -> Result<Option<Value>> {
        let mut found = None;
        self.scan(key, &mut |name, value| {
            if name == key {
                found = Some(value);
            }
            Ok(())
        })?;
        Ok(found)
    }

    /// Hands `each` every key that starts with `prefix` and its value, in key order, reading
    /// only the nodes whose key ranges meet the prefix.
    ///
    /// # Errors
    /// The errors of reading a node, [`OrbaxProblem::TooLarge`] for a walk of more than
    /// [`MAX_VISITS`] nodes or [`MAX_EXAMINED`] entries (a tree whose nodes refer to the same
    /// nodes over and over), and those of `each`.
    pub(crate) fn scan(&self, prefix: &str, each: &mut dyn FnMut(&str, Value) -> Result<()>) -> Result<()> {
        let Some((root, height)) = &self.root else { return Ok(()) };
        let text = prefix;
        let prefix = prefix.as_bytes();
        // Depth first, in key order: the nodes on the way down, each with the next child to
        // walk and the prefix its keys leave out. Heights fall by one a level, so at most 256.
        let mut frames = vec![self.frame(root, *height, Vec::new(), text)?];
        let (mut visits, mut examined) = (1usize, 0usize);
        while let Some(frame) = frames.last_mut() {
            let (node, path, inherited) = (frame.node.clone(), &frame.path, &frame.inherited);
            let children = match &node.entries {
                Entries::Leaf(entries) => {
                    examined += entries.len();
                    for (key, stored) in entries {
                        if !starts_with(inherited, key, prefix) {
                            continue;
                        }
                        let full: Vec<u8> = inherited.iter().chain(key).copied().collect();
                        let Ok(name) = std::str::from_utf8(&full) else { continue };
                        let value = match stored {
                            Stored::Inline(bytes) => Value::Bytes { bytes: bytes.clone(), path: path.clone() },
                            Stored::Indirect(value) => Value::File {
                                path: self.path_of(&value.file).map_err(|error| rekey(error, name))?,
                                offset: value.offset,
                                len: value.length,
                            },
                        };
                        each(name, value)?;
                    }
                    frames.pop();
                    continue;
                }
                Entries::Interior(children) => children,
            };
            let at = frame.next;
            frame.next += 1;
            examined += 1;
            let Some(child) = children.get(at) else {
                frames.pop();
                continue;
            };
            if examined > MAX_EXAMINED || visits >= MAX_VISITS {
                let too_many = OrbaxProblem::TooLarge { what: "the walk of the B+tree", limit: MAX_EXAMINED as u64 };
                return Err(problem(path, text, too_many));
            }
            // The child holds the keys from its first up to the next child's first.
            let before_end = children.get(at + 1).is_none_or(|next| !less_or_equal(inherited, &next.key, prefix));
            let after_start =
                less_or_equal(inherited, &child.key, prefix) || starts_with(inherited, &child.key, prefix);
            if !after_start {
                // The children are in key order: none of the rest meets the prefix.
                frames.pop();
                continue;
            }
            if before_end {
                let shared: Vec<u8> = inherited.iter().chain(&child.key[..child.common]).copied().collect();
                let below = node.height - 1;
                visits += 1;
                let next = self.frame(&child.node, below, shared, text)?;
                frames.push(next);
            }
        }
        Ok(())
    }

    /// The node at `reference`, which its parent expects at `height`, ready to walk.
    fn frame(&self, reference: &Reference, height: u8, inherited: Vec<u8>, key: &str) -> Result<Frame> {
        let node = self.node(reference, key.as_bytes())?;
        let path = self.path_of(&reference.file)?;
        if node.height != height {
            let what = format!("a B+tree node of height {} is where its parent expects height {height}", node.height);
            return Err(problem(&path, key, OrbaxProblem::Malformed { what }));
        }
        Ok(Frame { node, path, next: 0, inherited })
    }

    /// The file `file` names, inside the database's folder.
    fn path_of(&self, file: &DataFile) -> Result<PathBuf> {
        let full = format!("{}{}", file.base, file.relative);
        let mut path = self.folder.clone();
        let inside = !full.is_empty()
            && !full.contains('\\')
            && Path::new(&full).components().all(|part| matches!(part, Component::Normal(_)));
        if !inside {
            return Err(problem(&self.folder.join(MANIFEST), "", OrbaxProblem::DataPath { path: full }));
        }
        path.push(&full);
        Ok(path)
    }

    /// The node at `reference`, from the cache or decoded from its file.
    fn node(&self, reference: &Reference, key: &[u8]) -> Result<Arc<Node>> {
        if let Some(node) = self.cache.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).nodes.get(reference) {
            return Ok(node.clone());
        }
        let path = self.path_of(&reference.file)?;
        let key = String::from_utf8_lossy(key);
        if reference.length > self.node_limit {
            let too_large = OrbaxProblem::TooLarge { what: "a B+tree node", limit: self.node_limit };
            return Err(problem(&path, &key, too_large));
        }
        let encoded = read_file_range(&path, &key, "the data file", reference.offset, reference.length)?;
        let body = decode_record(&encoded, BTREE_MAGIC, "a B+tree node", self.node_limit)
            .map_err(|error| problem(&path, &key, error))?;
        let node = decode_node(&body, &reference.file.base, self.node_limit as usize)
            .map_err(|error| problem(&path, &key, error))?;
        let node = Arc::new(node);
        let mut cache = self.cache.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if cache.bytes + node.weight > CACHE_BYTES {
            *cache = Cache::default();
        }
        if node.weight <= CACHE_BYTES {
            cache.bytes += node.weight;
            cache.nodes.insert(reference.clone(), node.clone());
        }
        Ok(node)
    }
}

/// An error about `key` made from one about another key of the same file.
fn rekey(error: crate::Error, key: &str) -> crate::Error {
    match error {
        crate::Error::Orbax { path, problem, .. } => crate::Error::Orbax { path, key: key.to_string(), problem },
        other => other,
    }
}

/// What a manifest says: the root of the latest version (`None` for an empty database) and the
/// configured `max_decoded_node_bytes`, or that the versions are in numbered manifests.
enum Manifest {
    Single { root: Option<(Reference, u8)>, node_bytes: u64 },
    Numbered,
}

/// Reads and decodes the manifest at `path`.
fn read_manifest(path: &Path) -> Result<Manifest> {
    let len = std::fs::metadata(path).map_err(crate::Error::io("read", path))?.len();
    if len > MAX_MANIFEST_BYTES {
        let too_large = OrbaxProblem::TooLarge { what: "the manifest", limit: MAX_MANIFEST_BYTES };
        return Err(problem(path, MANIFEST, too_large));
    }
    let encoded = read_file_range(path, MANIFEST, "the manifest", 0, len)?;
    let body = decode_record(&encoded, MANIFEST_MAGIC, "the manifest", MAX_MANIFEST_BYTES)
        .map_err(|error| problem(path, MANIFEST, error))?;
    decode_manifest(&body).map_err(|error| problem(path, MANIFEST, error))
}

/// The numbered manifest of the latest generation in `folder`, if any.
fn latest_numbered(folder: &Path) -> Result<Option<PathBuf>> {
    let mut latest: Option<(u64, PathBuf)> = None;
    for item in std::fs::read_dir(folder).map_err(crate::Error::io("list", folder))? {
        let path = item.map_err(crate::Error::io("list", folder))?.path();
        let Some(name) = path.file_name().and_then(|name| name.to_str()) else { continue };
        let Some(hex) = name.strip_prefix("manifest.") else { continue };
        if hex.len() != 16 {
            continue;
        }
        let Ok(generation) = u64::from_str_radix(hex, 16) else { continue };
        if latest.as_ref().is_none_or(|(seen, _)| generation > *seen) {
            latest = Some((generation, path));
        }
    }
    Ok(latest.map(|(_, path)| path))
}

/// The body of an encoded record (manifest, version node or B+tree node): its magic, header
/// length and crc32c checked, then decompressed to at most `limit` bytes.
fn decode_record(encoded: &[u8], magic: u32, what: &'static str, limit: u64) -> Parse<Vec<u8>> {
    // Magic, length and checksum.
    const MIN: usize = 4 + 8 + 4;
    if encoded.len() < MIN {
        return Err(OrbaxProblem::Truncated {
            what: format!("the header of {what}"),
            needed: MIN as u64,
            available: encoded.len() as u64,
        });
    }
    let found = u32::from_be_bytes(encoded[..4].try_into().expect("four bytes"));
    if found != magic {
        return Err(OrbaxProblem::Magic { what, expected: magic, found });
    }
    let declared = u64::from_le_bytes(encoded[4..12].try_into().expect("eight bytes"));
    if declared != encoded.len() as u64 {
        return Err(OrbaxProblem::Length { what, declared, found: encoded.len() as u64 });
    }
    let (covered, stored) = encoded.split_at(encoded.len() - 4);
    let stored = u32::from_le_bytes(stored.try_into().expect("four bytes"));
    let computed = crc32c::crc32c(covered);
    if stored != computed {
        return Err(OrbaxProblem::Checksum { what, stored, computed });
    }
    let mut cursor = Cursor::new(&covered[12..]);
    let version = cursor.varint("the format version")?;
    if version != 0 {
        return Err(OrbaxProblem::Unknown { what: "the format version", found: version, expected: "version 0" });
    }
    match cursor.varint("the compression format")? {
        0 => Ok(cursor.rest().to_vec()),
        1 => super::zstd_decode(cursor.rest(), limit, what),
        other => Err(OrbaxProblem::Unknown {
            what: "the compression format",
            found: other,
            expected: "0 (none) or 1 (zstd)",
        }),
    }
}

/// The manifest's configuration and, for a single-file manifest, the root of its latest
/// version.
fn decode_manifest(body: &[u8]) -> Parse<Manifest> {
    let mut cursor = Cursor::new(body);
    cursor.take(16, "the database's uuid")?;
    let kind = cursor.byte("the manifest kind")?;
    cursor.varint("max_inline_value_bytes")?;
    let node_bytes = cursor.varint("max_decoded_node_bytes")?;
    let arity_log2 = cursor.byte("version_tree_arity_log2")?;
    if !(1..=16).contains(&arity_log2) {
        return Err(OrbaxProblem::Unknown {
            what: "version_tree_arity_log2",
            found: arity_log2.into(),
            expected: "1 to 16",
        });
    }
    match cursor.varint("the compression method")? {
        0 => {}
        1 => {
            cursor.take(4, "the zstd level")?;
        }
        other => {
            return Err(OrbaxProblem::Unknown {
                what: "the compression method",
                found: other,
                expected: "0 (none) or 1 (zstd)",
            });
        }
    }
    match kind {
        0 => {}
        1 => return Ok(Manifest::Numbered),
        other => {
            return Err(OrbaxProblem::Unknown {
                what: "the manifest kind",
                found: other.into(),
                expected: "0 (single) or 1 (numbered)",
            });
        }
    }
    let mut budget = MAX_MANIFEST_BYTES as usize;
    let files = data_files(&mut cursor, "", &mut budget)?;
    // The versions referenced inline: the latest ones, oldest first.
    let count = cursor.count("the number of versions in the manifest", 1 + 1 + 3 + 3 + 8)?;
    if count as u64 > 1u64 << arity_log2 {
        return Err(OrbaxProblem::Count {
            what: "the number of versions in the manifest",
            count: count as u64,
            available: 1u64 << arity_log2,
        });
    }
    let mut generations = Vec::with_capacity(count);
    for _ in 0..count {
        generations.push(cursor.varint("a generation number")?);
    }
    if generations.windows(2).any(|pair| pair[0] >= pair[1]) || generations.first() == Some(&0) {
        return Err(OrbaxProblem::Malformed {
            what: format!("the generation numbers {generations:?} do not increase from 1"),
        });
    }
    let heights = cursor.take(count, "the root heights")?.to_vec();
    let mut ids = Vec::with_capacity(count);
    for _ in 0..count {
        ids.push(cursor.varint("a data file id")?);
    }
    let mut offsets = Vec::with_capacity(count);
    for _ in 0..count {
        offsets.push(cursor.varint("a data file offset")?);
    }
    let mut lengths = Vec::with_capacity(count);
    for _ in 0..count {
        lengths.push(cursor.varint("a data file length")?);
    }
    // The statistics and commit times are not needed to read the latest version.
    let Some(last) = count.checked_sub(1) else { return Ok(Manifest::Single { root: None, node_bytes }) };
    if offsets[last] == u64::MAX && lengths[last] == u64::MAX {
        // The latest version has no root: the database is empty.
        return Ok(Manifest::Single { root: None, node_bytes });
    }
    let file = data_file(&files, ids[last])?;
    let root = Reference { file, offset: offsets[last], length: lengths[last] };
    Ok(Manifest::Single { root: Some((root, heights[last])), node_bytes })
}

/// Entry `id` of a data file table.
fn data_file(files: &[DataFile], id: u64) -> Parse<DataFile> {
    usize::try_from(id).ok().and_then(|id| files.get(id)).cloned().ok_or_else(|| OrbaxProblem::Malformed {
        what: format!("data file id {id} is past the {} files of the node's table", files.len()),
    })
}

/// A data file table: paths prefix-compressed against the one before, each split into a base
/// path and a relative path; `transitive` is the base path of the file the node came from.
fn data_files(cursor: &mut Cursor<'_>, transitive: &str, budget: &mut usize) -> Parse<Vec<DataFile>> {
    // Each file takes at least a suffix length and a base path length.
    let count = cursor.count("the number of data files", 2)?;
    let mut prefixes = vec![0u64; count];
    for prefix in prefixes.iter_mut().skip(1) {
        *prefix = cursor.varint("a data file path's prefix length")?;
    }
    let mut suffixes = Vec::with_capacity(count);
    for _ in 0..count {
        suffixes.push(cursor.varint("a data file path's suffix length")?);
    }
    let mut bases = Vec::with_capacity(count);
    for _ in 0..count {
        bases.push(cursor.varint("a data file's base path length")?);
    }
    let mut files: Vec<DataFile> = Vec::with_capacity(count);
    let mut previous: Vec<u8> = Vec::new();
    for at in 0..count {
        let (prefix, suffix, base) = (prefixes[at], suffixes[at], bases[at]);
        if prefix > previous.len() as u64 || prefix.saturating_add(suffix) > MAX_KEY_BYTES || base > prefix + suffix {
            return Err(OrbaxProblem::Malformed {
                what: format!(
                    "data file path {at} keeps {prefix} bytes of a path of {} and adds {suffix}, with a base of {base}",
                    previous.len()
                ),
            });
        }
        let tail = cursor.take(suffix as usize, "a data file path")?;
        let mut path = previous[..prefix as usize].to_vec();
        path.extend_from_slice(tail);
        let spent = transitive.len() + path.len();
        *budget = budget.checked_sub(spent).ok_or(OrbaxProblem::TooLarge {
            what: "the data file paths of a record",
            limit: (spent + *budget) as u64,
        })?;
        let text = std::str::from_utf8(&path)
            .map_err(|_| OrbaxProblem::Malformed { what: format!("data file path {at} is not UTF-8") })?;
        let (base_path, relative) = text.split_at_checked(base as usize).ok_or_else(|| OrbaxProblem::Malformed {
            what: format!("data file path {at} splits its base path inside a character"),
        })?;
        files.push(DataFile { base: format!("{transitive}{base_path}"), relative: relative.to_string() });
        previous = path;
    }
    Ok(files)
}

/// A decoded B+tree node body; `transitive` is the base path of the file it lies in, `budget`
/// the most bytes its keys and paths may spell out.
fn decode_node(body: &[u8], transitive: &str, mut budget: usize) -> Parse<Node> {
    let limit = budget;
    let mut cursor = Cursor::new(body);
    let height = cursor.byte("the node's height")?;
    let files = data_files(&mut cursor, transitive, &mut budget)?;
    // Each entry takes at least a key suffix length, a value length and its kind (leaves), or
    // a suffix length, a common prefix length and five varints (interior nodes).
    let count = cursor.count("the number of entries of a B+tree node", 3)?;
    if count == 0 || count as u64 > MAX_ARITY {
        return Err(OrbaxProblem::Count {
            what: "the number of entries of a B+tree node",
            count: count as u64,
            available: MAX_ARITY,
        });
    }
    let mut prefixes = vec![0u64; count];
    for prefix in prefixes.iter_mut().skip(1) {
        *prefix = cursor.varint("a key's prefix length")?;
    }
    let mut suffixes = Vec::with_capacity(count);
    for _ in 0..count {
        suffixes.push(cursor.varint("a key's suffix length")?);
    }
    let mut commons = Vec::new();
    if height > 0 {
        for _ in 0..count {
            commons.push(cursor.varint("a subtree's common prefix length")?);
        }
    }
    let mut keys: Vec<Vec<u8>> = Vec::with_capacity(count);
    let mut weight = 0usize;
    for at in 0..count {
        let previous: &[u8] = keys.last().map_or(&[], Vec::as_slice);
        let (prefix, suffix) = (prefixes[at], suffixes[at]);
        if prefix > previous.len() as u64 || prefix.saturating_add(suffix) > MAX_KEY_BYTES {
            return Err(OrbaxProblem::Malformed {
                what: format!("key {at} keeps {prefix} bytes of a key of {} and adds {suffix}", previous.len()),
            });
        }
        let tail = cursor.take(suffix as usize, "a key")?;
        let mut key = previous[..prefix as usize].to_vec();
        key.extend_from_slice(tail);
        if keys.last().is_some_and(|previous| *previous >= key) {
            return Err(OrbaxProblem::Malformed { what: format!("key {at} does not follow key {} in order", at - 1) });
        }
        budget = budget
            .checked_sub(key.len())
            .ok_or(OrbaxProblem::TooLarge { what: "the keys of a B+tree node", limit: limit as u64 })?;
        weight += key.len() + 64;
        keys.push(key);
    }
    let entries = if height == 0 {
        let mut lengths = Vec::with_capacity(count);
        for _ in 0..count {
            lengths.push(cursor.varint("a value's length")?);
        }
        let kinds = cursor.take(count, "the value kinds")?.to_vec();
        if let Some(kind) = kinds.iter().find(|&&kind| kind > 1) {
            return Err(OrbaxProblem::Unknown {
                what: "a value kind",
                found: (*kind).into(),
                expected: "0 (inline) or 1 (in a data file)",
            });
        }
        let indirect = kinds.iter().filter(|&&kind| kind == 1).count();
        let mut ids = Vec::with_capacity(indirect);
        for _ in 0..indirect {
            ids.push(data_file(&files, cursor.varint("a value's data file id")?)?);
        }
        let mut offsets = Vec::with_capacity(indirect);
        for _ in 0..indirect {
            offsets.push(cursor.varint("a value's data file offset")?);
        }
        let (mut ids, mut offsets) = (ids.into_iter(), offsets.into_iter());
        let mut entries = Vec::with_capacity(count);
        for ((key, length), kind) in keys.into_iter().zip(lengths).zip(kinds) {
            let stored = if kind == 1 {
                let (file, offset) = (ids.next().expect("one id per value"), offsets.next().expect("one offset"));
                if offset.checked_add(length).is_none() {
                    return Err(OrbaxProblem::Malformed {
                        what: format!("a value's offset {offset} and length {length} overflow"),
                    });
                }
                Stored::Indirect(Reference { file, offset, length })
            } else {
                let bytes = cursor.take(usize::try_from(length).unwrap_or(usize::MAX), "an inline value")?;
                weight += bytes.len();
                Stored::Inline(bytes.to_vec())
            };
            entries.push((key, stored));
        }
        Entries::Leaf(entries)
    } else {
        let mut ids = Vec::with_capacity(count);
        for _ in 0..count {
            ids.push(data_file(&files, cursor.varint("a child's data file id")?)?);
        }
        let mut offsets = Vec::with_capacity(count);
        for _ in 0..count {
            offsets.push(cursor.varint("a child's data file offset")?);
        }
        let mut lengths = Vec::with_capacity(count);
        for _ in 0..count {
            lengths.push(cursor.varint("a child's data file length")?);
        }
        // The statistics (keys, tree bytes, indirect value bytes) are not needed.
        let mut children = Vec::with_capacity(count);
        for (at, (((key, file), offset), length)) in keys.into_iter().zip(ids).zip(offsets).zip(lengths).enumerate() {
            let common = commons[at];
            if common > key.len() as u64 {
                return Err(OrbaxProblem::Malformed {
                    what: format!("child {at} shares {common} bytes of a key of {}", key.len()),
                });
            }
            children.push(Child { key, common: common as usize, node: Reference { file, offset, length } });
        }
        Entries::Interior(children)
    };
    Ok(Node { height, entries, weight })
}

/// Reads the fields of a decoded record, every read bounded by the bytes left.
struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn new(bytes: &'a [u8]) -> Cursor<'a> {
        Cursor { bytes, at: 0 }
    }

    fn left(&self) -> usize {
        self.bytes.len() - self.at
    }

    fn rest(&self) -> &'a [u8] {
        &self.bytes[self.at..]
    }

    fn truncated(&self, what: &str, needed: usize) -> OrbaxProblem {
        OrbaxProblem::Truncated {
            what: what.to_string(),
            needed: (self.at as u64).saturating_add(needed as u64),
            available: self.bytes.len() as u64,
        }
    }

    fn take(&mut self, len: usize, what: &str) -> Parse<&'a [u8]> {
        if len > self.left() {
            return Err(self.truncated(what, len));
        }
        let taken = &self.bytes[self.at..self.at + len];
        self.at += len;
        Ok(taken)
    }

    fn byte(&mut self, what: &str) -> Parse<u8> {
        Ok(self.take(1, what)?[0])
    }

    /// An unsigned LEB128 varint of at most 64 bits.
    fn varint(&mut self, what: &str) -> Parse<u64> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = self.byte(what)?;
            let bits = u64::from(byte & 0x7f);
            if shift == 63 && bits > 1 {
                break;
            }
            value |= bits << shift;
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(OrbaxProblem::Malformed { what: format!("{what} is a varint of more than 64 bits") })
    }

    /// A count of items that take at least `each` bytes apiece: no more than the bytes left
    /// can hold, so that nothing is allocated for items that are not there.
    fn count(&mut self, what: &'static str, each: usize) -> Parse<usize> {
        let count = self.varint(what)?;
        let available = (self.left() / each.max(1)) as u64;
        if count > available {
            return Err(OrbaxProblem::Count { what, count, available: self.left() as u64 });
        }
        Ok(count as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_are_leb128_and_bounded() {
        let mut cursor = Cursor::new(&[0x96, 0x01, 0x7f]);
        assert_eq!(cursor.varint("a").unwrap(), 150);
        assert_eq!(cursor.varint("b").unwrap(), 127);
        assert!(matches!(cursor.varint("c"), Err(OrbaxProblem::Truncated { .. })));
        let long = [0xffu8; 11];
        assert!(matches!(Cursor::new(&long).varint("d"), Err(OrbaxProblem::Malformed { .. })));
        let max = [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01];
        assert_eq!(Cursor::new(&max).varint("e").unwrap(), u64::MAX);
    }

    #[test]
    fn data_file_tables_undo_their_prefix_compression() {
        // Two files, `d/ab` and `d/ac`, with base paths `` and `d/`: bases differ, so nothing is
        // shared.
        let table = [2, 0, 4, 4, 0, 2, b'd', b'/', b'a', b'b', b'd', b'/', b'a', b'c'];
        let mut budget = 1 << 20;
        let files = data_files(&mut Cursor::new(&table), "x/", &mut budget).unwrap();
        assert_eq!(files[0], DataFile { base: "x/".into(), relative: "d/ab".into() });
        assert_eq!(files[1], DataFile { base: "x/d/".into(), relative: "ac".into() });
        // `p/d/x1` and `p/d/x2` under the same base `p/`: the second keeps 5 bytes.
        let table = [2, 5, 6, 1, 2, 2, b'p', b'/', b'd', b'/', b'x', b'1', b'2'];
        let files = data_files(&mut Cursor::new(&table), "", &mut budget).unwrap();
        assert_eq!(files[0], DataFile { base: "p/".into(), relative: "d/x1".into() });
        assert_eq!(files[1], DataFile { base: "p/".into(), relative: "d/x2".into() });
    }

    #[test]
    fn counts_past_the_bytes_left_are_refused_before_allocating() {
        let mut cursor = Cursor::new(&[0xff, 0xff, 0xff, 0xff, 0x0f, 1, 2]);
        assert!(matches!(cursor.count("files", 2), Err(OrbaxProblem::Count { count: 0xffff_ffff, .. })));
    }

    #[test]
    fn records_check_magic_length_and_checksum() {
        let mut record = Vec::new();
        record.extend_from_slice(&BTREE_MAGIC.to_be_bytes());
        record.extend_from_slice(&19u64.to_le_bytes());
        record.extend_from_slice(&[0, 0, 7]);
        let crc = crc32c::crc32c(&record);
        record.extend_from_slice(&crc.to_le_bytes());
        assert_eq!(decode_record(&record, BTREE_MAGIC, "node", 64).unwrap(), [7]);
        assert!(matches!(decode_record(&record, MANIFEST_MAGIC, "node", 64), Err(OrbaxProblem::Magic { .. })));
        let mut flipped = record.clone();
        flipped[14] ^= 1;
        assert!(matches!(decode_record(&flipped, BTREE_MAGIC, "node", 64), Err(OrbaxProblem::Checksum { .. })));
        assert!(matches!(decode_record(&record[..18], BTREE_MAGIC, "node", 64), Err(OrbaxProblem::Length { .. })));
    }
}
