"""Benchmark of the `nnx` Python package against the reference Python packages, printed as one
markdown table.

    NNX_PY_PROFILE=release scripts/test_python.sh -x -k nothing   # build and install a release wheel
    ~/.cache/nnx/venv/bin/python benches/python.py [--rounds N] [--only open,dequantize,read]

(or `pip install .` in a clone, with `gguf`, `safetensors`, numpy and `ml_dtypes` installed
beside it). A debug wheel, which `scripts/test_python.sh` builds by default, measures nothing
useful.

Each case is measured in turn, nnx then the reference, for N rounds (default 5), and the table
gives the best round of each:

- open: open a GGUF file whose vocabulary has 262,144 tokens (`tokenizer.ggml.tokens` strings,
  `tokenizer.ggml.scores`, `tokenizer.ggml.token_type`) and 300 small tensors, and list the
  tensor names: `nnx.open(path).keys()` against `gguf.GGUFReader(path).tensors`; and the same
  with the vocabulary read into Python (`metadata()` against the field's `contents()`).
- dequantize: decode a 4096 x 4096 Q4_K tensor (made by `nnx.quantize`, as gguf-py has no Q4_K
  encoder) to float32: `nnx.dequantize` against `gguf.quants.dequantize`. The results are checked
  equal bit for bit.
- read: open a 1 GiB SafeTensors file (64 f32 tensors of 4096 x 1024) and copy every tensor into
  one preallocated buffer: `nnx.open` against `safetensors.safe_open(framework="numpy")`. The
  file is read from the page cache (it was just written) in both.

The files are written by the setup into a temporary folder (under `NNX_BENCH_DIR` when set, else
the system's temporary folder), removed at the end.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import struct
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import gguf
import numpy as np
import safetensors
from gguf import GGMLQuantizationType, GGUFReader, GGUFWriter

import nnx

VOCAB = 262_144
GGUF_TENSORS = 300
Q4K_SHAPE = (4096, 4096)
ST_TENSORS, ST_ROWS, ST_COLS = 64, 4096, 1024


def best_of(rounds: int, cases: list[tuple[str, Callable[[], object]]]) -> dict[str, float]:
    """Runs the cases one after the other, `rounds` times, and returns each one's best time (s)."""
    best = {name: float("inf") for name, _ in cases}
    for _ in range(rounds):
        for name, run in cases:
            start = time.perf_counter()
            run()
            best[name] = min(best[name], time.perf_counter() - start)
    return best


def write_gguf(path: Path) -> list[str]:
    """A GGUF file with a 262,144-token vocabulary and 300 small tensors; returns the tensor names."""
    rng = np.random.default_rng(0)
    writer = GGUFWriter(path, "llama")
    writer.add_block_count(1)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list([f"tok{i}" if i % 7 else f"Ġwörd{i}" for i in range(VOCAB)])
    writer.add_token_scores(rng.standard_normal(VOCAB).astype(np.float32).tolist())
    writer.add_token_types([1 if i % 13 else 3 for i in range(VOCAB)])
    names = []
    for i in range(GGUF_TENSORS):
        name = f"blk.{i // 10}.w{i % 10}.weight"
        array = rng.standard_normal((16, 64)).astype(np.float32 if i % 2 else np.float16)
        writer.add_tensor(name, array)
        names.append(name)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return names


def write_safetensors(path: Path) -> None:
    """A SafeTensors file of 64 random f32 tensors of 4096 x 1024 (1 GiB), written tensor by
    tensor so that the writer holds one tensor at a time."""
    tensor_bytes = ST_ROWS * ST_COLS * 4
    header = {
        f"layers.{i}.weight": {
            "dtype": "F32",
            "shape": [ST_ROWS, ST_COLS],
            "data_offsets": [i * tensor_bytes, (i + 1) * tensor_bytes],
        }
        for i in range(ST_TENSORS)
    }
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    rng = np.random.default_rng(1)
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for _ in range(ST_TENSORS):
            f.write(rng.standard_normal((ST_ROWS, ST_COLS), dtype=np.float32).tobytes())


def bench_open(folder: Path, rounds: int) -> list[tuple[str, float, float, str]]:
    path = folder / "vocab.gguf"
    names = write_gguf(path)
    assert nnx.open(path).keys() == names
    assert [t.name for t in GGUFReader(path).tensors] == names
    tokens = "tokenizer.ggml.tokens"
    assert nnx.open(path).metadata()[tokens] == GGUFReader(path).fields[tokens].contents()

    def nnx_list() -> object:
        return nnx.open(path).keys()

    def gguf_list() -> object:
        return [t.name for t in GGUFReader(path).tensors]

    def nnx_vocab() -> object:
        archive = nnx.open(path)
        return archive.keys(), archive.metadata()[tokens]

    def gguf_vocab() -> object:
        reader = GGUFReader(path)
        return [t.name for t in reader.tensors], reader.fields[tokens].contents()

    best = best_of(rounds, [("nnx", nnx_list), ("gguf", gguf_list)])
    vocab = best_of(max(1, rounds // 2), [("nnx", nnx_vocab), ("gguf", gguf_vocab)])
    path.unlink()
    return [
        ("open a GGUF file (262,144-token vocabulary, 300 tensors) and list its tensors", best["nnx"], best["gguf"], ">= 50x"),
        ("the same and read the vocabulary into Python", vocab["nnx"], vocab["gguf"], "-"),
    ]


def bench_dequantize(rounds: int) -> list[tuple[str, float, float, str]]:
    rng = np.random.default_rng(2)
    x = (rng.standard_normal(Q4K_SHAPE) * 0.02).astype(np.float32)
    blocks = nnx.quantize(x, "Q4_K")
    del x
    ours = nnx.dequantize(blocks, "Q4_K", Q4K_SHAPE)
    theirs = gguf.quants.dequantize(blocks, GGMLQuantizationType.Q4_K)
    assert ours.shape == theirs.shape and ours.tobytes() == theirs.tobytes(), "nnx and gguf-py decode differently"
    del ours, theirs
    best = best_of(
        rounds,
        [
            ("nnx", lambda: nnx.dequantize(blocks, "Q4_K", Q4K_SHAPE)),
            ("gguf", lambda: gguf.quants.dequantize(blocks, GGMLQuantizationType.Q4_K)),
        ],
    )
    return [("dequantize a 4096 x 4096 Q4_K tensor to f32", best["nnx"], best["gguf"], ">= 10x")]


def bench_read(folder: Path, rounds: int) -> list[tuple[str, float, float, str]]:
    path = folder / "model.safetensors"
    write_safetensors(path)
    buffer = np.empty((ST_TENSORS, ST_ROWS, ST_COLS), dtype=np.float32)

    def nnx_read() -> None:
        archive = nnx.open(path)
        for i, name in enumerate(archive.keys()):
            np.copyto(buffer[i], archive[name])

    def safetensors_read() -> None:
        with safetensors.safe_open(path, framework="numpy") as f:
            for i, name in enumerate(f.offset_keys()):
                np.copyto(buffer[i], f.get_tensor(name))

    nnx_read()
    checksum = float(buffer[:, 0, :].sum())
    safetensors_read()
    assert float(buffer[:, 0, :].sum()) == checksum, "nnx and safetensors read different values"
    best = best_of(rounds, [("nnx", nnx_read), ("safetensors", safetensors_read)])
    path.unlink()
    return [("open a 1 GiB SafeTensors file and copy out every tensor", best["nnx"], best["safetensors"], ">= 1.0x")]


def seconds(value: float) -> str:
    if value >= 1:
        return f"{value:.2f} s"
    if value >= 1e-3:
        return f"{value * 1e3:.1f} ms"
    return f"{value * 1e6:.0f} µs"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="rounds per case; the best is reported")
    parser.add_argument("--only", default="open,dequantize,read", help="comma-separated cases to run")
    args = parser.parse_args()
    only = set(args.only.split(","))
    rows = []
    with tempfile.TemporaryDirectory(prefix="nnx-bench-", dir=os.environ.get("NNX_BENCH_DIR")) as folder:
        folder = Path(folder)
        if "open" in only:
            rows += bench_open(folder, args.rounds)
        if "dequantize" in only:
            rows += bench_dequantize(args.rounds)
        if "read" in only:
            rows += bench_read(folder, args.rounds)
    print(
        f"nnx {nnx.__version__}, gguf {importlib.metadata.version('gguf')}, "
        f"safetensors {safetensors.__version__}, numpy {np.__version__}; Python {platform.python_version()}, "
        f"{platform.machine()}, {os.cpu_count()} CPUs; best of {args.rounds} rounds"
    )
    print()
    print("| case | nnx | reference | speedup | target |")
    print("|---|---:|---:|---:|---|")
    for case, ours, theirs, target in rows:
        print(f"| {case} | {seconds(ours)} | {seconds(theirs)} | {theirs / ours:.1f}x | {target} |")


if __name__ == "__main__":
    main()
