//! Downloads from the Hub into the shared cache, as `huggingface_hub` does it and readable by
//! it: resolve a revision to a commit, fetch only the files a load needs, write each blob as
//! `blobs/<etag>.incomplete` under a lock, resume it with a Range request after a broken
//! connection, check LFS files against their sha256, then rename it into place.

use std::fs::{File, OpenOptions};
use std::io::{IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use sha2::{Digest, Sha256};

use super::RepoId;
use super::cache::{self, Cache, SAFETENSORS, SAFETENSORS_INDEX, TORCH, TORCH_INDEX, env_flag, is_commit};
use super::http::{About, Http, Reply, Request, encode_path, encode_segment, protocol, refused};
use crate::error::{HubProblem, Offline};
use crate::{Error, Result};

/// The Hub's default address.
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

/// Files beside the weights that loading a model's tokenizer or pipeline reads; small, and
/// fetched with the weights when the repository has them.
const COMPANIONS: &[&str] = &[
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "vocab.txt",
    "vocab.json",
    "merges.txt",
    "modules.json",
    "sentence_bert_config.json",
    "config_sentence_transformers.json",
    "1_Pooling/config.json",
];

/// The most files downloaded at once.
const PARALLEL: usize = 8;

/// A client of one Hub endpoint, downloading into one cache.
#[derive(Clone)]
pub struct Hub {
    endpoint: String,
    cache: Cache,
    pub(crate) http: Http,
    offline: bool,
    progress: bool,
}

/// What [`Hub::download`] fetched.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Download {
    /// The repository.
    pub repo: RepoId,
    /// The commit the revision resolved to.
    pub commit: String,
    /// `snapshots/<commit>` in the cache.
    pub folder: PathBuf,
    /// The files of the snapshot that were asked for, all present in `folder`.
    pub files: Vec<String>,
}

/// A file's identity as the resolve endpoint states it.
struct FileMeta {
    commit: String,
    etag: String,
    size: Option<u64>,
    /// Where the bytes are: the resolve URL itself, or the CDN it redirects to.
    location: String,
}

impl Hub {
    /// The client the environment describes: `HF_ENDPOINT` (default the Hub), the token from
    /// `HF_TOKEN` or the token file, the cache of [`Cache::from_env`], `HF_HUB_OFFLINE`, and
    /// progress bars on a terminal unless `HF_HUB_DISABLE_PROGRESS_BARS` is set.
    ///
    /// # Errors
    /// None today; reserved for endpoints that cannot be used.
    pub fn from_env() -> Result<Hub> {
        let endpoint = std::env::var("HF_ENDPOINT").ok().filter(|e| !e.trim().is_empty());
        let endpoint = endpoint.unwrap_or_else(|| DEFAULT_ENDPOINT.to_string());
        let hub = Hub::new(&endpoint).with_token(cache::token()).with_offline(cache::offline());
        Ok(hub.with_progress(std::io::stderr().is_terminal() && !env_flag("HF_HUB_DISABLE_PROGRESS_BARS")))
    }

    /// A client of `endpoint` without a token, on the environment's cache, online, quiet.
    pub fn new(endpoint: &str) -> Hub {
        let endpoint = endpoint.trim().trim_end_matches('/').to_string();
        Hub { http: Http::new(&endpoint, None), endpoint, cache: Cache::from_env(), offline: false, progress: false }
    }

    /// Downloads into `cache` instead.
    pub fn with_cache(mut self, cache: Cache) -> Hub {
        self.cache = cache;
        self
    }

    /// Sends `token` to the endpoint (never to the CDNs it redirects to).
    pub fn with_token(mut self, token: Option<String>) -> Hub {
        self.http.token = token;
        self
    }

    /// Never uses the network: every answer comes from the cache.
    pub fn with_offline(mut self, offline: bool) -> Hub {
        self.offline = offline;
        self
    }

    /// Draws progress bars on standard error.
    pub fn with_progress(mut self, progress: bool) -> Hub {
        self.progress = progress;
        self
    }

    /// Retries after a server error, a timeout or a broken connection `retries` times, waiting
    /// `backoff`, then twice as long each time.
    pub fn with_retries(mut self, retries: u32, backoff: std::time::Duration) -> Hub {
        self.http.retries = retries;
        self.http.backoff = backoff;
        self
    }

    /// The endpoint.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The cache downloads go to.
    pub fn cache(&self) -> &Cache {
        &self.cache
    }

    fn hub_error(&self, repo: &RepoId, problem: HubProblem) -> Error {
        Error::Hub { repo: repo.to_string(), problem }
    }

    /// The commit `revision` names and the files of the repository at that commit.
    ///
    /// # Errors
    /// [`Error::Hub`]: unreachable, unauthorized, no such repository or revision.
    pub fn revision(&self, repo: &RepoId, revision: &str) -> Result<(String, Vec<String>)> {
        let url = format!("{}/api/models/{}/revision/{}", self.endpoint, repo, encode_segment(revision));
        let reply = self.http.send(repo, &Request::new("GET", url))?;
        if reply.status() != 200 {
            return Err(refused(repo, &self.http, reply, About { revision, file: None }));
        }
        let url = reply.url.clone();
        let value = reply.json(repo)?;
        let commit = value.get("sha").and_then(|sha| sha.as_str()).filter(|sha| is_commit(sha));
        let commit = commit.ok_or_else(|| protocol(repo, &url, "no commit `sha` in the revision's info".into()))?;
        let siblings = value.get("siblings").and_then(|s| s.as_array()).cloned().unwrap_or_default();
        let mut files = Vec::with_capacity(siblings.len());
        for sibling in siblings {
            let name = sibling.get("rfilename").and_then(|name| name.as_str());
            match name {
                Some(name) if cache::safe_relative(name) => files.push(name.to_string()),
                _ => return Err(protocol(repo, &url, format!("a sibling is not a relative file name: {sibling}"))),
            }
        }
        Ok((commit.to_string(), files))
    }

    /// One file of `revision` in the cache, downloaded if missing (`hf_hub_download`).
    ///
    /// # Errors
    /// [`Error::Hub`] naming the file, or [`Error::Io`] writing the cache.
    pub fn file(&self, repo: &RepoId, revision: &str, path: &str) -> Result<PathBuf> {
        self.files(repo, revision, &[path.to_string()]).map(|mut paths| paths.remove(0))
    }

    /// A file, and when it is a shard index, the shards it names.
    ///
    /// # Errors
    /// As [`Hub::file`].
    pub fn file_with_shards(&self, repo: &RepoId, revision: &str, path: &str) -> Result<PathBuf> {
        let local = self.file(repo, revision, path)?;
        if path.ends_with(".index.json") {
            let commit = commit_of_snapshot(&local, path);
            let folder = path.rsplit_once('/').map(|(folder, _)| format!("{folder}/"));
            let shards: Vec<String> = cache::shards_of(&local)?
                .into_iter()
                .map(|shard| format!("{}{shard}", folder.as_deref().unwrap_or_default()))
                .collect();
            self.files(repo, commit.as_deref().unwrap_or(revision), &shards)?;
        }
        Ok(local)
    }

    /// The snapshot folder of `revision` with the configuration, the weights (one file, or an
    /// index and only the shards it names) and the tokenizer files the repository has.
    ///
    /// # Errors
    /// [`Error::Hub`]: what is missing, and why it could not be downloaded.
    pub fn pretrained(&self, repo: &RepoId, revision: &str) -> Result<PathBuf> {
        if self.offline {
            return self.cache.pretrained(repo, revision, Offline::Environment);
        }
        // A commit already in the cache with everything in place needs no network.
        if is_commit(revision)
            && let Ok(folder) = self.cache.pretrained(repo, revision, Offline::Environment)
        {
            return Ok(folder);
        }
        let (commit, listing) = match self.revision(repo, revision) {
            Ok(found) => found,
            Err(error) => {
                return self.cached_instead(repo, revision, error, |why| self.cache.pretrained(repo, revision, why));
            }
        };
        self.cache.write_ref(repo, revision, &commit)?;
        let has = |name: &str| listing.iter().any(|file| file == name);
        if !has("config.json") {
            return Err(self.missing(repo, &commit, "config.json"));
        }
        let weights = [SAFETENSORS, SAFETENSORS_INDEX, TORCH, TORCH_INDEX].into_iter().find(|name| has(name));
        let weights = weights.ok_or_else(|| self.missing(repo, &commit, SAFETENSORS))?;
        let mut wanted = vec!["config.json".to_string()];
        if weights.ends_with(".index.json") {
            let index = self.file(repo, &commit, weights)?;
            wanted.extend(cache::shards_of(&index)?);
        } else {
            wanted.push(weights.to_string());
        }
        wanted.extend(COMPANIONS.iter().filter(|name| has(name)).map(|name| name.to_string()));
        self.files(repo, &commit, &wanted)?;
        Ok(self.cache.snapshot_folder(repo, &commit))
    }

    /// The files of `revision` that match any of `include` (globs as `huggingface_hub` reads
    /// them: `*` crosses `/`, and a pattern ending in `/` means everything under it); every file
    /// when `include` is empty (`snapshot_download`).
    ///
    /// # Errors
    /// [`Error::Hub`]: a bad glob, a revision or file that cannot be had.
    pub fn download(&self, repo: &RepoId, revision: &str, include: &[String]) -> Result<Download> {
        let mut globs = globset::GlobSetBuilder::new();
        for pattern in include {
            let pattern = if pattern.ends_with('/') { format!("{pattern}*") } else { pattern.clone() };
            let glob = globset::Glob::new(&pattern)
                .map_err(|error| self.hub_error(repo, HubProblem::BadUrl { given: format!("{pattern} ({error})") }))?;
            globs.add(glob);
        }
        let globs = globs.build().map_err(|error| {
            self.hub_error(repo, HubProblem::BadUrl { given: format!("{} ({error})", include.join(" ")) })
        })?;
        let keep = |file: &str| include.is_empty() || globs.is_match(file);
        if self.offline {
            let folder = self.cache.snapshot(repo, revision, Offline::Environment)?;
            let commit = self.cache.commit(repo, revision).unwrap_or_default();
            let files = walk(&folder).into_iter().filter(|file| keep(file)).collect();
            return Ok(Download { repo: repo.clone(), commit, folder, files });
        }
        let (commit, listing) = self.revision(repo, revision)?;
        self.cache.write_ref(repo, revision, &commit)?;
        let files: Vec<String> = listing.into_iter().filter(|file| keep(file)).collect();
        self.files(repo, &commit, &files)?;
        let folder = self.cache.snapshot_folder(repo, &commit);
        crate::hub::cache::create_dir(&folder)?;
        Ok(Download { repo: repo.clone(), commit, folder, files })
    }

    /// After a failed listing: the cache's copy when the network was the problem and the cache
    /// has what `lookup` needs, else the error.
    fn cached_instead(
        &self,
        repo: &RepoId,
        revision: &str,
        error: Error,
        lookup: impl FnOnce(Offline) -> Result<PathBuf>,
    ) -> Result<PathBuf> {
        let unreachable = matches!(&error, Error::Hub { problem: HubProblem::Network { .. }, .. });
        if unreachable
            && self.cache.commit(repo, revision).is_some()
            && let Ok(folder) = lookup(Offline::Unreachable)
        {
            return Ok(folder);
        }
        Err(error)
    }

    fn missing(&self, repo: &RepoId, commit: &str, file: &str) -> Error {
        let url = format!("{}/{}/resolve/{}/{}", self.endpoint, repo, commit, encode_path(file));
        let what = crate::error::Missing::File { file: file.to_string(), revision: commit.to_string() };
        self.hub_error(repo, HubProblem::NotFound { url, what })
    }

    /// Downloads `paths` of `revision` (several at once), returning their snapshot paths in
    /// order.
    fn files(&self, repo: &RepoId, revision: &str, paths: &[String]) -> Result<Vec<PathBuf>> {
        for path in paths {
            if !cache::safe_relative(path) {
                return Err(self.hub_error(repo, HubProblem::BadUrl { given: path.clone() }));
            }
        }
        let bars = self.progress.then(|| MultiProgress::with_draw_target(ProgressDrawTarget::stderr()));
        let next = AtomicUsize::new(0);
        let results: Mutex<Vec<Option<Result<PathBuf>>>> = Mutex::new((0..paths.len()).map(|_| None).collect());
        std::thread::scope(|scope| {
            for _ in 0..paths.len().min(PARALLEL) {
                scope.spawn(|| {
                    loop {
                        let at = next.fetch_add(1, Ordering::Relaxed);
                        let Some(path) = paths.get(at) else { break };
                        let result = self.one_file(repo, revision, path, bars.as_ref());
                        let failed = result.is_err();
                        if let Ok(mut results) = results.lock() {
                            results[at] = Some(result);
                        }
                        if failed {
                            // Leave the rest: the first error is what the caller reports.
                            next.store(paths.len(), Ordering::Relaxed);
                        }
                    }
                });
            }
        });
        let results = results.into_inner().unwrap_or_else(|poisoned| poisoned.into_inner());
        // The first failure is the answer, even if files after it were never started.
        let mut paths_out = Vec::with_capacity(paths.len());
        let mut unstarted = None;
        for (path, result) in paths.iter().zip(results) {
            match result {
                Some(result) => paths_out.push(result?),
                None => unstarted = unstarted.or(Some(path)),
            }
        }
        if let Some(path) = unstarted {
            return Err(self.missing(repo, revision, path));
        }
        Ok(paths_out)
    }

    fn one_file(&self, repo: &RepoId, revision: &str, path: &str, bars: Option<&MultiProgress>) -> Result<PathBuf> {
        if self.offline {
            return self.cache.file(repo, revision, path, Offline::Environment);
        }
        if is_commit(revision) {
            let pointer = self.cache.snapshot_folder(repo, revision).join(path);
            if pointer.is_file() {
                return Ok(pointer);
            }
        }
        let meta = match self.metadata(repo, revision, path) {
            Ok(meta) => meta,
            Err(error) => {
                let unreachable = matches!(&error, Error::Hub { problem: HubProblem::Network { .. }, .. });
                if unreachable && let Ok(cached) = self.cache.file(repo, revision, path, Offline::Unreachable) {
                    return Ok(cached);
                }
                return Err(error);
            }
        };
        self.cache.write_ref(repo, revision, &meta.commit)?;
        let blob = self.cache.blob(repo, &meta.etag);
        if !blob_complete(&blob, meta.size) {
            self.fetch_blob(repo, path, &meta, &blob, bars)?;
        }
        self.cache.link(repo, &meta.commit, path, &meta.etag)
    }

    /// HEAD on the resolve URL, following the Hub's relative redirects (renamed repositories)
    /// and stopping at a redirect to another origin, whose headers describe the file.
    fn metadata(&self, repo: &RepoId, revision: &str, path: &str) -> Result<FileMeta> {
        let mut url = format!("{}/{}/resolve/{}/{}", self.endpoint, repo, encode_segment(revision), encode_path(path));
        for _ in 0..10 {
            let request = Request::new("HEAD", url.clone()).header("Accept-Encoding", "identity");
            let reply = self.http.send(repo, &request)?;
            let status = reply.status();
            let location = reply.header("location").map(str::to_string);
            if (300..400).contains(&status)
                && let Some(location) = location.as_deref().filter(|location| location.starts_with('/'))
            {
                url = format!("{}{}", self.endpoint, location);
                continue;
            }
            if !(200..400).contains(&status) {
                return Err(refused(repo, &self.http, reply, About { revision, file: Some(path) }));
            }
            return self.file_meta(repo, &reply, location, status);
        }
        Err(protocol(repo, &url, "more than 10 redirects".into()))
    }

    fn file_meta(&self, repo: &RepoId, reply: &Reply, location: Option<String>, status: u16) -> Result<FileMeta> {
        let need = |name: &str| {
            reply
                .header(name)
                .map(str::to_string)
                .ok_or_else(|| protocol(repo, &reply.url, format!("no `{name}` header")))
        };
        let commit = need("x-repo-commit")?;
        let etag = reply.header("x-linked-etag").or_else(|| reply.header("etag")).map(normalize_etag);
        let etag = etag.filter(|etag| cache::safe_relative(etag) && !etag.contains('/'));
        let etag =
            etag.ok_or_else(|| protocol(repo, &reply.url, "no usable `ETag` or `X-Linked-Etag` header".into()))?;
        if !is_commit(&commit) {
            return Err(protocol(repo, &reply.url, format!("`X-Repo-Commit` is `{commit}`, not a commit hash")));
        }
        let redirected = (300..400).contains(&status);
        let size = reply
            .header("x-linked-size")
            .or_else(|| if redirected { None } else { reply.header("content-length") })
            .and_then(|size| size.trim().parse::<u64>().ok());
        let location = if redirected { location } else { None }.unwrap_or_else(|| reply.url.clone());
        Ok(FileMeta { commit, etag, size, location })
    }

    /// Downloads one blob under its lock: resumes `<blob>.incomplete`, checks the size and (for
    /// LFS files, whose etag is their sha256) the hash, then renames it into place.
    fn fetch_blob(
        &self,
        repo: &RepoId,
        path: &str,
        meta: &FileMeta,
        blob: &Path,
        bars: Option<&MultiProgress>,
    ) -> Result<()> {
        let lock_path = self.cache.lock(repo, &meta.etag);
        cache::create_dir(lock_path.parent().unwrap_or(self.cache.root()))?;
        cache::create_dir(blob.parent().unwrap_or(self.cache.root()))?;
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(Error::io("open the lock", &lock_path))?;
        // Another process downloading the same blob holds this; wait for it, then find the blob.
        lock.lock().map_err(Error::io("lock", &lock_path))?;
        if blob_complete(blob, meta.size) {
            return Ok(());
        }
        let incomplete = blob.with_file_name(format!("{}.incomplete", meta.etag));
        let bar = bars.map(|bars| {
            let bar = bars.add(ProgressBar::new(meta.size.unwrap_or(0)));
            let style = ProgressStyle::with_template(
                "{msg:30!} {bar:30} {bytes:>10}/{total_bytes:<10} {bytes_per_sec:>12} {eta}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar());
            bar.set_style(style);
            bar.set_message(path.to_string());
            bar
        });
        let outcome = self.transfer(repo, path, meta, &incomplete, bar.as_ref());
        if let Some(bar) = &bar {
            bar.finish();
        }
        outcome?;
        if let Err(error) = verify(repo, path, meta, &incomplete) {
            let _ = std::fs::remove_file(&incomplete);
            return Err(error);
        }
        std::fs::rename(&incomplete, blob).map_err(Error::io("rename into the cache", blob))?;
        drop(lock);
        Ok(())
    }

    /// Fills `incomplete` from the file's location, resuming after what it holds.
    fn transfer(
        &self,
        repo: &RepoId,
        path: &str,
        meta: &FileMeta,
        incomplete: &Path,
        bar: Option<&ProgressBar>,
    ) -> Result<()> {
        let mut attempt = 0;
        loop {
            let mut have = std::fs::metadata(incomplete).map(|m| m.len()).unwrap_or(0);
            if meta.size.is_some_and(|size| have > size) {
                have = 0;
            }
            if meta.size.is_some_and(|size| have == size) && have > 0 {
                return Ok(());
            }
            let mut request = Request::new("GET", meta.location.clone()).header("Accept-Encoding", "identity");
            if have > 0 {
                request = request.header("Range", format!("bytes={have}-"));
            }
            let reply = self.http.send(repo, &request)?;
            let status = reply.status();
            let append = match status {
                206 if have > 0 => true,
                200 => false,
                // The server cannot serve the range: start over.
                416 => {
                    std::fs::remove_file(incomplete).map_err(Error::io("remove", incomplete))?;
                    continue;
                }
                _ => return Err(refused(repo, &self.http, reply, About { revision: &meta.commit, file: Some(path) })),
            };
            let mut file = OpenOptions::new()
                .create(true)
                .write(true)
                .append(append)
                .truncate(!append)
                .open(incomplete)
                .map_err(Error::io("write", incomplete))?;
            if let Some(bar) = bar {
                bar.set_position(if append { have } else { 0 });
            }
            match copy_body(reply, &mut file, bar) {
                Ok(()) => {
                    file.sync_all().map_err(Error::io("write", incomplete))?;
                    return Ok(());
                }
                Err(CopyError::Disk(error)) => return Err(Error::io("write", incomplete)(error)),
                Err(CopyError::Network(message)) => {
                    if attempt >= self.http.retries {
                        return Err(self.hub_error(repo, HubProblem::Network { url: meta.location.clone(), message }));
                    }
                    std::thread::sleep(self.http.wait(attempt));
                    attempt += 1;
                }
            }
        }
    }
}

enum CopyError {
    Network(String),
    Disk(std::io::Error),
}

fn copy_body(reply: Reply, file: &mut File, bar: Option<&ProgressBar>) -> std::result::Result<(), CopyError> {
    let mut reader = reply.response.into_body().into_reader();
    let mut buffer = vec![0u8; 1 << 16];
    loop {
        let read = reader.read(&mut buffer).map_err(|error| CopyError::Network(error.to_string()))?;
        if read == 0 {
            return Ok(());
        }
        file.write_all(&buffer[..read]).map_err(CopyError::Disk)?;
        if let Some(bar) = bar {
            bar.inc(read as u64);
        }
    }
}

/// The size must match; an LFS file (a 64-hex etag) must hash to it.
fn verify(repo: &RepoId, path: &str, meta: &FileMeta, incomplete: &Path) -> Result<()> {
    let corrupt = |expected: String, found: String| Error::Hub {
        repo: repo.to_string(),
        problem: HubProblem::Corrupt { file: path.to_string(), expected, found },
    };
    let size = std::fs::metadata(incomplete).map_err(Error::io("read", incomplete))?.len();
    if let Some(expected) = meta.size
        && expected != size
    {
        return Err(corrupt(format!("{expected} bytes"), format!("{size} bytes")));
    }
    let is_sha256 = meta.etag.len() == 64 && meta.etag.bytes().all(|b| b.is_ascii_hexdigit());
    if is_sha256 {
        let found = sha256_file(incomplete)?;
        if !found.eq_ignore_ascii_case(&meta.etag) {
            return Err(corrupt(format!("sha256 {}", meta.etag), format!("sha256 {found}")));
        }
    }
    Ok(())
}

/// The sha256 of a file, in lowercase hex.
pub(crate) fn sha256_file(path: &Path) -> Result<String> {
    let mut file = File::open(path).map_err(Error::io("read", path))?;
    let mut hasher = Sha256::new();
    let mut buffer = vec![0u8; 1 << 20];
    loop {
        let read = file.read(&mut buffer).map_err(Error::io("read", path))?;
        if read == 0 {
            break;
        }
        hasher.update(&buffer[..read]);
    }
    Ok(hasher.finalize().iter().map(|byte| format!("{byte:02x}")).collect())
}

fn blob_complete(blob: &Path, size: Option<u64>) -> bool {
    std::fs::metadata(blob).is_ok_and(|m| m.is_file() && size.is_none_or(|size| m.len() == size))
}

/// `W/"abc"` and `"abc"` are the etag `abc`.
fn normalize_etag(etag: &str) -> String {
    etag.trim().trim_start_matches("W/").trim_matches('"').to_string()
}

/// The commit of a snapshot path `.../snapshots/<commit>/<path>`.
fn commit_of_snapshot(local: &Path, path: &str) -> Option<String> {
    let mut folder = local.to_path_buf();
    for _ in 0..path.split('/').count() {
        folder.pop();
    }
    let name = folder.file_name()?.to_str()?;
    is_commit(name).then(|| name.to_string())
}

/// The files under `folder`, as `/`-separated relative paths, sorted.
pub(crate) fn walk(folder: &Path) -> Vec<String> {
    let mut files = Vec::new();
    let mut pending = vec![(folder.to_path_buf(), String::new())];
    while let Some((dir, prefix)) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let relative = if prefix.is_empty() { name.clone() } else { format!("{prefix}/{name}") };
            let path = entry.path();
            if path.is_dir() {
                pending.push((path, relative));
            } else if path.is_file() {
                files.push(relative);
            }
        }
    }
    files.sort();
    files
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etags_lose_quotes_and_weakness() {
        assert_eq!(normalize_etag("\"abc\""), "abc");
        assert_eq!(normalize_etag("W/\"abc\""), "abc");
        assert_eq!(normalize_etag("abc"), "abc");
    }
}
