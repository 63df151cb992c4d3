//! LoRA adapters and control vectors (llama.h's `llama_adapter_lora` / `llama_adapter_cvec`,
//! src/llama-adapter.cpp), applied at run time without touching the base weights.
//!
//! A LoRA GGUF (convert_lora_to_gguf.py: `general.type = adapter`, `adapter.type = lora`,
//! `adapter.lora.alpha`) holds, per adapted weight W {n_in, n_out}, the pair
//! `<W's name>.lora_a` {n_in, rank} and `<W's name>.lora_b` {rank, n_out} (ggml order).
//! Every matmul of W then becomes (llama-graph.cpp `build_lora_mm`):
//!
//!   y = W x + sum over the context's adapters of (B (A x)) * scale_eff
//!   scale_eff = user_scale * alpha / rank  (user_scale when alpha == 0)
//!
//! with the adapters' terms added one after the other to W x. Expert tensors
//! {n_in, n_out, n_expert} carry 3-D pairs and use expert e's slices (`build_lora_mm_id`).
//! `token_embd.weight` is looked up by rows instead (`build_inp_embd`): its A is
//! {rank, n_vocab} (row = token) and B {rank, n_embd}: x += (B A[token]) * scale_eff.
//!
//! A control vector adds one direction per layer to the layer's output (`build_cvec`,
//! after the FFN residual) for layers il_start <= il <= il_end; layer 0 never has one.

use crate::error::{alloc, Error, Result};
use crate::gguf::{GgufFile, LoadMode, Value};
use crate::model::{Model, TensorView};
use crate::ops::matmul::try_matmul_rows;
use crate::quant;
use crate::threadpool::ThreadPool;
use std::collections::HashMap;
use std::sync::Arc;

/// One adapted weight: A {n_in, rank[, n_expert]} and B {rank, n_out[, n_expert]}
/// (token_embd: A {rank, n_vocab}, B {rank, n_embd}).
pub struct LoraWeight {
    pub a: TensorView<'static>,
    pub b: TensorView<'static>,
}

impl LoraWeight {
    pub fn rank(&self) -> usize {
        self.b.ne[0]
    }

    /// llama_adapter_lora_weight::get_scale, in its float order.
    pub fn scale(&self, alpha: f32, user_scale: f32) -> f32 {
        let rank = self.rank() as f32;
        if alpha != 0.0 {
            user_scale * alpha / rank
        } else {
            user_scale
        }
    }
}

pub struct LoraAdapter {
    pub path: String,
    pub alpha: f32,
    /// `adapter.alora.invocation_tokens` (activated LoRA), empty when absent.
    pub alora_invocation_tokens: Vec<i32>,
    /// Base weight name -> its pair, for the weights used as matmuls.
    pub weights: HashMap<String, LoraWeight>,
    /// token_embd.weight's pair (applied to rows, never as a matmul).
    pub embd: Option<LoraWeight>,
    /// The model it was checked against (its address: a context accepts only its own).
    pub model_id: usize,
    /// Owns the bytes the views above borrow; must stay the last field.
    pub file: Arc<GgufFile>,
}

fn bad(path: &str, msg: impl std::fmt::Display) -> Error {
    Error::Unsupported(format!("LoRA adapter {path}: {msg}"))
}

fn meta_str<'a>(f: &'a GgufFile, key: &str) -> Option<&'a str> {
    f.get(key).and_then(|v| v.as_str())
}

impl LoraAdapter {
    /// Read and check an adapter for `model` (llama_adapter_lora_init_impl's checks, plus
    /// the ones pyllama's kernels need: tensor types it can multiply, whole blocks per row,
    /// A/B ranks that agree, expert counts that match).
    pub fn load(model: &Arc<Model>, path: &str) -> Result<LoraAdapter> {
        // read into memory (an adapter is small; llama.cpp copies it too), so a file
        // rewritten later cannot fault the mapped pages
        Self::from_file(model, GgufFile::open(path, LoadMode::None)?)
    }

    /// An adapter from the bytes of a GGUF file (`name` stands for the path in messages).
    pub fn from_bytes(model: &Arc<Model>, name: &str, bytes: &[u8]) -> Result<LoraAdapter> {
        Self::from_file(model, GgufFile::from_storage(name, crate::gguf::Storage::from_bytes(bytes))?)
    }

    fn from_file(model: &Arc<Model>, file: GgufFile) -> Result<LoraAdapter> {
        let file = Arc::new(file);
        let path = file.path.clone();
        let path = path.as_str();
        let general_type = meta_str(&file, "general.type").unwrap_or("");
        if general_type != "adapter" {
            return Err(bad(path, format!("expect general.type to be 'adapter', but got: '{general_type}'")));
        }
        let arch = meta_str(&file, "general.architecture").unwrap_or("");
        if arch != model.hparams.arch {
            return Err(bad(
                path,
                format!("model arch and LoRA arch mismatch (the adapter is for '{arch}', the model is '{}')", model.hparams.arch),
            ));
        }
        let adapter_type = meta_str(&file, "adapter.type").unwrap_or("");
        if adapter_type != "lora" {
            return Err(bad(path, format!("expect adapter.type to be 'lora', but got: '{adapter_type}'")));
        }
        // gguf_get_val_f32: the key must hold a float32 (llama.cpp asserts otherwise)
        let alpha = match file.get("adapter.lora.alpha") {
            None => 0.0,
            Some(Value::F32(a)) => *a,
            Some(v) => return Err(bad(path, format!("adapter.lora.alpha must be a float32, not {v:?}"))),
        };
        let alora_invocation_tokens = match file.get("adapter.alora.invocation_tokens") {
            None => Vec::new(),
            Some(Value::Array(a)) if a.elem_type == crate::gguf::vtype::U32 => {
                a.iter().map(|v| v.as_i64().unwrap_or(0) as u32 as i32).collect()
            }
            Some(Value::Array(_)) => {
                return Err(bad(path, "invalid gguf element type for adapter.alora.invocation_tokens (expected uint32)"))
            }
            Some(_) => return Err(bad(path, "invalid gguf type for adapter.alora.invocation_tokens (expected an array)")),
        };

        // pair up <name>.lora_a / <name>.lora_b (norm vectors are skipped, as llama.cpp does)
        let mut pairs: Vec<(String, Option<usize>, Option<usize>)> = Vec::new();
        let mut index: HashMap<String, usize> = HashMap::new();
        for (ti, t) in file.tensors.iter().enumerate() {
            let (base, is_a) = if let Some(b) = t.name.strip_suffix(".lora_a") {
                (b, true)
            } else if let Some(b) = t.name.strip_suffix(".lora_b") {
                (b, false)
            } else if t.name.ends_with("_norm.weight") {
                continue;
            } else {
                return Err(bad(path, format!("LoRA tensor '{}' has unexpected suffix", t.name)));
            };
            let k = *index.entry(base.to_string()).or_insert_with(|| {
                pairs.push((base.to_string(), None, None));
                pairs.len() - 1
            });
            if is_a {
                pairs[k].1 = Some(ti);
            } else {
                pairs[k].2 = Some(ti);
            }
        }
        let view = |ti: usize| -> Result<TensorView<'static>> {
            let t = &file.tensors[ti];
            if !t.ty.is_supported() || t.ty.row_size(t.ne[0] as usize).is_none() {
                return Err(bad(path, format!("tensor '{}': type {} with {} columns is not supported", t.name, t.ty, t.ne[0])));
            }
            if t.ne[3] != 1 {
                return Err(bad(path, format!("tensor '{}' has 4 dimensions", t.name)));
            }
            let v = TensorView { name: &t.name, ty: t.ty, ne: t.ne.map(|d| d as usize), data: file.tensor_data(t), layout: crate::model::Layout::Plain };
            // SAFETY: the adapter keeps `file` (an Arc, so the GgufFile never moves) until
            // it drops, after the views; its bytes are an owned buffer that never moves.
            Ok(unsafe { std::mem::transmute::<TensorView<'_>, TensorView<'static>>(v) })
        };
        let has_output = model.tensor("output.weight").is_some();
        let mut weights = HashMap::new();
        let mut embd = None;
        for (name, a, b) in &pairs {
            let (Some(a), Some(b)) = (*a, *b) else {
                return Err(bad(path, format!("LoRA tensor pair for '{name}' is missing one component")));
            };
            let Some(w) = model.tensor(name) else {
                return Err(bad(path, format!("LoRA tensor '{name}' does not exist in base model (hint: maybe wrong base model?)")));
            };
            let (a, b) = (view(a)?, view(b)?);
            if b.ne[0] == 0 {
                return Err(bad(path, format!("tensor '{name}': rank 0 (lora_b has no columns)")));
            }
            let shape = |what: &str| bad(path, format!("tensor '{name}' has incorrect shape: {what} (hint: maybe wrong base model?)"));
            if name.ends_with("token_embd.weight") {
                // B non-transposed, A and B flipped (llm_build_inp_embd)
                if w.ne[0] != b.ne[1] || w.ne[1] != a.ne[1] {
                    return Err(shape(&format!("weight {:?}, lora_a {:?}, lora_b {:?}", &w.ne[..2], &a.ne[..2], &b.ne[..2])));
                }
                if a.ne[0] != b.ne[0] || a.ne[2] != 1 || b.ne[2] != 1 {
                    return Err(shape(&format!("lora_a {:?} and lora_b {:?} must share their rank (ne[0])", &a.ne[..3], &b.ne[..3])));
                }
                if !has_output {
                    // llama.cpp reuses token_embd for the output projection and would apply
                    // this pair there too, with shapes that cannot multiply (a ggml abort)
                    return Err(bad(
                        path,
                        format!("'{name}' has a LoRA, but this model ties its output to it (no output.weight): llama.cpp cannot apply such an adapter"),
                    ));
                }
                embd = Some(LoraWeight { a, b });
                continue;
            }
            if w.ne[0] != a.ne[0] || w.ne[1] != b.ne[1] {
                return Err(shape(&format!("weight {:?}, lora_a {:?}, lora_b {:?}", &w.ne[..2], &a.ne[..2], &b.ne[..2])));
            }
            if a.ne[1] != b.ne[0] {
                return Err(bad(
                    path,
                    format!("tensor '{name}': lora_a tensor is not transposed (hint: adapter from \"finetune\" example is no longer supported)"),
                ));
            }
            if a.ne[2] != w.ne[2] || b.ne[2] != w.ne[2] || w.ne[3] != 1 {
                return Err(shape(&format!(
                    "{} experts in the weight, {} in lora_a, {} in lora_b",
                    w.ne[2], a.ne[2], b.ne[2]
                )));
            }
            weights.insert(name.clone(), LoraWeight { a, b });
        }
        let model_id = Arc::as_ptr(model) as usize;
        Ok(LoraAdapter { path: path.to_string(), alpha, alora_invocation_tokens, weights, embd, model_id, file })
    }

    pub fn n_tensors(&self) -> usize {
        2 * (self.weights.len() + self.embd.is_some() as usize)
    }
}

/// The adapters active on a context, with the scratch their products need (sized when the
/// set is made, so decode still allocates nothing).
pub struct LoraSet {
    /// (adapter, user scale) in the caller's order; zero scales are not kept.
    pub adapters: Vec<(Arc<LoraAdapter>, f32)>,
    /// A x [n_ubatch, max rank]
    ax: Vec<f32>,
    /// B (A x) [n_ubatch, max n_out]
    bx: Vec<f32>,
    /// Runs the small products on the calling thread: a rank-r product is r / n_out of its
    /// weight's work, too little to pay for waking the pool (two parallel regions per
    /// adapted weight would cost more than the arithmetic when generating).
    solo: ThreadPool,
}

/// Multiply-adds below which an adapter's product runs on the calling thread.
const SOLO_MACS: usize = 1 << 18;

fn pool_for<'p>(pool: &'p ThreadPool, solo: &'p ThreadPool, macs: usize) -> &'p ThreadPool {
    if macs < SOLO_MACS {
        solo
    } else {
        pool
    }
}

impl LoraSet {
    pub fn new(adapters: Vec<(Arc<LoraAdapter>, f32)>, n_ubatch: usize) -> Result<LoraSet> {
        let mut rank = 1;
        let mut width = 1;
        for (ad, _) in &adapters {
            for w in ad.weights.values().chain(ad.embd.as_ref()) {
                rank = rank.max(w.rank());
                width = width.max(w.b.ne[1]);
            }
        }
        let ax = alloc::filled(alloc::mul("the LoRA scratch [n_ubatch, rank]", n_ubatch, rank)?, 0.0, "the LoRA scratch [n_ubatch, rank]")?;
        let bx = alloc::filled(alloc::mul("the LoRA scratch [n_ubatch, n_out]", n_ubatch, width)?, 0.0, "the LoRA scratch [n_ubatch, n_out]")?;
        Ok(LoraSet { adapters, ax, bx, solo: ThreadPool::new(1) })
    }

    pub fn has_embd(&self) -> bool {
        self.adapters.iter().any(|(a, _)| a.embd.is_some())
    }

    /// out [n, rows.len()] += the adapters' terms for rows `rows` of weight `w` applied to
    /// x [n, w.ne[0]] (after out holds W x).
    #[allow(clippy::too_many_arguments)]
    pub fn add_mm(
        &mut self,
        pool: &ThreadPool,
        w: &TensorView,
        x: &[f32],
        n: usize,
        out: &mut [f32],
        rows: std::ops::Range<usize>,
        scratch: &mut Vec<u8>,
    ) -> Result<()> {
        let width = rows.len();
        for (ad, user_scale) in &self.adapters {
            let Some(lw) = ad.weights.get(w.name) else { continue };
            let rank = lw.rank();
            let scale = lw.scale(ad.alpha, *user_scale);
            // an expert weight {n_in, n_out, n_expert} is used one expert at a time: rows
            // [e * n_out, (e + 1) * n_out), whose A slice is rows [e * rank, (e + 1) * rank)
            let e = if w.ne[2] > 1 { rows.start / w.ne[1].max(1) } else { 0 };
            if self.ax.len() < n * rank || self.bx.len() < n * width || rows.end > lw.b.n_rows() {
                return Err(Error::Invalid(format!("internal: LoRA scratch too small for '{}'", w.name)));
            }
            let ax = &mut self.ax[..n * rank];
            let p = pool_for(pool, &self.solo, n * rank * w.ne[0]);
            try_matmul_rows(p, &lw.a, x, n, ax, rank, e * rank..(e + 1) * rank, scratch)?;
            let bx = &mut self.bx[..n * width];
            let p = pool_for(pool, &self.solo, n * width * rank);
            try_matmul_rows(p, &lw.b, ax, n, bx, width, rows.clone(), scratch)?;
            for (o, v) in out[..n * width].iter_mut().zip(bx.iter()) {
                *o += *v * scale; // ggml_add(res, ggml_scale(ab, scale))
            }
        }
        Ok(())
    }

    /// x [n, n_embd] += the adapters' token_embd terms for `tokens`.
    pub fn add_embd(&mut self, pool: &ThreadPool, tokens: &[i32], x: &mut [f32], n_embd: usize, scratch: &mut Vec<u8>) -> Result<()> {
        let n = tokens.len();
        for (ad, user_scale) in &self.adapters {
            let Some(lw) = ad.embd.as_ref() else { continue };
            let rank = lw.rank();
            let scale = lw.scale(ad.alpha, *user_scale);
            if self.ax.len() < n * rank || self.bx.len() < n * n_embd {
                return Err(Error::Invalid("internal: LoRA scratch too small for token_embd".into()));
            }
            for (t, &id) in tokens.iter().enumerate() {
                quant::dequantize_row(lw.a.ty, lw.a.row(id as usize), &mut self.ax[t * rank..(t + 1) * rank])?;
            }
            let bx = &mut self.bx[..n * n_embd];
            let pool = pool_for(pool, &self.solo, n * n_embd * rank);
            try_matmul_rows(pool, &lw.b, &self.ax[..n * rank], n, bx, n_embd, 0..n_embd, scratch)?;
            for (o, v) in x[..n * n_embd].iter_mut().zip(bx.iter()) {
                *o += *v * scale;
            }
        }
        Ok(())
    }
}

/// A context's control vector (llama_adapter_cvec): directions [n_layer, n_embd] (row 0
/// unused), applied to layers in [layer_start, layer_end]. Allocated on first use; cleared
/// by setting the range to -1 (the directions stay, as in llama.cpp).
#[derive(Default)]
pub struct Cvec {
    pub layer_start: i32,
    pub layer_end: i32,
    pub dirs: Vec<f32>,
    pub n_embd: usize,
}

impl Cvec {
    pub fn disabled() -> Cvec {
        Cvec { layer_start: -1, layer_end: -1, dirs: Vec::new(), n_embd: 0 }
    }

    /// Layer il's direction when it applies (tensor_for).
    #[inline]
    pub fn dir(&self, il: usize) -> Option<&[f32]> {
        let i = il as i64;
        if self.dirs.is_empty() || il == 0 || i < self.layer_start as i64 || i > self.layer_end as i64 {
            return None;
        }
        self.dirs.get(il * self.n_embd..(il + 1) * self.n_embd)
    }

    /// llama_adapter_cvec::apply: data None disables; otherwise data holds n_embd floats
    /// per layer from layer 1 (layers past its end keep what they had).
    pub fn apply(&mut self, data: Option<&[f32]>, n_embd: i32, il_start: i32, il_end: i32, model_n_embd: usize, n_layer: usize) -> Result<()> {
        let Some(data) = data else {
            self.layer_start = -1;
            self.layer_end = -1;
            return Ok(());
        };
        if n_embd < 0 || n_embd as usize != model_n_embd {
            return Err(Error::Invalid(format!(
                "control vector n_embd does not match model (the vector has {n_embd} values per layer, the model's n_embd is {model_n_embd})"
            )));
        }
        if self.dirs.is_empty() {
            self.dirs = alloc::filled(alloc::mul("the control vector [n_layer, n_embd]", n_layer, model_n_embd)?, 0.0, "the control vector [n_layer, n_embd]")?;
            self.n_embd = model_n_embd;
        }
        self.layer_start = il_start;
        self.layer_end = il_end;
        let ne = model_n_embd;
        for il in 1..n_layer {
            let off = ne * (il - 1);
            if off + ne <= data.len() {
                self.dirs[il * ne..(il + 1) * ne].copy_from_slice(&data[off..off + ne]);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cvec_follows_llama_adapter_cvec() {
        let (ne, nl) = (2, 4);
        let mut c = Cvec::disabled();
        assert!(c.dir(1).is_none());
        // n_embd must be the model's; nothing changes on error
        assert!(c.apply(Some(&[1.0; 6]), 3, 1, 3, ne, nl).is_err());
        assert!(c.dirs.is_empty());
        // data from layer 1; layer 0 never has a direction; range inclusive
        c.apply(Some(&[1.0, 1.0, 2.0, 2.0, 3.0, 3.0]), 2, 0, 2, ne, nl).unwrap();
        assert!(c.dir(0).is_none());
        assert_eq!(c.dir(1), Some(&[1.0, 1.0][..]));
        assert_eq!(c.dir(2), Some(&[2.0, 2.0][..]));
        assert!(c.dir(3).is_none());
        // a shorter vector leaves the layers past its end as they were
        c.apply(Some(&[5.0, 5.0]), 2, 1, 3, ne, nl).unwrap();
        assert_eq!(c.dir(1), Some(&[5.0, 5.0][..]));
        assert_eq!(c.dir(3), Some(&[3.0, 3.0][..]));
        assert!(c.dir(4).is_none());
        // None disables (the directions stay for later)
        c.apply(None, 0, 0, 0, ne, nl).unwrap();
        assert!((0..nl).all(|il| c.dir(il).is_none()));
    }

    #[test]
    fn scale_is_alpha_over_rank_or_the_user_scale() {
        let a: &'static [u8] = Box::leak(vec![0u8; 4 * 3 * 2].into_boxed_slice());
        let b: &'static [u8] = Box::leak(vec![0u8; 4 * 2 * 5].into_boxed_slice());
        let w = LoraWeight {
            a: TensorView { name: "a", ty: crate::GgmlType::F32, ne: [3, 2, 1, 1], data: a, layout: crate::model::Layout::Plain },
            b: TensorView { name: "b", ty: crate::GgmlType::F32, ne: [2, 5, 1, 1], data: b, layout: crate::model::Layout::Plain },
        };
        assert_eq!(w.rank(), 2);
        assert_eq!(w.scale(16.0, 0.5), 4.0);
        assert_eq!(w.scale(0.0, 0.5), 0.5);
    }
}
