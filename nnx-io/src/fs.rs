//! Every write nnx makes on disk goes through here. A file or a folder is made under a hidden
//! temporary name beside the one it replaces, put on disk, renamed over it, and then the folder
//! holding both is put on disk: a crash or a kill at any moment leaves the old version or the
//! new one, never a torn one. What an interrupted save leaves is known by its name
//! (`.NAME.TAG-PROCESS-COUNTER`), never read as data, and removed by the next save.
//!
//! - [`write_atomic`] and [`write_atomic_with`] replace a file with bytes or with what a
//!   callback writes. [`StagedFile`] takes the same steps one at a time, for writers that
//!   stream, or that rename several files in before one of them commits the set (the shards of
//!   a checkpoint, then its index). [`Staged`] does it for anything made at a path (a link).
//! - [`TargetFolder`] and [`StagedFolder`] replace a folder as a whole.
//! - [`replace`] puts a finished file that was written under a name of its own (a download
//!   that resumes) in place, and [`sync_folder`] makes renames durable.
//!
//! Temporary files are created new and never through a symbolic link, so a link planted in a
//! shared cache cannot turn a write elsewhere. The one read here, `read_text_within`, is the
//! size-limited read of the small text files nnx keeps beside weights (indexes, configurations).

use std::ffi::{OsStr, OsString};
use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{Error, Result};

/// The tag of a file's temporary: `.NAME.tmp-PROCESS-COUNTER`. The name ends in neither
/// `.safetensors` nor `.json`, so no folder reader takes it for weights.
const FILE_TAG: &str = "tmp";
/// The tag of a new folder being written (or, after an exchange, of the old one being removed).
const FOLDER_TAG: &str = "pretrained-tmp";
/// The tag of an old folder renamed aside until the new one is in.
const ASIDE_TAG: &str = "pretrained-old";

/// Fresh names tried when one is taken (only a leftover of a process with the same id takes
/// one) before giving up.
const ATTEMPTS: usize = 64;

/// The buffer of a [`StagedFile`]: larger writes go straight to the file.
const BUFFER_BYTES: usize = 1 << 20;

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// The folder holding `path` (`.` for a bare name).
pub(crate) fn folder_of(path: &Path) -> PathBuf {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// `.NAME.TAG-PROCESS-COUNTER` beside `target`, a name no other thread or process picks.
fn temporary_path(target: &Path, tag: &str) -> PathBuf {
    let mut name = OsString::from(".");
    name.push(target.file_name().unwrap_or(OsStr::new("file")));
    name.push(format!(".{tag}-{}-{}", std::process::id(), COUNTER.fetch_add(1, Ordering::Relaxed)));
    folder_of(target).join(name)
}

/// `NAME` of a temporary `.NAME.TAG-PROCESS-COUNTER` (the last tag counts: a name may hold one).
fn stands_for<'a>(file_name: &'a [u8], tag: &str) -> Option<&'a [u8]> {
    let rest = file_name.strip_prefix(b".")?;
    let marker = format!(".{tag}-");
    let at = rest.windows(marker.len()).rposition(|window| window == marker.as_bytes())?;
    let numbers = &rest[at + marker.len()..];
    let dash = numbers.iter().position(|&byte| byte == b'-')?;
    let digits = |text: &[u8]| !text.is_empty() && text.iter().all(u8::is_ascii_digit);
    (digits(&numbers[..dash]) && digits(&numbers[dash + 1..])).then_some(&rest[..at])
}

/// The file name a temporary file of a save (`.NAME.tmp-PROCESS-COUNTER`) stands in for, when
/// `file_name` is one.
pub fn temporary_target(file_name: &str) -> Option<&str> {
    stands_for(file_name.as_bytes(), FILE_TAG).and_then(|name| std::str::from_utf8(name).ok())
}

/// Puts a folder's entries (renames, new files) on disk. Folders that cannot be opened for
/// this (some platforms) are skipped.
///
/// # Errors
/// [`Error::Io`] naming the folder when the system cannot flush it.
pub fn sync_folder(dir: &Path) -> Result<()> {
    if let Ok(folder) = File::open(dir) {
        folder.sync_all().map_err(Error::io("flush to disk", dir))?;
    }
    Ok(())
}

/// Copies the file `from` to `to`, which must not exist (a file of a [`StagedFolder`]), with
/// its permissions, and puts the copy on disk.
///
/// # Errors
/// [`Error::Io`] naming the file that cannot be copied or flushed.
pub fn copy_synced(from: &Path, to: &Path) -> Result<()> {
    std::fs::copy(from, to).map_err(Error::io("copy", from))?;
    File::open(to).and_then(|file| file.sync_all()).map_err(Error::io("flush to disk", to))
}

/// Replaces `path` with `bytes` atomically ([`StagedFile`], then [`StagedFile::commit`]).
///
/// # Errors
/// [`Error::Io`] naming the file that cannot be written; `path` is then untouched.
pub fn write_atomic(path: impl AsRef<Path>, bytes: &[u8]) -> Result<()> {
    let mut staged = StagedFile::create(path.as_ref())?;
    staged.write_all(bytes).map_err(Error::io("write", staged.path()))?;
    staged.commit()
}

/// Replaces `path` atomically with what `write` writes ([`StagedFile::write_with`], then
/// [`StagedFile::commit`]), and returns what `write` returns.
///
/// # Errors
/// The error of `write`, or [`Error::Io`] naming the file that cannot be written; `path` is
/// then untouched.
pub fn write_atomic_with<T>(path: impl AsRef<Path>, write: impl FnOnce(&mut dyn Write) -> Result<T>) -> Result<T> {
    let mut staged = StagedFile::create(path.as_ref())?;
    let value = staged.write_with(write)?;
    staged.commit()?;
    Ok(value)
}

/// Renames the finished file `from` over `to`, in the same folder, and puts the rename on
/// disk. For files written under a name of their own (a download kept to resume); `from` must
/// already be on disk.
///
/// # Errors
/// [`Error::Io`] naming `to` when it cannot be replaced.
pub fn replace(from: &Path, to: &Path) -> Result<()> {
    std::fs::rename(from, to).map_err(Error::io("replace", to))?;
    sync_folder(&folder_of(to))
}

/// The text of the file at `path`, or `Err` with its size when that passes `limit` bytes: the
/// size is checked before anything is read, and the read stops past the limit whatever the size
/// said, so a file that grows meanwhile costs no more.
///
/// # Errors
/// [`Error::Io`] when the file cannot be read (or is not UTF-8).
pub(crate) fn read_text_within(path: &Path, limit: u64) -> Result<std::result::Result<String, u64>> {
    let file = File::open(path).map_err(Error::io("read", path))?;
    let len = file.metadata().map_err(Error::io("read", path))?.len();
    if len > limit {
        return Ok(Err(len));
    }
    let mut text = String::new();
    file.take(limit + 1).read_to_string(&mut text).map_err(Error::io("read", path))?;
    if text.len() as u64 > limit {
        return Ok(Err(text.len() as u64));
    }
    Ok(Ok(text))
}

/// Opens `path` with `options`, refusing a symbolic link at its last component (`O_NOFOLLOW`
/// on Unix; elsewhere callers check with [`std::fs::symlink_metadata`] first) and anything that
/// is not a plain file (a FIFO, a device).
pub(crate) fn open_no_follow(options: &mut OpenOptions, path: &Path) -> std::io::Result<File> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.custom_flags(libc::O_NOFOLLOW);
    }
    let opened = options.open(path)?;
    if !opened.metadata()?.file_type().is_file() {
        return Err(std::io::Error::other("not a plain file"));
    }
    Ok(opened)
}

/// Something made under a hidden temporary name beside its target (see [`Staged::make`]),
/// renamed over the target by [`Staged::commit`] and removed if it never is.
#[derive(Debug)]
pub struct Staged {
    temporary: PathBuf,
    target: PathBuf,
    renamed: bool,
}

impl Staged {
    /// Makes something new beside `target` with `make`, given a fresh temporary path. `make`
    /// must fail with [`std::io::ErrorKind::AlreadyExists`] when something is at the path (as
    /// `create_new` opens and symbolic links do): another name is then tried.
    ///
    /// # Errors
    /// [`Error::Io`] naming the temporary path with the error of `make`.
    pub fn make<T>(
        target: impl Into<PathBuf>,
        mut make: impl FnMut(&Path) -> std::io::Result<T>,
    ) -> Result<(Staged, T)> {
        let target = target.into();
        let mut attempt = 0;
        loop {
            let temporary = temporary_path(&target, FILE_TAG);
            match make(&temporary) {
                Ok(made) => return Ok((Staged { temporary, target, renamed: false }, made)),
                Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists && attempt < ATTEMPTS => attempt += 1,
                Err(error) => return Err(Error::io("create", temporary)(error)),
            }
        }
    }

    /// The temporary path.
    pub fn path(&self) -> &Path {
        &self.temporary
    }

    /// The path this replaces.
    pub fn target(&self) -> &Path {
        &self.target
    }

    /// Renames the temporary over the target. The rename is durable once the folder is synced
    /// ([`sync_folder`]): writers that rename several files in sync it once, after the last.
    ///
    /// # Errors
    /// [`Error::Io`] naming the target; the temporary is then removed.
    pub fn rename(mut self) -> Result<()> {
        std::fs::rename(&self.temporary, &self.target).map_err(Error::io("replace", &self.target))?;
        self.renamed = true;
        Ok(())
    }

    /// [`Staged::rename`], then [`sync_folder`]: the target is replaced, on disk.
    ///
    /// # Errors
    /// As [`Staged::rename`] and [`sync_folder`].
    pub fn commit(self) -> Result<()> {
        let folder = folder_of(&self.target);
        self.rename()?;
        sync_folder(&folder)
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        if !self.renamed {
            let _ = std::fs::remove_file(&self.temporary);
        }
    }
}

/// A new file written under a hidden temporary name beside the file it will replace
/// (`.NAME.tmp-PROCESS-COUNTER`), created new and never through a link, buffered. Dropped
/// before [`StagedFile::rename`] or [`StagedFile::commit`], it is removed.
///
/// # Examples
///
/// ```
/// use std::io::Write;
///
/// let dir = std::env::temp_dir().join(format!("nnx-doc-staged-{}", std::process::id()));
/// std::fs::create_dir_all(&dir)?;
/// let mut file = nnx_io::fs::StagedFile::create(dir.join("notes.txt"))?;
/// file.write_all(b"all or nothing")?;
/// file.commit()?;
/// assert_eq!(std::fs::read(dir.join("notes.txt"))?, b"all or nothing");
/// # std::fs::remove_dir_all(&dir)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct StagedFile {
    out: BufWriter<File>,
    staged: Staged,
}

impl StagedFile {
    /// Creates the temporary file beside `target` (which need not exist).
    ///
    /// # Errors
    /// [`Error::Io`] naming the temporary file when it cannot be created (a missing folder,
    /// no permission).
    pub fn create(target: impl Into<PathBuf>) -> Result<StagedFile> {
        let (staged, file) = Staged::make(target, |temporary| {
            open_no_follow(OpenOptions::new().write(true).create_new(true), temporary)
        })?;
        Ok(StagedFile { out: BufWriter::with_capacity(BUFFER_BYTES, file), staged })
    }

    /// The temporary file.
    pub fn path(&self) -> &Path {
        self.staged.path()
    }

    /// Runs `write` on the file and returns what it returns. An [`Error::Io`] of `write` that
    /// names no file (writers of formats do not know where they write) is given the
    /// temporary's path.
    ///
    /// # Errors
    /// The error of `write`.
    pub fn write_with<T>(&mut self, write: impl FnOnce(&mut dyn Write) -> Result<T>) -> Result<T> {
        write(&mut self.out).map_err(|error| match error {
            Error::Io { action, path, source } if path.as_os_str().is_empty() => {
                Error::Io { action, path: self.staged.temporary.clone(), source }
            }
            other => other,
        })
    }

    /// Flushes the file, puts it on disk and renames it over the target; the rename is
    /// durable once the folder is synced ([`sync_folder`]).
    ///
    /// # Errors
    /// [`Error::Io`] naming the file that cannot be written or replaced; the temporary file is
    /// then removed.
    pub fn rename(self) -> Result<()> {
        self.synced()?.rename()
    }

    /// [`StagedFile::rename`], then [`sync_folder`]: the target is replaced, on disk.
    ///
    /// # Errors
    /// As [`StagedFile::rename`] and [`sync_folder`].
    pub fn commit(self) -> Result<()> {
        self.synced()?.commit()
    }

    /// Flushes and closes the file after putting it on disk (some systems cannot rename open
    /// files).
    fn synced(self) -> Result<Staged> {
        let StagedFile { out, staged } = self;
        let file = out.into_inner().map_err(|error| Error::io("write", staged.path())(error.into_error()))?;
        file.sync_all().map_err(Error::io("flush to disk", staged.path()))?;
        Ok(staged)
    }
}

impl Write for StagedFile {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.out.write(bytes)
    }

    fn write_all(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.out.write_all(bytes)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

/// What a folder beside a [`TargetFolder`], left by a save, holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Leftover {
    /// `.NAME.pretrained-tmp-...`: a new folder being written, or after an exchange the old
    /// folder being removed.
    Temporary,
    /// `.NAME.pretrained-old-...`: the old folder, renamed aside until the new one is in.
    Aside,
}

impl Leftover {
    fn tag(self) -> &'static str {
        match self {
            Leftover::Temporary => FOLDER_TAG,
            Leftover::Aside => ASIDE_TAG,
        }
    }
}

/// A folder that a save replaces as a whole (a pretrained folder): the new folder is written
/// beside it ([`TargetFolder::stage`]), put on disk, and swapped with it in one step
/// (`renameat2` with `RENAME_EXCHANGE` on Linux). Where the file system cannot exchange
/// folders, the old folder is renamed aside (`.NAME.pretrained-old-...`) and the new one
/// renamed in; a crash between the two leaves the old folder aside, and the next save or
/// [`restore_folder`] puts it back. Either way a crash leaves the complete old folder or the
/// complete new one. One writer at a time is assumed per folder.
#[derive(Debug)]
pub struct TargetFolder {
    dir: PathBuf,
    parent: PathBuf,
    name: OsString,
}

impl TargetFolder {
    /// The folder `dir`, which may not exist yet (its parent is created); a symbolic link to a
    /// folder is followed, so that the folder it names is the one replaced.
    ///
    /// # Errors
    /// [`Error::Io`] naming `dir` when it has no name in a parent folder, is a file, or is
    /// (or holds) the working folder, which the removal of the old folder would take away;
    /// or when its parent cannot be created.
    pub fn resolve(dir: &Path) -> Result<TargetFolder> {
        let is_link = std::fs::symlink_metadata(dir).is_ok_and(|meta| meta.file_type().is_symlink());
        let dir = if is_link || dir.file_name().is_none() {
            std::fs::canonicalize(dir).map_err(Error::io("resolve", dir))?
        } else {
            dir.to_path_buf()
        };
        let refuse = |kind, message: &str, dir: &Path| Error::Io {
            action: "save a pretrained folder at",
            path: dir.to_path_buf(),
            source: std::io::Error::new(kind, message),
        };
        let Some(target) = TargetFolder::of(&dir) else {
            let message = "a pretrained folder needs a name in a parent folder: pass a subfolder";
            return Err(refuse(std::io::ErrorKind::Other, message, &dir));
        };
        std::fs::create_dir_all(&target.parent).map_err(Error::io("create", &target.parent))?;
        if !target.exists()? {
            return Ok(target);
        }
        if !std::fs::metadata(&target.dir).map_err(Error::io("inspect", &target.dir))?.is_dir() {
            let message = "a file is in the way: remove it or choose another folder";
            return Err(refuse(std::io::ErrorKind::NotADirectory, message, &target.dir));
        }
        // The old folder is removed once the new one is in: the working folder must not be
        // in it.
        let working = std::env::current_dir().ok();
        let canonical = std::fs::canonicalize(&target.dir).map_err(Error::io("resolve", &target.dir))?;
        if working.is_some_and(|working| working.starts_with(&canonical)) {
            let message = "it is the working folder or holds it, and a save replaces the folder as a whole: save into a subfolder";
            return Err(refuse(std::io::ErrorKind::InvalidInput, message, &target.dir));
        }
        Ok(target)
    }

    /// The folder's parent and name, without creating or resolving anything; `None` for paths
    /// without a name (`/`, `..`).
    fn of(dir: &Path) -> Option<TargetFolder> {
        let name = dir.file_name()?.to_os_string();
        Some(TargetFolder { dir: dir.to_path_buf(), parent: folder_of(dir), name })
    }

    /// The folder.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// Whether something is at the folder's path (a link is not followed).
    ///
    /// # Errors
    /// [`Error::Io`] when the system cannot tell.
    pub fn exists(&self) -> Result<bool> {
        match std::fs::symlink_metadata(&self.dir) {
            Ok(_) => Ok(true),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(source) => Err(Error::Io { action: "inspect", path: self.dir.clone(), source }),
        }
    }

    /// Starts a save: puts back a folder an interrupted save left aside, removes the other
    /// leftovers of interrupted saves, and creates a new, empty folder beside the target for
    /// the new contents.
    ///
    /// # Errors
    /// [`Error::Io`] naming the folder that cannot be restored or created.
    pub fn stage(&self) -> Result<StagedFolder<'_>> {
        self.restore()?;
        self.remove_leftovers();
        let path = self.sibling(Leftover::Temporary);
        std::fs::create_dir(&path).map_err(Error::io("create", &path))?;
        Ok(StagedFolder { target: self, path, committed: false })
    }

    /// `.NAME.TAG-PROCESS-COUNTER` beside the target.
    fn sibling(&self, kind: Leftover) -> PathBuf {
        temporary_path(&self.dir, kind.tag())
    }

    /// What `file_name` in the parent is to this target, if it is a leftover of its saves.
    fn leftover(&self, file_name: &OsStr) -> Option<Leftover> {
        [Leftover::Temporary, Leftover::Aside]
            .into_iter()
            .find(|kind| stands_for(file_name.as_encoded_bytes(), kind.tag()) == Some(self.name.as_encoded_bytes()))
    }

    /// The leftovers of earlier saves of this target, in name order.
    fn leftovers(&self) -> Vec<(Leftover, PathBuf)> {
        let Ok(listing) = std::fs::read_dir(&self.parent) else {
            return Vec::new();
        };
        let mut found: Vec<(Leftover, PathBuf)> = listing
            .flatten()
            .filter_map(|item| self.leftover(&item.file_name()).map(|kind| (kind, item.path())))
            .collect();
        found.sort();
        found
    }

    /// When the target is missing but a save renamed it aside and was stopped before the new
    /// folder was renamed in, puts it back.
    fn restore(&self) -> Result<()> {
        if self.exists()? {
            return Ok(());
        }
        let Some((_, aside)) = self.leftovers().into_iter().rev().find(|(kind, _)| *kind == Leftover::Aside) else {
            return Ok(());
        };
        std::fs::rename(&aside, &self.dir).map_err(|source| Error::Io { action: "restore", path: aside, source })?;
        sync_folder(&self.parent)
    }

    /// Removes the folders that interrupted saves left (after [`TargetFolder::restore`]).
    /// Failures are ignored: leftovers are never read, and the next save tries again.
    fn remove_leftovers(&self) {
        for (_, path) in self.leftovers() {
            let _ = std::fs::remove_dir_all(path);
        }
    }

    /// [`StagedFolder::commit`] where folders cannot be exchanged: the old folder is renamed
    /// aside, then `temporary` renamed in. A crash between the two leaves no target, which
    /// [`TargetFolder::restore`] repairs by putting the old folder back.
    fn commit_by_renames(&self, temporary: &Path) -> Result<()> {
        let aside = self.sibling(Leftover::Aside);
        std::fs::rename(&self.dir, &aside).map_err(Error::io("rename aside", &self.dir))?;
        if let Err(source) = std::fs::rename(temporary, &self.dir) {
            // Put the old folder back; if even that fails, the next save or load does it.
            let _ = std::fs::rename(&aside, &self.dir);
            return Err(Error::Io { action: "rename into place", path: self.dir.clone(), source });
        }
        sync_folder(&self.parent)?;
        let _ = std::fs::remove_dir_all(&aside);
        Ok(())
    }
}

/// Puts the folder a crashed save left aside back in the place of `dir` when `dir` is missing
/// (see [`TargetFolder`]); nothing when `dir` exists, cannot be looked at (the error is then
/// the reader's to report) or nothing is aside. Readers of saved folders call it first.
///
/// # Errors
/// [`Error::Io`] naming the folder aside when it cannot be put back.
pub fn restore_folder(dir: &Path) -> Result<()> {
    let missing = matches!(std::fs::symlink_metadata(dir), Err(error) if error.kind() == std::io::ErrorKind::NotFound);
    match TargetFolder::of(dir) {
        Some(target) if missing => target.restore(),
        _ => Ok(()),
    }
}

/// The new folder of a save of a [`TargetFolder`], beside it; removed with what it holds
/// when dropped before [`StagedFolder::commit`].
#[derive(Debug)]
pub struct StagedFolder<'a> {
    target: &'a TargetFolder,
    path: PathBuf,
    committed: bool,
}

impl StagedFolder<'_> {
    /// The new folder, to write into.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Puts the complete new folder on disk and in the target's place: a rename when there is
    /// no target, else an exchange of the two folders, else the old folder renamed aside and
    /// the new one renamed in. The old folder is then removed. Files in the folder must be on
    /// disk already ([`write_atomic`], [`StagedFile`]); subfolders must be synced
    /// ([`sync_folder`]).
    ///
    /// # Errors
    /// [`Error::Io`] naming the folder that cannot be renamed or synced; the target is then the
    /// old folder (or, after a failed sync, possibly the new one).
    pub fn commit(mut self) -> Result<()> {
        sync_folder(&self.path)?;
        let target = self.target;
        if !target.exists()? {
            std::fs::rename(&self.path, &target.dir).map_err(Error::io("rename into place", &target.dir))?;
            self.committed = true;
            return sync_folder(&target.parent);
        }
        let exchanged =
            exchange(&self.path, &target.dir).map_err(Error::io("exchange the new folder with", &target.dir))?;
        if exchanged {
            // The staged path now holds the old folder, which the drop removes.
            return sync_folder(&target.parent);
        }
        target.commit_by_renames(&self.path)?;
        self.committed = true;
        Ok(())
    }
}

impl Drop for StagedFolder<'_> {
    fn drop(&mut self) {
        if !self.committed {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// Exchanges the folders `a` and `b` in one step: `Ok(false)` when the system or the file
/// system cannot.
#[cfg(target_os = "linux")]
fn exchange(a: &Path, b: &Path) -> std::io::Result<bool> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;

    let a = CString::new(a.as_os_str().as_bytes())?;
    let b = CString::new(b.as_os_str().as_bytes())?;
    // SAFETY: `renameat2` reads the two NUL-terminated paths, which live until the call
    // returns, and nothing else; `AT_FDCWD` makes relative paths start at the working folder.
    // The syscall is used rather than the libc function, which older C libraries lack.
    let result = unsafe {
        libc::syscall(
            libc::SYS_renameat2,
            libc::c_long::from(libc::AT_FDCWD),
            a.as_ptr(),
            libc::c_long::from(libc::AT_FDCWD),
            b.as_ptr(),
            libc::c_long::from(libc::RENAME_EXCHANGE),
        )
    };
    if result == 0 {
        return Ok(true);
    }
    let error = std::io::Error::last_os_error();
    match error.raw_os_error() {
        // Flags this file system does not take, a kernel before 3.15, or a sandbox that
        // refuses the call: renames do the job instead.
        Some(libc::EINVAL | libc::ENOSYS | libc::EOPNOTSUPP | libc::EPERM) => Ok(false),
        _ => Err(error),
    }
}

/// Exchanges the folders `a` and `b` in one step: `Ok(false)` when the system or the file
/// system cannot.
#[cfg(not(target_os = "linux"))]
fn exchange(_: &Path, _: &Path) -> std::io::Result<bool> {
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "nnx-fs-unit-{tag}-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn listing(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> =
            std::fs::read_dir(dir).unwrap().map(|item| item.unwrap().file_name().into_string().unwrap()).collect();
        names.sort();
        names
    }

    #[test]
    fn a_file_is_replaced_whole_and_a_failed_write_leaves_nothing() {
        let dir = scratch("file");
        let path = dir.join("model.safetensors");
        write_atomic(&path, b"old").unwrap();
        let failed = write_atomic_with(&path, |out| {
            out.write_all(b"half").unwrap();
            Err::<(), _>(Error::Io { action: "write", path: PathBuf::new(), source: std::io::Error::other("full") })
        });
        let message = failed.unwrap_err().to_string();
        assert!(message.contains(".model.safetensors.tmp-"), "the temporary file is named: {message}");
        assert_eq!(std::fs::read(&path).unwrap(), b"old");
        assert_eq!(listing(&dir), ["model.safetensors"], "the temporary file is removed");
        let written = write_atomic_with(&path, |out| {
            out.write_all(b"new").map_err(|source| Error::Io { action: "write", path: PathBuf::new(), source })?;
            Ok(3)
        });
        assert_eq!(written.unwrap(), 3);
        assert_eq!(std::fs::read(&path).unwrap(), b"new");
        assert_eq!(listing(&dir), ["model.safetensors"]);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_taken_temporary_name_is_skipped() {
        let dir = scratch("taken");
        let path = dir.join("a.json");
        // What a killed process with this process's id may have left.
        let next = COUNTER.load(Ordering::Relaxed);
        for counter in next..next + 4 {
            std::fs::write(dir.join(format!(".a.json.tmp-{}-{counter}", std::process::id())), b"stale").unwrap();
        }
        write_atomic(&path, b"{}").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"{}");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[cfg(unix)]
    #[test]
    fn links_are_replaced_never_written_through() {
        let dir = scratch("link");
        let victim = dir.join("victim");
        std::fs::write(&victim, b"precious").unwrap();
        std::os::unix::fs::symlink(&victim, dir.join("ref")).unwrap();
        write_atomic(dir.join("ref"), b"commit").unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
        assert!(!std::fs::symlink_metadata(dir.join("ref")).unwrap().file_type().is_symlink());
        assert!(open_no_follow(OpenOptions::new().read(true), &dir.join("missing")).is_err());
        std::os::unix::fs::symlink(&victim, dir.join("link")).unwrap();
        assert!(open_no_follow(OpenOptions::new().write(true), &dir.join("link")).is_err());
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn temporary_names_are_recognised_exactly() {
        assert_eq!(temporary_target(".model.safetensors.tmp-1-2"), Some("model.safetensors"));
        assert_eq!(temporary_target(".model.safetensors.index.json.tmp-12-0"), Some("model.safetensors.index.json"));
        for other in ["model.safetensors.tmp-1-2", ".model.safetensors.tmp-1", ".m.tmp-a-2", ".m.pretrained-tmp-1-2"] {
            assert_eq!(temporary_target(other), None, "{other}");
        }
        let target = TargetFolder::of(Path::new("/x/model")).unwrap();
        let check = |name: &str| target.leftover(OsStr::new(name));
        assert_eq!(check(".model.pretrained-tmp-12-0"), Some(Leftover::Temporary));
        assert_eq!(check(".model.pretrained-old-12-3"), Some(Leftover::Aside));
        assert_eq!(check(".model.pretrained-tmp-12"), None);
        assert_eq!(check(".model.pretrained-new-12-0"), None);
        assert_eq!(check(".model2.pretrained-tmp-12-0"), None);
        assert_eq!(check("model.pretrained-tmp-12-0"), None);
        assert_eq!(check(".model.pretrained-tmp-1.pretrained-tmp-2-3"), None);
    }

    #[test]
    fn folders_are_exchanged_or_renamed_and_a_crash_between_renames_is_restored() {
        let root = scratch("folders");
        let target = TargetFolder::resolve(&root.join("model")).unwrap();
        let staged = target.stage().unwrap();
        std::fs::write(staged.path().join("config.json"), "old").unwrap();
        staged.commit().unwrap();
        let staged = target.stage().unwrap();
        std::fs::write(staged.path().join("config.json"), "new").unwrap();
        staged.commit().unwrap();
        assert_eq!(std::fs::read_to_string(target.dir.join("config.json")).unwrap(), "new");
        assert_eq!(listing(&root), ["model"], "the old folder is removed");

        let staged = target.stage().unwrap();
        std::fs::write(staged.path().join("config.json"), "newer").unwrap();
        drop(staged);
        assert_eq!(listing(&root), ["model"], "an unfinished folder is removed");

        let temporary = target.sibling(Leftover::Temporary);
        std::fs::create_dir(&temporary).unwrap();
        std::fs::write(temporary.join("config.json"), "renamed").unwrap();
        target.commit_by_renames(&temporary).unwrap();
        assert_eq!(std::fs::read_to_string(target.dir.join("config.json")).unwrap(), "renamed");
        assert!(target.leftovers().is_empty(), "the old folder is removed");

        // A save stopped after renaming the old folder aside: the next load puts it back.
        std::fs::rename(&target.dir, target.sibling(Leftover::Aside)).unwrap();
        std::fs::create_dir(target.sibling(Leftover::Temporary)).unwrap();
        restore_folder(&target.dir).unwrap();
        assert_eq!(std::fs::read_to_string(target.dir.join("config.json")).unwrap(), "renamed");
        // The next save removes what is left (the unfinished folder).
        assert_eq!(target.leftovers().len(), 1);
        drop(target.stage().unwrap());
        assert!(target.leftovers().is_empty());
        std::fs::remove_dir_all(root).unwrap();
    }

    #[test]
    fn folders_a_save_cannot_replace_are_refused_before_anything_is_written() {
        let working = std::env::current_dir().unwrap();
        for dir in [working.clone(), working.parent().unwrap().to_path_buf()] {
            let message = TargetFolder::resolve(&dir).expect_err("the working folder is refused").to_string();
            assert!(message.contains("it is the working folder or holds it"), "{message}");
        }
        let root = scratch("in-the-way");
        std::fs::write(root.join("model"), "a file").unwrap();
        let message = TargetFolder::resolve(&root.join("model")).expect_err("a file is refused").to_string();
        assert!(message.contains("a file is in the way"), "{message}");
        std::fs::remove_dir_all(root).unwrap();
    }
}
