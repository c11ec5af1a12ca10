#!/usr/bin/env python3
"""Writes full-size mixture-of-experts and hybrid GGUF files with random weights for `cargo bench
--bench run`: the shapes of Qwen3-30B-A3B (`qwen3moe`, experts in Q4_K, the rest Q8_0; about
18 GB), of gpt-oss-20b (`gpt-oss`, experts in MXFP4 as published, the rest Q8_0; about 12 GB) and
Qwen3.5-2B-like ones (`qwen35`, on request only; about 2.6 GB). Tensors are
written one at a time (the gguf package streams them), so memory stays at one tensor.

    moe_bench_models.py OUT_DIR [qwen3moe] [gpt-oss] [qwen35]

The blocks are random with scales chosen so that every value is finite and activations stay
in range: llama.cpp and nnx read the same bytes, which is all a speed comparison needs. Delete
the files after the bench (they are not kept anywhere). `NNX_MOE_LAYERS=N` writes N layers only
(a quick check of the pipeline).
"""

import os

import sys
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as T

RNG = np.random.default_rng(30)


def q8_0(rows, cols):
    blocks = rows * cols // 32
    out = np.empty((blocks, 34), dtype=np.uint8)
    out[:, :2] = np.frombuffer(np.full(blocks, 0.0005, dtype=np.float16).tobytes(), np.uint8).reshape(blocks, 2)
    out[:, 2:] = RNG.integers(0, 256, size=(blocks, 32), dtype=np.uint8)
    return out.reshape(rows, cols // 32 * 34)


def q4_k(rows, cols):
    blocks = rows * cols // 256
    out = RNG.integers(0, 256, size=(blocks, 144), dtype=np.uint8)
    scales = np.frombuffer(np.array([0.0002, 0.0001] * blocks, dtype=np.float16).tobytes(), np.uint8)
    out[:, :4] = scales.reshape(blocks, 4)
    return out.reshape(rows, cols // 256 * 144)


def mxfp4(rows, cols):
    blocks = rows * cols // 32
    out = RNG.integers(0, 256, size=(blocks, 17), dtype=np.uint8)
    out[:, 0] = RNG.integers(114, 118, size=blocks, dtype=np.uint8)  # scales 2^-13 .. 2^-10
    return out.reshape(rows, cols // 32 * 17)


ENCODE = {T.Q8_0: q8_0, T.Q4_K: q4_k, T.MXFP4: mxfp4}


def write(path, arch, keys, tensors, vocab):
    w = gguf.GGUFWriter(str(path), arch)
    for key, value in keys:
        getattr(w, key)(*value)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list([f"t{i}" for i in range(vocab)])
    w.add_token_types([1] * vocab)
    w.add_token_merges(["t 1"])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    for name, shape, ty in tensors:
        rows, cols = int(np.prod(shape[:-1])), shape[-1]
        if ty == T.F32:
            w.add_tensor_info(name, shape, np.dtype(np.float32), rows * cols * 4, raw_dtype=ty)
        else:
            block, size = gguf.GGML_QUANT_SIZES[ty]
            row_bytes = cols // block * size
            w.add_tensor_info(name, [*shape[:-1], row_bytes], np.dtype(np.uint8), rows * row_bytes, raw_dtype=ty)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for name, shape, ty in tensors:
        rows, cols = int(np.prod(shape[:-1])), shape[-1]
        if ty == T.F32:
            data = (np.ones(shape, dtype=np.float32) if "norm" in name else
                    RNG.standard_normal(shape, dtype=np.float32) * 0.02)
        else:
            data = ENCODE[ty](rows, cols).reshape(*shape[:-1], -1)
        w.write_tensor_data(data)
    w.close()
    print(path)


def qwen3moe(out):
    vocab, hidden, layers, heads, kv, hd, experts, inner = 151936, 2048, 48, 32, 4, 128, 128, 768
    layers = int(os.environ.get("NNX_MOE_LAYERS", layers))
    keys = [("add_block_count", [layers]), ("add_context_length", [40960]), ("add_embedding_length", [hidden]),
            ("add_feed_forward_length", [6144]), ("add_head_count", [heads]), ("add_head_count_kv", [kv]),
            ("add_key_length", [hd]), ("add_value_length", [hd]), ("add_rope_freq_base", [1e6]),
            ("add_layer_norm_rms_eps", [1e-6]), ("add_expert_count", [experts]), ("add_expert_used_count", [8]),
            ("add_expert_feed_forward_length", [inner])]
    tensors = [("token_embd.weight", [vocab, hidden], T.Q8_0), ("output_norm.weight", [hidden], T.F32),
               ("output.weight", [vocab, hidden], T.Q8_0)]
    for i in range(layers):
        b = f"blk.{i}."
        tensors += [(b + "attn_norm.weight", [hidden], T.F32), (b + "ffn_norm.weight", [hidden], T.F32),
                    (b + "attn_q.weight", [heads * hd, hidden], T.Q8_0), (b + "attn_k.weight", [kv * hd, hidden], T.Q8_0),
                    (b + "attn_v.weight", [kv * hd, hidden], T.Q8_0), (b + "attn_output.weight", [hidden, heads * hd], T.Q8_0),
                    (b + "attn_q_norm.weight", [hd], T.F32), (b + "attn_k_norm.weight", [hd], T.F32),
                    (b + "ffn_gate_inp.weight", [experts, hidden], T.F32),
                    (b + "ffn_gate_exps.weight", [experts, inner, hidden], T.Q4_K),
                    (b + "ffn_up_exps.weight", [experts, inner, hidden], T.Q4_K),
                    (b + "ffn_down_exps.weight", [experts, hidden, inner], T.Q4_K)]
    write(out / "qwen3moe-30b-a3b-shapes.gguf", "qwen3moe", keys, tensors, vocab)


def gpt_oss(out):
    vocab, hidden, layers, heads, kv, hd, experts, inner = 201088, 2880, 24, 64, 8, 64, 32, 2880
    layers = int(os.environ.get("NNX_MOE_LAYERS", layers))
    keys = [("add_block_count", [layers]), ("add_context_length", [131072]), ("add_embedding_length", [hidden]),
            ("add_feed_forward_length", [inner]), ("add_head_count", [heads]), ("add_head_count_kv", [kv]),
            ("add_key_length", [hd]), ("add_value_length", [hd]), ("add_rope_freq_base", [150000.0]),
            ("add_rope_scaling_type", [gguf.RopeScalingType.YARN]), ("add_rope_scaling_factor", [32.0]),
            ("add_rope_scaling_orig_ctx_len", [4096]), ("add_layer_norm_rms_eps", [1e-5]),
            ("add_sliding_window", [128]), ("add_expert_count", [experts]), ("add_expert_used_count", [4]),
            ("add_expert_feed_forward_length", [inner])]
    tensors = [("token_embd.weight", [vocab, hidden], T.Q8_0), ("output_norm.weight", [hidden], T.F32),
               ("output.weight", [vocab, hidden], T.Q8_0)]
    for i in range(layers):
        b = f"blk.{i}."
        tensors += [(b + "attn_norm.weight", [hidden], T.F32), (b + "post_attention_norm.weight", [hidden], T.F32),
                    (b + "attn_q.weight", [heads * hd, hidden], T.Q8_0), (b + "attn_q.bias", [heads * hd], T.F32),
                    (b + "attn_k.weight", [kv * hd, hidden], T.Q8_0), (b + "attn_k.bias", [kv * hd], T.F32),
                    (b + "attn_v.weight", [kv * hd, hidden], T.Q8_0), (b + "attn_v.bias", [kv * hd], T.F32),
                    (b + "attn_output.weight", [hidden, heads * hd], T.Q8_0), (b + "attn_output.bias", [hidden], T.F32),
                    (b + "attn_sinks.weight", [heads], T.F32),
                    (b + "ffn_gate_inp.weight", [experts, hidden], T.F32), (b + "ffn_gate_inp.bias", [experts], T.F32),
                    (b + "ffn_gate_exps.weight", [experts, inner, hidden], T.MXFP4),
                    (b + "ffn_gate_exps.bias", [experts, inner], T.F32),
                    (b + "ffn_up_exps.weight", [experts, inner, hidden], T.MXFP4),
                    (b + "ffn_up_exps.bias", [experts, inner], T.F32),
                    (b + "ffn_down_exps.weight", [experts, hidden, inner], T.MXFP4),
                    (b + "ffn_down_exps.bias", [experts, hidden], T.F32)]
    write(out / "gpt-oss-20b-shapes.gguf", "gpt-oss", keys, tensors, vocab)


def qwen35(out):
    """Qwen3.5-2B-like shapes: 24 layers, every fourth full attention (gated queries, head 256,
    a quarter of it rotated), the others Gated DeltaNet (16 key and 16 value heads of 128),
    an MLP of 6144; Q8_0 projections, F32 convolutions, gates and norms (about 2.6 GB)."""
    vocab, hidden, layers, heads, kv, hd, inner = 248320, 2048, 24, 8, 2, 256, 6144
    key_heads, value_heads, dim, kernel = 16, 16, 128, 4
    layers = int(os.environ.get("NNX_MOE_LAYERS", layers))
    channels, value_width = 2 * key_heads * dim + value_heads * dim, value_heads * dim
    keys = [("add_block_count", [layers]), ("add_context_length", [262144]), ("add_embedding_length", [hidden]),
            ("add_feed_forward_length", [inner]), ("add_head_count", [heads]), ("add_head_count_kv", [kv]),
            ("add_key_length", [hd]), ("add_value_length", [hd]), ("add_rope_freq_base", [1e7]),
            ("add_rope_dimension_count", [hd // 4]), ("add_rope_dimension_sections", [[11, 11, 10, 0]]),
            ("add_layer_norm_rms_eps", [1e-6]), ("add_ssm_conv_kernel", [kernel]), ("add_ssm_state_size", [dim]),
            ("add_ssm_group_count", [key_heads]), ("add_ssm_time_step_rank", [value_heads]),
            ("add_ssm_inner_size", [value_width]), ("add_full_attention_interval", [4])]
    tensors = [("token_embd.weight", [vocab, hidden], T.Q8_0), ("output_norm.weight", [hidden], T.F32),
               ("output.weight", [vocab, hidden], T.Q8_0)]
    for i in range(layers):
        b = f"blk.{i}."
        tensors += [(b + "attn_norm.weight", [hidden], T.F32), (b + "post_attention_norm.weight", [hidden], T.F32),
                    (b + "ffn_gate.weight", [inner, hidden], T.Q8_0), (b + "ffn_up.weight", [inner, hidden], T.Q8_0),
                    (b + "ffn_down.weight", [hidden, inner], T.Q8_0)]
        if (i + 1) % 4 == 0:
            tensors += [(b + "attn_q.weight", [heads * hd * 2, hidden], T.Q8_0),
                        (b + "attn_k.weight", [kv * hd, hidden], T.Q8_0), (b + "attn_v.weight", [kv * hd, hidden], T.Q8_0),
                        (b + "attn_output.weight", [hidden, heads * hd], T.Q8_0),
                        (b + "attn_q_norm.weight", [hd], T.F32), (b + "attn_k_norm.weight", [hd], T.F32)]
        else:
            tensors += [(b + "attn_qkv.weight", [channels, hidden], T.Q8_0),
                        (b + "attn_gate.weight", [value_width, hidden], T.Q8_0),
                        (b + "ssm_beta.weight", [value_heads, hidden], T.Q8_0),
                        (b + "ssm_alpha.weight", [value_heads, hidden], T.Q8_0),
                        (b + "ssm_conv1d.weight", [channels, kernel], T.F32), (b + "ssm_dt.bias", [value_heads], T.F32),
                        (b + "ssm_a", [value_heads], T.F32), (b + "ssm_norm.weight", [dim], T.F32),
                        (b + "ssm_out.weight", [hidden, value_width], T.Q8_0)]
    write(out / "qwen35-2b-shapes.gguf", "qwen35", keys, tensors, vocab)


def main():
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    which = sys.argv[2:] or ["qwen3moe", "gpt-oss"]
    if "qwen3moe" in which:
        qwen3moe(out)
    if "gpt-oss" in which:
        gpt_oss(out)
    if "qwen35" in which:
        qwen35(out)


if __name__ == "__main__":
    main()
