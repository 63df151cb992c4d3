//! `pyllama quantize`: llama-quantize's model quantizer (src/llama-quant.cpp), writing the
//! same bytes for the same input and arguments.
//!
//! - `kernels.rs`: float rows -> blocks (ggml-quants.c's quantizers, imatrix-weighted
//!   where ggml has a weighted search);
//! - `select.rs`: the type of each tensor (ftype mixes, output / token-embedding rules,
//!   shape fallbacks);
//! - this file: the driver (tensor order, metadata, threads, progress) and the GGUF writer
//!   (gguf.cpp's layout: KV pairs in insertion order, tensor infos, 32-byte alignment);
//! - `imatrix.rs`: importance-matrix files (llama-imatrix's GGUF format and the legacy one).

pub mod collect;
pub mod imatrix;
mod grid;
mod iq1;
mod iq2;
mod iq3;
#[cfg(target_arch = "x86_64")]
mod search_avx2;
pub mod kernels;
pub mod select;

use crate::error::{Error, Result};
use crate::ggml_type::GgmlType;
use crate::gguf::{vtype, GgufFile, LoadMode, TensorInfo, Value};
use select::{ModelInfo, SelectParams, Selector, TensorDesc};
use std::collections::HashMap;
use std::io::Write;

pub const GGML_QNT_VERSION: u32 = 2;
const ALIGNMENT: u64 = 32;

/// Everything llama-quantize's command line sets.
#[derive(Clone, Debug)]
pub struct QuantizeParams {
    pub select: SelectParams,
    pub n_threads: usize,
    pub allow_requantize: bool,
    pub keep_split: bool,
    /// Per-tensor importance (already divided by the counts, as llama-quantize loads it).
    pub imatrix: Option<HashMap<String, Vec<f32>>>,
    /// Extra metadata appended last (--override-kv, then llama-quantize's quantize.imatrix.* keys).
    pub kv_overrides: Vec<(String, Value)>,
    /// `--prune-layers`: blocks to drop (the rest are renumbered from 0, block_count updated).
    pub prune_layers: Vec<u32>,
    /// `--dry-run`: report each tensor's target type and size, write nothing (no quantizer
    /// runs, so neither a missing importance matrix nor a type without one stops it).
    pub dry_run: bool,
}

/// One line of progress: a tensor has been written.
#[derive(Clone, Debug)]
pub struct TensorProgress {
    pub index: usize,
    pub total: usize,
    pub name: String,
    pub ne: [u64; 4],
    pub src_type: GgmlType,
    pub dst_type: GgmlType,
    pub src_bytes: u64,
    pub dst_bytes: u64,
    /// Set when the imatrix had no entry for a tensor it could have helped.
    pub note: Option<String>,
}

#[derive(Clone, Debug, Default)]
pub struct QuantizeSummary {
    pub size_before: u64,
    pub size_after: u64,
    pub n_elements: u64,
    pub n_tensors: usize,
    pub n_fallback: usize,
    pub outputs: Vec<String>,
    pub warnings: Vec<String>,
}

fn invalid(msg: impl Into<String>) -> Error {
    Error::Invalid(msg.into())
}

/// What the type choice needs from the file: `{arch}.block_count`, head counts (layer 0),
/// `expert_count`, and whether llama.cpp calls the model a 70B.
pub fn model_info(f: &GgufFile) -> Result<ModelInfo> {
    model_info_with(f, &[])
}

/// `model_info` as llama-quantize's loader sees the file with `--override-kv` applied: an
/// override of a hyperparameter the mixes read changes their choices (an int override is
/// the only kind llama.cpp accepts for them).
pub fn model_info_with(f: &GgufFile, overrides: &[(String, Value)]) -> Result<ModelInfo> {
    let arch = f
        .get("general.architecture")
        .and_then(|v| v.as_str())
        .ok_or_else(|| invalid(format!("{}: no general.architecture string", f.path)))?
        .to_string();
    let u = |key: &str| -> Option<u64> {
        let full = format!("{arch}.{key}");
        if let Some((_, v)) = overrides.iter().rev().find(|(k, _)| *k == full) {
            return v.as_i64().map(|v| v.max(0) as u64);
        }
        match f.get(&full)? {
            Value::Array(a) => a.get(0).and_then(|v| v.as_i64()).map(|v| v.max(0) as u64),
            v => v.as_i64().map(|v| v.max(0) as u64),
        }
    };
    let n_layer = u("block_count").ok_or_else(|| invalid(format!("{}: no {arch}.block_count", f.path)))? as u32;
    let n_head = u("attention.head_count").unwrap_or(0) as u32;
    let n_head_kv = u("attention.head_count_kv").map(|v| v as u32).unwrap_or(n_head);
    let n_expert = u("expert_count").unwrap_or(0) as u32;
    let is_70b = match arch.as_str() {
        "llama" => n_layer == 80 && n_head != n_head_kv,
        "deci" | "olmo" | "qwen2" => n_layer == 80,
        "jais2" => n_layer == 68,
        _ => false,
    };
    Ok(ModelInfo { arch, n_layer, n_head, n_head_kv, n_expert, is_70b })
}

struct SrcTensor<'a> {
    info: &'a TensorInfo,
    file: usize,
    /// The name written (differs from `info.name` when --prune-layers renumbers blocks).
    name: String,
}

/// The block number in `blk.N.` (the first such part of the name) and its byte range.
fn blk_number(name: &str) -> Option<(u64, std::ops::Range<usize>)> {
    let mut from = 0;
    while let Some(i) = name[from..].find("blk.") {
        let start = from + i + 4;
        let digits = name[start..].bytes().take_while(|b| b.is_ascii_digit()).count();
        if digits > 0 && name.as_bytes().get(start + digits) == Some(&b'.') {
            let n = name[start..start + digits].parse::<u64>().ok()?;
            return Some((n, start..start + digits));
        }
        from = from + i + 1;
    }
    None
}

/// llama-quantize's `remap_layer` over the tensors in weights-map order: pruned blocks'
/// tensors are dropped, blocks below the first pruned one keep their number, the others are
/// numbered on from there. Returns the new block count.
fn prune_and_renumber(tensors: &mut Vec<SrcTensor>, prune: &[u32]) -> Result<u32> {
    let mut mapped: HashMap<u64, Option<u64>> = HashMap::new();
    let mut next_id: u64 = 0;
    let first = *prune.first().unwrap_or(&0) as u64;
    let mut kept = Vec::with_capacity(tensors.len());
    for mut t in tensors.drain(..) {
        if let Some((blk, range)) = blk_number(&t.info.name) {
            let m = *mapped.entry(blk).or_insert_with(|| {
                if prune.iter().any(|&p| p as u64 == blk) {
                    None
                } else if blk < first {
                    next_id = blk + 1;
                    Some(blk)
                } else {
                    next_id += 1;
                    Some(next_id - 1)
                }
            });
            match m {
                None => continue,
                Some(n) => {
                    let mut name = t.info.name.clone();
                    name.replace_range(range, &n.to_string());
                    t.name = name;
                }
            }
        }
        kept.push(t);
    }
    *tensors = kept;
    u32::try_from(next_id).map_err(|_| invalid("block count after pruning does not fit in u32"))
}

/// Quantize `input` (a GGUF file, or the first of a split set) into `output` as
/// llama-quantize does. `progress` is called after each tensor; returning false stops
/// (the output is then incomplete) with `Error::Cancelled`.
pub fn quantize_model(
    input: &str,
    output: &str,
    p: &QuantizeParams,
    progress: &mut dyn FnMut(&TensorProgress) -> bool,
) -> Result<QuantizeSummary> {
    // Open the input (all its splits).
    let first = GgufFile::open(input, LoadMode::Mmap)?;
    let n_split_in = match first.get("split.count") {
        Some(v) => v.as_i64().unwrap_or(0).max(0) as usize,
        None => 0,
    };
    let mut files = vec![first];
    if n_split_in > 1 {
        let (prefix, no, count) = crate::model::split_prefix(input).ok_or_else(|| {
            invalid(format!("{input}: split.count is {n_split_in} but the file name does not follow -NNNNN-of-NNNNN.gguf"))
        })?;
        if no != 0 || count != n_split_in {
            return Err(invalid(format!("{input}: give the first split (-00001-of-{n_split_in:05}.gguf)")));
        }
        for i in 1..n_split_in {
            files.push(GgufFile::open(&crate::model::split_path(&prefix, i, n_split_in), LoadMode::Mmap)?);
        }
    }
    for (k, v) in &p.kv_overrides {
        let arch = files[0].get("general.architecture").and_then(|v| v.as_str()).unwrap_or("");
        let hp = ["block_count", "attention.head_count", "attention.head_count_kv", "expert_count"];
        if hp.iter().any(|h| *k == format!("{arch}.{h}")) && !matches!(v, Value::U32(_)) {
            return Err(invalid(format!("override for {k}: llama.cpp reads it as an integer (give int:N)")));
        }
    }
    let model = model_info_with(&files[0], &p.kv_overrides)?;

    let mut tensors: Vec<SrcTensor> = Vec::new();
    for (fi, f) in files.iter().enumerate() {
        for t in &f.tensors {
            if tensors.iter().any(|s| s.info.name == t.name) {
                return Err(invalid(format!("{input}: duplicate tensor '{}'", t.name)));
            }
            tensors.push(SrcTensor { info: t, file: fi, name: t.name.clone() });
        }
    }
    // llama_model_loader's weights_map order (layer number, then name); --keep-split keeps
    // the split index first and the file offset within it.
    tensors.sort_by(|a, b| select::tensor_order(&a.info.name, &b.info.name));
    let mut block_count = None;
    if !p.prune_layers.is_empty() {
        let mut prune = p.prune_layers.clone();
        prune.sort_unstable();
        prune.dedup();
        block_count = Some(prune_and_renumber(&mut tensors, &prune)?);
    }
    let n_tensors = tensors.len();
    if p.keep_split {
        tensors.sort_by(|a, b| a.file.cmp(&b.file).then(a.info.offset.cmp(&b.info.offset)));
    }

    let mut sp = p.select.clone();
    if sp.only_copy {
        sp.ftype = match files[0].get("general.file_type").and_then(|v| v.as_i64()) {
            Some(v) => v as u32,
            None => select::ft::ALL_F32,
        };
    }
    sp.has_imatrix = p.imatrix.is_some();
    let ftype = sp.ftype;
    let default = select::default_type(ftype).ok_or_else(|| invalid(format!("invalid output file type {ftype}")))?;
    let _ = default;

    // Preliminary pass: target types.
    let mut selector = Selector::new(&model, &sp, tensors.iter().map(|t| t.name.as_str()));
    let mut targets = Vec::with_capacity(n_tensors);
    for t in &tensors {
        let desc = TensorDesc { name: t.name.clone(), ty: t.info.ty, ne: t.info.ne };
        let allows = select::allows_quantization(&sp, &model.arch, &desc);
        let target = if allows { selector.target_type(&desc).map_err(invalid)? } else { t.info.ty };
        let needs = select::tensor_requires_imatrix(&t.name, target, ftype);
        if p.imatrix.is_none() && allows && needs && !p.dry_run {
            return Err(invalid(format!(
                "this quantization requires an importance matrix (--imatrix): tensor {} would be {target}",
                t.name
            )));
        }
        if target != t.info.ty && !kernels::can_quantize(target) && !p.dry_run {
            return Err(Error::Unsupported(format!(
                "pyllama cannot quantize to {target} (tensor {}): no quantizer for that type",
                t.info.name
            )));
        }
        targets.push((target, needs));
    }
    let n_fallback = selector.n_fallback;
    let mut warnings = std::mem::take(&mut selector.warnings);
    drop(selector);

    // Output contexts: KV pairs and tensor infos per output file.
    let n_split = if p.keep_split { tensors.iter().map(|t| t.file + 1).max().unwrap_or(1) } else { 1 };
    let mut kv0: Vec<(String, Value)> = files[0].metadata.clone();
    let set = |kv: &mut Vec<(String, Value)>, k: &str, v: Value| {
        kv.retain(|(kk, _)| kk != k);
        kv.push((k.to_string(), v));
    };
    set(&mut kv0, "general.quantization_version", Value::U32(GGML_QNT_VERSION));
    set(&mut kv0, "general.file_type", Value::U32(ftype));
    kv0.retain(|(k, _)| k != "split.no" && k != "split.count" && k != "split.tensors.count");
    for (k, v) in &p.kv_overrides {
        set(&mut kv0, k, v.clone());
    }
    if let Some(n) = block_count {
        set(&mut kv0, &format!("{}.block_count", model.arch), Value::U32(n));
    }
    let alignment = match kv0.iter().find(|(k, _)| k == "general.alignment") {
        Some((_, Value::U32(a))) if *a > 0 && a.is_power_of_two() => *a as u64,
        Some(_) => return Err(invalid(format!("{input}: general.alignment must be a power-of-two u32"))),
        None => ALIGNMENT,
    };
    let mut kvs: Vec<Vec<(String, Value)>> = (0..n_split).map(|_| Vec::new()).collect();
    kvs[0] = kv0;
    if n_split > 1 {
        for (i, kv) in kvs.iter_mut().enumerate() {
            set(kv, "split.no", Value::U16(i as u16));
            set(kv, "split.count", Value::U16(n_split as u16));
            set(kv, "split.tensors.count", Value::I32(n_tensors as i32));
        }
    }

    // Output paths.
    let outputs: Vec<String> = if p.keep_split {
        let prefix = if output.contains(".gguf") { &output[..output.len().saturating_sub(5)] } else { output };
        (0..n_split).map(|i| crate::model::split_path(prefix, i, n_split)).collect()
    } else {
        vec![output.to_string()]
    };
    for o in outputs.iter().filter(|_| !p.dry_run) {
        for f in &files {
            if same_file(&f.path, o) {
                return Err(invalid(format!("input and output files are the same: '{o}'")));
            }
        }
    }

    // Tensor infos per split.
    struct OutTensor {
        src: usize,
        ty: GgmlType,
        nbytes: u64,
        offset: u64,
    }
    let mut per_split: Vec<Vec<OutTensor>> = (0..n_split).map(|_| Vec::new()).collect();
    for (i, t) in tensors.iter().enumerate() {
        let s = if p.keep_split { t.file } else { 0 };
        let ty = targets[i].0;
        let nbytes = ty
            .row_size(t.info.ne[0] as usize)
            .ok_or_else(|| invalid(format!("tensor {}: row of {} is not a multiple of the {ty} block", t.info.name, t.info.ne[0])))?
            as u64
            * t.info.n_rows();
        let list = &mut per_split[s];
        let offset = list.last().map(|o: &OutTensor| o.offset + pad(o.nbytes, alignment)).unwrap_or(0);
        list.push(OutTensor { src: i, ty, nbytes, offset });
    }

    let n_threads = p.n_threads.max(1);
    let mut summary = QuantizeSummary {
        n_tensors,
        n_fallback,
        outputs: outputs.clone(),
        n_elements: tensors.iter().map(|t| t.info.n_elements()).sum(),
        ..Default::default()
    };
    let mut index = 0usize;
    if p.dry_run {
        summary.outputs.clear();
        let mut will_require_imatrix = false;
        for o in per_split.iter().flatten() {
            index += 1;
            let t = tensors[o.src].info;
            let (target, needs) = targets[o.src];
            let _ = target;
            will_require_imatrix |= needs && select::allows_quantization(&sp, &model.arch, &TensorDesc {
                name: tensors[o.src].name.clone(),
                ty: t.ty,
                ne: t.ne,
            });
            summary.size_before += t.nbytes;
            summary.size_after += o.nbytes;
            let go_on = progress(&TensorProgress {
                index,
                total: n_tensors,
                name: tensors[o.src].name.clone(),
                ne: t.ne,
                src_type: t.ty,
                dst_type: target,
                src_bytes: t.nbytes,
                dst_bytes: o.nbytes,
                note: None,
            });
            if !go_on {
                return Err(Error::Cancelled);
            }
        }
        if will_require_imatrix && p.imatrix.is_none() {
            warnings.push("dry run completed successfully, but actually completing this quantization will require an imatrix!".into());
        }
        summary.warnings = warnings;
        return Ok(summary);
    }
    for (s, list) in per_split.iter().enumerate() {
        let path = &outputs[s];
        let file = std::fs::File::create(path).map_err(|e| Error::Io { path: path.clone(), what: "create".into(), source: e })?;
        let mut w = std::io::BufWriter::with_capacity(1 << 22, file);
        let io = |e: std::io::Error| Error::Io { path: path.clone(), what: "write".into(), source: e };
        // Header.
        let mut head = Vec::new();
        head.extend_from_slice(b"GGUF");
        head.extend_from_slice(&3u32.to_le_bytes());
        head.extend_from_slice(&(list.len() as i64).to_le_bytes());
        head.extend_from_slice(&(kvs[s].len() as i64).to_le_bytes());
        for (k, v) in &kvs[s] {
            write_str(&mut head, k.as_bytes());
            write_kv(&mut head, v)?;
        }
        for o in list {
            let t = tensors[o.src].info;
            write_str(&mut head, tensors[o.src].name.as_bytes());
            let n_dims = (1..4).rev().find(|&i| t.ne[i] != 1).map(|i| i + 1).unwrap_or(1);
            head.extend_from_slice(&(n_dims as u32).to_le_bytes());
            for d in 0..n_dims {
                head.extend_from_slice(&(t.ne[d] as i64).to_le_bytes());
            }
            head.extend_from_slice(&(o.ty as u32).to_le_bytes());
            head.extend_from_slice(&o.offset.to_le_bytes());
        }
        let hl = head.len() as u64;
        head.resize(pad(hl, alignment) as usize, 0);
        w.write_all(&head).map_err(io)?;

        for o in list {
            index += 1;
            let st = &tensors[o.src];
            let t = st.info;
            let src = files[st.file].tensor_data(t);
            let (target, needs_imatrix) = targets[o.src];
            let mut note = None;
            if target == t.ty {
                w.write_all(src).map_err(io)?;
            } else {
                if select::is_quantized(t.ty) && !p.allow_requantize {
                    return Err(invalid(format!("requantizing from type {} is disabled (--allow-requantize)", t.ty)));
                }
                let n_per_row = t.ne[0] as usize;
                let mut imat: Option<&[f32]> = None;
                if let Some(im) = &p.imatrix {
                    match im.get(&t.name) {
                        None => note = Some(format!("did not find weights for {}", t.name)),
                        Some(v) if v.len() as u64 == t.ne[0] * t.ne[2] => imat = Some(v),
                        Some(v) => {
                            if !(t.name == "token_embd.weight" || t.name == "per_layer_token_embd.weight") {
                                return Err(invalid(format!(
                                    "imatrix size {} is different from tensor size {} for {}",
                                    v.len(),
                                    t.ne[0] * t.ne[2],
                                    t.name
                                )));
                            }
                            note = Some(format!("imatrix size {} is different from tensor size {} for {}", v.len(), t.ne[0] * t.ne[2], t.name));
                        }
                    }
                }
                if imat.is_none() && kernels::requires_imatrix(target) {
                    return Err(invalid(format!(
                        "{target} needs an importance matrix and there is none for tensor {} (ggml aborts here)",
                        t.name
                    )));
                }
                if imat.is_none() && needs_imatrix {
                    return Err(invalid(format!("missing importance matrix for tensor {} in a very low-bit quantization", t.name)));
                }
                quantize_tensor(t, src, target, imat, n_threads, &mut |bytes: &[u8]| w.write_all(bytes).map_err(io))?;
                let _ = n_per_row;
            }
            let padn = pad(o.nbytes, alignment) - o.nbytes;
            w.write_all(&vec![0u8; padn as usize]).map_err(io)?;
            summary.size_before += t.nbytes;
            summary.size_after += o.nbytes;
            if let Some(n) = &note {
                warnings.push(n.clone());
            }
            let go_on = progress(&TensorProgress {
                index,
                total: n_tensors,
                name: st.name.clone(),
                ne: t.ne,
                src_type: t.ty,
                dst_type: target,
                src_bytes: t.nbytes,
                dst_bytes: o.nbytes,
                note,
            });
            if !go_on {
                return Err(Error::Cancelled);
            }
        }
        w.flush().map_err(io)?;
    }
    summary.warnings = warnings;
    Ok(summary)
}

/// Write a GGUF file of F32 tensors (gguf.cpp's layout: KV pairs, tensor infos with
/// trailing 1-dims dropped, data aligned to 32 bytes).
pub fn write_gguf_f32(path: &str, kv: &[(String, Value)], tensors: &[(String, [u64; 4], Vec<f32>)]) -> Result<()> {
    let mut head = Vec::new();
    head.extend_from_slice(b"GGUF");
    head.extend_from_slice(&3u32.to_le_bytes());
    head.extend_from_slice(&(tensors.len() as i64).to_le_bytes());
    head.extend_from_slice(&(kv.len() as i64).to_le_bytes());
    for (k, v) in kv {
        write_str(&mut head, k.as_bytes());
        write_kv(&mut head, v)?;
    }
    let mut offset = 0u64;
    for (name, ne, data) in tensors {
        write_str(&mut head, name.as_bytes());
        let n_dims = (1..4).rev().find(|&i| ne[i] != 1).map(|i| i + 1).unwrap_or(1);
        head.extend_from_slice(&(n_dims as u32).to_le_bytes());
        for d in ne.iter().take(n_dims) {
            head.extend_from_slice(&(*d as i64).to_le_bytes());
        }
        head.extend_from_slice(&(GgmlType::F32 as u32).to_le_bytes());
        head.extend_from_slice(&offset.to_le_bytes());
        offset += pad(4 * data.len() as u64, ALIGNMENT);
    }
    let hl = head.len() as u64;
    head.resize(pad(hl, ALIGNMENT) as usize, 0);
    for (_, _, data) in tensors {
        for v in data {
            head.extend_from_slice(&v.to_le_bytes());
        }
        let l = head.len() as u64;
        head.resize(pad(l, ALIGNMENT) as usize, 0);
    }
    std::fs::write(path, &head).map_err(|e| Error::Io { path: path.to_string(), what: "write".into(), source: e })
}

fn same_file(a: &str, b: &str) -> bool {
    match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        (Ok(x), Ok(y)) => x == y,
        _ => false,
    }
}

fn pad(n: u64, a: u64) -> u64 {
    n.div_ceil(a) * a
}

fn write_str(out: &mut Vec<u8>, s: &[u8]) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s);
}

fn write_kv(out: &mut Vec<u8>, v: &Value) -> Result<()> {
    out.extend_from_slice(&v.type_id().to_le_bytes());
    write_value(out, v)
}

fn write_value(out: &mut Vec<u8>, v: &Value) -> Result<()> {
    match v {
        Value::U8(x) => out.push(*x),
        Value::I8(x) => out.push(*x as u8),
        Value::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => out.push(*x as u8),
        Value::String(s) => write_str(out, s),
        Value::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Array(a) => {
            if a.elem_type == vtype::ARRAY {
                return Err(invalid("nested metadata arrays cannot be written (gguf.cpp refuses them too)"));
            }
            out.extend_from_slice(&a.elem_type.to_le_bytes());
            out.extend_from_slice(&(a.len() as u64).to_le_bytes());
            if a.elem_type == vtype::STRING {
                for i in 0..a.len() {
                    write_str(out, a.str_at(i).unwrap_or(&[]));
                }
            } else if a.elem_type == vtype::BOOL {
                for b in a.fixed_bytes().unwrap_or(&[]) {
                    out.push((*b != 0) as u8);
                }
            } else if let Some(b) = a.fixed_bytes() {
                out.extend_from_slice(b);
            } else {
                for e in a.iter() {
                    write_value(out, &e)?;
                }
            }
        }
    }
    Ok(())
}

/// Rows per work item: llama-quantize's chunk of at least 32 * 512 values.
fn rows_per_chunk(n_per_row: usize) -> usize {
    const MIN_CHUNK: usize = 32 * 512;
    if n_per_row >= MIN_CHUNK {
        1
    } else {
        MIN_CHUNK.div_ceil(n_per_row)
    }
}

/// Convert one tensor (any readable source type) to `target`, `n_threads` threads, and
/// hand the bytes to `sink` in row order, a slab at a time.
fn quantize_tensor(
    t: &TensorInfo,
    src: &[u8],
    target: GgmlType,
    imatrix: Option<&[f32]>,
    n_threads: usize,
    sink: &mut dyn FnMut(&[u8]) -> Result<()>,
) -> Result<()> {
    let n_per_row = t.ne[0] as usize;
    let n_rows = t.n_rows() as usize;
    let rows_per_expert = (t.ne[1] as usize).max(1);
    if n_per_row == 0 || n_rows == 0 {
        return Ok(());
    }
    let src_rb = crate::quant::row_bytes(t.ty, n_per_row)?;
    let dst_rb = crate::quant::row_bytes(target, n_per_row)?;
    if t.ty != GgmlType::F32 && !(t.ty == GgmlType::F16 || t.ty == GgmlType::BF16 || t.ty.is_supported()) {
        return Err(Error::Unsupported(format!("cannot dequantize/convert tensor type {}", t.ty)));
    }
    // Slabs of whole rows, about 64 Mi values each, so that memory stays bounded.
    let slab_rows = ((64usize << 20) / n_per_row).max(1);
    let mut f32_buf: Vec<f32> = Vec::new();
    let mut out: Vec<u8> = Vec::new();
    let mut r0 = 0usize;
    while r0 < n_rows {
        let nr = slab_rows.min(n_rows - r0);
        let sbytes = &src[r0 * src_rb..(r0 + nr) * src_rb];
        // Source rows as f32.
        let x: &[f32] = if t.ty == GgmlType::F32 && (sbytes.as_ptr() as usize) % 4 == 0 {
            // SAFETY: aligned, length a multiple of 4, any bit pattern is a valid f32.
            unsafe { std::slice::from_raw_parts(sbytes.as_ptr() as *const f32, nr * n_per_row) }
        } else {
            f32_buf.resize(nr * n_per_row, 0.0);
            let chunks: Vec<(&[u8], &mut [f32])> = sbytes.chunks_exact(src_rb).zip(f32_buf.chunks_exact_mut(n_per_row)).collect();
            par_each(chunks, n_threads, |(s, d)| {
                if t.ty == GgmlType::F32 {
                    for (v, b) in d.iter_mut().zip(s.chunks_exact(4)) {
                        *v = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                    }
                } else {
                    let _ = crate::quant::dequantize_row(t.ty, s, d);
                }
            });
            &f32_buf
        };
        out.resize(nr * dst_rb, 0);
        // Work items: chunks of rows that never cross an expert.
        let rpc = rows_per_chunk(n_per_row);
        let mut items: Vec<(usize, usize)> = Vec::new();
        let mut r = 0;
        while r < nr {
            let g = r0 + r;
            let n = rpc.min(nr - r).min(rows_per_expert - g % rows_per_expert);
            items.push((r, n));
            r += n;
        }
        let mut work: Vec<(&[f32], &mut [u8], Option<&[f32]>)> = Vec::with_capacity(items.len());
        let mut rest: &mut [u8] = &mut out;
        for &(r, n) in &items {
            let (head, tail) = std::mem::take(&mut rest).split_at_mut(n * dst_rb);
            rest = tail;
            let g = r0 + r;
            let im = imatrix.map(|m| &m[(g / rows_per_expert) * n_per_row..(g / rows_per_expert + 1) * n_per_row]);
            work.push((&x[r * n_per_row..(r + n) * n_per_row], head, im));
        }
        par_each(work, n_threads, |(s, d, im)| kernels::quantize_chunk(target, s, d, n_per_row, im));
        sink(&out)?;
        r0 += nr;
    }
    Ok(())
}

/// Run `f` on every item, `n_threads` threads pulling items in order.
fn par_each<T: Send>(items: Vec<T>, n_threads: usize, f: impl Fn(T) + Sync) {
    let n = n_threads.min(items.len()).max(1);
    if n == 1 {
        items.into_iter().for_each(f);
        return;
    }
    let queue = std::sync::Mutex::new(items.into_iter());
    std::thread::scope(|s| {
        for _ in 0..n {
            s.spawn(|| loop {
                let next = queue.lock().unwrap().next();
                match next {
                    Some(it) => f(it),
                    None => break,
                }
            });
        }
    });
}

#[cfg(test)]
mod prune_tests {
    use super::blk_number;

    #[test]
    fn blk_number_is_the_first_blk_n_dot() {
        assert_eq!(blk_number("blk.12.attn_q.weight"), Some((12, 4..6)));
        assert_eq!(blk_number("v.blk.3.ffn_up.weight").map(|x| x.0), Some(3));
        assert_eq!(blk_number("blk.x.blk.7.a").map(|x| x.0), Some(7));
        assert_eq!(blk_number("blk.7a.b"), None);
        assert_eq!(blk_number("token_embd.weight"), None);
    }
}
