"""Writes `nnx-core/src/quant/ggml/grids.rs`: the lookup tables of ggml's IQ and FP4 types, read
from the `gguf` Python package (which carries ggml's own tables).

    python scripts/gguf_tables.py [OUTPUT]   (default: nnx-core/src/quant/ggml/grids.rs)

Run it with the interpreter of the test environment (`~/.cache/nnx/venv/bin/python`, which
`scripts/setup.sh` fills). gguf-py stores each lattice packed as hexadecimal text with a value map
and unpacks it into float32 arrays; this script takes those unpacked arrays, checks that every
entry is a small integer, and packs each lattice point the way ggml does: value `t` of a point in
byte `t` (little-endian) of one u64 (8 values) or u32 (4 values), negative values as two's
complement bytes. The output is deterministic and laid out by hand under `#[rustfmt::skip]`.
"""

import sys
from importlib.metadata import version
from pathlib import Path

import numpy as np
from gguf import quants

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "nnx-core/src/quant/ggml/grids.rs"
WIDTH = 120


def lattice(cls) -> np.ndarray:
    """The (points, values) integer grid of an IQ type as gguf-py decodes it."""
    cls.init_grid()
    grid = np.asarray(cls.grid, dtype=np.float32)
    grid = grid.reshape(cls.grid_shape)
    ints = grid.astype(np.int64)
    assert np.array_equal(ints.astype(np.float32), grid), cls.__name__
    assert ints.min() >= -128 and ints.max() <= 255, cls.__name__
    return ints


def packed(points: np.ndarray) -> list[int]:
    """Each point as an integer holding value `t` in byte `t`."""
    out = []
    for point in points:
        word = 0
        for t, value in enumerate(point):
            word |= (int(value) & 0xFF) << (8 * t)
        out.append(word)
    return out


def rows(items: list[str]) -> list[str]:
    """Comma-separated items wrapped at WIDTH, indented by four spaces."""
    lines, line = [], ""
    for item in items:
        piece = f"{item},"
        if line and len(line) + 1 + len(piece) > WIDTH - 4:
            lines.append(line)
            line = piece
        else:
            line = f"{line} {piece}" if line else piece
    if line:
        lines.append(line)
    return [f"    {line}" for line in lines]


def table(doc: list[str], name: str, ty: str, items: list[str]) -> str:
    body = [f"/// {line}" if line else "///" for line in doc]
    body += ["#[rustfmt::skip]", f"pub(crate) const {name}: [{ty}; {len(items)}] = ["]
    body += rows(items)
    body.append("];")
    return "\n".join(body)


def grid_table(doc: list[str], name: str, cls, bits: int) -> str:
    points = lattice(cls)
    assert points.shape[1] * 8 == bits
    digits = bits // 4
    items = [f"0x{word:0{digits}x}" for word in packed(points)]
    values = ", ".join(str(v) for v in np.unique(points))
    return table(doc + ["", f"Values: {{{values}}}."], name, f"u{bits}", items)


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_OUT
    gguf_version = version("gguf")

    ksigns = list(quants.IQ2_XXS.ksigns)
    assert len(ksigns) == 128
    iq4nl = list(quants.IQ4_NL.kvalues)
    fp4 = list(quants.MXFP4.kvalues)
    assert list(quants.NVFP4.kvalues) == fp4, "NVFP4 and MXFP4 share one E2M1 table"
    assert len(iq4nl) == 16 and len(fp4) == 16

    tables = [
        grid_table(
            ["IQ2_XXS's lattice: 256 points of 8 magnitudes, value `t` in byte `t`."],
            "IQ2XXS_GRID", quants.IQ2_XXS, 64,
        ),
        grid_table(
            ["IQ2_XS's lattice: 512 points of 8 magnitudes, value `t` in byte `t`."],
            "IQ2XS_GRID", quants.IQ2_XS, 64,
        ),
        grid_table(
            ["IQ2_S's lattice: 1024 points of 8 magnitudes, value `t` in byte `t`."],
            "IQ2S_GRID", quants.IQ2_S, 64,
        ),
        grid_table(
            ["IQ3_XXS's lattice: 256 points of 4 magnitudes, value `t` in byte `t`."],
            "IQ3XXS_GRID", quants.IQ3_XXS, 32,
        ),
        grid_table(
            ["IQ3_S's lattice: 512 points of 4 magnitudes, value `t` in byte `t`."],
            "IQ3S_GRID", quants.IQ3_S, 32,
        ),
        grid_table(
            [
                "IQ1_S's and IQ1_M's lattice: 2048 points of 8 signed values, value `t` in byte `t`",
                "as an `i8`.",
            ],
            "IQ1S_GRID", quants.IQ1_S, 64,
        ),
        table(
            [
                "The sign patterns of IQ2_XXS, IQ2_XS and IQ3_XXS: a 7-bit index gives 8 sign bits (bit",
                "`t` set: value `t` is negative), the eighth bit making the count of negatives even.",
            ],
            "KSIGNS_IQ2XS", "u8", [f"0x{b:02x}" for b in ksigns],
        ),
        table(
            ["IQ4_NL's and IQ4_XS's non-linear codebook, indexed by a 4-bit code."],
            "KVALUES_IQ4NL", "i8", [str(v) for v in iq4nl],
        ),
        table(
            [
                "The E2M1 values of MXFP4 and NVFP4, doubled so that they are integers (the decoders",
                "halve the block scale instead), indexed by a 4-bit code whose high bit is the sign.",
            ],
            "KVALUES_FP4", "i8", [str(v) for v in fp4],
        ),
    ]

    header = [
        "//! Lookup tables of the IQ and FP4 types: lattice codebooks, sign patterns and codebooks.",
        "//!",
        f"//! Generated by `scripts/gguf_tables.py` from the tables of the `gguf` Python package {gguf_version}",
        "//! (ggml's own); regenerate rather than edit.",
    ]
    text = "\n".join(header) + "\n\n" + "\n\n".join(tables) + "\n"
    out.write_text(text)
    print(f"wrote {out} from gguf {gguf_version}")


if __name__ == "__main__":
    main()
