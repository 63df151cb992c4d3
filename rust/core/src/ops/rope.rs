//! Rotary position embedding as ggml computes it (ggml-cpu ops.cpp `rope_f32`,
//! `ggml_rope_cache_init`, `rope_yarn`): theta starts at the position (as f32) and is
//! multiplied by `theta_scale = freq_base^(-2/n_dims)` once per pair, so rounding matches.
//! NORM rotates adjacent pairs (x[2i], x[2i+1]); NEOX rotates (x[i], x[i + n_dims/2]).
//! Dimensions past `n_dims` are left as they are.

use crate::hparams::RopeType;

#[derive(Clone, Debug, PartialEq)]
pub struct RopeParams {
    pub rope_type: RopeType,
    /// Rotated dimensions (<= head size).
    pub n_dims: usize,
    pub freq_base: f32,
    pub freq_scale: f32,
    /// YaRN: 0 disables the ramp.
    pub ext_factor: f32,
    pub attn_factor: f32,
    pub corr_dims: [f32; 2],
    /// Per-pair frequency divisors (`rope_freqs.weight`, Llama 3), n_dims/2 entries.
    pub freq_factors: Option<Vec<f32>>,
}

impl RopeParams {
    pub fn simple(rope_type: RopeType, n_dims: usize, freq_base: f32, freq_scale: f32) -> RopeParams {
        RopeParams {
            rope_type,
            n_dims,
            freq_base,
            freq_scale,
            ext_factor: 0.0,
            attn_factor: 1.0,
            corr_dims: [0.0, 0.0],
            freq_factors: None,
        }
    }

    /// cos/sin pairs for one position into `cache` ([head_dim]: cache[i0] = cos, cache[i0+1] = sin).
    pub fn fill_cache(&self, pos: i32, cache: &mut [f32]) {
        let theta_scale = self.freq_base.powf(-2.0 / self.n_dims as f32);
        let mut theta = pos as f32;
        let mut i0 = 0;
        while i0 + 1 < cache.len() {
            let ff = self.freq_factors.as_ref().and_then(|f| f.get(i0 / 2)).copied().unwrap_or(1.0);
            let theta_extrap = theta / ff;
            let theta_interp = self.freq_scale * theta_extrap;
            let mut th = theta_interp;
            let mut mscale = self.attn_factor;
            if self.ext_factor != 0.0 {
                let y = ((i0 / 2) as f32 - self.corr_dims[0]) / (self.corr_dims[1] - self.corr_dims[0]).max(0.001);
                let ramp = 1.0 - y.clamp(0.0, 1.0);
                let mix = ramp * self.ext_factor;
                th = theta_interp * (1.0 - mix) + theta_extrap * mix;
                mscale *= 1.0 + 0.1 * (1.0 / self.freq_scale).ln();
            }
            cache[i0] = th.cos() * mscale;
            cache[i0 + 1] = th.sin() * mscale;
            theta *= theta_scale;
            i0 += 2;
        }
    }

    /// Rotate one head (`x.len()` = head size) with a cache from `fill_cache`.
    /// Rotate one head in place with a cache from `fill_cache`. Each rotated pair is
    /// computed as ggml's C code compiles (GCC contracts `x0*c - x1*s` into
    /// `fma(x0, c, -(x1*s))` and `x0*s + x1*c` into `fma(x0, s, x1*c)` on FMA machines), so
    /// the results are bit-identical to llama.cpp's rope on x86-64 with FMA.
    pub fn apply(&self, x: &mut [f32], cache: &[f32]) {
        #[cfg(target_arch = "x86_64")]
        {
            if crate::quant::table::kernels().avx2_math {
                // SAFETY: avx2_math: the CPU has FMA (the same bits as without: mul_add
                // is fused either way; this only compiles it to the instruction).
                return unsafe { self.apply_fma(x, cache) };
            }
        }
        self.apply_generic(x, cache)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "fma")]
    unsafe fn apply_fma(&self, x: &mut [f32], cache: &[f32]) {
        self.apply_generic(x, cache)
    }

    #[inline(always)]
    fn apply_generic(&self, x: &mut [f32], cache: &[f32]) {
        let n = self.n_dims;
        match self.rope_type {
            RopeType::None => {}
            RopeType::Norm => {
                let mut i0 = 0;
                while i0 < n {
                    let (c, s) = (cache[i0], cache[i0 + 1]);
                    let (x0, x1) = (x[i0], x[i0 + 1]);
                    x[i0] = x0.mul_add(c, -(x1 * s));
                    x[i0 + 1] = x0.mul_add(s, x1 * c);
                    i0 += 2;
                }
            }
            RopeType::Neox => {
                let half = n / 2;
                let mut i0 = 0;
                while i0 < n {
                    let ic = i0 / 2;
                    let (c, s) = (cache[i0], cache[i0 + 1]);
                    let (x0, x1) = (x[ic], x[ic + half]);
                    x[ic] = x0.mul_add(c, -(x1 * s));
                    x[ic + half] = x0.mul_add(s, x1 * c);
                    i0 += 2;
                }
            }
        }
    }

    pub fn apply_heads(&self, x: &mut [f32], head_dim: usize, pos: i32, cache: &mut [f32]) {
        self.fill_cache(pos, &mut cache[..head_dim]);
        for h in x.chunks_exact_mut(head_dim) {
            self.apply(h, &cache[..head_dim]);
        }
    }
}

/// ggml_rope_yarn_corr_dims: the first and last dimension the YaRN ramp blends.
pub fn yarn_corr_dims(n_dims: usize, n_ctx_orig: usize, freq_base: f32, beta_fast: f32, beta_slow: f32) -> [f32; 2] {
    let corr_dim = |n_rot: f32| {
        n_dims as f32 * (n_ctx_orig as f32 / (n_rot * 2.0 * std::f32::consts::PI)).ln() / (2.0 * freq_base.ln())
    };
    let start = corr_dim(beta_fast).floor();
    let end = corr_dim(beta_slow).ceil();
    [start.max(0.0), end.min(n_dims as f32 - 1.0)]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotation_composes() {
        // rope(p) then rope(d) == rope(p + d) up to rounding: what the K-shift relies on.
        for ty in [RopeType::Norm, RopeType::Neox] {
            let r = RopeParams::simple(ty, 16, 10000.0, 1.0);
            let x0: Vec<f32> = (0..16).map(|i| (i as f32 * 0.7).sin()).collect();
            let mut c = vec![0f32; 16];
            let mut a = x0.clone();
            r.apply_heads(&mut a, 16, 5, &mut c);
            r.apply_heads(&mut a, 16, 7, &mut c);
            let mut b = x0.clone();
            r.apply_heads(&mut b, 16, 12, &mut c);
            for (p, q) in a.iter().zip(&b) {
                assert!((p - q).abs() < 1e-4);
            }
            // position 0 is the identity
            let mut z = x0.clone();
            r.apply_heads(&mut z, 16, 0, &mut c);
            assert_eq!(z, x0);
        }
    }
}
