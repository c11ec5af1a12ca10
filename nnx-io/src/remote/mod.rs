//! Archives in object stores and on the Hub, read with HTTP range requests through
//! `object_store`: opening fetches each file's 8-byte header length and its header, nothing
//! else, and reads fetch only the byte ranges of the entries (or of a rank's slices) they use,
//! neighbours coalesced, several requests in flight at a time.
//!
//! Locations: `s3://bucket/key`, `gs://bucket/key`, `az://container/key` (also `azure://`),
//! `http(s)://host/path` and `hf://org/name[@revision][/file]`. A location naming a folder
//! (ending in `/`, or a Hub repository) is read as a local folder is: its
//! `model.safetensors.index.json`, else its `model.safetensors`. Credentials and endpoints come
//! from each store's standard environment variables (`AWS_ACCESS_KEY_ID`, `AWS_ENDPOINT_URL`,
//! `GOOGLE_SERVICE_ACCOUNT`, `AZURE_STORAGE_ACCOUNT_NAME`, ..., `HF_TOKEN` and `HF_ENDPOINT`
//! for the Hub) or from [`RemoteOptions::config`]; they never appear in errors.
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

use std::borrow::Cow;
use std::collections::HashMap;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use futures::stream::BoxStream;
use nnx_core::{DType, Tensor};
use object_store::path::Path as ObjectPath;
use object_store::{GetOptions, GetRange, ObjectMeta, ObjectStore};

pub use cache::RangeCache;
pub(crate) use fetch::Request;
pub use location::is_remote;

use crate::archive::{Archive, EntryLocation};
use crate::error::{Error, RemoteProblem, Result, ShardProblem};
use crate::safetensors::header::{self, Header};
use crate::safetensors::index::ShardIndex;
use crate::source::{DataError, Source, Store, narrow_to};

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
    fn head_size(&self, path: &ObjectPath) -> Option<u64> {
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

/// A SafeTensors file in a store: its header, read with two range requests.
pub(crate) struct RemoteFile {
    pub(crate) client: Arc<Client>,
    pub(crate) path: ObjectPath,
    /// The file's URL, as a path for the errors and listings that name files.
    pub(crate) url: PathBuf,
    /// The object's version (its ETag, else its size and modification time), for the cache.
    pub(crate) version: String,
    pub(crate) header: Header,
}

impl RemoteFile {
    /// Fetches the header length, then the header, and validates it against the object's
    /// size. The header's length is checked against [`header::MAX_HEADER_BYTES`] before it is
    /// asked for, as for local files.
    pub(crate) fn open(client: Arc<Client>, path: ObjectPath) -> Result<Arc<RemoteFile>> {
        let url_text = client.url(&path);
        let url = PathBuf::from(&url_text);
        let (first, meta) = match client.block_on(client.get_range(&path, 0..8, true)) {
            Ok(found) => found,
            // An empty object has no byte 0 to ask for: the store refuses the range.
            Err(error @ Error::Remote { problem: RemoteProblem::Transfer { .. }, .. }) => {
                if client.head_size(&path) == Some(0) {
                    return Err(Error::Header { path: url, problem: crate::HeaderProblem::Empty });
                }
                return Err(error);
            }
            Err(error) => return Err(error),
        };
        let file_len = usize::try_from(meta.size).unwrap_or(usize::MAX);
        let Some(prefix) = first.first_chunk::<8>() else {
            return Err(Error::Header { path: url, problem: crate::HeaderProblem::TooShort { len: first.len() } });
        };
        let declared =
            header::declared_len(*prefix, file_len).map_err(|problem| Error::Header { path: url.clone(), problem })?;
        let text = if declared == 0 {
            Bytes::new()
        } else {
            client.block_on(client.get_range(&path, 8..8 + declared as u64, false))?.0
        };
        let mut bytes = Vec::new();
        bytes.try_reserve_exact(8 + text.len()).map_err(|_| Error::Remote {
            url: url_text.clone(),
            problem: RemoteProblem::NoMemory { bytes: 8 + text.len() as u64 },
        })?;
        bytes.extend_from_slice(prefix);
        bytes.extend_from_slice(&text);
        drop(text);
        let header = header::parse_prefix(&bytes, file_len).map_err(|problem| match crate::format::sniff(&bytes) {
            Some(kind) => Error::NotSafeTensors { path: url.clone(), kind },
            None => Error::Header { path: url.clone(), problem },
        })?;
        let version = match &meta.e_tag {
            Some(tag) => tag.clone(),
            None => format!("{}-{}", meta.size, meta.last_modified.timestamp_nanos_opt().unwrap_or_default()),
        };
        Ok(Arc::new(RemoteFile { client, path, url, version, header }))
    }

    /// The file offsets of entry `at`.
    pub(crate) fn entry_range(&self, at: usize) -> Range<u64> {
        let entry = &self.header.entries[at];
        let start = (self.header.data_start + entry.begin) as u64;
        start..start + (entry.end - entry.begin) as u64
    }

    /// The bytes of entry `at`, fetched (or read from the cache) now.
    pub(crate) fn entry_bytes(self: &Arc<Self>, at: usize) -> Result<Bytes> {
        let mut fetched = fetch::fetch(&[Request { file: self.clone(), ranges: vec![self.entry_range(at)] }])?;
        Ok(fetched.pop().and_then(|mut ranges| ranges.pop()).unwrap_or_default())
    }

    /// Fetched bytes of entry `at` (all of it, or a box of `shape`) as an owned tensor of its
    /// dtype.
    fn entry_tensor(&self, at: usize, shape: &[usize], bytes: &[u8]) -> Result<Tensor> {
        let entry = &self.header.entries[at];
        Tensor::from_bytes(entry.dtype, shape, bytes).map_err(|source| Error::Data {
            path: self.url.clone(),
            name: entry.name.clone(),
            source: Box::new(source),
        })
    }
}

impl Archive {
    /// Opens a SafeTensors file, a shard index or a folder in an object store or on the Hub
    /// (see [`crate::remote`]): only the headers are fetched, with range requests; entries are
    /// fetched when read, each read fetching the byte ranges it uses. [`Archive::open`] takes
    /// the same URLs with [`RemoteOptions::default`].
    ///
    /// # Errors
    /// [`Error::Remote`] naming the URL and what failed (404, 403, a timeout), and the header
    /// and index errors of local files.
    pub fn open_remote(url: &str, options: &RemoteOptions) -> Result<Archive> {
        location::open(url, options)
    }

    /// A remote file's entries.
    pub(crate) fn from_remote_file(file: Arc<RemoteFile>) -> Archive {
        let store: Arc<dyn Store> = Arc::new(file.clone());
        Archive::from_header(&file.url, &file.header, store)
    }

    /// The entries of a remote shard index, each from the shard the index names, which must
    /// hold it.
    pub(crate) fn from_remote_index(index: &ShardIndex, files: Vec<Arc<RemoteFile>>) -> Result<Archive> {
        let mut archive = Archive::named(&index.path, index.metadata.clone());
        let positions: Vec<HashMap<&str, usize>> = files
            .iter()
            .map(|file| file.header.entries.iter().enumerate().map(|(at, entry)| (entry.name.as_str(), at)).collect())
            .collect();
        let stores: Vec<Arc<dyn Store>> = files.iter().map(|file| Arc::new(file.clone()) as Arc<dyn Store>).collect();
        for (name, shard) in &index.weight_map {
            let Some(&at) = positions[*shard].get(name.as_str()) else {
                return Err(Error::ShardMismatch {
                    index: index.path.clone(),
                    shard: index.shards[*shard].clone(),
                    problem: ShardProblem::MissingEntry { name: name.clone() },
                });
            };
            archive.push(name.clone(), stores[*shard].clone(), at);
        }
        Ok(archive)
    }

    /// What this archive's remote files have transferred so far; `None` for an archive with
    /// no remote entries.
    pub fn transfer_stats(&self) -> Option<TransferStats> {
        let mut clients: Vec<&Arc<Client>> = Vec::new();
        for file in self.slots.values().filter_map(|slot| slot.store.remote()) {
            if !clients.iter().any(|client| Arc::ptr_eq(client, &file.client)) {
                clients.push(&file.client);
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

/// A file in a store is a source whose entries are fetched when read.
impl Source for Arc<RemoteFile> {
    fn spec(&self, at: usize) -> (DType, &[usize]) {
        let entry = &self.header.entries[at];
        (entry.dtype, &entry.shape)
    }

    fn tensor(&self, at: usize) -> Result<Tensor> {
        self.entry_tensor(at, &self.header.entries[at].shape, &self.entry_bytes(at)?)
    }

    fn path(&self) -> Option<&std::path::Path> {
        Some(&self.url)
    }

    fn location(&self, at: usize) -> Option<EntryLocation> {
        let entry = &self.header.entries[at];
        let file_offset = self.header.data_start + entry.begin;
        Some(EntryLocation { path: self.url.clone(), data_offsets: (entry.begin, entry.end), file_offset })
    }

    fn stored_bytes(&self, at: usize) -> usize {
        let entry = &self.header.entries[at];
        entry.end - entry.begin
    }

    fn data(&self, at: usize) -> std::result::Result<Cow<'_, [u8]>, DataError> {
        Ok(Cow::Owned(self.entry_bytes(at).map_err(DataError::Io)?.to_vec()))
    }

    fn remote(&self) -> Option<&Arc<RemoteFile>> {
        Some(self)
    }
}

/// One entry to read from a store: its place among the reads of a batch, its file, its number
/// there, and the box wanted (`None` for all of it).
pub(crate) type Read<'a> = (usize, Arc<RemoteFile>, usize, Option<&'a [(usize, usize)]>);

/// Reads entries of files in stores in one batch: only the bytes of their boxes, neighbours
/// coalesced, several requests in flight. The tensors come back with their places.
///
/// # Errors
/// The errors of a transfer, or of data that does not fit its dtype.
pub(crate) fn read_batch(reads: &[Read<'_>]) -> Result<Vec<(usize, Tensor)>> {
    if reads.is_empty() {
        return Ok(Vec::new());
    }
    let mut requests = Vec::with_capacity(reads.len());
    let mut shapes = Vec::with_capacity(reads.len());
    for (_, file, at, boxed) in reads {
        let entry = &file.header.entries[*at];
        let whole = || entry.shape.iter().map(|&size| (0, size)).collect::<Vec<_>>();
        let base = (file.header.data_start + entry.begin) as u64;
        let (boxed, ranges) = match entry.dtype.size_in_bytes() {
            Some(element) => {
                let boxed = boxed.map(<[_]>::to_vec).unwrap_or_else(whole);
                let ranges = box_ranges(&entry.shape, &boxed, element, base);
                (boxed, ranges)
            }
            // Sub-byte values cannot be cut at a byte: such an entry is fetched whole and
            // narrowed as a view.
            None => (whole(), std::iter::once(file.entry_range(*at)).collect()),
        };
        shapes.push(boxed.iter().map(|(_, len)| *len).collect::<Vec<_>>());
        requests.push(Request { file: file.clone(), ranges });
    }
    let fetched = fetch::fetch(&requests)?;
    let mut out = Vec::with_capacity(reads.len());
    for (((index, file, at, boxed), shape), pieces) in reads.iter().zip(shapes).zip(fetched) {
        let bytes: Cow<'_, [u8]> = match pieces.as_slice() {
            [one] => Cow::Borrowed(one),
            many => Cow::Owned(many.concat()),
        };
        let tensor = file.entry_tensor(*at, &shape, &bytes)?;
        out.push((*index, narrow_to(tensor, *boxed)?));
    }
    Ok(out)
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

/// The byte ranges of file `file` holding the box `boxed` (one `(start, len)` per axis) of an
/// entry of `shape` and `element` bytes per value starting at file offset `base`, in row-major
/// order of the box: one range per row of the outer axes down to the innermost cut axis.
pub(crate) fn box_ranges(shape: &[usize], boxed: &[(usize, usize)], element: usize, base: u64) -> Vec<Range<u64>> {
    let count: usize = boxed.iter().map(|(_, len)| len).product();
    if count == 0 {
        return Vec::new();
    }
    let mut strides = vec![element as u64; shape.len()];
    for axis in (0..shape.len().saturating_sub(1)).rev() {
        strides[axis] = strides[axis + 1] * shape[axis + 1] as u64;
    }
    // The innermost axis that is cut: the axes inside it are whole, so each of its runs is
    // contiguous.
    let Some(cut) = (0..shape.len()).rev().find(|&axis| boxed[axis] != (0, shape[axis])) else {
        let total: u64 = shape.iter().map(|&size| size as u64).product::<u64>() * element as u64;
        return std::iter::once(base..base + total).collect();
    };
    let run = boxed[cut].1 as u64 * strides[cut];
    let inner = base + boxed[cut].0 as u64 * strides[cut];
    let mut ranges = Vec::with_capacity(boxed[..cut].iter().map(|(_, len)| len).product());
    let mut index = vec![0usize; cut];
    loop {
        let offset: u64 = (0..cut).map(|axis| (boxed[axis].0 + index[axis]) as u64 * strides[axis]).sum();
        ranges.push(inner + offset..inner + offset + run);
        // The next index of the outer axes, last axis fastest.
        let mut axis = cut;
        loop {
            if axis == 0 {
                return ranges;
            }
            axis -= 1;
            index[axis] += 1;
            if index[axis] < boxed[axis].1 {
                break;
            }
            index[axis] = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[allow(clippy::single_range_in_vec_init)]
    fn boxes_become_one_range_per_row_of_the_outer_axes() {
        // A whole entry is one range.
        assert_eq!(box_ranges(&[4, 6], &[(0, 4), (0, 6)], 2, 100), [100..148]);
        // Rows 1..3: one range.
        assert_eq!(box_ranges(&[4, 6], &[(1, 2), (0, 6)], 2, 0), [12..36]);
        // Columns 3..6 of every row: one range per row.
        assert_eq!(box_ranges(&[2, 6], &[(0, 2), (3, 3)], 4, 0), [12..24, 36..48]);
        // A cut middle axis of a rank-3 entry.
        assert_eq!(box_ranges(&[2, 4, 3], &[(1, 1), (2, 2), (0, 3)], 1, 8), [8 + 18..8 + 24]);
        assert_eq!(box_ranges(&[2, 0], &[(0, 2), (0, 0)], 4, 0), Vec::<Range<u64>>::new());
        assert_eq!(box_ranges(&[], &[], 4, 8), [8..12]);
    }

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
