//! The 256-element "K" super-block formats: Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K, and IQ4_XS
//! (which shares Q8_K activations).
//!
//! Byte layouts (ggml-common.h, the structs of `blocks.rs`), d/dmin f16 unless noted:
//!   Q2_K   84 B: scales[16] (lo nibble scale, hi nibble min), qs[64] (2 bit), d, dmin
//!   Q3_K  110 B: hmask[32] (3rd bit, set = no -4 offset), qs[64] (2 bit), scales[12] (16 x 6 bit), d
//!   Q4_K  144 B: d, dmin, scales[12] (8 x 6-bit scale + 8 x 6-bit min), qs[128] (4 bit)
//!   Q5_K  176 B: d, dmin, scales[12], qh[32] (5th bit), qs[128]
//!   Q6_K  210 B: ql[128] (low 4 bits), qh[64] (high 2 bits), scales[16] (i8), d
//!   Q8_K  292 B: d (f32), qs[256] (i8), bsums[16] (i16, sums of 16 quants)
//!   IQ4_XS 136 B: d, scales_h (u16), scales_l[4], qs[128]; 8 sub-blocks of 32, 6-bit scale - 32
//!
//! Scalar references (`_ref`) only; SIMD versions are in `avx2.rs`.

use super::blocks::{as_blocks, as_blocks_mut, f16, BlockIQ4XS, BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K};
use super::legacy::KVALUES_IQ4NL;

pub(crate) const QK_K: usize = 256;

/// Q4_K/Q5_K: 6-bit scale and min of sub-block j (0..8) from the 12 packed bytes.
#[inline(always)]
pub(crate) fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        ((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
    }
}

/// Q3_K: the 16 signed 6-bit scales (already minus 32).
#[inline(always)]
pub(crate) fn q3k_scales(s: &[u8]) -> [i8; 16] {
    let mut out = [0i8; 16];
    for (i, o) in out.iter_mut().enumerate() {
        let lo = if i < 8 { s[i] & 0xF } else { s[i - 8] >> 4 };
        let hi = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
        *o = (lo | (hi << 4)) as i8 - 32;
    }
    out
}

// ---------------------------------------------------------------- dequantize

pub(crate) fn dequantize_q2_k(src: &[u8], dst: &mut [f32]) {
    for (b, y) in as_blocks::<BlockQ2K>(src).iter().zip(dst.chunks_exact_mut(QK_K)) {
        let sc = &b.scales;
        let qs = &b.qs;
        let d = f16(b.d);
        let dmin = f16(b.dmin);
        for e in 0..QK_K {
            let (half, rem) = (e / 128, e % 128);
            let (shift, l) = (2 * (rem / 32), rem % 32);
            let s = sc[e / 16];
            let dl = d * (s & 0xF) as f32;
            let ml = dmin * (s >> 4) as f32;
            y[e] = dl * ((qs[half * 32 + l] >> shift) & 3) as f32 - ml;
        }
    }
}

pub(crate) fn dequantize_q3_k(src: &[u8], dst: &mut [f32]) {
    for (b, y) in as_blocks::<BlockQ3K>(src).iter().zip(dst.chunks_exact_mut(QK_K)) {
        let hm = &b.hmask;
        let qs = &b.qs;
        let scales = q3k_scales(&b.scales);
        let d = f16(b.d);
        for e in 0..QK_K {
            let (half, rem) = (e / 128, e % 128);
            let (shift, l) = (2 * (rem / 32), rem % 32);
            let dl = d * scales[e / 16] as f32;
            let q = ((qs[half * 32 + l] >> shift) & 3) as i32 - if hm[l] & (1 << (e / 32)) != 0 { 0 } else { 4 };
            y[e] = dl * q as f32;
        }
    }
}

pub(crate) fn dequantize_q4_k(src: &[u8], dst: &mut [f32]) {
    for (b, y) in as_blocks::<BlockQ4K>(src).iter().zip(dst.chunks_exact_mut(QK_K)) {
        let d = f16(b.d);
        let dmin = f16(b.dmin);
        let sc = &b.scales;
        let qs = &b.qs;
        for e in 0..QK_K {
            let sub = e / 32; // 8 sub-blocks: pairs share 32 bytes (low nibbles, then high)
            let (s, m) = scale_min_k4(sub, sc);
            let q = qs[(sub / 2) * 32 + e % 32];
            let q = if sub % 2 == 0 { q & 0xF } else { q >> 4 };
            y[e] = (d * s as f32) * q as f32 - dmin * m as f32;
        }
    }
}

pub(crate) fn dequantize_q5_k(src: &[u8], dst: &mut [f32]) {
    for (b, y) in as_blocks::<BlockQ5K>(src).iter().zip(dst.chunks_exact_mut(QK_K)) {
        let d = f16(b.d);
        let dmin = f16(b.dmin);
        let sc = &b.scales;
        let qh = &b.qh;
        let qs = &b.qs;
        for e in 0..QK_K {
            let sub = e / 32;
            let (s, m) = scale_min_k4(sub, sc);
            let l = e % 32;
            let q = qs[(sub / 2) * 32 + l];
            let q = if sub % 2 == 0 { q & 0xF } else { q >> 4 } | (((qh[l] >> sub) & 1) << 4);
            y[e] = (d * s as f32) * q as f32 - dmin * m as f32;
        }
    }
}

pub(crate) fn dequantize_q6_k(src: &[u8], dst: &mut [f32]) {
    for (b, y) in as_blocks::<BlockQ6K>(src).iter().zip(dst.chunks_exact_mut(QK_K)) {
        let ql = &b.ql;
        let qh = &b.qh;
        let sc = &b.scales;
        let d = f16(b.d);
        for e in 0..QK_K {
            let q = q6k_value(ql, qh, e);
            y[e] = (d * sc[e / 16] as f32) * q as f32;
        }
    }
}

/// Q6_K element e (0..256) as a signed value in [-32, 31].
#[inline(always)]
fn q6k_value(ql: &[u8], qh: &[u8], e: usize) -> i32 {
    let (half, rem) = (e / 128, e % 128);
    let (quarter, l) = (rem / 32, rem % 32);
    // quarters 0,1 use low nibbles of ql[l], ql[l+32]; quarters 2,3 the high nibbles.
    let lb = ql[half * 64 + l + 32 * (quarter & 1)];
    let lo = if quarter < 2 { lb & 0xF } else { lb >> 4 };
    let hi = (qh[half * 32 + l] >> (2 * quarter)) & 3;
    (lo | (hi << 4)) as i32 - 32
}

pub(crate) fn dequantize_q8_k(src: &[u8], dst: &mut [f32]) {
    for (b, y) in as_blocks::<BlockQ8K>(src).iter().zip(dst.chunks_exact_mut(QK_K)) {
        let d = b.d();
        for j in 0..QK_K {
            y[j] = d * b.qs[j] as f32;
        }
    }
}

#[inline(always)]
fn iq4xs_scale(b: &BlockIQ4XS, ib: usize) -> i32 {
    let sh = u16::from_le_bytes(b.scales_h);
    let lo = (b.scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF;
    let hi = ((sh >> (2 * ib)) & 3) as u8;
    (lo | (hi << 4)) as i32 - 32
}

pub(crate) fn dequantize_iq4_xs(src: &[u8], dst: &mut [f32]) {
    for (b, y) in as_blocks::<BlockIQ4XS>(src).iter().zip(dst.chunks_exact_mut(QK_K)) {
        let d = f16(b.d);
        for ib in 0..8 {
            let dl = d * iq4xs_scale(b, ib) as f32;
            let qs = &b.qs[16 * ib..16 * ib + 16];
            for j in 0..16 {
                y[32 * ib + j] = dl * KVALUES_IQ4NL[(qs[j] & 0xF) as usize] as f32;
                y[32 * ib + j + 16] = dl * KVALUES_IQ4NL[(qs[j] >> 4) as usize] as f32;
            }
        }
    }
}

// ---------------------------------------------------------------- quantize

/// ggml's `nearest_int`: round to nearest even through the 1.5*2^23 trick (valid for
/// |v| <= 4194303, which holds for the quantized ranges here).
#[inline(always)]
pub(crate) fn nearest_int(v: f32) -> i32 {
    let val = v + 12582912.0;
    (val.to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
}

/// `quantize_row_q8_K_ref` (also what llama.cpp's x86 build runs for activations).
pub(crate) fn quantize_q8_k(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(QK_K).zip(as_blocks_mut::<BlockQ8K>(dst)) {
        let mut amax = 0.0f32;
        let mut max = 0.0f32;
        for &v in x {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        if amax == 0.0 {
            *b = BlockQ8K { d: [0; 4], qs: [0; QK_K], bsums: [0; 32] };
            continue;
        }
        let iscale = -127.0 / max;
        for j in 0..QK_K {
            b.qs[j] = nearest_int(iscale * x[j]).min(127) as i8;
        }
        for j in 0..16 {
            let s: i32 = b.qs[16 * j..16 * j + 16].iter().map(|&q| q as i32).sum();
            b.bsums[2 * j..2 * j + 2].copy_from_slice(&(s as i16).to_le_bytes());
        }
        b.d = (1.0 / iscale).to_le_bytes();
    }
}

// ---------------------------------------------------------------- vec_dot (_ref)
// x: weight row, y: Q8_K activation row. Per super-block: exact integer sums, then
// sumf += d*isum (- dmin*summ), with d = f16(x.d) * y.d as ggml forms it.

#[inline(always)]
fn q8k_parts(by: &BlockQ8K) -> (f32, &[i8; QK_K], [i32; 16]) {
    let mut bs = [0i32; 16];
    for (j, s) in bs.iter_mut().enumerate() {
        *s = i16::from_le_bytes([by.bsums[2 * j], by.bsums[2 * j + 1]]) as i32;
    }
    (by.d(), &by.qs, bs)
}

pub(crate) fn vec_dot_q2_k_q8_k_ref(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let mut sumf = 0.0f32;
    for (bx, by) in as_blocks::<BlockQ2K>(x).iter().zip(as_blocks::<BlockQ8K>(y)).take(n / QK_K) {
        let (yd, q8, bsums) = q8k_parts(by);
        let sc = &bx.scales;
        let qs = &bx.qs;
        let summs: i32 = (0..16).map(|j| (sc[j] >> 4) as i32 * bsums[j]).sum();
        let mut isum = 0i32;
        for g in 0..16 {
            let mut s = 0i32;
            for k in 0..16 {
                let e = 16 * g + k;
                let (half, rem) = (e / 128, e % 128);
                let q = (qs[half * 32 + rem % 32] >> (2 * (rem / 32))) & 3;
                s += q as i32 * q8[e] as i32;
            }
            isum += (sc[g] & 0xF) as i32 * s;
        }
        let dall = yd * f16(bx.d);
        let dmin = yd * f16(bx.dmin);
        sumf += dall * isum as f32 - dmin * summs as f32;
    }
    sumf
}

pub(crate) fn vec_dot_q3_k_q8_k_ref(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let mut sumf = 0.0f32;
    for (bx, by) in as_blocks::<BlockQ3K>(x).iter().zip(as_blocks::<BlockQ8K>(y)).take(n / QK_K) {
        let (yd, q8, _) = q8k_parts(by);
        let hm = &bx.hmask;
        let qs = &bx.qs;
        let scales = q3k_scales(&bx.scales);
        let mut isum = 0i32;
        for g in 0..16 {
            let mut s = 0i32;
            for k in 0..16 {
                let e = 16 * g + k;
                let (half, rem) = (e / 128, e % 128);
                let l = rem % 32;
                let q = ((qs[half * 32 + l] >> (2 * (rem / 32))) & 3) as i32
                    - if hm[l] & (1 << (e / 32)) != 0 { 0 } else { 4 };
                s += q * q8[e] as i32;
            }
            isum += scales[g] as i32 * s;
        }
        sumf += (f16(bx.d) * yd) * isum as f32;
    }
    sumf
}

/// Q4_K x Q8_K in the order of llama.cpp's repacked q4_K_8x8 gemm kernel (used on x86
/// whenever a Q4_K tensor's row count is a multiple of 8): per pair of 32-element
/// sub-blocks, an exact i32 sum of scale * dot and of min * bsum, each converted to f32 and
/// FMA'd (times d_w * d_a, resp. dmin_w * d_a) into separate accumulators; the result is
/// their difference. The AVX2 kernel computes exactly the same.
pub(crate) fn vec_dot_q4_k_q8_k_ref(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let mut sumf = 0.0f32;
    let mut sumf_m = 0.0f32;
    for (bx, by) in as_blocks::<BlockQ4K>(x).iter().zip(as_blocks::<BlockQ8K>(y)).take(n / QK_K) {
        let (yd, q8, bsums) = q8k_parts(by);
        let sc = &bx.scales;
        let qs = &bx.qs;
        let dsc = f16(bx.d) * yd;
        let dmn = f16(bx.dmin) * yd;
        for pair in 0..4 {
            let mut isum = 0i32;
            let mut summ = 0i32;
            for sub in 2 * pair..2 * pair + 2 {
                let (s, m) = scale_min_k4(sub, sc);
                let mut t = 0i32;
                for l in 0..32 {
                    let q = qs[(sub / 2) * 32 + l];
                    let q = if sub % 2 == 0 { q & 0xF } else { q >> 4 };
                    t += q as i32 * q8[32 * sub + l] as i32;
                }
                isum += s as i32 * t;
                summ += m as i32 * (bsums[2 * sub] + bsums[2 * sub + 1]);
            }
            sumf = (isum as f32).mul_add(dsc, sumf);
            sumf_m = (summ as f32).mul_add(dmn, sumf_m);
        }
    }
    sumf - sumf_m
}

pub(crate) fn vec_dot_q5_k_q8_k_ref(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let mut sumf = 0.0f32;
    for (bx, by) in as_blocks::<BlockQ5K>(x).iter().zip(as_blocks::<BlockQ8K>(y)).take(n / QK_K) {
        let (yd, q8, bsums) = q8k_parts(by);
        let sc = &bx.scales;
        let qh = &bx.qh;
        let qs = &bx.qs;
        let mut isum = 0i32;
        let mut summ = 0i32;
        for sub in 0..8 {
            let (s, m) = scale_min_k4(sub, sc);
            let mut t = 0i32;
            for l in 0..32 {
                let q = qs[(sub / 2) * 32 + l];
                let q = if sub % 2 == 0 { q & 0xF } else { q >> 4 } | (((qh[l] >> sub) & 1) << 4);
                t += q as i32 * q8[32 * sub + l] as i32;
            }
            isum += s as i32 * t;
            summ += m as i32 * (bsums[2 * sub] + bsums[2 * sub + 1]);
        }
        let d = f16(bx.d) * yd;
        let dmin = f16(bx.dmin) * yd;
        sumf += d * isum as f32 - dmin * summ as f32;
    }
    sumf
}

pub(crate) fn vec_dot_q6_k_q8_k_ref(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let mut sumf = 0.0f32;
    for (bx, by) in as_blocks::<BlockQ6K>(x).iter().zip(as_blocks::<BlockQ8K>(y)).take(n / QK_K) {
        let (yd, q8, _) = q8k_parts(by);
        let ql = &bx.ql;
        let qh = &bx.qh;
        let sc = &bx.scales;
        let mut isum = 0i32;
        for g in 0..16 {
            let mut s = 0i32;
            for k in 0..16 {
                let e = 16 * g + k;
                s += q6k_value(ql, qh, e) * q8[e] as i32;
            }
            isum += sc[g] as i32 * s;
        }
        // llama.cpp's tiled K-quant order (its matmuls of >= 8 rows), as the AVX2 kernel:
        // d_w times the exact sum, then one FMA with d_a.
        sumf = (f16(bx.d) * isum as f32).mul_add(yd, sumf);
    }
    sumf
}

pub(crate) fn vec_dot_q8_k_q8_k_ref(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let mut sumf = 0.0f32;
    for (bx, by) in as_blocks::<BlockQ8K>(x).iter().zip(as_blocks::<BlockQ8K>(y)).take(n / QK_K) {
        let sumi: i32 = bx.qs.iter().zip(&by.qs).map(|(&a, &b)| a as i32 * b as i32).sum();
        sumf += (bx.d() * by.d()) * sumi as f32;
    }
    sumf
}

pub(crate) fn vec_dot_iq4_xs_q8_k_ref(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let mut sumf = 0.0f32;
    for (bx, by) in as_blocks::<BlockIQ4XS>(x).iter().zip(as_blocks::<BlockQ8K>(y)).take(n / QK_K) {
        let (yd, q8, _) = q8k_parts(by);
        let mut isum = 0i32;
        for ib in 0..8 {
            let qs = &bx.qs[16 * ib..16 * ib + 16];
            let mut s = 0i32;
            for j in 0..16 {
                s += KVALUES_IQ4NL[(qs[j] & 0xF) as usize] as i32 * q8[32 * ib + j] as i32;
                s += KVALUES_IQ4NL[(qs[j] >> 4) as usize] as i32 * q8[32 * ib + j + 16] as i32;
            }
            isum += iq4xs_scale(bx, ib) * s;
        }
        sumf += (f16(bx.d) * yd) * isum as f32;
    }
    sumf
}
