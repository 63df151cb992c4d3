//! llama-embed (LLaMA-architecture embedders, e.g. llama-embed-nemotron): LLaMA's layer
//! (RMSNorm, NORM rope, GQA, SwiGLU; q/k/v/o biases where the file has them) run as a
//! non-causal encoder without KV cache, the final RMSNorm'd hidden states as embeddings and
//! no output projection (llama.cpp's src/models/llama-embed.cpp: the llama graph with
//! `embed = true`). llama.cpp's decode runs it through encode (no memory), so attention is
//! bidirectional within each sequence.

use super::encoder::EncAttn;
use super::graph::Qkv;
use super::graph::{layer_rope, FfnAct, FfnGate, FfnWeights, Norm};
use super::loader::{Keep, Loader};
use super::{common_hparams, Arch};
use crate::context::{ContextParams, Forward, Step};
use crate::error::{Error, Result};
use crate::hparams::{HParams, Meta, RopeType};
use crate::model::TensorView;
use crate::ops::rope::RopeParams;

pub struct LlamaEmbed;

impl Arch for LlamaEmbed {
    fn name(&self) -> &'static str {
        "llama-embed"
    }
    fn hparams(&self, meta: &Meta, n_vocab: usize) -> Result<HParams> {
        let mut hp = common_hparams(meta, n_vocab, RopeType::Norm)?;
        hp.causal_attn = false; // no memory: llama.cpp encodes it (non-causal)
        if hp.n_rot != hp.n_embd_head_k {
            return Err(Error::Unsupported(format!(
                "{}: invalid n_rot {}, expected {}",
                meta.file.path, hp.n_rot, hp.n_embd_head_k
            )));
        }
        Ok(hp)
    }
    fn build_forward(&self, ld: &Loader, cp: &ContextParams) -> Result<Box<dyn Forward>> {
        Ok(Box::new(LlamaEmbedForward::load(ld, cp)?))
    }
}

struct Layer {
    attn_norm: Vec<f32>,
    qkv: Qkv,
    wo: TensorView<'static>,
    bo: Option<Vec<f32>>,
    ffn_norm: Vec<f32>,
    gate: TensorView<'static>,
    up: TensorView<'static>,
    down: TensorView<'static>,
    rope: RopeParams,
}

struct LlamaEmbedForward {
    tok_embd: TensorView<'static>,
    output_norm: Vec<f32>,
    layers: Vec<Layer>,
    eps: f32,
    kq_scale: f32,
    _keep: Keep,
}

impl LlamaEmbedForward {
    fn load(ld: &Loader, cp: &ContextParams) -> Result<LlamaEmbedForward> {
        let hp = ld.hp();
        let (ne, nv, hd) = (hp.n_embd, hp.n_vocab, hp.n_embd_head_k);
        if ld.model().tensor("rope_freqs.weight").is_some() {
            return Err(Error::Unsupported("llama-embed: rope frequency factors (rope_freqs) are not supported".into()));
        }
        let mut layers = Vec::with_capacity(hp.n_layer);
        for il in 0..hp.n_layer {
            let b = |s: &str| format!("blk.{il}.{s}");
            let n_ff = hp.n_ff[il];
            let nq = hd * hp.n_head(il);
            layers.push(Layer {
                attn_norm: ld.req_vec(&b("attn_norm.weight"), &[ne])?,
                qkv: Qkv::load(ld, il, ne, nq, hp.n_embd_k_gqa(il), hp.n_embd_v_gqa(il))?,
                wo: ld.req(&b("attn_output.weight"), &[nq, ne])?,
                bo: ld.opt_vec(&b("attn_output.bias"), &[ne])?,
                ffn_norm: ld.req_vec(&b("ffn_norm.weight"), &[ne])?,
                gate: ld.req(&b("ffn_gate.weight"), &[ne, n_ff])?,
                up: ld.req(&b("ffn_up.weight"), &[ne, n_ff])?,
                down: ld.req(&b("ffn_down.weight"), &[n_ff, ne])?,
                rope: layer_rope(hp, cp, il, None),
            });
        }
        Ok(LlamaEmbedForward {
            tok_embd: ld.req("token_embd.weight", &[ne, nv])?,
            output_norm: ld.req_vec("output_norm.weight", &[ne])?,
            layers,
            eps: hp.f_norm_rms_eps,
            kq_scale: if hp.f_attention_scale == 0.0 { 1.0 / (hd as f32).sqrt() } else { hp.f_attention_scale },
            _keep: ld.keep(),
        })
    }
}

impl Forward for LlamaEmbedForward {
    fn rope(&self, il: usize) -> Option<&RopeParams> {
        self.layers.get(il).map(|l| &l.rope)
    }
    fn encoder(&self) -> bool {
        true
    }
    fn forward(&self, st: &mut Step) -> Result<()> {
        let ne = st.hp.n_embd;
        st.build_inp_embd(&self.tok_embd, 1.0)?;
        for (il, l) in self.layers.iter().enumerate() {
            st.build_norm(&l.attn_norm, None, Norm::Rms, self.eps);
            let a = EncAttn {
                il,
                rope: Some(&l.rope),
                qk_norm: None,
                kq_scale: self.kq_scale,
                max_alibi_bias: 0.0,
                n_swa: 0,
                rel_bias: None,
            };
            st.build_attn_enc(&l.qkv.weights(&l.wo, l.bo.as_deref()), &a)?;
            st.residual();
            st.build_norm(&l.ffn_norm, None, Norm::Rms, self.eps);
            let f = FfnWeights { gate: Some(&l.gate), gate_b: None, up: &l.up, up_b: None, down: &l.down, down_b: None };
            st.build_ffn(il, &f, FfnAct::Silu, FfnGate::Par)?;
            st.residual();
            st.build_cvec(il);
            crate::cb!(st, "l_out", il, x, ne);
        }
        st.norm_x(&self.output_norm, None, Norm::Rms, self.eps);
        st.write_hidden();
        Ok(())
    }
}
