"""GGUF and ggml block types: `nnx.open` of a GGUF file against `gguf.GGUFReader`, decoding against
`gguf.quants.dequantize` and its goldens, and `nnx.quantize` against the reference quantizers'
goldens (gguf-py and llama.cpp)."""

from __future__ import annotations

from pathlib import Path

import gguf
import ml_dtypes
import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader

import nnx
from support import FIXTURES, describe_difference, same_bits

TYPES = FIXTURES / "gguf" / "types"
ALL = TYPES / "all.gguf"
GOLDENS = FIXTURES / "gguf" / "quantize"

# Every type with fixture blocks, by the `.blocks` files there.
DECODED = sorted(p.stem for p in TYPES.glob("*.blocks"))
# Types gguf-py does not decode (it raises NotImplementedError); their goldens are numpy's casts.
CAST = {"F64", "I8", "I16", "I32", "I64"}
# Types stored as numpy dtypes rather than ggml blocks.
PLAIN = {
    "F32": np.dtype(np.float32),
    "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "F64": np.dtype(np.float64),
    "I8": np.dtype(np.int8),
    "I16": np.dtype(np.int16),
    "I32": np.dtype(np.int32),
    "I64": np.dtype(np.int64),
}
# The quantize goldens: `<TYPE>.gguf_py` and `<TYPE>.llamacpp`.
QUANTIZED = sorted((p.stem, p.suffix[1:]) for p in GOLDENS.iterdir() if p.suffix in (".gguf_py", ".llamacpp"))

ROWS, COLS = 2, 256


@pytest.fixture(scope="module")
def reader() -> GGUFReader:
    return GGUFReader(ALL)


@pytest.fixture(scope="module")
def archive() -> nnx.Archive:
    return nnx.open(ALL)


def reader_tensor(reader: GGUFReader, name: str):
    (tensor,) = [t for t in reader.tensors if t.name == name]
    return tensor


def golden_values(ty: str) -> np.ndarray:
    return np.fromfile(TYPES / f"{ty}.f32", dtype="<f4").reshape(ROWS, COLS)


def golden_blocks(ty: str) -> bytes:
    return (TYPES / f"{ty}.blocks").read_bytes()


def test_the_fixtures_cover_every_type() -> None:
    assert len(DECODED) == 31, DECODED
    assert len(QUANTIZED) == 17, QUANTIZED


# --- nnx.open of all.gguf --------------------------------------------------------------------------


def test_keys_are_the_readers_tensors(archive: nnx.Archive, reader: GGUFReader) -> None:
    names = [t.name for t in reader.tensors]
    assert archive.keys() == names
    assert len(archive) == len(names)
    assert list(archive) == names
    assert all(name in archive for name in names)
    assert Path(archive.path) == ALL


@pytest.mark.parametrize("ty", DECODED)
def test_info_names_the_ggml_type(archive: nnx.Archive, reader: GGUFReader, ty: str) -> None:
    name = ty.lower()
    tensor = reader_tensor(reader, name)
    assert tensor.tensor_type.name == ty
    info = archive.info(name)
    assert info.name == name
    assert info.dtype == ty
    assert info.shape == (ROWS, COLS), "the reverse of ggml's ne"
    assert info.shape == tuple(int(n) for n in reversed(tensor.shape))
    assert info.nbytes == tensor.n_bytes
    assert info.offset == tensor.data_offset
    assert info.file is not None and Path(info.file).resolve() == ALL.resolve()


def reader_value(field) -> object:
    """A field's value as the reader gives it (nested arrays come back flattened)."""
    return field.contents()


def flatten(value: object) -> list:
    if isinstance(value, list):
        return [leaf for item in value for leaf in flatten(item)]
    return [value]


def test_metadata_has_the_readers_typed_values(archive: nnx.Archive, reader: GGUFReader) -> None:
    metadata = archive.metadata()
    keys = [key for key in reader.fields if not key.startswith("GGUF.")]
    assert sorted(metadata) == sorted(keys)
    for key in keys:
        field = reader.fields[key]
        want = reader_value(field)
        got = metadata[key]
        if key == "nnx.array_nested":
            # gguf-py flattens arrays of arrays; the file holds [[1, 2], [3], [4, 5, 6]].
            assert flatten(got) == want, key
            continue
        assert got == want, f"{key}: got {got!r}, want {want!r}"
        assert type(got) is type(want), f"{key}: got a {type(got).__name__}, want a {type(want).__name__}"
        if isinstance(want, list):
            assert [type(v) for v in got] == [type(v) for v in want], key


def test_metadata_values_as_written(archive: nnx.Archive) -> None:
    # The values `scripts/gguf_fixtures.py` wrote (see the fixture's README), with their Python types.
    expected = {
        "general.architecture": "nnx-fixture",
        "nnx.u8": 200,
        "nnx.i8": -100,
        "nnx.u16": 60000,
        "nnx.i16": -30000,
        "nnx.u32": 4000000000,
        "nnx.i32": -2000000000,
        "nnx.u64": 18446744073709551615,
        "nnx.i64": -9223372036854775808,
        "nnx.f32": 1.5,
        "nnx.f64": 0.1,
        "nnx.bool": True,
        "nnx.string": "grüße, 世界",
        "nnx.array_i32": [1, -2, 3, 2147483647],
        "nnx.array_u64": [0, 1, 18446744073709551615],
        "nnx.array_f32": [0.5, -1.25],
        "nnx.array_bool": [True, False, True],
        "nnx.array_string": ["a", "", "bé"],
        "nnx.array_nested": [[1, 2], [3], [4, 5, 6]],
    }
    metadata = archive.metadata()
    assert metadata == expected
    assert metadata["nnx.bool"] is True
    assert all(value is True or value is False for value in metadata["nnx.array_bool"])
    assert type(metadata["nnx.u64"]) is int and type(metadata["nnx.f64"]) is float
    assert type(metadata["nnx.array_i32"]) is list and type(metadata["nnx.array_nested"][0]) is list


@pytest.mark.parametrize("ty", DECODED)
def test_entries_as_stored_equal_the_readers_bytes(archive: nnx.Archive, reader: GGUFReader, ty: str) -> None:
    name = ty.lower()
    tensor = reader_tensor(reader, name)
    want = bytes(tensor.data.tobytes())
    assert want == golden_blocks(ty)
    got = archive[name]
    stored = archive.tensor(name)
    as_array = np.asarray(stored)
    assert stored.nbytes == tensor.n_bytes
    assert as_array.tobytes() == want
    assert got.tobytes() == want
    if ty in PLAIN:
        assert got.dtype == PLAIN[ty], f"{ty}: got {got.dtype}"
        assert got.shape == (ROWS, COLS)
        assert as_array.dtype == PLAIN[ty]
        assert stored.dtype == ty
        assert tuple(stored.shape) == (ROWS, COLS)
    else:
        # Raw blocks: one row of bytes per logical row, as `nnx.quantize` makes them.
        assert got.dtype == np.uint8
        assert got.shape == tensor.data.shape == (ROWS, tensor.n_bytes // ROWS)
        assert as_array.dtype == np.uint8
    assert not got.flags.owndata, "a view of the mapped file"


@pytest.mark.parametrize("ty", DECODED)
def test_dequantize_equals_gguf_py(archive: nnx.Archive, reader: GGUFReader, ty: str) -> None:
    name = ty.lower()
    tensor = reader_tensor(reader, name)
    if ty in CAST:
        with pytest.raises(NotImplementedError):
            gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        with np.errstate(over="ignore"):
            want = np.asarray(tensor.data).astype(np.float32)
    else:
        with np.errstate(over="ignore", invalid="ignore"):
            want = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
    assert same_bits(want, golden_values(ty)), "the reference and its golden"
    got = archive.dequantize(name)
    assert got.dtype == np.float32
    assert got.shape == (ROWS, COLS)
    assert same_bits(got, want), f"{ty}: {describe_difference(got, want)}"


# --- nnx.dequantize of raw blocks ------------------------------------------------------------------


@pytest.mark.parametrize("ty", DECODED)
def test_dequantize_blocks_equal_the_goldens(ty: str) -> None:
    blocks, want = golden_blocks(ty), golden_values(ty)
    for data in (blocks, np.frombuffer(blocks, dtype=np.uint8)):
        got = nnx.dequantize(data, ty, (ROWS, COLS))
        assert got.dtype == np.float32
        assert got.shape == (ROWS, COLS)
        assert same_bits(got, want), f"{ty} from {type(data).__name__}: {describe_difference(got, want)}"
    as_list = nnx.dequantize(blocks, ty, [ROWS * COLS])
    assert as_list.shape == (ROWS * COLS,)
    assert same_bits(as_list, want.reshape(-1)), ty


def test_dequantize_refuses_bytes_that_are_not_the_shape() -> None:
    blocks = golden_blocks("Q4_K")
    with pytest.raises((nnx.Error, ValueError)):
        nnx.dequantize(blocks[:-1], "Q4_K", (ROWS, COLS))
    with pytest.raises((nnx.Error, ValueError)):
        nnx.dequantize(blocks, "Q4_K", (ROWS, COLS + 256))
    with pytest.raises((nnx.Error, ValueError)):
        nnx.dequantize(blocks, "Q4_K", (ROWS * 2, COLS // 2))


# --- nnx.quantize ----------------------------------------------------------------------------------


def golden_input(ty: str) -> np.ndarray:
    values = np.fromfile(GOLDENS / f"{ty}.input.f32", dtype="<f4")
    row = 64 if ty in ("F16", "BF16") else 256
    return values.reshape(-1, row)


@pytest.mark.parametrize(("ty", "source"), QUANTIZED, ids=[f"{t}-{s}" for t, s in QUANTIZED])
def test_quantize_is_bit_exact_with_the_reference(ty: str, source: str) -> None:
    x = golden_input(ty)
    want = (GOLDENS / f"{ty}.{source}").read_bytes()
    rows = x.shape[0]
    assert len(want) % rows == 0
    got = nnx.quantize(x, ty)
    assert got.dtype == np.uint8
    assert got.shape == (rows, len(want) // rows)
    if got.tobytes() != want:
        row_bytes = len(want) // rows
        first = next(i for i in range(len(want)) if got.tobytes()[i] != want[i])
        pytest.fail(f"{ty} ({source}): first differing byte {first} (row {first // row_bytes})")
    # One long row of the same values: blocks are encoded on their own.
    flat = nnx.quantize(x.reshape(-1), ty)
    assert flat.shape == (len(want),)
    assert flat.tobytes() == want
    # And it decodes as the reference decodes it.
    if ty not in ("F16", "BF16"):
        decoded = gguf.quants.dequantize(np.frombuffer(want, dtype=np.uint8).reshape(rows, -1), GGMLQuantizationType[ty])
        assert same_bits(nnx.dequantize(got, ty, x.shape), decoded), ty


def test_quantize_takes_non_contiguous_input() -> None:
    x = golden_input("Q4_K")
    want = (GOLDENS / "Q4_K.llamacpp").read_bytes()
    doubled = np.empty((x.shape[0], x.shape[1] * 2), dtype=np.float32)
    doubled[:, ::2] = x
    assert nnx.quantize(doubled[:, ::2], "Q4_K").tobytes() == want
    assert nnx.quantize(np.asfortranarray(x), "Q4_K").tobytes() == want


def test_quantize_of_gguf_py_types_equals_gguf_quants() -> None:
    rng = np.random.default_rng(11)
    x = (rng.standard_normal((4, 512)) * 0.02).astype(np.float32)
    for ty in ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "MXFP4", "TQ1_0", "TQ2_0"]:
        want = gguf.quants.quantize(x, GGMLQuantizationType[ty])
        got = nnx.quantize(x, ty)
        assert got.shape == want.shape, ty
        assert got.tobytes() == want.tobytes(), ty


def test_quantize_refuses_partial_blocks() -> None:
    with pytest.raises((nnx.Error, ValueError)):
        nnx.quantize(np.zeros((2, 100), dtype=np.float32), "Q4_K")


def test_types_lists_what_nnx_encodes() -> None:
    listed = nnx.types()
    assert isinstance(listed, list) and all(isinstance(name, str) for name in listed)
    assert len(set(listed)) == len(listed)
    for ty, _ in QUANTIZED:
        assert ty in listed, f"{ty} is quantized by nnx but not listed by nnx.types(): {listed}"
