//! Archives in object stores and on the Hub, read with HTTP range requests through
//! `object_store`: opening fetches each file's header and nothing else (a SafeTensors file's
//! 8-byte length and header, a GGUF file's first bytes, more only when its header needs them),
//! and reads fetch only the byte ranges of the entries (or of a rank's slices) they use,
//! neighbours coalesced, several requests in flight at a time, through the local cache of
//! [`RemoteOptions::cache`] when there is one. This module is the transport: each format's
//! reader of files in stores lives beside its reader of local files, and its sources fetch
//! through the store's client, which counts what travels ([`Archive::transfer_stats`]).
//!
//! Locations: `s3://bucket/key`, `gs://bucket/key`, `az://container/key` (also `azure://`),
//! `http(s)://host/path` and `hf://org/name[@revision][/file]`. A location naming a folder
//! (ending in `/`, or a Hub repository) is read as a local folder is: its
//! `model.safetensors.index.json`, else its `model.safetensors`. A shard of a split GGUF file
//! (`NAME-00001-of-00003.gguf`) opens with every shard of its set, fetched beside it.
//! Credentials and endpoints come from each store's standard environment variables
//! (`AWS_ACCESS_KEY_ID`, `AWS_ENDPOINT_URL`, `GOOGLE_SERVICE_ACCOUNT`,
//! `AZURE_STORAGE_ACCOUNT_NAME`, ..., `HF_TOKEN` and `HF_ENDPOINT` for the Hub) or from
//! [`RemoteOptions::config`]; they never appear in errors.
//!
//! A server is not trusted: an answer is read into a buffer reserved for the bytes asked for
//! and no more, a longer, shorter or misplaced answer is refused as soon as it shows, objects
//! read whole (a shard index) have a size limit, error answers are cut short, and every
//! request ends within its deadline, however slowly the server sends. `NNX_REMOTE_TIMEOUT`
//! (seconds) and `NNX_REMOTE_RETRIES` set [`RemoteOptions::default`]'s timeout and retries.

mod cache;
pub(crate) mod fetch;
mod location;
mod transport;

use std::any::Any;
use std::borrow::Cow;
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use futures::stream::BoxStream;
use nnx_core::Tensor;
use object_store::path::Path as ObjectPath;
use object_store::{GetOptions, GetRange, ObjectMeta, ObjectStore};

pub use cache::RangeCache;
pub use location::is_remote;

use crate::archive::Archive;
use crate::error::{Error, RemoteProblem, Result};
use crate::source::{FetchedObject, Fetcher, Source};

/// How remote archives are read. The defaults suit object stores across a network: ranges
/// closer than 1 MiB are fetched as one, 8 requests in flight, each at most 16 MiB.
#[derive(Clone, Debug)]
pub struct RemoteOptions {
    /// Ranges separated by at most this many bytes are fetched in one request (the bytes
    /// between them are transferred and dropped); 0 fetches exactly the bytes used.
    pub coalesce_gap: u64,
    /// Requests in flight at once.
    pub concurrency: usize,
    /// The largest single request; longer ranges are split. In-flight memory is at most
    /// `concurrency * max_request_bytes` beyond the tensors being built.
    pub max_request_bytes: u64,
    /// Retries of a failed request (with exponential backoff), for errors worth retrying
    /// (timeouts, connection resets, 5xx).
    pub retries: usize,
    /// Time allowed for one attempt of a request (connecting, waiting and receiving the
    /// body), and for connecting. A request with its retries ends after at most
    /// `timeout * (retries + 1)`, however slowly the server sends.
    pub timeout: Duration,
    /// A local cache of fetched ranges (none by default).
    pub cache: Option<RangeCache>,
    /// Store settings by `object_store`'s configuration keys (`aws_endpoint`,
    /// `aws_allow_http`, `aws_access_key_id`, `google_service_account`, ...), applied after
    /// the environment's.
    pub config: Vec<(String, String)>,
}

/// The largest shard index (`model.safetensors.index.json`) read from a store: real ones
/// are well under a megabyte, and an index is read whole.
pub const MAX_INDEX_BYTES: u64 = 64 << 20;

impl Default for RemoteOptions {
    /// The defaults above, with the timeout from `NNX_REMOTE_TIMEOUT` (seconds) and the
    /// retries from `NNX_REMOTE_RETRIES` when they are set: the command line's only way to
    /// change them.
    fn default() -> RemoteOptions {
        let variable = |name: &str| std::env::var(name).ok().map(|text| text.trim().to_string());
        let timeout = variable("NNX_REMOTE_TIMEOUT")
            .and_then(|text| text.parse::<f64>().ok())
            .filter(|seconds| seconds.is_finite() && *seconds > 0.0)
            .and_then(|seconds| Duration::try_from_secs_f64(seconds).ok());
        let retries = variable("NNX_REMOTE_RETRIES").and_then(|text| text.parse::<usize>().ok());
        RemoteOptions {
            coalesce_gap: 1 << 20,
            concurrency: 8,
            max_request_bytes: 16 << 20,
            retries: retries.unwrap_or(3),
            timeout: timeout.unwrap_or(Duration::from_secs(30)),
            cache: None,
            config: Vec::new(),
        }
    }
}

impl RemoteOptions {
    /// Adds a store setting (see [`RemoteOptions::config`]).
    #[must_use]
    pub fn with(mut self, key: impl Into<String>, value: impl Into<String>) -> RemoteOptions {
        self.config.push((key.into(), value.into()));
        self
    }

    /// Sets [`RemoteOptions::coalesce_gap`].
    #[must_use]
    pub fn with_coalesce_gap(mut self, bytes: u64) -> RemoteOptions {
        self.coalesce_gap = bytes;
        self
    }

    /// Sets [`RemoteOptions::cache`].
    #[must_use]
    pub fn with_cache(mut self, cache: RangeCache) -> RemoteOptions {
        self.cache = Some(cache);
        self
    }

    /// The most one request may take with its retries: `object_store`'s timeout bounds each
    /// attempt, and this bounds them all together.
    pub(crate) fn deadline(&self) -> Duration {
        let attempts = u32::try_from(self.retries.saturating_add(1)).unwrap_or(u32::MAX);
        self.timeout.saturating_mul(attempts)
    }
}

/// What an archive's remote files have transferred so far (bodies only, not HTTP headers).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TransferStats {
    /// Requests answered.
    pub requests: u64,
    /// Bytes received.
    pub bytes: u64,
    /// Bytes served from the local cache instead.
    pub cached_bytes: u64,
}

/// One store, the runtime its requests run on, and its counters.
pub(crate) struct Client {
    store: Arc<dyn ObjectStore>,
    runtime: tokio::runtime::Runtime,
    options: RemoteOptions,
    /// The location's root as users wrote it (`s3://bucket`), for messages and cache keys.
    root: String,
    requests: AtomicU64,
    bytes: AtomicU64,
    cached_bytes: AtomicU64,
}

impl Client {
    pub(crate) fn stats(&self) -> TransferStats {
        TransferStats {
            requests: self.requests.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
            cached_bytes: self.cached_bytes.load(Ordering::Relaxed),
        }
    }

    fn count(&self, bytes: usize) {
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    /// The URL of `path` in this store.
    pub(crate) fn url(&self, path: &ObjectPath) -> String {
        format!("{}/{}", self.root, path)
    }

    /// The object at `path`, of which a first answer gave `meta`, as its sources fetch it: its
    /// version is its ETag, else its size and modification time.
    pub(crate) fn object(self: &Arc<Self>, path: &ObjectPath, meta: &ObjectMeta) -> FetchedObject {
        let version = match &meta.e_tag {
            Some(tag) => tag.clone(),
            None => format!("{}-{}", meta.size, meta.last_modified.timestamp_nanos_opt().unwrap_or_default()),
        };
        FetchedObject { fetcher: self.clone(), name: path.to_string(), version }
    }

    /// Runs `future` to completion on this client's runtime (from a thread of its own when
    /// the caller is itself inside an async runtime, where blocking on another is refused).
    fn block_on<T: Send>(&self, future: impl std::future::Future<Output = T> + Send) -> T {
        if tokio::runtime::Handle::try_current().is_ok() {
            std::thread::scope(|scope| scope.spawn(|| self.runtime.block_on(future)).join())
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        } else {
            self.runtime.block_on(future)
        }
    }

    /// The whole object at `path`, at most `limit` bytes, for objects read whole (`what`
    /// names it in errors): the announced size is checked before anything is reserved, and
    /// the body is counted as it arrives, so a server that announces less than it sends is
    /// cut off too.
    pub(crate) fn get_whole(&self, path: &ObjectPath, limit: u64, what: &'static str) -> Result<Bytes> {
        let url = self.url(path);
        self.block_on(self.within(&url, async {
            let result = self.store.get(path).await.map_err(|error| remote_error(&url, error))?;
            let size = result.meta.size;
            if size > limit {
                return Err(Error::Remote { url: url.clone(), problem: RemoteProblem::TooLarge { what, size, limit } });
            }
            let body = collect(&url, result.into_stream(), size).await?;
            self.count(body.len());
            Ok(body)
        }))
    }

    /// The bytes `range` of the object at `path` and the object's metadata, streamed into a
    /// buffer of exactly the range's length: an answer for other bytes, or longer or shorter
    /// than asked, is refused as soon as it shows, so a server cannot make nnx hold more than
    /// it asked for. With `to_end`, a range past the object's end may come back cut at it
    /// (for the first bytes of an object that may be shorter).
    pub(crate) async fn get_range(
        &self,
        path: &ObjectPath,
        range: Range<u64>,
        to_end: bool,
    ) -> Result<(Bytes, ObjectMeta)> {
        let url = self.url(path);
        self.within(&url, async {
            let options = GetOptions { range: Some(GetRange::Bounded(range.clone())), ..Default::default() };
            let result = self.store.get_opts(path, options).await.map_err(|error| remote_error(&url, error))?;
            let cut = range.start..range.end.min(result.meta.size);
            if result.range != range && !(to_end && result.range == cut) {
                let problem = RemoteProblem::WrongRange { asked: range.clone(), sent: result.range.clone() };
                return Err(Error::Remote { url: url.clone(), problem });
            }
            let meta = result.meta.clone();
            let asked = result.range.end - result.range.start;
            let body = collect(&url, result.into_stream(), asked).await?;
            self.count(body.len());
            Ok((body, meta))
        })
        .await
    }

    /// `future` (a request to `url`), cut off at the request deadline: `object_store`'s
    /// timeout bounds each attempt, but a body trickling in across retries is bounded only
    /// here.
    async fn within<T>(&self, url: &str, future: impl std::future::Future<Output = Result<T>>) -> Result<T> {
        let deadline = self.options.deadline();
        tokio::time::timeout(deadline, future).await.unwrap_or_else(|_| {
            let message = format!(
                "no complete answer within {:.1} s: {} attempts of {:.1} s",
                deadline.as_secs_f64(),
                self.options.retries.saturating_add(1),
                self.options.timeout.as_secs_f64()
            );
            Err(Error::Remote { url: url.to_string(), problem: RemoteProblem::Timeout { message } })
        })
    }

    /// [`Client::get_range`], run to completion.
    pub(crate) fn range_blocking(
        &self,
        path: &ObjectPath,
        range: Range<u64>,
        to_end: bool,
    ) -> Result<(Bytes, ObjectMeta)> {
        self.block_on(self.get_range(path, range, to_end))
    }

    /// Whether an object exists at `path` (a `HEAD` request).
    pub(crate) fn exists(&self, path: &ObjectPath) -> Result<bool> {
        let url = self.url(path);
        let head = self.block_on(self.within(&url, async {
            match self.store.head(path).await {
                Ok(meta) => Ok(Some(meta)),
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(error) => Err(remote_error(&url, error)),
            }
        }))?;
        self.requests.fetch_add(1, Ordering::Relaxed);
        Ok(head.is_some())
    }

    /// The size of the object at `path` as a `HEAD` request gives it, if it answers.
    pub(crate) fn head_size(&self, path: &ObjectPath) -> Option<u64> {
        let url = self.url(path);
        let head = self.within(&url, async { self.store.head(path).await.map_err(|error| remote_error(&url, error)) });
        self.block_on(head).ok().map(|meta| meta.size)
    }
}

/// Reads `body`, which must hold exactly `asked` bytes, into one buffer reserved (fallibly)
/// for them, stopping at the first byte past `asked`.
async fn collect(url: &str, mut body: BoxStream<'static, object_store::Result<Bytes>>, asked: u64) -> Result<Bytes> {
    let fail = |problem| Error::Remote { url: url.to_string(), problem };
    let mut buffer = Vec::new();
    usize::try_from(asked)
        .ok()
        .and_then(|len| buffer.try_reserve_exact(len).ok())
        .ok_or_else(|| fail(RemoteProblem::NoMemory { bytes: asked }))?;
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|error| remote_error(url, error))?;
        let received = buffer.len() as u64 + chunk.len() as u64;
        if received > asked {
            // Dropping the body closes the connection: nothing more is read.
            return Err(fail(RemoteProblem::TooLong { asked, sent_at_least: received }));
        }
        buffer.extend_from_slice(&chunk);
    }
    if (buffer.len() as u64) < asked {
        return Err(fail(RemoteProblem::ShortRead { asked, received: buffer.len() as u64 }));
    }
    Ok(Bytes::from(buffer))
}

impl Archive {
    /// Opens a file or a folder in an object store or on the Hub (see [`crate::remote`]): a
    /// SafeTensors file, a shard index, a GGUF file (with every shard of a split one) or a
    /// folder holding a SafeTensors index or file. Only the headers are fetched, with range
    /// requests; entries are fetched when read, each read fetching the byte ranges it uses.
    /// [`Archive::open`] takes the same URLs with [`RemoteOptions::default`].
    ///
    /// # Errors
    /// [`Error::Remote`] naming the URL and what failed (404, 403, a timeout), and the header
    /// and index errors of local files.
    pub fn open_remote(url: &str, options: &RemoteOptions) -> Result<Archive> {
        location::open(url, options)
    }

    /// What this archive's remote files have transferred so far; `None` for an archive with
    /// no remote entries.
    pub fn transfer_stats(&self) -> Option<TransferStats> {
        let mut clients: Vec<&Client> = Vec::new();
        for object in self.slots.values().filter_map(|slot| slot.store.fetched()) {
            let Some(client) = (&*object.fetcher as &dyn Any).downcast_ref::<Client>() else { continue };
            if !clients.iter().any(|known| std::ptr::eq(*known, client)) {
                clients.push(client);
            }
        }
        if clients.is_empty() {
            return None;
        }
        Some(clients.iter().map(|client| client.stats()).fold(TransferStats::default(), |sum, one| TransferStats {
            requests: sum.requests + one.requests,
            bytes: sum.bytes + one.bytes,
            cached_bytes: sum.cached_bytes + one.cached_bytes,
        }))
    }
}

/// A store's client fetches the ranges of its objects for their sources, in batches.
impl Fetcher for Client {
    fn fetch(
        &self,
        requests: &[(&FetchedObject, Vec<Range<u64>>)],
        take: &mut dyn FnMut(usize, &[u8]) -> Result<()>,
    ) -> Result<()> {
        for (at, pieces) in fetch::fetch(self, requests)?.into_iter().enumerate() {
            let bytes: Cow<'_, [u8]> = match pieces.as_slice() {
                [one] => Cow::Borrowed(one),
                many => Cow::Owned(many.concat()),
            };
            take(at, &bytes)?;
        }
        Ok(())
    }
}

/// The bytes `range` of `object`, fetched now.
///
/// # Errors
/// The errors of the transfer.
pub(crate) fn fetch_bytes(object: &FetchedObject, range: Range<u64>) -> Result<Vec<u8>> {
    let mut fetched = Vec::new();
    object.fetcher.fetch(&[(object, vec![range])], &mut |_, bytes| {
        fetched = bytes.to_vec();
        Ok(())
    })?;
    Ok(fetched)
}

/// Entry `at` of `source`, whose bytes are fetched from `object`, read now.
///
/// # Errors
/// The errors of the transfer, or of bytes that do not make the entry.
pub(crate) fn fetch_entry(source: &dyn Source, object: &FetchedObject, at: usize) -> Result<Tensor> {
    let (ranges, shape) = source.byte_ranges(at, None);
    let mut tensor = None;
    object.fetcher.fetch(&[(object, ranges)], &mut |_, bytes| {
        tensor = Some(source.assemble(at, &shape, bytes)?);
        Ok(())
    })?;
    Ok(tensor.expect("the fetcher hands every request over"))
}

/// Uploads the local file `from` to `url` (multipart for large files), for putting checkpoints
/// where remote archives read them.
///
/// # Errors
/// [`Error::Io`] when `from` cannot be read, [`Error::Remote`] when the store refuses.
pub fn upload(from: &std::path::Path, url: &str, options: &RemoteOptions) -> Result<()> {
    let (client, path) = location::client(url, options)?;
    let mut file = std::fs::File::open(from).map_err(Error::io("open", from))?;
    let url = client.url(&path);
    client
        .block_on(async {
            use std::io::Read;
            let mut upload = object_store::WriteMultipart::new(client.store.put_multipart(&path).await?);
            let mut buffer = vec![0u8; 8 << 20];
            loop {
                let read = match file.read(&mut buffer) {
                    Ok(0) => break,
                    Ok(read) => read,
                    Err(error) => {
                        upload.abort().await?;
                        return Ok(Err(Error::Io { action: "read", path: from.to_path_buf(), source: error }));
                    }
                };
                upload.wait_for_capacity(client.options.concurrency).await?;
                upload.write(&buffer[..read]);
            }
            upload.finish().await?;
            Ok::<_, object_store::Error>(Ok(()))
        })
        .map_err(|error| remote_error(&url, error))?
}

/// Downloads the object at `url` into the local file `to` (written beside it, then renamed),
/// streaming: what users do without range reads, and the baseline of the remote benchmark.
///
/// # Errors
/// [`Error::Remote`] when the store refuses, [`Error::Io`] when `to` cannot be written.
pub fn download(url: &str, to: &std::path::Path, options: &RemoteOptions) -> Result<u64> {
    use std::io::Write;
    let (client, path) = location::client(url, options)?;
    let url = client.url(&path);
    // Removed when dropped on an error.
    let mut file = crate::fs::StagedFile::create(to)?;
    let written = client.block_on(async {
        let result = client.store.get(&path).await.map_err(|error| remote_error(&url, error))?;
        // The announced size bounds what is written: a server cannot fill the disk.
        let size = result.meta.size;
        let mut stream = result.into_stream();
        let mut written = 0u64;
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|error| remote_error(&url, error))?;
            if written + chunk.len() as u64 > size {
                let problem = RemoteProblem::TooLong { asked: size, sent_at_least: written + chunk.len() as u64 };
                return Err(Error::Remote { url: url.clone(), problem });
            }
            file.write_all(&chunk).map_err(Error::io("write", file.path()))?;
            written += chunk.len() as u64;
        }
        if written < size {
            return Err(Error::Remote {
                url: url.clone(),
                problem: RemoteProblem::ShortRead { asked: size, received: written },
            });
        }
        Ok::<_, Error>(written)
    })?;
    client.count(written as usize);
    file.commit()?;
    Ok(written)
}

/// The longest message taken from `object_store` (which may quote a server's answer).
const MAX_MESSAGE_CHARS: usize = 600;

/// The error of a request to `url`, without anything of the credentials: the URL and every
/// URL in the store's message are redacted, and the message is cut to a line's length.
pub(crate) fn remote_error(url: &str, error: object_store::Error) -> Error {
    let url = crate::text::redact_url(url);
    let problem = match &error {
        object_store::Error::NotFound { .. } => RemoteProblem::NotFound,
        object_store::Error::PermissionDenied { .. } => RemoteProblem::Denied,
        object_store::Error::Unauthenticated { .. } => RemoteProblem::Unauthenticated,
        object_store::Error::UnknownConfigurationKey { key, .. } => RemoteProblem::UnknownSetting { key: key.clone() },
        other => {
            // Escaped before it is cut, so that the cut bounds what is printed.
            let mut message = crate::text::printable(&crate::text::redact_urls(&other.to_string())).into_owned();
            if let Some((cut, _)) = message.char_indices().nth(MAX_MESSAGE_CHARS) {
                message.truncate(cut);
                message.push_str("...");
            }
            match transport_failure(other) {
                Some(Failure::Refused) => RemoteProblem::Refused { host: host_of(&url).to_string() },
                Some(Failure::TimedOut) => RemoteProblem::Timeout { message },
                None => RemoteProblem::Transfer { message },
            }
        }
    };
    Error::Remote { url, problem }
}

/// What a failed connection comes down to, when it is one of the failures said plainly.
#[derive(Debug, PartialEq, Eq)]
enum Failure {
    Refused,
    TimedOut,
}

/// Whether `error` is, down its chain of sources, a refused connection or a timeout. The
/// chain is asked, not the message: `object_store`'s messages name its `retry_timeout`
/// whatever the failure was.
fn transport_failure(error: &(dyn std::error::Error + 'static)) -> Option<Failure> {
    let mut timed_out = false;
    let mut source = Some(error);
    while let Some(error) = source {
        if let Some(io) = error.downcast_ref::<std::io::Error>() {
            match io.kind() {
                std::io::ErrorKind::ConnectionRefused => return Some(Failure::Refused),
                std::io::ErrorKind::TimedOut => timed_out = true,
                _ => {}
            }
        }
        if let Some(http) = error.downcast_ref::<object_store::client::HttpError>() {
            timed_out |= http.kind() == object_store::client::HttpErrorKind::Timeout;
        }
        // A refusal the chain hides behind a boxed message.
        if error.to_string().contains("Connection refused") && error.source().is_none() {
            return Some(Failure::Refused);
        }
        source = error.source();
    }
    timed_out.then_some(Failure::TimedOut)
}

/// The host (and port) of `url`.
fn host_of(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    rest.split('/').next().unwrap_or(rest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_longer_or_shorter_than_asked_are_refused() {
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let body = |chunks: &[&'static [u8]]| {
            let chunks: Vec<object_store::Result<Bytes>> =
                chunks.iter().map(|chunk| Ok(Bytes::from_static(chunk))).collect();
            futures::stream::iter(chunks).boxed()
        };
        let read = |chunks: &[&'static [u8]], asked| runtime.block_on(collect("http://h/x", body(chunks), asked));
        assert_eq!(read(&[b"abc", b"de"], 5).unwrap(), &b"abcde"[..]);
        let long = read(&[b"abc", b"def", b"never read"], 5).unwrap_err();
        assert!(
            matches!(long, Error::Remote { problem: RemoteProblem::TooLong { asked: 5, sent_at_least: 6 }, .. }),
            "{long:?}"
        );
        let short = read(&[b"abc"], 5).unwrap_err();
        assert!(matches!(short, Error::Remote { problem: RemoteProblem::ShortRead { asked: 5, received: 3 }, .. }));
        // Nothing is reserved for a size no memory holds.
        let huge = read(&[b"abc"], u64::MAX).unwrap_err();
        assert!(matches!(huge, Error::Remote { problem: RemoteProblem::NoMemory { .. }, .. }), "{huge:?}");
    }

    #[test]
    fn refused_connections_and_timeouts_are_found_down_the_chain() {
        let refused = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let error = object_store::Error::Generic { store: "HTTP", source: Box::new(refused) };
        let found = remote_error("http://user:pass@127.0.0.1:9/model.safetensors", error);
        assert!(
            matches!(&found, Error::Remote { url, problem: RemoteProblem::Refused { host } }
                if url == "http://127.0.0.1:9/model.safetensors" && host == "127.0.0.1:9"),
            "{found:?}"
        );
        assert!(found.to_string().contains("connection refused by 127.0.0.1:9"), "{found}");
        // `retry_timeout` in a message is not a timeout.
        let message =
            "Error performing GET http://user:pass@h/x in 1s, after 3 retries, retry_timeout: 120s - \u{1b}[2J";
        let error = object_store::Error::Generic { store: "HTTP", source: message.into() };
        let found = remote_error("http://h/x", error);
        let Error::Remote { problem: RemoteProblem::Transfer { message }, .. } = &found else {
            panic!("a transfer error: {found:?}");
        };
        assert!(!message.contains("pass"), "{message}");
        assert!(!found.to_string().contains('\u{1b}'), "{found}");
        let timed_out = std::io::Error::new(std::io::ErrorKind::TimedOut, "slow");
        let error = object_store::Error::Generic { store: "HTTP", source: Box::new(timed_out) };
        assert!(matches!(
            remote_error("http://h/x", error),
            Error::Remote { problem: RemoteProblem::Timeout { .. }, .. }
        ));
    }

    #[test]
    fn remote_locations_are_told_from_paths() {
        assert!(
            is_remote("s3://b/k")
                && is_remote("HF://org/name")
                && !is_remote("/tmp/s3://x")
                && !is_remote("model.safetensors")
        );
    }
}
