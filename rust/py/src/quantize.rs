//! `quantize_model` (llama-quantize), `quantize_types` (its per-tensor type choice, for
//! tests and dry runs), `quantize_ftypes` and `load_imatrix`. Heavy work runs without the GIL;
//! the progress callback takes it back per tensor.

use crate::errors::to_py;
use pyllama_core::ggml_type::GgmlType;
use pyllama_core::gguf::Value;
use pyllama_core::quantize::{self as qz, imatrix, select};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use numpy::PyArrayMethods;
use pyo3::types::PyDict;

fn ggml_type(name: &str, what: &str) -> PyResult<GgmlType> {
    GgmlType::from_name(name).ok_or_else(|| PyValueError::new_err(format!("{what}: unknown ggml type '{name}'")))
}

fn ftype_of(name: &str) -> PyResult<select::Ftype> {
    select::parse_ftype(name).ok_or_else(|| PyValueError::new_err(format!("invalid ftype '{name}'")))
}

/// Quantize the GGUF model `input` into `output` as llama-quantize does (same bytes).
/// `ftype` is a llama-quantize type name (Q4_K_M, Q8_0, ...) or number. `progress(dict)`
/// is called after each tensor (index, total, name, shape, src_type, dst_type, src_bytes,
/// dst_bytes, note); an exception from it stops the run and is raised. Returns a summary
/// dict (size_before, size_after, n_elements, n_tensors, n_fallback, outputs, warnings).
#[pyfunction]
#[pyo3(signature = (input, output, ftype, *, n_threads = 1, allow_requantize = false, leave_output_tensor = false,
    pure = false, output_tensor_type = None, token_embedding_type = None, keep_split = false, imatrix = None,
    include_weights = Vec::new(), exclude_weights = Vec::new(), tensor_types = Vec::new(), kv_overrides = Vec::new(), prune_layers = Vec::new(), dry_run = false, progress = None))]
#[allow(clippy::too_many_arguments)]
fn quantize_model<'py>(
    py: Python<'py>,
    input: std::path::PathBuf,
    output: std::path::PathBuf,
    ftype: &str,
    n_threads: usize,
    allow_requantize: bool,
    leave_output_tensor: bool,
    pure: bool,
    output_tensor_type: Option<&str>,
    token_embedding_type: Option<&str>,
    keep_split: bool,
    imatrix: Option<std::path::PathBuf>,
    include_weights: Vec<String>,
    exclude_weights: Vec<String>,
    tensor_types: Vec<(String, String)>,
    kv_overrides: Vec<(String, String, Bound<'py, PyAny>)>,
    prune_layers: Vec<u32>,
    dry_run: bool,
    progress: Option<PyObject>,
) -> PyResult<Bound<'py, PyDict>> {
    let ft = ftype_of(ftype)?;
    if !include_weights.is_empty() && !exclude_weights.is_empty() {
        return Err(PyValueError::new_err("include_weights and exclude_weights cannot be used together"));
    }
    if imatrix.is_none() && !(include_weights.is_empty() && exclude_weights.is_empty()) {
        return Err(PyValueError::new_err("include_weights / exclude_weights need an imatrix"));
    }
    let sel = select::SelectParams {
        ftype: ft.id,
        output_tensor_type: output_tensor_type.map(|t| ggml_type(t, "output_tensor_type")).transpose()?,
        token_embedding_type: token_embedding_type.map(|t| ggml_type(t, "token_embedding_type")).transpose()?,
        quantize_output_tensor: !leave_output_tensor,
        only_copy: ft.name == "COPY",
        pure,
        has_imatrix: false,
        tensor_types: Vec::new(),
        tensor_type_matcher: None,
    };
    let mut sel = sel;
    if !tensor_types.is_empty() {
        // llama.cpp searches names with std::regex (ECMAScript); Python's re.search agrees on
        // the subset used in practice (literals, ., [], |, \d, anchors, groups, quantifiers).
        let re = py.import("re")?;
        let mut compiled: Vec<PyObject> = Vec::new();
        for (pat, ty) in &tensor_types {
            let c = re.call_method1("compile", (pat,)).map_err(|e| {
                PyValueError::new_err(format!("tensor_types: invalid regular expression '{pat}': {}", e.value(py)))
            })?;
            compiled.push(c.unbind());
            sel.tensor_types.push((pat.clone(), ggml_type(ty, &format!("tensor_types '{pat}'"))?));
        }
        let compiled = std::sync::Arc::new(compiled);
        sel.tensor_type_matcher = Some(select::TensorTypeMatcher(std::sync::Arc::new(move |i: usize, name: &str| {
            Python::with_gil(|py| {
                compiled[i]
                    .call_method1(py, "search", (name,))
                    .map(|m| !m.is_none(py))
                    .unwrap_or(false)
            })
        })));
    }
    // llama-quantize's --override-kv, written as llama_model_quantize_impl does: int as u32
    // of its absolute value, float as f32; then the imatrix keys.
    let user_kv = kv_overrides;
    let mut kv_overrides = Vec::new();
    for (key, tag, v) in &user_kv {
        if key.is_empty() || key.len() >= 128 {
            return Err(PyValueError::new_err(format!("kv_overrides: key '{key}' must have 1 to 127 bytes")));
        }
        let bad = |e: PyErr| PyValueError::new_err(format!("kv_overrides {key}: {tag} value: {}", e.value(py)));
        let val = match tag.as_str() {
            "int" => Value::U32(v.extract::<i64>().map_err(bad)?.unsigned_abs() as u32),
            "float" => Value::F32(v.extract::<f64>().map_err(bad)? as f32),
            "bool" => Value::Bool(v.extract::<bool>().map_err(bad)?),
            "str" => {
                let s: String = v.extract().map_err(bad)?;
                if s.len() > 127 {
                    return Err(PyValueError::new_err(format!("kv_overrides {key}: a str value has at most 127 bytes")));
                }
                Value::String(s.into_bytes())
            }
            _ => return Err(PyValueError::new_err(format!("kv_overrides {key}: type '{tag}' is not int, float, bool or str"))),
        };
        kv_overrides.push((key.clone(), val));
    }
    let mut weights = None;
    if let Some(path) = &imatrix {
        let p = path.to_string_lossy().into_owned();
        let im = py.allow_threads(|| imatrix::load(&p)).map_err(to_py)?;
        if !im.is_legacy && !im.has_metadata {
            return Err(PyValueError::new_err(format!("missing imatrix metadata in file {p}")));
        }
        let mut w = im.weights();
        if !exclude_weights.is_empty() {
            w.retain(|k, _| !exclude_weights.iter().any(|x| k.contains(x.as_str())));
        }
        if !include_weights.is_empty() {
            w.retain(|k, _| include_weights.iter().any(|x| k.contains(x.as_str())));
        }
        let trunc = |s: &str| -> Vec<u8> { s.as_bytes()[..s.len().min(127)].to_vec() };
        if !w.is_empty() {
            kv_overrides.push(("quantize.imatrix.file".to_string(), Value::String(trunc(&p))));
            if let Some(d) = im.datasets.first() {
                kv_overrides.push(("quantize.imatrix.dataset".to_string(), Value::String(trunc(d))));
            }
            kv_overrides.push(("quantize.imatrix.entries_count".to_string(), Value::U32(w.len() as u32)));
            if im.chunk_count > 0 {
                kv_overrides.push(("quantize.imatrix.chunks_count".to_string(), Value::U32(im.chunk_count)));
            }
            weights = Some(w);
        }
    }
    let params = qz::QuantizeParams {
        select: sel,
        n_threads: n_threads.max(1),
        allow_requantize,
        keep_split,
        imatrix: weights,
        kv_overrides,
        prune_layers,
        dry_run,
    };
    let inp = input.to_string_lossy().into_owned();
    let out = output.to_string_lossy().into_owned();
    let mut cb_err: Option<PyErr> = None;
    let res = py.allow_threads(|| {
        let mut cb = |t: &qz::TensorProgress| -> bool {
            Python::with_gil(|py| {
                if let Err(e) = py.check_signals() {
                    cb_err = Some(e);
                    return false;
                }
                let Some(f) = &progress else { return true };
                let d = PyDict::new(py);
                let r = (|| -> PyResult<()> {
                    d.set_item("index", t.index)?;
                    d.set_item("total", t.total)?;
                    d.set_item("name", &t.name)?;
                    d.set_item("shape", t.ne.to_vec())?;
                    d.set_item("src_type", t.src_type.name())?;
                    d.set_item("dst_type", t.dst_type.name())?;
                    d.set_item("src_bytes", t.src_bytes)?;
                    d.set_item("dst_bytes", t.dst_bytes)?;
                    d.set_item("note", t.note.as_deref())?;
                    f.call1(py, (d,))?;
                    Ok(())
                })();
                match r {
                    Ok(()) => true,
                    Err(e) => {
                        cb_err = Some(e);
                        false
                    }
                }
            })
        };
        qz::quantize_model(&inp, &out, &params, &mut cb)
    });
    if let Some(e) = cb_err {
        return Err(e);
    }
    let s = res.map_err(to_py)?;
    let d = PyDict::new(py);
    d.set_item("size_before", s.size_before)?;
    d.set_item("size_after", s.size_after)?;
    d.set_item("n_elements", s.n_elements)?;
    d.set_item("n_tensors", s.n_tensors)?;
    d.set_item("n_fallback", s.n_fallback)?;
    d.set_item("outputs", s.outputs)?;
    d.set_item("warnings", s.warnings)?;
    Ok(d)
}

/// llama-quantize's type for each tensor of a model described by its hyperparameters:
/// `tensors` is a list of (name, shape with the row length first, type name). Returns the
/// type names in the same order (tensors llama-quantize leaves alone keep their type).
#[pyfunction]
#[pyo3(signature = (tensors, ftype, *, arch = "llama", n_layer = 1, n_head = 1, n_head_kv = None, n_expert = 0,
    has_imatrix = false, pure = false, output_tensor_type = None, token_embedding_type = None, leave_output_tensor = false))]
#[allow(clippy::too_many_arguments)]
fn quantize_types(
    tensors: Vec<(String, Vec<u64>, String)>,
    ftype: &str,
    arch: &str,
    n_layer: u32,
    n_head: u32,
    n_head_kv: Option<u32>,
    n_expert: u32,
    has_imatrix: bool,
    pure: bool,
    output_tensor_type: Option<&str>,
    token_embedding_type: Option<&str>,
    leave_output_tensor: bool,
) -> PyResult<Vec<&'static str>> {
    let ft = ftype_of(ftype)?;
    let n_head_kv = n_head_kv.unwrap_or(n_head);
    let model = select::ModelInfo {
        arch: arch.to_string(),
        n_layer,
        n_head,
        n_head_kv,
        n_expert,
        is_70b: (arch == "llama" && n_layer == 80 && n_head != n_head_kv)
            || (matches!(arch, "deci" | "olmo" | "qwen2") && n_layer == 80)
            || (arch == "jais2" && n_layer == 68),
    };
    let params = select::SelectParams {
        ftype: ft.id,
        output_tensor_type: output_tensor_type.map(|t| ggml_type(t, "output_tensor_type")).transpose()?,
        token_embedding_type: token_embedding_type.map(|t| ggml_type(t, "token_embedding_type")).transpose()?,
        quantize_output_tensor: !leave_output_tensor,
        only_copy: ft.name == "COPY",
        pure,
        has_imatrix,
        tensor_types: Vec::new(),
        tensor_type_matcher: None,
    };
    let mut descs = Vec::with_capacity(tensors.len());
    for (name, shape, ty) in tensors {
        if shape.is_empty() || shape.len() > 4 {
            return Err(PyValueError::new_err(format!("tensor {name}: shape must have 1 to 4 dims, got {shape:?}")));
        }
        let mut ne = [1u64; 4];
        ne[..shape.len()].copy_from_slice(&shape);
        descs.push(select::TensorDesc { name: name.clone(), ty: ggml_type(&ty, &name)?, ne });
    }
    let mut s = select::Selector::new(&model, &params, descs.iter().map(|d| d.name.as_str()));
    descs.iter().map(|d| s.target_type(d).map(|t| t.name()).map_err(PyValueError::new_err)).collect()
}

/// llama-quantize's type names and their llama_ftype numbers, in its order.
#[pyfunction]
fn quantize_ftypes() -> Vec<(&'static str, u32)> {
    select::FTYPES.to_vec()
}

/// The per-column importance weights of an imatrix file as llama-quantize uses them
/// (sums / counts), by tensor name; plus datasets and chunk count.
#[pyfunction]
fn load_imatrix<'py>(py: Python<'py>, path: std::path::PathBuf) -> PyResult<Bound<'py, PyDict>> {
    let p = path.to_string_lossy().into_owned();
    let im = py.allow_threads(|| imatrix::load(&p)).map_err(to_py)?;
    let d = PyDict::new(py);
    let w = PyDict::new(py);
    for (k, v) in im.weights() {
        w.set_item(k, numpy::PyArray1::from_vec(py, v))?;
    }
    d.set_item("weights", w)?;
    d.set_item("datasets", im.datasets.clone())?;
    d.set_item("chunk_count", im.chunk_count)?;
    d.set_item("chunk_size", im.chunk_size)?;
    d.set_item("legacy", im.is_legacy)?;
    Ok(d)
}

/// Start collecting an importance matrix on this thread: every `Context.decode` made from
/// this thread records its matmul inputs (llama-imatrix's rules) until `imatrix_end`.
#[pyfunction]
#[pyo3(signature = (process_output = false))]
fn imatrix_begin(process_output: bool) {
    qz::collect::begin(process_output);
}

/// Stop collecting on this thread: {weight name: (sums float32 [n_mat, n_in], counts
/// list[int])}. Raises ValueError if a sum became non-finite (llama-imatrix stops there).
#[pyfunction]
fn imatrix_end<'py>(py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
    let c = qz::collect::end().ok_or_else(|| PyValueError::new_err("no importance-matrix collection is running on this thread"))?;
    if let Some(n) = c.non_finite {
        return Err(PyValueError::new_err(format!("non-finite values detected in {n}")));
    }
    let d = PyDict::new(py);
    for (name, s) in c.stats {
        let nmat = s.counts.len().max(1);
        let ne0 = s.values.len() / nmat;
        let arr = numpy::PyArray1::from_vec(py, s.values).reshape([nmat, ne0])?;
        d.set_item(name, (arr, s.counts))?;
    }
    Ok(d)
}

/// Write an importance matrix in llama-imatrix's GGUF format. `entries`: {weight name:
/// (sums [n_mat, n_in] or flat, counts per matrix)}.
#[pyfunction]
fn imatrix_save(
    py: Python<'_>,
    path: std::path::PathBuf,
    entries: std::collections::BTreeMap<String, (numpy::PyReadonlyArrayDyn<'_, f32>, Vec<i64>)>,
    datasets: Vec<String>,
    chunk_count: u32,
    chunk_size: u32,
) -> PyResult<()> {
    let mut stats = std::collections::BTreeMap::new();
    for (name, (a, counts)) in entries {
        let values: Vec<f32> = a.as_array().iter().copied().collect();
        if counts.is_empty() || values.len() % counts.len() != 0 {
            return Err(PyValueError::new_err(format!("{name}: {} sums do not split into {} matrices", values.len(), counts.len())));
        }
        stats.insert(name, qz::collect::Stats { values, counts });
    }
    let p = path.to_string_lossy().into_owned();
    py.allow_threads(|| qz::collect::save(&p, &stats, &datasets, chunk_count, chunk_size)).map_err(to_py)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(imatrix_begin, m)?)?;
    m.add_function(wrap_pyfunction!(imatrix_end, m)?)?;
    m.add_function(wrap_pyfunction!(imatrix_save, m)?)?;
    m.add_function(wrap_pyfunction!(quantize_model, m)?)?;
    m.add_function(wrap_pyfunction!(quantize_types, m)?)?;
    m.add_function(wrap_pyfunction!(quantize_ftypes, m)?)?;
    m.add_function(wrap_pyfunction!(load_imatrix, m)?)?;
    Ok(())
}
