"""Writes `tests/fixtures/gguf/types/`: blocks of every ggml tensor type and their decoding by the
`gguf` Python package, plus one GGUF file holding them all.

    python scripts/gguf_fixtures.py [OUTPUT_DIR]   (default: tests/fixtures/gguf/types)

Run it with the interpreter of the test environment (`~/.cache/nnx/venv/bin/python`, which
`scripts/setup.sh` fills). For each type, 2 rows of 256 values:

- `<TYPE>.blocks`: the raw bytes of the rows' blocks.
- `<TYPE>.f32`: their values, little-endian f32, as `gguf.quants.dequantize` gives them; for F64
  and the integer types, which gguf-py does not decode, as numpy's `astype(np.float32)`.

Types that gguf-py quantizes start from quantized normal floats; the others are random bytes whose
f16 scales are overwritten with finite ones, so that the values stay finite and portable (NaN
bits from arithmetic differ between CPUs). `all.gguf` holds every type as a tensor named by it
(`q4_k`), shape (2, 256) in numpy order, with metadata of every value type; `README.md` is
written beside them. Deterministic: a seeded numpy generator, no clock.
"""

import sys
from importlib.metadata import version
from pathlib import Path

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES, GGUFValueType
from gguf.quants import dequantize, quantize

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "tests/fixtures/gguf/types"
ROWS, COLS = 2, 256
SEED = 20260519

# Types gguf-py quantizes itself (F16 and BF16 among the plain types below).
QUANTIZED = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.MXFP4, T.TQ1_0, T.TQ2_0]
# Types gguf-py only decodes: random bytes with sensible scales.
RANDOM = [
    T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K,
    T.IQ1_S, T.IQ1_M, T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ3_XXS, T.IQ3_S, T.IQ4_NL, T.IQ4_XS,
    T.NVFP4,
]
PLAIN = [T.F32, T.F16, T.BF16, T.F64, T.I8, T.I16, T.I32, T.I64]
# Activation types of ggml's products: no fixture, the decoder refuses them.
NOT_DECODED = {T.Q8_1, T.Q8_K}

# Byte offsets of each block's f16 scales (d, then dmin or m where there is one), from ggml's
# block layouts. IQ1_M spreads its f16 over four nibbles; MXFP4 and NVFP4 have 8-bit scales.
F16_SCALES = {
    T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0],
    T.Q2_K: [80, 82], T.Q3_K: [108], T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208],
    T.IQ1_S: [0], T.IQ2_XXS: [0], T.IQ2_XS: [0], T.IQ2_S: [0], T.IQ3_XXS: [0], T.IQ3_S: [0],
    T.IQ4_NL: [0], T.IQ4_XS: [0], T.TQ1_0: [52], T.TQ2_0: [64],
}
F16_MAX = 0x7BFF  # 65504
F16_TINY = 0x0001  # 2^-24, the smallest subnormal

rng = np.random.default_rng(SEED)


def f16_bits(values) -> np.ndarray:
    return np.asarray(values, dtype=np.float16).view(np.uint16)


def set_f16(block: np.ndarray, offset: int, bits: int) -> None:
    block[offset:offset + 2] = np.array([bits], dtype="<u2").view(np.uint8)


def sensible_scale() -> int:
    return int(f16_bits(rng.uniform(-0.05, 0.05)))


def set_scales(ty: T, block: np.ndarray, d_bits: int | None = None, dmin_bits: int | None = None) -> None:
    """Gives a block finite scales: random small ones unless given."""
    if ty == T.IQ1_M:
        # The f16 is the top nibbles of the four u16 at bytes 48-55, lowest nibble first.
        h = sensible_scale() if d_bits is None else d_bits
        sc = block[48:56].copy().view("<u2")
        for j in range(4):
            sc[j] = (sc[j] & 0x0FFF) | (((h >> (4 * j)) & 0xF) << 12)
        block[48:56] = sc.view(np.uint8)
        return
    if ty == T.MXFP4:
        block[0] = rng.integers(118, 127) if d_bits is None else d_bits
        return
    if ty == T.NVFP4:
        return  # every UE4M3 byte is finite
    offsets = F16_SCALES[ty]
    set_f16(block, offsets[0], sensible_scale() if d_bits is None else d_bits)
    if len(offsets) > 1:
        set_f16(block, offsets[1], sensible_scale() if dmin_bits is None else dmin_bits)


def random_blocks(ty: T, n_blocks: int) -> np.ndarray:
    _, type_size = GGML_QUANT_SIZES[ty]
    blocks = rng.integers(0, 256, size=(n_blocks, type_size), dtype=np.uint8)
    for block in blocks:
        set_scales(ty, block)
    return blocks


def make_random(ty: T) -> tuple[np.ndarray, str]:
    block_size, _ = GGML_QUANT_SIZES[ty]
    blocks = random_blocks(ty, ROWS * COLS // block_size)
    if ty == T.NVFP4:
        blocks[-2, :4] = [0x01, 0x07, 0x08, 0x7E]  # subnormal, largest subnormal, smallest normal, largest
        blocks[-1, :4] = [0x00, 0x7F, 0xFF, 0x80]  # zero, NaN (decoded as 0), top bit set
        return blocks, "random bytes; the last two blocks' scales are edge codes (0x01 0x07 0x08 0x7E, 0x00 0x7F 0xFF 0x80)"
    has_min = len(F16_SCALES.get(ty, [])) > 1
    set_scales(ty, blocks[-1], F16_MAX, F16_TINY)
    note = "random bytes with f16 scales drawn from [-0.05, 0.05]; the last block's d is 65504"
    note += " and its dmin 2^-24" if has_min else ""
    if len(blocks) > 2:
        set_scales(ty, blocks[-2], F16_TINY, F16_MAX)
        note += ", the one before's d 2^-24" + (" and dmin 65504" if has_min else "")
    return blocks, note


def make_quantized(ty: T) -> tuple[np.ndarray, str]:
    block_size, type_size = GGML_QUANT_SIZES[ty]
    values = (rng.standard_normal((ROWS, COLS)) * 0.05).astype(np.float32)
    flat = values.reshape(-1, block_size)
    note = "`gguf.quants.quantize` of normal floats (sd 0.05)"
    if block_size == 32:
        flat[1] = 0.0
        flat[2] *= 1000.0
        note += "; block 1 all zeros, block 2 scaled by 1000"
    blocks = quantize(values, ty).reshape(-1, type_size)
    # Random bytes reach codes a quantizer never writes (TQ1_0 bytes past 242, say).
    blocks[-1] = random_blocks(ty, 1)[0]
    note += "; the last block random bytes with a sensible scale"
    if ty == T.MXFP4:
        blocks[-2] = random_blocks(ty, 1)[0]
        blocks[-2, 0] = 255  # 2^127: the larger codes overflow to infinity
        blocks[-3, 0] = 0  # 2^-128, subnormal
        note += ", the two before with exponents 0 and 255"
    return blocks, note


def make_plain(ty: T) -> tuple[np.ndarray, np.ndarray, str]:
    """The bytes of a plain type and their expected values."""
    n = ROWS * COLS
    if ty == T.F32:
        specials = np.array(
            [0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7F7FFFFF, 0x00000001, 0x00800000,
             0x7FC00000, 0x7F800001, 0xFFC12345], dtype=np.uint32)
        values = rng.standard_normal(n).astype(np.float32)
        values[:len(specials)] = specials.view(np.float32)
        raw = values.view(np.uint8)
        return raw, dequantize(raw, ty), "normal floats after ±0, ±inf, max, subnormals and NaNs (quiet, signalling, with payload)"
    if ty == T.F16:
        specials = np.array(
            [0x0000, 0x8000, 0x7C00, 0xFC00, 0x7BFF, 0x0001, 0x03FF, 0x0400, 0x7E00, 0x7C01, 0xFD55], dtype=np.uint16)
        values = quantize(rng.standard_normal(n).astype(np.float32), ty)
        values[:len(specials)] = specials.view(np.float16)
        raw = values.view(np.uint8)
        return raw, dequantize(raw, ty), "`quantize` of normal floats after ±0, ±inf, max, subnormals and NaNs (quiet, signalling)"
    if ty == T.BF16:
        specials = np.array([0x0000, 0x8000, 0x7F80, 0xFF80, 0x7F7F, 0x0001, 0x7FC0, 0x7F81, 0xFFA5], dtype=np.uint16)
        raw = quantize(rng.standard_normal(n).astype(np.float32), ty).view(np.uint16).copy()
        raw[:len(specials)] = specials
        raw = raw.view(np.uint8)
        return raw, dequantize(raw, ty), "`quantize` of normal floats after ±0, ±inf, max, a subnormal and NaNs"
    if ty == T.F64:
        specials = np.array(
            [1e300, -1e300, 1e-300, 3.4028235677973366e38, 3.4028235e38, 1e-40, 1 + 2.0**-24,
             1 + 3 * 2.0**-24, -(1 + 2.0**-24), np.inf, -np.inf, -0.0], dtype=np.float64)
        values = rng.standard_normal(n) * 1000.0
        values[:len(specials)] = specials
        with np.errstate(over="ignore"):
            expected = values.astype(np.float32)
        return values.view(np.uint8), expected, "normal floats after overflow, underflow, subnormal and halfway cases"
    dtype = {T.I8: np.int8, T.I16: np.int16, T.I32: np.int32, T.I64: np.int64}[ty]
    info = np.iinfo(dtype)
    values = rng.integers(info.min, info.max, size=n, dtype=dtype, endpoint=True)
    edges = [info.min, info.max, 0, -1, 1]
    if ty in (T.I32, T.I64):
        edges += [2**24 + 1, -(2**24 + 1), 2**24 + 3, 2**31 - 1]
    if ty == T.I64:
        edges += [2**53 + 2**29 + 1, 2**53 + 2**29, 2**62 + 2**38 + 1]
    values[:len(edges)] = np.array(edges, dtype=dtype)
    return values.view(np.uint8), values.astype(np.float32), "random integers over the whole range after the extremes and rounding cases"


METADATA = [
    ("nnx.u8", 200, GGUFValueType.UINT8),
    ("nnx.i8", -100, GGUFValueType.INT8),
    ("nnx.u16", 60000, GGUFValueType.UINT16),
    ("nnx.i16", -30000, GGUFValueType.INT16),
    ("nnx.u32", 4000000000, GGUFValueType.UINT32),
    ("nnx.i32", -2000000000, GGUFValueType.INT32),
    ("nnx.u64", 2**64 - 1, GGUFValueType.UINT64),
    ("nnx.i64", -(2**63), GGUFValueType.INT64),
    ("nnx.f32", 1.5, GGUFValueType.FLOAT32),
    ("nnx.f64", 0.1, GGUFValueType.FLOAT64),
    ("nnx.bool", True, GGUFValueType.BOOL),
    ("nnx.string", "grüße, 世界", GGUFValueType.STRING),
    ("nnx.array_i32", [1, -2, 3, 2147483647], GGUFValueType.ARRAY),
    ("nnx.array_u64", [0, 1, 2**64 - 1], GGUFValueType.ARRAY, GGUFValueType.UINT64),
    ("nnx.array_f32", [0.5, -1.25], GGUFValueType.ARRAY),
    ("nnx.array_bool", [True, False, True], GGUFValueType.ARRAY),
    ("nnx.array_string", ["a", "", "bé"], GGUFValueType.ARRAY),
    ("nnx.array_nested", [[1, 2], [3], [4, 5, 6]], GGUFValueType.ARRAY),
]


def element_type(key) -> str:
    """How the README names a metadata entry's GGUF type."""
    if key[2] != GGUFValueType.ARRAY:
        return key[2].name
    if len(key) > 3:
        return f"ARRAY of {key[3].name}"
    inner = GGUFValueType.get_type(key[1][0])
    if inner == GGUFValueType.ARRAY:
        return f"ARRAY of ARRAY of {GGUFValueType.get_type(key[1][0][0]).name}"
    return f"ARRAY of {inner.name}"


def write_gguf(path: Path, fixtures: list[tuple[T, np.ndarray]]) -> None:
    writer = gguf.GGUFWriter(path, arch="nnx-fixture")
    for key in METADATA:
        writer.add_key_value(key[0], key[1], key[2], sub_type=key[3] if len(key) > 3 else None)
    for ty, raw in fixtures:
        writer.add_tensor(ty.name.lower(), raw.reshape(ROWS, -1), raw_dtype=ty)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def check_gguf(path: Path, fixtures: list[tuple[T, np.ndarray]]) -> None:
    """Reads the file back with gguf-py: names, types, shapes and bytes as written."""
    reader = gguf.GGUFReader(path)
    tensors = {t.name: t for t in reader.tensors}
    assert len(tensors) == len(fixtures)
    for ty, raw in fixtures:
        t = tensors[ty.name.lower()]
        assert t.tensor_type == ty, ty
        assert list(t.shape) == [COLS, ROWS], (ty, t.shape)
        assert np.asarray(t.data).tobytes() == raw.tobytes(), ty
    for key in METADATA:
        assert key[0] in reader.fields, key[0]


def readme(gguf_version: str, notes: list[tuple[str, str]], path: Path) -> str:
    lines = [
        "# ggml tensor types",
        "",
        "Blocks of every ggml tensor type that nnx decodes, and their values as the `gguf` Python package",
        "decodes them, for bit-exact comparison. Made by",
        "",
        "    ~/.cache/nnx/venv/bin/python scripts/gguf_fixtures.py",
        "",
        f"with gguf {gguf_version} and numpy {np.__version__} (seed {SEED}; running it again writes the same files).",
        "",
        f"- `<TYPE>.blocks`: {ROWS} rows of {COLS} values, the raw bytes of their blocks (row after row).",
        "- `<TYPE>.f32`: the same values decoded, little-endian f32, by `gguf.quants.dequantize`; for F64 and",
        "  I8 to I64, which gguf-py does not decode (it raises `NotImplementedError`), by numpy's",
        "  `astype(np.float32)`. Q8_1 and Q8_K, activation types, have no files.",
        f"- `all.gguf`: every type as one tensor named by it in lower case (`q4_k`), numpy shape ({ROWS}, {COLS}),",
        f"  that is ggml `ne = [{COLS}, {ROWS}]`, written by `gguf.GGUFWriter` with `raw_dtype=` the type, its",
        "  bytes those of `<TYPE>.blocks`; architecture `nnx-fixture`, and the metadata below.",
        "",
        "| type | blocks |",
        "|---|---|",
    ]
    lines += [f"| {name} | {note} |" for name, note in notes]
    lines += [
        "",
        "Metadata of `all.gguf`, besides `general.architecture`:",
        "",
        "| key | GGUF type | value |",
        "|---|---|---|",
    ]
    lines += [f"| `{key[0]}` | {element_type(key)} | `{key[1]!r}` |" for key in METADATA]
    return "\n".join(lines) + "\n"


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_OUT
    out.mkdir(parents=True, exist_ok=True)
    gguf_version = version("gguf")

    covered = set(QUANTIZED) | set(RANDOM) | set(PLAIN) | NOT_DECODED
    missing = [ty.name for ty in T if ty not in covered and ty.name != "Q1_0"]
    assert not missing, f"types without a fixture plan: {missing}"

    fixtures, notes = [], []
    for ty in PLAIN + QUANTIZED + RANDOM:
        if ty in PLAIN:
            raw, expected, note = make_plain(ty)
        else:
            blocks, note = make_quantized(ty) if ty in QUANTIZED else make_random(ty)
            raw = blocks.reshape(-1)
            with np.errstate(over="ignore"):  # MXFP4's exponent 255
                expected = dequantize(raw.reshape(ROWS, -1), ty)
            nan = np.isnan(expected)
            assert not nan.any(), f"{ty.name}: NaN values would not be portable"
            assert ty == T.MXFP4 or np.isfinite(expected).all(), ty.name
        raw = np.ascontiguousarray(raw, dtype=np.uint8).reshape(-1)
        expected = np.asarray(expected, dtype=np.float32).reshape(-1)
        assert raw.size == ROWS * COLS // GGML_QUANT_SIZES[ty][0] * GGML_QUANT_SIZES[ty][1]
        assert expected.size == ROWS * COLS
        (out / f"{ty.name}.blocks").write_bytes(raw.tobytes())
        (out / f"{ty.name}.f32").write_bytes(expected.astype("<f4").tobytes())
        fixtures.append((ty, raw))
        notes.append((ty.name, note))

    gguf_path = out / "all.gguf"
    write_gguf(gguf_path, fixtures)
    check_gguf(gguf_path, fixtures)
    (out / "README.md").write_text(readme(gguf_version, notes, out))
    total = sum(p.stat().st_size for p in out.iterdir())
    print(f"wrote {len(fixtures)} types and all.gguf to {out} ({total} bytes) with gguf {gguf_version}")


if __name__ == "__main__":
    main()
