//! Thin PyO3 bindings: `pyllama._core`. One file per area registers its classes and
//! functions; each converts arguments, releases the GIL for heavy work and maps
//! `pyllama_core::Error` to the Python exceptions defined in `errors`.

use pyo3::prelude::*;

mod context;
mod errors;
mod gguf;
mod gpu;
mod grammar;
mod quant;
mod sampling;
mod quantize;
mod vocab;

/// The core's run-time diagnostics (`pyllama_core::log`) as records of the `pyllama` logger,
/// so `logging` configuration and `llama_log_set` see them.
fn log_to_python(level: pyllama_core::log::Level, msg: &str) {
    Python::with_gil(|py| {
        let r = py.import("logging").and_then(|l| l.call_method1("getLogger", ("pyllama",))).and_then(|lg| {
            let method = match level {
                pyllama_core::log::Level::Info => "info",
                pyllama_core::log::Level::Warn => "warning",
            };
            lg.call_method1(method, (msg,))
        });
        if let Err(e) = r {
            e.write_unraisable(py, None);
        }
    });
}

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    // What this extension was built as (`pyllama info` reports it).
    let build = pyo3::types::PyDict::new(m.py());
    build.set_item("profile", if cfg!(debug_assertions) { "debug" } else { "release" })?;
    build.set_item("target_arch", std::env::consts::ARCH)?;
    build.set_item("target_os", std::env::consts::OS)?;
    build.set_item("abi3", "cp39")?;
    build.set_item("gpu", if cfg!(feature = "gpu") { "wgpu" } else { "none" })?;
    m.add("BUILD", build)?;
    pyllama_core::log::set_sink(log_to_python);
    errors::register(m)?;
    gguf::register(m)?;
    gpu::register(m)?;
    quant::register(m)?;
    quantize::register(m)?;
    context::register(m)?;
    vocab::register(m)?;
    grammar::register(m)?;
    sampling::register(m)?;
    Ok(())
}
