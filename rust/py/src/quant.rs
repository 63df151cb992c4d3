//! Quantized formats for Python: `dequantize`, `quantize`, `matmul`, `vec_dot`,
//! `kernel_set` (tests, model inspection, benchmarks). Heavy work runs without the GIL.

use crate::errors::to_py;
use numpy::ndarray::{ArrayD, IxDyn};
use numpy::{IntoPyArray, PyArray2, PyArrayDyn, PyReadonlyArray2, PyReadonlyArrayDyn, PyUntypedArrayMethods};
use pyllama_core::ggml_type::GgmlType;
use pyllama_core::model::TensorView;
use pyllama_core::ops::matmul as mm;
use pyllama_core::quant;
use pyllama_core::threadpool::ThreadPool;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

fn parse_type(name: &str) -> PyResult<GgmlType> {
    let ty = GgmlType::from_name(name).ok_or_else(|| PyValueError::new_err(format!("unknown tensor type '{name}'")))?;
    Ok(ty)
}

fn contiguous<'a, T: numpy::Element>(a: &'a PyReadonlyArrayDyn<'_, T>, what: &str) -> PyResult<&'a [T]> {
    a.as_slice().map_err(|_| PyValueError::new_err(format!("{what} must be a C-contiguous array")))
}

/// Decode raw tensor bytes of `type_name` into float32 with numpy shape `shape` (row
/// length last, gguf-py's order). Bit-identical to `gguf.quants.dequantize`.
#[pyfunction]
fn dequantize<'py>(
    py: Python<'py>,
    raw: PyReadonlyArrayDyn<'py, u8>,
    type_name: &str,
    shape: Vec<usize>,
) -> PyResult<Bound<'py, PyArrayDyn<f32>>> {
    let ty = parse_type(type_name)?;
    let src = contiguous(&raw, "raw")?;
    let n_per_row = *shape.last().unwrap_or(&1);
    let n_rows: usize = shape.iter().rev().skip(1).product();
    let rb = quant::row_bytes(ty, n_per_row).map_err(to_py)?;
    let need = rb.checked_mul(n_rows).ok_or_else(|| PyValueError::new_err("shape too large"))?;
    if src.len() != need {
        return Err(PyValueError::new_err(format!(
            "{ty} tensor of shape {shape:?} needs {need} bytes, got {}",
            src.len()
        )));
    }
    let mut out = vec![0f32; n_rows * n_per_row];
    py.allow_threads(|| -> pyllama_core::Result<()> {
        if n_per_row == 0 {
            return Ok(());
        }
        for (s, d) in src.chunks_exact(rb.max(1)).zip(out.chunks_exact_mut(n_per_row)) {
            quant::dequantize_row(ty, s, d)?;
        }
        Ok(())
    })
    .map_err(to_py)?;
    let arr = ArrayD::from_shape_vec(IxDyn(&shape), out).map_err(|e| PyValueError::new_err(e.to_string()))?;
    Ok(arr.into_pyarray(py))
}

/// Quantize float32 `x` (row length last) to `type_name` with ggml's reference quantizer
/// (or, with `activation=True`, the matmul's activation quantizer). Returns uint8 of shape
/// (*x.shape[:-1], row_bytes), gguf-py's convention.
#[pyfunction]
#[pyo3(signature = (x, type_name, activation = false))]
fn quantize<'py>(
    py: Python<'py>,
    x: PyReadonlyArrayDyn<'py, f32>,
    type_name: &str,
    activation: bool,
) -> PyResult<Bound<'py, PyArrayDyn<u8>>> {
    let ty = parse_type(type_name)?;
    let shape = x.shape().to_vec();
    let src = contiguous(&x, "x")?;
    let n_per_row = *shape.last().unwrap_or(&1);
    let rb = quant::row_bytes(ty, n_per_row).map_err(to_py)?;
    let n_rows: usize = shape.iter().rev().skip(1).product();
    let mut out = vec![0u8; rb * n_rows];
    py.allow_threads(|| -> pyllama_core::Result<()> {
        if n_per_row == 0 {
            return Ok(());
        }
        for (s, d) in src.chunks_exact(n_per_row).zip(out.chunks_exact_mut(rb.max(1))) {
            if activation {
                quant::quantize_row_act(ty, s, d)?;
            } else {
                quant::quantize_row(ty, s, d)?;
            }
        }
        Ok(())
    })
    .map_err(to_py)?;
    let mut oshape = shape.clone();
    if let Some(l) = oshape.last_mut() {
        *l = rb;
    } else {
        oshape.push(rb);
    }
    let arr = ArrayD::from_shape_vec(IxDyn(&oshape), out).map_err(|e| PyValueError::new_err(e.to_string()))?;
    Ok(arr.into_pyarray(py))
}

/// out[t, r] = dot(weight row r, x row t) with pyllama's kernels. `raw`/`type_name`/`shape`
/// describe the weight as gguf-py does (shape = (n_out, n_in)); x is float32 [n_tokens, n_in].
/// `kernels` is "auto" (the process-wide choice), "ref", "avx2", "avx512" or "avx512bw".
#[pyfunction]
#[pyo3(signature = (raw, type_name, shape, x, n_threads = 1, kernels = "auto"))]
fn matmul<'py>(
    py: Python<'py>,
    raw: PyReadonlyArrayDyn<'py, u8>,
    type_name: &str,
    shape: Vec<usize>,
    x: PyReadonlyArray2<'py, f32>,
    n_threads: usize,
    kernels: &str,
) -> PyResult<Bound<'py, PyArray2<f32>>> {
    let ty = parse_type(type_name)?;
    let set = parse_kernels(kernels)?;
    let (n_out, n_in) = match shape[..] {
        [o, i] => (o, i),
        [i] => (1, i),
        _ => return Err(PyValueError::new_err(format!("weight shape must be (n_out, n_in), got {shape:?}"))),
    };
    if !ty.is_supported() {
        return Err(to_py(pyllama_core::Error::Unsupported(format!("unsupported tensor type {ty}"))));
    }
    let w = TensorView { name: "weight", ty, ne: [n_in, n_out, 1, 1], data: contiguous(&raw, "raw")?, layout: pyllama_core::model::Layout::Plain };
    let xs = x.as_slice().map_err(|_| PyValueError::new_err("x must be a C-contiguous array"))?;
    let (n_tokens, xin) = (x.shape()[0], x.shape()[1]);
    if xin != n_in {
        return Err(PyValueError::new_err(format!("x has rows of {xin}, the weight rows have {n_in}")));
    }
    let mut out = vec![0f32; n_tokens * n_out];
    py.allow_threads(|| {
        let pool = ThreadPool::new(n_threads.max(1));
        let mut scratch = Vec::new();
        mm::matmul_with(&pool, set, &w, xs, n_tokens, &mut out, n_out, 0..n_out, &mut scratch)
    })
    .map_err(to_py)?;
    let arr = numpy::ndarray::Array2::from_shape_vec((n_tokens, n_out), out).map_err(|e| PyValueError::new_err(e.to_string()))?;
    Ok(arr.into_pyarray(py))
}

fn parse_kernels(s: &str) -> PyResult<quant::KernelSet> {
    match s {
        "auto" => Ok(quant::kernel_set()),
        "ref" => Ok(quant::KernelSet::Ref),
        "avx2" if quant::avx2_available() => Ok(quant::KernelSet::Avx2),
        "avx2" => Err(PyValueError::new_err("this CPU lacks AVX2/FMA/F16C")),
        "avx512" if quant::avx512_available() => Ok(quant::KernelSet::Avx512),
        "avx512" => Err(PyValueError::new_err("this CPU lacks AVX-512 F/BW/VL/DQ/VNNI")),
        "avx512bw" if quant::avx512bw_available() => Ok(quant::KernelSet::Avx512Bw),
        "avx512bw" => Err(PyValueError::new_err("this CPU lacks AVX-512 F/BW/VL/DQ")),
        _ => Err(PyValueError::new_err(format!("unknown kernel set '{s}' (auto, ref, avx2, avx512, avx512bw)"))),
    }
}

/// The kernel set in use: "avx512", "avx512bw", "avx2", "neon" or "ref"
/// (PYLLAMA_KERNELS=ref|avx2|avx2vnni|avx512|avx512bw forces one).
#[pyfunction]
fn kernel_set() -> &'static str {
    quant::kernel_set().name()
}

/// The CPU features the kernel choice depends on: [(name, detected)], and whether the AVX2
/// set runs its AVX-VNNI builds.
#[pyfunction]
fn cpu_features() -> (Vec<(&'static str, bool)>, bool) {
    (quant::cpu_features(), quant::avx2_vnni_in_use())
}

/// The activation type a weight type is multiplied with ("Q8_0", "Q8_K", "F16", ...).
#[pyfunction]
fn vec_dot_type(type_name: &str) -> PyResult<&'static str> {
    Ok(quant::vec_dot_type(parse_type(type_name)?).name())
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(dequantize, m)?)?;
    m.add_function(wrap_pyfunction!(quantize, m)?)?;
    m.add_function(wrap_pyfunction!(matmul, m)?)?;
    m.add_function(wrap_pyfunction!(kernel_set, m)?)?;
    m.add_function(wrap_pyfunction!(cpu_features, m)?)?;
    m.add_function(wrap_pyfunction!(vec_dot_type, m)?)?;
    Ok(())
}
