//! Configuration files (`config.json`, `sentence_bert_config.json`, `generation_config.json`)
//! read with a size limit: every one of them is a few kilobytes, so a file far larger is damaged
//! or hostile, and is refused before its text is read, let alone parsed.

use std::io::Read;
use std::path::Path;

use crate::error::{ConfigProblem, Error, Result};

/// The largest configuration file read: a thousand times the largest published one.
pub const MAX_CONFIG_BYTES: u64 = 16 << 20;

/// The text of the configuration file at `path`, at most [`MAX_CONFIG_BYTES`].
///
/// # Errors
/// [`Error::Io`] (a missing file among them: its kind is `NotFound`), or [`Error::Config`] with
/// [`ConfigProblem::TooLarge`].
pub fn read_text(path: &Path) -> Result<String> {
    let io = |source| Error::Io { action: "read", path: path.to_path_buf(), source };
    let too_large = |bytes| Error::Config {
        path: path.to_path_buf(),
        problem: ConfigProblem::TooLarge { bytes, limit: MAX_CONFIG_BYTES },
    };
    let file = std::fs::File::open(path).map_err(io)?;
    let len = file.metadata().map_err(io)?.len();
    if len > MAX_CONFIG_BYTES {
        return Err(too_large(len));
    }
    // The file may grow after its size was read: the read stops past the limit whatever it is.
    let mut text = String::new();
    file.take(MAX_CONFIG_BYTES + 1).read_to_string(&mut text).map_err(io)?;
    if text.len() as u64 > MAX_CONFIG_BYTES {
        return Err(too_large(text.len() as u64));
    }
    Ok(text)
}
