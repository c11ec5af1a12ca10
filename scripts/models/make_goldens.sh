#!/usr/bin/env bash
# Writes tests/fixtures/models/: small random-weight Llama 3, Mistral, Qwen2, Qwen3, Gemma 3 and a
# wider Llama 3 in the Hugging Face layout, their transformers references, the GGUF files
# llama.cpp's own converter and quantizer make from them, and what llama.cpp computes from those.
#
#     scripts/models/make_goldens.sh [OUT_DIR]          # default: tests/fixtures/models
#
# Steps (see tests/fixtures/models/README.md for what each file is):
#   1. make_goldens.py (transformers venv): model folders (BF16 model.safetensors, config.json,
#      generation_config.json, tokenizer files with a chat template) and reference.json.
#   2. convert.py (same venv): llama.cpp's convert_hf_to_gguf.py --outtype f32 -> model-f32.gguf.
#   3. llama-quantize: model-q8_0.gguf for every case, model-q4_k_m.gguf for gemma3 and llama3-wide.
#   4. llamacpp_goldens.py (llama-cpp-python venv): llamacpp.json, incl. llama-perplexity.
#   5. removes llama3-wide/model-f32.gguf (5.4 MB; the other files of the folder are made from it).
#
# Environment (all optional):
#   NNX_CACHE      cache folder, default ~/.cache/nnx
#   ORACLE_VENV    venv with torch/transformers/..., default $NNX_CACHE/oracle (created if missing)
#   LCP_VENV       venv with llama-cpp-python, default $NNX_CACHE/lcp (created if missing; pip
#                  builds llama-cpp-python 0.3.36 from source, CPU only)
#   LLAMACPP_BIN   folder with llama-quantize and llama-perplexity, default $NNX_CACHE/llama.cpp/bin
#                  (built with scripts/llamacpp/build.sh if missing)
#   LLAMACPP_SRC   llama.cpp source folder (with convert_hf_to_gguf.py and gguf-py/); default: the
#                  one inside the llama-cpp-python 0.3.36 sdist, downloaded (sha256 checked) and
#                  unpacked into $NNX_CACHE/llama.cpp-src
# All three llama.cpp pieces (converter, tools, python binding) come from llama-cpp-python 0.3.36,
# i.e. llama.cpp commit 0c1e57098bba43ac29e6e3b677cdceebdd22334f.
set -euo pipefail

LCP_VERSION=0.3.36
LCP_SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
LCP_URL="https://files.pythonhosted.org/packages/ec/e9/e7de2b0463ea3ffbf0ede6cb21b58c1258a8f6521aae45ca773a59fe7cf3/llama_cpp_python-${LCP_VERSION}.tar.gz"

# Versions the fixtures were made with.
ORACLE_PACKAGES=(torch==2.15.0 transformers==5.24.0 tokenizers==0.23.3 safetensors==0.8.0
    numpy==2.4.6 sentencepiece==0.2.3 protobuf==7.36.2 gguf==0.19.0)

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
out="${1:-$root/tests/fixtures/models}"
cache="${NNX_CACHE:-$HOME/.cache/nnx}"
oracle="${ORACLE_VENV:-$cache/oracle}"
lcp="${LCP_VENV:-$cache/lcp}"
bin="${LLAMACPP_BIN:-$cache/llama.cpp/bin}"

# Python environments.
if [[ ! -x "$oracle/bin/python" ]] || ! "$oracle/bin/python" -c "import torch, transformers, sentencepiece, tokenizers, safetensors, gguf" 2>/dev/null; then
    python3 -m venv "$oracle"
    "$oracle/bin/pip" install --index-url https://download.pytorch.org/whl/cpu torch==2.15.0
    "$oracle/bin/pip" install "${ORACLE_PACKAGES[@]}"
fi
if [[ ! -x "$lcp/bin/python" ]] || ! "$lcp/bin/python" -c "import llama_cpp, numpy" 2>/dev/null; then
    python3 -m venv "$lcp"
    CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_OPENMP=OFF" "$lcp/bin/pip" install "llama-cpp-python==$LCP_VERSION" numpy==2.4.6
fi

# llama.cpp tools.
if [[ ! -x "$bin/llama-quantize" || ! -x "$bin/llama-perplexity" ]]; then
    "$root/scripts/llamacpp/build.sh" "$(dirname "$bin")"
fi

# llama.cpp sources (for the converter).
src="${LLAMACPP_SRC:-}"
if [[ -z $src ]]; then
    dl="$cache/llama.cpp-src"
    top="llama_cpp_python-${LCP_VERSION}"
    src="$dl/$top/vendor/llama.cpp"
    if [[ ! -f "$src/convert_hf_to_gguf.py" ]]; then
        mkdir -p "$dl"
        sdist="$dl/$top.tar.gz"
        if ! { [[ -f "$sdist" ]] && echo "$LCP_SHA256  $sdist" | sha256sum -c --status -; }; then
            curl -fsSL -o "$sdist" "$LCP_URL"
            echo "$LCP_SHA256  $sdist" | sha256sum -c -
        fi
        tar -xzf "$sdist" -C "$dl" "$top/vendor/llama.cpp"
    fi
fi
[[ -f "$src/convert_hf_to_gguf.py" && -d "$src/gguf-py" ]] || { echo "no llama.cpp sources in $src" >&2; exit 1; }

mkdir -p "$out"
cp "$here/perplexity.txt" "$out/perplexity.txt"

# 1. Model folders and transformers references.
"$oracle/bin/python" "$here/make_goldens.py" "$out"

# 2, 3. GGUF files.
for dir in "$out"/*/; do
    case="$(basename "$dir")"
    [[ -f "$dir/reference.json" ]] || continue
    pre=()
    [[ $case == qwen* || $case == gpt-oss ]] && pre=(--pre qwen2)
    # The fixtures' Qwen3.5 models have no MTP head, which the converter otherwise expects.
    extra=()
    [[ $case == qwen35* ]] && extra=(--no-mtp)
    "$oracle/bin/python" "$here/convert.py" "$src" "${pre[@]}" -- "$dir" --outtype f32 "${extra[@]}" \
        --outfile "$dir/model-f32.gguf" > "$dir/convert.log" 2>&1 || { cat "$dir/convert.log"; exit 1; }
    rm -f "$dir/convert.log"
    "$bin/llama-quantize" "$dir/model-f32.gguf" "$dir/model-q8_0.gguf" Q8_0 > /dev/null 2>&1
    if [[ $case == gemma* || $case == llama3-wide || $case == qwen3moe || $case == qwen35* ]]; then
        "$bin/llama-quantize" "$dir/model-f32.gguf" "$dir/model-q4_k_m.gguf" Q4_K_M > /dev/null 2>&1
    fi
done

# 4. llama.cpp's results.
"$lcp/bin/python" "$here/llamacpp_goldens.py" "$out" "$bin/llama-perplexity"

# 5. Too big to keep.
rm -f "$out/llama3-wide/model-f32.gguf"
"$oracle/bin/python" - "$out/llama3-wide/llamacpp.json" <<'EOF'
import json, sys
p = sys.argv[1]
d = json.load(open(p))
d["not_committed"] = ["model-f32.gguf"]
d["not_committed_note"] = ("model-f32.gguf (5.4 MB) is not kept in the repository; convert_hf_to_gguf.py "
                           "--outtype f32 on this folder makes it again")
open(p, "w").write(json.dumps(d, separators=(",", ":")) + "\n")
EOF

du -sh "$out"
