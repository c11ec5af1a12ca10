//! Every GPU kernel against the CPU kernel of the same name, on pseudo-random inputs.
//!
//! Tolerance: each element within `TOLERANCE * (1 + |cpu|)` of the CPU's f32 result (both
//! devices read the same f16/bf16/f64 values exactly and compute in f32, so half-precision
//! operands need no looser bound); casts match bit for bit. Run with `--nocapture` to see the
//! largest difference of each kernel.

use super::dispatch::TEST_BINDING_LIMIT;
use super::{Gpu, test_gpu};
use crate::kernels::testing::{cast, random};
use crate::{Compute, DType, Error, Tensor};

/// Relative tolerance of f32 results against the CPU (`|gpu - cpu| <= T * (1 + |cpu|)`).
const TOLERANCE: f64 = 1e-5;

/// Asserts that `found` (on the GPU) matches `expected` (on the host) in shape, dtype (f32) and
/// values within `tolerance`, and returns the largest absolute difference.
fn compare(what: &str, found: &Tensor<Gpu>, expected: &Tensor, tolerance: f64) -> f64 {
    assert_eq!(found.shape(), expected.shape(), "{what}: shapes");
    assert_eq!(found.dtype(), DType::F32, "{what}: dtype");
    let found = found.to_f32_vec().unwrap();
    let expected = expected.to_f32_vec().unwrap();
    let mut largest = 0.0f64;
    for (index, (&f, &e)) in found.iter().zip(&expected).enumerate() {
        let difference = (f64::from(f) - f64::from(e)).abs();
        let same_infinity = f.is_infinite() && f == e;
        assert!(
            same_infinity || difference <= tolerance * (1.0 + f64::from(e).abs()),
            "{what}: element {index}: gpu {f}, cpu {e} (difference {difference:.3e})"
        );
        if !same_infinity {
            largest = largest.max(difference);
        }
    }
    eprintln!("{what}: max abs diff {largest:.2e} over {} values", found.len());
    largest
}

/// `tensor` on `gpu`.
fn up(tensor: &Tensor, gpu: &Gpu) -> Tensor<Gpu> {
    tensor.to_device(gpu).unwrap()
}

#[test]
fn matmul_matches_the_cpu_on_odd_sizes_and_batches() {
    let Some(gpu) = test_gpu() else { return };
    for (seed, (m, k, n)) in
        [(1, 1, 1), (3, 5, 7), (17, 33, 65), (64, 64, 64), (128, 256, 96), (130, 70, 257)].into_iter().enumerate()
    {
        let a = random(&[m, k], seed as u64);
        let b = random(&[k, n], 100 + seed as u64);
        compare(
            &format!("matmul {m}x{k}x{n}"),
            &up(&a, &gpu).matmul(&up(&b, &gpu)).unwrap(),
            &a.matmul(&b).unwrap(),
            TOLERANCE,
        );
    }
    // Broadcast batches, a stack folded into one product, many batches.
    let cases: [(&[usize], &[usize]); 4] = [
        (&[2, 1, 4, 5], &[3, 5, 6]),
        (&[2, 3, 4, 5], &[5, 6]),
        (&[16, 40, 50], &[16, 50, 60]),
        (&[7, 9], &[2, 2, 9, 3]),
    ];
    for (seed, (left, right)) in cases.into_iter().enumerate() {
        let a = random(left, 10 + seed as u64);
        let b = random(right, 20 + seed as u64);
        compare(
            &format!("matmul {left:?} x {right:?}"),
            &up(&a, &gpu).matmul(&up(&b, &gpu)).unwrap(),
            &a.matmul(&b).unwrap(),
            TOLERANCE,
        );
    }
}

#[test]
fn matmul_reads_views_and_half_precision() {
    let Some(gpu) = test_gpu() else { return };
    // A transposed right operand and a doubly transposed left one.
    let a = random(&[7, 9], 1);
    let b = random(&[11, 9], 2).transpose(0, 1).unwrap();
    let (da, db) = (up(&a, &gpu), up(&random(&[11, 9], 2), &gpu).transpose(0, 1).unwrap());
    compare("matmul transposed rhs", &da.matmul(&db).unwrap(), &a.matmul(&b).unwrap(), TOLERANCE);
    let at = a.transpose(0, 1).unwrap().contiguous();
    let dat = up(&at, &gpu).transpose(0, 1).unwrap();
    compare("matmul transposed lhs", &dat.matmul(&db).unwrap(), &a.matmul(&b).unwrap(), TOLERANCE);
    // Permuted heads: [batch, seq, heads, d] viewed as [batch, heads, seq, d].
    let q = random(&[2, 5, 3, 4], 3);
    let k = random(&[2, 5, 3, 4], 4);
    let (hq, hk) = (q.permute(&[0, 2, 1, 3]).unwrap(), k.permute(&[0, 2, 3, 1]).unwrap());
    let (gq, gk) = (up(&q, &gpu).permute(&[0, 2, 1, 3]).unwrap(), up(&k, &gpu).permute(&[0, 2, 3, 1]).unwrap());
    compare("matmul permuted heads", &gq.matmul(&gk).unwrap(), &hq.matmul(&hk).unwrap(), TOLERANCE);
    // Half precision, f64 and mixed operands.
    let a = random(&[33, 40], 5);
    let b = random(&[40, 17], 6);
    for (left, right) in [
        (DType::F16, DType::F16),
        (DType::BF16, DType::BF16),
        (DType::F64, DType::F64),
        (DType::BF16, DType::F16),
        (DType::F32, DType::BF16),
    ] {
        let (ha, hb) = (cast(&a, left), cast(&b, right));
        compare(
            &format!("matmul {left} x {right}"),
            &up(&ha, &gpu).matmul(&up(&hb, &gpu)).unwrap(),
            &ha.matmul(&hb).unwrap(),
            TOLERANCE,
        );
    }
    // An f16 operand at an odd element offset (the second half of a word).
    let wide = cast(&random(&[9, 7], 7), DType::F16);
    let (view, device_view) = (wide.narrow(1, 1, 5).unwrap(), up(&wide, &gpu).narrow(1, 1, 5).unwrap());
    let c = random(&[5, 3], 8);
    compare("matmul f16 odd offset", &device_view.matmul(&up(&c, &gpu)).unwrap(), &view.matmul(&c).unwrap(), TOLERANCE);
}

#[test]
fn matmul_empty_and_refused() {
    let Some(gpu) = test_gpu() else { return };
    let zeros = |shape: &[usize]| Tensor::zeros(DType::F32, shape);
    for (left, right) in [(&[3, 0][..], &[0, 4][..]), (&[0, 3], &[3, 4]), (&[3, 2], &[2, 0]), (&[0, 2, 3], &[3, 5])] {
        let expected = zeros(left).matmul(&zeros(right)).unwrap();
        compare(
            &format!("matmul empty {left:?}"),
            &up(&zeros(left), &gpu).matmul(&up(&zeros(right), &gpu)).unwrap(),
            &expected,
            0.0,
        );
    }
    let a = up(&random(&[2, 3], 1), &gpu);
    assert!(matches!(a.matmul(&up(&random(&[4, 2], 2), &gpu)), Err(Error::ShapeMismatch { op: "matmul", .. })));
    assert!(matches!(a.matmul(&up(&random(&[3], 3), &gpu)), Err(Error::BadShape { .. })));
    let ints = Tensor::from_vec(vec![1i32; 6], &[3, 2]).unwrap().to_device(&gpu).unwrap();
    assert!(matches!(a.matmul(&ints), Err(Error::NotFloat { .. })));
    let meta = Tensor::meta_on(&gpu, DType::F32, &[3, 2]);
    assert!(matches!(a.matmul(&meta), Err(Error::Meta { .. })));
}

#[test]
fn linear_matches_the_cpu() {
    let Some(gpu) = test_gpu() else { return };
    let x = random(&[2, 3, 10], 1);
    let weight = random(&[4, 10], 2);
    let bias = random(&[4], 3);
    let (gx, gw, gb) = (up(&x, &gpu), up(&weight, &gpu), up(&bias, &gpu));
    compare(
        "linear with bias",
        &gx.linear(&gw, Some(&gb)).unwrap(),
        &x.linear(&weight, Some(&bias)).unwrap(),
        TOLERANCE,
    );
    // A weight stored `[in, out]` and viewed `[out, in]`; a bf16 weight; a rank-1 input.
    let stored = weight.transpose(0, 1).unwrap().contiguous();
    let viewed = up(&stored, &gpu).transpose(0, 1).unwrap();
    compare(
        "linear transposed weight",
        &gx.linear(&viewed, None).unwrap(),
        &x.linear(&weight, None).unwrap(),
        TOLERANCE,
    );
    let bf = cast(&weight, DType::BF16);
    let row = random(&[10], 4);
    compare(
        "linear bf16 weight",
        &up(&row, &gpu).linear(&up(&bf, &gpu), None).unwrap(),
        &row.linear(&bf, None).unwrap(),
        TOLERANCE,
    );
    // An input whose leading axes do not fold (a permuted view), f16 bias at an offset.
    let permuted = random(&[3, 2, 10], 5).permute(&[1, 0, 2]).unwrap();
    let device_permuted = up(&random(&[3, 2, 10], 5), &gpu).permute(&[1, 0, 2]).unwrap();
    let wide_bias = cast(&random(&[6], 6), DType::F16);
    let (bias_view, device_bias) = (wide_bias.narrow(0, 1, 4).unwrap(), up(&wide_bias, &gpu).narrow(0, 1, 4).unwrap());
    compare(
        "linear permuted input, f16 bias",
        &device_permuted.linear(&gw, Some(&device_bias)).unwrap(),
        &permuted.linear(&weight, Some(&bias_view)).unwrap(),
        TOLERANCE,
    );
    let empty = Tensor::zeros(DType::F32, &[0, 10]);
    compare(
        "linear empty",
        &up(&empty, &gpu).linear(&gw, Some(&gb)).unwrap(),
        &empty.linear(&weight, Some(&bias)).unwrap(),
        0.0,
    );
    let no_features = random(&[2, 0], 12);
    let (zero_weight, zero_bias) = (Tensor::zeros(DType::F32, &[3, 0]), random(&[3], 13));
    compare(
        "linear no input features",
        &up(&no_features, &gpu).linear(&up(&zero_weight, &gpu), Some(&up(&zero_bias, &gpu))).unwrap(),
        &no_features.linear(&zero_weight, Some(&zero_bias)).unwrap(),
        0.0,
    );
    // Larger, with sizes off the tile.
    let x = random(&[5, 300], 7);
    let weight = random(&[257, 300], 8);
    let bias = random(&[257], 9);
    compare(
        "linear 5x300 -> 257",
        &up(&x, &gpu).linear(&up(&weight, &gpu), Some(&up(&bias, &gpu))).unwrap(),
        &x.linear(&weight, Some(&bias)).unwrap(),
        TOLERANCE,
    );
    assert!(matches!(gx.linear(&up(&random(&[4, 9], 10), &gpu), None), Err(Error::ShapeMismatch { .. })));
    assert!(matches!(gx.linear(&gw, Some(&up(&random(&[5], 11), &gpu))), Err(Error::ShapeMismatch { .. })));
}

#[test]
fn linear_splits_a_weight_larger_than_a_binding() {
    let Some(gpu) = test_gpu() else { return };
    // Bindings of 4 KiB: a 10 KiB f32 weight goes in blocks of rows, an f16 one at an offset too.
    TEST_BINDING_LIMIT.with(|limit| limit.set(Some(4096)));
    let x = random(&[3, 40], 1);
    let weight = random(&[64, 40], 2);
    let bias = random(&[64], 3);
    let out = up(&x, &gpu).linear(&up(&weight, &gpu), Some(&up(&bias, &gpu))).unwrap();
    compare("linear in blocks", &out, &x.linear(&weight, Some(&bias)).unwrap(), TOLERANCE);
    let wide = cast(&random(&[150, 41], 4), DType::F16);
    let (view, device_view) = (wide.narrow(1, 1, 40).unwrap(), up(&wide, &gpu).narrow(1, 1, 40).unwrap());
    compare(
        "linear f16 in blocks",
        &up(&x, &gpu).linear(&device_view, None).unwrap(),
        &x.linear(&view, None).unwrap(),
        TOLERANCE,
    );
    // A weight whose rows are its inner axis cannot be split that way: a clear error.
    let transposed = up(&weight.transpose(0, 1).unwrap().contiguous(), &gpu).transpose(0, 1).unwrap();
    let error = up(&x, &gpu).linear(&transposed, None).unwrap_err();
    assert!(matches!(error, Error::Gpu { action: "linear", .. }), "{error}");
    assert!(error.to_string().contains("largest storage binding"), "{error}");
    // Any other tensor past a binding is refused with an error, not a panic.
    let big = up(&random(&[2048], 5), &gpu);
    let error = big.relu().unwrap_err();
    assert!(error.to_string().contains("exceeds the adapter's largest storage binding"), "{error}");
    TEST_BINDING_LIMIT.with(|limit| limit.set(None));
}

#[test]
fn elementwise_arithmetic_broadcasts() {
    let Some(gpu) = test_gpu() else { return };
    let cases: [(&[usize], &[usize]); 6] = [
        (&[2, 3, 4], &[2, 3, 4]),
        (&[2, 3, 4], &[4]),
        (&[2, 1, 4], &[3, 1]),
        (&[1], &[5, 2]),
        (&[3, 1], &[1, 3]),
        (&[], &[2, 2]),
    ];
    for (seed, (left, right)) in cases.into_iter().enumerate() {
        let a = random(left, seed as u64);
        let b = random(right, 50 + seed as u64).add_scalar(3.0).unwrap();
        let (ga, gb) = (up(&a, &gpu), up(&b, &gpu));
        let what = |op: &str| format!("{op} {left:?} {right:?}");
        compare(&what("add"), &ga.add(&gb).unwrap(), &a.add(&b).unwrap(), TOLERANCE);
        compare(&what("sub"), &ga.sub(&gb).unwrap(), &a.sub(&b).unwrap(), TOLERANCE);
        compare(&what("mul"), &ga.mul(&gb).unwrap(), &a.mul(&b).unwrap(), TOLERANCE);
        compare(&what("div"), &ga.div(&gb).unwrap(), &a.div(&b).unwrap(), TOLERANCE);
    }
    // Views and half precision.
    let a = random(&[4, 6], 1);
    let b = cast(&random(&[4], 2), DType::BF16);
    let c = cast(&random(&[6, 1], 3), DType::F16);
    let ga = up(&a, &gpu).transpose(0, 1).unwrap();
    let ha = a.transpose(0, 1).unwrap();
    compare("add transposed + bf16", &ga.add(&up(&b, &gpu)).unwrap(), &ha.add(&b).unwrap(), TOLERANCE);
    compare("mul transposed * f16", &ga.mul(&up(&c, &gpu)).unwrap(), &ha.mul(&c).unwrap(), TOLERANCE);
    let big = random(&[300, 300], 4);
    let gbig = up(&big, &gpu);
    compare(
        "mul by own transpose",
        &gbig.mul(&gbig.transpose(0, 1).unwrap()).unwrap(),
        &big.mul(&big.transpose(0, 1).unwrap()).unwrap(),
        TOLERANCE,
    );
    let error = up(&random(&[2, 3], 1), &gpu).add(&up(&random(&[2], 2), &gpu)).unwrap_err();
    assert!(matches!(error, Error::ShapeMismatch { op: "add", .. }));
    let other = test_gpu().unwrap();
    let error = up(&a, &gpu).add(&up(&a, &other)).unwrap_err();
    assert!(matches!(error, Error::Gpu { action: "add", .. }), "{error}");
}

#[test]
fn activations_match_the_cpu() {
    let Some(gpu) = test_gpu() else { return };
    // Values across every branch of erf and tanh, and past the range where exp overflows.
    let mut values: Vec<f32> = (-1200..=1200).map(|i| i as f32 / 100.0).collect();
    values.extend([-100.0, -30.0, 30.0, 100.0, 1e-30, -1e-30, 0.0, -0.0, 1e-5, -3e-8]);
    let len = values.len();
    let x = Tensor::from_vec(values, &[len]).unwrap();
    let gx = up(&x, &gpu);
    compare("scale", &gx.scale(2.5).unwrap(), &x.scale(2.5).unwrap(), TOLERANCE);
    compare("add_scalar", &gx.add_scalar(-1.0).unwrap(), &x.add_scalar(-1.0).unwrap(), TOLERANCE);
    compare("relu", &gx.relu().unwrap(), &x.relu().unwrap(), 0.0);
    compare("gelu", &gx.gelu().unwrap(), &x.gelu().unwrap(), 1e-6);
    compare("gelu_tanh", &gx.gelu_tanh().unwrap(), &x.gelu_tanh().unwrap(), 1e-6);
    compare("silu", &gx.silu().unwrap(), &x.silu().unwrap(), 1e-6);
    compare("tanh", &gx.tanh().unwrap(), &x.tanh().unwrap(), 1e-6);
    // Half-precision inputs and a strided view.
    let y = random(&[30, 20], 1).scale(4.0).unwrap();
    for dtype in [DType::F16, DType::BF16, DType::F64] {
        let h = cast(&y, dtype);
        compare(&format!("gelu {dtype}"), &up(&h, &gpu).gelu().unwrap(), &h.gelu().unwrap(), 1e-6);
    }
    let view = y.transpose(0, 1).unwrap().narrow(0, 3, 10).unwrap();
    let device_view = up(&y, &gpu).transpose(0, 1).unwrap().narrow(0, 3, 10).unwrap();
    compare("silu strided", &device_view.silu().unwrap(), &view.silu().unwrap(), 1e-6);
    let empty = Tensor::zeros(DType::F32, &[0, 3]);
    compare("gelu empty", &up(&empty, &gpu).gelu().unwrap(), &empty.gelu().unwrap(), 0.0);
    let ints = Tensor::from_vec(vec![1i64, 2], &[2]).unwrap().to_device(&gpu).unwrap();
    assert!(matches!(ints.tanh(), Err(Error::NotFloat { op: "tanh", .. })));
}

#[test]
fn casts_round_as_the_host_does() {
    let Some(gpu) = test_gpu() else { return };
    // Zeros, subnormals of every format, ties, overflow, infinities, NaN and random values.
    let mut values: Vec<f32> = vec![
        0.0,
        -0.0,
        1.0,
        -2.5,
        f32::MIN_POSITIVE,
        1e-40,
        -1e-45,
        6e-8,
        3e-8,
        2.98e-8,
        6.1e-5,
        65504.0,
        65519.0,
        65520.0,
        1e6,
        f32::MAX,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        1.0 + f32::EPSILON,
        f32::from_bits(0x3f80_8000),
        f32::from_bits(0x3f81_8000),
        f32::from_bits(0x3f80_1000),
        f32::from_bits(0x3f80_3000),
    ];
    values.extend(random(&[977], 1).scale(1000.0).unwrap().to_vec::<f32>().unwrap());
    let len = values.len();
    let base = Tensor::from_vec(values, &[len]).unwrap();
    let mut sources = vec![base.clone(), cast(&base, DType::F16), cast(&base, DType::BF16), cast(&base, DType::F64)];
    // f64 values that f32 cannot hold: extra bits below f32's precision and past its range.
    let wide: Vec<f64> =
        (0..len).map(|i| (i as f64 - 500.0) * 1.000_000_1e-3 + 1e-12).chain([1e300, -1e-300, 3.4e38 * 1.5]).collect();
    let wide_len = wide.len();
    sources.push(Tensor::from_vec(wide, &[wide_len]).unwrap());
    for source in &sources {
        let device = up(source, &gpu);
        for dtype in [DType::F16, DType::BF16, DType::F32, DType::F64] {
            let expected = source.to_dtype(dtype).unwrap();
            let found = device.to_dtype(dtype).unwrap();
            assert_eq!((found.dtype(), found.shape()), (dtype, expected.shape()));
            let (found, expected) =
                (found.to_host().unwrap().to_bytes().unwrap().to_vec(), expected.to_bytes().unwrap().to_vec());
            assert!(found == expected, "{} -> {dtype}: the bytes differ", source.dtype());
        }
    }
    // A strided view, an odd count (half a word), a meta tensor, refusals.
    let matrix = random(&[5, 7], 2);
    let view = matrix.transpose(0, 1).unwrap().narrow(0, 1, 3).unwrap();
    let device_view = up(&matrix, &gpu).transpose(0, 1).unwrap().narrow(0, 1, 3).unwrap();
    let found = device_view.to_dtype(DType::BF16).unwrap().to_host().unwrap();
    assert_eq!(found.to_bytes().unwrap(), view.to_dtype(DType::BF16).unwrap().to_bytes().unwrap());
    let meta = Tensor::meta_on(&gpu, DType::F32, &[2]).to_dtype(DType::F16).unwrap();
    assert!(meta.is_meta() && meta.dtype() == DType::F16);
    let ints = Tensor::from_vec(vec![1u8], &[1]).unwrap().to_device(&gpu).unwrap();
    assert!(matches!(ints.to_dtype(DType::F32), Err(Error::NotCastable { .. })));
    let empty = up(&Tensor::zeros(DType::F32, &[0]), &gpu).to_dtype(DType::F16).unwrap();
    assert_eq!(empty.shape(), [0]);
}

#[test]
fn softmax_and_norms_match_the_cpu() {
    let Some(gpu) = test_gpu() else { return };
    for (seed, width) in [1usize, 7, 256, 384, 1000].into_iter().enumerate() {
        let x = random(&[5, width], seed as u64).scale(10.0).unwrap().add_scalar(2.0).unwrap();
        let gx = up(&x, &gpu);
        let weight = cast(&random(&[width], 10 + seed as u64), DType::BF16);
        let bias = random(&[width], 20 + seed as u64);
        let (gw, gb) = (up(&weight, &gpu), up(&bias, &gpu));
        compare(&format!("softmax_last {width}"), &gx.softmax_last().unwrap(), &x.softmax_last().unwrap(), TOLERANCE);
        compare(
            &format!("layer_norm {width}"),
            &gx.layer_norm(Some(&gw), Some(&gb), 1e-5).unwrap(),
            &x.layer_norm(Some(&weight), Some(&bias), 1e-5).unwrap(),
            1e-4,
        );
        compare(
            &format!("layer_norm plain {width}"),
            &gx.layer_norm(None, None, 1e-12).unwrap(),
            &x.layer_norm(None, None, 1e-12).unwrap(),
            1e-4,
        );
        compare(
            &format!("rms_norm {width}"),
            &gx.rms_norm(Some(&gw), 1e-6).unwrap(),
            &x.rms_norm(Some(&weight), 1e-6).unwrap(),
            TOLERANCE,
        );
        compare(&format!("l2_normalize {width}"), &gx.l2_normalize().unwrap(), &x.l2_normalize().unwrap(), TOLERANCE);
    }
    // Every axis of a rank-3 tensor, a strided and half-precision input.
    let x = random(&[3, 4, 5], 1).scale(10.0).unwrap();
    let gx = up(&x, &gpu);
    for axis in 0..3 {
        compare(&format!("softmax axis {axis}"), &gx.softmax(axis).unwrap(), &x.softmax(axis).unwrap(), TOLERANCE);
    }
    assert!(matches!(gx.softmax(3), Err(Error::AxisOutOfRange { .. })));
    let h = cast(&x, DType::F16).transpose(0, 2).unwrap();
    let gh = up(&cast(&x, DType::F16), &gpu).transpose(0, 2).unwrap();
    compare(
        "layer_norm f16 strided",
        &gh.layer_norm(None, None, 1e-5).unwrap(),
        &h.layer_norm(None, None, 1e-5).unwrap(),
        1e-4,
    );
    // Masked scores: a row of `-inf` gives zeros, `-inf` entries weigh nothing.
    let masked = Tensor::from_vec(
        vec![1e4f32, 1e4 + 1.0, f32::NEG_INFINITY, f32::NEG_INFINITY, f32::NEG_INFINITY, 0.5],
        &[3, 2],
    )
    .unwrap();
    compare("softmax masked", &up(&masked, &gpu).softmax_last().unwrap(), &masked.softmax_last().unwrap(), TOLERANCE);
    // Refusals and empty tensors.
    assert!(matches!(gx.layer_norm(Some(&up(&random(&[4], 1), &gpu)), None, 1e-5), Err(Error::ShapeMismatch { .. })));
    assert!(matches!(up(&Tensor::zeros(DType::F32, &[]), &gpu).rms_norm(None, 1e-6), Err(Error::BadShape { .. })));
    let empty = Tensor::zeros(DType::F32, &[0, 4]);
    compare("softmax empty", &up(&empty, &gpu).softmax_last().unwrap(), &empty.softmax_last().unwrap(), 0.0);
    let empty_rows = Tensor::zeros(DType::F32, &[3, 0]);
    compare(
        "l2_normalize empty rows",
        &up(&empty_rows, &gpu).l2_normalize().unwrap(),
        &empty_rows.l2_normalize().unwrap(),
        0.0,
    );
}

#[test]
fn mean_pool_matches_the_cpu() {
    let Some(gpu) = test_gpu() else { return };
    let x = random(&[2, 5, 300], 1);
    let mask = [true, true, false, true, false, false, false, false, false, false];
    compare("mean_pool", &up(&x, &gpu).mean_pool(&mask).unwrap(), &x.mean_pool(&mask).unwrap(), TOLERANCE);
    let strided = cast(&random(&[5, 2, 8], 2), DType::BF16);
    let (view, device_view) = (strided.permute(&[1, 0, 2]).unwrap(), up(&strided, &gpu).permute(&[1, 0, 2]).unwrap());
    compare(
        "mean_pool bf16 strided",
        &device_view.mean_pool(&mask).unwrap(),
        &view.mean_pool(&mask).unwrap(),
        TOLERANCE,
    );
    assert!(matches!(up(&x, &gpu).mean_pool(&[true; 9]), Err(Error::LengthMismatch { .. })));
    assert!(matches!(up(&random(&[2, 3], 3), &gpu).mean_pool(&[true; 6]), Err(Error::BadShape { .. })));
    let empty = Tensor::zeros(DType::F32, &[2, 0, 3]);
    compare("mean_pool no positions", &up(&empty, &gpu).mean_pool(&[]).unwrap(), &empty.mean_pool(&[]).unwrap(), 0.0);
}

#[test]
fn embedding_gathers_rows() {
    let Some(gpu) = test_gpu() else { return };
    let table = random(&[10, 6], 1);
    let ids = [3u32, 0, 9, 3];
    let gtable = up(&table, &gpu);
    compare("embedding", &Compute::embedding(&gtable, &ids).unwrap(), &Tensor::embedding(&table, &ids).unwrap(), 0.0);
    for dtype in [DType::BF16, DType::F16, DType::F64] {
        let half = cast(&random(&[10, 5], 2), dtype);
        compare(
            &format!("embedding {dtype}"),
            &Compute::embedding(&up(&half, &gpu), &ids).unwrap(),
            &Tensor::embedding(&half, &ids).unwrap(),
            0.0,
        );
    }
    let viewed = table.transpose(0, 1).unwrap().contiguous();
    let device_viewed = up(&viewed, &gpu).transpose(0, 1).unwrap();
    compare(
        "embedding viewed table",
        &Compute::embedding(&device_viewed, &ids).unwrap(),
        &Tensor::embedding(&table, &ids).unwrap(),
        0.0,
    );
    let error = Compute::embedding(&gtable, &[1, 10]).unwrap_err();
    assert!(matches!(error, Error::IndexOutOfRange { id: 10, position: 1, .. }));
    compare(
        "embedding no ids",
        &Compute::embedding(&gtable, &[]).unwrap(),
        &Tensor::embedding(&table, &[]).unwrap(),
        0.0,
    );
    // A table past one binding is gathered with copies.
    TEST_BINDING_LIMIT.with(|limit| limit.set(Some(256)));
    for dtype in [DType::F32, DType::BF16] {
        let big = cast(&random(&[64, 6], 3), dtype);
        let found = Compute::embedding(&up(&big, &gpu), &[63, 0, 5]).unwrap();
        compare(&format!("embedding {dtype} by copies"), &found, &Tensor::embedding(&big, &[63, 0, 5]).unwrap(), 0.0);
    }
    TEST_BINDING_LIMIT.with(|limit| limit.set(None));
}

#[test]
fn rotary_matches_the_cpu() {
    let Some(gpu) = test_gpu() else { return };
    let x = random(&[2, 3, 4, 8], 1);
    let positions = [0, 1, 5, 17];
    compare(
        "rotary",
        &up(&x, &gpu).rotary(&positions, 10_000.0).unwrap(),
        &x.rotary(&positions, 10_000.0).unwrap(),
        TOLERANCE,
    );
    // [batch, seq, heads, d] projections viewed as [batch, heads, seq, d], in bf16.
    let stored = cast(&random(&[2, 4, 3, 64], 2), DType::BF16);
    let view = stored.permute(&[0, 2, 1, 3]).unwrap();
    let device_view = up(&stored, &gpu).permute(&[0, 2, 1, 3]).unwrap();
    compare(
        "rotary bf16 permuted",
        &device_view.rotary(&positions, 500_000.0).unwrap(),
        &view.rotary(&positions, 500_000.0).unwrap(),
        TOLERANCE,
    );
    assert!(matches!(up(&x, &gpu).rotary(&[0, 1], 10_000.0), Err(Error::LengthMismatch { .. })));
    assert!(matches!(up(&random(&[1, 1, 2, 3], 3), &gpu).rotary(&[0, 1], 10_000.0), Err(Error::BadShape { .. })));
    let empty = Tensor::zeros(DType::F32, &[1, 2, 0, 4]);
    compare(
        "rotary empty",
        &up(&empty, &gpu).rotary(&[], 10_000.0).unwrap(),
        &empty.rotary(&[], 10_000.0).unwrap(),
        0.0,
    );
}

#[test]
fn rotary_scaled_matches_the_cpu() {
    let Some(gpu) = test_gpu() else { return };
    let x = random(&[2, 3, 4, 16], 30);
    let positions = [0, 3, 100, 8191];
    let factors = crate::llama3_rope_factors(16, 500_000.0, 8.0, 1.0, 4.0, 64);
    compare(
        "rotary_scaled llama3",
        &up(&x, &gpu).rotary_scaled(&positions, 500_000.0, &factors).unwrap(),
        &x.rotary_scaled(&positions, 500_000.0, &factors).unwrap(),
        TOLERANCE,
    );
    // Linear scaling, on a bf16 permuted view.
    let stored = cast(&random(&[2, 4, 3, 16], 31), DType::BF16);
    let view = stored.permute(&[0, 2, 1, 3]).unwrap();
    let device_view = up(&stored, &gpu).permute(&[0, 2, 1, 3]).unwrap();
    compare(
        "rotary_scaled linear bf16 permuted",
        &device_view.rotary_scaled(&positions, 10_000.0, &[4.0; 8]).unwrap(),
        &view.rotary_scaled(&positions, 10_000.0, &[4.0; 8]).unwrap(),
        TOLERANCE,
    );
    let error = up(&x, &gpu).rotary_scaled(&positions, 10_000.0, &[1.0; 7]).unwrap_err();
    assert!(matches!(error, Error::LengthMismatch { op: "rotary_scaled", expected: 8, found: 7, .. }));
}

#[test]
fn attention_windowed_matches_the_cpu() {
    let Some(gpu) = test_gpu() else { return };
    let run = |what: &str, q: &Tensor, k: &Tensor, v: &Tensor, mask: Option<&[bool]>, window: usize| {
        let found = Compute::attention_windowed(&up(q, &gpu), &up(k, &gpu), &up(v, &gpu), mask, window).unwrap();
        compare(what, &found, &Tensor::attention_windowed(q, k, v, mask, window).unwrap(), TOLERANCE)
    };
    // Prefill with grouped heads and padding, for windows of one, a few, all and past all keys.
    let (q, k, v) = (random(&[2, 8, 6, 16], 40), random(&[2, 2, 6, 16], 41), random(&[2, 2, 6, 8], 42));
    let mask = [false, true, true, true, true, true, true, true, true, false, true, true];
    for window in [1, 3, 6, usize::MAX] {
        run(&format!("attention_windowed prefill, window {window}"), &q, &k, &v, Some(&mask), window);
    }
    // Decoding against a cache, queries past the keys, a window of 0 and rows past a workgroup.
    let (q, k) = (random(&[1, 4, 2, 8], 43), random(&[1, 2, 9, 8], 44));
    run("attention_windowed against a cache", &q, &k, &k, None, 4);
    let (q, k) = (random(&[1, 2, 7, 4], 45), random(&[1, 2, 3, 4], 46));
    run("attention_windowed, seq_q > seq_k", &q, &k, &k, None, 2);
    run("attention_windowed, window 0", &q, &k, &k, None, 0);
    let (q, k) = (random(&[1, 2, 5, 8], 47), random(&[1, 1, 700, 8], 48));
    run("attention_windowed 700 keys", &q, &k, &k, None, 300);
}

#[test]
fn attention_matches_the_cpu() {
    let Some(gpu) = test_gpu() else { return };
    let run = |what: &str, q: &Tensor, k: &Tensor, v: &Tensor, causal: bool, mask: Option<&[bool]>| {
        let found = Compute::attention(&up(q, &gpu), &up(k, &gpu), &up(v, &gpu), causal, mask).unwrap();
        compare(what, &found, &Tensor::attention(q, k, v, causal, mask).unwrap(), TOLERANCE)
    };
    run(
        "attention plain",
        &random(&[2, 3, 5, 8], 1),
        &random(&[2, 3, 7, 8], 2),
        &random(&[2, 3, 7, 4], 3),
        false,
        None,
    );
    let mask = [true, true, true, true, false, false, false, true, true, true, true, true];
    let (q, k, v) = (random(&[2, 8, 6, 16], 4), random(&[2, 2, 6, 16], 5), random(&[2, 2, 6, 16], 6));
    run("attention grouped causal masked", &q, &k, &v, true, Some(&mask));
    // Two new queries against five keys (a cache of three); every key masked gives zeros.
    let (q, k, v) = (random(&[1, 2, 2, 4], 7), random(&[1, 1, 5, 4], 8), random(&[1, 1, 5, 4], 9));
    run("attention causal at the end", &q, &k, &v, true, None);
    run("attention all masked", &q, &k, &v, false, Some(&[false; 5]));
    // More keys than queries... and more queries than keys under the causal mask.
    let (q, k) = (random(&[1, 2, 7, 4], 10), random(&[1, 2, 3, 4], 11));
    run("attention causal, seq_q > seq_k", &q, &k, &k, true, None);
    // Many heads of a longer sequence; long rows past one workgroup.
    let (q, k) = (random(&[1, 12, 64, 32], 12), random(&[1, 4, 64, 32], 13));
    run("attention 12 heads over 4", &q, &k, &k, true, None);
    let (q, k) = (random(&[1, 1, 3, 8], 14), random(&[1, 1, 700, 8], 15));
    run("attention 700 keys", &q, &k, &k, false, None);
    // Permuted [batch, seq, heads, d] views in half precision.
    let stored_q = cast(&random(&[2, 5, 4, 8], 16), DType::BF16);
    let stored_k = random(&[2, 5, 2, 8], 17);
    let stored_v = cast(&random(&[2, 5, 2, 8], 18), DType::F16);
    let permute = |t: &Tensor| t.permute(&[0, 2, 1, 3]).unwrap();
    let permute_gpu = |t: &Tensor| up(t, &gpu).permute(&[0, 2, 1, 3]).unwrap();
    let found =
        Compute::attention(&permute_gpu(&stored_q), &permute_gpu(&stored_k), &permute_gpu(&stored_v), true, None)
            .unwrap();
    let expected =
        Tensor::attention(&permute(&stored_q), &permute(&stored_k), &permute(&stored_v), true, None).unwrap();
    compare("attention permuted half precision", &found, &expected, TOLERANCE);
    // Empty sizes and refusals.
    run(
        "attention no keys",
        &random(&[1, 2, 3, 4], 19),
        &random(&[1, 1, 0, 4], 20),
        &random(&[1, 1, 0, 4], 21),
        true,
        None,
    );
    run(
        "attention no queries",
        &random(&[1, 2, 0, 4], 22),
        &random(&[1, 1, 3, 4], 23),
        &random(&[1, 1, 3, 4], 24),
        true,
        None,
    );
    let (q, k) = (up(&random(&[1, 3, 2, 4], 25), &gpu), up(&random(&[1, 2, 2, 4], 26), &gpu));
    assert!(matches!(Compute::attention(&q, &k, &k, false, None), Err(Error::ShapeMismatch { .. })));
    let k = up(&random(&[1, 1, 2, 4], 27), &gpu);
    assert!(matches!(Compute::attention(&q, &k, &k, false, Some(&[true])), Err(Error::LengthMismatch { .. })));
}

#[test]
fn cache_writes_match_the_cpu_and_copy_shared_buffers() {
    let Some(gpu) = test_gpu() else { return };
    // A `[batch, kv_heads, capacity, d]` cache: a prefill of three rows, then one permuted
    // bf16 row, then attention over the filled rows (a narrowed view read in place).
    let mut host = Tensor::zeros(DType::F32, &[2, 2, 6, 4]);
    let mut device = up(&host, &gpu);
    let prefill = random(&[2, 2, 3, 4], 1);
    let stored = cast(&random(&[2, 1, 2, 4], 2), DType::BF16);
    let step = stored.permute(&[0, 2, 1, 3]).unwrap();
    host.write_slice(2, 0, &prefill).unwrap();
    device.write_slice(2, 0, &up(&prefill, &gpu)).unwrap();
    host.write_slice(2, 3, &step).unwrap();
    device.write_slice(2, 3, &up(&stored, &gpu).permute(&[0, 2, 1, 3]).unwrap()).unwrap();
    compare("write_slice", &device, &host, 0.0);
    let query = random(&[2, 4, 1, 4], 3);
    let filled = |cache: &Tensor| cache.narrow(2, 0, 4).unwrap();
    let expected = Tensor::attention(&query, &filled(&host), &filled(&host), true, None).unwrap();
    let view = device.narrow(2, 0, 4).unwrap();
    let found = Compute::attention(&up(&query, &gpu), &view, &view, true, None).unwrap();
    compare("attention over cached rows", &found, &expected, TOLERANCE);
    // With a view alive the write goes into a copy: the view keeps the old values.
    let before = view.to_host().unwrap();
    device.write_slice(2, 0, &up(&random(&[2, 2, 1, 4], 4), &gpu)).unwrap();
    assert_eq!(view.to_host().unwrap().to_bytes().unwrap(), before.to_bytes().unwrap());
    assert!(!device.shares_storage(&view));
    let zeros = device.new_zeros(&[3, 5]).unwrap();
    assert_eq!(zeros.to_f32_vec().unwrap(), [0.0; 15]);
    let row = up(&random(&[2, 2, 1, 4], 5), &gpu);
    assert!(matches!(device.write_slice(2, 6, &row), Err(Error::NarrowOutOfRange { .. })));
}

#[test]
fn reshape_and_reads() {
    let Some(gpu) = test_gpu() else { return };
    let x = random(&[3, 4], 1);
    let gx = up(&x, &gpu);
    let reshaped = gx.reshape(&[2, 6]).unwrap();
    assert!(reshaped.shares_storage(&gx));
    assert_eq!(reshaped.to_f32_vec().unwrap(), x.to_f32_vec().unwrap());
    let transposed = gx.transpose(0, 1).unwrap().reshape(&[12]).unwrap();
    assert_eq!(
        transposed.to_f32_vec().unwrap(),
        x.transpose(0, 1).unwrap().reshape(&[12]).unwrap().to_f32_vec().unwrap()
    );
    assert!(matches!(gx.reshape(&[5]), Err(Error::Reshape { .. })));
    assert_eq!(gx.argmax_last().unwrap(), x.argmax_last().unwrap());
    assert!(matches!(up(&Tensor::zeros(DType::F32, &[2, 0]), &gpu).argmax_last(), Err(Error::BadShape { .. })));
}

/// A two-layer perceptron written once for both devices.
fn mlp<T: Compute>(x: &T, first: (&T, &T), second: (&T, &T)) -> crate::Result<T> {
    x.linear(first.0, Some(first.1))?.gelu()?.linear(second.0, Some(second.1))
}

#[test]
fn a_model_written_once_runs_on_both_devices() {
    let Some(gpu) = test_gpu() else { return };
    let x = random(&[4, 7, 32], 1);
    let (w1, b1) = (cast(&random(&[96, 32], 2), DType::BF16), random(&[96], 3));
    let (w2, b2) = (random(&[32, 96], 4), random(&[32], 5));
    let expected = mlp(&x, (&w1, &b1), (&w2, &b2)).unwrap();
    let found = mlp(&up(&x, &gpu), (&up(&w1, &gpu), &up(&b1, &gpu)), (&up(&w2, &gpu), &up(&b2, &gpu))).unwrap();
    compare("mlp end to end", &found, &expected, TOLERANCE);
    // The generic methods of layout and transfer agree too.
    let host = Compute::to_host(&found).unwrap();
    assert_eq!(host.shape(), Compute::shape(&expected));
    let viewed = Compute::reshape(&Compute::transpose(&found, 0, 1).unwrap(), &[7 * 4, 32]).unwrap();
    assert_eq!(Compute::dtype(&viewed), DType::F32);
    let host_viewed = Compute::reshape(&Compute::transpose(&expected, 0, 1).unwrap(), &[7 * 4, 32]).unwrap();
    compare("mlp transposed and reshaped", &viewed, &host_viewed, TOLERANCE);
}

#[test]
fn a_kernel_that_does_not_compile_is_an_error() {
    let Some(gpu) = test_gpu() else { return };
    let error = gpu.pipeline("broken", "@compute @workgroup_size(1) fn main( {", "main").unwrap_err();
    assert!(matches!(error, Error::Gpu { action: "compile a kernel", .. }), "{error}");
}
