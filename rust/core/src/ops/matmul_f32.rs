//! F32 weights times f32 activations in llama.cpp's summation order (its x86 AVX2 build):
//! where llamafile's tinyBLAS takes the product (the row length a multiple of 8 and the
//! weight's row count a multiple of 4), one 8-lane FMA accumulator per output over the row,
//! reduced as (l + l4), then (t0 + t2) + (t1 + t3); elsewhere `ggml_vec_dot_f32`: four
//! 8-lane FMA accumulators over blocks of 32, reduced (s0 + s2) + (s1 + s3), lanes l + l4,
//! then hadd, hadd, and the elements past the last block added one product at a time
//! (a multiply, then an add: GCC does not contract them there).
//!
//! The graph builders take this path for F32 weights when the forward pass asks for it
//! (`Step::f32_llamacpp`: gemma3n, whose 4 AltUp streams over 20+ layers turn any other
//! rounding into visible logit differences); the others keep pyllama's F32 kernels.

use crate::error::{Error, Result};
use crate::ggml_type::GgmlType;
use crate::model::TensorView;
use crate::threadpool::{split_range, SyncPtr, ThreadPool};
use std::ops::Range;

#[inline]
fn f32_at(b: &[u8], i: usize) -> f32 {
    f32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]])
}

/// tinyBLAS's dot of one weight row (f32 bytes) and x, scalar.
fn dot_tinyblas_ref(w: &[u8], x: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    for l in (0..x.len()).step_by(8) {
        for (j, a) in acc.iter_mut().enumerate() {
            *a = f32_at(w, l + j).mul_add(x[l + j], *a);
        }
    }
    let t = [acc[0] + acc[4], acc[1] + acc[5], acc[2] + acc[6], acc[3] + acc[7]];
    (t[0] + t[2]) + (t[1] + t[3])
}

/// ggml_vec_dot_f32's dot, scalar.
fn dot_ggml_ref(w: &[u8], x: &[f32]) -> f32 {
    let n = x.len();
    let np = n / 32 * 32;
    let mut s = [[0f32; 8]; 4];
    for i in (0..np).step_by(32) {
        for (j, sj) in s.iter_mut().enumerate() {
            for (l, a) in sj.iter_mut().enumerate() {
                let k = i + j * 8 + l;
                *a = f32_at(w, k).mul_add(x[k], *a);
            }
        }
    }
    let mut x0 = [0f32; 8];
    for l in 0..8 {
        x0[l] = (s[0][l] + s[2][l]) + (s[1][l] + s[3][l]);
    }
    let t0 = [x0[0] + x0[4], x0[1] + x0[5], x0[2] + x0[6], x0[3] + x0[7]];
    let mut sum = (t0[0] + t0[1]) + (t0[2] + t0[3]);
    for k in np..n {
        sum += f32_at(w, k) * x[k]; // not contracted in llama.cpp's build
    }
    sum
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot_tinyblas(w: *const f32, x: *const f32, n: usize) -> f32 {
        let mut acc = _mm256_setzero_ps();
        let mut l = 0;
        while l < n {
            acc = _mm256_fmadd_ps(_mm256_loadu_ps(w.add(l)), _mm256_loadu_ps(x.add(l)), acc);
            l += 8;
        }
        let t = _mm_add_ps(_mm256_extractf128_ps(acc, 1), _mm256_castps256_ps128(acc));
        let t = _mm_add_ps(t, _mm_movehl_ps(t, t));
        let t = _mm_add_ss(t, _mm_movehdup_ps(t));
        _mm_cvtss_f32(t)
    }
}

fn have_avx2() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static V: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *V.get_or_init(|| is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma"))
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether llama.cpp's AVX2 build multiplies an F32 weight of rows of `n_in` in matrices
/// of `m` rows through tinyBLAS (else through ggml_vec_dot_f32).
pub fn uses_tinyblas(n_in: usize, m: usize) -> bool {
    n_in % 8 == 0 && m % 4 == 0
}

/// out[t * ld_out + (r - rows.start)] = dot(w row r, x row t) for an F32 `w`, in llama.cpp's
/// order (see the module doc); `w.ne[1]` is the row count llama.cpp's matmul sees.
#[allow(clippy::too_many_arguments)]
pub fn matmul_f32_llamacpp(
    pool: &ThreadPool,
    w: &TensorView,
    x: &[f32],
    n_tokens: usize,
    out: &mut [f32],
    ld_out: usize,
    rows: Range<usize>,
) -> Result<()> {
    let n_in = w.ne[0];
    let n_out = w.n_rows();
    let bad = |m: String| Error::Invalid(format!("matmul with '{}' ({} [{n_in}, {n_out}]): {m}", w.name, w.ty));
    if w.ty != GgmlType::F32 {
        return Err(bad("not an F32 weight".into()));
    }
    if w.data.len() < 4 * n_in * n_out {
        return Err(bad(format!("weight data has {} bytes, need {}", w.data.len(), 4 * n_in * n_out)));
    }
    if rows.start > rows.end || rows.end > n_out {
        return Err(bad(format!("row range {rows:?} out of 0..{n_out}")));
    }
    if x.len() < n_tokens * n_in {
        return Err(bad(format!("x has {} values, need n_tokens * n_in = {}", x.len(), n_tokens * n_in)));
    }
    let n_rows = rows.len();
    if n_tokens > 0 && (ld_out < n_rows || out.len() < (n_tokens - 1) * ld_out + n_rows) {
        return Err(bad(format!("out has {} values, need {n_tokens} rows of stride {ld_out} >= {n_rows}", out.len())));
    }
    if n_tokens == 0 || n_rows == 0 {
        return Ok(());
    }
    let tiny = uses_tinyblas(n_in, w.ne[1]);
    let simd = tiny && have_avx2() && (w.data.as_ptr() as usize) % 4 == 0;
    let o = SyncPtr(out.as_mut_ptr());
    let r0 = rows.start;
    pool.run(&|ith, nth| {
        for r in split_range(n_rows, ith, nth) {
            let wr = &w.data[(r0 + r) * 4 * n_in..(r0 + r + 1) * 4 * n_in];
            for t in 0..n_tokens {
                let xr = &x[t * n_in..(t + 1) * n_in];
                let v = if simd {
                    #[cfg(target_arch = "x86_64")]
                    // SAFETY: avx2+fma detected; wr holds n_in f32 (4-byte aligned, checked),
                    // xr n_in f32, n_in a multiple of 8.
                    unsafe {
                        avx2::dot_tinyblas(wr.as_ptr() as *const f32, xr.as_ptr(), n_in)
                    }
                    #[cfg(not(target_arch = "x86_64"))]
                    dot_tinyblas_ref(wr, xr)
                } else if tiny {
                    dot_tinyblas_ref(wr, xr)
                } else {
                    dot_ggml_ref(wr, xr)
                };
                // SAFETY: (t, r) is written by the thread owning row r only, inside `out`
                // (checked above).
                unsafe { *o.get().add(t * ld_out + r) = v };
            }
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn simd_equals_scalar_order() {
        let mut seed = 7u32;
        let mut rnd = || {
            seed = seed.wrapping_mul(1664525).wrapping_add(1013904223);
            (seed >> 8) as f32 / (1u32 << 24) as f32 - 0.5
        };
        for n in [8usize, 64, 256, 1000] {
            let w: Vec<f32> = (0..n).map(|_| rnd()).collect();
            let x: Vec<f32> = (0..n).map(|_| rnd()).collect();
            let wb: Vec<u8> = w.iter().flat_map(|v| v.to_le_bytes()).collect();
            let r = dot_tinyblas_ref(&wb, &x);
            if have_avx2() {
                #[cfg(target_arch = "x86_64")]
                assert_eq!(unsafe { avx2::dot_tinyblas(w.as_ptr(), x.as_ptr(), n) }.to_bits(), r.to_bits(), "n={n}");
            }
            // both orders are sums of the same products
            let exact: f64 = w.iter().zip(&x).map(|(a, b)| (*a as f64) * (*b as f64)).sum();
            assert!((r as f64 - exact).abs() < 1e-4 && (dot_ggml_ref(&wb, &x) as f64 - exact).abs() < 1e-4);
        }
    }
}
