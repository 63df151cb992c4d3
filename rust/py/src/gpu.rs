//! The GPU device registry (`gpu_built`, `gpu_devices`): what `llama_supports_gpu_offload`,
//! `llama_backend_dev_*` and `pyllama info` report. Empty without the `gpu` feature.

use pyo3::prelude::*;
use pyo3::types::PyDict;

/// True when this extension was built with the wgpu backend (cargo feature `gpu`).
#[pyfunction]
fn gpu_built() -> bool {
    cfg!(feature = "gpu")
}

/// The GPU adapters wgpu finds, hardware first (the order `main_gpu` indexes among the
/// usable ones): dicts of name, type ("discrete", "integrated", "virtual", "cpu" for a
/// software rasterizer, "other"), backend, driver, driver_info, vendor, device,
/// max_buffer_size, max_storage_binding, subgroups (the adapter offers subgroup
/// operations), subgroup_sizes ((min, max) threads), subgroups_used (offload's kernels will
/// reduce with them: offered and not PYLLAMA_GPU_SUBGROUPS=0) and usable (False for a
/// software adapter unless `allow_software` or PYLLAMA_GPU=cpu-ok). Always empty without
/// the `gpu` feature.
#[pyfunction]
#[pyo3(signature = (allow_software = false))]
fn gpu_devices(py: Python<'_>, allow_software: bool) -> PyResult<Vec<Bound<'_, PyDict>>> {
    #[cfg(feature = "gpu")]
    {
        let allow = allow_software || pyllama_core::gpu::software_allowed_by_env();
        let list = py.allow_threads(pyllama_core::gpu::adapters);
        let mut out = Vec::new();
        for a in list {
            let d = PyDict::new(py);
            d.set_item("name", &a.name)?;
            d.set_item("type", a.device_type)?;
            d.set_item("backend", &a.backend)?;
            d.set_item("driver", &a.driver)?;
            d.set_item("driver_info", &a.driver_info)?;
            d.set_item("vendor", a.vendor)?;
            d.set_item("device", a.device)?;
            d.set_item("max_buffer_size", a.max_buffer_size)?;
            d.set_item("max_storage_binding", a.max_storage_binding)?;
            d.set_item("subgroups", a.subgroups)?;
            d.set_item("subgroup_sizes", a.subgroup_sizes)?;
            d.set_item("subgroups_used", a.subgroups && pyllama_core::gpu::subgroups_allowed_by_env())?;
            d.set_item("usable", allow || !a.is_software())?;
            out.push(d);
        }
        Ok(out)
    }
    #[cfg(not(feature = "gpu"))]
    {
        let _ = (py, allow_software);
        Ok(Vec::new())
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(gpu_built, m)?)?;
    m.add_function(wrap_pyfunction!(gpu_devices, m)?)?;
    Ok(())
}
