//! LFM2 (llama.cpp's src/models/lfm2.cpp, dense variant): a hybrid of short-convolution
//! layers (those with `attention.head_count_kv` 0) and attention layers. Every layer is
//! RMSNorm, the mixer, the residual, RMSNorm, a SwiGLU feed-forward, the residual.
//! Attention: q/k/v projections, per-head RMSNorm of q and k, NEOX rope, attention with
//! scale 1/sqrt(head size) (a sliding window on every attention layer when the file sets
//! `attention.sliding_window`). Short convolution: in_proj into b, c, x; b * x through a
//! causal depthwise convolution of `shortconv.l_cache` taps whose last l_cache - 1 inputs
//! are the sequence's recurrent state; c * that; out_proj. The output norm is the tensor
//! llama.cpp names `token_embd_norm`; the output is tied when absent.
//! `lfm2moe` (lfm2moe.rs) is the same graph with mixture-of-experts feed-forwards after
//! `leading_dense_block_count` dense layers (`build` below with `Some(MoeSpec)`).

use super::graph::{layer_rope, AttnConfig, AttnWeights, FfnAct, FfnGate, FfnWeights, MoeConfig, MoeWeights, Norm, Qkv};
use super::loader::{Keep, Loader};
use super::{common_hparams_ext, Arch};
use crate::context::{ContextParams, Forward, Step};
use crate::error::{Error, Result};
use crate::hparams::{HParams, Meta, RopeType};
use crate::model::TensorView;
use crate::ops::rope::RopeParams;
use crate::ops::ssm;
use std::sync::Mutex;

pub struct Lfm2;

pub(super) fn l_cache(meta: &Meta) -> Result<usize> {
    let l = meta.req_u("shortconv.l_cache")?;
    if !(2..=1024).contains(&l) {
        return Err(Error::Unsupported(format!("{}: '{}' = {l} must be in [2, 1024]", meta.file.path, meta.key("shortconv.l_cache"))));
    }
    Ok(l)
}

impl Arch for Lfm2 {
    fn name(&self) -> &'static str {
        "lfm2"
    }

    fn hparams(&self, meta: &Meta, n_vocab: usize) -> Result<HParams> {
        l_cache(meta)?;
        let mut hp = common_hparams_ext(meta, n_vocab, RopeType::Neox, true)?;
        if hp.n_head_kv.iter().all(|&k| k == 0) && hp.n_head.iter().all(|&h| h == 0) {
            return Err(Error::Unsupported(format!("{}: '{}' is missing or 0", meta.file.path, meta.key("attention.head_count"))));
        }
        // llama.cpp: is_recr(il) = head_count_kv(il) == 0; the window applies to the others
        if let Some(w) = meta.u("attention.sliding_window")? {
            if w > 0 {
                hp.n_swa = w;
                hp.swa_layers = hp.n_head_kv.iter().map(|&k| k > 0).collect();
            }
        }
        Ok(hp)
    }

    fn type_name(&self, hp: &HParams) -> &'static str {
        match hp.n_ff.first().copied().unwrap_or(0) {
            2560 => "230M",
            4608 => "350M",
            6912 => "700M",
            8192 => "1.2B",
            10752 => "2.6B",
            _ => "?B",
        }
    }

    fn build_forward(&self, ld: &Loader, cp: &ContextParams) -> Result<Box<dyn Forward>> {
        build(ld, cp, None)
    }
}

/// lfm2moe's feed-forwards: the layers from `n_dense_lead` on are experts routed by `cfg`.
pub(super) struct MoeSpec {
    pub n_dense_lead: usize,
    pub cfg: MoeConfig,
}

/// The LFM2 forward pass over `ld`'s tensors: dense feed-forwards everywhere (`moe` None:
/// lfm2) or experts after the leading dense layers (lfm2moe).
pub(super) fn build(ld: &Loader, cp: &ContextParams, moe: Option<MoeSpec>) -> Result<Box<dyn Forward>> {
    let hp = ld.hp();
    let meta = Meta { file: &ld.model().files[0], arch: &hp.arch };
    let lc = l_cache(&meta)?;
    let (ne, nv) = (hp.n_embd, hp.n_vocab);
    let tok_embd = ld.req("token_embd.weight", &[ne, nv])?;
    let output = ld.opt("output.weight", &[ne, nv])?.unwrap_or(tok_embd);
    let mut layers = Vec::with_capacity(hp.n_layer);
    for il in 0..hp.n_layer {
        let b = |s: &str| format!("blk.{il}.{s}");
        let nf = hp.n_ff[il];
        let mixer = if hp.n_head_kv(il) == 0 {
            Mixer::Conv {
                conv: ld.req_vec(&b("shortconv.conv.weight"), &[lc, ne])?,
                in_proj: ld.req(&b("shortconv.in_proj.weight"), &[ne, 3 * ne])?,
                out_proj: ld.req(&b("shortconv.out_proj.weight"), &[ne, ne])?,
            }
        } else {
            let (hd, nk) = (hp.n_embd_head_k, hp.n_embd_k_gqa(il));
            if hp.n_embd_v_gqa(il) != nk || hp.n_head(il) * hd != ne {
                return Err(Error::Unsupported(format!(
                    "{}: layer {il}: LFM2 attention needs n_head * head size = n_embd and equal K/V widths",
                    ld.model().files[0].path
                )));
            }
            Mixer::Attn {
                qkv: Qkv::load(ld, il, ne, ne, nk, nk)?,
                wo: ld.req(&b("attn_output.weight"), &[ne, ne])?,
                q_norm: ld.req_vec(&b("attn_q_norm.weight"), &[hd])?,
                k_norm: ld.req_vec(&b("attn_k_norm.weight"), &[hd])?,
                rope: layer_rope(hp, cp, il, None),
                n_swa: if hp.swa_layers.get(il).copied().unwrap_or(false) { hp.n_swa } else { 0 },
            }
        };
        let ffn = match &moe {
            Some(m) if il >= m.n_dense_lead => {
                let (nx, fe) = (hp.n_expert, hp.n_ff_exp);
                Ffn::Moe {
                    router: ld.req(&b("ffn_gate_inp.weight"), &[ne, nx])?,
                    gate: ld.req(&b("ffn_gate_exps.weight"), &[ne, fe, nx])?,
                    up: ld.req(&b("ffn_up_exps.weight"), &[ne, fe, nx])?,
                    down: ld.req(&b("ffn_down_exps.weight"), &[fe, ne, nx])?,
                    probs_b: ld.req_vec(&b("exp_probs_b.bias"), &[nx])?,
                }
            }
            _ => Ffn::Dense {
                gate: ld.req(&b("ffn_gate.weight"), &[ne, nf])?,
                up: ld.req(&b("ffn_up.weight"), &[ne, nf])?,
                down: ld.req(&b("ffn_down.weight"), &[nf, ne])?,
            },
        };
        layers.push(Layer {
            attn_norm: ld.req_vec(&b("attn_norm.weight"), &[ne])?,
            mixer,
            ffn_norm: ld.req_vec(&b("ffn_norm.weight"), &[ne])?,
            ffn,
        });
    }
    let recr = (0..hp.n_layer).map(|il| hp.n_head_kv(il) == 0).collect();
    Ok(Box::new(Lfm2Fwd {
        tok_embd,
        output_norm: ld.req_vec("token_embd_norm.weight", &[ne])?,
        output,
        layers,
        recr,
        moe: moe.map(|m| m.cfg),
        l_cache: lc,
        eps: hp.f_norm_rms_eps,
        scratch: Mutex::new(Scratch::default()),
        _keep: ld.keep(),
    }))
}

enum Mixer {
    Attn {
        qkv: Qkv,
        wo: TensorView<'static>,
        q_norm: Vec<f32>,
        k_norm: Vec<f32>,
        rope: RopeParams,
        n_swa: usize,
    },
    Conv {
        /// [n_embd][l_cache]
        conv: Vec<f32>,
        in_proj: TensorView<'static>,
        out_proj: TensorView<'static>,
    },
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
        probs_b: Vec<f32>,
    },
}

struct Layer {
    attn_norm: Vec<f32>,
    mixer: Mixer,
    ffn_norm: Vec<f32>,
    ffn: Ffn,
}

#[derive(Default)]
struct Scratch {
    bcx: Vec<f32>,
    bx: Vec<f32>,
    y: Vec<f32>,
    win: Vec<f32>,
}

struct Lfm2Fwd {
    tok_embd: TensorView<'static>,
    output_norm: Vec<f32>,
    output: TensorView<'static>,
    layers: Vec<Layer>,
    recr: Vec<bool>,
    moe: Option<MoeConfig>,
    l_cache: usize,
    eps: f32,
    scratch: Mutex<Scratch>,
    _keep: Keep,
}

/// The short-convolution block of layer `il`: in `cur` [n, n_embd], out `tmp`.
fn shortconv(
    st: &mut Step,
    il: usize,
    conv: &[f32],
    in_proj: &TensorView,
    out_proj: &TensorView,
    lc: usize,
    sc: &mut Scratch,
) -> Result<()> {
    let (n, ne) = (st.n, st.hp.n_embd);
    let n_seqs = st.rs_seqs.max(1);
    let nt = n / n_seqs;
    sc.bcx.resize(n * 3 * ne, 0.0);
    sc.bx.resize(n * ne, 0.0);
    sc.y.resize(n * ne, 0.0);
    {
        let b = &mut *st.b;
        Step::mm(st.pool, st.dev, in_proj, &b.cur, n, &mut sc.bcx, &mut b.mm_scratch, &mut b.lora)?;
    }
    for t in 0..n {
        let r = &sc.bcx[t * 3 * ne..(t + 1) * 3 * ne];
        for c in 0..ne {
            sc.bx[t * ne + c] = r[c] * r[2 * ne + c];
        }
    }
    let rs = st.rs.as_deref_mut().ok_or_else(|| Error::Invalid("internal: lfm2 without recurrent memory".into()))?;
    let nr = rs.n_embd_r;
    // rollback snapshots: the states 1..min(nt, n_rs_seq + 1) - 1 tokens back (lfm2.cpp)
    let snaps = 1..nt.min(rs.n_rs_seq + 1);
    for k in 0..n_seqs {
        let cell = rs.head + k;
        let bx = &sc.bx;
        let x = |t: usize| &bx[(k * nt + t) * ne..(k * nt + t + 1) * ne];
        if !snaps.is_empty() {
            ssm::conv_snapshots(&mut rs.r[il], rs.size, cell, snaps.clone(), &x, nt, lc, nr);
        }
        let state = &mut rs.r[il][cell * nr..(cell + 1) * nr];
        ssm::conv_seq(state, &x, nt, conv, lc, &mut sc.y[k * nt * ne..], ne, &mut sc.win);
    }
    for t in 0..n {
        let c = &sc.bcx[t * 3 * ne + ne..t * 3 * ne + 2 * ne];
        for (v, cc) in sc.y[t * ne..(t + 1) * ne].iter_mut().zip(c) {
            *v *= cc;
        }
    }
    let b = &mut *st.b;
    Step::mm(st.pool, st.dev, out_proj, &sc.y, n, &mut b.tmp, &mut b.mm_scratch, &mut b.lora)?;
    Ok(())
}

impl Forward for Lfm2Fwd {
    fn rope(&self, il: usize) -> Option<&RopeParams> {
        match &self.layers.get(il)?.mixer {
            Mixer::Attn { rope, .. } => Some(rope),
            Mixer::Conv { .. } => None,
        }
    }

    fn recurrent(&self) -> Option<(Vec<bool>, usize, usize)> {
        // llama.cpp's n_embd_r = n_embd * (l_cache - 1); n_embd_s = 0 (no scan state)
        Some((self.recr.clone(), self.output_norm.len() * (self.l_cache - 1), 0))
    }

    fn rs_rollback(&self) -> bool {
        true // llm_arch_supports_rs_rollback: lfm2, lfm2moe
    }

    fn forward(&self, st: &mut Step) -> Result<()> {
        let ne = st.hp.n_embd;
        let hd = st.hp.n_embd_head_k;
        let mut sc = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
        st.build_inp_embd(&self.tok_embd, 1.0)?;
        let nl = self.layers.len();
        for (il, l) in self.layers.iter().enumerate() {
            st.build_norm(&l.attn_norm, None, Norm::Rms, self.eps);
            match &l.mixer {
                Mixer::Conv { conv, in_proj, out_proj } => shortconv(st, il, conv, in_proj, out_proj, self.l_cache, &mut sc)?,
                Mixer::Attn { qkv, wo, q_norm, k_norm, rope, n_swa } => {
                    let w = AttnWeights { q_norm: Some(q_norm), k_norm: Some(k_norm), ..qkv.weights(wo, None) };
                    let a = AttnConfig {
                        il,
                        rope: Some(rope),
                        q_scale: 1.0,
                        kq_scale: 1.0 / (hd as f32).sqrt(),
                        softcap: 0.0,
                        n_swa: *n_swa,
                        attn_temp: None,
                        chunked: false,
                        qk_rms_after_rope: false,
                        sinks: None,
                    };
                    st.build_attn(&w, &a)?;
                }
            }
            if il == nl - 1 && !st.select_outputs() {
                return Ok(());
            }
            st.residual();
            st.build_norm(&l.ffn_norm, None, Norm::Rms, self.eps);
            match &l.ffn {
                Ffn::Dense { gate, up, down } => {
                    let f = FfnWeights { gate: Some(gate), gate_b: None, up, up_b: None, down, down_b: None };
                    st.build_ffn(il, &f, FfnAct::Silu, FfnGate::Par)?;
                }
                Ffn::Moe { router, gate, up, down, probs_b } => {
                    let c = self.moe.as_ref().ok_or_else(|| Error::Invalid("internal: lfm2 experts without routing".into()))?;
                    let m = MoeWeights {
                        router,
                        router_b: None,
                        gate: Some(gate),
                        up,
                        down,
                        gate_b: None,
                        up_b: None,
                        down_b: None,
                        probs_b: Some(probs_b),
                    };
                    st.build_moe_ffn(il, &m, c)?;
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
