//! The samplers (pipeline step 15): llama.cpp's built-in samplers and chains of them
//! (`samplers`), its random numbers (`rng`), and here the candidate selection that every
//! sort of a sampler uses, the one part of a chain that has to look at every logit of a row.
//!
//! Python (pyllama.sampling) owns the sampler objects and chains; their math is here. Top-k
//! over 49k-262k logits is one pass over the row. Only comparisons happen, so the result is
//! exact: the positions of a stable descending sort (NaN last), in that order.

pub mod rng;
pub mod samplers;

use std::cmp::Ordering;

/// The order every sampler's "sort" uses: larger logit first, on equal logits the lower
/// position first; NaN ranks below every number (numpy's argsort(-x) puts it last).
#[inline]
fn cmp_rank(a: f32, ia: u32, b: f32, ib: u32) -> Ordering {
    match (a.is_nan(), b.is_nan()) {
        (false, false) => b.partial_cmp(&a).unwrap_or(Ordering::Equal).then(ia.cmp(&ib)),
        (false, true) => Ordering::Less,
        (true, false) => Ordering::Greater,
        (true, true) => ia.cmp(&ib),
    }
}

/// Positions of the `k` best entries of `logits` (best first, in [`cmp_rank`] order).
///
/// Small k: one scan that keeps the k best seen so far in a sorted buffer; once it is full
/// only values above its last entry are looked at, and those are rare after the first few
/// thousand entries (about k * ln(n / k) insertions for a row in random order), so the
/// scan is a vectorizable compare over chunks of 64. Large k, or a row whose order makes
/// the buffer churn (e.g. ascending), falls back to select_nth + sort of the k survivors.
pub fn top_k_indices(logits: &[f32], k: usize) -> Vec<u32> {
    let n = logits.len();
    let k = k.min(n);
    if k == 0 {
        return Vec::new();
    }
    assert!(n <= u32::MAX as usize, "top_k_indices: row longer than u32::MAX");
    if k <= 128 {
        if n >= 8192 {
            if let Some(r) = top_k_sampled(logits, k) {
                return r;
            }
        }
        if let Some(r) = top_k_scan(logits, k) {
            return r;
        }
    }
    top_k_select(logits, k)
}

/// Long rows: a threshold from every 8th entry, then one vectorizable pass that keeps the
/// entries at or above it, and a sort of those few. The threshold is the (k/2)-th best of
/// the sample, so it is at most the row's k-th best value and about k/2 * 8 entries pass;
/// every entry left out is below it (or NaN) and so ranks after every candidate: the row's
/// best k are the candidates' best k. None (take the scan) when fewer than k pass, or far
/// too many (a row with huge ties), or the sample has no usable threshold.
fn top_k_sampled(logits: &[f32], k: usize) -> Option<Vec<u32>> {
    const STRIDE: usize = 8;
    let sample: Vec<f32> = logits.iter().step_by(STRIDE).copied().collect();
    let ks = (k / 2).max(1);
    let best = top_k_scan(&sample, ks)?;
    let t0 = sample[*best.last()? as usize];
    if t0.is_nan() {
        return None;
    }
    let limit = 64 * k + 4096;
    let mut cand: Vec<u32> = Vec::with_capacity(4 * k * STRIDE);
    for (c, chunk) in logits.chunks(64).enumerate() {
        if chunk.iter().fold(false, |a, &v| a | (v >= t0)) {
            for (o, &v) in chunk.iter().enumerate() {
                if v >= t0 {
                    cand.push((c * 64 + o) as u32);
                }
            }
            if cand.len() > limit {
                return None;
            }
        }
    }
    if cand.len() < k {
        return None;
    }
    let cmp = |&a: &u32, &b: &u32| cmp_rank(logits[a as usize], a, logits[b as usize], b);
    if k < cand.len() {
        cand.select_nth_unstable_by(k - 1, cmp);
        cand.truncate(k);
    }
    cand.sort_unstable_by(cmp);
    Some(cand)
}

fn top_k_scan(logits: &[f32], k: usize) -> Option<Vec<u32>> {
    let n = logits.len();
    // (value, position) of the best k so far, best first. Capacity k + 1: insert, then pop.
    let mut vals: Vec<f32> = Vec::with_capacity(k + 1);
    let mut idx: Vec<u32> = Vec::with_capacity(k + 1);
    let budget = 4096 + 32 * k; // insertions allowed before the scan gives up
    let mut inserts = 0usize;

    let insert = |v: f32, i: u32, vals: &mut Vec<f32>, idx: &mut Vec<u32>| {
        // first slot that the new entry beats; positions only grow, so among equal values
        // the earlier entry stays ahead
        // the buffer is in rank order and `i` is the largest position so far, so the
        // entries ahead of the new one are a prefix: numbers >= v (all of them when v is NaN)
        let j = if v.is_nan() { vals.len() } else { vals.partition_point(|&e| !e.is_nan() && e >= v) };
        debug_assert!(j == vals.len() || cmp_rank(v, i, vals[j], idx[j]) == Ordering::Less);
        vals.insert(j, v);
        idx.insert(j, i);
        if vals.len() > k {
            vals.pop();
            idx.pop();
        }
    };

    let mut i = 0usize;
    while i < n && vals.len() < k {
        insert(logits[i], i as u32, &mut vals, &mut idx);
        i += 1;
    }
    const CH: usize = 64;
    while i < n {
        let thr = vals[k - 1];
        let end = (i + CH).min(n);
        let chunk = &logits[i..end];
        // NaN threshold: any number beats it, so look at every entry
        let any = thr.is_nan() || chunk.iter().fold(false, |a, &v| a | (v > thr));
        if any {
            for (o, &v) in chunk.iter().enumerate() {
                // beats the k-th best (vals[k-1], at a lower position): strictly greater,
                // or any number when the k-th best is NaN; a NaN never beats anything here
                let t = vals[k - 1];
                let beats = if t.is_nan() { !v.is_nan() } else { v > t };
                if beats {
                    insert(v, (i + o) as u32, &mut vals, &mut idx);
                    inserts += 1;
                }
            }
            if inserts > budget {
                return None;
            }
        }
        i = end;
    }
    Some(idx)
}

fn top_k_select(logits: &[f32], k: usize) -> Vec<u32> {
    let mut idx: Vec<u32> = (0..logits.len() as u32).collect();
    let cmp = |&a: &u32, &b: &u32| cmp_rank(logits[a as usize], a, logits[b as usize], b);
    if k < idx.len() {
        idx.select_nth_unstable_by(k - 1, cmp);
        idx.truncate(k);
    }
    idx.sort_unstable_by(cmp);
    idx
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The definition: sort every position by rank, keep k.
    fn naive(logits: &[f32], k: usize) -> Vec<u32> {
        let mut idx: Vec<u32> = (0..logits.len() as u32).collect();
        idx.sort_by(|&a, &b| cmp_rank(logits[a as usize], a, logits[b as usize], b));
        idx.truncate(k);
        idx
    }

    fn lcg(state: &mut u64) -> u32 {
        *state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (*state >> 33) as u32
    }

    #[test]
    fn matches_full_sort_on_random_rows_with_ties_nan_and_inf() {
        let mut s = 7u64;
        for case in 0..200 {
            let n = 1 + (lcg(&mut s) as usize % 3000);
            let levels = 1 + lcg(&mut s) % 50; // few levels -> many ties
            let mut row: Vec<f32> = (0..n).map(|_| (lcg(&mut s) % levels) as f32 * 0.25 - 3.0).collect();
            if case % 3 == 0 {
                for _ in 0..3 {
                    let j = lcg(&mut s) as usize % n;
                    row[j] = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY][lcg(&mut s) as usize % 3];
                }
            }
            for &k in &[1usize, 2, 5, 40, 128, 129, 500, n, n + 3] {
                assert_eq!(top_k_indices(&row, k), naive(&row, k), "case {case} n {n} k {k}");
            }
        }
    }

    #[test]
    fn long_rows_through_the_sampled_threshold_match_the_full_sort() {
        let mut s = 11u64;
        for case in 0..12 {
            let n = 8192 + (lcg(&mut s) as usize % 60000);
            let levels = [3u32, 40, 100_000][case % 3]; // 3 levels: huge ties -> fallback
            let mut row: Vec<f32> = (0..n).map(|_| (lcg(&mut s) % levels) as f32 * 0.01).collect();
            if case % 4 == 1 {
                for j in (0..n).step_by(8) {
                    row[j] = f32::NAN; // the whole sample is NaN: no threshold
                }
            }
            if case % 4 == 2 {
                for j in (0..n).step_by(97) {
                    row[j] = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY][j % 3];
                }
            }
            for &k in &[1usize, 2, 40, 128] {
                assert_eq!(top_k_indices(&row, k), naive(&row, k), "case {case} n {n} k {k}");
            }
        }
    }

    #[test]
    fn ascending_row_falls_back_and_stays_exact() {
        let row: Vec<f32> = (0..50_000).map(|i| i as f32).collect();
        assert_eq!(top_k_indices(&row, 40), naive(&row, 40));
        let all_nan = vec![f32::NAN; 100];
        assert_eq!(top_k_indices(&all_nan, 5), vec![0, 1, 2, 3, 4]);
        assert!(top_k_indices(&row, 0).is_empty());
        assert!(top_k_indices(&[], 3).is_empty());
    }
}
