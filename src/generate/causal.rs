//! What generation needs of a model: [`CausalLm`], its logits with and without a cache, and
//! the checks every model's cache makes. Every model of `nnx::models` implements it; nothing
//! here knows them.

use super::{GenerationConfig, Generator, KvCache};

/// A causal language model: logits for every position of a sequence, and incremental
/// decoding over a [`KvCache`] on the model's device, which
/// [`Generator`] drives.
pub trait CausalLm {
    /// The device the model computes on, where its cache lives.
    type Device: crate::Device;

    /// Logits for every position of one sequence, `[ids.len(), vocab]` in F32, computed without
    /// a cache.
    ///
    /// # Errors
    /// A token id past the vocabulary or a sequence the model cannot take.
    fn logits(&self, ids: &[u32]) -> crate::Result<crate::Tensor>;

    /// The longest sequence the model takes (its learned positions, or the context it was
    /// trained for).
    fn context_length(&self) -> usize;

    /// An empty cache for `batch` sequences of up to `capacity` positions each, on the
    /// model's device.
    ///
    /// # Errors
    /// [`Error::CacheFull`](crate::Error::CacheFull) for a capacity past
    /// [`context_length`](CausalLm::context_length), or the device's error when it cannot
    /// hold the cache.
    fn new_cache(&self, batch: usize, capacity: usize) -> crate::Result<KvCache<Self::Device>>;

    /// Runs `ids`, one row of equal length per sequence of the cache (row-major, after each
    /// sequence's padding when the cache is empty), after the positions the cache holds;
    /// appends their keys and values to it and returns the logits of each row's last token,
    /// `[batch, vocab]` in F32 on the host.
    ///
    /// # Errors
    /// A token id past the vocabulary, `ids` that are not whole rows,
    /// [`Error::CacheFull`](crate::Error::CacheFull) when they do not fit the
    /// cache, or the device's errors.
    fn forward_cached(&self, ids: &[u32], cache: &mut KvCache<Self::Device>) -> crate::Result<crate::Tensor>;

    /// Greedy decoding: `ids` followed by `steps` tokens, each the most likely after the ones
    /// before (the prompt is computed once, then one token per step, through the cache).
    ///
    /// # Errors
    /// As [`CausalLm::forward_cached`].
    fn generate(&self, ids: &[u32], steps: usize) -> crate::Result<Vec<u32>>
    where
        Self: Sized,
    {
        let config = GenerationConfig { max_new_tokens: steps, ..Default::default() };
        let mut all = ids.to_vec();
        if steps > 0 {
            all.extend(Generator::new(self, &[ids], config)?.run()?.sequences.remove(0));
        }
        Ok(all)
    }
}

/// The number of sequences in `ids` rows for a cache of `batch`, checked: `ids` must be whole,
/// non-empty rows.
pub(crate) fn cached_rows(ids: &[u32], batch: usize) -> crate::Result<usize> {
    if batch == 0 || ids.is_empty() || !ids.len().is_multiple_of(batch) {
        return Err(crate::Error::LengthMismatch {
            op: "forward_cached",
            what: "token ids (one non-empty row per sequence of the cache)",
            expected: batch.max(1) * ids.len().div_ceil(batch.max(1)).max(1),
            found: ids.len(),
            shape: vec![batch],
        });
    }
    Ok(ids.len() / batch)
}

/// Checks a cache capacity against a model's context length.
pub(crate) fn check_capacity(capacity: usize, context: usize) -> crate::Result<()> {
    if capacity > context {
        return Err(crate::Error::CacheFull { capacity: context, needed: capacity });
    }
    Ok(())
}
