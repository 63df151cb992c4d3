//! A loaded model (pipeline steps 2-6): the GGUF file(s), the architecture, the
//! hyperparameters and the tensor map, checked against the architecture's schema.

use crate::error::{Error, Result};
use crate::ggml_type::GgmlType;
use crate::gguf::{validate, GgufFile, LoadMode, TensorInfo, Value};
use crate::hparams::{HParams, Meta};
use crate::models::{self, Arch};
pub use crate::quant::repack::Layout;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

pub mod ftype {
    //! llama.cpp's `llama_ftype` (include/llama.h) and `llama_ftype_name`
    //! (src/llama-model-loader.cpp).
    use crate::ggml_type::GgmlType;

    pub fn name(ft: u32) -> &'static str {
        match ft & !1024 {
            0 => "all F32",
            1 => "F16",
            32 => "BF16",
            40 => "Q1_0",
            41 => "Q2_0",
            2 => "Q4_0",
            3 => "Q4_1",
            8 => "Q5_0",
            9 => "Q5_1",
            7 => "Q8_0",
            38 => "MXFP4 MoE",
            39 => "NVFP4",
            10 => "Q2_K - Medium",
            21 => "Q2_K - Small",
            11 => "Q3_K - Small",
            12 => "Q3_K - Medium",
            13 => "Q3_K - Large",
            14 => "Q4_K - Small",
            15 => "Q4_K - Medium",
            16 => "Q5_K - Small",
            17 => "Q5_K - Medium",
            18 => "Q6_K",
            36 => "TQ1_0 - 1.69 bpw ternary",
            37 => "TQ2_0 - 2.06 bpw ternary",
            19 => "IQ2_XXS - 2.0625 bpw",
            20 => "IQ2_XS - 2.3125 bpw",
            28 => "IQ2_S - 2.5 bpw",
            29 => "IQ2_M - 2.7 bpw",
            22 => "IQ3_XS - 3.3 bpw",
            23 => "IQ3_XXS - 3.0625 bpw",
            24 => "IQ1_S - 1.5625 bpw",
            31 => "IQ1_M - 1.75 bpw",
            25 => "IQ4_NL - 4.5 bpw",
            30 => "IQ4_XS - 4.25 bpw",
            26 => "IQ3_S - 3.4375 bpw",
            27 => "IQ3_S mix - 3.66 bpw",
            _ => "unknown, may not work",
        }
    }

    /// The file type llama.cpp guesses from the most common tensor type (ties go to the
    /// type that reached the count first, as llama.cpp counts in its map's order).
    pub fn guess(types: impl Iterator<Item = GgmlType>) -> u32 {
        use GgmlType::*;
        let mut counts: Vec<(GgmlType, u32)> = Vec::new();
        let (mut best, mut best_n) = (F32, 0u32);
        for t in types {
            let n = match counts.iter_mut().find(|(ty, _)| *ty == t) {
                Some((_, n)) => {
                    *n += 1;
                    *n
                }
                None => {
                    counts.push((t, 1));
                    1
                }
            };
            if n > best_n {
                best_n = n;
                best = t;
            }
        }
        match best {
            F32 => 0,
            F16 => 1,
            BF16 => 32,
            Q4_0 => 2,
            Q4_1 => 3,
            Q5_0 => 8,
            Q5_1 => 9,
            Q8_0 => 7,
            Q2_K => 10,
            Q3_K => 12,
            Q4_K => 15,
            Q5_K => 17,
            Q6_K => 18,
            TQ1_0 => 36,
            TQ2_0 => 37,
            IQ2_XXS => 19,
            IQ2_XS => 20,
            IQ2_S => 28,
            IQ3_XXS => 23,
            IQ1_S => 24,
            IQ1_M => 31,
            IQ4_NL => 25,
            IQ4_XS => 30,
            IQ3_S => 26,
            _ => 0,
        }
    }
}

/// A borrowed view of one tensor's bytes.
#[derive(Clone, Copy)]
pub struct TensorView<'a> {
    pub name: &'a str,
    pub ty: GgmlType,
    /// ggml order: ne[0] is the row length.
    pub ne: [usize; 4],
    pub data: &'a [u8],
    /// How `data` is laid out: the file's rows, or (a CPU matmul weight repacked at load)
    /// `quant::repack`'s x4 row groups, which only the matmul reads (`ops::matmul`).
    pub layout: Layout,
}

impl<'a> TensorView<'a> {
    pub fn n_rows(&self) -> usize {
        self.ne[1] * self.ne[2] * self.ne[3]
    }
    pub fn row_bytes(&self) -> usize {
        self.ty.row_size(self.ne[0]).unwrap_or(0)
    }
    /// Row i's bytes (a plain-layout tensor: embeddings, norms; a repacked matmul weight
    /// has no rows of its own and panics here).
    pub fn row(&self, i: usize) -> &'a [u8] {
        assert_eq!(self.layout, Layout::Plain, "tensor '{}': row() of a repacked matmul weight", self.name);
        let rb = self.row_bytes();
        &self.data[i * rb..(i + 1) * rb]
    }
}

pub struct LoadParams<'a> {
    pub load_mode: LoadMode,
    pub vocab_only: bool,
    pub check_tensors: bool,
    /// Called with progress in [0, 1] (monotonic, 0.0 first, 1.0 last, at least once per
    /// tensor); returning false cancels the load.
    pub progress: Option<&'a mut (dyn FnMut(f32) -> bool + Send)>,
    /// Metadata overrides (llama.h's kv_overrides): each replaces or adds a key of the
    /// first file before the hyperparameters are read. An override must have the same
    /// kind (integer, float, bool, string) as the value it replaces.
    pub kv_overrides: Vec<(String, Value)>,
    /// llama.cpp's n_gpu_layers: the matmuls of the top N layers on the GPU, the output
    /// layer counting as the topmost (N = 1: the output layer only; N > n_layer: all;
    /// negative = all). 0 = none. Without the `gpu`
    /// feature, or without a usable adapter, a warning says so and the CPU runs everything.
    pub n_gpu_layers: i32,
    /// llama.cpp's main_gpu: under `SplitMode::None`, the usable GPU adapter
    /// (`gpu::usable_adapters`) everything offloaded goes to; must be 0 under `Layer`.
    pub main_gpu: usize,
    /// llama.cpp's split_mode: how the offloaded layers are spread over the usable adapters.
    pub split_mode: SplitMode,
    /// llama.cpp's tensor_split: under `SplitMode::Layer`, each usable adapter's share of
    /// the offloaded layers (entries past the adapter count are not read; none or all zero:
    /// equal shares, wgpu reporting no free memory). At most `MAX_DEVICES` entries, each
    /// finite and >= 0.
    pub tensor_split: Vec<f32>,
    /// Use a software adapter (lavapipe) when no hardware one is there (tests).
    pub gpu_allow_software: bool,
}

impl Default for LoadParams<'_> {
    fn default() -> Self {
        LoadParams {
            load_mode: LoadMode::Auto,
            vocab_only: false,
            check_tensors: false,
            progress: None,
            kv_overrides: Vec::new(),
            n_gpu_layers: 0,
            main_gpu: 0,
            split_mode: SplitMode::Layer,
            tensor_split: Vec::new(),
            gpu_allow_software: false,
        }
    }
}

/// llama.h's LLAMA_MAX_DEVICES (llama_max_devices): the longest tensor_split.
pub const MAX_DEVICES: usize = 16;

/// llama.h's enum llama_split_mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SplitMode {
    /// LLAMA_SPLIT_MODE_NONE: one adapter, main_gpu.
    None,
    /// LLAMA_SPLIT_MODE_LAYER: whole layers (and their KV cache) spread over the adapters.
    Layer,
    /// LLAMA_SPLIT_MODE_ROW: rows of each matrix across the adapters (not supported: an error
    /// when a layer is offloaded, as llama.cpp's Vulkan backend).
    Row,
    /// LLAMA_SPLIT_MODE_TENSOR: tensor parallelism (not supported, as `Row`).
    Tensor,
}

impl SplitMode {
    /// From llama.h's value (0 none, 1 layer, 2 row, 3 tensor).
    pub fn from_i32(v: i32) -> Result<SplitMode> {
        Ok(match v {
            0 => SplitMode::None,
            1 => SplitMode::Layer,
            2 => SplitMode::Row,
            3 => SplitMode::Tensor,
            _ => return Err(Error::Invalid(format!("split_mode = {v}: not one of 0 (none), 1 (layer), 2 (row), 3 (tensor)"))),
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            SplitMode::None => "none",
            SplitMode::Layer => "layer",
            SplitMode::Row => "row",
            SplitMode::Tensor => "tensor",
        }
    }
}

/// Checks tensor_split as llama.cpp's callers do: at most MAX_DEVICES entries (what
/// llama-cpp-python refuses too), each finite and >= 0 (a share).
pub fn check_tensor_split(ts: &[f32]) -> Result<()> {
    if ts.len() > MAX_DEVICES {
        return Err(Error::Invalid(format!("tensor_split has {} entries: at most {MAX_DEVICES} (llama_max_devices)", ts.len())));
    }
    if let Some((i, x)) = ts.iter().enumerate().find(|(_, x)| !x.is_finite() || **x < 0.0) {
        return Err(Error::Invalid(format!("tensor_split[{i}] = {x}: each share must be a finite number >= 0")));
    }
    Ok(())
}

pub struct Model {
    pub files: Vec<GgufFile>,
    pub arch: &'static dyn Arch,
    pub hparams: HParams,
    /// name -> (file index, index into that file's tensors)
    pub tensor_map: HashMap<String, (usize, usize)>,
    pub vocab_only: bool,
    pub load_mode: LoadMode,
    /// Non-fatal problems met while loading (mlock or O_DIRECT refused), for logging.
    pub warnings: Vec<String>,
    /// The backend the offloaded layers run on (`LoadParams::n_gpu_layers`), if any.
    pub device: Option<Arc<dyn crate::backend::Backend>>,
    /// The tensors (file index, tensor index) repacked at load into `quant::repack`'s x4
    /// layout (`repack_weights`).
    pub x4: HashSet<(usize, usize)>,
}

/// The weights `Model::repack_weights` may repack: the layers' projections, which every
/// architecture reads only through the matmul.
fn repackable(name: &str) -> bool {
    let Some((layer, tail)) = name.strip_prefix("blk.").and_then(|r| r.split_once('.')) else { return false };
    layer.parse::<u32>().is_ok()
        && matches!(
            tail,
            "attn_q.weight"
                | "attn_k.weight"
                | "attn_v.weight"
                | "attn_qkv.weight"
                | "attn_output.weight"
                | "ffn_gate.weight"
                | "ffn_up.weight"
                | "ffn_down.weight"
        )
}

/// `<prefix>-00001-of-00003.gguf` -> (`<prefix>`, split_no 0-based, count), as llama.cpp's
/// llama_split_prefix reads split file names.
pub fn split_prefix(path: &str) -> Option<(String, usize, usize)> {
    let stem = path.strip_suffix(".gguf")?;
    let (rest, count) = stem.rsplit_once("-of-")?;
    let (prefix, no) = rest.rsplit_once('-')?;
    if no.len() != 5 || count.len() != 5 || prefix.is_empty() {
        return None;
    }
    let no: usize = no.parse().ok()?;
    let count: usize = count.parse().ok()?;
    (no >= 1 && no <= count).then(|| (prefix.to_string(), no - 1, count))
}

/// llama_split_path: the file name of split `no` (0-based) of `count`.
pub fn split_path(prefix: &str, no: usize, count: usize) -> String {
    format!("{prefix}-{:05}-of-{:05}.gguf", no + 1, count)
}

fn split_key(f: &GgufFile, key: &str) -> Result<Option<usize>> {
    match f.get(key) {
        None => Ok(None),
        Some(v) => v.as_i64().filter(|&x| x >= 0).map(|x| Some(x as usize)).ok_or_else(|| Error::Gguf {
            path: f.path.clone(),
            offset: None,
            msg: format!("metadata key '{key}' must be a non-negative integer"),
        }),
    }
}

/// Replace or add one metadata value, keeping the file's value type where it has one.
fn apply_override(f: &mut GgufFile, key: &str, v: &Value) -> Result<()> {
    let kind = |v: &Value| match v {
        Value::Bool(_) => "bool",
        Value::F32(_) | Value::F64(_) => "float",
        Value::String(_) => "str",
        Value::Array(_) => "array",
        _ => "int",
    };
    let bad = |old: &Value| {
        Error::Invalid(format!(
            "kv_override '{key}': a {} value cannot override the file's {} value",
            kind(v),
            kind(old)
        ))
    };
    let slot = f.metadata.iter_mut().find(|(k, _)| k == key);
    let Some((_, old)) = slot else {
        f.metadata.push((key.to_string(), v.clone()));
        return Ok(());
    };
    let new = match (&*old, v) {
        (o, n) if kind(o) != kind(n) => return Err(bad(o)),
        (Value::F32(_), n) => Value::F32(n.as_f64().unwrap() as f32),
        (Value::F64(_), n) => Value::F64(n.as_f64().unwrap()),
        (o, n) if kind(o) == "int" => {
            let x = n.as_i64().ok_or_else(|| bad(o))?;
            let out_of_range = || Error::Invalid(format!("kv_override '{key}': {x} does not fit the file's value type"));
            match o {
                Value::U8(_) => Value::U8(u8::try_from(x).map_err(|_| out_of_range())?),
                Value::I8(_) => Value::I8(i8::try_from(x).map_err(|_| out_of_range())?),
                Value::U16(_) => Value::U16(u16::try_from(x).map_err(|_| out_of_range())?),
                Value::I16(_) => Value::I16(i16::try_from(x).map_err(|_| out_of_range())?),
                Value::U32(_) => Value::U32(u32::try_from(x).map_err(|_| out_of_range())?),
                Value::I32(_) => Value::I32(i32::try_from(x).map_err(|_| out_of_range())?),
                Value::U64(_) => Value::U64(u64::try_from(x).map_err(|_| out_of_range())?),
                _ => Value::I64(x),
            }
        }
        (_, n) => n.clone(),
    };
    *old = new;
    Ok(())
}

impl Model {
    /// Upload the weights `params.n_gpu_layers` asks for; no usable adapter (or a build
    /// without the `gpu` feature) is a warning, and the CPU runs everything.
    fn offload(&mut self, params: &mut LoadParams) -> Result<()> {
        let ngl = params.n_gpu_layers;
        #[cfg(feature = "gpu")]
        {
            let base = if !self.load_mode.uses_mmap() { 0.5 } else { 0.0 };
            let start = base + 0.5 * (1.0 - base);
            let op = crate::gpu::OffloadParams {
                n_gpu_layers: ngl,
                main_gpu: params.main_gpu,
                split_mode: params.split_mode,
                tensor_split: params.tensor_split.clone(),
                allow_software: params.gpu_allow_software,
            };
            let mut prog = |done: u64, total: u64| {
                let p = start + (1.0 - start) * (done as f64 / total.max(1) as f64) as f32;
                params.progress.as_mut().is_none_or(|cb| cb(p.clamp(0.0, 1.0)))
            };
            match crate::gpu::offload(self, &op, &mut prog) {
                Ok(o) => self.device = Some(Arc::new(o)),
                Err(Error::Cancelled) => return Err(Error::Cancelled),
                // a main_gpu that names no adapter, or a split the backend cannot do, is the
                // caller's mistake
                Err(e @ Error::Invalid(_)) => return Err(e),
                // out of device memory: the load fails, saying how many layers would fit
                Err(e @ Error::Alloc(_)) => return Err(e),
                Err(e) => self.warnings.push(format!("n_gpu_layers = {ngl}: {e}; every layer runs on the CPU")),
            }
        }
        #[cfg(not(feature = "gpu"))]
        {
            let _ = &params;
            self.warnings
                .push(format!("n_gpu_layers = {ngl}: pyllama was built without GPU support; every layer runs on the CPU"));
        }
        Ok(())
    }

    /// Load a model from `paths`: one file, the first part of a split model (the other
    /// parts are found by name), or every part of a split model in order.
    pub fn load(paths: &[String], mut params: LoadParams) -> Result<Model> {
        let first_path = paths.first().ok_or_else(|| Error::Invalid("no model file given".into()))?;
        check_tensor_split(&params.tensor_split)?;
        let mode = params.load_mode;
        fn report(p: f32, params: &mut LoadParams) -> Result<()> {
            if let Some(cb) = params.progress.as_mut() {
                if !cb(p.clamp(0.0, 1.0)) {
                    return Err(Error::Cancelled);
                }
            }
            Ok(())
        }
        report(0.0, &mut params)?;

        // Open the first file; it says whether (and into how many files) the model is split.
        let mut sizes: Vec<u64> = paths.iter().map(|p| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0)).collect();
        // a map's pages are populated at load (all but vocab-only loads; mlock maps them
        // anyway), with the reading modes' share of the progress
        let populate = mode.uses_mmap() && !mode.uses_mlock() && !params.vocab_only;
        let reads = !mode.uses_mmap() || populate;
        // Progress: bytes read (reading modes only) then bytes of tensors set up.
        let mut read_done = 0u64;
        let mut total_read: u64 = if reads { sizes.iter().sum() } else { 0 };
        fn open_one(path: &str, mode: LoadMode, populate: bool, total_read: u64, read_done: &mut u64, params: &mut LoadParams) -> Result<GgufFile> {
            let base = *read_done;
            let mut cb = |done: usize, _total: usize| -> bool {
                match params.progress.as_mut() {
                    // Reading is given the first half of the bar.
                    Some(cb) => cb((0.5 * (base + done as u64) as f64 / total_read.max(1) as f64).min(0.5) as f32),
                    None => true,
                }
            };
            let f = GgufFile::open_with_progress(path, mode, &mut cb)?;
            if populate && !f.storage.populate(&mut cb) {
                return Err(Error::Cancelled);
            }
            *read_done += f.file_size;
            Ok(f)
        }
        // auto: the weights read into memory on 2 MiB pages where that is possible and they
        // fit (`storage::auto_reads`), else mapped; a vocabulary-only load always maps
        let vocab_only = params.vocab_only;
        let file_mode = |total: u64| if mode == LoadMode::Auto && !vocab_only && crate::gguf::storage::auto_reads(total) { LoadMode::None } else { mode };
        let mut files = vec![open_one(first_path, file_mode(sizes.iter().sum()), populate, total_read, &mut read_done, &mut params)?];
        let n_split = split_key(&files[0], "split.count")?.unwrap_or(0);
        let mut paths: Vec<String> = paths.to_vec();
        if n_split > 1 {
            let no = split_key(&files[0], "split.no")?.unwrap_or(0);
            if no != 0 {
                return Err(Error::Gguf {
                    path: first_path.clone(),
                    offset: None,
                    msg: format!("this is split {} of {n_split}; load the model from the first split", no + 1),
                });
            }
            if paths.len() == 1 {
                let (prefix, _, _) =
                    split_prefix(first_path).filter(|&(_, n, c)| n == 0 && c == n_split).ok_or_else(|| Error::Gguf {
                        path: first_path.clone(),
                        offset: None,
                        msg: format!(
                            "split.count is {n_split} but the file name does not follow \
                             <name>-00001-of-{n_split:05}.gguf; pass all the parts"
                        ),
                    })?;
                paths = (0..n_split).map(|i| split_path(&prefix, i, n_split)).collect();
                sizes = paths.iter().map(|p| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0)).collect();
                if reads {
                    total_read = sizes.iter().sum();
                }
            }
            if paths.len() != n_split {
                return Err(Error::Gguf {
                    path: first_path.clone(),
                    offset: None,
                    msg: format!("invalid split count: {} files given but split.count is {n_split}", paths.len()),
                });
            }
            for (i, p) in paths.iter().enumerate().skip(1) {
                if !std::path::Path::new(p).exists() {
                    return Err(Error::Io {
                        path: p.clone(),
                        what: format!("split {} of {n_split} of {first_path} is missing", i + 1),
                        source: std::io::Error::new(std::io::ErrorKind::NotFound, "no such file"),
                    });
                }
                let f = open_one(p, file_mode(sizes.iter().sum()), populate, total_read, &mut read_done, &mut params)?;
                match split_key(&f, "split.no")? {
                    Some(n) if n == i => {}
                    Some(n) => {
                        return Err(Error::Gguf {
                            path: p.clone(),
                            offset: None,
                            msg: format!("invalid split file index {n}, expected {i}"),
                        })
                    }
                    None => {
                        return Err(Error::Gguf { path: p.clone(), offset: None, msg: "missing key split.no in a split file".into() })
                    }
                }
                files.push(f);
            }
        } else if paths.len() > 1 {
            return Err(Error::Gguf {
                path: first_path.clone(),
                offset: None,
                msg: format!("{} files given but the model is not split (no split.count > 1)", paths.len()),
            });
        }

        let mut tensor_map = HashMap::new();
        for (fi, f) in files.iter().enumerate() {
            for (ti, t) in f.tensors.iter().enumerate() {
                if tensor_map.insert(t.name.clone(), (fi, ti)).is_some() {
                    return Err(Error::Gguf {
                        path: f.path.clone(),
                        offset: None,
                        msg: format!("invalid model: tensor '{}' is duplicated across split files", t.name),
                    });
                }
            }
        }
        if n_split > 1 {
            if let Some(n) = split_key(&files[0], "split.tensors.count")? {
                if n != tensor_map.len() {
                    return Err(Error::Gguf {
                        path: files[0].path.clone(),
                        offset: None,
                        msg: format!("corrupted model: {n} tensors expected but {} found in the splits", tensor_map.len()),
                    });
                }
            }
        }
        for (k, v) in &params.kv_overrides {
            apply_override(&mut files[0], k, v)?;
        }
        let arch_name = match files[0].get("general.architecture") {
            None => {
                return Err(Error::Unsupported(format!("{}: missing metadata key 'general.architecture'", files[0].path)))
            }
            Some(v) => v.as_str().ok_or_else(|| {
                Error::Unsupported(format!("{}: metadata key 'general.architecture' must be a UTF-8 string", files[0].path))
            })?,
        }
        .to_string();
        let arch: &'static dyn Arch = match models::find(&arch_name) {
            Ok(a) => a,
            // llama.cpp reads no hparams for vocab-only loads; any architecture will do.
            Err(_) if params.vocab_only => &models::VocabOnly,
            Err(Error::Unsupported(m)) => return Err(Error::Unsupported(format!("{}: {m}", files[0].path))),
            Err(e) => return Err(e),
        };
        let n_vocab = Self::guess_n_vocab(&files, &tensor_map);
        let meta = Meta { file: &files[0], arch: &arch_name };
        let hparams = match arch.hparams(&meta, n_vocab).and_then(|h| h.check(&files[0].path, arch.moe_for(&h)).map(|_| h)) {
            Ok(h) => h,
            Err(_) if params.vocab_only => HParams::vocab_only(&arch_name, n_vocab),
            Err(e) => return Err(e),
        };
        let warnings = files.iter().flat_map(|f| f.warnings().iter().cloned()).collect();
        let mut model =
            Model {
            files,
            arch,
            hparams,
            tensor_map,
            vocab_only: params.vocab_only,
            load_mode: mode,
            warnings,
            device: None,
            x4: HashSet::new(),
        };
        let offloading = !params.vocab_only && params.n_gpu_layers != 0;
        if !params.vocab_only {
            model.check_schema()?;
            let base = if reads { 0.5 } else { 0.0 };
            let total: u64 = model.files.iter().flat_map(|f| f.tensors.iter()).map(|t| t.nbytes.max(1)).sum();
            let mut done = 0u64;
            for f in &model.files {
                for t in &f.tensors {
                    if !t.ty.is_supported() {
                        return Err(Error::Unsupported(format!(
                            "{}: tensor '{}' has type {}, which pyllama cannot compute with",
                            f.path, t.name, t.ty
                        )));
                    }
                    if params.check_tensors {
                        validate::validate_row_data(t.ty, f.tensor_data(t)).map_err(|why| Error::Gguf {
                            path: f.path.clone(),
                            offset: Some(f.data_offset + t.offset),
                            msg: format!("tensor '{}' has invalid data: {why}", t.name),
                        })?;
                    }
                    done += t.nbytes.max(1);
                    // with offload, the upload is the second half of what is left
                    let span = if offloading { 0.5 * (1.0 - base) } else { 1.0 - base };
                    report(base + span * (done as f64 / total.max(1) as f64) as f32, &mut params)?;
                }
            }
        }
        if offloading {
            model.offload(&mut params)?;
        }
        // (with no device taken: n_gpu_layers asked for on a machine without one)
        if !params.vocab_only && model.device.is_none() {
            model.repack_weights();
        }
        report(1.0, &mut params)?;
        Ok(model)
    }

    /// Repacks, in place, the layers' projection weights that have a single-token kernel
    /// over `quant::repack`'s x4 layout on this CPU (Q5_0, Q4_1, Q4_K on the AVX-512 VNNI set):
    /// a decode step reads each of them as one stream of group-blocks, each field of the four
    /// rows in one load instead of gathered from four rows (`--bench kernels -- x4 huge`, rows of 896 / 576 over 256 MiB,
    /// Zen 4, one thread: Q5_0 18.9 -> 23.8 GB/s, Q4_1 22.5 -> 30.4; rows of 2048: Q4_K 18.0 ->
    /// 23.6-23.9). Only the CPU matmul
    /// reads these tensors (`ops::matmul` takes the layout; every other path gets the plain
    /// rows back), so only weights held in RAM are repacked (a memory map stays the file's
    /// bytes), never when a GPU holds layers, not under `PYLLAMA_NO_REPACK=1`, and only the
    /// 2-D `blk.N.{attn_q,attn_k,attn_v,attn_qkv,attn_output,ffn_gate,ffn_up,ffn_down}.weight`.
    fn repack_weights(&mut self) {
        use crate::quant::repack::{repack_x4_in_place, x4_kernel};
        if crate::quant::cpu::env().no_repack {
            return;
        }
        let set = crate::quant::kernel_set();
        let table = crate::quant::table::table(set);
        let mut jobs = Vec::new();
        for (fi, f) in self.files.iter().enumerate() {
            for (ti, t) in f.tensors.iter().enumerate() {
                let ok = repackable(&t.name)
                    && t.ne[2] == 1
                    && t.ne[3] == 1
                    && t.ne[1] >= crate::quant::repack::GROUP as u64
                    && set == crate::quant::KernelSet::Avx512
                    && x4_kernel(t.ty).is_some()
                    // the x4 kernels run the plain multi-row kernels' float order
                    && table.get(t.ty).rows.is_some()
                    && t.ne[0] % t.ty.block_size() as u64 == 0;
                if ok {
                    jobs.push((fi, ti));
                }
            }
        }
        if jobs.is_empty() || self.files.iter().any(|f| f.storage.is_mmap()) {
            return;
        }
        // the tensors split over the cores (each in place, disjoint byte ranges of its
        // file's buffer): (job index, type, row length, bytes)
        type Slot<'a> = std::sync::Mutex<Option<(usize, GgmlType, usize, &'a mut [u8])>>;
        let n_threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(jobs.len());
        let mut slots: Vec<Slot> = Vec::new();
        for (fi, f) in self.files.iter_mut().enumerate() {
            // (job, type, row length, start, bytes) of this file's tensors, in address order
            let mut mine: Vec<(usize, GgmlType, usize, usize, usize)> = jobs
                .iter()
                .enumerate()
                .filter(|(_, &(jf, _))| jf == fi)
                .map(|(k, &(_, ti))| {
                    let t = &f.tensors[ti];
                    (k, t.ty, t.ne[0] as usize, (f.data_offset + t.offset) as usize, t.nbytes as usize)
                })
                .collect();
            mine.sort_by_key(|m| m.3);
            let Some(bytes) = f.storage.bytes_mut() else { continue };
            let (mut rest, mut at) = (bytes, 0usize);
            for (k, ty, n_in, start, n) in mine {
                let (_, tail) = std::mem::take(&mut rest).split_at_mut(start - at);
                let (data, tail) = tail.split_at_mut(n);
                rest = tail;
                at = start + n;
                slots.push(std::sync::Mutex::new(Some((k, ty, n_in, data))));
            }
        }
        let next = std::sync::atomic::AtomicUsize::new(0);
        let done: Vec<std::sync::atomic::AtomicBool> = jobs.iter().map(|_| std::sync::atomic::AtomicBool::new(false)).collect();
        std::thread::scope(|s| {
            for _ in 0..n_threads {
                s.spawn(|| loop {
                    let k = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(slot) = slots.get(k) else { break };
                    let Some((job, ty, n_in, data)) = slot.lock().map_or(None, |mut g| g.take()) else { continue };
                    // (a tensor it cannot take, which the checks above rule out, stays plain:
                    // the layout check fails before any byte is moved)
                    if repack_x4_in_place(ty, n_in, data).is_ok() {
                        done[job].store(true, std::sync::atomic::Ordering::Relaxed);
                    }
                });
            }
        });
        self.x4 = jobs.into_iter().zip(&done).filter(|(_, d)| d.load(std::sync::atomic::Ordering::Relaxed)).map(|(j, _)| j).collect();
    }

    /// Total number of elements of all tensors (llama_model_n_params).
    pub fn n_params(&self) -> u64 {
        self.files.iter().flat_map(|f| f.tensors.iter()).map(|t| t.n_elements()).sum()
    }

    /// Total bytes of all tensors (llama_model_size).
    pub fn size(&self) -> u64 {
        self.files.iter().flat_map(|f| f.tensors.iter()).map(|t| t.nbytes).sum()
    }

    /// llama.cpp's file type: `general.file_type` when present, else guessed from the most
    /// common tensor type (the bool says it was guessed).
    pub fn ftype(&self) -> (u32, bool) {
        if let Some(v) = self.meta("general.file_type").and_then(Value::as_i64) {
            if let Ok(v) = u32::try_from(v) {
                return (v, false);
            }
        }
        (ftype::guess(self.files.iter().flat_map(|f| f.tensors.iter()).map(|t| t.ty)), true)
    }

    /// "Q4_K - Medium", "(guessed) Q4_1"... (llama_ftype_name).
    pub fn ftype_name(&self) -> String {
        let (ft, guessed) = self.ftype();
        let name = ftype::name(ft);
        if guessed {
            format!("(guessed) {name}")
        } else {
            name.to_string()
        }
    }

    /// `general.architecture` (also for vocab-only loads of architectures without a schema).
    pub fn arch_name(&self) -> &str {
        &self.hparams.arch
    }

    /// llama_model_desc: "<arch> <size class> <file type>", e.g. "llama 256M Q4_1".
    pub fn desc(&self) -> String {
        format!("{} {} {}", self.hparams.arch, self.arch.type_name(&self.hparams), self.ftype_name())
    }

    fn guess_n_vocab(files: &[GgufFile], map: &HashMap<String, (usize, usize)>) -> usize {
        if let Some(&(fi, ti)) = map.get("token_embd.weight") {
            return files[fi].tensors[ti].ne[1] as usize;
        }
        files[0].get("tokenizer.ggml.tokens").and_then(Value::as_array).map_or(0, |a| a.len())
    }

    /// Bind every tensor the architecture's forward pass uses, as a context will (the
    /// binding is the schema: a missing tensor or a wrong shape fails here, at load).
    fn check_schema(&self) -> Result<()> {
        let cp = crate::context::ContextParams {
            n_ctx: self.hparams.n_ctx_train.max(1),
            n_seq_max: 1,
            n_rs_seq: 0,
            n_ubatch: 1,
            n_threads: 1,
            n_threads_batch: 1,
            type_k: GgmlType::F16,
            type_v: GgmlType::F16,
            kv_unified: true,
            swa_full: false,
            embeddings: false,
            rope_freq_base: 0.0,
            rope_freq_scale: 0.0,
        };
        self.arch.build_forward(&crate::models::loader::Loader::check(self), &cp).map(drop)
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
            layout: if self.x4.contains(&(fi, ti)) { Layout::X4 } else { Layout::Plain },
        })
    }

    pub fn meta(&self, key: &str) -> Option<&Value> {
        self.files[0].get(key)
    }

    /// Memory-mapped weights are read from the file itself: if the file was truncated
    /// after loading, touching a page past its new end raises SIGBUS (llama.cpp has the
    /// same hazard). Checked at context creation, where the weights start to be read, so
    /// the common case (a download or copy overwriting the model) is an error here rather
    /// than a crash in the first decode. Copies in RAM (load_mode none / dio) are immune.
    pub fn check_mapped_files(&self) -> Result<()> {
        for f in self.files.iter().filter(|f| f.storage.is_mmap()) {
            let now = std::fs::metadata(&f.path).map(|m| m.len()).unwrap_or(0);
            if now < f.file_size {
                return Err(Error::Io {
                    path: f.path.clone(),
                    what: format!(
                        "the model file shrank from {} to {now} bytes after it was memory-mapped; reading its \
                         weights would crash (SIGBUS). Load it again, or load with load_mode='none' to keep a copy in RAM",
                        f.file_size
                    ),
                    source: std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "file truncated"),
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_names_like_llama_cpp() {
        assert_eq!(split_prefix("/m/x-00001-of-00003.gguf"), Some(("/m/x".to_string(), 0, 3)));
        assert_eq!(split_prefix("x-00004-of-00003.gguf"), None);
        assert_eq!(split_prefix("x-1-of-3.gguf"), None);
        assert_eq!(split_prefix("x.gguf"), None);
        assert_eq!(split_path("/m/x", 2, 3), "/m/x-00003-of-00003.gguf");
    }

    #[test]
    fn ftype_guess_and_names() {
        use GgmlType::*;
        // SmolLM2: 210 Q4_1, 61 F32, 1 Q8_0 -> Q4_1; Gemma 3 270M: Q5_0 is the most common.
        let smol = std::iter::repeat(Q4_1).take(210).chain(std::iter::repeat(F32).take(61)).chain([Q8_0]);
        assert_eq!(ftype::guess(smol), 3);
        assert_eq!(ftype::guess([Q4_K, Q4_K, Q6_K].into_iter()), 15);
        assert_eq!(ftype::name(15), "Q4_K - Medium");
        assert_eq!(ftype::name(15 | 1024), "Q4_K - Medium");
        assert_eq!(ftype::name(3), "Q4_1");
        assert_eq!(ftype::name(999), "unknown, may not work");
    }
}
