//! A distributed checkpoint's `.metadata`: one pickle of torch's `Metadata` dataclass, read by
//! the restricted unpickler with the checkpoint's own classes admitted (each a plain object
//! whose fields are read by name; none of their code runs), then checked into plain Rust
//! values here.

use std::collections::HashMap;
use std::rc::Rc;

use nnx_core::DType;
use nnx_core::error::DcpProblem;

use crate::torch::pickle::{Class, Container, Global, Unpickled, Value};

/// The most entries (tensors and other items) a checkpoint may list.
pub(crate) const MAX_ENTRIES: usize = 1 << 20;
/// The most chunks of all tensors together.
pub(crate) const MAX_CHUNKS: usize = 1 << 22;
/// The most axes of a tensor.
const MAX_RANK: usize = 32;

/// A tensor as `.metadata` lists it.
#[derive(Debug)]
pub(crate) struct TensorMeta {
    pub(crate) name: String,
    pub(crate) dtype: DType,
    pub(crate) size: Vec<usize>,
    /// `(offsets, sizes)` of each chunk in the global tensor.
    pub(crate) chunks: Vec<(Vec<usize>, Vec<usize>)>,
}

/// Where one item's bytes lie.
#[derive(Clone, Debug)]
pub(crate) struct StorageInfo {
    pub(crate) relative_path: String,
    pub(crate) offset: u64,
    pub(crate) length: u64,
    pub(crate) transforms: Vec<String>,
}

/// What `.metadata` says, checked.
#[derive(Debug)]
pub(crate) struct Metadata {
    pub(crate) tensors: Vec<TensorMeta>,
    /// Items that are not tensors (step counters, learning rates), by name.
    pub(crate) objects: Vec<String>,
    /// Where each item lies, by entry name and chunk offsets (none for non-tensor items).
    pub(crate) storage: HashMap<(String, Vec<usize>), StorageInfo>,
    /// The format version torch wrote (`"1.0.0"`), when it wrote one.
    pub(crate) version: Option<String>,
}

type Checked<T> = std::result::Result<T, DcpProblem>;

/// Reads the tree `unpickled` holds as a `Metadata`.
///
/// # Errors
/// [`DcpProblem::Metadata`] naming where the tree is not what torch writes, and
/// [`DcpProblem::Limit`].
pub(crate) fn decode(unpickled: &Unpickled) -> Checked<Metadata> {
    let tree = Tree { unpickled };
    let root = tree.object(&unpickled.root, Class::Metadata, "the root")?;
    let entries = tree.dict(tree.required(&root, "state_dict_metadata", "Metadata")?, "state_dict_metadata")?;
    if entries.len() > MAX_ENTRIES {
        return Err(DcpProblem::Limit { what: "entries", found: entries.len(), max: MAX_ENTRIES });
    }
    let mut tensors = Vec::new();
    let mut objects = Vec::new();
    let mut chunk_count = 0usize;
    for (key, value) in entries {
        let name = tree.text(key, "a key of state_dict_metadata")?;
        let at = format!("state_dict_metadata['{name}']");
        match tree.class_of(value) {
            Some(Class::BytesStorageMetadata) => objects.push(name.to_string()),
            Some(Class::TensorStorageMetadata) => {
                let fields = tree.object(value, Class::TensorStorageMetadata, &at)?;
                let properties = tree.required(&fields, "properties", &at)?;
                let dtype = tree.dtype(properties, &format!("{at}.properties"))?;
                let size = tree.sizes(tree.required(&fields, "size", &at)?, &format!("{at}.size"))?;
                let chunks_at = format!("{at}.chunks");
                let list = tree.list(tree.required(&fields, "chunks", &at)?, &chunks_at)?;
                chunk_count = chunk_count.saturating_add(list.len());
                if chunk_count > MAX_CHUNKS {
                    return Err(DcpProblem::Limit { what: "chunks", found: chunk_count, max: MAX_CHUNKS });
                }
                let mut chunks = Vec::with_capacity(list.len());
                for (index, chunk) in list.iter().enumerate() {
                    let chunk_at = format!("{chunks_at}[{index}]");
                    let chunk = tree.object(chunk, Class::ChunkStorageMetadata, &chunk_at)?;
                    let offsets =
                        tree.sizes(tree.required(&chunk, "offsets", &chunk_at)?, &format!("{chunk_at}.offsets"))?;
                    let sizes = tree.sizes(tree.required(&chunk, "sizes", &chunk_at)?, &format!("{chunk_at}.sizes"))?;
                    chunks.push((offsets, sizes));
                }
                tensors.push(TensorMeta { name: name.to_string(), dtype, size, chunks });
            }
            _ => {
                return Err(DcpProblem::Metadata {
                    at,
                    expected: "a TensorStorageMetadata or a BytesStorageMetadata",
                    found: tree.describe(value),
                });
            }
        }
    }
    let mut storage = HashMap::new();
    let places = tree.required(&root, "storage_data", "Metadata")?;
    for (key, value) in tree.dict(places, "storage_data")? {
        let index = tree.object(key, Class::MetadataIndex, "a key of storage_data")?;
        let fqn = tree.text(tree.required(&index, "fqn", "MetadataIndex")?, "MetadataIndex.fqn")?;
        let at = format!("storage_data['{fqn}']");
        let offsets = match tree.field(&index, "offset") {
            None | Some(Value::None) => Vec::new(),
            Some(offset) => tree.sizes(offset, &format!("{at}.offset"))?,
        };
        let info = tree.object(value, Class::StorageInfo, &at)?;
        let relative_path = tree.text(tree.required(&info, "relative_path", &at)?, &format!("{at}.relative_path"))?;
        let offset = tree.count(tree.required(&info, "offset", &at)?, &format!("{at}.offset"))?;
        let length = tree.count(tree.required(&info, "length", &at)?, &format!("{at}.length"))?;
        let transforms = match tree.field(&info, "transform_descriptors") {
            None | Some(Value::None) => Vec::new(),
            Some(list) => {
                let items = tree.items(list, &format!("{at}.transform_descriptors"))?;
                items
                    .iter()
                    .map(|item| tree.text(item, "a transform descriptor").map(str::to_string))
                    .collect::<Checked<_>>()?
            }
        };
        let info = StorageInfo {
            relative_path: relative_path.to_string(),
            offset: offset as u64,
            length: length as u64,
            transforms,
        };
        storage.insert((fqn.to_string(), offsets), info);
    }
    let version = match tree.field(&root, "version") {
        Some(Value::Str(version)) => Some(version.to_string()),
        _ => None,
    };
    Ok(Metadata { tensors, objects, storage, version })
}

/// Reads values of the unpickled tree, saying where and what when one is not as expected.
struct Tree<'a> {
    unpickled: &'a Unpickled,
}

/// An object's fields by name.
type Fields<'a> = Vec<(&'a str, &'a Value)>;

impl<'a> Tree<'a> {
    fn container(&self, id: usize) -> &'a Container {
        &self.unpickled.containers[id]
    }

    fn class_of(&self, value: &Value) -> Option<Class> {
        match value {
            Value::Object(id) => match self.container(*id) {
                Container::Object { class, .. } => Some(*class),
                _ => None,
            },
            _ => None,
        }
    }

    /// The fields of `value`, an object of `class`: its state as a dict, or as `(dict, slots)`.
    fn object(&self, value: &'a Value, class: Class, at: &str) -> Checked<Fields<'a>> {
        let wrong =
            || DcpProblem::Metadata { at: at.to_string(), expected: class_name(class), found: self.describe(value) };
        let Value::Object(id) = value else { return Err(wrong()) };
        let Container::Object { class: found, state } = self.container(*id) else { return Err(wrong()) };
        if *found != class {
            return Err(wrong());
        }
        let mut fields = Vec::new();
        match state {
            None => {}
            Some(Value::Dict(id)) => self.named(*id, &mut fields),
            Some(Value::Tuple(pair)) if pair.items.len() == 2 => {
                for part in &pair.items {
                    match part {
                        Value::Dict(id) => self.named(*id, &mut fields),
                        Value::None => {}
                        other => {
                            return Err(DcpProblem::Metadata {
                                at: at.to_string(),
                                expected: "a state of fields by name",
                                found: self.describe(other),
                            });
                        }
                    }
                }
            }
            // TensorProperties's own state: a tuple whose first item is the dtype.
            Some(tuple @ Value::Tuple(_)) if class == Class::TensorProperties => fields.push(("", tuple)),
            Some(other) => {
                return Err(DcpProblem::Metadata {
                    at: at.to_string(),
                    expected: "a state of fields by name",
                    found: self.describe(other),
                });
            }
        }
        Ok(fields)
    }

    fn named(&self, id: usize, fields: &mut Fields<'a>) {
        if let Container::Dict(pairs) = self.container(id) {
            for (key, value) in pairs {
                if let Value::Str(key) = key {
                    fields.push((key, value));
                }
            }
        }
    }

    fn field(&self, fields: &Fields<'a>, name: &str) -> Option<&'a Value> {
        fields.iter().rev().find(|(key, _)| *key == name).map(|(_, value)| *value)
    }

    fn required(&self, fields: &Fields<'a>, name: &'static str, at: &str) -> Checked<&'a Value> {
        self.field(fields, name).ok_or_else(|| DcpProblem::Metadata {
            at: format!("{at}.{name}"),
            expected: "a value",
            found: "nothing".into(),
        })
    }

    fn dict(&self, value: &'a Value, at: &str) -> Checked<&'a [(Value, Value)]> {
        match value {
            Value::Dict(id) => match self.container(*id) {
                Container::Dict(pairs) => Ok(pairs),
                _ => unreachable!("a dict value refers to a dict"),
            },
            other => Err(DcpProblem::Metadata { at: at.to_string(), expected: "a dict", found: self.describe(other) }),
        }
    }

    fn list(&self, value: &'a Value, at: &str) -> Checked<&'a [Value]> {
        match value {
            Value::List(id) => match self.container(*id) {
                Container::List(items) => Ok(items),
                _ => unreachable!("a list value refers to a list"),
            },
            other => Err(DcpProblem::Metadata { at: at.to_string(), expected: "a list", found: self.describe(other) }),
        }
    }

    /// The items of a list or a tuple.
    fn items(&self, value: &'a Value, at: &str) -> Checked<&'a [Value]> {
        match value {
            Value::Tuple(tuple) => Ok(&tuple.items),
            other => self.list(other, at),
        }
    }

    fn text(&self, value: &'a Value, at: &str) -> Checked<&'a str> {
        match value {
            Value::Str(text) => Ok(text),
            other => {
                Err(DcpProblem::Metadata { at: at.to_string(), expected: "a string", found: self.describe(other) })
            }
        }
    }

    fn count(&self, value: &Value, at: &str) -> Checked<usize> {
        match value {
            Value::Int(n) if *n >= 0 && usize::try_from(*n).is_ok() => Ok(*n as usize),
            other => Err(DcpProblem::Metadata {
                at: at.to_string(),
                expected: "a non-negative integer",
                found: self.describe(other),
            }),
        }
    }

    /// A `torch.Size` (a tuple of non-negative integers).
    fn sizes(&self, value: &'a Value, at: &str) -> Checked<Vec<usize>> {
        let Value::Tuple(tuple) = value else {
            return Err(DcpProblem::Metadata {
                at: at.to_string(),
                expected: "a torch.Size",
                found: self.describe(value),
            });
        };
        if tuple.items.len() > MAX_RANK {
            return Err(DcpProblem::Metadata {
                at: at.to_string(),
                expected: "a size of at most 32 axes",
                found: format!("{} axes", tuple.items.len()),
            });
        }
        tuple.items.iter().map(|item| self.count(item, at)).collect()
    }

    /// The dtype of a `TensorProperties`: the first item of its state tuple, or its `dtype`.
    fn dtype(&self, value: &'a Value, at: &str) -> Checked<DType> {
        let fields = self.object(value, Class::TensorProperties, at)?;
        let dtype = match self.field(&fields, "") {
            Some(Value::Tuple(state)) => state.items.first(),
            _ => self.field(&fields, "dtype"),
        };
        match dtype {
            Some(Value::Global(Global::Dtype(dtype))) => Ok(*dtype),
            other => Err(DcpProblem::Metadata {
                at: format!("{at}.dtype"),
                expected: "a torch dtype",
                found: other.map_or_else(|| "nothing".into(), |value| self.describe(value)),
            }),
        }
    }

    /// What `value` is, in words, for messages.
    fn describe(&self, value: &Value) -> String {
        match value {
            Value::None => "None".into(),
            Value::Bool(value) => format!("the boolean {value}"),
            Value::Int(value) => format!("the integer {value}"),
            Value::Float(value) => format!("the float {value}"),
            Value::Str(text) => format!("the string {:?}", truncate(text)),
            Value::Tuple(tuple) => format!("a tuple of {} items", tuple.items.len()),
            Value::List(_) => "a list".into(),
            Value::Dict(_) => "a dict".into(),
            Value::Global(global) => format!("the global {global:?}"),
            Value::Storage(_) => "a storage".into(),
            Value::Bytes(bytes) => format!("{} bytes", bytes.len()),
            Value::Tensor(_) => "a tensor".into(),
            Value::Object(_) => match self.class_of(value) {
                Some(class) => format!("a {}", class_name(class)),
                None => "an object".into(),
            },
        }
    }
}

fn truncate(text: &Rc<str>) -> String {
    text.chars().take(64).collect()
}

fn class_name(class: Class) -> &'static str {
    match class {
        Class::Metadata => "Metadata",
        Class::TensorStorageMetadata => "TensorStorageMetadata",
        Class::BytesStorageMetadata => "BytesStorageMetadata",
        Class::ChunkStorageMetadata => "ChunkStorageMetadata",
        Class::TensorProperties => "TensorProperties",
        Class::MetadataIndex => "MetadataIndex",
        Class::StorageMeta => "StorageMeta",
        Class::StorageInfo => "_StorageInfo",
    }
}
