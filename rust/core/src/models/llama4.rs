//! Llama 4 (Scout, Maverick): LLaMA's decoder with iRoPE, every fourth layer without rope
//! (NoPE) and with full attention, the other three rotated and attending within chunks of
//! 8192 positions (llama.cpp's LLAMA_SWA_TYPE_CHUNKED); a weightless per-head RMSNorm of q
//! and k after rope on the rotated layers (not on Maverick's 128-expert model); attention
//! temperature tuning of q on the NoPE layers (q *= 1 + 0.1 ln(1 + floor((pos + 1) / 8192)));
//! mixture-of-experts feed-forward every `interleave_moe_layer_step` layers, routed by the
//! raw router logits to the top experts whose sigmoid weight scales each expert's input,
//! plus a shared expert of the same width; dense SwiGLU layers between. See llama.cpp's
//! src/models/llama4.cpp and build_moe_ffn (weight_before_ffn). A file with
//! `attention.sliding_window` = 0 (rope everywhere but the last layer, no chunks) is
//! refused: llama.cpp aborts on its temperature input there.

use super::decoder::{Decoder, DecoderConfig};
use super::graph::{Gating, MoeConfig};
use super::loader::Loader;
use super::{common_hparams, swa_pattern, Arch};
use crate::context::{ContextParams, Forward};
use crate::error::{Error, Result};
use crate::hparams::{HParams, Meta, RopeType};

pub struct Llama4;

/// llama.cpp's hard-coded chunk size and temperature floor for Llama 4.
const CHUNK: usize = 8192;

impl Arch for Llama4 {
    fn name(&self) -> &'static str {
        "llama4"
    }

    fn moe(&self) -> bool {
        true
    }

    fn hparams(&self, meta: &Meta, n_vocab: usize) -> Result<HParams> {
        let bad = |m: String| Error::Unsupported(format!("{}: {m}", meta.file.path));
        let mut hp = common_hparams(meta, n_vocab, RopeType::Norm)?;
        if hp.n_expert == 0 {
            return Err(bad("llama4 model cannot have zero experts".into()));
        }
        if hp.n_ff_exp == 0 {
            return Err(bad(format!("missing required metadata key '{}'", meta.key("expert_feed_forward_length"))));
        }
        hp.n_ff_shexp = hp.n_ff_exp;
        moe_step(meta)?;
        if meta.u("attention.sliding_window")? == Some(0) {
            return Err(bad(format!(
                "'{}' = 0 (no chunked attention) is not supported: llama.cpp aborts on such files",
                meta.key("attention.sliding_window")
            )));
        }
        if hp.n_rot != hp.n_embd_head_k {
            return Err(bad(format!("rope.dimension_count {} must equal the head size {}", hp.n_rot, hp.n_embd_head_k)));
        }
        hp.n_swa = CHUNK;
        hp.swa_layers = swa_pattern(meta, hp.n_layer, 4, false)?;
        hp.n_attn_temp_floor_scale = CHUNK;
        hp.f_attn_temp_scale = 0.1;
        hp.rope_freq_base_swa = meta.f("rope.freq_base_swa")?.unwrap_or(hp.rope_freq_base);
        hp.rope_freq_scale_swa = hp.rope_freq_scale;
        Ok(hp)
    }

    fn type_name(&self, hp: &HParams) -> &'static str {
        match hp.n_expert {
            16 => "17Bx16E (Scout)",
            128 => "17Bx128E (Maverick)",
            _ => "?B",
        }
    }

    fn build_forward(&self, ld: &Loader, cp: &ContextParams) -> Result<Box<dyn Forward>> {
        let hp = ld.hp();
        let meta = Meta { file: &ld.model().files[0], arch: &hp.arch };
        let step = moe_step(&meta)?;
        let cfg = DecoderConfig {
            moe: step > 0,
            moe_cfg: MoeConfig { gating: Gating::Sigmoid, norm_w: false, llama4: true, ..MoeConfig::softmax(hp.n_expert_used, false) },
            moe_step: step,
            shexp: true,
            no_rope_layer_step: 4,
            swa_chunked: true,
            // llama.cpp: use_kq_norm = type != LLM_TYPE_17B_128E
            qk_rms_after_rope: hp.n_expert != 128,
            attn_temp: Some((hp.f_attn_temp_scale, hp.n_attn_temp_floor_scale, 1.0)),
            attn_temp_nope_only: true,
            ..DecoderConfig::new(hp)
        };
        Ok(Box::new(Decoder::load(ld, cp, cfg)?))
    }
}

/// `interleave_moe_layer_step` (required by llama.cpp): layers with (il + 1) % step == 0
/// are MoE; 0 = none (then every layer is dense).
fn moe_step(meta: &Meta) -> Result<usize> {
    meta.u("interleave_moe_layer_step")?.ok_or_else(|| {
        Error::Unsupported(format!(
            "{}: missing required metadata key '{}'",
            meta.file.path,
            meta.key("interleave_moe_layer_step")
        ))
    })
}
