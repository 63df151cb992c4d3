//! `VocabStore` for Python: the compact token tables of `pyllama_core::vocab` and the BPE /
//! SPM merge loops over them. The Python `Vocab` wraps it (views named `texts`,
//! `texts_bytes`, `text_to_id`, `bytes_to_id` keep its old dict/list interface).

use pyllama_core::gguf::GgufFile;
use pyllama_core::vocab::{BpeOptions, VocabStore, VocabStoreBuilder};
use pyo3::exceptions::{PyIndexError, PyLookupError, PyTypeError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyString};
use std::borrow::Cow;
use std::sync::Arc;

/// A str's UTF-8 bytes; lone surrogates are encoded with `errors` ("surrogatepass" or
/// "surrogateescape"). None when that encoding fails.
fn str_bytes<'a>(s: &'a Bound<'_, PyString>, errors: &str) -> Option<Cow<'a, [u8]>> {
    match s.to_cow() {
        Ok(Cow::Borrowed(t)) => Some(Cow::Borrowed(t.as_bytes())),
        Ok(Cow::Owned(t)) => Some(Cow::Owned(t.into_bytes())),
        Err(_) => {
            let b = s.call_method1("encode", ("utf-8", errors)).ok()?;
            Some(Cow::Owned(b.downcast::<PyBytes>().ok()?.as_bytes().to_vec()))
        }
    }
}

/// A token text given as str or bytes (str: UTF-8, surrogates passed through).
fn token_arg<'a>(obj: &'a Bound<'_, PyAny>, errors: &str) -> PyResult<Option<Cow<'a, [u8]>>> {
    if let Ok(s) = obj.downcast::<PyString>() {
        Ok(str_bytes(s, errors))
    } else if let Ok(b) = obj.downcast::<PyBytes>() {
        Ok(Some(Cow::Borrowed(b.as_bytes())))
    } else {
        Err(PyTypeError::new_err(format!("expected str or bytes, got {}", obj.get_type().name()?)))
    }
}

/// The vocabulary's tables: token texts (raw bytes), text -> id, scores, token types and
/// BPE merges.
#[pyclass(name = "VocabStore", module = "pyllama._core", frozen)]
pub struct PyVocabStore {
    pub inner: Arc<VocabStore>,
}

impl PyVocabStore {
    /// Build from the tokenizer metadata of the GGUF file `file(&owner)` (merges too when
    /// `merges`: BPE), without the GIL. ValueError with llama.cpp's message on a malformed
    /// tokenizer.
    pub fn from_gguf<T: Send + Sync>(py: Python<'_>, owner: Arc<T>, file: fn(&T) -> &GgufFile, merges: bool) -> PyResult<Self> {
        let s = py
            .allow_threads(move || pyllama_core::vocab::store_from_metadata(|k| file(&owner).get(k), merges))
            .map_err(pyo3::exceptions::PyValueError::new_err)?;
        Ok(PyVocabStore { inner: Arc::new(s) })
    }

    fn check(&self, i: isize) -> PyResult<usize> {
        let n = self.inner.len() as isize;
        let j = if i < 0 { i + n } else { i };
        if j < 0 || j >= n {
            return Err(PyIndexError::new_err(format!("token id {i} out of range (vocabulary of {n})")));
        }
        Ok(j as usize)
    }
}

#[pymethods]
impl PyVocabStore {
    /// Build from Python lists: tokens (str or bytes), scores (numbers), token types (ints)
    /// and BPE merges (str or bytes, "left right"). Empty tokens become `[EMPTY_<id>]`.
    #[staticmethod]
    #[pyo3(signature = (tokens, scores = None, types = None, merges = None))]
    fn from_lists(
        tokens: &Bound<'_, PyList>,
        scores: Option<Vec<f64>>,
        types: Option<Vec<i64>>,
        merges: Option<&Bound<'_, PyList>>,
    ) -> PyResult<Self> {
        let mut b = VocabStoreBuilder::new();
        for (i, t) in tokens.iter().enumerate() {
            let bytes = token_arg(&t, "surrogatepass")
                .map_err(|_| PyTypeError::new_err(format!("tokens[{i}] is not a string")))?
                .unwrap_or_default();
            b.push(&bytes);
        }
        let mut merge_bytes: Vec<Vec<u8>> = Vec::new();
        if let Some(m) = merges {
            for (i, t) in m.iter().enumerate() {
                let bytes = token_arg(&t, "surrogateescape")
                    .map_err(|_| PyTypeError::new_err(format!("merges[{i}] is not a string")))?
                    .unwrap_or_default();
                merge_bytes.push(bytes.into_owned());
            }
        }
        let scores = scores.unwrap_or_default().into_iter().map(|x| x as f32).collect();
        let types = types.unwrap_or_default().into_iter().map(|x| x.clamp(i32::MIN as i64, i32::MAX as i64) as i32).collect();
        let store = b
            .finish(scores, types, merges.map(|_| merge_bytes.iter().map(|v| v.as_slice())))
            .map_err(pyo3::exceptions::PyValueError::new_err)?;
        Ok(PyVocabStore { inner: Arc::new(store) })
    }

    fn __len__(&self) -> usize {
        self.inner.len()
    }

    /// Immutable: a copy is the same object (so a deep copy of a `Vocab` works and shares it).
    fn __copy__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __deepcopy__(slf: Py<Self>, _memo: &Bound<'_, PyAny>) -> Py<Self> {
        slf
    }

    /// Raw bytes of token `i`.
    fn token_bytes<'py>(&self, py: Python<'py>, i: isize) -> PyResult<Bound<'py, PyBytes>> {
        Ok(PyBytes::new(py, self.inner.token(self.check(i)?)))
    }

    /// Text of token `i` (invalid UTF-8 decoded with surrogateescape).
    fn token_text<'py>(&self, py: Python<'py>, i: isize) -> PyResult<Bound<'py, PyAny>> {
        let b = self.inner.token(self.check(i)?);
        match std::str::from_utf8(b) {
            Ok(s) => Ok(PyString::new(py, s).into_any()),
            Err(_) => PyBytes::new(py, b).call_method1("decode", ("utf-8", "surrogateescape")),
        }
    }

    /// Id of a token text (str or bytes), or None. As `text_to_id[...]` with later
    /// duplicates winning.
    fn id_of(&self, text: &Bound<'_, PyAny>) -> PyResult<Option<u32>> {
        Ok(match token_arg(text, "surrogateescape")? {
            Some(b) => self.inner.id(&b),
            None => None,
        })
    }

    /// Rank of the BPE merge `left right`, or None.
    fn rank(&self, left: &Bound<'_, PyAny>, right: &Bound<'_, PyAny>) -> PyResult<Option<u32>> {
        let (Some(l), Some(r)) = (token_arg(left, "surrogatepass")?, token_arg(right, "surrogatepass")?) else {
            return Ok(None);
        };
        Ok(self.inner.rank(&l, &r))
    }

    /// All scores as float32 bytes (for `array('f')`).
    fn scores_bytes<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        let s = self.inner.scores();
        let mut v = Vec::with_capacity(s.len() * 4);
        for x in s {
            v.extend_from_slice(&x.to_ne_bytes());
        }
        PyBytes::new(py, &v)
    }

    /// GGUF token types (1 = normal where the file has none).
    fn types(&self) -> Vec<i32> {
        self.inner.types().to_vec()
    }

    /// Ids whose text was empty in the file (stored as `[EMPTY_<id>]`).
    fn empty_ids(&self) -> Vec<u32> {
        self.inner.empty.clone()
    }

    #[getter]
    fn max_token_len(&self) -> usize {
        self.inner.max_token_len()
    }

    #[getter]
    fn has_merges(&self) -> bool {
        self.inner.has_merges()
    }

    #[getter]
    fn n_merges(&self) -> usize {
        self.inner.n_merges()
    }

    /// Token of one byte for SPM byte fallback (`<0xXX>`, else the byte itself), or None.
    fn byte_token(&self, b: u8) -> Option<u32> {
        self.inner.byte_token(b)
    }

    /// Ids of one pre-tokenized word (byte-encoded already when `byte_encode`).
    #[pyo3(signature = (word, byte_encode, ignore_merges, newline_runs = false))]
    fn bpe_word(&self, word: &Bound<'_, PyString>, byte_encode: bool, ignore_merges: bool, newline_runs: bool) -> Vec<u32> {
        let Some(w) = str_bytes(word, "surrogatepass") else { return vec![] };
        let mut out = Vec::new();
        self.inner.bpe_word(&w, BpeOptions { byte_encode, ignore_merges, newline_runs }, &mut out);
        out
    }

    /// SentencePiece BPE of `text` (spaces escaped). LookupError(byte) when byte fallback
    /// needs a byte that has no token.
    fn spm(&self, text: &[u8]) -> PyResult<Vec<u32>> {
        let mut out = Vec::new();
        self.inner.spm(text, &mut out).map_err(|b| PyLookupError::new_err(b))?;
        Ok(out)
    }

    /// Tokens with U+2581 right after another character, sorted.
    fn bridge_tokens<'py>(&self, py: Python<'py>) -> Vec<Bound<'py, PyBytes>> {
        self.inner.bridge_tokens().into_iter().map(|b| PyBytes::new(py, b)).collect()
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyVocabStore>()?;
    Ok(())
}
