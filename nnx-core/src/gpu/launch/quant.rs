//! Quantized weights on the GPU: MLX affine dequantization (`affine.wgsl`) and SeedLM decoding
//! (`seed.wgsl`), equal bit for bit to the host's, and products `x · Wᵀ (+ bias)` that decode
//! the packed weight inside the kernel (`qmatmul.wgsl`), so the float weight never exists on
//! the device. The streams are read where they lie, in their stored dtypes (U32, U16, U8), as
//! `place` put them there.
//!
//! Decoded values are the host's bit for bit wherever the adapter keeps subnormal f32 results
//! (lavapipe does); an adapter that flushes them can differ only for values below 2^-126,
//! which quantized checkpoints do not hold. Every rounding to f16 or bf16 is done in integer
//! arithmetic, and the product and sum of an affine value are kept apart (see `affine.wgsl`).

use super::{ABSENT, Uniform, count, kind, output, reach, same_device, step, storage, uniform, word};
use crate::error::Result;
use crate::gpu::Gpu;
use crate::gpu::dispatch::{Binding, Launch};
use crate::quant::{
    AffineWeight, QuantizedLinear, SeedEncoding, SeedLinear, SeedWeight, check_input, check_one_slice, check_slice,
    check_stream,
};
use crate::{DType, OnDevice, Tensor};

/// Input rows up to which a product runs as `matvec`, where each weight unit is decoded once
/// for all of them; more rows take the tiled kernel.
const MATVEC_INPUTS: usize = 4;
/// Output features per `matvec` workgroup.
const MATVEC_FEATURES: usize = 8;
/// The output tile of the tiled kernel, rows by features.
const TILE: (usize, usize) = (32, 64);
/// Invocations per workgroup (see `dispatch::WORKGROUP`).
const WORKGROUP: u64 = crate::gpu::dispatch::WORKGROUP as u64;

uniform! {
    /// The `Product` block that starts the parameters of every quantized kernel (`quant.wgsl`):
    /// `y = x Wᵀ (+ bias)` for `x` `[m, k]` (f32, from `x_offset`) and `W` `[n, k]`; zero in
    /// decodes.
    struct ProductParams {
        m: u32,
        n: u32,
        k: u32,
        x_offset: u32,
        /// [`ABSENT`] when there is no bias.
        bias_kind: u32,
        bias_offset: u32,
        bias_stride: u32,
        /// Uniform blocks are read in 16-byte rows: the next block starts on one.
        _pad: u32,
    }
}

uniform! {
    /// The parameters of `affine.wgsl`.
    struct AffineParams {
        product: ProductParams,
        /// Decode: the values to dequantize (a multiple of 32).
        count: u32,
        bits: u32,
        group: u32,
        /// In elements of each stream.
        weight_offset: u32,
        scales_offset: u32,
        biases_offset: u32,
        /// Always 0: the zero that keeps the multiply and the add apart (see `affine.wgsl`).
        opaque: u32,
    }
}

uniform! {
    /// The parameters of `seed.wgsl`.
    struct SeedParams {
        product: ProductParams,
        /// Decode: the blocks to decode.
        blocks: u32,
        /// Rows of one slice.
        rows: u32,
        /// Blocks of one row (columns / 8).
        row_blocks: u32,
        /// Product: the flat row of the slice's first row.
        first_row: u32,
        /// In elements of each stream.
        seeds_offset: u32,
        coefficients_offset: u32,
        exp_bias_offset: u32,
        codes_offset: u32,
    }
}

/// A stream as the kernels read it: contiguous (a strided view is gathered first), and the
/// index of its first element in its buffer.
struct Stream {
    tensor: Tensor<Gpu>,
    offset: u32,
}

impl Stream {
    fn of(tensor: &Tensor<Gpu>, op: &'static str) -> Result<Stream> {
        let tensor = tensor.contiguous()?;
        let gpu = tensor.device();
        reach(gpu, op, tensor.offset(), tensor.shape(), tensor.strides())?;
        let offset = word(gpu, op, tensor.offset())?;
        storage(&tensor, op)?;
        Ok(Stream { tensor, offset })
    }

    fn binding(&self) -> Binding<'_> {
        self.tensor.buffer().expect("`Stream::of` checked the buffer").into()
    }
}

/// The kernels of one encoding, compiled from `quant.wgsl`, the encoding's file and
/// `qmatmul.wgsl` after a constant that selects the variant (the float kind of affine scales,
/// the coefficients of a seed block), so that each variant compiles without the others'
/// branches; and their pipeline keys.
struct Kernels {
    source: &'static str,
    decode: (&'static str, &'static str),
    matvec: &'static str,
    tiled: &'static str,
}

macro_rules! kernels {
    ($name:literal, $constant:literal, $file:literal, $decode:literal) => {
        Kernels {
            source: concat!(
                $constant,
                "\n",
                include_str!("../wgsl/prelude.wgsl"),
                include_str!("../wgsl/float.wgsl"),
                include_str!("../wgsl/quant.wgsl"),
                include_str!(concat!("../wgsl/", $file)),
                include_str!("../wgsl/qmatmul.wgsl")
            ),
            decode: (concat!($name, "_decode"), $decode),
            matvec: concat!($name, "_matvec"),
            tiled: concat!($name, "_tiled"),
        }
    };
}

/// The affine kernels by the float kind of the scales (see `launch::float_kind`).
const AFFINE_KERNELS: [Kernels; 3] = [
    kernels!("affine_f32", "const KIND: u32 = 0u;", "affine.wgsl", "dequantize"),
    kernels!("affine_f16", "const KIND: u32 = 1u;", "affine.wgsl", "dequantize"),
    kernels!("affine_bf16", "const KIND: u32 = 2u;", "affine.wgsl", "dequantize"),
];

/// The kernels of one affine weight.
fn affine_kernels(scales: &Tensor<Gpu>, op: &'static str) -> Result<&'static Kernels> {
    Ok(&AFFINE_KERNELS[kind(scales, op)? as usize])
}

/// The seed kernels of SEED4 and SEED4P4.
const SEED4_KERNELS: Kernels = kernels!("seed4", "const COEFFICIENTS: u32 = 3u;", "seed.wgsl", "decode_blocks");
const SEED4P4_KERNELS: Kernels = kernels!("seed4p4", "const COEFFICIENTS: u32 = 4u;", "seed.wgsl", "decode_blocks");

fn seed_kernels(encoding: SeedEncoding) -> &'static Kernels {
    match encoding {
        SeedEncoding::Seed4 => &SEED4_KERNELS,
        SeedEncoding::Seed4P4 => &SEED4P4_KERNELS,
    }
}

/// The input of a product, `[.., k]` read as `[m, k]`, and its layer's bias.
struct Product<'a> {
    op: &'static str,
    x: Stream,
    m: usize,
    n: usize,
    k: usize,
    bias: Option<&'a Tensor<Gpu>>,
    /// The output's shape, `[.., n]`.
    shape: Vec<usize>,
}

impl<'a> Product<'a> {
    /// Checks `x` against a weight of `n` rows of width `k` and the layer's bias.
    fn new(
        op: &'static str,
        x: &Tensor<Gpu>,
        [n, k]: [usize; 2],
        bias: Option<&'a Tensor<Gpu>>,
        weight: &Tensor<Gpu>,
    ) -> Result<Product<'a>> {
        check_input(op, x, k, &[n, k])?;
        if let Some(bias) = bias {
            check_stream("bias", bias, bias.dtype(), &[n])?;
        }
        same_device(op, x, &[Some(weight), bias])?;
        let m = x.shape()[..x.rank() - 1].iter().product();
        let mut shape = x.shape().to_vec();
        *shape.last_mut().expect("`check_input` refuses rank 0") = n;
        // The kernels read f32 inputs, four at a time.
        let x = if x.dtype() == DType::F32 { x.clone() } else { x.to_dtype(DType::F32)? };
        Ok(Product { op, x: Stream::of(&x, op)?, m, n, k, bias, shape })
    }

    /// The `Product` block of the kernels' parameters.
    fn params(&self) -> Result<ProductParams> {
        let (op, gpu) = (self.op, self.x.tensor.device());
        let (bias_kind, bias_offset, bias_stride) = match self.bias {
            Some(bias) => {
                reach(gpu, op, bias.offset(), bias.shape(), bias.strides())?;
                (kind(bias, op)?, word(gpu, op, bias.offset())?, step(gpu, op, self.n, bias.strides()[0])?)
            }
            None => (ABSENT, 0, 0),
        };
        word(gpu, op, self.m * self.k)?;
        word(gpu, op, self.n * self.k)?;
        Ok(ProductParams {
            m: word(gpu, op, self.m)?,
            n: word(gpu, op, self.n)?,
            k: word(gpu, op, self.k)?,
            x_offset: self.x.offset,
            bias_kind,
            bias_offset,
            bias_stride,
            _pad: 0,
        })
    }

    /// Runs the product with the encoding's parameters (`params` completes them with the
    /// `Product` block) and stream bindings: `matvec` for a few input rows, the tiled kernel for
    /// more.
    fn run<P: Uniform>(
        &self,
        kernels: &Kernels,
        params: impl FnOnce(ProductParams) -> P,
        streams: &[Binding<'_>],
    ) -> Result<Tensor<Gpu>> {
        let gpu = self.x.tensor.device();
        let out = output(gpu, count(gpu, self.op, &self.shape)?)?;
        if self.m * self.n > 0 {
            let params = params(self.params()?);
            let x = self.x.binding();
            let bias = match self.bias {
                Some(bias) => storage(bias, self.op)?.into(),
                None => x,
            };
            let mut buffers = streams.to_vec();
            buffers.extend([(&out).into(), x, bias]);
            let (key, entry, groups) = if self.m <= MATVEC_INPUTS {
                (kernels.matvec, "matvec", self.n.div_ceil(MATVEC_FEATURES))
            } else {
                (kernels.tiled, "tiled", self.m.div_ceil(TILE.0) * self.n.div_ceil(TILE.1))
            };
            let invocations = u64::from(word(gpu, self.op, groups)?) * WORKGROUP;
            let params = bytemuck::bytes_of(&params);
            gpu.launch(&Launch { key, source: kernels.source, entry, params, buffers: &buffers, invocations })?;
        }
        Ok(gpu.tensor(Some(out), DType::F32, &self.shape))
    }
}

impl AffineWeight<Gpu> {
    /// The float weight, in the dtype of the scales, decoded on the device: equal bit for bit
    /// to the host's [`AffineWeight::dequantize`] (and so to MLX's `dequantize`).
    ///
    /// # Errors
    /// [`Error::QuantStream`](crate::Error::QuantStream) when the fields were replaced by
    /// streams that do not fit, [`Error::Meta`](crate::Error::Meta) for a meta stream;
    /// [`Error::Gpu`](crate::Error::Gpu) when a stream exceeds a storage binding or the device
    /// fails.
    pub fn dequantize(&self) -> Result<Tensor<Gpu>> {
        const OP: &str = "dequantize";
        let checked = AffineWeight::new(self.weight.clone(), self.scales.clone(), self.biases.clone(), self.spec())?;
        same_device(OP, &checked.weight, &[Some(&checked.scales), Some(&checked.biases)])?;
        let gpu = checked.weight.device();
        let (shape, dtype) = (checked.shape(), checked.dtype());
        let values = count(gpu, OP, &shape)?;
        let size = dtype.size_in_bytes().expect("scales are f32, f16 or bf16");
        let out = gpu.buffer((values * size) as u64, OP)?;
        if values > 0 {
            let [weight, scales, biases] =
                [&checked.weight, &checked.scales, &checked.biases].map(|stream| Stream::of(stream, OP));
            let (weight, scales, biases) = (weight?, scales?, biases?);
            // A decode leaves the `Product` block zero.
            let params = affine_params(OP, &checked, [&weight, &scales, &biases], values)?;
            let buffers = [weight.binding(), scales.binding(), biases.binding(), (&out).into()];
            let kernels = affine_kernels(&checked.scales, OP)?;
            let (key, entry) = kernels.decode;
            gpu.launch(&Launch {
                key,
                source: kernels.source,
                entry,
                params: bytemuck::bytes_of(&params),
                buffers: &buffers,
                invocations: (values / 8) as u64,
            })?;
        }
        Ok(gpu.tensor(Some(out), dtype, &shape))
    }
}

/// The parameters of an affine weight, with a zero `Product` block.
fn affine_params(
    op: &'static str,
    weight: &AffineWeight<Gpu>,
    [packed, scales, biases]: [&Stream; 3],
    values: usize,
) -> Result<AffineParams> {
    let spec = weight.spec();
    Ok(AffineParams {
        product: ProductParams::default(),
        count: word(packed.tensor.device(), op, values)?,
        bits: spec.bits,
        group: spec.group_size as u32,
        weight_offset: packed.offset,
        scales_offset: scales.offset,
        biases_offset: biases.offset,
        opaque: 0,
    })
}

impl QuantizedLinear<Gpu> {
    /// `y = x W^T + b` for `x` `[.., in]` of any float dtype on the same GPU, giving f32
    /// `[.., out]`. The packed weight is decoded inside the kernel (to MLX's values, as on
    /// the host) and never stored: one workgroup per 8 output features reduces each row for
    /// up to 4 input rows, and more rows are computed in tiles.
    ///
    /// # Errors
    /// [`Error::ShapeMismatch`](crate::Error::ShapeMismatch) when the last axis of `x` is not
    /// the input width, [`Error::NotFloat`](crate::Error::NotFloat) for a non-float input or
    /// bias, [`Error::QuantStream`](crate::Error::QuantStream),
    /// [`Error::Meta`](crate::Error::Meta); [`Error::Gpu`](crate::Error::Gpu) when an operand
    /// lives on another GPU or exceeds a storage binding, or the device fails.
    pub fn forward(&self, x: &impl OnDevice<Gpu>) -> Result<Tensor<Gpu>> {
        const OP: &str = "QuantizedLinear::forward";
        let affine = self.affine()?;
        same_device(OP, &affine.weight, &[Some(&affine.scales), Some(&affine.biases)])?;
        let (k, n) = (self.in_features(), self.out_features());
        let product = Product::new(OP, x.on_device(), [n, k], self.bias.as_ref(), &affine.weight)?;
        let [weight, scales, biases] =
            [&affine.weight, &affine.scales, &affine.biases].map(|stream| Stream::of(stream, OP));
        let (weight, scales, biases) = (weight?, scales?, biases?);
        let params = affine_params(OP, &affine, [&weight, &scales, &biases], n * k)?;
        let kernels = affine_kernels(&affine.scales, OP)?;
        let params = |product| AffineParams { product, ..params };
        product.run(kernels, params, &[weight.binding(), scales.binding(), biases.binding()])
    }

    /// The dequantized weight `[out, in]` in the dtype of the scales, decoded on the device
    /// (as `AffineWeight<Gpu>::dequantize`).
    ///
    /// # Errors
    /// As [`QuantizedLinear::affine`] and `AffineWeight<Gpu>::dequantize`.
    pub fn dequantize(&self) -> Result<Tensor<Gpu>> {
        self.affine()?.dequantize()
    }
}

/// The streams of a seed weight and its parameters, with a zero `Product` block.
struct SeedStreams {
    seeds: Stream,
    coefficients: Stream,
    exp_bias: Stream,
    codes: Option<Stream>,
    params: SeedParams,
}

impl SeedStreams {
    /// The streams of `weight`, for decoding `blocks` blocks or for a product starting at the
    /// flat row `first_row`.
    fn of(weight: &SeedWeight<Gpu>, op: &'static str, blocks: usize, first_row: usize) -> Result<SeedStreams> {
        let gpu = weight.seeds.device();
        let codes = weight.codes.as_ref();
        same_device(op, &weight.seeds, &[Some(&weight.coefficients), Some(&weight.exp_bias), codes])?;
        let seeds = Stream::of(&weight.seeds, op)?;
        let coefficients = Stream::of(&weight.coefficients, op)?;
        let exp_bias = Stream::of(&weight.exp_bias, op)?;
        let codes = codes.map(|codes| Stream::of(codes, op)).transpose()?;
        let [_, rows, columns] = weight.shape();
        let params = SeedParams {
            product: ProductParams::default(),
            blocks: word(gpu, op, blocks)?,
            rows: word(gpu, op, rows)?,
            row_blocks: word(gpu, op, columns / 8)?,
            first_row: word(gpu, op, first_row)?,
            seeds_offset: seeds.offset,
            coefficients_offset: coefficients.offset,
            exp_bias_offset: exp_bias.offset,
            codes_offset: codes.as_ref().map_or(0, |codes| codes.offset),
        };
        Ok(SeedStreams { seeds, coefficients, exp_bias, codes, params })
    }

    /// The stream bindings; SEED4 has no codes and binds the seeds in their place (never read).
    fn bindings(&self) -> [Binding<'_>; 4] {
        let codes = self.codes.as_ref().unwrap_or(&self.seeds);
        [self.seeds.binding(), self.coefficients.binding(), self.exp_bias.binding(), codes.binding()]
    }
}

/// The weight's streams checked against each other again (the fields are public).
fn checked(weight: &SeedWeight<Gpu>) -> Result<SeedWeight<Gpu>> {
    SeedWeight::new(
        weight.encoding,
        weight.seeds.clone(),
        weight.coefficients.clone(),
        weight.exp_bias.clone(),
        weight.codes.clone(),
    )
}

impl SeedWeight<Gpu> {
    /// The decoded weight, BF16 `[slices, rows, columns]`, decoded on the device: equal bit for
    /// bit to the host's [`SeedWeight::decode`] (and so to the reference decoder).
    ///
    /// # Errors
    /// [`Error::QuantStream`](crate::Error::QuantStream) when the fields were replaced by
    /// streams that do not fit, [`Error::Meta`](crate::Error::Meta) for a meta stream;
    /// [`Error::Gpu`](crate::Error::Gpu) when a stream exceeds a storage binding or the device
    /// fails.
    pub fn decode(&self) -> Result<Tensor<Gpu>> {
        const OP: &str = "SeedWeight::decode";
        let weight = checked(self)?;
        let gpu = weight.seeds.device();
        let shape = weight.shape();
        let values = count(gpu, OP, &shape)?;
        let out = gpu.buffer(values as u64 * 2, OP)?;
        let blocks = values / 8;
        if blocks > 0 {
            let streams = SeedStreams::of(&weight, OP, blocks, 0)?;
            // A decode leaves the `Product` block zero.
            let params = streams.params;
            let [seeds, coefficients, exp_bias, codes] = streams.bindings();
            let buffers = [seeds, coefficients, exp_bias, codes, (&out).into()];
            let kernels = seed_kernels(weight.encoding);
            let (key, entry) = kernels.decode;
            gpu.launch(&Launch {
                key,
                source: kernels.source,
                entry,
                params: bytemuck::bytes_of(&params),
                buffers: &buffers,
                invocations: blocks as u64,
            })?;
        }
        Ok(gpu.tensor(Some(out), DType::BF16, &shape))
    }
}

impl SeedLinear<Gpu> {
    /// `y = x W^T + b` for a one-slice weight; see
    /// `SeedLinear<Gpu>::forward_slice`.
    ///
    /// # Errors
    /// [`Error::BadShape`](crate::Error::BadShape) when the weight has more than one slice, and
    /// as `forward_slice`.
    pub fn forward(&self, x: &impl OnDevice<Gpu>) -> Result<Tensor<Gpu>> {
        check_one_slice(self.weight.shape())?;
        self.forward_slice(x, 0)
    }

    /// `y = x W_s^T + b` with slice (expert) `slice` of the weight, for `x` `[.., in]` of any
    /// float dtype on the same GPU, giving f32 `[.., out]`. The blocks are decoded (to the
    /// reference decoder's values, as on the host) inside the kernel and never stored.
    ///
    /// # Errors
    /// [`Error::ShapeMismatch`](crate::Error::ShapeMismatch) for another input width,
    /// [`Error::NarrowOutOfRange`](crate::Error::NarrowOutOfRange) for a slice past the last,
    /// [`Error::NotFloat`](crate::Error::NotFloat), [`Error::QuantStream`](crate::Error::QuantStream),
    /// [`Error::Meta`](crate::Error::Meta); [`Error::Gpu`](crate::Error::Gpu) when an operand
    /// lives on another GPU or exceeds a storage binding, or the device fails.
    pub fn forward_slice(&self, x: &impl OnDevice<Gpu>, slice: usize) -> Result<Tensor<Gpu>> {
        const OP: &str = "SeedLinear::forward";
        let weight = checked(&self.weight)?;
        let shape = weight.shape();
        check_slice(slice, shape)?;
        let (n, k) = (shape[1], shape[2]);
        let product = Product::new(OP, x.on_device(), [n, k], self.bias.as_ref(), &weight.seeds)?;
        let streams = SeedStreams::of(&weight, OP, 0, slice * n)?;
        let params = |product| SeedParams { product, ..streams.params };
        product.run(seed_kernels(weight.encoding), params, &streams.bindings())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::test_gpu;

    #[test]
    fn parameter_blocks_match_the_shaders() {
        for kernels in AFFINE_KERNELS.iter().chain([&SEED4_KERNELS, &SEED4P4_KERNELS]) {
            crate::gpu::launch::assert_layout::<ProductParams>(kernels.source, "Product");
        }
        crate::gpu::launch::assert_layout::<AffineParams>(AFFINE_KERNELS[0].source, "Params");
        crate::gpu::launch::assert_layout::<SeedParams>(SEED4_KERNELS.source, "Params");
    }
    use crate::kernels::testing::random;
    use crate::nn::{Init, Linear};
    use crate::quant::{AFFINE_BITS, AFFINE_GROUP_SIZES, AffineSpec, EncodeOptions, pack_seed_codes};
    use crate::{Error, Host, Module};

    /// The bytes of a host tensor.
    fn bytes(tensor: &Tensor) -> Vec<u8> {
        tensor.to_bytes().unwrap().into_owned()
    }

    /// Asserts `found` within `1e-4 * (1 + |expected|)` of `expected` (f32 results).
    fn close(what: &str, found: &Tensor<Gpu>, expected: &Tensor) {
        assert_eq!(found.shape(), expected.shape(), "{what}: shapes");
        assert_eq!(found.dtype(), DType::F32, "{what}: dtype");
        let (found, expected) = (found.to_f32_vec().unwrap(), expected.to_f32_vec().unwrap());
        for (index, (f, e)) in found.iter().zip(&expected).enumerate() {
            let tolerance = 1e-4 * (1.0 + e.abs());
            assert!((f - e).abs() <= tolerance, "{what}: element {index}: gpu {f}, host {e}");
        }
    }

    /// Weights whose groups spread over different ranges, with exact zeros and a constant
    /// group, so that scales of both signs and `q0 = 0` occur.
    fn weight_values(rows: usize, columns: usize, seed: u64) -> Tensor {
        let noise = random(&[rows, columns], seed).to_vec::<f32>().unwrap();
        let values: Vec<f32> = noise
            .iter()
            .enumerate()
            .map(|(at, &v)| match (at / 32) % 5 {
                0 => v * 0.03,
                1 => v * 4.0 + 1.0,
                2 => 0.25,
                3 => v.abs() * 1e-3,
                _ => -v.abs() * 2.0,
            })
            .collect();
        Tensor::from_vec(values, &[rows, columns]).unwrap()
    }

    #[test]
    fn affine_dequantize_equals_the_host_for_every_width_group_and_dtype() {
        let Some(gpu) = test_gpu() else { return };
        let source = weight_values(6, 384, 1);
        for dtype in [DType::F32, DType::BF16, DType::F16] {
            let source = source.to_dtype(dtype).unwrap();
            for bits in AFFINE_BITS {
                for group in AFFINE_GROUP_SIZES {
                    let host = AffineWeight::quantize(&source, AffineSpec::new(bits, group).unwrap()).unwrap();
                    let placed = host.place(&gpu).unwrap();
                    assert_eq!(placed.weight.dtype(), DType::U32);
                    let ours = placed.dequantize().unwrap();
                    let expected = host.dequantize().unwrap();
                    assert_eq!((ours.dtype(), ours.shape()), (expected.dtype(), expected.shape()));
                    assert!(
                        bytes(&ours.to_host().unwrap()) == bytes(&expected),
                        "{dtype} q{bits}g{group}: the GPU dequantizes differently"
                    );
                }
            }
        }
        // The values tell a fused multiply-add apart: with one, some 8-bit f32 values differ.
        let host = AffineWeight::quantize(&source, AffineSpec::new(8, 32).unwrap()).unwrap();
        let (scales, biases) = (host.scales.to_vec::<f32>().unwrap(), host.biases.to_vec::<f32>().unwrap());
        let fused = bytes(&host.weight)
            .iter()
            .enumerate()
            .filter(|&(at, &q)| {
                let (q, scale, bias) = (f32::from(q), scales[at / 32], biases[at / 32]);
                q.mul_add(scale, bias) != q * scale + bias
            })
            .count();
        assert!(fused > 0, "no value depends on the product's rounding");
    }

    #[test]
    fn affine_dequantize_reads_views_and_batches() {
        let Some(gpu) = test_gpu() else { return };
        let source = weight_values(2 * 5, 128, 2).reshape(&[2, 5, 128]).unwrap().to_dtype(DType::BF16).unwrap();
        let host = AffineWeight::quantize(&source, AffineSpec::new(5, 32).unwrap()).unwrap();
        let expected = bytes(&host.dequantize().unwrap());
        assert!(bytes(&host.place(&gpu).unwrap().dequantize().unwrap().to_host().unwrap()) == expected);
        // Rows 2..5 of the second matrix, as views into larger buffers on the device.
        fn narrow<D: crate::Device>(tensor: &Tensor<D>) -> Tensor<D> {
            tensor.narrow(0, 1, 1).unwrap().narrow(1, 2, 3).unwrap()
        }
        let view =
            AffineWeight::new(narrow(&host.weight), narrow(&host.scales), narrow(&host.biases), host.spec()).unwrap();
        let up = |tensor: &Tensor| narrow(&tensor.to_device(&gpu).unwrap());
        let device = AffineWeight::new(up(&host.weight), up(&host.scales), up(&host.biases), host.spec()).unwrap();
        assert!(bytes(&device.dequantize().unwrap().to_host().unwrap()) == bytes(&view.dequantize().unwrap()));
    }

    fn x(rows: usize, width: usize, seed: u64) -> Tensor {
        random(&[rows, width], seed)
    }

    #[test]
    fn quantized_matmul_is_close_to_the_host_for_few_and_many_rows() {
        let Some(gpu) = test_gpu() else { return };
        for (at, (bits, group, rows, width, out, bias)) in [
            (4, 64, 1, 256, 40, true),
            (3, 32, 2, 96, 9, false),
            (5, 128, 4, 384, 17, true),
            (6, 32, 5, 160, 70, true),
            (8, 64, 33, 192, 65, false),
            (2, 128, 70, 128, 130, true),
        ]
        .into_iter()
        .enumerate()
        {
            let seed = at as u64;
            let linear = Linear::builder(width, out).bias(bias).init(Init::Seeded(seed)).build();
            for dtype in [DType::F32, DType::BF16, DType::F16] {
                let linear = Linear {
                    weight: linear.weight.to_dtype(dtype).unwrap(),
                    bias: linear.bias.as_ref().map(|bias| bias.to_dtype(dtype).unwrap()),
                };
                let host = QuantizedLinear::from_linear(&linear, bits, group).unwrap();
                let device = host.place(&gpu).unwrap();
                let input = x(rows, width, 100 + seed);
                let what = format!("q{bits}g{group} {dtype} {rows}x{width}x{out}");
                close(&what, &device.forward(&input.to_device(&gpu).unwrap()).unwrap(), &host.forward(&input).unwrap());
            }
        }
    }

    #[test]
    fn quantized_matmul_takes_batches_half_inputs_and_checks_widths() {
        let Some(gpu) = test_gpu() else { return };
        let linear = Linear::builder(64, 12).init(Init::Seeded(7)).build();
        let host = QuantizedLinear::from_linear(&linear, 4, 32).unwrap();
        let device = host.place(&gpu).unwrap();
        let input = random(&[2, 3, 64], 8);
        for dtype in [DType::F32, DType::BF16, DType::F16] {
            let input = input.to_dtype(dtype).unwrap();
            let found = device.forward(&input.to_device(&gpu).unwrap()).unwrap();
            close(&format!("batched {dtype}"), &found, &host.forward(&input).unwrap());
        }
        // A strided input is gathered first.
        let wide = random(&[3, 80], 9);
        let view = wide.narrow(1, 10, 64).unwrap();
        let found = device.forward(&wide.to_device(&gpu).unwrap().narrow(1, 10, 64).unwrap()).unwrap();
        close("strided input", &found, &host.forward(&view).unwrap());
        let narrow = Tensor::zeros(DType::F32, &[2, 32]).to_device(&gpu).unwrap();
        assert!(matches!(device.forward(&narrow), Err(Error::ShapeMismatch { .. })));
        let ints = Tensor::zeros(DType::I32, &[2, 64]).to_device(&gpu).unwrap();
        assert!(matches!(device.forward(&ints), Err(Error::NotFloat { .. })));
        let meta = QuantizedLinear::meta(64, 12, false, host.spec, DType::BF16).unwrap().place(&gpu).unwrap();
        assert!(meta.weight.is_meta());
        let input = Tensor::zeros(DType::F32, &[1, 64]).to_device(&gpu).unwrap();
        assert!(matches!(meta.forward(&input), Err(Error::Meta { .. })));
        // The dequantized layer on the device is the host's.
        let dense = device.to_linear(DType::F32).unwrap();
        assert!(bytes(&dense.weight.to_host().unwrap()) == bytes(&host.to_linear(DType::F32).unwrap().weight));
    }

    /// A seed weight with random streams (decoding costs and checks the same for any values),
    /// exponent codes over the whole range and a different bias per slice.
    fn seed_weight(encoding: SeedEncoding, [slices, rows, columns]: [usize; 3], seed: u64) -> SeedWeight {
        let blocks = slices * rows * columns / 8;
        let bits = random(&[2 * blocks], seed).to_vec::<f32>().unwrap();
        let word = |at: usize| (bits[at].to_bits() >> 3) as u16;
        let seeds: Vec<u16> = (0..blocks).map(|g| word(g).max(1)).collect();
        let words: Vec<u16> = (0..blocks).map(|g| word(blocks + g)).collect();
        let exp_bias: Vec<i32> = (0..slices as i32).map(|s| -24 + 5 * s).collect();
        let shape = [slices, rows, columns / 8];
        let codes = (encoding == SeedEncoding::Seed4P4).then(|| {
            let codes: Vec<u8> = (0..blocks).map(|g| (g * 7 % 16) as u8).collect();
            Tensor::from_vec(pack_seed_codes(&codes), &[slices, rows, columns / 16]).unwrap()
        });
        SeedWeight::new(
            encoding,
            Tensor::from_vec(seeds, &shape).unwrap(),
            Tensor::from_vec(words, &shape).unwrap(),
            Tensor::from_vec(exp_bias, &[slices]).unwrap(),
            codes,
        )
        .unwrap()
    }

    #[test]
    fn seed_decode_equals_the_host() {
        let Some(gpu) = test_gpu() else { return };
        for encoding in [SeedEncoding::Seed4, SeedEncoding::Seed4P4] {
            for (at, shape) in [[1, 1, 16], [1, 5, 48], [3, 7, 160]].into_iter().enumerate() {
                let host = seed_weight(encoding, shape, at as u64);
                let placed = host.place(&gpu).unwrap();
                assert_eq!(placed.seeds.dtype(), DType::U16);
                let ours = placed.decode().unwrap();
                assert_eq!((ours.dtype(), ours.shape()), (DType::BF16, &shape[..]));
                assert!(
                    bytes(&ours.to_host().unwrap()) == bytes(&host.decode().unwrap()),
                    "{} {shape:?}: the GPU decodes differently",
                    encoding.name()
                );
            }
        }
        // An encoded block too, and exponents at the ends of the range.
        let source = random(&[2, 16], 3);
        let encoded = SeedWeight::encode(&source, SeedEncoding::Seed4P4, &EncodeOptions::default()).unwrap();
        assert!(
            bytes(&encoded.place(&gpu).unwrap().decode().unwrap().to_host().unwrap())
                == bytes(&encoded.decode().unwrap())
        );
        for bias in [-140, -127, -126, 120, i32::MAX - 3] {
            let mut weight = seed_weight(SeedEncoding::Seed4, [1, 2, 16], 4);
            weight.exp_bias = Tensor::from_vec(vec![bias], &[1]).unwrap();
            let host = bytes(&weight.decode().unwrap());
            assert!(bytes(&weight.place(&gpu).unwrap().decode().unwrap().to_host().unwrap()) == host, "bias {bias}");
        }
    }

    #[test]
    fn seed_matmul_is_close_to_the_host_for_every_slice() {
        let Some(gpu) = test_gpu() else { return };
        for encoding in [SeedEncoding::Seed4, SeedEncoding::Seed4P4] {
            for (at, (shape, rows, bias)) in
                [([1, 9, 48], 1, true), ([3, 20, 160], 3, false), ([2, 70, 80], 37, true)].into_iter().enumerate()
            {
                let weight = seed_weight(encoding, shape, 10 + at as u64);
                let bias = bias.then(|| random(&[shape[1]], 20 + at as u64).to_dtype(DType::BF16).unwrap());
                let host = SeedLinear::new(weight, bias).unwrap();
                let device = host.place(&gpu).unwrap();
                let input = x(rows, shape[2], 30 + at as u64);
                let on_device = input.to_device(&gpu).unwrap();
                for slice in 0..shape[0] {
                    let what = format!("{} {shape:?} x {rows} rows, slice {slice}", encoding.name());
                    close(
                        &what,
                        &device.forward_slice(&on_device, slice).unwrap(),
                        &host.forward_slice(&input, slice).unwrap(),
                    );
                }
                assert!(matches!(
                    device.forward_slice(&on_device, shape[0]),
                    Err(Error::NarrowOutOfRange { start, .. }) if start == shape[0]
                ));
                if shape[0] == 1 {
                    close("forward", &device.forward(&on_device).unwrap(), &host.forward(&input).unwrap());
                } else {
                    assert!(matches!(device.forward(&on_device), Err(Error::BadShape { .. })));
                }
                let narrow = Tensor::zeros(DType::F32, &[rows, shape[2] + 8]).to_device(&gpu).unwrap();
                assert!(matches!(device.forward_slice(&narrow, 0), Err(Error::ShapeMismatch { .. })));
            }
        }
    }

    /// The path and dtype of every tensor of a walk.
    fn entries<D: crate::Device, M: Module<D>>(module: &M) -> Vec<(String, DType)> {
        let mut entries = Vec::new();
        crate::for_each_entry(module, |slot, tensor| entries.push((slot.name.to_string(), tensor.dtype())));
        entries
    }

    #[test]
    fn placed_layers_keep_their_streams_packed_under_their_names() {
        let Some(gpu) = test_gpu() else { return };
        let linear = Linear::builder(64, 8).init(Init::Seeded(1)).build();
        let host = QuantizedLinear::from_linear(&linear, 4, 64).unwrap();
        let device = host.place(&gpu).unwrap();
        let expected = [("weight", DType::U32), ("scales", DType::F32), ("biases", DType::F32), ("bias", DType::F32)]
            .map(|(name, dtype)| (name.to_string(), dtype));
        assert_eq!(entries::<Host, _>(&host), expected);
        assert_eq!(entries::<Gpu, _>(&device), expected);
        assert_eq!(host.flat_state_dict().keys().collect::<Vec<_>>(), ["weight", "scales", "biases", "bias"]);
        let seed = SeedLinear::new(seed_weight(SeedEncoding::Seed4P4, [1, 4, 32], 2), None).unwrap();
        let expected = [("seeds", DType::U16), ("coefs", DType::U16), ("exp_bias", DType::I32), ("codes", DType::U8)]
            .map(|(name, dtype)| (name.to_string(), dtype));
        assert_eq!(entries::<Gpu, _>(&seed.place(&gpu).unwrap()), expected);
    }
}
