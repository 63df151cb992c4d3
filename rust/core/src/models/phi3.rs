//! Phi-3: fused `attn_qkv` {n_embd, n_embd + 2 n_embd_gqa}, fused `ffn_up` {n_embd, 2 n_ff}
//! (SwiGLU: silu(first half) * second half), NEOX rope with optional long/short rope
//! factors. llama.cpp ignores `attention.sliding_window` for phi3 ("Phi SWA is currently
//! disabled"), so n_swa stays 0. See llama.cpp's src/models/phi3.cpp.

use super::{common_hparams, io_specs, Arch, TensorSpec};
use crate::error::Result;
use crate::hparams::{HParams, Meta, RopeType};

pub struct Phi3;

impl Arch for Phi3 {
    fn name(&self) -> &'static str {
        "phi3"
    }

    fn build_forward(
        &self,
        model: &std::sync::Arc<crate::model::Model>,
        cp: &crate::context::ContextParams,
    ) -> Result<Box<dyn crate::context::Forward>> {
        phi3_forward(model, cp)
    }

    fn hparams(&self, meta: &Meta, n_vocab: usize) -> Result<HParams> {
        common_hparams(meta, n_vocab, RopeType::Neox)
    }

    fn type_name(&self, hp: &HParams) -> &'static str {
        match hp.n_layer {
            24 => "1B",
            32 => "3B",
            40 => "14B",
            _ => "?B",
        }
    }

    fn tensors(&self, hp: &HParams) -> Vec<TensorSpec> {
        let n_embd = hp.n_embd;
        let mut v = io_specs(hp);
        for il in 0..hp.n_layer {
            // llama.cpp: {n_embd, n_embd + 2 n_embd_gqa} and wo {n_embd, n_embd}; the same for
            // real files, written with the q/k/v widths the forward pass slices by, so a file
            // whose key/value lengths disagree with its tensors fails at load.
            let n_qkv = hp.n_embd_head_k * hp.n_head(il) + hp.n_embd_k_gqa(il) + hp.n_embd_v_gqa(il);
            let n_o = hp.n_embd_head_v * hp.n_head(il);
            let b = |s: &str| format!("blk.{il}.{s}");
            v.extend([
                TensorSpec::req(b("attn_norm.weight"), &[n_embd]),
                TensorSpec::req(b("attn_qkv.weight"), &[n_embd, n_qkv]),
                TensorSpec::opt(b("attn_qkv.bias"), &[n_qkv]),
                TensorSpec::req(b("attn_output.weight"), &[n_o, n_embd]),
                TensorSpec::req(b("ffn_norm.weight"), &[n_embd]),
                TensorSpec::req(b("ffn_down.weight"), &[hp.n_ff[il], n_embd]),
                TensorSpec::req(b("ffn_up.weight"), &[n_embd, 2 * hp.n_ff[il]]),
                TensorSpec::opt(b("rope_factors_long.weight"), &[hp.n_rot / 2]),
                TensorSpec::opt(b("rope_factors_short.weight"), &[hp.n_rot / 2]),
            ]);
        }
        v
    }
}

// ---- forward pass ------------------------------------------------------------------
//
// The shared pre-norm decoder (ops/decoder.rs) with fused weights: one attn_qkv matrix
// (q, k, v rows back to back) and one ffn_up of 2 * n_ff rows (silu of the first half
// times the second half); q scaled by 1/sqrt(head) after rope, softmax scale 1 (the
// hparams keep n_swa 0, as llama.cpp does).
// LongRoPE factor tensors are not applied yet (the short/long choice depends on n_ctx).

use crate::context::{ContextParams, FfnAct, Forward};
use crate::model::Model;
use crate::ops::decoder::{Decoder, DecoderConfig};
use std::sync::Arc;

fn phi3_forward(model: &Arc<Model>, cp: &ContextParams) -> Result<Box<dyn Forward>> {
    let hp = &model.hparams;
    if model.tensor("blk.0.rope_factors_long.weight").is_some() {
        return Err(crate::error::Error::Unsupported(
            "phi3 with LongRoPE factors (rope_factors_long/short) is not supported yet".into(),
        ));
    }
    let cfg = DecoderConfig {
        embd_scale: false,
        post_norms: false,
        qk_norm: false,
        q_scale: 1.0 / (hp.n_embd_head_k as f32).sqrt(),
        kq_scale: 1.0,
        attn_softcap: 0.0,
        final_softcap: 0.0,
        act: FfnAct::SwiGlu,
        fused: true,
        attn_temp: None,
    };
    Ok(Box::new(Decoder::new(model, cp, cfg)?))
}
