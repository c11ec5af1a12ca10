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
