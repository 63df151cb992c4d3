//! ModernBERT (modernbert-embed, gte-modernbert, granite-embedding r2): a pre-norm
//! encoder with LayerNorms without bias, fused `attn_qkv` without bias, NEOX rope (its
//! own base on the sliding-window layers), a symmetric sliding window on every layer but
//! each third one (il % 3 != 0, `attention.sliding_window`), and a GEGLU (or SwiGLU, by
//! `hidden_activation`) feed-forward from a fused `ffn_up` of 2 n_ff rows; llama.cpp's
//! src/models/modern-bert.cpp:
//!
//!   x = layernorm(tok_embd[t]) * tok_norm
//!   per layer: x += wo . attn_noncausal(rope(q), rope(k), v) of (il > 0 ? layernorm(x) * attn_norm : x)
//!              x += down(act(up_gate h) * up h), h = layernorm(x) * ffn_norm
//!   embeddings = layernorm(x) * output_norm
//! The rank head (`cls` + GELU + `cls_norm`, `cls.output`) pools by mean unless
//! `classifier.pooling_type` says otherwise.

use super::encoder::{ClsHead, EncAttn};
use super::graph::Qkv;
use super::graph::{layer_rope, FfnAct, FfnGate, FfnWeights, Norm};
use super::loader::{Keep, Loader};
use super::{common_hparams, Arch};
use crate::context::{ContextParams, Forward, Step};
use crate::error::{Error, Result};
use crate::hparams::{HParams, Meta, RopeType};
use crate::model::TensorView;
use crate::ops::rope::RopeParams;
use crate::threadpool::ThreadPool;

pub struct ModernBert;

/// `{arch}.attention.sliding_window_pattern`: a period (scalar) or one bool per layer.
pub fn swa_pattern(meta: &Meta, n_layer: usize, default: usize, dense_first: bool) -> Result<Vec<bool>> {
    if let Some(crate::gguf::Value::Array(a)) = meta.get("attention.sliding_window_pattern") {
        if a.len() != n_layer {
            return Err(Error::Unsupported(format!(
                "{}: '{}' has {} entries for {n_layer} layers",
                meta.file.path,
                meta.key("attention.sliding_window_pattern"),
                a.len()
            )));
        }
        return Ok((0..n_layer).map(|i| matches!(a.get(i), Some(crate::gguf::Value::Bool(true)))).collect());
    }
    let p = meta.u("attention.sliding_window_pattern")?.unwrap_or(default);
    Ok((0..n_layer)
        .map(|il| p == 0 || if dense_first { il % p != 0 } else { il % p < p - 1 })
        .collect())
}

impl Arch for ModernBert {
    fn name(&self) -> &'static str {
        "modern-bert"
    }
    fn hparams(&self, meta: &Meta, n_vocab: usize) -> Result<HParams> {
        let mut hp = common_hparams(meta, n_vocab, RopeType::Neox)?;
        if hp.f_norm_eps <= 0.0 {
            return Err(Error::Unsupported(format!(
                "{}: modern-bert needs '{}'",
                meta.file.path,
                meta.key("attention.layer_norm_epsilon")
            )));
        }
        hp.n_swa = meta.u("attention.sliding_window")?.unwrap_or(0);
        if hp.n_swa > 0 {
            hp.swa_layers = swa_pattern(meta, hp.n_layer, 3, true)?;
            hp.rope_freq_base_swa = meta.f("rope.freq_base_swa")?.unwrap_or(hp.rope_freq_base);
        } else {
            hp.swa_layers = vec![false; hp.n_layer];
        }
        if hp.pooling_type_cls < 0 {
            hp.pooling_type_cls = 1; // GGUFs without one pool by mean (gte-reranker-modernbert)
        }
        Ok(hp)
    }
    fn type_name(&self, hp: &HParams) -> &'static str {
        match hp.n_layer {
            12 => "47M",
            22 => "149M",
            28 => "395M",
            _ => "?B",
        }
    }
    fn build_forward(&self, ld: &Loader, cp: &ContextParams) -> Result<Box<dyn Forward>> {
        Ok(Box::new(ModernBertForward::load(ld, cp)?))
    }
}

struct Layer {
    attn_norm: Option<Vec<f32>>,
    qkv: Qkv,
    wo: TensorView<'static>,
    ffn_norm: Vec<f32>,
    up: TensorView<'static>,
    down: TensorView<'static>,
    rope: RopeParams,
    n_swa: usize,
}

struct ModernBertForward {
    tok_embd: TensorView<'static>,
    tok_norm: Vec<f32>,
    output_norm: Vec<f32>,
    layers: Vec<Layer>,
    act: FfnAct,
    head: ClsHead,
    eps: f32,
    _keep: Keep,
}

impl ModernBertForward {
    fn load(ld: &Loader, cp: &ContextParams) -> Result<ModernBertForward> {
        let hp = ld.hp();
        let (ne, nv) = (hp.n_embd, hp.n_vocab);
        let act = match ld.model().files[0].get("modern-bert.hidden_activation").and_then(|v| v.as_str()) {
            None | Some("gelu") | Some("geglu") => FfnAct::Gelu,
            Some("silu") | Some("swish") | Some("swiglu") => FfnAct::Silu,
            Some(other) => {
                return Err(Error::Unsupported(format!("modern-bert: hidden_activation '{other}' is not supported")))
            }
        };
        let mut layers = Vec::with_capacity(hp.n_layer);
        for il in 0..hp.n_layer {
            let b = |s: &str| format!("blk.{il}.{s}");
            let n_ff = hp.n_ff[il];
            let wqkv = ld.req(&b("attn_qkv.weight"), &[ne, 3 * ne])?;
            layers.push(Layer {
                attn_norm: if il == 0 {
                    ld.opt_vec(&b("attn_norm.weight"), &[ne])?
                } else {
                    Some(ld.req_vec(&b("attn_norm.weight"), &[ne])?)
                },
                qkv: Qkv { wq: wqkv.clone(), wk: wqkv.clone(), wv: wqkv, bq: None, bk: None, bv: None, fused: true },
                wo: ld.req(&b("attn_output.weight"), &[ne, ne])?,
                ffn_norm: ld.req_vec(&b("ffn_norm.weight"), &[ne])?,
                up: ld.req(&b("ffn_up.weight"), &[ne, 2 * n_ff])?,
                down: ld.req(&b("ffn_down.weight"), &[n_ff, ne])?,
                rope: layer_rope(hp, cp, il, None),
                n_swa: if hp.swa_layers[il] { hp.n_swa } else { 0 },
            });
        }
        Ok(ModernBertForward {
            tok_embd: ld.req("token_embd.weight", &[ne, nv])?,
            tok_norm: ld.req_vec("token_embd_norm.weight", &[ne])?,
            output_norm: ld.req_vec("output_norm.weight", &[ne])?,
            layers,
            act,
            head: ClsHead::load(ld, Some("cls.norm.weight"), true, false, ne)?,
            eps: hp.f_norm_eps,
            _keep: ld.keep(),
        })
    }
}

impl Forward for ModernBertForward {
    fn rope(&self, il: usize) -> Option<&RopeParams> {
        self.layers.get(il).map(|l| &l.rope)
    }
    fn encoder(&self) -> bool {
        true
    }
    fn classify(&self, pool: &ThreadPool, x: &[f32], n: usize) -> Result<(Vec<f32>, usize)> {
        if !self.head.present() {
            return Err(Error::Invalid("this model has no classifier head (cls.weight / cls.output.weight): rank pooling needs one".into()));
        }
        self.head.apply(pool, x, n, self.tok_norm.len())
    }
    fn forward(&self, st: &mut Step) -> Result<()> {
        let ne = st.hp.n_embd;
        let hd = st.hp.n_embd_head_k;
        st.build_inp_embd(&self.tok_embd, 1.0)?;
        crate::cb!(st, "inp_embd", -1, x, ne);
        st.norm_x(&self.tok_norm, None, Norm::Layer, self.eps);
        for (il, l) in self.layers.iter().enumerate() {
            match &l.attn_norm {
                Some(w) => st.build_norm(w, None, Norm::Layer, self.eps),
                None => {
                    let m = st.n * ne;
                    let b = &mut *st.b;
                    b.cur[..m].copy_from_slice(&b.x[..m]);
                }
            }
            let a = EncAttn {
                il,
                rope: Some(&l.rope),
                qk_norm: None,
                kq_scale: 1.0 / (hd as f32).sqrt(),
                max_alibi_bias: 0.0,
                n_swa: l.n_swa,
                rel_bias: None,
            };
            st.build_attn_enc(&l.qkv.weights(&l.wo, None), &a)?;
            st.residual();
            crate::cb!(st, "ffn_inp", il, x, ne);
            st.build_norm(&l.ffn_norm, None, Norm::Layer, self.eps);
            let f = FfnWeights { gate: None, gate_b: None, up: &l.up, up_b: None, down: &l.down, down_b: None };
            st.build_ffn(il, &f, self.act, FfnGate::Fused)?;
            st.residual();
            crate::cb!(st, "l_out", il, x, ne);
        }
        st.norm_x(&self.output_norm, None, Norm::Layer, self.eps);
        st.write_hidden();
        Ok(())
    }
}
