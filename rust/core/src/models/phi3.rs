//! Phi-3: fused `attn_qkv` {n_embd, n_embd + 2 n_embd_gqa}, fused `ffn_up` {n_embd, 2 n_ff}
//! (SwiGLU: silu(first half) * second half), NEOX rope with optional long/short rope
//! factors. llama.cpp ignores `attention.sliding_window` for phi3 ("Phi SWA is currently
//! disabled"), so n_swa stays 0. See llama.cpp's src/models/phi3.cpp.

use super::decoder::{Decoder, DecoderConfig};
use super::loader::Loader;
use super::{common_hparams, Arch};
use crate::context::{ContextParams, Forward};
use crate::error::{Error, Result};
use crate::hparams::{HParams, Meta, RopeType};

pub struct Phi3;

impl Arch for Phi3 {
    fn name(&self) -> &'static str {
        "phi3"
    }

    /// The shared decoder with fused weights: one attn_qkv {n_embd, n_q + n_k + n_v} (q, k,
    /// v rows back to back, optional bias) and one ffn_up {n_embd, 2 n_ff} (silu of the
    /// first half times the second half); q scaled by 1/sqrt(head) after rope, softmax
    /// scale 1 (the hparams keep n_swa 0, as llama.cpp does).
    fn build_forward(&self, ld: &Loader, cp: &ContextParams) -> Result<Box<dyn Forward>> {
        let hp = ld.hp();
        // LongRoPE factors are bound (and shape-checked) but not applied yet: the short/long
        // choice depends on n_ctx
        let mut long_rope = false;
        for il in 0..hp.n_layer {
            for s in ["rope_factors_long", "rope_factors_short"] {
                long_rope |= ld.opt(&format!("blk.{il}.{s}.weight"), &[hp.n_rot / 2])?.is_some();
            }
        }
        if long_rope && !ld.checking() {
            return Err(Error::Unsupported("phi3 with LongRoPE factors (rope_factors_long/short) is not supported yet".into()));
        }
        let cfg = DecoderConfig { q_scale: 1.0 / (hp.n_embd_head_k as f32).sqrt(), kq_scale: 1.0, fused_up: true, ..DecoderConfig::new(hp) };
        Ok(Box::new(Decoder::load(ld, cp, cfg)?))
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
}
