//! The fused dequantize-matmul: `y = x W^T` where `W` is produced a tile of rows at a time by a
//! decoder, so the full float weight never exists in memory.

use rayon::prelude::*;

/// Weight values decoded per tile (rows times columns), small enough to stay in cache.
const TILE_VALUES: usize = 1 << 16;

/// `x` is `[m, k]` row-major; `decode(first, count, out)` writes rows `first..first + count` of
/// the `[n, k]` weight into `out`. Returns `y` `[m, n]` row-major.
pub(crate) fn fused_matmul(
    x: &[f32],
    m: usize,
    k: usize,
    n: usize,
    decode: impl Fn(usize, usize, &mut [f32]) + Sync,
) -> Vec<f32> {
    if m == 0 || n == 0 {
        return vec![0.0; m * n];
    }
    let tile = (TILE_VALUES / k.max(1)).clamp(1, 64).min(n);
    // Each tile computes `W_tile x^T`, `[tile, m]`: the tiles of this transposed result are
    // contiguous, so tasks write disjoint slices.
    let mut transposed = vec![0f32; n * m];
    transposed.par_chunks_mut(tile * m).enumerate().for_each_init(
        || vec![0f32; tile * k],
        |buffer, (at, out)| {
            let rows = out.len() / m;
            let buffer = &mut buffer[..rows * k];
            decode(at * tile, rows, buffer);
            if m == 1 {
                for (value, row) in out.iter_mut().zip(buffer.chunks_exact(k)) {
                    *value = dot(row, x);
                }
            } else {
                tile_product(buffer, x, rows, m, k, out);
            }
        },
    );
    if m == 1 {
        return transposed;
    }
    let mut out = vec![0f32; m * n];
    for (row, values) in transposed.chunks_exact(m).enumerate() {
        for (col, &value) in values.iter().enumerate() {
            out[col * n + row] = value;
        }
    }
    out
}

/// `out[r, j] = sum_k tile[r, k] * x[j, k]` for a `[rows, k]` tile and `[m, k]` inputs.
fn tile_product(tile: &[f32], x: &[f32], rows: usize, m: usize, k: usize, out: &mut [f32]) {
    // SAFETY: the pointers cover `rows * k`, `m * k` and `rows * m` elements, as the strides
    // describe: the tile is row-major `[rows, k]` (row stride k), `x^T` reads `x` as `[k, m]`
    // with column stride k, and `out` is row-major `[rows, m]`. Nothing else aliases `out`.
    unsafe {
        gemm::gemm(
            rows,
            m,
            k,
            out.as_mut_ptr(),
            1,
            m as isize,
            false,
            tile.as_ptr(),
            1,
            k as isize,
            x.as_ptr(),
            k as isize,
            1,
            0.0,
            1.0,
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
}

/// A dot product with eight independent sums, which the compiler vectorises.
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut sums = [0f32; 8];
    let chunks = a.len() / 8 * 8;
    for (x, y) in a[..chunks].chunks_exact(8).zip(b[..chunks].chunks_exact(8)) {
        for i in 0..8 {
            sums[i] += x[i] * y[i];
        }
    }
    let tail: f32 = a[chunks..].iter().zip(&b[chunks..]).map(|(x, y)| x * y).sum();
    sums.iter().sum::<f32>() + tail
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fused_equals_dense() {
        let (m, k, n) = (3, 40, 70);
        let x: Vec<f32> = (0..m * k).map(|i| ((i * 7) % 13) as f32 - 6.0).collect();
        let w: Vec<f32> = (0..n * k).map(|i| ((i * 5) % 11) as f32 - 5.0).collect();
        let decode = |first: usize, count: usize, out: &mut [f32]| {
            out.copy_from_slice(&w[first * k..(first + count) * k]);
        };
        let weight = crate::Tensor::from_vec(w.clone(), &[n, k]).unwrap();
        let dense = |rows: usize| {
            let input = crate::Tensor::from_vec(x[..rows * k].to_vec(), &[rows, k]).unwrap();
            input.linear(&weight, None).unwrap().to_vec::<f32>().unwrap()
        };
        assert_eq!(fused_matmul(&x, m, k, n, decode), dense(m));
        assert_eq!(fused_matmul(&x[..k], 1, k, n, decode), dense(1));
    }
}
