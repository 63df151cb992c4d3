//! The samplers' math for Python (pyllama.sampling): `SamplerState` (one built-in sampler:
//! parameters and state; `apply` one array, `accept`, `reset`), `StdRng` (llama.cpp's
//! std::mt19937 draws), and the chain calls: a list of SamplerState applied to one row (or
//! one candidate array) in one call. Candidate arrays cross as numpy arrays (ids int32,
//! logits / p float32).

use std::collections::{HashMap, VecDeque};

use numpy::{PyArray1, PyReadonlyArray1};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyList;
use pyllama_core::sampling::rng::StdRng;
use pyllama_core::sampling::samplers::{self as smp, Candidates, Sampler};

fn vec_of<T: numpy::Element + Copy>(a: &PyReadonlyArray1<'_, T>) -> Vec<T> {
    match a.as_slice() {
        Ok(s) => s.to_vec(),
        Err(_) => a.as_array().iter().copied().collect(),
    }
}

type Out<'py> = (Bound<'py, PyArray1<i32>>, Bound<'py, PyArray1<f32>>, Bound<'py, PyArray1<f32>>, i64, bool);

fn out(py: Python<'_>, c: Candidates) -> Out<'_> {
    (PyArray1::from_vec(py, c.ids), PyArray1::from_vec(py, c.logits), PyArray1::from_vec(py, c.p), c.selected, c.sorted)
}

fn cands(ids: PyReadonlyArray1<'_, i32>, logits: PyReadonlyArray1<'_, f32>, p: PyReadonlyArray1<'_, f32>, selected: i64, sorted: bool) -> PyResult<Candidates> {
    let (ids, logits, p) = (vec_of(&ids), vec_of(&logits), vec_of(&p));
    if ids.len() != logits.len() || p.len() != logits.len() {
        return Err(PyValueError::new_err(format!(
            "candidates: ids [{}], logits [{}] and p [{}] must have the same length",
            ids.len(),
            logits.len(),
            p.len()
        )));
    }
    Ok(Candidates { ids, logits, p, selected, sorted })
}

fn f32_of(x: f64) -> f32 {
    x as f32
}

/// One built-in sampler of llama.cpp (see `pyllama_core::sampling::samplers`): made by the
/// static constructors, named after llama.h's `llama_sampler_init_*`.
#[pyclass(name = "SamplerState", module = "pyllama._core")]
#[derive(Clone)]
pub struct PySamplerState {
    inner: Sampler,
}

fn st(inner: Sampler) -> PySamplerState {
    PySamplerState { inner }
}

#[pymethods]
impl PySamplerState {
    #[staticmethod]
    fn greedy() -> Self {
        st(Sampler::Greedy)
    }
    #[staticmethod]
    fn dist(seed: u32) -> Self {
        st(Sampler::Dist { rng: StdRng::new(seed) })
    }
    #[staticmethod]
    fn top_k(k: i64) -> Self {
        st(Sampler::TopK { k })
    }
    #[staticmethod]
    fn top_p(p: f64, min_keep: i64) -> Self {
        st(Sampler::TopP { p: f32_of(p), min_keep })
    }
    #[staticmethod]
    fn min_p(p: f64, min_keep: i64) -> Self {
        st(Sampler::MinP { p: f32_of(p), min_keep })
    }
    #[staticmethod]
    fn typical(p: f64, min_keep: i64) -> Self {
        st(Sampler::Typical { p: f32_of(p), min_keep })
    }
    #[staticmethod]
    fn temp(t: f64) -> Self {
        st(Sampler::Temp { t: f32_of(t) })
    }
    #[staticmethod]
    fn temp_ext(t: f64, delta: f64, exponent: f64) -> Self {
        st(Sampler::TempExt { t: f32_of(t), delta: f32_of(delta), exponent: f32_of(exponent) })
    }
    #[staticmethod]
    fn xtc(p: f64, t: f64, min_keep: i64, seed: u32) -> Self {
        st(Sampler::Xtc { p: f32_of(p), t: f32_of(t), min_keep, rng: StdRng::new(seed) })
    }
    #[staticmethod]
    fn top_n_sigma(n: f64) -> Self {
        st(Sampler::TopNSigma { n: f32_of(n) })
    }
    #[staticmethod]
    fn mirostat(n_vocab: i32, seed: u32, tau: f64, eta: f64, m: i32) -> Self {
        let tau = f32_of(tau);
        st(Sampler::Mirostat { n_vocab, tau, eta: f32_of(eta), m, mu: 2.0 * tau, rng: StdRng::new(seed) })
    }
    #[staticmethod]
    fn mirostat_v2(seed: u32, tau: f64, eta: f64) -> Self {
        let tau = f32_of(tau);
        st(Sampler::MirostatV2 { tau, eta: f32_of(eta), mu: 2.0 * tau, rng: StdRng::new(seed) })
    }
    #[staticmethod]
    fn penalties(last_n: usize, repeat: f64, freq: f64, present: f64) -> Self {
        st(Sampler::Penalties {
            last_n,
            repeat: f32_of(repeat),
            freq: f32_of(freq),
            present: f32_of(present),
            prev: VecDeque::new(),
            counts: HashMap::new(),
        })
    }
    /// `breakers`: head token -> the tails (token lists) that complete a sequence breaker.
    #[staticmethod]
    fn dry(multiplier: f64, base: f64, allowed_length: i64, penalty_last_n: usize, breakers: HashMap<i32, Vec<Vec<i32>>>) -> Self {
        let params = smp::Dry { multiplier: f32_of(multiplier), base: f32_of(base), allowed_length, penalty_last_n, breakers };
        st(Sampler::Dry { params, last: VecDeque::new() })
    }
    #[staticmethod]
    fn adaptive_p(target: f64, decay: f64, seed: u32) -> Self {
        st(Sampler::AdaptiveP { state: smp::AdaptiveP::new(f32_of(target), f32_of(decay)), rng: StdRng::new(seed) })
    }
    #[staticmethod]
    fn logit_bias(biases: Vec<(i32, f64)>) -> Self {
        st(Sampler::LogitBias { biases: biases.into_iter().map(|(t, b)| (t, f32_of(b))).collect() })
    }

    /// Applies the sampler to one candidate array; returns the new (ids, logits, p,
    /// selected, sorted).
    fn apply<'py>(
        &mut self,
        py: Python<'py>,
        ids: PyReadonlyArray1<'py, i32>,
        logits: PyReadonlyArray1<'py, f32>,
        p: PyReadonlyArray1<'py, f32>,
        selected: i64,
        sorted: bool,
    ) -> PyResult<Out<'py>> {
        let mut c = cands(ids, logits, p, selected, sorted)?;
        self.inner.apply(&mut c);
        Ok(out(py, c))
    }

    fn accept(&mut self, token: i32) {
        self.inner.accept(token)
    }

    /// Back to the built state; an RNG is reseeded with `seed`.
    fn reset(&mut self, seed: u32) {
        self.inner.reset(seed)
    }

    /// Mirostat's current target surprise (None for other samplers).
    #[getter]
    fn mu(&self) -> Option<f32> {
        match &self.inner {
            Sampler::Mirostat { mu, .. } | Sampler::MirostatV2 { mu, .. } => Some(*mu),
            _ => None,
        }
    }

    /// Adaptive-p's EMA: (weighted sum, total weight) (None for other samplers).
    #[getter]
    fn ema(&self) -> Option<(f32, f32)> {
        match &self.inner {
            Sampler::AdaptiveP { state, .. } => Some((state.weighted_sum, state.total_weight)),
            _ => None,
        }
    }

    /// Tokens in the penalty / DRY history, oldest first (empty for other samplers).
    #[getter]
    fn history(&self) -> Vec<i32> {
        match &self.inner {
            Sampler::Penalties { prev, .. } => prev.iter().copied().collect(),
            Sampler::Dry { last, .. } => last.iter().copied().collect(),
            _ => Vec::new(),
        }
    }

    fn __copy__(&self) -> Self {
        self.clone()
    }

    fn __deepcopy__(&self, _memo: &Bound<'_, PyAny>) -> Self {
        self.clone()
    }
}

fn states<'py>(samplers: &Bound<'py, PyList>) -> PyResult<Vec<Bound<'py, PySamplerState>>> {
    samplers
        .iter()
        .map(|s| s.downcast_into::<PySamplerState>().map_err(|e| PyTypeError::new_err(format!("sampler chain: {e}"))))
        .collect()
}

/// Applies a chain of SamplerState to one row of logits (float32 [n_vocab]) and accepts the
/// selected token in each; returns (token or -1 when none was selected, ids, logits, p,
/// selected, sorted) of the final candidates.
#[pyfunction]
fn sampler_chain_sample<'py>(
    py: Python<'py>,
    samplers: &Bound<'py, PyList>,
    logits: PyReadonlyArray1<'py, f32>,
) -> PyResult<(i32, Out<'py>)> {
    let chain = states(samplers)?;
    let row = logits.as_slice().map_err(|_| PyValueError::new_err("sampler_chain_sample: logits must be C-contiguous"))?;
    let (mut cur, skip) = match chain.first() {
        Some(s) => smp::start(row, Some(&s.borrow().inner)),
        None => smp::start(row, None),
    };
    for s in chain.iter().skip(skip) {
        s.borrow_mut().inner.apply(&mut cur);
    }
    let token = cur.token();
    if let Some(t) = token {
        for s in &chain {
            s.borrow_mut().inner.accept(t);
        }
    }
    Ok((token.unwrap_or(-1), out(py, cur)))
}

/// Applies a chain of SamplerState to one candidate array; returns the new (ids, logits,
/// p, selected, sorted).
#[pyfunction]
fn sampler_chain_apply<'py>(
    py: Python<'py>,
    samplers: &Bound<'py, PyList>,
    ids: PyReadonlyArray1<'py, i32>,
    logits: PyReadonlyArray1<'py, f32>,
    p: PyReadonlyArray1<'py, f32>,
    selected: i64,
    sorted: bool,
) -> PyResult<Out<'py>> {
    let chain = states(samplers)?;
    let mut c = cands(ids, logits, p, selected, sorted)?;
    for s in &chain {
        s.borrow_mut().inner.apply(&mut c);
    }
    Ok(out(py, c))
}

/// `llama_sampler_softmax_impl(cur_p, do_sort)` on one candidate array.
#[pyfunction]
fn sampler_softmax<'py>(
    py: Python<'py>,
    ids: PyReadonlyArray1<'py, i32>,
    logits: PyReadonlyArray1<'py, f32>,
    p: PyReadonlyArray1<'py, f32>,
    selected: i64,
    sorted: bool,
    do_sort: bool,
) -> PyResult<Out<'py>> {
    let mut c = cands(ids, logits, p, selected, sorted)?;
    if c.is_empty() {
        return Err(PyValueError::new_err("softmax of an empty candidate list"));
    }
    smp::softmax(&mut c, do_sort);
    Ok(out(py, c))
}

/// llama.cpp's infill sampler on one candidate array: `eog` the vocabulary's
/// end-of-generation ids, `pieces` each candidate's text by id, `eot` the EOT token (EOS
/// without one; -1: none).
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn sampler_infill<'py>(
    py: Python<'py>,
    ids: PyReadonlyArray1<'py, i32>,
    logits: PyReadonlyArray1<'py, f32>,
    p: PyReadonlyArray1<'py, f32>,
    selected: i64,
    sorted: bool,
    eog: std::collections::HashSet<i32>,
    pieces: HashMap<i32, Vec<u8>>,
    eot: i32,
) -> PyResult<Out<'py>> {
    let mut c = cands(ids, logits, p, selected, sorted)?;
    smp::infill(&mut c, |t| eog.contains(&t), |t| pieces.get(&t).cloned().unwrap_or_default(), eot).map_err(PyValueError::new_err)?;
    Ok(out(py, c))
}

/// C's `int(k)` for a float as the CPU converts it (`x86`: cvttss2si, else saturating).
#[pyfunction]
fn sampler_c_int(k: f32, x86: bool) -> i32 {
    smp::c_int(k, x86)
}

/// The float functions the samplers use, elementwise on float32: "expf", "logf", "log2f"
/// (the C library's, as llama.cpp calls them).
#[pyfunction]
fn sampler_libm<'py>(py: Python<'py>, name: &str, x: PyReadonlyArray1<'py, f32>) -> PyResult<Bound<'py, PyArray1<f32>>> {
    let f: fn(f32) -> f32 = match name {
        "expf" => f32::exp,
        "logf" => f32::ln,
        "log2f" => f32::log2,
        _ => return Err(PyValueError::new_err(format!("sampler_libm: unknown function {name:?} (expf, logf, log2f)"))),
    };
    Ok(PyArray1::from_vec(py, x.as_array().iter().map(|&v| f(v)).collect()))
}

/// `powf(x, y)` as the samplers compute it.
#[pyfunction]
fn sampler_powf(x: f32, y: f32) -> f32 {
    x.powf(y)
}

/// std::mt19937 with libstdc++'s conversions to floats (llama.cpp's samplers' draws).
#[pyclass(name = "StdRng", module = "pyllama._core")]
#[derive(Clone)]
pub struct PyStdRng {
    inner: StdRng,
}

#[pymethods]
impl PyStdRng {
    #[new]
    fn new(seed: u64) -> Self {
        PyStdRng { inner: StdRng::new(seed as u32) }
    }
    /// `rng.seed(s)` (the low 32 bits).
    fn seed(&mut self, seed: u64) {
        self.inner.seed(seed as u32)
    }
    fn next_u32(&mut self) -> u32 {
        self.inner.next_u32()
    }
    /// `uniform_real_distribution<double>(0, 1)`.
    fn uniform_double(&mut self) -> f64 {
        self.inner.uniform_double()
    }
    /// `uniform_real_distribution<float>(0, 1)`.
    fn uniform_float(&mut self) -> f32 {
        self.inner.uniform_float()
    }
    /// `std::discrete_distribution<int>(p)(rng)` (fewer than two weights: 0, no draw).
    fn discrete(&mut self, p: Vec<f32>) -> usize {
        self.inner.discrete(&p)
    }
    fn __copy__(&self) -> Self {
        self.clone()
    }
    fn __deepcopy__(&self, _memo: &Bound<'_, PyAny>) -> Self {
        self.clone()
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PySamplerState>()?;
    m.add_class::<PyStdRng>()?;
    m.add_function(wrap_pyfunction!(sampler_chain_sample, m)?)?;
    m.add_function(wrap_pyfunction!(sampler_chain_apply, m)?)?;
    m.add_function(wrap_pyfunction!(sampler_softmax, m)?)?;
    m.add_function(wrap_pyfunction!(sampler_infill, m)?)?;
    m.add_function(wrap_pyfunction!(sampler_c_int, m)?)?;
    m.add_function(wrap_pyfunction!(sampler_libm, m)?)?;
    m.add_function(wrap_pyfunction!(sampler_powf, m)?)?;
    Ok(())
}
