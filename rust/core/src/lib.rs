//! pyllama's core: everything heavy, no Python. docs/architecture.md walks the path from
//! a GGUF file to a token, file by file (which step of the pipeline each module is).

pub mod adapter;
pub mod backend;
pub mod error;
pub mod ggml_type;
pub mod gguf;
pub mod grammar;
pub mod hparams;
pub mod log;
pub mod model;
pub mod models;
pub mod ops;
pub mod quant;
pub mod quantize;
pub mod threadpool;
pub mod vocab;
#[cfg(feature = "gpu")]
pub mod gpu;

pub use error::{Error, Result};
pub use ggml_type::GgmlType;
pub mod context;
pub mod kv_cache;
pub mod sampling;
pub mod state;
pub mod recurrent;
#[cfg(test)]
pub mod testutil;
