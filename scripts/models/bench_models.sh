#!/usr/bin/env bash
# Makes the GGUF files that `cargo bench --bench run` measures: a random-weight Llama of 135M
# parameters in SmolLM-135M's shape (LlamaForCausalLM, hidden 576, intermediate 1536, 30 layers,
# 9 heads, 3 key/value heads, vocabulary 49152, tied embedding, rope_theta 10000), converted to
# F16 by llama.cpp's own converter and quantized by llama-quantize to Q8_0 and Q4_K_M.
#
#     scripts/models/bench_models.sh [OUT_DIR]      # default: $NNX_CACHE/bench-models
#
# Writes llama-135m-f16.gguf, llama-135m-q8_0.gguf and llama-135m-q4_k_m.gguf once (a file that
# is there is kept; delete it to make it again) and prints the ggml types of each file's tensors.
# Width 576 is not a multiple of 256, so Q4_K_M falls back to Q5_0/Q8_0 for most tensors, as it
# does for SmolLM-135M itself.
#
# The weights are transformers' own initialisation (initializer_range 0.02) with seed 135. The
# tokenizer is the small SentencePiece one of tests/fixtures/models/llama3 (320 pieces); the
# converter pads the vocabulary to 49152 with `[PADn]` tokens.
#
# Environment (all optional), as for make_goldens.sh, which sets these pieces up:
#   NNX_CACHE      cache folder, default ~/.cache/nnx
#   ORACLE_VENV    venv with torch, transformers, sentencepiece, gguf; default $NNX_CACHE/oracle
#   LLAMACPP_BIN   folder with llama-quantize, default $NNX_CACHE/llama.cpp/bin (built with
#                  scripts/llamacpp/build.sh if missing)
#   LLAMACPP_SRC   llama.cpp sources (convert_hf_to_gguf.py, gguf-py/); default the copy that
#                  make_goldens.sh unpacks into $NNX_CACHE/llama.cpp-src
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cache="${NNX_CACHE:-$HOME/.cache/nnx}"
out="${1:-$cache/bench-models}"
oracle="${ORACLE_VENV:-$cache/oracle}"
bin="${LLAMACPP_BIN:-$cache/llama.cpp/bin}"
src="${LLAMACPP_SRC:-$cache/llama.cpp-src/llama_cpp_python-0.3.36/vendor/llama.cpp}"
tokenizer="$root/tests/fixtures/models/llama3"
name=llama-135m

if ! "$oracle/bin/python" -c "import torch, transformers, sentencepiece, gguf" 2>/dev/null; then
    echo "no Python with torch, transformers, sentencepiece and gguf in $oracle:" \
        "scripts/models/make_goldens.sh creates it (or set ORACLE_VENV)" >&2
    exit 1
fi
if [[ ! -f "$src/convert_hf_to_gguf.py" || ! -d "$src/gguf-py" ]]; then
    echo "no llama.cpp sources in $src: scripts/models/make_goldens.sh unpacks them (or set LLAMACPP_SRC)" >&2
    exit 1
fi
if [[ ! -x "$bin/llama-quantize" ]]; then
    "$root/scripts/llamacpp/build.sh" "$(dirname "$bin")"
fi

mkdir -p "$out"
f16="$out/$name-f16.gguf"

# 1. The transformers folder (F32 safetensors) and its F16 GGUF, by llama.cpp's converter.
if [[ ! -f $f16 ]]; then
    hf="$(mktemp -d "$out/.hf.XXXXXX")"
    trap 'rm -rf "$hf"' EXIT
    cp "$tokenizer/tokenizer.model" "$tokenizer/tokenizer.json" "$tokenizer/tokenizer_config.json" "$hf/"
    "$oracle/bin/python" - "$hf" <<'EOF'
import sys

import torch
import transformers

torch.manual_seed(135)
config = transformers.LlamaConfig(
    vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
    num_attention_heads=9, num_key_value_heads=3, head_dim=64, hidden_act="silu",
    max_position_embeddings=2048, rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=True,
    initializer_range=0.02, bos_token_id=1, eos_token_id=2, attention_bias=False, mlp_bias=False)
transformers.utils.logging.disable_progress_bar()
model = transformers.LlamaForCausalLM(config).eval()
parameters = sum(p.numel() for p in model.parameters())
print(f"random LlamaForCausalLM with {parameters / 1e6:.1f}M parameters (tied embedding counted once)")
model.save_pretrained(sys.argv[1])
EOF
    "$oracle/bin/python" "$here/convert.py" "$src" -- "$hf" --outtype f16 --model-name "$name" --outfile "$f16.part" \
        > "$hf/convert.log" 2>&1 || { cat "$hf/convert.log"; exit 1; }
    mv "$f16.part" "$f16"
fi

# 2. The quantized files, by llama-quantize.
for kind in Q8_0 Q4_K_M; do
    file="$out/$name-${kind,,}.gguf"
    if [[ ! -f $file ]]; then
        "$bin/llama-quantize" "$f16" "$file.part" "$kind" > "$out/quantize.log" 2>&1 \
            || { cat "$out/quantize.log"; exit 1; }
        mv "$file.part" "$file"
        rm -f "$out/quantize.log"
    fi
done

# 3. The type mix of each file: tensors and MiB per ggml type.
PYTHONPATH="$src/gguf-py" "$oracle/bin/python" - "$out"/$name-*.gguf <<'EOF'
import sys
from collections import defaultdict

from gguf import GGUFReader

for path in sys.argv[1:]:
    reader = GGUFReader(path)
    mix = defaultdict(lambda: [0, 0])
    for tensor in reader.tensors:
        mix[tensor.tensor_type.name][0] += 1
        mix[tensor.tensor_type.name][1] += int(tensor.n_bytes)
    total = sum(size for _, size in mix.values())
    parts = ", ".join(f"{ty} {count} ({size / 2**20:.1f} MiB)"
                      for ty, (count, size) in sorted(mix.items(), key=lambda kv: -kv[1][1]))
    print(f"{path}: {total / 2**20:.1f} MiB: {parts}")
EOF
