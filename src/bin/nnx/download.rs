//! `nnx download REPO [--revision R] [--include GLOB]...`: fills the shared Hugging Face cache
//! and prints the snapshot folder as the last line of standard output, for `$(nnx download ..)`.

use nnx::hub::{Hub, HubPath, RepoId};

use crate::CliError;

/// Downloads what a load of the model needs, or with `include`, the files matching those globs.
pub fn run(repo: &str, revision: Option<&str>, include: &[String]) -> Result<String, CliError> {
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
