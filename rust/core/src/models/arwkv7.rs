//! ARWKV-7 (llama.cpp's src/models/arwkv7.cpp): RWKV-7's time mix (rwkv7.rs's, with the
//! gate LoRA and the GroupNorm optional) in a Qwen2-style decoder: raw embeddings, per layer
//! RMSNorm, the time mix (one token shift: the previous normed row), the residual, RMSNorm,
//! a SwiGLU feed-forward, the residual; RMSNorm and the output projection.

use super::graph::{FfnAct, FfnGate, FfnLayer, Norm};
use super::loader::{Keep, Loader};
use super::rwkv6::{prev_rows, store_shift, Scratch};
use super::rwkv7::{Params, TimeMix};
use super::{recurrent_hparams, Arch};
use crate::context::{ContextParams, Forward, Step};
use crate::error::Result;
use crate::hparams::{HParams, Meta};
use crate::model::TensorView;
use crate::ops::rope::RopeParams;
use std::sync::Mutex;

pub struct Arwkv7;

impl Arch for Arwkv7 {
    fn name(&self) -> &'static str {
        "arwkv7"
    }

    fn hparams(&self, meta: &Meta, n_vocab: usize) -> Result<HParams> {
        recurrent_hparams(meta, n_vocab, |m, ne| Params::read(m, ne, 1, false).map(|_| ()))
    }

    fn type_name(&self, hp: &HParams) -> &'static str {
        super::rwkv7::Rwkv7.type_name(hp)
    }

    fn build_forward(&self, ld: &Loader, _cp: &ContextParams) -> Result<Box<dyn Forward>> {
        let hp = ld.hp();
        let meta = Meta { file: &ld.model().files[0], arch: self.name() };
        let p = Params::read(&meta, hp.n_embd, 1, false)?;
        let (ne, nv) = (hp.n_embd, hp.n_vocab);
        let mut layers = Vec::with_capacity(hp.n_layer);
        for il in 0..hp.n_layer {
            let b = |s: &str| format!("blk.{il}.{s}");
            layers.push(Layer {
                attn_norm: ld.req_vec(&b("attn_norm.weight"), &[ne])?,
                tm: TimeMix::load(ld, il, &p, false)?,
                ffn_norm: ld.req_vec(&b("ffn_norm.weight"), &[ne])?,
                ffn: FfnLayer::load(ld, il, hp.n_ff[il])?,
            });
        }
        Ok(Box::new(Arwkv7Fwd {
            tok_embd: ld.req("token_embd.weight", &[ne, nv])?,
            output_norm: ld.req_vec("output_norm.weight", &[ne])?,
            output: ld.req("output.weight", &[ne, nv])?,
            layers,
            head_size: p.head_size,
            eps: hp.f_norm_rms_eps,
            scratch: Mutex::new(Scratch::default()),
            _keep: ld.keep(),
        }))
    }
}

struct Layer {
    attn_norm: Vec<f32>,
    tm: TimeMix,
    ffn_norm: Vec<f32>,
    ffn: FfnLayer,
}

struct Arwkv7Fwd {
    tok_embd: TensorView<'static>,
    output_norm: Vec<f32>,
    output: TensorView<'static>,
    layers: Vec<Layer>,
    head_size: usize,
    eps: f32,
    scratch: Mutex<Scratch>,
    _keep: Keep,
}

impl Forward for Arwkv7Fwd {
    fn rope(&self, _il: usize) -> Option<&RopeParams> {
        None
    }

    fn recurrent(&self) -> Option<(Vec<bool>, usize, usize)> {
        let ne = self.output_norm.len();
        Some((vec![true; self.layers.len()], ne, ne * self.head_size))
    }

    fn forward(&self, st: &mut Step) -> Result<()> {
        let ne = st.hp.n_embd;
        let mut guard = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
        let sc = &mut *guard;
        st.build_inp_embd(&self.tok_embd, 1.0)?;
        let nl = self.layers.len();
        for (il, l) in self.layers.iter().enumerate() {
            let m = st.n * ne;
            sc.xprev.resize(m, 0.0);
            st.build_norm(&l.attn_norm, None, Norm::Rms, self.eps);
            crate::cb!(st, "attn_norm", il, cur, ne);
            prev_rows(st, il, &st.b.cur, 0, &mut sc.xprev)?;
            l.tm.run(st, il, sc)?;
            let cur = std::mem::take(&mut st.b.cur);
            let r = store_shift(st, il, &cur, 0);
            st.b.cur = cur;
            r?;
            if il == nl - 1 && !st.select_outputs() {
                return Ok(());
            }
            st.residual();
            crate::cb!(st, "ffn_inp", il, x, ne);
            st.build_norm(&l.ffn_norm, None, Norm::Rms, self.eps);
            crate::cb!(st, "ffn_norm", il, cur, ne);
            st.build_ffn(il, &l.ffn.weights(), FfnAct::Silu, FfnGate::Par)?;
            st.residual();
            st.build_cvec(il);
            crate::cb!(st, "l_out", il, x, ne);
        }
        st.build_norm(&self.output_norm, None, Norm::Rms, self.eps);
        st.build_output(&self.output, None, 0.0)
    }
}
