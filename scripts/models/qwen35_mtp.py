"""Writes `model-mtp-f32.gguf` into the qwen35 fixture: its folder with a multi-token-prediction
head added (`mtp.*` tensors as Qwen3.5 publishes them, random, and `mtp_num_hidden_layers` 1),
converted by llama.cpp's converter, which keeps the head by default as one more block
(`blk.N.nextn.*` and a full-attention layer) and says so in `{arch}.nextn_predict_layers`. A
reader must leave that block out of the main model: the file's logits are the plain file's.
The head's tensors are also written alone, as `mtp.safetensors`.

Usage (the oracle venv; the llama.cpp sources of scripts/llamacpp):
    python scripts/models/qwen35_mtp.py tests/fixtures/models LLAMA_CPP_SOURCES
"""

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file


def main():
    fixtures = Path(sys.argv[1])
    llama_cpp = Path(sys.argv[2])
    source = fixtures / "qwen35"
    config = json.loads((source / "config.json").read_text())
    hidden, head_dim = config["hidden_size"], config["head_dim"]
    heads, kv_heads, inner = config["num_attention_heads"], config["num_key_value_heads"], config["intermediate_size"]
    g = torch.Generator().manual_seed(35)

    def random(*shape):
        return (torch.randn(shape, generator=g) / shape[-1] ** 0.5).to(torch.bfloat16)

    tensors = load_file(source / "model.safetensors")
    head = {
        "mtp.fc.weight": random(hidden, 2 * hidden),
        "mtp.pre_fc_norm_embedding.weight": random(hidden),
        "mtp.pre_fc_norm_hidden.weight": random(hidden),
        "mtp.norm.weight": random(hidden),
        "mtp.layers.0.input_layernorm.weight": random(hidden),
        "mtp.layers.0.post_attention_layernorm.weight": random(hidden),
        "mtp.layers.0.self_attn.q_proj.weight": random(heads * head_dim * 2, hidden),
        "mtp.layers.0.self_attn.k_proj.weight": random(kv_heads * head_dim, hidden),
        "mtp.layers.0.self_attn.v_proj.weight": random(kv_heads * head_dim, hidden),
        "mtp.layers.0.self_attn.o_proj.weight": random(hidden, heads * head_dim),
        "mtp.layers.0.self_attn.q_norm.weight": random(head_dim),
        "mtp.layers.0.self_attn.k_norm.weight": random(head_dim),
        "mtp.layers.0.mlp.gate_proj.weight": random(inner, hidden),
        "mtp.layers.0.mlp.up_proj.weight": random(inner, hidden),
        "mtp.layers.0.mlp.down_proj.weight": random(hidden, inner),
    }
    tensors.update(head)
    # The head alone, beside the fixture, so that a test can put the folder back together.
    save_file(head, source / "mtp.safetensors", metadata={"format": "pt"})
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch) / "qwen35-mtp"
        shutil.copytree(source, folder, ignore=shutil.ignore_patterns("*.gguf", "*.json"))
        for name in ["tokenizer.json", "tokenizer_config.json", "generation_config.json"]:
            shutil.copy(source / name, folder / name)
        save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
        (folder / "config.json").write_text(json.dumps(dict(config, mtp_num_hidden_layers=1), indent=2) + "\n")
        subprocess.run([sys.executable, str(Path(__file__).with_name("convert.py")), str(llama_cpp), "--pre", "qwen2",
                        "--", str(folder), "--outtype", "f32", "--outfile", str(source / "model-mtp-f32.gguf")],
                       check=True)


if __name__ == "__main__":
    main()
