//! DeepSeek V2 / V3 (and the models converted to its layout: Kimi K2, Mistral Large 3,
//! GigaChat 3) as `deepseek2`, in the MLA layout llama.cpp's converter writes
//! (`attention.key_length_mla` / `value_length_mla`, `attn_k_b` / `attn_v_b`): multi-head
//! latent attention with the compressed cache llama.cpp keeps, and DeepSeek's mixture of
//! experts. See llama.cpp's src/models/deepseek2.cpp. Per layer:
//!
//!   cur   = rmsnorm(x) * attn_norm
//!   q     = wq_b (rmsnorm(wq_a cur) * q_a_norm)   (or wq cur in the lite models)
//!           per head [q_nope (k_mla - n_rot) | q_pe (n_rot)], q_pe roped
//!   kv    = wkv_a_mqa cur = [kv_cmpr (kv_lora_rank) | k_pe (n_rot)], k_pe roped,
//!           kv_cmpr = rmsnorm(kv_cmpr) * kv_a_norm
//!   Q     = per head [wk_b_h q_nope_h | q_pe_h]  (the absorbed query, kv_lora_rank + n_rot)
//!   K, V  = [kv_cmpr | k_pe], kv_cmpr: one KV head (MQA) in the cache, head sizes
//!           `attention.key_length` = kv_lora_rank + n_rot and `value_length` = kv_lora_rank
//!   att   = attention(Q, K, V; kq_scale = mscale^2 / sqrt(k_mla)) [* temperature]
//!   out   = wo (per head wv_b_h att_h)
//!   x    += out; x += ffn(rmsnorm(x) * ffn_norm)
//!
//! The FFN is the shared decoder's (decoder.rs `load_ffn` / `run_ffn`): dense for the
//! first `leading_dense_block_count` layers, then experts (softmax or sigmoid gating,
//! optional selection bias, expert groups, renormalized and scaled weights) plus
//! `expert_shared_count` shared experts. YaRN as llama.cpp applies it here: the rope's
//! attention factor cancels ggml's magnitude correction and the softmax scale carries
//! mscale^2 (`rope.scaling.yarn_log_multiplier` read as llama.cpp does, divided by 0.1).
//! The pre-MLA layout (`attn_kv_b`, no key_length_mla) and NextN layers' MTP are not run
//! (the NextN blocks are skipped).
//!
//! The cache holds K = [kv_cmpr | k_pe] and V = kv_cmpr per token, as llama.cpp's MLA
//! cache does (there V is a view of K; here it is stored beside it).
//!
//! Mistral Small 4 (`mistral4`) is this architecture under another name (llama.cpp's
//! llama_model_mistral4 reuses deepseek2's hparams, tensors and graph); only the YaRN
//! attention factor differs: DeepSeek V2's special case (mscale = mscale_all_dims) is
//! deepseek2's alone.

use super::decoder::{load_ffn, run_ffn, DecoderConfig, Ffn};
use super::graph::{layer_rope, Gating};
use super::loader::{Keep, Loader};
use super::{common_hparams, drop_nextn_layers, moe_routing, Arch};
use crate::context::{ContextParams, Forward, Step};
use crate::error::{Error, Result};
use crate::hparams::{HParams, Meta, RopeType};
use crate::model::TensorView;
use crate::ops::act;
use crate::ops::attention::AttnParams;
use crate::ops::norm::rms_norm_row;
use crate::ops::rope::RopeParams;

pub struct Deepseek2;
pub struct Mistral4;

/// The MLA sizes (llama.cpp's n_lora_q, n_lora_kv, n_embd_head_k_mla, n_embd_head_v_mla).
#[derive(Clone, Copy)]
struct Dims {
    q_lora: usize,
    kv_lora: usize,
    k_mla: usize,
    v_mla: usize,
}

fn dims(meta: &Meta, hp: &HParams) -> Result<Dims> {
    let req = |k: &str| -> Result<usize> {
        meta.u(k)?.ok_or_else(|| {
            Error::Unsupported(format!("{}: missing required metadata key '{}'", meta.file.path, meta.key(k)))
        })
    };
    // llama.cpp: the lite models (27 or 26 layers, or 48 with a 128256-token vocabulary)
    // have no q_lora_rank
    let lite = hp.n_layer == 27 || hp.n_layer == 26 || (hp.n_layer == 48 && hp.n_vocab == 128256);
    let q_lora = if lite { 0 } else { req("attention.q_lora_rank")? };
    let kv_lora = req("attention.kv_lora_rank")?;
    let (k_mla, v_mla) = match (meta.u("attention.key_length_mla")?, meta.u("attention.value_length_mla")?) {
        (Some(k), Some(v)) if k > 0 && v > 0 => (k, v),
        _ => {
            return Err(Error::Unsupported(format!(
                "{}: deepseek2 files without '{}' (the pre-MLA layout with attn_kv_b) are not supported; \
                 reconvert the model with a current convert_hf_to_gguf.py",
                meta.file.path,
                meta.key("attention.key_length_mla")
            )))
        }
    };
    Ok(Dims { q_lora, kv_lora, k_mla, v_mla })
}

impl Arch for Deepseek2 {
    fn name(&self) -> &'static str {
        "deepseek2"
    }

    fn moe(&self) -> bool {
        true
    }

    fn hparams(&self, meta: &Meta, n_vocab: usize) -> Result<HParams> {
        let bad = |m: String| Error::Unsupported(format!("{}: {m}", meta.file.path));
        let mut hp = common_hparams(meta, n_vocab, RopeType::Norm)?;
        drop_nextn_layers(meta, &mut hp)?;
        let d = dims(meta, &hp)?;
        if d.k_mla <= hp.n_rot {
            return Err(bad(format!("key_length_mla {} must exceed rope.dimension_count {}", d.k_mla, hp.n_rot)));
        }
        if d.v_mla > d.kv_lora + hp.n_rot {
            return Err(bad(format!(
                "value_length_mla {} larger than kv_lora_rank + rope.dimension_count ({}) is not supported",
                d.v_mla,
                d.kv_lora + hp.n_rot
            )));
        }
        // the compressed cache: one KV head of kv_lora_rank + n_rot keys and kv_lora_rank values
        if hp.n_embd_head_k != d.kv_lora + hp.n_rot || hp.n_embd_head_v != d.kv_lora || hp.n_head_kv.iter().any(|&h| h != 1) {
            return Err(bad(format!(
                "MLA needs key_length = kv_lora_rank + rope.dimension_count ({}), value_length = kv_lora_rank ({}) \
                 and head_count_kv = 1; the file has {}, {} and {}",
                d.kv_lora + hp.n_rot,
                d.kv_lora,
                hp.n_embd_head_k,
                hp.n_embd_head_v,
                hp.n_head_kv.first().copied().unwrap_or(0)
            )));
        }
        if hp.n_expert == 0 || hp.n_expert_used == 0 {
            return Err(bad("deepseek2 needs expert_count > 0 and expert_used_count > 0".into()));
        }
        if hp.n_ff_exp == 0 {
            return Err(bad(format!("missing required metadata key '{}'", meta.key("expert_feed_forward_length"))));
        }
        let shared = meta.u("expert_shared_count")?.ok_or_else(|| {
            bad(format!("missing required metadata key '{}'", meta.key("expert_shared_count")))
        })?;
        hp.n_ff_shexp = hp.n_ff_exp.saturating_mul(shared);
        if let Some(m) = meta.f("rope.scaling.yarn_log_multiplier")? {
            hp.rope_yarn_log_mul = m / 0.1; // llama.cpp's deepseek2 load_arch_hparams
        }
        hp.f_attn_temp_scale = meta.f("attention.temperature_scale")?.unwrap_or(0.0);
        hp.n_attn_temp_floor_scale = meta.u("attention.temperature_length")?.unwrap_or(0);
        if hp.f_attn_temp_scale != 0.0 && hp.n_attn_temp_floor_scale == 0 {
            return Err(bad(format!("'{}' must be positive with a temperature scale", meta.key("attention.temperature_length"))));
        }
        Ok(hp)
    }

    fn type_name(&self, hp: &HParams) -> &'static str {
        match hp.n_layer {
            27 => "16B",
            47 => "30B.A3B",
            60 => "236B",
            61 => "671B",
            _ => "?B",
        }
    }

    fn build_forward(&self, ld: &Loader, cp: &ContextParams) -> Result<Box<dyn Forward>> {
        Ok(Box::new(Ds2Forward::load(ld, cp, true)?))
    }
}

impl Arch for Mistral4 {
    fn name(&self) -> &'static str {
        "mistral4"
    }

    fn moe(&self) -> bool {
        true
    }

    fn hparams(&self, meta: &Meta, n_vocab: usize) -> Result<HParams> {
        Deepseek2.hparams(meta, n_vocab)
    }

    fn type_name(&self, hp: &HParams) -> &'static str {
        Deepseek2.type_name(hp)
    }

    fn build_forward(&self, ld: &Loader, cp: &ContextParams) -> Result<Box<dyn Forward>> {
        Ok(Box::new(Ds2Forward::load(ld, cp, false)?))
    }
}

struct Layer {
    attn_norm: Vec<f32>,
    /// wq_a {n_embd, q_lora}, q_a_norm [q_lora], wq_b {q_lora, n_head k_mla}; or wq
    /// {n_embd, n_head k_mla} in the lite models.
    q_a: Option<(TensorView<'static>, Vec<f32>)>,
    wq: TensorView<'static>,
    /// {n_embd, kv_lora + n_rot}
    wkv_a: TensorView<'static>,
    kv_a_norm: Vec<f32>,
    /// {k_mla - n_rot, kv_lora, n_head} and {kv_lora, v_mla, n_head}
    wk_b: TensorView<'static>,
    wv_b: TensorView<'static>,
    /// {n_head v_mla, n_embd}
    wo: TensorView<'static>,
    ffn_norm: Vec<f32>,
    ffn: Ffn,
    rope: RopeParams,
}

struct Ds2Forward {
    cfg: DecoderConfig,
    d: Dims,
    tok_embd: TensorView<'static>,
    output_norm: Vec<f32>,
    output: TensorView<'static>,
    layers: Vec<Layer>,
    eps: f32,
    kq_scale: f32,
    /// Keeps the tensor bytes the views above borrow alive; must stay the last field.
    _keep: Keep,
}

impl Ds2Forward {
    /// `v2_mscale`: llama_context's DeepSeek V2 special case of the YaRN attention factor
    /// (deepseek2, not mistral4).
    fn load(ld: &Loader, cp: &ContextParams, v2_mscale: bool) -> Result<Ds2Forward> {
        let hp = ld.hp();
        let meta = Meta { file: &ld.model().files[0], arch: &hp.arch };
        let d = dims(&meta, hp)?;
        let (n_embd, n_vocab, n_rot) = (hp.n_embd, hp.n_vocab, hp.n_rot);
        // llama.cpp: sigmoid by default for GLM-4.7-Flash (47/48 layers, 154880 tokens)
        let default_gating =
            if (hp.n_layer == 47 || hp.n_layer == 48) && hp.n_vocab == 154880 { Gating::Sigmoid } else { Gating::Softmax };
        let cfg = DecoderConfig {
            moe: true,
            moe_cfg: moe_routing(&meta, hp, default_gating)?,
            n_dense_lead: meta.u("leading_dense_block_count")?.unwrap_or(0),
            shexp: true,
            probs_b_opt: true,
            ..DecoderConfig::new(hp)
        };
        let mut layers = Vec::with_capacity(hp.n_layer);
        for il in 0..hp.n_layer {
            let b = |s: &str| format!("blk.{il}.{s}");
            let nh = hp.n_head(il);
            let (q_a, wq) = if d.q_lora > 0 {
                let a = ld.req(&b("attn_q_a.weight"), &[n_embd, d.q_lora])?;
                let norm = ld.req_vec(&b("attn_q_a_norm.weight"), &[d.q_lora])?;
                (Some((a, norm)), ld.req(&b("attn_q_b.weight"), &[d.q_lora, nh * d.k_mla])?)
            } else {
                (None, ld.req(&b("attn_q.weight"), &[n_embd, nh * d.k_mla])?)
            };
            let mut rope = layer_rope(hp, cp, il, None);
            if rope.ext_factor != 0.0 {
                // llama_context: yarn_attn_factor = get_mscale(f, mscale) / get_mscale(f,
                // mscale_all_dims), mscale 1 (= mscale_all_dims for DeepSeek V2 when that is
                // not 1; get_mscale(f, 1) when the log multiplier is absent), times
                // 1 / (1 + 0.1 ln f)
                let f = 1.0 / rope.freq_scale;
                let ms = |m: f32| if f <= 1.0 { 1.0 } else { 0.1 * m * f.ln() + 1.0 };
                let l = hp.rope_yarn_log_mul;
                let mscale = if v2_mscale && l != 1.0 { l } else { 1.0 };
                let mut a = if l != 0.0 { ms(mscale) / ms(l) } else { ms(1.0) };
                a *= 1.0 / (1.0 + 0.1 * f.ln());
                if hp.rope_attn_factor != 0.0 {
                    a *= hp.rope_attn_factor;
                }
                rope.attn_factor = a;
            }
            layers.push(Layer {
                attn_norm: ld.req_vec(&b("attn_norm.weight"), &[n_embd])?,
                q_a,
                wq,
                wkv_a: ld.req(&b("attn_kv_a_mqa.weight"), &[n_embd, d.kv_lora + n_rot])?,
                kv_a_norm: ld.req_vec(&b("attn_kv_a_norm.weight"), &[d.kv_lora])?,
                wk_b: ld.req(&b("attn_k_b.weight"), &[d.k_mla - n_rot, d.kv_lora, nh])?,
                wv_b: ld.req(&b("attn_v_b.weight"), &[d.kv_lora, d.v_mla, nh])?,
                wo: ld.req(&b("attn_output.weight"), &[nh * d.v_mla, n_embd])?,
                ffn_norm: ld.req_vec(&b("ffn_norm.weight"), &[n_embd])?,
                ffn: load_ffn(ld, &cfg, il)?,
                rope,
            });
        }
        // deepseek2.cpp: kq_scale = mscale^2 / sqrt(k_mla), mscale from the rope's attention
        // factor with ggml's YaRN correction undone and the log multiplier applied
        let kq_scale = match layers.first() {
            Some(l) => {
                let inv = (1.0 / l.rope.freq_scale).ln();
                let org = l.rope.attn_factor * (1.0 + 0.1 * inv);
                let mscale = org * (1.0 + 0.1 * hp.rope_yarn_log_mul * inv);
                mscale * mscale / (d.k_mla as f32).sqrt()
            }
            None => 1.0,
        };
        let tok_embd = ld.req("token_embd.weight", &[n_embd, n_vocab])?;
        Ok(Ds2Forward {
            cfg,
            d,
            tok_embd,
            output_norm: ld.req_vec("output_norm.weight", &[n_embd])?,
            output: ld.opt("output.weight", &[n_embd, n_vocab])?.unwrap_or(tok_embd),
            layers,
            eps: hp.f_norm_rms_eps,
            kq_scale,
            _keep: ld.keep(),
        })
    }

    /// MLA attention of layer `il`: in `cur` [n, n_embd], out `tmp` [n, n_embd].
    fn attn(&self, st: &mut Step, il: usize, l: &Layer) -> Result<()> {
        let hp = st.hp;
        let (n, ne, n_rot) = (st.n, hp.n_embd, hp.n_rot);
        let nh = hp.n_head(il);
        let Dims { q_lora, kv_lora, k_mla, v_mla } = self.d;
        let n_nope = k_mla - n_rot;
        let hk = kv_lora + n_rot; // the cached key head
        let pool = st.pool;
        let dev = st.dev;
        let mut qraw = vec![0f32; n * nh * k_mla];
        let mut kvpe = vec![0f32; n * hk];
        {
            let b = &mut *st.b;
            if let Some((wq_a, norm)) = &l.q_a {
                let mut qa = vec![0f32; n * q_lora];
                Step::mm(pool, dev, wq_a, &b.cur, n, &mut qa, &mut b.mm_scratch, &mut b.lora)?;
                for r in qa.chunks_exact_mut(q_lora) {
                    rms_norm_row(r, Some(norm), self.eps);
                }
                Step::mm(pool, dev, &l.wq, &qa, n, &mut qraw, &mut b.mm_scratch, &mut b.lora)?;
            } else {
                Step::mm(pool, dev, &l.wq, &b.cur, n, &mut qraw, &mut b.mm_scratch, &mut b.lora)?;
            }
            Step::mm(pool, dev, &l.wkv_a, &b.cur, n, &mut kvpe, &mut b.mm_scratch, &mut b.lora)?;
        }
        // rope of q_pe (per head) and k_pe; the compressed kv's norm
        let mut cache = vec![0f32; n_rot.max(2)];
        let mut pe = vec![0f32; nh * n_rot];
        for t in 0..n {
            let pos = st.b.pos[t];
            let row = &mut qraw[t * nh * k_mla..(t + 1) * nh * k_mla];
            for h in 0..nh {
                pe[h * n_rot..(h + 1) * n_rot].copy_from_slice(&row[h * k_mla + n_nope..(h + 1) * k_mla]);
            }
            l.rope.apply_heads(&mut pe, n_rot, pos, &mut cache);
            for h in 0..nh {
                row[h * k_mla + n_nope..(h + 1) * k_mla].copy_from_slice(&pe[h * n_rot..(h + 1) * n_rot]);
            }
            let kr = &mut kvpe[t * hk..(t + 1) * hk];
            l.rope.apply_heads(&mut kr[kv_lora..], n_rot, pos, &mut cache);
            rms_norm_row(&mut kr[..kv_lora], Some(&l.kv_a_norm), self.eps);
        }
        // the cache's q, k and v borrow the FFN's gate and up buffers (as build_attn does)
        let b = &mut *st.b;
        std::mem::swap(&mut b.q, &mut b.gate);
        std::mem::swap(&mut b.k, &mut b.up);
        let r = self.attn_absorbed(st, il, l, &qraw, &kvpe);
        let b = &mut *st.b;
        std::mem::swap(&mut b.q, &mut b.gate);
        std::mem::swap(&mut b.k, &mut b.up);
        r?;
        // per head wv_b of the attention output, into cur [n, n_head v_mla]; then wo
        let b = &mut *st.b;
        let mut xg = vec![0f32; n * kv_lora];
        let mut og = vec![0f32; n * v_mla];
        for h in 0..nh {
            for t in 0..n {
                xg[t * kv_lora..(t + 1) * kv_lora]
                    .copy_from_slice(&b.att[t * nh * kv_lora + h * kv_lora..t * nh * kv_lora + (h + 1) * kv_lora]);
            }
            Step::mm_rows(pool, dev, &l.wv_b, &xg, n, &mut og, h * v_mla..(h + 1) * v_mla, &mut b.mm_scratch, &mut b.lora)?;
            for t in 0..n {
                b.cur[t * nh * v_mla + h * v_mla..t * nh * v_mla + (h + 1) * v_mla]
                    .copy_from_slice(&og[t * v_mla..(t + 1) * v_mla]);
            }
        }
        Step::mm(pool, dev, &l.wo, &b.cur, n, &mut b.tmp, &mut b.mm_scratch, &mut b.lora)?;
        crate::cb!(st, "attn_out", il, tmp, ne);
        Ok(())
    }

    /// Q = per head [wk_b q_nope | q_pe] into `q`, K = [kv_cmpr | k_pe] into `k`, V =
    /// kv_cmpr into `v`, then the cached attention into `att` [n, n_head kv_lora].
    fn attn_absorbed(&self, st: &mut Step, il: usize, l: &Layer, qraw: &[f32], kvpe: &[f32]) -> Result<()> {
        let hp = st.hp;
        let (n, n_rot) = (st.n, hp.n_rot);
        let nh = hp.n_head(il);
        let Dims { kv_lora, k_mla, .. } = self.d;
        let n_nope = k_mla - n_rot;
        let hk = kv_lora + n_rot;
        let pool = st.pool;
        let dev = st.dev;
        let b = &mut *st.b;
        let mut xg = vec![0f32; n * n_nope];
        let mut og = vec![0f32; n * kv_lora];
        for h in 0..nh {
            for t in 0..n {
                xg[t * n_nope..(t + 1) * n_nope].copy_from_slice(&qraw[t * nh * k_mla + h * k_mla..t * nh * k_mla + h * k_mla + n_nope]);
            }
            Step::mm_rows(pool, dev, &l.wk_b, &xg, n, &mut og, h * kv_lora..(h + 1) * kv_lora, &mut b.mm_scratch, &mut b.lora)?;
            for t in 0..n {
                let q = &mut b.q[t * nh * hk + h * hk..t * nh * hk + (h + 1) * hk];
                q[..kv_lora].copy_from_slice(&og[t * kv_lora..(t + 1) * kv_lora]);
                q[kv_lora..].copy_from_slice(&qraw[t * nh * k_mla + h * k_mla + n_nope..t * nh * k_mla + (h + 1) * k_mla]);
            }
        }
        for t in 0..n {
            b.k[t * hk..(t + 1) * hk].copy_from_slice(&kvpe[t * hk..(t + 1) * hk]);
            b.v[t * kv_lora..(t + 1) * kv_lora].copy_from_slice(&kvpe[t * hk..t * hk + kv_lora]);
        }
        if hp.f_attn_temp_scale != 0.0 {
            // llm_graph_input_attn_temp (offset 0), on the whole query
            for t in 0..n {
                let p = (b.pos[t] as f32 / hp.n_attn_temp_floor_scale as f32).floor() as f64;
                let f = ((p + 1.0).ln() * hp.f_attn_temp_scale as f64 + 1.0) as f32;
                act::scale(&mut b.q[t * nh * hk..(t + 1) * nh * hk], f);
            }
        }
        crate::cb!(st, "Qcur", il, q, nh * hk);
        crate::cb!(st, "Kcur", il, k, hk);
        let p = AttnParams {
            il,
            n_head: nh,
            n_head_kv: 1,
            hd_k: hk,
            hd_v: kv_lora,
            scale: self.kq_scale,
            softcap: 0.0,
            n_swa: 0,
            chunked: false,
            sinks: None,
        };
        st.attend_cached(&p)
    }
}

impl Forward for Ds2Forward {
    fn rope(&self, il: usize) -> Option<&RopeParams> {
        // as llama.cpp's K-shift: the first n_rot dims of the cached key head
        self.layers.get(il).map(|l| &l.rope)
    }

    fn forward(&self, st: &mut Step) -> Result<()> {
        let ne = st.hp.n_embd;
        let n_layer = self.layers.len();
        st.build_inp_embd(&self.tok_embd, 1.0)?;
        crate::cb!(st, "inp_embd", -1, x, ne);
        for (il, l) in self.layers.iter().enumerate() {
            st.build_norm(&l.attn_norm, None, super::graph::Norm::Rms, self.eps);
            crate::cb!(st, "attn_norm", il, cur, ne);
            self.attn(st, il, l)?;
            if il == n_layer - 1 && !st.select_outputs() {
                return Ok(());
            }
            st.residual();
            crate::cb!(st, "ffn_inp", il, x, ne);
            st.build_norm(&l.ffn_norm, None, super::graph::Norm::Rms, self.eps);
            crate::cb!(st, "ffn_norm", il, cur, ne);
            run_ffn(st, &l.ffn, &self.cfg, il)?;
            crate::cb!(st, "ffn_out", il, tmp, ne);
            st.residual();
            st.build_cvec(il);
            crate::cb!(st, "l_out", il, x, ne);
        }
        st.build_norm(&self.output_norm, None, super::graph::Norm::Rms, self.eps);
        st.build_output(&self.output, None, 0.0)
    }
}
