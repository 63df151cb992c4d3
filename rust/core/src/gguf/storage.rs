//! Where the bytes of a GGUF file live (pipeline step 2, load modes as llama.h names them):
//!
//! - `mmap` / `auto`: a read-only memory map; tensors point into it (zero copy). A model
//!   load maps every page at once (`Storage::populate`, as llama.cpp's MAP_POPULATE); a
//!   plain `GgufFile::open` (metadata, vocab-only) leaves the pages to be read lazily.
//! - `none`: the whole file read into an owned, 64-byte aligned buffer.
//! - `mlock`: like `none`, then the buffer is locked in RAM (mlock).
//! - `mmap+mlock`: the map, locked in RAM.
//! - `dio`: read with O_DIRECT (Linux) into a buffer aligned to the file system block size,
//!   every read rounded to whole blocks; where the file system refuses O_DIRECT (tmpfs,
//!   some network file systems) it falls back to buffered reads with a warning.
//!
//! Failing to lock memory is not fatal (llama.cpp only warns too): the reason lands in
//! `warnings`, which the Python layer logs.

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
    pub const ALL: [LoadMode; 6] =
        [LoadMode::Auto, LoadMode::None, LoadMode::Mmap, LoadMode::Mlock, LoadMode::MmapMlock, LoadMode::Dio];

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
    /// llama.h's enum value (LLAMA_LOAD_MODE_AUTO = -1 ... LLAMA_LOAD_MODE_DIRECT_IO = 4).
    pub fn to_llama(self) -> i32 {
        match self {
            LoadMode::Auto => -1,
            LoadMode::None => 0,
            LoadMode::Mmap => 1,
            LoadMode::Mlock => 2,
            LoadMode::MmapMlock => 3,
            LoadMode::Dio => 4,
        }
    }
    pub fn from_llama(v: i32) -> Option<LoadMode> {
        LoadMode::ALL.into_iter().find(|m| m.to_llama() == v)
    }
    pub fn uses_mmap(self) -> bool {
        matches!(self, LoadMode::Auto | LoadMode::Mmap | LoadMode::MmapMlock)
    }
    pub fn uses_mlock(self) -> bool {
        matches!(self, LoadMode::Mlock | LoadMode::MmapMlock)
    }
}

/// 2 MiB: a transparent huge page on x86-64 (and 4 KiB-granule aarch64).
const HUGE_PAGE: usize = 2 << 20;

/// Whether a model load in `LoadMode::Auto` reads its files (`len` bytes in all) into memory
/// (on 2 MiB pages, as `LoadMode::None`) rather than mapping them: on Linux with transparent huge pages (`always` or `madvise`) and a file
/// of at most half the memory available. The single-token matmuls read every weight once
/// per token, and on 2 MiB pages they read them faster: tg128 with 2 threads, alternated,
/// SmolLM2 218-234 -> 262-266 t/s, Gemma 3 114-116 -> 125-126 (a file mapping keeps 4 KiB
/// pages). Otherwise, or for a file that large, the mapping.
pub fn auto_reads(len: u64) -> bool {
    #[cfg(target_os = "linux")]
    {
        let thp = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
            .is_ok_and(|s| s.contains("[always]") || s.contains("[madvise]"));
        let avail = std::fs::read_to_string("/proc/meminfo").ok().and_then(|s| {
            let line = s.lines().find(|l| l.starts_with("MemAvailable:"))?;
            line.split_whitespace().nth(1)?.parse::<usize>().ok().map(|kb| kb.saturating_mul(1024))
        });
        thp && avail.is_some_and(|a| len <= a as u64 / 2)
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = len;
        false
    }
}

/// An owned byte buffer with a chosen alignment (64 for cache lines / SIMD loads, the
/// file system block size for O_DIRECT), zeroed. Allocation failure is an error, not an
/// abort. From 2 MiB on (Linux) it is an anonymous mapping (zero pages, mapped on first
/// write) whose data starts on a 2 MiB boundary, advised for transparent huge pages before
/// anything is written: the weights read into it then sit on 2 MiB pages, which the
/// single-token kernels stream faster than 4 KiB ones (fewer TLB misses; the hardware
/// prefetchers stop at page boundaries).
pub struct AlignedBuf {
    mem: Mem,
    /// Bytes that hold file data.
    len: usize,
    /// Bytes of the buffer (data plus padding).
    size: usize,
}

enum Mem {
    Heap(std::ptr::NonNull<u8>, std::alloc::Layout),
    /// the mapping (owned) and the buffer's start inside it
    #[cfg(target_os = "linux")]
    Anon { _map: memmap2::MmapMut, start: *mut u8 },
}

// SAFETY: AlignedBuf owns its allocation exclusively, like a Vec<u8>.
unsafe impl Send for AlignedBuf {}
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// A zeroed buffer of `cap` bytes (at least 1) of which the first `len` are data.
    fn new(len: usize, cap: usize, align: usize) -> Option<AlignedBuf> {
        let size = cap.max(len).max(1);
        #[cfg(target_os = "linux")]
        if size >= HUGE_PAGE && align <= HUGE_PAGE {
            let mut map = memmap2::MmapOptions::new().len(size.checked_add(HUGE_PAGE)?).map_anon().ok()?;
            // a hint: without transparent huge pages the mapping keeps 4 KiB pages
            let _ = map.advise(memmap2::Advice::HugePage);
            let base = map.as_mut_ptr();
            let off = (base as usize).next_multiple_of(HUGE_PAGE) - base as usize;
            // SAFETY: off < HUGE_PAGE, so off + size fits the mapping
            return Some(AlignedBuf { mem: Mem::Anon { _map: map, start: unsafe { base.add(off) } }, len, size });
        }
        let layout = std::alloc::Layout::from_size_align(size, align).ok()?;
        // SAFETY: the layout has a non-zero size.
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        Some(AlignedBuf { mem: Mem::Heap(std::ptr::NonNull::new(p)?, layout), len, size })
    }
    fn ptr(&self) -> *mut u8 {
        match &self.mem {
            Mem::Heap(p, _) => p.as_ptr(),
            #[cfg(target_os = "linux")]
            Mem::Anon { start, .. } => *start,
        }
    }
    fn as_slice(&self) -> &[u8] {
        // SAFETY: the allocation holds size >= len initialized (zeroed, then written) bytes.
        unsafe { std::slice::from_raw_parts(self.ptr(), self.len) }
    }
    /// The whole allocation (data plus block padding for O_DIRECT).
    fn as_mut_full(&mut self) -> &mut [u8] {
        // SAFETY: as above; &mut self guarantees exclusive access (the mapping is private
        // and writable).
        unsafe { std::slice::from_raw_parts_mut(self.ptr(), self.size) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        match self.mem {
            // SAFETY: allocated in `new` with this layout.
            Mem::Heap(p, layout) => unsafe { std::alloc::dealloc(p.as_ptr(), layout) },
            // the mapping unmaps itself
            #[cfg(target_os = "linux")]
            Mem::Anon { .. } => {}
        }
    }
}

enum Kind {
    Mmap(memmap2::Mmap),
    Owned(AlignedBuf),
}

pub struct Storage {
    kind: Kind,
    /// Whether the bytes are locked in RAM (unlocked again on drop).
    locked: bool,
    /// Non-fatal problems (mlock refused, O_DIRECT refused) for the caller to log.
    pub warnings: Vec<String>,
}

/// Reads are done in chunks of this size so that progress can be reported and a
/// cancellation takes effect quickly.
const CHUNK: usize = 16 << 20;

impl Storage {
    pub fn open(path: &str, mode: LoadMode) -> Result<Storage> {
        Self::open_with_progress(path, mode, &mut |_, _| true)
    }

    /// Open `path` in `mode`. For modes that read the file, `progress(done, total)` is
    /// called after every chunk; returning false stops and returns `Error::Cancelled`
    /// (the buffer and the file handle are dropped).
    pub fn open_with_progress(
        path: &str,
        mode: LoadMode,
        progress: &mut dyn FnMut(usize, usize) -> bool,
    ) -> Result<Storage> {
        let io = |what: &str, e| Error::Io { path: path.to_string(), what: what.to_string(), source: e };
        let f = File::open(path).map_err(|e| io("cannot open", e))?;
        let meta = f.metadata().map_err(|e| io("cannot stat", e))?;
        if meta.is_dir() {
            return Err(Error::Io {
                path: path.to_string(),
                what: "cannot read".into(),
                source: std::io::Error::other("is a directory"),
            });
        }
        let len = usize::try_from(meta.len()).map_err(|_| {
            Error::Gguf { path: path.to_string(), offset: None, msg: "file too large for this platform".into() }
        })?;
        let mut warnings = Vec::new();
        let mut s = if mode.uses_mmap() && len > 0 {
            // SAFETY: the file is opened read-only; like llama.cpp we accept that a
            // concurrent writer truncating the file is undefined behaviour.
            let m = unsafe { memmap2::Mmap::map(&f) }.map_err(|e| io("cannot mmap", e))?;
            Storage { kind: Kind::Mmap(m), locked: false, warnings: Vec::new() }
        } else if mode == LoadMode::Dio {
            drop(f);
            match read_direct(path, len, progress)? {
                Ok(buf) => Storage { kind: Kind::Owned(buf), locked: false, warnings: Vec::new() },
                Err(why) => {
                    warnings.push(format!("{path}: direct I/O not available ({why}); falling back to buffered reads"));
                    let f = File::open(path).map_err(|e| io("cannot open", e))?;
                    Storage { kind: Kind::Owned(read_buffered(path, f, len, progress)?), locked: false, warnings: Vec::new() }
                }
            }
        } else {
            Storage { kind: Kind::Owned(read_buffered(path, f, len, progress)?), locked: false, warnings: Vec::new() }
        };
        s.warnings = warnings;
        if mode.uses_mlock() {
            s.lock(path);
        }
        Ok(s)
    }

    fn lock(&mut self, path: &str) {
        let r: std::io::Result<()> = match &self.kind {
            Kind::Mmap(m) => m.lock(),
            Kind::Owned(b) => lock_bytes(b.as_slice()),
        };
        match r {
            Ok(()) => self.locked = !self.is_empty(),
            Err(e) => self.warnings.push(format!(
                "{path}: failed to mlock {} bytes: {e} (try raising the RLIMIT_MEMLOCK limit, `ulimit -l`)",
                self.len()
            )),
        }
    }

    pub fn from_bytes(bytes: &[u8]) -> Storage {
        let mut b = AlignedBuf::new(bytes.len(), bytes.len(), 64).expect("out of memory");
        b.as_mut_full()[..bytes.len()].copy_from_slice(bytes);
        Storage { kind: Kind::Owned(b), locked: false, warnings: Vec::new() }
    }

    pub fn bytes(&self) -> &[u8] {
        match &self.kind {
            Kind::Mmap(m) => m,
            Kind::Owned(b) => b.as_slice(),
        }
    }

    /// The bytes, writable, where they are an owned copy (not a map of the file).
    pub(crate) fn bytes_mut(&mut self) -> Option<&mut [u8]> {
        match &mut self.kind {
            Kind::Mmap(_) => None,
            Kind::Owned(b) => {
                let len = b.len;
                Some(&mut b.as_mut_full()[..len])
            }
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

    /// Maps every page of a memory-mapped file now, as llama.cpp maps its models
    /// (MAP_POPULATE): the first forward pass then does not fault the weights in page by
    /// page (Gemma 3's 178 MB output matrix is ~43k minor faults, 10 ms of its first
    /// prompt). Linux: MADV_POPULATE_READ per chunk; elsewhere, or on kernels without it
    /// (before 5.14), a read of one byte per page. In chunks of CHUNK bytes with
    /// `progress(done, total)`, which may return false to cancel (then false is returned).
    /// Owned buffers are already in memory: nothing to do.
    pub fn populate(&self, progress: &mut dyn FnMut(usize, usize) -> bool) -> bool {
        let Kind::Mmap(m) = &self.kind else { return true };
        let len = m.len();
        let mut done = 0;
        while done < len {
            let n = CHUNK.min(len - done);
            #[cfg(target_os = "linux")]
            let mapped = m.advise_range(memmap2::Advice::PopulateRead, done, n).is_ok();
            #[cfg(not(target_os = "linux"))]
            let mapped = false;
            if !mapped {
                let mut i = done;
                while i < done + n {
                    // SAFETY: i < len, inside the map
                    unsafe { std::ptr::read_volatile(m.as_ptr().add(i)) };
                    i += 4096;
                }
            }
            done += n;
            if !progress(done, len) {
                return false;
            }
        }
        true
    }

    pub fn is_mmap(&self) -> bool {
        matches!(self.kind, Kind::Mmap(_))
    }

    pub fn is_locked(&self) -> bool {
        self.locked
    }
}

impl Drop for Storage {
    fn drop(&mut self) {
        if self.locked {
            let _ = match &self.kind {
                Kind::Mmap(m) => m.unlock(),
                Kind::Owned(b) => unlock_bytes(b.as_slice()),
            };
        }
    }
}

fn alloc_err(path: &str, n: usize) -> Error {
    Error::Io {
        path: path.to_string(),
        what: format!("cannot allocate {n} bytes to read the file"),
        source: std::io::Error::new(std::io::ErrorKind::OutOfMemory, "out of memory"),
    }
}

fn read_buffered(
    path: &str,
    mut f: File,
    len: usize,
    progress: &mut dyn FnMut(usize, usize) -> bool,
) -> Result<AlignedBuf> {
    let mut buf = AlignedBuf::new(len, len, 64).ok_or_else(|| alloc_err(path, len))?;
    let dst = &mut buf.as_mut_full()[..len];
    let mut done = 0;
    while done < len {
        let n = CHUNK.min(len - done);
        f.read_exact(&mut dst[done..done + n]).map_err(|e| Error::Io {
            path: path.to_string(),
            what: format!("cannot read bytes {done}..{}", done + n),
            source: e,
        })?;
        done += n;
        if !progress(done, len) {
            return Err(Error::Cancelled);
        }
    }
    Ok(buf)
}

/// O_DIRECT read. The outer Result is a hard error (I/O error, cancel); the inner Err
/// says why direct I/O is unavailable, so the caller falls back to buffered reads.
#[cfg(target_os = "linux")]
fn read_direct(
    path: &str,
    len: usize,
    progress: &mut dyn FnMut(usize, usize) -> bool,
) -> Result<std::result::Result<AlignedBuf, String>> {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let f = match std::fs::OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(path) {
        Ok(f) => f,
        Err(e) => return Ok(Err(e.to_string())),
    };
    let meta = f.metadata().map_err(|e| Error::Io { path: path.to_string(), what: "cannot stat".into(), source: e })?;
    // O_DIRECT wants buffer address, file offset and length aligned to the block size.
    let block = (meta.blksize() as usize).clamp(512, 1 << 20).next_power_of_two();
    let cap = len.div_ceil(block).max(1) * block;
    let mut buf = AlignedBuf::new(len, cap, block.max(64)).ok_or_else(|| alloc_err(path, cap))?;
    let chunk = CHUNK / block * block;
    let mut done = 0usize;
    let mut f = f;
    while done < len {
        let want = chunk.min(cap - done);
        let dst = &mut buf.as_mut_full()[done..done + want];
        let n = match f.read(dst) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL) | Some(libc::EFAULT)) => {
                return Ok(Err(e.to_string()))
            }
            Err(e) => {
                return Err(Error::Io { path: path.to_string(), what: format!("cannot read at offset {done}"), source: e })
            }
        };
        if n == 0 {
            return Err(Error::Io {
                path: path.to_string(),
                what: format!("unexpected end of file at offset {done}"),
                source: std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "file shrank while reading"),
            });
        }
        done += n;
        if n % block != 0 && done < len {
            // A short read in the middle of the file leaves the offset unaligned: the
            // next O_DIRECT read would fail, so let buffered reads finish the job.
            return Ok(Err(format!("short read of {n} bytes at offset {}", done - n)));
        }
        if !progress(done.min(len), len) {
            return Err(Error::Cancelled);
        }
    }
    Ok(Ok(buf))
}

#[cfg(not(target_os = "linux"))]
fn read_direct(
    _path: &str,
    _len: usize,
    _progress: &mut dyn FnMut(usize, usize) -> bool,
) -> Result<std::result::Result<AlignedBuf, String>> {
    Ok(Err("O_DIRECT is only implemented on Linux".into()))
}

#[cfg(unix)]
fn lock_bytes(b: &[u8]) -> std::io::Result<()> {
    if b.is_empty() {
        return Ok(());
    }
    // SAFETY: the range is a live allocation owned by the caller.
    if unsafe { libc::mlock(b.as_ptr() as *const libc::c_void, b.len()) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[cfg(unix)]
fn unlock_bytes(b: &[u8]) -> std::io::Result<()> {
    // SAFETY: as in lock_bytes.
    if b.is_empty() || unsafe { libc::munlock(b.as_ptr() as *const libc::c_void, b.len()) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[cfg(not(unix))]
fn lock_bytes(_b: &[u8]) -> std::io::Result<()> {
    Err(std::io::Error::new(std::io::ErrorKind::Unsupported, "mlock of read buffers is not supported on this platform"))
}

#[cfg(not(unix))]
fn unlock_bytes(_b: &[u8]) -> std::io::Result<()> {
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_buf_zeroes_the_padding_and_puts_large_buffers_on_2_mib_boundaries() {
        // small: the asked alignment; large: 2 MiB (on Linux), so that the whole buffer can
        // sit on huge pages; the padding past `len` is zero either way
        for (len, cap, align) in [(10usize, 100usize, 64usize), (3 << 20, (3 << 20) + 4096, 4096)] {
            let mut b = AlignedBuf::new(len, cap, align).unwrap();
            let want = if cfg!(target_os = "linux") && cap >= HUGE_PAGE { HUGE_PAGE } else { align };
            assert!(b.as_mut_full().iter().all(|&x| x == 0));
            assert_eq!(b.as_slice().as_ptr() as usize % want, 0, "{len} bytes");
            assert_eq!(b.as_slice().len(), len);
            assert!(b.as_mut_full()[len..].iter().all(|&x| x == 0));
            b.as_mut_full()[..len].fill(7);
            assert!(b.as_slice().iter().all(|&x| x == 7));
        }
    }
}
