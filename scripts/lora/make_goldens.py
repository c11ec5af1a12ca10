#!/usr/bin/env python3
"""Writes the PEFT LoRA adapters of tests/fixtures/lora/ and what PEFT computes with them.

Run by scripts/lora/make_goldens.sh; needs torch, transformers, peft and safetensors (made with
peft 0.21.2, torch 2.15.0, transformers 5.24.0, safetensors 0.8.0).

    make_goldens.py peft OUT_DIR               # the six PEFT cases
    make_goldens.py gguf OUT_DIR LLAMA_CPP_SRC # gguf-lora/expected.json (after the converter ran)
    make_goldens.py mlx-check OUT_DIR          # adds transformers logits to mlx-lora/expected.json
                                               # and transformers checks to mlx-affine/expected.json

Bases (random weights, in the repository): tests/fixtures/models/llama3 (Llama 3, BF16) and
tests/fixtures/gpt2-tiny (GPT-2, Conv1D weights stored [in, out], lm_head tied to wte). Both are
loaded in float32, so a merged weight is the exact f32 value of the base weight plus PEFT's delta.

For every PEFT case the folder holds:
  adapter_config.json, adapter_model.safetensors  exactly as PeftModel.save_pretrained writes them;
  expected.json      16 input ids, the f32 logits of the PEFT model with the adapter active
                     (eval mode) and of the model after merge_and_unload(), the scaling PEFT uses
                     for every adapted module, the adapter file's tensor names and shapes, versions;
  merged.safetensors the f32 tensors that merge_and_unload() changed (or added), under the base
                     model's own state-dict names.
All adapter parameters are set from a fixed torch seed per case, so the files are reproducible.
"""

import json
import os
import re
import sys
from pathlib import Path

import numpy as np
import torch
import transformers
from safetensors import safe_open
from safetensors.torch import save_file

import peft
from peft import LoraConfig, PeftModel, get_peft_model

ROOT = Path(__file__).resolve().parents[2]
LLAMA = "tests/fixtures/models/llama3"  # relative to ROOT, so adapter_config.json names it so
GPT2 = "tests/fixtures/gpt2-tiny"

# 16 input ids (below both vocabularies: Llama 320, GPT-2 512).
LLAMA_IDS = [1, 37, 101, 66, 250, 143, 212, 89, 177, 58, 199, 120, 233, 74, 160, 95]
GPT2_IDS = [464, 37, 301, 66, 450, 143, 212, 389, 177, 58, 499, 120, 233, 74, 360, 95]

# name -> (base, ids, seed, std of lora_A/lora_B (and lora biases), LoraConfig kwargs)
CASES = {
    "llama-lora": (LLAMA, LLAMA_IDS, 1001, 0.1, dict(
        r=4, lora_alpha=8,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    )),
    "llama-rslora": (LLAMA, LLAMA_IDS, 1002, 0.05, dict(
        r=8, lora_alpha=16.0, use_rslora=True,
        target_modules=r".*\.(q_proj|v_proj|down_proj)$",
        exclude_modules=["model.layers.1.mlp.down_proj"],
    )),
    "llama-patterns": (LLAMA, LLAMA_IDS, 1003, 0.07, dict(
        r=4, lora_alpha=8,
        target_modules=["gate_proj", "up_proj", "down_proj"],
        rank_pattern={"model.layers.0.mlp.down_proj": 2},
        alpha_pattern={"up_proj": 32},
        lora_bias=True,
    )),
    "llama-dora": (LLAMA, LLAMA_IDS, 1004, 0.1, dict(
        r=4, lora_alpha=8, use_dora=True,
        target_modules=["q_proj", "v_proj", "o_proj"],
    )),
    "llama-embed": (LLAMA, LLAMA_IDS, 1005, 0.1, dict(
        r=4, lora_alpha=8,
        target_modules=["embed_tokens", "q_proj"],
        modules_to_save=["lm_head"],
    )),
    "gpt2-conv1d": (GPT2, GPT2_IDS, 1006, 0.07, dict(
        r=4, lora_alpha=16, fan_in_fan_out=True,
        target_modules=["c_attn", "c_proj", "c_fc"],
    )),
}

MAGNITUDE_STD = 0.1   # DoRA magnitude m = m0 * (1 + 0.1 * N(0, 1)), m0 = PEFT's initial value
SAVED_COPY_STD = 0.02  # modules_to_save copy = base weight + 0.02 * N(0, 1)


def f32(x) -> str:
    """Shortest decimal that reads back as the same f32."""
    s = str(np.float32(x))
    assert np.isfinite(np.float32(x)), s
    return s


def write_json(path: Path, obj: dict, matrices: dict):
    """JSON with one line per logits row; floats as the shortest f32 decimal."""
    parts = []
    items = list(obj.items()) + list(matrices.items())
    for i, (k, v) in enumerate(items):
        if k in matrices:
            rows = ",\n".join("  [" + ",".join(f32(x) for x in row) + "]" for row in v)
            val = "[\n" + rows + "\n ]"
        else:
            val = json.dumps(v)
        parts.append(f" {json.dumps(k)}: {val}")
    path.write_text("{\n" + ",\n".join(parts) + "\n}\n")


def load_base(base: str, **config_overrides) -> torch.nn.Module:
    model = transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32, **config_overrides)
    return model.eval()


@torch.no_grad()
def logits(model, ids) -> np.ndarray:
    out = model(input_ids=torch.tensor([ids])).logits[0].float().numpy()
    assert out.shape[0] == len(ids) and np.isfinite(out).all()
    return out


@torch.no_grad()
def randomize(model, seed: int, std: float):
    """Sets every adapter parameter (named_parameters order) from one seeded generator."""
    g = torch.Generator().manual_seed(seed)
    done = []
    for name, p in model.named_parameters():
        if "modules_to_save" in name:
            p.add_(SAVED_COPY_STD * torch.randn(p.shape, generator=g))
        elif "lora_magnitude_vector" in name:
            p.mul_(1 + MAGNITUDE_STD * torch.randn(p.shape, generator=g))
        elif "lora_" in name:
            p.copy_(std * torch.randn(p.shape, generator=g))
        else:
            continue
        done.append(name)
    return done


def module_name(peft_name: str) -> str:
    """base_model.model.<path>[.base_layer] -> <path> (the base model's module path)."""
    prefix = "base_model.model."
    assert peft_name.startswith(prefix), peft_name
    return peft_name[len(prefix):]


def scalings(model) -> dict:
    out = {}
    for name, m in model.named_modules():
        if isinstance(m, peft.tuners.lora.LoraLayer) and "default" in getattr(m, "scaling", {}):
            out[module_name(name)] = float(m.scaling["default"])
    return out


def adapter_tensors(path: Path) -> dict:
    with safe_open(path, "pt") as f:
        return {k: [list(f.get_slice(k).get_shape()), f.get_slice(k).get_dtype()] for k in sorted(f.keys())}


def make_peft_case(out: Path, case: str):
    base, ids, seed, std, kwargs = CASES[case]
    d = out / case
    d.mkdir(parents=True, exist_ok=True)
    for old in ("adapter_config.json", "adapter_model.safetensors", "README.md"):
        (d / old).unlink(missing_ok=True)

    # 1. PEFT model with deterministic adapter weights, saved as PEFT saves it.
    model = get_peft_model(load_base(base), LoraConfig(**kwargs)).eval()
    randomize(model, seed, std)
    unmerged = logits(model, ids)
    scale = scalings(model)
    model.save_pretrained(d)
    # save_pretrained writes a README.md model card template; it is not part of the adapter format.
    (d / "README.md").unlink(missing_ok=True)

    # 2. Load it back the way users do and check it reproduces the same model.
    overrides = {}
    if kwargs.get("lora_bias"):
        # PEFT merges lora_B's bias into the base layer's bias and refuses when the base layer has
        # none (Llama's MLP has none). The merge is therefore done on the same base with
        # mlp_bias=True and all those biases zero, which computes the same function.
        overrides["mlp_bias"] = True
    base_model = load_base(base, **overrides)
    if overrides:
        with torch.no_grad():
            for name, p in base_model.named_parameters():
                if name.endswith(".bias"):
                    p.zero_()
    reference_sd = {k: v.clone() for k, v in base_model.state_dict().items()}
    loaded = PeftModel.from_pretrained(base_model, d).eval()
    again = logits(loaded, ids)
    assert np.array_equal(again, unmerged), f"{case}: reloaded adapter differs ({np.abs(again - unmerged).max()})"
    assert scalings(loaded) == scale, (scalings(loaded), scale)

    # 3. merge_and_unload and the tensors it changed.
    merged_model = loaded.merge_and_unload().eval()
    merged = logits(merged_model, ids)
    changed = {}
    for k, v in merged_model.state_dict().items():
        ref = reference_sd.get(k)
        if ref is None or not torch.equal(ref, v):
            changed[k] = v.detach().to(torch.float32).contiguous().clone()
    if case == "llama-embed":
        assert "lm_head.weight" in changed and "model.embed_tokens.weight" in changed
    save_file(changed, str(d / "merged.safetensors"))

    base_ref = load_base(base)
    base_logits = logits(base_ref, ids)
    diff_merge = float(np.abs(merged - unmerged).max())
    diff_base = float(np.abs(unmerged - base_logits).max())
    assert diff_merge < 1e-3, diff_merge
    assert diff_base > 0.05, f"{case}: adapter barely changes the logits ({diff_base})"

    with open(d / "adapter_config.json") as f:
        cfg = json.load(f)
    meta = {
        "case": case,
        "base": base,
        "ids": ids,
        "scaling": scale,
        "adapter_tensors": adapter_tensors(d / "adapter_model.safetensors"),
        "merged_tensors": {k: list(v.shape) for k, v in sorted(changed.items())},
        "max_abs_diff_merged_vs_unmerged": diff_merge,
        "max_abs_diff_unmerged_vs_base": diff_base,
        "seed": seed,
        "init_std": std,
        "peft_type": cfg["peft_type"],
        "peft_version": peft.__version__,
        "torch_version": torch.__version__.split("+")[0],
        "transformers_version": transformers.__version__,
    }
    write_json(d / "expected.json", meta, {"logits_unmerged": unmerged, "logits_merged": merged})
    print(f"{case}: {len(meta['adapter_tensors'])} adapter tensors, {len(changed)} merged tensors, "
          f"merged-unmerged {diff_merge:.2e}, adapter effect {diff_base:.3f}")


def gguf_expected(out: Path, src: Path):
    """Reads gguf-lora/adapter.gguf back with llama.cpp's gguf-py and records what the converter wrote."""
    sys.path.insert(0, str(src / "gguf-py"))
    import gguf  # llama.cpp's own gguf-py
    from safetensors.numpy import load_file

    d = out / "gguf-lora"
    reader = gguf.GGUFReader(str(d / "adapter.gguf"))
    fields = {}
    for name, field in reader.fields.items():
        v = field.contents()
        fields[name] = {"type": "/".join(t.name for t in field.types),
                        "value": float(v) if isinstance(v, float) else v}
    tensors = {}
    data = {}
    for t in reader.tensors:
        # GGUF lists dimensions innermost first; numpy shape is the reverse.
        tensors[t.name] = {"ne": [int(x) for x in t.shape], "shape": list(t.data.shape),
                           "type": t.tensor_type.name}
        data[t.name] = np.array(t.data)

    # Compare with the PEFT adapter: lora_a == lora_A, lora_b == lora_B, except for Q/K where the
    # converter permutes rows (LlamaModel.permute, the same as for the base weights).
    peft_sd = load_file(str(out / "llama-lora" / "adapter_model.safetensors"))
    with open(ROOT / LLAMA / "config.json") as f:
        hp = json.load(f)
    n_head, n_kv = hp["num_attention_heads"], hp["num_key_value_heads"]

    def permute(w, n_head, n_head_kv):
        if n_head_kv is not None and n_head != n_head_kv:
            n_head = n_head_kv
        return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
                .swapaxes(1, 2).reshape(w.shape))

    names = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
             "mlp.down_proj": "ffn_down"}
    mapping = {}
    findings = {}
    for layer in range(hp["num_hidden_layers"]):
        for hf, gg in names.items():
            pa = peft_sd[f"base_model.model.model.layers.{layer}.{hf}.lora_A.weight"]
            pb = peft_sd[f"base_model.model.model.layers.{layer}.{hf}.lora_B.weight"]
            ga = data[f"blk.{layer}.{gg}.weight.lora_a"]
            gb = data[f"blk.{layer}.{gg}.weight.lora_b"]
            mapping[f"base_model.model.model.layers.{layer}.{hf}.lora_A.weight"] = f"blk.{layer}.{gg}.weight.lora_a"
            mapping[f"base_model.model.model.layers.{layer}.{hf}.lora_B.weight"] = f"blk.{layer}.{gg}.weight.lora_b"
            a_same = np.array_equal(ga, pa)
            if np.array_equal(gb, pb):
                b = "unchanged"
            elif hf.endswith("q_proj") and np.array_equal(gb, permute(pb, n_head, n_head)):
                b = "rows permuted like q (n_head)"
            elif hf.endswith("k_proj") and np.array_equal(gb, permute(pb, n_head, n_kv)):
                b = "rows permuted like k (n_head_kv)"
            else:
                raise AssertionError(f"{gg}: lora_b matches neither PEFT's lora_B nor its permutation")
            assert a_same, f"{gg}: lora_a differs from PEFT's lora_A"
            findings[f"blk.{layer}.{gg}"] = {"lora_a": "equal to lora_A", "lora_b": b}

    expected = {
        "case": "gguf-lora",
        "source": "llama-lora/adapter_model.safetensors + adapter_config.json",
        "base": LLAMA,
        "converter": "convert_lora_to_gguf.py --outtype f32 --base " + LLAMA,
        "llama_cpp_commit": os.environ.get("LLAMACPP_COMMIT", ""),
        "adapter.type": fields["adapter.type"]["value"],
        "adapter.lora.alpha": fields["adapter.lora.alpha"]["value"],
        "metadata": fields,
        "tensors": tensors,
        "peft_to_gguf_names": mapping,
        "compared_with_peft": findings,
    }
    text = json.dumps(expected, indent=1)
    text = re.sub(r"\[\s*(-?\d+),\s*(-?\d+)\s*\]", r"[\1, \2]", text)  # shapes on one line
    (d / "expected.json").write_text(text + "\n")
    print("gguf-lora:", {k: expected[k] for k in ("adapter.type", "adapter.lora.alpha")})


def mlx_check(out: Path):
    """Adds the logits transformers computes from mlx-lora/merged.safetensors to its expected.json."""
    from safetensors.torch import load_file

    d = out / "mlx-lora"
    path = d / "expected.json"
    exp = json.loads(path.read_text())
    model = load_base(LLAMA)
    merged = load_file(str(d / "merged.safetensors"))
    missing, unexpected = model.load_state_dict(merged, strict=False)
    assert not unexpected, unexpected
    lt = logits(model, exp["ids"])

    # The fused weights against W + scale * lora_b.T @ lora_a.T computed in float64.
    from safetensors.numpy import load_file as load_np
    base_sd = {k: v.numpy() for k, v in load_base(LLAMA).state_dict().items()}
    adapter = load_np(str(d / "adapters.safetensors"))
    worst = 0.0
    for k, v in load_np(str(d / "merged.safetensors")).items():
        mod = k[: -len(".weight")]
        a, b = adapter[mod + ".lora_a"].astype(np.float64), adapter[mod + ".lora_b"].astype(np.float64)
        ref = (base_sd[k].astype(np.float64) + exp["scale"] * (b.T @ a.T)).astype(np.float32)
        worst = max(worst, float(np.abs(ref - v).max()))
    assert worst < 1e-5, worst
    mlx_merged = np.array(exp["logits_merged"], dtype=np.float32)
    exp_meta = {k: v for k, v in exp.items() if not k.startswith("logits_")}
    exp_meta["max_abs_diff_transformers_vs_mlx_merged"] = float(np.abs(lt - mlx_merged).max())
    exp_meta["max_abs_diff_merged_vs_f64_formula"] = worst
    exp_meta["transformers_version"] = transformers.__version__
    exp_meta["torch_version"] = torch.__version__.split("+")[0]
    mats = {k: np.array(v, dtype=np.float32) for k, v in exp.items() if k.startswith("logits_") and k != "logits_merged_transformers"}
    mats["logits_merged_transformers"] = lt
    write_json(path, exp_meta, mats)
    print("mlx-lora: transformers vs mlx merged logits", exp_meta["max_abs_diff_transformers_vs_mlx_merged"])
    mlx_affine_check(out)


def dequantize_mlx_affine(tensors: dict, bits: int, group_size: int) -> dict:
    """MLX affine dequantization of a {name: tensor} state dict: every U32 `<p>.weight` with its
    `<p>.scales` and `<p>.biases` becomes the f32 `<p>.weight` w = q * scale + bias (q: `bits`-bit
    fields of the little-endian u32 words, lowest bits first; one scale and bias per `group_size`
    consecutive inputs); the other float tensors are cast to f32."""
    per_word = 32 // bits
    out = {}
    for k, v in tensors.items():
        if k.endswith((".scales", ".biases")):
            continue
        if v.dtype == torch.uint32:
            p = k[: -len(".weight")]
            q = v.numpy().view(np.uint32)
            q = np.stack([(q >> (bits * i)) & ((1 << bits) - 1) for i in range(per_word)], -1)
            q = q.reshape(q.shape[0], -1, group_size).astype(np.float32)
            scales = tensors[p + ".scales"].float().numpy()[:, :, None]
            biases = tensors[p + ".biases"].float().numpy()[:, :, None]
            out[k] = torch.from_numpy((q * scales + biases).reshape(q.shape[0], -1))
        else:
            out[k] = v.float()
    return out


def mlx_affine_check(out: Path):
    """Adds to mlx-affine/expected.json how far transformers' f32 logits, with the base's weights
    replaced by the dequantized base/ and fused/ weights, are from mlx's f32-cast logits."""
    from safetensors.torch import load_file

    d = out / "mlx-affine"
    path = d / "expected.json"
    exp = json.loads(path.read_text())
    exp_meta = {k: v for k, v in exp.items() if not k.startswith("logits_") and not k.startswith("max_abs_diff_transformers")}
    for which in ("base", "fused"):
        model = load_base(LLAMA)
        sd = dequantize_mlx_affine(load_file(str(d / which / "model.safetensors")), exp["bits"], exp["group_size"])
        model.load_state_dict(sd, strict=True)
        lt = logits(model, exp["ids"])
        diff = float(np.abs(lt - np.array(exp[f"logits_{which}_f32"], dtype=np.float32)).max())
        assert diff < 1e-4, (which, diff)
        exp_meta[f"max_abs_diff_transformers_dequantized_vs_mlx_{which}_f32"] = diff
    exp_meta["transformers_version"] = transformers.__version__
    exp_meta["torch_version"] = torch.__version__.split("+")[0]
    mats = {k: np.array(v, dtype=np.float32) for k, v in exp.items() if k.startswith("logits_")}
    write_json(path, exp_meta, mats)
    print("mlx-affine: transformers (dequantized, f32) vs mlx f32 logits",
          exp_meta["max_abs_diff_transformers_dequantized_vs_mlx_base_f32"],
          exp_meta["max_abs_diff_transformers_dequantized_vs_mlx_fused_f32"])


def main():
    torch.set_num_threads(1)
    what, out = sys.argv[1], Path(sys.argv[2]).resolve()
    os.chdir(ROOT)  # base paths are relative to the repository root
    if what == "peft":
        cases = sys.argv[3:] or list(CASES)
        for case in cases:
            make_peft_case(out, case)
    elif what == "gguf":
        gguf_expected(out, Path(sys.argv[3]).resolve())
    elif what == "mlx-check":
        mlx_check(out)
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main()
