//! Gemma 3: sqrt(n_embd)-scaled embeddings, pre+post norms around attention and FFN,
//! per-head Q/K RMSNorm, NEOX rope (10000 on sliding-window layers, the file's base on
//! global ones), 5 local : 1 global layers, GELU(tanh)-gated FFN. See llama.cpp's
//! src/models/gemma3.cpp.
//!
//! The forward pass is the shared pre-norm decoder (ops/decoder.rs) configured so:
//! x = embd(tokens) * sqrt(n_embd)                                   [n, n_embd]
//! per layer: cur = rmsnorm(x) * attn_norm
//!            q, k = rmsnorm per head (q_norm, k_norm); NEOX rope (base 10000 on
//!            sliding-window layers, the file's on global ones); q *= f_attention_scale
//!            att  = attention (window n_swa on local layers), wo
//!            x   += rmsnorm(att) * post_attention_norm
//!            cur  = rmsnorm(x) * ffn_norm
//!            x   += rmsnorm(down(gelu_tanh(gate cur) * up cur)) * post_ffw_norm
//! logits = output . (rmsnorm(x) * output_norm)  [+ final softcap when the file has one]

use super::{common_hparams, io_specs, Arch, TensorSpec};
use crate::context::{ContextParams, FfnAct, Forward};
use crate::ops::decoder::{Decoder, DecoderConfig};
use crate::error::Result;
use crate::hparams::{HParams, Meta, RopeType};
use crate::model::Model;
use std::sync::Arc;

pub struct Gemma3;

impl Arch for Gemma3 {
    fn name(&self) -> &'static str {
        "gemma3"
    }

    fn hparams(&self, meta: &Meta, n_vocab: usize) -> Result<HParams> {
        let mut hp = common_hparams(meta, n_vocab, RopeType::Neox)?;
        // llama.cpp: set_swa_pattern(6) -> layers il % 6 < 5 use the sliding window.
        hp.n_swa = meta.u("attention.sliding_window")?.unwrap_or(0);
        let pattern = meta.u("attention.sliding_window_pattern")?.unwrap_or(6).max(1);
        hp.swa_layers = (0..hp.n_layer).map(|il| hp.n_swa > 0 && il % pattern < pattern - 1).collect();
        hp.rope_freq_base_swa = meta.f("rope.freq_base_swa")?.unwrap_or(10000.0);
        hp.rope_freq_scale_swa = 1.0;
        // Only the 27B model scales by n_embd/n_head; every other size by the key length.
        hp.f_attention_scale = if hp.n_layer == 62 {
            1.0 / ((hp.n_embd / hp.n_head(0)) as f32).sqrt()
        } else {
            1.0 / (hp.n_embd_head_k as f32).sqrt()
        };
        Ok(hp)
    }

    /// src/models/gemma3.cpp load_arch_hparams.
    fn type_name(&self, hp: &HParams) -> &'static str {
        match hp.n_layer {
            18 => "270M",
            26 => "1B",
            32 => "8B",
            34 => "4B",
            48 => "12B",
            62 => "27B",
            _ => "?B",
        }
    }

    fn tensors(&self, hp: &HParams) -> Vec<TensorSpec> {
        let n_embd = hp.n_embd;
        let mut v = io_specs(hp);
        for il in 0..hp.n_layer {
            let n_q = hp.n_embd_head_k * hp.n_head(il);
            let n_ff = hp.n_ff[il];
            let b = |s: &str| format!("blk.{il}.{s}");
            v.extend([
                TensorSpec::req(b("attn_norm.weight"), &[n_embd]),
                TensorSpec::req(b("attn_q.weight"), &[n_embd, n_q]),
                TensorSpec::req(b("attn_k.weight"), &[n_embd, hp.n_embd_k_gqa(il)]),
                TensorSpec::req(b("attn_v.weight"), &[n_embd, hp.n_embd_v_gqa(il)]),
                TensorSpec::req(b("attn_output.weight"), &[hp.n_embd_head_v * hp.n_head(il), n_embd]),
                TensorSpec::req(b("attn_q_norm.weight"), &[hp.n_embd_head_k]),
                TensorSpec::req(b("attn_k_norm.weight"), &[hp.n_embd_head_k]),
                TensorSpec::req(b("post_attention_norm.weight"), &[n_embd]),
                TensorSpec::req(b("ffn_norm.weight"), &[n_embd]),
                TensorSpec::req(b("ffn_gate.weight"), &[n_embd, n_ff]),
                TensorSpec::req(b("ffn_up.weight"), &[n_embd, n_ff]),
                TensorSpec::req(b("ffn_down.weight"), &[n_ff, n_embd]),
                TensorSpec::req(b("post_ffw_norm.weight"), &[n_embd]),
            ]);
        }
        v
    }

    fn build_forward(&self, model: &Arc<Model>, cp: &ContextParams) -> Result<Box<dyn Forward>> {
        let hp = &model.hparams;
        let cfg = DecoderConfig {
            embd_scale: true,
            post_norms: true,
            qk_norm: true,
            q_scale: hp.f_attention_scale,
            kq_scale: 1.0,
            attn_softcap: 0.0,
            final_softcap: hp.f_final_logit_softcapping,
            act: FfnAct::GeGlu,
            fused: false,
            attn_temp: None,
        };
        Ok(Box::new(Decoder::new(model, cp, cfg)?))
    }
}
