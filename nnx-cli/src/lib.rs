//! The `nnx` command line: one module per subcommand. Every command exits 0 on success and 1
//! with a one-line error on bad input or usage, except `diff`, which exits 0 when its inputs are
//! equal, 1 when they differ and 2 on error, like `diff`. A library too, so that the Python
//! package runs the same conversions ([`convert`]).

mod common;
mod convert;
mod dequantize;
mod diff;
mod download;
mod embed;
mod inspect;
mod lora;
mod page;
mod perplexity;
mod plan;
mod quantize;
mod report;
mod run;
mod stats;
mod to_gguf;
mod tokenize;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::common::CliError;

#[derive(Parser)]
#[command(name = "nnx", version, about = "Inspect and convert model weights")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

// A variant's doc comment is its command's help; the flags are documented on each `Args`.
#[derive(Subcommand)]
enum Command {
    /// List entries (name, dtype, shape, bytes, offsets), metadata and totals.
    ///
    /// Every input path may also be a Hub path, `hf://org/name[@revision][/file]`: SafeTensors
    /// and GGUF weights are read in place with range requests (`inspect`, `diff`, `convert`); other
    /// formats, and every Hub path when offline, come from the shared Hugging Face cache.
    Inspect(inspect::Args),
    /// Quantize 2-D float weights (MLX affine Q4/Q8 or SeedLM SEED4/SEED4P4); other entries are
    /// copied.
    Quantize(quantize::Args),
    /// Decode every quantized weight (affine, SEED4, SEED4P4) back to a float `NAME.weight`;
    /// other entries are copied.
    Dequantize(dequantize::Args),
    /// Convert PyTorch, SafeTensors or GGUF weights to SafeTensors, or to GGUF with llama.cpp's
    /// types and mixtures (`--type q4_k_m`), keeping the metadata.
    Convert(convert::Args),
    /// Compare the tensors of two checkpoints of any format: names only in one, dtype or shape
    /// differences, and the largest difference and the count of differing elements of the
    /// others. Exits 0 when equal, 1 when different, 2 on error.
    Diff(diff::Args),
    /// Download a model from the Hugging Face Hub into the shared cache (`HF_HUB_CACHE`,
    /// `HF_HOME`, `HF_ENDPOINT`, `HF_TOKEN` and `HF_HUB_OFFLINE` as for `huggingface_hub`) and
    /// print its snapshot folder as the last line.
    Download(download::Args),
    /// Print the token ids of a text as a JSON array, as the model's tokenizer (a GGUF file's,
    /// or a folder's `tokenizer.json`) gives them, with the BOS it adds.
    Tokenize(tokenize::Args),
    /// Generate text with a model (GGUF, transformers or mlx-community folder, `hf://`),
    /// streamed as it comes; without `--prompt`, a chat read from stdin a line per turn.
    Run(run::Args),
    /// Sentence embeddings with an encoder (a sentence-transformers BERT folder or Hub
    /// repository), pooled and normalized as its `modules.json` says; texts from the arguments
    /// or stdin a line each; with two texts or more, their cosine similarities.
    Embed(embed::Args),
    /// The perplexity of a model on a text, computed as llama.cpp's `llama-perplexity`
    /// computes it: chunks of `--ctx` tokens, each scored on its second half.
    Perplexity(perplexity::Args),
    /// Per-tensor statistics (min, max, mean, std, absmax, zeros, NaN, Inf, a histogram),
    /// quantized weights decoded; `--check` exits 1 for NaN, infinities or all-zero weight
    /// matrices (not biases or norms, which a trained model may hold at zero).
    Stats(stats::Args),
    /// LoRA adapters (PEFT, MLX-LM, GGUF): `inspect` describes one, `merge` writes a base
    /// model with one merged into its weights.
    Lora(lora::Args),
    /// Which byte ranges of which files each of N ranks reads to hold its slice of every
    /// tensor (`--tp N`), from headers alone, with bytes per rank and read amplification.
    Plan(plan::Args),
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

/// Runs `command` on one of rayon's threads, so that the model's products split between the
/// thread that runs the model and the others, instead of being handed to the pool and waited
/// for (each decoded token runs a few hundred products). `threads` sizes the pool (default: one
/// thread per core).
fn on_the_pool<T: Send>(threads: Option<usize>, command: impl FnOnce() -> T + Send) -> T {
    match rayon::ThreadPoolBuilder::new().num_threads(threads.unwrap_or(0)).build() {
        Ok(pool) => pool.install(command),
        Err(_) => command(),
    }
}

/// The exit of a command whose success carries a verdict: its text printed, 1 when `flagged`
/// (0 otherwise); on error the `error:` line and `trouble`.
fn verdict(result: Result<(String, bool), CliError>, trouble: u8) -> ExitCode {
    match result {
        Ok((text, flagged)) => {
            print!("{}", printable_lines(&text));
            ExitCode::from(u8::from(flagged))
        }
        Err(error) => {
            print_error(&error);
            ExitCode::from(trouble)
        }
    }
}

/// Names a private runtime folder when `XDG_RUNTIME_DIR` is unset, before the GPU is opened:
/// Mesa's Vulkan drivers print an `error:` line of their own without one, which reads as nnx's.
fn gpu_runtime_folder() {
    #[cfg(target_os = "linux")]
    if std::env::var_os("XDG_RUNTIME_DIR").is_none() {
        use std::os::unix::fs::DirBuilderExt;
        let user: String =
            std::env::var("USER").unwrap_or_default().chars().filter(char::is_ascii_alphanumeric).collect();
        let folder = std::env::temp_dir().join(format!("nnx-runtime-{user}"));
        let made = std::fs::DirBuilder::new().mode(0o700).create(&folder);
        if made.is_ok() || folder.is_dir() {
            // SAFETY: called from `main` before any other thread is started, so nothing reads
            // the environment while it changes.
            unsafe { std::env::set_var("XDG_RUNTIME_DIR", &folder) };
        }
    }
}

/// Runs the command line of the process's arguments; the exit code of the command.
pub fn main() -> ExitCode {
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
        Command::Inspect(args) => inspect::run(args),
        Command::Quantize(args) => quantize::run(args),
        Command::Dequantize(args) => dequantize::run(args),
        Command::Download(args) => download::run(args),
        Command::Convert(args) => convert::run(args),
        Command::Plan(args) => plan::run(args),
        Command::Tokenize(args) => tokenize::run(args),
        Command::Run(args) => {
            if args.device == run::DeviceChoice::Gpu {
                gpu_runtime_folder();
            }
            on_the_pool(args.threads, || run::run(args))
        }
        Command::Embed(args) => {
            if args.device == run::DeviceChoice::Gpu {
                gpu_runtime_folder();
            }
            on_the_pool(None, || embed::run(args))
        }
        Command::Perplexity(args) => on_the_pool(None, || perplexity::run(args)),
        Command::Lora(args) => lora::run(args),
        // `stats --check` fails with 1; `diff` says 1 for different and 2 for trouble.
        Command::Stats(args) => return verdict(on_the_pool(None, || stats::run(args)), 1),
        Command::Diff(args) => return verdict(diff::run(args).map(|(text, equal)| (text, !equal)), 2),
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

/// Runs `nnx convert` with `args` (what follows `convert` on a command line), without printing:
/// the summary line, or the error as one line (a usage error as clap words it).
///
/// # Errors
/// The command's error message.
pub fn convert<I, T>(args: I) -> Result<String, String>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    use clap::{Args, Command as ClapCommand, FromArgMatches};
    let command = convert::Args::augment_args(ClapCommand::new("convert").no_binary_name(true));
    let matches = command.try_get_matches_from(args).map_err(|error| error.to_string().trim().to_string())?;
    let args = convert::Args::from_arg_matches(&matches).map_err(|error| error.to_string())?;
    convert::run(args).map_err(|error| error.to_string().replace('\n', "; "))
}
