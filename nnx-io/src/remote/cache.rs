//! A bounded local cache of fetched ranges: one folder per object version (keyed by the URL
//! and the ETag, so a changed object never serves stale bytes), one file per fetched range,
//! the least recently used removed past the size limit.
//!
//! The cache may be shared: nothing in it is trusted to be what nnx wrote. Its folders are
//! used only when they are real folders, never links; files are created new and opened
//! without following links (`O_NOFOLLOW`); file names are nnx's own (a hash, a range), and
//! trimming removes only plain files of that form, so a link planted in the cache can neither
//! be read through nor make nnx write or delete anywhere else.

use std::fs::OpenOptions;
use std::io::{Read, Seek, SeekFrom, Write};
use std::ops::Range;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use sha2::{Digest, Sha256};

use crate::fs::{StagedFile, open_no_follow};

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

    /// The folder of version `version` of the object at `url`.
    fn folder(&self, url: &str, version: &str) -> PathBuf {
        let digest = Sha256::digest(format!("{url}\n{version}").as_bytes());
        let name: String = digest.iter().take(16).map(|byte| format!("{byte:02x}")).collect();
        self.dir.join(name)
    }

    /// The ranges kept of version `version` of the object at `url`, listed once for a batch
    /// of reads.
    pub(crate) fn listing(&self, url: &str, version: &str) -> Listing {
        let folder = self.folder(url, version);
        let ranges = if is_real_folder(&folder) {
            cache_files(&folder).filter_map(|(name, _)| range_of(&name)).collect()
        } else {
            Vec::new()
        };
        Listing { folder, ranges }
    }

    /// Keeps `bytes`, the contents of `range` of version `version` of the object at `url`,
    /// then trims the cache to its limit.
    pub(crate) fn put(&self, url: &str, version: &str, range: &Range<u64>, bytes: &[u8]) {
        if bytes.len() as u64 > self.max_bytes {
            return;
        }
        let folder = self.folder(url, version);
        if std::fs::create_dir_all(&folder).is_err() || !is_real_folder(&folder) {
            return;
        }
        // A fresh file (never an existing one, nor a link's target), renamed over the name: a
        // rename replaces a link planted there rather than writing through it. The file is put
        // on disk first, so that a crash never leaves a torn range under the name; the folder
        // is not (a range lost in a crash is a miss).
        let Ok(mut staged) = StagedFile::create(folder.join(format!("{}-{}", range.start, range.end))) else {
            return;
        };
        if staged.write_all(bytes).is_ok() && staged.rename().is_ok() {
            self.trim();
        }
    }

    /// Removes the least recently used ranges until the cache fits its limit.
    fn trim(&self) {
        let mut kept: Vec<(std::time::SystemTime, u64, PathBuf)> = Vec::new();
        for folder in self.folders() {
            for (name, meta) in cache_files(&folder) {
                if range_of(&name).is_some() {
                    kept.push((meta.modified().unwrap_or(std::time::UNIX_EPOCH), meta.len(), folder.join(name)));
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

    /// The cache's folders: real folders named as nnx names them, links and strays left alone.
    fn folders(&self) -> impl Iterator<Item = PathBuf> {
        std::fs::read_dir(&self.dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|item| item.file_type().is_ok_and(|kind| kind.is_dir()))
            .filter(|item| item.file_name().to_str().is_some_and(is_folder_name))
            .map(|item| item.path())
    }

    /// Bytes the cache holds now.
    pub fn size(&self) -> u64 {
        self.folders().flat_map(|folder| cache_files(&folder).collect::<Vec<_>>()).map(|(_, meta)| meta.len()).sum()
    }
}

/// Whether `name` is a cache folder's name: 32 lowercase hexadecimal digits.
fn is_folder_name(name: &str) -> bool {
    name.len() == 32 && name.bytes().all(|byte| byte.is_ascii_digit() || (b'a'..=b'f').contains(&byte))
}

/// The range a cached file's name (`START-END`) holds, for well-formed names only.
fn range_of(name: &str) -> Option<Range<u64>> {
    let (start, end) = name.split_once('-')?;
    let digits = |text: &str| !text.is_empty() && text.bytes().all(|byte| byte.is_ascii_digit());
    if !digits(start) || !digits(end) {
        return None;
    }
    let range = start.parse::<u64>().ok()?..end.parse::<u64>().ok()?;
    (range.start < range.end).then_some(range)
}

/// Whether `path` is a folder itself, not a link to one.
fn is_real_folder(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|meta| meta.file_type().is_dir())
}

/// The plain files of `folder` (links and folders left out), with their metadata.
fn cache_files(folder: &Path) -> impl Iterator<Item = (String, std::fs::Metadata)> {
    std::fs::read_dir(folder).into_iter().flatten().flatten().filter_map(|item| {
        // `DirEntry::metadata` does not follow links.
        let meta = item.metadata().ok().filter(|meta| meta.file_type().is_file())?;
        Some((item.file_name().into_string().ok()?, meta))
    })
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
        let path = self.folder.join(format!("{}-{}", kept.start, kept.end));
        let mut opened = open_no_follow(OpenOptions::new().read(true), &path).ok()?;
        opened.seek(SeekFrom::Start(range.start - kept.start)).ok()?;
        let mut bytes = Vec::new();
        bytes.try_reserve_exact(usize::try_from(range.end - range.start).ok()?).ok()?;
        (&mut opened).take(range.end - range.start).read_to_end(&mut bytes).ok()?;
        if bytes.len() as u64 != range.end - range.start {
            return None;
        }
        // Marks it used, for the eviction order.
        let _ = opened.set_modified(std::time::SystemTime::now());
        Some(Bytes::from(bytes))
    }
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    #[test]
    fn links_planted_in_the_cache_are_not_followed() {
        let scratch = std::env::temp_dir().join(format!("nnx-range-cache-{}", std::process::id()));
        let (cache_dir, outside) = (scratch.join("cache"), scratch.join("outside"));
        std::fs::create_dir_all(&cache_dir).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        let victim = outside.join("victim");
        std::fs::write(&victim, b"precious").unwrap();
        // A folder link: listing it finds nothing, trimming deletes nothing through it.
        let folder = cache_dir.join("0123456789abcdef0123456789abcdef");
        std::os::unix::fs::symlink(&outside, &folder).unwrap();
        std::fs::write(outside.join("0-8"), b"precious").unwrap();
        let cache = RangeCache::new(&cache_dir, 0);
        assert!(!is_real_folder(&folder));
        assert_eq!(cache.size(), 0);
        cache.trim();
        assert!(outside.join("0-8").exists(), "trimming followed a folder link");
        // A file link: not read, not written through.
        let real = cache_dir.join("fedcba9876543210fedcba9876543210");
        std::fs::create_dir_all(&real).unwrap();
        std::os::unix::fs::symlink(&victim, real.join("0-8")).unwrap();
        let listing = Listing { folder: real.clone(), ranges: std::iter::once(0..8).collect() };
        assert_eq!(listing.get(&(0..8)), None, "a link was read through");
        assert!(open_no_follow(OpenOptions::new().write(true), &real.join("0-8")).is_err());
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
        assert_eq!(range_of("0-8"), Some(0..8));
        assert_eq!(range_of("+1-8"), None);
        assert_eq!(range_of("../0-8"), None);
        std::fs::remove_dir_all(&scratch).unwrap();
    }
}
