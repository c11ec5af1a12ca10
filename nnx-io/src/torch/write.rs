//! Writing what `torch.save` and `pickle` write, for the few objects nnx saves in torch's
//! formats: a pickle stream of protocol 2 built opcode by opcode (no memo: every value is
//! written where it is used), and a `torch.save` zip of one tensor.

use std::io::{Cursor, Write};

use nnx_core::DType;
use zip::write::SimpleFileOptions;
use zip::{CompressionMethod, ZipWriter};

/// A pickle stream under construction.
pub(crate) struct Pickle {
    bytes: Vec<u8>,
}

impl Pickle {
    /// A stream of protocol 2, as `torch.save` writes.
    pub(crate) fn new() -> Pickle {
        Pickle { bytes: vec![0x80, 2] }
    }

    /// Ends the stream with `STOP` and gives its bytes.
    pub(crate) fn finish(mut self) -> Vec<u8> {
        self.bytes.push(b'.');
        self.bytes
    }

    /// Pushes the global `module.name`.
    pub(crate) fn global(&mut self, module: &str, name: &str) -> &mut Self {
        self.bytes.push(b'c');
        self.bytes.extend_from_slice(module.as_bytes());
        self.bytes.push(b'\n');
        self.bytes.extend_from_slice(name.as_bytes());
        self.bytes.push(b'\n');
        self
    }

    /// Pushes a string.
    pub(crate) fn text(&mut self, text: &str) -> &mut Self {
        self.bytes.push(b'X');
        self.bytes.extend_from_slice(&(text.len() as u32).to_le_bytes());
        self.bytes.extend_from_slice(text.as_bytes());
        self
    }

    /// Pushes an integer.
    pub(crate) fn int(&mut self, value: i64) -> &mut Self {
        match value {
            0..=0xff => self.bytes.extend_from_slice(&[b'K', value as u8]),
            0x100..=0xffff => {
                self.bytes.push(b'M');
                self.bytes.extend_from_slice(&(value as u16).to_le_bytes());
            }
            _ if i32::try_from(value).is_ok() => {
                self.bytes.push(b'J');
                self.bytes.extend_from_slice(&(value as i32).to_le_bytes());
            }
            _ => {
                self.bytes.extend_from_slice(&[0x8a, 8]);
                self.bytes.extend_from_slice(&value.to_le_bytes());
            }
        }
        self
    }

    /// Pushes a boolean.
    pub(crate) fn bool(&mut self, value: bool) -> &mut Self {
        self.bytes.push(if value { 0x88 } else { 0x89 });
        self
    }

    /// Pushes `None`.
    pub(crate) fn none(&mut self) -> &mut Self {
        self.bytes.push(b'N');
        self
    }

    /// Pushes a mark, which [`Pickle::tuple`], [`Pickle::set_items`] and [`Pickle::appends`]
    /// close.
    pub(crate) fn mark(&mut self) -> &mut Self {
        self.bytes.push(b'(');
        self
    }

    /// Makes the values since the mark a tuple.
    pub(crate) fn tuple(&mut self) -> &mut Self {
        self.bytes.push(b't');
        self
    }

    /// Pushes a tuple of integers.
    pub(crate) fn ints(&mut self, values: &[usize]) -> &mut Self {
        self.mark();
        for &value in values {
            self.int(value as i64);
        }
        self.tuple()
    }

    /// Pushes an empty dict.
    pub(crate) fn dict(&mut self) -> &mut Self {
        self.bytes.push(b'}');
        self
    }

    /// Pushes an empty list.
    pub(crate) fn list(&mut self) -> &mut Self {
        self.bytes.push(b']');
        self
    }

    /// Adds the key and value pairs since the mark to the dict below it.
    pub(crate) fn set_items(&mut self) -> &mut Self {
        self.bytes.push(b'u');
        self
    }

    /// Adds the values since the mark to the list below it.
    pub(crate) fn appends(&mut self) -> &mut Self {
        self.bytes.push(b'e');
        self
    }

    /// Calls the callable below the argument tuple on top.
    pub(crate) fn reduce(&mut self) -> &mut Self {
        self.bytes.push(b'R');
        self
    }

    /// Makes an instance of the class below the argument tuple on top, without running its
    /// `__init__`, as `pickle` does for dataclasses.
    pub(crate) fn new_object(&mut self) -> &mut Self {
        self.bytes.push(0x81);
        self
    }

    /// Sets the state on top as the state of the object below it.
    pub(crate) fn build(&mut self) -> &mut Self {
        self.bytes.push(b'b');
        self
    }

    /// Replaces the tuple on top by the object it names (a storage, for `torch.save`).
    pub(crate) fn persistent_id(&mut self) -> &mut Self {
        self.bytes.push(b'Q');
        self
    }
}

/// The typed storage class `torch.save` names for `dtype`; `None` for dtypes torch has no
/// storage class of (FP8, say), which torch names by `torch.UntypedStorage` and a dtype nnx does
/// not write.
fn storage_class(dtype: DType) -> Option<&'static str> {
    Some(match dtype {
        DType::F64 => "DoubleStorage",
        DType::F32 => "FloatStorage",
        DType::F16 => "HalfStorage",
        DType::BF16 => "BFloat16Storage",
        DType::I64 => "LongStorage",
        DType::I32 => "IntStorage",
        DType::I16 => "ShortStorage",
        DType::I8 => "CharStorage",
        DType::U8 => "ByteStorage",
        DType::Bool => "BoolStorage",
        _ => return None,
    })
}

/// Whether `torch.save` (and so nnx writing its formats) can store `dtype`.
pub(crate) fn saves(dtype: DType) -> bool {
    storage_class(dtype).is_some()
}

/// The bytes of `torch.save(tensor)` for a contiguous tensor of `dtype` and `shape` whose
/// row-major bytes are `data`: a zip of `archive/data.pkl`, `archive/data/0`,
/// `archive/byteorder` and `archive/version`, stored uncompressed, records aligned to 64 bytes
/// as torch aligns them.
///
/// # Panics
/// For a dtype [`saves`] refuses; callers check first.
pub(crate) fn save_tensor(dtype: DType, shape: &[usize], data: &[u8]) -> std::io::Result<Vec<u8>> {
    let class = storage_class(dtype).expect("callers check that torch stores the dtype");
    let numel: usize = shape.iter().product();
    let mut strides = vec![1usize; shape.len()];
    for axis in (0..shape.len().saturating_sub(1)).rev() {
        strides[axis] = strides[axis + 1] * shape[axis + 1];
    }
    let mut pickle = Pickle::new();
    pickle.global("torch._utils", "_rebuild_tensor_v2").mark();
    pickle
        .mark()
        .text("storage")
        .global("torch", class)
        .text("0")
        .text("cpu")
        .int(numel as i64)
        .tuple()
        .persistent_id();
    pickle.int(0).ints(shape).ints(&strides).bool(false);
    pickle.global("collections", "OrderedDict").mark().tuple().reduce();
    pickle.tuple().reduce();
    let pickle = pickle.finish();

    let mut zip = ZipWriter::new(Cursor::new(Vec::with_capacity(data.len() + pickle.len() + 1024)));
    let stored = SimpleFileOptions::default().compression_method(CompressionMethod::Stored).with_alignment(64);
    let records: [(&str, &[u8]); 4] = [
        ("archive/data.pkl", &pickle),
        ("archive/byteorder", b"little"),
        ("archive/data/0", data),
        ("archive/version", b"3\n"),
    ];
    for (name, bytes) in records {
        zip.start_file(name, stored).map_err(std::io::Error::other)?;
        zip.write_all(bytes)?;
    }
    Ok(zip.finish().map_err(std::io::Error::other)?.into_inner())
}
