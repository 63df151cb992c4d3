//! Attention of a micro-batch's queries over the KV cache: causal + sliding-window mask
//! by absolute position, GQA, optional logit softcap, threads over (token, head).
//!
//! Each query sees the cells of its (first) sequence with pos <= its own position (and,
//! on sliding-window layers, pos > its position - n_swa: llama.cpp's `is_masked_swa`
//! masks when p1 - p0 >= n_swa). The keys come sorted by position (`KvCache::keys_of`),
//! and the softmax is computed in two passes over them in that order (scores, then
//! max-subtracted exponentials accumulated with V), so the result depends only on the
//! sequence's keys, never on the cells they landed in, the micro-batch size, other
//! sequences or the thread count: the basis of pyllama's determinism guarantee.
//!
//! Shapes: q [n_tokens, n_head * hd_k], out [n_tokens, n_head * hd_v].

use crate::ggml_type::GgmlType;
use crate::kv_cache::KvCache;
use crate::ops::vec::{axpy_f16, axpy_f32, dot_f16, dot_f32};
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
    n_kv_max + hd_k + hd_v + 32
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

    pool.run(&|ith, nth| {
        let i0 = n_items * ith / nth;
        let i1 = n_items * (ith + 1) / nth;
        if i0 >= i1 {
            return;
        }
        // SAFETY: each thread owns scratch [ith*stride, (ith+1)*stride) and the output
        // head slices of its items; items never overlap between threads.
        let scr = unsafe { std::slice::from_raw_parts_mut(scr_ptr.get().add(ith * scratch_stride), scratch_stride) };
        let (scores, rest) = scr.split_at_mut(scratch_stride - p.hd_k - p.hd_v - 32);
        let (kbuf, rest) = rest.split_at_mut(p.hd_k);
        let vbuf = &mut rest[..p.hd_v];
        for item in i0..i1 {
            let t = item / p.n_head;
            let h = item % p.n_head;
            let g = h / group;
            let qh = &q[t * qw + h * p.hd_k..t * qw + (h + 1) * p.hd_k];
            let o = unsafe { std::slice::from_raw_parts_mut(out_ptr.get().add(t * ow + h * p.hd_v), p.hd_v) };
            let pos = inp.pos[t];
            let stream = inp.stream[t] as usize;
            let (r0, r1) = inp.key_range[t];
            let keys = &inp.keys[r0 as usize..r1 as usize];
            let hi = keys.partition_point(|k| k.0 <= pos);
            let lo = if p.n_swa > 0 {
                let w = p.n_swa as i64;
                keys[..hi].partition_point(|k| pos as i64 - k.0 as i64 >= w)
            } else {
                0
            };
            let vis = &keys[lo..hi];
            o.fill(0.0);
            if vis.is_empty() {
                continue;
            }
            // pass 1: scores
            let mut m = f32::NEG_INFINITY;
            for (j, &(_, cell)) in vis.iter().enumerate() {
                let row = kv.k_row(p.il, stream, cell as usize);
                let kb = &row[koff(g)..koff(g) + kbytes];
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
                s *= p.scale;
                if p.softcap != 0.0 {
                    s = p.softcap * (s / p.softcap).tanh();
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
                let vb = &row[voff(g)..voff(g) + vbytes];
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
