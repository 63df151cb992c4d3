//! pyllama's core: everything heavy, no Python. See DESIGN.md at the repository root for
//! the pipeline and the Rust/Python boundary.

pub mod adapter;
pub mod error;
pub mod ggml_type;
pub mod gguf;
pub mod grammar;
pub mod hparams;
pub mod model;
pub mod models;
pub mod ops;
pub mod quant;
pub mod threadpool;
pub mod vocab;

pub use error::{Error, Result};
pub use ggml_type::GgmlType;
pub mod context;
pub mod kv_cache;
pub mod sampling;
pub mod state;
