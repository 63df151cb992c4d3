//! Weight quantizers: float rows -> ggml blocks, as llama-quantize writes them
//! (ggml-quants.c `quantize_<type>`: the `quantize_row_*_ref` reference when there is no
//! importance matrix, the weighted `quantize_row_*_impl` search when there is one).
//!
//! Byte-identical to ggml is the bar, so every expression keeps C's evaluation order and
//! C's int -> float conversions (`w*l*l` is `(w*l)*l` in f32; `-nmax / max` converts the
//! int first). ggml-base is built for baseline x86-64 (no FMA contraction, SSE scalar
//! arithmetic), which is what plain Rust f32 arithmetic does too.
//!
//! Block layouts are in `quant/legacy.rs` and `quant/kquants.rs`.

use crate::ggml_type::{GgmlType, QK_K};
use crate::quant::fp::{f32_to_bf16, f32_to_f16};
use crate::quant::lowbit::{self, best_index_mxfp4};
use crate::quant::legacy::{self, best_index_int8, KVALUES_IQ4NL};

const GROUP_MAX_EPS: f32 = 1e-15;

/// ggml's `nearest_int`: round half to even through the 1.5 * 2^23 trick.
#[inline(always)]
pub(super) fn nearest_int(v: f32) -> i32 {
    let val = v + 12582912.0;
    (val.to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
}

#[inline(always)]
fn wr_f16(b: &mut [u8], o: usize, v: f32) {
    b[o..o + 2].copy_from_slice(&f32_to_f16(v).to_le_bytes());
}

/// C's `MAX(a, b)` = `a > b ? a : b`.
#[inline(always)]
pub(super) fn cmax(a: f32, b: f32) -> f32 {
    if a > b {
        a
    } else {
        b
    }
}

/// sum of x^2, in order.
#[inline(always)]
pub(super) fn sum_sq(x: &[f32]) -> f32 {
    let mut s = 0f32;
    for &v in x {
        s += v * v;
    }
    s
}

/// C's `MAX` over a slice (`a > b ? a : b`, from the first value).
#[inline(always)]
pub(super) fn cmax_of(x: &[f32]) -> f32 {
    let mut m = x[0];
    for &v in &x[1..] {
        m = cmax(m, v);
    }
    m
}

// ------------------------------------------------------------------ scale searches

/// `make_qx_quants`: symmetric scale for levels [-nmax, nmax-1]; `l_out` gets level + nmax.
/// (n <= 32 in every caller; the weights are computed once instead of per pass, the same
/// values.)
#[inline(always)]
fn make_qx_quants(n: usize, nmax: i32, x: &[f32], l_out: &mut [i8], mut rmse_type: i32, qw: Option<&[f32]>) -> f32 {
    assert!(n <= 32);
    let x = &x[..n];
    let l_out = &mut l_out[..n];
    let mut max = 0f32;
    let mut amax = 0f32;
    for &v in x {
        let ax = v.abs();
        if ax > amax {
            amax = ax;
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        l_out.fill(0);
        return 0.0;
    }
    let mut iscale = -(nmax as f32) / max;
    if rmse_type == 0 {
        for i in 0..n {
            let l = nearest_int(iscale * x[i]);
            l_out[i] = (nmax + l.min(nmax - 1).max(-nmax)) as i8;
        }
        return 1.0 / iscale;
    }
    let mut return_early = false;
    if rmse_type < 0 {
        rmse_type = -rmse_type;
        return_early = true;
    }
    let mut wbuf = [0f32; 32];
    let w = &mut wbuf[..n];
    match qw {
        Some(q) => w.copy_from_slice(&q[..n]),
        None => {
            for i in 0..n {
                w[i] = match rmse_type {
                    1 => x[i] * x[i],
                    2 => 1.0,
                    3 => x[i].abs(),
                    _ => x[i].abs().sqrt(),
                };
            }
        }
    }
    let w = &*w;
    let mut sumlx = 0f32;
    let mut suml2 = 0f32;
    for i in 0..n {
        let l = nearest_int(iscale * x[i]).min(nmax - 1).max(-nmax);
        l_out[i] = (l + nmax) as i8;
        let lf = l as f32;
        sumlx += w[i] * x[i] * lf;
        suml2 += w[i] * lf * lf;
    }
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    if return_early {
        return if suml2 > 0.0 { 0.5 * (scale + 1.0 / iscale) } else { 1.0 / iscale };
    }
    let mut best = scale * sumlx;
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") {
        // All 18 trials at once (the same sums), then ggml's choice in trial order; the
        // levels are those of the last trial that improved, as ggml's loop leaves them.
        let (mut slx, mut sl2) = ([0f32; 24], [0f32; 24]);
        // SAFETY: the CPU has AVX2 (checked above).
        unsafe { super::search_avx2::qx_trials(nmax, x, w, max, &mut slx, &mut sl2) };
        let mut best_is = 0;
        for k in 0..18 {
            if sl2[k] > 0.0 && slx[k] * slx[k] > best * sl2[k] {
                scale = slx[k] / sl2[k];
                best = scale * slx[k];
                best_is = super::search_avx2::qx_trial_is(k);
            }
        }
        if best_is != 0 {
            iscale = -(nmax as f32 + 0.1f32 * best_is as f32) / max;
            for i in 0..n {
                l_out[i] = (nmax + nearest_int(iscale * x[i]).min(nmax - 1).max(-nmax)) as i8;
            }
        }
        return scale;
    }
    let mut lbuf = [0f32; 32];
    let ls = &mut lbuf[..n];
    for is in -9i32..=9 {
        if is == 0 {
            continue;
        }
        iscale = -(nmax as f32 + 0.1f32 * is as f32) / max;
        for i in 0..n {
            ls[i] = nearest_int(iscale * x[i]).min(nmax - 1).max(-nmax) as f32;
        }
        sumlx = 0.0;
        suml2 = 0.0;
        for i in 0..n {
            sumlx += w[i] * x[i] * ls[i];
            suml2 += w[i] * ls[i] * ls[i];
        }
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            for i in 0..n {
                l_out[i] = (nmax + ls[i] as i32) as i8;
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// `make_q3_quants` (Q3_K reference): levels [-nmax, nmax-1] + nmax.
#[inline(always)]
fn make_q3_quants(n: usize, nmax: i32, x: &[f32], l_out: &mut [i8], do_rmse: bool) -> f32 {
    let mut max = 0f32;
    let mut amax = 0f32;
    for &v in &x[..n] {
        let ax = v.abs();
        if ax > amax {
            amax = ax;
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        l_out[..n].fill(0);
        return 0.0;
    }
    let iscale = -(nmax as f32) / max;
    if do_rmse {
        let mut sumlx = 0f32;
        let mut suml2 = 0f32;
        for i in 0..n {
            let l = nearest_int(iscale * x[i]).min(nmax - 1).max(-nmax);
            l_out[i] = l as i8;
            let w = x[i] * x[i];
            let lf = l as f32;
            sumlx += w * x[i] * lf;
            suml2 += w * lf * lf;
        }
        for _ in 0..5 {
            let mut n_changed = 0;
            for i in 0..n {
                let w = x[i] * x[i];
                let li = l_out[i] as f32;
                let mut slx = sumlx - w * x[i] * li;
                if slx > 0.0 {
                    let mut sl2 = suml2 - w * li * li;
                    let new_l = nearest_int(x[i] * sl2 / slx).min(nmax - 1).max(-nmax);
                    if new_l != l_out[i] as i32 {
                        let nf = new_l as f32;
                        slx += w * x[i] * nf;
                        sl2 += w * nf * nf;
                        if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                            l_out[i] = new_l as i8;
                            sumlx = slx;
                            suml2 = sl2;
                            n_changed += 1;
                        }
                    }
                }
            }
            if n_changed == 0 {
                break;
            }
        }
        for v in &mut l_out[..n] {
            *v += nmax as i8;
        }
        return if suml2 > 0.0 { sumlx / suml2 } else { 0.0 };
    }
    for i in 0..n {
        let l = nearest_int(iscale * x[i]).min(nmax - 1).max(-nmax);
        l_out[i] = (l + nmax) as i8;
    }
    1.0 / iscale
}

/// `make_qkx2_quants` (`le == false`) and `make_qkx3_quants` (`le == true`, which tests
/// `max <= min` and always has weights here): scale and min for levels [0, nmax].
/// Returns (scale, the_min).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn make_qkx_quants(
    n: usize,
    nmax: i32,
    x: &[f32],
    weights: &[f32],
    l_out: &mut [u8],
    laux: &mut [u8],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
    use_mad: bool,
    le: bool,
) -> (f32, f32) {
    let x = &x[..n];
    let weights = &weights[..n];
    let l_out = &mut l_out[..n];
    let laux = &mut laux[..n];
    let mut min = x[0];
    let mut max = x[0];
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        let w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if (le && max <= min) || (!le && max == min) {
        l_out.fill(0);
        return (0.0, -min);
    }
    let nmaxf = nmax as f32;
    let mut iscale = nmaxf / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0f32;
    for i in 0..n {
        let l = nearest_int(iscale * (x[i] - min));
        l_out[i] = l.min(nmax).max(0) as u8;
    }
    for i in 0..n {
        let mut diff = scale * l_out[i] as f32 + min - x[i];
        diff = if use_mad { diff.abs() } else { diff * diff };
        best_error += weights[i] * diff;
    }
    if nstep < 1 {
        return (scale, -min);
    }
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") {
        // Eight trials at once (the same sums and errors), chosen in trial order. ggml's
        // trials read `min`, which an accepted trial changes: when it does, the trials after
        // it are computed again with the new one.
        let mut xm = [0f32; 32];
        let mut best: Option<(f32, f32)> = None; // (iscale, min) of the accepted trial
        let mut is = 0i32;
        'trials: while is <= nstep {
            for i in 0..n {
                xm[i] = x[i] - min;
            }
            let isc: [f32; 8] = std::array::from_fn(|k| (rmin + rdelta * (is + k as i32) as f32 + nmaxf) / (max - min));
            let (mut dd, mut err, mut sc, mut mn) = ([0f32; 8], [0f32; 8], [0f32; 8], [0f32; 8]);
            // SAFETY: the CPU has AVX2 (checked above).
            unsafe {
                super::search_avx2::qkx_trials(nmax, x, &xm[..n], weights, sum_w, sum_x, &isc, use_mad, &mut dd, &mut err, &mut sc, &mut mn)
            };
            for k in 0..8 {
                if is + k as i32 > nstep {
                    break;
                }
                if dd[k] > 0.0 && err[k] < best_error {
                    best = Some((isc[k], min));
                    best_error = err[k];
                    scale = sc[k];
                    let moved = mn[k].to_bits() != min.to_bits();
                    min = mn[k];
                    if moved {
                        is += k as i32 + 1;
                        continue 'trials;
                    }
                }
            }
            is += 8;
        }
        if let Some((isc, m)) = best {
            for i in 0..n {
                l_out[i] = nearest_int(isc * (x[i] - m)).min(nmax).max(0) as u8;
            }
        }
        return (scale, -min);
    }
    let mut lf = [0f32; 32];
    let lf = &mut lf[..n];
    for is in 0..=nstep {
        iscale = (rmin + rdelta * is as f32 + nmaxf) / (max - min);
        for i in 0..n {
            let l = nearest_int(iscale * (x[i] - min)).min(nmax).max(0);
            laux[i] = l as u8;
            lf[i] = l as f32;
        }
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0f32, 0f32, 0f32);
        for i in 0..n {
            let w = weights[i];
            sum_l += w * lf[i];
            sum_l2 += w * lf[i] * lf[i];
            sum_xl += w * lf[i] * x[i];
        }
        let d = sum_w * sum_l2 - sum_l * sum_l;
        if d > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / d;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / d;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur_error = 0f32;
            for i in 0..n {
                let mut diff = this_scale * lf[i] + this_min - x[i];
                diff = if use_mad { diff.abs() } else { diff * diff };
                cur_error += weights[i] * diff;
            }
            if cur_error < best_error {
                l_out.copy_from_slice(laux);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

pub(super) fn make_qp_quants_pub(n: usize, nmax: i32, x: &[f32], l_out: &mut [u8], qw: &[f32]) -> f32 {
    make_qp_quants(n, nmax, x, l_out, qw)
}

/// `make_qp_quants`: unsigned levels [0, nmax] for a set of (non-negative) scales.
#[inline(always)]
fn make_qp_quants(n: usize, nmax: i32, x: &[f32], l_out: &mut [u8], qw: &[f32]) -> f32 {
    let mut max = 0f32;
    for &v in &x[..n] {
        max = cmax(max, v);
    }
    if max < GROUP_MAX_EPS {
        l_out[..n].fill(0);
        return 0.0;
    }
    let nmaxf = nmax as f32;
    let mut iscale = nmaxf / max;
    for i in 0..n {
        l_out[i] = nearest_int(iscale * x[i]) as u8;
    }
    let scale = 1.0 / iscale;
    let mut best_mse = 0f32;
    for i in 0..n {
        let diff = x[i] - scale * l_out[i] as f32;
        best_mse += qw[i] * diff * diff;
    }
    for is in -4i32..=4 {
        if is == 0 {
            continue;
        }
        let iscale_is = (0.1f32 * is as f32 + nmaxf) / max;
        let scale_is = 1.0 / iscale_is;
        let mut mse = 0f32;
        for i in 0..n {
            let l = nearest_int(iscale_is * x[i]).min(nmax);
            let diff = x[i] - scale_is * l as f32;
            mse += qw[i] * diff * diff;
        }
        if mse < best_mse {
            best_mse = mse;
            iscale = iscale_is;
        }
    }
    let mut sumlx = 0f32;
    let mut suml2 = 0f32;
    for i in 0..n {
        let l = nearest_int(iscale * x[i]).min(nmax);
        l_out[i] = l as u8;
        let w = qw[i];
        let lf = l as f32;
        sumlx += w * x[i] * lf;
        suml2 += w * lf * lf;
    }
    for _ in 0..5 {
        let mut n_changed = 0;
        for i in 0..n {
            let w = qw[i];
            let li = l_out[i] as f32;
            let mut slx = sumlx - w * x[i] * li;
            let mut sl2 = suml2 - w * li * li;
            if slx > 0.0 && sl2 > 0.0 {
                let new_l = nearest_int(x[i] * sl2 / slx).min(nmax);
                if new_l != l_out[i] as i32 {
                    let nf = new_l as f32;
                    slx += w * x[i] * nf;
                    sl2 += w * nf * nf;
                    if slx * slx * suml2 > sumlx * sumlx * sl2 {
                        l_out[i] = new_l as u8;
                        sumlx = slx;
                        suml2 = sl2;
                        n_changed += 1;
                    }
                }
            }
        }
        if n_changed == 0 {
            break;
        }
    }
    if suml2 > 0.0 {
        sumlx / suml2
    } else {
        0.0
    }
}

#[inline(always)]
fn get_scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        ((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
    }
}

/// Pack 256 2-bit levels the way Q2_K / Q3_K store them.
#[inline(always)]
fn pack_2bit(l: &[u8], qs: &mut [u8]) {
    for j in (0..QK_K).step_by(128) {
        for i in 0..32 {
            qs[j / 4 + i] = l[j + i] | (l[j + i + 32] << 2) | (l[j + i + 64] << 4) | (l[j + i + 96] << 6);
        }
    }
}

// ------------------------------------------------------------------ legacy 32-blocks (imatrix)

#[inline(always)]
fn sigma2_row(x: &[f32]) -> f32 {
    sum_sq(x) / x.len() as f32
}

#[inline(always)]
fn q4_0_impl(x: &[f32], y: &mut [u8], qw: &[f32]) {
    let sigma2 = sigma2_row(x);
    let mut weight = [0f32; 32];
    let mut l = [0i8; 32];
    for ((xb, b), q) in x.chunks_exact(32).zip(y.chunks_exact_mut(18)).zip(qw.chunks_exact(32)) {
        for j in 0..32 {
            weight[j] = q[j] * (sigma2 + xb[j] * xb[j]).sqrt();
        }
        let d = make_qx_quants(32, 8, xb, &mut l, 1, Some(&weight));
        wr_f16(b, 0, d);
        for j in 0..16 {
            b[2 + j] = (l[j] as u8) | ((l[j + 16] as u8) << 4);
        }
    }
}

#[inline(always)]
fn q4_1_impl(x: &[f32], y: &mut [u8], qw: &[f32]) {
    let sigma2 = sigma2_row(x);
    let mut weight = [0f32; 32];
    let mut l = [0u8; 32];
    let mut laux = [0u8; 32];
    for ((xb, b), q) in x.chunks_exact(32).zip(y.chunks_exact_mut(20)).zip(qw.chunks_exact(32)) {
        for j in 0..32 {
            weight[j] = q[j] * (sigma2 + xb[j] * xb[j]).sqrt();
        }
        let (d, min) = make_qkx_quants(32, 15, xb, &weight, &mut l, &mut laux, -0.9, 0.05, 36, false, true);
        wr_f16(b, 0, d);
        wr_f16(b, 2, -min);
        for j in 0..16 {
            b[4 + j] = l[j] | (l[j + 16] << 4);
        }
    }
}

#[inline(always)]
fn q5_0_impl(x: &[f32], y: &mut [u8], qw: &[f32]) {
    let sigma2 = sigma2_row(x);
    let mut weight = [0f32; 32];
    let mut l = [0i8; 32];
    for ((xb, b), q) in x.chunks_exact(32).zip(y.chunks_exact_mut(22)).zip(qw.chunks_exact(32)) {
        for j in 0..32 {
            weight[j] = q[j] * (sigma2 + xb[j] * xb[j]).sqrt();
        }
        let d = make_qx_quants(32, 16, xb, &mut l, 1, Some(&weight));
        wr_f16(b, 0, d);
        let mut qh = 0u32;
        for j in 0..16 {
            let (x0, x1) = (l[j] as u8, l[j + 16] as u8);
            b[6 + j] = (x0 & 0x0F) | ((x1 & 0x0F) << 4);
            qh |= (((x0 & 0x10) >> 4) as u32) << j;
            qh |= (((x1 & 0x10) >> 4) as u32) << (j + 16);
        }
        b[2..6].copy_from_slice(&qh.to_le_bytes());
    }
}

#[inline(always)]
fn q5_1_impl(x: &[f32], y: &mut [u8], qw: &[f32]) {
    let sigma2 = sigma2_row(x);
    let mut weight = [0f32; 32];
    let mut l = [0u8; 32];
    let mut laux = [0u8; 32];
    for ((xb, b), q) in x.chunks_exact(32).zip(y.chunks_exact_mut(24)).zip(qw.chunks_exact(32)) {
        for j in 0..32 {
            weight[j] = q[j] * (sigma2 + xb[j] * xb[j]).sqrt();
        }
        let (d, min) = make_qkx_quants(32, 31, xb, &weight, &mut l, &mut laux, -0.9, 0.05, 36, false, true);
        wr_f16(b, 0, d);
        wr_f16(b, 2, -min);
        let mut qh = 0u32;
        for j in 0..16 {
            let (x0, x1) = (l[j], l[j + 16]);
            b[8 + j] = (x0 & 0x0F) | ((x1 & 0x0F) << 4);
            qh |= (((x0 & 0x10) >> 4) as u32) << j;
            qh |= (((x1 & 0x10) >> 4) as u32) << (j + 16);
        }
        b[4..8].copy_from_slice(&qh.to_le_bytes());
    }
}

// ------------------------------------------------------------------ Q2_K

#[inline(always)]
fn q2_k_ref(x: &[f32], y: &mut [u8]) {
    let mut l = [0u8; QK_K];
    let mut laux = [0u8; 16];
    let mut weights = [0f32; 16];
    let mut mins = [0f32; 16];
    let mut scales = [0f32; 16];
    let q4scale = 15f32;
    for (x, b) in x.chunks_exact(QK_K).zip(y.chunks_exact_mut(84)) {
        let mut max_scale = 0f32;
        let mut max_min = 0f32;
        for j in 0..16 {
            for i in 0..16 {
                weights[i] = x[16 * j + i].abs();
            }
            let (s, m) = make_qkx_quants(16, 3, &x[16 * j..], &weights, &mut l[16 * j..], &mut laux, -0.5, 0.1, 15, true, false);
            scales[j] = s;
            mins[j] = m;
            if s > max_scale {
                max_scale = s;
            }
            if m > max_min {
                max_min = m;
            }
        }
        if max_scale > 0.0 {
            let iscale = q4scale / max_scale;
            for j in 0..16 {
                b[j] = nearest_int(iscale * scales[j]) as u8;
            }
            wr_f16(b, 80, max_scale / q4scale);
        } else {
            b[..16].fill(0);
            wr_f16(b, 80, 0.0);
        }
        if max_min > 0.0 {
            let iscale = q4scale / max_min;
            for j in 0..16 {
                let lv = nearest_int(iscale * mins[j]);
                b[j] |= (lv << 4) as u8;
            }
            wr_f16(b, 82, max_min / q4scale);
        } else {
            wr_f16(b, 82, 0.0);
        }
        q2_k_finish(x, b, &mut l);
    }
}

/// Q2_K's levels of block `x` at the scales and mins stored in `b` (4-bit each, times the
/// stored f16 d / dmin), packed into its quants.
#[inline(always)]
fn q2_k_finish(x: &[f32], b: &mut [u8], l: &mut [u8; QK_K]) {
    let dd = crate::quant::fp::rd_f16(b, 80);
    let dmin = crate::quant::fp::rd_f16(b, 82);
    for j in 0..16 {
        let d = dd * (b[j] & 0xF) as f32;
        if d == 0.0 {
            continue;
        }
        let dm = dmin * (b[j] >> 4) as f32;
        for ii in 0..16 {
            let lv = nearest_int((x[16 * j + ii] + dm) / d);
            l[16 * j + ii] = lv.min(3).max(0) as u8;
        }
    }
    pack_2bit(l, &mut b[16..80]);
}

#[inline(always)]
fn q2_k_impl(x: &[f32], y: &mut [u8], qw_row: &[f32]) {
    let mut l = [0u8; QK_K];
    let mut laux = [0u8; 16];
    let mut mins = [0f32; 16];
    let mut scales = [0f32; 16];
    let mut sw = [0f32; 16];
    let mut weight = [0f32; 16];
    let mut ls = [0u8; 16];
    let mut lm = [0u8; 16];
    for (i, (x, b)) in x.chunks_exact(QK_K).zip(y.chunks_exact_mut(84)).enumerate() {
        sw.fill(0.0);
        let sigma2 = sum_sq(x) / QK_K as f32;
        for j in 0..16 {
            let qw = &qw_row[QK_K * i + 16 * j..];
            for k in 0..16 {
                weight[k] = qw[k] * (sigma2 + x[16 * j + k] * x[16 * j + k]).sqrt();
            }
            for k in 0..16 {
                sw[j] += weight[k];
            }
            let (s, m) = make_qkx_quants(16, 3, &x[16 * j..], &weight, &mut l[16 * j..], &mut laux, -0.9, 0.05, 36, false, true);
            scales[j] = s;
            mins[j] = m;
        }
        let dm = make_qp_quants(16, 15, &scales, &mut ls, &sw);
        let mm = make_qp_quants(16, 15, &mins, &mut lm, &sw);
        wr_f16(b, 80, dm);
        wr_f16(b, 82, mm);
        for j in 0..16 {
            b[j] = ls[j] | (lm[j] << 4);
        }
        q2_k_finish(x, b, &mut l);
    }
}

// ------------------------------------------------------------------ Q3_K

/// Pack the 16 6-bit scales (already offset by 32) into Q3_K's 12 bytes.
#[inline(always)]
fn q3_k_pack_scales(ls: &[i32; 16], sc: &mut [u8]) {
    sc[..12].fill(0);
    for j in 0..16 {
        let mut l = ls[j];
        if j < 8 {
            sc[j] = (l & 0xF) as u8;
        } else {
            sc[j - 8] |= ((l & 0xF) << 4) as u8;
        }
        l >>= 4;
        sc[j % 4 + 8] |= (l << (2 * (j / 4))) as u8;
    }
}

/// The requantization pass and bit packing shared by the Q3_K quantizers.
#[inline(always)]
fn q3_k_finish(x: &[f32], b: &mut [u8], l: &mut [i8; QK_K]) {
    let d_all = crate::quant::fp::rd_f16(b, 108);
    for j in 0..16 {
        let scb = &b[96..108];
        let lo = if j < 8 { scb[j] & 0xF } else { scb[j - 8] >> 4 } as i32;
        let sc = ((lo | (((scb[8 + j % 4] >> (2 * (j / 4))) & 3) as i32) << 4) - 32) as i8;
        let d = d_all * sc as f32;
        if d == 0.0 {
            continue;
        }
        for ii in 0..16 {
            let lv = nearest_int(x[16 * j + ii] / d).min(3).max(-4);
            l[16 * j + ii] = (lv + 4) as i8;
        }
    }
    b[..32].fill(0);
    let mut m = 0usize;
    let mut hm = 1u8;
    for j in 0..QK_K {
        if l[j] > 3 {
            b[m] |= hm;
            l[j] -= 4;
        }
        m += 1;
        if m == QK_K / 8 {
            m = 0;
            hm <<= 1;
        }
    }
    let mut lu = [0u8; QK_K];
    for j in 0..QK_K {
        lu[j] = l[j] as u8;
    }
    pack_2bit(&lu, &mut b[32..96]);
}

#[inline(always)]
fn q3_k_ref(x: &[f32], y: &mut [u8]) {
    let mut l = [0i8; QK_K];
    let mut scales = [0f32; 16];
    for (x, b) in x.chunks_exact(QK_K).zip(y.chunks_exact_mut(110)) {
        let mut max_scale = 0f32;
        let mut amax = 0f32;
        for j in 0..16 {
            scales[j] = make_q3_quants(16, 4, &x[16 * j..], &mut l[16 * j..], true);
            let scale = scales[j].abs();
            if scale > amax {
                amax = scale;
                max_scale = scales[j];
            }
        }
        if max_scale != 0.0 {
            let iscale = -32f32 / max_scale;
            let mut ls = [0i32; 16];
            for j in 0..16 {
                let lv = nearest_int(iscale * scales[j]) as i8 as i32;
                ls[j] = (lv.min(31).max(-32) + 32) as i8 as i32;
            }
            q3_k_pack_scales(&ls, &mut b[96..108]);
            wr_f16(b, 108, 1.0 / iscale);
        } else {
            b[96..108].fill(0);
            wr_f16(b, 108, 0.0);
        }
        q3_k_finish(x, b, &mut l);
    }
}

#[inline(always)]
fn q3_k_impl(x: &[f32], y: &mut [u8], qw_row: Option<&[f32]>) {
    let mut l = [0i8; QK_K];
    let mut scales = [0f32; 16];
    let mut weight = [0f32; 16];
    let mut sw = [0f32; 16];
    let mut ls = [0i8; 16];
    for (i, (x, b)) in x.chunks_exact(QK_K).zip(y.chunks_exact_mut(110)).enumerate() {
        let sigma2 = 2.0 * sum_sq(x) / QK_K as f32;
        for j in 0..16 {
            match qw_row {
                Some(q) => {
                    let qw = &q[QK_K * i + 16 * j..];
                    for k in 0..16 {
                        weight[k] = qw[k] * (sigma2 + x[16 * j + k] * x[16 * j + k]).sqrt();
                    }
                }
                None => {
                    for k in 0..16 {
                        weight[k] = x[16 * j + k] * x[16 * j + k];
                    }
                }
            }
            let mut sumw = 0f32;
            for &w in &weight {
                sumw += w;
            }
            sw[j] = sumw;
            scales[j] = make_qx_quants(16, 4, &x[16 * j..], &mut l[16 * j..], 1, Some(&weight));
        }
        let d_block = make_qx_quants(16, 32, &scales, &mut ls, 1, Some(&sw));
        let mut lsi = [0i32; 16];
        for j in 0..16 {
            lsi[j] = ls[j] as i32;
        }
        q3_k_pack_scales(&lsi, &mut b[96..108]);
        wr_f16(b, 108, d_block);
        q3_k_finish(x, b, &mut l);
    }
}

// ------------------------------------------------------------------ Q4_K / Q5_K

/// Store 8 6-bit scales and mins into the 12-byte K4 layout.
#[inline(always)]
fn pack_scale_min_k4(ls: &[u8; 8], lm: &[u8; 8], sc: &mut [u8]) {
    for j in 0..8 {
        let (s, m) = (ls[j], lm[j]);
        if j < 4 {
            sc[j] = s;
            sc[j + 4] = m;
        } else {
            sc[j + 4] = (s & 0xF) | ((m & 0xF) << 4);
            sc[j - 4] |= (s >> 4) << 6;
            sc[j] |= (m >> 4) << 6;
        }
    }
}

/// The reference Q4_K / Q5_K scale search (make_qkx2_quants per 32), then the scale
/// quantization; leaves the final levels in `l`. `nmax` 15 or 31.
#[inline(always)]
fn k4_ref_block(x: &[f32], b: &mut [u8], l: &mut [u8; QK_K], nmax: i32, rmin: f32, nstep: i32) {
    let mut laux = [0u8; 32];
    let mut weights = [0f32; 32];
    let mut mins = [0f32; 8];
    let mut scales = [0f32; 8];
    let mut max_scale = 0f32;
    let mut max_min = 0f32;
    for j in 0..8 {
        let xs = &x[32 * j..32 * j + 32];
        let mut sum_x2 = 0f32;
        for &v in xs {
            sum_x2 += v * v;
        }
        let av_x = (sum_x2 / 32.0).sqrt();
        for k in 0..32 {
            weights[k] = av_x + xs[k].abs();
        }
        let (s, m) = make_qkx_quants(32, nmax, xs, &weights, &mut l[32 * j..], &mut laux, rmin, 0.1, nstep, false, false);
        scales[j] = s;
        mins[j] = m;
        if s > max_scale {
            max_scale = s;
        }
        if m > max_min {
            max_min = m;
        }
    }
    let inv_scale = if max_scale > 0.0 { 63.0 / max_scale } else { 0.0 };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let mut ls = [0u8; 8];
    let mut lm = [0u8; 8];
    for j in 0..8 {
        ls[j] = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        lm[j] = (nearest_int(inv_min * mins[j]) as u8).min(63);
    }
    pack_scale_min_k4(&ls, &lm, &mut b[4..16]);
    wr_f16(b, 0, max_scale / 63.0);
    wr_f16(b, 2, max_min / 63.0);
    k4_requantize(x, b, l, nmax);
}

#[inline(always)]
fn k4_requantize(x: &[f32], b: &[u8], l: &mut [u8; QK_K], nmax: i32) {
    let dd = crate::quant::fp::rd_f16(b, 0);
    let dmin = crate::quant::fp::rd_f16(b, 2);
    for j in 0..8 {
        let (sc, m) = get_scale_min_k4(j, &b[4..16]);
        let d = dd * sc as f32;
        if d == 0.0 {
            continue;
        }
        let dm = dmin * m as f32;
        for ii in 0..32 {
            let lv = nearest_int((x[32 * j + ii] + dm) / d);
            l[32 * j + ii] = lv.min(nmax).max(0) as u8;
        }
    }
}

/// The imatrix Q4_K / Q5_K search (make_qkx3_quants + make_qp_quants).
#[inline(always)]
fn k4_impl_block(x: &[f32], b: &mut [u8], l: &mut [u8; QK_K], nmax: i32, qw: Option<&[f32]>) {
    let mut laux = [0u8; 32];
    let mut weights = [0f32; 32];
    let mut mins = [0f32; 8];
    let mut scales = [0f32; 8];
    let mut sw = [0f32; 8];
    let mut ls = [0u8; 8];
    let mut lm = [0u8; 8];
    let mut sum_x2 = 0f32;
    for &v in &x[..QK_K] {
        sum_x2 += v * v;
    }
    let sigma2 = 2.0 * sum_x2 / QK_K as f32;
    let av_x = sigma2.sqrt();
    for j in 0..8 {
        let xs = &x[32 * j..32 * j + 32];
        match qw {
            Some(q) => {
                for k in 0..32 {
                    weights[k] = q[32 * j + k] * (sigma2 + xs[k] * xs[k]).sqrt();
                }
            }
            None => {
                for k in 0..32 {
                    weights[k] = av_x + xs[k].abs();
                }
            }
        }
        let mut sumw = 0f32;
        for &w in &weights {
            sumw += w;
        }
        sw[j] = sumw;
        let (s, m) = make_qkx_quants(32, nmax, xs, &weights, &mut l[32 * j..], &mut laux, -0.9, 0.05, 36, false, true);
        scales[j] = s;
        mins[j] = m;
    }
    let d_block = make_qp_quants(8, 63, &scales, &mut ls, &sw);
    let m_block = make_qp_quants(8, 63, &mins, &mut lm, &sw);
    for j in 0..8 {
        ls[j] = ls[j].min(63);
        lm[j] = lm[j].min(63);
    }
    b[4..16].fill(0);
    pack_scale_min_k4(&ls, &lm, &mut b[4..16]);
    wr_f16(b, 0, d_block);
    wr_f16(b, 2, m_block);
    k4_requantize(x, b, l, nmax);
}

#[inline(always)]
fn q4_k_store(b: &mut [u8], l: &[u8; QK_K]) {
    let q = &mut b[16..144];
    for (c, j) in (0..QK_K).step_by(64).enumerate() {
        for i in 0..32 {
            q[32 * c + i] = l[j + i] | (l[j + i + 32] << 4);
        }
    }
}

#[inline(always)]
fn q5_k_store(b: &mut [u8], l: &[u8; QK_K]) {
    b[16..48].fill(0);
    let (qh, ql) = b[16..176].split_at_mut(32);
    let (mut m1, mut m2) = (1u8, 2u8);
    for (c, n) in (0..QK_K).step_by(64).enumerate() {
        for j in 0..32 {
            let mut l1 = l[n + j];
            if l1 > 15 {
                l1 -= 16;
                qh[j] |= m1;
            }
            let mut l2 = l[n + j + 32];
            if l2 > 15 {
                l2 -= 16;
                qh[j] |= m2;
            }
            ql[32 * c + j] = l1 | (l2 << 4);
        }
        m1 <<= 2;
        m2 <<= 2;
    }
}

#[inline(always)]
fn q4_k(x: &[f32], y: &mut [u8], qw: Option<&[f32]>) {
    let mut l = [0u8; QK_K];
    for (i, (x, b)) in x.chunks_exact(QK_K).zip(y.chunks_exact_mut(144)).enumerate() {
        b[4..16].fill(0);
        match qw {
            None => k4_ref_block(x, b, &mut l, 15, -1.0, 20),
            Some(q) => k4_impl_block(x, b, &mut l, 15, Some(&q[QK_K * i..])),
        }
        q4_k_store(b, &l);
    }
}

#[inline(always)]
fn q5_k(x: &[f32], y: &mut [u8], qw: Option<&[f32]>) {
    let mut l = [0u8; QK_K];
    for (i, (x, b)) in x.chunks_exact(QK_K).zip(y.chunks_exact_mut(176)).enumerate() {
        b[4..16].fill(0);
        match qw {
            None => k4_ref_block(x, b, &mut l, 31, -0.5, 15),
            Some(q) => k4_impl_block(x, b, &mut l, 31, Some(&q[QK_K * i..])),
        }
        q5_k_store(b, &l);
    }
}

// ------------------------------------------------------------------ Q6_K

#[inline(always)]
fn q6_k(x: &[f32], y: &mut [u8], qw_row: Option<&[f32]>) {
    let mut l = [0i8; QK_K];
    let mut scales = [0f32; 16];
    for (i, (x, b)) in x.chunks_exact(QK_K).zip(y.chunks_exact_mut(210)).enumerate() {
        let mut max_scale = 0f32;
        let mut max_abs_scale = 0f32;
        for ib in 0..16 {
            let qw = qw_row.map(|q| &q[QK_K * i + 16 * ib..QK_K * i + 16 * ib + 16]);
            let scale = make_qx_quants(16, 32, &x[16 * ib..], &mut l[16 * ib..], 1, qw);
            scales[ib] = scale;
            let abs_scale = scale.abs();
            if abs_scale > max_abs_scale {
                max_abs_scale = abs_scale;
                max_scale = scale;
            }
        }
        if max_abs_scale < GROUP_MAX_EPS {
            b.fill(0);
            wr_f16(b, 208, 0.0);
            continue;
        }
        let iscale = -128f32 / max_scale;
        wr_f16(b, 208, 1.0 / iscale);
        for ib in 0..16 {
            b[192 + ib] = nearest_int(iscale * scales[ib]).min(127) as i8 as u8;
        }
        let dd = crate::quant::fp::rd_f16(b, 208);
        for j in 0..16 {
            let d = dd * (b[192 + j] as i8) as f32;
            if d == 0.0 {
                continue;
            }
            for ii in 0..16 {
                let lv = nearest_int(x[16 * j + ii] / d).min(31).max(-32);
                l[16 * j + ii] = (lv + 32) as i8;
            }
        }
        let (ql, qh) = b[..192].split_at_mut(128);
        for (c, j) in (0..QK_K).step_by(128).enumerate() {
            for i in 0..32 {
                let lv = |k: usize| l[j + i + k] as u8;
                let q1 = lv(0) & 0xF;
                let q2 = lv(32) & 0xF;
                let q3 = lv(64) & 0xF;
                let q4 = lv(96) & 0xF;
                ql[64 * c + i] = q1 | (q3 << 4);
                ql[64 * c + i + 32] = q2 | (q4 << 4);
                qh[32 * c + i] = (lv(0) >> 4) | ((lv(32) >> 4) << 2) | ((lv(64) >> 4) << 4) | ((lv(96) >> 4) << 6);
            }
        }
    }
}

// ------------------------------------------------------------------ IQ4_NL / IQ4_XS

/// `quantize_row_iq4_nl_impl` for one super-block of `sbs` values (32: IQ4_NL, 256:
/// IQ4_XS). Writes d (and the IQ4_XS scales) into `b` and the packed nibbles into
/// `q4`; `l` is the caller's level buffer, kept across calls as ggml's is.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn iq4_impl(sbs: usize, x: &[f32], d_out: &mut [u8], q4: &mut [u8], scales_h: Option<&mut [u8]>, scales_l: Option<&mut [u8]>, l: &mut [u8], qw: Option<&[f32]>, ntry: i32) {
    const BS: usize = 32;
    let values = &KVALUES_IQ4NL;
    #[cfg(target_arch = "x86_64")]
    let table = iq4_table();
    #[cfg(not(target_arch = "x86_64"))]
    let table: Option<()> = None;
    let mut weight = [0f32; 32];
    let mut scales = [0f32; 8];
    let mut sigma2 = 0f32;
    for &v in &x[..sbs] {
        sigma2 += v * v;
    }
    sigma2 *= 2.0 / sbs as f32;
    q4[..sbs / 2].fill(0);
    d_out[..2].copy_from_slice(&f32_to_f16(0.0).to_le_bytes());
    let mut max_scale = 0f32;
    let mut amax_scale = 0f32;
    let v0 = values[0] as f32;
    for ib in 0..sbs / BS {
        let xb = &x[ib * BS..ib * BS + BS];
        let lb = &mut l[ib * BS..ib * BS + BS];
        match qw {
            Some(q) => {
                for j in 0..BS {
                    weight[j] = q[ib * BS + j] * (sigma2 + xb[j] * xb[j]).sqrt();
                }
            }
            None => {
                for j in 0..BS {
                    weight[j] = xb[j] * xb[j];
                }
            }
        }
        let mut amax = 0f32;
        let mut max = 0f32;
        for &v in xb {
            let ax = v.abs();
            if ax > amax {
                amax = ax;
                max = v;
            }
        }
        if amax < GROUP_MAX_EPS {
            scales[ib] = 0.0;
            continue;
        }
        let mut d = if ntry > 0 { -max / v0 } else { max / v0 };
        let mut id = 1.0 / d;
        #[cfg(target_arch = "x86_64")]
        if let (7, Some(t)) = (ntry, table) {
            // The first pass and the 15 trials at once (the same sums), then ggml's
            // choice in trial order.
            let (mut sqx, mut sq2) = ([0f32; 16], [0f32; 16]);
            // SAFETY: `table` exists only when the CPU has AVX2.
            unsafe { super::search_avx2::iq4_trials(t, values[0] as i32, id, max, xb, &weight, lb, &mut sqx, &mut sq2) };
            d = if sq2[0] > 0.0 { sqx[0] / sq2[0] } else { 0.0 };
            let mut best = d * sqx[0];
            for k in 1..16 {
                if sq2[k] > 0.0 && sqx[k] * sqx[k] > best * sq2[k] {
                    d = sqx[k] / sq2[k];
                    best = d * sqx[k];
                }
            }
            scales[ib] = d;
            let abs_d = d.abs();
            if abs_d > amax_scale {
                amax_scale = abs_d;
                max_scale = d;
            }
            continue;
        }
        let mut sumqx = 0f32;
        let mut sumq2 = 0f32;
        for j in 0..BS {
            let al = id * xb[j];
            let li = best_index_int8(values, al);
            lb[j] = li as u8;
            let q = values[li] as f32;
            let w = weight[j];
            sumqx += w * q * xb[j];
            sumq2 += w * q * q;
        }
        d = if sumq2 > 0.0 { sumqx / sumq2 } else { 0.0 };
        let mut best = d * sumqx;
        for itry in -ntry..=ntry {
            id = (itry + values[0] as i32) as f32 / max;
            sumqx = 0.0;
            sumq2 = 0.0;
            for j in 0..BS {
                let al = id * xb[j];
                let li = best_index_int8(values, al);
                let q = values[li] as f32;
                let w = weight[j];
                sumqx += w * q * xb[j];
                sumq2 += w * q * q;
            }
            if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
                d = sumqx / sumq2;
                best = d * sumqx;
            }
        }
        scales[ib] = d;
        let abs_d = d.abs();
        if abs_d > amax_scale {
            amax_scale = abs_d;
            max_scale = d;
        }
    }
    if sbs / BS > 1 {
        let (sh, sl) = (scales_h.unwrap(), scales_l.unwrap());
        let mut h = 0u16;
        let d = -max_scale / 32.0;
        d_out[..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        for ib in 0..sbs / BS {
            let mut lv = nearest_int(id * scales[ib]).min(31).max(-32);
            let dl = d * lv as f32;
            let idl = if dl != 0.0 { 1.0 / dl } else { 0.0 };
            let xb = &x[ib * BS..ib * BS + BS];
            best_indices(table, idl, xb, &mut l[ib * BS..ib * BS + BS]);
            lv += 32;
            let l_l = (lv & 0xf) as u8;
            let l_h = (lv >> 4) as u16;
            if ib % 2 == 0 {
                sl[ib / 2] = l_l;
            } else {
                sl[ib / 2] |= l_l << 4;
            }
            h |= l_h << (2 * (ib % 8));
        }
        sh[..2].copy_from_slice(&h.to_le_bytes());
    } else {
        d_out[..2].copy_from_slice(&f32_to_f16(scales[0]).to_le_bytes());
        if ntry > 0 {
            let id = if scales[0] != 0.0 { 1.0 / scales[0] } else { 0.0 };
            best_indices(table, id, &x[..sbs], &mut l[..sbs]);
        }
    }
    for i in 0..sbs / 32 {
        for j in 0..16 {
            q4[16 * i + j] = l[32 * i + j] | (l[32 * i + 16 + j] << 4);
        }
    }
}

/// IQ4_NL's table for the AVX2 searches, when the CPU has AVX2.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn iq4_table() -> Option<super::search_avx2::Table16> {
    if std::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 (checked above).
        Some(unsafe { super::search_avx2::Table16::new(&KVALUES_IQ4NL) })
    } else {
        None
    }
}

/// `best_index_int8(values, id * x[j])` into `l[j]` for every j (AVX2 with a table).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn best_indices(table: Option<super::search_avx2::Table16>, id: f32, x: &[f32], l: &mut [u8]) {
    match table {
        // SAFETY: `table` exists only when the CPU has AVX2; x.len() is 32 or 256.
        Some(t) => unsafe { super::search_avx2::best_indices(t, id, x, l) },
        None => {
            for (d, &v) in l.iter_mut().zip(x) {
                *d = best_index_int8(&KVALUES_IQ4NL, id * v) as u8;
            }
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
#[inline(always)]
fn best_indices(_: Option<()>, id: f32, x: &[f32], l: &mut [u8]) {
    for (d, &v) in l.iter_mut().zip(x) {
        *d = best_index_int8(&KVALUES_IQ4NL, id * v) as u8;
    }
}

#[inline(always)]
fn iq4_nl(x: &[f32], y: &mut [u8], qw: Option<&[f32]>, l: &mut [u8; QK_K]) {
    for (ib, (xb, b)) in x.chunks_exact(32).zip(y.chunks_exact_mut(18)).enumerate() {
        let (d, q4) = b.split_at_mut(2);
        iq4_impl(32, xb, d, q4, None, None, &mut l[..32], qw.map(|q| &q[32 * ib..]), 7);
    }
}

#[inline(always)]
fn iq4_xs(x: &[f32], y: &mut [u8], qw: Option<&[f32]>, l: &mut [u8; QK_K]) {
    for (ib, (xb, b)) in x.chunks_exact(QK_K).zip(y.chunks_exact_mut(136)).enumerate() {
        let (d, rest) = b.split_at_mut(2);
        let (sh, rest) = rest.split_at_mut(2);
        let (sl, q4) = rest.split_at_mut(4);
        iq4_impl(QK_K, xb, d, q4, Some(sh), Some(sl), &mut l[..], qw.map(|q| &q[QK_K * ib..]), 7);
    }
}

// ------------------------------------------------------------------ ternary, MXFP4

/// C `lroundf`: half away from zero.
#[inline(always)]
fn lroundf(v: f32) -> i32 {
    v.round() as i32
}

#[inline(always)]
fn amax_of(x: &[f32]) -> f32 {
    let mut amax = 0f32;
    for &v in x {
        amax = cmax(amax, v.abs());
    }
    amax
}

#[inline(always)]
fn tq1_0(x: &[f32], y: &mut [u8]) {
    for (x, b) in x.chunks_exact(QK_K).zip(y.chunks_exact_mut(54)) {
        let d = amax_of(x);
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        wr_f16(b, 52, d);
        let mut xo = 0usize;
        // 5 values per byte: 32 bytes over 160 values, then 16 bytes over 80.
        for (j, width) in [(0usize, 32usize), (32, 16)] {
            for m in 0..width {
                let mut q = 0u8;
                for n in 0..5 {
                    let xi = lroundf(x[xo + m + n * width] * id) + 1;
                    q = q.wrapping_mul(3).wrapping_add(xi as u8);
                }
                b[j + m] = ((q as u16 as i32 * 256 + 242) / 243) as u8;
            }
            xo += 5 * width;
        }
        for j in 0..4 {
            let mut q = 0u8;
            for m in 0..4 {
                let xi = lroundf(x[xo + j + m * 4] * id) + 1;
                q = q.wrapping_mul(3).wrapping_add(xi as u8);
            }
            q = q.wrapping_mul(3);
            b[48 + j] = ((q as u16 as i32 * 256 + 242) / 243) as u8;
        }
    }
}

#[inline(always)]
fn tq2_0(x: &[f32], y: &mut [u8]) {
    for (x, b) in x.chunks_exact(QK_K).zip(y.chunks_exact_mut(66)) {
        let d = amax_of(x);
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        wr_f16(b, 64, d);
        for j in (0..64).step_by(32) {
            let xo = j * 4;
            for m in 0..32 {
                let mut q = 0u8;
                for n in 0..4 {
                    let xi = lroundf(x[xo + m + n * 32] * id) + 1;
                    q = q.wrapping_add(((xi & 3) << (2 * n)) as u8);
                }
                b[j + m] = q;
            }
        }
    }
}


fn e8m0_to_fp32_half(x: u8) -> f32 {
    let bits = if x < 2 { 0x0020_0000u32 << x } else { ((x as u32) - 1) << 23 };
    f32::from_bits(bits)
}


#[inline(always)]
fn mxfp4(x: &[f32], y: &mut [u8]) {
    for (x, b) in x.chunks_exact(32).zip(y.chunks_exact_mut(17)) {
        let mut amax = 0f32;
        for &v in x {
            if amax < v.abs() {
                amax = v.abs();
            }
        }
        // (uint8_t)(float): through a 32-bit conversion, as x86 code does.
        let e = if amax > 0.0 { ((amax.log2().floor() - 2.0 + 127.0) as i32) as u8 } else { 0 };
        let d = e8m0_to_fp32_half(e);
        b[0] = e;
        for j in 0..16 {
            b[1 + j] = best_index_mxfp4(x[j], d) | (best_index_mxfp4(x[16 + j], d) << 4);
        }
    }
}

// ------------------------------------------------------------------ entry point

/// Whether `quantize_chunk` can produce `ty`.
pub fn can_quantize(ty: GgmlType) -> bool {
    use GgmlType::*;
    matches!(
        ty,
        F32 | F16 | BF16 | Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q2_K | Q3_K | Q4_K | Q5_K | Q6_K | IQ4_NL | IQ4_XS | TQ1_0 | TQ2_0 | MXFP4
            | IQ3_XXS | IQ3_S | IQ2_XXS | IQ2_XS | IQ2_S | IQ1_S | IQ1_M | Q1_0 | Q2_0 | NVFP4
    )
}

/// Whether ggml refuses to quantize `ty` without an importance matrix
/// (`ggml_quantize_requires_imatrix`).
pub fn requires_imatrix(ty: GgmlType) -> bool {
    use GgmlType::*;
    matches!(ty, IQ2_XXS | IQ2_XS | IQ1_S)
}

/// ggml's `ggml_quantize_chunk` for `nrows` rows of `n_per_row` values: `dst` receives
/// exactly `nrows * row_size(ty, n_per_row)` bytes. `imatrix` (one weight per column,
/// `n_per_row` of them) selects the weighted search where ggml has one.
/// Callers check `can_quantize` and the lengths.
pub fn quantize_chunk(ty: GgmlType, src: &[f32], dst: &mut [u8], n_per_row: usize, imatrix: Option<&[f32]>) {
    // The same code compiled for AVX2 where the CPU has it: wider vectors for the
    // element-wise parts, the same IEEE operations in the same order (Rust never fuses a
    // multiply and an add by itself), so the same bytes.
    #[cfg(target_arch = "x86_64")]
    if crate::quant::cpu::features().avx2 {
        // SAFETY: the CPU has AVX2 (checked above).
        unsafe { quantize_chunk_avx2(ty, src, dst, n_per_row, imatrix) };
        return;
    }
    quantize_chunk_impl(ty, src, dst, n_per_row, imatrix)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn quantize_chunk_avx2(ty: GgmlType, src: &[f32], dst: &mut [u8], n_per_row: usize, imatrix: Option<&[f32]>) {
    quantize_chunk_impl(ty, src, dst, n_per_row, imatrix)
}

#[inline(always)]
fn quantize_chunk_impl(ty: GgmlType, src: &[f32], dst: &mut [u8], n_per_row: usize, imatrix: Option<&[f32]>) {
    use GgmlType::*;
    let rs = ty.row_size(n_per_row).expect("row length checked by the caller");
    let rows = src.chunks_exact(n_per_row).zip(dst.chunks_exact_mut(rs));
    match (ty, imatrix) {
        (F32, _) => {
            for (s, d) in src.iter().zip(dst.chunks_exact_mut(4)) {
                d.copy_from_slice(&s.to_le_bytes());
            }
        }
        (F16, _) => {
            for (s, d) in src.iter().zip(dst.chunks_exact_mut(2)) {
                d.copy_from_slice(&f32_to_f16(*s).to_le_bytes());
            }
        }
        (BF16, _) => {
            for (s, d) in src.iter().zip(dst.chunks_exact_mut(2)) {
                d.copy_from_slice(&f32_to_bf16(*s).to_le_bytes());
            }
        }
        (Q4_0, None) => legacy::quantize_q4_0(src, dst),
        (Q4_1, None) => legacy::quantize_q4_1(src, dst),
        (Q5_0, None) => legacy::quantize_q5_0(src, dst),
        (Q5_1, None) => legacy::quantize_q5_1(src, dst),
        (Q4_0, Some(q)) => rows.for_each(|(s, d)| q4_0_impl(s, d, q)),
        (Q4_1, Some(q)) => rows.for_each(|(s, d)| q4_1_impl(s, d, q)),
        (Q5_0, Some(q)) => rows.for_each(|(s, d)| q5_0_impl(s, d, q)),
        (Q5_1, Some(q)) => rows.for_each(|(s, d)| q5_1_impl(s, d, q)),
        (Q8_0, _) => legacy::quantize_q8_0(src, dst),
        (Q2_K, None) => q2_k_ref(src, dst),
        (Q2_K, Some(q)) => rows.for_each(|(s, d)| q2_k_impl(s, d, q)),
        (Q3_K, None) => q3_k_ref(src, dst),
        (Q3_K, Some(q)) => rows.for_each(|(s, d)| q3_k_impl(s, d, Some(q))),
        (Q4_K, None) => q4_k(src, dst, None),
        (Q4_K, Some(q)) => rows.for_each(|(s, d)| q4_k(s, d, Some(q))),
        (Q5_K, None) => q5_k(src, dst, None),
        (Q5_K, Some(q)) => rows.for_each(|(s, d)| q5_k(s, d, Some(q))),
        (Q6_K, None) => q6_k(src, dst, None),
        (Q6_K, Some(q)) => rows.for_each(|(s, d)| q6_k(s, d, Some(q))),
        (IQ4_NL, q) => {
            let mut l = [0u8; QK_K];
            rows.for_each(|(s, d)| iq4_nl(s, d, q, &mut l))
        }
        (IQ4_XS, q) => {
            let mut l = [0u8; QK_K];
            rows.for_each(|(s, d)| iq4_xs(s, d, q, &mut l))
        }
        (TQ1_0, _) => tq1_0(src, dst),
        (TQ2_0, _) => tq2_0(src, dst),
        (MXFP4, _) => mxfp4(src, dst),
        // ggml's quantize_q1_0 / quantize_q2_0 take the imatrix but quantize row by row
        // without it; quantize_nvfp4 ignores it too
        (Q1_0, _) => lowbit::quantize_q1_0(src, dst),
        (Q2_0, _) => lowbit::quantize_q2_0(src, dst),
        (NVFP4, _) => lowbit::quantize_nvfp4(src, dst),
        (IQ3_XXS, q) => rows.for_each(|(s, d)| super::iq3::iq3_xxs_row(s, d, q)),
        (IQ3_S, q) => rows.for_each(|(s, d)| super::iq3::iq3_s_row(s, d, q)),
        (IQ2_XXS, Some(q)) => rows.for_each(|(s, d)| super::iq2::iq2_xxs_row(s, d, q)),
        (IQ2_XS, Some(q)) => rows.for_each(|(s, d)| super::iq2::iq2_xs_row(s, d, q)),
        (IQ2_S, q) => rows.for_each(|(s, d)| super::iq2::iq2_s_row(s, d, q)),
        (IQ1_S, Some(q)) => rows.for_each(|(s, d)| super::iq1::iq1_s_row(s, d, q)),
        (IQ1_M, q) => rows.for_each(|(s, d)| super::iq1::iq1_m_row(s, d, q)),
        _ => panic!("quantize_chunk: {ty} is not supported (check can_quantize first)"),
    }
}
