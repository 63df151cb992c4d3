//! nomic-bert (nomic-embed-text v1/v1.5): BERT's post-norm encoder (bert.rs) with NEOX
//! rope on q and k instead of position embeddings, and a SwiGLU feed-forward without
//! biases (llama.cpp's src/models/nomic-bert.cpp with the bert graph).

use super::bert::{bert_hparams, BertForward, Variant};
use super::loader::Loader;
use super::Arch;
use crate::context::{ContextParams, Forward};
use crate::error::Result;
use crate::hparams::{HParams, Meta, RopeType};

pub struct NomicBert;

impl Arch for NomicBert {
    fn name(&self) -> &'static str {
        "nomic-bert"
    }
    fn hparams(&self, meta: &Meta, n_vocab: usize) -> Result<HParams> {
        bert_hparams(meta, n_vocab, RopeType::Neox)
    }
    fn type_name(&self, hp: &HParams) -> &'static str {
        if hp.n_layer == 12 {
            "137M"
        } else {
            "?B"
        }
    }
    fn build_forward(&self, ld: &Loader, cp: &ContextParams) -> Result<Box<dyn Forward>> {
        Ok(Box::new(BertForward::load(ld, cp, Variant::NomicBert)?))
    }
}
