//! `nnx dequantize IN OUT [--dtype bf16|f16|f32]`: every quantized weight (MLX affine, SEED4,
//! SEED4P4) back to a float `NAME.weight`; every other entry copied as it is.

use std::collections::HashSet;
use std::path::PathBuf;

use nnx::quantized::{EncodedWeight, QuantizedFolder, save_folder};
use nnx::{Archive, DType, SaveOptions};

use crate::common::{CliError, Output, local};

/// The arguments of `nnx dequantize`.
#[derive(clap::Args)]
pub struct Args {
    /// A `.safetensors` file, a shard index, a folder or an `hf://` path.
    input: PathBuf,
    /// The output file or folder.
    output: PathBuf,
    /// The float dtype of the decoded weights (default: the dtype of the scales for affine
    /// weights, BF16 for seed weights).
    #[arg(long, value_enum)]
    dtype: Option<FloatType>,
}

/// The float dtypes `--dtype` takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum FloatType {
    /// bfloat16.
    Bf16,
    /// IEEE half.
    F16,
    /// IEEE single.
    F32,
}

impl FloatType {
    /// The dtype it names.
    pub fn dtype(self) -> DType {
        match self {
            FloatType::Bf16 => DType::BF16,
            FloatType::F16 => DType::F16,
            FloatType::F32 => DType::F32,
        }
    }
}

/// Runs the command; returns the summary line. Without `--dtype`, affine weights come out in
/// the dtype of their scales and seed weights in BF16, the values the reference decoders give.
pub fn run(args: Args) -> Result<String, CliError> {
    let Args { input, output, dtype } = args;
    let (input, output) = (&local(input)?, &output);
    let folder = QuantizedFolder::open(input)?;
    let archive = folder.archive();
    let mut decoded = Archive::new();
    let mut consumed = HashSet::new();
    let mut count = 0;
    let mut floats = Vec::new();
    for name in folder.weights() {
        let weight = folder.weight(&name)?;
        if let EncodedWeight::Float(_) = weight {
            continue;
        }
        let target = match (&weight, dtype) {
            (_, Some(dtype)) => dtype.dtype(),
            (EncodedWeight::Affine(affine), None) => affine.dtype(),
            _ => DType::BF16,
        };
        consumed.extend(folder.streams_of(&name));
        floats.push((name.clone(), weight.to_float(target)?));
        count += 1;
    }
    let mut floats: std::collections::HashMap<String, nnx::Tensor> = floats.into_iter().collect();
    for name in archive.names() {
        if consumed.contains(name) {
            // The float weight takes the place of the weight's first stream.
            let stem = name.rsplit_once('.').map_or(name, |(stem, _)| stem);
            if let Some(tensor) = floats.remove(stem) {
                decoded.insert(format!("{stem}.weight"), tensor);
            }
            continue;
        }
        // Copied as it is: a view that repeats a few stored bytes into gigabytes is refused here,
        // naming the file, rather than when the output is written.
        let tensor = archive.try_get(name)?;
        if let Err(error) = tensor.check_expansion(tensor.expansion_limit()) {
            let layout = crate::convert::expansion(&error).unwrap_or_else(|| error.to_string());
            return Err(CliError(format!(
                "cannot copy `{}` of `{}`: {layout}: save the tensor contiguous and dequantize that file",
                nnx::text::printable(name),
                input.display()
            )));
        }
        decoded.insert(name, tensor);
    }
    if Output::is_folder(input, output) {
        let config = folder.config().cloned().map(|mut config| {
            if let Some(object) = config.as_object_mut() {
                object.remove("quantization");
                object.remove("quantization_config");
            }
            config
        });
        save_folder(output, &decoded, config.as_ref(), None)?;
    } else {
        let mut options = SaveOptions { metadata: archive.metadata().clone(), ..SaveOptions::default() };
        options.metadata.remove("quantization");
        decoded.save_with(output, &options)?;
    }
    Ok(format!("dequantized {count} weights into {}\n", output.display()))
}
