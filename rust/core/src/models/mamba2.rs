//! Mamba-2 (llama.cpp's src/models/mamba.cpp with `build_mamba2_layer` of mamba-base.cpp):
//! no attention; each layer is RMSNorm, then the mixer: one input projection into z, xBC
//! and dt; a causal depthwise convolution over xBC (its last d_conv - 1 inputs are the
//! sequence's conv state) + bias, SiLU; the selective scan with a scalar decay per head and
//! B / C shared by groups of heads (its state [n_head][head_dim][d_state] per sequence);
//! y + D x, gated by SiLU(z), RMS-normed per group; the output projection; the residual.
//! The states live in the context's recurrent memory (recurrent.rs).

use super::loader::{Keep, Loader};
use super::{recurrent_hparams, Arch};
use crate::context::{ContextParams, Forward, Step};
use crate::error::{Error, Result};
use crate::hparams::{HParams, Meta};
use crate::model::TensorView;
use crate::models::graph::Norm;
use crate::ops::rope::RopeParams;
use crate::ops::{act, norm::rms_norm_row, ssm};
use std::sync::Mutex;

pub struct Mamba2;

/// The `{arch}.ssm.*` hyperparameters (llama.cpp's ssm_d_conv, ssm_d_inner, ssm_d_state,
/// ssm_dt_rank = the number of heads, ssm_n_group).
#[derive(Clone, Copy, Debug)]
pub struct SsmParams {
    pub d_conv: usize,
    pub d_inner: usize,
    pub d_state: usize,
    pub n_head: usize,
    pub n_group: usize,
}

impl SsmParams {
    pub fn read(meta: &Meta, group_required: bool) -> Result<SsmParams> {
        let p = SsmParams {
            d_conv: meta.req_u("ssm.conv_kernel")?,
            d_inner: meta.req_u("ssm.inner_size")?,
            d_state: meta.req_u("ssm.state_size")?,
            n_head: meta.req_u("ssm.time_step_rank")?,
            n_group: if group_required { meta.req_u("ssm.group_count")? } else { meta.u("ssm.group_count")?.unwrap_or(1) },
        };
        let bad = |m: String| Err(Error::Unsupported(format!("{}: {m}", meta.file.path)));
        let lim = crate::hparams::MAX_DIM;
        if [p.d_conv, p.d_inner, p.d_state, p.n_head, p.n_group].iter().any(|&v| v == 0 || v > lim) {
            return bad(format!(
                "the ssm.* sizes (conv_kernel {}, inner_size {}, state_size {}, time_step_rank {}, group_count {}) must be in [1, {lim}]",
                p.d_conv, p.d_inner, p.d_state, p.n_head, p.n_group
            ));
        }
        if p.d_inner % p.n_head != 0 || p.d_inner % p.n_group != 0 || p.n_head % p.n_group != 0 {
            return bad(format!(
                "ssm.inner_size {} must be a multiple of ssm.time_step_rank {} and ssm.group_count {}, which must divide it",
                p.d_inner, p.n_head, p.n_group
            ));
        }
        Ok(p)
    }
    pub fn conv_dim(&self) -> usize {
        self.d_inner + 2 * self.n_group * self.d_state
    }
    /// llama.cpp's n_embd_r / n_embd_s.
    pub fn n_embd_r(&self) -> usize {
        (self.d_conv - 1) * self.conv_dim()
    }
    pub fn n_embd_s(&self) -> usize {
        self.d_state * self.d_inner
    }
}

impl Arch for Mamba2 {
    fn name(&self) -> &'static str {
        "mamba2"
    }

    fn hparams(&self, meta: &Meta, n_vocab: usize) -> Result<HParams> {
        recurrent_hparams(meta, n_vocab, |m, _| SsmParams::read(m, true).map(|_| ()))
    }

    fn type_name(&self, hp: &HParams) -> &'static str {
        // Mamba's size classes and one more
        match (hp.n_layer, hp.n_embd) {
            (64, 4096) => "7B",
            _ => super::mamba::Mamba.type_name(hp),
        }
    }

    fn build_forward(&self, ld: &Loader, _cp: &ContextParams) -> Result<Box<dyn Forward>> {
        let hp = ld.hp();
        let meta = Meta { file: &ld.model().files[0], arch: self.name() };
        let sp = SsmParams::read(&meta, true)?;
        let layers = (0..hp.n_layer).map(|il| Ok(Mamba2Block(SsmLayer::load(ld, il, &sp, true)?, sp))).collect::<Result<Vec<_>>>()?;
        SsmStackFwd::build(ld, layers, sp.n_embd_r(), sp.n_embd_s())
    }
}

/// One Mamba-2 mixer's weights.
pub struct SsmLayer {
    pub attn_norm: Vec<f32>,
    pub ssm_in: TensorView<'static>,
    /// [conv_dim][d_conv]
    pub conv_w: Vec<f32>,
    pub conv_b: Vec<f32>,
    pub dt_b: Vec<f32>,
    pub a: Vec<f32>,
    pub d: Vec<f32>,
    /// [n_group][d_inner / n_group]
    pub norm: Option<Vec<f32>>,
    pub out: TensorView<'static>,
}

impl SsmLayer {
    pub fn load(ld: &Loader, il: usize, sp: &SsmParams, norm_required: bool) -> Result<SsmLayer> {
        let ne = ld.hp().n_embd;
        let b = |s: &str| format!("blk.{il}.{s}");
        let cd = sp.conv_dim();
        let d_in_proj = sp.d_inner + cd + sp.n_head;
        let norm_shape = [sp.d_inner / sp.n_group, sp.n_group];
        Ok(SsmLayer {
            attn_norm: ld.req_vec(&b("attn_norm.weight"), &[ne])?,
            ssm_in: ld.req(&b("ssm_in.weight"), &[ne, d_in_proj])?,
            conv_w: ld.req_vec(&b("ssm_conv1d.weight"), &[sp.d_conv, cd])?,
            conv_b: ld.req_vec(&b("ssm_conv1d.bias"), &[cd])?,
            dt_b: ld.req_vec(&b("ssm_dt.bias"), &[sp.n_head])?,
            a: ld.req_vec(&b("ssm_a"), &[1, sp.n_head])?,
            d: ld.req_vec(&b("ssm_d"), &[1, sp.n_head])?,
            norm: if norm_required {
                Some(ld.req_vec(&b("ssm_norm.weight"), &norm_shape)?)
            } else {
                ld.opt_vec(&b("ssm_norm.weight"), &norm_shape)?
            },
            out: ld.req(&b("ssm_out.weight"), &[sp.d_inner, ne])?,
        })
    }
}

#[derive(Default)]
pub struct SsmScratch {
    zx: Vec<f32>,
    conv: Vec<f32>,
    y: Vec<f32>,
    win: Vec<f32>,
}

/// The Mamba-2 mixer of layer `il`: in `cur` [n, n_embd] (normed), out `tmp` [n, n_embd].
/// Tokens are sequence-major: set k of the micro-batch has rows [k * nt, (k + 1) * nt)
/// and its state in cell rs.head + k.
pub fn mamba2_mixer(st: &mut Step, il: usize, l: &SsmLayer, sp: &SsmParams, eps: f32, sc: &mut SsmScratch) -> Result<()> {
    let n = st.n;
    let n_seqs = st.rs_seqs.max(1);
    let nt = n / n_seqs;
    let (di, ds, nh, ng, dc) = (sp.d_inner, sp.d_state, sp.n_head, sp.n_group, sp.d_conv);
    let hd = di / nh;
    let cd = sp.conv_dim();
    let dip = di + cd + nh;
    sc.zx.resize(n * dip, 0.0);
    sc.conv.resize(n * cd, 0.0);
    sc.y.resize(n * di, 0.0);
    {
        let b = &mut *st.b;
        Step::mm(st.pool, st.dev, &l.ssm_in, &b.cur, n, &mut sc.zx, &mut b.mm_scratch, &mut b.lora)?;
    }
    let rs = st.rs.as_deref_mut().ok_or_else(|| Error::Invalid("internal: mamba2 without recurrent memory".into()))?;
    let (nr, ns) = (rs.n_embd_r, rs.n_embd_s);
    let head = rs.head;
    for k in 0..n_seqs {
        let cell = head + k;
        let r = &mut rs.r[il][cell * nr..(cell + 1) * nr];
        let zx = &sc.zx;
        let x = |t: usize| &zx[(k * nt + t) * dip + di..(k * nt + t) * dip + di + cd];
        ssm::conv_seq(r, &x, nt, &l.conv_w, dc, &mut sc.conv[k * nt * cd..], cd, &mut sc.win);
    }
    // bias, then SiLU (row by row, as ggml_add and ggml_silu)
    for row in sc.conv[..n * cd].chunks_exact_mut(cd) {
        for (v, b) in row.iter_mut().zip(&l.conv_b) {
            *v += b;
        }
        act::silu_row(row);
    }
    // dt + bias
    let mut dt = vec![0f32; nh];
    for k in 0..n_seqs {
        let cell = head + k;
        let s = &mut rs.s[il][cell * ns..(cell + 1) * ns];
        for t in 0..nt {
            let row = k * nt + t;
            let xbc = &sc.conv[row * cd..(row + 1) * cd];
            let (x, bc) = xbc.split_at(di);
            let (bm, cm) = bc.split_at(ng * ds);
            let dtr = &sc.zx[row * dip + di + cd..row * dip + dip];
            for h in 0..nh {
                dt[h] = dtr[h] + l.dt_b[h];
            }
            let y = &mut sc.y[row * di..(row + 1) * di];
            ssm::scan_token_mamba2(s, x, &dt, &l.a, bm, cm, y, nh, hd, ng, ds);
            // y + x * D, then y * silu(z) (ggml_swiglu_split(z, y)), then the grouped norm
            for h in 0..nh {
                for i in 0..hd {
                    let j = h * hd + i;
                    y[j] += x[j] * l.d[h];
                }
            }
            let z = &sc.zx[row * dip..row * dip + di];
            // ggml's glu runs row by row: rows of head_dim here
            for h in 0..nh {
                let mut g = z[h * hd..(h + 1) * hd].to_vec();
                act::swiglu(&mut g, &y[h * hd..(h + 1) * hd]);
                y[h * hd..(h + 1) * hd].copy_from_slice(&g);
            }
            if let Some(w) = &l.norm {
                let gs = di / ng;
                for (yg, wg) in y.chunks_exact_mut(gs).zip(w.chunks_exact(gs)) {
                    rms_norm_row(yg, Some(wg), eps);
                }
            }
        }
    }
    let b = &mut *st.b;
    Step::mm(st.pool, st.dev, &l.out, &sc.y, n, &mut b.tmp, &mut b.mm_scratch, &mut b.lora)?;
    crate::cb!(st, "mamba_out", il, tmp, st.hp.n_embd);
    Ok(())
}

/// One layer of an attention-free SSM stack (mamba, mamba2): its pre-norm and its mixer.
pub trait SsmBlock: Send + Sync {
    type Scratch: Default + Send;
    fn attn_norm(&self) -> &[f32];
    /// The mixer of layer `il`: in `cur` [n, n_embd] (normed), out `tmp` [n, n_embd].
    fn mix(&self, st: &mut Step, il: usize, eps: f32, sc: &mut Self::Scratch) -> Result<()>;
}

struct Mamba2Block(SsmLayer, SsmParams);

impl SsmBlock for Mamba2Block {
    type Scratch = SsmScratch;
    fn attn_norm(&self) -> &[f32] {
        &self.0.attn_norm
    }
    fn mix(&self, st: &mut Step, il: usize, eps: f32, sc: &mut SsmScratch) -> Result<()> {
        mamba2_mixer(st, il, &self.0, &self.1, eps, sc)
    }
}

/// llama.cpp's mamba.cpp graph (Mamba and Mamba-2): per layer RMSNorm, the mixer, the
/// residual; the output norm and projection (tied to the embeddings when `output` is absent).
pub struct SsmStackFwd<L: SsmBlock> {
    tok_embd: TensorView<'static>,
    output_norm: Vec<f32>,
    output: TensorView<'static>,
    layers: Vec<L>,
    n_embd_r: usize,
    n_embd_s: usize,
    eps: f32,
    scratch: Mutex<L::Scratch>,
    _keep: Keep,
}

impl<L: SsmBlock + 'static> SsmStackFwd<L> {
    pub fn build(ld: &Loader, layers: Vec<L>, n_embd_r: usize, n_embd_s: usize) -> Result<Box<dyn Forward>> {
        let hp = ld.hp();
        let (ne, nv) = (hp.n_embd, hp.n_vocab);
        let tok_embd = ld.req("token_embd.weight", &[ne, nv])?;
        let output = ld.opt("output.weight", &[ne, nv])?.unwrap_or(tok_embd);
        Ok(Box::new(SsmStackFwd {
            tok_embd,
            output_norm: ld.req_vec("output_norm.weight", &[ne])?,
            output,
            layers,
            n_embd_r,
            n_embd_s,
            eps: hp.f_norm_rms_eps,
            scratch: Mutex::new(L::Scratch::default()),
            _keep: ld.keep(),
        }))
    }
}

impl<L: SsmBlock> Forward for SsmStackFwd<L> {
    fn rope(&self, _il: usize) -> Option<&RopeParams> {
        None
    }

    fn recurrent(&self) -> Option<(Vec<bool>, usize, usize)> {
        Some((vec![true; self.layers.len()], self.n_embd_r, self.n_embd_s))
    }

    fn forward(&self, st: &mut Step) -> Result<()> {
        let ne = st.hp.n_embd;
        let mut sc = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
        st.build_inp_embd(&self.tok_embd, 1.0)?;
        let nl = self.layers.len();
        for (il, l) in self.layers.iter().enumerate() {
            st.build_norm(l.attn_norm(), None, Norm::Rms, self.eps);
            crate::cb!(st, "attn_norm", il, cur, ne);
            l.mix(st, il, self.eps, &mut sc)?;
            if il == nl - 1 && !st.select_outputs() {
                return Ok(());
            }
            st.residual();
            st.build_cvec(il);
            crate::cb!(st, "l_out", il, x, ne);
        }
        st.build_norm(&self.output_norm, None, Norm::Rms, self.eps);
        st.build_output(&self.output, None, 0.0)
    }
}
