// Elementwise kernels: arithmetic with broadcasting, scalar arithmetic and activations. One
// invocation computes one element of the contiguous f32 output; both operands are read through
// their (broadcast) strides, so views and broadcasts need no copy.

struct Params {
    count: u32,
    rank: u32,
    op: u32,
    // The scalar of `scale` and `add_scalar`, as f32 bits.
    scalar: u32,
    a_kind: u32,
    a_offset: u32,
    b_kind: u32,
    b_offset: u32,
    shape: array<vec4<u32>, 2>,
    a_strides: array<vec4<u32>, 2>,
    b_strides: array<vec4<u32>, 2>,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> a: array<u32>;
@group(0) @binding(2) var<storage, read> b: array<u32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

fn read_a(i: u32) -> f32 {
    let kind = params.a_kind;
    return decode(kind, i, a[first_word(kind, i)], a[second_word(kind, i)]);
}

fn read_b(i: u32) -> f32 {
    let kind = params.b_kind;
    return decode(kind, i, b[first_word(kind, i)], b[second_word(kind, i)]);
}

// erf as FreeBSD's `s_erff.c` (and so the host's `libm::erff`) computes it: rational
// approximations on [0, 0.84375), [0.84375, 1.25), [1.25, 1/0.35) and [1/0.35, 6), within an
// ulp or two of f32 rounding (what `exp` adds on the device).
fn erf(x: f32) -> f32 {
    let bits = bitcast<u32>(x) & 0x7fffffffu;
    let ax = abs(x);
    if bits < 0x3f580000u {
        if bits < 0x31800000u {
            return 0.125 * (8.0 * x + 1.0270333290e+00 * x);
        }
        let z = x * x;
        let r = 1.2837916613e-01 + z * (-3.2504209876e-01 + z * (-2.8481749818e-02 + z * (-5.7702702470e-03
            + z * -2.3763017452e-05)));
        let s = 1.0 + z * (3.9791721106e-01 + z * (6.5022252500e-02 + z * (5.0813062117e-03 + z * (1.3249473704e-04
            + z * -3.9602282413e-06))));
        return x + x * (r / s);
    }
    var y: f32;
    if bits >= 0x40c00000u {
        y = 1.0;
    } else if bits < 0x3fa00000u {
        let s = ax - 1.0;
        let p = -2.3621185683e-03 + s * (4.1485610604e-01 + s * (-3.7220788002e-01 + s * (3.1834661961e-01
            + s * (-1.1089469492e-01 + s * (3.5478305072e-02 + s * -2.1663755178e-03)))));
        let q = 1.0 + s * (1.0642088205e-01 + s * (5.4039794207e-01 + s * (7.1828655899e-02 + s * (1.2617121637e-01
            + s * (1.3637083583e-02 + s * 1.1984500103e-02)))));
        y = 1.0 - (1.0 - 8.4506291151e-01 - p / q);
    } else {
        let s = 1.0 / (ax * ax);
        var r: f32;
        var big_s: f32;
        if bits < 0x4036db6du {
            r = -9.8649440333e-03 + s * (-6.9385856390e-01 + s * (-1.0558626175e+01 + s * (-6.2375331879e+01
                + s * (-1.6239666748e+02 + s * (-1.8460508728e+02 + s * (-8.1287437439e+01 + s * -9.8143291473e+00))))));
            big_s = 1.0 + s * (1.9651271820e+01 + s * (1.3765776062e+02 + s * (4.3456588745e+02 + s * (6.4538726807e+02
                + s * (4.2900814819e+02 + s * (1.0863500214e+02 + s * (6.5702495575e+00 + s * -6.0424413532e-02)))))));
        } else {
            r = -9.8649431020e-03 + s * (-7.9928326607e-01 + s * (-1.7757955551e+01 + s * (-1.6063638306e+02
                + s * (-6.3756646729e+02 + s * (-1.0250950928e+03 + s * -4.8351919556e+02)))));
            big_s = 1.0 + s * (3.0338060379e+01 + s * (3.2579251099e+02 + s * (1.5367296143e+03 + s * (3.1998581543e+03
                + s * (2.5530502930e+03 + s * (4.7452853394e+02 + s * -2.2440952301e+01))))));
        }
        // exp(-x²) split as exp(-z² - 0.5625) · exp((z - x)(z + x) + r/S), with z the top bits
        // of x, so that the large part of the exponent is exact.
        let z = bitcast<f32>(bitcast<u32>(ax) & 0xffffe000u);
        y = 1.0 - exp(-z * z - 0.5625) * exp((z - ax) * (z + ax) + r / big_s) / ax;
    }
    return select(y, -y, x < 0.0);
}

// tanh without the overflow of `sinh / cosh`: a Padé approximant (Lambert's continued fraction
// to x²/13, accurate far below f32 rounding) near zero, `(1 - e^-2|x|) / (1 + e^-2|x|)` beyond.
fn tanh_accurate(x: f32) -> f32 {
    let ax = abs(x);
    if ax < 1.0 {
        let z = x * x;
        return x * (135135.0 + z * (17325.0 + z * (378.0 + z))) / (135135.0 + z * (62370.0 + z * (3150.0 + z * 28.0)));
    }
    let t = exp(-2.0 * min(ax, 20.0));
    let y = (1.0 - t) / (1.0 + t);
    return select(y, -y, x < 0.0);
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) group: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
        @builtin(local_invocation_index) local: u32) {
    let e = invocation(group, groups, local);
    if e >= params.count {
        return;
    }
    let offsets = vec2<u32>(params.a_offset, params.b_offset);
    let at = strided_pair(e, params.rank, offsets, params.shape, params.a_strides, params.b_strides);
    let at_a = at.x;
    let at_b = at.y;
    let x = read_a(at_a);
    let scalar = bitcast<f32>(params.scalar);
    var y: f32;
    switch params.op {
        case 0u: {
            y = x + read_b(at_b);
        }
        case 1u: {
            y = x - read_b(at_b);
        }
        case 2u: {
            y = x * read_b(at_b);
        }
        case 3u: {
            y = x / read_b(at_b);
        }
        case 4u: {
            y = x * scalar;
        }
        case 5u: {
            y = x + scalar;
        }
        case 6u: {
            y = 0.5 * x * (1.0 + erf(x * 0.70710677));
        }
        case 7u: {
            y = 0.5 * x * (1.0 + tanh_accurate(0.7978846 * (x + 0.044715 * x * x * x)));
        }
        case 8u: {
            y = x / (1.0 + exp(-x));
        }
        case 9u: {
            y = max(x, 0.0);
        }
        case 10u: {
            y = tanh_accurate(x);
        }
        default: {
            y = x;
        }
    }
    out[e] = y;
}
