//! Attention of a micro-batch's queries over the KV cache: causal + sliding-window (or
//! chunked) mask
//! by absolute position, GQA, optional logit softcap, threads over (token, head) items or,
//! for the F16 cache, over passes of several queries (`f16_passes`, `attention_f16.rs`).
//!
//! Each query sees the cells of its (first) sequence with pos <= its own position (and,
//! on sliding-window layers, pos > its position - n_swa: llama.cpp's `is_masked_swa`
//! masks when p1 - p0 >= n_swa). The keys come sorted by position (`KvCache::keys_of`)
//! and are reduced in that order, so the result depends only on the sequence's keys,
//! never on the cells they landed in, the micro-batch size, other sequences or the
//! thread count: the basis of pyllama's determinism guarantee.
//!
//! Numerics. With the default F16 K and V, the kernel is llama.cpp's CPU flash attention
//! "one_chunk" kernel (ggml-cpu ops.cpp), which llama.cpp runs for every token-generation
//! step over fewer than 512 cells and every micro-batch of fewer than 64 queries: q
//! rounded to f16, q.k over f16,
//! an online softmax, and the V accumulator kept in f16 (`ggml_vec_mad_f16`, one rounding
//! per key). Reproducing it keeps pyllama's logits within float noise of llama.cpp's on
//! real models, where a plain f32 softmax drifts by ~0.2 logits on Gemma 3 (checked
//! against llama-eval-callback: kqv_out-0 then matches to every printed digit). pyllama
//! uses it for every micro-batch size (llama.cpp switches to an f32 tiled kernel for
//! 64 queries or more), which is what keeps results independent of n_ubatch. It runs in passes
//! of several queries (the GQA heads of a KV head, and in prefill a run of tokens) that
//! share each K and V row's conversion, each query with its own one-query arithmetic
//! (`attention_f16.rs`), so the pass a query lands in never changes its bits. A query that
//! sees more than `KV_CHUNK` (2048) keys runs that kernel over each chunk of 2048 of its keys
//! and folds the chunks in order, as llama.cpp's split-KV decode kernel folds its per-thread
//! chunks (which it takes from 512 cells up); pyllama's chunks are fixed by the query's keys,
//! not by the thread count, so a decode step can spread one head's keys over the threads and
//! the bits still do not depend on them. Under PYLLAMA_ORDER=llamacpp there are no chunks.
//! Every other K/V
//! type pair (f32, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl, mixed) takes the same
//! one_chunk kernel in its general form (`one_chunk_head`): q converted to the K type's
//! vec_dot type, q.k through that type's vec_dot, V dequantized and accumulated in f32
//! (or in f16 for an F16 V), as llama.cpp does for those types at every batch size.
//!
//! Shapes: q [n_tokens, n_head * hd_k], out [n_tokens, n_head * hd_v].

use crate::ggml_type::GgmlType;
use crate::kv_cache::KvCache;
use crate::ops::vec::{self, axpy_f32, dot_f16_ggml, mad_f16_acc, scale_f16_acc, NO_SCALE};
use crate::quant;
use crate::threadpool::ThreadPool;

pub struct AttnParams<'a> {
    pub il: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub hd_k: usize,
    pub hd_v: usize,
    /// Multiplies q.k (1/sqrt(hd_k), or 1 when q is pre-scaled).
    pub scale: f32,
    /// tanh softcap of the scores (0 = off).
    pub softcap: f32,
    /// Sliding window (0 = none).
    pub n_swa: usize,
    /// The window is llama.cpp's LLAMA_SWA_TYPE_CHUNKED: a query at pos sees the keys at
    /// positions >= (pos / n_swa) * n_swa only (llama4).
    pub chunked: bool,
    /// Per-head attention sinks [n_head] (gpt-oss): a logit per head that joins the softmax
    /// without a value (llama.cpp's flash-attention kernels add it after the keys; its
    /// soft_max folds it into the max and the sum).
    pub sinks: Option<&'a [f32]>,
}

impl AttnParams<'_> {
    /// Layer `il` with `n_head` query heads over `n_head_kv` KV heads, K and V of head dim
    /// `hd`, scale 1 / sqrt(hd): causal, no window, softcap or sinks (benches and tests set
    /// those with struct update syntax).
    pub fn causal(il: usize, n_head: usize, n_head_kv: usize, hd: usize) -> AttnParams<'static> {
        AttnParams {
            il,
            n_head,
            n_head_kv,
            hd_k: hd,
            hd_v: hd,
            scale: 1.0 / (hd as f32).sqrt(),
            softcap: 0.0,
            n_swa: 0,
            chunked: false,
            sinks: None,
        }
    }
}

/// The sink correction of llama.cpp's flash-attention kernels (after the last key, on the
/// f32 accumulator `o`): the sink logit `s` joins max `m` and sum `ssum`; returns the new sum.
fn sink_correct(o: &mut [f32], m: f32, ssum: f32, s: f32) -> f32 {
    if s > m {
        let ms = (m - s).exp();
        for v in o.iter_mut() {
            *v *= ms; // ggml_vec_scale_f32
        }
        crate::ops::vec::fmaf(ssum, ms, 1.0) // S = S*ms + vs, as GCC contracts it
    } else {
        ssum + (s - m).exp()
    }
}

/// Per-token inputs: position, stream and the range of that token's sequence's key list
/// in `keys` ((pos, cell) sorted).
pub struct AttnInputs<'a> {
    pub pos: &'a [i32],
    pub stream: &'a [u32],
    pub key_range: &'a [(u32, u32)],
    pub keys: &'a [(i32, u32)],
}

/// Floats of per-thread scratch `attention` needs.
pub fn scratch_per_thread(n_kv_max: usize, hd_k: usize, hd_v: usize) -> usize {
    n_kv_max + hd_k + hd_v + hd_k.max(hd_v) + 32
}

fn as_u16(b: &[u8]) -> Option<&[u16]> {
    // SAFETY: u16 has no invalid bit patterns; align_to only yields the aligned middle.
    let (pre, mid, post) = unsafe { b.align_to::<u16>() };
    if pre.is_empty() && post.is_empty() {
        Some(mid)
    } else {
        None
    }
}

/// A buffer's pointer shared by a parallel region whose threads write disjoint entries (the
/// region ends before the buffer is read).
struct SendPtr<T>(*mut T);
unsafe impl<T> Sync for SendPtr<T> {}
unsafe impl<T> Send for SendPtr<T> {}
impl<T> SendPtr<T> {
    #[inline]
    fn get(&self) -> *mut T {
        self.0
    }
}

#[allow(clippy::too_many_arguments)]
pub fn attention(
    pool: &ThreadPool,
    kv: &KvCache,
    p: &AttnParams,
    inp: &AttnInputs,
    q: &[f32],
    out: &mut [f32],
    scratch: &mut [f32],
    scratch_stride: usize,
) {
    let n_tokens = inp.pos.len();
    let n_items = n_tokens * p.n_head;
    let qw = p.n_head * p.hd_k;
    let ow = p.n_head * p.hd_v;
    assert!(q.len() >= n_tokens * qw && out.len() >= n_tokens * ow);
    assert!(scratch.len() >= scratch_stride * pool.n_threads());
    let out_ptr = SendPtr(out.as_mut_ptr());
    let group = p.n_head / p.n_head_kv;
    let (tk, tv) = (kv.type_k, kv.type_v);
    let koff = |g: usize| tk.row_size(g * p.hd_k).unwrap_or(0);
    let voff = |g: usize| tv.row_size(g * p.hd_v).unwrap_or(0);
    let kbytes = tk.row_size(p.hd_k).unwrap_or(0);
    let vbytes = tv.row_size(p.hd_v).unwrap_or(0);
    // ggml folds the softcap into the scale: s = c * tanh(q.k * scale / c)
    let kscale = if p.softcap != 0.0 { p.scale / p.softcap } else { p.scale };
    let aligned = |b: &[u8]| as_u16(b).is_some();
    let f16_kernel = kv.flash_attn
        && tk == GgmlType::F16
        && tv == GgmlType::F16
        && aligned(&kv.k[p.il][..kv.k[p.il].len().min(2)])
        && aligned(&kv.v[p.il][..kv.v[p.il].len().min(2)]);

    // Visible keys of token t: sorted by position, those with pos <= t's position (and
    // inside the sliding window).
    let visible = |t: usize| -> &[(i32, u32)] {
        let pos = inp.pos[t];
        let (r0, r1) = inp.key_range[t];
        let keys = &inp.keys[r0 as usize..r1 as usize];
        let hi = keys.partition_point(|k| k.0 <= pos);
        let lo = if p.n_swa > 0 && p.chunked {
            let start = (pos as i64 / p.n_swa as i64) * p.n_swa as i64;
            keys[..hi].partition_point(|k| (k.0 as i64) < start)
        } else if p.n_swa > 0 {
            let w = p.n_swa as i64;
            keys[..hi].partition_point(|k| pos as i64 - k.0 as i64 >= w)
        } else {
            0
        };
        &keys[lo..hi]
    };

    // Under PYLLAMA_ORDER=llamacpp, micro-batches of 64 queries or more take llama.cpp's
    // tiled f32 kernel, as llama.cpp does (ops/attention_tiled.rs), in the per-item loop below.
    #[cfg(target_arch = "x86_64")]
    let tiled = f16_kernel && n_tokens >= 64 && p.softcap == 0.0 && p.sinks.is_none() && crate::quant::avx2::llamacpp_order();
    #[cfg(not(target_arch = "x86_64"))]
    let tiled = false;

    if f16_kernel && !tiled {
        // chunked long ranges, except under PYLLAMA_ORDER=llamacpp (its one-chunk bits)
        #[cfg(target_arch = "x86_64")]
        let kv_chunk = if crate::quant::avx2::llamacpp_order() { usize::MAX } else { KV_CHUNK };
        #[cfg(not(target_arch = "x86_64"))]
        let kv_chunk = KV_CHUNK;
        f16_passes(pool, kv, p, inp, q, out, kscale, f16_pass_queries(p.hd_k.max(p.hd_v)), kv_chunk);
        return;
    }

    if !tiled {
        // a quantized K and V: the one-query kernel in passes of several queries
        let quantized = crate::kv_cache::is_quantized(tk) && crate::kv_cache::is_quantized(tv);
        if quantized && quant_passes(pool, kv, p, inp, q, out, kscale, f16_pass_queries(p.hd_k.max(p.hd_v))) {
            return;
        }
        // flash attention off: llama.cpp's mul_mat / soft_max / mul_mat in passes of queries
        if !kv.flash_attn && !crate::kv_cache::is_quantized(tv) && nonfa_passes(pool, kv, p, inp, q, out) {
            return;
        }
        one_chunk_any(pool, kv, p, inp, q, out, &visible);
        return;
    }

    pool.run(&|ith, nth| {
        if ith >= n_items {
            return;
        }
        // strided items, as in the F16 kernel above (balanced causal work)
        for item in (ith..n_items).step_by(nth) {
            let t = item / p.n_head;
            let h = item % p.n_head;
            let g = h / group;
            let qh = &q[t * qw + h * p.hd_k..t * qw + (h + 1) * p.hd_k];
            let (ko, vo) = (koff(g), voff(g));
            // SAFETY: each item owns its output head slice; items never overlap.
            let o = unsafe { std::slice::from_raw_parts_mut(out_ptr.get().add(t * ow + h * p.hd_v), p.hd_v) };
            let stream = inp.stream[t] as usize;
            let vis = visible(t);
            o.fill(0.0);
            if vis.is_empty() {
                continue;
            }
            let k_of = |cell: u32| as_u16(&kv.k_row(p.il, stream, cell as usize)[ko..ko + kbytes]).unwrap_or(&[]);
            let v_of = |cell: u32| as_u16(&kv.v_row(p.il, stream, cell as usize)[vo..vo + vbytes]).unwrap_or(&[]);
            if !crate::ops::attention_tiled::attend(qh, vis, &k_of, &v_of, kscale, o) {
                one_chunk_head(kv, p, qh, stream, h, vis, o);
            }
        }
    });
}

/// The visible keys of a query at `pos` as a range of `keys` (sorted by position): those
/// with pos <= its own, and inside the sliding window or chunk.
fn visible_range(p: &AttnParams, keys: &[(i32, u32)], pos: i32) -> (usize, usize) {
    let hi = keys.partition_point(|k| k.0 <= pos);
    let lo = if p.n_swa > 0 && p.chunked {
        let start = (pos as i64 / p.n_swa as i64) * p.n_swa as i64;
        keys[..hi].partition_point(|k| (k.0 as i64) < start)
    } else if p.n_swa > 0 {
        let w = p.n_swa as i64;
        keys[..hi].partition_point(|k| pos as i64 - k.0 as i64 >= w)
    } else {
        0
    };
    (lo, hi)
}

/// Most queries (tokens x heads of one GQA group) one F16 pass takes in prefill: their q
/// rows and f16 accumulators stay in L1 while each key's rows are converted once for all
/// (8192 / hd: 128 queries of head dim 64, 32 of 256). With the blocked kernels, against
/// 2048 / hd (`--bench attention`, one thread, alternated): Gemma 3's heads 5-7% faster at
/// depth 0 and 4096, SmolLM2's 1-3%; 4096 / hd was between the two (768 / hd was ~10%
/// slower than 2048 / hd with the per-key kernel).
fn f16_pass_queries(hd: usize) -> usize {
    (8192 / hd.max(1)).max(1)
}

/// Keys per chunk of a long visible range (see `f16_passes`).
pub(crate) const KV_CHUNK: usize = 2048;

/// Decode steps split by chunk items (tests check that they ran).
#[cfg(test)]
static CHUNK_SPLITS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Chunk `k` of the visible key range `r`: chunks of `c` keys from its first key.
fn chunk_of(r: (usize, usize), k: usize, c: usize) -> (usize, usize) {
    let a = r.0.saturating_add(k.saturating_mul(c)).min(r.1);
    (a, a.saturating_add(c).min(r.1))
}

/// How many chunks of `c` keys the visible range `r` has (one when it is empty).
fn n_chunks(r: (usize, usize), c: usize) -> usize {
    (r.1 - r.0).div_ceil(c).max(1)
}

/// Folds one chunk's one_chunk state (its f16 V accumulator `acc`, max `mc`, sum `sc`) into
/// a query's running state (`o` f32, `m`, `s`), chunk by chunk in key order: the first chunk
/// is taken as it is (so a range of one chunk gives the one-chunk kernel's bits), a later
/// one as llama.cpp's split-KV reduction does (`ggml_flash_attn_ext_reduce_partials`:
/// M = max, both sides scaled by exp(m - M), a chunk with S == 0 skipped).
fn merge_chunk(o: &mut [f32], m: &mut f32, s: &mut f32, first: bool, acc: &[u16], mc: f32, sc: f32) {
    let acc = half::slice::HalfBitsSliceExt::reinterpret_cast::<half::f16>(acc);
    if first {
        // f16 to f32 is exact; the slice conversion is F16C 8 at a time
        half::slice::HalfFloatSliceExt::convert_to_f32_slice(acc, o);
        (*m, *s) = (mc, sc);
        return;
    }
    if sc == 0.0 {
        return;
    }
    let mn = m.max(mc);
    let (so, sn) = ((*m - mn).exp(), (mc - mn).exp());
    for (d, a) in o.iter_mut().zip(acc) {
        *d = *d * so + a.to_f32() * sn;
    }
    *s = *s * so + sc * sn;
    *m = mn;
}

/// A query's output from its merged state: the sink (if any) joins, then o /= S.
fn finish(o: &mut [f32], m: f32, s: f32, sink: Option<f32>) {
    let s = match sink {
        Some(sk) => sink_correct(o, m, s, sk),
        None => s,
    };
    let inv = if s == 0.0 { 0.0 } else { 1.0 / s };
    for d in o.iter_mut() {
        *d *= inv;
    }
}

/// llama.cpp's one_chunk flash attention for F16 K/V (see the module doc) in passes of
/// several queries over their keys (`attention_f16`): each pass is the heads of one GQA
/// group for a run of consecutive tokens that read the same key list (same stream and
/// sequence), so each K and V row is converted from f16 once per pass instead of once per
/// query. Per query the operations and their order are exactly those of the one-query
/// kernel, whichever queries share its pass: results do not depend on the tile size, the
/// micro-batch or the thread count.
///
/// Long ranges. A query that sees more than `kv_chunk` keys runs the one-query kernel over
/// each chunk of `kv_chunk` keys from its first visible key (fresh state per chunk) and
/// folds the chunks in key order (`merge_chunk`): llama.cpp's split-KV decode, with chunks
/// fixed by the query's own keys instead of by the thread count, so the bits still depend on
/// nothing but the sequence. A range of at most `kv_chunk` keys is one chunk: the one-chunk
/// kernel's bits, as llama.cpp's. (`attention` passes `KV_CHUNK`, or no chunking under
/// PYLLAMA_ORDER=llamacpp.)
///
/// Work split, three ways:
/// - passes: with enough passes for every thread (prefill, many sequences), passes of up to
///   `max_q` queries (whole groups, runs of tokens), each thread claiming the next pass from
///   a shared counter, the last tokens' passes first (a causal batch's later tokens see more
///   keys: contiguous ranges left the first thread idle for most of the region, and a fixed
///   round-robin gave one thread the later pass of every pair);
/// - chunks: a decode step (2+ threads) whose queries see more than one chunk, where a cost
///   model (a key's K/V conversion and each query's work on it one unit each) says the
///   (token, group, chunk) items end sooner than the slots below: threads claim the items
///   one at a time, each item's partial state kept apart, and the chunks are folded after
///   the region (a 4097-key SmolLM2 step on 2 threads: 9 items of 3 heads; each K and V row
///   read once, where cutting the 9 heads in two read one group's rows twice and ran passes
///   of 1-2 heads);
/// - slots: otherwise (a short decode step: SmolLM2 has 3 groups of 3 heads, Gemma 3 one
///   group of 4, for 2+ threads) each thread takes a contiguous, even share of the step's
///   (token, head) slots, cut at group and token borders: the heads a thread does of one
///   group share one pass over the group's K and V rows, and the threads stay balanced.
#[allow(clippy::too_many_arguments)]
fn f16_passes(pool: &ThreadPool, kv: &KvCache, p: &AttnParams, inp: &AttnInputs, q: &[f32], out: &mut [f32], kscale: f32, max_q: usize, kv_chunk: usize) {
    use crate::ops::attention_f16 as f16k;
    let n_tokens = inp.pos.len();
    let (hk, hv) = (p.hd_k, p.hd_v);
    let group = p.n_head / p.n_head_kv;
    let qw = p.n_head * hk;
    let ow = p.n_head * hv;
    let kc = kv_chunk.max(1);
    let out_ptr = SendPtr(out.as_mut_ptr());
    let kall = as_u16(&kv.k[p.il]).unwrap_or(&[]);
    let vall = as_u16(&kv.v[p.il]).unwrap_or(&[]);
    let (k_stride, v_stride) = (kv.row_k[p.il] / 2, kv.row_v[p.il] / 2);
    let nth = pool.n_threads();
    let passes = Passes::new(p, inp, max_q, nth);
    let (vis, whole_groups) = (&passes.vis, passes.whole_groups);
    // the chunk items (token, group, chunk) of a decode step long enough to split by chunks
    let nk_max = vis.iter().map(|&r| n_chunks(r, kc)).max().unwrap_or(1);
    let mut chunk_items: Vec<(usize, usize, usize)> = Vec::new();
    if !whole_groups && nth > 1 && nk_max > 1 {
        // chunk-major: the short last chunks are claimed last
        for k in 0..nk_max {
            for (t, &r) in vis.iter().enumerate() {
                if k < n_chunks(r, kc) {
                    chunk_items.extend((0..p.n_head_kv).map(|g| (t, g, k)));
                }
            }
        }
        // the split that ends first, counting a key's K and V conversion and each query's
        // work on it as one unit each: the slots' passes, against the items given in order
        // to the thread that is free first
        let len = |r: (usize, usize)| r.1 - r.0;
        let slots_span = (0..nth)
            .map(|ith| {
                let mine = crate::threadpool::split_range(n_tokens * p.n_head, ith, nth);
                let (mut slot, mut cost) = (mine.start, 0);
                while slot < mine.end {
                    let sub = (group - slot % p.n_head % group).min(mine.end - slot);
                    cost += len(vis[slot / p.n_head]) * (1 + sub);
                    slot += sub;
                }
                cost
            })
            .max()
            .unwrap_or(0);
        let mut load = vec![0usize; nth];
        for &(t, _, k) in &chunk_items {
            let free = (0..nth).min_by_key(|&i| load[i]).unwrap_or(0);
            load[free] += len(chunk_of(vis[t], k, kc)) * (1 + group);
        }
        if load.iter().max().copied().unwrap_or(0) >= slots_span {
            chunk_items.clear();
        }
    }
    let by_chunks = !chunk_items.is_empty();
    #[cfg(test)]
    if by_chunks {
        CHUNK_SPLITS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    let n_slots = n_tokens * p.n_head;
    // the chunk items' partial states: per (slot, chunk) the f16 accumulator, max and sum
    let mut part_acc: Vec<u16> = vec![0; if by_chunks { n_slots * nk_max * hv } else { 0 }];
    let mut part_ms: Vec<f32> = vec![0.0; if by_chunks { n_slots * nk_max * 2 } else { 0 }];
    let part_acc_ptr = SendPtr(part_acc.as_mut_ptr());
    let part_ms_ptr = SendPtr(part_ms.as_mut_ptr());
    // prefill passes and chunk items are claimed one at a time (a thread slowed by another
    // process, or given the heavier passes, does fewer); which thread runs a pass does not
    // change its bits
    pool.run(&|ith, nth| F16_LOCAL.with(|local| {
        let mut local = local.borrow_mut();
        let F16Local { qb, acc, m, ssum, ranges, rk, fm, fs, scr } = &mut *local;
        let mine = if by_chunks { 0..0 } else { passes.share(ith, nth) };
        let mut slot = mine.start;
        loop {
            // this pass: tokens t0..t1, heads h0..h0 + sub of one group (chunk k only, for a chunk item)
            let (t0, t1, h0, sub, chunk) = if by_chunks {
                let claimed = passes.claim();
                if claimed >= chunk_items.len() {
                    break;
                }
                let (t, g, k) = chunk_items[claimed];
                (t, t + 1, g * group, group, Some(k))
            } else {
                match passes.next_pass(&mut slot, &mine) {
                    Some((t0, t1, h0, sub)) => (t0, t1, h0, sub, None),
                    None => break,
                }
            };
            let g = h0 / group;
            let keys = token_keys(inp, t0);
            let stream = inp.stream[t0] as usize;
            let nq = (t1 - t0) * sub;
            qb.resize(nq * hk, 0.0);
            ranges.clear();
            for t in t0..t1 {
                let qt = &q[t * qw + h0 * hk..t * qw + (h0 + sub) * hk];
                crate::ops::vec::round_f16(&mut qb[(t - t0) * sub * hk..(t - t0 + 1) * sub * hk], qt);
                ranges.extend(std::iter::repeat_n(vis[t], sub));
            }
            let pass = f16k::Pass {
                rows: f16k::Rows {
                    k: kall,
                    v: vall,
                    k_stride,
                    v_stride,
                    k_off: stream * kv.size * k_stride + g * hk,
                    v_off: stream * kv.size * v_stride + g * hv,
                },
                keys,
                hd_k: hk,
                hd_v: hv,
                kscale,
                softcap: p.softcap,
            };
            // one chunk of every query of the pass, from fresh state
            let mut run_chunk = |k: usize, rk: &mut Vec<(usize, usize)>, acc: &mut f16k::Aligned<u16>, m: &mut Vec<f32>, ssum: &mut Vec<f32>| {
                rk.clear();
                rk.extend(ranges.iter().map(|&r| chunk_of(r, k, kc)));
                acc.clear();
                acc.resize(nq * hv, 0);
                m.clear();
                m.resize(nq, f32::NEG_INFINITY);
                ssum.clear();
                ssum.resize(nq, 0.0);
                f16k::run(&pass, qb, rk, acc, m, ssum, scr);
            };
            if let Some(k) = chunk {
                run_chunk(k, rk, acc, m, ssum);
                for j in 0..sub {
                    let s = t0 * p.n_head + h0 + j;
                    // SAFETY: chunk k of slot s belongs to this item only; the buffers hold
                    // n_slots * nk_max entries.
                    unsafe {
                        let pa = std::slice::from_raw_parts_mut(part_acc_ptr.get().add((s * nk_max + k) * hv), hv);
                        pa.copy_from_slice(&acc[j * hv..(j + 1) * hv]);
                        *part_ms_ptr.get().add((s * nk_max + k) * 2) = m[j];
                        *part_ms_ptr.get().add((s * nk_max + k) * 2 + 1) = ssum[j];
                    }
                }
                continue;
            }
            // query i's output: head h0 + i % sub of token t0 + i / sub
            // SAFETY: heads h0..h0 + sub of tokens t0..t1 belong to this pass only; one
            // query's slice is borrowed at a time.
            let out_of = |i: usize| unsafe { std::slice::from_raw_parts_mut(out_ptr.get().add((t0 + i / sub) * ow + (h0 + i % sub) * hv), hv) };
            fm.clear();
            fm.resize(nq, 0.0);
            fs.clear();
            fs.resize(nq, 0.0);
            let nk = ranges.iter().map(|&r| n_chunks(r, kc)).max().unwrap_or(1);
            for k in 0..nk {
                run_chunk(k, rk, acc, m, ssum);
                for i in 0..nq {
                    if ranges[i].0 < ranges[i].1 && (k == 0 || rk[i].0 < rk[i].1) {
                        merge_chunk(out_of(i), &mut fm[i], &mut fs[i], k == 0, &acc[i * hv..(i + 1) * hv], m[i], ssum[i]);
                    }
                }
            }
            for i in 0..nq {
                if ranges[i].0 == ranges[i].1 {
                    out_of(i).fill(0.0);
                } else {
                    finish(out_of(i), fm[i], fs[i], p.sinks.map(|sk| sk[h0 + i % sub]));
                }
            }
        }
    }));
    if by_chunks {
        // fold each slot's chunks in key order
        for s in 0..n_slots {
            let (t, h) = (s / p.n_head, s % p.n_head);
            let o = &mut out[t * ow + h * hv..t * ow + (h + 1) * hv];
            if vis[t].0 == vis[t].1 {
                o.fill(0.0);
                continue;
            }
            let (mut m, mut sum) = (0f32, 0f32);
            for k in 0..n_chunks(vis[t], kc) {
                let e = s * nk_max + k;
                merge_chunk(o, &mut m, &mut sum, k == 0, &part_acc[e * hv..(e + 1) * hv], part_ms[e * 2], part_ms[e * 2 + 1]);
            }
            finish(o, m, sum, p.sinks.map(|sk| sk[h]));
        }
    }
}

/// One thread's buffers of `f16_passes`' region, kept across calls: a decode step runs an
/// attention region per layer, and each thread allocated and freed these (and the Scratch's
/// own) in every one (perf, SmolLM2 tg128 on one thread: malloc / free 1.1% of the samples,
/// 0.1% with them kept). Every buffer is cleared or sized, and written before it is read, in
/// each pass, as it already was across the passes of one region.
#[derive(Default)]
struct F16Local {
    qb: crate::ops::attention_f16::Aligned<f32>,
    acc: crate::ops::attention_f16::Aligned<u16>,
    m: Vec<f32>,
    ssum: Vec<f32>,
    ranges: Vec<(usize, usize)>,
    rk: Vec<(usize, usize)>,
    /// per query of a pass: the running max and sum of its folded chunks
    fm: Vec<f32>,
    fs: Vec<f32>,
    scr: crate::ops::attention_f16::Scratch,
}

thread_local! {
    static F16_LOCAL: std::cell::RefCell<F16Local> = std::cell::RefCell::new(F16Local::default());
}

/// Token t's key list (its sequence's, sorted by position).
fn token_keys<'a>(inp: &AttnInputs<'a>, t: usize) -> &'a [(i32, u32)] {
    let (r0, r1) = inp.key_range[t];
    &inp.keys[r0 as usize..r1 as usize]
}

/// How a micro-batch's queries go to the threads in passes (`f16_passes`, `quant_passes`):
/// each token's visible key range; with enough passes for every thread (prefill, many
/// sequences: `whole_groups`) runs of tokens that read the same key list (same stream and
/// sequence), at most max_q / group tokens each and at least 4 passes per thread, times the
/// KV heads, claimed one at a time from a shared counter, the last tokens' first (a causal
/// batch's later tokens see more keys); otherwise (a decode step) each thread's even share
/// of the (token, head) slots, cut at group and token borders.
struct Passes {
    vis: Vec<(usize, usize)>,
    whole_groups: bool,
    tiles: Vec<(usize, usize)>,
    n_head: usize,
    n_head_kv: usize,
    /// the claim counter (the tiles' passes; `f16_passes`'s chunk items take it instead)
    next: std::sync::atomic::AtomicUsize,
}

impl Passes {
    fn new(p: &AttnParams, inp: &AttnInputs, max_q: usize, nth: usize) -> Passes {
        let n_tokens = inp.pos.len();
        let vis = (0..n_tokens).map(|t| visible_range(p, token_keys(inp, t), inp.pos[t])).collect();
        let whole_groups = n_tokens * p.n_head_kv >= 4 * nth;
        let mut tiles = Vec::new();
        if whole_groups {
            let tile = (max_q / (p.n_head / p.n_head_kv)).max(1).min((n_tokens * p.n_head_kv / (4 * nth)).max(1));
            let mut t0 = 0;
            while t0 < n_tokens {
                let mut t1 = t0 + 1;
                while t1 < n_tokens && t1 - t0 < tile && inp.stream[t1] == inp.stream[t0] && inp.key_range[t1] == inp.key_range[t0] {
                    t1 += 1;
                }
                tiles.push((t0, t1));
                t0 = t1;
            }
        }
        Passes { vis, whole_groups, tiles, n_head: p.n_head, n_head_kv: p.n_head_kv, next: Default::default() }
    }

    /// The next value of the claim counter.
    fn claim(&self) -> usize {
        self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    }

    /// Thread ith's share of the slots (empty when the passes are claimed).
    fn share(&self, ith: usize, nth: usize) -> std::ops::Range<usize> {
        if self.whole_groups {
            0..0
        } else {
            crate::threadpool::split_range(self.vis.len() * self.n_head, ith, nth)
        }
    }

    /// A thread's next pass, (tokens t0..t1, heads h0..h0 + sub of one group), from the
    /// claimed tiles or from its share `mine` at slot cursor `slot`; None when done.
    fn next_pass(&self, slot: &mut usize, mine: &std::ops::Range<usize>) -> Option<(usize, usize, usize, usize)> {
        let group = self.n_head / self.n_head_kv;
        if self.whole_groups {
            let n_items = self.tiles.len() * self.n_head_kv;
            let claimed = self.claim();
            if claimed >= n_items {
                return None;
            }
            let it = n_items - 1 - claimed;
            let (t0, t1) = self.tiles[it / self.n_head_kv];
            return Some((t0, t1, it % self.n_head_kv * group, group));
        }
        if *slot >= mine.end {
            return None;
        }
        let (t, h) = (*slot / self.n_head, *slot % self.n_head);
        // up to the end of h's group, of the token, or of this thread's share
        let sub = (group - h % group).min(mine.end - *slot);
        *slot += sub;
        Some((t, t + 1, h, sub))
    }
}

/// Keys per block of `quant_passes` (one vector exp's lanes).
const QKB: usize = 8;

/// K's vec_dot against q in its vec_dot type, as llama.cpp's one_chunk kernel takes it
/// (`one_chunk_state`, `quant_passes`).
fn k_vec_dot(tk: GgmlType) -> Option<quant::VecDotFn> {
    match tk {
        // ggml's AVX2 IQ4_NL kernel keeps two accumulators (see the function)
        GgmlType::IQ4_NL => Some(quant::legacy::vec_dot_iq4_nl_q8_0_x86 as quant::VecDotFn),
        _ => quant::vec_dot_fn(tk, quant::kernel_set()),
    }
}

/// `one_chunk_state` for a quantized K and V (K through its vec_dot against q in K's
/// vec_dot type, V dequantized to f32 and accumulated in f32: llama.cpp's one_chunk kernel,
/// which it runs for every micro-batch of a quantized cache) in passes of several queries,
/// as `f16_passes`: each pass is heads of one GQA group for a run of tokens that read the
/// same key list, so each V row is dequantized once per pass instead of once per query and
/// the rows are found once per key. Per query the operations and their order are exactly
/// `one_chunk_state`'s (the same vec_dot, exps, scale loop, `axpy_f32` and fused sum), so the
/// bits do not depend on the pass, the micro-batch or the threads; no chunks, as llama.cpp's
/// quantized-cache kernel has none. Work split as `f16_passes`'s passes and slots. Returns
/// false (nothing done) where K has no vec_dot or V no dequantizer in this kernel set.
#[allow(clippy::too_many_arguments)]
fn quant_passes(pool: &ThreadPool, kv: &KvCache, p: &AttnParams, inp: &AttnInputs, q: &[f32], out: &mut [f32], kscale: f32, max_q: usize) -> bool {
    let (tk, tv) = (kv.type_k, kv.type_v);
    let (Some(kdot), Some(dequant)) = (k_vec_dot(tk), quant::table::kernels().get(tv).dequant) else {
        return false;
    };
    let vdt = quant::vec_dot_type(tk);
    let (hk, hv) = (p.hd_k, p.hd_v);
    let (Some(qrow), Some(kbytes), Some(vbytes)) = (vdt.row_size(hk), tk.row_size(hk), tv.row_size(hv)) else {
        return false;
    };
    // K against several queries at once: the kernel table's tiled dots (every entry gives
    // the vec_dot's bits, quant/table.rs), where one_chunk_state takes the table's vec_dot
    // (not IQ4_NL's x86 order, not llama.cpp's small-batch orders)
    let tiled = quant::table::kernels().get(tk).tiled.filter(|_| tk != GgmlType::IQ4_NL && !quant::cpu::env().llamacpp_order);
    let group = p.n_head / p.n_head_kv;
    let (qw, ow) = (p.n_head * hk, p.n_head * hv);
    let (kall, vall) = (&kv.k[p.il][..], &kv.v[p.il][..]);
    let (row_k, row_v) = (kv.row_k[p.il], kv.row_v[p.il]);
    let passes = Passes::new(p, inp, max_q, pool.n_threads());
    let vis = &passes.vis;
    let out_ptr = SendPtr(out.as_mut_ptr());
    pool.run(&|ith, nth| {
        let (mut qq, mut ok, mut ranges, mut act): (Vec<u8>, Vec<bool>, Vec<(usize, usize)>, Vec<usize>) = Default::default();
        let (mut acc, mut m, mut ssum, mut v32): (Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>) = Default::default();
        // the block's scores (key-major) and its V rows in f32
        let mut sc: Vec<f32> = Default::default();
        let mut runs: Vec<(usize, usize, Option<quant::DotN>)> = Default::default();
        let mine = passes.share(ith, nth);
        let mut slot = mine.start;
        // this pass: tokens t0..t1, heads h0..h0 + sub of one group
        while let Some((t0, t1, h0, sub)) = passes.next_pass(&mut slot, &mine) {
            let g = h0 / group;
            let keys = token_keys(inp, t0);
            let stream = inp.stream[t0] as usize;
            let (kbase, vbase) = (stream * kv.size * row_k + tk.row_size(g * hk).unwrap_or(0), stream * kv.size * row_v + tv.row_size(g * hv).unwrap_or(0));
            let nq = (t1 - t0) * sub;
            qq.resize(nq * qrow, 0);
            ok.clear();
            ranges.clear();
            for t in t0..t1 {
                for j in 0..sub {
                    let i = (t - t0) * sub + j;
                    let qh = &q[t * qw + (h0 + j) * hk..t * qw + (h0 + j + 1) * hk];
                    // q_to_vec_dot(pq, Q_q, DK); a row that does not convert gives NaN, as one_chunk_state
                    ok.push(quant::quantize_row_cpu(vdt, qh, &mut qq[i * qrow..(i + 1) * qrow]).is_ok());
                    ranges.push(vis[t]);
                }
            }
            acc.clear();
            acc.resize(nq * hv, 0.0);
            m.clear();
            m.resize(nq, f32::NEG_INFINITY);
            ssum.clear();
            ssum.resize(nq, 0.0);
            let jlo = ranges.iter().map(|r| r.0).min().unwrap_or(0);
            let jhi = ranges.iter().map(|r| r.1).max().unwrap_or(0);
            // blocks of up to QKB keys over which the active queries stay the same (found
            // again only where a range starts or ends; a decode step's pass: once)
            let mut j0 = jlo;
            let mut change = jlo;
            while j0 < jhi {
                if j0 == change {
                    change = active_at(&ranges, &ok, j0, &mut act);
                    // the scores' calls: runs of consecutive active queries (a, count) through
                    // the tiled dots, else one query at a time by the vec_dot
                    runs.clear();
                    let mut a = 0;
                    while a < act.len() {
                        let Some(tl) = tiled else {
                            runs.push((a, 1, None));
                            a += 1;
                            continue;
                        };
                        let mut b = a + 1;
                        while b < act.len() && b - a < tl.width && act[b] == act[b - 1] + 1 {
                            b += 1;
                        }
                        let (nc, k) = match tl.cols[b - a] {
                            Some(k) => (b - a, k),
                            None => (1, tl.one()),
                        };
                        runs.push((a, nc, Some(k)));
                        a += nc;
                    }
                }
                let j1 = (j0 + QKB).min(jhi).min(change);
                let nb = j1 - j0;
                let na = act.len();
                if na == 0 {
                    j0 = j1;
                    continue;
                }
                // the scores (key kk, query a at kk * na + a): runs of consecutive queries
                // through the tiled dots; the V rows dequantized, each once for the pass
                sc.resize(nb * na, 0.0);
                v32.resize(nb * hv, 0.0);
                for kk in 0..nb {
                    let cell = keys[j0 + kk].1 as usize;
                    let kr = &kall[kbase + cell * row_k..][..kbytes];
                    let sk = &mut sc[kk * na..(kk + 1) * na];
                    for &(a, nc, k) in &runs {
                        match k {
                            // SAFETY: the table's kernels run on this CPU (its kernel set); kr
                            // holds one K row of hk values, qq nc rows of K's vec_dot type from
                            // act[a] (qrow bytes apart), sk nc values from a
                            Some(k) => unsafe { k(hk, kr.as_ptr(), qq[act[a] * qrow..].as_ptr(), qrow, std::ptr::null(), 0, sk[a..a + nc].as_mut_ptr()) },
                            None => sk[a] = kdot(hk, kr, &qq[act[a] * qrow..(act[a] + 1) * qrow]),
                        }
                    }
                    dequant(&vall[vbase + cell * row_v..][..vbytes], &mut v32[kk * hv..(kk + 1) * hv]);
                }
                // per query its softmax steps in key order: the exp arguments (a new max:
                // m_old - s), the block's exps at once, the sums; then its accumulator over
                // the block (scale where the max rose, then ggml_vec_mad_f32's fused step)
                for (a, &i) in act.iter().enumerate() {
                    let mut ex = [0f32; QKB];
                    let mut up = [false; QKB];
                    let mut mi = m[i];
                    for kk in 0..nb {
                        let mut s = sc[kk * na + a] * kscale;
                        if p.softcap != 0.0 {
                            s = p.softcap * s.tanh();
                        }
                        up[kk] = s > mi;
                        if up[kk] {
                            ex[kk] = mi - s;
                            mi = s;
                        } else {
                            ex[kk] = s - mi;
                        }
                    }
                    m[i] = mi;
                    // (lanes past the block's keys: computed, not used)
                    match crate::ops::attention_f16::vexp8(&ex) {
                        Some(e) => ex = e,
                        None => ex[..nb].iter_mut().for_each(|v| *v = v.exp()),
                    }
                    let (mut msk, mut vsk) = ([NO_SCALE; QKB], [1f32; QKB]);
                    let mut si = ssum[i];
                    for kk in 0..nb {
                        // GCC: fma(S, ms, vs); with ms = 1 that is S + vs exactly
                        if up[kk] {
                            msk[kk] = ex[kk];
                            si = vec::fmaf(si, ex[kk], 1.0);
                        } else {
                            vsk[kk] = ex[kk];
                            si += ex[kk];
                        }
                    }
                    ssum[i] = si;
                    vec::scale_axpy_f32_block(&mut acc[i * hv..(i + 1) * hv], &vsk[..nb], &msk[..nb], &v32);
                }
                j0 = j1;
            }
            for i in 0..nq {
                let (t, h) = (t0 + i / sub, h0 + i % sub);
                // SAFETY: heads h0..h0 + sub of tokens t0..t1 belong to this pass only
                let o = unsafe { std::slice::from_raw_parts_mut(out_ptr.get().add(t * ow + h * hv), hv) };
                if ranges[i].0 == ranges[i].1 {
                    o.fill(0.0);
                } else if !ok[i] {
                    o.fill(f32::NAN);
                } else {
                    o.copy_from_slice(&acc[i * hv..(i + 1) * hv]);
                    finish(o, m[i], ssum[i], p.sinks.map(|sk| sk[h]));
                }
            }
        }
    });
    true
}

/// Per-thread buffers of `one_chunk_head`.
struct HeadScratch {
    /// q converted to the K type's vec_dot_type (bytes), or rounded to f16 (as f32) for F16 K
    q_q: Vec<u8>,
    q16: Vec<f32>,
    /// the V accumulator: f32 (VKQ32) or f16 bits (VKQ16, for an F16 V)
    acc32: Vec<f32>,
    acc16: Vec<u16>,
    /// one V row as f32 (V32) and one F16 row copied to aligned memory
    v32: Vec<f32>,
    v16: Vec<u16>,
    k16: Vec<u16>,
}

impl HeadScratch {
    fn new(p: &AttnParams, tk: GgmlType) -> HeadScratch {
        let vdt = quant::vec_dot_type(tk);
        HeadScratch {
            q_q: vec![0u8; vdt.row_size(p.hd_k).unwrap_or(0)],
            q16: vec![0f32; p.hd_k],
            acc32: vec![0f32; p.hd_v],
            acc16: vec![0u16; p.hd_v],
            v32: vec![0f32; p.hd_v],
            v16: vec![0u16; p.hd_v],
            k16: vec![0u16; p.hd_k],
        }
    }
}

/// Raw f16 bits of `b` (little-endian), without copying when `b` is 2-aligned.
fn u16_of<'a>(b: &'a [u8], buf: &'a mut [u16]) -> &'a [u16] {
    match as_u16(b) {
        Some(x) => x,
        None => {
            for (d, c) in buf.iter_mut().zip(b.chunks_exact(2)) {
                *d = u16::from_le_bytes([c[0], c[1]]);
            }
            &buf[..b.len() / 2]
        }
    }
}

/// An F32 row (little-endian bytes) rounded to f16 bits (ggml_cast F32 -> F16: round to
/// nearest even).
fn f16_of_f32<'a>(b: &[u8], buf: &'a mut [u16]) -> &'a [u16] {
    for (d, c) in buf.iter_mut().zip(b.chunks_exact(4)) {
        *d = half::f16::from_f32(f32::from_le_bytes([c[0], c[1], c[2], c[3]])).to_bits();
    }
    &buf[..b.len() / 4]
}

/// llama.cpp's CPU flash attention for any K/V type pair, one query head at a time: the
/// `ggml_compute_forward_flash_attn_ext_f16_one_chunk` kernel, which llama.cpp runs for
/// every micro-batch when K or V is not F32/F16 (its tiled and split-KV kernels take only
/// F32/F16 caches). Per key, in the kernel's float order:
///   s = vec_dot_K(k, Q_q) * scale        (Q_q: q through the from_float of K's vec_dot_type)
///   s = softcap * tanh(s)                (when set)
///   new max: M = s, ms = exp(M_old - M), VKQ *= ms; else vs = exp(s - M)
///   VKQ += vs * V                        (F16 V: f16 accumulator, ggml_vec_mad_f16;
///                                         others: V dequantized to f32, ggml_vec_mad_f32)
///   S = S * ms + vs
/// and out = VKQ * (1 / S).
fn one_chunk_head(
    kv: &KvCache,
    p: &AttnParams,
    qh: &[f32],
    stream: usize,
    h: usize,
    vis: &[(i32, u32)],
    o: &mut [f32],
) {
    thread_local! {
        static SCR: std::cell::RefCell<Option<(usize, usize, GgmlType, HeadScratch)>> =
            const { std::cell::RefCell::new(None) };
    }
    SCR.with(|c| {
        let mut c = c.borrow_mut();
        let fresh = !matches!(&*c, Some((hk, hv, t, _)) if *hk == p.hd_k && *hv == p.hd_v && *t == kv.type_k);
        if fresh {
            *c = Some((p.hd_k, p.hd_v, kv.type_k, HeadScratch::new(p, kv.type_k)));
        }
        let scr = &mut c.as_mut().expect("set above").3;
        if let Some((m, ssum)) = one_chunk_state(kv, p, qh, stream, h, vis, o, scr) {
            finish(o, m, ssum, p.sinks.map(|sk| sk[h]));
        }
    });
}

/// `one_chunk_head` for a test reference: the one-query kernel's state after the keys
/// `vis` (o: the V accumulator as f32, unnormalized; max; sum), or None (o NaN) on a row
/// that does not convert.
#[cfg(test)]
fn one_chunk_head_state(kv: &KvCache, p: &AttnParams, qh: &[f32], stream: usize, h: usize, vis: &[(i32, u32)], o: &mut [f32]) -> Option<(f32, f32)> {
    let mut scr = HeadScratch::new(p, kv.type_k);
    one_chunk_state(kv, p, qh, stream, h, vis, o, &mut scr)
}

/// The one-query kernel over `vis`: leaves the V accumulator (as f32, unnormalized) in `o`
/// and returns the running max and sum; None (o NaN) when a row does not convert.
#[allow(clippy::too_many_arguments)]
fn one_chunk_state(
    kv: &KvCache,
    p: &AttnParams,
    qh: &[f32],
    stream: usize,
    h: usize,
    vis: &[(i32, u32)],
    o: &mut [f32],
    scr: &mut HeadScratch,
) -> Option<(f32, f32)> {
    let g = h / (p.n_head / p.n_head_kv);
    let (tk, tv) = (kv.type_k, kv.type_v);
    let (hk, hv) = (p.hd_k, p.hd_v);
    // llama.cpp casts an F32 K or V to F16 for its flash-attention kernel (build_attn_mha)
    let k_cast = kv.flash_attn && tk == GgmlType::F32;
    let v_cast = kv.flash_attn && tv == GgmlType::F32;
    let ko = tk.row_size(g * hk).unwrap_or(0);
    let vo = tv.row_size(g * hv).unwrap_or(0);
    let kbytes = tk.row_size(hk).unwrap_or(0);
    let vbytes = tv.row_size(hv).unwrap_or(0);
    let kscale = if p.softcap != 0.0 { p.scale / p.softcap } else { p.scale };
    let vdt = quant::vec_dot_type(tk);
    // q_to_vec_dot(pq, Q_q, DK)
    let k_f16 = tk == GgmlType::F16 || k_cast;
    if k_f16 {
        crate::ops::vec::round_f16(&mut scr.q16, qh);
    } else if quant::quantize_row_cpu(vdt, qh, &mut scr.q_q).is_err() {
        o.fill(f32::NAN);
        return None;
    }
    let kdot = if k_f16 { None } else { k_vec_dot(tk) };
    let v_f16 = tv == GgmlType::F16 || v_cast;
    if v_f16 {
        scr.acc16.fill(0);
    } else {
        scr.acc32.fill(0.0);
    }
    let mut m = f32::NEG_INFINITY;
    let mut ssum = 0f32;
    for &(_, cell) in vis {
        let krow = &kv.k_row(p.il, stream, cell as usize)[ko..ko + kbytes];
        let mut s = match kdot {
            Some(f) => f(hk, krow, &scr.q_q),
            None if k_cast => dot_f16_ggml(f16_of_f32(krow, &mut scr.k16), &scr.q16),
            None => dot_f16_ggml(u16_of(krow, &mut scr.k16), &scr.q16),
        };
        s *= kscale;
        if p.softcap != 0.0 {
            s = p.softcap * s.tanh();
        }
        let mut ms = 1.0f32;
        let mut vs = 1.0f32;
        let vrow = &kv.v_row(p.il, stream, cell as usize)[vo..vo + vbytes];
        if v_f16 {
            if s > m {
                let m_old = m;
                m = s;
                ms = (m_old - m).exp();
                scale_f16_acc(&mut scr.acc16, ms);
            } else {
                vs = (s - m).exp();
            }
            let v16 = if v_cast { f16_of_f32(vrow, &mut scr.v16) } else { u16_of(vrow, &mut scr.v16) };
            mad_f16_acc(&mut scr.acc16, vs, v16);
        } else {
            if s > m {
                let m_old = m;
                m = s;
                ms = (m_old - m).exp();
                for a in scr.acc32.iter_mut() {
                    *a *= ms; // ggml_vec_scale_f32
                }
            } else {
                vs = (s - m).exp();
            }
            if quant::dequantize_row(tv, vrow, &mut scr.v32).is_err() {
                o.fill(f32::NAN);
                return None;
            }
            axpy_f32(&mut scr.acc32, vs, &scr.v32); // ggml_vec_mad_f32: fused per element
        }
        ssum = crate::ops::vec::fmaf(ssum, ms, vs); // GCC: fma(S, ms, vs)
    }
    if v_f16 {
        for (d, a) in o.iter_mut().zip(&scr.acc16) {
            *d = half::f16::from_bits(*a).to_f32();
        }
    } else {
        o.copy_from_slice(&scr.acc32[..o.len()]);
    }
    Some((m, ssum))
}

/// `one_chunk_head` for every (token, head) of the micro-batch, items strided over the
/// threads as in the F16 kernel (balanced causal work).
fn one_chunk_any<'a>(
    pool: &ThreadPool,
    kv: &KvCache,
    p: &AttnParams,
    inp: &AttnInputs,
    q: &[f32],
    out: &mut [f32],
    visible: &(dyn Fn(usize) -> &'a [(i32, u32)] + Sync),
) {
    let n_tokens = inp.pos.len();
    let n_items = n_tokens * p.n_head;
    let qw = p.n_head * p.hd_k;
    let ow = p.n_head * p.hd_v;
    let out_ptr = SendPtr(out.as_mut_ptr());
    pool.run(&|ith, nth| {
        for item in (ith..n_items).step_by(nth.max(1)) {
            let t = item / p.n_head;
            let h = item % p.n_head;
            let qh = &q[t * qw + h * p.hd_k..t * qw + (h + 1) * p.hd_k];
            // SAFETY: each item owns its output head slice; items never overlap.
            let o = unsafe { std::slice::from_raw_parts_mut(out_ptr.get().add(t * ow + h * p.hd_v), p.hd_v) };
            o.fill(0.0);
            let vis = visible(t);
            if vis.is_empty() {
                continue;
            }
            if kv.flash_attn || crate::kv_cache::is_quantized(kv.type_v) {
                one_chunk_head(kv, p, qh, inp.stream[t] as usize, h, vis, o);
            } else {
                nonfa_head(kv, p, qh, inp.stream[t] as usize, h, vis, o, n_tokens);
            }
        }
    });
}

// ---- flash attention off: llama.cpp's mul_mat / soft_max / mul_mat path -------------------

/// ggml's AVX2 `ggml_v_expf` for one lane (vec.h): the exp llama.cpp's soft_max uses.
pub(crate) fn v_expf(x: f32) -> f32 {
    use crate::ops::vec::fmaf;
    let c = f32::from_bits;
    let r = c(0x4b40_0000); // 0x1.8p23
    let z = fmaf(x, c(0x3fb8_aa3b), r);
    let n = z - r;
    let b = fmaf(-n, c(0x35bf_be8e), fmaf(-n, c(0x3f31_7200), x));
    let e = z.to_bits() << 23;
    let k = c(e.wrapping_add(1f32.to_bits()));
    let u = b * b;
    let j = fmaf(
        fmaf(fmaf(c(0x3c07_2010), b, c(0x3d2b_9f17)), u, fmaf(c(0x3e2a_af33), b, c(0x3eff_fedb))),
        u,
        c(0x3f7f_fff6) * b,
    );
    if !(n.abs() > 126.0) {
        return fmaf(j, k, k);
    }
    let g: u32 = if n <= 0.0 { 0x8200_0000 } else { 0 };
    let s1 = c(g.wrapping_add(0x7f00_0000));
    let s2 = c(e.wrapping_sub(g));
    if n.abs() > 192.0 {
        s1 * s1
    } else {
        fmaf(s2, j, s2) * s1
    }
}

/// One output of llamafile's tinyBLAS (what ggml's mul_mat runs on AVX2 for F32 / F16 /
/// BF16 operands when the batch has >= 2 columns): one 8-lane fused accumulator over k in
/// steps of 8, then the lanes summed as (l + l+4), pairs, the last two.
pub(crate) fn tinyblas_dot(a: &[f32], b: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if crate::quant::table::kernels().avx2_math {
        // SAFETY: avx2_math: the CPU has AVX2 and FMA.
        return unsafe { tinyblas_dot_avx2(a, b) };
    }
    tinyblas_dot_ref(a, b)
}

/// `tinyblas_dot` with AVX2 registers: the same lanes, the same fused operations.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn tinyblas_dot_avx2(a: &[f32], b: &[f32]) -> f32 {
    use std::arch::x86_64::*;
    let n = a.len().min(b.len()) / 8 * 8;
    let mut c = _mm256_setzero_ps();
    let mut i = 0;
    while i < n {
        c = _mm256_fmadd_ps(_mm256_loadu_ps(a.as_ptr().add(i)), _mm256_loadu_ps(b.as_ptr().add(i)), c);
        i += 8;
    }
    let mut l = [0f32; 8];
    _mm256_storeu_ps(l.as_mut_ptr(), c);
    crate::ops::vec::hsum8_ggml(&l)
}

/// `tinyblas_dot(k_r, b[c])` for KN rows k_r = k[r * n..(r + 1) * n] (n = k.len() / KN) and
/// four rows b[0..4], as tinyBLAS tiles its GEMMs: 4 x KN independent chains side by side,
/// each row of k and b loaded once per 8 elements for all of them; the same fused steps and
/// sums per pair, so the same bits. Panics if a row of b is shorter than n.
pub(crate) fn tinyblas_tile<const KN: usize>(k: &[f32], b: [&[f32]; 4]) -> [[f32; 4]; KN] {
    let n = k.len() / KN;
    assert!(b.iter().all(|r| r.len() >= n), "tinyblas_tile: a row of b shorter than {n}");
    #[cfg(target_arch = "x86_64")]
    if crate::quant::table::kernels().avx2_math {
        // SAFETY: avx2_math: the CPU has AVX2 and FMA; k holds KN rows of n, b's rows n or more (checked).
        return unsafe { tinyblas_tile_avx2::<KN>(k, n, b) };
    }
    std::array::from_fn(|r| b.map(|q| tinyblas_dot(&k[r * n..(r + 1) * n], &q[..n])))
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn tinyblas_tile_avx2<const KN: usize>(k: &[f32], n: usize, b: [&[f32]; 4]) -> [[f32; 4]; KN] {
    use std::arch::x86_64::*;
    let n8 = n / 8 * 8;
    let mut c = [[_mm256_setzero_ps(); 4]; KN];
    let mut i = 0;
    while i < n8 {
        let kv: [__m256; KN] = std::array::from_fn(|r| _mm256_loadu_ps(k.as_ptr().add(r * n + i)));
        for (q, bq) in b.iter().enumerate() {
            let x = _mm256_loadu_ps(bq.as_ptr().add(i));
            for (cr, kr) in c.iter_mut().zip(&kv) {
                cr[q] = _mm256_fmadd_ps(*kr, x, cr[q]);
            }
        }
        i += 8;
    }
    c.map(|cr| {
        cr.map(|cq| {
            let mut l = [0f32; 8];
            _mm256_storeu_ps(l.as_mut_ptr(), cq);
            crate::ops::vec::hsum8_ggml(&l)
        })
    })
}

fn tinyblas_dot_ref(a: &[f32], b: &[f32]) -> f32 {
    let mut c = [0f32; 8];
    for (ca, cb) in a.chunks_exact(8).zip(b.chunks_exact(8)) {
        for l in 0..8 {
            c[l] = crate::ops::vec::fmaf(ca[l], cb[l], c[l]);
        }
    }
    let h = [c[0] + c[4], c[1] + c[5], c[2] + c[6], c[3] + c[7]];
    (h[0] + h[2]) + (h[1] + h[3])
}

/// `ggml_vec_dot_f32` in its AVX2 order: 4 accumulators of 8 lanes over blocks of 32
/// (fused), reduced (s0 + s2) + (s1 + s3), then lanes l + l4, hadd, hadd; the tail added
/// in f64.
fn dot_f32_ggml(x: &[f32], y: &[f32]) -> f32 {
    use crate::ops::vec::fmaf;
    let n = x.len().min(y.len());
    let np = n / 32 * 32;
    let mut s = [[0f32; 8]; 4];
    for i in (0..np).step_by(32) {
        for (j, sj) in s.iter_mut().enumerate() {
            for (l, a) in sj.iter_mut().enumerate() {
                *a = fmaf(x[i + 8 * j + l], y[i + 8 * j + l], *a);
            }
        }
    }
    let v: [f32; 8] = std::array::from_fn(|l| (s[0][l] + s[2][l]) + (s[1][l] + s[3][l]));
    let t0 = [v[0] + v[4], v[1] + v[5], v[2] + v[6], v[3] + v[7]];
    let mut sum = ((t0[0] + t0[1]) + (t0[2] + t0[3])) as f64;
    for i in np..n {
        sum += (x[i] * y[i]) as f64;
    }
    sum as f32
}

fn bf16_round(x: f32) -> u16 {
    let mut b = [0u8; 2];
    let _ = quant::quantize_row(GgmlType::BF16, &[x], &mut b);
    u16::from_le_bytes(b)
}

fn bf16_to_f32(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

/// Most queries of a flash-attention-off pass (each keeps its scores over its visible keys
/// and 8 or 32 V accumulator rows until the pass ends).
const NONFA_PASS_Q: usize = 12;

/// `nonfa_head` for a micro-batch in passes of several queries (heads of one GQA group x a
/// run of tokens that read the same key list, split as `f16_passes`'s passes and slots):
/// each K row made ready once per pass, not once per query, and each V row dequantized
/// once per pass and added into every query's lane rows (`columns_dot`'s steps). Per query
/// the operations and their order are `nonfa_head`'s (its scores, soft_max, V product), so
/// its bits do not depend on the pass. Returns false (nothing done) for a BF16 V, which
/// `nonfa_head` takes.
fn nonfa_passes(pool: &ThreadPool, kv: &KvCache, p: &AttnParams, inp: &AttnInputs, q: &[f32], out: &mut [f32]) -> bool {
    let (tk, tv) = (kv.type_k, kv.type_v);
    if !matches!(tv, GgmlType::F16 | GgmlType::F32) {
        return false;
    }
    let n_tokens = inp.pos.len();
    let gemm = n_tokens >= 2;
    let nk = NonfaK::new(tk, gemm);
    let (hk, hv) = (p.hd_k, p.hd_v);
    let (Some(qrow), Some(kbytes), Some(vbytes)) = (nk.vdt.row_size(hk), tk.row_size(hk), tv.row_size(hv)) else {
        return false;
    };
    let lanes = if gemm { 8 } else { 32 };
    // V's row dequantizer, looked up once (rows of vbytes into hv values by construction)
    let Some(vdq) = quant::table::kernels().get(tv).dequant else {
        return false;
    };
    let group = p.n_head / p.n_head_kv;
    let (qw, ow) = (p.n_head * hk, p.n_head * hv);
    let (kall, vall) = (&kv.k[p.il][..], &kv.v[p.il][..]);
    let (row_k, row_v) = (kv.row_k[p.il], kv.row_v[p.il]);
    let passes = Passes::new(p, inp, NONFA_PASS_Q, pool.n_threads());
    let vis = &passes.vis;
    let out_ptr = SendPtr(out.as_mut_ptr());
    pool.run(&|ith, nth| {
        let (mut qq, mut qf, mut ok, mut ranges, mut woff): (Vec<u8>, Vec<f32>, Vec<bool>, Vec<(usize, usize)>, Vec<usize>) = Default::default();
        let (mut wp, mut acc, mut k16, mut vrow): (Vec<f32>, Vec<f32>, Vec<u16>, Vec<f32>) = Default::default();
        let (mut qs, mut qs16, mut act): (Vec<f32>, Vec<f32>, Vec<usize>) = Default::default();
        let mut rows: Vec<(usize, f32)> = Vec::new();
        let mut aq: Vec<(usize, usize, usize)> = Vec::new();
        let mut kt: Vec<f32> = Vec::new();
        k16.resize(hk, 0);
        vrow.resize(hv, 0.0);
        let mine = passes.share(ith, nth);
        let mut slot = mine.start;
        while let Some((t0, t1, h0, sub)) = passes.next_pass(&mut slot, &mine) {
            let g = h0 / group;
            let keys = token_keys(inp, t0);
            let stream = inp.stream[t0] as usize;
            let (kbase, vbase) = (stream * kv.size * row_k + tk.row_size(g * hk).unwrap_or(0), stream * kv.size * row_v + tv.row_size(g * hv).unwrap_or(0));
            let nq = (t1 - t0) * sub;
            qq.resize(nq * qrow, 0);
            qf.resize(nq * hk, 0.0);
            ok.clear();
            ranges.clear();
            woff.clear();
            let mut nw = 0;
            qs.clear();
            for t in t0..t1 {
                for j in 0..sub {
                    let i = (t - t0) * sub + j;
                    let qh = &q[t * qw + (h0 + j) * hk..t * qw + (h0 + j + 1) * hk];
                    qs.extend_from_slice(qh);
                    ok.push(nk.query(qh, &mut qq[i * qrow..(i + 1) * qrow], &mut qf[i * hk..(i + 1) * hk]));
                    ranges.push(vis[t]);
                    woff.push(nw);
                    nw += (vis[t].1 - vis[t].0).div_ceil(32) * 32;
                }
            }
            wp.clear();
            wp.resize(nw, f32::NEG_INFINITY);
            let jlo = ranges.iter().map(|r| r.0).min().unwrap_or(0);
            let jhi = ranges.iter().map(|r| r.1).max().unwrap_or(0);
            // the scores, each K row made ready once for the pass's queries (a decode
            // step's pass: one range, the same queries at every key); tinyBLAS in tiles of
            // four queries x up to NONFA_KT keys whose active set does not change
            let mut change = jlo;
            let kt_max = if nk.tiny { NONFA_KT } else { 1 };
            kt.resize(kt_max * hk, 0.0);
            let mut j = jlo;
            while j < jhi {
                if j == change {
                    change = active_at(&ranges, &ok, j, &mut act);
                }
                let kn = kt_max.min(jhi - j).min(change - j);
                let kb = |kk: usize| &kall[kbase + keys[j + kk].1 as usize * row_k..][..kbytes];
                for kk in 0..kn {
                    if j + kk + NONFA_PF < jhi {
                        prefetch_row(&kall[kbase + keys[j + kk + NONFA_PF].1 as usize * row_k..][..kbytes]);
                    }
                    // (k16: the one key of a pass that is not tiled)
                    nk.key(kb(kk), &mut kt[kk * hk..(kk + 1) * hk], &mut k16);
                }
                let mut a0 = 0;
                while nk.tiny && a0 + 4 <= act.len() {
                    let ii = [act[a0], act[a0 + 1], act[a0 + 2], act[a0 + 3]];
                    let qr = ii.map(|i| &qf[i * hk..(i + 1) * hk]);
                    let mut put = |kk: usize, d: [f32; 4]| {
                        for (&i, &dv) in ii.iter().zip(&d) {
                            wp[woff[i] + j + kk - ranges[i].0] = nonfa_score(p, dv);
                        }
                    };
                    match kn {
                        3 => tinyblas_tile::<3>(&kt[..3 * hk], qr).into_iter().enumerate().for_each(|(kk, d)| put(kk, d)),
                        2 => tinyblas_tile::<2>(&kt[..2 * hk], qr).into_iter().enumerate().for_each(|(kk, d)| put(kk, d)),
                        _ => put(0, tinyblas_tile::<1>(&kt[..hk], qr)[0]),
                    }
                    a0 += 4;
                }
                for kk in 0..kn {
                    for &i in &act[a0..] {
                        let qh = &qs[i * hk..(i + 1) * hk];
                        let d = nk.dot(kb(kk), &kt[kk * hk..(kk + 1) * hk], &k16, &qq[i * qrow..(i + 1) * qrow], &qf[i * hk..(i + 1) * hk], qh);
                        wp[woff[i] + j + kk - ranges[i].0] = nonfa_score(p, d);
                    }
                }
                j += kn;
            }
            // soft_max per query, then p in V's type (F16: rounded to f16)
            for i in 0..nq {
                let n = ranges[i].1 - ranges[i].0;
                if n == 0 || !ok[i] {
                    continue;
                }
                let w = &mut wp[woff[i]..woff[i] + n.div_ceil(32) * 32];
                nonfa_softmax(w, p.sinks.map(|sk| sk[h0 + i % sub]));
                if tv == GgmlType::F16 {
                    qs16.clear();
                    qs16.extend_from_slice(w);
                    vec::round_f16(w, &qs16);
                }
            }
            // V^T p: each V row dequantized once, added into every query's lane row (one
            // call for all of them, the row in registers). A query's lane rows are qst
            // floats after the previous query's: one cache line more than its lanes x hv,
            // so that the rows of queries two apart (lanes x hv = 512 floats for SmolLM2's
            // 8 x 64) do not share their address's low 12 bits (4K aliasing between a
            // row's store and the next row's load)
            let qst = lanes * hv + 16;
            acc.clear();
            acc.resize(nq * qst, 0.0);
            let mut change = jlo;
            for j in jlo..jhi {
                if j + NONFA_PF < jhi {
                    prefetch_row(&vall[vbase + keys[j + NONFA_PF].1 as usize * row_v..][..vbytes]);
                }
                let cell = keys[j].1 as usize;
                vdq(&vall[vbase + cell * row_v..][..vbytes], &mut vrow);
                if j == change {
                    change = active_at(&ranges, &ok, j, &mut act);
                    // per active query: its lane rows' start, its first key, its weights
                    aq.clear();
                    aq.extend(act.iter().map(|&i| (i * qst, ranges[i].0, woff[i])));
                    rows.resize(aq.len(), (0, 0.0));
                }
                for (r, &(a0, r0, wo)) in rows.iter_mut().zip(&aq) {
                    let jj = j - r0;
                    *r = (a0 + (jj & (lanes - 1)) * hv, wp[wo + jj]); // lanes: 8 or 32
                }
                vec::fma_axpy_rows(&mut acc, &rows, &vrow);
            }
            for i in 0..nq {
                let (t, h) = (t0 + i / sub, h0 + i % sub);
                // SAFETY: heads h0..h0 + sub of tokens t0..t1 belong to this pass only
                let o = unsafe { std::slice::from_raw_parts_mut(out_ptr.get().add(t * ow + h * hv), hv) };
                let n = ranges[i].1 - ranges[i].0;
                if n == 0 {
                    o.fill(0.0);
                } else if !ok[i] {
                    o.fill(f32::NAN);
                } else {
                    let a = &mut acc[i * qst..i * qst + lanes * hv];
                    vrow.fill(0.0);
                    // the mask's padding: zero rows, zero weights, as the column dots take them
                    for jj in n..n.div_ceil(32) * 32 {
                        let l = jj % lanes;
                        vec::fma_axpy(&mut a[l * hv..(l + 1) * hv], wp[woff[i] + jj], &vrow);
                    }
                    reduce_lanes(a, hv, lanes, o);
                }
            }
        }
    });
    true
}

/// Keys per tinyBLAS score tile of the flash-attention-off passes (`tinyblas_tile`: 4 x 3
/// accumulators, 3 K rows and a query row in the 16 ymm registers).
const NONFA_KT: usize = 3;

/// Keys ahead that the flash-attention-off passes prefetch their K and V rows.
const NONFA_PF: usize = 8;

/// Asks for the cache lines of `b` (a K or V row) ahead of use (x86-64; elsewhere nothing).
#[inline(always)]
fn prefetch_row(b: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    for off in (0..b.len()).step_by(64).chain(std::iter::once(b.len().saturating_sub(1))) {
        // SAFETY: a prefetch of an address inside `b` (a hint: it never faults)
        unsafe { std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(b.as_ptr().add(off) as *const i8) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = b;
}

/// The queries (of `ranges`, those `ok`) whose range holds key j, into `act`; returns the
/// next key at which that set can change (a range's start or end after j).
fn active_at(ranges: &[(usize, usize)], ok: &[bool], j: usize, act: &mut Vec<usize>) -> usize {
    act.clear();
    let mut next = usize::MAX;
    for (i, &(lo, hi)) in ranges.iter().enumerate() {
        if lo > j {
            next = next.min(lo);
        } else if hi > j {
            next = next.min(hi);
            if ok[i] {
                act.push(i);
            }
        }
    }
    next
}

/// How llama.cpp's mul_mat(K, q) takes K with flash attention off, per K type and batch:
/// q through K's vec_dot_type; tinyBLAS (f32 from the rows) for F16 / BF16 K when the
/// micro-batch has >= 2 tokens, else the type's vec_dot (F16: ggml_vec_dot_f16; F32:
/// ggml_vec_dot_f32; IQ4_NL's x86 order at one token).
struct NonfaK {
    tk: GgmlType,
    vdt: GgmlType,
    tiny: bool,
    kdot: Option<quant::VecDotFn>,
}

impl NonfaK {
    fn new(tk: GgmlType, gemm: bool) -> NonfaK {
        let kdot = match tk {
            GgmlType::IQ4_NL if !gemm => Some(quant::legacy::vec_dot_iq4_nl_q8_0_x86 as quant::VecDotFn),
            _ => quant::vec_dot_fn(tk, quant::kernel_set()),
        };
        NonfaK { tk, vdt: quant::vec_dot_type(tk), tiny: gemm && matches!(tk, GgmlType::F16 | GgmlType::BF16), kdot }
    }

    /// q in K's vec_dot type (`q_q`) and as the f32 the dots read (`q_f`, hk values);
    /// false where q does not convert.
    fn query(&self, qh: &[f32], q_q: &mut [u8], q_f: &mut [f32]) -> bool {
        if quant::quantize_row_cpu(self.vdt, qh, q_q).is_err() {
            return false;
        }
        match self.vdt {
            GgmlType::F16 => q_f.iter_mut().zip(qh).for_each(|(d, &x)| *d = half::f16::from_f32(x).to_f32()),
            GgmlType::BF16 => q_f.iter_mut().zip(q_q.chunks_exact(2)).for_each(|(d, c)| *d = bf16_to_f32(u16::from_le_bytes([c[0], c[1]]))),
            _ => q_f.copy_from_slice(qh),
        }
        true
    }

    /// K row `kb` ready for `dot`: in f32 (`krow`) for tinyBLAS and F32 K, as f16 bits
    /// (`k16`) for F16 K at one token.
    fn key(&self, kb: &[u8], krow: &mut [f32], k16: &mut [u16]) {
        if self.tiny || self.tk == GgmlType::F32 {
            let _ = quant::dequantize_row(self.tk, kb, krow);
        } else if self.tk == GgmlType::F16 {
            for (d, c) in k16.iter_mut().zip(kb.chunks_exact(2)) {
                *d = u16::from_le_bytes([c[0], c[1]]);
            }
        }
    }

    /// q.k for the row `key` prepared.
    fn dot(&self, kb: &[u8], krow: &[f32], k16: &[u16], q_q: &[u8], q_f: &[f32], qh: &[f32]) -> f32 {
        if self.tiny {
            tinyblas_dot(krow, q_f)
        } else if self.tk == GgmlType::F16 {
            dot_f16_ggml(k16, q_f)
        } else if self.tk == GgmlType::F32 {
            dot_f32_ggml(krow, qh)
        } else {
            match self.kdot {
                Some(f) => f(qh.len(), kb, q_q),
                None => f32::NAN,
            }
        }
    }
}

/// A flash-attention-off score: softcap c * tanh(kq * (1/c)), then the soft_max scale.
fn nonfa_score(p: &AttnParams, mut s: f32) -> f32 {
    if p.softcap != 0.0 {
        s = (s * (1.0 / p.softcap)).tanh() * p.softcap;
    }
    s * p.scale
}

/// ggml's soft_max over a row of scores padded to a multiple of 32 with -inf: the max (with
/// the sink), ggml_v_expf(x - max) in groups of 8 whose 8-lane sums are added in f64 (and
/// the sink's exp), then times 1/sum.
fn nonfa_softmax(wp: &mut [f32], sink: Option<f32>) {
    let mut max = wp.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if let Some(s) = sink {
        max = max.max(s);
    }
    let mut sum = 0f64;
    let vector = cfg!(target_arch = "x86_64") && crate::quant::table::kernels().avx2_math;
    if vector {
        // the same exps and sums 8 lanes at a time (ggml_v_expf is lane-wise)
        #[cfg(target_arch = "x86_64")]
        // SAFETY: avx2_math: AVX2 and FMA are present.
        unsafe {
            crate::ops::act::exp_sub_avx2(wp, max, &mut sum)
        };
    } else {
        for grp in wp.chunks_exact_mut(8) {
            for x in grp.iter_mut() {
                *x = v_expf(*x - max);
            }
            sum += crate::ops::vec::hsum8_ggml(grp) as f64;
        }
    }
    if let Some(s) = sink {
        sum += (s - max).exp() as f64;
    }
    let inv = (1.0 / sum) as f32;
    for x in wp.iter_mut() {
        *x *= inv;
    }
}

/// llama.cpp's attention with flash attention off (llm_graph_context::build_attn_mha),
/// for one query head, on the CPU:
///   kq = mul_mat(K, q)          q through K's vec_dot_type; tinyBLAS for F16 / BF16 /
///                               Q8_0 / Q4_0 / Q5_0 / IQ4_NL K when the micro-batch has
///                               >= 2 tokens, else the type's vec_dot (F32 K, Q4_1 and
///                               Q5_1 always take the vec_dot)
///   softcap: kq = c * tanh(kq * (1/c))
///   p = soft_max(kq * scale)    ggml_v_expf, lane groups of 8 summed in f32 then in f64
///   out = mul_mat(V^T, p)       p rounded to V's vec_dot type (F16 / BF16 / F32), tinyBLAS
///                               for >= 2 tokens, else ggml's vec_dot of V's type
/// The key list is padded with zero weights to a multiple of 32, as llama.cpp's padded
/// n_kv is (masked cells weigh exactly 0).
#[allow(clippy::too_many_arguments)]
fn nonfa_head(kv: &KvCache, p: &AttnParams, qh: &[f32], stream: usize, h: usize, vis: &[(i32, u32)], o: &mut [f32], n_tokens: usize) {
    let g = h / (p.n_head / p.n_head_kv);
    let (tk, tv) = (kv.type_k, kv.type_v);
    let (hk, hv) = (p.hd_k, p.hd_v);
    let set = quant::kernel_set();
    let ko = tk.row_size(g * hk).unwrap_or(0);
    let vo = tv.row_size(g * hv).unwrap_or(0);
    let kbytes = tk.row_size(hk).unwrap_or(0);
    let vbytes = tv.row_size(hv).unwrap_or(0);
    let gemm = n_tokens >= 2;
    let n = vis.len();
    let np = n.div_ceil(32) * 32;
    let nk = NonfaK::new(tk, gemm);
    let mut q_q = vec![0u8; nk.vdt.row_size(hk).unwrap_or(0)];
    let mut q_f = vec![0f32; hk];
    if !nk.query(qh, &mut q_q, &mut q_f) {
        o.fill(f32::NAN);
        return;
    }
    let (mut krow, mut k16) = (vec![0f32; hk], vec![0u16; hk]);
    let mut wp = vec![f32::NEG_INFINITY; np];
    for (jj, &(_, cell)) in vis.iter().enumerate() {
        let kb = &kv.k_row(p.il, stream, cell as usize)[ko..ko + kbytes];
        nk.key(kb, &mut krow, &mut k16);
        wp[jj] = nonfa_score(p, nk.dot(kb, &krow, &k16, &q_q, &q_f, qh));
    }
    nonfa_softmax(&mut wp, p.sinks.map(|sk| sk[h]));
    // p in V's vec_dot type, then o = V^T p as llama.cpp's mul_mat computes it
    match tv {
        GgmlType::F16 | GgmlType::F32 => {
            let pv: Vec<f32> = if tv == GgmlType::F16 { wp.iter().map(|&x| half::f16::from_f32(x).to_f32()).collect() } else { wp };
            // the dots of V's columns with p: tinyBLAS (gemm: 8 lanes) or ggml_vec_dot_f16 /
            // _f32 (32 lanes: four 8-lane accumulators), key j's product fused into lane j % L
            let lanes = if gemm { 8 } else { 32 };
            let vis_row = |jj: usize, vrow: &mut [f32]| {
                let (_, cell) = vis[jj];
                let _ = quant::dequantize_row(tv, &kv.v_row(p.il, stream, cell as usize)[vo..vo + vbytes], vrow);
            };
            columns_dot(hv, np, lanes, &pv, vis.len(), vis_row, o);
        }
        GgmlType::BF16 => {
            let mut vrow = vec![0f32; hv];
            // V^T: column d of the visible V rows
            let mut vt = vec![0f32; hv * np];
            for (jj, &(_, cell)) in vis.iter().enumerate() {
                let vb = &kv.v_row(p.il, stream, cell as usize)[vo..vo + vbytes];
                let _ = quant::dequantize_row(tv, vb, &mut vrow);
                for d in 0..hv {
                    vt[d * np + jj] = vrow[d];
                }
            }
            let pb: Vec<u16> = wp.iter().map(|&x| bf16_round(x)).collect();
            let pf: Vec<f32> = pb.iter().map(|&h| bf16_to_f32(h)).collect();
            let pbytes: Vec<u8> = pb.iter().flat_map(|h| h.to_le_bytes()).collect();
            let f = quant::vec_dot_fn(GgmlType::BF16, set);
            for d in 0..hv {
                let col = &vt[d * np..(d + 1) * np];
                o[d] = if gemm {
                    tinyblas_dot(col, &pf)
                } else {
                    let cb: Vec<u8> = col.iter().flat_map(|&x| ((x.to_bits() >> 16) as u16).to_le_bytes()).collect();
                    f.map_or(f32::NAN, |f| f(np, &cb, &pbytes))
                };
            }
        }
        // a quantized V never gets here: it needs flash attention
        _ => o.fill(f32::NAN),
    }
}

/// o[d] = the fused dot of column d of an np-row matrix (rows 0..n from `row`, the rest
/// zero: the mask's padding) with p, in the order of a dot over `lanes` (8: tinyBLAS; 32:
/// ggml_vec_dot_f16 / _f32's four 8-lane accumulators) accumulators: row j's product fused
/// into accumulator j % lanes, then the accumulators reduced as that dot reduces them. Rows
/// are added whole (no transposed copy), so each output gets the same operations in the
/// same order as the column dot.
fn columns_dot(hv: usize, np: usize, lanes: usize, p: &[f32], n: usize, row: impl Fn(usize, &mut [f32]), o: &mut [f32]) {
    let mut acc = vec![0f32; lanes * hv];
    let mut vrow = vec![0f32; hv];
    for j in 0..np {
        if j < n {
            row(j, &mut vrow);
        } else if j == n {
            vrow.fill(0.0);
        }
        vec::fma_axpy(&mut acc[(j % lanes) * hv..(j % lanes + 1) * hv], p[j], &vrow);
    }
    reduce_lanes(&acc, hv, lanes, o);
}

/// o[d] from the lane rows `acc` (lanes x hv) as the column dots reduce their accumulators:
/// 8 lanes as tinyBLAS (`hsum8_ggml`); 32 as ggml_vec_dot_f16 / _f32 (acc0 + acc2) + (acc1 +
/// acc3) per lane, lanes l + l+4, then (0+1) + (2+3).
fn reduce_lanes(acc: &[f32], hv: usize, lanes: usize, o: &mut [f32]) {
    for (d, od) in o.iter_mut().enumerate().take(hv) {
        let c: [f32; 32] = std::array::from_fn(|l| if l < lanes { acc[l * hv + d] } else { 0.0 });
        *od = if lanes == 8 {
            crate::ops::vec::hsum8_ggml(&c[..8])
        } else {
            let x: [f32; 8] = std::array::from_fn(|l| (c[l] + c[16 + l]) + (c[8 + l] + c[24 + l]));
            let t = [x[0] + x[4], x[1] + x[5], x[2] + x[6], x[3] + x[7]];
            (t[0] + t[1]) + (t[2] + t[3])
        };
    }
}

#[cfg(test)]
mod tests {
    //! `attention` against a plain softmax(q.k * scale) V computed here in f64 from the
    //! values the cache holds: causal, sliding-window and chunked masks by position, GQA
    //! head groups, softcap and sinks, for F16 (llama.cpp's one_chunk kernel) and F32 K/V.

    use super::*;
    use crate::testutil::Rng;

    struct Case {
        n_head: usize,
        n_head_kv: usize,
        hd: usize,
        n_swa: usize,
        chunked: bool,
        softcap: f32,
        sinks: bool,
    }

    const BASE: Case = Case { n_head: 4, n_head_kv: 2, hd: 16, n_swa: 0, chunked: false, softcap: 0.0, sinks: false };

    /// Keys at positions 0..10 in scattered cells of a 16-cell cache, queries at `qpos`:
    /// (attention's output, the reference) [n_q, n_head * hd].
    fn run(c: &Case, t: GgmlType, flash: bool, qpos: &[i32]) -> (Vec<f32>, Vec<f32>) {
        run_on(c, t, flash, qpos, 2)
    }

    /// `run` on a pool of `threads` threads.
    fn run_on(c: &Case, t: GgmlType, flash: bool, qpos: &[i32], threads: usize) -> (Vec<f32>, Vec<f32>) {
        let (size, n_keys, hd) = (16usize, 10usize, c.hd);
        let kw = c.n_head_kv * hd;
        let mut kv = KvCache::new(&[kw], &[kw], size, 1, 1, t, t).unwrap();
        kv.flash_attn = flash;
        let mut r = Rng::new(11 + c.n_head as u64 * 7 + c.n_swa as u64);
        // what the cache holds, as f32 (F16: the rounded values)
        let round = |x: f32| if t == GgmlType::F16 { half::f16::from_f32(x).to_f32() } else { x };
        let mut kvals = vec![vec![0f32; kw]; n_keys];
        let mut vvals = vec![vec![0f32; kw]; n_keys];
        let mut keys = Vec::new();
        for p in 0..n_keys {
            let cell = (p * 3) % size; // not in position order
            keys.push((p as i32, cell as u32));
            kvals[p] = r.vec(kw, 1.0).into_iter().map(round).collect();
            vvals[p] = r.vec(kw, 1.0).into_iter().map(round).collect();
            for (buf, vals, rb) in [(&mut kv.k[0], &kvals[p], kv.row_k[0]), (&mut kv.v[0], &vvals[p], kv.row_v[0])] {
                let row = &mut buf[cell * rb..(cell + 1) * rb];
                for (d, x) in vals.iter().enumerate() {
                    if t == GgmlType::F16 {
                        row[2 * d..2 * d + 2].copy_from_slice(&half::f16::from_f32(*x).to_le_bytes());
                    } else {
                        row[4 * d..4 * d + 4].copy_from_slice(&x.to_le_bytes());
                    }
                }
            }
        }
        let n_q = qpos.len();
        let q = r.vec(n_q * c.n_head * hd, 1.0);
        let sinks: Vec<f32> = (0..c.n_head).map(|h| 0.5 * h as f32 - 0.7).collect();
        let p = AttnParams {
            softcap: c.softcap,
            n_swa: c.n_swa,
            chunked: c.chunked,
            sinks: if c.sinks { Some(&sinks) } else { None },
            ..AttnParams::causal(0, c.n_head, c.n_head_kv, hd)
        };
        let stream = vec![0u32; n_q];
        let key_range = vec![(0u32, n_keys as u32); n_q];
        let inp = AttnInputs { pos: qpos, stream: &stream, key_range: &key_range, keys: &keys };
        let pool = ThreadPool::new(threads);
        let stride = scratch_per_thread(size, hd, hd);
        let mut scratch = vec![0f32; stride * threads];
        let mut out = vec![f32::NAN; n_q * c.n_head * hd];
        attention(&pool, &kv, &p, &inp, &q, &mut out, &mut scratch, stride);

        // the reference; F16 K means q rounded to f16 first, as llama.cpp's kernel does
        let q_in = |x: f32| if t == GgmlType::F16 && flash { half::f16::from_f32(x).to_f32() } else { x };
        let mut want = vec![0f32; out.len()];
        for (i, &pos) in qpos.iter().enumerate() {
            let visible = |kp: i32| {
                kp <= pos
                    && match (c.n_swa, c.chunked) {
                        (0, _) => true,
                        (w, true) => kp >= pos / w as i32 * w as i32,
                        (w, false) => pos - kp < w as i32,
                    }
            };
            for h in 0..c.n_head {
                let g = h / (c.n_head / c.n_head_kv);
                let qh: Vec<f64> = q[(i * c.n_head + h) * hd..][..hd].iter().map(|&x| q_in(x) as f64).collect();
                let mut sc = Vec::new();
                for kp in (0..n_keys).filter(|&kp| visible(kp as i32)) {
                    let mut s = qh.iter().zip(&kvals[kp][g * hd..(g + 1) * hd]).map(|(a, &b)| a * b as f64).sum::<f64>()
                        * p.scale as f64;
                    if c.softcap != 0.0 {
                        s = c.softcap as f64 * (s / c.softcap as f64).tanh();
                    }
                    sc.push((kp, s));
                }
                let sink = if c.sinks { Some(sinks[h] as f64) } else { None };
                let m = sc.iter().map(|x| x.1).chain(sink).fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = sc.iter().map(|x| (x.1 - m).exp()).chain(sink.map(|s| (s - m).exp())).sum();
                for (kp, s) in &sc {
                    let w = (s - m).exp() / z;
                    for d in 0..hd {
                        want[(i * c.n_head + h) * hd + d] += (w * vvals[*kp][g * hd + d] as f64) as f32;
                    }
                }
            }
        }
        (out, want)
    }

    fn check(c: &Case, t: GgmlType, flash: bool, tol: f32) {
        let qpos = [0, 3, 4, 9, 12];
        let (got, want) = run(c, t, flash, &qpos);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!((g - w).abs() <= tol, "{t} flash={flash} swa={} element {i}: got {g}, want {w}", c.n_swa);
        }
    }

    #[test]
    fn f16_kernel_bits_do_not_depend_on_threads_or_head_grouping() {
        // The F16 kernel's items: whole GQA groups (enough tokens per thread) or even shares
        // of the (token, head) slots cut inside groups (a decode step): each head gets the
        // same bits whichever heads it shares a pass over the keys with.
        for c in [Case { n_head: 6, n_head_kv: 2, hd: 64, ..BASE }, Case { n_head: 4, n_head_kv: 1, hd: 32, ..BASE }, BASE] {
            for qpos in [&[9][..], &[7, 9], &[2, 3, 4, 5, 6, 7, 8, 9]] {
                let (one, _) = run_on(&c, GgmlType::F16, true, qpos, 1);
                for threads in 2..=5 {
                    let (got, _) = run_on(&c, GgmlType::F16, true, qpos, threads);
                    let same = one.iter().zip(&got).all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(same, "n_head {} / {} kv, {} tokens, {threads} threads", c.n_head, c.n_head_kv, qpos.len());
                }
            }
        }
    }

    /// A flash-attention F16 cache of `size` cells, K and V rows of `kw` values drawn from `r`
    /// (uniform in +-`scale`, rounded to f16).
    fn random_f16_cache(kw: usize, size: usize, r: &mut Rng, scale: f32) -> KvCache {
        let mut kv = KvCache::new(&[kw], &[kw], size, 1, 1, GgmlType::F16, GgmlType::F16).unwrap();
        kv.flash_attn = true;
        for buf in [&mut kv.k[0], &mut kv.v[0]] {
            for (c, x) in buf.chunks_exact_mut(2).zip(r.vec(size * kw, scale)) {
                c.copy_from_slice(&half::f16::from_f32(x).to_le_bytes());
            }
        }
        kv
    }

    /// The passes tests' layer variants: causal; a 7-key window with sinks; 8-key chunks; a
    /// softcap.
    fn mask_variants(n_head: usize, n_head_kv: usize, hd: usize, sinks: &[f32]) -> Vec<AttnParams<'_>> {
        [(0, false, 0.0, false), (7, false, 0.0, true), (8, true, 0.0, false), (0, false, 1.3, false)]
            .into_iter()
            .map(|(n_swa, chunked, softcap, sink)| AttnParams {
                softcap,
                n_swa,
                chunked,
                sinks: if sink { Some(sinks) } else { None },
                ..AttnParams::causal(0, n_head, n_head_kv, hd)
            })
            .collect()
    }

    #[test]
    fn f16_passes_are_bit_identical_to_the_one_query_kernel() {
        // Queries sharing a pass over their keys (GQA heads x runs of tokens, any tile size,
        // tail tiles, 1..3 threads) give each query exactly the one-query kernel's bits, for
        // causal, sliding-window and chunked masks, softcap and sinks, head dims on the
        // blocked AVX-512 / AVX2 paths (64, 128, 256) and off them (16, 48: dot and V tails).
        let (size, n_keys) = (64usize, 48usize);
        for (n_head, n_head_kv, hd) in [(6usize, 2usize, 64usize), (4, 1, 128), (2, 1, 256), (3, 3, 48), (4, 2, 16)] {
            let kw = n_head_kv * hd;
            let mut r = Rng::new(5 + hd as u64);
            let kv = random_f16_cache(kw, size, &mut r, 2.0);
            // keys at positions 0..48 in scattered cells; the batch: tokens at 20..40, then 47, 5, 30
            let keys: Vec<(i32, u32)> = (0..n_keys).map(|p| (p as i32, ((p * 7) % size) as u32)).collect();
            let qpos: Vec<i32> = (20..40).chain([47, 5, 30]).collect();
            let n_q = qpos.len();
            let q = r.vec(n_q * n_head * hd, 1.5);
            let sinks: Vec<f32> = (0..n_head).map(|h| 0.3 * h as f32 - 0.5).collect();
            for p in mask_variants(n_head, n_head_kv, hd, &sinks) {
                let (n_swa, chunked, softcap, sink) = (p.n_swa, p.chunked, p.softcap, p.sinks.is_some());
                let kscale = if softcap != 0.0 { p.scale / softcap } else { p.scale };
                let stream = vec![0u32; n_q];
                let key_range = vec![(0u32, n_keys as u32); n_q];
                let inp = AttnInputs { pos: &qpos, stream: &stream, key_range: &key_range, keys: &keys };
                // the one-query kernel, query by query
                let mut want = vec![0f32; n_q * n_head * hd];
                for (t, &pos) in qpos.iter().enumerate() {
                    let (lo, hi) = visible_range(&p, &keys, pos);
                    for h in 0..n_head {
                        let o = &mut want[(t * n_head + h) * hd..][..hd];
                        if lo < hi {
                            one_chunk_head(&kv, &p, &q[(t * n_head + h) * hd..][..hd], 0, h, &keys[lo..hi], o);
                        }
                    }
                }
                for threads in 1..=3 {
                    let pool = ThreadPool::new(threads);
                    for max_q in [1, 2, 3, 5, 8, 17, 64] {
                        let mut got = vec![f32::NAN; want.len()];
                        f16_passes(&pool, &kv, &p, &inp, &q, &mut got, kscale, max_q, usize::MAX);
                        let bad = want.iter().zip(&got).position(|(a, b)| a.to_bits() != b.to_bits());
                        assert!(
                            bad.is_none(),
                            "hd {hd}, {n_head}/{n_head_kv} heads, swa {n_swa} chunked {chunked} softcap {softcap} sinks {sink}, \
                             {threads} threads, {max_q} queries per pass: element {bad:?}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn f16_passes_over_a_long_cache_are_bit_identical_to_the_one_query_kernel() {
        // The blocked kernels' steady state (whole 8-key blocks below the running max: the
        // vector exp, the V accumulation of four queries without per-key flags) needs long
        // key lists; 700 keys, the last 50 positions as the batch, head dims 64 and 256.
        let (size, n_keys) = (1024usize, 700usize);
        for (n_head, n_head_kv, hd) in [(6usize, 2usize, 64usize), (4, 1, 256)] {
            let kw = n_head_kv * hd;
            let mut r = Rng::new(77 + hd as u64);
            let kv = random_f16_cache(kw, size, &mut r, 1.0);
            let keys: Vec<(i32, u32)> = (0..n_keys).map(|p| (p as i32, ((p * 5) % size) as u32)).collect();
            let qpos: Vec<i32> = (650..700).collect();
            let n_q = qpos.len();
            let q = r.vec(n_q * n_head * hd, 3.0);
            let p = AttnParams::causal(0, n_head, n_head_kv, hd);
            let stream = vec![0u32; n_q];
            let key_range = vec![(0u32, n_keys as u32); n_q];
            let inp = AttnInputs { pos: &qpos, stream: &stream, key_range: &key_range, keys: &keys };
            let mut want = vec![0f32; n_q * n_head * hd];
            for (t, &pos) in qpos.iter().enumerate() {
                let (lo, hi) = visible_range(&p, &keys, pos);
                for h in 0..n_head {
                    let o = &mut want[(t * n_head + h) * hd..][..hd];
                    one_chunk_head(&kv, &p, &q[(t * n_head + h) * hd..][..hd], 0, h, &keys[lo..hi], o);
                }
            }
            for threads in [1, 2] {
                let pool = ThreadPool::new(threads);
                for max_q in [4, 6, 7, 13, 19, 64] {
                    let mut got = vec![f32::NAN; want.len()];
                    f16_passes(&pool, &kv, &p, &inp, &q, &mut got, p.scale, max_q, usize::MAX);
                    let bad = want.iter().zip(&got).position(|(a, b)| a.to_bits() != b.to_bits());
                    assert!(bad.is_none(), "hd {hd}, {threads} threads, {max_q} queries per pass: element {bad:?}");
                }
            }
        }
    }

    /// A cache of 64 cells in two streams with random rows of types (tk, tv) (kw values per
    /// row), and a batch over it: two sequences (streams 0 and 1) with keys at positions
    /// 0..48 in scattered cells; tokens of sequence 0 at 20..40, then 47, 5, 30, and of
    /// sequence 1 at 44..48.
    struct TwoStreams {
        kv: KvCache,
        keys: Vec<(i32, u32)>,
        qpos: Vec<i32>,
        stream: Vec<u32>,
        key_range: Vec<(u32, u32)>,
    }

    const TWO_STREAMS_SIZE: usize = 64;

    fn two_streams(tk: GgmlType, tv: GgmlType, kw: usize, flash: bool, r: &mut Rng) -> TwoStreams {
        let (size, n_keys) = (TWO_STREAMS_SIZE, 48usize);
        let mut kv = KvCache::new(&[kw], &[kw], size, 2, 2, tk, tv).unwrap();
        kv.flash_attn = flash;
        for (buf, ty, rb) in [(&mut kv.k[0], tk, kv.row_k[0]), (&mut kv.v[0], tv, kv.row_v[0])] {
            for row in buf.chunks_exact_mut(rb) {
                quant::quantize_row(ty, &r.vec(kw, 2.0), row).unwrap();
            }
        }
        let keys0 = (0..n_keys).map(|p| (p as i32, ((p * 7) % size) as u32));
        let keys1 = (0..n_keys).map(|p| (p as i32, ((p * 5 + 3) % size) as u32));
        let keys: Vec<(i32, u32)> = keys0.chain(keys1).collect();
        let seqs: Vec<(i32, u32)> = (20..40).chain([47, 5, 30]).map(|p| (p, 0)).chain((44..48).map(|p| (p, 1))).collect();
        let key_range = seqs.iter().map(|x| (x.1 * n_keys as u32, (x.1 + 1) * n_keys as u32)).collect();
        TwoStreams { kv, keys, qpos: seqs.iter().map(|x| x.0).collect(), stream: seqs.iter().map(|x| x.1).collect(), key_range }
    }

    #[test]
    fn quant_passes_are_bit_identical_to_the_one_query_kernel() {
        // A quantized K and V (llama.cpp's one_chunk kernel: K's vec_dot, V dequantized and
        // accumulated in f32): queries sharing a pass (GQA heads x runs of tokens, any pass
        // size, 1..3 threads, prefill and decode steps) give each query exactly the one-query
        // kernel's bits, for causal / sliding-window / chunked masks, softcap and sinks, two
        // sequences in two streams, and a query holding a NaN. Through
        // `attention` itself, so the dispatch is checked too.
        let size = TWO_STREAMS_SIZE;
        let cases = [
            (GgmlType::Q8_0, GgmlType::Q8_0, 6usize, 2usize, 64usize),
            (GgmlType::Q4_0, GgmlType::Q5_1, 9, 3, 32),
            (GgmlType::IQ4_NL, GgmlType::Q4_1, 4, 1, 128),
            (GgmlType::Q5_0, GgmlType::Q8_0, 3, 3, 96),
            (GgmlType::Q4_1, GgmlType::Q8_0, 2, 1, 256),
        ];
        for (tk, tv, n_head, n_head_kv, hd) in cases {
            let mut r = Rng::new(31 + hd as u64 + n_head as u64);
            let TwoStreams { kv, keys, qpos, stream, key_range } = two_streams(tk, tv, n_head_kv * hd, true, &mut r);
            let n_q = qpos.len();
            let mut q = r.vec(n_q * n_head * hd, 1.5);
            q[3 * n_head * hd + 1] = f32::NAN; // in token 3's first head
            let sinks: Vec<f32> = (0..n_head).map(|h| 0.3 * h as f32 - 0.5).collect();
            for p in mask_variants(n_head, n_head_kv, hd, &sinks) {
                let (n_swa, chunked, softcap, sink) = (p.n_swa, p.chunked, p.softcap, p.sinks.is_some());
                // the one-query kernel, query by query
                let mut want = vec![0f32; n_q * n_head * hd];
                for t in 0..n_q {
                    let (r0, r1) = key_range[t];
                    let ks = &keys[r0 as usize..r1 as usize];
                    let (lo, hi) = visible_range(&p, ks, qpos[t]);
                    for h in 0..n_head {
                        let o = &mut want[(t * n_head + h) * hd..][..hd];
                        if lo < hi {
                            one_chunk_head(&kv, &p, &q[(t * n_head + h) * hd..][..hd], stream[t] as usize, h, &ks[lo..hi], o);
                        }
                    }
                }
                for threads in 1..=3 {
                    let pool = ThreadPool::new(threads);
                    let stride = scratch_per_thread(size, hd, hd);
                    let mut scratch = vec![0f32; stride * threads];
                    // the whole batch (passes), one token (slots), the last 4 tokens of sequence 0 and 1
                    for (a, b) in [(0, n_q), (22, 23), (19, 27)] {
                        let inp = AttnInputs { pos: &qpos[a..b], stream: &stream[a..b], key_range: &key_range[a..b], keys: &keys };
                        let mut got = vec![0.25f32; (b - a) * n_head * hd];
                        attention(&pool, &kv, &p, &inp, &q[a * n_head * hd..b * n_head * hd], &mut got, &mut scratch, stride);
                        let w = &want[a * n_head * hd..b * n_head * hd];
                        let bad = w.iter().zip(&got).position(|(x, y)| x.to_bits() != y.to_bits());
                        assert!(
                            bad.is_none(),
                            "{tk}/{tv} hd {hd}, {n_head}/{n_head_kv} heads, swa {n_swa} chunked {chunked} softcap {softcap} sinks {sink}, \
                             {threads} threads, tokens {a}..{b}: element {bad:?}"
                        );
                    }
                    for max_q in [1, 2, 5, 17] {
                        let inp = AttnInputs { pos: &qpos, stream: &stream, key_range: &key_range, keys: &keys };
                        let kscale = if softcap != 0.0 { p.scale / softcap } else { p.scale };
                        let mut got = vec![0.25f32; want.len()];
                        assert!(quant_passes(&pool, &kv, &p, &inp, &q, &mut got, kscale, max_q));
                        let bad = want.iter().zip(&got).position(|(x, y)| x.to_bits() != y.to_bits());
                        assert!(bad.is_none(), "{tk}/{tv} hd {hd}, {threads} threads, {max_q} queries per pass: element {bad:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn nonfa_passes_are_bit_identical_to_the_one_query_path() {
        // flash attention off (llama.cpp's mul_mat / soft_max / mul_mat): queries sharing a
        // pass give each query exactly `nonfa_head`'s bits (for its micro-batch size: one
        // token takes the vec_dots, more take tinyBLAS), for F16 / F32 / BF16 / quantized K
        // with an F16 or F32 V, causal / sliding-window / chunked masks, softcap and sinks,
        // two sequences in two streams, a query holding a NaN, 1..3 threads. Through
        // `attention`, so the dispatch is checked too.
        let size = TWO_STREAMS_SIZE;
        let cases = [
            (GgmlType::F16, GgmlType::F16, 9usize, 3usize, 64usize),
            (GgmlType::F16, GgmlType::F16, 4, 1, 40),
            (GgmlType::F32, GgmlType::F32, 4, 2, 32),
            (GgmlType::BF16, GgmlType::F16, 2, 1, 64),
            (GgmlType::Q8_0, GgmlType::F16, 6, 2, 64),
            (GgmlType::IQ4_NL, GgmlType::F32, 3, 3, 32),
        ];
        for (tk, tv, n_head, n_head_kv, hd) in cases {
            let mut r = Rng::new(77 + hd as u64 + n_head as u64);
            let TwoStreams { kv, keys, qpos, stream, key_range } = two_streams(tk, tv, n_head_kv * hd, false, &mut r);
            let n_q = qpos.len();
            let mut q = r.vec(n_q * n_head * hd, 1.5);
            q[3 * n_head * hd + 1] = f32::NAN;
            let sinks: Vec<f32> = (0..n_head).map(|h| 0.3 * h as f32 - 0.5).collect();
            for p in mask_variants(n_head, n_head_kv, hd, &sinks) {
                for threads in 1..=3 {
                    let pool = ThreadPool::new(threads);
                    let stride = scratch_per_thread(size, hd, hd);
                    let mut scratch = vec![0f32; stride * threads];
                    for (a, b) in [(0, n_q), (22, 23), (19, 27), (25, 26)] {
                        let mut want = vec![0f32; (b - a) * n_head * hd];
                        for t in a..b {
                            let ks = &keys[key_range[t].0 as usize..key_range[t].1 as usize];
                            let (lo, hi) = visible_range(&p, ks, qpos[t]);
                            for h in 0..n_head {
                                let o = &mut want[((t - a) * n_head + h) * hd..][..hd];
                                if lo < hi {
                                    nonfa_head(&kv, &p, &q[(t * n_head + h) * hd..][..hd], stream[t] as usize, h, &ks[lo..hi], o, b - a);
                                }
                            }
                        }
                        let inp = AttnInputs { pos: &qpos[a..b], stream: &stream[a..b], key_range: &key_range[a..b], keys: &keys };
                        let mut got = vec![0.25f32; want.len()];
                        attention(&pool, &kv, &p, &inp, &q[a * n_head * hd..b * n_head * hd], &mut got, &mut scratch, stride);
                        let bad = want.iter().zip(&got).position(|(x, y)| x.to_bits() != y.to_bits());
                        assert!(
                            bad.is_none(),
                            "{tk}/{tv} hd {hd}, {n_head}/{n_head_kv} heads, swa {} chunked {} softcap {}, {threads} threads, tokens {a}..{b}: element {bad:?}",
                            p.n_swa, p.chunked, p.softcap
                        );
                    }
                }
            }
        }
    }

    /// The chunked reference for (token t, head h): the one-query kernel over each chunk of
    /// `kc` keys of the visible range, folded in key order, then the sink and 1/S.
    #[allow(clippy::too_many_arguments)]
    fn chunked_reference(kv: &KvCache, p: &AttnParams, q: &[f32], keys: &[(i32, u32)], pos: i32, t: usize, h: usize, kc: usize, o: &mut [f32]) {
        let hd = p.hd_v;
        let r = visible_range(p, keys, pos);
        o.fill(0.0);
        if r.0 == r.1 {
            return;
        }
        let (mut m, mut s) = (0f32, 0f32);
        let mut part = vec![0f32; hd];
        for k in 0..n_chunks(r, kc) {
            let (a, b) = chunk_of(r, k, kc);
            let (mc, sc) = one_chunk_head_state(kv, p, &q[(t * p.n_head + h) * p.hd_k..][..p.hd_k], 0, h, &keys[a..b], &mut part).unwrap();
            // the accumulator is f16 (exactly representable): back to its bits
            let bits: Vec<u16> = part.iter().map(|&x| half::f16::from_f32(x).to_bits()).collect();
            merge_chunk(o, &mut m, &mut s, k == 0, &bits, mc, sc);
        }
        finish(o, m, s, p.sinks.map(|sk| sk[h]));
    }

    #[test]
    fn f16_long_ranges_fold_fixed_chunks_whatever_the_split() {
        // Queries that see more than kv_chunk keys: each chunk of kv_chunk keys from the
        // first visible one through the one-query kernel, folded in order. The bits do not
        // depend on the threads, the pass size or the work split (passes in prefill, chunk
        // items or slots in a decode step), for causal / sliding-window masks and sinks.
        let size = 1024usize;
        let splits = CHUNK_SPLITS.load(std::sync::atomic::Ordering::Relaxed);
        for (n_head, n_head_kv, hd) in [(6usize, 2usize, 64usize), (9, 3, 64), (4, 1, 256), (3, 3, 48)] {
            let kw = n_head_kv * hd;
            let mut r = Rng::new(91 + hd as u64);
            let kv = random_f16_cache(kw, size, &mut r, 1.0);
            let n_keys = 600usize;
            let keys: Vec<(i32, u32)> = (0..n_keys).map(|p| (p as i32, ((p * 3) % size) as u32)).collect();
            let sinks: Vec<f32> = (0..n_head).map(|h| 0.2 * h as f32 - 0.3).collect();
            // a prefill batch (the last 40 positions), a 2-token and a 1-token decode step
            for qpos in [(560..600).collect::<Vec<i32>>(), vec![599, 420], vec![599]] {
                let n_q = qpos.len();
                let q = r.vec(n_q * n_head * hd, 3.0);
                for (n_swa, sink) in [(0usize, false), (0, true), (300, false)] {
                    let p = AttnParams { n_swa, sinks: if sink { Some(&sinks) } else { None }, ..AttnParams::causal(0, n_head, n_head_kv, hd) };
                    let stream = vec![0u32; n_q];
                    let key_range = vec![(0u32, n_keys as u32); n_q];
                    let inp = AttnInputs { pos: &qpos, stream: &stream, key_range: &key_range, keys: &keys };
                    for kc in [37usize, 128, 600] {
                        let mut want = vec![0f32; n_q * n_head * hd];
                        for (t, &pos) in qpos.iter().enumerate() {
                            for h in 0..n_head {
                                chunked_reference(&kv, &p, &q, &keys, pos, t, h, kc, &mut want[(t * n_head + h) * hd..][..hd]);
                            }
                        }
                        for threads in 1..=3 {
                            let pool = ThreadPool::new(threads);
                            for max_q in [3, 8, 64] {
                                let mut got = vec![f32::NAN; want.len()];
                                f16_passes(&pool, &kv, &p, &inp, &q, &mut got, p.scale, max_q, kc);
                                let bad = want.iter().zip(&got).position(|(a, b)| a.to_bits() != b.to_bits());
                                assert!(
                                    bad.is_none(),
                                    "hd {hd}, {n_head}/{n_head_kv} heads, {n_q} tokens, swa {n_swa} sinks {sink}, chunk {kc}, \
                                     {threads} threads, {max_q} queries per pass: element {bad:?}"
                                );
                            }
                        }
                        if kc == 600 {
                            // one chunk: the one-chunk kernel's bits
                            let mut one = vec![0f32; want.len()];
                            for (t, &pos) in qpos.iter().enumerate() {
                                let (lo, hi) = visible_range(&p, &keys, pos);
                                for h in 0..n_head {
                                    one_chunk_head(&kv, &p, &q[(t * n_head + h) * hd..][..hd], 0, h, &keys[lo..hi], &mut one[(t * n_head + h) * hd..][..hd]);
                                }
                            }
                            assert!(one.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()));
                        }
                    }
                }
            }
        }
        // some decode steps above took the chunk-item split (9 heads / 3 groups on 2 threads)
        assert!(CHUNK_SPLITS.load(std::sync::atomic::Ordering::Relaxed) > splits);
    }

    #[test]
    fn nonfa_softmax_vector_exps_are_the_scalar_ones_bit_for_bit() {
        // the soft_max's 8-lane ggml_v_expf (act::exp_sub_avx2) against the scalar
        // emulation the other kernel sets take: every 97th float of [-200, 100] and the
        // edges (ggml's |n| > 126 and > 192 branches, 0, -inf, NaN), as x - max with max 0
        let mut xs: Vec<f32> = vec![0.0, -0.0, f32::NEG_INFINITY, f32::NAN, -87.3, -88.8, -103.9, -126.5, -133.0, -192.5, 88.7, 89.0];
        let mut b = 0x8000_0000u32; // -0.0 upwards in magnitude to -200
        while f32::from_bits(b) >= -200.0 {
            xs.push(f32::from_bits(b));
            b += 97 * 1024;
        }
        let mut b = 0u32; // 0 to 100
        while f32::from_bits(b) <= 100.0 {
            xs.push(f32::from_bits(b));
            b += 97 * 1024;
        }
        xs.resize(xs.len().div_ceil(32) * 32, f32::NEG_INFINITY);
        if !crate::quant::table::kernels().avx2_math {
            return; // (the scalar form is the only one there)
        }
        #[cfg(target_arch = "x86_64")]
        for m in [0.0f32, 3.5, -20.0] {
            let mut w = xs.clone();
            let mut sum = 0f64;
            // SAFETY: avx2_math (checked above): AVX2 and FMA are present.
            unsafe { crate::ops::act::exp_sub_avx2(&mut w, m, &mut sum) };
            let mut want = 0f64;
            for (g, wg) in xs.chunks_exact(8).zip(w.chunks_exact(8)) {
                let e: Vec<f32> = g.iter().map(|&x| v_expf(x - m)).collect();
                want += crate::ops::vec::hsum8_ggml(&e) as f64;
                for (k, (a, b)) in wg.iter().zip(&e).enumerate() {
                    assert!(a.to_bits() == b.to_bits() || a.is_nan() && b.is_nan(), "exp({} - {m}): {a} against {b}", g[k]);
                }
            }
            assert!(sum.to_bits() == want.to_bits() || sum.is_nan() && want.is_nan());
        }
    }

    #[test]
    fn tinyblas_tile_is_tinyblas_dot_per_pair_bit_for_bit() {
        // every (key row, query row) of a 4 x KN tile against the one-pair dot, rows of 8-72
        // elements, longer query rows (only their first n read)
        let mut r = crate::testutil::Rng::new(5);
        for n in [8usize, 16, 40, 64, 72] {
            let q: Vec<Vec<f32>> = (0..4).map(|_| (0..n + 5).map(|_| r.next_f32() * 3.0).collect()).collect();
            let k: Vec<f32> = (0..3 * n).map(|_| r.next_f32() * 3.0).collect();
            let qr = [&q[0][..], &q[1][..], &q[2][..], &q[3][..]];
            let want = |kk: usize, c: usize| tinyblas_dot(&k[kk * n..(kk + 1) * n], &q[c][..n]).to_bits();
            let bits = |t: &[[f32; 4]]| t.iter().map(|d| d.map(f32::to_bits)).collect::<Vec<_>>();
            assert_eq!(bits(&tinyblas_tile::<1>(&k[..n], qr)), vec![std::array::from_fn::<u32, 4, _>(|c| want(0, c))], "n {n}");
            assert_eq!(bits(&tinyblas_tile::<2>(&k[..2 * n], qr)), (0..2).map(|kk| std::array::from_fn(|c| want(kk, c))).collect::<Vec<[u32; 4]>>(), "n {n}");
            assert_eq!(bits(&tinyblas_tile::<3>(&k, qr)), (0..3).map(|kk| std::array::from_fn(|c| want(kk, c))).collect::<Vec<[u32; 4]>>(), "n {n}");
        }
    }

    #[test]
    fn columns_dot_is_the_column_dots_bit_for_bit() {
        // the flash-attention-off V product row by row against the dots of V's transposed
        // columns that llama.cpp's mul_mat takes (tinyBLAS; ggml_vec_dot_f16 on f16 bits;
        // ggml_vec_dot_f32), with the mask's zero padding past the visible rows
        let mut r = Rng::new(0x5eed_c01d);
        for &(hv, n) in &[(8usize, 1usize), (64, 37), (72, 64), (256, 100), (64, 300)] {
            let np = n.div_ceil(32) * 32;
            let rows16: Vec<u16> = (0..n * hv).map(|_| half::f16::from_f32(r.next_f32() * 2.0).to_bits()).collect();
            let rows: Vec<f32> = rows16.iter().map(|&h| half::f16::from_bits(h).to_f32()).collect();
            let mut p: Vec<f32> = (0..np).map(|j| if j < n { half::f16::from_f32((r.next_f32() + 1.0) * 0.05).to_f32() } else { 0.0 }).collect();
            p[0] = -p[0]; // a negative weight too
            let col = |d: usize| -> Vec<f32> { (0..np).map(|j| if j < n { rows[j * hv + d] } else { 0.0 }).collect() };
            let col16 = |d: usize| -> Vec<u16> { (0..np).map(|j| if j < n { rows16[j * hv + d] } else { 0 }).collect() };
            let row = |j: usize, out: &mut [f32]| out.copy_from_slice(&rows[j * hv..(j + 1) * hv]);
            for lanes in [8, 32] {
                let mut o = vec![0f32; hv];
                columns_dot(hv, np, lanes, &p, n, row, &mut o);
                for d in 0..hv {
                    let want = if lanes == 8 { tinyblas_dot(&col(d), &p) } else { dot_f16_ggml(&col16(d), &p) };
                    assert_eq!(o[d].to_bits(), want.to_bits(), "hv {hv}, n {n}, lanes {lanes}, d {d}");
                    if lanes == 32 {
                        assert_eq!(o[d].to_bits(), dot_f32_ggml(&col(d), &p).to_bits(), "f32 dot, hv {hv}, n {n}, d {d}");
                    }
                }
            }
        }
    }

    #[test]
    fn causal_gqa_matches_the_reference() {
        // F16: the V accumulator is f16 (one rounding per key); F32 without flash attention: f32 throughout
        check(&BASE, GgmlType::F16, true, 4e-3);
        check(&BASE, GgmlType::F32, false, 2e-5);
        check(&Case { n_head: 6, n_head_kv: 1, ..BASE }, GgmlType::F16, true, 4e-3);
        check(&Case { n_head: 2, n_head_kv: 2, hd: 8, ..BASE }, GgmlType::F32, false, 2e-5);
    }

    #[test]
    fn sliding_window_and_chunked_masks_match_the_reference() {
        for t in [GgmlType::F16, GgmlType::F32] {
            let tol = if t == GgmlType::F16 { 4e-3 } else { 2e-5 };
            check(&Case { n_swa: 3, ..BASE }, t, t == GgmlType::F16, tol);
            check(&Case { n_swa: 4, chunked: true, ..BASE }, t, t == GgmlType::F16, tol);
        }
    }

    #[test]
    fn softcap_and_sinks_match_the_reference() {
        check(&Case { softcap: 1.5, ..BASE }, GgmlType::F16, true, 4e-3);
        check(&Case { sinks: true, ..BASE }, GgmlType::F16, true, 4e-3);
        check(&Case { sinks: true, n_swa: 3, ..BASE }, GgmlType::F32, false, 2e-5);
    }

    #[test]
    fn the_masks_change_the_result() {
        // the reference comparison can fail: a window changes the outputs
        let qpos = [9];
        let (full, _) = run(&BASE, GgmlType::F32, false, &qpos);
        let (swa, _) = run(&Case { n_swa: 3, ..BASE }, GgmlType::F32, false, &qpos);
        assert!(full.iter().zip(&swa).any(|(a, b)| (a - b).abs() > 1e-2));
        // chunks of 4: a query at position 12 starts a chunk with no keys (they end at 9):
        // it sees nothing and its output is zero
        let (none, _) = run(&Case { n_swa: 4, chunked: true, ..BASE }, GgmlType::F16, true, &[12]);
        assert!(none.iter().all(|&x| x == 0.0), "{none:?}");
    }
}
