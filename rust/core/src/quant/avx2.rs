//! AVX2 + FMA + F16C kernels (x86-64), chosen at run time by `super::kernel_set()`.
//! Each mirrors a scalar `_ref` in legacy.rs / kquants.rs / float.rs and is tested against it.

use super::{QuantizeFn, VecDotFn};
use crate::ggml_type::GgmlType;

pub fn vec_dot_fn(_ty: GgmlType) -> Option<VecDotFn> {
    None
}

pub fn quantize_q8_0(src: &[f32], dst: &mut [u8]) {
    super::legacy::quantize_q8_0_x86(src, dst)
}
pub fn quantize_q8_1(src: &[f32], dst: &mut [u8]) {
    super::legacy::quantize_q8_1_x86(src, dst)
}
pub fn quantize_q8_k(src: &[f32], dst: &mut [u8]) {
    super::kquants::quantize_q8_k(src, dst)
}
pub fn quantize_f16(src: &[f32], dst: &mut [u8]) {
    super::float::quantize_f16(src, dst)
}

#[allow(dead_code)]
fn _types(_: QuantizeFn) {}
