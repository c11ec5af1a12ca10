"""Shared fixtures of the `nnx` Python package's tests.

The tests compare nnx with the reference packages (`safetensors`, `gguf`, numpy, `ml_dtypes`) on
the repository's fixtures, which were made by those references and never by nnx. They expect the
package installed (``scripts/test_python.sh`` builds the wheel, installs it and runs them).
"""

from __future__ import annotations

import sys
from pathlib import Path

import ml_dtypes  # noqa: F401  (registers ``bfloat16`` with numpy, for the references' readers)
import pytest

# The tests' own helpers (`support.py`) import as a module whatever pytest's import mode.
sys.path.insert(0, str(Path(__file__).resolve().parent))

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"


@pytest.fixture(scope="session")
def repo() -> Path:
    """The repository's root folder."""
    return REPO


@pytest.fixture(scope="session")
def fixtures() -> Path:
    """``tests/fixtures`` of the repository."""
    assert FIXTURES.is_dir(), f"no fixtures folder at {FIXTURES}"
    return FIXTURES


@pytest.fixture(scope="session")
def gguf_types(fixtures: Path) -> Path:
    """``tests/fixtures/gguf/types``: blocks of every ggml type and gguf-py's decoding of them."""
    return fixtures / "gguf" / "types"


@pytest.fixture(scope="session")
def quantize_goldens(fixtures: Path) -> Path:
    """``tests/fixtures/gguf/quantize``: float inputs and the reference quantizers' bytes."""
    return fixtures / "gguf" / "quantize"
