//! The SeedLM encodings of NanoSeedLM model folders: SEED4 (3 coefficients per block of 8
//! values, 4 bits per weight) and SEED4P4 (4 coefficients, 4.5 bits per weight). Each block is
//! rebuilt from a 16-bit LFSR seed, small integer coefficients and a shared power-of-two
//! exponent; decoding is exact integer and f32 arithmetic, so every backend gets the same BF16
//! values. The encoder is the data-free exhaustive search over all 65535 seeds.

use rayon::prelude::*;

use super::{check_stream, round_bf16};
use crate::error::{Error, Result};
use crate::kernels::f32_tensor;
use crate::tensor::checked_len;
use crate::{DType, Device, Host, Place, Placer, Tensor};

/// Values per block.
pub const BLOCK: usize = 8;

/// The f32 nearest to 1/32767 (bits `0x38000100`), the unit of a basis value.
pub const R32: f32 = f32::from_bits(0x3800_0100);

/// Nonzero LFSR states, the length of its cycle.
const PERIOD: usize = 65535;

/// Blocks searched together by one parallel task (they share the per-seed work).
const SEARCH_BATCH: usize = 16;

/// One step of the 16-bit Fibonacci LFSR with taps 0, 1, 3 and 12 (x^16 + x^12 + x^3 + x + 1).
///
/// ```
/// assert_eq!(nnx_core::quant::lfsr_step(0x0001), 0x8000);
/// ```
pub fn lfsr_step(state: u16) -> u16 {
    let bit = (state ^ (state >> 1) ^ (state >> 3) ^ (state >> 12)) & 1;
    (state >> 1) | (bit << 15)
}

/// The `count` states that follow `seed` (the seed itself is not included).
pub fn lfsr_states(seed: u16, count: usize) -> Vec<u16> {
    let mut state = seed;
    (0..count)
        .map(|_| {
            state = lfsr_step(state);
            state
        })
        .collect()
}

/// The bits of the register's output sequence from `seed` on: bit `k..k + 16` of the result is
/// the state after `k` steps, for `k` up to 32. Each round derives four new bits at once: the
/// new bit `16 + i` is the xor of bits `i`, `i + 1`, `i + 3` and `i + 12`.
#[inline(always)]
pub(crate) fn sequence_bits(seed: u16) -> u64 {
    let mut bits = u64::from(seed);
    let mut known = 16;
    while known < 48 {
        let next = bits ^ (bits >> 1) ^ (bits >> 3) ^ (bits >> 12);
        bits |= ((next >> (known - 16)) & 0xf) << known;
        known += 4;
    }
    bits
}

/// `R32 * 2^exponent` in f32, exact for exponents in the normal range.
#[inline(always)]
pub(crate) fn block_scale(exponent: i32) -> f32 {
    let power = if (-126..=127).contains(&exponent) {
        f32::from_bits(((exponent + 127) as u32) << 23)
    } else {
        power_outside_normal(exponent)
    };
    R32 * power
}

/// `2^exponent` for exponents outside the normal range. A call of its own: inlined, `powi`
/// was evaluated for every block whichever branch was taken (a select instead of a branch).
#[cold]
#[inline(never)]
fn power_outside_normal(exponent: i32) -> f32 {
    2f32.powi(exponent)
}

/// Sign-extends a 4-bit two's-complement nibble.
#[inline(always)]
pub(crate) fn nibble(word: u32, shift: u32) -> i32 {
    (((word >> shift) & 0xf) as i32) << 28 >> 28
}

/// Decodes one block: `w_c = bf16(f32(sum_p S[c][p] * q_p) * R32 * 2^e)`, returned widened to
/// f32.
#[inline(always)]
fn decode_block<const P: usize>(seed: u16, q: [i32; P], scale: f32, out: &mut [f32]) {
    let bits = sequence_bits(seed);
    for (c, value) in out.iter_mut().enumerate().take(BLOCK) {
        let mut sum = 0i32;
        for (p, &q) in q.iter().enumerate() {
            let state = ((bits >> (c * P + p + 1)) & 0xffff) as i32;
            sum += (state - 32768) * q;
        }
        *value = round_bf16(sum as f32 * scale);
    }
}

/// Which SeedLM encoding a weight uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SeedEncoding {
    /// 3 coefficients per block, the exponent code in the low nibble of `nibbles`: 4 bits per
    /// weight.
    Seed4,
    /// 4 coefficients per block in `coefs`, exponent codes two per byte in `codes`: 4.5 bits per
    /// weight.
    Seed4P4,
}

impl SeedEncoding {
    /// Coefficients per block (P).
    pub fn coefficients(self) -> usize {
        match self {
            SeedEncoding::Seed4 => 3,
            SeedEncoding::Seed4P4 => 4,
        }
    }

    /// The name of the coefficient stream: `nibbles` or `coefs`.
    pub fn coefficient_stream(self) -> &'static str {
        match self {
            SeedEncoding::Seed4 => "nibbles",
            SeedEncoding::Seed4P4 => "coefs",
        }
    }

    /// The stored bits per weight.
    pub fn bits_per_weight(self) -> f32 {
        match self {
            SeedEncoding::Seed4 => 4.0,
            SeedEncoding::Seed4P4 => 4.5,
        }
    }

    /// `SEED4` or `SEED4P4`.
    pub fn name(self) -> &'static str {
        match self {
            SeedEncoding::Seed4 => "SEED4",
            SeedEncoding::Seed4P4 => "SEED4P4",
        }
    }
}

/// How [`SeedWeight::encode`] runs.
#[derive(Clone, Copy, Default)]
pub struct EncodeOptions<'a> {
    /// Called from worker threads with the number of blocks just finished (a progress bar's
    /// `inc`).
    pub progress: Option<&'a (dyn Fn(u64) + Sync)>,
}

impl std::fmt::Debug for EncodeOptions<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EncodeOptions").field("progress", &self.progress.is_some()).finish()
    }
}

/// A SEED4 or SEED4P4 weight of logical shape `[slices, rows, columns]`: `seeds` and the
/// coefficient stream (U16 `[slices, rows, columns / 8]`), `exp_bias` (I32 `[slices]`) and, for
/// SEED4P4, `codes` (U8 `[slices, rows, columns / 16]`), on the host or, placed with
/// [`SeedWeight::place`], on a device with the streams still packed.
#[derive(Clone, Debug)]
pub struct SeedWeight<D: Device = Host> {
    /// The encoding.
    pub encoding: SeedEncoding,
    /// One LFSR seed per block.
    pub seeds: Tensor<D>,
    /// `nibbles` (SEED4: exponent code and 3 coefficients) or `coefs` (SEED4P4: 4
    /// coefficients), one word per block.
    pub coefficients: Tensor<D>,
    /// The exponent bias of each slice.
    pub exp_bias: Tensor<D>,
    /// SEED4P4 only: the exponent codes, two per byte, low nibble first.
    pub codes: Option<Tensor<D>>,
}

impl<D: Device> SeedWeight<D> {
    /// Puts the streams together, checking every dtype and shape before any value is read
    /// (only dtypes and shapes are, so the streams may live on any device).
    ///
    /// # Errors
    /// [`Error::QuantStream`] naming the stream that does not fit (`seeds` must be U16 of rank
    /// 3, `codes` must be present exactly for SEED4P4); [`Error::QuantTooLarge`] when the
    /// logical shape `[slices, rows, blocks * 8]` cannot be counted.
    pub fn new(
        encoding: SeedEncoding,
        seeds: Tensor<D>,
        coefficients: Tensor<D>,
        exp_bias: Tensor<D>,
        codes: Option<Tensor<D>>,
    ) -> Result<SeedWeight<D>> {
        let shape = match seeds.shape() {
            [slices, rows, blocks] => [*slices, *rows, *blocks],
            other => {
                let expected = [1, other.first().copied().unwrap_or(1), other.last().copied().unwrap_or(1)];
                return Err(check_stream("seeds", &seeds, DType::U16, &expected).unwrap_err());
            }
        };
        check_stream("seeds", &seeds, DType::U16, &shape)?;
        check_stream(encoding.coefficient_stream(), &coefficients, DType::U16, &shape)?;
        check_stream("exp_bias", &exp_bias, DType::I32, &shape[..1])?;
        let codes_shape = [shape[0], shape[1], shape[2].div_ceil(2)];
        match (encoding, &codes) {
            (SeedEncoding::Seed4, None) => {}
            (SeedEncoding::Seed4, Some(codes)) => {
                return Err(Error::QuantStream {
                    stream: "codes",
                    expected_dtype: DType::U8,
                    expected_shape: Vec::new(),
                    found_dtype: codes.dtype(),
                    found_shape: codes.shape().to_vec(),
                });
            }
            (SeedEncoding::Seed4P4, Some(codes)) => check_stream("codes", codes, DType::U8, &codes_shape)?,
            (SeedEncoding::Seed4P4, None) => {
                return Err(Error::QuantStream {
                    stream: "codes",
                    expected_dtype: DType::U8,
                    expected_shape: codes_shape.to_vec(),
                    found_dtype: DType::U8,
                    found_shape: Vec::new(),
                });
            }
        }
        // An empty weight may claim any number of blocks; its logical shape must still be
        // countable.
        let columns = shape[2].checked_mul(BLOCK);
        let Some(columns) = columns.filter(|&columns| checked_len(&[shape[0], shape[1], columns]).is_some()) else {
            return Err(Error::QuantTooLarge { stream: "seeds", shape: shape.to_vec(), values: BLOCK });
        };
        if encoding == SeedEncoding::Seed4P4 && !shape[2].is_multiple_of(2) {
            return Err(Error::QuantColumns { shape: vec![shape[0], shape[1], columns], multiple: 16 });
        }
        Ok(SeedWeight { encoding, seeds, coefficients, exp_bias, codes })
    }

    /// The logical shape `[slices, rows, columns]`.
    pub fn shape(&self) -> [usize; 3] {
        match *self.seeds.shape() {
            // `new` checked that this fits; saturating keeps replaced fields from overflowing.
            [slices, rows, blocks] => [slices, rows, blocks.saturating_mul(BLOCK)],
            _ => [0, 0, 0],
        }
    }
}

impl SeedWeight {
    /// This weight on the device `to`, each stream as it is (U16, I32 and U8), so that the
    /// device decodes the blocks (see `SeedWeight<Gpu>::decode`).
    ///
    /// # Errors
    /// The device's error when a stream cannot be moved.
    pub fn place<To: Device>(&self, to: &To) -> Result<SeedWeight<To>> {
        self.place_with(&mut Placer::new(to))
    }

    /// The decoded weight, BF16 `[slices, rows, columns]`, equal bit for bit to the reference
    /// decoder.
    ///
    /// # Errors
    /// [`Error::Meta`] when a stream has no data.
    pub fn decode(&self) -> Result<Tensor> {
        let shape = self.shape();
        let decoder = self.decoder()?;
        let mut out = vec![0f32; checked_len(&shape).unwrap_or(0)];
        decoder.rows(0, shape[0].saturating_mul(shape[1]), &mut out);
        f32_tensor(out, &shape)?.to_dtype(DType::BF16)
    }

    /// `W_s x` for slice `s` and one input row, decoding blocks in registers; `None` where
    /// that kernel does not apply.
    ///
    /// # Errors
    /// [`Error::Meta`] when a stream has no data.
    #[cfg(feature = "kernels")]
    pub(crate) fn gemv(&self, slice: usize, x: &[f32]) -> Result<Option<Vec<f32>>> {
        let [_, rows, columns] = self.shape();
        let (seeds, words, exp_bias) =
            (self.seeds.contiguous(), self.coefficients.contiguous(), self.exp_bias.to_vec::<i32>()?);
        let codes = self.codes.as_ref().map(|codes| codes.contiguous());
        let (Some(seeds), Some(words)) = (seeds.as_slice::<u16>()?, words.as_slice::<u16>()?) else {
            return Ok(None);
        };
        let codes = match &codes {
            Some(codes) => match codes.as_slice::<u8>()? {
                Some(codes) => codes,
                None => return Ok(None),
            },
            None => &[],
        };
        let blocks = columns / BLOCK;
        Ok(super::gemv::seed_gemv(
            &super::gemv::SeedSlice {
                coefficients: self.encoding.coefficients(),
                seeds,
                words,
                codes,
                first_block: slice * rows * blocks,
                rows,
                blocks,
                exp_bias: exp_bias[slice],
            },
            x,
        ))
    }

    /// Reads the streams for row-wise decoding.
    pub(crate) fn decoder(&self) -> Result<SeedDecoder> {
        let [_, rows, columns] = self.shape();
        let codes = match &self.codes {
            Some(codes) => codes.to_vec::<u8>()?,
            None => Vec::new(),
        };
        Ok(SeedDecoder {
            encoding: self.encoding,
            seeds: self.seeds.to_vec::<u16>()?,
            words: self.coefficients.to_vec::<u16>()?,
            exp_bias: self.exp_bias.to_vec::<i32>()?,
            codes,
            rows,
            columns,
        })
    }

    /// Encodes `source` (a float `[rows, columns]` or `[slices, rows, columns]` weight, columns
    /// a multiple of 8, or of 16 for SEED4P4) by the exhaustive search: for every block, every
    /// seed's least-squares coefficients are quantized to 4 bits under the exponents around
    /// the best one and refined one step at a time; the seed with the smallest error wins.
    /// Each slice's exponent window starts at [`seed_exp_bias`] of its blocks.
    ///
    /// A weight without rows (`[0, columns]`) encodes to empty streams with the exponent bias of
    /// a slice of zeros, and decodes back to its own empty shape.
    ///
    /// # Errors
    /// [`Error::NotFloat`], [`Error::QuantColumns`], [`Error::Meta`].
    pub fn encode(source: &Tensor, encoding: SeedEncoding, options: &EncodeOptions<'_>) -> Result<SeedWeight> {
        if !source.dtype().is_castable_float() {
            return Err(Error::NotFloat { op: "seed encode", dtype: source.dtype() });
        }
        let multiple = if encoding == SeedEncoding::Seed4 { BLOCK } else { 2 * BLOCK };
        let (slices, rows, columns) = match *source.shape() {
            [rows, columns] => (1, rows, columns),
            [slices, rows, columns] => (slices, rows, columns),
            _ => (0, 0, 0),
        };
        if columns == 0 || !columns.is_multiple_of(multiple) {
            return Err(Error::QuantColumns { shape: source.shape().to_vec(), multiple });
        }
        let values = source.to_f32_vec()?;
        // The values are in memory, so a slice of them is countable unless it is empty.
        let per_slice = if values.is_empty() { 0 } else { rows * columns };
        let blocks_per_slice = per_slice / BLOCK;
        let exp_bias: Vec<i32> =
            (0..slices).map(|slice| seed_exp_bias(&values[slice * per_slice..(slice + 1) * per_slice])).collect();
        let found = match encoding {
            SeedEncoding::Seed4 => search::<3>(&values, blocks_per_slice, &exp_bias, options),
            SeedEncoding::Seed4P4 => search::<4>(&values, blocks_per_slice, &exp_bias, options),
        };
        let blocks = columns / BLOCK;
        let shape = [slices, rows, blocks];
        let seeds: Vec<u16> = found.iter().map(|block| block.seed).collect();
        let (words, codes) = match encoding {
            SeedEncoding::Seed4 => {
                let words = found
                    .iter()
                    .map(|block| {
                        let mut word = u16::from(block.code);
                        for (p, &q) in block.q[..3].iter().enumerate() {
                            word |= ((q as u16) & 0xf) << (4 + 4 * p);
                        }
                        word
                    })
                    .collect::<Vec<u16>>();
                (words, None)
            }
            SeedEncoding::Seed4P4 => {
                let words = found
                    .iter()
                    .map(|block| {
                        block.q.iter().enumerate().fold(0u16, |word, (p, &q)| word | ((q as u16) & 0xf) << (4 * p))
                    })
                    .collect::<Vec<u16>>();
                let codes: Vec<u8> = found.iter().map(|block| block.code).collect();
                let packed = Tensor::from_vec(pack_seed_codes(&codes), &[slices, rows, blocks / 2])?;
                (words, Some(packed))
            }
        };
        SeedWeight::new(
            encoding,
            Tensor::from_vec(seeds, &shape)?,
            Tensor::from_vec(words, &shape)?,
            Tensor::from_vec(exp_bias, &[slices])?,
            codes,
        )
    }
}

impl<To: Device> Place<To> for SeedWeight {
    type Placed = SeedWeight<To>;

    fn place_with(&self, placer: &mut Placer<'_, To>) -> Result<SeedWeight<To>> {
        Ok(SeedWeight {
            encoding: self.encoding,
            seeds: placer.tensor(&self.seeds)?,
            coefficients: placer.tensor(&self.coefficients)?,
            exp_bias: placer.tensor(&self.exp_bias)?,
            codes: self.codes.as_ref().map(|codes| placer.tensor(codes)).transpose()?,
        })
    }
}

/// Packs 4-bit exponent codes two per byte, low nibble first (the SEED4P4 `codes` stream).
pub fn pack_seed_codes(codes: &[u8]) -> Vec<u8> {
    codes.chunks(2).map(|pair| (pair[0] & 0xf) | (pair.get(1).copied().unwrap_or(0) & 0xf) << 4).collect()
}

/// The exponent bias of a slice: the largest `floor(log2(2 * ||block||_2)) - 2` over its blocks
/// of 8 values, plus 1, minus 15, so that the window `[bias, bias + 15]` reaches the largest
/// block's exponent. A slice of zeros gets -30.
pub fn seed_exp_bias(values: &[f32]) -> i32 {
    let top = values
        .chunks(BLOCK)
        .filter_map(|block| {
            let norm = block.iter().map(|&v| f64::from(v) * f64::from(v)).sum::<f64>().sqrt();
            (norm > 0.0).then(|| (2.0 * norm).log2().floor() as i32 - 2)
        })
        .max();
    match top {
        // Saturating: an infinite value gives the largest exponent an i32 holds.
        Some(top) => top.saturating_sub(14),
        None => -30,
    }
}

/// The decoding state of a [`SeedWeight`]: its streams as plain vectors.
pub(crate) struct SeedDecoder {
    encoding: SeedEncoding,
    seeds: Vec<u16>,
    words: Vec<u16>,
    exp_bias: Vec<i32>,
    codes: Vec<u8>,
    rows: usize,
    columns: usize,
}

impl SeedDecoder {
    /// The width of a row.
    #[cfg(feature = "kernels")]
    pub(crate) fn columns(&self) -> usize {
        self.columns
    }

    /// Decodes rows `first..first + count` of the flattened `[slices * rows, columns]` weight
    /// into `out`, in parallel over rows when there is enough work.
    pub(crate) fn rows(&self, first: usize, count: usize, out: &mut [f32]) {
        let columns = self.columns;
        if count == 0 || columns == 0 {
            return;
        }
        let task = |(at, out): (usize, &mut [f32])| self.row(first + at, out);
        let out = &mut out[..count * columns];
        if count * columns >= 1 << 16 {
            out.par_chunks_mut(columns).enumerate().for_each(task);
        } else {
            out.chunks_mut(columns).enumerate().for_each(task);
        }
    }

    fn row(&self, row: usize, out: &mut [f32]) {
        let blocks = self.columns / BLOCK;
        let bias = self.exp_bias[row / self.rows];
        let first = row * blocks;
        for (j, out) in out.chunks_exact_mut(BLOCK).enumerate() {
            let g = first + j;
            let word = u32::from(self.words[g]);
            match self.encoding {
                SeedEncoding::Seed4 => {
                    // Saturating: a damaged `exp_bias` near the ends of i32 gives scales of 0 or
                    // infinity, as the exact exponent would.
                    let scale = block_scale(bias.saturating_add((word & 0xf) as i32));
                    decode_block::<3>(self.seeds[g], [nibble(word, 4), nibble(word, 8), nibble(word, 12)], scale, out);
                }
                SeedEncoding::Seed4P4 => {
                    let code = (self.codes[g / 2] >> (4 * (g % 2))) & 0xf;
                    let scale = block_scale(bias.saturating_add(i32::from(code)));
                    let q = [nibble(word, 0), nibble(word, 4), nibble(word, 8), nibble(word, 12)];
                    decode_block::<4>(self.seeds[g], q, scale, out);
                }
            }
        }
    }
}

/// The result of the search for one block.
#[derive(Clone, Copy, Debug)]
struct Found {
    seed: u16,
    q: [i32; 4],
    code: u8,
}

/// Basis values along the LFSR cycle: entry `t` is `(state_t - 32768) * R32` with state 0 the
/// seed 1, so the basis of the seed at position `t` is the `8 * P` entries from `t + 1`, and
/// the seeds themselves.
fn cycle() -> (Vec<f32>, Vec<u16>) {
    let mut states = Vec::with_capacity(PERIOD + 33);
    let mut state = 1u16;
    for _ in 0..PERIOD + 33 {
        states.push(state);
        state = lfsr_step(state);
    }
    let basis = states.iter().map(|&s| (i32::from(s) - 32768) as f32 * R32).collect();
    (basis, states)
}

/// Inverts a symmetric positive definite `P x P` matrix (Gauss-Jordan in f64); `None` when it is
/// singular.
fn invert<const P: usize>(gram: &[[f32; P]; P]) -> Option<[[f32; P]; P]> {
    let mut a = [[0f64; P]; P];
    let mut inv = [[0f64; P]; P];
    for i in 0..P {
        for j in 0..P {
            a[i][j] = f64::from(gram[i][j]);
        }
        inv[i][i] = 1.0;
    }
    for col in 0..P {
        let pivot = a[col][col];
        if pivot.abs() < 1e-12 {
            return None;
        }
        for j in 0..P {
            a[col][j] /= pivot;
            inv[col][j] /= pivot;
        }
        for row in 0..P {
            if row != col {
                let factor = a[row][col];
                for j in 0..P {
                    a[row][j] -= factor * a[col][j];
                    inv[row][j] -= factor * inv[col][j];
                }
            }
        }
    }
    let mut out = [[0f32; P]; P];
    for i in 0..P {
        for j in 0..P {
            out[i][j] = inv[i][j] as f32;
        }
    }
    Some(out)
}

/// The search over all seeds for every block, batches of blocks in parallel.
fn search<const P: usize>(
    values: &[f32],
    blocks_per_slice: usize,
    exp_bias: &[i32],
    options: &EncodeOptions<'_>,
) -> Vec<Found> {
    let (basis, states) = cycle();
    let blocks: Vec<&[f32]> = values.chunks_exact(BLOCK).collect();
    let mut found = vec![Found { seed: 1, q: [0; 4], code: 0 }; blocks.len()];
    found.par_chunks_mut(SEARCH_BATCH).enumerate().for_each(|(batch, out)| {
        let first = batch * SEARCH_BATCH;
        let batch_blocks = &blocks[first..first + out.len()];
        let biases: Vec<i32> = (first..first + out.len()).map(|g| exp_bias[g / blocks_per_slice]).collect();
        search_batch::<P>(&basis, &states, batch_blocks, &biases, out);
        if let Some(progress) = options.progress {
            progress(out.len() as u64);
        }
    });
    found
}

/// Error of integer coefficients `q` at step `t`, less `||w||^2`: `t^2 q'Gq - 2 t q'r`.
#[inline(always)]
fn quantized_error<const P: usize>(gram: &[[f32; P]; P], r: &[f32; P], q: &[f32; P], t: f32) -> f32 {
    let mut quadratic = 0.0;
    let mut linear = 0.0;
    for i in 0..P {
        let mut row = 0.0;
        for j in 0..P {
            row += gram[i][j] * q[j];
        }
        quadratic += q[i] * row;
        linear += q[i] * r[i];
    }
    t * t * quadratic - 2.0 * t * linear
}

fn search_batch<const P: usize>(basis: &[f32], states: &[u16], blocks: &[&[f32]], biases: &[i32], out: &mut [Found]) {
    let norms: Vec<f32> = blocks.iter().map(|block| block.iter().map(|v| v * v).sum()).collect();
    // The best error so far (relative to ||w||^2): the all-zero coefficients give 0.
    let mut best: Vec<f32> = vec![0.0; blocks.len()];
    for t in 0..PERIOD {
        let b = &basis[t + 1..t + 1 + BLOCK * P];
        let mut gram = [[0f32; P]; P];
        for c in 0..BLOCK {
            for i in 0..P {
                for j in 0..P {
                    gram[i][j] += b[c * P + i] * b[c * P + j];
                }
            }
        }
        let Some(inverse) = invert::<P>(&gram) else { continue };
        for (k, block) in blocks.iter().enumerate() {
            let mut r = [0f32; P];
            for c in 0..BLOCK {
                for p in 0..P {
                    r[p] += b[c * P + p] * block[c];
                }
            }
            let mut a = [0f32; P];
            let mut fit = 0.0;
            for i in 0..P {
                for j in 0..P {
                    a[i] += inverse[i][j] * r[j];
                }
                fit += a[i] * r[i];
            }
            // The least-squares error `||w||^2 - a'r` bounds every quantized error from below.
            if -fit >= best[k] || norms[k] == 0.0 {
                continue;
            }
            if let Some((error, q, code)) = quantize_coefficients::<P>(&gram, &r, &a, biases[k])
                && error < best[k]
            {
                {
                    best[k] = error;
                    let mut stored = [0; 4];
                    stored[..P].copy_from_slice(&q);
                    out[k] = Found { seed: states[t], q: stored, code };
                }
            }
        }
    }
}

/// The best 4-bit coefficients for least-squares coefficients `a`: exponents around the one
/// that fits the largest coefficient (within the slice's window), then single steps of one
/// coefficient while they lower the error.
fn quantize_coefficients<const P: usize>(
    gram: &[[f32; P]; P],
    r: &[f32; P],
    a: &[f32; P],
    bias: i32,
) -> Option<(f32, [i32; P], u8)> {
    let largest = a.iter().fold(0f32, |m, v| m.max(v.abs()));
    if largest == 0.0 || !largest.is_finite() {
        return None;
    }
    let e0 = (largest / 7.5).log2().ceil() as i32;
    let mut best: Option<(f32, [f32; P], i32)> = None;
    for e in [e0 - 1, e0, e0 + 1] {
        let e = e.clamp(bias, bias + 15);
        let t = block_scale(e) / R32;
        let mut q = [0f32; P];
        for p in 0..P {
            q[p] = (a[p] / t).round().clamp(-8.0, 7.0);
        }
        let error = quantized_error(gram, r, &q, t);
        if best.is_none_or(|(b, _, _)| error < b) {
            best = Some((error, q, e));
        }
    }
    let (mut error, mut q, e) = best?;
    let t = block_scale(e) / R32;
    for _ in 0..2 {
        let mut improved = false;
        for p in 0..P {
            for step in [-1.0, 1.0] {
                let mut trial = q;
                trial[p] += step;
                if !(-8.0..=7.0).contains(&trial[p]) {
                    continue;
                }
                let trial_error = quantized_error(gram, r, &trial, t);
                if trial_error < error {
                    error = trial_error;
                    q = trial;
                    improved = true;
                }
            }
        }
        if !improved {
            break;
        }
    }
    Some((error, q.map(|v| v as i32), (e - bias) as u8))
}

/// The squared error between two equally long sets of values, in f64.
#[cfg(test)]
fn squared_error(a: &[f32], b: &[f32]) -> f64 {
    a.iter().zip(b).map(|(&x, &y)| (f64::from(x) - f64::from(y)).powi(2)).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequence_bits_match_the_stepped_register() {
        for seed in [1u16, 0xace1, 0xffff, 0x8000, 12345] {
            let bits = sequence_bits(seed);
            for (k, state) in lfsr_states(seed, 32).into_iter().enumerate() {
                assert_eq!(((bits >> (k + 1)) & 0xffff) as u16, state, "seed {seed:#x} state {}", k + 1);
            }
        }
    }

    #[test]
    fn nibbles_are_twos_complement() {
        assert_eq!(nibble(0x8, 0), -8);
        assert_eq!(nibble(0x7, 0), 7);
        assert_eq!(nibble(0xf0, 4), -1);
    }

    #[test]
    fn encoder_finds_an_exact_block() {
        // A block that one seed and small coefficients rebuild exactly is found again.
        let seed = 0x1234u16;
        let mut target = [0f32; 8];
        decode_block::<3>(seed, [3, -2, 5], block_scale(-20), &mut target);
        let source = Tensor::from_vec(target.to_vec(), &[1, 8]).unwrap();
        let encoded = SeedWeight::encode(&source, SeedEncoding::Seed4, &EncodeOptions::default()).unwrap();
        let decoded = encoded.decode().unwrap().to_f32_vec().unwrap();
        assert!(squared_error(&decoded, &target) <= 1e-6 * target.iter().map(|v| v * v).sum::<f32>() as f64);
    }
}
