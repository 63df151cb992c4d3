//! Granite 4.0 hybrid (llama.cpp's src/models/granite-hybrid.cpp): Mamba-2 layers (those
//! with `attention.head_count_kv` 0) and attention layers, each followed by a feed-forward
//! (SwiGLU with optional biases, or softmax-routed experts plus an optional ungated shared
//! expert), with Granite's scales: embeddings times `embedding_scale`, each block's output
//! times `residual_scale` before its residual add, `attention.scale` as the softmax scale,
//! logits divided by `logit_scale` (each only when the file sets it); NORM rope unless
//! `rope.scaling.finetuned` is false (optional `rope_freqs`); optional q/k/v and output
//! biases. The Mamba-2 mixer is mamba2.rs's (its inner size must be 2 * n_embd, as
//! llama.cpp asserts).

use super::graph::{default_kq_scale, layer_rope, AttnConfig, AttnLayer, FfnAct, FfnGate, FfnLayer, FfnWeights, MoeConfig, MoeWeights, Norm};
use super::loader::{Keep, Loader};
use super::mamba2::{mamba2_mixer, SsmLayer, SsmParams, SsmScratch};
use super::{common_hparams_ext, Arch};
use crate::context::{ContextParams, Forward, Step};
use crate::error::{Error, Result};
use crate::hparams::{HParams, Meta, RopeType};
use crate::model::TensorView;
use crate::ops::act;
use crate::ops::rope::RopeParams;
use std::sync::Mutex;

pub struct GraniteHybrid;

struct Scales {
    embedding: f32,
    residual: f32,
    logit: f32,
    rope: bool,
    n_ff_shexp: usize,
}

fn scales(meta: &Meta) -> Result<Scales> {
    let rope = match meta.get("rope.scaling.finetuned") {
        None => true,
        Some(v) => v.as_bool().ok_or_else(|| {
            Error::Unsupported(format!("{}: '{}' must be a bool", meta.file.path, meta.key("rope.scaling.finetuned")))
        })?,
    };
    let n_ff_shexp = meta.u("expert_shared_feed_forward_length")?.unwrap_or(0);
    if n_ff_shexp > crate::hparams::MAX_DIM {
        return Err(Error::Unsupported(format!("{}: '{}' is too large", meta.file.path, meta.key("expert_shared_feed_forward_length"))));
    }
    Ok(Scales {
        embedding: meta.f("embedding_scale")?.unwrap_or(0.0),
        residual: meta.f("residual_scale")?.unwrap_or(0.0),
        logit: meta.f("logit_scale")?.unwrap_or(0.0),
        rope,
        n_ff_shexp,
    })
}

impl Arch for GraniteHybrid {
    fn name(&self) -> &'static str {
        "granitehybrid"
    }

    fn moe_for(&self, hp: &HParams) -> bool {
        hp.n_expert > 0
    }

    fn hparams(&self, meta: &Meta, n_vocab: usize) -> Result<HParams> {
        let sp = SsmParams::read(meta, true)?;
        let mut hp = common_hparams_ext(meta, n_vocab, RopeType::Norm, true)?;
        if sp.d_inner != 2 * hp.n_embd {
            return Err(Error::Unsupported(format!(
                "{}: ssm.inner_size {} must be 2 x embedding_length {} (llama.cpp supports only that expansion)",
                meta.file.path, sp.d_inner, hp.n_embd
            )));
        }
        if hp.n_head_kv.iter().all(|&k| k == 0) && hp.n_head.iter().all(|&h| h == 0) {
            hp.n_embd_head_k = hp.n_embd_head_k.max(1);
            hp.n_embd_head_v = hp.n_embd_head_v.max(1);
        }
        hp.f_attention_scale = meta.f("attention.scale")?.unwrap_or(0.0);
        let s = scales(meta)?;
        for f in hp.n_ff.iter_mut() {
            *f = (*f).max(s.n_ff_shexp);
        }
        Ok(hp)
    }

    fn type_name(&self, hp: &HParams) -> &'static str {
        match hp.n_embd {
            768 => "350M",
            1536 => "1B",
            2048 | 2560 => "3B",
            4096 => "32B.A9B",
            _ => "?B",
        }
    }

    fn build_forward(&self, ld: &Loader, cp: &ContextParams) -> Result<Box<dyn Forward>> {
        let hp = ld.hp();
        let meta = Meta { file: &ld.model().files[0], arch: self.name() };
        let sp = SsmParams::read(&meta, true)?;
        let s = scales(&meta)?;
        let (ne, nv) = (hp.n_embd, hp.n_vocab);
        let tok_embd = ld.req("token_embd.weight", &[ne, nv])?;
        let output = ld.opt("output.weight", &[ne, nv])?.unwrap_or(tok_embd);
        let factors = ld.opt_vec("rope_freqs.weight", &[hp.n_rot / 2])?;
        // the file's feed_forward_length (hparams widened n_ff for the shared expert's scratch)
        let n_ff = meta.per_layer("feed_forward_length", hp.n_layer, Some(0))?;
        let recr: Vec<bool> = (0..hp.n_layer).map(|il| hp.n_head_kv(il) == 0).collect();
        let mut layers = Vec::with_capacity(hp.n_layer);
        for il in 0..hp.n_layer {
            let b = |x: &str| format!("blk.{il}.{x}");
            let nf = n_ff[il];
            let mixer = if recr[il] {
                Mixer::Ssm(SsmLayer::load(ld, il, &sp, true)?)
            } else {
                Mixer::Attn {
                    attn_norm: ld.req_vec(&b("attn_norm.weight"), &[ne])?,
                    attn: AttnLayer::load(ld, il)?,
                    rope: if s.rope { Some(layer_rope(hp, cp, il, factors.clone())) } else { None },
                }
            };
            let ffn = if hp.n_expert > 0 {
                let nx = hp.n_expert;
                let fs = s.n_ff_shexp;
                Ffn::Moe {
                    router: ld.req(&b("ffn_gate_inp.weight"), &[ne, nx])?,
                    gate: ld.req(&b("ffn_gate_exps.weight"), &[ne, nf, nx])?,
                    up: ld.req(&b("ffn_up_exps.weight"), &[ne, nf, nx])?,
                    down: ld.req(&b("ffn_down_exps.weight"), &[nf, ne, nx])?,
                    shared: if fs > 0 {
                        Some((
                            ld.req(&b("ffn_gate_shexp.weight"), &[ne, fs])?,
                            ld.req(&b("ffn_up_shexp.weight"), &[ne, fs])?,
                            ld.req(&b("ffn_down_shexp.weight"), &[fs, ne])?,
                        ))
                    } else {
                        None
                    },
                }
            } else {
                Ffn::Dense(FfnLayer::load(ld, il, nf)?)
            };
            layers.push(Layer { mixer, ffn_norm: ld.req_vec(&b("ffn_norm.weight"), &[ne])?, ffn });
        }
        Ok(Box::new(GraniteHybridFwd {
            tok_embd,
            output_norm: ld.req_vec("output_norm.weight", &[ne])?,
            output,
            layers,
            recr,
            sp,
            eps: hp.f_norm_rms_eps,
            embedding: s.embedding,
            residual: s.residual,
            logit: s.logit,
            n_expert_used: hp.n_expert_used,
            scratch: Mutex::new((Vec::new(), SsmScratch::default())),
            _keep: ld.keep(),
        }))
    }
}

enum Mixer {
    Ssm(SsmLayer),
    Attn {
        attn_norm: Vec<f32>,
        attn: AttnLayer,
        rope: Option<RopeParams>,
    },
}

enum Ffn {
    Dense(FfnLayer),
    Moe {
        router: TensorView<'static>,
        gate: TensorView<'static>,
        up: TensorView<'static>,
        down: TensorView<'static>,
        shared: Option<(TensorView<'static>, TensorView<'static>, TensorView<'static>)>,
    },
}

struct Layer {
    mixer: Mixer,
    ffn_norm: Vec<f32>,
    ffn: Ffn,
}

struct GraniteHybridFwd {
    tok_embd: TensorView<'static>,
    output_norm: Vec<f32>,
    output: TensorView<'static>,
    layers: Vec<Layer>,
    recr: Vec<bool>,
    sp: SsmParams,
    eps: f32,
    embedding: f32,
    residual: f32,
    logit: f32,
    n_expert_used: usize,
    /// The shared expert's output, and the mixer's scratch.
    scratch: Mutex<(Vec<f32>, SsmScratch)>,
    _keep: Keep,
}

impl Forward for GraniteHybridFwd {
    fn rope(&self, il: usize) -> Option<&RopeParams> {
        match &self.layers.get(il)?.mixer {
            Mixer::Attn { rope, .. } => rope.as_ref(),
            Mixer::Ssm(_) => None,
        }
    }

    fn recurrent(&self) -> Option<(Vec<bool>, usize, usize)> {
        Some((self.recr.clone(), self.sp.n_embd_r(), self.sp.n_embd_s()))
    }

    fn forward(&self, st: &mut Step) -> Result<()> {
        let ne = st.hp.n_embd;
        let mut guard = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
        let (shexp, sc) = &mut *guard;
        st.build_inp_embd(&self.tok_embd, 1.0)?;
        // llama.cpp's build_inp_embd: token rows and given embeddings alike
        if self.embedding != 0.0 {
            let m = st.n * ne;
            act::scale(&mut st.b.x[..m], self.embedding);
        }
        let nl = self.layers.len();
        for (il, l) in self.layers.iter().enumerate() {
            match &l.mixer {
                Mixer::Ssm(ssm) => {
                    st.build_norm(&ssm.attn_norm, None, Norm::Rms, self.eps);
                    mamba2_mixer(st, il, ssm, &self.sp, self.eps, sc)?;
                }
                Mixer::Attn { attn_norm, attn, rope } => {
                    st.build_norm(attn_norm, None, Norm::Rms, self.eps);
                    st.build_attn(&attn.weights(), &AttnConfig::new(il, rope.as_ref(), default_kq_scale(st.hp)))?;
                }
            }
            if il == nl - 1 && !st.select_outputs() {
                return Ok(());
            }
            let n = st.n;
            if self.residual != 0.0 {
                act::scale(&mut st.b.tmp[..n * ne], self.residual);
            }
            st.residual();
            st.build_norm(&l.ffn_norm, None, Norm::Rms, self.eps);
            match &l.ffn {
                Ffn::Dense(f) => st.build_ffn(il, &f.weights(), FfnAct::Silu, FfnGate::Par)?,
                Ffn::Moe { router, gate, up, down, shared } => {
                    if let Some((g, u, d)) = shared {
                        let f = FfnWeights { gate: Some(g), gate_b: None, up: u, up_b: None, down: d, down_b: None };
                        st.build_ffn(il, &f, FfnAct::Silu, FfnGate::Par)?;
                        shexp.resize(n * ne, 0.0);
                        shexp.copy_from_slice(&st.b.tmp[..n * ne]);
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
                    if shared.is_some() {
                        for (o, s) in st.b.tmp[..n * ne].iter_mut().zip(shexp.iter()) {
                            *o += s;
                        }
                    }
                }
            }
            if self.residual != 0.0 {
                act::scale(&mut st.b.tmp[..n * ne], self.residual);
            }
            st.residual();
            st.build_cvec(il);
            crate::cb!(st, "l_out", il, x, ne);
        }
        st.build_norm(&self.output_norm, None, Norm::Rms, self.eps);
        st.build_output(&self.output, None, 0.0)?;
        if self.logit != 0.0 {
            let nv = self.output.n_rows();
            let s = 1.0 / self.logit;
            for &r in st.b.out_row.iter().take(st.n) {
                act::scale(&mut st.logits[r * nv..(r + 1) * nv], s);
            }
        }
        Ok(())
    }
}
