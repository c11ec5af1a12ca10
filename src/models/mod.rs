//! Published model architectures written with the derive's import attributes, so that their
//! Hugging Face checkpoints import as they are: [`bert`], [`gpt2`] and [`llama`].

pub mod bert;
pub mod gpt2;
pub mod llama;
#[cfg(feature = "text")]
pub mod sentence;

use std::path::Path;

/// Reads and parses a `config.json`, then runs the configuration's `check` on it, so that no
/// model is ever built from fields that cannot make one.
pub(crate) fn read_config<T: serde::de::DeserializeOwned>(
    path: &Path,
    check: impl FnOnce(&T, &Path) -> crate::Result<()>,
) -> crate::Result<T> {
    let text = std::fs::read_to_string(path).map_err(|source| crate::Error::Io {
        action: "read",
        path: path.to_path_buf(),
        source,
    })?;
    let config = serde_json::from_str(&text).map_err(|error| crate::Error::Config {
        path: path.to_path_buf(),
        problem: crate::ConfigProblem::NotModelConfig { message: error.to_string() },
    })?;
    check(&config, path)?;
    Ok(config)
}

/// The most layers a configuration may ask for. The largest published models have a few
/// hundred; a value far past that is a damaged file, and building it would exhaust memory.
pub const MAX_LAYERS: usize = 1 << 12;

/// The most elements the weights of one model may hold: their bytes in f64 must be
/// addressable.
const MAX_ELEMENTS: u128 = (isize::MAX as u128) / 8;

/// Checks of the fields of one `config.json`; each failure is [`crate::Error::ConfigField`]
/// naming the file and the field.
pub(crate) struct Checks<'a> {
    path: &'a Path,
}

impl<'a> Checks<'a> {
    pub(crate) fn new(path: &'a Path) -> Checks<'a> {
        Checks { path }
    }

    fn fail(&self, field: &str, found: usize, rule: crate::ConfigRule) -> crate::Error {
        crate::Error::ConfigField { path: self.path.to_path_buf(), field: field.to_string(), found: found as u64, rule }
    }

    /// `value` is at least 1.
    pub(crate) fn positive(&self, field: &str, value: usize) -> crate::Result<()> {
        if value == 0 { Err(self.fail(field, value, crate::ConfigRule::Positive)) } else { Ok(()) }
    }

    /// `value` is at most `limit`.
    pub(crate) fn at_most(&self, field: &str, value: usize, limit: usize) -> crate::Result<()> {
        if value > limit {
            Err(self.fail(field, value, crate::ConfigRule::AtMost { limit: limit as u64 }))
        } else {
            Ok(())
        }
    }

    /// `value` (already checked positive) divides the field `whole`.
    pub(crate) fn divides(&self, field: &str, value: usize, whole: (&'static str, usize)) -> crate::Result<()> {
        if whole.1.is_multiple_of(value) {
            Ok(())
        } else {
            Err(self.fail(field, value, crate::ConfigRule::Divides { field: whole.0, value: whole.1 as u64 }))
        }
    }

    /// `value` is even, for `reason`.
    pub(crate) fn even(&self, field: &str, value: usize, reason: &'static str) -> crate::Result<()> {
        if value.is_multiple_of(2) { Ok(()) } else { Err(self.fail(field, value, crate::ConfigRule::Even { reason })) }
    }

    /// The weights hold `layers` times the products of `per_layer`, plus the products of
    /// `shared`, elements: that must be addressable. A failure names the largest of `fields`.
    pub(crate) fn addressable(
        &self,
        fields: &[(&'static str, usize)],
        layers: usize,
        per_layer: &[&[usize]],
        shared: &[&[usize]],
    ) -> crate::Result<()> {
        let sum = |terms: &[&[usize]]| -> u128 {
            terms
                .iter()
                .map(|factors| factors.iter().fold(1u128, |product, &factor| product.saturating_mul(factor as u128)))
                .fold(0u128, u128::saturating_add)
        };
        let total = sum(per_layer).saturating_mul(layers as u128).saturating_add(sum(shared));
        if total <= MAX_ELEMENTS {
            return Ok(());
        }
        let (field, value) = fields.iter().copied().max_by_key(|&(_, value)| value).unwrap_or(("", 0));
        Err(self.fail(field, value, crate::ConfigRule::Addressable))
    }
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
