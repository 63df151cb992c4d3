//! Small vector kernels the attention and the elementwise ops share: f32 and f16 dot
//! products and axpy. Each has a plain `_ref` and an AVX2+FMA+F16C twin, chosen once at
//! run time by the kernel table (`quant::table::KernelTable::avx2_math`; `PYLLAMA_KERNELS=ref`
//! forces the plain ones).
//!
//! Determinism: whichever kernel is chosen is used for every call in the process, and each
//! keeps a fixed summation order (8 lanes, then a fixed horizontal sum, then the tail), so
//! a result never depends on the thread, the micro-batch or the slice's position in memory.

use half::f16;
use std::sync::OnceLock;

struct Kernels {
    dot_f32: fn(&[f32], &[f32]) -> f32,
    dot_f16: fn(&[u16], &[f32]) -> f32,
    axpy_f32: fn(&mut [f32], f32, &[f32]),
    scale_axpy_f32_block: fn(&mut [f32], &[f32], &[f32], &[f32]),
    axpy_f16: fn(&mut [f32], f32, &[u16]),
    mad_f16_acc: fn(&mut [u16], f32, &[u16]),
    dot_f16_ggml: fn(&[u16], &[f32]) -> f32,
    dot_f16_ggml_2: fn(&[u16], &[f32], &[f32]) -> (f32, f32),
    mad_f16_acc_n: fn(&mut [u16], usize, &[f32], &[u16]),
    scale_f16_acc: fn(&mut [u16], f32),
    round_f16: fn(&mut [f32], &[f32]),
}

fn kernels() -> &'static Kernels {
    static K: OnceLock<Kernels> = OnceLock::new();
    K.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            // the kernel table's choice: the x86 SIMD sets (AVX2, AVX-512), which all have
            // AVX2 + FMA + F16C; not the reference set
            if crate::quant::table::kernels().avx2_math {
                return Kernels {
                    dot_f32: |a, b| unsafe { x86::dot_f32_avx2(a, b) },
                    dot_f16: |a, b| unsafe { x86::dot_f16_avx2(a, b) },
                    axpy_f32: |y, a, x| unsafe { x86::axpy_f32_avx2(y, a, x) },
                    scale_axpy_f32_block: |y, vs, ms, x| unsafe { x86::scale_axpy_f32_block_avx2(y, vs, ms, x) },
                    axpy_f16: |y, a, x| unsafe { x86::axpy_f16_avx2(y, a, x) },
                    mad_f16_acc: |y, a, x| unsafe { x86::mad_f16_acc_avx2(y, a, x) },
                    dot_f16_ggml: |a, b| unsafe { x86::dot_f16_ggml_avx2(a, b) },
                    dot_f16_ggml_2: |a, b0, b1| unsafe { x86::dot_f16_ggml_2_avx2(a, b0, b1) },
                    mad_f16_acc_n: |y, stride, a, x| unsafe { x86::mad_f16_acc_n_avx2(y, stride, a, x) },
                    scale_f16_acc: |y, a| unsafe { x86::scale_f16_acc_avx2(y, a) },
                    round_f16: |y, x| unsafe { x86::round_f16_avx2(y, x) },
                };
            }
        }
        Kernels {
            dot_f32: dot_f32_ref,
            dot_f16: dot_f16_ref,
            axpy_f32: axpy_f32_ref,
            scale_axpy_f32_block: scale_axpy_f32_block_ref,
            axpy_f16: axpy_f16_ref,
            mad_f16_acc: mad_f16_acc_ref,
            dot_f16_ggml: dot_f16_ggml_ref,
            dot_f16_ggml_2: dot_f16_ggml_2_ref,
            mad_f16_acc_n: mad_f16_acc_n_ref,
            scale_f16_acc: scale_f16_acc_ref,
            round_f16: round_f16_ref,
        }
    })
}

/// sum_i a[i] * b[i] (lengths must match).
#[inline]
pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    (kernels().dot_f32)(a, b)
}

/// sum_i f16(a[i]) * b[i]; `a` holds raw IEEE half bits.
#[inline]
pub fn dot_f16(a: &[u16], b: &[f32]) -> f32 {
    (kernels().dot_f16)(a, b)
}

/// y += a * x
#[inline]
pub fn axpy_f32(y: &mut [f32], a: f32, x: &[f32]) {
    (kernels().axpy_f32)(y, a, x)
}

/// `ms` value of a key whose step does not scale the accumulator (`scale_axpy_f32_block`):
/// an ms is exp(m_old - s) with s > m_old, at most 1, never 2.
pub const NO_SCALE: f32 = 2.0;

/// One query's accumulator `y` (n values) over a block of keys, as llama.cpp's one_chunk
/// kernel steps through them for a quantized V: for each key k in order, `y *= ms[k]`
/// (`ggml_vec_scale_f32`) unless ms[k] is `NO_SCALE`, then `axpy_f32(y, vs[k], x[k * n..])`
/// (`ggml_vec_mad_f32`), every element exactly as those compute it (y held in registers
/// across the block). Keys: vs.len(). Panics if x or ms are shorter than that needs.
#[inline]
pub fn scale_axpy_f32_block(y: &mut [f32], vs: &[f32], ms: &[f32], x: &[f32]) {
    assert!(ms.len() >= vs.len() && x.len() >= vs.len() * y.len());
    (kernels().scale_axpy_f32_block)(y, vs, ms, x)
}

/// y += a * f16(x)
#[inline]
pub fn axpy_f16(y: &mut [f32], a: f32, x: &[u16]) {
    (kernels().axpy_f16)(y, a, x)
}

/// y = f16(y + a * x) elementwise, y and x raw f16 bits: ggml's `ggml_vec_mad_f16`
/// (fused multiply-add, then rounded to f16), the accumulator of llama.cpp's flash
/// attention for F16 V.
#[inline]
pub fn mad_f16_acc(y: &mut [u16], a: f32, x: &[u16]) {
    (kernels().mad_f16_acc)(y, a, x)
}

/// sum_i f16(a[i]) * b[i] in exactly `ggml_vec_dot_f16`'s order on AVX2: 4 accumulators
/// of 8 lanes over blocks of 32 (fused multiply-add), reduced as (s0+s2)+(s1+s3), then
/// lanes l+l4, then hadd, hadd; the tail added in f64. `b` holds f16-representable values.
#[inline]
pub fn dot_f16_ggml(a: &[u16], b: &[f32]) -> f32 {
    (kernels().dot_f16_ggml)(a, b)
}

/// `dot_f16_ggml(a, b0)` and `dot_f16_ggml(a, b1)` in one pass over `a` (two heads of a
/// GQA group against the same key): each result bit-identical to the single call, the
/// f16 -> f32 conversion of `a` done once and two independent FMA chains in flight.
#[inline]
pub fn dot_f16_ggml_2(a: &[u16], b0: &[f32], b1: &[f32]) -> (f32, f32) {
    (kernels().dot_f16_ggml_2)(a, b0, b1)
}

pub fn dot_f16_ggml_2_ref(a: &[u16], b0: &[f32], b1: &[f32]) -> (f32, f32) {
    (dot_f16_ggml_ref(a, b0), dot_f16_ggml_ref(a, b1))
}

/// `mad_f16_acc(y[g * stride..][..x.len()], a[g], x)` for every g < a.len(): the heads of
/// a GQA group accumulating the same V row, converted from f16 once. Bit-identical to the
/// separate calls.
#[inline]
pub fn mad_f16_acc_n(y: &mut [u16], stride: usize, a: &[f32], x: &[u16]) {
    assert!(x.len() <= stride && y.len() >= (a.len().max(1) - 1) * stride + x.len());
    (kernels().mad_f16_acc_n)(y, stride, a, x)
}

pub fn mad_f16_acc_n_ref(y: &mut [u16], stride: usize, a: &[f32], x: &[u16]) {
    for (g, &ag) in a.iter().enumerate() {
        mad_f16_acc_ref(&mut y[g * stride..g * stride + x.len()], ag, x);
    }
}

fn reduce_ggml(acc: &[[f32; 8]; 4]) -> f32 {
    let mut x0 = [0f32; 8];
    let mut x1 = [0f32; 8];
    for l in 0..8 {
        x0[l] = acc[0][l] + acc[2][l];
        x1[l] = acc[1][l] + acc[3][l];
    }
    for l in 0..8 {
        x0[l] += x1[l];
    }
    let t0 = [x0[0] + x0[4], x0[1] + x0[5], x0[2] + x0[6], x0[3] + x0[7]];
    let t1 = [t0[0] + t0[1], t0[2] + t0[3]];
    t1[0] + t1[1]
}

pub fn dot_f16_ggml_ref(a: &[u16], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let np = n / 32 * 32;
    let mut acc = [[0f32; 8]; 4];
    for i in (0..np).step_by(32) {
        for (j, aj) in acc.iter_mut().enumerate() {
            for (l, al) in aj.iter_mut().enumerate() {
                let k = i + j * 8 + l;
                *al = f16::from_bits(a[k]).to_f32().mul_add(b[k], *al);
            }
        }
    }
    let mut s = reduce_ggml(&acc) as f64;
    for i in np..n {
        s += (f16::from_bits(a[i]).to_f32() * b[i]) as f64;
    }
    s as f32
}

/// y = f16(y * a) elementwise (`ggml_vec_scale_f16`).
#[inline]
pub fn scale_f16_acc(y: &mut [u16], a: f32) {
    (kernels().scale_f16_acc)(y, a)
}

pub fn mad_f16_acc_ref(y: &mut [u16], a: f32, x: &[u16]) {
    for (yi, xi) in y.iter_mut().zip(x) {
        let v = f16::from_bits(*xi).to_f32().mul_add(a, f16::from_bits(*yi).to_f32());
        *yi = f16::from_f32(v).to_bits();
    }
}

/// y[i] = f32(f16(x[i])): x rounded to half precision (to nearest even), as the f16
/// flash-attention kernels take their queries (lengths must match).
#[inline]
pub fn round_f16(y: &mut [f32], x: &[f32]) {
    (kernels().round_f16)(y, x)
}

pub fn round_f16_ref(y: &mut [f32], x: &[f32]) {
    for (yi, xi) in y.iter_mut().zip(x) {
        *yi = f16::from_f32(*xi).to_f32();
    }
}

pub fn scale_f16_acc_ref(y: &mut [u16], a: f32) {
    for yi in y.iter_mut() {
        *yi = f16::from_f32(f16::from_bits(*yi).to_f32() * a).to_bits();
    }
}

/// Horizontal sum of 8 lanes in the order the AVX2 kernels use: (l0+l4, l1+l5, ...) then
/// pairs, so `_ref` and `_avx2` agree up to FMA rounding.
#[inline]
fn hsum8(l: &[f32; 8]) -> f32 {
    let a = [l[0] + l[4], l[1] + l[5], l[2] + l[6], l[3] + l[7]];
    let b = [a[0] + a[2], a[1] + a[3]];
    b[0] + b[1]
}

pub fn dot_f32_ref(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let mut acc = [0f32; 8];
    let n8 = n / 8 * 8;
    for i in (0..n8).step_by(8) {
        for l in 0..8 {
            acc[l] += a[i + l] * b[i + l];
        }
    }
    let mut s = hsum8(&acc);
    for i in n8..n {
        s += a[i] * b[i];
    }
    s
}

pub fn dot_f16_ref(a: &[u16], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let mut acc = [0f32; 8];
    let n8 = n / 8 * 8;
    for i in (0..n8).step_by(8) {
        for l in 0..8 {
            acc[l] += f16::from_bits(a[i + l]).to_f32() * b[i + l];
        }
    }
    let mut s = hsum8(&acc);
    for i in n8..n {
        s += f16::from_bits(a[i]).to_f32() * b[i];
    }
    s
}

pub fn axpy_f32_ref(y: &mut [f32], a: f32, x: &[f32]) {
    for (yi, xi) in y.iter_mut().zip(x) {
        *yi += a * xi;
    }
}

pub fn scale_axpy_f32_block_ref(y: &mut [f32], vs: &[f32], ms: &[f32], x: &[f32]) {
    let n = y.len();
    for (k, (&a, &m)) in vs.iter().zip(ms).enumerate() {
        if m != NO_SCALE {
            y.iter_mut().for_each(|v| *v *= m);
        }
        axpy_f32_ref(y, a, &x[k * n..(k + 1) * n]);
    }
}

pub fn axpy_f16_ref(y: &mut [f32], a: f32, x: &[u16]) {
    for (yi, xi) in y.iter_mut().zip(x) {
        *yi += a * f16::from_bits(*xi).to_f32();
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::hsum8;
    use half::f16;
    use std::arch::x86_64::*;

    /// `round_f16_ref` 8 at a time: `vcvtps2ph` (round to nearest even, the conversion
    /// `half` itself uses on F16C CPUs) and back.
    #[target_feature(enable = "avx2,f16c")]
    pub unsafe fn round_f16_avx2(y: &mut [f32], x: &[f32]) {
        let n = y.len().min(x.len());
        let n8 = n / 8 * 8;
        let mut i = 0;
        while i < n8 {
            let h = _mm256_cvtps_ph::<0>(_mm256_loadu_ps(x.as_ptr().add(i)));
            _mm256_storeu_ps(y.as_mut_ptr().add(i), _mm256_cvtph_ps(h));
            i += 8;
        }
        super::round_f16_ref(&mut y[n8..n], &x[n8..n]);
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot_f32_avx2(a: &[f32], b: &[f32]) -> f32 {
        let n = a.len().min(b.len());
        let n8 = n / 8 * 8;
        let mut acc = _mm256_setzero_ps();
        let mut i = 0;
        while i < n8 {
            acc = _mm256_fmadd_ps(_mm256_loadu_ps(a.as_ptr().add(i)), _mm256_loadu_ps(b.as_ptr().add(i)), acc);
            i += 8;
        }
        let mut l = [0f32; 8];
        _mm256_storeu_ps(l.as_mut_ptr(), acc);
        let mut s = hsum8(&l);
        for i in n8..n {
            s += a[i] * b[i];
        }
        s
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot_f16_avx2(a: &[u16], b: &[f32]) -> f32 {
        let n = a.len().min(b.len());
        let n8 = n / 8 * 8;
        let mut acc = _mm256_setzero_ps();
        let mut i = 0;
        while i < n8 {
            let h = _mm_loadu_si128(a.as_ptr().add(i) as *const __m128i);
            acc = _mm256_fmadd_ps(_mm256_cvtph_ps(h), _mm256_loadu_ps(b.as_ptr().add(i)), acc);
            i += 8;
        }
        let mut l = [0f32; 8];
        _mm256_storeu_ps(l.as_mut_ptr(), acc);
        let mut s = hsum8(&l);
        for i in n8..n {
            s += f16::from_bits(a[i]).to_f32() * b[i];
        }
        s
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn axpy_f32_avx2(y: &mut [f32], a: f32, x: &[f32]) {
        let n = y.len().min(x.len());
        let n8 = n / 8 * 8;
        let va = _mm256_set1_ps(a);
        let mut i = 0;
        while i < n8 {
            let p = y.as_mut_ptr().add(i);
            _mm256_storeu_ps(p, _mm256_fmadd_ps(va, _mm256_loadu_ps(x.as_ptr().add(i)), _mm256_loadu_ps(p)));
            i += 8;
        }
        for i in n8..n {
            y[i] += a * x[i];
        }
    }

    /// C 8-lane chunks of y from element i over the block (`scale_axpy_f32_block_avx2`):
    /// C independent chains of scale and fused multiply-add per key.
    #[inline(always)]
    unsafe fn block_chunks<const C: usize>(y: *mut f32, n: usize, i: usize, vs: &[f32], ms: &[f32], x: *const f32) {
        let mut acc = [_mm256_setzero_ps(); C];
        for (c, a) in acc.iter_mut().enumerate() {
            *a = _mm256_loadu_ps(y.add(i + 8 * c));
        }
        for (k, (&a, &m)) in vs.iter().zip(ms).enumerate() {
            if m != super::NO_SCALE {
                let mv = _mm256_set1_ps(m);
                for y in acc.iter_mut() {
                    *y = _mm256_mul_ps(*y, mv);
                }
            }
            let av = _mm256_set1_ps(a);
            let xk = x.add(k * n + i);
            for (c, y) in acc.iter_mut().enumerate() {
                *y = _mm256_fmadd_ps(av, _mm256_loadu_ps(xk.add(8 * c)), *y);
            }
        }
        for (c, a) in acc.iter().enumerate() {
            _mm256_storeu_ps(y.add(i + 8 * c), *a);
        }
    }

    /// `scale_axpy_f32_block_ref` with `axpy_f32_avx2`'s steps: the fused step per 8 lanes
    /// (eight chunks at a time, each in a register across the block's keys), the same
    /// unfused tail. The caller checked the lengths.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn scale_axpy_f32_block_avx2(y: &mut [f32], vs: &[f32], ms: &[f32], x: &[f32]) {
        let n = y.len();
        let n8 = n / 8 * 8;
        let (yp, xp) = (y.as_mut_ptr(), x.as_ptr());
        let mut i = 0;
        while i + 64 <= n8 {
            block_chunks::<8>(yp, n, i, vs, ms, xp);
            i += 64;
        }
        while i < n8 {
            block_chunks::<1>(yp, n, i, vs, ms, xp);
            i += 8;
        }
        for i in n8..n {
            for (k, (&a, &m)) in vs.iter().zip(ms).enumerate() {
                if m != super::NO_SCALE {
                    y[i] *= m;
                }
                y[i] += a * x[k * n + i];
            }
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot_f16_ggml_avx2(a: &[u16], b: &[f32]) -> f32 {
        let n = a.len().min(b.len());
        let np = n / 32 * 32;
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut i = 0;
        while i < np {
            for (j, aj) in acc.iter_mut().enumerate() {
                let h = _mm_loadu_si128(a.as_ptr().add(i + j * 8) as *const __m128i);
                *aj = _mm256_fmadd_ps(_mm256_cvtph_ps(h), _mm256_loadu_ps(b.as_ptr().add(i + j * 8)), *aj);
            }
            i += 32;
        }
        finish_f16_dot(&acc, a, b, np, n)
    }

    /// ggml's tail of an f16 dot: the four 8-lane accumulators reduced in its order
    /// (`reduce_ggml`: (acc0 + acc2) + (acc1 + acc3), then lanes l + l+4, then (0+1) + (2+3),
    /// here in registers), then the elements past the last 32 added in f64. Always inlined
    /// into its AVX2 callers (attention calls it once per key and head).
    #[inline(always)]
    unsafe fn finish_f16_dot(acc: &[__m256; 4], a: &[u16], b: &[f32], np: usize, n: usize) -> f32 {
        let x = _mm256_add_ps(_mm256_add_ps(acc[0], acc[2]), _mm256_add_ps(acc[1], acc[3]));
        let t0 = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps::<1>(x));
        let t1 = _mm_hadd_ps(t0, t0); // [t0[0] + t0[1], t0[2] + t0[3], ..]
        let r = _mm_cvtss_f32(_mm_hadd_ps(t1, t1));
        if np == n {
            return r;
        }
        let mut s = r as f64;
        for i in np..n {
            s += (f16::from_bits(a[i]).to_f32() * b[i]) as f64;
        }
        s as f32
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot_f16_ggml_2_avx2(a: &[u16], b0: &[f32], b1: &[f32]) -> (f32, f32) {
        let n = a.len().min(b0.len()).min(b1.len());
        let np = n / 32 * 32;
        let mut acc0 = [_mm256_setzero_ps(); 4];
        let mut acc1 = [_mm256_setzero_ps(); 4];
        let mut i = 0;
        while i < np {
            for j in 0..4 {
                let h = _mm256_cvtph_ps(_mm_loadu_si128(a.as_ptr().add(i + j * 8) as *const __m128i));
                acc0[j] = _mm256_fmadd_ps(h, _mm256_loadu_ps(b0.as_ptr().add(i + j * 8)), acc0[j]);
                acc1[j] = _mm256_fmadd_ps(h, _mm256_loadu_ps(b1.as_ptr().add(i + j * 8)), acc1[j]);
            }
            i += 32;
        }
        (finish_f16_dot(&acc0, a, b0, np, n), finish_f16_dot(&acc1, a, b1, np, n))
    }

    /// Caller (`mad_f16_acc_n`) checked y.len() >= (a.len() - 1) * stride + x.len().
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn mad_f16_acc_n_avx2(y: &mut [u16], stride: usize, a: &[f32], x: &[u16]) {
        let n = x.len();
        let n8 = n / 8 * 8;
        let mut i = 0;
        while i < n8 {
            let vx = _mm256_cvtph_ps(_mm_loadu_si128(x.as_ptr().add(i) as *const __m128i));
            for (g, &ag) in a.iter().enumerate() {
                let py = y.as_mut_ptr().add(g * stride + i) as *mut __m128i;
                let vy = _mm256_cvtph_ps(_mm_loadu_si128(py));
                _mm_storeu_si128(py, _mm256_cvtps_ph::<0>(_mm256_fmadd_ps(vx, _mm256_set1_ps(ag), vy)));
            }
            i += 8;
        }
        for (g, &ag) in a.iter().enumerate() {
            super::mad_f16_acc_ref(&mut y[g * stride + n8..g * stride + n], ag, &x[n8..n]);
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn mad_f16_acc_avx2(y: &mut [u16], a: f32, x: &[u16]) {
        let n = y.len().min(x.len());
        let n8 = n / 8 * 8;
        let va = _mm256_set1_ps(a);
        let mut i = 0;
        while i < n8 {
            let py = y.as_mut_ptr().add(i) as *mut __m128i;
            let vy = _mm256_cvtph_ps(_mm_loadu_si128(py));
            let vx = _mm256_cvtph_ps(_mm_loadu_si128(x.as_ptr().add(i) as *const __m128i));
            _mm_storeu_si128(py, _mm256_cvtps_ph::<0>(_mm256_fmadd_ps(vx, va, vy)));
            i += 8;
        }
        super::mad_f16_acc_ref(&mut y[n8..n], a, &x[n8..n]);
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn scale_f16_acc_avx2(y: &mut [u16], a: f32) {
        let n = y.len();
        let n8 = n / 8 * 8;
        let va = _mm256_set1_ps(a);
        let mut i = 0;
        while i < n8 {
            let py = y.as_mut_ptr().add(i) as *mut __m128i;
            let vy = _mm256_cvtph_ps(_mm_loadu_si128(py));
            _mm_storeu_si128(py, _mm256_cvtps_ph::<0>(_mm256_mul_ps(vy, va)));
            i += 8;
        }
        super::scale_f16_acc_ref(&mut y[n8..n], a);
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn axpy_f16_avx2(y: &mut [f32], a: f32, x: &[u16]) {
        let n = y.len().min(x.len());
        let n8 = n / 8 * 8;
        let va = _mm256_set1_ps(a);
        let mut i = 0;
        while i < n8 {
            let p = y.as_mut_ptr().add(i);
            let h = _mm_loadu_si128(x.as_ptr().add(i) as *const __m128i);
            _mm256_storeu_ps(p, _mm256_fmadd_ps(va, _mm256_cvtph_ps(h), _mm256_loadu_ps(p)));
            i += 8;
        }
        for i in n8..n {
            y[i] += a * f16::from_bits(x[i]).to_f32();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn simd_matches_ref() {
        let mut seed = 1u32;
        let mut rnd = || {
            seed = seed.wrapping_mul(1664525).wrapping_add(1013904223);
            (seed >> 8) as f32 / (1u32 << 24) as f32 - 0.5
        };
        for n in [1usize, 7, 8, 31, 64, 257] {
            let a: Vec<f32> = (0..n).map(|_| rnd()).collect();
            let b: Vec<f32> = (0..n).map(|_| rnd()).collect();
            let h: Vec<u16> = a.iter().map(|&x| f16::from_f32(x).to_bits()).collect();
            let tol = 1e-6 * n as f32;
            assert!((dot_f32(&a, &b) - dot_f32_ref(&a, &b)).abs() <= tol);
            assert!((dot_f16(&h, &b) - dot_f16_ref(&h, &b)).abs() <= tol);
            let mut y1 = b.clone();
            let mut y2 = b.clone();
            axpy_f16(&mut y1, 0.3, &h);
            axpy_f16_ref(&mut y2, 0.3, &h);
            for (p, q) in y1.iter().zip(&y2) {
                assert!((p - q).abs() <= 1e-6);
            }
            // f16 accumulators: both round the fused result once, so they agree exactly
            let mut a1 = h.clone();
            let mut a2 = h.clone();
            mad_f16_acc(&mut a1, 0.7, &h);
            mad_f16_acc_ref(&mut a2, 0.7, &h);
            scale_f16_acc(&mut a1, 0.9);
            scale_f16_acc_ref(&mut a2, 0.9);
            assert_eq!(a1, a2);
            let bq: Vec<f32> = b.iter().map(|&x| f16::from_f32(x).to_f32()).collect();
            assert_eq!(dot_f16_ggml(&h, &bq), dot_f16_ggml_ref(&h, &bq));
        }
    }

    #[test]
    fn scale_axpy_block_is_scale_then_axpy_per_key_bit_for_bit() {
        // the block kernel against the per-key steps it stands for (the kernel set's
        // axpy_f32 and the scalar scale), head sizes with and without 8-lane tails, blocks
        // of 1-8 keys, scaled and unscaled keys
        let mut r = crate::testutil::Rng::new(7);
        let mut rnd = || 0.5 * r.next_f32();
        for n in [1usize, 7, 8, 31, 64, 72, 136, 256, 257] {
            for nb in 1..=8 {
                let x: Vec<f32> = (0..n * nb).map(|_| 3.0 * rnd()).collect();
                let vs: Vec<f32> = (0..nb).map(|_| rnd() + 0.5).collect();
                let ms: Vec<f32> = (0..nb).map(|k| if k % 3 == 1 { NO_SCALE } else { rnd() + 0.5 }).collect();
                let y0: Vec<f32> = (0..n).map(|_| rnd()).collect();
                let mut y1 = y0.clone();
                scale_axpy_f32_block(&mut y1, &vs, &ms, &x);
                let mut y2 = y0.clone();
                for k in 0..nb {
                    if ms[k] != NO_SCALE {
                        y2.iter_mut().for_each(|v| *v *= ms[k]);
                    }
                    axpy_f32(&mut y2, vs[k], &x[k * n..(k + 1) * n]);
                }
                assert_eq!(y1.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), y2.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), "n {n}, {nb} keys");
            }
        }
    }

    #[test]
    fn fma_axpy_rows_is_fma_axpy_per_row_bit_for_bit() {
        // the one-call form against fma_axpy row by row: lengths with and without the 32-
        // and 8-element tails, 0-5 rows at scattered, padded offsets, values whose fused and
        // unfused results differ
        let mut r = crate::testutil::Rng::new(11);
        let mut rnd = || r.next_f32();
        for n in [1usize, 5, 8, 13, 32, 40, 64, 71, 96, 256] {
            for nr in 0..=5usize {
                let stride = n + 3 + nr;
                let x: Vec<f32> = (0..n).map(|_| 1.0 + rnd() / 3.0).collect();
                let rows: Vec<(usize, f32)> = (0..nr).map(|k| ((nr - k) * stride % (nr * stride + 1) + k % 2, 1.0 / 3.0 + rnd())).collect();
                let y0: Vec<f32> = (0..(nr + 1) * stride + 2).map(|_| rnd()).collect();
                let mut y1 = y0.clone();
                fma_axpy_rows(&mut y1, &rows, &x);
                let mut y2 = y0.clone();
                for &(off, a) in &rows {
                    fma_axpy(&mut y2[off..off + n], a, &x);
                }
                assert_eq!(y1.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), y2.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), "n {n}, {nr} rows");
            }
        }
    }

    #[test]
    #[should_panic(expected = "a row past y")]
    fn fma_axpy_rows_refuses_a_row_past_y() {
        let mut y = vec![0f32; 10];
        fma_axpy_rows(&mut y, &[(0, 1.0), (3, 1.0)], &[1.0; 8]);
    }

    #[test]
    fn round_f16_equals_half_bit_for_bit() {
        // the vector rounding of the f16 attention's queries against `half` element by
        // element: ties, the subnormal and overflow edges, infinities, NaNs, odd tails
        let mut x: Vec<f32> = vec![
            0.0, -0.0, 1.0, -1.0, 65504.0, 65520.0, 65519.99, -65520.0, 1e9, f32::INFINITY, f32::NEG_INFINITY,
            f32::NAN, -f32::NAN, f32::from_bits(0x7fc1_2345), 5.96e-8, 2.98e-8, 2.99e-8, 6.1e-5, 6.09e-5, 1e-40,
            1.0 + 1.0 / 2048.0, 1.0 + 3.0 / 2048.0, -(1.0 + 1.0 / 2048.0), 2049.0, 2051.0,
        ];
        let mut s = 0x5eed_u64;
        for _ in 0..4000 {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            x.push(f32::from_bits((s >> 32) as u32));
        }
        for n in [x.len(), 7, 8, 9, 15, 16, 17] {
            let mut got = vec![0f32; n];
            let mut want = vec![0f32; n];
            round_f16(&mut got, &x[..n]);
            round_f16_ref(&mut want, &x[..n]);
            for i in 0..n {
                assert_eq!(got[i].to_bits(), want[i].to_bits(), "x = {:e} ({:#x})", x[i], x[i].to_bits());
            }
        }
    }

    #[test]
    fn grouped_f16_kernels_equal_single_calls_bit_for_bit() {
        // The GQA-group kernels the attention uses must give each head exactly the single
        // kernel's bits (same FMAs, same reduction, same f16 roundings).
        let mut seed = 7u32;
        let mut rnd = || {
            seed = seed.wrapping_mul(1664525).wrapping_add(1013904223);
            (seed >> 8) as f32 / (1u32 << 24) as f32 * 4.0 - 2.0
        };
        for n in [1usize, 8, 31, 64, 100, 256] {
            let k: Vec<u16> = (0..n).map(|_| f16::from_f32(rnd()).to_bits()).collect();
            let q0: Vec<f32> = (0..n).map(|_| f16::from_f32(rnd()).to_f32()).collect();
            let q1: Vec<f32> = (0..n).map(|_| f16::from_f32(rnd()).to_f32()).collect();
            let (s0, s1) = dot_f16_ggml_2(&k, &q0, &q1);
            assert_eq!(s0.to_bits(), dot_f16_ggml(&k, &q0).to_bits(), "n={n}");
            assert_eq!(s1.to_bits(), dot_f16_ggml(&k, &q1).to_bits(), "n={n}");
            let (r0, r1) = dot_f16_ggml_2_ref(&k, &q0, &q1);
            assert_eq!((r0.to_bits(), r1.to_bits()), (dot_f16_ggml_ref(&k, &q0).to_bits(), dot_f16_ggml_ref(&k, &q1).to_bits()));
            for groups in [1usize, 3, 4] {
                let stride = n + 5;
                let a: Vec<f32> = (0..groups).map(|_| rnd()).collect();
                let y0: Vec<u16> = (0..groups * stride).map(|_| f16::from_f32(rnd()).to_bits()).collect();
                let mut grouped = y0.clone();
                mad_f16_acc_n(&mut grouped, stride, &a, &k);
                let mut single = y0.clone();
                for (g, &ag) in a.iter().enumerate() {
                    mad_f16_acc(&mut single[g * stride..g * stride + n], ag, &k);
                }
                assert_eq!(grouped, single, "n={n} groups={groups}");
                let mut r = y0.clone();
                mad_f16_acc_n_ref(&mut r, stride, &a, &k);
                assert_eq!(r, single, "ref n={n} groups={groups}");
            }
        }
    }
}

/// Whether the CPU has AVX2 and FMA: `fmaf` then runs the FMA instruction (the same bits as
/// the libm fallback, faster). Kernel choices ask the kernel table instead
/// (`quant::table::kernels().avx2_math`), which honours `PYLLAMA_KERNELS=ref`.
#[cfg(target_arch = "x86_64")]
pub fn has_avx2_fma() -> bool {
    crate::quant::cpu::features().avx2_fma()
}

/// y[i] = fma(x[i], a, y[i]) with one rounding whatever the kernel set (the step of the
/// fused dots: tinyBLAS, `ggml_vec_dot_f16` / `_f32`), for accumulating their lanes row by row.
pub fn fma_axpy(y: &mut [f32], a: f32, x: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    if has_avx2_fma() {
        // SAFETY: the CPU has AVX2 and FMA (checked above).
        unsafe { fma_axpy_avx2(y, a, x) };
        return;
    }
    for (yi, &xi) in y.iter_mut().zip(x) {
        *yi = xi.mul_add(a, *yi);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn fma_axpy_avx2(y: &mut [f32], a: f32, x: &[f32]) {
    let n = y.len().min(x.len());
    let n8 = n / 8 * 8;
    // axpy_f32's 8-lane steps are fused; only its tail is not
    x86::axpy_f32_avx2(&mut y[..n8], a, &x[..n8]);
    for i in n8..n {
        y[i] = fmaf_x86(x[i], a, y[i]);
    }
}

/// `fma_axpy(&mut y[off..off + x.len()], a, x)` for every `(off, a)` of `rows` (rows that do
/// not overlap), x read once for all of them: on AVX2 + FMA, 32 elements of x held in
/// registers while every row takes its four fused steps. Per element the same single fma
/// as `fma_axpy`, so the same bits. Panics if a row reaches past y.
pub fn fma_axpy_rows(y: &mut [f32], rows: &[(usize, f32)], x: &[f32]) {
    let n = x.len();
    assert!(rows.iter().all(|&(off, _)| off.checked_add(n).is_some_and(|e| e <= y.len())), "fma_axpy_rows: a row past y ({} values)", y.len());
    debug_assert!({
        let mut o: Vec<usize> = rows.iter().map(|r| r.0).collect();
        o.sort_unstable();
        o.windows(2).all(|w| w[1] >= w[0] + n)
    });
    #[cfg(target_arch = "x86_64")]
    if has_avx2_fma() {
        // SAFETY: the CPU has AVX2 and FMA (checked above); every row lies inside y (asserted).
        unsafe { fma_axpy_rows_avx2(y, rows, x) };
        return;
    }
    for &(off, a) in rows {
        fma_axpy(&mut y[off..off + n], a, x);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn fma_axpy_rows_avx2(y: &mut [f32], rows: &[(usize, f32)], x: &[f32]) {
    use std::arch::x86_64::*;
    let n = x.len();
    let (xp, yp) = (x.as_ptr(), y.as_mut_ptr());
    let mut i = 0;
    while i + 32 <= n {
        let v: [__m256; 4] = std::array::from_fn(|u| _mm256_loadu_ps(xp.add(i + 8 * u)));
        for &(off, a) in rows {
            let va = _mm256_set1_ps(a);
            let p = yp.add(off + i);
            for (u, vu) in v.iter().enumerate() {
                _mm256_storeu_ps(p.add(8 * u), _mm256_fmadd_ps(*vu, va, _mm256_loadu_ps(p.add(8 * u))));
            }
        }
        i += 32;
    }
    while i + 8 <= n {
        let v = _mm256_loadu_ps(xp.add(i));
        for &(off, a) in rows {
            let p = yp.add(off + i);
            _mm256_storeu_ps(p, _mm256_fmadd_ps(v, _mm256_set1_ps(a), _mm256_loadu_ps(p)));
        }
        i += 8;
    }
    for k in i..n {
        for &(off, a) in rows {
            *yp.add(off + k) = fmaf_x86(*xp.add(k), a, *yp.add(off + k));
        }
    }
}

/// ggml's horizontal sum of 8 f32 lanes on AVX2 (`hsum_float_8` / the 8-lane reductions
/// in vec.cpp): halves added lane-wise, then pairs, then the last two.
#[inline]
pub fn hsum8_ggml(c: &[f32]) -> f32 {
    let s4 = [c[0] + c[4], c[1] + c[5], c[2] + c[6], c[3] + c[7]];
    (s4[0] + s4[2]) + (s4[1] + s4[3])
}

/// a * b + c with one rounding, as GCC compiles ggml's scalar `a*b + c` on FMA machines
/// (it contracts by default): the FMA instruction when the CPU has it, else the libm fmaf.
#[inline]
pub fn fmaf(a: f32, b: f32, c: f32) -> f32 {
    #[cfg(target_arch = "x86_64")]
    {
        if has_avx2_fma() {
            // SAFETY: the CPU has FMA (checked above).
            return unsafe { fmaf_x86(a, b, c) };
        }
    }
    a.mul_add(b, c)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "fma")]
unsafe fn fmaf_x86(a: f32, b: f32, c: f32) -> f32 {
    use std::arch::x86_64::*;
    _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(a), _mm_set_ss(b), _mm_set_ss(c)))
}
