//! Phi-2: LayerNorm (with bias) once per layer, attention and a GELU MLP run in parallel
//! from that one norm and added to the residual together, fused `attn_qkv` with bias,
//! NEOX rope on the first `rope.dimension_count` dims of each head only, q scaled by
//! 1/sqrt(head) before a softmax of scale 1, `output.weight` + `output.bias`. See
//! llama.cpp's src/models/phi2.cpp:
//!
//!   cur  = layernorm(x) * attn_norm + attn_norm_b
//!   att  = wo attention(rope(wq cur + bq) / sqrt(hd), rope(wk cur + bk), wv cur + bv) + bo
//!   ffn  = down(gelu(up cur + up_b)) + down_b
//!   x    = (att + ffn) + x
//!   logits = output (layernorm(x) * output_norm + output_norm_b) + output_b

use super::{common_hparams, Arch, TensorSpec};
use crate::context::{layer_rope, vector, weight, AttnConfig, AttnWeights, ContextParams, Forward, Step};
use crate::error::{Error, Result};
use crate::hparams::{HParams, Meta, RopeType};
use crate::model::{Model, TensorView};
use crate::ops::rope::RopeParams;
use std::sync::Arc;

pub struct Phi2;

impl Arch for Phi2 {
    fn name(&self) -> &'static str {
        "phi2"
    }

    fn build_forward(&self, model: &Arc<Model>, cp: &ContextParams) -> Result<Box<dyn Forward>> {
        Ok(Box::new(Phi2Forward::new(model, cp)?))
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

    fn tensors(&self, hp: &HParams) -> Vec<TensorSpec> {
        let (n_embd, n_vocab) = (hp.n_embd, hp.n_vocab);
        let mut v = vec![
            TensorSpec::req("token_embd.weight", &[n_embd, n_vocab]),
            TensorSpec::req("output_norm.weight", &[n_embd]),
            TensorSpec::req("output_norm.bias", &[n_embd]),
            TensorSpec::req("output.weight", &[n_embd, n_vocab]),
            TensorSpec::req("output.bias", &[n_vocab]),
        ];
        for il in 0..hp.n_layer {
            // llama.cpp: {n_embd, n_embd + 2 n_embd_gqa} and wo {n_embd, n_embd}; the same for
            // real files, written with the q/k/v widths the forward pass slices by, so a file
            // whose key/value lengths disagree with its tensors fails at load.
            let n_qkv = hp.n_embd_head_k * hp.n_head(il) + hp.n_embd_k_gqa(il) + hp.n_embd_v_gqa(il);
            let n_o = hp.n_embd_head_v * hp.n_head(il);
            let b = |s: &str| format!("blk.{il}.{s}");
            v.extend([
                TensorSpec::req(b("attn_norm.weight"), &[n_embd]),
                TensorSpec::req(b("attn_norm.bias"), &[n_embd]),
                TensorSpec::req(b("attn_qkv.weight"), &[n_embd, n_qkv]),
                TensorSpec::req(b("attn_qkv.bias"), &[n_qkv]),
                TensorSpec::req(b("attn_output.weight"), &[n_o, n_embd]),
                TensorSpec::req(b("attn_output.bias"), &[n_embd]),
                TensorSpec::req(b("ffn_up.weight"), &[n_embd, hp.n_ff[il]]),
                TensorSpec::req(b("ffn_up.bias"), &[hp.n_ff[il]]),
                TensorSpec::req(b("ffn_down.weight"), &[hp.n_ff[il], n_embd]),
                TensorSpec::req(b("ffn_down.bias"), &[n_embd]),
            ]);
        }
        v
    }
}

struct Layer {
    norm_w: Vec<f32>,
    norm_b: Vec<f32>,
    wqkv: TensorView<'static>,
    bq: Vec<f32>,
    bk: Vec<f32>,
    bv: Vec<f32>,
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
    _model: Arc<Model>,
}

impl Phi2Forward {
    fn new(model: &Arc<Model>, cp: &ContextParams) -> Result<Phi2Forward> {
        let hp = &model.hparams;
        let mut layers = Vec::with_capacity(hp.n_layer);
        for il in 0..hp.n_layer {
            let b = |s: &str| format!("blk.{il}.{s}");
            let (nq, nk) = (hp.n_embd_head_k * hp.n_head(il), hp.n_embd_k_gqa(il));
            let bqkv = vector(model, &b("attn_qkv.bias"))?;
            if bqkv.len() != nq + nk + hp.n_embd_v_gqa(il) {
                return Err(Error::Unsupported(format!("tensor '{}': wrong length {}", b("attn_qkv.bias"), bqkv.len())));
            }
            layers.push(Layer {
                norm_w: vector(model, &b("attn_norm.weight"))?,
                norm_b: vector(model, &b("attn_norm.bias"))?,
                wqkv: weight(model, &b("attn_qkv.weight"))?,
                bq: bqkv[..nq].to_vec(),
                bk: bqkv[nq..nq + nk].to_vec(),
                bv: bqkv[nq + nk..].to_vec(),
                wo: weight(model, &b("attn_output.weight"))?,
                bo: vector(model, &b("attn_output.bias"))?,
                up: weight(model, &b("ffn_up.weight"))?,
                up_b: vector(model, &b("ffn_up.bias"))?,
                down: weight(model, &b("ffn_down.weight"))?,
                down_b: vector(model, &b("ffn_down.bias"))?,
                rope: layer_rope(hp, cp, il, None),
            });
        }
        Ok(Phi2Forward {
            tok_embd: weight(model, "token_embd.weight")?,
            output_norm: vector(model, "output_norm.weight")?,
            output_norm_b: vector(model, "output_norm.bias")?,
            output: weight(model, "output.weight")?,
            output_b: vector(model, "output.bias")?,
            layers,
            eps: hp.f_norm_eps,
            _model: model.clone(),
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
        st.embed(&self.tok_embd, 1.0)?;
        crate::cb!(st, "inp_embd", -1, x, ne);
        for (il, l) in self.layers.iter().enumerate() {
            st.layer_norm_x_to_cur(&l.norm_w, Some(&l.norm_b), self.eps);
            crate::cb!(st, "attn_norm", il, cur, ne);
            let w = AttnWeights {
                wq: &l.wqkv,
                wk: &l.wqkv,
                wv: &l.wqkv,
                wo: &l.wo,
                bq: Some(&l.bq),
                bk: Some(&l.bk),
                bv: Some(&l.bv),
                bo: Some(&l.bo),
                q_norm: None,
                k_norm: None,
                fused_qkv: true,
            };
            let a = AttnConfig {
                il,
                rope: Some(&l.rope),
                q_scale: 1.0 / (hd as f32).sqrt(),
                kq_scale: 1.0,
                softcap: 0.0,
                n_swa: 0,
                attn_temp: None,
            };
            st.attn_block(&w, &a)?;
            // The MLP reads the same normed input; keep the attention output aside (`att`
            // holds n_head * head_dim = n_embd floats per row and is free until the next layer).
            let m = st.n * ne;
            {
                let b = &mut *st.b;
                b.att[..m].copy_from_slice(&b.tmp[..m]);
            }
            st.ffn_gelu_seq(il, &l.up, Some(&l.up_b), &l.down, Some(&l.down_b))?;
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
            st.cvec(il);
            crate::cb!(st, "l_out", il, x, ne);
        }
        st.layer_norm_x_to_cur(&self.output_norm, Some(&self.output_norm_b), self.eps);
        st.project_outputs(&self.output, Some(&self.output_b), 0.0)
    }
}
