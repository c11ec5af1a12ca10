//! What the commands share: their error, the `hf://` paths they read, where converting commands
//! write and their progress bars.

use std::io::IsTerminal;
use std::path::PathBuf;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use nnx::Archive;

/// A path the user gave: `hf://` paths become the local files of the Hugging Face cache.
pub fn local(path: PathBuf) -> Result<PathBuf, CliError> {
    match path.to_str() {
        Some(text) if text.starts_with(nnx::hub::HubPath::SCHEME) => Ok(nnx::hub::local_path(text)?),
        _ => Ok(path),
    }
}

/// The archive at a path the user gave, and the path to name it by. SafeTensors weights on the
/// Hub are read where they are, as [`Archive::open`] reads `s3://`: the header, then only the
/// bytes a command uses, with nothing written to the cache. Other formats, and every `hf://`
/// path when `HF_HUB_OFFLINE` is set or without the `remote` feature, go through [`local`].
///
/// # Errors
/// What opening or downloading reports, naming the path.
pub fn open_archive(path: PathBuf) -> Result<(PathBuf, Archive), CliError> {
    #[cfg(feature = "remote")]
    if path.to_str().is_some_and(|text| text.starts_with(nnx::hub::HubPath::SCHEME)) && !nnx::hub::offline() {
        use nnx::Error;
        use nnx::error::RemoteProblem;
        match Archive::open(&path) {
            // Not SafeTensors: the cache can still fetch it and read any format.
            Err(Error::Remote { problem: RemoteProblem::NotSafeTensors | RemoteProblem::NoWeights, .. }) => {}
            opened => return Ok((path, opened?)),
        }
    }
    let path = local(path)?;
    let archive = Archive::open(&path)?;
    Ok((path, archive))
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
