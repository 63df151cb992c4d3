//! Exception classes and the mapping from core errors. The Python package re-exports
//! these under the same names (all derive from `PyllamaError`); their `__module__` is
//! `pyllama`, where users import them from (and where pickle finds them), not `_core`.

use pyllama_core::Error;
use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;

create_exception!(pyllama, PyllamaError, PyException, "Base class of every pyllama error.");
create_exception!(pyllama, GGUFError, PyllamaError, "A malformed GGUF file.");
create_exception!(pyllama, UnsupportedModelError, PyllamaError, "A well-formed file pyllama cannot run.");
create_exception!(pyllama, LoadCancelled, PyllamaError, "The progress callback cancelled the load.");
create_exception!(
    pyllama,
    StateError,
    PyllamaError,
    "A saved state that does not fit this context (another model, KV type or layout, more cells than it holds) or is truncated or corrupted; the context is unchanged."
);

pub fn state_err(e: pyllama_core::state::StateError) -> PyErr {
    StateError::new_err(e.0)
}

pub fn to_py(e: Error) -> PyErr {
    let msg = e.to_string();
    match e {
        Error::Io { source, .. } => match (source.raw_os_error(), source.kind()) {
            // OSError(errno, msg) becomes FileNotFoundError etc. by itself.
            (Some(code), _) => pyo3::exceptions::PyOSError::new_err((code, msg)),
            (None, std::io::ErrorKind::NotFound) => pyo3::exceptions::PyFileNotFoundError::new_err(msg),
            (None, std::io::ErrorKind::OutOfMemory) => pyo3::exceptions::PyMemoryError::new_err(msg),
            _ => pyo3::exceptions::PyOSError::new_err(msg),
        },
        Error::Gguf { .. } => GGUFError::new_err(msg),
        Error::Unsupported(_) => UnsupportedModelError::new_err(msg),
        Error::Cancelled => LoadCancelled::new_err(msg),
        Error::Invalid(_) => pyo3::exceptions::PyValueError::new_err(msg),
        Error::Alloc(_) => pyo3::exceptions::PyMemoryError::new_err(msg),
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("PyllamaError", py.get_type::<PyllamaError>())?;
    m.add("GGUFError", py.get_type::<GGUFError>())?;
    m.add("UnsupportedModelError", py.get_type::<UnsupportedModelError>())?;
    m.add("LoadCancelled", py.get_type::<LoadCancelled>())?;
    m.add("StateError", py.get_type::<StateError>())?;
    Ok(())
}
