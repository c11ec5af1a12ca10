//! A SafeTensors file mapped into memory, with its validated header. Tensors built from it
//! point into the mapping and keep it alive.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use memmap2::Mmap;
use nnx_core::{ByteSource, Tensor};

use crate::error::{Error, Result};
use crate::header::{self, Header, HeaderEntry, HeaderProblem};
use crate::sniff::sniff;

/// A mapped file and its header.
pub(crate) struct MappedFile {
    pub(crate) path: PathBuf,
    map: Mmap,
    pub(crate) header: Header,
    /// Copies of entries whose offset is not aligned for their dtype, made on first use.
    copies: Vec<OnceLock<Tensor>>,
}

// SAFETY: `map` is a read-only mapping created once in `open` and never remapped, so `bytes`
// returns the same address and length for the file's whole life. nnx never writes a file in
// place (saves write a new file and rename it over the target); a change made by another
// program while the file is mapped is outside what `Archive::open` supports, and even then
// BOOL bytes are checked on every typed read.
unsafe impl ByteSource for MappedFile {
    fn bytes(&self) -> &[u8] {
        &self.map
    }
}

impl MappedFile {
    /// Maps `path` and validates its header; nothing past the header is read.
    pub(crate) fn open(path: &Path) -> Result<Arc<MappedFile>> {
        let file = File::open(path).map_err(Error::io("open", path))?;
        let len = file.metadata().map_err(Error::io("read the size of", path))?.len();
        if len == 0 {
            return Err(Error::Header { path: path.to_path_buf(), problem: HeaderProblem::Empty });
        }
        // SAFETY: the mapping is read-only and nnx never writes a file in place (saves write a
        // new file and rename it), so the bytes only change if another program truncates or
        // rewrites the file while it is mapped, which `Archive::open` documents as unsupported.
        let map = unsafe { Mmap::map(&file) }.map_err(Error::io("map", path))?;
        let header = match header::parse(&map) {
            Ok(header) => header,
            Err(problem) => {
                return Err(match sniff(&map) {
                    Some(kind) => Error::NotSafeTensors { path: path.to_path_buf(), kind },
                    None => Error::Header { path: path.to_path_buf(), problem },
                });
            }
        };
        let copies = header.entries.iter().map(|_| OnceLock::new()).collect();
        Ok(Arc::new(MappedFile { path: path.to_path_buf(), map, header, copies }))
    }

    pub(crate) fn entry(&self, at: usize) -> &HeaderEntry {
        &self.header.entries[at]
    }

    /// The entry's bytes in the mapping.
    pub(crate) fn entry_bytes(&self, at: usize) -> &[u8] {
        let entry = self.entry(at);
        let start = self.header.data_start + entry.begin;
        &self.bytes()[start..start + (entry.end - entry.begin)]
    }

    /// The entry as a tensor over the mapped pages, or, when its offset is not aligned for
    /// its dtype, an owned copy made once.
    pub(crate) fn tensor(self: &Arc<Self>, at: usize) -> Result<Tensor> {
        let entry = self.entry(at);
        let start = self.header.data_start + entry.begin;
        let len = entry.end - entry.begin;
        let source: Arc<dyn ByteSource> = self.clone();
        let data_error =
            |source| Error::Data { path: self.path.clone(), name: entry.name.clone(), source: Box::new(source) };
        match Tensor::from_shared(source, start, len, entry.dtype, &entry.shape) {
            Ok(tensor) => Ok(tensor),
            Err(nnx_core::Error::Misaligned { .. }) => {
                if let Some(copy) = self.copies[at].get() {
                    return Ok(copy.clone());
                }
                let copy = Tensor::from_bytes(entry.dtype, &entry.shape, self.entry_bytes(at)).map_err(data_error)?;
                Ok(self.copies[at].get_or_init(|| copy).clone())
            }
            Err(error) => Err(data_error(error)),
        }
    }
}
