//! A restricted unpickler for PyTorch checkpoints: it knows the opcodes `torch.save` and
//! `pickle` emit for state dicts and the handful of globals a state dict needs (see
//! [`Global`]), builds a small value tree, and refuses every other global by name before acting
//! on it. Nothing is ever called or imported: each known global is a rule of this module.
//!
//! Memory stays bounded whatever the input: memo slots, stack, mark nesting, tuple nesting and
//! container items are capped, and values fetched from the memo are shared (lists and dicts live
//! in an arena and are referred to by number; strings and tuples are reference counted), never
//! deep-copied.

use std::collections::HashMap;
use std::rc::Rc;

use nnx_core::DType;

use crate::error::{PickleLimit, PickleProblem};

/// The memo slots a pickle may use: `0..MAX_MEMO` (`torch.save` numbers them from 0 upwards).
/// Slots are kept in a map, so a high slot number costs no more than a low one.
pub(crate) const MAX_MEMO: usize = 1 << 20;
/// The deepest nesting of marks, and of tuples inside tuples.
pub(crate) const MAX_DEPTH: usize = 64;
/// The most values on the stack at once.
pub(crate) const MAX_STACK: usize = 1 << 20;
/// The most items in all lists, dicts and tuples together.
pub(crate) const MAX_ITEMS: usize = 1 << 24;
/// The most axes of a tensor.
pub(crate) const MAX_RANK: usize = 32;

/// A value of the tree.
#[derive(Clone, Debug)]
pub(crate) enum Value {
    None,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(Rc<str>),
    Tuple(Rc<Tuple>),
    /// A list in the arena.
    List(usize),
    /// A dict (or `OrderedDict`) in the arena.
    Dict(usize),
    Global(Global),
    Storage(Rc<StorageRef>),
    Bytes(Rc<[u8]>),
    Tensor(Rc<TensorRecord>),
    /// An object of a class the pickle's [`Allow`] admits, in the arena.
    Object(usize),
}

/// An immutable tuple and how deeply tuples nest inside it.
#[derive(Debug)]
pub(crate) struct Tuple {
    pub(crate) items: Vec<Value>,
    depth: usize,
}

/// A mutable container, referred to by its number.
#[derive(Debug)]
pub(crate) enum Container {
    List(Vec<Value>),
    Dict(Vec<(Value, Value)>),
    /// An object made by `NEWOBJ` (or `REDUCE`) of an admitted class, with the state `BUILD`
    /// gave it (a dict of its fields, or the tuple its `__getstate__` returns).
    Object {
        class: Class,
        state: Option<Value>,
    },
}

/// Which globals a pickle may name: those of a state dict, or also those of a distributed
/// checkpoint's `.metadata` (its dataclasses, dtypes and layouts), which no state dict needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Allow {
    StateDict,
    DcpMetadata,
}

/// The classes of a distributed checkpoint's `.metadata`, each made as a plain object whose
/// state is read by field name: none of their code runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Class {
    Metadata,
    TensorStorageMetadata,
    BytesStorageMetadata,
    ChunkStorageMetadata,
    TensorProperties,
    MetadataIndex,
    StorageMeta,
    StorageInfo,
}

/// The class `module.name` of a distributed checkpoint's `.metadata`.
fn dcp_class(module: &str, name: &str) -> Option<Class> {
    Some(match (module, name) {
        ("torch.distributed.checkpoint.metadata", "Metadata") => Class::Metadata,
        ("torch.distributed.checkpoint.metadata", "TensorStorageMetadata") => Class::TensorStorageMetadata,
        ("torch.distributed.checkpoint.metadata", "BytesStorageMetadata") => Class::BytesStorageMetadata,
        ("torch.distributed.checkpoint.metadata", "ChunkStorageMetadata") => Class::ChunkStorageMetadata,
        ("torch.distributed.checkpoint.metadata", "TensorProperties") => Class::TensorProperties,
        ("torch.distributed.checkpoint.metadata", "MetadataIndex") => Class::MetadataIndex,
        ("torch.distributed.checkpoint.metadata", "StorageMeta") => Class::StorageMeta,
        ("torch.distributed.checkpoint.filesystem", "_StorageInfo") => Class::StorageInfo,
        _ => return None,
    })
}

/// The element type torch's `torch.NAME` dtype object stands for: numpy's names, and torch's
/// own aliases of them (`torch.long`, `torch.half`). `torch.uint64` is not admitted.
pub(crate) fn torch_dtype(name: &str) -> Option<DType> {
    let name = match name {
        "double" => "float64",
        "float" => "float32",
        "half" => "float16",
        "long" => "int64",
        "int" => "int32",
        "short" => "int16",
        "cfloat" => "complex64",
        "uint64" => return None,
        other => other,
    };
    DType::from_numpy_name(name)
}

/// The globals a state dict needs; every other one is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Global {
    /// `collections.OrderedDict`.
    OrderedDict,
    /// `torch._utils._rebuild_tensor_v2` and `torch._utils._rebuild_tensor`.
    RebuildTensor,
    /// `torch._utils._rebuild_parameter`, `_rebuild_parameter_with_state` and
    /// `torch.nn.parameter.Parameter`.
    RebuildParameter,
    /// `torch.Size`.
    Size,
    /// A typed storage class (`torch.FloatStorage`, ...).
    Storage(DType),
    /// `_codecs.encode`, as protocol 2 writes `bytes`: `encode(text, 'latin1')`.
    CodecsEncode,
    /// `torch.storage._load_from_bytes`: a storage pickled by `pickle` rather than
    /// `torch.save`, as a legacy checkpoint of that storage alone.
    LoadFromBytes,
    /// A class of a distributed checkpoint's `.metadata`.
    Class(Class),
    /// A torch dtype object (`torch.float32`), as `.metadata` names a tensor's element type.
    Dtype(DType),
    /// `torch.strided` and the memory formats: fields `.metadata` keeps and nnx does not need.
    TorchConstant,
    /// `torch.serialization._get_layout`, as torch pickles a layout: `_get_layout('torch.strided')`.
    Layout,
    /// `TensorProperties`'s memory format code (`_MEM_FORMAT_ENCODING(n)`): the number.
    MemoryFormatCode,
    /// `pathlib.PosixPath` (and its kin): the path `.metadata` keeps as its checkpoint's id,
    /// made into text.
    Path,
}

/// The global `module.name`, when it is one a state dict needs, or, where `allow` admits them,
/// one of a distributed checkpoint's `.metadata`.
fn known_global(module: &str, name: &str, allow: Allow) -> Option<Global> {
    if allow == Allow::DcpMetadata {
        let global = match (module, name) {
            ("torch", dtype) if torch_dtype(dtype).is_some() => torch_dtype(dtype).map(Global::Dtype),
            (
                "torch",
                "strided" | "sparse_coo" | "contiguous_format" | "channels_last" | "channels_last_3d"
                | "preserve_format",
            ) => Some(Global::TorchConstant),
            ("torch.distributed.checkpoint.metadata", "_MEM_FORMAT_ENCODING") => Some(Global::MemoryFormatCode),
            ("torch.serialization", "_get_layout") => Some(Global::Layout),
            ("pathlib" | "pathlib._local", "PosixPath" | "PurePosixPath" | "WindowsPath" | "PureWindowsPath") => {
                Some(Global::Path)
            }
            _ => dcp_class(module, name).map(Global::Class),
        };
        if global.is_some() {
            return global;
        }
    }
    Some(match (module, name) {
        ("collections", "OrderedDict") => Global::OrderedDict,
        ("torch._utils", "_rebuild_tensor_v2" | "_rebuild_tensor") => Global::RebuildTensor,
        ("torch._utils", "_rebuild_parameter" | "_rebuild_parameter_with_state")
        | ("torch.nn.parameter", "Parameter") => Global::RebuildParameter,
        ("torch", "Size") => Global::Size,
        ("torch", storage) => Global::Storage(storage_dtype(storage)?),
        ("_codecs", "encode") => Global::CodecsEncode,
        ("torch.storage", "_load_from_bytes") => Global::LoadFromBytes,
        _ => return None,
    })
}

/// The element type of a typed storage class.
fn storage_dtype(name: &str) -> Option<DType> {
    Some(match name {
        "DoubleStorage" => DType::F64,
        "FloatStorage" => DType::F32,
        "HalfStorage" => DType::F16,
        "BFloat16Storage" => DType::BF16,
        "LongStorage" => DType::I64,
        "IntStorage" => DType::I32,
        "ShortStorage" => DType::I16,
        "CharStorage" => DType::I8,
        "ByteStorage" => DType::U8,
        "BoolStorage" => DType::Bool,
        _ => return None,
    })
}

/// A storage named by a persistent id: `('storage', type, key, location, numel[, view])`.
#[derive(Debug)]
pub(crate) struct StorageRef {
    /// The record name (zip) or the storage's key (legacy files).
    pub(crate) key: Rc<str>,
    pub(crate) dtype: DType,
    /// Elements the storage holds, as the pickle says.
    pub(crate) numel: usize,
    /// For legacy views of a larger storage: the first element and the element count.
    pub(crate) view: Option<(usize, usize)>,
    /// The storage's bytes, for storages pickled inside the pickle (`_load_from_bytes`); `None`
    /// for storages whose bytes are records of the file.
    pub(crate) inline: Option<Rc<[u8]>>,
}

/// A tensor laid over a storage.
#[derive(Debug)]
pub(crate) struct TensorRecord {
    pub(crate) storage: Rc<StorageRef>,
    /// The first element, in elements of the storage.
    pub(crate) offset: usize,
    pub(crate) shape: Vec<usize>,
    pub(crate) strides: Vec<usize>,
}

/// A pickle read to its `STOP`.
pub(crate) struct Unpickled {
    pub(crate) root: Value,
    pub(crate) containers: Vec<Container>,
    /// Every storage the pickle names, in order of appearance.
    pub(crate) storages: Vec<Rc<StorageRef>>,
    /// The offset just past `STOP`.
    pub(crate) end: usize,
}

/// Where reading stopped and why.
#[derive(Debug)]
pub(crate) struct PickleError {
    /// Offset of the opcode, from the start of the pickle's bytes.
    pub(crate) offset: usize,
    pub(crate) problem: PickleProblem,
}

type Step<T> = std::result::Result<T, PickleProblem>;

struct Machine<'a> {
    allow: Allow,
    inline_storages: bool,
    /// Bytes made by `_codecs.encode` and copied out of pickled storages, which may not exceed
    /// twice the pickle's own size.
    made_bytes: usize,
    bytes: &'a [u8],
    at: usize,
    stack: Vec<Value>,
    marks: Vec<usize>,
    memo: HashMap<usize, Value>,
    containers: Vec<Container>,
    storages: Vec<Rc<StorageRef>>,
    items: usize,
}

/// Reads the pickle that starts at `start` in `bytes`.
///
/// # Errors
/// A [`PickleError`] at the offending opcode: an unknown opcode or global, a truncated stream,
/// a limit exceeded, or values that do not fit the opcode.
pub(crate) fn unpickle(bytes: &[u8], start: usize) -> Result<Unpickled, PickleError> {
    unpickle_with(bytes, start, true)
}

/// As [`unpickle`]; `inline_storages` says whether storages pickled inside the pickle
/// (`torch.storage._load_from_bytes`) are read: never inside such a storage itself.
pub(crate) fn unpickle_with(bytes: &[u8], start: usize, inline_storages: bool) -> Result<Unpickled, PickleError> {
    unpickle_allowing(bytes, start, inline_storages, Allow::StateDict)
}

/// Reads a distributed checkpoint's `.metadata`: a state dict's globals and its own (see
/// [`Allow::DcpMetadata`]), no storages.
///
/// # Errors
/// As [`unpickle`].
pub(crate) fn unpickle_dcp_metadata(bytes: &[u8]) -> Result<Unpickled, PickleError> {
    unpickle_allowing(bytes, 0, false, Allow::DcpMetadata)
}

fn unpickle_allowing(
    bytes: &[u8],
    start: usize,
    inline_storages: bool,
    allow: Allow,
) -> Result<Unpickled, PickleError> {
    let mut machine = Machine {
        allow,
        inline_storages,
        made_bytes: 0,
        bytes,
        at: start,
        stack: Vec::new(),
        marks: Vec::new(),
        memo: HashMap::new(),
        containers: Vec::new(),
        storages: Vec::new(),
        items: 0,
    };
    loop {
        let offset = machine.at;
        match machine.step() {
            Ok(Some(root)) => {
                return Ok(Unpickled {
                    root,
                    containers: machine.containers,
                    storages: machine.storages,
                    end: machine.at,
                });
            }
            Ok(None) => {}
            Err(problem) => return Err(PickleError { offset, problem }),
        }
    }
}

fn limit(limit: PickleLimit) -> PickleProblem {
    PickleProblem::Limit { limit }
}

impl Machine<'_> {
    fn take(&mut self, len: usize) -> Step<&[u8]> {
        let end = self.at.checked_add(len).filter(|&end| end <= self.bytes.len()).ok_or(PickleProblem::Truncated)?;
        let taken = &self.bytes[self.at..end];
        self.at = end;
        Ok(taken)
    }

    fn byte(&mut self) -> Step<u8> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Step<u16> {
        Ok(u16::from_le_bytes(self.take(2)?.try_into().expect("two bytes")))
    }

    fn u32(&mut self) -> Step<u32> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("four bytes")))
    }

    fn u64(&mut self) -> Step<u64> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("eight bytes")))
    }

    fn line(&mut self) -> Step<&str> {
        let rest = &self.bytes[self.at..];
        let len = rest.iter().position(|&b| b == b'\n').ok_or(PickleProblem::Truncated)?;
        let line = std::str::from_utf8(&rest[..len]).map_err(|_| PickleProblem::NotUtf8)?;
        self.at += len + 1;
        Ok(line)
    }

    fn string(&mut self, len: usize) -> Step<Value> {
        let bytes = self.take(len)?;
        let text = std::str::from_utf8(bytes).map_err(|_| PickleProblem::NotUtf8)?;
        Ok(Value::Str(Rc::from(text)))
    }

    fn push(&mut self, value: Value) -> Step<()> {
        if self.stack.len() >= MAX_STACK {
            return Err(limit(PickleLimit::Stack { max: MAX_STACK }));
        }
        self.stack.push(value);
        Ok(())
    }

    fn pop(&mut self) -> Step<Value> {
        let floor = self.marks.last().copied().unwrap_or(0);
        if self.stack.len() <= floor {
            return Err(PickleProblem::StackUnderflow);
        }
        Ok(self.stack.pop().expect("the stack is above its floor"))
    }

    fn top(&mut self) -> Step<&mut Value> {
        let floor = self.marks.last().copied().unwrap_or(0);
        if self.stack.len() <= floor {
            return Err(PickleProblem::StackUnderflow);
        }
        Ok(self.stack.last_mut().expect("the stack is above its floor"))
    }

    /// The values pushed since the last mark, which is removed.
    fn pop_mark(&mut self) -> Step<Vec<Value>> {
        let mark = self.marks.pop().ok_or(PickleProblem::NoMark)?;
        Ok(self.stack.split_off(mark))
    }

    fn count_items(&mut self, added: usize) -> Step<()> {
        self.items = self.items.saturating_add(added);
        if self.items > MAX_ITEMS {
            return Err(limit(PickleLimit::Items { max: MAX_ITEMS }));
        }
        Ok(())
    }

    fn tuple(&mut self, items: Vec<Value>) -> Step<Value> {
        self.count_items(items.len())?;
        let depth = 1 + items
            .iter()
            .map(|item| match item {
                Value::Tuple(tuple) => tuple.depth,
                _ => 0,
            })
            .max()
            .unwrap_or(0);
        if depth > MAX_DEPTH {
            return Err(limit(PickleLimit::Depth { max: MAX_DEPTH }));
        }
        Ok(Value::Tuple(Rc::new(Tuple { items, depth })))
    }

    /// Counts `len` bytes made from values of the pickle: together no more than twice what the
    /// pickle holds, however often a memoized string or storage is used again.
    fn make_bytes(&mut self, len: usize) -> Step<()> {
        // Twice the pickle: protocol 2 writes a storage's bytes as text, made into bytes once by
        // `_codecs.encode` and copied once more out of the storage.
        let max = self.bytes.len().saturating_mul(2);
        self.made_bytes = self.made_bytes.saturating_add(len);
        if self.made_bytes > max {
            return Err(limit(PickleLimit::MadeBytes { max }));
        }
        Ok(())
    }

    fn container(&mut self, container: Container) -> usize {
        self.containers.push(container);
        self.containers.len() - 1
    }

    fn memo_put(&mut self, index: usize) -> Step<()> {
        if index >= MAX_MEMO {
            return Err(limit(PickleLimit::Memo { index, max: MAX_MEMO }));
        }
        let value = self.top()?.clone();
        self.memo.insert(index, value);
        Ok(())
    }

    fn memo_get(&mut self, index: usize) -> Step<()> {
        let value = self.memo.get(&index).cloned().ok_or(PickleProblem::MemoMissing { index })?;
        self.push(value)
    }

    fn append(&mut self, values: Vec<Value>) -> Step<()> {
        self.count_items(values.len())?;
        let Value::List(id) = *self.top()? else {
            return Err(PickleProblem::Unexpected { opcode: "APPEND", expected: "a list" });
        };
        match &mut self.containers[id] {
            Container::List(items) => items.extend(values),
            Container::Dict(_) | Container::Object { .. } => {
                return Err(PickleProblem::Unexpected { opcode: "APPEND", expected: "a list" });
            }
        }
        Ok(())
    }

    fn set_items(&mut self, values: Vec<Value>) -> Step<()> {
        if !values.len().is_multiple_of(2) {
            return Err(PickleProblem::Unexpected { opcode: "SETITEMS", expected: "key and value pairs" });
        }
        self.count_items(values.len() / 2)?;
        let Value::Dict(id) = *self.top()? else {
            return Err(PickleProblem::Unexpected { opcode: "SETITEM", expected: "a dict" });
        };
        let Container::Dict(pairs) = &mut self.containers[id] else {
            return Err(PickleProblem::Unexpected { opcode: "SETITEM", expected: "a dict" });
        };
        let mut values = values.into_iter();
        while let (Some(key), Some(value)) = (values.next(), values.next()) {
            pairs.push((key, value));
        }
        Ok(())
    }

    fn global(&mut self, module: &str, name: &str) -> Step<()> {
        match known_global(module, name, self.allow) {
            Some(global) => self.push(Value::Global(global)),
            None => Err(PickleProblem::ForbiddenGlobal { module: module.to_string(), name: name.to_string() }),
        }
    }

    /// Applies a known global to its arguments (`REDUCE`, `NEWOBJ`).
    fn call(&mut self, callable: Value, args: Value, opcode: &'static str) -> Step<Value> {
        let Value::Global(global) = callable else {
            return Err(PickleProblem::Unexpected { opcode, expected: "a known global to call" });
        };
        let Value::Tuple(args) = args else {
            return Err(PickleProblem::Unexpected { opcode, expected: "a tuple of arguments" });
        };
        let args = &args.items;
        match global {
            Global::OrderedDict if args.is_empty() => Ok(Value::Dict(self.container(Container::Dict(Vec::new())))),
            Global::RebuildTensor if args.len() >= 4 => {
                let Value::Storage(storage) = &args[0] else {
                    return Err(PickleProblem::Unexpected {
                        opcode,
                        expected: "a storage as the tensor's first argument",
                    });
                };
                let offset = index(&args[1])?;
                let shape = indexes(&args[2])?;
                let strides = indexes(&args[3])?;
                if shape.len() != strides.len() || shape.len() > MAX_RANK {
                    return Err(PickleProblem::Unexpected { opcode, expected: "a size and a stride of one rank" });
                }
                Ok(Value::Tensor(Rc::new(TensorRecord { storage: storage.clone(), offset, shape, strides })))
            }
            Global::RebuildParameter if !args.is_empty() && matches!(args[0], Value::Tensor(_)) => Ok(args[0].clone()),
            Global::Size if args.len() == 1 && matches!(args[0], Value::Tuple(_)) => Ok(args[0].clone()),
            Global::CodecsEncode if args.len() == 2 => {
                let (Value::Str(text), Value::Str(encoding)) = (&args[0], &args[1]) else {
                    return Err(PickleProblem::Unexpected { opcode, expected: "a text and its encoding" });
                };
                if !matches!(&**encoding, "latin1" | "latin-1") {
                    return Err(PickleProblem::Unexpected { opcode, expected: "the `latin1` encoding" });
                }
                let text = text.clone();
                self.make_bytes(text.len())?;
                let bytes = text
                    .chars()
                    .map(|c| u8::try_from(u32::from(c)))
                    .collect::<Result<Vec<u8>, _>>()
                    .map_err(|_| PickleProblem::Unexpected { opcode, expected: "latin1 text" })?;
                Ok(Value::Bytes(Rc::from(bytes)))
            }
            Global::LoadFromBytes if self.inline_storages && args.len() == 1 => {
                let Value::Bytes(blob) = &args[0] else {
                    return Err(PickleProblem::Unexpected { opcode, expected: "the bytes of a storage" });
                };
                let blob = blob.clone();
                self.make_bytes(blob.len())?;
                let storage = super::legacy::read_storage(&blob)
                    .map_err(|problem| PickleProblem::InlineStorage { problem: Box::new(problem) })?;
                let storage = Rc::new(storage);
                self.storages.push(storage.clone());
                Ok(Value::Storage(storage))
            }
            Global::LoadFromBytes if !self.inline_storages => Err(PickleProblem::Unexpected {
                opcode,
                expected: "a storage's own bytes, not another pickled storage",
            }),
            Global::Class(class) if args.is_empty() => {
                Ok(Value::Object(self.container(Container::Object { class, state: None })))
            }
            Global::Layout if matches!(args[..], [Value::Str(_)]) => Ok(Value::Global(Global::TorchConstant)),
            Global::MemoryFormatCode if args.len() == 1 && matches!(args[0], Value::Int(_)) => Ok(args[0].clone()),
            Global::Path => {
                let mut parts = Vec::with_capacity(args.len());
                for part in args {
                    let Value::Str(part) = part else {
                        return Err(PickleProblem::Unexpected { opcode, expected: "the parts of a path as text" });
                    };
                    parts.push(part.clone());
                }
                let text = parts.iter().map(|part| &**part).collect::<Vec<_>>().join("/").replace("//", "/");
                self.make_bytes(text.len())?;
                Ok(Value::Str(Rc::from(text)))
            }
            _ => Err(PickleProblem::Unexpected { opcode, expected: "the arguments of a known global" }),
        }
    }

    /// Resolves a persistent id `('storage', type, key, location, numel[, view])`.
    fn persistent(&mut self, id: Value) -> Step<Value> {
        let bad = || PickleProblem::Unexpected { opcode: "BINPERSID", expected: "a storage id" };
        let Value::Tuple(id) = id else { return Err(bad()) };
        let items = &id.items;
        if !(5..=6).contains(&items.len()) || !matches!(&items[0], Value::Str(tag) if &**tag == "storage") {
            return Err(bad());
        }
        let Value::Global(Global::Storage(dtype)) = items[1] else { return Err(bad()) };
        let key = match &items[2] {
            Value::Str(key) => key.clone(),
            Value::Int(key) => Rc::from(key.to_string()),
            _ => return Err(bad()),
        };
        let numel = index(&items[4])?;
        let view = match items.get(5) {
            None | Some(Value::None) => None,
            Some(Value::Tuple(view)) if view.items.len() == 3 => Some((index(&view.items[1])?, index(&view.items[2])?)),
            Some(_) => return Err(bad()),
        };
        let storage = Rc::new(StorageRef { key, dtype, numel, view, inline: None });
        self.storages.push(storage.clone());
        Ok(Value::Storage(storage))
    }

    /// Runs one opcode; the root value once `STOP` is reached.
    fn step(&mut self) -> Step<Option<Value>> {
        let opcode = self.byte()?;
        match opcode {
            // PROTO
            0x80 => {
                let protocol = self.byte()?;
                if protocol > 5 {
                    return Err(PickleProblem::Protocol { protocol });
                }
            }
            // FRAME: the length of the next frame, which changes nothing here.
            0x95 => {
                self.u64()?;
            }
            b'.' => {
                let root = self.pop()?;
                return Ok(Some(root));
            }
            b'}' => {
                let id = self.container(Container::Dict(Vec::new()));
                self.push(Value::Dict(id))?;
            }
            b']' => {
                let id = self.container(Container::List(Vec::new()));
                self.push(Value::List(id))?;
            }
            b')' => {
                let tuple = self.tuple(Vec::new())?;
                self.push(tuple)?;
            }
            b'(' => {
                if self.marks.len() >= MAX_DEPTH {
                    return Err(limit(PickleLimit::Depth { max: MAX_DEPTH }));
                }
                self.marks.push(self.stack.len());
            }
            b'0' => {
                self.pop()?;
            }
            b'1' => {
                self.pop_mark()?;
            }
            b'2' => {
                let top = self.top()?.clone();
                self.push(top)?;
            }
            b'X' => {
                let len = self.u32()? as usize;
                let value = self.string(len)?;
                self.push(value)?;
            }
            b'B' => {
                let len = self.u32()? as usize;
                let bytes = Value::Bytes(Rc::from(self.take(len)?));
                self.push(bytes)?;
            }
            b'C' => {
                let len = self.byte()? as usize;
                let bytes = Value::Bytes(Rc::from(self.take(len)?));
                self.push(bytes)?;
            }
            0x8c => {
                let len = self.byte()? as usize;
                let value = self.string(len)?;
                self.push(value)?;
            }
            0x8d => {
                let len = usize::try_from(self.u64()?).map_err(|_| PickleProblem::Truncated)?;
                let value = self.string(len)?;
                self.push(value)?;
            }
            b'J' => {
                let value = i32::from_le_bytes(self.take(4)?.try_into().expect("four bytes"));
                self.push(Value::Int(value.into()))?;
            }
            b'K' => {
                let value = self.byte()?;
                self.push(Value::Int(value.into()))?;
            }
            b'M' => {
                let value = self.u16()?;
                self.push(Value::Int(value.into()))?;
            }
            // LONG1: a little-endian two's complement integer of up to 8 bytes here.
            0x8a => {
                let len = self.byte()? as usize;
                if len > 8 {
                    return Err(PickleProblem::LargeInteger { bytes: len });
                }
                let bytes = self.take(len)?;
                let negative = bytes.last().is_some_and(|&b| b & 0x80 != 0);
                let mut word = if negative { [0xff; 8] } else { [0; 8] };
                word[..len].copy_from_slice(bytes);
                self.push(Value::Int(i64::from_le_bytes(word)))?;
            }
            b'G' => {
                let value = f64::from_be_bytes(self.take(8)?.try_into().expect("eight bytes"));
                self.push(Value::Float(value))?;
            }
            0x88 => self.push(Value::Bool(true))?,
            0x89 => self.push(Value::Bool(false))?,
            b'N' => self.push(Value::None)?,
            b't' => {
                let items = self.pop_mark()?;
                let tuple = self.tuple(items)?;
                self.push(tuple)?;
            }
            0x85..=0x87 => {
                let len = usize::from(opcode - 0x84);
                let mut items = Vec::with_capacity(len);
                for _ in 0..len {
                    items.push(self.pop()?);
                }
                items.reverse();
                let tuple = self.tuple(items)?;
                self.push(tuple)?;
            }
            b's' => {
                let value = self.pop()?;
                let key = self.pop()?;
                self.set_items(vec![key, value])?;
            }
            b'u' => {
                let items = self.pop_mark()?;
                self.set_items(items)?;
            }
            b'a' => {
                let value = self.pop()?;
                self.append(vec![value])?;
            }
            b'e' => {
                let items = self.pop_mark()?;
                self.append(items)?;
            }
            b'q' => {
                let index = self.byte()? as usize;
                self.memo_put(index)?;
            }
            b'r' => {
                let index = self.u32()? as usize;
                self.memo_put(index)?;
            }
            0x94 => {
                let index = self.memo.len();
                self.memo_put(index)?;
            }
            b'h' => {
                let index = self.byte()? as usize;
                self.memo_get(index)?;
            }
            b'j' => {
                let index = self.u32()? as usize;
                self.memo_get(index)?;
            }
            b'c' => {
                let module = self.line()?.to_string();
                let name = self.line()?.to_string();
                self.global(&module, &name)?;
            }
            0x93 => {
                let name = self.pop()?;
                let module = self.pop()?;
                let (Value::Str(module), Value::Str(name)) = (module, name) else {
                    return Err(PickleProblem::Unexpected { opcode: "STACK_GLOBAL", expected: "two strings" });
                };
                self.global(&module, &name)?;
            }
            b'R' => {
                let args = self.pop()?;
                let callable = self.pop()?;
                let value = self.call(callable, args, "REDUCE")?;
                self.push(value)?;
            }
            0x81 => {
                let args = self.pop()?;
                let class = self.pop()?;
                let value = self.call(class, args, "NEWOBJ")?;
                self.push(value)?;
            }
            // BUILD: an admitted object keeps its state (its fields); the state of a dict (an
            // `OrderedDict`'s attributes) or of a tensor is not needed and is dropped.
            b'b' => {
                let built = self.pop()?;
                match *self.top()? {
                    Value::Object(id) => match &mut self.containers[id] {
                        Container::Object { state: state @ None, .. } => *state = Some(built),
                        _ => {
                            return Err(PickleProblem::Unexpected {
                                opcode: "BUILD",
                                expected: "an object built once",
                            });
                        }
                    },
                    Value::Dict(_) | Value::Tensor(_) => {}
                    _ => return Err(PickleProblem::Unexpected { opcode: "BUILD", expected: "a dict or a tensor" }),
                }
            }
            b'Q' => {
                let id = self.pop()?;
                let value = self.persistent(id)?;
                self.push(value)?;
            }
            b'P' => {
                let id = self.line()?;
                return Err(PickleProblem::TextPersistentId { id: id.to_string() });
            }
            other => return Err(PickleProblem::UnknownOpcode { opcode: other }),
        }
        Ok(None)
    }
}

/// A non-negative integer that fits `usize`.
fn index(value: &Value) -> Step<usize> {
    match value {
        Value::Int(value) => usize::try_from(*value).map_err(|_| PickleProblem::NegativeOrHuge { value: *value }),
        _ => Err(PickleProblem::Unexpected { opcode: "REDUCE", expected: "a non-negative integer" }),
    }
}

/// A tuple of non-negative integers (a size or a stride).
fn indexes(value: &Value) -> Step<Vec<usize>> {
    match value {
        Value::Tuple(tuple) => tuple.items.iter().map(index).collect(),
        _ => Err(PickleProblem::Unexpected { opcode: "REDUCE", expected: "a tuple of integers" }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problem(bytes: &[u8]) -> PickleProblem {
        unpickle(bytes, 0).err().expect("the pickle is refused").problem
    }

    #[test]
    fn reads_plain_values_and_shares_memo_entries() {
        // {'a': [1, 2.5, 'x'], 'b': <memo 0>} with the list memoized and fetched again.
        let mut bytes = b"\x80\x02}(X\x01\x00\x00\x00a]q\x00(K\x01G".to_vec();
        bytes.extend(2.5f64.to_be_bytes());
        bytes.extend(b"\x8c\x01xeX\x01\x00\x00\x00bh\x00u.");
        let unpickled = unpickle(&bytes, 0).unwrap();
        let Value::Dict(id) = unpickled.root else { panic!("a dict") };
        let Container::Dict(pairs) = &unpickled.containers[id] else { panic!("a dict") };
        assert_eq!(pairs.len(), 2);
        let (Value::List(first), Value::List(second)) = (&pairs[0].1, &pairs[1].1) else { panic!("lists") };
        assert_eq!(first, second, "the memo shares the list");
        assert_eq!(unpickled.containers.len(), 2);
        assert_eq!(unpickled.end, bytes.len());
    }

    #[test]
    fn refuses_unknown_globals_by_name() {
        let found = problem(b"\x80\x02cbuiltins\neval\nX\x01\x00\x00\x001\x85R.");
        assert!(
            matches!(&found, PickleProblem::ForbiddenGlobal { module, name } if module == "builtins" && name == "eval"),
            "{found:?}"
        );
        let found = problem(b"\x80\x04\x8c\x05posix\x8c\x06system\x93.");
        assert!(matches!(&found, PickleProblem::ForbiddenGlobal { name, .. } if name == "system"), "{found:?}");
    }

    #[test]
    fn limits_hold() {
        assert!(matches!(problem(b"\x80\x02Nr\xff\xff\xff\xff."), PickleProblem::Limit { .. }));
        assert!(matches!(problem(&[b'('; MAX_DEPTH + 1]), PickleProblem::Limit { .. }));
        let mut nested = b"\x80\x02N".to_vec();
        nested.extend([0x85; MAX_DEPTH + 1]);
        assert!(matches!(problem(&nested), PickleProblem::Limit { .. }));
        assert!(matches!(problem(b"\x80\x02h\x05."), PickleProblem::MemoMissing { index: 5 }));
        assert!(matches!(problem(b"\x80\x02X\xff\x00\x00\x00ab"), PickleProblem::Truncated));
        assert!(matches!(problem(b"\x80\x02."), PickleProblem::StackUnderflow));
        assert!(matches!(problem(b"\x80\x02I1\n."), PickleProblem::UnknownOpcode { opcode: b'I' }));
    }
}
