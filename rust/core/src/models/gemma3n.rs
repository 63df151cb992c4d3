//! Gemma 3n (`gemma3n`), the text decoder (llama.cpp's src/models/gemma3n.cpp; the audio and
//! vision towers are not part of it). Gemma 3's layer (sqrt(n_embd)-scaled embeddings, pre
//! and post norms, per-head Q/K RMSNorm, NEOX rope with base 10000 on the sliding-window
//! layers, GELU-gated FFN, final softcap 30) wrapped in:
//!
//! - AltUp: the residual stream is N_ALTUP = 4 streams s[0..4] [n, n_embd]. s[0] is the
//!   scaled embedding, s[k] = altup_proj[k-1] s[0] rescaled to the magnitude (L2 norm per
//!   token) of s[0]. Each layer predicts all four from router modalities
//!   m = tanh(altup_router (rmsnorm(s[0]) * altup_router_norm / n_embd)):
//!   pred[j] = sum_k s[k] * c[4j + k] + s[j], c = altup_predict_coef m; the layer runs on
//!   pred[0]; its output y corrects every stream: s[j] = (y - pred[0]) * (altup_correct_coef
//!   m(y) + 1)[j] + pred[j]. At the end s[1..4] go through altup_unembd_proj (rescaled to
//!   s[0]'s magnitude) and the four are averaged.
//! - Per-layer inputs: per token, N_EMBD_ALTUP = 256 floats per layer,
//!   (rmsnorm(per_layer_model_proj x / sqrt(n_embd)) * per_layer_proj_norm +
//!   per_layer_token_embd[token] * 16) / sqrt(2); layer il gates them with
//!   gelu(inp_gate (s[0] * altup_correct_scale)), projects back (proj, post_norm) and adds
//!   the result to s[1..4].
//! - Laurel: a rank-64 residual beside attention, rmsnorm(laurel_r laurel_l cur) *
//!   laurel_post_norm + cur, averaged with the attention output (both / sqrt(2)).
//! - Activation sparsity: on the first 10 layers the FFN gate keeps only what exceeds
//!   mean + 1.6448533 std of its row (relu(x - cutoff), gaussian top-k at 95%).
//! - V is RMS-normed per head (no weight); the softmax scale is 1 (q and k are normed).
//! - KV sharing: only the first 20 layers keep a cache; a later layer attends with its own
//!   queries over the keys and values of layer 18 (sliding-window layers) or 19 (global
//!   layers) (llama.cpp's layer reuse), so it computes no K or V.
//!
//! llama.cpp fixes N_ALTUP, the active stream (0), N_EMBD_ALTUP, LAUREL_RANK, the 20 cached
//! layers, the 10 sparse layers and the final softcap (30; the file's
//! `final_logit_softcapping` is not read); so does this file.

use super::graph::{layer_rope, par_rows, AttnConfig, AttnExtra, AttnWeights, Norm, Qkv};
use super::loader::{Keep, Loader};
use super::{common_hparams, swa_pattern, Arch};
use crate::context::{ContextParams, Forward, Step};
use crate::error::{Error, Result};
use crate::hparams::{HParams, Meta, RopeType};
use crate::model::TensorView;
use crate::ops::act;
use crate::ops::norm::rms_norm_row;
use crate::ops::rope::RopeParams;
use crate::quant;

const N_ALTUP: usize = 4;
const N_EMBD_ALTUP: usize = 256;
const LAUREL_RANK: usize = 64;
const N_LAYER_KV_FROM_START: usize = 20;
const N_LAYER_SPARSITY: usize = 10;
/// normal_dist.icdf(0.95), as llama.cpp writes it
const SPARSITY_STD_MUL: f32 = 1.644_853_4;
const FINAL_SOFTCAP: f32 = 30.0;

pub struct Gemma3n;

impl Arch for Gemma3n {
    fn name(&self) -> &'static str {
        "gemma3n"
    }

    fn hparams(&self, meta: &Meta, n_vocab: usize) -> Result<HParams> {
        let req = |k: &str| Error::Unsupported(format!("{}: missing required metadata key '{}'", meta.file.path, meta.key(k)));
        let mut hp = common_hparams(meta, n_vocab, RopeType::Neox)?;
        hp.swa_layers = swa_pattern(meta, hp.n_layer, 5, false)?;
        hp.n_swa = meta.u("attention.sliding_window")?.ok_or_else(|| req("attention.sliding_window"))?;
        if meta.f("attention.layer_norm_rms_epsilon")?.is_none() {
            return Err(req("attention.layer_norm_rms_epsilon"));
        }
        hp.rope_freq_base_swa = meta.f("rope.freq_base_swa")?.unwrap_or(10000.0);
        hp.rope_freq_scale_swa = 1.0;
        hp.f_attention_scale = 1.0;
        hp.f_final_logit_softcapping = FINAL_SOFTCAP;
        check_fixed_keys(meta, hp.n_layer)?;
        if hp.n_embd_head_k != hp.n_embd_head_v {
            return Err(Error::Unsupported(format!(
                "{}: gemma3n needs key_length == value_length (got {} and {})",
                meta.file.path, hp.n_embd_head_k, hp.n_embd_head_v
            )));
        }
        Ok(hp)
    }

    fn type_name(&self, hp: &HParams) -> &'static str {
        match hp.n_layer {
            30 => "E2B",
            35 => "E4B",
            _ => "?B",
        }
    }

    fn build_forward(&self, ld: &Loader, cp: &ContextParams) -> Result<Box<dyn Forward>> {
        Ok(Box::new(Gemma3nForward::load(ld, cp)?))
    }
}

/// The keys convert_hf_to_gguf writes for what llama.cpp (and so pyllama) fixes: where a
/// file has one, it must say what runs, or the file describes another model than the one
/// computed (llama.cpp does not read them).
fn check_fixed_keys(meta: &Meta, n_layer: usize) -> Result<()> {
    let bad = |k: &str, want: String| {
        Err(Error::Unsupported(format!(
            "{}: '{}' must be {want}: llama.cpp's gemma3n fixes it (it does not read the key)",
            meta.file.path,
            meta.key(k)
        )))
    };
    let shared = n_layer.saturating_sub(N_LAYER_KV_FROM_START);
    for (k, want) in [
        ("altup.active_idx", 0),
        ("altup.num_inputs", N_ALTUP),
        ("embedding_length_per_layer_input", N_EMBD_ALTUP),
        ("attention.shared_kv_layers", shared),
    ] {
        if meta.u(k)?.is_some_and(|v| v != want) {
            return bad(k, want.to_string());
        }
    }
    let k = "activation_sparsity_scale";
    if let Some(v) = meta.get(k) {
        // per layer: the gate's std multiplier (icdf(0.95)) on the sparse layers, icdf(0)
        // = -inf (or anything not positive) on the others
        let ok = v.as_array().is_some_and(|a| {
            a.len() == n_layer
                && a.iter().enumerate().all(|(il, x)| match x.as_f64() {
                    Some(s) if il < N_LAYER_SPARSITY => (s as f32 - SPARSITY_STD_MUL).abs() < 1e-4,
                    Some(s) => !(s.is_finite() && s > 0.0),
                    None => false,
                })
        });
        if !ok {
            return bad(k, format!("{SPARSITY_STD_MUL} on the first {N_LAYER_SPARSITY} layers and -inf on the others"));
        }
    }
    Ok(())
}

/// The layer whose cache layer `il` reads (None: its own), as llama.cpp's reuse callback:
/// layers from N_LAYER_KV_FROM_START on read the last cached layer of their kind.
fn kv_source(hp: &HParams, il: usize) -> Option<usize> {
    (il >= N_LAYER_KV_FROM_START).then(|| N_LAYER_KV_FROM_START - if hp.swa_layers[il] { 2 } else { 1 })
}

struct Layer {
    attn_norm: Vec<f32>,
    qkv: Qkv,
    wo: TensorView<'static>,
    q_norm: Vec<f32>,
    k_norm: Vec<f32>,
    post_attn_norm: Vec<f32>,
    ffn_norm: Vec<f32>,
    gate: TensorView<'static>,
    up: TensorView<'static>,
    down: TensorView<'static>,
    post_ffw_norm: Vec<f32>,
    inp_gate: TensorView<'static>,
    proj: TensorView<'static>,
    post_norm: Vec<f32>,
    correct_coef: TensorView<'static>,
    correct_scale: Vec<f32>,
    predict_coef: TensorView<'static>,
    router: TensorView<'static>,
    router_norm: Vec<f32>,
    laurel_l: TensorView<'static>,
    laurel_r: TensorView<'static>,
    laurel_post_norm: Vec<f32>,
    rope: RopeParams,
    n_swa: usize,
    kv_from: Option<usize>,
}

struct Gemma3nForward {
    tok_embd: TensorView<'static>,
    output: TensorView<'static>,
    output_norm: Vec<f32>,
    /// altup_proj / altup_unembd_proj {n_embd, n_embd, N_ALTUP - 1}, one view per stream.
    altup_proj: Vec<TensorView<'static>>,
    altup_unembd: Vec<TensorView<'static>>,
    pl_tok_embd: TensorView<'static>,
    pl_model_proj: TensorView<'static>,
    pl_proj_norm: Vec<f32>,
    layers: Vec<Layer>,
    eps: f32,
    /// Keeps the tensor bytes the views above borrow alive; must stay the last field.
    _keep: Keep,
}

/// Matrix k of a 3-D weight {ne0, ne1, ne2} as a 2-D view {ne0, ne1}.
fn slice3(t: &TensorView<'static>, k: usize) -> Result<TensorView<'static>> {
    let bytes = t.row_bytes() * t.ne[1];
    let data = t.data.get(k * bytes..(k + 1) * bytes).ok_or_else(|| {
        Error::Unsupported(format!("tensor '{}': its data is shorter than its shape {:?}", t.name, t.ne))
    })?;
    // (3-D tensors are never repacked: `Model::repack_weights`)
    Ok(TensorView { name: t.name, ty: t.ty, ne: [t.ne[0], t.ne[1], 1, 1], data, layout: crate::model::Layout::Plain })
}

impl Gemma3nForward {
    /// The schema: llama.cpp's load_arch_tensors for LLM_ARCH_GEMMA3N (separate q/k/v).
    fn load(ld: &Loader, cp: &ContextParams) -> Result<Gemma3nForward> {
        let hp = ld.hp();
        let (ne, nv, nl) = (hp.n_embd, hp.n_vocab, hp.n_layer);
        let hd = hp.n_embd_head_k;
        let mut layers = Vec::with_capacity(nl);
        for il in 0..nl {
            let b = |s: &str| format!("blk.{il}.{s}");
            let (nq, nk, nvv) = (hp.n_head(il) * hd, hp.n_embd_k_gqa(il), hp.n_embd_v_gqa(il));
            let n_ff = hp.n_ff[il];
            let kv_from = kv_source(hp, il);
            if let Some(src) = kv_from {
                if hp.n_head_kv(src) != hp.n_head_kv(il) {
                    return Err(Error::Unsupported(format!(
                        "{}: layer {il} reads the KV cache of layer {src}, which has {} KV heads, not {}",
                        ld.model().files[0].path,
                        hp.n_head_kv(src),
                        hp.n_head_kv(il)
                    )));
                }
            }
            layers.push(Layer {
                attn_norm: ld.req_vec(&b("attn_norm.weight"), &[ne])?,
                qkv: Qkv::load(ld, il, ne, nq, nk, nvv)?,
                wo: ld.req(&b("attn_output.weight"), &[nq, ne])?,
                q_norm: ld.req_vec(&b("attn_q_norm.weight"), &[hd])?,
                k_norm: ld.req_vec(&b("attn_k_norm.weight"), &[hd])?,
                post_attn_norm: ld.req_vec(&b("post_attention_norm.weight"), &[ne])?,
                ffn_norm: ld.req_vec(&b("ffn_norm.weight"), &[ne])?,
                gate: ld.req(&b("ffn_gate.weight"), &[ne, n_ff])?,
                up: ld.req(&b("ffn_up.weight"), &[ne, n_ff])?,
                down: ld.req(&b("ffn_down.weight"), &[n_ff, ne])?,
                post_ffw_norm: ld.req_vec(&b("post_ffw_norm.weight"), &[ne])?,
                inp_gate: ld.req(&b("inp_gate.weight"), &[ne, N_EMBD_ALTUP])?,
                proj: ld.req(&b("proj.weight"), &[N_EMBD_ALTUP, ne])?,
                post_norm: ld.req_vec(&b("post_norm.weight"), &[ne])?,
                correct_coef: ld.req(&b("altup_correct_coef.weight"), &[N_ALTUP, N_ALTUP])?,
                correct_scale: ld.req_vec(&b("altup_correct_scale.weight"), &[ne])?,
                predict_coef: ld.req(&b("altup_predict_coef.weight"), &[N_ALTUP, N_ALTUP * N_ALTUP])?,
                router: ld.req(&b("altup_router.weight"), &[ne, N_ALTUP])?,
                router_norm: ld.req_vec(&b("altup_router_norm.weight"), &[ne])?,
                laurel_l: ld.req(&b("laurel_l.weight"), &[ne, LAUREL_RANK])?,
                laurel_r: ld.req(&b("laurel_r.weight"), &[LAUREL_RANK, ne])?,
                laurel_post_norm: ld.req_vec(&b("laurel_post_norm.weight"), &[ne])?,
                rope: layer_rope(hp, cp, il, None),
                n_swa: if hp.swa_layers[il] { hp.n_swa } else { 0 },
                kv_from,
            });
        }
        let tok_embd = ld.req("token_embd.weight", &[ne, nv])?;
        let output = match ld.opt("output.weight", &[ne, nv])? {
            Some(o) => o,
            None => tok_embd,
        };
        let altup_proj = ld.req("altup_proj.weight", &[ne, ne, N_ALTUP - 1])?;
        let altup_unembd = ld.req("altup_unembd_proj.weight", &[ne, ne, N_ALTUP - 1])?;
        Ok(Gemma3nForward {
            tok_embd,
            output,
            output_norm: ld.req_vec("output_norm.weight", &[ne])?,
            altup_proj: (0..N_ALTUP - 1).map(|k| slice3(&altup_proj, k)).collect::<Result<_>>()?,
            altup_unembd: (0..N_ALTUP - 1).map(|k| slice3(&altup_unembd, k)).collect::<Result<_>>()?,
            pl_tok_embd: ld.req("per_layer_token_embd.weight", &[N_EMBD_ALTUP * nl, nv])?,
            pl_model_proj: ld.req("per_layer_model_proj.weight", &[ne, N_EMBD_ALTUP * nl])?,
            pl_proj_norm: ld.req_vec("per_layer_proj_norm.weight", &[N_EMBD_ALTUP])?,
            layers,
            eps: hp.f_norm_rms_eps,
            _keep: ld.keep(),
        })
    }
}

/// Record a local intermediate for the debug dump (llama.cpp's name for it).
fn dump(st: &mut Step, name: &str, il: i32, data: &[f32], width: usize) {
    if let Some(d) = st.debug.as_deref_mut() {
        d.put(name, il, data, width);
    }
}

/// Per row of `x` [n, w]: sqrt of the f64 sum of squares (ggml's sqrt(sum_rows(sqr(x)))).
fn magnitudes(x: &[f32], w: usize, n: usize) -> Vec<f32> {
    x[..n * w]
        .chunks_exact(w)
        .map(|r| (r.iter().map(|&v| (v * v) as f64).sum::<f64>() as f32).sqrt())
        .collect()
}

/// y [n, w] = y * target / magnitude(y), per row (ggml_div(ggml_mul(y, target), new)).
fn rescale(y: &mut [f32], w: usize, n: usize, target: &[f32]) {
    let m = magnitudes(y, w, n);
    for (t, r) in y[..n * w].chunks_exact_mut(w).enumerate() {
        for v in r.iter_mut() {
            *v = (*v * target[t]) / m[t];
        }
    }
}

/// gaussian_topk of one row: relu(x - (mean + std * 1.6448533)), std with n - 1 (ggml's
/// mean, sum_rows of the squared deviations in f64, scale, sqrt).
fn gaussian_topk(r: &mut [f32]) {
    let n = r.len();
    let mean = (r.iter().map(|&v| v as f64).sum::<f64>() as f32) / n as f32;
    let ss = r.iter().map(|&v| {
        let d = v - mean;
        (d * d) as f64
    });
    let var = (ss.sum::<f64>() as f32) * (1.0 / (n as f32 - 1.0));
    let cutoff = mean + var.sqrt() * SPARSITY_STD_MUL;
    for v in r.iter_mut() {
        *v = (*v - cutoff).max(0.0);
    }
}

impl Gemma3nForward {
    /// out [n, w.n_rows()] = w x: ggml_mul_mat (no LoRA term) or, with `lora`, build_lora_mm.
    /// F32 weights (AltUp, Laurel, per_layer_model_proj: llama-quantize keeps them F32) in
    /// llama.cpp's summation order (the 4-wide AltUp coefficients take its ggml_vec_dot_f32
    /// path): 22+ layers of four rescaled streams turn any other rounding into logit noise.
    fn mm(st: &mut Step, w: &TensorView, x: &[f32], n: usize, out: &mut [f32], lora: bool) -> Result<()> {
        let b = &mut *st.b;
        if lora {
            Step::mm(st.pool, st.dev, w, x, n, out, &mut b.mm_scratch, &mut b.lora)
        } else {
            Step::mm(st.pool, st.dev, w, x, n, out, &mut b.mm_scratch, &mut None)
        }
    }

    /// The router modalities of `x` [n, n_embd]: tanh(altup_router (rmsnorm(x) *
    /// router_norm / n_embd)) into `out` [n, N_ALTUP].
    fn modalities(&self, st: &mut Step, l: &Layer, x: &[f32], out: &mut [f32], tmp: &mut Vec<f32>) -> Result<()> {
        let (ne, n) = (st.hp.n_embd, st.n);
        tmp.clear();
        tmp.extend_from_slice(&x[..n * ne]);
        let inv = 1.0f32 / ne as f32;
        for r in tmp.chunks_exact_mut(ne) {
            rms_norm_row(r, Some(&l.router_norm), self.eps);
            act::scale(r, inv);
        }
        Self::mm(st, &l.router, tmp, n, out, false)?;
        for v in out[..n * N_ALTUP].iter_mut() {
            *v = v.tanh();
        }
        Ok(())
    }
}

impl Forward for Gemma3nForward {
    fn rope(&self, il: usize) -> Option<&RopeParams> {
        // a layer that reads another's cache has no keys of its own to re-rotate
        self.layers.get(il).filter(|l| l.kv_from.is_none()).map(|l| &l.rope)
    }

    fn kv_layers(&self) -> Option<Vec<bool>> {
        Some(self.layers.iter().map(|l| l.kv_from.is_none()).collect())
    }

    fn forward(&self, st: &mut Step) -> Result<()> {
        let hp = st.hp;
        let (ne, n, nl) = (hp.n_embd, st.n, self.layers.len());
        let nea = N_EMBD_ALTUP;
        let from_tokens = st.tokens.is_some();
        // raw embeddings (multimodal input) are not scaled
        st.build_inp_embd(&self.tok_embd, if from_tokens { (ne as f32).sqrt() } else { 1.0 })?;
        crate::cb!(st, "inp_scaled", -1, x, ne);

        // per-layer inputs [n, nl, nea]: the token's rows (raw embeddings: token 0's) * 16,
        // plus the normed projection of x, over sqrt(2)
        let w_pl = nl * nea;
        let mut pl = vec![0f32; n * w_pl];
        let tok_scale = (nea as f32).sqrt();
        for t in 0..n {
            let id = st.tokens.map_or(0, |tk| tk[t]) as usize;
            let row = &mut pl[t * w_pl..(t + 1) * w_pl];
            quant::dequantize_row(self.pl_tok_embd.ty, self.pl_tok_embd.row(id), row)?;
            act::scale(row, tok_scale);
        }
        let mut proj = vec![0f32; n * w_pl];
        let x0: Vec<f32> = st.b.x[..n * ne].to_vec();
        Self::mm(st, &self.pl_model_proj, &x0, n, &mut proj, false)?;
        let (ps, is) = (1.0f32 / (ne as f32).sqrt(), 1.0f32 / 2f32.sqrt());
        for (p, q) in proj.chunks_exact_mut(nea).zip(pl.chunks_exact_mut(nea)) {
            act::scale(p, ps);
            rms_norm_row(p, Some(&self.pl_proj_norm), self.eps);
            for (a, &b) in q.iter_mut().zip(p.iter()) {
                *a = (b + *a) * is;
            }
        }
        drop(proj);
        dump(st, "inp_per_layer", -1, &pl, w_pl);

        // the four streams, s[k] = stream k [n, ne]
        let m = n * ne;
        let mut s: Vec<Vec<f32>> = vec![x0];
        let target = magnitudes(&s[0], ne, n);
        for k in 1..N_ALTUP {
            let mut y = vec![0f32; m];
            Self::mm(st, &self.altup_proj[k - 1], &s[0], n, &mut y, false)?;
            rescale(&mut y, ne, n, &target);
            s.push(y);
        }

        for sk in &s {
            dump(st, "inp_stacked", -1, sk, ne);
        }
        let mut modal = vec![0f32; n * N_ALTUP];
        let mut coefs = vec![0f32; n * N_ALTUP * N_ALTUP];
        let mut pred: Vec<Vec<f32>> = vec![vec![0f32; m]; N_ALTUP];
        let mut scratch = Vec::new();
        let mut laurel_out = vec![0f32; m];
        let mut low = vec![0f32; n * LAUREL_RANK];
        let mut attn_laurel = vec![0f32; m];
        let mut fp = vec![0f32; n * nea];
        for (il, l) in self.layers.iter().enumerate() {
            // AltUp predict
            self.modalities(st, l, &s[0], &mut modal, &mut scratch)?;
            dump(st, "modalities", il as i32, &modal, N_ALTUP);
            Self::mm(st, &l.predict_coef, &modal, n, &mut coefs, true)?;
            dump(st, "all_coefs", il as i32, &coefs, N_ALTUP * N_ALTUP);
            for (j, pj) in pred.iter_mut().enumerate() {
                for t in 0..n {
                    let c = &coefs[t * N_ALTUP * N_ALTUP + j * N_ALTUP..][..N_ALTUP];
                    for e in 0..ne {
                        let i = t * ne + e;
                        // ggml_vec_dot_f32's leftover loop (n_altup < its SIMD step)
                        let mut acc = 0f32;
                        for (k, sk) in s.iter().enumerate() {
                            acc += sk[i] * c[k];
                        }
                        pj[i] = acc + s[j][i];
                    }
                }
            }
            for pj in &pred {
                dump(st, "predictions", il as i32, pj, ne);
            }
            // the layer runs on the active prediction
            st.b.x[..m].copy_from_slice(&pred[0]);
            st.build_norm(&l.attn_norm, None, Norm::Rms, self.eps);
            crate::cb!(st, "attn_norm", il, cur, ne);

            // laurel
            let cur: Vec<f32> = st.b.cur[..m].to_vec();
            Self::mm(st, &l.laurel_l, &cur, n, &mut low, true)?;
            Self::mm(st, &l.laurel_r, &low, n, &mut laurel_out, true)?;
            for (r, c) in laurel_out.chunks_exact_mut(ne).zip(cur.chunks_exact(ne)) {
                rms_norm_row(r, Some(&l.laurel_post_norm), self.eps);
                act::add_assign(r, c);
            }

            dump(st, "laurel_out", il as i32, &laurel_out, ne);
            // attention (build_attn leaves `cur` as it was)
            let shared = l.kv_from.is_some();
            let w = AttnWeights {
                // llama.cpp's graph adds no q bias on the layers that reuse a cache
                bq: if shared { None } else { l.qkv.bq.as_deref() },
                q_norm: Some(&l.q_norm),
                k_norm: Some(&l.k_norm),
                ..l.qkv.weights(&l.wo, None)
            };
            let a = AttnConfig { n_swa: l.n_swa, ..AttnConfig::new(il, Some(&l.rope), hp.f_attention_scale) };
            st.build_attn_ext(&w, &a, &AttnExtra { v_rms: true, kv_from: l.kv_from })?;
            st.build_post_norm(&l.post_attn_norm, self.eps);
            crate::cb!(st, "attn_post_norm", il, tmp, ne);
            let is2 = 1.0f32 / 2f32.sqrt();
            for i in 0..m {
                let gated = st.b.tmp[i] + pred[0][i];
                attn_laurel[i] = (gated + laurel_out[i]) * is2;
            }

            dump(st, "attn_laurel", il as i32, &attn_laurel, ne);
            // FFN on rmsnorm(attn_laurel)
            st.b.x[..m].copy_from_slice(&attn_laurel);
            st.build_norm(&l.ffn_norm, None, Norm::Rms, self.eps);
            crate::cb!(st, "ffn_norm", il, cur, ne);
            let n_ff = hp.n_ff[il];
            {
                let b = &mut *st.b;
                Step::mm(st.pool, st.dev, &l.up, &b.cur, n, &mut b.up, &mut b.mm_scratch, &mut b.lora)?;
                Step::mm(st.pool, st.dev, &l.gate, &b.cur, n, &mut b.gate, &mut b.mm_scratch, &mut b.lora)?;
            }
            if il < N_LAYER_SPARSITY {
                par_rows(st.pool, &mut st.b.gate, n_ff, n, &|_, r| gaussian_topk(r));
            }
            {
                let b = &mut *st.b;
                let up = &b.up[..n * n_ff];
                par_rows(st.pool, &mut b.gate, n_ff, n, &|t, g| {
                    act::gelu(g);
                    for (gv, &u) in g.iter_mut().zip(&up[t * n_ff..(t + 1) * n_ff]) {
                        *gv = u * *gv;
                    }
                });
                Step::mm(st.pool, st.dev, &l.down, &b.gate, n, &mut b.tmp, &mut b.mm_scratch, &mut b.lora)?;
            }
            crate::cb!(st, "ffn_out", il, tmp, ne);
            st.build_post_norm(&l.post_ffw_norm, self.eps);
            // y = ffn + attn_laurel (attn_ffw_laurel_gated)
            let mut y: Vec<f32> = st.b.tmp[..m].to_vec();
            act::add_assign(&mut y, &attn_laurel);

            dump(st, "attn_ffw_laurel_gated", il as i32, &y, ne);
            // AltUp correct: s[j] = (y - pred[0]) * (coef m(y) + 1)[j] + pred[j]
            self.modalities(st, l, &y, &mut modal, &mut scratch)?;
            let mut cc = vec![0f32; n * N_ALTUP];
            Self::mm(st, &l.correct_coef, &modal, n, &mut cc, true)?;
            for v in cc.iter_mut() {
                *v = *v * 1.0 + 1.0;
            }
            for (j, sj) in s.iter_mut().enumerate() {
                for t in 0..n {
                    let c = cc[t * N_ALTUP + j];
                    for e in 0..ne {
                        let i = t * ne + e;
                        sj[i] = (y[i] - pred[0][i]) * c + pred[j][i];
                    }
                }
            }

            for sj in &s {
                dump(st, "corrected", il as i32, sj, ne);
            }
            // per-layer input: proj(gelu(inp_gate(s[0] * correct_scale)) * pl[il]), normed, into s[1..]
            let mut g: Vec<f32> = s[0].clone();
            for r in g.chunks_exact_mut(ne) {
                for (v, &c) in r.iter_mut().zip(&l.correct_scale) {
                    *v *= c;
                }
            }
            Self::mm(st, &l.inp_gate, &g, n, &mut fp, true)?;
            for t in 0..n {
                let r = &mut fp[t * nea..(t + 1) * nea];
                act::gelu(r);
                let p = &pl[t * w_pl + il * nea..][..nea];
                for (v, &q) in r.iter_mut().zip(p) {
                    *v *= q;
                }
            }
            Self::mm(st, &l.proj, &fp, n, &mut g, true)?;
            for r in g.chunks_exact_mut(ne) {
                rms_norm_row(r, Some(&l.post_norm), self.eps);
            }
            for sj in s.iter_mut().skip(1) {
                act::add_assign(sj, &g);
            }
            // the control vector adds to every stream (ggml_add broadcasts over them)
            if let Some(dir) = st.b.cvec.dir(il) {
                for sj in s.iter_mut() {
                    for r in sj.chunks_exact_mut(ne) {
                        act::add_assign(r, dir);
                    }
                }
            }
            dump(st, "first_prediction_out", il as i32, &g, ne);
            for sj in &s {
                dump(st, "l_out", il as i32, sj, ne);
            }
        }

        // merge the streams: s[1..] unembedded to s[0]'s magnitude, the mean of the four
        let target = magnitudes(&s[0], ne, n);
        let mut merged = s[0].clone();
        let mut u = vec![0f32; m];
        for k in 1..N_ALTUP {
            Self::mm(st, &self.altup_unembd[k - 1], &s[k], n, &mut u, false)?;
            rescale(&mut u, ne, n, &target);
            act::add_assign(&mut merged, &u);
        }
        act::scale(&mut merged, 1.0f32 / N_ALTUP as f32);
        st.b.x[..m].copy_from_slice(&merged);
        crate::cb!(st, "unembd_merged", -1, x, ne);
        if !st.select_outputs() {
            return Ok(());
        }
        st.build_norm(&self.output_norm, None, Norm::Rms, self.eps);
        st.build_output(&self.output, None, FINAL_SOFTCAP)
    }
}
