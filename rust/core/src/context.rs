//! A context (pipeline steps 7 and 11-13): the model, the KV cache, every scratch buffer
//! (reserved at creation for the worst case of `n_ubatch` tokens, so decode allocates
//! nothing once warm), the thread pools, and `decode`, which reserves KV cells for all
//! micro-batches first (all or nothing, as llama.cpp's `prepare`) and then runs one
//! forward pass per micro-batch.
//!
//! The forward passes live in models/<arch>.rs, built from the graph builders of
//! models/graph.rs (`Step::build_norm`, `build_attn`, `build_ffn`, `build_output`, ...),
//! which run on the scratch buffers of a `Step` here and name their intermediates as
//! llama.cpp does (`attn_norm-0`, `Qcur-0`, `kqv_out-0`, `ffn_out-0`, `l_out-0`,
//! `result_norm`, `result_output`) for the debug dump.

use crate::adapter::{Cvec, LoraSet};
use crate::error::{alloc, Error, Result};
use crate::ggml_type::GgmlType;
use crate::hparams::HParams;
use crate::kv_cache::{KvCache, SeqSet, Slot, MAX_SEQ};
use crate::model::Model;
use crate::ops::attention;
use crate::ops::rope::RopeParams;
use crate::quant;
use crate::recurrent::{RsCache, RsSeq};
use crate::state;
use crate::threadpool::ThreadPool;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

#[derive(Clone, Debug)]
pub struct ContextParams {
    pub n_ctx: usize,
    pub n_seq_max: usize,
    /// Recurrent-state rollback snapshots per sequence (llama.cpp's `n_rs_seq`); 0 for the
    /// models without them (`Forward::rs_rollback`: the context clamps the request).
    pub n_rs_seq: usize,
    pub n_ubatch: usize,
    pub n_threads: usize,
    pub n_threads_batch: usize,
    pub type_k: GgmlType,
    pub type_v: GgmlType,
    pub kv_unified: bool,
    pub swa_full: bool,
    pub embeddings: bool,
    /// 0 = the model's.
    pub rope_freq_base: f32,
    pub rope_freq_scale: f32,
}

/// One architecture's forward pass, built once per context from the model's tensors.
pub trait Forward: Send + Sync {
    /// The rope of layer `il` (the K-shift re-rotates cached keys with it).
    fn rope(&self, il: usize) -> Option<&RopeParams>;
    /// Run one micro-batch (inputs and outputs in `st`).
    fn forward(&self, st: &mut Step) -> Result<()>;
    /// An encoder (BERT family): no KV cache, attention among the batch's own tokens
    /// (models/encoder.rs), the whole batch in one micro-batch, hidden states out.
    fn encoder(&self) -> bool {
        false
    }
    /// The reranker's classifier head over pooled vectors x [n, n_embd]: (scores
    /// [n, width], width). Models without one refuse.
    fn classify(&self, _pool: &ThreadPool, _x: &[f32], _n: usize) -> Result<(Vec<f32>, usize)> {
        Err(Error::Invalid("this model has no classifier head (cls.weight / cls.output.weight): rank pooling needs one".into()))
    }
    /// The sentence-transformers dense projections applied after pooling (llama.cpp's
    /// `build_dense_out`: EmbeddingGemma's `dense_2` / `dense_3`) to vectors x [n, n_embd]:
    /// the projected [n, n_embd], or None when the model has none.
    fn dense_out(&self, _pool: &ThreadPool, _x: &[f32], _n: usize) -> Result<Option<Vec<f32>>> {
        Ok(None)
    }
    /// Recurrent and hybrid models: which layers keep a recurrent state, and the widths of
    /// that state (n_embd_r, n_embd_s floats per sequence; recurrent.rs). None: attention only.
    fn recurrent(&self) -> Option<(Vec<bool>, usize, usize)> {
        None
    }
    /// Whether the forward pass writes rollback snapshots of its recurrent states (llama.cpp's
    /// `llm_arch_supports_rs_rollback`): n_rs_seq > 0 is kept, else clamped to 0.
    fn rs_rollback(&self) -> bool {
        false
    }
    /// The layers with a KV cache when it is not "every non-recurrent layer" (Falcon-H1:
    /// attention and a Mamba-2 mixer side by side in every layer).
    fn kv_layers(&self) -> Option<Vec<bool>> {
        None
    }
    /// Whether cached keys can be re-roped to new positions (llama.cpp's get_can_shift:
    /// false with several positions per token, M-RoPE).
    fn can_shift(&self) -> bool {
        true
    }
}

/// What a context's memory is (llama.cpp's llama_kv_cache, llama_memory_recurrent,
/// llama_memory_hybrid).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemKind {
    Kv,
    Recurrent,
    Hybrid,
}

impl MemKind {
    pub fn name(&self) -> &'static str {
        match self {
            MemKind::Kv => "kv",
            MemKind::Recurrent => "recurrent",
            MemKind::Hybrid => "hybrid",
        }
    }
}

/// `n` zero floats from the allocator's zeroed path (calloc: large blocks come from fresh
/// zero pages), or None when the allocation fails. The per-token scratch is sized for
/// n_ubatch rows, but token generation writes only the first: written through `resize`,
/// every page would be resident from the start (~13 MB for SmolLM2, ~18 MB for Gemma 3 at
/// n_ubatch 512); this way a page costs memory only once a batch that large touches it,
/// as with llama.cpp's compute buffer.
fn zeroed_f32(n: usize) -> Option<Vec<f32>> {
    if n == 0 {
        return Some(Vec::new());
    }
    let layout = std::alloc::Layout::array::<f32>(n).ok()?;
    // SAFETY: layout has non-zero size; the block is n zeroed f32 (a valid value for all
    // bits zero), allocated by the global allocator with exactly the layout Vec<f32> of
    // capacity n frees it with.
    unsafe {
        let p = std::alloc::alloc_zeroed(layout) as *mut f32;
        if p.is_null() {
            return None;
        }
        Some(Vec::from_raw_parts(p, n, n))
    }
}

/// One rope table of `Buffers::rope_tabs`: what it was filled for, and the table.
pub struct RopeTab {
    pub params: crate::ops::rope::RopeParams,
    pub head_k: usize,
    pub pos: Vec<i32>,
    pub tab: Vec<f32>,
}

/// Most rope tables kept per context (distinct variants in one model: 2 so far).
pub const ROPE_TABS: usize = 4;

/// Scratch sized for `n_ubatch` tokens.
pub struct Buffers {
    /// Residual stream [n, n_embd].
    pub x: Vec<f32>,
    /// Normed input of a block [n, max(n_embd, n_q)].
    pub cur: Vec<f32>,
    /// Output of a block [n, n_embd].
    pub tmp: Vec<f32>,
    /// q [n, n_q] and k [n, n_kv]: empty except inside `build_attn` (models/graph.rs), which lends them
    /// `gate`'s and `up`'s memory.
    pub q: Vec<f32>,
    pub k: Vec<f32>,
    pub v: Vec<f32>,
    /// Attention output before wo [n, n_head * hd_v].
    pub att: Vec<f32>,
    pub gate: Vec<f32>,
    pub up: Vec<f32>,
    /// One logits row (used when output rows are not contiguous).
    pub row: Vec<f32>,
    pub rope_cache: Vec<f32>,
    /// Rope cos/sin tables of the micro-batch's tokens ([n][head_k], `RopeParams::fill_cache`
    /// of each position), per (variant, head size, positions): the layers that share a rope
    /// variant (all of SmolLM2's; Gemma 3's local and global ones: two for 18 layers) fill
    /// it once per micro-batch instead of once each. At most `ROPE_TABS` entries.
    pub rope_tabs: Vec<RopeTab>,
    pub attn_scratch: Vec<f32>,
    pub attn_stride: usize,
    pub mm_scratch: Vec<u8>,
    /// Per token of the micro-batch: position, first seq, stream, key range, cell.
    pub pos: Vec<i32>,
    pub seq0: Vec<usize>,
    pub stream: Vec<u32>,
    pub key_range: Vec<(u32, u32)>,
    pub cells: Vec<(u32, u32)>,
    pub keys: Vec<(i32, u32)>,
    pub keys_tmp: Vec<(i32, u32)>,
    /// Encoders: per token, the micro-batch indices of the tokens it attends to (ranges
    /// in `key_range`).
    pub enc_keys: Vec<u32>,
    /// Micro-batch-local indices of the tokens that want output, and their logits rows.
    pub out_idx: Vec<usize>,
    pub out_row: Vec<usize>,
    /// MoE layers only (see `Step::ffn_moe`): per token the router probabilities, the
    /// selected weights, the weighted expert outputs, a gathered input row and an expert
    /// output row; and the selected expert ids followed by one expert's slots.
    pub moe: Vec<f32>,
    pub moe_idx: Vec<usize>,
    /// The LoRA adapters set on the context (None: the plain matmuls, nothing else).
    pub lora: Option<LoraSet>,
    /// The control vector (inactive until set).
    pub cvec: Cvec,
}

/// Named intermediates kept for `debug_dump`: name -> (rows appended, row width).
#[derive(Default)]
pub struct Debug {
    pub wanted: HashSet<String>,
    pub all: bool,
    pub dumps: HashMap<String, (Vec<f32>, usize)>,
}

impl Debug {
    /// Append `data` (rows of `width`) to the dump of `name` (`name-il` for layer il >= 0)
    /// when that name is wanted.
    pub fn put(&mut self, name: &str, il: i32, data: &[f32], width: usize) {
        let key = if il >= 0 { format!("{name}-{il}") } else { name.to_string() };
        if !self.all && !self.wanted.contains(&key) {
            return;
        }
        let e = self.dumps.entry(key).or_insert_with(|| (Vec::new(), width));
        if e.1 == width {
            e.0.extend_from_slice(data);
        }
    }
}

/// Record an intermediate when a debug dump is active (no cost otherwise).
#[macro_export]
macro_rules! cb {
    ($st:expr, $name:expr, $il:expr, $buf:ident, $width:expr) => {
        if let Some(d) = $st.debug.as_deref_mut() {
            let w = $width;
            d.put($name, $il as i32, &$st.b.$buf[..$st.n * w], w);
        }
    };
}

/// Everything one micro-batch's forward pass reads and writes.
pub struct Step<'a> {
    pub pool: &'a ThreadPool,
    /// The model's offload device (`n_gpu_layers`): the matmuls of the weights it holds.
    pub dev: Option<&'a dyn crate::backend::Backend>,
    pub hp: &'a HParams,
    pub kv: &'a mut KvCache,
    /// The recurrent states (recurrent and hybrid models): sequence set k of the
    /// micro-batch (rows [k * n / rs_seqs, (k + 1) * n / rs_seqs)) owns cell rs.head + k.
    pub rs: Option<&'a mut RsCache>,
    pub rs_seqs: usize,
    pub b: &'a mut Buffers,
    pub debug: Option<&'a mut Debug>,
    /// Rows currently live in the buffers (n_tokens, then n_outputs after `select_outputs`).
    pub n: usize,
    pub tokens: Option<&'a [i32]>,
    /// [n_tokens, n_embd] when the batch carries embeddings.
    pub embd: Option<&'a [f32]>,
    pub logits: &'a mut [f32],
    pub hidden: Option<&'a mut [f32]>,
}

/// The batch as Python hands it over (already validated and autofilled there; checked
/// again here only for what could make Rust index out of bounds).
pub struct BatchRef<'a> {
    pub tokens: Option<&'a [i32]>,
    pub embd: Option<&'a [f32]>,
    pub pos: &'a [i32],
    pub n_seq_id: &'a [i32],
    /// [n, seq_cols] row-major.
    pub seq_id: &'a [i32],
    pub seq_cols: usize,
}

/// What a decode did, short of a fatal error (which is an `Err`): llama_decode's return
/// codes as a type. Python's `Context.decode` raises one exception per kind and the
/// llama.h-style layer maps those back to the codes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decoded {
    /// Every micro-batch ran (llama_decode's 0).
    Done { n_ubatches: usize },
    /// Some micro-batch found no KV cells (or recurrent state cells): nothing changed (1).
    NoSlot,
    /// The abort callback said stop before micro-batch `n_done`: the cache holds exactly
    /// the micro-batches before it (2).
    Aborted { n_done: usize },
    /// The batch cannot be run as given; nothing changed (-1). Python's batch allocator
    /// catches every such batch before Rust sees it, except the one `decode_one` checks.
    InvalidBatch(String),
}

pub struct Context {
    fwd: Box<dyn Forward>,
    pub params: ContextParams,
    pub kv: KvCache,
    /// Recurrent states (MemKind::Recurrent / Hybrid).
    pub rs: Option<RsCache>,
    pub mem_kind: MemKind,
    /// llama.cpp's n_ctx_seq (the KV cells per stream; what a recurrent model would have).
    pub n_ctx_seq: usize,
    /// Per micro-batch of the current decode: its sequence sets (recurrent memory).
    rs_plan: Vec<Vec<RsSeq>>,
    pool: ThreadPool,
    pool_batch: Option<ThreadPool>,
    b: Buffers,
    pub debug: Option<Debug>,
    /// Per micro-batch scratch for the gathered tokens / embeddings.
    ub_tokens: Vec<i32>,
    ub_embd: Vec<f32>,
    slots: Vec<Slot>,
    slot_scratch: Vec<(u32, u32)>,
    /// The vocabulary's hash for saved states (computed on first use).
    vocab_hash: std::sync::OnceLock<u64>,
    pub model: Arc<Model>,
}

impl Context {
    /// Parallel regions run by the context's thread pools since they were made (creation or
    /// the last `set_n_threads`).
    pub fn pool_regions(&self) -> u64 {
        self.pool.regions() + self.pool_batch.as_ref().map_or(0, |p| p.regions())
    }

    pub fn new(model: Arc<Model>, mut p: ContextParams) -> Result<Context> {
        if model.vocab_only {
            return Err(Error::Invalid("the model was loaded with vocab_only: it has no weights to run".into()));
        }
        if p.n_seq_max == 0 || p.n_seq_max > MAX_SEQ {
            return Err(Error::Invalid(format!("n_seq_max = {} must be in [1, {MAX_SEQ}]", p.n_seq_max)));
        }
        if p.n_ctx == 0 || p.n_ubatch == 0 {
            return Err(Error::Invalid("n_ctx and n_ubatch must be positive".into()));
        }
        // positions are int32 (llama_pos): a context cannot hold more cells than that
        if p.n_ctx > i32::MAX as usize {
            return Err(Error::Invalid(format!("n_ctx = {} must be at most {} (positions are int32)", p.n_ctx, i32::MAX)));
        }
        p.n_threads = p.n_threads.clamp(1, 512);
        p.n_threads_batch = p.n_threads_batch.clamp(1, 512);
        model.check_mapped_files()?;
        let hp = &model.hparams;
        // llama.cpp: with separate streams each sequence gets n_ctx / n_seq_max cells,
        // padded to 256, and n_ctx becomes n_ctx_seq * n_seq_max.
        let n_stream = if p.kv_unified { 1 } else { p.n_seq_max };
        let size = if n_stream == 1 {
            p.n_ctx
        } else {
            let per = (p.n_ctx / n_stream).div_ceil(256) * 256;
            p.n_ctx = per * n_stream;
            per
        };
        let fwd = model.arch.build_forward(&crate::models::loader::Loader::new(&model), &p)?;
        if !fwd.rs_rollback() {
            p.n_rs_seq = 0; // llama.cpp clamps the request for architectures without snapshots
        }
        // encoders keep nothing between batches (llama.cpp makes them no memory): a
        // one-cell cache stands in for the sequence bookkeeping
        let size = if fwd.encoder() { 1 } else { size };
        let nl = hp.n_layer;
        let recr = fwd.recurrent();
        let is_recr = |il: usize| recr.as_ref().is_some_and(|r| r.0.get(il).copied().unwrap_or(false));
        let kv_layers: Vec<bool> = match fwd.kv_layers() {
            Some(v) => (0..nl).map(|il| v.get(il).copied().unwrap_or(false)).collect(),
            None => (0..nl).map(|il| !is_recr(il)).collect(),
        };
        let mem_kind = match &recr {
            None => MemKind::Kv,
            Some(_) if !kv_layers.iter().any(|&x| x) => MemKind::Recurrent,
            Some(_) => MemKind::Hybrid,
        };
        // layers without attention keep no K/V rows (a pure recurrent model: a one-cell dummy cache)
        let ek: Vec<usize> = (0..nl).map(|il| if kv_layers[il] { hp.n_embd_k_gqa(il) } else { 0 }).collect();
        let ev: Vec<usize> = (0..nl).map(|il| if kv_layers[il] { hp.n_embd_v_gqa(il) } else { 0 }).collect();
        let n_ctx_seq = size;
        let (size, n_stream) = if mem_kind == MemKind::Recurrent { (1, 1) } else { (size, n_stream) };
        // attention reads one head of a cached row at a time: a quantized cache type needs
        // whole blocks per head
        let mixed_heads = (0..nl).any(|il| kv_layers[il] && (hp.head_k(il) != hp.n_embd_head_k || hp.head_v(il) != hp.n_embd_head_v));
        for (t, hd, what) in [(p.type_k, hp.n_embd_head_k, "type_k"), (p.type_v, hp.n_embd_head_v, "type_v")] {
            // llama.cpp keeps such layers in two caches, each with its own Hadamard rotation;
            // pyllama's one cache has one rotation size
            if mem_kind != MemKind::Recurrent && mixed_heads && crate::kv_cache::is_quantized(t) {
                return Err(Error::Invalid(format!(
                    "{what} = {t}: a quantized KV cache is not supported for this model (its sliding-window and full \
                     attention layers have different head sizes); use f16, bf16 or f32"
                )));
            }
            if mem_kind != MemKind::Recurrent && hd % t.block_size() != 0 {
                return Err(Error::Invalid(format!(
                    "{what} = {t} needs a head size that is a multiple of {} (this model's is {hd})",
                    t.block_size()
                )));
            }
        }
        let mut kv = KvCache::new(&ek, &ev, size, n_stream, p.n_seq_max, p.type_k, p.type_v)?;
        (kv.rot_k, kv.rot_v) =
            crate::kv_cache::rotation_sizes(p.type_k, p.type_v, hp.n_embd_head_k, hp.n_embd_head_v);
        let nu = p.n_ubatch;
        let ne = hp.n_embd;
        let max_l = |f: &dyn Fn(usize) -> usize| (0..nl).map(f).max().unwrap_or(0);
        let qw = max_l(&|il| hp.n_head(il) * hp.head_k(il));
        let aw = max_l(&|il| hp.n_head(il) * hp.head_v(il));
        let kw = max_l(&|il| hp.n_embd_k_gqa(il));
        let vw = max_l(&|il| hp.n_embd_v_gqa(il));
        let ff = max_l(&|il| hp.n_ff[il]).max(hp.n_ff_exp).max(hp.n_ff_shexp).max(1);
        let n_thr = p.n_threads.max(p.n_threads_batch);
        let attn_stride = attention::scratch_per_thread(size, hp.max_head_k(), hp.max_head_v());
        // Every size below comes from the file's hyperparameters or the caller's n_ctx /
        // n_ubatch: each allocation is fallible and names its buffer.
        let z = |m: usize, what: &str| -> Result<Vec<f32>> {
            let n = alloc::mul(what, m, nu)?;
            zeroed_f32(n).ok_or_else(|| alloc::too_large(what, n as u128, 4))
        };
        let mm_cap = alloc::mul("the matmul scratch", nu, alloc::mul("the matmul scratch", ne.max(ff).max(aw) + 64, 2)?)?;
        let b = Buffers {
            x: z(ne, "the residual stream [n_ubatch, n_embd]")?,
            cur: z(ne.max(qw), "the normed input [n_ubatch, max(n_embd, n_q)]")?,
            tmp: z(ne, "the block output [n_ubatch, n_embd]")?,
            q: Vec::new(), // gate's memory during build_attn
            k: Vec::new(), // up's memory during build_attn
            v: z(vw, "V [n_ubatch, n_embd_v_gqa]")?,
            att: z(aw, "the attention output [n_ubatch, n_head * n_embd_head_v]")?,
            gate: z(ff.max(qw), "the FFN gate [n_ubatch, n_ff]")?,
            up: z(ff.max(kw), "the FFN up [n_ubatch, n_ff]")?,
            row: alloc::filled(hp.n_vocab.max(1), 0.0, "a logits row [n_vocab]")?,
            rope_cache: alloc::filled(hp.max_head_k().max(hp.n_rot) + 2, 0.0, "the rope cache")?,
            rope_tabs: Vec::new(),
            attn_scratch: alloc::filled(
                alloc::mul("the attention scratch [n_threads, n_ctx]", attn_stride, n_thr)?,
                0.0,
                "the attention scratch [n_threads, n_ctx]",
            )?,
            attn_stride,
            mm_scratch: alloc::with_capacity(mm_cap, "the matmul scratch")?,
            pos: alloc::with_capacity(nu, "positions [n_ubatch]")?,
            seq0: alloc::with_capacity(nu, "sequence ids [n_ubatch]")?,
            stream: alloc::with_capacity(nu, "streams [n_ubatch]")?,
            key_range: alloc::with_capacity(nu, "key ranges [n_ubatch]")?,
            cells: alloc::with_capacity(nu, "cells [n_ubatch]")?,
            keys: alloc::with_capacity(size, "the key list [n_ctx]")?,
            keys_tmp: alloc::with_capacity(size, "the key list [n_ctx]")?,
            enc_keys: Vec::new(),
            out_idx: alloc::with_capacity(nu, "output indices [n_ubatch]")?,
            out_row: alloc::with_capacity(nu, "output rows [n_ubatch]")?,
            moe: if hp.n_expert > 0 {
                let m = alloc::mul("the MoE scratch", hp.n_expert_used, 1 + ne)?;
                z(hp.n_expert + m + 2 * ne, "the MoE scratch [n_ubatch, n_expert_used * n_embd]")?
            } else {
                Vec::new()
            },
            moe_idx: alloc::with_capacity(
                alloc::mul("the MoE routing [n_ubatch, n_expert_used]", 2 * nu, hp.n_expert_used)?,
                "the MoE routing [n_ubatch, n_expert_used]",
            )?,
            lora: None,
            cvec: Cvec::disabled(),
        };
        let rs = match &recr {
            Some((layers, nr, ns)) => Some(RsCache::new(layers, *nr, *ns, p.n_seq_max, p.n_rs_seq)?),
            None => None,
        };
        let pool = ThreadPool::new(p.n_threads);
        let pool_batch = if p.n_threads_batch != p.n_threads { Some(ThreadPool::new(p.n_threads_batch)) } else { None };
        Ok(Context {
            fwd,
            params: p,
            kv,
            rs,
            mem_kind,
            n_ctx_seq,
            rs_plan: Vec::new(),
            pool,
            pool_batch,
            b,
            debug: None,
            ub_tokens: alloc::with_capacity(nu, "micro-batch tokens [n_ubatch]")?,
            ub_embd: Vec::new(),
            slots: Vec::new(),
            slot_scratch: alloc::with_capacity(size, "the slot search scratch [n_ctx]")?,
            vocab_hash: std::sync::OnceLock::new(),
            model,
        })
    }

    pub fn set_n_threads(&mut self, n_threads: usize, n_threads_batch: usize) {
        let (a, b) = (n_threads.clamp(1, 512), n_threads_batch.clamp(1, 512));
        if a == self.params.n_threads && b == self.params.n_threads_batch {
            return;
        }
        self.params.n_threads = a;
        self.params.n_threads_batch = b;
        self.pool = ThreadPool::new(a);
        self.pool_batch = if a != b { Some(ThreadPool::new(b)) } else { None };
        let need = self.b.attn_stride * a.max(b);
        if self.b.attn_scratch.len() < need {
            self.b.attn_scratch.resize(need, 0.0);
        }
    }

    pub fn n_vocab(&self) -> usize {
        self.model.hparams.n_vocab
    }

    /// Replace the context's LoRA adapters (llama_set_adapters_lora): (adapter, scale) in
    /// order, zero scales dropped; an empty list restores the plain forward pass. Every
    /// adapter must have been loaded for this context's model. On error nothing changes.
    pub fn set_loras(&mut self, adapters: Vec<(Arc<crate::adapter::LoraAdapter>, f32)>) -> Result<()> {
        let me = Arc::as_ptr(&self.model) as usize;
        for (a, _) in &adapters {
            if a.model_id != me {
                return Err(Error::Invalid(format!("LoRA adapter {} was loaded for another model", a.path)));
            }
        }
        let adapters: Vec<_> = adapters.into_iter().filter(|(_, s)| *s != 0.0).collect();
        self.b.lora = if adapters.is_empty() { None } else { Some(LoraSet::new(adapters, self.params.n_ubatch)?) };
        Ok(())
    }

    /// The adapters set, with their scales.
    pub fn loras(&self) -> Vec<(Arc<crate::adapter::LoraAdapter>, f32)> {
        self.b.lora.as_ref().map(|l| l.adapters.clone()).unwrap_or_default()
    }

    /// llama_set_adapter_cvec: data None clears; on error nothing changes.
    pub fn set_cvec(&mut self, data: Option<&[f32]>, n_embd: i32, il_start: i32, il_end: i32) -> Result<()> {
        let hp = &self.model.hparams;
        self.b.cvec.apply(data, n_embd, il_start, il_end, hp.n_embd, hp.n_layer)
    }

    /// Re-rotate the keys of shifted cells (llama.cpp's K-shift) and clear the shifts.
    fn apply_k_shift(&mut self) -> Result<()> {
        if !self.kv.has_shift {
            return Ok(());
        }
        let hp = &self.model.hparams;
        let mut row = Vec::new();
        let mut cache = vec![0f32; hp.max_head_k() + 2];
        for s in 0..self.kv.n_stream() {
            for c in 0..self.kv.size {
                let cell = self.kv.streams[s].cells[c];
                if cell.is_empty() || cell.shift == 0 {
                    continue;
                }
                for il in 0..hp.n_layer {
                    let Some(r) = self.fwd.rope(il) else { continue };
                    let rk = self.kv.row_k[il];
                    if rk == 0 {
                        continue; // no K of its own (Gemma 4's layers that reuse another layer's)
                    }
                    let hd = hp.head_k(il);
                    let n = hp.n_embd_k_gqa(il);
                    row.resize(n, 0.0);
                    let o = (s * self.kv.size + c) * rk;
                    let bytes = &mut self.kv.k[il][o..o + rk];
                    quant::dequantize_row(self.kv.type_k, bytes, &mut row)?;
                    // a rotated K (quantized cache): rotate back, rope, rotate again
                    crate::kv_cache::fwht(&mut row, self.kv.rot_k);
                    r.apply_heads(&mut row, hd, cell.shift, &mut cache);
                    crate::kv_cache::fwht(&mut row, self.kv.rot_k);
                    quant::quantize_row_cpu(self.kv.type_k, &row, bytes)?; // ggml_cpy: from_float
                }
            }
        }
        for st in &mut self.kv.streams {
            for c in &mut st.cells {
                c.shift = 0;
            }
        }
        self.kv.has_shift = false;
        self.kv.host_changed();
        Ok(())
    }

    fn gather_seqs(batch: &BatchRef, i: usize) -> SeqSet {
        let mut s = SeqSet::default();
        let k = batch.n_seq_id[i].max(0) as usize;
        for j in 0..k.min(batch.seq_cols) {
            s.add(batch.seq_id[i * batch.seq_cols + j] as usize);
        }
        s
    }

    fn check(
        &self,
        batch: &BatchRef,
        ubatches: &[&[i32]],
        out_rows: &[i32],
        logits_len: usize,
        hidden_len: Option<usize>,
    ) -> Result<()> {
        let n = batch.pos.len();
        let nv = self.n_vocab();
        let ne = self.model.hparams.n_embd;
        let bad = |m: String| Err(Error::Invalid(m));
        if batch.n_seq_id.len() != n || out_rows.len() != n || batch.seq_id.len() != n * batch.seq_cols {
            return bad(format!("decode: pos, n_seq_id, seq_id and out_rows must all have {n} rows"));
        }
        match (batch.tokens, batch.embd) {
            (Some(t), None) => {
                if t.len() != n {
                    return bad(format!("decode: {} tokens for {n} positions", t.len()));
                }
                if let Some((i, &id)) = t.iter().enumerate().find(|(_, &id)| id < 0 || id as usize >= nv) {
                    return bad(format!("decode: token {i} has id {id} outside [0, {nv})"));
                }
            }
            (None, Some(e)) => {
                if e.len() != n * ne {
                    return bad(format!("decode: embd must be [{n}, {ne}]"));
                }
            }
            _ => return bad("decode: give exactly one of tokens and embd".into()),
        }
        for i in 0..n {
            let k = batch.n_seq_id[i];
            if k < 1 || k as usize > batch.seq_cols {
                return bad(format!("decode: token {i} has n_seq_id {k} outside [1, {}]", batch.seq_cols));
            }
            for j in 0..k as usize {
                let s = batch.seq_id[i * batch.seq_cols + j];
                if s < 0 || s as usize >= self.params.n_seq_max {
                    return bad(format!("decode: token {i} has seq_id {s} outside [0, {})", self.params.n_seq_max));
                }
            }
            if k > 1 && self.kv.n_stream() > 1 {
                // one stream per sequence: a shared token would need a cell in several
                // streams (llama.cpp: "coupled sequences ... use the -kvu flag")
                return bad(format!(
                    "decode: token {i} belongs to {k} sequences, which needs a unified KV cache (kv_unified=True)"
                ));
            }
            if batch.pos[i] < 0 {
                return bad(format!("decode: token {i} has negative position {}", batch.pos[i]));
            }
        }
        let n_rows = if nv > 0 { logits_len / nv } else { 0 };
        if logits_len != n_rows * nv {
            return bad(format!("decode: logits must be [n_outputs, {nv}]"));
        }
        if let Some(h) = hidden_len {
            if h != n_rows * ne {
                return bad(format!("decode: hidden must be [{n_rows}, {ne}]"));
            }
        }
        let mut seen_row = vec![false; n_rows];
        for (i, &r) in out_rows.iter().enumerate() {
            if r >= 0 {
                if r as usize >= n_rows || seen_row[r as usize] {
                    return bad(format!("decode: out_rows[{i}] = {r} is outside [0, {n_rows}) or repeated"));
                }
                seen_row[r as usize] = true;
            }
        }
        let mut seen = vec![false; n];
        for (u, ub) in ubatches.iter().enumerate() {
            if ub.is_empty() || ub.len() > self.params.n_ubatch {
                return bad(format!(
                    "decode: micro-batch {u} has {} tokens (allowed 1..={})",
                    ub.len(),
                    self.params.n_ubatch
                ));
            }
            for &i in ub.iter() {
                if i < 0 || i as usize >= n || seen[i as usize] {
                    return bad(format!("decode: micro-batch {u} holds index {i}, outside [0, {n}) or repeated"));
                }
                seen[i as usize] = true;
            }
        }
        if seen.iter().any(|s| !s) {
            return bad("decode: the micro-batches do not cover every token of the batch".into());
        }
        Ok(())
    }

    /// Micro-batch u's positions and first sequences into the buffers.
    fn load_ubatch(&mut self, batch: &BatchRef, ub: &[i32]) {
        let b = &mut self.b;
        b.pos.clear();
        b.seq0.clear();
        for &i in ub {
            let i = i as usize;
            b.pos.push(batch.pos[i]);
            b.seq0.push(batch.seq_id[i * batch.seq_cols] as usize);
        }
    }

    /// Run a batch: `Decoded::Done` when every micro-batch ran, `NoSlot` when some
    /// micro-batch finds no KV cells (nothing changed), `Aborted { n_done }` when `abort`
    /// said stop before micro-batch n_done (the cache holds exactly the finished ones). An
    /// `Err` is a fatal error (llama_decode's < -1): the cache holds the micro-batches
    /// finished before the failing one.
    pub fn decode(
        &mut self,
        batch: &BatchRef,
        ubatches: &[&[i32]],
        out_rows: &[i32],
        logits: &mut [f32],
        mut hidden: Option<&mut [f32]>,
        abort: &mut dyn FnMut() -> bool,
    ) -> Result<Decoded> {
        if self.fwd.encoder() {
            self.encode(batch, ubatches, out_rows, hidden)?;
            return Ok(Decoded::Done { n_ubatches: 1 });
        }
        self.check(batch, ubatches, out_rows, logits.len(), hidden.as_deref().map(|h| h.len()))?;
        if let Some(d) = self.debug.as_mut() {
            d.dumps.clear();
        }
        // 0. recurrent memory: one state cell per sequence set of each micro-batch, tried
        //    for all of them first and undone (llama_memory_recurrent::prepare); the
        //    hybrid memory prepares the recurrent part first, then the KV cache.
        if let Some(rs) = self.rs.as_mut() {
            self.rs_plan.clear();
            for (u, ub) in ubatches.iter().enumerate() {
                self.rs_plan.push(Self::rs_seqs(batch, ub, u)?);
            }
            let snap = rs.snapshot();
            let ok = self.rs_plan.iter().all(|q| rs.find_slot(q));
            rs.restore(snap);
            if !ok {
                return Ok(Decoded::NoSlot);
            }
        }
        if self.mem_kind == MemKind::Recurrent {
            for (u, ub) in ubatches.iter().enumerate() {
                if abort() {
                    return Ok(Decoded::Aborted { n_done: u });
                }
                let rs = self.rs.as_mut().expect("recurrent memory");
                if !rs.find_slot(&self.rs_plan[u]) {
                    return Err(Error::Invalid("internal: recurrent slot vanished between reserve and compute".into()));
                }
                rs.gather();
                self.load_ubatch(batch, ub);
                let slot = Slot::default();
                self.run_ubatch(batch, ub, &slot, out_rows, logits, hidden.as_deref_mut(), self.rs_plan[u].len())?;
            }
            return Ok(Decoded::Done { n_ubatches: ubatches.len() });
        }
        // 1. reserve cells for every micro-batch (apply each so the next search sees it),
        //    then undo: all or nothing, as llama_kv_cache::prepare.
        let heads = self.kv.heads();
        self.slots.resize_with(ubatches.len().max(self.slots.len()), Slot::default);
        let mut ok = true;
        let mut n_applied = 0;
        for (u, ub) in ubatches.iter().enumerate() {
            self.load_ubatch(batch, ub);
            let mut slot = std::mem::take(&mut self.slots[u]);
            if !self.kv.find_slot(&self.b.seq0, &mut slot, &mut self.slot_scratch) {
                self.slots[u] = slot;
                ok = false;
                break;
            }
            self.kv.apply_slot(&slot, &self.b.pos, &|k| Self::gather_seqs(batch, ub[k] as usize));
            self.slots[u] = slot;
            n_applied += 1;
        }
        for u in (0..n_applied).rev() {
            self.kv.unapply_slot(&self.slots[u]);
        }
        self.kv.set_heads(&heads);
        if !ok {
            return Ok(Decoded::NoSlot);
        }
        self.apply_k_shift()?;
        // 2. compute
        for (u, ub) in ubatches.iter().enumerate() {
            if abort() {
                return Ok(Decoded::Aborted { n_done: u });
            }
            self.load_ubatch(batch, ub);
            let mut slot = std::mem::take(&mut self.slots[u]);
            let found = self.kv.find_slot(&self.b.seq0, &mut slot, &mut self.slot_scratch);
            if !found {
                self.slots[u] = slot;
                return Err(Error::Invalid("internal: KV slot vanished between reserve and compute".into()));
            }
            self.kv.apply_slot(&slot, &self.b.pos, &|k| Self::gather_seqs(batch, ub[k] as usize));
            let mut n_rs = 0;
            if let Some(rs) = self.rs.as_mut() {
                if !rs.find_slot(&self.rs_plan[u]) {
                    self.kv.unapply_slot(&slot);
                    self.slots[u] = slot;
                    return Err(Error::Invalid("internal: recurrent slot vanished between reserve and compute".into()));
                }
                rs.gather();
                n_rs = self.rs_plan[u].len();
            }
            if let Err(e) = self.run_ubatch(batch, ub, &slot, out_rows, logits, hidden.as_deref_mut(), n_rs) {
                // keep "the cache holds exactly the finished micro-batches" on errors too
                self.kv.unapply_slot(&slot);
                self.slots[u] = slot;
                return Err(e);
            }
            self.slots[u] = slot;
        }
        Ok(Decoded::Done { n_ubatches: ubatches.len() })
    }

    /// The token-generation step: `token` at the position after sequence 0's last, its
    /// logits into `logits` ([n_vocab]); the same work and outcome as `decode` with that
    /// one-token batch. `InvalidBatch` when sequence 0 already ends at the largest int32
    /// position (nothing changed). The caller has checked `token` < n_vocab.
    pub fn decode_one(&mut self, token: i32, logits: &mut [f32]) -> Result<Decoded> {
        let last = self.mem_seq_pos_max(0)?;
        if last == i32::MAX {
            return Ok(Decoded::InvalidBatch(format!(
                "sequence 0 would continue at position {}, past the largest position {} (positions are int32)",
                i64::from(i32::MAX) + 1,
                i32::MAX
            )));
        }
        let (tok, pos, n_seq_id, seq_id, ub, orow) = ([token], [last + 1], [1i32], [0i32], [0i32], [0i32]);
        let batch = BatchRef { tokens: Some(&tok), embd: None, pos: &pos, n_seq_id: &n_seq_id, seq_id: &seq_id, seq_cols: 1 };
        self.decode(&batch, &[&ub], &orow, logits, None, &mut || false)
    }

    pub fn is_encoder(&self) -> bool {
        self.fwd.encoder()
    }

    /// llama.cpp's `encode` for encoder models: every token an output (hidden [n, n_embd]
    /// rows by `out_rows`), no KV cache, the whole batch in one micro-batch (llama.cpp
    /// asserts n_ubatch >= n_tokens; here it is an error).
    pub fn encode(&mut self, batch: &BatchRef, ubatches: &[&[i32]], out_rows: &[i32], hidden: Option<&mut [f32]>) -> Result<()> {
        if !self.fwd.encoder() {
            return Err(Error::Invalid(format!(
                "encode: '{}' is a decoder-only model (it has no encoder; use decode)",
                self.model.hparams.arch
            )));
        }
        let n = batch.pos.len();
        if ubatches.len() != 1 || n > self.params.n_ubatch {
            return Err(Error::Invalid(format!(
                "encode: the encoder needs the whole batch ({n} tokens) in one micro-batch of at most n_ubatch = {} tokens \
                 (raise n_ubatch to n_batch)",
                self.params.n_ubatch
            )));
        }
        let n_rows = out_rows.iter().filter(|&&r| r >= 0).count();
        self.check(batch, ubatches, out_rows, n_rows * self.n_vocab(), hidden.as_deref().map(|h| h.len()))?;
        if let Some(d) = self.debug.as_mut() {
            d.dumps.clear();
        }
        let ub = ubatches[0];
        self.load_ubatch(batch, ub);
        self.forward_ubatch(batch, ub, out_rows, &mut [], hidden, 0, true)
    }

    /// The model's dense projections after pooling over vectors x [n, n_embd] (None: it
    /// has none; see `Forward::dense_out`).
    pub fn dense_out(&self, x: &[f32], n: usize) -> Result<Option<Vec<f32>>> {
        let pool = self.pool_batch.as_ref().unwrap_or(&self.pool);
        self.fwd.dense_out(pool, x, n)
    }

    /// The model's classifier head over pooled vectors x [n, n_embd] (rank pooling).
    pub fn classify(&self, x: &[f32], n: usize) -> Result<(Vec<f32>, usize)> {
        let pool = self.pool_batch.as_ref().unwrap_or(&self.pool);
        self.fwd.classify(pool, x, n)
    }

    /// The sequence sets of micro-batch `u` for the recurrent memory: runs of tokens with
    /// the same first sequence, all of one length (llama.cpp's equal split), each sequence
    /// in one run only.
    fn rs_seqs(batch: &BatchRef, ub: &[i32], u: usize) -> Result<Vec<RsSeq>> {
        let mut out: Vec<RsSeq> = Vec::new();
        let mut run = 0;
        let mut len = 0;
        let seq0 = |i: i32| batch.seq_id[i as usize * batch.seq_cols] as usize;
        for (t, &i) in ub.iter().enumerate() {
            let s = seq0(i);
            if t == 0 || s != out.last().map(|q| q.seq0).unwrap_or(usize::MAX) {
                if t > 0 {
                    if len == 0 {
                        len = run;
                    } else if run != len {
                        break;
                    }
                }
                if out.iter().any(|q| q.seq0 == s) {
                    return Err(Error::Invalid(format!(
                        "decode: micro-batch {u} holds sequence {s} in two runs; a recurrent model needs each \
                         micro-batch split equally by sequence (llama.cpp's split_equal)"
                    )));
                }
                out.push(RsSeq { seq0: s, seqs: Self::gather_seqs(batch, i as usize), last_pos: batch.pos[i as usize] });
                run = 0;
            }
            run += 1;
            out.last_mut().unwrap().last_pos = batch.pos[i as usize];
        }
        if (len != 0 && run != len) || ub.len() % out.len().max(1) != 0 {
            return Err(Error::Invalid(format!(
                "decode: micro-batch {u} has sequences of different lengths; a recurrent model needs each \
                 micro-batch split equally by sequence (llama.cpp's split_equal)"
            )));
        }
        Ok(out)
    }

    #[allow(clippy::too_many_arguments)]
    fn run_ubatch(
        &mut self,
        batch: &BatchRef,
        ub: &[i32],
        slot: &Slot,
        out_rows: &[i32],
        logits: &mut [f32],
        hidden: Option<&mut [f32]>,
        rs_seqs: usize,
    ) -> Result<()> {
        let n = ub.len();
        let b = &mut self.b;
        b.cells.clear();
        b.cells.extend_from_slice(&slot.cells);
        b.stream.clear();
        b.stream.extend(slot.cells.iter().map(|c| c.0));
        // key lists: one per distinct first sequence, shared by its tokens
        b.keys.clear();
        b.key_range.clear();
        b.key_range.resize(n, (0, 0));
        for t in 0..n {
            if self.mem_kind == MemKind::Recurrent {
                break; // no attention
            }
            let s = b.seq0[t];
            if let Some(prev) = (0..t).find(|&u| b.seq0[u] == s) {
                b.key_range[t] = b.key_range[prev];
                continue;
            }
            self.kv.keys_of(s, &mut b.keys_tmp);
            let r0 = b.keys.len() as u32;
            b.keys.extend_from_slice(&b.keys_tmp);
            b.key_range[t] = (r0, b.keys.len() as u32);
        }
        self.forward_ubatch(batch, ub, out_rows, logits, hidden, rs_seqs, false)
    }

    /// Micro-batch `ub` (positions and sequences already loaded): its output rows, token
    /// ids and input embeddings into the buffers, then the forward pass over a Step of its
    /// tokens (decode's and encode's common set-up; `encoder`: attention among the
    /// micro-batch's own tokens, no recurrent memory).
    #[allow(clippy::too_many_arguments)]
    fn forward_ubatch(
        &mut self,
        batch: &BatchRef,
        ub: &[i32],
        out_rows: &[i32],
        logits: &mut [f32],
        hidden: Option<&mut [f32]>,
        rs_seqs: usize,
        encoder: bool,
    ) -> Result<()> {
        let n = ub.len();
        let b = &mut self.b;
        b.out_idx.clear();
        b.out_row.clear();
        for (t, &i) in ub.iter().enumerate() {
            let r = out_rows[i as usize];
            if r >= 0 {
                b.out_idx.push(t);
                b.out_row.push(r as usize);
            }
        }
        self.ub_tokens.clear();
        if let Some(toks) = batch.tokens {
            self.ub_tokens.extend(ub.iter().map(|&i| toks[i as usize]));
        }
        let ne = self.model.hparams.n_embd;
        self.ub_embd.clear();
        if let Some(e) = batch.embd {
            for &i in ub {
                self.ub_embd.extend_from_slice(&e[i as usize * ne..(i as usize + 1) * ne]);
            }
        }
        let pool = if n > 1 { self.pool_batch.as_ref().unwrap_or(&self.pool) } else { &self.pool };
        let mut st = Step {
            pool,
            dev: self.model.device.as_deref(),
            hp: &self.model.hparams,
            kv: &mut self.kv,
            rs: if encoder { None } else { self.rs.as_mut() },
            rs_seqs,
            b: &mut self.b,
            debug: self.debug.as_mut(),
            n,
            tokens: if batch.tokens.is_some() { Some(&self.ub_tokens) } else { None },
            embd: if batch.embd.is_some() { Some(&self.ub_embd) } else { None },
            logits,
            hidden,
        };
        if encoder {
            st.enc_key_lists();
        }
        self.fwd.forward(&mut st)
    }

    // ---- llama.h's memory API, over the KV cache, the recurrent states or both ----------

    pub fn mem_clear(&mut self, data: bool) {
        self.kv.clear(data);
        if let Some(rs) = self.rs.as_mut() {
            rs.clear(data);
        }
    }

    /// llama_memory_seq_rm: false when the memory cannot remove that range (a recurrent
    /// state cannot lose its last positions); then nothing changed.
    pub fn mem_seq_rm(&mut self, seq: i32, p0: i32, p1: i32) -> Result<bool> {
        if seq >= 0 && seq as usize >= self.params.n_seq_max {
            return Err(Error::Invalid(format!("seq_rm: seq_id {seq} is outside [0, {})", self.params.n_seq_max)));
        }
        if let Some(rs) = self.rs.as_mut() {
            if !rs.seq_rm(seq, p0, p1) {
                return Ok(false);
            }
        }
        if self.mem_kind == MemKind::Recurrent {
            return Ok(true);
        }
        self.kv.seq_rm(seq, p0, p1)
    }

    pub fn mem_seq_cp(&mut self, src: i32, dst: i32, p0: i32, p1: i32) -> Result<()> {
        if self.mem_kind != MemKind::Recurrent {
            self.kv.seq_cp(src, dst, p0, p1)?;
        }
        if let Some(rs) = self.rs.as_mut() {
            rs.seq_cp(src, dst)?;
        }
        Ok(())
    }

    pub fn mem_seq_keep(&mut self, seq: i32) -> Result<()> {
        if self.mem_kind != MemKind::Recurrent {
            self.kv.seq_keep(seq)?;
        }
        if let Some(rs) = self.rs.as_mut() {
            rs.seq_keep(seq)?;
        }
        Ok(())
    }

    /// llama_memory_can_shift.
    pub fn can_shift(&self) -> bool {
        self.fwd.can_shift()
    }

    fn refuse_shift(&self, what: &str) -> Result<()> {
        Err(Error::Invalid(format!(
            "{what}: this model's KV cache cannot shift positions ({} uses M-RoPE; llama.cpp aborts at the next decode)",
            self.model.hparams.arch
        )))
    }

    pub fn mem_seq_add(&mut self, seq: i32, p0: i32, p1: i32, delta: i32) -> Result<()> {
        if delta != 0 && self.mem_kind != MemKind::Recurrent && !self.can_shift() {
            return self.refuse_shift("seq_add");
        }
        if self.mem_kind != MemKind::Recurrent {
            self.kv.seq_add(seq, p0, p1, delta)?;
        }
        if let Some(rs) = self.rs.as_mut() {
            rs.seq_add(seq, p0, p1, delta)?;
        }
        Ok(())
    }

    pub fn mem_seq_div(&mut self, seq: i32, p0: i32, p1: i32, d: i32) -> Result<()> {
        if d != 1 && self.mem_kind != MemKind::Recurrent && !self.can_shift() {
            return self.refuse_shift("seq_div");
        }
        if self.mem_kind != MemKind::Recurrent {
            self.kv.seq_div(seq, p0, p1, d)?;
        }
        if let Some(rs) = self.rs.as_mut() {
            rs.seq_div(seq, p0, p1, d)?;
        }
        Ok(())
    }

    /// Hybrid: the larger of the two memories' minimums (llama_memory_hybrid).
    pub fn mem_seq_pos_min(&self, seq: i32) -> Result<i32> {
        let kv = self.kv.seq_pos_min(seq)?;
        Ok(match (self.mem_kind, self.rs.as_ref()) {
            (MemKind::Kv, _) | (_, None) => kv,
            (MemKind::Recurrent, Some(rs)) => rs.seq_pos_min(seq as usize),
            (MemKind::Hybrid, Some(rs)) => kv.max(rs.seq_pos_min(seq as usize)),
        })
    }

    /// Hybrid: the smaller of the two memories' maximums.
    pub fn mem_seq_pos_max(&self, seq: i32) -> Result<i32> {
        let kv = self.kv.seq_pos_max(seq)?;
        Ok(match (self.mem_kind, self.rs.as_ref()) {
            (MemKind::Kv, _) | (_, None) => kv,
            (MemKind::Recurrent, Some(rs)) => rs.seq_pos_max(seq as usize),
            (MemKind::Hybrid, Some(rs)) => kv.min(rs.seq_pos_max(seq as usize)),
        })
    }

    // ---- saved state (state.rs has the format) ------------------------------------------

    /// What a saved state must match to be loaded here.
    pub fn fingerprint(&self) -> state::Fingerprint {
        let hp = &self.model.hparams;
        let vocab_hash = *self.vocab_hash.get_or_init(|| {
            let Some(a) = self.model.files.first().and_then(|f| f.get("tokenizer.ggml.tokens")).and_then(|v| v.as_array())
            else {
                return 0;
            };
            // each string with its length, so ["ab", "c"] and ["a", "bc"] differ
            let mut buf = Vec::new();
            for i in 0..a.len() {
                let s = a.str_at(i).unwrap_or(&[]);
                buf.extend_from_slice(&(s.len() as u32).to_le_bytes());
                buf.extend_from_slice(s);
            }
            state::xxh64(&buf, 0)
        });
        state::Fingerprint {
            arch: hp.arch.clone(),
            n_embd: hp.n_embd as u32,
            n_layer: hp.n_layer as u32,
            n_vocab: hp.n_vocab as u32,
            vocab_hash,
            type_k: self.kv.type_k as u32,
            type_v: self.kv.type_v as u32,
            n_embd_k_gqa: (0..hp.n_layer).map(|il| hp.n_embd_k_gqa(il) as u32).collect(),
            n_embd_v_gqa: (0..hp.n_layer).map(|il| hp.n_embd_v_gqa(il) as u32).collect(),
        }
    }

    fn save_args<'a>(&'a self, seq: Option<usize>, flags: u32, outputs: state::Outputs<'a>, tokens: &'a [i32]) -> state::SaveArgs<'a> {
        state::SaveArgs {
            rs: self.rs.as_ref(),
            seq,
            flags,
            outputs,
            tokens,
            n_vocab: self.n_vocab(),
            n_embd: self.model.hparams.n_embd,
        }
    }

    /// Bytes `state_save` writes for the whole context (seq None) or one sequence.
    pub fn state_size(&self, seq: Option<usize>, flags: u32, outputs: state::Outputs, tokens: &[i32]) -> state::SResult<usize> {
        state::size(&self.fingerprint(), &self.kv, &self.save_args(seq, flags, outputs, tokens))
    }

    /// Write the state into `dst`; returns the bytes written.
    pub fn state_save(
        &self,
        seq: Option<usize>,
        flags: u32,
        outputs: state::Outputs,
        tokens: &[i32],
        dst: &mut [u8],
    ) -> state::SResult<usize> {
        state::save(&self.fingerprint(), &self.kv, &self.save_args(seq, flags, outputs, tokens), dst)
    }

    /// Check `data` completely and, when `apply`, load it (the whole context for dest None,
    /// else into sequence `dest`). On any error nothing has changed. Returns the parsed
    /// state (tokens and outputs for the caller).
    pub fn state_load<'a>(
        &mut self,
        data: &'a [u8],
        dest: Option<usize>,
        lim: &state::Limits,
        apply: bool,
    ) -> state::SResult<state::Parsed<'a>> {
        let p = state::parse(&self.fingerprint(), &self.kv, self.rs.as_ref(), data, dest, lim)?;
        let slot = state::plan(&self.kv, &p, dest)?;
        if apply {
            state::apply(&mut self.kv, self.rs.as_mut(), &p, dest, slot);
            self.kv.host_changed();
        }
        Ok(p)
    }

    pub fn set_debug_dump(&mut self, names: Option<Vec<String>>) {
        self.debug = names.map(|v| {
            let all = v.iter().any(|s| s == "*");
            Debug { wanted: v.into_iter().collect(), all, dumps: HashMap::new() }
        });
    }
}

#[cfg(test)]
mod tests {
    //! Context::decode on a real (tiny, random-weight) LLaMA written by the test: the
    //! all-or-nothing KV reservation, aborts, sequence operations and batch invariance.
    //! Logits are compared bit for bit where pyllama promises identical results.

    use super::*;
    use crate::testutil::{decode, decode_abort, params, Tiny};

    fn tokens(n: usize, seed: i32) -> Vec<i32> {
        (0..n as i32).map(|i| (i * 7 + seed * 13 + 3) % 64).collect()
    }

    fn run(ctx: &mut Context, toks: &[i32], p0: i32, seq: i32, n_ubatch: usize) -> (Decoded, Vec<f32>) {
        let pos: Vec<i32> = (p0..p0 + toks.len() as i32).collect();
        let seqs = vec![seq; toks.len()];
        let mut out = vec![false; toks.len()];
        out[toks.len() - 1] = true;
        decode(ctx, toks, &pos, &seqs, &out, n_ubatch)
    }

    /// Cells holding some sequence, counted from the cells themselves.
    fn used(ctx: &Context) -> usize {
        ctx.kv.streams.iter().map(|s| s.cells.iter().filter(|c| !c.is_empty()).count()).sum()
    }

    fn new_ctx(m: &Arc<Model>, n_ctx: usize, n_ubatch: usize, n_seq: usize) -> Context {
        Context::new(m.clone(), params(n_ctx, n_ubatch, n_seq, GgmlType::F16)).unwrap()
    }

    #[test]
    fn kv_slots_are_reserved_for_every_micro_batch_or_none() {
        let m = Tiny::new(1).load("slots");
        let toks = tokens(16, 0);
        let mut ctx = new_ctx(&m, 16, 4, 1);
        assert_eq!(run(&mut ctx, &toks[..12], 0, 0, 4).0, Decoded::Done { n_ubatches: 3 });
        // 8 more tokens in two micro-batches: the first would fit the 4 free cells, the
        // second not, so neither is placed
        assert_eq!(run(&mut ctx, &toks[8..16], 12, 0, 4).0, Decoded::NoSlot);
        assert_eq!(ctx.mem_seq_pos_max(0).unwrap(), 11);
        assert_eq!(used(&ctx), 12);
        // the cache is as before: the 4 that fit give what a fresh context gives
        let (d, after) = run(&mut ctx, &toks[12..16], 12, 0, 4);
        assert_eq!(d, Decoded::Done { n_ubatches: 1 });
        let mut fresh = new_ctx(&m, 16, 4, 1);
        let (_, want) = run(&mut fresh, &toks, 0, 0, 4);
        assert_eq!(after, want);
        // full now: even one token finds no cell
        let mut row = vec![0f32; ctx.n_vocab()];
        assert_eq!(ctx.decode_one(5, &mut row).unwrap(), Decoded::NoSlot);
        assert_eq!(ctx.mem_seq_pos_max(0).unwrap(), 15);
    }

    #[test]
    fn abort_keeps_exactly_the_finished_micro_batches() {
        let m = Tiny::new(2).load("abort");
        let toks = tokens(12, 1);
        let mut ctx = new_ctx(&m, 32, 4, 1);
        let pos: Vec<i32> = (0..12).collect();
        let mut out = vec![false; 12];
        out[11] = true;
        let mut asked = 0;
        let mut stop_third = || {
            asked += 1;
            asked == 3
        };
        let (d, _) = decode_abort(&mut ctx, &toks, &pos, &[0; 12], &out, 4, &mut stop_third);
        assert_eq!(d, Decoded::Aborted { n_done: 2 });
        assert_eq!(ctx.mem_seq_pos_max(0).unwrap(), 7);
        // the 8 finished positions are the ones a full decode writes
        let (_, rest) = run(&mut ctx, &toks[8..], 8, 0, 4);
        let mut fresh = new_ctx(&m, 32, 4, 1);
        let (_, want) = run(&mut fresh, &toks, 0, 0, 4);
        assert_eq!(rest, want);
    }

    #[test]
    fn seq_rm_then_redecode_gives_the_same_logits() {
        let m = Tiny::new(3).load("seqrm");
        let toks = tokens(10, 2);
        let mut ctx = new_ctx(&m, 32, 8, 1);
        let (_, first) = run(&mut ctx, &toks, 0, 0, 8);
        assert!(ctx.mem_seq_rm(0, 6, -1).unwrap());
        assert_eq!((ctx.mem_seq_pos_min(0).unwrap(), ctx.mem_seq_pos_max(0).unwrap()), (0, 5));
        assert_eq!(used(&ctx), 6);
        let (_, again) = run(&mut ctx, &toks[6..], 6, 0, 8);
        assert_eq!(first, again);
        // a different continuation differs: the comparison above can fail
        let mut other = toks[6..].to_vec();
        other[0] = (other[0] + 1) % 64;
        assert!(ctx.mem_seq_rm(0, 6, -1).unwrap());
        assert_ne!(run(&mut ctx, &other, 6, 0, 8).1, first);
        assert!(ctx.mem_seq_rm(-1, -1, -1).unwrap());
        assert_eq!((ctx.mem_seq_pos_max(0).unwrap(), used(&ctx)), (-1, 0));
    }

    #[test]
    fn seq_cp_shares_the_prefix_cells() {
        let m = Tiny::new(4).load("seqcp");
        let toks = tokens(7, 3);
        let mut ctx = new_ctx(&m, 32, 8, 2);
        run(&mut ctx, &toks[..6], 0, 0, 8);
        ctx.mem_seq_cp(0, 1, -1, -1).unwrap();
        assert_eq!(ctx.mem_seq_pos_max(1).unwrap(), 5);
        assert_eq!(used(&ctx), 6, "copied cells are shared, not duplicated");
        let (_, in1) = run(&mut ctx, &toks[6..], 6, 1, 8);
        let (_, in0) = run(&mut ctx, &toks[6..], 6, 0, 8);
        assert_eq!(in0, in1);
        let mut fresh = new_ctx(&m, 32, 8, 1);
        assert_eq!(run(&mut fresh, &toks, 0, 0, 8).1, in1);
        // removing sequence 0 leaves sequence 1's cells
        assert!(ctx.mem_seq_rm(0, -1, -1).unwrap());
        assert_eq!((ctx.mem_seq_pos_max(0).unwrap(), ctx.mem_seq_pos_max(1).unwrap()), (-1, 6));
        assert_eq!(used(&ctx), 7);
    }

    #[test]
    fn a_sequence_logits_do_not_depend_on_its_batch_mates_or_the_split() {
        let m = Tiny::new(5).load("invariance");
        let a = tokens(9, 4);
        let mut alone = new_ctx(&m, 64, 16, 3);
        let pos: Vec<i32> = (0..9).collect();
        let (_, want) = decode(&mut alone, &a, &pos, &[0; 9], &[true; 9], 16);
        // the same sequence interleaved with two others, in micro-batches of 5 and of 27
        for n_ubatch in [5, 27] {
            let mut ctx = new_ctx(&m, 64, n_ubatch, 3);
            let (b, c) = (tokens(9, 5), tokens(9, 6));
            let (mut tk, mut ps, mut sq) = (Vec::new(), Vec::new(), Vec::new());
            for i in 0..9 {
                for (s, t) in [(1, b[i]), (0, a[i]), (2, c[i])] {
                    tk.push(t);
                    ps.push(i as i32);
                    sq.push(s);
                }
            }
            let out: Vec<bool> = sq.iter().map(|&s| s == 0).collect();
            let (d, got) = decode(&mut ctx, &tk, &ps, &sq, &out, n_ubatch);
            assert!(matches!(d, Decoded::Done { .. }));
            assert_eq!(got, want, "n_ubatch {n_ubatch}");
        }
    }

    #[test]
    fn decode_one_is_a_one_token_batch_and_refuses_positions_past_int32() {
        let m = Tiny::new(6).load("one");
        let toks = tokens(5, 7);
        let mut a = new_ctx(&m, 32, 8, 1);
        let mut b = new_ctx(&m, 32, 8, 1);
        run(&mut a, &toks[..4], 0, 0, 8);
        run(&mut b, &toks[..4], 0, 0, 8);
        let mut row = vec![0f32; a.n_vocab()];
        assert_eq!(a.decode_one(toks[4], &mut row).unwrap(), Decoded::Done { n_ubatches: 1 });
        assert_eq!(run(&mut b, &toks[4..], 4, 0, 8).1, row);
        // a token id outside the vocabulary is an error, not a panic
        assert!(a.decode_one(64, &mut row).is_err());
        // shift the sequence to end at the largest position: the next one does not exist
        a.mem_seq_add(0, -1, -1, i32::MAX - 4).unwrap();
        assert_eq!(a.mem_seq_pos_max(0).unwrap(), i32::MAX);
        match a.decode_one(1, &mut row).unwrap() {
            Decoded::InvalidBatch(why) => assert!(why.contains("2147483648"), "{why}"),
            d => panic!("expected InvalidBatch, got {d:?}"),
        }
        assert_eq!((a.mem_seq_pos_max(0).unwrap(), used(&a)), (i32::MAX, 5));
    }
}
