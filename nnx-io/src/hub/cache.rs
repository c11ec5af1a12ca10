//! The Hugging Face cache, laid out exactly as `huggingface_hub` lays it out, so that each
//! reads what the other wrote:
//!
//! ```text
//! <cache>/models--org--name/
//!     blobs/<etag>                     file contents, named by their etag (sha256 for LFS files)
//!     snapshots/<commit>/<path>        relative symlinks into blobs (copies where links fail)
//!     refs/<revision>                  the commit a branch or tag pointed at when last resolved
//! <cache>/.locks/models--org--name/<etag>.lock
//! ```

#[cfg(feature = "hub")]
use std::fs::File;
use std::path::{Component, Path, PathBuf};

use super::RepoId;
use crate::error::{HubProblem, Offline};
#[cfg(feature = "hub")]
use crate::fs::{Staged, StagedFile};
use crate::{Error, Result};

pub(crate) use crate::format::{SAFETENSORS, SAFETENSORS_INDEX, TORCH, TORCH_INDEX};

/// The shared cache of Hub downloads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cache {
    root: PathBuf,
}

/// Whether an environment variable holds one of the truthy words `huggingface_hub` accepts.
pub(crate) fn env_flag(name: &str) -> bool {
    std::env::var(name)
        .is_ok_and(|value| matches!(value.trim().to_ascii_uppercase().as_str(), "1" | "ON" | "YES" | "TRUE"))
}

/// A non-empty environment variable.
fn env_path(name: &str) -> Option<PathBuf> {
    std::env::var_os(name).filter(|value| !value.is_empty()).map(PathBuf::from)
}

/// `HF_HOME`, else `$XDG_CACHE_HOME/huggingface`, else `~/.cache/huggingface`.
pub(crate) fn hf_home() -> PathBuf {
    env_path("HF_HOME").unwrap_or_else(|| {
        let cache = env_path("XDG_CACHE_HOME").unwrap_or_else(|| home().join(".cache"));
        cache.join("huggingface")
    })
}

fn home() -> PathBuf {
    env_path("HOME").or_else(|| env_path("USERPROFILE")).unwrap_or_else(|| PathBuf::from("."))
}

/// Whether `HF_HUB_OFFLINE` asks that the network never be used.
pub fn offline() -> bool {
    env_flag("HF_HUB_OFFLINE")
}

/// The token: `HF_TOKEN`, else the token file (`HF_TOKEN_PATH`, else `HF_HOME/token`) that
/// `huggingface-cli login` writes.
pub fn token() -> Option<String> {
    if let Ok(token) = std::env::var("HF_TOKEN") {
        let token = token.trim().to_string();
        if !token.is_empty() {
            return Some(token);
        }
    }
    let path = env_path("HF_TOKEN_PATH").unwrap_or_else(|| hf_home().join("token"));
    let token = std::fs::read_to_string(path).ok()?.trim().to_string();
    (!token.is_empty()).then_some(token)
}

/// Whether `revision` is a full commit hash (then it names its snapshot directly).
pub(crate) fn is_commit(revision: &str) -> bool {
    revision.len() == 40 && revision.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Whether a path in a repository (a file name, an etag, a revision from a server or a user)
/// is relative and stays inside the folder it is joined to, on every platform: `/`-separated
/// plain names, none empty, `.` or `..`, none holding `:`, `\\` or a control character, none
/// ending in a dot or a space (which Windows drops), none a device name Windows reserves.
pub(crate) fn safe_relative(path: &str) -> bool {
    let part_ok = |part: &str| {
        !part.is_empty()
            && !part.ends_with(['.', ' '])
            && !part.contains([':', '\\'])
            && !part.chars().any(char::is_control)
            && !windows_device(part)
    };
    !path.is_empty()
        && !path.starts_with('/')
        && path.split('/').all(part_ok)
        && Path::new(path).components().all(|component| matches!(component, Component::Normal(_)))
}

/// Whether Windows reads `part` as a device (`CON`, `PRN`, `AUX`, `NUL`, `COM1`-`COM9`,
/// `LPT1`-`LPT9`), with or without an extension, in any case.
fn windows_device(part: &str) -> bool {
    let stem = part.split('.').next().unwrap_or(part).trim_end_matches(' ').to_ascii_uppercase();
    match stem.as_bytes() {
        b"CON" | b"PRN" | b"AUX" | b"NUL" => true,
        [b'C', b'O', b'M', digit] | [b'L', b'P', b'T', digit] => (b'1'..=b'9').contains(digit),
        _ => false,
    }
}

impl Cache {
    /// The cache the environment names: `HF_HUB_CACHE`, else `HF_HOME/hub`, else
    /// `~/.cache/huggingface/hub`.
    pub fn from_env() -> Cache {
        let root = env_path("HF_HUB_CACHE")
            .or_else(|| env_path("HUGGINGFACE_HUB_CACHE"))
            .unwrap_or_else(|| hf_home().join("hub"));
        Cache { root }
    }

    /// A cache at `root`.
    pub fn new(root: impl Into<PathBuf>) -> Cache {
        Cache { root: root.into() }
    }

    /// The cache's folder.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `models--org--name`: the folder of one repository.
    pub fn repo_folder(&self, repo: &RepoId) -> PathBuf {
        self.root.join(repo.folder_name())
    }

    /// The commit `revision` names in the cache: itself when it is a commit hash, else what
    /// `refs/<revision>` recorded.
    pub fn commit(&self, repo: &RepoId, revision: &str) -> Option<String> {
        if is_commit(revision) {
            return Some(revision.to_string());
        }
        if !safe_relative(revision) {
            return None;
        }
        let path = self.repo_folder(repo).join("refs").join(revision);
        // A ref is a plain file; a link planted in its place names nothing nnx wrote.
        if std::fs::symlink_metadata(&path).ok()?.file_type().is_symlink() {
            return None;
        }
        let commit = std::fs::read_to_string(path).ok()?;
        let commit = commit.trim();
        is_commit(commit).then(|| commit.to_string())
    }

    /// The snapshot folder of `revision`, when the cache has it.
    ///
    /// # Errors
    /// [`HubProblem::NotCached`] when the revision was never downloaded; `why` says why the
    /// network was not asked.
    pub fn snapshot(&self, repo: &RepoId, revision: &str, why: Offline) -> Result<PathBuf> {
        let folder = self.commit(repo, revision).map(|commit| self.snapshot_folder(repo, &commit));
        match folder {
            Some(folder) if folder.is_dir() => Ok(folder),
            _ => Err(self.not_cached(repo, revision, None, why)),
        }
    }

    /// A file of a cached snapshot.
    ///
    /// # Errors
    /// [`HubProblem::NotCached`] naming the file (or the revision) that is missing.
    pub fn file(&self, repo: &RepoId, revision: &str, path: &str, why: Offline) -> Result<PathBuf> {
        let snapshot = self.snapshot(repo, revision, why)?;
        let file = snapshot.join(path);
        if safe_relative(path) && file.is_file() {
            Ok(file)
        } else {
            Err(self.not_cached(repo, revision, Some(path), why))
        }
    }

    /// The cached snapshot of `revision` with everything a load of its model needs: the
    /// configuration and the weights (one file, or the index and every shard it names).
    ///
    /// # Errors
    /// [`HubProblem::NotCached`] naming the first missing file.
    pub fn pretrained(&self, repo: &RepoId, revision: &str, why: Offline) -> Result<PathBuf> {
        let snapshot = self.snapshot(repo, revision, why)?;
        let missing = |file: &str| self.not_cached(repo, revision, Some(file), why);
        if !snapshot.join("config.json").is_file() {
            return Err(missing("config.json"));
        }
        for single in [SAFETENSORS, TORCH] {
            if snapshot.join(single).is_file() {
                return Ok(snapshot);
            }
        }
        for index in [SAFETENSORS_INDEX, TORCH_INDEX] {
            let path = snapshot.join(index);
            if path.is_file() {
                for shard in shards_of(&path)? {
                    if !snapshot.join(&shard).is_file() {
                        return Err(missing(&shard));
                    }
                }
                return Ok(snapshot);
            }
        }
        Err(missing(SAFETENSORS))
    }

    pub(crate) fn not_cached(&self, repo: &RepoId, revision: &str, file: Option<&str>, why: Offline) -> Error {
        let problem = HubProblem::NotCached {
            revision: revision.to_string(),
            file: file.map(str::to_string),
            cache: self.root.clone(),
            why,
        };
        Error::Hub { repo: repo.to_string(), problem }
    }

    pub(crate) fn snapshot_folder(&self, repo: &RepoId, commit: &str) -> PathBuf {
        self.repo_folder(repo).join("snapshots").join(commit)
    }
}

/// Writing into the cache, for downloads. A cache may be shared with other users, so nothing in
/// it is trusted: every folder written into is checked to be a real folder (a symbolic link
/// planted there would carry the write outside the cache), and files are opened without
/// following links.
#[cfg(feature = "hub")]
impl Cache {
    /// `models--org--name/<parts...>`, every folder on the way created if missing and checked
    /// to be a real folder, not a link.
    ///
    /// # Errors
    /// [`HubProblem::Link`] for a link where a folder belongs; [`Error::Io`] when a folder
    /// cannot be created.
    pub(crate) fn repo_subfolder(&self, repo: &RepoId, parts: &[&str]) -> Result<PathBuf> {
        create_dir(&self.root)?;
        let mut relative = PathBuf::from(repo.folder_name());
        relative.extend(parts);
        real_folders(repo, &self.root, &relative)
    }

    /// `blobs/<etag>`, its folder checked; a link in the blob's place is refused.
    pub(crate) fn blob(&self, repo: &RepoId, etag: &str) -> Result<PathBuf> {
        let blob = self.repo_subfolder(repo, &["blobs"])?.join(etag);
        refuse_link(repo, &blob)?;
        Ok(blob)
    }

    /// `.locks/models--org--name/<etag>.lock`, its folders checked.
    pub(crate) fn lock(&self, repo: &RepoId, etag: &str) -> Result<PathBuf> {
        create_dir(&self.root)?;
        let relative = Path::new(".locks").join(repo.folder_name());
        Ok(real_folders(repo, &self.root, &relative)?.join(format!("{etag}.lock")))
    }

    /// Records that `revision` (a branch or tag) resolved to `commit`.
    pub(crate) fn write_ref(&self, repo: &RepoId, revision: &str, commit: &str) -> Result<()> {
        if revision == commit || !safe_relative(revision) {
            return Ok(());
        }
        let mut parts: Vec<&str> = revision.split('/').collect();
        let name = parts.pop().unwrap_or(revision);
        parts.insert(0, "refs");
        let path = self.repo_subfolder(repo, &parts)?.join(name);
        refuse_link(repo, &path)?;
        if std::fs::read_to_string(&path).is_ok_and(|recorded| recorded == commit) {
            return Ok(());
        }
        // Written beside and renamed, so a reader never sees half a commit hash.
        crate::fs::write_atomic(&path, commit.as_bytes())
    }

    /// Makes `snapshots/<commit>/<path>` point at the blob: a relative symlink, or a copy where
    /// the file system has no symlinks. The pointer is the one link the layout has; it is
    /// replaced by a rename, never written through.
    pub(crate) fn link(&self, repo: &RepoId, commit: &str, path: &str, etag: &str) -> Result<PathBuf> {
        let mut parts: Vec<&str> = path.split('/').collect();
        let name = parts.pop().unwrap_or(path);
        parts.splice(0..0, ["snapshots", commit]);
        let pointer = self.repo_subfolder(repo, &parts)?.join(name);
        let blob = self.blob(repo, etag)?;
        // From the pointer's folder up to the repository folder, then into blobs.
        let depth = path.split('/').count() + 1;
        let mut target = PathBuf::new();
        for _ in 0..depth {
            target.push("..");
        }
        target.push("blobs");
        target.push(etag);
        if std::fs::read_link(&pointer).is_ok_and(|existing| existing == target) {
            return Ok(pointer);
        }
        // Made beside and renamed over the pointer, so that readers and other writers never see
        // it missing, and a copy never writes through an existing link into the blob.
        if let Ok((link, ())) = Staged::make(&pointer, |temporary| symlink(&target, temporary)) {
            link.commit()?;
        } else {
            let mut copy = StagedFile::create(&pointer)?;
            let copied = File::open(&blob).and_then(|mut from| std::io::copy(&mut from, &mut copy));
            copied.map_err(Error::io("copy into the snapshot", copy.path()))?;
            copy.commit()?;
        }
        Ok(pointer)
    }
}

/// `base/relative`, each folder of `relative` created if missing and checked to be a real
/// folder: `base` itself (the cache's root) may be a link, what the cache holds may not.
#[cfg(feature = "hub")]
fn real_folders(repo: &RepoId, base: &Path, relative: &Path) -> Result<PathBuf> {
    let mut path = base.to_path_buf();
    for part in relative.components() {
        path.push(part);
        // `create_dir` never follows a link: on one it fails with `AlreadyExists`, and the
        // check below refuses it.
        match std::fs::create_dir(&path) {
            Err(error) if error.kind() != std::io::ErrorKind::AlreadyExists => {
                return Err(Error::io("create the folder", &path)(error));
            }
            _ => {}
        }
        let kind = std::fs::symlink_metadata(&path).map_err(Error::io("read", &path))?.file_type();
        if kind.is_symlink() {
            return Err(link_error(repo, &path, "folder"));
        }
        if !kind.is_dir() {
            let found = std::io::Error::new(std::io::ErrorKind::AlreadyExists, "a file is there, not a folder");
            return Err(Error::io("create the folder", &path)(found));
        }
    }
    Ok(path)
}

/// Refuses a symbolic link where the cache keeps a file (a blob, a ref, a download in
/// progress): written through, it would change the file it points at.
#[cfg(feature = "hub")]
pub(crate) fn refuse_link(repo: &RepoId, path: &Path) -> Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_symlink() => Err(link_error(repo, path, "file")),
        _ => Ok(()),
    }
}

#[cfg(feature = "hub")]
pub(crate) fn link_error(repo: &RepoId, path: &Path, expected: &'static str) -> Error {
    Error::Hub { repo: repo.to_string(), problem: HubProblem::Link { path: path.to_path_buf(), expected } }
}

#[cfg(all(feature = "hub", unix))]
fn symlink(target: &Path, link: &Path) -> std::io::Result<()> {
    std::os::unix::fs::symlink(target, link)
}

#[cfg(all(feature = "hub", windows))]
fn symlink(target: &Path, link: &Path) -> std::io::Result<()> {
    std::os::windows::fs::symlink_file(target, link)
}

#[cfg(all(feature = "hub", not(any(unix, windows))))]
fn symlink(_: &Path, _: &Path) -> std::io::Result<()> {
    Err(std::io::ErrorKind::Unsupported.into())
}

/// The shard file names an index names, in order of first mention (checked by the index
/// reader: plain file names beside the index).
pub(crate) fn shards_of(index: &Path) -> Result<Vec<String>> {
    let index = crate::safetensors::index::ShardIndex::read(index)?;
    Ok(index.shards.iter().map(|shard| file_name(shard)).collect())
}

#[cfg(feature = "hub")]
pub(crate) fn create_dir(path: &Path) -> Result<()> {
    std::fs::create_dir_all(path).map_err(Error::io("create the folder", path))
}

fn file_name(path: &Path) -> String {
    path.file_name().map(|name| name.to_string_lossy().into_owned()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_must_stay_inside_on_every_platform() {
        for good in ["config.json", "1_Pooling/config.json", "a/b/c.safetensors", ".gitattributes", "console.txt"] {
            assert!(safe_relative(good), "{good}");
        }
        for bad in [
            "",
            "/etc/passwd",
            "a//b",
            "./a",
            "a/..",
            "../x",
            "a\\b",
            "C:evil.dll",
            "c:/x",
            "a/b.",
            "a/b ",
            "CON",
            "nul.txt",
            "Aux.json",
            "com1",
            "lpt9.bin",
            "sub/PRN.x",
            "a\u{1b}b",
        ] {
            assert!(!safe_relative(bad), "{bad:?}");
        }
    }
}
