//! Distributed checkpoints to SafeTensors (`cargo build --release -p nnx-cli && cargo bench
//! --bench dcp`): a DCP folder of 4 ranks holding 4 GiB of BF16 (16 tensors of 8192 x 16384 cut
//! along their first axis, and a few small ones), written by this bench's setup (`nnx convert
//! --dcp-ranks 4` of a synthetic SafeTensors file) and removed after.
//!
//! In turn, on the same folder: torch's own consolidation, `dcp_to_torch_save` then
//! `safetensors.torch.save_file` of the loaded state dict (what torchtitan's and torchtune's
//! guides run), and `nnx convert FOLDER OUT.safetensors`: wall time and peak RSS (GNU time's
//! `%M`, mapped pages included). Both outputs are compared entry by entry.
//!
//! The release `nnx` binary is the one beside this bench (`target/release/nnx`), or
//! `NNX_BINARY`; torch is the `$NNX_CACHE/oracle` Python's (`scripts/models/make_goldens.sh`),
//! and without it (or with `--no-peers`) torch's row says so. The files go to `$NNX_BENCH_DIR`
//! (default: `target/bench-dcp`), which needs about 21 GB.

#[allow(dead_code)]
mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{gb, measured, nnx_binary, write_safetensors};
use nnx::Archive;

/// The big tensors: 16 of 8192 x 16384 BF16, 256 MiB each.
const ROWS: usize = 8192;
const COLUMNS: usize = 16384;
const BIG: usize = 16;
const RANKS: usize = 4;

/// An FNV-1a hash of every entry's bytes, by name.
fn hashes(path: &Path) -> Vec<(String, u64)> {
    let archive = Archive::open(path).expect("the output opens");
    let mut all: Vec<(String, u64)> = archive
        .names()
        .map(|name| {
            let tensor = archive.try_get(name).expect("an entry");
            let bytes = tensor.to_bytes().expect("its bytes");
            let hash = common::fnv1a(&bytes);
            archive.release(name);
            (name.to_string(), hash)
        })
        .collect();
    all.sort();
    all
}

const TORCH_CONSOLIDATE: &str = "
import sys, torch, safetensors.torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
folder, pt, out = sys.argv[1:4]
dcp_to_torch_save(folder, pt)
state = torch.load(pt, weights_only=True, mmap=False)
safetensors.torch.save_file(state, out)
";

fn main() {
    let no_peers = std::env::args().any(|arg| arg == "--no-peers");
    let dir = std::env::var_os("NNX_BENCH_DIR").map_or_else(|| PathBuf::from("target/bench-dcp"), PathBuf::from);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("the bench folder");
    let nnx = nnx_binary();
    assert!(nnx.is_file(), "build the release binary first: cargo build --release -p nnx-cli");

    let source = dir.join("source.safetensors");
    let mut entries: Vec<(String, Vec<usize>)> =
        (0..BIG).map(|i| (format!("layers.{i}.mlp.weight"), vec![ROWS, COLUMNS])).collect();
    entries.push(("norm.weight".into(), vec![COLUMNS]));
    entries.push(("bias".into(), vec![ROWS]));
    write_safetensors(&source, &entries, 5);
    let folder = dir.join("checkpoint");
    let written = measured(Command::new(&nnx).arg("convert").arg(&source).arg(&folder).args(["--dcp-ranks", "4"]))
        .expect("nnx writes the checkpoint");
    std::fs::remove_file(&source).expect("remove the source");
    let bytes: u64 =
        std::fs::read_dir(&folder).expect("the folder").map(|item| item.unwrap().metadata().unwrap().len()).sum();
    println!("DCP folder: {} in {RANKS} ranks ({BIG} tensors of {ROWS} x {COLUMNS} BF16)", gb(bytes));
    println!("  written by `nnx convert --dcp-ranks {RANKS}`: {:.1} s, {} peak RSS", written.0, gb(written.1));
    println!();

    let ours_out = dir.join("nnx.safetensors");
    let ours = measured(Command::new(&nnx).arg("convert").arg(&folder).arg(&ours_out)).expect("nnx converts");
    let ours_hashes = hashes(&ours_out);
    std::fs::remove_file(&ours_out).expect("remove nnx's output");

    let python = common::cache_dir().join("oracle/bin/python");
    let peer = if no_peers || !python.is_file() {
        Err("not run (no oracle Python, or --no-peers)".to_string())
    } else {
        let (pt, out) = (dir.join("torch.pt"), dir.join("torch.safetensors"));
        let result = measured(Command::new(&python).arg("-c").arg(TORCH_CONSOLIDATE).arg(&folder).arg(&pt).arg(&out));
        let _ = std::fs::remove_file(&pt);
        let result = result.map(|timing| {
            let same = hashes(&out) == ours_hashes;
            (timing, same)
        });
        let _ = std::fs::remove_file(&out);
        result
    };

    println!("| DCP -> SafeTensors | time | peak RSS | output |");
    println!("|---|---:|---:|---|");
    match &peer {
        Ok(((seconds, rss), same)) => println!(
            "| torch `dcp_to_torch_save` + `save_file` | {seconds:.1} s | {} | {} |",
            gb(*rss),
            if *same { "the same tensors" } else { "DIFFERENT from nnx's" }
        ),
        Err(why) => println!("| torch `dcp_to_torch_save` + `save_file` | {why} | | |"),
    }
    println!("| `nnx convert` | {:.1} s | {} | {} entries |", ours.0, gb(ours.1), ours_hashes.len());
    if let Ok(((seconds, rss), _)) = &peer {
        println!();
        println!("nnx: {:.2}x torch's speed, {:.2}x less memory", seconds / ours.0, *rss as f64 / ours.1 as f64);
    }
    let _ = std::fs::remove_dir_all(&dir);
}
