//! What the commands share: their error, the `hf://` paths they read, where converting commands
//! write, the other files of a model folder they copy, and their progress bars.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};

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
    // A checkpoint published quantized (FP8, GPTQ, ...) reads as the float weights it stands for.
    let archive = nnx::published::open(&path)?;
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

/// Copies the files of the model folder `base` other than its weights (configuration,
/// tokenizer, generation settings, chat templates) into `out`, created when missing, as
/// [`folder_copies`] lists them, except those named in `written` (files the caller writes
/// itself). Every link is checked before anything is written; an entry of `out` in the way is
/// replaced, never written through. Nothing is copied when `out` is `base` itself.
///
/// # Errors
/// A link that leads out of `base`, and failures to read `base` or to write `out`.
pub fn copy_folder_files(base: &Path, out: &Path, written: &[&str]) -> Result<(), CliError> {
    let mut copies = folder_copies(base)?;
    copies.retain(|(name, _)| !written.iter().any(|written| name == written));
    if out.canonicalize().is_ok_and(|out| base.canonicalize().is_ok_and(|base| base == out)) {
        return Ok(());
    }
    std::fs::create_dir_all(out).map_err(|error| CliError(format!("cannot create `{}`: {error}", out.display())))?;
    for (name, copy) in copies {
        let to = out.join(&name);
        let replaced = match std::fs::symlink_metadata(&to) {
            Ok(meta) if !meta.is_dir() => std::fs::remove_file(&to),
            _ => Ok(()),
        };
        let done = replaced.and_then(|()| match &copy {
            Copy::Contents(from) => std::fs::copy(from, &to).map(|_| ()),
            Copy::Link(target) => make_link(target, &to),
        });
        done.map_err(|error| CliError(format!("cannot write `{}`: {error}", to.display())))?;
    }
    Ok(())
}

/// How one file of a base folder comes into the new folder.
enum Copy {
    /// Its contents, read from this path (the file itself, or what a link inside the folder
    /// or into its Hugging Face cache repository leads to).
    Contents(PathBuf),
    /// A link with this relative target, to a file of the folder that is copied too.
    Link(PathBuf),
}

/// The files of the base folder `base` that a folder written from it gets beside its weights:
/// every plain file but the weights, and links as a user who shares the new folder expects them.
/// A relative link to another copied file stays a link with its target; a link to any other
/// file of the folder, or into the `blobs` of the Hugging Face cache repository whose snapshot
/// `base` is (the cache's own layout), is copied as the file it leads to. A link that leads
/// anywhere else is refused: its target is not the model's, and copying it would put a file
/// from elsewhere on the machine into a folder meant to be shared. Links that lead nowhere and
/// folders are left out, as before.
fn folder_copies(base: &Path) -> Result<Vec<(std::ffi::OsString, Copy)>, CliError> {
    let cannot = |what: &str, path: &Path, error: std::io::Error| {
        CliError(format!("cannot {what} `{}`: {error}", nnx::text::printable(&path.display().to_string())))
    };
    let root = base.canonicalize().map_err(|error| cannot("read", base, error))?;
    // A Hugging Face cache snapshot (`models--org--name/snapshots/<commit>`) links its files
    // into the repository's `blobs`.
    let blobs = root
        .parent()
        .filter(|snapshots| snapshots.file_name().is_some_and(|name| name == "snapshots"))
        .and_then(Path::parent)
        .map(|repository| repository.join("blobs"));
    let weights = |name: &str| {
        [".safetensors", ".safetensors.index.json", ".bin", ".gguf", ".pt", ".pth"]
            .iter()
            .any(|extension| name.ends_with(extension))
    };
    let entries = std::fs::read_dir(base).map_err(|error| cannot("list", base, error))?;
    let mut names = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|error| cannot("list", base, error))?;
        if !weights(&entry.file_name().to_string_lossy()) {
            names.push(entry.file_name());
        }
    }
    names.sort();
    let mut copies = Vec::new();
    for name in &names {
        let path = base.join(name);
        let kind = std::fs::symlink_metadata(&path).map_err(|error| cannot("read", &path, error))?.file_type();
        if kind.is_file() {
            copies.push((name.clone(), Copy::Contents(path)));
            continue;
        }
        if !kind.is_symlink() {
            continue;
        }
        let target = std::fs::read_link(&path).map_err(|error| cannot("read the link", &path, error))?;
        let Ok(resolved) = path.canonicalize() else { continue };
        if !resolved.is_file() {
            continue;
        }
        if let Ok(inside) = resolved.strip_prefix(&root) {
            // A file of the folder: a link to a file copied beside it stays a link.
            let copied = inside.parent() == Some(Path::new(""))
                && names.iter().any(|other| inside == Path::new(other))
                && std::fs::symlink_metadata(root.join(inside)).is_ok_and(|meta| meta.file_type().is_file());
            let copy = if copied && target.is_relative() { Copy::Link(target) } else { Copy::Contents(resolved) };
            copies.push((name.clone(), copy));
        } else if blobs.as_ref().is_some_and(|blobs| resolved.starts_with(blobs)) {
            copies.push((name.clone(), Copy::Contents(resolved)));
        } else {
            return Err(CliError(format!(
                "`{}` is a symbolic link to `{}`, outside the base folder `{}`: its contents are not copied into the new folder; copy the file into the folder if it belongs to the model, or remove the link",
                nnx::text::printable(&path.display().to_string()),
                nnx::text::printable(&target.display().to_string()),
                nnx::text::printable(&base.display().to_string())
            )));
        }
    }
    Ok(copies)
}

/// A symbolic link at `link` to `target`.
#[cfg(unix)]
fn make_link(target: &Path, link: &Path) -> std::io::Result<()> {
    std::os::unix::fs::symlink(target, link)
}

/// Without symbolic links, the link's target is copied (it is a file of the merged folder).
#[cfg(not(unix))]
fn make_link(target: &Path, link: &Path) -> std::io::Result<()> {
    let from = link.parent().unwrap_or(Path::new("")).join(target);
    std::fs::copy(from, link).map(|_| ())
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
