//! Which type each tensor gets: llama.cpp's src/llama-quant.cpp (`llama_ftype_get_default_type`,
//! `tensor_allows_quantization`, `llama_tensor_get_type(_impl)`, `tensor_type_fallback`),
//! rule for rule and in the same order, so that a mix (Q4_K_M, Q3_K_L, IQ3_M, ...) picks
//! the same type per tensor as llama-quantize.

use crate::ggml_type::GgmlType;

/// A llama.cpp file type (`llama_ftype`): the value of `general.file_type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ftype {
    pub id: u32,
    pub name: &'static str,
}

/// llama-quantize's type names (QUANT_OPTIONS, in its order) and their `llama_ftype`. The
/// aliases Q3_K / Q4_K / Q5_K are the _M mixes; COPY copies every tensor unchanged.
pub const FTYPES: &[(&str, u32)] = &[
    ("Q1_0", 40),
    ("Q2_0", 41),
    ("Q4_0", 2),
    ("Q4_1", 3),
    ("MXFP4_MOE", 38),
    ("Q5_0", 8),
    ("Q5_1", 9),
    ("IQ2_XXS", 19),
    ("IQ2_XS", 20),
    ("IQ2_S", 28),
    ("IQ2_M", 29),
    ("IQ1_S", 24),
    ("IQ1_M", 31),
    ("TQ1_0", 36),
    ("TQ2_0", 37),
    ("Q2_K", 10),
    ("Q2_K_S", 21),
    ("IQ3_XXS", 23),
    ("IQ3_S", 26),
    ("IQ3_M", 27),
    ("Q3_K", 12),
    ("IQ3_XS", 22),
    ("Q3_K_S", 11),
    ("Q3_K_M", 12),
    ("Q3_K_L", 13),
    ("IQ4_NL", 25),
    ("IQ4_XS", 30),
    ("Q4_K", 15),
    ("Q4_K_S", 14),
    ("Q4_K_M", 15),
    ("Q5_K", 17),
    ("Q5_K_S", 16),
    ("Q5_K_M", 17),
    ("Q6_K", 18),
    ("Q8_0", 7),
    ("F16", 1),
    ("BF16", 32),
    ("F32", 0),
    ("COPY", 0),
];

pub mod ft {
    pub const ALL_F32: u32 = 0;
    pub const F16: u32 = 1;
    pub const Q4_0: u32 = 2;
    pub const Q4_1: u32 = 3;
    pub const Q8_0: u32 = 7;
    pub const Q5_0: u32 = 8;
    pub const Q5_1: u32 = 9;
    pub const Q2_K: u32 = 10;
    pub const Q3_K_S: u32 = 11;
    pub const Q3_K_M: u32 = 12;
    pub const Q3_K_L: u32 = 13;
    pub const Q4_K_S: u32 = 14;
    pub const Q4_K_M: u32 = 15;
    pub const Q5_K_S: u32 = 16;
    pub const Q5_K_M: u32 = 17;
    pub const Q6_K: u32 = 18;
    pub const IQ2_XXS: u32 = 19;
    pub const IQ2_XS: u32 = 20;
    pub const Q2_K_S: u32 = 21;
    pub const IQ3_XS: u32 = 22;
    pub const IQ3_XXS: u32 = 23;
    pub const IQ1_S: u32 = 24;
    pub const IQ4_NL: u32 = 25;
    pub const IQ3_S: u32 = 26;
    pub const IQ3_M: u32 = 27;
    pub const IQ2_S: u32 = 28;
    pub const IQ2_M: u32 = 29;
    pub const IQ4_XS: u32 = 30;
    pub const IQ1_M: u32 = 31;
    pub const BF16: u32 = 32;
    pub const TQ1_0: u32 = 36;
    pub const TQ2_0: u32 = 37;
    pub const MXFP4_MOE: u32 = 38;
    pub const Q1_0: u32 = 40;
    pub const Q2_0: u32 = 41;
}

/// llama-quantize's `try_parse_ftype`: a name (any case) or a number.
pub fn parse_ftype(s: &str) -> Option<Ftype> {
    let up = s.to_ascii_uppercase();
    if let Some(&(name, id)) = FTYPES.iter().find(|(n, _)| *n == up) {
        return Some(Ftype { id, name });
    }
    let n: u32 = s.trim().parse().ok()?;
    FTYPES.iter().find(|(_, id)| *id == n).map(|&(name, id)| Ftype { id, name })
}

/// `llama_ftype_get_default_type`.
pub fn default_type(ftype: u32) -> Option<GgmlType> {
    use GgmlType::*;
    Some(match ftype {
        ft::Q4_0 => Q4_0,
        ft::Q4_1 => Q4_1,
        ft::Q5_0 => Q5_0,
        ft::Q5_1 => Q5_1,
        ft::Q8_0 => Q8_0,
        ft::F16 => F16,
        ft::BF16 => BF16,
        ft::ALL_F32 => F32,
        ft::MXFP4_MOE => MXFP4,
        ft::Q2_K_S | ft::Q2_K => Q2_K,
        ft::IQ3_XS => IQ3_S,
        ft::Q3_K_S | ft::Q3_K_M | ft::Q3_K_L => Q3_K,
        ft::Q4_K_S | ft::Q4_K_M => Q4_K,
        ft::Q5_K_S | ft::Q5_K_M => Q5_K,
        ft::Q6_K => Q6_K,
        ft::TQ1_0 => TQ1_0,
        ft::TQ2_0 => TQ2_0,
        ft::Q1_0 => Q1_0,
        ft::Q2_0 => Q2_0,
        ft::IQ2_XXS => IQ2_XXS,
        ft::IQ2_XS => IQ2_XS,
        ft::IQ2_S => IQ2_XS,
        ft::IQ2_M => IQ2_S,
        ft::IQ3_XXS => IQ3_XXS,
        ft::IQ1_S => IQ1_S,
        ft::IQ1_M => IQ1_M,
        ft::IQ4_NL => IQ4_NL,
        ft::IQ4_XS => IQ4_XS,
        ft::IQ3_S | ft::IQ3_M => IQ3_S,
        _ => return None,
    })
}

/// `ggml_is_quantized`: every block type (not F32/F16/BF16/F64 or the integer types).
pub fn is_quantized(t: GgmlType) -> bool {
    use GgmlType::*;
    !matches!(t, F32 | F16 | BF16 | F64 | I8 | I16 | I32 | I64)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Category {
    TokenEmbd,
    AttentionQ,
    AttentionV,
    AttentionK,
    AttentionQkv,
    AttentionKvB,
    AttentionOutput,
    FfnUp,
    FfnGate,
    FfnDown,
    Output,
    Other,
}

fn is_token_embd(name: &str) -> bool {
    name == "token_embd.weight" || name == "per_layer_token_embd.weight"
}

pub fn category(name: &str) -> Category {
    use Category::*;
    if name == "output.weight" {
        return Output;
    }
    if is_token_embd(name) {
        return TokenEmbd;
    }
    let has = |s: &str| name.contains(s);
    if has("attn_qkv.weight") {
        AttentionQkv
    } else if has("attn_kv_b.weight") {
        AttentionKvB
    } else if has("attn_v.weight") {
        AttentionV
    } else if has("attn_k.weight") {
        AttentionK
    } else if has("attn_q.weight") {
        AttentionQ
    } else if has("attn_output.weight") {
        AttentionOutput
    } else if has("ffn_up") {
        FfnUp
    } else if has("ffn_gate") {
        FfnGate
    } else if has("ffn_down") {
        FfnDown
    } else {
        Other
    }
}

fn is_attn_v(c: Category) -> bool {
    matches!(c, Category::AttentionV | Category::AttentionQkv | Category::AttentionKvB)
}

/// `sscanf(name, "blk.%d.", &il)`: the layer number, or None.
pub fn layer_of(name: &str) -> Option<i64> {
    let rest = name.strip_prefix("blk.")?;
    let rest = rest.trim_start();
    let (sign, digits) = match rest.as_bytes().first() {
        Some(b'-') => (-1, &rest[1..]),
        Some(b'+') => (1, &rest[1..]),
        _ => (1, rest),
    };
    let n = digits.bytes().take_while(|b| b.is_ascii_digit()).count();
    if n == 0 {
        return None;
    }
    digits[..n].parse::<i64>().ok().map(|v| sign * v)
}

/// `weight_name_comparer`: by layer number (-1 without one), then by name.
pub fn tensor_order(a: &str, b: &str) -> std::cmp::Ordering {
    let la = layer_of(a).unwrap_or(-1);
    let lb = layer_of(b).unwrap_or(-1);
    la.cmp(&lb).then_with(|| a.as_bytes().cmp(b.as_bytes()))
}

/// What the type choice needs to know about the model (llama_model's hparams).
#[derive(Clone, Debug, Default)]
pub struct ModelInfo {
    pub arch: String,
    /// `{arch}.block_count`.
    pub n_layer: u32,
    /// Heads of layer 0 (`n_gqa()` is n_head / n_head_kv of layer 0).
    pub n_head: u32,
    pub n_head_kv: u32,
    pub n_expert: u32,
    /// llama.cpp's LLM_TYPE_70B (the only size class the mixes look at).
    pub is_70b: bool,
}

impl ModelInfo {
    fn n_gqa(&self) -> u32 {
        if self.n_head_kv == 0 {
            0
        } else {
            self.n_head / self.n_head_kv
        }
    }
}

/// What llama-quantize's switches set (llama_model_quantize_params).
#[derive(Clone, Debug)]
pub struct SelectParams {
    pub ftype: u32,
    pub output_tensor_type: Option<GgmlType>,
    pub token_embedding_type: Option<GgmlType>,
    pub quantize_output_tensor: bool,
    pub only_copy: bool,
    pub pure: bool,
    pub has_imatrix: bool,
    /// `--tensor-type PATTERN=TYPE`, in order (the first pattern that matches a name wins).
    pub tensor_types: Vec<(String, GgmlType)>,
    /// How a pattern matches a tensor name: llama.cpp uses `std::regex_search`; the caller
    /// supplies the regular-expression search (Python's `re.search` in the binding). Without
    /// one, a pattern matches names that contain it as a substring.
    pub tensor_type_matcher: Option<TensorTypeMatcher>,
}

/// `(pattern index, tensor name) -> matches?` for `SelectParams::tensor_types`.
#[derive(Clone)]
pub struct TensorTypeMatcher(pub std::sync::Arc<dyn Fn(usize, &str) -> bool + Send + Sync>);

impl std::fmt::Debug for TensorTypeMatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TensorTypeMatcher")
    }
}

impl SelectParams {
    /// The type of the first `--tensor-type` pattern that matches `name`.
    pub fn manual_type(&self, name: &str) -> Option<GgmlType> {
        self.tensor_types.iter().enumerate().find_map(|(i, (pat, ty))| {
            let hit = match &self.tensor_type_matcher {
                Some(m) => (m.0)(i, name),
                None => name.contains(pat.as_str()),
            };
            hit.then_some(*ty)
        })
    }
}

impl Default for SelectParams {
    fn default() -> Self {
        SelectParams {
            ftype: ft::Q8_0,
            output_tensor_type: None,
            token_embedding_type: None,
            quantize_output_tensor: true,
            only_copy: false,
            pure: false,
            has_imatrix: false,
            tensor_types: Vec::new(),
            tensor_type_matcher: None,
        }
    }
}

/// A tensor as the type choice sees it.
#[derive(Clone, Debug)]
pub struct TensorDesc {
    pub name: String,
    pub ty: GgmlType,
    pub ne: [u64; 4],
}

impl TensorDesc {
    fn n_dims(&self) -> usize {
        (1..4).rev().find(|&i| self.ne[i] != 1).map(|i| i + 1).unwrap_or(1)
    }
}

/// `tensor_allows_quantization`.
pub fn allows_quantization(p: &SelectParams, arch: &str, t: &TensorDesc) -> bool {
    if p.only_copy || t.n_dims() < 2 {
        return false;
    }
    let name = t.name.as_str();
    let has = |s: &str| name.contains(s);
    let mut q = name.ends_with("weight");
    q &= !has("_norm.weight");
    q &= p.quantize_output_tensor || name != "output.weight";
    q &= !has("ffn_gate_inp.weight");
    q &= !has("ffn_gate_tid2eid.weight");
    q &= !has("altup");
    q &= !has("laurel");
    q &= !has("per_layer_model_proj");
    q &= name != "position_embd.weight";
    q &= name != "token_types.weight";
    q &= !has("ssm_conv1d");
    q &= !has("shortconv.conv.weight");
    q &= !has("indexer.k_proj.weight");
    q &= !has("indexer.q_proj.weight");
    if arch == "glm5-next" {
        for s in [
            "hc_",
            "indexer.attn_q_b",
            "indexer.attn_k",
            "indexer.proj",
            "indexer_compressor_gate",
            "indexer_compressor_ape",
            "ssm_f_a.weight",
            "ssm_f_b.weight",
            "ssm_g_a.weight",
            "ssm_g_b.weight",
            "ssm_beta.weight",
            "attn_kv_a_mqa.weight",
            "attn_k_b.weight",
            "attn_v_b.weight",
        ] {
            q &= !has(s);
        }
    }
    for s in [
        "time_mix_first.weight",
        "time_mix_w0.weight",
        "time_mix_w1.weight",
        "time_mix_w2.weight",
        "time_mix_v0.weight",
        "time_mix_v1.weight",
        "time_mix_v2.weight",
        "time_mix_a0.weight",
        "time_mix_a1.weight",
        "time_mix_a2.weight",
        "time_mix_g1.weight",
        "time_mix_g2.weight",
        "time_mix_decay_w1.weight",
        "time_mix_decay_w2.weight",
        "time_mix_lerp_fused.weight",
        "attn_rel_b.weight",
        ".position_embd",
        "sam.pos_embd",
        "sam.neck.",
        "sam.net_",
        ".rel_pos",
        ".patch_embd",
        ".patch_merger",
        "a.rvq.codebook",
        "mm.a.code_embd",
    ] {
        q &= !has(s);
    }
    q
}

/// `quantize_state_impl`: the counters the mixes walk through, tensor by tensor.
pub struct Selector<'a> {
    pub model: &'a ModelInfo,
    pub params: &'a SelectParams,
    n_attention_wv: i64,
    n_ffn_down: i64,
    n_ffn_gate: i64,
    n_ffn_up: i64,
    i_attention_wv: i64,
    i_ffn_down: i64,
    i_ffn_gate: i64,
    i_ffn_up: i64,
    pub n_fallback: usize,
    has_tied_embeddings: bool,
    /// Warnings as llama.cpp logs them (fallbacks, manual overrides).
    pub warnings: Vec<String>,
}

impl<'a> Selector<'a> {
    /// `init_quantize_state_counters` over the names of every tensor, in file order.
    pub fn new<'n>(model: &'a ModelInfo, params: &'a SelectParams, names: impl Iterator<Item = &'n str>) -> Self {
        let mut s = Selector {
            model,
            params,
            n_attention_wv: 0,
            n_ffn_down: model.n_layer as i64,
            n_ffn_gate: model.n_layer as i64,
            n_ffn_up: model.n_layer as i64,
            i_attention_wv: 0,
            i_ffn_down: 0,
            i_ffn_gate: 0,
            i_ffn_up: 0,
            n_fallback: 0,
            has_tied_embeddings: true,
            warnings: Vec::new(),
        };
        for n in names {
            let c = category(n);
            if is_attn_v(c) {
                s.n_attention_wv += 1;
            }
            if c == Category::Output {
                s.has_tied_embeddings = false;
            }
        }
        s
    }

    /// `llama_tensor_get_type` with `tensor_allows_quantization` in front (the type a
    /// tensor is written as). Errors name the tensor (no fallback type, bad layer).
    pub fn target_type(&mut self, t: &TensorDesc) -> Result<GgmlType, String> {
        let p = self.params;
        if !allows_quantization(p, &self.model.arch, t) {
            return Ok(t.ty);
        }
        let cat = category(&t.name);
        let default = default_type(p.ftype).ok_or_else(|| format!("invalid output file type {}", p.ftype))?;
        if let (Some(tt), Category::TokenEmbd) = (p.token_embedding_type, cat) {
            let named = t.name == "per_layer_token_embd.weight" && p.manual_type(&t.name).is_some();
            if !named {
                return Ok(tt);
            }
        }
        if let (Some(ot), Category::Output) = (p.output_tensor_type, cat) {
            return Ok(ot);
        }
        let mut new_type = default;
        if is_quantized(default) {
            let manual_type = if p.tensor_types.is_empty() { None } else { p.manual_type(&t.name) };
            let manual = manual_type.is_some();
            if let Some(qt) = manual_type {
                if qt != new_type {
                    self.warnings.push(format!("{}: applying manual override: {} -> {}", t.name, new_type, qt));
                    new_type = qt;
                }
            }
            if !manual && !p.pure {
                new_type = self.get_type_impl(new_type, t, cat)?;
            }
            new_type = self.fallback(t, new_type)?;
        }
        Ok(new_type)
    }

    fn fallback(&mut self, t: &TensorDesc, target: GgmlType) -> Result<GgmlType, String> {
        use GgmlType::*;
        let ncols = t.ne[0];
        let qk = target.block_size() as u64;
        if ncols % qk == 0 {
            return Ok(target);
        }
        self.n_fallback += 1;
        let mut ret = match target {
            IQ1_S | IQ1_M | IQ2_XXS | IQ2_XS | IQ2_S | IQ3_XXS | IQ3_S | IQ4_XS => IQ4_NL,
            Q2_0 | Q2_K | Q3_K | TQ1_0 | TQ2_0 => Q4_0,
            Q4_K => Q5_0,
            Q5_K => Q5_1,
            Q6_K => Q8_0,
            _ if qk <= 32 => target,
            _ => return Err(format!("no tensor type fallback is defined for type {target}")),
        };
        let mut msg = format!("{} - ncols {ncols} not divisible by {qk} (required for type {target}) ", t.name);
        if ncols % ret.block_size() as u64 != 0 {
            msg.push_str("(WARNING: must use F16 due to unusual shape) ");
            ret = F16;
        }
        msg.push_str(&format!("-> falling back to {ret}"));
        self.warnings.push(msg);
        Ok(ret)
    }

    fn layer_info(&self, i_layer: i64, n_layer: i64, name: &str) -> Result<(i64, i64), String> {
        if self.model.n_expert.max(1) > 1 {
            let il = layer_of(name).ok_or_else(|| format!("Failed to determine layer for tensor {name}"))?;
            if il < 0 || il >= n_layer {
                return Err(format!("Bad layer {il} for tensor {name}. Must be in [0, {n_layer})"));
            }
            return Ok((il, n_layer));
        }
        Ok((i_layer, n_layer))
    }

    /// `llama_tensor_get_type_impl`: the mixes.
    fn get_type_impl(&mut self, mut new_type: GgmlType, t: &TensorDesc, cat: Category) -> Result<GgmlType, String> {
        use Category as C;
        use GgmlType::*;
        let ftype = self.params.ftype;
        let arch = self.model.arch.as_str();
        let m = self.model;
        let name = t.name.as_str();
        let falcon = arch == "falcon";
        let use_more_bits = |i: i64, n: i64| i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
        let is = |f: u32| ftype == f;

        if arch == "glm5-next" && (name.contains("attn_q_a") || name.contains("attn_q_b") || name.contains("nextn.eh_proj")) {
            match new_type {
                F32 | BF16 | F16 => {}
                _ => return Ok(Q8_0),
            }
        }

        let iq_low = [ft::IQ2_XXS, ft::IQ2_XS, ft::IQ1_S, ft::IQ2_S, ft::IQ2_M, ft::IQ1_M];
        if cat == C::Output || (self.has_tied_embeddings && cat == C::TokenEmbd) {
            if let Some(ot) = self.params.output_tensor_type {
                new_type = ot;
            } else {
                let nx = t.ne[0];
                let qk = new_type.block_size() as u64;
                if is(ft::MXFP4_MOE) {
                    new_type = Q8_0;
                } else if falcon || nx % qk != 0 {
                    new_type = Q8_0;
                } else if [ft::IQ2_XXS, ft::IQ2_XS, ft::IQ3_XXS, ft::IQ1_S, ft::IQ2_S, ft::IQ2_M, ft::IQ1_M].contains(&ftype) {
                    new_type = Q5_K;
                } else if new_type != Q8_0 {
                    new_type = Q6_K;
                }
            }
        } else if is(ft::MXFP4_MOE) {
            let bailing_expert = arch == "bailingmoe3" && matches!(cat, C::FfnUp | C::FfnGate | C::FfnDown);
            new_type = if t.ne[2] > 1 && (arch != "bailingmoe3" || bailing_expert) { MXFP4 } else { Q8_0 };
        } else if cat == C::TokenEmbd {
            if let Some(tt) = self.params.token_embedding_type {
                new_type = tt;
            } else if [ft::IQ2_XXS, ft::IQ2_XS, ft::IQ1_S, ft::IQ1_M].contains(&ftype) {
                new_type = Q2_K;
            } else if is(ft::IQ2_S) || is(ft::IQ2_M) || is(ft::IQ3_XXS) {
                new_type = IQ3_S;
            } else if is(ft::TQ1_0) || is(ft::TQ2_0) || is(ft::Q2_0) {
                new_type = Q4_K;
            }
        } else if iq_low.contains(&ftype) {
            let iq2sm = is(ft::IQ2_S) || is(ft::IQ2_M);
            if is_attn_v(cat) {
                new_type = if m.n_gqa() >= 4 || m.n_expert >= 4 {
                    Q4_K
                } else if iq2sm {
                    IQ3_S
                } else {
                    Q2_K
                };
                self.i_attention_wv += 1;
            } else if m.n_expert == 8 && cat == C::AttentionK {
                new_type = Q4_K;
            } else if cat == C::FfnDown {
                if self.i_ffn_down < self.n_ffn_down / 8 {
                    new_type = if iq2sm { IQ3_S } else { Q2_K };
                }
                self.i_ffn_down += 1;
            } else if cat == C::AttentionOutput {
                if m.n_expert == 8 {
                    new_type = Q5_K;
                } else if is(ft::IQ1_S) || is(ft::IQ1_M) {
                    new_type = IQ2_XXS;
                } else if iq2sm {
                    new_type = IQ3_S;
                }
            }
        } else if is_attn_v(cat) {
            let gqa4 = m.n_gqa() >= 4;
            if is(ft::Q2_K) {
                new_type = if gqa4 { Q4_K } else { Q3_K };
            } else if is(ft::Q2_K_S) && gqa4 {
                new_type = Q4_K;
            } else if is(ft::IQ3_XXS) {
                new_type = if gqa4 {
                    Q4_K
                } else if !self.params.has_imatrix {
                    IQ3_S
                } else {
                    IQ3_XXS
                };
            } else if (is(ft::IQ3_XS) || is(ft::IQ3_S)) && gqa4 {
                new_type = Q4_K;
            } else if is(ft::IQ3_M) {
                new_type = Q4_K;
            } else if is(ft::Q3_K_M) {
                new_type = if self.i_attention_wv < 2 { Q5_K } else { Q4_K };
            } else if is(ft::Q3_K_L) {
                new_type = Q5_K;
            } else if (is(ft::IQ4_NL) || is(ft::IQ4_XS)) && gqa4 {
                new_type = Q5_K;
            } else if (is(ft::Q4_K_M) || is(ft::Q5_K_M)) && use_more_bits(self.i_attention_wv, self.n_attention_wv) {
                new_type = Q6_K;
            } else if is(ft::Q4_K_S) && self.i_attention_wv < 4 {
                new_type = Q5_K;
            }
            if m.is_70b && (new_type == Q3_K || new_type == Q4_K) {
                new_type = Q5_K;
            }
            if m.n_expert == 8 {
                new_type = Q8_0;
            }
            self.i_attention_wv += 1;
        } else if cat == C::AttentionK {
            if m.n_expert == 8 {
                new_type = Q8_0;
            } else if is(ft::IQ3_XS) {
                new_type = IQ3_XXS;
            } else if is(ft::IQ3_XXS) {
                new_type = IQ2_S;
            }
        } else if cat == C::AttentionQ {
            if is(ft::IQ3_XS) {
                new_type = IQ3_XXS;
            } else if is(ft::IQ3_XXS) {
                new_type = IQ2_S;
            }
        } else if cat == C::FfnDown {
            let (i_layer, n_layer) = self.layer_info(self.i_ffn_down, self.n_ffn_down, name)?;
            let hi = self.params.has_imatrix;
            if is(ft::Q2_K) {
                new_type = Q3_K;
            } else if is(ft::Q2_K_S) {
                if i_layer < n_layer / 8 {
                    new_type = Q4_K;
                }
            } else if is(ft::IQ3_XXS) && !hi {
                new_type = if i_layer < n_layer / 8 { Q4_K } else { Q3_K };
            } else if is(ft::Q3_K_M) {
                new_type = if i_layer < n_layer / 16 {
                    Q5_K
                } else if !falcon || use_more_bits(i_layer, n_layer) {
                    Q4_K
                } else {
                    Q3_K
                };
            } else if is(ft::IQ3_M) && (i_layer < n_layer / 8 || (m.n_expert == 8 && use_more_bits(i_layer, n_layer))) {
                new_type = Q4_K;
            } else if is(ft::Q3_K_L) {
                new_type = if falcon { Q4_K } else { Q5_K };
            } else if is(ft::Q4_K_M) {
                if falcon {
                    new_type = if i_layer < n_layer / 16 {
                        Q6_K
                    } else if use_more_bits(i_layer, n_layer) {
                        Q5_K
                    } else {
                        Q4_K
                    };
                } else if use_more_bits(i_layer, n_layer) {
                    new_type = Q6_K;
                }
            } else if i_layer < n_layer / 8 && (is(ft::IQ4_NL) || is(ft::IQ4_XS)) && !hi {
                new_type = Q5_K;
            } else if is(ft::Q5_K_M) && use_more_bits(i_layer, n_layer) {
                new_type = Q6_K;
            } else if is(ft::Q4_K_S) && !falcon && i_layer < n_layer / 8 {
                new_type = Q5_K;
            } else if (is(ft::Q4_0) || is(ft::Q5_0)) && hi && i_layer < n_layer / 8 {
                new_type = if is(ft::Q4_0) { Q4_1 } else { Q5_1 };
            }
            self.i_ffn_down += 1;
        } else if cat == C::AttentionOutput {
            if !falcon {
                if m.n_expert == 8 {
                    if [
                        ft::Q2_K,
                        ft::IQ3_XS,
                        ft::IQ3_XXS,
                        ft::Q3_K_S,
                        ft::Q3_K_M,
                        ft::IQ4_NL,
                        ft::Q4_K_S,
                        ft::Q4_K_M,
                        ft::IQ3_S,
                        ft::IQ3_M,
                        ft::IQ4_XS,
                    ]
                    .contains(&ftype)
                    {
                        new_type = Q5_K;
                    }
                } else if is(ft::Q2_K) {
                    new_type = Q3_K;
                } else if is(ft::IQ3_XXS) {
                    new_type = IQ3_S;
                } else if is(ft::Q3_K_M) {
                    new_type = Q4_K;
                } else if is(ft::Q3_K_L) {
                    new_type = Q5_K;
                } else if is(ft::IQ3_M) {
                    new_type = Q4_K;
                }
            } else if is(ft::Q3_K_L) {
                new_type = Q4_K;
            }
        } else if cat == C::AttentionQkv {
            if is(ft::Q3_K_M) || is(ft::Q3_K_L) || is(ft::IQ3_M) {
                new_type = Q4_K;
            } else if is(ft::Q4_K_M) {
                new_type = Q5_K;
            } else if is(ft::Q5_K_M) {
                new_type = Q6_K;
            }
        } else if cat == C::FfnGate {
            let (i_layer, n_layer) = self.layer_info(self.i_ffn_gate, self.n_ffn_gate, name)?;
            if is(ft::IQ3_XS) && i_layer >= n_layer / 8 && i_layer < 7 * n_layer / 8 {
                new_type = IQ3_XXS;
            }
            self.i_ffn_gate += 1;
        } else if cat == C::FfnUp {
            let (i_layer, n_layer) = self.layer_info(self.i_ffn_up, self.n_ffn_up, name)?;
            if is(ft::IQ3_XS) && i_layer >= n_layer / 8 && i_layer < 7 * n_layer / 8 {
                new_type = IQ3_XXS;
            }
            self.i_ffn_up += 1;
        }
        Ok(new_type)
    }
}

/// `tensor_requires_imatrix`.
pub fn tensor_requires_imatrix(name: &str, dst: GgmlType, ftype: u32) -> bool {
    use GgmlType::*;
    if is_token_embd(name) || name == "output.weight" {
        return false;
    }
    match dst {
        IQ3_XXS | IQ2_XXS | IQ2_XS | IQ2_S | IQ1_M | IQ1_S => true,
        Q2_K => ftype == ft::Q2_K_S,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ftype_names_and_numbers_as_llama_quantize() {
        assert_eq!(parse_ftype("q4_k_m"), Some(Ftype { id: 15, name: "Q4_K_M" }));
        assert_eq!(parse_ftype("Q4_K").map(|f| f.id), Some(15)); // alias of Q4_K_M
        assert_eq!(parse_ftype("7").map(|f| f.name), Some("Q8_0"));
        assert_eq!(parse_ftype("0").map(|f| f.name), Some("F32")); // F32 before COPY
        assert_eq!(parse_ftype("Q9_9"), None);
        assert_eq!(default_type(ft::IQ2_S), Some(GgmlType::IQ2_XS));
        assert_eq!(default_type(39), None); // NVFP4: no default type in this llama.cpp
    }

    #[test]
    fn tensor_order_is_weight_name_comparer() {
        assert_eq!(layer_of("blk.12.attn_q.weight"), Some(12));
        assert_eq!(layer_of("output.weight"), None);
        let mut names = vec!["blk.10.a", "output.weight", "blk.2.b", "blk.2.a", "token_embd.weight"];
        names.sort_by(|a, b| tensor_order(a, b));
        assert_eq!(names, ["output.weight", "token_embd.weight", "blk.2.a", "blk.2.b", "blk.10.a"]);
    }

    #[test]
    fn norms_and_1d_tensors_stay() {
        let p = SelectParams::default();
        let t = |name: &str, ne: [u64; 4]| TensorDesc { name: name.into(), ty: GgmlType::F32, ne };
        assert!(!allows_quantization(&p, "llama", &t("blk.0.attn_norm.weight", [64, 1, 1, 1])));
        assert!(!allows_quantization(&p, "llama", &t("blk.0.ffn_gate_inp.weight", [64, 8, 1, 1])));
        assert!(allows_quantization(&p, "llama", &t("blk.0.ffn_up.weight", [64, 128, 1, 1])));
        assert!(!allows_quantization(&p, "llama", &t("blk.0.ffn_up.bias", [64, 128, 1, 1])));
    }
}
