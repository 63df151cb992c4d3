//! The graph builders every architecture's forward pass is made of (pipeline step 13),
//! after llama.cpp's llm_graph_context (src/llama-graph.cpp): `build_inp_embd`,
//! `build_norm`, `build_attn`, `build_ffn`, `build_moe_ffn`, `build_cvec`, `build_output`.
//! Each reads and writes the micro-batch's scratch buffers in `Step` (context.rs), whose
//! rows are tokens: x [n, n_embd] is the residual stream, cur [n, n_embd] a block's normed
//! input, tmp [n, n_embd] a block's output. Every builder names its intermediates as
//! llama.cpp does (`attn_norm-0`, `Qcur-0`, `kqv_out-0`, `ffn_out-0`, `l_out-0`) for the
//! debug dump (`cb!`).

use crate::adapter::LoraSet;
use crate::cb;
use crate::context::{ContextParams, Step};
use crate::error::{Error, Result};
use crate::hparams::HParams;
use crate::model::TensorView;
use crate::ops::act;
use crate::ops::attention::{self, AttnInputs, AttnParams};
use crate::ops::matmul::try_matmul_rows;
use crate::ops::norm::{layer_norm_row, rms_norm_row};
use crate::ops::rope::RopeParams;
use crate::quant;
use crate::threadpool::ThreadPool;

/// The attention weights of one layer: wq {n_embd, n_head * hd_k}, wk / wv
/// {n_embd, n_head_kv * hd_k / hd_v}, wo {n_head * hd_v, n_embd}; biases of those widths.
pub struct AttnWeights<'w> {
    pub wq: &'w TensorView<'static>,
    pub wk: &'w TensorView<'static>,
    pub wv: &'w TensorView<'static>,
    pub wo: &'w TensorView<'static>,
    pub bq: Option<&'w [f32]>,
    pub bk: Option<&'w [f32]>,
    pub bv: Option<&'w [f32]>,
    pub bo: Option<&'w [f32]>,
    /// RMSNorm of q and k before rope: per head when the weight has hd_k entries (gemma3,
    /// qwen3), over the whole projection when it has n_head * hd_k (n_head_kv * hd_k for k:
    /// olmo2's q/k norms).
    pub q_norm: Option<&'w [f32]>,
    pub k_norm: Option<&'w [f32]>,
    /// wq, wk and wv are one fused `attn_qkv` matrix (phi3): rows [0, n_q) are q, then
    /// k, then v.
    pub fused_qkv: bool,
}

/// The expert weights of one MoE layer: router {n_embd, n_expert}, gate/up
/// {n_embd, n_ff_exp, n_expert}, down {n_ff_exp, n_embd, n_expert}.
pub struct MoeWeights<'w> {
    pub router: &'w TensorView<'static>,
    pub gate: &'w TensorView<'static>,
    pub up: &'w TensorView<'static>,
    pub down: &'w TensorView<'static>,
}

/// How layer `il` attends.
pub struct AttnConfig<'r> {
    pub il: usize,
    /// None: no rotary embedding on this layer.
    pub rope: Option<&'r RopeParams>,
    /// Multiplies q after rope (gemma3's f_attention_scale); 1.0 = none.
    pub q_scale: f32,
    /// Multiplies q.k in the softmax.
    pub kq_scale: f32,
    pub softcap: f32,
    pub n_swa: usize,
    /// Llama-4 style attention temperature (mistral3): q *= 1 + scale * ln(1 + floor(pos /
    /// floor_len)) after rope, as (scale, floor_len).
    pub attn_temp: Option<(f32, usize)>,
}

/// The feed-forward's activation (llama.cpp's LLM_FFN_SILU / LLM_FFN_GELU).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum FfnAct {
    Silu,
    /// gelu_tanh (ggml's f16 table)
    Gelu,
}

/// Where the feed-forward's gate comes from.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum FfnGate {
    /// No gate: down(act(up x + up_b)) + down_b (phi2; llama.cpp's LLM_FFN_SEQ without gate).
    None,
    /// A separate `ffn_gate`: down(act(gate x) * up x) (llama.cpp's LLM_FFN_PAR).
    Par,
    /// `ffn_up` holds the gate's n_ff rows, then up's (phi3): down(act(up[..n_ff] x) * up[n_ff..] x).
    Fused,
}

/// A dense feed-forward's weights: up {n_embd, n_ff} (2 n_ff rows for `FfnGate::Fused`),
/// gate {n_embd, n_ff}, down {n_ff, n_embd}; biases gate_b / up_b [n_ff], down_b [n_embd].
pub struct FfnWeights<'w> {
    pub gate: Option<&'w TensorView<'static>>,
    pub gate_b: Option<&'w [f32]>,
    pub up: &'w TensorView<'static>,
    pub up_b: Option<&'w [f32]>,
    pub down: &'w TensorView<'static>,
    pub down_b: Option<&'w [f32]>,
}

/// The normalization of `build_norm` (llama.cpp's LLM_NORM_RMS / LLM_NORM).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Norm {
    Rms,
    Layer,
}

struct RowsPtr(*mut f32);
unsafe impl Sync for RowsPtr {}
impl RowsPtr {
    fn get(&self) -> *mut f32 {
        self.0
    }
}

/// f(row index, row) over the first `rows` rows of width `w` of `data`, rows split evenly
/// across the pool when there are several (each row's result never depends on the split).
fn par_rows(pool: &ThreadPool, data: &mut [f32], w: usize, rows: usize, f: &(dyn Fn(usize, &mut [f32]) + Sync)) {
    let rows = rows.min(if w > 0 { data.len() / w } else { 0 });
    if rows <= 1 || pool.n_threads() == 1 {
        for (i, r) in data[..rows * w].chunks_exact_mut(w).enumerate() {
            f(i, r);
        }
        return;
    }
    let p = RowsPtr(data.as_mut_ptr());
    pool.run(&|ith, nth| {
        for i in rows * ith / nth..rows * (ith + 1) / nth {
            // SAFETY: rows are disjoint and each belongs to exactly one thread.
            let r = unsafe { std::slice::from_raw_parts_mut(p.get().add(i * w), w) };
            f(i, r);
        }
    });
}

fn add_bias(x: &mut [f32], b: Option<&[f32]>, width: usize, n: usize) {
    if let Some(b) = b {
        for r in x[..n * width].chunks_exact_mut(width) {
            act::add_assign(r, b);
        }
    }
}

impl Step<'_> {
    /// x [n, n_embd] = the tokens' rows of tok_embd {n_embd, n_vocab} (any weight type,
    /// dequantized) times `scale`, or the batch's embeddings [n, n_embd] as given.
    pub fn build_inp_embd(&mut self, tok_embd: &TensorView, scale: f32) -> Result<()> {
        let ne = self.hp.n_embd;
        let n = self.n;
        if let Some(tokens) = self.tokens {
            // a token_embd LoRA adds to the rows before the scale (llama.cpp's build_inp_embd
            // returns them and the Gemma graphs scale after)
            let lora = self.b.lora.as_ref().is_some_and(|l| l.has_embd());
            for (t, &id) in tokens.iter().enumerate().take(n) {
                let dst = &mut self.b.x[t * ne..(t + 1) * ne];
                quant::dequantize_row(tok_embd.ty, tok_embd.row(id as usize), dst)?;
                if scale != 1.0 && !lora {
                    act::scale(dst, scale);
                }
            }
            if lora {
                let b = &mut *self.b;
                if let Some(l) = b.lora.as_mut() {
                    l.add_embd(self.pool, &tokens[..n], &mut b.x, ne, &mut b.mm_scratch)?;
                }
                if scale != 1.0 {
                    act::scale(&mut b.x[..n * ne], scale);
                }
            }
        } else if let Some(e) = self.embd {
            self.b.x[..n * ne].copy_from_slice(&e[..n * ne]);
        }
        Ok(())
    }

    /// cur [n, n_embd] = norm(x [n, n_embd]) * w [n_embd] (+ b [n_embd]) over the live rows;
    /// `b` only with `Norm::Layer` (llama.cpp's RMS norm has no bias).
    pub fn build_norm(&mut self, w: &[f32], b: Option<&[f32]>, kind: Norm, eps: f32) {
        let (ne, n) = (self.hp.n_embd, self.n);
        self.b.cur[..n * ne].copy_from_slice(&self.b.x[..n * ne]);
        match kind {
            Norm::Rms => par_rows(self.pool, &mut self.b.cur, ne, n, &|_, r| rms_norm_row(r, Some(w), eps)),
            Norm::Layer => par_rows(self.pool, &mut self.b.cur, ne, n, &|_, r| layer_norm_row(r, Some(w), b, eps)),
        }
    }

    /// tmp [n, n_embd] = rmsnorm(tmp) * w [n_embd]: the norm of a block's output before the residual
    /// (gemma2/3's post_attention_norm and post_ffw_norm).
    pub fn build_post_norm(&mut self, w: &[f32], eps: f32) {
        let (ne, n) = (self.hp.n_embd, self.n);
        par_rows(self.pool, &mut self.b.tmp, ne, n, &|_, r| rms_norm_row(r, Some(w), eps));
    }

    /// Dense feed-forward: in `cur` [n, n_embd], out `tmp` [n, n_embd]; `gate` [n, n_ff] and
    /// `up` [n, n_ff] hold the intermediates.
    pub fn build_ffn(&mut self, il: usize, w: &FfnWeights, act: FfnAct, gate: FfnGate) -> Result<()> {
        let n = self.n;
        let n_ff = w.down.ne[0];
        let b = &mut *self.b;
        if gate == FfnGate::None {
            Self::mm(self.pool, w.up, &b.cur, n, &mut b.up, &mut b.mm_scratch, &mut b.lora)?;
            add_bias(&mut b.up, w.up_b, n_ff, n);
            cb!(self, "ffn_up", il, up, n_ff);
            let b = &mut *self.b;
            match act {
                FfnAct::Gelu => par_rows(self.pool, &mut b.up, n_ff, n, &|_, r| act::gelu(r)),
                FfnAct::Silu => par_rows(self.pool, &mut b.up, n_ff, n, &|_, r| r.iter_mut().for_each(|v| *v = act::silu(*v))),
            }
            cb!(self, if act == FfnAct::Gelu { "ffn_gelu" } else { "ffn_silu" }, il, up, n_ff);
            let b = &mut *self.b;
            Self::mm(self.pool, w.down, &b.up, n, &mut b.tmp, &mut b.mm_scratch, &mut b.lora)?;
            add_bias(&mut b.tmp, w.down_b, self.hp.n_embd, n);
            return Ok(());
        }
        match (gate, w.gate) {
            (FfnGate::Par, Some(g)) => {
                Self::mm(self.pool, g, &b.cur, n, &mut b.gate, &mut b.mm_scratch, &mut b.lora)?;
                Self::mm(self.pool, w.up, &b.cur, n, &mut b.up, &mut b.mm_scratch, &mut b.lora)?;
            }
            (FfnGate::Fused, None) => {
                Self::mm_rows(self.pool, w.up, &b.cur, n, &mut b.gate, 0..n_ff, &mut b.mm_scratch, &mut b.lora)?;
                Self::mm_rows(self.pool, w.up, &b.cur, n, &mut b.up, n_ff..2 * n_ff, &mut b.mm_scratch, &mut b.lora)?;
            }
            _ => return Err(Error::Invalid(format!("internal: layer {il}: ffn_gate given for {gate:?}"))),
        }
        add_bias(&mut b.gate, w.gate_b, n_ff, n);
        add_bias(&mut b.up, w.up_b, n_ff, n);
        cb!(self, "ffn_gate", il, gate, n_ff);
        cb!(self, "ffn_up", il, up, n_ff);
        let b = &mut *self.b;
        let up = &b.up[..n * n_ff];
        match act {
            FfnAct::Silu => par_rows(self.pool, &mut b.gate, n_ff, n, &|t, g| act::swiglu(g, &up[t * n_ff..(t + 1) * n_ff])),
            FfnAct::Gelu => par_rows(self.pool, &mut b.gate, n_ff, n, &|t, g| act::geglu(g, &up[t * n_ff..(t + 1) * n_ff])),
        }
        cb!(self, if act == FfnAct::Silu { "ffn_swiglu" } else { "ffn_geglu" }, il, gate, n_ff);
        let b = &mut *self.b;
        Self::mm(self.pool, w.down, &b.gate, n, &mut b.tmp, &mut b.mm_scratch, &mut b.lora)?;
        add_bias(&mut b.tmp, w.down_b, self.hp.n_embd, n);
        Ok(())
    }

    /// Mixture-of-experts feed-forward (llama.cpp's `build_moe_ffn` with softmax gating,
    /// SwiGLU experts and, with `norm_w`, the selected weights renormalized to sum 1):
    /// in `cur` [n, n_embd], out `tmp` [n, n_embd]. Per token: router logits, softmax,
    /// the `n_used` most probable experts (ties to the lower id), and the sum over them
    /// (in selection order) of weight * down_e(silu(gate_e x) * up_e x). Tokens are
    /// grouped per expert so each expert's matrices are streamed once per micro-batch.
    /// Scratch: `moe` / `moe_idx` (reserved at context creation), `gate` / `up`.
    pub fn build_moe_ffn(&mut self, il: usize, m: &MoeWeights, n_used: usize, norm_w: bool) -> Result<()> {
        let (n, ne) = (self.n, self.hp.n_embd);
        let n_exp = m.router.ne[1];
        let nf = m.gate.ne[1];
        if n_used == 0 || n_used > n_exp || m.gate.ne[2] != n_exp || m.up.ne[2] != n_exp || m.down.ne[2] != n_exp {
            return Err(Error::Invalid(format!("layer {il}: inconsistent expert tensors ({n_exp} experts, {n_used} used)")));
        }
        let b = &mut *self.b;
        let nk = n * n_used; // (token, selection) slots
        let need = n * n_exp + nk + nk * ne + 2 * n * ne;
        if b.moe.len() < need || b.moe_idx.capacity() < 2 * nk || b.gate.len() < n * nf || b.up.len() < n * nf {
            return Err(Error::Invalid(format!("internal: MoE scratch too small for layer {il}")));
        }
        let (probs, rest) = b.moe.split_at_mut(n * n_exp);
        let (wts, rest) = rest.split_at_mut(nk);
        let (contrib, rest) = rest.split_at_mut(nk * ne);
        let (xg, o) = rest.split_at_mut(n * ne);
        Self::mm(self.pool, m.router, &b.cur, n, probs, &mut b.mm_scratch, &mut b.lora)?;
        // selection and weights per token: n_used passes of argmax (the first maximum wins)
        let idx = &mut b.moe_idx;
        idx.clear();
        for t in 0..n {
            let p = &mut probs[t * n_exp..(t + 1) * n_exp];
            act::softmax_ggml(p);
            let mut sum = 0f64;
            for j in 0..n_used {
                let mut best = usize::MAX;
                for (e, &v) in p.iter().enumerate() {
                    let taken = idx[t * n_used..t * n_used + j].contains(&e);
                    if !taken && (best == usize::MAX || v > p[best]) {
                        best = e;
                    }
                }
                idx.push(best);
                wts[t * n_used + j] = p[best];
                sum += p[best] as f64;
            }
            if norm_w {
                let s = (sum as f32).max(6.103_515_6e-5);
                for w in &mut wts[t * n_used..(t + 1) * n_used] {
                    *w /= s;
                }
            }
        }
        // per expert: gather its tokens, run gate/up/down, scatter weight * out
        for e in 0..n_exp {
            idx.truncate(nk);
            for k in 0..nk {
                if idx[k] == e {
                    idx.push(k);
                }
            }
            let mt = idx.len() - nk;
            if mt == 0 {
                continue;
            }
            for r in 0..mt {
                let t = idx[nk + r] / n_used;
                xg[r * ne..(r + 1) * ne].copy_from_slice(&b.cur[t * ne..(t + 1) * ne]);
            }
            crate::quantize::collect::observe_experts(m.gate, e, &xg[..mt * ne], &idx[nk..], n_used); // imatrix
            crate::quantize::collect::observe_experts(m.up, e, &xg[..mt * ne], &idx[nk..], n_used);
            Self::mm_rows(self.pool, m.gate, xg, mt, &mut b.gate, e * nf..(e + 1) * nf, &mut b.mm_scratch, &mut b.lora)?;
            Self::mm_rows(self.pool, m.up, xg, mt, &mut b.up, e * nf..(e + 1) * nf, &mut b.mm_scratch, &mut b.lora)?;
            for r in 0..mt {
                act::swiglu(&mut b.gate[r * nf..(r + 1) * nf], &b.up[r * nf..(r + 1) * nf]);
            }
            crate::quantize::collect::observe_experts(m.down, e, &b.gate[..mt * nf], &idx[nk..], n_used); // imatrix
            Self::mm_rows(self.pool, m.down, &b.gate, mt, o, e * ne..(e + 1) * ne, &mut b.mm_scratch, &mut b.lora)?;
            for r in 0..mt {
                let k = idx[nk + r];
                let w = wts[k];
                for (c, v) in contrib[k * ne..(k + 1) * ne].iter_mut().zip(&o[r * ne..(r + 1) * ne]) {
                    *c = v * w;
                }
            }
        }
        for t in 0..n {
            let dst = &mut b.tmp[t * ne..(t + 1) * ne];
            dst.copy_from_slice(&contrib[t * n_used * ne..(t * n_used + 1) * ne]);
            for j in 1..n_used {
                let k = t * n_used + j;
                act::add_assign(dst, &contrib[k * ne..(k + 1) * ne]);
            }
        }
        Ok(())
    }

    /// x [n, n_embd] += tmp [n, n_embd]
    pub fn residual(&mut self) {
        let m = self.n * self.hp.n_embd;
        act::add_assign(&mut self.b.x[..m], &self.b.tmp[..m]);
    }

    /// x [n, n_embd] += the control vector's direction [n_embd] for layer il, where one is set (llama.cpp's
    /// build_cvec at the end of every layer, before "l_out").
    #[inline]
    pub fn build_cvec(&mut self, il: usize) {
        let b = &mut *self.b;
        if let Some(d) = b.cvec.dir(il) {
            let ne = d.len();
            for r in b.x[..self.n * ne].chunks_exact_mut(ne) {
                act::add_assign(r, d);
            }
        }
    }

    /// out [n, n_out] = w x (+ the LoRA adapters' terms for w, when any is set).
    fn mm(
        pool: &ThreadPool,
        w: &TensorView,
        x: &[f32],
        n: usize,
        out: &mut [f32],
        scratch: &mut Vec<u8>,
        lora: &mut Option<LoraSet>,
    ) -> Result<()> {
        let n_out = w.n_rows();
        let (n_in, m) = (w.ne[0], n * n_out);
        if x.len() < n * n_in || out.len() < m {
            return Err(Error::Invalid(format!("internal: scratch too small for '{}'", w.name)));
        }
        try_matmul_rows(pool, w, &x[..n * n_in], n, &mut out[..m], n_out, 0..n_out, scratch)?;
        crate::quantize::collect::observe(w, &x[..n * n_in], n); // imatrix (no-op unless collecting)
        if let Some(l) = lora {
            l.add_mm(pool, w, &x[..n * n_in], n, &mut out[..m], 0..n_out, scratch)?;
        }
        Ok(())
    }

    /// Rows `rows` of w times x into out [n, rows.len()] (a slice of a fused matrix).
    #[allow(clippy::too_many_arguments)]
    fn mm_rows(
        pool: &ThreadPool,
        w: &TensorView,
        x: &[f32],
        n: usize,
        out: &mut [f32],
        rows: std::ops::Range<usize>,
        scratch: &mut Vec<u8>,
        lora: &mut Option<LoraSet>,
    ) -> Result<()> {
        let (n_in, width) = (w.ne[0], rows.len());
        if x.len() < n * n_in || out.len() < n * width || rows.end > w.n_rows() {
            return Err(Error::Invalid(format!("internal: bad fused slice {rows:?} of '{}'", w.name)));
        }
        try_matmul_rows(pool, w, &x[..n * n_in], n, &mut out[..n * width], width, rows.clone(), scratch)?;
        if rows.start == 0 {
            crate::quantize::collect::observe(w, &x[..n * n_in], n); // imatrix: a fused matrix counts once
        }
        if let Some(l) = lora {
            l.add_mm(pool, w, &x[..n * n_in], n, &mut out[..n * width], rows, scratch)?;
        }
        Ok(())
    }

    /// Self-attention of the live rows: in `cur` [n, n_embd], out `tmp` [n, n_embd].
    /// Q/K/V projections (q [n, n_head * hd_k], k [n, n_head_kv * hd_k], v [n, n_head_kv *
    /// hd_v]), optional per-head q/k norms, rope, K/V stored into the cells of this
    /// micro-batch, attention over the cache (att [n, n_head * hd_v]), output projection.
    pub fn build_attn(&mut self, w: &AttnWeights, c: &AttnConfig) -> Result<()> {
        // q and k borrow the FFN's gate and up buffers while attention runs (a layer's
        // attention and FFN never overlap), saving n_ubatch x (n_q + n_kv) floats of scratch
        let b = &mut *self.b;
        std::mem::swap(&mut b.q, &mut b.gate);
        std::mem::swap(&mut b.k, &mut b.up);
        let r = self.build_attn_qkv(w, c);
        let b = &mut *self.b;
        std::mem::swap(&mut b.q, &mut b.gate);
        std::mem::swap(&mut b.k, &mut b.up);
        r
    }

    fn build_attn_qkv(&mut self, w: &AttnWeights, c: &AttnConfig) -> Result<()> {
        let hp = self.hp;
        let il = c.il;
        let n = self.n;
        let (n_head, n_head_kv) = (hp.n_head(il), hp.n_head_kv(il));
        let (hd_k, hd_v) = (hp.n_embd_head_k, hp.n_embd_head_v);
        let (qw, kw, vw) = (n_head * hd_k, n_head_kv * hd_k, n_head_kv * hd_v);
        let b = &mut *self.b;
        if w.fused_qkv {
            Self::mm_rows(self.pool, w.wq, &b.cur, n, &mut b.q, 0..qw, &mut b.mm_scratch, &mut b.lora)?;
            Self::mm_rows(self.pool, w.wq, &b.cur, n, &mut b.k, qw..qw + kw, &mut b.mm_scratch, &mut b.lora)?;
            Self::mm_rows(self.pool, w.wq, &b.cur, n, &mut b.v, qw + kw..qw + kw + vw, &mut b.mm_scratch, &mut b.lora)?;
        } else {
            Self::mm(self.pool, w.wq, &b.cur, n, &mut b.q, &mut b.mm_scratch, &mut b.lora)?;
            Self::mm(self.pool, w.wk, &b.cur, n, &mut b.k, &mut b.mm_scratch, &mut b.lora)?;
            Self::mm(self.pool, w.wv, &b.cur, n, &mut b.v, &mut b.mm_scratch, &mut b.lora)?;
        }
        add_bias(&mut b.q, w.bq, qw, n);
        add_bias(&mut b.k, w.bk, kw, n);
        add_bias(&mut b.v, w.bv, vw, n);
        let eps = hp.f_norm_rms_eps;
        if let Some(qn) = w.q_norm {
            let width = if qn.len() == qw { qw } else { hd_k };
            for h in b.q[..n * qw].chunks_exact_mut(width) {
                rms_norm_row(h, Some(qn), eps);
            }
            cb!(self, "Qcur_normed", il, q, qw);
        }
        let b = &mut *self.b;
        if let Some(kn) = w.k_norm {
            let width = if kn.len() == kw { kw } else { hd_k };
            for h in b.k[..n * kw].chunks_exact_mut(width) {
                rms_norm_row(h, Some(kn), eps);
            }
        }
        if let Some(r) = c.rope {
            let pos = &b.pos;
            if hd_k <= 512 {
                let rope_row = |t: usize, row: &mut [f32]| {
                    let mut cache = [0f32; 512];
                    r.apply_heads(row, hd_k, pos[t], &mut cache[..hd_k]);
                };
                par_rows(self.pool, &mut b.q, qw, n, &rope_row);
                par_rows(self.pool, &mut b.k, kw, n, &rope_row);
            } else {
                for t in 0..n {
                    r.apply_heads(&mut b.q[t * qw..(t + 1) * qw], hd_k, pos[t], &mut b.rope_cache);
                    r.apply_heads(&mut b.k[t * kw..(t + 1) * kw], hd_k, pos[t], &mut b.rope_cache);
                }
            }
        }
        if c.q_scale != 1.0 {
            act::scale(&mut b.q[..n * qw], c.q_scale);
        }
        if let Some((ts, floor_len)) = c.attn_temp {
            // llm_graph_input_attn_temp::set_input, computed in f64 as there
            for t in 0..n {
                let p = b.pos[t] as f64;
                let f = (((p / floor_len.max(1) as f64).floor() + 1.0).ln() * ts as f64 + 1.0) as f32;
                act::scale(&mut b.q[t * qw..(t + 1) * qw], f);
            }
        }
        cb!(self, "Qcur", il, q, qw);
        cb!(self, "Kcur", il, k, kw);
        cb!(self, "Vcur", il, v, vw);
        // store K and V of this micro-batch into its cells
        let b = &mut *self.b;
        let kv = &mut *self.kv;
        // quantized caches: llama.cpp's Hadamard rotation of Q, K and V (kv_cache::rotation_sizes)
        crate::kv_cache::fwht(&mut b.q[..n * qw], kv.rot_k);
        crate::kv_cache::fwht(&mut b.k[..n * kw], kv.rot_k);
        crate::kv_cache::fwht(&mut b.v[..n * vw], kv.rot_v);
        let (rk, rv) = (kv.row_k[il], kv.row_v[il]);
        for t in 0..n {
            let (s, cell) = b.cells[t];
            let o = (s as usize * kv.size + cell as usize) * rk;
            quant::quantize_row_cpu(kv.type_k, &b.k[t * kw..(t + 1) * kw], &mut kv.k[il][o..o + rk])?;
            let o = (s as usize * kv.size + cell as usize) * rv;
            quant::quantize_row_cpu(kv.type_v, &b.v[t * vw..(t + 1) * vw], &mut kv.v[il][o..o + rv])?;
        }
        let p = AttnParams { il, n_head, n_head_kv, hd_k, hd_v, scale: c.kq_scale, softcap: c.softcap, n_swa: c.n_swa };
        let inp = AttnInputs { pos: &b.pos[..n], stream: &b.stream[..n], key_range: &b.key_range[..n], keys: &b.keys };
        attention::attention(self.pool, kv, &p, &inp, &b.q, &mut b.att, &mut b.attn_scratch, b.attn_stride);
        cb!(self, "kqv_out", il, att, n_head * hd_v);
        let b = &mut *self.b;
        crate::kv_cache::fwht(&mut b.att[..n * n_head * hd_v], self.kv.rot_v); // rotate V's rotation back
        Self::mm(self.pool, w.wo, &b.att, n, &mut b.tmp, &mut b.mm_scratch, &mut b.lora)?;
        add_bias(&mut b.tmp, w.bo, hp.n_embd, n);
        cb!(self, "attn_out", il, tmp, hp.n_embd);
        Ok(())
    }

    /// Keep only the rows that want output (llama.cpp's `inp_out_ids` in the last layer):
    /// x and tmp are compacted to [n_outputs, n_embd]. Returns false when none is wanted.
    pub fn select_outputs(&mut self) -> bool {
        let ne = self.hp.n_embd;
        let b = &mut *self.b;
        for (j, &i) in b.out_idx.iter().enumerate() {
            if i != j {
                b.x.copy_within(i * ne..(i + 1) * ne, j * ne);
                b.tmp.copy_within(i * ne..(i + 1) * ne, j * ne);
            }
        }
        self.n = b.out_idx.len();
        self.n > 0
    }

    /// The output projection {n_embd, n_vocab} of `cur` [n_outputs, n_embd] (already
    /// normed): hidden states out, logits rows [n_outputs, n_vocab] (+ bias [n_vocab]),
    /// optional final softcap.
    pub fn build_output(&mut self, output: &TensorView, bias: Option<&[f32]>, final_softcap: f32) -> Result<()> {
        let ne = self.hp.n_embd;
        let n = self.n;
        if n == 0 {
            return Ok(());
        }
        cb!(self, "result_norm", -1, cur, ne);
        let b = &mut *self.b;
        if let Some(h) = self.hidden.as_deref_mut() {
            for (j, &r) in b.out_row.iter().enumerate() {
                h[r * ne..(r + 1) * ne].copy_from_slice(&b.cur[j * ne..(j + 1) * ne]);
            }
        }
        let nv = output.n_rows();
        let r0 = b.out_row[0];
        let contiguous = b.out_row.iter().enumerate().all(|(j, &r)| r == r0 + j);
        if contiguous {
            let dst = &mut self.logits[r0 * nv..(r0 + n) * nv];
            Self::mm(self.pool, output, &b.cur, n, dst, &mut b.mm_scratch, &mut b.lora)?;
            add_bias(dst, bias, nv, n);
            if final_softcap != 0.0 {
                act::softcap(dst, final_softcap);
            }
        } else {
            for j in 0..n {
                let r = b.out_row[j];
                Self::mm(self.pool, output, &b.cur[j * ne..(j + 1) * ne], 1, &mut b.row, &mut b.mm_scratch, &mut b.lora)?;
                add_bias(&mut b.row, bias, nv, 1);
                if final_softcap != 0.0 {
                    act::softcap(&mut b.row[..nv], final_softcap);
                }
                self.logits[r * nv..(r + 1) * nv].copy_from_slice(&b.row[..nv]);
            }
        }
        if let Some(d) = self.debug.as_deref_mut() {
            for &r in b.out_row.iter() {
                d.put("result_output", -1, &self.logits[r * nv..(r + 1) * nv], nv);
            }
        }
        Ok(())
    }
}

/// Layer `il`'s rope: the context's base/scale overrides (0 = the model's) apply to full
/// attention layers; sliding-window layers keep their own base (llama.cpp's
/// `get_rope_freq_base` / `get_rope_freq_scale`).
pub fn layer_rope(hp: &HParams, p: &ContextParams, il: usize, freq_factors: Option<Vec<f32>>) -> RopeParams {
    let (base, scale) = if hp.swa_layers.get(il).copied().unwrap_or(false) {
        (hp.rope_freq_base_swa, hp.rope_freq_scale_swa)
    } else {
        (
            if p.rope_freq_base != 0.0 { p.rope_freq_base } else { hp.rope_freq_base },
            if p.rope_freq_scale != 0.0 { p.rope_freq_scale } else { hp.rope_freq_scale },
        )
    };
    let mut r = RopeParams::simple(hp.rope_type, hp.n_rot, base, scale);
    r.freq_factors = freq_factors;
    // YaRN (llama-context.cpp: yarn_ext_factor 1 for rope.scaling.type "yarn"; the
    // attention factor cancels ggml's own 1 + 0.1 ln(1/scale) magnitude correction)
    if hp.rope_scaling_type == "yarn" && scale != 1.0 {
        let factor = 1.0 / scale;
        let mscale = |s: f32, m: f32| {
            if s <= 1.0 {
                1.0
            } else {
                0.1 * m * s.ln() + 1.0
            }
        };
        let mut attn = if hp.rope_yarn_log_mul != 0.0 {
            mscale(factor, 1.0) / mscale(factor, hp.rope_yarn_log_mul)
        } else {
            mscale(factor, 1.0)
        };
        attn *= 1.0 / (1.0 + 0.1 * factor.ln());
        r.ext_factor = 1.0;
        r.attn_factor = attn;
        r.corr_dims =
            crate::ops::rope::yarn_corr_dims(hp.n_rot, hp.n_ctx_orig_yarn, base, hp.yarn_beta_fast, hp.yarn_beta_slow);
    }
    // rope.scaling.attn_factor (llama.cpp's default 1; 0 here means absent)
    if hp.rope_attn_factor != 0.0 {
        r.attn_factor *= hp.rope_attn_factor;
    }
    r
}
