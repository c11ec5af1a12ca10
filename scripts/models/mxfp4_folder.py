"""Writes the gpt-oss fixture as OpenAI publishes gpt-oss: its expert stacks as MXFP4 pairs
(`*_blocks` uint8 [experts, out, in/32, 16], two E2M1 codes a byte, the even value in the low
nibble; `*_scales` uint8 [experts, out, in/32], E8M0 exponents biased by 127; gate and up rows
interleaved), with `quantization_config.quant_method = "mxfp4"`.

References, from the folder as written:
- transformers' logits and greedy ids, loading it with `Mxfp4Config(dequantize=True)` in float32
  (its own MXFP4 decoder);
- llama.cpp's converter's GGUF file of it (`model.gguf`), which repacks the pairs into ggml's
  MXFP4 blocks as they are and writes the rest in F32.

Usage (the oracle venv; the llama.cpp sources of scripts/llamacpp):
    python scripts/models/mxfp4_folder.py tests/fixtures/models LLAMA_CPP_SOURCES
"""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch
import transformers
from safetensors.torch import load_file, save_file

# The E2M1 values of the 16 codes (OCP Microscaling spec, table 5).
E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], dtype=np.float32)


def quantize(rows):
    """rows float32 [..., n] (n a multiple of 32) -> (blocks uint8 [..., n/32, 16], scales uint8 [..., n/32])."""
    *prefix, n = rows.shape
    blocks = rows.reshape(*prefix, n // 32, 32).astype(np.float32)
    amax = np.abs(blocks).max(axis=-1)
    # The smallest power of two that brings the block's largest magnitude within 6, E2M1's largest.
    exponent = np.where(amax > 0, np.ceil(np.log2(np.maximum(amax, 1e-30) / 6.0)), -127).astype(np.int32)
    exponent = np.clip(exponent, -127, 127)
    scaled = blocks / np.ldexp(1.0, exponent)[..., None]
    # The nearest code (the first of equals): positive codes 0-7, negative 8-15.
    distance = np.abs(scaled[..., None] - E2M1)
    codes = distance.argmin(axis=-1).astype(np.uint8)
    packed = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return packed, (exponent + 127).astype(np.uint8)


def main():
    fixtures = Path(sys.argv[1])
    llama_cpp = Path(sys.argv[2])
    torch.set_num_threads(2)
    torch.use_deterministic_algorithms(True)
    source = fixtures / "gpt-oss"
    folder = fixtures / "gpt-oss-mxfp4"
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir()
    for name in ["generation_config.json", "tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt"]:
        shutil.copy(source / name, folder / name)

    tensors = load_file(source / "model.safetensors")
    out = {}
    for name, tensor in tensors.items():
        stem = name.removesuffix(".mlp.experts.gate_up_proj").removesuffix(".mlp.experts.down_proj")
        if stem == name:
            out[name] = tensor
            continue
        # Stored input-major ([experts, in, out]); the pairs are output-major.
        rows = tensor.float().transpose(1, 2).contiguous().numpy()
        blocks, scales = quantize(rows)
        out[f"{name}_blocks"] = torch.from_numpy(np.ascontiguousarray(blocks))
        out[f"{name}_scales"] = torch.from_numpy(np.ascontiguousarray(scales))
    save_file(out, folder / "model.safetensors", metadata={"format": "pt"})

    config = json.loads((source / "config.json").read_text())
    config["quantization_config"] = {
        "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens",
                                   "lm_head"],
        "quant_method": "mxfp4",
    }
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")

    model = transformers.GptOssForCausalLM.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager",
        quantization_config=transformers.Mxfp4Config(dequantize=True)).eval()
    reference = json.loads((source / "reference.json").read_text())
    ids = reference["ids"]
    x = torch.tensor([ids])
    with torch.no_grad():
        logits = model(x).logits[0].float()
        seq = list(ids)
        for _ in range(len(reference["greedy"])):
            seq.append(int(model(torch.tensor([seq])).logits[0, -1].argmax()))
    reference.update({
        "made_by": f"transformers {transformers.__version__}, torch {torch.__version__} (CPU, float32, eager "
                   "attention), Mxfp4Config(dequantize=True)",
        "case": "gpt-oss-mxfp4",
        "logits": [[float(f"{v:.7g}") for v in row] for row in logits.tolist()],
        "greedy": seq[len(ids):],
        "greedy_note": "argmax loop without cache",
    })
    (folder / "reference.json").write_text(json.dumps(reference, separators=(",", ":")) + "\n")

    # Through convert.py, which names the fixtures' byte-level BPE pre-tokenizer as make_goldens.sh does.
    subprocess.run([sys.executable, str(Path(__file__).with_name("convert.py")), str(llama_cpp), "--pre", "qwen2", "--",
                    str(folder), "--outtype", "f32", "--outfile", str(folder / "model.gguf")], check=True)
    print(f"gpt-oss-mxfp4: greedy {seq[len(ids):]}")


if __name__ == "__main__":
    main()
