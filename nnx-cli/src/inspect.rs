//! `nnx inspect PATH [--json | --html OUT.html]`: names, dtypes, shapes, bytes, offsets,
//! metadata and totals of a SafeTensors file, shard index, folder or GGUF file (with each
//! tensor's ggml type and bits per weight, shapes in ggml's order as `gguf-dump` prints them,
//! and `general.file_type` named as llama.cpp names it), from headers alone, then the
//! parameters, the tensors, bytes and bits per weight of each type, and with `--stats` and
//! `--model ARCH` the statistics and the import plan. Names and metadata come from the file and
//! are printed escaped ([`nnx::text::printable`]); the JSON form escapes them as JSON does.
//!
//! `--json` and `--html` give the whole report ([`crate::report`]): files with sha256, types
//! and bits per weight, the quantization map, metadata, a memory plan, and with `--stats` and
//! `--model ARCH` the statistics and the import plan; `--html` draws it as one offline page.

use std::path::{Path, PathBuf};

use nnx::text::printable;
use nnx::{Archive, EntryInfo};

use crate::common::{CliError, open_archive};
use crate::report::{Plan, Summary};

/// llama.cpp's names of `general.file_type` values (`enum llama_ftype` in `llama.h`, without
/// its `LLAMA_FTYPE_` prefix); the numbers it skips were types it has removed.
const FILE_TYPES: &[(u64, &str)] = &[
    (0, "ALL_F32"),
    (1, "MOSTLY_F16"),
    (2, "MOSTLY_Q4_0"),
    (3, "MOSTLY_Q4_1"),
    (7, "MOSTLY_Q8_0"),
    (8, "MOSTLY_Q5_0"),
    (9, "MOSTLY_Q5_1"),
    (10, "MOSTLY_Q2_K"),
    (11, "MOSTLY_Q3_K_S"),
    (12, "MOSTLY_Q3_K_M"),
    (13, "MOSTLY_Q3_K_L"),
    (14, "MOSTLY_Q4_K_S"),
    (15, "MOSTLY_Q4_K_M"),
    (16, "MOSTLY_Q5_K_S"),
    (17, "MOSTLY_Q5_K_M"),
    (18, "MOSTLY_Q6_K"),
    (19, "MOSTLY_IQ2_XXS"),
    (20, "MOSTLY_IQ2_XS"),
    (21, "MOSTLY_Q2_K_S"),
    (22, "MOSTLY_IQ3_XS"),
    (23, "MOSTLY_IQ3_XXS"),
    (24, "MOSTLY_IQ1_S"),
    (25, "MOSTLY_IQ4_NL"),
    (26, "MOSTLY_IQ3_S"),
    (27, "MOSTLY_IQ3_M"),
    (28, "MOSTLY_IQ2_S"),
    (29, "MOSTLY_IQ2_M"),
    (30, "MOSTLY_IQ4_XS"),
    (31, "MOSTLY_IQ1_M"),
    (32, "MOSTLY_BF16"),
    (36, "MOSTLY_TQ1_0"),
    (37, "MOSTLY_TQ2_0"),
    (38, "MOSTLY_MXFP4_MOE"),
    (39, "MOSTLY_NVFP4"),
    (40, "MOSTLY_Q1_0"),
    (1024, "GUESSED"),
];

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
    /// Add every tensor's statistics (min, max, mean, std, histogram, outliers) and what they
    /// find: reads every value.
    #[arg(long)]
    stats: bool,
    // Its help lists the family table's names.
    #[arg(long, value_name = "ARCH", value_parser = crate::report::parse_architecture, help = crate::report::model_help())]
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
    let summary = Summary::of(&path, &archive)?;
    let mut out = listing(&path, &archive, &summary);
    if stats {
        out.push_str(&statistics(&path, &archive)?);
    }
    if let Some(architecture) = model {
        out.push_str(&plan_lines(&crate::report::plan(&path, &archive, &architecture)?, &archive));
    }
    Ok(out)
}

/// The characters of a metadata value the listing shows.
const SHOWN_VALUE_CHARS: usize = 200;

/// A metadata value as the listing shows it: escaped, and cut after [`SHOWN_VALUE_CHARS`]
/// characters with its size (a vocabulary or a GGUF's typed metadata kept in SafeTensors runs
/// to megabytes; `--json` has it whole).
fn shortened(value: &str) -> String {
    match value.char_indices().nth(SHOWN_VALUE_CHARS) {
        Some((at, _)) => format!("{}... ({} bytes; `--json` shows it whole)", printable(&value[..at]), value.len()),
        None => printable(value).into_owned(),
    }
}

/// The listing: the entries of `archive` (opened from `path`), its metadata, and the
/// summary's parameters and per-type totals, the totals last.
fn listing(path: &Path, archive: &Archive, summary: &Summary) -> String {
    let gguf = archive.gguf_metadata().is_some();
    let entries: Vec<&EntryInfo> = summary.entries.iter().map(|entry| &entry.info).collect();
    // Saturating: views read from a file may each describe up to `isize::MAX` bytes.
    let total = entries.iter().fold(0usize, |total, entry| total.saturating_add(entry.bytes));
    let mut out = format!("{}: {} entries, {}\n", path.display(), entries.len(), human_bytes(total));
    if !archive.metadata().is_empty() {
        out.push_str("metadata:\n");
        for (key, value) in archive.metadata() {
            // Metadata is the file's own text: escaped, so that it cannot act on the terminal.
            let named = if gguf && key == "general.file_type" { file_type_name(value) } else { None };
            let value = match named {
                Some(name) => format!("{} ({name})", printable(value)),
                None => shortened(value),
            };
            out.push_str(&format!("  {} = {value}\n", printable(key)));
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
            // GGUF shapes as the file and `gguf-dump` give them: ggml's `ne`, fastest axis first.
            let shape: Vec<usize> =
                if gguf { entry.shape.iter().rev().copied().collect() } else { entry.shape.clone() };
            [
                printable(&entry.name).into_owned(),
                dtype_column(archive, entry),
                format!("{shape:?}"),
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
    if gguf {
        // GGUF entries are ggml types: their bits per weight say what the type costs.
        header[1] = "type";
        header[2] = "shape (ggml ne)";
        header.insert(2, "bpw");
        for (row, entry) in rows.iter_mut().zip(&entries) {
            let bits = archive.ggml_type(&entry.name).map_or(String::new(), |ty| bits(ty.bits_per_weight()));
            row.insert(2, bits);
        }
    }
    out.push_str(&nnx::__private::render_columns(&header, &rows));
    out.push_str("types:\n");
    let types: Vec<Vec<String>> = summary
        .types
        .iter()
        .map(|total| {
            vec![
                format!("  {}", printable(&total.ty)),
                total.tensors.to_string(),
                total.parameters.to_string(),
                total.bytes.to_string(),
                total.bits_per_weight().map_or(String::new(), bits),
            ]
        })
        .collect();
    out.push_str(&nnx::__private::render_columns(&["  type", "tensors", "parameters", "bytes", "bpw"], &types));
    let per_weight =
        summary.bits_per_weight().map_or(String::new(), |value| format!(", {} bits per weight", bits(value)));
    out.push_str(&format!("parameters: {}{per_weight}\n", summary.parameters));
    out.push_str(&format!("total: {} entries, {total} bytes\n", entries.len()));
    out
}

/// Bits per weight with at most four decimals and no trailing zeros (`4.5`, `6.5625`).
fn bits(value: f64) -> String {
    let text = format!("{value:.4}");
    text.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// llama.cpp's name of a `general.file_type` value (`15`: `MOSTLY_Q4_K_M`).
fn file_type_name(value: &str) -> Option<&'static str> {
    let number: u64 = value.trim().parse().ok()?;
    FILE_TYPES.iter().find(|(known, _)| *known == number).map(|(_, name)| *name)
}

/// Every tensor's statistics as a table, then what they find, a line each.
fn statistics(path: &Path, archive: &Archive) -> Result<String, CliError> {
    let folder = crate::stats::quantized_folder(path, archive)?;
    let tensors = crate::stats::collect(path, archive, folder.as_ref(), true)?;
    let mut out = String::from("\nstatistics:\n");
    out.push_str(&crate::stats::table(&tensors, archive.gguf_metadata().is_some()));
    for finding in crate::report::stats_findings(&tensors) {
        let (level, message) =
            (finding["level"].as_str().unwrap_or_default(), finding["message"].as_str().unwrap_or_default());
        out.push_str(&format!("{level}: {}\n", printable(message)));
    }
    Ok(out)
}

/// The import plan as lines: its verdict, each model tensor with the entry it reads, the
/// operations and the types and shapes (row-major, as the model holds them), then the entries
/// the model does not read and the problems.
fn plan_lines(plan: &Plan, archive: &Archive) -> String {
    let verdict = match plan.problems.len() {
        0 => "valid".to_string(),
        problems => format!("{problems} problems"),
    };
    let order = if archive.gguf_metadata().is_some() { ", shapes row-major (ggml ne reversed)" } else { "" };
    let mut out = format!(
        "\nimport plan into {} ({}): {verdict}, {} tensors{order}\n",
        plan.target,
        plan.architecture,
        plan.rows.len()
    );
    let shaped = |dtype: Option<&str>, shape: Option<&[usize]>| match (dtype, shape) {
        (Some(dtype), Some(shape)) => format!("{dtype} {shape:?}"),
        (Some(dtype), None) => dtype.to_string(),
        _ => String::new(),
    };
    let rows: Vec<Vec<String>> = plan
        .rows
        .iter()
        .map(|row| {
            let status = match (&row.problem, &row.tie) {
                (Some(problem), _) => format!("{}: {problem}", row.action),
                (None, Some(tie)) => format!("tie -> {tie}"),
                (None, None) => row.action.to_string(),
            };
            vec![
                printable(&row.field).into_owned(),
                "<-".to_string(),
                printable(&row.source).into_owned(),
                row.ops.join(" "),
                shaped(row.stored_dtype.as_deref(), row.stored_shape.as_deref()),
                shaped(Some(&row.dtype), Some(&row.shape)),
                status,
            ]
        })
        .collect();
    out.push_str(&nnx::__private::render_columns(
        &["model", "", "source", "ops", "stored", "read as", "action"],
        &rows,
    ));
    if !plan.unexpected.is_empty() {
        out.push_str(&format!("unexpected entries ({}):\n", plan.unexpected.len()));
        for name in &plan.unexpected {
            out.push_str(&format!("  {}\n", printable(name)));
        }
    }
    if !plan.problems.is_empty() {
        out.push_str(&format!("problems ({}):\n", plan.problems.len()));
        for problem in &plan.problems {
            out.push_str(&format!("  {}\n", printable(problem)));
        }
    }
    out
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
    if let Some(encoding) = archive.encoding(&entry.name) {
        // Decoded when read (a published checkpoint's FP8 or GPTQ weight): the scheme, then
        // the dtype it reads as.
        return format!("{encoding} -> {}", entry.dtype);
    }
    archive.ggml_type(&entry.name).map_or_else(|| entry.dtype.to_string(), |ty| ty.name().to_string())
}

#[cfg(test)]
mod tests {
    use super::file_type_name;
    use crate::report::parse_architecture;

    #[test]
    fn file_types_are_named_as_llama_cpp_names_them() {
        assert_eq!(file_type_name("15"), Some("MOSTLY_Q4_K_M"));
        assert_eq!(file_type_name("0"), Some("ALL_F32"));
        assert_eq!(file_type_name("38"), Some("MOSTLY_MXFP4_MOE"));
        assert_eq!(file_type_name("5"), None, "a removed type");
        assert_eq!(file_type_name("q4"), None);
        // Every mixture nnx writes declares the number llama.cpp names after it.
        let mixtures = [
            "q4_0",
            "q4_1",
            "q5_0",
            "q5_1",
            "tq1_0",
            "tq2_0",
            "q2_k",
            "q3_k_s",
            "q3_k_m",
            "q3_k_l",
            "q4_k_s",
            "q4_k_m",
            "q5_k_s",
            "q5_k_m",
            "q6_k",
            "q8_0",
            "iq4_nl",
            "iq4_xs",
            "mxfp4_moe",
        ];
        for mixture in mixtures {
            let recipe = nnx::gguf::Recipe::parse(mixture).unwrap();
            let name = file_type_name(&recipe.file_type().to_string());
            assert_eq!(name, Some(format!("MOSTLY_{}", mixture.to_uppercase()).as_str()), "{mixture}");
        }
    }

    #[test]
    fn architectures_are_checked_with_a_suggestion() {
        assert_eq!(parse_architecture("gpt2").as_deref(), Ok("gpt2"));
        let error = parse_architecture("bret").unwrap_err();
        assert!(
            error.starts_with("`bret` is not an architecture nnx plans imports into (did you mean `bert`?)"),
            "{error}"
        );
        assert!(error.contains("`bert`") && error.contains("`gpt2`") && error.contains("`llama`"), "{error}");
        assert!(!parse_architecture("mamba").unwrap_err().contains("did you mean"));
        assert!(parse_architecture("Llama").unwrap_err().contains("(did you mean `llama`?)"));
        assert!(parse_architecture("qwne2").unwrap_err().contains("(did you mean `qwen2`?)"));
    }
}
