#!/usr/bin/env python3
"""Runs llama.cpp's convert_hf_to_gguf.py unchanged, with one patch for byte-level BPE tokenizers.

    convert.py LLAMA_CPP_SRC [--pre NAME] -- CONVERTER_ARGS...

The converter recognises a BPE pre-tokenizer by hashing the tokenization of a fixed text and
refuses tokenizers it has not seen; the fixtures' small Qwen-style tokenizers are unknown to it.
With --pre NAME, TextModel.get_vocab_base_pre is replaced by one returning NAME (e.g. "qwen2"),
which is what the converter writes as `tokenizer.ggml.pre` for the real Qwen2 tokenizer.
"""

import sys
from pathlib import Path


def main():
    args = sys.argv[1:]
    src = Path(args.pop(0)).resolve()
    pre = None
    if args and args[0] == "--pre":
        pre = args[1]
        args = args[2:]
    if args and args[0] == "--":
        args = args[1:]
    sys.path.insert(0, str(src / "gguf-py"))
    sys.path.insert(0, str(src))
    import conversion.base  # noqa: E402  (llama.cpp's own package)
    if pre is not None:
        conversion.base.TextModel.get_vocab_base_pre = lambda self, tokenizer: pre
    import convert_hf_to_gguf  # noqa: E402
    sys.argv = [str(src / "convert_hf_to_gguf.py")] + args
    convert_hf_to_gguf.main()


if __name__ == "__main__":
    main()
