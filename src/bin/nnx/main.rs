//! The `nnx` command line: one module per subcommand. Every command exits 0 on success and 1
//! with a one-line error on bad input or usage, except `diff`, which exits 0 when its inputs are
//! equal, 1 when they differ and 2 on error, like `diff`.

mod convert;
mod dequantize;
mod diff;
mod download;
mod inspect;
mod quantize;

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

#[derive(Parser)]
#[command(name = "nnx", version, about = "Inspect and convert model weights")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// List entries (name, dtype, shape, bytes, offsets), metadata and totals.
    ///
    /// Every input path may also be a Hub path, `hf://org/name[@revision][/file]`: it is
    /// downloaded into the shared Hugging Face cache first (or read from it when offline).
    Inspect {
        /// A `.safetensors` file, a shard index (`*.index.json`), a folder or an `hf://` path.
        path: PathBuf,
        /// Print one JSON object instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Quantize 2-D float weights (MLX affine Q4/Q8 or SeedLM SEED4/SEED4P4); other entries are
    /// copied.
    Quantize {
        /// A `.safetensors` file, a shard index, a folder or an `hf://` path.
        input: PathBuf,
        /// The output file, or folder (page-aligned shards with `config.json`).
        output: PathBuf,
        /// The encoding.
        #[arg(long, value_enum)]
        encoding: quantize::Encoding,
        /// Values per group of the affine encodings: 32, 64 or 128.
        #[arg(long, default_value_t = 64)]
        group_size: usize,
        /// Quantize the entries whose names match this glob (`*` and `?`); by default every
        /// `*.weight` of rank 2 whose last axis fits the group or block size.
        #[arg(long)]
        pattern: Option<String>,
    },
    /// Decode every quantized weight (affine, SEED4, SEED4P4) back to a float `NAME.weight`;
    /// other entries are copied.
    Dequantize {
        /// A `.safetensors` file, a shard index, a folder or an `hf://` path.
        input: PathBuf,
        /// The output file or folder.
        output: PathBuf,
        /// The float dtype of the decoded weights (default: the dtype of the scales for affine
        /// weights, BF16 for seed weights).
        #[arg(long, value_enum)]
        dtype: Option<dequantize::FloatType>,
    },
    /// Convert a PyTorch checkpoint or SafeTensors weights to SafeTensors, keeping the metadata.
    Convert {
        /// A PyTorch checkpoint (`.bin`, `.pt`, `.pth`), a `.safetensors` file, a shard index, a
        /// folder holding one of them, or an `hf://` path.
        input: PathBuf,
        /// The output `.safetensors` file; with `--max-shard-size`, a folder that receives the
        /// shards and `model.safetensors.index.json`.
        output: PathBuf,
        /// Cast every float entry to this dtype; integer and bool entries are never cast.
        #[arg(long, value_enum)]
        dtype: Option<dequantize::FloatType>,
        /// Start the data on a 16 KiB page and each page-sized entry on a page boundary.
        #[arg(long)]
        page_align: bool,
        /// Write a sharded folder with shards of at most this size: bytes (`1000000`) or a
        /// size with a unit (`500MB`, `2GB`, `10GiB`).
        #[arg(long, value_name = "SIZE", value_parser = convert::parse_size)]
        max_shard_size: Option<u64>,
        /// Keep only the entries named PREFIX or PREFIX.*; their names are kept whole.
        #[arg(long, value_name = "PREFIX")]
        select: Option<String>,
        /// Write entries whose layout repeats their stored elements (a zero stride) into more
        /// than 16 times their stored bytes plus 64 MiB; such entries are refused by default,
        /// since a file of a few bytes can describe gigabytes that way.
        #[arg(long)]
        allow_expansion: bool,
    },
    /// Compare the tensors of two checkpoints of any format: names only in one, dtype or shape
    /// differences, and the largest difference and the count of differing elements of the
    /// others. Exits 0 when equal, 1 when different, 2 on error.
    Diff {
        /// The first checkpoint (any format or `hf://` path `convert` reads).
        a: PathBuf,
        /// The second checkpoint.
        b: PathBuf,
        /// Print one JSON object instead of a table.
        #[arg(long)]
        json: bool,
        /// Float elements differ when `|a - b|` exceeds this; integers and bools must be equal.
        #[arg(long, default_value_t = 0.0, value_name = "X", value_parser = diff::parse_tolerance)]
        atol: f64,
    },
    /// Download a model from the Hugging Face Hub into the shared cache (`HF_HUB_CACHE`,
    /// `HF_HOME`, `HF_ENDPOINT`, `HF_TOKEN` and `HF_HUB_OFFLINE` as for `huggingface_hub`) and
    /// print its snapshot folder as the last line.
    Download {
        /// A repository id (`org/name`) or `hf://org/name[@revision]`.
        repo: String,
        /// A branch, tag or commit (default `main`).
        #[arg(long)]
        revision: Option<String>,
        /// Download the files matching this glob (`*` crosses folders; `sub/` means all under
        /// it) instead of what a load of the model needs; `--include '*'` downloads everything.
        #[arg(long, value_name = "GLOB")]
        include: Vec<String>,
    },
}

/// A path the user gave: `hf://` paths become the local files of the Hugging Face cache.
fn local(path: PathBuf) -> Result<PathBuf, CliError> {
    match path.to_str() {
        Some(text) if text.starts_with(nnx::hub::HubPath::SCHEME) => Ok(nnx::hub::local_path(text)?),
        _ => Ok(path),
    }
}

/// A command's failure, printed as one line after `error: `.
#[derive(Debug)]
pub struct CliError(pub String);

impl std::fmt::Display for CliError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl<E: std::error::Error> From<E> for CliError {
    fn from(error: E) -> CliError {
        CliError(error.to_string())
    }
}

/// Where a converting command writes.
pub struct Output;

impl Output {
    /// A folder when the input is one, the output already is one, or the output is spelled
    /// with a trailing `/`; otherwise a file.
    pub fn is_folder(input: &std::path::Path, output: &std::path::Path) -> bool {
        input.is_dir() || output.is_dir() || output.as_os_str().to_string_lossy().ends_with('/')
    }
}

/// A progress bar counting `unit`s, drawn on stderr when it is a terminal and hidden otherwise.
pub fn progress_bar(total: u64, unit: &str) -> ProgressBar {
    let target =
        if std::io::stderr().is_terminal() { ProgressDrawTarget::stderr() } else { ProgressDrawTarget::hidden() };
    let bar = ProgressBar::with_draw_target(Some(total), target);
    let template =
        format!("{{spinner}} [{{elapsed_precise}}] {{bar:40}} {{pos}}/{{len}} {unit} ({{eta}} left) {{msg}}");
    if let Ok(style) = ProgressStyle::with_template(&template) {
        bar.set_style(style);
    }
    bar
}

/// Prints `error` as the one `error:` line: its lines joined, and every control character
/// escaped, since messages quote names, metadata and server replies that came from outside.
fn print_error(error: &CliError) {
    eprintln!("error: {}", nnx::text::printable(&error.to_string().replace('\n', "; ")));
}

/// A command's output with control characters escaped line by line: the commands escape what
/// they quote from files, and this keeps any text they missed from acting on the terminal.
fn printable_lines(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.split_inclusive('\n') {
        let (line, newline) = line.strip_suffix('\n').map_or((line, ""), |line| (line, "\n"));
        out.push_str(&nnx::text::printable(line));
        out.push_str(newline);
    }
    out
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => {
            // `diff` reports trouble with 2, so that 1 always means "different".
            let trouble = if std::env::args_os().nth(1).is_some_and(|command| command == "diff") { 2 } else { 1 };
            let code = if error.use_stderr() { trouble } else { 0 };
            let _ = error.print();
            return ExitCode::from(code);
        }
    };
    let result = match cli.command {
        Command::Inspect { path, json } => {
            local(path).and_then(|path| inspect::run(&path, json).map_err(CliError::from))
        }
        Command::Quantize { input, output, encoding, group_size, pattern } => {
            local(input).and_then(|input| quantize::run(&input, &output, encoding, group_size, pattern.as_deref()))
        }
        Command::Dequantize { input, output, dtype } => {
            local(input).and_then(|input| dequantize::run(&input, &output, dtype))
        }
        Command::Download { repo, revision, include } => download::run(&repo, revision.as_deref(), &include),
        Command::Convert { input, output, dtype, page_align, max_shard_size, select, allow_expansion } => {
            let options = convert::Options {
                dtype: dtype.map(dequantize::FloatType::dtype),
                page_align,
                max_shard_bytes: max_shard_size,
                select,
                allow_expansion,
            };
            local(input).and_then(|input| convert::run(&input, &output, &options))
        }
        Command::Diff { a, b, json, atol } => {
            let inputs = local(a).and_then(|a| Ok((a, local(b)?)));
            return match inputs.and_then(|(a, b)| diff::run(&a, &b, json, atol)) {
                Ok((text, equal)) => {
                    print!("{}", printable_lines(&text));
                    ExitCode::from(if equal { 0 } else { 1 })
                }
                Err(error) => {
                    print_error(&error);
                    ExitCode::from(2)
                }
            };
        }
    };
    match result {
        Ok(text) => {
            print!("{}", printable_lines(&text));
            ExitCode::SUCCESS
        }
        Err(error) => {
            print_error(&error);
            ExitCode::from(1)
        }
    }
}
