//! Granite (IBM Granite 3.x dense): LLaMA's decoder with four scales from the file: input
//! embeddings times `embedding_scale`, each block's output times `residual_scale` before
//! the residual add, `attention.scale` as the softmax scale and the logits divided by
//! `logit_scale`; optional attention-output and FFN biases; `rope.scaling.finetuned` = false
//! turns rope off in every layer. See llama.cpp's src/models/granite.cpp (the hybrid,
//! LongRoPE and vision deepstack variants are not here).
//!
//! Granite MoE (`granitemoe`, Granite 3.x MoE and, with `expert_shared_feed_forward_length`,
//! the shared-expert variant): the same graph with a softmax-routed mixture of experts of
//! width `feed_forward_length` in every layer (selected weights renormalized), plus the
//! shared expert when the file has one (llama.cpp's granite-moe.cpp loads it, granite.cpp's
//! graph runs it).

use super::decoder::{Decoder, DecoderConfig};
use super::loader::Loader;
use super::{common_hparams, Arch};
use crate::context::{ContextParams, Forward};
use crate::error::{Error, Result};
use crate::hparams::{HParams, Meta, RopeType};

pub struct Granite;
pub struct GraniteMoe;

impl Arch for Granite {
    fn name(&self) -> &'static str {
        "granite"
    }

    fn hparams(&self, meta: &Meta, n_vocab: usize) -> Result<HParams> {
        let mut hp = common_hparams(meta, n_vocab, RopeType::Norm)?;
        hp.f_attention_scale = meta.f("attention.scale")?.unwrap_or(0.0);
        scales(meta)?; // logit_scale is required: refuse its absence at load
        Ok(hp)
    }

    fn type_name(&self, hp: &HParams) -> &'static str {
        match (hp.n_layer, hp.n_embd) {
            (32, _) => "3B",
            (40, 2048) => "2B",
            (40, 2560) => "3B",
            (40, 4096) => "8B",
            (64, _) => "30B",
            _ => "?B",
        }
    }

    fn build_forward(&self, ld: &Loader, cp: &ContextParams) -> Result<Box<dyn Forward>> {
        let hp = ld.hp();
        let meta = Meta { file: &ld.model().files[0], arch: &hp.arch };
        let s = scales(&meta)?;
        let cfg = DecoderConfig {
            embd_mult: s.embedding,
            residual_scale: s.residual,
            logit_scale: 1.0 / s.logit,
            // llama.cpp: rope_finetuned (default true) is granite's switch for rope
            no_rope_layer_step: if s.rope { 0 } else { 1 },
            ..DecoderConfig::new(hp)
        };
        Ok(Box::new(Decoder::load(ld, cp, cfg)?))
    }
}

impl Arch for GraniteMoe {
    fn name(&self) -> &'static str {
        "granitemoe"
    }

    fn moe(&self) -> bool {
        true
    }

    fn hparams(&self, meta: &Meta, n_vocab: usize) -> Result<HParams> {
        let mut hp = Granite.hparams(meta, n_vocab)?;
        // the experts' width is n_ff (llama.cpp's load_arch_tensors)
        hp.n_ff_exp = hp.n_ff.first().copied().unwrap_or(0);
        hp.n_ff_shexp = meta.u("expert_shared_feed_forward_length")?.unwrap_or(0);
        Ok(hp)
    }

    fn type_name(&self, hp: &HParams) -> &'static str {
        match hp.n_layer {
            24 => "1B.A400M",
            32 => "3B.A800M",
            _ => "?B",
        }
    }

    fn build_forward(&self, ld: &Loader, cp: &ContextParams) -> Result<Box<dyn Forward>> {
        let hp = ld.hp();
        let meta = Meta { file: &ld.model().files[0], arch: &hp.arch };
        let s = scales(&meta)?;
        let cfg = DecoderConfig {
            embd_mult: s.embedding,
            residual_scale: s.residual,
            logit_scale: 1.0 / s.logit,
            no_rope_layer_step: if s.rope { 0 } else { 1 },
            moe: true,
            shexp: hp.n_ff_shexp > 0,
            ..DecoderConfig::new(hp)
        };
        Ok(Box::new(Decoder::load(ld, cp, cfg)?))
    }
}

struct Scales {
    embedding: f32,
    residual: f32,
    logit: f32,
    rope: bool,
}

/// The keys llama.cpp's llama_model_granite::load_arch_hparams reads beyond the common ones
/// (0 = absent for the optional scales, which then do nothing).
fn scales(meta: &Meta) -> Result<Scales> {
    let logit = meta.f("logit_scale")?.ok_or_else(|| {
        Error::Unsupported(format!("{}: missing required metadata key '{}'", meta.file.path, meta.key("logit_scale")))
    })?;
    if logit == 0.0 || !logit.is_finite() {
        return Err(Error::Unsupported(format!("{}: '{}' must be a non-zero number", meta.file.path, meta.key("logit_scale"))));
    }
    let nz = |v: Option<f32>| v.filter(|&x| x != 0.0).unwrap_or(1.0);
    let rope = match meta.get("rope.scaling.finetuned") {
        None => true,
        Some(v) => v.as_bool().ok_or_else(|| {
            Error::Unsupported(format!("{}: '{}' must be a bool", meta.file.path, meta.key("rope.scaling.finetuned")))
        })?,
    };
    Ok(Scales { embedding: nz(meta.f("embedding_scale")?), residual: nz(meta.f("residual_scale")?), logit, rope })
}
