#!/usr/bin/env python3
"""Writes tests/fixtures/published/: small checkpoints quantized the way published quantized models
are, by the publishers' own Python code, with the publishers' own dequantization as reference.

Run by scripts/published/make_goldens.sh (which installs the packages into the oracle venv):

    make_goldens.py OUT_DIR [CASE ...]        # default: every case; about 30 s on 2 cores

Needs torch, transformers, safetensors, compressed-tensors, gptqmodel and autoawq (installed
--no-deps: only its pure-torch packing/quantizer code is used). Reads the BF16 model folders
tests/fixtures/models/llama3 and tests/fixtures/models/qwen3 (made by scripts/models/).

For every case it writes a folder laid out like a published quantized Hugging Face model:

- config.json: the base model's, plus `quantization_config` as the publisher's tool writes it;
- model.safetensors: every q/k/v/o/gate/up/down projection quantized and stored as the publisher
  stores it; embeddings, norms and lm_head are the base folder's BF16 tensors, bit for bit;
- the base folder's tokenizer files and generation_config.json;
- dequantized.safetensors: `<linear>.weight` [out, in] float32 for every quantized linear, as the
  publisher's own dequantization function computes it (run in float32; the script checks that the
  function's native-dtype output is exactly this value rounded to that dtype);
- reference.json: what transformers computes (float32, eager attention) from the "dequantized
  twin": the base model with each quantized linear's weight replaced by its dequantized value,
  for the same 16 ids as the base model's reference.json (weight-only: activations not quantized).

Everything is deterministic (fixed seeds, fixed calibration data); see the README of the output
folder for the formulas.
"""

import json
import math
import os
import shutil
import sys
import tempfile
import types
from pathlib import Path

# gptqmodel sizes its CPU thread pool from the core count and refuses to start with one worker
# per pool on a 2-core machine; 2 workers is enough and keeps it deterministic.
os.environ.setdefault("GPTQMODEL_CPU_WORKERS", "2")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# GPTQModel packs with its Python `pack_block` (not the C++ extension it would build on the fly).
os.environ.setdefault("GPTQMODEL_DISABLE_PACK_EXT", "1")

import torch
import transformers
from safetensors.torch import load_file, save_file

ROOT = Path(__file__).resolve().parents[2]
MODELS = Path(os.environ.get("NNX_MODELS_DIR", ROOT / "tests" / "fixtures" / "models"))

LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
N_GREEDY = 12
# Files of the base folder that are not copied (the weights and references are made anew).
NOT_COPIED = {"model.safetensors", "config.json", "reference.json", "llamacpp.json"}

# folder -> base model folder (tests/fixtures/models/)
CASES = {
    "fp8-block": "llama3",
    "ct-fp8-channel": "qwen3",
    "ct-fp8-tensor": "llama3",
    "ct-nvfp4": "llama3",
    "ct-w4a16": "qwen3",
    "ct-w4a16-asym": "llama3",
    "gptq": "llama3",
    "gptq-8bit": "qwen3",
    "awq": "qwen3",
}


def versions(*packages):
    import importlib.metadata as md
    out = {"transformers": transformers.__version__, "torch": torch.__version__}
    for pkg in ("safetensors",) + packages:
        out[pkg] = md.version(pkg)
    return out


# ---------------------------------------------------------------------------------------------
# Common


def is_linear(name):
    parts = name.split(".")
    return len(parts) >= 2 and parts[-1] == "weight" and parts[-2] in LINEARS


def base_tensors(base):
    return load_file(str(MODELS / base / "model.safetensors"))


def linear_names(base):
    """Module names (without `.weight`) of the linears to quantize, in file order."""
    return sorted(k[: -len(".weight")] for k in base_tensors(base) if is_linear(k))


def calibration_ids(n_seq=16, seq_len=64, seed=0):
    """Fixed random token ids (the calibration data of every tool that wants some)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 320, (n_seq, seq_len), generator=g)


def start_folder(out, case, base):
    folder = out / case
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    for f in sorted((MODELS / base).iterdir()):
        if f.is_file() and f.name not in NOT_COPIED and f.suffix != ".gguf":
            shutil.copy2(f, folder / f.name)
    return folder


def write_config(folder, base, quantization_config):
    cfg = json.loads((MODELS / base / "config.json").read_text())
    cfg["quantization_config"] = quantization_config
    (folder / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def check_unquantized_kept(folder, base):
    """Every tensor of the base folder that is not a quantized linear is in model.safetensors,
    unchanged (BF16, same bits)."""
    ref = base_tensors(base)
    got = load_file(str(folder / "model.safetensors"))
    for k, v in ref.items():
        if is_linear(k):
            assert k not in got or got[k].dtype != v.dtype, f"{k} left unquantized"
            continue
        assert k in got, f"{folder.name}: {k} missing"
        assert got[k].dtype == v.dtype and torch.equal(got[k], v), f"{folder.name}: {k} changed"


def save_dequantized(folder, deq):
    for k, v in deq.items():
        assert v.dtype == torch.float32 and v.ndim == 2, k
    save_file({k: v.contiguous() for k, v in sorted(deq.items())}, str(folder / "dequantized.safetensors"),
              metadata={"format": "pt"})


def round7(x):
    return [float(f"{v:.7g}") for v in x]


@torch.no_grad()
def twin_reference(folder, case, base, deq, packages):
    """reference.json of the dequantized twin; returns the max |logit - base logit|."""
    base_ref = json.loads((MODELS / base / "reference.json").read_text())
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    assert tok(base_ref["prompt"]).input_ids == base_ref["prompt_ids"]
    model = transformers.AutoModelForCausalLM.from_pretrained(
        MODELS / base, dtype=torch.float32, attn_implementation="eager").eval()
    params = dict(model.named_parameters())
    assert len(deq) == len(linear_names(base))
    for k, v in deq.items():
        p = params[k]
        assert p.shape == v.shape, (k, p.shape, v.shape)
        p.copy_(v)
    ids = base_ref["ids"]
    x = torch.tensor([ids])
    logits = model(x).logits[0].float()
    gen_cfg = transformers.GenerationConfig(do_sample=False, num_beams=1, max_new_tokens=N_GREEDY,
                                            min_new_tokens=0, eos_token_id=None, pad_token_id=0,
                                            bos_token_id=None, use_cache=True)
    model.generation_config = gen_cfg
    greedy = model.generate(x, attention_mask=torch.ones_like(x))[0, len(ids):].tolist()
    seq = list(ids)
    for _ in range(N_GREEDY):
        seq.append(int(model(torch.tensor([seq])).logits[0, -1].argmax()))
    if seq[len(ids):] != greedy:
        print(f"  warning: {case}: generate {greedy} != no-cache argmax loop {seq[len(ids):]}")
    ref = {
        "made_by": f"transformers {transformers.__version__}, torch {torch.__version__} (CPU, float32, eager "
                   f"attention) from the dequantized twin: {base}'s BF16 weights with every quantized linear's "
                   "weight replaced by dequantized.safetensors",
        "case": case,
        "architecture": type(model).__name__,
        "prompt": base_ref["prompt"],
        "prompt_ids": base_ref["prompt_ids"],
        "ids": ids,
        "ids_note": base_ref["ids_note"],
        "logits": [round7(row) for row in logits.tolist()],
        "greedy": greedy,
        "greedy_note": base_ref["greedy_note"],
        "versions": dict(base_ref["versions"], **versions(*packages)),
    }
    (folder / "reference.json").write_text(json.dumps(ref, separators=(",", ":")) + "\n")
    base_logits = torch.tensor(base_ref["logits"])
    diff = float((logits - base_logits).abs().max())
    same = sum(a == b for a, b in zip(greedy, base_ref["greedy"]))
    print(f"  {case}: max |logit - {base} logit| {diff:.4f}, greedy {greedy} ({same}/{N_GREEDY} as {base})")
    return diff


def same_after_rounding(f32, native, what):
    """The publisher's function run in its native dtype gives exactly our float32 value rounded
    to that dtype (so the float32 value is the unrounded result of the same formula)."""
    assert native.dtype != torch.float32 or torch.equal(f32, native), what
    assert torch.equal(f32.to(native.dtype), native), \
        f"{what}: native {native.dtype} result differs from the float32 one rounded " \
        f"(max {float((f32 - native.float()).abs().max())})"


# ---------------------------------------------------------------------------------------------
# fp8-block: DeepSeek-V3 / transformers FineGrainedFP8


def make_fp8_block(out, case, base):
    from transformers.integrations.finegrained_fp8 import Fp8Dequantize, Fp8Quantize

    folder = start_folder(out, case, base)
    block = (128, 128)
    tensors = {}
    deq = {}
    for k, v in base_tensors(base).items():
        if not is_linear(k):
            tensors[k] = v
            continue
        rows, cols = v.shape
        # Every linear here is at most 128 x 128: one (partial) 128 x 128 block, i.e. a scale grid
        # [ceil(out/128), ceil(in/128)] = [1, 1]. transformers' Fp8Quantize only tiles shapes that
        # divide by the block size (it passes others through unquantized), so it is given the
        # block clipped to the tensor, which is the same single block.
        assert rows <= block[0] and cols <= block[1]
        stub = types.SimpleNamespace(quantization_config=types.SimpleNamespace(
            weight_block_size=(min(rows, block[0]), min(cols, block[1])), scale_fmt="float"))
        q = Fp8Quantize(stub)._quantize_one(k, v)
        w8, s = q[k], q[k[: -len(".weight")] + ".weight_scale_inv"]
        assert w8.dtype == torch.float8_e4m3fn and s.dtype == torch.float32
        assert s.shape == (math.ceil(rows / block[0]), math.ceil(cols / block[1])), s.shape
        tensors[k] = w8
        tensors[k[: -len(".weight")] + ".weight_scale_inv"] = s
        # Reference: transformers' Fp8Dequantize (the `dequantize=True` load path).
        deq[k] = Fp8Dequantize(None)._dequantize_one(w8, s, output_dtype=torch.float32)
        native = Fp8Dequantize(None)._dequantize_one(w8, s, output_dtype=torch.bfloat16)
        same_after_rounding(deq[k], native, k)
        o, i = torch.arange(rows), torch.arange(cols)
        formula = w8.to(torch.float32) * s[o // block[0]][:, i // block[1]]
        assert torch.equal(formula, deq[k]), k
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    write_config(folder, base, {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                "weight_block_size": list(block)})
    check_unquantized_kept(folder, base)
    save_dequantized(folder, deq)

    # Cross-check: transformers loads the folder (FineGrainedFP8Config(dequantize=True), float32)
    # to the same weights.
    model = transformers.AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32,
        quantization_config=transformers.FineGrainedFP8Config(dequantize=True, weight_block_size=block))
    check_loaded(model, deq, case, "transformers FineGrainedFP8Config(dequantize=True)")
    return deq, ()


def check_loaded(model, deq, case, how):
    """The publisher's loader gives the dequantized weights, exactly or rounded to a 16-bit
    dtype it computes in; returns which."""
    params = dict(model.named_parameters())
    found = None
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        if all(torch.equal(params[k].detach().float(), v.to(dtype).float()) for k, v in deq.items()):
            found = dtype
            break
    worst = max(float((params[k].detach().float() - v).abs().max()) for k, v in deq.items())
    print(f"  {case}: {how} loads the folder (float32 model) to dequantized.safetensors rounded to {found} "
          f"(max |diff| {worst:g})")
    assert found is not None, f"{case}: {how} does not load the folder to the dequantized weights"
    return found


# ---------------------------------------------------------------------------------------------
# compressed-tensors (llm-compressor's flow: apply config, observe, compress, save)


def ct_flatten_weight(w, args):
    """llm-compressor's `_flatten_weight` (observers/helpers.py): (1, *qparam_shape, group)."""
    from compressed_tensors.quantization import QuantizationStrategy as S
    if args.strategy == S.TENSOR:
        return w.reshape((1, 1, -1))
    if args.strategy == S.CHANNEL:
        return w.unsqueeze(-2).unsqueeze(0)
    if args.strategy in (S.GROUP, S.TENSOR_GROUP):
        return w.unflatten(-1, (-1, args.group_size)).unsqueeze(0)
    raise ValueError(args.strategy)


def ct_minmax(observed):
    """llm-compressor's `_get_min_max` (observers/min_max.py)."""
    return torch.amin(observed, dim=(0, -1)), torch.amax(observed, dim=(0, -1))


def ct_global_scale(stats):
    """llm-compressor's `Observer.get_global_scale` over a fusion group's (min, max) statistics."""
    from compressed_tensors.quantization.utils import generate_gparam
    absmax = stats[0][1].max()
    for mn, mx in stats:
        absmax = torch.max(absmax, -mn.min())
        absmax = torch.max(absmax, mx.max())
    return generate_gparam(-absmax.reshape(1), absmax.reshape(1))


FUSED = (("gate_proj", "up_proj"), ("q_proj", "k_proj", "v_proj"))


@torch.no_grad()
def ct_activation_stats(model, names, args):
    """Static min/max observer ("static_minmax") of each linear's input over the calibration
    data, run through the unquantized BF16 model."""
    stats = {}
    hooks = []
    modules = dict(model.named_modules())

    def hook(name):
        def f(module, inputs):
            x = inputs[0]
            from compressed_tensors.quantization import QuantizationStrategy as S
            if args.strategy == S.TENSOR:
                obs = x.reshape((-1, 1, x.size(-1)))
            elif args.strategy == S.TENSOR_GROUP:
                obs = x.flatten(0, 1).unflatten(-1, (-1, args.group_size))
            else:
                raise ValueError(args.strategy)
            mn, mx = ct_minmax(obs)
            if name in stats:
                stats[name] = (torch.min(mn, stats[name][0]), torch.max(mx, stats[name][1]))
            else:
                stats[name] = (mn, mx)
        return f

    for n in names:
        hooks.append(modules[n].register_forward_pre_hook(hook(n)))
    for row in calibration_ids():
        model(row[None])
    for h in hooks:
        h.remove()
    return stats


def make_ct(out, case, base, preset, group_size=None):
    from compressed_tensors import ModelCompressor
    from compressed_tensors.compressors.base import BaseCompressor
    from compressed_tensors.quantization import (QuantizationConfig, QuantizationStrategy,
                                                 apply_quantization_config, preset_name_to_scheme)
    from compressed_tensors.quantization.utils import calculate_qparams

    folder = start_folder(out, case, base)
    scheme = preset_name_to_scheme(preset, ["Linear"])
    if group_size is not None:
        # As the preset, but groups of 32 (the preset's 128 does not divide in_features 64).
        scheme.weights = scheme.weights.model_copy(update={"group_size": group_size})
        scheme = type(scheme).model_validate(scheme.model_dump())
    qconfig = QuantizationConfig(config_groups={"group_0": scheme}, ignore=["lm_head"])

    # As llm-compressor: the model in its BF16 dtype.
    model = transformers.AutoModelForCausalLM.from_pretrained(MODELS / base, dtype=torch.bfloat16).eval()
    names = linear_names(base)
    modules = dict(model.named_modules())
    act = scheme.input_activations
    act_stats = None
    if act is not None and act.dynamic is not True:
        act_stats = ct_activation_stats(model, names, act)

    apply_quantization_config(model, qconfig)
    wargs = scheme.weights
    with torch.no_grad():
        # Weight statistics (memoryless min/max observer), with the global scale of a
        # TENSOR_GROUP scheme shared by each fusion group (q/k/v, gate/up) as llm-compressor does.
        wstats = {n: ct_minmax(ct_flatten_weight(modules[n].weight, wargs)) for n in names}
        gscale = {}
        if wargs.strategy == QuantizationStrategy.TENSOR_GROUP:
            for n in names:
                parent, leaf = n.rsplit(".", 1)
                group = next((g for g in FUSED if leaf in g), (leaf,))
                members = [f"{parent}.{m}" for m in group if f"{parent}.{m}" in wstats]
                gscale[n] = ct_global_scale([wstats[m] for m in members])
        for n in names:
            m = modules[n]
            g = gscale.get(n)
            scale, zp = calculate_qparams(*wstats[n], wargs, global_scale=g)
            m.weight_scale.copy_(scale)
            if hasattr(m, "weight_zero_point"):
                m.weight_zero_point.copy_(zp)
            if g is not None:
                m.weight_global_scale.copy_(g)
            if act_stats is not None:
                if act.strategy == QuantizationStrategy.TENSOR_GROUP:
                    m.input_global_scale.copy_(ct_global_scale([act_stats[n]]))
                else:
                    scale, zp = calculate_qparams(*act_stats[n], act)
                    m.input_scale.copy_(scale)
                    if hasattr(m, "input_zero_point"):
                        m.input_zero_point.copy_(zp)

    # llm-compressor's save_pretrained wrapper: compress in memory, save, write the config.
    compressor = ModelCompressor.from_pretrained_model(model, quantization_format=None)
    compressor.compress_model(model, skip_compressed=True)
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        compressor.update_config(tmp)
        qcfg = json.loads((Path(tmp) / "config.json").read_text())["quantization_config"]
        shutil.copy2(Path(tmp) / "model.safetensors", folder / "model.safetensors")
    write_config(folder, base, qcfg)
    check_unquantized_kept(folder, base)

    # Reference: the format's compressor's decompress() on the tensors read back from the file.
    saved = load_file(str(folder / "model.safetensors"))
    fmt = qcfg["format"]
    comp = BaseCompressor.get_value_from_registry(fmt)
    deq = {}
    for n in names:
        sd = {k[len(n) + 1:]: v for k, v in saved.items() if k.startswith(n + ".")}
        deq[n + ".weight"], native = ct_decompress(comp, fmt, sd, scheme)
        same_after_rounding(deq[n + ".weight"], native, n)
        assert torch.equal(ct_formula(sd, fmt, scheme), deq[n + ".weight"]), n
    save_dequantized(folder, deq)

    # Cross-check: transformers loads the folder with CompressedTensorsConfig(run_compressed=False).
    try:
        loaded = transformers.AutoModelForCausalLM.from_pretrained(
            folder, dtype=torch.float32,
            quantization_config=transformers.CompressedTensorsConfig(run_compressed=False))
        check_loaded(loaded, deq, case, "transformers CompressedTensorsConfig(run_compressed=False)")
    except AssertionError:
        raise
    except Exception as e:  # noqa: BLE001 - a cross-check only
        print(f"  {case}: transformers could not load the folder: {type(e).__name__}: {e}")
    return deq, ("compressed-tensors",)


def ct_decompress(comp, fmt, sd, scheme):
    """(float32 value, value of the compressor's decompress() in its native dtype).

    For the float-quantized and pack-quantized formats, decompress() computes in the dtype of
    `weight_scale` (`dequantize(..., dtype=scale.dtype)`): called with the stored BF16 scale it
    gives BF16; called with the scale converted to float32 (exact) it gives the float32 value.
    NVFP4's decompress() always unpacks to BF16 and returns BF16
    (`unpack_fp4_from_uint8(..., dtype=bfloat16)`), so its float32 value comes from the same two
    calls it makes, with dtype float32."""
    native = comp.decompress(dict(sd), scheme)["weight"]
    if fmt == "nvfp4-pack-quantized":
        from compressed_tensors.compressors.nvfp4.helpers import unpack_fp4_from_uint8
        from compressed_tensors.quantization.lifecycle.forward import dequantize
        packed = sd["weight_packed"]
        m, n = packed.shape
        unpacked = unpack_fp4_from_uint8(packed, m, n * 2, dtype=torch.float32)
        f32 = dequantize(x_q=unpacked, scale=sd["weight_scale"].to(torch.float32), args=scheme.weights,
                         global_scale=sd["weight_global_scale"], dtype=torch.float32)
    else:
        sd32 = dict(sd)
        sd32["weight_scale"] = sd["weight_scale"].to(torch.float32)
        f32 = comp.decompress(sd32, scheme)["weight"]
    assert f32.dtype == torch.float32
    return f32, native


def unpack_fields(words, bits, n):
    """Field k of a little-endian run of int32 words: bits [bits*k, bits*k + bits) of the run,
    i.e. (words[..., k // (32/bits)] >> (bits * (k % (32/bits)))) & mask for bits 4 and 8.
    Returns [..., n] int64 with the fields 0..n-1 of the last axis."""
    per = 32 // bits
    k = torch.arange(n)
    return (words[..., k // per].to(torch.int64) >> (bits * (k % per))) & ((1 << bits) - 1)


E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def ct_formula(sd, fmt, scheme):
    """The README's formulas, in plain torch, from a linear's stored tensors."""
    args = scheme.weights
    if fmt == "float-quantized":
        s = sd["weight_scale"].to(torch.float32)  # [out, 1] (channel) or [1] (tensor)
        return sd["weight"].to(torch.float32) * (s if s.ndim == 2 else s[0])
    if fmt == "pack-quantized":
        out_f, in_f = sd["weight_shape"].tolist()
        q = unpack_fields(sd["weight_packed"], args.num_bits, in_f) - 8  # [out, in], -8..7
        g = torch.arange(in_f) // args.group_size
        s = sd["weight_scale"].to(torch.float32)[:, g]
        if args.symmetric:
            return q.to(torch.float32) * s
        zp = sd["weight_zero_point"]  # [ceil(out/8), groups], packed along the rows
        z = unpack_fields(zp.T.contiguous(), args.num_bits, out_f).T - 8  # [out, groups]
        return (q - z[:, g]).to(torch.float32) * s
    if fmt == "nvfp4-pack-quantized":
        b = sd["weight_packed"].to(torch.int64)  # [out, in/2]
        nib = torch.stack((b & 15, b >> 4), dim=-1).flatten(-2)  # even column in the low nibble
        v = E2M1[nib & 7] * torch.where(nib >= 8, -1.0, 1.0)
        g = torch.arange(v.shape[1]) // args.group_size
        scale = sd["weight_scale"].to(torch.float32) / sd["weight_global_scale"].to(torch.float32)
        return v * scale[:, g]
    raise ValueError(fmt)


# ---------------------------------------------------------------------------------------------
# GPTQ (GPTQModel)


def make_gptq(out, case, base, bits, desc_act, sym, fmt):
    from gptqmodel import BACKEND, GPTQModel, QuantizeConfig

    folder = start_folder(out, case, base)
    torch.manual_seed(0)
    cfg = QuantizeConfig(bits=bits, group_size=32, desc_act=desc_act, sym=sym, format=fmt,
                         offload_to_disk=False)
    if desc_act:
        cfg.act_group_aware = False
    calib = [{"input_ids": row.tolist(), "attention_mask": [1] * len(row)} for row in calibration_ids()]
    with tempfile.TemporaryDirectory() as tmp:
        model = GPTQModel.load(str(MODELS / base), cfg, device="cpu")
        model.quantize(calib, batch_size=1)
        model.save(tmp)
        del model
        qcfg = json.loads((Path(tmp) / "config.json").read_text())["quantization_config"]
        shutil.copy2(Path(tmp) / "model.safetensors", folder / "model.safetensors")
        shutil.copy2(Path(tmp) / "quantize_config.json", folder / "quantize_config.json")
    write_config(folder, base, qcfg)
    check_unquantized_kept(folder, base)

    # Reference: GPTQModel loads the folder (torch kernel; a v1 checkpoint's qzeros are converted
    # to its internal v2 by convert_gptq_v1_to_v2_format) and TorchQuantLinear.dequantize_weight()
    # gives W^T [in, out]. It computes in the dtype of `scales` (float16); with the scales
    # converted to float32 (exact) it gives the float32 value.
    # (dtype float16: loaded as the folder's BF16 config says, GPTQModel would cast the float16
    # scales to BF16.)
    loaded = GPTQModel.load(str(folder), device="cpu", backend=BACKEND.GPTQ_TORCH, dtype=torch.float16)
    deq = {}
    for n, m in loaded.model.named_modules():
        if n.split(".")[-1] not in LINEARS:
            continue
        native = m.dequantize_weight().T.contiguous()
        scales = m.scales
        m.scales = scales.to(torch.float32)
        f32 = m.dequantize_weight().T.contiguous()
        m.scales = scales
        assert native.dtype == torch.float16 and f32.dtype == torch.float32
        same_after_rounding(f32, native, n)
        deq[n + ".weight"] = f32
    assert sorted(deq) == sorted(n + ".weight" for n in linear_names(base)), sorted(deq)
    del loaded

    # Check the stored layout against the formulas of the README (and the v1 zero caveat).
    saved = load_file(str(folder / "model.safetensors"))
    v1 = qcfg["checkpoint_format"] == "gptq"
    for n in linear_names(base):
        w = gptq_formula(saved, n, bits, v1)
        assert torch.equal(w, deq[n + ".weight"]), n
        g_idx = saved[n + ".g_idx"]
        if qcfg["desc_act"]:
            # act-order: each group still has 32 inputs, but not consecutive ones.
            assert not torch.equal(g_idx, g_idx.sort().values), n
            assert torch.equal(torch.bincount(g_idx), torch.full((w.shape[1] // 32,), 32)), n
        else:
            assert torch.equal(g_idx, torch.arange(w.shape[1], dtype=torch.int32) // 32), n
    save_dequantized(folder, deq)
    return deq, ("gptqmodel",)


def gptq_formula(saved, n, bits, v1):
    """The README's formula, in plain torch: w[o, i] = (q[i, o] - z[g, o]) * scales[g, o]."""
    qw, qz, sc, gi = (saved[f"{n}.{t}"] for t in ("qweight", "qzeros", "scales", "g_idx"))
    per = 32 // bits
    mask = (1 << bits) - 1
    i = torch.arange(qw.shape[0] * per)
    q = (qw[i // per, :].to(torch.int64) >> (bits * (i % per))[:, None]) & mask  # [in, out]
    o = torch.arange(sc.shape[1])
    z = (qz[:, o // per].to(torch.int64) >> (bits * (o % per))[None, :]) & mask  # [groups, out]
    if v1:
        # v1 stores zero - 1 per field; a stored field of 15 (zero 0 would have been -1) never
        # occurs in these fixtures, so the per-field +1 equals GPTQModel's whole-word addition.
        assert int((z == mask).sum()) == 0, f"{n}: a v1 zero field of {mask} (zero 0): borrow"
        z = z + 1
    g = gi.to(torch.int64)
    w = (q - z[g, :]).to(torch.float32) * sc.to(torch.float32)[g, :]
    return w.T.contiguous()


# ---------------------------------------------------------------------------------------------
# AWQ (AutoAWQ's GEMM packing)


def make_awq(out, case, base):
    from awq.modules.linear.gemm import WQLinear_GEMM
    from awq.quantize.quantizer import AwqQuantizer
    from awq.utils.packing_utils import dequantize_gemm

    folder = start_folder(out, case, base)
    w_bit, group = 4, 32
    model = transformers.AutoModelForCausalLM.from_pretrained(MODELS / base, dtype=torch.bfloat16).eval()
    # AutoAWQ's quantizer without its scale/clip search: round-to-nearest with zero point is the
    # last step of its algorithm (AwqQuantizer._apply_quant -> pseudo_quantize_tensor ->
    # WQLinear_GEMM.from_linear), run here on the unscaled weights.
    quantizer = AwqQuantizer.__new__(AwqQuantizer)
    quantizer.w_bit, quantizer.group_size, quantizer.zero_point, quantizer.version = w_bit, group, True, "gemm"
    quantizer.modules_to_not_convert = []
    layers = model.model.layers
    with torch.no_grad():
        for layer in layers:
            named = {n: m for n, m in layer.named_modules() if n.split(".")[-1] in LINEARS}
            quantizer._apply_quant(layer, named)
    tensors = {k: v for k, v in base_tensors(base).items() if not is_linear(k)}
    deq = {}
    for i, layer in enumerate(layers):
        for n, m in layer.named_modules():
            if not isinstance(m, WQLinear_GEMM):
                continue
            name = f"model.layers.{i}.{n}"
            for t in ("qweight", "qzeros", "scales"):
                tensors[f"{name}.{t}"] = getattr(m, t).contiguous()
            assert m.qweight.dtype == torch.int32 and m.scales.dtype == torch.float16
            native = dequantize_gemm(m.qweight, m.qzeros, m.scales, w_bit, group).T.contiguous()
            f32 = dequantize_gemm(m.qweight, m.qzeros, m.scales.to(torch.float32), w_bit, group).T.contiguous()
            same_after_rounding(f32, native, name)
            deq[name + ".weight"] = f32
    assert sorted(deq) == sorted(n + ".weight" for n in linear_names(base))
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    # AutoAWQ's AwqConfig.to_transformers_dict(), as its save_quantized writes it.
    write_config(folder, base, {"quant_method": "awq", "zero_point": True, "group_size": group, "bits": w_bit,
                                "version": "gemm", "modules_to_not_convert": None})
    check_unquantized_kept(folder, base)
    saved = load_file(str(folder / "model.safetensors"))
    for name in deq:
        n = name[: -len(".weight")]
        assert torch.equal(awq_formula(saved, n, group), deq[name]), n
    save_dequantized(folder, deq)

    # Cross-check: transformers loads the folder (through GPTQModel's AWQ kernels, float16) and
    # each quantized linear applied to the identity gives W^T up to float16 rounding.
    try:
        loaded = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float16, device_map="cpu")
        mods = dict(loaded.named_modules())
        worst = 0.0
        with torch.no_grad():
            for name, w in deq.items():
                m = mods[name[: -len(".weight")]]
                eye = torch.eye(w.shape[1], dtype=torch.float16)[None]
                got = m(eye)[0].float().T
                worst = max(worst, float(((got - w).abs() / w.abs().max()).max()))
        print(f"  {case}: transformers ({type(m).__name__}) loads the folder; linear(identity) vs "
              f"dequantized.safetensors: max |diff| / max |w| {worst:.2g}")
        assert worst < 2e-3
    except AssertionError:
        raise
    except Exception as e:  # noqa: BLE001 - a cross-check only
        print(f"  {case}: transformers could not load the folder: {type(e).__name__}: {e}")
    return deq, ("autoawq",)


AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]


def awq_formula(saved, n, group):
    """The README's formula: field j of word qweight[i, c] holds column 8c + AWQ_ORDER[j]."""
    qw, qz, sc = (saved[f"{n}.{t}"].to(torch.int64) if t != "scales" else saved[f"{n}.{t}"]
                  for t in ("qweight", "qzeros", "scales"))
    inv = [AWQ_ORDER.index(k) for k in range(8)]  # column 8c + k sits in field inv[k]
    o = torch.arange(sc.shape[1])
    shift = torch.tensor([4 * inv[k] for k in range(8)])[o % 8]
    q = (qw[:, o // 8] >> shift[None, :]) & 15  # [in, out]
    z = (qz[:, o // 8] >> shift[None, :]) & 15  # [groups, out]
    g = torch.arange(qw.shape[0]) // group
    w = (q - z[g, :]).to(torch.float32) * sc.to(torch.float32)[g, :]
    return w.T.contiguous()


# ---------------------------------------------------------------------------------------------


def make(out, case):
    base = CASES[case]
    print(f"{case} (from {base})")
    if case == "fp8-block":
        deq, packages = make_fp8_block(out, case, base)
    elif case == "ct-fp8-channel":
        deq, packages = make_ct(out, case, base, "FP8_DYNAMIC")
    elif case == "ct-fp8-tensor":
        deq, packages = make_ct(out, case, base, "FP8")
    elif case == "ct-nvfp4":
        deq, packages = make_ct(out, case, base, "NVFP4")
    elif case == "ct-w4a16":
        deq, packages = make_ct(out, case, base, "W4A16", group_size=32)
    elif case == "ct-w4a16-asym":
        deq, packages = make_ct(out, case, base, "W4A16_ASYM", group_size=32)
    elif case == "gptq":
        deq, packages = make_gptq(out, case, base, bits=4, desc_act=True, sym=False, fmt="gptq")
    elif case == "gptq-8bit":
        deq, packages = make_gptq(out, case, base, bits=8, desc_act=False, sym=True, fmt="gptq_v2")
    elif case == "awq":
        deq, packages = make_awq(out, case, base)
    else:
        raise KeyError(case)
    return twin_reference(out / case, case, base, deq, packages)


def main():
    out = Path(sys.argv[1])
    only = sys.argv[2:]
    torch.set_num_threads(2)
    out.mkdir(parents=True, exist_ok=True)
    diffs = {}
    for case in CASES:
        if only and case not in only:
            continue
        diffs[case] = make(out, case)
    print("max |logit difference| dequantized twin vs base:")
    for case, d in diffs.items():
        print(f"  {case:16s} {d:.4f}")


if __name__ == "__main__":
    main()
