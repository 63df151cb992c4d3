//! RMSNorm as ggml computes it (ggml-cpu ops.cpp `rms_norm_f32`): the sum of squares in
//! f64, `scale = 1 / sqrtf(mean + eps)` in f32, `y = x * scale`, then a separate
//! multiplication by the weight (ggml's `mul` op), so rounding happens in the same places.

/// In place over one row: x = (x * scale) * w (w: the norm weight, or None for plain
/// `ggml_rms_norm`). `x.len()` is the normalized dimension.
pub fn rms_norm_row(x: &mut [f32], w: Option<&[f32]>, eps: f32) {
    let mut sum = 0f64;
    for &v in x.iter() {
        sum += (v * v) as f64;
    }
    let mean = (sum / x.len() as f64) as f32;
    let scale = 1.0f32 / (mean + eps).sqrt();
    match w {
        Some(w) => {
            for (v, g) in x.iter_mut().zip(w) {
                *v = (*v * scale) * g;
            }
        }
        None => {
            for v in x.iter_mut() {
                *v *= scale;
            }
        }
    }
}

/// RMSNorm of `n_rows` rows of `dim` from `src` into `dst` (both [n_rows, dim]).
pub fn rms_norm_rows(src: &[f32], dst: &mut [f32], dim: usize, w: Option<&[f32]>, eps: f32) {
    for (s, d) in src.chunks_exact(dim).zip(dst.chunks_exact_mut(dim)) {
        d.copy_from_slice(s);
        rms_norm_row(d, w, eps);
    }
}

/// LayerNorm of one row in place, as ggml computes `ggml_norm` then `ggml_mul` (w) and
/// `ggml_add` (b) on x86-64 with AVX2: the mean from an f64 sum rounded to f32, the variance
/// from groups of 8 squared deviations each summed in f32 (ggml's 8-lane horizontal order)
/// and accumulated in f64, `scale = 1 / sqrtf(var + eps)`, then y = ((x - mean) * scale) * w + b.
pub fn layer_norm_row(x: &mut [f32], w: Option<&[f32]>, b: Option<&[f32]>, eps: f32) {
    let n = x.len();
    if n == 0 {
        return;
    }
    let mut sum = 0f64;
    for &v in x.iter() {
        sum += v as f64;
    }
    let mean = (sum as f32) / n as f32;
    let mut var = 0f64;
    let mut i = 0;
    while i + 8 <= n {
        let mut d = [0f32; 8];
        for k in 0..8 {
            x[i + k] -= mean;
            d[k] = x[i + k] * x[i + k];
        }
        var += super::vec::hsum8_ggml(&d) as f64;
        i += 8;
    }
    while i < n {
        x[i] -= mean;
        var += (x[i] * x[i]) as f64;
        i += 1;
    }
    let var = (var / n as f64) as f32;
    let scale = 1.0f32 / (var + eps).sqrt();
    for v in x.iter_mut() {
        *v *= scale;
    }
    if let Some(w) = w {
        for (v, g) in x.iter_mut().zip(w) {
            *v *= g;
        }
    }
    if let Some(b) = b {
        for (v, c) in x.iter_mut().zip(b) {
            *v += c;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layer_norm_zero_mean_unit_variance() {
        let mut x: Vec<f32> = (0..67).map(|i| (i as f32 * 0.7).sin() * 3.0 + 1.5).collect();
        layer_norm_row(&mut x, None, None, 0.0);
        let m: f32 = x.iter().sum::<f32>() / 67.0;
        let v: f32 = x.iter().map(|a| a * a).sum::<f32>() / 67.0;
        assert!(m.abs() < 1e-5 && (v - 1.0).abs() < 1e-4, "{m} {v}");
    }

    #[test]
    fn unit_rms_after_norm() {
        let mut x: Vec<f32> = (0..64).map(|i| (i as f32 - 20.0) * 0.37).collect();
        rms_norm_row(&mut x, None, 0.0);
        let ms: f32 = x.iter().map(|v| v * v).sum::<f32>() / 64.0;
        assert!((ms - 1.0).abs() < 1e-5);
    }
}
