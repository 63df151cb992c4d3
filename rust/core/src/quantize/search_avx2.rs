//! AVX2 versions of the quantizers' trial-scale searches, vectorized across the trials
//! rather than across the values: each lane runs one trial's scalar loop over the values
//! in the scalar order (the same multiplies and adds, no FMA), so every sum is the scalar
//! sum bit for bit and the choice made from them (in trial order, by the caller) is
//! ggml's. ggml's own loops are scalar: one trial after the other, and for IQ4_NL a
//! branchy binary search per value, which is where their time goes.

#![allow(clippy::missing_safety_doc)]

use std::arch::x86_64::*;

/// ggml's `nearest_int` on 8 lanes: round half to even through 1.5 * 2^23.
#[inline(always)]
unsafe fn nearest_int8(v: __m256) -> __m256i {
    let t = _mm256_add_ps(v, _mm256_set1_ps(12582912.0));
    _mm256_sub_epi32(_mm256_and_si256(_mm256_castps_si256(t), _mm256_set1_epi32(0x007f_ffff)), _mm256_set1_epi32(0x0040_0000))
}

/// The trial of lane `k` of `make_qx_quants`' search: is = -9..=-1, 1..=9 (lanes 18..24
/// repeat is = 9 and are not looked at).
#[inline(always)]
pub(super) fn qx_trial_is(k: usize) -> i32 {
    match k {
        0..=8 => k as i32 - 9,
        9..=17 => k as i32 - 8,
        _ => 9,
    }
}

/// `make_qx_quants`' 18 trial scales at once: for trial k (see `qx_trial_is`),
/// iscale = -(nmax + 0.1 is) / max, l_i = clamp(nearest_int(iscale x_i), -nmax, nmax-1),
/// sumlx[k] = sum w_i x_i l_i and suml2[k] = sum w_i l_i l_i, accumulated in i order as
/// `(w*x)*l` and `(w*l)*l`.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn qx_trials(nmax: i32, x: &[f32], w: &[f32], max: f32, sumlx: &mut [f32; 24], suml2: &mut [f32; 24]) {
    let n = x.len().min(w.len());
    let mut isc = [0f32; 24];
    for (k, s) in isc.iter_mut().enumerate() {
        *s = -(nmax as f32 + 0.1f32 * qx_trial_is(k) as f32) / max;
    }
    let is0 = _mm256_loadu_ps(isc.as_ptr());
    let is1 = _mm256_loadu_ps(isc.as_ptr().add(8));
    let is2 = _mm256_loadu_ps(isc.as_ptr().add(16));
    let hi = _mm256_set1_epi32(nmax - 1);
    let lo = _mm256_set1_epi32(-nmax);
    let z = _mm256_setzero_ps();
    let (mut sx0, mut sx1, mut sx2) = (z, z, z);
    let (mut s20, mut s21, mut s22) = (z, z, z);
    for i in 0..n {
        let xi = _mm256_set1_ps(x[i]);
        let wi = _mm256_set1_ps(w[i]);
        let wx = _mm256_set1_ps(w[i] * x[i]);
        let level = |is: __m256| {
            let l = nearest_int8(_mm256_mul_ps(is, xi));
            _mm256_cvtepi32_ps(_mm256_max_epi32(_mm256_min_epi32(l, hi), lo))
        };
        let (l0, l1, l2) = (level(is0), level(is1), level(is2));
        sx0 = _mm256_add_ps(sx0, _mm256_mul_ps(wx, l0));
        sx1 = _mm256_add_ps(sx1, _mm256_mul_ps(wx, l1));
        sx2 = _mm256_add_ps(sx2, _mm256_mul_ps(wx, l2));
        s20 = _mm256_add_ps(s20, _mm256_mul_ps(_mm256_mul_ps(wi, l0), l0));
        s21 = _mm256_add_ps(s21, _mm256_mul_ps(_mm256_mul_ps(wi, l1), l1));
        s22 = _mm256_add_ps(s22, _mm256_mul_ps(_mm256_mul_ps(wi, l2), l2));
    }
    _mm256_storeu_ps(sumlx.as_mut_ptr(), sx0);
    _mm256_storeu_ps(sumlx.as_mut_ptr().add(8), sx1);
    _mm256_storeu_ps(sumlx.as_mut_ptr().add(16), sx2);
    _mm256_storeu_ps(suml2.as_mut_ptr(), s20);
    _mm256_storeu_ps(suml2.as_mut_ptr().add(8), s21);
    _mm256_storeu_ps(suml2.as_mut_ptr().add(16), s22);
}

/// Eight trials of `make_qkx2_quants` / `make_qkx3_quants` at inverse scales `iscale`
/// with the caller's current `min` (`xm` = x - min): per lane the levels
/// l_i = clamp(nearest_int(iscale xm_i), 0, nmax), the sums sum w l, sum (w l) l,
/// sum (w l) x in i order, D, this_scale and this_min as ggml computes them (this_min > 0:
/// 0 and sum_xl / sum_l2), and the weighted error of the fit (|diff| or diff^2).
/// A lane's results mean something only where D > 0, as in ggml.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2")]
pub(super) unsafe fn qkx_trials(
    nmax: i32,
    x: &[f32],
    xm: &[f32],
    w: &[f32],
    sum_w: f32,
    sum_x: f32,
    iscale: &[f32; 8],
    use_mad: bool,
    out_d: &mut [f32; 8],
    out_err: &mut [f32; 8],
    out_scale: &mut [f32; 8],
    out_min: &mut [f32; 8],
) {
    let n = x.len().min(xm.len()).min(w.len());
    let isc = _mm256_loadu_ps(iscale.as_ptr());
    let hi = _mm256_set1_epi32(nmax);
    let lo = _mm256_setzero_si256();
    let level = |i: usize| {
        let l = nearest_int8(_mm256_mul_ps(isc, _mm256_set1_ps(xm[i])));
        _mm256_cvtepi32_ps(_mm256_max_epi32(_mm256_min_epi32(l, hi), lo))
    };
    let z = _mm256_setzero_ps();
    let (mut sl, mut sl2, mut sxl) = (z, z, z);
    for i in 0..n {
        let lf = level(i);
        let wl = _mm256_mul_ps(_mm256_set1_ps(w[i]), lf);
        sl = _mm256_add_ps(sl, wl);
        sl2 = _mm256_add_ps(sl2, _mm256_mul_ps(wl, lf));
        sxl = _mm256_add_ps(sxl, _mm256_mul_ps(wl, _mm256_set1_ps(x[i])));
    }
    let sw = _mm256_set1_ps(sum_w);
    let sx = _mm256_set1_ps(sum_x);
    let d = _mm256_sub_ps(_mm256_mul_ps(sw, sl2), _mm256_mul_ps(sl, sl));
    let mut scale = _mm256_div_ps(_mm256_sub_ps(_mm256_mul_ps(sw, sxl), _mm256_mul_ps(sx, sl)), d);
    let mut min = _mm256_div_ps(_mm256_sub_ps(_mm256_mul_ps(sl2, sx), _mm256_mul_ps(sl, sxl)), d);
    let pos = _mm256_cmp_ps::<_CMP_GT_OQ>(min, z);
    min = _mm256_blendv_ps(min, z, pos);
    scale = _mm256_blendv_ps(scale, _mm256_div_ps(sxl, sl2), pos);
    let abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
    let mut err = z;
    for i in 0..n {
        let lf = level(i);
        let mut diff = _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(scale, lf), min), _mm256_set1_ps(x[i]));
        diff = if use_mad { _mm256_and_ps(diff, abs_mask) } else { _mm256_mul_ps(diff, diff) };
        err = _mm256_add_ps(err, _mm256_mul_ps(_mm256_set1_ps(w[i]), diff));
    }
    _mm256_storeu_ps(out_d.as_mut_ptr(), d);
    _mm256_storeu_ps(out_err.as_mut_ptr(), err);
    _mm256_storeu_ps(out_scale.as_mut_ptr(), scale);
    _mm256_storeu_ps(out_min.as_mut_ptr(), min);
}

/// The 16 values of a 4-bit table as two float vectors.
#[derive(Clone, Copy)]
pub(super) struct Table16 {
    lo: __m256,
    hi: __m256,
}

impl Table16 {
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn new(values: &[i8; 16]) -> Table16 {
        let f: [f32; 16] = std::array::from_fn(|i| values[i] as f32);
        Table16 { lo: _mm256_loadu_ps(f.as_ptr()), hi: _mm256_loadu_ps(f.as_ptr().add(8)) }
    }

    /// values[idx] per lane (idx in 0..16).
    #[inline(always)]
    unsafe fn at(self, idx: __m256i) -> __m256 {
        let a = _mm256_permutevar8x32_ps(self.lo, idx);
        let b = _mm256_permutevar8x32_ps(self.hi, idx);
        _mm256_blendv_ps(a, b, _mm256_castsi256_ps(_mm256_cmpgt_epi32(idx, _mm256_set1_epi32(7))))
    }

    /// `best_index_int8` per lane, the same answer for every input including the ends,
    /// infinities and NaN: the position p of the last value not above x (0 if none; NaN
    /// counts as above all) by a branch-free binary search, mu = min(p + 1, 15), then
    /// `x - values[mu-1] < values[mu] - x ? mu - 1 : mu` as the scalar code ends.
    #[inline(always)]
    pub(super) unsafe fn best_index(self, x: __m256) -> __m256i {
        let mut pos = _mm256_setzero_si256();
        for step in [8, 4, 2, 1] {
            let s = _mm256_set1_epi32(step);
            let cand = _mm256_add_epi32(pos, s);
            let ge = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_NLT_UQ>(x, self.at(cand)));
            pos = _mm256_add_epi32(pos, _mm256_and_si256(ge, s));
        }
        let mu = _mm256_min_epi32(_mm256_add_epi32(pos, _mm256_set1_epi32(1)), _mm256_set1_epi32(15));
        let below = self.at(_mm256_sub_epi32(mu, _mm256_set1_epi32(1)));
        let above = self.at(mu);
        let lt = _mm256_cmp_ps::<_CMP_LT_OQ>(_mm256_sub_ps(x, below), _mm256_sub_ps(above, x));
        _mm256_add_epi32(mu, _mm256_castps_si256(lt))
    }
}

/// `best_index_int8(values, id * x[j])` for every j, into `l` (x.len() a multiple of 8).
#[target_feature(enable = "avx2")]
pub(super) unsafe fn best_indices(t: Table16, id: f32, x: &[f32], l: &mut [u8]) {
    let idv = _mm256_set1_ps(id);
    let mut buf = [0i32; 8];
    for (xc, lc) in x.chunks_exact(8).zip(l.chunks_exact_mut(8)) {
        let idx = t.best_index(_mm256_mul_ps(idv, _mm256_loadu_ps(xc.as_ptr())));
        _mm256_storeu_si256(buf.as_mut_ptr() as *mut __m256i, idx);
        for (d, s) in lc.iter_mut().zip(buf) {
            *d = s as u8;
        }
    }
}

/// The 16 trials of `quantize_row_iq4_nl_impl` (ntry = 7) for one block `xb` of 32 with
/// weights `w`: lane 0 is the first pass (inverse scale `id0`), lanes 1..16 are itry =
/// -7..=7 (inverse scale (itry + values[0]) / max). For each, sumqx = sum (w q) x and
/// sumq2 = sum (w q) q in j order with q = values[best_index(id x_j)]; lane 0's indices go
/// to `l`.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn iq4_trials(t: Table16, v0: i32, id0: f32, max: f32, xb: &[f32], w: &[f32], l: &mut [u8], sumqx: &mut [f32; 16], sumq2: &mut [f32; 16]) {
    let mut ids = [0f32; 16];
    ids[0] = id0;
    for (k, id) in ids.iter_mut().enumerate().skip(1) {
        *id = (k as i32 - 8 + v0) as f32 / max;
    }
    let id_a = _mm256_loadu_ps(ids.as_ptr());
    let id_b = _mm256_loadu_ps(ids.as_ptr().add(8));
    let z = _mm256_setzero_ps();
    let (mut qx_a, mut qx_b, mut q2_a, mut q2_b) = (z, z, z, z);
    let n = xb.len().min(w.len()).min(l.len());
    for j in 0..n {
        let xj = _mm256_set1_ps(xb[j]);
        let wj = _mm256_set1_ps(w[j]);
        let ia = t.best_index(_mm256_mul_ps(id_a, xj));
        let ib = t.best_index(_mm256_mul_ps(id_b, xj));
        l[j] = _mm256_cvtsi256_si32(ia) as u8;
        let qa = t.at(ia);
        let qb = t.at(ib);
        let wqa = _mm256_mul_ps(wj, qa);
        let wqb = _mm256_mul_ps(wj, qb);
        qx_a = _mm256_add_ps(qx_a, _mm256_mul_ps(wqa, xj));
        qx_b = _mm256_add_ps(qx_b, _mm256_mul_ps(wqb, xj));
        q2_a = _mm256_add_ps(q2_a, _mm256_mul_ps(wqa, qa));
        q2_b = _mm256_add_ps(q2_b, _mm256_mul_ps(wqb, qb));
    }
    _mm256_storeu_ps(sumqx.as_mut_ptr(), qx_a);
    _mm256_storeu_ps(sumqx.as_mut_ptr().add(8), qx_b);
    _mm256_storeu_ps(sumq2.as_mut_ptr(), q2_a);
    _mm256_storeu_ps(sumq2.as_mut_ptr().add(8), q2_b);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::legacy::{best_index_int8, KVALUES_IQ4NL};

    #[test]
    fn best_index_matches_the_scalar_search_everywhere() {
        if !std::is_x86_feature_detected!("avx2") {
            return;
        }
        let mut xs: Vec<f32> = vec![f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 0.0, -0.0, 1e30, -1e30];
        for v in KVALUES_IQ4NL {
            let v = v as f32;
            xs.extend([v, v.next_up(), v.next_down(), v + 0.5, v - 0.5]);
        }
        for w in KVALUES_IQ4NL.windows(2) {
            let mid = (w[0] as f32 + w[1] as f32) / 2.0;
            xs.extend([mid, mid.next_up(), mid.next_down()]);
        }
        let mut i = -140.0f32;
        while i < 140.0 {
            xs.push(i);
            i += 0.037;
        }
        xs.resize(xs.len().div_ceil(8) * 8, 0.0);
        let mut got = vec![0u8; xs.len()];
        unsafe { best_indices(Table16::new(&KVALUES_IQ4NL), 1.0, &xs, &mut got) };
        for (x, g) in xs.iter().zip(got) {
            assert_eq!(g as usize, best_index_int8(&KVALUES_IQ4NL, *x), "x = {x}");
        }
    }
}
