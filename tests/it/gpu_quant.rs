//! Quantized weights on the GPU against the references: every MLX affine fixture dequantized on
//! the device equals MLX bit for bit, every SeedLM fixture decoded on the device equals the
//! reference decoder, a NanoSeedLM folder placed on the device gives the reference values, and
//! placed layers keep their streams packed and compute what the host computes.

use nnx::nn::{Init, Linear};
use nnx::quant::{
    AFFINE_BITS, AFFINE_GROUP_SIZES, AffineSpec, AffineWeight, QuantizedLinear, SeedEncoding, SeedLinear, SeedWeight,
};
use nnx::quantized::{EncodedWeight, QuantizedFolder, save_folder};
use nnx::{Archive, DType, Device, Gpu, Host, Module, Placement, Tensor};

use crate::gpu::gpu;
use crate::util::fixtures;

/// The raw bytes of a tensor, for bit-for-bit comparison.
fn bytes(tensor: &Tensor) -> Vec<u8> {
    tensor.to_bytes().unwrap().into_owned()
}

/// The bytes of a GPU tensor, read back.
fn device_bytes(tensor: &Tensor<Gpu>) -> Vec<u8> {
    bytes(&tensor.to_host().unwrap())
}

/// Asserts `found` within `1e-4 * (1 + |expected|)` of `expected`, element by element.
fn assert_close(what: &str, found: &[f32], expected: &[f32]) {
    assert_eq!(found.len(), expected.len(), "{what}: lengths");
    for (at, (f, e)) in found.iter().zip(expected).enumerate() {
        assert!((f - e).abs() <= 1e-4 * (1.0 + e.abs()), "{what}[{at}]: gpu {f}, expected {e}");
    }
}

/// `x W^T` in f64 for row-major `x` `[m, k]` and `w` `[n, k]`, rounded to f32.
fn reference_product(x: &[f32], w: &[f32], k: usize) -> Vec<f32> {
    let n = w.len() / k;
    x.chunks_exact(k)
        .flat_map(|row| {
            w.chunks_exact(k).map(move |weights| {
                row.iter().zip(weights).map(|(a, b)| f64::from(*a) * f64::from(*b)).sum::<f64>() as f32
            })
        })
        .take(x.len() / k * n)
        .collect()
}

/// Inputs `[rows, width]` in `[-1, 1]`.
fn inputs(rows: usize, width: usize) -> Tensor {
    Tensor::from_vec((0..rows * width).map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0).collect(), &[rows, width])
        .unwrap()
}

#[test]
fn every_mlx_fixture_dequantizes_on_the_gpu_bit_for_bit() {
    let Some(gpu) = gpu() else { return };
    let mut checked = 0;
    for dtype in ["f32", "bf16", "f16"] {
        let archive = Archive::open(fixtures().join("mlx").join(format!("affine_{dtype}.safetensors"))).unwrap();
        for bits in AFFINE_BITS {
            for group in AFFINE_GROUP_SIZES {
                let name = format!("q{bits}g{group}");
                let get = |stream: &str| archive.try_get(&format!("{name}.{stream}")).unwrap();
                let spec = AffineSpec::new(bits, group).unwrap();
                let weight = AffineWeight::new(get("weight"), get("scales"), get("biases"), spec).unwrap();
                let placed = weight.place(&gpu).unwrap();
                assert_eq!(placed.weight.dtype(), DType::U32, "{dtype} {name}: the words stay packed");
                let ours = placed.dequantize().unwrap();
                let theirs = get("dequantized");
                assert_eq!((ours.dtype(), ours.shape()), (theirs.dtype(), theirs.shape()), "{dtype} {name}");
                assert!(device_bytes(&ours) == bytes(&theirs), "{dtype} {name}: the GPU differs from MLX");
                checked += 1;
            }
        }
    }
    assert_eq!(checked, 54);
}

/// The encoded weight stored under `prefix` in `archive`.
fn seed_weight(archive: &Archive, prefix: &str, encoding: SeedEncoding) -> SeedWeight {
    let get = |stream: &str| archive.try_get(&format!("{prefix}.{stream}")).unwrap();
    let codes = (encoding == SeedEncoding::Seed4P4).then(|| get("codes"));
    SeedWeight::new(encoding, get("seeds"), get(encoding.coefficient_stream()), get("exp_bias"), codes).unwrap()
}

#[test]
fn every_seedlm_fixture_decodes_on_the_gpu_bit_for_bit() {
    let Some(gpu) = gpu() else { return };
    let mut values = 0;
    for encoding in [SeedEncoding::Seed4, SeedEncoding::Seed4P4] {
        let stem = if encoding == SeedEncoding::Seed4 { "seed4" } else { "seed4p4" };
        for case in ["1x4x64", "2x8x128", "1x16x256", "mixed_2x8x128"] {
            let archive = Archive::open(fixtures().join("seedlm").join(format!("{stem}_{case}.safetensors"))).unwrap();
            let decoded = seed_weight(&archive, "w", encoding).place(&gpu).unwrap().decode().unwrap();
            let reference = archive.try_get("w.decoded").unwrap();
            assert_eq!((decoded.dtype(), decoded.shape()), (DType::BF16, reference.shape()), "{stem} {case}");
            assert!(device_bytes(&decoded) == bytes(&reference), "{stem} {case}: the GPU decodes differently");
            values += reference.len();
        }
    }
    let shard = Archive::open(fixtures().join("seedlm").join("shard")).unwrap();
    for (prefix, encoding) in [("seed4", SeedEncoding::Seed4), ("seed4p4", SeedEncoding::Seed4P4)] {
        let decoded = seed_weight(&shard, prefix, encoding).place(&gpu).unwrap().decode().unwrap();
        assert!(device_bytes(&decoded) == bytes(&shard.try_get(&format!("{prefix}.decoded")).unwrap()), "{prefix}");
        values += decoded.len();
    }
    assert_eq!(values, 147_968);
}

/// The two seed layers of the NanoSeedLM shard, as a model generic over its device.
#[derive(Module, Clone, Debug)]
struct NanoSeed<D: Device = Host> {
    seed4: SeedLinear<D>,
    seed4p4: SeedLinear<D>,
}

impl NanoSeed {
    fn from_folder(folder: &QuantizedFolder) -> NanoSeed {
        NanoSeed { seed4: folder.seed_linear("seed4").unwrap(), seed4p4: folder.seed_linear("seed4p4").unwrap() }
    }
}

/// Places the folder's layers on the GPU and checks every slice against the reference decode:
/// the decoded weights bit for bit, and the products within tolerance of the reference
/// weights' products.
fn check_placed_folder(gpu: &Gpu, folder: &QuantizedFolder, reference: &Archive) {
    let model = NanoSeed::from_folder(folder);
    let names: Vec<String> = model.flat_state_dict().keys().map(str::to_string).collect();
    assert_eq!(names.len(), 7, "{names:?}");
    assert!(names.iter().all(|name| folder.archive().contains(name)), "the walk names the folder's entries: {names:?}");
    let placed: NanoSeed<Gpu> = model.place(gpu).unwrap();
    let x = inputs(3, 1024);
    let on_device = x.to_device(gpu).unwrap();
    for (name, layer) in [("seed4", &placed.seed4), ("seed4p4", &placed.seed4p4)] {
        let decoded = reference.try_get(&format!("{name}.decoded")).unwrap();
        assert!(device_bytes(&layer.weight.decode().unwrap()) == bytes(&decoded), "{name}: decode");
        let weights = decoded.to_f32_vec().unwrap();
        for slice in 0..2 {
            let expected = reference_product(
                &x.to_vec::<f32>().unwrap(),
                &weights[slice * 32 * 1024..(slice + 1) * 32 * 1024],
                1024,
            );
            let found = layer.forward_slice(&on_device, slice).unwrap().to_f32_vec().unwrap();
            assert_close(&format!("{name} slice {slice}"), &found, &expected);
        }
    }
}

#[test]
fn a_nanoseedlm_folder_placed_on_the_gpu_gives_the_reference_values() {
    let Some(gpu) = gpu() else { return };
    let shard = QuantizedFolder::open(fixtures().join("seedlm").join("shard")).unwrap();
    check_placed_folder(&gpu, &shard, shard.archive());

    // The same weights written as nnx writes folders: streams of whole pages start on a page,
    // and a device that imports host pages decodes them where they lie in the file.
    let mut archive = Archive::new();
    for name in ["seed4", "seed4p4"] {
        for (entry, tensor) in shard.weight(name).unwrap().streams(name) {
            archive.insert(entry, tensor);
        }
    }
    let plain = Tensor::from_vec(vec![0.5f32; 64 * 64], &[64, 64]).unwrap().to_dtype(DType::BF16).unwrap();
    for (entry, tensor) in EncodedWeight::Float(plain).streams("embed") {
        archive.insert(entry, tensor);
    }
    let dir = crate::util::scratch();
    save_folder(dir.path(), &archive, None, Some(40_000)).unwrap();
    let written = QuantizedFolder::open(dir.path()).unwrap();
    if gpu.zero_copy_alignment().is_some() {
        let seeds = written.archive().try_get("seed4.seeds").unwrap();
        assert_eq!(gpu.transfer(&seeds).unwrap().1, Placement::ZeroCopy, "a page-aligned stream is not copied");
    }
    check_placed_folder(&gpu, &written, shard.archive());
    check_placed_folder(&gpu.with_zero_copy(false), &written, shard.archive());
}

/// Collects the dtypes of a walk on any device.
struct Dtypes(Vec<DType>);

impl<D: Device> nnx::Visitor<D> for Dtypes {
    fn enter(&mut self, _: nnx::PathStep) {}

    fn tensor(&mut self, tensor: &Tensor<D>) {
        self.0.push(tensor.dtype());
    }

    fn leave(&mut self) {}
}

/// The dtype of every tensor of a module on `D`, in walk order.
fn dtypes<D: Device, M: Module<D>>(module: &M) -> Vec<DType> {
    let mut dtypes = Dtypes(Vec::new());
    module.walk(&mut dtypes);
    dtypes.0
}

/// A user model with a quantized projection, generic over its device.
#[derive(Module, Clone, Debug)]
struct Projection<D: Device = Host> {
    q: QuantizedLinear<D>,
    #[nnx(skip)]
    width: usize,
}

#[test]
fn placed_quantized_layers_stay_packed_and_match_the_host() {
    let linear = Linear::builder(256, 48).dtype(DType::BF16).init(Init::Seeded(3)).build();
    let model = Projection { q: QuantizedLinear::from_linear(&linear, 4, 64).unwrap(), width: 256 };
    let names: Vec<String> = model.flat_state_dict().keys().map(str::to_string).collect();
    assert_eq!(names, ["q.weight", "q.scales", "q.biases", "q.bias"]);
    let Some(gpu) = gpu() else { return };
    let placed: Projection<Gpu> = model.place(&gpu).unwrap();
    assert_eq!(placed.width, 256);
    assert_eq!(dtypes::<Gpu, _>(&placed), [DType::U32, DType::BF16, DType::BF16, DType::BF16]);
    assert_eq!(dtypes::<Gpu, _>(&placed), dtypes::<Host, _>(&model));
    assert_eq!(placed.q.weight.dtype(), DType::U32);
    assert_eq!(placed.q.weight.shape(), model.q.weight.shape());
    for rows in [1, 3, 40] {
        let x = inputs(rows, 256);
        let found = placed.q.forward(&x.to_device(&gpu).unwrap()).unwrap().to_f32_vec().unwrap();
        assert_close(
            &format!("QuantizedLinear, {rows} rows"),
            &found,
            &model.q.forward(&x).unwrap().to_f32_vec().unwrap(),
        );
    }

    let shard = QuantizedFolder::open(fixtures().join("seedlm").join("shard")).unwrap();
    let layer = shard.seed_linear("seed4p4").unwrap();
    let device = layer.place(&gpu).unwrap();
    assert_eq!(dtypes::<Gpu, _>(&device), [DType::U16, DType::U16, DType::I32, DType::U8]);
    for rows in [1, 9] {
        let x = inputs(rows, 1024);
        for slice in 0..2 {
            let found = device.forward_slice(&x.to_device(&gpu).unwrap(), slice).unwrap().to_f32_vec().unwrap();
            let expected = layer.forward_slice(&x, slice).unwrap().to_f32_vec().unwrap();
            assert_close(&format!("SeedLinear, {rows} rows, slice {slice}"), &found, &expected);
        }
    }
}
