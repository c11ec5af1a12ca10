#!/usr/bin/env bash
# Writes the Orbax checkpoint goldens (default tests/fixtures/orbax/): one small training state
# saved by orbax-checkpoint over 8 virtual CPU devices with OCDBT on and off, zarr v2 and zarr3,
# and the global value of every array. See make_goldens.py and tests/fixtures/orbax/README.md.
#
#     scripts/orbax/make_goldens.sh [OUT_DIR]
#
# Environment (optional):
#   NNX_CACHE    cache folder, default ~/.cache/nnx; the venv is $NNX_CACHE/orbax
set -euo pipefail

# Versions the fixtures were made with (CPU jax; tensorstore comes with orbax-checkpoint).
JAX_VERSION=0.10.2
ORBAX_VERSION=0.12.8
TENSORSTORE_VERSION=0.1.86
SAFETENSORS_VERSION=0.8.0
NUMPY_VERSION=2.4.6
ML_DTYPES_VERSION=0.7.0

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
out="${1:-$root/tests/fixtures/orbax}"
cache="${NNX_CACHE:-$HOME/.cache/nnx}"
venv="$cache/orbax"
py="$venv/bin/python"

[[ -x $py ]] || python3 -m venv "$venv"
version() { "$py" -c "import importlib.metadata as m; print(m.version('$1'))" 2>/dev/null || true; }
if [[ $(version jax) != "$JAX_VERSION" || $(version orbax-checkpoint) != "$ORBAX_VERSION" \
    || $(version tensorstore) != "$TENSORSTORE_VERSION" || $(version safetensors) != "$SAFETENSORS_VERSION" ]]; then
    "$venv/bin/pip" install "jax==$JAX_VERSION" "jaxlib==$JAX_VERSION" "orbax-checkpoint==$ORBAX_VERSION" \
        "tensorstore==$TENSORSTORE_VERSION" "safetensors==$SAFETENSORS_VERSION" "numpy==$NUMPY_VERSION" \
        "ml_dtypes==$ML_DTYPES_VERSION"
fi

mkdir -p "$out"
out="$(cd "$out" && pwd)"
# 8 virtual CPU devices, so that arrays are sharded as on 8 accelerators.
XLA_FLAGS=--xla_force_host_platform_device_count=8 JAX_PLATFORMS=cpu "$py" "$here/make_goldens.py" "$out"
du -sh "$out"
