#!/usr/bin/env bash
# Checks that PEFT loads the adapters nnx writes: `nnx lora convert` writes the fixtures'
# MLX-LM, DoRA, embedding and rsLoRA adapters in PEFT's layout, then PEFT 0.21's
# `PeftModel.from_pretrained` + `merge_and_unload` on the llama3 fixture (f32) must give the
# references' own merged weights (tests/fixtures/lora/<case>/merged.safetensors).
#
#     scripts/lora/check_peft_loads.sh
#
# Environment: ORACLE_VENV (torch, transformers, peft; default $NNX_CACHE/oracle, which
# scripts/lora/make_goldens.sh sets up), NNX_CACHE (default ~/.cache/nnx).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cache="${NNX_CACHE:-$HOME/.cache/nnx}"
python="${ORACLE_VENV:-$cache/oracle}/bin/python"
cd "$root"
cargo build --quiet -p nnx-cli
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
for case in mlx-lora llama-dora llama-embed llama-rslora llama-patterns gpt2-conv1d; do
    target/debug/nnx lora convert "tests/fixtures/lora/$case" "$out/$case" >/dev/null
done
"$python" - "$out" <<'PY'
import sys, torch
from transformers import AutoModelForCausalLM
from peft import PeftModel
from safetensors.torch import load_file

out = sys.argv[1]
bases = {"gpt2-conv1d": "tests/fixtures/gpt2-tiny"}
worst = 0.0
for case in ["mlx-lora", "llama-dora", "llama-embed", "llama-rslora", "llama-patterns", "gpt2-conv1d"]:
    base = AutoModelForCausalLM.from_pretrained(bases.get(case, "tests/fixtures/models/llama3"), dtype=torch.float32)
    if case == "llama-patterns":
        # PEFT merges a trained bias only into layers that have one (zero biases: the same model).
        base = AutoModelForCausalLM.from_pretrained(
            "tests/fixtures/models/llama3", dtype=torch.float32, mlp_bias=True)
        for name, parameter in base.named_parameters():
            if name.endswith(".bias"):
                torch.nn.init.zeros_(parameter)
    merged = PeftModel.from_pretrained(base, f"{out}/{case}").merge_and_unload().state_dict()
    golden = load_file(f"tests/fixtures/lora/{case}/merged.safetensors")
    diff = max((merged[name] - value).abs().max().item() for name, value in golden.items())
    worst = max(worst, diff)
    print(f"{case}: PEFT's merge of nnx's file differs from the reference merge by {diff:.3g}")
sys.exit(0 if worst < 1e-5 else 1)
PY
