//! RWKV-7 "Goose" (llama.cpp's src/models/rwkv7.cpp with rwkv7-base.cpp): rwkv6.rs's layer
//! stack (LayerNormed embeddings, token shifts, two LayerNorms and residuals per layer) with
//! RWKV-7's mixes. Time mix: six static lerps (r, w, k, v, a, g) of the token and the
//! previous one; r / k / v projections; the decay exp(-0.606531 sigmoid(w0 + LoRA_w)); from
//! the second layer on, v pulled towards the first layer's v by sigmoid(v0 + LoRA_v); the
//! in-context learning rate a = sigmoid(a0 + LoRA_a); kk = L2-normed (k * k_k) per head;
//! k += k * k_a * (a - 1); the WKV-7 generalized delta rule per head
//! (`ops::ssm::wkv7_token`, its state [head_size][head_size] per head); GroupNorm per head;
//! plus v * sum(k * r * r_k) per head; times the gate LoRA_g; the output projection.
//! Channel mix: value(relu(key(lerp))^2).

use super::loader::Loader;
use super::rwkv6::{check_rwkv, group_norm, lerp_rows, shift_diff_of, LayerNorms, RwkvFwd, RwkvLayer, Scratch};
use super::{read_sizes, recurrent_hparams, Arch};
use crate::context::{ContextParams, Forward, Step};
use crate::error::{Error, Result};
use crate::hparams::{HParams, Meta};
use crate::model::TensorView;
use crate::ops::ssm;

pub struct Rwkv7;

/// The RWKV-7 hyperparameters (also arwkv7's).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Params {
    pub(crate) head_size: usize,
    decay: usize,
    iclr: usize,
    value_mix: usize,
    gate: usize,
}

impl Params {
    /// `shifts`: the token shifts the architecture needs (rwkv7 2, arwkv7 1); `gate`: whether
    /// the gate LoRA (and so its rank) is required.
    pub(crate) fn read(meta: &Meta, n_embd: usize, shifts: usize, gate: bool) -> Result<Params> {
        // the gate rank is optional in llama.cpp's keys (rwkv7 requires its tensors)
        let g = meta.u("attention.gate_lora_rank")?;
        let [head_size, decay, iclr, value_mix, gate] = read_sizes(
            meta,
            [
                ("wkv.head_size", None),
                ("attention.decay_lora_rank", None),
                ("attention.iclr_lora_rank", None),
                ("attention.value_residual_mix_lora_rank", None),
                ("attention.gate_lora_rank", Some(if gate { 0 } else { g.unwrap_or(1) })),
            ],
        )?;
        // ggml's x86 WKV-7 kernel steps through a head 32 lanes at a time
        check_rwkv(meta, n_embd, head_size, 32, shifts)?;
        Ok(Params { head_size, decay, iclr, value_mix, gate })
    }
}

impl Arch for Rwkv7 {
    fn name(&self) -> &'static str {
        "rwkv7"
    }

    fn hparams(&self, meta: &Meta, n_vocab: usize) -> Result<HParams> {
        recurrent_hparams(meta, n_vocab, |m, ne| Params::read(m, ne, 2, true).map(|_| ()))
    }

    fn type_name(&self, hp: &HParams) -> &'static str {
        match (hp.n_layer, hp.n_embd) {
            (12, 768) => "190M",
            (24, 1024) => "450M",
            (24, 2048) | (28, 1536) => "1.5B",
            (28, 3584) | (32, 4096) => "7B",
            (32, 2560) => "2.9B",
            (61, 4096) => "14B",
            _ => "?B",
        }
    }

    fn build_forward(&self, ld: &Loader, _cp: &ContextParams) -> Result<Box<dyn Forward>> {
        let hp = ld.hp();
        let meta = Meta { file: &ld.model().files[0], arch: self.name() };
        let p = Params::read(&meta, hp.n_embd, 2, true)?;
        let ne = hp.n_embd;
        let mut layers = Vec::with_capacity(hp.n_layer);
        for il in 0..hp.n_layer {
            let b = |s: &str| format!("blk.{il}.{s}");
            let nf = hp.n_ff[il];
            layers.push(Layer {
                norms: LayerNorms::load(ld, il)?,
                tm: TimeMix::load(ld, il, &p, true)?,
                cm_lerp_k: ld.req_vec(&b("channel_mix_lerp_k.weight"), &[ne])?,
                cm_key: ld.req(&b("channel_mix_key.weight"), &[ne, nf])?,
                cm_value: ld.req(&b("channel_mix_value.weight"), &[nf, ne])?,
            });
        }
        RwkvFwd::build(ld, layers, p.head_size, 0)
    }
}

/// An RWKV-7 time mix's weights (rwkv7, arwkv7).
pub(crate) struct TimeMix {
    p: Params,
    w0: Vec<f32>,
    w1: TensorView<'static>,
    w2: TensorView<'static>,
    a0: Vec<f32>,
    a1: TensorView<'static>,
    a2: TensorView<'static>,
    v0: Vec<f32>,
    v1: TensorView<'static>,
    v2: TensorView<'static>,
    /// the gate LoRA (optional in arwkv7)
    g: Option<(TensorView<'static>, TensorView<'static>)>,
    /// [6][n_embd] (5 without the gate): the r, w, k, v, a(, g) lerps
    lerp: Vec<f32>,
    k_k: Vec<f32>,
    k_a: Vec<f32>,
    r_k: Vec<f32>,
    key: TensorView<'static>,
    value: TensorView<'static>,
    receptance: TensorView<'static>,
    /// the per-head GroupNorm's weight and bias (optional in arwkv7)
    ln: Option<(Vec<f32>, Vec<f32>)>,
    output: TensorView<'static>,
}

impl TimeMix {
    /// `full`: rwkv7's (gate and GroupNorm required); else arwkv7's (both optional).
    pub(crate) fn load(ld: &Loader, il: usize, p: &Params, full: bool) -> Result<TimeMix> {
        let ne = ld.hp().n_embd;
        let b = |s: &str| format!("blk.{il}.{s}");
        // layer 0's value LoRA is never used (llama.cpp loads it with the iclr rank)
        let rv = if il == 0 { p.iclr } else { p.value_mix };
        let g = if full {
            Some((ld.req(&b("time_mix_g1.weight"), &[ne, p.gate])?, ld.req(&b("time_mix_g2.weight"), &[p.gate, ne])?))
        } else {
            match (ld.opt(&b("time_mix_g1.weight"), &[ne, p.gate])?, ld.opt(&b("time_mix_g2.weight"), &[p.gate, ne])?) {
                (Some(g1), Some(g2)) => Some((g1, g2)),
                _ => None,
            }
        };
        let n_lerp = if g.is_some() { 6 } else { 5 };
        let ln = if full {
            Some((ld.req_vec(&b("time_mix_ln.weight"), &[ne])?, ld.req_vec(&b("time_mix_ln.bias"), &[ne])?))
        } else {
            match (ld.opt_vec(&b("time_mix_ln.weight"), &[ne])?, ld.opt_vec(&b("time_mix_ln.bias"), &[ne])?) {
                (Some(w), Some(bias)) => Some((w, bias)),
                _ => None,
            }
        };
        Ok(TimeMix {
            p: *p,
            w0: ld.req_vec(&b("time_mix_w0.weight"), &[ne])?,
            w1: ld.req(&b("time_mix_w1.weight"), &[ne, p.decay])?,
            w2: ld.req(&b("time_mix_w2.weight"), &[p.decay, ne])?,
            a0: ld.req_vec(&b("time_mix_a0.weight"), &[ne])?,
            a1: ld.req(&b("time_mix_a1.weight"), &[ne, p.iclr])?,
            a2: ld.req(&b("time_mix_a2.weight"), &[p.iclr, ne])?,
            v0: ld.req_vec(&b("time_mix_v0.weight"), &[ne])?,
            v1: ld.req(&b("time_mix_v1.weight"), &[ne, rv])?,
            v2: ld.req(&b("time_mix_v2.weight"), &[rv, ne])?,
            g,
            lerp: ld.req_vec(&b("time_mix_lerp_fused.weight"), &[ne, 1, 1, n_lerp])?,
            k_k: ld.req_vec(&b("time_mix_k_k.weight"), &[ne])?,
            k_a: ld.req_vec(&b("time_mix_k_a.weight"), &[ne])?,
            r_k: ld.req_vec(&b("time_mix_r_k.weight"), &[ne])?,
            key: ld.req(&b("time_mix_key.weight"), &[ne, ne])?,
            value: ld.req(&b("time_mix_value.weight"), &[ne, ne])?,
            receptance: ld.req(&b("time_mix_receptance.weight"), &[ne, ne])?,
            ln,
            output: ld.req(&b("time_mix_output.weight"), &[ne, ne])?,
        })
    }
}

struct Layer {
    norms: LayerNorms,
    tm: TimeMix,
    cm_lerp_k: Vec<f32>,
    cm_key: TensorView<'static>,
    cm_value: TensorView<'static>,
}

#[inline]
fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// out = w2 (w1 x) with the activation `f` between (a LoRA): x [n, n_embd], mid [n, rank].
#[allow(clippy::too_many_arguments)]
fn lora(st: &mut Step, w1: &TensorView, w2: &TensorView, x: &[f32], mid: &mut Vec<f32>, out: &mut [f32], f: Option<fn(f32) -> f32>) -> Result<()> {
    let n = st.n;
    mid.resize(n * w1.n_rows(), 0.0);
    let b = &mut *st.b;
    Step::mm(st.pool, st.dev, w1, x, n, mid, &mut b.mm_scratch, &mut b.lora)?;
    if let Some(f) = f {
        for v in mid.iter_mut() {
            *v = f(*v);
        }
    }
    Step::mm(st.pool, st.dev, w2, mid, n, out, &mut b.mm_scratch, &mut b.lora)
}

impl TimeMix {
    /// In `cur` [n, n_embd] (normed) and sc.xprev, out `tmp`.
    pub(crate) fn run(&self, st: &mut Step, il: usize, sc: &mut Scratch) -> Result<()> {
        let (n, ne) = (st.n, st.hp.n_embd);
        let hs = self.p.head_size;
        let m = n * ne;
        shift_diff_of(sc, &st.b.cur[..m]);
        let n_lerp = self.lerp.len() / ne;
        sc.mix.resize(n_lerp * m, 0.0);
        for g in 0..n_lerp {
            lerp_rows(&sc.sx, &st.b.cur[..m], &self.lerp[g * ne..(g + 1) * ne], &mut sc.mix[g * m..(g + 1) * m], ne);
        }
        for v in [&mut sc.r, &mut sc.k, &mut sc.v, &mut sc.g, &mut sc.w, &mut sc.o, &mut sc.xxx] {
            v.resize(m, 0.0);
        }
        let [vf, a, kk, mid] = &mut sc.ext;
        for v in [&mut *a, &mut *kk] {
            v.resize(m, 0.0);
        }
        let (xr, rest) = sc.mix.split_at(m);
        let (xw, rest) = rest.split_at(m);
        let (xk, rest) = rest.split_at(m);
        let (xv, rest) = rest.split_at(m);
        let (xa, xg) = rest.split_at(m);
        let xg = &xg[..xg.len().min(m)];
        {
            let b = &mut *st.b;
            Step::mm(st.pool, st.dev, &self.receptance, xr, n, &mut sc.r, &mut b.mm_scratch, &mut b.lora)?;
        }
        // decay: exp(sigmoid(w0 + LoRA) * -0.606531)
        lora(st, &self.w1, &self.w2, xw, mid, &mut sc.w, Some(f32::tanh))?;
        for row in sc.w[..m].chunks_exact_mut(ne) {
            for (v, w0) in row.iter_mut().zip(&self.w0) {
                *v = (sigmoid(*v + w0) * -0.606531f32).exp();
            }
        }
        {
            let b = &mut *st.b;
            Step::mm(st.pool, st.dev, &self.key, xk, n, &mut sc.k, &mut b.mm_scratch, &mut b.lora)?;
            Step::mm(st.pool, st.dev, &self.value, xv, n, &mut sc.v, &mut b.mm_scratch, &mut b.lora)?;
        }
        if il == 0 {
            vf.resize(m, 0.0);
            vf[..m].copy_from_slice(&sc.v[..m]);
        } else {
            if vf.len() < m {
                return Err(Error::Invalid("internal: rwkv7 layer without the first layer's values".into()));
            }
            lora(st, &self.v1, &self.v2, xv, mid, &mut sc.xxx, None)?;
            for ((vrow, frow), trow) in sc.v[..m].chunks_exact_mut(ne).zip(vf.chunks_exact(ne)).zip(sc.xxx.chunks_exact(ne)) {
                for j in 0..ne {
                    vrow[j] += (frow[j] - vrow[j]) * sigmoid(trow[j] + self.v0[j]);
                }
            }
        }
        if let Some((g1, g2)) = &self.g {
            lora(st, g1, g2, xg, mid, &mut sc.g, Some(sigmoid))?;
        }
        lora(st, &self.a1, &self.a2, xa, mid, a, None)?;
        for row in a[..m].chunks_exact_mut(ne) {
            for (v, a0) in row.iter_mut().zip(&self.a0) {
                *v = sigmoid(*v + a0);
            }
        }
        // kk = l2_norm(k * k_k) per head (eps 1e-12); k += k * k_a * a - k * k_a
        for ((kkrow, krow), arow) in kk[..m].chunks_exact_mut(ne).zip(sc.k.chunks_exact_mut(ne)).zip(a.chunks_exact(ne)) {
            for j in 0..ne {
                kkrow[j] = krow[j] * self.k_k[j];
            }
            for h in kkrow.chunks_exact_mut(hs) {
                let mut sum = 0f64;
                for &x in h.iter() {
                    sum += (x * x) as f64;
                }
                let scale = 1.0f32 / (sum as f32).sqrt().max(1e-12);
                for x in h.iter_mut() {
                    *x *= scale;
                }
            }
            for j in 0..ne {
                let ka = krow[j] * self.k_a[j];
                krow[j] += arow[j] * ka - ka;
            }
        }
        // the delta rule's a = -kk and b = kk * a (into `mid`)
        mid.resize(m, 0.0);
        for ((bv, kv), av) in mid[..m].iter_mut().zip(kk.iter_mut()).zip(a.iter()) {
            *bv = *kv * av;
            *kv = -*kv;
        }
        let n_seqs = st.rs_seqs.max(1);
        let nt = n / n_seqs;
        let rs = st.rs.as_deref_mut().ok_or_else(|| Error::Invalid("internal: rwkv7 without recurrent memory".into()))?;
        let ns = rs.n_embd_s;
        for k in 0..n_seqs {
            let cell = rs.head + k;
            let s = &mut rs.s[il][cell * ns..(cell + 1) * ns];
            for t in 0..nt {
                let row = (k * nt + t) * ne..(k * nt + t + 1) * ne;
                let rr = row.clone();
                ssm::wkv7_token(s, &sc.r[rr.clone()], &sc.w[rr.clone()], &sc.k[rr.clone()], &sc.v[rr.clone()], &kk[rr.clone()], &mid[rr], &mut sc.o[row], hs);
            }
        }
        if let Some((w, b)) = &self.ln {
            group_norm(&mut sc.o[..m], w, b, ne, hs);
        }
        // + v * sum(k * r * r_k) per head, then * g
        for (((orow, krow), rrow), (vrow, grow)) in sc.o[..m]
            .chunks_exact_mut(ne)
            .zip(sc.k.chunks_exact(ne))
            .zip(sc.r.chunks_exact(ne))
            .zip(sc.v.chunks_exact(ne).zip(sc.g.chunks_exact(ne)))
        {
            for h in 0..ne / hs {
                let mut sum = 0f64;
                for j in h * hs..(h + 1) * hs {
                    sum += ((krow[j] * rrow[j]) * self.r_k[j]) as f64;
                }
                let rk = sum as f32;
                for j in h * hs..(h + 1) * hs {
                    orow[j] += vrow[j] * rk;
                }
            }
            if self.g.is_some() {
                for (o, g) in orow.iter_mut().zip(grow) {
                    *o *= g;
                }
            }
        }
        let b = &mut *st.b;
        Step::mm(st.pool, st.dev, &self.output, &sc.o, n, &mut b.tmp, &mut b.mm_scratch, &mut b.lora)
    }
}

impl RwkvLayer for Layer {
    fn norms(&self) -> &LayerNorms {
        &self.norms
    }

    fn time_mix(&self, st: &mut Step, il: usize, sc: &mut Scratch) -> Result<()> {
        self.tm.run(st, il, sc)
    }

    fn channel_mix(&self, st: &mut Step, sc: &mut Scratch) -> Result<()> {
        let (n, ne) = (st.n, st.hp.n_embd);
        let m = n * ne;
        let nf = self.cm_key.n_rows();
        shift_diff_of(sc, &st.b.cur[..m]);
        sc.k.resize(m, 0.0);
        sc.ffk.resize(n * nf, 0.0);
        lerp_rows(&sc.sx, &st.b.cur[..m], &self.cm_lerp_k, &mut sc.k, ne);
        let b = &mut *st.b;
        Step::mm(st.pool, st.dev, &self.cm_key, &sc.k, n, &mut sc.ffk, &mut b.mm_scratch, &mut b.lora)?;
        for v in sc.ffk[..n * nf].iter_mut() {
            let r = if *v > 0.0 { *v } else { 0.0 };
            *v = r * r;
        }
        Step::mm(st.pool, st.dev, &self.cm_value, &sc.ffk, n, &mut b.tmp, &mut b.mm_scratch, &mut b.lora)
    }
}
