//! Downloads from the Hub into the shared cache, as `huggingface_hub` does it and readable by
//! it: resolve a revision to a commit, fetch only the files a load needs, write each blob as
//! `blobs/<etag>.incomplete` under a lock, resume it with a Range request after a broken
//! connection, check it against its etag (sha256 for LFS files, the git blob sha1 for the
//! others), then rename it into place.
//!
//! The server is not trusted: a download never grows past the size announced, a resume
//! appends only where the server says it starts, and a transfer slower than a minimum rate is
//! stopped, so that a hostile or broken server costs bounded disk, memory and time.

use std::fs::{File, OpenOptions};
use std::io::{IsTerminal, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use sha1::Sha1;
use sha2::{Digest, Sha256};

use super::cache::{self, Cache, SAFETENSORS, SAFETENSORS_INDEX, TORCH, TORCH_INDEX, env_flag, is_commit};
use super::http::{About, Http, Reply, Request, encode_path, encode_segment, protocol, refused};
use super::{RepoId, answers};
use crate::error::{HubProblem, Offline};
use crate::fs::open_no_follow;
use crate::text::redact_urls;
use crate::{Error, Result};

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

/// The slowest transfer kept alive, unless `NNX_HUB_MIN_RATE` says otherwise: a server that
/// trickles bytes resets every per-read timeout, so only a rate over a window catches it.
const MIN_RATE: u64 = 1024;
const MIN_RATE_WINDOW: Duration = Duration::from_secs(30);

/// The slowest a download may be: fewer than `bytes_per_second` over `window` stops it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct MinRate {
    bytes_per_second: u64,
    window: Duration,
}

impl MinRate {
    /// `NNX_HUB_MIN_RATE` (bytes per second, `0` turns the check off) over
    /// `NNX_HUB_MIN_RATE_WINDOW` seconds, else 1 KiB/s over 30 s.
    fn from_env() -> MinRate {
        let number = |name: &str| std::env::var(name).ok().and_then(|text| text.trim().parse::<f64>().ok());
        let bytes_per_second = number("NNX_HUB_MIN_RATE").filter(|rate| rate.is_finite() && *rate >= 0.0);
        let window = number("NNX_HUB_MIN_RATE_WINDOW").filter(|seconds| seconds.is_finite() && *seconds > 0.0);
        MinRate {
            bytes_per_second: bytes_per_second.map_or(MIN_RATE, |rate| rate as u64),
            window: window.map_or(MIN_RATE_WINDOW, Duration::from_secs_f64),
        }
    }
}

/// Watches one transfer against a [`MinRate`], window after window.
struct RateWatch {
    rate: MinRate,
    window_start: Instant,
    total_at_start: u64,
}

impl RateWatch {
    fn new(rate: MinRate) -> RateWatch {
        RateWatch { rate, window_start: Instant::now(), total_at_start: 0 }
    }

    /// After `total` bytes: the bytes of the window just ended when they fall short.
    fn check(&mut self, total: u64) -> std::result::Result<(), u64> {
        let elapsed = self.window_start.elapsed();
        if self.rate.bytes_per_second == 0 || elapsed < self.rate.window {
            return Ok(());
        }
        let received = total - self.total_at_start;
        if (received as f64) < self.rate.bytes_per_second as f64 * elapsed.as_secs_f64() {
            return Err(received);
        }
        self.window_start = Instant::now();
        self.total_at_start = total;
        Ok(())
    }
}

/// A client of one Hub endpoint, downloading into one cache.
#[derive(Clone)]
pub struct Hub {
    endpoint: String,
    cache: Cache,
    pub(crate) http: Http,
    offline: bool,
    progress: bool,
    min_rate: MinRate,
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
    size: u64,
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
        let hub = Hub::new(&super::endpoint()).with_token(cache::token()).with_offline(cache::offline());
        Ok(hub.with_progress(std::io::stderr().is_terminal() && !env_flag("HF_HUB_DISABLE_PROGRESS_BARS")))
    }

    /// A client of `endpoint` without a token, on the environment's cache, online, quiet, with
    /// the minimum transfer rate of `NNX_HUB_MIN_RATE` and `NNX_HUB_MIN_RATE_WINDOW` (see
    /// [`Hub::with_min_rate`]).
    pub fn new(endpoint: &str) -> Hub {
        let endpoint = endpoint.trim().trim_end_matches('/').to_string();
        Hub {
            http: Http::new(&endpoint, None),
            endpoint,
            cache: Cache::from_env(),
            offline: false,
            progress: false,
            min_rate: MinRate::from_env(),
        }
    }

    /// Stops a download that brings fewer than `bytes_per_second` over any `window` (`0` never
    /// stops one). A server that sends a byte now and then keeps every read alive; this is
    /// what ends such a transfer. The default is 1 KiB/s over 30 s.
    pub fn with_min_rate(mut self, bytes_per_second: u64, window: Duration) -> Hub {
        self.min_rate = MinRate { bytes_per_second, window: window.max(Duration::from_millis(1)) };
        self
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
        let (url, bytes) = reply.json_bytes(repo)?;
        answers::revision(&bytes).map_err(|message| protocol(repo, &url, message))
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
        let folder = self.cache.repo_subfolder(repo, &["snapshots", &commit])?;
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
        let blob = self.cache.blob(repo, &meta.etag)?;
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
        // The etag names the blob's file: one plain name, valid on every platform.
        let etag = etag.filter(|etag| cache::safe_relative(etag) && !etag.contains('/'));
        let etag = etag.ok_or_else(|| {
            protocol(repo, &reply.url, "no `ETag` or `X-Linked-Etag` header that is a plain file name".into())
        })?;
        if !is_commit(&commit) {
            return Err(protocol(repo, &reply.url, format!("`X-Repo-Commit` is `{commit}`, not a commit hash")));
        }
        let redirected = (300..400).contains(&status);
        // The size bounds the download: without it, a server could send without end.
        let size = reply
            .header("x-linked-size")
            .or_else(|| if redirected { None } else { reply.header("content-length") })
            .and_then(|size| size.trim().parse::<u64>().ok());
        let size = size.ok_or_else(|| {
            protocol(repo, &reply.url, "no `X-Linked-Size` or `Content-Length` header giving the file's size".into())
        })?;
        let location = if redirected { location } else { None }.unwrap_or_else(|| reply.url.clone());
        Ok(FileMeta { commit, etag, size, location })
    }

    /// Downloads one blob under its lock: resumes `<blob>.incomplete`, checks the size and the
    /// hash its etag names, then renames it into place. Only a dropped connection leaves the
    /// `.incomplete` behind (a prefix, never longer than the file, for the next try to resume);
    /// any other failure removes it.
    fn fetch_blob(
        &self,
        repo: &RepoId,
        path: &str,
        meta: &FileMeta,
        blob: &Path,
        bars: Option<&MultiProgress>,
    ) -> Result<()> {
        let lock_path = self.cache.lock(repo, &meta.etag)?;
        cache::refuse_link(repo, &lock_path)?;
        let lock = open_no_follow(OpenOptions::new().create(true).truncate(false).write(true), &lock_path)
            .map_err(|error| open_error(repo, &lock_path, "open the lock", error))?;
        // Another process downloading the same blob holds this; wait for it, then find the blob.
        lock.lock().map_err(Error::io("lock", &lock_path))?;
        cache::refuse_link(repo, blob)?;
        if blob_complete(blob, meta.size) {
            return Ok(());
        }
        let incomplete = blob.with_file_name(format!("{}.incomplete", meta.etag));
        cache::refuse_link(repo, &incomplete)?;
        let bar = bars.map(|bars| {
            let bar = bars.add(ProgressBar::new(meta.size));
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
        let outcome = match outcome {
            Ok(()) => verify(repo, path, meta, &incomplete),
            Err(Failure::Resumable(error)) => return Err(error),
            Err(Failure::Discard(error)) => Err(error),
        };
        if let Err(error) = outcome {
            let _ = std::fs::remove_file(&incomplete);
            return Err(error);
        }
        // Kept under its own name until complete (to resume), then put in place in one step.
        crate::fs::replace(&incomplete, blob)?;
        drop(lock);
        Ok(())
    }

    /// Fills `incomplete` from the file's location, resuming after what it holds, and never
    /// past the size announced.
    fn transfer(
        &self,
        repo: &RepoId,
        path: &str,
        meta: &FileMeta,
        incomplete: &Path,
        bar: Option<&ProgressBar>,
    ) -> std::result::Result<(), Failure> {
        let hub_error = |problem: HubProblem| self.hub_error(repo, problem);
        let url = crate::text::redact_url(&meta.location);
        let mut attempt = 0;
        let mut resume = true;
        // Each pass is one request; each that fails counts against the retries.
        let mut retry = |message: String| {
            if attempt >= self.http.retries {
                return Err(Failure::Resumable(hub_error(HubProblem::Network { url: url.clone(), message })));
            }
            std::thread::sleep(self.http.wait(attempt));
            attempt += 1;
            Ok(())
        };
        loop {
            let held = std::fs::symlink_metadata(incomplete).map_or(0, |m| m.len());
            let have = if resume && held <= meta.size { held } else { 0 };
            if have == meta.size && have > 0 {
                return Ok(());
            }
            let mut request = Request::new("GET", meta.location.clone()).header("Accept-Encoding", "identity");
            if have > 0 {
                request = request.header("Range", format!("bytes={have}-"));
            }
            let reply = self.http.send(repo, &request).map_err(Failure::Resumable)?;
            let start = match reply.status() {
                206 if have > 0 => {
                    let range = reply.header("content-range").and_then(content_range);
                    // Appended elsewhere than where the bytes held end, the file would be
                    // garbage: start over from the first byte instead.
                    if range != Some((have, meta.size - 1, Some(meta.size)))
                        && range != Some((have, meta.size - 1, None))
                    {
                        resume = false;
                        retry(format!(
                            "asked for the bytes from {have} on, the server answered `Content-Range: {}`",
                            reply.header("content-range").unwrap_or_default()
                        ))?;
                        continue;
                    }
                    have
                }
                200 => 0,
                // The server cannot serve the range: start over.
                416 => {
                    resume = false;
                    retry("the server cannot serve the rest of the file (416)".to_string())?;
                    continue;
                }
                _ => {
                    let about = About { revision: &meta.commit, file: Some(path) };
                    return Err(Failure::Resumable(refused(repo, &self.http, reply, about)));
                }
            };
            let expected = meta.size - start;
            let oversized =
                || hub_error(HubProblem::Oversized { file: path.to_string(), url: url.clone(), announced: meta.size });
            let announced = reply.header("content-length").and_then(|length| length.trim().parse::<u64>().ok());
            if announced.is_some_and(|length| length > expected) {
                return Err(Failure::Discard(oversized()));
            }
            let mut file = open_no_follow(OpenOptions::new().create(true).write(true).truncate(false), incomplete)
                .map_err(|error| Failure::Discard(open_error(repo, incomplete, "write", error)))?;
            let write_error = |error| Failure::Discard(Error::io("write", incomplete)(error));
            file.set_len(start).map_err(write_error)?;
            file.seek(SeekFrom::Start(start)).map_err(write_error)?;
            if let Some(bar) = bar {
                bar.set_position(start);
            }
            match copy_body(reply, &mut file, expected, self.min_rate, bar) {
                Ok(copied) if copied == expected => {
                    file.sync_all().map_err(write_error)?;
                    return Ok(());
                }
                Ok(copied) => {
                    file.sync_all().map_err(write_error)?;
                    retry(format!("the connection closed after {} of {} bytes", start + copied, meta.size))?;
                }
                Err(CopyError::Network(message)) => retry(message)?,
                Err(CopyError::Disk(error)) => return Err(write_error(error)),
                Err(CopyError::Oversized) => return Err(Failure::Discard(oversized())),
                Err(CopyError::TooSlow(received)) => {
                    return Err(Failure::Discard(hub_error(HubProblem::TooSlow {
                        file: path.to_string(),
                        url: url.clone(),
                        received,
                        window_seconds: self.min_rate.window.as_secs_f64().ceil() as u64,
                        minimum: self.min_rate.bytes_per_second,
                    })));
                }
            }
        }
    }
}

/// How a transfer failed: a broken connection leaves bytes worth resuming; anything else leaves
/// bytes that must go.
enum Failure {
    Resumable(Error),
    Discard(Error),
}

enum CopyError {
    Network(String),
    Disk(std::io::Error),
    /// More bytes came than were announced.
    Oversized,
    /// The bytes of the last window, fewer than the minimum rate asks.
    TooSlow(u64),
}

/// Copies at most `expected` bytes of the body into `file`: the body's length, or an error when
/// it runs past `expected` (one byte past is all that is read) or falls below `rate`.
fn copy_body(
    reply: Reply,
    file: &mut File,
    expected: u64,
    rate: MinRate,
    bar: Option<&ProgressBar>,
) -> std::result::Result<u64, CopyError> {
    let mut reader = reply.response.into_body().into_reader();
    let mut buffer = vec![0u8; 1 << 16];
    let mut watch = RateWatch::new(rate);
    let mut total = 0u64;
    loop {
        let room = usize::try_from((expected - total).saturating_add(1)).unwrap_or(usize::MAX).min(buffer.len());
        let read =
            reader.read(&mut buffer[..room]).map_err(|error| CopyError::Network(redact_urls(&error.to_string())))?;
        if read == 0 {
            return Ok(total);
        }
        if read as u64 > expected - total {
            return Err(CopyError::Oversized);
        }
        file.write_all(&buffer[..read]).map_err(CopyError::Disk)?;
        total += read as u64;
        if let Some(bar) = bar {
            bar.inc(read as u64);
        }
        watch.check(total).map_err(CopyError::TooSlow)?;
    }
}

/// `bytes FIRST-LAST/TOTAL` (`TOTAL` may be `*`): the range a 206 answer holds.
fn content_range(header: &str) -> Option<(u64, u64, Option<u64>)> {
    let range = header.trim().strip_prefix("bytes ")?;
    let (span, total) = range.split_once('/')?;
    let (first, last) = span.split_once('-')?;
    let total = if total.trim() == "*" { None } else { Some(total.trim().parse().ok()?) };
    Some((first.trim().parse().ok()?, last.trim().parse().ok()?, total))
}

/// An error opening a file of the cache; a link met despite the checks (one planted since) is
/// named as such.
fn open_error(repo: &RepoId, path: &Path, action: &'static str, error: std::io::Error) -> Error {
    #[cfg(unix)]
    if error.raw_os_error() == Some(libc::ELOOP) {
        return cache::link_error(repo, path, "file");
    }
    let _ = repo;
    Error::io(action, path)(error)
}

/// The size must match, and the hash the etag names: an LFS file's etag is its sha256, a
/// regular file's is its git blob sha1 (`sha1("blob <size>\0" + bytes)`).
fn verify(repo: &RepoId, path: &str, meta: &FileMeta, incomplete: &Path) -> Result<()> {
    let corrupt = |expected: String, found: String| Error::Hub {
        repo: repo.to_string(),
        problem: HubProblem::Corrupt { file: path.to_string(), expected, found },
    };
    let size = std::fs::symlink_metadata(incomplete).map_err(Error::io("read", incomplete))?.len();
    if meta.size != size {
        return Err(corrupt(format!("{} bytes", meta.size), format!("{size} bytes")));
    }
    let hex = |length: usize| meta.etag.len() == length && meta.etag.bytes().all(|b| b.is_ascii_hexdigit());
    if hex(64) {
        let found = sha256_file(incomplete)?;
        if !found.eq_ignore_ascii_case(&meta.etag) {
            return Err(corrupt(format!("sha256 {}", meta.etag), format!("sha256 {found}")));
        }
    } else if hex(40) {
        let found = git_blob_sha1(incomplete, size)?;
        if !found.eq_ignore_ascii_case(&meta.etag) {
            return Err(corrupt(format!("git blob sha1 {}", meta.etag), format!("git blob sha1 {found}")));
        }
    }
    Ok(())
}

/// The sha256 of a file, in lowercase hex.
pub(crate) fn sha256_file(path: &Path) -> Result<String> {
    let mut hasher = Sha256::new();
    hash_file(path, |bytes| hasher.update(bytes))?;
    Ok(hasher.finalize().iter().map(|byte| format!("{byte:02x}")).collect())
}

/// The id git gives a file of `size` bytes, in lowercase hex.
fn git_blob_sha1(path: &Path, size: u64) -> Result<String> {
    let mut hasher = Sha1::new();
    sha1::Digest::update(&mut hasher, format!("blob {size}\0").as_bytes());
    hash_file(path, |bytes| sha1::Digest::update(&mut hasher, bytes))?;
    Ok(sha1::Digest::finalize(hasher).iter().map(|byte| format!("{byte:02x}")).collect())
}

fn hash_file(path: &Path, mut update: impl FnMut(&[u8])) -> Result<()> {
    let mut file = File::open(path).map_err(Error::io("read", path))?;
    let mut buffer = vec![0u8; 1 << 20];
    loop {
        let read = file.read(&mut buffer).map_err(Error::io("read", path))?;
        if read == 0 {
            return Ok(());
        }
        update(&buffer[..read]);
    }
}

/// Whether the blob is in place: a real file (not a link) of the size announced.
fn blob_complete(blob: &Path, size: u64) -> bool {
    std::fs::symlink_metadata(blob).is_ok_and(|m| m.is_file() && m.len() == size)
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

/// The files under `folder`, as `/`-separated relative paths, sorted; links to files count as
/// files, links to folders are not followed.
pub(crate) fn walk(folder: &Path) -> Vec<String> {
    let mut files = Vec::new();
    let mut pending = vec![(folder.to_path_buf(), String::new())];
    while let Some((dir, prefix)) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let relative = if prefix.is_empty() { name.clone() } else { format!("{prefix}/{name}") };
            // The entry's own type: a link to a folder is never descended (two links to `.`
            // would make the walk endless); a link to a file is how snapshots point at blobs.
            let Ok(kind) = entry.file_type() else { continue };
            let path = entry.path();
            if kind.is_dir() {
                pending.push((path, relative));
            } else if kind.is_file() || (kind.is_symlink() && path.is_file()) {
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
    fn content_ranges_parse() {
        assert_eq!(content_range("bytes 500-999/1000"), Some((500, 999, Some(1000))));
        assert_eq!(content_range("bytes 0-9/*"), Some((0, 9, None)));
        for bad in ["bytes 500-999", "500-999/1000", "bytes a-b/c", "bytes -1-2/3"] {
            assert_eq!(content_range(bad), None, "{bad}");
        }
    }

    #[cfg(unix)]
    #[test]
    fn walks_list_file_links_and_never_descend_folder_links() {
        let dir = std::env::temp_dir().join(format!("nnx-walk-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        std::fs::write(dir.join("sub/a.json"), b"{}").unwrap();
        std::os::unix::fs::symlink("sub/a.json", dir.join("b.json")).unwrap();
        std::os::unix::fs::symlink(".", dir.join("loop1")).unwrap();
        std::os::unix::fs::symlink(".", dir.join("loop2")).unwrap();
        assert_eq!(walk(&dir), ["b.json", "sub/a.json"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn etags_lose_quotes_and_weakness() {
        assert_eq!(normalize_etag("\"abc\""), "abc");
        assert_eq!(normalize_etag("W/\"abc\""), "abc");
        assert_eq!(normalize_etag("abc"), "abc");
    }
}
