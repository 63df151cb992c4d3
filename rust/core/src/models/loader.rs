//! Binding a model's tensors (pipeline step 6), after llama.cpp's `create_tensor`: one
//! call per tensor states its name, its shape and whether it must be there, and returns
//! the view the forward pass computes with. The schema and the lookup are the same code,
//! so they cannot drift apart.
//!
//! An architecture's `Arch::build_forward` binds everything through a `Loader`. Model
//! loading runs it once in checking mode (`Loader::check`), so a file with a missing
//! tensor or a wrong shape fails at load, naming the tensor, the shape expected and the
//! shape found; each context runs it again to keep the views (`Loader::new`).

use crate::error::{Error, Result};
use crate::hparams::HParams;
use crate::model::{Model, TensorView};
use crate::quant;
use std::sync::Arc;

/// What keeps the tensor bytes of a `Forward`'s views alive: the model (None only for
/// the forward pass built while checking, which is dropped before `Model::load` returns).
/// A `Forward` holding views declares it after them, so it drops last.
pub type Keep = Option<Arc<Model>>;

pub struct Loader<'m> {
    model: &'m Model,
    keep: Keep,
}

impl<'m> Loader<'m> {
    /// Binding for a context: the views stay valid as long as `keep()` is held.
    pub fn new(model: &'m Arc<Model>) -> Loader<'m> {
        Loader { model, keep: Some(model.clone()) }
    }

    /// Checking the schema while the model loads: the forward pass built is dropped at once.
    pub fn check(model: &'m Model) -> Loader<'m> {
        Loader { model, keep: None }
    }

    /// True while checking at load: refusals that depend on more than the file's tensors
    /// (a feature not implemented yet) belong to context creation, not to loading.
    pub fn checking(&self) -> bool {
        self.keep.is_none()
    }

    pub fn hp(&self) -> &'m HParams {
        &self.model.hparams
    }

    pub fn model(&self) -> &'m Model {
        self.model
    }

    pub fn keep(&self) -> Keep {
        self.keep.clone()
    }

    /// A required tensor of `shape` (ggml order, ne[0] first, trailing 1s omitted).
    pub fn req(&self, name: &str, shape: &[usize]) -> Result<TensorView<'static>> {
        self.opt(name, shape)?.ok_or_else(|| {
            Error::Unsupported(format!(
                "{}: missing tensor '{name}' required by architecture '{}'",
                self.model.files[0].path,
                self.model.arch.name()
            ))
        })
    }

    /// An optional tensor: None when the file has none of that name; a wrong shape is an error.
    pub fn opt(&self, name: &str, shape: &[usize]) -> Result<Option<TensorView<'static>>> {
        let Some(t) = self.model.tensor(name) else { return Ok(None) };
        if shape.len() > 4 || t.ne[..shape.len()] != *shape || t.ne[shape.len()..].iter().any(|&d| d != 1) {
            let n_dims = self.model.info(name).map_or(1, |i| i.n_dims.max(1) as usize);
            return Err(Error::Unsupported(format!(
                "{}: tensor '{name}' has wrong shape {:?}, expected {:?}",
                self.model.files[0].path,
                &t.ne[..n_dims.min(4)],
                shape
            )));
        }
        // SAFETY: the view borrows the model's mapped or owned tensor bytes, which never move
        // and live as long as the model; every `Forward` keeps the model alive (`Keep`) for
        // as long as it holds the view (see `Keep` for the checking case).
        Ok(Some(unsafe { std::mem::transmute::<TensorView<'_>, TensorView<'static>>(t) }))
    }

    /// A required small tensor (norm weight, bias, rope factors) as owned f32.
    pub fn req_vec(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        let t = self.req(name, shape)?;
        self.to_f32(&t)
    }

    pub fn opt_vec(&self, name: &str, shape: &[usize]) -> Result<Option<Vec<f32>>> {
        self.opt(name, shape)?.map(|t| self.to_f32(&t)).transpose()
    }

    fn to_f32(&self, t: &TensorView) -> Result<Vec<f32>> {
        let n: usize = t.ne.iter().product();
        let mut v = vec![0f32; n];
        if self.checking() {
            // checking is about names and shapes; the values are read by contexts (and the
            // tensor types were checked by the load itself)
            return Ok(v);
        }
        quant::dequantize_row(t.ty, t.data, &mut v).map_err(|e| Error::Unsupported(format!("tensor '{}': {e}", t.name)))?;
        Ok(v)
    }
}
