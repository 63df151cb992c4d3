//! Architecture registry (pipeline step 3): `general.architecture` -> one `Arch` per
//! family. Adding an architecture = one file in this folder + one line in `REGISTRY`.
//!
//! An architecture's file has its hyperparameters (`hparams`), and its forward pass, which
//! binds its tensors through a `loader::Loader` (that binding is the schema: checked at
//! model load) and is built from the shared graph builders (graph.rs), mostly as a
//! configured `decoder::Decoder`.

pub mod decoder;
pub mod exaone4;
pub mod gemma;
pub mod gemma3;
pub mod glm4;
pub mod graph;
pub mod granite;
pub mod llama;
pub mod loader;
pub mod mistral3;
pub mod olmo2;
pub mod phi2;
pub mod phi3;
pub mod qwen2;
pub mod smollm3;
pub mod starcoder2;
pub mod mamba2;
pub mod lfm2;
pub mod qwen35;
pub mod falcon_h1;
pub mod granite_hybrid;

use crate::context::{ContextParams, Forward};
use crate::error::{Error, Result};
use crate::hparams::{HParams, Meta, RopeType};
use loader::Loader;

pub trait Arch: Sync {
    /// `general.architecture` value.
    fn name(&self) -> &'static str;
    /// Hyperparameters from `{arch}.*` keys. `n_vocab` is passed in (from the token
    /// embedding or the vocabulary).
    fn hparams(&self, meta: &Meta, n_vocab: usize) -> Result<HParams>;
    /// Whether the forward pass has mixture-of-experts layers (`{arch}.expert_count` > 0
    /// is refused for the others: a dense forward pass would run without the experts).
    fn moe(&self) -> bool {
        false
    }
    /// Whether this file's hyperparameters make a mixture-of-experts model (the check of
    /// `expert_count` at load); architectures that come both ways (granite-hybrid) decide
    /// from `hp`.
    fn moe_for(&self, _hp: &HParams) -> bool {
        self.moe()
    }
    /// llama.cpp's size class for llama_model_desc ("270M", "1B"; "?B" when unknown).
    fn type_name(&self, _hp: &HParams) -> &'static str {
        "?B"
    }

    /// Bind the model's tensors through `ld` (each call states a tensor's name, shape and
    /// whether it is required: this is the architecture's schema, checked at model load)
    /// and build the forward pass for a context with params `cp`.
    fn build_forward(&self, ld: &Loader, cp: &ContextParams) -> Result<Box<dyn Forward>>;
}

pub static REGISTRY: &[&dyn Arch] = &[
    &llama::Llama,
    &gemma3::Gemma3,
    &qwen2::Qwen2,
    &qwen2::Qwen3,
    &qwen2::Qwen3Moe,
    &phi3::Phi3,
    &phi2::Phi2,
    &gemma::Gemma,
    &gemma::Gemma2,
    &mistral3::Mistral3,
    &smollm3::Smollm3,
    &olmo2::Olmo2,
    &granite::Granite,
    &starcoder2::Starcoder2,
    &exaone4::Exaone4,
    &glm4::Glm4,
    &mamba2::Mamba2,
    &lfm2::Lfm2,
    &qwen35::Qwen35,
    &qwen35::Qwen35Moe,
    &qwen35::Qwen3Next,
    &falcon_h1::FalconH1,
    &granite_hybrid::GraniteHybrid,
];

/// Stands in for an architecture pyllama has no schema for, in vocab-only loads (the
/// tokenizer does not depend on the architecture). `HParams::arch` keeps the real name.
pub struct VocabOnly;

impl Arch for VocabOnly {
    fn name(&self) -> &'static str {
        "(vocab only)"
    }
    fn hparams(&self, meta: &Meta, n_vocab: usize) -> Result<HParams> {
        Ok(HParams::vocab_only(meta.arch, n_vocab))
    }
    fn build_forward(&self, _ld: &Loader, _cp: &ContextParams) -> Result<Box<dyn Forward>> {
        Err(Error::Invalid("the model was loaded with vocab_only: it has no weights to run".into()))
    }
}

pub fn find(name: &str) -> Result<&'static dyn Arch> {
    REGISTRY.iter().copied().find(|a| a.name() == name).ok_or_else(|| {
        let known: Vec<&str> = REGISTRY.iter().map(|a| a.name()).collect();
        Error::Unsupported(format!("unknown model architecture '{name}' (supported: {})", known.join(", ")))
    })
}

pub const MAX_LAYERS: usize = 512;

/// The hparams every transformer shares, with llama.cpp's defaults
/// (src/llama-model.cpp `load_hparams`).
pub fn common_hparams(meta: &Meta, n_vocab: usize, rope_type: RopeType) -> Result<HParams> {
    common_hparams_ext(meta, n_vocab, rope_type, false)
}

/// `common_hparams` for recurrent and hybrid models (`no_attn_ok`): a head count of 0
/// (Mamba-2 files say 0) and layers with no KV heads (the recurrent layers of a hybrid)
/// are accepted; a model with no attention at all gets head sizes of 1 (unused).
pub fn common_hparams_ext(meta: &Meta, n_vocab: usize, rope_type: RopeType, no_attn_ok: bool) -> Result<HParams> {
    let n_layer = meta.req_u("block_count")?;
    // llama.cpp's LLAMA_MAX_LAYERS; also keeps per-layer vectors of a corrupted count small.
    if n_layer > MAX_LAYERS {
        return Err(Error::Unsupported(format!(
            "{}: {} is {n_layer}, more than the {MAX_LAYERS} layers llama.cpp supports",
            meta.file.path,
            meta.key("block_count")
        )));
    }
    let n_embd = meta.req_u("embedding_length")?;
    let n_head = meta.per_layer("attention.head_count", n_layer, if no_attn_ok { Some(0) } else { None })?;
    let n_head0 = if no_attn_ok { n_head.iter().copied().find(|&h| h > 0).unwrap_or(0) } else { *n_head.first().unwrap_or(&0) };
    let n_head_kv = meta.per_layer("attention.head_count_kv", n_layer, Some(n_head0))?;
    let n_ff = meta.per_layer("feed_forward_length", n_layer, Some(0))?;
    let default_head = if n_head0 > 0 { n_embd / n_head0 } else if no_attn_ok { 1 } else { 0 };
    let n_embd_head_k = meta.u("attention.key_length")?.unwrap_or(default_head);
    let n_embd_head_v = meta.u("attention.value_length")?.unwrap_or(default_head);
    let n_rot = meta.u("rope.dimension_count")?.unwrap_or(n_embd_head_k);
    let rope_freq_base = meta.f("rope.freq_base")?.unwrap_or(10000.0);
    let mut rope_freq_scale = 1.0;
    if let Some(factor) = meta.f("rope.scaling.factor")?.or(meta.f("rope.scale_linear")?) {
        if factor != 0.0 {
            rope_freq_scale = 1.0 / factor;
        }
    }
    if n_layer == 0 || n_embd == 0 || (n_head0 == 0 && !no_attn_ok) {
        return Err(Error::Unsupported(format!(
            "{}: block_count, embedding_length and head_count must be positive",
            meta.file.path
        )));
    }
    for il in 0..n_layer {
        if no_attn_ok && (n_head[il] == 0 || n_head_kv[il] == 0) {
            continue;
        }
        if n_head[il] == 0 || n_head_kv[il] == 0 || n_head[il] % n_head_kv[il] != 0 {
            return Err(Error::Unsupported(format!(
                "{}: layer {il}: head_count {} must be a positive multiple of head_count_kv {}",
                meta.file.path, n_head[il], n_head_kv[il]
            )));
        }
    }
    if n_rot > n_embd_head_k || n_rot % 2 != 0 {
        return Err(Error::Unsupported(format!(
            "{}: rope.dimension_count {n_rot} must be even and <= the head size {n_embd_head_k}",
            meta.file.path
        )));
    }
    let n_ctx_train = meta.u("context_length")?.unwrap_or(2048);
    Ok(HParams {
        arch: meta.arch.to_string(),
        n_vocab,
        n_ctx_train,
        n_embd,
        n_layer,
        n_head,
        n_head_kv,
        n_ff,
        n_embd_head_k,
        n_embd_head_v,
        n_rot,
        rope_type,
        rope_freq_base,
        rope_freq_scale,
        rope_freq_base_swa: rope_freq_base,
        rope_freq_scale_swa: rope_freq_scale,
        f_norm_eps: meta.f("attention.layer_norm_epsilon")?.unwrap_or(0.0),
        f_norm_rms_eps: meta.f("attention.layer_norm_rms_epsilon")?.unwrap_or(0.0),
        n_swa: 0,
        swa_layers: vec![false; n_layer],
        f_attn_logit_softcapping: meta.f("attn_logit_softcapping")?.unwrap_or(0.0),
        f_final_logit_softcapping: meta.f("final_logit_softcapping")?.unwrap_or(0.0),
        f_attention_scale: 0.0,
        rope_scaling_type: match meta.get("rope.scaling.type") {
            None => "linear".to_string(),
            Some(v) => v.as_str().map(str::to_string).ok_or_else(|| {
                Error::Unsupported(format!("{}: '{}' must be a string", meta.file.path, meta.key("rope.scaling.type")))
            })?,
        },
        n_ctx_orig_yarn: meta.u("rope.scaling.original_context_length")?.unwrap_or(n_ctx_train),
        rope_attn_factor: meta.f("rope.scaling.attn_factor")?.unwrap_or(0.0),
        yarn_beta_fast: meta.f("rope.scaling.yarn_beta_fast")?.unwrap_or(32.0),
        yarn_beta_slow: meta.f("rope.scaling.yarn_beta_slow")?.unwrap_or(1.0),
        rope_yarn_log_mul: meta.f("rope.scaling.yarn_log_multiplier")?.unwrap_or(0.0),
        f_attn_temp_scale: 0.0,
        n_attn_temp_floor_scale: 0,
        n_expert: meta.u("expert_count")?.unwrap_or(0),
        n_expert_used: meta.u("expert_used_count")?.unwrap_or(0),
        n_ff_exp: meta.u("expert_feed_forward_length")?.unwrap_or(0),
    })
}
