#!/usr/bin/env python3
"""Loads a PyTorch Distributed Checkpoint (DCP) folder with torch's own reader and compares every
tensor, bit for bit, with a reference safetensors file.

    check_load.py DCP_DIR REFERENCE.safetensors [--objects REFERENCE.json] [--world N]

Without --world, the folder is read in this one process, with no process group (torch's
_load_state_dict with _EmptyStateDictLoadPlanner and no_dist=True, as
torch.distributed.checkpoint.format_utils.dcp_to_torch_save does): every tensor comes back whole.
With --world N (N >= 2), N processes on the gloo backend over loopback each build a state dict of
DTensors on a 1-D CPU mesh of N, sharded Shard(0) (0-d tensors replicated), and torch.distributed
.checkpoint.load fills their local pieces; the global tensors are then gathered (full_tensor) and
compared. Only tensors are loaded in that mode.

Which reader: a folder with a .metadata file is read by FileSystemReader; one whose .distcp files
are safetensors files (SerializationFormat.SAFETENSORS, which torch's FileSystemReader does not
read back) is read by HuggingFaceStorageReader from a temporary copy with .safetensors names; a
folder of *.safetensors files without .metadata (HuggingFaceStorageWriter) by
HuggingFaceStorageReader.

Before loading, it checks that the chunks of every tensor in the checkpoint's metadata cover the
tensor exactly once (torch leaves uncovered elements as they were allocated). Items that are not
tensors (BYTE_IO: a torch.save'd Python object) are loaded with torch.load(weights_only=True) and
listed; with --objects they are compared with a reference JSON file as written by
make_goldens.py ({"name": {"python_type": ..., "value": ...}}).

Only for folders one trusts: torch's readers unpickle .metadata with the full pickle module (a
hostile .metadata runs code when read), so never point it at tests/fixtures/dcp/hostile.

Prints one line per tensor (and per object) and exits 1 on any difference, 2 on a usage error.
Needs torch (2.15.0 was used) and safetensors.
"""

import argparse
import io
import json
import os
import shutil
import socket
import sys
import tempfile
from pathlib import Path

import torch

SAFETENSORS_SUFFIX = ".safetensors"


# ---------------------------------------------------------------------------------------------
# Readers.


def is_safetensors_blob(path):
    """Whether the file at `path` starts like a safetensors file (u64 header length, then '{')."""
    with open(path, "rb") as f:
        head = f.read(9)
    if len(head) < 9:
        return False
    n = int.from_bytes(head[:8], "little")
    return head[8:9] == b"{" and 0 < n <= os.path.getsize(path) - 8


def open_reader(folder, scratch):
    """(reader, how) for the DCP folder; `scratch` is a temporary folder it may copy into."""
    from torch.distributed.checkpoint import FileSystemReader, HuggingFaceStorageReader

    folder = Path(folder)
    if (folder / ".metadata").is_file():
        distcp = sorted(folder.glob("*.distcp"))
        if distcp and all(is_safetensors_blob(p) for p in distcp):
            for p in distcp:
                shutil.copyfile(p, Path(scratch) / (p.stem + SAFETENSORS_SUFFIX))
            return HuggingFaceStorageReader(str(scratch)), "safetensors .distcp files"
        return FileSystemReader(str(folder)), ".metadata and torch.save .distcp files"
    if sorted(folder.glob("*" + SAFETENSORS_SUFFIX)):
        return HuggingFaceStorageReader(str(folder)), "safetensors files with DCP_SHARDING_INFO"
    raise SystemExit(f"{folder}: neither a .metadata file nor *.safetensors files")


def safe_planner_class():
    """_EmptyStateDictLoadPlanner, with BYTE_IO items unpickled by torch.load(weights_only=True)."""
    from torch.distributed.checkpoint._nested_dict import set_element
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner

    class SafeEmptyStateDictLoadPlanner(_EmptyStateDictLoadPlanner):
        def load_bytes(self, read_item, value):
            obj = torch.load(value, weights_only=True)
            if self.flatten_state_dict:
                set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
            else:
                self.state_dict[read_item.dest_index.fqn] = obj

    return SafeEmptyStateDictLoadPlanner


# ---------------------------------------------------------------------------------------------
# Checks.


def chunk_coverage(metadata):
    """{fqn: message} for tensors whose chunks do not cover every element exactly once."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    problems = {}
    for fqn, m in metadata.state_dict_metadata.items():
        if not isinstance(m, TensorStorageMetadata):
            continue
        count = torch.zeros(tuple(m.size), dtype=torch.int32)
        for c in m.chunks:
            if len(c.offsets) != count.dim() or len(c.sizes) != count.dim():
                problems[fqn] = f"chunk of rank {len(c.offsets)} in a tensor of rank {count.dim()}"
                break
            if any(o < 0 or o + s > n for o, s, n in zip(c.offsets, c.sizes, m.size)):
                problems[fqn] = f"chunk at {list(c.offsets)} size {list(c.sizes)} outside {list(m.size)}"
                break
            view = count
            for d, (o, s) in enumerate(zip(c.offsets, c.sizes)):
                view = view.narrow(d, o, s)
            view += 1
        else:
            uncovered = int((count == 0).sum())
            overlapped = int((count > 1).sum())
            if uncovered or overlapped:
                problems[fqn] = f"{uncovered} elements in no chunk, {overlapped} in several"
    return problems


def compare(got, want):
    """None when `got` equals `want` bit for bit (dtype, shape, bytes), else what differs."""
    if got.dtype != want.dtype:
        return f"dtype {got.dtype} != {want.dtype}"
    if tuple(got.shape) != tuple(want.shape):
        return f"shape {list(got.shape)} != {list(want.shape)}"
    if got.numel() == 0:
        return None
    size = got.element_size()
    a = got.detach().contiguous().reshape(-1).view(torch.uint8).reshape(-1, size)
    b = want.detach().contiguous().reshape(-1).view(torch.uint8).reshape(-1, size)
    bad = (a != b).any(dim=1).nonzero().flatten()
    if bad.numel() == 0:
        return None
    first = int(bad[0])
    index = list(torch.unravel_index(torch.tensor(first), got.shape)) if got.dim() else []
    index = [int(i) for i in index]
    return (f"{bad.numel()} of {got.numel()} elements differ, first at {index}: "
            f"{got.reshape(-1)[first].item()!r} != {want.reshape(-1)[first].item()!r}")


def describe(t):
    return f"{str(t.dtype).removeprefix('torch.')} {list(t.shape)}"


def report_tensors(got, want, coverage):
    """Prints one line per tensor name in either map; returns the number of failures."""
    failures = 0
    width = max((len(k) for k in list(got) + list(want)), default=0)
    for name in sorted(set(got) | set(want)):
        if name not in got:
            print(f"MISSING  {name:<{width}}  {describe(want[name])}: not in the checkpoint")
            failures += 1
        elif name not in want:
            print(f"EXTRA    {name:<{width}}  {describe(got[name])}: not in the reference")
            failures += 1
        elif name in coverage:
            print(f"DIFF     {name:<{width}}  {describe(got[name])}: chunks: {coverage[name]}")
            failures += 1
        else:
            why = compare(got[name], want[name])
            if why is None:
                print(f"ok       {name:<{width}}  {describe(got[name])}")
            else:
                print(f"DIFF     {name:<{width}}  {describe(got[name])}: {why}")
                failures += 1
    return failures


def normalize(value):
    """A Python object as JSON would hold it (tuples become lists)."""
    return json.loads(json.dumps(value))


def report_objects(got, reference_json):
    """Prints one line per non-tensor item; compares with the reference JSON when given."""
    failures = 0
    want = None
    if reference_json is not None:
        want = json.loads(Path(reference_json).read_text())
    names = sorted(set(got) | set(want or {}))
    width = max((len(k) for k in names), default=0)
    for name in names:
        if name not in got:
            print(f"MISSING  {name:<{width}}  object: not in the checkpoint")
            failures += 1
            continue
        value = got[name]
        kind = type(value).__name__
        if want is None:
            print(f"object   {name:<{width}}  {kind} {value!r}")
        elif name not in want:
            print(f"EXTRA    {name:<{width}}  {kind} {value!r}: not in the reference")
            failures += 1
        elif want[name]["python_type"] != kind or want[name]["value"] != normalize(value):
            print(f"DIFF     {name:<{width}}  {kind} {value!r} != "
                  f"{want[name]['python_type']} {want[name]['value']!r}")
            failures += 1
        else:
            print(f"ok       {name:<{width}}  {kind} {value!r}")
    return failures


# ---------------------------------------------------------------------------------------------
# Loading.


def load_no_dist(folder):
    """({fqn: tensor}, {fqn: object}, metadata), read in this process without a process group."""
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    with tempfile.TemporaryDirectory() as scratch:
        reader, how = open_reader(folder, scratch)
        print(f"# {folder}: {how}; read with no process group")
        metadata = reader.read_metadata()
        reader, _ = open_reader(folder, scratch)
        sd = {}
        _load_state_dict(sd, storage_reader=reader, planner=safe_planner_class()(), no_dist=True)
    flat, _ = flatten_state_dict(sd)
    tensors = {k: v for k, v in flat.items() if isinstance(v, torch.Tensor)}
    objects = {k: v for k, v in flat.items() if not isinstance(v, torch.Tensor)}
    return tensors, objects, metadata


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _world_worker(rank, world, port, folder, result_path):
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo",
        RANK=str(rank), WORLD_SIZE=str(world),
    )
    torch.set_num_threads(1)
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
        with tempfile.TemporaryDirectory() as scratch:
            reader, _ = open_reader(folder, scratch)
            metadata = reader.read_metadata()
            state = {}
            for fqn, m in metadata.state_dict_metadata.items():
                if not isinstance(m, TensorStorageMetadata):
                    continue
                dtype = m.properties.dtype
                # A fill that a missed element would show as (NaN, or the type's minimum).
                if dtype.is_floating_point or dtype.is_complex:
                    fill = float("nan")
                elif dtype == torch.bool:
                    fill = True
                else:
                    fill = torch.iinfo(dtype).min
                full = torch.full(tuple(m.size), fill, dtype=dtype)
                placements = [Shard(0)] if len(m.size) > 0 else [Replicate()]
                # src_data_rank=None: every rank keeps its piece of its own copy, no scatter.
                state[fqn] = distribute_tensor(full, mesh, placements, src_data_rank=None)
            reader, _ = open_reader(folder, scratch)
            dcp.load(state, storage_reader=reader)
        gathered = {k: v.full_tensor() for k, v in state.items()}
        local = {k: [list(v.to_local().shape), list(v.placements)] for k, v in state.items()}
        if rank == 0:
            buf = io.BytesIO()
            torch.save({"tensors": gathered, "local": {k: repr(v) for k, v in local.items()}}, buf)
            Path(result_path).write_bytes(buf.getvalue())
        dist.barrier()
    finally:
        dist.destroy_process_group()


def load_world(folder, world):
    """({fqn: tensor}, metadata): loaded into DTensors by `world` gloo processes, then gathered."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as scratch:
        reader, how = open_reader(folder, scratch)
        print(f"# {folder}: {how}; read by {world} gloo processes into DTensors, Shard(0)")
        metadata = reader.read_metadata()
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "result.pt"
        mp.spawn(_world_worker, args=(world, free_port(), str(folder), str(result)),
                 nprocs=world, join=True)
        got = torch.load(io.BytesIO(result.read_bytes()), weights_only=True)
    for k in sorted(got["local"]):
        print(f"# rank 0 piece of {k}: {got['local'][k]}")
    return got["tensors"], metadata


# ---------------------------------------------------------------------------------------------


def main(argv):
    parser = argparse.ArgumentParser(
        description="Load a DCP folder with torch and compare it with a reference safetensors file.")
    parser.add_argument("dcp_dir")
    parser.add_argument("reference")
    parser.add_argument("--objects", metavar="REFERENCE.json",
                        help="compare the non-tensor items with this JSON file (no-dist mode)")
    parser.add_argument("--world", type=int, default=1,
                        help="load with this many gloo processes into Shard(0) DTensors (>= 2)")
    args = parser.parse_args(argv)
    if args.world < 1:
        parser.error("--world must be at least 1")
    if args.world > 1 and args.objects:
        parser.error("--objects needs the no-dist mode (no --world)")
    folder = Path(args.dcp_dir).resolve()
    if not folder.is_dir():
        parser.error(f"{args.dcp_dir}: not a folder")

    from safetensors.torch import load_file

    want = load_file(args.reference)
    if args.world > 1:
        tensors, metadata = load_world(folder, args.world)
        objects = None
    else:
        tensors, objects, metadata = load_no_dist(folder)
    coverage = chunk_coverage(metadata)
    failures = report_tensors(tensors, want, coverage)
    if objects is not None and (objects or args.objects):
        failures += report_objects(objects, args.objects)
    print(f"# {failures} difference(s); {len(want)} reference tensor(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
