//! F32, F16 and BF16 rows: conversion and scalar dot products.
//!
//! As in llama.cpp, F32 weights multiply F32 activations unchanged, F16 weights multiply
//! activations rounded to F16, BF16 weights activations rounded to BF16; products are
//! summed in f32.

use super::fp::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};

#[inline(always)]
fn u16s(b: &[u8]) -> impl Iterator<Item = u16> + '_ {
    b.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]]))
}

#[inline(always)]
fn f32s(b: &[u8]) -> impl Iterator<Item = f32> + '_ {
    b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
}

pub(crate) fn dequantize_f32(src: &[u8], dst: &mut [f32]) {
    for (y, v) in dst.iter_mut().zip(f32s(src)) {
        *y = v;
    }
}

pub(crate) fn dequantize_f16(src: &[u8], dst: &mut [f32]) {
    for (y, h) in dst.iter_mut().zip(u16s(src)) {
        *y = f16_to_f32(h);
    }
}

pub(crate) fn dequantize_bf16(src: &[u8], dst: &mut [f32]) {
    for (y, h) in dst.iter_mut().zip(u16s(src)) {
        *y = bf16_to_f32(h);
    }
}

pub(crate) fn quantize_f32(src: &[f32], dst: &mut [u8]) {
    for (b, v) in dst.chunks_exact_mut(4).zip(src) {
        b.copy_from_slice(&v.to_le_bytes());
    }
}

pub(crate) fn quantize_f16(src: &[f32], dst: &mut [u8]) {
    for (b, &v) in dst.chunks_exact_mut(2).zip(src) {
        b.copy_from_slice(&f32_to_f16(v).to_le_bytes());
    }
}

pub(crate) fn quantize_bf16(src: &[f32], dst: &mut [u8]) {
    for (b, &v) in dst.chunks_exact_mut(2).zip(src) {
        b.copy_from_slice(&f32_to_bf16(v).to_le_bytes());
    }
}

pub(crate) fn vec_dot_f32_ref(n: usize, x: &[u8], y: &[u8]) -> f32 {
    f32s(x).zip(f32s(y)).take(n).fold(0.0f32, |s, (a, b)| s + a * b)
}

pub(crate) fn vec_dot_f16_ref(n: usize, x: &[u8], y: &[u8]) -> f32 {
    u16s(x).zip(u16s(y)).take(n).fold(0.0f32, |s, (a, b)| s + f16_to_f32(a) * f16_to_f32(b))
}

pub(crate) fn vec_dot_bf16_ref(n: usize, x: &[u8], y: &[u8]) -> f32 {
    u16s(x).zip(u16s(y)).take(n).fold(0.0f32, |s, (a, b)| s + bf16_to_f32(a) * bf16_to_f32(b))
}

/// F64 -> f32 (round to nearest even, as a C cast).
pub(crate) fn dequantize_f64(src: &[u8], dst: &mut [f32]) {
    for (y, c) in dst.iter_mut().zip(src.chunks_exact(8)) {
        *y = f64::from_le_bytes(c.try_into().expect("8 bytes")) as f32;
    }
}

/// I8 / I16 / I32 / I64 -> f32 (integers above 2^24 round to nearest even, as a C cast).
pub(crate) fn dequantize_i8(src: &[u8], dst: &mut [f32]) {
    for (y, &c) in dst.iter_mut().zip(src) {
        *y = c as i8 as f32;
    }
}

pub(crate) fn dequantize_i16(src: &[u8], dst: &mut [f32]) {
    for (y, c) in dst.iter_mut().zip(src.chunks_exact(2)) {
        *y = i16::from_le_bytes([c[0], c[1]]) as f32;
    }
}

pub(crate) fn dequantize_i32(src: &[u8], dst: &mut [f32]) {
    for (y, c) in dst.iter_mut().zip(src.chunks_exact(4)) {
        *y = i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f32;
    }
}

pub(crate) fn dequantize_i64(src: &[u8], dst: &mut [f32]) {
    for (y, c) in dst.iter_mut().zip(src.chunks_exact(8)) {
        *y = i64::from_le_bytes(c.try_into().expect("8 bytes")) as f32;
    }
}
