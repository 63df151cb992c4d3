//! LFM2-MoE (`lfm2moe`; llama.cpp's src/models/lfm2moe.cpp, which runs lfm2.cpp's graph):
//! LFM2's short-convolution and attention layers (lfm2.rs) with mixture-of-experts
//! feed-forwards after `leading_dense_block_count` dense SwiGLU layers. The experts are
//! routed by `expert_gating_func` (required; LFM2-8B-A1B: sigmoid), selected by their
//! probability plus the selection bias `exp_probs_b`, and their weights renormalized to sum
//! 1; llama.cpp reads no `expert_weights_scale` for it (the weights are not scaled). No
//! sliding window (llama.cpp reads none for lfm2moe).

use super::graph::{Gating, MoeConfig};
use super::lfm2::{build, l_cache, MoeSpec};
use super::loader::Loader;
use super::{common_hparams_ext, Arch};
use crate::context::{ContextParams, Forward};
use crate::error::{Error, Result};
use crate::hparams::{HParams, Meta, RopeType};

pub struct Lfm2Moe;

impl Arch for Lfm2Moe {
    fn name(&self) -> &'static str {
        "lfm2moe"
    }

    fn moe(&self) -> bool {
        true
    }

    fn hparams(&self, meta: &Meta, n_vocab: usize) -> Result<HParams> {
        let bad = |what: String| Error::Unsupported(format!("{}: {what}", meta.file.path));
        l_cache(meta)?;
        let hp = common_hparams_ext(meta, n_vocab, RopeType::Neox, true)?;
        if hp.n_head.iter().all(|&h| h == 0) {
            return Err(bad(format!("'{}' is missing or 0", meta.key("attention.head_count"))));
        }
        if hp.n_expert == 0 || hp.n_expert_used == 0 {
            return Err(bad("lfm2moe needs expert_count > 0 and expert_used_count > 0".into()));
        }
        if hp.n_ff_exp == 0 {
            return Err(bad(format!("missing required metadata key '{}'", meta.key("expert_feed_forward_length"))));
        }
        gating(meta)?;
        Ok(hp)
    }

    fn type_name(&self, hp: &HParams) -> &'static str {
        match hp.n_layer {
            24 => "8B.A1B",
            40 => "24B.A2B",
            _ => "?B",
        }
    }

    fn build_forward(&self, ld: &Loader, cp: &ContextParams) -> Result<Box<dyn Forward>> {
        let hp = ld.hp();
        let meta = Meta { file: &ld.model().files[0], arch: &hp.arch };
        let cfg = MoeConfig { gating: gating(&meta)?, ..MoeConfig::softmax(hp.n_expert_used, true) };
        let n_dense_lead = meta.u("leading_dense_block_count")?.unwrap_or(0);
        build(ld, cp, Some(MoeSpec { n_dense_lead, cfg }))
    }
}

/// `expert_gating_func`, which llama.cpp requires for lfm2moe (1 softmax, 2 sigmoid, 3
/// softmax of the selected logits).
fn gating(meta: &Meta) -> Result<Gating> {
    let key = meta.key("expert_gating_func");
    match meta.u("expert_gating_func")? {
        None => Err(Error::Unsupported(format!("{}: missing required metadata key '{key}'", meta.file.path))),
        Some(1) => Ok(Gating::Softmax),
        Some(2) => Ok(Gating::Sigmoid),
        Some(3) => Ok(Gating::SoftmaxWeight),
        Some(g) => Err(Error::Unsupported(format!("{}: '{key}' = {g} is not a gating function pyllama knows", meta.file.path))),
    }
}
