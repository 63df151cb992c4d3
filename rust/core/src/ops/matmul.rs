//! Matrix multiplication of a (quantized) weight matrix with f32 activations, on the
//! thread pool (pipeline step 13: every projection of every layer).
//!
//! Shapes: w is [n_out rows of n_in] (ggml ne = [n_in, n_out]), x is [n_tokens, n_in] f32
//! row-major, out is [n_tokens, n_out] f32 row-major (or a column range of a wider buffer).
//!
//! The activations are first quantized to `vec_dot_type(w.ty)` (llama.cpp's x86 activation
//! quantizers), then each thread computes a contiguous range of output rows.
//!
//! Determinism: every output element is one call of the same per-(row, token) kernel with
//! the same block order, whatever n_tokens, the tiling or the thread count; so a token's
//! logits do not depend on what else is in its batch.

use crate::error::{Error, Result};
use crate::ggml_type::GgmlType;
use crate::model::TensorView;
use crate::quant::{self, kernel_set, KernelSet};
use crate::threadpool::{split_range, SyncPtr, ThreadPool};
use std::ops::Range;

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
    let vdt = quant::vec_dot_type(w.ty);
    let dot = quant::vec_dot_fn(w.ty, set).ok_or_else(|| bad(format!("unsupported tensor type {}", w.ty)))?;
    let xrow = quant::row_bytes(vdt, n_in)?;

    // Activations in the vec_dot type: [n_tokens][xrow] bytes.
    let nsc = match vdt {
        GgmlType::Q8_0 if set != KernelSet::Ref => n_in / 32,
        GgmlType::Q8_1 if set != KernelSet::Ref => 2 * (n_in / 32),
        _ => 0,
    };
    let mut xscales: *const f32 = std::ptr::null();
    let xq: &[u8] = if vdt == GgmlType::F32 {
        // SAFETY: f32 has no invalid bit patterns and u8 has alignment 1.
        unsafe { std::slice::from_raw_parts(x.as_ptr() as *const u8, x.len() * 4) }
    } else {
        let qf = quant::quantize_act_fn(vdt, set).ok_or_else(|| bad(format!("no quantizer for {vdt}")))?;
        // [n_tokens][xrow] quantized rows, then (Q8_0/Q8_1 only) [n_tokens][nsc] f32 block
        // scales converted once here rather than once per weight row in the kernels.
        let sc_off = (n_tokens * xrow).div_ceil(4) * 4;
        scratch.resize(sc_off + n_tokens * nsc * 4, 0);
        let quantize_token = |t: usize, base: *mut u8| {
            // SAFETY: token t's row and scale slots are disjoint from every other token's.
            let dst = unsafe { std::slice::from_raw_parts_mut(base.add(t * xrow), xrow) };
            qf(&x[t * n_in..(t + 1) * n_in], dst);
            let sc = unsafe { base.add(sc_off + t * nsc * 4) as *mut f32 };
            fill_scales(vdt, dst, nsc, sc);
        };
        let sp = SyncPtr(scratch.as_mut_ptr());
        if n_tokens == 1 || pool.n_threads() == 1 {
            for t in 0..n_tokens {
                quantize_token(t, sp.get());
            }
        } else {
            pool.run(&|ith, nth| {
                for t in split_range(n_tokens, ith, nth) {
                    quantize_token(t, sp.get());
                }
            });
        }
        xscales = if nsc > 0 { unsafe { scratch.as_ptr().add(sc_off) as *const f32 } } else { std::ptr::null() };
        &scratch[..n_tokens * xrow]
    };

    let op = SyncPtr(out.as_mut_ptr());
    let wdata = w.data;
    let r0 = rows.start;

    #[cfg(target_arch = "x86_64")]
    if set == KernelSet::Avx2 {
        if let Some((one, many)) = quant::avx2::dot_kernels_for(w.ty, n_tokens) {
            const TILE: usize = quant::avx2::TILE;
            // Tokens are processed in chunks whose activations stay in L1/L2 while the
            // thread walks its weight rows; within a chunk each weight row is decoded once
            // per TILE tokens.
            let chunk = (TOKEN_CHUNK_BYTES / xrow).clamp(TILE, 256) / TILE * TILE;
            let xs_addr = xscales as usize; // a plain address so the closure stays Sync
            let xsc = |t: usize| -> *const f32 {
                if xs_addr == 0 {
                    std::ptr::null()
                } else {
                    (xs_addr as *const f32).wrapping_add(t * nsc)
                }
            };
            pool.run(&|ith, nth| {
                let mine = split_range(n_rows, ith, nth);
                let mut t0 = 0;
                while t0 < n_tokens {
                    let t1 = (t0 + chunk).min(n_tokens);
                    for r in mine.clone() {
                        let wr = &wdata[(r0 + r) * wrow..(r0 + r + 1) * wrow];
                        let mut t = t0;
                        let mut tmp = [0f32; TILE];
                        while t + TILE <= t1 {
                            // SAFETY: rows of wrow/xrow bytes checked above; out in bounds.
                            unsafe {
                                many(n_in, wr.as_ptr(), xq.as_ptr().add(t * xrow), xrow, xsc(t), nsc, tmp.as_mut_ptr());
                                for (c, v) in tmp.iter().enumerate() {
                                    *op.get().add((t + c) * ld_out + r) = *v;
                                }
                            }
                            t += TILE;
                        }
                        while t < t1 {
                            unsafe { one(n_in, wr.as_ptr(), xq.as_ptr().add(t * xrow), 0, xsc(t), 0, op.get().add(t * ld_out + r)) };
                            t += 1;
                        }
                    }
                    t0 = t1;
                }
            });
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

/// f32 copies of the f16 block scales of one quantized activation row: Q8_0 -> d per
/// block, Q8_1 -> (d, s) per block. Exact conversions.
fn fill_scales(vdt: GgmlType, row: &[u8], nsc: usize, out: *mut f32) {
    let ts = vdt.type_size();
    for k in 0..nsc {
        let (blk, field) = match vdt {
            GgmlType::Q8_1 => (k / 2, k % 2),
            _ => (k, 0),
        };
        let o = blk * ts + 2 * field;
        let v = crate::quant::fp::f16_to_f32(u16::from_le_bytes([row[o], row[o + 1]]));
        // SAFETY: the caller sized `out` for nsc values.
        unsafe { out.add(k).write_unaligned(v) };
    }
}

/// Bytes of quantized activations per token chunk of the tiled path (fits L2 with room).
const TOKEN_CHUNK_BYTES: usize = 64 * 1024;
