//! PhiMoE (Phi-3.5-MoE): Phi-3's decoder (NEOX rope, q scaled by 1/sqrt(head) after rope)
//! with RMS norms that have biases (attention, FFN and output norms), attention-output and
//! output biases, and a softmax-routed mixture of experts of width `feed_forward_length` in
//! every layer (selected weights renormalized). llama.cpp runs it with src/models/phi3.cpp's
//! graph (load_arch_tensors in phimoe.cpp). LongRoPE factors are refused, as for phi3.

use super::decoder::{Decoder, DecoderConfig};
use super::loader::Loader;
use super::{common_hparams, Arch};
use crate::context::{ContextParams, Forward};
use crate::error::{Error, Result};
use crate::hparams::{HParams, Meta, RopeType};

pub struct PhiMoe;

impl Arch for PhiMoe {
    fn name(&self) -> &'static str {
        "phimoe"
    }

    fn moe(&self) -> bool {
        true
    }

    fn hparams(&self, meta: &Meta, n_vocab: usize) -> Result<HParams> {
        let mut hp = common_hparams(meta, n_vocab, RopeType::Neox)?;
        // the experts' width is n_ff (llama.cpp's load_arch_tensors)
        hp.n_ff_exp = hp.n_ff.first().copied().unwrap_or(0);
        Ok(hp)
    }

    fn type_name(&self, hp: &HParams) -> &'static str {
        match hp.n_layer {
            32 => "16x3.8B",
            _ => "?B",
        }
    }

    fn build_forward(&self, ld: &Loader, cp: &ContextParams) -> Result<Box<dyn Forward>> {
        let hp = ld.hp();
        let mut long_rope = false;
        for il in 0..hp.n_layer {
            for s in ["rope_factors_long", "rope_factors_short"] {
                long_rope |= ld.opt(&format!("blk.{il}.{s}.weight"), &[hp.n_rot / 2])?.is_some();
            }
        }
        if long_rope && !ld.checking() {
            return Err(Error::Unsupported("phimoe with LongRoPE factors (rope_factors_long/short) is not supported yet".into()));
        }
        let cfg = DecoderConfig {
            q_scale: 1.0 / (hp.n_embd_head_k as f32).sqrt(),
            kq_scale: 1.0,
            moe: true,
            norm_bias: true,
            ..DecoderConfig::new(hp)
        };
        Ok(Box::new(Decoder::load(ld, cp, cfg)?))
    }
}
