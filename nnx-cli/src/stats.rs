//! `nnx stats PATH [--json] [--check]`: per tensor the minimum, maximum, mean, standard
//! deviation, largest magnitude, zero fraction, NaN and infinity counts and a compact
//! histogram ([`nnx::stats`]), computed in parallel over the mapped file; quantized weights
//! (MLX affine, SEED, GGUF blocks) are decoded on the way. `--check` fails (exit 1) when a
//! tensor holds NaN or infinities, or when a weight (a matrix or an embedding) holds only zeros:
//! a bias or a norm vector of zeros is normal ([`TensorStats::zeros_are_normal`]).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use nnx::DType;
use nnx::quantized::{EncodedWeight, QuantizedFolder};
use nnx::stats::{TensorStats, entry_stats, stats_of};
use rayon::prelude::*;

use crate::common::{CliError, open_archive, progress_bar};

/// The arguments of `nnx stats`.
#[derive(clap::Args)]
pub struct Args {
    /// A SafeTensors file, shard index or folder, a PyTorch checkpoint, a GGUF file, a
    /// quantized folder, or an `hf://` or object-store path.
    path: PathBuf,
    /// Print one JSON object: `{"tensors": [...]}` with every field of each tensor.
    #[arg(long)]
    json: bool,
    /// Exit with status 1 when a tensor holds NaN or infinite values, or a weight matrix or
    /// embedding only zeros (biases and norm vectors may be zeros).
    #[arg(long)]
    check: bool,
}

/// One unit of work: an entry, or an encoded weight of a quantized folder.
enum Item {
    Entry(String),
    Encoded(String),
}

/// The report, and whether `--check` fails.
pub fn run(args: Args) -> Result<(String, bool), CliError> {
    let (path, archive) = open_archive(args.path)?;
    let folder = quantized_folder(&path, &archive)?;
    let tensors = collect(&path, &archive, folder.as_ref(), !args.json)?;
    let flagged: Vec<&TensorStats> = tensors.iter().filter(|stats| stats.suspicious()).collect();
    let fails = args.check && !flagged.is_empty();
    if args.json {
        let value = serde_json::json!({ "path": path.display().to_string(), "tensors": tensors });
        return Ok((serde_json::to_string(&value).expect("stats serialize") + "\n", fails));
    }
    let mut out = table(&tensors, false);
    for stats in flagged {
        let problem = stats.problem().unwrap_or_default();
        let _ = writeln!(out, "check: `{}`: {problem}", nnx::text::printable(&stats.name));
    }
    Ok((out, fails))
}

/// The folder's quantized weights, when `path` is a folder of MLX affine or SEED weights.
pub fn quantized_folder(path: &std::path::Path, archive: &nnx::Archive) -> Result<Option<QuantizedFolder>, CliError> {
    let encoded = archive.names().any(|name| name.ends_with(".scales") || name.ends_with(".seeds"));
    Ok(if path.is_dir() && encoded { Some(QuantizedFolder::open(path)?) } else { None })
}

/// The statistics of every tensor of `archive` (opened from `path`), in entry order; the
/// weights of `folder` (the archive's quantized folder, if it is one) decoded as wholes, their
/// streams not listed; a progress bar on stderr with `bar`.
///
/// # Errors
/// The first tensor that cannot be read, named with the file.
pub fn collect(
    path: &Path,
    archive: &nnx::Archive,
    folder: Option<&QuantizedFolder>,
    bar: bool,
) -> Result<Vec<TensorStats>, CliError> {
    let mut items = Vec::new();
    let mut streams = std::collections::HashSet::new();
    if let Some(folder) = folder {
        for name in folder.weights() {
            if !matches!(folder.weight(&name)?, EncodedWeight::Float(_)) {
                streams.extend(folder.streams_of(&name));
                items.push(Item::Encoded(name));
            }
        }
    }
    items.extend(archive.names().filter(|name| !streams.contains(*name)).map(|name| Item::Entry(name.to_string())));
    let bar = if bar { progress_bar(items.len() as u64, "tensors") } else { indicatif::ProgressBar::hidden() };
    let results: Vec<Result<Option<TensorStats>, CliError>> = items
        .par_iter()
        .map(|item| {
            let (name, result) = match item {
                Item::Entry(name) => (name, entry_stats(archive, name)),
                Item::Encoded(name) => match folder {
                    Some(folder) => (name, encoded_stats(folder, name).map(Some)),
                    None => (name, Ok(None)),
                },
            };
            bar.inc(1);
            result.map_err(|error| entry_error(path, name, &error))
        })
        .collect();
    bar.finish_and_clear();
    let mut tensors = Vec::new();
    for result in results {
        if let Some(stats) = result? {
            tensors.push(stats);
        }
    }
    Ok(tensors)
}

/// Why the statistics of entry `name` of `path` cannot be had, saying what to do.
fn entry_error(path: &Path, name: &str, error: &nnx::Error) -> CliError {
    let (name, path) = (nnx::text::printable(name), path.display());
    CliError(match error {
        nnx::Error::Expansion { shape, strides, bytes, stored, limit } => format!(
            "cannot compute the statistics of `{name}` of `{path}`: its layout (shape {shape:?}, strides {strides:?}) reads the {stored} bytes it is stored in as {bytes} bytes of overlapping values, over the limit of {limit} bytes ({} times the stored bytes plus {} MiB), as no saved weight does: the file is damaged or hostile; save the tensor contiguous (`tensor.contiguous()` in PyTorch) and compute its statistics from that file",
            nnx::Tensor::EXPANSION_FACTOR,
            nnx::Tensor::EXPANSION_ALLOWANCE >> 20
        ),
        error => format!("cannot compute the statistics of `{name}` of `{path}`: {error}"),
    })
}

/// The statistics of an encoded weight, decoded to f32.
fn encoded_stats(folder: &QuantizedFolder, name: &str) -> nnx::Result<TensorStats> {
    let weight = folder.weight(name)?;
    let encoding = encoding_name(weight.encoding());
    let decoded = weight.to_float(DType::F32)?;
    let values = decoded.to_dtype(DType::F64)?.to_vec::<f64>()?;
    stats_of(name, encoding, decoded.shape().to_vec(), &|visit| {
        values.chunks(1 << 20).for_each(&mut *visit);
        Ok(())
    })
}

/// How an encoding is named in reports: `MLX affine 4-bit/64`, `Seed4`, or the dtype.
pub fn encoding_name(encoding: nnx::quantized::WeightEncoding) -> String {
    match encoding {
        nnx::quantized::WeightEncoding::Affine(spec) => format!("MLX affine {}-bit/{}", spec.bits, spec.group_size),
        nnx::quantized::WeightEncoding::Seed(encoding) => format!("{encoding:?}"),
        nnx::quantized::WeightEncoding::Float(dtype) => dtype.to_string(),
    }
}

/// The histogram as one character a bin, eight heights.
fn sparkline(histogram: &[u64]) -> String {
    const BARS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    let top = histogram.iter().copied().max().unwrap_or(0).max(1);
    // In u128: the counts of a view repeated by a zero stride reach past `u64::MAX / 7`.
    histogram
        .iter()
        .map(|&count| if count == 0 { ' ' } else { BARS[(u128::from(count) * 7 / u128::from(top)) as usize] })
        .collect()
}

/// The statistics as a table, a tensor a line, and the totals; shapes in ggml's order (`ne`,
/// the fastest axis first, as `gguf-dump` prints them) when `ggml_order`, else row-major.
pub fn table(tensors: &[TensorStats], ggml_order: bool) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<44} {:<10} {:>16} {:>11} {:>11} {:>11} {:>11} {:>11} {:>6} {:>5} {:>5}  histogram",
        "name",
        "dtype",
        if ggml_order { "shape (ggml ne)" } else { "shape" },
        "min",
        "max",
        "mean",
        "std",
        "absmax",
        "zero%",
        "nan",
        "inf"
    );
    for stats in tensors {
        let name = nnx::text::printable(&stats.name);
        let shape: Vec<usize> =
            if ggml_order { stats.shape.iter().rev().copied().collect() } else { stats.shape.clone() };
        let _ = writeln!(
            out,
            "{name:<44} {:<10} {:>16} {:>11.4e} {:>11.4e} {:>11.4e} {:>11.4e} {:>11.4e} {:>6.2} {:>5} {:>5}  {}",
            stats.encoding,
            format!("{shape:?}"),
            stats.min,
            stats.max,
            stats.mean,
            stats.std,
            stats.absmax,
            stats.zero_fraction * 100.0,
            stats.nans,
            stats.infs,
            sparkline(&stats.histogram),
        );
    }
    let values = tensors.iter().fold(0u64, |total, stats| total.saturating_add(stats.count));
    let _ = writeln!(out, "total: {} tensors, {values} values", tensors.len());
    out
}
