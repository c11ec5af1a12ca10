"""No copy: reading a 1 GiB SafeTensors file through `nnx.open` maps it, so the process's resident
memory grows by the pages touched, not by the file's size."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest

from support import last_json_line, run_python

TENSORS, ROWS, COLS = 64, 4096, 1024
TENSOR_BYTES = ROWS * COLS * 4
GIB = 1 << 30
LIMIT = 64 << 20

# Opens the file, reads every tensor's first row and last row, and reports the growth of VmRSS.
READER = """
import json, sys
import numpy as np
import nnx

def rss():
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")

path = sys.argv[1]
before = rss()
archive = nnx.open(path)
firsts, lasts = [], []
for name in archive.keys():
    array = archive[name]
    firsts.append(np.array(array[0]).tolist())
    lasts.append(float(array[-1, -1]))
after = rss()
print(json.dumps({
    "names": archive.keys(),
    "growth": after - before,
    "firsts": [[row[0], row[1], row[-1]] for row in firsts],
    "lasts": lasts,
    "owndata": [bool(archive[name].flags.owndata) for name in archive.keys()],
}))
"""


def first_row(i: int) -> np.ndarray:
    return np.arange(COLS, dtype=np.float32) + i * 10_000


def write_big_file(path: Path) -> None:
    """A SafeTensors file of 64 f32 tensors of 4096 x 1024 (1 GiB of data), written header first
    and then only the bytes that are not zero: each tensor's first row and last value. The rest is
    left to the file system as zeros, so the writer needs no memory for it."""
    header = {
        f"t{i:02d}": {"dtype": "F32", "shape": [ROWS, COLS], "data_offsets": [i * TENSOR_BYTES, (i + 1) * TENSOR_BYTES]}
        for i in range(TENSORS)
    }
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    start = 8 + len(text)
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        f.truncate(start + TENSORS * TENSOR_BYTES)
        for i in range(TENSORS):
            f.seek(start + i * TENSOR_BYTES)
            f.write(first_row(i).tobytes())
            f.seek(start + (i + 1) * TENSOR_BYTES - 4)
            f.write(np.float32(-i).tobytes())


@pytest.fixture
def big_file(tmp_path: Path):
    path = tmp_path / "big.safetensors"
    write_big_file(path)
    assert path.stat().st_size > GIB
    yield path
    path.unlink(missing_ok=True)


def test_reading_a_1_gib_file_maps_it(big_file: Path) -> None:
    report = last_json_line(run_python(READER, str(big_file)))
    assert report["names"] == [f"t{i:02d}" for i in range(TENSORS)]
    for i, (first, last) in enumerate(zip(report["firsts"], report["lasts"])):
        row = first_row(i)
        assert first == [float(row[0]), float(row[1]), float(row[-1])], f"t{i:02d}"
        assert last == float(-i), f"t{i:02d}"
    assert not any(report["owndata"]), "arrays that own their data were copied"
    growth = report["growth"]
    assert growth < LIMIT, f"resident memory grew by {growth / (1 << 20):.1f} MiB reading first rows of a 1 GiB file"
