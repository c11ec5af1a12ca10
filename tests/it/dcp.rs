//! PyTorch distributed checkpoints (DCP) read as archives of global tensors, against what torch
//! itself reads back from checkpoints saved by 4 gloo processes (`scripts/dcp/make_goldens.py`),
//! and written by nnx so that they read back the same.

use std::path::{Path, PathBuf};

use nnx::{Archive, Error};

use crate::util::{assert_same, fixtures, run_nnx, scratch};

fn dcp(name: &str) -> PathBuf {
    fixtures().join("dcp").join(name)
}

#[test]
fn a_sharded_checkpoint_reads_as_the_global_tensors_torch_reads() {
    let archive = Archive::open(dcp("sharded")).unwrap();
    let reference = Archive::open(dcp("sharded.reference.safetensors")).unwrap();
    assert_same(&archive, &reference, "sharded");
    let values: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dcp("sharded.reference.json")).unwrap()).unwrap();
    let metadata = archive.metadata();
    assert_eq!(metadata["step"], "7");
    assert_eq!(metadata["note"], "hello");
    assert_eq!(metadata["optim.param_groups.0.lr"], "0.001");
    assert_eq!(metadata["optim.param_groups.0.betas.1"], "0.999");
    assert_eq!(metadata["optim.param_groups.0.params.0"], "model.proj.weight");
    assert_eq!(values["step"]["value"], 7);
}

#[test]
fn the_hf_storage_layout_and_the_safetensors_serialization_read_as_torch_reads_them() {
    for name in ["hf", "safetensors-format"] {
        let archive = Archive::open(dcp(name)).unwrap();
        let reference = Archive::open(dcp(&format!("{name}.reference.safetensors"))).unwrap();
        // torch's consolidation of the HF layout writes no value for a 0-d tensor (see the
        // fixtures' README): its value is the one every other checkpoint holds.
        let reference = if name == "hf" {
            let mut fixed = Archive::new();
            let sharded = Archive::open(dcp("sharded.reference.safetensors")).unwrap();
            for entry in reference.names() {
                fixed.insert(entry, sharded.try_get(entry).unwrap());
            }
            fixed
        } else {
            reference
        };
        assert_same(&archive, &reference, name);
    }
}

#[test]
fn checkpoints_nnx_writes_read_back_for_any_number_of_ranks() {
    let reference = Archive::open(dcp("sharded.reference.safetensors")).unwrap();
    let dir = scratch();
    for ranks in [1, 2, 3, 4, 16] {
        let out = dir.path().join(format!("ranks-{ranks}"));
        reference.save_dcp(&out, ranks).unwrap();
        let files = std::fs::read_dir(&out).unwrap().count();
        assert_eq!(files, ranks + 1, "one file per rank and `.metadata`");
        assert_same(&Archive::open(&out).unwrap(), &reference, &format!("{ranks} ranks"));
    }
    // The bytes torch read back equal (`scripts/dcp/check_load.py`, see the fixtures' README):
    // nnx writes them again the same.
    let out = dir.path().join("written");
    reference.save_dcp(&out, 4).unwrap();
    for entry in std::fs::read_dir(dcp("nnx-written")).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap();
        assert!(std::fs::read(&path).unwrap() == std::fs::read(out.join(name)).unwrap(), "{name:?} differs");
    }
}

#[test]
fn a_planted_global_in_metadata_is_refused_by_name_and_nothing_runs() {
    let dir = scratch();
    let folder = dir.path().join("hostile");
    std::fs::create_dir(&folder).unwrap();
    for entry in std::fs::read_dir(dcp("hostile")).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, folder.join(path.file_name().unwrap())).unwrap();
    }
    let (code, _, stderr) = run_nnx(&["inspect".as_ref(), folder.as_os_str()]);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("`os.system`") && stderr.contains(".metadata"), "{stderr}");
    assert!(!dir.path().join("nnx-pwned").exists() && !Path::new("nnx-pwned").exists());
    let error = Archive::open(&folder).unwrap_err();
    assert!(error.to_string().contains("os.system"), "{error}");
}

/// A copy of the sharded checkpoint in a scratch folder, for damaging.
fn sharded_copy(dir: &Path) -> PathBuf {
    let folder = dir.join("sharded");
    std::fs::create_dir(&folder).unwrap();
    for entry in std::fs::read_dir(dcp("sharded")).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, folder.join(path.file_name().unwrap())).unwrap();
    }
    folder
}

#[test]
fn damaged_checkpoints_are_refused_naming_the_file_and_entry() {
    let dir = scratch();
    let folder = sharded_copy(dir.path());
    // A rank's file cut short: the items past its end are named at open.
    let file = folder.join("__3_0.distcp");
    let bytes = std::fs::read(&file).unwrap();
    std::fs::write(&file, &bytes[..bytes.len() / 2]).unwrap();
    let error = Archive::open(&folder).unwrap_err().to_string();
    assert!(error.contains("__3_0.distcp") && error.contains("past its end") && error.contains("truncated"), "{error}");
    // A rank's file missing.
    std::fs::remove_file(&file).unwrap();
    let error = Archive::open(&folder).unwrap_err().to_string();
    assert!(error.contains("`__3_0.distcp`, which is missing"), "{error}");
    // An item's bytes overwritten: the chunk's zip is named with its offset, when read.
    std::fs::write(&file, &bytes).unwrap();
    let archive = Archive::open(&folder).unwrap();
    let mut damaged = bytes.clone();
    damaged[..bytes.len()].iter_mut().for_each(|byte| *byte = 0);
    std::fs::write(&file, &damaged).unwrap();
    let failures: Vec<String> =
        archive.names().filter_map(|name| archive.try_get(name).err()).map(|error| error.to_string()).collect();
    assert!(!failures.is_empty());
    for error in &failures {
        assert!(error.contains("__3_0.distcp") && error.contains("item `"), "{error}");
    }
    // `.metadata` cut short.
    let metadata = folder.join(".metadata");
    let text = std::fs::read(&metadata).unwrap();
    std::fs::write(&metadata, &text[..text.len() - 40]).unwrap();
    let error = Archive::open(&folder).unwrap_err();
    assert!(matches!(error, Error::Torch { .. }) && error.to_string().contains("truncated"), "{error}");
}

#[test]
fn inspect_lists_global_shapes_and_convert_writes_torchs_values() {
    let (code, stdout, stderr) = run_nnx(&["inspect".as_ref(), dcp("sharded").as_os_str()]);
    assert_eq!(code, 0, "{stderr}");
    for (name, shape) in
        [("model.embed.weight", "[10, 6]"), ("model.colmajor.weight", "[8, 6]"), ("model.scalar", "[]")]
    {
        let line = stdout.lines().find(|line| line.contains(name)).unwrap_or_else(|| panic!("{name}:\n{stdout}"));
        assert!(line.contains(shape), "{line}");
    }
    let dir = scratch();
    let out = dir.path().join("out.safetensors");
    let (code, _, stderr) = run_nnx(&["convert".as_ref(), dcp("sharded").as_os_str(), out.as_os_str()]);
    assert_eq!(code, 0, "{stderr}");
    let reference = Archive::open(dcp("sharded.reference.safetensors")).unwrap();
    assert_same(&Archive::open(&out).unwrap(), &reference, "converted");
}

#[test]
fn read_plans_read_each_ranks_slices_and_nothing_more() {
    for name in ["sharded", "hf", "safetensors-format", "nnx-written"] {
        let archive = Archive::open(dcp(name)).unwrap();
        for ranks in [2, 4] {
            let plan = archive.read_plan(ranks, |_, shape| (shape.len() >= 2).then_some(0)).unwrap();
            assert!(plan.in_memory.is_empty(), "{name}");
            for rank in &plan.ranks {
                // Every value of the rank's slices is read once: the ranges it reads fill its
                // boxes exactly, and add up to its slices' bytes.
                let filled: u64 = rank
                    .reads
                    .iter()
                    .map(|read| {
                        let (dtype, _) = archive.entry_spec(&read.entry).unwrap().unwrap();
                        let count: u64 = read.lands.iter().map(|&(_, len)| len as u64).product();
                        dtype.storage_bytes(count).unwrap()
                    })
                    .sum();
                assert_eq!(rank.bytes_read, filled, "{name}, {ranks} ranks, rank {}", rank.rank);
                assert_eq!(rank.bytes_read, rank.bytes_needed, "{name}, {ranks} ranks, rank {}", rank.rank);
            }
            // The reads, done by hand, hold the values of each slice.
            let rank = &plan.ranks[1];
            for read in rank.reads.iter().filter(|read| read.entry == "model.embed.weight") {
                let bytes: Vec<u8> = read
                    .ranges
                    .iter()
                    .flat_map(|range| {
                        std::fs::read(&read.file).unwrap()[range.start as usize..range.end as usize].to_vec()
                    })
                    .collect();
                let whole = archive.try_get("model.embed.weight").unwrap().to_vec::<f32>().unwrap();
                let (rows, _) = read.lands[0];
                let expected: Vec<f32> = whole[rows * 6..(rows + read.lands[0].1) * 6].to_vec();
                let got: Vec<f32> = bytes.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect();
                assert_eq!(got, expected, "{name}: rank 1's rows {:?}", read.lands[0]);
            }
        }
    }
    let (code, stdout, stderr) = run_nnx(&["plan".as_ref(), dcp("sharded").as_os_str(), "--tp".as_ref(), "2".as_ref()]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("640            640         1.000"), "{stdout}");
    let (code, stdout, _) =
        run_nnx(&["plan".as_ref(), dcp("sharded").as_os_str(), "--tp".as_ref(), "2".as_ref(), "--json".as_ref()]);
    assert_eq!(code, 0);
    let value: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(value["ranks"][0]["bytes_read"], 640);
    assert_eq!(value["ranks"][1]["reads"][0]["entry"], "model.embed.weight");
}

#[test]
fn a_training_checkpoints_model_and_optimizer_load_apart() {
    let archive = Archive::open(dcp("sharded")).unwrap();
    let model = archive.select("model");
    assert!(model.names().all(|name| name.starts_with("model.")) && model.contains("model.proj.weight"));
    let state = nnx::dcp::optimizer_state(&archive).unwrap();
    assert_eq!(state.names().collect::<Vec<_>>(), ["mu.model.proj.weight"]);
    let moment = state.try_get("mu.model.proj.weight").unwrap();
    assert_eq!(moment.shape(), model.try_get("model.proj.weight").unwrap().shape());
    let reference = Archive::open(dcp("sharded.reference.safetensors")).unwrap();
    let expected = reference.try_get("optim.state.model.proj.weight.exp_avg").unwrap();
    assert_eq!(moment.to_bytes().unwrap(), expected.to_bytes().unwrap());
}

#[test]
fn a_tensor_parallel_rank_reads_its_slices_from_the_chunks_that_hold_them() {
    use nnx::Module;

    use crate::import::{llama_placement, llama_rank};

    let safetensors = fixtures().join("llama-tiny/model.safetensors");
    let reference = Archive::open(&safetensors).unwrap();
    let dir = scratch();
    let folder = dir.path().join("llama-dcp");
    reference.save_dcp(&folder, 2).unwrap();
    let checkpoint = Archive::open(&folder).unwrap();
    let config = nnx::models::llama::LlamaConfig::from_file(fixtures().join("llama-tiny/config.json")).unwrap();
    for rank in 0..2 {
        let options = nnx::ImportOptions::default().with_placement(llama_placement(2, rank));
        let (mut ours, mut theirs) = (llama_rank(&config, 2), llama_rank(&config, 2));
        checkpoint.import_into_with(&mut ours, "", &options).unwrap();
        reference.import_into_with(&mut theirs, "", &options).unwrap();
        let (ours, theirs) = (ours.flat_state_dict(), theirs.flat_state_dict());
        for ((name, got), (_, want)) in ours.iter().zip(theirs.iter()) {
            assert_eq!(got.to_bytes().unwrap(), want.to_bytes().unwrap(), "rank {rank}: `{name}`");
        }
        // The rows of a column-parallel weight lie in this rank's chunk: a view of its file,
        // nothing else read.
        let q = ours.iter().find(|(name, _)| *name == "layers.0.attn.q.weight").unwrap().1;
        assert!(q.is_mapped(), "rank {rank}'s rows of q are its chunk of `__{rank}_0.distcp`");
    }
}
