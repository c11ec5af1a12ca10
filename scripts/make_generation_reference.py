"""Writes `generation.json` beside the tiny generation fixtures: transformers' greedy decoding
of text prompts, alone and as a left-padded batch, with the fixture's `tokenizer.json`.

    python scripts/make_generation_reference.py [FIXTURES_DIR]   (default: tests/fixtures)

Run `scripts/make_tokenizers.py` first. Needs `torch`, `transformers` and `tokenizers`. The
models run in float32 (the BF16 Llama weights widen exactly); end-of-sequence tokens do not stop
the decoding, so every row has `MAX_NEW_TOKENS` new tokens. Each file holds:

- `prompt`, `prompt_ids`, `greedy_ids`: one text prompt, its ids, and prompt plus new ids;
- `batch`: `prompts`, their `prompt_ids`, and `greedy_ids` (prompt plus new ids, without the
  padding) decoded together, left-padded with token 0 and an attention mask;
- `input_ids`, `input_greedy_ids`: the ids of the fixture's `reference.json` and their greedy
  continuation.
"""

import json
import sys
from pathlib import Path

import torch
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM

MAX_NEW_TOKENS = 16
PROMPTS = ["Once upon a time", "The quick brown fox jumps over the lazy dog, and"]


def greedy(model, rows):
    """Greedy continuations of `rows` (lists of ids), left-padded into one batch."""
    longest = max(len(row) for row in rows)
    ids = torch.tensor([[0] * (longest - len(row)) + row for row in rows])
    mask = torch.tensor([[0] * (longest - len(row)) + [1] * len(row) for row in rows])
    with torch.no_grad():
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=MAX_NEW_TOKENS,
            min_new_tokens=MAX_NEW_TOKENS,
            do_sample=False,
            pad_token_id=0,
        )
    return [row + out[i, longest:].tolist() for i, row in enumerate(rows)]


def main():
    fixtures = Path(sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures")
    for name in ["gpt2-tiny", "llama-tiny"]:
        folder = fixtures / name
        tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        prompt_ids = [tokenizer.encode(prompt).ids for prompt in PROMPTS]
        input_ids = json.loads((folder / "reference.json").read_text())["input_ids"]
        reference = {
            "prompt": PROMPTS[0],
            "prompt_ids": prompt_ids[0],
            "greedy_ids": greedy(model, prompt_ids[:1])[0],
            "batch": {"prompts": PROMPTS, "prompt_ids": prompt_ids, "greedy_ids": greedy(model, prompt_ids)},
            "input_ids": input_ids,
            "input_greedy_ids": greedy(model, [input_ids])[0],
        }
        (folder / "generation.json").write_text(json.dumps(reference) + "\n")
        print(f"{folder / 'generation.json'}: {reference['greedy_ids']}")


if __name__ == "__main__":
    main()
