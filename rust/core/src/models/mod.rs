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
pub mod gemma3n;
pub mod gemma4;
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
pub mod encoder;
pub mod bert;
pub mod nomic_bert;
pub mod jina_bert_v2;
pub mod modern_bert;
pub mod gemma_embedding;
pub mod t5encoder;
pub mod nomic_bert_moe;
pub mod llama_embed;
pub mod llama4;
pub mod phimoe;
pub mod glm4moe;
pub mod cohere2;
pub mod openai_moe;
pub mod deepseek2;
pub mod arwkv7;
pub mod mamba;
pub mod mamba2;
pub mod lfm2;
pub mod lfm2moe;
pub mod qwen35;
pub mod rwkv6;
pub mod rwkv7;
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
    &gemma4::Gemma4,
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
    &bert::Bert,
    &nomic_bert::NomicBert,
    &jina_bert_v2::JinaBertV2,
    &modern_bert::ModernBert,
    &gemma_embedding::GemmaEmbedding,
    &t5encoder::T5Encoder,
    &nomic_bert_moe::NomicBertMoe,
    &llama_embed::LlamaEmbed,
    &llama4::Llama4,
    &phimoe::PhiMoe,
    &granite::GraniteMoe,
    &glm4moe::Glm4Moe,
    &cohere2::Cohere2,
    &openai_moe::OpenAiMoe,
    &deepseek2::Deepseek2,
    &deepseek2::Mistral4,
    &mamba::Mamba,
    &mamba2::Mamba2,
    &lfm2::Lfm2,
    &lfm2moe::Lfm2Moe,
    &qwen35::Qwen35,
    &qwen35::Qwen35Moe,
    &qwen35::Qwen3Next,
    &falcon_h1::FalconH1,
    &granite_hybrid::GraniteHybrid,
    &gemma3n::Gemma3n,
    &rwkv6::Rwkv6,
    &rwkv7::Rwkv7,
    &arwkv7::Arwkv7,
    &arwkv7::Rwkv6Qwen2,
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
/// The hyperparameters of an attention-free recurrent model (mamba, mamba2, rwkv6, rwkv7):
/// the common keys without rope; `check` validates the architecture's own keys (given
/// n_embd).
pub fn recurrent_hparams(meta: &Meta, n_vocab: usize, check: impl FnOnce(&Meta, usize) -> Result<()>) -> Result<HParams> {
    let mut hp = common_hparams_ext(meta, n_vocab, RopeType::None, true)?;
    check(meta, hp.n_embd)?;
    hp.n_rot = 0;
    Ok(hp)
}

/// `{arch}.<key>` for each of `keys` (None: required; Some(d): absent means d), every one
/// in [1, MAX_DIM], or an error that names them all with their values.
pub fn read_sizes<const N: usize>(meta: &Meta, keys: [(&str, Option<usize>); N]) -> Result<[usize; N]> {
    let mut v = [0usize; N];
    for (x, (k, d)) in v.iter_mut().zip(keys) {
        *x = match d {
            None => meta.req_u(k)?,
            Some(d) => meta.u(k)?.unwrap_or(d),
        };
    }
    let lim = crate::hparams::MAX_DIM;
    if v.iter().any(|&x| x == 0 || x > lim) {
        let named: Vec<String> = keys.iter().zip(v).map(|((k, _), x)| format!("{k} {x}")).collect();
        return Err(Error::Unsupported(format!("{}: {} must be in [1, {lim}]", meta.file.path, named.join(", "))));
    }
    Ok(v)
}

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
    // llama.cpp reads the sliding-window layers' head sizes and rotary dims for every architecture
    let n_embd_head_k_swa = meta.u("attention.key_length_swa")?.unwrap_or(n_embd_head_k);
    let n_embd_head_v_swa = meta.u("attention.value_length_swa")?.unwrap_or(n_embd_head_v);
    let n_rot_swa = meta.u("rope.dimension_count_swa")?.unwrap_or(n_rot);
    if n_rot_swa > n_embd_head_k_swa || n_rot_swa % 2 != 0 {
        return Err(Error::Unsupported(format!(
            "{}: rope.dimension_count_swa {n_rot_swa} must be even and <= the sliding-window head size {n_embd_head_k_swa}",
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
        n_embd_head_k_swa,
        n_embd_head_v_swa,
        n_rot_swa,
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
        causal_attn: meta.b("attention.causal")?.unwrap_or(true),
        pooling_type: pooling(meta, "pooling_type", 0)?,
        pooling_type_cls: pooling(meta, "classifier.pooling_type", -1)?,
        n_cls_out: match meta.get("classifier.output_labels") {
            Some(crate::gguf::Value::Array(a)) if !a.is_empty() => a.len(),
            _ => 1,
        },
        f_max_alibi_bias: meta.f("attention.max_alibi_bias")?.unwrap_or(0.0),
        n_token_types: match meta.file.get("tokenizer.ggml.token_type_count") {
            None => 0,
            Some(v) => v.as_i64().filter(|&x| (0..=1 << 20).contains(&x)).ok_or_else(|| {
                Error::Unsupported(format!("{}: 'tokenizer.ggml.token_type_count' must be a small non-negative integer", meta.file.path))
            })? as usize,
        },
        n_ff_shexp: 0,
        n_layer_nextn: 0,
    })
}

/// A llama_pooling_type key: 0 none .. 4 rank (absent: `default`).
fn pooling(meta: &Meta, suffix: &str, default: i32) -> Result<i32> {
    match meta.u(suffix)? {
        None => Ok(default),
        Some(p) if p <= 4 => Ok(p as i32),
        Some(p) => Err(Error::Unsupported(format!(
            "{}: '{}' = {p} is not a pooling type (0 none, 1 mean, 2 cls, 3 last, 4 rank)",
            meta.file.path,
            meta.key(suffix)
        ))),
    }
}

/// llama.cpp's `load_swa_pattern(ml, n_pattern, dense_first)`: `attention.sliding_window_pattern`
/// as a per-layer bool array is the pattern itself; as a number (or absent: `n_pattern`)
/// layer il slides when `il % n != n - 1` (dense_first: when `il % n != 0`); 0 = every layer.
pub fn swa_pattern(meta: &Meta, n_layer: usize, n_pattern: usize, dense_first: bool) -> Result<Vec<bool>> {
    let key = "attention.sliding_window_pattern";
    if let Some(crate::gguf::Value::Array(a)) = meta.get(key) {
        let v: Option<Vec<bool>> = a.iter().map(|x| x.as_bool().or_else(|| x.as_i64().map(|i| i != 0))).collect();
        return match v {
            Some(v) if v.len() == n_layer => Ok(v),
            _ => Err(Error::Unsupported(format!(
                "{}: '{}' must hold one bool per layer ({n_layer})",
                meta.file.path,
                meta.key(key)
            ))),
        };
    }
    let n = meta.u(key)?.unwrap_or(n_pattern);
    Ok((0..n_layer)
        .map(|il| if dense_first { n == 0 || il % n != 0 } else { n == 0 || il % n < n - 1 })
        .collect())
}

/// The routing keys llama.cpp's MoE architectures read (DeepSeek V2/V3, GLM-4.5):
/// `expert_gating_func` (1 softmax, 2 sigmoid, 3 softmax of the selected logits; absent or 0:
/// `default`), `expert_weights_norm` (default false), `expert_weights_scale` (default 0 =
/// none) and the expert groups `expert_group_count` / `expert_group_used_count`, checked
/// as llama.cpp's load_hparams asserts them.
pub fn moe_routing(meta: &Meta, hp: &HParams, default: graph::Gating) -> Result<graph::MoeConfig> {
    let bad = |m: String| Error::Unsupported(format!("{}: {m}", meta.file.path));
    let gating = match meta.u("expert_gating_func")?.unwrap_or(0) {
        0 => default,
        1 => graph::Gating::Softmax,
        2 => graph::Gating::Sigmoid,
        3 => graph::Gating::SoftmaxWeight,
        g => return Err(bad(format!("'{}' = {g} is not a gating function pyllama knows", meta.key("expert_gating_func")))),
    };
    let norm_w = match meta.get("expert_weights_norm") {
        None => false,
        Some(v) => v.as_bool().ok_or_else(|| bad(format!("'{}' must be a bool", meta.key("expert_weights_norm"))))?,
    };
    let (groups, used) = (meta.u("expert_group_count")?.unwrap_or(0), meta.u("expert_group_used_count")?.unwrap_or(0));
    if groups > 1 && (groups >= hp.n_expert || hp.n_expert % groups != 0 || used == 0 || used >= groups) {
        return Err(bad(format!(
            "'{}' = {groups} and '{}' = {used} must divide the {} experts into groups of which some but not all are used",
            meta.key("expert_group_count"),
            meta.key("expert_group_used_count"),
            hp.n_expert
        )));
    }
    Ok(graph::MoeConfig {
        gating,
        norm_w,
        w_scale: meta.f("expert_weights_scale")?.unwrap_or(0.0),
        n_groups: groups,
        n_group_used: used,
        ..graph::MoeConfig::softmax(hp.n_expert_used, norm_w)
    })
}

/// Drops the last `nextn_predict_layers` blocks (NextN / MTP layers, which llama.cpp keeps
/// in the file but does not run): `n_layer` = block_count - nextn_predict_layers.
pub fn drop_nextn_layers(meta: &Meta, hp: &mut HParams) -> Result<()> {
    let nextn = meta.u("nextn_predict_layers")?.unwrap_or(0);
    if nextn >= hp.n_layer {
        return Err(Error::Unsupported(format!(
            "{}: '{}' = {nextn} leaves no layers of the {} to run",
            meta.file.path,
            meta.key("nextn_predict_layers"),
            hp.n_layer
        )));
    }
    hp.n_layer -= nextn;
    hp.n_layer_nextn = nextn;
    let n = hp.n_layer;
    hp.n_head.truncate(n);
    hp.n_head_kv.truncate(n);
    hp.n_ff.truncate(n);
    hp.swa_layers.truncate(n);
    Ok(())
}
