#!/usr/bin/env python3
"""Writes llamacpp.json in each case folder of tests/fixtures/models/: what llama.cpp computes
from every GGUF file of the folder. Runs under the llama-cpp-python venv (numpy, llama_cpp).

    llamacpp_goldens.py FIXTURES_DIR LLAMA_PERPLEXITY [CASE...]

For each `*.gguf`: the logits of all 16 positions of reference.json's `ids` (evaluated as given,
no BOS added), 12 ids generated greedily (argmax of the last position's logits, fed back one at a
time, end-of-sequence not stopping it), llama.cpp's tokenization of reference.json's `prompt`
(add_special=True, so BOS only where the GGUF says so; parse_special=True), and the final
perplexity estimate of `llama-perplexity -c 16 -b 16 -t 2` on FIXTURES_DIR/perplexity.txt (for F32
files also `perplexity_exact`, with `-fa off -ctk f32 -ctv f32`).
For the F32 files also `logits_kv_f32`: the same logits with llama.cpp's K/V cache in F32
instead of its default F16.
"""

import json
import re
import subprocess
import sys
from pathlib import Path

import llama_cpp
import numpy as np

N_GREEDY = 12
CTX = 16


def round7(x):
    return [float(f"{v:.7g}") for v in x]


def run_gguf(path, ids, prompt, perplexity_bin, text_path):
    llm = llama_cpp.Llama(model_path=str(path), n_threads=2, n_threads_batch=2, n_ctx=64,
                          logits_all=True, verbose=False, seed=1234)
    llm.reset()
    llm.eval(ids)
    n = len(ids)
    logits = np.array(llm.scores[:n], dtype=np.float32)
    greedy = []
    for _ in range(N_GREEDY):
        nxt = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        greedy.append(nxt)
        llm.eval([nxt])
    tokens = llm.tokenize(prompt.encode("utf-8"), add_bos=True, special=True)
    extra = {}
    if path.name.endswith("-f32.gguf"):
        # llama.cpp keeps K and V in F16 by default; with F32 K/V the F32 file's logits match
        # transformers to ~1e-5 (except where ggml's F16 GELU table enters, Gemma).
        kv32 = llama_cpp.Llama(model_path=str(path), n_threads=2, n_threads_batch=2, n_ctx=64,
                               logits_all=True, verbose=False, seed=1234,
                               type_k=llama_cpp.GGML_TYPE_F32, type_v=llama_cpp.GGML_TYPE_F32)
        kv32.eval(ids)
        extra["logits_kv_f32"] = [round7(row) for row in np.array(kv32.scores[:n], dtype=np.float32).tolist()]
        kv32.close()
    add_bos = bool(llama_cpp.llama_vocab_get_add_bos(llama_cpp.llama_model_get_vocab(llm.model)))
    llm.close()

    out = subprocess.run([perplexity_bin, "-m", str(path), "-f", str(text_path), "-c", str(CTX),
                          "-b", str(CTX), "-t", "2"], capture_output=True, text=True)
    m = re.search(r"Final estimate: PPL = ([0-9.eE+-]+)", out.stdout + out.stderr)
    if out.returncode != 0 or not m:
        raise RuntimeError(f"llama-perplexity failed on {path}:\n{out.stderr[-3000:]}")
    if path.name.endswith("-f32.gguf"):
        # llama-perplexity's flash attention (on by default) rounds Q, K and V to F16 whatever
        # the cache types say; without it and with an F32 cache the F32 files' perplexity is
        # the exact one (on the MoE files, the F16 rounding flips a few routing choices).
        exact = subprocess.run([perplexity_bin, "-m", str(path), "-f", str(text_path), "-c", str(CTX),
                                "-b", str(CTX), "-t", "2", "-fa", "off", "-ctk", "f32", "-ctv", "f32"],
                               capture_output=True, text=True)
        found = re.search(r"Final estimate: PPL = ([0-9.eE+-]+)", exact.stdout + exact.stderr)
        if exact.returncode != 0 or not found:
            raise RuntimeError(f"llama-perplexity -fa off failed on {path}:\n{exact.stderr[-3000:]}")
        extra["perplexity_exact"] = float(found.group(1))
    return {
        "logits": [round7(row) for row in logits.tolist()],
        "greedy": greedy,
        "tokens": tokens,
        "add_bos": add_bos,
        "perplexity": float(m.group(1)),
        "perplexity_ctx": CTX,
        **extra,
    }


def main():
    root = Path(sys.argv[1])
    perplexity_bin = sys.argv[2]
    only = sys.argv[3:]
    text_path = root / "perplexity.txt"
    for folder in sorted(p for p in root.iterdir() if (p / "reference.json").is_file()):
        if only and folder.name not in only:
            continue
        ref = json.loads((folder / "reference.json").read_text())
        result = {
            "made_by": f"llama-cpp-python {llama_cpp.__version__} (n_threads=2, n_ctx=64, logits_all=True); "
                       "perplexity: llama-perplexity -c 16 -b 16 -t 2 -f perplexity.txt",
            "versions": {"llama_cpp_python": llama_cpp.__version__},
            "ids": ref["ids"],
            "prompt": ref["prompt"],
        }
        for gguf in sorted(folder.glob("*.gguf")):
            r = run_gguf(gguf, ref["ids"], ref["prompt"], perplexity_bin, text_path)
            result[gguf.name] = r
            diff = np.abs(np.array(r["logits"]) - np.array(ref["logits"])).max()
            same = "same" if r["greedy"] == ref["greedy"] else f"DIFFERENT {r['greedy']}"
            tok = "same" if r["tokens"] == ref["prompt_ids"] else f"DIFFERENT {r['tokens']}"
            if "logits_kv_f32" in r:
                d32 = np.abs(np.array(r["logits_kv_f32"]) - np.array(ref["logits"])).max()
                diff = f"{diff:.3g} (F32 K/V: {d32:.3g})"
            else:
                diff = f"{diff:.3g}"
            print(f"{folder.name}/{gguf.name}: max|logit diff| vs transformers {diff}; greedy {same}; "
                  f"tokens {tok}; ppl {r['perplexity']}")
        (folder / "llamacpp.json").write_text(json.dumps(result, separators=(",", ":")) + "\n")


if __name__ == "__main__":
    main()
