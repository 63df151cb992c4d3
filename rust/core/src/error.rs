//! One error type for the whole core, carrying enough context (file, offset, tensor,
//! architecture) that the Python exception message says what and where.

use std::fmt;

#[derive(Debug)]
pub enum Error {
    /// An OS error while opening, mapping or reading a file.
    Io { path: String, what: String, source: std::io::Error },
    /// A malformed GGUF file: `offset` is the byte offset of the bad field when known.
    Gguf { path: String, offset: Option<u64>, msg: String },
    /// A well-formed file that pyllama cannot run (unknown architecture, unsupported type,
    /// missing tensor or metadata key, wrong shape).
    Unsupported(String),
    /// The progress callback asked to stop.
    Cancelled,
    /// A bad argument from the caller (batch, token id, parameter).
    Invalid(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Io { path, what, source } => write!(f, "{path}: {what}: {source}"),
            Error::Gguf { path, offset: Some(o), msg } => write!(f, "{path}: at offset {o}: {msg}"),
            Error::Gguf { path, offset: None, msg } => write!(f, "{path}: {msg}"),
            Error::Unsupported(m) => f.write_str(m),
            Error::Cancelled => f.write_str("model load cancelled by the progress callback"),
            Error::Invalid(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for Error {}

pub type Result<T> = std::result::Result<T, Error>;
