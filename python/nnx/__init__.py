"""nnx: neural-network weights from Python, over nnx's Rust core.

Every archive nnx reads opens with :func:`open`; tensors come back as numpy arrays that are
views of the mapped file wherever the stored dtype is a numpy dtype (BF16 and FP8 through
``ml_dtypes``), and stay valid after the archive is closed or dropped: each array keeps the
mapping it views alive.
"""

from __future__ import annotations

import builtins
import os
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from . import _nnx
from ._errors import EntryError, Error, FormatError, IoError, RemoteError

__version__ = _nnx.__version__
Tensor = _nnx.Tensor

__all__ = [
    "Archive",
    "EntryError",
    "Error",
    "FormatError",
    "IoError",
    "RemoteError",
    "SafeSlice",
    "Tensor",
    "TensorInfo",
    "convert",
    "dequantize",
    "open",
    "quantize",
    "safe_open",
    "save_file",
    "types",
]

# The ml_dtypes types of nnx's dtypes numpy lacks; their bytes arrive as unsigned integers of
# their width and are viewed as these.
_ML_DTYPES = {
    "BF16": "bfloat16",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
    "F8_E8M0": "float8_e8m0fnu",
    "F8_E4M3FNUZ": "float8_e4m3fnuz",
    "F8_E5M2FNUZ": "float8_e5m2fnuz",
}

# The dtypes `Archive.dequantize` widens as numpy does.
_INTEGERS = {"I8", "I16", "I32", "I64", "U8", "U16", "U32", "U64", "BOOL"}

# nnx's dtype names of numpy's dtypes, for saving.
_NNX_DTYPES = {
    "float64": "F64",
    "float32": "F32",
    "float16": "F16",
    "int64": "I64",
    "int32": "I32",
    "int16": "I16",
    "int8": "I8",
    "uint8": "U8",
    "uint16": "U16",
    "uint32": "U32",
    "bool": "BOOL",
    "complex64": "C64",
    "bfloat16": "BF16",
    "float8_e4m3fn": "F8_E4M3",
    "float8_e5m2": "F8_E5M2",
    "float8_e8m0fnu": "F8_E8M0",
}


def _ml_dtype(name: str) -> np.dtype:
    import ml_dtypes

    return np.dtype(getattr(ml_dtypes, _ML_DTYPES[name]))


def _view(raw: Any, name: str, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
    """The numpy array viewing a tensor's bytes ``raw`` (whose array interface gives them as
    numpy's type of their width), as ``ml_dtypes``' type for BF16 and FP8; what
    ``Tensor.__array__`` returns. ``base`` keeps the bytes alive."""
    array = np.asarray(raw)
    if name in _ML_DTYPES:
        array = array.view(_ml_dtype(name))
    if dtype is not None and np.dtype(dtype) != array.dtype:
        if copy is False:
            raise ValueError(f"a {name} tensor cannot be read as {np.dtype(dtype)} without a copy")
        return array.astype(dtype)
    return array.copy() if copy else array



class TensorInfo:
    """What an archive says about one entry, from headers alone."""

    __slots__ = ("name", "dtype", "shape", "nbytes", "offset", "file")

    def __init__(self, name: str, dtype: str, shape: tuple[int, ...], nbytes: int, offset: int | None, file: str | None):
        self.name = name
        self.dtype = dtype
        self.shape = shape
        self.nbytes = nbytes
        self.offset = offset
        self.file = file

    def __repr__(self) -> str:
        return f"TensorInfo(name={self.name!r}, dtype={self.dtype!r}, shape={self.shape}, nbytes={self.nbytes})"


class Archive(Mapping):
    """An opened archive: names, metadata, and tensors read on demand from the mapped files."""

    def __init__(self, inner: Any):
        self._inner = inner
        self.path: str = inner.path

    def _archive(self) -> Any:
        if self._inner is None:
            raise Error(f"`{self.path}` was closed: open it again")
        return self._inner

    def keys(self) -> list[str]:  # type: ignore[override]
        return self._archive().keys()

    def metadata(self) -> dict[str, Any]:
        return self._archive().metadata()

    def info(self, name: str) -> TensorInfo:
        name_, dtype, shape, nbytes, offset, file = self._archive().info(name)
        return TensorInfo(name_, dtype, tuple(shape), nbytes, offset, file)

    def tensor(self, name: str) -> Tensor:
        return self._archive().tensor(name)

    def __getitem__(self, name: str) -> np.ndarray:
        return np.asarray(self._archive().tensor(name))

    def get(self, name: str, default: Any = None) -> Any:  # type: ignore[override]
        if name not in self:
            return default
        return self[name]

    def dequantize(self, name: str) -> np.ndarray:
        dtype = self.info(name).dtype
        if dtype in _INTEGERS or dtype.startswith("F8_"):
            # Integers, booleans and FP8 (through ml_dtypes, exactly), widened as numpy does.
            return self[name].astype(np.float32)
        return np.asarray(self._archive().dequantize(name))

    def close(self) -> None:
        self._inner = None

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self._archive().__contains__(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())

    def __len__(self) -> int:
        return len(self._archive())

    def __enter__(self) -> Archive:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._inner is None else f"{len(self)} entries"
        return f"nnx.Archive({self.path!r}, {state})"


def open(path: str | os.PathLike[str]) -> Archive:  # noqa: A001 - the name users expect
    """Opens any archive nnx reads (see the package's documentation)."""
    return Archive(_nnx.open(os.fspath(path)))


class SafeSlice:
    """A lazily sliced entry, as ``safetensors``' ``get_slice`` gives it: indexing views the
    mapped file, copying nothing."""

    def __init__(self, archive: Archive, name: str):
        self._archive = archive
        self._name = name
        self._info = archive.info(name)

    def get_shape(self) -> list[int]:
        return list(self._info.shape)

    def get_dtype(self) -> str:
        return self._info.dtype

    def __getitem__(self, index: Any) -> np.ndarray:
        return self._archive[self._name][index]


class safe_open:  # noqa: N801 - the name safetensors gives it
    """``safetensors.safe_open`` over nnx, for numpy."""

    def __init__(self, filename: str | os.PathLike[str], framework: str = "numpy", device: str = "cpu"):
        if framework not in ("numpy", "np"):
            raise ValueError(f"nnx.safe_open gives numpy arrays: framework={framework!r} is not `numpy`")
        if device != "cpu":
            raise ValueError(f"nnx.safe_open reads into memory: device={device!r} is not `cpu`")
        self._archive = open(filename)

    def __enter__(self) -> safe_open:
        return self

    def __exit__(self, *exc: object) -> None:
        self._archive.close()

    def keys(self) -> list[str]:
        return sorted(self._archive.keys())

    def offset_keys(self) -> list[str]:
        return self._archive.keys()

    def metadata(self) -> dict[str, str] | None:
        metadata = self._archive.metadata()
        return {key: str(value) for key, value in metadata.items()} or None

    def get_tensor(self, name: str) -> np.ndarray:
        return self._archive[name]

    def get_slice(self, name: str) -> SafeSlice:
        return SafeSlice(self._archive, name)


def _contiguous(array: Any, what: str) -> np.ndarray:
    # `require`, not `ascontiguousarray`, which makes a 0-d array 1-d.
    array = np.require(np.asarray(array), requirements="C")
    if array.dtype.hasobject:
        raise TypeError(f"{what}: an array of Python objects has no bytes to write")
    return array


# safetensors' list of dtypes, whose order its writer sorts by.
_SAFETENSORS_ORDER = {
    name: rank
    for rank, name in enumerate(
        ["BOOL", "F4", "F6_E2M3", "F6_E3M2", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0", "I16", "U16", "F16", "BF16",
         "I32", "U32", "F32", "C64", "F64", "I64", "U64"]
    )
}


def _dtype_of(value: Any) -> str:
    return _NNX_DTYPES.get(np.asarray(value).dtype.name, "")


def save_file(
    tensors: dict[str, np.ndarray], filename: str | os.PathLike[str], metadata: dict[str, str] | None = None
) -> None:
    """Writes ``tensors`` as one SafeTensors file, atomically (a temporary file renamed into
    place)."""
    entries = []
    # The order safetensors writes: by dtype, widest first in its list, then by name, so that
    # the file is laid out as `safetensors.numpy.save_file` lays it out.
    ordered = sorted(tensors.items(), key=lambda item: (-_SAFETENSORS_ORDER.get(_dtype_of(item[1]), -1), item[0]))
    for name, value in ordered:
        array = _contiguous(value, f"`{name}`")
        dtype = _NNX_DTYPES.get(array.dtype.name)
        if dtype is None:
            raise TypeError(f"`{name}`: SafeTensors holds no {array.dtype} values")
        address = array.__array_interface__["data"][0]
        entries.append((name, dtype, list(array.shape), address, array.nbytes, array))
    if metadata is not None and not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
        raise TypeError("metadata: SafeTensors keeps strings, keys and values")
    _nnx.save_file(entries, os.fspath(filename), metadata)


def quantize(array: np.ndarray, type: str) -> np.ndarray:  # noqa: A002 - ggml's word
    """Encodes ``array`` into ggml type ``type``, bit-exact with llama.cpp and the ``gguf``
    package: a ``uint8`` array of shape ``(*rows, bytes_per_row)``."""
    values = np.ascontiguousarray(array, dtype=np.float32)
    if values.ndim == 0:
        values = values.reshape(1)
    address = values.__array_interface__["data"][0]
    return np.asarray(_nnx.quantize(address, list(values.shape), type, values))


def dequantize(data: bytes | np.ndarray, type: str, shape: tuple[int, ...] | list[int]) -> np.ndarray:  # noqa: A002
    """Decodes the blocks ``data`` of ggml type ``type`` into a float32 array of ``shape``."""
    raw = np.frombuffer(data, dtype=np.uint8) if isinstance(data, (bytes, bytearray, memoryview)) else data
    raw = np.require(np.asarray(raw), requirements="C")
    address = raw.__array_interface__["data"][0] if raw.nbytes else 0
    return np.asarray(_nnx.dequantize(address, raw.nbytes, type, list(shape), raw))


def types() -> list[str]:
    """The ggml types nnx encodes and decodes."""
    return _nnx.types()


def convert(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    type: str | None = None,  # noqa: A002
    *,
    dtype: str | None = None,
    tensor_types: dict[str, str] | None = None,
    max_shard_size: str | int | None = None,
) -> str:
    """``nnx convert``: returns its summary line."""
    args = [os.fspath(src), os.fspath(dst)]
    if type is not None:
        args += ["--type", type]
    if dtype is not None:
        args += ["--dtype", dtype]
    for pattern, ty in (tensor_types or {}).items():
        args += ["--tensor-type", f"{pattern}={ty}"]
    if max_shard_size is not None:
        args += ["--max-shard-size", builtins.str(max_shard_size)]
    return _nnx.convert(args).strip()
