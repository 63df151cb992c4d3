//! Mistral 3 (Ministral / Mistral Small 3.x text model): LLaMA-like (RMSNorm, NORM rope,
//! GQA, SwiGLU) with YaRN rope scaling and Llama-4-style query temperature scaling
//! (`attention.temperature_scale`, floor scale = `rope.scaling.original_context_length`).
//! See llama.cpp's src/models/mistral3.cpp.

use super::{common_hparams, io_specs, qkv_specs, Arch, TensorSpec};
use crate::error::{Error, Result};
use crate::hparams::{HParams, Meta, RopeType};

pub struct Mistral3;

impl Arch for Mistral3 {
    fn name(&self) -> &'static str {
        "mistral3"
    }

    fn hparams(&self, meta: &Meta, n_vocab: usize) -> Result<HParams> {
        let mut hp = common_hparams(meta, n_vocab, RopeType::Norm)?;
        hp.f_attn_temp_scale = meta.f("attention.temperature_scale")?.unwrap_or(0.0);
        if hp.f_attn_temp_scale != 0.0 {
            hp.n_attn_temp_floor_scale = hp.n_ctx_orig_yarn;
            if hp.n_attn_temp_floor_scale == 0 {
                return Err(Error::Unsupported(format!(
                    "{}: invalid n_ctx_orig_yarn (0) for attention temperature scaling",
                    meta.file.path
                )));
            }
        }
        Ok(hp)
    }

    fn type_name(&self, hp: &HParams) -> &'static str {
        match hp.n_layer {
            26 => "3B",
            34 => "8B",
            40 => "14B",
            _ => "?B",
        }
    }

    fn tensors(&self, hp: &HParams) -> Vec<TensorSpec> {
        let n_embd = hp.n_embd;
        let mut v = io_specs(hp);
        for il in 0..hp.n_layer {
            let n_q = hp.n_embd_head_k * hp.n_head(il);
            let n_ff = hp.n_ff[il];
            let b = |s: &str| format!("blk.{il}.{s}");
            v.push(TensorSpec::req(b("attn_norm.weight"), &[n_embd]));
            v.extend(qkv_specs(il, n_embd, n_q, hp.n_embd_k_gqa(il), hp.n_embd_v_gqa(il)));
            v.extend([
                TensorSpec::req(b("attn_output.weight"), &[n_q, n_embd]),
                TensorSpec::opt(b("attn_output.bias"), &[n_embd]),
                TensorSpec::req(b("ffn_norm.weight"), &[n_embd]),
                TensorSpec::opt(b("rope_freqs.weight"), &[hp.n_rot / 2]),
                TensorSpec::req(b("ffn_gate.weight"), &[n_embd, n_ff]),
                TensorSpec::req(b("ffn_down.weight"), &[n_ff, n_embd]),
                TensorSpec::req(b("ffn_up.weight"), &[n_embd, n_ff]),
            ]);
        }
        v
    }
}

// ---- forward pass ------------------------------------------------------------------
