//! llama.cpp's tiled f32 flash attention (ggml-cpu ops.cpp
//! `ggml_compute_forward_flash_attn_ext_tiled`, which llama.cpp runs for micro-batches of
//! 64 queries or more), reproduced operation for operation for one (query, head): q in f32,
//! keys in tiles of 64 cells; per tile the scores are FMA chains over the head dimension
//! (`simd_gemm`), the running max is updated once per tile (rescaling the f32 V accumulator
//! and the sum by expf(old - new)), the tile's probabilities come from ggml's vector expf
//! with its 8-lane sums added in f64, and V is accumulated with one FMA chain per output
//! element over the tile's keys in order. Used only under `PYLLAMA_ORDER=llamacpp` (see
//! quant::avx2::llamacpp_order): pyllama's default keeps one attention kernel for every
//! micro-batch size.
//!
//! Tiles are taken by KV cell (cell / 64, the key's slot in its tile cell % 64, keys in
//! cell order), as llama.cpp tiles its K/V view: for a sequence that fills the cache from
//! cell 0 that is its positions, and for several sequences packed into one unified cache
//! (an embeddings batch) each sequence's keys fall into tiles by where its cells lie.

#![cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // x86-64 only (llamacpp order)

use std::cell::RefCell;

const TILE: usize = 64;

thread_local! {
    static KT: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    static BY_CELL: RefCell<Vec<(i32, u32)>> = const { RefCell::new(Vec::new()) };
}

/// One (query, head): `q` [hd_k] (f32, already scaled as the graph scales it), `vis` the
/// visible keys (position, cell) in any order (taken in cell order), `k_row(cell)` / `v_row(cell)` the
/// f16 bits of that head's K / V, `kscale` the softmax scale; writes `out` [hd_v].
#[cfg(target_arch = "x86_64")]
pub fn attend<'a>(
    q: &[f32],
    vis: &[(i32, u32)],
    k_row: &dyn Fn(u32) -> &'a [u16],
    v_row: &dyn Fn(u32) -> &'a [u16],
    kscale: f32,
    out: &mut [f32],
) -> bool {
    if !crate::quant::table::kernels().avx2_math {
        return false;
    }
    let hd_k = q.len();
    if hd_k % 8 != 0 || out.len() % 8 != 0 {
        return false;
    }
    let sorted = vis.windows(2).all(|w| w[0].1 < w[1].1);
    KT.with(|kt| {
        let mut kt = kt.borrow_mut();
        if kt.len() < hd_k * TILE {
            kt.resize(hd_k * TILE, 0.0);
        }
        if sorted {
            // SAFETY: CPU features checked above; buffer sizes checked / sized here.
            unsafe { attend_avx2(q, vis, k_row, v_row, kscale, out, &mut kt) };
        } else {
            BY_CELL.with(|bc| {
                let mut bc = bc.borrow_mut();
                bc.clear();
                bc.extend_from_slice(vis);
                bc.sort_unstable_by_key(|k| k.1);
                // SAFETY: as above.
                unsafe { attend_avx2(q, &bc, k_row, v_row, kscale, out, &mut kt) };
            });
        }
    });
    true
}

#[cfg(not(target_arch = "x86_64"))]
pub fn attend<'a>(
    _q: &[f32],
    _vis: &[(i32, u32)],
    _k_row: &dyn Fn(u32) -> &'a [u16],
    _v_row: &dyn Fn(u32) -> &'a [u16],
    _kscale: f32,
    _out: &mut [f32],
) -> bool {
    false
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn attend_avx2<'a>(
    q: &[f32],
    vis: &[(i32, u32)],
    k_row: &dyn Fn(u32) -> &'a [u16],
    v_row: &dyn Fn(u32) -> &'a [u16],
    kscale: f32,
    out: &mut [f32],
    kt: &mut [f32],
) {
    use std::arch::x86_64::*;
    let hd_k = q.len();
    let hd_v = out.len();
    out.fill(0.0); // the f32 V accumulator (VKQ32)
    let mut m = f32::NEG_INFINITY;
    let mut s = 0f32;
    let mut row = [f32::NEG_INFINITY; TILE];
    let mut i = 0;
    while i < vis.len() {
        let tile = vis[i].1 / TILE as u32;
        let mut j = i;
        while j < vis.len() && vis[j].1 / TILE as u32 == tile {
            j += 1;
        }
        let keys = &vis[i..j];
        // K tile transposed to f32: kt[d * 64 + slot]
        let mut used = [false; TILE];
        for &(_, cell) in keys {
            let slot = cell as usize % TILE;
            used[slot] = true;
            let k = k_row(cell);
            let mut d = 0;
            while d + 8 <= hd_k {
                let v = _mm256_cvtph_ps(_mm_loadu_si128(k.as_ptr().add(d) as *const __m128i));
                let mut tmp = [0f32; 8];
                _mm256_storeu_ps(tmp.as_mut_ptr(), v);
                for (e, t) in tmp.iter().enumerate() {
                    kt[(d + e) * TILE + slot] = *t;
                }
                d += 8;
            }
        }
        // scores: an FMA chain over d per key (simd_gemm with lanes over keys), then the scale
        let mut tile_max = f32::NEG_INFINITY;
        for g in 0..TILE / 8 {
            if !used[8 * g..8 * g + 8].iter().any(|&u| u) {
                continue;
            }
            let mut acc = _mm256_setzero_ps();
            for (d, &qd) in q.iter().enumerate() {
                acc = _mm256_fmadd_ps(_mm256_loadu_ps(kt.as_ptr().add(d * TILE + 8 * g)), _mm256_set1_ps(qd), acc);
            }
            let mut sc = [0f32; 8];
            _mm256_storeu_ps(sc.as_mut_ptr(), acc);
            for e in 0..8 {
                let slot = 8 * g + e;
                row[slot] = if used[slot] { sc[e] * kscale } else { f32::NEG_INFINITY };
                if row[slot] > tile_max {
                    tile_max = row[slot];
                }
            }
        }
        for g in 0..TILE / 8 {
            if !used[8 * g..8 * g + 8].iter().any(|&u| u) {
                row[8 * g..8 * g + 8].fill(f32::NEG_INFINITY);
            }
        }
        let m_new = m.max(tile_max);
        if m_new > m {
            let ms = (m - m_new).exp();
            for v in out.iter_mut() {
                *v *= ms;
            }
            s *= ms;
        }
        m = m_new;
        // probabilities: ggml_vec_soft_max_f32 over the 64-entry row
        let mut sum = 0f64;
        for g in 0..TILE / 8 {
            let x = _mm256_sub_ps(_mm256_loadu_ps(row.as_ptr().add(8 * g)), _mm256_set1_ps(m));
            let e = super::act::v_expf_pub(x);
            _mm256_storeu_ps(row.as_mut_ptr().add(8 * g), e);
            sum += super::vec::hsum8_ggml(&row[8 * g..8 * g + 8]) as f64;
        }
        s = (s as f64 + sum) as f32;
        // V: one FMA chain per output element over the tile's keys in order
        for &(_, cell) in keys {
            let p = _mm256_set1_ps(row[cell as usize % TILE]);
            let v = v_row(cell);
            let mut d = 0;
            while d + 8 <= hd_v {
                let vv = _mm256_cvtph_ps(_mm_loadu_si128(v.as_ptr().add(d) as *const __m128i));
                let o = _mm256_loadu_ps(out.as_ptr().add(d));
                _mm256_storeu_ps(out.as_mut_ptr().add(d), _mm256_fmadd_ps(vv, p, o));
                d += 8;
            }
        }
        i = j;
    }
    let inv = if s == 0.0 { 0.0 } else { 1.0 / s };
    for v in out.iter_mut() {
        *v *= inv;
    }
}
