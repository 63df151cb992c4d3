//! Gemma 3: sqrt(n_embd)-scaled embeddings, pre+post norms around attention and FFN,
//! per-head Q/K RMSNorm, NEOX rope (10000 on sliding-window layers, the file's base on
//! global ones), 5 local : 1 global layers, GELU(tanh)-gated FFN. See llama.cpp's
//! src/models/gemma3.cpp.
//!
//! The forward pass is the shared pre-norm decoder (decoder.rs) configured so:
//! x = embd(tokens) * sqrt(n_embd)                                   [n, n_embd]
//! per layer: cur = rmsnorm(x) * attn_norm
//!            q, k = rmsnorm per head (q_norm, k_norm); NEOX rope (base 10000 on
//!            sliding-window layers, the file's on global ones); q *= f_attention_scale
//!            att  = attention (window n_swa on local layers), wo
//!            x   += rmsnorm(att) * post_attention_norm
//!            cur  = rmsnorm(x) * ffn_norm
//!            x   += rmsnorm(down(gelu_tanh(gate cur) * up cur)) * post_ffw_norm
//! logits = output . (rmsnorm(x) * output_norm)  [+ final softcap when the file has one]

use super::decoder::{Decoder, DecoderConfig};
use super::graph::FfnAct;
use super::loader::Loader;
use super::{common_hparams, Arch};
use crate::context::{ContextParams, Forward};
use crate::error::Result;
use crate::hparams::{HParams, Meta, RopeType};

pub struct Gemma3;

impl Arch for Gemma3 {
    fn name(&self) -> &'static str {
        "gemma3"
    }

    fn hparams(&self, meta: &Meta, n_vocab: usize) -> Result<HParams> {
        let mut hp = common_hparams(meta, n_vocab, RopeType::Neox)?;
        // llama.cpp: load_swa_pattern(ml, 6) when the file has a window -> layers il % 6 < 5
        // use it (a per-layer bool array as given; a pattern of 0: every layer); no window
        // (or 0): no sliding-window layers
        hp.n_swa = meta.u("attention.sliding_window")?.unwrap_or(0);
        if hp.n_swa > 0 {
            hp.swa_layers = super::swa_pattern(meta, hp.n_layer, 6, false)?;
        }
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

    fn build_forward(&self, ld: &Loader, cp: &ContextParams) -> Result<Box<dyn Forward>> {
        let hp = ld.hp();
        let cfg = DecoderConfig {
            embd_scale: true,
            post_norms: true,
            qk_norm: true,
            q_scale: hp.f_attention_scale,
            kq_scale: 1.0,
            final_softcap: hp.f_final_logit_softcapping,
            act: FfnAct::Gelu,
            ..DecoderConfig::new(hp)
        };
        Ok(Box::new(Decoder::load(ld, cp, cfg)?))
    }
}
