//! Activations and elementwise ops, with ggml's CPU numerics where they matter:
//! GELU (tanh) is ggml's lookup table indexed by the f16-rounded input (ggml-cpu vec.h
//! `ggml_vec_gelu_f32` with GGML_GELU_FP16), so we round the input to f16 first and the
//! result to f16 too, exactly as the table does.

use half::f16;
use std::sync::OnceLock;

const GELU_COEF_A: f32 = 0.044715;
const SQRT_2_OVER_PI: f32 = 0.797_884_560_802_865_4;

#[inline]
pub fn gelu_f32(x: f32) -> f32 {
    // `1 + GELU_COEF_A*x*x` as GCC compiles ggml_gelu_f32 (contracted to one FMA), so
    // the table is bit-identical to llama.cpp's on x86-64.
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (GELU_COEF_A * x).mul_add(x, 1.0)).tanh())
}

/// 65536 entries: f32(f16(gelu(f32(h)))) for every f16 bit pattern h.
fn gelu_table() -> &'static [f32] {
    static T: OnceLock<Vec<f32>> = OnceLock::new();
    T.get_or_init(|| (0..=u16::MAX).map(|h| f16::from_f32(gelu_f32(f16::from_bits(h).to_f32())).to_f32()).collect())
}

/// ggml's GELU on one value (table lookup on the f16-rounded input).
#[inline]
fn gelu_lut(t: &[f32], x: f32) -> f32 {
    if x <= -10.0 {
        0.0
    } else if x >= 10.0 {
        x
    } else {
        t[f16::from_f32(x).to_bits() as usize]
    }
}

/// gate = gelu(gate) * up, elementwise (ggml_geglu_split: GELU of the gate, times up).
pub fn geglu(gate: &mut [f32], up: &[f32]) {
    let t = gelu_table();
    for (g, u) in gate.iter_mut().zip(up) {
        *g = gelu_lut(t, *g) * u;
    }
}

/// x = gelu(x) in place.
pub fn gelu(x: &mut [f32]) {
    let t = gelu_table();
    for v in x.iter_mut() {
        *v = gelu_lut(t, *v);
    }
}

#[inline]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// gate = silu(gate) * up (SwiGLU).
pub fn swiglu(gate: &mut [f32], up: &[f32]) {
    for (g, u) in gate.iter_mut().zip(up) {
        *g = silu(*g) * u;
    }
}

/// x = c * tanh(x / c) (logit softcapping: scale, tanh, scale, as the graph does).
pub fn softcap(x: &mut [f32], c: f32) {
    let inv = 1.0 / c;
    for v in x.iter_mut() {
        *v = (*v * inv).tanh() * c;
    }
}

pub fn scale(x: &mut [f32], s: f32) {
    for v in x.iter_mut() {
        *v *= s;
    }
}

/// y += x
pub fn add_assign(y: &mut [f32], x: &[f32]) {
    for (a, b) in y.iter_mut().zip(x) {
        *a += b;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gelu_lut_close_to_exact_and_f16_rounded() {
        let t = gelu_table();
        for i in -300..300 {
            let x = i as f32 * 0.031;
            let y = gelu_lut(t, x);
            assert!((y - gelu_f32(x)).abs() <= 2e-3 * (1.0 + x.abs()), "{x} {y}");
            assert_eq!(f16::from_f32(y).to_f32(), y);
        }
        assert_eq!(gelu_lut(t, -11.0), 0.0);
        assert_eq!(gelu_lut(t, 12.5), 12.5);
    }
}
