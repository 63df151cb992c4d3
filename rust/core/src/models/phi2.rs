//! Phi-2: LayerNorm (with bias) once per layer, attention and a GELU MLP run in parallel
//! from that one norm and added to the residual together, `attn_qkv` (or attn_q/k/v) with bias,
//! NEOX rope on the first `rope.dimension_count` dims of each head only, q scaled by
//! 1/sqrt(head) before a softmax of scale 1, `output.weight` + `output.bias`. See
//! llama.cpp's src/models/phi2.cpp:
//!
//!   cur  = layernorm(x) * attn_norm + attn_norm_b
//!   att  = wo attention(rope(wq cur + bq) / sqrt(hd), rope(wk cur + bk), wv cur + bv) + bo
//!   ffn  = down(gelu(up cur + up_b)) + down_b
//!   x    = (att + ffn) + x
//!   logits = output (layernorm(x) * output_norm + output_norm_b) + output_b

use super::graph::{layer_rope, AttnConfig, FfnAct, FfnGate, FfnWeights, Norm, Qkv};
use super::loader::{Keep, Loader};
use super::{common_hparams, Arch};
use crate::context::{ContextParams, Forward, Step};
use crate::error::{Error, Result};
use crate::hparams::{HParams, Meta, RopeType};
use crate::model::TensorView;
use crate::ops::rope::RopeParams;

pub struct Phi2;

impl Arch for Phi2 {
    fn name(&self) -> &'static str {
        "phi2"
    }

    fn build_forward(&self, ld: &Loader, cp: &ContextParams) -> Result<Box<dyn Forward>> {
        Ok(Box::new(Phi2Forward::load(ld, cp)?))
    }

    fn hparams(&self, meta: &Meta, n_vocab: usize) -> Result<HParams> {
        let hp = common_hparams(meta, n_vocab, RopeType::Neox)?;
        if hp.f_norm_eps <= 0.0 {
            return Err(Error::Unsupported(format!(
                "{}: phi2 needs '{}' (LayerNorm epsilon)",
                meta.file.path,
                meta.key("attention.layer_norm_epsilon")
            )));
        }
        Ok(hp)
    }

    fn type_name(&self, hp: &HParams) -> &'static str {
        match hp.n_layer {
            24 => "1B",
            32 => "3B",
            _ => "?B",
        }
    }
}

struct Layer {
    norm_w: Vec<f32>,
    norm_b: Vec<f32>,
    qkv: Qkv,
    wo: TensorView<'static>,
    bo: Vec<f32>,
    up: TensorView<'static>,
    up_b: Vec<f32>,
    down: TensorView<'static>,
    down_b: Vec<f32>,
    rope: RopeParams,
}

struct Phi2Forward {
    tok_embd: TensorView<'static>,
    output_norm: Vec<f32>,
    output_norm_b: Vec<f32>,
    output: TensorView<'static>,
    output_b: Vec<f32>,
    layers: Vec<Layer>,
    eps: f32,
    /// Keeps the tensor bytes the views above borrow alive; must stay the last field.
    _keep: Keep,
}

impl Phi2Forward {
    /// The schema: every tensor phi2 computes with (llama.cpp's load_arch_tensors): all
    /// required but the q/k/v biases.
    fn load(ld: &Loader, cp: &ContextParams) -> Result<Phi2Forward> {
        let hp = ld.hp();
        let (n_embd, n_vocab) = (hp.n_embd, hp.n_vocab);
        let mut layers = Vec::with_capacity(hp.n_layer);
        for il in 0..hp.n_layer {
            let b = |s: &str| format!("blk.{il}.{s}");
            // llama.cpp's create_tensor_qkv: one attn_qkv (optional bias) or attn_q/k/v, of
            // the q/k/v widths the forward pass slices by
            let (nq, nk, nv) = (hp.n_embd_head_k * hp.n_head(il), hp.n_embd_k_gqa(il), hp.n_embd_v_gqa(il));
            let n_ff = hp.n_ff[il];
            layers.push(Layer {
                norm_w: ld.req_vec(&b("attn_norm.weight"), &[n_embd])?,
                norm_b: ld.req_vec(&b("attn_norm.bias"), &[n_embd])?,
                qkv: Qkv::load(ld, il, n_embd, nq, nk, nv)?,
                wo: ld.req(&b("attn_output.weight"), &[hp.n_embd_head_v * hp.n_head(il), n_embd])?,
                bo: ld.req_vec(&b("attn_output.bias"), &[n_embd])?,
                up: ld.req(&b("ffn_up.weight"), &[n_embd, n_ff])?,
                up_b: ld.req_vec(&b("ffn_up.bias"), &[n_ff])?,
                down: ld.req(&b("ffn_down.weight"), &[n_ff, n_embd])?,
                down_b: ld.req_vec(&b("ffn_down.bias"), &[n_embd])?,
                rope: layer_rope(hp, cp, il, None),
            });
        }
        Ok(Phi2Forward {
            tok_embd: ld.req("token_embd.weight", &[n_embd, n_vocab])?,
            output_norm: ld.req_vec("output_norm.weight", &[n_embd])?,
            output_norm_b: ld.req_vec("output_norm.bias", &[n_embd])?,
            output: ld.req("output.weight", &[n_embd, n_vocab])?,
            output_b: ld.req_vec("output.bias", &[n_vocab])?,
            layers,
            eps: hp.f_norm_eps,
            _keep: ld.keep(),
        })
    }
}

impl Forward for Phi2Forward {
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
            st.build_norm(&l.norm_w, Some(&l.norm_b), Norm::Layer, self.eps);
            crate::cb!(st, "attn_norm", il, cur, ne);
            let w = l.qkv.weights(&l.wo, Some(&l.bo));
            let a = AttnConfig { q_scale: 1.0 / (hd as f32).sqrt(), ..AttnConfig::new(il, Some(&l.rope), 1.0) };
            st.build_attn(&w, &a)?;
            // The MLP reads the same normed input; keep the attention output aside (`att`
            // holds n_head * head_dim = n_embd floats per row and is free until the next layer).
            let m = st.n * ne;
            {
                let b = &mut *st.b;
                b.att[..m].copy_from_slice(&b.tmp[..m]);
            }
            let f = FfnWeights { gate: None, gate_b: None, up: &l.up, up_b: Some(&l.up_b), down: &l.down, down_b: Some(&l.down_b) };
            st.build_ffn(il, &f, FfnAct::Gelu, FfnGate::None)?;
            crate::cb!(st, "ffn_out", il, tmp, ne);
            {
                let b = &mut *st.b;
                for (t, a) in b.tmp[..m].iter_mut().zip(&b.att[..m]) {
                    *t = *a + *t; // llama.cpp: ggml_add(attn_out, ffn_out)
                }
            }
            if il == n_layer - 1 && !st.select_outputs() {
                return Ok(());
            }
            st.residual();
            st.build_cvec(il);
            crate::cb!(st, "l_out", il, x, ne);
        }
        st.build_norm(&self.output_norm, Some(&self.output_norm_b), Norm::Layer, self.eps);
        st.build_output(&self.output, Some(&self.output_b), 0.0)
    }
}
