//! GGUF reader (pipeline step 2): header, metadata, tensor index, data section.
//!
//! Layout (little endian): magic "GGUF", u32 version, u64 n_tensors, u64 n_kv,
//! n_kv x (string key, u32 type, value), n_tensors x (string name, u32 n_dims,
//! n_dims x u64 ne, u32 ggml type, u64 offset), padding to `general.alignment`
//! (default 32), then the data section. Every count and length is checked against
//! the bytes that remain before anything is allocated.

mod reader;
pub mod storage;
pub mod validate;

pub use reader::{parse, ParsedHeader, MAX_ARRAY_ELEMENTS, MAX_NAME, MAX_STRING_LENGTH};
pub use storage::{LoadMode, Storage};

use crate::error::{Error, Result};
use crate::ggml_type::GgmlType;

pub const GGUF_MAGIC: &[u8; 4] = b"GGUF";
pub const DEFAULT_ALIGNMENT: u64 = 32;

/// GGUF metadata value type ids.
pub mod vtype {
    pub const U8: u32 = 0;
    pub const I8: u32 = 1;
    pub const U16: u32 = 2;
    pub const I16: u32 = 3;
    pub const U32: u32 = 4;
    pub const I32: u32 = 5;
    pub const F32: u32 = 6;
    pub const BOOL: u32 = 7;
    pub const STRING: u32 = 8;
    pub const ARRAY: u32 = 9;
    pub const U64: u32 = 10;
    pub const I64: u32 = 11;
    pub const F64: u32 = 12;
}

#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    /// Raw bytes: GGUF strings are meant to be UTF-8 but nothing enforces it.
    String(Vec<u8>),
    /// An array, stored compactly (see [`Array`]).
    Array(Array),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl Value {
    pub fn type_id(&self) -> u32 {
        match self {
            Value::U8(_) => vtype::U8,
            Value::I8(_) => vtype::I8,
            Value::U16(_) => vtype::U16,
            Value::I16(_) => vtype::I16,
            Value::U32(_) => vtype::U32,
            Value::I32(_) => vtype::I32,
            Value::F32(_) => vtype::F32,
            Value::Bool(_) => vtype::BOOL,
            Value::String(_) => vtype::STRING,
            Value::Array(_) => vtype::ARRAY,
            Value::U64(_) => vtype::U64,
            Value::I64(_) => vtype::I64,
            Value::F64(_) => vtype::F64,
        }
    }

    /// Integer value of any integer type (bools excluded), if it fits in i64.
    pub fn as_i64(&self) -> Option<i64> {
        Some(match *self {
            Value::U8(v) => v as i64,
            Value::I8(v) => v as i64,
            Value::U16(v) => v as i64,
            Value::I16(v) => v as i64,
            Value::U32(v) => v as i64,
            Value::I32(v) => v as i64,
            Value::U64(v) => i64::try_from(v).ok()?,
            Value::I64(v) => v,
            _ => return None,
        })
    }

    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v as f64),
            Value::F64(v) => Some(v),
            _ => self.as_i64().map(|v| v as f64),
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(b) => std::str::from_utf8(b).ok(),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&Array> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// Byte size of one element of a fixed-size GGUF value type (None: string or array).
pub fn fixed_size(ty: u32) -> Option<usize> {
    match ty {
        vtype::U8 | vtype::I8 | vtype::BOOL => Some(1),
        vtype::U16 | vtype::I16 => Some(2),
        vtype::U32 | vtype::I32 | vtype::F32 => Some(4),
        vtype::U64 | vtype::I64 | vtype::F64 => Some(8),
        _ => None,
    }
}

/// A GGUF array. Tokenizer arrays hold hundreds of thousands of elements, so they are not
/// kept as one `Value` each (32 bytes plus a heap block per string): strings live in one
/// byte blob with end offsets, fixed-size elements as their little-endian bytes, and only
/// nested arrays as values.
#[derive(Clone, Debug, PartialEq)]
pub struct Array {
    /// The declared element type (kept for empty arrays and for writers).
    pub elem_type: u32,
    data: ArrayData,
}

#[derive(Clone, Debug, PartialEq)]
enum ArrayData {
    Strings { blob: Vec<u8>, ends: Vec<u32> },
    Fixed(Vec<u8>),
    Nested(Vec<Value>),
}

impl Array {
    /// `ends[i]`: where string i stops in `blob` (a GGUF array of strings holds at most
    /// 4 GiB of text; the reader refuses more).
    pub(crate) fn strings(blob: Vec<u8>, ends: Vec<u32>) -> Array {
        Array { elem_type: vtype::STRING, data: ArrayData::Strings { blob, ends } }
    }
    /// `bytes.len()` must be a multiple of the element size.
    pub(crate) fn fixed(elem_type: u32, bytes: Vec<u8>) -> Array {
        Array { elem_type, data: ArrayData::Fixed(bytes) }
    }
    pub(crate) fn nested(elem_type: u32, values: Vec<Value>) -> Array {
        Array { elem_type, data: ArrayData::Nested(values) }
    }

    /// Build from values that all have type `elem_type` (None if one does not).
    /// (None also when the strings exceed 4 GiB.)
    pub fn from_values(elem_type: u32, values: &[Value]) -> Option<Array> {
        if values.iter().any(|v| v.type_id() != elem_type) {
            return None;
        }
        if elem_type == vtype::STRING {
            let mut blob = Vec::new();
            let mut ends = Vec::with_capacity(values.len());
            for v in values {
                if let Value::String(b) = v {
                    blob.extend_from_slice(b);
                }
                ends.push(u32::try_from(blob.len()).ok()?);
            }
            return Some(Array::strings(blob, ends));
        }
        if fixed_size(elem_type).is_some() {
            let mut bytes = Vec::new();
            for v in values {
                match *v {
                    Value::U8(x) => bytes.push(x),
                    Value::I8(x) => bytes.push(x as u8),
                    Value::Bool(x) => bytes.push(x as u8),
                    Value::U16(x) => bytes.extend(x.to_le_bytes()),
                    Value::I16(x) => bytes.extend(x.to_le_bytes()),
                    Value::U32(x) => bytes.extend(x.to_le_bytes()),
                    Value::I32(x) => bytes.extend(x.to_le_bytes()),
                    Value::F32(x) => bytes.extend(x.to_le_bytes()),
                    Value::U64(x) => bytes.extend(x.to_le_bytes()),
                    Value::I64(x) => bytes.extend(x.to_le_bytes()),
                    Value::F64(x) => bytes.extend(x.to_le_bytes()),
                    _ => return None,
                }
            }
            return Some(Array::fixed(elem_type, bytes));
        }
        Some(Array::nested(elem_type, values.to_vec()))
    }

    pub fn len(&self) -> usize {
        match &self.data {
            ArrayData::Strings { ends, .. } => ends.len(),
            ArrayData::Fixed(b) => b.len() / fixed_size(self.elem_type).unwrap_or(1),
            ArrayData::Nested(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Element `i` as raw bytes, for string arrays.
    pub fn str_at(&self, i: usize) -> Option<&[u8]> {
        match &self.data {
            ArrayData::Strings { blob, ends } => {
                let end = *ends.get(i)? as usize;
                let start = if i == 0 { 0 } else { ends[i - 1] as usize };
                Some(&blob[start..end])
            }
            _ => None,
        }
    }

    /// All elements' little-endian bytes, for arrays of a fixed-size type.
    pub fn fixed_bytes(&self) -> Option<&[u8]> {
        match &self.data {
            ArrayData::Fixed(b) => Some(b),
            _ => None,
        }
    }

    /// Element `i` as a `Value`.
    pub fn get(&self, i: usize) -> Option<Value> {
        match &self.data {
            ArrayData::Strings { .. } => self.str_at(i).map(|b| Value::String(b.to_vec())),
            ArrayData::Fixed(b) => {
                let n = fixed_size(self.elem_type)?;
                let e = b.get(i * n..i * n + n)?;
                let u = |k: usize| -> [u8; 8] {
                    let mut a = [0u8; 8];
                    a[..k].copy_from_slice(&e[..k]);
                    a
                };
                Some(match self.elem_type {
                    vtype::U8 => Value::U8(e[0]),
                    vtype::I8 => Value::I8(e[0] as i8),
                    vtype::BOOL => Value::Bool(e[0] != 0),
                    vtype::U16 => Value::U16(u16::from_le_bytes([e[0], e[1]])),
                    vtype::I16 => Value::I16(i16::from_le_bytes([e[0], e[1]])),
                    vtype::U32 => Value::U32(u32::from_le_bytes(u(4)[..4].try_into().unwrap())),
                    vtype::I32 => Value::I32(i32::from_le_bytes(u(4)[..4].try_into().unwrap())),
                    vtype::F32 => Value::F32(f32::from_le_bytes(u(4)[..4].try_into().unwrap())),
                    vtype::U64 => Value::U64(u64::from_le_bytes(u(8))),
                    vtype::I64 => Value::I64(i64::from_le_bytes(u(8))),
                    vtype::F64 => Value::F64(f64::from_le_bytes(u(8))),
                    _ => return None,
                })
            }
            ArrayData::Nested(v) => v.get(i).cloned(),
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = Value> + '_ {
        (0..self.len()).filter_map(move |i| self.get(i))
    }
}

#[derive(Clone, Debug)]
pub struct TensorInfo {
    pub name: String,
    pub ty: GgmlType,
    /// ggml order: ne[0] is the row length (contiguous), unused dims are 1.
    pub ne: [u64; 4],
    pub n_dims: u32,
    /// Offset relative to the start of the data section.
    pub offset: u64,
    pub nbytes: u64,
}

impl TensorInfo {
    pub fn n_elements(&self) -> u64 {
        self.ne.iter().product()
    }
    pub fn n_rows(&self) -> u64 {
        self.ne[1] * self.ne[2] * self.ne[3]
    }
}

/// An open GGUF file: the parsed header plus the bytes of the data section.
pub struct GgufFile {
    pub path: String,
    pub version: u32,
    pub metadata: Vec<(String, Value)>,
    pub tensors: Vec<TensorInfo>,
    pub alignment: u64,
    /// Absolute file offset of the data section.
    pub data_offset: u64,
    pub file_size: u64,
    pub storage: Storage,
}

impl GgufFile {
    /// Open and parse `path`; tensor data is accessed according to `mode`.
    pub fn open(path: &str, mode: LoadMode) -> Result<GgufFile> {
        let storage = Storage::open(path, mode)?;
        Self::from_storage(path, storage)
    }

    /// Like `open`; `progress(done, total)` follows the bytes read in the reading modes
    /// (none, mlock, dio) and may return false to cancel.
    pub fn open_with_progress(
        path: &str,
        mode: LoadMode,
        progress: &mut dyn FnMut(usize, usize) -> bool,
    ) -> Result<GgufFile> {
        let storage = Storage::open_with_progress(path, mode, progress)?;
        Self::from_storage(path, storage)
    }

    /// Non-fatal problems met while opening (mlock or O_DIRECT refused).
    pub fn warnings(&self) -> &[String] {
        &self.storage.warnings
    }

    /// Type id of a metadata value, and the element type for arrays.
    pub fn type_of(&self, key: &str) -> Option<(u32, Option<u32>)> {
        self.get(key).map(|v| match v {
            Value::Array(a) => (vtype::ARRAY, Some(a.elem_type)),
            v => (v.type_id(), None),
        })
    }

    pub fn from_storage(path: &str, storage: Storage) -> Result<GgufFile> {
        let h = parse(path, storage.header_bytes())?;
        let file_size = storage.len() as u64;
        if !h.tensors.is_empty() && h.data_offset > file_size {
            return Err(gguf_err(
                path,
                Some(h.data_offset),
                format!("data section starts at {} but the file has only {file_size} bytes", h.data_offset),
            ));
        }
        for t in &h.tensors {
            let end = h
                .data_offset
                .checked_add(t.offset)
                .and_then(|s| s.checked_add(t.nbytes))
                .ok_or_else(|| gguf_err(path, None, format!("tensor '{}': offset overflows", t.name)))?;
            if end > file_size {
                return Err(gguf_err(
                    path,
                    Some(h.data_offset + t.offset),
                    format!(
                        "tensor '{}' data [{}, {}) extends past the end of the file ({} bytes): truncated file?",
                        t.name,
                        h.data_offset + t.offset,
                        end,
                        file_size
                    ),
                ));
            }
        }
        Ok(GgufFile {
            path: path.to_string(),
            version: h.version,
            metadata: h.metadata,
            tensors: h.tensors,
            alignment: h.alignment,
            data_offset: h.data_offset,
            file_size,
            storage,
        })
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    pub fn tensor_info(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// The bytes of a tensor (zero copy under mmap).
    pub fn tensor_data(&self, t: &TensorInfo) -> &[u8] {
        let start = (self.data_offset + t.offset) as usize;
        &self.storage.bytes()[start..start + t.nbytes as usize]
    }
}

pub(crate) fn gguf_err(path: &str, offset: Option<u64>, msg: impl Into<String>) -> Error {
    Error::Gguf { path: path.to_string(), offset, msg: msg.into() }
}
