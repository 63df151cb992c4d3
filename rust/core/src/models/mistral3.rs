//! Mistral 3 (Ministral / Mistral Small 3.x text model): LLaMA-like (RMSNorm, NORM rope,
//! GQA, SwiGLU) with YaRN rope scaling and Llama-4-style query temperature scaling
//! (`attention.temperature_scale`, floor scale = `rope.scaling.original_context_length`).
//! See llama.cpp's src/models/mistral3.cpp.

use super::decoder::{Decoder, DecoderConfig};
use super::loader::Loader;
use super::{common_hparams, Arch};
use crate::context::{ContextParams, Forward};
use crate::error::{Error, Result};
use crate::hparams::{HParams, Meta, RopeType};

pub struct Mistral3;

impl Arch for Mistral3 {
    fn name(&self) -> &'static str {
        "mistral3"
    }

    /// LLaMA's decoder with YaRN rope scaling from the file (graph.rs `layer_rope`) and,
    /// when `attention.temperature_scale` is set, q *= 1 + scale * ln(1 + floor(pos / n_ctx_orig)).
    fn build_forward(&self, ld: &Loader, cp: &ContextParams) -> Result<Box<dyn Forward>> {
        let hp = ld.hp();
        let attn_temp = (hp.f_attn_temp_scale != 0.0).then_some((hp.f_attn_temp_scale, hp.n_attn_temp_floor_scale, 0.0));
        Ok(Box::new(Decoder::load(ld, cp, DecoderConfig { attn_temp, ..DecoderConfig::new(hp) })?))
    }

    fn hparams(&self, meta: &Meta, n_vocab: usize) -> Result<HParams> {
        let mut hp = common_hparams(meta, n_vocab, RopeType::Norm)?;
        hp.f_attn_temp_scale = meta.f("attention.temperature_scale")?.unwrap_or(0.0);
        if hp.f_attn_temp_scale != 0.0 {
            hp.n_attn_temp_floor_scale = hp.n_ctx_orig_yarn;
            if hp.n_attn_temp_floor_scale == 0 {
                return Err(Error::Unsupported(format!(
                    "{}: invalid n_ctx_orig_yarn (0) for attention temperature scaling",
                    meta.file.path
                )));
            }
        }
        Ok(hp)
    }

    fn type_name(&self, hp: &HParams) -> &'static str {
        match hp.n_layer {
            26 => "3B",
            34 => "8B",
            40 => "14B",
            _ => "?B",
        }
    }
}
