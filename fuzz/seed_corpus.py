#!/usr/bin/env python3
"""Writes the seed corpus of the fuzz targets into corpus/<target>/ (run from any folder).

Seeds come from the golden fixtures in tests/fixtures (small files, or subsets of their entries)
and from hand-made files that follow the hostile corpus of tests/it/hostile.rs: damaged
SafeTensors headers, other formats, broken shard indexes and configurations, and pickles past
the limits of the PyTorch reader. Standard library
only; the output is deterministic, so running it again changes nothing.
"""

import json
import shutil
import struct
from pathlib import Path

FUZZ = Path(__file__).resolve().parent
FIXTURES = FUZZ.parent / "tests" / "fixtures"
CORPUS = FUZZ / "corpus"


# ----------------------------------------------------------------------------------------------
# SafeTensors files.


def with_length(declared, header, data=b""):
    """A file whose 8-byte length prefix says `declared`, whatever follows."""
    return struct.pack("<Q", declared) + header + data


def file(header, data=b""):
    header = header.encode() if isinstance(header, str) else header
    return with_length(len(header), header, data)


def entry(dtype, shape, begin, end):
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


def build(entries, metadata=None, align=8):
    """A valid file of (name, dtype, shape, bytes), back to back in order."""
    header, data = {}, b""
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dtype, shape, raw in entries:
        header[name] = entry(dtype, shape, len(data), len(data) + len(raw))
        data += raw
    text = json.dumps(header, separators=(",", ":"))
    text += " " * (-len(text) % align)
    return file(text, data)


def read(path):
    """(metadata, [(name, dtype, shape, bytes)]) of a SafeTensors file, in offset order."""
    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + length])
    metadata = header.pop("__metadata__", None)
    data = raw[8 + length :]
    entries = sorted(header.items(), key=lambda item: item[1]["data_offsets"][0])
    return metadata, [
        (name, e["dtype"], e["shape"], data[e["data_offsets"][0] : e["data_offsets"][1]]) for name, e in entries
    ]


def subset(path, keep, metadata=None):
    """The entries of a fixture whose names `keep` accepts, as a new valid file."""
    found, entries = read(path)
    return build([e for e in entries if keep(e[0])], metadata if metadata is not None else found)


def one_of_each_dtype():
    sizes = {
        "BOOL": (1, [2], b"\x01\x00"),
        "U8": (1, [3], b"\x01\x02\x03"),
        "I8": (1, [2], b"\xff\x01"),
        "F8_E5M2": (1, [2], b"\x3c\xbc"),
        "F8_E4M3": (1, [2], b"\x38\xb8"),
        "F8_E8M0": (1, [2], b"\x7f\x80"),
        "F8_E4M3FNUZ": (1, [2], b"\x40\x80"),
        "F8_E5M2FNUZ": (1, [2], b"\x40\x80"),
        "I16": (2, [2], struct.pack("<hh", -1, 2)),
        "U16": (2, [2], struct.pack("<HH", 1, 65535)),
        "F16": (2, [2], struct.pack("<e", 1.5) + struct.pack("<e", -2.0)),
        "BF16": (2, [2, 1], b"\x80\x3f\x00\xc0"),
        "I32": (4, [1], struct.pack("<i", -7)),
        "U32": (4, [2], struct.pack("<II", 1, 2)),
        "F32": (4, [2, 2], struct.pack("<4f", 1, 2, 3, 4)),
        "C64": (4, [1], struct.pack("<2f", 1, -1)),
        "F64": (8, [1], struct.pack("<d", 3.25)),
        "I64": (8, [1], struct.pack("<q", -5)),
        "U64": (8, [1], struct.pack("<Q", 5)),
        "F4": (1, [4], b"\x12\x34"),
        "F6_E2M3": (1, [4], b"\x01\x02\x03"),
        "F6_E3M2": (1, [4], b"\x04\x05\x06"),
    }
    # Largest alignment first, so every entry is aligned for its dtype.
    ordered = sorted(sizes.items(), key=lambda item: -item[1][0])
    return build([(dtype.lower(), dtype, shape, raw) for dtype, (_, shape, raw) in ordered], {"format": "pt"})


def zip_of(members):
    """A minimal zip: local file headers, then central directory records and their end."""
    out = b""
    for member in members:
        out += b"PK\x03\x04\x14\x00\x00\x00\x00\x00" + bytes(16) + struct.pack("<H", len(member)) + b"\x00\x00"
        out += member.encode() + b"\x80\x02."
    for member in members:
        out += b"PK\x01\x02" + bytes(42) + member.encode()
    return out + b"PK\x05\x06" + bytes(18)


def hostile_headers():
    w = entry("F32", [2], 0, 8)
    eight = bytes(8)
    dumps = lambda value: json.dumps(value, separators=(",", ":"))  # noqa: E731
    seeds = {
        "empty": b"",
        "seven-bytes": bytes([7, 0, 0, 0, 0, 0, 0]),
        "length-past-end": with_length(1000, b"{}"),
        "length-over-limit": with_length(200_000_000, b"{}"),
        "length-u64-max": with_length(2**64 - 1, b"{}"),
        "header-not-utf8": with_length(6, b'{"a\xff":'),
        "header-not-json": file("hello!!!"),
        "header-empty": file(""),
        "header-array": file("[]      "),
        "header-string": file('"weights"'),
        "trailing-garbage": file(dumps({"w": w}) + " garbage", eight),
        "second-object": file(dumps({"w": w}) + "{}", eight),
        "duplicate-name": file('{"w":%s,"w":%s}' % (dumps(w), dumps(w)), eight),
        "duplicate-metadata": file('{"__metadata__":{"a":"1"},"w":%s,"__metadata__":{"a":"2"}}' % dumps(w), eight),
        "empty-name": file(dumps({"": w}), eight),
        "missing-dtype": file('{"w":{"shape":[2],"data_offsets":[0,8]}}', eight),
        "missing-shape": file('{"w":{"dtype":"F32","data_offsets":[0,8]}}', eight),
        "missing-offsets": file('{"w":{"dtype":"F32","shape":[2]}}', eight),
        "entry-not-object": file('{"w":[1,2,3]}'),
        "negative-dimension": file('{"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}}', eight),
        "float-offsets": file('{"w":{"dtype":"F32","shape":[2],"data_offsets":[0.0,8.0]}}', eight),
        "three-offsets": file('{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8,8]}}', eight),
        "unknown-dtype": file(dumps({"w": entry("F128", [2], 0, 32)}), bytes(32)),
        "metadata-array": file(dumps({"__metadata__": ["a"], "w": w}), eight),
        "metadata-number": file(dumps({"__metadata__": {"layers": 12}, "w": w}), eight),
        "count-overflow": file(dumps({"w": entry("U8", [2**32, 2**32], 0, 8)}), eight),
        "bytes-overflow": file(dumps({"w": entry("F64", [2**61], 0, 8)}), eight),
        "huge-zero-size": file(dumps({"w": entry("F32", [0, 2**63], 0, 0)})),
        "scalar": file(dumps({"w": entry("F32", [], 0, 4)}), bytes(4)),
        "offsets-reversed": file(dumps({"w": entry("F32", [0], 8, 0)}), eight),
        "span-too-small": file(dumps({"w": entry("F32", [2], 0, 4)}), bytes(4)),
        "span-too-large": file(dumps({"w": entry("F32", [2], 0, 12)}), bytes(12)),
        "hole": file(dumps({"a": entry("F32", [1], 0, 4), "b": entry("F32", [1], 8, 12)}), bytes(12)),
        "overlap": file(dumps({"a": entry("F32", [2], 0, 8), "b": entry("F32", [2], 4, 12)}), bytes(12)),
        "same-bytes": file(dumps({"a": w, "b": w}), eight),
        "truncated-data": file(dumps({"w": w}), bytes(5)),
        "trailing-data": file(dumps({"w": w}), bytes(12)),
        "f4-odd": file(dumps({"w": entry("F4", [3], 0, 2)}), bytes(2)),
        "f6-partial": file(dumps({"w": entry("F6_E2M3", [2], 0, 2)}), bytes(2)),
        "bool-two": file(dumps({"flags": entry("BOOL", [4], 0, 4)}), bytes([0, 1, 2, 0])),
        "unaligned-f32": file(dumps({"b": entry("U8", [1], 0, 1), "w": entry("F32", [2], 1, 9)}), bytes(9)),
        "unaligned-f64-header": build([("w", "F64", [2], struct.pack("<2d", 1, 2))], align=1),
        "zero-size-inside": file(dumps({"a": entry("F32", [2], 0, 8), "e": entry("F32", [0], 4, 4)}), eight),
        "every-dtype": one_of_each_dtype(),
        "pytorch-zip": zip_of(["archive/version", "archive/data.pkl", "archive/data/0"]),
        "pickle": b"\x80\x02\x8a\x0al\xfc\x9cF\xf9 j\xa8P\x19.\x80\x02M\xe9\x03.",
        "gguf": b"GGUF\x03\x00\x00\x00" + bytes(24),
        "npy": b"\x93NUMPY\x01\x00v\x00{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }",
        "npz": zip_of(["arr_0.npy", "arr_1.npy"]),
        "hdf5": b"\x89HDF\r\n\x1a\n" + bytes(40),
        "lfs-pointer": b"version https://git-lfs.github.com/spec/v1\noid sha256:4d7a\nsize 548105171\n",
        "html": b"<!DOCTYPE html>\n<html><body>404 Not Found</body></html>\n",
    }
    padded = json.dumps({"w": w}, separators=(",", ":"))
    seeds["pickle-like-length"] = file(padded + " " * (0x280 - len(padded)), bytes(4))
    return seeds


# ----------------------------------------------------------------------------------------------
# Targets.


def header_seeds():
    seeds = {f"hostile-{name}": raw for name, raw in hostile_headers().items()}
    for fixture in [
        "seedlm/seed4_1x4x64.safetensors",
        "seedlm/seed4p4_1x4x64.safetensors",
        "seedlm/seed4p4_mixed_2x8x128.safetensors",
    ]:
        seeds["fixture-" + fixture.replace("/", "-")] = (FIXTURES / fixture).read_bytes()
    # A BF16 checkpoint written by transformers, without its large matrices.
    seeds["fixture-llama-tiny-norms"] = subset(FIXTURES / "llama-tiny/model.safetensors", lambda name: "norm" in name)
    # MLX's writer does not pad its header; one weight's streams keep the seed small.
    seeds["fixture-mlx-affine_bf16-q4g64"] = subset(
        FIXTURES / "mlx/affine_bf16.safetensors", lambda name: name.startswith("q4g64.")
    )
    return seeds


SHARD_1 = "model-00001-of-00002.safetensors"
SHARD_2 = "model-00002-of-00002.safetensors"


def index_seeds():
    both = {
        "embed.weight": SHARD_1,
        "layers.0.weight": SHARD_1,
        "layers.1.weight": SHARD_2,
        "head.mask": SHARD_2,
        "head.ids": SHARD_2,
    }
    dumps = lambda value: json.dumps(value, indent=2)  # noqa: E731
    return {
        "fixture-seedlm-shard-index": (FIXTURES / "seedlm/shard/model.safetensors.index.json").read_bytes(),
        "valid": dumps({"metadata": {"total_size": 60}, "weight_map": both}).encode(),
        "valid-metadata": dumps({"metadata": {"format": "pt", "layers": 2}, "weight_map": both}).encode(),
        "one-shard": dumps({"weight_map": {"embed.weight": SHARD_1}}).encode(),
        "not-json": b"weight_map",
        "array": b"[]",
        "no-weight-map": b'{"metadata": {}}',
        "weight-map-array": b'{"weight_map": ["embed.weight"]}',
        "weight-map-number": b'{"weight_map": {"embed.weight": 1}}',
        "metadata-string": b'{"metadata": "x", "weight_map": {}}',
        "name-twice": ('{"weight_map": {"embed.weight": "%s", "embed.weight": "%s"}}' % (SHARD_1, SHARD_2)).encode(),
        "two-weight-maps": ('{"weight_map": {}, "weight_map": {"head.ids": "%s"}}' % SHARD_2).encode(),
        "shard-with-slash": b'{"weight_map": {"embed.weight": "../model-00001-of-00002.safetensors"}}',
        "shard-dotdot": b'{"weight_map": {"embed.weight": ".."}}',
        "shard-empty": b'{"weight_map": {"embed.weight": ""}}',
        "missing-shard": b'{"weight_map": {"embed.weight": "model-00003-of-00003.safetensors"}}',
        "wrong-shard": dumps({"weight_map": {"embed.weight": SHARD_2, "head.ids": SHARD_1}}).encode(),
        "entry-not-in-shard": dumps({"weight_map": {"lm_head.weight": SHARD_1}}).encode(),
        "index-as-shard": dumps({"weight_map": {"embed.weight": "model.safetensors.index.json"}}).encode(),
    }


def quantized_input(config, model):
    config = json.dumps(config).encode() if config is not None else b""
    return struct.pack("<H", len(config)) + config + model


def quantized_seeds():
    mlx = FIXTURES / "mlx/affine_bf16.safetensors"
    q4g64 = subset(mlx, lambda name: name.startswith("q4g64.") and not name.endswith(".dequantized"))
    q3g32 = subset(FIXTURES / "mlx/affine_f16.safetensors", lambda name: name.startswith("q3g32.") and not name.endswith(".dequantized"))
    q8g128 = subset(FIXTURES / "mlx/affine_f32.safetensors", lambda name: name.startswith("q8g128.") and not name.endswith(".dequantized"))
    seeds = {
        "mlx-q4g64-config": quantized_input({"quantization": {"group_size": 64, "bits": 4, "mode": "affine"}}, q4g64),
        "mlx-q4g64-inferred": quantized_input(None, q4g64),
        "mlx-q3g32-override": quantized_input(
            {"quantization_config": {"group_size": 64, "bits": 4, "q3g32": {"group_size": 32, "bits": 3}}}, q3g32
        ),
        "mlx-q8g128-wrong-spec": quantized_input({"quantization": {"group_size": 32, "bits": 2}}, q8g128),
        "mlx-q4g64-metadata": quantized_input(
            None, subset(mlx, lambda name: name.startswith("q4g64.") and not name.endswith(".dequantized"),
                         {"format": "mlx", "quantization": json.dumps({"group_size": 64, "bits": 4})})
        ),
        "float-weight": quantized_input(
            {"model_type": "llama"}, build([("proj.weight", "F32", [2, 2], struct.pack("<4f", 1, 2, 3, 4))])
        ),
        "unknown-encoding": quantized_input(
            None, build([("proj.weight", "U32", [2, 1], bytes(8)), ("proj.scales", "F16", [2, 1], bytes(4))])
        ),
        "bad-mode": quantized_input({"quantization": {"group_size": 64, "bits": 4, "mode": "mxfp4"}}, q4g64),
        "config-not-json": struct.pack("<H", 5) + b"{bits" + q4g64,
    }
    for fixture in ["seed4_1x4x64", "seed4p4_1x4x64", "seed4_mixed_2x8x128"]:
        model = subset(FIXTURES / f"seedlm/{fixture}.safetensors", lambda name: not name.endswith((".source", ".decoded")))
        seeds[f"seedlm-{fixture}"] = quantized_input(None, model)
    return seeds


def config_seeds():
    seeds = {
        "fixture-gpt2-tiny": (FIXTURES / "gpt2-tiny/config.json").read_bytes(),
        "fixture-llama-tiny": (FIXTURES / "llama-tiny/config.json").read_bytes(),
        "fixture-gpt2-tiny-generation": (FIXTURES / "gpt2-tiny/generation_config.json").read_bytes(),
    }
    bert = {
        "vocab_size": 64, "hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 4,
        "intermediate_size": 32, "max_position_embeddings": 32, "type_vocab_size": 2, "layer_norm_eps": 1e-12,
    }
    handmade = {
        "bert": bert,
        "bert-defaults": {key: value for key, value in bert.items() if key not in ("type_vocab_size", "layer_norm_eps")},
        "gpt2-minimal": {"vocab_size": 8, "n_positions": 4, "n_embd": 4, "n_layer": 1, "n_head": 1},
        "gpt2-inner": {"vocab_size": 8, "n_positions": 4, "n_embd": 4, "n_layer": 1, "n_head": 2, "n_inner": 12},
        "llama-gqa": {
            "vocab_size": 16, "hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 1,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 2, "rope_parameters": {"rope_theta": 5e5},
        },
        "llama-tied": {
            "vocab_size": 16, "hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 2,
            "num_attention_heads": 2, "tie_word_embeddings": True, "rope_theta": 10000.0,
        },
        "quantization": {"quantization": {"group_size": 64, "bits": 4, "mode": "affine", "lm_head": False,
                                          "model.layers.0.mlp.down_proj": {"group_size": 32, "bits": 8}}},
        "quantization-config": {"quantization_config": {"group_size": 128, "bits": 2}},
        "quantization-missing-bits": {"quantization": {"group_size": 64}},
        "quantization-not-object": {"quantization": 4},
        "zero-heads": {"vocab_size": 8, "n_positions": 4, "n_embd": 4, "n_layer": 1, "n_head": 0},
        "wrong-types": {"vocab_size": "8", "n_positions": -4, "n_embd": 4.5},
        # Sizes whose products overflow: the MLP width `4 * n_embd`, the query width
        # `num_attention_heads * head_dim`.
        "gpt2-inner-overflow": {"vocab_size": 8, "n_positions": 4, "n_embd": 2**62, "n_layer": 1, "n_head": 1},
        "llama-width-overflow": {
            "vocab_size": 8, "hidden_size": 8, "intermediate_size": 8, "num_hidden_layers": 1,
            "num_attention_heads": 2**62, "head_dim": 8,
        },
    }
    seeds.update({name: json.dumps(value, indent=2).encode() for name, value in handmade.items()})
    seeds["not-json"] = b"{vocab_size: 8"
    seeds["empty"] = b""
    return seeds


# ----------------------------------------------------------------------------------------------
# PyTorch checkpoints.


def dcp_seeds():
    """`.metadata` pickles: torch's (the fixture), nnx's own writer's, and the planted global."""
    seeds = {}
    for folder in ["sharded", "nnx-written", "hostile", "safetensors-format"]:
        seeds["fixture-" + folder] = (FIXTURES / "dcp" / folder / ".metadata").read_bytes()
    return seeds


def torch_seeds():
    seeds = {}
    for fixture in ["state_zip.pt", "state_legacy.pt", "nested_zip.pt", "malicious.pkl", "malicious_zip.pt"]:
        seeds["fixture-" + fixture] = (FIXTURES / "torch" / fixture).read_bytes()
    # Bare pickles: a dict of plain values, nesting and memo limits, an unknown global.
    seeds["pickle-plain-dict"] = b"\x80\x02}(X\x01\x00\x00\x00aK\x01X\x01\x00\x00\x00bG?\xf0\x00\x00\x00\x00\x00\x00u."
    seeds["pickle-deep-marks"] = b"\x80\x02" + b"(" * 100
    seeds["pickle-deep-tuples"] = b"\x80\x02N" + b"\x85" * 100 + b"."
    seeds["pickle-huge-memo"] = b"\x80\x02}r\xff\xff\xff\x7f."
    seeds["pickle-builtins-eval"] = b"\x80\x02cbuiltins\neval\nX\x01\x00\x00\x001\x85R."
    seeds["pickle-inline-storage"] = pickled_state_dict()
    return seeds


def unicode(text):
    raw = text.encode()
    return b"X" + struct.pack("<I", len(raw)) + raw


def pickled_state_dict():
    """What `pickle.dump(state_dict, f, protocol=2)` writes: each storage is
    `_load_from_bytes(_codecs.encode(text, 'latin1'))` around a legacy checkpoint of the storage."""
    values = [1.5, -2.0, 3.25]
    blob = LEGACY_MAGIC + b"\x80\x02M\xe9\x03.\x80\x02}.\x80\x02("
    blob += unicode("storage") + b"ctorch\nFloatStorage\n" + unicode("0") + unicode("cpu")
    blob += b"K" + bytes([len(values)]) + b"NtQ.\x80\x02](" + unicode("0") + b"e."
    blob += struct.pack("<Q", len(values)) + struct.pack(f"<{len(values)}f", *values)
    rebuild = b"ctorch._utils\n_rebuild_tensor_v2\n("
    hooks = b"\x89ccollections\nOrderedDict\n)RtR"
    raw = b"\x80\x02}" + unicode("w") + rebuild
    raw += b"ctorch.storage\n_load_from_bytes\n(c_codecs\nencode\n("
    raw += unicode(blob.decode("latin1")) + unicode("latin1")
    raw += b"tRtRq\x00K\x00K\x03\x85K\x01\x85" + hooks + b"s" + unicode("v") + rebuild
    raw += b"h\x00K\x01K\x02\x85K\x01\x85" + hooks + b"s."
    return raw


# ----------------------------------------------------------------------------------------------
# GGUF files.


def gguf_string(text):
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw


def gguf(kvs, infos, data, version=3):
    """A GGUF file of raw metadata entries and tensor infos, data padded to 32 bytes."""
    head = b"GGUF" + struct.pack("<IQQ", version, len(infos), len(kvs)) + b"".join(kvs) + b"".join(infos)
    head += b"\0" * (-len(head) % 32)
    return head + data


def gguf_info(name, ne, ty, offset):
    return gguf_string(name) + struct.pack("<I", len(ne)) + struct.pack(f"<{len(ne)}Q", *ne) + struct.pack("<IQ", ty, offset)


def gguf_seeds():
    u32 = lambda key, value: gguf_string(key) + struct.pack("<II", 4, value)
    q8 = struct.pack("<e", 0.5) + bytes(range(32))
    seeds = {
        "every-type.gguf": (FIXTURES / "gguf" / "types" / "all.gguf").read_bytes(),
        "f32.gguf": gguf([u32("general.alignment", 32)], [gguf_info("w", [4], 0, 0)], struct.pack("<4f", 1, 2, 3, 4)),
        "q8_0.gguf": gguf([], [gguf_info("w", [32, 2], 8, 0)], q8 * 2),
        "nested.gguf": gguf([gguf_string("a") + struct.pack("<IIQ", 9, 9, 1) + struct.pack("<IQ", 8, 1) + gguf_string("x")], [], b""),
        "gap.gguf": gguf([], [gguf_info("a", [4], 0, 0), gguf_info("b", [4], 0, 64)], b"\0" * 96),
        "v2.gguf": gguf([], [gguf_info("w", [4], 1, 0)], b"\0" * 8, version=2),
    }
    return seeds


# ----------------------------------------------------------------------------------------------
# GGUF tokenizer metadata, in the layout of fuzz_targets/gguf_tokenizer.rs: a flags byte (1:
# llama, 2: scores, 4: types, 8: merges, 16: add BOS, 32: space prefix), a pre-tokenizer byte,
# then NUL-separated tokens, merges, per-token type bytes and the text.


def tokenizer_seed(flags, pre, tokens, merges, kinds, text):
    sections = ["\n".join(tokens).encode(), "\n".join(merges).encode(), bytes(kinds), text.encode()]
    return bytes([flags, pre]) + b"\0".join(sections)


def gguf_tokenizer_seeds():
    spm = ["<unk>", "<s>", "</s>", "<0x41>", "<0xZZ>", "\u2581", "a", "b", "ab", "\u2581a", "\u2581ab", "ba"]
    spm_kinds = [2, 3, 3, 6, 6, 1, 1, 1, 1, 1, 1, 1]
    bpe = ["a", "b", "ab", "\u0120", "\u0120a", "<|endoftext|>", "c"]
    bpe_merges = ["a b", "\u0120 a", "ab", "x y"]
    bpe_kinds = [1, 1, 1, 1, 1, 3, 4]
    return {
        "spm.bin": tokenizer_seed(1 | 2 | 4 | 16 | 32, 0, spm, [], spm_kinds, "ab ba A<s>\u00e9"),
        "spm-runs.bin": tokenizer_seed(1 | 2, 0, ["a" * n for n in range(1, 9)], [], [], "aaaaaaaaaaa"),
        "bpe.bin": tokenizer_seed(4 | 8, 1, bpe, bpe_merges, bpe_kinds, "ab a<|endoftext|>c b"),
        "bpe-llama3.bin": tokenizer_seed(4 | 8 | 16, 2, bpe, bpe_merges, bpe_kinds, "ab 1234 ab"),
        "duplicate.bin": tokenizer_seed(8, 1, ["a", "b", "a"], ["a b"], [], "ab"),
        "short-scores.bin": tokenizer_seed(1 | 2 | 4, 0, spm, [], [201], "ab"),
    }


def chat_template_seeds():
    """The published templates of the fixtures, and small hostile ones after
    tests/it/hostile_templates.rs (deep nesting kept to a few KB)."""
    seeds = {f"{path.stem}.jinja": path.read_bytes() for path in sorted((FIXTURES / "chat").glob("*.jinja"))}
    doubled = (
        "{% set ns = namespace(a=[1], b=[1]) %}{% for i in range(48) %}{% set ns.a = [ns.a, ns.a] %}"
        "{% set ns.b = [ns.b, ns.b] %}{% endfor %}"
    )
    hostile = {
        "repeat.jinja": "{{ 'x' * 20000000 }}",
        "repeat-huge.jinja": "{{ 'x' * 10**12 }}",
        "doubled-tojson.jinja": doubled + "{{ ns.a|tojson }}",
        "doubled-print.jinja": doubled + "{{ ns.a }}",
        "doubled-join.jinja": doubled + "{{ ns.a|join }}",
        "doubled-sort.jinja": doubled + "{{ [ns.a, ns.b]|sort|length }}",
        "deep-list.jinja": "{{ " + "[" * 3000 + "]" * 3000 + " }}",
        "deep-minus.jinja": "{{ " + "-" * 3000 + "1 }}",
        "deep-if.jinja": "{% if true %}" * 200 + "{% endif %}" * 200,
        "deep-value.jinja": "{% set ns = namespace(a=1) %}{% for i in range(2000) %}{% set ns.a = "
        + "[" * 70 + "ns.a" + "]" * 70 + " %}{% endfor %}{{ ns.a }}",
        "range.jinja": "{% for i in range(10**9) %}{% endfor %}",
        "recursive.jinja": "{% for x in [[1]] recursive %}{{ loop([x]) }}{% endfor %}",
        "macro.jinja": "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
        "format.jinja": "{{ '%999999999d'|format(1) }}{{ '{:>999999999}'.format(1) }}",
        "indent.jinja": "{{ 'a\nb'|indent(10**9) }}",
        "replace.jinja": "{{ ('x' * 10000).replace('x', 'x' * 1000000) }}",
        "raise.jinja": "{{ raise_exception('no ' ~ messages[0].role) }}",
        "raw.jinja": "{% raw %}{{ not closed {% endraw %}{{ messages|length }}",
    }
    seeds.update({name: text.encode() for name, text in hostile.items()})
    return seeds


LEGACY_MAGIC = b"\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19\x2e"


def main():
    targets = {
        "header": header_seeds(),
        "index": index_seeds(),
        "quantized": quantized_seeds(),
        "config": config_seeds(),
        "torch": torch_seeds(),
        "dcp": dcp_seeds(),
        "gguf": gguf_seeds(),
        "chat_template": chat_template_seeds(),
        "gguf_tokenizer": gguf_tokenizer_seeds(),
    }
    for target, seeds in targets.items():
        folder = CORPUS / target
        if folder.exists():
            shutil.rmtree(folder)
        folder.mkdir(parents=True)
        for name, raw in seeds.items():
            (folder / name).write_bytes(raw)
    total = sum(path.stat().st_size for path in CORPUS.rglob("*") if path.is_file())
    print(f"{sum(map(len, targets.values()))} seeds, {total} bytes, in {CORPUS}")


if __name__ == "__main__":
    main()
