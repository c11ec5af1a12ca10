//! The `nnx` Python package's extension module, `nnx._nnx`: archives opened by nnx's readers,
//! tensors handed to numpy as views of the mapped files (`__array_interface__`, which keeps the
//! tensor and so its mapping alive) and to torch and jax through DLPack, ggml's types encoded
//! and decoded, SafeTensors written, and `nnx convert`. The Python layer (`python/nnx`) gives
//! these their final form (numpy arrays, `ml_dtypes` for BF16 and FP8, `safe_open`).
//!
//! Every long call (opening, reading, decoding, converting) runs with the interpreter released,
//! and every error of nnx becomes one of `nnx.Error`'s classes with nnx's message.

mod dlpack;

use std::path::PathBuf;
use std::sync::Arc;

use nnx::gguf::{Array as GgufArray, Value as GgufValue};
use nnx::quant::ggml::GgmlType;
use nnx::{Archive, DType, Tensor};
use pyo3::exceptions::{PyAttributeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};

/// nnx's error as the class of `nnx` (defined in Python, `nnx/_errors.py`, so that
/// `EntryError` can be a `KeyError` too) that fits it.
fn error(py: Python<'_>, error: nnx::Error) -> PyErr {
    let class = match &error {
        nnx::Error::Io { .. } | nnx::Error::EmptyFolder { .. } => "IoError",
        nnx::Error::NoEntry { .. } => "EntryError",
        nnx::Error::Remote { .. } | nnx::Error::Hub { .. } => "RemoteError",
        _ => "FormatError",
    };
    raise(py, class, error.to_string())
}

/// An error of the `nnx` class `class` carrying `message`.
fn raise(py: Python<'_>, class: &str, message: String) -> PyErr {
    match py.import("nnx._errors").and_then(|module| module.getattr(class)) {
        Ok(class) => PyErr::from_type(class.cast_into().expect("an exception class"), message),
        Err(import) => import,
    }
}

/// What nnx calls a dtype: ggml's name for GGUF block types, nnx's for the others.
fn dtype_name(dtype: DType, ggml: Option<GgmlType>) -> String {
    match ggml {
        Some(ty) if ty.is_quantized() => ty.name().to_string(),
        _ => dtype.to_string(),
    }
}

/// numpy's type string of `dtype`'s bytes: types numpy lacks (BF16, FP8) go as unsigned integers
/// of their width, which the Python layer views as `ml_dtypes`' types.
fn typestr(dtype: DType) -> Option<&'static str> {
    Some(match dtype {
        DType::F64 => "<f8",
        DType::F32 => "<f4",
        DType::F16 => "<f2",
        DType::BF16 | DType::U16 => "<u2",
        DType::I64 => "<i8",
        DType::I32 => "<i4",
        DType::I16 => "<i2",
        DType::I8 => "|i1",
        DType::U8 | DType::F8E4M3 | DType::F8E5M2 | DType::F8E8M0 | DType::F8E4M3Fnuz | DType::F8E5M2Fnuz => "|u1",
        DType::U32 => "<u4",
        DType::Bool => "|b1",
        DType::C64 => "<c8",
        _ => return None,
    })
}

/// A tensor and where its bytes are: what an array made from it views.
pub(crate) struct Payload {
    /// Keeps the bytes (a mapping, or memory nnx made) alive.
    _tensor: Tensor,
    /// The address of the first element.
    pub(crate) ptr: usize,
    /// The bytes from `ptr` on that the tensor's elements span (all of them when contiguous).
    pub(crate) len: usize,
    pub(crate) dtype: DType,
    pub(crate) shape: Vec<usize>,
    /// Strides in elements where the tensor is a strided view of its storage (a transposed
    /// tensor of a PyTorch checkpoint, sharing a storage); `None` when row-major.
    pub(crate) strides: Option<Vec<usize>>,
    /// Bytes of a mapped file, which must not be written.
    pub(crate) read_only: bool,
}

impl Payload {
    /// The payload of `tensor`, whose array has `shape` (its own, or rows of bytes for ggml
    /// blocks).
    fn new(tensor: Tensor, shape: Vec<usize>) -> nnx::Result<Payload> {
        let (dtype, read_only) = (tensor.dtype(), tensor.is_mapped());
        if !tensor.is_contiguous()
            && tensor.shape() == shape.as_slice()
            && let Some(payload) = Payload::strided(&tensor, read_only)
        {
            return Ok(payload);
        }
        let (tensor, read_only) =
            if tensor.is_contiguous() { (tensor, read_only) } else { (tensor.contiguous(), false) };
        // A contiguous tensor's bytes are borrowed from its storage, which `_tensor` keeps.
        let (ptr, len) = {
            let bytes = tensor.to_bytes()?;
            (bytes.as_ptr() as usize, bytes.len())
        };
        Ok(Payload { _tensor: tensor, ptr, len, dtype, shape, strides: None, read_only })
    }

    /// A view of the tensor's storage with its strides, where its axes are a permutation of a
    /// row-major block of whole-byte elements (a transposed tensor): no copy.
    fn strided(tensor: &Tensor, read_only: bool) -> Option<Payload> {
        let element = tensor.dtype().size_in_bytes()?;
        let mut order: Vec<usize> = (0..tensor.rank()).collect();
        order.sort_by_key(|&axis| std::cmp::Reverse(tensor.strides()[axis]));
        let block = tensor.permute(&order).ok()?;
        if !block.is_contiguous() {
            return None;
        }
        let whole = block.reshape(&[tensor.len()]).ok()?;
        let ptr = whole.to_bytes().ok()?.as_ptr() as usize;
        Some(Payload {
            _tensor: whole,
            ptr,
            len: tensor.len() * element,
            dtype: tensor.dtype(),
            shape: tensor.shape().to_vec(),
            strides: Some(tensor.strides().to_vec()),
            read_only,
        })
    }

    /// The interface numpy reads (version 3), with `typestr`; the array made keeps `owner`.
    fn interface<'py>(&self, py: Python<'py>, typestr: &str) -> PyResult<Bound<'py, PyDict>> {
        let dict = PyDict::new(py);
        dict.set_item("version", 3)?;
        dict.set_item("shape", PyTuple::new(py, &self.shape)?)?;
        dict.set_item("typestr", typestr)?;
        // numpy refuses a null address even for no elements; any address of an empty run does.
        let address = if self.ptr == 0 { std::ptr::NonNull::<u64>::dangling().as_ptr() as usize } else { self.ptr };
        dict.set_item("data", (address, self.read_only))?;
        match &self.strides {
            Some(strides) => {
                let element = self.dtype.size_in_bytes().unwrap_or(1);
                dict.set_item("strides", PyTuple::new(py, strides.iter().map(|&stride| stride * element))?)?
            }
            None => dict.set_item("strides", py.None())?,
        }
        Ok(dict)
    }

    /// The bytes the elements span, valid while the payload lives.
    fn bytes(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: `ptr..ptr + len` lie in `_tensor`'s storage, taken from a borrow of it
        // (`to_bytes` of a contiguous tensor or of the whole storage), and `_tensor` lives as
        // long as `self`.
        unsafe { std::slice::from_raw_parts(self.ptr as *const u8, self.len) }
    }

    /// The elements copied into a row-major tensor of their own.
    pub(crate) fn copied(&self) -> nnx::Result<Tensor> {
        let bytes = self.bytes();
        match &self.strides {
            None => Tensor::from_bytes(self.dtype, &self.shape, bytes),
            Some(strides) => {
                let span = bytes.len() / self.dtype.size_in_bytes().unwrap_or(1);
                Tensor::from_bytes(self.dtype, &[span], bytes)?
                    .as_strided(&self.shape, strides, 0)
                    .map(|view| view.contiguous())
            }
        }
    }
}

/// A tensor held by nnx, which numpy takes without a copy (`__array_interface__`) and torch and
/// jax through DLPack.
#[pyclass(frozen, module = "nnx", name = "Tensor")]
struct PyTensor {
    payload: Arc<Payload>,
    /// The stored type's name (`"Q4_K"` for blocks, whose payload is their bytes).
    name: String,
}

#[pymethods]
impl PyTensor {
    /// The stored type as nnx names it.
    #[getter]
    fn dtype(&self) -> &str {
        &self.name
    }

    /// The shape of the array it gives.
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, &self.payload.shape)
    }

    /// Its bytes.
    #[getter]
    fn nbytes(&self) -> usize {
        self.payload.len
    }

    /// numpy's array interface (version 3) for dtypes numpy has: the bytes at their address,
    /// read-only for mapped files; the array made keeps this object, and so the bytes, alive.
    /// BF16 and FP8 have none (numpy would see integers): `numpy.asarray` then calls
    /// `__array__`, which views them as `ml_dtypes`' types.
    #[getter]
    fn __array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let payload = &self.payload;
        if needs_ml_dtypes(payload.dtype) {
            return Err(PyAttributeError::new_err(format!(
                "numpy has no {} type: `numpy.asarray` takes it through `__array__`",
                payload.dtype
            )));
        }
        let typestr = typestr(payload.dtype)
            .ok_or_else(|| PyTypeError::new_err(format!("numpy holds no {} values", payload.dtype)))?;
        payload.interface(py, typestr)
    }

    /// The values as a numpy array sharing this tensor's memory (`ml_dtypes`' types for BF16
    /// and FP8); cast to `dtype`, or copied, where asked.
    #[pyo3(signature = (dtype=None, copy=None))]
    fn __array__<'py>(
        &self,
        py: Python<'py>,
        dtype: Option<Py<PyAny>>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let bytes = Py::new(py, RawBytes { payload: self.payload.clone() })?;
        py.import("nnx")?.getattr("_view")?.call1((bytes, self.payload.dtype.as_str(), dtype, copy))
    }

    /// The values as a numpy array sharing this tensor's memory.
    fn numpy<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.__array__(py, None, None)
    }

    /// DLPack: a capsule torch, jax and numpy take without a copy. A consumer that asks for
    /// DLPack 1.0 or later gets a versioned capsule flagged read-only for mapped files; an older
    /// one, which cannot be told the bytes are read-only, gets a copy of a mapped file's bytes.
    #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__(
        &self,
        py: Python<'_>,
        stream: Option<Py<PyAny>>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Py<PyAny>> {
        let _ = stream;
        if let Some(device) = dl_device
            && device != (1, 0)
        {
            return Err(pyo3::exceptions::PyBufferError::new_err("nnx's tensors are on the CPU (device (1, 0))"));
        }
        dlpack::capsule(py, &self.payload, max_version.is_some_and(|(major, _)| major >= 1), copy == Some(true))
    }

    /// The device: the CPU.
    fn __dlpack_device__(&self) -> (i32, i32) {
        (1, 0)
    }

    fn __repr__(&self) -> String {
        format!("nnx.Tensor(dtype={}, shape={:?})", self.name, self.payload.shape)
    }
}

/// The bytes of a tensor, as numpy's array interface of their raw type: what the Python layer
/// views as BF16 or FP8.
#[pyclass(frozen, module = "nnx", name = "_RawBytes")]
struct RawBytes {
    payload: Arc<Payload>,
}

#[pymethods]
impl RawBytes {
    #[getter]
    fn __array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let typestr = typestr(self.payload.dtype)
            .ok_or_else(|| PyTypeError::new_err(format!("numpy holds no {} values", self.payload.dtype)))?;
        self.payload.interface(py, typestr)
    }
}

/// Whether numpy holds `dtype` only through `ml_dtypes`.
fn needs_ml_dtypes(dtype: DType) -> bool {
    matches!(dtype, DType::BF16 | DType::F8E4M3 | DType::F8E5M2 | DType::F8E8M0 | DType::F8E4M3Fnuz | DType::F8E5M2Fnuz)
}

fn tensor_object(py: Python<'_>, tensor: Tensor, name: String, shape: Vec<usize>) -> PyResult<Py<PyTensor>> {
    let payload = Payload::new(tensor, shape).map_err(|e| error(py, e))?;
    Py::new(py, PyTensor { payload: Arc::new(payload), name })
}

/// `(name, dtype, shape, nbytes, offset, file)`: what `nnx.TensorInfo` is made of.
type InfoTuple = (String, String, Vec<usize>, usize, Option<usize>, Option<String>);

/// `(name, dtype, shape, address, byte count, array)`: an array to save, read in place.
type ArrayToSave = (String, String, Vec<usize>, usize, usize, Py<PyAny>);

/// An opened archive.
#[pyclass(frozen, module = "nnx", name = "_Archive")]
struct PyArchive {
    archive: Archive,
    path: String,
}

#[pymethods]
impl PyArchive {
    /// The path or URL it was opened from.
    #[getter]
    fn path(&self) -> &str {
        &self.path
    }

    /// The entry names, in the file's order.
    fn keys(&self) -> Vec<String> {
        self.archive.names().map(str::to_string).collect()
    }

    fn __len__(&self) -> usize {
        self.archive.len()
    }

    fn __contains__(&self, name: &str) -> bool {
        self.archive.contains(name)
    }

    /// The metadata: a GGUF file's keys with their typed values, or the text metadata of other
    /// formats.
    fn metadata<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let dict = PyDict::new(py);
        if let Some(gguf) = self.archive.gguf_metadata() {
            for (key, value) in gguf.iter() {
                dict.set_item(key, gguf_value(py, value)?)?;
            }
        } else {
            for (key, value) in self.archive.metadata() {
                dict.set_item(key, value)?;
            }
        }
        Ok(dict)
    }

    /// `(name, dtype, shape, nbytes, offset, file)` of entry `name`, from headers.
    fn info(&self, py: Python<'_>, name: &str) -> PyResult<InfoTuple> {
        let info = self.archive.info(name).map_err(|e| error(py, e))?;
        let dtype = dtype_name(info.dtype, self.archive.ggml_type(name));
        let (offset, file) = match &info.location {
            Some(location) => (Some(location.file_offset), Some(location.path.display().to_string())),
            None => (None, None),
        };
        Ok((info.name, dtype, info.shape, info.bytes, offset, file))
    }

    /// Entry `name` as stored: a view of the mapped file where it is one; the raw blocks, rows of
    /// bytes, for ggml block types.
    fn tensor(&self, py: Python<'_>, name: &str) -> PyResult<Py<PyTensor>> {
        let archive = &self.archive;
        let ggml = archive.ggml_type(name).filter(|ty| ty.is_quantized());
        if let Some(ty) = ggml {
            let blocks = py.detach(|| archive.ggml(name)).map_err(|e| error(py, e))?;
            let cols = blocks.shape.last().copied().unwrap_or(1);
            let mut shape = blocks.shape.clone();
            if let Some(last) = shape.last_mut() {
                *last = ty.row_bytes(cols).unwrap_or(0);
            }
            return tensor_object(py, blocks.data, ty.name().to_string(), shape);
        }
        let tensor = py.detach(|| archive.try_get(name)).map_err(|e| error(py, e))?;
        if tensor.dtype().size_in_bytes().is_none() {
            return Err(raise(
                py,
                "FormatError",
                format!("`{name}` holds {} values, which numpy cannot hold: `dequantize` it", tensor.dtype()),
            ));
        }
        let (dtype, shape) = (tensor.dtype(), tensor.shape().to_vec());
        tensor_object(py, tensor, dtype.to_string(), shape)
    }

    /// Entry `name` decoded to float32.
    fn dequantize(&self, py: Python<'_>, name: &str) -> PyResult<Py<PyTensor>> {
        let archive = &self.archive;
        let tensor = py
            .detach(|| -> nnx::Result<Tensor> {
                let dtype = archive.info(name)?.dtype;
                let blocks = archive.ggml_type(name).is_some_and(|ty| ty.is_quantized());
                // F16, BF16 and F64 go through ggml's decoders too: exact, a signalling NaN's
                // payload kept as gguf-py keeps it.
                if blocks || matches!(dtype, DType::F16 | DType::BF16 | DType::F64) {
                    archive.ggml(name)?.dequantize_to(DType::F32)
                } else {
                    let tensor = archive.try_get(name)?;
                    if tensor.dtype() == DType::F32 { Ok(tensor) } else { tensor.to_dtype(DType::F32) }
                }
            })
            .map_err(|e| error(py, e))?;
        let shape = tensor.shape().to_vec();
        tensor_object(py, tensor, "F32".into(), shape)
    }
}

/// A GGUF value as Python's: integers, floats, booleans, strings, and lists of them.
fn gguf_value<'py>(py: Python<'py>, value: &GgufValue) -> PyResult<Bound<'py, PyAny>> {
    Ok(match value {
        GgufValue::U8(v) => v.into_pyobject(py)?.into_any(),
        GgufValue::I8(v) => v.into_pyobject(py)?.into_any(),
        GgufValue::U16(v) => v.into_pyobject(py)?.into_any(),
        GgufValue::I16(v) => v.into_pyobject(py)?.into_any(),
        GgufValue::U32(v) => v.into_pyobject(py)?.into_any(),
        GgufValue::I32(v) => v.into_pyobject(py)?.into_any(),
        GgufValue::U64(v) => v.into_pyobject(py)?.into_any(),
        GgufValue::I64(v) => v.into_pyobject(py)?.into_any(),
        GgufValue::F32(v) => v.into_pyobject(py)?.into_any(),
        GgufValue::F64(v) => v.into_pyobject(py)?.into_any(),
        GgufValue::Bool(v) => v.into_pyobject(py)?.to_owned().into_any(),
        GgufValue::String(v) => v.into_pyobject(py)?.into_any(),
        GgufValue::Array(array) => gguf_array(py, array)?,
    })
}

fn gguf_array<'py>(py: Python<'py>, array: &GgufArray) -> PyResult<Bound<'py, PyAny>> {
    Ok(match array {
        GgufArray::U8(v) => PyList::new(py, v)?.into_any(),
        GgufArray::I8(v) => PyList::new(py, v)?.into_any(),
        GgufArray::U16(v) => PyList::new(py, v)?.into_any(),
        GgufArray::I16(v) => PyList::new(py, v)?.into_any(),
        GgufArray::U32(v) => PyList::new(py, v)?.into_any(),
        GgufArray::I32(v) => PyList::new(py, v)?.into_any(),
        GgufArray::U64(v) => PyList::new(py, v)?.into_any(),
        GgufArray::I64(v) => PyList::new(py, v)?.into_any(),
        GgufArray::F32(v) => PyList::new(py, v)?.into_any(),
        GgufArray::F64(v) => PyList::new(py, v)?.into_any(),
        GgufArray::Bool(v) => PyList::new(py, v)?.into_any(),
        GgufArray::String(v) => PyList::new(py, v)?.into_any(),
        GgufArray::Array(v) => {
            let items = v.iter().map(|inner| gguf_array(py, inner)).collect::<PyResult<Vec<_>>>()?;
            PyList::new(py, items)?.into_any()
        }
    })
}

/// Opens the archive at `path` (a path or a URL).
#[pyfunction]
fn open(py: Python<'_>, path: PathBuf) -> PyResult<PyArchive> {
    let archive = py.detach(|| Archive::open(&path)).map_err(|e| error(py, e))?;
    Ok(PyArchive { archive, path: path.display().to_string() })
}

/// The dtype nnx names `name` (`"F32"`, `"BF16"`, `"F8_E4M3"`, ...).
fn parse_dtype(name: &str) -> PyResult<DType> {
    name.parse::<DType>().map_err(|_| PyValueError::new_err(format!("`{name}` is not a dtype nnx knows")))
}

/// The bytes of a C-contiguous array, as `(address, byte count)` from its array interface.
///
/// # Safety
/// The caller keeps the array alive, and unchanged, while the bytes are used.
unsafe fn array_bytes<'a>(address: usize, len: usize) -> &'a [u8] {
    if len == 0 {
        return &[];
    }
    // SAFETY: the caller's contract: `address..address + len` are the bytes of a live array.
    unsafe { std::slice::from_raw_parts(address as *const u8, len) }
}

/// Writes the tensors `(name, dtype, shape, address, byte count, array)` as a SafeTensors file,
/// atomically; the arrays are read in place (the Python layer passes C-contiguous arrays and
/// keeps them alive for the call).
#[pyfunction]
#[pyo3(signature = (tensors, path, metadata=None))]
fn save_file(
    py: Python<'_>,
    tensors: Vec<ArrayToSave>,
    path: PathBuf,
    metadata: Option<std::collections::BTreeMap<String, String>>,
) -> PyResult<()> {
    let mut archive = Archive::new();
    for (name, dtype, shape, address, len, _keep) in &tensors {
        let dtype = parse_dtype(dtype)?;
        // SAFETY: the Python layer passes each array's own address and size, and `tensors`
        // (holding the arrays) lives until this function returns.
        let bytes = unsafe { array_bytes(*address, *len) };
        let tensor = Tensor::from_bytes(dtype, shape, bytes).map_err(|e| error(py, e))?;
        archive.insert(name.as_str(), tensor);
    }
    let options = nnx::SaveOptions { metadata: metadata.unwrap_or_default(), ..nnx::SaveOptions::default() };
    py.detach(|| archive.save_with(&path, &options)).map_err(|e| error(py, e))
}

/// The ggml type named `name`, or an error listing those nnx encodes.
fn ggml_type(py: Python<'_>, name: &str, encode: bool) -> PyResult<GgmlType> {
    let known = GgmlType::from_name(name).filter(|&ty| !encode || nnx::quant::ggml::can_quantize(ty));
    known.ok_or_else(|| {
        let listed: Vec<&str> =
            GgmlType::all()
                .filter(|&ty| {
                    if encode { nnx::quant::ggml::can_quantize(ty) } else { ty.is_quantized() || ty.block_size() == 1 }
                })
                .map(GgmlType::name)
                .collect();
        let what = if encode { "encodes" } else { "decodes" };
        raise(py, "Error", format!("`{name}` is not a ggml type nnx {what}: one of {}", listed.join(", ")))
    })
}

/// Encodes float32 values (`address`, `count` of an array of `shape`) as ggml type `ty`; the
/// blocks as a tensor of rows of bytes.
#[pyfunction]
fn quantize(py: Python<'_>, address: usize, shape: Vec<usize>, ty: &str, _keep: Py<PyAny>) -> PyResult<Py<PyTensor>> {
    let ty = ggml_type(py, ty, true)?;
    let count: usize = shape.iter().product();
    // SAFETY: the Python layer passes a live C-contiguous float32 array of `shape` (kept alive
    // by `_keep`).
    let bytes = unsafe { array_bytes(address, count * 4) };
    let values = Tensor::from_bytes(DType::F32, &shape, bytes).map_err(|e| error(py, e))?;
    let blocks = py.detach(|| nnx::gguf::GgmlTensor::quantize(&values, ty)).map_err(|e| error(py, e))?;
    let cols = shape.last().copied().unwrap_or(1);
    let mut rows = shape.clone();
    if let Some(last) = rows.last_mut() {
        *last = ty.row_bytes(cols).unwrap_or(0);
    }
    tensor_object(py, blocks.data, ty.name().to_string(), rows)
}

/// Decodes blocks of ggml type `ty` (`len` bytes at `address`, an array `_keep` holds) into
/// float32 of `shape`; the blocks are copied while the interpreter is held, then decoded
/// without it.
#[pyfunction]
fn dequantize(
    py: Python<'_>,
    address: usize,
    len: usize,
    ty: &str,
    shape: Vec<usize>,
    _keep: Py<PyAny>,
) -> PyResult<Py<PyTensor>> {
    let ty = ggml_type(py, ty, false)?;
    // SAFETY: the Python layer passes a live C-contiguous array's address and size, kept alive by
    // `_keep`, and reads it here with the interpreter held.
    let data = unsafe { array_bytes(address, len) };
    let bytes = Tensor::from_bytes(DType::U8, &[data.len()], data).map_err(|e| error(py, e))?;
    let blocks = nnx::gguf::GgmlTensor { ty, shape: shape.clone(), data: bytes };
    let values = py.detach(|| blocks.dequantize_to(DType::F32)).map_err(|e| error(py, e))?;
    tensor_object(py, values, "F32".into(), shape)
}

/// The ggml types nnx encodes.
#[pyfunction]
fn types() -> Vec<&'static str> {
    GgmlType::all().filter(|&ty| nnx::quant::ggml::can_quantize(ty)).map(GgmlType::name).collect()
}

/// `nnx convert` with `args`; the summary line.
#[pyfunction]
fn convert(py: Python<'_>, args: Vec<String>) -> PyResult<String> {
    py.detach(|| nnx_cli::convert(args)).map_err(|message| raise(py, "Error", message))
}

/// The module `nnx._nnx`.
#[pymodule]
fn _nnx(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_class::<PyArchive>()?;
    module.add_class::<PyTensor>()?;
    module.add_class::<RawBytes>()?;
    module.add_function(wrap_pyfunction!(open, module)?)?;
    module.add_function(wrap_pyfunction!(save_file, module)?)?;
    module.add_function(wrap_pyfunction!(quantize, module)?)?;
    module.add_function(wrap_pyfunction!(dequantize, module)?)?;
    module.add_function(wrap_pyfunction!(types, module)?)?;
    module.add_function(wrap_pyfunction!(convert, module)?)?;
    module.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
