//! Importance-matrix collection (llama-imatrix's `IMatrixCollector::collect_imatrix`): per
//! matmul weight, the sum over tokens of each input column's squared activation, and the
//! number of tokens seen, per expert for expert (3-D) weights.
//!
//! The forward pass reports its matmul inputs through `observe` / `observe_experts`, which
//! cost one thread-local read when no collection runs. A collection belongs to the thread
//! that started it (`begin`), which is the thread that runs `Context::decode` (the matmul
//! builders run on the decoding thread; only the kernels fan out to the pool), so contexts
//! decoding on other threads are never recorded.
//!
//! Rules as llama.cpp's: a dense matmul counts when its weight is a `blk.*` tensor (or
//! `output.weight` with `process_output`) and it multiplies at least 16 rows; expert
//! matmuls always count, their rows accumulated slot by slot (ggml's MUL_MAT_ID order);
//! sums are f32, added token by token in batch order.

use crate::model::TensorView;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};

#[derive(Clone, Debug, Default)]
pub struct Stats {
    /// [n_mat][n_in] sums of x^2.
    pub values: Vec<f32>,
    /// Tokens per matrix (one entry for dense weights).
    pub counts: Vec<i64>,
}

#[derive(Debug, Default)]
pub struct Collector {
    pub stats: BTreeMap<String, Stats>,
    pub process_output: bool,
    /// The first non-finite sum met (llama-imatrix exits on it).
    pub non_finite: Option<String>,
}

thread_local! {
    static ACTIVE: RefCell<Option<Collector>> = const { RefCell::new(None) };
}
static N_ACTIVE: AtomicUsize = AtomicUsize::new(0);

/// Start collecting on this thread (replacing a collection in progress here).
pub fn begin(process_output: bool) {
    ACTIVE.with(|a| {
        let mut a = a.borrow_mut();
        if a.is_none() {
            N_ACTIVE.fetch_add(1, Ordering::SeqCst);
        }
        *a = Some(Collector { process_output, ..Default::default() });
    });
}

/// Stop collecting on this thread and return what was collected.
pub fn end() -> Option<Collector> {
    ACTIVE.with(|a| {
        let c = a.borrow_mut().take();
        if c.is_some() {
            N_ACTIVE.fetch_sub(1, Ordering::SeqCst);
        }
        c
    })
}

/// True while this thread collects (the forward passes then keep every matmul on the
/// paths that report to it).
pub fn is_active() -> bool {
    N_ACTIVE.load(Ordering::Relaxed) != 0 && ACTIVE.with(|a| a.borrow().is_some())
}

#[inline(always)]
fn with_active(f: impl FnOnce(&mut Collector)) {
    if N_ACTIVE.load(Ordering::Relaxed) == 0 {
        return;
    }
    ACTIVE.with(|a| {
        if let Some(c) = a.borrow_mut().as_mut() {
            f(c)
        }
    });
}

fn accumulate(acc: &mut [f32], x: &[f32]) {
    for (a, &v) in acc.iter_mut().zip(x) {
        *a += v * v;
    }
}

/// A dense matmul `w` x over `n` rows of `x` (row length w.ne[0]). Expert weights are
/// reported through `observe_experts` instead and ignored here.
#[inline]
pub fn observe(w: &TensorView, x: &[f32], n: usize) {
    with_active(|c| {
        if w.ne[2] * w.ne[3] != 1 || n < 16 {
            return;
        }
        if !(w.name.starts_with("blk.") || (c.process_output && w.name == "output.weight")) {
            return;
        }
        let ne0 = w.ne[0];
        let e = c.stats.entry(w.name.to_string()).or_default();
        if e.values.is_empty() {
            e.values = vec![0.0; ne0];
            e.counts = vec![0];
        }
        if e.values.len() != ne0 {
            return;
        }
        for r in x[..n * ne0].chunks_exact(ne0) {
            accumulate(&mut e.values, r);
        }
        e.counts[0] += n as i64;
        if c.non_finite.is_none() && !e.values.iter().all(|v| v.is_finite()) {
            c.non_finite = Some(w.name.to_string());
        }
    });
}

/// Expert `expert` of the 3-D weight `w` applied to the rows of `x` (row length w.ne[0]);
/// `slots[r]` is row r's (token * n_used + selection) slot. ggml's MUL_MAT_ID collection
/// adds selection 0 of every token first, then selection 1, ...; the rows are taken in
/// that order here.
pub fn observe_experts(w: &TensorView, expert: usize, x: &[f32], slots: &[usize], n_used: usize) {
    with_active(|c| {
        let (ne0, n_as) = (w.ne[0], w.ne[2]);
        let e = c.stats.entry(w.name.to_string()).or_default();
        if e.values.is_empty() {
            e.values = vec![0.0; ne0 * n_as];
            e.counts = vec![0; n_as];
        }
        if e.values.len() != ne0 * n_as || expert >= n_as {
            return;
        }
        let mut order: Vec<usize> = (0..slots.len()).collect();
        order.sort_by_key(|&r| (slots[r] % n_used.max(1), slots[r] / n_used.max(1)));
        let acc = &mut e.values[expert * ne0..(expert + 1) * ne0];
        for r in order {
            accumulate(acc, &x[r * ne0..(r + 1) * ne0]);
        }
        e.counts[expert] += slots.len() as i64;
        if c.non_finite.is_none() && !acc.iter().all(|v| v.is_finite()) {
            c.non_finite = Some(w.name.to_string());
        }
    });
}

/// Write a collection in llama-imatrix's GGUF format (names sorted; per entry
/// `NAME.in_sum2` [n_in, n_mat] and `NAME.counts` [1, n_mat], F32).
pub fn save(path: &str, stats: &BTreeMap<String, Stats>, datasets: &[String], chunk_count: u32, chunk_size: u32) -> crate::Result<()> {
    use crate::gguf::{vtype, Array, Value};
    let kv: Vec<(String, Value)> = vec![
        ("general.type".into(), Value::String(b"imatrix".to_vec())),
        (
            "imatrix.datasets".into(),
            Value::Array(
                Array::from_values(vtype::STRING, &datasets.iter().map(|d| Value::String(d.as_bytes().to_vec())).collect::<Vec<_>>())
                    .expect("strings"),
            ),
        ),
        ("imatrix.chunk_count".into(), Value::U32(chunk_count)),
        ("imatrix.chunk_size".into(), Value::U32(chunk_size)),
    ];
    let mut tensors: Vec<(String, [u64; 4], Vec<f32>)> = Vec::new();
    for (name, s) in stats {
        let nmat = s.counts.len();
        if s.values.is_empty() || nmat == 0 {
            continue;
        }
        tensors.push((format!("{name}.in_sum2"), [(s.values.len() / nmat) as u64, nmat as u64, 1, 1], s.values.clone()));
        tensors.push((format!("{name}.counts"), [1, nmat as u64, 1, 1], s.counts.iter().map(|&c| c as f32).collect()));
    }
    super::write_gguf_f32(path, &kv, &tensors)
}
