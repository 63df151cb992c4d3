//! Importance-matrix files, as llama-imatrix writes them and llama-quantize reads them
//! (common/imatrix-loader.cpp, tools/imatrix/imatrix.cpp).
//!
//! GGUF format: per matmul weight `NAME`, an F32 tensor `NAME.in_sum2` (sum over tokens of
//! the squared input activation, per input column, per expert: ne = [n_per_row, n_expert])
//! and an F32 tensor `NAME.counts` (tokens seen, per expert: ne = [1, n_expert]); metadata
//! `general.type` = "imatrix", `imatrix.datasets` (array of strings), `imatrix.chunk_count`,
//! `imatrix.chunk_size` (u32). The legacy format: i32 n_entries, then per entry i32 name
//! length, name, i32 ncall, i32 nval, nval f32 (sums already averaged and times ncall),
//! and optionally i32 chunk count, i32 length + dataset name.

use crate::error::{Error, Result};
use crate::ggml_type::GgmlType;
use crate::gguf::{GgufFile, LoadMode, Value};
use std::collections::BTreeMap;

#[derive(Clone, Debug, Default)]
pub struct ImatrixEntry {
    pub sums: Vec<f32>,
    pub counts: Vec<i64>,
}

#[derive(Clone, Debug, Default)]
pub struct Imatrix {
    pub entries: BTreeMap<String, ImatrixEntry>,
    pub datasets: Vec<String>,
    pub chunk_count: u32,
    pub chunk_size: u32,
    pub is_legacy: bool,
    pub has_metadata: bool,
}

fn bad(path: &str, msg: impl Into<String>) -> Error {
    Error::Invalid(format!("{path}: {}", msg.into()))
}

/// `common_imatrix_load`: the GGUF format, else the legacy one.
pub fn load(path: &str) -> Result<Imatrix> {
    let head = {
        use std::io::Read;
        let mut f = std::fs::File::open(path).map_err(|e| Error::Io { path: path.into(), what: "open".into(), source: e })?;
        let mut m = [0u8; 4];
        let n = f.read(&mut m).unwrap_or(0);
        m[..n].to_vec()
    };
    if head != b"GGUF" {
        return load_legacy(path);
    }
    let f = GgufFile::open(path, LoadMode::None)?;
    if f.tensors.is_empty() {
        return Err(bad(path, "no data in the importance matrix file"));
    }
    let mut im = Imatrix::default();
    if let Some(Value::Array(a)) = f.get("imatrix.datasets") {
        if a.elem_type == crate::gguf::vtype::STRING {
            for i in 0..a.len() {
                im.datasets.push(String::from_utf8_lossy(a.str_at(i).unwrap_or(&[])).into_owned());
            }
        }
    }
    let u32_of = |k: &str| f.get(k).and_then(|v| v.as_i64()).map(|v| v as u32);
    im.has_metadata = f.get("imatrix.datasets").is_some() && f.get("imatrix.chunk_count").is_some() && f.get("imatrix.chunk_size").is_some();
    im.chunk_count = u32_of("imatrix.chunk_count").unwrap_or(0);
    im.chunk_size = u32_of("imatrix.chunk_size").unwrap_or(0);
    let mut pairs: BTreeMap<String, (Option<usize>, Option<usize>)> = BTreeMap::new();
    for (i, t) in f.tensors.iter().enumerate() {
        if let Some(n) = t.name.strip_suffix(".in_sum2") {
            pairs.entry(n.to_string()).or_default().0 = Some(i);
        } else if let Some(n) = t.name.strip_suffix(".counts") {
            pairs.entry(n.to_string()).or_default().1 = Some(i);
        }
    }
    let floats = |i: usize| -> Vec<f32> {
        f.tensor_data(&f.tensors[i]).chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
    };
    for (name, (s, c)) in pairs {
        let (Some(s), Some(c)) = (s, c) else {
            return Err(bad(path, format!("mismatched sums and counts for {name}")));
        };
        if f.tensors[s].ty != GgmlType::F32 || f.tensors[c].ty != GgmlType::F32 {
            return Err(bad(path, format!("sums and counts for {name} must be F32")));
        }
        let sums = floats(s);
        let counts: Vec<i64> = floats(c).iter().map(|&v| v.round() as i64).collect();
        if counts.is_empty() || sums.len() % counts.len() != 0 {
            return Err(bad(path, format!("{name}: {} sums do not split into {} experts", sums.len(), counts.len())));
        }
        im.entries.insert(name, ImatrixEntry { sums, counts });
    }
    Ok(im)
}

fn load_legacy(path: &str) -> Result<Imatrix> {
    let data = std::fs::read(path).map_err(|e| Error::Io { path: path.into(), what: "read".into(), source: e })?;
    let mut pos = 0usize;
    let i32_at = |pos: &mut usize| -> Option<i32> {
        let b = data.get(*pos..*pos + 4)?;
        *pos += 4;
        Some(i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    let n = i32_at(&mut pos).filter(|&n| n >= 1).ok_or_else(|| bad(path, "not an importance matrix (neither GGUF nor the legacy format)"))?;
    let mut im = Imatrix { is_legacy: true, ..Default::default() };
    for e in 0..n {
        let len = i32_at(&mut pos).filter(|&l| l >= 0).ok_or_else(|| bad(path, format!("failed reading name for entry {}", e + 1)))? as usize;
        let name = data.get(pos..pos + len).ok_or_else(|| bad(path, format!("failed reading name for entry {}", e + 1)))?;
        let name = String::from_utf8_lossy(name.split(|&b| b == 0).next().unwrap_or(&[])).into_owned();
        pos += len;
        let ncall = i32_at(&mut pos).ok_or_else(|| bad(path, format!("failed reading entry {}", e + 1)))?;
        let nval = i32_at(&mut pos).filter(|&v| v >= 1).ok_or_else(|| bad(path, format!("failed reading number of values for entry {e}")))? as usize;
        let b = data.get(pos..pos + 4 * nval).ok_or_else(|| bad(path, format!("failed reading data for entry {e}")))?;
        pos += 4 * nval;
        let sums = b.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
        im.entries.insert(name, ImatrixEntry { sums, counts: vec![ncall as i64] });
    }
    if pos < data.len() {
        if let Some(nc) = i32_at(&mut pos) {
            im.chunk_count = nc as u32;
            if let Some(len) = i32_at(&mut pos) {
                if len > 0 {
                    if let Some(s) = data.get(pos..pos + len as usize) {
                        im.datasets.push(String::from_utf8_lossy(s.split(|&b| b == 0).next().unwrap_or(&[])).into_owned());
                    }
                }
            }
        }
    }
    Ok(im)
}

impl Imatrix {
    /// The per-column importance llama-quantize hands to the quantizers (`load_imatrix`):
    /// sums / count per expert (1 where an expert saw no token); legacy: sums / ncall.
    pub fn weights(&self) -> std::collections::HashMap<String, Vec<f32>> {
        let mut out = std::collections::HashMap::new();
        for (name, e) in &self.entries {
            let mut w = vec![0f32; e.sums.len()];
            if !self.is_legacy {
                let nc = e.counts.len();
                let ne0 = e.sums.len() / nc;
                for j in 0..nc {
                    let count = e.counts[j] as f32;
                    for i in 0..ne0 {
                        w[j * ne0 + i] = if count > 0.0 { e.sums[j * ne0 + i] / count } else { 1.0 };
                    }
                }
            } else {
                let ncall = e.counts.first().copied().unwrap_or(0);
                for i in 0..w.len() {
                    w[i] = if ncall > 0 { e.sums[i] / ncall as f32 } else { e.sums[i] };
                }
            }
            out.insert(name.clone(), w);
        }
        out
    }
}
