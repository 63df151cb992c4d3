//! Matrix multiplication of a (quantized) weight matrix with f32 activations, on the
//! thread pool (pipeline step 13: every projection of every layer).
//!
//! Shapes: w is [n_out rows of n_in] (ggml ne = [n_in, n_out]), x is [n_tokens, n_in] f32
//! row-major, out is [n_tokens, n_out] f32 row-major (or a column range of a wider buffer).
//!
//! The activations are first quantized to `vec_dot_type(w.ty)` (llama.cpp's x86 activation
//! quantizers), then each thread computes a contiguous range of output rows.
//!
//! Paths: F32 weights with rows a multiple of 8 -> the register-blocked tiles of `sgemm`
//! (tinyBLAS's float order, every token count); one token -> the multi-row kernels (`quant::rows_kernel`); 2+ tokens of a type
//! with packed kernels (Q4_0, Q5_0, Q8_0, Q4_1, Q5_1) -> packed groups of 8 tokens, the
//! last group partial; up to 4 groups (a decode step of up to 32 sequences) each weight
//! row is taken once for all groups, so K sequences decoding together read each weight
//! block from memory once;
//! in the AVX-512 set two weight rows per call (`quant::table::Packed::pair`, one row per
//! zmm half), for prefill and for those decode steps alike; in the plain AVX2 build,
//! prefill of Q4_0 / Q5_0 / Q4_1 / Q5_1 (more than 4 groups) packs its groups one token per
//! lane and decodes the weight rows once per matmul, in blocks of `lanes_block_bytes()` (a
//! quarter of L2), every group against each block (`quant::table::Lanes`);
//! Q4_K / Q6_K with 16+ tokens (x86 SIMD sets) -> blocks of 8 rows repacked one row per lane
//! into the thread's scratch, all tokens against each block (`quant::table::RowBlock`), the rows
//! left after the blocks on the tiles below;
//! other types -> tiles of 4 or 8 tokens, then one kernel over the 2..7 tokens left
//! (`quant::cols_kernel`); the scalar set -> vec_dot per element.
//!
//! Determinism: every output element gets exactly the operations of the single-token
//! kernel, in the same block order, whatever n_tokens, the path, the tiling or the thread
//! count (tests hold every path to it bit for bit); so a token's logits do not depend on
//! what else is in its batch.

use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::ggml_type::GgmlType;
use crate::model::{Layout, TensorView};
use crate::quant::{self, kernel_set, KernelSet};
use crate::threadpool::{split_range, SyncPtr, ThreadPool};
use std::ops::Range;

/// Rows `rows` of w x into `out` (as `try_matmul_rows`) on the backend that holds `w`: the
/// device `dev` when it does, else the CPU kernels (the backend seam: crate::backend).
#[allow(clippy::too_many_arguments)]
pub fn matmul_on(
    dev: Option<&dyn Backend>,
    pool: &ThreadPool,
    w: &TensorView,
    x: &[f32],
    n_tokens: usize,
    out: &mut [f32],
    ld_out: usize,
    rows: Range<usize>,
    scratch: &mut Vec<u8>,
) -> Result<()> {
    matmul_on_x(dev, pool, w, x, n_tokens, out, ld_out, rows, scratch, false)
}

/// `matmul_on` for an `x` that is exactly the `x` of the previous matmul on this `scratch`
/// (the same slice, unchanged since: q, k and v, or gate and up, of one layer): where that
/// matmul left `x` quantized (and packed) in the layout this one needs, in the same
/// scratch, it is used as it is instead of being made again (`Prepared`). The caller
/// vouches for `x`; the rest (same scratch allocation, activation type, kernel set, token
/// count, packed layout) is checked, and anything else quantizes as `matmul_on` does.
#[allow(clippy::too_many_arguments)]
pub fn matmul_on_same_x(
    dev: Option<&dyn Backend>,
    pool: &ThreadPool,
    w: &TensorView,
    x: &[f32],
    n_tokens: usize,
    out: &mut [f32],
    ld_out: usize,
    rows: Range<usize>,
    scratch: &mut Vec<u8>,
) -> Result<()> {
    matmul_on_x(dev, pool, w, x, n_tokens, out, ld_out, rows, scratch, true)
}

#[allow(clippy::too_many_arguments)]
fn matmul_on_x(
    dev: Option<&dyn Backend>,
    pool: &ThreadPool,
    w: &TensorView,
    x: &[f32],
    n_tokens: usize,
    out: &mut [f32],
    ld_out: usize,
    rows: Range<usize>,
    scratch: &mut Vec<u8>,
    same_x: bool,
) -> Result<()> {
    if let Some(d) = dev {
        if d.matmul_rows(w, x, n_tokens, out, ld_out, rows.clone())? {
            // the device's product left nothing in scratch: a `matmul_on_same_x` after it
            // must not take an older CPU matmul's activations for its x
            PREPARED.with(|c| c.set(Prepared::NONE));
            return Ok(());
        }
    }
    matmul_with_x(pool, kernel_set(), w, x, n_tokens, out, ld_out, rows, scratch, same_x)
}

#[cfg(test)]
thread_local! {
    /// Matmuls of this thread that reused the previous one's quantized activations.
    static REUSED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

thread_local! {
    /// What the last CPU matmul of this thread left in its scratch (cleared by every
    /// matmul_with before it writes there; set once its activations are quantized, and
    /// again once they are packed).
    static PREPARED: std::cell::Cell<Prepared> = const { std::cell::Cell::new(Prepared::NONE) };
}

/// The activations a matmul left at the start of its scratch: quantized (`QuantKey`: the
/// scratch allocation, x, the activation type and kernel set, which fix the rows' layout)
/// and, after them, packed into groups (`PackKey`: which pack, with which weight offset and
/// group bytes; its place follows from the quantized layout and the pack).
#[derive(Clone, Copy, PartialEq)]
struct Prepared {
    quant: Option<QuantKey>,
    pack: Option<PackKey>,
}

impl Prepared {
    const NONE: Prepared = Prepared { quant: None, pack: None };
}

#[derive(Clone, Copy, PartialEq)]
struct QuantKey {
    scratch: usize,
    x: usize,
    x_len: usize,
    n_tokens: usize,
    vdt: GgmlType,
    set: KernelSet,
}

#[derive(Clone, Copy, PartialEq)]
struct PackKey {
    /// the pack function's address (the interleaved pairs'), or which of the four others
    kind: usize,
    /// the weight offset the non-pair packs fold in (0 for the pairs: theirs has none)
    off: i32,
    gbytes: usize,
}

/// out[t, r] = dot(w row r, x row t). Panics on inconsistent shapes (a caller bug); use
/// `try_matmul_rows` where shapes come from outside.
pub fn matmul(pool: &ThreadPool, w: &TensorView, x: &[f32], n_tokens: usize, out: &mut [f32], scratch: &mut Vec<u8>) {
    let n_out = w.n_rows();
    if let Err(e) = try_matmul_rows(pool, w, x, n_tokens, out, n_out, 0..n_out, scratch) {
        panic!("matmul '{}': {e}", w.name);
    }
}

/// Rows `rows` of the product only: out[t * ld_out + (r - rows.start)] = dot(w row r, x row t).
/// Useful for the output projection (a vocabulary slice) or for writing into a wider buffer.
#[allow(clippy::too_many_arguments)]
pub fn matmul_rows(
    pool: &ThreadPool,
    w: &TensorView,
    x: &[f32],
    n_tokens: usize,
    out: &mut [f32],
    ld_out: usize,
    rows: Range<usize>,
    scratch: &mut Vec<u8>,
) {
    if let Err(e) = try_matmul_rows(pool, w, x, n_tokens, out, ld_out, rows, scratch) {
        panic!("matmul '{}': {e}", w.name);
    }
}

/// `matmul_rows` with every shape checked: an error instead of a panic.
#[allow(clippy::too_many_arguments)]
pub fn try_matmul_rows(
    pool: &ThreadPool,
    w: &TensorView,
    x: &[f32],
    n_tokens: usize,
    out: &mut [f32],
    ld_out: usize,
    rows: Range<usize>,
    scratch: &mut Vec<u8>,
) -> Result<()> {
    matmul_with(pool, kernel_set(), w, x, n_tokens, out, ld_out, rows, scratch)
}

/// The same with an explicit kernel set (tests and benchmarks compare sets).
#[allow(clippy::too_many_arguments)]
pub fn matmul_with(
    pool: &ThreadPool,
    set: KernelSet,
    w: &TensorView,
    x: &[f32],
    n_tokens: usize,
    out: &mut [f32],
    ld_out: usize,
    rows: Range<usize>,
    scratch: &mut Vec<u8>,
) -> Result<()> {
    matmul_with_x(pool, set, w, x, n_tokens, out, ld_out, rows, scratch, false)
}

/// `matmul_with`; `same_x`: the caller vouches that x is the previous matmul's (see
/// `matmul_on_same_x`).
#[allow(clippy::too_many_arguments)]
fn matmul_with_x(
    pool: &ThreadPool,
    set: KernelSet,
    w: &TensorView,
    x: &[f32],
    n_tokens: usize,
    out: &mut [f32],
    ld_out: usize,
    rows: Range<usize>,
    scratch: &mut Vec<u8>,
    same_x: bool,
) -> Result<()> {
    let n_in = w.ne[0];
    let n_out = w.n_rows();
    let wrow = quant::row_bytes(w.ty, n_in)?;
    let bad = |m: String| Error::Invalid(format!("matmul with '{}' ({} [{n_in}, {n_out}]): {m}", w.name, w.ty));
    if w.data.len() < wrow * n_out {
        return Err(bad(format!("weight data has {} bytes, need {}", w.data.len(), wrow * n_out)));
    }
    if rows.start > rows.end || rows.end > n_out {
        return Err(bad(format!("row range {rows:?} out of 0..{n_out}")));
    }
    if x.len() != n_tokens * n_in {
        return Err(bad(format!("x has {} values, need n_tokens * n_in = {}", x.len(), n_tokens * n_in)));
    }
    let n_rows = rows.len();
    if n_tokens > 0 && (ld_out < n_rows || out.len() < (n_tokens - 1) * ld_out + n_rows) {
        return Err(bad(format!("out has {} values, need {n_tokens} rows of stride {ld_out} >= {n_rows}", out.len())));
    }
    if n_tokens == 0 || n_rows == 0 {
        return Ok(());
    }
    // a weight in the x4 row-group layout (`quant::repack`): its own kernels where they
    // apply, else its plain rows back in a buffer, through the paths below
    let x4 = (w.layout == Layout::X4).then(|| x4_kernel(set, w.ty, &rows, n_out, n_tokens)).flatten();
    if w.layout == Layout::X4 && x4.is_none() {
        return matmul_unpacked(pool, set, w, x, n_tokens, out, ld_out, rows, scratch, same_x);
    }
    // what the last matmul left in scratch (reused only where the caller vouched for x);
    // cleared until this one has written its own
    let prev = PREPARED.with(|c| c.replace(Prepared::NONE));
    // (read by the x86-64 packed path only)
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_assignments))]
    let mut quant_reused = false;
    // the weight type's kernels, looked up once for the whole product
    let table = quant::table::table(set);
    let kern = table.get(w.ty);
    let vdt = kern.vec_dot_type;
    let dot = kern.vec_dot.ok_or_else(|| bad(format!("unsupported tensor type {}", w.ty)))?;
    let xrow = quant::row_bytes(vdt, n_in)?;

    // Activations in the vec_dot type: [n_tokens][xrow] bytes.
    let nsc = act_scale_count(vdt, set, n_in);
    let mut xscales: *const f32 = std::ptr::null();
    // start of the row-block path's repack areas in scratch (see `rb_bytes`), as an address
    let mut rb_base = 0usize;
    // offset in scratch of the packed activation groups (see `pack_phase`)
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_assignments))]
    let mut pack_off = 0usize;
    let xq: &[u8] = if vdt == GgmlType::F32 {
        // SAFETY: f32 has no invalid bit patterns and u8 has alignment 1.
        unsafe { std::slice::from_raw_parts(x.as_ptr() as *const u8, x.len() * 4) }
    } else {
        let qf = table.get(vdt).quantize_act.ok_or_else(|| bad(format!("no quantizer for {vdt}")))?;
        // [n_tokens][xrow] quantized rows, then (Q8_0/Q8_1 only) [n_tokens][nsc] f32 block
        // scales converted once here rather than once per weight row in the kernels.
        let sc_off = (n_tokens * xrow).div_ceil(4) * 4;
        let pack_min = sc_off + n_tokens * nsc * 4;
        // + 128: room to place the packed groups and the row areas on their cache-line
        // phases (the Vec's own start is only 16-byte aligned). Grown, never shrunk: every
        // byte used below is written before it is read, and a shrink followed by the next
        // matmul's grow zero-filled the difference serially (Gemma 3 pp512: ~136 us before
        // each q and gate projection, its K-quant down projection needing less scratch, ~1%
        // of the forward with the other thread waiting)
        let need = pack_min + 128 + packed_bytes(kern, n_in, n_tokens) + rb_bytes(kern, n_in, n_tokens, pool.n_threads());
        if scratch.len() < need {
            scratch.resize(need, 0);
        }
        let start = scratch.as_ptr() as usize;
        pack_off = pack_min + (pack_phase(vdt, pairs_path(kern, n_in, n_tokens).is_some()) + 128 - (start + pack_min) % 64) % 64;
        let quantize_token = |t: usize, base: *mut u8| {
            // SAFETY: token t's row and scale slots are disjoint from every other token's.
            let dst = unsafe { std::slice::from_raw_parts_mut(base.add(t * xrow), xrow) };
            qf(&x[t * n_in..(t + 1) * n_in], dst);
            let sc = unsafe { base.add(sc_off + t * nsc * 4) as *mut f32 };
            fill_scales(vdt, dst, nsc, sc, set);
        };
        let sp = SyncPtr(scratch.as_mut_ptr());
        rb_base = (sp.get() as usize + pack_off + packed_bytes(kern, n_in, n_tokens)).div_ceil(64) * 64;
        let key = QuantKey { scratch: start, x: x.as_ptr() as usize, x_len: x.len(), n_tokens, vdt, set };
        quant_reused = same_x && prev.quant == Some(key);
        if quant_reused {
            // x as the previous matmul quantized it, still in place
            #[cfg(test)]
            REUSED.with(|c| c.set(c.get() + 1));
        } else if n_tokens == 1 || pool.n_threads() == 1 {
            for t in 0..n_tokens {
                quantize_token(t, sp.get());
            }
        } else {
            // guided runs of tokens (each thread's own share first): a static half each left
            // the caller waiting ~60 us a region for the worker in Gemma 3's prompts
            run_guided(pool, n_tokens, usize::MAX, &|_, ts| {
                for t in ts {
                    quantize_token(t, sp.get());
                }
            });
        }
        PREPARED.with(|c| c.set(Prepared { quant: Some(key), pack: None }));
        xscales = if nsc > 0 { unsafe { scratch.as_ptr().add(sc_off) as *const f32 } } else { std::ptr::null() };
        &scratch[..n_tokens * xrow]
    };

    let op = SyncPtr(out.as_mut_ptr());
    let wdata = w.data;
    let r0 = rows.start;

    if super::sgemm::applies(set, w.ty, n_in) {
        if let Some(k) = kern.sgemm {
            // F32 weights: register-blocked tiles in tinyBLAS's float order, for every
            // token count (see ops/sgemm.rs)
            // SAFETY: rows r0..r0 + n_rows of wdata, n_tokens rows of xq and the out rows
            // were checked above; `k` is the set's (kernel_set checked the CPU).
            unsafe {
                super::sgemm::run(pool, k, n_in, wdata.as_ptr().add(r0 * wrow), wrow, n_rows, xq.as_ptr(), xrow, n_tokens, op.get(), ld_out)
            };
            return Ok(());
        }
    }

    if let Some(k4) = x4 {
        // The x4 kernels, in claims of whole groups: one token as the multi-row kernels
        // below (each thread's own contiguous run first, guided claims); a decode step of a
        // few sequences in claims small enough to stay in L1, each group-block decoded
        // once for up to 4 tokens (the weights stream from memory once).
        let mut tn = X4_TN.with(|t| t.take());
        quant::repack::x4_offsets(w.ty, n_in, xq.as_ptr(), xrow, n_tokens, &mut tn);
        let (xs_addr, tn_addr) = (xscales as usize, tn.as_ptr() as usize);
        let run = |mine: Range<usize>| {
            // SAFETY: rows r0 + mine are inside wdata, whole groups from a group boundary or
            // the matrix's plain tail (`x4_kernel`); the tokens' activations, scales, offset
            // sums and out rows were checked or sized above.
            unsafe {
                k4(
                    n_in,
                    wdata.as_ptr().add((r0 + mine.start) * wrow),
                    wrow,
                    mine.len(),
                    xq.as_ptr(),
                    xrow,
                    xs_addr as *const f32,
                    nsc,
                    tn_addr as *const i32,
                    n_tokens,
                    op.get().add(mine.start),
                    ld_out,
                )
            };
        };
        let nth = pool.n_threads();
        // claims in units of the kernel's pass
        let u = quant::repack::x4_pass_rows(w.ty);
        // one token: the multi-row path's claims; more: L1-sized ones, each against every token
        let max = if n_tokens == 1 { single_token_chunk(n_rows, wrow, nth) / u } else { (X4_CHUNK_BYTES / (wrow * u)).max(1) };
        if nth == 1 && n_tokens == 1 {
            run(0..n_rows);
        } else {
            run_guided(pool, n_rows.div_ceil(u), max, &|_, c| run(c.start * u..(c.end * u).min(n_rows)));
        }
        // (the offset sums' buffer back for the next matmul on this thread: no allocation
        // per decode step)
        X4_TN.with(|t| t.replace(tn));
        return Ok(());
    }

    if n_tokens == 1 {
        if let Some(rows_k) = kern.rows {
            // Single token: one call per thread over all its rows (several weight rows per
            // pass break the per-row FMA chain; each element is still bit-identical to `one`).
            let xs_addr = xscales as usize; // a plain address so the closure stays Sync
            let run_rows = |mine: Range<usize>| {
                if !mine.is_empty() {
                    // SAFETY: rows r0 + mine are inside wdata (checked above); out row 0 has n_rows values.
                    unsafe {
                        rows_k(n_in, wdata.as_ptr().add((r0 + mine.start) * wrow), wrow, mine.len(), xq.as_ptr(), xs_addr as *const f32, op.get().add(mine.start))
                    };
                }
            };
            let nth = pool.n_threads();
            if nth == 1 {
                run_rows(0..n_rows);
                return Ok(());
            }
            // Each thread walks its own contiguous share in chunks (claimed from the front
            // of its range), then takes chunks from the back of the other threads' ranges:
            // a worker that starts its share late (it sees the region microseconds after the
            // caller) no longer leaves the caller spinning at the end (SmolLM2 tg, 2 threads:
            // 14% of the caller's samples were that wait), while each thread still streams
            // one contiguous run of weights (chunks dealt round-robin from one counter broke
            // the streams and bounced the counter between cores: 20% slower). The claims
            // are guided (`run_guided`): up to ~16 KiB of rows while much is left, one
            // 4-row pass at the end, so neither thread waits long for the other's last
            // claim (SmolLM2 tg, 2 threads: the threads' summed wait at region ends about
            // halved). Each row's result is the same whoever computes it.
            let max = single_token_chunk(n_rows, wrow, nth) / PASS_ROWS;
            run_guided(pool, n_rows.div_ceil(PASS_ROWS), max, &|_, c| run_rows(c.start * PASS_ROWS..(c.end * PASS_ROWS).min(n_rows)));
            return Ok(());
        }
    }


    #[cfg(target_arch = "x86_64")]
    if let Some(pk) = kern.packed.filter(|_| packed_bytes(kern, n_in, n_tokens) > 0) {
        use quant::avx2::{pack_q8_0_cols, pack_q8_0_lanes, pack_q8_1_cols, pack_q8_1_lanes, PACK_COLS};
        let rest = n_tokens % PACK_COLS;
        let full = pk.cols[PACK_COLS];
        let last = if rest > 0 { pk.cols[rest] } else { full };
        let pair_full = pk.pair[PACK_COLS];
        let pair_last = if rest > 0 { pk.pair[rest] } else { pair_full };
        if let (Some(full), Some(last)) = (full, last) {
            // Groups of PACK_COLS tokens in the packed layout (see `pack_q8_0_cols`),
            // after the rows and scales in scratch; the last group holds the remaining
            // n_tokens % PACK_COLS tokens (all of them for a batch of 2..7 sequences
            // decoding together) and takes the kernel of that many columns.
            let nb = n_in / 32;
            let n_groups = n_tokens.div_ceil(PACK_COLS);
            // the interleaved row pairs' kernels (see the loop), which take precedence over
            // the two-row ones below
            let pairs_dec = pairs_path(kern, n_in, n_tokens);
            let gbytes = nb * pairs_dec.map_or(pk.block_bytes, |pd| pd.pack_block);
            let off = pk.offset;
            // a column-lane kernel (from one full group on: it computes all 8 lanes): groups
            // packed in its layout, weight rows decoded once per matmul (see `lanes_rows`)
            // (the interleaved pairs, where they apply, take precedence)
            let lanes = pk.lanes.filter(|_| n_tokens >= PACK_COLS && pairs_dec.is_none());
            // prefill's two-row kernels over rows decoded once per matmul (see the loop);
            // not in a decode step of up to ROW_OUTER_GROUPS groups, whose weight rows
            // stream from memory once, prefetched (--bench batched, one thread, Gemma 3's
            // Q8_0 output at 12 / 16 tokens: 37.0 / 43.1 ms raw, 40.7 / 48.5 decoded)
            let pair_dec = pk.pair_decoded.filter(|_| lanes.is_none() && n_groups > ROW_OUTER_GROUPS);
            let sp = SyncPtr(scratch.as_mut_ptr());
            let xs_addr = xscales as usize;
            let pack_group = |g: usize| {
                let t = g * PACK_COLS;
                let nc = (n_tokens - t).min(PACK_COLS);
                // SAFETY: group g's rows, scales and packed bytes lie inside scratch
                // (sized above); each group's packed bytes are written by one thread.
                unsafe {
                    let base = sp.get();
                    let xd = (xs_addr as *const f32).add(t * nsc);
                    let (x, dst) = (base.add(t * xrow), base.add(pack_off + g * gbytes));
                    if let Some(pd) = pairs_dec {
                        (pd.pack)(nb, nc, x, xrow, xd, nsc, dst);
                        return;
                    }
                    match (vdt == GgmlType::Q8_1, lanes.is_some()) {
                        (true, false) => pack_q8_1_cols(nb, nc, x, xrow, xd, nsc, dst),
                        (true, true) => pack_q8_1_lanes(nb, nc, x, xrow, xd, nsc, dst),
                        (false, false) => pack_q8_0_cols(nb, nc, x, xrow, xd, nsc, off, dst),
                        (false, true) => pack_q8_0_lanes(nb, nc, x, xrow, xd, nsc, off, dst),
                    }
                }
            };
            let pack_kind = match pairs_dec {
                Some(pd) => pd.pack as usize,
                None => (vdt == GgmlType::Q8_1) as usize * 2 + lanes.is_some() as usize,
            };
            let pkey = PackKey { kind: pack_kind, off: if pairs_dec.is_some() { 0 } else { off }, gbytes };
            if quant_reused && prev.pack == Some(pkey) {
                // the groups as the previous matmul packed them from the same quantized x
            } else if n_groups == 1 || pool.n_threads() == 1 {
                (0..n_groups).for_each(pack_group);
            } else {
                run_guided(pool, n_groups, usize::MAX, &|_, gs| gs.for_each(pack_group));
            }
            PREPARED.with(|c| c.set(Prepared { quant: c.get().quant, pack: Some(pkey) }));
            let xp = SyncPtr(scratch.as_mut_ptr());
            // One (row, group) product: the kernel writes nc <= PACK_COLS values into tmp,
            // which go to the group's output rows.
            let row_group = |r: usize, g: usize, tmp: &mut [f32; PACK_COLS]| {
                let gp = unsafe { xp.get().add(pack_off + g * gbytes) as *const u8 };
                let t = g * PACK_COLS;
                let nc = (n_tokens - t).min(PACK_COLS);
                let k = if nc == PACK_COLS { full } else { last };
                // SAFETY: row r + r0 < n_out (checked); out in bounds (checked); the
                // kernel writes nc <= PACK_COLS values into tmp.
                unsafe {
                    k(nb, wdata.as_ptr().add((r0 + r) * wrow), gp, tmp.as_mut_ptr());
                    for (c, v) in tmp[..nc].iter().enumerate() {
                        *op.get().add((t + c) * ld_out + r) = *v;
                    }
                }
            };
            // Eight rows r..r + 8 of one group: the kernel's results in a tile, stored
            // transposed (`store_tile_8x8`: the output is per token).
            let row_tile = |r: usize, g: usize| {
                let gp = unsafe { xp.get().add(pack_off + g * gbytes) as *const u8 };
                let t = g * PACK_COLS;
                let nc = (n_tokens - t).min(PACK_COLS);
                let k = if nc == PACK_COLS { full } else { last };
                // SAFETY: rows r0 + r..r0 + r + 8 < n_out (the callers' ranges); out in
                // bounds (checked); the kernel writes nc <= PACK_COLS values per row.
                unsafe { tile_rows(op.get().add(t * ld_out + r), ld_out, nc, |i, dst| k(nb, wdata.as_ptr().add((r0 + r + i) * wrow), gp, dst)) };
            };
            // Chunks of rows (whole decode blocks / 8-row tiles) claimed per thread from
            // its own contiguous share first, then from the back of the others' (see
            // `StealRanges`): a thread that starts late does less instead of being waited for.
            // The claims are guided (`run_guided`): up to chunk_rows rows, one 8-row tile
            // at the end (a prefill chunk of Gemma 3's was ~0.4 ms of work to wait for).
            let decoded_bytes = lanes.map(|ln| ln.block_bytes).or(pairs_dec.map(|pd| pd.block_bytes)).or(pair_dec.map(|pd| pd.block_bytes));
            let chunk_rows = packed_chunk_rows(n_rows, wrow, pool.n_threads(), n_groups <= ROW_OUTER_GROUPS, decoded_bytes.map(|b| lanes_rows(nb, b)));
            // thread ith's area of decoded rows (after the packed groups, see `rb_bytes`), and
            // the decoded bytes per row, for rows of `block_bytes` decoded bytes per block
            let decoded_area = |ith: usize, block_bytes: usize| {
                // SAFETY: scratch was sized for nth areas of lanes_area bytes (rb_bytes);
                // each thread writes only its own
                (unsafe { (rb_base as *mut u8).add(ith * lanes_area(nb, block_bytes)) }, nb * block_bytes)
            };
            // rows `rows` (a decoded block) decoded into `area`, dbytes apart
            let decode_rows = |decode: quant::table::DecodeRowFn, rows: Range<usize>, area: *mut u8, dbytes: usize| {
                for r in rows.clone() {
                    // SAFETY: row r0 + r < n_out; its decoded bytes fit the area (the block
                    // is at most lanes_area's rows)
                    unsafe { decode(nb, wdata.as_ptr().add((r0 + r) * wrow), area.add((r - rows.start) * dbytes)) };
                }
            };
            run_guided(pool, n_rows.div_ceil(8), chunk_rows / 8, &|ith, u| {
                let mut tmp = [0f32; PACK_COLS];
                let mine = u.start * 8..(u.end * 8).min(n_rows);
                if let Some(ln) = lanes {
                    // column lanes: blocks of `lanes_rows` rows decoded into the thread's
                    // area (after the packed groups, see `rb_bytes`), then every group
                    // against each decoded row; a decode step of up to ROW_OUTER_GROUPS
                    // groups LANES_STEP_ROWS rows at a time (each weight row read from
                    // memory once for all groups, as below)
                    let rows_per = if n_groups <= ROW_OUTER_GROUPS { LANES_STEP_ROWS } else { lanes_rows(nb, ln.block_bytes) };
                    let (area, dbytes) = decoded_area(ith, ln.block_bytes);
                    let mut rb = mine.start;
                    while rb < mine.end {
                        let re = (rb + rows_per).min(mine.end);
                        decode_rows(ln.decode, rb..re, area, dbytes);
                        for g in 0..n_groups {
                            let (t, nc) = (g * PACK_COLS, (n_tokens - g * PACK_COLS).min(PACK_COLS));
                            // SAFETY: group g's packed bytes are in scratch; rows r0 + r <
                            // n_out; the kernel writes PACK_COLS values to tmp; out in
                            // bounds (checked)
                            unsafe {
                                let gp = xp.get().add(pack_off + g * gbytes) as *const u8;
                                // 8 rows at a time into a tile, stored transposed (the
                                // output is per token); the rest one row at a time
                                let mut r = rb;
                                while r + 8 <= re {
                                    tile_rows(op.get().add(t * ld_out + r), ld_out, nc, |i, dst| (ln.dot)(nb, area.add((r + i - rb) * dbytes), gp, dst));
                                    r += 8;
                                }
                                for r in r..re {
                                    (ln.dot)(nb, area.add((r - rb) * dbytes), gp, tmp.as_mut_ptr());
                                    for (c, v) in tmp[..nc].iter().enumerate() {
                                        *op.get().add((t + c) * ld_out + r) = *v;
                                    }
                                }
                            }
                        }
                        rb = re;
                    }
                } else if let Some(pd) = pairs_dec {
                    // the AVX-512 set's signed 32-element types in prefill: blocks of rows
                    // decoded as interleaved pairs into the thread's area (an odd last row
                    // pairs with itself), then every group against 4 rows at a time (the
                    // rest as one pair, a last row through tmp)
                    let rows_per = (lanes_rows(nb, pd.block_bytes) & !3).max(4);
                    let (area, dbytes) = decoded_area(ith, pd.block_bytes);
                    let mut tmp2 = [0f32; 2 * PACK_COLS];
                    let mut rb = mine.start;
                    while rb < mine.end {
                        let re = (rb + rows_per).min(mine.end);
                        let mut r = rb;
                        while r < re {
                            let r1 = (r + 1).min(re - 1);
                            // SAFETY: rows r0 + r, r0 + r1 < n_out; the pair's 2 * dbytes
                            // fit the area (rows_per rows at most, see lanes_area)
                            unsafe { (pd.decode)(nb, wdata.as_ptr().add((r0 + r) * wrow), wdata.as_ptr().add((r0 + r1) * wrow), area.add((r - rb) * dbytes)) };
                            r += 2;
                        }
                        for g in 0..n_groups {
                            let (t, nc) = (g * PACK_COLS, (n_tokens - g * PACK_COLS).min(PACK_COLS));
                            let (two, one) = (pd.two[nc].expect("pair kernels of every column count"), pd.one[nc].expect("pair kernels of every column count"));
                            // SAFETY: group g's packed bytes are in scratch; the pairs at
                            // r - rb (even) were decoded into the area; the kernels write nc
                            // values of rows r..r + 4 (or + 2, < re) at stride ld_out (out in
                            // bounds: checked), or to tmp2 for a last odd row
                            unsafe {
                                let gp = xp.get().add(pack_off + g * gbytes) as *const u8;
                                let o = op.get().add(t * ld_out);
                                let mut r = rb;
                                while r + 4 <= re {
                                    two(nb, area.add((r - rb) * dbytes), area.add((r + 2 - rb) * dbytes), gp, o.add(r), ld_out);
                                    r += 4;
                                }
                                if r + 2 <= re {
                                    let w = area.add((r - rb) * dbytes);
                                    one(nb, w, w, gp, o.add(r), ld_out);
                                    r += 2;
                                }
                                if r < re {
                                    let w = area.add((r - rb) * dbytes);
                                    one(nb, w, w, gp, tmp2.as_mut_ptr(), 2);
                                    for c in 0..nc {
                                        *o.add(c * ld_out + r) = tmp2[2 * c];
                                    }
                                }
                            }
                        }
                        rb = re;
                    }
                } else if let Some(pd) = pair_dec {
                    // the AVX-512 set's 32-element types in prefill: blocks of `lanes_rows` rows
                    // decoded into the thread's area (as the column lanes' above), then every
                    // group against pairs of decoded rows (an odd last row pairs with itself)
                    let rows_per = (lanes_rows(nb, pd.block_bytes) & !1).max(2);
                    let (area, dbytes) = decoded_area(ith, pd.block_bytes);
                    let mut tmp_b = [0f32; PACK_COLS];
                    let mut rb = mine.start;
                    while rb < mine.end {
                        let re = (rb + rows_per).min(mine.end);
                        decode_rows(pd.decode, rb..re, area, dbytes);
                        for g in 0..n_groups {
                            let (t, nc) = (g * PACK_COLS, (n_tokens - g * PACK_COLS).min(PACK_COLS));
                            let k = pd.cols[nc].expect("decoded two-row kernels of every column count");
                            let mut r = rb;
                            while r < re {
                                let r1 = (r + 1).min(re - 1);
                                // SAFETY: group g's packed bytes are in scratch; rows r, r1
                                // were decoded into the area; the kernel writes nc values of
                                // rows r, r + 1 (< re) at stride ld_out (out in bounds:
                                // checked), or to each tmp for an odd last row
                                unsafe {
                                    let gp = xp.get().add(pack_off + g * gbytes) as *const u8;
                                    let (wa, wb) = (area.add((r - rb) * dbytes), area.add((r1 - rb) * dbytes));
                                    if r1 > r {
                                        // straight into the output rows r, r + 1
                                        let o = op.get().add(t * ld_out + r);
                                        k(nb, wa, wb, gp, o, o.add(1), ld_out);
                                    } else {
                                        k(nb, wa, wb, gp, tmp.as_mut_ptr(), tmp_b.as_mut_ptr(), 1);
                                        for c in 0..nc {
                                            *op.get().add((t + c) * ld_out + r) = tmp[c];
                                        }
                                    }
                                }
                                r += 2;
                            }
                        }
                        rb = re;
                    }
                } else if n_groups <= ROW_OUTER_GROUPS {
                    // a decode step of 9..32 sequences: every group's packed activations
                    // fit L1 together, so each weight row is read from memory once for
                    // all groups (group-outer would stream a large matrix, the output
                    // projection, once per group); in the AVX-512 set two rows per call
                    // (one per zmm half: half the instructions per column and block)
                    let mut r = mine.start;
                    if let (Some(pf), Some(pl)) = (pair_full, pair_last) {
                        while r + 1 < mine.end {
                            for g in 0..n_groups {
                                let (t, nc) = (g * PACK_COLS, (n_tokens - g * PACK_COLS).min(PACK_COLS));
                                let pk = if nc == PACK_COLS { pf } else { pl };
                                // SAFETY: rows r0 + r, r0 + r + 1 < n_out; group g's packed
                                // bytes are in scratch; the kernel writes nc values of rows
                                // r, r + 1 at stride ld_out (out in bounds: checked)
                                unsafe {
                                    let gp = xp.get().add(pack_off + g * gbytes) as *const u8;
                                    let wa = wdata.as_ptr().add((r0 + r) * wrow);
                                    let o = op.get().add(t * ld_out + r);
                                    pk(nb, wa, wa.add(wrow), gp, o, o.add(1), ld_out);
                                }
                            }
                            r += 2;
                        }
                    }
                    while r + 8 <= mine.end {
                        for g in 0..n_groups {
                            row_tile(r, g);
                        }
                        r += 8;
                    }
                    for r in r..mine.end {
                        for g in 0..n_groups {
                            row_group(r, g, &mut tmp);
                        }
                    }
                } else {
                    // group-outer: the group's packed activations (nb * PACK_BLOCK bytes)
                    // stay in L1 while the thread's weight rows stream from L2 (blocks of
                    // rows that fit L1 with the group measured the same)
                    for g in 0..n_groups {
                        let mut r = mine.start;
                        let (t, nc) = (g * PACK_COLS, (n_tokens - g * PACK_COLS).min(PACK_COLS));
                        if let Some(pk) = if nc == PACK_COLS { pair_full } else { pair_last } {
                            // the AVX-512 set: two rows per call (one per zmm half)
                            let gp = unsafe { xp.get().add(pack_off + g * gbytes) as *const u8 };
                            while r + 1 < mine.end {
                                // SAFETY: rows r0 + r, r0 + r + 1 < n_out; the kernel writes
                                // nc values of rows r, r + 1 at stride ld_out (out in bounds:
                                // checked)
                                unsafe {
                                    let wa = wdata.as_ptr().add((r0 + r) * wrow);
                                    let o = op.get().add(t * ld_out + r);
                                    pk(nb, wa, wa.add(wrow), gp, o, o.add(1), ld_out);
                                }
                                r += 2;
                            }
                        }
                        while r + 8 <= mine.end {
                            row_tile(r, g);
                            r += 8;
                        }
                        for r in r..mine.end {
                            row_group(r, g, &mut tmp);
                        }
                    }
                }
            });
            return Ok(());
        }
    }

    // SIMD sets (AVX2 / AVX-512 on x86-64, NEON on aarch64): raw kernels, tiled over tokens.
    if set.is_simd() {
        if let Some(tl) = kern.tiled_for(n_tokens) {
            let (one, many, tile) = (tl.one(), tl.many(), tl.width);
            const MAX_TILE: usize = quant::MAX_TILE;
            // Tokens are processed in chunks whose activations stay in L1/L2 while the
            // thread walks its weight rows; within a chunk each weight row is decoded once
            // per `tile` tokens.
            let chunk = (TOKEN_CHUNK_BYTES / xrow).clamp(tile, 256) / tile * tile;
            // cols[nc]: the nc-token kernel for 2 <= nc < tile (see `quant::cols_kernel`)
            let mut cols: [Option<quant::DotN>; MAX_TILE] = [None; MAX_TILE];
            for (nc, c) in cols.iter_mut().enumerate().take(tile).skip(2) {
                *c = tl.mid(nc);
            }
            let xs_addr = xscales as usize; // a plain address so the closure stays Sync
            let xsc = |t: usize| -> *const f32 {
                if xs_addr == 0 {
                    std::ptr::null()
                } else {
                    (xs_addr as *const f32).wrapping_add(t * nsc)
                }
            };
            let tiled_rows = |mine: Range<usize>| {
                let mut t0 = 0;
                while t0 < n_tokens {
                    let t1 = (t0 + chunk).min(n_tokens);
                    for r in mine.clone() {
                        let wr = &wdata[(r0 + r) * wrow..(r0 + r + 1) * wrow];
                        let mut t = t0;
                        let mut tmp = [0f32; MAX_TILE];
                        while t + tile <= t1 {
                            // SAFETY: rows of wrow/xrow bytes checked above; out in bounds;
                            // the kernel writes `tile` <= MAX_TILE values into tmp.
                            unsafe {
                                many(n_in, wr.as_ptr(), xq.as_ptr().add(t * xrow), xrow, xsc(t), nsc, tmp.as_mut_ptr());
                                for (c, v) in tmp[..tile].iter().enumerate() {
                                    *op.get().add((t + c) * ld_out + r) = *v;
                                }
                            }
                            t += tile;
                        }
                        if t + 1 < t1 {
                            if let Some(k) = cols[t1 - t] {
                                // the 2..tile - 1 tokens left at once (a batch of sequences
                                // decoding one token each is all "left over")
                                // SAFETY: as for the tile; t1 - t < tile <= MAX_TILE values.
                                unsafe {
                                    k(n_in, wr.as_ptr(), xq.as_ptr().add(t * xrow), xrow, xsc(t), nsc, tmp.as_mut_ptr());
                                    for (c, v) in tmp[..t1 - t].iter().enumerate() {
                                        *op.get().add((t + c) * ld_out + r) = *v;
                                    }
                                }
                                t = t1;
                            }
                        }
                        while t < t1 {
                            unsafe { one(n_in, wr.as_ptr(), xq.as_ptr().add(t * xrow), 0, xsc(t), 0, op.get().add(t * ld_out + r)) };
                            t += 1;
                        }
                    }
                    t0 = t1;
                }
            };
            if let Some(rb) = kern.row_block {
                if n_tokens >= rb.min_tokens && n_rows >= rb.rows {
                    // K-quant prefill: blocks of RB rows repacked once per matmul into the
                    // thread's scratch area (after the activations), all tokens against
                    // each block; the last n_rows % rb.rows rows take the tiles above
                    let nsb = n_in / 256;
                    let area = (nsb * rb.sb_bytes).div_ceil(64) * 64;
                    let bp = SyncPtr(rb_base as *mut u8);
                    let nrb = n_rows / rb.rows;
                    // row blocks claimed per thread (`run_chunks`); chunk nrb: the rows
                    // after the last whole block, through the tiles
                    run_chunks(pool, nrb + 1, &|ith, b| {
                        if b == nrb {
                            tiled_rows(nrb * rb.rows..n_rows);
                            return;
                        }
                        // SAFETY: scratch was sized for nth areas (rb_bytes); each thread
                        // writes only its own
                        let buf = unsafe { bp.get().add(ith * area) };
                        let r = b * rb.rows;
                        // SAFETY: rows r0 + r .. + rb.rows are inside wdata; the kernels
                        // write rb.rows values of each of their nc token rows of out (checked
                        // above); the kernel set was checked for this CPU
                        unsafe {
                            (rb.repack)(nsb, wdata.as_ptr().add((r0 + r) * wrow), wrow, buf);
                            let mut t = 0;
                            while t < n_tokens {
                                let nc = (n_tokens - t).min(rb.tile);
                                let k = rb.cols[nc].expect("row-block kernels for 1..=tile columns");
                                k(nsb, buf, xq.as_ptr().add(t * xrow), xrow, op.get().add(t * ld_out + r), ld_out);
                                t += nc;
                            }
                        }
                    });
                    return Ok(());
                }
            }
            // rows in chunks claimed per thread (own share first, then the back of the
            // others': `StealRanges`, guided down to one 8-row tile at the end); several
            // tokens: claims of at least 64 rows until the tail (each walks the tokens again)
            let chunk_rows = packed_chunk_rows(n_rows, wrow, pool.n_threads(), n_tokens == 1, None);
            run_guided(pool, n_rows.div_ceil(8), chunk_rows / 8, &|_, u| tiled_rows(u.start * 8..(u.end * 8).min(n_rows)));
            return Ok(());
        }
    }

    pool.run(&|ith, nth| {
        let mine = split_range(n_rows, ith, nth);
        for r in mine {
            let wr = &wdata[(r0 + r) * wrow..(r0 + r + 1) * wrow];
            for t in 0..n_tokens {
                let v = dot(n_in, wr, &xq[t * xrow..(t + 1) * xrow]);
                // SAFETY: (t, r) is written by the one thread that owns row r; in bounds
                // by the length check above.
                unsafe { *op.get().add(t * ld_out + r) = v };
            }
        }
    });
    Ok(())
}

/// Rows per chunk of a single-token matmul over several threads: ~16 KiB of weights, at
/// most 64 chunks per thread (a large matrix: fewer claims) and at least one, a multiple
/// of 4 rows (the multi-row kernels' pass).
fn single_token_chunk(n_rows: usize, wrow: usize, nth: usize) -> usize {
    let n_chunks = (n_rows * wrow / (16 << 10)).clamp(nth, 64 * nth);
    n_rows.div_ceil(n_chunks).next_multiple_of(4).max(4)
}

/// Rows per claimed chunk of the packed / column-lane paths: a decode step (few groups)
/// as a single-token matmul's chunks, rounded to whole 8-row tiles; prefill over decoded
/// rows (the column lanes, the decoded pairs) about PREFILL_CHUNKS chunks per thread of
/// whole tiles, at most a decoded block (`lanes_rows`, rounded down to a tile), so a small
/// matrix splits evenly too (Gemma 3's k and v, 256 rows: once 3 chunks of 91 rows for 2
/// threads, one thread doing two); other prefill at least 64 rows (each chunk re-reads a
/// group's packed activations).
fn packed_chunk_rows(n_rows: usize, wrow: usize, nth: usize, step: bool, lanes: Option<usize>) -> usize {
    let base = single_token_chunk(n_rows, wrow, nth).next_multiple_of(8);
    match (step, lanes) {
        (true, _) => base,
        (false, Some(lr)) => n_rows.div_ceil(PREFILL_CHUNKS * nth).next_multiple_of(8).min((lr / 8 * 8).max(8)),
        (false, None) => base.max(64),
    }
}

/// Chunks per thread of a prefill matmul over decoded rows (see `packed_chunk_rows`).
const PREFILL_CHUNKS: usize = 8;

/// One product of a fused single-token region (`matmul_single_fused`): rows `rows` of `w`
/// times the token's activations into `out` (`rows.len()` values).
pub struct FusedPart<'w, 'o> {
    pub w: &'w TensorView<'w>,
    pub rows: Range<usize>,
    pub out: &'o mut [f32],
}

/// The most products one fused region takes (q, k and v).
pub const MAX_FUSED: usize = 3;

/// Several single-token products of the same activations `x` (q, k and v; gate and up) in
/// one parallel region instead of one region each: the activations are quantized once per
/// vec_dot type, and every part's rows (in 4-row passes, claims guided up to
/// `single_token_chunk`) are claimed from one `StealRanges`, so a thread that finishes its share of one matrix goes on to the next
/// instead of waiting at a barrier. Each row gets the single-token multi-row kernel's
/// operations, as in `matmul_with` (bit-identical). Returns Ok(false), having done nothing,
/// where the fused path does not apply (one thread, more than MAX_FUSED parts, a type
/// without multi-row kernels, F32 tiles, a shape `matmul_with` would reject): the caller
/// then runs the parts one by one.
pub fn matmul_single_fused(pool: &ThreadPool, parts: &mut [FusedPart], x: &[f32], scratch: &mut Vec<u8>) -> Result<bool> {
    matmul_single_fused_with(pool, kernel_set(), parts, x, scratch)
}

/// `matmul_single_fused` with an explicit kernel set.
pub fn matmul_single_fused_with(pool: &ThreadPool, set: KernelSet, parts: &mut [FusedPart], x: &[f32], scratch: &mut Vec<u8>) -> Result<bool> {
    // (it writes scratch in a layout of its own: no later `matmul_on_same_x` may take it)
    PREPARED.with(|c| c.set(Prepared::NONE));
    #[derive(Clone, Copy)]
    struct Prep {
        k: quant::DotRows,
        // an x4 weight's kernel and its type (its offset sums are made after quantizing)
        k4: Option<(quant::repack::X4Cols, GgmlType)>,
        w: usize, // address of the part's first row
        wrow: usize,
        n_rows: usize,
        unit: usize,  // rows per chunk
        first: usize, // its first chunk in the region's numbering
        xq: usize,    // offset of its quantized activations in scratch
        xs: Option<usize>,
        out: usize,
    }
    let nth = pool.n_threads();
    let n_in = x.len();
    if nth == 1 || parts.len() < 2 || parts.len() > MAX_FUSED || n_in == 0 {
        return Ok(false);
    }
    let table = quant::table::table(set);
    // per distinct vec_dot type: (type, offset, scale offset or none)
    let mut quants: [(GgmlType, usize, Option<usize>); MAX_FUSED] = [(GgmlType::F32, 0, None); MAX_FUSED];
    let mut n_quants = 0;
    let mut size = 0usize;
    let mut preps: [Option<Prep>; MAX_FUSED] = [None; MAX_FUSED];
    // chunks of each part's `unit` rows (PASS_ROWS, an x4 part its kernel's pass), numbered
    // across the parts; a claim takes at most the smallest part's `single_token_chunk`
    let mut n_chunks = 0;
    let mut max_claim = usize::MAX;
    for (i, p) in parts.iter_mut().enumerate() {
        let w = p.w;
        let kern = table.get(w.ty);
        let (k, k4) = match w.layout {
            Layout::Plain => (kern.rows, None),
            Layout::X4 => (kern.rows, x4_kernel(set, w.ty, &p.rows, w.n_rows(), 1)),
        };
        let Some(k) = k else { return Ok(false) };
        if w.layout == Layout::X4 && k4.is_none() {
            return Ok(false);
        }
        let Ok(wrow) = quant::row_bytes(w.ty, n_in) else { return Ok(false) };
        let vdt = kern.vec_dot_type;
        if w.ne[0] != n_in
            || w.data.len() < wrow * w.n_rows()
            || p.rows.start >= p.rows.end
            || p.rows.end > w.n_rows()
            || p.out.len() < p.rows.len()
            || vdt == GgmlType::F32
            || super::sgemm::applies(set, w.ty, n_in)
            || table.get(vdt).quantize_act.is_none()
        {
            return Ok(false);
        }
        let q = match quants[..n_quants].iter().position(|q| q.0 == vdt) {
            Some(q) => q,
            None => {
                let Ok(xrow) = quant::row_bytes(vdt, n_in) else { return Ok(false) };
                let nsc = act_scale_count(vdt, set, n_in);
                let sc = size + xrow.div_ceil(4) * 4;
                quants[n_quants] = (vdt, size, (nsc > 0).then_some(sc));
                size = (sc + nsc * 4).div_ceil(64) * 64;
                n_quants += 1;
                n_quants - 1
            }
        };
        let n_rows = p.rows.len();
        let unit = if k4.is_some() { quant::repack::x4_pass_rows(w.ty) } else { PASS_ROWS };
        max_claim = max_claim.min(single_token_chunk(n_rows, wrow, nth) / unit);
        preps[i] = Some(Prep {
            k,
            k4: k4.map(|k4| (k4, w.ty)),
            w: w.data.as_ptr() as usize + p.rows.start * wrow,
            wrow,
            n_rows,
            unit,
            first: n_chunks,
            xq: quants[q].1,
            xs: quants[q].2,
            out: p.out.as_mut_ptr() as usize,
        });
        n_chunks += n_rows.div_ceil(unit);
    }
    scratch.resize(size.max(scratch.len()), 0);
    for &(vdt, off, sc) in &quants[..n_quants] {
        let xrow = quant::row_bytes(vdt, n_in)?;
        let (head, tail) = scratch[off..].split_at_mut(xrow);
        (table.get(vdt).quantize_act.expect("checked above"))(x, head);
        if let Some(sc) = sc {
            let nsc = act_scale_count(vdt, set, n_in);
            // the scales' offset is 4-aligned past the row, inside `tail`
            let at = sc - off - xrow;
            fill_scales(vdt, head, nsc, tail[at..at + nsc * 4].as_mut_ptr() as *mut f32, set);
        }
    }
    let base = scratch.as_mut_ptr() as usize;
    // the x4 parts' offset sums, once for the region: only Q5_0 has them, and its parts
    // share one quantization of x (one `quants` entry per activation type)
    let mut tn = X4_TN.with(|t| t.take());
    if let Some(Prep { xq, .. }) = preps.iter().flatten().find(|p| p.k4.is_some_and(|k| k.1 == GgmlType::Q5_0)) {
        quant::repack::x4_offsets(GgmlType::Q5_0, n_in, (base + xq) as *const u8, 0, 1, &mut tn);
    }
    let tn_addr = tn.as_ptr() as usize;
    let preps = &preps[..parts.len()];
    run_guided(pool, n_chunks, max_claim, &|_, run| {
        // a run may span parts: each part's share of it in one kernel call
        for p in preps.iter().flatten() {
            let (lo, hi) = (run.start.max(p.first), run.end.min(p.first + p.n_rows.div_ceil(p.unit)));
            if lo >= hi {
                continue;
            }
            let start = (lo - p.first) * p.unit;
            let len = ((hi - p.first) * p.unit).min(p.n_rows) - start;
            let xs = p.xs.map_or(std::ptr::null(), |s| (base + s) as *const f32);
            if let Some((k4, _)) = p.k4 {
                // SAFETY: as below; the part's rows start on a group boundary (`x4_kernel`; its
                // chunks are whole passes of groups) and its offset sums (Q5_0's) are at tn_addr.
                unsafe {
                    k4(
                        n_in,
                        (p.w + start * p.wrow) as *const u8,
                        p.wrow,
                        len,
                        (base + p.xq) as *const u8,
                        0,
                        xs,
                        0,
                        tn_addr as *const i32,
                        1,
                        (p.out as *mut f32).add(start),
                        0,
                    )
                };
                continue;
            }
            // SAFETY: rows start..start + len of the part are inside its weight data and its
            // out slice (checked above); its activations and scales are in scratch.
            unsafe {
                (p.k)(
                    n_in,
                    (p.w + start * p.wrow) as *const u8,
                    p.wrow,
                    len,
                    (base + p.xq) as *const u8,
                    p.xs.map_or(std::ptr::null(), |s| (base + s) as *const f32),
                    (p.out as *mut f32).add(start),
                )
            };
        }
    });
    X4_TN.with(|t| t.replace(tn));
    Ok(true)
}

/// Runs `f(ith, c)` for every chunk c in 0..n_chunks on the pool: thread ith takes the
/// chunks of its own contiguous share first, then from the back of the others' shares
/// (`StealRanges`), so a thread that starts late does less instead of being waited for.
fn run_chunks(pool: &ThreadPool, n_chunks: usize, f: &(dyn Fn(usize, usize) + Sync)) {
    let ranges = StealRanges::new(n_chunks, pool.n_threads());
    pool.run(&|ith, _| {
        while let Some(c) = ranges.claim(ith) {
            f(ith, c);
        }
    });
}

/// Runs `f(ith, r)` over runs r of chunks covering 0..n_chunks on the pool, each run at
/// most `max` chunks: as `run_chunks` (own share from the front, then the others' from the
/// back), with the runs guided (`StealRanges::claim_up_to`): long while much is left, one
/// chunk at the end.
pub(crate) fn run_guided(pool: &ThreadPool, n_chunks: usize, max: usize, f: &(dyn Fn(usize, Range<usize>) + Sync)) {
    let ranges = StealRanges::new(n_chunks, pool.n_threads());
    pool.run(&|ith, _| {
        while let Some(r) = ranges.claim_up_to(ith, max) {
            f(ith, r);
        }
    });
}

/// Rows per chunk of the guided single-token matmuls (`run_guided`): the multi-row kernels'
/// pass. A claim takes up to `single_token_chunk` rows (~16 KiB of weights) while much is
/// left and one pass at the end.
const PASS_ROWS: usize = 4;

/// Weight bytes per chunk of the x4 path over a few tokens (each chunk is read from memory
/// once and from L1 for the other tokens).
const X4_CHUNK_BYTES: usize = 16 * 1024;


/// The x4 kernel for rows `rows` of an x4 weight of `n_out` rows and `ty`, if
/// it applies: the AVX-512 set (whose multi-row kernels have the same float order), at most
/// `repack::x4_max_tokens` tokens, and rows from a group boundary to a group boundary or the
/// end.
fn x4_kernel(set: KernelSet, ty: GgmlType, rows: &Range<usize>, n_out: usize, n_tokens: usize) -> Option<quant::repack::X4Cols> {
    let g = quant::repack::GROUP;
    let aligned = rows.start.is_multiple_of(g) && (rows.end.is_multiple_of(g) || rows.end == n_out);
    let table_rows = quant::table::table(set).get(ty).rows;
    (set == KernelSet::Avx512 && aligned && n_tokens <= quant::repack::x4_max_tokens(ty) && table_rows.is_some())
        .then(|| quant::repack::x4_kernel(ty))
        .flatten()
}

thread_local! {
    /// `matmul_unpacked`'s plain rows (grown, never shrunk).
    static UNPACKED: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    /// The x4 kernels' offset sums (`quant::repack::x4_offsets`), reused across matmuls.
    static X4_TN: std::cell::Cell<Vec<i32>> = const { std::cell::Cell::new(Vec::new()) };
}

/// Bytes of an x4 weight unpacked at a time by `matmul_unpacked`: a large matrix (a 7B
/// model's Q5_0 FFN projection, 14336 x 4096: 40 MB) in pieces, so the thread-local buffer
/// stays this size instead of a copy of the largest matrix.
const UNPACK_CHUNK_BYTES: usize = 8 << 20;

/// A matmul of an x4 weight where its kernels do not apply (a prompt, another kernel set,
/// rows not on group boundaries): the groups covering `rows` unpacked to plain rows (on the
/// pool, UNPACK_CHUNK_BYTES at a time), then the plain paths. The same bits: every path
/// computes each element as the single-token kernel does.
#[allow(clippy::too_many_arguments)]
fn matmul_unpacked(
    pool: &ThreadPool,
    set: KernelSet,
    w: &TensorView,
    x: &[f32],
    n_tokens: usize,
    out: &mut [f32],
    ld_out: usize,
    rows: Range<usize>,
    scratch: &mut Vec<u8>,
    same_x: bool,
) -> Result<()> {
    let g = quant::repack::GROUP;
    let n_out = w.n_rows();
    let wrow = quant::row_bytes(w.ty, w.ne[0])?;
    // rows per piece: whole groups, and whole 8-row blocks of the prefill kernels
    let step = (UNPACK_CHUNK_BYTES / wrow.max(1) / 8 * 8).max(8);
    let mut c0 = rows.start;
    let mut same_x = same_x;
    while c0 < rows.end {
        let c1 = if c0 / g * g + step < rows.end { c0 / g * g + step } else { rows.end };
        let (g0, g1) = (c0 / g * g, c1.next_multiple_of(g).min(n_out));
        let src = &w.data[g0 * wrow..g1 * wrow];
        UNPACKED.with(|u| {
            let mut buf = u.borrow_mut();
            if buf.len() < src.len() {
                buf.resize(src.len(), 0);
            }
            let dst = SyncPtr(buf.as_mut_ptr());
            // whole groups per thread (the tail, if any, is plain and copied by the last)
            let n_groups = (g1 - g0).div_ceil(g);
            let err = std::sync::Mutex::new(None);
            run_guided(pool, n_groups, usize::MAX, &|_, gs| {
                let (a, b) = (gs.start * g * wrow, (gs.end * g).min(g1 - g0) * wrow);
                // SAFETY: each run writes its own byte range a..b of buf (sized above).
                let d = unsafe { std::slice::from_raw_parts_mut(dst.get().add(a), b - a) };
                if let Err(e) = quant::repack::unpack_x4(w.ty, w.ne[0], &src[a..b], d) {
                    *err.lock().unwrap() = Some(e);
                }
            });
            if let Some(e) = err.into_inner().unwrap() {
                return Err(e);
            }
            let plain = TensorView { name: w.name, ty: w.ty, ne: [w.ne[0], g1 - g0, 1, 1], data: &buf[..src.len()], layout: Layout::Plain };
            // this piece's rows are out's columns c0 - rows.start ..
            let o = &mut out[c0 - rows.start..];
            matmul_with_x(pool, set, &plain, x, n_tokens, o, ld_out, c0 - g0..c1 - g0, scratch, same_x)
        })?;
        // the next piece multiplies the same x, which this one left prepared in scratch
        same_x = true;
        c0 = c1;
    }
    Ok(())
}

/// Eight weight rows' results (`row(i, dst)` writes row i's PACK_COLS tokens to dst) stored
/// transposed to `out` (`store_tile_8x8`: the output is per token).
///
/// # Safety
/// As `store_tile_8x8` for `out`, `ld`, `nc`; `row` writes PACK_COLS values to dst.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn tile_rows(out: *mut f32, ld: usize, nc: usize, row: impl Fn(usize, *mut f32)) {
    use quant::avx2::PACK_COLS;
    let mut tile = [[0f32; PACK_COLS]; 8];
    for (i, ti) in tile.iter_mut().enumerate() {
        row(i, ti.as_mut_ptr());
    }
    quant::avx2::store_tile_8x8(&tile, out, ld, nc);
}

/// Chunks 0..n split into one contiguous range per thread; a thread claims from the front
/// of its own range, and once that is empty from the back of the others'. Each range is
/// one atomic word (front << 32 | back, on its own cache line), so an owner's claims stay
/// in its own cache until a thief arrives. Up to INLINE_SLOTS threads the words live in
/// the struct (no allocation per matmul: a token runs ~200 of them).
struct StealRanges {
    inline: [PaddedU64; INLINE_SLOTS],
    heap: Vec<PaddedU64>,
    nth: usize,
}

const INLINE_SLOTS: usize = 16;

#[repr(align(64))]
struct PaddedU64(std::sync::atomic::AtomicU64);

impl StealRanges {
    fn new(n: usize, nth: usize) -> Self {
        assert!(n <= u32::MAX as usize, "{n} chunks do not fit a 32-bit range bound");
        let word = |i: usize| {
            let r = split_range(n, i, nth);
            PaddedU64(std::sync::atomic::AtomicU64::new(((r.start as u64) << 32) | r.end as u64))
        };
        if nth <= INLINE_SLOTS {
            StealRanges { inline: std::array::from_fn(|i| if i < nth { word(i) } else { PaddedU64(Default::default()) }), heap: Vec::new(), nth }
        } else {
            StealRanges { inline: std::array::from_fn(|_| PaddedU64(Default::default())), heap: (0..nth).map(word).collect(), nth }
        }
    }

    fn slot(&self, j: usize) -> &std::sync::atomic::AtomicU64 {
        if self.nth <= INLINE_SLOTS {
            &self.inline[j].0
        } else {
            &self.heap[j].0
        }
    }

    /// The next chunk for thread `ith`, or None when every range is empty.
    fn claim(&self, ith: usize) -> Option<usize> {
        self.claim_up_to(ith, 1).map(|r| r.start)
    }

    /// The next run of up to `max` chunks for thread `ith` (guided: a quarter of what is
    /// left in the range it comes from, at least one), or None when every range is empty.
    /// Early claims are long (few claims, one contiguous stream of weights); near the end
    /// they shrink to one chunk, so the last thread to finish is at most one chunk behind.
    fn claim_up_to(&self, ith: usize, max: usize) -> Option<Range<usize>> {
        use std::sync::atomic::Ordering::{AcqRel, Acquire};
        let nth = self.nth;
        for k in 0..nth {
            let j = (ith + k) % nth;
            let slot = self.slot(j);
            let mut v = slot.load(Acquire);
            loop {
                let (f, b) = (v >> 32, v & 0xffff_ffff);
                if f >= b {
                    break;
                }
                let n = ((b - f) / GUIDE).clamp(1, max.max(1) as u64);
                // the owner takes the front, a thief the back
                let (nv, c) = if k == 0 { (((f + n) << 32) | b, f) } else { ((f << 32) | (b - n), b - n) };
                match slot.compare_exchange_weak(v, nv, AcqRel, Acquire) {
                    Ok(_) => return Some(c as usize..(c + n) as usize),
                    Err(cur) => v = cur,
                }
            }
        }
        None
    }
}

/// A guided claim takes 1/GUIDE of what is left in its range (see `claim_up_to`).
const GUIDE: u64 = 4;

/// Bytes of packed activation groups the matmul of a weight with kernels `kern` needs (0:
/// not packed). Only the x86 sets pack, and only weight types with a packed kernel.
fn packed_bytes(kern: &quant::table::TypeKernels, n_in: usize, n_tokens: usize) -> usize {
    use quant::table::MAX_PACK;
    match kern.packed {
        // from 2 tokens on (one token takes the multi-row kernels); the last group may be
        // partial
        Some(p) if n_tokens >= 2 && p.cols[MAX_PACK].is_some() => n_tokens.div_ceil(MAX_PACK) * (n_in / 32) * pairs_path(kern, n_in, n_tokens).map_or(p.block_bytes, |pd| pd.pack_block),
        _ => 0,
    }
}

/// Where (address mod 64) the packed activation groups of vec_dot type `vdt` start: each
/// group block's zmm / ymm loads then fall on whole cache lines. Q8_0 groups
/// (`avx2::PACK_BLOCK`, 576 bytes) start with the 32 bytes of the 8 columns' scales, so they
/// start at 32; Q8_1 groups (`PACK_BLOCK_Q8_1`, 320 bytes) and the interleaved pairs' groups
/// (`pairs`: 64 bytes of scales, `avx2_rb::pack_q8_0_pairs`) at 0.
fn pack_phase(vdt: GgmlType, pairs: bool) -> usize {
    if vdt == GgmlType::Q8_1 || pairs {
        0
    } else {
        32
    }
}

/// The interleaved row pairs' kernels, where a matmul of `n_tokens` rows of `n_in` takes
/// them (prefill of more than ROW_OUTER_GROUPS packed groups, rows of which a decoded block
/// holds at least `min_rows`; see the packed path). They take precedence over a column-lane
/// kernel (the AVX-512 BW build has both: the lanes run the decode steps).
#[cfg(target_arch = "x86_64")]
fn pairs_path(kern: &quant::table::TypeKernels, n_in: usize, n_tokens: usize) -> Option<quant::table::PairsDecoded> {
    use quant::avx2::PACK_COLS;
    let pk = kern.packed?;
    pk.pairs_decoded.filter(|pd| n_tokens.div_ceil(PACK_COLS) > ROW_OUTER_GROUPS && lanes_rows(n_in / 32, pd.block_bytes) >= pd.min_rows)
}

#[cfg(not(target_arch = "x86_64"))]
fn pairs_path(_kern: &quant::table::TypeKernels, _n_in: usize, _n_tokens: usize) -> Option<quant::table::PairsDecoded> {
    None
}

/// Bytes of the row-block path's repack areas, or of the decoded rows of the column-lane
/// path or the decoded two-row path
/// (one area per thread; 0: neither path is taken).
fn rb_bytes(kern: &quant::table::TypeKernels, n_in: usize, n_tokens: usize, n_threads: usize) -> usize {
    // the decoded rows of the path the packed path takes (`pairs_path` before the lanes)
    let pairs = pairs_path(kern, n_in, n_tokens).map(|pd| pd.block_bytes);
    let decoded = pairs.or_else(|| kern.packed.and_then(|p| p.lanes.map(|ln| ln.block_bytes).or(p.pairs_decoded.map(|pd| pd.block_bytes)).or(p.pair_decoded.map(|pd| pd.block_bytes))));
    match (kern.row_block, decoded) {
        (Some(rb), _) if n_tokens >= rb.min_tokens => n_threads * ((n_in / 256) * rb.sb_bytes).div_ceil(64) * 64,
        (_, Some(bytes)) if n_tokens >= quant::table::MAX_PACK => n_threads * lanes_area(n_in / 32, bytes),
        _ => 0,
    }
}

/// Decoded bytes of weight rows per block of the column-lane and interleaved-pair paths: each
/// block of rows meets every packed group while it stays in L2, so a group (read from L2
/// once per block) is reused by more rows the larger the block. A quarter of the per-core L2
/// (sysfs; 256 KB where unknown), between 64 KB and 512 KB. `--bench prefill`, one thread, a
/// 2 MB L2 (512 KB blocks) against 64 KB: rows of 4096 Q4_0 / Q8_0 46 -> 83 GMAC/s
/// (PYLLAMA_KERNELS=avx2: Q4_0 31 -> 38), Q4_1 66 -> 76; Gemma 3's Q5_0 rows 88-92 -> 96,
/// SmolLM2's Q4_1 79 -> 79-80 (flat).
fn lanes_block_bytes() -> usize {
    (quant::cpu::l2_bytes().unwrap_or(256 << 10) / 4).clamp(64 << 10, 512 << 10)
}

/// Weight rows decoded at a time by the column-lane path in a decode step of up to
/// ROW_OUTER_GROUPS groups: a row's decoded bytes are read back a few rows' decoding after
/// they were stored, not at once (a 4-byte load from a just-stored vector waits on store
/// forwarding).
const LANES_STEP_ROWS: usize = 8;

/// Weight rows per decoded block of the column-lane path (rows of nb blocks of
/// `block_bytes` decoded bytes).
fn lanes_rows(nb: usize, block_bytes: usize) -> usize {
    (lanes_block_bytes() / (nb * block_bytes).max(1)).max(1)
}

/// Bytes of one thread's decoded-row area of the column-lane path (room for the rows of
/// either loop).
fn lanes_area(nb: usize, block_bytes: usize) -> usize {
    (lanes_rows(nb, block_bytes).max(LANES_STEP_ROWS) * nb * block_bytes).div_ceil(64) * 64
}

/// How many f32 block scales the matmul precomputes per activation row of `vdt` (the
/// SIMD sets' Q8_0: d per block; Q8_1: d and s per block; otherwise none).
fn act_scale_count(vdt: GgmlType, set: KernelSet, n_in: usize) -> usize {
    match vdt {
        GgmlType::Q8_0 if set != KernelSet::Ref => n_in / 32,
        GgmlType::Q8_1 if set != KernelSet::Ref => 2 * (n_in / 32),
        _ => 0,
    }
}

/// f32 copies of the f16 block scales of one quantized activation row: Q8_0 -> d per
/// block, Q8_1 -> (d, s) per block. Exact conversions.
fn fill_scales(vdt: GgmlType, row: &[u8], nsc: usize, out: *mut f32, set: KernelSet) {
    let ts = vdt.type_size();
    for k in 0..nsc {
        let (blk, field) = match vdt {
            GgmlType::Q8_1 => (k / 2, k % 2),
            _ => (k, 0),
        };
        let o = blk * ts + 2 * field;
        let h = &row[o..o + 2];
        // the x86 SIMD sets (which all have F16C): one inline `vcvtph2ps` (`half`'s
        // conversion is an out-of-line call behind a feature check per value)
        #[cfg(target_arch = "x86_64")]
        let v = if set.is_simd() {
            // SAFETY: two bytes at h; the set's CPU check covered F16C
            unsafe { quant::avx2::f16(h.as_ptr()) }
        } else {
            crate::quant::fp::f16_to_f32(u16::from_le_bytes([h[0], h[1]]))
        };
        #[cfg(not(target_arch = "x86_64"))]
        let v = {
            let _ = set;
            crate::quant::fp::f16_to_f32(u16::from_le_bytes([h[0], h[1]]))
        };
        // SAFETY: the caller sized `out` for nsc values.
        unsafe { out.add(k).write_unaligned(v) };
    }
}

/// Packed groups up to which the packed path loops over weight rows outside the groups
/// (each row read once for all groups); more groups (prefill) loop over groups outside.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // (only x86 packs)
const ROW_OUTER_GROUPS: usize = 4;

/// Bytes of quantized activations per token chunk of the tiled path (fits L2 with room).
const TOKEN_CHUNK_BYTES: usize = 64 * 1024;

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use crate::ggml_type::GgmlType;
    use crate::quant::{self, avx2, table, KernelSet};

    /// The packed kernels of `ty` in `build` (the AVX2 set's plain or AVX-VNNI build, or
    /// the AVX-512 set's EVEX one).
    fn packed_of(ty: GgmlType, build: avx2::PackBuild) -> table::Packed {
        let (set, vnni) = match build {
            avx2::PackBuild::Plain => (KernelSet::Avx2, false),
            avx2::PackBuild::Vnni => (KernelSet::Avx2, true),
            avx2::PackBuild::Evex => (KernelSet::Avx512, false),
            avx2::PackBuild::Bw => (KernelSet::Avx512Bw, false),
        };
        let opt = table::Options { vnni, dotprod: false, llamacpp_order: false, no_cols: false, no_rows: false, no_rb: false };
        table::build(set, opt).get(ty).packed.expect("a packed type")
    }

    /// xorshift: deterministic test data without a dependency.
    fn next(s: &mut u64) -> u64 {
        *s ^= *s << 13;
        *s ^= *s >> 7;
        *s ^= *s << 17;
        *s
    }

    /// The plain AVX2 single-column kernel of `ty`.
    fn packed_one(ty: GgmlType) -> quant::DotN {
        let opt = table::Options { vnni: false, dotprod: false, llamacpp_order: false, no_cols: false, no_rows: false, no_rb: false };
        table::build(KernelSet::Avx2, opt).get(ty).tiled.expect("a tiled type").one()
    }

    #[test]
    fn packed_kernels_equal_single_column_kernels_bit_for_bit() {
        // The packed kernels (weights shifted to unsigned, offset corrections, vectorized
        // d_w * d_x) must give every column exactly what the plain single-column kernel
        // gives, in the plain AVX2, AVX-VNNI and AVX-512 VNNI builds, for every group width
        // (1..=8 columns: full groups and a batch's partial last group), also at the
        // extremes (all quants at +-127 in the activations, extreme weight quants).
        if !quant::avx2_available() {
            return;
        }
        let vnni_cpu = quant::cpu::features().avxvnni;
        let mut s = 0x9e37_79b9_7f4a_7c15u64;
        let mut lanes_seen = 0;
        for ty in [GgmlType::Q4_0, GgmlType::Q5_0, GgmlType::Q8_0, GgmlType::Q4_1, GgmlType::Q5_1] {
            let nb = 7;
            let n = 32 * nb;
            let wrow = ty.row_size(n).unwrap();
            let vdt = quant::vec_dot_type(ty);
            let q81 = vdt == GgmlType::Q8_1;
            let xrow = vdt.row_size(n).unwrap();
            for case in 0..6 {
                let mut w: Vec<u8> = (0..wrow).map(|_| next(&mut s) as u8).collect();
                if case == 1 {
                    w.fill(0xFF); // every weight quant at its top (scale bytes too: a NaN d)
                } else if case == 2 {
                    w.fill(0x00);
                }
                for b in 0..nb {
                    // finite scales (and mins), except in case 1
                    if case != 1 {
                        for f in 0..(1 + q81 as usize) {
                            let d = half::f16::from_f32((next(&mut s) % 100) as f32 * 1e-3 - 0.03).to_bits();
                            let o = b * ty.type_size() + 2 * f;
                            w[o..o + 2].copy_from_slice(&d.to_le_bytes());
                        }
                    }
                }
                let mut xq = vec![0u8; xrow * avx2::PACK_COLS];
                for c in 0..avx2::PACK_COLS {
                    let x: Vec<f32> = (0..n)
                        .map(|k| match case {
                            3 => 1.0,
                            4 => if k % 2 == 0 { -1.0 } else { 1.0 },
                            _ => (next(&mut s) % 2001) as f32 / 1000.0 - 1.0,
                        })
                        .collect();
                    quant::quantize_row_act(vdt, &x, &mut xq[c * xrow..(c + 1) * xrow]).unwrap();
                }
                // the block scales the matmul precomputes: d (Q8_0) or (d, s) (Q8_1)
                let per = 1 + q81 as usize;
                let xd = avx2::block_scales_for_test(&xq, xrow, vdt, avx2::PACK_COLS, nb);
                let mut builds = vec![avx2::PackBuild::Plain];
                if vnni_cpu {
                    builds.push(avx2::PackBuild::Vnni);
                }
                if quant::avx512_available() {
                    builds.push(avx2::PackBuild::Evex);
                }
                if quant::avx512bw_available() {
                    builds.push(avx2::PackBuild::Bw);
                }
                let one = packed_one(ty);
                let p = packed_of(ty, avx2::PackBuild::Plain);
                // every group width: full groups and the partial last group of a batch
                for nc in 1..=avx2::PACK_COLS {
                    let mut packed = vec![0xA5u8; nb * p.block_bytes];
                    unsafe {
                        if q81 {
                            avx2::pack_q8_1_cols(nb, nc, xq.as_ptr(), xrow, xd.as_ptr(), nb * per, packed.as_mut_ptr())
                        } else {
                            avx2::pack_q8_0_cols(nb, nc, xq.as_ptr(), xrow, xd.as_ptr(), nb, p.offset, packed.as_mut_ptr())
                        }
                    };
                    for &build in &builds {
                        let k = packed_of(ty, build).cols[nc].unwrap();
                        let mut got = [f32::NAN; avx2::PACK_COLS];
                        unsafe { k(nb, w.as_ptr(), packed.as_ptr(), got.as_mut_ptr()) };
                        for c in 0..nc {
                            let mut want = 0f32;
                            unsafe { one(n, w.as_ptr(), xq.as_ptr().add(c * xrow), 0, std::ptr::null(), 0, &mut want) };
                            assert_eq!(got[c].to_bits(), want.to_bits(), "{ty} {build:?} nc={nc} case {case} column {c}");
                        }
                    }
                    // the column-lane kernels (plain AVX2 and AVX-VNNI builds): decoded row,
                    // lanes layout
                    for ln in builds.iter().filter_map(|&b| packed_of(ty, b).lanes) {
                        let mut lp = vec![0xA5u8; nb * p.block_bytes];
                        let mut dec = vec![0xA5u8; nb * ln.block_bytes];
                        let mut got = [f32::NAN; avx2::PACK_COLS];
                        unsafe {
                            if q81 {
                                avx2::pack_q8_1_lanes(nb, nc, xq.as_ptr(), xrow, xd.as_ptr(), nb * per, lp.as_mut_ptr())
                            } else {
                                avx2::pack_q8_0_lanes(nb, nc, xq.as_ptr(), xrow, xd.as_ptr(), nb, p.offset, lp.as_mut_ptr())
                            }
                            (ln.decode)(nb, w.as_ptr(), dec.as_mut_ptr());
                            (ln.dot)(nb, dec.as_ptr(), lp.as_ptr(), got.as_mut_ptr());
                        }
                        for c in 0..nc {
                            let mut want = 0f32;
                            unsafe { one(n, w.as_ptr(), xq.as_ptr().add(c * xrow), 0, std::ptr::null(), 0, &mut want) };
                            assert_eq!(got[c].to_bits(), want.to_bits(), "{ty} lanes nc={nc} case {case} column {c}");
                        }
                        lanes_seen += 1;
                    }
                }
            }
        }
        // Q4_0, Q5_0, Q4_1, Q5_1 (plain AVX2 and AVX-512 BW) and Q8_0 too (AVX-VNNI) x 6
        // cases x 8 widths
        assert_eq!(lanes_seen, (4 + 5 * vnni_cpu as usize + 4 * quant::avx512bw_available() as usize) * 6 * 8);
    }
}

#[cfg(test)]
mod steal_tests {
    use super::{single_token_chunk, StealRanges};
    use crate::threadpool::ThreadPool;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[test]
    fn every_chunk_is_claimed_exactly_once() {
        // 1..5 threads (and 17: range words beyond the inline ones), 0..70 chunks, and a
        // thread that starts late (its own range is then taken from the back by the
        // others): each chunk once, none invented.
        for nth in (1..=5).chain([17]) {
            let pool = ThreadPool::new(nth);
            for n in (0..70).chain([1000]) {
                for late in [None, Some(0), Some(nth - 1)] {
                    let ranges = StealRanges::new(n, nth);
                    let seen: Vec<AtomicU32> = (0..n).map(|_| AtomicU32::new(0)).collect();
                    pool.run(&|ith, _| {
                        if Some(ith) == late {
                            std::thread::sleep(std::time::Duration::from_millis(2));
                        }
                        while let Some(c) = ranges.claim(ith) {
                            assert!(c < n, "chunk {c} of {n}");
                            seen[c].fetch_add(1, Ordering::Relaxed);
                        }
                    });
                    let bad = seen.iter().position(|s| s.load(Ordering::Relaxed) != 1);
                    assert!(bad.is_none(), "{nth} threads, {n} chunks, late {late:?}: chunk {bad:?}");
                }
            }
        }
    }

    #[test]
    fn guided_runs_cover_every_chunk_once_and_shrink_to_one() {
        // as above, with runs of up to `max` chunks: each chunk in exactly one run, no run
        // longer than max, and the last run each thread takes is one chunk (the tail)
        for nth in [1usize, 2, 3, 17] {
            let pool = ThreadPool::new(nth);
            for n in [0usize, 1, 5, 63, 240, 1000] {
                for max in [1usize, 3, 12, 64] {
                    for late in [None, Some(nth - 1)] {
                        let ranges = StealRanges::new(n, nth);
                        let seen: Vec<AtomicU32> = (0..n).map(|_| AtomicU32::new(0)).collect();
                        let last: Vec<AtomicU32> = (0..nth).map(|_| AtomicU32::new(0)).collect();
                        pool.run(&|ith, _| {
                            if Some(ith) == late {
                                std::thread::sleep(std::time::Duration::from_millis(2));
                            }
                            while let Some(r) = ranges.claim_up_to(ith, max) {
                                assert!(!r.is_empty() && r.len() <= max && r.end <= n, "run {r:?} of {n}, max {max}");
                                r.clone().for_each(|c| _ = seen[c].fetch_add(1, Ordering::Relaxed));
                                last[ith].store(r.len() as u32, Ordering::Relaxed);
                            }
                        });
                        let bad = seen.iter().position(|s| s.load(Ordering::Relaxed) != 1);
                        assert!(bad.is_none(), "{nth} threads, {n} chunks, max {max}, late {late:?}: chunk {bad:?}");
                        if n >= 4 * nth * 4 {
                            // whoever took the final chunks took them one at a time
                            assert!(last.iter().any(|l| l.load(Ordering::Relaxed) == 1), "{nth} threads, {n} chunks, max {max}: no single-chunk tail");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn single_token_chunks_are_whole_passes_covering_the_rows() {
        for (n_rows, wrow, nth) in [(1usize, 18usize, 2usize), (576, 360, 2), (49152, 612, 2), (262144, 680, 3), (7, 10000, 4)] {
            let c = single_token_chunk(n_rows, wrow, nth);
            assert!(c % 4 == 0 && c >= 4, "{n_rows} rows: chunk {c}");
            assert!(n_rows.div_ceil(c) <= 64 * nth, "{n_rows} rows: {} chunks", n_rows.div_ceil(c));
        }
    }
}

#[cfg(test)]
mod same_x_tests {
    use super::{matmul_on, matmul_on_same_x, REUSED};
    use crate::ggml_type::GgmlType;
    use crate::model::TensorView;
    use crate::threadpool::ThreadPool;

    fn weights(ty: GgmlType, n_in: usize, n_out: usize, seed: u32) -> Vec<u8> {
        let x: Vec<f32> = (0..n_in * n_out).map(|i| (((i as u32).wrapping_mul(2654435761).wrapping_add(seed) >> 16) % 2001) as f32 / 1000.0 - 1.0).collect();
        let mut w = vec![0u8; ty.row_size(n_in).unwrap() * n_out];
        crate::quantize::kernels::quantize_chunk(ty, &x, &mut w, n_in, None);
        w
    }

    #[test]
    fn same_x_matmuls_reuse_the_quantized_activations_and_keep_the_bits() {
        // q, k, v / gate, up: products of one x in a row (mixed types that share an
        // activation layout or not, packed or row-block paths, one and two threads): the
        // vouched ones give exactly the fresh results, and reuse x's quantization when the
        // previous matmul on that scratch left it (and only then: a matmul of another x
        // between, or a fresh scratch, quantizes again).
        let (n_in, n_tok) = (512usize, 40usize);
        let x: Vec<f32> = (0..n_in * n_tok).map(|i| ((i * 37) % 101) as f32 * 0.02 - 1.0).collect();
        let x2: Vec<f32> = x.iter().map(|v| v * 0.5 + 0.1).collect();
        for nth in [1, 2] {
            let pool = ThreadPool::new(nth);
            for tys in [[GgmlType::Q5_0, GgmlType::Q5_0, GgmlType::Q8_0], [GgmlType::Q4_K, GgmlType::Q4_K, GgmlType::Q6_K], [GgmlType::Q4_1, GgmlType::Q4_0, GgmlType::Q4_0]] {
                let ws: Vec<Vec<u8>> = tys.iter().enumerate().map(|(i, &ty)| weights(ty, n_in, 48 + 8 * i, i as u32)).collect();
                let views: Vec<TensorView> = tys.iter().zip(&ws).enumerate().map(|(i, (&ty, d))| TensorView { name: "w", ty, ne: [n_in, 48 + 8 * i, 1, 1], data: d, layout: crate::model::Layout::Plain }).collect();
                let fresh = |w: &TensorView, x: &[f32]| {
                    let mut out = vec![0f32; n_tok * w.n_rows()];
                    let mut scratch = Vec::new();
                    matmul_on(None, &pool, w, x, n_tok, &mut out, w.n_rows(), 0..w.n_rows(), &mut scratch).unwrap();
                    out
                };
                // (fresh results first: each is a matmul of its own, on its own scratch)
                let wants: Vec<Vec<f32>> = views.iter().map(|w| fresh(w, &x)).collect();
                let mut scratch = Vec::new();
                let before = REUSED.with(|c| c.get());
                let mut outs = Vec::new();
                for (i, w) in views.iter().enumerate() {
                    let mut out = vec![0f32; n_tok * w.n_rows()];
                    let on = if i == 0 { matmul_on } else { matmul_on_same_x };
                    on(None, &pool, w, &x, n_tok, &mut out, w.n_rows(), 0..w.n_rows(), &mut scratch).unwrap();
                    outs.push(out);
                }
                let reused = REUSED.with(|c| c.get()) - before;
                for (i, (out, want)) in outs.iter().zip(&wants).enumerate() {
                    assert!(out.iter().zip(want).all(|(a, b)| a.to_bits() == b.to_bits()), "{tys:?} part {i}, {nth} threads");
                }
                // at most where a part's activation type is its predecessor's (and a scratch
                // that grew, so moved, is quantized again): Q4_0 after Q4_1 (Q8_0 after Q8_1)
                // never; Q4_0 after Q4_0, Q8_0 after Q5_0 (one pair layout) at least once
                let vdt = crate::quant::vec_dot_type;
                let same_vdt = (1..3).filter(|&i| vdt(tys[i]) == vdt(tys[i - 1])).count();
                assert!(reused <= same_vdt, "{tys:?}: {reused} reuses");
                if tys[0] != GgmlType::Q4_K {
                    assert!(reused >= 1, "{tys:?}: no reuse");
                }
                // another x in between: the vouched matmul of x must not take x2's quantization
                let mut out = vec![0f32; n_tok * views[1].n_rows()];
                matmul_on(None, &pool, &views[0], &x2, n_tok, &mut vec![0f32; n_tok * views[0].n_rows()], views[0].n_rows(), 0..views[0].n_rows(), &mut scratch).unwrap();
                let before = REUSED.with(|c| c.get());
                matmul_on_same_x(None, &pool, &views[1], &x, n_tok, &mut out, views[1].n_rows(), 0..views[1].n_rows(), &mut scratch).unwrap();
                assert_eq!(REUSED.with(|c| c.get()), before, "{tys:?}: reused another x's activations");
                assert!(out.iter().zip(&wants[1]).all(|(a, b)| a.to_bits() == b.to_bits()), "{tys:?} after another x");
            }
        }
    }
}
