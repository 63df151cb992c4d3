//! The KV cache (pipeline step 7 reserves it, steps 11-13 fill it): cells that each hold
//! one position and the set of sequences that see it, the slot search for a micro-batch,
//! llama.h's sequence operations, and typed K/V storage.
//!
//! Semantics follow llama.cpp's src/llama-kv-cache.cpp and llama-kv-cells.h:
//! - one stream of `n_ctx` cells when unified, else one stream of `n_ctx_seq` cells per
//!   sequence (sequence s lives in stream s);
//! - `find_slot` takes empty cells, scanning from `head` (reset to 0 when plenty of cells
//!   are free before it), one token at a time, wrapping once around;
//! - `seq_add` / `seq_div` move positions and remember the total shift per cell; the K
//!   rows of shifted cells are re-rotated before the next compute (the K-shift, done by
//!   the context, which knows each layer's rope).
//!
//! Storage, per layer and stream: K and V as [size][n_embd_{k,v}_gqa] rows of `type_k` /
//! `type_v` (llama.cpp's set: f32, f16, bf16, q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1), each
//! row written with ggml-cpu's `from_float` for the type (`quant::quantize_row_cpu`), so
//! the bytes equal llama.cpp's. Rows are not transposed: attention reads one key row and
//! one value row per cell.
//!
//! Sliding-window layers share the cells of the full cache (llama.cpp's `swa_full`
//! layout, whatever `swa_full` says); the window is applied as a mask by position at
//! attention time. So no cell is ever reused while its sequence still holds it, and
//! `seq_pos_min` reports the oldest cached position even where llama.cpp's separate
//! window cache would already have dropped it.

use crate::error::{alloc, Error, Result};
use crate::ggml_type::GgmlType;

/// The most sequences a context may hold (llama.h LLAMA_MAX_SEQ).
pub const MAX_SEQ: usize = 256;

/// A set of sequence ids < 256.
#[derive(Clone, Copy, Default, PartialEq, Eq, Debug)]
pub struct SeqSet([u64; 4]);

impl SeqSet {
    pub const EMPTY: SeqSet = SeqSet([0; 4]);
    #[inline]
    pub fn has(&self, s: usize) -> bool {
        self.0[s >> 6] >> (s & 63) & 1 != 0
    }
    #[inline]
    pub fn add(&mut self, s: usize) {
        self.0[s >> 6] |= 1 << (s & 63);
    }
    #[inline]
    pub fn remove(&mut self, s: usize) {
        self.0[s >> 6] &= !(1 << (s & 63));
    }
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.0 == [0; 4]
    }
    pub fn count(&self) -> u32 {
        self.0.iter().map(|w| w.count_ones()).sum()
    }
    /// The set as four 64-bit words (bit s of word s / 64), for saved states.
    pub fn words(&self) -> [u64; 4] {
        self.0
    }
    pub fn from_words(w: [u64; 4]) -> SeqSet {
        SeqSet(w)
    }
    pub fn only(s: usize) -> SeqSet {
        let mut r = SeqSet::default();
        r.add(s);
        r
    }
    /// The lowest sequence id in the set.
    pub fn first(&self) -> Option<usize> {
        self.0.iter().enumerate().find(|(_, w)| **w != 0).map(|(i, w)| i * 64 + w.trailing_zeros() as usize)
    }
}

#[derive(Clone, Copy, Debug)]
pub struct Cell {
    /// -1 when empty.
    pub pos: i32,
    /// Accumulated position change since K was last rotated (seq_add / seq_div).
    pub shift: i32,
    pub seq: SeqSet,
}

impl Cell {
    const EMPTY: Cell = Cell { pos: -1, shift: 0, seq: SeqSet([0; 4]) };
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.pos < 0
    }
}

/// The cells of one stream plus the search head.
#[derive(Clone)]
pub struct Stream {
    pub cells: Vec<Cell>,
    pub head: usize,
    pub used: usize,
}

impl Stream {
    fn new(size: usize) -> Result<Stream> {
        Ok(Stream { cells: alloc::filled(size, Cell::EMPTY, "the KV cells [n_ctx]")?, head: 0, used: 0 })
    }

    fn clear(&mut self) {
        self.cells.iter_mut().for_each(|c| *c = Cell::EMPTY);
        self.head = 0;
        self.used = 0;
    }

    /// Empty a cell entirely.
    fn rm(&mut self, i: usize) {
        if !self.cells[i].is_empty() {
            self.used -= 1;
        }
        self.cells[i] = Cell::EMPTY;
    }

    /// Remove `s` from cell i; true when the cell became empty.
    fn seq_rm_cell(&mut self, i: usize, s: usize) -> bool {
        let c = &mut self.cells[i];
        c.seq.remove(s);
        if c.seq.is_empty() {
            self.rm(i);
            return true;
        }
        false
    }

    #[inline]
    fn pos_in(&self, i: usize, p0: i32, p1: i32) -> bool {
        let p = self.cells[i].pos;
        p >= p0 && p < p1
    }
}

/// Where a micro-batch's tokens went: token k of the micro-batch -> (stream, cell).
#[derive(Default, Clone)]
pub struct Slot {
    pub cells: Vec<(u32, u32)>,
}

/// Every layer's K (or V) bytes, zeroed, in one anonymous mapping advised for 2 MiB pages
/// (where the system has transparent huge pages in `madvise` mode or on): layer `il` is
/// `bufs[il]`, a byte slice on a 64-byte boundary. A decode step's attention reads one
/// head's part of every cell row of every layer; with a Vec per layer (4 KiB pages: a
/// layer's 1.7 MiB cannot hold a 2 MiB page) SmolLM2's decode step at depth 4096 spent a
/// fifth of its attention more (`cargo bench --bench attention`, 30 layers, one thread:
/// 15.1-16.1 -> 12.2-12.4 ms) and its tg64 @ d4096 ran 67.8 against 84.8 t/s (2 threads) and
/// 43.8 against 49.7 (1 thread); Gemma 3 (one KV head) and shallow contexts unchanged.
/// Pages are mapped on first write, so an unused part of the cache costs no memory.
pub struct LayerBufs {
    map: Option<memmap2::MmapMut>,
    /// layer il: bytes offs[il].0..offs[il].0 + offs[il].1
    offs: Vec<(usize, usize)>,
}

impl LayerBufs {
    /// Zeroed buffers of `lens[il]` bytes; `what` names them in an allocation error.
    pub fn new(lens: &[usize], what: &str) -> Result<LayerBufs> {
        let mut offs = Vec::with_capacity(lens.len());
        let mut total = 0usize;
        for &n in lens {
            offs.push((total, n));
            total = alloc::mul(what, total.saturating_add(n).div_ceil(64), 64)?;
        }
        if total == 0 {
            return Ok(LayerBufs { map: None, offs });
        }
        let map = memmap2::MmapOptions::new()
            .len(total)
            .map_anon()
            .map_err(|e| Error::Invalid(format!("cannot allocate {total} bytes for {what}: {e}")))?;
        // a hint: without transparent huge pages the mapping keeps 4 KiB pages
        #[cfg(target_os = "linux")]
        let _ = map.advise(memmap2::Advice::HugePage);
        Ok(LayerBufs { map: Some(map), offs })
    }

    /// The number of layers.
    pub fn len(&self) -> usize {
        self.offs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.offs.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = &[u8]> {
        (0..self.len()).map(move |il| &self[il])
    }

    /// Every layer's bytes, mutably (disjoint slices).
    pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut [u8]> {
        let mut rest: &mut [u8] = match &mut self.map {
            Some(m) => &mut m[..],
            None => &mut [],
        };
        let mut at = 0;
        let mut out = Vec::with_capacity(self.offs.len());
        for &(o, n) in &self.offs {
            let (_, tail) = std::mem::take(&mut rest).split_at_mut(o - at);
            let (mine, tail) = tail.split_at_mut(n);
            out.push(mine);
            rest = tail;
            at = o + n;
        }
        out.into_iter()
    }
}

impl PartialEq for LayerBufs {
    fn eq(&self, other: &LayerBufs) -> bool {
        self.len() == other.len() && self.iter().zip(other.iter()).all(|(a, b)| a == b)
    }
}

impl std::fmt::Debug for LayerBufs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.offs.iter().map(|&(_, n)| format!("{n} bytes"))).finish()
    }
}

impl std::ops::Index<usize> for LayerBufs {
    type Output = [u8];
    fn index(&self, il: usize) -> &[u8] {
        let (o, n) = self.offs[il];
        match &self.map {
            Some(m) => &m[o..o + n],
            None => &[],
        }
    }
}

impl std::ops::IndexMut<usize> for LayerBufs {
    fn index_mut(&mut self, il: usize) -> &mut [u8] {
        let (o, n) = self.offs[il];
        match &mut self.map {
            Some(m) => &mut m[o..o + n],
            None => &mut [],
        }
    }
}

pub struct KvCache {
    pub type_k: GgmlType,
    pub type_v: GgmlType,
    pub n_seq_max: usize,
    /// Cells per stream.
    pub size: usize,
    pub streams: Vec<Stream>,
    /// Bytes of one cell's K (V) row, per layer.
    pub row_k: Vec<usize>,
    pub row_v: Vec<usize>,
    /// Per layer: [n_stream * size * row_k] bytes.
    pub k: LayerBufs,
    pub v: LayerBufs,
    /// Some cell has a non-zero `shift` (a K-shift is due before the next compute).
    pub has_shift: bool,
    /// Walsh-Hadamard rotation sizes (0 = none) for K (and Q) and for V: llama.cpp's
    /// `attn_rot_k` / `attn_rot_v` (see `rotation_sizes`).
    pub rot_k: usize,
    pub rot_v: usize,
    /// llama.cpp's flash attention is on (the default; auto resolves to on on the CPU).
    /// Attention always runs llama.cpp's flash-attention kernel; this only decides whether
    /// an F32 K or V is first rounded to F16, as llama.cpp's graph casts it for that kernel
    /// (off: F32 stays F32, as llama.cpp's mul_mat path reads it).
    pub flash_attn: bool,
    /// llama.cpp's `offload_kqv`: the cache of GPU-offloaded layers lives on the device and
    /// attention runs there (gpu/kv.rs); false keeps both on the CPU.
    pub offload_kqv: bool,
    /// That device copy, made by the first decode that uses it: one part per device the
    /// offloaded layers are split over (`split_mode` layer), each holding its layers' cache.
    #[cfg(feature = "gpu")]
    pub gpu: Vec<crate::gpu::kv::GpuKv>,
}

/// llama.cpp's attention rotation for quantized caches (llama-kv-cache.cpp, `attn_rot_k`
/// / `attn_rot_v`, unless LLAMA_ATTN_ROT_DISABLE): with a quantized K type and a head size
/// that is a multiple of 64, Q and K are multiplied by an orthonormal Walsh-Hadamard
/// matrix of the largest power-of-two size >= 64 dividing the head size before K is
/// stored; with a quantized V type (head size a multiple of 64), V is rotated in blocks of
/// 64 before it is stored and the attention output rotated back (the matrix is its own
/// inverse). The rotation spreads outliers across a block, so the quantized cache loses
/// less. Returns (rot_k, rot_v), 0 meaning none.
pub fn rotation_sizes(type_k: GgmlType, type_v: GgmlType, n_embd_head_k: usize, n_embd_head_v: usize) -> (usize, usize) {
    let rot_k = if is_quantized(type_k) && n_embd_head_k > 0 && n_embd_head_k % 64 == 0 {
        let mut n = 64;
        while n_embd_head_k % (n * 2) == 0 {
            n *= 2;
        }
        n
    } else {
        0
    };
    let rot_v = if is_quantized(type_v) && n_embd_head_v > 0 && n_embd_head_v % 64 == 0 { 64 } else { 0 };
    (rot_k, rot_v)
}

/// `x` times the orthonormal Walsh-Hadamard matrix of size `n` (a power of two), chunk by
/// chunk of `n` values: ggml-cpu's `ggml_compute_forward_fwht` (the mul_mat with the
/// GGML_HINT_SRC0_IS_HADAMARD hint llama.cpp uses for the rotation), in its float order:
/// each value times 1/sqrt(n), then the butterflies (u + v, u - v) for len = 1, 2, 4, ...
pub fn fwht(x: &mut [f32], n: usize) {
    if n == 0 {
        return;
    }
    let scale = 1.0f32 / (n as f32).sqrt();
    for d in x.chunks_exact_mut(n) {
        for v in d.iter_mut() {
            *v *= scale;
        }
        let mut len = 1;
        while len < n {
            for i in (0..n).step_by(2 * len) {
                for j in i..i + len {
                    let (u, v) = (d[j], d[j + len]);
                    d[j] = u + v;
                    d[j + len] = u - v;
                }
            }
            len <<= 1;
        }
    }
}

/// llama.cpp's `-ctk` / `-ctv` set (common/arg.cpp `kv_cache_types`), in its order.
pub const KV_CACHE_TYPES: [GgmlType; 9] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::IQ4_NL,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
];

pub fn parse_cache_type(s: &str) -> Result<GgmlType> {
    match GgmlType::from_name(s) {
        Some(t) if KV_CACHE_TYPES.contains(&t) => Ok(t),
        _ => {
            let names: Vec<String> = KV_CACHE_TYPES.iter().map(|t| t.name().to_lowercase()).collect();
            Err(Error::Invalid(format!("unsupported KV cache type '{s}' (supported: {})", names.join(", "))))
        }
    }
}

/// Whether a V cache of type `t` needs flash attention (llama.cpp: any quantized type).
pub fn is_quantized(t: GgmlType) -> bool {
    !matches!(t, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16)
}

impl KvCache {
    /// `n_embd_k[il]` / `n_embd_v[il]`: K/V row lengths per layer (n_embd_head * n_head_kv).
    pub fn new(
        n_embd_k: &[usize],
        n_embd_v: &[usize],
        size: usize,
        n_stream: usize,
        n_seq_max: usize,
        type_k: GgmlType,
        type_v: GgmlType,
    ) -> Result<KvCache> {
        if n_seq_max == 0 || n_seq_max > MAX_SEQ {
            return Err(Error::Invalid(format!("n_seq_max = {n_seq_max} must be in [1, {MAX_SEQ}]")));
        }
        if size == 0 {
            return Err(Error::Invalid("KV cache size must be positive".into()));
        }
        let rows = |n: &[usize], t: GgmlType, what: &str| -> Result<Vec<usize>> {
            n.iter()
                .map(|&e| {
                    t.row_size(e).ok_or_else(|| {
                        Error::Invalid(format!(
                            "KV cache {what} type {t} needs rows that are a multiple of {} (got {e})",
                            t.block_size()
                        ))
                    })
                })
                .collect()
        };
        let row_k = rows(n_embd_k, type_k, "K")?;
        let row_v = rows(n_embd_v, type_v, "V")?;
        let layers = |rows: &[usize], what: &str| -> Result<LayerBufs> {
            let lens = rows.iter().map(|&rb| alloc::mul(what, alloc::mul(what, rb, size)?, n_stream)).collect::<Result<Vec<_>>>()?;
            LayerBufs::new(&lens, what)
        };
        let k = layers(&row_k, "the KV cache's K [n_layer, n_ctx, n_embd_k_gqa]")?;
        let v = layers(&row_v, "the KV cache's V [n_layer, n_ctx, n_embd_v_gqa]")?;
        Ok(KvCache {
            type_k,
            type_v,
            n_seq_max,
            size,
            streams: (0..n_stream).map(|_| Stream::new(size)).collect::<Result<Vec<_>>>()?,
            row_k,
            row_v,
            k,
            v,
            has_shift: false,
            rot_k: 0,
            rot_v: 0,
            flash_attn: true,
            offload_kqv: true,
            #[cfg(feature = "gpu")]
            gpu: Vec::new(),
        })
    }

    /// The host K/V bytes changed (K-shift, state load, a layer computed on the CPU): a
    /// device copy must be uploaded again before it is read.
    #[inline]
    pub fn host_changed(&mut self) {
        #[cfg(feature = "gpu")]
        for g in self.gpu.iter_mut() {
            g.dirty = true;
        }
    }

    /// Layer `il`'s host K/V rows changed (written by the CPU path).
    #[inline]
    pub fn host_changed_layer(&mut self, _il: usize) {
        #[cfg(feature = "gpu")]
        if let Some(g) = self.gpu.iter_mut().find(|g| g.layers().contains(&_il)) {
            g.dirty = true;
        }
    }

    pub fn n_stream(&self) -> usize {
        self.streams.len()
    }

    #[inline]
    pub fn stream_of(&self, seq: usize) -> usize {
        if self.streams.len() == 1 {
            0
        } else {
            seq
        }
    }

    fn check_seq(&self, seq: i32, what: &str) -> Result<usize> {
        if seq < 0 || seq as usize >= self.n_seq_max {
            return Err(Error::Invalid(format!("{what}: seq_id {seq} is outside [0, {})", self.n_seq_max)));
        }
        Ok(seq as usize)
    }

    /// Byte range of the K row of (stream, cell) in layer `il`.
    #[inline]
    pub fn k_row(&self, il: usize, stream: usize, cell: usize) -> &[u8] {
        let rb = self.row_k[il];
        let o = (stream * self.size + cell) * rb;
        &self.k[il][o..o + rb]
    }
    #[inline]
    pub fn v_row(&self, il: usize, stream: usize, cell: usize) -> &[u8] {
        let rb = self.row_v[il];
        let o = (stream * self.size + cell) * rb;
        &self.v[il][o..o + rb]
    }

    // ---- slot search ----------------------------------------------------------------

    /// Find cells for `n` tokens in `stream` (llama_kv_cache::find_slot with cont=false)
    /// without changing anything; appends the cell indices to `out`.
    fn find_slot_in(&self, stream: usize, n: usize, out: &mut Vec<(u32, u32)>) -> bool {
        let st = &self.streams[stream];
        let size = st.cells.len();
        if n > size {
            return false;
        }
        let mut head = st.head;
        if head > st.used + 2 * n {
            head = 0;
        }
        let start = out.len();
        let mut tested = 0;
        while out.len() - start < n {
            if tested >= size {
                out.truncate(start);
                return false;
            }
            if head >= size {
                head = 0;
            }
            if st.cells[head].is_empty() {
                out.push((stream as u32, head as u32));
            }
            head += 1;
            tested += 1;
        }
        true
    }

    /// Find cells for one micro-batch: `seq0[k]` is token k's first sequence id (which
    /// picks its stream). On success `slot.cells[k]` is token k's cell.
    pub fn find_slot(&self, seq0: &[usize], slot: &mut Slot, scratch: &mut Vec<(u32, u32)>) -> bool {
        slot.cells.clear();
        slot.cells.resize(seq0.len(), (0, 0));
        if self.streams.len() == 1 {
            scratch.clear();
            if !self.find_slot_in(0, seq0.len(), scratch) {
                return false;
            }
            slot.cells.copy_from_slice(scratch);
            return true;
        }
        // One search per stream, for as many tokens as go there, in token order.
        let mut done = vec![false; self.streams.len()];
        for k in 0..seq0.len() {
            let s = self.stream_of(seq0[k]);
            if done[s] {
                continue;
            }
            done[s] = true;
            let n = seq0.iter().filter(|&&q| self.stream_of(q) == s).count();
            scratch.clear();
            if !self.find_slot_in(s, n, scratch) {
                return false;
            }
            let mut it = scratch.iter();
            for (j, &q) in seq0.iter().enumerate() {
                if self.stream_of(q) == s {
                    slot.cells[j] = *it.next().unwrap();
                }
            }
        }
        true
    }

    /// Occupy the cells of `slot` (llama_kv_cache::apply_ubatch): token k gets `pos[k]` and
    /// the sequences `seqs(k)`; each stream's head moves past its last cell.
    pub fn apply_slot(&mut self, slot: &Slot, pos: &[i32], seqs: &dyn Fn(usize) -> SeqSet) {
        for (k, &(s, c)) in slot.cells.iter().enumerate() {
            let st = &mut self.streams[s as usize];
            if st.cells[c as usize].is_empty() {
                st.used += 1;
            }
            st.cells[c as usize] = Cell { pos: pos[k], shift: 0, seq: seqs(k) };
        }
        for (k, &(s, c)) in slot.cells.iter().enumerate() {
            let last_in_stream = slot.cells[k + 1..].iter().all(|&(s2, _)| s2 != s);
            if last_in_stream {
                self.streams[s as usize].head = c as usize + 1;
            }
        }
    }

    /// Undo `apply_slot` on cells that were empty before it.
    pub fn unapply_slot(&mut self, slot: &Slot) {
        for &(s, c) in &slot.cells {
            self.streams[s as usize].rm(c as usize);
        }
    }

    pub fn heads(&self) -> Vec<usize> {
        self.streams.iter().map(|s| s.head).collect()
    }
    pub fn set_heads(&mut self, heads: &[usize]) {
        for (s, &h) in self.streams.iter_mut().zip(heads) {
            s.head = h;
        }
    }

    // ---- llama.h memory API ------------------------------------------------------------

    pub fn clear(&mut self, data: bool) {
        for s in &mut self.streams {
            s.clear();
        }
        if data {
            for b in self.k.iter_mut().chain(self.v.iter_mut()) {
                b.fill(0);
            }
            self.host_changed();
        }
        self.has_shift = false;
    }

    fn range(p0: i32, p1: i32) -> (i32, i32) {
        (p0.max(0), if p1 < 0 { i32::MAX } else { p1 })
    }

    /// Remove [p0, p1) of `seq` (any sequence when seq < 0).
    pub fn seq_rm(&mut self, seq: i32, p0: i32, p1: i32) -> Result<bool> {
        let (p0, p1) = Self::range(p0, p1);
        if seq >= 0 {
            let s = self.check_seq(seq, "seq_rm")?;
            let si = self.stream_of(s);
            let st = &mut self.streams[si];
            let mut new_head = usize::MAX;
            for i in 0..st.cells.len() {
                if !st.pos_in(i, p0, p1) || !st.cells[i].seq.has(s) {
                    continue;
                }
                if st.seq_rm_cell(i, s) && new_head == usize::MAX {
                    new_head = i;
                }
            }
            if new_head < st.head {
                st.head = new_head;
            }
        } else {
            for st in &mut self.streams {
                let mut new_head = usize::MAX;
                for i in 0..st.cells.len() {
                    if !st.pos_in(i, p0, p1) {
                        continue;
                    }
                    st.rm(i);
                    if new_head == usize::MAX {
                        new_head = i;
                    }
                }
                if new_head < st.head {
                    st.head = new_head;
                }
            }
        }
        Ok(true)
    }

    /// Make `dst` see the cells of `src` in [p0, p1). Across streams (not unified) the
    /// whole stream is copied, K/V data included, as llama.cpp does.
    pub fn seq_cp(&mut self, src: i32, dst: i32, p0: i32, p1: i32) -> Result<()> {
        let s = self.check_seq(src, "seq_cp")?;
        let d = self.check_seq(dst, "seq_cp")?;
        let (s0, s1) = (self.stream_of(s), self.stream_of(d));
        if s0 == s1 {
            if s == d {
                return Ok(());
            }
            let (p0, p1) = Self::range(p0, p1);
            let st = &mut self.streams[s0];
            for c in st.cells.iter_mut() {
                if c.pos >= p0 && c.pos < p1 && c.seq.has(s) {
                    c.seq.add(d);
                }
            }
            return Ok(());
        }
        let size = self.size;
        let mut dst_st = Stream::new(size)?;
        for (i, c) in self.streams[s0].cells.iter().enumerate() {
            if c.seq.has(s) {
                dst_st.cells[i] = Cell { pos: c.pos, shift: c.shift, seq: SeqSet::only(d) };
                dst_st.used += 1;
            }
        }
        dst_st.head = self.streams[s0].head;
        self.streams[s1] = dst_st;
        for (il, buf) in self.k.iter_mut().enumerate() {
            let n = self.row_k[il] * size;
            buf.copy_within(s0 * n..(s0 + 1) * n, s1 * n);
        }
        for (il, buf) in self.v.iter_mut().enumerate() {
            let n = self.row_v[il] * size;
            buf.copy_within(s0 * n..(s0 + 1) * n, s1 * n);
        }
        self.host_changed();
        Ok(())
    }

    /// Drop every sequence but `seq` (cells of other sequences only become empty).
    pub fn seq_keep(&mut self, seq: i32) -> Result<()> {
        let s = self.check_seq(seq, "seq_keep")?;
        let si = self.stream_of(s);
        let st = &mut self.streams[si];
        let mut new_head = usize::MAX;
        for i in 0..st.cells.len() {
            let c = &mut st.cells[i];
            if c.seq.has(s) {
                c.seq = SeqSet::only(s);
            } else if !c.is_empty() {
                st.rm(i);
                if new_head == usize::MAX {
                    new_head = i;
                }
            }
        }
        if new_head < st.head {
            st.head = new_head;
        }
        Ok(())
    }

    /// Add `delta` to the positions of `seq` in [p0, p1); cells pushed below 0 are freed.
    pub fn seq_add(&mut self, seq: i32, p0: i32, p1: i32, delta: i32) -> Result<()> {
        let s = self.check_seq(seq, "seq_add")?;
        if delta == 0 {
            return Ok(());
        }
        let (p0, p1) = Self::range(p0, p1);
        if p0 == p1 {
            return Ok(());
        }
        let si = self.stream_of(s);
        let st = &mut self.streams[si];
        let mut new_head = usize::MAX;
        for i in 0..st.cells.len() {
            if !st.pos_in(i, p0, p1) || !st.cells[i].seq.has(s) {
                continue;
            }
            let c = &mut st.cells[i];
            c.pos = c.pos.saturating_add(delta);
            c.shift = c.shift.saturating_add(delta);
            self.has_shift = true;
            if c.pos < 0 {
                // the cell was occupied (pos >= 0 before the shift): free it and count it
                st.cells[i] = Cell::EMPTY;
                st.used -= 1;
                if new_head == usize::MAX {
                    new_head = i;
                }
            }
        }
        st.head = if new_head != usize::MAX { new_head } else { 0 };
        Ok(())
    }

    /// Divide the positions of `seq` in [p0, p1) by `d` (integer division).
    pub fn seq_div(&mut self, seq: i32, p0: i32, p1: i32, d: i32) -> Result<()> {
        let s = self.check_seq(seq, "seq_div")?;
        if d == 1 {
            return Ok(());
        }
        if d <= 0 {
            return Err(Error::Invalid(format!("seq_div: divisor {d} must be positive")));
        }
        let (p0, p1) = Self::range(p0, p1);
        if p0 == p1 {
            return Ok(());
        }
        let si = self.stream_of(s);
        let st = &mut self.streams[si];
        for i in 0..st.cells.len() {
            if !st.pos_in(i, p0, p1) || !st.cells[i].seq.has(s) {
                continue;
            }
            let c = &mut st.cells[i];
            let old = c.pos;
            c.pos /= d;
            // llama.cpp's llama_kv_cells::pos_div accumulates old - new (the opposite sign
            // of pos_add's delta), so the K-shift rotates the keys by that; kept as is, so
            // that what a decode computes after seq_div equals llama.cpp's
            c.shift = c.shift.saturating_add(old - c.pos);
            self.has_shift = true;
        }
        Ok(())
    }

    pub fn seq_pos_min(&self, seq: i32) -> Result<i32> {
        let s = self.check_seq(seq, "seq_pos_min")?;
        let st = &self.streams[self.stream_of(s)];
        Ok(st.cells.iter().filter(|c| c.seq.has(s)).map(|c| c.pos).min().unwrap_or(-1))
    }

    pub fn seq_pos_max(&self, seq: i32) -> Result<i32> {
        let s = self.check_seq(seq, "seq_pos_max")?;
        let st = &self.streams[self.stream_of(s)];
        Ok(st.cells.iter().filter(|c| c.seq.has(s)).map(|c| c.pos).max().unwrap_or(-1))
    }

    /// The cells sequence `seq` sees, sorted by position (then cell): the fixed key order
    /// that makes attention independent of where tokens landed in the cache.
    pub fn keys_of(&self, seq: usize, out: &mut Vec<(i32, u32)>) {
        out.clear();
        let st = &self.streams[self.stream_of(seq)];
        for (i, c) in st.cells.iter().enumerate() {
            if c.seq.has(seq) {
                out.push((c.pos, i as u32));
            }
        }
        out.sort_unstable();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layer_bufs_are_zeroed_disjoint_line_aligned_slices() {
        let lens = [100usize, 0, 4096, 1];
        let mut b = LayerBufs::new(&lens, "test").unwrap();
        assert_eq!(b.len(), 4);
        for (il, &n) in lens.iter().enumerate() {
            assert_eq!(b[il].len(), n);
            assert!(b[il].iter().all(|&x| x == 0));
            if n > 0 {
                assert_eq!(b[il].as_ptr() as usize % 64, 0, "layer {il}");
            }
        }
        for (il, buf) in b.iter_mut().enumerate() {
            assert_eq!(buf.len(), lens[il]);
            buf.fill(il as u8 + 1);
        }
        // each layer kept its own bytes (no overlap)
        for (il, buf) in b.iter().enumerate() {
            assert!(buf.iter().all(|&x| x == il as u8 + 1), "layer {il}");
        }
        b[2][7] = 9;
        assert_eq!(b[2][7], 9);
        assert_eq!(b[3], [4u8]);
        let c = LayerBufs::new(&lens, "test").unwrap();
        assert_ne!(b, c);
        let empty = LayerBufs::new(&[0, 0], "test").unwrap();
        assert_eq!((empty.len(), empty[1].len()), (2, 0));
        let mut empty = empty;
        assert_eq!(empty.iter_mut().count(), 2);
    }

    fn cache(size: usize, n_stream: usize) -> KvCache {
        KvCache::new(&[32], &[32], size, n_stream, 4, GgmlType::F16, GgmlType::F16).unwrap()
    }

    fn put(kv: &mut KvCache, seq: usize, pos: &[i32]) -> bool {
        let seq0 = vec![seq; pos.len()];
        let mut slot = Slot::default();
        let mut scratch = Vec::new();
        if !kv.find_slot(&seq0, &mut slot, &mut scratch) {
            return false;
        }
        kv.apply_slot(&slot, pos, &|_| SeqSet::only(seq));
        true
    }

    #[test]
    fn fill_remove_and_refill() {
        let mut kv = cache(8, 1);
        assert!(put(&mut kv, 0, &[0, 1, 2, 3, 4]));
        assert!(!put(&mut kv, 1, &[0, 1, 2, 3]));
        assert!(put(&mut kv, 1, &[0, 1, 2]));
        assert_eq!(kv.seq_pos_max(0).unwrap(), 4);
        assert_eq!(kv.seq_pos_min(1).unwrap(), 0);
        kv.seq_rm(0, 2, -1).unwrap();
        assert_eq!(kv.seq_pos_max(0).unwrap(), 1);
        assert!(put(&mut kv, 0, &[2, 3, 4]));
        kv.seq_keep(1).unwrap();
        assert_eq!(kv.seq_pos_max(0).unwrap(), -1);
        assert_eq!(kv.streams[0].used, 3);
    }

    #[test]
    fn cp_add_div() {
        let mut kv = cache(16, 1);
        assert!(put(&mut kv, 0, &[0, 1, 2, 3, 4, 5]));
        kv.seq_cp(0, 2, 2, 4).unwrap();
        assert_eq!((kv.seq_pos_min(2).unwrap(), kv.seq_pos_max(2).unwrap()), (2, 3));
        kv.seq_add(0, 4, -1, -3).unwrap();
        assert!(kv.has_shift);
        // positions 4,5 -> 1,2 ; the others stay
        let mut keys = Vec::new();
        kv.keys_of(0, &mut keys);
        let ps: Vec<i32> = keys.iter().map(|k| k.0).collect();
        assert_eq!(ps, vec![0, 1, 1, 2, 2, 3]);
        kv.seq_div(2, -1, -1, 2).unwrap();
        assert_eq!(kv.seq_pos_max(2).unwrap(), 1);
        kv.seq_add(0, -1, -1, -10).unwrap();
        assert_eq!(kv.seq_pos_max(0).unwrap(), -1);
        // seq 2 shared its cells with seq 0: a position belongs to the cell, so moving it
        // below 0 frees the cell for every sequence in it (llama-kv-cells.h pos_add)
        assert_eq!(kv.seq_pos_max(2).unwrap(), -1);
        assert_eq!(kv.streams[0].used, 0);
    }

    #[test]
    fn rotation_follows_llamacpp() {
        use GgmlType::*;
        // K: the largest power of two >= 64 dividing the head size; V: 64; none for float types
        assert_eq!(rotation_sizes(Q4_0, Q4_0, 64, 64), (64, 64));
        assert_eq!(rotation_sizes(Q8_0, F16, 256, 256), (256, 0));
        assert_eq!(rotation_sizes(IQ4_NL, Q5_1, 192, 192), (64, 64));
        assert_eq!(rotation_sizes(F16, BF16, 128, 128), (0, 0));
        assert_eq!(rotation_sizes(Q4_1, Q4_1, 96, 96), (0, 0)); // 96 % 64 != 0
    }

    #[test]
    fn fwht_is_the_orthonormal_hadamard_matrix() {
        let n = 64;
        let x: Vec<f32> = (0..2 * n).map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0).collect();
        let mut y = x.clone();
        fwht(&mut y, n);
        // H[i][j] = (-1)^popcount(i & j) / sqrt(n), chunk by chunk
        for c in 0..2 {
            for i in 0..n {
                let want: f64 = (0..n)
                    .map(|j| if (i & j).count_ones() % 2 == 0 { 1.0 } else { -1.0 } * x[c * n + j] as f64)
                    .sum::<f64>()
                    / (n as f64).sqrt();
                assert!((y[c * n + i] as f64 - want).abs() < 1e-4, "{i}");
            }
        }
        // its own inverse
        fwht(&mut y, n);
        for (a, b) in x.iter().zip(&y) {
            assert!((a - b).abs() < 1e-4);
        }
        // size 0: no rotation
        let mut z = x.clone();
        fwht(&mut z, 0);
        assert_eq!(z, x);
    }

    #[test]
    fn every_llamacpp_type_parses() {
        for name in ["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"] {
            assert_eq!(parse_cache_type(name).unwrap().name().to_lowercase(), name);
        }
        let e = parse_cache_type("q4_k").unwrap_err().to_string();
        assert!(e.contains("q4_k") && e.contains("iq4_nl"), "{e}");
    }

    #[test]
    fn streams_are_separate() {
        let mut kv = cache(4, 4);
        assert!(put(&mut kv, 0, &[0, 1, 2, 3]));
        assert!(!put(&mut kv, 0, &[4]));
        assert!(put(&mut kv, 1, &[0, 1, 2, 3]));
        kv.seq_cp(0, 3, -1, -1).unwrap();
        assert_eq!(kv.seq_pos_max(3).unwrap(), 3);
        assert!(kv.seq_cp(0, 9, -1, -1).is_err());
    }
}
