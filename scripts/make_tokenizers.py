"""Writes the `tokenizer.json` of the tiny generation fixtures with Hugging Face's `tokenizers`.

    python scripts/make_tokenizers.py [FIXTURES_DIR]   (default: tests/fixtures)

Both are byte-level BPE tokenizers (GPT-2's byte-to-character mapping, so every text encodes)
whose vocabulary has exactly the `vocab_size` of the fixture's `config.json`:

- `gpt2-tiny` (512): `<|endoftext|>` (id 0), the 256 bytes, and the 255 merges a BPE trainer
  learns from the text below; no token is added when encoding.
- `llama-tiny` (256): `<unk>`, `<s>`, `</s>` (ids 0, 1 and 2, the model's `bos_token_id` and
  `eos_token_id`), then byte `b` as token `b` for bytes 3 to 255 and no merges, so that every
  character of more than one byte is split across tokens; bytes 0 to 2 encode as `<unk>`.
  Encoding adds `<s>` in front, as Llama's tokenizer does.

Needs only `tokenizers` (`pip install tokenizers`); the output is deterministic.
"""

import json
import sys
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

# What the GPT-2 merges are learned from: English prose, code and a little accented and CJK text.
CORPUS = [
    "Once upon a time there was a little model that learned to write stories.",
    "It read the same stories again and again, and every time it read them it remembered a bit more.",
    "The quick brown fox jumps over the lazy dog. The dog did not mind; it was sleeping in the sun.",
    "fn main() { let answer = 6 * 7; println!(\"the answer is {answer}\"); }",
    "def generate(model, prompt, steps):\n    for _ in range(steps):\n        prompt.append(model(prompt))\n",
    "Café, naïve, déjà vu, résumé: words that English borrowed with their accents.",
    "日本語のテキストも少しあります。東京は日本の首都です。",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000, and dates such as 2024-05-17.",
    "In the beginning the weights were random, and the text they wrote was random too.",
    "Tokens are pieces of text: whole words, parts of words, single bytes.",
] * 20


def bytes_to_unicode():
    """GPT-2's mapping of the 256 bytes to printable characters."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(
        range(ord("®"), ord("ÿ") + 1)
    )
    characters = {byte: chr(byte) for byte in printable}
    extra = 0
    for byte in range(256):
        if byte not in characters:
            characters[byte] = chr(256 + extra)
            extra += 1
    return characters


def vocab_size(folder):
    return json.loads((folder / "config.json").read_text())["vocab_size"]


def gpt2(folder):
    size = vocab_size(folder)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=size,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(CORPUS, trainer)
    assert tokenizer.get_vocab_size(True) == size, tokenizer.get_vocab_size(True)
    return tokenizer


def llama(folder):
    size = vocab_size(folder)
    specials = ["<unk>", "<s>", "</s>"]
    characters = bytes_to_unicode()
    vocab = {token: id for id, token in enumerate(specials)}
    for byte in range(len(specials), 256):
        vocab[characters[byte]] = byte
    assert len(vocab) == size, len(vocab)
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tokenizer.add_special_tokens(specials)
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)]
    )
    assert tokenizer.get_vocab_size(True) == size, tokenizer.get_vocab_size(True)
    return tokenizer


def main():
    fixtures = Path(sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures")
    for name, make in [("gpt2-tiny", gpt2), ("llama-tiny", llama)]:
        folder = fixtures / name
        tokenizer = make(folder)
        tokenizer.save(str(folder / "tokenizer.json"))
        sample = "Café 日本"
        print(f"{folder / 'tokenizer.json'}: {tokenizer.get_vocab_size(True)} tokens; {sample!r} -> {tokenizer.encode(sample).ids}")


if __name__ == "__main__":
    main()
