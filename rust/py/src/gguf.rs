//! `GGUFFile` and `Model` for Python: metadata as Python values, the tensor index, raw
//! tensor bytes as read-only numpy views (no copy under mmap).

use crate::errors::to_py;
use numpy::{PyArray1, PyArrayMethods};
use pyllama_core::gguf::{GgufFile, LoadMode, Value};
use pyllama_core::model::{LoadParams, Model, SplitMode};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};
use std::sync::Arc;

pub fn value_to_py(py: Python<'_>, v: &Value) -> PyResult<PyObject> {
    Ok(match v {
        Value::U8(x) => x.into_pyobject(py)?.into_any().unbind(),
        Value::I8(x) => x.into_pyobject(py)?.into_any().unbind(),
        Value::U16(x) => x.into_pyobject(py)?.into_any().unbind(),
        Value::I16(x) => x.into_pyobject(py)?.into_any().unbind(),
        Value::U32(x) => x.into_pyobject(py)?.into_any().unbind(),
        Value::I32(x) => x.into_pyobject(py)?.into_any().unbind(),
        Value::U64(x) => x.into_pyobject(py)?.into_any().unbind(),
        Value::I64(x) => x.into_pyobject(py)?.into_any().unbind(),
        Value::F32(x) => x.into_pyobject(py)?.into_any().unbind(),
        Value::F64(x) => x.into_pyobject(py)?.into_any().unbind(),
        Value::Bool(x) => pyo3::types::PyBool::new(py, *x).to_owned().into_any().unbind(),
        Value::String(b) => match std::str::from_utf8(b) {
            Ok(s) => s.into_pyobject(py)?.into_any().unbind(),
            Err(_) => PyBytes::new(py, b).into_any().unbind(),
        },
        Value::Array(a) => {
            let items: Vec<PyObject> = a.iter().map(|x| value_to_py(py, &x)).collect::<PyResult<_>>()?;
            PyList::new(py, items)?.into_any().unbind()
        }
    })
}

pub fn parse_load_mode(s: &str) -> PyResult<LoadMode> {
    LoadMode::from_name(s).ok_or_else(|| {
        PyValueError::new_err(format!("unknown load mode '{s}' (expected auto, none, mmap, mlock, mmap+mlock or dio)"))
    })
}

/// An open GGUF file (header parsed, data mapped or read).
#[pyclass(name = "GGUFFile", module = "pyllama._core", frozen)]
pub struct PyGgufFile {
    pub inner: Arc<GgufFile>,
}

#[pymethods]
impl PyGgufFile {
    #[new]
    #[pyo3(signature = (path, load_mode = "auto"))]
    fn new(py: Python<'_>, path: std::path::PathBuf, load_mode: &str) -> PyResult<Self> {
        let mode = parse_load_mode(load_mode)?;
        let p = path.to_string_lossy().into_owned();
        let f = py.allow_threads(|| GgufFile::open(&p, mode)).map_err(to_py)?;
        Ok(PyGgufFile { inner: Arc::new(f) })
    }

    #[getter]
    fn path(&self) -> &str {
        &self.inner.path
    }
    #[getter]
    fn version(&self) -> u32 {
        self.inner.version
    }
    #[getter]
    fn alignment(&self) -> u64 {
        self.inner.alignment
    }
    #[getter]
    fn data_offset(&self) -> u64 {
        self.inner.data_offset
    }
    #[getter]
    fn is_mmap(&self) -> bool {
        self.inner.storage.is_mmap()
    }
    #[getter]
    fn is_locked(&self) -> bool {
        self.inner.storage.is_locked()
    }
    #[getter]
    fn file_size(&self) -> u64 {
        self.inner.file_size
    }
    /// Non-fatal problems met while opening (mlock / O_DIRECT refused).
    #[getter]
    fn warnings(&self) -> Vec<String> {
        self.inner.warnings().to_vec()
    }

    /// Metadata as an ordered dict of key -> Python value (int, float, bool, str, bytes
    /// for non-UTF-8 strings, list for arrays; arrays left out with `arrays=False`).
    #[pyo3(signature = (arrays = true))]
    fn metadata<'py>(&self, py: Python<'py>, arrays: bool) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for (k, v) in &self.inner.metadata {
            if arrays || !matches!(v, Value::Array(_)) {
                d.set_item(k, value_to_py(py, v)?)?;
            }
        }
        Ok(d)
    }

    /// One metadata value (None if absent), without converting the rest.
    fn meta_value(&self, py: Python<'_>, key: &str) -> PyResult<Option<PyObject>> {
        self.inner.get(key).map(|v| value_to_py(py, v)).transpose()
    }

    /// The vocabulary tables built from this file's tokenizer metadata (see Model).
    fn vocab_store(&self, py: Python<'_>, merges: bool) -> PyResult<crate::vocab::PyVocabStore> {
        crate::vocab::PyVocabStore::from_gguf(py, self.inner.clone(), |f| f, merges)
    }

    /// Metadata value types: key -> GGUF value type id (and element type for arrays).
    fn metadata_types<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for (k, v) in &self.inner.metadata {
            let et = match v {
                Value::Array(a) => Some(a.elem_type),
                _ => None,
            };
            d.set_item(k, (v.type_id(), et))?;
        }
        Ok(d)
    }

    /// The tensor index: list of (name, type name, ne (ggml order), offset, nbytes).
    fn tensors(&self) -> Vec<(String, &'static str, Vec<u64>, u64, u64)> {
        self.inner
            .tensors
            .iter()
            .map(|t| (t.name.clone(), t.ty.name(), t.ne[..t.n_dims as usize].to_vec(), t.offset, t.nbytes))
            .collect()
    }

    /// Raw bytes of a tensor as a read-only uint8 numpy array that borrows the file's
    /// memory (no copy); the array keeps this file alive.
    fn tensor_raw<'py>(slf: Bound<'py, Self>, name: &str) -> PyResult<Bound<'py, PyArray1<u8>>> {
        let inner = slf.get().inner.clone();
        let t = inner
            .tensor_info(name)
            .ok_or_else(|| pyo3::exceptions::PyKeyError::new_err(format!("no tensor named '{name}'")))?;
        let data = inner.tensor_data(t);
        // SAFETY: `data` lives as long as `inner`, which the array's base object (slf) owns.
        let arr = unsafe {
            let a = PyArray1::<u8>::borrow_from_array(
                &numpy::ndarray::ArrayView1::from_shape_ptr(data.len(), data.as_ptr()),
                slf.into_any(),
            );
            a
        };
        arr.readwrite().make_nonwriteable();
        Ok(arr)
    }
}

/// A loaded model (weights mapped/read, schema checked).
#[pyclass(name = "Model", module = "pyllama._core", frozen)]
pub struct PyModel {
    pub inner: Arc<Model>,
}

#[pymethods]
impl PyModel {
    /// Load a model. `progress(p: float)` is called with 0.0 ... 1.0; returning False
    /// cancels (LoadCancelled); None or any truthy value continues. `kv_overrides` maps
    /// metadata keys to bool / int / float / str values. `n_gpu_layers` puts the matmuls
    /// of the top N layers (the output layer counting as the topmost, as in llama.cpp;
    /// negative: all) on the GPU: `split_mode` "layer" spreads them over the usable adapters
    /// in proportion to `tensor_split` (none or all zero: equal shares), "none" puts them on
    /// adapter `main_gpu`, "row" and "tensor" are refused (as llama.cpp's Vulkan backend);
    /// `gpu_allow_software` lets a software adapter (lavapipe) be used. No usable adapter,
    /// or no `gpu` feature: a warning and the CPU.
    #[new]
    #[pyo3(signature = (paths, load_mode = "auto", vocab_only = false, check_tensors = false, progress = None, kv_overrides = None, n_gpu_layers = 0, main_gpu = 0, gpu_allow_software = false, split_mode = "layer", tensor_split = None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        paths: Vec<std::path::PathBuf>,
        load_mode: &str,
        vocab_only: bool,
        check_tensors: bool,
        progress: Option<PyObject>,
        kv_overrides: Option<Bound<'_, PyDict>>,
        n_gpu_layers: i32,
        main_gpu: i32,
        gpu_allow_software: bool,
        split_mode: &str,
        tensor_split: Option<Vec<f32>>,
    ) -> PyResult<Self> {
        if main_gpu < 0 {
            return Err(PyValueError::new_err(format!("main_gpu must be >= 0, not {main_gpu}")));
        }
        let split_mode = match split_mode {
            "none" => SplitMode::None,
            "layer" => SplitMode::Layer,
            "row" => SplitMode::Row,
            "tensor" => SplitMode::Tensor,
            _ => {
                return Err(PyValueError::new_err(format!(
                    "split_mode must be 'none', 'layer', 'row' or 'tensor', not {split_mode:?}"
                )))
            }
        };
        let mut overrides = Vec::new();
        if let Some(d) = kv_overrides {
            for (k, v) in d.iter() {
                let key: String = k.extract()?;
                let val = if v.is_instance_of::<pyo3::types::PyBool>() {
                    Value::Bool(v.extract()?)
                } else if v.is_instance_of::<pyo3::types::PyInt>() {
                    Value::I64(v.extract().map_err(|_| PyValueError::new_err(format!("kv_override '{key}': integer out of range")))?)
                } else if v.is_instance_of::<pyo3::types::PyFloat>() {
                    Value::F64(v.extract()?)
                } else if let Ok(s) = v.extract::<String>() {
                    Value::String(s.into_bytes())
                } else {
                    return Err(PyValueError::new_err(format!(
                        "kv_override '{key}': value must be bool, int, float or str, not {}",
                        v.get_type().name()?
                    )));
                };
                overrides.push((key, val));
            }
        }
        let mode = parse_load_mode(load_mode)?;
        let paths: Vec<String> = paths.iter().map(|p| p.to_string_lossy().into_owned()).collect();
        let mut cb_err: Option<PyErr> = None;
        let mut cb = |p: f32| -> bool {
            match &progress {
                None => true,
                Some(f) => Python::with_gil(|py| match f.call1(py, (p,)) {
                    // Only an explicit false value cancels: a callback that just prints
                    // (and returns None) must not stop the load.
                    Ok(r) => r.is_none(py) || r.is_truthy(py).unwrap_or(true),
                    Err(e) => {
                        cb_err = Some(e);
                        false
                    }
                }),
            }
        };
        let params =
            LoadParams {
            load_mode: mode,
            vocab_only,
            check_tensors,
            progress: Some(&mut cb),
            kv_overrides: overrides,
            n_gpu_layers,
            main_gpu: main_gpu as usize,
            split_mode,
            tensor_split: tensor_split.unwrap_or_default(),
            gpu_allow_software,
        };
        let r = py.allow_threads(|| Model::load(&paths, params));
        if let Some(e) = cb_err {
            return Err(e);
        }
        Ok(PyModel { inner: Arc::new(r.map_err(to_py)?) })
    }

    /// `general.architecture`.
    #[getter]
    fn arch(&self) -> String {
        self.inner.arch_name().to_string()
    }

    /// Hyperparameters as a dict (llama.cpp names).
    fn hparams<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let h = &self.inner.hparams;
        let d = PyDict::new(py);
        d.set_item("arch", &h.arch)?;
        d.set_item("n_vocab", h.n_vocab)?;
        d.set_item("n_ctx_train", h.n_ctx_train)?;
        d.set_item("n_embd", h.n_embd)?;
        d.set_item("n_layer", h.n_layer)?;
        d.set_item("n_head", h.n_head.clone())?;
        d.set_item("n_head_kv", h.n_head_kv.clone())?;
        d.set_item("n_ff", h.n_ff.clone())?;
        d.set_item("n_embd_head_k", h.n_embd_head_k)?;
        d.set_item("n_embd_head_v", h.n_embd_head_v)?;
        d.set_item("n_rot", h.n_rot)?;
        d.set_item("rope_type", format!("{:?}", h.rope_type).to_lowercase())?;
        d.set_item("rope_freq_base", h.rope_freq_base)?;
        d.set_item("rope_freq_scale", h.rope_freq_scale)?;
        d.set_item("rope_freq_base_swa", h.rope_freq_base_swa)?;
        d.set_item("f_norm_eps", h.f_norm_eps)?;
        d.set_item("f_norm_rms_eps", h.f_norm_rms_eps)?;
        d.set_item("n_swa", h.n_swa)?;
        d.set_item("swa_layers", h.swa_layers.clone())?;
        d.set_item("f_attention_scale", h.f_attention_scale)?;
        d.set_item("rope_freq_scale_swa", h.rope_freq_scale_swa)?;
        d.set_item("f_attn_logit_softcapping", h.f_attn_logit_softcapping)?;
        d.set_item("f_final_logit_softcapping", h.f_final_logit_softcapping)?;
        d.set_item("rope_scaling_type", &h.rope_scaling_type)?;
        d.set_item("n_ctx_orig_yarn", h.n_ctx_orig_yarn)?;
        d.set_item("rope_attn_factor", h.rope_attn_factor)?;
        d.set_item("yarn_beta_fast", h.yarn_beta_fast)?;
        d.set_item("yarn_beta_slow", h.yarn_beta_slow)?;
        d.set_item("rope_yarn_log_mul", h.rope_yarn_log_mul)?;
        d.set_item("f_attn_temp_scale", h.f_attn_temp_scale)?;
        d.set_item("n_attn_temp_floor_scale", h.n_attn_temp_floor_scale)?;
        d.set_item("causal_attn", h.causal_attn)?;
        d.set_item("pooling_type", h.pooling_type)?;
        d.set_item("pooling_type_cls", h.pooling_type_cls)?;
        d.set_item("n_cls_out", h.n_cls_out)?;
        d.set_item("f_max_alibi_bias", h.f_max_alibi_bias)?;
        d.set_item("n_token_types", h.n_token_types)?;
        d.set_item("n_expert", h.n_expert)?;
        d.set_item("n_expert_used", h.n_expert_used)?;
        d.set_item("n_ff_exp", h.n_ff_exp)?;
        d.set_item("n_ff_shexp", h.n_ff_shexp)?;
        d.set_item("n_layer_nextn", h.n_layer_nextn)?;
        Ok(d)
    }

    /// Number of files (> 1 for split models; the first holds the metadata).
    fn n_files(&self) -> usize {
        self.inner.files.len()
    }
    #[getter]
    fn paths(&self) -> Vec<String> {
        self.inner.files.iter().map(|f| f.path.clone()).collect()
    }
    #[getter]
    fn version(&self) -> u32 {
        self.inner.files[0].version
    }
    #[getter]
    fn load_mode(&self) -> &'static str {
        self.inner.load_mode.name()
    }
    #[getter]
    fn vocab_only(&self) -> bool {
        self.inner.vocab_only
    }
    #[getter]
    fn is_mmap(&self) -> bool {
        self.inner.files.iter().all(|f| f.storage.is_mmap())
    }
    /// The tensors repacked at load into the x4 layout of the single-token kernels, sorted.
    #[getter]
    fn repacked(&self) -> Vec<String> {
        let mut v: Vec<String> = self.inner.x4.iter().map(|&(fi, ti)| self.inner.files[fi].tensors[ti].name.clone()).collect();
        v.sort();
        v
    }
    #[getter]
    fn is_locked(&self) -> bool {
        self.inner.files.iter().all(|f| f.storage.is_locked())
    }
    /// Non-fatal problems met while loading (mlock / O_DIRECT refused, no GPU adapter).
    #[getter]
    fn warnings(&self) -> Vec<String> {
        self.inner.warnings.clone()
    }
    /// What runs on the GPU (`n_gpu_layers`), one line; None when nothing does.
    #[getter]
    fn offload(&self) -> Option<String> {
        self.inner.device.as_ref().map(|d| d.describe())
    }
    /// Total elements of all tensors (llama_model_n_params).
    fn n_params(&self) -> u64 {
        self.inner.n_params()
    }
    /// Total bytes of all tensors (llama_model_size).
    fn size(&self) -> u64 {
        self.inner.size()
    }
    /// (llama_ftype value, guessed?)
    fn ftype(&self) -> (u32, bool) {
        self.inner.ftype()
    }
    /// "Q4_K - Medium", "(guessed) Q4_1", ...
    fn ftype_name(&self) -> String {
        self.inner.ftype_name()
    }
    /// llama_model_desc: "gemma3 270M Q4_K - Medium".
    fn desc(&self) -> String {
        self.inner.desc()
    }
    /// llama.cpp's size class ("270M").
    fn type_name(&self) -> &'static str {
        self.inner.arch.type_name(&self.inner.hparams)
    }
    fn metadata_types<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for (k, v) in &self.inner.files[0].metadata {
            let et = match v {
                Value::Array(a) => Some(a.elem_type),
                _ => None,
            };
            d.set_item(k, (v.type_id(), et))?;
        }
        Ok(d)
    }
    /// Raw bytes of a tensor (read-only uint8 view, no copy under mmap); None if absent.
    fn tensor_raw<'py>(slf: Bound<'py, Self>, name: &str) -> PyResult<Option<Bound<'py, PyArray1<u8>>>> {
        let inner = slf.get().inner.clone();
        let Some(t) = inner.tensor(name) else { return Ok(None) };
        if t.layout != pyllama_core::model::Layout::Plain {
            // a matmul weight repacked at load: its file bytes back, in a copy
            let mut plain = vec![0u8; t.data.len()];
            pyllama_core::quant::repack::unpack_x4(t.ty, t.ne[0], t.data, &mut plain).map_err(to_py)?;
            let arr = PyArray1::from_vec(slf.py(), plain);
            arr.readwrite().make_nonwriteable();
            return Ok(Some(arr));
        }
        let data = t.data;
        // SAFETY: `data` lives as long as `inner`, which the array's base object (slf) owns.
        let arr = unsafe {
            PyArray1::<u8>::borrow_from_array(
                &numpy::ndarray::ArrayView1::from_shape_ptr(data.len(), data.as_ptr()),
                slf.into_any(),
            )
        };
        arr.readwrite().make_nonwriteable();
        Ok(Some(arr))
    }

    /// The vocabulary tables built from this model's tokenizer metadata (merges too when
    /// `merges`: BPE). ValueError with llama.cpp's message on a malformed tokenizer.
    fn vocab_store(&self, py: Python<'_>, merges: bool) -> PyResult<crate::vocab::PyVocabStore> {
        crate::vocab::PyVocabStore::from_gguf(py, self.inner.clone(), |m| &m.files[0], merges)
    }

    /// Metadata of the first file (after kv_overrides) as key -> Python value. With
    /// `arrays=False` the arrays (the large tokenizer tables) are left out.
    #[pyo3(signature = (arrays = true))]
    fn metadata<'py>(&self, py: Python<'py>, arrays: bool) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for (k, v) in &self.inner.files[0].metadata {
            if arrays || !matches!(v, Value::Array(_)) {
                d.set_item(k, value_to_py(py, v)?)?;
            }
        }
        Ok(d)
    }

    /// One metadata value (None if absent), without converting the rest.
    fn meta_value(&self, py: Python<'_>, key: &str) -> PyResult<Option<PyObject>> {
        self.inner.files[0].get(key).map(|v| value_to_py(py, v)).transpose()
    }

    fn tensors(&self) -> Vec<(String, &'static str, Vec<u64>, u64, u64)> {
        let mut v: Vec<_> = self
            .inner
            .files
            .iter()
            .flat_map(|f| f.tensors.iter())
            .map(|t| (t.name.clone(), t.ty.name(), t.ne[..t.n_dims as usize].to_vec(), t.offset, t.nbytes))
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }
}

/// The load mode names in llama.h's order (auto = -1, none = 0, ... dio = 4).
#[pyfunction]
fn load_mode_names() -> Vec<(&'static str, i32)> {
    LoadMode::ALL.iter().map(|m| (m.name(), m.to_llama())).collect()
}

/// `<prefix>-00001-of-00003.gguf` -> (prefix, split index from 0, count), or None.
#[pyfunction]
fn split_prefix(path: &str) -> Option<(String, usize, usize)> {
    pyllama_core::model::split_prefix(path)
}

/// The file name of split `no` (from 0) of `count`.
#[pyfunction]
fn split_path(prefix: &str, no: usize, count: usize) -> String {
    pyllama_core::model::split_path(prefix, no, count)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(load_mode_names, m)?)?;
    m.add_function(wrap_pyfunction!(split_prefix, m)?)?;
    m.add_function(wrap_pyfunction!(split_path, m)?)?;
    m.add_class::<PyGgufFile>()?;
    m.add_class::<PyModel>()?;
    Ok(())
}
