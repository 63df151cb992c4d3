//! Gemma (1) and Gemma 2: sqrt(n_embd)-scaled embeddings, GELU(tanh)-gated FFN, NEOX
//! rope, output always tied to token_embd. Gemma 2 adds post-attention / post-FFN norms,
//! attention and final logit soft-capping and sliding-window attention on every other
//! layer (default pattern 2: even layers local, window 4096 unless the file says).
//! See llama.cpp's src/models/gemma.cpp and gemma2.cpp.

use super::{common_hparams, qkv_specs, Arch, TensorSpec};
use crate::error::Result;
use crate::hparams::{HParams, Meta, RopeType};

pub struct Gemma;
pub struct Gemma2;

fn specs(hp: &HParams, post_norms: bool) -> Vec<TensorSpec> {
    let n_embd = hp.n_embd;
    let mut v = vec![
        TensorSpec::req("token_embd.weight", &[n_embd, hp.n_vocab]),
        TensorSpec::req("output_norm.weight", &[n_embd]),
    ];
    for il in 0..hp.n_layer {
        let n_q = hp.n_embd_head_k * hp.n_head(il);
        let n_ff = hp.n_ff[il];
        let b = |s: &str| format!("blk.{il}.{s}");
        v.push(TensorSpec::req(b("attn_norm.weight"), &[n_embd]));
        v.extend(qkv_specs(il, n_embd, n_q, hp.n_embd_k_gqa(il), hp.n_embd_v_gqa(il)));
        v.push(TensorSpec::req(b("attn_output.weight"), &[n_q, n_embd]));
        if post_norms {
            v.push(TensorSpec::req(b("post_attention_norm.weight"), &[n_embd]));
        }
        v.extend([
            TensorSpec::req(b("ffn_norm.weight"), &[n_embd]),
            TensorSpec::req(b("ffn_gate.weight"), &[n_embd, n_ff]),
            TensorSpec::req(b("ffn_up.weight"), &[n_embd, n_ff]),
            TensorSpec::req(b("ffn_down.weight"), &[n_ff, n_embd]),
        ]);
        if post_norms {
            v.push(TensorSpec::req(b("post_ffw_norm.weight"), &[n_embd]));
        }
    }
    v
}

impl Arch for Gemma {
    fn name(&self) -> &'static str {
        "gemma"
    }

    fn build_forward(
        &self,
        model: &std::sync::Arc<crate::model::Model>,
        cp: &crate::context::ContextParams,
    ) -> Result<Box<dyn crate::context::Forward>> {
        gemma_forward(model, cp)
    }

    fn hparams(&self, meta: &Meta, n_vocab: usize) -> Result<HParams> {
        common_hparams(meta, n_vocab, RopeType::Neox)
    }

    fn type_name(&self, hp: &HParams) -> &'static str {
        match hp.n_layer {
            18 => "2B",
            28 => "7B",
            _ => "?B",
        }
    }

    fn tensors(&self, hp: &HParams) -> Vec<TensorSpec> {
        specs(hp, false)
    }
}

impl Arch for Gemma2 {
    fn name(&self) -> &'static str {
        "gemma2"
    }

    fn build_forward(
        &self,
        model: &std::sync::Arc<crate::model::Model>,
        cp: &crate::context::ContextParams,
    ) -> Result<Box<dyn crate::context::Forward>> {
        gemma2_forward(model, cp)
    }

    fn hparams(&self, meta: &Meta, n_vocab: usize) -> Result<HParams> {
        let mut hp = common_hparams(meta, n_vocab, RopeType::Neox)?;
        hp.n_swa = meta.u("attention.sliding_window")?.unwrap_or(4096);
        // llama.cpp: load_swa_pattern(ml, 2): layers il % 2 == 0 use the sliding window.
        let pattern = meta.u("attention.sliding_window_pattern")?.unwrap_or(2).max(1);
        hp.swa_layers = (0..hp.n_layer).map(|il| hp.n_swa > 0 && il % pattern < pattern - 1).collect();
        hp.rope_freq_base_swa = meta.f("rope.freq_base_swa")?.unwrap_or(hp.rope_freq_base);
        hp.rope_freq_scale_swa = hp.rope_freq_scale;
        // The 27B model (46 layers) scales queries by n_embd / n_head, the others by the head size.
        hp.f_attention_scale = if hp.n_layer == 46 {
            1.0 / ((hp.n_embd / hp.n_head(0)) as f32).sqrt()
        } else {
            1.0 / (hp.n_embd_head_k as f32).sqrt()
        };
        Ok(hp)
    }

    fn type_name(&self, hp: &HParams) -> &'static str {
        match hp.n_layer {
            26 => "2B",
            42 => "9B",
            46 => "27B",
            _ => "?B",
        }
    }

    fn tensors(&self, hp: &HParams) -> Vec<TensorSpec> {
        specs(hp, true)
    }
}

// ---- forward pass ------------------------------------------------------------------
//
// The shared pre-norm decoder (ops/decoder.rs) with the Gemma traits: embeddings scaled
// by sqrt(n_embd) (token input only), q scaled after rope (1/sqrt(head) for Gemma,
// f_attention_scale for Gemma 2) and a softmax scale of 1, GELU(tanh)-gated FFN. Gemma 2
// adds post-norms, tanh soft-capping of the attention scores and of the final logits,
// and the sliding window on its local layers.

use crate::context::{ContextParams, FfnAct, Forward};
use crate::model::Model;
use crate::ops::decoder::{Decoder, DecoderConfig};
use std::sync::Arc;

fn gemma_forward(model: &Arc<Model>, cp: &ContextParams) -> Result<Box<dyn Forward>> {
    let hp = &model.hparams;
    let cfg = DecoderConfig {
        embd_scale: true,
        post_norms: false,
        qk_norm: false,
        q_scale: 1.0 / (hp.n_embd_head_k as f32).sqrt(),
        kq_scale: 1.0,
        attn_softcap: 0.0,
        final_softcap: 0.0,
        act: FfnAct::GeGlu,
        fused: false,
    };
    Ok(Box::new(Decoder::new(model, cp, cfg)?))
}

fn gemma2_forward(model: &Arc<Model>, cp: &ContextParams) -> Result<Box<dyn Forward>> {
    let hp = &model.hparams;
    let cfg = DecoderConfig {
        embd_scale: true,
        post_norms: true,
        qk_norm: false,
        q_scale: hp.f_attention_scale,
        kq_scale: 1.0,
        attn_softcap: hp.f_attn_logit_softcapping,
        final_softcap: hp.f_final_logit_softcapping,
        act: FfnAct::GeGlu,
        fused: false,
    };
    Ok(Box::new(Decoder::new(model, cp, cfg)?))
}
