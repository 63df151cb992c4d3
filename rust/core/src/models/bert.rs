//! BERT (bge, MiniLM, e5, ...): the post-norm encoder of llama.cpp's src/models/bert.cpp,
//! whose graph nomic-bert (nomic_bert.rs: rope, SwiGLU) and jina-bert-v2 (jina_bert_v2.rs:
//! ALiBi, q/k LayerNorms, GEGLU) share:
//!
//!   x = layernorm(tok_embd[t] + type_embd[0] + pos_embd[p]) * tok_norm + tok_norm_b
//!   per layer: a   = wo . attn_noncausal(wq x + bq, wk x + bk, wv x + bv) + bo
//!              h   = layernorm(a + x) * attn_out_norm + b
//!              x   = layernorm(ffn(h) + h) * layer_out_norm + b
//!   ffn: bert down(gelu(up h + up_b)) + down_b; nomic down(silu(gate h) * up h);
//!        jina down(geglu(up h [+ up_b]) or gelu(gate h) * (up h + up_b)) + down_b
//! The hidden states x are the embeddings (pooled in Python); the rank pooling head is
//! `cls` / `cls.output` (encoder.rs `ClsHead`). Token types are always 0 ("sentence A"),
//! as llama.cpp.

use super::encoder::{ClsHead, EncAttn, QkNorm};
use super::graph::Qkv;
use super::graph::{layer_rope, FfnAct, FfnGate, FfnWeights, MoeAct, MoeConfig, MoeWeights, Norm};
use super::loader::{Keep, Loader};
use super::{common_hparams, Arch};
use crate::context::{ContextParams, Forward, Step};
use crate::error::{Error, Result};
use crate::hparams::{HParams, Meta, RopeType};
use crate::model::TensorView;
use crate::ops::act;
use crate::ops::rope::RopeParams;
use crate::quant;
use crate::threadpool::ThreadPool;

pub struct Bert;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Variant {
    Bert,
    NomicBert,
    JinaBertV2,
    /// nomic-bert with GELU experts on the layers il % moe_every_n_layers == 1
    NomicBertMoe,
}

/// The hparams the BERT family shares: LayerNorm epsilon required, token types needed.
pub fn bert_hparams(meta: &Meta, n_vocab: usize, rope: RopeType) -> Result<HParams> {
    let hp = common_hparams(meta, n_vocab, rope)?;
    if hp.f_norm_eps <= 0.0 {
        return Err(Error::Unsupported(format!(
            "{}: {} needs '{}' (LayerNorm epsilon)",
            meta.file.path,
            meta.arch,
            meta.key("attention.layer_norm_epsilon")
        )));
    }
    Ok(hp)
}

impl Arch for Bert {
    fn name(&self) -> &'static str {
        "bert"
    }
    fn hparams(&self, meta: &Meta, n_vocab: usize) -> Result<HParams> {
        bert_hparams(meta, n_vocab, RopeType::None)
    }
    fn type_name(&self, hp: &HParams) -> &'static str {
        match (hp.n_layer, hp.n_embd) {
            (3, _) => "17M",
            (6, _) => "22M",
            (12, 384) => "33M",
            (12, 768) => "109M",
            (24, _) => "335M",
            _ => "?B",
        }
    }
    fn build_forward(&self, ld: &Loader, cp: &ContextParams) -> Result<Box<dyn Forward>> {
        Ok(Box::new(BertForward::load(ld, cp, Variant::Bert)?))
    }
}

struct Layer {
    qkv: Qkv,
    q_norm: Option<(Vec<f32>, Option<Vec<f32>>)>,
    k_norm: Option<(Vec<f32>, Option<Vec<f32>>)>,
    wo: TensorView<'static>,
    bo: Option<Vec<f32>>,
    attn_out_norm: (Vec<f32>, Vec<f32>),
    attn_norm_2: Option<(Vec<f32>, Vec<f32>)>,
    up: TensorView<'static>,
    up_b: Option<Vec<f32>>,
    gate: Option<TensorView<'static>>,
    gate_b: Option<Vec<f32>>,
    ffn_gate: FfnGate,
    ffn_act: FfnAct,
    down: TensorView<'static>,
    down_b: Option<Vec<f32>>,
    layer_out_norm: (Vec<f32>, Vec<f32>),
    rope: Option<RopeParams>,
    /// (router, up_exps, down_exps) on nomic-bert-moe's expert layers (then up / down above
    /// are unused views of up_exps / down_exps)
    moe: Option<(TensorView<'static>, TensorView<'static>, TensorView<'static>)>,
}

pub struct BertForward {
    variant: Variant,
    tok_embd: TensorView<'static>,
    type_row0: Option<Vec<f32>>,
    pos_embd: Option<TensorView<'static>>,
    tok_norm: (Vec<f32>, Vec<f32>),
    layers: Vec<Layer>,
    head: ClsHead,
    eps: f32,
    alibi: f32,
    n_expert_used: usize,
    _keep: Keep,
}

impl BertForward {
    pub fn load(ld: &Loader, cp: &ContextParams, variant: Variant) -> Result<BertForward> {
        let hp = ld.hp();
        let (ne, nv) = (hp.n_embd, hp.n_vocab);
        if hp.n_token_types == 0 {
            return Err(Error::Unsupported(format!(
                "{}: {} model needs to define token type count (tokenizer.ggml.token_type_count)",
                ld.model().files[0].path,
                hp.arch
            )));
        }
        let type_embd = if variant == Variant::JinaBertV2 {
            Some(ld.req("token_types.weight", &[ne, hp.n_token_types])?)
        } else {
            ld.opt("token_types.weight", &[ne, hp.n_token_types])?
        };
        let type_row0 = match type_embd {
            Some(t) => {
                let mut v = vec![0f32; ne];
                if !ld.checking() {
                    quant::dequantize_row(t.ty, t.row(0), &mut v)?;
                }
                Some(v)
            }
            None => None,
        };
        let pos_embd = if variant == Variant::Bert { Some(ld.req("position_embd.weight", &[ne, hp.n_ctx_train])?) } else { None };
        let mut layers = Vec::with_capacity(hp.n_layer);
        for il in 0..hp.n_layer {
            let b = |s: &str| format!("blk.{il}.{s}");
            let hd = hp.n_embd_head_k;
            if hd != hp.n_embd_head_v {
                return Err(Error::Unsupported(format!("{}: key and value head sizes must be equal", hp.arch)));
            }
            let (nq, nk) = (hd * hp.n_head(il), hp.n_embd_k_gqa(il));
            let n_ff = hp.n_ff[il];
            let pair = |w: &str, bias: &str| -> Result<(Vec<f32>, Vec<f32>)> {
                Ok((ld.req_vec(&b(w), &[ne])?, ld.req_vec(&b(bias), &[ne])?))
            };
            let opt_pair = |w: &str, bias: &str, n: usize| -> Result<Option<(Vec<f32>, Option<Vec<f32>>)>> {
                Ok(match ld.opt_vec(&b(w), &[n])? {
                    Some(x) => Some((x, ld.opt_vec(&b(bias), &[n])?)),
                    None => None,
                })
            };
            let (q_norm, k_norm, attn_norm_2) = if variant == Variant::JinaBertV2 {
                (
                    opt_pair("attn_q_norm.weight", "attn_q_norm.bias", nq)?,
                    opt_pair("attn_k_norm.weight", "attn_k_norm.bias", nk)?,
                    match ld.opt_vec(&b("attn_norm_2.weight"), &[ne])? {
                        Some(w) => Some((w, ld.req_vec(&b("attn_norm_2.bias"), &[ne])?)),
                        None => None,
                    },
                )
            } else {
                (None, None, None)
            };
            let (up, up_b, gate, gate_b, ffn_gate, ffn_act, down_b);
            let mut moe = None;
            let every = ld.model().files[0]
                .get("nomic-bert-moe.moe_every_n_layers")
                .and_then(|v| v.as_i64())
                .unwrap_or(0)
                .max(0) as usize;
            if variant == Variant::NomicBertMoe && every > 0 && il % every == 1 {
                let ne_ = hp.n_expert;
                let r = ld.req(&b("ffn_gate_inp.weight"), &[ne, ne_])?;
                let u = ld.req(&b("ffn_up_exps.weight"), &[ne, n_ff, ne_])?;
                let d = ld.req(&b("ffn_down_exps.weight"), &[n_ff, ne, ne_])?;
                (up, up_b, gate, gate_b, ffn_gate, ffn_act, down_b) =
                    (u.clone(), None, None, None, FfnGate::None, FfnAct::Gelu, None);
                moe = Some((r, u, d));
            } else {
            match variant {
                Variant::Bert | Variant::NomicBertMoe => {
                    up = ld.req(&b("ffn_up.weight"), &[ne, n_ff])?;
                    up_b = ld.opt_vec(&b("ffn_up.bias"), &[n_ff])?;
                    (gate, gate_b, ffn_gate, ffn_act) = (None, None, FfnGate::None, FfnAct::Gelu);
                    down_b = ld.opt_vec(&b("ffn_down.bias"), &[ne])?;
                }
                Variant::NomicBert => {
                    up = ld.req(&b("ffn_up.weight"), &[ne, n_ff])?;
                    up_b = None;
                    gate = Some(ld.req(&b("ffn_gate.weight"), &[ne, n_ff])?);
                    (gate_b, ffn_gate, ffn_act) = (None, FfnGate::Par, FfnAct::Silu);
                    down_b = None;
                }
                Variant::JinaBertV2 => {
                    gate = ld.opt(&b("ffn_gate.weight"), &[ne, n_ff])?;
                    let n_up = match ld.model().tensor(&b("ffn_up.weight")) {
                        Some(t) if gate.is_none() && t.ne[1] == 2 * n_ff => 2 * n_ff,
                        _ => n_ff,
                    };
                    up = ld.req(&b("ffn_up.weight"), &[ne, n_up])?;
                    let ub = ld.opt_vec(&b("ffn_up.bias"), &[n_up])?;
                    if n_up == 2 * n_ff {
                        // geglu of the fused [gate; up] rows: the bias splits with them
                        gate_b = ub.as_ref().map(|v| v[..n_ff].to_vec());
                        up_b = ub.map(|v| v[n_ff..].to_vec());
                        ffn_gate = FfnGate::Fused;
                    } else {
                        gate_b = None;
                        up_b = ub;
                        ffn_gate = if gate.is_some() { FfnGate::Par } else { FfnGate::None };
                    }
                    ffn_act = FfnAct::Gelu;
                    down_b = Some(ld.req_vec(&b("ffn_down.bias"), &[ne])?);
                }
            }
            }
            let down = match &moe {
                Some((_, _, d)) => d.clone(),
                None => ld.req(&b("ffn_down.weight"), &[n_ff, ne])?,
            };
            layers.push(Layer {
                qkv: Qkv::load(ld, il, ne, nq, nk, hp.n_embd_v_gqa(il))?,
                q_norm,
                k_norm,
                wo: ld.req(&b("attn_output.weight"), &[hd * hp.n_head(il), ne])?,
                bo: if variant == Variant::JinaBertV2 {
                    Some(ld.req_vec(&b("attn_output.bias"), &[ne])?)
                } else {
                    ld.opt_vec(&b("attn_output.bias"), &[ne])?
                },
                attn_out_norm: pair("attn_output_norm.weight", "attn_output_norm.bias")?,
                attn_norm_2,
                up,
                up_b,
                gate,
                gate_b,
                ffn_gate,
                ffn_act,
                down,
                down_b,
                layer_out_norm: pair("layer_output_norm.weight", "layer_output_norm.bias")?,
                rope: if matches!(variant, Variant::NomicBert | Variant::NomicBertMoe) {
                    Some(layer_rope(hp, cp, il, None))
                } else {
                    None
                },
                moe,
            });
        }
        Ok(BertForward {
            variant,
            tok_embd: ld.req("token_embd.weight", &[ne, nv])?,
            type_row0,
            pos_embd,
            tok_norm: (ld.req_vec("token_embd_norm.weight", &[ne])?, ld.req_vec("token_embd_norm.bias", &[ne])?),
            layers,
            head: ClsHead::load(ld, None, false, false, if variant == Variant::JinaBertV2 { 1 } else { ne })?,
            eps: hp.f_norm_eps,
            alibi: if variant == Variant::JinaBertV2 { 8.0 } else { 0.0 },
            n_expert_used: hp.n_expert_used,
            _keep: ld.keep(),
        })
    }
}

impl Forward for BertForward {
    fn rope(&self, il: usize) -> Option<&RopeParams> {
        self.layers.get(il).and_then(|l| l.rope.as_ref())
    }

    fn encoder(&self) -> bool {
        true
    }

    fn classify(&self, pool: &ThreadPool, x: &[f32], n: usize) -> Result<(Vec<f32>, usize)> {
        if !self.head.present() {
            return Err(Error::Invalid("this model has no classifier head (cls.weight / cls.output.weight): rank pooling needs one".into()));
        }
        self.head.apply(pool, x, n, self.tok_norm.0.len())
    }

    fn forward(&self, st: &mut Step) -> Result<()> {
        let ne = st.hp.n_embd;
        let n = st.n;
        st.build_inp_embd(&self.tok_embd, 1.0)?;
        if let Some(t0) = &self.type_row0 {
            for r in st.b.x[..n * ne].chunks_exact_mut(ne) {
                act::add_assign(r, t0);
            }
        }
        if let Some(pe) = &self.pos_embd {
            let mut row = vec![0f32; ne];
            for t in 0..n {
                let p = st.b.pos[t];
                if p < 0 || p as usize >= pe.ne[1] {
                    return Err(Error::Invalid(format!(
                        "position {p} is outside the model's {} position embeddings (n_ctx_train)",
                        pe.ne[1]
                    )));
                }
                quant::dequantize_row(pe.ty, pe.row(p as usize), &mut row)?;
                // llama.cpp: ggml_add(pos_rows, inpL)
                for (x, &r) in st.b.x[t * ne..(t + 1) * ne].iter_mut().zip(&row) {
                    *x = r + *x;
                }
            }
        }
        crate::cb!(st, "inp_embd", -1, x, ne);
        st.norm_x(&self.tok_norm.0, Some(&self.tok_norm.1), Norm::Layer, self.eps);
        crate::cb!(st, "inp_norm", 0, x, ne);
        let hd = st.hp.n_embd_head_k;
        for (il, l) in self.layers.iter().enumerate() {
            // attention reads x directly (no pre-norm)
            {
                let b = &mut *st.b;
                b.cur[..st.n * ne].copy_from_slice(&b.x[..st.n * ne]);
            }
            let qk_norm = match (&l.q_norm, &l.k_norm) {
                (Some(q), Some(k)) => {
                    Some(QkNorm::Layer { q: (&q.0, q.1.as_deref()), k: (&k.0, k.1.as_deref()), eps: self.eps })
                }
                (None, None) => None,
                _ => return Err(Error::Unsupported(format!("layer {il}: attn_q_norm and attn_k_norm come together"))),
            };
            let a = EncAttn {
                il,
                rope: l.rope.as_ref(),
                qk_norm,
                kq_scale: 1.0 / (hd as f32).sqrt(),
                max_alibi_bias: self.alibi,
                n_swa: 0,
                rel_bias: None,
            };
            st.build_attn_enc(&l.qkv.weights(&l.wo, l.bo.as_deref()), &a)?;
            crate::cb!(st, "kqv_out", il, tmp, ne);
            // cur = layernorm(attn + x); x keeps the layer input for attn_norm_2
            {
                let m = st.n * ne;
                let b = &mut *st.b;
                for ((c, &t), &x) in b.cur[..m].iter_mut().zip(&b.tmp[..m]).zip(&b.x[..m]) {
                    *c = t + x;
                }
                std::mem::swap(&mut b.x, &mut b.cur);
            }
            // x = attn + input, cur = input
            st.norm_x(&l.attn_out_norm.0, Some(&l.attn_out_norm.1), Norm::Layer, self.eps);
            if let Some((w, bias)) = &l.attn_norm_2 {
                let m = st.n * ne;
                let b = &mut *st.b;
                for (x, &c) in b.x[..m].iter_mut().zip(&b.cur[..m]) {
                    *x += c;
                }
                st.norm_x(w, Some(bias), Norm::Layer, self.eps);
            }
            crate::cb!(st, "ffn_inp", il, x, ne);
            {
                let m = st.n * ne;
                let b = &mut *st.b;
                b.cur[..m].copy_from_slice(&b.x[..m]);
            }
            let f = FfnWeights {
                gate: l.gate.as_ref(),
                gate_b: l.gate_b.as_deref(),
                up: &l.up,
                up_b: l.up_b.as_deref(),
                down: &l.down,
                down_b: l.down_b.as_deref(),
            };
            match &l.moe {
                Some((router, up, down)) => {
                    let m = MoeWeights {
                        router,
                        router_b: None,
                        gate: None,
                        up,
                        down,
                        gate_b: None,
                        up_b: None,
                        down_b: None,
                        probs_b: None,
                    };
                    let c = MoeConfig { act: MoeAct::Gelu, ..MoeConfig::softmax(self.n_expert_used, false) };
                    st.build_moe_ffn(il, &m, &c)?;
                }
                None => st.build_ffn(il, &f, l.ffn_act, l.ffn_gate)?,
            }
            crate::cb!(st, "ffn_out", il, tmp, ne);
            // x = layernorm(ffn + ffn_inp)
            {
                let m = st.n * ne;
                let b = &mut *st.b;
                for (x, &t) in b.x[..m].iter_mut().zip(&b.tmp[..m]) {
                    *x = t + *x;
                }
            }
            st.norm_x(&l.layer_out_norm.0, Some(&l.layer_out_norm.1), Norm::Layer, self.eps);
            crate::cb!(st, "l_out", il, x, ne);
        }
        let _ = self.variant;
        st.write_hidden();
        Ok(())
    }
}
