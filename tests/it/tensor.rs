//! Tensors: views against a naive row-major reference (property tests), casts and typed access.

use half::{bf16, f16};
use nnx::{DType, Tensor};
use proptest::prelude::*;

/// A row-major array: the reference that views are checked against.
#[derive(Clone, Debug)]
struct Naive {
    shape: Vec<usize>,
    data: Vec<i32>,
}

impl Naive {
    fn strides(&self) -> Vec<usize> {
        let mut strides = vec![1; self.shape.len()];
        for axis in (0..self.shape.len().saturating_sub(1)).rev() {
            strides[axis] = strides[axis + 1] * self.shape[axis + 1];
        }
        strides
    }

    /// Builds the array whose element at index `i` is `self[source(i)]`.
    fn remap(&self, shape: Vec<usize>, source: impl Fn(&[usize]) -> Vec<usize>) -> Naive {
        let count = shape.iter().product();
        let strides = self.strides();
        let mut data = Vec::with_capacity(count);
        let mut index = vec![0; shape.len()];
        for _ in 0..count {
            let from = source(&index);
            data.push(self.data[from.iter().zip(&strides).map(|(i, s)| i * s).sum::<usize>()]);
            for axis in (0..shape.len()).rev() {
                index[axis] += 1;
                if index[axis] < shape[axis] {
                    break;
                }
                index[axis] = 0;
            }
        }
        Naive { shape, data }
    }

    fn permute(&self, axes: &[usize]) -> Naive {
        let shape = axes.iter().map(|&a| self.shape[a]).collect();
        self.remap(shape, |index| {
            let mut from = vec![0; axes.len()];
            for (i, &a) in axes.iter().enumerate() {
                from[a] = index[i];
            }
            from
        })
    }

    fn narrow(&self, axis: usize, start: usize, len: usize) -> Naive {
        let mut shape = self.shape.clone();
        shape[axis] = len;
        self.remap(shape, |index| {
            let mut from = index.to_vec();
            from[axis] += start;
            from
        })
    }
}

#[derive(Clone, Debug)]
enum ViewOp {
    Transpose(usize, usize),
    Permute(Vec<usize>),
    Narrow(usize, usize, usize),
    Split(usize, usize, usize),
    Reshape(Vec<usize>),
}

fn apply(tensor: &Tensor, naive: &Naive, op: &ViewOp) -> (Tensor, Naive) {
    let rank = naive.shape.len();
    match op {
        ViewOp::Transpose(a, b) => {
            let (a, b) = (a % rank, b % rank);
            let mut axes: Vec<usize> = (0..rank).collect();
            axes.swap(a, b);
            (tensor.transpose(a, b).unwrap(), naive.permute(&axes))
        }
        ViewOp::Permute(keys) => {
            let mut axes: Vec<usize> = (0..rank).collect();
            axes.sort_by_key(|&a| keys[a % keys.len()].wrapping_mul(31).wrapping_add(a));
            (tensor.permute(&axes).unwrap(), naive.permute(&axes))
        }
        ViewOp::Narrow(axis, start, len) => {
            let axis = axis % rank;
            let size = naive.shape[axis];
            let start = start % size;
            let len = 1 + len % (size - start);
            (tensor.narrow(axis, start, len).unwrap(), naive.narrow(axis, start, len))
        }
        ViewOp::Split(axis, parts, pick) => {
            let axis = axis % rank;
            let size = naive.shape[axis];
            let divisors: Vec<usize> = (1..=size).filter(|d| size.is_multiple_of(*d)).collect();
            let parts = divisors[parts % divisors.len()];
            let pick = pick % parts;
            let piece = size / parts;
            (tensor.split(axis, parts).unwrap()[pick].clone(), naive.narrow(axis, pick * piece, piece))
        }
        ViewOp::Reshape(seed) => {
            // Regroup the elements into a shape of the same count: split the count into factors.
            let mut count: usize = naive.shape.iter().product();
            let mut shape = Vec::new();
            for &s in seed {
                let factor = (2..=count).find(|f| count.is_multiple_of(*f) && (s % 2 == 0)).unwrap_or(1);
                shape.push(factor);
                count /= factor;
            }
            shape.push(count);
            let reference = Naive { shape: shape.clone(), data: naive.data.clone() };
            (tensor.reshape(&shape).unwrap(), reference)
        }
    }
}

fn view_op() -> impl Strategy<Value = ViewOp> {
    prop_oneof![
        (0..4usize, 0..4usize).prop_map(|(a, b)| ViewOp::Transpose(a, b)),
        prop::collection::vec(0..100usize, 4).prop_map(ViewOp::Permute),
        (0..4usize, 0..8usize, 0..8usize).prop_map(|(a, s, l)| ViewOp::Narrow(a, s, l)),
        (0..4usize, 0..4usize, 0..4usize).prop_map(|(a, p, i)| ViewOp::Split(a, p, i)),
        prop::collection::vec(0..4usize, 0..3).prop_map(ViewOp::Reshape),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn chains_of_views_match_a_naive_reference(
        shape in prop::collection::vec(1..5usize, 1..5),
        ops in prop::collection::vec(view_op(), 1..6),
    ) {
        let count: usize = shape.iter().product();
        let data: Vec<i32> = (0..count as i32).collect();
        let mut tensor = Tensor::from_vec(data.clone(), &shape).unwrap();
        let mut naive = Naive { shape, data };
        for op in &ops {
            let (next, reference) = apply(&tensor, &naive, op);
            tensor = next;
            naive = reference;
            prop_assert_eq!(tensor.shape(), &naive.shape[..]);
        }
        let dense = tensor.contiguous();
        prop_assert!(dense.is_contiguous());
        prop_assert_eq!(dense.to_vec::<i32>().unwrap(), naive.data.clone());
        prop_assert_eq!(tensor.to_vec::<i32>().unwrap(), naive.data.clone());
        prop_assert_eq!(tensor.copy().to_vec::<i32>().unwrap(), naive.data);
    }

    #[test]
    fn casts_round_trip_through_wider_floats(values in prop::collection::vec(-1.0e4f32..1.0e4, 1..300)) {
        let tensor = Tensor::from_vec(values.clone(), &[values.len()]).unwrap();
        let wide = tensor.to_dtype(DType::F64).unwrap().to_dtype(DType::F32).unwrap();
        prop_assert_eq!(wide.to_vec::<f32>().unwrap(), values.clone());
        let halves = tensor.to_dtype(DType::BF16).unwrap();
        let expected: Vec<bf16> = values.iter().map(|&v| bf16::from_f32(v)).collect();
        prop_assert_eq!(halves.to_vec::<bf16>().unwrap(), expected.clone());
        let back: Vec<f32> = expected.iter().map(|v| v.to_f32()).collect();
        prop_assert_eq!(halves.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap(), back);
        let f16s: Vec<f16> = values.iter().map(|&v| f16::from_f32(v)).collect();
        prop_assert_eq!(tensor.to_dtype(DType::F16).unwrap().to_vec::<f16>().unwrap(), f16s);
    }
}

#[test]
fn large_casts_run_in_parallel_and_stay_exact() {
    let count = 1 << 20;
    let values: Vec<bf16> = (0..count).map(|i| bf16::from_f32((i % 977) as f32 * 0.25 - 100.0)).collect();
    let tensor = Tensor::from_vec(values.clone(), &[1024, 1024]).unwrap();
    let wide = tensor.transpose(0, 1).unwrap().to_dtype(DType::F32).unwrap();
    let got = wide.to_vec::<f32>().unwrap();
    for (row, chunk) in got.chunks(1024).enumerate().step_by(97) {
        for (col, &value) in chunk.iter().enumerate() {
            assert_eq!(value, values[col * 1024 + row].to_f32());
        }
    }
}

#[test]
fn every_element_type_round_trips() {
    fn check<T: nnx::Element + PartialEq + std::fmt::Debug>(values: Vec<T>) {
        let tensor = Tensor::from_vec(values.clone(), &[values.len()]).unwrap();
        assert_eq!(tensor.dtype(), T::DTYPE);
        assert_eq!(tensor.to_vec::<T>().unwrap(), values);
    }
    check(vec![1.5f32, -2.0]);
    check(vec![1.5f64, -2.0]);
    check(vec![f16::from_f32(0.5)]);
    check(vec![bf16::from_f32(-0.5)]);
    check(vec![1u8, 255]);
    check(vec![-1i8, 127]);
    check(vec![65535u16]);
    check(vec![-300i16]);
    check(vec![u32::MAX]);
    check(vec![i32::MIN]);
    check(vec![u64::MAX]);
    check(vec![i64::MIN]);
    check(vec![true, false, true]);
}

#[test]
fn misuse_gets_errors_that_say_what_to_do() {
    let tensor = Tensor::from_vec(vec![1i32, 2, 3, 4, 5, 6], &[2, 3]).unwrap();
    let message = tensor.to_dtype(DType::F32).unwrap_err().to_string();
    assert!(message.contains("cannot cast I32 to F32"), "{message}");
    let message = tensor.split(1, 2).unwrap_err().to_string();
    assert!(message.contains("size 3") && message.contains("2 does not divide"), "{message}");
    let message = tensor.narrow(0, 1, 2).unwrap_err().to_string();
    assert!(message.contains("cannot take 2 elements from 1 along axis 0 of size 2"), "{message}");
    let message = tensor.transpose(0, 2).unwrap_err().to_string();
    assert!(message.contains("axis 2 is out of range for a tensor of rank 2"), "{message}");
    let message = Tensor::from_vec(vec![1.0f32; 5], &[2, 3]).unwrap_err().to_string();
    assert!(message.contains("holds 6 elements but 5 were given"), "{message}");
    let message = tensor.reshape(&[4]).unwrap_err().to_string();
    assert!(message.contains("cannot reshape [2, 3] (6 elements) into [4]"), "{message}");
    let meta = Tensor::meta(DType::F32, &[2]);
    assert!(meta.to_vec::<f32>().unwrap_err().to_string().contains("meta"));
    assert!(meta.transpose(0, 0).unwrap().is_meta());
    assert!(meta.to_dtype(DType::BF16).unwrap().is_meta());
}

#[test]
fn sub_byte_dtypes_keep_whole_views_only() {
    let packed = Tensor::from_bytes(DType::F4, &[2, 4], &[0x21, 0x43, 0x65, 0x87]).unwrap();
    assert_eq!(packed.byte_len(), 4);
    assert_eq!(packed.to_bytes().unwrap().as_ref(), &[0x21, 0x43, 0x65, 0x87]);
    assert!(packed.transpose(0, 1).is_err());
    assert!(packed.narrow(1, 0, 2).is_err());
    assert_eq!(packed.reshape(&[8]).unwrap().shape(), &[8]);
    assert!(Tensor::from_bytes(DType::F4, &[3], &[0, 0]).is_ok());
}
