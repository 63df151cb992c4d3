//! Activations and elementwise ops, with ggml's CPU numerics where they matter:
//! GELU (tanh) is ggml's lookup table indexed by the f16-rounded input (ggml-cpu vec.h
//! `ggml_vec_gelu_f32` with GGML_GELU_FP16), so we round the input to f16 first and the
//! result to f16 too, exactly as the table does.

use half::f16;
use std::sync::OnceLock;

/// `$body` run with `$i` = `$n` rounded down to a multiple of 8 on the x86 SIMD sets (AVX2,
/// FMA and F16C: `avx2_math`), yielding `$i`: the prefix the body did, the caller's scalar
/// loop doing the rest. Elsewhere the body is not compiled and the prefix is 0.
macro_rules! simd8_prefix {
    ($n:expr, |$i:ident| $body:expr) => {{
        #[allow(unused_mut)]
        let mut done = 0usize;
        #[cfg(target_arch = "x86_64")]
        {
            if crate::quant::table::kernels().avx2_math {
                let $i = $n / 8 * 8;
                $body;
                done = $i;
            }
        }
        done
    }};
}

const GELU_COEF_A: f32 = 0.044715;
const SQRT_2_OVER_PI: f32 = 0.797_884_560_802_865_4;

#[inline]
pub fn gelu_f32(x: f32) -> f32 {
    // `1 + GELU_COEF_A*x*x` as GCC compiles ggml_gelu_f32 (contracted to one FMA), so
    // the table is bit-identical to llama.cpp's on x86-64.
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (GELU_COEF_A * x).mul_add(x, 1.0)).tanh())
}

/// 65536 entries: f32(f16(gelu(f32(h)))) for every f16 bit pattern h.
fn gelu_table() -> &'static [f32] {
    static T: OnceLock<Vec<f32>> = OnceLock::new();
    T.get_or_init(|| (0..=u16::MAX).map(|h| f16::from_f32(gelu_f32(f16::from_bits(h).to_f32())).to_f32()).collect())
}

/// ggml's GELU on one value (table lookup on the f16-rounded input).
#[inline]
fn gelu_lut(t: &[f32], x: f32) -> f32 {
    if x <= -10.0 {
        0.0
    } else if x >= 10.0 {
        x
    } else {
        t[f16::from_f32(x).to_bits() as usize]
    }
}

/// gate = gelu(gate) * up, elementwise (ggml_geglu_split: GELU of the gate, times up).
pub fn geglu(gate: &mut [f32], up: &[f32]) {
    let t = gelu_table();
    let n = gate.len().min(up.len());
    // SAFETY: the x86 SIMD sets have AVX2 + F16C; i <= both lengths.
    let i = simd8_prefix!(n, |i| unsafe { gelu_lut_avx2(t, &mut gate[..i], Some(&up[..i])) });
    for (g, u) in gate[i..n].iter_mut().zip(&up[i..n]) {
        *g = gelu_lut(t, *g) * u;
    }
}

/// x = gelu(x) in place.
pub fn gelu(x: &mut [f32]) {
    let t = gelu_table();
    // SAFETY: the x86 SIMD sets have AVX2 + F16C; i <= x.len().
    let i = simd8_prefix!(x.len(), |i| unsafe { gelu_lut_avx2(t, &mut x[..i], None) });
    for v in x[i..].iter_mut() {
        *v = gelu_lut(t, *v);
    }
}

/// `gelu_lut` 8 values at a time (times `up` when given): the f16 rounding of `vcvtps2ph`
/// (round to nearest even, what `half` uses) as the table index, the 8 entries by a
/// gather, then the two range tests as blends. x.len() a multiple of 8.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
unsafe fn gelu_lut_avx2(t: &[f32], x: &mut [f32], up: Option<&[f32]>) {
    use std::arch::x86_64::*;
    debug_assert!(t.len() == 65536 && x.len() % 8 == 0);
    let (lo, hi) = (_mm256_set1_ps(-10.0), _mm256_set1_ps(10.0));
    let mut i = 0;
    while i < x.len() {
        let v = _mm256_loadu_ps(x.as_ptr().add(i));
        let idx = _mm256_cvtepu16_epi32(_mm256_cvtps_ph::<0>(v));
        // every index is < 65536 = t.len()
        let g = _mm256_i32gather_ps::<4>(t.as_ptr(), idx);
        let y = _mm256_blendv_ps(g, v, _mm256_cmp_ps::<_CMP_GE_OQ>(v, hi));
        let mut y = _mm256_andnot_ps(_mm256_cmp_ps::<_CMP_LE_OQ>(v, lo), y);
        if let Some(u) = up {
            y = _mm256_mul_ps(y, _mm256_loadu_ps(u.as_ptr().add(i)));
        }
        _mm256_storeu_ps(x.as_mut_ptr().add(i), y);
        i += 8;
    }
}

/// In-place softmax of one row as ggml's `soft_max` computes it on x86-64 with AVX2+FMA:
/// exp(x - max) through ggml's vector expf in groups of 8 (libm expf for the tail), the sum in
/// f64, then a multiplication by 1/sum.
pub fn softmax_ggml(x: &mut [f32]) {
    let m = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0f64;
    // SAFETY: the x86 SIMD sets have AVX2 and FMA; i <= x.len().
    let i = simd8_prefix!(x.len(), |i| unsafe { exp_sub_avx2(&mut x[..i], m, &mut sum) });
    for v in x[i..].iter_mut() {
        *v = (*v - m).exp();
        sum += *v as f64;
    }
    let inv = (1.0 / sum) as f32;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn exp_sub_avx2(x: &mut [f32], m: f32, sum: &mut f64) {
    use std::arch::x86_64::*;
    for c in x.chunks_exact_mut(8) {
        let e = v_expf(_mm256_sub_ps(_mm256_loadu_ps(c.as_ptr()), _mm256_set1_ps(m)));
        _mm256_storeu_ps(c.as_mut_ptr(), e);
        // ggml's 8-lane horizontal sum in f32, then added in f64
        *sum += super::vec::hsum8_ggml(c) as f64;
    }
}

#[inline]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// x = silu(x) over one row, as ggml's `ggml_vec_silu_f32` (the `ggml_silu` op, row by
/// row) computes it on x86-64 with AVX2+FMA: groups of 8 through `ggml_v_silu` (its vector
/// expf), the tail through libm's expf.
pub fn silu_row(x: &mut [f32]) {
    // SAFETY: the x86 SIMD sets have AVX2 and FMA; i <= x.len().
    let i = simd8_prefix!(x.len(), |i| unsafe { silu_avx2(&mut x[..i]) });
    for v in x[i..].iter_mut() {
        *v = silu(*v);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn silu_avx2(x: &mut [f32]) {
    use std::arch::x86_64::*;
    for g in x.chunks_exact_mut(8) {
        let v = _mm256_loadu_ps(g.as_ptr());
        let e = v_expf(_mm256_sub_ps(_mm256_setzero_ps(), v));
        _mm256_storeu_ps(g.as_mut_ptr(), _mm256_div_ps(v, _mm256_add_ps(_mm256_set1_ps(1.0), e)));
    }
}

/// gate = silu(gate) * up (SwiGLU), as ggml's `ggml_vec_swiglu_f32` computes it on x86-64
/// with AVX2+FMA: groups of 8 through its vector expf (`ggml_v_expf`, an approximation
/// within 1.5 ulp), the tail through libm's expf; so the results are bit-identical to
/// llama.cpp's there.
pub fn swiglu(gate: &mut [f32], up: &[f32]) {
    let n = gate.len().min(up.len());
    // SAFETY: the x86 SIMD sets have AVX2 and FMA; i <= both lengths.
    let i = simd8_prefix!(n, |i| unsafe { swiglu_avx2(&mut gate[..i], &up[..i]) });
    for (g, u) in gate[i..n].iter_mut().zip(&up[i..n]) {
        *g = silu(*g) * u;
    }
}


/// `v_expf` for other modules (callers must have checked AVX2 + FMA).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub unsafe fn v_expf_pub(x: std::arch::x86_64::__m256) -> std::arch::x86_64::__m256 {
    v_expf(x)
}

/// ggml's `ggml_v_expf` (AVX2 + FMA), operation for operation.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn v_expf(x: std::arch::x86_64::__m256) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    let r = _mm256_set1_ps(f32::from_bits(0x4b40_0000)); // 0x1.8p23
    let z = _mm256_fmadd_ps(x, _mm256_set1_ps(f32::from_bits(0x3fb8_aa3b)), r); // 0x1.715476p+0
    let n = _mm256_sub_ps(z, r);
    let b = _mm256_fnmadd_ps(
        n,
        _mm256_set1_ps(f32::from_bits(0x35bf_be8e)), // 0x1.7f7d1cp-20
        _mm256_fnmadd_ps(n, _mm256_set1_ps(f32::from_bits(0x3f31_7200)), x), // 0x1.62e4p-1
    );
    let e = _mm256_slli_epi32(_mm256_castps_si256(z), 23);
    let one_bits = _mm256_castps_si256(_mm256_set1_ps(1.0));
    let k = _mm256_castsi256_ps(_mm256_add_epi32(e, one_bits));
    let absn = _mm256_andnot_ps(_mm256_set1_ps(-0.0), n);
    let c = _mm256_castps_si256(_mm256_cmp_ps(absn, _mm256_set1_ps(126.0), _CMP_GT_OQ));
    let u = _mm256_mul_ps(b, b);
    let j = _mm256_fmadd_ps(
        _mm256_fmadd_ps(
            _mm256_fmadd_ps(_mm256_set1_ps(f32::from_bits(0x3c07_2010)), b, _mm256_set1_ps(f32::from_bits(0x3d2b_9f17))),
            u,
            _mm256_fmadd_ps(_mm256_set1_ps(f32::from_bits(0x3e2a_af33)), b, _mm256_set1_ps(f32::from_bits(0x3eff_fedb))),
        ),
        u,
        _mm256_mul_ps(_mm256_set1_ps(f32::from_bits(0x3f7f_fff6)), b),
    );
    if _mm256_movemask_ps(_mm256_castsi256_ps(c)) == 0 {
        return _mm256_fmadd_ps(j, k, k);
    }
    let g = _mm256_and_si256(
        _mm256_castps_si256(_mm256_cmp_ps(n, _mm256_setzero_ps(), _CMP_LE_OQ)),
        _mm256_set1_epi32(0x8200_0000u32 as i32),
    );
    let s1 = _mm256_castsi256_ps(_mm256_add_epi32(g, _mm256_set1_epi32(0x7f00_0000)));
    let s2 = _mm256_castsi256_ps(_mm256_sub_epi32(e, g));
    let d = _mm256_castps_si256(_mm256_cmp_ps(absn, _mm256_set1_ps(192.0), _CMP_GT_OQ));
    _mm256_or_ps(
        _mm256_and_ps(_mm256_castsi256_ps(d), _mm256_mul_ps(s1, s1)),
        _mm256_andnot_ps(
            _mm256_castsi256_ps(d),
            _mm256_or_ps(
                _mm256_and_ps(_mm256_castsi256_ps(c), _mm256_mul_ps(_mm256_fmadd_ps(s2, j, s2), s1)),
                _mm256_andnot_ps(_mm256_castsi256_ps(c), _mm256_fmadd_ps(k, j, k)),
            ),
        ),
    )
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn swiglu_avx2(gate: &mut [f32], up: &[f32]) {
    use std::arch::x86_64::*;
    for (g, u) in gate.chunks_exact_mut(8).zip(up.chunks_exact(8)) {
        let x = _mm256_loadu_ps(g.as_ptr());
        let e = v_expf(_mm256_sub_ps(_mm256_setzero_ps(), x));
        let silu = _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0), e));
        _mm256_storeu_ps(g.as_mut_ptr(), _mm256_mul_ps(silu, _mm256_loadu_ps(u.as_ptr())));
    }
}

/// gate = swiglu_oai(gate, up) elementwise, as ggml computes it (gpt-oss's experts):
/// x = min(gate, limit), y = clamp(up, -limit, limit), x / (1 + expf(-alpha x)) * (y + 1).
pub fn swiglu_oai(gate: &mut [f32], up: &[f32], alpha: f32, limit: f32) {
    for (g, u) in gate.iter_mut().zip(up) {
        let x = g.min(limit);
        let y = u.clamp(-limit, limit);
        *g = x / (1.0 + (alpha * -x).exp()) * (y + 1.0);
    }
}

/// x = c * tanh(x / c) (logit softcapping: scale, tanh, scale, as the graph does).
pub fn softcap(x: &mut [f32], c: f32) {
    let inv = 1.0 / c;
    for v in x.iter_mut() {
        *v = (*v * inv).tanh() * c;
    }
}

pub fn scale(x: &mut [f32], s: f32) {
    for v in x.iter_mut() {
        *v *= s;
    }
}

/// y += x
pub fn add_assign(y: &mut [f32], x: &[f32]) {
    for (a, b) in y.iter_mut().zip(x) {
        *a += b;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gelu_lut_close_to_exact_and_f16_rounded() {
        let t = gelu_table();
        for i in -300..300 {
            let x = i as f32 * 0.031;
            let y = gelu_lut(t, x);
            assert!((y - gelu_f32(x)).abs() <= 2e-3 * (1.0 + x.abs()), "{x} {y}");
            assert_eq!(f16::from_f32(y).to_f32(), y);
        }
        assert_eq!(gelu_lut(t, -11.0), 0.0);
        assert_eq!(gelu_lut(t, 12.5), 12.5);
    }

    #[test]
    fn gelu_and_geglu_vector_paths_equal_the_scalar_lookup_bit_for_bit() {
        // Every f16 value, the range edges (+-10 and their neighbours), ties between two
        // f16 values, subnormals, infinities and random f32 patterns; lengths with tails.
        let t = gelu_table();
        let mut xs: Vec<f32> = (0..=u16::MAX).map(|h| f16::from_bits(h).to_f32()).filter(|x| !x.is_nan()).collect();
        for e in [-10.0f32, 10.0] {
            xs.extend([e, f32::from_bits(e.to_bits() + 1), f32::from_bits(e.to_bits() - 1)]);
        }
        xs.extend([1.0 + 1.0 / 2048.0, -(1.0 + 3.0 / 2048.0), 1e-8, -3e-7, 65519.0, 65520.0, f32::INFINITY, f32::NEG_INFINITY]);
        let mut z = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..20000 {
            z ^= z << 13;
            z ^= z >> 7;
            z ^= z << 17;
            let x = f32::from_bits(z as u32);
            if !x.is_nan() {
                xs.push(x);
            }
        }
        xs.push(0.5); // a tail of 7 after the multiple of 8
        let up: Vec<f32> = (0..xs.len()).map(|i| 0.37 * (i % 13) as f32 - 2.0).collect();
        let mut g = xs.clone();
        gelu(&mut g);
        let mut gg = xs.clone();
        geglu(&mut gg, &up);
        for (i, &x) in xs.iter().enumerate() {
            let want = gelu_lut(t, x);
            assert_eq!(g[i].to_bits(), want.to_bits(), "gelu({x:e})");
            assert_eq!(gg[i].to_bits(), (want * up[i]).to_bits(), "geglu({x:e}, {})", up[i]);
        }
    }
}
