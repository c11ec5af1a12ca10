//! [`KvCache`]: the keys and values of the positions a causal model has seen, preallocated on
//! the model's device, so that each decoding step computes one new position per sequence.

use crate::{Compute, Device, Error, Host, Tensor};

/// The attention keys and values of every layer for a batch of sequences, in preallocated f32
/// tensors `[batch, kv_heads, capacity, head_dim]` on the model's device (host memory or GPU
/// buffers), filled from the front.
///
/// The sequences of a batch are left-padded to a common length: sequence `b` starts after
/// [`padding`](KvCache::padding)`[b]` slots that no query attends to, and its positions
/// (rotary angles, learned position rows) count from its first real token. All sequences then
/// share one fill level, [`len`](KvCache::len), so that a step writes one block of rows.
///
/// A model fills it through [`CausalLm::forward_cached`](super::CausalLm::forward_cached):
/// per layer [`update`](KvCache::update), then one [`advance`](KvCache::advance).
///
/// A recurrent layer (a linear-attention layer such as Qwen3.5's Gated DeltaNet) keeps a
/// [`RecurrentState`] instead of keys and values ([`KvCache::hybrid`]): the same cache then
/// serves a hybrid model's attention and recurrent layers, and generation treats it as any other.
#[derive(Clone, Debug)]
pub struct KvCache<D: Device = Host> {
    keys: Vec<Tensor<D>>,
    values: Vec<Tensor<D>>,
    recurrent: Vec<Option<RecurrentState>>,
    capacity: usize,
    len: usize,
    padding: Vec<usize>,
}

/// What one layer of a model keeps between steps ([`KvCache::hybrid`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerMemory {
    /// Keys and values of every position (an attention layer), as wide as the cache's.
    KeysValues,
    /// Keys and values of every position, with heads of its own (Gemma 4's global layers).
    Attention {
        /// Key/value heads.
        kv_heads: usize,
        /// Width of one head.
        head_dim: usize,
    },
    /// Nothing of its own: the layer reads another layer's keys and values (Gemma 4's
    /// shared layers).
    Shared,
    /// A state of fixed size per sequence (a recurrent layer): `conv` values of its
    /// convolution's last inputs and `state` values of its state matrices.
    Recurrent {
        /// The convolution's remembered inputs, per sequence.
        conv: usize,
        /// The state matrices' values, per sequence.
        state: usize,
    },
}

/// The state a recurrent layer carries from one step to the next, per sequence, in f32 on the
/// host (where the recurrence is computed): zero before the first token.
#[derive(Clone, Debug, PartialEq)]
pub struct RecurrentState {
    /// The convolution's last inputs, `batch` blocks of the layer's `conv` values.
    pub conv: Vec<f32>,
    /// The state matrices, `batch` blocks of the layer's `state` values.
    pub state: Vec<f32>,
}

impl<D: Device> KvCache<D> {
    /// Sequences in the batch.
    pub fn batch(&self) -> usize {
        self.padding.len()
    }

    /// Positions each sequence can hold, padding included.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Positions filled in every sequence, padding included.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing has been cached yet.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The padding slots in front of each sequence.
    pub fn padding(&self) -> &[usize] {
        &self.padding
    }

    /// Sets the padding in front of each sequence, before anything is cached: the caller then
    /// passes that many filler tokens (any valid id) in front of each sequence's first token.
    ///
    /// # Errors
    /// [`Error::LengthMismatch`] unless `padding` has one entry per sequence;
    /// [`Error::BadShape`] once positions are cached, or when a sequence would be
    /// padding only.
    pub fn set_padding(&mut self, padding: &[usize]) -> crate::Result<()> {
        const OP: &str = "set_padding";
        if padding.len() != self.batch() {
            return Err(Error::LengthMismatch {
                op: OP,
                what: "padding entries (one per sequence)",
                expected: self.batch(),
                found: padding.len(),
                shape: vec![self.batch(), self.capacity],
            });
        }
        if self.len > 0 || padding.iter().any(|&slots| slots >= self.capacity) {
            return Err(Error::BadShape {
                op: OP,
                expected: "an empty cache and less padding than its capacity",
                shape: vec![self.batch(), self.len, self.capacity],
            });
        }
        self.padding = padding.to_vec();
        Ok(())
    }

    /// The position of each of `seq` new tokens, `batch * seq` row-major: counted from each
    /// sequence's first real token (0 for padding slots).
    pub fn positions(&self, seq: usize) -> Vec<usize> {
        let mut positions = Vec::with_capacity(self.batch() * seq);
        for &padding in &self.padding {
            positions.extend((self.len..self.len + seq).map(|slot| slot.saturating_sub(padding)));
        }
        positions
    }

    /// The keys the queries of `seq` new tokens may attend to, `batch * (len + seq)` row-major
    /// (`false` for padding), or `None` when no sequence is padded.
    pub fn key_mask(&self, seq: usize) -> Option<Vec<bool>> {
        if self.padding.iter().all(|&slots| slots == 0) {
            return None;
        }
        let keys = self.len + seq;
        Some(self.padding.iter().flat_map(|&padding| (0..keys).map(move |key| key >= padding)).collect())
    }

    /// Marks `seq` more positions as filled, once every layer has [`update`](KvCache::update)d.
    ///
    /// # Errors
    /// [`Error::CacheFull`] when that passes the capacity.
    pub fn advance(&mut self, seq: usize) -> crate::Result<()> {
        self.check_room(seq)?;
        self.len += seq;
        Ok(())
    }

    /// Empties the cache (keeping its memory) for a new batch without padding.
    pub fn clear(&mut self) {
        self.len = 0;
        self.padding.fill(0);
        for state in self.recurrent.iter_mut().flatten() {
            state.conv.fill(0.0);
            state.state.fill(0.0);
        }
    }

    /// The state of recurrent layer `layer`, `None` for an attention layer (or past the
    /// layers).
    pub fn recurrent_mut(&mut self, layer: usize) -> Option<&mut RecurrentState> {
        self.recurrent.get_mut(layer)?.as_mut()
    }

    fn check_room(&self, seq: usize) -> crate::Result<()> {
        let needed = self.len.saturating_add(seq);
        if needed > self.capacity {
            return Err(Error::CacheFull { capacity: self.capacity, needed });
        }
        Ok(())
    }
}

impl<D: Device> KvCache<D>
where
    Tensor<D>: Compute,
{
    /// An empty cache for `layers` layers of `kv_heads` key/value heads of `head_dim`, holding
    /// `batch` sequences of `capacity` positions, allocated (zeroed) on the device of `like`.
    ///
    /// # Errors
    /// [`Error::TooLarge`] when the tensors cannot be addressed, [`Error::Allocation`] when
    /// the system refuses their memory (the sizes come from a model's files and the caller's
    /// capacity, so that a cache too large to hold is an error, not an abort), or the device's
    /// error when it cannot hold them.
    pub fn new(
        like: &Tensor<D>,
        layers: usize,
        batch: usize,
        kv_heads: usize,
        head_dim: usize,
        capacity: usize,
    ) -> crate::Result<KvCache<D>> {
        let memory = vec![LayerMemory::KeysValues; layers];
        KvCache::hybrid(like, &memory, batch, kv_heads, head_dim, capacity)
    }

    /// [`KvCache::new`] for a model whose layers keep what `layers` says, one entry each: the
    /// attention layers' keys and values as there, the recurrent layers' states zeroed on the
    /// host (their keys and values hold no position).
    ///
    /// # Errors
    /// As [`KvCache::new`], counting the states' memory too.
    pub fn hybrid(
        like: &Tensor<D>,
        layers: &[LayerMemory],
        batch: usize,
        kv_heads: usize,
        head_dim: usize,
        capacity: usize,
    ) -> crate::Result<KvCache<D>> {
        let shape = [batch, kv_heads, capacity, head_dim];
        let too_large = || Error::TooLarge { dtype: crate::DType::F32, shape: shape.to_vec() };
        // Values per layer: keys and values of every position, or a recurrent state.
        let values = layers.iter().try_fold(0usize, |total, memory| {
            let layer = match *memory {
                LayerMemory::KeysValues => shape.iter().try_fold(2usize, |values, &size| values.checked_mul(size))?,
                LayerMemory::Attention { kv_heads, head_dim } => [batch, kv_heads, capacity, head_dim]
                    .iter()
                    .try_fold(2usize, |values, &size| values.checked_mul(size))?,
                LayerMemory::Shared => 0,
                LayerMemory::Recurrent { conv, state } => conv.checked_add(state)?.checked_mul(batch)?,
            };
            total.checked_add(layer)
        });
        let bytes = values
            .and_then(|values| values.checked_mul(std::mem::size_of::<f32>()))
            .filter(|&bytes| bytes <= isize::MAX as usize)
            .ok_or_else(too_large)?;
        // Asked of the system first, so that a refusal is an error here rather than an abort in
        // the zeroed allocation below; nothing is touched, so the probe costs no memory.
        let mut probe: Vec<u8> = Vec::new();
        probe.try_reserve_exact(bytes).map_err(|_| Error::Allocation { op: "hold the key/value cache", bytes })?;
        drop(probe);
        let mut keys = Vec::new();
        let mut values = Vec::new();
        let mut states = Vec::new();
        keys.try_reserve_exact(layers.len()).map_err(|_| too_large())?;
        values.try_reserve_exact(layers.len()).map_err(|_| too_large())?;
        states.try_reserve_exact(layers.len()).map_err(|_| too_large())?;
        for memory in layers {
            let (state, shape) = match *memory {
                LayerMemory::KeysValues => (None, shape),
                LayerMemory::Attention { kv_heads, head_dim } => (None, [batch, kv_heads, capacity, head_dim]),
                LayerMemory::Shared => (None, [batch, kv_heads, 0, head_dim]),
                LayerMemory::Recurrent { conv, state } => (
                    Some(RecurrentState { conv: vec![0.0; conv * batch], state: vec![0.0; state * batch] }),
                    [batch, kv_heads, 0, head_dim],
                ),
            };
            keys.push(like.new_zeros(&shape)?);
            values.push(like.new_zeros(&shape)?);
            states.push(state);
        }
        Ok(KvCache { keys, values, recurrent: states, capacity, len: 0, padding: vec![0; batch] })
    }

    /// Writes the keys and values of new positions of `layer` (`[batch, kv_heads, seq,
    /// head_dim]`, any float dtype and layout) after the filled ones and returns views of all
    /// of them, cached and new (`[batch, kv_heads, len + seq, head_dim]`), for attention.
    ///
    /// The writes are in place as long as no view returned earlier is still alive: drop them
    /// before the next step, or that step copies the layer's tensors.
    ///
    /// # Errors
    /// [`Error::CacheFull`] when the new positions do not fit;
    /// [`Error::ShapeMismatch`] when the keys or values are not shaped as the cache;
    /// [`Error::AxisOutOfRange`] for a layer the cache does not have.
    pub fn update(
        &mut self,
        layer: usize,
        keys: &Tensor<D>,
        values: &Tensor<D>,
    ) -> crate::Result<(Tensor<D>, Tensor<D>)> {
        if layer >= self.keys.len() {
            return Err(Error::AxisOutOfRange { axis: layer, rank: self.keys.len(), shape: vec![self.keys.len()] });
        }
        let seq = keys.shape().get(2).copied().unwrap_or(0);
        self.check_room(seq)?;
        let filled = self.len + seq;
        self.keys[layer].write_slice(2, self.len, keys)?;
        self.values[layer].write_slice(2, self.len, values)?;
        Ok((self.keys[layer].narrow(2, 0, filled)?, self.values[layer].narrow(2, 0, filled)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DType;

    fn counting(shape: &[usize], first: f32) -> Tensor {
        let count = shape.iter().product::<usize>();
        Tensor::from_vec((0..count).map(|i| first + i as f32).collect(), shape).unwrap()
    }

    #[test]
    fn steps_fill_the_front_in_place() {
        let like = Tensor::zeros(DType::F32, &[1]);
        let mut cache = KvCache::new(&like, 2, 1, 2, 4, 5).unwrap();
        let address = |cache: &KvCache| cache.keys[1].as_slice::<f32>().unwrap().unwrap().as_ptr();
        let before = address(&cache);
        let (keys, values) = cache.update(1, &counting(&[1, 2, 3, 4], 0.0), &counting(&[1, 2, 3, 4], 100.0)).unwrap();
        assert_eq!(keys.shape(), [1, 2, 3, 4]);
        assert_eq!(keys.contiguous().to_vec::<f32>().unwrap(), counting(&[1, 2, 3, 4], 0.0).to_vec::<f32>().unwrap());
        assert_eq!(values.contiguous().to_vec::<f32>().unwrap()[0], 100.0);
        drop((keys, values));
        cache.advance(3).unwrap();
        assert_eq!((cache.len(), cache.positions(2)), (3, vec![3, 4]));
        let (keys, _) = cache.update(1, &counting(&[1, 2, 1, 4], 50.0), &counting(&[1, 2, 1, 4], 0.0)).unwrap();
        assert_eq!(keys.shape(), [1, 2, 4, 4]);
        assert_eq!(keys.narrow(2, 3, 1).unwrap().contiguous().to_vec::<f32>().unwrap()[..4], [50.0, 51.0, 52.0, 53.0]);
        drop(keys);
        assert_eq!(address(&cache), before, "the writes went into the preallocated tensor");
        cache.advance(1).unwrap();
        let error = cache.update(0, &counting(&[1, 2, 2, 4], 0.0), &counting(&[1, 2, 2, 4], 0.0)).unwrap_err();
        assert!(matches!(error, crate::Error::CacheFull { capacity: 5, needed: 6 }), "{error}");
    }

    #[test]
    fn padding_shifts_positions_and_hides_keys() {
        let like = Tensor::zeros(DType::F32, &[1]);
        let mut cache = KvCache::new(&like, 1, 2, 1, 2, 6).unwrap();
        assert_eq!(cache.key_mask(2), None);
        cache.set_padding(&[0, 2]).unwrap();
        assert_eq!(cache.positions(3), [0, 1, 2, 0, 0, 0]);
        assert_eq!(cache.key_mask(3).unwrap(), [true, true, true, false, false, true]);
        cache.advance(3).unwrap();
        assert_eq!(cache.positions(1), [3, 1]);
        assert!(cache.set_padding(&[0, 0]).is_err(), "padding is fixed once positions are cached");
        cache.clear();
        assert!(cache.set_padding(&[1]).is_err());
        assert!(cache.set_padding(&[6, 0]).is_err());
    }
}
