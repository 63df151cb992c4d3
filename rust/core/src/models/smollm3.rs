//! SmolLM3: LLaMA's decoder (RMSNorm, NORM rope, GQA, SwiGLU, output tied to token_embd
//! when absent) where every fourth layer has no rotary embedding (NoPE: layers with
//! (il + 1) % 4 == 0 attend to unrotated q and k). See llama.cpp's src/models/smollm3.cpp.

use super::decoder::{Decoder, DecoderConfig};
use super::loader::Loader;
use super::{common_hparams, Arch};
use crate::context::{ContextParams, Forward};
use crate::error::Result;
use crate::hparams::{HParams, Meta, RopeType};

pub struct Smollm3;

impl Arch for Smollm3 {
    fn name(&self) -> &'static str {
        "smollm3"
    }

    fn hparams(&self, meta: &Meta, n_vocab: usize) -> Result<HParams> {
        common_hparams(meta, n_vocab, RopeType::Norm)
    }

    fn type_name(&self, hp: &HParams) -> &'static str {
        match hp.n_layer {
            36 => "3B",
            _ => "?B",
        }
    }

    fn build_forward(&self, ld: &Loader, cp: &ContextParams) -> Result<Box<dyn Forward>> {
        // llama.cpp: hparams.n_no_rope_layer_step = 4 (not read from the file)
        Ok(Box::new(Decoder::load(ld, cp, DecoderConfig { no_rope_layer_step: 4, ..DecoderConfig::new(ld.hp()) })?))
    }
}
