//! Configuration files (`config.json`, `sentence_bert_config.json`, `generation_config.json`)
//! read with a size limit: every one of them is a few kilobytes, so a file far larger is damaged
//! or hostile, and is refused before its text is read, let alone parsed.

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
    crate::fs::read_text_within(path, MAX_CONFIG_BYTES)?.map_err(|bytes| Error::Config {
        path: path.to_path_buf(),
        problem: ConfigProblem::TooLarge { bytes, limit: MAX_CONFIG_BYTES },
    })
}
