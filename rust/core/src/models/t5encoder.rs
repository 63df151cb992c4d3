//! T5 encoder (`t5encoder`: T5 / flan-T5 / sentence-T5 encoders without their decoder):
//! pre-norm RMSNorm layers, attention without a 1/sqrt(d) scale and with T5's learned
//! relative-position bias (bidirectional buckets, `attn_rel_b` of layer 0 when a layer has
//! none), feed-forward ReLU (T5) or GELU-gated (flan-T5, when `ffn_gate` is there), no
//! biases; the encoder's final RMSNorm gives the embeddings. llama.cpp's
//! src/models/t5encoder.cpp with the encoder graph of src/models/t5.cpp. Its vocabulary is
//! SentencePiece's UGM (python/pyllama/vocab/ugm.py).

use super::encoder::{EncAttn, RelBias};
use super::graph::{AttnWeights, FfnAct, FfnGate, FfnWeights, Norm};
use super::loader::{Keep, Loader};
use super::{common_hparams, Arch};
use crate::context::{ContextParams, Forward, Step};
use crate::error::{Error, Result};
use crate::hparams::{HParams, Meta, RopeType};
use crate::model::TensorView;
use crate::ops::rope::RopeParams;

pub struct T5Encoder;

impl Arch for T5Encoder {
    fn name(&self) -> &'static str {
        "t5encoder"
    }
    fn hparams(&self, meta: &Meta, n_vocab: usize) -> Result<HParams> {
        let mut hp = common_hparams(meta, n_vocab, RopeType::None)?;
        hp.causal_attn = false;
        if hp.f_norm_rms_eps <= 0.0 {
            return Err(Error::Unsupported(format!(
                "{}: t5encoder needs '{}'",
                meta.file.path,
                meta.key("attention.layer_norm_rms_epsilon")
            )));
        }
        Ok(hp)
    }
    fn build_forward(&self, ld: &Loader, _cp: &ContextParams) -> Result<Box<dyn Forward>> {
        Ok(Box::new(T5EncoderForward::load(ld)?))
    }
}

struct Layer {
    attn_norm: Vec<f32>,
    rel_b: Option<Vec<f32>>,
    wq: TensorView<'static>,
    wk: TensorView<'static>,
    wv: TensorView<'static>,
    wo: TensorView<'static>,
    ffn_norm: Vec<f32>,
    gate: Option<TensorView<'static>>,
    up: TensorView<'static>,
    down: TensorView<'static>,
}

struct T5EncoderForward {
    tok_embd: TensorView<'static>,
    output_norm: Vec<f32>,
    layers: Vec<Layer>,
    n_buckets: usize,
    eps: f32,
    _keep: Keep,
}

impl T5EncoderForward {
    fn load(ld: &Loader) -> Result<T5EncoderForward> {
        let hp = ld.hp();
        let meta_buckets = ld
            .model()
            .files[0]
            .get("t5encoder.attention.relative_buckets_count")
            .and_then(|v| v.as_i64())
            .filter(|&x| (2..=4096).contains(&x))
            .ok_or_else(|| {
                Error::Unsupported("t5encoder needs 't5encoder.attention.relative_buckets_count' (2..4096)".into())
            })? as usize;
        let (ne, nv) = (hp.n_embd, hp.n_vocab);
        let mut layers = Vec::with_capacity(hp.n_layer);
        for il in 0..hp.n_layer {
            let b = |s: &str| format!("enc.blk.{il}.{s}");
            let (nq, nk, nvv) = (hp.n_embd_head_k * hp.n_head(il), hp.n_embd_k_gqa(il), hp.n_embd_v_gqa(il));
            let n_ff = hp.n_ff[il];
            let rel_b = ld.opt_vec(&b("attn_rel_b.weight"), &[hp.n_head(il), meta_buckets])?;
            if il == 0 && rel_b.is_none() {
                return Err(Error::Unsupported("t5encoder: missing tensor 'enc.blk.0.attn_rel_b.weight'".into()));
            }
            layers.push(Layer {
                attn_norm: ld.req_vec(&b("attn_norm.weight"), &[ne])?,
                rel_b,
                wq: ld.req(&b("attn_q.weight"), &[ne, nq])?,
                wk: ld.req(&b("attn_k.weight"), &[ne, nk])?,
                wv: ld.req(&b("attn_v.weight"), &[ne, nvv])?,
                wo: ld.req(&b("attn_o.weight"), &[nvv, ne])?,
                ffn_norm: ld.req_vec(&b("ffn_norm.weight"), &[ne])?,
                gate: ld.opt(&b("ffn_gate.weight"), &[ne, n_ff])?,
                up: ld.req(&b("ffn_up.weight"), &[ne, n_ff])?,
                down: ld.req(&b("ffn_down.weight"), &[n_ff, ne])?,
            });
        }
        Ok(T5EncoderForward {
            tok_embd: ld.req("token_embd.weight", &[ne, nv])?,
            output_norm: ld.req_vec("enc.output_norm.weight", &[ne])?,
            layers,
            n_buckets: meta_buckets,
            eps: hp.f_norm_rms_eps,
            _keep: ld.keep(),
        })
    }
}

impl Forward for T5EncoderForward {
    fn rope(&self, _il: usize) -> Option<&RopeParams> {
        None
    }
    fn encoder(&self) -> bool {
        true
    }
    fn forward(&self, st: &mut Step) -> Result<()> {
        let ne = st.hp.n_embd;
        st.build_inp_embd(&self.tok_embd, 1.0)?;
        let rel0 = self.layers[0].rel_b.as_deref().unwrap_or(&[]);
        for (il, l) in self.layers.iter().enumerate() {
            st.build_norm(&l.attn_norm, None, Norm::Rms, self.eps);
            let w = AttnWeights {
                wq: &l.wq,
                wk: &l.wk,
                wv: &l.wv,
                wo: &l.wo,
                bq: None,
                bk: None,
                bv: None,
                bo: None,
                q_norm: None,
                k_norm: None,
                fused_qkv: false,
            };
            let a = EncAttn {
                il,
                rope: None,
                qk_norm: None,
                kq_scale: 1.0,
                max_alibi_bias: 0.0,
                n_swa: 0,
                rel_bias: Some(RelBias { rel: l.rel_b.as_deref().unwrap_or(rel0), n_buckets: self.n_buckets }),
            };
            st.build_attn_enc(&w, &a)?;
            st.residual();
            st.build_norm(&l.ffn_norm, None, Norm::Rms, self.eps);
            let f = FfnWeights { gate: l.gate.as_ref(), gate_b: None, up: &l.up, up_b: None, down: &l.down, down_b: None };
            if l.gate.is_some() {
                st.build_ffn(il, &f, FfnAct::Gelu, FfnGate::Par)?;
            } else {
                st.build_ffn(il, &f, FfnAct::Relu, FfnGate::None)?;
            }
            st.residual();
            st.build_cvec(il);
            crate::cb!(st, "l_out", il, x, ne);
        }
        st.norm_x(&self.output_norm, None, Norm::Rms, self.eps);
        st.write_hidden();
        Ok(())
    }
}
