"""Bad input raises an `nnx.Error` that names the file, and never takes the interpreter down: each
case runs in its own interpreter, which must exit cleanly after catching the error."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from support import FIXTURES, run_python

GPT2 = FIXTURES / "gpt2-tiny" / "model.safetensors"

# Runs CALL with `path` set to argv[1], and reports the nnx error it raises.
SNIPPET = """
import json, sys
import numpy as np
import nnx
path = sys.argv[1]
try:
    {call}
except {catch} as error:
    print(json.dumps({{
        "type": type(error).__name__,
        "mro": [cls.__name__ for cls in type(error).__mro__],
        "message": str(error),
    }}))
    sys.exit(0)
print(json.dumps({{"type": None}}))
sys.exit(3)
"""

READ_ALL = "archive = nnx.open(path); [np.asarray(archive[name]).sum() for name in archive.keys()]"


def raised(call: str, path: Path | str, catch: str = "nnx.Error") -> dict:
    """What `call` raised in a fresh interpreter; fails unless that interpreter caught an error and
    exited cleanly."""
    done = run_python(SNIPPET.format(call=call, catch=catch), str(path))
    output = f"exit status {done.returncode}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    assert done.returncode == 0, f"the interpreter did not exit cleanly: {output}"
    assert "panicked" not in done.stderr and "PanicException" not in done.stderr, output
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert lines, output
    report = json.loads(lines[-1])
    assert report["type"] is not None, f"no error raised: {output}"
    return report


def assert_names(report: dict, kind: str, path: Path) -> None:
    assert report["type"] == kind, report
    assert "Error" in report["mro"], report
    assert str(path) in report["message"], f"the message does not name {path}: {report['message']}"


def write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def safetensors_header(header: dict) -> bytes:
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text


def test_a_truncated_safetensors_file(tmp_path: Path) -> None:
    data = GPT2.read_bytes()
    path = write(tmp_path / "truncated.safetensors", data[: len(data) // 2])
    assert_names(raised(READ_ALL, path), "FormatError", path)


def test_a_file_shorter_than_the_header_length(tmp_path: Path) -> None:
    path = write(tmp_path / "tiny.safetensors", b"\x10\x00\x00")
    assert_names(raised(READ_ALL, path), "FormatError", path)


def test_a_header_of_garbage(tmp_path: Path) -> None:
    garbage = bytes((i * 37 + 11) % 256 for i in range(64))
    path = write(tmp_path / "garbage.safetensors", struct.pack("<Q", len(garbage)) + garbage + b"\0" * 64)
    assert_names(raised(READ_ALL, path), "FormatError", path)


def test_a_header_that_is_json_but_not_a_header(tmp_path: Path) -> None:
    text = b'{"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0]}}   '
    path = write(tmp_path / "not-a-header.safetensors", struct.pack("<Q", len(text)) + text + b"\0" * 16)
    assert_names(raised(READ_ALL, path), "FormatError", path)


@pytest.mark.parametrize("length", [1 << 40, (1 << 64) - 1, 200])
def test_a_header_length_past_the_file(tmp_path: Path, length: int) -> None:
    path = write(tmp_path / "long-header.safetensors", struct.pack("<Q", length) + b'{"a": 1}' + b" " * 40)
    assert_names(raised(READ_ALL, path), "FormatError", path)


def test_data_offsets_past_the_file(tmp_path: Path) -> None:
    header = safetensors_header({"w": {"dtype": "F32", "shape": [1024, 1024], "data_offsets": [0, 4 << 20]}})
    path = write(tmp_path / "short-data.safetensors", header + b"\0" * 64)
    assert_names(raised(READ_ALL, path), "FormatError", path)


def gguf_header(tensors: int, kvs: int) -> bytes:
    return b"GGUF" + struct.pack("<I", 3) + struct.pack("<Q", tensors) + struct.pack("<Q", kvs)


@pytest.mark.parametrize(("tensors", "kvs"), [(1 << 62, 0), ((1 << 64) - 1, 0), (0, 1 << 62), (3_000_000, 0)])
def test_a_gguf_file_with_a_huge_count(tmp_path: Path, tensors: int, kvs: int) -> None:
    path = write(tmp_path / "huge-count.gguf", gguf_header(tensors, kvs) + b"\0" * 64)
    assert_names(raised(READ_ALL, path), "FormatError", path)


def test_a_gguf_string_longer_than_the_file(tmp_path: Path) -> None:
    key = b"general.architecture"
    body = struct.pack("<Q", len(key)) + key + struct.pack("<I", 8) + struct.pack("<Q", 1 << 60) + b"llama"
    path = write(tmp_path / "long-string.gguf", gguf_header(0, 1) + body)
    assert_names(raised(READ_ALL, path), "FormatError", path)


def test_a_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "absent" / "model.safetensors"
    assert_names(raised("nnx.open(path)", path), "IoError", path)


def test_a_missing_file_for_safe_open(tmp_path: Path) -> None:
    path = tmp_path / "absent.safetensors"
    assert_names(raised("nnx.safe_open(path, framework='numpy')", path), "IoError", path)


def test_a_missing_key() -> None:
    report = raised("nnx.open(path)['no.such.tensor']", GPT2)
    assert_names(report, "EntryError", GPT2)
    assert "KeyError" in report["mro"], report
    assert "no.such.tensor" in report["message"], report
    # Caught as a KeyError too, by code that knows nothing of nnx.
    assert raised("nnx.open(path)['no.such.tensor']", GPT2, catch="KeyError")["type"] == "EntryError"
    assert raised("nnx.open(path).info('no.such.tensor')", GPT2)["type"] == "EntryError"


def test_an_unknown_ggml_type_to_quantize() -> None:
    call = "nnx.quantize(np.zeros((2, 256), dtype=np.float32), 'Q9_Z')"
    report = raised(call, "-", catch="(ValueError, nnx.Error)")
    message = report["message"]
    assert "Q9_Z" in message, message
    for valid in ["Q4_K", "Q8_0", "IQ4_XS"]:
        assert valid in message, f"the message does not list the valid types: {message}"


def test_an_unknown_ggml_type_to_dequantize() -> None:
    call = "nnx.dequantize(bytes(144), 'Q9_Z', (256,))"
    report = raised(call, "-", catch="(ValueError, nnx.Error)")
    assert "Q9_Z" in report["message"] and "Q4_K" in report["message"], report


def test_a_malicious_pickle_in_a_fresh_interpreter(tmp_path: Path) -> None:
    path = FIXTURES / "torch" / "malicious.pkl"
    done = run_python(SNIPPET.format(call="nnx.open(path)", catch="nnx.Error"), str(path), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.splitlines()[-1])
    assert report["type"] == "FormatError", report
    assert "posix.system" in report["message"] and str(path) in report["message"], report
    assert not (tmp_path / "nnx-pwned").exists()
