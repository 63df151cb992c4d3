//! LLaMA family (LLaMA 1-3, Mistral 7B, SmolLM): RMSNorm, NORM rope, GQA, SwiGLU.

use super::{common_hparams, Arch, TensorSpec};
use crate::error::Result;
use crate::hparams::{HParams, Meta, RopeType};

pub struct Llama;

impl Arch for Llama {
    fn name(&self) -> &'static str {
        "llama"
    }

    fn hparams(&self, meta: &Meta, n_vocab: usize) -> Result<HParams> {
        common_hparams(meta, n_vocab, RopeType::Norm)
    }

    /// src/models/llama.cpp load_arch_hparams (dense models).
    fn type_name(&self, hp: &HParams) -> &'static str {
        match hp.n_layer {
            16 | 22 => "1B",
            26 | 28 => "3B",
            30 => "256M",
            32 if hp.n_vocab == 49152 => "3B",
            32 if hp.n_vocab < 40000 => "7B",
            32 | 36 => "8B",
            40 => "13B",
            48 => "34B",
            60 => "30B",
            80 if hp.n_head(0) == hp.n_head_kv(0) => "65B",
            80 => "70B",
            _ => "?B",
        }
    }

    fn tensors(&self, hp: &HParams) -> Vec<TensorSpec> {
        let (n_embd, n_vocab) = (hp.n_embd, hp.n_vocab);
        let mut v = vec![
            TensorSpec::req("token_embd.weight", &[n_embd, n_vocab]),
            TensorSpec::req("output_norm.weight", &[n_embd]),
            TensorSpec::tied("output.weight", &[n_embd, n_vocab], "token_embd.weight"),
            TensorSpec::opt("rope_freqs.weight", &[hp.n_rot / 2]),
        ];
        for il in 0..hp.n_layer {
            let n_q = hp.n_embd_head_k * hp.n_head(il);
            let n_ff = hp.n_ff[il];
            let b = |s: &str| format!("blk.{il}.{s}");
            v.extend([
                TensorSpec::req(b("attn_norm.weight"), &[n_embd]),
                TensorSpec::req(b("attn_q.weight"), &[n_embd, n_q]),
                TensorSpec::req(b("attn_k.weight"), &[n_embd, hp.n_embd_k_gqa(il)]),
                TensorSpec::req(b("attn_v.weight"), &[n_embd, hp.n_embd_v_gqa(il)]),
                TensorSpec::req(b("attn_output.weight"), &[hp.n_embd_head_v * hp.n_head(il), n_embd]),
                TensorSpec::req(b("ffn_norm.weight"), &[n_embd]),
                TensorSpec::req(b("ffn_gate.weight"), &[n_embd, n_ff]),
                TensorSpec::req(b("ffn_down.weight"), &[n_ff, n_embd]),
                TensorSpec::req(b("ffn_up.weight"), &[n_embd, n_ff]),
            ]);
        }
        v
    }
}

// ---- forward pass ------------------------------------------------------------------
