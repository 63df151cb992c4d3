//! EXAONE 4: OLMo 2's post-norm decoder (no norms before attention or the FFN, RMS norms
//! after each block, SwiGLU) with q/k RMS-normed per head, optional `rope_freqs.weight`,
//! `output.weight` tied when absent and NEOX rope. The 64-layer (32B) model alone has
//! sliding-window layers (window 4096 unless `attention.sliding_window` says, pattern 4:
//! layers il % 4 < 3), and then only those are rotated: its full-attention layers have no
//! rope. See llama.cpp's src/models/exaone4.cpp; the forward pass is olmo2.rs's
//! `PostNormForward`.

use super::loader::Loader;
use super::olmo2::{PostNorm, PostNormForward};
use super::{common_hparams, Arch};
use crate::context::{ContextParams, Forward};
use crate::error::{Error, Result};
use crate::hparams::{HParams, Meta, RopeType};

pub struct Exaone4;

impl Arch for Exaone4 {
    fn name(&self) -> &'static str {
        "exaone4"
    }

    fn hparams(&self, meta: &Meta, n_vocab: usize) -> Result<HParams> {
        if meta.u("nextn_predict_layers")?.unwrap_or(0) > 0 {
            // llama.cpp keeps NextN/MTP layers in the file without running them
            return Err(Error::Unsupported(format!(
                "{}: '{}' > 0: EXAONE 4 files with NextN (MTP) layers are not supported",
                meta.file.path,
                meta.key("nextn_predict_layers")
            )));
        }
        let mut hp = common_hparams(meta, n_vocab, RopeType::Neox)?;
        if hp.n_layer == 64 {
            // llama.cpp: swa_type STANDARD, n_swa 4096, load_swa_pattern(ml, 4)
            hp.n_swa = 4096;
            let pattern = meta.u("attention.sliding_window_pattern")?.unwrap_or(4).max(1);
            hp.swa_layers = (0..hp.n_layer).map(|il| il % pattern < pattern - 1).collect();
            hp.rope_freq_base_swa = meta.f("rope.freq_base_swa")?.unwrap_or(hp.rope_freq_base);
            hp.rope_freq_scale_swa = hp.rope_freq_scale;
        }
        if let Some(w) = meta.u("attention.sliding_window")? {
            hp.n_swa = w;
        }
        Ok(hp)
    }

    fn type_name(&self, hp: &HParams) -> &'static str {
        match hp.n_layer {
            30 => "1.2B",
            64 => "32B",
            _ => "?B",
        }
    }

    fn build_forward(&self, ld: &Loader, cp: &ContextParams) -> Result<Box<dyn Forward>> {
        let o = PostNorm { qk_norm_per_head: true, output_opt: true, rope_freqs: true, rope_swa_only: true };
        Ok(Box::new(PostNormForward::load(ld, cp, o)?))
    }
}
