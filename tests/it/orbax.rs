//! Orbax checkpoints read without JAX: the goldens orbax-checkpoint wrote over 8 devices (OCDBT
//! and one folder per array, zarr v2 and zarr3, and an OCDBT database of small nodes) open as
//! archives of global arrays equal bit for bit to the values JAX saved; `nnx inspect` lists them and `nnx convert` writes them; a
//! manager's step folder opens as its item; damaged files end in errors naming the file and key.

use std::path::{Path, PathBuf};

use nnx::{Archive, Error};
use serde_json::Value;

use crate::util::{assert_same, fixtures, nnx_ok, run_nnx, scratch, text};

/// The layouts of the goldens (see `tests/fixtures/orbax/README.md`).
const LAYOUTS: [&str; 5] = ["ocdbt", "ocdbt-zarr3", "plain", "plain-zarr3", "ocdbt-small-nodes"];

fn golden(layout: &str) -> PathBuf {
    fixtures().join("orbax").join(layout)
}

fn reference(layout: &str) -> Archive {
    Archive::open(fixtures().join("orbax").join(format!("{layout}.reference.safetensors"))).unwrap()
}

/// Every entry of `archive` has the dtype, shape and bytes of the reference's, and the two have
/// the same names.
fn assert_equals_reference(archive: &Archive, layout: &str) {
    assert_same(archive, &reference(layout), layout);
}

/// A copy of golden `layout` in a scratch folder, to damage.
fn copy_of(layout: &str, into: &Path) -> PathBuf {
    let target = into.join(layout);
    copy_dir(&golden(layout), &target);
    target
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for item in std::fs::read_dir(from).unwrap() {
        let item = item.unwrap();
        let path = item.path();
        if path.is_dir() {
            copy_dir(&path, &to.join(item.file_name()));
        } else {
            std::fs::copy(&path, to.join(item.file_name())).unwrap();
        }
    }
}

/// CRC-32C (Castagnoli), bit by bit: to rewrite the checksums of damaged files.
fn crc32c(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &byte in bytes {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            crc = if crc & 1 == 1 { (crc >> 1) ^ 0x82f6_3b78 } else { crc >> 1 };
        }
    }
    !crc
}

/// The one file of a folder (the root database's B+tree data file).
fn only_file(dir: &Path) -> PathBuf {
    let files: Vec<PathBuf> = std::fs::read_dir(dir).unwrap().map(|item| item.unwrap().path()).collect();
    assert_eq!(files.len(), 1, "{files:?}");
    files.into_iter().next().unwrap()
}

/// The error is an Orbax one about `key` of the file `path`, and its message names both.
fn assert_orbax_error(error: &Error, path: &Path, key: &str, says: &str) {
    let message = error.to_string();
    match error {
        Error::Orbax { path: found, key: found_key, .. } => {
            assert_eq!(found, path, "{message}");
            assert_eq!(found_key, key, "{message}");
        }
        other => panic!("not an Orbax error: {other}"),
    }
    assert!(message.contains(&path.display().to_string()) && message.contains(key), "{message}");
    assert!(message.contains(says), "`{says}` not in: {message}");
    assert!(!message.contains('\n'), "one line: {message}");
}

#[test]
fn orbax_every_layout_reads_as_jax_saved_it() {
    for layout in LAYOUTS {
        let archive = Archive::open(golden(layout)).unwrap();
        assert_equals_reference(&archive, layout);
        // Names in pytree order (dict keys sorted at every level), as `_METADATA` lists them.
        let names: Vec<&str> = archive.names().collect();
        let mut sorted = names.clone();
        sorted.sort_by_key(|name| name.split('.').collect::<Vec<_>>());
        assert_eq!(names, sorted, "{layout}");
        // The names and dtypes the script recorded.
        let json: Value =
            serde_json::from_str(&std::fs::read_to_string(golden(layout).with_extension("reference.json")).unwrap())
                .unwrap();
        for name in json["names"].as_array().unwrap() {
            let name = name.as_str().unwrap();
            let info = archive.info(name).unwrap();
            let shape: Vec<usize> = serde_json::from_value(json["entries"][name]["shape"].clone()).unwrap();
            assert_eq!(info.shape, shape, "{layout}: {name}");
        }
        // The Python float is the 0-d float64 array orbax stores it as.
        let rate = archive.try_get("learning_rate").unwrap();
        assert_eq!((rate.dtype(), rate.shape()), (nnx::DType::F64, &[][..]));
        assert_eq!(rate.to_vec::<f64>().unwrap(), [0.125]);
    }
}

#[test]
fn orbax_entries_are_assembled_when_read() {
    // Opening reads metadata only: an array whose chunks are gone still opens and lists, and
    // reads as its fill value (zero) where they were.
    let dir = scratch();
    let folder = copy_of("plain", dir.path());
    for item in std::fs::read_dir(folder.join("params.dense.kernel")).unwrap() {
        let path = item.unwrap().path();
        if !path.ends_with(".zarray") {
            std::fs::remove_file(path).unwrap();
        }
    }
    let archive = Archive::open(&folder).unwrap();
    let kernel = archive.try_get("params.dense.kernel").unwrap();
    assert_eq!(kernel.shape(), [8, 12]);
    assert!(kernel.to_bytes().unwrap().iter().all(|&byte| byte == 0));
    assert_eq!(
        archive.try_get("params.dense.bias").unwrap().to_bytes().unwrap(),
        reference("plain").try_get("params.dense.bias").unwrap().to_bytes().unwrap()
    );
}

#[test]
fn orbax_manager_step_folders_open_as_their_items() {
    let dir = scratch();
    // One item (`default`, as `CheckpointManager` names a lone item): its names as they are.
    let step = dir.path().join("7");
    copy_dir(&golden("ocdbt"), &step.join("default"));
    std::fs::write(step.join("_CHECKPOINT_METADATA"), "{}").unwrap();
    assert_equals_reference(&Archive::open(&step).unwrap(), "ocdbt");
    // Two items: each item's names under its folder name.
    copy_dir(&golden("plain-zarr3"), &step.join("extra"));
    let archive = Archive::open(&step).unwrap();
    assert!(archive.contains("default.params.dense.kernel") && archive.contains("extra.step"));
    assert_eq!(archive.len(), 2 * reference("ocdbt").len());
}

#[test]
fn orbax_inspect_lists_global_shapes_and_dtypes() {
    for layout in LAYOUTS {
        let folder = golden(layout);
        let out = nnx_ok(&["inspect", text(&folder), "--json"]);
        let report: Value = serde_json::from_str(&out).unwrap();
        let listed = report["entries"].as_array().unwrap_or_else(|| panic!("no entries in {out}"));
        let expected = reference(layout);
        assert_eq!(listed.len(), expected.len(), "{layout}: {out}");
        for tensor in listed {
            let name = tensor["name"].as_str().unwrap();
            let info = expected.info(name).unwrap();
            let shape: Vec<usize> = serde_json::from_value(tensor["shape"].clone()).unwrap();
            assert_eq!(shape, info.shape, "{layout}: {name}");
            assert_eq!(tensor["dtype"].as_str().unwrap(), info.dtype.as_str(), "{layout}: {name}");
        }
        let plain = nnx_ok(&["inspect", text(&folder)]);
        assert!(plain.contains("params.dense.kernel") && plain.contains("BF16"), "{plain}");
    }
}

#[test]
fn orbax_convert_writes_the_global_arrays() {
    let dir = scratch();
    for layout in LAYOUTS {
        let output = dir.path().join(format!("{layout}.safetensors"));
        let out = nnx_ok(&["convert", text(&golden(layout)), text(&output)]);
        assert!(out.starts_with("converted "), "{out}");
        assert_equals_reference(&Archive::open(&output).unwrap(), layout);
    }
}

#[test]
fn orbax_damaged_ocdbt_nodes_are_named() {
    let dir = scratch();
    let folder = copy_of("ocdbt", dir.path());
    // The root B+tree node of the database that joins the processes' databases.
    let node = only_file(&folder.join("d"));
    let bytes = std::fs::read(&node).unwrap();
    let mut flipped = bytes.clone();
    let middle = flipped.len() / 2;
    flipped[middle] ^= 0x40;
    std::fs::write(&node, &flipped).unwrap();
    let error = Archive::open(&folder).unwrap_err();
    assert_orbax_error(&error, &node, "learning_rate/zarr.json", "crc32c");
    // Truncated: the manifest's reference runs past the end of the file.
    std::fs::write(&node, &bytes[..bytes.len() / 2]).unwrap();
    let error = Archive::open(&folder).unwrap_err();
    assert_orbax_error(&error, &node, "learning_rate/zarr.json", "truncated");
    // A damaged manifest.
    let manifest = folder.join("manifest.ocdbt");
    let mut bytes = std::fs::read(&manifest).unwrap();
    bytes[0] = 0;
    std::fs::write(&manifest, &bytes).unwrap();
    let error = Archive::open(&folder).unwrap_err();
    assert_orbax_error(&error, &manifest, "manifest.ocdbt", "magic");
    // The command line says the same on one line.
    let (code, out, err) = run_nnx(&["inspect", text(&folder)]);
    assert_ne!(code, 0, "{out}");
    assert!(err.contains("manifest.ocdbt") && err.contains("magic"), "{err}");
}

#[test]
fn orbax_enormous_shapes_are_refused_without_allocating() {
    let dir = scratch();
    let folder = copy_of("plain-zarr3", dir.path());
    let metadata = folder.join("params.dense.kernel").join("zarr.json");
    let original = std::fs::read_to_string(&metadata).unwrap();
    // Bytes past what memory can address: refused at open.
    let overflowing = original.replace("\"shape\":[8,12]", "\"shape\":[4611686018427387904,4611686018427387904]");
    assert_ne!(overflowing, original);
    std::fs::write(&metadata, overflowing).unwrap();
    let error = Archive::open(&folder).unwrap_err();
    assert_orbax_error(&error, &metadata, "params.dense.kernel/zarr.json", "overflow");
    // Addressable but far past any memory (512 PiB): listed, and refused when read, with nothing
    // allocated.
    let huge = original.replace("\"shape\":[8,12]", "\"shape\":[1099511627776,262144]");
    std::fs::write(&metadata, huge).unwrap();
    let archive = Archive::open(&folder).unwrap();
    assert_eq!(archive.info("params.dense.kernel").unwrap().shape, [1 << 40, 1 << 18]);
    let error = archive.try_get("params.dense.kernel").unwrap_err();
    assert_orbax_error(&error, &metadata, "params.dense.kernel", "refused");
    // The other entries read as ever.
    assert_eq!(archive.try_get("step").unwrap().to_vec::<i32>().unwrap(), [7]);
}

#[test]
fn orbax_shard_indexes_pointing_past_the_shard_are_refused() {
    let dir = scratch();
    let folder = copy_of("plain-zarr3", dir.path());
    let shard = folder.join("params.dense.kernel").join("c").join("1").join("2");
    let bytes = std::fs::read(&shard).unwrap();
    // One inner chunk: its (offset, length) and the index's crc32c end the shard.
    let index = bytes.len() - 20;
    let mut moved = bytes.clone();
    moved[index..index + 8].copy_from_slice(&(1u64 << 40).to_le_bytes());
    let crc = crc32c(&moved[index..index + 16]);
    moved[index + 16..].copy_from_slice(&crc.to_le_bytes());
    std::fs::write(&shard, &moved).unwrap();
    let archive = Archive::open(&folder).unwrap();
    let error = archive.try_get("params.dense.kernel").unwrap_err();
    assert_orbax_error(&error, &shard, "params.dense.kernel/c/1/2", "of the shard");
    // The index changed without its checksum.
    moved[index..index + 8].copy_from_slice(&0u64.to_le_bytes());
    std::fs::write(&shard, &moved).unwrap();
    let error = archive.try_get("params.dense.kernel").unwrap_err();
    assert_orbax_error(&error, &shard, "params.dense.kernel/c/1/2", "crc32c");
    // A chunk that is not zstd.
    let mut garbled = bytes.clone();
    garbled[0] ^= 0xff;
    std::fs::write(&shard, &garbled).unwrap();
    let error = archive.try_get("params.dense.kernel").unwrap_err();
    assert_orbax_error(&error, &shard, "params.dense.kernel/c/1/2", "zstd");
    // Every other entry still reads.
    std::fs::write(&shard, &bytes).unwrap();
    assert_equals_reference(&archive, "plain-zarr3");
}

#[test]
fn orbax_unknown_codecs_are_refused_by_name() {
    let dir = scratch();
    let folder = copy_of("plain", dir.path());
    let metadata = folder.join("step").join(".zarray");
    let original = std::fs::read_to_string(&metadata).unwrap();
    std::fs::write(&metadata, original.replace("\"id\":\"zstd\"", "\"id\":\"blosc\"")).unwrap();
    let error = Archive::open(&folder).unwrap_err();
    assert_orbax_error(&error, &metadata, "step/.zarray", "blosc");
}

#[test]
fn read_plans_read_whole_compressed_chunks_and_say_so() {
    for layout in LAYOUTS {
        let archive = Archive::open(golden(layout)).unwrap();
        for ranks in [2, 4] {
            let plan = archive.read_plan(ranks, |_, shape| (shape.len() >= 2).then_some(0)).unwrap();
            assert!(plan.in_memory.is_empty(), "{layout}: {:?}", plan.in_memory);
            for rank in &plan.ranks {
                // Every value of the rank's slices lies in a chunk it reads.
                for name in archive.names() {
                    let (_, shape) = archive.entry_spec(name).unwrap().unwrap();
                    let count: usize = shape.iter().product();
                    if count == 0 {
                        continue;
                    }
                    let covered: usize = rank
                        .reads
                        .iter()
                        .filter(|read| read.entry == name)
                        .map(|read| read.lands.iter().map(|&(_, len)| len).product::<usize>())
                        .sum();
                    let wanted: usize = if shape.len() >= 2 {
                        let (start, end) = nnx::plan::rank_rows(shape[0], ranks, rank.rank);
                        (end - start) * shape[1..].iter().product::<usize>()
                    } else {
                        count
                    };
                    assert_eq!(covered, wanted, "{layout}, {ranks} ranks, rank {}: `{name}`", rank.rank);
                }
                assert!(rank.bytes_read > 0 && rank.amplification() > 0.0, "{layout}");
            }
        }
    }
}
