//! Attention of a micro-batch's queries over the KV cache: causal + sliding-window mask
//! by absolute position, GQA, optional logit softcap, threads over (token, head).
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
//! step and every micro-batch of fewer than 64 queries: q rounded to f16, q.k over f16,
//! an online softmax, and the V accumulator kept in f16 (`ggml_vec_mad_f16`, one rounding
//! per key). Reproducing it keeps pyllama's logits within float noise of llama.cpp's on
//! real models, where a plain f32 softmax drifts by ~0.2 logits on Gemma 3 (checked
//! against llama-eval-callback: kqv_out-0 then matches to every printed digit). pyllama
//! uses it for every micro-batch size (llama.cpp switches to an f32 tiled kernel for
//! >= 64 queries), which is what keeps results independent of n_ubatch. For F32 / Q8_0
//! caches: scores, then max-subtracted exponentials accumulated with V, in f32.
//!
//! Shapes: q [n_tokens, n_head * hd_k], out [n_tokens, n_head * hd_v].

use crate::ggml_type::GgmlType;
use crate::kv_cache::KvCache;
use crate::ops::vec::{
    axpy_f16, axpy_f32, dot_f16, dot_f16_ggml, dot_f16_ggml_2, dot_f32, mad_f16_acc_n, scale_f16_acc,
};
use crate::threadpool::ThreadPool;

pub struct AttnParams {
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

struct SendPtr(*mut f32);
unsafe impl Sync for SendPtr {}
unsafe impl Send for SendPtr {}
impl SendPtr {
    #[inline]
    fn get(&self) -> *mut f32 {
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
    let scr_ptr = SendPtr(scratch.as_mut_ptr());
    let group = p.n_head / p.n_head_kv;
    let (tk, tv) = (kv.type_k, kv.type_v);
    let koff = |g: usize| tk.row_size(g * p.hd_k).unwrap_or(0);
    let voff = |g: usize| tv.row_size(g * p.hd_v).unwrap_or(0);
    let kbytes = tk.row_size(p.hd_k).unwrap_or(0);
    let vbytes = tv.row_size(p.hd_v).unwrap_or(0);
    // ggml folds the softcap into the scale: s = c * tanh(q.k * scale / c)
    let kscale = if p.softcap != 0.0 { p.scale / p.softcap } else { p.scale };
    let aligned = |b: &[u8]| as_u16(b).is_some();
    let f16_kernel = tk == GgmlType::F16
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
        let lo = if p.n_swa > 0 {
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
    let tiled = f16_kernel && n_tokens >= 64 && p.softcap == 0.0 && crate::quant::avx2::llamacpp_order();
    #[cfg(not(target_arch = "x86_64"))]
    let tiled = false;

    if f16_kernel && !tiled {
        // llama.cpp's one_chunk flash attention for F16 K/V (see the module doc), for all
        // the heads of a GQA group at once: they see the same keys, so each K and V row
        // is converted from f16 once per group instead of once per head, and the heads'
        // dot products run as independent chains. Per head, the operations and their
        // order are exactly those of the single-head kernel.
        // Items are (token, heads); thread ith takes items ith, ith + nth, ...: a causal
        // batch's later tokens see more keys, and contiguous ranges left the first thread
        // idle for most of the region.
        // Heads per item: the whole group when there are enough items to share out
        // (prefill), else fewer (a single-token decode of Gemma 3 has one KV head: one
        // item would leave the other threads idle). Per head the result is the same.
        let sub = [group, 2, 1]
            .into_iter()
            .find(|&s| s <= group && group % s == 0 && n_tokens * (p.n_head / s) >= 4 * pool.n_threads())
            .unwrap_or(1);
        let per_tok = p.n_head / sub;
        let n_items = n_tokens * per_tok;
        pool.run(&|ith, nth| {
            let (hk, hv) = (p.hd_k, p.hd_v);
            let mut qb = vec![0f32; sub * hk];
            let mut acc = vec![0u16; sub * hv];
            let mut m = vec![0f32; sub];
            let mut ssum = vec![0f32; sub];
            let mut sc = vec![0f32; sub];
            let mut vs = vec![0f32; sub];
            let mut item = ith;
            while item < n_items {
                let t = item / per_tok;
                let h0 = item % per_tok * sub;
                let g = h0 / group; // the KV head of heads h0..h0 + sub (sub divides group)
                item += nth;
                // SAFETY: heads h0..h0 + sub of token t belong to this item only.
                let o = unsafe { std::slice::from_raw_parts_mut(out_ptr.get().add(t * ow + h0 * hv), sub * hv) };
                o.fill(0.0);
                let vis = visible(t);
                if vis.is_empty() {
                    continue;
                }
                let stream = inp.stream[t] as usize;
                let (ko, vo) = (koff(g), voff(g));
                for (d, x) in qb.iter_mut().zip(&q[t * qw + h0 * hk..t * qw + (h0 + sub) * hk]) {
                    *d = half::f16::from_f32(*x).to_f32();
                }
                acc.fill(0);
                m.fill(f32::NEG_INFINITY);
                ssum.fill(0.0);
                for &(_, cell) in vis.iter() {
                    let row = kv.k_row(p.il, stream, cell as usize);
                    let k16 = as_u16(&row[ko..ko + kbytes]).unwrap_or(&[]);
                    let mut j = 0;
                    while j + 2 <= sub {
                        let (s0, s1) = dot_f16_ggml_2(k16, &qb[j * hk..(j + 1) * hk], &qb[(j + 1) * hk..(j + 2) * hk]);
                        sc[j] = s0 * kscale;
                        sc[j + 1] = s1 * kscale;
                        j += 2;
                    }
                    if j < sub {
                        sc[j] = dot_f16_ggml(k16, &qb[j * hk..(j + 1) * hk]) * kscale;
                    }
                    for j in 0..sub {
                        let mut s = sc[j];
                        if p.softcap != 0.0 {
                            s = p.softcap * s.tanh();
                        }
                        let mut ms = 1.0f32;
                        let mut v = 1.0f32;
                        if s > m[j] {
                            let m_old = m[j];
                            m[j] = s;
                            ms = (m_old - s).exp();
                            scale_f16_acc(&mut acc[j * hv..(j + 1) * hv], ms);
                        } else {
                            v = (s - m[j]).exp();
                        }
                        vs[j] = v;
                        ssum[j] = crate::ops::vec::fmaf(ssum[j], ms, v); // GCC: fma(S, ms, vs)
                    }
                    let row = kv.v_row(p.il, stream, cell as usize);
                    let v16 = as_u16(&row[vo..vo + vbytes]).unwrap_or(&[]);
                    mad_f16_acc_n(&mut acc, hv, &vs, v16);
                }
                for j in 0..sub {
                    let inv = if ssum[j] == 0.0 { 0.0 } else { 1.0 / ssum[j] };
                    for (d, a) in o[j * hv..(j + 1) * hv].iter_mut().zip(&acc[j * hv..(j + 1) * hv]) {
                        *d = half::f16::from_bits(*a).to_f32() * inv;
                    }
                }
            }
        });
        return;
    }

    pool.run(&|ith, nth| {
        if ith >= n_items {
            return;
        }
        // SAFETY: each thread owns scratch [ith*stride, (ith+1)*stride) and the output
        // head slices of its items; items never overlap between threads.
        let scr = unsafe { std::slice::from_raw_parts_mut(scr_ptr.get().add(ith * scratch_stride), scratch_stride) };
        let hmax = p.hd_k.max(p.hd_v);
        let (scores, rest) = scr.split_at_mut(scratch_stride - p.hd_k - p.hd_v - hmax - 32);
        let (kbuf, rest) = rest.split_at_mut(p.hd_k);
        let (vbuf, _) = rest.split_at_mut(p.hd_v);
        // strided items, as in the F16 kernel above (balanced causal work)
        for item in (ith..n_items).step_by(nth) {
            let t = item / p.n_head;
            let h = item % p.n_head;
            let g = h / group;
            let qh = &q[t * qw + h * p.hd_k..t * qw + (h + 1) * p.hd_k];
            let (ko, vo) = (koff(g), voff(g));
            let o = unsafe { std::slice::from_raw_parts_mut(out_ptr.get().add(t * ow + h * p.hd_v), p.hd_v) };
            let stream = inp.stream[t] as usize;
            let vis = visible(t);
            o.fill(0.0);
            if vis.is_empty() {
                continue;
            }
            if tiled {
                let k_of = |cell: u32| as_u16(&kv.k_row(p.il, stream, cell as usize)[ko..ko + kbytes]).unwrap_or(&[]);
                let v_of = |cell: u32| as_u16(&kv.v_row(p.il, stream, cell as usize)[vo..vo + vbytes]).unwrap_or(&[]);
                if crate::ops::attention_tiled::attend(qh, vis, &k_of, &v_of, kscale, o) {
                    continue;
                }
            }
            // pass 1: scores
            let mut m = f32::NEG_INFINITY;
            for (j, &(_, cell)) in vis.iter().enumerate() {
                let row = kv.k_row(p.il, stream, cell as usize);
                let kb = &row[ko..ko + kbytes];
                let mut s = match tk {
                    GgmlType::F16 => match as_u16(kb) {
                        Some(k16) => dot_f16(k16, qh),
                        None => {
                            let _ = crate::quant::dequantize_row(tk, kb, kbuf);
                            dot_f32(kbuf, qh)
                        }
                    },
                    _ => {
                        let _ = crate::quant::dequantize_row(tk, kb, kbuf);
                        dot_f32(kbuf, qh)
                    }
                };
                s *= kscale;
                if p.softcap != 0.0 {
                    s = p.softcap * s.tanh();
                }
                scores[j] = s;
                if s > m {
                    m = s;
                }
            }
            // pass 2: softmax weights times V, summed in key order
            let mut sum = 0f32;
            for (j, &(_, cell)) in vis.iter().enumerate() {
                let e = (scores[j] - m).exp();
                sum += e;
                let row = kv.v_row(p.il, stream, cell as usize);
                let vb = &row[vo..vo + vbytes];
                match tv {
                    GgmlType::F16 => match as_u16(vb) {
                        Some(v16) => axpy_f16(o, e, v16),
                        None => {
                            let _ = crate::quant::dequantize_row(tv, vb, vbuf);
                            axpy_f32(o, e, vbuf)
                        }
                    },
                    _ => {
                        let _ = crate::quant::dequantize_row(tv, vb, vbuf);
                        axpy_f32(o, e, vbuf)
                    }
                }
            }
            let inv = 1.0 / sum;
            for x in o.iter_mut() {
                *x *= inv;
            }
        }
    });
}
