//! Saved context / sequence state (llama.h's `llama_state_*`): the KV cache (all of it or
//! one sequence), the last decode's outputs and, for session files, the tokens behind
//! them, in one versioned, fingerprinted, checksummed blob.
//!
//! Layout (all integers little-endian):
//!
//! ```text
//! header   magic "PYLLSTAT" [8], version u32, kind u32 (0 context, 1 sequence), flags u32,
//!          total_len u64 (the whole blob, checksum included)
//! fprint   arch (u32 len + bytes), n_embd u32, n_layer u32, n_vocab u32, vocab_hash u64,
//!          type_k u32, type_v u32, per layer n_embd_k_gqa u32 and n_embd_v_gqa u32
//! tokens   n_tokens u32, i32 [n_tokens]               (session files; 0 otherwise)
//! cells    n_stream u32 (1 for a sequence); per stream n_cells u32, then per cell
//!          pos i32, shift i32 and, for a context, its sequence set [u64; 4]
//! kv       per layer: the K rows of every cell (streams in order) [n_cells, row_k],
//!          then the V rows [n_cells, row_v]
//! rs       recurrent and hybrid models only (recurrent.rs): n_embd_r u32, n_embd_s u32,
//!          n_cells u32, per cell pos i32 and, for a context, its sequence set [u64; 4];
//!          then per recurrent layer the conv states f32 [n_cells, n_embd_r] and the
//!          scan states f32 [n_cells, n_embd_s]
//! outputs  n_outputs u32, batch index of each output row i32 [n_outputs],
//!          logits rows u32 (0 or n_outputs) + f32 [rows, n_vocab],
//!          embd rows u32 (0 or n_outputs) + f32 [rows, n_embd]     (a sequence: n_outputs 0)
//! checksum xxh64 of every byte before it, u64
//! ```
//!
//! Reading checks everything (length, checksum, fingerprint, every count against what the
//! context holds) before anything in the context changes: a refused blob leaves it as it was.

use crate::kv_cache::{Cell, KvCache, SeqSet, Stream};
use crate::recurrent::{RsCache, RsSeq};
use std::fmt;

pub const MAGIC: &[u8; 8] = b"PYLLSTAT";
pub const VERSION: u32 = 1;
const KIND_CONTEXT: u32 = 0;
const KIND_SEQ: u32 = 1;

/// A state that does not fit this context, or is truncated or corrupted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateError(pub String);

impl fmt::Display for StateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}
impl std::error::Error for StateError {}

pub type SResult<T> = std::result::Result<T, StateError>;

fn err<T>(m: impl Into<String>) -> SResult<T> {
    Err(StateError(m.into()))
}

// ---- xxh64 ------------------------------------------------------------------------------

const P1: u64 = 0x9E37_79B1_85EB_CA87;
const P2: u64 = 0xC2B2_AE3D_27D4_EB4F;
const P3: u64 = 0x1656_67B1_9E37_79F9;
const P4: u64 = 0x85EB_CA77_C2B2_AE63;
const P5: u64 = 0x27D4_EB2F_1656_67C5;

#[inline]
fn xround(acc: u64, x: u64) -> u64 {
    acc.wrapping_add(x.wrapping_mul(P2)).rotate_left(31).wrapping_mul(P1)
}
#[inline]
fn xmerge(h: u64, v: u64) -> u64 {
    (h ^ xround(0, v)).wrapping_mul(P1).wrapping_add(P4)
}
#[inline]
fn rd64(d: &[u8], p: usize) -> u64 {
    u64::from_le_bytes(d[p..p + 8].try_into().unwrap())
}

/// XXH64 (Yann Collet's xxHash, 64-bit): ~10 GB/s on one core, so checking a state costs
/// far less than copying it.
pub fn xxh64(d: &[u8], seed: u64) -> u64 {
    let n = d.len();
    let mut p = 0;
    let mut h = if n >= 32 {
        let (mut v1, mut v2, mut v3, mut v4) =
            (seed.wrapping_add(P1).wrapping_add(P2), seed.wrapping_add(P2), seed, seed.wrapping_sub(P1));
        while p + 32 <= n {
            v1 = xround(v1, rd64(d, p));
            v2 = xround(v2, rd64(d, p + 8));
            v3 = xround(v3, rd64(d, p + 16));
            v4 = xround(v4, rd64(d, p + 24));
            p += 32;
        }
        let mut h = v1
            .rotate_left(1)
            .wrapping_add(v2.rotate_left(7))
            .wrapping_add(v3.rotate_left(12))
            .wrapping_add(v4.rotate_left(18));
        for v in [v1, v2, v3, v4] {
            h = xmerge(h, v);
        }
        h
    } else {
        seed.wrapping_add(P5)
    };
    h = h.wrapping_add(n as u64);
    while p + 8 <= n {
        h ^= xround(0, rd64(d, p));
        h = h.rotate_left(27).wrapping_mul(P1).wrapping_add(P4);
        p += 8;
    }
    if p + 4 <= n {
        h ^= (u32::from_le_bytes(d[p..p + 4].try_into().unwrap()) as u64).wrapping_mul(P1);
        h = h.rotate_left(23).wrapping_mul(P2).wrapping_add(P3);
        p += 4;
    }
    while p < n {
        h ^= (d[p] as u64).wrapping_mul(P5);
        h = h.rotate_left(11).wrapping_mul(P1);
        p += 1;
    }
    h ^= h >> 33;
    h = h.wrapping_mul(P2);
    h ^= h >> 29;
    h = h.wrapping_mul(P3);
    h ^ (h >> 32)
}

// ---- what a state fits -----------------------------------------------------------------

/// The model and cache layout a state belongs to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fingerprint {
    pub arch: String,
    pub n_embd: u32,
    pub n_layer: u32,
    pub n_vocab: u32,
    /// xxh64 of the vocabulary's token strings (0 when the file has none).
    pub vocab_hash: u64,
    pub type_k: u32,
    pub type_v: u32,
    pub n_embd_k_gqa: Vec<u32>,
    pub n_embd_v_gqa: Vec<u32>,
}

fn type_name(t: u32) -> String {
    crate::GgmlType::from_u32(t).map_or_else(|| format!("type {t}"), |t| t.name().to_string())
}

impl Fingerprint {
    /// Why a state with fingerprint `self` does not fit a context with `ctx`, or None.
    fn mismatch(&self, ctx: &Fingerprint) -> Option<String> {
        let m = |what: &str, a: String, b: String| Some(format!("the state is for {what} {a}, this context has {b}"));
        if self.arch != ctx.arch {
            return m("architecture", format!("'{}'", self.arch), format!("'{}'", ctx.arch));
        }
        if self.n_layer != ctx.n_layer {
            return m("n_layer =", self.n_layer.to_string(), ctx.n_layer.to_string());
        }
        if self.n_embd != ctx.n_embd {
            return m("n_embd =", self.n_embd.to_string(), ctx.n_embd.to_string());
        }
        if self.n_vocab != ctx.n_vocab {
            return m("n_vocab =", self.n_vocab.to_string(), ctx.n_vocab.to_string());
        }
        for il in 0..self.n_embd_k_gqa.len() {
            if self.n_embd_k_gqa[il] != ctx.n_embd_k_gqa[il] || self.n_embd_v_gqa[il] != ctx.n_embd_v_gqa[il] {
                return m(
                    &format!("layer {il} n_embd_k_gqa/n_embd_v_gqa ="),
                    format!("{}/{}", self.n_embd_k_gqa[il], self.n_embd_v_gqa[il]),
                    format!("{}/{}", ctx.n_embd_k_gqa[il], ctx.n_embd_v_gqa[il]),
                );
            }
        }
        if self.vocab_hash != ctx.vocab_hash {
            return Some("the state is for a model with another vocabulary (the token strings differ)".into());
        }
        if self.type_k != ctx.type_k {
            return m("type_k =", type_name(self.type_k), type_name(ctx.type_k));
        }
        if self.type_v != ctx.type_v {
            return m("type_v =", type_name(self.type_v), type_name(ctx.type_v));
        }
        None
    }
}

// ---- writing ----------------------------------------------------------------------------

/// What the context's Python half holds about the last decode (llama.cpp writes the same:
/// output ids, logits, embeddings).
#[derive(Default)]
pub struct Outputs<'a> {
    /// Batch index of each output row [n_outputs].
    pub rows: &'a [i32],
    /// [n_outputs, n_vocab] or empty.
    pub logits: &'a [f32],
    /// [n_outputs, n_embd] or empty.
    pub embd: &'a [f32],
}

/// Counts when `buf` is None, writes otherwise (the same code sizes and writes, so the two
/// never disagree).
struct W<'a> {
    buf: Option<&'a mut [u8]>,
    p: usize,
}

impl W<'_> {
    #[inline]
    fn put(&mut self, b: &[u8]) {
        if let Some(buf) = self.buf.as_deref_mut() {
            buf[self.p..self.p + b.len()].copy_from_slice(b);
        }
        self.p += b.len();
    }
    fn u32(&mut self, v: u32) {
        self.put(&v.to_le_bytes())
    }
    fn i32(&mut self, v: i32) {
        self.put(&v.to_le_bytes())
    }
    fn u64(&mut self, v: u64) {
        self.put(&v.to_le_bytes())
    }
    fn f32s(&mut self, v: &[f32]) {
        if let Some(buf) = self.buf.as_deref_mut() {
            for (d, x) in buf[self.p..self.p + 4 * v.len()].chunks_exact_mut(4).zip(v) {
                d.copy_from_slice(&x.to_le_bytes());
            }
        }
        self.p += 4 * v.len();
    }
    fn i32s(&mut self, v: &[i32]) {
        for &x in v {
            self.i32(x)
        }
    }
}

/// The cells a state holds: (stream, cell index) in cache order.
fn cells_of(kv: &KvCache, seq: Option<usize>) -> Vec<Vec<usize>> {
    match seq {
        None => kv
            .streams
            .iter()
            .map(|st| (0..st.cells.len()).filter(|&i| !st.cells[i].is_empty()).collect())
            .collect(),
        Some(s) => {
            let st = &kv.streams[kv.stream_of(s)];
            vec![(0..st.cells.len()).filter(|&i| st.cells[i].seq.has(s)).collect()]
        }
    }
}

/// Copy the rows of `cells` (one stream) out of a layer buffer, one copy per run of
/// consecutive cells.
fn put_rows(w: &mut W, buf: &[u8], base: usize, rb: usize, cells: &[usize]) {
    let mut i = 0;
    while i < cells.len() {
        let mut j = i + 1;
        while j < cells.len() && cells[j] == cells[j - 1] + 1 {
            j += 1;
        }
        let o = (base + cells[i]) * rb;
        w.put(&buf[o..o + (j - i) * rb]);
        i = j;
    }
}

fn write_all(w: &mut W, fp: &Fingerprint, kv: &KvCache, a: &SaveArgs) {
    let (seq, flags, out, tokens, n_vocab, n_embd) = (a.seq, a.flags, &a.outputs, a.tokens, a.n_vocab, a.n_embd);
    let cells = cells_of(kv, seq);
    w.put(MAGIC);
    w.u32(VERSION);
    w.u32(if seq.is_some() { KIND_SEQ } else { KIND_CONTEXT });
    w.u32(flags);
    let total_at = w.p;
    w.u64(0); // total_len, patched below
    w.u32(fp.arch.len() as u32);
    w.put(fp.arch.as_bytes());
    for v in [fp.n_embd, fp.n_layer, fp.n_vocab] {
        w.u32(v);
    }
    w.u64(fp.vocab_hash);
    w.u32(fp.type_k);
    w.u32(fp.type_v);
    for il in 0..fp.n_embd_k_gqa.len() {
        w.u32(fp.n_embd_k_gqa[il]);
        w.u32(fp.n_embd_v_gqa[il]);
    }
    w.u32(tokens.len() as u32);
    w.i32s(tokens);
    w.u32(cells.len() as u32);
    let stream_ids: Vec<usize> = match seq {
        None => (0..kv.n_stream()).collect(),
        Some(s) => vec![kv.stream_of(s)],
    };
    for (cs, &si) in cells.iter().zip(&stream_ids) {
        w.u32(cs.len() as u32);
        let st = &kv.streams[si];
        for &c in cs {
            let cell = &st.cells[c];
            w.i32(cell.pos);
            w.i32(cell.shift);
            if seq.is_none() {
                for word in cell.seq.words() {
                    w.u64(word);
                }
            }
        }
    }
    for il in 0..kv.k.len() {
        for (buf, rb) in [(&kv.k[il], kv.row_k[il]), (&kv.v[il], kv.row_v[il])] {
            for (cs, &si) in cells.iter().zip(&stream_ids) {
                put_rows(w, buf, si * kv.size, rb, cs);
            }
        }
    }
    if let Some(rs) = a.rs {
        write_rs(w, rs, seq);
    }
    let n_out = if seq.is_some() { 0 } else { out.rows.len() };
    w.u32(n_out as u32);
    if n_out > 0 {
        w.i32s(out.rows);
        let lr = out.logits.len().checked_div(n_vocab).unwrap_or(0);
        w.u32(lr as u32);
        w.f32s(&out.logits[..lr * n_vocab]);
        let er = out.embd.len().checked_div(n_embd).unwrap_or(0);
        w.u32(er as u32);
        w.f32s(&out.embd[..er * n_embd]);
    }
    let total = w.p + 8;
    if let Some(buf) = w.buf.as_deref_mut() {
        buf[total_at..total_at + 8].copy_from_slice(&(total as u64).to_le_bytes());
        let h = xxh64(&buf[..total - 8], 0);
        buf[total - 8..total].copy_from_slice(&h.to_le_bytes());
    }
    w.p = total;
}

/// The recurrent section: the cells holding `seq` (all non-empty cells for None), each
/// state taken from the cell its data lives in (`src`, as llama.cpp writes it).
fn write_rs(w: &mut W, rs: &RsCache, seq: Option<usize>) {
    let cells: Vec<usize> = (0..rs.size)
        .filter(|&i| match seq {
            None => !rs.cells[i].is_empty(),
            Some(s) => rs.cells[i].seq.has(s),
        })
        .collect();
    w.u32(rs.n_embd_r as u32);
    w.u32(rs.n_embd_s as u32);
    w.u32(cells.len() as u32);
    for &i in &cells {
        w.i32(rs.cells[i].pos);
        if seq.is_none() {
            for word in rs.cells[i].seq.words() {
                w.u64(word);
            }
        }
    }
    let data = |i: usize| {
        let c = &rs.cells[i];
        // check_save refused a cell without one plane
        rs_plane(rs, c, seq).unwrap_or(0) * rs.size + if c.src >= 0 { c.src as usize } else { i }
    };
    for il in 0..rs.r.len() {
        for (buf, width) in [(&rs.r[il], rs.n_embd_r), (&rs.s[il], rs.n_embd_s)] {
            if buf.is_empty() {
                continue;
            }
            for &i in &cells {
                w.f32s(&buf[data(i) * width..(data(i) + 1) * width]);
            }
        }
    }
}

/// What `save` needs besides the cache.
pub struct SaveArgs<'a> {
    /// The recurrent states (recurrent and hybrid models).
    pub rs: Option<&'a RsCache>,
    pub seq: Option<usize>,
    pub flags: u32,
    pub outputs: Outputs<'a>,
    pub tokens: &'a [i32],
    pub n_vocab: usize,
    pub n_embd: usize,
}

fn check_save(kv: &KvCache, a: &SaveArgs) -> SResult<()> {
    if let Some(s) = a.seq {
        if s >= kv.n_seq_max {
            return err(format!("seq_id {s} is outside [0, {})", kv.n_seq_max));
        }
    }
    let n = a.outputs.rows.len();
    for (what, v, w) in [("logits", a.outputs.logits, a.n_vocab), ("embeddings", a.outputs.embd, a.n_embd)] {
        if !v.is_empty() && v.len() != n * w {
            return err(format!("{what} must be [{n}, {w}] (got {} values)", v.len()));
        }
    }
    if a.tokens.len() > u32::MAX as usize {
        return err("too many tokens for a state");
    }
    if let (Some(rs), None) = (a.rs, a.seq) {
        for (i, c) in rs.cells.iter().enumerate() {
            if rs_plane(rs, c, None).is_none() {
                return err(format!(
                    "recurrent cell {i} is shared by sequences with different pending rollbacks (seq_rm of their \
                     last positions): its state cannot be written (llama.cpp aborts)"
                ));
            }
        }
    }
    Ok(())
}

/// The snapshot plane holding the current state of a cell (llama.cpp's state_write: plane k
/// while a rollback of k positions is pending): that of `seq`, or the one all of the cell's
/// sequences agree on (None where they differ).
fn rs_plane(rs: &RsCache, c: &crate::recurrent::RsCell, seq: Option<usize>) -> Option<usize> {
    if rs.n_rs_seq == 0 {
        return Some(0);
    }
    if let Some(s) = seq {
        return Some(rs.rs_idx[s] as usize);
    }
    let mut planes = (0..rs.n_seq_max.min(crate::kv_cache::MAX_SEQ)).filter(|&q| c.seq.has(q)).map(|q| rs.rs_idx[q]);
    let first = planes.next().unwrap_or(0);
    planes.all(|p| p == first).then_some(first as usize)
}

/// Bytes `save` will write.
pub fn size(fp: &Fingerprint, kv: &KvCache, a: &SaveArgs) -> SResult<usize> {
    check_save(kv, a)?;
    let mut w = W { buf: None, p: 0 };
    write_all(&mut w, fp, kv, a);
    Ok(w.p)
}

/// Write the state into `dst` (at least `size` bytes); returns the bytes written.
pub fn save(fp: &Fingerprint, kv: &KvCache, a: &SaveArgs, dst: &mut [u8]) -> SResult<usize> {
    let n = size(fp, kv, a)?;
    if dst.len() < n {
        return err(format!("the destination holds {} bytes, the state needs {n}", dst.len()));
    }
    let mut w = W { buf: Some(&mut dst[..n]), p: 0 };
    write_all(&mut w, fp, kv, a);
    Ok(n)
}

// ---- reading ----------------------------------------------------------------------------

struct R<'a> {
    d: &'a [u8],
    p: usize,
}

impl<'a> R<'a> {
    fn take(&mut self, n: usize, what: &str) -> SResult<&'a [u8]> {
        match self.p.checked_add(n) {
            Some(e) if e <= self.d.len() => {
                let s = &self.d[self.p..e];
                self.p = e;
                Ok(s)
            }
            _ => err(format!("the state ends inside {what} (at byte {} of {})", self.p, self.d.len())),
        }
    }
    fn u32(&mut self, what: &str) -> SResult<u32> {
        Ok(u32::from_le_bytes(self.take(4, what)?.try_into().unwrap()))
    }
    fn u64(&mut self, what: &str) -> SResult<u64> {
        Ok(u64::from_le_bytes(self.take(8, what)?.try_into().unwrap()))
    }
    /// `n` elements of `elem` bytes, the count checked against what is left first.
    fn arr(&mut self, n: usize, elem: usize, what: &str) -> SResult<&'a [u8]> {
        let bytes = n.checked_mul(elem).ok_or_else(|| StateError(format!("{what}: {n} elements overflow")))?;
        self.take(bytes, what)
    }
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
}

/// A parsed, validated state, not yet applied.
#[derive(Debug)]
pub struct Parsed<'a> {
    pub kind_seq: bool,
    pub flags: u32,
    /// Bytes the state occupies.
    pub n_read: usize,
    pub tokens: Vec<i32>,
    /// Per stream: (pos, shift, seqs) of each cell, in cache order.
    cells: Vec<Vec<(i32, i32, SeqSet)>>,
    /// Per layer: K rows [n_cells_total, row_k] and V rows.
    k: Vec<&'a [u8]>,
    v: Vec<&'a [u8]>,
    pub out_rows: Vec<i32>,
    pub logits: Vec<f32>,
    pub embd: Vec<f32>,
    /// The recurrent section: (pos, seqs) per cell, then per recurrent layer its conv and
    /// scan state rows.
    rs_cells: Vec<(i32, SeqSet)>,
    rs_r: Vec<Vec<f32>>,
    rs_s: Vec<Vec<f32>>,
}

/// What the caller of `parse` allows.
pub struct Limits {
    /// Output rows must name batch indices below this (the context's n_batch).
    pub n_batch: usize,
    /// Session files: more tokens than this is refused (llama.h's n_token_capacity).
    pub max_tokens: Option<usize>,
    pub n_vocab: usize,
    pub n_embd: usize,
}

/// Check `data` completely against the cache: header, length, checksum, fingerprint,
/// counts. `dest` None expects a context state, Some(seq) a sequence state for `seq`.
pub fn parse<'a>(
    fp: &Fingerprint,
    kv: &KvCache,
    rs: Option<&RsCache>,
    data: &'a [u8],
    dest: Option<usize>,
    lim: &Limits,
) -> SResult<Parsed<'a>> {
    let mut r = R { d: data, p: 0 };
    let magic = r.take(8, "the header").map_err(|_| StateError(format!("not a pyllama state: {} bytes", data.len())))?;
    if magic != MAGIC {
        return err("not a pyllama state (bad magic)");
    }
    let version = r.u32("the header")?;
    if version != VERSION {
        return err(format!("state version {version}, this pyllama reads version {VERSION}"));
    }
    let kind = r.u32("the header")?;
    let flags = r.u32("the header")?;
    let total = r.u64("the header")?;
    if total < r.p as u64 + 8 {
        return err(format!("corrupted state: total length {total} is too small"));
    }
    if (data.len() as u64) < total {
        return err(format!("truncated state: {} bytes of {total}", data.len()));
    }
    let total = total as usize;
    let sum = u64::from_le_bytes(data[total - 8..total].try_into().unwrap());
    if xxh64(&data[..total - 8], 0) != sum {
        return err("corrupted state: the checksum does not match");
    }
    let body = &data[..total - 8];
    let mut r = R { d: body, p: r.p };
    match (kind, dest) {
        (KIND_CONTEXT, None) | (KIND_SEQ, Some(_)) => {}
        (KIND_SEQ, None) => return err("this is the state of one sequence, not of a whole context"),
        (KIND_CONTEXT, Some(_)) => return err("this is the state of a whole context, not of one sequence"),
        _ => return err(format!("unknown state kind {kind}")),
    }
    // fingerprint
    let n_arch = r.u32("the fingerprint")? as usize;
    let arch = r.arr(n_arch, 1, "the fingerprint")?;
    let arch = String::from_utf8_lossy(arch).into_owned();
    let n_embd = r.u32("the fingerprint")?;
    let n_layer = r.u32("the fingerprint")?;
    let n_vocab = r.u32("the fingerprint")?;
    let vocab_hash = r.u64("the fingerprint")?;
    let type_k = r.u32("the fingerprint")?;
    let type_v = r.u32("the fingerprint")?;
    let mut got = Fingerprint {
        arch,
        n_embd,
        n_layer,
        n_vocab,
        vocab_hash,
        type_k,
        type_v,
        n_embd_k_gqa: Vec::new(),
        n_embd_v_gqa: Vec::new(),
    };
    if n_layer != fp.n_layer {
        // compare before reading per-layer sizes: their count comes from n_layer
        got.n_embd_k_gqa = fp.n_embd_k_gqa.clone();
        got.n_embd_v_gqa = fp.n_embd_v_gqa.clone();
    } else {
        for _ in 0..n_layer {
            got.n_embd_k_gqa.push(r.u32("the fingerprint")?);
            got.n_embd_v_gqa.push(r.u32("the fingerprint")?);
        }
    }
    if let Some(m) = got.mismatch(fp) {
        return err(m);
    }
    // tokens
    let n_tok = r.u32("the tokens")? as usize;
    if let Some(cap) = lim.max_tokens {
        if n_tok > cap {
            return err(format!("the state holds {n_tok} tokens, more than the capacity of {cap}"));
        }
    }
    let tokens: Vec<i32> =
        r.arr(n_tok, 4, "the tokens")?.chunks_exact(4).map(|c| i32::from_le_bytes(c.try_into().unwrap())).collect();
    if let Some((i, t)) = tokens.iter().enumerate().find(|(_, &t)| t < 0 || t as u32 >= fp.n_vocab) {
        return err(format!("token {i} of the state is {t}, outside [0, n_vocab = {})", fp.n_vocab));
    }
    // cells
    let n_stream = r.u32("the cells")? as usize;
    let want_streams = if dest.is_some() { 1 } else { kv.n_stream() };
    if n_stream != want_streams {
        return err(format!(
            "the state has {n_stream} KV streams, this context has {want_streams} (kv_unified and n_seq_max must match)"
        ));
    }
    let per_cell = if dest.is_some() { 8 } else { 40 };
    let mut cells = Vec::with_capacity(n_stream);
    let mut n_total = 0usize;
    for si in 0..n_stream {
        let n = r.u32("the cells")? as usize;
        let cap = kv.size;
        if n > cap {
            return err(format!(
                "the state holds {n} KV cells{}, more than this context's {cap} (n_ctx{})",
                if n_stream > 1 { format!(" in stream {si}") } else { String::new() },
                if kv.n_stream() > 1 { "_seq" } else { "" }
            ));
        }
        let raw = r.arr(n, per_cell, "the cells")?;
        let mut v = Vec::with_capacity(n);
        for (ci, c) in raw.chunks_exact(per_cell).enumerate() {
            let pos = i32::from_le_bytes(c[0..4].try_into().unwrap());
            let shift = i32::from_le_bytes(c[4..8].try_into().unwrap());
            if pos < 0 {
                return err(format!("corrupted state: cell {ci} has position {pos}"));
            }
            let seqs = if dest.is_some() {
                SeqSet::default()
            } else {
                let mut w = [0u64; 4];
                for (j, x) in w.iter_mut().enumerate() {
                    *x = u64::from_le_bytes(c[8 + 8 * j..16 + 8 * j].try_into().unwrap());
                }
                let s = SeqSet::from_words(w);
                if s.is_empty() {
                    return err(format!("corrupted state: cell {ci} belongs to no sequence"));
                }
                if let Some(bad) = (kv.n_seq_max..crate::kv_cache::MAX_SEQ).find(|&q| s.has(q)) {
                    return err(format!("the state holds sequence {bad}, this context has n_seq_max = {}", kv.n_seq_max));
                }
                if n_stream > 1 && (s.count() != 1 || !s.has(si)) {
                    return err(format!("corrupted state: a cell of stream {si} belongs to other sequences"));
                }
                s
            };
            v.push((pos, shift, seqs));
        }
        n_total += n;
        cells.push(v);
    }
    let mut k = Vec::with_capacity(kv.k.len());
    let mut vv = Vec::with_capacity(kv.k.len());
    for il in 0..kv.k.len() {
        k.push(r.arr(n_total, kv.row_k[il], "the K rows")?);
        vv.push(r.arr(n_total, kv.row_v[il], "the V rows")?);
    }
    let (mut rs_cells, mut rs_r, mut rs_s) = (Vec::new(), Vec::new(), Vec::new());
    if let Some(rs) = rs {
        let what = "the recurrent states";
        let (nr, ns) = (r.u32(what)? as usize, r.u32(what)? as usize);
        if (nr, ns) != (rs.n_embd_r, rs.n_embd_s) {
            return err(format!(
                "the state's recurrent states have widths {nr} and {ns}, this model's {} and {}",
                rs.n_embd_r, rs.n_embd_s
            ));
        }
        let n = r.u32(what)? as usize;
        let cap = if dest.is_some() { 1 } else { rs.size };
        if n > cap {
            return err(format!("the state holds {n} recurrent states, more than the {cap} this context can take"));
        }
        let mut tails = vec![false; rs.size];
        for ci in 0..n {
            let pos = i32::from_le_bytes(r.arr(1, 4, what)?.try_into().unwrap());
            if pos < 0 {
                return err(format!("corrupted state: recurrent cell {ci} has position {pos}"));
            }
            let mut seqs = SeqSet::default();
            if dest.is_none() {
                let mut wds = [0u64; 4];
                for x in wds.iter_mut() {
                    *x = r.u64(what)?;
                }
                seqs = SeqSet::from_words(wds);
                if seqs.is_empty() {
                    return err(format!("corrupted state: recurrent cell {ci} belongs to no sequence"));
                }
                for q in 0..crate::kv_cache::MAX_SEQ {
                    if seqs.has(q) {
                        if q >= rs.n_seq_max {
                            return err(format!("the state holds sequence {q}, this context has n_seq_max = {}", rs.n_seq_max));
                        }
                        if tails[q] {
                            return err(format!("corrupted state: sequence {q} has two recurrent states"));
                        }
                        tails[q] = true;
                    }
                }
            }
            rs_cells.push((pos, seqs));
        }
        for il in 0..rs.r.len() {
            for (buf, width, out) in [(&rs.r[il], nr, &mut rs_r), (&rs.s[il], ns, &mut rs_s)] {
                out.push(if buf.is_empty() { Vec::new() } else { f32s(r.arr(n, 4 * width, what)?) });
            }
        }
    }
    let n_out = r.u32("the outputs")? as usize;
    let mut out_rows = Vec::new();
    let (mut logits, mut embd) = (Vec::new(), Vec::new());
    if n_out > 0 {
        if dest.is_some() {
            return err("corrupted state: a sequence state with outputs");
        }
        if n_out > lim.n_batch {
            return err(format!("the state has {n_out} outputs, more than this context's n_batch = {}", lim.n_batch));
        }
        let raw = r.arr(n_out, 4, "the outputs")?;
        let mut seen = vec![false; lim.n_batch];
        for c in raw.chunks_exact(4) {
            let b = i32::from_le_bytes(c.try_into().unwrap());
            if b < 0 || b as usize >= lim.n_batch || seen[b as usize] {
                return err(format!(
                    "the state's output batch index {b} is outside [0, n_batch = {}) or repeated",
                    lim.n_batch
                ));
            }
            seen[b as usize] = true;
            out_rows.push(b);
        }
        for (what, w, dst) in [("logits", lim.n_vocab, &mut logits), ("embeddings", lim.n_embd, &mut embd)] {
            let rows = r.u32(what)? as usize;
            if rows != 0 && rows != n_out {
                return err(format!("corrupted state: {rows} rows of {what} for {n_out} outputs"));
            }
            *dst = f32s(r.arr(rows, 4 * w, what)?);
        }
    }
    if r.p != body.len() {
        return err(format!("corrupted state: {} bytes left over after the outputs", body.len() - r.p));
    }
    if let Some(d) = dest {
        if d >= kv.n_seq_max {
            return err(format!("dest_seq_id {d} is outside [0, {})", kv.n_seq_max));
        }
    }
    Ok(Parsed {
        kind_seq: dest.is_some(),
        flags,
        n_read: total,
        tokens,
        cells,
        k,
        v: vv,
        out_rows,
        logits,
        embd,
        rs_cells,
        rs_r,
        rs_s,
    })
}

/// Copy the rows of `cells` (one stream, placed at `dst_cells`) into a layer buffer.
fn get_rows(buf: &mut [u8], base: usize, rb: usize, src: &[u8], dst_cells: &[usize]) {
    let mut i = 0;
    while i < dst_cells.len() {
        let mut j = i + 1;
        while j < dst_cells.len() && dst_cells[j] == dst_cells[j - 1] + 1 {
            j += 1;
        }
        let o = (base + dst_cells[i]) * rb;
        buf[o..o + (j - i) * rb].copy_from_slice(&src[i * rb..j * rb]);
        i = j;
    }
}

/// Where the cells of a sequence state go in `dest`'s stream, found without changing the
/// cache: the stream as it would be once `dest`'s own cells are removed.
fn seq_slot(kv: &KvCache, dest: usize, n: usize) -> SResult<Vec<usize>> {
    let st = &kv.streams[kv.stream_of(dest)];
    let mut free: Vec<usize> = Vec::with_capacity(n);
    for (i, c) in st.cells.iter().enumerate() {
        if free.len() == n {
            break;
        }
        if c.is_empty() || (c.seq.has(dest) && c.seq.count() == 1) {
            free.push(i);
        }
    }
    if free.len() < n {
        return err(format!(
            "no room for the sequence's {n} KV cells: {} cells of this context{} are free for sequence {dest}",
            free.len(),
            if kv.n_stream() > 1 { "'s stream" } else { "" }
        ));
    }
    Ok(free)
}

/// Check that a parsed state can be applied (room for a sequence's cells); nothing changes.
pub fn plan(kv: &KvCache, p: &Parsed, dest: Option<usize>) -> SResult<Option<Vec<usize>>> {
    match dest {
        None => Ok(None),
        Some(d) => seq_slot(kv, d, p.cells[0].len()).map(Some),
    }
}

/// Put the recurrent section of a parsed state into the recurrent memory (llama.cpp's
/// state_read_meta / _data). Cannot fail: a sequence's cell comes free once its old state
/// is removed.
fn apply_rs(rs: &mut RsCache, p: &Parsed, dest: Option<usize>) {
    let n = p.rs_cells.len();
    // the restored states are current: no rollback pending (llama.cpp's set_rs_idx(seq_id, 0));
    // the snapshot planes keep what they held (zeros after a whole-state load: clear)
    match dest {
        Some(d) => rs.rs_idx[d] = 0,
        None => rs.rs_idx.fill(0),
    }
    let placed: Vec<usize> = match dest {
        Some(d) => {
            rs.seq_rm(d as i32, -1, -1);
            if n == 0 {
                return;
            }
            let q = RsSeq { seq0: d, seqs: SeqSet::only(d), last_pos: p.rs_cells[0].0 };
            if !rs.find_slot(&[q]) {
                return;
            }
            vec![rs.head]
        }
        None => {
            rs.clear(true);
            for (i, &(pos, seqs)) in p.rs_cells.iter().enumerate() {
                rs.cells[i].pos = pos;
                rs.cells[i].seq = seqs;
                rs.cells[i].src = i as i32;
                for q in 0..rs.size.min(crate::kv_cache::MAX_SEQ) {
                    if seqs.has(q) {
                        rs.cells[q].tail = i as i32;
                    }
                }
            }
            rs.head = 0;
            rs.used = n;
            (0..n).collect()
        }
    };
    let (nr, ns) = (rs.n_embd_r, rs.n_embd_s);
    for il in 0..rs.r.len() {
        for (buf, width, src) in [(&mut rs.r[il], nr, &p.rs_r[il]), (&mut rs.s[il], ns, &p.rs_s[il])] {
            if buf.is_empty() {
                continue;
            }
            for (j, &c) in placed.iter().enumerate() {
                buf[c * width..(c + 1) * width].copy_from_slice(&src[j * width..(j + 1) * width]);
            }
        }
    }
}

/// Put a parsed, planned state into the cache. Cannot fail.
pub fn apply(kv: &mut KvCache, rs: Option<&mut RsCache>, p: &Parsed, dest: Option<usize>, slot: Option<Vec<usize>>) {
    if let Some(rs) = rs {
        apply_rs(rs, p, dest);
    }
    let mut placed: Vec<(usize, Vec<usize>)> = Vec::new();
    match (dest, slot) {
        (Some(d), Some(slot)) => {
            let si = kv.stream_of(d);
            // remove d everywhere in its stream (as seq_rm(d, -1, -1))
            let _ = kv.seq_rm(d as i32, -1, -1);
            let st = &mut kv.streams[si];
            for (&c, &(pos, shift, _)) in slot.iter().zip(&p.cells[0]) {
                if st.cells[c].is_empty() {
                    st.used += 1;
                }
                st.cells[c] = Cell { pos, shift, seq: SeqSet::only(d) };
            }
            if let Some(&last) = slot.last() {
                st.head = if last + 1 < st.cells.len() { last + 1 } else { 0 };
            }
            placed.push((si, slot));
        }
        _ => {
            // a whole context: cells in their saved order from cell 0 (keys are ordered by
            // position, then cell, so the relative order keeps attention identical)
            for (si, cs) in p.cells.iter().enumerate() {
                let size = kv.size;
                let st: &mut Stream = &mut kv.streams[si];
                for c in st.cells.iter_mut() {
                    *c = Cell { pos: -1, shift: 0, seq: SeqSet::default() };
                }
                for (i, &(pos, shift, seq)) in cs.iter().enumerate() {
                    st.cells[i] = Cell { pos, shift, seq };
                }
                st.used = cs.len();
                st.head = if cs.len() < size { cs.len() } else { 0 };
                placed.push((si, (0..cs.len()).collect()));
            }
        }
    }
    for il in 0..kv.k.len() {
        let (rk, rv, size) = (kv.row_k[il], kv.row_v[il], kv.size);
        let mut off = 0;
        for (si, cs) in &placed {
            let n = cs.len();
            get_rows(&mut kv.k[il], si * size, rk, &p.k[il][off * rk..(off + n) * rk], cs);
            get_rows(&mut kv.v[il], si * size, rv, &p.v[il][off * rv..(off + n) * rv], cs);
            off += n;
        }
    }
    kv.has_shift = kv.streams.iter().any(|st| st.cells.iter().any(|c| !c.is_empty() && c.shift != 0));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ggml_type::GgmlType;
    use crate::kv_cache::Slot;

    #[test]
    fn xxh64_known_values() {
        assert_eq!(xxh64(b"", 0), 0xEF46_DB37_51D8_E999);
        assert_eq!(xxh64(b"abc", 0), 0x44BC_2CF5_AD77_0999);
        // 32+ bytes take the four-lane path
        assert_eq!(
            xxh64(b"Nobody inspects the spammish repetition", 0),
            0xFBCE_A83C_8A37_8BF1
        );
    }

    fn fp(tk: GgmlType) -> Fingerprint {
        Fingerprint {
            arch: "llama".into(),
            n_embd: 32,
            n_layer: 2,
            n_vocab: 10,
            vocab_hash: 7,
            type_k: tk as u32,
            type_v: GgmlType::F16 as u32,
            n_embd_k_gqa: vec![32, 32],
            n_embd_v_gqa: vec![32, 32],
        }
    }

    fn cache(size: usize, n_stream: usize) -> KvCache {
        KvCache::new(&[32, 32], &[32, 32], size, n_stream, 4, GgmlType::F16, GgmlType::F16).unwrap()
    }

    fn put(kv: &mut KvCache, seq: usize, pos: &[i32]) {
        let seq0 = vec![seq; pos.len()];
        let mut slot = Slot::default();
        let mut scratch = Vec::new();
        assert!(kv.find_slot(&seq0, &mut slot, &mut scratch));
        kv.apply_slot(&slot, pos, &|_| SeqSet::only(seq));
        for &(s, c) in &slot.cells {
            for il in 0..2 {
                let rb = kv.row_k[il];
                let o = (s as usize * kv.size + c as usize) * rb;
                kv.k[il][o..o + rb].fill(c as u8 + 1);
                kv.v[il][o..o + rb].fill(c as u8 + 101);
            }
        }
    }

    fn lim() -> Limits {
        Limits { n_batch: 16, max_tokens: None, n_vocab: 10, n_embd: 32 }
    }

    fn save_vec(kv: &KvCache, seq: Option<usize>, out: Outputs) -> Vec<u8> {
        let a = SaveArgs { rs: None, seq, flags: 0, outputs: out, tokens: &[1, 2, 3], n_vocab: 10, n_embd: 32 };
        let n = size(&fp(GgmlType::F16), kv, &a).unwrap();
        let mut v = vec![0u8; n];
        assert_eq!(save(&fp(GgmlType::F16), kv, &a, &mut v).unwrap(), n);
        v
    }

    #[test]
    fn context_round_trip() {
        let mut kv = cache(8, 1);
        put(&mut kv, 0, &[0, 1, 2]);
        put(&mut kv, 1, &[0, 1]);
        let logits: Vec<f32> = (0..10).map(|i| i as f32).collect();
        let data = save_vec(&kv, None, Outputs { rows: &[4], logits: &logits, embd: &[] });
        let mut kv2 = cache(8, 1);
        let p = parse(&fp(GgmlType::F16), &kv2, None, &data, None, &lim()).unwrap();
        assert_eq!(p.tokens, vec![1, 2, 3]);
        assert_eq!(p.out_rows, vec![4]);
        assert_eq!(p.logits, logits);
        let s = plan(&kv2, &p, None).unwrap();
        apply(&mut kv2, None, &p, None, s);
        assert_eq!(kv2.k, kv.k);
        assert_eq!(kv2.v, kv.v);
        assert_eq!(kv2.seq_pos_max(1).unwrap(), 1);
        assert_eq!(kv2.streams[0].used, 5);
    }

    #[test]
    fn seq_moves_and_refusals() {
        let mut kv = cache(8, 1);
        put(&mut kv, 0, &[0, 1, 2]);
        let data = save_vec(&kv, Some(0), Outputs::default());
        let mut kv2 = cache(8, 4);
        put(&mut kv2, 3, &[0]);
        let p = parse(&fp(GgmlType::F16), &kv2, None, &data, Some(3), &lim()).unwrap();
        let s = plan(&kv2, &p, Some(3)).unwrap();
        apply(&mut kv2, None, &p, Some(3), s);
        assert_eq!((kv2.seq_pos_min(3).unwrap(), kv2.seq_pos_max(3).unwrap()), (0, 2));
        assert_eq!(kv2.k_row(0, 3, 2), kv.k_row(0, 0, 2));
        // a context state is not a sequence state, another type_k does not fit
        assert!(parse(&fp(GgmlType::F16), &kv2, None, &data, None, &lim()).is_err());
        assert!(parse(&fp(GgmlType::Q8_0), &kv2, None, &data, Some(1), &lim()).unwrap_err().0.contains("type_k"));
        // every truncation and every single-byte flip is refused
        for n in 0..data.len() {
            assert!(parse(&fp(GgmlType::F16), &kv2, None, &data[..n], Some(1), &lim()).is_err());
        }
        for i in 0..data.len() {
            let mut d = data.clone();
            d[i] ^= 0x5a;
            assert!(parse(&fp(GgmlType::F16), &kv2, None, &d, Some(1), &lim()).is_err(), "flip at {i}");
        }
        // too many cells for a small context
        let mut big = cache(16, 1);
        put(&mut big, 0, &(0..12).collect::<Vec<_>>());
        let data = save_vec(&big, Some(0), Outputs::default());
        assert!(parse(&fp(GgmlType::F16), &kv, None, &data, Some(0), &lim()).unwrap_err().0.contains("more than"));
    }
}
