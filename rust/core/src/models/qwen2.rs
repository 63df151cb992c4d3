//! Qwen2 / Qwen2.5 (q/k/v biases) and Qwen3 (per-head Q/K RMSNorm, head size from
//! `attention.key_length`): RMSNorm, NEOX rope, GQA, SwiGLU. See llama.cpp's
//! src/models/qwen2.cpp, qwen3.cpp and qwen3moe.cpp. Qwen3-MoE is Qwen3 with mixture-of-
//! experts feed-forward layers (the shared decoder runs them, see graph.rs `build_moe_ffn`).

use super::decoder::{Decoder, DecoderConfig};
use super::loader::Loader;
use super::{common_hparams, Arch};
use crate::context::{ContextParams, Forward};
use crate::error::Result;
use crate::hparams::{HParams, Meta, RopeType};

pub struct Qwen2;
pub struct Qwen3;
pub struct Qwen3Moe;

impl Arch for Qwen2 {
    fn name(&self) -> &'static str {
        "qwen2"
    }

    fn build_forward(&self, ld: &Loader, cp: &ContextParams) -> Result<Box<dyn Forward>> {
        Ok(Box::new(Decoder::load(ld, cp, DecoderConfig::new(ld.hp()))?))
    }

    fn hparams(&self, meta: &Meta, n_vocab: usize) -> Result<HParams> {
        common_hparams(meta, n_vocab, RopeType::Neox)
    }

    fn type_name(&self, hp: &HParams) -> &'static str {
        match hp.n_layer {
            24 if hp.n_embd == 1024 => "0.5B",
            24 => "1B",
            28 if hp.n_embd == 1536 => "1.5B",
            28 | 32 => "7B",
            36 => "3B",
            40 if hp.n_head(0) == 20 => "4B",
            40 => "13B",
            48 => "14B",
            64 => "32B",
            80 => "70B",
            _ => "?B",
        }
    }

}

impl Arch for Qwen3 {
    fn name(&self) -> &'static str {
        "qwen3"
    }

    fn build_forward(&self, ld: &Loader, cp: &ContextParams) -> Result<Box<dyn Forward>> {
        Ok(Box::new(Decoder::load(ld, cp, DecoderConfig { qk_norm: true, cls_out: true, ..DecoderConfig::new(ld.hp()) })?))
    }

    fn hparams(&self, meta: &Meta, n_vocab: usize) -> Result<HParams> {
        common_hparams(meta, n_vocab, RopeType::Neox)
    }

    fn type_name(&self, hp: &HParams) -> &'static str {
        match hp.n_layer {
            28 if hp.n_embd == 1024 => "0.6B",
            28 => "1.7B",
            36 if hp.n_embd == 2560 => "4B",
            36 => "8B",
            40 => "14B",
            64 => "32B",
            _ => "?B",
        }
    }

}

impl Arch for Qwen3Moe {
    fn name(&self) -> &'static str {
        "qwen3moe"
    }

    fn moe(&self) -> bool {
        true
    }

    fn build_forward(&self, ld: &Loader, cp: &ContextParams) -> Result<Box<dyn Forward>> {
        Ok(Box::new(Decoder::load(ld, cp, DecoderConfig { qk_norm: true, moe: true, ..DecoderConfig::new(ld.hp()) })?))
    }

    fn hparams(&self, meta: &Meta, n_vocab: usize) -> Result<HParams> {
        let mut hp = common_hparams(meta, n_vocab, RopeType::Neox)?;
        if hp.n_expert == 0 || hp.n_expert_used == 0 || hp.n_expert_used > hp.n_expert {
            return Err(crate::error::Error::Unsupported(format!(
                "{}: qwen3moe needs expert_count > 0 and 0 < expert_used_count <= expert_count (got {} and {})",
                meta.file.path, hp.n_expert, hp.n_expert_used
            )));
        }
        if hp.n_ff_exp == 0 {
            hp.n_ff_exp = hp.n_ff.first().copied().unwrap_or(0) / hp.n_expert_used;
        }
        // the dense width is unused; the scratch buffers hold the experts' width
        for f in hp.n_ff.iter_mut() {
            *f = (*f).max(hp.n_ff_exp);
        }
        Ok(hp)
    }

    fn type_name(&self, hp: &HParams) -> &'static str {
        match hp.n_layer {
            48 => "30B.A3B",
            94 => "235B.A22B",
            _ => "?B",
        }
    }

}
