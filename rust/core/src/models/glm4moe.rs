//! GLM-4.5 / GLM-4.5-Air (`glm4moe`): a pre-norm decoder whose FFN pre-norm is named
//! `post_attention_norm`, q/k/v biases and per-head q/k norms where the file has them, NEOX
//! rope over `rope.dimension_count` dims, `leading_dense_block_count` dense SwiGLU layers,
//! then mixture-of-experts layers: sigmoid gating (or `expert_gating_func`), the experts
//! selected by their probability plus the selection bias `exp_probs_b`, optional expert
//! groups, weights renormalized (`expert_weights_norm`) and scaled
//! (`expert_weights_scale`), and `expert_shared_count` shared experts as one FFN. The
//! NextN (MTP) layers after the trunk are skipped, as llama.cpp does outside MTP contexts.
//! See llama.cpp's src/models/glm4-moe.cpp. Files with M-RoPE sections are refused.

use super::decoder::{Decoder, DecoderConfig};
use super::graph::Gating;
use super::loader::Loader;
use super::{common_hparams, drop_nextn_layers, moe_routing, Arch};
use crate::context::{ContextParams, Forward};
use crate::error::{Error, Result};
use crate::gguf::Value;
use crate::hparams::{HParams, Meta, RopeType};

pub struct Glm4Moe;

impl Arch for Glm4Moe {
    fn name(&self) -> &'static str {
        "glm4moe"
    }

    fn moe(&self) -> bool {
        true
    }

    fn hparams(&self, meta: &Meta, n_vocab: usize) -> Result<HParams> {
        let bad = |what: String| Error::Unsupported(format!("{}: {what}", meta.file.path));
        let sections: Vec<i64> = match meta.get("rope.dimension_sections") {
            None => vec![],
            Some(Value::Array(a)) => a.iter().map(|v| v.as_i64().unwrap_or(0)).collect(),
            Some(v) => vec![v.as_i64().unwrap_or(0); 4],
        };
        if sections.len() >= 2 && sections[0] > 0 && sections[1] > 0 {
            return Err(bad(format!("'{}' asks for M-RoPE, which pyllama does not implement", meta.key("rope.dimension_sections"))));
        }
        let mut hp = common_hparams(meta, n_vocab, RopeType::Neox)?;
        drop_nextn_layers(meta, &mut hp)?;
        if hp.n_expert == 0 || hp.n_expert_used == 0 {
            return Err(bad("glm4moe needs expert_count > 0 and expert_used_count > 0".into()));
        }
        if hp.n_ff_exp == 0 {
            hp.n_ff_exp = hp.n_ff.first().copied().unwrap_or(0) / hp.n_expert_used;
        }
        let shared = meta.u("expert_shared_count")?.ok_or_else(|| {
            bad(format!("missing required metadata key '{}'", meta.key("expert_shared_count")))
        })?;
        hp.n_ff_shexp = hp.n_ff_exp.saturating_mul(shared);
        Ok(hp)
    }

    fn type_name(&self, hp: &HParams) -> &'static str {
        match hp.n_layer {
            46 => "106B.A12B",
            48 => "102B.A12B",
            92 => "355B.A32B",
            _ => "?B",
        }
    }

    fn build_forward(&self, ld: &Loader, cp: &ContextParams) -> Result<Box<dyn Forward>> {
        let hp = ld.hp();
        let meta = Meta { file: &ld.model().files[0], arch: &hp.arch };
        let cfg = DecoderConfig {
            moe: true,
            moe_cfg: moe_routing(&meta, hp, Gating::Sigmoid)?,
            n_dense_lead: meta.u("leading_dense_block_count")?.unwrap_or(0),
            shexp: hp.n_ff_shexp > 0,
            probs_b: true,
            ffn_norm: "post_attention_norm",
            qk_norm_opt: true,
            ..DecoderConfig::new(hp)
        };
        Ok(Box::new(Decoder::load(ld, cp, cfg)?))
    }
}
