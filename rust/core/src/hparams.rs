//! Hyperparameters (pipeline step 4), read from `{arch}.*` metadata keys with llama.cpp's
//! defaults. Per-layer values are expanded to one entry per layer.

use crate::error::{Error, Result};
use crate::gguf::{GgufFile, Value};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeType {
    /// No rotary embedding.
    None,
    /// Rotates adjacent pairs (x[2i], x[2i+1]): LLaMA, Mistral.
    Norm,
    /// Rotates (x[i], x[i + n_rot/2]): GPT-NeoX, Qwen, Gemma, Phi.
    Neox,
}

#[derive(Clone, Debug)]
pub struct HParams {
    pub arch: String,
    pub n_vocab: usize,
    pub n_ctx_train: usize,
    pub n_embd: usize,
    pub n_layer: usize,
    /// Per layer.
    pub n_head: Vec<usize>,
    pub n_head_kv: Vec<usize>,
    pub n_ff: Vec<usize>,
    pub n_embd_head_k: usize,
    pub n_embd_head_v: usize,
    pub n_rot: usize,
    /// Head sizes and rotary dims of the sliding-window layers (`attention.key_length_swa`,
    /// `attention.value_length_swa`, `rope.dimension_count_swa`; default the ones above:
    /// llama.cpp's n_embd_head_k_swa etc., which differ in Gemma 4). Per layer: `head_k(il)`.
    pub n_embd_head_k_swa: usize,
    pub n_embd_head_v_swa: usize,
    pub n_rot_swa: usize,
    pub rope_type: RopeType,
    pub rope_freq_base: f32,
    pub rope_freq_scale: f32,
    /// Frequency base of sliding-window layers (gemma3: 10000).
    pub rope_freq_base_swa: f32,
    pub rope_freq_scale_swa: f32,
    pub f_norm_eps: f32,
    pub f_norm_rms_eps: f32,
    /// Sliding window size (0 = none).
    pub n_swa: usize,
    /// Per layer: whether the layer uses sliding-window attention.
    pub swa_layers: Vec<bool>,
    pub f_attn_logit_softcapping: f32,
    pub f_final_logit_softcapping: f32,
    /// Attention scale applied to QK^T (0 = 1/sqrt(n_embd_head_k)).
    pub f_attention_scale: f32,
    /// `rope.scaling.type`: "none", "linear" (default), "yarn", "longrope".
    pub rope_scaling_type: String,
    /// `rope.scaling.original_context_length` (default n_ctx_train).
    pub n_ctx_orig_yarn: usize,
    /// `rope.scaling.attn_factor` (0 = not set).
    pub rope_attn_factor: f32,
    pub yarn_beta_fast: f32,
    pub yarn_beta_slow: f32,
    pub rope_yarn_log_mul: f32,
    /// Llama-4 / mistral3 query temperature: q *= 1 + scale * ln(1 + floor(pos / floor_scale)).
    pub f_attn_temp_scale: f32,
    pub n_attn_temp_floor_scale: usize,
    /// Mixture of experts (qwen3moe): experts per layer, experts used per token, and the
    /// experts' feed-forward width (0 when the model has no experts).
    pub n_expert: usize,
    pub n_expert_used: usize,
    pub n_ff_exp: usize,
    /// `{arch}.attention.causal` (default true; encoders write false).
    pub causal_attn: bool,
    /// `{arch}.pooling_type` (llama_pooling_type: 0 none, 1 mean, 2 cls, 3 last, 4 rank;
    /// default none) and `{arch}.classifier.pooling_type` (the rank head's input: cls
    /// unless it says mean; -1 when absent).
    pub pooling_type: i32,
    pub pooling_type_cls: i32,
    /// Classifier outputs: the length of `{arch}.classifier.output_labels` (default 1).
    pub n_cls_out: usize,
    /// `{arch}.attention.max_alibi_bias` (0 = no ALiBi).
    pub f_max_alibi_bias: f32,
    /// `tokenizer.ggml.token_type_count` (BERT's token types; 0 when absent).
    pub n_token_types: usize,
    /// The shared expert's feed-forward width beside the routed experts (0: none).
    pub n_ff_shexp: usize,
    /// NextN (MTP) blocks after the `n_layer` run ones (in the file, not run).
    pub n_layer_nextn: usize,
}

impl HParams {
    /// The hyperparameters of a vocab-only load whose architecture pyllama cannot run (or
    /// whose `{arch}.*` keys are absent, as in llama.cpp's ggml-vocab-*.gguf files):
    /// llama.cpp skips reading hparams for such loads too. Everything but the names is 0.
    pub fn vocab_only(arch: &str, n_vocab: usize) -> HParams {
        HParams {
            arch: arch.to_string(),
            n_vocab,
            n_ctx_train: 0,
            n_embd: 0,
            n_layer: 0,
            n_head: Vec::new(),
            n_head_kv: Vec::new(),
            n_ff: Vec::new(),
            n_embd_head_k: 0,
            n_embd_head_v: 0,
            n_rot: 0,
            n_embd_head_k_swa: 0,
            n_embd_head_v_swa: 0,
            n_rot_swa: 0,
            rope_type: RopeType::None,
            rope_freq_base: 0.0,
            rope_freq_scale: 0.0,
            rope_freq_base_swa: 0.0,
            rope_freq_scale_swa: 0.0,
            f_norm_eps: 0.0,
            f_norm_rms_eps: 0.0,
            n_swa: 0,
            swa_layers: Vec::new(),
            f_attn_logit_softcapping: 0.0,
            f_final_logit_softcapping: 0.0,
            f_attention_scale: 0.0,
            rope_scaling_type: "none".to_string(),
            n_ctx_orig_yarn: 0,
            rope_attn_factor: 0.0,
            yarn_beta_fast: 0.0,
            yarn_beta_slow: 0.0,
            rope_yarn_log_mul: 0.0,
            f_attn_temp_scale: 0.0,
            n_attn_temp_floor_scale: 0,
            n_expert: 0,
            n_expert_used: 0,
            n_ff_exp: 0,
            causal_attn: true,
            pooling_type: 0,
            pooling_type_cls: -1,
            n_cls_out: 1,
            f_max_alibi_bias: 0.0,
            n_token_types: 0,
            n_ff_shexp: 0,
            n_layer_nextn: 0,
        }
    }

    pub fn n_head(&self, il: usize) -> usize {
        self.n_head[il]
    }
    pub fn n_head_kv(&self, il: usize) -> usize {
        self.n_head_kv[il]
    }
    fn is_swa(&self, il: usize) -> bool {
        self.swa_layers.get(il).copied().unwrap_or(false)
    }
    /// Layer il's K head size (llama.cpp's n_embd_head_k(il): the _swa one on sliding-window layers).
    pub fn head_k(&self, il: usize) -> usize {
        if self.is_swa(il) {
            self.n_embd_head_k_swa
        } else {
            self.n_embd_head_k
        }
    }
    pub fn head_v(&self, il: usize) -> usize {
        if self.is_swa(il) {
            self.n_embd_head_v_swa
        } else {
            self.n_embd_head_v
        }
    }
    /// Layer il's rotary dims (llama.cpp's n_rot(il)).
    pub fn rot(&self, il: usize) -> usize {
        if self.is_swa(il) {
            self.n_rot_swa
        } else {
            self.n_rot
        }
    }
    /// The largest K / V head size of any layer.
    pub fn max_head_k(&self) -> usize {
        self.n_embd_head_k.max(if self.swa_layers.iter().any(|&s| s) { self.n_embd_head_k_swa } else { 0 })
    }
    pub fn max_head_v(&self) -> usize {
        self.n_embd_head_v.max(if self.swa_layers.iter().any(|&s| s) { self.n_embd_head_v_swa } else { 0 })
    }
    pub fn n_embd_k_gqa(&self, il: usize) -> usize {
        self.head_k(il) * self.n_head_kv[il]
    }
    pub fn n_embd_v_gqa(&self, il: usize) -> usize {
        self.head_v(il) * self.n_head_kv[il]
    }
}

/// llama.cpp's LLAMA_MAX_EXPERTS.
pub const MAX_EXPERTS: usize = 512;
/// The largest width pyllama accepts for any per-token dimension (n_embd, n_ff, head
/// counts, head sizes): far above every real model (n_ff ~ 1e5), and small enough that
/// every product of two of them fits in 48 bits, so shape arithmetic cannot overflow.
pub const MAX_DIM: usize = 1 << 24;

impl HParams {
    /// Bounds every hyperparameter against the architecture before anything is sized from
    /// it (pipeline step 4): a corrupted or hostile count must fail here with the key's
    /// name, not as a huge allocation or an index out of range later. `moe`: whether the
    /// architecture's forward pass has experts.
    pub fn check(&self, path: &str, moe: bool) -> Result<()> {
        let bad = |m: String| Err(Error::Unsupported(format!("{path}: {m}")));
        let a = &self.arch;
        let dims: [(&str, usize); 6] = [
            ("embedding_length", self.n_embd),
            ("attention.key_length", self.n_embd_head_k),
            ("attention.value_length", self.n_embd_head_v),
            ("rope.dimension_count", self.n_rot),
            ("expert_feed_forward_length", self.n_ff_exp),
            ("expert_shared_feed_forward_length", self.n_ff_shexp),
        ];
        for (key, v) in dims {
            if v > MAX_DIM {
                return bad(format!("{a}.{key} = {v} is larger than pyllama's limit of {MAX_DIM}"));
            }
        }
        for il in 0..self.n_layer {
            for (key, v) in [
                ("attention.head_count", self.n_head[il]),
                ("attention.head_count_kv", self.n_head_kv[il]),
                ("feed_forward_length", self.n_ff[il]),
            ] {
                if v > MAX_DIM {
                    return bad(format!("{a}.{key} = {v} (layer {il}) is larger than pyllama's limit of {MAX_DIM}"));
                }
            }
        }
        if self.n_layer > 0 && (self.n_embd_head_k == 0 || self.n_embd_head_v == 0) {
            return bad(format!(
                "{a}.attention.key_length ({}) and {a}.attention.value_length ({}) must be positive",
                self.n_embd_head_k, self.n_embd_head_v
            ));
        }
        // llama.cpp's load_hparams asserts these (GGML_ASSERT aborts there).
        if self.n_expert > MAX_EXPERTS {
            return bad(format!("{a}.expert_count = {} is more than llama.cpp's {MAX_EXPERTS} experts", self.n_expert));
        }
        if self.n_expert_used > self.n_expert {
            return bad(format!(
                "{a}.expert_used_count = {} is more than {a}.expert_count = {}",
                self.n_expert_used, self.n_expert
            ));
        }
        if (self.n_expert == 0) != (self.n_expert_used == 0) {
            return bad(format!(
                "{a}.expert_count = {} and {a}.expert_used_count = {}: both must be 0 or both positive",
                self.n_expert, self.n_expert_used
            ));
        }
        if self.n_expert > 0 && !moe {
            return bad(format!(
                "{a}.expert_count = {}: mixture-of-experts '{a}' models are not supported (pyllama's '{a}' is dense)",
                self.n_expert
            ));
        }
        if moe && self.n_expert == 0 {
            return bad(format!("{a}.expert_count is missing or 0, but '{a}' is a mixture-of-experts architecture"));
        }
        Ok(())
    }
}

/// Typed access to `{arch}.*` keys with clear errors.
pub struct Meta<'a> {
    pub file: &'a GgufFile,
    pub arch: &'a str,
}

impl<'a> Meta<'a> {
    pub fn key(&self, suffix: &str) -> String {
        format!("{}.{}", self.arch, suffix)
    }
    pub fn get(&self, suffix: &str) -> Option<&'a Value> {
        self.file.get(&self.key(suffix))
    }
    pub fn u(&self, suffix: &str) -> Result<Option<usize>> {
        match self.get(suffix) {
            None => Ok(None),
            Some(v) => match v.as_i64() {
                Some(x) if x >= 0 => Ok(Some(x as usize)),
                _ => Err(Error::Unsupported(format!(
                    "{}: metadata key '{}' must be a non-negative integer",
                    self.file.path,
                    self.key(suffix)
                ))),
            },
        }
    }
    pub fn req_u(&self, suffix: &str) -> Result<usize> {
        self.u(suffix)?.ok_or_else(|| {
            Error::Unsupported(format!("{}: missing required metadata key '{}'", self.file.path, self.key(suffix)))
        })
    }
    pub fn f(&self, suffix: &str) -> Result<Option<f32>> {
        match self.get(suffix) {
            None => Ok(None),
            Some(v) => v.as_f64().map(|x| Some(x as f32)).ok_or_else(|| {
                Error::Unsupported(format!("{}: metadata key '{}' must be a number", self.file.path, self.key(suffix)))
            }),
        }
    }
    pub fn b(&self, suffix: &str) -> Result<Option<bool>> {
        match self.get(suffix) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => v.as_i64().map(|x| Some(x != 0)).ok_or_else(|| {
                Error::Unsupported(format!("{}: metadata key '{}' must be a boolean", self.file.path, self.key(suffix)))
            }),
        }
    }
    /// A scalar or a per-layer array, expanded to `n_layer` values.
    pub fn per_layer(&self, suffix: &str, n_layer: usize, default: Option<usize>) -> Result<Vec<usize>> {
        match self.get(suffix) {
            None => default.map(|d| vec![d; n_layer]).ok_or_else(|| {
                Error::Unsupported(format!("{}: missing required metadata key '{}'", self.file.path, self.key(suffix)))
            }),
            Some(Value::Array(values)) => {
                if values.len() != n_layer {
                    return Err(Error::Unsupported(format!(
                        "{}: '{}' has {} entries, expected one per layer ({})",
                        self.file.path,
                        self.key(suffix),
                        values.len(),
                        n_layer
                    )));
                }
                values
                    .iter()
                    .map(|v| v.as_i64().filter(|&x| x >= 0).map(|x| x as usize))
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(|| {
                        Error::Unsupported(format!("{}: '{}' must hold non-negative integers", self.file.path, self.key(suffix)))
                    })
            }
            Some(_) => Ok(vec![self.req_u(suffix)?; n_layer]),
        }
    }
}
