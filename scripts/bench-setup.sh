#!/usr/bin/env bash
# Installs the PyTorch peer of `cargo bench --bench minilm`: torch and sentence-transformers, in
# the virtual environment of scripts/setup.sh (run first, for the model folder). The bench runs
# the peer when this environment has it and says so when it does not. CI does not call this:
# the install is large.
#
# Set NNX_CACHE to choose the cache folder (default: ~/.cache/nnx). Set NNX_TORCH_INDEX to the
# URL of a package index that serves CPU-only torch wheels to install those instead of the
# default wheels, which also pull in the CUDA runtime.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh

cache="${NNX_CACHE:-$HOME/.cache/nnx}"
venv="$cache/venv"

if ! "$venv/bin/python" -c 'import torch, sentence_transformers' 2>/dev/null; then
  echo "installing torch and sentence-transformers into $venv (a large download)"
  if [ -n "${NNX_TORCH_INDEX:-}" ]; then
    "$venv/bin/pip" install --quiet --disable-pip-version-check --index-url "$NNX_TORCH_INDEX" 'torch==2.15.0'
  fi
  "$venv/bin/pip" install --quiet --disable-pip-version-check 'torch==2.15.0' 'sentence-transformers==6.2.0'
fi
"$venv/bin/python" -c 'import torch, sentence_transformers as st; print("torch", torch.__version__, "sentence-transformers", st.__version__, "threads", torch.get_num_threads())'
