//! OLMo 2 (and OLMo 3's sliding-window variant): no norm before attention or the FFN; RMS
//! norms after each block instead, q/k RMS-normed over the whole projection (not per head)
//! before NEOX rope, SwiGLU, `output.weight` required. See llama.cpp's src/models/olmo2.cpp:
//!
//!   q, k, v = wq x, wk x, wv x                       q [n, n_head * hd], k/v [n, n_head_kv * hd]
//!   q = rmsnorm(q) * attn_q_norm ; k = rmsnorm(k) * attn_k_norm   (over n_head(_kv) * hd)
//!   x = x + rmsnorm(wo attention(rope(q), rope(k), v)) * post_attention_norm
//!   x = x + rmsnorm(down(silu(gate x) * up x)) * post_ffw_norm
//!   logits = output (rmsnorm(x) * output_norm)
//!
//! With `attention.sliding_window` > 0, layers il % pattern < pattern - 1 (pattern 4 unless
//! the file says) attend within the window with plain rope (the context's base, scale 1, no
//! YaRN: olmo2.cpp reads rope.freq_base_swa but its graph does not use it).
//!
//! `PostNormForward` is also EXAONE 4's forward pass (exaone4.rs), configured by `PostNorm`.

use super::graph::{layer_rope, AttnConfig, AttnWeights, FfnAct, FfnGate, FfnWeights, Norm, Qkv};
use super::loader::{Keep, Loader};
use super::{common_hparams, Arch};
use crate::context::{ContextParams, Forward, Step};
use crate::error::Result;
use crate::hparams::{HParams, Meta, RopeType};
use crate::model::TensorView;
use crate::ops::rope::RopeParams;

pub struct Olmo2;

impl Arch for Olmo2 {
    fn name(&self) -> &'static str {
        "olmo2"
    }

    fn hparams(&self, meta: &Meta, n_vocab: usize) -> Result<HParams> {
        let mut hp = common_hparams(meta, n_vocab, RopeType::Neox)?;
        hp.n_swa = meta.u("attention.sliding_window")?.unwrap_or(0);
        if hp.n_swa > 0 {
            // llama.cpp: load_swa_pattern(ml, 4); rope_freq_scale_train_swa = 1
            let pattern = meta.u("attention.sliding_window_pattern")?.unwrap_or(4).max(1);
            hp.swa_layers = (0..hp.n_layer).map(|il| il % pattern < pattern - 1).collect();
            hp.rope_freq_base_swa = meta.f("rope.freq_base_swa")?.unwrap_or(hp.rope_freq_base);
            hp.rope_freq_scale_swa = 1.0;
        }
        Ok(hp)
    }

    fn type_name(&self, hp: &HParams) -> &'static str {
        match hp.n_layer {
            16 => "1B",
            32 => "7B",
            40 => "13B",
            64 => "32B",
            _ => "?B",
        }
    }

    fn build_forward(&self, ld: &Loader, cp: &ContextParams) -> Result<Box<dyn Forward>> {
        Ok(Box::new(PostNormForward::load(ld, cp, PostNorm::OLMO2)?))
    }
}

/// How a post-norm decoder's schema and rope differ between olmo2 and exaone4.
#[derive(Clone, Copy)]
pub(super) struct PostNorm {
    /// q/k norm weights per head [hd] (exaone4) instead of over the projection (olmo2).
    pub qk_norm_per_head: bool,
    /// `output.weight` may be absent (tied to token_embd).
    pub output_opt: bool,
    /// Optional `rope_freqs.weight`.
    pub rope_freqs: bool,
    /// In a model with sliding-window layers, rope only on those (exaone4) instead of
    /// everywhere with plain rope on the sliding ones (olmo2).
    pub rope_swa_only: bool,
}

impl PostNorm {
    pub const OLMO2: PostNorm =
        PostNorm { qk_norm_per_head: false, output_opt: false, rope_freqs: false, rope_swa_only: false };
}

struct Layer {
    qkv: Qkv,
    wo: TensorView<'static>,
    /// [n_head * hd] and [n_head_kv * hd]: whole-projection norms
    q_norm: Vec<f32>,
    k_norm: Vec<f32>,
    post_attn_norm: Vec<f32>,
    gate: TensorView<'static>,
    up: TensorView<'static>,
    down: TensorView<'static>,
    post_ffw_norm: Vec<f32>,
    /// None: no rope on this layer
    rope: Option<RopeParams>,
    n_swa: usize,
}

pub(super) struct PostNormForward {
    tok_embd: TensorView<'static>,
    output_norm: Vec<f32>,
    output: TensorView<'static>,
    layers: Vec<Layer>,
    eps: f32,
    /// Keeps the tensor bytes the views above borrow alive; must stay the last field.
    _keep: Keep,
}

impl PostNormForward {
    /// The schema (llama.cpp's load_arch_tensors for LLM_ARCH_OLMO2 / LLM_ARCH_EXAONE4).
    pub(super) fn load(ld: &Loader, cp: &ContextParams, o: PostNorm) -> Result<PostNormForward> {
        let hp = ld.hp();
        let (n_embd, n_vocab) = (hp.n_embd, hp.n_vocab);
        let factors = if o.rope_freqs { ld.opt_vec("rope_freqs.weight", &[hp.n_rot / 2])? } else { None };
        let has_swa = hp.swa_layers.iter().any(|&s| s);
        // the graphs rope every layer with the context's base and scale (not the _swa ones)
        let mut hp_rope = hp.clone();
        hp_rope.swa_layers = vec![false; hp.n_layer];
        let mut layers = Vec::with_capacity(hp.n_layer);
        for il in 0..hp.n_layer {
            let b = |s: &str| format!("blk.{il}.{s}");
            let (n_q, n_k, n_v) = (hp.n_embd_head_k * hp.n_head(il), hp.n_embd_k_gqa(il), hp.n_embd_v_gqa(il));
            let n_ff = hp.n_ff[il];
            let swa = hp.swa_layers.get(il).copied().unwrap_or(false);
            layers.push(Layer {
                qkv: Qkv::load(ld, il, n_embd, n_q, n_k, n_v)?,
                wo: ld.req(&b("attn_output.weight"), &[hp.n_embd_head_v * hp.n_head(il), n_embd])?,
                q_norm: ld.req_vec(&b("attn_q_norm.weight"), &[if o.qk_norm_per_head { hp.n_embd_head_k } else { n_q }])?,
                k_norm: ld.req_vec(&b("attn_k_norm.weight"), &[if o.qk_norm_per_head { hp.n_embd_head_k } else { n_k }])?,
                post_attn_norm: ld.req_vec(&b("post_attention_norm.weight"), &[n_embd])?,
                gate: ld.req(&b("ffn_gate.weight"), &[n_embd, n_ff])?,
                up: ld.req(&b("ffn_up.weight"), &[n_embd, n_ff])?,
                down: ld.req(&b("ffn_down.weight"), &[n_ff, n_embd])?,
                post_ffw_norm: ld.req_vec(&b("post_ffw_norm.weight"), &[n_embd])?,
                rope: if o.rope_swa_only && has_swa && !swa {
                    None // exaone4: full-attention layers of a sliding-window model have no rope
                } else if swa && !o.rope_swa_only {
                    // olmo2's sliding-window layers: plain rope, no YaRN (freq_scale 1,
                    // ext_factor 0, attn_factor 1)
                    let base = if cp.rope_freq_base != 0.0 { cp.rope_freq_base } else { hp.rope_freq_base };
                    Some(RopeParams::simple(hp.rope_type, hp.n_rot, base, 1.0))
                } else {
                    Some(layer_rope(&hp_rope, cp, il, factors.clone()))
                },
                n_swa: if swa { hp.n_swa } else { 0 },
            });
        }
        let tok_embd = ld.req("token_embd.weight", &[n_embd, n_vocab])?;
        let output = if o.output_opt {
            ld.opt("output.weight", &[n_embd, n_vocab])?.unwrap_or(tok_embd)
        } else {
            ld.req("output.weight", &[n_embd, n_vocab])?
        };
        Ok(PostNormForward {
            tok_embd,
            output_norm: ld.req_vec("output_norm.weight", &[n_embd])?,
            output,
            layers,
            eps: hp.f_norm_rms_eps,
            _keep: ld.keep(),
        })
    }
}

impl Forward for PostNormForward {
    fn rope(&self, il: usize) -> Option<&RopeParams> {
        self.layers.get(il).and_then(|l| l.rope.as_ref())
    }

    fn forward(&self, st: &mut Step) -> Result<()> {
        let ne = st.hp.n_embd;
        let hd = st.hp.n_embd_head_k;
        let n_layer = self.layers.len();
        st.build_inp_embd(&self.tok_embd, 1.0)?;
        crate::cb!(st, "inp_embd", -1, x, ne);
        for (il, l) in self.layers.iter().enumerate() {
            // no pre-norm: attention reads the residual stream itself
            let m = st.n * ne;
            {
                let b = &mut *st.b;
                b.cur[..m].copy_from_slice(&b.x[..m]);
            }
            let w = AttnWeights { q_norm: Some(&l.q_norm), k_norm: Some(&l.k_norm), ..l.qkv.weights(&l.wo, None) };
            let a = AttnConfig { n_swa: l.n_swa, ..AttnConfig::new(il, l.rope.as_ref(), 1.0 / (hd as f32).sqrt()) };
            st.build_attn(&w, &a)?;
            if il == n_layer - 1 && !st.select_outputs() {
                return Ok(());
            }
            st.build_post_norm(&l.post_attn_norm, self.eps);
            crate::cb!(st, "attn_post_norm", il, tmp, ne);
            st.residual();
            crate::cb!(st, "ffn_inp", il, x, ne);
            let m = st.n * ne;
            {
                let b = &mut *st.b;
                b.cur[..m].copy_from_slice(&b.x[..m]);
            }
            let f = FfnWeights { gate: Some(&l.gate), gate_b: None, up: &l.up, up_b: None, down: &l.down, down_b: None };
            st.build_ffn(il, &f, FfnAct::Silu, FfnGate::Par)?;
            crate::cb!(st, "ffn_out", il, tmp, ne);
            st.build_post_norm(&l.post_ffw_norm, self.eps);
            crate::cb!(st, "ffn_post_norm", il, tmp, ne);
            st.residual();
            st.build_cvec(il);
            crate::cb!(st, "l_out", il, x, ne);
        }
        st.build_norm(&self.output_norm, None, Norm::Rms, self.eps);
        st.build_output(&self.output, None, 0.0)
    }
}
