//! Published model architectures written with the derive's import attributes, so that their
//! Hugging Face checkpoints import as they are: [`bert`], [`gpt2`] and [`llama`].

pub mod bert;
pub mod gpt2;
pub mod llama;
#[cfg(feature = "text")]
pub mod sentence;

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

/// A causal language model: logits for every position, and greedy decoding on top.
pub trait CausalLm {
    /// Logits for every position of one sequence, `[ids.len(), vocab]` in F32.
    ///
    /// # Errors
    /// A token id past the vocabulary or a sequence the model cannot take.
    fn logits(&self, ids: &[u32]) -> crate::Result<crate::Tensor>;

    /// Greedy decoding: appends `steps` tokens, each the argmax of the last position's logits
    /// (the whole sequence is recomputed each step; the models here are small).
    ///
    /// # Errors
    /// As [`CausalLm::logits`].
    fn generate(&self, ids: &[u32], steps: usize) -> crate::Result<Vec<u32>> {
        let mut ids = ids.to_vec();
        for _ in 0..steps {
            let logits = self.logits(&ids)?;
            let next = logits.argmax_last()?.last().copied().unwrap_or(0);
            ids.push(next as u32);
        }
        Ok(ids)
    }
}
