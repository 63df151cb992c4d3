//! NEON kernels of the grid / ternary formats and MXFP4 (aarch64), in the float order of
//! the x86 kernels (`avx2_iq.rs`, `iquants::*_x86`), so an aarch64 build computes the same
//! floats as an x86 one:
//! - IQ1_*, IQ2_*, IQ3_*: llama.cpp's tiled order (per block the exact integer sum, times
//!   d_w with the grid factor folded in, one FMA with d_a, blocks in order);
//! - TQ1_0, TQ2_0, MXFP4: ggml's AVX2 vec_dot order (8 exact i32 lanes per block, lane k
//!   the products at positions 4k..4k+4 of each 32-element chunk, FMA'd into 8 f32 lanes
//!   held in two float32x4; MXFP4's even and odd blocks in separate accumulators; the
//!   horizontal sum ((v4+v0)+(v6+v2))+((v5+v1)+(v7+v3))).
//!
//! The integer work: 16 weights x 16 activations per `vmull_s8` pair, pairwise adds down to
//! 4 i32 lanes of 4 products (exact: |w| <= 62, |y| <= 127), times the sub-block scale.
//! Chunks are decoded by `iquants::chunk_parts` (scalar table lookups), once per NC columns.
//! Plain NEON only (no dotprod build): the integer sums are exact either way.

#![allow(clippy::missing_safety_doc, clippy::needless_range_loop)]

use super::iquants::{self, chunk_parts, e8m0_half, KVALUES_MXFP4};
use crate::ggml_type::GgmlType;
use super::blocks::{offset_of, Block, BlockMXFP4, BlockQ8K, BlockQ8_0};
use std::arch::aarch64::*;

/// 4 i32 lanes: lane k = sum of w[4k..4k+4] * y[4k..4k+4].
#[inline(always)]
unsafe fn lanes4(w: int8x16_t, y: int8x16_t) -> int32x4_t {
    let lo = vmull_s8(vget_low_s8(w), vget_low_s8(y));
    let hi = vmull_high_s8(w, y);
    vpaddlq_s16(vpaddq_s16(lo, hi))
}

#[inline(always)]
unsafe fn bytes16(a: u64, b: u64) -> int8x16_t {
    vreinterpretq_s8_u64(vcombine_u64(vcreate_u64(a), vcreate_u64(b)))
}

#[inline(always)]
fn hsum8(lo: [f32; 4], hi: [f32; 4]) -> f32 {
    let s = [hi[0] + lo[0], hi[1] + lo[1], hi[2] + lo[2], hi[3] + lo[3]];
    (s[0] + s[2]) + (s[1] + s[3])
}

#[inline(always)]
unsafe fn f4(v: float32x4_t) -> [f32; 4] {
    let mut o = [0f32; 4];
    vst1q_f32(o.as_mut_ptr(), v);
    o
}

/// The weight's scale of a block (IQ1_M: assembled from its scale words).
#[inline(always)]
fn block_dw(ty: GgmlType, b: &[u8]) -> f32 {
    match ty {
        GgmlType::IQ1_M => iquants::iq1m_d(b),
        GgmlType::TQ1_0 => super::fp::rd_f16(b, 52),
        GgmlType::TQ2_0 => super::fp::rd_f16(b, 64),
        _ => super::fp::rd_f16(b, 0),
    }
}

#[inline(always)]
unsafe fn k_body<const NC: usize>(ty: GgmlType, n: usize, w: *const u8, x: *const u8, xs: usize, out: *mut f32) {
    use GgmlType::*;
    let ts = ty.type_size();
    let tern = matches!(ty, TQ1_0 | TQ2_0);
    let fin = match ty {
        IQ2_XXS | IQ2_XS | IQ2_S | IQ1_S | IQ1_M => 0.125f32,
        IQ3_XXS => 0.25,
        _ => 1.0,
    };
    let nb = n / 256;
    let zero = vdupq_n_s32(0);
    let mut sumf = [0f32; NC];
    let mut acc = [[vdupq_n_f32(0.0); 2]; NC];
    for i in 0..nb {
        let bw = std::slice::from_raw_parts(w.add(i * ts), ts);
        let mut lanes = [[zero; 2]; NC];
        let mut lanes2 = [[zero; 2]; NC];
        let mut s1 = [0i32; NC];
        for c in 0..8 {
            let p = chunk_parts(ty, bw, c);
            let wv = [
                vmulq_s8(bytes16(p.mag[0], p.mag[1]), bytes16(p.sgn[0], p.sgn[1])),
                vmulq_s8(bytes16(p.mag[2], p.mag[3]), bytes16(p.sgn[2], p.sgn[3])),
            ];
            let dl = [bytes16(p.dl[0], p.dl[1]), bytes16(p.dl[2], p.dl[3])];
            for col in 0..NC {
                let q8 = x.add(col * xs + i * BlockQ8K::SIZE + offset_of!(BlockQ8K, qs) + 32 * c) as *const i8;
                for h in 0..2 {
                    let y = vld1q_s8(q8.add(16 * h));
                    lanes[col][h] = vmlaq_n_s32(lanes[col][h], lanes4(wv[h], y), p.sc[h]);
                    if ty == IQ1_M {
                        lanes2[col][h] = vmlaq_n_s32(lanes2[col][h], lanes4(dl[h], y), p.sc[h]);
                    }
                }
                if ty == IQ1_S {
                    let bs = x.add(col * xs + i * BlockQ8K::SIZE + offset_of!(BlockQ8K, bsums) + 4 * c);
                    let pair = std::ptr::read_unaligned(bs as *const i16) as i32
                        + std::ptr::read_unaligned(bs.add(2) as *const i16) as i32;
                    s1[col] += p.dsc * pair;
                }
            }
        }
        let dw = block_dw(ty, bw);
        for col in 0..NC {
            let by = x.add(col * xs + i * BlockQ8K::SIZE);
            let yd = std::ptr::read_unaligned(by as *const f32);
            if tern {
                // lanes minus the activation sums of their 32-element ranges (the digit offset)
                let b0 = vpaddlq_s16(vld1q_s16(by.add(260) as *const i16));
                let b1 = vpaddlq_s16(vld1q_s16(by.add(276) as *const i16));
                let d = vdupq_n_f32(dw * yd);
                let l = [vsubq_s32(lanes[col][0], b0), vsubq_s32(lanes[col][1], b1)];
                for h in 0..2 {
                    acc[col][h] = vfmaq_f32(acc[col][h], vcvtq_f32_s32(l[h]), d);
                }
            } else {
                let mut isum = vaddvq_s32(vaddq_s32(lanes[col][0], lanes[col][1]));
                let dt = match ty {
                    IQ1_S => {
                        isum = 8 * isum + s1[col];
                        dw * 0.125
                    }
                    IQ1_M => {
                        isum = 8 * isum + vaddvq_s32(vaddq_s32(lanes2[col][0], lanes2[col][1]));
                        dw * 0.125
                    }
                    _ => dw * fin,
                };
                sumf[col] = (dt * isum as f32).mul_add(yd, sumf[col]);
            }
        }
    }
    for col in 0..NC {
        *out.add(col) = if tern { hsum8(f4(acc[col][0]), f4(acc[col][1])) } else { sumf[col] };
    }
}

macro_rules! k_kernel {
    ($name:ident, $ty:ident) => {
        #[target_feature(enable = "neon")]
        pub(crate) unsafe fn $name<const NC: usize>(n: usize, w: *const u8, x: *const u8, xs: usize, _xd: *const f32, _xds: usize, out: *mut f32) {
            k_body::<NC>(GgmlType::$ty, n, w, x, xs, out)
        }
    };
}

k_kernel!(dot_iq2_xxs, IQ2_XXS);
k_kernel!(dot_iq2_xs, IQ2_XS);
k_kernel!(dot_iq2_s, IQ2_S);
k_kernel!(dot_iq3_xxs, IQ3_XXS);
k_kernel!(dot_iq3_s, IQ3_S);
k_kernel!(dot_iq1_s, IQ1_S);
k_kernel!(dot_iq1_m, IQ1_M);
k_kernel!(dot_tq1_0, TQ1_0);
k_kernel!(dot_tq2_0, TQ2_0);

/// MXFP4 x Q8_0 in ggml's AVX2 order (see the module note).
#[target_feature(enable = "neon")]
pub(crate) unsafe fn dot_mxfp4<const NC: usize>(n: usize, w: *const u8, x: *const u8, xs: usize, _xd: *const f32, _xds: usize, out: *mut f32) {
    let nb = n / 32;
    let table = vld1q_s8(KVALUES_MXFP4.as_ptr());
    let m4 = vdupq_n_u8(0xF);
    let decode = |b: *const u8| -> [int8x16_t; 2] {
        let q = vld1q_u8(b.add(1));
        [vqtbl1q_s8(table, vandq_u8(q, m4)), vqtbl1q_s8(table, vshrq_n_u8(q, 4))]
    };
    let lanes = |wv: [int8x16_t; 2], yb: *const u8| -> [int32x4_t; 2] {
        let y = yb.add(2) as *const i8;
        [lanes4(wv[0], vld1q_s8(y)), lanes4(wv[1], vld1q_s8(y.add(16)))]
    };
    let mut acc = [[[vdupq_n_f32(0.0); 2]; NC]; 2];
    let mut ib = 0;
    while ib + 1 < nb {
        for h in 0..2 {
            let b = w.add(BlockMXFP4::SIZE * (ib + h));
            let wv = decode(b);
            let e = e8m0_half(*b);
            for col in 0..NC {
                let yb = x.add(col * xs + BlockQ8_0::SIZE * (ib + h));
                let d = vdupq_n_f32(super::fp::f16_to_f32(std::ptr::read_unaligned(yb as *const u16)) * e);
                let l = lanes(wv, yb);
                for k in 0..2 {
                    acc[h][col][k] = vfmaq_f32(acc[h][col][k], vcvtq_f32_s32(l[k]), d);
                }
            }
        }
        ib += 2;
    }
    for col in 0..NC {
        let lo = vaddq_f32(acc[0][col][0], acc[1][col][0]);
        let hi = vaddq_f32(acc[0][col][1], acc[1][col][1]);
        let mut sumf = hsum8(f4(lo), f4(hi));
        if ib < nb {
            let b = w.add(BlockMXFP4::SIZE * ib);
            let yb = x.add(col * xs + BlockQ8_0::SIZE * ib);
            let l = lanes(decode(b), yb);
            let s = vaddvq_s32(vaddq_s32(l[0], l[1]));
            let d = super::fp::f16_to_f32(std::ptr::read_unaligned(yb as *const u16)) * e8m0_half(*b);
            sumf = d.mul_add(s as f32, sumf);
        }
        *out.add(col) = sumf;
    }
}

iq_dispatch!();
