#!/usr/bin/env python3
"""Writes llamacpp.json for cases whose GGUF files llama-cpp-python cannot yet evaluate in this
repository's pipeline (Qwen3-MoE): `llama-perplexity -c 16 -b 16 -t 2` on perplexity.txt for each
`*.gguf` of the case folder, the same command llamacpp_goldens.py runs. Standard library only.

    llamacpp_perplexity.py FIXTURES_DIR LLAMA_PERPLEXITY CASE...
"""

import json
import re
import subprocess
import sys
from pathlib import Path

CTX = 16


def perplexity(binary, model, text):
    run = subprocess.run([binary, "-m", str(model), "-f", str(text), "-c", str(CTX), "-b", str(CTX), "-t", "2"],
                         capture_output=True, text=True)
    if run.returncode != 0:
        return None, f"llama-perplexity exited with {run.returncode}"
    found = re.search(r"Final estimate: PPL = ([0-9.]+)", run.stdout + run.stderr)
    if not found:
        raise SystemExit(f"{model}: no final estimate in llama-perplexity's output")
    return float(found.group(1)), None


def main():
    root, binary, cases = Path(sys.argv[1]), sys.argv[2], sys.argv[3:]
    text = root / "perplexity.txt"
    for case in cases:
        folder = root / case
        out = {"made_by": f"llama-perplexity -c {CTX} -b {CTX} -t 2 -f perplexity.txt (llama.cpp from "
                          "llama-cpp-python 0.3.36's sources)"}
        for model in sorted(folder.glob("*.gguf")):
            value, failure = perplexity(binary, model, text)
            # A file llama.cpp cannot run is recorded as such, not left out silently.
            out[model.name] = {"perplexity": value, "perplexity_ctx": CTX} if failure is None else {"failed": failure}
            print(f"{case}/{model.name}: {value if failure is None else failure}")
        (folder / "llamacpp.json").write_text(json.dumps(out, separators=(",", ":")) + "\n")


if __name__ == "__main__":
    main()
