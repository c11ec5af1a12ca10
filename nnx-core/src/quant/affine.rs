//! MLX affine quantization: `w = scale * q + bias` per group of consecutive values along the
//! last axis, `q` packed into u32 words, reproducing MLX's CPU `quantize` and `dequantize` bit
//! for bit.
//!
//! What the arithmetic has to be, as established against MLX's own output for every bit width,
//! group size and source dtype (f32, bf16, f16):
//!
//! - Quantizing works in f32 whatever the source dtype (bf16 and f16 values widen exactly).
//!   Per group: `lo`, `hi`; `scale = max((hi - lo) / n, 1e-7)` with `n = 2^bits - 1`; the scale
//!   is negated unless `|lo| > |hi|`, and `edge` is `lo` or `hi` to match; `q0 = rint(edge /
//!   scale)`; when `q0 != 0`, `scale = edge / q0` and `bias = edge`, else `bias = 0`.
//! - Each value is `rint((w - bias) / scale)` clamped to `[0, n]`: a true division. Multiplying
//!   by the reciprocal of the scale gives other words for bf16 sources (2, 5, 6 and 8 bits).
//! - Scales and biases are stored rounded to the source dtype; the values above use the f32
//!   scale and bias, not the rounded ones.
//! - Dequantizing rounds twice to the output dtype (the dtype of the scales): `T(T(q * scale) +
//!   bias)`. For f32 this is a multiplication and an addition, each rounded: a fused
//!   multiply-add gives different results for hundreds of values per matrix. For bf16 and f16,
//!   computing `q * scale + bias` in f32 and rounding once gives different results too.

use std::borrow::Cow;

use rayon::prelude::*;

use super::{Rounding, check_stream, with_slice};
use crate::error::{Error, Result};
use crate::kernels::f32_tensor;
use crate::{DType, Device, Host, Place, Placer, Tensor};

/// The bit widths MLX's affine mode defines.
pub const AFFINE_BITS: [u32; 6] = [2, 3, 4, 5, 6, 8];

/// The group sizes MLX's affine mode defines.
pub const AFFINE_GROUP_SIZES: [usize; 3] = [32, 64, 128];

/// Groups handled by one parallel task.
const GROUPS_PER_TASK: usize = 1024;

/// Bits per value and values per group of an affine quantization.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AffineSpec {
    /// Bits per value: 2, 3, 4, 5, 6 or 8.
    pub bits: u32,
    /// Consecutive values along the last axis sharing a scale and bias: 32, 64 or 128.
    pub group_size: usize,
}

impl AffineSpec {
    /// A checked spec.
    ///
    /// # Errors
    /// [`Error::QuantSpec`] for bits or group sizes MLX does not define.
    pub fn new(bits: u32, group_size: usize) -> Result<AffineSpec> {
        if AFFINE_BITS.contains(&bits) && AFFINE_GROUP_SIZES.contains(&group_size) {
            Ok(AffineSpec { bits, group_size })
        } else {
            Err(Error::QuantSpec { bits, group_size })
        }
    }

    /// u32 words holding `columns` packed values (whole words; weights have whole groups, so
    /// nothing is dropped for them). Never overflows: the words are fewer than the values.
    pub fn packed_columns(&self, columns: usize) -> usize {
        let bits = self.bits as usize;
        columns / 32 * bits + columns % 32 * bits / 32
    }

    /// Checks a weight's shape: rank 1 or more with a last axis made of whole groups.
    fn check_columns(&self, shape: &[usize]) -> Result<usize> {
        match shape.last() {
            Some(&columns) if columns > 0 && columns.is_multiple_of(self.group_size) => Ok(columns),
            _ => Err(Error::QuantColumns { shape: shape.to_vec(), multiple: self.group_size }),
        }
    }
}

/// An affine-quantized weight in MLX's layout: `weight` (U32 `[.., rows, columns * bits /
/// 32]`), `scales` and `biases` (the source float dtype, `[.., rows, columns / group_size]`),
/// on the host or, placed with [`AffineWeight::place`], on a device with the streams still
/// packed.
#[derive(Clone, Debug)]
pub struct AffineWeight<D: Device = Host> {
    /// The packed values.
    pub weight: Tensor<D>,
    /// One scale per group.
    pub scales: Tensor<D>,
    /// One bias per group.
    pub biases: Tensor<D>,
    spec: AffineSpec,
}

impl<D: Device> AffineWeight<D> {
    /// Puts the three streams together, checking that their dtypes and shapes agree (only
    /// dtypes and shapes are read, so the streams may live on any device).
    ///
    /// # Errors
    /// [`Error::QuantStream`] naming the stream that does not fit: `weight` must be U32,
    /// `scales` a float dtype, `biases` the same dtype and shape as `scales`, and `weight`
    /// `[.., rows, groups * group_size * bits / 32]` for `scales` `[.., rows, groups]`;
    /// [`Error::QuantTooLarge`] when `groups * group_size` overflows (an empty weight claiming
    /// more columns than can be counted).
    pub fn new(weight: Tensor<D>, scales: Tensor<D>, biases: Tensor<D>, spec: AffineSpec) -> Result<AffineWeight<D>> {
        let dtype = match scales.dtype() {
            DType::F32 | DType::BF16 | DType::F16 => scales.dtype(),
            _ => DType::BF16,
        };
        check_stream("scales", &scales, dtype, scales.shape())?;
        check_stream("biases", &biases, dtype, scales.shape())?;
        let mut packed = scales.shape().to_vec();
        match packed.last_mut() {
            Some(groups) => {
                // An empty weight may claim any number of groups; their values must still be
                // countable.
                let columns = groups.checked_mul(spec.group_size).ok_or_else(|| Error::QuantTooLarge {
                    stream: "scales",
                    shape: scales.shape().to_vec(),
                    values: spec.group_size,
                })?;
                *groups = spec.packed_columns(columns);
            }
            None => check_stream("scales", &scales, dtype, &[1])?,
        }
        check_stream("weight", &weight, DType::U32, &packed)?;
        Ok(AffineWeight { weight, scales, biases, spec })
    }

    /// Bits and group size.
    pub fn spec(&self) -> AffineSpec {
        self.spec
    }

    /// The dtype of scales and biases, which is the dtype [`AffineWeight::dequantize`] gives.
    pub fn dtype(&self) -> DType {
        self.scales.dtype()
    }

    /// The shape of the float weight.
    pub fn shape(&self) -> Vec<usize> {
        let mut shape = self.scales.shape().to_vec();
        if let Some(last) = shape.last_mut() {
            // `new` checked that this fits; saturating keeps replaced fields from overflowing.
            *last = last.saturating_mul(self.spec.group_size);
        }
        shape
    }
}

impl AffineWeight {
    /// Quantizes `source` (f32, bf16 or f16, `[.., columns]`) as MLX's CPU backend does, bit
    /// for bit; scales and biases have the source dtype.
    ///
    /// # Errors
    /// [`Error::NotFloat`] for other dtypes; [`Error::QuantColumns`] when the last axis is not
    /// a multiple of the group size; [`Error::Meta`] for a meta tensor.
    pub fn quantize(source: &Tensor, spec: AffineSpec) -> Result<AffineWeight> {
        let dtype = source.dtype();
        if !matches!(dtype, DType::F32 | DType::BF16 | DType::F16) {
            return Err(Error::NotFloat { op: "quantize", dtype });
        }
        let columns = spec.check_columns(source.shape())?;
        let run = |values: &[f32]| quantize_values(values, spec, Rounding::of(dtype));
        let (words, scales, biases) =
            if dtype == DType::F32 { with_slice::<f32, _>(source, run)? } else { run(&source.to_f32_vec()?) };
        let shape = source.shape();
        let mut group_shape = shape.to_vec();
        *group_shape.last_mut().expect("rank checked") = columns / spec.group_size;
        let mut packed_shape = shape.to_vec();
        *packed_shape.last_mut().expect("rank checked") = spec.packed_columns(columns);
        Ok(AffineWeight {
            weight: Tensor::from_vec(words, &packed_shape)?,
            scales: Tensor::from_vec(scales, &group_shape)?.to_dtype(dtype)?,
            biases: Tensor::from_vec(biases, &group_shape)?.to_dtype(dtype)?,
            spec,
        })
    }

    /// This weight on the device `to`, each stream as it is (the packed words stay U32), so
    /// that the device decodes them (see `AffineWeight<Gpu>::dequantize`).
    ///
    /// # Errors
    /// The device's error when a stream cannot be moved.
    pub fn place<To: Device>(&self, to: &To) -> Result<AffineWeight<To>> {
        self.place_with(&mut Placer::new(to))
    }

    /// The float weight, in the dtype of the scales, equal bit for bit to MLX's `dequantize`.
    ///
    /// # Errors
    /// [`Error::Meta`] when a stream has no data.
    pub fn dequantize(&self) -> Result<Tensor> {
        let values = self.dequantize_f32()?;
        f32_tensor(values, &self.shape())?.to_dtype(self.dtype())
    }

    /// The dequantized values widened to f32 (each exactly a value of [`AffineWeight::dtype`]).
    pub(crate) fn dequantize_f32(&self) -> Result<Vec<f32>> {
        let rows = self.scales.len() / self.scales.shape().last().copied().unwrap_or(1).max(1);
        let mut out = vec![0f32; self.scales.len() * self.spec.group_size];
        crate::tensor::advise_huge_pages(bytemuck::cast_slice_mut(&mut out));
        self.dequantize_rows(0, rows, &mut out)?;
        Ok(out)
    }

    /// Dequantizes `count` rows from `first` (rows of the flattened `[rows, columns]` weight)
    /// into `out`, in parallel.
    pub(crate) fn dequantize_rows(&self, first: usize, count: usize, out: &mut [f32]) -> Result<()> {
        self.decoder()?.rows(first, count, out);
        Ok(())
    }

    /// Borrows the streams (copying scales and biases to f32) for row-wise decoding.
    pub(crate) fn decoder(&self) -> Result<AffineDecoder<'_>> {
        let weight = self.weight.contiguous();
        if weight.is_meta() {
            return Err(Error::Meta { op: "dequantize" });
        }
        // F32 scales and biases are borrowed: a decode step would otherwise copy them (a
        // megabyte each for a 4096 x 4096 weight) for every token.
        Ok(AffineDecoder {
            weight,
            scales: borrowed_floats(&self.scales)?,
            biases: borrowed_floats(&self.biases)?,
            spec: self.spec,
            rounding: Rounding::of(self.dtype()),
            columns: self.shape().last().copied().unwrap_or(0),
        })
    }
}

impl<To: Device> Place<To> for AffineWeight {
    type Placed = AffineWeight<To>;

    fn place_with(&self, placer: &mut Placer<'_, To>) -> Result<AffineWeight<To>> {
        Ok(AffineWeight {
            weight: placer.tensor(&self.weight)?,
            scales: placer.tensor(&self.scales)?,
            biases: placer.tensor(&self.biases)?,
            spec: self.spec,
        })
    }
}

/// `tensor`'s values as f32: borrowed when it is a contiguous F32 tensor, else converted.
fn borrowed_floats(tensor: &Tensor) -> Result<Cow<'_, [f32]>> {
    match tensor.as_slice::<f32>() {
        Ok(Some(values)) => Ok(Cow::Borrowed(values)),
        _ => Ok(Cow::Owned(tensor.to_f32_vec()?)),
    }
}

/// The streams of an [`AffineWeight`] ready for decoding rows.
pub(crate) struct AffineDecoder<'a> {
    weight: Tensor,
    scales: Cow<'a, [f32]>,
    biases: Cow<'a, [f32]>,
    spec: AffineSpec,
    rounding: Rounding,
    columns: usize,
}

impl AffineDecoder<'_> {
    /// `W x` for one input row `x` straight from the packed words; `None` where the decoding
    /// product is used instead (see `gemv`).
    #[cfg(feature = "kernels")]
    pub(crate) fn gemv(&self, x: &[f32]) -> Option<Vec<f32>> {
        let words = self.weight.as_slice::<u32>().ok().flatten()?;
        super::gemv::affine_gemv(
            self.spec.bits,
            self.spec.group_size,
            self.rounding,
            words,
            &self.scales,
            &self.biases,
            x,
        )
    }

    /// Dequantizes rows `first..first + count` into `out` (`count * columns` values), in
    /// parallel when there is enough work.
    pub(crate) fn rows(&self, first: usize, count: usize, out: &mut [f32]) {
        let words = self.weight.as_slice::<u32>().ok().flatten().expect("the weight is contiguous U32");
        let bytes: &[u8] = bytemuck::cast_slice(words);
        let group = self.spec.group_size;
        let group_bytes = group * self.spec.bits as usize / 8;
        let groups_per_row = self.columns / group;
        let first_group = first * groups_per_row;
        let groups = count * groups_per_row;
        let bytes = &bytes[first_group * group_bytes..(first_group + groups) * group_bytes];
        let scales = &self.scales[first_group..first_group + groups];
        let biases = &self.biases[first_group..first_group + groups];
        let out = &mut out[..groups * group];
        let task = |(task, out): (usize, &mut [f32])| {
            let at = task * GROUPS_PER_TASK;
            let n = out.len() / group;
            dequantize_groups(
                self.spec,
                self.rounding,
                &bytes[at * group_bytes..(at + n) * group_bytes],
                &scales[at..at + n],
                &biases[at..at + n],
                out,
            );
        };
        if groups > GROUPS_PER_TASK {
            out.par_chunks_mut(GROUPS_PER_TASK * group).enumerate().for_each(task);
        } else {
            task((0, out));
        }
    }
}

/// Round half to even for `0 <= value < 2^22`, in plain f32 arithmetic (no libm call): adding
/// 1.5 * 2^23 leaves no fraction bits, so the addition rounds to an integer, ties to even.
#[inline(always)]
fn round_small(value: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0;
    (value + MAGIC) - MAGIC
}

/// Quantizes whole groups of `values`: packed words, scales and biases (as f32, already rounded
/// to the storage dtype).
fn quantize_values(values: &[f32], spec: AffineSpec, rounding: Rounding) -> (Vec<u32>, Vec<f32>, Vec<f32>) {
    let group = spec.group_size;
    let groups = values.len() / group;
    let group_bytes = group * spec.bits as usize / 8;
    let mut words = vec![0u32; spec.packed_columns(values.len())];
    let mut scales = vec![0f32; groups];
    let mut biases = vec![0f32; groups];
    let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut words);
    bytes
        .par_chunks_mut(GROUPS_PER_TASK * group_bytes)
        .zip(scales.par_chunks_mut(GROUPS_PER_TASK))
        .zip(biases.par_chunks_mut(GROUPS_PER_TASK))
        .enumerate()
        .for_each(|(task, ((bytes, scales), biases))| {
            let first = task * GROUPS_PER_TASK * group;
            let values = &values[first..first + scales.len() * group];
            quantize_groups(spec, values, bytes, scales, biases);
            for (scale, bias) in scales.iter_mut().zip(biases.iter_mut()) {
                *scale = rounding.apply(*scale);
                *bias = rounding.apply(*bias);
            }
        });
    (words, scales, biases)
}

macro_rules! with_bits {
    ($bits:expr, $function:ident :: <BITS> ( $($arg:expr),* )) => {
        match $bits {
            2 => $function::<2>($($arg),*),
            3 => $function::<3>($($arg),*),
            4 => $function::<4>($($arg),*),
            5 => $function::<5>($($arg),*),
            6 => $function::<6>($($arg),*),
            8 => $function::<8>($($arg),*),
            other => unreachable!("AffineSpec only holds checked bit widths, not {other}"),
        }
    };
}

fn quantize_groups(spec: AffineSpec, values: &[f32], bytes: &mut [u8], scales: &mut [f32], biases: &mut [f32]) {
    with_bits!(spec.bits, quantize_groups_bits::<BITS>(spec.group_size, values, bytes, scales, biases))
}

fn dequantize_groups(
    spec: AffineSpec,
    rounding: Rounding,
    bytes: &[u8],
    scales: &[f32],
    biases: &[f32],
    out: &mut [f32],
) {
    match rounding {
        Rounding::F32 => with_bits!(
            spec.bits,
            dequantize_groups_bits::<BITS>(spec.group_size, bytes, scales, biases, out, |value| value)
        ),
        Rounding::BF16 => with_bits!(
            spec.bits,
            dequantize_groups_bits::<BITS>(spec.group_size, bytes, scales, biases, out, super::round_bf16)
        ),
        Rounding::F16 => with_bits!(
            spec.bits,
            dequantize_groups_bits::<BITS>(spec.group_size, bytes, scales, biases, out, |value| {
                Rounding::F16.apply(value)
            })
        ),
    }
}

/// Values per pack and bytes per pack for a bit width: 32 / bits values in a u32 for 2, 4
/// and 8 bits, 8 values in 3 or 5 bytes for 3 and 5 bits, 4 values in 3 bytes for 6 bits.
const fn pack_shape(bits: u32) -> (usize, usize) {
    let values = match bits {
        3 | 5 => 8,
        6 => 4,
        _ => 32 / bits as usize,
    };
    (values, values * bits as usize / 8)
}

fn quantize_groups_bits<const BITS: u32>(
    group: usize,
    values: &[f32],
    bytes: &mut [u8],
    scales: &mut [f32],
    biases: &mut [f32],
) {
    let (pack_values, pack_bytes) = pack_shape(BITS);
    let levels = ((1u32 << BITS) - 1) as f32;
    let group_bytes = group * BITS as usize / 8;
    let mut q = [0u32; 128];
    for (at, w) in values.chunks_exact(group).enumerate() {
        // MLX takes `std::max`/`std::min` over the group in f32.
        let (mut lo, mut hi) = (f32::INFINITY, f32::NEG_INFINITY);
        for &value in w {
            lo = if value < lo { value } else { lo };
            hi = if hi < value { value } else { hi };
        }
        let mut scale = ((hi - lo) / levels).max(1e-7);
        let positive = lo.abs() > hi.abs();
        if !positive {
            scale = -scale;
        }
        let edge = if positive { lo } else { hi };
        let q0 = (edge / scale).round_ties_even();
        let mut bias = 0.0;
        if q0 != 0.0 {
            scale = edge / q0;
            bias = edge;
        }
        for (q, &value) in q.iter_mut().zip(w) {
            // `rint` then clamp to [0, n] equals clamp then `rint` for integer bounds.
            *q = round_small(((value - bias) / scale).clamp(0.0, levels)) as u32;
        }
        let out = &mut bytes[at * group_bytes..(at + 1) * group_bytes];
        for (pack, dst) in q[..group].chunks_exact(pack_values).zip(out.chunks_exact_mut(pack_bytes)) {
            let mut word = 0u64;
            for (k, &value) in pack.iter().enumerate() {
                word |= u64::from(value) << (k as u32 * BITS);
            }
            dst.copy_from_slice(&word.to_le_bytes()[..pack_bytes]);
        }
        scales[at] = scale;
        biases[at] = bias;
    }
}

#[inline(always)]
fn dequantize_groups_bits<const BITS: u32>(
    group: usize,
    bytes: &[u8],
    scales: &[f32],
    biases: &[f32],
    out: &mut [f32],
    round: impl Fn(f32) -> f32,
) {
    let (pack_values, pack_bytes) = pack_shape(BITS);
    let mask = (1u64 << BITS) - 1;
    let group_bytes = group * BITS as usize / 8;
    for (at, out) in out.chunks_exact_mut(group).enumerate() {
        let (scale, bias) = (scales[at], biases[at]);
        let packed = &bytes[at * group_bytes..(at + 1) * group_bytes];
        for (src, dst) in packed.chunks_exact(pack_bytes).zip(out.chunks_exact_mut(pack_values)) {
            let mut raw = [0u8; 8];
            raw[..pack_bytes].copy_from_slice(src);
            let word = u64::from_le_bytes(raw);
            for (k, value) in dst.iter_mut().enumerate() {
                let q = ((word >> (k as u32 * BITS)) & mask) as f32;
                // MLX rounds the product to the output dtype, then the sum (no fused
                // multiply-add).
                *value = round(round(q * scale) + bias);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_are_checked() {
        assert!(AffineSpec::new(4, 64).is_ok());
        assert!(matches!(AffineSpec::new(7, 64), Err(Error::QuantSpec { bits: 7, .. })));
        assert!(matches!(AffineSpec::new(4, 16), Err(Error::QuantSpec { group_size: 16, .. })));
        assert_eq!(pack_shape(3), (8, 3));
        assert_eq!(pack_shape(6), (4, 3));
        assert_eq!(pack_shape(4), (8, 4));
    }

    #[test]
    fn every_width_stays_within_a_step() {
        let values: Vec<f32> = (0..256).map(|i| ((i * 37) % 101) as f32 / 50.0 - 1.0).collect();
        let tensor = Tensor::from_vec(values.clone(), &[2, 128]).unwrap();
        for bits in AFFINE_BITS {
            for group_size in AFFINE_GROUP_SIZES {
                let spec = AffineSpec::new(bits, group_size).unwrap();
                let quantized = AffineWeight::quantize(&tensor, spec).unwrap();
                assert_eq!(quantized.weight.shape(), &[2, 4 * bits as usize]);
                let restored = quantized.dequantize().unwrap().to_vec::<f32>().unwrap();
                let step = 2.0 / ((1u32 << bits) - 1) as f32;
                for (a, b) in restored.iter().zip(&values) {
                    assert!((a - b).abs() <= step + 1e-6, "{bits} bits, group {group_size}: {a} != {b}");
                }
            }
        }
    }

    #[test]
    fn streams_are_checked() {
        let spec = AffineSpec::new(4, 32).unwrap();
        let weight = Tensor::zeros(DType::U32, &[2, 4]);
        let scales = Tensor::zeros(DType::BF16, &[2, 1]);
        assert!(AffineWeight::new(weight.clone(), scales.clone(), scales.clone(), spec).is_ok());
        let wrong = Tensor::zeros(DType::U32, &[2, 8]);
        assert!(matches!(
            AffineWeight::new(wrong, scales.clone(), scales.clone(), spec),
            Err(Error::QuantStream { stream: "weight", .. })
        ));
        let biases = Tensor::zeros(DType::F32, &[2, 1]);
        assert!(matches!(
            AffineWeight::new(weight, scales, biases, spec),
            Err(Error::QuantStream { stream: "biases", .. })
        ));
    }
}
