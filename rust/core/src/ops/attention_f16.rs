//! The F16 K/V one_chunk flash-attention kernel (see `attention.rs`'s module doc) for
//! several queries in one pass over their keys: the heads of a GQA group, and in prefill
//! several tokens of the micro-batch that read the same key list. Each K row and V row is
//! converted from f16 once per pass and used by every query that sees that key; each query
//! keeps exactly the arithmetic of the one-query kernel (`dot_f16_ggml`'s lanes and
//! reduction order for q.k, the scalar online-softmax update, `ggml_vec_scale_f16` /
//! `ggml_vec_mad_f16` with one f16 rounding per key on its own accumulator), key by key in
//! the same order, so its result is bit-identical whatever queries share the pass: the
//! determinism guarantee (results independent of n_ubatch and batch composition) holds.
//!
//! A query sees the keys `keys[lo..hi]` of the shared, position-sorted key list (its causal
//! and sliding-window range); a key outside a query's range is skipped for that query only.
//!
//! Kernels: AVX-512 (two of the one-query kernel's 8-lane accumulators in one zmm: lanes
//! 0..8 acc0 / acc2, 8..16 acc1 / acc3, so (a0 + a1) split in halves is ggml's
//! (acc0 + acc2) + (acc1 + acc3); 16-lane f16 conversions of the V accumulator), AVX2 (the
//! one-query kernel's registers), and the portable `ops::vec` calls elsewhere. Where the head
//! dims allow, both x86 sets run a blocked form: blocks of 8 keys, the 8 scores' horizontal
//! sums together, the 8 exps of a block below the running max in one vector (glibc's expf
//! arithmetic, `vexp_ok`), the V accumulation of four or six queries per pass over a block,
//! each step through the f16 accumulator in memory.

use crate::ops::vec::{dot_f16_ggml, fmaf, mad_f16_acc, scale_f16_acc};

/// The F16 K and V rows of one KV head: row of cell c at `k[k_off + c * k_stride..][..hd_k]`.
pub(crate) struct Rows<'a> {
    pub k: &'a [u16],
    pub v: &'a [u16],
    pub k_stride: usize,
    pub v_stride: usize,
    pub k_off: usize,
    pub v_off: usize,
}

/// What the queries of one pass share.
pub(crate) struct Pass<'a> {
    pub rows: Rows<'a>,
    /// the key list (position, cell), sorted by position
    pub keys: &'a [(i32, u32)],
    pub hd_k: usize,
    pub hd_v: usize,
    /// multiplies q.k (the softcap already folded in, as ggml does)
    pub kscale: f32,
    pub softcap: f32,
}

/// A growable buffer (`Vec`'s `resize` and `clear`, a slice otherwise) whose data starts on
/// a 64-byte boundary, so that the kernels' 64-byte loads of its rows (a row length a
/// multiple of 16 f32 or 32 f16) never straddle two cache lines. malloc gives 16-byte
/// alignment, so a plain Vec's rows lay on a line boundary or not depending on the heap:
/// one more field in `Scratch` moved Gemma 3's causal prefill (`--bench attention`,
/// depth 0) by 10% with no change to the kernels. The window starts inside an ordinary
/// allocation 64 bytes longer, so these per-call buffers stay on malloc's fast path (no
/// memalign).
pub(crate) struct Aligned<T: Copy + Default> {
    buf: Vec<T>,
    off: usize,
    len: usize,
}

impl<T: Copy + Default> Default for Aligned<T> {
    fn default() -> Self {
        Aligned { buf: Vec::new(), off: 0, len: 0 }
    }
}

impl<T: Copy + Default> Aligned<T> {
    /// Elements in 64 bytes: the most the window's start moves into the allocation.
    const PER_LINE: usize = 64 / std::mem::size_of::<T>();

    /// As `Vec::resize`: the first min(len, n) values kept, the others set to `v`.
    pub(crate) fn resize(&mut self, n: usize, v: T) {
        if self.buf.len() < self.off + n {
            let mut nb = vec![T::default(); n + Self::PER_LINE];
            let off = nb.as_ptr().align_offset(64).min(Self::PER_LINE);
            let keep = self.len.min(n);
            nb[off..off + keep].copy_from_slice(&self.buf[self.off..self.off + keep]);
            self.buf = nb;
            self.off = off;
        }
        let old = self.len;
        self.len = n;
        if old < n {
            self[old..n].fill(v);
        }
    }

    pub(crate) fn clear(&mut self) {
        self.len = 0;
    }
}

impl<T: Copy + Default> std::ops::Deref for Aligned<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        &self.buf[self.off..self.off + self.len]
    }
}

impl<T: Copy + Default> std::ops::DerefMut for Aligned<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        &mut self.buf[self.off..self.off + self.len]
    }
}

/// Per-thread buffers of a pass.
#[derive(Default)]
pub(crate) struct Scratch {
    kf: Aligned<f32>,
    vf: Aligned<f32>,
    sc: Vec<f32>,
    vs: Vec<f32>,
    ms: Vec<f32>,
    act: Vec<usize>,
    /// the blocked AVX-512 kernel's per (query, key of the block) flags: 0 unseen, 1 mad, 2 scale + mad
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    fl: Vec<u8>,
    /// the blocked AVX-512 kernel's K block transposed (`x86::transpose_block`)
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    kt: Aligned<f32>,
    /// and the pass's queries in pairs (`x86::pair_queries`)
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    qp: Aligned<f32>,
}

/// Runs the queries `qb` [nq * hd_k] (already rounded to f16) over their keys
/// `keys[ranges[i].0..ranges[i].1]`, updating their state: V accumulators `acc`
/// [nq * hd_v] (f16 bits), running max `m` and sum `ssum` (start: 0, -inf, 0).
pub(crate) fn run(p: &Pass, qb: &[f32], ranges: &[(usize, usize)], acc: &mut [u16], m: &mut [f32], ssum: &mut [f32], scr: &mut Scratch) {
    let nq = ranges.len();
    let (hk, hv) = (p.hd_k, p.hd_v);
    assert!(qb.len() >= nq * hk && acc.len() >= nq * hv && m.len() >= nq && ssum.len() >= nq);
    assert!(ranges.iter().all(|&(lo, hi)| lo <= hi && hi <= p.keys.len()));
    let n_rows_k = p.rows.k.len();
    let n_rows_v = p.rows.v.len();
    // every row the keys name lies inside the buffers (checked once, so the kernels can index freely)
    // (over the union of the ranges: each key once, not once per query)
    let lo = ranges.iter().map(|r| r.0).min().unwrap_or(0);
    let hi = ranges.iter().map(|r| r.1).max().unwrap_or(0);
    let max_cell = p.keys[lo..hi.max(lo)].iter().map(|k| k.1 as usize).max();
    if let Some(c) = max_cell {
        assert!(p.rows.k_off + c * p.rows.k_stride + hk <= n_rows_k && p.rows.v_off + c * p.rows.v_stride + hv <= n_rows_v);
    }
    scr.kf.resize(hk, 0.0);
    scr.vf.resize(hv, 0.0);
    scr.sc.resize(nq, 0.0);
    scr.vs.resize(nq, 0.0);
    scr.ms.resize(nq, 0.0);
    scr.act.resize(nq, 0);
    #[cfg(target_arch = "x86_64")]
    {
        if crate::quant::table::kernels().avx2_math {
            // the AVX2 kernels' f16 store form: to a register, then stored, on AMD (`st8`)
            let amd = crate::quant::cpu::features().amd;
            if crate::quant::kernel_set().is_avx512() && hk % 32 == 0 && hv % 64 == 0 && nq > 0 {
                scr.kf.resize(x86::KB * hk, 0.0);
                scr.vf.resize(x86::KB * hv, 0.0);
                scr.sc.resize(nq * x86::KB, 0.0);
                scr.vs.resize(nq * x86::KB, 0.0);
                scr.ms.resize(nq * x86::KB, 0.0);
                scr.fl.clear();
                scr.fl.resize(x86::fl_rows(nq) * x86::KB, 0);
                // SAFETY: as below; buffer sizes set here.
                // (the ymm accumulation on AMD only for passes of more than STEADY_Q queries:
                // a decode step's few queries have too few independent accumulator chains to
                // cover the round trip's latency at half the width; Gemma 3's decode step at
                // depth 4096 took 0.242 -> 0.296 ms per layer with it)
                match (x86::transposed_scores(nq, hk), amd && nq > x86::STEADY_Q) {
                    (true, true) => unsafe { x86::run_avx512_blocked::<true, true>(p, qb, ranges, acc, m, ssum, scr) },
                    (true, false) => unsafe { x86::run_avx512_blocked::<true, false>(p, qb, ranges, acc, m, ssum, scr) },
                    (false, true) => unsafe { x86::run_avx512_blocked::<false, true>(p, qb, ranges, acc, m, ssum, scr) },
                    (false, false) => unsafe { x86::run_avx512_blocked::<false, false>(p, qb, ranges, acc, m, ssum, scr) },
                }
            } else if !crate::quant::kernel_set().is_avx512() && hk % 32 == 0 && hv % 16 == 0 && (hk <= 64 || nq >= 8) {
                // blocked: head dim 64 at any pass size (a 4096-key decode step of 1..4
                // queries 40-60% faster); wider heads only with 8+ queries (a Gemma 3 prefill
                // pass: 16% faster; at 1..4 queries the per-key kernel was 12-15% faster)
                scr.kf.resize(x86::KB * hk, 0.0);
                scr.vf.resize(x86::KB * hv, 0.0);
                scr.vs.resize(nq * x86::KB, 0.0);
                scr.ms.resize(nq * x86::KB, 0.0);
                scr.fl.clear();
                scr.fl.resize(x86::fl_rows(nq) * x86::KB, 0);
                // SAFETY: avx2_math: AVX2, FMA and F16C are present; buffer sizes set here.
                if amd {
                    unsafe { x86::run_avx2_blocked::<true>(p, qb, ranges, acc, m, ssum, scr) };
                } else {
                    unsafe { x86::run_avx2_blocked::<false>(p, qb, ranges, acc, m, ssum, scr) };
                }
            } else if crate::quant::kernel_set().is_avx512() {
                // SAFETY: the AVX-512 set is chosen only on CPUs with AVX-512 F/BW/VL (and AVX2, FMA, F16C).
                unsafe { x86::run_avx512(p, qb, ranges, acc, m, ssum, scr) };
            } else {
                // SAFETY: avx2_math: AVX2, FMA and F16C are present.
                if amd {
                    unsafe { x86::run_avx2::<true>(p, qb, ranges, acc, m, ssum, scr) };
                } else {
                    unsafe { x86::run_avx2::<false>(p, qb, ranges, acc, m, ssum, scr) };
                }
            }
            return;
        }
    }
    run_portable(p, qb, ranges, acc, m, ssum, scr);
}

/// Whether the vector exp of the blocked kernels (`x86::exp8`, `x86::exp8_avx2`) gives
/// exactly this process's `f32::exp` (glibc's `__expf_fma`), checked once on ~270K
/// arguments over the softmax's range (every 4096th float in [-104, 0], the special cases
/// around glibc's thresholds, 0, -0, -inf, NaN): where the C library's expf differs
/// (another libc, another glibc build), the kernel keeps calling `f32::exp`, so the bits
/// stay the platform's one_chunk bits either way.
#[cfg(target_arch = "x86_64")]
pub(crate) fn vexp_ok() -> bool {
    static OK: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *OK.get_or_init(|| vexp_matches(4096))
}

/// The kernel set's vector exp (`exp8` on AVX-512, `exp8_avx2` on AVX2) against `f32::exp`
/// on every `step`-th f32 in [-104, 0] plus the edge cases.
#[cfg(target_arch = "x86_64")]
pub(crate) fn vexp_matches(step: u32) -> bool {
    let avx512 = crate::quant::kernel_set().is_avx512();
    if !crate::quant::table::kernels().avx2_math {
        return false;
    }
    let edges = [0.0f32, -0.0, f32::NEG_INFINITY, f32::NAN, -88.0, -87.99999, -88.72283, -103.27892, -103.27893, -103.97207, -103.97208, -1e-30, -1e-45, 88.0, 88.7];
    let mut xs: Vec<f32> = edges.to_vec();
    let mut b = 0x8000_0000u32; // -0.0, then more negative
    while f32::from_bits(b) >= -104.0 {
        xs.push(f32::from_bits(b));
        b += step;
    }
    xs.chunks(8).all(|c| {
        let mut x = [0f32; 8];
        x[..c.len()].copy_from_slice(c);
        // SAFETY: the AVX-512 set (or AVX2 + FMA) was checked above.
        let e = unsafe { if avx512 { x86::exp8_slice(&x) } else { x86::exp8_slice_avx2(&x) } };
        x.iter().zip(&e).all(|(a, b)| a.exp().to_bits() == b.to_bits())
    })
}

/// `f32::exp` of the 8 values of `x` by the kernel set's vector exp (the same bits, see
/// `vexp_ok`), or None where it is not exact here or not present (the caller takes
/// `f32::exp` itself).
pub(crate) fn vexp8(x: &[f32; 8]) -> Option<[f32; 8]> {
    #[cfg(target_arch = "x86_64")]
    if vexp_ok() {
        // SAFETY: vexp_ok holds only where avx2_math (AVX2, FMA, F16C) is present, and the
        // AVX-512 form only with the AVX-512 set (chosen only on CPUs that have it).
        return Some(unsafe { if crate::quant::kernel_set().is_avx512() { x86::exp8_slice(x) } else { x86::exp8_slice_avx2(x) } });
    }
    let _ = x;
    None
}

/// The active queries of key j (those whose range holds it), into `act`; their count.
#[inline(always)]
fn active(ranges: &[(usize, usize)], j: usize, act: &mut [usize]) -> usize {
    let mut na = 0;
    for (i, &(lo, hi)) in ranges.iter().enumerate() {
        act[na] = i;
        na += (lo <= j && j < hi) as usize;
    }
    na
}

/// The online-softmax step of the one_chunk kernel for score `s` of a query with state
/// (m, ssum): returns (ms, vs); ms != 1 or a new max means the accumulator is scaled by ms
/// (signalled by the returned flag).
#[inline(always)]
fn softmax_step(p: &Pass, dot: f32, m: &mut f32, ssum: &mut f32) -> (bool, f32, f32) {
    let mut s = dot * p.kscale;
    if p.softcap != 0.0 {
        s = p.softcap * s.tanh();
    }
    let mut ms = 1.0f32;
    let mut vs = 1.0f32;
    let scale = s > *m;
    if scale {
        let m_old = *m;
        *m = s;
        ms = (m_old - s).exp();
    } else {
        vs = (s - *m).exp();
    }
    *ssum = fmaf(*ssum, ms, vs); // GCC: fma(S, ms, vs)
    (scale, ms, vs)
}

fn run_portable(p: &Pass, qb: &[f32], ranges: &[(usize, usize)], acc: &mut [u16], m: &mut [f32], ssum: &mut [f32], scr: &mut Scratch) {
    let (hk, hv) = (p.hd_k, p.hd_v);
    let jlo = ranges.iter().map(|r| r.0).min().unwrap_or(0);
    let jhi = ranges.iter().map(|r| r.1).max().unwrap_or(0);
    for j in jlo..jhi {
        let na = active(ranges, j, &mut scr.act);
        if na == 0 {
            continue;
        }
        let cell = p.keys[j].1 as usize;
        let k16 = &p.rows.k[p.rows.k_off + cell * p.rows.k_stride..][..hk];
        let v16 = &p.rows.v[p.rows.v_off + cell * p.rows.v_stride..][..hv];
        for &i in &scr.act[..na] {
            let (scale, ms, vs) = softmax_step(p, dot_f16_ggml(k16, &qb[i * hk..(i + 1) * hk]), &mut m[i], &mut ssum[i]);
            let a = &mut acc[i * hv..(i + 1) * hv];
            if scale {
                scale_f16_acc(a, ms);
            }
            mad_f16_acc(a, vs, v16);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{active, softmax_step, Pass, Scratch};
    use crate::ops::vec::{mad_f16_acc_ref, scale_f16_acc_ref};
    use half::f16;
    use std::arch::x86_64::*;

    /// ggml's reduction of the four 8-lane accumulators of an f16 dot, given x =
    /// (acc0 + acc2) + (acc1 + acc3): lanes l + l+4, then (0+1) + (2+3); the elements past
    /// the last 32 added in f64 (as `vec::finish_f16_dot`).
    #[inline(always)]
    unsafe fn finish(x: __m256, k16: &[u16], q: &[f32], np: usize, n: usize) -> f32 {
        let t0 = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps::<1>(x));
        let t1 = _mm_hadd_ps(t0, t0);
        let r = _mm_cvtss_f32(_mm_hadd_ps(t1, t1));
        if np == n {
            return r;
        }
        let mut s = r as f64;
        for i in np..n {
            s += (f16::from_bits(k16[i]).to_f32() * q[i]) as f64;
        }
        s as f32
    }

    /// The 8 f16 at p as f32 (the load folds into `vcvtph2ps`: see `accumulate_steady_avx2`).
    #[inline(always)]
    unsafe fn ld8(p: *const u16) -> __m256 {
        _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
    }

    /// y rounded to f16 (to nearest even) into the 8 f16 at p: `vcvtps2ph` to memory, or
    /// with `R` to a register and then a plain store. On Intel (measured on Golden Cove)
    /// the memory form leaves out the register form's shuffle uop; on AMD Zen 3 the memory
    /// form runs one per two cycles, the register form and a store one per cycle (in a loop
    /// of 24 independent accumulator steps: 2.1-3.1 against 1.3-1.6 cycles per 8 lanes),
    /// so `run` picks R by vendor. The same f16 either way.
    #[inline(always)]
    unsafe fn st8<const R: bool>(p: *mut u16, y: __m256) {
        #[allow(unused_mut)]
        let mut h = _mm256_cvtps_ph::<0>(y);
        if R {
            // an empty asm that takes h in a register, so the compiler cannot fold the
            // store into the conversion
            std::arch::asm!("/* {0} */", inout(xmm_reg) h, options(pure, nomem, nostack, preserves_flags));
        }
        _mm_storeu_si128(p as *mut __m128i, h)
    }

    /// The ymm V-row loaders of the blocked kernels: a staged f32 row, or (`ld8`) straight
    /// from the f16 cache.
    #[inline(always)]
    unsafe fn staged8(p: *const f32) -> __m256 {
        _mm256_loadu_ps(p)
    }

    #[inline(always)]
    unsafe fn direct8(p: *const u16) -> __m256 {
        ld8(p)
    }

    /// f16 row -> f32 (exact)
    #[inline(always)]
    unsafe fn to_f32_avx2(src: &[u16], dst: &mut [f32]) {
        let n = src.len();
        let n8 = n / 8 * 8;
        let mut i = 0;
        while i < n8 {
            _mm256_storeu_ps(dst.as_mut_ptr().add(i), ld8(src.as_ptr().add(i)));
            i += 8;
        }
        for i in n8..n {
            dst[i] = f16::from_bits(src[i]).to_f32();
        }
    }

    /// `dot_f16_ggml_avx2(k16, q)` with k16 already in f32 (`kf`).
    #[inline(always)]
    unsafe fn dot_avx2(kf: &[f32], k16: &[u16], q: &[f32]) -> f32 {
        let n = kf.len();
        let np = n / 32 * 32;
        let mut a = [_mm256_setzero_ps(); 4];
        let mut i = 0;
        while i < np {
            for (j, aj) in a.iter_mut().enumerate() {
                *aj = _mm256_fmadd_ps(_mm256_loadu_ps(kf.as_ptr().add(i + 8 * j)), _mm256_loadu_ps(q.as_ptr().add(i + 8 * j)), *aj);
            }
            i += 32;
        }
        let x = _mm256_add_ps(_mm256_add_ps(a[0], a[2]), _mm256_add_ps(a[1], a[3]));
        finish(x, k16, q, np, n)
    }

    /// y = f16(y * a) over the 8-lane chunks from `from`, then the rest as ggml's scalar tail
    #[inline(always)]
    unsafe fn scale_avx2<const R: bool>(y: &mut [u16], from: usize, a: f32) {
        let n = y.len();
        let n8 = n / 8 * 8;
        let va = _mm256_set1_ps(a);
        let mut i = from;
        while i < n8 {
            let py = y.as_mut_ptr().add(i);
            st8::<R>(py, _mm256_mul_ps(ld8(py), va));
            i += 8;
        }
        if n8 < n {
            scale_f16_acc_ref(&mut y[n8..], a);
        }
    }

    /// y = f16(x * a + y) over the 8-lane chunks from `from` (x in f32), then the scalar tail
    #[inline(always)]
    unsafe fn mad_avx2<const R: bool>(y: &mut [u16], from: usize, a: f32, xf: &[f32], x16: &[u16]) {
        let n = y.len();
        let n8 = n / 8 * 8;
        let va = _mm256_set1_ps(a);
        let mut i = from;
        while i < n8 {
            let py = y.as_mut_ptr().add(i);
            st8::<R>(py, _mm256_fmadd_ps(_mm256_loadu_ps(xf.as_ptr().add(i)), va, ld8(py)));
            i += 8;
        }
        if n8 < n {
            mad_f16_acc_ref(&mut y[n8..], a, &x16[n8..]);
        }
    }

    macro_rules! pass_body {
        ($p:ident, $qb:ident, $ranges:ident, $acc:ident, $m:ident, $ssum:ident, $scr:ident, $to_f32:ident, $dot:ident, $scale:expr, $mad:expr) => {{
            let (hk, hv) = ($p.hd_k, $p.hd_v);
            let jlo = $ranges.iter().map(|r| r.0).min().unwrap_or(0);
            let jhi = $ranges.iter().map(|r| r.1).max().unwrap_or(0);
            let Scratch { kf, vf, sc, vs, ms, act, .. } = $scr;
            for j in jlo..jhi {
                let na = active($ranges, j, act);
                if na == 0 {
                    continue;
                }
                let cell = $p.keys[j].1 as usize;
                let k16 = $p.rows.k.get_unchecked($p.rows.k_off + cell * $p.rows.k_stride..).get_unchecked(..hk);
                $to_f32(k16, kf);
                for a in 0..na {
                    let i = *act.get_unchecked(a);
                    *sc.get_unchecked_mut(a) = $dot(kf, k16, $qb.get_unchecked(i * hk..(i + 1) * hk));
                }
                for a in 0..na {
                    let i = *act.get_unchecked(a);
                    let (scale, msa, vsa) = softmax_step($p, *sc.get_unchecked(a), $m.get_unchecked_mut(i), $ssum.get_unchecked_mut(i));
                    // a scale flag travels as ms (scale <=> ms slot is finite; 2.0 never is an ms)
                    *ms.get_unchecked_mut(a) = if scale { msa } else { 2.0 };
                    *vs.get_unchecked_mut(a) = vsa;
                }
                let v16 = $p.rows.v.get_unchecked($p.rows.v_off + cell * $p.rows.v_stride..).get_unchecked(..hv);
                $to_f32(v16, vf);
                for a in 0..na {
                    let i = *act.get_unchecked(a);
                    let y = $acc.get_unchecked_mut(i * hv..(i + 1) * hv);
                    let msa = *ms.get_unchecked(a);
                    if msa != 2.0 {
                        $scale(y, msa);
                    }
                    $mad(y, *vs.get_unchecked(a), vf, v16);
                }
            }
        }};
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn run_avx2<const R: bool>(p: &Pass, qb: &[f32], ranges: &[(usize, usize)], acc: &mut [u16], m: &mut [f32], ssum: &mut [f32], scr: &mut Scratch) {
        #[inline(always)]
        unsafe fn scale<const R: bool>(y: &mut [u16], a: f32) {
            scale_avx2::<R>(y, 0, a)
        }
        #[inline(always)]
        unsafe fn mad<const R: bool>(y: &mut [u16], a: f32, xf: &[f32], x16: &[u16]) {
            mad_avx2::<R>(y, 0, a, xf, x16)
        }
        pass_body!(p, qb, ranges, acc, m, ssum, scr, to_f32_avx2, dot_avx2, scale::<R>, mad::<R>)
    }

    /// The 16 f16 at p as f32. `_mm512_cvtph_ps` is the {sae} form, which has no memory
    /// operand: the compiler then loads apart and converts in a register, a shuffle uop
    /// more; this form takes the load (the same values: {sae} only silences exceptions).
    #[inline(always)]
    unsafe fn ld16(p: *const u16) -> __m512 {
        _mm512_cvt_roundph_ps::<_MM_FROUND_CUR_DIRECTION>(_mm256_loadu_si256(p as *const __m256i))
    }

    /// y rounded to f16 (to nearest even) into the 16 f16 at p: `vcvtps2ph` to memory (the
    /// rounding imm without {sae}, as `ld16`).
    #[inline(always)]
    unsafe fn st16(p: *mut u16, y: __m512) {
        _mm256_storeu_si256(p as *mut __m256i, _mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(y))
    }

    #[inline(always)]
    unsafe fn to_f32_512(src: &[u16], dst: &mut [f32]) {
        let n = src.len();
        let n16 = n / 16 * 16;
        let mut i = 0;
        while i < n16 {
            _mm512_storeu_ps(dst.as_mut_ptr().add(i), ld16(src.as_ptr().add(i)));
            i += 16;
        }
        to_f32_avx2(&src[n16..], &mut dst[n16..]);
    }

    /// A query-key dot's two zmm accumulators (a0 = acc0 | acc1, a1 = acc2 | acc3) folded to
    /// the 8 lanes (acc0 + acc2) + (acc1 + acc3), ggml's order before the horizontal sum.
    #[inline(always)]
    unsafe fn fold_halves(a0: __m512, a1: __m512) -> __m256 {
        let ab = _mm512_add_ps(a0, a1);
        _mm256_add_ps(_mm512_castps512_ps256(ab), _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(ab))))
    }

    /// `dot_avx2` with zmm accumulators: a0 holds acc0 | acc1, a1 acc2 | acc3 (the same
    /// FMAs lane for lane), so a0 + a1 is (acc0 + acc2) | (acc1 + acc3).
    #[inline(always)]
    unsafe fn dot_512(kf: &[f32], k16: &[u16], q: &[f32]) -> f32 {
        let n = kf.len();
        let np = n / 32 * 32;
        let mut a0 = _mm512_setzero_ps();
        let mut a1 = _mm512_setzero_ps();
        let mut i = 0;
        while i < np {
            a0 = _mm512_fmadd_ps(_mm512_loadu_ps(kf.as_ptr().add(i)), _mm512_loadu_ps(q.as_ptr().add(i)), a0);
            a1 = _mm512_fmadd_ps(_mm512_loadu_ps(kf.as_ptr().add(i + 16)), _mm512_loadu_ps(q.as_ptr().add(i + 16)), a1);
            i += 32;
        }
        finish(fold_halves(a0, a1), k16, q, np, n)
    }

    /// glibc's `__exp2f_data` (sysdeps/ieee754/flt-32/e_exp2f_data.c, EXP2F_TABLE_BITS 5):
    /// tab[i] = bits(2^(i/32)) - (i << 47), then N/ln2, the shift 0x1.8p52 and the
    /// polynomial scaled by 1/N^k.
    const EXP_TAB: [u64; 32] = [
        0x3ff0000000000000, 0x3fefd9b0d3158574, 0x3fefb5586cf9890f, 0x3fef9301d0125b51, 0x3fef72b83c7d517b, 0x3fef54873168b9aa,
        0x3fef387a6e756238, 0x3fef1e9df51fdee1, 0x3fef06fe0a31b715, 0x3feef1a7373aa9cb, 0x3feedea64c123422, 0x3feece086061892d,
        0x3feebfdad5362a27, 0x3feeb42b569d4f82, 0x3feeab07dd485429, 0x3feea47eb03a5585, 0x3feea09e667f3bcd, 0x3fee9f75e8ec5f74,
        0x3feea11473eb0187, 0x3feea589994cce13, 0x3feeace5422aa0db, 0x3feeb737b0cdc5e5, 0x3feec49182a3f090, 0x3feed503b23e255d,
        0x3feee89f995ad3ad, 0x3feeff76f2fb5e47, 0x3fef199bdd85529c, 0x3fef3720dcef9069, 0x3fef5818dcfba487, 0x3fef7c97337b9b5f,
        0x3fefa4afa2a490da, 0x3fefd0765b6e4540,
    ];
    const INVLN2N: f64 = f64::from_bits(0x40471547652b82fe); // 0x1.71547652b82fep+5
    const SHIFT: f64 = f64::from_bits(0x4338000000000000); // 0x1.8p52
    const C0: f64 = f64::from_bits(0x3ebc6af84b912394); // 0x1.c6af84b912394p-20
    const C1: f64 = f64::from_bits(0x3f2ebfce50fac4f3); // 0x1.ebfce50fac4f3p-13
    const C2: f64 = f64::from_bits(0x3f962e42ff0c52d6); // 0x1.62e42ff0c52d6p-6

    /// The vector exps `out` of `x`, with the lanes set in `special` (glibc's special cases:
    /// |x| >= 88, NaN, inf) replaced by `f32::exp` itself.
    #[inline(always)]
    unsafe fn with_special(out: __m256, x: __m256, special: u32) -> __m256 {
        if special == 0 {
            return out;
        }
        let mut o = [0f32; 8];
        let mut xi = [0f32; 8];
        _mm256_storeu_ps(o.as_mut_ptr(), out);
        _mm256_storeu_ps(xi.as_mut_ptr(), x);
        for l in 0..8 {
            if special >> l & 1 != 0 {
                o[l] = xi[l].exp();
            }
        }
        _mm256_loadu_ps(o.as_ptr())
    }

    /// expf of 8 lanes, bit-identical to glibc's x86-64 `__expf_fma` (what `f32::exp` calls
    /// on glibc >= 2.27 with FMA): xd = x; kd' = fma(N/ln2, xd, shift); ki = bits(kd');
    /// kd = kd' - shift; r = fma(N/ln2, xd, -kd); s = double(tab[ki % 32] + (ki << 47));
    /// y = fma(fma(r, C0, C1), r * r, fma(r, C2, 1)) * s, rounded to f32; lanes with
    /// |x| >= 88 (and NaN / inf), glibc's special cases, call `f32::exp` itself. Used only
    /// after `vexp_ok` confirmed it against this process's `f32::exp`.
    #[inline(always)]
    pub(super) unsafe fn exp8(x: __m256) -> __m256 {
        let bits = _mm256_castps_si256(x);
        let abstop = _mm256_and_si256(_mm256_srli_epi32::<20>(bits), _mm256_set1_epi32(0x7ff));
        let special = _mm256_cmpgt_epi32_mask(abstop, _mm256_set1_epi32(0x42a));
        let xd = _mm512_cvtps_pd(x);
        let kds = _mm512_fmadd_pd(_mm512_set1_pd(INVLN2N), xd, _mm512_set1_pd(SHIFT));
        let ki = _mm512_castpd_si512(kds);
        let kd = _mm512_sub_pd(kds, _mm512_set1_pd(SHIFT));
        let r = _mm512_fmsub_pd(_mm512_set1_pd(INVLN2N), xd, kd);
        let idx = _mm512_and_si512(ki, _mm512_set1_epi64(31));
        let tp = EXP_TAB.as_ptr() as *const __m512i;
        let t_lo = _mm512_permutex2var_epi64(_mm512_loadu_si512(tp), idx, _mm512_loadu_si512(tp.add(1)));
        let t_hi = _mm512_permutex2var_epi64(_mm512_loadu_si512(tp.add(2)), idx, _mm512_loadu_si512(tp.add(3)));
        let tv = _mm512_mask_blend_epi64(_mm512_test_epi64_mask(idx, _mm512_set1_epi64(16)), t_lo, t_hi);
        let t = _mm512_add_epi64(tv, _mm512_slli_epi64::<47>(ki));
        let z = _mm512_fmadd_pd(r, _mm512_set1_pd(C0), _mm512_set1_pd(C1));
        let r2 = _mm512_mul_pd(r, r);
        let y = _mm512_fmadd_pd(r, _mm512_set1_pd(C2), _mm512_set1_pd(1.0));
        let y = _mm512_fmadd_pd(z, r2, y);
        let y = _mm512_mul_pd(y, _mm512_castsi512_pd(t));
        let out = _mm512_cvtpd_ps(y);
        with_special(out, x, special as u32)
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
    pub(super) unsafe fn exp8_slice(x: &[f32; 8]) -> [f32; 8] {
        let mut o = [0f32; 8];
        _mm256_storeu_ps(o.as_mut_ptr(), exp8(_mm256_loadu_ps(x.as_ptr())));
        o
    }

    #[inline(always)]
    unsafe fn scale_512(y: &mut [u16], a: f32) {
        let n16 = y.len() / 16 * 16;
        let va = _mm512_set1_ps(a);
        let mut i = 0;
        while i < n16 {
            let py = y.as_mut_ptr().add(i);
            st16(py, _mm512_mul_ps(ld16(py), va));
            i += 16;
        }
        scale_avx2::<false>(y, n16, a);
    }

    #[inline(always)]
    unsafe fn mad_512(y: &mut [u16], a: f32, xf: &[f32], x16: &[u16]) {
        let n16 = y.len() / 16 * 16;
        let va = _mm512_set1_ps(a);
        let mut i = 0;
        while i < n16 {
            let py = y.as_mut_ptr().add(i);
            st16(py, _mm512_fmadd_ps(_mm512_loadu_ps(xf.as_ptr().add(i)), va, ld16(py)));
            i += 16;
        }
        mad_avx2::<false>(y, n16, a, xf, x16);
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    pub(super) unsafe fn run_avx512(p: &Pass, qb: &[f32], ranges: &[(usize, usize)], acc: &mut [u16], m: &mut [f32], ssum: &mut [f32], scr: &mut Scratch) {
        pass_body!(p, qb, ranges, acc, m, ssum, scr, to_f32_512, dot_512, scale_512, mad_512)
    }

    /// Most queries whose scores one call computes (`scores_group_512`: a group's K row
    /// loaded once for all of them; 8 measured 1-2% faster than 6 and 4-7% faster than 4
    /// in `--bench attention`'s prefill).
    pub(super) const GROUP_Q: usize = 8;

    /// Rows of flags (KB each, zeroed) a blocked pass of nq queries needs: the general
    /// accumulation reads four queries' flags from any i0 < nq (after steady steps of
    /// STEADY_Q = 6, i0 need not be a multiple of 4), so up to row nq + 2. Sized to nq
    /// rounded up to 4 before, a pass read up to two rows past the buffer whenever a general
    /// step began at i0 = 2 (mod 4) within 4 of the end (7 or 8 queries after one steady
    /// step): malloc's next chunk header taken for a flag, then a V weight read past `vs`,
    /// which segfaulted where that lay at the end of a heap (one CI crash traced to it from
    /// its core; two earlier ones in the same kind of decode had no core).
    pub(super) fn fl_rows(nq: usize) -> usize {
        nq + 3
    }

    /// Keys per block of the blocked AVX-512 kernel.
    pub(super) const KB: usize = 8;

    /// The scores of the first `nq` (<= STEADY_Q) queries of `q` (nq rows of hk) against
    /// the KB keys whose f16 K rows are `krows`, each row converted once for all of them
    /// (not staged in f32): `scores_n_512`.
    #[inline(always)]
    unsafe fn scores_direct_512(krows: &[*const u16; KB], hk: usize, q: *const f32, nq: usize, out: &mut [[f32; KB]; GROUP_Q]) {
        scores_nq_512(&|kk: usize, i: usize| ld16(krows.get_unchecked(kk).add(i)), hk, q, nq, out)
    }

    /// The scores of the first `nq` (<= GROUP_Q) queries of `q` against the block's K rows
    /// staged in f32 (`kf`: KB rows of hk): rows of 128+ elements in blocks of 4 queries x 2
    /// keys (`scores_blk_512`), shorter ones each key's row loaded once for the group
    /// (`scores_n_512`).
    #[inline(always)]
    unsafe fn scores_group_512(kf: &[f32], hk: usize, q: *const f32, nq: usize, out: &mut [[f32; KB]; GROUP_Q]) {
        if hk >= 128 {
            let mut j = 0;
            while j + 4 <= nq {
                scores_blk_512::<4>(kf, hk, q.add(j * hk), out.as_mut_ptr().add(j));
                j += 4;
            }
            match nq - j {
                1 => scores_blk_512::<1>(kf, hk, q.add(j * hk), out.as_mut_ptr().add(j)),
                2 => scores_blk_512::<2>(kf, hk, q.add(j * hk), out.as_mut_ptr().add(j)),
                3 => scores_blk_512::<3>(kf, hk, q.add(j * hk), out.as_mut_ptr().add(j)),
                _ => {}
            }
            return;
        }
        scores_nq_512(&|kk: usize, i: usize| _mm512_loadu_ps(kf.as_ptr().add(kk * hk + i)), hk, q, nq, out)
    }

    /// `scores_n_512`'s values for NQ queries against the staged K rows, two keys and NQ
    /// queries register-blocked: per 32-element step each query's q loaded once for two
    /// keys and each key's K once for NQ queries (0.75 loads per FMA at NQ = 4, against
    /// 1.125 with one key and 8 queries: a 256-wide row's scores were load-bound). The same
    /// FMAs per (query, key) in the same order, the same sums after.
    #[inline(always)]
    unsafe fn scores_blk_512<const NQ: usize>(kf: &[f32], hk: usize, q: *const f32, out: *mut [f32; KB]) {
        let kp = kf.as_ptr();
        let mut x = [[_mm256_setzero_ps(); KB]; NQ];
        for kk in (0..KB).step_by(2) {
            let mut a0 = [[_mm512_setzero_ps(); 2]; NQ];
            let mut a1 = [[_mm512_setzero_ps(); 2]; NQ];
            let mut i = 0;
            while i < hk {
                let k = [
                    [_mm512_loadu_ps(kp.add(kk * hk + i)), _mm512_loadu_ps(kp.add(kk * hk + i + 16))],
                    [_mm512_loadu_ps(kp.add((kk + 1) * hk + i)), _mm512_loadu_ps(kp.add((kk + 1) * hk + i + 16))],
                ];
                for j in 0..NQ {
                    let qj = q.add(j * hk + i);
                    let (q0, q1) = (_mm512_loadu_ps(qj), _mm512_loadu_ps(qj.add(16)));
                    for t in 0..2 {
                        a0[j][t] = _mm512_fmadd_ps(k[t][0], q0, a0[j][t]);
                        a1[j][t] = _mm512_fmadd_ps(k[t][1], q1, a1[j][t]);
                    }
                }
                i += 32;
            }
            for j in 0..NQ {
                for t in 0..2 {
                    x[j][kk + t] = fold_halves(a0[j][t], a1[j][t]);
                }
            }
        }
        for j in 0..NQ {
            *out.add(j) = hsum_8(&x[j]);
        }
    }

    /// `scores_n_512` for nq (1..=GROUP_Q) queries.
    #[inline(always)]
    unsafe fn scores_nq_512<K: Fn(usize, usize) -> __m512>(k: &K, hk: usize, q: *const f32, nq: usize, out: &mut [[f32; KB]; GROUP_Q]) {
        match nq {
            1 => scores_n_512::<1, _>(k, hk, q, out),
            2 => scores_n_512::<2, _>(k, hk, q, out),
            3 => scores_n_512::<3, _>(k, hk, q, out),
            4 => scores_n_512::<4, _>(k, hk, q, out),
            5 => scores_n_512::<5, _>(k, hk, q, out),
            6 => scores_n_512::<6, _>(k, hk, q, out),
            7 => scores_n_512::<7, _>(k, hk, q, out),
            _ => scores_n_512::<8, _>(k, hk, q, out),
        }
    }

    /// The scores of NQ queries against the KB keys, `k(kk, i)` giving elements i..i + 16
    /// of key kk's row: each the exact `dot_512` value (hk a multiple of 32: no tail): per
    /// query and key two accumulators over the 32-element steps, their halves added, then
    /// the 8 keys' `hsum_8`.
    #[inline(always)]
    unsafe fn scores_n_512<const NQ: usize, K: Fn(usize, usize) -> __m512>(k: &K, hk: usize, q: *const f32, out: &mut [[f32; KB]; GROUP_Q]) {
        let mut x = [[_mm256_setzero_ps(); KB]; NQ];
        for kk in 0..KB {
            let mut a0 = [_mm512_setzero_ps(); NQ];
            let mut a1 = [_mm512_setzero_ps(); NQ];
            let mut i = 0;
            while i < hk {
                let (k0, k1) = (k(kk, i), k(kk, i + 16));
                for j in 0..NQ {
                    let qj = q.add(j * hk + i);
                    a0[j] = _mm512_fmadd_ps(k0, _mm512_loadu_ps(qj), a0[j]);
                    a1[j] = _mm512_fmadd_ps(k1, _mm512_loadu_ps(qj.add(16)), a1[j]);
                }
                i += 32;
            }
            for j in 0..NQ {
                x[j][kk] = fold_halves(a0[j], a1[j]);
            }
        }
        for j in 0..NQ {
            out[j] = hsum_8(&x[j]);
        }
    }

    /// Fewest queries in a pass for the transposed scores (`scores_tp`): the block's
    /// transpose is paid once per pass, so a decode step's few queries keep the row form.
    pub(super) const T_MIN_Q: usize = 16;

    /// Widest K rows for the transposed scores: their horizontal sums are a large share of
    /// a 64-element dot (SmolLM2's heads: `--bench attention` prefill at depth 4096, one
    /// thread, 179 -> 160 ms per layer with 8 keys per ymm, 157.8 -> 136.8 ms more with two
    /// queries per zmm), while for Gemma 3's 256 the lane form's broadcast q loads cost more
    /// than they save (246 -> 263 ms in the ymm form; in the pair form 12.2 -> 13.4 ms at
    /// depth 0). 128 not measured.
    pub(super) const T_MAX_HK: usize = 64;

    /// Query pairs per `scores_tp_n` call (4 queries: each pair's 4 + 2 partial sums and
    /// the tree's sums fit the AVX-512 set's 32 registers).
    const T_PAIRS: usize = 2;

    /// Whether a blocked AVX-512 pass of nq queries with K rows of hk elements scores from
    /// the transposed K (`scores_tp`; `run_avx512_blocked::<true>`). A separate instance, so
    /// that the passes which never take it (decode steps, wide heads) run the code they ran
    /// before it.
    pub(super) fn transposed_scores(nq: usize, hk: usize) -> bool {
        nq >= T_MIN_Q && hk <= T_MAX_HK
    }

    /// The block's K rows staged in f32 (`kf`: KB rows of hk) transposed into `kt`, each
    /// value twice: element e of key kk at kt[2 KB e + 2 kk] and [2 KB e + 2 kk + 1], so one
    /// zmm holds the block's 8 keys for the two queries of a pair (`scores_tp_n`);
    /// `avx2::transpose8_epi32` per 8 elements, hk a multiple of 8.
    #[inline(always)]
    unsafe fn transpose_block(kf: &[f32], hk: usize, kt: &mut [f32]) {
        debug_assert!(kf.len() >= KB * hk && kt.len() >= 2 * KB * hk && hk % 8 == 0);
        let (src, dst) = (kf.as_ptr(), kt.as_mut_ptr());
        let dup = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
        let mut e0 = 0;
        while e0 < hk {
            let r: [__m256i; KB] = std::array::from_fn(|kk| _mm256_castps_si256(_mm256_loadu_ps(src.add(kk * hk + e0))));
            for (e, col) in crate::quant::avx2::transpose8_epi32(&r).iter().enumerate() {
                let d = _mm512_permutexvar_ps(dup, _mm512_castps256_ps512(_mm256_castsi256_ps(*col)));
                _mm512_storeu_ps(dst.add(2 * KB * (e0 + e)), d);
            }
            e0 += 8;
        }
    }

    /// The queries `qb` (nq rows of hk) as pairs with their elements interleaved: element e
    /// of query 2j + h at qp[2 hk j + 2 e + h] (an odd nq's last pair has zeros for its
    /// missing query), so that one 8-byte broadcast spreads a pair's element e over the
    /// lanes of `transpose_block`'s layout.
    #[inline(always)]
    fn pair_queries(qb: &[f32], hk: usize, nq: usize, qp: &mut [f32]) {
        let np = nq.div_ceil(2);
        debug_assert!(qb.len() >= nq * hk && qp.len() >= 2 * np * hk);
        for j in 0..np {
            for h in 0..2 {
                let i = 2 * j + h;
                let dst = &mut qp[2 * hk * j..2 * hk * (j + 1)];
                if i < nq {
                    for (e, &v) in qb[i * hk..(i + 1) * hk].iter().enumerate() {
                        dst[2 * e + h] = v;
                    }
                } else {
                    for e in 0..hk {
                        dst[2 * e + h] = 0.0;
                    }
                }
            }
        }
    }

    /// The scores of the first `nq` (<= GROUP_Q) queries against the block's KB keys from
    /// the transposed K rows (`kt`, `transpose_block`'s layout), the keys in the lanes, the
    /// queries paired (`qp`: the group's pairs, `pair_queries`' layout): per query exactly
    /// `dot_avx2`'s value for each key with no horizontal step. Lane 2 kk + h of p[a] runs
    /// query h's accumulator a, lane l, for key kk (elements 32s + 8a + l, s in order, one
    /// FMA each), x_l = (p0 + p2) + (p1 + p3) is that key's (acc0 + acc2) + (acc1 + acc3)
    /// lane l, and (y0 + y1) + (y2 + y3) with y_l = x_l + x_(l+4) is the 8-lane sum's tree.
    /// Two queries per FMA: half the FMAs of an 8-lane form.
    #[inline(always)]
    unsafe fn scores_tp(kt: &[f32], hk: usize, qp: *const f32, nq: usize, out: &mut [[f32; KB]; GROUP_Q]) {
        let np = nq.div_ceil(2);
        let mut j = 0;
        while j + T_PAIRS <= np {
            scores_tp_n::<T_PAIRS>(kt, hk, qp.add(2 * hk * j), out.as_mut_ptr().add(2 * j));
            j += T_PAIRS;
        }
        while j < np {
            scores_tp_n::<1>(kt, hk, qp.add(2 * hk * j), out.as_mut_ptr().add(2 * j));
            j += 1;
        }
    }

    /// `scores_tp` for N query pairs (qp: N pairs of 2 hk) into out[0..2N].
    #[inline(always)]
    unsafe fn scores_tp_n<const N: usize>(kt: &[f32], hk: usize, qp: *const f32, out: *mut [f32; KB]) {
        debug_assert!(kt.len() >= 2 * KB * hk && hk % 32 == 0);
        let kp = kt.as_ptr();
        let bq = |j: usize, e: usize| _mm512_castpd_ps(_mm512_set1_pd(std::ptr::read_unaligned(qp.add(2 * hk * j + 2 * e) as *const f64)));
        let mut t = [[_mm512_setzero_ps(); 2]; N];
        for l in 0..4 {
            let mut x = [[_mm512_setzero_ps(); 2]; N];
            for (h, ll) in [l, l + 4].into_iter().enumerate() {
                let mut p = [[_mm512_setzero_ps(); 4]; N];
                let mut s = 0;
                while s < hk {
                    for a in 0..4 {
                        let e = s + 8 * a + ll;
                        let kv = _mm512_loadu_ps(kp.add(2 * KB * e));
                        for (j, pj) in p.iter_mut().enumerate() {
                            pj[a] = _mm512_fmadd_ps(kv, bq(j, e), pj[a]);
                        }
                    }
                    s += 32;
                }
                for (j, pj) in p.iter().enumerate() {
                    x[j][h] = _mm512_add_ps(_mm512_add_ps(pj[0], pj[2]), _mm512_add_ps(pj[1], pj[3]));
                }
            }
            // y_l = x_l + x_(l+4); t0 = y0 + y1, t1 = y2 + y3
            for (j, xj) in x.iter().enumerate() {
                let y = _mm512_add_ps(xj[0], xj[1]);
                t[j][l / 2] = if l % 2 == 0 { y } else { _mm512_add_ps(t[j][l / 2], y) };
            }
        }
        // lanes 2 kk + h -> query h's row: even lanes to the low half, odd to the high
        let split = _mm512_set_epi32(15, 13, 11, 9, 7, 5, 3, 1, 14, 12, 10, 8, 6, 4, 2, 0);
        for (j, tj) in t.iter().enumerate() {
            let r = _mm512_permutexvar_ps(split, _mm512_add_ps(tj[0], tj[1]));
            _mm256_storeu_ps((*out.add(2 * j)).as_mut_ptr(), _mm512_castps512_ps256(r));
            _mm256_storeu_ps((*out.add(2 * j + 1)).as_mut_ptr(), _mm512_extractf32x8_ps::<1>(r));
        }
    }

    /// The 8 keys' scores from their dot accumulators x[k] = (acc0 + acc2) + (acc1 + acc3):
    /// ggml's horizontal sums of the 8 keys done together, lo/hi halves added per key pair,
    /// then two hadd levels (the same pairs as `finish`: (l + l+4), then (0+1) + (2+3)).
    #[inline(always)]
    unsafe fn hsum_8(x: &[__m256; KB]) -> [f32; KB] {
        // y[k/2] = [x[k].lo + x[k].hi, x[k+1].lo + x[k+1].hi]
        let mut y = [_mm256_setzero_ps(); KB / 2];
        for (k, yk) in y.iter_mut().enumerate() {
            let (a, b) = (x[2 * k], x[2 * k + 1]);
            *yk = _mm256_add_ps(_mm256_permute2f128_ps::<0x20>(a, b), _mm256_permute2f128_ps::<0x31>(a, b));
        }
        let z0 = _mm256_hadd_ps(y[0], y[1]);
        let z1 = _mm256_hadd_ps(y[2], y[3]);
        let w = _mm256_hadd_ps(z0, z1); // keys [0, 2, 4, 6 | 1, 3, 5, 7]
        let mut l = [0f32; 8];
        _mm256_storeu_ps(l.as_mut_ptr(), w);
        [l[0], l[4], l[1], l[5], l[2], l[6], l[3], l[7]]
    }

    /// The online-softmax steps of `s.len()` (<= GROUP_Q) queries over a whole block of KB
    /// keys, if every scaled score `s[g][k] * kscale` lies at or below its query's running
    /// max `m[g]`: then each key takes the softmax's else branch with the same M, so vs =
    /// exp(s - M) (the 8 exps at once) and S = fma(S, ms, vs) with ms = 1, which is S + vs
    /// (one rounding either way), summed in key order; flags 1. The queries' steps side by
    /// side: all the scales and tests, then all the exps, then all the sums (their chains
    /// independent). Returns false, having changed nothing, if a score is above its max.
    #[inline(always)]
    unsafe fn below_max_steps<B: Fn(__m256, __m256) -> bool, E: Fn(__m256) -> __m256>(s: &[[f32; KB]], kscale: f32, m: &[f32], ssum: &mut [f32], vs: &mut [f32], fl: &mut [u8], below: B, exp: E) -> bool {
        let gn = s.len();
        debug_assert!(gn <= GROUP_Q && m.len() == gn && ssum.len() == gn && vs.len() == gn * KB && fl.len() == gn * KB);
        let kv = _mm256_set1_ps(kscale);
        let mut sv = [_mm256_setzero_ps(); GROUP_Q];
        let mut all = true;
        for g in 0..gn {
            let x = _mm256_mul_ps(_mm256_loadu_ps(s.get_unchecked(g).as_ptr()), kv);
            *sv.get_unchecked_mut(g) = x;
            all &= below(x, _mm256_set1_ps(*m.get_unchecked(g)));
        }
        if !all {
            return false;
        }
        for g in 0..gn {
            let e = exp(_mm256_sub_ps(*sv.get_unchecked(g), _mm256_set1_ps(*m.get_unchecked(g))));
            _mm256_storeu_ps(vs.as_mut_ptr().add(g * KB), e);
        }
        for g in 0..gn {
            let pv = vs.as_ptr().add(g * KB);
            let mut ss = *ssum.get_unchecked(g);
            for kk in 0..KB {
                ss += *pv.add(kk);
            }
            *ssum.get_unchecked_mut(g) = ss;
        }
        fl.fill(1);
        true
    }

    /// The steady state of `accumulate_4`: NQ queries from i0 that each take a plain mad
    /// from every key of a whole block (flags all 1), 64 lanes at a time: the same steps
    /// without the per-key flag loads and branches (4 * NQ independent accumulator chains),
    /// each step rounding through the f16 accumulator in memory (as
    /// `accumulate_steady_avx2`: the memory forms of the conversions have no shuffle uop;
    /// 2.23 against 2.63 cycles per 16 lanes here, 24 chains; `ld16`, `st16`). The same bits.
    #[inline(always)]
    unsafe fn accumulate_steady_512<const NQ: usize, V: Fn(usize, usize) -> __m512>(acc: &mut [u16], hv: usize, i0: usize, vr: &V, vs: &[f32]) {
        debug_assert!(acc.len() >= (i0 + NQ) * hv && hv % 64 == 0);
        let base = acc.as_mut_ptr().add(i0 * hv);
        let mut c = 0;
        while c < hv {
            for kk in 0..KB {
                let v = [vr(kk, c), vr(kk, c + 16), vr(kk, c + 32), vr(kk, c + 48)];
                for qi in 0..NQ {
                    let va = _mm512_set1_ps(*vs.get_unchecked((i0 + qi) * KB + kk));
                    let pa = base.add(qi * hv + c);
                    for (u, vu) in v.iter().enumerate() {
                        let pu = pa.add(16 * u);
                        st16(pu, _mm512_fmadd_ps(*vu, va, ld16(pu)));
                    }
                }
            }
            c += 64;
        }
    }

    /// The V accumulation of one block for queries i0..i0 + 4 (those < nq), 64 lanes at a
    /// time, keys in order per query, each step through the f16 accumulator in memory (as
    /// `accumulate_steady_512`).
    #[inline(always)]
    unsafe fn accumulate_4<V: Fn(usize, usize) -> __m512>(acc: &mut [u16], hv: usize, nq: usize, i0: usize, nb: usize, vr: &V, fl: &[u8], ms: &[f32], vs: &[f32]) -> usize {
        // the four queries' flags read below (a mis-sized buffer panics here, not past it)
        assert!(fl.len() >= (i0 + 4) * KB && ms.len() >= nq * KB && vs.len() >= nq * KB);
        if nb == KB {
            let all_one = |n: usize| fl.get_unchecked(i0 * KB..(i0 + n) * KB).iter().all(|&x| x == 1);
            if i0 + STEADY_Q <= nq && all_one(STEADY_Q) {
                accumulate_steady_512::<STEADY_Q, V>(acc, hv, i0, vr, vs);
                return STEADY_Q;
            }
            if i0 + 4 <= nq && all_one(4) {
                accumulate_steady_512::<4, V>(acc, hv, i0, vr, vs);
                return 4;
            }
        }
        accumulate_flagged_512(acc, hv, nq, i0, nb, vr, fl, ms, vs);
        4
    }

    /// `accumulate_4` for AMD (`run_avx512_blocked`'s `Y`): V rows given as ymm; the steady
    /// state (a whole block, every flag 1: 24 independent accumulator chains of 8 lanes) on
    /// ymm with the f16 stores from a register (`accumulate_steady_avx2::<_, true>`), the
    /// flagged steps on zmm as `accumulate_4` (at most 16 chains, which half-width steps
    /// leave latency-bound: SmolLM2's depth-0 prefill, whose causal blocks are mostly
    /// partial, ran 4-10% slower with them on ymm too). The same steps per lane either way.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn accumulate_4_amd<V: Fn(usize, usize) -> __m256>(acc: &mut [u16], hv: usize, nq: usize, i0: usize, nb: usize, vr: &V, fl: &[u8], ms: &[f32], vs: &[f32]) -> usize {
        assert!(fl.len() >= (i0 + 4) * KB && ms.len() >= nq * KB && vs.len() >= nq * KB);
        if let Some(done) = steady_avx2::<true, V>(acc, hv, nq, i0, nb, vr, fl, vs) {
            return done;
        }
        let vz = |kk: usize, off: usize| _mm512_insertf32x8::<1>(_mm512_castps256_ps512(vr(kk, off)), vr(kk, off + 8));
        accumulate_flagged_512(acc, hv, nq, i0, nb, &vz, fl, ms, vs);
        4
    }

    /// The flagged V accumulation of `accumulate_4`: per key and query its flag (0: none, 1:
    /// a mad, 2: the accumulator scaled first), 64 lanes at a time.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn accumulate_flagged_512<V: Fn(usize, usize) -> __m512>(acc: &mut [u16], hv: usize, nq: usize, i0: usize, nb: usize, vr: &V, fl: &[u8], ms: &[f32], vs: &[f32]) {
        let mut c = 0;
        while c < hv {
            for kk in 0..nb {
                let v = [vr(kk, c), vr(kk, c + 16), vr(kk, c + 32), vr(kk, c + 48)];
                for qi in 0..4 {
                    if i0 + qi >= nq {
                        break;
                    }
                    let f = (i0 + qi) * KB + kk;
                    let flag = *fl.get_unchecked(f);
                    if flag == 0 {
                        continue;
                    }
                    let pa = acc.as_mut_ptr().add((i0 + qi) * hv + c);
                    if flag == 2 {
                        let vm = _mm512_set1_ps(*ms.get_unchecked(f));
                        for u in 0..4 {
                            let pu = pa.add(16 * u);
                            st16(pu, _mm512_mul_ps(ld16(pu), vm));
                        }
                    }
                    let va = _mm512_set1_ps(*vs.get_unchecked(f));
                    for (u, vu) in v.iter().enumerate() {
                        let pu = pa.add(16 * u);
                        st16(pu, _mm512_fmadd_ps(*vu, va, ld16(pu)));
                    }
                }
            }
            c += 64;
        }
    }

    /// The blocked pass (blocks of KB keys): the block's K and V rows converted once; the
    /// block's scores per group of queries, then each query's online-softmax steps in key
    /// order (a whole block below the running max: `below_max_steps`, with `$group_soft` for
    /// the group's queries side by side); then the V accumulation four (or six) queries at a
    /// time. Parameterised by the kernel set's row conversion, scores, "no score above the
    /// max" test, vector exp and accumulation.
    macro_rules! blocked_body {
        ($p:ident, $qb:ident, $ranges:ident, $acc:ident, $m:ident, $ssum:ident, $scr:ident, $to_f32:ident, $([$scores_direct:ident, $direct_k_max:expr],)? $scores_group:ident, $group_q:expr, $tr:expr, $group_soft:expr, $below:ident, $exp:ident, $accumulate:expr, $vstaged:ident, $vdirect:ident) => {{
            let (hk, hv) = ($p.hd_k, $p.hd_v);
            let nq = $ranges.len();
            let jlo = $ranges.iter().map(|r| r.0).min().unwrap_or(0);
            let jhi = $ranges.iter().map(|r| r.1).max().unwrap_or(0);
            let Scratch { kf, vf, sc: _, vs, ms, fl, kt, qp, .. } = $scr;
            let vexp = $p.softcap == 0.0 && super::vexp_ok();
            // a pass of at most STEADY_Q queries (a decode step's GQA group) reads each V row
            // once in one accumulation call: converted there from the cache, not staged in
            // f32 first (the same exact conversion, one store and load less per 16 lanes)
            let direct = nq <= STEADY_Q;
            let mut vrows = [std::ptr::null::<u16>(); KB];
            // and (AVX-512) a pass of at most $direct_k_max queries with K rows of 128 elements or more
            // converts each K row inside the scores of all its queries at once
            // (`scores_direct_*`: the same FMAs per query) instead of staging it in f32 for
            // one query at a time. Not for shorter rows: SmolLM2's 64-element rows (128
            // bytes, 384 apart) streaming from memory made its tg128 @ d4096 22% slower
            // (63.2 -> 47.8 t/s), though 12% faster in cache
            let direct_k = false $(|| (nq <= $direct_k_max && hk >= 128))?;
            // a pass of T_MIN_Q queries or more scores from the block's K transposed
            // (`scores_tp`: the keys in the lanes, two queries per vector, no horizontal sums)
            let transposed = $tr;
            if transposed {
                kt.resize(2 * KB * hk, 0.0);
                qp.resize(2 * nq.div_ceil(2) * hk, 0.0);
                pair_queries($qb, hk, nq, qp);
            }
            let mut krows = [std::ptr::null::<u16>(); KB];
            // the other passes' scores: per group of $group_q queries against the staged K
            // rows (each row loaded once per group)
            let gq: usize = $group_q;
            let mut s_all = [[0f32; KB]; GROUP_Q];
            let mut j0 = jlo;
            while j0 < jhi {
                let nb = KB.min(jhi - j0);
                for kk in 0..nb {
                    let cell = $p.keys[j0 + kk].1 as usize;
                    let k16 = $p.rows.k.get_unchecked($p.rows.k_off + cell * $p.rows.k_stride..).get_unchecked(..hk);
                    if direct_k {
                        *krows.get_unchecked_mut(kk) = k16.as_ptr();
                    } else {
                        $to_f32(k16, kf.get_unchecked_mut(kk * hk..(kk + 1) * hk));
                    }
                    let v16 = $p.rows.v.get_unchecked($p.rows.v_off + cell * $p.rows.v_stride..).get_unchecked(..hv);
                    if direct {
                        *vrows.get_unchecked_mut(kk) = v16.as_ptr();
                    } else {
                        $to_f32(v16, vf.get_unchecked_mut(kk * hv..(kk + 1) * hv));
                    }
                }
                if transposed {
                    transpose_block(kf, hk, kt);
                }
                if direct_k {
                    // a partial last block: its missing keys' scores are computed from
                    // the first key's row and never used
                    for kk in nb..KB {
                        *krows.get_unchecked_mut(kk) = krows[0];
                    }
                    $($scores_direct(&krows, hk, $qb.as_ptr(), nq, &mut s_all);)?
                }
                let mut any = false;
                let mut group_done = usize::MAX; // the group whose scores s_all holds
                let mut solo_to = 0; // queries before it take their softmax steps alone
                let mut i = 0;
                while i < nq {
                    let (lo, hi) = *$ranges.get_unchecked(i);
                    let (a, b) = (lo.max(j0), hi.min(j0 + nb));
                    if a >= b {
                        fl.get_unchecked_mut(i * KB..(i + 1) * KB).fill(0);
                        i += 1;
                        continue;
                    }
                    any = true;
                    // query i's scores are s_all[si], and its group ends before query ge:
                    // `scores_direct` gave every query's; otherwise its group's scores are
                    // computed at the group's first query that sees the block (queries of the
                    // group that see none of it get scores too, never used)
                    let (si, ge) = if direct_k {
                        (i, nq)
                    } else {
                        let g = i / gq;
                        let g0 = g * gq;
                        let gn = gq.min(nq - g0);
                        if group_done != g {
                            group_done = g;
                            if transposed {
                                // (g0 is even: pair g0 / 2 starts at g0 * hk)
                                scores_tp(kt, hk, qp.as_ptr().add(g0 * hk), gn, &mut s_all);
                            } else {
                                $scores_group(kf, hk, $qb.as_ptr().add(g0 * hk), gn, &mut s_all);
                            }
                        }
                        (i - g0, g0 + gn)
                    };
                    if vexp && a == j0 && b == j0 + KB {
                        // the whole block seen: if no score is above the running max (the
                        // common case once the max settles), `below_max_steps`. With
                        // $group_soft the next queries of the group that also see the whole
                        // block go with query i, their exps and sums side by side
                        // (independent chains instead of each after its own query's scores);
                        // if one of them has a score above its max, query i alone, and the
                        // rest of the group one query at a time
                        let mut gn = 1;
                        if $group_soft && i >= solo_to {
                            while i + gn < ge && {
                                let (lo, hi) = *$ranges.get_unchecked(i + gn);
                                lo <= j0 && hi >= j0 + KB
                            } {
                                gn += 1;
                            }
                        }
                        let mut n = gn;
                        let done = loop {
                            let (c, d) = (i * KB, (i + n) * KB);
                            if below_max_steps(s_all.get_unchecked(si..si + n), $p.kscale, $m.get_unchecked(i..i + n), $ssum.get_unchecked_mut(i..i + n), vs.get_unchecked_mut(c..d), fl.get_unchecked_mut(c..d), |x, mv| $below(x, mv), |x| $exp(x)) {
                                break n;
                            }
                            if n == 1 {
                                break 0;
                            }
                            // (the rest of the group one at a time, as the test would fail again)
                            solo_to = ge;
                            n = 1;
                        };
                        if done > 0 {
                            i += done;
                            continue;
                        }
                    }
                    let s = *s_all.get_unchecked(si);
                    let f = fl.get_unchecked_mut(i * KB..(i + 1) * KB);
                    for kk in 0..KB {
                        let j = j0 + kk;
                        if j < a || j >= b {
                            *f.get_unchecked_mut(kk) = 0;
                            continue;
                        }
                        let (scale, msa, vsa) = softmax_step($p, s[kk], $m.get_unchecked_mut(i), $ssum.get_unchecked_mut(i));
                        *f.get_unchecked_mut(kk) = 1 + scale as u8;
                        *ms.get_unchecked_mut(i * KB + kk) = msa;
                        *vs.get_unchecked_mut(i * KB + kk) = vsa;
                    }
                    i += 1;
                }
                if any {
                    let mut i0 = 0;
                    if direct {
                        let vr = move |kk: usize, off: usize| $vdirect(vrows.get_unchecked(kk).add(off));
                        while i0 < nq {
                            i0 += $accumulate($acc, hv, nq, i0, nb, &vr, fl, ms, vs);
                        }
                    } else {
                        let vfp = vf.as_ptr();
                        let vr = move |kk: usize, off: usize| $vstaged(vfp.add(kk * hv + off));
                        while i0 < nq {
                            i0 += $accumulate($acc, hv, nq, i0, nb, &vr, fl, ms, vs);
                        }
                    }
                }
                j0 += nb;
            }
        }};
    }

    /// The pass in blocks of KB keys: the block's K and V rows converted once; the block's
    /// scores per group of queries (`scores_group_512`, `scores_direct_512`, or with T
    /// `scores_tp`), then per query its online-softmax steps in key order; then the V
    /// accumulation four queries at a time, six in the steady state (`accumulate_4`).
    /// hk % 32 == 0, hv % 64 ==
    /// 0; scratch sized by the caller (kf, vf: KB rows; sc, ms, vs: nq * KB; fl: `fl_rows(nq)`
    /// times KB, zeroed).
    ///
    /// With `Y` (AMD) the steady V accumulation runs on ymm with the f16 stores from a
    /// register (`accumulate_4_amd`): Zen 4 splits a zmm conversion into its two halves and
    /// more (a loop of 24 independent accumulator steps, per 16 lanes: zmm memory forms 3.4
    /// cycles, zmm register forms 3.4, ymm register forms 2.7; `vcvtps2ph` to memory 1.6-1.8
    /// cycles a ymm against 0.75 to a register). The same steps per lane: the same bits.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
    pub(super) unsafe fn run_avx512_blocked<const T: bool, const Y: bool>(p: &Pass, qb: &[f32], ranges: &[(usize, usize)], acc: &mut [u16], m: &mut [f32], ssum: &mut [f32], scr: &mut Scratch) {
        #[inline(always)]
        unsafe fn below(sv: __m256, mv: __m256) -> bool {
            _mm256_cmp_ps_mask::<_CMP_GT_OQ>(sv, mv) == 0
        }
        #[inline(always)]
        unsafe fn staged(p: *const f32) -> __m512 {
            _mm512_loadu_ps(p)
        }
        #[inline(always)]
        unsafe fn direct(p: *const u16) -> __m512 {
            ld16(p)
        }
        if Y {
            blocked_body!(p, qb, ranges, acc, m, ssum, scr, to_f32_512, [scores_direct_512, STEADY_Q], scores_group_512, GROUP_Q, T, false, below, exp8, accumulate_4_amd, staged8, direct8)
        } else {
            blocked_body!(p, qb, ranges, acc, m, ssum, scr, to_f32_512, [scores_direct_512, STEADY_Q], scores_group_512, GROUP_Q, T, false, below, exp8, accumulate_4, staged, direct)
        }
    }

    /// The scores of the first `nq` (<= `group_q_avx2(hk)`) queries of `q` against the
    /// block's K rows staged in f32: up to three queries at once, each key's row loaded once
    /// for them (`scores_n_avx2`); head dim 64 one query at a time, q in registers
    /// (`scores_8_avx2_64`). (No direct-K form: the AVX2 blocked kernel runs heads wider than
    /// 64 only in passes of 8+ queries.)
    #[inline(always)]
    unsafe fn scores_group_avx2(kf: &[f32], hk: usize, q: *const f32, nq: usize, out: &mut [[f32; KB]; GROUP_Q]) {
        if hk == 64 {
            for (t, o) in out.iter_mut().enumerate().take(nq) {
                scores_8_avx2_64(kf, std::slice::from_raw_parts(q.add(t * 64), 64), o);
            }
            return;
        }
        debug_assert!(nq <= group_q_avx2(hk));
        let k = |kk: usize, i: usize| _mm256_loadu_ps(kf.as_ptr().add(kk * hk + i));
        match nq {
            1 => scores_n_avx2::<1, _>(&k, hk, q, out),
            2 => scores_n_avx2::<2, _>(&k, hk, q, out),
            _ => scores_n_avx2::<3, _>(&k, hk, q, out),
        }
    }

    /// Queries per group of the AVX2 kernel's scores, which is also the group whose softmax
    /// steps run side by side (`blocked_body`): 3 (`scores_n_avx2`: four accumulators a
    /// query in 12 ymm registers); head dim 64: 8, each query's scores by
    /// `scores_8_avx2_64` (`--bench attention`, SmolLM2 d4096 on Zen 3: groups of 2 / 4 / 8
    /// 249 / 223 / 214 ms per layer, ~262 before the group form). Gemma 3's 256-wide heads
    /// measured the same with groups of 6.
    fn group_q_avx2(hk: usize) -> usize {
        if hk == 64 {
            8
        } else {
            3
        }
    }

    /// The scores of NQ queries against the KB keys, `k(kk, i)` giving elements i..i + 8 of
    /// key kk's row: each the exact `dot_avx2` value (hk a multiple of 32: no tail): per
    /// query and key four accumulators over the 32-element steps, summed
    /// (acc0 + acc2) + (acc1 + acc3), then the 8 keys' `hsum_8`.
    #[inline(always)]
    unsafe fn scores_n_avx2<const NQ: usize, K: Fn(usize, usize) -> __m256>(k: &K, hk: usize, q: *const f32, out: &mut [[f32; KB]]) {
        let mut x = [[_mm256_setzero_ps(); KB]; NQ];
        for kk in 0..KB {
            let mut a = [[_mm256_setzero_ps(); 4]; NQ];
            let mut i = 0;
            while i < hk {
                let kv: [__m256; 4] = std::array::from_fn(|t| k(kk, i + 8 * t));
                for (j, aj) in a.iter_mut().enumerate() {
                    let qj = q.add(j * hk + i);
                    for (t, ajt) in aj.iter_mut().enumerate() {
                        *ajt = _mm256_fmadd_ps(kv[t], _mm256_loadu_ps(qj.add(8 * t)), *ajt);
                    }
                }
                i += 32;
            }
            for (j, aj) in a.iter().enumerate() {
                x[j][kk] = _mm256_add_ps(_mm256_add_ps(aj[0], aj[2]), _mm256_add_ps(aj[1], aj[3]));
            }
        }
        for (j, o) in out.iter_mut().enumerate().take(NQ) {
            *o = hsum_8(&x[j]);
        }
    }

    /// `scores_n_avx2` of one query for head dim 64: q in eight registers, each key's two
    /// FMAs per accumulator straight from its row (the same FMAs in the same order).
    #[inline(always)]
    unsafe fn scores_8_avx2_64(kf: &[f32], q: &[f32], out: &mut [f32; KB]) {
        let qp = q.as_ptr();
        let qv = [
            _mm256_loadu_ps(qp),
            _mm256_loadu_ps(qp.add(8)),
            _mm256_loadu_ps(qp.add(16)),
            _mm256_loadu_ps(qp.add(24)),
            _mm256_loadu_ps(qp.add(32)),
            _mm256_loadu_ps(qp.add(40)),
            _mm256_loadu_ps(qp.add(48)),
            _mm256_loadu_ps(qp.add(56)),
        ];
        let mut x = [_mm256_setzero_ps(); KB];
        for (kk, xk) in x.iter_mut().enumerate() {
            let kr = kf.as_ptr().add(kk * 64);
            let mut a = [_mm256_setzero_ps(); 4];
            for (j, aj) in a.iter_mut().enumerate() {
                *aj = _mm256_fmadd_ps(_mm256_loadu_ps(kr.add(8 * j)), qv[j], *aj);
                *aj = _mm256_fmadd_ps(_mm256_loadu_ps(kr.add(32 + 8 * j)), qv[4 + j], *aj);
            }
            *xk = _mm256_add_ps(_mm256_add_ps(a[0], a[2]), _mm256_add_ps(a[1], a[3]));
        }
        *out = hsum_8(&x);
    }

    /// `exp8`'s arithmetic for 4 lanes in one ymm of doubles, the table read by a gather.
    #[inline(always)]
    unsafe fn exp4_avx2(x: __m128) -> __m128 {
        let xd = _mm256_cvtps_pd(x);
        let kds = _mm256_fmadd_pd(_mm256_set1_pd(INVLN2N), xd, _mm256_set1_pd(SHIFT));
        let ki = _mm256_castpd_si256(kds);
        let kd = _mm256_sub_pd(kds, _mm256_set1_pd(SHIFT));
        let r = _mm256_fmsub_pd(_mm256_set1_pd(INVLN2N), xd, kd);
        let idx = _mm256_and_si256(ki, _mm256_set1_epi64x(31));
        let tv = _mm256_i64gather_epi64::<8>(EXP_TAB.as_ptr() as *const i64, idx);
        let t = _mm256_add_epi64(tv, _mm256_slli_epi64::<47>(ki));
        let z = _mm256_fmadd_pd(r, _mm256_set1_pd(C0), _mm256_set1_pd(C1));
        let r2 = _mm256_mul_pd(r, r);
        let y = _mm256_fmadd_pd(r, _mm256_set1_pd(C2), _mm256_set1_pd(1.0));
        let y = _mm256_fmadd_pd(z, r2, y);
        _mm256_cvtpd_ps(_mm256_mul_pd(y, _mm256_castsi256_pd(t)))
    }

    /// `exp8` with AVX2 + FMA only: the same arithmetic (glibc's `__expf_fma`), two halves
    /// of 4 doubles; lanes with |x| >= 88 (and NaN / inf) call `f32::exp`. Used only after
    /// `vexp_ok` confirmed it against this process's `f32::exp`.
    #[inline(always)]
    pub(super) unsafe fn exp8_avx2(x: __m256) -> __m256 {
        let bits = _mm256_castps_si256(x);
        let abstop = _mm256_and_si256(_mm256_srli_epi32::<20>(bits), _mm256_set1_epi32(0x7ff));
        let special = _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(abstop, _mm256_set1_epi32(0x42a))));
        let lo = exp4_avx2(_mm256_castps256_ps128(x));
        let hi = exp4_avx2(_mm256_extractf128_ps::<1>(x));
        let out = _mm256_insertf128_ps::<1>(_mm256_castps128_ps256(lo), hi);
        with_special(out, x, special as u32)
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn exp8_slice_avx2(x: &[f32; 8]) -> [f32; 8] {
        let mut o = [0f32; 8];
        _mm256_storeu_ps(o.as_mut_ptr(), exp8_avx2(_mm256_loadu_ps(x.as_ptr())));
        o
    }

    /// The steady state of `accumulate_4_avx2`: NQ queries from i0 that each take a plain
    /// mad from every key of a whole block (flags all 1): the same steps without the per-key
    /// flag tests. Each step rounds through the f16 accumulator in memory (`vcvtps2ph` to it,
    /// `vcvtph2ps` from it, forwarded from the store) rather than through a register: the
    /// memory forms leave out the shuffle uop of the register forms (the round trip 1.48
    /// against 2.35 cycles per 8 lanes here, 24 chains), and with no accumulator held in a
    /// register, U vectors of V per key (32 lanes where hv allows) give U * NQ chains to
    /// cover the store-forwarding latency. The same values step by step (a store and reload
    /// of an f16 is the register round trip), so the same bits.
    #[inline(always)]
    unsafe fn accumulate_steady_avx2<const NQ: usize, const R: bool, V: Fn(usize, usize) -> __m256>(acc: &mut [u16], hv: usize, i0: usize, vr: &V, vs: &[f32]) {
        #[inline(always)]
        unsafe fn run<const NQ: usize, const U: usize, const R: bool, V: Fn(usize, usize) -> __m256>(acc: &mut [u16], hv: usize, i0: usize, vr: &V, vs: &[f32]) {
            debug_assert!(acc.len() >= (i0 + NQ) * hv && hv % (8 * U) == 0);
            let base = acc.as_mut_ptr().add(i0 * hv);
            let mut c = 0;
            while c < hv {
                for kk in 0..KB {
                    let mut v = [_mm256_setzero_ps(); U];
                    for (u, vu) in v.iter_mut().enumerate() {
                        *vu = vr(kk, c + 8 * u);
                    }
                    for qi in 0..NQ {
                        let va = _mm256_set1_ps(*vs.get_unchecked((i0 + qi) * KB + kk));
                        let pa = base.add(qi * hv + c);
                        for (u, vu) in v.iter().enumerate() {
                            let pu = pa.add(8 * u);
                            st8::<R>(pu, _mm256_fmadd_ps(*vu, va, ld8(pu)));
                        }
                    }
                }
                c += 8 * U;
            }
        }
        if hv % 32 == 0 {
            run::<NQ, 4, R, V>(acc, hv, i0, vr, vs)
        } else {
            run::<NQ, 2, R, V>(acc, hv, i0, vr, vs)
        }
    }

    /// The steady state of `accumulate_4_avx2` and `accumulate_4_amd`: a whole block whose
    /// flags are all 1 for the STEADY_Q (or 4) queries from i0, by `accumulate_steady_avx2`;
    /// the queries done, or None where the block is not steady for them.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn steady_avx2<const R: bool, V: Fn(usize, usize) -> __m256>(acc: &mut [u16], hv: usize, nq: usize, i0: usize, nb: usize, vr: &V, fl: &[u8], vs: &[f32]) -> Option<usize> {
        if nb != KB {
            return None;
        }
        let all_one = |n: usize| fl[i0 * KB..(i0 + n) * KB].iter().all(|&x| x == 1);
        if i0 + STEADY_Q <= nq && all_one(STEADY_Q) {
            accumulate_steady_avx2::<STEADY_Q, R, V>(acc, hv, i0, vr, vs);
            Some(STEADY_Q)
        } else if i0 + 4 <= nq && all_one(4) {
            accumulate_steady_avx2::<4, R, V>(acc, hv, i0, vr, vs);
            Some(4)
        } else {
            None
        }
    }

    /// `accumulate_4` with ymm: queries i0..i0 + 4, 32 lanes at a time (16 where hv is not a
    /// multiple of 32), each step through the f16 accumulator in memory (as
    /// `accumulate_steady_avx2`); in the steady state (a whole block, every flag 1) six
    /// queries at once when there are six. Returns the queries done.
    #[inline(always)]
    unsafe fn accumulate_4_avx2<const R: bool, V: Fn(usize, usize) -> __m256>(acc: &mut [u16], hv: usize, nq: usize, i0: usize, nb: usize, vr: &V, fl: &[u8], ms: &[f32], vs: &[f32]) -> usize {
        // the four queries' flags read below (a mis-sized buffer panics here, not past it)
        assert!(fl.len() >= (i0 + 4) * KB && ms.len() >= nq * KB && vs.len() >= nq * KB);
        if let Some(done) = steady_avx2::<R, V>(acc, hv, nq, i0, nb, vr, fl, vs) {
            return done;
        }
        #[inline(always)]
        unsafe fn run<const U: usize, const R: bool, V: Fn(usize, usize) -> __m256>(acc: &mut [u16], hv: usize, nq: usize, i0: usize, nb: usize, vr: &V, fl: &[u8], ms: &[f32], vs: &[f32]) {
            let mut c = 0;
            while c < hv {
                for kk in 0..nb {
                    let mut v = [_mm256_setzero_ps(); U];
                    for (u, vu) in v.iter_mut().enumerate() {
                        *vu = vr(kk, c + 8 * u);
                    }
                    for qi in 0..4 {
                        if i0 + qi >= nq {
                            break;
                        }
                        let f = (i0 + qi) * KB + kk;
                        let flag = *fl.get_unchecked(f);
                        if flag == 0 {
                            continue;
                        }
                        let pa = acc.as_mut_ptr().add((i0 + qi) * hv + c);
                        if flag == 2 {
                            let vm = _mm256_set1_ps(*ms.get_unchecked(f));
                            for u in 0..U {
                                let pu = pa.add(8 * u);
                                st8::<R>(pu, _mm256_mul_ps(ld8(pu), vm));
                            }
                        }
                        let va = _mm256_set1_ps(*vs.get_unchecked(f));
                        for (u, vu) in v.iter().enumerate() {
                            let pu = pa.add(8 * u);
                            st8::<R>(pu, _mm256_fmadd_ps(*vu, va, ld8(pu)));
                        }
                    }
                }
                c += 8 * U;
            }
        }
        if hv % 32 == 0 {
            run::<4, R, V>(acc, hv, nq, i0, nb, vr, fl, ms, vs);
        } else {
            run::<2, R, V>(acc, hv, nq, i0, nb, vr, fl, ms, vs);
        }
        4
    }

    /// Queries per steady-state accumulation step of the AVX2 blocked kernel.
    pub(super) const STEADY_Q: usize = 6;

    /// `run_avx512_blocked` with AVX2 (+ FMA, F16C) only: the block's K and V rows converted
    /// once, the block's scores per group of queries (`scores_group_avx2`), per query its
    /// online-softmax steps in key order (a whole block below the running max: the 8 exps by
    /// `exp8_avx2`, the group's queries side by side), then the V accumulation four queries
    /// at a time, six in the steady state (`accumulate_4_avx2`). hk % 32 == 0, hv % 16 ==
    /// 0; scratch sized by the caller (kf, vf: KB rows; ms, vs: nq * KB; fl: `fl_rows(nq)`
    /// times KB, zeroed).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn run_avx2_blocked<const R: bool>(p: &Pass, qb: &[f32], ranges: &[(usize, usize)], acc: &mut [u16], m: &mut [f32], ssum: &mut [f32], scr: &mut Scratch) {
        #[inline(always)]
        unsafe fn below(sv: __m256, mv: __m256) -> bool {
            _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_GT_OQ>(sv, mv)) == 0
        }
        blocked_body!(p, qb, ranges, acc, m, ssum, scr, to_f32_avx2, scores_group_avx2, group_q_avx2(p.hd_k), false, true, below, exp8_avx2, accumulate_4_avx2::<R, _>, staged8, direct8)
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    #[test]
    fn vector_expf_is_the_c_library_expf_bit_for_bit() {
        // every 61st float in [-104, 0] (~18M) and the edge cases, with the kernel set's
        // vector exp (AVX-512 or AVX2); on a CPU without AVX2 + FMA it is never used (and
        // vexp_matches says so)
        if !crate::quant::table::kernels().avx2_math {
            assert!(!super::vexp_matches(61));
            return;
        }
        assert!(super::vexp_matches(61));
        assert!(super::vexp_ok());
    }

    #[test]
    #[ignore = "every float in [-104, 0]: ~1.1e9 exps (run with --ignored)"]
    fn vector_expf_is_the_c_library_expf_on_every_float() {
        if crate::quant::table::kernels().avx2_math {
            assert!(super::vexp_matches(1));
        }
    }
}
