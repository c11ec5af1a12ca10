//! Published model architectures written with the derive's import attributes, so that their
//! Hugging Face checkpoints import as they are: [`gpt2`] and [`llama`].

pub mod gpt2;
pub mod llama;

use std::path::Path;

/// Reads and parses a `config.json`.
pub(crate) fn read_config<T: serde::de::DeserializeOwned>(path: &Path) -> crate::Result<T> {
    let text = std::fs::read_to_string(path).map_err(|source| crate::Error::Io {
        action: "read",
        path: path.to_path_buf(),
        source,
    })?;
    serde_json::from_str(&text).map_err(|error| crate::Error::Config {
        path: path.to_path_buf(),
        reason: format!("{error}: check that it is the model's own `config.json`"),
    })
}
