//! EmbeddingGemma (`gemma-embedding`): Gemma 3's layer (RMSNorm pre- and post-norms,
//! per-head q/k RMSNorms, NEOX rope with a local base on sliding-window layers, q scaled
//! by 1/sqrt(head), GELU-gated feed-forward, embeddings scaled by sqrt(n_embd)) as a
//! non-causal encoder: a symmetric sliding window on layers il % 6 < 5, no KV cache,
//! the final RMSNorm'd hidden states as embeddings (llama.cpp's
//! src/models/gemma-embedding.cpp). The optional sentence-transformers dense layers
//! (`dense_2` {n_embd, d}, `dense_3` {d, n_embd}, no biases) project the pooled vectors
//! (every token's row with pooling none) after pooling, as llama.cpp's `build_dense_out`
//! (`Forward::dense_out`; the caller pools, projects, then normalises).

use super::encoder::{EncAttn, QkNorm};
use super::graph::Qkv;
use super::graph::{layer_rope, FfnAct, FfnGate, FfnWeights, Norm};
use super::loader::{Keep, Loader};
use super::modern_bert::swa_pattern;
use super::{common_hparams, Arch};
use crate::context::{ContextParams, Forward, Step};
use crate::error::{Error, Result};
use crate::hparams::{HParams, Meta, RopeType};
use crate::model::TensorView;
use crate::ops::matmul::try_matmul_rows;
use crate::ops::rope::RopeParams;
use crate::threadpool::ThreadPool;

pub struct GemmaEmbedding;

impl Arch for GemmaEmbedding {
    fn name(&self) -> &'static str {
        "gemma-embedding"
    }
    fn hparams(&self, meta: &Meta, n_vocab: usize) -> Result<HParams> {
        let mut hp = common_hparams(meta, n_vocab, RopeType::Neox)?;
        hp.causal_attn = false;
        hp.n_swa = meta.req_u("attention.sliding_window")?;
        hp.swa_layers = swa_pattern(meta, hp.n_layer, 6, false)?;
        hp.rope_freq_base_swa = meta.f("rope.freq_base_swa")?.unwrap_or(hp.rope_freq_base);
        hp.rope_freq_scale_swa = 1.0;
        if hp.f_norm_rms_eps <= 0.0 {
            return Err(Error::Unsupported(format!(
                "{}: gemma-embedding needs '{}'",
                meta.file.path,
                meta.key("attention.layer_norm_rms_epsilon")
            )));
        }
        hp.f_attention_scale = 1.0 / (hp.n_embd_head_k as f32).sqrt();
        Ok(hp)
    }
    fn type_name(&self, hp: &HParams) -> &'static str {
        if hp.n_layer == 24 {
            "0.3B"
        } else {
            "?B"
        }
    }
    fn build_forward(&self, ld: &Loader, cp: &ContextParams) -> Result<Box<dyn Forward>> {
        Ok(Box::new(GemmaEmbeddingForward::load(ld, cp)?))
    }
}

struct Layer {
    attn_norm: Vec<f32>,
    qkv: Qkv,
    q_norm: Vec<f32>,
    k_norm: Vec<f32>,
    wo: TensorView<'static>,
    attn_post_norm: Vec<f32>,
    ffn_norm: Vec<f32>,
    gate: TensorView<'static>,
    up: TensorView<'static>,
    down: TensorView<'static>,
    ffn_post_norm: Vec<f32>,
    rope: RopeParams,
    n_swa: usize,
}

struct GemmaEmbeddingForward {
    tok_embd: TensorView<'static>,
    output_norm: Vec<f32>,
    layers: Vec<Layer>,
    eps: f32,
    q_scale: f32,
    dense_2: Option<TensorView<'static>>,
    dense_3: Option<TensorView<'static>>,
    _keep: Keep,
}

impl GemmaEmbeddingForward {
    fn load(ld: &Loader, cp: &ContextParams) -> Result<GemmaEmbeddingForward> {
        let hp = ld.hp();
        let (ne, nv, hd) = (hp.n_embd, hp.n_vocab, hp.n_embd_head_k);
        // dense_2 {n_embd, d} then dense_3 {d, n_embd}: both or neither (llama.cpp asserts
        // dense_2's input and dense_3's output are n_embd; with one alone its embedding
        // rows would not be n_embd wide)
        let d = ld.model().tensor("dense_2.weight").map(|t| t.ne[1]);
        let (dense_2, dense_3) = match (d, ld.model().tensor("dense_3.weight").is_some()) {
            (None, false) => (None, None),
            (Some(d), true) => (Some(ld.req("dense_2.weight", &[ne, d])?), Some(ld.req("dense_3.weight", &[d, ne])?)),
            _ => {
                return Err(Error::Unsupported(format!(
                    "{}: gemma-embedding has only one of the sentence-transformers dense layers dense_2 / dense_3 (both or neither)",
                    ld.model().files[0].path
                )))
            }
        };
        let mut layers = Vec::with_capacity(hp.n_layer);
        for il in 0..hp.n_layer {
            let b = |s: &str| format!("blk.{il}.{s}");
            let n_ff = hp.n_ff[il];
            let nq = hd * hp.n_head(il);
            layers.push(Layer {
                attn_norm: ld.req_vec(&b("attn_norm.weight"), &[ne])?,
                qkv: Qkv::load(ld, il, ne, nq, hp.n_embd_k_gqa(il), hp.n_embd_v_gqa(il))?,
                q_norm: ld.req_vec(&b("attn_q_norm.weight"), &[hd])?,
                k_norm: ld.req_vec(&b("attn_k_norm.weight"), &[hd])?,
                wo: ld.req(&b("attn_output.weight"), &[nq, ne])?,
                attn_post_norm: ld.req_vec(&b("post_attention_norm.weight"), &[ne])?,
                ffn_norm: ld.req_vec(&b("ffn_norm.weight"), &[ne])?,
                gate: ld.req(&b("ffn_gate.weight"), &[ne, n_ff])?,
                up: ld.req(&b("ffn_up.weight"), &[ne, n_ff])?,
                down: ld.req(&b("ffn_down.weight"), &[n_ff, ne])?,
                ffn_post_norm: ld.req_vec(&b("post_ffw_norm.weight"), &[ne])?,
                rope: layer_rope(hp, cp, il, None),
                n_swa: if hp.swa_layers[il] { hp.n_swa } else { 0 },
            });
        }
        Ok(GemmaEmbeddingForward {
            tok_embd: ld.req("token_embd.weight", &[ne, nv])?,
            output_norm: ld.req_vec("output_norm.weight", &[ne])?,
            layers,
            eps: hp.f_norm_rms_eps,
            q_scale: hp.f_attention_scale,
            dense_2,
            dense_3,
            _keep: ld.keep(),
        })
    }
}

impl Forward for GemmaEmbeddingForward {
    fn rope(&self, il: usize) -> Option<&RopeParams> {
        self.layers.get(il).map(|l| &l.rope)
    }
    fn encoder(&self) -> bool {
        true
    }
    fn dense_out(&self, pool: &ThreadPool, x: &[f32], n: usize) -> Result<Option<Vec<f32>>> {
        let (Some(d2), Some(d3)) = (&self.dense_2, &self.dense_3) else { return Ok(None) };
        let (ne, d) = (d2.ne[0], d2.n_rows());
        if x.len() != n * ne {
            return Err(Error::Invalid(format!("dense_out: expected [{n}, {ne}] vectors, got {} values", x.len())));
        }
        let mut scratch = Vec::new();
        let mut mid = vec![0f32; n * d];
        try_matmul_rows(pool, d2, x, n, &mut mid, d, 0..d, &mut scratch)?;
        let mut out = vec![0f32; n * ne];
        try_matmul_rows(pool, d3, &mid, n, &mut out, ne, 0..ne, &mut scratch)?;
        Ok(Some(out))
    }
    fn forward(&self, st: &mut Step) -> Result<()> {
        let ne = st.hp.n_embd;
        let scale = if st.tokens.is_some() { (ne as f32).sqrt() } else { 1.0 };
        st.build_inp_embd(&self.tok_embd, scale)?;
        crate::cb!(st, "inp_scaled", -1, x, ne);
        for (il, l) in self.layers.iter().enumerate() {
            st.build_norm(&l.attn_norm, None, Norm::Rms, self.eps);
            let a = EncAttn {
                il,
                rope: Some(&l.rope),
                qk_norm: Some(QkNorm::RmsHead { q: &l.q_norm, k: &l.k_norm, eps: self.eps }),
                kq_scale: self.q_scale,
                max_alibi_bias: 0.0,
                n_swa: l.n_swa,
                rel_bias: None,
            };
            st.build_attn_enc(&l.qkv.weights(&l.wo, None), &a)?;
            st.build_post_norm(&l.attn_post_norm, self.eps);
            st.residual();
            st.build_norm(&l.ffn_norm, None, Norm::Rms, self.eps);
            let f = FfnWeights { gate: Some(&l.gate), gate_b: None, up: &l.up, up_b: None, down: &l.down, down_b: None };
            st.build_ffn(il, &f, FfnAct::Gelu, FfnGate::Par)?;
            st.build_post_norm(&l.ffn_post_norm, self.eps);
            st.residual();
            st.build_cvec(il);
            crate::cb!(st, "l_out", il, x, ne);
        }
        st.norm_x(&self.output_norm, None, Norm::Rms, self.eps);
        st.write_hidden();
        Ok(())
    }
}
