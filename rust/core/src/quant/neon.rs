//! NEON kernels (aarch64), chosen at run time by `super::kernel_set()`.
//!
//! Every aarch64 CPU has NEON (Advanced SIMD), so these need no detection; the integer dot
//! products come in two builds: with the `dotprod` extension (`sdot`: 16 i8 x i8 products
//! summed in groups of 4 into i32 lanes, ARMv8.2+) when `is_aarch64_feature_detected!`
//! finds it, otherwise `smull` + `sadalp` (i16 products, pairwise-added into i32 lanes).
//! `sdot` is emitted with inline asm because its Rust intrinsic (`vdotq_s32`) is unstable.
//!
//! Like `avx2.rs`, each kernel is written once, generic over NC = the number of activation
//! rows it serves per pass over a weight row (1: single token; `TILE`: the prefill tile),
//! with the `DotN` signature, so the matmul's tiled path uses them the same way.
//!
//! Summation order: the kernels follow the float operation order of pyllama's x86 AVX2
//! kernels (whose legacy-block and float orders are ggml's x86 ones), so an aarch64 build
//! computes the same floats as an x86 one:
//! - Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/IQ4_NL: per block, 8 lanes of exact sums of 4 adjacent
//!   products (the lanes of x86's maddubs+madd, and of sdot), FMA'd with d_w * d_x into
//!   8 f32 accumulators, then avx2.rs's horizontal-sum order (`hsum8`).
//! - F32/F16/BF16: avx2.rs's `dot_float` order (two 8-lane FMA accumulators, scalar tail).
//! - Q4_K, Q6_K: the `_ref` order, which is also the AVX2 one (llama.cpp's batch orders).
//! - Q2_K, Q3_K, Q5_K, IQ4_XS: the AVX2 kernels' order (per super-block, 8 exact i32
//!   lanes, each the scaled sum of the 4-product groups at its position in every 32-byte
//!   chunk, FMA'd into 8 f32 lanes; `hsum8` at the end).
//! - Q8_K: the `_ref` order.
//! - IQ1-IQ3, TQ1_0, TQ2_0, MXFP4: `neon_iq.rs`, in the order of `avx2_iq.rs`.
//!
//! Integer sums are exact whatever the instructions, so with and without `dotprod`, and for
//! every NC, the results are bit-identical; Q4_K/Q6_K/Q8_K equal `_ref` bit for bit, the
//! rest differ from the sequential `_ref` sums by float rounding only. (Checked: logits of
//! llama.cpp's tiny test models of every weight type, aarch64 under qemu vs x86 AVX2.)
//!
//! Speed: only tested under qemu on an x86 host; not measured on ARM hardware.
//!
//! Safety of the raw kernels (`DotN`): `w` holds one row of `n` elements of the weight
//! type, `x + c * xs` one activation row for every column c < NC, `xd` is null or holds
//! their f32 block scales (Q8_0/Q8_1), `out` NC floats; the `_dp` builds need dotprod.

// Kernels index several same-length arrays (scales, registers) by one loop index.
#![allow(clippy::missing_safety_doc, clippy::needless_range_loop)]

use super::kquants::scale_min_k4;
use super::legacy::KVALUES_IQ4NL;
use super::table::{KernelTable, Tiled};
use super::TILE;
use crate::ggml_type::GgmlType;
use super::blocks::{offset_of, Block, BlockIQ4NL, BlockIQ4XS, BlockQ2K, BlockQ3K, BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ5K, BlockQ5_0, BlockQ5_1, BlockQ6K, BlockQ8K, BlockQ8_0, BlockQ8_1};
use std::arch::aarch64::*;
use std::arch::asm;

/// Whether the `sdot` builds are used (same results as the plain NEON ones;
/// `PYLLAMA_KERNELS=neon` turns them off, like `avx2` turns off VNNI on x86).
pub fn dotprod_available() -> bool {
    super::cpu::features().dotprod && super::cpu::env().kernels != super::cpu::Forced::Neon
}

/// The NEON set's kernels in table `t` (`dp`: the dotprod builds, only where the CPU has
/// dotprod): every type's single-column and TILE-column kernels and its safe single row.
/// The matmul runs the single-column kernel on the tokens left after the tiles.
pub(crate) fn register(t: &mut KernelTable, dp: bool) {
    use GgmlType::*;
    macro_rules! pick {
        ($($ty:ident: $plain:ident, $one:ident, $dot:ident, $one_dp:ident;)*) => {$(
            if dp {
                t.set_tiled($ty, Tiled::pair($dot::<1>, $dot::<TILE>, TILE), $one_dp);
            } else {
                t.set_tiled($ty, Tiled::pair($plain::<1>, $plain::<TILE>, TILE), $one);
            }
        )*};
    }
    pick! {
        Q4_0: dot_q4_0, one_q4_0, dot_q4_0_dp, one_q4_0_dp;
        Q4_1: dot_q4_1, one_q4_1, dot_q4_1_dp, one_q4_1_dp;
        Q5_0: dot_q5_0, one_q5_0, dot_q5_0_dp, one_q5_0_dp;
        Q5_1: dot_q5_1, one_q5_1, dot_q5_1_dp, one_q5_1_dp;
        Q8_0: dot_q8_0, one_q8_0, dot_q8_0_dp, one_q8_0_dp;
        IQ4_NL: dot_iq4_nl, one_iq4_nl, dot_iq4_nl_dp, one_iq4_nl_dp;
        Q2_K: dot_q2_k, one_q2_k, dot_q2_k_dp, one_q2_k_dp;
        Q3_K: dot_q3_k, one_q3_k, dot_q3_k_dp, one_q3_k_dp;
        IQ4_XS: dot_iq4_xs, one_iq4_xs, dot_iq4_xs_dp, one_iq4_xs_dp;
        Q4_K: dot_q4_k, one_q4_k, dot_q4_k_dp, one_q4_k_dp;
        Q5_K: dot_q5_k, one_q5_k, dot_q5_k_dp, one_q5_k_dp;
        Q6_K: dot_q6_k, one_q6_k, dot_q6_k_dp, one_q6_k_dp;
        Q8_K: dot_q8_k, one_q8_k, dot_q8_k_dp, one_q8_k_dp;
        F32: dot_f32, one_f32, dot_f32, one_f32;
        F16: dot_f16, one_f16, dot_f16, one_f16;
        BF16: dot_bf16, one_bf16, dot_bf16, one_bf16;
    }
    super::neon_iq::register_iq(t, false);
}

safe_one! {
    one_q4_0, dot_q4_0, Q4_0;
    one_q4_1, dot_q4_1, Q4_1;
    one_q5_0, dot_q5_0, Q5_0;
    one_q5_1, dot_q5_1, Q5_1;
    one_q8_0, dot_q8_0, Q8_0;
    one_iq4_nl, dot_iq4_nl, IQ4_NL;
    one_q2_k, dot_q2_k, Q2_K;
    one_q3_k, dot_q3_k, Q3_K;
    one_iq4_xs, dot_iq4_xs, IQ4_XS;
    one_q4_k, dot_q4_k, Q4_K;
    one_q5_k, dot_q5_k, Q5_K;
    one_q6_k, dot_q6_k, Q6_K;
    one_q8_k, dot_q8_k, Q8_K;
    one_f32, dot_f32, F32;
    one_f16, dot_f16, F16;
    one_bf16, dot_bf16, BF16;
    one_q4_0_dp, dot_q4_0_dp, Q4_0;
    one_q4_1_dp, dot_q4_1_dp, Q4_1;
    one_q5_0_dp, dot_q5_0_dp, Q5_0;
    one_q5_1_dp, dot_q5_1_dp, Q5_1;
    one_q8_0_dp, dot_q8_0_dp, Q8_0;
    one_iq4_nl_dp, dot_iq4_nl_dp, IQ4_NL;
    one_q2_k_dp, dot_q2_k_dp, Q2_K;
    one_q3_k_dp, dot_q3_k_dp, Q3_K;
    one_iq4_xs_dp, dot_iq4_xs_dp, IQ4_XS;
    one_q4_k_dp, dot_q4_k_dp, Q4_K;
    one_q5_k_dp, dot_q5_k_dp, Q5_K;
    one_q6_k_dp, dot_q6_k_dp, Q6_K;
    one_q8_k_dp, dot_q8_k_dp, Q8_K;
}

// ------------------------------------------------------------------ helpers

/// f16 at p (unaligned, little-endian) -> f32, exact: one `fcvt` (base ARMv8 FP; the
/// block scales are converted once per block, so a software conversion would show).
#[inline(always)]
pub(crate) unsafe fn f16_at(p: *const u8) -> f32 {
    let h = std::ptr::read_unaligned(p as *const u16);
    let r: f32;
    asm!("fcvt {0:s}, {1:h}", out(vreg) r, in(vreg) h, options(pure, nomem, nostack, preserves_flags));
    r
}

#[inline(always)]
unsafe fn f32_at(p: *const u8) -> f32 {
    std::ptr::read_unaligned(p as *const f32)
}

#[inline(always)]
unsafe fn ld_s8(p: *const u8) -> int8x16_t {
    vld1q_s8(p as *const i8)
}

/// 4 f16 -> 4 f32 with `fcvtl` (base ARMv8 AdvSIMD; the intrinsic needs Rust's unstable
/// f16 vector types). Exact, subnormals included.
#[inline(always)]
pub(crate) unsafe fn cvt_f16x4(h: uint16x4_t) -> float32x4_t {
    let r: float32x4_t;
    asm!("fcvtl {0:v}.4s, {1:v}.4h", out(vreg) r, in(vreg) h, options(pure, nomem, nostack, preserves_flags));
    r
}

/// acc + per-lane sums of 4 adjacent a[i] * b[i] (`sdot`, ARMv8.2 dotprod).
#[inline]
#[target_feature(enable = "neon,dotprod")]
unsafe fn sdot(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    let mut r = acc;
    asm!("sdot {0:v}.4s, {1:v}.16b, {2:v}.16b", inout(vreg) r, in(vreg) a, in(vreg) b, options(pure, nomem, nostack, preserves_flags));
    r
}

/// acc + the 16 products a[i] * b[i] spread over 4 i32 lanes. The lane partition differs
/// between the builds (DP: sdot groups of 4; else smull + sadalp pairs), so callers only
/// use the lanes' total, which is exact in both (|a*b| <= 2^14 fits i16).
#[inline(always)]
unsafe fn dot16<const DP: bool>(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    if DP {
        sdot(acc, a, b)
    } else {
        let p0 = vmull_s8(vget_low_s8(a), vget_low_s8(b));
        let p1 = vmull_high_s8(a, b);
        vpadalq_s16(vpadalq_s16(acc, p0), p1)
    }
}

/// Exact sum of the 32 products of (a0, a1) with the 32 i8 at p.
#[inline(always)]
unsafe fn dot32<const DP: bool>(a0: int8x16_t, a1: int8x16_t, p: *const u8) -> i32 {
    let s = dot16::<DP>(vdupq_n_s32(0), a0, ld_s8(p));
    vaddvq_s32(dot16::<DP>(s, a1, ld_s8(p.add(16))))
}

/// Lane k = a[4k..4k+4] . b[4k..4k+4] (exact): the lanes of x86's `maddubs` + `madd`
/// (and of `sdot`), so the float accumulation below can follow the AVX2 kernels.
#[inline(always)]
unsafe fn dot4_lanes<const DP: bool>(a: int8x16_t, b: int8x16_t) -> int32x4_t {
    if DP {
        sdot(vdupq_n_s32(0), a, b)
    } else {
        let p0 = vpaddlq_s16(vmull_s8(vget_low_s8(a), vget_low_s8(b)));
        let p1 = vpaddlq_s16(vmull_high_s8(a, b));
        vpaddq_s32(p0, p1)
    }
}

/// The sum of 8 lanes (lo = AVX lanes 0..4, hi = 4..8) in the order of avx2.rs's
/// `hsum_ps`: ((v4 + v0) + (v6 + v2)) + ((v5 + v1) + (v7 + v3)).
#[inline(always)]
unsafe fn hsum8(lo: float32x4_t, hi: float32x4_t) -> f32 {
    let r = vaddq_f32(hi, lo);
    let t = vadd_f32(vget_low_f32(r), vget_high_f32(r));
    vget_lane_f32::<0>(t) + vget_lane_f32::<1>(t)
}

/// 16 packed nibble bytes -> (low nibbles = elements 0..16, high nibbles = elements 16..32).
#[inline(always)]
unsafe fn nibbles(p: *const u8) -> (uint8x16_t, uint8x16_t) {
    let b = vld1q_u8(p);
    (vandq_u8(b, vdupq_n_u8(0xF)), vshrq_n_u8::<4>(b))
}

static BIT_MASK: [u8; 16] = [1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128];

/// Q5_0/Q5_1's 32 high bits (u32 at p, bit j = element j) -> 0x10 in byte j where set.
#[inline(always)]
unsafe fn fifth_bits(p: *const u8) -> (uint8x16_t, uint8x16_t) {
    let b = std::ptr::read_unaligned(p as *const [u8; 4]);
    let mask = vld1q_u8(BIT_MASK.as_ptr());
    let sixteen = vdupq_n_u8(0x10);
    let lo = vcombine_u8(vdup_n_u8(b[0]), vdup_n_u8(b[1]));
    let hi = vcombine_u8(vdup_n_u8(b[2]), vdup_n_u8(b[3]));
    (vandq_u8(vtstq_u8(lo, mask), sixteen), vandq_u8(vtstq_u8(hi, mask), sixteen))
}

// ------------------------------------------------------------------ 32-element blocks

/// Signed-weight family (Q4_0, Q5_0, Q8_0, IQ4_NL against Q8_0), in the order of the AVX2
/// kernel (ggml's x86 order): per block, 8 lanes of exact 4-product sums, each FMA'd with
/// d_w * d_x into 8 f32 accumulators; `hsum8` at the end. `decode(block) -> 32 weights`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn dot_signed_q8_0<const NC: usize, const DP: bool>(
    n: usize,
    w: *const u8,
    wsize: usize,
    x: *const u8,
    xs: usize,
    xd: *const f32,
    xds: usize,
    out: *mut f32,
    decode: impl Fn(*const u8) -> (int8x16_t, int8x16_t),
) {
    let nb = n / 32;
    let z = vdupq_n_f32(0.0);
    let mut acc = [(z, z); NC];
    for i in 0..nb {
        let bw = w.add(i * wsize);
        let dw = f16_at(bw);
        let (q0, q1) = decode(bw);
        for (c, a) in acc.iter_mut().enumerate() {
            let by = x.add(c * xs + i * BlockQ8_0::SIZE);
            let dx = if xd.is_null() { f16_at(by) } else { std::ptr::read_unaligned(xd.add(c * xds + i)) };
            let d = dw * dx;
            a.0 = vfmaq_n_f32(a.0, vcvtq_f32_s32(dot4_lanes::<DP>(q0, ld_s8(by.add(offset_of!(BlockQ8_0, qs))))), d);
            a.1 = vfmaq_n_f32(a.1, vcvtq_f32_s32(dot4_lanes::<DP>(q1, ld_s8(by.add(offset_of!(BlockQ8_0, qs) + 16)))), d);
        }
    }
    for (c, a) in acc.iter().enumerate() {
        *out.add(c) = hsum8(a.0, a.1);
    }
}

/// Unsigned-weight-with-min family (Q4_1, Q5_1 against Q8_1), in the AVX2 kernel's order:
/// the 8-lane FMA accumulation of the signed family with d_w * d_x, plus the sequential
/// sum of m_w * s_x, added after the horizontal sum.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn dot_min_q8_1<const NC: usize, const DP: bool>(
    n: usize,
    w: *const u8,
    wsize: usize,
    x: *const u8,
    xs: usize,
    xd: *const f32,
    xds: usize,
    out: *mut f32,
    decode: impl Fn(*const u8) -> (int8x16_t, int8x16_t),
) {
    let nb = n / 32;
    let z = vdupq_n_f32(0.0);
    let mut acc = [(z, z); NC];
    let mut summ = [0f32; NC];
    for i in 0..nb {
        let bw = w.add(i * wsize);
        let (dw, mw) = (f16_at(bw), f16_at(bw.add(2)));
        let (q0, q1) = decode(bw);
        for (c, a) in acc.iter_mut().enumerate() {
            let by = x.add(c * xs + i * BlockQ8_1::SIZE);
            let (dx, sx) = if xd.is_null() {
                (f16_at(by), f16_at(by.add(2)))
            } else {
                let p = xd.add(c * xds + 2 * i);
                (std::ptr::read_unaligned(p), std::ptr::read_unaligned(p.add(1)))
            };
            let d = dw * dx;
            summ[c] += mw * sx;
            a.0 = vfmaq_n_f32(a.0, vcvtq_f32_s32(dot4_lanes::<DP>(q0, ld_s8(by.add(offset_of!(BlockQ8_1, qs))))), d);
            a.1 = vfmaq_n_f32(a.1, vcvtq_f32_s32(dot4_lanes::<DP>(q1, ld_s8(by.add(offset_of!(BlockQ8_1, qs) + 16)))), d);
        }
    }
    for (c, a) in acc.iter().enumerate() {
        *out.add(c) = hsum8(a.0, a.1) + summ[c];
    }
}

/// A kernel in two builds: plain NEON and NEON + dotprod (bit-identical results).
macro_rules! kernel {
    ($plain:ident, $dot:ident, $body:ident) => {
        #[target_feature(enable = "neon")]
        pub(crate) unsafe fn $plain<const NC: usize>(n: usize, w: *const u8, x: *const u8, xs: usize, xd: *const f32, xds: usize, out: *mut f32) {
            $body::<NC, false>(n, w, x, xs, xd, xds, out)
        }
        #[target_feature(enable = "neon,dotprod")]
        pub(crate) unsafe fn $dot<const NC: usize>(n: usize, w: *const u8, x: *const u8, xs: usize, xd: *const f32, xds: usize, out: *mut f32) {
            $body::<NC, true>(n, w, x, xs, xd, xds, out)
        }
    };
}

kernel!(dot_q4_0, dot_q4_0_dp, body_q4_0);
kernel!(dot_q4_1, dot_q4_1_dp, body_q4_1);
kernel!(dot_q5_0, dot_q5_0_dp, body_q5_0);
kernel!(dot_q5_1, dot_q5_1_dp, body_q5_1);
kernel!(dot_q8_0, dot_q8_0_dp, body_q8_0);
kernel!(dot_iq4_nl, dot_iq4_nl_dp, body_iq4_nl);
kernel!(dot_q2_k, dot_q2_k_dp, body_q2_k);
kernel!(dot_q3_k, dot_q3_k_dp, body_q3_k);
kernel!(dot_iq4_xs, dot_iq4_xs_dp, body_iq4_xs);
kernel!(dot_q4_k, dot_q4_k_dp, body_q4_k);
kernel!(dot_q5_k, dot_q5_k_dp, body_q5_k);
kernel!(dot_q6_k, dot_q6_k_dp, body_q6_k);
kernel!(dot_q8_k, dot_q8_k_dp, body_q8_k);

/// Q4_0 (18 B: d, qs[16]): nibble - 8.
#[inline(always)]
unsafe fn body_q4_0<const NC: usize, const DP: bool>(n: usize, w: *const u8, x: *const u8, xs: usize, xd: *const f32, xds: usize, out: *mut f32) {
    dot_signed_q8_0::<NC, DP>(n, w, BlockQ4_0::SIZE, x, xs, xd, xds, out, |b| {
        let (lo, hi) = nibbles(b.add(2));
        let eight = vdupq_n_s8(8);
        (vsubq_s8(vreinterpretq_s8_u8(lo), eight), vsubq_s8(vreinterpretq_s8_u8(hi), eight))
    })
}

/// Q5_0 (22 B: d, qh u32, qs[16]): (nibble | bit << 4) - 16.
#[inline(always)]
unsafe fn body_q5_0<const NC: usize, const DP: bool>(n: usize, w: *const u8, x: *const u8, xs: usize, xd: *const f32, xds: usize, out: *mut f32) {
    dot_signed_q8_0::<NC, DP>(n, w, BlockQ5_0::SIZE, x, xs, xd, xds, out, |b| {
        let (lo, hi) = nibbles(b.add(6));
        let (h0, h1) = fifth_bits(b.add(2));
        let sixteen = vdupq_n_s8(16);
        (
            vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(lo, h0)), sixteen),
            vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(hi, h1)), sixteen),
        )
    })
}

/// Q8_0 (34 B: d, qs[32] i8).
#[inline(always)]
unsafe fn body_q8_0<const NC: usize, const DP: bool>(n: usize, w: *const u8, x: *const u8, xs: usize, xd: *const f32, xds: usize, out: *mut f32) {
    dot_signed_q8_0::<NC, DP>(n, w, BlockQ8_0::SIZE, x, xs, xd, xds, out, |b| (ld_s8(b.add(2)), ld_s8(b.add(18))))
}

/// IQ4_NL (18 B: d, qs[16]): nibble -> KVALUES_IQ4NL[nibble] by table lookup.
#[inline(always)]
unsafe fn body_iq4_nl<const NC: usize, const DP: bool>(n: usize, w: *const u8, x: *const u8, xs: usize, xd: *const f32, xds: usize, out: *mut f32) {
    let table = vld1q_s8(KVALUES_IQ4NL.as_ptr());
    dot_signed_q8_0::<NC, DP>(n, w, BlockIQ4NL::SIZE, x, xs, xd, xds, out, |b| {
        let (lo, hi) = nibbles(b.add(2));
        (vqtbl1q_s8(table, lo), vqtbl1q_s8(table, hi))
    })
}

/// Q4_1 (20 B: d, m, qs[16]): nibble.
#[inline(always)]
unsafe fn body_q4_1<const NC: usize, const DP: bool>(n: usize, w: *const u8, x: *const u8, xs: usize, xd: *const f32, xds: usize, out: *mut f32) {
    dot_min_q8_1::<NC, DP>(n, w, BlockQ4_1::SIZE, x, xs, xd, xds, out, |b| {
        let (lo, hi) = nibbles(b.add(4));
        (vreinterpretq_s8_u8(lo), vreinterpretq_s8_u8(hi))
    })
}

/// Q5_1 (24 B: d, m, qh u32, qs[16]): nibble | bit << 4.
#[inline(always)]
unsafe fn body_q5_1<const NC: usize, const DP: bool>(n: usize, w: *const u8, x: *const u8, xs: usize, xd: *const f32, xds: usize, out: *mut f32) {
    dot_min_q8_1::<NC, DP>(n, w, BlockQ5_1::SIZE, x, xs, xd, xds, out, |b| {
        let (lo, hi) = nibbles(b.add(8));
        let (h0, h1) = fifth_bits(b.add(4));
        (vreinterpretq_s8_u8(vorrq_u8(lo, h0)), vreinterpretq_s8_u8(vorrq_u8(hi, h1)))
    })
}

// ------------------------------------------------------------------ K-quants
// Activations: Q8_K blocks of 292 B: d (f32), qs[256] i8, bsums[16] i16 (sums of 16 qs).

/// Column c's Q8_K block i: (d, pointer to qs).
#[inline(always)]
unsafe fn q8k(x: *const u8, xs: usize, c: usize, i: usize) -> (f32, *const u8) {
    let b = x.add(c * xs + i * BlockQ8K::SIZE);
    (f32_at(b), b.add(offset_of!(BlockQ8K, qs)))
}

/// Q4_K/Q5_K scales (i32) and mins (i16) of the 8 sub-blocks from the 12 packed bytes.
#[inline(always)]
unsafe fn k4_scales_mins(p: *const u8) -> ([i32; 8], int16x8_t) {
    let sc = std::slice::from_raw_parts(p, 12);
    let mut s = [0i32; 8];
    let mut m = [0i16; 8];
    for (j, (sj, mj)) in s.iter_mut().zip(m.iter_mut()).enumerate() {
        let (a, b) = scale_min_k4(j, sc);
        *sj = a as i32;
        *mj = b as i16;
    }
    (s, vld1q_s16(m.as_ptr()))
}

/// Per pair of sub-blocks p (0..4): min(2p) * bsum(2p) + min(2p+1) * bsum(2p+1), where
/// bsum(j) is the sum of sub-block j's 32 activations (two of Q8_K's 16-sums). Exact.
#[inline(always)]
unsafe fn k4_min_products(mins: int16x8_t, q8: *const u8) -> int32x4_t {
    let b = q8.add(256) as *const i16;
    let bs = vpaddq_s16(vld1q_s16(b), vld1q_s16(b.add(8))); // 8 sub-block sums, |.| <= 4064
    let lo = vmull_s16(vget_low_s16(mins), vget_low_s16(bs));
    let hi = vmull_high_s16(mins, bs);
    vpaddq_s32(lo, hi)
}

/// Q4_K (144 B: d, dmin, scales[12], qs[128]) x Q8_K in `vec_dot_q4_k_q8_k_ref`'s order
/// (llama.cpp's repacked gemm order): per 64-element pair of sub-blocks, the exact i32
/// sums of scale * dot and of min * bsum, FMA'd (times d_w*d_a, resp. dmin_w*d_a) into two
/// accumulators; the result is their difference.
#[inline(always)]
unsafe fn body_q4_k<const NC: usize, const DP: bool>(n: usize, w: *const u8, x: *const u8, xs: usize, _xd: *const f32, _xds: usize, out: *mut f32) {
    let nb = n / 256;
    let mut sumf = [0f32; NC];
    let mut sumf_m = [0f32; NC];
    for i in 0..nb {
        let bw = w.add(i * BlockQ4K::SIZE);
        let (dw, dminw) = (f16_at(bw), f16_at(bw.add(2)));
        let (s, mins) = k4_scales_mins(bw.add(4));
        // pair p: qs[32p..32p+32]; low nibbles = sub-block 2p, high = sub-block 2p+1.
        let mut q = [vdupq_n_s8(0); 16];
        for p in 0..4 {
            let (l0, h0) = nibbles(bw.add(16 + 32 * p));
            let (l1, h1) = nibbles(bw.add(16 + 32 * p + 16));
            q[4 * p] = vreinterpretq_s8_u8(l0);
            q[4 * p + 1] = vreinterpretq_s8_u8(l1);
            q[4 * p + 2] = vreinterpretq_s8_u8(h0);
            q[4 * p + 3] = vreinterpretq_s8_u8(h1);
        }
        for c in 0..NC {
            let (yd, q8) = q8k(x, xs, c, i);
            let mut summ = [0i32; 4];
            vst1q_s32(summ.as_mut_ptr(), k4_min_products(mins, q8));
            let dsc = dw * yd;
            let dmn = dminw * yd;
            for p in 0..4 {
                let tl = dot32::<DP>(q[4 * p], q[4 * p + 1], q8.add(64 * p));
                let th = dot32::<DP>(q[4 * p + 2], q[4 * p + 3], q8.add(64 * p + 32));
                let isum = s[2 * p] * tl + s[2 * p + 1] * th;
                sumf[c] = (isum as f32).mul_add(dsc, sumf[c]);
                sumf_m[c] = (summ[p] as f32).mul_add(dmn, sumf_m[c]);
            }
        }
    }
    for c in 0..NC {
        *out.add(c) = sumf[c] - sumf_m[c];
    }
}

/// Q5_K (176 B: d, dmin, scales[12], qh[32], qs[128]) x Q8_K in the AVX2 kernel's order:
/// per super-block, 8 i32 lanes (lane k: bytes 4k..4k+4 of every 32-element sub-block,
/// times its scale, exact) FMA'd with d_w * d_a into 8 f32 lanes, and the 4 exact
/// min * bsum pair sums FMA'd with -(dmin_w * d_a) into 4 more; the two horizontal sums
/// are added at the end.
#[inline(always)]
unsafe fn body_q5_k<const NC: usize, const DP: bool>(n: usize, w: *const u8, x: *const u8, xs: usize, _xd: *const f32, _xds: usize, out: *mut f32) {
    let nb = n / 256;
    let z = vdupq_n_f32(0.0);
    let mut acc = [(z, z); NC];
    let mut acc_m = [z; NC];
    for i in 0..nb {
        let bw = w.add(i * BlockQ5K::SIZE);
        let (dw, dminw) = (f16_at(bw), f16_at(bw.add(2)));
        let (s, mins) = k4_scales_mins(bw.add(4));
        let qh = [vld1q_u8(bw.add(16)), vld1q_u8(bw.add(32))];
        let sixteen = vdupq_n_u8(0x10);
        // sub-block j (0..8), half k: 16 weights; the 5th bit of element l is bit j of qh[l].
        let mut q = [vdupq_n_s8(0); 16];
        for p in 0..4 {
            for k in 0..2 {
                let b = vld1q_u8(bw.add(48 + 32 * p + 16 * k));
                let hl = vandq_u8(vtstq_u8(qh[k], vdupq_n_u8(1 << (2 * p))), sixteen);
                let hh = vandq_u8(vtstq_u8(qh[k], vdupq_n_u8(1 << (2 * p + 1))), sixteen);
                q[4 * p + k] = vreinterpretq_s8_u8(vorrq_u8(vandq_u8(b, vdupq_n_u8(0xF)), hl));
                q[4 * p + 2 + k] = vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8::<4>(b), hh));
            }
        }
        for c in 0..NC {
            let (yd, q8) = q8k(x, xs, c, i);
            let prod = k4_min_products(mins, q8);
            let (mut lo, mut hi) = (vdupq_n_s32(0), vdupq_n_s32(0));
            for j in 0..8 {
                // sub-block j = 2p + h is q[4p + 2h], q[4p + 2h + 1]
                let r = 4 * (j / 2) + 2 * (j % 2);
                lo = vmlaq_n_s32(lo, dot4_lanes::<DP>(q[r], ld_s8(q8.add(32 * j))), s[j]);
                hi = vmlaq_n_s32(hi, dot4_lanes::<DP>(q[r + 1], ld_s8(q8.add(32 * j + 16))), s[j]);
            }
            let d = yd * dw;
            acc[c].0 = vfmaq_n_f32(acc[c].0, vcvtq_f32_s32(lo), d);
            acc[c].1 = vfmaq_n_f32(acc[c].1, vcvtq_f32_s32(hi), d);
            acc_m[c] = vfmaq_n_f32(acc_m[c], vcvtq_f32_s32(prod), -yd * dminw);
        }
    }
    for c in 0..NC {
        let m = acc_m[c];
        let hm = (vgetq_lane_f32::<0>(m) + vgetq_lane_f32::<2>(m)) + (vgetq_lane_f32::<1>(m) + vgetq_lane_f32::<3>(m));
        *out.add(c) = hsum8(acc[c].0, acc[c].1) + hm;
    }
}

/// Q2_K (84 B: scales[16] (lo nibble scale, hi nibble min), qs[64], d, dmin) x Q8_K in the
/// AVX2 kernel's order: per super-block, acc += -(d_a * dmin_w) * (8 lanes of min * bsum
/// pairs), then acc += (d_a * d_w) * (8 lanes of scaled 4-product sums).
#[inline(always)]
unsafe fn body_q2_k<const NC: usize, const DP: bool>(n: usize, w: *const u8, x: *const u8, xs: usize, _xd: *const f32, _xds: usize, out: *mut f32) {
    let nb = n / 256;
    let z = vdupq_n_f32(0.0);
    let mut acc = [(z, z); NC];
    let m3 = vdupq_n_u8(3);
    for i in 0..nb {
        let bw = w.add(i * BlockQ2K::SIZE);
        let dw = f16_at(bw.add(offset_of!(BlockQ2K, d)));
        let dminw = f16_at(bw.add(offset_of!(BlockQ2K, dmin)));
        let sm = vld1q_u8(bw);
        let mut sc = [0i32; 16];
        for (g, v) in sc.iter_mut().enumerate() {
            *v = (*bw.add(g) & 0xF) as i32;
        }
        let mins = vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(vshrq_n_u8::<4>(sm))));
        let mins_h = vreinterpretq_s16_u16(vmovl_high_u8(vshrq_n_u8::<4>(sm)));
        // chunk j (0..2) of 32 bytes, shift 2k: elements 128j + 32k + (0..32); the first 16
        // bytes have scale group 8j + 2k, the next 16 group 8j + 2k + 1.
        let mut q = [vdupq_n_s8(0); 16];
        for j in 0..2 {
            let b0 = vld1q_u8(bw.add(16 + 32 * j));
            let b1 = vld1q_u8(bw.add(32 + 32 * j));
            for k in 0..4 {
                let sh = vdupq_n_s8(-2 * k as i8);
                q[8 * j + 2 * k] = vreinterpretq_s8_u8(vandq_u8(vshlq_u8(b0, sh), m3));
                q[8 * j + 2 * k + 1] = vreinterpretq_s8_u8(vandq_u8(vshlq_u8(b1, sh), m3));
            }
        }
        for (c, a) in acc.iter_mut().enumerate() {
            let (yd, q8) = q8k(x, xs, c, i);
            let b = q8.add(256) as *const i16;
            let (bs0, bs1) = (vld1q_s16(b), vld1q_s16(b.add(8)));
            let p_lo = vpaddq_s32(vmull_s16(vget_low_s16(mins), vget_low_s16(bs0)), vmull_high_s16(mins, bs0));
            let p_hi = vpaddq_s32(vmull_s16(vget_low_s16(mins_h), vget_low_s16(bs1)), vmull_high_s16(mins_h, bs1));
            let (mut lo, mut hi) = (vdupq_n_s32(0), vdupq_n_s32(0));
            for r in 0..8 {
                // r = 4j + k: q8[32r..32r+32]
                let (j, k) = (r / 4, r % 4);
                let g = 8 * j + 2 * k;
                lo = vmlaq_n_s32(lo, dot4_lanes::<DP>(q[g], ld_s8(q8.add(32 * r))), sc[g]);
                hi = vmlaq_n_s32(hi, dot4_lanes::<DP>(q[g + 1], ld_s8(q8.add(32 * r + 16))), sc[g + 1]);
            }
            let dm = -yd * dminw;
            a.0 = vfmaq_n_f32(a.0, vcvtq_f32_s32(p_lo), dm);
            a.1 = vfmaq_n_f32(a.1, vcvtq_f32_s32(p_hi), dm);
            let d = yd * dw;
            a.0 = vfmaq_n_f32(a.0, vcvtq_f32_s32(lo), d);
            a.1 = vfmaq_n_f32(a.1, vcvtq_f32_s32(hi), d);
        }
    }
    for (c, a) in acc.iter().enumerate() {
        *out.add(c) = hsum8(a.0, a.1);
    }
}

/// Q3_K (110 B: hmask[32], qs[64], scales[12], d) x Q8_K in the AVX2 kernel's order:
/// acc += (d_w * d_a) * (8 lanes of scaled 4-product sums) per super-block.
#[inline(always)]
unsafe fn body_q3_k<const NC: usize, const DP: bool>(n: usize, w: *const u8, x: *const u8, xs: usize, _xd: *const f32, _xds: usize, out: *mut f32) {
    let nb = n / 256;
    let z = vdupq_n_f32(0.0);
    let mut acc = [(z, z); NC];
    let m3 = vdupq_n_u8(3);
    let four = vdupq_n_u8(4);
    for i in 0..nb {
        let bw = w.add(i * BlockQ3K::SIZE);
        let dw = f16_at(bw.add(offset_of!(BlockQ3K, d)));
        let scales = super::kquants::q3k_scales(std::slice::from_raw_parts(bw.add(offset_of!(BlockQ3K, scales)), 12));
        let hm = [vld1q_u8(bw), vld1q_u8(bw.add(16))];
        // chunk j, shift 2k, half h: elements 128j + 32k + 16h + (0..16), high bit 4j + k.
        let mut q = [vdupq_n_s8(0); 16];
        for j in 0..2 {
            for h in 0..2 {
                let b = vld1q_u8(bw.add(32 + 32 * j + 16 * h));
                for k in 0..4 {
                    let ql = vandq_u8(vshlq_u8(b, vdupq_n_s8(-2 * k as i8)), m3);
                    let clear = vceqq_u8(vandq_u8(hm[h], vdupq_n_u8(1 << (4 * j + k))), vdupq_n_u8(0));
                    let sub = vandq_u8(clear, four);
                    q[8 * j + 2 * k + h] = vsubq_s8(vreinterpretq_s8_u8(ql), vreinterpretq_s8_u8(sub));
                }
            }
        }
        for (c, a) in acc.iter_mut().enumerate() {
            let (yd, q8) = q8k(x, xs, c, i);
            let (mut lo, mut hi) = (vdupq_n_s32(0), vdupq_n_s32(0));
            for r in 0..8 {
                let g = 2 * r; // = 8j + 2k for r = 4j + k
                lo = vmlaq_n_s32(lo, dot4_lanes::<DP>(q[g], ld_s8(q8.add(32 * r))), scales[g] as i32);
                hi = vmlaq_n_s32(hi, dot4_lanes::<DP>(q[g + 1], ld_s8(q8.add(32 * r + 16))), scales[g + 1] as i32);
            }
            let d = dw * yd;
            a.0 = vfmaq_n_f32(a.0, vcvtq_f32_s32(lo), d);
            a.1 = vfmaq_n_f32(a.1, vcvtq_f32_s32(hi), d);
        }
    }
    for (c, a) in acc.iter().enumerate() {
        *out.add(c) = hsum8(a.0, a.1);
    }
}

/// IQ4_XS (136 B: d, scales_h u16, scales_l[4], qs[128]) x Q8_K in the AVX2 kernel's
/// order: acc += (d_w * d_a) * (8 lanes of scaled 4-product sums) per super-block.
#[inline(always)]
unsafe fn body_iq4_xs<const NC: usize, const DP: bool>(n: usize, w: *const u8, x: *const u8, xs: usize, _xd: *const f32, _xds: usize, out: *mut f32) {
    let nb = n / 256;
    let z = vdupq_n_f32(0.0);
    let mut acc = [(z, z); NC];
    let table = vld1q_s8(KVALUES_IQ4NL.as_ptr());
    for i in 0..nb {
        let bw = w.add(i * BlockIQ4XS::SIZE);
        let dw = f16_at(bw);
        let sh = std::ptr::read_unaligned(bw.add(2) as *const u16);
        let mut ls = [0i32; 8];
        let mut q = [vdupq_n_s8(0); 16];
        for ib in 0..8 {
            let lo = (*bw.add(4 + ib / 2) >> (4 * (ib % 2))) & 0xF;
            ls[ib] = (lo as i32 | ((((sh >> (2 * ib)) & 3) as i32) << 4)) - 32;
            let (l, h) = nibbles(bw.add(8 + 16 * ib));
            q[2 * ib] = vqtbl1q_s8(table, l);
            q[2 * ib + 1] = vqtbl1q_s8(table, h);
        }
        for (c, a) in acc.iter_mut().enumerate() {
            let (yd, q8) = q8k(x, xs, c, i);
            let (mut lo, mut hi) = (vdupq_n_s32(0), vdupq_n_s32(0));
            for ib in 0..8 {
                lo = vmlaq_n_s32(lo, dot4_lanes::<DP>(q[2 * ib], ld_s8(q8.add(32 * ib))), ls[ib]);
                hi = vmlaq_n_s32(hi, dot4_lanes::<DP>(q[2 * ib + 1], ld_s8(q8.add(32 * ib + 16))), ls[ib]);
            }
            let d = dw * yd;
            a.0 = vfmaq_n_f32(a.0, vcvtq_f32_s32(lo), d);
            a.1 = vfmaq_n_f32(a.1, vcvtq_f32_s32(hi), d);
        }
    }
    for (c, a) in acc.iter().enumerate() {
        *out.add(c) = hsum8(a.0, a.1);
    }
}

/// Q6_K (210 B: ql[128], qh[64], scales[16] i8, d) x Q8_K in `vec_dot_q6_k_q8_k_ref`'s
/// order (llama.cpp's tiled order): the exact i32 sum over the super-block of
/// scale(g) * dot(group g of 16), then sumf = fma(d_w * isum, d_a, sumf).
#[inline(always)]
unsafe fn body_q6_k<const NC: usize, const DP: bool>(n: usize, w: *const u8, x: *const u8, xs: usize, _xd: *const f32, _xds: usize, out: *mut f32) {
    let nb = n / 256;
    let mut sumf = [0f32; NC];
    let m4 = vdupq_n_u8(0xF);
    let m2 = vdupq_n_u8(3);
    let off = vdupq_n_s8(32);
    for i in 0..nb {
        let bw = w.add(i * BlockQ6K::SIZE);
        let (ql, qh, sc) = (bw, bw.add(128), bw.add(192) as *const i8);
        let dw = f16_at(bw.add(208));
        // Each 16-byte register is exactly one 16-element scale group g: for half h,
        // quarter (32 elements) t and register k, g = 8h + 2t + k.
        let mut q = [vdupq_n_s8(0); 16];
        for h in 0..2 {
            for k in 0..2 {
                let l0 = vld1q_u8(ql.add(64 * h + 16 * k));
                let l1 = vld1q_u8(ql.add(64 * h + 32 + 16 * k));
                let hb = vld1q_u8(qh.add(32 * h + 16 * k));
                let v = [
                    vorrq_u8(vandq_u8(l0, m4), vshlq_n_u8::<4>(vandq_u8(hb, m2))),
                    vorrq_u8(vandq_u8(l1, m4), vshlq_n_u8::<4>(vandq_u8(vshrq_n_u8::<2>(hb), m2))),
                    vorrq_u8(vshrq_n_u8::<4>(l0), vshlq_n_u8::<4>(vandq_u8(vshrq_n_u8::<4>(hb), m2))),
                    vorrq_u8(vshrq_n_u8::<4>(l1), vshlq_n_u8::<4>(vshrq_n_u8::<6>(hb))),
                ];
                for (t, vt) in v.iter().enumerate() {
                    q[8 * h + 2 * t + k] = vsubq_s8(vreinterpretq_s8_u8(*vt), off);
                }
            }
        }
        for (c, sf) in sumf.iter_mut().enumerate() {
            let (yd, q8) = q8k(x, xs, c, i);
            let mut acc = vdupq_n_s32(0);
            for (g, qg) in q.iter().enumerate() {
                let d = dot16::<DP>(vdupq_n_s32(0), *qg, ld_s8(q8.add(16 * g)));
                acc = vmlaq_n_s32(acc, d, *sc.add(g) as i32);
            }
            let isum = vaddvq_s32(acc);
            *sf = (dw * isum as f32).mul_add(yd, *sf);
        }
    }
    for (c, s) in sumf.iter().enumerate() {
        *out.add(c) = *s;
    }
}

/// Q8_K x Q8_K as `vec_dot_q8_k_q8_k_ref`: sumf += (d_w * d_a) * sumi per super-block.
#[inline(always)]
unsafe fn body_q8_k<const NC: usize, const DP: bool>(n: usize, w: *const u8, x: *const u8, xs: usize, _xd: *const f32, _xds: usize, out: *mut f32) {
    let nb = n / 256;
    let mut sumf = [0f32; NC];
    for i in 0..nb {
        let bw = w.add(i * BlockQ8K::SIZE);
        let dw = f32_at(bw);
        for (c, sf) in sumf.iter_mut().enumerate() {
            let (yd, q8) = q8k(x, xs, c, i);
            let mut acc = vdupq_n_s32(0);
            for g in 0..16 {
                acc = dot16::<DP>(acc, ld_s8(bw.add(4 + 16 * g)), ld_s8(q8.add(16 * g)));
            }
            *sf += (dw * yd) * vaddvq_s32(acc) as f32;
        }
    }
    for (c, s) in sumf.iter().enumerate() {
        *out.add(c) = *s;
    }
}

// ------------------------------------------------------------------ float rows

/// Shared float kernel in avx2.rs's `dot_float` order: 16 elements per step into four
/// 4-lane FMA accumulators per column (= AVX's two 8-lane ones), then `hsum8` of their
/// sum, then a scalar tail. `load(p, k)`
/// converts 4 elements starting at element k of row p, `scalar(p, k)` one.
#[inline(always)]
unsafe fn dot_float<const NC: usize>(
    n: usize,
    w: *const u8,
    x: *const u8,
    xs: usize,
    out: *mut f32,
    load: impl Fn(*const u8, usize) -> float32x4_t,
    scalar: impl Fn(*const u8, usize) -> f32,
) {
    let z = vdupq_n_f32(0.0);
    let mut acc = [[z; 4]; NC];
    let n16 = n / 16 * 16;
    let mut k = 0;
    while k < n16 {
        let wv = [load(w, k), load(w, k + 4), load(w, k + 8), load(w, k + 12)];
        for (c, a) in acc.iter_mut().enumerate() {
            let xc = x.add(c * xs);
            for j in 0..4 {
                a[j] = vfmaq_f32(a[j], wv[j], load(xc, k + 4 * j));
            }
        }
        k += 16;
    }
    for (c, a) in acc.iter().enumerate() {
        let mut s = hsum8(vaddq_f32(a[0], a[2]), vaddq_f32(a[1], a[3]));
        let xc = x.add(c * xs);
        for k in n16..n {
            s += scalar(w, k) * scalar(xc, k);
        }
        *out.add(c) = s;
    }
}

#[target_feature(enable = "neon")]
pub(crate) unsafe fn dot_f32<const NC: usize>(n: usize, w: *const u8, x: *const u8, xs: usize, _xd: *const f32, _xds: usize, out: *mut f32) {
    dot_float::<NC>(n, w, x, xs, out, |p, k| vld1q_f32(p.add(4 * k) as *const f32), |p, k| f32_at(p.add(4 * k)))
}

#[target_feature(enable = "neon")]
pub(crate) unsafe fn dot_f16<const NC: usize>(n: usize, w: *const u8, x: *const u8, xs: usize, _xd: *const f32, _xds: usize, out: *mut f32) {
    dot_float::<NC>(n, w, x, xs, out, |p, k| cvt_f16x4(vld1_u16(p.add(2 * k) as *const u16)), |p, k| f16_at(p.add(2 * k)))
}

#[target_feature(enable = "neon")]
pub(crate) unsafe fn dot_bf16<const NC: usize>(n: usize, w: *const u8, x: *const u8, xs: usize, _xd: *const f32, _xds: usize, out: *mut f32) {
    dot_float::<NC>(
        n,
        w,
        x,
        xs,
        out,
        |p, k| vreinterpretq_f32_u32(vshll_n_u16::<16>(vld1_u16(p.add(2 * k) as *const u16))),
        |p, k| f32::from_bits((std::ptr::read_unaligned(p.add(2 * k) as *const u16) as u32) << 16),
    )
}
