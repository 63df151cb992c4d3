//! jina-bert-v2 (jina-embeddings-v2, jina-reranker-v1): BERT's post-norm encoder
//! (bert.rs) without position embeddings: ALiBi with max bias 8 instead, optional
//! LayerNorms of q and k, an optional second attention norm, and a GEGLU feed-forward
//! (fused `ffn_up` of 2 n_ff rows, or `ffn_gate` + `ffn_up`); llama.cpp's
//! src/models/jina-bert-v2.cpp.

use super::bert::{bert_hparams, BertForward, Variant};
use super::loader::Loader;
use super::Arch;
use crate::context::{ContextParams, Forward};
use crate::error::Result;
use crate::hparams::{HParams, Meta, RopeType};

pub struct JinaBertV2;

impl Arch for JinaBertV2 {
    fn name(&self) -> &'static str {
        "jina-bert-v2"
    }
    fn hparams(&self, meta: &Meta, n_vocab: usize) -> Result<HParams> {
        let mut hp = bert_hparams(meta, n_vocab, RopeType::None)?;
        hp.f_max_alibi_bias = 8.0;
        Ok(hp)
    }
    fn type_name(&self, hp: &HParams) -> &'static str {
        match hp.n_layer {
            4 => "33M",
            12 => "137M",
            _ => "?B",
        }
    }
    fn build_forward(&self, ld: &Loader, cp: &ContextParams) -> Result<Box<dyn Forward>> {
        Ok(Box::new(BertForward::load(ld, cp, Variant::JinaBertV2)?))
    }
}
