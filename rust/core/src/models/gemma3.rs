//! Gemma 3: sqrt(n_embd)-scaled embeddings, pre+post norms around attention and FFN,
//! per-head Q/K RMSNorm, NEOX rope (10000 on sliding-window layers, the file's base on
//! global ones), 5 local : 1 global layers, GELU(tanh)-gated FFN. See llama.cpp's
//! src/models/gemma3.cpp.

use super::{common_hparams, Arch, TensorSpec};
use crate::context::{ContextParams, Forward};
use crate::error::Result;
use crate::model::Model;
use std::sync::Arc;
use crate::hparams::{HParams, Meta, RopeType};

pub struct Gemma3;

impl Arch for Gemma3 {
    fn name(&self) -> &'static str {
        "gemma3"
    }

    fn hparams(&self, meta: &Meta, n_vocab: usize) -> Result<HParams> {
        let mut hp = common_hparams(meta, n_vocab, RopeType::Neox)?;
        // llama.cpp: set_swa_pattern(6) -> layers il % 6 < 5 use the sliding window.
        hp.n_swa = meta.u("attention.sliding_window")?.unwrap_or(0);
        let pattern = meta.u("attention.sliding_window_pattern")?.unwrap_or(6).max(1);
        hp.swa_layers = (0..hp.n_layer).map(|il| hp.n_swa > 0 && il % pattern < pattern - 1).collect();
        hp.rope_freq_base_swa = meta.f("rope.freq_base_swa")?.unwrap_or(10000.0);
        hp.rope_freq_scale_swa = 1.0;
        // Only the 27B model scales by n_embd/n_head; every other size by the key length.
        hp.f_attention_scale = if hp.n_layer == 62 {
            1.0 / ((hp.n_embd / hp.n_head(0)) as f32).sqrt()
        } else {
            1.0 / (hp.n_embd_head_k as f32).sqrt()
        };
        Ok(hp)
    }

    /// src/models/gemma3.cpp load_arch_hparams.
    fn type_name(&self, hp: &HParams) -> &'static str {
        match hp.n_layer {
            18 => "270M",
            26 => "1B",
            32 => "8B",
            34 => "4B",
            48 => "12B",
            62 => "27B",
            _ => "?B",
        }
    }

    fn tensors(&self, hp: &HParams) -> Vec<TensorSpec> {
        let (n_embd, n_vocab) = (hp.n_embd, hp.n_vocab);
        let mut v = vec![
            TensorSpec::req("token_embd.weight", &[n_embd, n_vocab]),
            TensorSpec::req("output_norm.weight", &[n_embd]),
            TensorSpec::tied("output.weight", &[n_embd, n_vocab], "token_embd.weight"),
        ];
        for il in 0..hp.n_layer {
            let n_q = hp.n_embd_head_k * hp.n_head(il);
            let n_ff = hp.n_ff[il];
            let b = |s: &str| format!("blk.{il}.{s}");
            v.extend([
                TensorSpec::req(b("attn_norm.weight"), &[n_embd]),
                TensorSpec::req(b("attn_q.weight"), &[n_embd, n_q]),
                TensorSpec::req(b("attn_k.weight"), &[n_embd, hp.n_embd_k_gqa(il)]),
                TensorSpec::req(b("attn_v.weight"), &[n_embd, hp.n_embd_v_gqa(il)]),
                TensorSpec::req(b("attn_output.weight"), &[hp.n_embd_head_v * hp.n_head(il), n_embd]),
                TensorSpec::req(b("attn_q_norm.weight"), &[hp.n_embd_head_k]),
                TensorSpec::req(b("attn_k_norm.weight"), &[hp.n_embd_head_k]),
                TensorSpec::req(b("post_attention_norm.weight"), &[n_embd]),
                TensorSpec::req(b("ffn_norm.weight"), &[n_embd]),
                TensorSpec::req(b("ffn_gate.weight"), &[n_embd, n_ff]),
                TensorSpec::req(b("ffn_up.weight"), &[n_embd, n_ff]),
                TensorSpec::req(b("ffn_down.weight"), &[n_ff, n_embd]),
                TensorSpec::req(b("post_ffw_norm.weight"), &[n_embd]),
            ]);
        }
        v
    }

    fn build_forward(&self, model: &Arc<Model>, cp: &ContextParams) -> Result<Box<dyn Forward>> {
        Ok(Box::new(Gemma3Forward::new(model, cp)?))
    }
}

// ---- forward pass ------------------------------------------------------------------
//
// x = embd(tokens) * sqrt(n_embd)                                   [n, n_embd]
// per layer: cur = rmsnorm(x) * attn_norm
//            q, k = rmsnorm per head (q_norm, k_norm); NEOX rope (base 10000 on
//            sliding-window layers, the file's on global ones); q *= f_attention_scale
//            att  = attention (window n_swa on local layers), wo
//            x   += rmsnorm(att) * post_attention_norm
//            cur  = rmsnorm(x) * ffn_norm
//            x   += rmsnorm(down(gelu_tanh(gate cur) * up cur)) * post_ffw_norm
// logits = output . (rmsnorm(x) * output_norm)  [+ final softcap when the file has one]

use crate::context::{layer_rope, vector, weight, weight_opt, AttnConfig, AttnWeights, FfnAct, Step};
use crate::model::TensorView;
use crate::ops::rope::RopeParams;

struct Gemma3Layer {
    attn_norm: Vec<f32>,
    wq: TensorView<'static>,
    wk: TensorView<'static>,
    wv: TensorView<'static>,
    wo: TensorView<'static>,
    q_norm: Vec<f32>,
    k_norm: Vec<f32>,
    post_attn_norm: Vec<f32>,
    ffn_norm: Vec<f32>,
    gate: TensorView<'static>,
    up: TensorView<'static>,
    down: TensorView<'static>,
    post_ffw_norm: Vec<f32>,
    rope: RopeParams,
    n_swa: usize,
}

pub struct Gemma3Forward {
    tok_embd: TensorView<'static>,
    output_norm: Vec<f32>,
    output: TensorView<'static>,
    layers: Vec<Gemma3Layer>,
    eps: f32,
    attn_scale: f32,
    final_softcap: f32,
    /// Keeps the tensor bytes the views above borrow alive; must stay the last field.
    _model: Arc<Model>,
}

impl Gemma3Forward {
    pub fn new(model: &Arc<Model>, cp: &ContextParams) -> Result<Gemma3Forward> {
        let hp = &model.hparams;
        let mut layers = Vec::with_capacity(hp.n_layer);
        for il in 0..hp.n_layer {
            let b = |s: &str| format!("blk.{il}.{s}");
            layers.push(Gemma3Layer {
                attn_norm: vector(model, &b("attn_norm.weight"))?,
                wq: weight(model, &b("attn_q.weight"))?,
                wk: weight(model, &b("attn_k.weight"))?,
                wv: weight(model, &b("attn_v.weight"))?,
                wo: weight(model, &b("attn_output.weight"))?,
                q_norm: vector(model, &b("attn_q_norm.weight"))?,
                k_norm: vector(model, &b("attn_k_norm.weight"))?,
                post_attn_norm: vector(model, &b("post_attention_norm.weight"))?,
                ffn_norm: vector(model, &b("ffn_norm.weight"))?,
                gate: weight(model, &b("ffn_gate.weight"))?,
                up: weight(model, &b("ffn_up.weight"))?,
                down: weight(model, &b("ffn_down.weight"))?,
                post_ffw_norm: vector(model, &b("post_ffw_norm.weight"))?,
                rope: layer_rope(hp, cp, il, None),
                n_swa: if hp.swa_layers.get(il).copied().unwrap_or(false) { hp.n_swa } else { 0 },
            });
        }
        let tok_embd = weight(model, "token_embd.weight")?;
        Ok(Gemma3Forward {
            tok_embd,
            output_norm: vector(model, "output_norm.weight")?,
            output: weight_opt(model, "output.weight")?.unwrap_or(tok_embd),
            layers,
            eps: hp.f_norm_rms_eps,
            attn_scale: hp.f_attention_scale,
            final_softcap: hp.f_final_logit_softcapping,
            _model: model.clone(),
        })
    }
}

impl Forward for Gemma3Forward {
    fn rope(&self, il: usize) -> Option<&RopeParams> {
        self.layers.get(il).map(|l| &l.rope)
    }

    fn forward(&self, st: &mut Step) -> Result<()> {
        let ne = st.hp.n_embd;
        let n_layer = self.layers.len();
        // raw embeddings (e.g. from a vision encoder) are not scaled, as in llama.cpp
        st.embed(&self.tok_embd, if st.tokens.is_some() { (ne as f32).sqrt() } else { 1.0 })?;
        crate::cb!(st, "inp_scaled", -1, x, ne);
        for (il, l) in self.layers.iter().enumerate() {
            st.norm_x_to_cur(&l.attn_norm, self.eps);
            crate::cb!(st, "attn_norm", il, cur, ne);
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
            let c = AttnConfig { il, rope: Some(&l.rope), q_scale: self.attn_scale, kq_scale: 1.0, softcap: 0.0, n_swa: l.n_swa };
            st.attn_block(&w, &c)?;
            if il == n_layer - 1 && !st.select_outputs() {
                return Ok(());
            }
            st.norm_tmp(&l.post_attn_norm, self.eps);
            crate::cb!(st, "attn_post_norm", il, tmp, ne);
            st.residual();
            crate::cb!(st, "sa_out", il, x, ne);
            st.norm_x_to_cur(&l.ffn_norm, self.eps);
            crate::cb!(st, "ffn_norm", il, cur, ne);
            st.ffn(il, &l.gate, &l.up, &l.down, FfnAct::GeGlu)?;
            crate::cb!(st, "ffn_out", il, tmp, ne);
            st.norm_tmp(&l.post_ffw_norm, self.eps);
            crate::cb!(st, "ffn_post_norm", il, tmp, ne);
            st.residual();
            crate::cb!(st, "l_out", il, x, ne);
        }
        st.output(&self.output_norm, self.eps, &self.output, self.final_softcap)
    }
}
