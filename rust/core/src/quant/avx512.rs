//! AVX-512 kernels (F + BW + VL + VNNI, x86-64), chosen at run time by `super::kernel_set()`:
//! the single-token multi-row kernels of Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and IQ4_NL (`rows_kernel`) and the
//! Q6_K vec_dot / tile kernel (`dot_kernels`). The set's prefill kernels that put two weight
//! rows in one zmm (packed Q4_0/Q5_0/Q8_0) and its row-block K-quant builds are in
//! `avx2_rb.rs`. Everything else in the AVX-512 kernel set is the AVX2 (+ AVX-VNNI) kernels.
//!
//! Requirement that shapes everything here: each result is BIT-IDENTICAL to the AVX2
//! kernel's (`avx2.rs`), so logits do not depend on the CPU. The integer work (decoding the
//! blocks, the u8 x i8 dot products) is exact whatever the order or register width, so it
//! runs in 512-bit registers; the float work keeps the AVX2 kernel's exact sequence per
//! output (same FMAs on the same lanes, blocks in order, the same horizontal sum).
//! - `rows_*` (`DotRows`: one activation row, several weight rows): two weight rows share a
//!   zmm, lanes 0..8 row a's 8-lane accumulator, lanes 8..16 row b's; one 512-bit FMA per
//!   block serves both rows with per-lane identical operations. Independent rows break the
//!   FMA latency chain that bounds the single-row kernels (AVX2 single-token Q4_0 runs at
//!   ~4.5 cycles per block, about the FMA latency): that is the single-token speedup
//!   (weights in L1/L2, GB/s of weights per core, AVX2 + AVX-VNNI single row -> AVX-512
//!   rows: Q4_0 14.2 -> 21.8, Q4_1 18.0 -> 24.2, Q5_0 13.5 -> 21.5, Q8_0 30.5 -> 43; SmolLM2
//!   Q4_1 tg, 1 thread, tokens per CPU-second: 1.05-1.6x depending on how much of the model
//!   the shared L3 holds). Scales of 4 rows are converted at once (one vcvtph2ps, one mul).
//! - Q6_K: two 32-byte chunks per zmm for the exact i32 super-block sum; the float steps
//!   are the AVX2 kernel's scalar ones (21.4 -> 28 GB/s 1 column, 34.8 -> 48 4 columns).
//! - Not kept: AVX-512 builds of the 32-element-block vec_dot/tile kernels (two blocks per
//!   zmm, then two 256-bit FMAs in block order): keeping the AVX2 float order costs an
//!   extract and a second FMA per block pair, and zmm VNNI has no more throughput than the
//!   two ymm ports, so they ran 15-35% slower than AVX2 + AVX-VNNI (Q4_0 1/4 columns 12.3/17.9
//!   vs 14.7/23.5 GB/s).
//!
//! Exact integer identities used (u = unsigned code of the weight, x the i8 activation):
//! Q4_0 w = u - 8, Q5_0 w = u - 16, Q8_0 w = (w ^ 0x80) - 128, so
//! sum(w * x) = dpbusd(u, x) - off * dpbusd(1, x) per 4-byte group, the same i32 the AVX2
//! kernel's maddubs/madd (or AVX-VNNI) computes for that group (no saturation is possible:
//! activations come from the q8 quantizers, |x| <= 127).

#![allow(clippy::missing_safety_doc)]

use super::avx2::{f16, hsum_ps, TILE};
use super::table::KernelTable;
use crate::ggml_type::GgmlType;
use super::blocks::{offset_of, Block, BlockIQ4NL, BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ6K, BlockQ8K, BlockQ8_0, BlockQ8_1};
use std::arch::x86_64::*;

pub use super::DotRows;

/// The AVX-512 set's own kernels, laid over the AVX2 set's in table `t`: the single-token
/// multi-row kernels and Q6_K's vec_dot / tile (4 columns, and 1..3 for the tokens left
/// after the tiles). Only Q6_K has tiles: the 32-element-block formats' AVX-512 builds of
/// these (two blocks per zmm, the AVX2 float order) were slower than the AVX2 + AVX-VNNI
/// ones and were dropped (see the module note).
pub(crate) fn register(t: &mut KernelTable) {
    use GgmlType::*;
    t.set_tiled(Q6_K, tiled!(dot_q6_k, 4), one_q6_k);
    t.set_rows(Q4_K, super::avx2::rows_q4_k_evex);
    let rows: [(GgmlType, DotRows); 6] =
        [(Q4_0, rows_q4_0), (Q4_1, rows_q4_1), (Q5_0, rows_q5_0), (Q8_0, rows_q8_0), (Q5_1, rows_q5_1), (IQ4_NL, rows_iq4_nl)];
    for (ty, k) in rows {
        t.set_rows(ty, k);
    }
}

safe_one! {
    one_q6_k, dot_q6_k, Q6_K;
}

// ------------------------------------------------------------------ helpers

macro_rules! kfn {
    ($(#[$m:meta])* unsafe fn $name:ident $($rest:tt)*) => {
        $(#[$m])*
        #[inline]
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
        unsafe fn $name $($rest)*
    };
}

/// Weight bytes prefetched this far ahead in the single-token kernels: the AVX2 kernels'
/// tuned distance (see `avx2::PF_AHEAD`).
const PF_AHEAD: usize = 8192;

#[inline(always)]
unsafe fn prefetch_t1(p: *const u8) {
    _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(PF_AHEAD) as *const i8);
}

/// Four f16 packed in a u64 -> 4 f32 (exact). In asm for the same reason as `avx2::f16`:
/// `vmovq` from a general register writes the whole register (no false dependency).
#[inline(always)]
unsafe fn cvt_h4(h: u64) -> __m128 {
    let r: __m128;
    std::arch::asm!(
        "vmovq {r}, {h}",
        "vcvtph2ps {r}, {r}",
        h = in(reg) h,
        r = out(xmm_reg) r,
        options(pure, nomem, nostack, preserves_flags)
    );
    r
}

/// Eight f16 (lo: 0..4, hi: 4..8) -> 8 f32 (exact), in asm like `cvt_h4`.
#[inline]
#[target_feature(enable = "avx,f16c")]
unsafe fn cvt_h8(lo: u64, hi: u64) -> __m256 {
    let r: __m256;
    std::arch::asm!(
        "vmovq {r:x}, {lo}",
        "vpinsrq {r:x}, {r:x}, {hi}, 1",
        "vcvtph2ps {r}, {r:x}",
        lo = in(reg) lo,
        hi = in(reg) hi,
        r = out(ymm_reg) r,
        options(pure, nomem, nostack, preserves_flags)
    );
    r
}

#[inline(always)]
unsafe fn rd16(p: *const u8) -> u64 {
    std::ptr::read_unaligned(p as *const u16) as u64
}

#[inline(always)]
unsafe fn rd32(p: *const u8) -> u64 {
    std::ptr::read_unaligned(p as *const u32) as u64
}

kfn!(unsafe fn load256(p: *const u8) -> __m256i {
    _mm256_loadu_si256(p as *const __m256i)
});

kfn!(unsafe fn join(a: __m256i, b: __m256i) -> __m512i {
    _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1)
});

kfn!(unsafe fn hi_ps(v: __m512) -> __m256 {
    _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1))
});

kfn!(unsafe fn lo_ps(v: __m512) -> __m256 {
    _mm512_castps512_ps256(v)
});


kfn!(
    /// `nibbles_32` of two blocks: a's 32 bytes in the low half, b's in the high half.
    unsafe fn nibbles_2x32(a: *const u8, b: *const u8) -> __m512i {
    let ya = _mm256_broadcastsi128_si256(_mm_loadu_si128(a as *const __m128i));
    let yb = _mm256_broadcastsi128_si256(_mm_loadu_si128(b as *const __m128i));
    let z = _mm512_srlv_epi64(join(ya, yb), _mm512_set_epi64(4, 4, 0, 0, 4, 4, 0, 0));
    _mm512_and_si512(z, _mm512_set1_epi8(0x0F))
});

// ------------------------------------------------------------------ 32-element block decoders
// Each gives the unsigned code u (0..=255) of the 32 weights of a block; the signed weight
// is u - OFF (see the module note).

const OFF_Q4_0: i8 = 8;
const OFF_Q5_0: i8 = 16;
const OFF_Q8_0: i8 = -128; // 0x80: 128 as the unsigned operand of vpdpbusd

kfn!(unsafe fn dec2_q4_0(a: *const u8, b: *const u8) -> __m512i {
    nibbles_2x32(a.add(offset_of!(BlockQ4_0, qs)), b.add(offset_of!(BlockQ4_0, qs)))
});
kfn!(unsafe fn dec2_q5_0(a: *const u8, b: *const u8) -> __m512i {
    let nib = nibbles_2x32(a.add(offset_of!(BlockQ5_0, qs)), b.add(offset_of!(BlockQ5_0, qs)));
    let m = rd32(a.add(offset_of!(BlockQ5_0, qh))) | (rd32(b.add(offset_of!(BlockQ5_0, qh))) << 32);
    _mm512_mask_add_epi8(nib, m, nib, _mm512_set1_epi8(16))
});
kfn!(
    /// IQ4_NL: the non-linear table's signed value of each nibble, + 128 (`OFF_Q8_0`).
    unsafe fn dec2_iq4_nl(a: *const u8, b: *const u8) -> __m512i {
    let tbl = _mm512_broadcast_i32x4(_mm_loadu_si128(super::legacy::KVALUES_IQ4NL.as_ptr() as *const __m128i));
    _mm512_xor_si512(_mm512_shuffle_epi8(tbl, nibbles_2x32(a.add(offset_of!(BlockIQ4NL, qs)), b.add(offset_of!(BlockIQ4NL, qs)))), _mm512_set1_epi8(-128))
});
kfn!(unsafe fn dec2_q8_0(a: *const u8, b: *const u8) -> __m512i {
    _mm512_xor_si512(join(load256(a.add(offset_of!(BlockQ8_0, qs))), load256(b.add(offset_of!(BlockQ8_0, qs)))), _mm512_set1_epi8(-128))
});

// ------------------------------------------------------------------ signed family x Q8_0

/// Signed family, one activation row against 2 * RP weight rows (pairs share a zmm).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn rows_signed<const RP: usize>(
    n: usize,
    w: *const u8,
    ws: usize,
    wsize: usize,
    x: *const u8,
    xd: *const f32,
    out: *mut f32,
    tn: *const __m512i,
    dec2: impl Fn(*const u8, *const u8) -> __m512i,
) {
    let nb = n / 32;
    let mut acc = [_mm512_setzero_ps(); RP];
    // lanes 0..8 <- lane 0 (row a's scale), lanes 8..16 <- lane 1 (row b's)
    let idx = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    let idx23 = _mm512_set_epi32(3, 3, 3, 3, 3, 3, 3, 3, 2, 2, 2, 2, 2, 2, 2, 2);
    // the AVX2 multi-row kernels' prefetch: the pass's bytes in address order, a pass
    // (at least PF_AHEAD) ahead
    let (dist, step) = (super::avx2::PF_AHEAD.max(2 * RP * ws), 2 * RP * wsize);
    for i in 0..nb {
        super::avx2::prefetch_step::<false>(w, dist, i, step);
        let bx = x.add(i * BlockQ8_0::SIZE);
        let dx = if xd.is_null() { f16(bx) } else { std::ptr::read_unaligned(xd.add(i)) };
        let vdx = _mm_set1_ps(dx);
        let xz = _mm512_broadcast_i64x4(load256(bx.add(2)));
        let t = *tn.add(i);
        let mut p = 0;
        while p + 2 <= RP {
            // two pairs: their four scales in one conversion and one multiply
            let r0 = w.add(2 * p * ws + i * wsize);
            let (r1, r2, r3) = (r0.add(ws), r0.add(2 * ws), r0.add(3 * ws));
            let q01 = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(t, dec2(r0, r1), xz));
            let q23 = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(t, dec2(r2, r3), xz));
            // [dw_0 * dx, .., dw_3 * dx]: the same f32 products the AVX2 kernel forms per row
            let d4 = _mm512_castps128_ps512(_mm_mul_ps(cvt_h4(rd16(r0) | (rd16(r1) << 16) | (rd16(r2) << 32) | (rd16(r3) << 48)), vdx));
            acc[p] = _mm512_fmadd_ps(_mm512_permutexvar_ps(idx, d4), q01, acc[p]);
            acc[p + 1] = _mm512_fmadd_ps(_mm512_permutexvar_ps(idx23, d4), q23, acc[p + 1]);
            p += 2;
        }
        if p < RP {
            let pa = w.add(2 * p * ws + i * wsize);
            let pb = pa.add(ws);
            let q = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(t, dec2(pa, pb), xz));
            let d2 = _mm_mul_ps(cvt_h4(rd16(pa) | (rd16(pb) << 16)), vdx);
            let d = _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(d2));
            acc[p] = _mm512_fmadd_ps(d, q, acc[p]);
        }
    }
    for p in 0..RP {
        *out.add(2 * p) = hsum_ps(lo_ps(acc[p]));
        *out.add(2 * p + 1) = hsum_ps(hi_ps(acc[p]));
    }
}

/// Blocks whose offset sums `neg_offset_sums` keeps on the stack (4 KiB; rows up to 2048).
const TN_STACK: usize = 64;

/// Per activation block i (nb Q8_0 blocks at x), the 16 lanes -(off * (x_4l + .. + x_4l+3))
/// that the signed family's `vpdpbusd` of the unsigned codes u = w + off must start from
/// (exact i32: the block's sum u.x - off.x), both halves alike: computed once per call of
/// the rows kernel, not once per row pair. In `stack` when it fits, else in `heap`.
#[inline(always)]
unsafe fn neg_offset_sums(nb: usize, x: *const u8, off: i8, stack: &mut [std::mem::MaybeUninit<__m512i>; TN_STACK], heap: &mut Vec<__m512i>) -> *const __m512i {
    let offz = _mm512_set1_epi8(off);
    let buf = if nb <= TN_STACK {
        stack.as_mut_ptr() as *mut __m512i
    } else {
        heap.reserve_exact(nb);
        heap.as_mut_ptr()
    };
    // (a plain loop: a closure would not inherit the caller's target features)
    for i in 0..nb {
        let xz = _mm512_broadcast_i64x4(load256(x.add(i * BlockQ8_0::SIZE + 2)));
        buf.add(i).write(_mm512_sub_epi32(_mm512_setzero_si512(), _mm512_dpbusd_epi32(_mm512_setzero_si512(), offz, xz)));
    }
    if nb > TN_STACK {
        // its first nb entries (the reserved capacity) are written above
        heap.set_len(nb);
    }
    buf
}

/// Rows per multi-row call: RP_MAX pairs.
const RP_MAX: usize = 2;
/// Q8_0's pairs per pass: one. Two streams a pass read from memory faster than four for
/// Q8_0, whose kernel has the fewest operations a byte (`--bench kernels -- tg huge`, rows of
/// 576 / 640 over 512 MiB, on Zen 4: one / two threads 25.3-27.0 / 47.3-51.1 GB/s with two
/// pairs, 28.7-31.6 / 55.2-62.3 with one (rows of 1024 too), the probe 32-34 / 62-68;
/// matrices held in the caches, 28 / 64 MiB, run faster with two pairs, but a decode step
/// streams the weights from memory); the compute-bound Q4_0 / Q5_0
/// lose with one (22.2 -> 18.5, 20.5 -> 17.8 at one thread), so they keep RP_MAX.
const RP_Q8_0: usize = 1;

macro_rules! signed_rows {
    ($rows:ident, $ty:expr, $wsize:expr, $off:expr, $dec2:ident, $rp:expr) => {
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
        pub(crate) unsafe fn $rows(n: usize, w: *const u8, ws: usize, nrows: usize, x: *const u8, xd: *const f32, out: *mut f32) {
            // -(OFF * the sum of each 4 activations), per block, once for all the rows
            let mut stack = [std::mem::MaybeUninit::<__m512i>::uninit(); TN_STACK];
            let mut heap = Vec::new();
            let tn = neg_offset_sums(n / 32, x, $off, &mut stack, &mut heap);
            let mut r = 0;
            while r + 2 * $rp <= nrows {
                rows_signed::<{ $rp }>(n, w.add(r * ws), ws, $wsize, x, xd, out.add(r), tn, |a, b| $dec2(a, b));
                r += 2 * $rp;
            }
            while r + 2 <= nrows {
                rows_signed::<1>(n, w.add(r * ws), ws, $wsize, x, xd, out.add(r), tn, |a, b| $dec2(a, b));
                r += 2;
            }
            if r < nrows {
                last_row($ty, n, w.add(r * ws), x, xd, out.add(r));
            }
        }
    };
}

/// The last row of an odd row count: the AVX2 single-row kernel (bit-identical by definition).
#[inline(always)]
unsafe fn last_row(ty: GgmlType, n: usize, w: *const u8, x: *const u8, xd: *const f32, out: *mut f32) {
    let one = super::table::table(super::KernelSet::Avx2).get(ty).tiled.expect("an AVX2 kernel for every multi-row format").one();
    one(n, w, x, 0, xd, 0, out);
}

signed_rows!(rows_q4_0, GgmlType::Q4_0, BlockQ4_0::SIZE, OFF_Q4_0, dec2_q4_0, RP_MAX);
signed_rows!(rows_q5_0, GgmlType::Q5_0, BlockQ5_0::SIZE, OFF_Q5_0, dec2_q5_0, RP_MAX);
signed_rows!(rows_q8_0, GgmlType::Q8_0, BlockQ8_0::SIZE, OFF_Q8_0, dec2_q8_0, RP_Q8_0);
signed_rows!(rows_iq4_nl, GgmlType::IQ4_NL, BlockIQ4NL::SIZE, OFF_Q8_0, dec2_iq4_nl, RP_MAX);
// ------------------------------------------------------------------ Q4_1 x Q8_1

/// Q4_1 / Q5_1 (weights u * d + m) against Q8_1, one activation row against 2 * RP weight
/// rows (pairs share a zmm), as `avx2::dot_min_q8_1` per row.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn rows_min_body<const RP: usize>(
    n: usize,
    w: *const u8,
    ws: usize,
    wsize: usize,
    x: *const u8,
    xd: *const f32,
    out: *mut f32,
    dec2: impl Fn(*const u8, *const u8) -> __m512i,
) {
    let nb = n / 32;
    let mut acc = [_mm512_setzero_ps(); RP];
    // lanes 1 and 3: the m_w * s_x sums of rows a and b
    let mut summ = [_mm_setzero_ps(); RP];
    // lanes 0..8 <- lane 0 (dw_a*dx), lanes 8..16 <- lane 2 (dw_b*dx)
    let idx = _mm512_set_epi32(2, 2, 2, 2, 2, 2, 2, 2, 0, 0, 0, 0, 0, 0, 0, 0);
    let idx23 = _mm512_set_epi32(6, 6, 6, 6, 6, 6, 6, 6, 4, 4, 4, 4, 4, 4, 4, 4);
    // the quad path's m_w * s_x sums: lanes 1, 3, 5, 7 for its 4 rows
    let mut summ4 = [_mm256_setzero_ps(); RP];
    // as rows_signed's
    let (dist, step) = (super::avx2::PF_AHEAD.max(2 * RP * ws), 2 * RP * wsize);
    for i in 0..nb {
        super::avx2::prefetch_step::<true>(w, dist, i, step);
        let bx = x.add(i * BlockQ8_1::SIZE);
        let ds = q8_1_ds(bx, xd, i); // (dx, sx, dx, sx)
        let xz = _mm512_broadcast_i64x4(load256(bx.add(4)));
        let ds8 = _mm256_set_m128(ds, ds);
        let mut p = 0;
        while p + 2 <= RP {
            // two pairs: their (d, m) in one conversion, one multiply, one add
            let r0 = w.add(2 * p * ws + i * wsize);
            let (r1, r2, r3) = (r0.add(ws), r0.add(2 * ws), r0.add(3 * ws));
            let q01 = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), dec2(r0, r1), xz));
            let q23 = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), dec2(r2, r3), xz));
            // (d0*dx, m0*sx, d1*dx, m1*sx, d2*dx, m2*sx, d3*dx, m3*sx)
            let pr = _mm256_mul_ps(cvt_h8(rd32(r0) | (rd32(r1) << 32), rd32(r2) | (rd32(r3) << 32)), ds8);
            summ4[p / 2] = _mm256_add_ps(summ4[p / 2], pr);
            let prz = _mm512_castps256_ps512(pr);
            acc[p] = _mm512_fmadd_ps(_mm512_permutexvar_ps(idx, prz), q01, acc[p]);
            acc[p + 1] = _mm512_fmadd_ps(_mm512_permutexvar_ps(idx23, prz), q23, acc[p + 1]);
            p += 2;
        }
        if p < RP {
            let pa = w.add(2 * p * ws + i * wsize);
            let pb = pa.add(ws);
            let q = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), dec2(pa, pb), xz));
            let pr = _mm_mul_ps(cvt_h4(rd32(pa) | (rd32(pb) << 32)), ds);
            summ[p] = _mm_add_ps(summ[p], pr);
            let d = _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(pr));
            acc[p] = _mm512_fmadd_ps(d, q, acc[p]);
        }
    }
    let mut p = 0;
    while p + 2 <= RP {
        let mut m = [0f32; 8];
        _mm256_storeu_ps(m.as_mut_ptr(), summ4[p / 2]);
        *out.add(2 * p) = hsum_ps(lo_ps(acc[p])) + m[1];
        *out.add(2 * p + 1) = hsum_ps(hi_ps(acc[p])) + m[3];
        *out.add(2 * p + 2) = hsum_ps(lo_ps(acc[p + 1])) + m[5];
        *out.add(2 * p + 3) = hsum_ps(hi_ps(acc[p + 1])) + m[7];
        p += 2;
    }
    if p < RP {
        let s = summ[p];
        *out.add(2 * p) = hsum_ps(lo_ps(acc[p])) + _mm_cvtss_f32(_mm_movehdup_ps(s));
        *out.add(2 * p + 1) = hsum_ps(hi_ps(acc[p])) + _mm_cvtss_f32(_mm_movehdup_ps(_mm_movehl_ps(s, s)));
    }
}

/// Q4_1 against Q8_1, 4 rows per pass with one row per 128-bit lane: a zmm of the four
/// rows' low nibbles (llama.cpp's i32 lanes 0..3 of each row: elements 0..15) and one of
/// their high nibbles (lanes 4..7: elements 16..31), each against the activation half it
/// multiplies broadcast to every lane. The rows' 16 quant bytes go in by masked broadcast
/// loads (no shuffle), both halves share one scale vector (one `vpermps` per 4 rows), and
/// llama.cpp's final lane i + lane i + 4 is one add of the two accumulators for 4 rows.
/// Each lane runs `avx2::dot_min_q8_1`'s float steps for its (row, lane) in its order.
/// Against the row pairs (`rows_min_body`: two rows a zmm, nibbles split by shifts and
/// a join), SmolLM2's shapes, one thread (`--bench kernels -- split`, two alternated runs):
/// from memory 1536 / 576 / 192 rows 16.6-17.3 / 15.9-16.5 / 14.6-15.1 -> 20.7-21.0 / 19.7-19.8
/// / 16.6-16.8 GB/s, in L2 22.1 -> 24.0. Eight rows a pass (two such groups) ran 26.4 in L2
/// but 15.9-16.4 from memory: not kept.
///
/// `L1`: the prefetch hint, T0 (into L1) for long passes, T1 (into L2) for short ones (see
/// `rows_q4_1`).
#[inline(always)]
unsafe fn rows_q4_1_lanes<const L1: bool>(n: usize, w: *const u8, ws: usize, x: *const u8, xd: *const f32, out: *mut f32) {
    let nb = n / 32;
    let qs = offset_of!(BlockQ4_1, qs);
    let m4 = _mm512_set1_epi8(0x0F);
    let zero = _mm512_setzero_si512();
    // lanes 4r..4r + 4 <- lane 2r (row r's d_w * d_x)
    let idx = _mm512_set_epi32(6, 6, 6, 6, 4, 4, 4, 4, 2, 2, 2, 2, 0, 0, 0, 0);
    let (mut alo, mut ahi) = (_mm512_setzero_ps(), _mm512_setzero_ps());
    // lanes 1, 3, 5, 7: the four rows' m_w * s_x sums
    let mut summ = _mm256_setzero_ps();
    let (dist, step) = (super::avx2::PF_AHEAD.max(4 * ws), 4 * BlockQ4_1::SIZE);
    for i in 0..nb {
        super::avx2::prefetch_step::<L1>(w, dist, i, step);
        let bx = x.add(i * BlockQ8_1::SIZE);
        let ds = q8_1_ds(bx, xd, i); // (dx, sx, dx, sx)
        let xlo = _mm512_broadcast_i32x4(_mm_loadu_si128(bx.add(4) as *const __m128i));
        let xhi = _mm512_broadcast_i32x4(_mm_loadu_si128(bx.add(20) as *const __m128i));
        let r0 = w.add(i * BlockQ4_1::SIZE);
        let (r1, r2, r3) = (r0.add(ws), r0.add(2 * ws), r0.add(3 * ws));
        let ld = |p: *const u8| _mm_loadu_si128(p.add(qs) as *const __m128i);
        let z = _mm512_broadcast_i32x4(ld(r0));
        let z = _mm512_mask_broadcast_i32x4(z, 0x00F0, ld(r1));
        let z = _mm512_mask_broadcast_i32x4(z, 0x0F00, ld(r2));
        let z = _mm512_mask_broadcast_i32x4(z, 0xF000, ld(r3));
        let plo = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(zero, _mm512_and_si512(z, m4), xlo));
        let phi = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(zero, _mm512_and_si512(_mm512_srli_epi16::<4>(z), m4), xhi));
        // (d0*dx, m0*sx, d1*dx, m1*sx, d2*dx, m2*sx, d3*dx, m3*sx)
        let pr = _mm256_mul_ps(cvt_h8(rd32(r0) | (rd32(r1) << 32), rd32(r2) | (rd32(r3) << 32)), _mm256_set_m128(ds, ds));
        summ = _mm256_add_ps(summ, pr);
        let d = _mm512_permutexvar_ps(idx, _mm512_castps256_ps512(pr));
        alo = _mm512_fmadd_ps(d, plo, alo);
        ahi = _mm512_fmadd_ps(d, phi, ahi);
    }
    x4_out(alo, ahi, Some(summ), out);
}

/// Q4_1's single-token multi-row kernel: 4-row passes (`rows_q4_1_lanes`), the last 1-3
/// rows as a pair and a row (`rows_q4_1_pairs`).
///
/// The passes prefetch into L2 (T1) where a pass is at most `SHORT_PASS` bytes, else into
/// L1 (T0), which `prefetch_step` turns into L2 again past 16 KiB ahead. Measured on Zen 4 (`--bench kernels -- tg huge` and `split huge`, alternated
/// builds): over rows of 576 (1440-byte passes) one thread read 21.4-22.4 GB/s with T0 and
/// 23.5-23.9 with T1 (SmolLM2's 1536 / 576 / 192-row matrices one after another from memory
/// 20.4 / 19.5 / 16.8 -> 23.1 / 22.4 / 20.4, two threads 27.2 / 24.8 / 17.6 -> 32.7 / 28.3 /
/// 19.2); over rows of 1536 and 2048 (3840 / 5120-byte passes) T0 read 25.4-25.9 and T1
/// 23.5-24.7.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn rows_q4_1(n: usize, w: *const u8, ws: usize, nrows: usize, x: *const u8, xd: *const f32, out: *mut f32) {
    let mut r = 0;
    let short = 4 * ws <= SHORT_PASS;
    while r + 4 <= nrows {
        if short {
            rows_q4_1_lanes::<false>(n, w.add(r * ws), ws, x, xd, out.add(r));
        } else {
            rows_q4_1_lanes::<true>(n, w.add(r * ws), ws, x, xd, out.add(r));
        }
        r += 4;
    }
    rows_q4_1_pairs(n, w.add(r * ws), ws, nrows - r, x, xd, out.add(r));
}

/// The longest 4-row pass of `rows_q4_1` that prefetches into L2 rather than L1.
const SHORT_PASS: usize = 2048;

/// Activation block i's (d, s) as (dx, sx, dx, sx): from the precomputed f32 scales `xd`
/// when given, else converted from the block's f16 pair at bx.
#[inline(always)]
unsafe fn q8_1_ds(bx: *const u8, xd: *const f32, i: usize) -> __m128 {
    if xd.is_null() {
        cvt_h4(rd32(bx) * 0x1_0000_0001)
    } else {
        _mm_castpd_ps(_mm_set1_pd(std::ptr::read_unaligned(xd.add(2 * i) as *const f64)))
    }
}

macro_rules! min_rows {
    ($rows:ident, $ty:expr, $wsize:expr, $dec2:ident) => {
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
        pub(crate) unsafe fn $rows(n: usize, w: *const u8, ws: usize, nrows: usize, x: *const u8, xd: *const f32, out: *mut f32) {
            let mut r = 0;
            while r + 2 * RP_MAX <= nrows {
                rows_min_body::<RP_MAX>(n, w.add(r * ws), ws, $wsize, x, xd, out.add(r), |a, b| $dec2(a, b));
                r += 2 * RP_MAX;
            }
            while r + 2 <= nrows {
                rows_min_body::<1>(n, w.add(r * ws), ws, $wsize, x, xd, out.add(r), |a, b| $dec2(a, b));
                r += 2;
            }
            if r < nrows {
                last_row($ty, n, w.add(r * ws), x, xd, out.add(r));
            }
        }
    };
}

kfn!(unsafe fn dec2_q4_1(a: *const u8, b: *const u8) -> __m512i {
    nibbles_2x32(a.add(offset_of!(BlockQ4_1, qs)), b.add(offset_of!(BlockQ4_1, qs)))
});
kfn!(
    /// Q5_1: bit k of qh (bytes 4..8) is the 5th bit of element k.
    unsafe fn dec2_q5_1(a: *const u8, b: *const u8) -> __m512i {
    let nib = nibbles_2x32(a.add(offset_of!(BlockQ5_1, qs)), b.add(offset_of!(BlockQ5_1, qs)));
    let m = rd32(a.add(offset_of!(BlockQ5_1, qh))) | (rd32(b.add(offset_of!(BlockQ5_1, qh))) << 32);
    _mm512_mask_add_epi8(nib, m, nib, _mm512_set1_epi8(16))
});

min_rows!(rows_q4_1_pairs, GgmlType::Q4_1, BlockQ4_1::SIZE, dec2_q4_1);
min_rows!(rows_q5_1, GgmlType::Q5_1, BlockQ5_1::SIZE, dec2_q5_1);

// ------------------------------------------------------------------ Q6_K x Q8_K

/// Q6_K against Q8_K as `avx2::dot_q6_k` (llama.cpp's tiled order): per super-block the
/// exact i32 sum of scale * (q - 32) * y, times d_w, then one FMA with d_y into a scalar
/// accumulator. Only the integer part is vectorized (two 32-byte chunks per zmm, the -32
/// offset taken off through the activations' block sums), so the float steps are the
/// AVX2 kernel's.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn dot_q6_k<const NC: usize>(n: usize, w: *const u8, x: *const u8, xs: usize, _xd: *const f32, _xds: usize, out: *mut f32) {
    let nb = n / 256;
    let m4 = _mm512_set1_epi8(0xF);
    let m30 = _mm512_set1_epi8(0x30);
    // sc[m] lane L (i16) = scale 4m + L/8: the scale of each 16 bytes of chunk pair m
    let sidx = |m: i16| {
        let mut v = [0i16; 32];
        for (l, e) in v.iter_mut().enumerate() {
            *e = 4 * m + (l / 8) as i16;
        }
        _mm512_loadu_si512(v.as_ptr() as *const _)
    };
    let sidx = [sidx(0), sidx(1), sidx(2), sidx(3)];
    let mut acc = [0f32; NC];
    for i in 0..nb {
        let bw = w.add(i * BlockQ6K::SIZE);
        if NC < TILE {
            let mut o = 0;
            while o < BlockQ6K::SIZE {
                prefetch_t1(bw.add(o));
                o += 64;
            }
        }
        let dw = f16(bw.add(offset_of!(BlockQ6K, d)));
        let s16y = _mm256_cvtepi8_epi16(_mm_loadu_si128(bw.add(offset_of!(BlockQ6K, scales)) as *const __m128i));
        let s16 = _mm512_castsi256_si512(s16y);
        let mut sumi = [_mm512_setzero_si512(); NC];
        for j in 0..2 {
            let b12 = _mm512_loadu_si512(bw.add(offset_of!(BlockQ6K, ql) + 64 * j) as *const _);
            let bh = _mm512_broadcast_i64x4(load256(bw.add(offset_of!(BlockQ6K, qh) + 32 * j)));
            // bits (2k, 2k+1) of qh are bits 4, 5 of chunk k's values
            let hlo = _mm512_and_si512(_mm512_sllv_epi64(bh, _mm512_set_epi64(2, 2, 2, 2, 4, 4, 4, 4)), m30);
            let hhi = _mm512_and_si512(_mm512_srlv_epi64(bh, _mm512_set_epi64(2, 2, 2, 2, 0, 0, 0, 0)), m30);
            let q01 = _mm512_or_si512(_mm512_and_si512(b12, m4), hlo);
            let q23 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(b12, 4), m4), hhi);
            let sc01 = _mm512_permutexvar_epi16(sidx[2 * j], s16);
            let sc23 = _mm512_permutexvar_epi16(sidx[2 * j + 1], s16);
            for c in 0..NC {
                let q8 = x.add(c * xs + i * BlockQ8K::SIZE + offset_of!(BlockQ8K, qs) + 128 * j);
                // q (0..63) * y pairs fit i16 (|.| <= 2 * 63 * 128)
                let p01 = _mm512_maddubs_epi16(q01, _mm512_loadu_si512(q8 as *const _));
                let p23 = _mm512_maddubs_epi16(q23, _mm512_loadu_si512(q8.add(64) as *const _));
                sumi[c] = _mm512_dpwssd_epi32(sumi[c], sc01, p01);
                sumi[c] = _mm512_dpwssd_epi32(sumi[c], sc23, p23);
            }
        }
        for c in 0..NC {
            let by = x.add(c * xs + i * BlockQ8K::SIZE);
            // 32 * sum over the 16 groups of scale * bsum: the -32 offset of every value
            let off = _mm256_madd_epi16(_mm256_loadu_si256(by.add(offset_of!(BlockQ8K, bsums)) as *const __m256i), s16y);
            let total = _mm512_reduce_add_epi32(sumi[c]).wrapping_sub(_mm512_reduce_add_epi32(_mm512_zextsi256_si512(off)) << 5);
            let yd = std::ptr::read_unaligned(by as *const f32);
            acc[c] = (dw * total as f32).mul_add(yd, acc[c]);
        }
    }
    for c in 0..NC {
        *out.add(c) = acc[c];
    }
}

// ------------------------------------------------------------------ x4 row-group layouts

use super::repack::GROUP;

/// The four rows' results from the lane accumulators of a 4-row pass (`rows_q4_1_lanes`, the
/// x4 kernels; row r: lanes 4r..4r + 4 of `alo`, its llama.cpp lanes 0..3, and of `ahi`,
/// lanes 4..7), each row's llama.cpp hsum_float_8 of its 8 lanes: lane i + lane i + 4 is one
/// add for the four rows, then the 4-lane steps; lane 2r + 1 of `add` is added last (Q4_1's
/// m_w * s_x sum; none for Q5_0).
#[inline(always)]
unsafe fn x4_out(alo: __m512, ahi: __m512, add: Option<__m256>, out: *mut f32) {
    let mut l = [0f32; 16];
    _mm512_storeu_ps(l.as_mut_ptr(), _mm512_add_ps(ahi, alo));
    let mut m = [0f32; 8];
    if let Some(s) = add {
        _mm256_storeu_ps(m.as_mut_ptr(), s);
    }
    for r in 0..4 {
        let v = _mm_loadu_ps(l.as_ptr().add(4 * r));
        let v = _mm_add_ps(v, _mm_movehl_ps(v, v));
        let v = _mm_add_ss(v, _mm_movehdup_ps(v));
        *out.add(r) = if add.is_some() { _mm_cvtss_f32(v) + m[2 * r + 1] } else { _mm_cvtss_f32(v) };
    }
}

/// Q5_0 x Q8_0 over the x4 layout (`repack`), NC activation rows (`x + c * xs`, their
/// scales at `xd + c * xds`, results at `out + c * ld`): per group-block one load of the
/// four rows' quants, two 64-bit mask loads for their 5th bits, one conversion of their
/// four scales, shared by the NC columns. Lane 4r + k of the low register is row r's
/// llama.cpp lane k (elements 4k..4k + 4), of the high register its lane 4 + k; each lane
/// runs the plain kernel's float steps in its order (`rows_signed`: fma(d_w * d_x,
/// float(sum u.x - 16 sum x), acc)), so the results are bit-identical. `w` starts at a
/// group; the rows after the whole groups (nrows % 4) must be the matrix's plain tail.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn q5_0_x4_body<const NC: usize>(
    n: usize,
    w: *const u8,
    ws: usize,
    nrows: usize,
    x: *const u8,
    xs: usize,
    xd: *const f32,
    xds: usize,
    tn: *const i32,
    ncols: usize,
    out: *mut f32,
    ld: usize,
) {
    let nb = n / 32;
    let sixteen = _mm512_set1_epi8(16);
    let gb = 88usize;
    let m4 = _mm512_set1_epi8(0x0F);
    // lanes 4r..4r + 4 <- lane r (row r's d_w * d_x)
    let idx = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
    // (a plain loop, no closure: a closure would not inherit the target features)
    let mut r = 0;
    while r + GROUP <= nrows {
        let g = w.add(r * ws);
        let (mut alo, mut ahi) = ([_mm512_setzero_ps(); NC], [_mm512_setzero_ps(); NC]);
        for i in 0..nb {
            let b = g.add(i * gb);
            _mm_prefetch::<_MM_HINT_T0>(b.wrapping_add(super::avx2::PF_AHEAD) as *const i8);
            let z = _mm512_loadu_si512(b as *const _);
            let lo = _mm512_and_si512(z, m4);
            let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(z), m4);
            let klo = std::ptr::read_unaligned(b.add(72) as *const u64);
            let khi = std::ptr::read_unaligned(b.add(80) as *const u64);
            let lo = _mm512_mask_add_epi8(lo, klo, lo, sixteen);
            let hi = _mm512_mask_add_epi8(hi, khi, hi, sixteen);
            let dw = cvt_h4(std::ptr::read_unaligned(b.add(64) as *const u64));
            for c in 0..NC {
                let bx = x.add(c * xs + i * BlockQ8_0::SIZE);
                let dx = if xd.is_null() { f16(bx) } else { std::ptr::read_unaligned(xd.add(c * xds + i)) };
                let xlo = _mm512_broadcast_i32x4(_mm_loadu_si128(bx.add(2) as *const __m128i));
                let xhi = _mm512_broadcast_i32x4(_mm_loadu_si128(bx.add(18) as *const __m128i));
                // this column's offset sums (`x4_offsets`, columns counted from the call's x)
                let t = tn.add(32 * (i * ncols + c));
                let plo = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_loadu_si512(t as *const _), lo, xlo));
                let phi = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_loadu_si512(t.add(16) as *const _), hi, xhi));
                let d = _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(_mm_mul_ps(dw, _mm_set1_ps(dx))));
                alo[c] = _mm512_fmadd_ps(d, plo, alo[c]);
                ahi[c] = _mm512_fmadd_ps(d, phi, ahi[c]);
            }
        }
        for c in 0..NC {
            x4_out(alo[c], ahi[c], None, out.add(c * ld + r));
        }
        r += GROUP;
    }
    // the matrix's plain tail
    if r < nrows {
        for c in 0..NC {
            let xdc = if xd.is_null() { xd } else { xd.add(c * xds) };
            rows_q5_0(n, w.add(r * ws), ws, nrows - r, x.add(c * xs), xdc, out.add(c * ld + r));
        }
    }
}

/// Q4_1 x Q8_1 over the x4 layout (`repack`), NC activation rows as `q5_0_x4_body`:
/// `rows_q4_1_lanes` with one load of the four rows' quants and one conversion of their (d,
/// m) pairs per group-block, shared by the columns (bit-identical to it, hence to the AVX2
/// kernel). `w` starts at a group; the rows after the whole groups must be the matrix's
/// plain tail.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn q4_1_x4_body<const NC: usize>(
    n: usize,
    w: *const u8,
    ws: usize,
    nrows: usize,
    x: *const u8,
    xs: usize,
    xd: *const f32,
    xds: usize,
    _tn: *const i32,
    _ncols: usize,
    out: *mut f32,
    ld: usize,
) {
    let nb = n / 32;
    let gb = 80usize;
    let m4 = _mm512_set1_epi8(0x0F);
    let zero = _mm512_setzero_si512();
    // lanes 4r..4r + 4 <- lane 2r (row r's d_w * d_x)
    let idx = _mm512_set_epi32(6, 6, 6, 6, 4, 4, 4, 4, 2, 2, 2, 2, 0, 0, 0, 0);
    let mut r = 0;
    while r + GROUP <= nrows {
        let g = w.add(r * ws);
        let (mut alo, mut ahi) = ([_mm512_setzero_ps(); NC], [_mm512_setzero_ps(); NC]);
        let mut summ = [_mm256_setzero_ps(); NC];
        for i in 0..nb {
            let b = g.add(i * gb);
            _mm_prefetch::<_MM_HINT_T0>(b.wrapping_add(super::avx2::PF_AHEAD) as *const i8);
            let z = _mm512_loadu_si512(b as *const _);
            let lo = _mm512_and_si512(z, m4);
            let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(z), m4);
            // (d0, m0, d1, m1, d2, m2, d3, m3)
            let dm = _mm256_cvtph_ps(_mm_loadu_si128(b.add(64) as *const __m128i));
            for c in 0..NC {
                let bx = x.add(c * xs + i * BlockQ8_1::SIZE);
                let xdc = if xd.is_null() { xd } else { xd.add(c * xds) };
                let ds = q8_1_ds(bx, xdc, i); // (dx, sx, dx, sx)
                let xlo = _mm512_broadcast_i32x4(_mm_loadu_si128(bx.add(4) as *const __m128i));
                let xhi = _mm512_broadcast_i32x4(_mm_loadu_si128(bx.add(20) as *const __m128i));
                let plo = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(zero, lo, xlo));
                let phi = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(zero, hi, xhi));
                // (d0*dx, m0*sx, d1*dx, m1*sx, d2*dx, m2*sx, d3*dx, m3*sx)
                let pr = _mm256_mul_ps(dm, _mm256_set_m128(ds, ds));
                summ[c] = _mm256_add_ps(summ[c], pr);
                let d = _mm512_permutexvar_ps(idx, _mm512_castps256_ps512(pr));
                alo[c] = _mm512_fmadd_ps(d, plo, alo[c]);
                ahi[c] = _mm512_fmadd_ps(d, phi, ahi[c]);
            }
        }
        for c in 0..NC {
            x4_out(alo[c], ahi[c], Some(summ[c]), out.add(c * ld + r));
        }
        r += GROUP;
    }
    if r < nrows {
        for c in 0..NC {
            let xdc = if xd.is_null() { xd } else { xd.add(c * xds) };
            rows_q4_1(n, w.add(r * ws), ws, nrows - r, x.add(c * xs), xdc, out.add(c * ld + r));
        }
    }
}

/// Byte indices for `q4_k_x4_pass`: pair j's i16 scales from a row's 8 scale bytes (in
/// bytes 0..8 of each 128-bit half): sub-block 2j's in i16 lanes 0..4 of each half, 2j + 1's
/// in lanes 4..8, zero-extended (0x80 zeroes a byte), as `SHUFFLE_K4_PACKED` picks them
/// from the 8 i16 scales.
static Q4K_X4_SC: [u8; 128] = {
    let mut t = [0u8; 128];
    let mut j = 0;
    while j < 4 {
        let mut b = 0;
        while b < 32 {
            let lane = (b % 16) / 2;
            t[32 * j + b] = if b % 2 == 1 { 0x80 } else if lane < 4 { (2 * j) as u8 } else { (2 * j + 1) as u8 };
            b += 1;
        }
        j += 1;
    }
    t
};

/// Byte indices for `q4_k_x4_pass`: per 32-bit lane (a row's 4 min bytes), pair j's two
/// mins (bytes 2 (j % 2), 2 (j % 2) + 1) as zero-extended i16, for j = 0, 1 (the same picks
/// serve j = 2, 3 from the high mins).
static Q4K_X4_MIN: [u8; 64] = {
    let mut t = [0u8; 64];
    let mut h = 0;
    while h < 2 {
        let mut b = 0;
        while b < 32 {
            let base = (b / 4) * 4;
            t[32 * h + b] = if b % 2 == 1 { 0x80 } else { (base % 16 + 2 * h + (b % 4) / 2) as u8 };
            b += 1;
        }
        h += 1;
    }
    t
};

/// One pass of the Q4_K x4 kernel: 8 rows, groups `ga` (rows 0..4) and `gb` (rows 4..8; the
/// same as `ga` for a single group, whose first 4 results are then stored), NC Q8_K
/// activation rows (`x + c * xs`, results at `out + c * ld`): each row and column gets
/// `avx2::rows_q4_k_evex`'s operations (hence `dot_q4_k::<1>`'s) in the same order: the
/// exact i32 pair sums (scale x dot) and min products, then per pair one FMA into the scale
/// and one into the min accumulator, with the same d_w x d_a and dmin_w x d_a products. The
/// layout puts each field of the four rows together (`repack`), so the two groups' scales,
/// mins and d / dmin unpack for all 8 rows at once instead of one row at a time, and a
/// row's nibbles and pair scales once for the NC columns.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn q4_k_x4_pass<const NC: usize>(nb: usize, ga: *const u8, gb: *const u8, dist: usize, x: *const u8, xs: usize, out: *mut f32, ld: usize, nout: usize) {
    let gbytes = 576usize;
    let m4 = _mm256_set1_epi8(0xF);
    let (k3f, k0f, k30) = (_mm256_set1_epi8(0x3F), _mm256_set1_epi8(0x0F), _mm256_set1_epi8(0x30));
    let ld128 = |p: *const u8| _mm_loadu_si128(p as *const __m128i);
    let two = |o: usize, i: usize| _mm256_set_m128i(ld128(gb.add(i * gbytes + o)), ld128(ga.add(i * gbytes + o)));
    let (mut acc, mut acc_m) = ([_mm256_setzero_ps(); NC], [_mm256_setzero_ps(); NC]);
    for i in 0..nb {
        super::avx2::prefetch_step::<false>(ga, dist, i, 2 * gbytes);
        let (a, b) = (ga.add(i * gbytes), gb.add(i * gbytes));
        // d_w and dmin_w, one lane per row
        let rd = |p: *const u8| std::ptr::read_unaligned(p as *const i64);
        let dw = _mm256_cvtph_ps(_mm_set_epi64x(rd(b), rd(a)));
        let dminw = _mm256_cvtph_ps(_mm_set_epi64x(rd(b.add(8)), rd(a.add(8))));
        // the 6-bit scales and mins of the 8 rows (k4_mins_and_scales' steps on 8 lanes)
        let (u0, u1, u2) = (two(16, i), two(32, i), two(48, i));
        let s_lo = _mm256_and_si256(u0, k3f);
        let s_hi = _mm256_or_si256(_mm256_and_si256(u2, k0f), _mm256_and_si256(_mm256_srli_epi32(u0, 2), k30));
        let m_lo = _mm256_and_si256(u1, k3f);
        let m_hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(u2, 4), k0f), _mm256_and_si256(_mm256_srli_epi32(u1, 2), k30));
        // pair j's two mins of every row as i16 (lane r)
        let mut mp = [_mm256_setzero_si256(); 4];
        for (j, p) in mp.iter_mut().enumerate() {
            let pick = _mm256_loadu_si256(Q4K_X4_MIN.as_ptr().add(32 * (j % 2)) as *const __m256i);
            *p = _mm256_shuffle_epi8(if j < 2 { m_lo } else { m_hi }, pick);
        }
        // each row's scale bytes in bytes 0..8 of both halves: rows 0, 1 / 4, 5 in sc01's
        // quadwords, rows 2, 3 / 6, 7 in sc23's
        let sc01 = _mm256_unpacklo_epi32(s_lo, s_hi);
        let sc23 = _mm256_unpackhi_epi32(s_lo, s_hi);
        let row_sc = [
            _mm256_permute4x64_epi64::<0x00>(sc01),
            _mm256_permute4x64_epi64::<0x55>(sc01),
            _mm256_permute4x64_epi64::<0x00>(sc23),
            _mm256_permute4x64_epi64::<0x55>(sc23),
            _mm256_permute4x64_epi64::<0xAA>(sc01),
            _mm256_permute4x64_epi64::<0xFF>(sc01),
            _mm256_permute4x64_epi64::<0xAA>(sc23),
            _mm256_permute4x64_epi64::<0xFF>(sc23),
        ];
        // per column: d_w * d_a and dmin_w * d_a (the plain kernel's products), the min
        // products (pair j of every row in lane r, exact i32)
        let mut q8 = [std::ptr::null::<u8>(); NC];
        let mut dsc = [_mm256_setzero_ps(); NC];
        let mut dmn = [_mm256_setzero_ps(); NC];
        let mut m = [[_mm256_setzero_si256(); 4]; NC];
        for c in 0..NC {
            let by = x.add(c * xs + i * BlockQ8K::SIZE);
            q8[c] = by.add(offset_of!(BlockQ8K, qs));
            let yd = _mm256_set1_ps(std::ptr::read_unaligned(by as *const f32));
            let bs = _mm256_loadu_si256(q8[c].add(256) as *const __m256i);
            let q8s = _mm_hadd_epi16(_mm256_extracti128_si256(bs, 0), _mm256_extracti128_si256(bs, 1));
            dsc[c] = _mm256_mul_ps(dw, yd);
            dmn[c] = _mm256_mul_ps(dminw, yd);
            m[c] = [
                _mm256_madd_epi16(mp[0], _mm256_set1_epi32(_mm_extract_epi32::<0>(q8s))),
                _mm256_madd_epi16(mp[1], _mm256_set1_epi32(_mm_extract_epi32::<1>(q8s))),
                _mm256_madd_epi16(mp[2], _mm256_set1_epi32(_mm_extract_epi32::<2>(q8s))),
                _mm256_madd_epi16(mp[3], _mm256_set1_epi32(_mm_extract_epi32::<3>(q8s))),
            ];
        }
        let mut sums = [[_mm_setzero_si128(); 8]; NC];
        for r in 0..8 {
            // the row's nibbles and pair scales once for the NC columns
            let q4 = if r < 4 { a.add(64 + 128 * r) } else { b.add(64 + 128 * (r - 4)) };
            let mut wl = [_mm256_setzero_si256(); 4];
            let mut wh = [_mm256_setzero_si256(); 4];
            let mut sc = [_mm256_setzero_si256(); 4];
            for j in 0..4 {
                let bits = _mm256_loadu_si256(q4.add(32 * j) as *const __m256i);
                wl[j] = _mm256_and_si256(bits, m4);
                wh[j] = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);
                sc[j] = _mm256_shuffle_epi8(row_sc[r], _mm256_loadu_si256(Q4K_X4_SC.as_ptr().add(32 * j) as *const __m256i));
            }
            for c in 0..NC {
                let mut v = [_mm256_setzero_si256(); 4];
                for (j, vj) in v.iter_mut().enumerate() {
                    let z = _mm256_setzero_si256();
                    let dl = _mm256_dpbusd_epi32(z, wl[j], _mm256_loadu_si256(q8[c].add(64 * j) as *const __m256i));
                    let dh = _mm256_dpbusd_epi32(z, wh[j], _mm256_loadu_si256(q8[c].add(64 * j + 32) as *const __m256i));
                    *vj = _mm256_madd_epi16(_mm256_packs_epi32(dl, dh), sc[j]);
                }
                // the four exact i32 sums (integer sums do not depend on their order)
                let h = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
                sums[c][r] = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
            }
        }
        for c in 0..NC {
            let s = super::avx2::transpose_4x8_i32(&sums[c]);
            for j in 0..4 {
                acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[j]), dsc[c], acc[c]);
                acc_m[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(m[c][j]), dmn[c], acc_m[c]);
            }
        }
    }
    for c in 0..NC {
        let mut res = [0f32; 8];
        _mm256_storeu_ps(res.as_mut_ptr(), _mm256_sub_ps(acc[c], acc_m[c]));
        std::ptr::copy_nonoverlapping(res.as_ptr(), out.add(c * ld), nout);
    }
}

/// Q4_K x Q8_K over the x4 layout (`repack`), NC activation rows (`x + c * xs`, results at
/// `out + c * ld`) in passes of two groups (`q4_k_x4_pass`); a last single group in a pass
/// of its own, the plain tail rows (nrows % 4) by `dot_q4_k::<1>`: every element has the
/// plain multi-row kernel's bits. `w` starts at a group.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn q4_k_x4_body<const NC: usize>(
    n: usize,
    w: *const u8,
    ws: usize,
    nrows: usize,
    x: *const u8,
    xs: usize,
    _xd: *const f32,
    _xds: usize,
    _tn: *const i32,
    _ncols: usize,
    out: *mut f32,
    ld: usize,
) {
    let nb = n / 256;
    let dist = super::avx2::PF_AHEAD.max(2 * GROUP * ws);
    let mut r = 0;
    while r + 2 * GROUP <= nrows {
        let ga = w.add(r * ws);
        q4_k_x4_pass::<NC>(nb, ga, ga.add(GROUP * ws), dist, x, xs, out.add(r), ld, 2 * GROUP);
        r += 2 * GROUP;
    }
    if r + GROUP <= nrows {
        let ga = w.add(r * ws);
        q4_k_x4_pass::<NC>(nb, ga, ga, dist, x, xs, out.add(r), ld, GROUP);
        r += GROUP;
    }
    for c in 0..NC {
        for t in r..nrows {
            super::avx2::dot_q4_k::<1>(n, w.add(t * ws), x.add(c * xs), 0, std::ptr::null(), 0, out.add(c * ld + t));
        }
    }
}

/// The most activation rows one pass of the x4 kernels takes.
pub(crate) const X4_COLS: usize = 4;

macro_rules! x4_entries {
    ($cols:ident, $body:ident) => {
        /// `ncols` activation rows (`repack::X4Cols`), in passes of up to X4_COLS.
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
        #[allow(clippy::too_many_arguments)]
        pub(crate) unsafe fn $cols(
            n: usize,
            w: *const u8,
            ws: usize,
            nrows: usize,
            x: *const u8,
            xs: usize,
            xd: *const f32,
            xds: usize,
            tn: *const i32,
            ncols: usize,
            out: *mut f32,
            ld: usize,
        ) {
            let mut c = 0;
            while c < ncols {
                let xdc = if xd.is_null() { xd } else { xd.add(c * xds) };
                let (xc, oc, tc) = (x.add(c * xs), out.add(c * ld), tn.wrapping_add(32 * c));
                match ncols - c {
                    1 => $body::<1>(n, w, ws, nrows, xc, xs, xdc, xds, tc, ncols, oc, ld),
                    2 => $body::<2>(n, w, ws, nrows, xc, xs, xdc, xds, tc, ncols, oc, ld),
                    3 => $body::<3>(n, w, ws, nrows, xc, xs, xdc, xds, tc, ncols, oc, ld),
                    _ => $body::<X4_COLS>(n, w, ws, nrows, xc, xs, xdc, xds, tc, ncols, oc, ld),
                }
                c += X4_COLS;
            }
        }
    };
}

x4_entries!(cols_q5_0_x4, q5_0_x4_body);
x4_entries!(cols_q4_1_x4, q4_1_x4_body);
x4_entries!(cols_q4_k_x4, q4_k_x4_body);

/// `repack::x4_offsets` for Q5_0: per block i and column c (of ncols, `x + c * xs`), the
/// two halves' 16 lanes -(16 * (x_4k + .. + x_4k+3)), lane 4r + k (every row alike).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn q5_0_x4_offsets(n: usize, x: *const u8, xs: usize, ncols: usize, dst: *mut i32) {
    let sixteen = _mm512_set1_epi8(16);
    for i in 0..n / 32 {
        for c in 0..ncols {
            let bx = x.add(c * xs + i * BlockQ8_0::SIZE + 2);
            for h in 0..2 {
                let xz = _mm512_broadcast_i32x4(_mm_loadu_si128(bx.add(16 * h) as *const __m128i));
                let t = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_dpbusd_epi32(_mm512_setzero_si512(), sixteen, xz));
                _mm512_storeu_si512(dst.add(32 * (i * ncols + c) + 16 * h) as *mut _, t);
            }
        }
    }
}
