//! Bounds-checked parsing of the GGUF header. Never panics: every read checks the
//! remaining length, every size computation uses checked arithmetic.

use super::{fixed_size, gguf_err, vtype, Array, TensorInfo, Value, DEFAULT_ALIGNMENT, GGUF_MAGIC};
use crate::error::Result;
use crate::ggml_type::GgmlType;
use std::collections::HashSet;

/// gguf.cpp's limits: no single string or array may claim more than 1 GiB (elements).
pub const MAX_STRING_LENGTH: u64 = 1 << 30;
pub const MAX_ARRAY_ELEMENTS: u64 = 1 << 30;
/// ggml's GGML_MAX_NAME (including the terminating NUL).
pub const MAX_NAME: usize = 64;

pub struct ParsedHeader {
    pub version: u32,
    pub metadata: Vec<(String, Value)>,
    pub tensors: Vec<TensorInfo>,
    pub alignment: u64,
    pub data_offset: u64,
}

struct Cursor<'a> {
    path: &'a str,
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn err<T>(&self, msg: impl Into<String>) -> Result<T> {
        Err(gguf_err(self.path, Some(self.pos as u64), msg))
    }
    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8]> {
        if n > self.remaining() {
            return self.err(format!(
                "unexpected end of file reading {what}: need {n} bytes, {} left",
                self.remaining()
            ));
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }
    fn u8(&mut self, what: &str) -> Result<u8> {
        Ok(self.take(1, what)?[0])
    }
    fn u16(&mut self, what: &str) -> Result<u16> {
        Ok(u16::from_le_bytes(self.take(2, what)?.try_into().unwrap()))
    }
    fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.take(4, what)?.try_into().unwrap()))
    }
    fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.take(8, what)?.try_into().unwrap()))
    }
    fn string(&mut self, what: &str) -> Result<Vec<u8>> {
        Ok(self.string_slice(what)?.to_vec())
    }
    fn string_slice(&mut self, what: &str) -> Result<&'a [u8]> {
        let start = self.pos;
        let n = self.u64(what)?;
        if n > MAX_STRING_LENGTH {
            self.pos = start;
            return self.err(format!("{what}: string length {n} exceeds the maximum {MAX_STRING_LENGTH}"));
        }
        if n > self.remaining() as u64 {
            self.pos = start;
            return self.err(format!(
                "{what}: string length {n} exceeds the {} bytes left in the file",
                self.remaining().saturating_sub(8)
            ));
        }
        self.take(n as usize, what)
    }

    fn value(&mut self, ty: u32, what: &str, depth: u32) -> Result<Value> {
        Ok(match ty {
            vtype::U8 => Value::U8(self.u8(what)?),
            vtype::I8 => Value::I8(self.u8(what)? as i8),
            vtype::U16 => Value::U16(self.u16(what)?),
            vtype::I16 => Value::I16(self.u16(what)? as i16),
            vtype::U32 => Value::U32(self.u32(what)?),
            vtype::I32 => Value::I32(self.u32(what)? as i32),
            vtype::F32 => Value::F32(f32::from_bits(self.u32(what)?)),
            // gguf.cpp reads an int8 and takes any non-zero byte as true.
            vtype::BOOL => Value::Bool(self.u8(what)? != 0),
            vtype::STRING => Value::String(self.string(what)?),
            vtype::U64 => Value::U64(self.u64(what)?),
            vtype::I64 => Value::I64(self.u64(what)? as i64),
            vtype::F64 => Value::F64(f64::from_bits(self.u64(what)?)),
            vtype::ARRAY => {
                if depth > 0 {
                    // llama.cpp's gguf.cpp rejects nested arrays too; refuse deep
                    // recursion so a crafted file cannot blow the stack.
                    if depth > 8 {
                        return self.err(format!("{what}: arrays nested too deeply"));
                    }
                }
                let at = self.pos;
                let elem_type = self.u32(what)?;
                let n = self.u64(what)?;
                let min_size: u64 = match elem_type {
                    vtype::U8 | vtype::I8 | vtype::BOOL => 1,
                    vtype::U16 | vtype::I16 => 2,
                    vtype::U32 | vtype::I32 | vtype::F32 => 4,
                    vtype::U64 | vtype::I64 | vtype::F64 | vtype::STRING => 8,
                    vtype::ARRAY => 12,
                    t => {
                        self.pos = at;
                        return self.err(format!("{what}: invalid array element type {t}"));
                    }
                };
                if n > MAX_ARRAY_ELEMENTS {
                    self.pos = at;
                    return self.err(format!("{what}: array of {n} elements exceeds the maximum {MAX_ARRAY_ELEMENTS}"));
                }
                if n.checked_mul(min_size).map_or(true, |b| b > self.remaining() as u64) {
                    self.pos = at;
                    return self.err(format!(
                        "{what}: array of {n} elements does not fit in the {} bytes left",
                        self.remaining()
                    ));
                }
                let n = n as usize;
                if let Some(size) = fixed_size(elem_type) {
                    // fits: checked above against the bytes left
                    let bytes = self.take(n * size, what)?.to_vec();
                    Value::Array(Array::fixed(elem_type, bytes))
                } else if elem_type == vtype::STRING {
                    let mut ends = Vec::new();
                    if ends.try_reserve_exact(n).is_err() {
                        self.pos = at;
                        return self.err(format!("{what}: cannot allocate an array of {n} elements"));
                    }
                    let mut blob = Vec::new();
                    for _ in 0..n {
                        let s = self.string_slice(what)?;
                        blob.extend_from_slice(s);
                        let Ok(end) = u32::try_from(blob.len()) else {
                            self.pos = at;
                            return self.err(format!("{what}: array of strings holds more than 4 GiB of text"));
                        };
                        ends.push(end);
                    }
                    blob.shrink_to_fit();
                    Value::Array(Array::strings(blob, ends))
                } else {
                    let mut values = Vec::new();
                    if values.try_reserve_exact(n).is_err() {
                        self.pos = at;
                        return self.err(format!("{what}: cannot allocate an array of {n} elements"));
                    }
                    for _ in 0..n {
                        values.push(self.value(elem_type, what, depth + 1)?);
                    }
                    Value::Array(Array::nested(elem_type, values))
                }
            }
            t => return self.err(format!("{what}: invalid value type {t}")),
        })
    }
}

pub fn parse(path: &str, buf: &[u8]) -> Result<ParsedHeader> {
    let mut c = Cursor { path, buf, pos: 0 };
    let magic = c.take(4, "magic")?;
    if magic != GGUF_MAGIC {
        c.pos = 0;
        return c.err(format!("not a GGUF file: magic is {:02x?}, expected \"GGUF\"", magic));
    }
    let version = c.u32("version")?;
    if version == 1 {
        c.pos -= 4;
        return c.err("GGUF version 1 is not supported (it used 32-bit counts); convert the file again");
    }
    if version & 0xffff == 0 && version != 0 {
        c.pos -= 4;
        return c.err(format!("GGUF version {version:#x} looks byte-swapped (a big-endian file): not supported"));
    }
    if version == 0 || version > 3 {
        c.pos -= 4;
        return c.err(format!("unsupported GGUF version {version} (supported: 2 and 3)"));
    }
    let n_tensors = c.u64("tensor count")?;
    let n_kv = c.u64("metadata count")?;
    // Every tensor info takes at least 8+4+4+8 bytes (name length, n_dims, type, offset),
    // every kv at least 8+4+1: counts the rest of the file cannot hold are rejected
    // before anything is allocated for them.
    if n_tensors.checked_mul(24).map_or(true, |b| b > c.remaining() as u64) {
        c.pos -= 16;
        return c.err(format!("tensor count {n_tensors} is larger than the file can hold"));
    }
    if n_kv.checked_mul(13).map_or(true, |b| b > c.remaining() as u64) {
        c.pos -= 8;
        return c.err(format!("metadata count {n_kv} is larger than the file can hold"));
    }

    let mut metadata = Vec::with_capacity(n_kv as usize);
    let mut alignment_at = None;
    let mut seen = HashSet::new();
    for i in 0..n_kv {
        let at = c.pos;
        let key_bytes = c.string(&format!("metadata key #{i}"))?;
        let key = match String::from_utf8(key_bytes) {
            Ok(k) => k,
            Err(_) => {
                c.pos = at;
                return c.err(format!("metadata key #{i} is not valid UTF-8"));
            }
        };
        if key.is_empty() {
            c.pos = at;
            return c.err(format!("metadata key #{i} is empty"));
        }
        if !seen.insert(key.clone()) {
            c.pos = at;
            return c.err(format!("duplicate metadata key '{key}'"));
        }
        let ty = c.u32(&key)?;
        if key == "general.alignment" {
            alignment_at = Some(c.pos as u64 - 4);
        }
        let v = c.value(ty, &key, 0)?;
        metadata.push((key, v));
    }

    let mut alignment = DEFAULT_ALIGNMENT;
    if let Some((_, v)) = metadata.iter().find(|(k, _)| k == "general.alignment") {
        match v {
            Value::U32(a) if *a != 0 && a.is_power_of_two() => alignment = *a as u64,
            Value::U32(a) => {
                return Err(gguf_err(path, alignment_at, format!("general.alignment {a} is not a power of two")))
            }
            other => {
                return Err(gguf_err(
                    path,
                    alignment_at,
                    format!("general.alignment must be a u32, found value type {}", other.type_id()),
                ))
            }
        }
    }

    let mut tensors: Vec<TensorInfo> = Vec::with_capacity(n_tensors as usize);
    let mut names = HashSet::new();
    for i in 0..n_tensors {
        let at = c.pos;
        let name_bytes = c.string(&format!("tensor #{i} name"))?;
        let name = match String::from_utf8(name_bytes) {
            Ok(n) => n,
            Err(_) => {
                c.pos = at;
                return c.err(format!("tensor #{i} name is not valid UTF-8"));
            }
        };
        if name.len() >= MAX_NAME {
            c.pos = at;
            return c.err(format!("tensor #{i} name '{name}' is {} bytes long (ggml's limit is 63)", name.len()));
        }
        if !names.insert(name.clone()) {
            c.pos = at;
            return c.err(format!("duplicate tensor name '{name}'"));
        }
        let n_dims = c.u32(&name)?;
        if n_dims > 4 {
            c.pos -= 4;
            return c.err(format!("tensor '{name}': n_dims {n_dims} > 4"));
        }
        let mut ne = [1u64; 4];
        for d in ne.iter_mut().take(n_dims as usize) {
            let v = c.u64(&name)?;
            if (v as i64) < 0 {
                c.pos -= 8;
                return c.err(format!("tensor '{name}': negative dimension {}", v as i64));
            }
            *d = v;
        }
        let n_el = ne
            .iter()
            .try_fold(1u64, |a, &d| a.checked_mul(d))
            .filter(|&n| n <= i64::MAX as u64)
            .ok_or_else(|| gguf_err(path, Some(c.pos as u64), format!("tensor '{name}': dimensions {ne:?} overflow")))?;
        let ty_id = c.u32(&name)?;
        let ty = match GgmlType::from_u32(ty_id) {
            Some(t) => t,
            None => {
                c.pos -= 4;
                return c.err(format!("tensor '{name}': invalid ggml type {ty_id}"));
            }
        };
        if ne[0] % ty.block_size() as u64 != 0 {
            c.pos -= 4;
            return c.err(format!(
                "tensor '{name}': row length {} is not a multiple of the {} block size {}",
                ne[0],
                ty,
                ty.block_size()
            ));
        }
        let nbytes = (n_el / ty.block_size() as u64)
            .checked_mul(ty.type_size() as u64)
            .ok_or_else(|| gguf_err(path, Some(c.pos as u64), format!("tensor '{name}': size overflows")))?;
        let offset = c.u64(&name)?;
        if offset % alignment != 0 {
            c.pos -= 8;
            return c.err(format!("tensor '{name}': data offset {offset} is not a multiple of the alignment {alignment}"));
        }
        // Tensors must be laid out in order, each at the aligned end of the previous one
        // (gguf.cpp: "tensor has offset X, expected Y").
        let expected = match tensors.last() {
            None => 0,
            Some(p) => match p.offset.checked_add(p.nbytes).and_then(|e| pad(e, alignment)) {
                Some(e) => e,
                None => {
                    c.pos -= 8;
                    return c.err(format!("tensor '{name}': data section size overflows after tensor '{}'", p.name));
                }
            },
        };
        if offset != expected {
            c.pos -= 8;
            return c.err(format!("tensor '{name}' has data offset {offset}, expected {expected} (tensors must be contiguous)"));
        }
        tensors.push(TensorInfo { name, ty, ne, n_dims, offset, nbytes });
    }
    // gguf.cpp pads to the alignment only when there are tensors.
    let data_offset = if tensors.is_empty() {
        c.pos as u64
    } else {
        pad(c.pos as u64, alignment).ok_or_else(|| gguf_err(path, Some(c.pos as u64), "data offset overflows"))?
    };
    Ok(ParsedHeader { version, metadata, tensors, alignment, data_offset })
}

/// `x` rounded up to a multiple of `a` (a power of two), None on overflow.
pub(crate) fn pad(x: u64, a: u64) -> Option<u64> {
    x.checked_add(a - 1).map(|y| y / a * a)
}

#[cfg(test)]
mod tests {
    use super::super::{GgufFile, Storage};

    /// A small valid v3 file: 2 kvs (a string, a u32 array) and 2 F32 tensors.
    fn small() -> Vec<u8> {
        let s = |b: &mut Vec<u8>, x: &str| {
            b.extend((x.len() as u64).to_le_bytes());
            b.extend(x.as_bytes());
        };
        let mut b = b"GGUF".to_vec();
        b.extend(3u32.to_le_bytes());
        b.extend(2u64.to_le_bytes());
        b.extend(2u64.to_le_bytes());
        s(&mut b, "general.architecture");
        b.extend(8u32.to_le_bytes());
        s(&mut b, "llama");
        s(&mut b, "a");
        b.extend(9u32.to_le_bytes());
        b.extend(4u32.to_le_bytes());
        b.extend(3u64.to_le_bytes());
        for v in [1u32, 2, 3] {
            b.extend(v.to_le_bytes());
        }
        for (name, n, off) in [("x", 3u64, 0u64), ("y", 2, 32)] {
            s(&mut b, name);
            b.extend(1u32.to_le_bytes());
            b.extend(n.to_le_bytes());
            b.extend(0u32.to_le_bytes());
            b.extend(off.to_le_bytes());
        }
        while b.len() % 32 != 0 {
            b.push(0);
        }
        b.extend([0u8; 32]);
        b.extend([0u8; 8]);
        b
    }

    fn parse(b: &[u8]) -> crate::Result<GgufFile> {
        GgufFile::from_storage("t.gguf", Storage::from_bytes(b))
    }

    #[test]
    fn valid_file_parses() {
        let f = parse(&small()).unwrap();
        assert_eq!(f.tensors.len(), 2);
        assert_eq!(f.tensor_data(&f.tensors[1]).len(), 8);
        assert_eq!(f.get("a").unwrap().as_array().unwrap().len(), 3);
    }

    #[test]
    fn every_truncation_is_an_error() {
        let b = small();
        for n in 0..b.len() {
            let e = parse(&b[..n]).err().unwrap_or_else(|| panic!("truncation at {n} parsed"));
            assert!(e.to_string().starts_with("t.gguf: "), "{e}");
        }
    }

    #[test]
    fn byte_flips_never_panic() {
        let base = small();
        let mut seed = 0x9e3779b97f4a7c15u64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for _ in 0..20000 {
            let mut b = base.clone();
            for _ in 0..(next() % 4 + 1) {
                let i = (next() % b.len() as u64) as usize;
                b[i] = next() as u8;
            }
            if let Ok(f) = parse(&b) {
                for t in &f.tensors {
                    assert_eq!(f.tensor_data(t).len() as u64, t.nbytes);
                }
            }
        }
    }
}
