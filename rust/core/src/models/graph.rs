//! The graph builders every architecture's forward pass is made of (pipeline step 13),
//! after llama.cpp's llm_graph_context (src/llama-graph.cpp): `build_inp_embd`,
//! `build_norm`, `build_attn`, `build_ffn`, `build_moe_ffn`, `build_cvec`, `build_output`.
//! Each reads and writes the micro-batch's scratch buffers in `Step` (context.rs), whose
//! rows are tokens: x [n, n_embd] is the residual stream, cur [n, n_embd] a block's normed
//! input, tmp [n, n_embd] a block's output. Every builder names its intermediates as
//! llama.cpp does (`attn_norm-0`, `Qcur-0`, `kqv_out-0`, `ffn_out-0`, `l_out-0`) for the
//! debug dump (`cb!`).

use super::loader::Loader;
use crate::adapter::LoraSet;
use crate::cb;
use crate::context::{ContextParams, Step};
use crate::error::{Error, Result};
use crate::hparams::HParams;
use crate::model::TensorView;
use crate::ops::act;
use crate::ops::attention::{self, AttnInputs, AttnParams};
use crate::backend::Backend;
use crate::ops::matmul::{matmul_on, matmul_on_same_x, matmul_single_fused, FusedPart};
use crate::ops::norm::{layer_norm_row, rms_norm_row, rms_norm_rows_inplace};
use crate::ops::rope::RopeParams;
use crate::quant;
use crate::threadpool::{SyncPtr, ThreadPool};

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
/// {n_embd, n_ff_exp, n_expert}, down {n_ff_exp, n_embd, n_expert}; optional router bias
/// [n_expert], per-expert biases ([n_expert * width], expert-major: gpt-oss) and the
/// selection bias `probs_b` [n_expert] (llama.cpp's exp_probs_b: DeepSeek V3, GLM-4.5).
/// `gate` None: the experts run act(up x) (llama.cpp's build_moe_ffn without gate_exps).
pub struct MoeWeights<'w> {
    pub router: &'w TensorView<'static>,
    pub router_b: Option<&'w [f32]>,
    pub gate: Option<&'w TensorView<'static>>,
    pub up: &'w TensorView<'static>,
    pub down: &'w TensorView<'static>,
    pub gate_b: Option<&'w [f32]>,
    pub up_b: Option<&'w [f32]>,
    pub down_b: Option<&'w [f32]>,
    pub probs_b: Option<&'w [f32]>,
}

/// The router's gating function (llama.cpp's llama_expert_gating_func_type).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Gating {
    /// softmax over the experts' logits
    Softmax,
    /// sigmoid of each logit
    Sigmoid,
    /// the logits themselves select; the selected ones are softmaxed into weights (gpt-oss)
    SoftmaxWeight,
}

/// The experts' activation (llama.cpp's type_op of build_moe_ffn).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum MoeAct {
    /// silu(gate) * up (silu(up) without a gate)
    Silu,
    /// gpt-oss's swiglu_oai(gate, up; alpha 1.702, limit 7)
    SwigluOai,
    /// gelu(up), ungated experts only (nomic-bert-moe)
    Gelu,
}

/// How a MoE layer routes: llama.cpp's build_moe_ffn arguments and the hparams it reads.
#[derive(Clone, Copy, PartialEq, Debug)]
pub struct MoeConfig {
    /// Experts used per token.
    pub n_used: usize,
    pub gating: Gating,
    /// Renormalize the selected weights to sum 1 (expert_weights_norm).
    pub norm_w: bool,
    /// Multiply the selected weights (expert_weights_scale); 0 or 1 = none.
    pub w_scale: f32,
    /// Expert groups (DeepSeek V3: n_expert_groups, n_group_used): the top n_group_used
    /// groups by the sum of their two best scores; 0 or 1 = no groups.
    pub n_groups: usize,
    pub n_group_used: usize,
    pub act: MoeAct,
    /// Llama 4: the experts are selected by the raw router logits, and the (sigmoid)
    /// weight multiplies each expert's input instead of its output.
    pub llama4: bool,
}

impl MoeConfig {
    /// Softmax routing over `n_used` experts with renormalized weights (qwen3moe).
    pub fn softmax(n_used: usize, norm_w: bool) -> MoeConfig {
        MoeConfig {
            n_used,
            gating: Gating::Softmax,
            norm_w,
            w_scale: 0.0,
            n_groups: 0,
            n_group_used: 0,
            act: MoeAct::Silu,
            llama4: false,
        }
    }
}

/// What some MoE layers add to `build_moe_ffn` (Gemma 4), through `build_moe_ffn_ext`.
#[derive(Default, Clone, Copy)]
pub struct MoeExtra<'w> {
    /// The router's logits [n, n_expert], computed by the caller (llama.cpp's `probs_in`):
    /// `MoeWeights::router` is then not applied.
    pub logits: Option<&'w [f32]>,
    /// Per-expert scale [n_expert] of the down projection's output (llama.cpp's
    /// `ffn_down_exps.scale`, `down_exps_s`).
    pub down_s: Option<&'w [f32]>,
    /// `MoeWeights::up` is llama.cpp's fused `ffn_gate_up_exps` {n_embd, 2 n_ff_exp,
    /// n_expert}: per expert the gate's n_ff_exp rows, then up's (`gate` must be None).
    pub gate_up: bool,
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
    /// Llama-4 style attention temperature (mistral3, llama4's NoPE layers): q *= 1 +
    /// scale * ln(1 + floor((pos + offset) / floor_len)) after rope, as (scale, floor_len,
    /// offset).
    pub attn_temp: Option<(f32, usize, f32)>,
    /// The window `n_swa` is llama.cpp's LLAMA_SWA_TYPE_CHUNKED (llama4): a query sees the
    /// keys of its own chunk of n_swa positions only.
    pub chunked: bool,
    /// Weightless per-head RMSNorm of q and k after rope (llama4's L2 norm on its rope layers).
    pub qk_rms_after_rope: bool,
    /// Per-head attention sinks [n_head] (gpt-oss): one more logit per head in the softmax.
    pub sinks: Option<&'r [f32]>,
}

impl<'r> AttnConfig<'r> {
    /// Layer `il` with its rope and softmax scale, nothing else (q_scale 1, no softcap,
    /// window, temperature, chunks, norms after rope or sinks).
    pub fn new(il: usize, rope: Option<&'r RopeParams>, kq_scale: f32) -> AttnConfig<'r> {
        AttnConfig {
            il,
            rope,
            q_scale: 1.0,
            kq_scale,
            softcap: 0.0,
            n_swa: 0,
            attn_temp: None,
            chunked: false,
            qk_rms_after_rope: false,
            sinks: None,
        }
    }
}

/// What `Step::build_attn_ext` adds to `build_attn` (default: nothing).
#[derive(Clone, Copy, Default, Debug)]
pub struct AttnExtra {
    /// Weightless per-head RMSNorm of V before it is stored (gemma3n).
    pub v_rms: bool,
    /// This layer keeps no cache: its queries attend over the keys and values that earlier
    /// layer stored for the same cells (llama.cpp's layer reuse, gemma3n's last layers);
    /// no K or V is computed here.
    pub kv_from: Option<usize>,
}

/// The feed-forward's activation (llama.cpp's LLM_FFN_SILU / LLM_FFN_GELU).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum FfnAct {
    Silu,
    /// gelu_tanh (ggml's f16 table)
    Gelu,
    /// max(x, 0) (T5's ungated feed-forward)
    Relu,
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

/// One layer's q/k/v projections: three matrices, or one fused `attn_qkv` (then wq, wk
/// and wv are the same view and `fused` is set).
pub struct Qkv {
    pub wq: TensorView<'static>,
    pub wk: TensorView<'static>,
    pub wv: TensorView<'static>,
    pub bq: Option<Vec<f32>>,
    pub bk: Option<Vec<f32>>,
    pub bv: Option<Vec<f32>>,
    pub fused: bool,
}

impl Qkv {
    /// `blk.{il}.attn_qkv` {n_embd, nq + nk + nv} (+ bias) when the file has it, else
    /// `attn_q` / `attn_k` / `attn_v` (+ optional biases); llama.cpp's create_tensor_qkv.
    pub fn load(ld: &Loader, il: usize, n_embd: usize, nq: usize, nk: usize, nv: usize) -> Result<Qkv> {
        let b = |s: &str| format!("blk.{il}.{s}");
        if let Some(w) = ld.opt(&b("attn_qkv.weight"), &[n_embd, nq + nk + nv])? {
            let (bq, bk, bv) = match ld.opt_vec(&b("attn_qkv.bias"), &[nq + nk + nv])? {
                Some(v) => (Some(v[..nq].to_vec()), Some(v[nq..nq + nk].to_vec()), Some(v[nq + nk..].to_vec())),
                None => (
                    ld.opt_vec(&b("attn_q.bias"), &[nq])?,
                    ld.opt_vec(&b("attn_k.bias"), &[nk])?,
                    ld.opt_vec(&b("attn_v.bias"), &[nv])?,
                ),
            };
            return Ok(Qkv { wq: w.clone(), wk: w.clone(), wv: w, bq, bk, bv, fused: true });
        }
        Ok(Qkv {
            wq: ld.req(&b("attn_q.weight"), &[n_embd, nq])?,
            wk: ld.req(&b("attn_k.weight"), &[n_embd, nk])?,
            wv: ld.req(&b("attn_v.weight"), &[n_embd, nv])?,
            bq: ld.opt_vec(&b("attn_q.bias"), &[nq])?,
            bk: ld.opt_vec(&b("attn_k.bias"), &[nk])?,
            bv: ld.opt_vec(&b("attn_v.bias"), &[nv])?,
            fused: false,
        })
    }

    pub fn weights<'a>(&'a self, wo: &'a TensorView<'static>, bo: Option<&'a [f32]>) -> AttnWeights<'a> {
        AttnWeights {
            wq: &self.wq,
            wk: &self.wk,
            wv: &self.wv,
            wo,
            bq: self.bq.as_deref(),
            bk: self.bk.as_deref(),
            bv: self.bv.as_deref(),
            bo,
            q_norm: None,
            k_norm: None,
            fused_qkv: self.fused,
        }
    }
}

/// The owned attention weights of a layer without q/k norms: q/k/v (`Qkv`) and o
/// projections of the standard widths (`AttnWeights`) with optional biases; the hybrids'
/// attention layers.
pub struct AttnLayer {
    pub qkv: Qkv,
    pub wo: TensorView<'static>,
    pub bo: Option<Vec<f32>>,
}

impl AttnLayer {
    /// `Qkv::load` at the layer's widths, `blk.{il}.attn_output.weight` and its optional `.bias`.
    pub fn load(ld: &Loader, il: usize) -> Result<AttnLayer> {
        let hp = ld.hp();
        let ne = hp.n_embd;
        let (nq, nk, nv) = (hp.n_head(il) * hp.n_embd_head_k, hp.n_embd_k_gqa(il), hp.n_embd_v_gqa(il));
        Ok(AttnLayer {
            qkv: Qkv::load(ld, il, ne, nq, nk, nv)?,
            wo: ld.req(&format!("blk.{il}.attn_output.weight"), &[hp.n_head(il) * hp.n_embd_head_v, ne])?,
            bo: ld.opt_vec(&format!("blk.{il}.attn_output.bias"), &[ne])?,
        })
    }

    pub fn weights(&self) -> AttnWeights<'_> {
        self.qkv.weights(&self.wo, self.bo.as_deref())
    }
}

/// The owned weights of a gated (`FfnGate::Par`) feed-forward with optional biases.
pub struct FfnLayer {
    pub gate: TensorView<'static>,
    pub up: TensorView<'static>,
    pub down: TensorView<'static>,
    pub gate_b: Option<Vec<f32>>,
    pub up_b: Option<Vec<f32>>,
    pub down_b: Option<Vec<f32>>,
}

impl FfnLayer {
    /// `blk.{il}.ffn_{gate,up,down}.weight` ({n_embd, nf}, {n_embd, nf}, {nf, n_embd}) and
    /// their optional `.bias`.
    pub fn load(ld: &Loader, il: usize, nf: usize) -> Result<FfnLayer> {
        let ne = ld.hp().n_embd;
        let b = |s: &str| format!("blk.{il}.{s}");
        Ok(FfnLayer {
            gate: ld.req(&b("ffn_gate.weight"), &[ne, nf])?,
            up: ld.req(&b("ffn_up.weight"), &[ne, nf])?,
            down: ld.req(&b("ffn_down.weight"), &[nf, ne])?,
            gate_b: ld.opt_vec(&b("ffn_gate.bias"), &[nf])?,
            up_b: ld.opt_vec(&b("ffn_up.bias"), &[nf])?,
            down_b: ld.opt_vec(&b("ffn_down.bias"), &[ne])?,
        })
    }

    pub fn weights(&self) -> FfnWeights<'_> {
        FfnWeights {
            gate: Some(&self.gate),
            gate_b: self.gate_b.as_deref(),
            up: &self.up,
            up_b: self.up_b.as_deref(),
            down: &self.down,
            down_b: self.down_b.as_deref(),
        }
    }
}

/// The normalization of `build_norm` (llama.cpp's LLM_NORM_RMS / LLM_NORM).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Norm {
    Rms,
    Layer,
}

/// The index in `tabs` of the cos/sin table of rope variant `r` for head size `hd` at
/// positions `pos` ([pos.len()][hd]: `fill_cache` of each position), filled here (tokens
/// split over the pool) unless an entry for exactly these already holds it. An entry of the
/// same variant and head size is refilled in place; past `ROPE_TABS` entries the oldest goes.
fn rope_table(pool: &ThreadPool, tabs: &mut Vec<crate::context::RopeTab>, r: &RopeParams, hd: usize, pos: &[i32]) -> usize {
    if let Some(i) = tabs.iter().position(|e| e.head_k == hd && e.params == *r && e.pos == pos) {
        return i;
    }
    let i = match tabs.iter().position(|e| e.head_k == hd && e.params == *r) {
        Some(i) => i,
        None => {
            if tabs.len() >= crate::context::ROPE_TABS {
                tabs.remove(0);
            }
            tabs.push(crate::context::RopeTab { params: r.clone(), head_k: hd, pos: Vec::new(), tab: Vec::new() });
            tabs.len() - 1
        }
    };
    let e = &mut tabs[i];
    e.pos.clear();
    e.pos.extend_from_slice(pos);
    e.tab.resize(pos.len() * hd, 0.0);
    let tp = SyncPtr(e.tab.as_mut_ptr());
    par_ranges(pool, pos.len(), &|ts| {
        for t in ts {
            // SAFETY: row t of the table (pos.len() rows of hd) belongs to the one thread
            // that runs token t
            r.fill_cache(pos[t], unsafe { std::slice::from_raw_parts_mut(tp.get().add(t * hd), hd) });
        }
    });
    i
}

/// Stores a micro-batch's K rows (`k`: one per cell, `cells.len()` of them) and V rows into
/// layer `il`'s cache at `cells`, each with ggml's `from_float` for the cache's type. A
/// prompt's cells run consecutively in one stream (find_slot from an empty or compact
/// cache): distinct cells, so there the tokens are split across the pool (serially this was
/// ~1% of Gemma 3's pp512 with the other thread idle); other layouts keep one thread.
pub(crate) fn store_kv_rows(pool: &ThreadPool, kv: &mut crate::kv_cache::KvCache, il: usize, cells: &[(u32, u32)], k: &[f32], v: &[f32]) -> Result<()> {
    let n = cells.len();
    if n == 0 {
        return Ok(());
    }
    let (kw, vw) = (k.len() / n, v.len() / n);
    let (rk, rv) = (kv.row_k[il], kv.row_v[il]);
    let (tk, tv) = (kv.type_k, kv.type_v);
    let consecutive = cells.windows(2).all(|c| c[1].0 == c[0].0 && c[1].1 == c[0].1 + 1);
    if !(consecutive && n * (kw + vw) >= PAR_MIN && pool.n_threads() > 1) {
        for (t, &(s, cell)) in cells.iter().enumerate() {
            let o = (s as usize * kv.size + cell as usize) * rk;
            quant::quantize_row_cpu(tk, &k[t * kw..(t + 1) * kw], &mut kv.k[il][o..o + rk])?;
            let o = (s as usize * kv.size + cell as usize) * rv;
            quant::quantize_row_cpu(tv, &v[t * vw..(t + 1) * vw], &mut kv.v[il][o..o + rv])?;
        }
        return Ok(());
    }
    let (s, c0) = cells[0];
    let first = s as usize * kv.size + c0 as usize;
    if kv.k[il].len() < (first + n) * rk || kv.v[il].len() < (first + n) * rv {
        return Err(Error::Invalid(format!("layer {il}: cells {c0}..{} of stream {s} past the KV cache", c0 as usize + n)));
    }
    let (kp, vp) = (SyncPtr(kv.k[il][first * rk..].as_mut_ptr()), SyncPtr(kv.v[il][first * rv..].as_mut_ptr()));
    let failed = std::sync::Mutex::new(None);
    par_ranges(pool, n, &|ts| {
        for t in ts {
            // SAFETY: token t's K and V rows (rk / rv bytes at t * rk / t * rv past the first
            // cell's, in bounds: checked above) are written by the one thread that runs t
            let (kr, vr) = unsafe { (std::slice::from_raw_parts_mut(kp.get().add(t * rk), rk), std::slice::from_raw_parts_mut(vp.get().add(t * rv), rv)) };
            let r = quant::quantize_row_cpu(tk, &k[t * kw..(t + 1) * kw], kr).and_then(|_| quant::quantize_row_cpu(tv, &v[t * vw..(t + 1) * vw], vr));
            if let Err(e) = r {
                failed.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert(e);
                return;
            }
        }
    });
    match failed.into_inner().unwrap_or_else(|e| e.into_inner()) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Fewest elements for which an elementwise step runs across the pool: below it (a decode
/// step's rows) a parallel region costs more than the step.
const PAR_MIN: usize = 1 << 15;

/// f(range) over 0..n across the pool's threads (one call with all of it when there is one
/// thread or n <= 1): guided runs (`run_guided`), each thread from its own even share first,
/// then from the back of the others', the runs shrinking to one item at the end. Every
/// caller's items are independent, so which thread runs an item changes nothing. (Even
/// halves left one thread waiting for the other at most regions' ends: Gemma 3's pp512,
/// ~25-60 us a region in the geglu, rope and per-head norms.)
pub(crate) fn par_ranges(pool: &ThreadPool, n: usize, f: &(dyn Fn(std::ops::Range<usize>) + Sync)) {
    par_ranges_by(pool, n, 1, f)
}

/// `par_ranges` in runs of whole `granule`s of items (the last one may be short); n <=
/// granule items go in one call on the caller.
fn par_ranges_by(pool: &ThreadPool, n: usize, granule: usize, f: &(dyn Fn(std::ops::Range<usize>) + Sync)) {
    let g = granule.max(1);
    if n <= g || pool.n_threads() == 1 {
        f(0..n);
        return;
    }
    crate::ops::matmul::run_guided(pool, n.div_ceil(g), usize::MAX, &|_, r| f(r.start * g..(r.end * g).min(n)));
}

/// Rows per unit of `par_row_blocks`' runs: `rms_norm_rows_inplace` sums 8 rows at once (one
/// per f64 lane) and the rest one at a time, ~8x slower a row, so runs of whole 8-row
/// blocks keep a prompt's and a batched decode step's rows on the 8-row path.
const ROW_GRANULE: usize = 8;

/// f(first row index, rows) over the first `rows` rows of width `w` of `data`: runs of
/// contiguous rows (`par_ranges`' guided runs, whole ROW_GRANULE blocks) as one slice ([k,
/// w]) each, for row functions that do several rows at once (`rms_norm_rows_inplace`); each
/// row's result never depends on the split.
pub(crate) fn par_row_blocks(pool: &ThreadPool, data: &mut [f32], w: usize, rows: usize, f: &(dyn Fn(usize, &mut [f32]) + Sync)) {
    let rows = rows.min(if w > 0 { data.len() / w } else { 0 });
    let p = SyncPtr(data.as_mut_ptr());
    // SAFETY: the ranges are disjoint, inside data's first `rows` rows, each one thread's.
    par_ranges_by(pool, rows, ROW_GRANULE, &|r| f(r.start, unsafe { std::slice::from_raw_parts_mut(p.get().add(r.start * w), r.len() * w) }));
}

/// q [n, qw] *= s (Gemma 3's 1 / sqrt(query_pre_attn_scalar); nothing where s is 1), each
/// thread its tokens' rows (a Gemma 3 prompt's q is 2 MB, ~80 us serially).
fn scale_q(pool: &ThreadPool, q: &mut [f32], qw: usize, n: usize, s: f32) {
    if s != 1.0 {
        par_row_blocks(pool, q, qw, n, &|_, rs| act::scale(rs, s));
    }
}

/// f(row index, row) over the first `rows` rows of width `w` of `data`, in `par_row_blocks`'
/// runs across the pool (each row's result never depends on the split).
pub(crate) fn par_rows(pool: &ThreadPool, data: &mut [f32], w: usize, rows: usize, f: &(dyn Fn(usize, &mut [f32]) + Sync)) {
    par_row_blocks(pool, data, w, rows, &|r0, rs| {
        for (i, r) in rs.chunks_exact_mut(w).enumerate() {
            f(r0 + i, r);
        }
    });
}

pub(crate) fn add_bias(x: &mut [f32], b: Option<&[f32]>, width: usize, n: usize) {
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

    /// cur [n, n_embd] = norm(x [n, n_embd]) * w [n_embd] (+ b [n_embd]) over the live rows
    /// (phimoe's RMS norms have biases too).
    pub fn build_norm(&mut self, w: &[f32], b: Option<&[f32]>, kind: Norm, eps: f32) {
        let (ne, n) = (self.hp.n_embd, self.n);
        let (x, cur) = (&self.b.x, &mut self.b.cur);
        // each thread copies its own rows of x (a prompt's x is megabytes: copied serially
        // it was ~1% of Gemma 3's pp512 with the other thread waiting)
        match kind {
            Norm::Rms => par_row_blocks(self.pool, cur, ne, n, &|r0, rs| {
                rs.copy_from_slice(&x[r0 * ne..r0 * ne + rs.len()]);
                rms_norm_rows_inplace(rs, ne, Some(w), eps);
                if let Some(b) = b {
                    for r in rs.chunks_exact_mut(ne) {
                        act::add_assign(r, b);
                    }
                }
            }),
            Norm::Layer => par_rows(self.pool, cur, ne, n, &|i, r| {
                r.copy_from_slice(&x[i * ne..(i + 1) * ne]);
                layer_norm_row(r, Some(w), b, eps)
            }),
        }
    }

    /// tmp [n, n_embd] = rmsnorm(tmp) * w [n_embd]: the norm of a block's output before the residual
    /// (gemma2/3's post_attention_norm and post_ffw_norm).
    pub fn build_post_norm(&mut self, w: &[f32], eps: f32) {
        let (ne, n) = (self.hp.n_embd, self.n);
        par_row_blocks(self.pool, &mut self.b.tmp, ne, n, &|_, rs| rms_norm_rows_inplace(rs, ne, Some(w), eps));
    }

    /// Dense feed-forward: in `cur` [n, n_embd], out `tmp` [n, n_embd]; `gate` [n, n_ff] and
    /// `up` [n, n_ff] hold the intermediates.
    pub fn build_ffn(&mut self, il: usize, w: &FfnWeights, act: FfnAct, gate: FfnGate) -> Result<()> {
        let n = self.n;
        let n_ff = w.down.ne[0];
        let b = &mut *self.b;
        if gate == FfnGate::None {
            Self::mm(self.pool, self.dev, w.up, &b.cur, n, &mut b.up, &mut b.mm_scratch, &mut b.lora)?;
            add_bias(&mut b.up, w.up_b, n_ff, n);
            cb!(self, "ffn_up", il, up, n_ff);
            let b = &mut *self.b;
            match act {
                FfnAct::Gelu => par_rows(self.pool, &mut b.up, n_ff, n, &|_, r| act::gelu(r)),
                FfnAct::Silu => par_rows(self.pool, &mut b.up, n_ff, n, &|_, r| r.iter_mut().for_each(|v| *v = act::silu(*v))),
                FfnAct::Relu => par_rows(self.pool, &mut b.up, n_ff, n, &|_, r| r.iter_mut().for_each(|v| *v = v.max(0.0))),
            }
            cb!(self, if act == FfnAct::Gelu { "ffn_gelu" } else { "ffn_silu" }, il, up, n_ff);
            let b = &mut *self.b;
            Self::mm(self.pool, self.dev, w.down, &b.up, n, &mut b.tmp, &mut b.mm_scratch, &mut b.lora)?;
            add_bias(&mut b.tmp, w.down_b, self.hp.n_embd, n);
            return Ok(());
        }
        // one token: gate and up (two matrices, or the halves of a fused one) in one region
        let gate_up = match (gate, w.gate) {
            (FfnGate::Par, Some(g)) if g.n_rows() == n_ff && w.up.n_rows() == n_ff => Some((g, 0..n_ff, 0..n_ff)),
            (FfnGate::Fused, None) if w.up.n_rows() == 2 * n_ff => Some((w.up, 0..n_ff, n_ff..2 * n_ff)),
            _ => None,
        };
        let fused = match gate_up {
            Some((g, rg, ru)) if n == 1 && b.gate.len() >= n_ff && b.up.len() >= n_ff => {
                let mut parts = [FusedPart { w: g, rows: rg, out: &mut b.gate[..n_ff] }, FusedPart { w: w.up, rows: ru, out: &mut b.up[..n_ff] }];
                Self::mm_fused(self.pool, self.dev, &b.cur, n, &mut parts, &mut b.mm_scratch, &b.lora)?
            }
            _ => false,
        };
        match (gate, w.gate) {
            _ if fused => {}
            (FfnGate::Par, Some(g)) => {
                Self::mm(self.pool, self.dev, g, &b.cur, n, &mut b.gate, &mut b.mm_scratch, &mut b.lora)?;
                Self::mm_rows_x(self.pool, self.dev, w.up, &b.cur, n, &mut b.up, 0..w.up.n_rows(), &mut b.mm_scratch, &mut b.lora, true)?;
            }
            (FfnGate::Fused, None) => {
                Self::mm_rows(self.pool, self.dev, w.up, &b.cur, n, &mut b.gate, 0..n_ff, &mut b.mm_scratch, &mut b.lora)?;
                Self::mm_rows_x(self.pool, self.dev, w.up, &b.cur, n, &mut b.up, n_ff..2 * n_ff, &mut b.mm_scratch, &mut b.lora, true)?;
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
            FfnAct::Relu => return Err(Error::Invalid(format!("internal: layer {il}: a gated ReLU feed-forward"))),
        }
        cb!(self, if act == FfnAct::Silu { "ffn_swiglu" } else { "ffn_geglu" }, il, gate, n_ff);
        let b = &mut *self.b;
        Self::mm(self.pool, self.dev, w.down, &b.gate, n, &mut b.tmp, &mut b.mm_scratch, &mut b.lora)?;
        add_bias(&mut b.tmp, w.down_b, self.hp.n_embd, n);
        Ok(())
    }

    /// Mixture-of-experts feed-forward (llama.cpp's `build_moe_ffn`): in `cur` [n, n_embd],
    /// out `tmp` [n, n_embd]. Per token: router logits (+ router bias), gating (softmax,
    /// sigmoid, or none for SoftmaxWeight), selection scores (the probabilities + probs_b,
    /// or the raw logits for llama4; the best expert groups only when there are groups),
    /// the `n_used` best experts (ties to the lower id), their weights (softmaxed for
    /// SoftmaxWeight, renormalized with `norm_w`, scaled by `w_scale`), and the sum over
    /// them (in selection order) of weight * down_e(act(gate_e x, up_e x)) (llama4: of
    /// down_e(act(gate_e (weight x), up_e (weight x)))). Tokens are grouped per expert so
    /// each expert's matrices are streamed once per micro-batch. Scratch: `moe` / `moe_idx`
    /// (reserved at context creation), `gate` / `up`.
    pub fn build_moe_ffn(&mut self, il: usize, m: &MoeWeights, c: &MoeConfig) -> Result<()> {
        self.build_moe_ffn_ext(il, m, c, &MoeExtra::default())
    }

    /// `build_moe_ffn` with Gemma 4's additions (`MoeExtra`): router logits given, a
    /// per-expert output scale, fused gate+up experts; GELU experts with a gate are
    /// gelu(gate) * up (llama.cpp's geglu).
    pub fn build_moe_ffn_ext(&mut self, il: usize, m: &MoeWeights, c: &MoeConfig, x: &MoeExtra) -> Result<()> {
        let (n, ne) = (self.n, self.hp.n_embd);
        let n_used = c.n_used;
        let n_exp = m.router.ne[1];
        let fused = x.gate_up;
        let nf = if fused { m.up.ne[1] / 2 } else { m.up.ne[1] };
        let gate_ok = m.gate.is_none_or(|g| g.ne[1] == nf && g.ne[2] == n_exp) && !(fused && (m.gate.is_some() || m.up.ne[1] % 2 != 0));
        let lg_ok = x.logits.is_none_or(|l| l.len() >= n * n_exp) && x.down_s.is_none_or(|s| s.len() == n_exp);
        if !lg_ok {
            return Err(Error::Invalid(format!("internal: layer {il}: router logits or expert scales of the wrong size")));
        }
        if n_used == 0 || n_used > n_exp || !gate_ok || m.up.ne[2] != n_exp || m.down.ne[2] != n_exp {
            return Err(Error::Invalid(format!("layer {il}: inconsistent expert tensors ({n_exp} experts, {n_used} used)")));
        }
        let groups = if c.n_groups > 1 { c.n_groups } else { 1 };
        if n_exp % groups != 0 || (groups > 1 && (c.n_group_used == 0 || c.n_group_used > groups)) {
            return Err(Error::Invalid(format!(
                "layer {il}: {n_exp} experts cannot form {groups} groups of which {} are used",
                c.n_group_used
            )));
        }
        let b = &mut *self.b;
        let nk = n * n_used; // (token, selection) slots
        let need = n * n_exp + nk + nk * ne + 2 * n * ne;
        if b.moe.len() < need || b.moe_idx.capacity() < 2 * nk || b.gate.len() < n * nf || b.up.len() < n * nf {
            return Err(Error::Invalid(format!("internal: MoE scratch too small for layer {il}")));
        }
        match x.logits {
            Some(l) => b.moe[..n * n_exp].copy_from_slice(&l[..n * n_exp]),
            None => Self::mm(self.pool, self.dev, m.router, &b.cur, n, &mut b.moe[..n * n_exp], &mut b.mm_scratch, &mut b.lora)?,
        }
        cb!(self, "ffn_moe_logits", il, moe, n_exp);
        let b = &mut *self.b;
        let (probs, rest) = b.moe.split_at_mut(n * n_exp);
        let (wts, rest) = rest.split_at_mut(nk);
        let (contrib, rest) = rest.split_at_mut(nk * ne);
        let (xg, o) = rest.split_at_mut(n * ne);
        // selection and weights per token: n_used passes of argmax (the first maximum wins)
        let idx = &mut b.moe_idx;
        idx.clear();
        let mut sel = vec![0f32; n_exp];
        let per_group = n_exp / groups;
        for t in 0..n {
            let p = &mut probs[t * n_exp..(t + 1) * n_exp];
            if let Some(rb) = m.router_b {
                act::add_assign(p, rb);
            }
            if c.llama4 {
                sel.copy_from_slice(p);
            }
            match c.gating {
                Gating::Softmax => act::softmax_ggml(p),
                Gating::Sigmoid => p.iter_mut().for_each(|v| *v = 1.0 / (1.0 + (-*v).exp())),
                Gating::SoftmaxWeight => {}
            }
            if !c.llama4 {
                sel.copy_from_slice(p);
                if let Some(pb) = m.probs_b {
                    act::add_assign(&mut sel, pb);
                }
            }
            if groups > 1 {
                // a group's score: the sum of its two best selection scores; the other
                // groups' experts are masked out
                let mut gs: Vec<(f32, usize)> = sel
                    .chunks_exact(per_group)
                    .enumerate()
                    .map(|(g, s)| {
                        let (mut a, mut bb) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
                        for &v in s {
                            if v > a {
                                bb = a;
                                a = v;
                            } else if v > bb {
                                bb = v;
                            }
                        }
                        (if per_group > 1 { a + bb } else { a }, g)
                    })
                    .collect();
                gs.sort_by(|x, y| y.0.total_cmp(&x.0).then(x.1.cmp(&y.1)));
                for &(_, g) in &gs[c.n_group_used..] {
                    sel[g * per_group..(g + 1) * per_group].fill(f32::NEG_INFINITY);
                }
            }
            for j in 0..n_used {
                let mut best = usize::MAX;
                for (e, &v) in sel.iter().enumerate() {
                    let taken = idx[t * n_used..t * n_used + j].contains(&e);
                    if !taken && (best == usize::MAX || v > sel[best]) {
                        best = e;
                    }
                }
                idx.push(best);
                wts[t * n_used + j] = p[best];
            }
            let w = &mut wts[t * n_used..(t + 1) * n_used];
            if c.gating == Gating::SoftmaxWeight {
                act::softmax_ggml(w);
            }
            if c.norm_w {
                let sum: f64 = w.iter().map(|&v| v as f64).sum();
                let s = (sum as f32).max(6.103_515_6e-5);
                w.iter_mut().for_each(|v| *v /= s);
            }
            if c.w_scale != 0.0 && c.w_scale != 1.0 {
                act::scale(w, c.w_scale);
            }
        }
        fn ebias(bias: Option<&[f32]>, e: usize, width: usize) -> Option<&[f32]> {
            bias.map(|v| &v[e * width..(e + 1) * width])
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
                let k = idx[nk + r];
                let t = k / n_used;
                let row = &mut xg[r * ne..(r + 1) * ne];
                row.copy_from_slice(&b.cur[t * ne..(t + 1) * ne]);
                if c.llama4 {
                    act::scale(row, wts[k]);
                }
            }
            crate::quantize::collect::observe_experts(m.up, e, &xg[..mt * ne], &idx[nk..], n_used); // imatrix
            let up_rows = if fused { (2 * e + 1) * nf..(2 * e + 2) * nf } else { e * nf..(e + 1) * nf };
            Self::mm_rows(self.pool, self.dev, m.up, xg, mt, &mut b.up, up_rows, &mut b.mm_scratch, &mut b.lora)?;
            add_bias(&mut b.up, ebias(m.up_b, e, nf), nf, mt);
            if fused {
                let rows = 2 * e * nf..(2 * e + 1) * nf;
                Self::mm_rows(self.pool, self.dev, m.up, xg, mt, &mut b.gate, rows, &mut b.mm_scratch, &mut b.lora)?;
            }
            if fused || m.gate.is_some() {
                if let Some(g) = m.gate {
                    crate::quantize::collect::observe_experts(g, e, &xg[..mt * ne], &idx[nk..], n_used); // imatrix
                    Self::mm_rows(self.pool, self.dev, g, xg, mt, &mut b.gate, e * nf..(e + 1) * nf, &mut b.mm_scratch, &mut b.lora)?;
                    add_bias(&mut b.gate, ebias(m.gate_b, e, nf), nf, mt);
                }
                for r in 0..mt {
                    let (g, u) = (&mut b.gate[r * nf..(r + 1) * nf], &b.up[r * nf..(r + 1) * nf]);
                    match c.act {
                        MoeAct::Silu => act::swiglu(g, u),
                        MoeAct::SwigluOai => act::swiglu_oai(g, u, 1.702, 7.0),
                        MoeAct::Gelu => act::geglu(g, u),
                    }
                }
            } else if c.act == MoeAct::Gelu {
                b.gate[..mt * nf].copy_from_slice(&b.up[..mt * nf]);
                act::gelu(&mut b.gate[..mt * nf]);
            } else {
                for r in 0..mt {
                    for (g, u) in b.gate[r * nf..(r + 1) * nf].iter_mut().zip(&b.up[r * nf..(r + 1) * nf]) {
                        *g = act::silu(*u);
                    }
                }
            }
            crate::quantize::collect::observe_experts(m.down, e, &b.gate[..mt * nf], &idx[nk..], n_used); // imatrix
            Self::mm_rows(self.pool, self.dev, m.down, &b.gate, mt, o, e * ne..(e + 1) * ne, &mut b.mm_scratch, &mut b.lora)?;
            if let Some(s) = x.down_s {
                act::scale(&mut o[..mt * ne], s[e]);
            }
            add_bias(o, ebias(m.down_b, e, ne), ne, mt);
            for r in 0..mt {
                let k = idx[nk + r];
                let w = if c.llama4 { 1.0 } else { wts[k] };
                for (d, v) in contrib[k * ne..(k + 1) * ne].iter_mut().zip(&o[r * ne..(r + 1) * ne]) {
                    *d = if c.llama4 { *v } else { v * w };
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

    /// The shared expert beside a MoE layer (llama.cpp: build_ffn of the `*_shexp`
    /// tensors on the MoE's input, added to its output): in `cur` [n, n_embd], `tmp` [n,
    /// n_embd] holding the MoE output, out `tmp` = moe + shexp. Uses the MoE scratch's
    /// last [n, n_embd] rows to keep the MoE output.
    pub fn build_moe_shexp(&mut self, il: usize, w: &FfnWeights) -> Result<()> {
        let (n, ne) = (self.n, self.hp.n_embd);
        let b = &mut *self.b;
        let len = b.moe.len();
        if len < n * ne {
            return Err(Error::Invalid(format!("internal: MoE scratch too small for layer {il}")));
        }
        let keep = &mut b.moe[len - n * ne..];
        keep.copy_from_slice(&b.tmp[..n * ne]);
        self.build_ffn(il, w, FfnAct::Silu, FfnGate::Par)?;
        cb!(self, "ffn_shexp", il, tmp, ne);
        let b = &mut *self.b;
        let len = b.moe.len();
        act::add_assign(&mut b.tmp[..n * ne], &b.moe[len - n * ne..]);
        Ok(())
    }

    /// x [n, n_embd] += tmp [n, n_embd]
    pub fn residual(&mut self) {
        let (ne, n) = (self.hp.n_embd, self.n);
        if n * ne < PAR_MIN {
            act::add_assign(&mut self.b.x[..n * ne], &self.b.tmp[..n * ne]);
            return;
        }
        // a prompt's rows split across the pool (each element's one addition whoever does it)
        let tmp = &self.b.tmp;
        par_row_blocks(self.pool, &mut self.b.x, ne, n, &|r0, rs| act::add_assign(rs, &tmp[r0 * ne..r0 * ne + rs.len()]));
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
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn mm(
        pool: &ThreadPool,
        dev: Option<&dyn Backend>,
        w: &TensorView,
        x: &[f32],
        n: usize,
        out: &mut [f32],
        scratch: &mut Vec<u8>,
        lora: &mut Option<LoraSet>,
    ) -> Result<()> {
        Self::mm_rows_x(pool, dev, w, x, n, out, 0..w.n_rows(), scratch, lora, false)
    }

    /// One token's products of the same activations `x` (q, k and v; gate and up) in one
    /// parallel region (`matmul_single_fused`) where that applies: a single token, no
    /// device, no LoRA adapter. Ok(false): nothing was done; the caller runs them one by one.
    pub(crate) fn mm_fused(
        pool: &ThreadPool,
        dev: Option<&dyn Backend>,
        x: &[f32],
        n: usize,
        parts: &mut [FusedPart],
        scratch: &mut Vec<u8>,
        lora: &Option<LoraSet>,
    ) -> Result<bool> {
        let n_in = parts.first().map_or(0, |p| p.w.ne[0]);
        // (matmul_single_fused declines parts of another width)
        if n != 1 || dev.is_some() || lora.is_some() || x.len() < n_in {
            return Ok(false);
        }
        if !matmul_single_fused(pool, parts, &x[..n_in], scratch)? {
            return Ok(false);
        }
        for p in parts.iter() {
            if p.rows.start == 0 {
                // imatrix (no-op unless collecting); a fused matrix counts once, as in mm_rows
                crate::quantize::collect::observe(p.w, &x[..n_in], 1);
            }
        }
        Ok(true)
    }

    /// Rows `rows` of w times x into out [n, rows.len()] (a slice of a fused matrix).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn mm_rows(
        pool: &ThreadPool,
        dev: Option<&dyn Backend>,
        w: &TensorView,
        x: &[f32],
        n: usize,
        out: &mut [f32],
        rows: std::ops::Range<usize>,
        scratch: &mut Vec<u8>,
        lora: &mut Option<LoraSet>,
    ) -> Result<()> {
        Self::mm_rows_x(pool, dev, w, x, n, out, rows, scratch, lora, false)
    }

    /// `mm_rows`; `same_x`: right after another product of the same `x` (unchanged) on the
    /// same scratch (q, k, v; gate, up), whose quantized activations are then reused where
    /// they fit (`matmul_on_same_x`).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn mm_rows_x(
        pool: &ThreadPool,
        dev: Option<&dyn Backend>,
        w: &TensorView,
        x: &[f32],
        n: usize,
        out: &mut [f32],
        rows: std::ops::Range<usize>,
        scratch: &mut Vec<u8>,
        lora: &mut Option<LoraSet>,
        same_x: bool,
    ) -> Result<()> {
        let (n_in, width) = (w.ne[0], rows.len());
        if x.len() < n * n_in || out.len() < n * width || rows.end > w.n_rows() {
            return Err(Error::Invalid(format!("internal: scratch too small or bad rows {rows:?} for '{}'", w.name)));
        }
        let on = if same_x { matmul_on_same_x } else { matmul_on };
        on(dev, pool, w, &x[..n * n_in], n, &mut out[..n * width], width, rows.clone(), scratch)?;
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
        self.build_attn_ext(w, c, &AttnExtra::default())
    }

    /// `build_attn` with what few architectures need (`AttnExtra`): a weightless RMSNorm of
    /// V, or a layer that attends over an earlier layer's cache (llama.cpp's KV reuse).
    pub fn build_attn_ext(&mut self, w: &AttnWeights, c: &AttnConfig, x: &AttnExtra) -> Result<()> {
        self.with_qk_scratch(|st| st.build_attn_qkv(w, c, x))
    }

    /// Runs `f` (an attention) with q and k borrowing the FFN's gate and up buffers (a
    /// layer's attention and FFN never overlap), saving n_ubatch x (n_q + n_kv) floats of
    /// scratch.
    pub(crate) fn with_qk_scratch(&mut self, f: impl FnOnce(&mut Self) -> Result<()>) -> Result<()> {
        let b = &mut *self.b;
        std::mem::swap(&mut b.q, &mut b.gate);
        std::mem::swap(&mut b.k, &mut b.up);
        let r = f(self);
        let b = &mut *self.b;
        std::mem::swap(&mut b.q, &mut b.gate);
        std::mem::swap(&mut b.k, &mut b.up);
        r
    }

    /// Layer `il`'s q/k/v projections of the live rows from `cur`, biases added: q [n, qw],
    /// k [n, kw], v [n, vw] (qw = n_head * hd_k, kw = n_head_kv * hd_k, vw = n_head_kv *
    /// hd_v; returned), from one fused matrix (row ranges) or three; `q_only`: q alone (a
    /// layer that reads another layer's cache).
    pub(crate) fn project_qkv(&mut self, w: &AttnWeights, il: usize, q_only: bool) -> Result<(usize, usize, usize)> {
        let (hp, n) = (self.hp, self.n);
        let (hd_k, hd_v) = (hp.head_k(il), hp.head_v(il));
        let (qw, kw, vw) = (hp.n_head(il) * hd_k, hp.n_head_kv(il) * hd_k, hp.n_head_kv(il) * hd_v);
        let b = &mut *self.b;
        // one token: q, k and v in one region where the shapes are the plain ones
        let (wk, wv, rk, rv) = if w.fused_qkv { (w.wq, w.wq, qw..qw + kw, qw + kw..qw + kw + vw) } else { (w.wk, w.wv, 0..kw, 0..vw) };
        let fused = n == 1
            && !q_only
            && (w.fused_qkv || (w.wq.n_rows() == qw && wk.n_rows() == kw && wv.n_rows() == vw))
            && b.q.len() >= qw
            && b.k.len() >= kw
            && b.v.len() >= vw
            && Self::mm_fused(
                self.pool,
                self.dev,
                &b.cur,
                n,
                &mut [
                    FusedPart { w: w.wq, rows: 0..qw, out: &mut b.q[..qw] },
                    FusedPart { w: wk, rows: rk, out: &mut b.k[..kw] },
                    FusedPart { w: wv, rows: rv, out: &mut b.v[..vw] },
                ],
                &mut b.mm_scratch,
                &b.lora,
            )?;
        if fused {
            // q, k and v in the fused region above
        } else if w.fused_qkv {
            Self::mm_rows(self.pool, self.dev, w.wq, &b.cur, n, &mut b.q, 0..qw, &mut b.mm_scratch, &mut b.lora)?;
            if !q_only {
                // k and v from the same activations as q: quantized once (`matmul_on_same_x`)
                Self::mm_rows_x(self.pool, self.dev, w.wq, &b.cur, n, &mut b.k, qw..qw + kw, &mut b.mm_scratch, &mut b.lora, true)?;
                Self::mm_rows_x(self.pool, self.dev, w.wq, &b.cur, n, &mut b.v, qw + kw..qw + kw + vw, &mut b.mm_scratch, &mut b.lora, true)?;
            }
        } else {
            Self::mm(self.pool, self.dev, w.wq, &b.cur, n, &mut b.q, &mut b.mm_scratch, &mut b.lora)?;
            if !q_only {
                Self::mm_rows_x(self.pool, self.dev, w.wk, &b.cur, n, &mut b.k, 0..w.wk.n_rows(), &mut b.mm_scratch, &mut b.lora, true)?;
                Self::mm_rows_x(self.pool, self.dev, w.wv, &b.cur, n, &mut b.v, 0..w.wv.n_rows(), &mut b.mm_scratch, &mut b.lora, true)?;
            }
        }
        add_bias(&mut b.q, w.bq, qw, n);
        if !q_only {
            add_bias(&mut b.k, w.bk, kw, n);
            add_bias(&mut b.v, w.bv, vw, n);
        }
        Ok((qw, kw, vw))
    }

    fn build_attn_qkv(&mut self, w: &AttnWeights, c: &AttnConfig, x: &AttnExtra) -> Result<()> {
        let hp = self.hp;
        let il = c.il;
        let n = self.n;
        let n_head_kv = hp.n_head_kv(il);
        let (hd_k, hd_v) = (hp.head_k(il), hp.head_v(il));
        if let Some(src) = x.kv_from {
            // a layer without a cache of its own: q only, then the keys and values layer
            // `src` stored (its head counts must be this layer's)
            if src >= il || hp.n_head_kv(src) != n_head_kv {
                return Err(Error::Invalid(format!("internal: layer {il} cannot read the cache of layer {src}")));
            }
            let (qw, _, _) = self.project_qkv(w, il, true)?;
            cb!(self, "Qcur", il, q, qw);
            let b = &mut *self.b;
            if let Some(qn) = w.q_norm {
                let width = if qn.len() == qw { qw } else { hd_k };
                for h in b.q[..n * qw].chunks_exact_mut(width) {
                    rms_norm_row(h, Some(qn), hp.f_norm_rms_eps);
                }
                cb!(self, "Qcur_normed", il, q, qw);
            }
            let b = &mut *self.b;
            if let Some(r) = c.rope {
                let pos = &b.pos;
                for t in 0..n {
                    r.apply_heads(&mut b.q[t * qw..(t + 1) * qw], hd_k, pos[t], &mut b.rope_cache);
                }
                cb!(self, "Qcur_pos", il, q, qw);
            }
            scale_q(self.pool, &mut self.b.q, qw, n, c.q_scale);
            return self.attend_and_project(w, c, Some(src));
        }
        let (qw, kw, vw) = self.project_qkv(w, il, false)?;
        let b = &mut *self.b;
        let eps = hp.f_norm_rms_eps;
        // per-head norms: each thread its tokens' rows, 8 heads' sums at a time
        if let Some(qn) = w.q_norm {
            let width = if qn.len() == qw { qw } else { hd_k };
            par_row_blocks(self.pool, &mut b.q, qw, n, &|_, rs| rms_norm_rows_inplace(rs, width, Some(qn), eps));
            cb!(self, "Qcur_normed", il, q, qw);
        }
        let b = &mut *self.b;
        if let Some(kn) = w.k_norm {
            let width = if kn.len() == kw { kw } else { hd_k };
            par_row_blocks(self.pool, &mut b.k, kw, n, &|_, rs| rms_norm_rows_inplace(rs, width, Some(kn), eps));
        }
        if x.v_rms {
            par_row_blocks(self.pool, &mut b.v, vw, n, &|_, rs| rms_norm_rows_inplace(rs, hd_v, None, eps));
        }
        if let Some(r) = c.rope {
            if hd_k <= 512 {
                // token t's q and k heads with one cos/sin table, the micro-batch's table of
                // this rope variant (`Buffers::rope_tabs`: filled by the first layer that
                // uses it, the same values `fill_cache` gives every layer)
                let ti = rope_table(self.pool, &mut b.rope_tabs, r, hd_k, &b.pos[..n]);
                let tab = &b.rope_tabs[ti].tab;
                let (qp, kp) = (SyncPtr(b.q.as_mut_ptr()), SyncPtr(b.k.as_mut_ptr()));
                let (qlen, klen) = (b.q.len(), b.k.len());
                let rope_token = |t: usize| {
                    let cache = &tab[t * hd_k..(t + 1) * hd_k];
                    // SAFETY: token t's q and k rows lie inside q and k (n rows of qw / kw,
                    // checked below) and belong to the one thread that runs token t.
                    let (q, k) = unsafe {
                        (std::slice::from_raw_parts_mut(qp.get().add(t * qw), qw), std::slice::from_raw_parts_mut(kp.get().add(t * kw), kw))
                    };
                    for h in q.chunks_exact_mut(hd_k).chain(k.chunks_exact_mut(hd_k)) {
                        r.apply(h, cache);
                    }
                };
                if qlen < n * qw || klen < n * kw {
                    return Err(Error::Invalid(format!("internal: layer {il}: q/k scratch too small for {n} tokens")));
                }
                par_ranges(self.pool, n, &|ts| ts.for_each(rope_token));
            } else {
                let pos = &b.pos;
                for t in 0..n {
                    r.apply_heads(&mut b.q[t * qw..(t + 1) * qw], hd_k, pos[t], &mut b.rope_cache);
                    r.apply_heads(&mut b.k[t * kw..(t + 1) * kw], hd_k, pos[t], &mut b.rope_cache);
                }
            }
        }
        scale_q(self.pool, &mut b.q, qw, n, c.q_scale);
        if let Some((ts, floor_len, offset)) = c.attn_temp {
            // llm_graph_input_attn_temp::set_input: (pos + offset) / floor_len and its floor
            // in f32, the log in f64, as there
            for t in 0..n {
                let p = ((b.pos[t] as f32 + offset) / floor_len.max(1) as f32).floor() as f64;
                let f = ((p + 1.0).ln() * ts as f64 + 1.0) as f32;
                act::scale(&mut b.q[t * qw..(t + 1) * qw], f);
            }
        }
        if c.qk_rms_after_rope {
            par_row_blocks(self.pool, &mut b.q, qw, n, &|_, rs| rms_norm_rows_inplace(rs, hd_k, None, eps));
            par_row_blocks(self.pool, &mut b.k, kw, n, &|_, rs| rms_norm_rows_inplace(rs, hd_k, None, eps));
        }
        cb!(self, "Qcur", il, q, qw);
        cb!(self, "Kcur", il, k, kw);
        cb!(self, "Vcur", il, v, vw);
        self.attend_and_project(w, c, None)
    }

    /// Attention of layer `c.il`'s prepared q (and, unless `kv_from`, its k/v, stored into
    /// the cache first) over the cache of layer `kv_from` or its own, then the output
    /// projection into `tmp` [n, n_embd].
    fn attend_and_project(&mut self, w: &AttnWeights, c: &AttnConfig, kv_from: Option<usize>) -> Result<()> {
        let (hp, il, n) = (self.hp, c.il, self.n);
        let p = AttnParams {
            il: kv_from.unwrap_or(il),
            n_head: hp.n_head(il),
            n_head_kv: hp.n_head_kv(il),
            hd_k: hp.head_k(il),
            hd_v: hp.head_v(il),
            scale: c.kq_scale,
            softcap: c.softcap,
            n_swa: c.n_swa,
            chunked: c.chunked,
            sinks: c.sinks,
        };
        match kv_from {
            Some(_) => self.attend_only(&p, il)?,
            None => self.attend_cached(&p)?,
        }
        let b = &mut *self.b;
        Self::mm(self.pool, self.dev, w.wo, &b.att, n, &mut b.tmp, &mut b.mm_scratch, &mut b.lora)?;
        add_bias(&mut b.tmp, w.bo, hp.n_embd, n);
        cb!(self, "attn_out", il, tmp, hp.n_embd);
        Ok(())
    }

    /// Stores this micro-batch's K (`k` [n, n_head_kv * hd_k]) and V (`v` [n, n_head_kv *
    /// hd_v]) into its cells, then attends with `q` [n, n_head * hd_k] over the cache into
    /// `att` [n, n_head * hd_v] (quantized caches: llama.cpp's Hadamard rotations of q, K
    /// and V, and V's undone on the output). `q` and `k` must be lent (see `build_attn`).
    pub fn attend_cached(&mut self, p: &AttnParams) -> Result<()> {
        self.attend_kv(p, true, p.il)
    }

    /// `attend_cached` of layer `name_il` over the cache of layer `p.il`; `store` false:
    /// that cache already holds this micro-batch's keys and values (a layer that reuses an
    /// earlier layer's cache), only `q` is read.
    fn attend_kv(&mut self, p: &AttnParams, store: bool, name_il: usize) -> Result<()> {
        let (il, n) = (p.il, self.n);
        let (qw, kw, vw) = (p.n_head * p.hd_k, p.n_head_kv * p.hd_k, p.n_head_kv * p.hd_v);
        let b = &mut *self.b;
        let kv = &mut *self.kv;
        // quantized caches: llama.cpp's Hadamard rotation of Q, K and V (kv_cache::rotation_sizes)
        crate::kv_cache::fwht(&mut b.q[..n * qw], kv.rot_k);
        if store {
            crate::kv_cache::fwht(&mut b.k[..n * kw], kv.rot_k);
            crate::kv_cache::fwht(&mut b.v[..n * vw], kv.rot_v);
            store_kv_rows(self.pool, kv, il, &b.cells[..n], &b.k[..n * kw], &b.v[..n * vw])?;
            kv.host_changed_layer(il);
        }
        self.attend_rotated(p, name_il)
    }

    /// Attends with `q` [n, n_head * hd_k] over layer `p.il`'s cached K/V into `att`,
    /// storing nothing: a layer that reuses another layer's cache (Gemma 3n's and Gemma 4's
    /// last layers; llama.cpp's layer_reuse_cb) passes that layer's id in `p.il` and its own
    /// as `name_il` (the name of its debug outputs).
    pub fn attend_only(&mut self, p: &AttnParams, name_il: usize) -> Result<()> {
        self.attend_kv(p, false, name_il)
    }

    fn attend_rotated(&mut self, p: &AttnParams, name_il: usize) -> Result<()> {
        let n = self.n;
        let b = &mut *self.b;
        let kv = &mut *self.kv;
        let inp = AttnInputs { pos: &b.pos[..n], stream: &b.stream[..n], key_range: &b.key_range[..n], keys: &b.keys };
        attention::attention(self.pool, kv, p, &inp, &b.q, &mut b.att, &mut b.attn_scratch, b.attn_stride);
        cb!(self, "kqv_out", name_il, att, p.n_head * p.hd_v);
        let b = &mut *self.b;
        crate::kv_cache::fwht(&mut b.att[..n * p.n_head * p.hd_v], self.kv.rot_v); // rotate V's rotation back
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
            Self::mm(self.pool, self.dev, output, &b.cur, n, dst, &mut b.mm_scratch, &mut b.lora)?;
            add_bias(dst, bias, nv, n);
            if final_softcap != 0.0 {
                act::softcap(dst, final_softcap);
            }
        } else {
            for j in 0..n {
                let r = b.out_row[j];
                Self::mm(self.pool, self.dev, output, &b.cur[j * ne..(j + 1) * ne], 1, &mut b.row, &mut b.mm_scratch, &mut b.lora)?;
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

/// The softmax scale `attention.scale` sets, else 1/sqrt(head size).
pub fn default_kq_scale(hp: &HParams) -> f32 {
    if hp.f_attention_scale != 0.0 {
        hp.f_attention_scale
    } else {
        1.0 / (hp.n_embd_head_k as f32).sqrt()
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
    let mut r = RopeParams::simple(hp.rope_type, hp.rot(il), base, scale);
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
            crate::ops::rope::yarn_corr_dims(hp.rot(il), hp.n_ctx_orig_yarn, base, hp.yarn_beta_fast, hp.yarn_beta_slow);
    }
    // rope.scaling.attn_factor (llama.cpp's default 1; 0 here means absent)
    if hp.rope_attn_factor != 0.0 {
        r.attn_factor *= hp.rope_attn_factor;
    }
    r
}

#[cfg(test)]
mod rope_table_tests {
    use super::rope_table;
    use crate::hparams::RopeType;
    use crate::ops::rope::RopeParams;
    use crate::threadpool::ThreadPool;

    #[test]
    fn rope_tables_hold_fill_cache_per_position_and_are_shared_only_when_everything_matches() {
        let pool = ThreadPool::new(2);
        let local = RopeParams::simple(RopeType::Neox, 64, 10000.0, 1.0);
        let global = RopeParams::simple(RopeType::Neox, 64, 1000000.0, 1.0);
        let pos: Vec<i32> = (0..37).map(|p| 3 * p + 1).collect();
        let mut tabs = Vec::new();
        let a = rope_table(&pool, &mut tabs, &local, 64, &pos);
        // every row is fill_cache's, bit for bit
        for (t, &p) in pos.iter().enumerate() {
            let mut want = [0f32; 64];
            local.fill_cache(p, &mut want);
            assert!(tabs[a].tab[t * 64..(t + 1) * 64].iter().zip(&want).all(|(x, y)| x.to_bits() == y.to_bits()), "position {p}");
        }
        // the same variant, head size and positions: the same entry, not refilled
        tabs[a].tab[5] = f32::NAN;
        assert_eq!(rope_table(&pool, &mut tabs, &local, 64, &pos), a);
        assert!(tabs[a].tab[5].is_nan());
        // another variant: its own entry; the first is kept
        let g = rope_table(&pool, &mut tabs, &global, 64, &pos);
        assert_ne!(g, a);
        assert_eq!(tabs.len(), 2);
        // other positions (the next micro-batch): the variant's entry refilled in place
        let pos2: Vec<i32> = (100..120).collect();
        assert_eq!(rope_table(&pool, &mut tabs, &local, 64, &pos2), a);
        let mut want = [0f32; 64];
        local.fill_cache(100, &mut want);
        assert_eq!(tabs[a].tab.len(), 20 * 64);
        assert!(tabs[a].tab[..64].iter().zip(&want).all(|(x, y)| x.to_bits() == y.to_bits()));
        // another head size: another entry; never more than ROPE_TABS
        for hd in [32, 48, 80, 96, 128] {
            rope_table(&pool, &mut tabs, &local, hd, &pos);
        }
        assert!(tabs.len() <= crate::context::ROPE_TABS);
    }
}
