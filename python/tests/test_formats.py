"""PyTorch checkpoints, PyTorch distributed checkpoints (DCP) and Orbax checkpoints through
`nnx.open`, against what torch and JAX wrote beside them."""

from __future__ import annotations

import json
import os
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import safetensors.numpy

import nnx
from support import FIXTURES, same_bits

TORCH = FIXTURES / "torch"
DCP = FIXTURES / "dcp"
ORBAX = FIXTURES / "orbax"

# expected.json's dtype names: numpy's dtype and nnx's name.
DTYPES = {
    "float64": (np.dtype(np.float64), "F64"),
    "float32": (np.dtype(np.float32), "F32"),
    "float16": (np.dtype(np.float16), "F16"),
    "bfloat16": (np.dtype(ml_dtypes.bfloat16), "BF16"),
    "int64": (np.dtype(np.int64), "I64"),
    "int32": (np.dtype(np.int32), "I32"),
    "uint8": (np.dtype(np.uint8), "U8"),
    "bool": (np.dtype(np.bool_), "BOOL"),
}


def expected_torch() -> dict:
    return json.loads((TORCH / "expected.json").read_text())


def same_values(dtype: str, got: np.ndarray, wanted: list) -> bool:
    """Whether `got` holds the decimal values of expected.json once rounded to `dtype` (F64 values
    are written there at F32 precision, so compared as F32)."""
    got = np.ascontiguousarray(got).reshape(-1)
    wanted = np.asarray(wanted, dtype=np.float64)
    if got.shape != wanted.shape:
        return False
    if dtype == "float64":
        return np.array_equal(got.astype(np.float32), wanted.astype(np.float32))
    if dtype in ("float32", "float16", "bfloat16"):
        return np.array_equal(got, wanted.astype(got.dtype))
    return np.array_equal(got.astype(np.float64), wanted)


# --- PyTorch ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("file", ["state_zip.pt", "state_legacy.pt"])
def test_a_torch_checkpoint_holds_what_pytorch_wrote(file: str) -> None:
    expected = expected_torch()
    archive = nnx.open(TORCH / file)
    assert sorted(archive.keys()) == sorted(expected)
    for name, entry in expected.items():
        dtype, nnx_name = DTYPES[entry["dtype"]]
        got = archive[name]
        assert got.dtype == dtype, f"{name}: {got.dtype}"
        assert got.shape == tuple(entry["shape"]), name
        assert same_values(entry["dtype"], got, entry["values"]), f"{name}: {got.reshape(-1)[:8]}"
        info = archive.info(name)
        assert info.dtype == nnx_name, name
        assert info.shape == tuple(entry["shape"]), name


def test_a_nested_torch_checkpoint_names_tensors_by_path() -> None:
    expected = expected_torch()
    archive = nnx.open(TORCH / "nested_zip.pt")
    assert sorted(archive.keys()) == sorted(f"model.{name}" for name in expected)
    for name, entry in expected.items():
        assert same_values(entry["dtype"], archive[f"model.{name}"], entry["values"]), name


def test_zip_checkpoint_tensors_are_views_sharing_their_storages() -> None:
    archive = nnx.open(TORCH / "state_zip.pt")
    for name in archive.keys():
        assert not archive[name].flags.owndata, f"{name}: a copy, not a view"
    a, b, t = archive["shared.a"], archive["shared.b"], archive["shared.t"]
    assert np.shares_memory(a, b), "shared.a and shared.b are one storage"
    assert np.shares_memory(a, t), "shared.t is a transposed view of shared.a's storage"
    assert same_bits(t, a.T), "shared.t is shared.a transposed"
    assert same_bits(b, a[2:5]), "shared.b starts 8 elements into shared.a"
    assert t.strides == (4, 16), f"shared.t's strides: {t.strides}"


@pytest.mark.parametrize("file", ["malicious.pkl", "malicious_zip.pt"])
def test_a_malicious_pickle_is_refused_by_its_global(file: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The payload would write `nnx-pwned` in the working folder.
    monkeypatch.chdir(tmp_path)
    path = TORCH / file
    with pytest.raises(nnx.FormatError) as caught:
        nnx.open(path)
    message = str(caught.value)
    assert isinstance(caught.value, nnx.Error)
    assert "posix.system" in message, message
    assert file in message, message
    assert not (tmp_path / "nnx-pwned").exists(), "the pickle's command ran"
    assert os.listdir(tmp_path) == []


# --- DCP and Orbax -------------------------------------------------------------------------------


def assert_equals_reference(archive: nnx.Archive, reference_path: Path) -> None:
    reference = safetensors.numpy.load_file(reference_path)
    assert sorted(archive.keys()) == sorted(reference)
    for name, want in reference.items():
        got = archive[name]
        assert same_bits(got, want), f"{name}: got {got.dtype} {got.shape}, want {want.dtype} {want.shape}"
        assert archive.info(name).shape == want.shape, name


@pytest.mark.parametrize("layout", ["sharded", "safetensors-format"])
def test_a_dcp_checkpoint_reads_as_torch_reads_it(layout: str) -> None:
    archive = nnx.open(DCP / layout)
    assert_equals_reference(archive, DCP / f"{layout}.reference.safetensors")


def test_dcp_items_that_are_not_tensors_are_metadata() -> None:
    metadata = nnx.open(DCP / "sharded").metadata()
    assert metadata["step"] == "7"
    assert metadata["note"] == "hello"
    assert metadata["optim.param_groups.0.lr"] == "0.001"


@pytest.mark.parametrize("layout", ["ocdbt", "plain", "ocdbt-zarr3", "plain-zarr3", "ocdbt-small-nodes"])
def test_an_orbax_checkpoint_reads_as_jax_saved_it(layout: str) -> None:
    archive = nnx.open(ORBAX / layout)
    assert_equals_reference(archive, ORBAX / f"{layout}.reference.safetensors")


def test_assembled_arrays_outlive_their_archive() -> None:
    reference = safetensors.numpy.load_file(ORBAX / "ocdbt.reference.safetensors")
    archive = nnx.open(ORBAX / "ocdbt")
    kept = {name: archive[name] for name in archive.keys()}
    archive.close()
    del archive
    for name, array in kept.items():
        assert same_bits(array, reference[name]), name
