//! ARWKV-7 (llama.cpp's src/models/arwkv7.cpp): RWKV-7's time mix (rwkv7.rs's, with the
//! gate LoRA and the GroupNorm optional) in a Qwen2-style decoder: raw embeddings, per layer
//! RMSNorm, the time mix (one token shift: the previous normed row), the residual, RMSNorm,
//! a SwiGLU feed-forward, the residual; RMSNorm and the output projection.
//! RWKV6-Qwen2 ("QRWKV6", src/models/rwkv6qwen2.cpp) is the same decoder around RWKV-6's
//! time mix in its QRWKV form (rwkv6.rs's `TimeMix6`: sigmoid gate, k * (1 - w), ggml's
//! gated linear attention, no GroupNorm, key / value heads shared GQA-style).

use super::graph::{FfnAct, FfnGate, FfnLayer, Norm};
use super::loader::{Keep, Loader};
use super::rwkv6::{check_rwkv, prev_rows, store_shift, Scratch, TimeMix6};
use super::rwkv7::{Params, TimeMix};
use super::{read_sizes, recurrent_hparams, Arch};
use crate::context::{ContextParams, Forward, Step};
use crate::error::{Error, Result};
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
        let mut layers = Vec::with_capacity(hp.n_layer);
        for il in 0..hp.n_layer {
            layers.push(Layer::load(ld, il, TimeMix::load(ld, il, &p, false)?)?);
        }
        QwenRwkvFwd::build(ld, layers, p.head_size, None)
    }
}

pub struct Rwkv6Qwen2;

/// rwkv6qwen2's sizes: head size, the two LoRA ranks, and the key / value heads
/// (`attention.head_count_kv`; 0 or n_embd / head_size: one per head).
fn qwen2_sizes(meta: &Meta, n_embd: usize) -> Result<[usize; 4]> {
    let [hs, e, d] = read_sizes(meta, [("wkv.head_size", None), ("time_mix_extra_dim", None), ("time_decay_extra_dim", None)])?;
    // llama.cpp asserts n_embd_r == n_embd: one token shift
    check_rwkv(meta, n_embd, hs, 1, 1)?;
    let n_head = n_embd / hs;
    let n_kv = match meta.u("attention.head_count_kv")? {
        None | Some(0) => n_head,
        Some(k) => k,
    };
    if n_head % n_kv != 0 {
        return Err(Error::Unsupported(format!(
            "{}: attention.head_count_kv {n_kv} must divide the {n_head} WKV heads (embedding_length / wkv.head_size)",
            meta.file.path
        )));
    }
    Ok([hs, e, d, n_kv])
}

impl Arch for Rwkv6Qwen2 {
    fn name(&self) -> &'static str {
        "rwkv6qwen2"
    }

    fn hparams(&self, meta: &Meta, n_vocab: usize) -> Result<HParams> {
        let mut hp = recurrent_hparams(meta, n_vocab, |m, ne| qwen2_sizes(m, ne).map(|_| ()))?;
        // head_count 0 (the converter's "required by llama.cpp, unused"); the key / value
        // heads are the time mix's, not attention's
        hp.n_head_kv.iter_mut().for_each(|k| *k = 0);
        Ok(hp)
    }

    fn type_name(&self, hp: &HParams) -> &'static str {
        super::rwkv6::Rwkv6.type_name(hp)
    }

    fn build_forward(&self, ld: &Loader, _cp: &ContextParams) -> Result<Box<dyn Forward>> {
        let hp = ld.hp();
        let meta = Meta { file: &ld.model().files[0], arch: self.name() };
        let [hs, e, d, n_kv] = qwen2_sizes(&meta, hp.n_embd)?;
        let mut layers = Vec::with_capacity(hp.n_layer);
        for il in 0..hp.n_layer {
            layers.push(Layer::load(ld, il, TimeMix6::load(ld, il, hs, e, d, n_kv, true)?)?);
        }
        let ne = hp.n_embd;
        QwenRwkvFwd::build(ld, layers, hs, ld.opt_vec("output_norm.bias", &[ne])?)
    }
}

/// A time mix of the Qwen2-style RWKV decoders: in `cur` [n, n_embd] (normed) and
/// sc.xprev, out `tmp`, its recurrent state in the memory's `s` rows of layer `il`.
pub(crate) trait QwenTimeMix: Send + Sync {
    fn run(&self, st: &mut Step, il: usize, sc: &mut Scratch) -> Result<()>;
}

impl QwenTimeMix for TimeMix {
    fn run(&self, st: &mut Step, il: usize, sc: &mut Scratch) -> Result<()> {
        TimeMix::run(self, st, il, sc)
    }
}

impl QwenTimeMix for TimeMix6 {
    fn run(&self, st: &mut Step, il: usize, sc: &mut Scratch) -> Result<()> {
        TimeMix6::run(self, st, il, sc)
    }
}

struct Layer<T> {
    attn_norm: Vec<f32>,
    tm: T,
    ffn_norm: Vec<f32>,
    ffn: FfnLayer,
}

impl<T> Layer<T> {
    fn load(ld: &Loader, il: usize, tm: T) -> Result<Layer<T>> {
        let ne = ld.hp().n_embd;
        Ok(Layer {
            attn_norm: ld.req_vec(&format!("blk.{il}.attn_norm.weight"), &[ne])?,
            tm,
            ffn_norm: ld.req_vec(&format!("blk.{il}.ffn_norm.weight"), &[ne])?,
            ffn: FfnLayer::load(ld, il, ld.hp().n_ff[il])?,
        })
    }
}

struct QwenRwkvFwd<T> {
    tok_embd: TensorView<'static>,
    output_norm: Vec<f32>,
    output_norm_b: Option<Vec<f32>>,
    output: TensorView<'static>,
    layers: Vec<Layer<T>>,
    head_size: usize,
    eps: f32,
    scratch: Mutex<Scratch>,
    _keep: Keep,
}

impl<T: QwenTimeMix + 'static> QwenRwkvFwd<T> {
    fn build(ld: &Loader, layers: Vec<Layer<T>>, head_size: usize, output_norm_b: Option<Vec<f32>>) -> Result<Box<dyn Forward>> {
        let hp = ld.hp();
        let (ne, nv) = (hp.n_embd, hp.n_vocab);
        Ok(Box::new(QwenRwkvFwd {
            tok_embd: ld.req("token_embd.weight", &[ne, nv])?,
            output_norm: ld.req_vec("output_norm.weight", &[ne])?,
            output_norm_b,
            output: ld.req("output.weight", &[ne, nv])?,
            layers,
            head_size,
            eps: hp.f_norm_rms_eps,
            scratch: Mutex::new(Scratch::default()),
            _keep: ld.keep(),
        }))
    }
}

impl<T: QwenTimeMix> Forward for QwenRwkvFwd<T> {
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
        st.build_norm(&self.output_norm, self.output_norm_b.as_deref(), Norm::Rms, self.eps);
        st.build_output(&self.output, None, 0.0)
    }
}
