//! Qwen2 / Qwen2.5 (q/k/v biases) and Qwen3 (per-head Q/K RMSNorm, head size from
//! `attention.key_length`): RMSNorm, NEOX rope, GQA, SwiGLU. See llama.cpp's
//! src/models/qwen2.cpp, qwen3.cpp and qwen3moe.cpp. Qwen3-MoE is Qwen3 with mixture-of-
//! experts feed-forward layers (the shared decoder runs them, see `Step::ffn_moe`).

use super::{common_hparams, io_specs, qkv_specs, Arch, TensorSpec};
use crate::error::Result;
use crate::hparams::{HParams, Meta, RopeType};

pub struct Qwen2;
pub struct Qwen3;
pub struct Qwen3Moe;

fn ffn(il: usize, n_embd: usize, n_ff: usize) -> Vec<TensorSpec> {
    let b = |s: &str| format!("blk.{il}.{s}");
    vec![
        TensorSpec::req(b("ffn_norm.weight"), &[n_embd]),
        TensorSpec::req(b("ffn_gate.weight"), &[n_embd, n_ff]),
        TensorSpec::req(b("ffn_down.weight"), &[n_ff, n_embd]),
        TensorSpec::req(b("ffn_up.weight"), &[n_embd, n_ff]),
    ]
}

impl Arch for Qwen2 {
    fn name(&self) -> &'static str {
        "qwen2"
    }

    fn build_forward(
        &self,
        model: &std::sync::Arc<crate::model::Model>,
        cp: &crate::context::ContextParams,
    ) -> Result<Box<dyn crate::context::Forward>> {
        qwen2_forward(model, cp)
    }

    fn hparams(&self, meta: &Meta, n_vocab: usize) -> Result<HParams> {
        common_hparams(meta, n_vocab, RopeType::Neox)
    }

    fn type_name(&self, hp: &HParams) -> &'static str {
        match hp.n_layer {
            24 if hp.n_embd == 1024 => "0.5B",
            24 => "1B",
            28 if hp.n_embd == 1536 => "1.5B",
            28 | 32 => "7B",
            36 => "3B",
            40 if hp.n_head(0) == 20 => "4B",
            40 => "13B",
            48 => "14B",
            64 => "32B",
            80 => "70B",
            _ => "?B",
        }
    }

    fn tensors(&self, hp: &HParams) -> Vec<TensorSpec> {
        let n_embd = hp.n_embd;
        let mut v = io_specs(hp);
        v.push(TensorSpec::opt("output.bias", &[hp.n_vocab]));
        for il in 0..hp.n_layer {
            let b = |s: &str| format!("blk.{il}.{s}");
            v.push(TensorSpec::req(b("attn_norm.weight"), &[n_embd]));
            // llama.cpp's loader uses {n_embd, n_embd} for wq and wo, which is the same as these
            // for every real qwen2 file (n_head * head size = n_embd); stating the dims the
            // forward pass uses makes a file whose key/value lengths disagree with its
            // tensors fail here, at load.
            let (n_q, n_o) = (hp.n_embd_head_k * hp.n_head(il), hp.n_embd_head_v * hp.n_head(il));
            v.extend(qkv_specs(il, n_embd, n_q, hp.n_embd_k_gqa(il), hp.n_embd_v_gqa(il)));
            v.push(TensorSpec::req(b("attn_output.weight"), &[n_o, n_embd]));
            v.extend(ffn(il, n_embd, hp.n_ff[il]));
        }
        v
    }
}

/// Qwen3's attention block (also Qwen3-MoE's): norm, q/k/v (head size from key_length,
/// optional biases), output, per-head q/k norms.
fn qwen3_attn_specs(hp: &HParams, il: usize) -> Vec<TensorSpec> {
    let n_embd = hp.n_embd;
    let n_q = hp.n_embd_head_k * hp.n_head(il);
    let b = |s: &str| format!("blk.{il}.{s}");
    let mut v = vec![TensorSpec::req(b("attn_norm.weight"), &[n_embd])];
    v.extend(qkv_specs(il, n_embd, n_q, hp.n_embd_k_gqa(il), hp.n_embd_v_gqa(il)));
    v.push(TensorSpec::req(b("attn_output.weight"), &[n_q, n_embd]));
    v.push(TensorSpec::req(b("attn_k_norm.weight"), &[hp.n_embd_head_k]));
    v.push(TensorSpec::req(b("attn_q_norm.weight"), &[hp.n_embd_head_k]));
    v
}

impl Arch for Qwen3 {
    fn name(&self) -> &'static str {
        "qwen3"
    }

    fn build_forward(
        &self,
        model: &std::sync::Arc<crate::model::Model>,
        cp: &crate::context::ContextParams,
    ) -> Result<Box<dyn crate::context::Forward>> {
        qwen3_forward(model, cp)
    }

    fn hparams(&self, meta: &Meta, n_vocab: usize) -> Result<HParams> {
        common_hparams(meta, n_vocab, RopeType::Neox)
    }

    fn type_name(&self, hp: &HParams) -> &'static str {
        match hp.n_layer {
            28 if hp.n_embd == 1024 => "0.6B",
            28 => "1.7B",
            36 if hp.n_embd == 2560 => "4B",
            36 => "8B",
            40 => "14B",
            64 => "32B",
            _ => "?B",
        }
    }

    fn tensors(&self, hp: &HParams) -> Vec<TensorSpec> {
        let n_embd = hp.n_embd;
        let mut v = io_specs(hp);
        for il in 0..hp.n_layer {
            v.extend(qwen3_attn_specs(hp, il));
            v.extend(ffn(il, n_embd, hp.n_ff[il]));
        }
        v
    }
}

impl Arch for Qwen3Moe {
    fn name(&self) -> &'static str {
        "qwen3moe"
    }

    fn moe(&self) -> bool {
        true
    }

    fn build_forward(
        &self,
        model: &std::sync::Arc<crate::model::Model>,
        cp: &crate::context::ContextParams,
    ) -> Result<Box<dyn crate::context::Forward>> {
        qwen3_forward(model, cp)
    }

    fn hparams(&self, meta: &Meta, n_vocab: usize) -> Result<HParams> {
        let mut hp = common_hparams(meta, n_vocab, RopeType::Neox)?;
        if hp.n_expert == 0 || hp.n_expert_used == 0 || hp.n_expert_used > hp.n_expert {
            return Err(crate::error::Error::Unsupported(format!(
                "{}: qwen3moe needs expert_count > 0 and 0 < expert_used_count <= expert_count (got {} and {})",
                meta.file.path, hp.n_expert, hp.n_expert_used
            )));
        }
        if hp.n_ff_exp == 0 {
            hp.n_ff_exp = hp.n_ff.first().copied().unwrap_or(0) / hp.n_expert_used;
        }
        // the dense width is unused; the scratch buffers hold the experts' width
        for f in hp.n_ff.iter_mut() {
            *f = (*f).max(hp.n_ff_exp);
        }
        Ok(hp)
    }

    fn type_name(&self, hp: &HParams) -> &'static str {
        match hp.n_layer {
            48 => "30B.A3B",
            94 => "235B.A22B",
            _ => "?B",
        }
    }

    fn tensors(&self, hp: &HParams) -> Vec<TensorSpec> {
        let n_embd = hp.n_embd;
        let (ne, nf) = (hp.n_expert, hp.n_ff_exp);
        let mut v = io_specs(hp);
        for il in 0..hp.n_layer {
            let b = |s: &str| format!("blk.{il}.{s}");
            v.extend(qwen3_attn_specs(hp, il));
            v.push(TensorSpec::req(b("ffn_norm.weight"), &[n_embd]));
            v.push(TensorSpec::req(b("ffn_gate_inp.weight"), &[n_embd, ne]));
            v.push(TensorSpec::req(b("ffn_gate_exps.weight"), &[n_embd, nf, ne]));
            v.push(TensorSpec::req(b("ffn_up_exps.weight"), &[n_embd, nf, ne]));
            v.push(TensorSpec::req(b("ffn_down_exps.weight"), &[nf, n_embd, ne]));
        }
        v
    }
}

// ---- forward pass ------------------------------------------------------------------
//
// The shared pre-norm decoder (ops/decoder.rs): q/k/v biases are picked up when the file
// has them (Qwen2), Qwen3 adds per-head q/k RMSNorm; kq scale 1/sqrt(head size).

use crate::context::{ContextParams, FfnAct, Forward};
use crate::model::Model;
use crate::ops::decoder::{Decoder, DecoderConfig};
use std::sync::Arc;

fn qwen_config(hp: &HParams, qk_norm: bool) -> DecoderConfig {
    DecoderConfig {
        embd_scale: false,
        post_norms: false,
        qk_norm,
        q_scale: 1.0,
        kq_scale: 1.0 / (hp.n_embd_head_k as f32).sqrt(),
        attn_softcap: 0.0,
        final_softcap: 0.0,
        act: FfnAct::SwiGlu,
        fused: false,
        attn_temp: None,
    }
}

fn qwen2_forward(model: &Arc<Model>, cp: &ContextParams) -> Result<Box<dyn Forward>> {
    Ok(Box::new(Decoder::new(model, cp, qwen_config(&model.hparams, false))?))
}

fn qwen3_forward(model: &Arc<Model>, cp: &ContextParams) -> Result<Box<dyn Forward>> {
    Ok(Box::new(Decoder::new(model, cp, qwen_config(&model.hparams, true))?))
}
