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
//! the file says) attend within the window with plain rope (base rope.freq_base_swa, scale 1).

use super::graph::{layer_rope, AttnConfig, AttnWeights, FfnAct, FfnGate, FfnWeights, Norm};
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
        Ok(Box::new(Olmo2Forward::load(ld, cp)?))
    }
}

struct Layer {
    wq: TensorView<'static>,
    wk: TensorView<'static>,
    wv: TensorView<'static>,
    wo: TensorView<'static>,
    /// [n_head * hd] and [n_head_kv * hd]: whole-projection norms
    q_norm: Vec<f32>,
    k_norm: Vec<f32>,
    post_attn_norm: Vec<f32>,
    gate: TensorView<'static>,
    up: TensorView<'static>,
    down: TensorView<'static>,
    post_ffw_norm: Vec<f32>,
    rope: RopeParams,
    n_swa: usize,
}

struct Olmo2Forward {
    tok_embd: TensorView<'static>,
    output_norm: Vec<f32>,
    output: TensorView<'static>,
    layers: Vec<Layer>,
    eps: f32,
    /// Keeps the tensor bytes the views above borrow alive; must stay the last field.
    _keep: Keep,
}

impl Olmo2Forward {
    /// The schema (llama.cpp's load_arch_tensors for LLM_ARCH_OLMO2): every tensor required.
    fn load(ld: &Loader, cp: &ContextParams) -> Result<Olmo2Forward> {
        let hp = ld.hp();
        let (n_embd, n_vocab) = (hp.n_embd, hp.n_vocab);
        let mut layers = Vec::with_capacity(hp.n_layer);
        for il in 0..hp.n_layer {
            let b = |s: &str| format!("blk.{il}.{s}");
            let (n_q, n_k, n_v) = (hp.n_embd_head_k * hp.n_head(il), hp.n_embd_k_gqa(il), hp.n_embd_v_gqa(il));
            let n_ff = hp.n_ff[il];
            let swa = hp.swa_layers.get(il).copied().unwrap_or(false);
            layers.push(Layer {
                wq: ld.req(&b("attn_q.weight"), &[n_embd, n_q])?,
                wk: ld.req(&b("attn_k.weight"), &[n_embd, n_k])?,
                wv: ld.req(&b("attn_v.weight"), &[n_embd, n_v])?,
                wo: ld.req(&b("attn_output.weight"), &[hp.n_embd_head_v * hp.n_head(il), n_embd])?,
                q_norm: ld.req_vec(&b("attn_q_norm.weight"), &[n_q])?,
                k_norm: ld.req_vec(&b("attn_k_norm.weight"), &[n_k])?,
                post_attn_norm: ld.req_vec(&b("post_attention_norm.weight"), &[n_embd])?,
                gate: ld.req(&b("ffn_gate.weight"), &[n_embd, n_ff])?,
                up: ld.req(&b("ffn_up.weight"), &[n_embd, n_ff])?,
                down: ld.req(&b("ffn_down.weight"), &[n_ff, n_embd])?,
                post_ffw_norm: ld.req_vec(&b("post_ffw_norm.weight"), &[n_embd])?,
                // sliding-window layers: plain rope, no YaRN (olmo2.cpp: freq_scale 1,
                // ext_factor 0, attn_factor 1)
                rope: if swa {
                    RopeParams::simple(hp.rope_type, hp.n_rot, hp.rope_freq_base_swa, 1.0)
                } else {
                    layer_rope(hp, cp, il, None)
                },
                n_swa: if swa { hp.n_swa } else { 0 },
            });
        }
        Ok(Olmo2Forward {
            tok_embd: ld.req("token_embd.weight", &[n_embd, n_vocab])?,
            output_norm: ld.req_vec("output_norm.weight", &[n_embd])?,
            output: ld.req("output.weight", &[n_embd, n_vocab])?,
            layers,
            eps: hp.f_norm_rms_eps,
            _keep: ld.keep(),
        })
    }
}

impl Forward for Olmo2Forward {
    fn rope(&self, il: usize) -> Option<&RopeParams> {
        self.layers.get(il).map(|l| &l.rope)
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
            let w = AttnWeights {
                wq: &l.wq,
                wk: &l.wk,
                wv: &l.wv,
                wo: &l.wo,
                bq: None,
                bk: None,
                bv: None,
                bo: None,
                q_norm: Some(&l.q_norm),
                k_norm: Some(&l.k_norm),
                fused_qkv: false,
            };
            let a = AttnConfig {
                il,
                rope: Some(&l.rope),
                q_scale: 1.0,
                kq_scale: 1.0 / (hd as f32).sqrt(),
                softcap: 0.0,
                n_swa: l.n_swa,
                attn_temp: None,
            };
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
