//! The one read-only memory map that every format's tensors point into: the safety argument
//! for mapping a file is made here once.

use std::fs::File;
use std::path::Path;

use memmap2::Mmap;
use nnx_core::ByteSource;

use crate::error::{Error, Result};

/// A read-only mapping of a whole file. Tensors over it hold it through an `Arc`, so the pages
/// stay mapped while any of them is alive.
pub(crate) struct Mapping {
    map: Mmap,
}

impl Mapping {
    /// Maps `file`, opened from `path` (named in errors).
    ///
    /// # Errors
    /// [`Error::Io`] when the file cannot be mapped (an empty file cannot).
    pub(crate) fn new(file: &File, path: &Path) -> Result<Mapping> {
        // SAFETY: the mapping is read-only and nnx never writes a file in place (saves write a
        // new file and rename it), so the bytes only change if another program truncates or
        // rewrites the file while it is mapped, which `Archive::open` documents as unsupported.
        let map = unsafe { Mmap::map(file) }.map_err(Error::io("map", path))?;
        Ok(Mapping { map })
    }

    /// Tells the kernel how the pages will be read. Only a hint: a refusal changes nothing.
    #[cfg(unix)]
    pub(crate) fn advise(&self, advice: memmap2::Advice) {
        let _ = self.map.advise(advice);
    }

    /// Lets the kernel drop the pages of bytes `[start, start + len)` from the process's
    /// resident memory (they are read from the file again if used later): a conversion that
    /// is done with a tensor keeps its resident memory at what it still reads.
    #[cfg(unix)]
    pub(crate) fn release(&self, start: usize, len: usize) {
        if len == 0 || start.checked_add(len).is_none_or(|end| end > self.map.len()) {
            return;
        }
        // SAFETY: the range lies inside the mapping (checked above; memmap2 widens it to whole
        // pages, still inside the mapping). The mapping is read-only and backed by the file,
        // never written by nnx (see `new`), so dropping its pages loses nothing: the next read
        // of any byte faults the page in again from the file with the same contents, and every
        // reference into the mapping stays valid. The result is ignored: a refusal keeps the
        // pages, which changes nothing either.
        let _ = unsafe { self.map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, start, len) };
    }

    /// Elsewhere nothing is dropped.
    #[cfg(not(unix))]
    pub(crate) fn release(&self, _start: usize, _len: usize) {}
}

// SAFETY: `map` is a read-only mapping created once in `new` and never remapped, so `bytes`
// returns the same address and length for the value's whole life. A change made by another
// program while the file is mapped is outside what `Archive::open` supports, and even then BOOL
// bytes are checked on every typed read.
unsafe impl ByteSource for Mapping {
    fn bytes(&self) -> &[u8] {
        &self.map
    }
}
