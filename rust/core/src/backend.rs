//! The backend seam: where the forward pass runs (DESIGN: "model files never name a backend").
//!
//! The CPU backend is the kernel table (`quant::table`) the forward pass calls by default. A
//! model may also hold a `Backend` (the GPU offload of `n_gpu_layers`, `crate::gpu`), which
//! the forward pass reaches through two doors only:
//! - `matmul_rows`: any product whose weight the backend holds (`ops::matmul::matmul_on`
//!   asks it first, then runs the CPU kernels);
//! - `decoder_first` / `decoder_run`: the shared pre-norm decoder (models/decoder.rs)
//!   describes its top layers in the neutral form below (`DecoderLayer`: the weights, norm
//!   vectors, rope and attention parameters, nothing backend-specific) and asks the backend
//!   how many of them it can run end to end, then has it run them; the residual stream
//!   stays on the device between those layers.
//!
//! A new backend is one more implementation of this trait; the decoder and the other model
//! files do not change.

use crate::context::Step;
use crate::error::Result;
use crate::model::TensorView;
use crate::ops::attention::AttnParams;
use crate::ops::rope::RopeParams;
use std::any::Any;
use std::ops::Range;
use std::sync::OnceLock;

/// A device that runs some of a model's work: the products of the weights it holds, and
/// optionally whole decoder layers.
pub trait Backend: Send + Sync {
    /// `ops::matmul::try_matmul_rows` on the device: Ok(false) when `w` is not on it
    /// (nothing written).
    #[allow(clippy::too_many_arguments)]
    fn matmul_rows(
        &self,
        w: &TensorView,
        x: &[f32],
        n_tokens: usize,
        out: &mut [f32],
        ld_out: usize,
        rows: Range<usize>,
    ) -> Result<bool>;

    /// One line: the device(s) and what they hold.
    fn describe(&self) -> String;

    /// The first of `stack.layers` from which the backend runs every layer to the top
    /// (`stack.n_layer`: none), given what it holds.
    fn decoder_first(&self, stack: &DecoderStack) -> usize {
        stack.n_layer
    }

    /// Run layers `first..stack.n_layer` (as `decoder_first` answered) on the device: `st.b.x`
    /// [n, n_embd] in, `st.b.x` after the last layer out, compacted to the output rows
    /// (`Step::select_outputs`); this micro-batch's K/V rows land in the host cache as the
    /// CPU path stores them. Returns false when no row wants output.
    fn decoder_run(&self, _st: &mut Step, _stack: &DecoderStack, _first: usize) -> Result<bool> {
        Err(crate::error::Error::Invalid("internal: this backend runs no decoder layers".into()))
    }
}

/// A decoder layer as a backend sees it. Matrices are the host tensors (a backend finds its
/// device copy by the tensor's bytes); vectors are the decoder's f32 copies.
pub struct DecoderLayer<'a> {
    pub attn_norm: &'a [f32],
    pub attn_norm_b: Option<&'a [f32]>,
    /// q, k and v projections; with `fused_qkv` one matrix [q; k; v] (the three are equal).
    pub wq: &'a TensorView<'a>,
    pub wk: &'a TensorView<'a>,
    pub wv: &'a TensorView<'a>,
    pub fused_qkv: bool,
    pub bq: Option<&'a [f32]>,
    pub bk: Option<&'a [f32]>,
    pub bv: Option<&'a [f32]>,
    /// Per-head (or full-width) RMS norms of q and k, with `eps_qk`.
    pub q_norm: Option<&'a [f32]>,
    pub k_norm: Option<&'a [f32]>,
    /// None on NoPE layers.
    pub rope: Option<&'a RopeParams>,
    /// RMS norm of each q and k head (no weight) after rope.
    pub qk_rms_after_rope: bool,
    /// The attention (sinks are never set: a layer with sinks is not described).
    pub attn: AttnParams<'a>,
    pub wo: &'a TensorView<'a>,
    pub bo: Option<&'a [f32]>,
    pub post_attn_norm: Option<&'a [f32]>,
    pub ffn_norm: &'a [f32],
    pub ffn_norm_b: Option<&'a [f32]>,
    /// Dense gated feed-forward: act(gate x + bg) * (up x + bu), down; without `gate`, `up`
    /// holds gate and up (2 * n_ff rows, gate first).
    pub gate: Option<&'a TensorView<'a>>,
    pub up: &'a TensorView<'a>,
    pub down: &'a TensorView<'a>,
    pub gate_b: Option<&'a [f32]>,
    pub up_b: Option<&'a [f32]>,
    pub down_b: Option<&'a [f32]>,
    pub post_ffw_norm: Option<&'a [f32]>,
}

/// The top layers of a decoder, from `layers[0]` = layer `n_layer - layers.len()` to the
/// last, with what they share.
pub struct DecoderStack<'a> {
    pub n_layer: usize,
    pub layers: Vec<DecoderLayer<'a>>,
    /// RMS norm epsilon of the block norms, and of the q/k norms.
    pub eps: f32,
    pub eps_qk: f32,
    /// q *= q_scale after rope (1.0: none).
    pub q_scale: f32,
    /// Each block's output *= residual_scale before the residual add (1.0: none).
    pub residual_scale: f32,
    /// GELU (tanh) instead of SiLU in the gated feed-forward.
    pub gelu: bool,
    /// What the backend keeps per decoder (device copies of the vectors above, keyed by
    /// their addresses): owned by the decoder, so it lives exactly as long as they do.
    pub cache: &'a BackendCache,
}

impl DecoderStack<'_> {
    /// Layer `il` (>= `n_layer - layers.len()`).
    pub fn layer(&self, il: usize) -> &DecoderLayer<'_> {
        &self.layers[il + self.layers.len() - self.n_layer]
    }
}

/// A slot a backend fills once with whatever it keeps for one decoder (see
/// `DecoderStack::cache`); the decoder only owns it.
#[derive(Default)]
pub struct BackendCache(OnceLock<Box<dyn Any + Send + Sync>>);

impl BackendCache {
    /// The backend's value, made by `init` on first use; None when another type is there.
    pub fn get_or_init<T: Any + Send + Sync>(&self, init: impl FnOnce() -> T) -> Option<&T> {
        self.0.get_or_init(|| Box::new(init())).downcast_ref()
    }
}
