//! GBNF matching for Python (pyllama.grammar's Rust engine): `GrammarRules` (a checked
//! grammar, from the rule arrays the Python parser builds), `TokenTrie` (a vocabulary's
//! pieces, once per vocabulary) and `GrammarState` (stacks + partial UTF-8; accept,
//! allows, full-vocabulary masks with the GIL released). Bad arrays raise ValueError.

use std::sync::Arc;

use numpy::PyArray1;
use pyllama_core::grammar::{Grammar, State, TokenTrie};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::errors::to_py;

/// A checked grammar: llama.cpp's rule elements laid out flat (`types[p]`, `values[p]`,
/// `rule_start[r]`; every rule ends with END) and the index of the root rule.
#[pyclass(name = "GrammarRules", module = "pyllama._core", frozen)]
pub struct PyGrammarRules {
    inner: Arc<Grammar>,
}

#[pymethods]
impl PyGrammarRules {
    #[new]
    fn new(py: Python<'_>, types: Vec<u8>, values: Vec<u32>, rule_start: Vec<u32>, root: u32) -> PyResult<Self> {
        let g = py.allow_threads(|| Grammar::new(types, values, rule_start, root)).map_err(to_py)?;
        Ok(PyGrammarRules { inner: Arc::new(g) })
    }

    #[getter]
    fn n_elements(&self) -> usize {
        self.inner.n_elements()
    }
}

/// A vocabulary's token pieces as a trie (built once per vocabulary, shared).
#[pyclass(name = "TokenTrie", module = "pyllama._core", frozen)]
pub struct PyTokenTrie {
    inner: Arc<TokenTrie>,
}

#[pymethods]
impl PyTokenTrie {
    /// `pieces[t]`: token t's bytes; `eog`: the end-of-generation ids.
    #[new]
    fn new(py: Python<'_>, pieces: Vec<Bound<'_, PyBytes>>, eog: Vec<u32>) -> PyResult<Self> {
        let owned: Vec<Vec<u8>> = pieces.iter().map(|b| b.as_bytes().to_vec()).collect();
        let t = py
            .allow_threads(move || {
                let slices: Vec<&[u8]> = owned.iter().map(|p| p.as_slice()).collect();
                TokenTrie::new(&slices, &eog)
            })
            .map_err(to_py)?;
        Ok(PyTokenTrie { inner: Arc::new(t) })
    }

    #[getter]
    fn n_vocab(&self) -> usize {
        self.inner.n_vocab()
    }

    #[getter]
    fn n_nodes(&self) -> usize {
        self.inner.n_nodes()
    }
}

/// The mutable part of a grammar: stacks and the partial UTF-8 sequence.
#[pyclass(name = "GrammarState", module = "pyllama._core")]
pub struct PyGrammarState {
    grammar: Arc<Grammar>,
    state: State,
}

#[pymethods]
impl PyGrammarState {
    /// The start state of `rules`.
    #[new]
    fn new(rules: &PyGrammarRules) -> Self {
        PyGrammarState { grammar: rules.inner.clone(), state: rules.inner.start_state() }
    }

    /// Accept token `token` spelled `piece`; False (state unchanged) when no stack survives.
    fn accept_token(&mut self, token: u32, piece: &[u8]) -> bool {
        match self.state.next(&self.grammar, token, piece) {
            Some(s) => {
                self.state = s;
                true
            }
            None => false,
        }
    }

    /// Accept text (no token ids); False when no stack is left (the state is then failed).
    fn accept_bytes(&mut self, data: &[u8]) -> bool {
        self.state.accept_bytes(&self.grammar, data)
    }

    /// llama.cpp's verdict on one candidate token (not end-of-generation).
    fn allows(&self, token: u32, piece: &[u8]) -> bool {
        self.state.allows(&self.grammar, token, piece)
    }

    /// bool [n_vocab]: the tokens of `trie`'s vocabulary accepted now (EOG where the grammar
    /// may end).
    fn mask<'py>(&self, py: Python<'py>, trie: &PyTokenTrie) -> PyResult<Bound<'py, PyArray1<bool>>> {
        let (g, t, s) = (&self.grammar, &trie.inner, &self.state);
        let out = py
            .allow_threads(|| {
                let mut out = vec![false; t.n_vocab()];
                g.mask(t, s, &mut out).map(|_| out)
            })
            .map_err(to_py)?;
        Ok(PyArray1::from_vec(py, out))
    }

    /// Equal for two states of this grammar exactly when they are the same state.
    fn state_key(&self) -> (u64, u32, u32, i32) {
        self.grammar.state_key(&self.state)
    }

    #[getter]
    fn can_end(&self) -> bool {
        self.state.can_end()
    }

    #[getter]
    fn failed(&self) -> bool {
        self.state.stacks.is_empty()
    }

    #[getter]
    fn partial(&self) -> (u32, i32) {
        self.state.partial
    }

    #[getter]
    fn stacks(&self) -> Vec<Vec<u32>> {
        self.state.stacks.clone()
    }

    fn reset(&mut self) {
        self.state = self.grammar.start_state();
    }

    fn copy(&self) -> Self {
        PyGrammarState { grammar: self.grammar.clone(), state: self.state.clone() }
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyGrammarRules>()?;
    m.add_class::<PyTokenTrie>()?;
    m.add_class::<PyGrammarState>()?;
    Ok(())
}
