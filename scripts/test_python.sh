#!/usr/bin/env bash
# Builds the `nnx` Python wheel (maturin, abi3, the dev profile: the tests check behaviour, the
# benchmark builds its own release wheel), installs it into the venv of `scripts/setup.sh`, and
# runs the Python package's tests with pytest.
#
#     scripts/test_python.sh [PYTEST ARGS...]
#
# Environment: NNX_CACHE (default ~/.cache/nnx) holds the venv; NNX_WHEEL is set for the tests
# to the wheel built, whose tags they check.
set -euo pipefail
cd "$(dirname "$0")/.."

cache="${NNX_CACHE:-$HOME/.cache/nnx}"
venv="$cache/venv"
[ -x "$venv/bin/maturin" ] || { echo "no maturin in $venv: run scripts/setup.sh first" >&2; exit 1; }

out="target/wheels"
rm -f "$out"/nnx-*.whl
"$venv/bin/maturin" build --quiet --profile "${NNX_PY_PROFILE:-dev}" --interpreter "$venv/bin/python" --out "$out"
wheel=$(ls "$out"/nnx-*.whl)
"$venv/bin/pip" install --quiet --disable-pip-version-check --force-reinstall --no-deps "$wheel"
export NNX_WHEEL="$PWD/$wheel"
exec "$venv/bin/python" -m pytest -q python/tests "$@"
