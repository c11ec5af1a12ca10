//! `nnx download REPO [--revision R] [--include GLOB]...`: fills the shared Hugging Face cache
//! and prints the snapshot folder as the last line of standard output, for `$(nnx download ..)`.

use nnx::hub::{Hub, HubPath, RepoId};

use crate::common::CliError;

/// The arguments of `nnx download`.
#[derive(clap::Args)]
pub struct Args {
    /// A repository id (`org/name`) or `hf://org/name[@revision]`.
    repo: String,
    /// A branch, tag or commit (default `main`).
    #[arg(long)]
    revision: Option<String>,
    /// Download the files matching this glob (`*` crosses folders; `sub/` means all under
    /// it) instead of what a load of the model needs; `--include '*'` downloads everything.
    #[arg(long, value_name = "GLOB")]
    include: Vec<String>,
}

/// Downloads what a load of the model needs, or with `--include`, the files matching those
/// globs.
pub fn run(args: Args) -> Result<String, CliError> {
    let (repo, revision, include) = (args.repo.as_str(), args.revision.as_deref(), args.include.as_slice());
    let (repo, revision) = if repo.starts_with(HubPath::SCHEME) {
        let path = HubPath::parse(repo)?;
        if !path.path.is_empty() {
            return Err(CliError(format!(
                "`{repo}` names a file: give the repository (`hf://{}@{}`) and select files with --include",
                path.repo, path.revision
            )));
        }
        (path.repo, revision.map_or(path.revision, str::to_string))
    } else {
        (RepoId::parse(repo)?, revision.unwrap_or("main").to_string())
    };
    let hub = Hub::from_env()?;
    let folder = if include.is_empty() {
        hub.pretrained(&repo, &revision)?
    } else {
        let download = hub.download(&repo, &revision, include)?;
        if download.files.is_empty() {
            return Err(CliError(format!(
                "no file of `{repo}` at `{revision}` matches --include {}",
                include.join(" --include ")
            )));
        }
        download.folder
    };
    Ok(format!("{}\n", folder.display()))
}
