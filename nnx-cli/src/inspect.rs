//! `nnx inspect PATH [--json]`: names, dtypes, shapes, bytes, offsets, metadata and totals of
//! a SafeTensors file, shard index, folder or GGUF file (with each tensor's ggml type and bits
//! per weight), from headers alone. Names and metadata come from
//! the file and are printed escaped ([`nnx::text::printable`]); the JSON form escapes them as
//! JSON does.

use std::path::{Path, PathBuf};

use nnx::text::printable;
use nnx::{Archive, EntryInfo};

use crate::common::{CliError, open_archive};

/// The arguments of `nnx inspect`.
#[derive(clap::Args)]
pub struct Args {
    /// A `.safetensors` file, a shard index (`*.index.json`), a folder or an `hf://` path.
    path: PathBuf,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

/// Lists what the path holds, as a table or one JSON object.
pub fn run(args: Args) -> Result<String, CliError> {
    let Args { path, json } = args;
    let (path, archive) = open_archive(path)?;
    let path: &Path = &path;
    let entries: Vec<EntryInfo> = archive.names().map(|name| archive.info(name)).collect::<nnx::Result<_>>()?;
    let total: usize = entries.iter().map(|entry| entry.bytes).sum();
    if json {
        return Ok(inspect_json(path, &archive, &entries, total) + "\n");
    }
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

fn inspect_json(path: &Path, archive: &Archive, entries: &[EntryInfo], total: usize) -> String {
    let entries: Vec<serde_json::Value> = entries
        .iter()
        .map(|entry| {
            let mut value = serde_json::json!({
                "name": entry.name,
                "dtype": entry.dtype.to_string(),
                "shape": entry.shape,
                "bytes": entry.bytes,
            });
            if let Some(ty) = archive.ggml_type(&entry.name) {
                value["ggml_type"] = serde_json::json!(ty.name());
                value["bits_per_weight"] = serde_json::json!(ty.bits_per_weight());
            }
            if let Some(location) = &entry.location {
                value["data_offsets"] = serde_json::json!([location.data_offsets.0, location.data_offsets.1]);
                value["file_offset"] = serde_json::json!(location.file_offset);
                value["file"] = serde_json::json!(location.path.to_string_lossy());
            }
            value
        })
        .collect();
    serde_json::json!({
        "path": path.to_string_lossy(),
        "metadata": archive.metadata(),
        "entries": entries,
        "count": entries.len(),
        "total_bytes": total,
    })
    .to_string()
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
