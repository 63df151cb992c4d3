//! Row-group layouts ("x4") of Q5_0, Q4_1 and Q4_K weight matrices for the single-token kernels.
//!
//! A decode step streams every weight once from memory, and the AVX-512 single-token kernels
//! of these formats are bound by their own instruction count, not by memory (one thread on
//! Zen 4, `--bench kernels -- tg huge`: Q5_0 ~21 GB/s and Q4_1 ~24 GB/s with the weights in
//! cache, against a read probe of ~33): per block of a row pair or quad they gather the
//! rows' quants with broadcasts and joins, their 5th bits and scales with scalar loads,
//! shifts and ors. In the x4 layout the four rows of a group keep their blocks' bytes, but
//! block i of the four rows is one contiguous group-block with each field of the four rows
//! together, in the order the kernel loads it:
//!
//! - Q5_0, 88 bytes: the four rows' 16 quant bytes (row r at 16 r), their four f16 scales
//!   (at 64 + 2 r), then the 5th bits as two 64-bit masks, one bit per byte of the kernel's
//!   two quant registers: `lo` bit 16 r + j = bit j of row r's qh (elements 0..16 of row r),
//!   `hi` bit 16 r + j = bit 16 + j (elements 16..32).
//! - Q4_1, 80 bytes: the four rows' 16 quant bytes, then their (d, m) f16 pairs (at 64 + 4 r).
//! - Q4_K, 576 bytes a super-block of 256: the four rows' d (at 2 r), dmin (at 8 + 2 r), the
//!   three 32-bit words of their 6-bit scales and mins (word k of row r at 16 (k + 1) + 4 r),
//!   then their 128 quant bytes (at 64 + 128 r). The plain 8-row kernel unpacked each row's
//!   scales with scalar shifts and inserts (a third of its time, with its reduction); here the
//!   words of 8 rows (two groups) unpack in a few vector operations.
//!
//! A group takes exactly the bytes its four plain rows took (4 x the row size, at the same
//! offset), and the rows after the last whole group (n_rows % 4) stay plain at the end: so a
//! range of whole groups starts where its plain rows did, and `unpack_x4` restores the plain
//! rows exactly (the layout is a permutation of each group's bytes).
//!
//! The kernels over this layout (`avx512::cols_q5_0_x4`, `cols_q4_1_x4`, `cols_q4_k_x4`)
//! are bit-identical to the plain ones (tests). `Model::load` repacks the layers' Q5_0 /
//! Q4_1 / Q4_K projections in place where these kernels run (`Model::repack_weights`); the matmul reads the layout
//! (`ops::matmul`: these kernels up to `x4_max_tokens`, the rows unpacked for anything else), and
//! no other path is handed an x4 tensor (`TensorView::row` refuses one, `tensor_raw` unpacks).

use crate::error::{Error, Result};
use crate::ggml_type::GgmlType;

/// Rows per group.
pub const GROUP: usize = 4;

/// How a weight tensor's bytes are laid out (`model::TensorView::layout`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Layout {
    /// GGUF's: rows of blocks, as in the file.
    #[default]
    Plain,
    /// Groups of 4 rows in `repack`'s x4 layout, the rows after the last group plain.
    X4,
}

/// Bytes of one group-block (block i of a group's 4 rows) of `ty`'s x4 layout; None for the
/// formats without one.
pub fn group_block_bytes(ty: GgmlType) -> Option<usize> {
    match ty {
        GgmlType::Q5_0 => Some(88),
        GgmlType::Q4_1 => Some(80),
        GgmlType::Q4_K => Some(576),
        _ => None,
    }
}

/// The kernel over `ty`'s x4 layout, where this CPU runs one (the AVX-512 VNNI set's):
/// `ncols` activation rows at once (`x + c * xs`, their scales at `xd + c * xds` or `xd`
/// null, results at `out + c * ld`), rows of `w` from a group boundary (the rows after the
/// whole groups, nrows % 4, must be the matrix's plain tail), each group-block decoded once
/// for up to four columns; `tn` the columns' offset sums (`x4_offsets`). Every element has
/// the bits of the plain single-token kernel.
pub type X4Cols = unsafe fn(
    n: usize,
    w: *const u8,
    ws: usize,
    nrows: usize,
    x: *const u8,
    xs: usize,
    xd: *const f32,
    xds: usize,
    tn: *const i32,
    ncols: usize,
    out: *mut f32,
    ld: usize,
);

/// `ty`'s `X4Cols` kernel on this CPU, if any.
pub fn x4_kernel(ty: GgmlType) -> Option<X4Cols> {
    #[cfg(target_arch = "x86_64")]
    if super::avx512_available() {
        return match ty {
            GgmlType::Q5_0 => Some(super::avx512::cols_q5_0_x4),
            GgmlType::Q4_1 => Some(super::avx512::cols_q4_1_x4),
            GgmlType::Q4_K => Some(super::avx512::cols_q4_k_x4),
            _ => None,
        };
    }
    let _ = ty;
    None
}

/// Rows one pass of `ty`'s x4 kernel takes: a group, two for Q4_K (its pass fills 8 float
/// lanes, one row each; a lone group costs a whole pass). The matmul claims rows in these
/// units.
pub fn x4_pass_rows(ty: GgmlType) -> usize {
    if ty == GgmlType::Q4_K {
        2 * GROUP
    } else {
        GROUP
    }
}

/// The most tokens `ty`'s x4 kernel takes a matmul for; more (a prompt, a large batch) go
/// through the plain rows (unpacked) and the prefill kernels. Q4_K's x4 kernel shares a
/// group-block's unpacking (scales, mins, a row's nibbles) between tokens but not the integer
/// products, where the plain rows' tiles share the weights across 8 tokens: a 7B-sized 4096 x
/// 4096 at one thread (`--bench batched`, us a token) took 278-295 in the x4 kernel at 8-16
/// tokens, 306-311 in the plain rows at 8, 358-380 at 10-14, 172-204 at 16 (whole tiles), and
/// the unpacked x4 weight 219-236 at 17: so the x4 kernel below 16 tokens.
pub fn x4_max_tokens(ty: GgmlType) -> usize {
    if ty == GgmlType::Q4_K {
        15
    } else {
        32
    }
}

/// The activations' offset sums an `X4Cols` kernel of `ty` takes (`tn`), for `ncols`
/// activation rows of n elements (`x + c * xs`), into `dst` (resized): Q5_0's weights are
/// u - 16 with u the unsigned 5-bit code, so each block's integer sum starts from -16 times
/// each 4 activations' sum; computed once per matmul, not once per kernel call (a thread's
/// last claims are one group). Empty for Q4_1 and Q4_K (no offset).
pub fn x4_offsets(ty: GgmlType, n: usize, x: *const u8, xs: usize, ncols: usize, dst: &mut Vec<i32>) {
    dst.clear();
    #[cfg(target_arch = "x86_64")]
    if ty == GgmlType::Q5_0 && super::avx512_available() {
        let len = (n / 32) * ncols * 32;
        dst.resize(len, 0);
        // SAFETY: x holds ncols rows of n / 32 Q8_0 blocks xs bytes apart (the caller's
        // quantized activations); dst holds len i32.
        unsafe { super::avx512::q5_0_x4_offsets(n, x, xs, ncols, dst.as_mut_ptr()) };
    }
    let _ = (ty, n, x, xs, ncols);
}

fn check(ty: GgmlType, n_in: usize, src: &[u8], dst: &[u8]) -> Result<(usize, usize)> {
    let gb = group_block_bytes(ty).ok_or_else(|| Error::Unsupported(format!("no x4 layout for {ty}")))?;
    let blk = ty.block_size();
    let wrow = ty
        .row_size(n_in)
        .filter(|_| n_in.is_multiple_of(blk) && n_in > 0)
        .ok_or_else(|| Error::Invalid(format!("x4 layout of {ty}: a row of {n_in} is not whole {blk}-element blocks")))?;
    if !src.len().is_multiple_of(wrow) || src.len() != dst.len() {
        return Err(Error::Invalid(format!(
            "x4 layout of {ty}: {} source bytes for rows of {wrow} bytes, {} destination bytes",
            src.len(),
            dst.len()
        )));
    }
    debug_assert_eq!(gb * (n_in / blk), GROUP * wrow);
    Ok((wrow, src.len() / wrow))
}

/// `src` (plain rows of `n_in` elements of `ty`) in the x4 layout, into `dst` (the same size).
pub fn repack_x4(ty: GgmlType, n_in: usize, src: &[u8], dst: &mut [u8]) -> Result<()> {
    let (wrow, n_rows) = check(ty, n_in, src, dst)?;
    let bs = ty.type_size();
    let nb = n_in / ty.block_size();
    let ng = n_rows / GROUP;
    let gb = group_block_bytes(ty).unwrap();
    for g in 0..ng {
        let rows = &src[g * GROUP * wrow..(g + 1) * GROUP * wrow];
        let out = &mut dst[g * GROUP * wrow..(g + 1) * GROUP * wrow];
        for i in 0..nb {
            let o = &mut out[i * gb..(i + 1) * gb];
            let (mut lo, mut hi) = (0u64, 0u64);
            for r in 0..GROUP {
                let b = &rows[r * wrow + i * bs..r * wrow + (i + 1) * bs];
                match ty {
                    GgmlType::Q5_0 => {
                        // d (2), qh (4), qs (16)
                        o[16 * r..16 * r + 16].copy_from_slice(&b[6..22]);
                        o[64 + 2 * r..66 + 2 * r].copy_from_slice(&b[0..2]);
                        let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]) as u64;
                        lo |= (qh & 0xFFFF) << (16 * r);
                        hi |= (qh >> 16) << (16 * r);
                    }
                    GgmlType::Q4_K => {
                        // d (2), dmin (2), scales (12: three words), qs (128)
                        o[2 * r..2 * r + 2].copy_from_slice(&b[0..2]);
                        o[8 + 2 * r..10 + 2 * r].copy_from_slice(&b[2..4]);
                        for k in 0..3 {
                            o[16 * (k + 1) + 4 * r..16 * (k + 1) + 4 * r + 4].copy_from_slice(&b[4 + 4 * k..8 + 4 * k]);
                        }
                        o[64 + 128 * r..192 + 128 * r].copy_from_slice(&b[16..144]);
                    }
                    _ => {
                        // Q4_1: d (2), m (2), qs (16)
                        o[16 * r..16 * r + 16].copy_from_slice(&b[4..20]);
                        o[64 + 4 * r..68 + 4 * r].copy_from_slice(&b[0..4]);
                    }
                }
            }
            if ty == GgmlType::Q5_0 {
                o[72..80].copy_from_slice(&lo.to_le_bytes());
                o[80..88].copy_from_slice(&hi.to_le_bytes());
            }
        }
    }
    let tail = ng * GROUP * wrow;
    dst[tail..].copy_from_slice(&src[tail..]);
    Ok(())
}

/// `repack_x4` in place (one group's bytes copied aside at a time).
pub fn repack_x4_in_place(ty: GgmlType, n_in: usize, data: &mut [u8]) -> Result<()> {
    let wrow = ty.row_size(n_in).unwrap_or(0);
    check(ty, n_in, data, data)?;
    let g = GROUP * wrow;
    let mut tmp = vec![0u8; g];
    for grp in data.chunks_exact_mut(g) {
        tmp.copy_from_slice(grp);
        repack_x4(ty, n_in, &tmp, grp)?;
    }
    Ok(())
}

/// The plain rows of an x4 layout `src` (rows of `n_in` elements of `ty`), into `dst`.
/// (Word loads and stores: a prompt's matmul unpacks each x4 weight it reads.)
pub fn unpack_x4(ty: GgmlType, n_in: usize, src: &[u8], dst: &mut [u8]) -> Result<()> {
    let (wrow, n_rows) = check(ty, n_in, src, dst)?;
    let bs = ty.type_size();
    let nb = n_in / ty.block_size();
    let ng = n_rows / GROUP;
    let gb = group_block_bytes(ty).unwrap();
    let (sp, dp) = (src.as_ptr(), dst.as_mut_ptr());
    for g in 0..ng {
        let base = g * GROUP * wrow;
        for i in 0..nb {
            // SAFETY: group g's block i (gb bytes at base + i * gb) and row r's block i (bs
            // bytes at base + r * wrow + i * bs) lie inside src / dst: check() holds
            // src.len() == dst.len() == n_rows * wrow, and gb * nb == GROUP * wrow.
            unsafe {
                let s = sp.add(base + i * gb);
                let rd = |o: usize| std::ptr::read_unaligned(s.add(o) as *const u64);
                for r in 0..GROUP {
                    let d = dp.add(base + r * wrow + i * bs);
                    if ty == GgmlType::Q4_K {
                        // (fixed-size word copies: a prompt unpacks every Q4_K weight it reads)
                        let w16 = |from: usize, to: usize| std::ptr::write_unaligned(d.add(to) as *mut u16, std::ptr::read_unaligned(s.add(from) as *const u16));
                        let w32 = |from: usize, to: usize| std::ptr::write_unaligned(d.add(to) as *mut u32, std::ptr::read_unaligned(s.add(from) as *const u32));
                        w16(2 * r, 0);
                        w16(8 + 2 * r, 2);
                        for k in 0..3 {
                            w32(16 * (k + 1) + 4 * r, 4 + 4 * k);
                        }
                        let q = s.add(64 + 128 * r);
                        for k in 0..8 {
                            std::ptr::write_unaligned(d.add(16 + 16 * k) as *mut u128, std::ptr::read_unaligned(q.add(16 * k) as *const u128));
                        }
                    } else if ty == GgmlType::Q5_0 {
                        let qs = std::ptr::read_unaligned(s.add(16 * r) as *const u128);
                        let qh = ((rd(72) >> (16 * r)) & 0xFFFF) | (((rd(80) >> (16 * r)) & 0xFFFF) << 16);
                        std::ptr::write_unaligned(d as *mut u16, std::ptr::read_unaligned(s.add(64 + 2 * r) as *const u16));
                        std::ptr::write_unaligned(d.add(2) as *mut u32, qh as u32);
                        std::ptr::write_unaligned(d.add(6) as *mut u128, qs);
                    } else {
                        let qs = std::ptr::read_unaligned(s.add(16 * r) as *const u128);
                        std::ptr::write_unaligned(d as *mut u32, std::ptr::read_unaligned(s.add(64 + 4 * r) as *const u32));
                        std::ptr::write_unaligned(d.add(4) as *mut u128, qs);
                    }
                }
            }
        }
    }
    let tail = ng * GROUP * wrow;
    dst[tail..].copy_from_slice(&src[tail..]);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn x4_layouts_round_trip_and_keep_each_group_in_place() {
        let mut s = 0x9E37_79B9_7F4A_7C15u64;
        for ty in [GgmlType::Q5_0, GgmlType::Q4_1, GgmlType::Q4_K] {
            let k = ty.block_size() / 32;
            for (n_in, n_rows) in [(32usize, 1usize), (32, 4), (64, 5), (96, 7), (896, 8), (576, 11)].map(|(n, r)| (n * k, r)) {
                let wrow = ty.row_size(n_in).unwrap();
                let src: Vec<u8> = (0..wrow * n_rows)
                    .map(|_| {
                        s ^= s << 13;
                        s ^= s >> 7;
                        s ^= s << 17;
                        s as u8
                    })
                    .collect();
                let mut x4 = vec![0u8; src.len()];
                repack_x4(ty, n_in, &src, &mut x4).unwrap();
                let mut back = vec![0u8; src.len()];
                unpack_x4(ty, n_in, &x4, &mut back).unwrap();
                assert_eq!(src, back, "{ty} {n_in} x {n_rows}");
                // each group holds its own rows' bytes (a permutation), the tail is plain
                let g = GROUP * wrow;
                for k in 0..n_rows / GROUP {
                    let (mut a, mut b) = (src[k * g..(k + 1) * g].to_vec(), x4[k * g..(k + 1) * g].to_vec());
                    if ty != GgmlType::Q5_0 {
                        a.sort_unstable();
                        b.sort_unstable();
                        assert_eq!(a, b);
                    }
                }
                let tail = n_rows / GROUP * g;
                assert_eq!(src[tail..], x4[tail..]);
            }
        }
        // a row that is not whole blocks, a size that is not whole rows, a format without x4
        let mut d = vec![0u8; 22];
        assert!(repack_x4(GgmlType::Q5_0, 16, &[0u8; 22], &mut d).is_err());
        assert!(repack_x4(GgmlType::Q5_0, 32, &[0u8; 23], &mut [0u8; 23]).is_err());
        assert!(repack_x4(GgmlType::Q8_0, 32, &[0u8; 34], &mut [0u8; 34]).is_err());
    }
}
