//! Cohere Command R7B / Command A (`cohere2`): one LayerNorm without bias per layer feeding
//! attention and a SwiGLU FFN in parallel, added to the residual as (ffn + x) + attn;
//! sliding-window layers (three of every four) are the only rotated ones (NORM rope), the
//! fourth attends to everything without rope; output tied to the token embeddings and
//! multiplied by `logit_scale`. See llama.cpp's src/models/cohere2.cpp:
//!
//!   cur  = layernorm(x) * attn_norm
//!   att  = wo attention(q, k, v; rope on sliding-window layers, window n_swa there)
//!   ffn  = down(silu(gate cur) * up cur)
//!   x    = (ffn + x) + att
//!   logits = (token_embd . (layernorm(x) * output_norm)) * logit_scale

use super::graph::{layer_rope, AttnConfig, FfnAct, FfnGate, FfnWeights, Norm, Qkv};
use super::loader::{Keep, Loader};
use super::{common_hparams, swa_pattern, Arch};
use crate::context::{ContextParams, Forward, Step};
use crate::error::{Error, Result};
use crate::hparams::{HParams, Meta, RopeType};
use crate::model::TensorView;
use crate::ops::rope::RopeParams;

pub struct Cohere2;

impl Arch for Cohere2 {
    fn name(&self) -> &'static str {
        "cohere2"
    }

    fn hparams(&self, meta: &Meta, n_vocab: usize) -> Result<HParams> {
        let req = |k: &str| Error::Unsupported(format!("{}: missing required metadata key '{}'", meta.file.path, meta.key(k)));
        let mut hp = common_hparams(meta, n_vocab, RopeType::Norm)?;
        hp.swa_layers = swa_pattern(meta, hp.n_layer, 4, false)?;
        hp.rope_freq_base_swa = meta.f("rope.freq_base_swa")?.unwrap_or(hp.rope_freq_base);
        hp.rope_freq_scale_swa = hp.rope_freq_scale;
        hp.n_swa = meta.u("attention.sliding_window")?.ok_or_else(|| req("attention.sliding_window"))?;
        logit_scale(meta)?;
        if meta.f("attention.layer_norm_epsilon")?.is_none() {
            return Err(req("attention.layer_norm_epsilon"));
        }
        Ok(hp)
    }

    fn type_name(&self, hp: &HParams) -> &'static str {
        match hp.n_layer {
            32 => "8B",
            _ => "?B",
        }
    }

    fn build_forward(&self, ld: &Loader, cp: &ContextParams) -> Result<Box<dyn Forward>> {
        Ok(Box::new(Cohere2Forward::load(ld, cp)?))
    }
}

fn logit_scale(meta: &Meta) -> Result<f32> {
    meta.f("logit_scale")?.ok_or_else(|| {
        Error::Unsupported(format!("{}: missing required metadata key '{}'", meta.file.path, meta.key("logit_scale")))
    })
}

struct Layer {
    norm: Vec<f32>,
    qkv: Qkv,
    wo: TensorView<'static>,
    gate: TensorView<'static>,
    up: TensorView<'static>,
    down: TensorView<'static>,
    /// None on the full-attention layers (no rope there).
    rope: Option<RopeParams>,
    n_swa: usize,
}

struct Cohere2Forward {
    tok_embd: TensorView<'static>,
    output_norm: Vec<f32>,
    layers: Vec<Layer>,
    eps: f32,
    logit_scale: f32,
    /// Keeps the tensor bytes the views above borrow alive; must stay the last field.
    _keep: Keep,
}

impl Cohere2Forward {
    /// The schema (llama.cpp's load_arch_tensors: q/k/v {n_embd, n_embd / n_embd_gqa} or
    /// one attn_qkv, optional q/k/v biases, wo {n_embd, n_embd}, gate/up/down, no output.weight).
    fn load(ld: &Loader, cp: &ContextParams) -> Result<Cohere2Forward> {
        let hp = ld.hp();
        let meta = Meta { file: &ld.model().files[0], arch: &hp.arch };
        let (n_embd, n_vocab) = (hp.n_embd, hp.n_vocab);
        let mut layers = Vec::with_capacity(hp.n_layer);
        for il in 0..hp.n_layer {
            let b = |s: &str| format!("blk.{il}.{s}");
            let (nk, nv) = (hp.n_embd_k_gqa(il), hp.n_embd_v_gqa(il));
            let n_ff = hp.n_ff[il];
            let swa = hp.swa_layers[il];
            layers.push(Layer {
                norm: ld.req_vec(&b("attn_norm.weight"), &[n_embd])?,
                qkv: Qkv::load(ld, il, n_embd, n_embd, nk, nv)?,
                wo: ld.req(&b("attn_output.weight"), &[n_embd, n_embd])?,
                gate: ld.req(&b("ffn_gate.weight"), &[n_embd, n_ff])?,
                up: ld.req(&b("ffn_up.weight"), &[n_embd, n_ff])?,
                down: ld.req(&b("ffn_down.weight"), &[n_ff, n_embd])?,
                rope: swa.then(|| layer_rope(hp, cp, il, None)),
                n_swa: if swa { hp.n_swa } else { 0 },
            });
        }
        Ok(Cohere2Forward {
            tok_embd: ld.req("token_embd.weight", &[n_embd, n_vocab])?,
            output_norm: ld.req_vec("output_norm.weight", &[n_embd])?,
            layers,
            eps: hp.f_norm_eps,
            logit_scale: logit_scale(&meta)?,
            _keep: ld.keep(),
        })
    }
}

impl Forward for Cohere2Forward {
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
            st.build_norm(&l.norm, None, Norm::Layer, self.eps);
            crate::cb!(st, "attn_norm", il, cur, ne);
            let w = l.qkv.weights(&l.wo, None);
            let a = AttnConfig { n_swa: l.n_swa, ..AttnConfig::new(il, l.rope.as_ref(), 1.0 / (hd as f32).sqrt()) };
            st.build_attn(&w, &a)?;
            // the FFN reads the same normed input: keep the attention output aside (`att`
            // holds n_head * head_dim = n_embd floats per row, free until the next layer)
            let m = st.n * ne;
            {
                let b = &mut *st.b;
                b.att[..m].copy_from_slice(&b.tmp[..m]);
            }
            let f = FfnWeights { gate: Some(&l.gate), gate_b: None, up: &l.up, up_b: None, down: &l.down, down_b: None };
            st.build_ffn(il, &f, FfnAct::Silu, FfnGate::Par)?;
            crate::cb!(st, "ffn_out", il, tmp, ne);
            if il == n_layer - 1 {
                // the attention output's rows follow x's and tmp's into the outputs' order
                let b = &mut *st.b;
                for (j, &i) in b.out_idx.iter().enumerate() {
                    if i != j {
                        b.att.copy_within(i * ne..(i + 1) * ne, j * ne);
                    }
                }
                if !st.select_outputs() {
                    return Ok(());
                }
            }
            st.residual(); // x = ffn + x
            let m = st.n * ne;
            {
                let b = &mut *st.b;
                crate::ops::act::add_assign(&mut b.x[..m], &b.att[..m]); // + attn_out
            }
            st.build_cvec(il);
            crate::cb!(st, "l_out", il, x, ne);
        }
        st.build_norm(&self.output_norm, None, Norm::Layer, self.eps);
        st.build_output(&self.tok_embd, None, 0.0)?;
        if self.logit_scale != 0.0 && self.logit_scale != 1.0 {
            // llama.cpp: ggml_scale of the logits when f_logit_scale is non-zero
            let nv = self.tok_embd.n_rows();
            for &r in st.b.out_row.iter().take(st.n) {
                crate::ops::act::scale(&mut st.logits[r * nv..(r + 1) * nv], self.logit_scale);
            }
        }
        Ok(())
    }
}
