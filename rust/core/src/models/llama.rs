//! LLaMA family (LLaMA 1-3, Mistral 7B, SmolLM): RMSNorm, NORM rope, GQA, SwiGLU.
//!
//! The forward pass is the shared pre-norm decoder (ops/decoder.rs):
//! x = embd(tokens)                                      [n, n_embd]
//! per layer: cur = rmsnorm(x) * attn_norm
//!            x  += wo . attn(rope(wq cur [+ bq]), rope(wk cur [+ bk]), wv cur [+ bv]) [+ bo]
//!            cur = rmsnorm(x) * ffn_norm
//!            x  += down (silu(gate cur) * up cur)
//! logits = output . (rmsnorm(x) * output_norm)           (output tied to token_embd if absent)

use super::{common_hparams, io_specs, qkv_specs, Arch, TensorSpec};
use crate::context::{ContextParams, FfnAct, Forward};
use crate::ops::decoder::{Decoder, DecoderConfig};
use crate::error::Result;
use crate::hparams::{HParams, Meta, RopeType};
use crate::model::Model;
use std::sync::Arc;

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
        let n_embd = hp.n_embd;
        let mut v = io_specs(hp);
        v.push(TensorSpec::opt("rope_freqs.weight", &[hp.n_rot / 2]));
        for il in 0..hp.n_layer {
            let n_q = hp.n_embd_head_k * hp.n_head(il);
            let n_ff = hp.n_ff[il];
            let b = |s: &str| format!("blk.{il}.{s}");
            v.push(TensorSpec::req(b("attn_norm.weight"), &[n_embd]));
            v.extend(qkv_specs(il, n_embd, n_q, hp.n_embd_k_gqa(il), hp.n_embd_v_gqa(il)));
            v.extend([
                TensorSpec::req(b("attn_output.weight"), &[hp.n_embd_head_v * hp.n_head(il), n_embd]),
                TensorSpec::opt(b("attn_output.bias"), &[n_embd]),
                TensorSpec::req(b("ffn_norm.weight"), &[n_embd]),
                TensorSpec::req(b("ffn_gate.weight"), &[n_embd, n_ff]),
                TensorSpec::req(b("ffn_down.weight"), &[n_ff, n_embd]),
                TensorSpec::req(b("ffn_up.weight"), &[n_embd, n_ff]),
            ]);
        }
        v
    }

    fn build_forward(&self, model: &Arc<Model>, cp: &ContextParams) -> Result<Box<dyn Forward>> {
        let hp = &model.hparams;
        let cfg = DecoderConfig {
            embd_scale: false,
            post_norms: false,
            qk_norm: false,
            q_scale: 1.0,
            kq_scale: if hp.f_attention_scale != 0.0 {
                hp.f_attention_scale
            } else {
                1.0 / (hp.n_embd_head_k as f32).sqrt()
            },
            attn_softcap: 0.0,
            final_softcap: 0.0,
            act: FfnAct::SwiGlu,
            fused: false,
            attn_temp: None,
        };
        Ok(Box::new(Decoder::new(model, cp, cfg)?))
    }
}
