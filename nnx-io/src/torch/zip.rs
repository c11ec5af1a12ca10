//! The zip container `torch.save` writes since PyTorch 1.6: `TOP/data.pkl` (the pickle),
//! `TOP/data/KEY` (one record per storage, stored uncompressed) and `TOP/byteorder`, under a
//! top folder of any name. Only the central directory and local headers are read; record bytes
//! are left in the mapping, and nothing is ever decompressed.

use std::collections::HashMap;
use std::io::Cursor;

use zip::{CompressionMethod, ZipArchive};

use crate::error::{TorchProblem, ZipRecordProblem};

/// Where a record's bytes lie in the file.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Record {
    pub(crate) start: usize,
    pub(crate) len: usize,
}

/// The records of a checkpoint zip, checked.
pub(crate) struct ZipRecords {
    /// The top folder, `TOP` in `TOP/data.pkl`.
    pub(crate) folder: String,
    records: HashMap<String, Record>,
}

impl ZipRecords {
    /// Reads the central directory of `bytes` and checks every record: a UTF-8 name under one
    /// top folder, stored uncompressed, its stored and claimed sizes equal, its bytes inside the
    /// file.
    pub(crate) fn read(bytes: &[u8]) -> Result<ZipRecords, TorchProblem> {
        let mut archive =
            ZipArchive::new(Cursor::new(bytes)).map_err(|error| TorchProblem::Zip { message: error.to_string() })?;
        let mut records = HashMap::with_capacity(archive.len());
        let mut folder: Option<String> = None;
        for at in 0..archive.len() {
            let file = archive.by_index_raw(at).map_err(|error| TorchProblem::Zip { message: error.to_string() })?;
            let name = match file.name() {
                Ok(name) => name.into_owned(),
                Err(_) => {
                    return Err(TorchProblem::ZipRecord { record: format!("#{at}"), problem: ZipRecordProblem::Name });
                }
            };
            let refuse = |problem| TorchProblem::ZipRecord { record: name.clone(), problem };
            if file.compression() != CompressionMethod::Stored {
                // The method as the central directory writes it (2 bytes at offset 10).
                let at = usize::try_from(file.central_header_start()).unwrap_or(usize::MAX);
                let method = bytes.get(at + 10..at + 12).map_or(u16::MAX, |raw| u16::from_le_bytes([raw[0], raw[1]]));
                return Err(refuse(ZipRecordProblem::Compressed { method }));
            }
            let (compressed, uncompressed) = (file.compressed_size(), file.size());
            if compressed != uncompressed {
                return Err(refuse(ZipRecordProblem::Sizes { compressed, uncompressed }));
            }
            let start = file.data_start().unwrap_or(u64::MAX);
            let file_len = bytes.len() as u64;
            if start.checked_add(compressed).is_none_or(|end| end > file_len) {
                return Err(refuse(ZipRecordProblem::PastEnd { start, len: compressed, file: file_len }));
            }
            let top = name.split('/').next().unwrap_or_default().to_string();
            match &folder {
                None => folder = Some(top),
                Some(first) if *first != top => {
                    return Err(TorchProblem::TopFolders { first: first.clone(), second: top });
                }
                Some(_) => {}
            }
            // In range of `bytes` (checked just now), so both fit `usize`.
            records.insert(name, Record { start: start as usize, len: compressed as usize });
        }
        let folder = folder.ok_or(TorchProblem::NoDataPickle)?;
        let zip = ZipRecords { folder, records };
        if zip.get("data.pkl").is_none() {
            return Err(TorchProblem::NoDataPickle);
        }
        Ok(zip)
    }

    /// The record `TOP/name`.
    pub(crate) fn get(&self, name: &str) -> Option<Record> {
        self.records.get(&format!("{}/{name}", self.folder)).copied()
    }

    /// The name of the record `TOP/name`, for messages.
    pub(crate) fn name(&self, name: &str) -> String {
        format!("{}/{name}", self.folder)
    }
}
