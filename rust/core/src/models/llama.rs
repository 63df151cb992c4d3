//! LLaMA family (LLaMA 1-3, Mistral 7B, SmolLM): RMSNorm, NORM rope, GQA, SwiGLU.
//!
//! The forward pass is the shared pre-norm decoder (decoder.rs) as it comes:
//! x = embd(tokens)                                      [n, n_embd]
//! per layer: cur = rmsnorm(x) * attn_norm
//!            x  += wo . attn(rope(wq cur [+ bq]), rope(wk cur [+ bk]), wv cur [+ bv]) [+ bo]
//!            cur = rmsnorm(x) * ffn_norm
//!            x  += down (silu(gate cur) * up cur)
//! logits = output . (rmsnorm(x) * output_norm)           (output tied to token_embd if absent)
//! See llama.cpp's src/models/llama.cpp.

use super::decoder::{Decoder, DecoderConfig};
use super::loader::Loader;
use super::{common_hparams, Arch};
use crate::context::{ContextParams, Forward};
use crate::error::Result;
use crate::hparams::{HParams, Meta, RopeType};

pub struct Llama;

impl Arch for Llama {
    fn name(&self) -> &'static str {
        "llama"
    }

    fn hparams(&self, meta: &Meta, n_vocab: usize) -> Result<HParams> {
        common_hparams(meta, n_vocab, RopeType::Norm)
    }

    /// src/models/llama.cpp load_arch_hparams (dense models).
    fn type_name(&self, hp: &HParams) -> &'static str {
        match hp.n_layer {
            16 | 22 => "1B",
            26 | 28 => "3B",
            30 => "256M",
            32 if hp.n_vocab == 49152 => "3B",
            32 if hp.n_vocab < 40000 => "7B",
            32 | 36 => "8B",
            40 => "13B",
            48 => "34B",
            60 => "30B",
            80 if hp.n_head(0) == hp.n_head_kv(0) => "65B",
            80 => "70B",
            _ => "?B",
        }
    }

    fn build_forward(&self, ld: &Loader, cp: &ContextParams) -> Result<Box<dyn Forward>> {
        Ok(Box::new(Decoder::load(ld, cp, DecoderConfig::new(ld.hp()))?))
    }
}
