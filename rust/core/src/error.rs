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
    /// An allocation whose size comes from a file or a caller failed (or its size
    /// overflowed): the message names what was being allocated and how large it was.
    Alloc(String),
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
            Error::Alloc(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for Error {}

pub type Result<T> = std::result::Result<T, Error>;

/// Fallible allocation for sizes that come from a file or a caller: every buffer of a
/// context is reserved through these, so a size that is too large is an `Error::Alloc`
/// naming the buffer instead of the allocator aborting the process.
pub mod alloc {
    use super::{Error, Result};

    fn human(bytes: u128) -> String {
        let units = ["bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
        let mut v = bytes as f64;
        let mut u = 0;
        while v >= 1024.0 && u + 1 < units.len() {
            v /= 1024.0;
            u += 1;
        }
        if u == 0 {
            format!("{bytes} bytes")
        } else {
            format!("{v:.1} {}", units[u])
        }
    }

    /// The error for `n` elements of `elem` bytes each that could not be had.
    pub fn too_large(what: &str, n: u128, elem: usize) -> Error {
        Error::Alloc(format!(
            "cannot allocate {what}: {} ({n} elements of {elem} bytes)",
            human(n.saturating_mul(elem as u128))
        ))
    }

    /// `a * b`, or an `Error::Alloc` naming `what` when it overflows usize.
    pub fn mul(what: &str, a: usize, b: usize) -> Result<usize> {
        a.checked_mul(b).ok_or_else(|| too_large(what, a as u128 * b as u128, 1))
    }

    /// An empty Vec with room for `n` elements.
    pub fn with_capacity<T>(n: usize, what: &str) -> Result<Vec<T>> {
        let mut v = Vec::new();
        v.try_reserve_exact(n).map_err(|_| too_large(what, n as u128, std::mem::size_of::<T>()))?;
        Ok(v)
    }

    /// `n` copies of `x`.
    pub fn filled<T: Clone>(n: usize, x: T, what: &str) -> Result<Vec<T>> {
        let mut v = with_capacity(n, what)?;
        v.resize(n, x);
        Ok(v)
    }
}
