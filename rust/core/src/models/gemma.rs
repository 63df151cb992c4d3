//! Gemma (1) and Gemma 2: sqrt(n_embd)-scaled embeddings, GELU(tanh)-gated FFN, NEOX
//! rope, output always tied to token_embd. Gemma 2 adds post-attention / post-FFN norms,
//! attention and final logit soft-capping and sliding-window attention on every other
//! layer (default pattern 2: even layers local, window 4096 unless the file says).
//! See llama.cpp's src/models/gemma.cpp and gemma2.cpp.

use super::decoder::{Decoder, DecoderConfig};
use super::graph::FfnAct;
use super::loader::Loader;
use super::{common_hparams, Arch};
use crate::context::{ContextParams, Forward};
use crate::error::Result;
use crate::hparams::{HParams, Meta, RopeType};

pub struct Gemma;
pub struct Gemma2;

impl Arch for Gemma {
    fn name(&self) -> &'static str {
        "gemma"
    }

    fn build_forward(&self, ld: &Loader, cp: &ContextParams) -> Result<Box<dyn Forward>> {
        let hp = ld.hp();
        let cfg = DecoderConfig { q_scale: 1.0 / (hp.n_embd_head_k as f32).sqrt(), ..gemma_config(hp) };
        Ok(Box::new(Decoder::load(ld, cp, cfg)?))
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
}

impl Arch for Gemma2 {
    fn name(&self) -> &'static str {
        "gemma2"
    }

    fn build_forward(&self, ld: &Loader, cp: &ContextParams) -> Result<Box<dyn Forward>> {
        let hp = ld.hp();
        let cfg = DecoderConfig {
            post_norms: true,
            q_scale: hp.f_attention_scale,
            attn_softcap: hp.f_attn_logit_softcapping,
            final_softcap: hp.f_final_logit_softcapping,
            ..gemma_config(hp)
        };
        Ok(Box::new(Decoder::load(ld, cp, cfg)?))
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
}

/// The Gemma traits both share: embeddings scaled by sqrt(n_embd) (token input only), q
/// scaled after rope and a softmax scale of 1, GELU(tanh)-gated FFN, output always tied.
fn gemma_config(hp: &HParams) -> DecoderConfig {
    DecoderConfig { embd_scale: true, kq_scale: 1.0, act: FfnAct::Gelu, output_opt: false, ..DecoderConfig::new(hp) }
}
