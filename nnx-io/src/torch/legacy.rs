//! The format `torch.save` wrote before PyTorch 1.6: five pickles in a row (a magic number,
//! the protocol version, system information, the object, the sorted storage keys), then for
//! each key its element count (8 bytes, little-endian) and its raw bytes.

use std::collections::HashMap;

use nnx_core::DType;

use super::pickle::{Container, StorageRef, Unpickled, Value, unpickle_with};
use super::zip::Record;
use crate::error::TorchProblem;
use crate::format::TORCH_LEGACY_MAGIC as MAGIC;

/// The protocol version legacy files carry.
const PROTOCOL_VERSION: i64 = 1001;

fn pickle(bytes: &[u8], start: usize, what: &str, inline_storages: bool) -> Result<Unpickled, TorchProblem> {
    unpickle_with(bytes, start, inline_storages).map_err(|error| TorchProblem::Pickle {
        pickle: what.to_string(),
        offset: error.offset - start,
        problem: error.problem,
    })
}

/// The value under the string key `key` of a dict.
fn lookup<'a>(unpickled: &'a Unpickled, dict: &Value, key: &str) -> Option<&'a Value> {
    let Value::Dict(id) = dict else { return None };
    let Container::Dict(pairs) = &unpickled.containers[*id] else { return None };
    pairs.iter().find(|(name, _)| matches!(name, Value::Str(name) if &**name == key)).map(|(_, value)| value)
}

/// Reads a legacy file that starts with [`MAGIC`]: the object's pickle, and where each storage's
/// bytes lie.
pub(crate) fn read(bytes: &[u8]) -> Result<(Unpickled, HashMap<String, Record>), TorchProblem> {
    read_with(bytes, true)
}

/// The storage that a legacy file of one storage holds (what `pickle` writes for a storage:
/// `torch.storage._load_from_bytes(bytes)`), with a copy of its bytes.
pub(crate) fn read_storage(bytes: &[u8]) -> Result<StorageRef, TorchProblem> {
    if !bytes.starts_with(MAGIC) {
        return Err(TorchProblem::LegacyHeader);
    }
    let (main, records) = read_with(bytes, false)?;
    let Value::Storage(storage) = &main.root else { return Err(TorchProblem::LegacyHeader) };
    let record =
        records.get(&*storage.key).ok_or_else(|| TorchProblem::MissingStorage { key: storage.key.to_string() })?;
    Ok(StorageRef {
        key: storage.key.clone(),
        dtype: storage.dtype,
        numel: storage.numel,
        view: storage.view,
        inline: Some(bytes[record.start..record.start + record.len].into()),
    })
}

fn read_with(bytes: &[u8], inline_storages: bool) -> Result<(Unpickled, HashMap<String, Record>), TorchProblem> {
    let version = pickle(bytes, MAGIC.len(), "the protocol version", false)?;
    if !matches!(version.root, Value::Int(PROTOCOL_VERSION)) {
        return Err(TorchProblem::LegacyHeader);
    }
    let system = pickle(bytes, version.end, "the system information", false)?;
    if matches!(lookup(&system, &system.root, "little_endian"), Some(Value::Bool(false))) {
        return Err(TorchProblem::BigEndian);
    }
    let main = pickle(bytes, system.end, "the main pickle", inline_storages)?;
    let keys = pickle(bytes, main.end, "the storage keys", false)?;
    let Value::List(id) = keys.root else { return Err(TorchProblem::LegacyHeader) };
    let Container::List(keys_list) = &keys.containers[id] else { return Err(TorchProblem::LegacyHeader) };

    let mut dtypes: HashMap<&str, DType> = HashMap::new();
    for storage in main.storages.iter().filter(|storage| storage.inline.is_none()) {
        if *dtypes.entry(&storage.key).or_insert(storage.dtype) != storage.dtype {
            return Err(TorchProblem::StorageDType { key: storage.key.to_string() });
        }
    }
    let mut records = HashMap::with_capacity(keys_list.len());
    let mut at = keys.end;
    for key in keys_list {
        let Value::Str(key) = key else { return Err(TorchProblem::LegacyHeader) };
        let dtype = *dtypes.get(&**key).ok_or_else(|| TorchProblem::MissingStorage { key: key.to_string() })?;
        let size = dtype.size_in_bytes().expect("storage dtypes are whole bytes");
        let count = bytes
            .get(at..at + 8)
            .map(|count| u64::from_le_bytes(count.try_into().expect("eight bytes")))
            .ok_or_else(|| TorchProblem::MissingStorage { key: key.to_string() })?;
        let start = at + 8;
        let available = bytes.len() - start;
        let len = usize::try_from(count).ok().and_then(|count| count.checked_mul(size)).filter(|&len| len <= available);
        let Some(len) = len else {
            return Err(TorchProblem::StorageSize {
                key: key.to_string(),
                dtype,
                numel: usize::try_from(count).unwrap_or(usize::MAX),
                bytes: available,
            });
        };
        records.insert(key.to_string(), Record { start, len });
        at = start + len;
    }
    Ok((main, records))
}
