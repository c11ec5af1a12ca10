//! Statistics of a checkpoint's tensors (`nnx stats`): per tensor the minimum, maximum, mean,
//! standard deviation, largest magnitude, zero fraction, NaN and infinity counts and a
//! histogram, accumulated in f64 over the values streamed in chunks (two passes: the second
//! sums squared deviations from the mean, as numpy's `std` does, and fills the histogram over
//! the first pass's range), so memory stays bounded by the chunk whatever the tensor's size.
//! Block-quantized GGUF tensors are decoded a chunk of rows at a time.
//!
//! A view read from a file (a PyTorch tensor over a shared storage) is walked in pieces of at
//! most a chunk, never materialized whole: an axis of stride 0 repeats the values under it, so
//! it is walked once and its values counted as many times as it repeats. A file of a few
//! hundred bytes that describes a tensor of 2^33 equal values so gets its statistics at once.

use nnx_core::quant::ggml::{GgmlType, dequantize_row};
use nnx_core::{DType, Tensor};

use crate::archive::Archive;
use crate::error::{Error, Result};

/// Histogram bins, over `[min, max]` of the finite values.
pub const BINS: usize = 16;

/// Values decoded per chunk.
const CHUNK: usize = 1 << 20;

/// The statistics of one tensor.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct TensorStats {
    /// The entry.
    pub name: String,
    /// Its dtype (`F32`, `BF16`) or encoding (`Q4_K`, `MLX affine 4-bit`).
    pub encoding: String,
    /// Its shape (the values', for an encoded tensor).
    pub shape: Vec<usize>,
    /// Values.
    pub count: u64,
    /// Smallest finite value (NaN when there is none).
    pub min: f64,
    /// Largest finite value.
    pub max: f64,
    /// Mean of the finite values.
    pub mean: f64,
    /// Population standard deviation of the finite values (numpy's `std`).
    pub std: f64,
    /// Largest finite magnitude.
    pub absmax: f64,
    /// Fraction of values that are exactly zero.
    pub zero_fraction: f64,
    /// NaN values.
    pub nans: u64,
    /// Infinite values.
    pub infs: u64,
    /// Counts of the finite values in [`BINS`] equal bins over `[min, max]` (the last bin
    /// closed, as numpy's `histogram`).
    pub histogram: Vec<u64>,
}

impl TensorStats {
    /// Whether the tensor holds values and every one of them is exactly zero.
    pub fn all_zeros(&self) -> bool {
        self.count > 0 && self.zero_fraction == 1.0
    }

    /// Whether a trained model may well hold this tensor as all zeros: a scalar or a vector (a
    /// bias, a norm's weight or offset), or a tensor named as a bias (`*.bias`, `*_bias`) or as
    /// a normalization's (a name segment with `norm`, `ln_1`). A matrix or an embedding of
    /// zeros is what a failed save or conversion leaves; a zero bias is common (`pooler.dense.bias`
    /// of all-MiniLM-L6-v2).
    pub fn zeros_are_normal(&self) -> bool {
        let name = self.name.to_ascii_lowercase();
        self.shape.len() < 2
            || name.ends_with("bias")
            || name.split('.').any(|segment| segment.contains("norm") || segment.starts_with("ln_"))
    }

    /// What is wrong with the tensor, when something is: NaN or infinite values, or a weight
    /// that is all zeros ([`TensorStats::zeros_are_normal`] says which are not weights).
    pub fn problem(&self) -> Option<String> {
        if self.nans > 0 || self.infs > 0 {
            Some(format!("{} NaN, {} infinite", self.nans, self.infs))
        } else if self.all_zeros() && !self.zeros_are_normal() {
            Some("all zeros".to_string())
        } else {
            None
        }
    }

    /// Whether the tensor has a [`TensorStats::problem`]: what `nnx stats --check` flags.
    pub fn suspicious(&self) -> bool {
        self.problem().is_some()
    }

    /// How many standard deviations from the mean the farthest finite value lies, and that
    /// value; `None` for a tensor without spread.
    pub fn farthest(&self) -> Option<(f64, f64)> {
        let (above, below) = ((self.max - self.mean).abs(), (self.min - self.mean).abs());
        (self.std > 0.0 && above.is_finite() && below.is_finite()).then(|| {
            let (value, deviation) = if above >= below { (self.max, above) } else { (self.min, below) };
            (deviation / self.std, value)
        })
    }
}

/// A source of values: called with a visitor, it gives it the values chunk by chunk.
pub type Stream<'a> = dyn Fn(&mut dyn FnMut(&[f64])) -> Result<()> + 'a;

/// The statistics of the values that `stream` gives, chunk by chunk (it is called twice).
///
/// # Errors
/// The errors of `stream`.
pub fn stats_of(name: &str, encoding: String, shape: Vec<usize>, stream: &Stream<'_>) -> Result<TensorStats> {
    repeated_stats_of(name, encoding, shape, 1, stream)
}

/// [`stats_of`] for values that each stand for `repeat` equal values (the axes of stride 0 of a
/// view, walked once): every count is multiplied, the mean and spread stay what they are.
fn repeated_stats_of(
    name: &str,
    encoding: String,
    shape: Vec<usize>,
    repeat: u64,
    stream: &Stream<'_>,
) -> Result<TensorStats> {
    let (mut count, mut finite, mut zeros, mut nans, mut infs) = (0u64, 0u64, 0u64, 0u64, 0u64);
    let (mut min, mut max, mut sum) = (f64::INFINITY, f64::NEG_INFINITY, 0f64);
    let weight = repeat as f64;
    stream(&mut |values| {
        for &value in values {
            count = count.saturating_add(repeat);
            if value.is_nan() {
                nans = nans.saturating_add(repeat);
            } else if value.is_infinite() {
                infs = infs.saturating_add(repeat);
            } else {
                finite = finite.saturating_add(repeat);
                if value == 0.0 {
                    zeros = zeros.saturating_add(repeat);
                }
                min = min.min(value);
                max = max.max(value);
                sum += value * weight;
            }
        }
    })?;
    let mean = if finite > 0 { sum / finite as f64 } else { f64::NAN };
    let mut squares = 0f64;
    let mut histogram = vec![0u64; BINS];
    let width = max - min;
    stream(&mut |values| {
        for &value in values.iter().filter(|value| value.is_finite()) {
            squares += (value - mean) * (value - mean) * weight;
            // numpy's binning: (x - min) * bins / (max - min), the maximum in the last bin.
            let bin = if width > 0.0 { ((value - min) * BINS as f64 / width) as usize } else { 0 };
            let slot = &mut histogram[bin.min(BINS - 1)];
            *slot = slot.saturating_add(repeat);
        }
    })?;
    let (min, max) = if finite > 0 { (min, max) } else { (f64::NAN, f64::NAN) };
    Ok(TensorStats {
        name: name.to_string(),
        encoding,
        shape,
        count,
        min,
        max,
        mean,
        std: if finite > 0 { (squares / finite as f64).sqrt() } else { f64::NAN },
        absmax: if finite > 0 { min.abs().max(max.abs()) } else { f64::NAN },
        zero_fraction: if count > 0 { zeros as f64 / count as f64 } else { 0.0 },
        nans,
        infs,
        histogram,
    })
}

/// `tensor` with every axis of stride 0 narrowed to its first index, and how many times each
/// remaining value stands for one of the whole view: the same values, each counted once.
fn without_repeats(tensor: &Tensor) -> Result<(Tensor, u64)> {
    let mut view = tensor.clone();
    let mut repeat = 1u64;
    for axis in 0..view.rank() {
        let size = view.shape()[axis];
        if view.strides()[axis] == 0 && size > 1 {
            view = view.narrow(axis, 0, 1)?;
            repeat = repeat.saturating_mul(size as u64);
        }
    }
    Ok((view, repeat))
}

/// Gives `visit` the values of `view`, row-major, widened to f64 a piece of at most [`CHUNK`]
/// values at a time: each piece is a narrowed view materialized on its own, so memory stays
/// bounded by the piece whatever the view's layout.
fn walk_pieces(view: &Tensor, visit: &mut dyn FnMut(&[f64])) -> Result<()> {
    let shape = view.shape();
    if view.len() <= CHUNK {
        return visit_piece(view, visit);
    }
    // The outermost axis whose inner axes fit a chunk: pieces are runs along it, at each index
    // of the axes outside it.
    let mut inner = 1usize;
    let mut axis = shape.len();
    while axis > 0 && inner.saturating_mul(shape[axis - 1]) <= CHUNK {
        axis -= 1;
        inner *= shape[axis];
    }
    // `view.len() > CHUNK`, so some axis does not fit and `axis` is at least 1.
    let axis = axis - 1;
    let run = (CHUNK / inner).max(1);
    let outer = &shape[..axis];
    let mut index = vec![0usize; axis];
    loop {
        let mut piece = view.clone();
        for (at, &i) in index.iter().enumerate() {
            piece = piece.narrow(at, i, 1)?;
        }
        let mut start = 0;
        while start < shape[axis] {
            let len = run.min(shape[axis] - start);
            visit_piece(&piece.narrow(axis, start, len)?, visit)?;
            start += len;
        }
        // The next index of the outer axes, the last one fastest.
        let Some(at) = (0..axis).rev().find(|&at| index[at] + 1 < outer[at]) else { return Ok(()) };
        index[at] += 1;
        index[at + 1..].fill(0);
    }
}

/// One piece of a walk: its values as f64.
fn visit_piece(piece: &Tensor, visit: &mut dyn FnMut(&[f64])) -> Result<()> {
    visit(&piece.to_dtype(DType::F64)?.to_vec::<f64>()?);
    Ok(())
}

/// The statistics of entry `name` of `archive`: a float entry read from the mapped file, or a
/// GGUF tensor of any ggml type decoded; `None` for integer and boolean entries.
///
/// # Errors
/// The errors of reading the entry, [`Error::GgmlUnsupported`] for a type without a decoder.
pub fn entry_stats(archive: &Archive, name: &str) -> Result<Option<TensorStats>> {
    if let Some(ty) = archive.ggml_type(name)
        && !matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16)
    {
        let entry = archive.ggml(name)?;
        let cols = entry.shape.last().copied().unwrap_or(1).max(1);
        let row_bytes = ty.row_bytes(cols).ok_or(Error::GgmlRow {
            op: "stats",
            ty: ty.name(),
            block_size: ty.block_size(),
            values: cols,
            bytes: 0,
        })?;
        let bytes = entry.data.to_bytes()?;
        let rows_per_chunk = (CHUNK / cols).max(1);
        let stream = |visit: &mut dyn FnMut(&[f64])| -> Result<()> {
            let mut row = vec![0f32; cols];
            let mut chunk = Vec::with_capacity(rows_per_chunk * cols);
            for rows in bytes.chunks(rows_per_chunk * row_bytes) {
                chunk.clear();
                for packed in rows.chunks_exact(row_bytes) {
                    dequantize_row(ty, packed, &mut row)?;
                    chunk.extend(row.iter().map(|&value| f64::from(value)));
                }
                visit(&chunk);
            }
            Ok(())
        };
        return stats_of(name, ty.name().to_string(), entry.shape.clone(), &stream).map(Some);
    }
    let (dtype, shape) = archive.entry_spec(name)?.ok_or(Error::Meta { op: "stats" })?;
    if !dtype.is_castable_float() {
        return Ok(None);
    }
    // A published checkpoint's weight is named by its scheme; its values are the decoded ones.
    let named = archive.encoding(name).unwrap_or_else(|| dtype.to_string());
    let tensor = archive.try_get(name)?;
    if tensor.is_contiguous() {
        // The values widened chunk by chunk into one buffer, straight from the mapped bytes.
        fn widened<T: nnx_core::Element + Copy>(values: &[T], widen: impl Fn(T) -> f64, visit: &mut dyn FnMut(&[f64])) {
            let mut buffer = Vec::with_capacity(CHUNK.min(values.len()));
            for chunk in values.chunks(CHUNK) {
                buffer.clear();
                buffer.extend(chunk.iter().map(|&value| widen(value)));
                visit(&buffer);
            }
        }
        // Bytes that are not aligned for their dtype are not borrowed as a slice: those are
        // walked below, a piece at a time.
        let borrowed = match dtype {
            DType::F32 => tensor.as_slice::<f32>().is_ok_and(|slice| slice.is_some()),
            DType::F16 => tensor.as_slice::<half::f16>().is_ok_and(|slice| slice.is_some()),
            DType::BF16 => tensor.as_slice::<half::bf16>().is_ok_and(|slice| slice.is_some()),
            _ => tensor.as_slice::<f64>().is_ok_and(|slice| slice.is_some()),
        };
        if borrowed {
            let stream = |visit: &mut dyn FnMut(&[f64])| -> Result<()> {
                let missing = || Error::Meta { op: "stats" };
                match dtype {
                    DType::F32 => widened(tensor.as_slice::<f32>()?.ok_or_else(missing)?, f64::from, visit),
                    DType::F16 => widened(tensor.as_slice::<half::f16>()?.ok_or_else(missing)?, f64::from, visit),
                    DType::BF16 => widened(tensor.as_slice::<half::bf16>()?.ok_or_else(missing)?, f64::from, visit),
                    _ => widened(tensor.as_slice::<f64>()?.ok_or_else(missing)?, |value| value, visit),
                }
                Ok(())
            };
            return stats_of(name, named, shape, &stream).map(Some);
        }
    }
    // A strided view: its distinct values walked in pieces, never the whole view at once. What
    // remains after the repeats are taken out must be no more than the view could honestly
    // hold (a view whose strides overlap describes more values than it stores).
    let (view, repeat) = without_repeats(&tensor)?;
    view.check_expansion(view.expansion_limit())?;
    let stream = |visit: &mut dyn FnMut(&[f64])| walk_pieces(&view, visit);
    repeated_stats_of(name, named, shape, repeat, &stream).map(Some)
}

#[cfg(test)]
mod tests {
    use super::{TensorStats, stats_of};

    fn stats(name: &str, shape: &[usize], values: &[f64]) -> TensorStats {
        let values = values.to_vec();
        stats_of(name, "F32".to_string(), shape.to_vec(), &|visit| {
            visit(&values);
            Ok(())
        })
        .unwrap()
    }

    #[test]
    fn zero_weights_are_problems_and_zero_biases_and_norms_are_not() {
        assert_eq!(stats("embed.weight", &[2, 2], &[0.0; 4]).problem().as_deref(), Some("all zeros"));
        assert_eq!(stats("pooler.dense.bias", &[4], &[0.0; 4]).problem(), None);
        assert_eq!(stats("scale", &[4], &[0.0; 4]).problem(), None, "a vector");
        assert_eq!(stats("attn.qkv_bias", &[2, 2], &[0.0; 4]).problem(), None);
        assert_eq!(stats("layers.0.input_layernorm.weight", &[2, 2], &[0.0; 4]).problem(), None);
        assert_eq!(stats("h.0.ln_1.weight", &[2, 2], &[0.0; 4]).problem(), None);
        assert_eq!(stats("bias", &[2], &[f64::NAN, 0.0]).problem().as_deref(), Some("1 NaN, 0 infinite"));
        assert!(!stats("w", &[2], &[1.0, 0.0]).suspicious());
    }

    #[test]
    fn farthest_names_the_value_and_its_distance() {
        let mut values = vec![0.0; 99];
        values.push(100.0);
        let (sigmas, value) = stats("w", &[100], &values).farthest().unwrap();
        assert_eq!(value, 100.0);
        assert!((sigmas - 99f64.sqrt()).abs() < 1e-9, "{sigmas}");
        assert_eq!(stats("w", &[2], &[1.0, 1.0]).farthest(), None, "no spread");
    }
}
