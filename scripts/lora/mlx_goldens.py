#!/usr/bin/env python3
"""Writes tests/fixtures/lora/mlx-lora/: an mlx-lm LoRA adapter on tests/fixtures/models/llama3.

Run by scripts/lora/make_goldens.sh in a venv with mlx (CPU build) and mlx-lm (made with
mlx 0.32.4, mlx-lm 0.32.2).

    mlx_goldens.py OUT_DIR

Files (all made by mlx-lm's own code):
  adapters.safetensors  dict(tree_flatten(model.trainable_parameters())) saved with
                        mx.save_safetensors, as mlx_lm's trainer saves it: for every adapted
                        module `model.layers.N.<path>.lora_a` [in, r] and `.lora_b` [r, out];
  adapter_config.json   mlx_lm.utils.save_config(vars(args)) of the arguments `mlx_lm lora --train`
                        would get (fine_tune_type "lora", num_layers 2, lora_parameters with rank 4,
                        scale 20.0, dropout 0.0 and keys), as mlx_lm's lora command writes it;
  merged.safetensors    the fused weights (LoRALinear.fuse, as mlx_lm's fuse command does:
                        W + (scale * lora_b.T) @ lora_a.T) of the adapted modules, f32, under the
                        base model's names (`model.layers.N.self_attn.q_proj.weight`);
  expected.json         the ids, mlx's logits with the adapter (unfused) and after fusing.
The base is cast to float32 before the adapter is applied, so the fused weights are f32 (mlx_lm
itself keeps the base's dtype, BF16 here). mlx-lm's Llama reads `rope_theta` / `rope_scaling`
and not the `rope_parameters` of the fixture's (transformers 5) config.json, so those two are
passed to it explicitly; the logits then match transformers' (see expected.json).

It then writes tests/fixtures/lora/mlx-affine/: the same adapter fused into an MLX affine 4-bit
(group size 32) quantization of the base, both made by mlx-lm's own code:
  base/           what `mlx_lm convert --quantize --q-bits 4 --q-group-size 32` does: the base
                  loaded by mlx_lm.utils.load (BF16, with rope_theta / rope_scaling passed as
                  above), mlx_lm.utils.quantize_model(model, config, 32, 4), saved with
                  mlx_lm.utils.save_model and save_config (config.json, model.safetensors,
                  model.safetensors.index.json); the tokenizer files and generation_config.json
                  are copied from the base folder (instead of being re-saved by the tokenizer);
  fused/          what `mlx_lm fuse --model base --adapter-path mlx-lora` does (no --dequantize):
                  base/ loaded with the adapter, every LoRALinear replaced by fuse(dequantize=False)
                  (dequantize, add the delta in BF16, quantize again with 4 bits / group size 32),
                  saved the same way;
  expected.json   the ids, mlx's logits of base/ and fused/ (each loaded from its folder; as
                  loaded, BF16, and with every floating parameter cast to f32), the names of the
                  tensors whose bytes differ between the two model.safetensors, and the tensors
                  of base/model.safetensors.
"""

import json
import os
import shutil
import sys
import types
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten

import mlx_lm
from mlx_lm import lora as mlx_lora
from mlx_lm.tuner.utils import linear_to_lora_layers, load_adapters
from mlx_lm.utils import load, load_model, quantize_model, save_config, save_model

ROOT = Path(__file__).resolve().parents[2]
BASE = "tests/fixtures/models/llama3"
IDS = [1, 37, 101, 66, 250, 143, 212, 89, 177, 58, 199, 120, 233, 74, 160, 95]
SEED = 1007
STD = 0.03  # lora_a and lora_b ~ N(0, 0.03^2); the delta is 20 * sum over 4 ranks
LORA_PARAMETERS = {"rank": 4, "scale": 20.0, "dropout": 0.0,
                   "keys": ["self_attn.q_proj", "self_attn.v_proj", "mlp.down_proj"]}
NUM_LAYERS = 2
Q_BITS = 4
Q_GROUP_SIZE = 32
# Copied next to an mlx-lm model folder as `mlx_lm convert` / `mlx_lm fuse` leave them there.
BASE_FILES = ["tokenizer.json", "tokenizer_config.json", "tokenizer.model", "generation_config.json"]


def f32(x) -> str:
    s = str(np.float32(x))
    assert np.isfinite(np.float32(x)), s
    return s


def write_json(path: Path, obj: dict, matrices: dict):
    parts = [f" {json.dumps(k)}: {json.dumps(v)}" for k, v in obj.items()]
    for k, v in matrices.items():
        rows = ",\n".join("  [" + ",".join(f32(x) for x in row) + "]" for row in v)
        parts.append(f" {json.dumps(k)}: [\n{rows}\n ]")
    path.write_text("{\n" + ",\n".join(parts) + "\n}\n")


def rope_overrides() -> dict:
    """rope_theta / rope_scaling for mlx-lm, from the base's transformers-5 rope_parameters."""
    cfg = json.loads((ROOT / BASE / "config.json").read_text())
    rope = dict(cfg["rope_parameters"])
    return {"rope_theta": rope.pop("rope_theta"), "rope_scaling": rope}


def base_model():
    model, _ = load_model(ROOT / BASE, model_config=rope_overrides())
    model.set_dtype(mx.float32)
    model.eval()
    return model


def logits(model) -> np.ndarray:
    out = model(mx.array([IDS]))[0].astype(mx.float32)
    mx.eval(out)
    out = np.array(out)
    assert out.shape == (len(IDS), 320) and np.isfinite(out).all()
    return out


def main():
    out = Path(sys.argv[1]).resolve()
    mlx_lora_case(out)
    mlx_affine_case(out)


def mlx_lora_case(out: Path):
    d = out / "mlx-lora"
    d.mkdir(parents=True, exist_ok=True)
    os.chdir(ROOT)

    # Arguments as `mlx_lm lora --model BASE --train --num-layers 2 --adapter-path D` (with a
    # config file giving lora_parameters) end up in after main() fills in CONFIG_DEFAULTS.
    try:
        rel = os.path.relpath(d, ROOT)
    except ValueError:
        rel = str(d)
    args = vars(mlx_lora.build_parser().parse_args(
        ["--model", BASE, "--train", "--num-layers", str(NUM_LAYERS), "--adapter-path", rel]))
    args["lora_parameters"] = dict(LORA_PARAMETERS)
    for k, v in mlx_lora.CONFIG_DEFAULTS.items():
        if args.get(k, None) is None:
            args[k] = v
    args = types.SimpleNamespace(**args)

    # The adapter: mlx_lm's train_model() up to the first save, with random lora_a / lora_b.
    model = base_model()
    base_weights = dict(tree_flatten(model.parameters()))
    base_logits = logits(model)
    model.freeze()
    linear_to_lora_layers(model, args.num_layers, args.lora_parameters, use_dora=False)
    rng = np.random.default_rng(SEED)
    updates = []
    for name, value in sorted(tree_flatten(model.trainable_parameters())):
        updates.append((name, mx.array((STD * rng.standard_normal(value.shape)).astype(np.float32))))
    model.update(tree_unflatten(updates))
    unfused = logits(model)
    save_config(vars(args), d / "adapter_config.json")
    mx.save_safetensors(str(d / "adapters.safetensors"), dict(tree_flatten(model.trainable_parameters())))

    # Load it back as mlx_lm does (load_adapters) and fuse as mlx_lm's fuse command does.
    model = base_model()
    load_adapters(model, str(d))
    model.eval()
    again = logits(model)
    assert np.array_equal(again, unfused), np.abs(again - unfused).max()
    fused_linears = [(n, m.fuse(dequantize=False)) for n, m in model.named_modules() if hasattr(m, "fuse")]
    model.update_modules(tree_unflatten(fused_linears))
    fused = logits(model)
    weights = dict(tree_flatten(model.parameters()))
    merged = {k: v for k, v in weights.items()
              if k not in base_weights or not mx.array_equal(v, base_weights[k]).item()}
    assert all(v.dtype == mx.float32 for v in merged.values())
    mx.save_safetensors(str(d / "merged.safetensors"), merged)

    adapter = mx.load(str(d / "adapters.safetensors"))
    meta = {
        "case": "mlx-lora",
        "base": BASE,
        "ids": IDS,
        "scale": LORA_PARAMETERS["scale"],
        "adapter_tensors": {k: [list(v.shape), {mx.float32: "F32", mx.bfloat16: "BF16", mx.float16: "F16"}[v.dtype]] for k, v in sorted(adapter.items())},
        "merged_tensors": {k: list(v.shape) for k, v in sorted(merged.items())},
        "max_abs_diff_fused_vs_unfused": float(np.abs(fused - unfused).max()),
        "max_abs_diff_unfused_vs_base": float(np.abs(unfused - base_logits).max()),
        "seed": SEED,
        "init_std": STD,
        "mlx_version": mx.__version__,
        "mlx_lm_version": mlx_lm.__version__,
    }
    write_json(d / "expected.json", meta, {"logits_unmerged": unfused, "logits_merged": fused})
    print(f"mlx-lora: {len(adapter)} adapter tensors, {len(merged)} merged tensors, "
          f"fused-unfused {meta['max_abs_diff_fused_vs_unfused']:.2e}, "
          f"adapter effect {meta['max_abs_diff_unfused_vs_base']:.3f}")


def raw_tensors(path: Path) -> dict:
    """{name: (dtype, shape, stored bytes)} of a safetensors file, in sorted name order."""
    data = path.read_bytes()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    header.pop("__metadata__", None)
    body = data[8 + n:]
    return {k: (v["dtype"], v["shape"], body[v["data_offsets"][0]:v["data_offsets"][1]])
            for k, v in sorted(header.items())}


def save_folder(dst: Path, model, config: dict):
    """Model folder as mlx_lm.utils.save writes it, with the base's tokenizer files copied."""
    if dst.exists():
        shutil.rmtree(dst)
    save_model(dst, model, donate_model=False)
    save_config(dict(config), config_path=dst / "config.json")
    for name in BASE_FILES:
        if (ROOT / BASE / name).exists():
            shutil.copyfile(ROOT / BASE / name, dst / name)


def mlx_affine_case(out: Path):
    d = out / "mlx-affine"
    d.mkdir(parents=True, exist_ok=True)
    os.chdir(ROOT)
    adapter_dir = out / "mlx-lora"

    # `mlx_lm convert --hf-path BASE -q --q-bits 4 --q-group-size 32`: convert() loads the model
    # (mlx_lm.utils.load; the rope settings are passed as model_config since convert() reads the
    # config as it is), keeps its dtype (the config has no torch_dtype, so no cast: the weights
    # stay BF16), quantizes every layer that has to_quantized and an input size divisible by the
    # group size (all Linear layers and the embedding) and saves.
    model, _, config = load(BASE, model_config=rope_overrides(), return_config=True, lazy=True)
    assert config.get("torch_dtype") is None
    model, config = quantize_model(model, config, Q_GROUP_SIZE, Q_BITS)
    mx.eval(model.parameters())
    save_folder(d / "base", model, config)

    # `mlx_lm fuse --model base --adapter-path mlx-lora --save-path fused` (no --dequantize).
    model, _, config = load(str(d / "base"), adapter_path=str(adapter_dir), return_config=True)
    unfused = logits(model)
    fused_linears = [(n, m.fuse(dequantize=False)) for n, m in model.named_modules() if hasattr(m, "fuse")]
    assert len(fused_linears) == 3 * NUM_LAYERS, [n for n, _ in fused_linears]
    model.update_modules(tree_unflatten(fused_linears))
    mx.eval(model.parameters())
    save_folder(d / "fused", model, config)

    # Logits of both folders as mlx-lm loads them.
    base_m, _ = load(str(d / "base"))
    fused_m, _ = load(str(d / "fused"))
    base_logits = logits(base_m)
    fused_logits = logits(fused_m)
    # The same quantized models with every floating parameter (scales, biases, norms) cast to f32.
    base_m.set_dtype(mx.float32)
    fused_m.set_dtype(mx.float32)
    base_logits_f32 = logits(base_m)
    fused_logits_f32 = logits(fused_m)

    base_t = raw_tensors(d / "base" / "model.safetensors")
    fused_t = raw_tensors(d / "fused" / "model.safetensors")
    assert list(base_t) == list(fused_t)
    changed = [k for k in base_t if base_t[k] != fused_t[k]]

    meta = {
        "case": "mlx-affine",
        "base": BASE,
        "adapter": "tests/fixtures/lora/mlx-lora",
        "ids": IDS,
        "bits": Q_BITS,
        "group_size": Q_GROUP_SIZE,
        "mode": "affine",
        "fused_tensors": changed,
        "base_tensors": {k: [shape, dtype] for k, (dtype, shape, _) in base_t.items()},
        "max_abs_diff_fused_vs_base": float(np.abs(fused_logits - base_logits).max()),
        "max_abs_diff_fused_vs_unfused": float(np.abs(fused_logits - unfused).max()),
        "mlx_version": mx.__version__,
        "mlx_lm_version": mlx_lm.__version__,
    }
    write_json(d / "expected.json", meta, {
        "logits_base": base_logits, "logits_fused": fused_logits,
        "logits_base_f32": base_logits_f32, "logits_fused_f32": fused_logits_f32,
    })
    print(f"mlx-affine: {len(base_t)} tensors, fused {len(changed)}, "
          f"fused-base {meta['max_abs_diff_fused_vs_base']:.3f}, "
          f"fused-unfused {meta['max_abs_diff_fused_vs_unfused']:.3f}")


if __name__ == "__main__":
    main()
