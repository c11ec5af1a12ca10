//! `nnx plan IN --tp N [--axis A] [--json]`: which bytes of which files each of N ranks reads to
//! hold its slice of every tensor, from headers alone: tensors of two axes or more cut along
//! `--axis` as `torch.chunk` cuts them, the others (norms, biases, scalars) whole on every rank.

use std::fmt::Write as _;
use std::path::PathBuf;

use crate::common::{CliError, open_archive};

/// The arguments of `nnx plan`.
#[derive(clap::Args)]
pub struct Args {
    /// Any checkpoint nnx reads: a distributed checkpoint folder (DCP or its HF storage
    /// layout), SafeTensors (file, shards, folder), GGUF, a PyTorch checkpoint.
    input: PathBuf,
    /// The number of ranks (tensor-parallel degree).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..))]
    tp: u16,
    /// The axis tensors of two axes or more are cut along (0: rows, as a column-parallel layer
    /// holds its weight; 1: columns, as a row-parallel one does).
    #[arg(long, default_value_t = 0)]
    axis: usize,
    /// Print the plan as JSON: every rank's reads (file, byte ranges, and the box of the entry
    /// they fill) and totals.
    #[arg(long)]
    json: bool,
}

/// Runs the command; returns what it prints.
pub fn run(args: Args) -> Result<String, CliError> {
    let (input, archive) = open_archive(args.input)?;
    let axis = args.axis;
    let plan = archive.read_plan(usize::from(args.tp), |_, shape| (shape.len() >= 2).then_some(axis))?;
    if args.json {
        let value = serde_json::json!({
            "input": input.display().to_string(),
            "tp": args.tp,
            "axis": axis,
            "ranks": plan.ranks.iter().map(|rank| serde_json::json!({
                "rank": rank.rank,
                "bytes_read": rank.bytes_read,
                "bytes_needed": rank.bytes_needed,
                "amplification": rank.amplification(),
                "reads": rank.reads,
            })).collect::<Vec<_>>(),
            "in_memory": plan.in_memory,
        });
        return Ok(format!("{}\n", serde_json::to_string_pretty(&value).map_err(|error| CliError(error.to_string()))?));
    }
    let mut out = format!(
        "{}: {} ranks, tensors of two axes or more cut along axis {axis}, the others whole on every rank\n",
        input.display(),
        args.tp
    );
    let _ = writeln!(
        out,
        "{:>5} {:>6} {:>7} {:>14} {:>14} {:>13}",
        "rank", "reads", "ranges", "bytes read", "bytes needed", "amplification"
    );
    for rank in &plan.ranks {
        let ranges: usize = rank.reads.iter().map(|read| read.ranges.len()).sum();
        let _ = writeln!(
            out,
            "{:>5} {:>6} {:>7} {:>14} {:>14} {:>13.3}",
            rank.rank,
            rank.reads.len(),
            ranges,
            rank.bytes_read,
            rank.bytes_needed,
            rank.amplification()
        );
    }
    if !plan.in_memory.is_empty() {
        let _ = writeln!(out, "{} entries are made in memory and read from no file", plan.in_memory.len());
    }
    Ok(out)
}
