//! A SafeTensors file mapped into memory, with its validated header. Tensors built from it
//! point into the mapping and keep it alive.

use std::borrow::Cow;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use nnx_core::{ByteSource, DType, Tensor};

use super::header::{self, Header, HeaderEntry, HeaderProblem};
use crate::archive::EntryLocation;
use crate::error::{Error, Result};
use crate::format::sniff;
use crate::mapping::Mapping;
use crate::source::{DataError, Source};

/// A mapped file and its header.
pub(crate) struct MappedFile {
    pub(crate) path: PathBuf,
    mapping: Arc<Mapping>,
    pub(crate) header: Header,
    /// Copies of entries whose offset is not aligned for their dtype, made on first use.
    copies: Vec<OnceLock<Tensor>>,
}

impl MappedFile {
    /// Maps `path` and validates its header; nothing past the header is read.
    pub(crate) fn open(path: &Path) -> Result<Arc<MappedFile>> {
        let file = File::open(path).map_err(Error::io("open", path))?;
        let len = file.metadata().map_err(Error::io("read the size of", path))?.len();
        if len == 0 {
            return Err(Error::Header { path: path.to_path_buf(), problem: HeaderProblem::Empty });
        }
        let mapping = Arc::new(Mapping::new(&file, path)?);
        let header = match header::parse(mapping.bytes()) {
            Ok(header) => header,
            Err(problem) => {
                return Err(match sniff(mapping.bytes()) {
                    Some(kind) => Error::NotSafeTensors { path: path.to_path_buf(), kind },
                    None => Error::Header { path: path.to_path_buf(), problem },
                });
            }
        };
        let copies = header.entries.iter().map(|_| OnceLock::new()).collect();
        Ok(Arc::new(MappedFile { path: path.to_path_buf(), mapping, header, copies }))
    }

    fn entry(&self, at: usize) -> &HeaderEntry {
        &self.header.entries[at]
    }

    /// The entry's bytes in the mapping.
    fn entry_bytes(&self, at: usize) -> &[u8] {
        let entry = self.entry(at);
        let start = self.header.data_start + entry.begin;
        &self.mapping.bytes()[start..start + (entry.end - entry.begin)]
    }
}

impl Source for MappedFile {
    fn spec(&self, at: usize) -> (DType, &[usize]) {
        let entry = self.entry(at);
        (entry.dtype, &entry.shape)
    }

    /// The entry as a tensor over the mapped pages, or, when its offset is not aligned for
    /// its dtype, an owned copy made once.
    fn tensor(&self, at: usize) -> Result<Tensor> {
        let entry = self.entry(at);
        let start = self.header.data_start + entry.begin;
        let len = entry.end - entry.begin;
        let source: Arc<dyn ByteSource> = self.mapping.clone();
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

    fn path(&self) -> Option<&Path> {
        Some(&self.path)
    }

    fn location(&self, at: usize) -> Option<EntryLocation> {
        let entry = self.entry(at);
        let file_offset = self.header.data_start + entry.begin;
        Some(EntryLocation { path: self.path.clone(), data_offsets: (entry.begin, entry.end), file_offset })
    }

    fn release(&self, at: usize) {
        if let Some(location) = self.location(at) {
            self.mapping.release(location.file_offset, self.stored_bytes(at));
        }
    }

    fn stored_bytes(&self, at: usize) -> usize {
        self.entry_bytes(at).len()
    }

    fn data(&self, at: usize) -> std::result::Result<Cow<'_, [u8]>, DataError> {
        Ok(Cow::Borrowed(self.entry_bytes(at)))
    }
}
