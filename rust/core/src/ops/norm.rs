//! RMSNorm as ggml computes it (ggml-cpu ops.cpp `rms_norm_f32`): the sum of squares in
//! f64, `scale = 1 / sqrtf(mean + eps)` in f32, `y = x * scale`, then a separate
//! multiplication by the weight (ggml's `mul` op), so rounding happens in the same places.

/// In place over one row: x = (x * scale) * w (w: the norm weight, or None for plain
/// `ggml_rms_norm`). `x.len()` is the normalized dimension.
pub fn rms_norm_row(x: &mut [f32], w: Option<&[f32]>, eps: f32) {
    let mut sum = 0f64;
    for &v in x.iter() {
        sum += (v * v) as f64;
    }
    rms_norm_finish(x, sum, w, eps);
}

/// `rms_norm_row` over every `dim`-wide row of `x` (its length a multiple of `dim`). The
/// sums of squares are sequential f64 additions (ggml's order) whose latency bounds one
/// row; on x86-64 SIMD sets 8 rows go at once, one row per f64 lane (two groups of 4), each
/// lane the same additions in the same order: bit-identical to `rms_norm_row`, ~4-8x
/// faster.
pub fn rms_norm_rows_inplace(x: &mut [f32], dim: usize, w: Option<&[f32]>, eps: f32) {
    if dim == 0 {
        return;
    }
    #[allow(unused_mut)] // only the x86-64 vector path advances it
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    {
        if crate::quant::table::kernels().avx2_math {
            let n8 = x.len() / dim / 8 * 8;
            for r in (0..n8).step_by(8) {
                let rows = &mut x[r * dim..(r + 8) * dim];
                // SAFETY: avx2_math: the CPU has AVX2; rows holds 8 rows of dim.
                let sums = unsafe { sumsq8_avx2(rows, dim) };
                for (row, &sum) in rows.chunks_exact_mut(dim).zip(&sums) {
                    rms_norm_finish(row, sum, w, eps);
                }
            }
            done = n8 * dim;
        }
    }
    for row in x[done..].chunks_exact_mut(dim) {
        rms_norm_row(row, w, eps);
    }
}

/// The f64 sums of squares of 8 rows of `dim` (`rows`: [8][dim]), each lane sequential in
/// element order from 0.0: (v * v) in f32, widened, added.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn sumsq8_avx2(rows: &[f32], dim: usize) -> [f64; 8] {
    use std::arch::x86_64::*;
    debug_assert!(rows.len() == 8 * dim);
    let p = rows.as_ptr();
    let mut a = _mm256_setzero_pd();
    let mut b = _mm256_setzero_pd();
    for i in 0..dim {
        let va = _mm_set_ps(*p.add(3 * dim + i), *p.add(2 * dim + i), *p.add(dim + i), *p.add(i));
        let vb = _mm_set_ps(*p.add(7 * dim + i), *p.add(6 * dim + i), *p.add(5 * dim + i), *p.add(4 * dim + i));
        a = _mm256_add_pd(a, _mm256_cvtps_pd(_mm_mul_ps(va, va)));
        b = _mm256_add_pd(b, _mm256_cvtps_pd(_mm_mul_ps(vb, vb)));
    }
    let mut out = [0f64; 8];
    _mm256_storeu_pd(out.as_mut_ptr(), a);
    _mm256_storeu_pd(out.as_mut_ptr().add(4), b);
    out
}

/// The rest of `rms_norm_row` once the f64 sum of squares is known.
#[inline]
fn rms_norm_finish(x: &mut [f32], sum: f64, w: Option<&[f32]>, eps: f32) {
    let mean = (sum / x.len() as f64) as f32;
    let scale = 1.0f32 / (mean + eps).sqrt();
    match w {
        Some(w) => {
            for (v, g) in x.iter_mut().zip(w) {
                *v = (*v * scale) * g;
            }
        }
        None => {
            for v in x.iter_mut() {
                *v *= scale;
            }
        }
    }
}

/// RMSNorm of `n_rows` rows of `dim` from `src` into `dst` (both [n_rows, dim]).
pub fn rms_norm_rows(src: &[f32], dst: &mut [f32], dim: usize, w: Option<&[f32]>, eps: f32) {
    let n = src.len().min(dst.len()) / dim * dim;
    dst[..n].copy_from_slice(&src[..n]);
    rms_norm_rows_inplace(&mut dst[..n], dim, w, eps);
}

/// LayerNorm of one row in place, as ggml computes `ggml_norm` then `ggml_mul` (w) and
/// `ggml_add` (b) on x86-64 with AVX2: the mean from an f64 sum rounded to f32, the variance
/// from groups of 8 squared deviations each summed in f32 (ggml's 8-lane horizontal order)
/// and accumulated in f64, `scale = 1 / sqrtf(var + eps)`, then y = ((x - mean) * scale) * w + b.
pub fn layer_norm_row(x: &mut [f32], w: Option<&[f32]>, b: Option<&[f32]>, eps: f32) {
    let n = x.len();
    if n == 0 {
        return;
    }
    let mut sum = 0f64;
    for &v in x.iter() {
        sum += v as f64;
    }
    let mean = (sum as f32) / n as f32;
    let mut var = 0f64;
    let mut i = 0;
    while i + 8 <= n {
        let mut d = [0f32; 8];
        for k in 0..8 {
            x[i + k] -= mean;
            d[k] = x[i + k] * x[i + k];
        }
        var += super::vec::hsum8_ggml(&d) as f64;
        i += 8;
    }
    while i < n {
        x[i] -= mean;
        var += (x[i] * x[i]) as f64;
        i += 1;
    }
    let var = (var / n as f64) as f32;
    let scale = 1.0f32 / (var + eps).sqrt();
    for v in x.iter_mut() {
        *v *= scale;
    }
    if let Some(w) = w {
        for (v, g) in x.iter_mut().zip(w) {
            *v *= g;
        }
    }
    if let Some(b) = b {
        for (v, c) in x.iter_mut().zip(b) {
            *v += c;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layer_norm_zero_mean_unit_variance() {
        let mut x: Vec<f32> = (0..67).map(|i| (i as f32 * 0.7).sin() * 3.0 + 1.5).collect();
        layer_norm_row(&mut x, None, None, 0.0);
        let m: f32 = x.iter().sum::<f32>() / 67.0;
        let v: f32 = x.iter().map(|a| a * a).sum::<f32>() / 67.0;
        assert!(m.abs() < 1e-5 && (v - 1.0).abs() < 1e-4, "{m} {v}");
    }

    #[test]
    fn rms_norm_rows_equal_the_one_row_norm_bit_for_bit() {
        // 0..21 rows (a partial group of 8 and the tail), widths 1..70 and 640, values
        // spanning many binades (the f64 sum rounds), with and without a weight.
        let mut z = 0x9e37_79b9_7f4a_7c15u64;
        let mut rnd = || {
            z ^= z << 13;
            z ^= z >> 7;
            z ^= z << 17;
            let m = ((z >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0;
            m * 2f32.powi(((z >> 8) % 40) as i32 - 20)
        };
        for dim in (1..70).chain([640]) {
            for n in [0usize, 1, 7, 8, 9, 16, 21] {
                let x: Vec<f32> = (0..n * dim).map(|_| rnd()).collect();
                let w: Vec<f32> = (0..dim).map(|_| rnd()).collect();
                for wt in [None, Some(&w[..])] {
                    let mut want = x.clone();
                    for r in want.chunks_exact_mut(dim) {
                        rms_norm_row(r, wt, 1e-6);
                    }
                    let mut got = x.clone();
                    rms_norm_rows_inplace(&mut got, dim, wt, 1e-6);
                    let bad = want.iter().zip(&got).position(|(a, b)| a.to_bits() != b.to_bits());
                    assert!(bad.is_none(), "dim {dim}, {n} rows, weight {}: element {bad:?}", wt.is_some());
                }
            }
        }
    }

    #[test]
    fn unit_rms_after_norm() {
        let mut x: Vec<f32> = (0..64).map(|i| (i as f32 - 20.0) * 0.37).collect();
        rms_norm_row(&mut x, None, 0.0);
        let ms: f32 = x.iter().map(|v| v * v).sum::<f32>() / 64.0;
        assert!((ms - 1.0).abs() < 1e-5);
    }
}
