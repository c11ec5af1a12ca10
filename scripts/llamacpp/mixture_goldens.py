#!/usr/bin/env python3
"""Writes tests/fixtures/gguf/llamacpp/mixtures.json: what llama.cpp's `llama-quantize` makes of
a small Llama (8 layers, width 256, so that the K types and llama.cpp's per-layer choices all
apply) for each mixture: every tensor's type and an FNV-1a 64 hash of its bytes.

The weights follow an integer formula that the test (`tests/it/gguf.rs`) computes too, so the
input file itself is not kept. Needs the `gguf` package (scripts/setup.sh) and llama.cpp's tools
(scripts/llamacpp/build.sh). Usage: mixture_goldens.py [LLAMA_QUANTIZE]
"""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from gguf import GGUFReader, GGUFWriter

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "fixtures" / "gguf" / "llamacpp" / "mixtures.json"
MIXTURES = ["Q4_K_M", "Q4_K_S", "Q5_K_M", "Q5_K_S", "Q3_K_S", "Q3_K_M", "Q3_K_L", "Q2_K", "Q6_K", "Q8_0",
            "Q4_0", "Q4_1", "Q5_0", "Q5_1", "IQ4_NL", "IQ4_XS", "TQ1_0", "TQ2_0"]
LAYERS, WIDTH, MLP, HEADS, KV_HEADS, HEAD_DIM, VOCAB = 8, 256, 512, 4, 2, 64, 256


def tensors():
    """(name, shape) in the order llama.cpp's converter writes a Llama, as nnx writes it."""
    out = [("token_embd.weight", (VOCAB, WIDTH))]
    for i in range(LAYERS):
        out += [
            (f"blk.{i}.attn_norm.weight", (WIDTH,)),
            (f"blk.{i}.ffn_down.weight", (WIDTH, MLP)),
            (f"blk.{i}.ffn_gate.weight", (MLP, WIDTH)),
            (f"blk.{i}.ffn_up.weight", (MLP, WIDTH)),
            (f"blk.{i}.ffn_norm.weight", (WIDTH,)),
            (f"blk.{i}.attn_k.weight", (KV_HEADS * HEAD_DIM, WIDTH)),
            (f"blk.{i}.attn_output.weight", (WIDTH, HEADS * HEAD_DIM)),
            (f"blk.{i}.attn_q.weight", (HEADS * HEAD_DIM, WIDTH)),
            (f"blk.{i}.attn_v.weight", (KV_HEADS * HEAD_DIM, WIDTH)),
        ]
    return out + [("output_norm.weight", (WIDTH,)), ("output.weight", (VOCAB, WIDTH))]


def values(index, count):
    """Tensor `index`'s values: ((i * 2654435761 + index * 40503 + 12345) mod 2^32) mod 20001,
    minus 10000, over 100000, in f64 then f32."""
    i = np.arange(count, dtype=np.uint64)
    h = (i * np.uint64(2654435761) + np.uint64(index * 40503 + 12345)) & np.uint64(0xFFFFFFFF)
    return (((h % np.uint64(20001)).astype(np.int64) - 10000).astype(np.float64) / 100000.0).astype(np.float32)


def fnv1a(data):
    h = 0xCBF29CE484222325
    for byte in data:
        h = ((h ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def main():
    quantize = sys.argv[1] if len(sys.argv) > 1 else os.path.expanduser("~/.cache/nnx/llama.cpp/bin/llama-quantize")
    with tempfile.TemporaryDirectory() as tmp:
        source = os.path.join(tmp, "f32.gguf")
        writer = GGUFWriter(source, "llama")
        writer.add_uint32("llama.context_length", 128)
        writer.add_uint32("llama.embedding_length", WIDTH)
        writer.add_uint32("llama.block_count", LAYERS)
        writer.add_uint32("llama.feed_forward_length", MLP)
        writer.add_uint32("llama.rope.dimension_count", HEAD_DIM)
        writer.add_uint32("llama.attention.head_count", HEADS)
        writer.add_uint32("llama.attention.head_count_kv", KV_HEADS)
        writer.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
        writer.add_string("tokenizer.ggml.model", "gpt2")
        writer.add_string("tokenizer.ggml.pre", "default")
        writer.add_array("tokenizer.ggml.tokens", [f"t{i}" for i in range(VOCAB)])
        writer.add_array("tokenizer.ggml.token_type", [1] * VOCAB)
        writer.add_key_value("tokenizer.ggml.merges", ["t1 t2"], __import__("gguf").GGUFValueType.ARRAY)
        for index, (name, shape) in enumerate(tensors()):
            writer.add_tensor(name, values(index, int(np.prod(shape))).reshape(shape))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        goldens = {}
        for mixture in MIXTURES:
            target = os.path.join(tmp, f"{mixture}.gguf")
            subprocess.run([quantize, source, target, mixture], check=True, capture_output=True)
            reader = GGUFReader(target)
            goldens[mixture.lower()] = [
                [t.name, t.tensor_type.name, fnv1a(np.asarray(t.data).tobytes())] for t in reader.tensors
            ]
    version = (Path(quantize).parent.parent / "VERSION")
    OUT.write_text(json.dumps({
        "made_by": "llama-quantize, " + (version.read_text().splitlines()[0] if version.exists() else "llama.cpp"),
        "mixtures": goldens,
    }, indent=1) + "\n")
    print(f"{len(goldens)} mixtures in {OUT}")


if __name__ == "__main__":
    main()
