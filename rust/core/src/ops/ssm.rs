//! The recurrent ops of Mamba-2 and the short-convolution models, per sequence, in the
//! float order of ggml-cpu's `ssm_conv` and `ssm_scan` (ops.cpp) as llama.cpp's x86-64
//! AVX2+FMA build runs them: GCC contracts the scalar `a*b + c` into one FMA, and the
//! Mamba-2 scan runs its first d_state & !31 state entries in 4 x 8 lanes (products
//! rounded, then the FMA into 4 accumulators, reduced as GGML_F32x8_REDUCE does).

use super::vec::fmaf;

/// ggml's `ssm_conv` for one sequence of `nt` tokens and its state: per channel c of
/// `conv_dim`, the window [state_c (d_conv - 1 values), x_0[c], ..., x_{nt-1}[c]] is
/// convolved with w_c (d_conv taps): out_t[c] = sum_i window[t + i] * w_c[i]; the state
/// becomes the window's last d_conv - 1 values.
/// `state`: [conv_dim][d_conv - 1]; `x(t)`: token t's conv_dim inputs; `w`: [conv_dim][d_conv];
/// `out`: [nt][out_stride], the first conv_dim of each row written.
pub fn conv_seq<'a>(
    state: &mut [f32],
    x: &dyn Fn(usize) -> &'a [f32],
    nt: usize,
    w: &[f32],
    d_conv: usize,
    out: &mut [f32],
    out_stride: usize,
    win: &mut Vec<f32>,
) {
    let dc1 = d_conv - 1;
    let conv_dim = w.len() / d_conv;
    win.resize(dc1 + nt, 0.0);
    for c in 0..conv_dim {
        let st = &mut state[c * dc1..(c + 1) * dc1];
        win[..dc1].copy_from_slice(st);
        for t in 0..nt {
            win[dc1 + t] = x(t)[c];
        }
        let wc = &w[c * d_conv..(c + 1) * d_conv];
        for t in 0..nt {
            let mut sum = 0f32;
            for i in 0..d_conv {
                sum = fmaf(win[t + i], wc[i], sum);
            }
            out[t * out_stride + c] = sum;
        }
        st.copy_from_slice(&win[nt..nt + dc1]);
    }
}

/// Rollback snapshots of convolution states (llama.cpp's `n_rs_seq` > 0), taken before
/// `conv_seq` folds `nt` inputs into the state of cell `cell`: `buf` holds planes of `size`
/// rows of `w` = conv_dim * (d_conv - 1) floats, plane 0 the current states; each plane j of
/// `planes` gets the state j tokens before the end of the inputs (the window of `conv_seq`
/// from nt - j; j >= nt: the state before them, as llama.cpp's clamped view).
#[allow(clippy::too_many_arguments)]
pub fn conv_snapshots<'a>(
    buf: &mut [f32],
    size: usize,
    cell: usize,
    planes: std::ops::Range<usize>,
    x: &dyn Fn(usize) -> &'a [f32],
    nt: usize,
    d_conv: usize,
    w: usize,
) {
    let dc1 = d_conv - 1;
    let (cur, rest) = buf.split_at_mut(size * w);
    let prior = &cur[cell * w..(cell + 1) * w];
    for j in planes {
        let row = (j - 1) * size + cell;
        let snap = &mut rest[row * w..(row + 1) * w];
        let from = nt.saturating_sub(j);
        for (c, out) in snap.chunks_exact_mut(dc1).enumerate() {
            for (i, v) in out.iter_mut().enumerate() {
                let k = from + i;
                *v = if k < dc1 { prior[c * dc1 + k] } else { x(k - dc1)[c] };
            }
        }
    }
}

/// ggml's softplus (`ggml_compute_softplus_f32` and the softplus op): log(1 + exp(x)), x above 20.
#[inline]
pub fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        (1.0 + x.exp()).ln()
    }
}

/// AVX2's GGML_F32x8_REDUCE of four 8-lane accumulators.
fn reduce_4x8(a: &[[f32; 8]; 4]) -> f32 {
    let mut x0 = [0f32; 8];
    let mut x1 = [0f32; 8];
    for l in 0..8 {
        x0[l] = a[0][l] + a[2][l];
        x1[l] = a[1][l] + a[3][l];
    }
    for l in 0..8 {
        x0[l] += x1[l];
    }
    let t0 = [x0[0] + x0[4], x0[1] + x0[5], x0[2] + x0[6], x0[3] + x0[7]];
    (t0[0] + t0[1]) + (t0[2] + t0[3])
}

/// One token of Mamba-2's scan (ggml's `ssm_scan` with a scalar A per head) for one
/// sequence: heads [h0, h1) of `head_dim` channels, `ng` groups of `ds` state entries.
/// `s` [nh][head_dim][ds] is updated in place: s = s * exp(softplus(dt_h) * A_h) +
/// B_g * x * softplus(dt_h); y[h][i] = s[h][i] . C_g.
#[allow(clippy::too_many_arguments)]
pub fn scan_token_mamba2(
    s: &mut [f32],
    x: &[f32],
    dt: &[f32],
    a: &[f32],
    b: &[f32],
    c: &[f32],
    y: &mut [f32],
    nh: usize,
    head_dim: usize,
    ng: usize,
    ds: usize,
) {
    let np = ds & !31;
    for h in 0..nh {
        let dt_sp = softplus(dt[h]);
        let da = (dt_sp * a[h]).exp();
        let g = h / (nh / ng);
        let bg = &b[g * ds..(g + 1) * ds];
        let cg = &c[g * ds..(g + 1) * ds];
        for i1 in 0..head_dim {
            let ii = i1 + h * head_dim;
            let x_dt = x[ii] * dt_sp;
            let st = &mut s[ii * ds..(ii + 1) * ds];
            let mut sumf = 0f32;
            if np > 0 {
                let mut acc = [[0f32; 8]; 4];
                for i in (0..np).step_by(32) {
                    for (j, accj) in acc.iter_mut().enumerate() {
                        for l in 0..8 {
                            let k = i + j * 8 + l;
                            let v = st[k] * da + bg[k] * x_dt;
                            accj[l] = fmaf(v, cg[k], accj[l]);
                            st[k] = v;
                        }
                    }
                }
                sumf = reduce_4x8(&acc);
            }
            for k in np..ds {
                // GCC contracts (s * dA) + (B * x_dt): the first product into the FMA
                let v = fmaf(st[k], da, bg[k] * x_dt);
                sumf = fmaf(v, cg[k], sumf);
                st[k] = v;
            }
            y[ii] = sumf;
        }
    }
}

/// One token of Mamba (v1)'s scan (ggml's `ssm_scan` with A [d_inner][d_state]: a decay per
/// channel and state entry, one "head" of one channel per channel, one group) for one
/// sequence. `s` [d_inner][ds] is updated in place: s = s * exp(softplus(dt_c) * A_c) +
/// B * x_c * softplus(dt_c); y[c] = s[c] . C. Scalar in ggml (expf in the loop), with GCC's
/// contractions: (s * dA) + (B * x_dt) as one FMA over the first product, the dot as FMAs.
#[allow(clippy::too_many_arguments)]
pub fn scan_token_mamba1(s: &mut [f32], x: &[f32], dt: &[f32], a: &[f32], b: &[f32], c: &[f32], y: &mut [f32], ds: usize) {
    for (ch, yc) in y.iter_mut().enumerate() {
        let dt_sp = softplus(dt[ch]);
        let x_dt = x[ch] * dt_sp;
        let st = &mut s[ch * ds..(ch + 1) * ds];
        let ac = &a[ch * ds..(ch + 1) * ds];
        let mut sumf = 0f32;
        for k in 0..ds {
            let v = fmaf(st[k], (dt_sp * ac[k]).exp(), b[k] * x_dt);
            sumf = fmaf(v, c[k], sumf);
            st[k] = v;
        }
        *yc = sumf;
    }
}

/// One token of ggml's `rwkv_wkv6` for one sequence, `k`, `v`, `r`, `w` (decay) and `u`
/// (time_first, per head) [n_head * hs]; the state s [n_head][hs (k)][hs (v)] is updated in
/// place and `out` [n_head * hs] (zeroed by the caller) accumulates: per head h and key
/// index i, for every value index j: kv = v_j * k_i; out_j += (kv * u_i + s_ij) * r_i;
/// s_ij = s_ij * w_i + kv (the AVX2 path's FMAs, in i order).
pub fn wkv6_token(s: &mut [f32], k: &[f32], v: &[f32], r: &[f32], u: &[f32], w: &[f32], out: &mut [f32], hs: usize) {
    per_key_row(s, v, out, hs, |hi, row, vh, oh| {
        let (kv_k, rv, uv, wv) = (k[hi], r[hi], u[hi], w[hi]);
        for j in 0..hs {
            let kv = vh[j] * kv_k;
            let prev = row[j];
            let temp = fmaf(kv, uv, prev);
            oh[j] = fmaf(temp, rv, oh[j]);
            row[j] = fmaf(prev, wv, kv);
        }
    });
}

/// The loop of the RWKV-6 style scans: per head h and key index i (hi = h * hs + i), `f`
/// gets the state row s[hi] [hs (v)], the head's values and its output row.
#[inline(always)]
fn per_key_row(s: &mut [f32], v: &[f32], out: &mut [f32], hs: usize, mut f: impl FnMut(usize, &mut [f32], &[f32], &mut [f32])) {
    let nh = v.len() / hs;
    for h in 0..nh {
        let vh = &v[h * hs..(h + 1) * hs];
        let oh = &mut out[h * hs..(h + 1) * hs];
        for i in 0..hs {
            let hi = h * hs + i;
            f(hi, &mut s[hi * hs..(hi + 1) * hs], vh, oh);
        }
    }
}

/// One token of ggml's `gated_linear_attn` (rwkv6qwen2's QRWKV time mix) for one sequence,
/// on x86-64 AVX2 (head_size a multiple of 8): `k`, `v`, `q` (receptance), `g` (decay)
/// [n_head * hs]; the state s [n_head][hs (k)][hs (v)] in place. Per head and key index i:
/// s_ij = s_ij * g_i + v_j k_i, out_j += s_ij * (q_i * scale), each one FMA.
#[allow(clippy::too_many_arguments)]
pub fn gla_token(s: &mut [f32], k: &[f32], v: &[f32], q: &[f32], g: &[f32], scale: f32, out: &mut [f32], hs: usize) {
    per_key_row(s, v, out, hs, |hi, row, vh, oh| {
        let (kv_k, qv, gv) = (k[hi], q[hi] * scale, g[hi]);
        for j in 0..hs {
            let temp = fmaf(row[j], gv, vh[j] * kv_k);
            oh[j] = fmaf(temp, qv, oh[j]);
            row[j] = temp;
        }
    });
}

/// One token of ggml's `rwkv_wkv7` (the generalized delta rule) for one sequence, on
/// x86-64 AVX2 (head_size a multiple of 32): `r`, `w` (decay), `k`, `v`, `a`, `b`
/// [n_head * hs]; the state s [n_head][hs (v)][hs (k)] is updated in place. Per head and
/// value index i: sa = s_i . a (ggml_vec_dot's 4 x 8 lanes); s_ij = s_ij * w_j + v_i k_j +
/// sa b_j (two FMAs); out_i = s_i . r (4 x 8 lane accumulators, GGML_F32x8_REDUCE).
#[allow(clippy::too_many_arguments)]
pub fn wkv7_token(s: &mut [f32], r: &[f32], w: &[f32], k: &[f32], v: &[f32], a: &[f32], b: &[f32], out: &mut [f32], hs: usize) {
    let nh = r.len() / hs;
    for h in 0..nh {
        let hr = h * hs..(h + 1) * hs;
        let (rh, wh, kh, ah, bh) = (&r[hr.clone()], &w[hr.clone()], &k[hr.clone()], &a[hr.clone()], &b[hr]);
        for i in 0..hs {
            let vi = v[h * hs + i];
            let row = &mut s[(h * hs + i) * hs..(h * hs + i + 1) * hs];
            let sa = dot_ggml(ah, row);
            let mut acc = [[0f32; 8]; 4];
            for j0 in (0..hs).step_by(32) {
                for (kk, accj) in acc.iter_mut().enumerate() {
                    for (l, acl) in accj.iter_mut().enumerate() {
                        let j = j0 + kk * 8 + l;
                        let st = fmaf(sa, bh[j], fmaf(row[j], wh[j], vi * kh[j]));
                        row[j] = st;
                        *acl = fmaf(st, rh[j], *acl);
                    }
                }
            }
            out[h * hs + i] = reduce_4x8(&acc);
        }
    }
}

/// ggml's `ggml_vec_dot_f32` on x86-64 AVX2+FMA: 4 x 8 lanes of FMAs over the first
/// n & !31 entries, GGML_F32x8_REDUCE, then the tail added with FMAs (GCC contracts it).
pub fn dot_ggml(x: &[f32], y: &[f32]) -> f32 {
    let n = x.len().min(y.len());
    let np = n & !31;
    let mut sumf = 0f32;
    if np > 0 {
        let mut acc = [[0f32; 8]; 4];
        for i in (0..np).step_by(32) {
            for (j, accj) in acc.iter_mut().enumerate() {
                for (l, a) in accj.iter_mut().enumerate() {
                    let k = i + j * 8 + l;
                    *a = fmaf(x[k], y[k], *a);
                }
            }
        }
        sumf = reduce_4x8(&acc);
    }
    for k in np..n {
        sumf = fmaf(x[k], y[k], sumf);
    }
    sumf
}

/// One token of ggml's `gated_delta_net` (K = 1, a scalar gate per head) for one head:
/// `m` is the head's state stored transposed (m[j * s + i] = S[i][j], s = S_v = S_k),
/// decayed by exp(g), corrected towards v along k with strength beta, then read with q:
/// out[j] = (S^T q)[j] / sqrt(s). q and k are the (L2-normed) key-head vectors.
pub fn delta_net_token(m: &mut [f32], q: &[f32], k: &[f32], v: &[f32], g: f32, beta: f32, out: &mut [f32], delta: &mut [f32]) {
    let s = v.len();
    let scale = 1.0f32 / (s as f32).sqrt();
    let eg = g.exp();
    for x in m.iter_mut() {
        *x *= eg;
    }
    for j in 0..s {
        let sum = dot_ggml(&m[j * s..(j + 1) * s], k);
        delta[j] = (v[j] - sum) * beta;
    }
    for j in 0..s {
        let d = delta[j];
        for (mi, &ki) in m[j * s..(j + 1) * s].iter_mut().zip(k) {
            *mi = fmaf(ki, d, *mi);
        }
    }
    for j in 0..s {
        out[j] = dot_ggml(&m[j * s..(j + 1) * s], q) * scale;
    }
}
