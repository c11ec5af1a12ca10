//! `nnx quantize IN OUT --encoding q4|q8|seed4|seed4p4 [--group-size N] [--pattern GLOB]`:
//! quantizes the 2-D float weights of a SafeTensors file or folder and copies every other entry
//! (and a folder's other files). The result is SafeTensors: a file named `.safetensors`, or a
//! model folder.

use std::path::{Path, PathBuf};

use indicatif::ProgressBar;
use nnx::quant::{AffineSpec, AffineWeight, EncodeOptions, SeedEncoding, SeedWeight};
use nnx::quantized::{EncodedWeight, QuantizationConfig, QuantizedFolder, save_folder};
use nnx::{Archive, SaveOptions, Tensor};

use crate::common::{CliError, Output, copy_folder_files, local, progress_bar};

/// The arguments of `nnx quantize`.
#[derive(clap::Args)]
pub struct Args {
    /// A `.safetensors` file, a shard index, a folder or an `hf://` path.
    input: PathBuf,
    /// The output `.safetensors` file (the extension is added to a name without it), or folder
    /// (page-aligned shards with `config.json`, and the input folder's other files: tokenizer,
    /// generation settings, chat template).
    output: PathBuf,
    /// The encoding.
    #[arg(long, value_enum)]
    encoding: Encoding,
    /// Values per group of the affine encodings: 32, 64 or 128.
    #[arg(long, default_value_t = 64)]
    group_size: usize,
    /// Quantize the entries whose names match this glob (`*` and `?`); by default every
    /// `*.weight` of rank 2 whose last axis fits the group or block size.
    #[arg(long)]
    pattern: Option<String>,
}

/// The encodings `--encoding` takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Encoding {
    /// MLX affine, 4 bits.
    Q4,
    /// MLX affine, 8 bits.
    Q8,
    /// SeedLM, 3 coefficients per block of 8 (4 bits per weight).
    Seed4,
    /// SeedLM, 4 coefficients per block of 8 (4.5 bits per weight).
    Seed4p4,
}

impl Encoding {
    fn seed(self) -> Option<SeedEncoding> {
        match self {
            Encoding::Seed4 => Some(SeedEncoding::Seed4),
            Encoding::Seed4p4 => Some(SeedEncoding::Seed4P4),
            _ => None,
        }
    }
}

/// Whether `name` matches a glob of `*` (any run of characters) and `?` (one character).
pub fn glob_matches(pattern: &str, name: &str) -> bool {
    let (pattern, name): (Vec<char>, Vec<char>) = (pattern.chars().collect(), name.chars().collect());
    let (mut p, mut n) = (0, 0);
    let mut backtrack: Option<(usize, usize)> = None;
    while n < name.len() {
        if p < pattern.len() && (pattern[p] == '?' || pattern[p] == name[n]) {
            p += 1;
            n += 1;
        } else if p < pattern.len() && pattern[p] == '*' {
            backtrack = Some((p, n));
            p += 1;
        } else if let Some((star, at)) = backtrack {
            p = star + 1;
            n = at + 1;
            backtrack = Some((star, at + 1));
        } else {
            return false;
        }
    }
    pattern[p..].iter().all(|&c| c == '*')
}

/// Why a weight the pattern names cannot be quantized, or `None` when it can.
fn unfit(archive: &Archive, name: &str, multiple: usize) -> nnx::Result<Option<String>> {
    let info = archive.info(name)?;
    Ok(if !info.dtype.is_castable_float() {
        Some(format!("it is {}, not a float", info.dtype))
    } else if info.shape.len() != 2 {
        Some(format!("it has shape {:?}, not rank 2", info.shape))
    } else if info.shape[1] == 0 || !info.shape[1].is_multiple_of(multiple) {
        Some(format!("its last axis ({}) is not a multiple of {multiple}", info.shape[1]))
    } else {
        None
    })
}

/// Runs the command; returns the summary line.
pub fn run(args: Args) -> Result<String, CliError> {
    let Args { input, output, encoding, group_size, pattern } = args;
    let input = &local(input)?;
    let (output, pattern) = (&destination(input, &output, encoding)?, pattern.as_deref());
    let folder = QuantizedFolder::open(input)?;
    let archive = folder.archive();
    let spec = match encoding {
        Encoding::Q4 => Some(AffineSpec::new(4, group_size)?),
        Encoding::Q8 => Some(AffineSpec::new(8, group_size)?),
        _ => None,
    };
    let multiple = match encoding.seed() {
        Some(SeedEncoding::Seed4) => 8,
        Some(SeedEncoding::Seed4P4) => 16,
        None => group_size,
    };
    let mut chosen = Vec::new();
    for name in archive.names() {
        let named = match pattern {
            Some(pattern) => glob_matches(pattern, name),
            None => name.ends_with(".weight"),
        };
        if !named {
            continue;
        }
        match unfit(archive, name, multiple)? {
            None => chosen.push(name.to_string()),
            Some(reason) if pattern.is_some() => {
                return Err(CliError(format!("`{name}` matches the pattern but cannot be quantized: {reason}")));
            }
            Some(_) => {}
        }
    }
    if chosen.is_empty() {
        return Err(CliError(format!(
            "no weight to quantize in `{}`: pass `--pattern` naming rank-2 float entries whose last axis is a multiple of {multiple}",
            input.display()
        )));
    }
    let total: u64 = match encoding.seed() {
        Some(_) => chosen
            .iter()
            .map(|name| archive.info(name).map(|info| (info.shape[0] * info.shape[1] / 8) as u64))
            .sum::<nnx::Result<u64>>()?,
        None => chosen.len() as u64,
    };
    let bar = progress_bar(total, if encoding.seed().is_some() { "blocks" } else { "weights" });
    let mut out = Archive::new();
    let mut quantized = 0;
    let mut stems = Vec::new();
    for name in archive.names() {
        let tensor = archive.try_get(name)?;
        if !chosen.iter().any(|chosen| chosen == name) {
            out.insert(name, tensor);
            continue;
        }
        let stem = name.strip_suffix(".weight").unwrap_or(name);
        stems.push(stem.to_string());
        bar.set_message(stem.to_string());
        // Encoding reads every value: a view that repeats a few stored bytes into gigabytes is
        // refused before it is copied.
        if let Err(error) = tensor.check_expansion(tensor.expansion_limit()) {
            let layout = crate::convert::expansion(&error).unwrap_or_else(|| error.to_string());
            return Err(CliError(format!(
                "cannot quantize `{}` of `{}`: {layout}: save the weight contiguous and quantize that file",
                nnx::text::printable(name),
                input.display()
            )));
        }
        let encoded = encode(&tensor, spec, encoding.seed(), &bar)?;
        for (entry, stream) in encoded.streams(stem) {
            out.insert(entry, stream);
        }
        quantized += 1;
    }
    bar.finish_and_clear();
    let config = quantization_config(folder.quantization(), spec, &stems);
    write(input, output, &out, &folder, config.as_ref())?;
    let mut summary = format!("quantized {quantized} weights to {:?} into {}\n", encoding, output.display());
    if folder.archive().gguf_metadata().is_some() {
        summary.push_str(&format!(
            "note: the metadata of the GGUF file `{}` (architecture, tokenizer) is not kept: to quantize it for llama.cpp and `nnx run`, write GGUF with `nnx convert {} OUT.gguf --type {}`\n",
            input.display(),
            input.display(),
            gguf_type(encoding)
        ));
    }
    Ok(summary)
}

/// The type of `nnx convert --type` closest to `encoding`, for messages.
fn gguf_type(encoding: Encoding) -> &'static str {
    match encoding {
        Encoding::Q8 => "q8_0",
        Encoding::Q4 | Encoding::Seed4 | Encoding::Seed4p4 => "q4_k_m",
    }
}

/// Where the result goes: `output` when it is a folder (see [`Output::is_folder`]) or a
/// `.safetensors` file, else `output` with `.safetensors` added, since the encodings are only
/// stored in SafeTensors. A `.gguf` name is refused: GGUF holds ggml's types, which
/// `nnx convert --type` writes.
fn destination(input: &Path, output: &Path, encoding: Encoding) -> Result<PathBuf, CliError> {
    let extension = output.extension().and_then(|extension| extension.to_str()).unwrap_or_default();
    if Output::is_folder(input, output) || extension.eq_ignore_ascii_case("safetensors") {
        return Ok(output.to_path_buf());
    }
    if extension.eq_ignore_ascii_case("gguf") {
        return Err(CliError(format!(
            "`{}` names a GGUF file, but `nnx quantize` writes MLX affine and SeedLM encodings, which only SafeTensors holds: name a `.safetensors` output, or write GGUF with `nnx convert {} {} --type {}`",
            output.display(),
            input.display(),
            output.display(),
            gguf_type(encoding)
        )));
    }
    let mut named = output.as_os_str().to_os_string();
    named.push(".safetensors");
    Ok(PathBuf::from(named))
}

fn encode(
    tensor: &Tensor,
    spec: Option<AffineSpec>,
    seed: Option<SeedEncoding>,
    bar: &ProgressBar,
) -> nnx::Result<EncodedWeight> {
    Ok(match (spec, seed) {
        (Some(spec), _) => {
            let weight = AffineWeight::quantize(tensor, spec)?;
            bar.inc(1);
            EncodedWeight::Affine(weight)
        }
        (None, Some(encoding)) => {
            let progress = |blocks: u64| bar.inc(blocks);
            EncodedWeight::Seed(SeedWeight::encode(tensor, encoding, &EncodeOptions { progress: Some(&progress) })?)
        }
        (None, None) => EncodedWeight::Float(tensor.clone()),
    })
}

/// The `quantization` entry of the result. An input already quantized keeps its entry, and
/// the weights quantized now get overrides where their spec differs from its default (as
/// mlx-lm writes mixed precision), so that every weight's spec stays readable.
fn quantization_config(
    input: Option<&QuantizationConfig>,
    spec: Option<AffineSpec>,
    stems: &[String],
) -> Option<QuantizationConfig> {
    let Some(mut config) = input.cloned() else { return spec.map(QuantizationConfig::new) };
    if let Some(spec) = spec {
        for stem in stems {
            if spec == config.default {
                config.overrides.remove(stem);
            } else {
                config.overrides.insert(stem.clone(), Some(spec));
            }
        }
    }
    Some(config)
}

/// Writes the result: a model folder (page-aligned shards, `config.json` with the
/// `quantization` entry) when the input is a folder or the output an existing folder, else
/// one file with the entry in its metadata.
fn write(
    input: &Path,
    output: &Path,
    archive: &Archive,
    folder: &QuantizedFolder,
    quantization: Option<&QuantizationConfig>,
) -> Result<(), CliError> {
    if Output::is_folder(input, output) {
        let mut config = folder.config().cloned().unwrap_or_else(|| serde_json::json!({}));
        if let Some(object) = config.as_object_mut() {
            object.remove("quantization_config");
            match quantization {
                Some(quantization) => object.insert("quantization".into(), quantization.to_json()),
                None => object.remove("quantization"),
            };
        }
        let write_config = folder.config().is_some() || quantization.is_some();
        // The folder's other files (tokenizer, generation settings, chat template) come along,
        // each link checked before anything is written.
        if input.is_dir() {
            copy_folder_files(input, output, &["config.json"])?;
        }
        save_folder(output, archive, write_config.then_some(&config), None)?;
    } else {
        let mut options = SaveOptions::default();
        if let Some(quantization) = quantization {
            options.metadata.insert("quantization".into(), quantization.to_json().to_string());
        }
        options.metadata.insert("format".into(), "mlx".into());
        archive.save_with(output, &options)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::glob_matches;

    #[test]
    fn globs() {
        assert!(glob_matches("*.weight", "a.b.weight"));
        assert!(glob_matches("layers.?.mlp.*", "layers.3.mlp.up.weight"));
        assert!(!glob_matches("*.weight", "a.bias"));
        assert!(glob_matches("*", ""));
        assert!(!glob_matches("a*b", "acbc"));
    }
}
