"""The package's public surface as its stub (`nnx/__init__.pyi`) declares it: names, the error
hierarchy, the archive as a mapping, and decoding of the non-ggml dtypes nnx reads."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import safetensors.numpy

import nnx
from support import FIXTURES, same_bits

LLAMA = FIXTURES / "llama-tiny" / "model.safetensors"

PUBLIC = [
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


def test_the_public_names() -> None:
    for name in PUBLIC:
        assert hasattr(nnx, name), name
    assert isinstance(nnx.__version__, str) and nnx.__version__


def test_the_error_hierarchy() -> None:
    assert issubclass(nnx.Error, Exception)
    for kind in [nnx.IoError, nnx.FormatError, nnx.EntryError, nnx.RemoteError]:
        assert issubclass(kind, nnx.Error), kind
    assert issubclass(nnx.EntryError, KeyError)
    assert not issubclass(nnx.FormatError, KeyError)


def test_an_archive_is_a_mapping() -> None:
    archive = nnx.open(LLAMA)
    assert isinstance(archive, Mapping)
    reference = safetensors.numpy.load_file(LLAMA)
    assert dict(archive.items()).keys() == reference.keys()
    assert all(same_bits(value, reference[name]) for name, value in archive.items())


def test_dequantize_widens_bf16_and_fp8(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    values = rng.standard_normal((8, 16)).astype(np.float32)
    tensors = {
        "bf16": values.astype(ml_dtypes.bfloat16),
        "e4m3": values.astype(ml_dtypes.float8_e4m3fn),
        "e5m2": values.astype(ml_dtypes.float8_e5m2),
        "f16": values.astype(np.float16),
        "i32": np.arange(-8, 8, dtype=np.int32),
    }
    path = tmp_path / "mixed.safetensors"
    nnx.save_file(tensors, path)
    # The reference's numpy reader has no FP8 (it looks the types up in numpy): it gives their
    # dtype names, and the values of the others.
    with safetensors.safe_open(path, framework="numpy") as f:
        assert f.get_slice("e4m3").get_dtype() == "F8_E4M3"
        assert f.get_slice("e5m2").get_dtype() == "F8_E5M2"
        back = {name: f.get_tensor(name) for name in ["bf16", "f16", "i32"]}
    archive = nnx.open(path)
    assert archive.info("e4m3").dtype == "F8_E4M3"
    assert archive.info("e5m2").dtype == "F8_E5M2"
    assert archive["e4m3"].dtype == ml_dtypes.float8_e4m3fn
    for name, array in tensors.items():
        if name in back:
            assert same_bits(back[name], array), f"{name}: the reference reads it back"
        assert same_bits(archive[name], array), f"{name}: nnx reads it back"
        decoded = archive.dequantize(name)
        assert decoded.dtype == np.float32, name
        assert same_bits(decoded, array.astype(np.float32)), name


def test_dequantize_of_a_bf16_checkpoint() -> None:
    reference = safetensors.numpy.load_file(LLAMA)
    archive = nnx.open(LLAMA)
    for name, array in reference.items():
        assert same_bits(archive.dequantize(name), array.astype(np.float32)), name


def test_a_closed_archive_refuses_further_reads() -> None:
    archive = nnx.open(LLAMA)
    kept = archive["model.norm.weight"]
    archive.close()
    with pytest.raises(nnx.Error):
        archive["model.norm.weight"]
    assert kept.shape == (64,)
