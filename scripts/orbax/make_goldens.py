#!/usr/bin/env python3
"""Writes the Orbax checkpoint goldens: one small training state saved by orbax-checkpoint itself
over 8 virtual CPU devices, in each layout orbax writes, with the global value of every array.

Run by scripts/orbax/make_goldens.sh (which makes the venv and sets XLA_FLAGS):

    make_goldens.py OUT_DIR

For each layout NAME it writes:

- NAME/: the checkpoint folder as `ocp.Checkpointer(...).save` leaves it (only the absolute path in
  its `commit_success.txt` note is replaced by NAME);
- NAME.reference.safetensors: every array's global value, named by its pytree path joined by
  `.`, in its own dtype (bf16 stays bf16, the Python float is the 0-d array orbax stores);
- NAME.reference.json: names, shapes, dtypes, the sharding each array was saved with, and the
  values of the scalars.

Layouts (orbax-checkpoint 0.12 writes zarr v2 unless asked for zarr3):

- ocdbt: the default of `ocp.StandardCheckpointer`: OCDBT on, zarr v2 arrays;
- ocdbt-zarr3: OCDBT on, zarr3 arrays (`sharding_indexed` with crc32c-checked indexes);
- plain: OCDBT off, zarr v2 arrays, one folder per array;
- plain-zarr3: OCDBT off, zarr3 arrays, one folder per array;
- ocdbt-small-nodes: the `ocdbt` checkpoint with its database copied by tensorstore into one of
  512-byte B+tree nodes and 64-byte inline values, so that its tree has interior nodes and most
  values lie in data files (orbax's own nodes hold up to 100 MB and values up to 1 KiB inline).
"""

import json
import os
import shutil
import sys
from pathlib import Path

if "--xla_force_host_platform_device_count=8" not in os.environ.get("XLA_FLAGS", ""):
    sys.exit("set XLA_FLAGS=--xla_force_host_platform_device_count=8 (make_goldens.sh does)")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402
import orbax.checkpoint as ocp  # noqa: E402
import tensorstore as ts  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

LAYOUTS = {
    "ocdbt": {"use_ocdbt": True, "use_zarr3": False},
    "ocdbt-zarr3": {"use_ocdbt": True, "use_zarr3": True},
    "plain": {"use_ocdbt": False, "use_zarr3": False},
    "plain-zarr3": {"use_ocdbt": False, "use_zarr3": True},
    # Made from `ocdbt` (listed after it): see copy_with_small_nodes.
    "ocdbt-small-nodes": {"use_ocdbt": True, "use_zarr3": False},
}

LEARNING_RATE = 0.125
STEP = 7


def values(shape, dtype, offset):
    """Exact, distinct values: arange * 0.5 + offset, cast without rounding."""
    count = int(np.prod(shape, dtype=np.int64))
    array = (np.arange(count, dtype=np.float64) * 0.5 + offset).reshape(shape)
    cast = array.astype(dtype)
    assert np.array_equal(cast.astype(np.float64), array), f"{shape} {dtype} {offset} is not exact"
    return cast


SAFETENSORS_DTYPES = {
    "bool": "BOOL",
    "int8": "I8",
    "uint8": "U8",
    "int16": "I16",
    "uint16": "U16",
    "float16": "F16",
    "bfloat16": "BF16",
    "int32": "I32",
    "uint32": "U32",
    "float32": "F32",
    "int64": "I64",
    "uint64": "U64",
    "float64": "F64",
}


def save_safetensors(path, tensors):
    """A SafeTensors file of `tensors` in name order, 0-d arrays kept 0-d (the `safetensors`
    package stores them as shape [1])."""
    header = {}
    offset = 0
    for name in sorted(tensors):
        array = tensors[name]
        end = offset + array.nbytes
        header[name] = {"dtype": SAFETENSORS_DTYPES[array.dtype.name], "shape": list(array.shape),
                        "data_offsets": [offset, end]}
        offset = end
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as out:
        out.write(len(text).to_bytes(8, "little"))
        out.write(text)
        for name in sorted(tensors):
            out.write(np.ascontiguousarray(tensors[name]).astype(tensors[name].dtype.newbyteorder("<")).tobytes())


def build_state():
    devices = np.array(jax.devices())
    assert devices.size == 8, f"expected 8 devices, found {devices.size}"
    grid = Mesh(devices.reshape(2, 4), ("x", "y"))
    line = Mesh(devices, ("d",))

    # (name, shape, dtype, offset, mesh, spec): one array split on axis 0 over 8, two on axis 1,
    # one 2-D block sharded on both axes of the 2x4 mesh, one on axis 0 over 2, some replicated.
    arrays = [
        ("params.embed.kernel", (10, 6), np.float32, 1.0, grid, P("x", None)),
        ("params.dense.kernel", (8, 12), ml_dtypes.bfloat16, -20.0, grid, P("x", "y")),
        ("params.dense.bias", (12,), np.float32, 100.0, grid, P()),
        ("params.norm.scale", (6,), np.float16, 0.25, grid, P()),
        # Large enough that its chunks (3 KiB, about 1.9 KB compressed) lie in OCDBT data files, not
        # inside the B+tree's leaves (which hold values of up to 1 KiB as orbax configures it).
        ("params.head.kernel", (64, 96), np.float32, -700.0, grid, P(None, "y")),
        ("opt_state.mu.embed.kernel", (10, 6), np.float32, 200.0, grid, P(None, "x")),
        ("opt_state.mu.dense.kernel", (8, 12), np.float32, -300.0, line, P("d", None)),
        ("opt_state.mu.dense.bias", (12,), np.float32, 400.0, grid, P("y")),
        ("opt_state.mu.norm.scale", (6,), np.float32, 500.0, grid, P()),
    ]
    tree = {}
    reference = {}
    info = {}
    for name, shape, dtype, offset, mesh, spec in arrays:
        host = values(shape, dtype, offset)
        array = jax.device_put(jnp.asarray(host), NamedSharding(mesh, spec))
        node = tree
        *parents, leaf = name.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = array
        reference[name] = host
        info[name] = {
            "shape": list(shape),
            "dtype": np.dtype(dtype).name,
            "mesh": dict(zip(mesh.axis_names, mesh.devices.shape)),
            "spec": [None if axis is None else axis for axis in spec],
            "shard_shape": list(array.sharding.shard_shape(shape)),
        }
    step = jax.device_put(jnp.asarray(STEP, dtype=jnp.int32), NamedSharding(grid, P()))
    tree["step"] = step
    reference["step"] = np.asarray(STEP, dtype=np.int32)
    info["step"] = {"shape": [], "dtype": "int32", "value": STEP, "kind": "jax.Array"}
    tree["learning_rate"] = LEARNING_RATE
    return tree, reference, info


def save(folder, tree, use_ocdbt, use_zarr3):
    handler = ocp.PyTreeCheckpointHandler(use_ocdbt=use_ocdbt, use_zarr3=use_zarr3)
    with ocp.Checkpointer(handler) as checkpointer:
        checkpointer.save(folder, args=ocp.args.PyTreeSave(tree))


def copy_with_small_nodes(source, target):
    """`source` with its OCDBT database written anew, key by key in one transaction, into a
    database of small nodes; the other files copied as they are."""
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("manifest.ocdbt", "d", "ocdbt.process_*"))
    old = ts.KvStore.open({"driver": "ocdbt", "base": f"file://{source}/"}).result()
    config = {"max_decoded_node_bytes": 512, "max_inline_value_bytes": 64, "compression": {"id": "zstd"}}
    new = ts.KvStore.open({"driver": "ocdbt", "base": f"file://{target}/", "config": config}).result()
    transaction = ts.Transaction()
    for key in old.list().result():
        new.with_transaction(transaction).write(key, old.read(key).result().value).result()
    transaction.commit_sync()
    dump = ts.ocdbt.dump(ts.KvStore.open(f"file://{target}/").result()).result()
    height = dump["versions"][-1]["root_height"]
    assert height >= 1, f"the copied tree has no interior node (root height {height})"
    return height


def main():
    out = Path(sys.argv[1]).resolve()
    out.mkdir(parents=True, exist_ok=True)
    tree, reference, info = build_state()
    for name, options in LAYOUTS.items():
        folder = out / name
        if folder.exists():
            shutil.rmtree(folder)
        if name == "ocdbt-small-nodes":
            height = copy_with_small_nodes(out / "ocdbt", folder)
            print(f"{name}: root height {height}")
        else:
            save(folder, tree, **options)
            # orbax writes the folder's absolute path into this note; keep the fixtures free of
            # the path they were made at (nothing reads the note back).
            note = folder / "commit_success.txt"
            note.write_text(note.read_text().replace(str(folder), name))
        # What orbax stores for the Python float: read back, the 0-d array it wrote.
        restored = ocp.PyTreeCheckpointer().restore(folder)
        stored_rate = np.asarray(restored["learning_rate"])
        for key, expected in reference.items():
            node = restored
            for part in key.split("."):
                node = node[part]
            got = np.asarray(node)
            assert got.dtype == expected.dtype and np.array_equal(got, expected), f"{name}: {key}"
        tensors = dict(reference)
        tensors["learning_rate"] = stored_rate
        save_safetensors(out / f"{name}.reference.safetensors", tensors)
        entries = dict(info)
        entries["learning_rate"] = {
            "shape": list(stored_rate.shape),
            "dtype": stored_rate.dtype.name,
            "value": float(stored_rate),
            "kind": "Python float",
        }
        document = {
            "layout": name,
            "use_ocdbt": options["use_ocdbt"],
            "use_zarr3": options["use_zarr3"],
            "versions": {
                "jax": jax.__version__,
                "orbax-checkpoint": ocp.__version__ if hasattr(ocp, "__version__") else "unknown",
            },
            "names": list(entries),
            "entries": entries,
        }
        (out / f"{name}.reference.json").write_text(json.dumps(document, indent=2) + "\n")
        print(f"{name}: {sum(f.stat().st_size for f in folder.rglob('*') if f.is_file())} bytes")


if __name__ == "__main__":
    main()
