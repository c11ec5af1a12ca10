#!/usr/bin/env python3
"""Writes the model folders of tests/fixtures/models/ and their transformers references.

Run by scripts/models/make_goldens.sh (which also converts and quantizes with llama.cpp and runs
llamacpp_goldens.py); needs torch, transformers, safetensors, sentencepiece, tokenizers.

    make_goldens.py OUT_DIR

For every case it writes a folder laid out like a published Hugging Face model (config.json,
model.safetensors in BF16, generation_config.json, tokenizer files with a chat template) and
reference.json: a prompt, 16 input ids, the F32 logits transformers computes for them from the
BF16-rounded weights and 12 greedily generated ids. Everything is deterministic (fixed seeds).
"""

import io
import json
import math
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import sentencepiece as spm
import tokenizers
import torch
import transformers
from tokenizers import Regex, decoders, models, normalizers, pre_tokenizers, trainers

N_IDS = 16
N_GREEDY = 12
VOCAB = 320
PROMPT = "the caf\u00e9 and the dog"

# Text the tokenizers are trained on (ASCII only, so that "café" in the prompt needs byte fallback).
TRAIN_TEXT = """The quick brown fox jumps over the lazy dog. A small model reads a short text and learns to predict the next word.
Weights are stored in files, and tests compare the numbers that two programs compute from the same weights.
Hello world, this is a tiny tokenizer trained on a few sentences about models, numbers and words.
Rain fell on the old town while the children played in the garden near the river and the mill.
Every layer of the network turns a list of numbers into another list of numbers of the same length.
The reader opens the file, checks the header, and maps each tensor to the name the model expects.
Open the door, read the book, write the answer, and then close the window before the night comes.
She said that the weather would be fine tomorrow, so they planned a long walk along the coast.
Numbers like 12, 345 and 6789 appear in the text, as do dates such as 2024 and times like 10:30.
"""

# Fixed ids appended after the prompt's ids to fill 16 positions.
FILL = [37, 101, 66, 250, 143, 212, 89, 177, 58, 199, 120, 233, 74, 160, 95, 281]

CHAT_TEMPLATES = {
    # Llama 3 instruct (without tool calling and the date header).
    "llama3": (
        "{{- bos_token }}"
        "{%- for message in messages %}"
        "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}"
        "{%- endfor %}"
        "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
    ),
    # Mistral instruct v0.3 (without tools).
    "mistral": (
        "{{- bos_token }}"
        "{%- for message in messages %}"
        "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
        "{{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
        "{%- endif %}"
        "{%- if message['role'] == 'user' %}{{- '[INST] ' + message['content'] + '[/INST]' }}"
        "{%- elif message['role'] == 'assistant' %}{{- ' ' + message['content'] + eos_token }}"
        "{%- else %}{{- raise_exception('Only user and assistant roles are supported!') }}{%- endif %}"
        "{%- endfor %}"
    ),
    # Qwen2 / Qwen2.5 ChatML (without tools).
    "qwen": (
        "{%- for message in messages %}"
        "{%- if loop.first and messages[0]['role'] != 'system' %}"
        "{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}"
        "{%- endif %}"
        "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
        "{%- endfor %}"
        "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
    ),
    # Gemma 3 (text only).
    "gemma": (
        "{{- bos_token }}"
        "{%- if messages[0]['role'] == 'system' %}"
        "{%- set first_user_prefix = messages[0]['content'] + '\\n\\n' %}{%- set loop_messages = messages[1:] %}"
        "{%- else %}{%- set first_user_prefix = '' %}{%- set loop_messages = messages %}{%- endif %}"
        "{%- for message in loop_messages %}"
        "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
        "{{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
        "{%- endif %}"
        "{%- if message['role'] == 'assistant' %}{%- set role = 'model' %}{%- else %}{%- set role = message['role'] %}{%- endif %}"
        "{{- '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else '') + message['content'] | trim + '<end_of_turn>\\n' }}"
        "{%- endfor %}"
        "{%- if add_generation_prompt %}{{- '<start_of_turn>model\\n' }}{%- endif %}"
    ),
}


# ---------------------------------------------------------------------------------------------
# Tokenizers


def train_spm(user_defined, ids, pieces, add_dummy_prefix):
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(TRAIN_TEXT.splitlines()), model_writer=buf, vocab_size=VOCAB,
        model_type="bpe", byte_fallback=True, character_coverage=1.0, split_digits=True,
        user_defined_symbols=user_defined, add_dummy_prefix=add_dummy_prefix,
        normalization_rule_name="identity", remove_extra_whitespaces=False,
        num_threads=1, minloglevel=2, **ids, **pieces)
    proto = buf.getvalue()
    assert spm.SentencePieceProcessor(model_proto=proto).vocab_size() == VOCAB
    return proto


def spm_tokenizer(folder, family):
    """tokenizer.model + the tokenizer.json transformers converts it to."""
    if family == "gemma":
        proto = train_spm(["<mask>", "<start_of_turn>", "<end_of_turn>"],
                          dict(pad_id=0, eos_id=1, bos_id=2, unk_id=3),
                          dict(pad_piece="<pad>", eos_piece="<eos>", bos_piece="<bos>", unk_piece="<unk>"),
                          add_dummy_prefix=False)
        cls = transformers.GemmaTokenizerFast
        kw = dict(bos_token="<bos>", eos_token="<eos>", unk_token="<unk>", pad_token="<pad>",
                  mask_token="<mask>", add_bos_token=True, add_eos_token=False,
                  extra_special_tokens=["<start_of_turn>", "<end_of_turn>"])
    else:
        user = ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"] if family == "llama3" else ["[INST]", "[/INST]"]
        proto = train_spm(user, dict(unk_id=0, bos_id=1, eos_id=2, pad_id=-1), {}, add_dummy_prefix=True)
        cls = transformers.LlamaTokenizerFast
        kw = dict(bos_token="<s>", eos_token="</s>", unk_token="<unk>", add_bos_token=True,
                  add_eos_token=False, extra_special_tokens=user, legacy=False)
    (folder / "tokenizer.model").write_bytes(proto)
    tok = cls.from_pretrained(folder, **kw)
    return tok


QWEN_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def bpe_tokenizer(folder):
    """A byte-level BPE like Qwen2's: NFC, Qwen's split regex, 256 byte symbols, merges, and the
    three ChatML specials as added tokens after the merges (ids 317, 318, 319)."""
    tok = tokenizers.Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    trainer = trainers.BpeTrainer(vocab_size=VOCAB - len(QWEN_SPECIALS), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), min_frequency=1)
    tok.train_from_iterator(TRAIN_TEXT.splitlines(keepends=True), trainer=trainer)
    assert tok.get_vocab_size() == VOCAB - len(QWEN_SPECIALS), tok.get_vocab_size()
    tok.add_special_tokens([tokenizers.AddedToken(s, special=True, normalized=False) for s in QWEN_SPECIALS])
    fast = transformers.Qwen2TokenizerFast(
        tokenizer_object=tok, bos_token=None, eos_token="<|im_end|>", pad_token="<|endoftext|>",
        unk_token=None, add_prefix_space=False, errors="replace", clean_up_tokenization_spaces=False)
    return fast


def save_tokenizer(tok, folder, family):
    tok.chat_template = CHAT_TEMPLATES[family]
    tok.save_pretrained(folder)
    # Keep the chat template in tokenizer_config.json (as most published folders do) rather than
    # in chat_template.jinja.
    jinja = folder / "chat_template.jinja"
    cfg_path = folder / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    if family != "qwen":
        # Published Llama/Mistral/Gemma folders say this explicitly; transformers 5 leaves it out.
        cfg["add_bos_token"] = True
        cfg["add_eos_token"] = False
    cfg["chat_template"] = CHAT_TEMPLATES[family]
    cfg.pop("is_local", None)
    cfg.pop("local_files_only", None)
    cfg.pop("vocab_file", None)
    cfg_path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")
    if jinja.exists():
        jinja.unlink()
    if family == "qwen":
        # vocab.json and merges.txt, as the slow Qwen2Tokenizer reads them.
        tj = json.loads((folder / "tokenizer.json").read_text())
        vocab = tj["model"]["vocab"]
        (folder / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False) + "\n")
        merges = [m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]]
        (folder / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n")
    # Sanity: the saved folder loads back and tokenizes like the object we made.
    again = transformers.AutoTokenizer.from_pretrained(folder)
    assert again(PROMPT).input_ids == tok(PROMPT).input_ids, (again(PROMPT).input_ids, tok(PROMPT).input_ids)
    return again


# ---------------------------------------------------------------------------------------------
# Models

COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-5,
              max_position_embeddings=512, attention_dropout=0.0)


def case_configs(tok_ids):
    """name -> (family, config class, model class, config kwargs)."""
    llama3_rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                   "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    return {
        "llama3": ("llama3", transformers.LlamaConfig, transformers.LlamaForCausalLM,
                   dict(COMMON, rope_parameters=llama3_rope, tie_word_embeddings=False)),
        "mistral": ("mistral", transformers.MistralConfig, transformers.MistralForCausalLM,
                    dict(COMMON, sliding_window=None, rope_parameters={"rope_type": "default", "rope_theta": 1e6},
                         tie_word_embeddings=False)),
        "qwen2": ("qwen", transformers.Qwen2Config, transformers.Qwen2ForCausalLM,
                  dict(COMMON, rope_parameters={"rope_type": "default", "rope_theta": 1e6}, rms_norm_eps=1e-6,
                       tie_word_embeddings=True, use_sliding_window=False, sliding_window=None)),
        "qwen3": ("qwen", transformers.Qwen3Config, transformers.Qwen3ForCausalLM,
                  dict(COMMON, head_dim=32, rope_parameters={"rope_type": "default", "rope_theta": 1e6},
                       rms_norm_eps=1e-6, tie_word_embeddings=True, use_sliding_window=False,
                       sliding_window=None, attention_bias=False)),
        "gemma3": ("gemma", transformers.Gemma3TextConfig, transformers.Gemma3ForCausalLM,
                   dict(COMMON, num_hidden_layers=6, query_pre_attn_scalar=16, sliding_window=4,
                        layer_types=["sliding_attention"] * 5 + ["full_attention"],
                        rope_parameters={"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
                                         "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}},
                        rms_norm_eps=1e-6, hidden_activation="gelu_pytorch_tanh", final_logit_softcapping=None,
                        attn_logit_softcapping=None, tie_word_embeddings=True)),
        "llama3-wide": ("llama3", transformers.LlamaConfig, transformers.LlamaForCausalLM,
                        dict(COMMON, hidden_size=256, intermediate_size=512, head_dim=64,
                             rope_parameters=llama3_rope, tie_word_embeddings=False)),
        # Qwen3-MoE: 8 experts, 2 per token, weights renormalized (as Qwen3-30B-A3B); every layer
        # sparse, as llama.cpp runs every qwen3moe layer.
        "qwen3moe": ("qwen", transformers.Qwen3MoeConfig, transformers.Qwen3MoeForCausalLM,
                     dict(COMMON, head_dim=32, rope_parameters={"rope_type": "default", "rope_theta": 1e6},
                          rms_norm_eps=1e-6, tie_word_embeddings=False, use_sliding_window=False,
                          sliding_window=None, attention_bias=False, num_experts=8, num_experts_per_tok=2,
                          moe_intermediate_size=48, norm_topk_prob=True, decoder_sparse_step=1,
                          mlp_only_layers=[])),
        # gpt-oss: 8 experts of width 64 (a whole number of MXFP4 blocks) with biases, 2 per token (softmax over the chosen logits), the
        # clamped SwiGLU, attention sinks and biases, YaRN rotary scaling, and a sliding window
        # of 4 on the even layers. YaRN's ramp is truncated (transformers' default; gpt-oss's
        # own config says false), as llama.cpp always computes it, so that the GGUF files and
        # transformers agree.
        "gpt-oss": ("qwen", transformers.GptOssConfig, transformers.GptOssForCausalLM,
                    dict(COMMON, intermediate_size=64, num_local_experts=8, num_experts_per_tok=2,
                         sliding_window=4, layer_types=["sliding_attention", "full_attention"],
                         rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 4.0,
                                          "original_max_position_embeddings": 128, "beta_fast": 32.0,
                                          "beta_slow": 1.0, "truncate": True},
                         swiglu_limit=7.0, attention_bias=True, tie_word_embeddings=False)),
        # Gemma 4: 8 layers, sliding (window 4, heads of 16, 2 KV heads, theta 1e4) and full
        # ones (heads of 32, one KV head whose keys are also its values, "proportional" rotary
        # on a quarter of the head, theta 1e6); per-layer embeddings of 8; the last two layers
        # reuse the keys and values of the last full and sliding layers before them and have
        # MLPs twice as wide; final soft cap 30 (llama.cpp caps at 30 whatever the file says).
        "gemma4": ("gemma", transformers.Gemma4TextConfig, transformers.Gemma4ForCausalLM,
                   dict(COMMON, num_hidden_layers=8, head_dim=16, sliding_window=4,
                        layer_types=["sliding_attention", "sliding_attention", "full_attention",
                                     "sliding_attention", "sliding_attention", "full_attention",
                                     "sliding_attention", "full_attention"],
                        rope_parameters={"full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                                            "rope_theta": 1e6},
                                         "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}},
                        global_head_dim=32, num_global_key_value_heads=1, attention_k_eq_v=True,
                        vocab_size_per_layer_input=VOCAB, hidden_size_per_layer_input=8,
                        num_kv_shared_layers=2, use_double_wide_mlp=True, rms_norm_eps=1e-6,
                        hidden_activation="gelu_pytorch_tanh", final_logit_softcapping=30.0,
                        tie_word_embeddings=True)),
        # Gemma 4's mixture of experts (as 26B-A4B): on every layer 4 experts of 32 (2 per
        # token) beside the dense MLP, routed by a scaled router with a scale per expert; no
        # per-layer embeddings or shared keys and values.
        "gemma4moe": ("gemma", transformers.Gemma4TextConfig, transformers.Gemma4ForCausalLM,
                      dict(COMMON, num_hidden_layers=4, head_dim=16, sliding_window=4,
                           layer_types=["sliding_attention", "full_attention", "sliding_attention",
                                        "full_attention"],
                           rope_parameters={"full_attention": {"rope_type": "proportional",
                                                               "partial_rotary_factor": 0.25, "rope_theta": 1e6},
                                            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}},
                           global_head_dim=32, num_global_key_value_heads=1, attention_k_eq_v=True,
                           vocab_size_per_layer_input=VOCAB, hidden_size_per_layer_input=0,
                           enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=32,
                           rms_norm_eps=1e-6, hidden_activation="gelu_pytorch_tanh", final_logit_softcapping=30.0,
                           tie_word_embeddings=True)),
        # Qwen3.5: three Gated DeltaNet layers, then one gated full-attention layer (partial
        # rotary: a quarter of each head of 32). Two key heads serve four value heads, so that
        # the converter's reordering of value heads is exercised. rms_norm_eps is 1e-6, the
        # epsilon transformers' DeltaNet uses for its l2 norms (llama.cpp uses rms_norm_eps).
        "qwen35": ("qwen", transformers.Qwen3_5TextConfig, transformers.Qwen3_5ForCausalLM,
                   dict(COMMON, num_hidden_layers=4, head_dim=32, rms_norm_eps=1e-6,
                        layer_types=["linear_attention"] * 3 + ["full_attention"],
                        rope_parameters={"rope_type": "default", "rope_theta": 1e7,
                                         "partial_rotary_factor": 0.25, "mrope_section": [2, 1, 1]},
                        linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=16,
                        linear_num_key_heads=2, linear_num_value_heads=4, tie_word_embeddings=False)),
        # Qwen3.5-MoE: the same layers with 8 experts of 32 (2 per token, renormalized) and a
        # shared expert of 48 behind a sigmoid gate on every layer.
        "qwen35moe": ("qwen", transformers.Qwen3_5MoeTextConfig, transformers.Qwen3_5MoeForCausalLM,
                      dict(COMMON, num_hidden_layers=4, head_dim=32, rms_norm_eps=1e-6,
                           layer_types=["linear_attention"] * 3 + ["full_attention"],
                           rope_parameters={"rope_type": "default", "rope_theta": 1e7,
                                            "partial_rotary_factor": 0.25, "mrope_section": [2, 1, 1]},
                           linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=16,
                           linear_num_key_heads=2, linear_num_value_heads=4, num_experts=8,
                           num_experts_per_tok=2, moe_intermediate_size=32,
                           shared_expert_intermediate_size=48, tie_word_embeddings=False)),
    }


@torch.no_grad()
def randomize(model, seed, gemma, qwen35=False, gemma4=False):
    g = torch.Generator().manual_seed(seed)
    for name, p in sorted(model.named_parameters()):
        n = torch.randn(p.shape, generator=g, dtype=torch.float32)
        if gemma and name == "model.norm.weight":
            # Final norm scaled by about 4 (1 + 3): with Gemma's small tied embedding (below) the
            # logits would otherwise have a standard deviation of only about 0.4.
            v = 3.0 + 0.2 * n
        elif name.endswith("norm.weight"):
            # Gemma 3's and Qwen3.5's RMSNorms compute x * (1 + w); the others (Gemma 4's,
            # Qwen3.5's gated DeltaNet norm) x * w.
            centred = (gemma and not gemma4) or (qwen35 and "linear_attn.norm" not in name)
            v = 0.2 * n if centred else 1.0 + 0.2 * n
        elif name.endswith(".bias"):
            v = 0.2 * n
        elif "embed_tokens" in name:
            # Gemma multiplies the embedding by sqrt(hidden) = 8 and ties it to the output: with a
            # larger std the input token's own embedding dominates the residual stream and greedy
            # decoding just repeats the last token.
            v = (0.05 if gemma else 0.3) * n
        else:
            # Fan-in: the last axis (a stack of experts is [experts, out, in]).
            v = 1.5 / math.sqrt(p.shape[-1]) * n
        p.copy_(v)
    # Gemma 4's per-layer output scale is a buffer, not a parameter.
    for name, b in sorted(model.named_buffers()):
        if name.endswith("layer_scalar"):
            b.copy_(1.0 + 0.2 * torch.randn(b.shape, generator=g, dtype=torch.float32))


def round7(x):
    return [float(f"{v:.7g}") for v in x]


def write_generation_config(folder, tok, cfg, family):
    eos = cfg.eos_token_id
    if family == "llama3":
        eos = [cfg.eos_token_id, tok.convert_tokens_to_ids("<|eot_id|>")]
    elif family == "qwen":
        eos = [tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|endoftext|>")]
    elif family == "gemma":
        eos = [cfg.eos_token_id, tok.convert_tokens_to_ids("<end_of_turn>")]
    gc = transformers.GenerationConfig(bos_token_id=cfg.bos_token_id, eos_token_id=eos,
                                       pad_token_id=cfg.pad_token_id)
    gc.save_pretrained(folder)


def make_case(out, name, index, family, config_cls, model_cls, kwargs):
    folder = out / name
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)

    if family == "qwen":
        tok = bpe_tokenizer(folder)
    else:
        tok = spm_tokenizer(folder, family)
    tok = save_tokenizer(tok, folder, family)
    assert len(tok) <= VOCAB, len(tok)

    special = dict(bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    if family == "qwen":
        special["bos_token_id"] = tok.convert_tokens_to_ids("<|endoftext|>")
    cfg = config_cls(**kwargs, **special)
    cfg._attn_implementation = "eager"

    torch.manual_seed(1000 + index)
    model = model_cls(cfg).eval()
    randomize(model, 2000 + index, gemma=(family == "gemma"), qwen35=name.startswith("qwen35"),
              gemma4=name.startswith("gemma4"))
    model.to(torch.bfloat16)
    model.save_pretrained(folder, safe_serialization=True)
    write_generation_config(folder, tok, cfg, family)
    # The saved config.json says dtype bfloat16; everything below is F32 from the BF16 values.
    model.to(torch.float32)

    # Reload from disk to make sure the references come from what the folder holds.
    model = model_cls.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager").eval()

    prompt_ids = tok(PROMPT).input_ids
    ids = (prompt_ids + FILL)[:N_IDS]
    x = torch.tensor([ids])
    with torch.no_grad():
        logits = model(x).logits[0].float()
    assert logits.shape == (N_IDS, VOCAB)

    gen_cfg = transformers.GenerationConfig(do_sample=False, num_beams=1, max_new_tokens=N_GREEDY,
                                            min_new_tokens=0, eos_token_id=None,
                                            pad_token_id=0, bos_token_id=None, use_cache=True)
    # Set as the model's own generation config: transformers fills values a passed config leaves
    # at their defaults (eos_token_id None) from the model's, which would stop at end-of-sequence.
    model.generation_config = gen_cfg
    with torch.no_grad():
        out_ids = model.generate(x, attention_mask=torch.ones_like(x))[0, N_IDS:].tolist()
    assert len(out_ids) == N_GREEDY
    # Cross-check: a plain argmax loop without cache gives the same ids.
    seq = list(ids)
    with torch.no_grad():
        for _ in range(N_GREEDY):
            seq.append(int(model(torch.tensor([seq])).logits[0, -1].argmax()))
    if seq[N_IDS:] != out_ids:
        print(f"  warning: {name}: generate {out_ids} != no-cache argmax loop {seq[N_IDS:]}")

    ref = {
        "made_by": f"transformers {transformers.__version__}, torch {torch.__version__} (CPU, float32, eager attention)",
        "case": name,
        "architecture": model_cls.__name__,
        "prompt": PROMPT,
        "prompt_ids": prompt_ids,
        "ids": ids,
        "ids_note": f"the tokenizer's ids for prompt (with BOS where it adds one) truncated to {N_IDS} or "
                    f"followed by fixed ids {FILL[:N_IDS - min(len(prompt_ids), N_IDS)]}",
        "logits": [round7(row) for row in logits.tolist()],
        "greedy": out_ids,
        "greedy_note": f"model.generate(ids, do_sample=False, use_cache=True, max_new_tokens={N_GREEDY}), "
                       "end-of-sequence not stopping it",
        "versions": {"transformers": transformers.__version__, "torch": torch.__version__,
                     "tokenizers": tokenizers.__version__, "sentencepiece": spm.__version__},
    }
    (folder / "reference.json").write_text(json.dumps(ref, separators=(",", ":")) + "\n")
    print(f"{name}: prompt ids {prompt_ids}, greedy {out_ids}, logit std {logits.std():.3f}")


def main():
    out = Path(sys.argv[1])
    only = sys.argv[2:]
    torch.set_num_threads(2)
    torch.use_deterministic_algorithms(True)
    out.mkdir(parents=True, exist_ok=True)
    for index, (name, (family, ccls, mcls, kw)) in enumerate(case_configs(None).items()):
        if only and name not in only:
            continue
        make_case(out, name, index, family, ccls, mcls, kw)


if __name__ == "__main__":
    main()
