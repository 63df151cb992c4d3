//! The block layouts of every quantized weight and activation type (ggml-common.h), defined
//! once: the scalar kernels read their blocks through these structs (`as_blocks`), the
//! SIMD kernels take block strides and field offsets from them (`Block::SIZE`,
//! `offset_of!`) instead of hand-written byte counts.
//!
//! Every field is a byte array (f16 values as their two little-endian bytes, `F16`), so
//! each struct has alignment 1 and no padding: any `SIZE` bytes of a row are one block,
//! wherever they lie. The sizes are checked at compile time against ggml's.

pub(crate) use std::mem::offset_of;
use std::mem::size_of;

/// An f16 field: its two little-endian bytes.
pub(crate) type F16 = [u8; 2];

/// A block layout.
///
/// # Safety
/// Implemented only for `#[repr(C)]` structs of byte arrays (alignment 1, no padding,
/// every bit pattern valid), which `as_blocks` reinterprets rows as.
pub(crate) unsafe trait Block: Copy + Sized {
    /// Bytes per block.
    const SIZE: usize = size_of::<Self>();
}

/// The whole blocks of `row` (a trailing partial block is not included).
#[inline(always)]
pub(crate) fn as_blocks<B: Block>(row: &[u8]) -> &[B] {
    // SAFETY: B has alignment 1 and every bit pattern is valid (`Block`); the slice covers
    // row.len() / SIZE whole blocks inside `row`.
    unsafe { std::slice::from_raw_parts(row.as_ptr() as *const B, row.len() / B::SIZE) }
}

/// `as_blocks` for writing.
#[inline(always)]
pub(crate) fn as_blocks_mut<B: Block>(row: &mut [u8]) -> &mut [B] {
    // SAFETY: as in `as_blocks`, and the borrow of `row` is exclusive.
    unsafe { std::slice::from_raw_parts_mut(row.as_mut_ptr() as *mut B, row.len() / B::SIZE) }
}

/// The block at the start of `b` (at least one block's bytes).
#[inline(always)]
pub(crate) fn block<B: Block>(b: &[u8]) -> &B {
    &as_blocks::<B>(b)[0]
}

/// The f32 value of an f16 field.
#[inline(always)]
pub(crate) fn f16(v: F16) -> f32 {
    super::fp::f16_to_f32(u16::from_le_bytes(v))
}

/// An f16 field holding v (rounded to nearest even).
#[inline(always)]
pub(crate) fn f16_bytes(v: f32) -> F16 {
    super::fp::f32_to_f16(v).to_le_bytes()
}

macro_rules! blocks {
    ($($(#[$m:meta])* $name:ident [$size:expr] { $($(#[$fm:meta])* $f:ident: $t:ty,)* })*) => {$(
        $(#[$m])*
        #[repr(C)]
        #[derive(Clone, Copy)]
        pub(crate) struct $name {
            $($(#[$fm])* pub(crate) $f: $t,)*
        }
        // SAFETY: repr(C) of byte arrays only.
        unsafe impl Block for $name {}
        const _: () = assert!(size_of::<$name>() == $size && std::mem::align_of::<$name>() == 1);
    )*};
}

blocks! {
    /// Q4_0, 32 elements: x[j] = d * ((qs[j] & 15) - 8), x[j + 16] = d * ((qs[j] >> 4) - 8).
    BlockQ4_0 [18] { d: F16, qs: [u8; 16], }
    /// Q4_1, 32 elements: x[j] = d * (qs[j] & 15) + m, x[j + 16] = d * (qs[j] >> 4) + m.
    BlockQ4_1 [20] { d: F16, m: F16, qs: [u8; 16], }
    /// Q5_0, 32 elements: Q4_0's nibbles with bit j of qh (LE u32) as element j's 5th bit, - 16.
    BlockQ5_0 [22] { d: F16, qh: [u8; 4], qs: [u8; 16], }
    /// Q5_1, 32 elements: Q4_1 with a 5th bit as in Q5_0.
    BlockQ5_1 [24] { d: F16, m: F16, qh: [u8; 4], qs: [u8; 16], }
    /// Q8_0, 32 elements: x[j] = d * qs[j].
    BlockQ8_0 [34] { d: F16, qs: [i8; 32], }
    /// Q8_1, 32 elements: Q8_0 with s = d * sum(qs).
    BlockQ8_1 [36] { d: F16, s: F16, qs: [i8; 32], }
    /// IQ4_NL, 32 elements: Q4_0's nibbles through the non-linear grid.
    BlockIQ4NL [18] { d: F16, qs: [u8; 16], }
    /// MXFP4, 32 elements: an E8M0 scale, E2M1 codes (low nibbles elements 0..16).
    BlockMXFP4 [17] { e: u8, qs: [u8; 16], }
    /// NVFP4, 64 elements: a UE4M3 scale per 16 elements, E2M1 codes.
    BlockNVFP4 [36] { d: [u8; 4], qs: [u8; 32], }
    /// Q1_0, 128 elements: bit j of qs set -> +d, else -d.
    BlockQ1_0 [18] { d: F16, qs: [u8; 16], }
    /// Q2_0, 64 elements: 2 bits per element, low bits first; value q - 1.
    BlockQ2_0 [18] { d: F16, qs: [u8; 16], }
    /// Q2_K, 256 elements.
    BlockQ2K [84] { scales: [u8; 16], qs: [u8; 64], d: F16, dmin: F16, }
    /// Q3_K, 256 elements.
    BlockQ3K [110] { hmask: [u8; 32], qs: [u8; 64], scales: [u8; 12], d: F16, }
    /// Q4_K, 256 elements.
    BlockQ4K [144] { d: F16, dmin: F16, scales: [u8; 12], qs: [u8; 128], }
    /// Q5_K, 256 elements.
    BlockQ5K [176] { d: F16, dmin: F16, scales: [u8; 12], qh: [u8; 32], qs: [u8; 128], }
    /// Q6_K, 256 elements.
    BlockQ6K [210] { ql: [u8; 128], qh: [u8; 64], scales: [i8; 16], d: F16, }
    /// Q8_K (activations), 256 elements: d is an f32 (LE bytes), bsums 16 LE i16 sums of 16 quants.
    BlockQ8K [292] { d: [u8; 4], qs: [i8; 256], bsums: [u8; 32], }
    /// IQ2_XXS, 256 elements (qs: 32 LE u16).
    BlockIQ2XXS [66] { d: F16, qs: [u8; 64], }
    /// IQ2_XS, 256 elements (qs: 32 LE u16).
    BlockIQ2XS [74] { d: F16, qs: [u8; 64], scales: [u8; 8], }
    /// IQ2_S, 256 elements.
    BlockIQ2S [82] { d: F16, qs: [u8; 64], qh: [u8; 8], scales: [u8; 8], }
    /// IQ3_XXS, 256 elements.
    BlockIQ3XXS [98] { d: F16, qs: [u8; 96], }
    /// IQ3_S, 256 elements.
    BlockIQ3S [110] { d: F16, qs: [u8; 64], qh: [u8; 8], signs: [u8; 32], scales: [u8; 4], }
    /// IQ1_S, 256 elements (qh: 8 LE u16).
    BlockIQ1S [50] { d: F16, qs: [u8; 32], qh: [u8; 16], }
    /// IQ1_M, 256 elements (scales: 4 LE u16 that also hold d).
    BlockIQ1M [56] { qs: [u8; 32], qh: [u8; 16], scales: [u8; 8], }
    /// IQ4_XS, 256 elements.
    BlockIQ4XS [136] { d: F16, scales_h: [u8; 2], scales_l: [u8; 4], qs: [u8; 128], }
    /// TQ1_0, 256 elements.
    BlockTQ1_0 [54] { qs: [u8; 48], qh: [u8; 4], d: F16, }
    /// TQ2_0, 256 elements.
    BlockTQ2_0 [66] { qs: [u8; 64], d: F16, }
}

impl BlockQ8K {
    /// The f32 scale.
    #[inline(always)]
    pub(crate) fn d(&self) -> f32 {
        f32::from_le_bytes(self.d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ggml_type::GgmlType::{self, *};

    #[test]
    fn block_sizes_are_ggmls() {
        let sizes: [(GgmlType, usize); 28] = [
            (Q4_0, BlockQ4_0::SIZE),
            (Q4_1, BlockQ4_1::SIZE),
            (Q5_0, BlockQ5_0::SIZE),
            (Q5_1, BlockQ5_1::SIZE),
            (Q8_0, BlockQ8_0::SIZE),
            (Q8_1, BlockQ8_1::SIZE),
            (IQ4_NL, BlockIQ4NL::SIZE),
            (MXFP4, BlockMXFP4::SIZE),
            (NVFP4, BlockNVFP4::SIZE),
            (Q1_0, BlockQ1_0::SIZE),
            (Q2_0, BlockQ2_0::SIZE),
            (Q2_K, BlockQ2K::SIZE),
            (Q3_K, BlockQ3K::SIZE),
            (Q4_K, BlockQ4K::SIZE),
            (Q5_K, BlockQ5K::SIZE),
            (Q6_K, BlockQ6K::SIZE),
            (Q8_K, BlockQ8K::SIZE),
            (IQ2_XXS, BlockIQ2XXS::SIZE),
            (IQ2_XS, BlockIQ2XS::SIZE),
            (IQ2_S, BlockIQ2S::SIZE),
            (IQ3_XXS, BlockIQ3XXS::SIZE),
            (IQ3_S, BlockIQ3S::SIZE),
            (IQ1_S, BlockIQ1S::SIZE),
            (IQ1_M, BlockIQ1M::SIZE),
            (IQ4_XS, BlockIQ4XS::SIZE),
            (TQ1_0, BlockTQ1_0::SIZE),
            (TQ2_0, BlockTQ2_0::SIZE),
            (Q8_0, offset_of!(BlockQ8_0, qs) + 32),
        ];
        for (ty, size) in sizes {
            assert_eq!(ty.type_size(), size, "{ty}");
        }
        // ggml's field offsets the SIMD kernels rely on
        assert_eq!(offset_of!(BlockQ4K, qs), 16);
        assert_eq!(offset_of!(BlockQ6K, d), 208);
        assert_eq!(offset_of!(BlockQ8K, bsums), 260);
        assert_eq!(offset_of!(BlockTQ1_0, d), 52);
        let row = [7u8; 2 * 34 + 5];
        assert_eq!(as_blocks::<BlockQ8_0>(&row).len(), 2);
    }
}
