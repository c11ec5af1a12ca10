//! `nnx inspect PATH [--json]`: names, dtypes, shapes, bytes, offsets, metadata and totals of
//! a SafeTensors file, shard index or folder, from headers alone. Names and metadata come from
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
                entry.dtype.to_string(),
                format!("{:?}", entry.shape),
                entry.bytes.to_string(),
                offsets,
                file,
            ]
        })
        .collect();
    let header = ["name", "dtype", "shape", "bytes", "offsets", "file"];
    let columns = if sharded { 6 } else { 5 };
    let rows: Vec<Vec<String>> = rows.into_iter().map(|row| row[..columns].to_vec()).collect();
    out.push_str(&nnx::__private::render_columns(&header[..columns], &rows));
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
