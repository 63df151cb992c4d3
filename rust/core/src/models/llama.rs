//! LLaMA family (LLaMA 1-3, Mistral 7B, SmolLM): RMSNorm, NORM rope, GQA, SwiGLU.

use super::{common_hparams, Arch, TensorSpec};
use crate::context::{ContextParams, Forward};
use crate::error::Result;
use crate::model::Model;
use std::sync::Arc;
use crate::hparams::{HParams, Meta, RopeType};

pub struct Llama;

impl Arch for Llama {
    fn name(&self) -> &'static str {
        "llama"
    }

    fn hparams(&self, meta: &Meta, n_vocab: usize) -> Result<HParams> {
        common_hparams(meta, n_vocab, RopeType::Norm)
    }

    /// src/models/llama.cpp load_arch_hparams (dense models).
    fn type_name(&self, hp: &HParams) -> &'static str {
        match hp.n_layer {
            16 | 22 => "1B",
            26 | 28 => "3B",
            30 => "256M",
            32 if hp.n_vocab == 49152 => "3B",
            32 if hp.n_vocab < 40000 => "7B",
            32 | 36 => "8B",
            40 => "13B",
            48 => "34B",
            60 => "30B",
            80 if hp.n_head(0) == hp.n_head_kv(0) => "65B",
            80 => "70B",
            _ => "?B",
        }
    }

    fn tensors(&self, hp: &HParams) -> Vec<TensorSpec> {
        let (n_embd, n_vocab) = (hp.n_embd, hp.n_vocab);
        let mut v = vec![
            TensorSpec::req("token_embd.weight", &[n_embd, n_vocab]),
            TensorSpec::req("output_norm.weight", &[n_embd]),
            TensorSpec::tied("output.weight", &[n_embd, n_vocab], "token_embd.weight"),
            TensorSpec::opt("rope_freqs.weight", &[hp.n_rot / 2]),
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
                TensorSpec::req(b("ffn_norm.weight"), &[n_embd]),
                TensorSpec::req(b("ffn_gate.weight"), &[n_embd, n_ff]),
                TensorSpec::req(b("ffn_down.weight"), &[n_ff, n_embd]),
                TensorSpec::req(b("ffn_up.weight"), &[n_embd, n_ff]),
            ]);
        }
        v
    }

    fn build_forward(&self, model: &Arc<Model>, cp: &ContextParams) -> Result<Box<dyn Forward>> {
        Ok(Box::new(LlamaForward::new(model, cp)?))
    }
}

// ---- forward pass ------------------------------------------------------------------
//
// x = embd(tokens)                                      [n, n_embd]
// per layer: cur = rmsnorm(x) * attn_norm
//            x  += wo . attn(rope(wq cur), rope(wk cur), wv cur)   (GQA, causal)
//            cur = rmsnorm(x) * ffn_norm
//            x  += down (silu(gate cur) * up cur)
// logits = output . (rmsnorm(x) * output_norm)           (output tied to token_embd if absent)

use crate::context::{layer_rope, vector, vector_opt, weight, weight_opt, AttnConfig, AttnWeights, FfnAct, Step};
use crate::model::TensorView;
use crate::ops::rope::RopeParams;

struct LlamaLayer {
    attn_norm: Vec<f32>,
    wq: TensorView<'static>,
    wk: TensorView<'static>,
    wv: TensorView<'static>,
    wo: TensorView<'static>,
    ffn_norm: Vec<f32>,
    gate: TensorView<'static>,
    up: TensorView<'static>,
    down: TensorView<'static>,
    rope: RopeParams,
}

pub struct LlamaForward {
    tok_embd: TensorView<'static>,
    output_norm: Vec<f32>,
    output: TensorView<'static>,
    layers: Vec<LlamaLayer>,
    eps: f32,
    kq_scale: f32,
    /// Keeps the tensor bytes the views above borrow alive; must stay the last field.
    _model: Arc<Model>,
}

impl LlamaForward {
    pub fn new(model: &Arc<Model>, cp: &ContextParams) -> Result<LlamaForward> {
        let hp = &model.hparams;
        let factors = vector_opt(model, "rope_freqs.weight")?;
        let mut layers = Vec::with_capacity(hp.n_layer);
        for il in 0..hp.n_layer {
            let b = |s: &str| format!("blk.{il}.{s}");
            layers.push(LlamaLayer {
                attn_norm: vector(model, &b("attn_norm.weight"))?,
                wq: weight(model, &b("attn_q.weight"))?,
                wk: weight(model, &b("attn_k.weight"))?,
                wv: weight(model, &b("attn_v.weight"))?,
                wo: weight(model, &b("attn_output.weight"))?,
                ffn_norm: vector(model, &b("ffn_norm.weight"))?,
                gate: weight(model, &b("ffn_gate.weight"))?,
                up: weight(model, &b("ffn_up.weight"))?,
                down: weight(model, &b("ffn_down.weight"))?,
                rope: layer_rope(hp, cp, il, factors.clone()),
            });
        }
        let tok_embd = weight(model, "token_embd.weight")?;
        Ok(LlamaForward {
            tok_embd,
            output_norm: vector(model, "output_norm.weight")?,
            output: weight_opt(model, "output.weight")?.unwrap_or(tok_embd),
            layers,
            eps: hp.f_norm_rms_eps,
            kq_scale: if hp.f_attention_scale != 0.0 {
                hp.f_attention_scale
            } else {
                1.0 / (hp.n_embd_head_k as f32).sqrt()
            },
            _model: model.clone(),
        })
    }
}

impl Forward for LlamaForward {
    fn rope(&self, il: usize) -> Option<&RopeParams> {
        self.layers.get(il).map(|l| &l.rope)
    }

    fn forward(&self, st: &mut Step) -> Result<()> {
        let ne = st.hp.n_embd;
        let n_layer = self.layers.len();
        st.embed(&self.tok_embd, 1.0)?;
        crate::cb!(st, "inp_embd", -1, x, ne);
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
                q_norm: None,
                k_norm: None,
                fused_qkv: false,
            };
            let c = AttnConfig { il, rope: Some(&l.rope), q_scale: 1.0, kq_scale: self.kq_scale, softcap: 0.0, n_swa: 0 };
            st.attn_block(&w, &c)?;
            if il == n_layer - 1 && !st.select_outputs() {
                return Ok(());
            }
            st.residual();
            crate::cb!(st, "ffn_inp", il, x, ne);
            st.norm_x_to_cur(&l.ffn_norm, self.eps);
            crate::cb!(st, "ffn_norm", il, cur, ne);
            st.ffn(il, &l.gate, &l.up, &l.down, FfnAct::SwiGlu)?;
            crate::cb!(st, "ffn_out", il, tmp, ne);
            st.residual();
            crate::cb!(st, "l_out", il, x, ne);
        }
        st.output(&self.output_norm, self.eps, &self.output, 0.0)
    }
}
