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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unit_rms_after_norm() {
        let mut x: Vec<f32> = (0..64).map(|i| (i as f32 - 20.0) * 0.37).collect();
        rms_norm_row(&mut x, None, 0.0);
        let ms: f32 = x.iter().map(|v| v * v).sum::<f32>() / 64.0;
        assert!((ms - 1.0).abs() < 1e-5);
    }
}
