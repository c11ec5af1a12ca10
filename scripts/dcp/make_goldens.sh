#!/usr/bin/env bash
# Writes tests/fixtures/dcp/: small PyTorch Distributed Checkpoint (DCP) folders saved by four
# processes (gloo over loopback, DTensors on CPU device meshes), what torch reads back from them,
# the decoded .metadata, and a copy with a hostile .metadata. See make_goldens.py and
# tests/fixtures/dcp/README.md.
#
#     scripts/dcp/make_goldens.sh [OUT_DIR]     # default: tests/fixtures/dcp
#
# Then, to check that torch reads a folder as its reference says (also used on folders nnx
# writes):
#
#     $ORACLE_VENV/bin/python scripts/dcp/check_load.py DCP_DIR REFERENCE.safetensors [--world 2]
#
# Environment (optional):
#   NNX_CACHE      cache folder, default ~/.cache/nnx
#   ORACLE_VENV    venv with torch and safetensors (made by scripts/models/make_goldens.sh),
#                  default $NNX_CACHE/oracle. Nothing is installed into it.
#
# The output is the same bytes from run to run (make_goldens.py pins DCP's random save_id and
# sorts the safetensors __metadata__ maps); it depends on the versions below, so other versions
# are refused.
set -euo pipefail

# Versions the fixtures were made with (torch run on the CPU only).
TORCH_VERSION=2.15.0
SAFETENSORS_VERSION=0.8.0

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
out="${1:-$root/tests/fixtures/dcp}"
cache="${NNX_CACHE:-$HOME/.cache/nnx}"
oracle="${ORACLE_VENV:-$cache/oracle}"
py="$oracle/bin/python"

[[ -x $py ]] || { echo "no venv at $oracle: run scripts/models/make_goldens.sh first (or set ORACLE_VENV)" >&2; exit 1; }
version() { "$py" -c "import importlib.metadata as m; print(m.version('$1').split('+')[0])" 2>/dev/null || true; }
have_torch="$(version torch)"
have_st="$(version safetensors)"
if [[ $have_torch != "$TORCH_VERSION" || $have_st != "$SAFETENSORS_VERSION" ]]; then
    echo "$oracle has torch '${have_torch:-none}' and safetensors '${have_st:-none}';" \
         "the fixtures are made with torch $TORCH_VERSION and safetensors $SAFETENSORS_VERSION" >&2
    exit 1
fi

mkdir -p "$out"
out="$(cd "$out" && pwd)"
"$py" "$here/make_goldens.py" "$out"
du -sh "$out"
