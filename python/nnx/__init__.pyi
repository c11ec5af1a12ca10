"""nnx: neural-network weights from Python, over nnx's Rust core.

Every archive nnx reads opens with :func:`open`; tensors come back as numpy arrays that are
views of the mapped file wherever the stored dtype is a numpy dtype (BF16 and FP8 through
``ml_dtypes``), and stay valid after the archive is closed or dropped.
"""

from collections.abc import Iterator, Mapping
from os import PathLike
from typing import Any, Literal

import numpy as np

__version__: str

class Error(Exception):
    """Any error of nnx: the message names the file and entry, what was expected and what was
    found, and what to do."""

class IoError(Error):
    """A file or folder that cannot be opened, read or written."""

class FormatError(Error):
    """A file that is not a valid archive of its format (a damaged header, a refused pickle
    global, a truncated file)."""

class EntryError(Error, KeyError):
    """A name the archive does not hold."""

class RemoteError(Error):
    """A location in an object store or on the Hub that cannot be read."""

class TensorInfo:
    """What an archive says about one entry, from headers alone."""

    name: str
    dtype: str
    """The stored type as nnx names it: ``"F32"``, ``"BF16"``, ``"F8_E4M3"``, or a ggml block
    type such as ``"Q4_K"``."""
    shape: tuple[int, ...]
    """The logical shape, row-major (for GGUF, the reverse of ggml's ``ne``)."""
    nbytes: int
    """The bytes stored."""
    offset: int | None
    """The offset of the first byte in its file; ``None`` for entries not stored as one run."""
    file: str | None
    """The file the entry lies in."""

class Tensor:
    """A tensor held by nnx: a view of a mapped file or an array nnx made. ``numpy.asarray``
    takes it without a copy (``__array_interface__``), and so do torch and jax through DLPack."""

    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    @property
    def __array_interface__(self) -> dict[str, Any]: ...
    def __dlpack__(
        self,
        *,
        stream: int | None = None,
        max_version: tuple[int, int] | None = None,
        dl_device: tuple[int, int] | None = None,
        copy: bool | None = None,
    ) -> Any: ...
    def __dlpack_device__(self) -> tuple[int, int]: ...
    def numpy(self) -> np.ndarray:
        """The values as a numpy array sharing this tensor's memory."""

class Archive(Mapping[str, np.ndarray]):
    """An opened archive: names, metadata, and tensors read on demand from the mapped files."""

    path: str
    def keys(self) -> list[str]: ...  # type: ignore[override]
    def metadata(self) -> dict[str, Any]:
        """The archive's metadata: GGUF keys with their typed values (ints, floats, bools,
        strings, lists), or the string metadata of SafeTensors and other formats."""
    def info(self, name: str) -> TensorInfo: ...
    def get(self, name: str, default: Any = None) -> np.ndarray | Any: ...  # type: ignore[override]
    def tensor(self, name: str) -> Tensor:
        """Entry ``name`` as stored: for ggml block types, its raw blocks as ``uint8``."""
    def dequantize(self, name: str) -> np.ndarray:
        """Entry ``name`` decoded to float32 (any ggml block type, FP8, BF16, ...)."""
    def close(self) -> None:
        """Drops the archive's own references; arrays already returned stay valid."""
    def __getitem__(self, name: str) -> np.ndarray: ...
    def __contains__(self, name: object) -> bool: ...
    def __iter__(self) -> Iterator[str]: ...
    def __len__(self) -> int: ...
    def __enter__(self) -> Archive: ...
    def __exit__(self, *exc: object) -> None: ...

def open(path: str | PathLike[str]) -> Archive:
    """Opens any archive nnx reads: a SafeTensors file, shard index or folder, a PyTorch
    checkpoint (read without running its pickle), a GGUF file or split set, an MLX or SEED
    folder, a distributed checkpoint (PyTorch DCP, Orbax), ``hf://org/name[/file]``, or an
    object-store URL (``s3://``, ``gs://``, ``az://``, ``https://``)."""

class SafeSlice:
    """A lazily sliced entry, as ``safetensors``' ``get_slice`` gives it."""

    def get_shape(self) -> list[int]: ...
    def get_dtype(self) -> str: ...
    def __getitem__(self, index: Any) -> np.ndarray: ...

class safe_open:
    """``safetensors.safe_open`` over nnx: ``keys``, ``get_tensor``, ``get_slice`` and
    ``metadata``, as numpy arrays viewing the mapped file."""

    def __init__(self, filename: str | PathLike[str], framework: Literal["numpy", "np"] = "numpy", device: str = "cpu") -> None: ...
    def __enter__(self) -> safe_open: ...
    def __exit__(self, *exc: object) -> None: ...
    def keys(self) -> list[str]: ...
    def offset_keys(self) -> list[str]: ...
    def metadata(self) -> dict[str, str] | None: ...
    def get_tensor(self, name: str) -> np.ndarray: ...
    def get_slice(self, name: str) -> SafeSlice: ...

def save_file(tensors: dict[str, np.ndarray], filename: str | PathLike[str], metadata: dict[str, str] | None = None) -> None:
    """Writes ``tensors`` as one SafeTensors file, atomically (a temporary file renamed into
    place), as ``safetensors.numpy.save_file`` lays it out."""

def quantize(array: np.ndarray, type: str) -> np.ndarray:
    """Encodes ``array`` (float32, rows a multiple of the type's block size) into ggml type
    ``type`` (``"Q4_K"``, ``"IQ4_XS"``, ``"MXFP4"``, ...), bit-exact with llama.cpp and the
    ``gguf`` package: a ``uint8`` array of shape ``(*rows, bytes_per_row)``."""

def dequantize(data: bytes | np.ndarray, type: str, shape: tuple[int, ...] | list[int]) -> np.ndarray:
    """Decodes the blocks ``data`` of ggml type ``type`` into a float32 array of ``shape``."""

def types() -> list[str]:
    """The ggml types nnx encodes and decodes."""

def convert(src: str | PathLike[str], dst: str | PathLike[str], type: str | None = None, *, dtype: str | None = None, tensor_types: dict[str, str] | None = None, max_shard_size: str | int | None = None) -> str:
    """``nnx convert``: SafeTensors, PyTorch, GGUF, DCP or Orbax to SafeTensors, or to GGUF
    with llama.cpp's types and mixtures (``type="q4_k_m"``); returns the summary line."""
