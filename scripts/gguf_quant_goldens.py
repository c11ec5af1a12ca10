"""Writes the gguf-py quantization goldens in tests/fixtures/gguf/quantize/: for each type,
`<TYPE>.input.f32` (rows of little-endian f32) and `<TYPE>.gguf_py` (what `gguf.quants.quantize`
makes of them, the rows' bytes end to end).

    python scripts/gguf_quant_goldens.py [OUT_DIR]   (default: tests/fixtures/gguf/quantize)

Types: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, MXFP4, TQ1_0, TQ2_0 (8 rows of 256 values), and F16 and BF16
(one row of special values: signed zeros, infinities, quiet and signalling NaNs with payloads,
rounding ties, subnormals, overflow). Needs `gguf` (0.19.0 made the committed files) and numpy;
the output is deterministic.
"""

import sys
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants

ROWS, COLS = 8, 256
BLOCK_TYPES = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.MXFP4, T.TQ1_0, T.TQ2_0]


def block_rows(seed: int) -> np.ndarray:
    """Rows meant to reach every branch: zeros, tiny, one-signed, ties, wide magnitudes."""
    rng = np.random.default_rng(seed)
    x = np.zeros((ROWS, COLS), dtype=np.float32)
    x[0] = rng.standard_normal(COLS)
    # small values with outliers, one a lone spike
    x[1] = 0.02 * rng.standard_normal(COLS)
    x[1, rng.random(COLS) < 0.04] *= 60
    x[1, 77] = -9.5
    # zeros of both signs: numpy's min and max along a row keep the last of equal values, so
    # the sign of Q4_1's and Q5_1's zero min is that of the last zero
    x[2] = np.where(rng.random(COLS) < 0.5, np.float32(-0.0), np.float32(0.0))
    # tiny: above and below f16's range for the scale, exact zeros, then a normal block
    x[3, :64] = 1e-7 * rng.standard_normal(64)
    x[3, 64:128] = 1e-30 * rng.standard_normal(64)
    x[3, 192:] = 3e-5 * rng.standard_normal(64)
    # all positive, then all negative
    x[4] = 0.5 + 1.5 * rng.random(COLS)
    x[4, rng.random(COLS) < 0.1] = 0.0
    x[4, rng.random(COLS) < 0.1] = -0.0
    x[7] = -3 * rng.random(COLS)
    # a coarse grid (rounding ties), a constant block, and exact powers of two with their
    # neighbours (the MXFP4 exponent and the 0.5 ties of the ternary types)
    x[5, :192] = 0.25 * rng.integers(-4, 5, 192)
    # blocks whose largest magnitude is just below 2, 4, ..., 64: float32's log2 rounds up there
    for b in range(6):
        x[5, 32 * b + 5] = np.nextafter(np.float32(2.0 ** (b + 1)), np.float32(0))
    x[5, 192:224] = 0.7
    powers = np.array([1.0, 2.0, 4.0, 0.5, 8.0, 0.25, 16.0, 3.0], dtype=np.float32)
    x[5, 224:232] = powers
    x[5, 232:240] = np.nextafter(powers, np.float32(0))
    x[5, 240:248] = np.nextafter(powers, np.float32(np.inf))
    x[5, 248:256] = -powers
    # each block of 32 at its own magnitude, 2^-14 .. 2^14
    for b in range(COLS // 32):
        x[6, 32 * b:32 * (b + 1)] = rng.standard_normal(32) * np.float32(2.0 ** (4 * b - 14))
    return x


def special_row() -> np.ndarray:
    bits = [
        0x00000000, 0x80000000, 0x7F800000, 0xFF800000,  # zeros, infinities
        0x7FC00000, 0xFFC00000, 0x7FC00001, 0x7F800001,  # quiet and signalling NaNs
        0x7FA00000, 0xFF812345, 0x7FFFFFFF, 0x7F802000,
        0x3F808000, 0x3F818000, 0x3F808001, 0x3F80FFFF,  # bf16 ties: even down, odd up, above
        0x3F801000, 0x3F803000, 0x3F801001, 0x3F800FFF,  # f16 ties (bit 12) and neighbours
        0x477FEFFF, 0x477FF000, 0x477FF001, 0x47800000,  # f16 overflow boundary
        0x7F7FFFFF, 0xFF7FFFFF, 0x7F7F8000, 0x00000001,  # f32 max (bf16 rounds to inf), subnormal
        0x33800000, 0x33000000, 0x33000001, 0x387FC000,  # f16 subnormals and underflow ties
        0x38800000, 0x387FE000, 0x00800000, 0x80400000,
    ]
    rng = np.random.default_rng(1234)
    extra = (rng.standard_normal(28) * 10.0 ** rng.integers(-8, 6, 28)).astype(np.float32)
    row = np.concatenate([np.array(bits, dtype=np.uint32).view(np.float32), extra])
    return row.reshape(1, -1)


def write(out: Path, name: str, x: np.ndarray, q: np.ndarray) -> None:
    (out / f"{name}.input.f32").write_bytes(x.astype("<f4").tobytes())
    (out / f"{name}.gguf_py").write_bytes(np.ascontiguousarray(q).view(np.uint8).tobytes())
    print(f"{name}: {x.shape[0]} rows x {x.shape[1]} values -> {q.nbytes} bytes")


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent / "tests/fixtures/gguf/quantize"
    out.mkdir(parents=True, exist_ok=True)
    for ty in BLOCK_TYPES:
        x = block_rows(0x9999 + int(ty))
        write(out, ty.name, x, quants.quantize(x, ty))
    with np.errstate(over="ignore", invalid="ignore"):
        for ty in (T.F16, T.BF16):
            x = special_row()
            write(out, ty.name, x, quants.quantize(x, ty))


if __name__ == "__main__":
    main()
