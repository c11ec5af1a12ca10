#!/usr/bin/env bash
# Writes tests/fixtures/published/: small checkpoints quantized by the publishers' own Python code
# (transformers' FineGrainedFP8, compressed-tensors, GPTQModel, AutoAWQ), their dequantized
# weights and the transformers reference of each dequantized twin. See make_goldens.py and
# tests/fixtures/published/README.md.
#
#     scripts/published/make_goldens.sh [OUT_DIR] [CASE ...]   # default: tests/fixtures/published
#
# Environment (optional):
#   NNX_CACHE      cache folder, default ~/.cache/nnx
#   ORACLE_VENV    venv with torch/transformers (made by scripts/models/make_goldens.sh), default
#                  $NNX_CACHE/oracle; the packages below are installed into it if missing.
set -euo pipefail

# Versions the fixtures were made with (torch 2.15.0 CPU and transformers 5.25.0 in the venv).
CT_VERSION=0.20.1
GPTQMODEL_VERSION=7.7.0
AUTOAWQ_VERSION=0.2.9

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
out="${1:-$root/tests/fixtures/published}"
shift || true
cache="${NNX_CACHE:-$HOME/.cache/nnx}"
oracle="${ORACLE_VENV:-$cache/oracle}"
py="$oracle/bin/python"

[[ -x $py ]] || { echo "no venv at $oracle: run scripts/models/make_goldens.sh first" >&2; exit 1; }
version() { "$py" -c "import importlib.metadata as m; print(m.version('$1'))" 2>/dev/null || true; }
if [[ $(version compressed-tensors) != "$CT_VERSION" ]]; then
    "$oracle/bin/pip" install "compressed-tensors==$CT_VERSION"
fi
if [[ $(version gptqmodel) != "$GPTQMODEL_VERSION" ]]; then
    # An sdist; no extension is compiled at install (GPTQModel builds its kernels on first use,
    # and make_goldens.py uses only its Python packing and torch kernel).
    "$oracle/bin/pip" install "gptqmodel==$GPTQMODEL_VERSION"
fi
if [[ $(version autoawq) != "$AUTOAWQ_VERSION" ]]; then
    # Without dependencies: only its pure-torch quantizer, GEMM packing and dequantization are
    # used (its pins would downgrade torch and transformers).
    "$oracle/bin/pip" install --no-deps "autoawq==$AUTOAWQ_VERSION"
fi

mkdir -p "$out"
out="$(cd "$out" && pwd)"
# GPTQModel writes its logs into the working folder: run it in a scratch one.
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
(cd "$scratch" && "$py" "$here/make_goldens.py" "$out" "$@")
du -sh "$out"
