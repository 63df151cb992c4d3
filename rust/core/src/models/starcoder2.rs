//! StarCoder2: a pre-norm decoder with LayerNorm (weight and bias) instead of RMSNorm,
//! q/k/v and output projections with biases, NEOX rope, and a non-gated GELU FFN with
//! biases; `output.weight` tied to `token_embd` when absent. See llama.cpp's
//! src/models/starcoder2.cpp:
//!
//!   cur = layernorm(x) * attn_norm + attn_norm_b
//!   x   = x + wo attention(rope(wq cur + bq), rope(wk cur + bk), wv cur + bv) + bo
//!   cur = layernorm(x) * ffn_norm + ffn_norm_b
//!   x   = x + down(gelu(up cur + up_b)) + down_b
//!   logits = output (layernorm(x) * output_norm + output_norm_b)

use super::graph::{layer_rope, AttnConfig, FfnAct, FfnGate, FfnWeights, Norm, Qkv};
use super::loader::{Keep, Loader};
use super::{common_hparams, Arch};
use crate::context::{ContextParams, Forward, Step};
use crate::error::{Error, Result};
use crate::hparams::{HParams, Meta, RopeType};
use crate::model::TensorView;
use crate::ops::rope::RopeParams;

pub struct Starcoder2;

impl Arch for Starcoder2 {
    fn name(&self) -> &'static str {
        "starcoder2"
    }

    fn hparams(&self, meta: &Meta, n_vocab: usize) -> Result<HParams> {
        let hp = common_hparams(meta, n_vocab, RopeType::Neox)?;
        // llama.cpp reads attention.layer_norm_epsilon as a required key
        if meta.f("attention.layer_norm_epsilon")?.is_none() {
            return Err(Error::Unsupported(format!(
                "{}: missing required metadata key '{}'",
                meta.file.path,
                meta.key("attention.layer_norm_epsilon")
            )));
        }
        Ok(hp)
    }

    fn type_name(&self, hp: &HParams) -> &'static str {
        match hp.n_layer {
            30 => "3B",
            32 => "7B",
            40 => "15B",
            52 => "20B",
            88 => "34B",
            _ => "?B",
        }
    }

    fn build_forward(&self, ld: &Loader, cp: &ContextParams) -> Result<Box<dyn Forward>> {
        Ok(Box::new(Starcoder2Forward::load(ld, cp)?))
    }
}

struct Layer {
    attn_norm: Vec<f32>,
    attn_norm_b: Vec<f32>,
    qkv: Qkv,
    wo: TensorView<'static>,
    bo: Vec<f32>,
    ffn_norm: Vec<f32>,
    ffn_norm_b: Vec<f32>,
    up: TensorView<'static>,
    up_b: Vec<f32>,
    down: TensorView<'static>,
    down_b: Vec<f32>,
    rope: RopeParams,
}

struct Starcoder2Forward {
    tok_embd: TensorView<'static>,
    output_norm: Vec<f32>,
    output_norm_b: Vec<f32>,
    output: TensorView<'static>,
    layers: Vec<Layer>,
    eps: f32,
    /// Keeps the tensor bytes the views above borrow alive; must stay the last field.
    _keep: Keep,
}

impl Starcoder2Forward {
    /// The schema (llama.cpp's load_arch_tensors for LLM_ARCH_STARCODER2): norms with biases,
    /// attention-output and FFN biases required; q/k/v biases optional.
    fn load(ld: &Loader, cp: &ContextParams) -> Result<Starcoder2Forward> {
        let hp = ld.hp();
        let (n_embd, n_vocab) = (hp.n_embd, hp.n_vocab);
        let mut layers = Vec::with_capacity(hp.n_layer);
        for il in 0..hp.n_layer {
            let b = |s: &str| format!("blk.{il}.{s}");
            let (n_q, n_k, n_v) = (hp.n_embd_head_k * hp.n_head(il), hp.n_embd_k_gqa(il), hp.n_embd_v_gqa(il));
            let n_ff = hp.n_ff[il];
            layers.push(Layer {
                attn_norm: ld.req_vec(&b("attn_norm.weight"), &[n_embd])?,
                attn_norm_b: ld.req_vec(&b("attn_norm.bias"), &[n_embd])?,
                qkv: Qkv::load(ld, il, n_embd, n_q, n_k, n_v)?,
                wo: ld.req(&b("attn_output.weight"), &[hp.n_embd_head_v * hp.n_head(il), n_embd])?,
                bo: ld.req_vec(&b("attn_output.bias"), &[n_embd])?,
                ffn_norm: ld.req_vec(&b("ffn_norm.weight"), &[n_embd])?,
                ffn_norm_b: ld.req_vec(&b("ffn_norm.bias"), &[n_embd])?,
                up: ld.req(&b("ffn_up.weight"), &[n_embd, n_ff])?,
                up_b: ld.req_vec(&b("ffn_up.bias"), &[n_ff])?,
                down: ld.req(&b("ffn_down.weight"), &[n_ff, n_embd])?,
                down_b: ld.req_vec(&b("ffn_down.bias"), &[n_embd])?,
                rope: layer_rope(hp, cp, il, None),
            });
        }
        let tok_embd = ld.req("token_embd.weight", &[n_embd, n_vocab])?;
        Ok(Starcoder2Forward {
            tok_embd,
            output_norm: ld.req_vec("output_norm.weight", &[n_embd])?,
            output_norm_b: ld.req_vec("output_norm.bias", &[n_embd])?,
            output: ld.opt("output.weight", &[n_embd, n_vocab])?.unwrap_or(tok_embd),
            layers,
            eps: hp.f_norm_eps,
            _keep: ld.keep(),
        })
    }
}

impl Forward for Starcoder2Forward {
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
            st.build_norm(&l.attn_norm, Some(&l.attn_norm_b), Norm::Layer, self.eps);
            crate::cb!(st, "attn_norm", il, cur, ne);
            let w = l.qkv.weights(&l.wo, Some(&l.bo));
            let a = AttnConfig::new(il, Some(&l.rope), 1.0 / (hd as f32).sqrt());
            st.build_attn(&w, &a)?;
            if il == n_layer - 1 && !st.select_outputs() {
                return Ok(());
            }
            st.residual();
            crate::cb!(st, "ffn_inp", il, x, ne);
            st.build_norm(&l.ffn_norm, Some(&l.ffn_norm_b), Norm::Layer, self.eps);
            crate::cb!(st, "ffn_norm", il, cur, ne);
            let f = FfnWeights {
                gate: None,
                gate_b: None,
                up: &l.up,
                up_b: Some(&l.up_b),
                down: &l.down,
                down_b: Some(&l.down_b),
            };
            st.build_ffn(il, &f, FfnAct::Gelu, FfnGate::None)?;
            crate::cb!(st, "ffn_out", il, tmp, ne);
            st.residual();
            st.build_cvec(il);
            crate::cb!(st, "l_out", il, x, ne);
        }
        st.build_norm(&self.output_norm, Some(&self.output_norm_b), Norm::Layer, self.eps);
        st.build_output(&self.output, None, 0.0)
    }
}
