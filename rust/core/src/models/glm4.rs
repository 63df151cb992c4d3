//! GLM-4 (GLM-4-0414 dense): LLaMA's pre-norm decoder plus Gemma 2's post-attention and
//! post-FFN RMS norms, q/k/v biases where the file has them, one `ffn_up` of 2 * n_ff rows
//! (gate first: llama.cpp's LLM_FFN_SWIGLU, LLM_FFN_SEQ), NORM rope over
//! `rope.dimension_count` dims (half the head in GLM-4), output tied when absent. See
//! llama.cpp's src/models/glm4.cpp. Files with M-RoPE sections (the vision variants) or
//! NextN layers are refused.

use super::decoder::{Decoder, DecoderConfig};
use super::loader::Loader;
use super::{common_hparams, Arch};
use crate::context::{ContextParams, Forward};
use crate::error::{Error, Result};
use crate::gguf::Value;
use crate::hparams::{HParams, Meta, RopeType};

pub struct Glm4;

impl Arch for Glm4 {
    fn name(&self) -> &'static str {
        "glm4"
    }

    fn hparams(&self, meta: &Meta, n_vocab: usize) -> Result<HParams> {
        let bad = |what: &str| Error::Unsupported(format!("{}: {what}", meta.file.path));
        if meta.u("nextn_predict_layers")?.unwrap_or(0) > 0 {
            // llama.cpp keeps NextN/MTP layers in the file without running them
            return Err(bad(&format!("'{}' > 0: GLM-4 files with NextN (MTP) layers are not supported", meta.key("nextn_predict_layers"))));
        }
        // llama.cpp: get_key_or_arr(rope.dimension_sections, 4); use_mrope() when the first two are > 0
        let sections: Vec<i64> = match meta.get("rope.dimension_sections") {
            None => vec![],
            Some(Value::Array(a)) => a.iter().map(|v| v.as_i64().unwrap_or(0)).collect(),
            Some(v) => vec![v.as_i64().unwrap_or(0); 4],
        };
        if sections.len() >= 2 && sections[0] > 0 && sections[1] > 0 {
            return Err(bad(&format!("'{}' asks for M-RoPE, which pyllama does not implement", meta.key("rope.dimension_sections"))));
        }
        common_hparams(meta, n_vocab, RopeType::Norm)
    }

    fn type_name(&self, hp: &HParams) -> &'static str {
        match hp.n_layer {
            17 => "1B",
            40 => "9B",
            61 => "32B",
            _ => "?B",
        }
    }

    fn build_forward(&self, ld: &Loader, cp: &ContextParams) -> Result<Box<dyn Forward>> {
        let cfg = DecoderConfig { post_norms: true, fused_up: true, ..DecoderConfig::new(ld.hp()) };
        Ok(Box::new(Decoder::load(ld, cp, cfg)?))
    }
}
