"""Writes OUT_DIR/llama-lora-bin/: the `llama-lora` PEFT adapter (OUT_DIR/llama-lora) saved
again by PEFT with `safe_serialization=False`, i.e. as `adapter_model.bin` (PyTorch's zip
checkpoint) beside its `adapter_config.json`, the older layout PEFT still reads.

    python scripts/lora/peft_bin_golden.py OUT_DIR   # from the repository root, by make_goldens.sh
"""

import os
import shutil
import sys

import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM

BASE = "tests/fixtures/models/llama3"
SOURCE = os.path.join(sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/lora", "llama-lora")
OUT = os.path.join(os.path.dirname(SOURCE), "llama-lora-bin")


def main():
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(BASE, dtype=torch.float32)
    model = PeftModel.from_pretrained(base, SOURCE)
    if os.path.isdir(OUT):
        shutil.rmtree(OUT)
    model.save_pretrained(OUT, safe_serialization=False)
    # The model card PEFT adds is not part of the adapter.
    os.remove(os.path.join(OUT, "README.md"))
    # The same factors as the source adapter, bit for bit.
    saved = torch.load(os.path.join(OUT, "adapter_model.bin"), weights_only=True)
    from safetensors.torch import load_file

    source = load_file(os.path.join(SOURCE, "adapter_model.safetensors"))
    assert saved.keys() == source.keys(), (sorted(saved), sorted(source))
    assert all(torch.equal(saved[key], source[key]) for key in source)
    print(f"wrote {OUT}: {len(saved)} tensors as adapter_model.bin")


if __name__ == "__main__":
    main()
