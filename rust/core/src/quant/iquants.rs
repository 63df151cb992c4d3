//! The grid ("i-quant") and ternary weight formats: IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S,
//! IQ1_S, IQ1_M, TQ1_0, TQ2_0 (256-element blocks against Q8_K activations) and MXFP4
//! (32-element blocks against Q8_0).
//!
//! Byte layouts (ggml-common.h), d f16 unless noted:
//!   IQ2_XXS 66 B: d, qs u16[32]: per 32 elements two u32, the first 4 grid indices
//!                 (iq2xxs_grid, 8 magnitudes each), the second 4 x 7 sign bits + 4-bit scale
//!   IQ2_XS  74 B: d, qs u16[32] (9-bit iq2xs_grid index + 7 sign bits), scales[8] (2 x 4 bit)
//!   IQ2_S   82 B: d, qs[64] (32 low index bytes, then 32 sign bytes), qh[8] (2 index bits
//!                 per group of 8), scales[8]
//!   IQ3_XXS 98 B: d, qs[96] (64 iq3xxs_grid indices of 4 magnitudes, then per 32 elements
//!                 a u32 of 4 x 7 sign bits + 4-bit scale)
//!   IQ3_S  110 B: d, qs[64], qh[8] (9th index bit), signs[32], scales[4] (2 x 4 bit)
//!   IQ1_S   50 B: d, qs[32] (low 8 index bits), qh u16[8] (3 x 3 index bits, 3-bit scale,
//!                 delta sign)
//!   IQ1_M   56 B: qs[32], qh[16] (3 index bits + delta sign per group of 8), scales[8]
//!                 (16 x 3-bit scales; the f16 d in the top nibbles of the 4 u16)
//!   TQ1_0   54 B: qs[48], qh[4] (5 resp. 4 base-3 digits per byte), d
//!   TQ2_0   66 B: qs[64] (2-bit digits), d
//!   MXFP4   17 B: e (E8M0 scale), qs[16] (4-bit E2M1 codes, low nibbles first)
//!
//! Every dot product here is an exact integer sum per block scaled in f32. `_ref` kernels
//! sum the blocks in ggml's generic order (ggml-cpu/quants.c). The `_x86` twins are what
//! pyllama's x86 kernels (`avx2_iq.rs`) compute bit for bit, and what aarch64 runs (so its
//! logits are those of x86): for the grid types llama.cpp's tiled-matmul order
//! (`vec_dot_k_tiled`), for TQ1_0 / TQ2_0 / MXFP4 the order of ggml's AVX2 vec_dot
//! (ggml-cpu/arch/x86/quants.c, FMAs where GCC contracts them; `vec_dot_k_x86`,
//! `vec_dot_mxfp4_q8_0_x86`): per super-block 8 exact i32 lanes, lane k holding the
//! products at positions 4k..4k+4 of every 32-element chunk, FMA'd with the block scale
//! into 8 f32 lanes; the horizontal sum ((v4+v0)+(v6+v2))+((v5+v1)+(v7+v3)).

use super::blocks::{as_blocks, block, f16, Block, BlockIQ1M, BlockIQ1S, BlockIQ2S, BlockIQ2XS, BlockIQ2XXS, BlockIQ3S, BlockIQ3XXS, BlockMXFP4, BlockQ8K, BlockQ8_0, BlockTQ1_0, BlockTQ2_0};
use super::fp::{f16_to_f32, rd_f16};
use super::iq_grids::*;

pub(crate) const QK_K: usize = 256;

/// ggml's kmask_iq2xs: bit j of a sign byte belongs to element j of a group of 8.
#[inline(always)]
fn neg(signs: u8, j: usize) -> bool {
    signs & (1 << j) != 0
}

#[inline(always)]
fn u16_at(b: &[u8], o: usize) -> u16 {
    u16::from_le_bytes([b[o], b[o + 1]])
}

#[inline(always)]
fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]])
}

#[inline(always)]
fn grid8(g: u64, j: usize) -> u8 {
    (g >> (8 * j)) as u8
}

#[inline(always)]
fn grid4(g: u32, j: usize) -> u8 {
    (g >> (8 * j)) as u8
}

/// IQ1_M's f16 super-block scale, spread over the top nibbles of its 4 scale words.
#[inline(always)]
pub(crate) fn iq1m_d(b: &[u8]) -> f32 {
    let scales = &block::<BlockIQ1M>(b).scales;
    let sc = |k: usize| u16_at(scales, 2 * k);
    f16_to_f32((sc(0) >> 12) | ((sc(1) >> 8) & 0x00f0) | ((sc(2) >> 4) & 0x0f00) | (sc(3) & 0xf000))
}

/// ggml_e8m0_to_fp32_half: 2^(e - 128) (denormal for e < 2).
#[inline(always)]
pub(crate) fn e8m0_half(e: u8) -> f32 {
    f32::from_bits(if e < 2 { 0x0020_0000u32 << e } else { ((e as u32) - 1) << 23 })
}

/// kvalues_mxfp4: twice the E2M1 values.
pub(crate) const KVALUES_MXFP4: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// 8 bytes of +1 / -1 (0x01 / 0xFF) from the 8 bits of `s` (set bit: -1).
const fn sign_bytes(s: u8) -> u64 {
    let mut v = 0u64;
    let mut j = 0;
    while j < 8 {
        let b: u64 = if s & (1 << j) != 0 { 0xFF } else { 0x01 };
        v |= b << (8 * j);
        j += 1;
    }
    v
}

/// Sign bytes of every sign byte (IQ2_S, IQ3_S store 8 sign bits per group).
#[cfg_attr(not(target_arch = "aarch64"), allow(dead_code))] // the NEON grid kernels
pub(crate) static SIGNS8: [u64; 256] = {
    let mut t = [0u64; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = sign_bytes(i as u8);
        i += 1;
    }
    t
};

/// Sign bytes of the 7-bit sign codes (ggml's ksigns_iq2xs: the 8th bit makes the count
/// of minus signs even), as ggml's keven_signs_q2xs.
pub(crate) static SIGNS7: [u64; 128] = {
    let mut t = [0u64; 128];
    let mut i = 0;
    while i < 128 {
        t[i] = sign_bytes(i as u8 | (((i as u32).count_ones() as u8 & 1) << 7));
        i += 1;
    }
    t
};

// ---------------------------------------------------------------- integer view of a block

/// One 256-element block as integers: `q[p]` is what ggml's integer sums multiply the
/// activation at p with (the grid value with its sign times the sub-block's odd integer
/// scale; TQ: the base-3 digit 0..2, whose -1 offset comes from the activation sums);
/// `dq[p]` the IQ1 delta term's factor (the scale times the delta's sign).
pub struct BlockInts {
    pub q: [i32; QK_K],
    pub dq: [i32; QK_K],
}

/// The ints of block `b` of weight type `ty` (one of this module's 256-element types).
pub(crate) fn block_ints(ty: crate::ggml_type::GgmlType, b: &[u8]) -> BlockInts {
    use crate::ggml_type::GgmlType::*;
    let mut o = BlockInts { q: [0; QK_K], dq: [0; QK_K] };
    let q = &mut o.q;
    match ty {
        IQ2_XXS => {
            let blk = block::<BlockIQ2XXS>(b);
            for ib in 0..8 {
                let a0 = u32_at(&blk.qs, 8 * ib);
                let a1 = u32_at(&blk.qs, 4 + 8 * ib);
                let ls = 2 * (a1 >> 28) as i32 + 1;
                for l in 0..4 {
                    let g = IQ2XXS_GRID[((a0 >> (8 * l)) & 255) as usize];
                    let s = KSIGNS_IQ2XS[((a1 >> (7 * l)) & 127) as usize];
                    for j in 0..8 {
                        let v = grid8(g, j) as i32 * ls;
                        q[32 * ib + 8 * l + j] = if neg(s, j) { -v } else { v };
                    }
                }
            }
        }
        IQ2_XS => {
            let blk = block::<BlockIQ2XS>(b);
            for ib in 0..8 {
                let sc = blk.scales[ib];
                for l in 0..4 {
                    let ls = 2 * (if l < 2 { sc & 0xf } else { sc >> 4 }) as i32 + 1;
                    let v16 = u16_at(&blk.qs, 8 * ib + 2 * l);
                    let g = IQ2XS_GRID[(v16 & 511) as usize];
                    let s = KSIGNS_IQ2XS[(v16 >> 9) as usize];
                    for j in 0..8 {
                        let v = grid8(g, j) as i32 * ls;
                        q[32 * ib + 8 * l + j] = if neg(s, j) { -v } else { v };
                    }
                }
            }
        }
        IQ2_S => {
            let blk = block::<BlockIQ2S>(b);
            for ib in 0..8 {
                let sc = blk.scales[ib];
                let qh = blk.qh[ib] as usize;
                for l in 0..4 {
                    let ls = 2 * (if l < 2 { sc & 0xf } else { sc >> 4 }) as i32 + 1;
                    let g = IQ2S_GRID[blk.qs[4 * ib + l] as usize | ((qh << (8 - 2 * l)) & 0x300)];
                    let s = blk.qs[32 + 4 * ib + l];
                    for j in 0..8 {
                        let v = grid8(g, j) as i32 * ls;
                        q[32 * ib + 8 * l + j] = if neg(s, j) { -v } else { v };
                    }
                }
            }
        }
        IQ3_XXS => {
            let blk = block::<BlockIQ3XXS>(b);
            for ib in 0..8 {
                let a = u32_at(&blk.qs, 64 + 4 * ib);
                let ls = 2 * (a >> 28) as i32 + 1;
                for l in 0..4 {
                    let s = KSIGNS_IQ2XS[((a >> (7 * l)) & 127) as usize];
                    let g1 = IQ3XXS_GRID[blk.qs[8 * ib + 2 * l] as usize];
                    let g2 = IQ3XXS_GRID[blk.qs[8 * ib + 2 * l + 1] as usize];
                    for j in 0..8 {
                        let v = if j < 4 { grid4(g1, j) } else { grid4(g2, j - 4) } as i32 * ls;
                        q[32 * ib + 8 * l + j] = if neg(s, j) { -v } else { v };
                    }
                }
            }
        }
        IQ3_S => {
            let blk = block::<BlockIQ3S>(b);
            for ib in 0..8 {
                let ls = 2 * ((blk.scales[ib / 2] >> (4 * (ib % 2))) & 0xf) as i32 + 1;
                let qh = blk.qh[ib] as usize;
                for l in 0..4 {
                    let g1 = IQ3S_GRID[blk.qs[8 * ib + 2 * l] as usize | ((qh << (8 - 2 * l)) & 256)];
                    let g2 = IQ3S_GRID[blk.qs[8 * ib + 2 * l + 1] as usize | ((qh << (7 - 2 * l)) & 256)];
                    let s = blk.signs[4 * ib + l];
                    for j in 0..8 {
                        let v = if j < 4 { grid4(g1, j) } else { grid4(g2, j - 4) } as i32 * ls;
                        q[32 * ib + 8 * l + j] = if neg(s, j) { -v } else { v };
                    }
                }
            }
        }
        IQ1_S => {
            let blk = block::<BlockIQ1S>(b);
            for ib in 0..8 {
                let qh = u16_at(&blk.qh, 2 * ib) as usize;
                let ls = 2 * ((qh >> 12) & 7) as i32 + 1;
                let delta = if qh & 0x8000 != 0 { -1 } else { 1 };
                for l in 0..4 {
                    let g = IQ1S_GRID[blk.qs[4 * ib + l] as usize | (((qh >> (3 * l)) & 7) << 8)];
                    for j in 0..8 {
                        q[32 * ib + 8 * l + j] = grid8(g, j) as i8 as i32 * ls;
                        o.dq[32 * ib + 8 * l + j] = delta * ls;
                    }
                }
            }
        }
        IQ1_M => {
            let blk = block::<BlockIQ1M>(b);
            for ib in 0..8 {
                let sc = u16_at(&blk.scales, 2 * (ib / 2));
                let (qh0, qh1) = (blk.qh[2 * ib] as usize, blk.qh[2 * ib + 1] as usize);
                let idx = [qh0 << 8, qh0 << 4, qh1 << 8, qh1 << 4];
                let dbit = [qh0 & 0x08, qh0 & 0x80, qh1 & 0x08, qh1 & 0x80];
                for l in 0..4 {
                    let ls = 2 * ((sc >> (6 * (ib % 2) + 3 * (l / 2))) & 7) as i32 + 1;
                    let g = IQ1S_GRID[blk.qs[4 * ib + l] as usize | (idx[l] & 0x700)];
                    for j in 0..8 {
                        q[32 * ib + 8 * l + j] = grid8(g, j) as i8 as i32 * ls;
                        o.dq[32 * ib + 8 * l + j] = if dbit[l] != 0 { -ls } else { ls };
                    }
                }
            }
        }
        TQ1_0 => {
            let blk = block::<BlockTQ1_0>(b);
            const POW3: [u8; 6] = [1, 3, 9, 27, 81, 243];
            let digit = |byte: u8, n: usize| ((byte.wrapping_mul(POW3[n]) as u16 * 3) >> 8) as i32;
            for n in 0..5 {
                for m in 0..32 {
                    q[32 * n + m] = digit(blk.qs[m], n);
                }
                for m in 0..16 {
                    q[160 + 16 * n + m] = digit(blk.qs[32 + m], n);
                }
            }
            for n in 0..4 {
                for j in 0..4 {
                    q[240 + 4 * n + j] = digit(blk.qh[j], n);
                }
            }
        }
        TQ2_0 => {
            let blk = block::<BlockTQ2_0>(b);
            for p in 0..QK_K {
                let (j, l, k) = (p / 128, (p % 128) / 32, p % 32);
                q[p] = ((blk.qs[32 * j + k] >> (2 * l)) & 3) as i32;
            }
        }
        _ => panic!("block_ints: {ty} is not a grid or ternary type"),
    }
    o
}

// ---------------------------------------------------------------- dequantize

pub(crate) fn dequantize_iq2_xxs(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(BlockIQ2XXS::SIZE).zip(dst.chunks_exact_mut(QK_K)) {
        let blk = block::<BlockIQ2XXS>(b);
        let d = f16(blk.d);
        for ib in 0..8 {
            let a0 = u32_at(&blk.qs, 8 * ib);
            let a1 = u32_at(&blk.qs, 4 + 8 * ib);
            let db = d * (0.5 + (a1 >> 28) as f32) * 0.25;
            for l in 0..4 {
                let g = IQ2XXS_GRID[((a0 >> (8 * l)) & 255) as usize];
                let s = KSIGNS_IQ2XS[((a1 >> (7 * l)) & 127) as usize];
                for j in 0..8 {
                    y[32 * ib + 8 * l + j] = db * grid8(g, j) as f32 * if neg(s, j) { -1.0 } else { 1.0 };
                }
            }
        }
    }
}

pub(crate) fn dequantize_iq2_xs(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(BlockIQ2XS::SIZE).zip(dst.chunks_exact_mut(QK_K)) {
        let blk = block::<BlockIQ2XS>(b);
        let d = f16(blk.d);
        for ib in 0..8 {
            let sc = blk.scales[ib];
            let db = [d * (0.5 + (sc & 0xf) as f32) * 0.25, d * (0.5 + (sc >> 4) as f32) * 0.25];
            for l in 0..4 {
                let v16 = u16_at(&blk.qs, 8 * ib + 2 * l);
                let g = IQ2XS_GRID[(v16 & 511) as usize];
                let s = KSIGNS_IQ2XS[(v16 >> 9) as usize];
                for j in 0..8 {
                    y[32 * ib + 8 * l + j] = db[l / 2] * grid8(g, j) as f32 * if neg(s, j) { -1.0 } else { 1.0 };
                }
            }
        }
    }
}

pub(crate) fn dequantize_iq2_s(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(BlockIQ2S::SIZE).zip(dst.chunks_exact_mut(QK_K)) {
        let blk = block::<BlockIQ2S>(b);
        let d = f16(blk.d);
        for ib in 0..8 {
            let sc = blk.scales[ib];
            let db = [d * (0.5 + (sc & 0xf) as f32) * 0.25, d * (0.5 + (sc >> 4) as f32) * 0.25];
            let qh = blk.qh[ib] as usize;
            for l in 0..4 {
                let g = IQ2S_GRID[blk.qs[4 * ib + l] as usize | ((qh << (8 - 2 * l)) & 0x300)];
                let s = blk.qs[32 + 4 * ib + l];
                for j in 0..8 {
                    y[32 * ib + 8 * l + j] = db[l / 2] * grid8(g, j) as f32 * if neg(s, j) { -1.0 } else { 1.0 };
                }
            }
        }
    }
}

pub(crate) fn dequantize_iq3_xxs(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(BlockIQ3XXS::SIZE).zip(dst.chunks_exact_mut(QK_K)) {
        let blk = block::<BlockIQ3XXS>(b);
        let d = f16(blk.d);
        for ib in 0..8 {
            let a = u32_at(&blk.qs, 64 + 4 * ib);
            let db = d * (0.5 + (a >> 28) as f32) * 0.5;
            for l in 0..4 {
                let s = KSIGNS_IQ2XS[((a >> (7 * l)) & 127) as usize];
                let g1 = IQ3XXS_GRID[blk.qs[8 * ib + 2 * l] as usize];
                let g2 = IQ3XXS_GRID[blk.qs[8 * ib + 2 * l + 1] as usize];
                for j in 0..4 {
                    y[32 * ib + 8 * l + j] = db * grid4(g1, j) as f32 * if neg(s, j) { -1.0 } else { 1.0 };
                    y[32 * ib + 8 * l + j + 4] = db * grid4(g2, j) as f32 * if neg(s, j + 4) { -1.0 } else { 1.0 };
                }
            }
        }
    }
}

pub(crate) fn dequantize_iq3_s(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(BlockIQ3S::SIZE).zip(dst.chunks_exact_mut(QK_K)) {
        let blk = block::<BlockIQ3S>(b);
        let d = f16(blk.d);
        for ib in 0..8 {
            let db = d * (1 + 2 * ((blk.scales[ib / 2] >> (4 * (ib % 2))) & 0xf) as i32) as f32;
            let qh = blk.qh[ib] as usize;
            for l in 0..4 {
                let g1 = IQ3S_GRID[blk.qs[8 * ib + 2 * l] as usize | ((qh << (8 - 2 * l)) & 256)];
                let g2 = IQ3S_GRID[blk.qs[8 * ib + 2 * l + 1] as usize | ((qh << (7 - 2 * l)) & 256)];
                let s = blk.signs[4 * ib + l];
                for j in 0..4 {
                    y[32 * ib + 8 * l + j] = db * grid4(g1, j) as f32 * if neg(s, j) { -1.0 } else { 1.0 };
                    y[32 * ib + 8 * l + j + 4] = db * grid4(g2, j) as f32 * if neg(s, j + 4) { -1.0 } else { 1.0 };
                }
            }
        }
    }
}

const IQ1_DELTA: f32 = 0.125;

pub(crate) fn dequantize_iq1_s(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(BlockIQ1S::SIZE).zip(dst.chunks_exact_mut(QK_K)) {
        let blk = block::<BlockIQ1S>(b);
        let d = f16(blk.d);
        for ib in 0..8 {
            let qh = u16_at(&blk.qh, 2 * ib) as usize;
            let dl = d * (2 * ((qh >> 12) & 7) + 1) as f32;
            let delta = if qh & 0x8000 != 0 { -IQ1_DELTA } else { IQ1_DELTA };
            for l in 0..4 {
                let g = IQ1S_GRID[blk.qs[4 * ib + l] as usize | (((qh >> (3 * l)) & 7) << 8)];
                for j in 0..8 {
                    y[32 * ib + 8 * l + j] = dl * (grid8(g, j) as i8 as f32 + delta);
                }
            }
        }
    }
}

pub(crate) fn dequantize_iq1_m(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(BlockIQ1M::SIZE).zip(dst.chunks_exact_mut(QK_K)) {
        let blk = block::<BlockIQ1M>(b);
        let d = iq1m_d(b);
        for ib in 0..8 {
            let sc = u16_at(&blk.scales, 2 * (ib / 2));
            let dl = [
                d * (2 * ((sc >> (6 * (ib % 2))) & 7) + 1) as f32,
                d * (2 * ((sc >> (6 * (ib % 2) + 3)) & 7) + 1) as f32,
            ];
            let (qh0, qh1) = (blk.qh[2 * ib] as usize, blk.qh[2 * ib + 1] as usize);
            let idx = [qh0 << 8, qh0 << 4, qh1 << 8, qh1 << 4];
            let dbit = [qh0 & 0x08, qh0 & 0x80, qh1 & 0x08, qh1 & 0x80];
            for l in 0..4 {
                let g = IQ1S_GRID[blk.qs[4 * ib + l] as usize | (idx[l] & 0x700)];
                let delta = if dbit[l] != 0 { -IQ1_DELTA } else { IQ1_DELTA };
                for j in 0..8 {
                    y[32 * ib + 8 * l + j] = dl[l / 2] * (grid8(g, j) as i8 as f32 + delta);
                }
            }
        }
    }
}

pub(crate) fn dequantize_tq1_0(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(BlockTQ1_0::SIZE).zip(dst.chunks_exact_mut(QK_K)) {
        let d = f16(block::<BlockTQ1_0>(b).d);
        let ints = block_ints(crate::ggml_type::GgmlType::TQ1_0, b);
        for (v, t) in y.iter_mut().zip(ints.q) {
            *v = (t - 1) as f32 * d;
        }
    }
}

pub(crate) fn dequantize_tq2_0(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(BlockTQ2_0::SIZE).zip(dst.chunks_exact_mut(QK_K)) {
        let d = f16(block::<BlockTQ2_0>(b).d);
        let ints = block_ints(crate::ggml_type::GgmlType::TQ2_0, b);
        for (v, t) in y.iter_mut().zip(ints.q) {
            *v = (t - 1) as f32 * d;
        }
    }
}

pub(crate) fn dequantize_mxfp4(src: &[u8], dst: &mut [f32]) {
    for (b, y) in as_blocks::<BlockMXFP4>(src).iter().zip(dst.chunks_exact_mut(32)) {
        let d = e8m0_half(b.e);
        for j in 0..16 {
            y[j] = KVALUES_MXFP4[(b.qs[j] & 0xf) as usize] as f32 * d;
            y[j + 16] = KVALUES_MXFP4[(b.qs[j] >> 4) as usize] as f32 * d;
        }
    }
}

// ---------------------------------------------------------------- vec_dot

/// Q8_K pieces: (d, qs as i32, bsums).
#[inline(always)]
fn q8k(by: &[u8]) -> (f32, [i32; QK_K], [i32; 16]) {
    let by = block::<BlockQ8K>(by);
    let mut q = [0i32; QK_K];
    for (v, &c) in q.iter_mut().zip(&by.qs) {
        *v = c as i32;
    }
    let mut bs = [0i32; 16];
    for (j, s) in bs.iter_mut().enumerate() {
        *s = i16::from_le_bytes([by.bsums[2 * j], by.bsums[2 * j + 1]]) as i32;
    }
    (by.d(), q, bs)
}

/// The weight's f16 scale of a 256-element block of `ty` (IQ1_M: the assembled one).
#[inline(always)]
fn block_d(ty: crate::ggml_type::GgmlType, b: &[u8]) -> f32 {
    use crate::ggml_type::GgmlType::*;
    match ty {
        IQ1_M => iq1m_d(b),
        TQ1_0 => f16(block::<BlockTQ1_0>(b).d),
        TQ2_0 => f16(block::<BlockTQ2_0>(b).d),
        _ => rd_f16(b, 0),
    }
}

/// The factor ggml applies after its sum (the grids store 2x / 4x / 8x the values).
fn final_scale(ty: crate::ggml_type::GgmlType) -> f32 {
    use crate::ggml_type::GgmlType::*;
    match ty {
        IQ2_XXS | IQ2_XS | IQ2_S => 0.125,
        IQ3_XXS => 0.25,
        _ => 1.0,
    }
}

/// ggml's generic vec_dot (ggml-cpu/quants.c) for the 256-element types of this module:
/// per super-block the exact integer sum(s), then one f32 step per block in order.
pub(crate) fn vec_dot_k_ref(ty: crate::ggml_type::GgmlType, n: usize, x: &[u8], y: &[u8]) -> f32 {
    use crate::ggml_type::GgmlType::*;
    let ts = ty.type_size();
    let mut sumf = 0f32;
    for (bx, by) in x.chunks_exact(ts).zip(y.chunks_exact(BlockQ8K::SIZE)).take(n / QK_K) {
        let (yd, q8, bsums) = q8k(by);
        let w = block_ints(ty, bx);
        let isum: i32 = (0..QK_K).map(|p| w.q[p] * q8[p]).sum();
        let dx = block_d(ty, bx);
        match ty {
            IQ1_S => {
                let s1: i32 = (0..8).map(|ib| w.dq[32 * ib] * (bsums[2 * ib] + bsums[2 * ib + 1])).sum();
                sumf += dx * yd * (isum as f32 + IQ1_DELTA * s1 as f32);
            }
            IQ1_M => {
                let s2: i32 = (0..QK_K).map(|p| w.dq[p] * q8[p]).sum();
                sumf += dx * yd * (isum as f32 + IQ1_DELTA * s2 as f32);
            }
            TQ1_0 | TQ2_0 => {
                let s: i32 = isum - bsums.iter().sum::<i32>();
                sumf += s as f32 * (dx * yd);
            }
            _ => sumf += (dx * yd) * isum as f32,
        }
    }
    final_scale(ty) * sumf
}

/// The horizontal sum of 8 f32 lanes in ggml's `hsum_float_8` order.
#[inline(always)]
pub(crate) fn hsum8(v: [f32; 8]) -> f32 {
    ((v[4] + v[0]) + (v[6] + v[2])) + ((v[5] + v[1]) + (v[7] + v[3]))
}

/// The same dot product in the order of ggml's AVX2 vec_dot kernels (see the module note):
/// TQ1_0 / TQ2_0 everywhere, the grid types below 8 rows under PYLLAMA_ORDER=llamacpp.
pub(crate) fn vec_dot_k_x86(ty: crate::ggml_type::GgmlType, n: usize, x: &[u8], y: &[u8]) -> f32 {
    use crate::ggml_type::GgmlType::*;
    let ts = ty.type_size();
    let mut acc = [0f32; 8];
    let mut acc2 = [0f32; 8];
    let mut acc1 = 0f32;
    for (bx, by) in x.chunks_exact(ts).zip(y.chunks_exact(BlockQ8K::SIZE)).take(n / QK_K) {
        let (yd, q8, bsums) = q8k(by);
        let w = block_ints(ty, bx);
        let mut lanes = [0i32; 8];
        let mut lanes2 = [0i32; 8];
        for p in 0..QK_K {
            lanes[(p % 32) / 4] += w.q[p] * q8[p];
            lanes2[(p % 32) / 4] += w.dq[p] * q8[p];
        }
        let d = block_d(ty, bx) * yd;
        match ty {
            TQ1_0 | TQ2_0 => {
                for k in 0..8 {
                    let l = lanes[k] - (bsums[2 * k] + bsums[2 * k + 1]);
                    acc[k] = (l as f32).mul_add(d, acc[k]);
                }
            }
            _ => {
                for k in 0..8 {
                    acc[k] = d.mul_add(lanes[k] as f32, acc[k]);
                    acc2[k] = d.mul_add(lanes2[k] as f32, acc2[k]);
                }
            }
        }
        if ty == IQ1_S {
            let s1: i32 = (0..8).map(|ib| w.dq[32 * ib] * (bsums[2 * ib] + bsums[2 * ib + 1])).sum();
            acc1 = (s1 as f32).mul_add(d, acc1);
        }
    }
    match ty {
        IQ1_S => hsum8(acc) + acc1 * IQ1_DELTA,
        IQ1_M => IQ1_DELTA.mul_add(hsum8(acc2), hsum8(acc)),
        _ => final_scale(ty) * hsum8(acc),
    }
}

/// llama.cpp's tiled-matmul order (ggml-cpu/tiled, for 8 or more activation rows) of the
/// grid types, which pyllama's SIMD kernels use for every row count: per block the exact
/// integer sum (IQ1_S / IQ1_M: 8 x the grid part plus the delta part), times d_w with the
/// grid factor folded in (d/8 for IQ2_*, IQ1_*; d/4 for IQ3_XXS; d for IQ3_S), one FMA with
/// d_a, blocks in order. TQ1_0 / TQ2_0 (never tiled): `vec_dot_k_x86`.
pub(crate) fn vec_dot_k_tiled(ty: crate::ggml_type::GgmlType, n: usize, x: &[u8], y: &[u8]) -> f32 {
    use crate::ggml_type::GgmlType::*;
    if matches!(ty, TQ1_0 | TQ2_0) {
        return vec_dot_k_x86(ty, n, x, y);
    }
    let ts = ty.type_size();
    let mut sumf = 0f32;
    for (bx, by) in x.chunks_exact(ts).zip(y.chunks_exact(BlockQ8K::SIZE)).take(n / QK_K) {
        let (yd, q8, bsums) = q8k(by);
        let w = block_ints(ty, bx);
        let mut isum: i32 = (0..QK_K).map(|p| w.q[p] * q8[p]).sum();
        let dt = match ty {
            IQ1_S => {
                isum = 8 * isum + (0..8).map(|ib| w.dq[32 * ib] * (bsums[2 * ib] + bsums[2 * ib + 1])).sum::<i32>();
                block_d(ty, bx) * 0.125
            }
            IQ1_M => {
                isum = 8 * isum + (0..QK_K).map(|p| w.dq[p] * q8[p]).sum::<i32>();
                block_d(ty, bx) * 0.125
            }
            _ => block_d(ty, bx) * final_scale(ty),
        };
        sumf = (dt * isum as f32).mul_add(yd, sumf);
    }
    sumf
}

macro_rules! k_dots {
    ($($ref_name:ident, $x86_name:ident, $ty:ident;)*) => {$(
        pub(crate) fn $ref_name(n: usize, x: &[u8], y: &[u8]) -> f32 {
            vec_dot_k_ref(crate::ggml_type::GgmlType::$ty, n, x, y)
        }
        /// pyllama's x86 order (see `vec_dot_k_tiled`)
        pub(crate) fn $x86_name(n: usize, x: &[u8], y: &[u8]) -> f32 {
            vec_dot_k_tiled(crate::ggml_type::GgmlType::$ty, n, x, y)
        }
    )*};
}

k_dots! {
    vec_dot_iq2_xxs_q8_k_ref, vec_dot_iq2_xxs_q8_k_x86, IQ2_XXS;
    vec_dot_iq2_xs_q8_k_ref, vec_dot_iq2_xs_q8_k_x86, IQ2_XS;
    vec_dot_iq2_s_q8_k_ref, vec_dot_iq2_s_q8_k_x86, IQ2_S;
    vec_dot_iq3_xxs_q8_k_ref, vec_dot_iq3_xxs_q8_k_x86, IQ3_XXS;
    vec_dot_iq3_s_q8_k_ref, vec_dot_iq3_s_q8_k_x86, IQ3_S;
    vec_dot_iq1_s_q8_k_ref, vec_dot_iq1_s_q8_k_x86, IQ1_S;
    vec_dot_iq1_m_q8_k_ref, vec_dot_iq1_m_q8_k_x86, IQ1_M;
    vec_dot_tq1_0_q8_k_ref, vec_dot_tq1_0_q8_k_x86, TQ1_0;
    vec_dot_tq2_0_q8_k_ref, vec_dot_tq2_0_q8_k_x86, TQ2_0;
}

/// MXFP4 x Q8_0, ggml's generic order: per block d = d_y * e8m0_half(e), sumf += d * sumi.
pub(crate) fn vec_dot_mxfp4_q8_0_ref(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let mut sumf = 0f32;
    for (bx, by) in as_blocks::<BlockMXFP4>(x).iter().zip(as_blocks::<BlockQ8_0>(y)).take(n / 32) {
        let d = f16(by.d) * e8m0_half(bx.e);
        let sumi: i32 = (0..32).map(|p| mxfp4_at(bx, p) * by.qs[p] as i32).sum();
        sumf += d * sumi as f32;
    }
    sumf
}

#[inline(always)]
fn mxfp4_at(bx: &BlockMXFP4, p: usize) -> i32 {
    let q = bx.qs[p % 16];
    KVALUES_MXFP4[if p < 16 { q & 0xf } else { q >> 4 } as usize] as i32
}

/// MXFP4 x Q8_0 in ggml's AVX2 order: blocks in pairs, even blocks into one 8-lane FMA
/// accumulator and odd ones into another (lane k: the products at 4k..4k+4), the
/// horizontal sum of their sum, then an odd last block by one scalar FMA.
pub(crate) fn vec_dot_mxfp4_q8_0_x86(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let nb = n / 32;
    let mut acc = [[0f32; 8]; 2];
    let lanes = |ib: usize| -> (f32, [i32; 8]) {
        let (bx, by) = (&as_blocks::<BlockMXFP4>(x)[ib], &as_blocks::<BlockQ8_0>(y)[ib]);
        let mut l = [0i32; 8];
        for p in 0..32 {
            l[p / 4] += mxfp4_at(bx, p) * by.qs[p] as i32;
        }
        (f16(by.d) * e8m0_half(bx.e), l)
    };
    let mut ib = 0;
    while ib + 1 < nb {
        for h in 0..2 {
            let (d, l) = lanes(ib + h);
            for k in 0..8 {
                acc[h][k] = d.mul_add(l[k] as f32, acc[h][k]);
            }
        }
        ib += 2;
    }
    let mut sumf = hsum8(std::array::from_fn(|k| acc[0][k] + acc[1][k]));
    if ib < nb {
        let (d, l) = lanes(ib);
        sumf = d.mul_add(l.iter().sum::<i32>() as f32, sumf);
    }
    sumf
}

/// One 32-element chunk `c` (0..8) of a 256-element block of a grid / ternary type, as the
/// SIMD kernels without x86's byte shuffles (NEON) take it: `mag` the 32 magnitudes (IQ1:
/// the signed grid bytes; TQ: the digits 0..2), `sgn` their signs as +1 / -1 bytes, `sc`
/// the odd integer scales of elements 0..16 and 16..32, `dl` IQ1_M's delta signs (+1 / -1
/// bytes), `dsc` IQ1_S's scale times delta sign.
pub struct ChunkParts {
    pub mag: [u64; 4],
    pub sgn: [u64; 4],
    pub sc: [i32; 2],
    pub dl: [u64; 4],
    pub dsc: i32,
}

#[cfg_attr(not(target_arch = "aarch64"), allow(dead_code))] // the NEON grid kernels
const ONES: u64 = 0x0101_0101_0101_0101;

/// `ChunkParts` of chunk `c` of block `b` of `ty`.
#[inline(always)]
#[cfg_attr(not(target_arch = "aarch64"), allow(dead_code))] // the NEON grid kernels
pub(crate) fn chunk_parts(ty: crate::ggml_type::GgmlType, b: &[u8], c: usize) -> ChunkParts {
    use crate::ggml_type::GgmlType::*;
    let mut o = ChunkParts { mag: [0; 4], sgn: [ONES; 4], sc: [1; 2], dl: [ONES; 4], dsc: 0 };
    match ty {
        IQ2_XXS => {
            let blk = block::<BlockIQ2XXS>(b);
            let a0 = u32_at(&blk.qs, 8 * c);
            let a1 = u32_at(&blk.qs, 4 + 8 * c);
            for l in 0..4 {
                o.mag[l] = IQ2XXS_GRID[((a0 >> (8 * l)) & 255) as usize];
                o.sgn[l] = SIGNS7[((a1 >> (7 * l)) & 127) as usize];
            }
            o.sc = [2 * (a1 >> 28) as i32 + 1; 2];
        }
        IQ2_XS => {
            let blk = block::<BlockIQ2XS>(b);
            for l in 0..4 {
                let v = u16_at(&blk.qs, 8 * c + 2 * l) as usize;
                o.mag[l] = IQ2XS_GRID[v & 511];
                o.sgn[l] = SIGNS7[v >> 9];
            }
            let sc = blk.scales[c] as i32;
            o.sc = [2 * (sc & 0xf) + 1, 2 * (sc >> 4) + 1];
        }
        IQ2_S => {
            let blk = block::<BlockIQ2S>(b);
            let qh = blk.qh[c] as usize;
            for l in 0..4 {
                o.mag[l] = IQ2S_GRID[blk.qs[4 * c + l] as usize | ((qh << (8 - 2 * l)) & 0x300)];
                o.sgn[l] = SIGNS8[blk.qs[32 + 4 * c + l] as usize];
            }
            let sc = blk.scales[c] as i32;
            o.sc = [2 * (sc & 0xf) + 1, 2 * (sc >> 4) + 1];
        }
        IQ3_XXS => {
            let blk = block::<BlockIQ3XXS>(b);
            let a = u32_at(&blk.qs, 64 + 4 * c);
            for l in 0..4 {
                let g = |k: usize| IQ3XXS_GRID[blk.qs[8 * c + k] as usize] as u64;
                o.mag[l] = g(2 * l) | (g(2 * l + 1) << 32);
                o.sgn[l] = SIGNS7[((a >> (7 * l)) & 127) as usize];
            }
            o.sc = [2 * (a >> 28) as i32 + 1; 2];
        }
        IQ3_S => {
            let blk = block::<BlockIQ3S>(b);
            let qh = blk.qh[c] as usize;
            for l in 0..4 {
                let g = |k: usize| IQ3S_GRID[blk.qs[8 * c + k] as usize | ((qh << (8 - k)) & 256)] as u64;
                o.mag[l] = g(2 * l) | (g(2 * l + 1) << 32);
                o.sgn[l] = SIGNS8[blk.signs[4 * c + l] as usize];
            }
            o.sc = [2 * ((blk.scales[c / 2] >> (4 * (c % 2))) & 0xf) as i32 + 1; 2];
        }
        IQ1_S => {
            let blk = block::<BlockIQ1S>(b);
            let qh = u16_at(&blk.qh, 2 * c) as usize;
            for l in 0..4 {
                o.mag[l] = IQ1S_GRID[blk.qs[4 * c + l] as usize | (((qh >> (3 * l)) & 7) << 8)];
            }
            let ls = 2 * ((qh >> 12) & 7) as i32 + 1;
            o.sc = [ls; 2];
            o.dsc = if qh & 0x8000 != 0 { -ls } else { ls };
        }
        IQ1_M => {
            let blk = block::<BlockIQ1M>(b);
            let (qh0, qh1) = (blk.qh[2 * c] as usize, blk.qh[2 * c + 1] as usize);
            let idx = [qh0 << 8, qh0 << 4, qh1 << 8, qh1 << 4];
            let dbit = [qh0 & 0x08, qh0 & 0x80, qh1 & 0x08, qh1 & 0x80];
            for l in 0..4 {
                o.mag[l] = IQ1S_GRID[blk.qs[4 * c + l] as usize | (idx[l] & 0x700)];
                o.dl[l] = if dbit[l] != 0 { u64::MAX } else { ONES };
            }
            let sc = u16_at(&blk.scales, 2 * (c / 2)) >> (6 * (c % 2));
            o.sc = [2 * (sc & 7) as i32 + 1, 2 * ((sc >> 3) & 7) as i32 + 1];
        }
        TQ1_0 | TQ2_0 => {
            const POW3: [u8; 5] = [1, 3, 9, 27, 81];
            for p in 0..32 {
                let e = 32 * c + p;
                let digit = if ty == TQ2_0 {
                    (block::<BlockTQ2_0>(b).qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3
                } else {
                    let blk = block::<BlockTQ1_0>(b);
                    let (byte, n) = if e < 160 {
                        (blk.qs[e % 32], e / 32)
                    } else if e < 240 {
                        (blk.qs[32 + (e - 160) % 16], (e - 160) / 16)
                    } else {
                        (blk.qh[(e - 240) % 4], (e - 240) / 4)
                    };
                    ((byte.wrapping_mul(POW3[n]) as u16 * 3) >> 8) as u8
                };
                o.mag[p / 8] |= (digit as u64) << (8 * (p % 8));
            }
        }
        _ => panic!("chunk_parts: {ty} is not a grid or ternary type"),
    }
    o
}
