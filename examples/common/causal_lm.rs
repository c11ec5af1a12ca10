//! What the GPT-2 and Llama examples share: the command line, importing a Hugging Face folder
//! into a meta model, one forward pass and greedy decoding.

use std::path::PathBuf;

use clap::Parser;
use nnx::models::CausalLm;
use nnx::{Archive, Module};

/// The command line of the causal language model examples.
#[derive(Parser)]
pub struct Args {
    /// A folder with `config.json` and `model.safetensors` (default: the example's fixture).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Prompt token ids, comma-separated.
    #[arg(long, value_delimiter = ',')]
    pub ids: Vec<u32>,
    /// Tokens to generate.
    #[arg(long, default_value_t = 8)]
    pub steps: usize,
}

/// The model folder and prompt of one run, with an example's defaults filled in.
pub struct Run {
    /// The model folder.
    pub folder: PathBuf,
    /// Prompt token ids.
    pub ids: Vec<u32>,
    /// Tokens to generate.
    pub steps: usize,
}

impl Run {
    /// Parses the command line; `fixture` (a folder of the repository's test fixtures) and `ids` stand in
    /// for what it leaves out.
    pub fn from_args(fixture: &str, ids: &[u32]) -> Run {
        let args = Args::parse();
        let default = || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(fixture);
        Run {
            folder: args.model.unwrap_or_else(default),
            ids: if args.ids.is_empty() { ids.to_vec() } else { args.ids },
            steps: args.steps,
        }
    }

    /// Imports the folder into `model` (built as meta: the tensors become views of the mapped
    /// file), prints the argmax at every position and the greedy continuation.
    pub fn run(&self, mut model: impl CausalLm + Module) -> nnx::Result<()> {
        let report = Archive::open(&self.folder)?.import_into(&mut model, "")?;
        let mapped = model.flat_state_dict().iter().filter(|(_, tensor)| tensor.is_mapped()).count();
        println!(
            "imported {} tensors ({} tied, {} cast) from {}; {mapped} are views of the mapped file",
            report.imported.len(),
            report.tied.len(),
            report.cast.len(),
            self.folder.display()
        );
        let logits = model.logits(&self.ids)?;
        println!("prompt: {:?}", self.ids);
        println!("argmax per position: {:?}", logits.argmax_last()?);
        let generated = model.generate(&self.ids, self.steps)?;
        println!("greedy continuation: {:?}", &generated[self.ids.len()..]);
        Ok(())
    }
}
