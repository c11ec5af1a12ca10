"""SafeTensors through `nnx.open`, `nnx.safe_open` and `nnx.save_file`, against the reference
`safetensors` package reading and writing the same files."""

from __future__ import annotations

import gc
import json
import struct
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import safetensors
import safetensors.numpy

import nnx
from support import FIXTURES, same_bits

LLAMA = FIXTURES / "llama-tiny" / "model.safetensors"
GPT2 = FIXTURES / "gpt2-tiny" / "model.safetensors"
FILES = [pytest.param(LLAMA, id="llama-tiny-bf16"), pytest.param(GPT2, id="gpt2-tiny-f32")]


def header(path: Path) -> tuple[int, dict]:
    """The file's JSON header as written, and where its data starts."""
    with path.open("rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        return 8 + length, json.loads(f.read(length))


def has_base(array: np.ndarray) -> bool:
    """Whether `array` views memory owned elsewhere (its base chain leads somewhere)."""
    return array.base is not None


# --- nnx.open -------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", FILES)
def test_open_lists_the_files_entries(path: Path) -> None:
    reference = safetensors.numpy.load_file(path)
    with safetensors.safe_open(path, framework="numpy") as f:
        reference_metadata = f.metadata()
    archive = nnx.open(path)
    assert sorted(archive.keys()) == sorted(reference)
    assert len(archive) == len(reference)
    assert sorted(archive) == sorted(reference)
    for name in reference:
        assert name in archive
    assert "no.such.entry" not in archive
    assert archive.get("no.such.entry") is None
    assert archive.get("no.such.entry", 42) == 42
    assert Path(archive.path) == path
    assert archive.metadata() == reference_metadata


@pytest.mark.parametrize("path", FILES)
def test_info_answers_from_the_header(path: Path) -> None:
    data_start, entries = header(path)
    entries.pop("__metadata__", None)
    archive = nnx.open(path)
    for name, entry in entries.items():
        info = archive.info(name)
        begin, end = entry["data_offsets"]
        assert info.name == name
        assert info.dtype == entry["dtype"], name
        assert info.shape == tuple(entry["shape"]), name
        assert isinstance(info.shape, tuple)
        assert info.nbytes == end - begin, name
        assert info.offset == data_start + begin, name
        assert info.file is not None and Path(info.file).resolve() == path.resolve(), name


def test_info_dtypes_of_the_fixtures() -> None:
    assert nnx.open(LLAMA).info("model.norm.weight").dtype == "BF16"
    assert nnx.open(LLAMA).info("lm_head.weight").shape == (256, 64)
    assert nnx.open(LLAMA).info("lm_head.weight").nbytes == 256 * 64 * 2
    assert nnx.open(GPT2).info("transformer.wte.weight").dtype == "F32"
    assert nnx.open(GPT2).info("transformer.wte.weight").nbytes == 512 * 64 * 4


@pytest.mark.parametrize("path", FILES)
def test_tensors_equal_the_reference_bit_for_bit(path: Path) -> None:
    reference = safetensors.numpy.load_file(path)
    archive = nnx.open(path)
    for name, want in reference.items():
        got = archive[name]
        assert isinstance(got, np.ndarray), name
        assert same_bits(got, want), name
    if path == LLAMA:
        assert archive["lm_head.weight"].dtype == ml_dtypes.bfloat16
        assert archive["lm_head.weight"].dtype == np.dtype("bfloat16")
    else:
        assert archive["transformer.wte.weight"].dtype == np.float32


@pytest.mark.parametrize("path", FILES)
def test_tensors_are_views_of_the_file(path: Path) -> None:
    data_start, entries = header(path)
    raw = path.read_bytes()
    archive = nnx.open(path)
    for name in archive.keys():
        array = archive[name]
        assert not array.flags.owndata, f"{name}: a copy, not a view"
        assert has_base(array), f"{name}: no base"
        begin, end = entries[name]["data_offsets"]
        assert np.ascontiguousarray(array).tobytes() == raw[data_start + begin : data_start + end], name


@pytest.mark.parametrize("path", FILES)
def test_arrays_outlive_their_archive(path: Path) -> None:
    reference = safetensors.numpy.load_file(path)
    archive = nnx.open(path)
    kept = {name: archive[name] for name in archive.keys()}
    tensors = {name: archive.tensor(name) for name in archive.keys()}
    archive.close()
    for name, array in kept.items():
        assert same_bits(array, reference[name]), f"{name} after close()"
    del archive
    gc.collect()
    for name, array in kept.items():
        assert same_bits(array, reference[name]), f"{name} after the archive was dropped"
        assert same_bits(np.asarray(tensors[name]), reference[name]), f"{name}: Tensor after the archive was dropped"


def test_the_archive_is_a_context_manager() -> None:
    reference = safetensors.numpy.load_file(GPT2)
    with nnx.open(GPT2) as archive:
        kept = archive["transformer.wpe.weight"]
    gc.collect()
    assert same_bits(kept, reference["transformer.wpe.weight"])


def test_the_path_may_be_a_str_or_a_pathlike() -> None:
    assert sorted(nnx.open(str(GPT2)).keys()) == sorted(nnx.open(GPT2).keys())


@pytest.mark.parametrize("path", FILES)
def test_tensor_objects_describe_and_share_their_values(path: Path) -> None:
    reference = safetensors.numpy.load_file(path)
    archive = nnx.open(path)
    for name, want in reference.items():
        tensor = archive.tensor(name)
        info = archive.info(name)
        assert tensor.dtype == info.dtype, name
        assert tuple(tensor.shape) == want.shape, name
        assert tensor.nbytes == want.nbytes, name
        array = np.asarray(tensor)
        assert same_bits(array, want), name
        assert not array.flags.owndata, name
        assert same_bits(tensor.numpy(), want), name
        assert np.shares_memory(tensor.numpy(), array), name
        if want.dtype == ml_dtypes.bfloat16:
            # numpy has no type string for bfloat16: asarray takes such a tensor through
            # `__array__`, still without a copy (checked above).
            continue
        interface = tensor.__array_interface__
        assert tuple(interface["shape"]) == want.shape, name
        assert np.dtype(interface["typestr"]) == want.dtype, name
        assert interface["data"][0] == array.ctypes.data, name


def test_an_empty_and_a_scalar_entry(tmp_path: Path) -> None:
    path = tmp_path / "edge.safetensors"
    tensors = {
        "scalar": np.array(3.5, dtype=np.float32),
        "empty": np.zeros((0, 4), dtype=np.float32),
        "ints": np.arange(-3, 3, dtype=np.int64),
        "mask": np.array([True, False, True]),
    }
    safetensors.numpy.save_file(tensors, path)
    archive = nnx.open(path)
    for name, want in tensors.items():
        assert same_bits(archive[name], want), name
    assert archive.info("scalar").shape == ()
    assert archive.info("empty").nbytes == 0
    assert archive.info("mask").dtype == "BOOL"


# --- nnx.safe_open ---------------------------------------------------------------------------------


@pytest.mark.parametrize("path", FILES)
def test_safe_open_answers_like_the_reference(path: Path) -> None:
    with safetensors.safe_open(path, framework="numpy") as theirs, nnx.safe_open(path, framework="numpy") as ours:
        assert ours.keys() == theirs.keys()
        assert ours.offset_keys() == theirs.offset_keys()
        assert ours.metadata() == theirs.metadata()
        for name in theirs.keys():
            assert same_bits(ours.get_tensor(name), theirs.get_tensor(name)), name
            assert ours.get_slice(name).get_shape() == theirs.get_slice(name).get_shape(), name
            assert ours.get_slice(name).get_dtype() == theirs.get_slice(name).get_dtype(), name


def test_safe_open_takes_np_and_a_pathlike() -> None:
    with nnx.safe_open(str(GPT2), framework="np") as f:
        names = f.keys()
    with nnx.safe_open(GPT2, framework="numpy", device="cpu") as f:
        assert f.keys() == names


def test_safe_open_without_metadata(tmp_path: Path) -> None:
    path = tmp_path / "plain.safetensors"
    safetensors.numpy.save_file({"a": np.ones(3, np.float32)}, path)
    with safetensors.safe_open(path, framework="numpy") as theirs, nnx.safe_open(path, framework="numpy") as ours:
        assert theirs.metadata() is None
        assert ours.metadata() is None


# Slicings the reference takes; each is also compared with numpy's indexing of the whole tensor.
SLICINGS = [
    (slice(None),),
    3,
    -1,
    (slice(1, 5),),
    (slice(1, 5), slice(10, 20)),
    (slice(None, None, 2),),
    (slice(1, None, 3), slice(2, 40, 5)),
    (Ellipsis, slice(0, 3)),
    (Ellipsis, -2),
    (2, slice(None, None, 3)),
    (slice(None), 7),
    (-2, slice(4, 9)),
    (),
    (Ellipsis,),
    (slice(3, 3),),
    slice(5, 6),
]

# Slicings numpy takes and the reference refuses (negative bounds): compared with numpy alone.
NEGATIVE_BOUNDS = [
    (slice(-5, None),),
    (slice(-3, -1), -2),
    (slice(None), slice(-10, -2, 3)),
]


def ids(index: object) -> str:
    return repr(index).replace(" ", "")


@pytest.mark.parametrize("path", FILES)
@pytest.mark.parametrize("index", SLICINGS, ids=ids)
def test_get_slice_matches_the_reference(path: Path, index: object) -> None:
    name = "lm_head.weight" if path == LLAMA else "transformer.h.0.attn.c_attn.weight"
    with safetensors.safe_open(path, framework="numpy") as theirs, nnx.safe_open(path, framework="numpy") as ours:
        whole = theirs.get_tensor(name)
        want = theirs.get_slice(name)[index]
        got = ours.get_slice(name)[index]
    assert same_bits(want, whole[index]), "the reference itself"
    assert same_bits(got, want), f"{name}[{index!r}]: got shape {np.shape(got)}, want {want.shape}"


@pytest.mark.parametrize("index", NEGATIVE_BOUNDS, ids=ids)
def test_get_slice_takes_negative_bounds_as_numpy_does(index: object) -> None:
    name = "transformer.h.0.attn.c_attn.weight"
    whole = safetensors.numpy.load_file(GPT2)[name]
    with nnx.safe_open(GPT2, framework="numpy") as ours:
        got = ours.get_slice(name)[index]
    assert same_bits(got, whole[index]), f"{name}[{index!r}]: got shape {np.shape(got)}, want {whole[index].shape}"


def test_get_slice_of_a_1d_entry() -> None:
    name = "transformer.h.0.attn.c_attn.bias"
    with safetensors.safe_open(GPT2, framework="numpy") as theirs, nnx.safe_open(GPT2, framework="numpy") as ours:
        for index in [slice(None), slice(10, 20), slice(None, None, 7), 5, -1, Ellipsis]:
            assert same_bits(ours.get_slice(name)[index], theirs.get_slice(name)[index]), repr(index)


def test_safe_open_arrays_stay_valid_after_the_block() -> None:
    reference = safetensors.numpy.load_file(LLAMA)
    with nnx.safe_open(LLAMA, framework="numpy") as f:
        kept = f.get_tensor("model.embed_tokens.weight")
        row = f.get_slice("model.embed_tokens.weight")[7]
    gc.collect()
    assert same_bits(kept, reference["model.embed_tokens.weight"])
    assert same_bits(row, reference["model.embed_tokens.weight"][7])


def test_safe_open_missing_entry_is_a_key_error() -> None:
    with nnx.safe_open(GPT2, framework="numpy") as f:
        with pytest.raises(KeyError):
            f.get_tensor("no.such.entry")
        with pytest.raises(KeyError):
            f.get_slice("no.such.entry")


# --- nnx.save_file ---------------------------------------------------------------------------------


def sample_tensors() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    return {
        "w": rng.standard_normal((16, 8), dtype=np.float32),
        "b": rng.standard_normal(8).astype(np.float16),
        "ids": np.arange(-5, 7, dtype=np.int64).reshape(3, 4),
        "u8": np.arange(10, dtype=np.uint8),
        "mask": np.array([True, False, False, True]),
        "f64": np.array([0.1, -2.5e300, np.inf], dtype=np.float64),
        "bf": rng.standard_normal((4, 6)).astype(ml_dtypes.bfloat16),
        "scalar": np.array(1.25, dtype=np.float32),
    }


def test_save_file_reads_back_with_the_reference(tmp_path: Path) -> None:
    tensors = sample_tensors()
    path = tmp_path / "saved.safetensors"
    metadata = {"format": "np", "note": "grüße"}
    nnx.save_file(tensors, path, metadata)
    back = safetensors.numpy.load_file(path)
    assert sorted(back) == sorted(tensors)
    for name, want in tensors.items():
        assert same_bits(back[name], want), name
    with safetensors.safe_open(path, framework="numpy") as f:
        assert f.metadata() == metadata
        assert f.get_slice("bf").get_dtype() == "BF16"
    assert not [p.name for p in tmp_path.iterdir() if p != path], "temporary files left behind"


def test_save_file_without_metadata_and_to_a_str(tmp_path: Path) -> None:
    path = tmp_path / "plain.safetensors"
    nnx.save_file({"x": np.arange(6, dtype=np.float32)}, str(path))
    with safetensors.safe_open(path, framework="numpy") as f:
        assert f.keys() == ["x"]
        assert same_bits(f.get_tensor("x"), np.arange(6, dtype=np.float32))


def test_save_file_lays_out_the_file_as_the_reference_does(tmp_path: Path) -> None:
    tensors = sample_tensors()
    ours, theirs = tmp_path / "ours.safetensors", tmp_path / "theirs.safetensors"
    nnx.save_file(tensors, ours, {"format": "np"})
    safetensors.numpy.save_file(tensors, theirs, {"format": "np"})
    (ours_start, ours_header), (theirs_start, theirs_header) = header(ours), header(theirs)
    assert ours_header == theirs_header, "the same entries at the same offsets"
    assert ours.read_bytes()[ours_start:] == theirs.read_bytes()[theirs_start:], "the same data bytes"


def test_save_file_writes_non_contiguous_arrays_by_their_values(tmp_path: Path) -> None:
    base = np.arange(6 * 10, dtype=np.float32).reshape(6, 10)
    tensors = {
        "transposed": base.T,
        "strided": base[:, ::3],
        "reversed": base[::-1, ::-2],
        "fortran": np.asfortranarray(base * 2),
        "bf16_transposed": base.astype(ml_dtypes.bfloat16).T,
        "column": base[:, 4],
    }
    path = tmp_path / "strided.safetensors"
    nnx.save_file(tensors, path)
    back = safetensors.numpy.load_file(path)
    for name, array in tensors.items():
        assert same_bits(back[name], np.ascontiguousarray(array)), name


def test_a_failing_save_leaves_nothing_behind(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    bad = {"good": np.ones(4, np.float32), "bad": np.array([object(), None], dtype=object)}
    with pytest.raises((nnx.Error, TypeError)):
        nnx.save_file(bad, path)
    assert list(tmp_path.iterdir()) == [], "a partial or temporary file was left"


def test_a_failing_save_keeps_the_previous_file(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    nnx.save_file({"old": np.arange(3, dtype=np.float32)}, path)
    before = path.read_bytes()
    bad = {"new": np.ones(4, np.float32), "bad": np.array(["text", 1], dtype=object)}
    with pytest.raises((nnx.Error, TypeError)):
        nnx.save_file(bad, path)
    assert path.read_bytes() == before, "the previous file was changed"
    assert [p.name for p in tmp_path.iterdir()] == [path.name], "a temporary file was left"


def test_save_file_replaces_a_file_an_archive_has_open(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    nnx.save_file({"x": np.full(1024, 1.0, np.float32)}, path)
    archive = nnx.open(path)
    kept = archive["x"]
    nnx.save_file({"x": np.full(1024, 2.0, np.float32)}, path)
    # The old file was renamed over, not written into: the view still sees its own values.
    assert np.all(kept == 1.0)
    assert np.all(nnx.open(path)["x"] == 2.0)
