//! RWKV-6 "Finch" (llama.cpp's src/models/rwkv6.cpp with rwkv6-base.cpp): no attention and
//! no positions. The embeddings are LayerNormed (`token_embd_norm`); each layer is
//! LayerNorm, the time mix, the residual, LayerNorm, the channel mix, the residual (halved
//! every `rescale_every_n_layers` layers). Both mixes read the previous token's normed
//! input ("token shift": the sequence's last one from the state for its first token).
//! Time mix: a data-dependent lerp between the token and the previous one (LoRA-style
//! `time_mix_w1` / `w2`, five mixes w, k, v, r, g), r / k / v / gate projections, a decay
//! per channel exp(-exp(decay + LoRA(x_w))), the WKV-6 recurrence per head (its state
//! [head_size][head_size] per head, `ops::ssm::wkv6_token`), a GroupNorm per head (eps
//! 64e-5), times SiLU(gate), the output projection. Channel mix: sigmoid(r) * value(relu(key
//! x)^2). The recurrent state per sequence is the two shifted rows and the WKV states.

use super::graph::Norm;
use super::loader::{Keep, Loader};
use super::{read_sizes, recurrent_hparams, Arch};
use crate::context::{ContextParams, Forward, Step};
use crate::error::{Error, Result};
use crate::hparams::{HParams, Meta};
use crate::model::TensorView;
use crate::ops::norm::layer_norm_row;
use crate::ops::rope::RopeParams;
use crate::ops::{act, ssm};
use std::sync::Mutex;

pub struct Rwkv6;

/// The RWKV hyperparameters llama.cpp reads for rwkv6.
#[derive(Clone, Copy, Debug)]
struct Params {
    head_size: usize,
    mix_extra: usize,
    decay_extra: usize,
    rescale: usize,
}

impl Params {
    fn read(meta: &Meta, n_embd: usize) -> Result<Params> {
        let [head_size, mix_extra, decay_extra] =
            read_sizes(meta, [("wkv.head_size", None), ("time_mix_extra_dim", None), ("time_decay_extra_dim", None)])?;
        check_rwkv(meta, n_embd, head_size, 1, 2)?;
        Ok(Params { head_size, mix_extra, decay_extra, rescale: meta.u("rescale_every_n_layers")?.unwrap_or(0) })
    }
}

/// What the RWKV architectures require of the file beyond their sizes: heads of
/// `head_size` (a multiple of `head_align`) that tile n_embd, and `shifts` token shifts
/// (llama.cpp asserts it).
pub(crate) fn check_rwkv(meta: &Meta, n_embd: usize, head_size: usize, head_align: usize, shifts: usize) -> Result<()> {
    let bad = |m: String| Err(Error::Unsupported(format!("{}: {m}", meta.file.path)));
    if head_size % head_align != 0 || n_embd % head_size != 0 {
        let align = if head_align > 1 { format!(" a multiple of {head_align} that divides") } else { " dividing".into() };
        return bad(format!("wkv.head_size {head_size} must be{align} embedding_length {n_embd}"));
    }
    let shift = meta.u("token_shift_count")?.unwrap_or(2);
    if shift != shifts {
        return bad(format!("token_shift_count {shift}: llama.cpp's {} needs {shifts}", meta.arch));
    }
    Ok(())
}

impl Arch for Rwkv6 {
    fn name(&self) -> &'static str {
        "rwkv6"
    }

    fn hparams(&self, meta: &Meta, n_vocab: usize) -> Result<HParams> {
        recurrent_hparams(meta, n_vocab, |m, ne| Params::read(m, ne).map(|_| ()))
    }

    fn type_name(&self, hp: &HParams) -> &'static str {
        match (hp.n_layer, hp.n_embd) {
            (24, _) => "1.6B",
            (32, 2560) => "3B",
            (32, 4096) => "7B",
            (61, _) => "14B",
            (64, _) => "32B",
            _ => "?B",
        }
    }

    fn build_forward(&self, ld: &Loader, _cp: &ContextParams) -> Result<Box<dyn Forward>> {
        let hp = ld.hp();
        let meta = Meta { file: &ld.model().files[0], arch: self.name() };
        let p = Params::read(&meta, hp.n_embd)?;
        let ne = hp.n_embd;
        let (e, d, hs) = (p.mix_extra, p.decay_extra, p.head_size);
        let mut layers = Vec::with_capacity(hp.n_layer);
        for il in 0..hp.n_layer {
            let b = |s: &str| format!("blk.{il}.{s}");
            let nf = hp.n_ff[il];
            layers.push(Layer {
                norms: LayerNorms::load(ld, il)?,
                tm: TimeMix6::load(ld, il, p.head_size, e, d, ne / hs, false)?,
                cm_lerp_k: ld.req_vec(&b("channel_mix_lerp_k.weight"), &[ne])?,
                cm_lerp_r: ld.req_vec(&b("channel_mix_lerp_r.weight"), &[ne])?,
                cm_key: ld.req(&b("channel_mix_key.weight"), &[ne, nf])?,
                cm_value: ld.req(&b("channel_mix_value.weight"), &[nf, ne])?,
                cm_receptance: ld.req(&b("channel_mix_receptance.weight"), &[ne, ne])?,
            });
        }
        RwkvFwd::build(ld, layers, hs, p.rescale)
    }
}

/// The two LayerNorms of an RWKV layer (before the time mix and before the channel mix).
pub(crate) struct LayerNorms {
    pub attn_norm: Vec<f32>,
    pub attn_norm_b: Vec<f32>,
    pub attn_norm_2: Vec<f32>,
    pub attn_norm_2_b: Vec<f32>,
}

impl LayerNorms {
    pub fn load(ld: &Loader, il: usize) -> Result<LayerNorms> {
        let ne = ld.hp().n_embd;
        let b = |s: &str| format!("blk.{il}.{s}");
        Ok(LayerNorms {
            attn_norm: ld.req_vec(&b("attn_norm.weight"), &[ne])?,
            attn_norm_b: ld.req_vec(&b("attn_norm.bias"), &[ne])?,
            attn_norm_2: ld.req_vec(&b("attn_norm_2.weight"), &[ne])?,
            attn_norm_2_b: ld.req_vec(&b("attn_norm_2.bias"), &[ne])?,
        })
    }
}

/// One layer of an RWKV stack: its norms, time mix and channel mix.
pub(crate) trait RwkvLayer: Send + Sync {
    fn norms(&self) -> &LayerNorms;
    /// In `cur` [n, n_embd] (normed) and sc.xprev (the previous tokens' rows), out `tmp`.
    fn time_mix(&self, st: &mut Step, il: usize, sc: &mut Scratch) -> Result<()>;
    /// In `cur` [n, n_embd] (normed) and sc.xprev, out `tmp`.
    fn channel_mix(&self, st: &mut Step, sc: &mut Scratch) -> Result<()>;
}

/// An RWKV-6 time mix's weights (rwkv6; rwkv6qwen2's "QRWKV" form: no `time_mix_first`,
/// no GroupNorm, optional r / k / v biases, k / v of `n_kv` heads repeated to all heads).
pub(crate) struct TimeMix6 {
    head_size: usize,
    mix_extra: usize,
    decay_extra: usize,
    /// heads of the key and value projections (n_embd / head_size: no repetition)
    n_kv: usize,
    w1: TensorView<'static>,
    /// {mix_extra, n_embd, 5}: rows [g * n_embd, (g + 1) * n_embd) are mix g's matrix
    w2: TensorView<'static>,
    lerp_x: Vec<f32>,
    /// [5][n_embd]: the w, k, v, r, g lerps
    lerp: Vec<f32>,
    /// [n_head][head_size] (llama.cpp's time_faaaa); None: the QRWKV form (rwkv6qwen2)
    first: Option<Vec<f32>>,
    decay: Vec<f32>,
    decay_w1: TensorView<'static>,
    decay_w2: TensorView<'static>,
    key: TensorView<'static>,
    value: TensorView<'static>,
    receptance: TensorView<'static>,
    gate: TensorView<'static>,
    /// the biases of receptance, key, value (rwkv6qwen2's, optional)
    bias: [Option<Vec<f32>>; 3],
    /// the GroupNorm's weight and bias (rwkv6)
    ln: Option<(Vec<f32>, Vec<f32>)>,
    output: TensorView<'static>,
}

impl TimeMix6 {
    /// `qwen2`: rwkv6qwen2's form (the tensors of rwkv6qwen2.cpp's load_arch_tensors).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn load(ld: &Loader, il: usize, hs: usize, e: usize, d: usize, n_kv: usize, qwen2: bool) -> Result<TimeMix6> {
        let ne = ld.hp().n_embd;
        let b = |s: &str| format!("blk.{il}.{s}");
        let lerp = match ld.opt_vec(&b("time_mix_lerp_fused.weight"), &[ne, 1, 1, 5])? {
            Some(v) => v,
            None if qwen2 => ld.req_vec(&b("time_mix_lerp_fused.weight"), &[ne, 1, 1, 5])?,
            None => {
                let mut v = Vec::with_capacity(5 * ne);
                for m in ["w", "k", "v", "r", "g"] {
                    v.extend(ld.req_vec(&b(&format!("time_mix_lerp_{m}.weight")), &[ne])?);
                }
                v
            }
        };
        let first = if qwen2 {
            if ld.opt_vec(&b("time_mix_first.weight"), &[hs, ne / hs])?.is_some() {
                // llama.cpp then takes the RWKV-6 path, whose GroupNorm rwkv6qwen2 does not load
                return Err(Error::Unsupported(format!(
                    "{}: rwkv6qwen2 with time_mix_first (llama.cpp's RWKV-6 path without its GroupNorm) is not supported",
                    b("time_mix_first.weight")
                )));
            }
            None
        } else {
            Some(ld.req_vec(&b("time_mix_first.weight"), &[hs, ne / hs])?)
        };
        let kvw = n_kv * hs;
        Ok(TimeMix6 {
            head_size: hs,
            mix_extra: e,
            decay_extra: d,
            n_kv,
            w1: ld.req(&b("time_mix_w1.weight"), &[ne, 5 * e])?,
            w2: ld.req(&b("time_mix_w2.weight"), &[e, ne, 5])?,
            lerp_x: ld.req_vec(&b("time_mix_lerp_x.weight"), &[ne])?,
            lerp,
            first,
            decay: ld.req_vec(&b("time_mix_decay.weight"), &[ne])?,
            decay_w1: ld.req(&b("time_mix_decay_w1.weight"), &[ne, d])?,
            decay_w2: ld.req(&b("time_mix_decay_w2.weight"), &[d, ne])?,
            key: ld.req(&b("time_mix_key.weight"), &[ne, kvw])?,
            value: ld.req(&b("time_mix_value.weight"), &[ne, kvw])?,
            receptance: ld.req(&b("time_mix_receptance.weight"), &[ne, ne])?,
            gate: ld.req(&b("time_mix_gate.weight"), &[ne, ne])?,
            bias: if qwen2 {
                [
                    ld.opt_vec(&b("time_mix_receptance.bias"), &[ne])?,
                    ld.opt_vec(&b("time_mix_key.bias"), &[kvw])?,
                    ld.opt_vec(&b("time_mix_value.bias"), &[kvw])?,
                ]
            } else {
                [None, None, None]
            },
            ln: if qwen2 {
                None
            } else {
                Some((ld.req_vec(&b("time_mix_ln.weight"), &[ne])?, ld.req_vec(&b("time_mix_ln.bias"), &[ne])?))
            },
            output: ld.req(&b("time_mix_output.weight"), &[ne, ne])?,
        })
    }
}

struct Layer {
    norms: LayerNorms,
    tm: TimeMix6,
    cm_lerp_k: Vec<f32>,
    cm_lerp_r: Vec<f32>,
    cm_key: TensorView<'static>,
    cm_value: TensorView<'static>,
    cm_receptance: TensorView<'static>,
}

/// The RWKV stacks' work buffers (one set per forward pass, behind its mutex).
#[derive(Default)]
pub(crate) struct Scratch {
    pub(crate) att: Vec<f32>,
    pub(crate) xprev: Vec<f32>,
    pub(crate) sx: Vec<f32>,
    pub(crate) xxx: Vec<f32>,
    pub(crate) w1o: Vec<f32>,
    pub(crate) gin: Vec<f32>,
    pub(crate) mix: Vec<f32>,
    pub(crate) r: Vec<f32>,
    pub(crate) k: Vec<f32>,
    pub(crate) v: Vec<f32>,
    pub(crate) g: Vec<f32>,
    pub(crate) w: Vec<f32>,
    pub(crate) dtmp: Vec<f32>,
    pub(crate) o: Vec<f32>,
    pub(crate) ffk: Vec<f32>,
    /// rwkv7's: the first layer's values, a, kk, LoRA intermediates
    pub(crate) ext: [Vec<f32>; 4],
}

/// llama.cpp's rwkv6.cpp / rwkv7.cpp graph around the layers' mixes: the LayerNormed
/// embeddings, per layer the token shifts (state rows: the time mix's, then the channel
/// mix's), the two residuals, the optional halving, the output LayerNorm and projection.
pub(crate) struct RwkvFwd<L: RwkvLayer> {
    tok_embd: TensorView<'static>,
    tok_norm: Vec<f32>,
    tok_norm_b: Vec<f32>,
    output_norm: Vec<f32>,
    output_norm_b: Vec<f32>,
    output: TensorView<'static>,
    layers: Vec<L>,
    head_size: usize,
    rescale: usize,
    eps: f32,
    scratch: Mutex<Scratch>,
    _keep: Keep,
}

impl<L: RwkvLayer + 'static> RwkvFwd<L> {
    pub fn build(ld: &Loader, layers: Vec<L>, head_size: usize, rescale: usize) -> Result<Box<dyn Forward>> {
        let hp = ld.hp();
        let (ne, nv) = (hp.n_embd, hp.n_vocab);
        Ok(Box::new(RwkvFwd {
            tok_embd: ld.req("token_embd.weight", &[ne, nv])?,
            tok_norm: ld.req_vec("token_embd_norm.weight", &[ne])?,
            tok_norm_b: ld.req_vec("token_embd_norm.bias", &[ne])?,
            output_norm: ld.req_vec("output_norm.weight", &[ne])?,
            output_norm_b: ld.req_vec("output_norm.bias", &[ne])?,
            output: ld.req("output.weight", &[ne, nv])?,
            layers,
            head_size,
            rescale,
            eps: hp.f_norm_eps,
            scratch: Mutex::new(Scratch::default()),
            _keep: ld.keep(),
        }))
    }
}

/// ggml_sub(xprev, cur) into sc.sx [m], as the mixes start.
pub(crate) fn shift_diff_of(sc: &mut Scratch, cur: &[f32]) {
    let m = cur.len();
    sc.sx.resize(m, 0.0);
    shift_diff(&sc.xprev[..m], cur, &mut sc.sx);
}

/// The per-head GroupNorm of the WKV output sc.o (eps 64e-5, weight and bias per channel).
pub(crate) fn group_norm(o: &mut [f32], ln: &[f32], ln_b: &[f32], ne: usize, hs: usize) {
    for row in o.chunks_exact_mut(ne) {
        for ((h, w), b) in row.chunks_exact_mut(hs).zip(ln.chunks_exact(hs)).zip(ln_b.chunks_exact(hs)) {
            layer_norm_row(h, Some(w), Some(b), 64e-5);
        }
    }
}

/// sx = xprev - cur (ggml_sub).
fn shift_diff(xprev: &[f32], cur: &[f32], sx: &mut [f32]) {
    for ((s, p), c) in sx.iter_mut().zip(xprev).zip(cur) {
        *s = p - c;
    }
}

/// ggml_add(ggml_mul(sx, lerp), cur) over rows of `ne`.
pub(crate) fn lerp_rows(sx: &[f32], cur: &[f32], lerp: &[f32], out: &mut [f32], ne: usize) {
    for ((o, s), c) in out.chunks_exact_mut(ne).zip(sx.chunks_exact(ne)).zip(cur.chunks_exact(ne)) {
        for j in 0..ne {
            o[j] = s[j] * lerp[j] + c[j];
        }
    }
}

/// The rows each token's mixes read as "previous": the sequence's state row `shift`
/// for its first token, the previous row of `rows` after that. Sequence-major tokens:
/// set k has rows [k * nt, (k + 1) * nt) and its state in cell rs.head + k.
pub(crate) fn prev_rows(st: &Step, il: usize, rows: &[f32], which: usize, out: &mut [f32]) -> Result<()> {
    let ne = st.hp.n_embd;
    let n = st.n;
    let n_seqs = st.rs_seqs.max(1);
    let nt = n / n_seqs;
    let rs = st.rs.as_deref().ok_or_else(|| Error::Invalid("internal: an RWKV model without recurrent memory".into()))?;
    let nr = rs.n_embd_r;
    for k in 0..n_seqs {
        let cell = rs.head + k;
        let state = &rs.r[il][cell * nr + which * ne..cell * nr + (which + 1) * ne];
        for t in 0..nt {
            let row = k * nt + t;
            let src = if t == 0 { state } else { &rows[(row - 1) * ne..row * ne] };
            out[row * ne..(row + 1) * ne].copy_from_slice(src);
        }
    }
    Ok(())
}

/// Each sequence's last row of `rows` into its state row `which` (the token shift for the
/// next micro-batch).
pub(crate) fn store_shift(st: &mut Step, il: usize, rows: &[f32], which: usize) -> Result<()> {
    let ne = st.hp.n_embd;
    let n_seqs = st.rs_seqs.max(1);
    let nt = st.n / n_seqs;
    let rs = st.rs.as_deref_mut().ok_or_else(|| Error::Invalid("internal: an RWKV model without recurrent memory".into()))?;
    let nr = rs.n_embd_r;
    for k in 0..n_seqs {
        let cell = rs.head + k;
        let last = (k * nt + nt - 1) * ne..(k * nt + nt) * ne;
        rs.r[il][cell * nr + which * ne..cell * nr + (which + 1) * ne].copy_from_slice(&rows[last]);
    }
    Ok(())
}


impl RwkvLayer for Layer {
    fn norms(&self) -> &LayerNorms {
        &self.norms
    }

    fn time_mix(&self, st: &mut Step, il: usize, sc: &mut Scratch) -> Result<()> {
        self.tm.run(st, il, sc)
    }

    fn channel_mix(&self, st: &mut Step, sc: &mut Scratch) -> Result<()> {
        let l = self;
        let (n, ne) = (st.n, st.hp.n_embd);
        let m = n * ne;
        let nf = l.cm_key.n_rows();
        sc.ffk.resize(n * nf, 0.0);
        let b = &mut *st.b;
        let cur = &b.cur[..m];
        shift_diff(&sc.xprev[..m], cur, &mut sc.sx);
        lerp_rows(&sc.sx, cur, &l.cm_lerp_k, &mut sc.k, ne);
        lerp_rows(&sc.sx, cur, &l.cm_lerp_r, &mut sc.xxx, ne);
        Step::mm(st.pool, st.dev, &l.cm_receptance, &sc.xxx, n, &mut sc.r, &mut b.mm_scratch, &mut b.lora)?;
        for v in sc.r[..m].iter_mut() {
            *v = 1.0 / (1.0 + (-*v).exp());
        }
        Step::mm(st.pool, st.dev, &l.cm_key, &sc.k, n, &mut sc.ffk, &mut b.mm_scratch, &mut b.lora)?;
        for v in sc.ffk[..n * nf].iter_mut() {
            let r = if *v > 0.0 { *v } else { 0.0 };
            *v = r * r;
        }
        Step::mm(st.pool, st.dev, &l.cm_value, &sc.ffk, n, &mut b.tmp, &mut b.mm_scratch, &mut b.lora)?;
        for (o, r) in b.tmp[..m].iter_mut().zip(&sc.r) {
            *o = r * *o;
        }
        Ok(())
    }
}

/// ggml_add of a bias to every row.
fn add_bias(x: &mut [f32], bias: &[f32]) {
    for row in x.chunks_exact_mut(bias.len()) {
        for (v, b) in row.iter_mut().zip(bias) {
            *v += b;
        }
    }
}

/// The key / value heads repeated to all heads (ggml_repeat of [hs, 1, n_kv] to
/// [hs, n_head / n_kv, n_kv]: head h reads kv head h / (n_head / n_kv)), in place: `x`
/// holds n rows of n_kv * hs and gets n rows of n_head * hs.
fn repeat_heads(x: &mut [f32], n: usize, hs: usize, n_kv: usize, n_head: usize) {
    let (wk, wh, rep) = (n_kv * hs, n_head * hs, n_head / n_kv);
    for t in (0..n).rev() {
        for h in (0..n_head).rev() {
            let g = h / rep;
            x.copy_within(t * wk + g * hs..t * wk + (g + 1) * hs, t * wh + h * hs);
        }
    }
}

impl TimeMix6 {
    /// In `cur` [n, n_embd] (normed) and sc.xprev, out `tmp`; the WKV states in `rs.s[il]`.
    pub(crate) fn run(&self, st: &mut Step, il: usize, sc: &mut Scratch) -> Result<()> {
        let l = self;
        let (n, ne) = (st.n, st.hp.n_embd);
        let (e, hs) = (self.mix_extra, self.head_size);
        let m = n * ne;
        for v in [&mut sc.sx, &mut sc.xxx, &mut sc.r, &mut sc.k, &mut sc.v, &mut sc.g, &mut sc.w, &mut sc.o] {
            v.resize(m, 0.0);
        }
        sc.mix.resize(5 * m, 0.0);
        sc.w1o.resize(n * 5 * e, 0.0);
        sc.gin.resize(n * e, 0.0);
        sc.dtmp.resize(n * self.decay_extra, 0.0);
        let cur = &st.b.cur[..m];
        shift_diff(&sc.xprev[..m], cur, &mut sc.sx);
        lerp_rows(&sc.sx, cur, &l.lerp_x, &mut sc.xxx, ne);
        let b = &mut *st.b;
        Step::mm(st.pool, st.dev, &l.w1, &sc.xxx, n, &mut sc.w1o, &mut b.mm_scratch, &mut b.lora)?;
        for v in sc.w1o[..n * 5 * e].iter_mut() {
            *v = v.tanh();
        }
        for g in 0..5 {
            for t in 0..n {
                sc.gin[t * e..(t + 1) * e].copy_from_slice(&sc.w1o[t * 5 * e + g * e..t * 5 * e + (g + 1) * e]);
            }
            let out = &mut sc.mix[g * m..(g + 1) * m];
            Step::mm_rows(st.pool, st.dev, &l.w2, &sc.gin, n, out, g * ne..(g + 1) * ne, &mut b.mm_scratch, &mut b.lora)?;
            // ((xxx + lerp) * sx) + cur
            let lg = &l.lerp[g * ne..(g + 1) * ne];
            for ((o, s), c) in out.chunks_exact_mut(ne).zip(sc.sx.chunks_exact(ne)).zip(b.cur.chunks_exact(ne)) {
                for j in 0..ne {
                    o[j] = (o[j] + lg[j]) * s[j] + c[j];
                }
            }
        }
        let (xw, rest) = sc.mix.split_at(m);
        let (xk, rest) = rest.split_at(m);
        let (xv, rest) = rest.split_at(m);
        let (xr, xg) = rest.split_at(m);
        let kvw = l.n_kv * hs;
        Step::mm(st.pool, st.dev, &l.receptance, xr, n, &mut sc.r, &mut b.mm_scratch, &mut b.lora)?;
        Step::mm(st.pool, st.dev, &l.key, xk, n, &mut sc.k, &mut b.mm_scratch, &mut b.lora)?;
        Step::mm(st.pool, st.dev, &l.value, xv, n, &mut sc.v, &mut b.mm_scratch, &mut b.lora)?;
        for (x, bias) in [(&mut sc.r, &l.bias[0]), (&mut sc.k, &l.bias[1]), (&mut sc.v, &l.bias[2])] {
            if let Some(bias) = bias {
                add_bias(&mut x[..n * bias.len()], bias);
            }
        }
        Step::mm(st.pool, st.dev, &l.gate, xg, n, &mut sc.g, &mut b.mm_scratch, &mut b.lora)?;
        if l.first.is_some() {
            for row in sc.g[..m].chunks_exact_mut(ne) {
                act::silu_row(row);
            }
        } else {
            for v in sc.g[..m].iter_mut() {
                *v = 1.0 / (1.0 + (-*v).exp());
            }
        }
        if kvw != ne {
            repeat_heads(&mut sc.k, n, hs, l.n_kv, ne / hs);
            repeat_heads(&mut sc.v, n, hs, l.n_kv, ne / hs);
        }
        Step::mm(st.pool, st.dev, &l.decay_w1, xw, n, &mut sc.dtmp, &mut b.mm_scratch, &mut b.lora)?;
        for v in sc.dtmp.iter_mut() {
            *v = v.tanh();
        }
        Step::mm(st.pool, st.dev, &l.decay_w2, &sc.dtmp, n, &mut sc.w, &mut b.mm_scratch, &mut b.lora)?;
        for row in sc.w[..m].chunks_exact_mut(ne) {
            for (v, d) in row.iter_mut().zip(&l.decay) {
                *v = (-(*v + d).exp()).exp();
            }
        }
        if l.first.is_none() {
            // k = k - k * w
            for (k, w) in sc.k[..m].iter_mut().zip(&sc.w) {
                *k -= *k * w;
            }
        }
        // ggml_gated_linear_attn's scale: pow(head_size, -0.5f) in double, as a float
        let scale = (hs as f64).powf(-0.5) as f32;
        // the WKV-6 recurrence, sequence by sequence
        let n_seqs = st.rs_seqs.max(1);
        let nt = n / n_seqs;
        let rs = st.rs.as_deref_mut().ok_or_else(|| Error::Invalid("internal: rwkv6 without recurrent memory".into()))?;
        let ns = rs.n_embd_s;
        sc.o[..m].fill(0.0);
        for k in 0..n_seqs {
            let cell = rs.head + k;
            let s = &mut rs.s[il][cell * ns..(cell + 1) * ns];
            for t in 0..nt {
                let row = (k * nt + t) * ne..(k * nt + t + 1) * ne;
                let (kk, v, r, w) = (&sc.k[row.clone()], &sc.v[row.clone()], &sc.r[row.clone()], &sc.w[row.clone()]);
                match &l.first {
                    Some(u) => ssm::wkv6_token(s, kk, v, r, u, w, &mut sc.o[row], hs),
                    None => ssm::gla_token(s, kk, v, r, w, scale, &mut sc.o[row], hs),
                }
            }
        }
        // GroupNorm per head (rwkv6), then * gate
        if let Some((ln, ln_b)) = &l.ln {
            group_norm(&mut sc.o[..m], ln, ln_b, ne, hs);
        }
        for (v, gv) in sc.o[..m].iter_mut().zip(&sc.g) {
            *v *= gv;
        }
        let b = &mut *st.b;
        Step::mm(st.pool, st.dev, &l.output, &sc.o, n, &mut b.tmp, &mut b.mm_scratch, &mut b.lora)
    }
}

impl<L: RwkvLayer> Forward for RwkvFwd<L> {
    fn rope(&self, _il: usize) -> Option<&RopeParams> {
        None
    }

    fn recurrent(&self) -> Option<(Vec<bool>, usize, usize)> {
        let ne = self.tok_norm.len();
        Some((vec![true; self.layers.len()], 2 * ne, ne * self.head_size))
    }

    fn forward(&self, st: &mut Step) -> Result<()> {
        let ne = st.hp.n_embd;
        let mut guard = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
        let sc = &mut *guard;
        st.build_inp_embd(&self.tok_embd, 1.0)?;
        st.build_norm(&self.tok_norm, Some(&self.tok_norm_b), Norm::Layer, self.eps);
        let n0 = st.n * ne;
        st.b.x[..n0].copy_from_slice(&st.b.cur[..n0]);
        let nl = self.layers.len();
        for (il, l) in self.layers.iter().enumerate() {
            let m = st.n * ne;
            sc.xprev.resize(m, 0.0);
            sc.att.resize(m, 0.0);
            let nm = l.norms();
            st.build_norm(&nm.attn_norm, Some(&nm.attn_norm_b), Norm::Layer, self.eps);
            crate::cb!(st, "attn_norm", il, cur, ne);
            sc.att[..m].copy_from_slice(&st.b.cur[..m]);
            prev_rows(st, il, &sc.att, 0, &mut sc.xprev)?;
            l.time_mix(st, il, sc)?;
            st.residual();
            crate::cb!(st, "ffn_inp", il, x, ne);
            st.build_norm(&nm.attn_norm_2, Some(&nm.attn_norm_2_b), Norm::Layer, self.eps);
            crate::cb!(st, "ffn_norm", il, cur, ne);
            prev_rows(st, il, &st.b.cur, 1, &mut sc.xprev)?;
            // the token shift state: each sequence's last normed rows
            store_shift(st, il, &sc.att, 0)?;
            let cur = std::mem::take(&mut st.b.cur);
            let r = store_shift(st, il, &cur, 1);
            st.b.cur = cur;
            r?;
            if il == nl - 1 {
                let b = &mut *st.b;
                for (j, &i) in b.out_idx.iter().enumerate() {
                    if i != j {
                        b.cur.copy_within(i * ne..(i + 1) * ne, j * ne);
                        sc.xprev.copy_within(i * ne..(i + 1) * ne, j * ne);
                    }
                }
                if !st.select_outputs() {
                    return Ok(());
                }
            }
            l.channel_mix(st, sc)?;
            st.residual();
            if self.rescale != 0 && (il + 1) % self.rescale == 0 {
                let m = st.n * ne;
                act::scale(&mut st.b.x[..m], 0.5);
            }
            st.build_cvec(il);
            crate::cb!(st, "l_out", il, x, ne);
        }
        st.build_norm(&self.output_norm, Some(&self.output_norm_b), Norm::Layer, self.eps);
        st.build_output(&self.output, None, 0.0)
    }
}
