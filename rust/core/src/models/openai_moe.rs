//! gpt-oss (`gpt-oss`, llama.cpp's LLM_ARCH_OPENAI_MOE): a pre-norm decoder whose FFN
//! pre-norm is named `post_attention_norm`, q/k/v and attention-output biases, per-head
//! attention sinks, sliding-window attention on every other layer (even layers), NEOX rope
//! (YaRN in the released models), and a mixture of experts in every layer: router with
//! bias, the top experts by raw logit, their logits softmaxed into weights
//! (SOFTMAX_WEIGHT), experts with biases and the swiglu_oai activation (alpha 1.702, clamp
//! 7). See llama.cpp's src/models/openai-moe.cpp. The released files keep the experts in
//! MXFP4; this file runs whatever weight types the kernels support.

use super::decoder::{Decoder, DecoderConfig};
use super::graph::{Gating, MoeAct, MoeConfig};
use super::loader::Loader;
use super::{common_hparams, swa_pattern, Arch};
use crate::context::{ContextParams, Forward};
use crate::error::{Error, Result};
use crate::hparams::{HParams, Meta, RopeType};

pub struct OpenAiMoe;

impl Arch for OpenAiMoe {
    fn name(&self) -> &'static str {
        "gpt-oss"
    }

    fn moe(&self) -> bool {
        true
    }

    fn hparams(&self, meta: &Meta, n_vocab: usize) -> Result<HParams> {
        let req = |k: &str| Error::Unsupported(format!("{}: missing required metadata key '{}'", meta.file.path, meta.key(k)));
        let mut hp = common_hparams(meta, n_vocab, RopeType::Neox)?;
        if hp.n_ff_exp == 0 {
            return Err(req("expert_feed_forward_length"));
        }
        // llama.cpp builds q/k/v with heads of n_rot
        if hp.n_rot != hp.n_embd_head_k || hp.n_rot != hp.n_embd_head_v {
            return Err(Error::Unsupported(format!(
                "{}: gpt-oss needs rope.dimension_count ({}) equal to the key and value lengths ({}, {})",
                meta.file.path, hp.n_rot, hp.n_embd_head_k, hp.n_embd_head_v
            )));
        }
        hp.n_swa = meta.u("attention.sliding_window")?.ok_or_else(|| req("attention.sliding_window"))?;
        hp.swa_layers = swa_pattern(meta, hp.n_layer, 2, false)?;
        hp.rope_freq_base_swa = meta.f("rope.freq_base_swa")?.unwrap_or(hp.rope_freq_base);
        hp.rope_freq_scale_swa = hp.rope_freq_scale;
        Ok(hp)
    }

    fn type_name(&self, hp: &HParams) -> &'static str {
        match hp.n_layer {
            24 => "20B",
            36 => "120B",
            _ => "?B",
        }
    }

    fn build_forward(&self, ld: &Loader, cp: &ContextParams) -> Result<Box<dyn Forward>> {
        let hp = ld.hp();
        let cfg = DecoderConfig {
            moe: true,
            moe_cfg: MoeConfig {
                gating: Gating::SoftmaxWeight,
                act: MoeAct::SwigluOai,
                ..MoeConfig::softmax(hp.n_expert_used, false)
            },
            moe_biases: true,
            sinks: true,
            ffn_norm: "post_attention_norm",
            ..DecoderConfig::new(hp)
        };
        Ok(Box::new(Decoder::load(ld, cp, cfg)?))
    }
}
