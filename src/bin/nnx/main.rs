//! The `nnx` command line: one module per subcommand. Every command exits 0 on success and 1
//! with a one-line error on bad input or usage.

mod dequantize;
mod inspect;
mod quantize;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "nnx", version, about = "Inspect and convert model weights")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// List entries (name, dtype, shape, bytes, offsets), metadata and totals.
    Inspect {
        /// A `.safetensors` file, a shard index (`*.index.json`) or a folder.
        path: PathBuf,
        /// Print one JSON object instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Quantize 2-D float weights (MLX affine Q4/Q8 or SeedLM SEED4/SEED4P4); other entries are
    /// copied.
    Quantize {
        /// A `.safetensors` file, a shard index or a folder.
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
        /// A `.safetensors` file, a shard index or a folder.
        input: PathBuf,
        /// The output file or folder.
        output: PathBuf,
        /// The float dtype of the decoded weights (default: the dtype of the scales for affine
        /// weights, BF16 for seed weights).
        #[arg(long, value_enum)]
        dtype: Option<dequantize::FloatType>,
    },
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

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => {
            let code = if error.use_stderr() { 1 } else { 0 };
            let _ = error.print();
            return ExitCode::from(code);
        }
    };
    let result = match cli.command {
        Command::Inspect { path, json } => inspect::run(&path, json).map_err(CliError::from),
        Command::Quantize { input, output, encoding, group_size, pattern } => {
            quantize::run(&input, &output, encoding, group_size, pattern.as_deref())
        }
        Command::Dequantize { input, output, dtype } => dequantize::run(&input, &output, dtype),
    };
    match result {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("error: {}", error.to_string().replace('\n', "; "));
            ExitCode::from(1)
        }
    }
}
