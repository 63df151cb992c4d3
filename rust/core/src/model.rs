//! A loaded model (pipeline steps 2-6): the GGUF file(s), the architecture, the
//! hyperparameters and the tensor map, checked against the architecture's schema.

use crate::error::{Error, Result};
use crate::ggml_type::GgmlType;
use crate::gguf::{GgufFile, LoadMode, TensorInfo, Value};
use crate::hparams::{HParams, Meta};
use crate::models::{self, Arch, Need};
use std::collections::HashMap;

/// A borrowed view of one tensor's bytes.
#[derive(Clone, Copy)]
pub struct TensorView<'a> {
    pub name: &'a str,
    pub ty: GgmlType,
    /// ggml order: ne[0] is the row length.
    pub ne: [usize; 4],
    pub data: &'a [u8],
}

impl<'a> TensorView<'a> {
    pub fn n_rows(&self) -> usize {
        self.ne[1] * self.ne[2] * self.ne[3]
    }
    pub fn row_bytes(&self) -> usize {
        self.ty.row_size(self.ne[0]).unwrap_or(0)
    }
    pub fn row(&self, i: usize) -> &'a [u8] {
        let rb = self.row_bytes();
        &self.data[i * rb..(i + 1) * rb]
    }
}

pub struct LoadParams<'a> {
    pub load_mode: LoadMode,
    pub vocab_only: bool,
    pub check_tensors: bool,
    /// Called with progress in [0, 1]; returning false cancels the load.
    pub progress: Option<&'a mut (dyn FnMut(f32) -> bool + Send)>,
}

impl Default for LoadParams<'_> {
    fn default() -> Self {
        LoadParams { load_mode: LoadMode::Auto, vocab_only: false, check_tensors: false, progress: None }
    }
}

pub struct Model {
    pub files: Vec<GgufFile>,
    pub arch: &'static dyn Arch,
    pub hparams: HParams,
    /// name -> (file index, index into that file's tensors)
    pub tensor_map: HashMap<String, (usize, usize)>,
    pub vocab_only: bool,
}

impl Model {
    pub fn load(paths: &[String], mut params: LoadParams) -> Result<Model> {
        let mut files = Vec::with_capacity(paths.len());
        for p in paths {
            files.push(GgufFile::open(p, params.load_mode)?);
        }
        let first = files.first().ok_or_else(|| Error::Invalid("no model file given".into()))?;
        let arch_name = first
            .get("general.architecture")
            .and_then(Value::as_str)
            .ok_or_else(|| Error::Unsupported(format!("{}: missing metadata key 'general.architecture'", first.path)))?
            .to_string();
        let arch = models::find(&arch_name)?;
        let mut tensor_map = HashMap::new();
        for (fi, f) in files.iter().enumerate() {
            for (ti, t) in f.tensors.iter().enumerate() {
                if tensor_map.insert(t.name.clone(), (fi, ti)).is_some() {
                    return Err(Error::Gguf { path: f.path.clone(), offset: None, msg: format!("duplicate tensor '{}' across split files", t.name) });
                }
            }
        }
        let n_vocab = Self::guess_n_vocab(&files, &tensor_map);
        let meta = Meta { file: &files[0], arch: arch.name() };
        let hparams = arch.hparams(&meta, n_vocab)?;
        let model = Model { files, arch, hparams, tensor_map, vocab_only: params.vocab_only };
        if !params.vocab_only {
            model.check_schema()?;
            let total = model.tensor_map.len().max(1);
            for (i, name) in model.tensor_map.keys().enumerate() {
                let t = model.tensor(name).unwrap();
                if !t.ty.is_supported() {
                    return Err(Error::Unsupported(format!("tensor '{}': unsupported tensor type {}", name, t.ty)));
                }
                if let Some(cb) = params.progress.as_mut() {
                    if !cb((i + 1) as f32 / total as f32) {
                        return Err(Error::Cancelled);
                    }
                }
            }
        }
        Ok(model)
    }

    fn guess_n_vocab(files: &[GgufFile], map: &HashMap<String, (usize, usize)>) -> usize {
        if let Some(&(fi, ti)) = map.get("token_embd.weight") {
            return files[fi].tensors[ti].ne[1] as usize;
        }
        files[0].get("tokenizer.ggml.tokens").and_then(Value::as_array).map_or(0, |a| a.len())
    }

    fn check_schema(&self) -> Result<()> {
        for spec in self.arch.tensors(&self.hparams) {
            let info = match self.info(&spec.name) {
                Some(i) => i,
                None => match spec.need {
                    Need::Required => {
                        return Err(Error::Unsupported(format!(
                            "{}: missing tensor '{}' required by architecture '{}'",
                            self.files[0].path,
                            spec.name,
                            self.arch.name()
                        )))
                    }
                    _ => continue,
                },
            };
            let mut want = [1u64; 4];
            want[..spec.shape.len()].copy_from_slice(&spec.shape);
            if info.ne != want {
                return Err(Error::Unsupported(format!(
                    "tensor '{}' has wrong shape {:?}, expected {:?}",
                    spec.name,
                    &info.ne[..info.n_dims.max(1) as usize],
                    spec.shape
                )));
            }
        }
        Ok(())
    }

    pub fn info(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_map.get(name).map(|&(fi, ti)| &self.files[fi].tensors[ti])
    }

    pub fn tensor(&self, name: &str) -> Option<TensorView<'_>> {
        let &(fi, ti) = self.tensor_map.get(name)?;
        let f = &self.files[fi];
        let t = &f.tensors[ti];
        Some(TensorView {
            name: &t.name,
            ty: t.ty,
            ne: t.ne.map(|d| d as usize),
            data: f.tensor_data(t),
        })
    }

    pub fn meta(&self, key: &str) -> Option<&Value> {
        self.files[0].get(key)
    }
}
