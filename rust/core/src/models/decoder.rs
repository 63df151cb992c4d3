//! The pre-norm decoder most GGUF architectures share, configured per architecture in
//! models/<arch>.rs by a `DecoderConfig` that states only how the model differs from
//! LLaMA's (llama, gemma, gemma2, gemma3, qwen2, qwen3, qwen3moe, phi3, mistral3, smollm3,
//! granite, glm4):
//!
//! x = embd(tokens) [* sqrt(n_embd)] [* embd_mult]                    [n, n_embd]
//! per layer: cur = rmsnorm(x) * attn_norm
//!            q, k, v = wq cur [+ bq], wk cur [+ bk], wv cur [+ bv]   (or one fused wqkv)
//!            [q, k = per-head rmsnorm]; rope; [q *= q_scale]
//!            att = attention(q, K, V; kq_scale, softcap, window) ; tmp = wo att [+ bo]
//!            [tmp = rmsnorm(tmp) * post_attention_norm]; x += tmp [* residual_scale]
//!            cur = rmsnorm(x) * ffn_norm
//!            tmp = down(act(gate cur [+ bg]) * (up cur [+ bu])) [+ bd]  (or MoE)
//!            [tmp = rmsnorm(tmp) * post_ffw_norm]; x += tmp [* residual_scale] [+ control vector]
//! logits = output . (rmsnorm(x) * output_norm) [+ output.bias] [final softcap] [* logit_scale]
//!
//! `load` binds every tensor through the `Loader` (name, shape, required or optional), so
//! this file is also the schema of those architectures.

use super::graph::{layer_rope, AttnConfig, AttnWeights, FfnAct, FfnGate, FfnWeights, MoeConfig, MoeWeights, Norm, Qkv};
use super::loader::{Keep, Loader};
use crate::backend::{BackendCache, DecoderLayer, DecoderStack};
use crate::context::{ContextParams, Forward, Step};
use crate::ops::attention::AttnParams;
use super::encoder::ClsHead;
use crate::error::{Error, Result};
use crate::model::TensorView;
use crate::threadpool::ThreadPool;
use crate::ops::rope::RopeParams;

/// How an architecture's decoder differs from LLaMA's; `DecoderConfig::new(hp)` is LLaMA.
#[derive(Clone, Copy, Debug)]
pub struct DecoderConfig {
    /// Multiply token embeddings by sqrt(n_embd) (the Gemma family).
    pub embd_scale: bool,
    /// post_attention_norm / post_ffw_norm after each block (gemma2, gemma3).
    pub post_norms: bool,
    /// Per-head RMSNorm of q and k (qwen3, gemma3).
    pub qk_norm: bool,
    /// Scale q after rope (gemma: 1/sqrt(head)); 1.0 = none.
    pub q_scale: f32,
    /// Scale of q.k inside the softmax.
    pub kq_scale: f32,
    pub attn_softcap: f32,
    pub final_softcap: f32,
    pub act: FfnAct,
    /// The FFN is fused (phi3, glm4): one `ffn_up` of 2 * n_ff rows, gate first. (q/k/v
    /// are fused or not as the file has them, in every architecture: `Qkv::load`.)
    pub fused_up: bool,
    /// Mixture-of-experts feed-forward layers (qwen3moe: every layer; see `moe_step` and
    /// `n_dense_lead`), routed as `moe_cfg` says.
    pub moe: bool,
    /// `output.weight` may be absent (then `token_embd.weight` is used); false: always tied
    /// (gemma, gemma2, as llama.cpp loads them).
    pub output_opt: bool,
    /// Attention temperature (scale, floor length, position offset) for mistral3 and
    /// llama4; None elsewhere.
    pub attn_temp: Option<(f32, usize, f32)>,
    /// Layers with `(il + 1) % no_rope_layer_step == 0` have no rope (smollm3's NoPE
    /// layers); 0 = rope everywhere.
    pub no_rope_layer_step: usize,
    /// Multiplies the input embeddings, token rows or given embeddings (granite's
    /// f_embedding_scale); 1.0 = none.
    pub embd_mult: f32,
    /// Multiplies each block's output before it is added to the residual stream (granite's
    /// f_residual_scale); 1.0 = none.
    pub residual_scale: f32,
    /// Multiplies the logits (granite: 1 / f_logit_scale); 1.0 = none.
    pub logit_scale: f32,
    /// How MoE layers route (default: softmax over `expert_used_count` experts,
    /// renormalized weights, as qwen3moe).
    pub moe_cfg: MoeConfig,
    /// With `moe`: only layers with (il + 1) % moe_step == 0 are MoE (llama4's
    /// interleave_moe_layer_step); 0 or 1 = every layer.
    pub moe_step: usize,
    /// With `moe`: the first n_dense_lead layers are dense (leading_dense_block_count).
    pub n_dense_lead: usize,
    /// MoE layers have a shared expert (`ffn_{gate,up,down}_shexp`, width
    /// `HParams::n_ff_shexp`) added to the routed experts' output.
    pub shexp: bool,
    /// MoE layers have the selection bias `exp_probs_b.bias` [n_expert] (`probs_b_opt`:
    /// when the file has it, deepseek2).
    pub probs_b: bool,
    pub probs_b_opt: bool,
    /// The RMS norms have biases too (`attn_norm.bias`, `ffn_norm.bias`,
    /// `output_norm.bias`: phimoe).
    pub norm_bias: bool,
    /// The FFN's pre-norm tensor (glm4moe names it `post_attention_norm`).
    pub ffn_norm: &'static str,
    /// Per-head q/k norms `attn_{q,k}_norm` when the file has them (glm4moe).
    pub qk_norm_opt: bool,
    /// Sliding-window layers use llama.cpp's chunked mask (llama4).
    pub swa_chunked: bool,
    /// Weightless per-head RMSNorm of q and k after rope, on rope layers (llama4's
    /// use_kq_norm).
    pub qk_rms_after_rope: bool,
    /// `attn_temp` only on layers without rope (llama4); false: every layer (mistral3).
    pub attn_temp_nope_only: bool,
    /// Per-head attention sinks `attn_sinks` [n_head] in every layer (gpt-oss).
    pub sinks: bool,
    /// MoE layers have a router bias `ffn_gate_inp.bias` and per-expert biases
    /// `ffn_{gate,up,down}_exps.bias` (gpt-oss).
    pub moe_biases: bool,
    /// An optional reranker head `cls.output.weight` {n_embd, n_cls_out} (no bias), softmax
    /// over its outputs (qwen3: Qwen3-Reranker; llama.cpp's build_pooling, rank).
    pub cls_out: bool,
}

impl DecoderConfig {
    /// LLaMA: no embedding scale, pre-norms only, kq scale f_attention_scale (or
    /// 1/sqrt(head size)), SwiGLU, separate q/k/v and gate/up, optional output.
    pub fn new(hp: &crate::hparams::HParams) -> DecoderConfig {
        DecoderConfig {
            embd_scale: false,
            post_norms: false,
            qk_norm: false,
            q_scale: 1.0,
            kq_scale: if hp.f_attention_scale != 0.0 { hp.f_attention_scale } else { 1.0 / (hp.n_embd_head_k as f32).sqrt() },
            attn_softcap: 0.0,
            final_softcap: 0.0,
            act: FfnAct::Silu,
            fused_up: false,
            moe: false,
            output_opt: true,
            attn_temp: None,
            no_rope_layer_step: 0,
            embd_mult: 1.0,
            residual_scale: 1.0,
            logit_scale: 1.0,
            moe_cfg: MoeConfig::softmax(hp.n_expert_used, true),
            moe_step: 0,
            n_dense_lead: 0,
            shexp: false,
            probs_b: false,
            probs_b_opt: false,
            norm_bias: false,
            ffn_norm: "ffn_norm",
            qk_norm_opt: false,
            swa_chunked: false,
            qk_rms_after_rope: false,
            attn_temp_nope_only: false,
            sinks: false,
            moe_biases: false,
            cls_out: false,
        }
    }
}

/// A layer's feed-forward: dense (gate absent with phi3's fused up) or a mixture of experts.
pub(crate) enum Ffn {
    Dense {
        gate: Option<TensorView<'static>>,
        up: TensorView<'static>,
        down: TensorView<'static>,
        /// Optional biases (llama.cpp's ffn_gate/up/down.bias, TENSOR_NOT_REQUIRED)
        gate_b: Option<Vec<f32>>,
        up_b: Option<Vec<f32>>,
        down_b: Option<Vec<f32>>,
    },
    Moe {
        router: TensorView<'static>,
        gate: Option<TensorView<'static>>,
        up: TensorView<'static>,
        down: TensorView<'static>,
        probs_b: Option<Vec<f32>>,
        /// Router bias [n_expert] and expert biases (gate, up [n_expert * n_ff_exp], down
        /// [n_expert * n_embd]).
        biases: Option<[Vec<f32>; 4]>,
        /// The shared expert's gate, up and down.
        shexp: Option<[TensorView<'static>; 3]>,
    },
}

struct Layer {
    attn_norm: Vec<f32>,
    attn_norm_b: Option<Vec<f32>>,
    wq: TensorView<'static>,
    wk: TensorView<'static>,
    wv: TensorView<'static>,
    /// wq, wk and wv are one `attn_qkv` matrix (the file's choice: `Qkv::load`).
    fused_qkv: bool,
    wo: TensorView<'static>,
    bq: Option<Vec<f32>>,
    bk: Option<Vec<f32>>,
    bv: Option<Vec<f32>>,
    bo: Option<Vec<f32>>,
    q_norm: Option<Vec<f32>>,
    k_norm: Option<Vec<f32>>,
    post_attn_norm: Option<Vec<f32>>,
    ffn_norm: Vec<f32>,
    ffn_norm_b: Option<Vec<f32>>,
    ffn: Ffn,
    post_ffw_norm: Option<Vec<f32>>,
    /// None on NoPE layers.
    rope: Option<RopeParams>,
    sinks: Option<Vec<f32>>,
    n_swa: usize,
}

pub struct Decoder {
    cfg: DecoderConfig,
    tok_embd: TensorView<'static>,
    output_norm: Vec<f32>,
    output_norm_b: Option<Vec<f32>>,
    output: TensorView<'static>,
    output_bias: Option<Vec<f32>>,
    layers: Vec<Layer>,
    eps: f32,
    /// What the model's backend keeps for this decoder (device copies of the norm weights
    /// and biases of the layers it runs).
    dev_cache: BackendCache,
    /// The reranker head (`DecoderConfig::cls_out`), when the file has one.
    head: Option<ClsHead>,
    /// Keeps the tensor bytes the views above borrow alive; must stay the last field.
    _keep: Keep,
}

impl Decoder {
    /// Bind the tensors (the schema: names, shapes, which are optional) and build the layers.
    pub fn load(ld: &Loader, cp: &ContextParams, cfg: DecoderConfig) -> Result<Decoder> {
        let hp = ld.hp();
        let (n_embd, n_vocab) = (hp.n_embd, hp.n_vocab);
        let tok_embd = ld.req("token_embd.weight", &[n_embd, n_vocab])?;
        let output_norm = ld.req_vec("output_norm.weight", &[n_embd])?;
        let output_norm_b = if cfg.norm_bias { Some(ld.req_vec("output_norm.bias", &[n_embd])?) } else { None };
        let output = if cfg.output_opt { ld.opt("output.weight", &[n_embd, n_vocab])? } else { None };
        let output_bias = ld.opt_vec("output.bias", &[n_vocab])?;
        // llama.cpp: one global tensor, shared by every layer (TENSOR_DUPLICATED)
        let factors = ld.opt_vec("rope_freqs.weight", &[hp.n_rot / 2])?;
        let mut layers = Vec::with_capacity(hp.n_layer);
        for il in 0..hp.n_layer {
            let b = |s: &str| format!("blk.{il}.{s}");
            let (n_q, n_k, n_v) = (hp.n_embd_head_k * hp.n_head(il), hp.n_embd_k_gqa(il), hp.n_embd_v_gqa(il));
            let n_o = hp.n_embd_head_v * hp.n_head(il);
            let req_if = |on: bool, s: &str, n: usize| if on { ld.req_vec(&b(s), &[n]).map(Some) } else { Ok(None) };
            let Qkv { wq, wk, wv, bq, bk, bv, fused: fused_qkv } = Qkv::load(ld, il, n_embd, n_q, n_k, n_v)?;
            let ffn = load_ffn(ld, &cfg, il)?;
            let step = cfg.no_rope_layer_step;
            let nope = step > 0 && (il + 1) % step == 0;
            let qk_norm = |s: &str| {
                if cfg.qk_norm {
                    ld.req_vec(&b(s), &[hp.n_embd_head_k]).map(Some)
                } else if cfg.qk_norm_opt {
                    ld.opt_vec(&b(s), &[hp.n_embd_head_k])
                } else {
                    Ok(None)
                }
            };
            layers.push(Layer {
                attn_norm: ld.req_vec(&b("attn_norm.weight"), &[n_embd])?,
                attn_norm_b: req_if(cfg.norm_bias, "attn_norm.bias", n_embd)?,
                wq,
                wk,
                wv,
                fused_qkv,
                wo: ld.req(&b("attn_output.weight"), &[n_o, n_embd])?,
                bq,
                bk,
                bv,
                bo: ld.opt_vec(&b("attn_output.bias"), &[n_embd])?,
                q_norm: qk_norm("attn_q_norm.weight")?,
                k_norm: qk_norm("attn_k_norm.weight")?,
                post_attn_norm: req_if(cfg.post_norms, "post_attention_norm.weight", n_embd)?,
                ffn_norm: ld.req_vec(&b(&format!("{}.weight", cfg.ffn_norm)), &[n_embd])?,
                ffn_norm_b: req_if(cfg.norm_bias, &format!("{}.bias", cfg.ffn_norm), n_embd)?,
                ffn,
                post_ffw_norm: req_if(cfg.post_norms, "post_ffw_norm.weight", n_embd)?,
                rope: if nope { None } else { Some(layer_rope(hp, cp, il, factors.clone())) },
                sinks: req_if(cfg.sinks, "attn_sinks.weight", hp.n_head(il))?,
                n_swa: if hp.swa_layers.get(il).copied().unwrap_or(false) { hp.n_swa } else { 0 },
            });
        }
        Ok(Decoder {
            tok_embd,
            output_norm,
            output: output.unwrap_or(tok_embd),
            output_bias,
            layers,
            eps: hp.f_norm_rms_eps,
            output_norm_b,
            dev_cache: Default::default(),
            head: if cfg.cls_out { Some(ClsHead::output_only(ld, true)?).filter(|h| h.present()) } else { None },
            cfg,
            _keep: ld.keep(),
        })
    }
}

impl Forward for Decoder {
    fn rope(&self, il: usize) -> Option<&RopeParams> {
        self.layers.get(il).and_then(|l| l.rope.as_ref())
    }

    fn classify(&self, pool: &ThreadPool, x: &[f32], n: usize) -> Result<(Vec<f32>, usize)> {
        match &self.head {
            Some(h) => h.apply(pool, x, n, self.output_norm.len()),
            None => Err(Error::Invalid("this model has no classifier head (cls.output.weight): rank pooling needs one".into())),
        }
    }

    fn forward(&self, st: &mut Step) -> Result<()> {
        let ne = st.hp.n_embd;
        let c = &self.cfg;
        let scale = if c.embd_scale && st.tokens.is_some() { (ne as f32).sqrt() } else { 1.0 };
        st.build_inp_embd(&self.tok_embd, scale)?;
        if c.embd_mult != 1.0 {
            // llama.cpp's build_inp_embd: ggml_scale of the rows (token or given embeddings)
            let m = st.n * ne;
            crate::ops::act::scale(&mut st.b.x[..m], c.embd_mult);
        }
        crate::cb!(st, if c.embd_scale { "inp_scaled" } else { "inp_embd" }, -1, x, ne);
        // the backend seam: the top layers the model's device runs end to end, if any
        let stack = self.dev_stack(st);
        let dev = st.dev.zip(stack.as_ref());
        let first = dev.map_or(self.layers.len(), |(d, s)| d.decoder_first(s));
        for il in 0..first {
            if !self.cpu_layer(st, il)? {
                return Ok(());
            }
        }
        if let Some((d, s)) = dev.filter(|_| first < self.layers.len()) {
            if !d.decoder_run(st, s, first)? {
                return Ok(());
            }
        }
        st.build_norm(&self.output_norm, self.output_norm_b.as_deref(), Norm::Rms, self.eps);
        st.build_output(&self.output, self.output_bias.as_deref(), c.final_softcap)?;
        if c.logit_scale != 1.0 {
            // llama.cpp: ggml_scale of the logits after the output projection (granite)
            let nv = self.output.n_rows();
            for &r in st.b.out_row.iter().take(st.n) {
                crate::ops::act::scale(&mut st.logits[r * nv..(r + 1) * nv], c.logit_scale);
            }
        }
        Ok(())
    }
}

impl Decoder {
    /// Layer `il` on the CPU (its matmuls on the device when it holds them); false when no
    /// row wants output after the last layer's attention.
    fn cpu_layer(&self, st: &mut Step, il: usize) -> Result<bool> {
        let ne = st.hp.n_embd;
        let n_layer = self.layers.len();
        let c = &self.cfg;
        let l = &self.layers[il];
        st.build_norm(&l.attn_norm, l.attn_norm_b.as_deref(), Norm::Rms, self.eps);
        crate::cb!(st, "attn_norm", il, cur, ne);
        let w = AttnWeights {
            wq: &l.wq,
            wk: &l.wk,
            wv: &l.wv,
            wo: &l.wo,
            bq: l.bq.as_deref(),
            bk: l.bk.as_deref(),
            bv: l.bv.as_deref(),
            bo: l.bo.as_deref(),
            q_norm: l.q_norm.as_deref(),
            k_norm: l.k_norm.as_deref(),
            fused_qkv: l.fused_qkv,
        };
        let a = AttnConfig {
            q_scale: c.q_scale,
            softcap: c.attn_softcap,
            n_swa: l.n_swa,
            attn_temp: if c.attn_temp_nope_only && l.rope.is_some() { None } else { c.attn_temp },
            chunked: c.swa_chunked,
            qk_rms_after_rope: c.qk_rms_after_rope && l.rope.is_some(),
            sinks: l.sinks.as_deref(),
            ..AttnConfig::new(il, l.rope.as_ref(), c.kq_scale)
        };
        st.build_attn(&w, &a)?;
        if il == n_layer - 1 && !st.select_outputs() {
            return Ok(false);
        }
        if let Some(pn) = &l.post_attn_norm {
            st.build_post_norm(pn, self.eps);
            crate::cb!(st, "attn_post_norm", il, tmp, ne);
        }
        if c.residual_scale != 1.0 {
            let m = st.n * ne;
            crate::ops::act::scale(&mut st.b.tmp[..m], c.residual_scale);
        }
        st.residual();
        // llama.cpp's names: the Gemma 2/3 graphs call this residual "sa_out".
        crate::cb!(st, if c.post_norms { "sa_out" } else { "ffn_inp" }, il, x, ne);
        st.build_norm(&l.ffn_norm, l.ffn_norm_b.as_deref(), Norm::Rms, self.eps);
        crate::cb!(st, "ffn_norm", il, cur, ne);
        run_ffn(st, &l.ffn, c, il)?;
        crate::cb!(st, "ffn_out", il, tmp, ne);
        if let Some(pn) = &l.post_ffw_norm {
            st.build_post_norm(pn, self.eps);
            crate::cb!(st, "ffn_post_norm", il, tmp, ne);
        }
        if c.residual_scale != 1.0 {
            let m = st.n * ne;
            crate::ops::act::scale(&mut st.b.tmp[..m], c.residual_scale);
        }
        st.residual();
        st.build_cvec(il);
        crate::cb!(st, "l_out", il, x, ne);
        Ok(true)
    }
}

impl Decoder {
    /// The top layers in the backend seam's neutral form (`crate::backend`), when the model
    /// has a backend and nothing needs the host between a layer's ops: no LoRA, debug dump or
    /// imatrix collection, a SiLU or GELU gated feed-forward; and per layer, from the top
    /// down to the first that fails, a dense feed-forward, no sinks, attention temperature
    /// or control vector. The backend runs what it holds of these end to end
    /// (`Backend::decoder_first`); the rest run here with their matmuls offered to it.
    fn dev_stack(&self, st: &Step) -> Option<DecoderStack<'_>> {
        st.dev?;
        let c = &self.cfg;
        if st.debug.is_some()
            || st.b.lora.is_some()
            || crate::quantize::collect::is_active()
            || !matches!(c.act, FfnAct::Silu | FfnAct::Gelu)
        {
            return None;
        }
        let (hp, n_layer) = (st.hp, self.layers.len());
        let mut layers = Vec::new();
        for il in (0..n_layer).rev() {
            let l = &self.layers[il];
            let attn_temp = if c.attn_temp_nope_only && l.rope.is_some() { None } else { c.attn_temp };
            let Ffn::Dense { gate, up, down, gate_b, up_b, down_b } = &l.ffn else { break };
            if l.sinks.is_some() || attn_temp.is_some() || st.b.cvec.dir(il).is_some() {
                break;
            }
            layers.push(DecoderLayer {
                attn_norm: &l.attn_norm,
                attn_norm_b: l.attn_norm_b.as_deref(),
                wq: &l.wq,
                wk: &l.wk,
                wv: &l.wv,
                fused_qkv: l.fused_qkv,
                bq: l.bq.as_deref(),
                bk: l.bk.as_deref(),
                bv: l.bv.as_deref(),
                q_norm: l.q_norm.as_deref(),
                k_norm: l.k_norm.as_deref(),
                rope: l.rope.as_ref(),
                qk_rms_after_rope: c.qk_rms_after_rope && l.rope.is_some(),
                attn: AttnParams {
                    il,
                    n_head: hp.n_head(il),
                    n_head_kv: hp.n_head_kv(il),
                    hd_k: hp.n_embd_head_k,
                    hd_v: hp.n_embd_head_v,
                    scale: c.kq_scale,
                    softcap: c.attn_softcap,
                    n_swa: l.n_swa,
                    chunked: c.swa_chunked,
                    sinks: None,
                },
                wo: &l.wo,
                bo: l.bo.as_deref(),
                post_attn_norm: l.post_attn_norm.as_deref(),
                ffn_norm: &l.ffn_norm,
                ffn_norm_b: l.ffn_norm_b.as_deref(),
                gate: gate.as_ref(),
                up,
                down,
                gate_b: gate_b.as_deref(),
                up_b: up_b.as_deref(),
                down_b: down_b.as_deref(),
                post_ffw_norm: l.post_ffw_norm.as_deref(),
            });
        }
        layers.reverse();
        Some(DecoderStack {
            n_layer,
            layers,
            eps: self.eps,
            eps_qk: hp.f_norm_rms_eps,
            q_scale: c.q_scale,
            residual_scale: c.residual_scale,
            gelu: c.act == FfnAct::Gelu,
            cache: &self.dev_cache,
        })
    }
}

/// A layer's feed-forward tensors as `cfg` says (dense, fused, or MoE with its options):
/// the part of the schema every decoder-like forward pass shares (deepseek2's too).
pub(crate) fn load_ffn(ld: &Loader, cfg: &DecoderConfig, il: usize) -> Result<Ffn> {
    let hp = ld.hp();
    let n_embd = hp.n_embd;
    let n_ff = hp.n_ff[il];
    let b = |s: &str| format!("blk.{il}.{s}");
    let moe_layer =
        cfg.moe && il >= cfg.n_dense_lead && (cfg.moe_step <= 1 || (il + 1) % cfg.moe_step == 0);
    Ok(if moe_layer {
        let (ne, nf, ns) = (hp.n_expert, hp.n_ff_exp, hp.n_ff_shexp);
        Ffn::Moe {
            router: ld.req(&b("ffn_gate_inp.weight"), &[n_embd, ne])?,
            gate: Some(ld.req(&b("ffn_gate_exps.weight"), &[n_embd, nf, ne])?),
            up: ld.req(&b("ffn_up_exps.weight"), &[n_embd, nf, ne])?,
            down: ld.req(&b("ffn_down_exps.weight"), &[nf, n_embd, ne])?,
            probs_b: if cfg.probs_b {
            Some(ld.req_vec(&b("exp_probs_b.bias"), &[ne])?)
        } else if cfg.probs_b_opt {
            ld.opt_vec(&b("exp_probs_b.bias"), &[ne])?
        } else {
            None
        },
            biases: if cfg.moe_biases {
                Some([
                    ld.req_vec(&b("ffn_gate_inp.bias"), &[ne])?,
                    ld.req_vec(&b("ffn_gate_exps.bias"), &[nf, ne])?,
                    ld.req_vec(&b("ffn_up_exps.bias"), &[nf, ne])?,
                    ld.req_vec(&b("ffn_down_exps.bias"), &[n_embd, ne])?,
                ])
            } else {
                None
            },
            shexp: if cfg.shexp {
                Some([
                    ld.req(&b("ffn_gate_shexp.weight"), &[n_embd, ns])?,
                    ld.req(&b("ffn_up_shexp.weight"), &[n_embd, ns])?,
                    ld.req(&b("ffn_down_shexp.weight"), &[ns, n_embd])?,
                ])
            } else {
                None
            },
        }
    } else if cfg.fused_up {
        Ffn::Dense {
            gate: None,
            up: ld.req(&b("ffn_up.weight"), &[n_embd, 2 * n_ff])?,
            down: ld.req(&b("ffn_down.weight"), &[n_ff, n_embd])?,
            gate_b: None,
            up_b: None,
            down_b: None,
        }
    } else {
        Ffn::Dense {
            gate: Some(ld.req(&b("ffn_gate.weight"), &[n_embd, n_ff])?),
            up: ld.req(&b("ffn_up.weight"), &[n_embd, n_ff])?,
            down: ld.req(&b("ffn_down.weight"), &[n_ff, n_embd])?,
            gate_b: ld.opt_vec(&b("ffn_gate.bias"), &[n_ff])?,
            up_b: ld.opt_vec(&b("ffn_up.bias"), &[n_ff])?,
            down_b: ld.opt_vec(&b("ffn_down.bias"), &[n_embd])?,
        }
    })
}

/// The feed-forward of one layer: in `cur`, out `tmp` (MoE: routed experts plus the shared
/// expert when there is one).
pub(crate) fn run_ffn(st: &mut Step, ffn: &Ffn, c: &DecoderConfig, il: usize) -> Result<()> {
    match ffn {
        Ffn::Dense { gate, up, down, gate_b, up_b, down_b } => {
            let w = FfnWeights {
                gate: gate.as_ref(),
                gate_b: gate_b.as_deref(),
                up,
                up_b: up_b.as_deref(),
                down,
                down_b: down_b.as_deref(),
            };
            st.build_ffn(il, &w, c.act, if gate.is_some() { FfnGate::Par } else { FfnGate::Fused })
        }
        Ffn::Moe { router, gate, up, down, probs_b, biases, shexp } => {
            let bias = |i: usize| biases.as_ref().map(|v| v[i].as_slice());
            let m = MoeWeights {
                router,
                router_b: bias(0),
                gate: gate.as_ref(),
                up,
                down,
                gate_b: bias(1),
                up_b: bias(2),
                down_b: bias(3),
                probs_b: probs_b.as_deref(),
            };
            st.build_moe_ffn(il, &m, &c.moe_cfg)?;
            if let Some([g, u, d]) = shexp {
                let w = FfnWeights { gate: Some(g), gate_b: None, up: u, up_b: None, down: d, down_b: None };
                st.build_moe_shexp(il, &w)?;
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    //! The shared decoder (as `llama` configures it) against a plain f64 forward pass of
    //! the same weights (testutil::Tiny::reference_logits): embedding, RMSNorm, NORM rope,
    //! GQA causal attention, SwiGLU, tied output.

    use crate::context::{Context, Decoded};
    use crate::ggml_type::GgmlType;
    use crate::testutil::{decode, params, Tiny};

    fn max_err(a: &[f32], b: &[f32]) -> f32 {
        a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
    }

    #[test]
    fn logits_match_a_plain_forward_pass() {
        let tiny = Tiny::new(21);
        let m = tiny.load("decoder-ref");
        let toks: Vec<i32> = vec![5, 17, 3, 60, 22, 9, 41];
        let want = tiny.reference_logits(&toks);
        let scale = want.iter().fold(0f32, |a, &x| a.max(x.abs()));
        for (kv, flash, tol) in [(GgmlType::F32, false, 1e-4), (GgmlType::F16, true, 2e-2)] {
            let mut ctx = Context::new(m.clone(), params(64, 4, 1, kv)).unwrap();
            ctx.kv.flash_attn = flash;
            let pos: Vec<i32> = (0..toks.len() as i32).collect();
            let mut out = vec![false; toks.len()];
            out[toks.len() - 1] = true;
            let (d, got) = decode(&mut ctx, &toks, &pos, &vec![0; toks.len()], &out, 4);
            assert_eq!(d, Decoded::Done { n_ubatches: 2 });
            let e = max_err(&got, &want);
            assert!(e <= tol * scale, "{kv}: max |logit error| {e} over logits up to {scale}");
        }
    }

    #[test]
    fn every_output_row_matches_its_prefix() {
        // the logits of token i of a batch are the reference's for the prefix 0..=i
        let tiny = Tiny::new(22);
        let m = tiny.load("decoder-rows");
        let toks: Vec<i32> = vec![1, 2, 33, 44, 5, 63];
        let mut ctx = Context::new(m, params(64, 8, 1, GgmlType::F32)).unwrap();
        ctx.kv.flash_attn = false;
        let pos: Vec<i32> = (0..toks.len() as i32).collect();
        let (_, got) = decode(&mut ctx, &toks, &pos, &vec![0; toks.len()], &vec![true; toks.len()], 8);
        let nv = tiny.n_vocab;
        for i in 0..toks.len() {
            let want = tiny.reference_logits(&toks[..=i]);
            let scale = want.iter().fold(0f32, |a, &x| a.max(x.abs()));
            let e = max_err(&got[i * nv..(i + 1) * nv], &want);
            assert!(e <= 1e-4 * scale, "row {i}: max error {e}");
        }
        // and a different weight gives different logits: the comparison can fail
        let other = Tiny::new(23).reference_logits(&toks);
        assert!(max_err(&got[(toks.len() - 1) * nv..], &other) > 1e-2);
    }
}
