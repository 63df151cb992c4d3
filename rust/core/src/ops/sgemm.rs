//! Tiled matrix product for F32 weights (the matmul's path for them when the row length is
//! a multiple of 8; the F16 kernels are here and tested but not used yet, see `applies`):
//! register-blocked micro-kernels that read each weight vector once per tile of RN tokens
//! and each activation vector once per RM weight rows.
//!
//! Float order: llamafile's tinyBLAS (ggml-cpu/llamafile/sgemm.cpp), which llama.cpp's x86
//! AVX2 build runs for F32 x F32 and F16 x F16 products of 2 or more tokens (row length a
//! multiple of 8, weight rows a multiple of 4): per output element one 8-lane accumulator,
//! `acc = fma(w[k..k+8], x[k..k+8], acc)` for k = 0, 8, 16, ..., then the horizontal sum
//! ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)). The tile shape changes no element's
//! operations, so pyllama runs this order for every token count (one token included) and
//! a token's result does not depend on its batch. (llama.cpp's own single-token product,
//! and its products with a weight row count not a multiple of 4, take ggml_vec_dot_f32's
//! four-accumulator order instead.)
//!
//! Kernels: AVX2 + FMA (4 rows x 3 tokens: 12 accumulators), the same code compiled with
//! AVX-512 VL so 32 vector registers hold 4 rows x 6 tokens (same instructions on ymm,
//! same bits), NEON (each 8-lane accumulator as two 4-lane halves) and a scalar twin
//! (`dot_scalar`) that the tests hold all of them to, bit for bit. F16 weights multiply
//! F16 activations (the matmul rounds them as ggml does), each converted exactly to f32.

use crate::ggml_type::GgmlType;
use crate::quant::KernelSet;
use crate::threadpool::{split_range, SyncPtr, ThreadPool};

/// Elements per accumulator (llama.cpp AVX2 tinyBLAS's KN): rows must hold a multiple.
pub const KN: usize = 8;

/// Whether the matmul of a `ty` weight with rows of `n_in` elements in kernel set `set`
/// runs here (`PYLLAMA_NO_SGEMM=1` turns it off, for comparisons). F32 only for now: the
/// F16 kernels make prefill 25% faster, but a single token's product (one FMA chain per
/// row after a conversion, or several rows = several streams) ran at half the old
/// two-accumulator vec_dot's speed, and the order must be the same for every token count.
pub fn applies(set: KernelSet, ty: GgmlType, n_in: usize) -> bool {
    ty == GgmlType::F32 && n_in % KN == 0 && n_in > 0 && !disabled() && kernels(set, ty).is_some()
}

fn disabled() -> bool {
    crate::quant::cpu::env().no_sgemm
}

/// The horizontal sum of an 8-lane accumulator in x86's `hsum` order.
#[inline(always)]
pub fn hsum8(v: [f32; 8]) -> f32 {
    ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]))
}

/// One element in this module's float order (the scalar twin of every kernel):
/// `n` a multiple of `KN`.
pub fn dot_scalar(n: usize, w: &[f32], x: &[f32]) -> f32 {
    assert!(n % KN == 0 && w.len() >= n && x.len() >= n, "dot_scalar: n = {n} must be a multiple of {KN}");
    let mut acc = [0f32; 8];
    for k in (0..n).step_by(KN) {
        for (l, a) in acc.iter_mut().enumerate() {
            *a = w[k + l].mul_add(x[k + l], *a);
        }
    }
    hsum8(acc)
}

/// A tile kernel: out[j * ld_out + i] = dot(w row i, x row j) for i < rm, j < rn (the
/// kernel's own shape), rows of `n` elements at byte strides `ldw` and `ldx`.
pub type Tile = unsafe fn(n: usize, w: *const u8, ldw: usize, x: *const u8, ldx: usize, out: *mut f32, ld_out: usize);

/// The kernels of one build: `tile[rm - 1][rn - 1]` for rm <= RM, rn <= RN, and a
/// single-token kernel over `rows1` rows. An F32 gemv is bound by reading the weights: one
/// row at a time (one sequential stream) measured as fast as the old two-accumulator
/// vec_dot, 8 rows about the same, 2 or 12 rows at once (as many streams, 4 KiB apart)
/// slower; F16 takes 4 rows (one chain per row was 25% slower than the old kernel, 4 rows
/// still 2x slower: see `applies`).
#[derive(Clone, Copy)]
pub struct Kernels {
    pub rm: usize,
    pub rn: usize,
    pub tile: [[Option<Tile>; 6]; 4],
    pub rows1: usize,
    pub gemv: Tile,
}

/// The kernels of set `set` for weight type `ty` (F32 or F16), if it has them.
pub fn kernels(set: KernelSet, ty: GgmlType) -> Option<Kernels> {
    let h = match ty {
        GgmlType::F32 => false,
        GgmlType::F16 => true,
        _ => return None,
    };
    let _ = h;
    match set {
        #[cfg(target_arch = "x86_64")]
        KernelSet::Avx2 => Some(if h { x86::kernels_avx2::<true>() } else { x86::kernels_avx2::<false>() }),
        #[cfg(target_arch = "x86_64")]
        KernelSet::Avx512 | KernelSet::Avx512Bw => Some(if h { x86::kernels_evex::<true>() } else { x86::kernels_evex::<false>() }),
        #[cfg(target_arch = "aarch64")]
        KernelSet::Neon => Some(if h { arm::kernels::<true>() } else { arm::kernels::<false>() }),
        _ => None,
    }
}

/// Bytes of activations per token chunk: the chunk stays in L2 while each group of weight
/// rows (in L1) meets all its tokens.
const CHUNK_BYTES: usize = 192 * 1024;

/// out[t * ld_out + r] = dot(w row r, x row t) for r < n_rows, t < n_tokens: `w` points at
/// the first of n_rows rows of `wrow` bytes, `x` at n_tokens rows of `xrow` bytes (f32, or
/// f16 for F16 weights), each of `n_in` elements.
///
/// # Safety
/// The pointers must cover those rows and `out` the (n_tokens - 1) * ld_out + n_rows values;
/// `k` must be `kernels(set, ty)` of a set this CPU runs and n_in a multiple of `KN`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn run(
    pool: &ThreadPool,
    k: Kernels,
    n_in: usize,
    w: *const u8,
    wrow: usize,
    n_rows: usize,
    x: *const u8,
    xrow: usize,
    n_tokens: usize,
    out: *mut f32,
    ld_out: usize,
) {
    let (wp, xp, op) = (SyncPtr(w as *mut u8), SyncPtr(x as *mut u8), SyncPtr(out));
    // whole groups of `rm` rows per thread (its tiles stay full), more groups than threads
    let step = if n_tokens == 1 { k.rows1 } else { k.rm };
    let n_groups = n_rows.div_ceil(step);
    let chunk = (CHUNK_BYTES / xrow).clamp(k.rn, 1024) / k.rn * k.rn;
    pool.run(&|ith, nth| {
        let g = split_range(n_groups, ith, nth);
        let (r_start, r_end) = (g.start * step, (g.end * step).min(n_rows));
        if r_start >= r_end {
            return;
        }
        let (w, x, out) = (wp.get() as *const u8, xp.get() as *const u8, op.get());
        if n_tokens == 1 {
            let mut r = r_start;
            while r + k.rows1 <= r_end {
                (k.gemv)(n_in, w.add(r * wrow), wrow, x, xrow, out.add(r), ld_out);
                r += k.rows1;
            }
            while r < r_end {
                let rm = (r_end - r).min(k.rm);
                let f = k.tile[rm - 1][0].expect("tile kernel");
                f(n_in, w.add(r * wrow), wrow, x, xrow, out.add(r), ld_out);
                r += rm;
            }
            return;
        }
        let mut t0 = 0;
        while t0 < n_tokens {
            let t1 = (t0 + chunk).min(n_tokens);
            let mut r = r_start;
            while r < r_end {
                let rm = (r_end - r).min(k.rm);
                let wr = w.add(r * wrow);
                let mut t = t0;
                let full = k.tile[rm - 1][k.rn - 1].expect("tile kernel");
                while t + k.rn <= t1 {
                    full(n_in, wr, wrow, x.add(t * xrow), xrow, out.add(t * ld_out + r), ld_out);
                    t += k.rn;
                }
                if t < t1 {
                    let f = k.tile[rm - 1][t1 - t - 1].expect("tile kernel");
                    f(n_in, wr, wrow, x.add(t * xrow), xrow, out.add(t * ld_out + r), ld_out);
                }
                r += rm;
            }
            t0 = t1;
        }
    });
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{Kernels, Tile};
    use std::arch::x86_64::*;

    /// The tile kernel body, compiled once per target-feature set (`$feat`): 8 elements of
    /// row `p` from element `k` (f32, or f16 converted when H), `RM` x `RN` accumulators.
    macro_rules! build {
        ($modname:ident, $feat:literal, $RM:expr, $RN:expr, $ROWS1:expr) => {
            pub mod $modname {
                use super::*;

                #[inline]
                #[target_feature(enable = $feat)]
                unsafe fn ld<const H: bool>(p: *const u8, k: usize) -> __m256 {
                    if H {
                        _mm256_cvtph_ps(_mm_loadu_si128(p.add(2 * k) as *const __m128i))
                    } else {
                        _mm256_loadu_ps(p.add(4 * k) as *const f32)
                    }
                }

                #[inline]
                #[target_feature(enable = $feat)]
                unsafe fn hsum(v: __m256) -> f32 {
                    let r = _mm_add_ps(_mm256_extractf128_ps(v, 1), _mm256_castps256_ps128(v));
                    let r = _mm_add_ps(r, _mm_movehl_ps(r, r));
                    let r = _mm_add_ss(r, _mm_movehdup_ps(r));
                    _mm_cvtss_f32(r)
                }

                #[target_feature(enable = $feat)]
                pub unsafe fn tile<const H: bool, const RM: usize, const RN: usize>(
                    n: usize,
                    w: *const u8,
                    ldw: usize,
                    x: *const u8,
                    ldx: usize,
                    out: *mut f32,
                    ld_out: usize,
                ) {
                    let mut acc = [[_mm256_setzero_ps(); RM]; RN];
                    let mut k = 0;
                    while k < n {
                        if RM <= RN {
                            let mut a = [_mm256_setzero_ps(); RM];
                            for (i, a) in a.iter_mut().enumerate() {
                                *a = ld::<H>(w.add(i * ldw), k);
                            }
                            for (j, acc) in acc.iter_mut().enumerate() {
                                let b = ld::<H>(x.add(j * ldx), k);
                                for i in 0..RM {
                                    acc[i] = _mm256_fmadd_ps(a[i], b, acc[i]);
                                }
                            }
                        } else {
                            let mut b = [_mm256_setzero_ps(); RN];
                            for (j, b) in b.iter_mut().enumerate() {
                                *b = ld::<H>(x.add(j * ldx), k);
                            }
                            for i in 0..RM {
                                let a = ld::<H>(w.add(i * ldw), k);
                                for j in 0..RN {
                                    acc[j][i] = _mm256_fmadd_ps(a, b[j], acc[j][i]);
                                }
                            }
                        }
                        k += 8;
                    }
                    for (j, acc) in acc.iter().enumerate() {
                        for (i, a) in acc.iter().enumerate() {
                            *out.add(j * ld_out + i) = hsum(*a);
                        }
                    }
                }

                fn row<const H: bool, const M: usize>() -> [Option<Tile>; 6] {
                    [
                        Some(tile::<H, M, 1> as Tile),
                        Some(tile::<H, M, 2> as Tile),
                        Some(tile::<H, M, 3> as Tile),
                        if $RN >= 4 { Some(tile::<H, M, 4> as Tile) } else { None },
                        if $RN >= 5 { Some(tile::<H, M, 5> as Tile) } else { None },
                        if $RN >= 6 { Some(tile::<H, M, 6> as Tile) } else { None },
                    ]
                }

                pub fn kernels<const H: bool>() -> Kernels {
                    let t = [row::<H, 1>(), row::<H, 2>(), row::<H, 3>(), row::<H, 4>()];
                    // F16: the conversion lengthens each step, so one chain per row would
                    // bound a gemv by FMA latency; 4 rows keep 4 chains in flight
                    if H {
                        Kernels { rm: $RM, rn: $RN, tile: t, rows1: 4, gemv: tile::<H, 4, 1> }
                    } else {
                        Kernels { rm: $RM, rn: $RN, tile: t, rows1: $ROWS1, gemv: tile::<H, $ROWS1, 1> }
                    }
                }
            }
        };
    }

    build!(plain, "avx2,fma,f16c", 4, 3, 1);
    // AVX-512 VL: the same ymm instructions with 32 registers (4 x 6 accumulators)
    build!(evex, "avx2,fma,f16c,avx512f,avx512vl", 4, 6, 1);

    pub fn kernels_avx2<const H: bool>() -> Kernels {
        plain::kernels::<H>()
    }
    pub fn kernels_evex<const H: bool>() -> Kernels {
        evex::kernels::<H>()
    }
}

#[cfg(target_arch = "aarch64")]
mod arm {
    use super::{Kernels, Tile};
    use std::arch::aarch64::*;

    /// 4 elements of row `p` from element `k` (f32, or f16 converted when H).
    #[inline(always)]
    unsafe fn ld<const H: bool>(p: *const u8, k: usize) -> float32x4_t {
        if H {
            crate::quant::neon::cvt_f16x4(vld1_u16(p.add(2 * k) as *const u16))
        } else {
            vld1q_f32(p.add(4 * k) as *const f32)
        }
    }

    /// x86's 8-lane horizontal sum of (lo = lanes 0..4, hi = lanes 4..8).
    #[inline(always)]
    unsafe fn hsum(lo: float32x4_t, hi: float32x4_t) -> f32 {
        let t = vaddq_f32(lo, hi); // a_i + a_{i+4}
        let u = vaddq_f32(t, vextq_f32(t, t, 2)); // (t0 + t2), (t1 + t3)
        vgetq_lane_f32(u, 0) + vgetq_lane_f32(u, 1)
    }

    #[target_feature(enable = "neon")]
    pub unsafe fn tile<const H: bool, const RM: usize, const RN: usize>(
        n: usize,
        w: *const u8,
        ldw: usize,
        x: *const u8,
        ldx: usize,
        out: *mut f32,
        ld_out: usize,
    ) {
        let z = vdupq_n_f32(0.0);
        let mut lo = [[z; RM]; RN];
        let mut hi = [[z; RM]; RN];
        let mut k = 0;
        while k < n {
            let mut b = [(z, z); RN];
            for (j, b) in b.iter_mut().enumerate() {
                *b = (ld::<H>(x.add(j * ldx), k), ld::<H>(x.add(j * ldx), k + 4));
            }
            for i in 0..RM {
                let (a0, a1) = (ld::<H>(w.add(i * ldw), k), ld::<H>(w.add(i * ldw), k + 4));
                for j in 0..RN {
                    lo[j][i] = vfmaq_f32(lo[j][i], a0, b[j].0);
                    hi[j][i] = vfmaq_f32(hi[j][i], a1, b[j].1);
                }
            }
            k += 8;
        }
        for j in 0..RN {
            for i in 0..RM {
                *out.add(j * ld_out + i) = hsum(lo[j][i], hi[j][i]);
            }
        }
    }

    pub fn kernels<const H: bool>() -> Kernels {
        let mut t: [[Option<Tile>; 6]; 4] = [[None; 6]; 4];
        macro_rules! fill {
            ($($m:literal),*) => {$(
                t[$m - 1][0] = Some(tile::<H, $m, 1> as Tile);
                t[$m - 1][1] = Some(tile::<H, $m, 2> as Tile);
                t[$m - 1][2] = Some(tile::<H, $m, 3> as Tile);
            )*};
        }
        fill!(1, 2, 3, 4);
        // 4 x 3 tiles: 24 accumulator halves of NEON's 32 registers
        Kernels { rm: 4, rn: 3, tile: t, rows1: 4, gemv: tile::<H, 4, 1> }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::TensorView;
    use crate::ops::matmul::matmul_with;

    fn next(s: &mut u64) -> f32 {
        *s ^= *s << 13;
        *s ^= *s >> 7;
        *s ^= *s << 17;
        ((*s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    fn sets() -> Vec<KernelSet> {
        let mut v = Vec::new();
        #[cfg(target_arch = "x86_64")]
        {
            if crate::quant::avx2_available() {
                v.push(KernelSet::Avx2);
            }
            if crate::quant::avx512_available() {
                v.push(KernelSet::Avx512);
            }
            if crate::quant::avx512bw_available() {
                v.push(KernelSet::Avx512Bw);
            }
        }
        #[cfg(target_arch = "aarch64")]
        if crate::quant::neon_available() {
            v.push(KernelSet::Neon);
        }
        v
    }

    #[test]
    fn hsum8_is_the_x86_order() {
        // lanes chosen so every other pairing rounds differently
        let v = [1e8f32, 1.0, -1e8, 3.0, 0.5, 1e-3, 7.0, -2.5];
        let want = ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]));
        assert_eq!(hsum8(v).to_bits(), want.to_bits());
        assert_ne!(hsum8(v), v.iter().sum::<f32>());
    }

    #[test]
    fn matmul_equals_scalar_twin_bit_for_bit() {
        // Whole matmuls through every tile shape (rows 1..=13, tokens 1..=14 and a chunked
        // 70, 1 and 2 threads, a row slice into a wider output) equal `dot_scalar` per element,
        // F32 weights (and the F16 kernels), in every SIMD set this CPU runs.
        let pools = [crate::threadpool::ThreadPool::new(1), crate::threadpool::ThreadPool::new(2)];
        let mut s = 0x5eed_0001u64;
        for set in sets() {
            for ty in [GgmlType::F32, GgmlType::F16] {
                for n_in in [8usize, 24, 64, 200] {
                    for n_out in [1usize, 3, 4, 5, 9, 13] {
                        let wf: Vec<f32> = (0..n_in * n_out).map(|_| next(&mut s) * if s % 7 == 0 { 1e4 } else { 1.0 }).collect();
                        let w: Vec<u8> = if ty == GgmlType::F16 {
                            wf.iter().flat_map(|v| half::f16::from_f32(*v).to_bits().to_le_bytes()).collect()
                        } else {
                            wf.iter().flat_map(|v| v.to_le_bytes()).collect()
                        };
                        let wd: Vec<f32> = if ty == GgmlType::F16 { wf.iter().map(|v| half::f16::from_f32(*v).to_f32()).collect() } else { wf.clone() };
                        let tv = TensorView { name: "w", ty, ne: [n_in, n_out, 1, 1], data: &w, layout: crate::model::Layout::Plain };
                        for n_tok in [1usize, 2, 3, 5, 7, 14, 70] {
                            let x: Vec<f32> = (0..n_in * n_tok).map(|_| next(&mut s)).collect();
                            let xd: Vec<f32> = if ty == GgmlType::F16 { x.iter().map(|v| half::f16::from_f32(*v).to_f32()).collect() } else { x.clone() };
                            for pool in &pools {
                                let (r0, r1) = if n_out > 2 { (1, n_out - 1) } else { (0, n_out) };
                                let ld = n_out + 3;
                                let mut out = vec![f32::NAN; ld * n_tok];
                                let mut scratch = Vec::new();
                                if ty == GgmlType::F32 {
                                    matmul_with(pool, set, &tv, &x, n_tok, &mut out, ld, r0..r1, &mut scratch).unwrap();
                                } else {
                                    // F16 (not the matmul's path yet): the kernels directly, on
                                    // f16 activations
                                    let xh: Vec<u8> = x.iter().flat_map(|v| half::f16::from_f32(*v).to_bits().to_le_bytes()).collect();
                                    let k = kernels(set, ty).unwrap();
                                    unsafe {
                                        run(pool, k, n_in, w.as_ptr().add(r0 * 2 * n_in), 2 * n_in, r1 - r0, xh.as_ptr(), 2 * n_in, n_tok, out.as_mut_ptr(), ld)
                                    };
                                }
                                for t in 0..n_tok {
                                    for r in r0..r1 {
                                        let want = dot_scalar(n_in, &wd[r * n_in..], &xd[t * n_in..]);
                                        let got = out[t * ld + r - r0];
                                        assert_eq!(got.to_bits(), want.to_bits(), "{set:?} {ty} n_in={n_in} n_out={n_out} n_tok={n_tok} t={t} r={r}");
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}
