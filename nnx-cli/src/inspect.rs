//! `nnx inspect PATH [--json | --html OUT.html]`: names, dtypes, shapes, bytes, offsets,
//! metadata and totals of a SafeTensors file, shard index, folder or GGUF file (with each
//! tensor's ggml type and bits per weight), from headers alone. Names and metadata come from
//! the file and are printed escaped ([`nnx::text::printable`]); the JSON form escapes them as
//! JSON does.
//!
//! `--json` and `--html` give the whole report ([`crate::report`]): files with sha256, types
//! and bits per weight, the quantization map, metadata, a memory plan, and with `--stats` and
//! `--model ARCH` the statistics and the import plan; `--html` draws it as one offline page.

use std::path::{Path, PathBuf};

use nnx::text::printable;
use nnx::{Archive, EntryInfo};

use crate::common::{CliError, open_archive};

/// The arguments of `nnx inspect`.
#[derive(clap::Args)]
#[command(group(clap::ArgGroup::new("report").args(["json", "html"]).multiple(true)))]
pub struct Args {
    /// A `.safetensors` file, a shard index (`*.index.json`), a folder, a GGUF file, a PyTorch
    /// checkpoint or an `hf://` path.
    path: PathBuf,
    /// Print the whole report as one JSON object (the data the `--html` page shows).
    #[arg(long)]
    json: bool,
    /// Write the report as one self-contained HTML page (style, script and data inline; it
    /// opens from disk and fetches nothing).
    #[arg(long, value_name = "OUT.html")]
    html: Option<PathBuf>,
    /// Add every tensor's statistics (min, max, mean, std, histogram, outliers): reads every
    /// value.
    #[arg(long, requires = "report")]
    stats: bool,
    /// Add the import plan into this architecture: llama, mistral, qwen2, qwen3, gemma3,
    /// gpt2 or bert (shaped by the files' own config).
    #[arg(long, value_name = "ARCH", requires = "report")]
    model: Option<String>,
    /// The memory plan's context length (default: the model's, at most 4096).
    #[arg(long, value_name = "N", requires = "report")]
    ctx: Option<usize>,
    /// The memory plan's batch.
    #[arg(long, value_name = "B", default_value_t = 1, requires = "report")]
    batch: usize,
}

/// Lists what the path holds, as a table, one JSON object or a page.
pub fn run(args: Args) -> Result<String, CliError> {
    let Args { path: source, json, html, stats, model, ctx, batch } = args;
    let (path, archive) = open_archive(source.clone())?;
    if json || html.is_some() {
        let options = crate::report::Options { stats, model, ctx, batch, progress: html.is_some() };
        let report = crate::report::build(&source, &path, &archive, &options)?;
        let Some(out) = html else { return Ok(report.to_string() + "\n") };
        let page = crate::page::render(&report);
        write_page(&out, &page)?;
        return Ok(format!(
            "wrote {} ({}): {} entries, {}\n",
            out.display(),
            human_bytes(page.len()),
            report["count"],
            human_bytes(report["total_bytes"].as_u64().unwrap_or(0) as usize)
        ));
    }
    let path: &Path = &path;
    let entries: Vec<EntryInfo> = archive.names().map(|name| archive.info(name)).collect::<nnx::Result<_>>()?;
    // Saturating: views read from a file may each describe up to `isize::MAX` bytes.
    let total = entries.iter().fold(0usize, |total, entry| total.saturating_add(entry.bytes));
    let mut out = format!("{}: {} entries, {}\n", path.display(), entries.len(), human_bytes(total));
    if !archive.metadata().is_empty() {
        out.push_str("metadata:\n");
        for (key, value) in archive.metadata() {
            // Metadata is the file's own text: escaped, so that it cannot act on the terminal.
            out.push_str(&format!("  {} = {}\n", printable(key), printable(value)));
        }
    }
    let sharded = entries.iter().any(|entry| entry.location.as_ref().is_some_and(|l| l.path != path));
    let rows: Vec<[String; 6]> = entries
        .iter()
        .map(|entry| {
            let (offsets, file) = match &entry.location {
                Some(location) => (
                    format!("[{}, {}]", location.data_offsets.0, location.data_offsets.1),
                    location
                        .path
                        .file_name()
                        .map(|name| printable(&name.to_string_lossy()).into_owned())
                        .unwrap_or_default(),
                ),
                None => (String::new(), String::new()),
            };
            [
                printable(&entry.name).into_owned(),
                dtype_column(&archive, entry),
                format!("{:?}", entry.shape),
                entry.bytes.to_string(),
                offsets,
                file,
            ]
        })
        .collect();
    let header = ["name", "dtype", "shape", "bytes", "offsets", "file"];
    let columns = if sharded { 6 } else { 5 };
    let mut rows: Vec<Vec<String>> = rows.into_iter().map(|row| row[..columns].to_vec()).collect();
    let mut header = header[..columns].to_vec();
    if archive.gguf_metadata().is_some() {
        // GGUF entries are ggml types: their bits per weight say what the type costs.
        header[1] = "type";
        header.insert(2, "bpw");
        for (row, entry) in rows.iter_mut().zip(&entries) {
            let bits =
                archive.ggml_type(&entry.name).map_or(String::new(), |ty| format!("{:.4}", ty.bits_per_weight()));
            row.insert(2, bits.trim_end_matches('0').trim_end_matches('.').to_string());
        }
    }
    out.push_str(&nnx::__private::render_columns(&header, &rows));
    out.push_str(&format!("total: {} entries, {total} bytes\n", entries.len()));
    Ok(out)
}

/// Writes the page beside its final name, then renames it, so that a failed write leaves no
/// half page.
fn write_page(out: &Path, page: &str) -> Result<(), CliError> {
    let mut partial = out.as_os_str().to_owned();
    partial.push(".partial");
    let partial = PathBuf::from(partial);
    let io = |action: &'static str, path: &Path| {
        let path = path.to_path_buf();
        move |source| nnx::Error::Io { action, path, source }
    };
    std::fs::write(&partial, page).map_err(io("write", &partial))?;
    std::fs::rename(&partial, out).map_err(io("rename", out))?;
    Ok(())
}

fn human_bytes(bytes: usize) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 { format!("{bytes} B") } else { format!("{value:.1} {}", UNITS[unit]) }
}

/// The dtype of an entry, or the ggml type it is stored as in a GGUF file.
fn dtype_column(archive: &Archive, entry: &EntryInfo) -> String {
    archive.ggml_type(&entry.name).map_or_else(|| entry.dtype.to_string(), |ty| ty.name().to_string())
}
