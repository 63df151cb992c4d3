//! Where the bytes of a GGUF file live: a read-only memory map (zero copy) or an owned,
//! 64-byte aligned buffer (load mode `none` / `dio`).

use crate::error::{Error, Result};
use std::fs::File;
use std::io::Read;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LoadMode {
    Auto,
    None,
    Mmap,
    Mlock,
    MmapMlock,
    Dio,
}

impl LoadMode {
    pub fn name(self) -> &'static str {
        match self {
            LoadMode::Auto => "auto",
            LoadMode::None => "none",
            LoadMode::Mmap => "mmap",
            LoadMode::Mlock => "mlock",
            LoadMode::MmapMlock => "mmap+mlock",
            LoadMode::Dio => "dio",
        }
    }
    pub fn from_name(s: &str) -> Option<LoadMode> {
        Some(match s {
            "auto" => LoadMode::Auto,
            "none" => LoadMode::None,
            "mmap" => LoadMode::Mmap,
            "mlock" => LoadMode::Mlock,
            "mmap+mlock" => LoadMode::MmapMlock,
            "dio" => LoadMode::Dio,
            _ => return None,
        })
    }
}

#[repr(C, align(64))]
#[derive(Clone, Copy)]
pub struct Line([u8; 64]);

pub enum Storage {
    Mmap(memmap2::Mmap),
    Owned { buf: Vec<Line>, len: usize },
}

impl Storage {
    pub fn open(path: &str, mode: LoadMode) -> Result<Storage> {
        let io = |what: &str, e| Error::Io { path: path.to_string(), what: what.to_string(), source: e };
        let mut f = File::open(path).map_err(|e| io("cannot open", e))?;
        let len = f.metadata().map_err(|e| io("cannot stat", e))?.len() as usize;
        match mode {
            LoadMode::Auto | LoadMode::Mmap | LoadMode::MmapMlock if len > 0 => {
                // SAFETY: the file is opened read-only; like llama.cpp we accept that a
                // concurrent writer truncating the file is undefined behaviour.
                let m = unsafe { memmap2::Mmap::map(&f) }.map_err(|e| io("cannot mmap", e))?;
                Ok(Storage::Mmap(m))
            }
            _ => {
                let mut s = Storage::Owned { buf: vec![Line([0; 64]); len.div_ceil(64)], len };
                f.read_exact(s.bytes_mut()).map_err(|e| io("cannot read", e))?;
                Ok(s)
            }
        }
    }

    pub fn from_bytes(bytes: &[u8]) -> Storage {
        let mut s = Storage::Owned { buf: vec![Line([0; 64]); bytes.len().div_ceil(64)], len: bytes.len() };
        s.bytes_mut().copy_from_slice(bytes);
        s
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        match self {
            Storage::Mmap(_) => &mut [],
            Storage::Owned { buf, len } => {
                // SAFETY: Line is 64 plain bytes; the Vec holds at least `len` bytes.
                unsafe { std::slice::from_raw_parts_mut(buf.as_mut_ptr() as *mut u8, *len) }
            }
        }
    }

    pub fn bytes(&self) -> &[u8] {
        match self {
            Storage::Mmap(m) => m,
            Storage::Owned { buf, len } => unsafe { std::slice::from_raw_parts(buf.as_ptr() as *const u8, *len) },
        }
    }

    pub fn header_bytes(&self) -> &[u8] {
        self.bytes()
    }

    pub fn len(&self) -> usize {
        self.bytes().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn is_mmap(&self) -> bool {
        matches!(self, Storage::Mmap(_))
    }
}
