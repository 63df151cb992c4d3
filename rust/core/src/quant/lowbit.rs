//! Q1_0, Q2_0 and NVFP4 (ggml types 41, 42, 40), each against Q8_0 activations.
//!
//! Blocks (ggml-common.h, the structs of `blocks.rs`):
//!   Q1_0   18 B per 128: d (f16), qs[16] (bit j: element j is +d, else -d)
//!   Q2_0   18 B per 64: d (f16), qs[16] (2 bits per element, low bits first; q - 1 in {-1, 0, 1, 2})
//!   NVFP4  36 B per 64: d[4] (UE4M3 scale per 16 elements), qs[32] (E2M1 codes as MXFP4's
//!          kvalues, doubled; sub-block s: bytes 8s..8s+8, low nibbles elements 0..8, high 8..16)
//!
//! Float orders. `_ref`: ggml's generic C (quants.c); `_x86`: what llama.cpp's x86 build
//! computes: for Q1_0 and NVFP4 its AVX2 vec_dot (8 exact i32 lanes per 32-element Q8_0
//! block, lane k the products at positions 4k..4k+4; FMA'd into 8 f32 lanes; ggml's
//! horizontal sum `iquants::hsum8`), for Q2_0 (no x86 kernel) the generic loop as GCC
//! compiles it with FMA (`sumi += d1 * sumi_block` and `sumf += d0 * sumi` contracted).

use super::blocks::{as_blocks, as_blocks_mut, f16, f16_bytes, BlockNVFP4, BlockQ1_0, BlockQ2_0, BlockQ8_0};
use super::iquants::{hsum8, KVALUES_MXFP4};

/// ggml_ue4m3_to_fp32: unsigned E4M3 (bias 7), halved (MXFP4's doubled kvalues); 0 and
/// 0x7F are 0. Exact: every value is a small integer times a power of two.
#[inline(always)]
pub(crate) fn ue4m3_to_f32(x: u8) -> f32 {
    if x == 0 || x == 0x7F {
        return 0.0;
    }
    let exp = ((x >> 3) & 0xF) as i32;
    let man = (x & 7) as i32;
    let pow2 = |e: i32| f32::from_bits(((e + 127) as u32) << 23);
    if exp == 0 {
        man as f32 * pow2(-10)
    } else {
        (8 + man) as f32 * pow2(exp - 11)
    }
}

/// ggml_fp32_to_ue4m3 (round half up on the fourth mantissa bit, saturating at 0x7E).
pub(crate) fn f32_to_ue4m3(mut x: f32) -> u8 {
    if !(x > 0.0) {
        return 0;
    }
    if x > 448.0 {
        x = 448.0;
    }
    let bits = x.to_bits();
    let fp32_exp = ((bits >> 23) & 0xFF) as i32 - 127;
    let fp32_man = ((bits >> 20) & 7) as i32;
    let mut exp = fp32_exp + 7;
    if exp <= 0 {
        let man = ((x * 512.0 + 0.5) as i32).min(7);
        return if man < 1 { 0 } else { man as u8 };
    }
    if exp >= 15 {
        return 0x7E;
    }
    let mut man = fp32_man + ((bits >> 19) & 1) as i32;
    if man > 7 {
        man = 0;
        exp += 1;
    }
    if exp >= 15 {
        return 0x7E;
    }
    ((exp << 3) | man) as u8
}

pub(crate) fn dequantize_q1_0(x: &[u8], y: &mut [f32]) {
    for (b, y) in as_blocks::<BlockQ1_0>(x).iter().zip(y.chunks_exact_mut(128)) {
        let d = f16(b.d);
        for (j, v) in y.iter_mut().enumerate() {
            *v = if (b.qs[j / 8] >> (j % 8)) & 1 != 0 { d } else { -d };
        }
    }
}

pub(crate) fn dequantize_q2_0(x: &[u8], y: &mut [f32]) {
    for (b, y) in as_blocks::<BlockQ2_0>(x).iter().zip(y.chunks_exact_mut(64)) {
        let d = f16(b.d);
        for (j, v) in y.iter_mut().enumerate() {
            *v = (((b.qs[j / 4] >> (2 * (j % 4))) & 3) as i32 - 1) as f32 * d;
        }
    }
}

pub(crate) fn dequantize_nvfp4(x: &[u8], y: &mut [f32]) {
    for (b, y) in as_blocks::<BlockNVFP4>(x).iter().zip(y.chunks_exact_mut(64)) {
        for s in 0..4 {
            let d = ue4m3_to_f32(b.d[s]);
            for j in 0..8 {
                let q = b.qs[8 * s + j];
                y[16 * s + j] = KVALUES_MXFP4[(q & 0xF) as usize] as f32 * d;
                y[16 * s + j + 8] = KVALUES_MXFP4[(q >> 4) as usize] as f32 * d;
            }
        }
    }
}

#[inline(always)]
fn q8(y: &[BlockQ8_0], blk: usize, j: usize) -> i32 {
    y[blk].qs[j] as i32
}

/// Q1_0's weight at element j (0..128) of block `b`: +1 or -1.
#[inline(always)]
fn q1_sign(b: &BlockQ1_0, j: usize) -> i32 {
    if (b.qs[j / 8] >> (j % 8)) & 1 != 0 {
        1
    } else {
        -1
    }
}

/// The 8 i32 lanes of one Q1_0 sub-block k (32 elements) against Q8_0 block `yb`.
#[inline(always)]
fn q1_lanes(b: &BlockQ1_0, k: usize, y: &[BlockQ8_0], yb: usize) -> [i32; 8] {
    std::array::from_fn(|l| (0..4).map(|e| q1_sign(b, 32 * k + 4 * l + e) * q8(y, yb, 4 * l + e)).sum())
}

/// Q1_0 x Q8_0, ggml's generic order.
pub(crate) fn vec_dot_q1_0_q8_0_ref(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let (x, y) = (as_blocks::<BlockQ1_0>(x), as_blocks::<BlockQ8_0>(y));
    let mut sumf = 0f32;
    for i in 0..n / 128 {
        let b = &x[i];
        let d0 = f16(b.d);
        let mut sumi = 0f32;
        for k in 0..4 {
            let yb = 4 * i + k;
            let s: i32 = (0..32).map(|j| q1_sign(b, 32 * k + j) * q8(y, yb, j)).sum();
            sumi += f16(y[yb].d) * s as f32;
        }
        sumf += d0 * sumi;
    }
    sumf
}

/// Q1_0 x Q8_0 in ggml's AVX2 order: per block, lanes times d_y (a product for the first
/// Q8_0 block, FMAs for the other three), one FMA with d_w into the accumulator.
pub(crate) fn vec_dot_q1_0_q8_0_x86(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let (x, y) = (as_blocks::<BlockQ1_0>(x), as_blocks::<BlockQ8_0>(y));
    let mut acc = [0f32; 8];
    for i in 0..n / 128 {
        let b = &x[i];
        let d0 = f16(b.d);
        let mut blk = [0f32; 8];
        for k in 0..4 {
            let yb = 4 * i + k;
            let dy = f16(y[yb].d);
            let l = q1_lanes(b, k, y, yb);
            for (a, &v) in blk.iter_mut().zip(&l) {
                *a = if k == 0 { dy * v as f32 } else { dy.mul_add(v as f32, *a) };
            }
        }
        for (a, &v) in acc.iter_mut().zip(&blk) {
            *a = d0.mul_add(v, *a);
        }
    }
    hsum8(acc)
}

/// Q2_0 x Q8_0, ggml's generic loop; `fma`: with GCC's contractions (llama.cpp's x86 build).
#[inline(always)]
fn q2_0_dot(n: usize, x: &[u8], y: &[u8], fma: bool) -> f32 {
    let (x, y) = (as_blocks::<BlockQ2_0>(x), as_blocks::<BlockQ8_0>(y));
    let mut sumf = 0f32;
    for i in 0..n / 64 {
        let b = &x[i];
        let d0 = f16(b.d);
        let mut sumi = 0f32;
        for k in 0..2 {
            let yb = 2 * i + k;
            let d1 = f16(y[yb].d);
            let mut s = 0i32;
            for j in 0..32 {
                let q = ((b.qs[8 * k + j / 4] >> (2 * (j % 4))) & 3) as i32 - 1;
                s += q * q8(y, yb, j);
            }
            sumi = if fma { d1.mul_add(s as f32, sumi) } else { sumi + d1 * s as f32 };
        }
        sumf = if fma { d0.mul_add(sumi, sumf) } else { sumf + d0 * sumi };
    }
    sumf
}

/// Q2_0 x Q8_0, ggml's generic order (no contraction).
pub(crate) fn vec_dot_q2_0_q8_0_ref(n: usize, x: &[u8], y: &[u8]) -> f32 {
    q2_0_dot(n, x, y, false)
}

/// Q2_0 x Q8_0 as llama.cpp's x86 build computes it (the generic loop with FMAs).
pub(crate) fn vec_dot_q2_0_q8_0_x86(n: usize, x: &[u8], y: &[u8]) -> f32 {
    q2_0_dot(n, x, y, true)
}

#[inline(always)]
fn nvfp4_w(b: &BlockNVFP4, s: usize, j: usize) -> i32 {
    let q = b.qs[8 * s + j % 8];
    KVALUES_MXFP4[if j < 8 { q & 0xF } else { q >> 4 } as usize] as i32
}

/// NVFP4 x Q8_0, ggml's generic order.
pub(crate) fn vec_dot_nvfp4_q8_0_ref(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let (x, y) = (as_blocks::<BlockNVFP4>(x), as_blocks::<BlockQ8_0>(y));
    let mut sumf = 0f32;
    for i in 0..n / 64 {
        let b = &x[i];
        for s in 0..4 {
            let d = ue4m3_to_f32(b.d[s]);
            let yb = 2 * i + s / 2;
            let dy = f16(y[yb].d);
            let sumi: i32 = (0..16).map(|j| nvfp4_w(b, s, j) * q8(y, yb, 16 * (s % 2) + j)).sum();
            sumf += dy * d * sumi as f32;
        }
    }
    sumf
}

/// NVFP4 x Q8_0 in ggml's AVX2 order: per Q8_0 block 8 lanes (lanes 0..4 the first
/// sub-block, scale d[2h] * d_y, lanes 4..8 the second, d[2h + 1] * d_y), one FMA each.
pub(crate) fn vec_dot_nvfp4_q8_0_x86(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let (x, y) = (as_blocks::<BlockNVFP4>(x), as_blocks::<BlockQ8_0>(y));
    let mut acc = [0f32; 8];
    for i in 0..n / 64 {
        let b = &x[i];
        for h in 0..2 {
            let yb = 2 * i + h;
            let dy = f16(y[yb].d);
            let sc = [ue4m3_to_f32(b.d[2 * h]) * dy, ue4m3_to_f32(b.d[2 * h + 1]) * dy];
            for (l, a) in acc.iter_mut().enumerate() {
                let s = 2 * h + l / 4;
                let p: i32 = (0..4).map(|e| {
                    let j = 4 * (l % 4) + e;
                    nvfp4_w(b, s, j) * q8(y, yb, 16 * (l / 4) + j)
                }).sum();
                *a = sc[l / 4].mul_add(p as f32, *a);
            }
        }
    }
    hsum8(acc)
}

/// quantize_row_q1_0_ref: d = mean |x| (summed in order), bit j set where x_j >= 0.
pub(crate) fn quantize_q1_0(x: &[f32], y: &mut [u8]) {
    for (x, b) in x.chunks_exact(128).zip(as_blocks_mut::<BlockQ1_0>(y)) {
        let mut sum_abs = 0f32;
        for &v in x {
            sum_abs += v.abs();
        }
        b.d = f16_bytes(sum_abs / 128.0);
        b.qs = [0; 16];
        for (j, &v) in x.iter().enumerate() {
            if v >= 0.0 {
                b.qs[j / 8] |= 1 << (j % 8);
            }
        }
    }
}

/// quantize_row_q2_0_ref: d = max |x|, q = clamp(roundf(x / d) + 1, 0, 3).
pub(crate) fn quantize_q2_0(x: &[f32], y: &mut [u8]) {
    for (x, b) in x.chunks_exact(64).zip(as_blocks_mut::<BlockQ2_0>(y)) {
        let mut amax = 0f32;
        for &v in x {
            let a = v.abs();
            if a > amax {
                amax = a;
            }
        }
        let id = if amax > 0.0 { 1.0 / amax } else { 0.0 };
        b.d = f16_bytes(amax);
        b.qs = [0; 16];
        for (j, &v) in x.iter().enumerate() {
            let q = ((v * id).round() as i32 + 1).clamp(0, 3);
            b.qs[j / 4] |= (q as u8) << (2 * (j % 4));
        }
    }
}

/// quantize_row_nvfp4_ref: per 16 elements the UE4M3 scale of amax / 6, each value the
/// nearest E2M1 code (ggml's best_index_mxfp4).
pub(crate) fn quantize_nvfp4(x: &[f32], y: &mut [u8]) {
    for (x, b) in x.chunks_exact(64).zip(as_blocks_mut::<BlockNVFP4>(y)) {
        for s in 0..4 {
            let xb = &x[16 * s..16 * s + 16];
            let mut amax = 0f32;
            for &v in xb {
                if amax < v.abs() {
                    amax = v.abs();
                }
            }
            let ue = f32_to_ue4m3(amax / 6.0);
            b.d[s] = ue;
            let d = ue4m3_to_f32(ue);
            for j in 0..8 {
                let x0 = best_index_mxfp4(xb[j], d);
                let x1 = best_index_mxfp4(xb[8 + j], d);
                b.qs[8 * s + j] = x0 | (x1 << 4);
            }
        }
    }
}

/// ggml's best_index_mxfp4: the E2M1 code whose kvalue times `e` is nearest `x` (the first
/// on ties).
#[inline(always)]
pub(crate) fn best_index_mxfp4(x: f32, e: f32) -> u8 {
    let mut best_index = 0u8;
    let mut best_err = (KVALUES_MXFP4[0] as f32 * e - x).abs();
    for i in 1..16 {
        let err = (KVALUES_MXFP4[i] as f32 * e - x).abs();
        if err < best_err {
            best_index = i as u8;
            best_err = err;
        }
    }
    best_index
}
