//! Recurrent memory (Mamba-2's conv and SSM states, LFM2's short-convolution state, the
//! gated delta-net's conv and delta states): one state per sequence instead of one K/V row
//! per token, after llama.cpp's src/llama-memory-recurrent.cpp, with its rollback snapshots
//! (`n_rs_seq`, 0 by default: none).
//!
//! There are `size` = max(1, n_seq_max) cells; a cell holds one state (per recurrent layer
//! an `r` row of n_embd_r floats, the convolution's last inputs, and an `s` row of n_embd_s
//! floats, the scan's state), the position of the last token folded into it and the
//! sequences that share it. `cells[seq].tail` is the cell holding sequence `seq`'s state.
//! Sequence operations follow llama.cpp exactly, including what they refuse:
//! - `seq_rm` can remove a sequence entirely, or positions after its last one; removing
//!   the end of a state (0 < p0 <= last position < p1) needs the state of an earlier token:
//!   with `n_rs_seq` = 0 it is impossible and returns false with nothing changed; with
//!   `n_rs_seq` > 0 the last k <= n_rs_seq positions can be removed once (the rollback is
//!   pending until the sequence's next decode, which starts from snapshot k; a second
//!   partial removal before that returns false); a negative seq id accepts only the whole
//!   range (or an empty one);
//! - `seq_cp` makes the destination share the source's cell (the state is copied when the
//!   destination next decodes: the cell is then split, llama.cpp's `find_slot`);
//! - `seq_add` / `seq_div` only move the position of the tail cell.
//!
//! Decoding a micro-batch (`find_slot`) takes one cell per sequence, contiguous from
//! `head` in the micro-batch's sequence order, and records for each cell of
//! [head, head + n) the cell its state comes from (`src0`; a new sequence starts from a
//! zeroed cell, `rs_z`); `gather` then moves the states into place before the forward pass
//! (llama.cpp's `build_rs` does it inside the graph).
//!
//! Rollback snapshots (llama.cpp's `n_rs_seq` > 0, for the architectures whose graphs write
//! them: lfm2, lfm2moe, qwen35, qwen35moe): the state buffers hold 1 + n_rs_seq planes of
//! `size` rows; plane 0 is the current state, and a micro-batch of n tokens per sequence also
//! writes, for the sequence in cell c, the state j tokens before its end into plane j, row c
//! (j < min(n, n_rs_seq + 1); the gated delta-net's convolution writes every plane, those
//! beyond n with the state before the micro-batch). Planes a micro-batch does not write keep
//! what they held (llama.cpp's "caller-owned" slots). `seq_rm` of the last k positions
//! records `rs_idx[seq] = k`; the next `gather` reads that cell's state from plane k and
//! clears the index (for the cell's lowest sequence id, as llama.cpp's `s_copy`). The batch
//! split keeps the last n_rs_seq + 1 tokens of a sequence in one micro-batch.

use crate::error::{alloc, Error, Result};
use crate::kv_cache::SeqSet;

#[derive(Clone, Copy, Debug)]
pub struct RsCell {
    pub pos: i32,
    /// The cell whose state this cell takes at the next decode (-1: none, a fresh state).
    pub src: i32,
    /// `src` as staged by the last `find_slot`.
    pub src0: i32,
    /// Meaningful on cell index `seq`: the cell holding sequence `seq` (-1 when none).
    pub tail: i32,
    pub seq: SeqSet,
}

impl RsCell {
    const EMPTY: RsCell = RsCell { pos: -1, src: -1, src0: -1, tail: -1, seq: SeqSet::EMPTY };
    pub fn is_empty(&self) -> bool {
        self.seq.is_empty()
    }
}

/// One micro-batch's sequence set, as `find_slot` reads it: the first sequence id of its
/// tokens, all of their sequence ids, and the position of its last token.
#[derive(Clone, Copy, Debug)]
pub struct RsSeq {
    pub seq0: usize,
    pub seqs: SeqSet,
    pub last_pos: i32,
}

pub struct RsCache {
    pub size: usize,
    pub n_seq_max: usize,
    /// Rollback snapshots per sequence (planes 1..=n_rs_seq of the state buffers).
    pub n_rs_seq: usize,
    /// Per sequence: the pending rollback (the plane its next decode starts from; 0: none).
    pub rs_idx: Vec<u32>,
    pub cells: Vec<RsCell>,
    pub head: usize,
    pub used: usize,
    /// Cells of the last `find_slot`: [head, head + n).
    pub n: usize,
    pub rs_z: i32,
    pub n_embd_r: usize,
    pub n_embd_s: usize,
    /// Per layer: [(1 + n_rs_seq) * size, n_embd_r] and [.., n_embd_s] f32 (empty for
    /// other layers); row p * size + c is plane p's state of cell c.
    pub r: Vec<Vec<f32>>,
    pub s: Vec<Vec<f32>>,
}

fn range(p0: i32, p1: i32) -> (i32, i32) {
    (p0.max(0), if p1 < 0 { i32::MAX } else { p1 })
}

impl RsCache {
    /// `layers[il]`: whether layer il is recurrent.
    pub fn new(layers: &[bool], n_embd_r: usize, n_embd_s: usize, n_seq_max: usize, n_rs_seq: usize) -> Result<RsCache> {
        let size = n_seq_max.max(1);
        let rows = alloc::mul("the recurrent state rows [n_seq_max * (1 + n_rs_seq)]", size, n_rs_seq.saturating_add(1))?;
        let buf = |on: bool, w: usize, what: &str| -> Result<Vec<f32>> {
            if !on {
                return Ok(Vec::new());
            }
            alloc::filled(alloc::mul(what, rows, w)?, 0f32, what)
        };
        let mut r = Vec::with_capacity(layers.len());
        let mut s = Vec::with_capacity(layers.len());
        for &on in layers {
            r.push(buf(on, n_embd_r, "the recurrent conv state of one layer [n_seq_max * (1 + n_rs_seq), n_embd_r]")?);
            s.push(buf(on, n_embd_s, "the recurrent state of one layer [n_seq_max * (1 + n_rs_seq), n_embd_s]")?);
        }
        Ok(RsCache {
            size,
            n_seq_max,
            n_rs_seq,
            rs_idx: vec![0; n_seq_max],
            cells: vec![RsCell::EMPTY; size],
            head: 0,
            used: 0,
            n: 0,
            rs_z: -1,
            n_embd_r,
            n_embd_s,
            r,
            s,
        })
    }

    pub fn clear(&mut self, data: bool) {
        self.cells.iter_mut().for_each(|c| *c = RsCell::EMPTY);
        self.head = 0;
        self.used = 0;
        self.rs_idx.fill(0);
        if data {
            for b in self.r.iter_mut().chain(self.s.iter_mut()) {
                b.fill(0.0);
            }
        }
    }

    fn check_seq(&self, seq: i32, what: &str) -> Result<usize> {
        if seq < 0 || seq as usize >= self.n_seq_max {
            return Err(Error::Invalid(format!("{what}: seq_id {seq} is outside [0, {})", self.n_seq_max)));
        }
        Ok(seq as usize)
    }

    /// llama_memory_recurrent::seq_rm: false (nothing changed) when the range would cut a
    /// state in the middle, except for a rollback of at most n_rs_seq positions (see above).
    pub fn seq_rm(&mut self, seq: i32, p0: i32, p1: i32) -> bool {
        let (p0, p1) = range(p0, p1);
        // llama.cpp tests the seq id as unsigned against n_seq_max: a negative one (every
        // sequence) is refused too
        let Some(q) = usize::try_from(seq).ok().filter(|&q| q < self.n_seq_max) else {
            return false;
        };
        if p0 == 0 && p1 == i32::MAX {
            self.rs_idx[q] = 0; // removing everything drops a pending rollback
        }
        let t = self.cells[q].tail;
        if t >= 0 {
            let pos = self.cells[t as usize].pos;
            if 0 < p0 && p0 <= pos && p1 > pos {
                // a partial rollback: the state k tokens back is snapshot k (single use)
                let k = i64::from(pos) - i64::from(p0) + 1;
                if self.rs_idx[q] == 0 && k >= 1 && k <= self.n_rs_seq as i64 {
                    self.rs_idx[q] = k as u32;
                    self.cells[t as usize].pos = p0 - 1;
                    return true;
                }
                return false;
            }
            if p0 <= pos && pos < p1 {
                self.cells[q].tail = -1;
            }
        }
        let mut new_head = self.size;
        for i in 0..self.size {
            let c = &mut self.cells[i];
            if c.pos < p0 || c.pos >= p1 || !c.seq.has(q) {
                continue;
            }
            c.seq.remove(q);
            if c.is_empty() {
                if c.pos >= 0 {
                    self.used -= 1;
                }
                c.pos = -1;
                c.src = -1;
                if new_head == self.size {
                    new_head = i;
                }
            }
        }
        if new_head != self.size && new_head < self.head {
            self.head = new_head;
        }
        true
    }

    pub fn seq_cp(&mut self, src: i32, dst: i32) -> Result<()> {
        let s = self.check_seq(src, "seq_cp")?;
        let d = self.check_seq(dst, "seq_cp")?;
        if s == d {
            return Ok(());
        }
        let td = self.cells[d].tail;
        if td >= 0 {
            let c = &mut self.cells[td as usize];
            c.seq.remove(d);
            if c.is_empty() {
                c.pos = -1;
                c.src = -1;
                self.used -= 1;
            }
            self.cells[d].tail = -1;
        }
        let ts = self.cells[s].tail;
        if ts >= 0 {
            self.cells[ts as usize].seq.add(d);
            self.cells[d].tail = ts;
        }
        Ok(())
    }

    pub fn seq_keep(&mut self, seq: i32) -> Result<()> {
        let k = self.check_seq(seq, "seq_keep")?;
        let mut new_head = self.size;
        for i in 0..self.size {
            if i != k {
                self.cells[i].tail = -1;
            }
            let c = &mut self.cells[i];
            if !c.seq.has(k) {
                if c.pos >= 0 {
                    self.used -= 1;
                }
                c.pos = -1;
                c.src = -1;
                c.seq = SeqSet::EMPTY;
                if new_head == self.size {
                    new_head = i;
                }
            } else {
                c.seq = SeqSet::only(k);
            }
        }
        if new_head != self.size && new_head < self.head {
            self.head = new_head;
        }
        Ok(())
    }

    /// The tail cell of `seq` when its position lies in [p0, p1).
    fn tail_in(&mut self, seq: usize, p0: i32, p1: i32) -> Option<&mut RsCell> {
        let t = self.cells[seq].tail;
        if t < 0 {
            return None;
        }
        let c = &mut self.cells[t as usize];
        (c.seq.has(seq) && p0 <= c.pos && c.pos < p1).then_some(c)
    }

    pub fn seq_add(&mut self, seq: i32, p0: i32, p1: i32, delta: i32) -> Result<()> {
        let s = self.check_seq(seq, "seq_add")?;
        let (p0, p1) = range(p0, p1);
        if delta == 0 || p0 == p1 {
            return Ok(());
        }
        if let Some(c) = self.tail_in(s, p0, p1) {
            c.pos = c.pos.saturating_add(delta);
        }
        Ok(())
    }

    pub fn seq_div(&mut self, seq: i32, p0: i32, p1: i32, d: i32) -> Result<()> {
        let s = self.check_seq(seq, "seq_div")?;
        if d == 1 {
            return Ok(());
        }
        if d <= 0 {
            return Err(Error::Invalid(format!("seq_div: divisor {d} must be positive")));
        }
        let (p0, p1) = range(p0, p1);
        if p0 == p1 {
            return Ok(());
        }
        if let Some(c) = self.tail_in(s, p0, p1) {
            c.pos /= d;
        }
        Ok(())
    }

    pub fn seq_pos_min(&self, seq: usize) -> i32 {
        self.cells.iter().filter(|c| c.seq.has(seq)).map(|c| c.pos).min().unwrap_or(-1)
    }

    pub fn seq_pos_max(&self, seq: usize) -> i32 {
        self.cells.iter().filter(|c| c.seq.has(seq)).map(|c| c.pos).max().unwrap_or(-1)
    }

    /// The cell metadata (cells, head, used), to undo trial `find_slot`s.
    pub fn snapshot(&self) -> (Vec<RsCell>, usize, usize) {
        (self.cells.clone(), self.head, self.used)
    }
    pub fn restore(&mut self, snap: (Vec<RsCell>, usize, usize)) {
        (self.cells, self.head, self.used) = snap;
    }

    /// llama_memory_recurrent::find_slot for a micro-batch of `seqs.len()` sequence sets
    /// with the same number of tokens each: afterwards sequence set k's state lives in cell
    /// head + k, and `src0` of each cell of [head, head + n) names where its state comes from.
    pub fn find_slot(&mut self, seqs: &[RsSeq]) -> bool {
        let size = self.size;
        let n_seqs = seqs.len();
        if n_seqs == 0 {
            return false;
        }
        if self.head > self.used + 2 * n_seqs {
            self.head = 0;
        }
        for q in seqs {
            for sid in 0..self.n_seq_max.min(crate::kv_cache::MAX_SEQ) {
                if !q.seqs.has(sid) {
                    continue;
                }
                if sid >= size {
                    return false;
                }
                if sid == q.seq0 {
                    continue;
                }
                // a sequence that becomes shared loses its own cell
                let t = self.cells[sid].tail;
                if t >= 0 {
                    let c = &mut self.cells[t as usize];
                    c.seq.remove(sid);
                    self.cells[sid].tail = -1;
                    let c = &mut self.cells[t as usize];
                    if c.is_empty() {
                        c.pos = -1;
                        c.src = -1;
                        self.used -= 1;
                    }
                }
            }
            if q.seq0 >= size {
                return false;
            }
        }
        // the next empty cell from head
        let mut next_empty = self.head;
        for _ in 0..size {
            if next_empty >= size {
                next_empty -= size;
            }
            if self.cells[next_empty].is_empty() {
                break;
            }
            next_empty += 1;
        }
        let mut min = size as i32 - 1;
        let mut max = 0i32;
        for (k, q) in seqs.iter().enumerate() {
            let sid = q.seq0;
            let tail = self.cells[sid].tail;
            let has_cell = tail >= 0 && self.cells[tail as usize].seq.count() == 1;
            if !has_cell {
                if next_empty >= size || !self.cells[next_empty].is_empty() {
                    return false;
                }
                if tail >= 0 {
                    // copy the old tail (shared with other sequences) into the empty cell
                    let (pos, src) = (self.cells[tail as usize].pos, self.cells[tail as usize].src);
                    self.cells[tail as usize].seq.remove(sid);
                    let e = &mut self.cells[next_empty];
                    e.pos = pos;
                    e.src = src;
                    e.seq.add(sid);
                }
                self.cells[sid].tail = next_empty as i32;
                if k + 1 < n_seqs {
                    for _ in 0..size {
                        next_empty += 1;
                        if next_empty >= size {
                            next_empty -= size;
                        }
                        if self.cells[next_empty].is_empty() {
                            break;
                        }
                    }
                }
            }
            let t = self.cells[sid].tail;
            min = min.min(t);
            max = max.max(t);
        }
        // gather: sequence set k into cell min + k
        for (k, q) in seqs.iter().enumerate() {
            let dst = min + k as i32;
            let src = self.cells[q.seq0].tail;
            if dst != src {
                if dst as usize >= size {
                    return false;
                }
                let (d, s) = (dst as usize, src as usize);
                let (dp, dsrc, dseq) = (self.cells[d].pos, self.cells[d].src, self.cells[d].seq);
                self.cells[d].pos = self.cells[s].pos;
                self.cells[d].src = self.cells[s].src;
                self.cells[d].seq = self.cells[s].seq;
                self.cells[s].pos = dp;
                self.cells[s].src = dsrc;
                self.cells[s].seq = dseq;
                for c in self.cells.iter_mut() {
                    if c.tail == src {
                        c.tail = dst;
                    } else if c.tail == dst {
                        c.tail = src;
                    }
                }
            }
        }
        for (k, q) in seqs.iter().enumerate() {
            let id = (min + k as i32) as usize;
            self.cells[id].pos = q.last_pos;
            self.cells[id].seq = q.seqs;
            for sid in 0..size.min(crate::kv_cache::MAX_SEQ) {
                if q.seqs.has(sid) {
                    self.cells[sid].tail = id as i32;
                }
            }
        }
        let mut refs = vec![0u32; size];
        for c in &self.cells {
            if c.src >= 0 {
                refs[c.src as usize] += 1;
            }
        }
        self.rs_z = (min..=max).find(|&i| refs[i as usize] == 0).unwrap_or(-1);
        for i in min..=max {
            let c = &mut self.cells[i as usize];
            if c.src < 0 {
                if self.rs_z < 0 {
                    return false;
                }
                c.src0 = self.rs_z;
            } else {
                c.src0 = c.src;
            }
            c.src = i;
        }
        self.head = min as usize;
        self.n = (max - min + 1) as usize;
        self.used = self.cells.iter().filter(|c| !c.is_empty()).count();
        self.n >= n_seqs
    }

    /// Move the states into the cells of the last `find_slot` (llama.cpp's `build_rs`):
    /// the `rs_z` cell is zeroed, then each cell of [head, head + n) takes the state of its
    /// `src0`, for every recurrent layer; from snapshot plane k after a rollback of k
    /// positions of the cell's (lowest) sequence, whose rollback is then done (`s_copy`).
    pub fn gather(&mut self) {
        let (head, n) = (self.head, self.n);
        let mut src: Vec<usize> = (head..head + n).map(|i| self.cells[i].src0.max(0) as usize).collect();
        if self.n_rs_seq > 0 {
            for (k, s) in src.iter_mut().enumerate() {
                if let Some(q) = self.cells[head + k].seq.first().filter(|&q| q < self.rs_idx.len()) {
                    *s += std::mem::take(&mut self.rs_idx[q]) as usize * self.size;
                }
            }
        }
        if src.iter().enumerate().all(|(k, &s)| s == head + k) && self.rs_z < 0 {
            return;
        }
        let z = self.rs_z;
        for (bufs, w) in [(&mut self.r, self.n_embd_r), (&mut self.s, self.n_embd_s)] {
            for b in bufs.iter_mut().filter(|b| !b.is_empty()) {
                if z >= 0 {
                    b[z as usize * w..(z as usize + 1) * w].fill(0.0);
                }
                let rows: Vec<f32> = src.iter().flat_map(|&s| b[s * w..(s + 1) * w].to_vec()).collect();
                b[head * w..(head + n) * w].copy_from_slice(&rows);
            }
        }
    }

    /// Row `cell` of snapshot plane `plane` in a state buffer of row width `w`.
    pub fn row(&self, plane: usize, cell: usize, w: usize) -> std::ops::Range<usize> {
        let i = plane * self.size + cell;
        i * w..(i + 1) * w
    }

    /// Bytes of the states (for `memory_size`).
    pub fn n_bytes(&self) -> usize {
        self.r.iter().chain(self.s.iter()).map(|b| b.len() * 4).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(seq: usize, last_pos: i32) -> RsSeq {
        RsSeq { seq0: seq, seqs: SeqSet::only(seq), last_pos }
    }

    fn cache(n: usize) -> RsCache {
        RsCache::new(&[true], 2, 3, n, 0).unwrap()
    }

    #[test]
    fn rm_only_whole_or_after_the_end() {
        let mut rs = cache(2);
        assert!(rs.find_slot(&[one(0, 4)]));
        rs.gather();
        assert_eq!((rs.seq_pos_min(0), rs.seq_pos_max(0)), (4, 4));
        // cutting the state's end: refused, nothing changed
        assert!(!rs.seq_rm(0, 2, -1));
        assert!(!rs.seq_rm(0, 4, 5));
        assert_eq!(rs.seq_pos_max(0), 4);
        // after the end: fine, nothing to do
        assert!(rs.seq_rm(0, 5, -1));
        assert_eq!(rs.seq_pos_max(0), 4);
        // negative seq: refused (llama.cpp compares it unsigned with n_seq_max)
        assert!(!rs.seq_rm(-1, 1, -1));
        assert!(!rs.seq_rm(-1, -1, -1));
        assert_eq!(rs.seq_pos_max(0), 4);
        // whole
        assert!(rs.seq_rm(0, -1, -1));
        assert_eq!(rs.seq_pos_max(0), -1);
        assert_eq!(rs.used, 0);
        // beyond n_seq_max: false
        assert!(!rs.seq_rm(7, -1, -1));
    }

    #[test]
    fn rollback_reads_the_snapshot_plane_once() {
        let mut rs = RsCache::new(&[true], 2, 3, 2, 2).unwrap();
        assert_eq!(rs.n_bytes(), 2 * 3 * (2 + 3) * 4);
        assert!(rs.find_slot(&[one(0, 7)]));
        rs.gather();
        let c = rs.head;
        for p in 0..3 {
            let r = rs.row(p, c, 3);
            rs.s[0][r].fill(p as f32 + 1.0);
        }
        // three back: beyond n_rs_seq; a negative seq: refused
        assert!(!rs.seq_rm(0, 5, -1));
        assert!(!rs.seq_rm(-1, 6, -1));
        assert!(rs.seq_rm(0, 6, -1));
        assert_eq!((rs.rs_idx[0], rs.seq_pos_max(0)), (2, 5));
        // pending: a second rollback is refused, one after the new end is a no-op
        assert!(!rs.seq_rm(0, 5, -1));
        assert!(rs.seq_rm(0, 6, -1));
        // the next micro-batch starts from plane 2 and clears the rollback
        assert!(rs.find_slot(&[one(0, 6)]));
        rs.gather();
        assert_eq!(&rs.s[0][rs.row(0, rs.head, 3)], &[3.0, 3.0, 3.0]);
        assert_eq!(rs.rs_idx[0], 0);
        // removing the whole sequence drops a pending rollback
        assert!(rs.seq_rm(0, 6, -1));
        assert!(rs.seq_rm(0, -1, -1));
        assert_eq!(rs.rs_idx[0], 0);
    }

    #[test]
    fn cp_shares_then_splits_with_the_state() {
        let mut rs = cache(3);
        assert!(rs.find_slot(&[one(0, 2)]));
        rs.gather();
        let c0 = rs.head;
        rs.s[0][c0 * 3..c0 * 3 + 3].copy_from_slice(&[1.0, 2.0, 3.0]);
        rs.seq_cp(0, 1).unwrap();
        assert_eq!(rs.seq_pos_max(1), 2);
        assert_eq!(rs.cells[1].tail, rs.cells[0].tail);
        // seq 1 decodes: it gets its own cell, whose state starts as seq 0's
        assert!(rs.find_slot(&[one(1, 3)]));
        rs.gather();
        let c1 = rs.head;
        assert_ne!(c1, c0);
        assert_eq!(&rs.s[0][c1 * 3..c1 * 3 + 3], &[1.0, 2.0, 3.0]);
        assert_eq!((rs.seq_pos_max(0), rs.seq_pos_max(1)), (2, 3));
        // seq_keep(1) drops seq 0
        rs.seq_keep(1).unwrap();
        assert_eq!(rs.seq_pos_max(0), -1);
        assert_eq!(rs.used, 1);
        // a new sequence starts from a zeroed state
        assert!(rs.find_slot(&[one(2, 0)]));
        rs.gather();
        let c2 = rs.head;
        assert_eq!(&rs.s[0][c2 * 3..c2 * 3 + 3], &[0.0, 0.0, 0.0]);
    }

    #[test]
    fn add_div_move_the_tail_only() {
        let mut rs = cache(1);
        assert!(rs.find_slot(&[one(0, 9)]));
        rs.seq_add(0, 0, 5, 3).unwrap(); // 9 not in [0, 5)
        assert_eq!(rs.seq_pos_max(0), 9);
        rs.seq_add(0, 5, -1, -4).unwrap();
        assert_eq!(rs.seq_pos_max(0), 5);
        rs.seq_div(0, -1, -1, 2).unwrap();
        assert_eq!(rs.seq_pos_max(0), 2);
        assert!(rs.seq_add(3, -1, -1, 1).is_err());
    }

    #[test]
    fn two_sequences_in_one_micro_batch_are_contiguous() {
        let mut rs = cache(4);
        assert!(rs.find_slot(&[one(2, 1)]));
        assert!(rs.find_slot(&[one(0, 3), one(1, 3), one(2, 3)]));
        assert_eq!(rs.n, 3);
        for k in 0..3 {
            assert_eq!(rs.cells[rs.head + k].seq, SeqSet::only(k));
            assert_eq!(rs.cells[k].tail as usize, rs.head + k);
        }
    }
}
