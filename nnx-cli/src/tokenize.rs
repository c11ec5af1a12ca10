//! `nnx tokenize MODEL TEXT`: the token ids of a text as a model's tokenizer gives them (with
//! the BOS it adds, and special tokens written in the text matched as such), as a JSON array.

use std::path::PathBuf;

use nnx::generate::Tokenizer;

use crate::common::{CliError, open_archive};

/// The arguments of `nnx tokenize`.
#[derive(clap::Args)]
pub struct Args {
    /// A GGUF file (its `tokenizer.ggml.*` metadata), a model folder (its `tokenizer.json`),
    /// or an `hf://` path to either.
    model: PathBuf,
    /// The text.
    text: String,
}

/// Prints the ids as one JSON array.
pub fn run(args: Args) -> Result<String, CliError> {
    let tokenizer = if args.model.is_dir() {
        Tokenizer::from_folder(&args.model)?
    } else {
        let (path, archive) = open_archive(args.model)?;
        let Some(metadata) = archive.gguf_metadata() else {
            return Err(CliError(format!(
                "`{}` is not a GGUF file or a model folder: give the GGUF file, or the folder that holds tokenizer.json",
                path.display()
            )));
        };
        Tokenizer::from_gguf(metadata, &path)?
    };
    let ids = tokenizer.encode(&args.text)?;
    Ok(serde_json::to_string(&ids).expect("ids serialize") + "\n")
}
