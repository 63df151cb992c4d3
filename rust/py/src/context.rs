//! `pyllama._core.Context`: the Rust half of a llama context. Python (pyllama.batch /
//! context) validates and splits the batch; `decode` runs the micro-batches with the GIL
//! released and writes logits straight into the caller's numpy buffer.

use crate::errors::{state_err, to_py};
use crate::gguf::PyModel;
use numpy::{PyArray, PyArray1, PyArray2, PyArrayMethods, PyReadonlyArray1, PyReadwriteArray, PyUntypedArrayMethods};
use pyllama_core::adapter::LoraAdapter;
use pyllama_core::context::{BatchRef, Context, ContextParams, Decoded};
use pyllama_core::kv_cache::parse_cache_type;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::sync::Arc;

#[pyclass(name = "Context", module = "pyllama._core")]
pub struct PyContext {
    inner: Context,
    #[pyo3(get)]
    model: Py<PyModel>,
}

/// Runs `f`, turning a Rust panic (a pyllama bug) into a RuntimeError that names it, so no
/// `PanicException` (a BaseException that `except Exception` does not catch) reaches Python.
/// The Python layer treats it as a fatal decode error (llama_decode's < -1).
fn no_panic<T>(what: &str, f: impl FnOnce() -> PyResult<T>) -> PyResult<T> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(p) => {
            let msg = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            Err(pyo3::exceptions::PyRuntimeError::new_err(format!("{what}: internal error (a pyllama bug): {msg}")))
        }
    }
}

/// An owned copy of an input array, in C order. decode validates the batch and then runs
/// with the GIL released, calling back into Python (the abort callback) between
/// micro-batches: a callback or another thread may rewrite the caller's arrays meanwhile,
/// so Rust works on its own copy of what it checked (a few bytes per token for ids and
/// positions, n_embd floats per token for an embedding batch: small beside a forward pass).
fn owned<T: numpy::Element + Copy, D: numpy::ndarray::Dimension>(
    a: &Bound<'_, PyArray<T, D>>,
    what: &str,
) -> PyResult<Vec<T>> {
    let r = a.try_readonly().map_err(|e| PyValueError::new_err(format!("decode: {what}: {e}")))?;
    Ok(match r.as_slice() {
        Ok(s) => s.to_vec(),
        Err(_) => r.as_array().iter().copied().collect(),
    })
}

/// The writable output buffer: a read-only, non-contiguous or already borrowed array is a
/// ValueError naming it (numpy's `readwrite()` would panic).
fn out_buf<'py, D: numpy::ndarray::Dimension>(
    a: &Bound<'py, PyArray<f32, D>>,
    what: &str,
) -> PyResult<PyReadwriteArray<'py, f32, D>> {
    let w = a.try_readwrite().map_err(|e| {
        PyValueError::new_err(format!("{what} must be a writeable float32 array not in use elsewhere ({e})"))
    })?;
    if !w.is_c_contiguous() {
        return Err(PyValueError::new_err(format!("{what} must be a C-contiguous float32 array")));
    }
    Ok(w)
}

/// A read-only view of a float32 row; an array a running decode is writing into is a
/// ValueError (numpy's `readonly()` would panic).
fn in_row<'py>(a: &Bound<'py, PyArray1<f32>>, what: &str) -> PyResult<PyReadonlyArray1<'py, f32>> {
    a.try_readonly().map_err(|e| PyValueError::new_err(format!("{what}: the array is being written ({e})")))
}

fn slice<'a, T: numpy::Element>(a: &'a Option<PyReadonlyArray1<'_, T>>) -> PyResult<&'a [T]> {
    match a {
        None => Ok(&[]),
        Some(a) => a.as_slice().map_err(|_| PyValueError::new_err("state: arrays must be C-contiguous")),
    }
}

fn slice2<'a>(a: &'a Option<numpy::PyReadonlyArray2<'_, f32>>) -> PyResult<&'a [f32]> {
    match a {
        None => Ok(&[]),
        Some(a) => a.as_slice().map_err(|_| PyValueError::new_err("state: arrays must be C-contiguous")),
    }
}

/// What `Context.decode` / `decode_one` did, short of a fatal error (raised as an
/// exception): llama_decode's codes 0, 1, 2 and -1 as a value.
#[pyclass(name = "DecodeOutcome", module = "pyllama._core", frozen)]
pub struct PyDecodeOutcome {
    /// "ok", "no_slot" (nothing changed), "aborted" (the cache keeps the first `n_done`
    /// micro-batches) or "invalid_batch" (nothing changed; `reason` says why).
    #[pyo3(get)]
    kind: &'static str,
    /// Micro-batches finished: all of them when ok, those before the abort when aborted, 0 else.
    #[pyo3(get)]
    n_done: usize,
    #[pyo3(get)]
    reason: String,
}

impl From<Decoded> for PyDecodeOutcome {
    fn from(d: Decoded) -> Self {
        let (kind, n_done, reason) = match d {
            Decoded::Done { n_ubatches } => ("ok", n_ubatches, String::new()),
            Decoded::NoSlot => ("no_slot", 0, String::new()),
            Decoded::Aborted { n_done } => ("aborted", n_done, String::new()),
            Decoded::InvalidBatch(r) => ("invalid_batch", 0, r),
        };
        PyDecodeOutcome { kind, n_done, reason }
    }
}

#[pymethods]
impl PyDecodeOutcome {
    fn __repr__(&self) -> String {
        format!("DecodeOutcome(kind={:?}, n_done={}, reason={:?})", self.kind, self.n_done, self.reason)
    }
}

#[pymethods]
impl PyContext {
    #[new]
    #[pyo3(signature = (model, *, n_ctx, n_seq_max, n_ubatch, n_threads, n_threads_batch, n_rs_seq = 0, type_k = "f16",
                        type_v = "f16", kv_unified = true, swa_full = false, embeddings = false,
                        rope_freq_base = 0.0, rope_freq_scale = 0.0, flash_attn = true, offload_kqv = true))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        model: Py<PyModel>,
        n_ctx: usize,
        n_seq_max: usize,
        n_ubatch: usize,
        n_threads: usize,
        n_threads_batch: usize,
        n_rs_seq: usize,
        type_k: &str,
        type_v: &str,
        kv_unified: bool,
        swa_full: bool,
        embeddings: bool,
        rope_freq_base: f32,
        rope_freq_scale: f32,
        flash_attn: bool,
        offload_kqv: bool,
    ) -> PyResult<Self> {
        let p = ContextParams {
            n_ctx,
            n_seq_max,
            n_rs_seq,
            n_ubatch,
            n_threads,
            n_threads_batch,
            type_k: parse_cache_type(type_k).map_err(to_py)?,
            type_v: parse_cache_type(type_v).map_err(to_py)?,
            kv_unified,
            swa_full,
            embeddings,
            rope_freq_base,
            rope_freq_scale,
        };
        if !flash_attn && pyllama_core::kv_cache::is_quantized(p.type_v) {
            return Err(PyValueError::new_err(format!(
                "quantized V cache (type_v = {}) requires flash attention (flash_attn = True)",
                type_v.to_lowercase()
            )));
        }
        let m: Arc<pyllama_core::model::Model> = model.get().inner.clone();
        let mut inner = py.allow_threads(|| Context::new(m, p)).map_err(to_py)?;
        inner.kv.flash_attn = flash_attn;
        inner.kv.offload_kqv = offload_kqv;
        Ok(PyContext { inner, model })
    }

    /// llama.cpp's `offload_kqv`, as given: the KV cache of GPU-offloaded layers lives on the
    /// device and attention runs there (F32, F16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 caches; BF16 and
    /// IQ4_NL stay on the CPU).
    #[getter]
    fn offload_kqv(&self) -> bool {
        self.inner.kv.offload_kqv
    }

    /// Bytes of the KV cache held on the GPU (0 until a decode puts it there, and without
    /// `offload_kqv`, GPU offload, or a cache type the device handles).
    fn kv_gpu_bytes(&self) -> u64 {
        #[cfg(feature = "gpu")]
        {
            self.inner.kv.gpu.iter().map(|g| g.bytes()).sum()
        }
        #[cfg(not(feature = "gpu"))]
        0
    }

    #[getter]
    fn n_ctx(&self) -> usize {
        self.inner.params.n_ctx
    }
    /// Bytes of the KV cache's K and V storage, all layers and streams (llama.cpp's
    /// `llama_kv_cache: size = ...` line).
    fn kv_bytes(&self) -> usize {
        self.inner.kv.k.iter().chain(self.inner.kv.v.iter()).map(|b| b.len()).sum()
    }
    /// Bytes of the recurrent states (conv and scan states of every recurrent layer and
    /// sequence slot; llama.cpp's `llama_memory_recurrent: size = ...` line); 0 without.
    fn rs_bytes(&self) -> usize {
        self.inner.rs.as_ref().map_or(0, |r| r.n_bytes())
    }
    /// llama_memory_can_shift: false when cached keys cannot be re-roped (M-RoPE models).
    #[getter]
    fn can_shift(&self) -> bool {
        self.inner.can_shift()
    }
    /// "kv" (attention only), "recurrent" (one state per sequence, no KV cache) or
    /// "hybrid" (a KV cache for the attention layers, states for the others).
    #[getter]
    fn memory_kind(&self) -> &'static str {
        self.inner.mem_kind.name()
    }
    /// Cells per sequence stream (n_ctx when unified).
    #[getter]
    fn n_ctx_seq(&self) -> usize {
        self.inner.n_ctx_seq
    }
    /// Whether the model is an encoder (no KV cache; decode encodes the whole batch in one
    /// micro-batch).
    #[getter]
    fn is_encoder(&self) -> bool {
        self.inner.is_encoder()
    }

    /// The model's classifier head (rank pooling) over pooled vectors x [n, n_embd]:
    /// float32 [n, n_out].
    fn classify<'py>(&self, py: Python<'py>, x: numpy::PyReadonlyArray2<'py, f32>) -> PyResult<Bound<'py, PyArray2<f32>>> {
        let n = x.shape()[0];
        let ne = self.inner.model.hparams.n_embd;
        if x.shape()[1] != ne {
            return Err(PyValueError::new_err(format!("classify: x must be [n, {ne}]")));
        }
        let data = x.as_slice().map_err(|_| PyValueError::new_err("classify: x must be C-contiguous"))?.to_vec();
        let inner = &self.inner;
        let (out, w) = py.allow_threads(|| no_panic("classify", || inner.classify(&data, n).map_err(to_py)))?;
        let a = numpy::ndarray::Array2::from_shape_vec((n, w), out)
            .map_err(|e| PyValueError::new_err(format!("classify: {e}")))?;
        Ok(PyArray2::from_owned_array(py, a))
    }

    /// The model's dense projections after pooling (EmbeddingGemma's dense_2 / dense_3)
    /// over vectors x [n, n_embd]: float32 [n, n_embd], or None when the model has none.
    fn dense_out<'py>(&self, py: Python<'py>, x: numpy::PyReadonlyArray2<'py, f32>) -> PyResult<Option<Bound<'py, PyArray2<f32>>>> {
        let n = x.shape()[0];
        let ne = self.inner.model.hparams.n_embd;
        if x.shape()[1] != ne {
            return Err(PyValueError::new_err(format!("dense_out: x must be [n, {ne}]")));
        }
        let data = x.as_slice().map_err(|_| PyValueError::new_err("dense_out: x must be C-contiguous"))?.to_vec();
        let inner = &self.inner;
        let out = py.allow_threads(|| no_panic("dense_out", || inner.dense_out(&data, n).map_err(to_py)))?;
        out.map(|v| {
            let a = numpy::ndarray::Array2::from_shape_vec((n, ne), v).map_err(|e| PyValueError::new_err(format!("dense_out: {e}")))?;
            Ok(PyArray2::from_owned_array(py, a))
        })
        .transpose()
    }

    #[getter]
    fn n_ubatch(&self) -> usize {
        self.inner.params.n_ubatch
    }
    #[getter]
    fn n_seq_max(&self) -> usize {
        self.inner.params.n_seq_max
    }

    /// Rollback snapshots per sequence (0 where the model has none: the request is clamped).
    #[getter]
    fn n_rs_seq(&self) -> usize {
        self.inner.params.n_rs_seq
    }
    #[getter]
    fn n_threads(&self) -> usize {
        self.inner.params.n_threads
    }
    #[getter]
    fn n_threads_batch(&self) -> usize {
        self.inner.params.n_threads_batch
    }
    /// Parallel regions the thread pools have run (since creation or set_n_threads).
    #[getter]
    fn pool_regions(&self) -> u64 {
        self.inner.pool_regions()
    }
    #[getter]
    fn n_vocab(&self) -> usize {
        self.inner.n_vocab()
    }
    #[getter]
    fn n_embd(&self) -> usize {
        self.inner.model.hparams.n_embd
    }
    #[getter]
    fn type_k(&self) -> &'static str {
        self.inner.kv.type_k.name()
    }
    #[getter]
    fn type_v(&self) -> &'static str {
        self.inner.kv.type_v.name()
    }

    fn set_n_threads(&mut self, n_threads: usize, n_threads_batch: usize) {
        self.inner.set_n_threads(n_threads, n_threads_batch)
    }

    /// Run the micro-batches of one batch; a fatal error is an exception.
    #[pyo3(signature = (tokens, embd, pos, n_seq_id, seq_id, ubatches, out_rows, logits, hidden = None, abort = None))]
    #[allow(clippy::too_many_arguments)]
    fn decode(
        &mut self,
        py: Python<'_>,
        tokens: Option<Bound<'_, PyArray1<i32>>>,
        embd: Option<Bound<'_, PyArray2<f32>>>,
        pos: Bound<'_, PyArray1<i32>>,
        n_seq_id: Bound<'_, PyArray1<i32>>,
        seq_id: Bound<'_, PyArray2<i32>>,
        ubatches: Vec<Bound<'_, PyArray1<i32>>>,
        out_rows: Bound<'_, PyArray1<i32>>,
        logits: Bound<'_, PyArray2<f32>>,
        hidden: Option<Bound<'_, PyArray2<f32>>>,
        abort: Option<PyObject>,
    ) -> PyResult<PyDecodeOutcome> {
        if let Some(f) = &abort {
            if !f.bind(py).is_callable() {
                return Err(pyo3::exceptions::PyTypeError::new_err("decode: abort must be callable or None"));
            }
        }
        let tok = tokens.as_ref().map(|a| owned(a, "tokens")).transpose()?;
        let emb = embd.as_ref().map(|a| owned(a, "embd")).transpose()?;
        let pos_s = owned(&pos, "pos")?;
        let nsi = owned(&n_seq_id, "n_seq_id")?;
        let (sid, seq_cols) = (owned(&seq_id, "seq_id")?, seq_id.shape()[1]);
        let ubs: Vec<Vec<i32>> = ubatches.iter().map(|a| owned(a, "ubatches")).collect::<PyResult<_>>()?;
        let ub_refs: Vec<&[i32]> = ubs.iter().map(|c| c.as_slice()).collect();
        let orow = owned(&out_rows, "out_rows")?;
        let mut lg_w = out_buf(&logits, "decode: logits")?;
        let mut hd_w = hidden.as_ref().map(|h| out_buf(h, "decode: hidden")).transpose()?;
        let lg = lg_w.as_slice_mut().map_err(|_| PyValueError::new_err("decode: logits must be C-contiguous"))?;
        let hd = match hd_w.as_mut() {
            Some(h) => Some(h.as_slice_mut().map_err(|_| PyValueError::new_err("decode: hidden must be C-contiguous"))?),
            None => None,
        };
        let batch = BatchRef {
            tokens: tok.as_deref(),
            embd: emb.as_deref(),
            pos: &pos_s,
            n_seq_id: &nsi,
            seq_id: &sid,
            seq_cols,
        };
        let inner = &mut self.inner;
        let mut cb_err: Option<PyErr> = None;
        let r = py.allow_threads(|| {
            let mut ab = || -> bool {
                match &abort {
                    None => false,
                    Some(f) => Python::with_gil(|py| match f.call0(py).and_then(|r| r.is_truthy(py)) {
                        Ok(b) => b,
                        Err(e) => {
                            cb_err = Some(e);
                            true
                        }
                    }),
                }
            };
            no_panic("decode", || inner.decode(&batch, &ub_refs, &orow, lg, hd, &mut ab).map_err(to_py))
        });
        if let Some(e) = cb_err {
            return Err(e);
        }
        r.map(PyDecodeOutcome::from)
    }

    /// The token-generation step without the general call's arrays: `token` at the
    /// position after sequence 0's last, logits into `logits` (float32 [n_vocab], one row
    /// of the context's output buffer). Same work and outcome as `decode` with a one-token
    /// batch ("invalid_batch" when sequence 0 already ends at the largest int32 position);
    /// the caller has validated `token`.
    fn decode_one(&mut self, py: Python<'_>, token: i32, logits: Bound<'_, PyArray1<f32>>) -> PyResult<PyDecodeOutcome> {
        let mut lg_w = out_buf(&logits, "decode_one: logits")?;
        let lg = lg_w.as_slice_mut().map_err(|_| PyValueError::new_err("decode_one: logits must be C-contiguous"))?;
        let inner = &mut self.inner;
        let r = py.allow_threads(|| no_panic("decode_one", || inner.decode_one(token, lg).map_err(to_py)));
        r.map(PyDecodeOutcome::from)
    }

    #[pyo3(signature = (data = true))]
    fn memory_clear(&mut self, data: bool) {
        self.inner.mem_clear(data)
    }
    fn seq_rm(&mut self, seq_id: i32, p0: i32, p1: i32) -> PyResult<bool> {
        self.inner.mem_seq_rm(seq_id, p0, p1).map_err(to_py)
    }
    fn seq_cp(&mut self, src: i32, dst: i32, p0: i32, p1: i32) -> PyResult<()> {
        self.inner.mem_seq_cp(src, dst, p0, p1).map_err(to_py)
    }
    fn seq_keep(&mut self, seq_id: i32) -> PyResult<()> {
        self.inner.mem_seq_keep(seq_id).map_err(to_py)
    }
    fn seq_add(&mut self, seq_id: i32, p0: i32, p1: i32, delta: i32) -> PyResult<()> {
        self.inner.mem_seq_add(seq_id, p0, p1, delta).map_err(to_py)
    }
    fn seq_div(&mut self, seq_id: i32, p0: i32, p1: i32, d: i32) -> PyResult<()> {
        self.inner.mem_seq_div(seq_id, p0, p1, d).map_err(to_py)
    }
    fn seq_pos_min(&self, seq_id: i32) -> PyResult<i32> {
        self.inner.mem_seq_pos_min(seq_id).map_err(to_py)
    }
    fn seq_pos_max(&self, seq_id: i32) -> PyResult<i32> {
        self.inner.mem_seq_pos_max(seq_id).map_err(to_py)
    }

    /// Bytes `state_save` writes with the same arguments.
    #[pyo3(signature = (seq_id = None, flags = 0, out_rows = None, logits = None, embd = None, tokens = None))]
    fn state_size(
        &self,
        seq_id: Option<usize>,
        flags: u32,
        out_rows: Option<PyReadonlyArray1<'_, i32>>,
        logits: Option<numpy::PyReadonlyArray2<'_, f32>>,
        embd: Option<numpy::PyReadonlyArray2<'_, f32>>,
        tokens: Option<PyReadonlyArray1<'_, i32>>,
    ) -> PyResult<usize> {
        let (r, l, e, t) = (slice(&out_rows)?, slice2(&logits)?, slice2(&embd)?, slice(&tokens)?);
        let out = pyllama_core::state::Outputs { rows: r, logits: l, embd: e };
        self.inner.state_size(seq_id, flags, out, t).map_err(state_err)
    }

    /// The state of the whole context (seq_id None) or of one sequence: bytes, or, with
    /// `dst` (a writable uint8 array), written there and its length returned. `out_rows`
    /// [n_outputs] are the batch indices of the output rows, `logits` / `embd` their rows.
    #[pyo3(signature = (seq_id = None, flags = 0, out_rows = None, logits = None, embd = None, tokens = None, dst = None))]
    #[allow(clippy::too_many_arguments)]
    fn state_save(
        &mut self,
        py: Python<'_>,
        seq_id: Option<usize>,
        flags: u32,
        out_rows: Option<PyReadonlyArray1<'_, i32>>,
        logits: Option<numpy::PyReadonlyArray2<'_, f32>>,
        embd: Option<numpy::PyReadonlyArray2<'_, f32>>,
        tokens: Option<PyReadonlyArray1<'_, i32>>,
        dst: Option<Bound<'_, PyArray1<u8>>>,
    ) -> PyResult<PyObject> {
        let (r, l, e, t) = (slice(&out_rows)?, slice2(&logits)?, slice2(&embd)?, slice(&tokens)?);
        let inner = &mut self.inner;
        let n = {
            let out = pyllama_core::state::Outputs { rows: r, logits: l, embd: e };
            inner.state_size(seq_id, flags, out, t).map_err(state_err)?
        };
        if let Some(dst) = dst {
            let mut w = dst.try_readwrite().map_err(|e| PyValueError::new_err(format!("state_save: dst must be a writeable uint8 array not in use elsewhere ({e})")))?;
            let buf = w.as_slice_mut().map_err(|_| PyValueError::new_err("state_save: dst must be C-contiguous"))?;
            let out = pyllama_core::state::Outputs { rows: r, logits: l, embd: e };
            let done = py.allow_threads(|| no_panic("state_save", || inner.state_save(seq_id, flags, out, t, buf).map_err(state_err)))?;
            return Ok(done.into_pyobject(py)?.into_any().unbind());
        }
        let mut res: PyResult<usize> = Ok(0);
        let b = pyo3::types::PyBytes::new_with(py, n, |buf| {
            let out = pyllama_core::state::Outputs { rows: r, logits: l, embd: e };
            res = py.allow_threads(|| no_panic("state_save", || inner.state_save(seq_id, flags, out, t, buf).map_err(state_err)));
            Ok(())
        })?;
        res?;
        Ok(b.into_any().unbind())
    }

    /// Check `data` (a uint8 array) completely and, when `apply`, load it into the whole
    /// context (dest_seq_id None) or sequence `dest_seq_id`; a refused state raises
    /// StateError and changes nothing. Returns (bytes read, tokens int32, out_rows int32,
    /// logits float32 [n, n_vocab] or None, embd float32 [n, n_embd] or None).
    #[pyo3(signature = (data, *, n_batch, dest_seq_id = None, max_tokens = None, apply = true))]
    #[allow(clippy::type_complexity)]
    fn state_load<'py>(
        &mut self,
        py: Python<'py>,
        data: PyReadonlyArray1<'py, u8>,
        n_batch: usize,
        dest_seq_id: Option<usize>,
        max_tokens: Option<usize>,
        apply: bool,
    ) -> PyResult<(
        usize,
        Bound<'py, PyArray1<i32>>,
        Bound<'py, PyArray1<i32>>,
        Option<Bound<'py, PyArray2<f32>>>,
        Option<Bound<'py, PyArray2<f32>>>,
    )> {
        let owned;
        let d: &[u8] = match data.as_slice() {
            Ok(s) => s,
            Err(_) => {
                owned = data.as_array().iter().copied().collect::<Vec<u8>>();
                &owned
            }
        };
        let (nv, ne) = (self.inner.n_vocab(), self.inner.model.hparams.n_embd);
        let lim = pyllama_core::state::Limits { n_batch, max_tokens, n_vocab: nv, n_embd: ne };
        let inner = &mut self.inner;
        let p = py.allow_threads(|| no_panic("state_load", || inner.state_load(d, dest_seq_id, &lim, apply).map_err(state_err)))?;
        let rows2 = |v: Vec<f32>, w: usize| -> PyResult<Option<Bound<'py, PyArray2<f32>>>> {
            if v.is_empty() || w == 0 {
                return Ok(None);
            }
            let n = v.len() / w;
            Ok(Some(PyArray1::from_vec(py, v).reshape([n, w])?))
        };
        Ok((
            p.n_read,
            PyArray1::from_vec(py, p.tokens),
            PyArray1::from_vec(py, p.out_rows),
            rows2(p.logits, nv)?,
            rows2(p.embd, ne)?,
        ))
    }

    /// Replace the LoRA adapters: [(adapter, scale), ...] in order (zero scales are
    /// dropped; [] restores the plain forward pass). On error nothing changes.
    fn set_loras(&mut self, adapters: Vec<(Py<PyLoraAdapter>, f32)>) -> PyResult<()> {
        let v = adapters.iter().map(|(a, s)| (a.get().inner.clone(), *s)).collect();
        self.inner.set_loras(v).map_err(to_py)
    }

    /// The adapters' paths and scales as set (zero scales dropped).
    fn lora_paths(&self) -> Vec<(String, f32)> {
        self.inner.loras().iter().map(|(a, s)| (a.path.clone(), *s)).collect()
    }

    /// llama_set_adapter_cvec: `data` float32 [n_embd * k] holds layers 1..=k (None
    /// disables the vector); applied to layers il_start..=il_end. On error nothing changes.
    #[pyo3(signature = (data, n_embd, il_start, il_end))]
    fn set_cvec(&mut self, data: Option<PyReadonlyArray1<'_, f32>>, n_embd: i32, il_start: i32, il_end: i32) -> PyResult<()> {
        let d = match &data {
            None => None,
            Some(a) => Some(a.as_slice().map_err(|_| PyValueError::new_err("set_cvec: data must be C-contiguous"))?),
        };
        self.inner.set_cvec(d, n_embd, il_start, il_end).map_err(to_py)
    }

    /// Keep the named intermediates (llama.cpp names: "attn_norm-0", "Qcur-3",
    /// "kqv_out-0", "ffn_out-0", "l_out-0", "result_norm", "result_output"; "*" = all)
    /// of every following decode; None turns the dump off.
    #[pyo3(signature = (names = None))]
    fn set_debug_dump(&mut self, names: Option<Vec<String>>) {
        self.inner.set_debug_dump(names)
    }

    /// The intermediates of the last decode: name -> float32 [rows, width] (rows of all
    /// its micro-batches, in compute order).
    fn debug_dump<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        if let Some(dbg) = &self.inner.debug {
            for (k, (data, w)) in &dbg.dumps {
                let rows = if *w > 0 { data.len() / w } else { 0 };
                let a = numpy::PyArray1::from_slice(py, data).reshape([rows, *w])?;
                let a: Bound<'py, PyArray2<f32>> = a;
                d.set_item(k, a)?;
            }
        }
        Ok(d)
    }
}

/// A LoRA adapter loaded for one model (llama_adapter_lora): checked against the model
/// when loaded, applied by `Context.set_loras` without changing the model's weights.
#[pyclass(name = "LoraAdapter", module = "pyllama._core", frozen)]
pub struct PyLoraAdapter {
    inner: Arc<LoraAdapter>,
    #[pyo3(get)]
    model: Py<PyModel>,
}

#[pymethods]
impl PyLoraAdapter {
    /// Read `path` and check it against `model` (general.type adapter, adapter.type lora,
    /// the model's architecture, a base tensor of the right shape for every A/B pair).
    #[new]
    fn new(py: Python<'_>, model: Py<PyModel>, path: std::path::PathBuf) -> PyResult<Self> {
        let m = model.get().inner.clone();
        let p = path.to_string_lossy().into_owned();
        let inner = py.allow_threads(|| no_panic_core(|| LoraAdapter::load(&m, &p))).map_err(to_py)?;
        Ok(PyLoraAdapter { inner: Arc::new(inner), model })
    }

    /// An adapter from the bytes of a GGUF file (llama_adapter_lora_init_from_file_ptr);
    /// `name` is used in messages.
    #[staticmethod]
    fn from_bytes(py: Python<'_>, model: Py<PyModel>, data: &[u8], name: String) -> PyResult<Self> {
        let m = model.get().inner.clone();
        let inner = py.allow_threads(|| no_panic_core(|| LoraAdapter::from_bytes(&m, &name, data))).map_err(to_py)?;
        Ok(PyLoraAdapter { inner: Arc::new(inner), model })
    }

    #[getter]
    fn path(&self) -> &str {
        &self.inner.path
    }

    /// `adapter.lora.alpha` (0 when absent: the scale is then the user's scale as is).
    #[getter]
    fn alpha(&self) -> f32 {
        self.inner.alpha
    }

    #[getter]
    fn alora_invocation_tokens(&self) -> Vec<i32> {
        self.inner.alora_invocation_tokens.clone()
    }

    /// Base weight name -> rank, for every adapted weight (token_embd included).
    fn ranks(&self) -> Vec<(String, usize)> {
        let mut v: Vec<(String, usize)> = self.inner.weights.iter().map(|(k, w)| (k.clone(), w.rank())).collect();
        if let Some(e) = &self.inner.embd {
            v.push(("token_embd.weight".to_string(), e.rank()));
        }
        v.sort();
        v
    }

    /// The file's metadata (arrays included when `arrays`).
    #[pyo3(signature = (arrays = true))]
    fn metadata<'py>(&self, py: Python<'py>, arrays: bool) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for (k, v) in &self.inner.file.metadata {
            if arrays || !matches!(v, pyllama_core::gguf::Value::Array(_)) {
                d.set_item(k, crate::gguf::value_to_py(py, v)?)?;
            }
        }
        Ok(d)
    }
}

/// Core errors out of `f`, and a panic (a pyllama bug) as an error too.
fn no_panic_core<T>(f: impl FnOnce() -> pyllama_core::Result<T>) -> pyllama_core::Result<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))
        .unwrap_or_else(|_| Err(pyllama_core::Error::Invalid("internal error (a pyllama bug) while loading a LoRA adapter".into())))
}

/// Positions (int64 [min(k, n)]) of the k largest logits of a float32 row, largest first,
/// ties by lower position, NaN last: the candidate step of top-k (pyllama.sampling), in one
/// pass instead of a handful of numpy calls per token.
#[pyfunction]
fn top_k_indices<'py>(py: Python<'py>, logits: Bound<'py, PyArray1<f32>>, k: usize) -> PyResult<Bound<'py, numpy::PyArray1<i64>>> {
    let logits = in_row(&logits, "top_k_indices: logits")?;
    let idx = match logits.as_slice() {
        Ok(s) => pyllama_core::sampling::top_k_indices(s, k),
        Err(_) => {
            let v: Vec<f32> = logits.as_array().iter().copied().collect();
            pyllama_core::sampling::top_k_indices(&v, k)
        }
    };
    let out: Vec<i64> = idx.into_iter().map(i64::from).collect();
    Ok(numpy::PyArray1::from_vec(py, out))
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyContext>()?;
    m.add_class::<PyDecodeOutcome>()?;
    m.add_class::<PyLoraAdapter>()?;
    m.add_function(wrap_pyfunction!(top_k_indices, m)?)?;
    Ok(())
}
