//! `nnx lora inspect ADAPTER`, `nnx lora convert ADAPTER OUT` and `nnx lora merge BASE ADAPTER
//! OUT`: LoRA adapters (PEFT, MLX-LM, GGUF) described, written in PEFT's layout, and merged
//! into the weights of the model they were trained on.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use nnx::Archive;
use nnx::adapter::{Adapter, AdapterFormat, LoraKind};

use crate::common::{CliError, copy_folder_files};

/// The arguments of `nnx lora`.
#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Subcommand)]
enum Command {
    /// Describe an adapter: format, ranks, scales, targets and size.
    Inspect {
        /// A PEFT or MLX-LM adapter folder (`adapter_config.json` beside the factors), a GGUF
        /// LoRA file, or an `hf://` path to either.
        adapter: String,
    },
    /// Write an adapter (PEFT or MLX-LM) in PEFT's layout: `adapter_config.json` and
    /// `adapter_model.safetensors`, as `PeftModel.from_pretrained` loads them.
    Convert {
        /// The adapter (as for `inspect`).
        adapter: String,
        /// The folder to write; must not exist.
        out: PathBuf,
    },
    /// Write the base model with the adapter merged into its weights, in the base's layout:
    /// a model folder gives a folder (its other files copied), a `.safetensors` file a file,
    /// a GGUF file a GGUF file (each merged tensor encoded again in its own type; a PEFT or
    /// MLX-LM adapter renamed to llama.cpp's names first).
    Merge {
        /// The base model: a transformers folder, a SafeTensors file, or a GGUF file of Llama,
        /// Qwen2/3 or Gemma 3.
        base: PathBuf,
        /// The adapter (as for `inspect`).
        adapter: String,
        /// Where to write the merged model (a folder for a folder base); must not exist.
        out: PathBuf,
    },
}

/// Runs the subcommand; returns what it prints.
pub fn run(args: Args) -> Result<String, CliError> {
    match args.command {
        Command::Inspect { adapter } => inspect(&Adapter::open_source(&adapter)?),
        Command::Merge { base, adapter, out } => merge(&base, &Adapter::open_source(&adapter)?, &out),
        Command::Convert { adapter, out } => {
            if out.exists() {
                return Err(CliError(format!("`{}` exists: name a new folder for the adapter", out.display())));
            }
            let adapter = Adapter::open_source(&adapter)?;
            adapter.save_peft(&out)?;
            Ok(format!(
                "wrote {} modules in PEFT's layout to `{}`\n",
                adapter.modules.len(),
                nnx::text::printable(&out.display().to_string())
            ))
        }
    }
}

fn inspect(adapter: &Adapter) -> Result<String, CliError> {
    let format = match adapter.format {
        AdapterFormat::Peft => "PEFT",
        AdapterFormat::Mlx => "MLX-LM",
        AdapterFormat::Gguf => "GGUF",
    };
    let (low, high) = adapter.ranks();
    let values: usize = adapter.modules.iter().map(|module| module.a.len() + module.b.len()).sum::<usize>()
        + adapter.saved.values().map(|tensor| tensor.len()).sum::<usize>();
    let mut out = String::new();
    let _ = writeln!(out, "adapter  {}", nnx::text::printable(&adapter.path.display().to_string()));
    let _ = writeln!(out, "format   {format}");
    let rank = if low == high { low.to_string() } else { format!("{low}-{high}") };
    let _ = writeln!(out, "rank     {rank}");
    if let Some(alpha) = adapter.config.get("lora_alpha").or_else(|| adapter.config.get("adapter.lora.alpha")) {
        let _ = writeln!(out, "alpha    {alpha}");
    }
    let _ = writeln!(out, "modules  {} adapted, {} saved whole", adapter.modules.len(), adapter.saved.len());
    let _ = writeln!(out, "values   {values} ({:.2} MB in f32)", values as f64 * 4.0 / 1e6);
    let _ = writeln!(out);
    let _ = writeln!(out, "{:<56} {:>9} {:>4} {:>9}  extra", "module", "kind", "r", "scale");
    for module in &adapter.modules {
        let kind = match module.kind {
            LoraKind::Projection if module.fan_in_fan_out => "linear^T",
            LoraKind::Projection => "linear",
            LoraKind::Lookup => "embedding",
        };
        let mut extra = Vec::new();
        if module.magnitude.is_some() {
            extra.push("dora");
        }
        if module.bias.is_some() {
            extra.push("bias");
        }
        let name = nnx::text::printable(&module.source);
        let _ = writeln!(out, "{name:<56} {kind:>9} {:>4} {:>9.4}  {}", module.rank(), module.scale, extra.join(","));
    }
    for (name, tensor) in &adapter.saved {
        let _ = writeln!(out, "{:<56} {:>9} {:?}", nnx::text::printable(name), "saved", tensor.shape());
    }
    Ok(out)
}

fn merge(base: &Path, adapter: &Adapter, out: &Path) -> Result<String, CliError> {
    if out.exists() {
        return Err(CliError(format!("`{}` exists: name a new path for the merged model", out.display())));
    }
    let archive = Archive::open(base)?;
    if archive.gguf_metadata().is_some() {
        // Renamed to llama.cpp's names through the architecture's own mapping, then merged
        // tensor by tensor in each tensor's type.
        let adapter = if adapter.format == AdapterFormat::Gguf {
            adapter.clone()
        } else {
            nnx::models::adapter_for_gguf(base, &archive, adapter)?
        };
        adapter.merge_gguf(&archive)?.write(out)?;
        return Ok(format!(
            "merged {} modules into `{}` (each tensor in its own type)\n",
            adapter.modules.len(),
            nnx::text::printable(&out.display().to_string())
        ));
    }
    let merged = nnx::models::lora::in_files_layout(adapter, base).merge_archive(&archive)?;
    if base.is_dir() {
        // Everything but the weights comes along (config, tokenizer, generation settings),
        // each link checked before anything is written.
        copy_folder_files(base, out, &[])?;
        merged.save(out.join("model.safetensors"))?;
    } else {
        merged.save(out)?;
    }
    Ok(format!(
        "merged {} modules of `{}` into `{}`\n",
        adapter.modules.len(),
        nnx::text::printable(&adapter.path.display().to_string()),
        nnx::text::printable(&out.display().to_string())
    ))
}
