//! What encoder (BERT-family) forward passes share, after llama.cpp's no-cache attention
//! (`build_attn_inp_no_cache`, src/llama-graph.cpp) and its rank pooling head
//! (`build_pooling` with LLAMA_POOLING_TYPE_RANK):
//!
//!   (llama.cpp's `create_tensor_qkv`);
//! - `Step::build_attn_enc`: attention among the micro-batch's own tokens, no KV cache.
//!   Token i sees token j when their first sequence ids are equal (no causal mask),
//!   within an optional symmetric window, with ALiBi (`-|p_i - p_j|` times the head's
//!   slope) or a T5 relative-position bias added to the scores. llama.cpp encodes a
//!   whole batch in one micro-batch, so every token of a sequence is there;
//! - `ClsHead`: the classifier head of rerankers (`cls`, `cls_b`, tanh / GELU, optional
//!   `cls_norm`, `cls.output`, `cls.output` bias, softmax for qwen3 rerankers) over
//!   the pooled vector.

use super::graph::{add_bias, par_rows, AttnWeights, Norm};
use super::loader::Loader;
use crate::cb;
use crate::context::Step;
use crate::error::{Error, Result};
use crate::model::TensorView;
use crate::ops::act;
use crate::ops::matmul::try_matmul_rows;
use crate::ops::norm::{layer_norm_row, rms_norm_row};
use crate::ops::rope::RopeParams;
use crate::ops::attention::{tinyblas_dot, v_expf};
use crate::ops::vec::fmaf;
use crate::threadpool::ThreadPool;

/// q / k norms of encoder layers: LayerNorm with bias over the whole projection (bert's
/// jina variants), or RMSNorm per head (gemma-embedding, qwen3).
pub enum QkNorm<'w> {
    Layer { q: (&'w [f32], Option<&'w [f32]>), k: (&'w [f32], Option<&'w [f32]>), eps: f32 },
    RmsHead { q: &'w [f32], k: &'w [f32], eps: f32 },
}

/// T5's relative-position bias: `rel` {n_head rows of n_buckets} (ggml {n_head, n_buckets}).
pub struct RelBias<'w> {
    pub rel: &'w [f32],
    pub n_buckets: usize,
}

impl RelBias<'_> {
    /// llama.cpp's `llama_relative_position_bucket(x = key pos, y = query pos,
    /// n_buckets, bidirectional = true)`.
    pub fn bucket(&self, x: i32, y: i32) -> usize {
        let max_distance = 128i64;
        let nb = (self.n_buckets / 2) as i64;
        let me = nb / 2;
        let rel = x - y;
        let mut b = if rel > 0 { nb } else { 0 };
        let rel = rel.unsigned_abs() as i64;
        if rel < me {
            return (b + rel) as usize;
        }
        // floorf(max_exact + logf(rel / max_exact) * (nb - max_exact) / log(max_distance / max_exact)),
        // in C's types: a float product divided by a double
        let a = ((rel as f64 / me as f64) as f32).ln() * (nb - me) as f32;
        let large = ((me as f64 + a as f64 / (max_distance as f64 / me as f64).ln()) as f32).floor() as i64;
        b += large.min(nb - 1);
        b as usize
    }
}

/// How an encoder layer attends.
pub struct EncAttn<'r> {
    pub il: usize,
    pub rope: Option<&'r RopeParams>,
    pub qk_norm: Option<QkNorm<'r>>,
    /// Multiplies q.k (+ the relative bias) in the softmax.
    pub kq_scale: f32,
    /// ALiBi's max bias (0: none).
    pub max_alibi_bias: f32,
    /// Symmetric window: tokens farther apart than n_swa / 2 do not see each other (0: none).
    pub n_swa: usize,
    pub rel_bias: Option<RelBias<'r>>,
}

/// ggml's ALiBi slope of head h (ggml_compute_forward_soft_max_f32).
fn alibi_slope(max_bias: f32, n_head: usize, h: usize) -> f32 {
    if max_bias <= 0.0 {
        return 1.0;
    }
    let n_head_log2 = 1u32 << (n_head as f32).log2().floor() as u32;
    let m0 = 2f32.powf(-max_bias / n_head_log2 as f32);
    let m1 = 2f32.powf(-(max_bias / 2.0) / n_head_log2 as f32);
    if (h as u32) < n_head_log2 {
        m0.powi(h as i32 + 1)
    } else {
        m1.powi(2 * (h as i32 - n_head_log2 as i32) + 1)
    }
}

struct Ptr(*mut f32);
unsafe impl Sync for Ptr {}
impl Ptr {
    fn get(&self) -> *mut f32 {
        self.0
    }
}

/// tinyBLAS's horizontal sum of one 8-lane accumulator: (l + l4), then (t0 + t2) + (t1 + t3).
#[inline]
fn hsum8_tiny(a: &[f32; 8]) -> f32 {
    let h = [a[0] + a[4], a[1] + a[5], a[2] + a[6], a[3] + a[7]];
    (h[0] + h[2]) + (h[1] + h[3])
}

/// tinyBLAS's dot of a V^T row (`val(u)` for key u) with the probabilities `p` of the
/// visible keys `vis` (ascending), the other keys' weights being 0: key u in lane u % 8.
fn kqv_tinyblas(vis: &[u32], p: &[f32], val: impl Fn(usize) -> f32) -> f32 {
    let mut acc = [0f32; 8];
    for (&u, &w) in vis.iter().zip(p) {
        let u = u as usize;
        acc[u % 8] = fmaf(val(u), w, acc[u % 8]);
    }
    hsum8_tiny(&acc)
}

/// Whether ggml_vec_dot_f32 adds element `i` of `n` (past its blocks of 32) fused: GCC
/// (llama.cpp's x86 AVX2 build) compiles the leftover loop `sumf += x[i]*y[i]` as groups of
/// 8 then one of 4 products, each product rounded and added in order, and the last 0..3
/// elements as FMAs (contracted).
#[inline]
fn tail_fused(i: usize, n: usize) -> bool {
    let np = n / 32 * 32;
    let r = n - np;
    let mut unfused = r / 8 * 8;
    if r - unfused >= 4 {
        unfused += 4;
    }
    i >= np + unfused
}

/// The 4 x 8 blocks of ggml_vec_dot_f32 (AVX2: fused lanes over blocks of 32), reduced
/// (s0 + s2) + (s1 + s3), then lanes l + l4, hadd, hadd.
#[inline]
fn reduce_blocks(s: &[[f32; 8]; 4]) -> f32 {
    let v: [f32; 8] = std::array::from_fn(|l| (s[0][l] + s[2][l]) + (s[1][l] + s[3][l]));
    let t0 = [v[0] + v[4], v[1] + v[5], v[2] + v[6], v[3] + v[7]];
    (t0[0] + t0[1]) + (t0[2] + t0[3])
}

/// ggml_vec_dot_f32 (llama.cpp's x86 AVX2 build, see `tail_fused`) of a V^T row of `n`
/// keys (`val(u)` for key u) with `p` on the visible keys `vis` (ascending), 0 elsewhere:
/// a zero weight leaves every accumulator as it was.
fn kqv_vec_dot(n: usize, vis: &[u32], p: &[f32], val: impl Fn(usize) -> f32) -> f32 {
    let np = n / 32 * 32;
    let mut s = [[0f32; 8]; 4];
    let mut first_tail = vis.len();
    for (j, (&u, &w)) in vis.iter().zip(p).enumerate() {
        let u = u as usize;
        if u >= np {
            first_tail = j;
            break;
        }
        let (b, l) = ((u % 32) / 8, u % 8);
        s[b][l] = fmaf(val(u), w, s[b][l]);
    }
    let mut sum = reduce_blocks(&s);
    for (&u, &w) in vis[first_tail..].iter().zip(&p[first_tail..]) {
        let u = u as usize;
        sum = if tail_fused(u, n) { fmaf(val(u), w, sum) } else { sum + val(u) * w };
    }
    sum
}

/// ggml_vec_dot_f32 of two rows (the order of `kqv_vec_dot`).
fn vec_dot_f32(x: &[f32], y: &[f32]) -> f32 {
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
    let mut sum = reduce_blocks(&s);
    for i in np..n {
        sum = if tail_fused(i, n) { fmaf(x[i], y[i], sum) } else { sum + x[i] * y[i] };
    }
    sum
}

impl Step<'_> {
    /// Each token's keys for encoder attention: the micro-batch's tokens with the same
    /// first sequence id (llama.cpp's no-cache mask), in micro-batch order, into
    /// `enc_keys` with the ranges in `key_range`.
    pub fn enc_key_lists(&mut self) {
        let n = self.n;
        let b = &mut *self.b;
        b.enc_keys.clear();
        b.key_range.clear();
        b.key_range.resize(n, (0, 0));
        for t in 0..n {
            let s = b.seq0[t];
            if let Some(prev) = (0..t).find(|&u| b.seq0[u] == s) {
                b.key_range[t] = b.key_range[prev];
                continue;
            }
            let r0 = b.enc_keys.len() as u32;
            for u in t..n {
                if b.seq0[u] == s {
                    b.enc_keys.push(u as u32);
                }
            }
            b.key_range[t] = (r0, b.enc_keys.len() as u32);
        }
    }

    /// Encoder self-attention: in `cur` [n, n_embd], out `tmp` [n, n_embd]; q/k borrow
    /// `gate`/`up` as in `build_attn`. In llama.cpp's float order with flash attention off
    /// (f32 K and V, ggml_vec_dot_f32 / tinyBLAS by shape, soft_max_ext over the whole
    /// micro-batch), as its x86 AVX2 build computes it: a token's result depends on the
    /// positions of its sequence's tokens in the micro-batch, as llama.cpp's does.
    pub fn build_attn_enc(&mut self, w: &AttnWeights, c: &EncAttn) -> Result<()> {
        self.with_qk_scratch(|st| st.attn_enc_inner(w, c))
    }

    fn attn_enc_inner(&mut self, w: &AttnWeights, c: &EncAttn) -> Result<()> {
        let hp = self.hp;
        let il = c.il;
        let n = self.n;
        let (n_head, n_head_kv) = (hp.n_head(il), hp.n_head_kv(il));
        let (hd_k, hd_v) = (hp.n_embd_head_k, hp.n_embd_head_v);
        let (qw, kw, vw) = self.project_qkv(w, il, false)?;
        let b = &mut *self.b;
        match &c.qk_norm {
            None => {}
            Some(QkNorm::Layer { q, k, eps }) => {
                let e = *eps;
                par_rows(self.pool, &mut b.q, qw, n, &|_, r| layer_norm_row(r, Some(q.0), q.1, e));
                par_rows(self.pool, &mut b.k, kw, n, &|_, r| layer_norm_row(r, Some(k.0), k.1, e));
            }
            Some(QkNorm::RmsHead { q, k, eps }) => {
                for h in b.q[..n * qw].chunks_exact_mut(hd_k) {
                    rms_norm_row(h, Some(q), *eps);
                }
                for h in b.k[..n * kw].chunks_exact_mut(hd_k) {
                    rms_norm_row(h, Some(k), *eps);
                }
            }
        }
        if let Some(r) = c.rope {
            let pos = &b.pos;
            if hd_k > 512 {
                return Err(Error::Unsupported(format!("encoder rope with head size {hd_k} > 512")));
            }
            let rope_row = |t: usize, row: &mut [f32]| {
                let mut cache = [0f32; 512];
                r.apply_heads(row, hd_k, pos[t], &mut cache[..hd_k]);
            };
            par_rows(self.pool, &mut b.q, qw, n, &rope_row);
            par_rows(self.pool, &mut b.k, kw, n, &rope_row);
        }
        cb!(self, "Qcur", il, q, qw);
        cb!(self, "Kcur", il, k, kw);
        cb!(self, "Vcur", il, v, vw);
        let b = &mut *self.b;
        let (q, k, v) = (&b.q[..n * qw], &b.k[..n * kw], &b.v[..n * vw]);
        let (pos, keys, ranges) = (&b.pos[..n], &b.enc_keys, &b.key_range[..n]);
        let aw = n_head * hd_v;
        let att = Ptr(b.att.as_mut_ptr());
        let max_keys = ranges.iter().map(|r| (r.1 - r.0) as usize).max().unwrap_or(0);
        let group = n_head / n_head_kv;
        let half_swa = (c.n_swa / 2) as i64;
        let slopes: Vec<f32> = (0..n_head).map(|h| alibi_slope(c.max_alibi_bias, n_head, h)).collect();
        // llama.cpp's no-cache attention with flash attention off (build_attn_mha): every
        // row of kq spans the whole micro-batch (n_kv = n), masked keys weigh exactly 0.
        //   kq = mul_mat(K, q): q permuted is not contiguous (unless one head or one token),
        //        so ggml_vec_dot_f32 per score, else tinyBLAS when its shapes allow;
        //   soft_max_ext: kq * scale + slope * mask, exp(x - max) through ggml_v_expf in
        //        lane groups of 8 over the n entries (libm expf past the last group), each
        //        group summed in f32 then in f64, times (float)(1 / sum);
        //   kqv = mul_mat(V^T, kq): tinyBLAS (n >= 2, n % 8 == 0, hd_v % 4 == 0), else
        //        ggml_vec_dot_f32. A key that weighs 0 leaves its lane's accumulator as it
        //        was, so only the visible keys are visited, each in its own lane.
        let q_cont = n_head == 1 || n == 1;
        let kq_tiny = q_cont && n >= 2 && hd_k % 8 == 0 && n % 4 == 0;
        let kqv_tiny = n >= 2 && n % 8 == 0 && hd_v % 4 == 0;
        let work = |t0: usize, t1: usize| {
            let mut s = vec![0f32; max_keys];
            let mut vis = vec![0u32; max_keys];
            let mut row = vec![0f32; n];
            for t in t0..t1 {
                // SAFETY: token rows of att are disjoint and each is written by one thread.
                let out = unsafe { std::slice::from_raw_parts_mut(att.get().add(t * aw), aw) };
                let (r0, r1) = ranges[t];
                let pt = pos[t];
                let mut nv = 0;
                for &u in &keys[r0 as usize..r1 as usize] {
                    let pu = pos[u as usize];
                    if half_swa > 0 && (pt as i64 - pu as i64).abs() > half_swa {
                        continue;
                    }
                    vis[nv] = u;
                    nv += 1;
                }
                let vis = &vis[..nv];
                for h in 0..n_head {
                    let hk = h / group;
                    let qh = &q[t * qw + h * hd_k..t * qw + (h + 1) * hd_k];
                    let mut m = f32::NEG_INFINITY;
                    for (j, &u) in vis.iter().enumerate() {
                        let u = u as usize;
                        let pu = pos[u];
                        let kh = &k[u * kw + hk * hd_k..u * kw + (hk + 1) * hd_k];
                        let mut x = if kq_tiny { tinyblas_dot(kh, qh) } else { vec_dot_f32(kh, qh) };
                        if let Some(rb) = &c.rel_bias {
                            x += rb.rel[rb.bucket(pu, pt) * n_head + h];
                        }
                        let mut y = x * c.kq_scale;
                        if c.max_alibi_bias > 0.0 {
                            y += slopes[h] * (-((pu - pt).abs() as f32));
                        }
                        s[j] = y;
                        m = m.max(y);
                    }
                    // exp(x - max) in place, and the whole row (zeros where masked) for the sum
                    row.fill(0.0);
                    let n8 = n / 8 * 8;
                    for (j, &u) in vis.iter().enumerate() {
                        let u = u as usize;
                        let e = if u < n8 { v_expf(s[j] - m) } else { (s[j] - m).exp() };
                        s[j] = e;
                        row[u] = e;
                    }
                    let mut sum = 0f64;
                    for g in row[..n8].chunks_exact(8) {
                        sum += hsum8_tiny(&[g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7]]) as f64;
                    }
                    for &e in &row[n8..] {
                        sum += e as f64;
                    }
                    let inv = (1.0 / sum) as f32;
                    for e in s[..nv].iter_mut() {
                        *e *= inv;
                    }
                    let oh = &mut out[h * hd_v..(h + 1) * hd_v];
                    let voff = hk * hd_v;
                    for (d, o) in oh.iter_mut().enumerate() {
                        let val = |u: usize| v[u * vw + voff + d];
                        *o = if kqv_tiny { kqv_tinyblas(vis, &s[..nv], val) } else { kqv_vec_dot(n, vis, &s[..nv], val) };
                    }
                }
            }
        };
        if n == 1 || self.pool.n_threads() == 1 {
            work(0, n);
        } else {
            self.pool.run(&|ith, nth| work(n * ith / nth, n * (ith + 1) / nth));
        }
        cb!(self, "kqv_out", il, att, aw);
        let b = &mut *self.b;
        Self::mm(self.pool, self.dev, w.wo, &b.att, n, &mut b.tmp, &mut b.mm_scratch, &mut b.lora)?;
        add_bias(&mut b.tmp, w.bo, hp.n_embd, n);
        cb!(self, "attn_out", il, tmp, hp.n_embd);
        Ok(())
    }

    /// x [n, n_embd] = norm(x) * w (+ b), in place.
    pub fn norm_x(&mut self, w: &[f32], bias: Option<&[f32]>, kind: Norm, eps: f32) {
        let (ne, n) = (self.hp.n_embd, self.n);
        match kind {
            Norm::Layer => par_rows(self.pool, &mut self.b.x, ne, n, &|_, r| layer_norm_row(r, Some(w), bias, eps)),
            Norm::Rms => par_rows(self.pool, &mut self.b.x, ne, n, &|_, r| rms_norm_row(r, Some(w), eps)),
        }
    }

    /// The final hidden states x [n, n_embd] (after `select_outputs`) into the embeddings
    /// output rows (llama.cpp's `t_embd`).
    pub fn write_hidden(&mut self) {
        let ne = self.hp.n_embd;
        cb!(self, "result_embd", -1, x, ne);
        let b = &*self.b;
        if let Some(h) = self.hidden.as_deref_mut() {
            for (j, &r) in b.out_row.iter().enumerate() {
                h[r * ne..(r + 1) * ne].copy_from_slice(&b.x[j * ne..(j + 1) * ne]);
            }
        }
    }
}

/// The classifier head of a reranker (llama.cpp's build_pooling, LLAMA_POOLING_TYPE_RANK).
pub struct ClsHead {
    cls: Option<TensorView<'static>>,
    cls_b: Option<Vec<f32>>,
    cls_norm: Option<Vec<f32>>,
    cls_out: Option<TensorView<'static>>,
    cls_out_b: Option<Vec<f32>>,
    /// modern-bert's head uses GELU, the others tanh.
    gelu: bool,
    /// qwen3 rerankers: softmax over the outputs.
    softmax: bool,
    eps: f32,
}

impl ClsHead {
    /// `cls.weight` {n_embd, n_embd} + `cls.bias`, `cls.output.weight` {n_embd, n_cls_out}
    /// + `cls.output.bias` (all optional, as in llama.cpp); `cls_norm` names the head's
    /// norm tensor where the architecture has one.
    /// `cls_rows`: the dense layer's outputs (n_embd; jina-bert-v2's rerankers have a single
    /// one, {n_embd, 1}, and no `cls.output`).
    pub fn load(ld: &Loader, cls_norm: Option<&str>, gelu: bool, softmax: bool, cls_rows: usize) -> Result<ClsHead> {
        let hp = ld.hp();
        let ne = hp.n_embd;
        let n_out = hp.n_cls_out;
        Ok(ClsHead {
            cls: ld.opt("cls.weight", &[ne, cls_rows])?,
            cls_b: ld.opt_vec("cls.bias", &[cls_rows])?,
            cls_norm: match cls_norm {
                Some(name) => ld.opt_vec(name, &[cls_rows])?,
                None => None,
            },
            cls_out: ld.opt("cls.output.weight", &[ne, n_out])?,
            cls_out_b: ld.opt_vec("cls.output.bias", &[n_out])?,
            gelu,
            softmax,
            eps: hp.f_norm_eps,
        })
    }

    /// Only `cls.output.weight` {n_embd, n_cls_out}, no bias (qwen3's reranker head, as
    /// llama.cpp's qwen3.cpp loads it), `softmax` over the outputs.
    pub fn output_only(ld: &Loader, softmax: bool) -> Result<ClsHead> {
        let hp = ld.hp();
        Ok(ClsHead {
            cls: None,
            cls_b: None,
            cls_norm: None,
            cls_out: ld.opt("cls.output.weight", &[hp.n_embd, hp.n_cls_out])?,
            cls_out_b: None,
            gelu: false,
            softmax,
            eps: hp.f_norm_eps,
        })
    }

    /// Whether the model has a head at all (else rank pooling returns the pooled vector).
    pub fn present(&self) -> bool {
        self.cls.is_some() || self.cls_out.is_some()
    }

    /// Scores [n, n_out] of pooled vectors x [n, n_embd] (n_out = n_cls_out with
    /// `cls.output`, else n_embd).
    pub fn apply(&self, pool: &ThreadPool, x: &[f32], n: usize, ne: usize) -> Result<(Vec<f32>, usize)> {
        if x.len() != n * ne {
            return Err(Error::Invalid(format!("classify: expected [{n}, {ne}] pooled vectors")));
        }
        let mut cur = x.to_vec();
        let mut scratch = Vec::new();
        let mut width = ne;
        if let Some(w) = &self.cls {
            let mut o = vec![0f32; n * w.n_rows()];
            try_matmul_rows(pool, w, &cur, n, &mut o, w.n_rows(), 0..w.n_rows(), &mut scratch)?;
            width = w.n_rows();
            add_bias(&mut o, self.cls_b.as_deref(), width, n);
            if self.gelu {
                act::gelu(&mut o);
            } else {
                o.iter_mut().for_each(|v| *v = v.tanh());
            }
            if let Some(nw) = &self.cls_norm {
                for r in o.chunks_exact_mut(width) {
                    layer_norm_row(r, Some(nw), None, self.eps);
                }
            }
            cur = o;
        }
        if let Some(w) = &self.cls_out {
            let mut o = vec![0f32; n * w.n_rows()];
            try_matmul_rows(pool, w, &cur, n, &mut o, w.n_rows(), 0..w.n_rows(), &mut scratch)?;
            width = w.n_rows();
            add_bias(&mut o, self.cls_out_b.as_deref(), width, n);
            cur = o;
        }
        if self.softmax {
            for r in cur.chunks_exact_mut(width) {
                act::softmax_ggml(r);
            }
        }
        Ok((cur, width))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vec_dot_tail_as_gcc_compiles_it() {
        // n = 79: blocks 0..64, then 8 + 4 products added in order, the last 3 fused
        assert!(!tail_fused(75, 79) && tail_fused(76, 79) && tail_fused(78, 79));
        assert!((0..16).all(|i| !tail_fused(i, 16)));
        assert!((0..3).all(|i| tail_fused(i, 3)));
        assert!(!tail_fused(3, 6) && tail_fused(4, 6));
        // three elements: all fused (the unfused sum of these differs in the last bit)
        let x = [1.0 + f32::EPSILON * 3.0, 1.0 - f32::EPSILON, 0.5 + f32::EPSILON];
        let mut want = 0f32;
        for i in 0..3 {
            want = fmaf(x[i], x[i], want);
        }
        let unfused = x.iter().fold(0f32, |s, &a| s + a * a);
        assert_ne!(unfused.to_bits(), want.to_bits());
        assert_eq!(vec_dot_f32(&x, &x).to_bits(), want.to_bits());
    }

    #[test]
    fn sparse_kqv_equals_the_dense_row() {
        // a V^T row over n keys times probabilities that are 0 off the visible keys: the
        // sparse walk must give the dense ggml_vec_dot_f32 / tinyBLAS results bit for bit
        for &n in &[5usize, 16, 40, 79, 96, 101] {
            let v: Vec<f32> = (0..n).map(|i| ((i * 37 % 17) as f32 - 8.0) * 0.173).collect();
            let vis: Vec<u32> = (0..n as u32).filter(|u| u % 3 != 1 && *u + 2 < n as u32).collect();
            let p: Vec<f32> = vis.iter().map(|&u| 1.0 / (u as f32 + 1.7)).collect();
            let mut dense = vec![0f32; n];
            for (&u, &w) in vis.iter().zip(&p) {
                dense[u as usize] = w;
            }
            let got = kqv_vec_dot(n, &vis, &p, |u| v[u]);
            assert_eq!(got.to_bits(), vec_dot_f32(&v, &dense).to_bits(), "n = {n}");
            if n % 8 == 0 {
                let got = kqv_tinyblas(&vis, &p, |u| v[u]);
                assert_eq!(got.to_bits(), tinyblas_dot(&v, &dense).to_bits(), "n = {n}");
            }
        }
    }
}
