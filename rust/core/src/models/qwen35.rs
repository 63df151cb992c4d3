//! Qwen3.5 dense (llama.cpp's src/models/qwen35.cpp with delta-net-base.cpp): a hybrid of
//! gated delta-net layers (`is_recr`: from `attention.recurrent_layers`, else every layer
//! but each `full_attention_interval`-th, default 4) and gated attention layers. Every
//! layer: RMSNorm, the mixer, the residual, RMSNorm (`post_attention_norm`), a SwiGLU
//! feed-forward, the residual.
//!
//! Gated attention: `attn_q` yields per head the query and a gate (hd each); per-head
//! RMSNorm of q and k; rope (llama.cpp's IMROPE, which for text tokens, whose position is
//! the same in every section, is NEOX rope over `rope.dimension_count` dims); attention;
//! the output times sigmoid(gate); `attn_output`.
//!
//! Gated delta net: `attn_qkv` into the conv channels (q, k: `ssm.group_count` heads of
//! `ssm.state_size`; v: `ssm.time_step_rank` heads), a causal depthwise convolution
//! (`ssm.conv_kernel` taps, no bias; its last inputs are the conv state) and SiLU; q and k
//! L2-normed; per value head h (key head h % n_k_heads) the delta rule on the
//! [S_v, S_v] state with decay exp(softplus(alpha + dt_bias) * ssm_a) and strength
//! sigmoid(beta); the output RMS-normed per head times SiLU(`attn_gate` x); `ssm_out`.
//! Files with NextN/MTP layers are refused (llama.cpp skips them in the main pass, but
//! their count changes the layer indices).
//!
//! `qwen35moe` (Qwen3.5-MoE) is the same with a mixture-of-experts feed-forward: softmax
//! routing over `expert_count` experts, the `expert_used_count` best renormalized, plus a
//! shared SwiGLU expert scaled by sigmoid(`ffn_gate_inp_shexp` x), added after.
//!
//! `qwen3next` (Qwen3-Next, llama.cpp's src/models/qwen3next.cpp) is the MoE variant with
//! plain NEOX rope (so it can shift positions), beta and alpha from one `ssm_ba`
//! projection (per key head: its value heads' betas, then their alphas), the key heads
//! repeated interleaved (value head h reads key head h / (n_v_heads / n_k_heads)), and, in
//! older files, q, k, v and z from one `ssm_in` projection laid out per key head.

use super::graph::{MoeConfig, layer_rope, FfnAct, FfnGate, FfnWeights, MoeWeights, Norm};
use super::loader::{Keep, Loader};
use super::mamba2::SsmParams;
use super::{common_hparams_ext, Arch};
use crate::context::{ContextParams, Forward, Step};
use crate::error::{Error, Result};
use crate::gguf::Value;
use crate::hparams::{HParams, Meta, RopeType};
use crate::model::TensorView;
use crate::ops::attention::{self, AttnInputs, AttnParams};
use crate::ops::norm::rms_norm_row;
use crate::ops::rope::RopeParams;
use crate::ops::{act, ssm};
use std::sync::Mutex;

pub struct Qwen35;
pub struct Qwen35Moe;
pub struct Qwen3Next;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Variant {
    Qwen35,
    Qwen35Moe,
    Qwen3Next,
}

impl Arch for Qwen3Next {
    fn name(&self) -> &'static str {
        "qwen3next"
    }
    fn moe(&self) -> bool {
        true
    }
    fn hparams(&self, meta: &Meta, n_vocab: usize) -> Result<HParams> {
        Qwen35Moe.hparams(meta, n_vocab)
    }
    fn type_name(&self, hp: &HParams) -> &'static str {
        if hp.n_layer == 48 {
            "80B.A3B"
        } else {
            "?B"
        }
    }
    fn build_forward(&self, ld: &Loader, cp: &ContextParams) -> Result<Box<dyn Forward>> {
        build(ld, cp, self.name(), Variant::Qwen3Next)
    }
}

/// The MoE variant's feed-forward widths: experts (`expert_feed_forward_length`, else
/// n_ff / n_expert_used) and the shared expert (`expert_shared_feed_forward_length`, else n_ff).
fn moe_widths(meta: &Meta, hp: &HParams) -> Result<(usize, usize)> {
    let n_ff = hp.n_ff.first().copied().unwrap_or(0);
    let fe = if hp.n_ff_exp > 0 { hp.n_ff_exp } else { n_ff / hp.n_expert_used.max(1) };
    let fs = meta.u("expert_shared_feed_forward_length")?.unwrap_or(n_ff);
    if fe == 0 || fs == 0 || fe > crate::hparams::MAX_DIM || fs > crate::hparams::MAX_DIM {
        return Err(Error::Unsupported(format!("{}: expert feed-forward widths {fe} / {fs} must be in [1, 2^24]", meta.file.path)));
    }
    Ok((fe, fs))
}

/// Which layers are gated delta-net layers (llama.cpp's is_recr).
fn recurrent_layers(meta: &Meta, n_layer: usize) -> Result<Vec<bool>> {
    let bad = |m: String| Error::Unsupported(format!("{}: {m}", meta.file.path));
    if let Some(v) = meta.get("attention.recurrent_layers") {
        let Value::Array(a) = v else {
            return Err(bad(format!("'{}' must be an array", meta.key("attention.recurrent_layers"))));
        };
        if a.len() < n_layer {
            return Err(bad(format!("'{}' has {} entries for {n_layer} layers", meta.key("attention.recurrent_layers"), a.len())));
        }
        return a
            .iter()
            .take(n_layer)
            .map(|x| match &x {
                Value::Bool(b) => Ok(*b),
                other => other.as_i64().map(|i| i != 0).ok_or_else(|| bad(format!("'{}' must hold booleans", meta.key("attention.recurrent_layers")))),
            })
            .collect();
    }
    let every = meta.u("full_attention_interval")?.unwrap_or(4);
    if every == 0 {
        return Err(bad(format!("'{}' must be positive", meta.key("full_attention_interval"))));
    }
    Ok((0..n_layer).map(|i| (i + 1) % every != 0).collect())
}

fn check_file(meta: &Meta) -> Result<()> {
    if meta.u("nextn_predict_layers")?.unwrap_or(0) > 0 {
        return Err(Error::Unsupported(format!(
            "{}: '{}' > 0: Qwen3.5 / Qwen3-Next files with NextN (MTP) layers are not supported",
            meta.file.path,
            meta.key("nextn_predict_layers")
        )));
    }
    Ok(())
}

impl Arch for Qwen35Moe {
    fn name(&self) -> &'static str {
        "qwen35moe"
    }
    fn moe(&self) -> bool {
        true
    }
    fn hparams(&self, meta: &Meta, n_vocab: usize) -> Result<HParams> {
        let mut hp = qwen35_hparams(meta, n_vocab)?;
        let (fe, fs) = moe_widths(meta, &hp)?;
        hp.n_ff_exp = fe;
        // the scratch of the feed-forward is sized from n_ff: room for either expert kind
        for f in hp.n_ff.iter_mut() {
            *f = (*f).max(fe).max(fs);
        }
        Ok(hp)
    }
    fn type_name(&self, hp: &HParams) -> &'static str {
        match hp.n_layer {
            40 => "35B.A3B",
            48 => "122B.A10B",
            60 => "397B.A17B",
            _ => "?B",
        }
    }
    fn build_forward(&self, ld: &Loader, cp: &ContextParams) -> Result<Box<dyn Forward>> {
        build(ld, cp, self.name(), Variant::Qwen35Moe)
    }
}

fn qwen35_hparams(meta: &Meta, n_vocab: usize) -> Result<HParams> {
    {
        check_file(meta)?;
        let sp = SsmParams::read(meta, true)?;
        if sp.d_inner != sp.d_state * sp.n_head {
            return Err(Error::Unsupported(format!(
                "{}: ssm.inner_size {} must be ssm.state_size {} x ssm.time_step_rank {} (value heads as wide as key heads)",
                meta.file.path, sp.d_inner, sp.d_state, sp.n_head
            )));
        }
        let hp = common_hparams_ext(meta, n_vocab, RopeType::Neox, true)?;
        recurrent_layers(meta, hp.n_layer)?;
        if hp.n_embd_head_k != hp.n_embd_head_v {
            return Err(Error::Unsupported(format!("{}: Qwen3.5 needs key_length == value_length", meta.file.path)));
        }
        Ok(hp)
    }
}

impl Arch for Qwen35 {
    fn name(&self) -> &'static str {
        "qwen35"
    }

    fn hparams(&self, meta: &Meta, n_vocab: usize) -> Result<HParams> {
        qwen35_hparams(meta, n_vocab)
    }

    fn type_name(&self, hp: &HParams) -> &'static str {
        match (hp.n_layer, hp.n_embd) {
            (24, 1024) => "0.8B",
            (24, _) => "2B",
            (32, 2560) => "4B",
            (32, _) => "9B",
            (64, _) => "27B",
            _ => "?B",
        }
    }

    fn build_forward(&self, ld: &Loader, cp: &ContextParams) -> Result<Box<dyn Forward>> {
        build(ld, cp, self.name(), Variant::Qwen35)
    }
}

fn build(ld: &Loader, cp: &ContextParams, arch: &str, variant: Variant) -> Result<Box<dyn Forward>> {
    let moe = variant != Variant::Qwen35;
    let next = variant == Variant::Qwen3Next;
    {
        let hp = ld.hp();
        let meta = Meta { file: &ld.model().files[0], arch };
        check_file(&meta)?;
        let sp = SsmParams::read(&meta, true)?;
        let recr = recurrent_layers(&meta, hp.n_layer)?;
        let (ne, nv) = (hp.n_embd, hp.n_vocab);
        let tok_embd = ld.req("token_embd.weight", &[ne, nv])?;
        let output = ld.opt("output.weight", &[ne, nv])?.unwrap_or(tok_embd);
        let key_dim = sp.d_state * sp.n_group;
        let value_dim = sp.d_inner;
        let conv_dim = sp.conv_dim();
        let hd = hp.n_embd_head_k;
        let mut layers = Vec::with_capacity(hp.n_layer);
        for il in 0..hp.n_layer {
            let b = |s: &str| format!("blk.{il}.{s}");
            let nf = hp.n_ff[il];
            let mixer = if recr[il] {
                let qkvz = match (next, ld.opt(&b("attn_qkv.weight"), &[ne, 2 * key_dim + value_dim])?) {
                    (true, None) => Qkvz::Legacy(ld.req(&b("ssm_in.weight"), &[ne, 2 * key_dim + 2 * value_dim])?),
                    (_, w) => Qkvz::Split {
                        wqkv: match w {
                            Some(w) => w,
                            None => ld.req(&b("attn_qkv.weight"), &[ne, 2 * key_dim + value_dim])?,
                        },
                        wgate: ld.req(&b("attn_gate.weight"), &[ne, value_dim])?,
                    },
                };
                let ba = if next {
                    Ba::Fused(ld.req(&b("ssm_ba.weight"), &[ne, 2 * sp.n_head])?)
                } else {
                    Ba::Split {
                        beta: ld.req(&b("ssm_beta.weight"), &[ne, sp.n_head])?,
                        alpha: ld.req(&b("ssm_alpha.weight"), &[ne, sp.n_head])?,
                    }
                };
                Mixer::Gdn {
                    qkvz,
                    ba,
                    conv: ld.req_vec(&b("ssm_conv1d.weight"), &[sp.d_conv, conv_dim])?,
                    dt_b: ld.req_vec(&b("ssm_dt.bias"), &[sp.n_head])?,
                    a: ld.req_vec(&b("ssm_a"), &[sp.n_head])?,
                    norm: ld.req_vec(&b("ssm_norm.weight"), &[sp.d_state])?,
                    out: ld.req(&b("ssm_out.weight"), &[value_dim, ne])?,
                }
            } else {
                let (nh, nk) = (hp.n_head(il), hp.n_embd_k_gqa(il));
                if nh == 0 || hp.n_head_kv(il) == 0 {
                    return Err(Error::Unsupported(format!(
                        "{}: layer {il} is an attention layer but has no heads",
                        ld.model().files[0].path
                    )));
                }
                Mixer::Attn {
                    wq: ld.req(&b("attn_q.weight"), &[ne, 2 * nh * hd])?,
                    wk: ld.req(&b("attn_k.weight"), &[ne, nk])?,
                    wv: ld.req(&b("attn_v.weight"), &[ne, nk])?,
                    wo: ld.req(&b("attn_output.weight"), &[nh * hd, ne])?,
                    q_norm: ld.req_vec(&b("attn_q_norm.weight"), &[hd])?,
                    k_norm: ld.req_vec(&b("attn_k_norm.weight"), &[hd])?,
                    rope: layer_rope(hp, cp, il, None),
                }
            };
            let ffn = if moe {
                let (fe, fs) = moe_widths(&meta, hp)?;
                let nx = hp.n_expert;
                Ffn::Moe {
                    router: ld.req(&b("ffn_gate_inp.weight"), &[ne, nx])?,
                    gate: ld.req(&b("ffn_gate_exps.weight"), &[ne, fe, nx])?,
                    up: ld.req(&b("ffn_up_exps.weight"), &[ne, fe, nx])?,
                    down: ld.req(&b("ffn_down_exps.weight"), &[fe, ne, nx])?,
                    sh_inp: ld.req(&b("ffn_gate_inp_shexp.weight"), &[ne])?,
                    sh_gate: ld.req(&b("ffn_gate_shexp.weight"), &[ne, fs])?,
                    sh_up: ld.req(&b("ffn_up_shexp.weight"), &[ne, fs])?,
                    sh_down: ld.req(&b("ffn_down_shexp.weight"), &[fs, ne])?,
                }
            } else {
                Ffn::Dense {
                    gate: ld.req(&b("ffn_gate.weight"), &[ne, nf])?,
                    up: ld.req(&b("ffn_up.weight"), &[ne, nf])?,
                    down: ld.req(&b("ffn_down.weight"), &[nf, ne])?,
                }
            };
            layers.push(Layer {
                attn_norm: ld.req_vec(&b("attn_norm.weight"), &[ne])?,
                post_norm: ld.req_vec(&b("post_attention_norm.weight"), &[ne])?,
                mixer,
                ffn,
            });
        }
        Ok(Box::new(Qwen35Fwd {
            tok_embd,
            output_norm: ld.req_vec("output_norm.weight", &[ne])?,
            output,
            layers,
            recr,
            sp,
            eps: hp.f_norm_rms_eps,
            n_expert_used: hp.n_expert_used,
            variant,
            scratch: Mutex::new(Scratch::default()),
            _keep: ld.keep(),
        }))
    }
}

enum Mixer {
    Attn {
        wq: TensorView<'static>,
        wk: TensorView<'static>,
        wv: TensorView<'static>,
        wo: TensorView<'static>,
        q_norm: Vec<f32>,
        k_norm: Vec<f32>,
        rope: RopeParams,
    },
    Gdn {
        qkvz: Qkvz,
        ba: Ba,
        /// [conv_dim][d_conv]
        conv: Vec<f32>,
        dt_b: Vec<f32>,
        a: Vec<f32>,
        norm: Vec<f32>,
        out: TensorView<'static>,
    },
}

/// Where q, k, v (the conv channels) and z come from.
enum Qkvz {
    Split { wqkv: TensorView<'static>, wgate: TensorView<'static> },
    /// qwen3next's older files: one projection, per key head [q, k, v (its value heads), z].
    Legacy(TensorView<'static>),
}

/// Where beta and alpha come from.
enum Ba {
    Split { beta: TensorView<'static>, alpha: TensorView<'static> },
    /// qwen3next: one projection, per key head [its value heads' betas, then alphas].
    Fused(TensorView<'static>),
}

enum Ffn {
    Dense {
        gate: TensorView<'static>,
        up: TensorView<'static>,
        down: TensorView<'static>,
    },
    Moe {
        router: TensorView<'static>,
        gate: TensorView<'static>,
        up: TensorView<'static>,
        down: TensorView<'static>,
        sh_inp: TensorView<'static>,
        sh_gate: TensorView<'static>,
        sh_up: TensorView<'static>,
        sh_down: TensorView<'static>,
    },
}

struct Layer {
    attn_norm: Vec<f32>,
    post_norm: Vec<f32>,
    mixer: Mixer,
    ffn: Ffn,
}

#[derive(Default)]
struct Scratch {
    a: Vec<f32>,
    b: Vec<f32>,
    c: Vec<f32>,
    d: Vec<f32>,
    e: Vec<f32>,
    f: Vec<f32>,
    win: Vec<f32>,
    delta: Vec<f32>,
}

struct Qwen35Fwd {
    tok_embd: TensorView<'static>,
    output_norm: Vec<f32>,
    output: TensorView<'static>,
    layers: Vec<Layer>,
    recr: Vec<bool>,
    sp: SsmParams,
    eps: f32,
    n_expert_used: usize,
    variant: Variant,
    scratch: Mutex<Scratch>,
    _keep: Keep,
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// Gated attention of layer `il`: in `cur` [n, n_embd], out `tmp` [n, n_embd].
#[allow(clippy::too_many_arguments)]
fn gated_attn(
    st: &mut Step,
    il: usize,
    wq: &TensorView,
    wk: &TensorView,
    wv: &TensorView,
    wo: &TensorView,
    q_norm: &[f32],
    k_norm: &[f32],
    rope: &RopeParams,
    eps: f32,
    sc: &mut Scratch,
) -> Result<()> {
    let hp = st.hp;
    let n = st.n;
    let (nh, nkv, hd) = (hp.n_head(il), hp.n_head_kv(il), hp.n_embd_head_k);
    let (qw, kw) = (nh * hd, nkv * hd);
    sc.a.resize(n * 2 * qw, 0.0); // q and gate, per head
    sc.b.resize(n * qw, 0.0); // q
    sc.c.resize(n * qw, 0.0); // gate
    sc.d.resize(n * kw, 0.0); // k
    {
        let b = &mut *st.b;
        Step::mm(st.pool, st.dev, wq, &b.cur, n, &mut sc.a, &mut b.mm_scratch, &mut b.lora)?;
        Step::mm(st.pool, st.dev, wk, &b.cur, n, &mut sc.d, &mut b.mm_scratch, &mut b.lora)?;
        Step::mm(st.pool, st.dev, wv, &b.cur, n, &mut b.v, &mut b.mm_scratch, &mut b.lora)?;
    }
    for t in 0..n {
        for h in 0..nh {
            let src = &sc.a[t * 2 * qw + h * 2 * hd..t * 2 * qw + (h + 1) * 2 * hd];
            sc.b[t * qw + h * hd..t * qw + (h + 1) * hd].copy_from_slice(&src[..hd]);
            sc.c[t * qw + h * hd..t * qw + (h + 1) * hd].copy_from_slice(&src[hd..]);
        }
    }
    for h in sc.b[..n * qw].chunks_exact_mut(hd) {
        rms_norm_row(h, Some(q_norm), eps);
    }
    for h in sc.d[..n * kw].chunks_exact_mut(hd) {
        rms_norm_row(h, Some(k_norm), eps);
    }
    let b = &mut *st.b;
    for t in 0..n {
        rope.apply_heads(&mut sc.b[t * qw..(t + 1) * qw], hd, b.pos[t], &mut b.rope_cache);
        rope.apply_heads(&mut sc.d[t * kw..(t + 1) * kw], hd, b.pos[t], &mut b.rope_cache);
    }
    let kv = &mut *st.kv;
    crate::kv_cache::fwht(&mut sc.b[..n * qw], kv.rot_k);
    crate::kv_cache::fwht(&mut sc.d[..n * kw], kv.rot_k);
    crate::kv_cache::fwht(&mut b.v[..n * kw], kv.rot_v);
    super::graph::store_kv_rows(st.pool, kv, il, &b.cells[..n], &sc.d[..n * kw], &b.v[..n * kw])?;
    let scale = if hp.f_attention_scale != 0.0 { hp.f_attention_scale } else { 1.0 / (hd as f32).sqrt() };
    let p = AttnParams { il, n_head: nh, n_head_kv: nkv, hd_k: hd, hd_v: hd, scale, softcap: 0.0, n_swa: 0, chunked: false, sinks: None };
    let inp = AttnInputs { pos: &b.pos[..n], stream: &b.stream[..n], key_range: &b.key_range[..n], keys: &b.keys };
    attention::attention(st.pool, kv, &p, &inp, &sc.b, &mut b.att, &mut b.attn_scratch, b.attn_stride);
    crate::kv_cache::fwht(&mut b.att[..n * qw], kv.rot_v);
    for (o, g) in b.att[..n * qw].iter_mut().zip(&sc.c[..n * qw]) {
        *o *= sigmoid(*g);
    }
    Step::mm(st.pool, st.dev, wo, &b.att, n, &mut b.tmp, &mut b.mm_scratch, &mut b.lora)?;
    Ok(())
}

/// The gated delta-net block of layer `il`: in `cur` [n, n_embd], out `tmp` [n, n_embd].
#[allow(clippy::too_many_arguments)]
fn gated_delta_net(st: &mut Step, il: usize, m: &Mixer, sp: &SsmParams, eps: f32, interleave: bool, sc: &mut Scratch) -> Result<()> {
    let Mixer::Gdn { qkvz, ba, conv, dt_b, a, norm, out } = m else {
        return Err(Error::Invalid("internal: not a delta-net layer".into()));
    };
    let n = st.n;
    let n_seqs = st.rs_seqs.max(1);
    let nt = n / n_seqs;
    let (sk, hk, hv) = (sp.d_state, sp.n_group, sp.n_head);
    let sv = sp.d_inner / hv;
    let key_dim = sk * hk;
    let cd = sp.conv_dim();
    let vd = sp.d_inner;
    sc.a.resize(n * cd, 0.0); // qkv mixed
    sc.b.resize(n * vd, 0.0); // z
    sc.c.resize(n * 2 * hv, 0.0); // beta, alpha
    sc.d.resize(n * cd, 0.0); // conv output
    sc.e.resize(n * vd, 0.0); // delta-net output
    sc.delta.resize(sv, 0.0);
    let r = hv / hk; // value heads per key head
    {
        let b = &mut *st.b;
        match qkvz {
            Qkvz::Split { wqkv, wgate } => {
                Step::mm(st.pool, st.dev, wqkv, &b.cur, n, &mut sc.a, &mut b.mm_scratch, &mut b.lora)?;
                Step::mm(st.pool, st.dev, wgate, &b.cur, n, &mut sc.b, &mut b.mm_scratch, &mut b.lora)?;
            }
            Qkvz::Legacy(w) => {
                let width = 2 * key_dim + 2 * vd;
                let per = 2 * sk + 2 * sv * r;
                sc.f.resize(n * width, 0.0);
                Step::mm(st.pool, st.dev, w, &b.cur, n, &mut sc.f, &mut b.mm_scratch, &mut b.lora)?;
                for t in 0..n {
                    let src = &sc.f[t * width..(t + 1) * width];
                    let (qkv, z) = (&mut sc.a[t * cd..(t + 1) * cd], &mut sc.b[t * vd..(t + 1) * vd]);
                    for g in 0..hk {
                        let s0 = &src[g * per..(g + 1) * per];
                        qkv[g * sk..(g + 1) * sk].copy_from_slice(&s0[..sk]);
                        qkv[key_dim + g * sk..key_dim + (g + 1) * sk].copy_from_slice(&s0[sk..2 * sk]);
                        qkv[2 * key_dim + g * sv * r..2 * key_dim + (g + 1) * sv * r].copy_from_slice(&s0[2 * sk..2 * sk + sv * r]);
                        z[g * sv * r..(g + 1) * sv * r].copy_from_slice(&s0[2 * sk + sv * r..]);
                    }
                }
            }
        }
        match ba {
            Ba::Split { beta, alpha } => {
                sc.f.resize(n * hv, 0.0);
                Step::mm(st.pool, st.dev, beta, &b.cur, n, &mut sc.f, &mut b.mm_scratch, &mut b.lora)?;
                sc.c[..n * hv].copy_from_slice(&sc.f[..n * hv]);
                Step::mm(st.pool, st.dev, alpha, &b.cur, n, &mut sc.f, &mut b.mm_scratch, &mut b.lora)?;
                sc.c[n * hv..2 * n * hv].copy_from_slice(&sc.f[..n * hv]);
            }
            Ba::Fused(w) => {
                sc.f.resize(n * 2 * hv, 0.0);
                Step::mm(st.pool, st.dev, w, &b.cur, n, &mut sc.f, &mut b.mm_scratch, &mut b.lora)?;
                for t in 0..n {
                    for g in 0..hk {
                        for j in 0..r {
                            sc.c[t * hv + g * r + j] = sc.f[t * 2 * hv + g * 2 * r + j];
                            sc.c[n * hv + t * hv + g * r + j] = sc.f[t * 2 * hv + g * 2 * r + r + j];
                        }
                    }
                }
            }
        }
    }
    // beta = sigmoid(beta); g = softplus(alpha + dt_bias) * a
    let (betas, gs) = sc.c.split_at_mut(n * hv);
    for v in betas.iter_mut() {
        *v = sigmoid(*v);
    }
    for row in gs[..n * hv].chunks_exact_mut(hv) {
        for h in 0..hv {
            row[h] = ssm::softplus(row[h] + dt_b[h]) * a[h];
        }
    }
    let rs = st.rs.as_deref_mut().ok_or_else(|| Error::Invalid("internal: qwen35 without recurrent memory".into()))?;
    let (nr, ns) = (rs.n_embd_r, rs.n_embd_s);
    // rollback snapshots (delta-net-base.cpp): every plane of the conv state (those beyond
    // nt with the state before the micro-batch), the planes 1..min(nt, n_rs_seq + 1) - 1 of
    // the delta state
    let conv_snaps = 1..rs.n_rs_seq + 1;
    let snaps = 1..nt.min(rs.n_rs_seq + 1);
    for k in 0..n_seqs {
        let cell = rs.head + k;
        let qkv = &sc.a;
        let x = |t: usize| &qkv[(k * nt + t) * cd..(k * nt + t + 1) * cd];
        if !conv_snaps.is_empty() {
            ssm::conv_snapshots(&mut rs.r[il], rs.size, cell, conv_snaps.clone(), &x, nt, sp.d_conv, nr);
        }
        let state = &mut rs.r[il][cell * nr..(cell + 1) * nr];
        ssm::conv_seq(state, &x, nt, conv, sp.d_conv, &mut sc.d[k * nt * cd..], cd, &mut sc.win);
    }
    let l2_eps = eps / sk as f32;
    let l2_scale = 1.0 / (sk as f32).sqrt();
    for row in sc.d[..n * cd].chunks_exact_mut(cd) {
        act::silu_row(row);
        // L2 norm of the q and k heads: rms_norm(x, eps / n) * 1 / sqrt(n)
        for h in row[..2 * key_dim].chunks_exact_mut(sk) {
            rms_norm_row(h, None, l2_eps);
            for v in h.iter_mut() {
                *v *= l2_scale;
            }
        }
    }
    for k in 0..n_seqs {
        let cell = rs.head + k;
        for t in 0..nt {
            let s = &mut rs.s[il][cell * ns..(cell + 1) * ns];
            let row = k * nt + t;
            let qkv = &sc.d[row * cd..(row + 1) * cd];
            for h in 0..hv {
                // qwen3next repeats the key heads interleaved before the op; Qwen3.5's fused
                // op broadcasts them (value head h reads key head h % n_k_heads)
                let kh = if interleave { h / r } else { h % hk };
                let q = &qkv[kh * sk..(kh + 1) * sk];
                let kk = &qkv[key_dim + kh * sk..key_dim + (kh + 1) * sk];
                let v = &qkv[2 * key_dim + h * sv..2 * key_dim + (h + 1) * sv];
                let m = &mut s[h * sv * sv..(h + 1) * sv * sv];
                let o = &mut sc.e[row * vd + h * sv..row * vd + (h + 1) * sv];
                ssm::delta_net_token(m, q, kk, v, gs[row * hv + h], betas[row * hv + h], o, &mut sc.delta);
            }
            if snaps.contains(&(nt - 1 - t)) {
                let to = rs.row(nt - 1 - t, cell, ns).start;
                rs.s[il].copy_within(cell * ns..(cell + 1) * ns, to);
            }
        }
    }
    // gated norm: rmsnorm(o) * w * silu(z), per head
    for (o, z) in sc.e[..n * vd].chunks_exact_mut(sv).zip(sc.b[..n * vd].chunks_exact_mut(sv)) {
        rms_norm_row(o, Some(norm), eps);
        act::silu_row(z);
        for (ov, zv) in o.iter_mut().zip(z.iter()) {
            *ov *= zv;
        }
    }
    let b = &mut *st.b;
    Step::mm(st.pool, st.dev, out, &sc.e, n, &mut b.tmp, &mut b.mm_scratch, &mut b.lora)?;
    Ok(())
}

impl Forward for Qwen35Fwd {
    fn rope(&self, il: usize) -> Option<&RopeParams> {
        match &self.layers.get(il)?.mixer {
            Mixer::Attn { rope, .. } => Some(rope),
            Mixer::Gdn { .. } => None,
        }
    }

    fn recurrent(&self) -> Option<(Vec<bool>, usize, usize)> {
        Some((self.recr.clone(), (self.sp.d_conv - 1) * self.sp.conv_dim(), self.sp.d_state * self.sp.d_inner))
    }

    fn rs_rollback(&self) -> bool {
        // llm_arch_supports_rs_rollback: qwen35 and qwen35moe, not qwen3next
        self.variant != Variant::Qwen3Next
    }

    fn can_shift(&self) -> bool {
        // llama.cpp: a KV cache with several positions per token (Qwen3.5's M-RoPE) cannot K-shift
        self.variant == Variant::Qwen3Next
    }

    fn forward(&self, st: &mut Step) -> Result<()> {
        let ne = st.hp.n_embd;
        let mut sc = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
        st.build_inp_embd(&self.tok_embd, 1.0)?;
        let nl = self.layers.len();
        for (il, l) in self.layers.iter().enumerate() {
            st.build_norm(&l.attn_norm, None, Norm::Rms, self.eps);
            crate::cb!(st, "attn_norm", il, cur, ne);
            match &l.mixer {
                Mixer::Attn { wq, wk, wv, wo, q_norm, k_norm, rope } => {
                    gated_attn(st, il, wq, wk, wv, wo, q_norm, k_norm, rope, self.eps, &mut sc)?
                }
                m @ Mixer::Gdn { .. } => {
                    gated_delta_net(st, il, m, &self.sp, self.eps, self.variant == Variant::Qwen3Next, &mut sc)?
                }
            }
            if il == nl - 1 && !st.select_outputs() {
                return Ok(());
            }
            st.residual();
            crate::cb!(st, "attn_residual", il, x, ne);
            st.build_norm(&l.post_norm, None, Norm::Rms, self.eps);
            match &l.ffn {
                Ffn::Dense { gate, up, down } => {
                    let f = FfnWeights { gate: Some(gate), gate_b: None, up, up_b: None, down, down_b: None };
                    st.build_ffn(il, &f, FfnAct::Silu, FfnGate::Par)?;
                }
                Ffn::Moe { router, gate, up, down, sh_inp, sh_gate, sh_up, sh_down } => {
                    // shared expert first (its output kept), then the routed experts into tmp
                    let f = FfnWeights { gate: Some(sh_gate), gate_b: None, up: sh_up, up_b: None, down: sh_down, down_b: None };
                    st.build_ffn(il, &f, FfnAct::Silu, FfnGate::Par)?;
                    let n = st.n;
                    sc.f.resize(n * ne, 0.0);
                    sc.f[..n * ne].copy_from_slice(&st.b.tmp[..n * ne]);
                    sc.e.resize(n, 0.0);
                    {
                        let b = &mut *st.b;
                        Step::mm(st.pool, st.dev, sh_inp, &b.cur, n, &mut sc.e, &mut b.mm_scratch, &mut b.lora)?;
                    }
                    let m = MoeWeights {
                        router,
                        router_b: None,
                        gate: Some(gate),
                        up,
                        down,
                        gate_b: None,
                        up_b: None,
                        down_b: None,
                        probs_b: None,
                    };
                    st.build_moe_ffn(il, &m, &MoeConfig::softmax(self.n_expert_used, true))?;
                    for t in 0..n {
                        let g = sigmoid(sc.e[t]);
                        for (o, sh) in st.b.tmp[t * ne..(t + 1) * ne].iter_mut().zip(&sc.f[t * ne..(t + 1) * ne]) {
                            *o += sh * g;
                        }
                    }
                }
            }
            st.residual();
            st.build_cvec(il);
            crate::cb!(st, "l_out", il, x, ne);
        }
        st.build_norm(&self.output_norm, None, Norm::Rms, self.eps);
        st.build_output(&self.output, None, 0.0)
    }
}
