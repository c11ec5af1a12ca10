"""The wheel `scripts/test_python.sh` built (named by NNX_WHEEL): one wheel for every CPython from
3.10 on (the stable ABI) on manylinux, and not a pure-Python wheel."""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

import pytest

import nnx


@pytest.fixture(scope="module")
def wheel() -> Path:
    named = os.environ.get("NNX_WHEEL")
    if not named:
        # Under CI the wheel is always built: its absence is a failure, never a skip.
        if os.environ.get("CI"):
            pytest.fail("NNX_WHEEL is not set: run the tests with scripts/test_python.sh, which builds the wheel")
        pytest.skip("NNX_WHEEL is not set: scripts/test_python.sh sets it to the wheel it built")
    path = Path(named)
    assert path.is_file(), f"NNX_WHEEL names {path}, which is not a file"
    return path


def tags(wheel: Path) -> tuple[str, str, str, str, str]:
    """The name, version and the python, ABI and platform tags of a wheel's file name."""
    assert wheel.suffix == ".whl", wheel.name
    parts = wheel.stem.split("-")
    assert len(parts) == 5, f"{wheel.name}: name-version-python-abi-platform"
    return tuple(parts)  # type: ignore[return-value]


def test_the_file_name_says_abi3_and_manylinux(wheel: Path) -> None:
    name, version, python, abi, platform = tags(wheel)
    assert name == "nnx"
    assert version == nnx.__version__
    assert python == "cp310", wheel.name
    assert abi == "abi3", wheel.name
    assert all(tag.startswith("manylinux") for tag in platform.split(".")), wheel.name


def test_the_wheel_metadata_is_not_purelib(wheel: Path) -> None:
    name, version, python, abi, platform = tags(wheel)
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        (wheel_file,) = [n for n in names if n.endswith(".dist-info/WHEEL")]
        text = archive.read(wheel_file).decode()
        metadata = dict(line.split(": ", 1) for line in text.splitlines() if ": " in line)
        assert metadata.get("Root-Is-Purelib") == "false", text
        wheel_tags = [line.split(": ", 1)[1] for line in text.splitlines() if line.startswith("Tag: ")]
        assert wheel_tags, text
        assert all(t.startswith("cp310-abi3-manylinux") for t in wheel_tags), wheel_tags
        assert f"{python}-{abi}-{platform.split('.')[0]}" in wheel_tags
        # The extension module and the typed Python layer are both in it.
        assert any(n.startswith("nnx/_nnx") and n.endswith(".so") for n in names), names
        assert "nnx/__init__.py" in names, names
        assert "nnx/__init__.pyi" in names or "nnx/py.typed" in names, names


def test_the_installed_package_is_the_extension() -> None:
    import nnx._nnx as extension

    assert Path(extension.__file__).suffix == ".so"
    assert ".abi3." in Path(extension.__file__).name, extension.__file__
