//! Row-block prefill kernels for the K-quants (x86-64): the matmul's prompt path for Q4_K
//! and Q6_K weights (pipeline step 13).
//!
//! The tile kernels of `avx2.rs` work on one weight row at a time with the 32 elements of a
//! block across the vector lanes, so every column needs a horizontal sum of its i32 lanes
//! per 64 (Q4_K) or 256 (Q6_K) elements before the float step. Here a thread first copies
//! `RB` = 8 weight rows into a scratch layout with the rows interleaved 4 bytes at a time
//! (`repack_*`, once per row block and matmul, as llama.cpp's repack.cpp does at load time),
//! so each i32 lane holds one ROW: an activation dword broadcast to all lanes against one
//! weight vector gives 8 rows' partial dots at once, the sums come out per lane with no
//! horizontal step, and the float step runs for 8 rows in one instruction.
//!
//! Bit-identical to the tile kernels (`avx2::dot_q4_k`, `avx2::dot_q6_k`): the integer sums
//! are exact whatever the order (no i16 saturation or i32 overflow is possible with these
//! formats' ranges; see each kernel), and each lane runs exactly the float operations the
//! tile kernel runs for that (row, column), in the same order: the same bits, hence batch
//! invariance holds whichever path computes an element.
//!
//! Three builds as for the packed kernels: plain AVX2 (`maddubs` into i16 sums, `madd` with
//! the scales) and AVX-VNNI (`vpdpbusd` into i32 sums, `vpmulld` with the scales) on ymm,
//! 8 rows per block; AVX-512 VNNI on zmm, `RZ` = 16 rows per block (`q4_k_z`, `q6_k_z`: the
//! AVX-VNNI build's integer steps with 16 rows per instruction, so half the instructions
//! per multiply-add: Gemma 3's Q4_K down 80.6 -> 117-124 GMAC/s, Q6_K 93.8 -> 115-128, one
//! thread of the Sapphire Rapids class VM; its ymm build ran at 8 rows).
//! The AVX-512 set without VNNI (`PackBuild::Bw`) runs the zmm kernels with the plain
//! builds' i16 `maddubs` sums (`q4_k_zb`, `q6_k_zb`), the Q4_0 / Q5_0 / Q4_1 / Q5_1
//! interleaved row pairs with `dpbusd_z`'s `maddubs` + `madd` (`quad_two_bw`,
//! `quad_min_two_bw`), each where no i16 pair sum can saturate, and Q8_0's by the sign trick
//! (`quad_sign`).

#![allow(clippy::missing_safety_doc)]

use super::avx2::{PackBuild, I2F_MAGIC, I2F_MAGIC_F32};
use super::fp::f16_to_f32;
use super::table::{DecodePairFn, DecodeRowFn, KernelTable, Lanes, PackPairsFn, PairDecoded, PairsDecoded, RowBlock, MAX_PACK};
use super::{PackedDot, PackedPairDot, PackedQuadDot, RbKernel, RepackFn};
use crate::ggml_type::GgmlType;
use super::blocks::{offset_of, Block, BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ6K, BlockQ8K, BlockQ8_0, BlockQ8_1};
use std::arch::x86_64::*;

/// The two-row kernels `$f::<NC>` over 1..=MAX_PACK columns, by column count.
macro_rules! pair_cols {
    ($f:ident) => {
        [None, Some($f::<1> as PackedPairDot), Some($f::<2>), Some($f::<3>), Some($f::<4>), Some($f::<5>), Some($f::<6>), Some($f::<7>), Some($f::<8>)]
    };
}
const _: () = assert!(MAX_PACK == 8);

/// The interleaved-pair kernels `$f::<NC>` over 1..=MAX_PACK columns, by column count.
macro_rules! quad_cols {
    ($f:ident) => {
        [None, Some($f::<1> as PackedQuadDot), Some($f::<2>), Some($f::<3>), Some($f::<4>), Some($f::<5>), Some($f::<6>), Some($f::<7>), Some($f::<8>)]
    };
}

/// Weight rows per row block (one per i32 lane of a ymm).
pub(crate) const RB: usize = 8;

/// Fewest tokens for which the matmul takes the row-block path: below this the repack
/// (once per row block) is not paid back and the tile/column kernels of `avx2.rs` run.
pub(crate) const MIN_TOKENS: usize = 16;

/// This module's kernels in table `t`, in build `build` (the set's: `PackBuild::Evex` for
/// the AVX-512 set, `Bw` for it without VNNI): the row-block kernels of Q4_K and Q6_K when
/// `row_blocks` (not under `PYLLAMA_ORDER=llamacpp`, whose orders depend on the batch), in
/// the plain AVX2, AVX-VNNI and BW builds the column-lane kernels of Q4_0, Q5_0, Q4_1, Q5_1
/// (AVX-VNNI: Q8_0 too; BW: the interleaved pairs of those and of Q8_0 for prefill besides),
/// and in the AVX-512 set the two-row packed kernels of Q4_0, Q5_0, Q8_0, Q4_1, Q5_1, over
/// raw rows (decode steps) and over decoded rows (prefill: `quad_signed`, over interleaved
/// row pairs, and `pair_min_decoded`).
/// `PYLLAMA_NO_RB=1` registers none (the same bits either way, for comparisons).
pub(crate) fn register(t: &mut KernelTable, build: PackBuild, row_blocks: bool) {
    if row_blocks {
        for ty in [GgmlType::Q4_K, GgmlType::Q6_K] {
            t.set_row_block(ty, kernels_with(ty, build).expect("row-block kernels of Q4_K and Q6_K"));
        }
    }
    if build != PackBuild::Evex {
        for (ty, lanes) in lanes_kernels(build) {
            t.set_packed_lanes(ty, lanes);
        }
    }
    if build == PackBuild::Vnni {
        // Q8_0's quants + 128 would saturate `maddubs` pairs, not `vpdpbusd`'s i32 sums
        t.set_packed_lanes(GgmlType::Q8_0, Lanes { decode: decode_lanes_q8_0, block_bytes: 36, dot: lanes_signed_vnni });
    }
    if build == PackBuild::Bw {
        // the interleaved pairs take prefill, the column lanes the rest; Q8_0 by the sign
        // trick (its weights would saturate `quad_signed`'s `maddubs` pairs)
        for (ty, decode) in [(GgmlType::Q4_0, decode_pairs_q4_0_bw as DecodePairFn), (GgmlType::Q5_0, decode_pairs_q5_0_bw)] {
            let pack = pack_q8_0_pairs as PackPairsFn;
            t.set_packed_pairs_decoded(ty, PairsDecoded { decode, block_bytes: PAIRS_BLOCK_BYTES, pack, pack_block: super::avx2::PACK_BLOCK, min_rows: 0, two: quad_cols!(quad_two_bw), one: quad_cols!(quad_one_bw) });
        }
        let pack = pack_q8_0_pairs_signed as PackPairsFn;
        t.set_packed_pairs_decoded(GgmlType::Q8_0, PairsDecoded { decode: decode_pairs_q8_0_bw, block_bytes: PAIRS_BLOCK_BYTES, pack, pack_block: super::avx2::PACK_BLOCK, min_rows: 0, two: quad_cols!(quad_sign_two), one: quad_cols!(quad_sign_one) });
        // the min family where a decoded block holds PAIRS_MIN_ROWS rows (else the lanes)
        for (ty, decode) in [(GgmlType::Q4_1, decode_pairs_q4_1 as DecodePairFn), (GgmlType::Q5_1, decode_pairs_q5_1)] {
            let pack = pack_q8_1_pairs as PackPairsFn;
            t.set_packed_pairs_decoded(ty, PairsDecoded { decode, block_bytes: PAIRS_MIN_BLOCK_BYTES, pack, pack_block: PACK_BLOCK_PAIRS_Q8_1, min_rows: PAIRS_MIN_ROWS, two: quad_cols!(quad_min_two_bw), one: quad_cols!(quad_min_one_bw) });
        }
    }
    if build == PackBuild::Evex {
        t.set_packed_pair(GgmlType::Q4_0, pair_cols!(pair_q4_0));
        t.set_packed_pair(GgmlType::Q5_0, pair_cols!(pair_q5_0));
        t.set_packed_pair(GgmlType::Q8_0, pair_cols!(pair_q8_0));
        t.set_packed_pair(GgmlType::Q4_1, pair_cols!(pair_q4_1));
        t.set_packed_pair(GgmlType::Q5_1, pair_cols!(pair_q5_1));
        for (ty, decode) in [(GgmlType::Q4_1, decode_lanes_q4_1 as DecodeRowFn), (GgmlType::Q5_1, decode_lanes_q5_1)] {
            t.set_packed_pair_decoded(ty, PairDecoded { decode, block_bytes: 40, cols: pair_cols!(pair_min_decoded) });
        }
        for (ty, decode) in [(GgmlType::Q4_0, decode_pairs_q4_0 as DecodePairFn), (GgmlType::Q5_0, decode_pairs_q5_0), (GgmlType::Q8_0, decode_pairs_q8_0)] {
            let pack = pack_q8_0_pairs as PackPairsFn;
            t.set_packed_pairs_decoded(ty, PairsDecoded { decode, block_bytes: PAIRS_BLOCK_BYTES, pack, pack_block: super::avx2::PACK_BLOCK, min_rows: 0, two: quad_cols!(quad_two), one: quad_cols!(quad_one) });
        }
        for (ty, decode) in [(GgmlType::Q4_1, decode_pairs_q4_1 as DecodePairFn), (GgmlType::Q5_1, decode_pairs_q5_1)] {
            let pack = pack_q8_1_pairs as PackPairsFn;
            t.set_packed_pairs_decoded(ty, PairsDecoded { decode, block_bytes: PAIRS_MIN_BLOCK_BYTES, pack, pack_block: PACK_BLOCK_PAIRS_Q8_1, min_rows: PAIRS_MIN_ROWS, two: quad_cols!(quad_min_two), one: quad_cols!(quad_min_one) });
        }
    }
}

macro_rules! cols_table {
    ($f:ident, $tile:expr) => {{
        let mut t: [Option<RbKernel>; 9] = [None; 9];
        t[1] = Some($f::<1> as RbKernel);
        t[2] = Some($f::<2> as RbKernel);
        t[3] = Some($f::<3> as RbKernel);
        t[4] = Some($f::<4> as RbKernel);
        if $tile == 8 {
            t[5] = Some($f::<5> as RbKernel);
            t[6] = Some($f::<6> as RbKernel);
            t[7] = Some($f::<7> as RbKernel);
            t[8] = Some($f::<8> as RbKernel);
        }
        t
    }};
}

const PLAIN: u8 = 0;
const VNNI: u8 = 1;

/// The row-block kernels of `ty` in `build` (tests compare all builds), if any: RB = 8
/// rows (ymm lanes) x 4 columns in the AVX2 builds (16 ymm registers), RZ = 16 rows (zmm
/// lanes) x 8 columns in the AVX-512 one (32 zmm registers).
pub(crate) fn kernels_with(ty: GgmlType, build: PackBuild) -> Option<RowBlock> {
    let (rows, tile) = if matches!(build, PackBuild::Evex | PackBuild::Bw) { (RZ, 8) } else { (RB, 4) };
    let (repack, sb_bytes, cols): (RepackFn, usize, _) = match (ty, build) {
        (GgmlType::Q4_K, PackBuild::Plain) => (repack_q4_k, Q4K_SB, cols_table!(q4_k_plain, 4)),
        (GgmlType::Q4_K, PackBuild::Vnni) => (repack_q4_k, Q4K_SB, cols_table!(q4_k_vnni, 4)),
        (GgmlType::Q4_K, PackBuild::Evex) => (repack_q4_k_z, Q4KZ_SB, cols_table!(q4_k_z, 8)),
        (GgmlType::Q4_K, PackBuild::Bw) => (repack_q4_k_z, Q4KZ_SB, cols_table!(q4_k_zb, 8)),
        (GgmlType::Q6_K, PackBuild::Plain) => (repack_q6_k, Q6K_SB, cols_table!(q6_k_plain, 4)),
        (GgmlType::Q6_K, PackBuild::Vnni) => (repack_q6_k, Q6K_SB, cols_table!(q6_k_vnni, 4)),
        (GgmlType::Q6_K, PackBuild::Evex) => (repack_q6_k_z, Q6KZ_SB, cols_table!(q6_k_z, 8)),
        (GgmlType::Q6_K, PackBuild::Bw) => (repack_q6_k_z, Q6KZ_SB, cols_table!(q6_k_zb, 8)),
        _ => return None,
    };
    Some(RowBlock { rows, min_tokens: MIN_TOKENS, repack, sb_bytes, tile, cols })
}

#[inline(always)]
unsafe fn load256(p: *const u8) -> __m256i {
    _mm256_loadu_si256(p as *const __m256i)
}

/// The i32 at p in all 8 lanes (a broadcast load).
#[inline(always)]
unsafe fn bcast32(p: *const u8) -> __m256i {
    _mm256_set1_epi32(std::ptr::read_unaligned(p as *const i32))
}

#[inline]
#[target_feature(enable = "avx2,avxvnni")]
unsafe fn vnni_acc(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
    _mm256_dpbusd_avx_epi32(acc, a, b)
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn vnni_z(acc: __m512i, u: __m512i, s: __m512i) -> __m512i {
    _mm512_dpbusd_epi32(acc, u, s)
}

/// The zmm builds' `vpdpbusd`: acc + the i32 sums of 4 u8 x i8 products of u and s, one
/// instruction in the VNNI build (`VNNI`), `maddubs` + `madd` + add in the BW one (`PLAIN`,
/// the AVX-512 set without VNNI). The BW form is the same i32 only where no pair sum
/// u0 * s0 + u1 * s1 leaves i16: each caller says why its operands cannot.
#[inline(always)]
unsafe fn dpbusd_z<const B: u8>(acc: __m512i, u: __m512i, s: __m512i) -> __m512i {
    if B == VNNI {
        vnni_z(acc, u, s)
    } else {
        _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(u, s), _mm512_set1_epi16(1)))
    }
}

/// `dot_acc` on zmm: i16 pair sums (BW build, `maddubs`) or i32 sums of 4 (VNNI build).
#[inline(always)]
unsafe fn dot_acc_z<const B: u8>(acc: __m512i, w: __m512i, x: __m512i) -> __m512i {
    if B == VNNI {
        vnni_z(acc, w, x)
    } else {
        _mm512_add_epi16(acc, _mm512_maddubs_epi16(w, x))
    }
}

/// `dpbusd_z` on ymm: acc + the i32 sums of 4 u8 x i8 products, `maddubs` + `madd` + add
/// (plain build: exact where no pair sum leaves i16) or one `vpdpbusd` (AVX-VNNI build).
#[inline(always)]
unsafe fn dpbusd_y<const B: u8>(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
    if B == PLAIN {
        _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)))
    } else {
        vnni_acc(acc, u, s)
    }
}

/// acc + the u8 x i8 products of w and x: i16 pair sums (plain build, `maddubs`) or i32
/// sums of 4 (AVX-VNNI build).
#[inline(always)]
unsafe fn dot_acc<const B: u8>(acc: __m256i, w: __m256i, x: __m256i) -> __m256i {
    match B {
        PLAIN => _mm256_add_epi16(acc, _mm256_maddubs_epi16(w, x)),
        _ => vnni_acc(acc, w, x),
    }
}

/// The per-lane (per-row) i32 scales `sc` times the sums `a` of `dot_acc`: i32 lanes.
#[inline(always)]
unsafe fn scale<const B: u8>(a: __m256i, sc: __m256i) -> __m256i {
    if B == PLAIN {
        // i16 pairs (sc, sc) (|sc| < 2^15): madd gives sc * (pair sum 0 + pair sum 1) per lane
        _mm256_madd_epi16(a, _mm256_blend_epi16::<0xAA>(sc, _mm256_slli_epi32(sc, 16)))
    } else {
        _mm256_mullo_epi32(a, sc)
    }
}

unsafe fn rd_f16(p: *const u8) -> f32 {
    f16_to_f32(std::ptr::read_unaligned(p as *const u16))
}

// ------------------------------------------------------------------ Q4_K

/// Repacked Q4_K super-block of R rows (RB = 8 for the ymm builds, RZ = 16 for zmm): [d_w: R
/// f32][dmin_w: R f32][scale of sub-block s = 0..8: R i32 (`F32_SCALES`, the zmm build's:
/// R f32), one per row][mins of sub-blocks 2j, 2j+1, j = 0..4: R x 2 i16][quant bytes: for dword d = 0..32 of the 128 quant bytes, R
/// rows x 4 bytes]. Quant dword d holds elements 4(d % 8) .. +4 of sub-block 2(d / 8) (low
/// nibbles) and 2(d / 8) + 1 (high). Every field is 4R bytes per entry: whole cache lines for
/// R = 16. `q4k_layout(R)` = [bytes, scales, mins, quants] offsets.
const fn q4k_layout(r: usize) -> [usize; 4] {
    [184 * r, 8 * r, 40 * r, 56 * r]
}
const Q4K_SB: usize = q4k_layout(RB)[0];
const Q4K_SC: usize = q4k_layout(RB)[1];
const Q4K_MN: usize = q4k_layout(RB)[2];
const Q4K_Q: usize = q4k_layout(RB)[3];
const _: () = assert!(Q4K_SB == 32 + 32 + 256 + 128 + 1024 && Q4K_MN == 320 && Q4K_Q == 448);

#[inline(always)]
unsafe fn repack_q4_k_rows<const R: usize, const F32_SCALES: bool>(nsb: usize, w: *const u8, wrow: usize, dst: *mut u8) {
    let [sb, sc_at, mn_at, q_at] = q4k_layout(R);
    for i in 0..nsb {
        let p = dst.add(i * sb);
        for r in 0..R {
            let b = w.add(r * wrow + i * BlockQ4K::SIZE);
            (p as *mut f32).add(r).write_unaligned(rd_f16(b));
            (p.add(4 * R) as *mut f32).add(r).write_unaligned(rd_f16(b.add(2)));
            let sc = std::slice::from_raw_parts(b.add(4), 12);
            for s in 0..8 {
                let (d, m) = super::kquants::scale_min_k4(s, sc);
                if F32_SCALES {
                    (p.add(sc_at + 4 * R * s + 4 * r) as *mut f32).write_unaligned(d as f32);
                } else {
                    (p.add(sc_at + 4 * R * s + 4 * r) as *mut i32).write_unaligned(d as i32);
                }
                (p.add(mn_at + 4 * R * (s / 2) + 4 * r + 2 * (s % 2)) as *mut i16).write_unaligned(m as i16);
            }
            for d in 0..32 {
                std::ptr::copy_nonoverlapping(b.add(16 + 4 * d), p.add(q_at + 4 * R * d + 4 * r), 4);
            }
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn repack_q4_k(nsb: usize, w: *const u8, wrow: usize, dst: *mut u8) {
    repack_q4_k_rows::<RB, false>(nsb, w, wrow, dst)
}

/// Q4_K x Q8_K, RB rows x NC columns. Per lane (row r) and column c, exactly the float
/// steps of `avx2::dot_q4_k` (`dot_q4_k_ord::<_, true>`): per 64 elements j,
/// acc = fma(f32(isum_j), d_w * d_x, acc) and acc_m = fma(f32(msum_j), dmin_w * d_x, acc_m),
/// then acc - acc_m. isum_j: the exact i32 sum over sub-blocks 2j, 2j+1 of scale * q_w * q_x
/// (plain build: i16 sums of at most 8 maddubs pairs, |.| <= 8 * 2 * 15 * 128 = 30720);
/// msum_j: min(2j) * bsum(2j) + min(2j+1) * bsum(2j+1), the same `madd` as there. (The
/// f32 form of `q4_k_z_tile`'s isum_j measured no faster here.)
#[inline(always)]
unsafe fn q4_k_tile<const B: u8, const NC: usize>(nsb: usize, wp: *const u8, x: *const u8, xs: usize, out: *mut f32, ldo: usize) {
    // the mins' chain first, in a loop of its own (as `q4_k_z_tile`): its accumulators
    // beside the sums' would not fit the 16 ymm registers
    let mut accm = [_mm256_setzero_ps(); NC];
    for i in 0..nsb {
        let p = wp.add(i * Q4K_SB);
        let dm8 = _mm256_loadu_ps(p.add(32) as *const f32);
        for (c, am) in accm.iter_mut().enumerate() {
            let xb = x.add(c * xs + i * BlockQ8K::SIZE);
            let dmn = _mm256_mul_ps(dm8, _mm256_set1_ps(std::ptr::read_unaligned(xb as *const f32)));
            // bsum of each 32-element sub-block (i16, exact)
            let b = load256(xb.add(260));
            let s = _mm_hadd_epi16(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1));
            let mut bs = [0i32; 4];
            _mm_storeu_si128(bs.as_mut_ptr() as *mut __m128i, s);
            for (j, &pair) in bs.iter().enumerate() {
                let msum = _mm256_madd_epi16(load256(p.add(Q4K_MN + 32 * j)), _mm256_set1_epi32(pair));
                *am = _mm256_fmadd_ps(_mm256_cvtepi32_ps(msum), dmn, *am);
            }
        }
    }
    let m4 = _mm256_set1_epi8(0xF);
    let mut acc = [_mm256_setzero_ps(); NC];
    for i in 0..nsb {
        let p = wp.add(i * Q4K_SB);
        let dw8 = _mm256_loadu_ps(p as *const f32);
        let q = p.add(Q4K_Q);
        for j in 0..4 {
            // sub-blocks 2j (low nibbles) and 2j + 1 (high) side by side: one weight load
            // feeds both, and the i16 sums of both stay in registers
            let mut a = [[_mm256_setzero_si256(); NC]; 2];
            for k in 0..8 {
                let wpk = load256(q.add(32 * (8 * j + k)));
                let wq = [_mm256_and_si256(wpk, m4), _mm256_and_si256(_mm256_srli_epi16(wpk, 4), m4)];
                for c in 0..NC {
                    let xq = x.add(c * xs + i * BlockQ8K::SIZE + offset_of!(BlockQ8K, qs) + 64 * j + 4 * k);
                    a[0][c] = dot_acc::<B>(a[0][c], wq[0], bcast32(xq));
                    a[1][c] = dot_acc::<B>(a[1][c], wq[1], bcast32(xq.add(32)));
                }
            }
            let sc0 = load256(p.add(Q4K_SC + 32 * (2 * j)));
            let sc1 = load256(p.add(Q4K_SC + 32 * (2 * j + 1)));
            for c in 0..NC {
                let isum = _mm256_add_epi32(scale::<B>(a[0][c], sc0), scale::<B>(a[1][c], sc1));
                let yd = _mm256_set1_ps(std::ptr::read_unaligned(x.add(c * xs + i * BlockQ8K::SIZE) as *const f32));
                acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(dw8, yd), acc[c]);
            }
        }
    }
    for c in 0..NC {
        _mm256_storeu_ps(out.add(c * ldo), _mm256_sub_ps(acc[c], accm[c]));
    }
}

// ------------------------------------------------------------------ Q4_K, 16 rows (zmm)

/// Weight rows per row block of the AVX-512 build's zmm kernels (one per i32 lane).
pub(crate) const RZ: usize = 16;

/// The Q4_K layout (`q4k_layout`) with RZ rows.
const Q4KZ_SB: usize = q4k_layout(RZ)[0];
const Q4KZ_SC: usize = q4k_layout(RZ)[1];
const Q4KZ_MN: usize = q4k_layout(RZ)[2];
const Q4KZ_Q: usize = q4k_layout(RZ)[3];

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn repack_q4_k_z(nsb: usize, w: *const u8, wrow: usize, dst: *mut u8) {
    repack_q4_k_rows::<RZ, true>(nsb, w, wrow, dst)
}

/// Q4_K x Q8_K, RZ = 16 rows (one per zmm lane) x NC columns: per (row, column) exactly
/// the float steps of `q4_k_tile` (and so of `avx2::dot_q4_k`): the two chains acc (the
/// scaled sums) and acc_m (the mins) in the same order, acc - acc_m at the end. The mins'
/// chain runs first as a loop of its own (its 8 accumulators would not fit beside the 24
/// of the sums); the sums' i32 `vpdpbusd` of 16 rows x 4 quants per instruction take half
/// the instructions of the ymm build's 8 rows. isum_j = sc(2j) * a(2j) + sc(2j+1) * a(2j+1)
/// is formed in f32 (`fma(f32(a1), sc1, f32(a0) * sc0)`, the scales stored as f32): exact,
/// as every value on the way is an integer below 2^24 (|a| <= 32 * 15 * 128, sc <= 63:
/// |isum_j| < 7.8e6), so it equals f32 of the i32 sum, without the two `vpmulld` (two uops
/// each on one port): Gemma 3's Q4_K down 138 -> 146-149 GMAC/s, out 154 -> 159-160 (three
/// alternated runs). The BW build (`B` = PLAIN) sums each sub-block's products in i16 as
/// `q4_k_tile`'s plain build does (at most 8 `maddubs` pairs, |.| <= 30720), widened by one
/// `madd` with ones: the same i32.
#[inline(always)]
unsafe fn q4_k_z_tile<const B: u8, const NC: usize>(nsb: usize, wp: *const u8, x: *const u8, xs: usize, out: *mut f32, ldo: usize) {
    let qs = offset_of!(BlockQ8K, qs);
    // the mins: acc_m = fma(f32(msum_j), dmin_w * d_x, acc_m) per 64 elements j
    let mut accm = [_mm512_setzero_ps(); NC];
    for i in 0..nsb {
        let p = wp.add(i * Q4KZ_SB);
        let dm = _mm512_loadu_ps(p.add(64) as *const f32);
        for (c, am) in accm.iter_mut().enumerate() {
            let xb = x.add(c * xs + i * BlockQ8K::SIZE);
            let dmn = _mm512_mul_ps(dm, _mm512_set1_ps(std::ptr::read_unaligned(xb as *const f32)));
            // bsum of each 32-element sub-block (i16, exact)
            let b = load256(xb.add(260));
            let bs = _mm_hadd_epi16(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1));
            let mut bsa = [0i32; 4];
            _mm_storeu_si128(bsa.as_mut_ptr() as *mut __m128i, bs);
            for (j, &pair) in bsa.iter().enumerate() {
                let msum = _mm512_madd_epi16(_mm512_loadu_si512(p.add(Q4KZ_MN + 64 * j) as *const _), _mm512_set1_epi32(pair));
                *am = _mm512_fmadd_ps(_mm512_cvtepi32_ps(msum), dmn, *am);
            }
        }
    }
    // the sums: acc = fma(f32(isum_j), d_w * d_x, acc) per 64 elements j
    let m4 = _mm512_set1_epi8(0xF);
    let mut acc = [_mm512_setzero_ps(); NC];
    for i in 0..nsb {
        let p = wp.add(i * Q4KZ_SB);
        let q = p.add(Q4KZ_Q);
        let dw = _mm512_loadu_ps(p as *const f32);
        let xq = x.add(i * BlockQ8K::SIZE + qs);
        for j in 0..4 {
            // sub-blocks 2j (low nibbles) and 2j + 1 (high) side by side: two chains per column
            let mut a0 = [_mm512_setzero_si512(); NC];
            let mut a1 = [_mm512_setzero_si512(); NC];
            for k in 0..8 {
                let wpk = _mm512_loadu_si512(q.add(64 * (8 * j + k)) as *const _);
                let (lo, hi) = (_mm512_and_si512(wpk, m4), _mm512_and_si512(_mm512_srli_epi16::<4>(wpk), m4));
                for c in 0..NC {
                    let xc = xq.add(c * xs + 64 * j + 4 * k);
                    a0[c] = dot_acc_z::<B>(a0[c], lo, _mm512_set1_epi32(std::ptr::read_unaligned(xc as *const i32)));
                    a1[c] = dot_acc_z::<B>(a1[c], hi, _mm512_set1_epi32(std::ptr::read_unaligned(xc.add(32) as *const i32)));
                }
            }
            if B == PLAIN {
                let ones = _mm512_set1_epi16(1);
                for c in 0..NC {
                    a0[c] = _mm512_madd_epi16(a0[c], ones);
                    a1[c] = _mm512_madd_epi16(a1[c], ones);
                }
            }
            let sc0 = _mm512_loadu_ps(p.add(Q4KZ_SC + 64 * (2 * j)) as *const f32);
            let sc1 = _mm512_loadu_ps(p.add(Q4KZ_SC + 64 * (2 * j + 1)) as *const f32);
            for c in 0..NC {
                // f32(isum_j) exactly: every value on the way is an integer below 2^24
                let isum = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a1[c]), sc1, _mm512_mul_ps(_mm512_cvtepi32_ps(a0[c]), sc0));
                let yd = _mm512_set1_ps(std::ptr::read_unaligned(x.add(c * xs + i * BlockQ8K::SIZE) as *const f32));
                acc[c] = _mm512_fmadd_ps(isum, _mm512_mul_ps(dw, yd), acc[c]);
            }
        }
    }
    for c in 0..NC {
        _mm512_storeu_ps(out.add(c * ldo), _mm512_sub_ps(acc[c], accm[c]));
    }
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn q4_k_z<const NC: usize>(nsb: usize, wp: *const u8, x: *const u8, xs: usize, out: *mut f32, ldo: usize) {
    q4_k_z_tile::<VNNI, NC>(nsb, wp, x, xs, out, ldo)
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq")]
unsafe fn q4_k_zb<const NC: usize>(nsb: usize, wp: *const u8, x: *const u8, xs: usize, out: *mut f32, ldo: usize) {
    q4_k_z_tile::<PLAIN, NC>(nsb, wp, x, xs, out, ldo)
}

// ------------------------------------------------------------------ Q6_K

/// Repacked Q6_K super-block of R rows (RB or RZ, as Q4_K's): [d_w: R f32][scale of
/// 16-element group g = 0..16: R i32, one per row][scales of groups 2m, 2m+1, m = 0..8: R x 2
/// i16][quants as unsigned bytes 0..=63: for dword e = 0..64 (elements 4e..4e+4), R rows x 4
/// bytes]. `q6k_layout(R)` = [bytes, scales, scale pairs, quants] offsets.
const fn q6k_layout(r: usize) -> [usize; 4] {
    [356 * r, 4 * r, 68 * r, 100 * r]
}
const Q6K_SB: usize = q6k_layout(RB)[0];
const Q6K_SC: usize = q6k_layout(RB)[1];
const Q6K_SP: usize = q6k_layout(RB)[2];
const Q6K_Q: usize = q6k_layout(RB)[3];
const _: () = assert!(Q6K_SB == 32 + 512 + 256 + 2048 && Q6K_SP == 544 && Q6K_Q == 800);

/// Bits s, s + 1 of each byte of bh, moved to bits 4 and 5.
#[inline(always)]
unsafe fn q6_hi(bh: __m256i, m2: __m256i, s: i32) -> __m256i {
    _mm256_slli_epi16(_mm256_and_si256(_mm256_srl_epi16(bh, _mm_cvtsi32_si128(s)), m2), 4)
}

#[inline(always)]
unsafe fn repack_q6_k_rows<const R: usize>(nsb: usize, w: *const u8, wrow: usize, dst: *mut u8) {
    let [sb, sc_at, sp_at, q_at] = q6k_layout(R);
    let m4 = _mm256_set1_epi8(0xF);
    let m2 = _mm256_set1_epi8(3);
    let mut tmp = [0u8; 256];
    for i in 0..nsb {
        let p = dst.add(i * sb);
        for r in 0..R {
            let b = w.add(r * wrow + i * BlockQ6K::SIZE);
            (p as *mut f32).add(r).write_unaligned(rd_f16(b.add(208)));
            for g in 0..16 {
                let s = *b.add(192 + g) as i8;
                (p.add(sc_at + 4 * R * g + 4 * r) as *mut i32).write_unaligned(s as i32);
                (p.add(sp_at + 4 * R * (g / 2) + 4 * r + 2 * (g % 2)) as *mut i16).write_unaligned(s as i16);
            }
            // the unsigned 6-bit values of elements 0..256, decoded as `avx2::dot_q6_k` does
            for j in 0..2 {
                let b1 = load256(b.add(64 * j));
                let b2 = load256(b.add(64 * j + 32));
                let bh = load256(b.add(128 + 32 * j));
                let q = [
                    _mm256_or_si256(_mm256_and_si256(b1, m4), q6_hi(bh, m2, 0)),
                    _mm256_or_si256(_mm256_and_si256(b2, m4), q6_hi(bh, m2, 2)),
                    _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b1, 4), m4), q6_hi(bh, m2, 4)),
                    _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b2, 4), m4), q6_hi(bh, m2, 6)),
                ];
                for (l, v) in q.iter().enumerate() {
                    _mm256_storeu_si256(tmp.as_mut_ptr().add(128 * j + 32 * l) as *mut __m256i, *v);
                }
            }
            for e in 0..64 {
                std::ptr::copy_nonoverlapping(tmp.as_ptr().add(4 * e), p.add(q_at + 4 * R * e + 4 * r), 4);
            }
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn repack_q6_k(nsb: usize, w: *const u8, wrow: usize, dst: *mut u8) {
    repack_q6_k_rows::<RB>(nsb, w, wrow, dst)
}

/// Q6_K x Q8_K, RB rows x NC columns. Per lane (row r) and column c, exactly the float
/// steps of `avx2::dot_q6_k` (`dot_q6_k_ord::<_, true>`): per super-block
/// acc = fma(d_w * f32(isum), d_x, acc), isum the exact i32 sum over the 16 groups of
/// scale * (sum of q_w * q_x - 32 * bsum) with q_w the unsigned 6-bit values (plain build:
/// i16 sums of 2 maddubs pairs per 16-element group, |.| <= 2 * 2 * 63 * 128 = 32256).
#[inline(always)]
unsafe fn q6_k_tile<const B: u8, const NC: usize>(nsb: usize, wp: *const u8, x: *const u8, xs: usize, out: *mut f32, ldo: usize) {
    let mut acc = [_mm256_setzero_ps(); NC];
    for i in 0..nsb {
        let p = wp.add(i * Q6K_SB);
        let mut isum = [_mm256_setzero_si256(); NC];
        for g in 0..16 {
            let sc = load256(p.add(Q6K_SC + 32 * g));
            let mut a = [_mm256_setzero_si256(); NC];
            for k in 0..4 {
                let wq = load256(p.add(Q6K_Q + 32 * (4 * g + k)));
                for c in 0..NC {
                    let xv = bcast32(x.add(c * xs + i * BlockQ8K::SIZE + offset_of!(BlockQ8K, qs) + 16 * g + 4 * k));
                    a[c] = dot_acc::<B>(a[c], wq, xv);
                }
                if B == PLAIN && k == 1 {
                    // two maddubs per i16 at most (see above): fold the first 8 elements
                    for c in 0..NC {
                        isum[c] = _mm256_add_epi32(isum[c], scale::<B>(a[c], sc));
                        a[c] = _mm256_setzero_si256();
                    }
                }
            }
            for c in 0..NC {
                isum[c] = _mm256_add_epi32(isum[c], scale::<B>(a[c], sc));
            }
        }
        let dw8 = _mm256_loadu_ps(p as *const f32);
        for c in 0..NC {
            let xb = x.add(c * xs + i * BlockQ8K::SIZE);
            // 32 * sum over groups of scale * bsum: i16 pairs (scale 2m, 2m+1) x (bsum 2m,
            // 2m+1)
            let mut sb = _mm256_setzero_si256();
            for m in 0..8 {
                sb = _mm256_add_epi32(sb, _mm256_madd_epi16(load256(p.add(Q6K_SP + 32 * m)), bcast32(xb.add(260 + 4 * m))));
            }
            let s = _mm256_sub_epi32(isum[c], _mm256_slli_epi32(sb, 5));
            let yd = _mm256_set1_ps(std::ptr::read_unaligned(xb as *const f32));
            acc[c] = _mm256_fmadd_ps(_mm256_mul_ps(dw8, _mm256_cvtepi32_ps(s)), yd, acc[c]);
        }
    }
    for c in 0..NC {
        _mm256_storeu_ps(out.add(c * ldo), acc[c]);
    }
}

/// The Q6_K layout (`q6k_layout`) with RZ rows.
const Q6KZ_SB: usize = q6k_layout(RZ)[0];
const Q6KZ_SC: usize = q6k_layout(RZ)[1];
const Q6KZ_SP: usize = q6k_layout(RZ)[2];
const Q6KZ_Q: usize = q6k_layout(RZ)[3];

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn repack_q6_k_z(nsb: usize, w: *const u8, wrow: usize, dst: *mut u8) {
    repack_q6_k_rows::<RZ>(nsb, w, wrow, dst)
}

/// Q6_K x Q8_K, RZ = 16 rows (one per zmm lane) x NC columns: per (row, column) exactly
/// the steps of `q6_k_tile` (its EVEX build's i32 sums, 16 rows per instruction; the BW
/// build's i16 sums of 2 `maddubs` pairs as its plain build's, |.| <= 32256, scaled by a
/// `madd` with the group's scale in both i16 halves).
#[inline(always)]
unsafe fn q6_k_z_tile<const B: u8, const NC: usize>(nsb: usize, wp: *const u8, x: *const u8, xs: usize, out: *mut f32, ldo: usize) {
    let qs = offset_of!(BlockQ8K, qs);
    let mut acc = [_mm512_setzero_ps(); NC];
    for i in 0..nsb {
        let p = wp.add(i * Q6KZ_SB);
        let xq = x.add(i * BlockQ8K::SIZE + qs);
        let mut isum = [_mm512_setzero_si512(); NC];
        // groups 2m and 2m + 1 side by side: two chains per column
        for m in 0..8 {
            let sc0 = _mm512_loadu_si512(p.add(Q6KZ_SC + 64 * (2 * m)) as *const _);
            let sc1 = _mm512_loadu_si512(p.add(Q6KZ_SC + 64 * (2 * m + 1)) as *const _);
            // BW: i16 pairs (sc, sc) (|sc| <= 128): madd gives sc * (pair sum 0 + 1) per lane
            let pair = |sc: __m512i| _mm512_mask_blend_epi16(0xAAAA_AAAA, sc, _mm512_slli_epi32::<16>(sc));
            let (sp0, sp1) = if B == PLAIN { (pair(sc0), pair(sc1)) } else { (sc0, sc1) };
            let mut a0 = [_mm512_setzero_si512(); NC];
            let mut a1 = [_mm512_setzero_si512(); NC];
            for k in 0..4 {
                let w0 = _mm512_loadu_si512(p.add(Q6KZ_Q + 64 * (8 * m + k)) as *const _);
                let w1 = _mm512_loadu_si512(p.add(Q6KZ_Q + 64 * (8 * m + 4 + k)) as *const _);
                for c in 0..NC {
                    let xc = xq.add(c * xs + 32 * m + 4 * k);
                    a0[c] = dot_acc_z::<B>(a0[c], w0, _mm512_set1_epi32(std::ptr::read_unaligned(xc as *const i32)));
                    a1[c] = dot_acc_z::<B>(a1[c], w1, _mm512_set1_epi32(std::ptr::read_unaligned(xc.add(16) as *const i32)));
                }
                if B == PLAIN && k % 2 == 1 {
                    // two maddubs per i16 at most: fold them
                    for c in 0..NC {
                        isum[c] = _mm512_add_epi32(isum[c], _mm512_add_epi32(_mm512_madd_epi16(a0[c], sp0), _mm512_madd_epi16(a1[c], sp1)));
                        a0[c] = _mm512_setzero_si512();
                        a1[c] = _mm512_setzero_si512();
                    }
                }
            }
            if B == VNNI {
                for c in 0..NC {
                    isum[c] = _mm512_add_epi32(isum[c], _mm512_add_epi32(_mm512_mullo_epi32(a0[c], sc0), _mm512_mullo_epi32(a1[c], sc1)));
                }
            }
        }
        let dw = _mm512_loadu_ps(p as *const f32);
        for c in 0..NC {
            let xb = x.add(c * xs + i * BlockQ8K::SIZE);
            // 32 * sum over groups of scale * bsum: i16 pairs (scale 2m, 2m+1) x (bsum 2m, 2m+1)
            let mut sb = _mm512_setzero_si512();
            for m in 0..8 {
                let pair = std::ptr::read_unaligned(xb.add(260 + 4 * m) as *const i32);
                sb = _mm512_add_epi32(sb, _mm512_madd_epi16(_mm512_loadu_si512(p.add(Q6KZ_SP + 64 * m) as *const _), _mm512_set1_epi32(pair)));
            }
            let s = _mm512_sub_epi32(isum[c], _mm512_slli_epi32::<5>(sb));
            let yd = _mm512_set1_ps(std::ptr::read_unaligned(xb as *const f32));
            acc[c] = _mm512_fmadd_ps(_mm512_mul_ps(dw, _mm512_cvtepi32_ps(s)), yd, acc[c]);
        }
    }
    for c in 0..NC {
        _mm512_storeu_ps(out.add(c * ldo), acc[c]);
    }
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn q6_k_z<const NC: usize>(nsb: usize, wp: *const u8, x: *const u8, xs: usize, out: *mut f32, ldo: usize) {
    q6_k_z_tile::<VNNI, NC>(nsb, wp, x, xs, out, ldo)
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq")]
unsafe fn q6_k_zb<const NC: usize>(nsb: usize, wp: *const u8, x: *const u8, xs: usize, out: *mut f32, ldo: usize) {
    q6_k_z_tile::<PLAIN, NC>(nsb, wp, x, xs, out, ldo)
}

macro_rules! builds {
    ($tile:ident, $plain:ident, $vnni:ident) => {
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn $plain<const NC: usize>(nsb: usize, wp: *const u8, x: *const u8, xs: usize, out: *mut f32, ldo: usize) {
            $tile::<PLAIN, NC>(nsb, wp, x, xs, out, ldo)
        }
        #[target_feature(enable = "avx2,fma,f16c,avxvnni")]
        unsafe fn $vnni<const NC: usize>(nsb: usize, wp: *const u8, x: *const u8, xs: usize, out: *mut f32, ldo: usize) {
            $tile::<VNNI, NC>(nsb, wp, x, xs, out, ldo)
        }
    };
}

builds!(q4_k_tile, q4_k_plain, q4_k_vnni);
builds!(q6_k_tile, q6_k_plain, q6_k_vnni);

// ------------------------------------------------------------------ column lanes (AVX2)

/// The AVX2 builds' prefill kernels of Q4_0 / Q5_0 (against Q8_0) and Q4_1 / Q5_1 (against
/// Q8_1), with one COLUMN per lane (plain: `maddubs` + `madd`; AVX-VNNI: one `vpdpbusd`,
/// which took Gemma 3's Q5_0 from the packed kernels' 43 to 60.5 GMAC/s, one thread, and
/// also runs Q8_0).
///
/// The packed kernels of `avx2.rs` put a block's 32 elements across the lanes: per column
/// and block they need d_w * d_x of that column in all 8 lanes, a broadcast of a product
/// computed per block, and on AVX2 without VNNI that broadcast (from a just-stored vector,
/// or a multiply per column) cost as much as a third of the kernel (measured: 25 vs 17
/// cycles per block of 8 columns). Here lane c is column c: for element quad j = 0..8 of a
/// block, the weight dword j (4 quants) broadcast against the 8 columns' quad j gives the
/// 8 columns' i32 sums for lane j of the packed kernel, and ONE vector of products
/// d_w * d_x (lane c: column c) scales them all. Accumulator A_j holds lane j of every
/// column's accumulator; the final sum is `hsum_ps`'s tree ((0+4)+(2+6))+((1+5)+(3+7)) over
/// the A_j, lane-wise. Each column gets exactly the packed (and single-column) kernel's
/// operations in the same order: the same bits.
///
/// The weights are decoded once per matmul and row (`decode`: 32 quant bytes per block,
/// offset to unsigned as the packed kernels use them, then the f32 scales), the activation
/// groups packed quad-major (`avx2::pack_q8_0_lanes`, `avx2::pack_q8_1_lanes`).
///
/// Not Q8_0 in the plain build: its quants + 128 could saturate `maddubs`, and with the plain
/// kernels' sign trick per quad (|w| against y with w's signs) the column-lane kernel measured
/// no faster than the packed one (prefill 33.6 vs 34.1 GMAC/s, Gemma 3's output at 8 tokens
/// 39.8 vs 38.2 ms). The AVX-VNNI build runs it (`register`).
fn lanes_kernels(build: PackBuild) -> [(GgmlType, Lanes); 4] {
    let (signed, min) = if build == PackBuild::Vnni { (lanes_signed_vnni as PackedDot, lanes_min_vnni as PackedDot) } else { (lanes_signed as PackedDot, lanes_min as PackedDot) };
    [
        (GgmlType::Q4_0, Lanes { decode: decode_lanes_q4_0, block_bytes: 36, dot: signed }),
        (GgmlType::Q5_0, Lanes { decode: decode_lanes_q5_0, block_bytes: 36, dot: signed }),
        (GgmlType::Q4_1, Lanes { decode: decode_lanes_q4_1, block_bytes: 40, dot: min }),
        (GgmlType::Q5_1, Lanes { decode: decode_lanes_q5_1, block_bytes: 40, dot: min }),
    ]
}

/// One decoded row: [nb x 32 quant bytes][nb f32 d] (`MIN`: [nb x (d, m)] f32 pairs).
#[inline(always)]
unsafe fn decode_lanes<const MIN: bool>(nb: usize, w: *const u8, wsize: usize, dst: *mut u8, quants: impl Fn(*const u8) -> __m256i) {
    let sc = dst.add(32 * nb) as *mut f32;
    for i in 0..nb {
        let b = w.add(i * wsize);
        _mm256_storeu_si256(dst.add(32 * i) as *mut __m256i, quants(b));
        if MIN {
            // the hardware conversion, as the packed kernels (a NaN scale keeps its bits)
            sc.add(2 * i).write_unaligned(super::avx2::f16(b));
            sc.add(2 * i + 1).write_unaligned(super::avx2::f16(b.add(2)));
        } else {
            sc.add(i).write_unaligned(super::avx2::f16(b));
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn decode_lanes_q4_0(nb: usize, w: *const u8, dst: *mut u8) {
    decode_lanes::<false>(nb, w, BlockQ4_0::SIZE, dst, |b| super::avx2::nibbles_32(b.add(offset_of!(BlockQ4_0, qs))))
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn decode_lanes_q5_0(nb: usize, w: *const u8, dst: *mut u8) {
    decode_lanes::<false>(nb, w, BlockQ5_0::SIZE, dst, |b| super::avx2::q5_0_unsigned(b).1)
}

/// Q8_0's quants + 128 (the packed layout's offset) as unsigned bytes: for the AVX-VNNI
/// build's column lanes only (see `register`).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn decode_lanes_q8_0(nb: usize, w: *const u8, dst: *mut u8) {
    decode_lanes::<false>(nb, w, BlockQ8_0::SIZE, dst, |b| _mm256_xor_si256(load256(b.add(offset_of!(BlockQ8_0, qs))), _mm256_set1_epi8(-128)))
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn decode_lanes_q4_1(nb: usize, w: *const u8, dst: *mut u8) {
    decode_lanes::<true>(nb, w, BlockQ4_1::SIZE, dst, |b| super::avx2::q4_1_quants(b))
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn decode_lanes_q5_1(nb: usize, w: *const u8, dst: *mut u8) {
    decode_lanes::<true>(nb, w, BlockQ5_1::SIZE, dst, |b| super::avx2::q5_1_quants(b))
}

/// `hsum_ps`'s tree over the 8 lane accumulators, for every column at once.
#[inline(always)]
unsafe fn lanes_tree(a: &[__m256; 8]) -> __m256 {
    let e = _mm256_add_ps(_mm256_add_ps(a[0], a[4]), _mm256_add_ps(a[2], a[6]));
    let o = _mm256_add_ps(_mm256_add_ps(a[1], a[5]), _mm256_add_ps(a[3], a[7]));
    _mm256_add_ps(e, o)
}

/// The plain AVX2 build `$plain` and the AVX-VNNI build `$vnni` of a column-lane kernel
/// `$body::<B>` (`dpbusd_y`: the same exact i32 either way, so the same bits).
macro_rules! lanes_builds {
    ($body:ident, $plain:ident, $vnni:ident) => {
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn $plain(nb: usize, wd: *const u8, xp: *const u8, out: *mut f32) {
            $body::<PLAIN>(nb, wd, xp, out)
        }
        #[target_feature(enable = "avx2,fma,f16c,avxvnni")]
        unsafe fn $vnni(nb: usize, wd: *const u8, xp: *const u8, out: *mut f32) {
            $body::<VNNI>(nb, wd, xp, out)
        }
    };
}

lanes_builds!(lanes_signed_b, lanes_signed, lanes_signed_vnni);
lanes_builds!(lanes_min_b, lanes_min, lanes_min_vnni);

/// Q4_0 / Q5_0 (and, AVX-VNNI, Q8_0) against a lanes-packed Q8_0 group
/// (`avx2::pack_q8_0_lanes`: per block the 8 columns' d_x, their quads j = 0..8 (8 columns x
/// 4 i8 each), then the offset corrections of each quad): lane j of
/// `avx2::dot_packed_signed`, all 8 columns.
#[inline(always)]
unsafe fn lanes_signed_b<const B: u8>(nb: usize, wd: *const u8, xp: *const u8, out: *mut f32) {
    use super::avx2::{PACK_BLOCK, PACK_COLS};
    let sc = wd.add(32 * nb) as *const f32;
    let magic = _mm256_set1_ps(I2F_MAGIC_F32);
    let mut a = [_mm256_setzero_ps(); 8];
    for i in 0..nb {
        let b = xp.add(i * PACK_BLOCK);
        let d = _mm256_mul_ps(_mm256_set1_ps(sc.add(i).read_unaligned()), _mm256_loadu_ps(b as *const f32));
        let q = wd.add(32 * i);
        for (j, aj) in a.iter_mut().enumerate() {
            let wj = bcast32(q.add(4 * j));
            let y = load256(b.add(4 * PACK_COLS + 32 * j));
            let corr = load256(b.add(4 * PACK_COLS + 256 + 32 * j));
            let s = dpbusd_y::<B>(corr, wj, y);
            *aj = _mm256_fmadd_ps(d, _mm256_sub_ps(_mm256_castsi256_ps(s), magic), *aj);
        }
    }
    _mm256_storeu_ps(out, lanes_tree(&a));
}

/// Q4_1 / Q5_1 against a lanes-packed Q8_1 group (`avx2::pack_q8_1_lanes`: per block the 8
/// columns' d_x, their s_x, then their quads): `avx2::dot_packed_min`, all 8 columns.
#[inline(always)]
unsafe fn lanes_min_b<const B: u8>(nb: usize, wd: *const u8, xp: *const u8, out: *mut f32) {
    use super::avx2::{PACK_BLOCK_Q8_1, PACK_COLS};
    let sc = wd.add(32 * nb) as *const f32;
    let (magic_i, magic) = (_mm256_set1_epi32(I2F_MAGIC), _mm256_set1_ps(I2F_MAGIC_F32));
    let mut a = [_mm256_setzero_ps(); 8];
    let mut summ = _mm256_setzero_ps();
    for i in 0..nb {
        let b = xp.add(i * PACK_BLOCK_Q8_1);
        let d = _mm256_mul_ps(_mm256_set1_ps(sc.add(2 * i).read_unaligned()), _mm256_loadu_ps(b as *const f32));
        let m = _mm256_set1_ps(sc.add(2 * i + 1).read_unaligned());
        summ = _mm256_add_ps(summ, _mm256_mul_ps(m, _mm256_loadu_ps(b.add(4 * PACK_COLS) as *const f32)));
        let q = wd.add(32 * i);
        for (j, aj) in a.iter_mut().enumerate() {
            let wj = bcast32(q.add(4 * j));
            let y = load256(b.add(8 * PACK_COLS + 32 * j));
            let s = dpbusd_y::<B>(magic_i, wj, y);
            *aj = _mm256_fmadd_ps(d, _mm256_sub_ps(_mm256_castsi256_ps(s), magic), *aj);
        }
    }
    _mm256_storeu_ps(out, _mm256_add_ps(lanes_tree(&a), summ));
}

// ------------------------------------------------------------------ packed pairs (AVX-512)

/// The packed signed-family kernel (`avx2::dot_packed_signed`, its E build) for two rows
/// in zmm registers, each holding one row and two columns (lanes 0..8 column 2k, 8..16
/// column 2k + 1): the packed group's quants and corrections of two columns are one
/// 64-byte load shared by both rows, and the scales d_w * d_x of all 8 columns are one
/// 8-lane multiply per row and block (as in the ymm kernel), each column's spread over its
/// half by a permute. Per lane exactly the ymm kernel's operations: the i32 lanes
/// correction + `vpdpbusd`, the f32 scale, one FMA per block, each half's `hsum_ps` at the
/// end. (Two rows x one column per zmm instead, a multiply per column and block and the
/// loads per row: Gemma 3's Q5_0 prefill 42 GMAC/s against 54, one Zen 4 thread.) For odd NC the last zmm's
/// upper half computes a column past NC (in the group's block, d_x 0 or unused) and is
/// dropped.
#[inline(always)]
unsafe fn pair_signed_cols2<const NC: usize, const PREFETCH: bool>(
    nb: usize,
    wa: *const u8,
    wb: *const u8,
    wsize: usize,
    xp: *const u8,
    outa: *mut f32,
    outb: *mut f32,
    ld: usize,
    block: impl Fn(*const u8, usize) -> (f32, __m256i),
) {
    use super::avx2::PACK_BLOCK;
    let np = NC.div_ceil(2);
    let mut acc_a = [_mm512_setzero_ps(); 4];
    let mut acc_b = [_mm512_setzero_ps(); 4];
    let idx = cols2_index();
    // the rows stream from memory in a decode step of several sequences: prefetch in
    // address order a pass ahead (rows a and b are adjacent: `prefetch_step`)
    let dist = super::avx2::PF_AHEAD.max(2 * (wb as usize).wrapping_sub(wa as usize));
    for i in 0..nb {
        if PREFETCH {
            super::avx2::prefetch_step::<false>(wa, dist, i, 2 * wsize);
        }
        let (da, qa) = block(wa, i);
        let (db, qb) = block(wb, i);
        let b = xp.add(i * PACK_BLOCK);
        let dx = _mm256_loadu_ps(b as *const f32);
        let pa = _mm512_castps256_ps512(_mm256_mul_ps(_mm256_set1_ps(da), dx));
        let pb = _mm512_castps256_ps512(_mm256_mul_ps(_mm256_set1_ps(db), dx));
        let (qa, qb) = (_mm512_broadcast_i64x4(qa), _mm512_broadcast_i64x4(qb));
        for k in 0..np {
            let y = _mm512_loadu_si512(b.add(32 + 64 * k) as *const _);
            let corr = _mm512_loadu_si512(b.add(32 + 256 + 64 * k) as *const _);
            let va = _mm512_dpbusd_epi32(corr, qa, y);
            let vb = _mm512_dpbusd_epi32(corr, qb, y);
            acc_a[k] = _mm512_fmadd_ps(_mm512_permutexvar_ps(idx[k], pa), _mm512_cvtepi32_ps(va), acc_a[k]);
            acc_b[k] = _mm512_fmadd_ps(_mm512_permutexvar_ps(idx[k], pb), _mm512_cvtepi32_ps(vb), acc_b[k]);
        }
    }
    hsum_pair_cols2::<NC>(&acc_a, &acc_b, outa, outb, ld);
}

/// The packed min-family kernel (`avx2::dot_packed_min`, its E build: Q4_1 / Q5_1 against
/// a Q8_1 group) for two rows, laid out as `pair_signed_cols2`: per lane exactly its
/// operations (`vpdpbusd` from zero, d_w * d_x of the 8 columns in one multiply, one FMA
/// per block; per row the 8 columns' m_w * s_x summed in lanes), each half's `hsum_ps`
/// plus its column's min sum at the end.
#[inline(always)]
unsafe fn pair_min_cols2<const NC: usize, const PREFETCH: bool>(
    nb: usize,
    wa: *const u8,
    wb: *const u8,
    wsize: usize,
    xp: *const u8,
    outa: *mut f32,
    outb: *mut f32,
    ld: usize,
    block: impl Fn(*const u8, usize) -> ((f32, f32), __m256i),
) {
    use super::avx2::{PACK_BLOCK_Q8_1, PACK_COLS};
    let np = NC.div_ceil(2);
    let mut acc_a = [_mm512_setzero_ps(); 4];
    let mut acc_b = [_mm512_setzero_ps(); 4];
    let (mut summ_a, mut summ_b) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    let idx = cols2_index();
    // the rows stream from memory in a decode step of several sequences: prefetch in
    // address order a pass ahead (rows a and b are adjacent: `prefetch_step`)
    let dist = super::avx2::PF_AHEAD.max(2 * (wb as usize).wrapping_sub(wa as usize));
    for i in 0..nb {
        if PREFETCH {
            super::avx2::prefetch_step::<true>(wa, dist, i, 2 * wsize);
        }
        // (d_w, m_w) as two f32: over decoded rows they are plain loads, which the broadcasts
        // below take straight from memory (from one 8-byte load they were four port-5
        // shuffles per block)
        let (((da, ma), qa), ((db, mb), qb)) = (block(wa, i), block(wb, i));
        let (qa, qb) = (_mm512_broadcast_i64x4(qa), _mm512_broadcast_i64x4(qb));
        let b = xp.add(i * PACK_BLOCK_Q8_1);
        let (dx, sx) = (_mm256_loadu_ps(b as *const f32), _mm256_loadu_ps(b.add(4 * PACK_COLS) as *const f32));
        let pa = _mm512_castps256_ps512(_mm256_mul_ps(_mm256_set1_ps(da), dx));
        let pb = _mm512_castps256_ps512(_mm256_mul_ps(_mm256_set1_ps(db), dx));
        summ_a = _mm256_add_ps(summ_a, _mm256_mul_ps(_mm256_set1_ps(ma), sx));
        summ_b = _mm256_add_ps(summ_b, _mm256_mul_ps(_mm256_set1_ps(mb), sx));
        for k in 0..np {
            let y = _mm512_loadu_si512(b.add(8 * PACK_COLS + 64 * k) as *const _);
            let va = _mm512_dpbusd_epi32(_mm512_setzero_si512(), qa, y);
            let vb = _mm512_dpbusd_epi32(_mm512_setzero_si512(), qb, y);
            acc_a[k] = _mm512_fmadd_ps(_mm512_permutexvar_ps(idx[k], pa), _mm512_cvtepi32_ps(va), acc_a[k]);
            acc_b[k] = _mm512_fmadd_ps(_mm512_permutexvar_ps(idx[k], pb), _mm512_cvtepi32_ps(vb), acc_b[k]);
        }
    }
    // (the one-accumulator-at-a-time reduction: with the min sums, the all-at-once one
    // measured 72.1-72.7 against 74.0-74.3 GMAC/s for SmolLM2's gate/up)
    let (mut sa, mut sb) = ([0f32; PACK_COLS], [0f32; PACK_COLS]);
    _mm256_storeu_ps(sa.as_mut_ptr(), summ_a);
    _mm256_storeu_ps(sb.as_mut_ptr(), summ_b);
    hsum_cols2::<NC>(&acc_a, outa, ld, &sa);
    hsum_cols2::<NC>(&acc_b, outb, ld, &sb);
}

/// outa[c * ld] / outb[c * ld] = `avx2::hsum_ps` of column c's half of rows a's / b's
/// two-column accumulators, c < NC: the same tree (hi + lo quarters, + movehl, + movehdup,
/// one rounding per add, each add's operands in hsum_ps's pairs) for all 16 (row, column)
/// sums at once, as three rounds of shuffles and adds over the 8 accumulators (21 vector
/// ops where `hsum_cols2` per accumulator takes ~60).
#[inline(always)]
unsafe fn hsum_pair_cols2<const NC: usize>(acc_a: &[__m512; 4], acc_b: &[__m512; 4], outa: *mut f32, outb: *mut f32, ld: usize) {
    let x = [acc_a[0], acc_a[1], acc_a[2], acc_a[3], acc_b[0], acc_b[1], acc_b[2], acc_b[3]];
    // four sums per (row, column), lanes l + l+4 of its 8: each 128-bit chunk one (row, column)
    let s: [__m512; 4] = std::array::from_fn(|i| {
        let (p, q) = (x[2 * i], x[2 * i + 1]);
        _mm512_add_ps(_mm512_shuffle_f32x4::<0b11_01_11_01>(p, q), _mm512_shuffle_f32x4::<0b10_00_10_00>(p, q))
    });
    // two per chunk: (0 + 2), (1 + 3) (movehl), of two (row, column) sums
    let z: [__m512; 2] = std::array::from_fn(|i| {
        let (p, q) = (s[2 * i], s[2 * i + 1]);
        _mm512_add_ps(_mm512_shuffle_ps::<0b01_00_01_00>(p, q), _mm512_shuffle_ps::<0b11_10_11_10>(p, q))
    });
    // one per lane (movehdup): lane 4 (c % 4) + 2 row + c / 4 holds (row, c)
    let f = _mm512_add_ps(_mm512_shuffle_ps::<0b10_00_10_00>(z[0], z[1]), _mm512_shuffle_ps::<0b11_01_11_01>(z[0], z[1]));
    let lane = |row: usize, c: usize| 4 * (c % 4) + 2 * row + c / 4;
    let mut v = [0f32; 16];
    _mm512_storeu_ps(v.as_mut_ptr(), f);
    for c in 0..NC {
        *outa.add(c * ld) = v[lane(0, c)];
        *outb.add(c * ld) = v[lane(1, c)];
    }
}

/// out[c] = `avx2::hsum_ps` of column c's half of the two-column accumulators + add[c] (the
/// min family's m_w * s_x sums), c < NC: the same tree (hi + lo quarters, + movehl, + movehdup, each add's operands in
/// hsum_ps's order) run in both halves of a zmm at once.
#[inline(always)]
unsafe fn hsum_cols2<const NC: usize>(acc: &[__m512; 4], out: *mut f32, ld: usize, add: &[f32; super::avx2::PACK_COLS]) {
    for k in 0..NC.div_ceil(2) {
        let v = acc[k];
        // lanes j < 4 of each half: v[j + 4] + v[j]
        let r = _mm512_add_ps(_mm512_shuffle_f32x4::<0b10_11_00_01>(v, v), v);
        // lanes 0, 1 of each half: r[0] + r[2], r[1] + r[3] (movehl)
        let r = _mm512_add_ps(r, _mm512_permute_ps::<0b11_10_11_10>(r));
        // lane 0 of each half: r[0] + r[1] (movehdup)
        let r = _mm512_add_ps(r, _mm512_movehdup_ps(r));
        let lo = _mm512_cvtss_f32(r);
        let hi = _mm_cvtss_f32(_mm512_extractf32x4_ps::<2>(r));
        let (c0, c1) = (2 * k, 2 * k + 1);
        *out.add(c0 * ld) = lo + add[c0];
        if c1 < NC {
            *out.add(c1 * ld) = hi + add[c1];
        }
    }
}

/// The permute indices of the two-column layout: vector k spreads column 2k's scale over
/// lanes 0..8 and column 2k + 1's over 8..16.
#[inline(always)]
unsafe fn cols2_index() -> [__m512i; 4] {
    std::array::from_fn(|k| _mm512_inserti64x4::<1>(_mm512_castsi256_si512(_mm256_set1_epi32(2 * k as i32)), _mm256_set1_epi32(2 * k as i32 + 1)))
}

macro_rules! pair_min_kernel {
    ($name:ident, $wsize:expr, $dec:expr) => {
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
        unsafe fn $name<const NC: usize>(nb: usize, wa: *const u8, wb: *const u8, xp: *const u8, outa: *mut f32, outb: *mut f32, ld: usize) {
            let decode = $dec;
            pair_min_cols2::<NC, true>(nb, wa, wb, $wsize, xp, outa, outb, ld, |w: *const u8, i| {
                let b = w.add(i * $wsize);
                let dm = super::avx2::f16x2(b);
                ((_mm_cvtss_f32(dm), _mm_cvtss_f32(_mm_movehdup_ps(dm))), decode(b))
            })
        }
    };
}

pair_min_kernel!(pair_q4_1, BlockQ4_1::SIZE, |b| super::avx2::q4_1_quants(b));
pair_min_kernel!(pair_q5_1, BlockQ5_1::SIZE, |b| super::avx2::q5_1_quants(b));

macro_rules! pair_kernel {
    ($name:ident, $wsize:expr, $decu:expr) => {
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
        unsafe fn $name<const NC: usize>(nb: usize, wa: *const u8, wb: *const u8, xp: *const u8, outa: *mut f32, outb: *mut f32, ld: usize) {
            let decode = $decu;
            pair_signed_cols2::<NC, true>(nb, wa, wb, $wsize, xp, outa, outb, ld, |w: *const u8, i| decode(w.add(i * $wsize)))
        }
    };
}

/// `pair_min_cols2` over two rows decoded once per matmul (`decode_lanes_q4_1` /
/// `decode_lanes_q5_1`: nb x 32 quant bytes, then nb (d, m) f32 pairs; the same values the
/// raw kernels decode per block, by the same instructions): the prefill of the AVX-512 set's
/// min family, whose raw kernels decode both rows again for every packed group. The same
/// bits as `pair_q4_1` / `pair_q5_1`. (The signed family's prefill: `quad_signed`.)
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn pair_min_decoded<const NC: usize>(nb: usize, wa: *const u8, wb: *const u8, xp: *const u8, outa: *mut f32, outb: *mut f32, ld: usize) {
    pair_min_cols2::<NC, false>(nb, wa, wb, 0, xp, outa, outb, ld, |w: *const u8, i| {
        let dm = (w.add(32 * nb) as *const f32).add(2 * i);
        ((dm.read_unaligned(), dm.add(1).read_unaligned()), load256(w.add(32 * i)))
    })
}

pair_kernel!(pair_q4_0, BlockQ4_0::SIZE, |b| (super::avx2::f16(b), super::avx2::nibbles_32(b.add(2))));
pair_kernel!(pair_q5_0, BlockQ5_0::SIZE, |b| super::avx2::q5_0_unsigned(b));
pair_kernel!(pair_q8_0, BlockQ8_0::SIZE, |b| (super::avx2::f16(b), _mm256_xor_si256(load256(b.add(2)), _mm256_set1_epi8(0x80u8 as i8))));

// ------------------------------------------------------------------ interleaved row pairs

/// Decoded bytes per weight row and block of the interleaved row pairs (`decode_pairs`): per
/// pair and block 64 quant bytes and 64 bytes of offset corrections, then 8 bytes of scales.
pub(crate) const PAIRS_BLOCK_BYTES: usize = 68;

/// Rows a's and b's 32 quant bytes of a block as the interleaved pairs' 16 lanes: [a 0..4,
/// b 0..4, a 4..8, b 4..8, ...] (i32 lane 2l row a's elements 4l..4l+4, lane 2l + 1 row b's).
#[inline(always)]
unsafe fn interleave_pair(qa: __m256i, qb: __m256i) -> __m512i {
    let idx = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    _mm512_permutex2var_epi32(_mm512_castsi256_si512(qa), idx, _mm512_castsi256_si512(qb))
}

/// Decodes rows a and b (`wsize`-byte blocks, `quants(block) -> (d_w, signed i8 quants)`) into
/// the interleaved pair layout of `quad_signed`: per block 16 lanes of 4 quant bytes as
/// [a 0..4, b 0..4, a 4..8, b 4..8, ...] (64 bytes: i32 lane 2l holds row a's elements
/// 4l..4l+4, lane 2l + 1 row b's); after the nb blocks of quants, per block the 16 lanes'
/// i32 corrections `I2F_MAGIC` - 128 * (the sum of the lane's 4 quants) (the kernel's
/// activations are stored + 128 as u8); after those the (d_a, d_b) f32 pair of each block.
///
/// In the BW build (`B` = PLAIN) the corrections' `maddubs` pairs are 128 * (q0 + q1), |.|
/// <= 4096 for Q4_0 / Q5_0 (not Q8_0: 2 * 128 * 128 leaves i16; that build has no Q8_0 pairs).
#[inline(always)]
unsafe fn decode_pairs<const B: u8>(nb: usize, wa: *const u8, wb: *const u8, wsize: usize, dst: *mut u8, quants: impl Fn(*const u8) -> (f32, __m256i)) {
    let top = _mm512_set1_epi8(0x80u8 as i8);
    let sc = dst.add(128 * nb) as *mut f32;
    for i in 0..nb {
        let (da, qa) = quants(wa.add(i * wsize));
        let (db, qb) = quants(wb.add(i * wsize));
        let q = interleave_pair(qa, qb);
        _mm512_storeu_si512(dst.add(64 * i) as *mut _, q);
        let corr = _mm512_sub_epi32(_mm512_set1_epi32(I2F_MAGIC), dpbusd_z::<B>(_mm512_setzero_si512(), top, q));
        _mm512_storeu_si512(dst.add(64 * (nb + i)) as *mut _, corr);
        sc.add(2 * i).write_unaligned(da);
        sc.add(2 * i + 1).write_unaligned(db);
    }
}

/// The AVX-512 VNNI build `$vnni` and the AVX-512 BW build `$bw` (no VNNI) of a zmm
/// function whose body reads the build as the constant `B` (VNNI / PLAIN).
macro_rules! zmm_builds {
    ($vnni:ident, $bw:ident, ($($arg:ident: $t:ty),*), $body:block) => {
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
        unsafe fn $vnni($($arg: $t),*) {
            const B: u8 = VNNI;
            $body
        }
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq")]
        unsafe fn $bw($($arg: $t),*) {
            const B: u8 = PLAIN;
            $body
        }
    };
}

zmm_builds!(decode_pairs_q4_0, decode_pairs_q4_0_bw, (nb: usize, wa: *const u8, wb: *const u8, dst: *mut u8), {
    decode_pairs::<B>(nb, wa, wb, BlockQ4_0::SIZE, dst, |b| {
        (super::avx2::f16(b), _mm256_sub_epi8(super::avx2::nibbles_32(b.add(offset_of!(BlockQ4_0, qs))), _mm256_set1_epi8(8)))
    })
});

zmm_builds!(decode_pairs_q5_0, decode_pairs_q5_0_bw, (nb: usize, wa: *const u8, wb: *const u8, dst: *mut u8), {
    decode_pairs::<B>(nb, wa, wb, BlockQ5_0::SIZE, dst, |b| {
        let (d, u) = super::avx2::q5_0_unsigned(b);
        (d, _mm256_sub_epi8(u, _mm256_set1_epi8(16)))
    })
});

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn decode_pairs_q8_0(nb: usize, wa: *const u8, wb: *const u8, dst: *mut u8) {
    decode_pairs::<VNNI>(nb, wa, wb, BlockQ8_0::SIZE, dst, |b| (super::avx2::f16(b), load256(b.add(offset_of!(BlockQ8_0, qs)))))
}

/// Q8_0 rows a and b for the BW build's sign-trick pairs (`quad_sign`), in the layout of
/// `decode_pairs` (PAIRS_BLOCK_BYTES per row and block) with other contents: per block the
/// 16 lanes' |quants| (as u8: |-128| is 128), then per quad j the 64-bit mask of the bytes
/// whose quant is negative in the pair's broadcast quad (the quad's 8 sign bits, 8 times),
/// then (d_a, d_b).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq")]
unsafe fn decode_pairs_q8_0_bw(nb: usize, wa: *const u8, wb: *const u8, dst: *mut u8) {
    let sc = dst.add(128 * nb) as *mut f32;
    for i in 0..nb {
        let (ba, bb) = (wa.add(i * BlockQ8_0::SIZE), wb.add(i * BlockQ8_0::SIZE));
        let (qa, qb) = (load256(ba.add(offset_of!(BlockQ8_0, qs))), load256(bb.add(offset_of!(BlockQ8_0, qs))));
        let q = interleave_pair(qa, qb);
        _mm512_storeu_si512(dst.add(64 * i) as *mut _, _mm512_abs_epi8(q));
        let neg = _mm512_movepi8_mask(q);
        for j in 0..8 {
            let m = ((neg >> (8 * j)) & 0xFF).wrapping_mul(0x0101_0101_0101_0101);
            (dst.add(64 * (nb + i) + 8 * j) as *mut u64).write_unaligned(m);
        }
        sc.add(2 * i).write_unaligned(super::avx2::f16(ba));
        sc.add(2 * i + 1).write_unaligned(super::avx2::f16(bb));
    }
}

/// Packs a group of `ncols` <= PACK_COLS Q8_0 activation rows (as `avx2::pack_q8_0_cols`)
/// for the interleaved pairs: per block [d_x of column 0, 0, 1, 1, .., 7, 7: 16 f32][quad j
/// = 0..8: 64 bytes, i32 lanes 2c and 2c + 1 holding column c's quants 4j..4j+4, + 128 as
/// u8] (`avx2::PACK_BLOCK` = 576 bytes, every field whole lines). The other columns of a
/// partial group get d_x 0 and quants 0 (their lanes are computed and dropped).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
pub(crate) unsafe fn pack_q8_0_pairs(nb: usize, ncols: usize, x: *const u8, xs: usize, xd: *const f32, xds: usize, dst: *mut u8) {
    pack_q8_0_pairs_flip(nb, ncols, x, xs, xd, xds, dst, _mm512_set1_epi8(0x80u8 as i8))
}

/// `pack_q8_0_pairs` with the quants as they are (i8), for `quad_sign`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
pub(crate) unsafe fn pack_q8_0_pairs_signed(nb: usize, ncols: usize, x: *const u8, xs: usize, xd: *const f32, xds: usize, dst: *mut u8) {
    pack_q8_0_pairs_flip(nb, ncols, x, xs, xd, xds, dst, _mm512_setzero_si512())
}

/// The body of both: each quant byte xor `flip` (`store_quads_twice`).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn pack_q8_0_pairs_flip(nb: usize, ncols: usize, x: *const u8, xs: usize, xd: *const f32, xds: usize, dst: *mut u8, flip: __m512i) {
    use super::avx2::{PACK_BLOCK, PACK_COLS};
    for i in 0..nb {
        let b = dst.add(i * PACK_BLOCK);
        let mut y = [_mm256_setzero_si256(); PACK_COLS];
        for c in 0..PACK_COLS {
            let d = if c < ncols { std::ptr::read_unaligned(xd.add(c * xds + i)) } else { 0.0 };
            (b as *mut f32).add(2 * c).write_unaligned(d);
            (b as *mut f32).add(2 * c + 1).write_unaligned(d);
            if c < ncols {
                y[c] = load256(x.add(c * xs + i * BlockQ8_0::SIZE + offset_of!(BlockQ8_0, qs)));
            }
        }
        store_quads_twice(&y, b.add(64), flip);
    }
}


/// The interleaved pairs' activation quads of one block: 8 columns' 32 quants `y` (a
/// partial group's other columns zero) as quad j = 0..8 at `dst + 64 j`, i32 lanes 2c and 2c
/// + 1 holding column c's quants 4j..4j+4, each byte xor `flip` (0x80: + 128 as u8).
#[inline(always)]
unsafe fn store_quads_twice(y: &[__m256i; 8], dst: *mut u8, flip: __m512i) {
    let dup = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    // row j of the transpose: quad j of columns 0..8
    for (j, t) in super::avx2::transpose8_epi32(y).iter().enumerate() {
        let v = _mm512_xor_si512(_mm512_permutexvar_epi32(dup, _mm512_castsi256_si512(*t)), flip);
        _mm512_storeu_si512(dst.add(64 * j) as *mut _, v);
    }
}

/// The AVX-512 signed family's prefill (Q4_0 / Q5_0 / Q8_0 against Q8_0) over P = 1 or 2
/// row pairs decoded interleaved (`decode_pairs`, at w0 and w1) and a group packed by
/// `pack_q8_0_pairs`, in column lanes: accumulator A_j of a pair holds lane j (elements
/// 4j..4j+4 of each block) of every (column c, row r) in zmm lane 2c + r. Per block and
/// quad j, one `vpdpbusd` of the 8 columns' quads (+ 128) against the pair's two weight
/// quads (a 64-bit broadcast from the decoded row), started from the decoded correction
/// (`I2F_MAGIC` - 128 * the quad's weight sum, a broadcast too), gives in lane 2c + r
/// exactly the i32 sum of lane j of (row r, column c) that the plain kernels compute (sum
/// of 4 q_w * q_x) plus 1.5 * 2^23, so f32 of it is one subtract; ONE vector of scales d_r
/// * d_x(c) per pair and block (one multiply, the products as the plain kernel's) serves all
/// 8 A_j: acc = fma(d, f32(lanes), acc). At the end each (row, column)'s sum is
/// `avx2::hsum_ps`'s tree over its 8 lanes, here lane-wise over the A_j ((A0 + A4) + (A2
/// + A6)) + ((A1 + A5) + (A3 + A7)). Each (row, column) gets the plain kernel's operations in
/// its order: the same bits. Per row pair and block 25 vector operations and no shuffle
/// (the row-major layout before it, one accumulator per column, needed the scales spread
/// per column: 27 operations and 8 broadcasts of a just-stored vector; in L1, Gemma 3's
/// Q5_0 rows, 4 rows x 8 columns of 20 blocks, 18.3 -> 16.5 cycles per row pair and block
/// at 3.5 GHz). Rows 2p, 2p + 1 of column c go to `out[c * ld + 2p + {0, 1}]`. The BW
/// build (`B` = PLAIN) runs Q4_0 / Q5_0: its `maddubs` pairs are at most 2 * 255 * 16 = 8160.
#[inline(always)]
unsafe fn quad_signed<const B: u8, const P: usize, const NC: usize>(nb: usize, w0: *const u8, w1: *const u8, xp: *const u8, out: *mut f32, ld: usize) {
    use super::avx2::PACK_BLOCK;
    let wp = [w0, w1];
    let mut acc = [[_mm512_setzero_ps(); 8]; P];
    for i in 0..nb {
        let b = xp.add(i * PACK_BLOCK);
        let dx = _mm512_loadu_ps(b as *const f32);
        let d: [__m512; P] = std::array::from_fn(|p| _mm512_mul_ps(dx, _mm512_castpd_ps(_mm512_set1_pd(std::ptr::read_unaligned((wp[p].add(128 * nb) as *const f64).add(i))))));
        for j in 0..8 {
            let u = _mm512_loadu_si512(b.add(64 + 64 * j) as *const _);
            for p in 0..P {
                let wq = _mm512_set1_epi64(std::ptr::read_unaligned(wp[p].add(64 * i + 8 * j) as *const i64));
                let corr = _mm512_set1_epi64(std::ptr::read_unaligned(wp[p].add(64 * (nb + i) + 8 * j) as *const i64));
                let v = dpbusd_z::<B>(corr, u, wq);
                let f = _mm512_sub_ps(_mm512_castsi512_ps(v), _mm512_set1_ps(I2F_MAGIC_F32));
                acc[p][j] = _mm512_fmadd_ps(d[p], f, acc[p][j]);
            }
        }
    }
    // lane 2c + r: (row r, column c)
    let r: [__m512; P] = std::array::from_fn(|p| lanes_tree_512(&acc[p]));
    store_quad::<P, NC>(&r, out, ld);
}

/// Q8_0 in the BW build (no VNNI): `quad_signed`'s lanes and float steps, the i32 sums by the
/// sign trick instead of an offset, since Q8_0's quants against the activations + 128 would
/// leave i16 in `maddubs` pairs: the activations (packed as i8, `pack_q8_0_pairs_signed`)
/// negated where the weight is negative (the decoded mask, `decode_pairs_q8_0_bw`), against
/// |w| as u8, give |w| * (+-x) = w * x exactly, at most 2 * 128 * 127 = 32512 per pair; the
/// i32 sum needs no correction, so f32 of it is one conversion. The same i32 and the same
/// float steps per (row, column): the same bits as `quad_signed`.
#[inline(always)]
unsafe fn quad_sign<const P: usize, const NC: usize>(nb: usize, w0: *const u8, w1: *const u8, xp: *const u8, out: *mut f32, ld: usize) {
    use super::avx2::PACK_BLOCK;
    let wp = [w0, w1];
    let ones = _mm512_set1_epi16(1);
    let mut acc = [[_mm512_setzero_ps(); 8]; P];
    for i in 0..nb {
        let b = xp.add(i * PACK_BLOCK);
        let dx = _mm512_loadu_ps(b as *const f32);
        let d: [__m512; P] = std::array::from_fn(|p| _mm512_mul_ps(dx, _mm512_castpd_ps(_mm512_set1_pd(std::ptr::read_unaligned((wp[p].add(128 * nb) as *const f64).add(i))))));
        for j in 0..8 {
            let x = _mm512_loadu_si512(b.add(64 + 64 * j) as *const _);
            for p in 0..P {
                let wq = _mm512_set1_epi64(std::ptr::read_unaligned(wp[p].add(64 * i + 8 * j) as *const i64));
                let neg: __mmask64 = std::ptr::read_unaligned(wp[p].add(64 * (nb + i) + 8 * j) as *const u64);
                let xs = _mm512_mask_sub_epi8(x, neg, _mm512_setzero_si512(), x);
                let v = _mm512_madd_epi16(_mm512_maddubs_epi16(wq, xs), ones);
                // (a conversion here measured faster than the magic's add and subtract: 56 vs
                // 50 GMAC/s, Gemma 3's v)
                acc[p][j] = _mm512_fmadd_ps(d[p], _mm512_cvtepi32_ps(v), acc[p][j]);
            }
        }
    }
    let r: [__m512; P] = std::array::from_fn(|p| lanes_tree_512(&acc[p]));
    store_quad::<P, NC>(&r, out, ld);
}

/// 128-bit chunk j of v to `out[(c0 + 2 j) * ld..]` (column c0 + 2j's four rows), for the
/// columns below NC.
#[inline(always)]
unsafe fn store_chunks<const NC: usize>(v: __m512, out: *mut f32, ld: usize, c0: usize) {
    if c0 < NC {
        _mm_storeu_ps(out.add(c0 * ld), _mm512_castps512_ps128(v));
    }
    if c0 + 2 < NC {
        _mm_storeu_ps(out.add((c0 + 2) * ld), _mm512_extractf32x4_ps::<1>(v));
    }
    if c0 + 4 < NC {
        _mm_storeu_ps(out.add((c0 + 4) * ld), _mm512_extractf32x4_ps::<2>(v));
    }
    if c0 + 6 < NC {
        _mm_storeu_ps(out.add((c0 + 6) * ld), _mm512_extractf32x4_ps::<3>(v));
    }
}

/// Decoded bytes per weight row and block of the min family's interleaved row pairs
/// (`decode_pairs_min`): per pair and block 64 quant bytes, then 16 bytes of (d_a, d_b,
/// m_a, m_b).
pub(crate) const PAIRS_MIN_BLOCK_BYTES: usize = 40;

/// The fewest rows per decoded block (`matmul::lanes_rows`) with which the matmul gives the
/// min family's interleaved pairs their rows: their groups (`PACK_BLOCK_PAIRS_Q8_1`, twice
/// `pair_min_decoded`'s bytes) pass L1 for long rows, and are read from L2 once per block.
/// `--bench prefill`, one thread, rows of 4096 (128 blocks, an 82 KB group) against
/// `pair_min_decoded`: 64 KB blocks (12 rows) 53 vs 66 GMAC/s, 512 KB blocks (102 rows) 89
/// vs 76; SmolLM2's Q4_1 down (48 blocks, 34 rows in 64 KB) 74.4 vs 74.1.
const PAIRS_MIN_ROWS: usize = 32;

/// Bytes of one block of a group packed by `pack_q8_1_pairs`.
pub(crate) const PACK_BLOCK_PAIRS_Q8_1: usize = 64 + 64 + 64 * super::avx2::PACK_COLS;

/// `decode_pairs` for the min family (Q4_1 / Q5_1): the unsigned quants interleaved the same
/// way (no correction: they are `vpdpbusd`'s unsigned operand), then per block (d_a, d_b,
/// m_a, m_b) as f32.
#[inline(always)]
unsafe fn decode_pairs_min(nb: usize, wa: *const u8, wb: *const u8, wsize: usize, dst: *mut u8, quants: impl Fn(*const u8) -> __m256i) {
    let sc = dst.add(64 * nb) as *mut f32;
    for i in 0..nb {
        let (ba, bb) = (wa.add(i * wsize), wb.add(i * wsize));
        let q = interleave_pair(quants(ba), quants(bb));
        _mm512_storeu_si512(dst.add(64 * i) as *mut _, q);
        // the hardware conversions, as the packed kernels (a NaN scale keeps its bits)
        sc.add(4 * i).write_unaligned(super::avx2::f16(ba));
        sc.add(4 * i + 1).write_unaligned(super::avx2::f16(bb));
        sc.add(4 * i + 2).write_unaligned(super::avx2::f16(ba.add(2)));
        sc.add(4 * i + 3).write_unaligned(super::avx2::f16(bb.add(2)));
    }
}

// (no `vpdpbusd` in these: one build serves both AVX-512 sets)
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
unsafe fn decode_pairs_q4_1(nb: usize, wa: *const u8, wb: *const u8, dst: *mut u8) {
    decode_pairs_min(nb, wa, wb, BlockQ4_1::SIZE, dst, |b| super::avx2::q4_1_quants(b))
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
unsafe fn decode_pairs_q5_1(nb: usize, wa: *const u8, wb: *const u8, dst: *mut u8) {
    decode_pairs_min(nb, wa, wb, BlockQ5_1::SIZE, dst, |b| super::avx2::q5_1_quants(b))
}

/// Packs a group of `ncols` <= PACK_COLS Q8_1 activation rows (as `avx2::pack_q8_1_cols`)
/// for the min family's interleaved pairs: per block [d_x of column 0, 0, 1, 1, .., 7, 7:
/// 16 f32][s_x the same][quad j = 0..8: 64 bytes, i32 lanes 2c and 2c + 1 holding column
/// c's quants 4j..4j+4, as i8] (`PACK_BLOCK_PAIRS_Q8_1` = 640 bytes, every field whole
/// lines). The other columns of a partial group get zeros.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
pub(crate) unsafe fn pack_q8_1_pairs(nb: usize, ncols: usize, x: *const u8, xs: usize, xd: *const f32, xds: usize, dst: *mut u8) {
    use super::avx2::PACK_COLS;
    for i in 0..nb {
        let b = dst.add(i * PACK_BLOCK_PAIRS_Q8_1);
        let mut y = [_mm256_setzero_si256(); PACK_COLS];
        for c in 0..PACK_COLS {
            let (d, sx) = if c < ncols { (std::ptr::read_unaligned(xd.add(c * xds + 2 * i)), std::ptr::read_unaligned(xd.add(c * xds + 2 * i + 1))) } else { (0.0, 0.0) };
            for k in 0..2 {
                (b as *mut f32).add(2 * c + k).write_unaligned(d);
                (b as *mut f32).add(16 + 2 * c + k).write_unaligned(sx);
            }
            if c < ncols {
                y[c] = load256(x.add(c * xs + i * BlockQ8_1::SIZE + offset_of!(BlockQ8_1, qs)));
            }
        }
        store_quads_twice(&y, b.add(128), _mm512_setzero_si512());
    }
}

/// The min family's prefill (Q4_1 / Q5_1 against Q8_1) over P = 1 or 2 row pairs decoded
/// interleaved (`decode_pairs_min`) and a group packed by `pack_q8_1_pairs`, in column lanes
/// as `quad_signed`: per lane the operations of `pair_min_cols2` (and so of
/// `avx2::dot_packed_min`): `vpdpbusd` (from `I2F_MAGIC`, f32 by a subtract), d_w * d_x in
/// one multiply per pair and block, one FMA per block; per (row, column) the sum of m_w *
/// s_x (a multiply and an add per block, lane 2c + r as the sums'); at the end each (row,
/// column)'s `hsum_ps` tree (lane-wise over the A_j) plus its min sum. The same bits as
/// `pair_min_decoded`. The BW build's `maddubs` pairs (the weights' 4- or 5-bit codes
/// against the i8 activations) are at most 2 * 31 * 128 = 7936.
#[inline(always)]
unsafe fn quad_min<const B: u8, const P: usize, const NC: usize>(nb: usize, w0: *const u8, w1: *const u8, xp: *const u8, out: *mut f32, ld: usize) {
    let wp = [w0, w1];
    let mut acc = [[_mm512_setzero_ps(); 8]; P];
    let mut summ = [_mm512_setzero_ps(); P];
    let magic = _mm512_set1_epi32(I2F_MAGIC);
    for i in 0..nb {
        let b = xp.add(i * PACK_BLOCK_PAIRS_Q8_1);
        let dm = |p: usize, k: usize| _mm512_castpd_ps(_mm512_set1_pd(std::ptr::read_unaligned((wp[p].add(64 * nb + 16 * i + 8 * k)) as *const f64)));
        let sx = _mm512_loadu_ps(b.add(64) as *const f32);
        for (p, sm) in summ.iter_mut().enumerate() {
            *sm = _mm512_add_ps(*sm, _mm512_mul_ps(dm(p, 1), sx));
        }
        let dx = _mm512_loadu_ps(b as *const f32);
        let d: [__m512; P] = std::array::from_fn(|p| _mm512_mul_ps(dx, dm(p, 0)));
        for j in 0..8 {
            let u = _mm512_loadu_si512(b.add(128 + 64 * j) as *const _);
            for p in 0..P {
                let wq = _mm512_set1_epi64(std::ptr::read_unaligned(wp[p].add(64 * i + 8 * j) as *const i64));
                let v = dpbusd_z::<B>(magic, wq, u);
                let f = _mm512_sub_ps(_mm512_castsi512_ps(v), _mm512_set1_ps(I2F_MAGIC_F32));
                acc[p][j] = _mm512_fmadd_ps(d[p], f, acc[p][j]);
            }
        }
    }
    let r: [__m512; P] = std::array::from_fn(|p| _mm512_add_ps(lanes_tree_512(&acc[p]), summ[p]));
    store_quad::<P, NC>(&r, out, ld);
}

/// `hsum_ps`'s tree over 8 lane accumulators, lane-wise: ((A0 + A4) + (A2 + A6)) + ((A1 +
/// A5) + (A3 + A7)).
#[inline(always)]
unsafe fn lanes_tree_512(a: &[__m512; 8]) -> __m512 {
    let e = _mm512_add_ps(_mm512_add_ps(a[0], a[4]), _mm512_add_ps(a[2], a[6]));
    let o = _mm512_add_ps(_mm512_add_ps(a[1], a[5]), _mm512_add_ps(a[3], a[7]));
    _mm512_add_ps(e, o)
}

/// The sums of P row pairs (lane 2c + r of r[p]: row 2p + r, column c) to `out[c * ld + 2p
/// + r]` for c < NC: two pairs as one 16-byte store per column (its four rows adjacent).
#[inline(always)]
unsafe fn store_quad<const P: usize, const NC: usize>(r: &[__m512; P], out: *mut f32, ld: usize) {
    if P == 2 {
        // chunk k of lo / hi: column 2k / 2k + 1's four sums
        let (r0, r1) = (_mm512_castps_pd(r[0]), _mm512_castps_pd(r[P - 1]));
        let (lo, hi) = (_mm512_castpd_ps(_mm512_unpacklo_pd(r0, r1)), _mm512_castpd_ps(_mm512_unpackhi_pd(r0, r1)));
        store_chunks::<NC>(lo, out, ld, 0);
        store_chunks::<NC>(hi, out, ld, 1);
    } else {
        let mut t = [0f32; 16];
        _mm512_storeu_ps(t.as_mut_ptr(), r[0]);
        for c in 0..NC {
            *out.add(c * ld) = t[2 * c];
            *out.add(c * ld + 1) = t[2 * c + 1];
        }
    }
}

macro_rules! quad_kernel {
    ($name:ident, $features:literal, $body:ident, $b:expr, $p:expr) => {
        #[target_feature(enable = $features)]
        unsafe fn $name<const NC: usize>(nb: usize, w0: *const u8, w1: *const u8, xp: *const u8, out: *mut f32, ld: usize) {
            $body::<$b, $p, NC>(nb, w0, w1, xp, out, ld)
        }
    };
    ($name:ident, $features:literal, $body:ident, $p:expr) => {
        #[target_feature(enable = $features)]
        unsafe fn $name<const NC: usize>(nb: usize, w0: *const u8, w1: *const u8, xp: *const u8, out: *mut f32, ld: usize) {
            $body::<$p, NC>(nb, w0, w1, xp, out, ld)
        }
    };
}
quad_kernel!(quad_two, "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni", quad_signed, VNNI, 2);
quad_kernel!(quad_one, "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni", quad_signed, VNNI, 1);
quad_kernel!(quad_min_two, "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni", quad_min, VNNI, 2);
quad_kernel!(quad_min_one, "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni", quad_min, VNNI, 1);
// the BW build: the signed family's Q4_0 / Q5_0 (see `quad_signed`)
quad_kernel!(quad_two_bw, "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq", quad_signed, PLAIN, 2);
quad_kernel!(quad_one_bw, "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq", quad_signed, PLAIN, 1);
quad_kernel!(quad_min_two_bw, "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq", quad_min, PLAIN, 2);
quad_kernel!(quad_min_one_bw, "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq", quad_min, PLAIN, 1);
// the BW build's Q8_0 (see `quad_sign`)
quad_kernel!(quad_sign_two, "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq", quad_sign, 2);
quad_kernel!(quad_sign_one, "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq", quad_sign, 1);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::{self, avx2, KernelSet};

    fn next(s: &mut u64) -> u64 {
        *s ^= *s << 13;
        *s ^= *s >> 7;
        *s ^= *s << 17;
        *s
    }

    #[test]
    fn row_block_kernels_equal_tile_kernels_bit_for_bit() {
        // Every (row, column) of every build and column count must be exactly what the
        // single-column tile kernel gives, also at the extremes: all weight quants at
        // their top (0xFF bytes, 6-bit scales 63 / i8 scales -1), all at zero, activations
        // at +-127 and -128 (the i16 bounds of the plain build).
        if !quant::avx2_available() {
            return;
        }
        let mut builds = vec![PackBuild::Plain];
        if is_x86_feature_detected!("avxvnni") {
            builds.push(PackBuild::Vnni);
        }
        if quant::avx512_available() {
            builds.push(PackBuild::Evex);
        }
        if quant::avx512bw_available() {
            builds.push(PackBuild::Bw);
        }
        let mut s = 0x51ab_7c11_d00d_f00du64;
        for ty in [GgmlType::Q4_K, GgmlType::Q6_K] {
            let nsb = 3;
            let n = 256 * nsb;
            let wrow = ty.row_size(n).unwrap();
            let xrow = GgmlType::Q8_K.row_size(n).unwrap();
            let one = quant::table::table(KernelSet::Avx2).get(ty).tiled.unwrap().one();
            // the most rows of any build's block (RZ); each build reads its first k.rows
            const RB: usize = RZ;
            for case in 0..6 {
                let mut w: Vec<u8> = (0..wrow * RB).map(|_| next(&mut s) as u8).collect();
                match case {
                    1 => w.fill(0xFF),
                    2 => w.fill(0),
                    _ => {}
                }
                // finite f16 scales (except in case 1)
                for r in 0..RB {
                    for i in 0..nsb {
                        let offs: &[usize] = if ty == GgmlType::Q4_K { &[0, 2] } else { &[208] };
                        for &o in offs {
                            let v = if case == 1 { 0x3C00u16 } else { half::f16::from_f32((next(&mut s) % 100) as f32 * 1e-3 - 0.03).to_bits() };
                            let at = r * wrow + i * ty.type_size() + o;
                            w[at..at + 2].copy_from_slice(&v.to_le_bytes());
                        }
                    }
                }
                let nx = 8;
                let mut xq = vec![0u8; xrow * nx];
                for c in 0..nx {
                    let x: Vec<f32> = (0..n)
                        .map(|k| match case {
                            3 => 1.0,
                            4 => if k % 2 == 0 { -1.0 } else { 1.0 },
                            5 => -1.0,
                            _ => (next(&mut s) % 2001) as f32 / 1000.0 - 1.0,
                        })
                        .collect();
                    quant::quantize_row_act(GgmlType::Q8_K, &x, &mut xq[c * xrow..(c + 1) * xrow]).unwrap();
                }
                for &build in &builds {
                    let k = kernels_with(ty, build).unwrap();
                    let mut buf = vec![0u8; nsb * k.sb_bytes];
                    unsafe { (k.repack)(nsb, w.as_ptr(), wrow, buf.as_mut_ptr()) };
                    for nc in 1..=k.tile {
                        let mut got = vec![f32::NAN; nc * RB];
                        unsafe { (k.cols[nc].unwrap())(nsb, buf.as_ptr(), xq.as_ptr(), xrow, got.as_mut_ptr(), RB) };
                        for c in 0..nc {
                            for r in 0..k.rows {
                                let mut want = 0f32;
                                unsafe { one(n, w.as_ptr().add(r * wrow), xq.as_ptr().add(c * xrow), 0, std::ptr::null(), 0, &mut want) };
                                assert_eq!(got[c * RB + r].to_bits(), want.to_bits(), "{ty} {build:?} nc={nc} case {case} row {r} col {c}: {} vs {want}", got[c * RB + r]);
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn row_block_matmul_equals_single_vec_dot_bit_for_bit() {
        // The matmul's row-block path (row blocks split over 1 and 2 threads, the rows left
        // after the blocks on the tiles, token tiles plus a partial one, a row range that
        // starts inside the matrix, a wider output stride) gives each element exactly what
        // one vec_dot gives, in both SIMD sets.
        use crate::model::TensorView;
        use crate::ops::matmul::matmul_with;
        use crate::threadpool::ThreadPool;
        if !quant::avx2_available() {
            return;
        }
        let mut sets = vec![KernelSet::Avx2];
        if quant::avx512_available() {
            sets.push(KernelSet::Avx512);
        }
        if quant::avx512bw_available() {
            sets.push(KernelSet::Avx512Bw);
        }
        let mut s = 0x0dd_ba11_u64;
        // Q4_0/Q5_0/Q8_0: the packed path's row pairs of the AVX-512 set (43 tokens: more
        // than ROW_OUTER_GROUPS groups; 13: a decode step's row-outer loop over 2 groups;
        // a partial last group, an odd row count); Q4_0/Q5_0/Q4_1/Q5_1 in the plain
        // AVX2 build: the column-lane path at 43 tokens, in one block of decoded rows (n_in
        // 512) and in several (n_in 4096: 14 rows per block; 16384: 3), and 8 rows at a time
        // for 13 and 8 tokens (a decode step's 2 groups, one full group)
        let cases = [
            (GgmlType::Q4_K, 512),
            (GgmlType::Q6_K, 512),
            (GgmlType::Q4_0, 512),
            (GgmlType::Q5_0, 512),
            (GgmlType::Q8_0, 512),
            (GgmlType::Q4_1, 512),
            (GgmlType::Q5_1, 512),
            (GgmlType::Q5_0, 4096),
            (GgmlType::Q4_1, 4096),
            // rows longer than a decoded block holds 8 of (the decode step's 8 rows at a time)
            (GgmlType::Q5_0, 16384),
        ];
        for (ty, n_in) in cases {
            let n_out = 45;
            let wrow = ty.row_size(n_in).unwrap();
            let mut w: Vec<u8> = (0..wrow * n_out).map(|_| next(&mut s) as u8).collect();
            for blk in w.chunks_exact_mut(ty.type_size()) {
                let offs: &[usize] = match ty {
                    GgmlType::Q4_K | GgmlType::Q4_1 | GgmlType::Q5_1 => &[0, 2],
                    GgmlType::Q6_K => &[208],
                    _ => &[0],
                };
                for &o in offs {
                    let v = half::f16::from_f32((next(&mut s) % 100) as f32 * 1e-3 - 0.03).to_bits();
                    blk[o..o + 2].copy_from_slice(&v.to_le_bytes());
                }
            }
            let tv = TensorView { name: "w", ty, ne: [n_in, n_out, 1, 1], data: &w, layout: crate::model::Layout::Plain };
            for n_tok in [43, 13, 8] {
            let x: Vec<f32> = (0..n_in * n_tok).map(|_| (next(&mut s) % 2001) as f32 / 1000.0 - 1.0).collect();
            let vdt = quant::vec_dot_type(ty);
            let xrow = vdt.row_size(n_in).unwrap();
            let mut xq = vec![0u8; xrow * n_tok];
            for t in 0..n_tok {
                quant::quantize_row_act(vdt, &x[t * n_in..(t + 1) * n_in], &mut xq[t * xrow..(t + 1) * xrow]).unwrap();
            }
            for set in &sets {
                let k_quant = matches!(ty, GgmlType::Q4_K | GgmlType::Q6_K);
                assert!(!k_quant || quant::table::table(*set).get(ty).row_block.is_some() || super::super::cpu::env().no_rb);
                let lanes = matches!(ty, GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q4_1 | GgmlType::Q5_1)
                    && (*set == KernelSet::Avx2 && !quant::avx2::vnni_available() || *set == KernelSet::Avx512Bw);
                assert!(!lanes || quant::table::table(*set).get(ty).packed.unwrap().lanes.is_some() || super::super::cpu::env().no_rb);
                let dot = quant::vec_dot_fn(ty, *set).unwrap();
                for threads in [1, 2] {
                    let pool = ThreadPool::new(threads);
                    for (r0, r1, ld) in [(0, n_out, n_out), (3, 40, 50)] {
                        let mut out = vec![f32::NAN; ld * n_tok];
                        let mut scratch = Vec::new();
                        matmul_with(&pool, *set, &tv, &x, n_tok, &mut out, ld, r0..r1, &mut scratch).unwrap();
                        for t in 0..n_tok {
                            for r in r0..r1 {
                                let want = dot(n_in, &w[r * wrow..(r + 1) * wrow], &xq[t * xrow..(t + 1) * xrow]);
                                let got = out[t * ld + r - r0];
                                assert_eq!(got.to_bits(), want.to_bits(), "{ty} {set:?} n_tok={n_tok} threads={threads} rows {r0}..{r1} t={t} r={r}");
                            }
                        }
                    }
                }
            }
            }
        }
    }

    #[test]
    fn interleaved_pair_kernels_equal_single_column_kernels_bit_for_bit() {
        // The AVX-512 set's kernels over interleaved row pairs (signed and min families; two pairs and one pair per
        // call, a row paired with itself, every column count) equal the plain single-column
        // kernel bit for bit, and write only their rows and columns (random and extreme
        // blocks: case 1's 0xFF bytes make every d a NaN and every Q8_0 quant -1; case 4's
        // Q8_0 quants are all -128 against activations at +-127), in both AVX-512 builds.
        let mut sets = Vec::new();
        if quant::avx512_available() {
            sets.push(KernelSet::Avx512);
        }
        if quant::avx512bw_available() {
            sets.push(KernelSet::Avx512Bw);
        }
        let mut s = 0x51de_f00d_u64;
        for ty in [GgmlType::Q4_0, GgmlType::Q5_0, GgmlType::Q8_0, GgmlType::Q4_1, GgmlType::Q5_1] {
            for (set, nb) in sets.iter().flat_map(|&set| [(set, 5), (set, 20)]) {
                let n = 32 * nb;
                let wrow = ty.row_size(n).unwrap();
                let vdt = quant::vec_dot_type(ty);
                let q81 = vdt == GgmlType::Q8_1;
                let xrow = vdt.row_size(n).unwrap();
                let opt = quant::table::Options { vnni: false, dotprod: false, llamacpp_order: false, no_cols: false, no_rows: false, no_rb: false };
                let one = quant::table::build(KernelSet::Avx2, opt).get(ty).tiled.unwrap().one();
                let pd = quant::table::build(set, opt).get(ty).packed.unwrap().pairs_decoded.expect("interleaved pair kernels");
                for case in 0..5 {
                    let mut w: Vec<u8> = (0..4 * wrow).map(|_| next(&mut s) as u8).collect();
                    match case {
                        1 => w.fill(0xFF),
                        2 => w.fill(0),
                        4 if ty == GgmlType::Q8_0 => w.fill(0x80),
                        _ => {}
                    }
                    if case != 1 {
                        for blk in w.chunks_exact_mut(ty.type_size()) {
                            // finite d (and m)
                            for f in 0..(1 + q81 as usize) {
                                let d = half::f16::from_f32((next(&mut s) % 100) as f32 * 1e-3 - 0.03).to_bits();
                                blk[2 * f..2 * f + 2].copy_from_slice(&d.to_le_bytes());
                            }
                        }
                    }
                    let mut xq = vec![0u8; xrow * avx2::PACK_COLS];
                    for c in 0..avx2::PACK_COLS {
                        let x: Vec<f32> = (0..n)
                            .map(|k| match case {
                                3 => if k % 3 == 0 { -1.0 } else { 1.0 },
                                4 => if (k + c) % 2 == 0 { -1.0 } else { 1.0 },
                                _ => (next(&mut s) % 2001) as f32 / 1000.0 - 1.0,
                            })
                            .collect();
                        quant::quantize_row_act(vdt, &x, &mut xq[c * xrow..(c + 1) * xrow]).unwrap();
                    }
                    // the block scales the matmul precomputes: d (Q8_0) or (d, s) (Q8_1)
                    let per = 1 + q81 as usize;
                    let xd = avx2::block_scales_for_test(&xq, xrow, vdt, avx2::PACK_COLS, nb);
                    let want = |r: usize, c: usize| {
                        let mut v = 0f32;
                        unsafe { one(n, w.as_ptr().add(r * wrow), xq.as_ptr().add(c * xrow), 0, std::ptr::null(), 0, &mut v) };
                        v
                    };
                    let db = 2 * nb * pd.block_bytes;
                    let mut dec = vec![0xA5u8; 3 * db];
                    unsafe {
                        (pd.decode)(nb, w.as_ptr(), w.as_ptr().add(wrow), dec.as_mut_ptr());
                        (pd.decode)(nb, w.as_ptr().add(2 * wrow), w.as_ptr().add(3 * wrow), dec.as_mut_ptr().add(db));
                        // the last row of an odd block, paired with itself
                        (pd.decode)(nb, w.as_ptr().add(3 * wrow), w.as_ptr().add(3 * wrow), dec.as_mut_ptr().add(2 * db));
                    }
                    for nc in 1..=avx2::PACK_COLS {
                        let mut packed = vec![0xA5u8; nb * pd.pack_block];
                        unsafe { (pd.pack)(nb, nc, xq.as_ptr(), xrow, xd.as_ptr(), nb * per, packed.as_mut_ptr()) };
                        // 4 rows, column stride 5: the fifth of each column untouched
                        let mut g = [f32::NAN; 5 * 8];
                        unsafe { (pd.two[nc].unwrap())(nb, dec.as_ptr(), dec.as_ptr().add(db), packed.as_ptr(), g.as_mut_ptr(), 5) };
                        let mut h = [f32::NAN; 3 * 8];
                        unsafe { (pd.one[nc].unwrap())(nb, dec.as_ptr().add(db), dec.as_ptr().add(db), packed.as_ptr(), h.as_mut_ptr(), 3) };
                        let mut t = [f32::NAN; 2 * 8];
                        unsafe { (pd.one[nc].unwrap())(nb, dec.as_ptr().add(2 * db), dec.as_ptr().add(2 * db), packed.as_ptr(), t.as_mut_ptr(), 2) };
                        for c in 0..8 {
                            let inside = c < nc;
                            assert!(g[5 * c + 4].is_nan() && h[3 * c + 2].is_nan() && (inside || g[5 * c].is_nan() && h[3 * c].is_nan() && t[2 * c].is_nan()), "{ty} nc={nc}: wrote outside its rows / columns");
                        }
                        for c in 0..nc {
                            for r in 0..4 {
                                assert_eq!(g[5 * c + r].to_bits(), want(r, c).to_bits(), "{ty} {set:?} nb={nb} two pairs nc={nc} case {case} row {r} col {c}");
                            }
                            for r in 0..2 {
                                assert_eq!(h[3 * c + r].to_bits(), want(2 + r, c).to_bits(), "{ty} {set:?} nb={nb} one pair nc={nc} case {case} row {} col {c}", 2 + r);
                                assert_eq!(t[2 * c + r].to_bits(), want(3, c).to_bits(), "{ty} {set:?} nb={nb} row with itself nc={nc} case {case} col {c}");
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn packed_pair_kernels_equal_single_column_kernels_bit_for_bit() {
        // Both rows of the AVX-512 two-row packed kernels, over raw and over decoded rows,
        // every column count, equal the plain single-column kernel bit for bit (random and
        // extreme blocks: case 1's 0xFF bytes make every d a NaN).
        if !quant::avx512_available() {
            return;
        }
        let mut s = 0x9a1f_u64;
        for ty in [GgmlType::Q4_0, GgmlType::Q5_0, GgmlType::Q8_0, GgmlType::Q4_1, GgmlType::Q5_1] {
            let nb = 5;
            let n = 32 * nb;
            let wrow = ty.row_size(n).unwrap();
            let vdt = quant::vec_dot_type(ty);
            let q81 = vdt == GgmlType::Q8_1;
            let xrow = vdt.row_size(n).unwrap();
            let opt = quant::table::Options { vnni: false, dotprod: false, llamacpp_order: false, no_cols: false, no_rows: false, no_rb: false };
            let tk = *quant::table::build(KernelSet::Avx2, opt).get(ty);
            let p512 = quant::table::build(KernelSet::Avx512, opt).get(ty).packed.unwrap();
            // decoded rows: the min family (the signed one's: `interleaved_pair_kernels_...`)
            let (pairs, pd) = (p512.pair, p512.pair_decoded);
            assert_eq!(pd.is_some(), q81, "{ty}: decoded two-row kernels for the min family only");
            let one = tk.tiled.unwrap().one();
            let pk = tk.packed.unwrap();
            for case in 0..4 {
                let mut w: Vec<u8> = (0..2 * wrow).map(|_| next(&mut s) as u8).collect();
                if case == 1 {
                    w.fill(0xFF);
                } else if case == 2 {
                    w.fill(0);
                }
                if case != 1 {
                    for blk in w.chunks_exact_mut(ty.type_size()) {
                        // finite d (and m)
                        for f in 0..(1 + q81 as usize) {
                            let d = half::f16::from_f32((next(&mut s) % 100) as f32 * 1e-3 - 0.03).to_bits();
                            blk[2 * f..2 * f + 2].copy_from_slice(&d.to_le_bytes());
                        }
                    }
                }
                let mut xq = vec![0u8; xrow * avx2::PACK_COLS];
                for c in 0..avx2::PACK_COLS {
                    let x: Vec<f32> = (0..n).map(|k| if case == 3 { if k % 3 == 0 { -1.0 } else { 1.0 } } else { (next(&mut s) % 2001) as f32 / 1000.0 - 1.0 }).collect();
                    quant::quantize_row_act(vdt, &x, &mut xq[c * xrow..(c + 1) * xrow]).unwrap();
                }
                // the block scales the matmul precomputes: d (Q8_0) or (d, s) (Q8_1)
                let per = 1 + q81 as usize;
                let xd = avx2::block_scales_for_test(&xq, xrow, vdt, avx2::PACK_COLS, nb);
                for nc in 1..=avx2::PACK_COLS {
                    let mut packed = vec![0xA5u8; nb * pk.block_bytes];
                    unsafe {
                        if q81 {
                            avx2::pack_q8_1_cols(nb, nc, xq.as_ptr(), xrow, xd.as_ptr(), nb * per, packed.as_mut_ptr())
                        } else {
                            avx2::pack_q8_0_cols(nb, nc, xq.as_ptr(), xrow, xd.as_ptr(), nb, pk.offset, packed.as_mut_ptr())
                        }
                    };
                    // raw rows, and the same rows decoded once (the min family's prefill kernels)
                    let bb = pd.map_or(0, |pd| pd.block_bytes);
                    let mut dec = vec![0xA5u8; 2 * nb * bb];
                    let db = nb * bb;
                    let mut kinds = vec![("raw", pairs[nc].unwrap(), w.as_ptr(), w.as_ptr().wrapping_add(wrow))];
                    if let Some(pd) = pd {
                        unsafe {
                            (pd.decode)(nb, w.as_ptr(), dec.as_mut_ptr());
                            (pd.decode)(nb, w.as_ptr().add(wrow), dec.as_mut_ptr().add(db));
                        }
                        kinds.push(("decoded", pd.cols[nc].unwrap(), dec.as_ptr(), dec.as_ptr().wrapping_add(db)));
                    }
                    for (kind, k, wa, wb) in kinds {
                        // the two rows' outputs interleaved, column stride 3 (as a matmul's
                        // adjacent output rows, token-major): the third of each column untouched
                        let mut g = [f32::NAN; 3 * 8];
                        unsafe { k(nb, wa, wb, packed.as_ptr(), g.as_mut_ptr(), g.as_mut_ptr().add(1), 3) };
                        for c in 0..8 {
                            assert!(g[3 * c + 2].is_nan() && (c < nc || g[3 * c].is_nan() && g[3 * c + 1].is_nan()), "{ty} {kind} nc={nc}: wrote outside its columns");
                        }
                        for c in 0..nc {
                            for (r, got) in [(0, g[3 * c]), (1, g[3 * c + 1])] {
                                let mut want = 0f32;
                                unsafe { one(n, w.as_ptr().add(r * wrow), xq.as_ptr().add(c * xrow), 0, std::ptr::null(), 0, &mut want) };
                                assert_eq!(got.to_bits(), want.to_bits(), "{ty} {kind} nc={nc} case {case} row {r} col {c}");
                            }
                        }
                    }
                }
            }
        }
    }
}
