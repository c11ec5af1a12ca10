"""DLPack: `nnx.Tensor` hands its memory to consumers without a copy, with the dtype it holds."""

from __future__ import annotations

import ctypes
import gc

import ml_dtypes
import numpy as np
import pytest
import safetensors.numpy

import nnx
from support import FIXTURES, same_bits

GPT2 = FIXTURES / "gpt2-tiny" / "model.safetensors"
LLAMA = FIXTURES / "llama-tiny" / "model.safetensors"

# DLPack's dtype codes and device types.
KDL_INT, KDL_UINT, KDL_FLOAT, KDL_BFLOAT = 0, 1, 2, 4
KDL_CPU = 1
# DLManagedTensorVersioned's flags.
READ_ONLY, IS_COPIED = 1, 2


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [
        ("version", DLPackVersion),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", ctypes.c_void_p),
        ("flags", ctypes.c_uint64),
        ("dl_tensor", DLTensor),
    ]


_capsule_name = ctypes.pythonapi.PyCapsule_GetName
_capsule_name.restype = ctypes.c_char_p
_capsule_name.argtypes = [ctypes.py_object]
_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


def described(capsule: object) -> dict:
    """What a DLPack capsule (not yet consumed) says about its tensor."""
    name = _capsule_name(capsule)
    pointer = _capsule_pointer(capsule, name)
    if name == b"dltensor_versioned":
        managed = DLManagedTensorVersioned.from_address(pointer)
        version = (managed.version.major, managed.version.minor)
        flags = managed.flags
    else:
        assert name == b"dltensor", name
        managed = DLManagedTensor.from_address(pointer)
        version, flags = None, None
    t = managed.dl_tensor
    shape = tuple(t.shape[i] for i in range(t.ndim))
    strides = None if not t.strides else tuple(t.strides[i] for i in range(t.ndim))
    return {
        "name": name,
        "version": version,
        "flags": flags,
        "data": t.data + t.byte_offset,
        "device": (t.device.device_type, t.device.device_id),
        "dtype": (t.dtype.code, t.dtype.bits, t.dtype.lanes),
        "shape": shape,
        "strides": strides,
    }


def test_f32_through_dlpack_shares_memory() -> None:
    name = "transformer.wte.weight"
    want = safetensors.numpy.load_file(GPT2)[name]
    tensor = nnx.open(GPT2).tensor(name)
    assert tensor.__dlpack_device__() == (KDL_CPU, 0)
    array = np.from_dlpack(tensor)
    assert same_bits(array, want)
    assert np.shares_memory(array, np.asarray(tensor))
    assert array.ctypes.data == np.asarray(tensor).ctypes.data
    assert not array.flags.writeable, "the mapped file's bytes are read-only"
    # The array keeps the mapping alive once the tensor and its archive are gone.
    del tensor
    gc.collect()
    assert same_bits(array, want)


def test_the_capsule_describes_the_tensor() -> None:
    archive = nnx.open(GPT2)
    for name in ["transformer.wte.weight", "transformer.h.0.ln_1.bias"]:
        tensor = archive.tensor(name)
        view = np.asarray(tensor)
        info = described(tensor.__dlpack__(max_version=(1, 0)))
        assert info["name"] == b"dltensor_versioned"
        assert info["version"][0] == 1
        assert info["device"] == (KDL_CPU, 0)
        assert info["dtype"] == (KDL_FLOAT, 32, 1)
        assert info["shape"] == view.shape
        assert info["strides"] in (None, tuple(s // 4 for s in view.strides))
        # The mapped file's own bytes, flagged read-only, not a copy.
        assert info["data"] == view.ctypes.data
        assert info["flags"] & READ_ONLY
        assert not info["flags"] & IS_COPIED


def test_a_legacy_capsule_holds_the_values() -> None:
    # A consumer of DLPack before 1.0 gets the unversioned capsule, which cannot say read-only:
    # it may hold a copy of a mapped file's bytes, with the same values.
    tensor = nnx.open(GPT2).tensor("transformer.wpe.weight")
    view = np.asarray(tensor)
    capsule = tensor.__dlpack__()  # holds the tensor (or its copy) until dropped
    info = described(capsule)
    assert info["name"] == b"dltensor"
    assert info["dtype"] == (KDL_FLOAT, 32, 1)
    assert info["shape"] == view.shape
    assert ctypes.string_at(info["data"], view.nbytes) == view.tobytes()
    del capsule


def test_a_copy_when_asked() -> None:
    tensor = nnx.open(GPT2).tensor("transformer.wpe.weight")
    view = np.asarray(tensor)
    capsule = tensor.__dlpack__(max_version=(1, 0), copy=True)
    info = described(capsule)
    assert info["data"] != view.ctypes.data
    assert info["flags"] & IS_COPIED
    assert ctypes.string_at(info["data"], view.nbytes) == view.tobytes()
    del capsule
    copied = np.from_dlpack(tensor, copy=True)
    assert not np.shares_memory(copied, view)
    assert same_bits(copied, view)


def test_bf16_is_exported_as_bfloat16() -> None:
    name = "model.embed_tokens.weight"
    want = safetensors.numpy.load_file(LLAMA)[name]
    tensor = nnx.open(LLAMA).tensor(name)
    view = np.asarray(tensor)
    assert view.dtype == ml_dtypes.bfloat16
    assert same_bits(view, want)
    info = described(tensor.__dlpack__(max_version=(1, 0)))
    assert info["dtype"] == (KDL_BFLOAT, 16, 1), "DLPack's kDLBfloat, 16 bits"
    assert info["data"] == view.ctypes.data
    # numpy (2.4) imports no kDLBfloat tensor: it refuses the capsule rather than misread it.
    try:
        array = np.from_dlpack(tensor)
    except RuntimeError as refused:
        assert "Unsupported dtype in DLTensor" in str(refused), str(refused)
    else:
        # A numpy that takes bfloat16 through DLPack gets the same memory.
        assert array.dtype == ml_dtypes.bfloat16
        assert np.shares_memory(array, view)
        assert same_bits(array, want)


def test_dlpack_of_an_entry_nnx_made() -> None:
    blocks = (FIXTURES / "gguf" / "types" / "Q4_K.blocks").read_bytes()
    archive = nnx.open(FIXTURES / "gguf" / "types" / "all.gguf")
    tensor = archive.tensor("f32")
    array = np.from_dlpack(tensor)
    assert np.shares_memory(array, np.asarray(tensor))
    assert array.dtype == np.float32 and array.shape == (2, 256)
    raw = archive.tensor("q4_k")
    assert np.from_dlpack(raw).tobytes() == blocks


@pytest.mark.parametrize("copy", [None, False])
def test_dlpack_without_a_copy_when_none_is_asked(copy: bool | None) -> None:
    tensor = nnx.open(GPT2).tensor("transformer.wte.weight")
    array = np.from_dlpack(tensor, copy=copy)
    assert np.shares_memory(array, np.asarray(tensor))
