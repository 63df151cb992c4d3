//! nomic-bert-moe (nomic-embed-text v2 MoE): nomic-bert's encoder (bert.rs: NEOX rope)
//! with BERT's GELU feed-forward with biases on the dense layers and, on every layer
//! il % `moe_every_n_layers` == 1, a mixture of ungated GELU experts (softmax routing, the
//! selected weights not renormalized); llama.cpp's src/models/nomic-bert-moe.cpp with the
//! bert graph.

use super::bert::{bert_hparams, BertForward, Variant};
use super::loader::Loader;
use super::Arch;
use crate::context::{ContextParams, Forward};
use crate::error::Result;
use crate::hparams::{HParams, Meta, RopeType};

pub struct NomicBertMoe;

impl Arch for NomicBertMoe {
    fn name(&self) -> &'static str {
        "nomic-bert-moe"
    }
    fn hparams(&self, meta: &Meta, n_vocab: usize) -> Result<HParams> {
        bert_hparams(meta, n_vocab, RopeType::Neox)
    }
    fn moe(&self) -> bool {
        true
    }
    fn type_name(&self, hp: &HParams) -> &'static str {
        if hp.n_layer == 12 {
            "475M"
        } else {
            "?B"
        }
    }
    fn build_forward(&self, ld: &Loader, cp: &ContextParams) -> Result<Box<dyn Forward>> {
        Ok(Box::new(BertForward::load(ld, cp, Variant::NomicBertMoe)?))
    }
}
