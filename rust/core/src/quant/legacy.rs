//! The 32-element block formats: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1 and IQ4_NL.
//!
//! Byte layouts (ggml-common.h, the structs of `blocks.rs`), all little endian, d/m/s are f16:
//!   Q4_0   18 B: d, qs[16]            x[j] = d*((qs[j]&15)-8),  x[j+16] = d*((qs[j]>>4)-8)
//!   Q4_1   20 B: d, m, qs[16]         x[j] = d*(qs[j]&15) + m,  x[j+16] = d*(qs[j]>>4) + m
//!   Q5_0   22 B: d, qh(u32), qs[16]   5th bit of x[j] is bit j of qh; value - 16
//!   Q5_1   24 B: d, m, qh(u32), qs[16]
//!   Q8_0   34 B: d, qs[32] (i8)
//!   Q8_1   36 B: d, s = d*sum(qs), qs[32] (i8)
//!   IQ4_NL 18 B: d, qs[16]            x[j] = d*KVALUES[qs[j]&15], x[j+16] = d*KVALUES[qs[j]>>4]
//!
//! Everything here is the scalar reference (`_ref`); the SIMD kernels live in `avx2.rs`.

use super::blocks::{as_blocks, as_blocks_mut, f16, f16_bytes, BlockIQ4NL, BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0, BlockQ8_1};

pub(crate) const QK: usize = 32;

/// IQ4_NL / IQ4_XS non-linear 4-bit grid (ggml-common.h kvalues_iq4nl).
pub(crate) const KVALUES_IQ4NL: [i8; 16] = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113];

// ---------------------------------------------------------------- dequantize

pub(crate) fn dequantize_q4_0(src: &[u8], dst: &mut [f32]) {
    for (b, y) in as_blocks::<BlockQ4_0>(src).iter().zip(dst.chunks_exact_mut(QK)) {
        let d = f16(b.d);
        for j in 0..16 {
            let q = b.qs[j];
            y[j] = d * ((q & 15) as i32 - 8) as f32;
            y[j + 16] = d * ((q >> 4) as i32 - 8) as f32;
        }
    }
}

pub(crate) fn dequantize_q4_1(src: &[u8], dst: &mut [f32]) {
    for (b, y) in as_blocks::<BlockQ4_1>(src).iter().zip(dst.chunks_exact_mut(QK)) {
        let d = f16(b.d);
        let m = f16(b.m);
        for j in 0..16 {
            let q = b.qs[j];
            y[j] = d * (q & 15) as f32 + m;
            y[j + 16] = d * (q >> 4) as f32 + m;
        }
    }
}

pub(crate) fn dequantize_q5_0(src: &[u8], dst: &mut [f32]) {
    for (b, y) in as_blocks::<BlockQ5_0>(src).iter().zip(dst.chunks_exact_mut(QK)) {
        let d = f16(b.d);
        let qh = u32::from_le_bytes(b.qh);
        for j in 0..16 {
            let q = b.qs[j];
            let h0 = ((qh >> j) & 1) << 4;
            let h1 = ((qh >> (j + 16)) & 1) << 4;
            y[j] = d * (((q & 15) as u32 | h0) as i32 - 16) as f32;
            y[j + 16] = d * (((q >> 4) as u32 | h1) as i32 - 16) as f32;
        }
    }
}

pub(crate) fn dequantize_q5_1(src: &[u8], dst: &mut [f32]) {
    for (b, y) in as_blocks::<BlockQ5_1>(src).iter().zip(dst.chunks_exact_mut(QK)) {
        let d = f16(b.d);
        let m = f16(b.m);
        let qh = u32::from_le_bytes(b.qh);
        for j in 0..16 {
            let q = b.qs[j];
            let h0 = ((qh >> j) & 1) << 4;
            let h1 = ((qh >> (j + 16)) & 1) << 4;
            y[j] = d * ((q & 15) as u32 | h0) as f32 + m;
            y[j + 16] = d * ((q >> 4) as u32 | h1) as f32 + m;
        }
    }
}

pub(crate) fn dequantize_q8_0(src: &[u8], dst: &mut [f32]) {
    for (b, y) in as_blocks::<BlockQ8_0>(src).iter().zip(dst.chunks_exact_mut(QK)) {
        let d = f16(b.d);
        for j in 0..QK {
            y[j] = b.qs[j] as f32 * d;
        }
    }
}

pub(crate) fn dequantize_q8_1(src: &[u8], dst: &mut [f32]) {
    for (b, y) in as_blocks::<BlockQ8_1>(src).iter().zip(dst.chunks_exact_mut(QK)) {
        let d = f16(b.d);
        for j in 0..QK {
            y[j] = b.qs[j] as f32 * d;
        }
    }
}

pub(crate) fn dequantize_iq4_nl(src: &[u8], dst: &mut [f32]) {
    for (b, y) in as_blocks::<BlockIQ4NL>(src).iter().zip(dst.chunks_exact_mut(QK)) {
        let d = f16(b.d);
        for j in 0..16 {
            let q = b.qs[j];
            y[j] = d * KVALUES_IQ4NL[(q & 15) as usize] as f32;
            y[j + 16] = d * KVALUES_IQ4NL[(q >> 4) as usize] as f32;
        }
    }
}

// ---------------------------------------------------------------- quantize (ggml _ref)

/// Index of the first element with the largest |x| and that element (ggml's loop keeps the
/// first on ties: `if (amax < fabsf(v))`).
#[inline]
fn signed_absmax(x: &[f32]) -> f32 {
    let mut amax = 0.0f32;
    let mut max = 0.0f32;
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    max
}

#[inline]
fn min_max(x: &[f32]) -> (f32, f32) {
    let mut min = f32::MAX;
    let mut max = -f32::MAX;
    for &v in x {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    (min, max)
}

/// C's `(int8_t)(float)` then `MIN(hi, .)` as ggml writes it: truncation toward zero.
#[inline(always)]
fn trunc_i8_min(v: f32, hi: i32) -> u8 {
    ((v as i32) as i8 as i32).min(hi) as u8
}

pub(crate) fn quantize_q4_0(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(QK).zip(as_blocks_mut::<BlockQ4_0>(dst)) {
        let max = signed_absmax(x);
        let d = max / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        b.d = f16_bytes(d);
        for j in 0..16 {
            let x0 = trunc_i8_min(x[j] * id + 8.5, 15);
            let x1 = trunc_i8_min(x[j + 16] * id + 8.5, 15);
            b.qs[j] = x0 | (x1 << 4);
        }
    }
}

pub(crate) fn quantize_q4_1(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(QK).zip(as_blocks_mut::<BlockQ4_1>(dst)) {
        let (min, max) = min_max(x);
        let d = (max - min) / 15.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        b.d = f16_bytes(d);
        b.m = f16_bytes(min);
        for j in 0..16 {
            let x0 = trunc_i8_min((x[j] - min) * id + 0.5, 15);
            let x1 = trunc_i8_min((x[j + 16] - min) * id + 0.5, 15);
            b.qs[j] = x0 | (x1 << 4);
        }
    }
}

pub(crate) fn quantize_q5_0(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(QK).zip(as_blocks_mut::<BlockQ5_0>(dst)) {
        let max = signed_absmax(x);
        let d = max / -16.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        b.d = f16_bytes(d);
        let mut qh = 0u32;
        for j in 0..16 {
            let x0 = trunc_i8_min(x[j] * id + 16.5, 31);
            let x1 = trunc_i8_min(x[j + 16] * id + 16.5, 31);
            b.qs[j] = (x0 & 15) | ((x1 & 15) << 4);
            qh |= (((x0 & 0x10) >> 4) as u32) << j;
            qh |= (((x1 & 0x10) >> 4) as u32) << (j + 16);
        }
        b.qh = qh.to_le_bytes();
    }
}

pub(crate) fn quantize_q5_1(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(QK).zip(as_blocks_mut::<BlockQ5_1>(dst)) {
        let (min, max) = min_max(x);
        let d = (max - min) / 31.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        b.d = f16_bytes(d);
        b.m = f16_bytes(min);
        let mut qh = 0u32;
        for j in 0..16 {
            // ggml casts straight to uint8_t here (no MIN): the value is at most 31.5 -> 31.
            let x0 = ((x[j] - min) * id + 0.5) as u8;
            let x1 = ((x[j + 16] - min) * id + 0.5) as u8;
            b.qs[j] = (x0 & 15) | ((x1 & 15) << 4);
            qh |= (((x0 & 0x10) >> 4) as u32) << j;
            qh |= (((x1 & 0x10) >> 4) as u32) << (j + 16);
        }
        b.qh = qh.to_le_bytes();
    }
}

/// C `roundf`: half away from zero.
#[inline(always)]
fn roundf(v: f32) -> f32 {
    v.round()
}

pub(crate) fn quantize_q8_0(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(QK).zip(as_blocks_mut::<BlockQ8_0>(dst)) {
        let amax = x.iter().fold(0.0f32, |a, &v| a.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        b.d = f16_bytes(d);
        for j in 0..QK {
            b.qs[j] = roundf(x[j] * id) as i8;
        }
    }
}

pub(crate) fn quantize_q8_1(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(QK).zip(as_blocks_mut::<BlockQ8_1>(dst)) {
        let amax = x.iter().fold(0.0f32, |a, &v| a.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        b.d = f16_bytes(d);
        let mut sum = 0i32;
        for j in 0..QK {
            let q = roundf(x[j] * id) as i8;
            b.qs[j] = q;
            sum += q as i32;
        }
        b.s = f16_bytes(sum as f32 * d);
    }
}

/// Activation quantizers as llama.cpp runs them on x86 (ggml-cpu/arch/x86/quants.c,
/// AVX/AVX2 path): the inverse scale is `127/amax` (not `1/(amax/127)`) and rounding is to
/// nearest even. The matmul uses these so that its numbers are llama.cpp's on x86.
/// `_mm256_cvtps_epi32` then saturating packs to i8, in scalar: NaN and out-of-range values
/// become i32::MIN (the "integer indefinite") and then -128. Only reached when 127/amax
/// overflows (amax < 127 * f32::MIN_POSITIVE), where the f16 scale is 0 anyway.
#[inline(always)]
fn cvt_pack_i8(v: f32) -> (i8, i32) {
    let r = v.round_ties_even();
    let i = if r.is_nan() || !(-2147483648.0..2147483648.0).contains(&r) { i32::MIN } else { r as i32 };
    (i.clamp(-128, 127) as i8, i)
}

pub(crate) fn quantize_q8_0_x86(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(QK).zip(as_blocks_mut::<BlockQ8_0>(dst)) {
        let amax = x.iter().fold(0.0f32, |a, &v| a.max(v.abs()));
        let d = amax / 127.0;
        b.d = f16_bytes(d);
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        for j in 0..QK {
            b.qs[j] = cvt_pack_i8(x[j] * id).0;
        }
    }
}

pub(crate) fn quantize_q8_1_x86(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(QK).zip(as_blocks_mut::<BlockQ8_1>(dst)) {
        let amax = x.iter().fold(0.0f32, |a, &v| a.max(v.abs()));
        let d = amax / 127.0;
        b.d = f16_bytes(d);
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        let mut sum = 0i32;
        for j in 0..QK {
            let (q, wide) = cvt_pack_i8(x[j] * id);
            b.qs[j] = q;
            sum = sum.wrapping_add(wide); // the SIMD version sums the unpacked 32-bit values
        }
        b.s = f16_bytes(d * sum as f32);
    }
}

#[inline]
pub(crate) fn best_index_int8(val: &[i8; 16], x: f32) -> usize {
    if x <= val[0] as f32 {
        return 0;
    }
    if x >= val[15] as f32 {
        return 15;
    }
    let (mut ml, mut mu) = (0usize, 15usize);
    while mu - ml > 1 {
        let mav = (ml + mu) / 2;
        if x < val[mav] as f32 {
            mu = mav;
        } else {
            ml = mav;
        }
    }
    if x - (val[mu - 1] as f32) < (val[mu] as f32) - x {
        mu - 1
    } else {
        mu
    }
}

/// `quantize_row_iq4_nl_ref`: one scale per 32 values, no search around it (ntry = -1).
/// An all-zero block (amax < 1e-15) gets d = 0 and indices 0 (ggml leaves the indices of
/// the previous block there; with d = 0 they decode to 0 either way).
pub(crate) fn quantize_iq4_nl(src: &[f32], dst: &mut [u8]) {
    let values = &KVALUES_IQ4NL;
    for (x, b) in src.chunks_exact(QK).zip(as_blocks_mut::<BlockIQ4NL>(dst)) {
        let mut l = [0u8; QK];
        let mut amax = 0.0f32;
        let mut max = 0.0f32;
        for &v in x {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        let scale = if amax < 1e-15 {
            0.0
        } else {
            let d = max / values[0] as f32;
            let id = 1.0 / d;
            let mut sumqx = 0.0f32;
            let mut sumq2 = 0.0f32;
            for j in 0..QK {
                let al = id * x[j];
                let k = best_index_int8(values, al);
                l[j] = k as u8;
                let q = values[k] as f32;
                let w = x[j] * x[j];
                sumqx += w * q * x[j];
                sumq2 += w * q * q;
            }
            if sumq2 > 0.0 {
                sumqx / sumq2
            } else {
                0.0
            }
        };
        b.d = f16_bytes(scale);
        for j in 0..16 {
            b.qs[j] = l[j] | (l[j + 16] << 4);
        }
    }
}

// ---------------------------------------------------------------- vec_dot (_ref)
// x is the weight row, y the activation row already in vec_dot_type. Per block: an exact
// integer dot product, then one float multiply-add (ggml's generic kernels do the same).

#[inline(always)]
fn i8s(b: &[i8]) -> impl Iterator<Item = i32> + '_ {
    b.iter().map(|&v| v as i32)
}

pub(crate) fn vec_dot_q4_0_q8_0_ref(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let mut sumf = 0.0f32;
    for (bx, by) in as_blocks::<BlockQ4_0>(x).iter().zip(as_blocks::<BlockQ8_0>(y)).take(n / QK) {
        let mut sumi = 0i32;
        for (j, q8) in i8s(&by.qs).enumerate() {
            let q = bx.qs[j & 15];
            let v = if j < 16 { q & 15 } else { q >> 4 } as i32 - 8;
            sumi += v * q8;
        }
        sumf += sumi as f32 * (f16(bx.d) * f16(by.d));
    }
    sumf
}

pub(crate) fn vec_dot_q4_1_q8_1_ref(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let mut sumf = 0.0f32;
    for (bx, by) in as_blocks::<BlockQ4_1>(x).iter().zip(as_blocks::<BlockQ8_1>(y)).take(n / QK) {
        let mut sumi = 0i32;
        for (j, q8) in i8s(&by.qs).enumerate() {
            let q = bx.qs[j & 15];
            let v = if j < 16 { q & 15 } else { q >> 4 } as i32;
            sumi += v * q8;
        }
        sumf += (f16(bx.d) * f16(by.d)) * sumi as f32 + f16(bx.m) * f16(by.s);
    }
    sumf
}

pub(crate) fn vec_dot_q5_0_q8_0_ref(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let mut sumf = 0.0f32;
    for (bx, by) in as_blocks::<BlockQ5_0>(x).iter().zip(as_blocks::<BlockQ8_0>(y)).take(n / QK) {
        let qh = u32::from_le_bytes(bx.qh);
        let mut sumi = 0i32;
        for (j, q8) in i8s(&by.qs).enumerate() {
            let q = bx.qs[j & 15];
            let lo = if j < 16 { q & 15 } else { q >> 4 } as u32;
            let v = (lo | (((qh >> j) & 1) << 4)) as i32 - 16;
            sumi += v * q8;
        }
        sumf += sumi as f32 * (f16(bx.d) * f16(by.d));
    }
    sumf
}

pub(crate) fn vec_dot_q5_1_q8_1_ref(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let mut sumf = 0.0f32;
    for (bx, by) in as_blocks::<BlockQ5_1>(x).iter().zip(as_blocks::<BlockQ8_1>(y)).take(n / QK) {
        let qh = u32::from_le_bytes(bx.qh);
        let mut sumi = 0i32;
        for (j, q8) in i8s(&by.qs).enumerate() {
            let q = bx.qs[j & 15];
            let lo = if j < 16 { q & 15 } else { q >> 4 } as u32;
            let v = (lo | (((qh >> j) & 1) << 4)) as i32;
            sumi += v * q8;
        }
        sumf += (f16(bx.d) * f16(by.d)) * sumi as f32 + f16(bx.m) * f16(by.s);
    }
    sumf
}

pub(crate) fn vec_dot_q8_0_q8_0_ref(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let mut sumf = 0.0f32;
    for (bx, by) in as_blocks::<BlockQ8_0>(x).iter().zip(as_blocks::<BlockQ8_0>(y)).take(n / QK) {
        let sumi: i32 = i8s(&bx.qs).zip(i8s(&by.qs)).map(|(a, b)| a * b).sum();
        sumf += sumi as f32 * (f16(bx.d) * f16(by.d));
    }
    sumf
}

pub(crate) fn vec_dot_q8_1_q8_1_ref(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let mut sumf = 0.0f32;
    for (bx, by) in as_blocks::<BlockQ8_1>(x).iter().zip(as_blocks::<BlockQ8_1>(y)).take(n / QK) {
        let sumi: i32 = i8s(&bx.qs).zip(i8s(&by.qs)).map(|(a, b)| a * b).sum();
        sumf += sumi as f32 * (f16(bx.d) * f16(by.d));
    }
    sumf
}

pub(crate) fn vec_dot_iq4_nl_q8_0_ref(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let mut sumf = 0.0f32;
    for (bx, by) in as_blocks::<BlockIQ4NL>(x).iter().zip(as_blocks::<BlockQ8_0>(y)).take(n / QK) {
        let mut sumi = 0i32;
        for (j, q8) in i8s(&by.qs).enumerate() {
            let q = bx.qs[j & 15];
            let v = KVALUES_IQ4NL[if j < 16 { q & 15 } else { q >> 4 } as usize] as i32;
            sumi += v * q8;
        }
        sumf += (f16(bx.d) * f16(by.d)) * sumi as f32;
    }
    sumf
}

/// `ggml_vec_dot_iq4_nl_q8_0` in the float order of ggml's AVX2 build (arch/x86/quants.c):
/// blocks in pairs, even blocks into one 8-lane accumulator and odd ones into another
/// (lane k: the exact integer sum of elements 4k..4k+3, times d_y * d_x, fused), the two
/// added and reduced as `hsum_float_8`; an odd last block added as d * sumi. The attention
/// over an IQ4_NL K cache uses it, so q.k equals llama.cpp's to the bit: the single-
/// accumulator kernel differs in the last bits, which the quantized cache and 30 layers
/// amplify into logit differences of several units on SmolLM2.
pub(crate) fn vec_dot_iq4_nl_q8_0_x86(n: usize, x: &[u8], y: &[u8]) -> f32 {
    use crate::ops::vec::fmaf;
    let nb = n / QK;
    let (xb, yb) = (as_blocks::<BlockIQ4NL>(x), as_blocks::<BlockQ8_0>(y));
    let lanes = |bx: &BlockIQ4NL, by: &BlockQ8_0| -> [f32; 8] {
        let mut p = [0f32; 8];
        for (k, pk) in p.iter_mut().enumerate() {
            let mut s = 0i32;
            for e in 4 * k..4 * k + 4 {
                let q = bx.qs[e & 15];
                let v = KVALUES_IQ4NL[(if e < 16 { q & 15 } else { q >> 4 }) as usize] as i32;
                s += v * by.qs[e] as i32;
            }
            *pk = s as f32;
        }
        p
    };
    let (mut a1, mut a2) = ([0f32; 8], [0f32; 8]);
    let mut ib = 0;
    while ib + 1 < nb {
        for (acc, b) in [(&mut a1, ib), (&mut a2, ib + 1)] {
            let (bx, by) = (&xb[b], &yb[b]);
            let d = f16(by.d) * f16(bx.d);
            for (a, p) in acc.iter_mut().zip(lanes(bx, by)) {
                *a = fmaf(d, p, *a);
            }
        }
        ib += 2;
    }
    let mut sumf = if nb >= 2 {
        let s: [f32; 8] = std::array::from_fn(|l| a1[l] + a2[l]);
        let h = [s[4] + s[0], s[5] + s[1], s[6] + s[2], s[7] + s[3]];
        (h[0] + h[2]) + (h[1] + h[3])
    } else {
        0.0
    };
    while ib < nb {
        let (bx, by) = (&xb[ib], &yb[ib]);
        let d = f16(by.d) * f16(bx.d);
        let sumi: i32 = lanes(bx, by).iter().map(|&p| p as i32).sum();
        sumf = fmaf(d, sumi as f32, sumf); // GCC contracts sumf += d * sumi
        ib += 1;
    }
    sumf
}
