//! A bounded local cache of fetched ranges: one folder per object version (keyed by the URL
//! and the ETag, so a changed object never serves stale bytes), one file per fetched range,
//! the least recently used removed past the size limit.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::ops::Range;
use std::path::PathBuf;

use bytes::Bytes;
use sha2::{Digest, Sha256};

use super::RemoteFile;

/// Fetched ranges kept under `dir`, at most `max_bytes` in all. A cache failure (a full disk,
/// a removed file) is a miss, never an error: the bytes are fetched again.
#[derive(Clone, Debug)]
pub struct RangeCache {
    dir: PathBuf,
    max_bytes: u64,
}

impl RangeCache {
    /// A cache in `dir` holding at most `max_bytes`.
    pub fn new(dir: impl Into<PathBuf>, max_bytes: u64) -> RangeCache {
        RangeCache { dir: dir.into(), max_bytes }
    }

    /// The folder of this version of `file`.
    fn folder(&self, file: &RemoteFile) -> PathBuf {
        let digest = Sha256::digest(format!("{}\n{}", file.url.display(), file.version).as_bytes());
        let name: String = digest.iter().take(16).map(|byte| format!("{byte:02x}")).collect();
        self.dir.join(name)
    }

    /// The ranges kept of this version of `file`, listed once for a batch of reads.
    pub(crate) fn listing(&self, file: &RemoteFile) -> Listing {
        let folder = self.folder(file);
        let ranges = std::fs::read_dir(&folder)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|item| {
                let name = item.file_name();
                let (start, end) = name.to_str()?.split_once('-')?;
                Some(start.parse::<u64>().ok()?..end.parse::<u64>().ok()?)
            })
            .collect();
        Listing { folder, ranges }
    }

    /// Keeps `bytes`, the contents of `range` of `file`, then trims the cache to its limit.
    pub(crate) fn put(&self, file: &RemoteFile, range: &Range<u64>, bytes: &[u8]) {
        if bytes.len() as u64 > self.max_bytes {
            return;
        }
        let folder = self.folder(file);
        if std::fs::create_dir_all(&folder).is_err() {
            return;
        }
        let target = folder.join(format!("{}-{}", range.start, range.end));
        let temporary = folder.join(format!(".{}-{}.tmp-{}", range.start, range.end, std::process::id()));
        if std::fs::write(&temporary, bytes).is_err() || std::fs::rename(&temporary, &target).is_err() {
            let _ = std::fs::remove_file(&temporary);
            return;
        }
        self.trim();
    }

    /// Removes the least recently used ranges until the cache fits its limit.
    fn trim(&self) {
        let mut kept: Vec<(std::time::SystemTime, u64, PathBuf)> = Vec::new();
        for folder in std::fs::read_dir(&self.dir).into_iter().flatten().flatten() {
            for item in std::fs::read_dir(folder.path()).into_iter().flatten().flatten() {
                if let Ok(meta) = item.metadata() {
                    kept.push((meta.modified().unwrap_or(std::time::UNIX_EPOCH), meta.len(), item.path()));
                }
            }
        }
        let mut total: u64 = kept.iter().map(|(_, len, _)| len).sum();
        kept.sort();
        for (_, len, path) in kept {
            if total <= self.max_bytes {
                break;
            }
            if std::fs::remove_file(&path).is_ok() {
                total -= len;
            }
        }
    }

    /// Bytes the cache holds now.
    pub fn size(&self) -> u64 {
        std::fs::read_dir(&self.dir)
            .into_iter()
            .flatten()
            .flatten()
            .flat_map(|folder| std::fs::read_dir(folder.path()).into_iter().flatten().flatten())
            .filter_map(|item| item.metadata().ok())
            .map(|meta| meta.len())
            .sum()
    }
}

/// The ranges the cache holds of one version of a file.
pub(crate) struct Listing {
    folder: PathBuf,
    ranges: Vec<Range<u64>>,
}

impl Listing {
    /// `range` when a cached range holds all of it.
    pub(crate) fn get(&self, range: &Range<u64>) -> Option<Bytes> {
        let kept = self.ranges.iter().find(|kept| kept.start <= range.start && range.end <= kept.end)?;
        let mut opened = File::open(self.folder.join(format!("{}-{}", kept.start, kept.end))).ok()?;
        opened.seek(SeekFrom::Start(range.start - kept.start)).ok()?;
        let mut bytes = vec![0u8; (range.end - range.start) as usize];
        opened.read_exact(&mut bytes).ok()?;
        // Marks it used, for the eviction order.
        let _ = opened.set_modified(std::time::SystemTime::now());
        Some(Bytes::from(bytes))
    }
}
