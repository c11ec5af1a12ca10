#!/usr/bin/env python3
"""Writes tests/fixtures/gguf/llamacpp/tokenizer.json: the ids llama.cpp's `llama-tokenize` gives
for a set of texts with the byte-level BPE vocabulary of tests/fixtures/gpt2-tiny (512 tokens,
255 merges, `<|endoftext|>` a control token) under several `tokenizer.ggml.pre` values.

The GGUF files are written here from the fixture's tokenizer.json and not kept: the test builds
the same metadata. Needs the `gguf` package (scripts/setup.sh) and llama.cpp's tools
(scripts/llamacpp/build.sh). Usage: tokenizer_goldens.py [LLAMA_TOKENIZE]
"""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from gguf import GGUFWriter

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "fixtures" / "gguf" / "llamacpp" / "tokenizer.json"
PRES = ["default", "gpt-2", "llama-bpe", "qwen2"]
TEXTS = [
    "Hello world",
    "Hello  world's 12345 caf\u00e9<|endoftext|>",
    "  leading spaces and trailing   ",
    "tabs\tand\nnew\n\nlines\r\n",
    "digits 1 22 333 4444 55555 3.14159",
    "don't won't I'm they've we'd",
    "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8 and \u0440\u0443\u0441\u0441\u043a\u0438\u0439",
    "emoji \U0001F600\U0001F680 done",
    "<|endoftext|>Once upon a time<|endoftext|>",
    "punctuation!!! ... ??? (brackets) [x] {y}",
    "MiXeD CaSe WORDS and_snake_case and camelCase",
    "a",
]


def main():
    tokenize = sys.argv[1] if len(sys.argv) > 1 else os.path.expanduser("~/.cache/nnx/llama.cpp/bin/llama-tokenize")
    tokenizer = json.loads((ROOT / "tests" / "fixtures" / "gpt2-tiny" / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    tokens = [None] * len(vocab)
    for token, index in vocab.items():
        tokens[index] = token
    types = [1] * len(tokens)
    for added in tokenizer["added_tokens"]:
        types[added["id"]] = 3
    merges = [m if isinstance(m, str) else " ".join(m) for m in tokenizer["model"]["merges"]]
    goldens = {}
    with tempfile.TemporaryDirectory() as tmp:
        for pre in PRES:
            path = os.path.join(tmp, f"{pre}.gguf")
            writer = GGUFWriter(path, "llama")
            for key, value in [("block_count", 1), ("context_length", 64), ("embedding_length", 64),
                               ("feed_forward_length", 64), ("attention.head_count", 1)]:
                writer.add_uint32(f"llama.{key}", value)
            writer.add_string("tokenizer.ggml.model", "gpt2")
            writer.add_string("tokenizer.ggml.pre", pre)
            writer.add_array("tokenizer.ggml.tokens", tokens)
            writer.add_array("tokenizer.ggml.token_type", types)
            writer.add_array("tokenizer.ggml.merges", merges)
            writer.add_uint32("tokenizer.ggml.bos_token_id", 0)
            writer.add_uint32("tokenizer.ggml.eos_token_id", 0)
            writer.write_header_to_file()
            writer.write_kv_data_to_file()
            writer.write_tensors_to_file()
            writer.close()
            cases = []
            for text in TEXTS:
                out = subprocess.run([tokenize, "-m", path, "-p", text, "--ids", "--log-disable"],
                                     check=True, capture_output=True, text=True).stdout
                ids = json.loads(out.strip().splitlines()[-1])
                cases.append([text, ids])
            goldens[pre] = cases
    version = Path(tokenize).parent.parent / "VERSION"
    OUT.write_text(json.dumps({
        "made_by": "llama-tokenize, " + (version.read_text().splitlines()[0] if version.exists() else "llama.cpp"),
        "vocabulary": "tests/fixtures/gpt2-tiny/tokenizer.json",
        "bos_token_id": 0,
        "cases": goldens,
    }, ensure_ascii=False, indent=1) + "\n")
    print(f"{sum(map(len, goldens.values()))} cases in {OUT}")


if __name__ == "__main__":
    main()
