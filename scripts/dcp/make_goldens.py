#!/usr/bin/env python3
"""Writes tests/fixtures/dcp/: small PyTorch Distributed Checkpoint (DCP) folders, saved by four
processes on the gloo backend over loopback, and what torch reads back from them.

Run by scripts/dcp/make_goldens.sh (the oracle venv: torch 2.15.0 CPU, safetensors 0.8.0):

    make_goldens.py [OUT_DIR]        # default: tests/fixtures/dcp next to this script's repository
    make_goldens.py --raw OUT_DIR    # as torch writes them, nothing pinned (to see what varies)

It spawns 4 processes (torch.multiprocessing.spawn, gloo, MASTER_ADDR 127.0.0.1, a free port),
builds a state dict of DTensors on CPU device meshes (1-D of 4, 2-D of 2 x 2), plain tensors and
Python objects, and saves it with torch.distributed.checkpoint.save into

- sharded/             the default FileSystemWriter (torch.save serialization): .metadata (pickle)
                       and __R_0.distcp, one file per rank;
- hf/                  HuggingFaceStorageWriter(save_distributed=True, enable_consolidation=False):
                       shard-0000R-model-0000I-of-00002.safetensors with DCP_SHARDING_INFO, no index;
- safetensors-format/  FileSystemWriter(serialization_format=SerializationFormat.SAFETENSORS):
                       .metadata (pickle) and __R_0.distcp files that are safetensors files.

Then, in this (non-distributed) process, it reads every checkpoint back with torch's own readers
(_load_state_dict with _EmptyStateDictLoadPlanner and no_dist=True, as
torch.distributed.checkpoint.format_utils.dcp_to_torch_save does) and writes
<dir>.reference.safetensors (the global tensors), <dir>.reference.json (non-tensor items) and, for
the two pickled checkpoints, <dir>.metadata.json (the decoded .metadata, the pickle's globals and
opcodes, and where every item's bytes lie). It checks every read-back value against the values
the script put in, and every item's bytes against torch.load. Finally hostile/ is sharded/ with
one global of .metadata replaced by os.system.

Deterministic: DCP puts a random uuid4 (`save_id`) into .metadata and safetensors writes the
`__metadata__` map of a file in a random order (a Rust HashMap); the script pins the first
(patches torch.distributed.checkpoint.filesystem._generate_uuid) and sorts the second (same bytes
otherwise, same header length). With --raw neither is done. See tests/fixtures/dcp/README.md.
"""

import io
import json
import os
import pickle
import pickletools
import shutil
import socket
import struct
import sys
import tempfile
import uuid
import zipfile
from collections import Counter
from pathlib import Path

import torch

WORLD = 4
PINNED_SAVE_ID = str(uuid.UUID(int=0x5EED, version=4))  # 00000000-0000-4000-8000-000000005eed
HOSTILE_COMMAND = "echo pwned > nnx-pwned"
CHECKPOINTS = ["sharded", "hf", "safetensors-format"]

# fqn -> (shape, dtype, offset of the values arange(n) * 0.5 + offset). Every value is exact in
# its dtype (bf16 values in [64, 112) step 0.5, f16 in [200, 232) step 0.5), so all differ.
TENSORS = {
    "model.embed.weight": ((10, 6), torch.float32, 0.0),
    "model.proj.weight": ((8, 12), torch.bfloat16, 64.0),
    "model.block.weight": ((8, 8), torch.float16, 200.0),
    "model.norm.weight": ((6,), torch.float32, 300.0),
    "model.small.bias": ((5,), torch.float32, 350.0),
    "model.colmajor.weight": ((8, 6), torch.float32, 500.0),
    "optim.state.model.proj.weight.exp_avg": ((8, 12), torch.float32, 400.0),
}
COUNT = [-1, 2**40 + 1, 7]
SCALAR = -3.25
# Non-tensor items of sharded/ (flattened names), as DCP stores them (BYTE_IO).
OBJECTS = {
    "step": 7,
    "note": "hello",
    "optim.param_groups.0.lr": 0.001,
    "optim.param_groups.0.betas": (0.9, 0.999),
    "optim.param_groups.0.params": ["model.proj.weight"],
}
# Tensors that safetensors cannot hold (non-contiguous local shards): left out of hf/.
NOT_IN_HF = {"model.colmajor.weight"}
SAFETENSORS_FORMAT_TENSORS = ["model.embed.weight", "model.proj.weight", "model.count"]
HF_FILE_INDEX = {"model": 1, "optim": 2}  # fqn_to_index_mapping by first name part


def values(shape, dtype, offset):
    n = 1
    for s in shape:
        n *= s
    return (torch.arange(n, dtype=torch.float64).reshape(shape) * 0.5 + offset).to(dtype)


def global_tensors():
    """The global tensors every checkpoint holds (flattened names)."""
    out = {name: values(*spec) for name, spec in TENSORS.items()}
    out["model.count"] = torch.tensor(COUNT, dtype=torch.int64)
    out["model.scalar"] = torch.tensor(SCALAR, dtype=torch.float32)
    return out


# ---------------------------------------------------------------------------------------------
# The 4 ranks.


def _worker(rank, out, port, raw):
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo",
        RANK=str(rank), WORLD_SIZE=str(WORLD),
    )
    torch.set_num_threads(1)
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    import torch.distributed.checkpoint.filesystem as dcp_fs
    from torch.distributed.checkpoint.filesystem import SerializationFormat
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

    if not raw:
        dcp_fs._generate_uuid = lambda: PINNED_SAVE_ID

    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    mesh1 = init_device_mesh("cpu", (WORLD,), mesh_dim_names=("dp",))
    mesh2 = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    g = global_tensors()

    def dt(name, mesh, placements):
        # src_data_rank=None: every rank holds the global tensor and keeps its piece, no scatter.
        return distribute_tensor(g[name], mesh, placements, src_data_rank=None)

    # A local shard stored column-major: [2, 6] with strides (1, 2). DCP's _SerialCpuLoader only
    # clones a tensor whose storage is larger than it, so this one is torch.save'd as it is.
    rows = g["model.colmajor.weight"].chunk(WORLD, dim=0)[rank]
    colmajor_local = rows.t().contiguous().t()
    assert colmajor_local.stride() == (1, 2)
    colmajor = DTensor.from_local(colmajor_local, mesh1, [Shard(0)], run_check=False,
                                  shape=(8, 6), stride=(6, 1))

    tensors = {
        "model.embed.weight": dt("model.embed.weight", mesh1, [Shard(0)]),
        "model.proj.weight": dt("model.proj.weight", mesh1, [Shard(1)]),
        "model.block.weight": dt("model.block.weight", mesh2, [Shard(0), Shard(1)]),
        "model.norm.weight": dt("model.norm.weight", mesh1, [Replicate()]),
        "model.small.bias": dt("model.small.bias", mesh1, [Shard(0)]),
        "model.colmajor.weight": colmajor,
        "model.count": g["model.count"].clone(),
        "model.scalar": g["model.scalar"].clone(),
        "optim.state.model.proj.weight.exp_avg":
            dt("optim.state.model.proj.weight.exp_avg", mesh1, [Shard(0)]),
    }
    # sharded/: nested like a real model + optimizer state dict; DCP flattens it (planner_data).
    state = {k: v for k, v in tensors.items() if not k.startswith("optim.")}
    state["step"] = OBJECTS["step"]
    state["note"] = OBJECTS["note"]
    state["optim"] = {
        "state": {"model.proj.weight": {"exp_avg": tensors["optim.state.model.proj.weight.exp_avg"]}},
        "param_groups": [{
            "lr": OBJECTS["optim.param_groups.0.lr"],
            "betas": OBJECTS["optim.param_groups.0.betas"],
            "params": list(OBJECTS["optim.param_groups.0.params"]),
        }],
    }
    cwd = os.getcwd()
    os.chdir(out)  # relative checkpoint ids: .metadata names "sharded", not a folder of this machine
    try:
        dcp.save(state, checkpoint_id="sharded")

        hf = {k: v for k, v in tensors.items() if k not in NOT_IN_HF}
        mapping = {k: HF_FILE_INDEX[k.split(".")[0]] for k in hf}
        dcp.save(hf, storage_writer=dcp.HuggingFaceStorageWriter(
            "hf", fqn_to_index_mapping=mapping, save_distributed=True, enable_consolidation=False))

        st = {k: tensors[k] for k in SAFETENSORS_FORMAT_TENSORS}
        dcp.save(st, storage_writer=dcp.FileSystemWriter(
            "safetensors-format", serialization_format=SerializationFormat.SAFETENSORS))
        dist.barrier()
    finally:
        os.chdir(cwd)
        dist.destroy_process_group()


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------------------------------------
# Safetensors headers.


def read_st_header(data, start=0):
    n = struct.unpack_from("<Q", data, start)[0]
    raw = data[start + 8:start + 8 + n]
    return n, raw, json.loads(raw.rstrip(b" "), object_pairs_hook=dict)


def sort_st_metadata(path):
    """Sorts the `__metadata__` keys of the safetensors file at the start of `path`."""
    data = bytearray(path.read_bytes())
    n, raw, header = read_st_header(data)
    text = raw.rstrip(b" ")
    again = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    assert again == text, f"{path}: header does not re-serialize to the same bytes"
    meta = header.get("__metadata__")
    if meta is None:
        return
    header["__metadata__"] = {k: meta[k] for k in sorted(meta)}
    new = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    assert len(new) == len(text)
    data[8:8 + len(new)] = new
    path.write_bytes(bytes(data))


# ---------------------------------------------------------------------------------------------
# .metadata: decoding, pickle analysis, item layout.


def pickle_summary(data):
    ops = Counter()
    globals_ = []
    memo = {}
    pushed = []  # values pushed by the string/memo ops, None for anything else
    protocol = None
    frames = []
    for op, arg, pos in pickletools.genops(data):
        ops[op.name] += 1
        if op.name == "PROTO":
            protocol = arg
        if op.name == "FRAME":
            frames.append(arg)
        if op.name in ("SHORT_BINUNICODE", "BINUNICODE", "UNICODE", "BINUNICODE8"):
            pushed.append(arg)
        elif op.name == "MEMOIZE":
            memo[len(memo)] = pushed[-1] if pushed else None
        elif op.name in ("BINGET", "LONG_BINGET", "GET"):
            pushed.append(memo.get(arg))
        elif op.name == "STACK_GLOBAL":
            mod, name = pushed[-2], pushed[-1]
            pushed.append(None)
            g = f"{mod}.{name}"
            if g not in globals_:
                globals_.append(g)
        elif op.name == "GLOBAL":
            g = arg.replace(" ", ".")
            if g not in globals_:
                globals_.append(g)
        elif op.name in ("BINPUT", "LONG_BINPUT", "PUT"):
            memo[arg] = pushed[-1] if pushed else None
        else:
            pushed.append(None)
    return {
        "protocol": protocol,
        "frames": frames,
        "globals": globals_,
        "opcodes": dict(sorted(ops.items())),
    }


def zip_records(blob):
    """(name, offset of the record's data in blob, size) for each record of a zip in blob."""
    out = []
    with zipfile.ZipFile(io.BytesIO(blob)) as z:
        for info in z.infolist():
            assert info.compress_type == zipfile.ZIP_STORED
            n, e = struct.unpack_from("<HH", blob, info.header_offset + 26)
            out.append([info.filename, info.header_offset + 30 + n + e, info.file_size])
    return out


def describe_metadata(ckpt):
    """The .metadata of ckpt as JSON, with each item's payload checked against torch.load."""
    data = (ckpt / ".metadata").read_bytes()
    md = pickle.loads(data)  # written just now by this script
    sdm = {}
    for fqn, m in md.state_dict_metadata.items():
        if type(m).__name__ == "BytesStorageMetadata":
            sdm[fqn] = {"type": "BytesStorageMetadata"}
            continue
        p = m.properties
        sdm[fqn] = {
            "type": "TensorStorageMetadata",
            "dtype": str(p.dtype).removeprefix("torch."),
            "size": list(m.size),
            "properties": {
                "layout": str(p.layout),
                "requires_grad": p.requires_grad,
                "memory_format": str(p.memory_format),
                "pin_memory": p.pin_memory,
                "strides": None if p.strides is None else list(p.strides),
            },
            "chunks": [{"offsets": list(c.offsets), "sizes": list(c.sizes)} for c in m.chunks],
        }
    files = {}
    items = []
    for idx, si in md.storage_data.items():
        path = ckpt / si.relative_path
        blob = files.setdefault(si.relative_path, path.read_bytes())
        item = {
            "fqn": idx.fqn,
            "offset": None if idx.offset is None else list(idx.offset),
            "index": idx.index,
            "relative_path": si.relative_path,
            "byte_offset": si.offset,
            "length": si.length,
            "transform_descriptors": si.transform_descriptors,
        }
        items.append(item)
    meta = md.storage_meta
    return md, {
        "version": md.version,
        "storage_meta": {
            "checkpoint_id": str(meta.checkpoint_id),
            "checkpoint_id_class": f"{type(meta.checkpoint_id).__module__}.{type(meta.checkpoint_id).__qualname__}",
            "save_id": meta.save_id,
            "load_id": meta.load_id,
            "modules": meta.modules,
        },
        "planner_data": {k: list(v) for k, v in md.planner_data.items()},
        "state_dict_metadata": sdm,
        "storage_data": items,
        "pickle": pickle_summary(data),
        "files": {name: len(blob) for name, blob in sorted(files.items())},
    }, files


def check_torch_save_items(ckpt, desc, files, ref_tensors, ref_objects):
    """Each item's bytes are one torch.save zip; what it holds matches the reference."""
    for item in desc["storage_data"]:
        blob = files[item["relative_path"]][item["byte_offset"]:item["byte_offset"] + item["length"]]
        assert blob[:4] == b"PK\x03\x04", item
        item["payload"] = "torch.save zip"
        item["zip_records"] = zip_records(blob)
        # weights_only=True: the BYTE_IO items here are ints, floats, strings, tuples and lists.
        obj = torch.load(io.BytesIO(blob), weights_only=True)
        fqn = item["fqn"]
        if item["offset"] is None:
            assert obj == ref_objects[fqn] and type(obj) is type(ref_objects[fqn]), (fqn, obj)
            continue
        chunk = next(c for c in desc["state_dict_metadata"][fqn]["chunks"]
                     if c["offsets"] == item["offset"])
        assert list(obj.shape) == chunk["sizes"], (fqn, obj.shape, chunk)
        assert obj.storage_offset() == 0
        assert obj.untyped_storage().nbytes() == obj.numel() * obj.element_size()
        item["saved_stride"] = list(obj.stride())
        item["saved_contiguous"] = obj.is_contiguous()
        want = ref_tensors[fqn]
        for d, (o, s) in enumerate(zip(chunk["offsets"], chunk["sizes"])):
            want = want.narrow(d, o, s)
        assert obj.dtype == want.dtype and torch.equal(obj, want), fqn


def check_safetensors_items(desc, files):
    """safetensors-format: each .distcp is a safetensors file; offsets/lengths do not locate data."""
    for item in desc["storage_data"]:
        blob = files[item["relative_path"]]
        n, _, header = read_st_header(blob)
        e = header[item["fqn"]]
        sharding = json.loads(header["__metadata__"]["DCP_SHARDING_INFO"])
        assert sharding[item["fqn"]]["saved_offsets"] == item["offset"]
        item["payload"] = "safetensors file (the whole .distcp)"
        item["safetensors_data_offsets"] = e["data_offsets"]
        item["safetensors_data_start"] = 8 + n


# ---------------------------------------------------------------------------------------------
# Reading back with torch.


def load_dcp(reader):
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    sd = {}
    _load_state_dict(sd, storage_reader=reader, planner=_EmptyStateDictLoadPlanner(), no_dist=True)
    flat, _ = flatten_state_dict(sd)
    return flat


def write_reference(out, name, flat, want_tensors, want_objects):
    from safetensors.torch import save_file

    tensors = {k: v for k, v in flat.items() if isinstance(v, torch.Tensor)}
    objects = {k: v for k, v in flat.items() if not isinstance(v, torch.Tensor)}
    assert sorted(tensors) == sorted(want_tensors), (name, sorted(tensors))
    for k, v in tensors.items():
        w = want_tensors[k]
        assert v.dtype == w.dtype and v.shape == w.shape and torch.equal(v, w), (name, k)
    assert objects == want_objects, (name, objects)
    for k, v in objects.items():
        assert type(v) is type(want_objects[k]), (name, k)
    save_file({k: tensors[k].contiguous() for k in sorted(tensors)},
              str(out / f"{name}.reference.safetensors"))
    if objects:
        doc = {k: {"python_type": type(v).__name__, "value": v} for k, v in sorted(objects.items())}
        (out / f"{name}.reference.json").write_text(json.dumps(doc, indent=1) + "\n")


# ---------------------------------------------------------------------------------------------
# The hostile copy.


def plant_os_system(data):
    """`data` with the pathlib.PosixPath global replaced by os.system and its argument by
    HOSTILE_COMMAND: StorageMeta.checkpoint_id = os.system(HOSTILE_COMMAND) when unpickled."""
    ops = list(pickletools.genops(data))
    strings = [(i, arg) for i, (op, arg, pos) in enumerate(ops) if op.name == "SHORT_BINUNICODE"]
    i_mod = next(i for i, a in strings if a in ("pathlib", "pathlib._local"))
    assert ops[i_mod + 2][1] == "PosixPath" and ops[i_mod + 4][0].name == "STACK_GLOBAL"
    # SHORT_BINUNICODE module, MEMOIZE, SHORT_BINUNICODE name, MEMOIZE, STACK_GLOBAL, MEMOIZE,
    # SHORT_BINUNICODE path, MEMOIZE, TUPLE1, MEMOIZE, REDUCE.
    assert ops[i_mod + 6][0].name == "SHORT_BINUNICODE" and ops[i_mod + 8][0].name == "TUPLE1"
    assert ops[i_mod + 10][0].name == "REDUCE"
    replace = {i_mod: "os", i_mod + 2: "system", i_mod + 6: HOSTILE_COMMAND}
    out = bytearray()
    frame_at = None
    for i, (op, arg, pos) in enumerate(ops):
        end = ops[i + 1][2] if i + 1 < len(ops) else len(data)
        if i in replace:
            s = replace[i].encode()
            out += b"\x8c" + bytes([len(s)]) + s
        else:
            if op.name == "FRAME":
                assert frame_at is None, "one frame expected"
                frame_at = len(out)
            out += data[pos:end]
    assert frame_at is not None
    struct.pack_into("<Q", out, frame_at + 1, len(out) - frame_at - 9)
    return bytes(out)


def check_hostile(data):
    calls = []

    class Recorder(pickle.Unpickler):
        def find_class(self, module, name):
            if (module, name) == ("os", "system"):
                return lambda *a: calls.append(a) or 0
            return super().find_class(module, name)

    pickletools.dis(data, out=io.StringIO())
    md = Recorder(io.BytesIO(data)).load()
    assert calls == [(HOSTILE_COMMAND,)], calls
    assert md.storage_meta.checkpoint_id == 0


# ---------------------------------------------------------------------------------------------


def main(argv):
    raw = "--raw" in argv
    args = [a for a in argv if a != "--raw"]
    root = Path(__file__).resolve().parents[2]
    out = Path(args[0]) if args else root / "tests" / "fixtures" / "dcp"
    out = out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    for name in CHECKPOINTS + ["hostile"]:
        shutil.rmtree(out / name, ignore_errors=True)
    for p in out.glob("*.reference.*"):
        p.unlink()
    for p in out.glob("*.metadata.json"):
        p.unlink()

    import torch.multiprocessing as mp

    torch.manual_seed(0)  # nothing here is random; kept for the house style
    mp.spawn(_worker, args=(str(out), free_port(), raw), nprocs=WORLD, join=True)

    if not raw:
        for p in sorted((out / "hf").glob("*.safetensors")) + sorted((out / "safetensors-format").glob("*.distcp")):
            sort_st_metadata(p)

    from torch.distributed.checkpoint import FileSystemReader, HuggingFaceStorageReader

    g = global_tensors()
    objects = dict(OBJECTS)

    # sharded/
    flat = load_dcp(FileSystemReader(str(out / "sharded")))
    write_reference(out, "sharded", flat, g, objects)
    md, desc, files = describe_metadata(out / "sharded")
    check_torch_save_items(out / "sharded", desc, files, g, objects)
    (out / "sharded.metadata.json").write_text(json.dumps(desc, indent=1) + "\n")

    # hf/
    want_hf = {k: v for k, v in g.items() if k not in NOT_IN_HF}
    flat = load_dcp(HuggingFaceStorageReader(str(out / "hf")))
    write_reference(out, "hf", flat, want_hf, {})
    # torch's own consolidation of the shards gives the same tensors.
    from safetensors.torch import load_file
    from torch.distributed.checkpoint._consolidate_hf_safetensors import consolidate_safetensors_files

    # torch 2.15 cannot consolidate an integer tensor (_parse_input_metadata calls torch.finfo on
    # every dtype), so model.count is left out of the mapping, after checking that it fails.
    mapping = {k: HF_FILE_INDEX[k.split(".")[0]] for k in want_hf}
    with tempfile.TemporaryDirectory() as tmp:
        try:
            consolidate_safetensors_files(str(out / "hf"), tmp, mapping)
            raise AssertionError("consolidate_safetensors_files took an int64 tensor")
        except TypeError as e:
            assert "finfo" in str(e), e
    # It also writes no data for a 0-d tensor (_write_sub_tensor_to_file_optimized returns early
    # on an empty shape list), so model.scalar comes out as 0.0: checked, then left out too.
    floats = {k: v for k, v in want_hf.items() if v.dtype.is_floating_point}
    with tempfile.TemporaryDirectory() as tmp:
        consolidate_safetensors_files(str(out / "hf"), tmp, {k: mapping[k] for k in floats})
        merged = {}
        for p in sorted(Path(tmp).glob("*.safetensors")):
            merged.update(load_file(str(p)))
        assert sorted(merged) == sorted(floats), sorted(merged)
        for k, v in merged.items():
            if v.dim() == 0:
                assert v.dtype == floats[k].dtype and v.item() == 0.0 != floats[k].item(), k
                continue
            assert v.dtype == floats[k].dtype and torch.equal(v, floats[k]), k

    # safetensors-format/: torch 2.15's FileSystemReader cannot read it (it torch.loads the
    # bytes at offset/length), so the .distcp files are read by HuggingFaceStorageReader under
    # .safetensors names.
    want_st = {k: g[k] for k in SAFETENSORS_FORMAT_TENSORS}
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        load_dcp(FileSystemReader(str(out / "safetensors-format")))
        raise AssertionError("FileSystemReader read a SAFETENSORS-format checkpoint")
    except CheckpointException as e:  # a BaseException, wrapping torch.load's UnpicklingError
        assert "Weights only load failed" in str(e), e
    with tempfile.TemporaryDirectory() as tmp:
        for p in sorted((out / "safetensors-format").glob("*.distcp")):
            shutil.copyfile(p, Path(tmp) / (p.stem + ".safetensors"))
        flat = load_dcp(HuggingFaceStorageReader(tmp))
    write_reference(out, "safetensors-format", flat, want_st, {})
    md_st, desc_st, files_st = describe_metadata(out / "safetensors-format")
    check_safetensors_items(desc_st, files_st)
    (out / "safetensors-format.metadata.json").write_text(json.dumps(desc_st, indent=1) + "\n")

    # hostile/
    (out / "hostile").mkdir()
    for p in sorted((out / "sharded").glob("*.distcp")):
        shutil.copyfile(p, out / "hostile" / p.name)
    bad = plant_os_system((out / "sharded" / ".metadata").read_bytes())
    check_hostile(bad)
    (out / "hostile" / ".metadata").write_bytes(bad)

    total = 0
    for p in sorted(out.rglob("*")):
        if p.is_file():
            total += p.stat().st_size
            print(f"{p.stat().st_size:8d}  {p.relative_to(out)}")
    print(f"{total:8d}  total; torch {torch.__version__}")


if __name__ == "__main__":
    main(sys.argv[1:])
