"""Reading and decoding from several threads: the results equal one thread's, and nnx lets other
Python threads run while it decodes (it releases the GIL)."""

from __future__ import annotations

import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import safetensors.numpy

import nnx
from support import FIXTURES, same_bits

ALL = FIXTURES / "gguf" / "types" / "all.gguf"
LLAMA = FIXTURES / "llama-tiny" / "model.safetensors"
TYPES = ["q4_k", "q6_k", "iq2_xs", "q8_0", "bf16", "f16", "mxfp4", "iq4_xs"]


def work(archive: nnx.Archive, shared: nnx.Archive) -> dict:
    out = {}
    for _ in range(10):
        for name in TYPES:
            out[f"dq:{name}"] = archive.dequantize(name)
            out[f"raw:{name}"] = np.array(shared[name])
        for name in ["lm_head.weight", "model.norm.weight"]:
            out[f"st:{name}"] = np.array(nnx.open(LLAMA)[name])
    return out


def test_four_threads_read_and_decode_the_same_values() -> None:
    shared = nnx.open(ALL)
    expected = work(nnx.open(ALL), shared)
    with ThreadPoolExecutor(4) as pool:
        # Two threads share one archive, two open their own.
        results = list(pool.map(lambda i: work(shared if i % 2 else nnx.open(ALL), shared), range(4)))
    reference = safetensors.numpy.load_file(LLAMA)
    for result in results:
        assert result.keys() == expected.keys()
        for key, value in expected.items():
            assert same_bits(result[key], value), key
        assert same_bits(result["st:lm_head.weight"], reference["lm_head.weight"])


def test_decoding_lets_other_threads_run() -> None:
    rng = np.random.default_rng(3)
    cols = 4096
    row = (rng.standard_normal((256, cols)) * 0.02).astype(np.float32)
    rows = 1024
    while True:
        blocks = nnx.quantize(np.tile(row, (rows // 256, 1)), "Q4_K")
        start = time.perf_counter()
        expected = nnx.dequantize(blocks, "Q4_K", (rows, cols))
        if time.perf_counter() - start > 0.03 or rows >= 16384:
            break
        rows *= 2

    # A Python thread marks each millisecond in which it ran.
    seen: set[int] = set()
    stop = threading.Event()

    def mark() -> None:
        while not stop.is_set():
            seen.add(int(time.perf_counter() * 1000))

    switch = sys.getswitchinterval()
    sys.setswitchinterval(0.001)
    thread = threading.Thread(target=mark)
    thread.start()
    windows, touched = 0, 0
    try:
        deadline = time.perf_counter() + 5
        while windows < 100 and time.perf_counter() < deadline:
            start = time.perf_counter()
            decoded = nnx.dequantize(blocks, "Q4_K", (rows, cols))
            end = time.perf_counter()
            assert same_bits(decoded, expected)
            # The milliseconds inside the call, past the first few (a thread switch just before the
            # call lets the marker run up to a switch interval into it even under a held GIL).
            inside = range(int(start * 1000) + 4, int(end * 1000) - 1)
            windows += len(inside)
            touched += sum(ms in seen for ms in inside)
    finally:
        stop.set()
        thread.join()
        sys.setswitchinterval(switch)
    assert windows >= 20, f"decoding {rows} x {cols} Q4_K values was too quick to observe ({windows} ms)"
    # With the GIL held through the call, the marker could not run inside it at all.
    assert touched >= windows // 8, f"another thread ran in {touched} of {windows} ms spent decoding"
