//! Falcon-H1 (llama.cpp's src/models/falcon-h1.cpp): every layer runs attention and a
//! Mamba-2 mixer side by side on the same RMS-normed input and adds both to the residual,
//! then a SwiGLU feed-forward (optional biases). So every layer has both a KV cache and a
//! recurrent state (llama.cpp's hybrid memory with all layers in both). Attention: q/k/v
//! (optional biases), NEOX rope (optional `rope_freqs`), scale 1/sqrt(head size), output
//! projection (optional bias). The checkpoint's multipliers are folded into the weights
//! by the converter. The FFN norm is the tensor llama.cpp names `blk.N.ffn_norm` (no
//! `.weight` suffix).

use super::graph::{default_kq_scale, layer_rope, AttnConfig, AttnLayer, FfnAct, FfnGate, FfnLayer, Norm};
use super::loader::{Keep, Loader};
use super::mamba2::{mamba2_mixer, SsmLayer, SsmParams, SsmScratch};
use super::{common_hparams, Arch};
use crate::context::{ContextParams, Forward, Step};
use crate::error::Result;
use crate::hparams::{HParams, Meta, RopeType};
use crate::model::TensorView;
use crate::ops::rope::RopeParams;
use std::sync::Mutex;

pub struct FalconH1;

impl Arch for FalconH1 {
    fn name(&self) -> &'static str {
        "falcon-h1"
    }

    fn hparams(&self, meta: &Meta, n_vocab: usize) -> Result<HParams> {
        SsmParams::read(meta, true)?;
        common_hparams(meta, n_vocab, RopeType::Neox)
    }

    fn type_name(&self, hp: &HParams) -> &'static str {
        match hp.n_layer {
            36 => "0.5B",
            24 => "1.5B",
            66 => "1B",
            32 => "3B",
            44 => "7B",
            72 => "34B",
            _ => "?B",
        }
    }

    fn build_forward(&self, ld: &Loader, cp: &ContextParams) -> Result<Box<dyn Forward>> {
        let hp = ld.hp();
        let meta = Meta { file: &ld.model().files[0], arch: self.name() };
        let sp = SsmParams::read(&meta, true)?;
        let (ne, nv) = (hp.n_embd, hp.n_vocab);
        let tok_embd = ld.req("token_embd.weight", &[ne, nv])?;
        let output = ld.opt("output.weight", &[ne, nv])?.unwrap_or(tok_embd);
        let factors = ld.opt_vec("rope_freqs.weight", &[hp.n_rot / 2])?;
        let mut layers = Vec::with_capacity(hp.n_layer);
        for il in 0..hp.n_layer {
            layers.push(Layer {
                ssm: SsmLayer::load(ld, il, &sp, false)?,
                attn: AttnLayer::load(ld, il)?,
                ffn_norm: ld.req_vec(&format!("blk.{il}.ffn_norm"), &[ne])?,
                ffn: FfnLayer::load(ld, il, hp.n_ff[il])?,
                rope: layer_rope(hp, cp, il, factors.clone()),
            });
        }
        Ok(Box::new(FalconH1Fwd {
            tok_embd,
            output_norm: ld.req_vec("output_norm.weight", &[ne])?,
            output,
            layers,
            sp,
            eps: hp.f_norm_rms_eps,
            attn_out: Mutex::new((Vec::new(), SsmScratch::default())),
            _keep: ld.keep(),
        }))
    }
}

struct Layer {
    ssm: SsmLayer,
    attn: AttnLayer,
    ffn_norm: Vec<f32>,
    ffn: FfnLayer,
    rope: RopeParams,
}

struct FalconH1Fwd {
    tok_embd: TensorView<'static>,
    output_norm: Vec<f32>,
    output: TensorView<'static>,
    layers: Vec<Layer>,
    sp: SsmParams,
    eps: f32,
    /// The attention output of the current layer, and the mixer's scratch.
    attn_out: Mutex<(Vec<f32>, SsmScratch)>,
    _keep: Keep,
}

impl Forward for FalconH1Fwd {
    fn rope(&self, il: usize) -> Option<&RopeParams> {
        self.layers.get(il).map(|l| &l.rope)
    }

    fn recurrent(&self) -> Option<(Vec<bool>, usize, usize)> {
        Some((vec![true; self.layers.len()], self.sp.n_embd_r(), self.sp.n_embd_s()))
    }

    fn kv_layers(&self) -> Option<Vec<bool>> {
        Some(vec![true; self.layers.len()])
    }

    fn forward(&self, st: &mut Step) -> Result<()> {
        let ne = st.hp.n_embd;
        let mut guard = self.attn_out.lock().unwrap_or_else(|e| e.into_inner());
        let (attn_out, sc) = &mut *guard;
        st.build_inp_embd(&self.tok_embd, 1.0)?;
        let nl = self.layers.len();
        for (il, l) in self.layers.iter().enumerate() {
            st.build_norm(&l.ssm.attn_norm, None, Norm::Rms, self.eps);
            crate::cb!(st, "attn_norm", il, cur, ne);
            let a = AttnConfig::new(il, Some(&l.rope), default_kq_scale(st.hp));
            st.build_attn(&l.attn.weights(), &a)?;
            let n = st.n;
            attn_out.resize(n * ne, 0.0);
            attn_out.copy_from_slice(&st.b.tmp[..n * ne]);
            // the mixer reads the same normed input (build_attn leaves `cur` as it was)
            mamba2_mixer(st, il, &l.ssm, &self.sp, self.eps, sc)?;
            for (o, a) in st.b.tmp[..n * ne].iter_mut().zip(attn_out.iter()) {
                *o += a;
            }
            if il == nl - 1 && !st.select_outputs() {
                return Ok(());
            }
            st.residual();
            st.build_norm(&l.ffn_norm, None, Norm::Rms, self.eps);
            st.build_ffn(il, &l.ffn.weights(), FfnAct::Silu, FfnGate::Par)?;
            st.residual();
            st.build_cvec(il);
            crate::cb!(st, "l_out", il, x, ne);
        }
        st.build_norm(&self.output_norm, None, Norm::Rms, self.eps);
        st.build_output(&self.output, None, 0.0)
    }
}
