//! Phi-3: fused `attn_qkv` {n_embd, n_embd + 2 n_embd_gqa}, fused `ffn_up` {n_embd, 2 n_ff}
//! (SwiGLU: silu(first half) * second half), NEOX rope with optional long/short rope
//! factors. llama.cpp ignores `attention.sliding_window` for phi3 ("Phi SWA is currently
//! disabled"), so n_swa stays 0. See llama.cpp's src/models/phi3.cpp.

use super::{common_hparams, io_specs, Arch, TensorSpec};
use crate::error::Result;
use crate::hparams::{HParams, Meta, RopeType};

pub struct Phi3;

impl Arch for Phi3 {
    fn name(&self) -> &'static str {
        "phi3"
    }

    fn hparams(&self, meta: &Meta, n_vocab: usize) -> Result<HParams> {
        common_hparams(meta, n_vocab, RopeType::Neox)
    }

    fn type_name(&self, hp: &HParams) -> &'static str {
        match hp.n_layer {
            24 => "1B",
            32 => "3B",
            40 => "14B",
            _ => "?B",
        }
    }

    fn tensors(&self, hp: &HParams) -> Vec<TensorSpec> {
        let n_embd = hp.n_embd;
        let mut v = io_specs(hp);
        for il in 0..hp.n_layer {
            let n_gqa = hp.n_embd_k_gqa(il);
            let b = |s: &str| format!("blk.{il}.{s}");
            v.extend([
                TensorSpec::req(b("attn_norm.weight"), &[n_embd]),
                TensorSpec::req(b("attn_qkv.weight"), &[n_embd, n_embd + 2 * n_gqa]),
                TensorSpec::opt(b("attn_qkv.bias"), &[n_embd + 2 * n_gqa]),
                TensorSpec::req(b("attn_output.weight"), &[n_embd, n_embd]),
                TensorSpec::req(b("ffn_norm.weight"), &[n_embd]),
                TensorSpec::req(b("ffn_down.weight"), &[hp.n_ff[il], n_embd]),
                TensorSpec::req(b("ffn_up.weight"), &[n_embd, 2 * hp.n_ff[il]]),
                TensorSpec::opt(b("rope_factors_long.weight"), &[hp.n_rot / 2]),
                TensorSpec::opt(b("rope_factors_short.weight"), &[hp.n_rot / 2]),
            ]);
        }
        v
    }
}

// ---- forward pass ------------------------------------------------------------------
