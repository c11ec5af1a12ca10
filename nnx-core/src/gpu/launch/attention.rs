//! Attention blocks on the GPU: embedding lookup (`embedding.wgsl`), rotary position
//! embedding (`rotary.wgsl`), scaled dot-product attention, as two tiled products around a
//! masked softmax (`attention.wgsl`), and the in-place writes of key/value caches
//! (`cache.wgsl`). `embedding` and `attention` are reached through [`Compute`](crate::Compute).

use super::matmul::{Destination, Operand, product};
use super::{
    Axes, axes, collapse, count, kernel_source, kind, launch, output, reach, same_device, step, storage, uniform,
    upload, word,
};
use crate::error::Result;
use crate::gpu::Gpu;
use crate::shape::{
    AttentionShape, check_attention, check_embedding, check_new_zeros, check_rotary, check_write_slice, rotary_tables,
};
use crate::{DType, Tensor};

const EMBEDDING: &str = kernel_source!("embedding.wgsl");
const ROTARY: &str = kernel_source!("rotary.wgsl");
const ATTENTION: &str = kernel_source!("reduce.wgsl", "attention.wgsl");
const CACHE: &str = kernel_source!("cache.wgsl");

uniform! {
    /// The parameters of `embedding.wgsl`.
    struct EmbeddingParams {
        count: u32,
        dim: u32,
        kind: u32,
        offset: u32,
        row_stride: u32,
        column_stride: u32,
        _pad0: u32,
        _pad1: u32,
    }
}

uniform! {
    /// The parameters of `rotary.wgsl`: a `[batch, heads, seq, head_dim]` input.
    struct RotaryParams {
        pairs: u32,
        half: u32,
        kind: u32,
        offset: u32,
        shape: [u32; 4],
        strides: [u32; 4],
    }
}

uniform! {
    /// The parameters of `attention.wgsl` (the masked softmax between the two products).
    struct AttentionParams {
        rows: u32,
        seq_q: u32,
        seq_k: u32,
        /// Queries per batch element (`heads * seq_q`), to find a row's batch element.
        per_batch: u32,
        /// As f32 bits.
        scale: u32,
        causal: u32,
        /// Query `i` sees keys `j <= i + shift` under the causal mask (`seq_k - seq_q`, as i32).
        shift: u32,
        has_mask: u32,
        /// Under the causal mask query `i` also sees only keys `j > i + shift - window` (at most
        /// `seq_k`, which hides nothing more).
        window: u32,
        _pad0: u32,
        _pad1: u32,
        _pad2: u32,
    }
}

uniform! {
    /// The parameters of `cache.wgsl`.
    struct CacheParams {
        count: u32,
        rank: u32,
        kind: u32,
        source_offset: u32,
        /// The destination's first written element.
        destination_offset: u32,
        padding_0: u32,
        padding_1: u32,
        padding_2: u32,
        shape: Axes,
        source_strides: Axes,
        destination_strides: Axes,
    }
}

impl Tensor<Gpu> {
    /// Rotary position embedding of `[batch, heads, seq, head_dim]` at `positions`, in Hugging
    /// Face Llama's `rotate_half` convention, turning by the same f32 angles as the host (see
    /// [`Tensor::rotary`]).
    ///
    /// # Errors
    /// [`Error::BadShape`](crate::Error::BadShape) unless the input has rank 4 and an even
    /// `head_dim`, [`Error::LengthMismatch`](crate::Error::LengthMismatch) when `positions`
    /// does not have `seq` entries, [`Error::NotFloat`](crate::Error::NotFloat),
    /// [`Error::Meta`](crate::Error::Meta), [`Error::Gpu`](crate::Error::Gpu).
    pub fn rotary(&self, positions: &[usize], theta: f32) -> Result<Tensor<Gpu>> {
        self.rotate(positions, theta, None, "rotary")
    }

    /// Rotary position embedding with frequency `i` divided by `factors[i]`, turning by the same
    /// f32 angles as the host (see [`Tensor::rotary_scaled`]).
    ///
    /// # Errors
    /// As [`rotary`](Self::rotary), and [`Error::LengthMismatch`](crate::Error::LengthMismatch)
    /// when `factors` does not have `head_dim / 2` entries.
    pub fn rotary_scaled(&self, positions: &[usize], theta: f32, factors: &[f32]) -> Result<Tensor<Gpu>> {
        self.rotate(positions, theta, Some(factors), "rotary_scaled")
    }

    /// Rotary embedding with optional frequency factors, for `op`: the angles come from the
    /// host's tables, so the shader is the same with or without factors.
    fn rotate(
        &self,
        positions: &[usize],
        theta: f32,
        factors: Option<&[f32]>,
        op: &'static str,
    ) -> Result<Tensor<Gpu>> {
        let head_dim = check_rotary(self, positions, factors, op)?;
        let gpu = self.device();
        let elements = count(gpu, op, self.shape())?;
        let out = output(gpu, elements)?;
        if elements > 0 {
            reach(gpu, op, self.offset(), self.shape(), self.strides())?;
            let (cos, sin) = rotary_tables(positions, head_dim, theta, factors);
            let table: Vec<u32> = cos.iter().chain(&sin).map(|value| value.to_bits()).collect();
            let table = upload(gpu, &table)?;
            let mut params = RotaryParams {
                pairs: word(gpu, op, elements / 2)?,
                half: word(gpu, op, head_dim / 2)?,
                kind: kind(self, op)?,
                offset: word(gpu, op, self.offset())?,
                ..RotaryParams::default()
            };
            // `check_rotary` made the input rank 4.
            for (axis, (&size, &stride)) in self.shape().iter().zip(self.strides()).enumerate() {
                params.shape[axis] = word(gpu, op, size)?;
                params.strides[axis] = step(gpu, op, size, stride)?;
            }
            let buffers = [storage(self, op)?.into(), (&table).into(), (&out).into()];
            launch(gpu, "rotary", ROTARY, &params, &buffers, (elements / 2) as u64)?;
        }
        Ok(gpu.tensor(Some(out), DType::F32, self.shape()))
    }
}

impl Tensor<Gpu> {
    /// A tensor of f32 zeros of `shape` on this tensor's GPU (see [`Tensor::new_zeros`]).
    ///
    /// # Errors
    /// [`Error::TooLarge`](crate::Error::TooLarge) when `shape` cannot be addressed,
    /// [`Error::Gpu`](crate::Error::Gpu) when the device cannot hold it.
    pub fn new_zeros(&self, shape: &[usize]) -> Result<Tensor<Gpu>> {
        check_new_zeros(shape)?;
        let gpu = self.device();
        Ok(gpu.tensor(Some(output(gpu, count(gpu, "new_zeros", shape)?)?), DType::F32, shape))
    }

    /// Writes `values` (any float dtype, read through their strides) into the indices
    /// `start..start + values.shape()[axis]` of `axis` of this f32 tensor, on the device and in
    /// place, unless another tensor shares the buffer: then this handle first becomes a copy, so
    /// that no clone or view sees the change (see [`Tensor::write_slice`]).
    ///
    /// # Errors
    /// As on the host; [`Error::Gpu`](crate::Error::Gpu) when the device fails or the operands
    /// live on different GPUs.
    pub fn write_slice(&mut self, axis: usize, start: usize, values: &Tensor<Gpu>) -> Result<()> {
        const OP: &str = "write_slice";
        check_write_slice(self, axis, start, values)?;
        same_device(OP, self, &[Some(values)])?;
        if values.is_empty() {
            return Ok(());
        }
        if self.storage_mut().is_none() {
            let mut copy = self.new_zeros(self.shape())?;
            copy.write_slice(0, 0, self)?;
            *self = copy;
        }
        let gpu = self.device();
        let elements = count(gpu, OP, values.shape())?;
        reach(gpu, OP, values.offset(), values.shape(), values.strides())?;
        reach(gpu, OP, self.offset(), self.shape(), self.strides())?;
        let first = self.offset() + start * self.strides()[axis];
        let (sizes, strides) = collapse(gpu, OP, values.shape(), &[values.strides(), self.strides()])?;
        let params = CacheParams {
            count: word(gpu, OP, elements)?,
            rank: sizes.len() as u32,
            kind: kind(values, OP)?,
            source_offset: word(gpu, OP, values.offset())?,
            destination_offset: word(gpu, OP, first)?,
            shape: axes(gpu, OP, &sizes, 1)?,
            source_strides: axes(gpu, OP, &strides[0], 0)?,
            destination_strides: axes(gpu, OP, &strides[1], 0)?,
            ..CacheParams::default()
        };
        let buffers = [storage(values, OP)?.into(), storage(self, OP)?.into()];
        launch(gpu, "write_slice", CACHE, &params, &buffers, elements as u64)
    }
}

/// The rows `ids` of a table too large for one binding, gathered with buffer copies into a
/// `[ids.len(), dim]` tensor of the table's dtype; `None` when its rows are not whole, 4-byte
/// aligned byte ranges (copies move whole words).
fn copy_rows(gpu: &Gpu, weight: &Tensor<Gpu>, table: &wgpu::Buffer, ids: &[u32]) -> Result<Option<Tensor<Gpu>>> {
    let size = weight.dtype().size_in_bytes().unwrap_or(4);
    let (dim, row_stride) = (weight.shape()[1], weight.strides()[0]);
    let row_bytes = dim * size;
    let aligned = |elements: usize| (elements * size).is_multiple_of(4);
    if (dim > 1 && weight.strides()[1] != 1) || !aligned(dim) || !aligned(row_stride) || !aligned(weight.offset()) {
        return Ok(None);
    }
    let rows = gpu.buffer((ids.len() * row_bytes) as u64, "embedding")?;
    let mut encoder = gpu.device().create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("embedding") });
    for (at, &id) in ids.iter().enumerate() {
        let start = (weight.offset() + id as usize * row_stride) * size;
        encoder.copy_buffer_to_buffer(table, start as u64, &rows, (at * row_bytes) as u64, row_bytes as u64);
    }
    gpu.queue().submit([encoder.finish()]);
    Ok(Some(gpu.tensor(Some(rows), weight.dtype(), &[ids.len(), dim])))
}

/// The rows `ids` of an embedding table `weight` `[vocab, dim]`, as `[ids.len(), dim]` f32
/// (see [`Tensor::embedding`]); [`Compute::embedding`](crate::Compute::embedding) on the GPU.
/// A free function rather than an inherent one, so that the host's `Tensor::embedding(..)`
/// stays unambiguous. A table larger than one storage binding is gathered with buffer copies.
///
/// # Errors
/// As on the host; [`Error::Gpu`](crate::Error::Gpu) when the device fails.
pub(crate) fn embedding(weight: &Tensor<Gpu>, ids: &[u32]) -> Result<Tensor<Gpu>> {
    const OP: &str = "embedding";
    let dim = check_embedding(weight, ids)?;
    let gpu = weight.device();
    let shape = [ids.len(), dim];
    let elements = count(gpu, OP, &shape)?;
    if elements == 0 {
        return Ok(gpu.tensor(Some(output(gpu, 0)?), DType::F32, &shape));
    }
    let table = storage(weight, OP)?;
    if table.size() > gpu.binding_limit()
        && let Some(rows) = copy_rows(gpu, weight, table, ids)?
    {
        return rows.to_dtype(DType::F32);
    }
    reach(gpu, OP, weight.offset(), weight.shape(), weight.strides())?;
    let out = output(gpu, elements)?;
    let ids = upload(gpu, ids)?;
    let params = EmbeddingParams {
        count: word(gpu, OP, elements)?,
        dim: word(gpu, OP, dim)?,
        kind: kind(weight, OP)?,
        offset: word(gpu, OP, weight.offset())?,
        row_stride: step(gpu, OP, weight.shape()[0], weight.strides()[0])?,
        column_stride: step(gpu, OP, dim, weight.strides()[1])?,
        ..EmbeddingParams::default()
    };
    launch(gpu, "embedding", EMBEDDING, &params, &[table.into(), (&ids).into(), (&out).into()], elements as u64)?;
    Ok(gpu.tensor(Some(out), DType::F32, &shape))
}

/// Scaled dot-product attention, `softmax(q kᵀ / sqrt(d) + mask) v`, with grouped-query heads,
/// the causal mask aligned at the end and a key padding mask (see [`Tensor::attention`]);
/// [`Compute::attention`](crate::Compute::attention) on the GPU, a free function so that the
/// host's `Tensor::attention(..)` stays unambiguous.
///
/// The scores `q kᵀ` of every head are one tiled product (the query heads that share a key head
/// are its rows), masked and normalised in place, then multiplied by `v`; permuted
/// `[batch, seq, heads, d]` views are read in place.
///
/// # Errors
/// As on the host; [`Error::Gpu`](crate::Error::Gpu) when the scores (`batch * heads * seq_q *
/// seq_k` f32) exceed a storage binding or the device fails.
pub(crate) fn attention(
    q: &Tensor<Gpu>,
    k: &Tensor<Gpu>,
    v: &Tensor<Gpu>,
    causal: bool,
    key_mask: Option<&[bool]>,
) -> Result<Tensor<Gpu>> {
    attend(q, k, v, causal, key_mask, usize::MAX, "attention")
}

/// Causal attention where a query also sees at most the `window` most recent keys (see
/// [`Tensor::attention_windowed`]); [`Compute::attention_windowed`](crate::Compute::attention_windowed)
/// on the GPU, a free function for the same reason as [`attention`].
///
/// # Errors
/// As [`attention`].
pub(crate) fn attention_windowed(
    q: &Tensor<Gpu>,
    k: &Tensor<Gpu>,
    v: &Tensor<Gpu>,
    key_mask: Option<&[bool]>,
    window: usize,
) -> Result<Tensor<Gpu>> {
    attend(q, k, v, true, key_mask, window, "attention_windowed")
}

/// Attention where, under the causal mask, query `i` sees only the keys after
/// `i + seq_k - seq_q - window` (`usize::MAX` for no window), for `op`.
fn attend(
    q: &Tensor<Gpu>,
    k: &Tensor<Gpu>,
    v: &Tensor<Gpu>,
    causal: bool,
    key_mask: Option<&[bool]>,
    window: usize,
    op: &'static str,
) -> Result<Tensor<Gpu>> {
    let AttentionShape { batch, heads, kv_heads, seq_q, seq_k, d, d_v } = check_attention(q, k, v, key_mask, op)?;
    same_device(op, q, &[Some(k), Some(v)])?;
    let gpu = q.device();
    let shape = [batch, heads, seq_q, d_v];
    let out = output(gpu, count(gpu, op, &shape)?)?;
    // Without keys every query gets zeros, which the fresh buffer holds.
    if count(gpu, op, &shape)? == 0 || seq_k == 0 {
        return Ok(gpu.tensor(Some(out), DType::F32, &shape));
    }
    for tensor in [q, k, v] {
        reach(gpu, op, tensor.offset(), tensor.shape(), tensor.strides())?;
    }
    let group = heads / kv_heads;
    let rows = count(gpu, op, &[batch, heads, seq_q])?;
    let scores = output(gpu, count(gpu, op, &[rows, seq_k])?)?;
    // Batch axes [batch, kv_heads, group]: query head `g * group + i` reads key head `g`.
    let batch_axes = [batch, kv_heads, group];
    let (qs, ks, vs) = (q.strides(), k.strides(), v.strides());
    let query = Operand {
        binding: storage(q, op)?.into(),
        kind: kind(q, op)?,
        offset: q.offset(),
        batch: vec![qs[0], qs[1] * group, qs[1]],
        row: qs[2],
        column: qs[3],
    };
    // `kᵀ`: rows over the features, columns over the keys.
    let keys = Operand {
        binding: storage(k, op)?.into(),
        kind: kind(k, op)?,
        offset: k.offset(),
        batch: vec![ks[0], ks[1], 0],
        row: ks[3],
        column: ks[2],
    };
    let destination = Destination { buffer: &scores, offset: 0, row: seq_k };
    product(gpu, op, query, keys, None, &batch_axes, [seq_q, d, seq_k], destination)?;

    let words: Vec<u32> = key_mask.map_or_else(|| vec![1], |mask| mask.iter().map(|&keep| u32::from(keep)).collect());
    let mask = upload(gpu, &words)?;
    // Query `i` sees keys `j <= i + shift`; both lengths fit 31 bits (checked as words).
    let shift = word(gpu, op, seq_k)? as i32 - word(gpu, op, seq_q)? as i32;
    let params = AttentionParams {
        rows: word(gpu, op, rows)?,
        seq_q: word(gpu, op, seq_q)?,
        seq_k: word(gpu, op, seq_k)?,
        per_batch: word(gpu, op, heads * seq_q)?,
        scale: (1.0 / (d as f32).sqrt()).to_bits(),
        causal: u32::from(causal),
        shift: shift as u32,
        has_mask: u32::from(key_mask.is_some()),
        window: word(gpu, op, window.min(seq_k))?,
        ..AttentionParams::default()
    };
    launch(gpu, "attention", ATTENTION, &params, &[(&scores).into(), (&mask).into()], rows as u64 * 256)?;

    let weights = Operand {
        binding: (&scores).into(),
        kind: 0,
        offset: 0,
        batch: vec![heads * seq_q * seq_k, group * seq_q * seq_k, seq_q * seq_k],
        row: seq_k,
        column: 1,
    };
    let values = Operand {
        binding: storage(v, op)?.into(),
        kind: kind(v, op)?,
        offset: v.offset(),
        batch: vec![vs[0], vs[1], 0],
        row: vs[2],
        column: vs[3],
    };
    let destination = Destination { buffer: &out, offset: 0, row: d_v };
    product(gpu, op, weights, values, None, &batch_axes, [seq_q, seq_k, d_v], destination)?;
    Ok(gpu.tensor(Some(out), DType::F32, &shape))
}

#[cfg(test)]
#[test]
fn parameter_blocks_match_the_shaders() {
    super::assert_layout::<EmbeddingParams>(EMBEDDING, "Params");
    super::assert_layout::<RotaryParams>(ROTARY, "Params");
    super::assert_layout::<AttentionParams>(ATTENTION, "Params");
    super::assert_layout::<CacheParams>(CACHE, "Params");
}
