"""Helpers of the `nnx` Python package's tests: bit comparisons and snippets run in a fresh
interpreter."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two arrays have the same dtype, shape and bytes (NaN payloads and signed zeros
    included)."""
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes()


def describe_difference(a: np.ndarray, b: np.ndarray) -> str:
    """Where two float32 arrays of one shape first differ in their bits, for a failure message."""
    a32 = np.ascontiguousarray(a, dtype=np.float32).reshape(-1)
    b32 = np.ascontiguousarray(b, dtype=np.float32).reshape(-1)
    wrong = np.flatnonzero(a32.view(np.uint32) != b32.view(np.uint32))
    if wrong.size == 0:
        return "same bits"
    i = int(wrong[0])
    return (
        f"{wrong.size} of {a32.size} values differ; first at {i}: "
        f"got {a32[i]!r} ({a32.view(np.uint32)[i]:#010x}), want {b32[i]!r} ({b32.view(np.uint32)[i]:#010x})"
    )


def run_python(code: str, *args: str, cwd: Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """Runs ``code`` in a fresh interpreter (the one running the tests) and returns what it did:
    a crash there (a signal, an abort) cannot take the test run with it."""
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def last_json_line(completed: subprocess.CompletedProcess) -> dict:
    """The JSON object a snippet printed last, with the whole output in the failure message."""
    assert completed.returncode == 0, (
        f"exit status {completed.returncode}\nstdout:\n{completed.stdout}\nstderr:\n{completed.stderr}"
    )
    lines = [line for line in completed.stdout.splitlines() if line.startswith("{")]
    assert lines, f"no JSON line in the output\nstdout:\n{completed.stdout}\nstderr:\n{completed.stderr}"
    return json.loads(lines[-1])
