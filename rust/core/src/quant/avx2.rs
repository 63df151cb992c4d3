//! AVX2 + FMA + F16C kernels (x86-64), chosen at run time by `super::kernel_set()`.
//!
//! Each vec_dot is written once, generic over NC = the number of activation rows (columns of
//! the product) it serves per pass over a weight row: NC = 1 is the single-token kernel,
//! NC = 4 the prefill tile that decodes each weight block once for 4 tokens. Both are the
//! same code, so each output element sees exactly the same operations in the same order
//! whichever is used (the matmul's determinism rests on this).
//!
//! For prefill, the 32-block types also have packed kernels (`packed_kernel`): the matmul
//! lays 8 tokens' Q8_0/Q8_1 activations out block by block with their scales (and offset
//! corrections) so each column costs one integer dot, one conversion and one FMA, with
//! the same per-column operations as the plain kernels. They come for 1..=8 columns
//! (`packed_kernel_cols`: a batch's partial last group, and batches of 2..7 sequences
//! decoding one token each) and in three builds: plain AVX2, AVX-VNNI, and AVX-512 VNNI
//! (EVEX `vpdpbusd` on ymm, for AVX-512 CPUs without AVX-VNNI such as AMD Zen 4). The
//! other types have kernels of 1..7 columns too (`cols_kernel`, the tile code at that
//! width) for the tokens left after the tiles.
//!
//! The algorithms follow ggml's AVX2 kernels (ggml-cpu/arch/x86/quants.c): integer dot
//! products with `maddubs`/`madd` per block, one FMA per block into 8 float lanes, a
//! horizontal sum at the end. They are tested against the scalar `_ref` kernels.

#![allow(clippy::missing_safety_doc)]

use super::legacy;
use super::table::{KernelTable, Packed, Tiled};
use super::DotRows;
use crate::ggml_type::GgmlType;
use super::blocks::{offset_of, Block, BlockIQ4NL, BlockIQ4XS, BlockQ2K, BlockQ3K, BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ5K, BlockQ5_0, BlockQ5_1, BlockQ6K, BlockQ8K, BlockQ8_0, BlockQ8_1};
use std::arch::x86_64::*;

pub use super::{DotN, PackedDot};

/// The prefill tile width: activation rows per pass over a weight row.
pub(crate) const TILE: usize = 4;

/// Whether the AVX-VNNI builds of the 32-block kernels are used (bit-identical results;
/// `PYLLAMA_KERNELS=avx2` turns them off).
pub fn vnni_available() -> bool {
    super::cpu::features().avxvnni && !matches!(super::cpu::env().kernels, super::cpu::Forced::Avx2 | super::cpu::Forced::Avx512Bw)
}

/// The widest prefill tile: the tiles are TILE or WIDE_TILE columns wide.
pub(crate) const WIDE_TILE: usize = 8;

/// The AVX2 set's kernels in table `t`: `vnni` picks the AVX-VNNI builds of the 32-element
/// block kernels, `pack` the build of the packed kernels.
///
/// Tile widths, per type: 8 columns where the kernel keeps its 8 accumulators in
/// registers (decoding each weight block once per 8 tokens instead of 4), 4 where 8 would
/// spill (Q4_1/Q5_1 keep two accumulators per column, the float kernels two). Measured
/// with `cargo bench --bench prefill` (1 thread, GMAC/s, 4 -> 8 columns): Q5_0 31 -> 33,
/// Q8_0 35 -> 37, Q4_K 37 -> 42 (llama.cpp-order Q4_K: 31 -> 33), Q6_K 35 -> 40;
/// Q4_1 38 -> 26 (spills, kept at 4). Q4_0/Q5_0/Q8_0/Q4_1/Q5_1 prefill mostly runs the
/// packed kernels instead; their tiles serve PYLLAMA_KERNELS checks. Every width (the
/// tile's, and the 1..width - 1 columns the matmul runs on the tokens left after its tiles
/// or packed groups: a batch of 2..7 tokens, K sequences decoding one token each, then
/// decodes each weight block once instead of once per token) is the same generic code, so
/// each column gets exactly the operations of the single-column kernel (the same bits).
pub(crate) fn register(t: &mut KernelTable, vnni: bool, pack: PackBuild) {
    use GgmlType::*;
    // the plain or the AVX-VNNI build of a 32-element block kernel
    macro_rules! v {
        ($plain:ident, $vnni:ident, $w:tt) => {
            if vnni {
                tiled!($vnni, $w)
            } else {
                tiled!($plain, $w)
            }
        };
    }
    t.set_tiled(Q4_0, v!(dot_q4_0, dot_q4_0_vnni, 8), one_q4_0);
    t.set_tiled(Q5_0, v!(dot_q5_0, dot_q5_0_vnni, 8), one_q5_0);
    t.set_tiled(Q8_0, v!(dot_q8_0, dot_q8_0_vnni, 8), one_q8_0);
    t.set_tiled(IQ4_NL, v!(dot_iq4_nl, dot_iq4_nl_vnni, 8), one_iq4_nl);
    t.set_tiled(Q4_1, v!(dot_q4_1, dot_q4_1_vnni, 4), one_q4_1);
    t.set_tiled(Q5_1, v!(dot_q5_1, dot_q5_1_vnni, 4), one_q5_1);
    t.set_tiled(Q2_K, tiled!(dot_q2_k, 8), one_q2_k);
    t.set_tiled(Q3_K, tiled!(dot_q3_k, 8), one_q3_k);
    t.set_tiled(Q4_K, tiled!(dot_q4_k, 8), one_q4_k);
    t.set_tiled(Q5_K, tiled!(dot_q5_k, 8), one_q5_k);
    t.set_tiled(Q6_K, tiled!(dot_q6_k, 8), one_q6_k);
    t.set_tiled(IQ4_XS, tiled!(dot_iq4_xs, 8), one_iq4_xs);
    t.set_tiled(F32, tiled!(dot_f32, 4), one_f32);
    t.set_tiled(F16, tiled!(dot_f16, 4), one_f16);
    t.set_tiled(BF16, tiled!(dot_bf16, 4), one_bf16);
    super::avx2_iq::register_iq(t, true);
    super::avx2_iq::register_lowbit(t);

    // single token: several weight rows per pass
    let rows: [(GgmlType, DotRows, DotRows); 7] = [
        (Q4_0, rows_q4_0, rows_q4_0_vnni),
        (Q5_0, rows_q5_0, rows_q5_0_vnni),
        (Q8_0, rows_q8_0, rows_q8_0_vnni),
        (IQ4_NL, rows_iq4_nl, rows_iq4_nl_vnni),
        (Q4_1, rows_q4_1, rows_q4_1_vnni),
        (Q5_1, rows_q5_1, rows_q5_1_vnni),
        (Q4_K, rows_q4_k, rows_q4_k),
    ];
    for (ty, plain, with_vnni) in rows {
        t.set_rows(ty, if vnni { with_vnni } else { plain });
    }

    // prefill: packed groups of PACK_COLS tokens (the weight offset: the signed types'
    // quants plus it are all in 0..=255, so they can be the unsigned operand of
    // `vpdpbusd`/`maddubs` without the per-column `vpsignb` of the plain kernels)
    macro_rules! packed {
        ($ty:ident, $off:expr, $bytes:expr, $plain:ident, $vnni:ident, $evex:ident) => {
            let cols = match pack {
                PackBuild::Plain | PackBuild::Bw => packed_cols!($plain),
                PackBuild::Vnni => packed_cols!($vnni),
                PackBuild::Evex => packed_cols!($evex),
            };
            t.set_packed($ty, Packed { cols, offset: $off, block_bytes: $bytes, pair: [None; super::table::MAX_PACK + 1], lanes: None, pair_decoded: None, pairs_decoded: None });
        };
    }
    macro_rules! packed_cols {
        ($f:ident) => {
            [None, Some($f::<1> as PackedDot), Some($f::<2>), Some($f::<3>), Some($f::<4>), Some($f::<5>), Some($f::<6>), Some($f::<7>), Some($f::<8>)]
        };
    }
    packed!(Q4_0, 8, PACK_BLOCK, packed_q4_0, packed_q4_0_vnni, packed_q4_0_evex);
    packed!(Q5_0, 16, PACK_BLOCK, packed_q5_0, packed_q5_0_vnni, packed_q5_0_evex);
    packed!(Q8_0, 128, PACK_BLOCK, packed_q8_0, packed_q8_0_vnni, packed_q8_0_evex);
    packed!(Q4_1, 0, PACK_BLOCK_Q8_1, packed_q4_1, packed_q4_1_vnni, packed_q4_1_evex);
    packed!(Q5_1, 0, PACK_BLOCK_Q8_1, packed_q5_1, packed_q5_1_vnni, packed_q5_1_evex);

    // the activation quantizers and the exact f16 / bf16 conversions (the scalar ones' bytes)
    t.set_convert(Q8_0, Some(quantize_q8_0), Some(dequantize_q8_0));
    t.set_convert(Q8_1, Some(quantize_q8_1), None);
    t.set_convert(Q8_K, Some(quantize_q8_k), None);
    t.set_convert(F16, Some(quantize_f16), Some(dequantize_f16));
    t.set_convert(BF16, None, Some(dequantize_bf16));
}

/// `PYLLAMA_ORDER=llamacpp` (see `llamacpp_order`): llama.cpp's batch-dependent kernels of
/// Q4_K (its repacked gemv order for tokens left over after groups of 4, gemm order within
/// them), Q6_K (its tiled order for batches of 8 rows or more, its vec_dot order below) and
/// the grid types (`avx2_iq::register_llamacpp_order`), in 4-column tiles with no kernels
/// between 1 and 4 columns (their orders there differ by width).
pub(crate) fn register_llamacpp_order(t: &mut KernelTable) {
    let q4k = Tiled::pair(dot_q4_k_ord::<1, false>, dot_q4_k_ord::<TILE, true>, TILE);
    t.set_tiled_by_batch(GgmlType::Q4_K, q4k, q4k);
    // a single token in llama.cpp's gemv order: the one-row kernel above, not `rows_q4_k`
    t.clear_rows(GgmlType::Q4_K);
    let q6k_small = Tiled::pair(dot_q6_k_ord::<1, false>, dot_q6_k_ord::<TILE, false>, TILE);
    t.set_tiled_by_batch(GgmlType::Q6_K, q6k_small, Tiled::pair(dot_q6_k::<1>, dot_q6_k::<TILE>, TILE));
    super::avx2_iq::register_llamacpp_order(t);
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
    one_q4_k, dot_q4_k, Q4_K;
    one_q5_k, dot_q5_k, Q5_K;
    one_q6_k, dot_q6_k, Q6_K;
    one_iq4_xs, dot_iq4_xs, IQ4_XS;
    one_f32, dot_f32, F32;
    one_f16, dot_f16, F16;
    one_bf16, dot_bf16, BF16;
}

// ------------------------------------------------------------------ helpers

/// f16 at p -> f32. Written in asm: with `_mm_cvtsi32_si128`/`_mm_set1_epi16` LLVM
/// inserts the 16 bits into whatever register is at hand (vpinsrw), which chained every
/// block's scale conversion to the previous block's accumulator (Q4_1 ran 3x slower).
/// `vmovd` from a general register writes the whole register: no false dependency.
#[inline(always)]
pub(crate) unsafe fn f16(p: *const u8) -> f32 {
    let h = std::ptr::read_unaligned(p as *const u16) as u32;
    let r: __m128;
    std::arch::asm!(
        "vmovd {r}, {h:e}",
        "vcvtph2ps {r}, {r}",
        h = in(reg) h,
        r = out(xmm_reg) r,
        options(pure, nomem, nostack, preserves_flags)
    );
    _mm_cvtss_f32(r)
}

/// Two adjacent f16 at p -> lanes 0 and 1 (d and m of a Q4_1/Q5_1 block, d and s of Q8_1).
#[inline(always)]
pub(crate) unsafe fn f16x2(p: *const u8) -> __m128 {
    let h = std::ptr::read_unaligned(p as *const u32);
    let r: __m128;
    std::arch::asm!(
        "vmovd {r}, {h:e}",
        "vcvtph2ps {r}, {r}",
        h = in(reg) h,
        r = out(xmm_reg) r,
        options(pure, nomem, nostack, preserves_flags)
    );
    r
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn f32_at(p: *const u8) -> f32 {
    std::ptr::read_unaligned(p as *const f32)
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn hsum_ps(v: __m256) -> f32 {
    let r = _mm_add_ps(_mm256_extractf128_ps(v, 1), _mm256_castps256_ps128(v));
    let r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    let r = _mm_add_ss(r, _mm_movehdup_ps(r));
    _mm_cvtss_f32(r)
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn hsum_ps128(v: __m128) -> f32 {
    let r = _mm_add_ps(v, _mm_movehl_ps(v, v));
    let r = _mm_add_ss(r, _mm_movehdup_ps(r));
    _mm_cvtss_f32(r)
}

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

/// 16 bytes of packed nibbles -> 32 bytes: low nibbles (elements 0..16) then high (16..32).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn nibbles_32(p: *const u8) -> __m256i {
    // Broadcast the 16 bytes to both halves (a pure load) and shift only the upper half:
    // keeps the shuffle port free (vinserti128 competed with the scale conversions).
    let t = _mm256_broadcastsi128_si256(load128(p));
    let b = _mm256_srlv_epi64(t, _mm256_set_epi64x(4, 4, 0, 0));
    _mm256_and_si256(b, _mm256_set1_epi8(0x0F))
}

/// 32 bits -> 32 bytes, 0xFF where the bit is set.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn bits_32(p: *const u8) -> __m256i {
    let x32 = std::ptr::read_unaligned(p as *const u32) as i32;
    let shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
    let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(x32), shuf);
    let bytes = _mm256_or_si256(bytes, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
    _mm256_cmpeq_epi8(bytes, _mm256_set1_epi64x(-1))
}

/// Pairwise i16 sums -> 8 i32 -> f32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn i16_pairs_to_ps(p: __m256i) -> __m256 {
    _mm256_cvtepi32_ps(_mm256_madd_epi16(p, _mm256_set1_epi16(1)))
}

/// Sums of 4 adjacent u8*i8 products as 8 f32. With V (AVX-VNNI) one `vpdpbusd`; else
/// `maddubs` + `madd`: the same integers (no i16 saturation is possible with these
/// formats' ranges), so both variants give bit-identical results.
#[inline(always)]
unsafe fn u8_i8_dot_ps<const V: bool>(a: __m256i, b: __m256i) -> __m256 {
    if V {
        _mm256_cvtepi32_ps(vnni_dot(a, b))
    } else {
        i16_pairs_to_ps(_mm256_maddubs_epi16(a, b))
    }
}

#[inline]
#[target_feature(enable = "avx2,avxvnni")]
unsafe fn vnni_dot(a: __m256i, b: __m256i) -> __m256i {
    _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), a, b)
}

/// 16 signed nibble-indexed table values: low nibbles of 16 bytes -> elements 0..16, high -> 16..32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn iq4_lookup(p: *const u8) -> __m256i {
    let values = _mm_loadu_si128(legacy::KVALUES_IQ4NL.as_ptr() as *const __m128i);
    let m4 = _mm_set1_epi8(0x0f);
    let b = load128(p);
    let lo = _mm_shuffle_epi8(values, _mm_and_si128(b, m4));
    let hi = _mm_shuffle_epi8(values, _mm_and_si128(_mm_srli_epi16(b, 4), m4));
    _mm256_set_m128i(hi, lo)
}

/// How far ahead of the block being decoded the kernels prefetch weight bytes. Token
/// generation streams every weight once per token from RAM; profiles showed the single-
/// token kernels stalled on the first load of each block (the f16 scale), so the hardware
/// prefetcher alone does not run far enough ahead. A prefetch never faults (the address
/// past the tensor's end is only a hint) and changes no result. The distance was tuned on
/// SmolLM2 Q4_1 tg128 (1 thread, t/s): 384 B 55, 768 B 64, 1.5 KiB 74, 3 KiB 104,
/// 6 KiB 113, 8 KiB 123, 12 KiB 109, 24 KiB 101 (no prefetch: 46). This machine's weights
/// sit in a large, high-latency L3; 8 KiB ahead still fits the 48 KiB L1 many times over.
/// Only the single-token kernels (NC = 1) prefetch: the prefill tile is compute-bound and
/// re-reads weights that are already near (Gemma3 pp512, 2 threads: 369-378 t/s with the
/// prefetch, 410-414 without; SmolLM2 unchanged).
pub(crate) const PF_AHEAD: usize = 8192;

/// The kernels over up to this many activation rows prefetch too: a batch of a few
/// sequences decoding together streams the weights from RAM as a single token does (the
/// leftover-token kernels, `cols_kernel`); the 8-column prefill tiles do not prefetch (see
/// `PF_AHEAD`).
const PF_COLS: usize = 4;

/// Prefetch into L2 (`T1`). Measured A/B (interleaved runs, tg64 t/s, 1 and 2 threads):
/// with T0 everywhere SmolLM2 85/220 Gemma3 33/59; T1 everywhere 92/197, 39/72; T1 with T0
/// for the Q4_1/Q5_1 kernels only (`prefetch_w_l1`) 93-104/210-222, 39/73-75, kept.
#[inline(always)]
unsafe fn prefetch_w(p: *const u8) {
    _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(PF_AHEAD) as *const i8);
}

/// Prefetch into L1 (`T0`): better for the Q4_1/Q5_1 kernels (see `prefetch_w`); the
/// AVX-512 Q4_1 lane kernel takes T1 for passes of short rows (`avx512::rows_q4_1`).
#[inline(always)]
unsafe fn prefetch_w_l1(p: *const u8) {
    _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PF_AHEAD) as *const i8);
}

/// Prefetch every cache line of a `size`-byte super-block, PF_AHEAD ahead.
#[inline(always)]
unsafe fn prefetch_block(p: *const u8, size: usize) {
    let mut o = 0;
    while o < size {
        prefetch_w(p.wrapping_add(o));
        o += 64;
    }
}

// ------------------------------------------------------------------ 32-element blocks

/// Signed-weight family (Q4_0, Q5_0, Q8_0, IQ4_NL against Q8_0): per block
/// acc += (dw*dx) * sum(qw*qx). `decode(block) -> (dw, signed 32 weights)`.
#[inline(always)]
unsafe fn dot_signed_q8_0<const NC: usize, const V: bool>(
    n: usize,
    w: *const u8,
    wsize: usize,
    x: *const u8,
    xs: usize,
    xd: *const f32,
    xds: usize,
    out: *mut f32,
    decode: impl Fn(*const u8) -> (f32, __m256i),
) {
    let nb = n / 32;
    let mut acc = [_mm256_setzero_ps(); NC];
    for i in 0..nb {
        if NC <= PF_COLS {
            prefetch_w(w.add(i * wsize));
        }
        let (dw, qw) = decode(w.add(i * wsize));
        let vdw = _mm256_set1_ps(dw);
        let aw = _mm256_sign_epi8(qw, qw);
        for c in 0..NC {
            let by = x.add(c * xs + i * BlockQ8_0::SIZE);
            let dx = if xd.is_null() { f16(by) } else { std::ptr::read_unaligned(xd.add(c * xds + i)) };
            let d = _mm256_mul_ps(vdw, _mm256_set1_ps(dx));
            let sy = _mm256_sign_epi8(load256(by.add(offset_of!(BlockQ8_0, qs))), qw);
            let q = u8_i8_dot_ps::<V>(aw, sy);
            acc[c] = _mm256_fmadd_ps(d, q, acc[c]);
        }
    }
    for c in 0..NC {
        *out.add(c) = hsum_ps(acc[c]);
    }
}

// ------------------------------------------------------------------ packed prefill tiles

/// Columns (tokens) of a packed activation group.
pub(crate) const PACK_COLS: usize = 8;
/// Bytes of one block of a packed group: the 8 columns' f32 scales d_x, their 8 x 32 i8
/// quants, then their 8 x 8 i32 offset corrections (see `pack_q8_0_cols`), and 32 bytes of
/// padding: a whole number of cache lines, so that with the group starting 32 bytes into
/// a line (`matmul::pack_phase`) every block's quant and correction loads are whole lines.
pub(crate) const PACK_BLOCK: usize = 4 * PACK_COLS + 32 * PACK_COLS + 32 * PACK_COLS + 32;

/// The bits of 1.5 * 2^23: `I2F_MAGIC + v`, read as an f32, is exactly 1.5 * 2^23 + v for
/// every integer |v| < 2^22, so subtracting `I2F_MAGIC_F32` gives exactly f32(v), the value
/// `cvtepi32_ps` would give; the kernels add it into the i32 sum's starting value (the
/// offset correction, or the `vpdpbusd` accumulator) and so trade the conversion for a
/// subtract (measured: Gemma 3's Q5_0 prefill 80-81 -> 83 GMAC/s on the interleaved pairs,
/// 45.5 -> 47.2 on the plain AVX2 column lanes).
pub(crate) const I2F_MAGIC: i32 = 0x4B40_0000;
pub(crate) const I2F_MAGIC_F32: f32 = 12_582_912.0;

/// The offset correction of a Q8_0 activation block for weights stored + off: per lane,
/// -off * (the sum of its 4 quants); maddubs(1, y) gives exact i16 pair sums, madd(., 1)
/// sums of 4. `moff` = -off in all lanes.
#[inline(always)]
unsafe fn quad_corr(y: __m256i, moff: __m256i) -> __m256i {
    let s4 = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), y), _mm256_set1_epi16(1));
    _mm256_mullo_epi32(s4, moff)
}

/// Packs a group of `ncols` <= PACK_COLS Q8_0 activation rows (`x + c * xs`, nb blocks
/// each, their f32 scales at `xd + c * xds`) for weight offset `off`: per block, [d_x of
/// the 8 columns: 8 f32][quants of column 0..8: 8 x 32 i8][-off * (sum of each 4
/// consecutive quants) of column 0..8: 8 x 8 i32]. The corrections make
/// sum((q_w + off) * q_x) over each 4 quants equal sum(q_w * q_x): the same i32 in every
/// lane as the plain kernels compute. In a partial group (the last of a batch) the other
/// columns' d_x are 0 and their quants unset (the kernels of `ncols` columns never read
/// them).
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn pack_q8_0_cols(nb: usize, ncols: usize, x: *const u8, xs: usize, xd: *const f32, xds: usize, off: i32, dst: *mut u8) {
    let moff = _mm256_set1_epi32(-off);
    for i in 0..nb {
        let b = dst.add(i * PACK_BLOCK);
        for c in 0..PACK_COLS {
            if c >= ncols {
                *(b as *mut f32).add(c) = 0.0;
                continue;
            }
            *(b as *mut f32).add(c) = std::ptr::read_unaligned(xd.add(c * xds + i));
            let y = load256(x.add(c * xs + i * BlockQ8_0::SIZE + offset_of!(BlockQ8_0, qs)));
            _mm256_storeu_si256(b.add(32 + 32 * c) as *mut __m256i, y);
            _mm256_storeu_si256(b.add(32 + 256 + 32 * c) as *mut __m256i, quad_corr(y, moff));
        }
    }
}

/// The packed signed-family kernel (Q4_0, Q5_0, Q8_0 against Q8_0). `decode(block) ->
/// (d_w, q_w + off as u8)`. Per block and column: i32 lanes = correction + sum of 4
/// (q_w + off) * q_x (one `vpdpbusd`, or `maddubs` + `madd` + add when !V, exact: no i16
/// saturation for off <= 16), the f32 scales d_w * d_x of all 8 columns in one multiply,
/// then acc[c] += d * f32(lanes) and a final `hsum_ps`: each column gets exactly the
/// operations of the plain kernel (`dot_signed_q8_0`), hence the same bits.
/// S: the plain AVX2 build for off = 128 (Q8_0), where maddubs could saturate: the
/// plain kernels' sign trick on the unshifted weights, corrections unused.
/// E: the AVX-512 VNNI build (EVEX `vpdpbusd` on ymm: the AVX-512 kernel set on CPUs
/// without AVX-VNNI, e.g. AMD Zen 4), the same integers as V. NC: the columns computed (the
/// first NC of the group; fewer than PACK_COLS for a batch's last, partial group).
#[inline(always)]
unsafe fn dot_packed_signed<const V: bool, const S: bool, const E: bool, const NC: usize>(
    nb: usize,
    w: *const u8,
    wsize: usize,
    xp: *const u8,
    out: *mut f32,
    decode: impl Fn(*const u8) -> (f32, __m256i),
) {
    #[repr(align(32))]
    struct D([f32; PACK_COLS]);
    let mut dbuf = D([0f32; PACK_COLS]);
    let mut acc = [_mm256_setzero_ps(); NC];
    let ones16 = _mm256_set1_epi16(1);
    for i in 0..nb {
        if NC <= PF_COLS {
            prefetch_w(w.add(i * wsize));
        }
        let (dw, qu) = decode(w.add(i * wsize));
        let b = xp.add(i * PACK_BLOCK);
        let vdw = _mm256_set1_ps(dw);
        if NC == PACK_COLS {
            _mm256_store_ps(dbuf.0.as_mut_ptr(), _mm256_mul_ps(vdw, _mm256_loadu_ps(b as *const f32)));
        }
        // S: qu holds the signed weights (see above)
        let aw = if S { _mm256_sign_epi8(qu, qu) } else { qu };
        for c in 0..NC {
            let y = load256(b.add(32 + 32 * c));
            let q = if S {
                let sy = _mm256_sign_epi8(y, qu);
                _mm256_madd_epi16(_mm256_maddubs_epi16(aw, sy), ones16)
            } else {
                let corr = load256(b.add(32 + 256 + 32 * c));
                if E {
                    evex_dot_acc(corr, qu, y)
                } else if V {
                    vnni_dot_acc(corr, qu, y)
                } else {
                    _mm256_add_epi32(corr, _mm256_madd_epi16(_mm256_maddubs_epi16(qu, y), ones16))
                }
            };
            // a broadcast load from the just-stored scales: a load-port uop instead of a
            // shuffle (the shuffle port is busy decoding weights); with fewer columns the
            // product d_w * d_x per column (the same f32 as that lane of the 8-lane
            // multiply) without the store and its forwarding (10-15% faster, Q8_0 at 2..4
            // columns, Gemma's output projection, 1 thread)
            let dc = if NC == PACK_COLS {
                broadcast_mem(dbuf.0.as_ptr().add(c))
            } else {
                _mm256_mul_ps(vdw, broadcast_mem((b as *const f32).add(c)))
            };
            acc[c] = _mm256_fmadd_ps(dc, _mm256_cvtepi32_ps(q), acc[c]);
        }
    }
    for c in 0..NC {
        *out.add(c) = hsum_ps(acc[c]);
    }
}

/// `vbroadcastss` from memory, in asm so that LLVM keeps it a load rather than turning
/// the store-then-load of `dot_packed_signed` back into register shuffles.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn broadcast_mem(p: *const f32) -> __m256 {
    let r: __m256;
    std::arch::asm!(
        "vbroadcastss {r}, dword ptr [{p}]",
        p = in(reg) p,
        r = out(ymm_reg) r,
        options(pure, readonly, nostack, preserves_flags)
    );
    r
}

#[inline]
#[target_feature(enable = "avx2,avxvnni")]
unsafe fn vnni_dot_acc(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
    _mm256_dpbusd_avx_epi32(acc, a, b)
}

/// `vnni_dot_acc` in its AVX-512 VNNI (EVEX) encoding: the same integers.
#[inline]
#[target_feature(enable = "avx512f,avx512vl,avx512vnni")]
unsafe fn evex_dot_acc(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
    _mm256_dpbusd_epi32(acc, a, b)
}

/// Q5_0 weights + 16: low nibbles | (high bit << 4), in 0..=31.
#[inline(always)]
pub(crate) unsafe fn q5_0_unsigned(b: *const u8) -> (f32, __m256i) {
    let hi = _mm256_and_si256(bits_32(b.add(offset_of!(BlockQ5_0, qh))), _mm256_set1_epi8(0x10));
    (f16(b), _mm256_or_si256(nibbles_32(b.add(offset_of!(BlockQ5_0, qs))), hi))
}

/// A packed signed-family kernel in its three builds (plain AVX2, AVX-VNNI, AVX-512 VNNI),
/// generic over the columns NC it computes. `$s`: the plain build's S (see
/// `dot_packed_signed`) with its decoder `$dec`; the VNNI builds decode with `$decu`.
macro_rules! packed_signed {
    ($plain:ident, $vnni:ident, $evex:ident, $wsize:expr, $s:expr, $dec:expr, $decu:expr) => {
        #[target_feature(enable = "avx2,fma,f16c")]
        pub(crate) unsafe fn $plain<const NC: usize>(nb: usize, w: *const u8, xp: *const u8, out: *mut f32) {
            dot_packed_signed::<false, { $s }, false, NC>(nb, w, $wsize, xp, out, $dec)
        }
        #[target_feature(enable = "avx2,fma,f16c,avxvnni")]
        pub(crate) unsafe fn $vnni<const NC: usize>(nb: usize, w: *const u8, xp: *const u8, out: *mut f32) {
            dot_packed_signed::<true, false, false, NC>(nb, w, $wsize, xp, out, $decu)
        }
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
        pub(crate) unsafe fn $evex<const NC: usize>(nb: usize, w: *const u8, xp: *const u8, out: *mut f32) {
            dot_packed_signed::<false, false, true, NC>(nb, w, $wsize, xp, out, $decu)
        }
    };
}

packed_signed!(packed_q4_0, packed_q4_0_vnni, packed_q4_0_evex, BlockQ4_0::SIZE, false, |b| (f16(b), nibbles_32(b.add(offset_of!(BlockQ4_0, qs)))), |b| (
    f16(b),
    nibbles_32(b.add(offset_of!(BlockQ4_0, qs)))
));
packed_signed!(packed_q5_0, packed_q5_0_vnni, packed_q5_0_evex, BlockQ5_0::SIZE, false, |b| q5_0_unsigned(b), |b| q5_0_unsigned(b));
packed_signed!(packed_q8_0, packed_q8_0_vnni, packed_q8_0_evex, BlockQ8_0::SIZE, true, |b| (f16(b), load256(b.add(offset_of!(BlockQ8_0, qs)))), |b| (
    f16(b),
    _mm256_xor_si256(load256(b.add(offset_of!(BlockQ8_0, qs))), _mm256_set1_epi8(0x80u8 as i8))
));

/// Bytes of one block of a packed Q8_1 group: the 8 columns' d_x, their s_x (8 f32 each),
/// then their 8 x 32 i8 quants (see `pack_q8_1_cols`).
pub(crate) const PACK_BLOCK_Q8_1: usize = 8 * PACK_COLS + 32 * PACK_COLS;

/// Packs a group of `ncols` <= PACK_COLS Q8_1 activation rows (`x + c * xs`, nb blocks
/// each, their (d, s) f32 pairs at `xd + c * xds + 2 * block`): per block [d_x of the 8
/// columns][s_x of the 8 columns][quants of column 0..8: 8 x 32 i8] (a partial group as
/// in `pack_q8_0_cols`).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn pack_q8_1_cols(nb: usize, ncols: usize, x: *const u8, xs: usize, xd: *const f32, xds: usize, dst: *mut u8) {
    for i in 0..nb {
        let b = dst.add(i * PACK_BLOCK_Q8_1);
        for c in 0..PACK_COLS {
            if c >= ncols {
                *(b as *mut f32).add(c) = 0.0;
                *(b as *mut f32).add(PACK_COLS + c) = 0.0;
                continue;
            }
            *(b as *mut f32).add(c) = std::ptr::read_unaligned(xd.add(c * xds + 2 * i));
            *(b as *mut f32).add(PACK_COLS + c) = std::ptr::read_unaligned(xd.add(c * xds + 2 * i + 1));
            _mm256_storeu_si256(b.add(64 + 32 * c) as *mut __m256i, load256(x.add(c * xs + i * BlockQ8_1::SIZE + offset_of!(BlockQ8_1, qs))));
        }
    }
}

/// Test helper: the f32 block scales the matmul precomputes (`fill_scales`) for `ncols`
/// quantized activation rows `xrow` bytes apart: d per block (Q8_0) or (d, s) (Q8_1), row c's
/// at `c * nb * per`.
#[cfg(test)]
pub(crate) fn block_scales_for_test(xq: &[u8], xrow: usize, vdt: crate::ggml_type::GgmlType, ncols: usize, nb: usize) -> Vec<f32> {
    let per = 1 + (vdt == crate::ggml_type::GgmlType::Q8_1) as usize;
    (0..ncols * nb * per)
        .map(|k| {
            let (c, b, f) = (k / (nb * per), k % (nb * per) / per, k % per);
            let o = c * xrow + b * vdt.type_size() + 2 * f;
            half::f16::from_bits(u16::from_le_bytes([xq[o], xq[o + 1]])).to_f32()
        })
        .collect()
}

/// The 8 x 8 transpose of dwords: out[j] lane c = r[c] lane j.
#[inline(always)]
pub(crate) unsafe fn transpose8_epi32(r: &[__m256i; 8]) -> [__m256i; 8] {
    let t = [
        _mm256_unpacklo_epi32(r[0], r[1]),
        _mm256_unpackhi_epi32(r[0], r[1]),
        _mm256_unpacklo_epi32(r[2], r[3]),
        _mm256_unpackhi_epi32(r[2], r[3]),
        _mm256_unpacklo_epi32(r[4], r[5]),
        _mm256_unpackhi_epi32(r[4], r[5]),
        _mm256_unpacklo_epi32(r[6], r[7]),
        _mm256_unpackhi_epi32(r[6], r[7]),
    ];
    // u[k]: dwords k and k + 4 of columns 0..4 (then w: of columns 4..8)
    let u = [_mm256_unpacklo_epi64(t[0], t[2]), _mm256_unpackhi_epi64(t[0], t[2]), _mm256_unpacklo_epi64(t[1], t[3]), _mm256_unpackhi_epi64(t[1], t[3])];
    let w = [_mm256_unpacklo_epi64(t[4], t[6]), _mm256_unpackhi_epi64(t[4], t[6]), _mm256_unpacklo_epi64(t[5], t[7]), _mm256_unpackhi_epi64(t[5], t[7])];
    [
        _mm256_permute2x128_si256::<0x20>(u[0], w[0]),
        _mm256_permute2x128_si256::<0x20>(u[1], w[1]),
        _mm256_permute2x128_si256::<0x20>(u[2], w[2]),
        _mm256_permute2x128_si256::<0x20>(u[3], w[3]),
        _mm256_permute2x128_si256::<0x31>(u[0], w[0]),
        _mm256_permute2x128_si256::<0x31>(u[1], w[1]),
        _mm256_permute2x128_si256::<0x31>(u[2], w[2]),
        _mm256_permute2x128_si256::<0x31>(u[3], w[3]),
    ]
}

/// Stores an 8 x 8 tile of matmul results: `tile[i]` holds the 8 columns (tokens) of
/// weight row i; token c's values of the 8 rows go to `out[c * ld..c * ld + 8]`, for c <
/// nc. One transpose and nc vector stores instead of 8 * nc scalar stores to nc output
/// rows (the column-lane kernels' results arrive per row, the output is per token).
///
/// # Safety
/// `out[c * ld..c * ld + 8]` must be writable for every c < nc <= 8; AVX2 available.
#[target_feature(enable = "avx2")]
pub unsafe fn store_tile_8x8(tile: &[[f32; 8]; 8], out: *mut f32, ld: usize, nc: usize) {
    let r: [__m256i; 8] = std::array::from_fn(|i| _mm256_loadu_si256(tile[i].as_ptr() as *const __m256i));
    let t = transpose8_epi32(&r);
    for (c, tc) in t.iter().enumerate().take(nc) {
        _mm256_storeu_si256(out.add(c * ld) as *mut __m256i, *tc);
    }
}

/// `pack_q8_0_cols` in the column-lane layout of `avx2_rb::lanes_signed`: per block [d_x
/// of the 8 columns: 8 f32][quad j = 0..8: the 8 columns' quants 4j..4j + 4, 4 i8 each]
/// [quad j: the 8 columns' corrections -off * (sum of quad j), plus `I2F_MAGIC`
/// (the kernel's sums are then the f32 bits of 1.5 * 2^23 + the sum): 8 i32] (PACK_BLOCK
/// bytes). A partial group's other columns are zero (corrections `I2F_MAGIC`; the kernel
/// computes all 8 lanes).
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn pack_q8_0_lanes(nb: usize, ncols: usize, x: *const u8, xs: usize, xd: *const f32, xds: usize, off: i32, dst: *mut u8) {
    let moff = _mm256_set1_epi32(-off);
    let magic = _mm256_set1_epi32(I2F_MAGIC);
    for i in 0..nb {
        let b = dst.add(i * PACK_BLOCK);
        let (mut y, mut corr) = ([_mm256_setzero_si256(); 8], [magic; 8]);
        let mut d = [0f32; PACK_COLS];
        for c in 0..ncols {
            d[c] = std::ptr::read_unaligned(xd.add(c * xds + i));
            y[c] = load256(x.add(c * xs + i * BlockQ8_0::SIZE + offset_of!(BlockQ8_0, qs)));
            corr[c] = _mm256_add_epi32(quad_corr(y[c], moff), magic);
        }
        _mm256_storeu_ps(b as *mut f32, _mm256_loadu_ps(d.as_ptr()));
        for (j, (yj, cj)) in transpose8_epi32(&y).iter().zip(transpose8_epi32(&corr).iter()).enumerate() {
            _mm256_storeu_si256(b.add(4 * PACK_COLS + 32 * j) as *mut __m256i, *yj);
            _mm256_storeu_si256(b.add(4 * PACK_COLS + 256 + 32 * j) as *mut __m256i, *cj);
        }
    }
}

/// `pack_q8_1_cols` in the column-lane layout of `avx2_rb::lanes_min`: per block [d_x of
/// the 8 columns][s_x of the 8 columns][quad j = 0..8: the 8 columns' quants 4j..4j + 4]
/// (PACK_BLOCK_Q8_1 bytes); a partial group's other columns are zero.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn pack_q8_1_lanes(nb: usize, ncols: usize, x: *const u8, xs: usize, xd: *const f32, xds: usize, dst: *mut u8) {
    for i in 0..nb {
        let b = dst.add(i * PACK_BLOCK_Q8_1);
        let mut y = [_mm256_setzero_si256(); 8];
        let mut ds = [0f32; 2 * PACK_COLS];
        for c in 0..ncols {
            ds[c] = std::ptr::read_unaligned(xd.add(c * xds + 2 * i));
            ds[PACK_COLS + c] = std::ptr::read_unaligned(xd.add(c * xds + 2 * i + 1));
            y[c] = load256(x.add(c * xs + i * BlockQ8_1::SIZE + offset_of!(BlockQ8_1, qs)));
        }
        std::ptr::copy_nonoverlapping(ds.as_ptr() as *const u8, b, 8 * PACK_COLS);
        for (j, yj) in transpose8_epi32(&y).iter().enumerate() {
            _mm256_storeu_si256(b.add(8 * PACK_COLS + 32 * j) as *mut __m256i, *yj);
        }
    }
}

/// The packed Q4_1/Q5_1 kernel: per block, d_w * d_x and m_w * s_x of all 8 columns in
/// one multiply each; the min terms summed in an 8-column vector (one add per block), the
/// quant dots as in `dot_min_q8_1`. Each column sees exactly the plain kernel's
/// operations (same products, same adds in block order, same final hsum + min sum).
/// E and NC as in `dot_packed_signed`.
#[inline(always)]
unsafe fn dot_packed_min<const V: bool, const E: bool, const NC: usize>(
    nb: usize,
    w: *const u8,
    wsize: usize,
    xp: *const u8,
    out: *mut f32,
    decode: impl Fn(*const u8) -> __m256i,
) {
    #[repr(align(32))]
    struct D([f32; PACK_COLS]);
    let mut dbuf = D([0f32; PACK_COLS]);
    let mut acc = [_mm256_setzero_ps(); NC];
    let mut summ = _mm256_setzero_ps();
    for i in 0..nb {
        let bw = w.add(i * wsize);
        if NC <= PF_COLS {
            prefetch_w_l1(bw);
        }
        let dm = f16x2(bw); // (d_w, m_w)
        let qw = decode(bw);
        let b = xp.add(i * PACK_BLOCK_Q8_1);
        let d = _mm256_mul_ps(_mm256_broadcastss_ps(dm), _mm256_loadu_ps(b as *const f32));
        let m = _mm256_broadcastss_ps(_mm_movehdup_ps(dm));
        summ = _mm256_add_ps(summ, _mm256_mul_ps(m, _mm256_loadu_ps(b.add(32) as *const f32)));
        _mm256_store_ps(dbuf.0.as_mut_ptr(), d);
        for c in 0..NC {
            let y = load256(b.add(64 + 32 * c));
            let q = if E { _mm256_cvtepi32_ps(evex_dot_acc(_mm256_setzero_si256(), qw, y)) } else { u8_i8_dot_ps::<V>(qw, y) };
            let dc = broadcast_mem(dbuf.0.as_ptr().add(c));
            acc[c] = _mm256_fmadd_ps(dc, q, acc[c]);
        }
    }
    let mut sm = [0f32; PACK_COLS];
    _mm256_storeu_ps(sm.as_mut_ptr(), summ);
    for c in 0..NC {
        *out.add(c) = hsum_ps(acc[c]) + sm[c];
    }
}

/// A packed Q4_1/Q5_1 kernel in its three builds, generic over the columns NC.
macro_rules! packed_min {
    ($plain:ident, $vnni:ident, $evex:ident, $wsize:expr, $dec:expr) => {
        #[target_feature(enable = "avx2,fma,f16c")]
        pub(crate) unsafe fn $plain<const NC: usize>(nb: usize, w: *const u8, xp: *const u8, out: *mut f32) {
            dot_packed_min::<false, false, NC>(nb, w, $wsize, xp, out, $dec)
        }
        #[target_feature(enable = "avx2,fma,f16c,avxvnni")]
        pub(crate) unsafe fn $vnni<const NC: usize>(nb: usize, w: *const u8, xp: *const u8, out: *mut f32) {
            dot_packed_min::<true, false, NC>(nb, w, $wsize, xp, out, $dec)
        }
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
        pub(crate) unsafe fn $evex<const NC: usize>(nb: usize, w: *const u8, xp: *const u8, out: *mut f32) {
            dot_packed_min::<false, true, NC>(nb, w, $wsize, xp, out, $dec)
        }
    };
}

packed_min!(packed_q4_1, packed_q4_1_vnni, packed_q4_1_evex, BlockQ4_1::SIZE, |b| q4_1_quants(b));

#[inline(always)]
pub(crate) unsafe fn q5_1_quants(b: *const u8) -> __m256i {
    let hi = _mm256_and_si256(bits_32(b.add(offset_of!(BlockQ5_1, qh))), _mm256_set1_epi8(0x10));
    _mm256_or_si256(nibbles_32(b.add(offset_of!(BlockQ5_1, qs))), hi)
}
packed_min!(packed_q5_1, packed_q5_1_vnni, packed_q5_1_evex, BlockQ5_1::SIZE, |b| q5_1_quants(b));

/// Which build of the packed kernels: plain AVX2, AVX-VNNI, AVX-512 VNNI (EVEX), or AVX-512
/// without VNNI (`Bw`: the plain AVX2 packed kernels, and the zmm kernels of `avx2_rb` with
/// `maddubs` + `madd` for `vpdpbusd`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PackBuild {
    Plain,
    Vnni,
    Evex,
    Bw,
}

/// Unsigned-weight-with-min family (Q4_1, Q5_1 against Q8_1): per block
/// acc += (dw*dx) * sum(qw*qx), summ += mw * sx.
#[inline(always)]
unsafe fn dot_min_q8_1<const NC: usize, const V: bool>(
    n: usize,
    w: *const u8,
    wsize: usize,
    x: *const u8,
    xs: usize,
    xd: *const f32,
    xds: usize,
    out: *mut f32,
    decode: impl Fn(*const u8) -> __m256i,
) {
    let nb = n / 32;
    let mut acc = [_mm256_setzero_ps(); NC];
    // lane 1 accumulates m_w * s_x (lane 0 collects unused d products)
    let mut summ = [_mm_setzero_ps(); NC];
    for i in 0..nb {
        let bw = w.add(i * wsize);
        if NC <= PF_COLS {
            prefetch_w_l1(bw);
        }
        let dm = f16x2(bw); // (d_w, m_w)
        let qw = decode(bw);
        for c in 0..NC {
            let by = x.add(c * xs + i * BlockQ8_1::SIZE);
            let ds = if xd.is_null() {
                f16x2(by)
            } else {
                _mm_castpd_ps(_mm_load_sd(xd.add(c * xds + 2 * i) as *const f64))
            };
            let p = _mm_mul_ps(dm, ds); // (d_w * d_x, m_w * s_x)
            summ[c] = _mm_add_ps(summ[c], p);
            let d = _mm256_broadcastss_ps(p);
            let q = u8_i8_dot_ps::<V>(qw, load256(by.add(offset_of!(BlockQ8_1, qs))));
            acc[c] = _mm256_fmadd_ps(d, q, acc[c]);
        }
    }
    for c in 0..NC {
        *out.add(c) = hsum_ps(acc[c]) + _mm_cvtss_f32(_mm_movehdup_ps(summ[c]));
    }
}

/// A 32-element-block kernel in two builds: plain AVX2 and AVX2 + AVX-VNNI (same results).
macro_rules! legacy_kernel {
    ($plain:ident, $vnni:ident, $body:ident) => {
        #[target_feature(enable = "avx2,fma,f16c")]
        pub(crate) unsafe fn $plain<const NC: usize>(n: usize, w: *const u8, x: *const u8, xs: usize, xd: *const f32, xds: usize, out: *mut f32) {
            $body::<NC, false>(n, w, x, xs, xd, xds, out)
        }
        #[target_feature(enable = "avx2,fma,f16c,avxvnni")]
        pub(crate) unsafe fn $vnni<const NC: usize>(n: usize, w: *const u8, x: *const u8, xs: usize, xd: *const f32, xds: usize, out: *mut f32) {
            $body::<NC, true>(n, w, x, xs, xd, xds, out)
        }
    };
}

/// Signed-family block decoders (one per weight type, shared by the vec_dot, tile and
/// multi-row kernels): (d_w, the 32 quants as i8).
#[inline(always)]
unsafe fn dec_q4_0(b: *const u8) -> (f32, __m256i) {
    (f16(b), _mm256_sub_epi8(nibbles_32(b.add(offset_of!(BlockQ4_0, qs))), _mm256_set1_epi8(8)))
}
#[inline(always)]
unsafe fn dec_q5_0(b: *const u8) -> (f32, __m256i) {
    // bit clear -> value - 16 is negative: set the high nibble to 0xF (two's complement).
    let hi = _mm256_andnot_si256(bits_32(b.add(offset_of!(BlockQ5_0, qh))), _mm256_set1_epi8(0xF0u8 as i8));
    (f16(b), _mm256_or_si256(nibbles_32(b.add(offset_of!(BlockQ5_0, qs))), hi))
}
#[inline(always)]
unsafe fn dec_q8_0(b: *const u8) -> (f32, __m256i) {
    (f16(b), load256(b.add(offset_of!(BlockQ8_0, qs))))
}
#[inline(always)]
unsafe fn dec_iq4_nl(b: *const u8) -> (f32, __m256i) {
    (f16(b), iq4_lookup(b.add(offset_of!(BlockIQ4NL, qs))))
}
/// Q4_1 quants (u8, 0..=15); Q5_1's are `q5_1_quants`.
#[inline(always)]
pub(crate) unsafe fn q4_1_quants(b: *const u8) -> __m256i {
    nibbles_32(b.add(offset_of!(BlockQ4_1, qs)))
}

legacy_kernel!(dot_q4_0, dot_q4_0_vnni, body_q4_0);

#[inline(always)]
unsafe fn body_q4_0<const NC: usize, const V: bool>(n: usize, w: *const u8, x: *const u8, xs: usize, xd: *const f32, xds: usize, out: *mut f32) {
    dot_signed_q8_0::<NC, V>(n, w, BlockQ4_0::SIZE, x, xs, xd, xds, out, |b| dec_q4_0(b))
}

legacy_kernel!(dot_q5_0, dot_q5_0_vnni, body_q5_0);

#[inline(always)]
unsafe fn body_q5_0<const NC: usize, const V: bool>(n: usize, w: *const u8, x: *const u8, xs: usize, xd: *const f32, xds: usize, out: *mut f32) {
    dot_signed_q8_0::<NC, V>(n, w, BlockQ5_0::SIZE, x, xs, xd, xds, out, |b| dec_q5_0(b))
}

legacy_kernel!(dot_q8_0, dot_q8_0_vnni, body_q8_0);

#[inline(always)]
unsafe fn body_q8_0<const NC: usize, const V: bool>(n: usize, w: *const u8, x: *const u8, xs: usize, xd: *const f32, xds: usize, out: *mut f32) {
    dot_signed_q8_0::<NC, V>(n, w, BlockQ8_0::SIZE, x, xs, xd, xds, out, |b| dec_q8_0(b))
}

legacy_kernel!(dot_iq4_nl, dot_iq4_nl_vnni, body_iq4_nl);

#[inline(always)]
unsafe fn body_iq4_nl<const NC: usize, const V: bool>(n: usize, w: *const u8, x: *const u8, xs: usize, xd: *const f32, xds: usize, out: *mut f32) {
    dot_signed_q8_0::<NC, V>(n, w, BlockIQ4NL::SIZE, x, xs, xd, xds, out, |b| dec_iq4_nl(b))
}

legacy_kernel!(dot_q4_1, dot_q4_1_vnni, body_q4_1);

#[inline(always)]
unsafe fn body_q4_1<const NC: usize, const V: bool>(n: usize, w: *const u8, x: *const u8, xs: usize, xd: *const f32, xds: usize, out: *mut f32) {
    dot_min_q8_1::<NC, V>(n, w, BlockQ4_1::SIZE, x, xs, xd, xds, out, |b| q4_1_quants(b))
}

legacy_kernel!(dot_q5_1, dot_q5_1_vnni, body_q5_1);

#[inline(always)]
unsafe fn body_q5_1<const NC: usize, const V: bool>(n: usize, w: *const u8, x: *const u8, xs: usize, xd: *const f32, xds: usize, out: *mut f32) {
    dot_min_q8_1::<NC, V>(n, w, BlockQ5_1::SIZE, x, xs, xd, xds, out, |b| q5_1_quants(b))
}

// ------------------------------------------------------------------ K-quants

#[rustfmt::skip]
static SHUFFLE_K4: [u8; 256] = {
    let mut t = [0u8; 256];
    let mut i = 0;
    while i < 8 {
        let mut j = 0;
        while j < 16 { t[32 * i + 2 * j] = 2 * i as u8; t[32 * i + 2 * j + 1] = 2 * i as u8 + 1; j += 1; }
        i += 1;
    }
    t
};

/// Q3_K/Q2_K: i16 scale 2i for the first 16 bytes, 2i+1 for the next 16.
static SHUFFLE_Q3K: [u8; 128] = {
    let mut t = [0u8; 128];
    let mut i = 0;
    while i < 4 {
        let mut j = 0;
        while j < 8 {
            t[32 * i + 2 * j] = 4 * i as u8;
            t[32 * i + 2 * j + 1] = 4 * i as u8 + 1;
            t[32 * i + 16 + 2 * j] = 4 * i as u8 + 2;
            t[32 * i + 16 + 2 * j + 1] = 4 * i as u8 + 3;
            j += 1;
        }
        i += 1;
    }
    t
};

/// Q6_K: i8 scale 2i repeated 8 times then 2i+1 repeated 8 times.
static SHUFFLE_Q6K: [u8; 128] = {
    let mut t = [0u8; 128];
    let mut i = 0;
    while i < 8 {
        let mut j = 0;
        while j < 8 {
            t[16 * i + j] = 2 * i as u8;
            t[16 * i + 8 + j] = 2 * i as u8 + 1;
            j += 1;
        }
        i += 1;
    }
    t
};

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn shuf_k4(i: usize) -> __m256i {
    load256(SHUFFLE_K4.as_ptr().add(32 * i))
}
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn shuf_q3k(i: usize) -> __m256i {
    load256(SHUFFLE_Q3K.as_ptr().add(32 * i))
}
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn shuf_q6k(i: usize) -> __m128i {
    load128(SHUFFLE_Q6K.as_ptr().add(16 * i))
}

/// Q4_K/Q5_K: the 8 scales (i16 0..8) and 8 mins (i16 8..16) from the 12 packed bytes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn k4_mins_and_scales(p: *const u8) -> __m256i {
    const KMASK1: u32 = 0x3f3f3f3f;
    const KMASK2: u32 = 0x0f0f0f0f;
    const KMASK3: u32 = 0x03030303;
    let mut u = [0u32; 4];
    std::ptr::copy_nonoverlapping(p, u.as_mut_ptr() as *mut u8, 12);
    u[3] = ((u[2] >> 4) & KMASK2) | (((u[1] >> 6) & KMASK3) << 4);
    let uaux = u[1] & KMASK1;
    u[1] = (u[2] & KMASK2) | (((u[0] >> 6) & KMASK3) << 4);
    u[2] = uaux;
    u[0] &= KMASK1;
    _mm256_cvtepu8_epi16(_mm_set_epi32(u[3] as i32, u[2] as i32, u[1] as i32, u[0] as i32))
}

/// Q8_K pieces of column c's block i: (d, qs pointer, bsums pointer).
#[inline(always)]
unsafe fn q8k(x: *const u8, xs: usize, c: usize, i: usize) -> (*const u8, *const u8) {
    let b = x.add(c * xs + i * BlockQ8K::SIZE);
    (b, b.add(offset_of!(BlockQ8K, qs)))
}

/// Q4_K x Q8_K in the summation orders of llama.cpp's repacked q4_K_8x8 kernels (used on
/// x86 whenever a Q4_K tensor's row count is a multiple of 8): exact i32 sums of
/// scale * dot and of min * bsum, converted to f32 and FMA'd (times d_w * d_a, resp.
/// dmin_w * d_a) into separate scale and min accumulators; the result is their difference.
/// `SB = false`: one FMA per 256-element super-block (ggml_gemv_q4_K_8x8_q8_K, the
/// single-token kernel); `SB = true`: one FMA per 64-element pair of sub-blocks
/// (ggml_gemm_q4_K_8x8_q8_K, llama.cpp's 4-token kernel).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_q4_k_ord<const NC: usize, const SB: bool>(n: usize, w: *const u8, x: *const u8, xs: usize, _xd: *const f32, _xds: usize, out: *mut f32) {
    let nb = n / 256;
    let m4 = _mm256_set1_epi8(0xF);
    // the 8-column SB tile reduces its columns' i32 sums together and keeps its
    // accumulators in vector lanes (see below); every other shape keeps them in scalars
    let lanes8 = SB && NC == 8;
    let mut acc = [0f32; NC];
    let mut acc_m = [0f32; NC];
    let mut acc8 = _mm256_setzero_ps();
    let mut acc8_m = _mm256_setzero_ps();
    for i in 0..nb {
        let bw = w.add(i * BlockQ4K::SIZE);
        if NC <= PF_COLS {
            prefetch_block(bw, BlockQ4K::SIZE);
        }
        let dw = f16(bw);
        let dminw = f16(bw.add(offset_of!(BlockQ4K, dmin)));
        let ms = k4_mins_and_scales(bw.add(offset_of!(BlockQ4K, scales)));
        let mins = _mm256_extracti128_si256(ms, 1);
        let sc128 = _mm256_extracti128_si256(ms, 0);
        let scales = _mm256_set_m128i(sc128, sc128);
        let mut sumi = [_mm256_setzero_si256(); NC];
        let mut dsc = [0f32; NC];
        let mut dmn = [0f32; NC];
        let mut prod = [_mm_setzero_si128(); NC];
        let mut min_lanes = [[0i32; 4]; NC];
        for c in 0..NC {
            let (by, q8) = q8k(x, xs, c, i);
            let yd = f32_at(by);
            dsc[c] = dw * yd;
            dmn[c] = dminw * yd;
            let bs = load256(q8.add(256));
            let q8s = _mm_hadd_epi16(_mm256_extracti128_si256(bs, 0), _mm256_extracti128_si256(bs, 1));
            // lane j: min(2j) * bsum(sub-block 2j) + min(2j+1) * bsum(sub-block 2j+1)
            prod[c] = _mm_madd_epi16(mins, q8s);
            if SB && !lanes8 {
                _mm_storeu_si128(min_lanes[c].as_mut_ptr() as *mut __m128i, prod[c]);
            }
        }
        // lanes8: d_w * d_a, dmin_w * d_a and the mins of group j, one lane per column
        let (mut dsc8, mut dmn8, mut mins8) = (_mm256_setzero_ps(), _mm256_setzero_ps(), [_mm256_setzero_si256(); 4]);
        if lanes8 {
            dsc8 = _mm256_loadu_ps(dsc.as_ptr());
            dmn8 = _mm256_loadu_ps(dmn.as_ptr());
            mins8 = transpose_4x8_i32(&*(prod.as_ptr() as *const [__m128i; 8]));
        }
        let q4 = bw.add(offset_of!(BlockQ4K, qs));
        for j in 0..4 {
            let scale_l = _mm256_shuffle_epi8(scales, shuf_k4(2 * j));
            let scale_h = _mm256_shuffle_epi8(scales, shuf_k4(2 * j + 1));
            let bits = load256(q4.add(32 * j));
            let q4l = _mm256_and_si256(bits, m4);
            let q4h = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);
            let mut v = [_mm256_setzero_si256(); NC];
            for c in 0..NC {
                let (_, q8) = q8k(x, xs, c, i);
                let pl = _mm256_madd_epi16(scale_l, _mm256_maddubs_epi16(q4l, load256(q8.add(64 * j))));
                let ph = _mm256_madd_epi16(scale_h, _mm256_maddubs_epi16(q4h, load256(q8.add(64 * j + 32))));
                v[c] = _mm256_add_epi32(pl, ph);
            }
            if lanes8 {
                // the same fma(isum, d_w * d_a, acc) per column as below, in eight lanes:
                // integer sums do not depend on their order, so one hadd tree gives all 8
                let isum = hsum_i32_x8(&*(v.as_ptr() as *const [__m256i; 8]));
                acc8 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), dsc8, acc8);
                acc8_m = _mm256_fmadd_ps(_mm256_cvtepi32_ps(mins8[j]), dmn8, acc8_m);
            } else if SB {
                for c in 0..NC {
                    acc[c] = (hsum_i32(v[c]) as f32).mul_add(dsc[c], acc[c]);
                    acc_m[c] = (min_lanes[c][j] as f32).mul_add(dmn[c], acc_m[c]);
                }
            } else {
                for c in 0..NC {
                    sumi[c] = _mm256_add_epi32(sumi[c], v[c]);
                }
            }
        }
        if !SB {
            for c in 0..NC {
                acc[c] = (hsum_i32(sumi[c]) as f32).mul_add(dsc[c], acc[c]);
                acc_m[c] = (hsum_i32_128(prod[c]) as f32).mul_add(dmn[c], acc_m[c]);
            }
        }
    }
    if lanes8 {
        _mm256_storeu_ps(out, _mm256_sub_ps(acc8, acc8_m));
        return;
    }
    for c in 0..NC {
        *out.add(c) = acc[c] - acc_m[c];
    }
}

/// pyllama's Q4_K kernel: the 64-element order of llama.cpp's gemm for every token count,
/// so results stay independent of the batch (llama.cpp's own choice between its gemv and
/// gemm orders depends on how many rows the batch has).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_q4_k<const NC: usize>(n: usize, w: *const u8, x: *const u8, xs: usize, xd: *const f32, xds: usize, out: *mut f32) {
    dot_q4_k_ord::<NC, true>(n, w, x, xs, xd, xds, out)
}

/// Q4_K single-token multi-row kernel (`DotRows`): eight weight rows per pass, one row per
/// float lane, each row getting exactly `dot_q4_k::<1>`'s operations (the exact i32 sums
/// of each 64-element pair of sub-blocks, then one FMA into the scale accumulator and one
/// into the min accumulator per pair; the result is their difference) in the same order;
/// the rows left after the passes take `dot_q4_k::<1>` itself. The single-row kernel pays
/// a horizontal sum and two dependent scalar FMAs per 64 elements and a call per row (a
/// 1024-wide Q4_K row, Gemma 3's attn_output, is four super-blocks): here one 8-row
/// reduction and two 8-lane FMAs per 64 elements serve eight rows, and the activations'
/// scale and block sums are read once per pass.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn rows_q4_k(n: usize, w: *const u8, ws: usize, nrows: usize, x: *const u8, xd: *const f32, out: *mut f32) {
    rows_q4_k_body::<false>(n, w, ws, nrows, x, xd, out)
}

/// `rows_q4_k` with EVEX `vpdpbusd` (AVX-512 VL + VNNI), the AVX-512 set's: per 32 weights
/// one `vpdpbusd` gives the sums of 4 products (|.| <= 4 * 15 * 128, so they pack to i16
/// exactly), the low and high sub-blocks' sums are packed into one vector and one `madd`
/// with the two scales gives the pair's i32 partial sums: the same exact i32 pair sums as
/// the `maddubs` / `madd` steps (one multiply and one shuffle fewer per 32 weights).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
pub(crate) unsafe fn rows_q4_k_evex(n: usize, w: *const u8, ws: usize, nrows: usize, x: *const u8, xd: *const f32, out: *mut f32) {
    rows_q4_k_body::<true>(n, w, ws, nrows, x, xd, out)
}

/// i16 scales for `rows_q4_k_evex`'s packed sums of pair j: scale 2j for i16 lanes 0..4 of
/// each 128-bit half, scale 2j + 1 for lanes 4..8 (from the 8 scales as i16 in both halves).
static SHUFFLE_K4_PACKED: [u8; 128] = {
    let mut t = [0u8; 128];
    let mut j = 0;
    while j < 4 {
        let mut b = 0;
        while b < 32 {
            let lane = (b % 16) / 2; // i16 lane within the half
            let sc = if lane < 4 { 2 * j } else { 2 * j + 1 };
            t[32 * j + b] = (2 * sc + b % 2) as u8;
            b += 1;
        }
        j += 1;
    }
    t
};

#[inline(always)]
unsafe fn rows_q4_k_body<const EVEX: bool>(n: usize, w: *const u8, ws: usize, nrows: usize, x: *const u8, _xd: *const f32, out: *mut f32) {
    const R: usize = 8;
    let nb = n / 256;
    let m4 = _mm256_set1_epi8(0xF);
    let dist = PF_AHEAD.max(R * ws);
    let mut r0 = 0;
    while r0 + R <= nrows {
        let w = w.add(r0 * ws);
        let mut acc = _mm256_setzero_ps();
        let mut acc_m = _mm256_setzero_ps();
        for i in 0..nb {
            prefetch_step::<false>(w, dist, i, R * BlockQ4K::SIZE);
            let (by, q8) = q8k(x, 0, 0, i);
            let yd = _mm256_set1_ps(f32_at(by));
            let bs = load256(q8.add(256));
            let q8s = _mm_hadd_epi16(_mm256_extracti128_si256(bs, 0), _mm256_extracti128_si256(bs, 1));
            // per row: its four pair sums (lane j: pair j) and its four min products
            let mut sums = [_mm_setzero_si128(); R];
            let mut mins = [_mm_setzero_si128(); R];
            let mut dw = [0f32; R];
            let mut dminw = [0f32; R];
            for r in 0..R {
                let bw = w.add(r * ws + i * BlockQ4K::SIZE);
                dw[r] = f16(bw);
                dminw[r] = f16(bw.add(offset_of!(BlockQ4K, dmin)));
                let ms = k4_mins_and_scales(bw.add(offset_of!(BlockQ4K, scales)));
                mins[r] = _mm_madd_epi16(_mm256_extracti128_si256(ms, 1), q8s);
                let sc128 = _mm256_extracti128_si256(ms, 0);
                let scales = _mm256_set_m128i(sc128, sc128);
                let q4 = bw.add(offset_of!(BlockQ4K, qs));
                let mut v = [_mm256_setzero_si256(); 4];
                for (j, vj) in v.iter_mut().enumerate() {
                    let bits = load256(q4.add(32 * j));
                    let q4l = _mm256_and_si256(bits, m4);
                    let q4h = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);
                    if EVEX {
                        let z = _mm256_setzero_si256();
                        let dl = _mm256_dpbusd_epi32(z, q4l, load256(q8.add(64 * j)));
                        let dh = _mm256_dpbusd_epi32(z, q4h, load256(q8.add(64 * j + 32)));
                        let sc = _mm256_shuffle_epi8(scales, load256(SHUFFLE_K4_PACKED.as_ptr().add(32 * j)));
                        *vj = _mm256_madd_epi16(_mm256_packs_epi32(dl, dh), sc);
                    } else {
                        let pl = _mm256_madd_epi16(_mm256_shuffle_epi8(scales, shuf_k4(2 * j)), _mm256_maddubs_epi16(q4l, load256(q8.add(64 * j))));
                        let ph = _mm256_madd_epi16(_mm256_shuffle_epi8(scales, shuf_k4(2 * j + 1)), _mm256_maddubs_epi16(q4h, load256(q8.add(64 * j + 32))));
                        *vj = _mm256_add_epi32(pl, ph);
                    }
                }
                // the four exact i32 sums (integer sums do not depend on their order)
                let h = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
                sums[r] = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
            }
            // d_w * d_a and dmin_w * d_a, one lane per row (the single-row kernel's products)
            let dsc = _mm256_mul_ps(_mm256_loadu_ps(dw.as_ptr()), yd);
            let dmn = _mm256_mul_ps(_mm256_loadu_ps(dminw.as_ptr()), yd);
            let (s, m) = (transpose_4x8_i32(&sums), transpose_4x8_i32(&mins));
            for j in 0..4 {
                acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[j]), dsc, acc);
                acc_m = _mm256_fmadd_ps(_mm256_cvtepi32_ps(m[j]), dmn, acc_m);
            }
        }
        _mm256_storeu_ps(out.add(r0), _mm256_sub_ps(acc, acc_m));
        r0 += R;
    }
    for r in r0..nrows {
        dot_q4_k_ord::<1, true>(n, w.add(r * ws), x, 0, std::ptr::null(), 0, out.add(r));
    }
}

/// Eight rows of four i32 lanes to four vectors of eight lanes: out[j] lane r = p[r] lane j.
#[inline(always)]
pub(crate) unsafe fn transpose_4x8_i32(p: &[__m128i; 8]) -> [__m256i; 4] {
    let tr = |p: &[__m128i]| {
        let t0 = _mm_unpacklo_epi32(p[0], p[1]);
        let t1 = _mm_unpacklo_epi32(p[2], p[3]);
        let t2 = _mm_unpackhi_epi32(p[0], p[1]);
        let t3 = _mm_unpackhi_epi32(p[2], p[3]);
        [_mm_unpacklo_epi64(t0, t1), _mm_unpackhi_epi64(t0, t1), _mm_unpacklo_epi64(t2, t3), _mm_unpackhi_epi64(t2, t3)]
    };
    let (lo, hi) = (tr(&p[..4]), tr(&p[4..]));
    [_mm256_set_m128i(hi[0], lo[0]), _mm256_set_m128i(hi[1], lo[1]), _mm256_set_m128i(hi[2], lo[2]), _mm256_set_m128i(hi[3], lo[3])]
}

/// `PYLLAMA_ORDER=llamacpp`: choose the K-quant kernels' summation order per matmul the
/// way llama.cpp 0c1e570 does on x86 with AVX2 (Q4_K: its repacked gemv order for tokens left
/// over after groups of 4, gemm order within them; Q6_K: its tiled order for batches of 8 or
/// more rows, its vec_dot order below). Logits then match llama.cpp bit for bit on the
/// reference prompts, but depend on the batch size, as llama.cpp's do: pyllama's default
/// uses the batch (prompt) orders for every token count instead, so results are the same
/// whatever n_ubatch.
pub(crate) fn llamacpp_order() -> bool {
    super::cpu::env().llamacpp_order
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_q5_k<const NC: usize>(n: usize, w: *const u8, x: *const u8, xs: usize, _xd: *const f32, _xds: usize, out: *mut f32) {
    let nb = n / 256;
    let m4 = _mm256_set1_epi8(0xF);
    let mut acc = [_mm256_setzero_ps(); NC];
    let mut acc_m = [_mm_setzero_ps(); NC];
    for i in 0..nb {
        let bw = w.add(i * BlockQ5K::SIZE);
        if NC <= PF_COLS {
            prefetch_block(bw, BlockQ5K::SIZE);
        }
        let dw = f16(bw);
        let dminw = f16(bw.add(offset_of!(BlockQ5K, dmin)));
        let ms = k4_mins_and_scales(bw.add(offset_of!(BlockQ5K, scales)));
        let mins = _mm256_extracti128_si256(ms, 1);
        let sc128 = _mm256_extracti128_si256(ms, 0);
        let scales = _mm256_set_m128i(sc128, sc128);
        let hbits = load256(bw.add(offset_of!(BlockQ5K, qh)));
        let q5 = bw.add(offset_of!(BlockQ5K, qs));
        let mut sumi = [_mm256_setzero_si256(); NC];
        for j in 0..4 {
            let scale_0 = _mm256_shuffle_epi8(scales, shuf_k4(2 * j));
            let scale_1 = _mm256_shuffle_epi8(scales, shuf_k4(2 * j + 1));
            let bits = load256(q5.add(32 * j));
            // 5th bit of sub-block 2j is bit 2j of qh, of sub-block 2j+1 bit 2j+1.
            let h0 = _mm256_cmpeq_epi8(
                _mm256_and_si256(hbits, _mm256_set1_epi8((1u8 << (2 * j)) as i8)),
                _mm256_setzero_si256(),
            );
            let h1 = _mm256_cmpeq_epi8(
                _mm256_and_si256(hbits, _mm256_set1_epi8((1u8 << (2 * j + 1)) as i8)),
                _mm256_setzero_si256(),
            );
            let q5_0 = _mm256_or_si256(_mm256_and_si256(bits, m4), _mm256_andnot_si256(h0, _mm256_set1_epi8(16)));
            let q5_1 = _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4),
                _mm256_andnot_si256(h1, _mm256_set1_epi8(16)),
            );
            for c in 0..NC {
                let (_, q8) = q8k(x, xs, c, i);
                let p0 = _mm256_madd_epi16(scale_0, _mm256_maddubs_epi16(q5_0, load256(q8.add(64 * j))));
                let p1 = _mm256_madd_epi16(scale_1, _mm256_maddubs_epi16(q5_1, load256(q8.add(64 * j + 32))));
                sumi[c] = _mm256_add_epi32(sumi[c], _mm256_add_epi32(p0, p1));
            }
        }
        for c in 0..NC {
            let (by, q8) = q8k(x, xs, c, i);
            let yd = f32_at(by);
            let bs = load256(q8.add(256));
            let q8s = _mm_hadd_epi16(_mm256_extracti128_si256(bs, 0), _mm256_extracti128_si256(bs, 1));
            let prod = _mm_madd_epi16(mins, q8s);
            acc_m[c] = _mm_fmadd_ps(_mm_set1_ps(-yd * dminw), _mm_cvtepi32_ps(prod), acc_m[c]);
            acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(yd * dw), _mm256_cvtepi32_ps(sumi[c]), acc[c]);
        }
    }
    for c in 0..NC {
        *out.add(c) = hsum_ps(acc[c]) + hsum_ps128(acc_m[c]);
    }
}

/// Q6_K x Q8_K. `TILED = false`: ggml's AVX2 vec_dot order (8 float lanes, one FMA per
/// super-block each, a horizontal sum at the end); llama.cpp runs it for batches of fewer
/// than 8 rows. `TILED = true`: the order of llama.cpp's tiled K-quant matmul
/// (ggml-cpu/tiled, batches of 8 rows or more): per super-block the exact i32 sum times
/// d_w, then one FMA with d_a into a single accumulator.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_q6_k_ord<const NC: usize, const TILED: bool>(n: usize, w: *const u8, x: *const u8, xs: usize, _xd: *const f32, _xds: usize, out: *mut f32) {
    let nb = n / 256;
    let m4 = _mm256_set1_epi8(0xF);
    let m2 = _mm256_set1_epi8(3);
    let mut acc = [_mm256_setzero_ps(); NC];
    let mut acc1 = [0f32; NC];
    for i in 0..nb {
        let bw = w.add(i * BlockQ6K::SIZE);
        if NC <= PF_COLS {
            prefetch_block(bw, BlockQ6K::SIZE);
        }
        let dw = f16(bw.add(offset_of!(BlockQ6K, d)));
        let scales = load128(bw.add(offset_of!(BlockQ6K, scales)));
        let mut sumi = [_mm256_setzero_si256(); NC];
        for j in 0..2 {
            let ql = bw.add(offset_of!(BlockQ6K, ql) + 64 * j);
            let qh = bw.add(offset_of!(BlockQ6K, qh) + 32 * j);
            let b1 = load256(ql);
            let b2 = load256(ql.add(32));
            let bh = load256(qh);
            let h0 = _mm256_slli_epi16(_mm256_and_si256(bh, m2), 4);
            let h1 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(bh, 2), m2), 4);
            let h2 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(bh, 4), m2), 4);
            let h3 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(bh, 6), m2), 4);
            let q = [
                _mm256_or_si256(_mm256_and_si256(b1, m4), h0),
                _mm256_or_si256(_mm256_and_si256(b2, m4), h1),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b1, 4), m4), h2),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b2, 4), m4), h3),
            ];
            let sc = [
                _mm256_cvtepi8_epi16(_mm_shuffle_epi8(scales, shuf_q6k(4 * j))),
                _mm256_cvtepi8_epi16(_mm_shuffle_epi8(scales, shuf_q6k(4 * j + 1))),
                _mm256_cvtepi8_epi16(_mm_shuffle_epi8(scales, shuf_q6k(4 * j + 2))),
                _mm256_cvtepi8_epi16(_mm_shuffle_epi8(scales, shuf_q6k(4 * j + 3))),
            ];
            for c in 0..NC {
                let (_, q8) = q8k(x, xs, c, i);
                let q8 = q8.add(128 * j);
                let mut s = _mm256_setzero_si256();
                for k in 0..4 {
                    let y = load256(q8.add(32 * k));
                    let p = _mm256_maddubs_epi16(q[k], y);
                    s = _mm256_add_epi32(s, _mm256_madd_epi16(sc[k], p));
                }
                sumi[c] = _mm256_add_epi32(sumi[c], s);
            }
        }
        // The -32 offset of the 6-bit values comes off at the end, as 32 * scale * bsum per
        // pair of 16-element groups (lane k: groups 2k and 2k+1), exactly as ggml's AVX2
        // kernel does: the float result depends on how the integer sum is split over lanes.
        let scales_16 = _mm256_cvtepi8_epi16(scales);
        for c in 0..NC {
            let (by, q8) = q8k(x, xs, c, i);
            let sub = _mm256_slli_epi32(_mm256_madd_epi16(load256(q8.add(256)), scales_16), 5);
            sumi[c] = _mm256_sub_epi32(sumi[c], sub);
            if TILED {
                acc1[c] = (dw * hsum_i32(sumi[c]) as f32).mul_add(f32_at(by), acc1[c]);
            } else {
                acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(f32_at(by) * dw), _mm256_cvtepi32_ps(sumi[c]), acc[c]);
            }
        }
    }
    for c in 0..NC {
        *out.add(c) = if TILED { acc1[c] } else { hsum_ps(acc[c]) };
    }
}

/// pyllama's Q6_K kernel: llama.cpp's tiled (prompt) order for every token count, so
/// results do not depend on the batch.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_q6_k<const NC: usize>(n: usize, w: *const u8, x: *const u8, xs: usize, xd: *const f32, xds: usize, out: *mut f32) {
    dot_q6_k_ord::<NC, true>(n, w, x, xs, xd, xds, out)
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_q2_k<const NC: usize>(n: usize, w: *const u8, x: *const u8, xs: usize, _xd: *const f32, _xds: usize, out: *mut f32) {
    let nb = n / 256;
    let m3 = _mm256_set1_epi8(3);
    let m4 = _mm_set1_epi8(0xF);
    let mut acc = [_mm256_setzero_ps(); NC];
    for i in 0..nb {
        let bw = w.add(i * BlockQ2K::SIZE);
        let dw = f16(bw.add(offset_of!(BlockQ2K, d)));
        let dminw = f16(bw.add(offset_of!(BlockQ2K, dmin)));
        let ms = load128(bw);
        let scales8 = _mm_and_si128(ms, m4);
        let mins = _mm256_cvtepi8_epi16(_mm_and_si128(_mm_srli_epi16(ms, 4), m4));
        let all = _mm256_cvtepi8_epi16(scales8);
        let l = _mm256_extracti128_si256(all, 0);
        let h = _mm256_extracti128_si256(all, 1);
        let scales = [_mm256_set_m128i(l, l), _mm256_set_m128i(h, h)];
        let mut sumi = [_mm256_setzero_si256(); NC];
        for j in 0..2 {
            let bits = load256(bw.add(offset_of!(BlockQ2K, qs) + 32 * j));
            let q = [
                _mm256_and_si256(bits, m3),
                _mm256_and_si256(_mm256_srli_epi16(bits, 2), m3),
                _mm256_and_si256(_mm256_srli_epi16(bits, 4), m3),
                _mm256_and_si256(_mm256_srli_epi16(bits, 6), m3),
            ];
            let sc = [
                _mm256_shuffle_epi8(scales[j], shuf_q3k(0)),
                _mm256_shuffle_epi8(scales[j], shuf_q3k(1)),
                _mm256_shuffle_epi8(scales[j], shuf_q3k(2)),
                _mm256_shuffle_epi8(scales[j], shuf_q3k(3)),
            ];
            for c in 0..NC {
                let (_, q8) = q8k(x, xs, c, i);
                let q8 = q8.add(128 * j);
                let mut s = _mm256_setzero_si256();
                for k in 0..4 {
                    let p = _mm256_madd_epi16(sc[k], _mm256_maddubs_epi16(q[k], load256(q8.add(32 * k))));
                    s = _mm256_add_epi32(s, p);
                }
                sumi[c] = _mm256_add_epi32(sumi[c], s);
            }
        }
        for c in 0..NC {
            let (by, q8) = q8k(x, xs, c, i);
            let yd = f32_at(by);
            let prod = _mm256_madd_epi16(mins, load256(q8.add(256)));
            acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(-yd * dminw), _mm256_cvtepi32_ps(prod), acc[c]);
            acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(yd * dw), _mm256_cvtepi32_ps(sumi[c]), acc[c]);
        }
    }
    for c in 0..NC {
        *out.add(c) = hsum_ps(acc[c]);
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_q3_k<const NC: usize>(n: usize, w: *const u8, x: *const u8, xs: usize, _xd: *const f32, _xds: usize, out: *mut f32) {
    let nb = n / 256;
    let m3 = _mm256_set1_epi8(3);
    let mut acc = [_mm256_setzero_ps(); NC];
    for i in 0..nb {
        let bw = w.add(i * BlockQ3K::SIZE);
        let dw = f16(bw.add(offset_of!(BlockQ3K, d)));
        // The 16 6-bit scales: low 4 bits in bytes 0..8 (nibbles), high 2 bits in 8..12.
        let mut a = [0u32; 3];
        std::ptr::copy_nonoverlapping(bw.add(offset_of!(BlockQ3K, scales)), a.as_mut_ptr() as *mut u8, 12);
        const KM1: u32 = 0x03030303;
        const KM2: u32 = 0x0f0f0f0f;
        let sc = _mm_set_epi32(
            (((a[1] >> 4) & KM2) | (((a[2] >> 6) & KM1) << 4)) as i32,
            (((a[0] >> 4) & KM2) | (((a[2] >> 4) & KM1) << 4)) as i32,
            ((a[1] & KM2) | (((a[2] >> 2) & KM1) << 4)) as i32,
            ((a[0] & KM2) | ((a[2] & KM1) << 4)) as i32,
        );
        let all = _mm256_cvtepi8_epi16(_mm_sub_epi8(sc, _mm_set1_epi8(32)));
        let l = _mm256_extracti128_si256(all, 0);
        let h = _mm256_extracti128_si256(all, 1);
        let scales = [_mm256_set_m128i(l, l), _mm256_set_m128i(h, h)];
        let hbits = load256(bw);
        let mut sumi = [_mm256_setzero_si256(); NC];
        for j in 0..2 {
            let bits = load256(bw.add(offset_of!(BlockQ3K, qs) + 32 * j));
            let mut ql = [_mm256_setzero_si256(); 4];
            let mut qh = [_mm256_setzero_si256(); 4];
            for k in 0..4 {
                let bit = (4 * j + k) as i32;
                ql[k] = _mm256_and_si256(_mm256_srl_epi16(bits, _mm_cvtsi32_si128(2 * k as i32)), m3);
                // 4 where the high bit is clear (value - 4), else 0.
                let clear = _mm256_cmpeq_epi8(
                    _mm256_and_si256(hbits, _mm256_set1_epi8((1u8 << bit) as i8)),
                    _mm256_setzero_si256(),
                );
                qh[k] = _mm256_and_si256(clear, _mm256_set1_epi8(4));
            }
            let sc = [
                _mm256_shuffle_epi8(scales[j], shuf_q3k(0)),
                _mm256_shuffle_epi8(scales[j], shuf_q3k(1)),
                _mm256_shuffle_epi8(scales[j], shuf_q3k(2)),
                _mm256_shuffle_epi8(scales[j], shuf_q3k(3)),
            ];
            for c in 0..NC {
                let (_, q8) = q8k(x, xs, c, i);
                let q8 = q8.add(128 * j);
                let mut s = _mm256_setzero_si256();
                for k in 0..4 {
                    let y = load256(q8.add(32 * k));
                    let p = _mm256_sub_epi16(_mm256_maddubs_epi16(ql[k], y), _mm256_maddubs_epi16(qh[k], y));
                    s = _mm256_add_epi32(s, _mm256_madd_epi16(sc[k], p));
                }
                sumi[c] = _mm256_add_epi32(sumi[c], s);
            }
        }
        for c in 0..NC {
            let (by, _) = q8k(x, xs, c, i);
            acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(dw * f32_at(by)), _mm256_cvtepi32_ps(sumi[c]), acc[c]);
        }
    }
    for c in 0..NC {
        *out.add(c) = hsum_ps(acc[c]);
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_iq4_xs<const NC: usize>(n: usize, w: *const u8, x: *const u8, xs: usize, _xd: *const f32, _xds: usize, out: *mut f32) {
    let nb = n / 256;
    let mut acc = [_mm256_setzero_ps(); NC];
    for i in 0..nb {
        let bw = w.add(i * BlockIQ4XS::SIZE);
        let dw = f16(bw);
        let sh = std::ptr::read_unaligned(bw.add(offset_of!(BlockIQ4XS, scales_h)) as *const u16);
        let mut sumi = [_mm256_setzero_si256(); NC];
        for ib in 0..8 {
            let lo = (*bw.add(offset_of!(BlockIQ4XS, scales_l) + ib / 2) >> (4 * (ib % 2))) & 0xF;
            let ls = ((lo as u16 | (((sh >> (2 * ib)) & 3) << 4)) as i16) - 32;
            let vls = _mm256_set1_epi16(ls);
            let qw = iq4_lookup(bw.add(offset_of!(BlockIQ4XS, qs) + 16 * ib));
            let aw = _mm256_sign_epi8(qw, qw);
            for c in 0..NC {
                let (_, q8) = q8k(x, xs, c, i);
                let sy = _mm256_sign_epi8(load256(q8.add(32 * ib)), qw);
                let p = _mm256_madd_epi16(_mm256_maddubs_epi16(aw, sy), vls);
                sumi[c] = _mm256_add_epi32(sumi[c], p);
            }
        }
        for c in 0..NC {
            let (by, _) = q8k(x, xs, c, i);
            acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(dw * f32_at(by)), _mm256_cvtepi32_ps(sumi[c]), acc[c]);
        }
    }
    for c in 0..NC {
        *out.add(c) = hsum_ps(acc[c]);
    }
}

// ------------------------------------------------------------------ float rows

/// Shared float kernel: 16 elements per step into two 8-lane accumulators per column,
/// scalar tail. `load(p, k)` converts 8 elements starting at element k of row p.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_float<const NC: usize>(
    n: usize,
    w: *const u8,
    x: *const u8,
    xs: usize,
    out: *mut f32,
    load: impl Fn(*const u8, usize) -> __m256,
    scalar: impl Fn(*const u8, usize) -> f32,
) {
    let mut a0 = [_mm256_setzero_ps(); NC];
    let mut a1 = [_mm256_setzero_ps(); NC];
    let n16 = n / 16 * 16;
    let mut k = 0;
    while k < n16 {
        let w0 = load(w, k);
        let w1 = load(w, k + 8);
        for c in 0..NC {
            let xc = x.add(c * xs);
            a0[c] = _mm256_fmadd_ps(w0, load(xc, k), a0[c]);
            a1[c] = _mm256_fmadd_ps(w1, load(xc, k + 8), a1[c]);
        }
        k += 16;
    }
    for c in 0..NC {
        let mut s = hsum_ps(_mm256_add_ps(a0[c], a1[c]));
        let xc = x.add(c * xs);
        for k in n16..n {
            s += scalar(w, k) * scalar(xc, k);
        }
        *out.add(c) = s;
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_f32<const NC: usize>(n: usize, w: *const u8, x: *const u8, xs: usize, _xd: *const f32, _xds: usize, out: *mut f32) {
    dot_float::<NC>(
        n,
        w,
        x,
        xs,
        out,
        |p, k| _mm256_loadu_ps(p.add(4 * k) as *const f32),
        |p, k| f32_at(p.add(4 * k)),
    )
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_f16<const NC: usize>(n: usize, w: *const u8, x: *const u8, xs: usize, _xd: *const f32, _xds: usize, out: *mut f32) {
    dot_float::<NC>(n, w, x, xs, out, |p, k| _mm256_cvtph_ps(load128(p.add(2 * k))), |p, k| f16(p.add(2 * k)))
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_bf16<const NC: usize>(n: usize, w: *const u8, x: *const u8, xs: usize, _xd: *const f32, _xds: usize, out: *mut f32) {
    dot_float::<NC>(
        n,
        w,
        x,
        xs,
        out,
        |p, k| _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(load128(p.add(2 * k))), 16)),
        |p, k| f32::from_bits((std::ptr::read_unaligned(p.add(2 * k) as *const u16) as u32) << 16),
    )
}

// ------------------------------------------------------------------ activation quantizers

/// max |x| over 32 floats at p.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn absmax_32(p: *const f32) -> (f32, [__m256; 4]) {
    let sign = _mm256_set1_ps(-0.0);
    let v = [
        _mm256_loadu_ps(p),
        _mm256_loadu_ps(p.add(8)),
        _mm256_loadu_ps(p.add(16)),
        _mm256_loadu_ps(p.add(24)),
    ];
    let mut m = _mm256_andnot_ps(sign, v[0]);
    m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v[1]));
    m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v[2]));
    m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v[3]));
    let m4 = _mm_max_ps(_mm256_extractf128_ps(m, 1), _mm256_castps256_ps128(m));
    let m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    let m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    (_mm_cvtss_f32(m4), v)
}

/// 4 x 8 floats * id, rounded half to even -> 32 i8 in order (and their i32 sum).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn round_pack_32(v: [__m256; 4], id: f32, dst: *mut u8) -> __m256i {
    let mul = _mm256_set1_ps(id);
    let r = |x: __m256| _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(x, mul), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    let (i0, i1, i2, i3) = (r(v[0]), r(v[1]), r(v[2]), r(v[3]));
    let sum = _mm256_add_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3));
    let a = _mm256_packs_epi32(i0, i1);
    let b = _mm256_packs_epi32(i2, i3);
    let p = _mm256_packs_epi16(a, b);
    let p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(dst as *mut __m256i, p);
    sum
}

/// Lane c = the (wrapping) sum of the 8 lanes of v[c]: eight horizontal sums at once.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn hsum_i32_x8(v: &[__m256i; 8]) -> __m256i {
    let s01 = _mm256_hadd_epi32(v[0], v[1]);
    let s23 = _mm256_hadd_epi32(v[2], v[3]);
    let s45 = _mm256_hadd_epi32(v[4], v[5]);
    let s67 = _mm256_hadd_epi32(v[6], v[7]);
    let s0123 = _mm256_hadd_epi32(s01, s23);
    let s4567 = _mm256_hadd_epi32(s45, s67);
    _mm256_add_epi32(_mm256_permute2x128_si256(s0123, s4567, 0x20), _mm256_permute2x128_si256(s0123, s4567, 0x31))
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn hsum_i32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_extracti128_si256(v, 1), _mm256_castsi256_si128(v));
    let s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 1));
    _mm_cvtsi128_si32(s)
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn hsum_i32_128(s: __m128i) -> i32 {
    let s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 1));
    _mm_cvtsi128_si32(s)
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn quantize_q8_0_avx2(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(32).zip(dst.chunks_exact_mut(BlockQ8_0::SIZE)) {
        let (amax, v) = absmax_32(x.as_ptr());
        let d = amax / 127.0;
        b[0..2].copy_from_slice(&super::fp::f32_to_f16(d).to_le_bytes());
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        round_pack_32(v, id, b.as_mut_ptr().add(2));
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn quantize_q8_1_avx2(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(32).zip(dst.chunks_exact_mut(BlockQ8_1::SIZE)) {
        let (amax, v) = absmax_32(x.as_ptr());
        let d = amax / 127.0;
        b[0..2].copy_from_slice(&super::fp::f32_to_f16(d).to_le_bytes());
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        let sum = hsum_i32(round_pack_32(v, id, b.as_mut_ptr().add(4)));
        b[2..4].copy_from_slice(&super::fp::f32_to_f16(d * sum as f32).to_le_bytes());
    }
}

/// `quantize_row_q8_K_ref` vectorized: same first-max rule, same round-half-even
/// (`nearest_int`), same min(127) clamp, same bsums.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn quantize_q8_k_avx2(src: &[f32], dst: &mut [u8]) {
    let sign = _mm256_set1_ps(-0.0);
    for (x, b) in src.chunks_exact(256).zip(dst.chunks_exact_mut(BlockQ8K::SIZE)) {
        let p = x.as_ptr();
        // four independent max chains (one chain waited on each max's latency); max is
        // exact in any order, and with |x| first a NaN is skipped, as ggml's `ax > amax`
        // skips it
        let (mut m0, mut m1, mut m2, mut m3) = (_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps());
        let a = |k: usize| _mm256_andnot_ps(sign, _mm256_loadu_ps(p.add(8 * k)));
        for k in (0..32).step_by(4) {
            m0 = _mm256_max_ps(a(k), m0);
            m1 = _mm256_max_ps(a(k + 1), m1);
            m2 = _mm256_max_ps(a(k + 2), m2);
            m3 = _mm256_max_ps(a(k + 3), m3);
        }
        let m = _mm256_max_ps(_mm256_max_ps(m0, m1), _mm256_max_ps(m2, m3));
        let m4 = _mm_max_ps(_mm256_extractf128_ps(m, 1), _mm256_castps256_ps128(m));
        let m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        let amax = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
        if amax == 0.0 {
            b.fill(0);
            continue;
        }
        // The signed value of the first element with |x| == amax (ggml keeps the first).
        let max = {
            // (8 lanes at a time, where it was a scalar search)
            let a = _mm256_set1_ps(amax);
            let mut found = amax;
            for k in 0..32 {
                let hit = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_EQ_OQ>(_mm256_andnot_ps(sign, _mm256_loadu_ps(p.add(8 * k))), a));
                if hit != 0 {
                    found = *p.add(8 * k + hit.trailing_zeros() as usize);
                    break;
                }
            }
            found
        };
        let iscale = -127.0 / max;
        if !iscale.is_finite() {
            // amax < 127 * FLT_MIN: the scale overflows and ggml's quants are whatever
            // nearest_int makes of inf/NaN; take them from the scalar code (d is -0.0 anyway).
            super::kquants::quantize_q8_k(x, b);
            continue;
        }
        let mul = _mm256_set1_ps(iscale);
        let lim = _mm256_set1_epi32(127);
        let q = b.as_mut_ptr().add(4);
        for k in 0..8 {
            let r = |j: usize| {
                let v = _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(p.add(32 * k + 8 * j)), mul), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
                _mm256_min_epi32(_mm256_cvtps_epi32(v), lim)
            };
            let (i0, i1, i2, i3) = (r(0), r(1), r(2), r(3));
            let a = _mm256_packs_epi32(i0, i1);
            let c = _mm256_packs_epi32(i2, i3);
            let pk = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(a, c), _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            _mm256_storeu_si256(q.add(32 * k) as *mut __m256i, pk);
            // bsums of the two 16-element groups: i8 -> i16 widen and pairwise add.
            let w = _mm256_maddubs_epi16(_mm256_set1_epi8(1), pk);
            let s = _mm256_madd_epi16(w, _mm256_set1_epi16(1)); // 8 i32, each a sum of 4 quants
            let lo = _mm256_castsi256_si128(s);
            let hi = _mm256_extracti128_si256(s, 1);
            let s0 = _mm_add_epi32(lo, _mm_unpackhi_epi64(lo, lo));
            let s0 = _mm_add_epi32(s0, _mm_shuffle_epi32(s0, 1));
            let s1 = _mm_add_epi32(hi, _mm_unpackhi_epi64(hi, hi));
            let s1 = _mm_add_epi32(s1, _mm_shuffle_epi32(s1, 1));
            let (b0, b1) = (_mm_cvtsi128_si32(s0) as i16, _mm_cvtsi128_si32(s1) as i16);
            let o = 260 + 4 * k;
            b[o..o + 2].copy_from_slice(&b0.to_le_bytes());
            b[o + 2..o + 4].copy_from_slice(&b1.to_le_bytes());
        }
        b[0..4].copy_from_slice(&(1.0 / iscale).to_le_bytes());
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn quantize_f16_avx2(src: &[f32], dst: &mut [u8]) {
    let n8 = src.len() / 8 * 8;
    for k in (0..n8).step_by(8) {
        let h = _mm256_cvtps_ph(_mm256_loadu_ps(src.as_ptr().add(k)), _MM_FROUND_TO_NEAREST_INT);
        _mm_storeu_si128(dst.as_mut_ptr().add(2 * k) as *mut __m128i, h);
    }
    super::float::quantize_f16(&src[n8..], &mut dst[2 * n8..]);
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dequantize_q8_0_avx2(src: &[u8], dst: &mut [f32]) {
    let nb = (dst.len() / 32).min(src.len() / BlockQ8_0::SIZE);
    for i in 0..nb {
        let b = src.as_ptr().add(i * BlockQ8_0::SIZE);
        let d = _mm256_set1_ps(f16(b));
        let q = b.add(offset_of!(BlockQ8_0, qs));
        for k in 0..4 {
            let v = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(q.add(8 * k) as *const __m128i)));
            _mm256_storeu_ps(dst.as_mut_ptr().add(32 * i + 8 * k), _mm256_mul_ps(v, d));
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dequantize_f16_avx2(src: &[u8], dst: &mut [f32]) {
    let n = dst.len().min(src.len() / 2);
    let n8 = n / 8 * 8;
    for k in (0..n8).step_by(8) {
        _mm256_storeu_ps(dst.as_mut_ptr().add(k), _mm256_cvtph_ps(load128(src.as_ptr().add(2 * k))));
    }
    super::float::dequantize_f16(&src[2 * n8..], &mut dst[n8..]);
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dequantize_bf16_avx2(src: &[u8], dst: &mut [f32]) {
    let n = dst.len().min(src.len() / 2);
    let n8 = n / 8 * 8;
    for k in (0..n8).step_by(8) {
        let v = _mm256_slli_epi32(_mm256_cvtepu16_epi32(load128(src.as_ptr().add(2 * k))), 16);
        _mm256_storeu_ps(dst.as_mut_ptr().add(k), _mm256_castsi256_ps(v));
    }
    super::float::dequantize_bf16(&src[2 * n8..], &mut dst[n8..]);
}

// Safe entry points (the kernel set was chosen only if the CPU has AVX2/FMA/F16C; the
// chunking keeps every access inside the slices).
pub(crate) fn quantize_q8_0(src: &[f32], dst: &mut [u8]) {
    unsafe { quantize_q8_0_avx2(src, dst) }
}
pub(crate) fn quantize_q8_1(src: &[f32], dst: &mut [u8]) {
    unsafe { quantize_q8_1_avx2(src, dst) }
}
pub(crate) fn quantize_q8_k(src: &[f32], dst: &mut [u8]) {
    unsafe { quantize_q8_k_avx2(src, dst) }
}
pub(crate) fn quantize_f16(src: &[f32], dst: &mut [u8]) {
    unsafe { quantize_f16_avx2(src, dst) }
}
/// Exact conversions (same bits as the scalar ones): used by `dequantize_row` for the
/// KV cache's F16/BF16 rows, which attention reads for every token.
pub(crate) fn dequantize_f16(src: &[u8], dst: &mut [f32]) {
    unsafe { dequantize_f16_avx2(src, dst) }
}
/// Q8_0 rows (a quantized KV cache's V, dequantized once per key and attention pass):
/// each quant as f32 times the block's d, as `legacy::dequantize_q8_0` (the same exact
/// conversions and one rounded multiply per value).
pub(crate) fn dequantize_q8_0(src: &[u8], dst: &mut [f32]) {
    unsafe { dequantize_q8_0_avx2(src, dst) }
}
pub(crate) fn dequantize_bf16(src: &[u8], dst: &mut [f32]) {
    unsafe { dequantize_bf16_avx2(src, dst) }
}

// ------------------------------------------------------------------ single-token multi-row

/// Weight rows per pass of the AVX2 multi-row kernels.
const ROWS: usize = 4;

/// The farthest `prefetch_step` prefetches into L1 (see there).
const L1_DIST_MAX: usize = 2 * PF_AHEAD;

/// Prefetch, for block step i of a multi-row pass over R contiguous rows (`step` = R *
/// block bytes), the bytes `dist` ahead in address order: a pass ahead, at least PF_AHEAD.
/// One line 8 KiB past each of the R interleaved rows per step read short rows (Gemma 3's
/// 640-wide Q8_0 output: four streams 680 bytes apart) at ~60% of the read probe. The
/// AVX-512 set's multi-row kernels prefetch the same way (`avx512::rows_signed`,
/// `rows_min_body`).
///
/// `L1` (T0, into L1) holds only up to `L1_DIST_MAX` (16 KiB) ahead: a pass of wide rows
/// puts the distance further (Q4_1 rows of 14336: 4 x 8960 bytes), where lines prefetched
/// into the 32 KiB L1 are evicted before their pass reads them, so those prefetch into L2
/// (T1). `--bench kernels -- tg huge`, one thread, two alternations: the AVX-512 Q4_1
/// kernel over rows of 4096 / 7168 / 14336 (passes of 10 / 17.5 / 35 KiB) read 25.2-25.5 /
/// 16.9 / 14.3 GB/s with T0 and 22.9-23.1 / 25.1-25.2 / 25.5 with T1 (so T0 up to 16 KiB);
/// Q4_K's 8-row kernel (passes of 4.6 / 9.2 / 18 / 64 KiB at rows of 1024 / 2048 / 4096 /
/// 14336; the AVX2 and AVX-512 builds) T0 14.3-15.3 / 16.8-18.0 / 13.3-14.4 / 13.5-13.6,
/// T1 17.1-18.9 / 16.5-17.9 / 17.6-19.4 / 17.4-19.3 (that kernel now always prefetches into
/// L2).
#[inline(always)]
pub(crate) unsafe fn prefetch_step<const L1: bool>(w: *const u8, dist: usize, i: usize, step: usize) {
    let pf = w.wrapping_add(dist - PF_AHEAD + i * step);
    let mut o = 0;
    while o < step {
        if L1 && dist <= L1_DIST_MAX {
            prefetch_w_l1(pf.wrapping_add(o));
        } else {
            prefetch_w(pf.wrapping_add(o));
        }
        o += 64;
    }
}

/// Block i of a Q8_0 activation row: (d_x in all lanes, the 32 quants); `xd` as in `DotN`.
#[inline(always)]
unsafe fn q8_0_block(x: *const u8, xd: *const f32, i: usize) -> (__m256, __m256i) {
    let by = x.add(i * BlockQ8_0::SIZE);
    let dx = if xd.is_null() { f16(by) } else { std::ptr::read_unaligned(xd.add(i)) };
    (_mm256_set1_ps(dx), load256(by.add(offset_of!(BlockQ8_0, qs))))
}

/// `dot_signed_q8_0::<1, V>` for R consecutive weight rows (`ws` bytes apart) against one
/// activation row, interleaved block by block: every row gets exactly the single-row
/// kernel's operations (so the same bits), but the R accumulators are independent FMA
/// chains (the single-row kernel waits on one FMA's latency per block) and the activation
/// block is loaded once for all of them.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn rows_signed<const R: usize, const V: bool>(
    n: usize,
    w: *const u8,
    ws: usize,
    wsize: usize,
    x: *const u8,
    xd: *const f32,
    out: *mut f32,
    decode: impl Fn(*const u8) -> (f32, __m256i),
) {
    let nb = n / 32;
    let dist = PF_AHEAD.max(R * ws);
    let mut acc = [_mm256_setzero_ps(); R];
    for i in 0..nb {
        let (vdx, y) = q8_0_block(x, xd, i);
        // the R rows are contiguous (ws = nb * wsize)
        prefetch_step::<false>(w, dist, i, R * wsize);
        for (r, a) in acc.iter_mut().enumerate() {
            let bw = w.add(r * ws + i * wsize);
            let (dw, qw) = decode(bw);
            let d = _mm256_mul_ps(_mm256_set1_ps(dw), vdx);
            let aw = _mm256_sign_epi8(qw, qw);
            let sy = _mm256_sign_epi8(y, qw);
            *a = _mm256_fmadd_ps(d, u8_i8_dot_ps::<V>(aw, sy), *a);
        }
    }
    for (r, a) in acc.iter().enumerate() {
        *out.add(r) = hsum_ps(*a);
    }
}

/// `rows_signed` for Q4_0 / Q5_0 in the plain AVX2 build, with the weights offset to
/// unsigned (+OFF, as the packed kernels use them) and the activation's correction
/// -OFF * (sum of each 4 quants) computed once per block for all R rows: the same i32 per
/// lane as the sign trick (exact), two `vpsignb` fewer per row and block. Gemma 3's Q5_0
/// projections at one token were compute-bound (10.4 GB/s against a 17 GB/s probe).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn rows_offset<const R: usize, const OFF: i32>(
    n: usize,
    w: *const u8,
    ws: usize,
    wsize: usize,
    x: *const u8,
    xd: *const f32,
    out: *mut f32,
    decode: impl Fn(*const u8) -> (f32, __m256i),
) {
    let nb = n / 32;
    let dist = PF_AHEAD.max(R * ws);
    let (ones16, moff) = (_mm256_set1_epi16(1), _mm256_set1_epi32(-OFF));
    let mut acc = [_mm256_setzero_ps(); R];
    for i in 0..nb {
        let (vdx, y) = q8_0_block(x, xd, i);
        let corr = quad_corr(y, moff);
        prefetch_step::<false>(w, dist, i, R * wsize);
        for (r, a) in acc.iter_mut().enumerate() {
            let (dw, qu) = decode(w.add(r * ws + i * wsize));
            let d = _mm256_mul_ps(_mm256_set1_ps(dw), vdx);
            let q = _mm256_add_epi32(corr, _mm256_madd_epi16(_mm256_maddubs_epi16(qu, y), ones16));
            *a = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(q), *a);
        }
    }
    for (r, a) in acc.iter().enumerate() {
        *out.add(r) = hsum_ps(*a);
    }
}

/// `rows_offset` as a multi-row family (`rows_kernel!`): Q4_0 (offset 8), Q5_0 (16).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn rows_off8<const R: usize, const V: bool>(n: usize, w: *const u8, ws: usize, wsize: usize, x: *const u8, xd: *const f32, out: *mut f32, decode: impl Fn(*const u8) -> (f32, __m256i)) {
    rows_offset::<R, 8>(n, w, ws, wsize, x, xd, out, decode)
}
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn rows_off16<const R: usize, const V: bool>(n: usize, w: *const u8, ws: usize, wsize: usize, x: *const u8, xd: *const f32, out: *mut f32, decode: impl Fn(*const u8) -> (f32, __m256i)) {
    rows_offset::<R, 16>(n, w, ws, wsize, x, xd, out, decode)
}

#[inline(always)]
unsafe fn dec_q4_0_u(b: *const u8) -> (f32, __m256i) {
    (f16(b), nibbles_32(b.add(offset_of!(BlockQ4_0, qs))))
}

/// `dot_min_q8_1::<1, V>` for R weight rows, as `rows_signed`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn rows_min<const R: usize, const V: bool>(
    n: usize,
    w: *const u8,
    ws: usize,
    wsize: usize,
    x: *const u8,
    xd: *const f32,
    out: *mut f32,
    decode: impl Fn(*const u8) -> __m256i,
) {
    let nb = n / 32;
    let dist = PF_AHEAD.max(R * ws);
    let mut acc = [_mm256_setzero_ps(); R];
    let mut summ = [_mm_setzero_ps(); R];
    for i in 0..nb {
        let by = x.add(i * BlockQ8_1::SIZE);
        let ds = if xd.is_null() { f16x2(by) } else { _mm_castpd_ps(_mm_load_sd(xd.add(2 * i) as *const f64)) };
        let y = load256(by.add(offset_of!(BlockQ8_1, qs)));
        prefetch_step::<true>(w, dist, i, R * wsize);
        for r in 0..R {
            let bw = w.add(r * ws + i * wsize);
            let p = _mm_mul_ps(f16x2(bw), ds); // (d_w * d_x, m_w * s_x)
            summ[r] = _mm_add_ps(summ[r], p);
            let q = u8_i8_dot_ps::<V>(decode(bw), y);
            acc[r] = _mm256_fmadd_ps(_mm256_broadcastss_ps(p), q, acc[r]);
        }
    }
    for r in 0..R {
        *out.add(r) = hsum_ps(acc[r]) + _mm_cvtss_f32(_mm_movehdup_ps(summ[r]));
    }
}

/// ROWS rows per pass, then single rows: `pass(r, true)` covers rows r..r + ROWS.
#[inline(always)]
fn by_rows(nrows: usize, mut pass: impl FnMut(usize, bool)) {
    let mut r = 0;
    while r + ROWS <= nrows {
        pass(r, true);
        r += ROWS;
    }
    while r < nrows {
        pass(r, false);
        r += 1;
    }
}

/// A multi-row kernel (`avx512::DotRows`) of family `$fam` with block decoder `$dec`, in a
/// plain AVX2 build and an AVX-VNNI one.
macro_rules! rows_kernel {
    ($plain:ident, $vnni:ident, $fam:ident, $wsize:expr, $dec:ident) => {
        rows_kernel!(@build $plain, false, "avx2,fma,f16c", $fam, $wsize, $dec);
        rows_kernel!(@build $vnni, true, "avx2,fma,f16c,avxvnni", $fam, $wsize, $dec);
    };
    (@build $name:ident, $v:expr, $feat:literal, $fam:ident, $wsize:expr, $dec:ident) => {
        #[target_feature(enable = $feat)]
        pub(crate) unsafe fn $name(n: usize, w: *const u8, ws: usize, nrows: usize, x: *const u8, xd: *const f32, out: *mut f32) {
            by_rows(nrows, |r, four| {
                let (w, out) = (w.add(r * ws), out.add(r));
                if four {
                    $fam::<ROWS, $v>(n, w, ws, $wsize, x, xd, out, |b| $dec(b))
                } else {
                    $fam::<1, $v>(n, w, ws, $wsize, x, xd, out, |b| $dec(b))
                }
            })
        }
    };
}

// Q4_0 / Q5_0: the plain build with unsigned weights and per-block corrections
// (`rows_offset`), the AVX-VNNI build with the sign trick (`vpdpbusd` has no i16 step)
rows_kernel!(@build rows_q4_0, false, "avx2,fma,f16c", rows_off8, BlockQ4_0::SIZE, dec_q4_0_u);
rows_kernel!(@build rows_q4_0_vnni, true, "avx2,fma,f16c,avxvnni", rows_signed, BlockQ4_0::SIZE, dec_q4_0);
rows_kernel!(@build rows_q5_0, false, "avx2,fma,f16c", rows_off16, BlockQ5_0::SIZE, q5_0_unsigned);
rows_kernel!(@build rows_q5_0_vnni, true, "avx2,fma,f16c,avxvnni", rows_signed, BlockQ5_0::SIZE, dec_q5_0);
rows_kernel!(rows_q8_0, rows_q8_0_vnni, rows_signed, BlockQ8_0::SIZE, dec_q8_0);
rows_kernel!(rows_iq4_nl, rows_iq4_nl_vnni, rows_signed, BlockIQ4NL::SIZE, dec_iq4_nl);
rows_kernel!(rows_q4_1, rows_q4_1_vnni, rows_min, BlockQ4_1::SIZE, q4_1_quants);
rows_kernel!(rows_q5_1, rows_q5_1_vnni, rows_min, BlockQ5_1::SIZE, q5_1_quants);
