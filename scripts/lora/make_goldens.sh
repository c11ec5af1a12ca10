#!/usr/bin/env bash
# Writes tests/fixtures/lora/: LoRA adapters for the repository's small random models, made by the
# reference implementations, and what those implementations compute with them.
#
#     scripts/lora/make_goldens.sh [OUT_DIR]          # default: tests/fixtures/lora
#
# Steps (see tests/fixtures/lora/README.md for what each file is):
#   1. make_goldens.py peft (oracle venv + peft): the PEFT cases llama-lora, llama-rslora,
#      llama-patterns, llama-dora, llama-embed (on tests/fixtures/models/llama3) and gpt2-conv1d
#      (on tests/fixtures/gpt2-tiny): adapter_config.json, adapter_model.safetensors,
#      merged.safetensors, expected.json.
#   2. mlx_goldens.py (mlx venv): mlx-lora, an mlx-lm adapter (adapters.safetensors,
#      adapter_config.json) and its fused weights; mlx-affine, the base quantized by mlx-lm to
#      MLX affine 4-bit (group size 32) and that adapter fused into it by mlx-lm's fuse code
#      (base/ and fused/ model folders, logits); make_goldens.py mlx-check adds the logits
#      transformers computes from the mlx-lora fused weights, and checks the mlx-affine logits
#      against transformers run on the dequantized weights.
#   3. llama.cpp's convert_lora_to_gguf.py --outtype f32 on llama-lora -> gguf-lora/adapter.gguf;
#      make_goldens.py gguf reads it back (gguf-py's GGUFReader) into gguf-lora/expected.json.
#
# Versions the fixtures were made with: peft 0.21.2, torch 2.15.0, transformers 5.24.0,
# safetensors 0.8.0, numpy 2.4.6; mlx 0.32.4 (CPU build), mlx-lm 0.32.2; llama.cpp commit
# 0c1e57098bba43ac29e6e3b677cdceebdd22334f (the one vendored by llama-cpp-python 0.3.36) and its
# own gguf-py.
#
# Environment (all optional):
#   NNX_CACHE      cache folder, default ~/.cache/nnx
#   ORACLE_VENV    venv with torch/transformers/safetensors, default $NNX_CACHE/oracle (created
#                  as scripts/models/make_goldens.sh does if missing); peft is installed into it
#   MLX_VENV       venv with mlx and mlx-lm, default $NNX_CACHE/mlx-venv (created if missing)
#   LLAMACPP_SRC   llama.cpp source folder (with convert_lora_to_gguf.py and gguf-py/); default: the
#                  one inside the llama-cpp-python 0.3.36 sdist, downloaded (sha256 checked) and
#                  unpacked into $NNX_CACHE/llama.cpp-src
set -euo pipefail

LCP_VERSION=0.3.36
LCP_SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
LCP_URL="https://files.pythonhosted.org/packages/ec/e9/e7de2b0463ea3ffbf0ede6cb21b58c1258a8f6521aae45ca773a59fe7cf3/llama_cpp_python-${LCP_VERSION}.tar.gz"
LLAMACPP_COMMIT=0c1e57098bba43ac29e6e3b677cdceebdd22334f

ORACLE_PACKAGES=(torch==2.15.0 transformers==5.24.0 tokenizers==0.23.3 safetensors==0.8.0
    numpy==2.4.6 sentencepiece==0.2.3 protobuf==7.36.2 gguf==0.19.0)
PEFT_PACKAGE=peft==0.21.2
MLX_PACKAGES=("mlx[cpu]==0.32.4" mlx-lm==0.32.2)

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
out="${1:-$root/tests/fixtures/lora}"
cache="${NNX_CACHE:-$HOME/.cache/nnx}"
oracle="${ORACLE_VENV:-$cache/oracle}"
mlxv="${MLX_VENV:-$cache/mlx-venv}"

# Python environments.
if [[ ! -x "$oracle/bin/python" ]] || ! "$oracle/bin/python" -c "import torch, transformers, safetensors" 2>/dev/null; then
    python3 -m venv "$oracle"
    "$oracle/bin/pip" install --index-url https://download.pytorch.org/whl/cpu torch==2.15.0
    "$oracle/bin/pip" install "${ORACLE_PACKAGES[@]}"
fi
if ! "$oracle/bin/python" -c "import peft" 2>/dev/null; then
    "$oracle/bin/pip" install "$PEFT_PACKAGE"
fi
if [[ ! -x "$mlxv/bin/python" ]] || ! "$mlxv/bin/python" -c "import mlx.core, mlx_lm" 2>/dev/null; then
    python3 -m venv "$mlxv"
    "$mlxv/bin/pip" install "${MLX_PACKAGES[@]}"
fi

# llama.cpp sources (for the converter).
src="${LLAMACPP_SRC:-}"
if [[ -z $src ]]; then
    dl="$cache/llama.cpp-src"
    top="llama_cpp_python-${LCP_VERSION}"
    src="$dl/$top/vendor/llama.cpp"
    if [[ ! -f "$src/convert_lora_to_gguf.py" ]]; then
        mkdir -p "$dl"
        sdist="$dl/$top.tar.gz"
        if ! { [[ -f "$sdist" ]] && echo "$LCP_SHA256  $sdist" | sha256sum -c --status -; }; then
            curl -fsSL -o "$sdist" "$LCP_URL"
            echo "$LCP_SHA256  $sdist" | sha256sum -c -
        fi
        tar -xzf "$sdist" -C "$dl" "$top/vendor/llama.cpp"
    fi
fi
[[ -f "$src/convert_lora_to_gguf.py" && -d "$src/gguf-py" ]] || { echo "no llama.cpp sources in $src" >&2; exit 1; }
src="$(cd "$src" && pwd)"

mkdir -p "$out"
out="$(cd "$out" && pwd)"
cd "$root"  # the scripts name the bases by paths relative to the repository root

# PEFT writes target_modules given as a list from a Python set; a fixed hash seed keeps its order.
export PYTHONHASHSEED=0

# 1. PEFT cases.
"$oracle/bin/python" "$here/make_goldens.py" peft "$out"
# llama-lora again as PEFT writes it with safe_serialization=False (adapter_model.bin).
"$oracle/bin/python" "$here/peft_bin_golden.py" "$out"

# 2. mlx-lm cases (mlx-lora, then mlx-affine, which fuses the mlx-lora adapter).
"$mlxv/bin/python" "$here/mlx_goldens.py" "$out"
"$oracle/bin/python" "$here/make_goldens.py" mlx-check "$out"

# 3. GGUF adapter made by llama.cpp's converter from llama-lora.
mkdir -p "$out/gguf-lora"
rm -f "$out/gguf-lora/adapter.gguf"
PYTHONPATH="$src/gguf-py" "$oracle/bin/python" "$src/convert_lora_to_gguf.py" \
    --base tests/fixtures/models/llama3 --outtype f32 --outfile "$out/gguf-lora/adapter.gguf" \
    "$out/llama-lora" > "$out/gguf-lora/convert.log" 2>&1 || { cat "$out/gguf-lora/convert.log"; exit 1; }
rm -f "$out/gguf-lora/convert.log"
LLAMACPP_COMMIT="$LLAMACPP_COMMIT" "$oracle/bin/python" "$here/make_goldens.py" gguf "$out" "$src"

du -sh "$out"
