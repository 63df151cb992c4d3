//! Gemma 4 (`gemma4`; llama.cpp's src/models/gemma4.cpp). Per layer, sliding-window or
//! full attention as `attention.sliding_window_pattern` (one bool per layer) says, each
//! kind with its own head size (`attention.key_length` / `_swa`), KV head count
//! (`attention.head_count_kv` per layer), rotary dims (`rope.dimension_count` / `_swa`) and
//! rope base (`rope.freq_base` / `rope.freq_base_swa`); full layers rope with the
//! `rope_freqs` factors (the "proportional" rope: factors of 1e30 leave dims unrotated).
//!
//! x = embd(tokens) * sqrt(n_embd)
//! per-layer inputs (when `embedding_length_per_layer_input` > 0), per token and layer:
//!     pl = (rmsnorm(per_layer_model_proj x / sqrt(n_embd)) * per_layer_proj_norm
//!           + per_layer_token_embd[token] * sqrt(n_pl)) / sqrt(2)
//! per layer: cur = rmsnorm(x) * attn_norm
//!     q = rmsnorm per head (q_norm), rope;  k = rmsnorm per head (k_norm), rope;
//!     v = rmsnorm per head without weight (v = the k projection when attn_v is absent)
//!     att = attention with scale 1 (the last `attention.shared_kv_layers` layers store no
//!           K/V: they attend over the last earlier layer of their kind's cache)
//!     x += rmsnorm(wo att) * post_attention_norm
//!     dense: f = down(gelu(gate cur) * up cur) with cur = rmsnorm(x) * ffn_norm
//!     MoE:   f = rmsnorm(that dense FFN) * post_ffw_norm_1
//!              + rmsnorm(experts(rmsnorm(x) * pre_ffw_norm_2)) * post_ffw_norm_2, the
//!              router's logits from rmsnorm(x) / sqrt(n_embd) * ffn_gate_inp.scale,
//!              softmax, renormalized, GELU experts (fused gate_up or not), each expert's
//!              output scaled by ffn_down_exps.scale where present
//!     x += rmsnorm(f) * post_ffw_norm
//!     x += rmsnorm(per_layer_proj (gelu(per_layer_inp_gate x) * pl)) * per_layer_post_norm
//!     x *= layer_output_scale (where present)
//! logits = softcap(output . (rmsnorm(x) * output_norm))

use super::graph::{layer_rope, FfnAct, FfnGate, FfnWeights, MoeConfig, MoeExtra, MoeWeights, Norm};
use super::loader::{Keep, Loader};
use super::{common_hparams, Arch};
use crate::context::{ContextParams, Forward, Step};
use crate::error::{Error, Result};
use crate::gguf::Value;
use crate::hparams::{HParams, Meta, RopeType};
use crate::model::TensorView;
use crate::ops::act;
use crate::ops::attention::AttnParams;
use crate::ops::norm::rms_norm_row;
use crate::ops::rope::RopeParams;
use crate::quant;
use std::sync::Mutex;

pub struct Gemma4;

impl Arch for Gemma4 {
    fn name(&self) -> &'static str {
        "gemma4"
    }

    fn moe_for(&self, hp: &HParams) -> bool {
        hp.n_expert > 0
    }

    fn hparams(&self, meta: &Meta, n_vocab: usize) -> Result<HParams> {
        let bad = |what: String| Error::Unsupported(format!("{}: {what}", meta.file.path));
        let mut hp = common_hparams(meta, n_vocab, RopeType::Neox)?;
        let key = "attention.sliding_window_pattern";
        hp.swa_layers = match meta.get(key) {
            Some(Value::Array(a)) => {
                let v: Option<Vec<bool>> = a.iter().map(|x| x.as_bool().or_else(|| x.as_i64().map(|i| i != 0))).collect();
                match v {
                    Some(v) if v.len() == hp.n_layer => v,
                    _ => return Err(bad(format!("'{}' must hold one bool per layer ({})", meta.key(key), hp.n_layer))),
                }
            }
            _ => return Err(bad(format!("missing required metadata array '{}'", meta.key(key)))),
        };
        hp.n_swa = meta.req_u("attention.sliding_window")?;
        for k in ["attention.layer_norm_rms_epsilon", "attention.key_length_swa", "attention.value_length_swa"] {
            if meta.get(k).is_none() {
                return Err(bad(format!("missing required metadata key '{}'", meta.key(k))));
            }
        }
        meta.req_u("embedding_length_per_layer_input")?;
        if hp.n_embd_head_k != hp.n_embd_head_v || hp.n_embd_head_k_swa != hp.n_embd_head_v_swa {
            return Err(bad("Gemma 4 needs key_length == value_length and key_length_swa == value_length_swa".into()));
        }
        hp.rope_freq_base_swa = meta.f("rope.freq_base_swa")?.unwrap_or(10000.0);
        hp.rope_freq_scale_swa = 1.0;
        let shared = meta.u("attention.shared_kv_layers")?.unwrap_or(0);
        let kv_start = hp.n_layer.checked_sub(shared).unwrap_or(0);
        if shared > 0 && kv_start < 2 {
            return Err(bad(format!(
                "'{}' = {shared} leaves fewer than 2 of the {} layers with a KV cache",
                meta.key("attention.shared_kv_layers"),
                hp.n_layer
            )));
        }
        for il in kv_start..hp.n_layer {
            let src = kv_src(&hp, kv_start, il);
            if hp.swa_layers[src] != hp.swa_layers[il] || hp.n_head_kv(src) != hp.n_head_kv(il) {
                return Err(bad(format!(
                    "layer {il} would reuse the KV cache of layer {src}, which is not of its kind (sliding window / full, KV heads)"
                )));
            }
        }
        if hp.n_expert > 0 && (hp.n_expert_used == 0 || hp.n_ff_exp == 0) {
            return Err(bad("Gemma 4 experts need expert_used_count > 0 and expert_feed_forward_length > 0".into()));
        }
        Ok(hp)
    }

    fn type_name(&self, hp: &HParams) -> &'static str {
        match hp.n_layer {
            30 => "26B.A4B",
            35 => "E2B",
            42 => "E4B",
            60 => "31B",
            _ => "?B",
        }
    }

    fn build_forward(&self, ld: &Loader, cp: &ContextParams) -> Result<Box<dyn Forward>> {
        let hp = ld.hp();
        let meta = Meta { file: &ld.model().files[0], arch: &hp.arch };
        let (ne, nv, nl) = (hp.n_embd, hp.n_vocab, hp.n_layer);
        let n_pl = meta.req_u("embedding_length_per_layer_input")?;
        let shared = meta.u("attention.shared_kv_layers")?.unwrap_or(0);
        let kv_start = nl.saturating_sub(shared);
        let tok_embd = ld.req("token_embd.weight", &[ne, nv])?;
        let output = ld.opt("output.weight", &[ne, nv])?.unwrap_or(tok_embd);
        let ple = if n_pl > 0 {
            Some(Ple {
                tok_embd: ld.req("per_layer_token_embd.weight", &[n_pl * nl, nv])?,
                model_proj: ld.req("per_layer_model_proj.weight", &[ne, n_pl * nl])?,
                proj_norm: ld.req_vec("per_layer_proj_norm.weight", &[n_pl])?,
            })
        } else {
            None
        };
        let rope_freqs = if hp.swa_layers.iter().any(|&s| !s) {
            Some(ld.req_vec("rope_freqs.weight", &[hp.n_embd_head_k / 2])?)
        } else {
            None
        };
        let moe_cfg = MoeConfig { act: super::graph::MoeAct::Gelu, ..MoeConfig::softmax(hp.n_expert_used, true) };
        let mut layers = Vec::with_capacity(nl);
        for il in 0..nl {
            let b = |s: &str| format!("blk.{il}.{s}");
            let has_kv = il < kv_start;
            let (nh, hd) = (hp.n_head(il), hp.head_k(il));
            let (nq, nk) = (nh * hd, hp.n_embd_k_gqa(il));
            let swa = hp.swa_layers[il];
            let qkv = match ld.opt(&b("attn_qkv.weight"), &[ne, nq + 2 * nk])? {
                Some(w) => Qkv::Fused(w),
                None => Qkv::Split {
                    wq: ld.req(&b("attn_q.weight"), &[ne, nq])?,
                    wk: if has_kv { Some(ld.req(&b("attn_k.weight"), &[ne, nk])?) } else { ld.opt(&b("attn_k.weight"), &[ne, nk])? },
                    wv: ld.opt(&b("attn_v.weight"), &[ne, nk])?,
                },
            };
            let nf = hp.n_ff[il];
            let dense = Dense {
                gate: ld.req(&b("ffn_gate.weight"), &[ne, nf])?,
                up: ld.req(&b("ffn_up.weight"), &[ne, nf])?,
                down: ld.req(&b("ffn_down.weight"), &[nf, ne])?,
            };
            let moe = match ld.opt(&b("ffn_gate_inp.weight"), &[ne, hp.n_expert])? {
                None => None,
                Some(router) => {
                    let (nx, fe) = (hp.n_expert, hp.n_ff_exp);
                    let gate_up = ld.opt(&b("ffn_gate_up_exps.weight"), &[ne, 2 * fe, nx])?;
                    let (gate, up, fused) = match gate_up {
                        Some(gu) => (None, gu, true),
                        None => (
                            Some(ld.req(&b("ffn_gate_exps.weight"), &[ne, fe, nx])?),
                            ld.req(&b("ffn_up_exps.weight"), &[ne, fe, nx])?,
                            false,
                        ),
                    };
                    Some(Moe {
                        router,
                        router_s: ld.req_vec(&b("ffn_gate_inp.scale"), &[ne])?,
                        pre_norm_2: ld.req_vec(&b("pre_ffw_norm_2.weight"), &[ne])?,
                        post_norm_1: ld.req_vec(&b("post_ffw_norm_1.weight"), &[ne])?,
                        post_norm_2: ld.req_vec(&b("post_ffw_norm_2.weight"), &[ne])?,
                        gate,
                        up,
                        fused,
                        down: ld.req(&b("ffn_down_exps.weight"), &[fe, ne, nx])?,
                        down_s: ld.opt_vec(&b("ffn_down_exps.scale"), &[nx])?,
                    })
                }
            };
            let pl = if n_pl > 0 {
                Some(PleLayer {
                    inp_gate: ld.req(&b("inp_gate.weight"), &[ne, n_pl])?,
                    proj: ld.req(&b("proj.weight"), &[n_pl, ne])?,
                    post_norm: ld.req_vec(&b("post_norm.weight"), &[ne])?,
                })
            } else {
                None
            };
            layers.push(Layer {
                attn_norm: ld.req_vec(&b("attn_norm.weight"), &[ne])?,
                qkv,
                wo: ld.req(&b("attn_output.weight"), &[nq, ne])?,
                q_norm: ld.req_vec(&b("attn_q_norm.weight"), &[hd])?,
                k_norm: if has_kv {
                    Some(ld.req_vec(&b("attn_k_norm.weight"), &[hd])?)
                } else {
                    ld.opt(&b("attn_k_norm.weight"), &[hd])?; // optional there (unused), shape-checked as llama.cpp
                    None
                },
                post_attn_norm: ld.req_vec(&b("post_attention_norm.weight"), &[ne])?,
                out_scale: ld.opt_vec(&b("layer_output_scale.weight"), &[1])?.map(|v| v[0]),
                rope: layer_rope(hp, cp, il, if swa { None } else { rope_freqs.clone() }),
                n_swa: if swa { hp.n_swa } else { 0 },
                kv_src: if has_kv { il } else { kv_src(hp, kv_start, il) },
                ffn_norm: ld.req_vec(&b("ffn_norm.weight"), &[ne])?,
                dense,
                moe,
                post_ffw_norm: ld.req_vec(&b("post_ffw_norm.weight"), &[ne])?,
                pl,
            });
        }
        Ok(Box::new(Gemma4Fwd {
            tok_embd,
            ple,
            n_pl,
            output_norm: ld.req_vec("output_norm.weight", &[ne])?,
            output,
            layers,
            moe_cfg,
            eps: hp.f_norm_rms_eps,
            final_softcap: hp.f_final_logit_softcapping,
            scratch: Mutex::new(Scratch::default()),
            _keep: ld.keep(),
        }))
    }
}

/// The layer whose KV cache layer `il` >= `kv_start` reuses (llama.cpp's layer_reuse_cb
/// for Gemma 3n / 4: the last sliding-window layer before kv_start is kv_start - 2, the
/// last full one kv_start - 1).
fn kv_src(hp: &HParams, kv_start: usize, il: usize) -> usize {
    kv_start - if hp.swa_layers[il] { 2 } else { 1 }
}

struct Ple {
    /// {n_pl * n_layer, n_vocab}
    tok_embd: TensorView<'static>,
    /// {n_embd, n_pl * n_layer}
    model_proj: TensorView<'static>,
    proj_norm: Vec<f32>,
}

struct PleLayer {
    inp_gate: TensorView<'static>,
    proj: TensorView<'static>,
    post_norm: Vec<f32>,
}

enum Qkv {
    Split {
        wq: TensorView<'static>,
        /// None on a layer without a KV cache of its own.
        wk: Option<TensorView<'static>>,
        /// None: v is the k projection (llama.cpp's use_alternative_attention).
        wv: Option<TensorView<'static>>,
    },
    /// {n_embd, n_q + 2 n_kv}: q, k, v rows.
    Fused(TensorView<'static>),
}

struct Dense {
    gate: TensorView<'static>,
    up: TensorView<'static>,
    down: TensorView<'static>,
}

struct Moe {
    router: TensorView<'static>,
    router_s: Vec<f32>,
    pre_norm_2: Vec<f32>,
    post_norm_1: Vec<f32>,
    post_norm_2: Vec<f32>,
    gate: Option<TensorView<'static>>,
    /// up experts, or the fused gate_up ones (`fused`)
    up: TensorView<'static>,
    fused: bool,
    down: TensorView<'static>,
    down_s: Option<Vec<f32>>,
}

struct Layer {
    attn_norm: Vec<f32>,
    qkv: Qkv,
    wo: TensorView<'static>,
    q_norm: Vec<f32>,
    k_norm: Option<Vec<f32>>,
    post_attn_norm: Vec<f32>,
    out_scale: Option<f32>,
    rope: RopeParams,
    n_swa: usize,
    /// The layer whose KV cache this one attends over (itself when it has one).
    kv_src: usize,
    ffn_norm: Vec<f32>,
    dense: Dense,
    moe: Option<Moe>,
    post_ffw_norm: Vec<f32>,
    pl: Option<PleLayer>,
}

#[derive(Default)]
struct Scratch {
    /// per-layer inputs [n, n_layer * n_pl] (token-major)
    pl: Vec<f32>,
    sel: Vec<f32>,
    /// the shared MLP's output [n, n_embd] (MoE layers)
    mlp: Vec<f32>,
    /// the router's input [n, n_embd] and logits [n, n_expert]
    rin: Vec<f32>,
    logits: Vec<f32>,
    /// the per-layer gate [n, n_pl]
    g: Vec<f32>,
}

struct Gemma4Fwd {
    tok_embd: TensorView<'static>,
    ple: Option<Ple>,
    n_pl: usize,
    output_norm: Vec<f32>,
    output: TensorView<'static>,
    layers: Vec<Layer>,
    moe_cfg: MoeConfig,
    eps: f32,
    final_softcap: f32,
    scratch: Mutex<Scratch>,
    _keep: Keep,
}

/// RMSNorm of every `width`-wide chunk of the first `n` rows (`w` None: no weight).
fn rms_chunks(x: &mut [f32], width: usize, rows: usize, w: Option<&[f32]>, eps: f32) {
    for h in x[..rows * width].chunks_exact_mut(width) {
        rms_norm_row(h, w, eps);
    }
}

impl Gemma4Fwd {
    /// The per-layer inputs of the batch (llama.cpp's build_inp_per_layer and
    /// project_per_layer_inputs) into `sc.pl` [n, n_layer * n_pl]; x holds the scaled embeddings.
    fn per_layer_inputs(&self, st: &mut Step, ple: &Ple, sc: &mut Scratch) -> Result<()> {
        let (n, ne, nl, n_pl) = (st.n, st.hp.n_embd, self.layers.len(), self.n_pl);
        let w = nl * n_pl;
        sc.pl.resize(n * w, 0.0);
        sc.sel.resize(w, 0.0);
        {
            let b = &mut *st.b;
            Step::mm(st.pool, st.dev, &ple.model_proj, &b.x, n, &mut sc.pl, &mut b.mm_scratch, &mut b.lora)?;
        }
        act::scale(&mut sc.pl[..n * w], 1.0 / (ne as f32).sqrt());
        rms_chunks(&mut sc.pl, n_pl, n * nl, Some(&ple.proj_norm), self.eps);
        let s_tok = (n_pl as f32).sqrt();
        let s_inp = 1.0 / 2f32.sqrt();
        for t in 0..n {
            // embeddings input: llama.cpp uses the padding token's (id 0) row
            let id = st.tokens.map_or(0, |tk| tk[t] as usize);
            quant::dequantize_row(ple.tok_embd.ty, ple.tok_embd.row(id), &mut sc.sel)?;
            let row = &mut sc.pl[t * w..(t + 1) * w];
            for (p, s) in row.iter_mut().zip(&sc.sel) {
                *p = (*p + *s * s_tok) * s_inp;
            }
        }
        Ok(())
    }

    /// Attention of layer `il` (in `cur`, out `tmp` = wo att).
    fn attention(&self, st: &mut Step, il: usize, l: &Layer) -> Result<()> {
        let b = &mut *st.b;
        std::mem::swap(&mut b.q, &mut b.gate);
        std::mem::swap(&mut b.k, &mut b.up);
        let r = self.attention_lent(st, il, l);
        let b = &mut *st.b;
        std::mem::swap(&mut b.q, &mut b.gate);
        std::mem::swap(&mut b.k, &mut b.up);
        r
    }

    fn attention_lent(&self, st: &mut Step, il: usize, l: &Layer) -> Result<()> {
        let hp = st.hp;
        let n = st.n;
        let (nh, nkv, hd) = (hp.n_head(il), hp.n_head_kv(il), hp.head_k(il));
        let (qw, kw) = (nh * hd, nkv * hd);
        let own_kv = l.kv_src == il;
        let eps = self.eps;
        let b = &mut *st.b;
        match &l.qkv {
            Qkv::Fused(w) => {
                Step::mm_rows(st.pool, st.dev, w, &b.cur, n, &mut b.q, 0..qw, &mut b.mm_scratch, &mut b.lora)?;
                if own_kv {
                    Step::mm_rows(st.pool, st.dev, w, &b.cur, n, &mut b.k, qw..qw + kw, &mut b.mm_scratch, &mut b.lora)?;
                    Step::mm_rows(st.pool, st.dev, w, &b.cur, n, &mut b.v, qw + kw..qw + 2 * kw, &mut b.mm_scratch, &mut b.lora)?;
                }
            }
            Qkv::Split { wq, wk, wv } => {
                Step::mm(st.pool, st.dev, wq, &b.cur, n, &mut b.q, &mut b.mm_scratch, &mut b.lora)?;
                if own_kv {
                    let wk = wk.as_ref().ok_or_else(|| Error::Invalid(format!("internal: layer {il} without attn_k")))?;
                    Step::mm(st.pool, st.dev, wk, &b.cur, n, &mut b.k, &mut b.mm_scratch, &mut b.lora)?;
                    match wv {
                        Some(wv) => Step::mm(st.pool, st.dev, wv, &b.cur, n, &mut b.v, &mut b.mm_scratch, &mut b.lora)?,
                        None => b.v[..n * kw].copy_from_slice(&b.k[..n * kw]),
                    }
                }
            }
        }
        crate::cb!(st, "Qcur", il, q, qw);
        let b = &mut *st.b;
        rms_chunks(&mut b.q, hd, n * nh, Some(&l.q_norm), eps);
        crate::cb!(st, "Qcur_normed", il, q, qw);
        let b = &mut *st.b;
        let mut cache = vec![0f32; hd + 2];
        for t in 0..n {
            l.rope.apply_heads(&mut b.q[t * qw..(t + 1) * qw], hd, b.pos[t], &mut cache);
        }
        crate::cb!(st, "Qcur_pos", il, q, qw);
        let p = AttnParams {
            il: l.kv_src,
            n_head: nh,
            n_head_kv: nkv,
            hd_k: hd,
            hd_v: hd,
            scale: 1.0, // llama.cpp: f_attention_scale = 1 (q and k are normed)
            softcap: 0.0,
            n_swa: l.n_swa,
            chunked: false,
            sinks: None,
        };
        if own_kv {
            let b = &mut *st.b;
            let kn = l.k_norm.as_deref();
            rms_chunks(&mut b.k, hd, n * nkv, kn, eps);
            rms_chunks(&mut b.v, hd, n * nkv, None, eps);
            for t in 0..n {
                l.rope.apply_heads(&mut b.k[t * kw..(t + 1) * kw], hd, b.pos[t], &mut cache);
            }
            crate::cb!(st, "Kcur_pos", il, k, kw);
            crate::cb!(st, "Vcur_normed", il, v, kw);
            st.attend_cached(&p)?;
        } else {
            st.attend_only(&p, il)?;
        }
        let b = &mut *st.b;
        Step::mm(st.pool, st.dev, &l.wo, &b.att, n, &mut b.tmp, &mut b.mm_scratch, &mut b.lora)?;
        Ok(())
    }

    /// The feed-forward of layer `il`: in x (attn_out), out `tmp` (before post_ffw_norm).
    fn ffn(&self, st: &mut Step, il: usize, l: &Layer, sc: &mut Scratch) -> Result<()> {
        let (n, ne) = (st.n, st.hp.n_embd);
        let d = &l.dense;
        let f = FfnWeights { gate: Some(&d.gate), gate_b: None, up: &d.up, up_b: None, down: &d.down, down_b: None };
        st.build_norm(&l.ffn_norm, None, Norm::Rms, self.eps);
        st.build_ffn(il, &f, FfnAct::Gelu, FfnGate::Par)?;
        let Some(m) = &l.moe else { return Ok(()) };
        st.build_post_norm(&m.post_norm_1, self.eps);
        sc.mlp.resize(n * ne, 0.0);
        sc.mlp.copy_from_slice(&st.b.tmp[..n * ne]);
        crate::cb!(st, "ffn_mlp", il, tmp, ne);
        // the router reads rmsnorm(x) / sqrt(n_embd) * ffn_gate_inp.scale
        let n_exp = m.router.ne[1];
        sc.rin.resize(n * ne, 0.0);
        sc.rin.copy_from_slice(&st.b.x[..n * ne]);
        let inv = 1.0 / (ne as f32).sqrt();
        for r in sc.rin.chunks_exact_mut(ne) {
            rms_norm_row(r, None, self.eps);
            for (v, s) in r.iter_mut().zip(&m.router_s) {
                *v = (*v * inv) * s;
            }
        }
        sc.logits.resize(n * n_exp, 0.0);
        {
            let b = &mut *st.b;
            Step::mm(st.pool, st.dev, &m.router, &sc.rin, n, &mut sc.logits, &mut b.mm_scratch, &mut b.lora)?;
        }
        st.build_norm(&m.pre_norm_2, None, Norm::Rms, self.eps);
        let w = MoeWeights {
            router: &m.router,
            router_b: None,
            gate: m.gate.as_ref(),
            up: &m.up,
            down: &m.down,
            gate_b: None,
            up_b: None,
            down_b: None,
            probs_b: None,
        };
        let x = MoeExtra { logits: Some(&sc.logits), down_s: m.down_s.as_deref(), gate_up: m.fused };
        st.build_moe_ffn_ext(il, &w, &self.moe_cfg, &x)?;
        st.build_post_norm(&m.post_norm_2, self.eps);
        crate::cb!(st, "ffn_moe", il, tmp, ne);
        act::add_assign(&mut st.b.tmp[..n * ne], &sc.mlp);
        Ok(())
    }
}

impl Forward for Gemma4Fwd {
    fn rope(&self, il: usize) -> Option<&RopeParams> {
        let l = self.layers.get(il)?;
        if l.kv_src == il {
            Some(&l.rope)
        } else {
            None
        }
    }

    fn kv_layers(&self) -> Option<Vec<bool>> {
        Some(self.layers.iter().enumerate().map(|(il, l)| l.kv_src == il).collect())
    }

    fn forward(&self, st: &mut Step) -> Result<()> {
        let ne = st.hp.n_embd;
        let mut guard = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
        let sc = &mut *guard;
        st.build_inp_embd(&self.tok_embd, (ne as f32).sqrt())?;
        if let Some(ple) = &self.ple {
            self.per_layer_inputs(st, ple, sc)?;
        }
        let (nl, n_pl) = (self.layers.len(), self.n_pl);
        for (il, l) in self.layers.iter().enumerate() {
            st.build_norm(&l.attn_norm, None, Norm::Rms, self.eps);
            self.attention(st, il, l)?;
            st.build_post_norm(&l.post_attn_norm, self.eps);
            st.residual();
            self.ffn(st, il, l, sc)?;
            st.build_post_norm(&l.post_ffw_norm, self.eps);
            st.residual();
            if let Some(p) = &l.pl {
                let n = st.n;
                sc.g.resize(n * n_pl, 0.0);
                {
                    let b = &mut *st.b;
                    Step::mm(st.pool, st.dev, &p.inp_gate, &b.x, n, &mut sc.g, &mut b.mm_scratch, &mut b.lora)?;
                }
                act::gelu(&mut sc.g[..n * n_pl]);
                for t in 0..n {
                    let inp = &sc.pl[t * nl * n_pl + il * n_pl..t * nl * n_pl + (il + 1) * n_pl];
                    for (g, v) in sc.g[t * n_pl..(t + 1) * n_pl].iter_mut().zip(inp) {
                        *g *= v;
                    }
                }
                let b = &mut *st.b;
                Step::mm(st.pool, st.dev, &p.proj, &sc.g, n, &mut b.tmp, &mut b.mm_scratch, &mut b.lora)?;
                st.build_post_norm(&p.post_norm, self.eps);
                st.residual();
            }
            if let Some(s) = l.out_scale {
                act::scale(&mut st.b.x[..st.n * ne], s);
            }
            st.build_cvec(il);
            crate::cb!(st, "l_out", il, x, ne);
        }
        if !st.select_outputs() {
            return Ok(());
        }
        st.build_norm(&self.output_norm, None, Norm::Rms, self.eps);
        st.build_output(&self.output, None, self.final_softcap)
    }
}
