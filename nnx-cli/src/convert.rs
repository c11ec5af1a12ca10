//! `nnx convert IN OUT [--dtype bf16|f16|f32] [--page-align] [--max-shard-size SIZE]
//! [--select PREFIX]`: a PyTorch checkpoint or SafeTensors weights (file, index or folder) to a
//! SafeTensors file, or to a sharded folder with its index; GGUF files are decoded to floats,
//! their metadata kept with its types for the way back. An output named `.gguf` is written as
//! GGUF (see [`crate::to_gguf`]).

use std::path::{Path, PathBuf};

use nnx::{Archive, DType, Error, SaveOptions};

use crate::common::{CliError, open_archive, progress_bar};
use crate::dequantize::FloatType;

/// The arguments of `nnx convert`.
#[derive(clap::Args)]
pub struct Args {
    /// A PyTorch checkpoint (`.bin`, `.pt`, `.pth`), a `.safetensors` file, a shard index, a
    /// `.gguf` file, a folder holding one of them, or an `hf://` path.
    input: PathBuf,
    /// The output `.safetensors` file; with `--max-shard-size`, a folder that receives the
    /// shards and `model.safetensors.index.json`; or a `.gguf` file. The metadata of a GGUF
    /// input goes into `__metadata__`: scalars as text, and every key with its type under
    /// `gguf`, which a conversion back to `.gguf` writes again.
    output: PathBuf,
    /// Cast every float entry to this dtype; integer and bool entries are never cast.
    #[arg(long, value_enum)]
    dtype: Option<FloatType>,
    /// Start the data on a 16 KiB page and each page-sized entry on a page boundary.
    #[arg(long)]
    page_align: bool,
    /// Write a sharded folder with shards of at most this size: bytes (`1000000`) or a
    /// size with a unit (`500MB`, `2GB`, `10GiB`). For a `.gguf` output (also spelled
    /// `--split-max-size`, as llama.cpp's tools take it): shards `OUT-00001-of-0000N.gguf`
    /// beside `OUT.gguf` with llama.cpp's `split.*` keys, each holding at most this many bytes
    /// of tensor data.
    #[arg(long, visible_alias = "split-max-size", value_name = "SIZE", value_parser = parse_size)]
    max_shard_size: Option<u64>,
    /// Keep only the entries named PREFIX or PREFIX.*; their names are kept whole.
    #[arg(long, value_name = "PREFIX")]
    select: Option<String>,
    /// Write entries whose layout repeats their stored elements (a zero stride) into more
    /// than 16 times their stored bytes plus 64 MiB; such entries are refused by default,
    /// since a file of a few bytes can describe gigabytes that way.
    #[arg(long)]
    allow_expansion: bool,
    /// For a `.gguf` output: a type as `llama-quantize` takes it (`q4_k_m`, `q4_k_s`, `q5_k_m`,
    /// `q6_k`, `q8_0`, `q4_0`, `iq4_xs`, `mxfp4_moe`, ...: the type with llama.cpp's per-tensor
    /// choices), or
    /// `f16`, `bf16`, `f32`, `mxfp4` for every tensor. Norms and 1-D tensors keep their type.
    /// Without it: F16, except for a SafeTensors file written from a GGUF file, whose tensors
    /// get back the types they had there. Such a file's GGUF metadata is written either way.
    #[arg(long = "type", value_name = "TYPE|MIXTURE", value_parser = crate::to_gguf::parse_recipe)]
    ty: Option<nnx::gguf::Recipe>,
    /// For a `.gguf` output: give the tensors whose names match the regular expression
    /// PATTERN this type instead (repeatable; the first match wins).
    #[arg(long = "tensor-type", value_name = "PATTERN=TYPE", value_parser = crate::to_gguf::parse_override)]
    tensor_types: Vec<(String, nnx::quant::ggml::GgmlType)>,
    /// For a `.gguf` output: the `--type`'s type for every tensor that may be quantized, without
    /// llama.cpp's choices for the output, `attn_v` and `ffn_down` (llama-quantize's `--pure`).
    #[arg(long)]
    pure: bool,
    /// Write OUT as a folder holding a PyTorch distributed checkpoint (DCP) of this many ranks:
    /// each tensor cut along its first axis as DTensor's `Shard(0)` cuts it, one
    /// `__R_0.distcp` file per rank and `.metadata` written last;
    /// `torch.distributed.checkpoint.load` reads it into any sharding.
    #[arg(long, value_name = "RANKS", value_parser = clap::value_parser!(u16).range(1..))]
    dcp_ranks: Option<u16>,
}

/// What the flags of `convert` ask for.
struct Options {
    /// The dtype every float entry is cast to; integer and bool entries are never cast.
    dtype: Option<DType>,
    /// Page-align the output.
    page_align: bool,
    /// Write a distributed checkpoint of this many ranks instead of SafeTensors.
    dcp_ranks: Option<usize>,
    /// Write a sharded folder with shards of at most this many data bytes.
    max_shard_bytes: Option<u64>,
    /// Keep only the entries named this or under it (`PREFIX.*`), names kept whole.
    select: Option<String>,
    /// Write entries whose layout repeats their stored elements past
    /// [`nnx::Tensor::expansion_limit`]; without it they are refused before anything is copied.
    allow_expansion: bool,
}

/// Parses a size: plain bytes (`1000000`) or a number with a unit, decimal (`KB`, `MB`, `GB`,
/// `TB`) or binary (`KiB`, `MiB`, `GiB`, `TiB`), in any case (`500MB`, `2gb`, `1.5 GiB`).
pub fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(text.len());
    let (number, unit) = (&text[..split], text[split..].trim());
    let multiplier: u64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" => 1_000,
        "m" | "mb" => 1_000_000,
        "g" | "gb" => 1_000_000_000,
        "t" | "tb" => 1_000_000_000_000,
        "kib" => 1 << 10,
        "mib" => 1 << 20,
        "gib" => 1 << 30,
        "tib" => 1 << 40,
        _ => {
            return Err(format!(
                "unknown unit `{unit}` in `{text}`: use bytes or B, KB, MB, GB, TB, KiB, MiB, GiB, TiB"
            ));
        }
    };
    let bytes = if number.contains('.') {
        let value: f64 = number.parse().map_err(|_| format!("`{text}` is not a size such as 500MB or 2GB"))?;
        let bytes = value * multiplier as f64;
        if !bytes.is_finite() || bytes >= u64::MAX as f64 {
            return Err(format!("`{text}` is too large"));
        }
        bytes as u64
    } else {
        let value: u64 = number.parse().map_err(|_| format!("`{text}` is not a size such as 500MB or 2GB"))?;
        value.checked_mul(multiplier).ok_or_else(|| format!("`{text}` is too large"))?
    };
    if bytes == 0 {
        return Err("the shard size must be at least one byte".into());
    }
    Ok(bytes)
}

/// The file `save_with` is given: `OUT/model.safetensors` for a sharded folder, an existing
/// folder or one spelled with a trailing `/`; `OUT` itself otherwise.
fn target(output: &Path, sharded: bool) -> Result<PathBuf, CliError> {
    let folder = sharded || output.is_dir() || output.as_os_str().to_string_lossy().ends_with('/');
    if !folder {
        if let Some(parent) = output.parent().filter(|parent| !parent.as_os_str().is_empty() && !parent.is_dir()) {
            return Err(CliError(format!(
                "cannot write `{}`: the folder `{}` does not exist",
                output.display(),
                parent.display()
            )));
        }
        return Ok(output.to_path_buf());
    }
    std::fs::create_dir_all(output)
        .map_err(|error| CliError(format!("cannot create the folder `{}`: {error}", output.display())))?;
    Ok(output.join("model.safetensors"))
}

/// A failure to copy entry `name` of `input`, saying what to do.
fn entry_error(input: &Path, name: &str, error: &Error) -> CliError {
    let input = input.display();
    CliError(match expansion(error) {
        Some(layout) => {
            format!("cannot convert `{name}` of `{input}`: {layout}: if the copy is meant, pass `--allow-expansion`")
        }
        None => format!("cannot convert `{name}` of `{input}`: {error}"),
    })
}

/// What a view that would expand past its limit does, for a message that names the entry
/// (`its layout ... as no saved weight does`); `None` for other errors. An error that names the
/// entry already ([`Error::Data`]) is looked into.
pub(crate) fn expansion(error: &Error) -> Option<String> {
    match error {
        Error::Expansion { shape, bytes, stored, limit, .. } => Some(format!(
            "its layout (shape {shape:?}) repeats the {stored} bytes it is stored in into {bytes} bytes, over the limit of {limit} bytes ({} times the stored bytes plus {} MiB), as no saved weight does",
            nnx::Tensor::EXPANSION_FACTOR,
            nnx::Tensor::EXPANSION_ALLOWANCE >> 20
        )),
        Error::Data { source, .. } => expansion(source),
        _ => None,
    }
}

/// Runs the command; returns the summary line.
pub fn run(args: Args) -> Result<String, CliError> {
    let options = Options {
        dtype: args.dtype.map(FloatType::dtype),
        page_align: args.page_align,
        max_shard_bytes: args.max_shard_size,
        select: args.select,
        allow_expansion: args.allow_expansion,
        dcp_ranks: args.dcp_ranks.map(usize::from),
    };
    if options.dcp_ranks.is_some()
        && (args.output.extension().is_some_and(|ext| ext == "gguf")
            || options.max_shard_bytes.is_some()
            || options.page_align)
    {
        return Err(CliError(
            "`--dcp-ranks` writes a folder of its own layout: leave out `--max-shard-size` and `--page-align`, and name a folder rather than a `.gguf` file".into(),
        ));
    }
    let gguf = args.output.extension().is_some_and(|ext| ext == "gguf");
    if !gguf && (args.ty.is_some() || !args.tensor_types.is_empty() || args.pure) {
        return Err(CliError(format!(
            "`--type`, `--tensor-type` and `--pure` choose ggml types: name a `.gguf` output instead of `{}`",
            args.output.display()
        )));
    }
    // Without `--type` (or `--pure`), `to_gguf` chooses: F16, or the types a SafeTensors file
    // written from a GGUF file had there.
    let recipe = match (args.ty, args.pure) {
        (None, false) => None,
        (recipe, pure) => {
            let recipe = recipe.unwrap_or(nnx::gguf::Recipe::Pure(nnx::quant::ggml::GgmlType::F16));
            Some(if pure { recipe.pure() } else { recipe })
        }
    };
    let target = crate::to_gguf::Output { path: &args.output, split: args.max_shard_size };
    if gguf && let Some(summary) = crate::to_gguf::convert_folder(&args.input, target, recipe, &args.tensor_types)? {
        return Ok(summary);
    }
    let (input, archive) = open_archive(args.input.clone())?;
    if gguf {
        return crate::to_gguf::convert(&archive, &input, target, recipe, &args.tensor_types);
    }
    convert(archive, &input, &args.output, &options)
}

/// Converts `archive`, read from `input`, to `output` as `options` ask; returns the summary line.
fn convert(mut archive: Archive, input: &Path, output: &Path, options: &Options) -> Result<String, CliError> {
    if let Some(prefix) = &options.select {
        let prefix = prefix.trim_end_matches('.');
        archive = archive.select(prefix);
        if archive.is_empty() {
            return Err(CliError(format!("`--select {prefix}` matches no entry of `{}`", input.display())));
        }
    }
    let names: Vec<String> = archive.names().map(str::to_string).collect();
    // Counts the entries cast or decoded as they are made; the others are copied as stored.
    let bar = progress_bar(0, "bytes");
    let mut made = 0u64;
    // Each entry is read, cast or decoded only when the writer comes to it, and its input's
    // pages are released once it is written: memory holds the entry being written, not the
    // model.
    let mut converted = Archive::new();
    let mut cast = 0;
    for name in &names {
        let info = archive.info(name)?;
        let refuse = |error: Error| entry_error(input, name, &error);
        // GGUF blocks and published encodings are decoded when read; other entries are views.
        let decoded = archive.ggml_type(name).is_some_and(|ty| ty.is_quantized()) || archive.encoding(name).is_some();
        // Entries assembled when read (a distributed checkpoint's) are new tensors: nothing to
        // check, and making them here would make them twice.
        if !decoded && !archive.made_when_read(name) {
            let tensor = archive.try_get(name)?;
            if let Err(error) = tensor.check_expansion(tensor.expansion_limit()) {
                if !options.allow_expansion {
                    return Err(refuse(error));
                }
                let whole = tensor.contiguous_within(usize::MAX).map_err(refuse)?;
                let whole = match options.dtype {
                    Some(dtype) if info.dtype.is_castable_float() && info.dtype != dtype => {
                        cast += 1;
                        whole.to_dtype(dtype).map_err(refuse)?
                    }
                    _ => whole,
                };
                converted.insert(name.as_str(), whole);
                continue;
            }
        }
        let dtype = match options.dtype {
            Some(dtype) if info.dtype.is_castable_float() && info.dtype != dtype => {
                cast += 1;
                dtype
            }
            _ if !decoded => {
                converted.insert_entry(name.as_str(), &archive, name)?;
                continue;
            }
            _ => info.dtype,
        };
        let (owned, origin, progress, bytes) = (name.clone(), input.to_path_buf(), bar.clone(), info.bytes as u64);
        made += bytes;
        let blocks = archive.ggml_type(name).is_some_and(|ty| ty.is_quantized());
        converted.insert_derived(
            name.as_str(),
            (dtype, info.shape.clone()),
            &archive,
            vec![name.clone()],
            move |archive| {
                // GGUF blocks are decoded into the dtype a few rows at a time, not through f32.
                let made = if blocks {
                    archive.ggml(&owned)?.dequantize_to(dtype)
                } else {
                    archive.try_get(&owned)?.to_dtype(dtype)
                };
                let made = made.map_err(|source| Error::Data {
                    path: origin.clone(),
                    name: owned.clone(),
                    source: Box::new(source),
                });
                progress.inc(bytes);
                made
            },
        );
    }
    bar.set_length(made);
    if let Some(ranks) = options.dcp_ranks {
        bar.set_message(format!("writing {}", output.display()));
        let saved = converted.save_dcp(output, ranks);
        bar.finish_and_clear();
        saved?;
        return Ok(format!(
            "converted {} entries from {} into the distributed checkpoint {} of {ranks} ranks\n",
            names.len(),
            input.display(),
            output.display()
        ));
    }
    let path = target(output, options.max_shard_bytes.is_some())?;
    bar.set_message(format!("writing {}", output.display()));
    bar.enable_steady_tick(std::time::Duration::from_millis(100));
    let mut metadata = archive.metadata().clone();
    if let Some(gguf) = archive.gguf_metadata() {
        // Scalars and strings as text, for readers of the file; arrays of a GGUF file
        // (vocabularies, merges) are not text. Every key comes along typed under one more key,
        // with the block types of the tensors decoded here, for the way back to GGUF.
        metadata.retain(|key, _| gguf.get(key).is_some_and(|value| value.as_array().is_none()));
        let decoded: Vec<(&str, nnx::quant::ggml::GgmlType)> = names
            .iter()
            .filter_map(|name| Some((name.as_str(), archive.ggml_type(name).filter(|ty| ty.is_quantized())?)))
            .collect();
        let order: Vec<&str> = names.iter().map(String::as_str).collect();
        metadata.insert(crate::to_gguf::CARRIED.into(), crate::to_gguf::carry(gguf, &order, &decoded));
    }
    // The total size of a shard index describes the input; a sharded save writes its own.
    metadata.remove("total_size");
    // Readers such as `transformers` expect the framework the weights are laid out for.
    metadata.entry("format".into()).or_insert_with(|| "pt".into());
    let save = SaveOptions {
        metadata,
        page_align: options.page_align,
        max_shard_bytes: options.max_shard_bytes,
        ..SaveOptions::default()
    };
    let saved = converted.save_with(&path, &save);
    bar.finish_and_clear();
    saved?;
    let cast = match options.dtype {
        Some(dtype) => format!(", {cast} cast to {dtype}"),
        None => String::new(),
    };
    Ok(format!("converted {} entries{cast} from {} into {}\n", names.len(), input.display(), output.display()))
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("1234"), Ok(1234));
        assert_eq!(parse_size("500MB"), Ok(500_000_000));
        assert_eq!(parse_size("2GB"), Ok(2_000_000_000));
        assert_eq!(parse_size("10GiB"), Ok(10 << 30));
        assert_eq!(parse_size("1.5 KiB"), Ok(1536));
        assert_eq!(parse_size("4kb"), Ok(4000));
        assert!(parse_size("0").is_err());
        assert!(parse_size("5XB").is_err());
        assert!(parse_size("MB").is_err());
        assert!(parse_size("99999999999TB").is_err());
    }
}
