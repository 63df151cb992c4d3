//! AVX2 kernels of the grid / ternary formats (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S,
//! IQ1_S, IQ1_M, TQ1_0, TQ2_0 against Q8_K) and of MXFP4 (against Q8_0); see `iquants.rs`
//! for the layouts and the scalar twins.
//!
//! Float order of the grid types (IQ1_*, IQ2_*, IQ3_*): llama.cpp's tiled matmul
//! (ggml-cpu/tiled, which it runs for 8 or more activation rows), for every row count as
//! pyllama does for Q6_K (results independent of the batch): per block the exact integer
//! sum, times d_w (with the grid's 1/8 or 1/4 folded in), one FMA with d_a, blocks in order
//! (`iquants::vec_dot_k_tiled`). The `_vd` builds (PYLLAMA_ORDER=llamacpp below 8 rows),
//! TQ1_0, TQ2_0 and MXFP4 (which llama.cpp never tiles) follow ggml's AVX2 vec_dot
//! (ggml-cpu/arch/x86/quants.c; `iquants::vec_dot_k_x86`). The tests hold each to its
//! scalar twin bit for bit. vec_dot order: per 256-element block, 8
//! exact i32 lanes (lane k: the scaled products at positions 4k..4k+4 of every 32-element
//! chunk, from `maddubs` + `madd`), one FMA with d_w * d_a into 8 f32 lanes, ggml's
//! horizontal sum at the end (times 1/8 or 1/4 where ggml's grids hold 8x / 4x values).
//! IQ1_S adds its delta term as a scalar FMA chain, IQ1_M as a second 8-lane accumulator,
//! TQ1_0 / TQ2_0 subtract the activation block sums from the lanes (the digit offset -1).
//! MXFP4: ggml's two accumulators for even and odd blocks, a scalar FMA for an odd last one.
//!
//! Decoding: each 32-element chunk of weights becomes 32 unsigned magnitudes `u` and a
//! sign vector `s` (applied to the activations with `sign_epi8`, as ggml does), with its
//! sub-block scales as i16; the chunk is decoded once per NC activation columns.

#![allow(clippy::missing_safety_doc)]

use super::avx2::{f16, hsum_ps, TILE};
use super::iq_grids::*;
use super::iquants::{e8m0_half, KVALUES_MXFP4, SIGNS7};
use super::table::{KernelTable, Tiled};
use crate::ggml_type::GgmlType;
use super::blocks::{offset_of, Block, BlockIQ1M, BlockIQ1S, BlockIQ2S, BlockIQ2XS, BlockIQ2XXS, BlockIQ3S, BlockIQ3XXS, BlockMXFP4, BlockNVFP4, BlockQ1_0, BlockQ8K, BlockQ8_0, BlockTQ1_0, BlockTQ2_0};
use std::arch::x86_64::*;

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load256(p: *const u8) -> __m256i {
    _mm256_loadu_si256(p as *const __m256i)
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load128(p: *const u8) -> __m128i {
    _mm_loadu_si128(p as *const __m128i)
}

#[inline(always)]
unsafe fn rd_u16(p: *const u8) -> u32 {
    std::ptr::read_unaligned(p as *const u16) as u32
}

#[inline(always)]
unsafe fn rd_u32(p: *const u8) -> u32 {
    std::ptr::read_unaligned(p as *const u32)
}

/// One decoded 32-element chunk: magnitudes, signs (the sign of each byte is applied to
/// the activation), i16 scales per element pair; IQ1_M's delta signs; IQ1_S's scale times
/// delta sign.
#[derive(Clone, Copy)]
struct Chunk {
    u: __m256i,
    s: __m256i,
    sc: __m256i,
    dl: __m256i,
    dsc: i32,
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn chunk(u: __m256i, s: __m256i, sc: __m256i) -> Chunk {
    Chunk { u, s, sc, dl: _mm256_setzero_si256(), dsc: 0 }
}

/// i16 scales: `lo` for the chunk's first 16 elements, `hi` for the last 16.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scales2(lo: u32, hi: u32) -> __m256i {
    _mm256_set_m128i(_mm_set1_epi16(hi as i16), _mm_set1_epi16(lo as i16))
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn g64(a: u64, b: u64, c: u64, d: u64) -> __m256i {
    _mm256_set_epi64x(d as i64, c as i64, b as i64, a as i64)
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dec_iq2_xxs(b: *const u8, c: usize) -> Chunk {
    let a0 = rd_u32(b.add(offset_of!(BlockIQ2XXS, qs) + 8 * c)) as usize;
    let a1 = rd_u32(b.add(offset_of!(BlockIQ2XXS, qs) + 4 + 8 * c));
    let g = |l: usize| *IQ2XXS_GRID.get_unchecked((a0 >> (8 * l)) & 255);
    let s = |l: usize| *SIGNS7.get_unchecked(((a1 >> (7 * l)) & 127) as usize);
    chunk(g64(g(0), g(1), g(2), g(3)), g64(s(0), s(1), s(2), s(3)), _mm256_set1_epi16((2 * (a1 >> 28) + 1) as i16))
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dec_iq2_xs(b: *const u8, c: usize) -> Chunk {
    let v = |l: usize| rd_u16(b.add(offset_of!(BlockIQ2XS, qs) + 8 * c + 2 * l)) as usize;
    let g = |l: usize| *IQ2XS_GRID.get_unchecked(v(l) & 511);
    let s = |l: usize| *SIGNS7.get_unchecked((v(l) >> 9) & 127);
    let sc = *b.add(offset_of!(BlockIQ2XS, scales) + c) as u32;
    chunk(g64(g(0), g(1), g(2), g(3)), g64(s(0), s(1), s(2), s(3)), scales2(2 * (sc & 0xf) + 1, 2 * (sc >> 4) + 1))
}

/// +1 / -1 bytes from the 32 sign bits at p (bit j of byte l: element 8l + j negative), by
/// ggml's byte shuffle: no table lookups.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn signs_from_bits(p: *const u8) -> __m256i {
    let spread = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
    let bit = _mm256_set1_epi64x(0x8040201008040201u64 as i64);
    let b = _mm256_shuffle_epi8(_mm256_set1_epi32(rd_u32(p) as i32), spread);
    let neg = _mm256_cmpeq_epi8(_mm256_and_si256(b, bit), bit);
    _mm256_or_si256(neg, _mm256_set1_epi8(1))
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dec_iq2_s(b: *const u8, c: usize) -> Chunk {
    let qh = *b.add(offset_of!(BlockIQ2S, qh) + c) as usize;
    let g = |l: usize| *IQ2S_GRID.get_unchecked(*b.add(offset_of!(BlockIQ2S, qs) + 4 * c + l) as usize | ((qh << (8 - 2 * l)) & 0x300));
    let sc = *b.add(offset_of!(BlockIQ2S, scales) + c) as u32;
    chunk(g64(g(0), g(1), g(2), g(3)), signs_from_bits(b.add(offset_of!(BlockIQ2S, qs) + 32 + 4 * c)), scales2(2 * (sc & 0xf) + 1, 2 * (sc >> 4) + 1))
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dec_iq3_xxs(b: *const u8, c: usize) -> Chunk {
    let q = b.add(offset_of!(BlockIQ3XXS, qs) + 8 * c);
    let g = |k: usize| *IQ3XXS_GRID.get_unchecked(*q.add(k) as usize) as i32;
    let u = _mm256_set_epi32(g(7), g(6), g(5), g(4), g(3), g(2), g(1), g(0));
    let a = rd_u32(b.add(offset_of!(BlockIQ3XXS, qs) + 64 + 4 * c));
    let s = |l: usize| *SIGNS7.get_unchecked(((a >> (7 * l)) & 127) as usize);
    chunk(u, g64(s(0), s(1), s(2), s(3)), _mm256_set1_epi16((2 * (a >> 28) + 1) as i16))
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dec_iq3_s(b: *const u8, c: usize) -> Chunk {
    let q = b.add(offset_of!(BlockIQ3S, qs) + 8 * c);
    let qh = *b.add(offset_of!(BlockIQ3S, qh) + c) as usize;
    // grid entry k of the chunk takes bit k of qh as its 9th index bit
    let g = |k: usize| *IQ3S_GRID.get_unchecked(*q.add(k) as usize | ((qh << (8 - k)) & 256)) as i32;
    let u = _mm256_set_epi32(g(7), g(6), g(5), g(4), g(3), g(2), g(1), g(0));
    let ls = 2 * ((*b.add(offset_of!(BlockIQ3S, scales) + c / 2) as u32 >> (4 * (c % 2))) & 0xf) + 1;
    chunk(u, signs_from_bits(b.add(offset_of!(BlockIQ3S, signs) + 4 * c)), _mm256_set1_epi16(ls as i16))
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dec_iq1_s(b: *const u8, c: usize) -> Chunk {
    let qh = rd_u16(b.add(offset_of!(BlockIQ1S, qh) + 2 * c)) as usize;
    let g = |l: usize| *IQ1S_GRID.get_unchecked(*b.add(offset_of!(BlockIQ1S, qs) + 4 * c + l) as usize | (((qh >> (3 * l)) & 7) << 8));
    let v = g64(g(0), g(1), g(2), g(3));
    let ls = (2 * ((qh >> 12) & 7) + 1) as i32;
    let mut ch = chunk(_mm256_sign_epi8(v, v), v, _mm256_set1_epi16(ls as i16));
    ch.dsc = if qh & 0x8000 != 0 { -ls } else { ls };
    ch
}

/// IQ1_M's delta signs of a chunk: entry k (bit l of k set: group l negative) holds 8 bytes
/// of -1 or +1 per group of 8.
#[repr(align(32))]
struct Aligned([u8; 512]);
static DELTA_SIGNS: Aligned = {
    let mut t = [0u8; 512];
    let mut k = 0;
    while k < 16 {
        let mut e = 0;
        while e < 32 {
            t[32 * k + e] = if k & (1 << (e / 8)) != 0 { 0xFF } else { 1 };
            e += 1;
        }
        k += 1;
    }
    Aligned(t)
};

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dec_iq1_m(b: *const u8, c: usize) -> Chunk {
    let (qh0, qh1) = (*b.add(32 + 2 * c) as usize, *b.add(33 + 2 * c) as usize);
    let idx = [qh0 << 8, qh0 << 4, qh1 << 8, qh1 << 4];
    let g = |l: usize| *IQ1S_GRID.get_unchecked(*b.add(4 * c + l) as usize | (idx[l] & 0x700));
    let v = g64(g(0), g(1), g(2), g(3));
    // delta sign bits 3 and 7 of qh0, qh1 -> a 4-bit index into the table of sign vectors
    let k = ((qh0 >> 3) & 1) | ((qh0 >> 6) & 2) | ((qh1 >> 1) & 4) | ((qh1 >> 4) & 8);
    let sc = rd_u16(b.add(48 + 2 * (c / 2))) >> (6 * (c % 2));
    let mut ch = chunk(_mm256_sign_epi8(v, v), v, scales2(2 * (sc & 7) + 1, 2 * ((sc >> 3) & 7) + 1));
    ch.dl = _mm256_loadu_si256(DELTA_SIGNS.0.as_ptr().add(32 * k) as *const __m256i);
    ch
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dec_tq2_0(b: *const u8, c: usize) -> Chunk {
    let bits = load256(b.add(32 * (c / 4)));
    let u = _mm256_and_si256(_mm256_srl_epi16(bits, _mm_cvtsi32_si128(2 * (c % 4) as i32)), _mm256_set1_epi8(3));
    chunk(u, _mm256_set1_epi8(1), _mm256_set1_epi16(1))
}

/// TQ1_0: the base-3 digit (byte * 3^n mod 256) * 3 >> 8 of every byte, the multiplier
/// per 16-bit lane.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tq1_digits(x: __m256i, mult: __m256i) -> __m256i {
    let ff = _mm256_set1_epi16(0xFF);
    let three = _mm256_set1_epi16(3);
    let lo = _mm256_and_si256(_mm256_mullo_epi16(x, mult), ff);
    let hi = _mm256_and_si256(_mm256_mullo_epi16(_mm256_srli_epi16(x, 8), mult), ff);
    let tlo = _mm256_srli_epi16(_mm256_mullo_epi16(lo, three), 8);
    let thi = _mm256_srli_epi16(_mm256_mullo_epi16(hi, three), 8);
    _mm256_or_si256(tlo, _mm256_slli_epi16(thi, 8))
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dec_tq1_0(b: *const u8, c: usize) -> Chunk {
    const P: [i16; 5] = [1, 3, 9, 27, 81];
    let m2 = |lo: i16, hi: i16| _mm256_set_m128i(_mm_set1_epi16(hi), _mm_set1_epi16(lo));
    let (x, mult) = match c {
        0..=4 => (load256(b), _mm256_set1_epi16(P[c])),
        5 => (_mm256_broadcastsi128_si256(load128(b.add(32))), m2(1, 3)),
        6 => (_mm256_broadcastsi128_si256(load128(b.add(32))), m2(9, 27)),
        _ => (
            _mm256_set_m128i(_mm_set1_epi32(rd_u32(b.add(48)) as i32), load128(b.add(32))),
            _mm256_set_m128i(_mm_set_epi16(27, 27, 9, 9, 3, 3, 1, 1), _mm_set1_epi16(81)),
        ),
    };
    chunk(tq1_digits(x, mult), _mm256_set1_epi8(1), _mm256_set1_epi16(1))
}

const PLAIN: u8 = 0;
const IQ1S: u8 = 1;
const IQ1M: u8 = 2;
const TERN: u8 = 3;

/// The shared 256-element kernel: `ts` block bytes, `dw(block)` the weight scale, `dec`
/// the chunk decoder, `fin` ggml's final factor; KIND selects the delta / offset handling.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn iq_body<const NC: usize, const KIND: u8, const TILED: bool>(
    n: usize,
    w: *const u8,
    x: *const u8,
    xs: usize,
    out: *mut f32,
    ts: usize,
    fin: f32,
    dw: impl Fn(*const u8) -> f32,
    dec: impl Fn(*const u8, usize) -> Chunk,
) {
    let nb = n / 256;
    let ones8 = _mm256_set1_epi8(1);
    let ones16 = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_ps(); NC];
    let mut acc2 = [_mm256_setzero_ps(); NC];
    let mut acc1 = [0f32; NC];
    let mut sumf = [0f32; NC];
    for i in 0..nb {
        let bw = w.add(i * ts);
        let mut sumi = [_mm256_setzero_si256(); NC];
        let mut sumi2 = [_mm256_setzero_si256(); NC];
        let mut s1 = [0i32; NC];
        // chunks in pairs, so that each decoder sees c % 2 as a constant
        for c2 in 0..4 {
            for h in 0..2 {
                let c = 2 * c2 + h;
                let ch = dec(bw, c);
                for col in 0..NC {
                    let q8 = x.add(col * xs + i * BlockQ8K::SIZE + offset_of!(BlockQ8K, qs));
                    let y = load256(q8.add(32 * c));
                    let sy = if KIND == TERN { y } else { _mm256_sign_epi8(y, ch.s) };
                    sumi[col] = _mm256_add_epi32(sumi[col], _mm256_madd_epi16(_mm256_maddubs_epi16(ch.u, sy), ch.sc));
                    if KIND == IQ1M {
                        let p = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, _mm256_sign_epi8(y, ch.dl)), ch.sc);
                        sumi2[col] = _mm256_add_epi32(sumi2[col], p);
                    }
                    if KIND == IQ1S {
                        let bs = q8.add(256 + 4 * c);
                        let pair = std::ptr::read_unaligned(bs as *const i16) as i32
                            + std::ptr::read_unaligned(bs.add(2) as *const i16) as i32;
                        s1[col] += ch.dsc * pair;
                    }
                }
            }
        }
        let dwi = dw(bw);
        if TILED {
            // llama.cpp's tiled order: the block's exact sum (IQ1: 8 x the grid part plus
            // the delta part), times d_w with the grid factor folded in, one FMA with d_a
            let dt = if KIND == IQ1S || KIND == IQ1M { dwi * 0.125 } else { dwi * fin };
            for col in 0..NC {
                let yd = std::ptr::read_unaligned(x.add(col * xs + i * BlockQ8K::SIZE) as *const f32);
                let mut isum = hsum_epi32(sumi[col]);
                match KIND {
                    IQ1S => isum = 8 * isum + s1[col],
                    IQ1M => isum = 8 * isum + hsum_epi32(sumi2[col]),
                    _ => {}
                }
                sumf[col] = (dt * isum as f32).mul_add(yd, sumf[col]);
            }
            continue;
        }
        for col in 0..NC {
            let by = x.add(col * xs + i * BlockQ8K::SIZE);
            let d = dwi * std::ptr::read_unaligned(by as *const f32);
            if KIND == TERN {
                let bsum = _mm256_madd_epi16(load256(by.add(260)), ones16);
                let l = _mm256_sub_epi32(sumi[col], bsum);
                acc[col] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(l), _mm256_set1_ps(d), acc[col]);
            } else {
                acc[col] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi[col]), acc[col]);
            }
            if KIND == IQ1M {
                acc2[col] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi2[col]), acc2[col]);
            }
            if KIND == IQ1S {
                acc1[col] = (s1[col] as f32).mul_add(d, acc1[col]);
            }
        }
    }
    for col in 0..NC {
        *out.add(col) = match KIND {
            _ if TILED => sumf[col],
            IQ1S => hsum_ps(acc[col]) + acc1[col] * 0.125,
            IQ1M => 0.125f32.mul_add(hsum_ps(acc2[col]), hsum_ps(acc[col])),
            _ => fin * hsum_ps(acc[col]),
        };
    }
}

/// IQ1_M's f16 scale (the top nibbles of its 4 scale words), converted by F16C.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn iq1m_d(b: *const u8) -> f32 {
    let sc = |k: usize| rd_u16(b.add(48 + 2 * k));
    let h = (sc(0) >> 12) | ((sc(1) >> 8) & 0x00f0) | ((sc(2) >> 4) & 0x0f00) | (sc(3) & 0xf000);
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h as i32)))
}

/// i32 lanes -> their (exact) sum.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn hsum_epi32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    let s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 1)))
}

macro_rules! iq_kernel {
    ($name:ident, $tiled:expr, $kind:expr, $ts:expr, $fin:expr, $dw:expr, $dec:ident) => {
        #[target_feature(enable = "avx2,fma,f16c")]
        pub(crate) unsafe fn $name<const NC: usize>(n: usize, w: *const u8, x: *const u8, xs: usize, _xd: *const f32, _xds: usize, out: *mut f32) {
            iq_body::<NC, { $kind }, { $tiled }>(n, w, x, xs, out, $ts, $fin, $dw, |b, c| $dec(b, c))
        }
    };
}

// the grid types: llama.cpp's tiled order (its matmuls of 8 or more rows; pyllama's default
// for every row count) and its AVX2 vec_dot order (`_vd`: below 8 rows, under
// PYLLAMA_ORDER=llamacpp)
iq_kernel!(dot_iq2_xxs, true, PLAIN, BlockIQ2XXS::SIZE, 0.125, |b| f16(b), dec_iq2_xxs);
iq_kernel!(dot_iq2_xs, true, PLAIN, BlockIQ2XS::SIZE, 0.125, |b| f16(b), dec_iq2_xs);
iq_kernel!(dot_iq2_s, true, PLAIN, BlockIQ2S::SIZE, 0.125, |b| f16(b), dec_iq2_s);
iq_kernel!(dot_iq3_xxs, true, PLAIN, BlockIQ3XXS::SIZE, 0.25, |b| f16(b), dec_iq3_xxs);
iq_kernel!(dot_iq3_s, true, PLAIN, BlockIQ3S::SIZE, 1.0, |b| f16(b), dec_iq3_s);
iq_kernel!(dot_iq1_s, true, IQ1S, BlockIQ1S::SIZE, 1.0, |b| f16(b), dec_iq1_s);
iq_kernel!(dot_iq1_m, true, IQ1M, BlockIQ1M::SIZE, 1.0, |b| iq1m_d(b), dec_iq1_m);
iq_kernel!(dot_iq2_xxs_vd, false, PLAIN, BlockIQ2XXS::SIZE, 0.125, |b| f16(b), dec_iq2_xxs);
iq_kernel!(dot_iq2_xs_vd, false, PLAIN, BlockIQ2XS::SIZE, 0.125, |b| f16(b), dec_iq2_xs);
iq_kernel!(dot_iq2_s_vd, false, PLAIN, BlockIQ2S::SIZE, 0.125, |b| f16(b), dec_iq2_s);
iq_kernel!(dot_iq3_xxs_vd, false, PLAIN, BlockIQ3XXS::SIZE, 0.25, |b| f16(b), dec_iq3_xxs);
iq_kernel!(dot_iq3_s_vd, false, PLAIN, BlockIQ3S::SIZE, 1.0, |b| f16(b), dec_iq3_s);
iq_kernel!(dot_iq1_s_vd, false, IQ1S, BlockIQ1S::SIZE, 1.0, |b| f16(b), dec_iq1_s);
iq_kernel!(dot_iq1_m_vd, false, IQ1M, BlockIQ1M::SIZE, 1.0, |b| iq1m_d(b), dec_iq1_m);
// the ternary types: llama.cpp has no tiled kernel for them, its vec_dot order throughout
iq_kernel!(dot_tq1_0, false, TERN, BlockTQ1_0::SIZE, 1.0, |b: *const u8| f16(b.add(offset_of!(BlockTQ1_0, d))), dec_tq1_0);
iq_kernel!(dot_tq2_0, false, TERN, BlockTQ2_0::SIZE, 1.0, |b: *const u8| f16(b.add(offset_of!(BlockTQ2_0, d))), dec_tq2_0);

/// MXFP4 x Q8_0 (see the module note for the order).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_mxfp4<const NC: usize>(n: usize, w: *const u8, x: *const u8, xs: usize, _xd: *const f32, _xds: usize, out: *mut f32) {
    let nb = n / 32;
    let values = load128(KVALUES_MXFP4.as_ptr() as *const u8);
    let m4 = _mm_set1_epi8(0xF);
    let ones16 = _mm256_set1_epi16(1);
    let decode = |b: *const u8| -> __m256i {
        let q4 = load128(b.add(1));
        let lo = _mm_shuffle_epi8(values, _mm_and_si128(q4, m4));
        let hi = _mm_shuffle_epi8(values, _mm_and_si128(_mm_srli_epi16(q4, 4), m4));
        _mm256_set_m128i(hi, lo)
    };
    let lanes = |wv: __m256i, yb: *const u8| -> __m256i {
        let y = load256(yb.add(2));
        _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(wv, wv), _mm256_sign_epi8(y, wv)), ones16)
    };
    let mut acc = [[_mm256_setzero_ps(); NC]; 2];
    let mut ib = 0;
    while ib + 1 < nb {
        for h in 0..2 {
            let b = w.add(BlockMXFP4::SIZE * (ib + h));
            let wv = decode(b);
            let e = e8m0_half(*b);
            for col in 0..NC {
                let yb = x.add(col * xs + BlockQ8_0::SIZE * (ib + h));
                let d = f16(yb) * e;
                acc[h][col] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(lanes(wv, yb)), acc[h][col]);
            }
        }
        ib += 2;
    }
    for col in 0..NC {
        let mut sumf = hsum_ps(_mm256_add_ps(acc[0][col], acc[1][col]));
        if ib < nb {
            let b = w.add(BlockMXFP4::SIZE * ib);
            let yb = x.add(col * xs + BlockQ8_0::SIZE * ib);
            let l = lanes(decode(b), yb);
            let s = _mm_add_epi32(_mm256_castsi256_si128(l), _mm256_extracti128_si256(l, 1));
            let s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
            let s = _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 1)));
            sumf = (f16(yb) * e8m0_half(*b)).mul_add(s as f32, sumf);
        }
        *out.add(col) = sumf;
    }
}

iq_dispatch!();

/// `PYLLAMA_ORDER=llamacpp`: the grid types take llama.cpp's vec_dot-order kernels below
/// `SMALL_BATCH` rows (what llama.cpp runs there) and its tiled order from there on, in
/// 4-column tiles with no kernels between 1 and 4 columns.
pub(crate) fn register_llamacpp_order(t: &mut KernelTable) {
    use GgmlType::*;
    macro_rules! by_batch {
        ($($ty:ident: $vd:ident, $tl:ident;)*) => {$(
            t.set_tiled_by_batch($ty, Tiled::pair($vd::<1>, $vd::<TILE>, TILE), Tiled::pair($tl::<1>, $tl::<TILE>, TILE));
        )*};
    }
    by_batch! {
        IQ2_XXS: dot_iq2_xxs_vd, dot_iq2_xxs;
        IQ2_XS: dot_iq2_xs_vd, dot_iq2_xs;
        IQ2_S: dot_iq2_s_vd, dot_iq2_s;
        IQ3_XXS: dot_iq3_xxs_vd, dot_iq3_xxs;
        IQ3_S: dot_iq3_s_vd, dot_iq3_s;
        IQ1_S: dot_iq1_s_vd, dot_iq1_s;
        IQ1_M: dot_iq1_m_vd, dot_iq1_m;
    }
}

/// Q1_0 x Q8_0, ggml's AVX2 vec_dot (`lowbit::vec_dot_q1_0_q8_0_x86` is its scalar twin):
/// the sign bits spread to bytes, the activations negated where a bit is clear.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q1_0(n: usize, x: *const u8, y: *const u8) -> f32 {
    let ones8 = _mm256_set1_epi8(1);
    let ones16 = _mm256_set1_epi16(1);
    let spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3,
                                  3, 3, 3);
    let bit = _mm256_set1_epi64x(0x8040201008040201u64 as i64);
    let zero = _mm256_setzero_si256();
    let mut acc = _mm256_setzero_ps();
    for ib in 0..n / 128 {
        let b = x.add(BlockQ1_0::SIZE * ib);
        let mut blk = _mm256_setzero_ps();
        for k in 0..4 {
            let yb = y.add(BlockQ8_0::SIZE * (4 * ib + k));
            let bits = std::ptr::read_unaligned(b.add(2 + 4 * k) as *const i32);
            let sm = _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32(bits), spread), bit), zero);
            let sy = _mm256_sub_epi8(_mm256_xor_si256(load256(yb.add(2)), sm), sm);
            let s = _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(ones8, sy), ones16));
            let dy = _mm256_set1_ps(f16(yb));
            blk = if k == 0 { _mm256_mul_ps(dy, s) } else { _mm256_fmadd_ps(dy, s, blk) };
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(f16(b)), blk, acc);
    }
    hsum_ps(acc)
}

/// NVFP4 x Q8_0, ggml's AVX2 vec_dot (`lowbit::vec_dot_nvfp4_q8_0_x86` is its scalar twin):
/// per Q8_0 block the two sub-blocks' codes looked up, lanes 0..4 scaled by the first
/// sub-block's scale times d_y, lanes 4..8 by the second's.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_nvfp4(n: usize, x: *const u8, y: *const u8) -> f32 {
    let values = load128(KVALUES_MXFP4.as_ptr() as *const u8);
    let m4 = _mm_set1_epi8(0xF);
    let ones16 = _mm256_set1_epi16(1);
    let mut acc = _mm256_setzero_ps();
    for ib in 0..n / 64 {
        let b = x.add(BlockNVFP4::SIZE * ib);
        for h in 0..2 {
            let q4 = load128(b.add(4 + 16 * h));
            let lo = _mm_shuffle_epi8(values, _mm_and_si128(q4, m4));
            let hi = _mm_shuffle_epi8(values, _mm_and_si128(_mm_srli_epi16(q4, 4), m4));
            let w = _mm256_set_m128i(_mm_unpackhi_epi64(lo, hi), _mm_unpacklo_epi64(lo, hi));
            let yb = y.add(BlockQ8_0::SIZE * (2 * ib + h));
            let q8 = load256(yb.add(2));
            let p = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(q8, w)), ones16);
            let dy = f16(yb);
            let s0 = super::lowbit::ue4m3_to_f32(*b.add(2 * h)) * dy;
            let s1 = super::lowbit::ue4m3_to_f32(*b.add(2 * h + 1)) * dy;
            acc = _mm256_fmadd_ps(_mm256_set_m128(_mm_set1_ps(s1), _mm_set1_ps(s0)), _mm256_cvtepi32_ps(p), acc);
        }
    }
    hsum_ps(acc)
}

macro_rules! safe_lowbit {
    ($($name:ident, $k:ident, $wty:ident;)*) => {$(
        fn $name(n: usize, w: &[u8], x: &[u8]) -> f32 {
            let wb = GgmlType::$wty.row_size(n).expect("row length is a multiple of the block size");
            let xb = GgmlType::Q8_0.row_size(n).expect("row length is a multiple of the block size");
            assert!(w.len() >= wb && x.len() >= xb, "vec_dot: short row");
            // SAFETY: lengths checked above; the caller (kernel_set) checked the CPU.
            unsafe { $k(n, w.as_ptr(), x.as_ptr()) }
        }
    )*};
}

safe_lowbit! {
    one_q1_0, dot_q1_0, Q1_0;
    one_nvfp4, dot_nvfp4, NVFP4;
}

/// The safe single rows of Q1_0 / NVFP4 in table `t` (Q2_0 has no x86 kernel in ggml: the
/// table keeps its scalar loop, `lowbit::vec_dot_q2_0_q8_0_x86`).
pub(crate) fn register_lowbit(t: &mut KernelTable) {
    t.set_vec_dot(GgmlType::Q1_0, one_q1_0);
    t.set_vec_dot(GgmlType::NVFP4, one_nvfp4);
}
