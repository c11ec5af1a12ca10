//! Pretrained folders from the Hugging Face Hub: the shared cache that `huggingface_hub`
//! writes and reads, and (with the `hub` feature) the client that downloads into it and
//! uploads from a folder.
//!
//! A model is named by a local folder, a repository id (`org/name`), or an `hf://` path
//! (`hf://org/name@revision/path/in/repo`). [`pretrained_folder`] turns any of them into a local
//! folder: repeat loads are served from the cache, and `HF_HUB_OFFLINE=1` never touches the
//! network.

mod answers;
mod cache;
#[cfg(feature = "hub")]
mod client;
#[cfg(feature = "hub")]
mod http;
#[cfg(feature = "hub")]
mod upload;

use std::fmt;
use std::path::{Path, PathBuf};

pub use crate::error::{HubProblem, Missing, Offline};
#[cfg(all(feature = "hub", feature = "remote"))]
pub(crate) use cache::is_commit;
pub use cache::{Cache, offline, token};
#[cfg(feature = "hub")]
pub use client::{Download, Hub};
#[cfg(feature = "hub")]
pub use upload::CommitInfo;

use crate::{Error, Result};

/// The Hub's default address.
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

/// The Hub's address: `HF_ENDPOINT` without its trailing `/`, else [`DEFAULT_ENDPOINT`]. The
/// Hub client and the range reader of `hf://` paths both ask here, with [`token`], so that
/// they talk to the same Hub with the same credentials.
pub fn endpoint() -> String {
    match std::env::var("HF_ENDPOINT") {
        Ok(endpoint) if !endpoint.trim().is_empty() => endpoint.trim().trim_end_matches('/').to_string(),
        _ => DEFAULT_ENDPOINT.to_string(),
    }
}

/// A repository id: `name` or `org/name`, as the Hub accepts them.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RepoId(String);

impl RepoId {
    /// Checks `id` as `huggingface_hub` does: one or two parts of letters, digits, `-`, `_` and
    /// `.`, neither starting nor ending with `-` or `.`, no `--` or `..`, at most 96 characters.
    ///
    /// # Errors
    /// [`HubProblem::BadRepoId`].
    pub fn parse(id: &str) -> Result<RepoId> {
        let part_ok = |part: &str| {
            !part.is_empty()
                && part.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
                && !part.starts_with(['-', '.'])
                && !part.ends_with(['-', '.'])
        };
        let parts: Vec<&str> = id.split('/').collect();
        let ok = id.len() <= 96
            && !id.contains("--")
            && !id.contains("..")
            && (1..=2).contains(&parts.len())
            && parts.iter().all(|part| part_ok(part));
        if ok {
            Ok(RepoId(id.to_string()))
        } else {
            Err(Error::Hub { repo: id.to_string(), problem: HubProblem::BadRepoId })
        }
    }

    /// The id as written.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// `models--org--name`, the repository's folder in the cache.
    pub fn folder_name(&self) -> String {
        format!("models--{}", self.0.replace('/', "--"))
    }
}

impl fmt::Display for RepoId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// `hf://org/name[@revision][/path/in/repo]`: a repository, a revision (default `main`) and
/// optionally a file or folder in it. The one grammar of Hub paths: the cache, the Hub client
/// and the range reader of `hf://` archives all parse them here.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HubPath {
    /// The repository.
    pub repo: RepoId,
    /// A branch, tag or commit.
    pub revision: String,
    /// A path in the repository; empty for the whole model.
    pub path: String,
}

impl HubPath {
    /// The scheme that marks a Hub path.
    pub const SCHEME: &'static str = "hf://";

    /// Parses an `hf://` path. A revision containing `/` (such as `refs/pr/1`) is written
    /// URL-encoded (`refs%2Fpr%2F1`).
    ///
    /// # Errors
    /// [`HubProblem::BadUrl`] or [`HubProblem::BadRepoId`].
    pub fn parse(text: &str) -> Result<HubPath> {
        let bad = || Error::Hub { repo: String::new(), problem: HubProblem::BadUrl { given: text.to_string() } };
        let rest = text.strip_prefix(Self::SCHEME).ok_or_else(bad)?;
        let rest = rest.strip_prefix("models/").unwrap_or(rest);
        let mut parts = rest.splitn(3, '/');
        let first = parts.next().unwrap_or_default();
        let second = parts.next();
        let remainder = parts.next().unwrap_or_default();
        // `org/name@rev/path` or `name@rev/path`: the revision ends the repository part.
        let (id, revision, path) = match (first.split_once('@'), second) {
            (Some((name, revision)), _) => {
                let parts = [second.unwrap_or_default(), remainder];
                let path: Vec<&str> = parts.into_iter().filter(|part| !part.is_empty()).collect();
                (name.to_string(), revision.to_string(), path.join("/"))
            }
            (None, Some(second)) => match second.split_once('@') {
                Some((name, revision)) => (format!("{first}/{name}"), revision.to_string(), remainder.to_string()),
                None => (format!("{first}/{second}"), "main".to_string(), remainder.to_string()),
            },
            (None, None) => (first.to_string(), "main".to_string(), String::new()),
        };
        let revision = revision.replace("%2F", "/").replace("%2f", "/");
        let path = path.trim_end_matches('/').to_string();
        if revision.is_empty() || !(path.is_empty() || cache::safe_relative(&path)) {
            return Err(bad());
        }
        let repo = RepoId::parse(&id).map_err(|_| bad())?;
        Ok(HubPath { repo, revision, path })
    }

    /// The repository at the revision, without the path: `hf://org/name@revision`.
    pub fn root(&self) -> HubPath {
        HubPath { path: String::new(), ..self.clone() }
    }

    /// The URL under `endpoint` that serves the revision's files, with a path in the
    /// repository appended: `{endpoint}/org/name/resolve/{revision}`.
    pub fn resolve_base(&self, endpoint: &str) -> String {
        format!("{}/{}/resolve/{}", endpoint.trim_end_matches('/'), self.repo, self.revision.replace('/', "%2F"))
    }
}

impl fmt::Display for HubPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}@{}", Self::SCHEME, self.repo, self.revision.replace('/', "%2F"))?;
        if !self.path.is_empty() {
            write!(f, "/{}", self.path)?;
        }
        Ok(())
    }
}

/// The local folder that holds the pretrained model `source`: `source` itself when it is a
/// folder on disk; else `source` is a repository id or an `hf://` path, whose configuration and
/// weights (and the tokenizer files beside them) come from the cache, downloaded first with
/// the `hub` feature unless `HF_HUB_OFFLINE` is set.
///
/// # Errors
/// [`Error::Io`] for a path that is neither a folder nor a repository id; [`Error::Hub`] when
/// the repository cannot be had.
pub fn pretrained_folder(source: &Path) -> Result<PathBuf> {
    if source.is_dir() {
        return Ok(source.to_path_buf());
    }
    let not_found = || Error::Io {
        action: "open the pretrained folder",
        path: source.to_path_buf(),
        source: std::io::Error::new(
            std::io::ErrorKind::NotFound,
            "no such folder, and not a Hub repository id (`org/name` or `hf://org/name`)",
        ),
    };
    let text = source.to_str().ok_or_else(not_found)?;
    let hub = if text.starts_with(HubPath::SCHEME) {
        HubPath::parse(text)?
    } else {
        let repo = RepoId::parse(text).map_err(|_| not_found())?;
        HubPath { repo, revision: "main".to_string(), path: String::new() }
    };
    let folder = fetch_pretrained(&hub.repo, &hub.revision)?;
    Ok(if hub.path.is_empty() { folder } else { folder.join(&hub.path) })
}

/// A path the command line was given: a local path as it is, or an `hf://` path made local. A
/// path to a file fetches that file (and, for a shard index, the shards it names); a path to a
/// repository fetches what a load of its model needs.
///
/// # Errors
/// As [`pretrained_folder`].
pub fn local_path(text: &str) -> Result<PathBuf> {
    if !text.starts_with(HubPath::SCHEME) {
        return Ok(PathBuf::from(text));
    }
    let hub = HubPath::parse(text)?;
    if hub.path.is_empty() {
        return fetch_pretrained(&hub.repo, &hub.revision);
    }
    fetch_file(&hub)
}

#[cfg(feature = "hub")]
fn fetch_pretrained(repo: &RepoId, revision: &str) -> Result<PathBuf> {
    Hub::from_env()?.pretrained(repo, revision)
}

#[cfg(not(feature = "hub"))]
fn fetch_pretrained(repo: &RepoId, revision: &str) -> Result<PathBuf> {
    Cache::from_env().pretrained(repo, revision, Offline::NoHubFeature)
}

#[cfg(feature = "hub")]
fn fetch_file(hub: &HubPath) -> Result<PathBuf> {
    Hub::from_env()?.file_with_shards(&hub.repo, &hub.revision, &hub.path)
}

#[cfg(not(feature = "hub"))]
fn fetch_file(hub: &HubPath) -> Result<PathBuf> {
    let cache = Cache::from_env();
    let path = cache.file(&hub.repo, &hub.revision, &hub.path, Offline::NoHubFeature)?;
    if hub.path.ends_with(".index.json") {
        for shard in cache::shards_of(&path)? {
            let sibling = match hub.path.rsplit_once('/') {
                Some((folder, _)) => format!("{folder}/{shard}"),
                None => shard,
            };
            cache.file(&hub.repo, &hub.revision, &sibling, Offline::NoHubFeature)?;
        }
    }
    Ok(path)
}

/// The parsers of what a Hub sends, for the fuzz targets; not part of the API.
#[doc(hidden)]
pub mod fuzzing {
    /// The commit and the file names of a revision listing, as `Hub::revision` reads
    /// them (with the `hub` feature).
    ///
    /// # Errors
    /// What is wrong with the answer.
    pub fn revision_listing(bytes: &[u8]) -> Result<(String, Vec<String>), String> {
        super::answers::revision(bytes)
    }

    /// The `(path, mode)` pairs of a `preupload` answer.
    ///
    /// # Errors
    /// What is wrong with the answer.
    pub fn preupload_answer(bytes: &[u8]) -> Result<Vec<(String, String)>, String> {
        let answer: super::answers::Preupload = super::answers::parse(bytes)?;
        Ok(answer.files.into_iter().map(|file| (file.path, file.upload_mode)).collect())
    }

    /// The object ids of a git-LFS batch answer, each with its upload and verify URLs and its
    /// error message.
    ///
    /// # Errors
    /// What is wrong with the answer.
    pub fn lfs_batch_answer(bytes: &[u8]) -> Result<Vec<LfsObject>, String> {
        let answer: super::answers::LfsBatch = super::answers::parse(bytes)?;
        let href = |action: Option<super::answers::LfsAction>| {
            action.map(|action| (action.href, action.header.into_iter().collect()))
        };
        Ok(answer
            .objects
            .into_iter()
            .map(|object| {
                let (upload, verify) = object.actions.map_or((None, None), |a| (href(a.upload), href(a.verify)));
                let error = object.error.map(|error| (error.code, error.message.unwrap_or_default()));
                LfsObject { oid: object.oid, upload, verify, error }
            })
            .collect())
    }

    /// One object of a git-LFS batch answer.
    #[derive(Debug)]
    pub struct LfsObject {
        /// Its id.
        pub oid: String,
        /// The upload action's URL and headers.
        pub upload: Option<(String, Vec<(String, String)>)>,
        /// The verify action's URL and headers.
        pub verify: Option<(String, Vec<(String, String)>)>,
        /// The error's code and message.
        pub error: Option<(u64, String)>,
    }

    /// The commit and page of a commit answer.
    ///
    /// # Errors
    /// What is wrong with the answer.
    pub fn commit_answer(bytes: &[u8]) -> Result<(String, String), String> {
        let answer: super::answers::CommitAnswer = super::answers::parse(bytes)?;
        Ok((answer.commit, answer.url))
    }

    /// The message of an error body `{"error": "..."}`.
    pub fn error_message(bytes: &[u8]) -> Option<String> {
        super::answers::error_message(bytes)
    }

    /// Whether a name from a server may be joined to a folder of the cache.
    pub fn safe_name(name: &str) -> bool {
        super::cache::safe_relative(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repo_ids_follow_the_hub_rules() {
        for good in ["gpt2", "openai-community/gpt2", "org/model.v1_2", "a/b"] {
            assert!(RepoId::parse(good).is_ok(), "{good}");
        }
        for bad in ["", "/x", "x/", "a/b/c", "a--b/c", "a/b..c", "-a/b", "a/b.", "a b/c", "../x", &"x".repeat(97)] {
            assert!(RepoId::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(RepoId::parse("org/name").unwrap().folder_name(), "models--org--name");
    }

    #[test]
    fn hub_paths_parse_repo_revision_and_file() {
        let parse = |text: &str| {
            let path = HubPath::parse(text).unwrap();
            (path.repo.to_string(), path.revision, path.path)
        };
        let owned = |a: &str, b: &str, c: &str| (a.to_string(), b.to_string(), c.to_string());
        assert_eq!(parse("hf://org/name"), owned("org/name", "main", ""));
        assert_eq!(parse("hf://org/name@v1"), owned("org/name", "v1", ""));
        assert_eq!(parse("hf://org/name@v1/sub/model.safetensors"), owned("org/name", "v1", "sub/model.safetensors"));
        assert_eq!(parse("hf://org/name/config.json"), owned("org/name", "main", "config.json"));
        assert_eq!(parse("hf://gpt2@refs%2Fpr%2F1/config.json"), owned("gpt2", "refs/pr/1", "config.json"));
        assert_eq!(parse("hf://models/org/name"), owned("org/name", "main", ""));
        for bad in ["org/name", "hf://", "hf://org/name@", "hf://org/name/../x", "hf://a--b/c"] {
            assert!(HubPath::parse(bad).is_err(), "{bad}");
        }
        let path = HubPath::parse("hf://org/name@refs%2Fpr%2F1/a.json").unwrap();
        assert_eq!(HubPath::parse(&path.to_string()).unwrap(), path);
        assert_eq!(path.root().to_string(), "hf://org/name@refs%2Fpr%2F1");
        assert_eq!(path.resolve_base("http://hub/"), "http://hub/org/name/resolve/refs%2Fpr%2F1");
    }
}
