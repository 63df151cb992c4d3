//! The pre-norm decoder the GGUF architectures share, configured per architecture in
//! models/<arch>.rs (llama, gemma3, qwen2, qwen3, gemma, gemma2, phi3, mistral3):
//!
//! x = embd(tokens) [* sqrt(n_embd)]                                  [n, n_embd]
//! per layer: cur = rmsnorm(x) * attn_norm
//!            q, k, v = wq cur [+ bq], wk cur [+ bk], wv cur [+ bv]
//!            [q, k = per-head rmsnorm]; rope; [q *= q_scale]
//!            att = attention(q, K, V; kq_scale, softcap, window) ; tmp = wo att
//!            [tmp = rmsnorm(tmp) * post_attention_norm]; x += tmp
//!            cur = rmsnorm(x) * ffn_norm ; tmp = down(act(gate cur) * up cur)
//!            [tmp = rmsnorm(tmp) * post_ffw_norm]; x += tmp
//! logits = output . (rmsnorm(x) * output_norm) [+ output.bias] [final softcap]

use crate::context::{
    layer_rope, vector, vector_opt, weight, weight_opt, AttnConfig, AttnWeights, ContextParams, FfnAct, Forward, MoeWeights,
    Step,
};
use crate::error::Result;
use crate::model::{Model, TensorView};
use crate::ops::rope::RopeParams;
use std::sync::Arc;

#[derive(Clone, Copy)]
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
    /// phi3: one `attn_qkv` matrix (and bias) and one `ffn_up` of 2 * n_ff rows holding
    /// gate and up.
    pub fused: bool,
    /// Attention temperature (scale, floor length) for mistral3; None elsewhere.
    pub attn_temp: Option<(f32, usize)>,
}

/// A layer's feed-forward: dense (gate may be absent: phi3's fused up) or a mixture of
/// experts (a layer with `ffn_gate_inp`, as qwen3moe's).
enum Ffn {
    Dense { gate: Option<TensorView<'static>>, up: TensorView<'static>, down: TensorView<'static> },
    Moe { router: TensorView<'static>, gate: TensorView<'static>, up: TensorView<'static>, down: TensorView<'static> },
}

struct Layer {
    attn_norm: Vec<f32>,
    wq: TensorView<'static>,
    wk: TensorView<'static>,
    wv: TensorView<'static>,
    wo: TensorView<'static>,
    bq: Option<Vec<f32>>,
    bk: Option<Vec<f32>>,
    bv: Option<Vec<f32>>,
    bo: Option<Vec<f32>>,
    q_norm: Option<Vec<f32>>,
    k_norm: Option<Vec<f32>>,
    post_attn_norm: Option<Vec<f32>>,
    ffn_norm: Vec<f32>,
    ffn: Ffn,
    post_ffw_norm: Option<Vec<f32>>,
    rope: RopeParams,
    n_swa: usize,
}

pub struct Decoder {
    cfg: DecoderConfig,
    tok_embd: TensorView<'static>,
    output_norm: Vec<f32>,
    output: TensorView<'static>,
    output_bias: Option<Vec<f32>>,
    layers: Vec<Layer>,
    eps: f32,
    /// Experts used per token in MoE layers (hparams `expert_used_count`).
    n_expert_used: usize,
    /// Keeps the tensor bytes the views above borrow alive; must stay the last field.
    _model: Arc<Model>,
}

impl Decoder {
    pub fn new(model: &Arc<Model>, cp: &ContextParams, cfg: DecoderConfig) -> Result<Decoder> {
        let hp = &model.hparams;
        let factors = vector_opt(model, "rope_freqs.weight")?;
        let mut layers = Vec::with_capacity(hp.n_layer);
        for il in 0..hp.n_layer {
            let b = |s: &str| format!("blk.{il}.{s}");
            let req_if = |on: bool, s: &str| -> Result<Option<Vec<f32>>> {
                if on {
                    vector(model, &b(s)).map(Some)
                } else {
                    Ok(None)
                }
            };
            let (wq, wk, wv, bq, bk, bv) = if cfg.fused {
                let w = weight(model, &b("attn_qkv.weight"))?;
                let (nq, nk) = (hp.n_embd_head_k * hp.n_head(il), hp.n_embd_k_gqa(il));
                let split =
                    |v: Vec<f32>| (Some(v[..nq].to_vec()), Some(v[nq..nq + nk].to_vec()), Some(v[nq + nk..].to_vec()));
                let (bq, bk, bv) = match vector_opt(model, &b("attn_qkv.bias"))? {
                    Some(v) if v.len() == nq + nk + hp.n_embd_v_gqa(il) => split(v),
                    _ => (None, None, None),
                };
                (w, w, w, bq, bk, bv)
            } else {
                (
                    weight(model, &b("attn_q.weight"))?,
                    weight(model, &b("attn_k.weight"))?,
                    weight(model, &b("attn_v.weight"))?,
                    vector_opt(model, &b("attn_q.bias"))?,
                    vector_opt(model, &b("attn_k.bias"))?,
                    vector_opt(model, &b("attn_v.bias"))?,
                )
            };
            layers.push(Layer {
                attn_norm: vector(model, &b("attn_norm.weight"))?,
                wq,
                wk,
                wv,
                wo: weight(model, &b("attn_output.weight"))?,
                bq,
                bk,
                bv,
                bo: vector_opt(model, &b("attn_output.bias"))?,
                q_norm: req_if(cfg.qk_norm, "attn_q_norm.weight")?,
                k_norm: req_if(cfg.qk_norm, "attn_k_norm.weight")?,
                post_attn_norm: req_if(cfg.post_norms, "post_attention_norm.weight")?,
                ffn_norm: vector(model, &b("ffn_norm.weight"))?,
                ffn: match weight_opt(model, &b("ffn_gate_inp.weight"))? {
                    Some(router) => Ffn::Moe {
                        router,
                        gate: weight(model, &b("ffn_gate_exps.weight"))?,
                        up: weight(model, &b("ffn_up_exps.weight"))?,
                        down: weight(model, &b("ffn_down_exps.weight"))?,
                    },
                    None => Ffn::Dense {
                        gate: if cfg.fused { None } else { Some(weight(model, &b("ffn_gate.weight"))?) },
                        up: weight(model, &b("ffn_up.weight"))?,
                        down: weight(model, &b("ffn_down.weight"))?,
                    },
                },
                post_ffw_norm: req_if(cfg.post_norms, "post_ffw_norm.weight")?,
                rope: layer_rope(hp, cp, il, factors.clone()),
                n_swa: if hp.swa_layers.get(il).copied().unwrap_or(false) { hp.n_swa } else { 0 },
            });
        }
        let tok_embd = weight(model, "token_embd.weight")?;
        Ok(Decoder {
            cfg,
            tok_embd,
            output_norm: vector(model, "output_norm.weight")?,
            output: weight_opt(model, "output.weight")?.unwrap_or(tok_embd),
            output_bias: vector_opt(model, "output.bias")?,
            layers,
            eps: hp.f_norm_rms_eps,
            n_expert_used: hp.n_expert_used,
            _model: model.clone(),
        })
    }
}

impl Forward for Decoder {
    fn rope(&self, il: usize) -> Option<&RopeParams> {
        self.layers.get(il).map(|l| &l.rope)
    }

    fn forward(&self, st: &mut Step) -> Result<()> {
        let ne = st.hp.n_embd;
        let n_layer = self.layers.len();
        let c = &self.cfg;
        let scale = if c.embd_scale && st.tokens.is_some() { (ne as f32).sqrt() } else { 1.0 };
        st.embed(&self.tok_embd, scale)?;
        crate::cb!(st, if c.embd_scale { "inp_scaled" } else { "inp_embd" }, -1, x, ne);
        for (il, l) in self.layers.iter().enumerate() {
            st.norm_x_to_cur(&l.attn_norm, self.eps);
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
                fused_qkv: self.cfg.fused,
            };
            let a = AttnConfig {
                il,
                rope: Some(&l.rope),
                q_scale: c.q_scale,
                kq_scale: c.kq_scale,
                softcap: c.attn_softcap,
                n_swa: l.n_swa,
                attn_temp: c.attn_temp,
            };
            st.attn_block(&w, &a)?;
            if il == n_layer - 1 && !st.select_outputs() {
                return Ok(());
            }
            if let Some(pn) = &l.post_attn_norm {
                st.norm_tmp(pn, self.eps);
                crate::cb!(st, "attn_post_norm", il, tmp, ne);
            }
            st.residual();
            // llama.cpp's names: the Gemma 2/3 graphs call this residual "sa_out".
            crate::cb!(st, if c.post_norms { "sa_out" } else { "ffn_inp" }, il, x, ne);
            st.norm_x_to_cur(&l.ffn_norm, self.eps);
            crate::cb!(st, "ffn_norm", il, cur, ne);
            match &l.ffn {
                Ffn::Dense { gate, up, down } => st.ffn_any(il, gate.as_ref(), up, down, c.act)?,
                Ffn::Moe { router, gate, up, down } => {
                    let m = MoeWeights { router, gate, up, down };
                    st.ffn_moe(il, &m, self.n_expert_used, true)?
                }
            }
            crate::cb!(st, "ffn_out", il, tmp, ne);
            if let Some(pn) = &l.post_ffw_norm {
                st.norm_tmp(pn, self.eps);
                crate::cb!(st, "ffn_post_norm", il, tmp, ne);
            }
            st.residual();
            st.cvec(il);
            crate::cb!(st, "l_out", il, x, ne);
        }
        st.output_with_bias(&self.output_norm, self.eps, &self.output, self.output_bias.as_deref(), c.final_softcap)
    }
}
