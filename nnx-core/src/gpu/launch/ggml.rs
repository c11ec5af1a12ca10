//! ggml block weights on the GPU (`ggml.wgsl`): [`GgmlLinear<Gpu>`] keeps the blocks as GGUF
//! stores them (U8 `[out, row_bytes]`, bound as a buffer of u32 words and read byte by byte
//! there, since no block is aligned) and decodes them inside its kernels.
//!
//! `dequantize` gives the host's f32 values bit for bit (see `ggml.wgsl` for why no adapter's
//! float behaviour can change them). Products decode each weight value to f32 in registers and
//! accumulate in f32 (`qmatmul.wgsl`, shared with the MLX and SEED weights), so they differ from
//! the host's dense f32 product only by the order of the sums; the host's packed product
//! quantizes activations to 8 bits first and is further off.

use std::sync::LazyLock;

use super::quant::ProductParams;
use super::{ABSENT, count, kind, output, reach, same_device, step, storage, uniform, word};
use crate::error::{Error, Result};
use crate::gpu::Gpu;
use crate::gpu::dispatch::{Binding, Launch};
use crate::quant::check_input;
use crate::quant::ggml::{GgmlLinear, GgmlType};
use crate::{DType, OnDevice, Tensor};

/// Input rows up to which a product runs as `matvec` (one decode of each weight unit for all
/// of them); more rows take the tiled kernel. Both as in `qmatmul.wgsl`.
const MATVEC_INPUTS: usize = 4;
/// Output features per `matvec` workgroup.
const MATVEC_FEATURES: usize = 8;
/// The output tile of the tiled kernel, rows by features.
const TILE: (usize, usize) = (32, 64);
/// Invocations per workgroup (see `dispatch::WORKGROUP`).
const WORKGROUP: u64 = crate::gpu::dispatch::WORKGROUP as u64;

/// Names the types the GPU decodes, for the error of one it does not.
const SUPPORTED: &str = "the GPU decodes F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, \
                         IQ4_NL, IQ4_XS and MXFP4: decode other types on the host (`GgmlLinear::to_linear`) and place \
                         the float layer";

uniform! {
    /// The parameters of `ggml.wgsl`.
    struct GgmlParams {
        /// Zero in decodes.
        product: ProductParams,
        /// Decode: units of 8 values, `out * ceil(in / 8)`.
        units: u32,
        /// Values per row (the input width).
        columns: u32,
        /// Bytes per row.
        row_bytes: u32,
        /// The byte of the buffer where the first row starts.
        weight_offset: u32,
    }
}

/// The kernels of one type: the type and its pipeline keys (its source is at the same index of
/// [`SOURCES`]).
struct Kernels {
    ty: GgmlType,
    decode: &'static str,
    matvec: &'static str,
    tiled: &'static str,
}

macro_rules! kernels {
    ($($ty:ident: $name:literal),* $(,)?) => {
        [$(Kernels {
            ty: GgmlType::$ty,
            decode: concat!("ggml_", $name, "_decode"),
            matvec: concat!("ggml_", $name, "_matvec"),
            tiled: concat!("ggml_", $name, "_tiled"),
        }),*]
    };
}

/// Every type the GPU decodes.
const KERNELS: [Kernels; 16] = kernels!(
    F32: "f32", F16: "f16", BF16: "bf16",
    Q4_0: "q4_0", Q4_1: "q4_1", Q5_0: "q5_0", Q5_1: "q5_1", Q8_0: "q8_0",
    Q2_K: "q2_k", Q3_K: "q3_k", Q4_K: "q4_k", Q5_K: "q5_k", Q6_K: "q6_k",
    IQ4_NL: "iq4_nl", IQ4_XS: "iq4_xs", MXFP4: "mxfp4",
);

/// What every type's source shares after its constants.
const BODY: &str = concat!(
    include_str!("../wgsl/prelude.wgsl"),
    include_str!("../wgsl/float.wgsl"),
    include_str!("../wgsl/quant.wgsl"),
    include_str!("../wgsl/ggml.wgsl"),
    include_str!("../wgsl/qmatmul.wgsl"),
);

/// Each type's source: its ggml id, values per block and bytes per block as constants, so that
/// the shader compiler folds away the other types' decoders; built once, in [`KERNELS`] order.
static SOURCES: LazyLock<Vec<String>> = LazyLock::new(|| {
    KERNELS
        .iter()
        .map(|kernels| {
            let ty = kernels.ty;
            format!(
                "const GGML: u32 = {}u;\nconst BLOCK: u32 = {}u;\nconst TYPE_SIZE: u32 = {}u;\n{BODY}",
                ty.id(),
                ty.block_size(),
                ty.type_size()
            )
        })
        .collect()
});

/// The kernels and source of `ty`.
fn kernels(ty: GgmlType, op: &'static str) -> Result<(&'static Kernels, &'static str)> {
    match KERNELS.iter().position(|kernels| kernels.ty == ty) {
        Some(at) => Ok((&KERNELS[at], SOURCES[at].as_str())),
        None => Err(Error::GgmlUnsupported { op, ty: ty.name(), hint: SUPPORTED }),
    }
}

/// A layer's blocks as the kernels read them: contiguous, with their parameters (a zero
/// `Product` block).
struct Blocks {
    tensor: Tensor<Gpu>,
    params: GgmlParams,
}

impl Blocks {
    /// The blocks of `layer` checked again (its fields are public) against its type and width.
    fn of(layer: &GgmlLinear<Gpu>, op: &'static str) -> Result<Blocks> {
        let layer = GgmlLinear::new(layer.weight.clone(), layer.bias.clone(), layer.ty, layer.in_features)?;
        let tensor = layer.weight.contiguous()?;
        let gpu = tensor.device();
        storage(&tensor, op)?;
        reach(gpu, op, tensor.offset(), tensor.shape(), tensor.strides())?;
        let (n, k) = (layer.out_features(), layer.in_features);
        let params = GgmlParams {
            product: ProductParams::default(),
            units: word(gpu, op, n * k.div_ceil(8))?,
            columns: word(gpu, op, k)?,
            row_bytes: word(gpu, op, tensor.shape()[1])?,
            weight_offset: word(gpu, op, tensor.offset())?,
        };
        Ok(Blocks { tensor, params })
    }

    fn binding(&self) -> Binding<'_> {
        self.tensor.buffer().expect("`Blocks::of` checked the buffer").into()
    }
}

impl GgmlLinear<Gpu> {
    /// The weight decoded on the device to f32 `[out, in]`: equal bit for bit to the host's
    /// [`GgmlLinear::dequantize`] (and so to the `gguf` package's decoding).
    ///
    /// # Errors
    /// [`Error::GgmlUnsupported`] for a type the GPU does not decode (the message lists those
    /// it does); [`Error::GgmlRow`] when the fields were replaced by blocks that do not fit,
    /// [`Error::Meta`] for a meta weight; [`Error::Gpu`] when the blocks exceed a storage
    /// binding or the device fails.
    pub fn dequantize(&self) -> Result<Tensor<Gpu>> {
        const OP: &str = "GgmlLinear::dequantize";
        let (kernels, source) = kernels(self.ty, OP)?;
        let blocks = Blocks::of(self, OP)?;
        let gpu = blocks.tensor.device();
        let shape = [self.out_features(), self.in_features];
        let out = output(gpu, count(gpu, OP, &shape)?)?;
        if blocks.params.units > 0 {
            let buffers = [blocks.binding(), (&out).into()];
            gpu.launch(&Launch {
                key: kernels.decode,
                source,
                entry: "dequantize",
                params: bytemuck::bytes_of(&blocks.params),
                buffers: &buffers,
                invocations: u64::from(blocks.params.units),
            })?;
        }
        Ok(gpu.tensor(Some(out), DType::F32, &shape))
    }

    /// `y = x W^T + b` for `x` `[.., in]` of any float dtype on the same GPU, giving f32
    /// `[.., out]`. The blocks are decoded inside the kernel (to the values `dequantize`
    /// gives) and never stored: one workgroup per 8 output features for up to 4 input rows
    /// (decoding), tiles of 32 rows by 64 features for more (prefill). Sums are f32 in another
    /// order than the host's, and activations are not quantized as in the host's packed product.
    ///
    /// A plain F32, F16 or BF16 weight whose width is not a multiple of 8 (the kernels' unit)
    /// is decoded and multiplied as a float weight instead.
    ///
    /// # Errors
    /// [`Error::GgmlUnsupported`] for a type the GPU does not decode;
    /// [`Error::ShapeMismatch`] when the last axis of `x` is not the input width,
    /// [`Error::NotFloat`] for a non-float input or bias, [`Error::GgmlRow`], [`Error::Meta`];
    /// [`Error::Gpu`] when an operand lives on another GPU or exceeds a storage binding, or the
    /// device fails.
    pub fn forward(&self, x: &impl OnDevice<Gpu>) -> Result<Tensor<Gpu>> {
        const OP: &str = "GgmlLinear::forward";
        let x = x.on_device();
        let (kernels, source) = kernels(self.ty, OP)?;
        let (n, k) = (self.out_features(), self.in_features);
        check_input(OP, x, k, &[n, k])?;
        let blocks = Blocks::of(self, OP)?;
        let bias = self.bias.as_ref();
        same_device(OP, x, &[Some(&blocks.tensor), bias])?;
        if !k.is_multiple_of(8) {
            return x.linear(&self.dequantize()?, bias);
        }
        let gpu = x.device();
        let m: usize = x.shape()[..x.rank() - 1].iter().product();
        let mut shape = x.shape().to_vec();
        *shape.last_mut().expect("`check_input` refuses rank 0") = n;
        let out = output(gpu, count(gpu, OP, &shape)?)?;
        if m * n > 0 {
            // The kernels read contiguous f32 inputs.
            let x = if x.dtype() == DType::F32 { x.contiguous()? } else { x.to_dtype(DType::F32)?.contiguous()? };
            reach(gpu, OP, x.offset(), x.shape(), x.strides())?;
            word(gpu, OP, m * k)?;
            let (bias_kind, bias_offset, bias_stride) = match bias {
                Some(bias) => {
                    reach(gpu, OP, bias.offset(), bias.shape(), bias.strides())?;
                    (kind(bias, OP)?, word(gpu, OP, bias.offset())?, step(gpu, OP, n, bias.strides()[0])?)
                }
                None => (ABSENT, 0, 0),
            };
            let params = GgmlParams {
                product: ProductParams {
                    m: word(gpu, OP, m)?,
                    n: word(gpu, OP, n)?,
                    k: word(gpu, OP, k)?,
                    x_offset: word(gpu, OP, x.offset())?,
                    bias_kind,
                    bias_offset,
                    bias_stride,
                    _pad: 0,
                },
                ..blocks.params
            };
            let x_binding: Binding<'_> = storage(&x, OP)?.into();
            let bias_binding = match bias {
                Some(bias) => storage(bias, OP)?.into(),
                None => x_binding,
            };
            let buffers = [blocks.binding(), (&out).into(), x_binding, bias_binding];
            let (key, entry, groups) = if m <= MATVEC_INPUTS {
                (kernels.matvec, "matvec", n.div_ceil(MATVEC_FEATURES))
            } else {
                (kernels.tiled, "tiled", m.div_ceil(TILE.0) * n.div_ceil(TILE.1))
            };
            let invocations = u64::from(word(gpu, OP, groups)?) * WORKGROUP;
            let params = bytemuck::bytes_of(&params);
            gpu.launch(&Launch { key, source, entry, params, buffers: &buffers, invocations })?;
        }
        Ok(gpu.tensor(Some(out), DType::F32, &shape))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Host;
    use crate::gpu::test_gpu;
    use crate::kernels::testing::random;
    use crate::nn::Linear;

    #[test]
    fn parameter_blocks_match_the_shaders() {
        for source in SOURCES.iter() {
            crate::gpu::launch::assert_layout::<ProductParams>(source, "Product");
            crate::gpu::launch::assert_layout::<GgmlParams>(source, "Params");
        }
    }

    /// The types the GPU decodes.
    fn types() -> impl Iterator<Item = GgmlType> {
        KERNELS.iter().map(|kernels| kernels.ty)
    }

    /// Weights spread over different ranges per 32 values, with exact zeros, so that scales of
    /// both signs, zero scales and mins occur.
    fn weight_values(rows: usize, columns: usize, seed: u64) -> Tensor {
        let noise = random(&[rows, columns], seed).to_vec::<f32>().unwrap();
        let values: Vec<f32> = noise
            .iter()
            .enumerate()
            .map(|(at, &v)| match (at / 32) % 6 {
                0 => v * 0.03,
                1 => v * 4.0 + 1.0,
                2 => 0.0,
                3 => v.abs() * 1e-3,
                4 => -v.abs() * 2.0,
                _ => v * 300.0,
            })
            .collect();
        Tensor::from_vec(values, &[rows, columns]).unwrap()
    }

    /// A layer of `ty` quantized from a seeded float layer by the host's reference quantizer.
    fn quantized(ty: GgmlType, [out, width]: [usize; 2], bias: bool, seed: u64) -> GgmlLinear {
        let linear = Linear { weight: weight_values(out, width, seed), bias: bias.then(|| random(&[out], seed + 1)) };
        GgmlLinear::from_linear(&linear, ty).unwrap()
    }

    /// The byte offsets of a block's f16 fields, per type (every value for F16).
    fn f16_fields(ty: GgmlType) -> &'static [usize] {
        use GgmlType as T;
        match ty {
            T::F16 => &[0],
            T::Q4_0 | T::Q5_0 | T::Q8_0 | T::IQ4_NL | T::IQ4_XS => &[0],
            T::Q4_1 | T::Q5_1 | T::Q4_K | T::Q5_K => &[0, 2],
            T::Q2_K => &[80, 82],
            T::Q3_K => &[108],
            T::Q6_K => &[208],
            _ => &[],
        }
    }

    /// Random blocks of `ty` whose f16 scales are finite (any other bits, subnormal scales
    /// included); plain types keep every bit pattern, NaN and infinity included, since they
    /// decode without arithmetic.
    fn random_blocks(ty: GgmlType, [out, width]: [usize; 2], seed: u64) -> GgmlLinear {
        let row_bytes = ty.row_bytes(width).unwrap();
        // splitmix64, a byte per step.
        let mut state = seed;
        let mut bytes: Vec<u8> = (0..out * row_bytes)
            .map(|_| {
                state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
                let mut z = state;
                z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
                ((z ^ (z >> 31)) >> 56) as u8
            })
            .collect();
        if ty.is_quantized() {
            for block in bytes.chunks_exact_mut(ty.type_size()) {
                for &at in f16_fields(ty) {
                    // An exponent of all ones (infinity, NaN) loses its top bit.
                    if block[at + 1] & 0x7C == 0x7C {
                        block[at + 1] &= !0x40;
                    }
                }
                if ty == GgmlType::MXFP4 {
                    // E8M0 exponents whose values stay finite and normal: 2^-125 .. 2^72.
                    block[0] = 2 + block[0] % 199;
                }
            }
        }
        GgmlLinear::new(Tensor::from_vec(bytes, &[out, row_bytes]).unwrap(), None, ty, width).unwrap()
    }

    /// The bytes of a host tensor.
    fn bytes(tensor: &Tensor) -> Vec<u8> {
        tensor.to_bytes().unwrap().into_owned()
    }

    /// Asserts the device's decoding has the host's bits.
    fn decodes_as_the_host(what: &str, host: &GgmlLinear, gpu: &Gpu) {
        let expected = host.dequantize().unwrap();
        let found = host.place(gpu).unwrap().dequantize().unwrap();
        assert_eq!((found.dtype(), found.shape()), (DType::F32, expected.shape()), "{what}");
        let (found, expected) = (found.to_host().unwrap().to_vec::<f32>().unwrap(), expected.to_vec::<f32>().unwrap());
        let wrong: Vec<usize> = (0..found.len()).filter(|&i| found[i].to_bits() != expected[i].to_bits()).collect();
        if let Some(&i) = wrong.first() {
            panic!(
                "{what}: {} of {} values differ; first at {i}: gpu {} ({:#010x}), host {} ({:#010x})",
                wrong.len(),
                found.len(),
                found[i],
                found[i].to_bits(),
                expected[i],
                expected[i].to_bits()
            );
        }
    }

    #[test]
    fn dequantize_equals_the_host_bit_for_bit() {
        let Some(gpu) = test_gpu() else { return };
        for (at, ty) in types().enumerate() {
            let seed = 10 * at as u64;
            decodes_as_the_host(&format!("{ty} quantized"), &quantized(ty, [5, 512], false, seed), &gpu);
            decodes_as_the_host(&format!("{ty} random blocks"), &random_blocks(ty, [7, 768], seed + 1), &gpu);
        }
        // Plain rows of a width that is no multiple of 8 end inside a unit.
        for ty in [GgmlType::F32, GgmlType::F16, GgmlType::BF16] {
            decodes_as_the_host(&format!("{ty} width 13"), &random_blocks(ty, [3, 13], 4), &gpu);
        }
    }

    #[test]
    fn dequantize_reads_a_view_of_the_blocks() {
        let Some(gpu) = test_gpu() else { return };
        // Rows 3 and 4 start 3 * 110 bytes into the buffer, inside a word.
        let host = random_blocks(GgmlType::Q3_K, [6, 256], 5);
        let rows = |layer: &GgmlLinear<Gpu>| GgmlLinear {
            weight: layer.weight.narrow(0, 3, 2).unwrap(),
            bias: None,
            ty: layer.ty,
            in_features: layer.in_features,
        };
        let view = rows(&host.place(&gpu).unwrap());
        let expected = host.dequantize().unwrap().narrow(0, 3, 2).unwrap().contiguous();
        assert!(bytes(&view.dequantize().unwrap().to_host().unwrap()) == bytes(&expected));
    }

    /// Asserts a product within a bound on f32 summation error of the host's dense product.
    ///
    /// Both sides sum the same `k` exact-input products `w x` (the GPU's decoded weights are the
    /// host's bits, and f16 or bf16 inputs widen exactly), in different orders: each result is
    /// then within `γ_k Σ|w x|` of the exact sum, with `γ_k = k u / (1 - k u)` and `u = 2^-24`,
    /// whatever the order and whether products are fused; so the two are within twice that
    /// (plus the rounding of the bias add on each side).
    fn close(what: &str, found: &Tensor<Gpu>, layer: &GgmlLinear, x: &Tensor) {
        let dense = layer.to_linear(DType::F32).unwrap();
        let expected = dense.forward(x).unwrap();
        assert_eq!((found.dtype(), found.shape()), (DType::F32, expected.shape()), "{what}");
        let (found, expected) = (found.to_host().unwrap().to_vec::<f32>().unwrap(), expected.to_vec::<f32>().unwrap());
        let weight = dense.weight.to_vec::<f32>().unwrap();
        let bias = dense.bias.map(|bias| bias.to_vec::<f32>().unwrap());
        let inputs = x.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap();
        let (k, n) = (layer.in_features, layer.out_features());
        let u = f64::from(f32::EPSILON) / 2.0;
        let gamma = (k + 1) as f64 * u / (1.0 - (k + 1) as f64 * u);
        for (at, (&f, &e)) in found.iter().zip(&expected).enumerate() {
            let (row, column) = (at / n, at % n);
            let magnitude: f64 = (0..k)
                .map(|j| f64::from(weight[column * k + j]).abs() * f64::from(inputs[row * k + j]).abs())
                .sum::<f64>()
                + bias.as_ref().map_or(0.0, |bias| f64::from(bias[column]).abs());
            let tolerance = 2.0 * gamma * magnitude + f64::from(f32::MIN_POSITIVE);
            let error = (f64::from(f) - f64::from(e)).abs();
            assert!(error <= tolerance, "{what}: element {at}: gpu {f}, host {e} (error {error}, bound {tolerance})");
        }
    }

    #[test]
    fn forward_is_close_to_the_dense_host_product_for_one_few_and_many_rows() {
        let Some(gpu) = test_gpu() else { return };
        for (at, ty) in types().enumerate() {
            let seed = 100 + 10 * at as u64;
            let host = quantized(ty, [70, 512], at % 2 == 0, seed);
            let device = host.place(&gpu).unwrap();
            for rows in [1, 3, 17] {
                let x = random(&[rows, 512], seed + rows as u64);
                let found = device.forward(&x.to_device(&gpu).unwrap()).unwrap();
                close(&format!("{ty} {rows} rows"), &found, &host, &x);
            }
        }
    }

    #[test]
    fn forward_takes_batches_half_inputs_views_and_odd_plain_widths() {
        let Some(gpu) = test_gpu() else { return };
        let host = quantized(GgmlType::Q4_K, [12, 256], true, 7);
        let device = host.place(&gpu).unwrap();
        let x = random(&[2, 3, 256], 8);
        for dtype in [DType::F32, DType::BF16, DType::F16] {
            let x = x.to_dtype(dtype).unwrap();
            close(&format!("batched {dtype}"), &device.forward(&x.to_device(&gpu).unwrap()).unwrap(), &host, &x);
        }
        let wide = random(&[5, 300], 9);
        let view = wide.narrow(1, 20, 256).unwrap();
        let found = device.forward(&wide.to_device(&gpu).unwrap().narrow(1, 20, 256).unwrap()).unwrap();
        close("strided input", &found, &host, &view.contiguous());
        // Plain types whose width is no multiple of 8 go through the float product.
        for ty in [GgmlType::F32, GgmlType::F16, GgmlType::BF16] {
            let host = quantized(ty, [9, 36], true, 11);
            let x = random(&[17, 36], 12);
            let found = host.place(&gpu).unwrap().forward(&x.to_device(&gpu).unwrap()).unwrap();
            close(&format!("{ty} width 36"), &found, &host, &x);
        }
        // No rows give no output.
        let empty = Tensor::zeros(DType::F32, &[0, 256]).to_device(&gpu).unwrap();
        assert_eq!(device.forward(&empty).unwrap().shape(), [0, 12]);
    }

    #[test]
    fn unsupported_types_and_wrong_inputs_are_refused() {
        let Some(gpu) = test_gpu() else { return };
        for ty in [GgmlType::IQ2_XXS, GgmlType::NVFP4, GgmlType::TQ2_0, GgmlType::Q8_K] {
            let row_bytes = ty.row_bytes(256).unwrap();
            let host =
                GgmlLinear::new(Tensor::from_vec(vec![0u8; 2 * row_bytes], &[2, row_bytes]).unwrap(), None, ty, 256)
                    .unwrap();
            let device = host.place(&gpu).unwrap();
            let x = Tensor::zeros(DType::F32, &[1, 256]).to_device(&gpu).unwrap();
            for err in [device.dequantize().unwrap_err(), device.forward(&x).unwrap_err()] {
                assert!(
                    matches!(&err, Error::GgmlUnsupported { ty: name, hint, .. } if *name == ty.name() && hint.contains("Q4_K")),
                    "{ty}: {err}"
                );
            }
        }
        let device = quantized(GgmlType::Q8_0, [4, 64], false, 3).place(&gpu).unwrap();
        let narrow = Tensor::zeros(DType::F32, &[2, 32]).to_device(&gpu).unwrap();
        assert!(matches!(device.forward(&narrow), Err(Error::ShapeMismatch { .. })));
        let ints = Tensor::zeros(DType::I32, &[2, 64]).to_device(&gpu).unwrap();
        assert!(matches!(device.forward(&ints), Err(Error::NotFloat { .. })));
        // Blocks replaced by ones that do not fit the type are refused, not read past.
        let mut broken = device.clone();
        broken.in_features = 96;
        assert!(matches!(broken.dequantize(), Err(Error::GgmlRow { .. })));
        let meta = GgmlLinear::<Host>::new(Tensor::meta(DType::U8, &[4, 68]), None, GgmlType::Q8_0, 64)
            .unwrap()
            .place(&gpu)
            .unwrap();
        assert!(matches!(meta.dequantize(), Err(Error::Meta { .. })));
        let x = Tensor::zeros(DType::F32, &[1, 64]).to_device(&gpu).unwrap();
        assert!(matches!(meta.forward(&x), Err(Error::Meta { .. })));
    }
}
