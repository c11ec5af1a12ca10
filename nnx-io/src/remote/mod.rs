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

mod cache;
pub(crate) mod fetch;
mod location;

use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use object_store::ObjectStore;
use object_store::path::Path as ObjectPath;

pub use cache::RangeCache;
pub(crate) use fetch::Request;
pub use location::is_remote;

use crate::error::{Error, RemoteProblem, Result};
use crate::header::{self, Header};

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
    /// Time allowed for one request, and for connecting.
    pub timeout: Duration,
    /// A local cache of fetched ranges (none by default).
    pub cache: Option<RangeCache>,
    /// Store settings by `object_store`'s configuration keys (`aws_endpoint`,
    /// `aws_allow_http`, `aws_access_key_id`, `google_service_account`, ...), applied after
    /// the environment's.
    pub config: Vec<(String, String)>,
}

impl Default for RemoteOptions {
    fn default() -> RemoteOptions {
        RemoteOptions {
            coalesce_gap: 1 << 20,
            concurrency: 8,
            max_request_bytes: 16 << 20,
            retries: 3,
            timeout: Duration::from_secs(30),
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

    /// The whole object at `path` (a shard index: small).
    pub(crate) fn get_all(&self, path: &ObjectPath) -> Result<Bytes> {
        let url = self.url(path);
        let bytes = self.block_on(async {
            let result = self.store.get(path).await?;
            result.bytes().await
        });
        let bytes = bytes.map_err(|error| remote_error(&url, error))?;
        self.count(bytes.len());
        Ok(bytes)
    }

    /// Whether an object exists at `path` (a `HEAD` request).
    pub(crate) fn exists(&self, path: &ObjectPath) -> Result<bool> {
        match self.block_on(self.store.head(path)) {
            Ok(_) => {
                self.requests.fetch_add(1, Ordering::Relaxed);
                Ok(true)
            }
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(error) => Err(remote_error(&self.url(path), error)),
        }
    }
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
    /// size.
    pub(crate) fn open(client: Arc<Client>, path: ObjectPath) -> Result<Arc<RemoteFile>> {
        let url_text = client.url(&path);
        let url = PathBuf::from(&url_text);
        let first = client.block_on(async {
            let options =
                object_store::GetOptions { range: Some(object_store::GetRange::Bounded(0..8)), ..Default::default() };
            let result = client.store.get_opts(&path, options).await?;
            let meta = result.meta.clone();
            Ok::<_, object_store::Error>((meta, result.bytes().await?))
        });
        let (meta, first) = match first {
            Ok(found) => found,
            // An empty object has no byte 0 to ask for.
            Err(object_store::Error::Generic { .. })
                if client.block_on(client.store.head(&path)).is_ok_and(|meta| meta.size == 0) =>
            {
                return Err(Error::Header { path: url, problem: crate::HeaderProblem::Empty });
            }
            Err(error) => return Err(remote_error(&url_text, error)),
        };
        client.count(first.len());
        let file_len = usize::try_from(meta.size).unwrap_or(usize::MAX);
        let Some(prefix) = first.first_chunk::<8>() else {
            return Err(Error::Header { path: url, problem: crate::HeaderProblem::TooShort { len: first.len() } });
        };
        let declared =
            header::declared_len(*prefix, file_len).map_err(|problem| Error::Header { path: url.clone(), problem })?;
        let text = if declared == 0 {
            Bytes::new()
        } else {
            let text = client
                .block_on(client.store.get_range(&path, 8..8 + declared as u64))
                .map_err(|error| remote_error(&url_text, error))?;
            client.count(text.len());
            text
        };
        let mut bytes = Vec::with_capacity(8 + text.len());
        bytes.extend_from_slice(prefix);
        bytes.extend_from_slice(&text);
        let header = header::parse_prefix(&bytes, file_len).map_err(|problem| match crate::sniff::sniff(&bytes) {
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
}

/// Opens `url` with `options`: one file, a shard index or a folder.
pub(crate) fn open(url: &str, options: &RemoteOptions) -> Result<crate::Archive> {
    location::open(url, options)
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
    use futures::StreamExt;
    use std::io::Write;
    let (client, path) = location::client(url, options)?;
    let url = client.url(&path);
    let temporary = to.with_extension("download-tmp");
    let mut file = std::fs::File::create(&temporary).map_err(Error::io("create", &temporary))?;
    let written = client.block_on(async {
        let mut stream = client.store.get(&path).await.map_err(|error| remote_error(&url, error))?.into_stream();
        let mut written = 0u64;
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|error| remote_error(&url, error))?;
            file.write_all(&chunk).map_err(Error::io("write", &temporary))?;
            written += chunk.len() as u64;
        }
        Ok::<_, Error>(written)
    });
    let written = match written {
        Ok(written) => written,
        Err(error) => {
            let _ = std::fs::remove_file(&temporary);
            return Err(error);
        }
    };
    client.count(written as usize);
    file.sync_all().map_err(Error::io("write", &temporary))?;
    std::fs::rename(&temporary, to).map_err(Error::io("rename", to))?;
    Ok(written)
}

/// The error of a request to `url`, without anything of the credentials.
pub(crate) fn remote_error(url: &str, error: object_store::Error) -> Error {
    let problem = match &error {
        object_store::Error::NotFound { .. } => RemoteProblem::NotFound,
        object_store::Error::PermissionDenied { .. } => RemoteProblem::Denied,
        object_store::Error::Unauthenticated { .. } => RemoteProblem::Unauthenticated,
        object_store::Error::UnknownConfigurationKey { key, .. } => RemoteProblem::UnknownSetting { key: key.clone() },
        other => {
            let message = other.to_string();
            if message.contains("timed out") || message.contains("timeout") || message.contains("deadline") {
                RemoteProblem::Timeout { message }
            } else {
                RemoteProblem::Transfer { message }
            }
        }
    };
    Error::Remote { url: location::redact(url), problem }
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
    fn urls_lose_their_credentials() {
        assert_eq!(location::redact("https://user:secret@host/a/b?X-Amz-Signature=abc"), "https://host/a/b");
        assert_eq!(location::redact("s3://bucket/key"), "s3://bucket/key");
        assert!(
            is_remote("s3://b/k")
                && is_remote("HF://org/name")
                && !is_remote("/tmp/s3://x")
                && !is_remote("model.safetensors")
        );
    }
}
