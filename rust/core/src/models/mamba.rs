//! Mamba (v1; llama.cpp's src/models/mamba.cpp with `build_mamba_layer` of mamba-base.cpp,
//! also Falcon-Mamba): no attention; each layer is RMSNorm, then the mixer: one input
//! projection into x and z (d_inner each); a causal depthwise convolution over x (its last
//! d_conv - 1 inputs are the sequence's conv state) + bias, SiLU; x_proj into dt (dt_rank),
//! B and C (d_state each), with weightless RMS norms on the three when
//! `ssm.dt_b_c_rms` is set (Falcon-Mamba); dt_proj + bias; the selective scan with a decay
//! per channel and state entry (its state [d_inner][d_state] per sequence); y + D x, gated
//! by SiLU(z); the output projection; the residual. The layer stack is mamba2.rs's.

use super::loader::Loader;
use super::mamba2::{SsmBlock, SsmStackFwd};
use super::{read_sizes, recurrent_hparams, Arch};
use crate::context::{ContextParams, Forward, Step};
use crate::error::{Error, Result};
use crate::hparams::{HParams, Meta};
use crate::model::TensorView;
use crate::ops::{act, norm::rms_norm_row, ssm};

pub struct Mamba;

/// The `{arch}.ssm.*` hyperparameters of Mamba v1.
#[derive(Clone, Copy, Debug)]
struct Params {
    d_conv: usize,
    d_inner: usize,
    d_state: usize,
    dt_rank: usize,
    dt_b_c_rms: bool,
}

impl Params {
    fn read(meta: &Meta, n_embd: usize) -> Result<Params> {
        let [d_conv, d_inner, d_state, dt_rank] = read_sizes(
            meta,
            [("ssm.conv_kernel", None), ("ssm.inner_size", None), ("ssm.state_size", None), ("ssm.time_step_rank", None)],
        )?;
        let p = Params { d_conv, d_inner, d_state, dt_rank, dt_b_c_rms: meta.b("ssm.dt_b_c_rms")?.unwrap_or(false) };
        if p.d_inner != 2 * n_embd {
            return Err(Error::Unsupported(format!(
                "{}: ssm.inner_size {} must be 2 x embedding_length {} (llama.cpp supports only that expansion)",
                meta.file.path, p.d_inner, n_embd
            )));
        }
        Ok(p)
    }
}

impl Arch for Mamba {
    fn name(&self) -> &'static str {
        "mamba"
    }

    fn hparams(&self, meta: &Meta, n_vocab: usize) -> Result<HParams> {
        recurrent_hparams(meta, n_vocab, |m, ne| Params::read(m, ne).map(|_| ()))
    }

    fn type_name(&self, hp: &HParams) -> &'static str {
        match (hp.n_layer, hp.n_embd) {
            (24, 768) => "SMALL",
            (48, 1024) => "MEDIUM",
            (48, 1536) => "LARGE",
            (48, 2048) => "XL",
            (64, 2560) => "3B",
            _ => "?B",
        }
    }

    fn build_forward(&self, ld: &Loader, _cp: &ContextParams) -> Result<Box<dyn Forward>> {
        let hp = ld.hp();
        let meta = Meta { file: &ld.model().files[0], arch: self.name() };
        let p = Params::read(&meta, hp.n_embd)?;
        let ne = hp.n_embd;
        let (di, ds, dc, dtr) = (p.d_inner, p.d_state, p.d_conv, p.dt_rank);
        let mut layers = Vec::with_capacity(hp.n_layer);
        for il in 0..hp.n_layer {
            let b = |s: &str| format!("blk.{il}.{s}");
            layers.push(Layer {
                attn_norm: ld.req_vec(&b("attn_norm.weight"), &[ne])?,
                ssm_in: ld.req(&b("ssm_in.weight"), &[ne, 2 * di])?,
                conv_w: ld.req_vec(&b("ssm_conv1d.weight"), &[dc, di])?,
                conv_b: ld.req_vec(&b("ssm_conv1d.bias"), &[di])?,
                ssm_x: ld.req(&b("ssm_x.weight"), &[di, dtr + 2 * ds])?,
                ssm_dt: ld.req(&b("ssm_dt.weight"), &[dtr, di])?,
                dt_b: ld.req_vec(&b("ssm_dt.bias"), &[di])?,
                a: ld.req_vec(&b("ssm_a"), &[ds, di])?,
                d: ld.req_vec(&b("ssm_d"), &[di])?,
                out: ld.req(&b("ssm_out.weight"), &[di, ne])?,
                p,
            });
        }
        SsmStackFwd::build(ld, layers, (dc - 1) * di, ds * di)
    }
}

struct Layer {
    attn_norm: Vec<f32>,
    ssm_in: TensorView<'static>,
    /// [d_inner][d_conv]
    conv_w: Vec<f32>,
    conv_b: Vec<f32>,
    ssm_x: TensorView<'static>,
    ssm_dt: TensorView<'static>,
    dt_b: Vec<f32>,
    /// [d_inner][d_state]
    a: Vec<f32>,
    d: Vec<f32>,
    out: TensorView<'static>,
    p: Params,
}

#[derive(Default)]
pub struct Scratch {
    xz: Vec<f32>,
    x: Vec<f32>,
    xdb: Vec<f32>,
    dtr: Vec<f32>,
    dt: Vec<f32>,
    y: Vec<f32>,
    win: Vec<f32>,
}

impl SsmBlock for Layer {
    type Scratch = Scratch;

    fn attn_norm(&self) -> &[f32] {
        &self.attn_norm
    }

    /// Tokens are sequence-major: set k of the micro-batch has rows [k * nt, (k + 1) * nt)
    /// and its state in cell rs.head + k.
    fn mix(&self, st: &mut Step, il: usize, eps: f32, sc: &mut Scratch) -> Result<()> {
        let n = st.n;
        let n_seqs = st.rs_seqs.max(1);
        let nt = n / n_seqs;
        let Params { d_conv: dc, d_inner: di, d_state: ds, dt_rank: dtr, dt_b_c_rms } = self.p;
        let nx = dtr + 2 * ds;
        sc.xz.resize(n * 2 * di, 0.0);
        sc.x.resize(n * di, 0.0);
        sc.xdb.resize(n * nx, 0.0);
        sc.dtr.resize(n * dtr, 0.0);
        sc.dt.resize(n * di, 0.0);
        sc.y.resize(n * di, 0.0);
        {
            let b = &mut *st.b;
            Step::mm(st.pool, st.dev, &self.ssm_in, &b.cur, n, &mut sc.xz, &mut b.mm_scratch, &mut b.lora)?;
        }
        let rs = st.rs.as_deref_mut().ok_or_else(|| Error::Invalid("internal: mamba without recurrent memory".into()))?;
        let (nr, ns) = (rs.n_embd_r, rs.n_embd_s);
        let head = rs.head;
        for k in 0..n_seqs {
            let cell = head + k;
            let r = &mut rs.r[il][cell * nr..(cell + 1) * nr];
            let xz = &sc.xz;
            let x = |t: usize| &xz[(k * nt + t) * 2 * di..(k * nt + t) * 2 * di + di];
            ssm::conv_seq(r, &x, nt, &self.conv_w, dc, &mut sc.x[k * nt * di..], di, &mut sc.win);
        }
        // bias, then SiLU (row by row, as ggml_add and ggml_silu)
        for row in sc.x[..n * di].chunks_exact_mut(di) {
            for (v, b) in row.iter_mut().zip(&self.conv_b) {
                *v += b;
            }
            act::silu_row(row);
        }
        {
            let b = &mut *st.b;
            Step::mm(st.pool, st.dev, &self.ssm_x, &sc.x, n, &mut sc.xdb, &mut b.mm_scratch, &mut b.lora)?;
        }
        for (row, d) in sc.xdb[..n * nx].chunks_exact_mut(nx).zip(sc.dtr.chunks_exact_mut(dtr)) {
            if dt_b_c_rms {
                let (dtp, bc) = row.split_at_mut(dtr);
                let (bm, cm) = bc.split_at_mut(ds);
                rms_norm_row(dtp, None, eps);
                rms_norm_row(bm, None, eps);
                rms_norm_row(cm, None, eps);
            }
            d.copy_from_slice(&row[..dtr]);
        }
        {
            let b = &mut *st.b;
            Step::mm(st.pool, st.dev, &self.ssm_dt, &sc.dtr, n, &mut sc.dt, &mut b.mm_scratch, &mut b.lora)?;
        }
        for row in sc.dt[..n * di].chunks_exact_mut(di) {
            for (v, b) in row.iter_mut().zip(&self.dt_b) {
                *v += b;
            }
        }
        for k in 0..n_seqs {
            let cell = head + k;
            let s = &mut rs.s[il][cell * ns..(cell + 1) * ns];
            for t in 0..nt {
                let row = k * nt + t;
                let x = &sc.x[row * di..(row + 1) * di];
                let bc = &sc.xdb[row * nx + dtr..(row + 1) * nx];
                let (bm, cm) = bc.split_at(ds);
                let y = &mut sc.y[row * di..(row + 1) * di];
                ssm::scan_token_mamba1(s, x, &sc.dt[row * di..(row + 1) * di], &self.a, bm, cm, y, ds);
                // y + x * D, then y * silu(z) (ggml_swiglu_split(z, y))
                for j in 0..di {
                    y[j] += x[j] * self.d[j];
                }
                let mut g = sc.xz[row * 2 * di + di..(row + 1) * 2 * di].to_vec();
                act::swiglu(&mut g, y);
                y.copy_from_slice(&g);
            }
        }
        let b = &mut *st.b;
        Step::mm(st.pool, st.dev, &self.out, &sc.y, n, &mut b.tmp, &mut b.mm_scratch, &mut b.lora)?;
        crate::cb!(st, "mamba_out", il, tmp, st.hp.n_embd);
        Ok(())
    }
}
