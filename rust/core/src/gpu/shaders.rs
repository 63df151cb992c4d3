//! WGSL sources: one `deq` per weight format, appended to `mm_common.wgsl` and a kernel
//! (`matmul.wgsl` for one token, `mm_tiled.wgsl` for several).
//!
//! `deq(base, j, v)` writes the 32 weights of chunk `j` of the row whose bytes start at
//! `base` into `v` (zeros past the row's end for the float formats, whose rows need not be
//! a multiple of 32), dequantized as ggml's `dequantize_row_*` does.

use crate::ggml_type::GgmlType;

const F32: &str = r#"
fn deq(base: u32, j: u32, v: ptr<function, array<f32, 32>>) {
    for (var i = 0u; i < 32u; i++) {
        let e = j * 32u + i;
        (*v)[i] = select(0.0, bitcast<f32>(w[(base >> 2u) + min(e, p.n_in - 1u)]), e < p.n_in);
    }
}
"#;

const F16: &str = r#"
fn deq(base: u32, j: u32, v: ptr<function, array<f32, 32>>) {
    for (var i = 0u; i < 32u; i++) {
        let e = j * 32u + i;
        (*v)[i] = select(0.0, f16_at(base + 2u * min(e, p.n_in - 1u)), e < p.n_in);
    }
}
"#;

// block_q8_0: f16 d, i8 qs[32] (34 bytes)
const Q8_0: &str = r#"
fn deq(base: u32, j: u32, v: ptr<function, array<f32, 32>>) {
    let b = base + j * 34u;
    let d = f16_at(b);
    for (var i = 0u; i < 32u; i++) {
        (*v)[i] = d * i8_at(b + 2u + i);
    }
}
"#;

// block_q4_0: f16 d, u8 qs[16] (18 bytes); low nibbles are weights 0..15, high 16..31
const Q4_0: &str = r#"
fn deq(base: u32, j: u32, v: ptr<function, array<f32, 32>>) {
    let b = base + j * 18u;
    let d = f16_at(b);
    for (var i = 0u; i < 16u; i++) {
        let q = byte_at(b + 2u + i);
        (*v)[i] = d * (f32(q & 15u) - 8.0);
        (*v)[i + 16u] = d * (f32(q >> 4u) - 8.0);
    }
}
"#;

// block_q4_1: f16 d, f16 m, u8 qs[16] (20 bytes): d * q + m
const Q4_1: &str = r#"
fn deq(base: u32, j: u32, v: ptr<function, array<f32, 32>>) {
    let b = base + j * 20u;
    let d = f16_at(b);
    let m = f16_at(b + 2u);
    for (var i = 0u; i < 16u; i++) {
        let q = byte_at(b + 4u + i);
        (*v)[i] = f32(q & 15u) * d + m;
        (*v)[i + 16u] = f32(q >> 4u) * d + m;
    }
}
"#;

// block_q5_0: f16 d, u32 qh, u8 qs[16] (22 bytes): fifth bits of weight i in bit i of qh
const Q5_0: &str = r#"
fn deq(base: u32, j: u32, v: ptr<function, array<f32, 32>>) {
    let b = base + j * 22u;
    let d = f16_at(b);
    let qh = u16_at(b + 2u) | (u16_at(b + 4u) << 16u);
    for (var i = 0u; i < 16u; i++) {
        let q = byte_at(b + 6u + i);
        let x0 = i32((q & 15u) | (((qh >> i) << 4u) & 16u)) - 16;
        let x1 = i32((q >> 4u) | ((qh >> (i + 12u)) & 16u)) - 16;
        (*v)[i] = f32(x0) * d;
        (*v)[i + 16u] = f32(x1) * d;
    }
}
"#;

// block_q5_1: f16 d, f16 m, u32 qh, u8 qs[16] (24 bytes)
const Q5_1: &str = r#"
fn deq(base: u32, j: u32, v: ptr<function, array<f32, 32>>) {
    let b = base + j * 24u;
    let d = f16_at(b);
    let m = f16_at(b + 2u);
    let qh = u16_at(b + 4u) | (u16_at(b + 6u) << 16u);
    for (var i = 0u; i < 16u; i++) {
        let q = byte_at(b + 8u + i);
        let x0 = (q & 15u) | (((qh >> i) << 4u) & 16u);
        let x1 = (q >> 4u) | ((qh >> (i + 12u)) & 16u);
        (*v)[i] = f32(x0) * d + m;
        (*v)[i + 16u] = f32(x1) * d + m;
    }
}
"#;

// block_q4_K: f16 d, f16 dmin, u8 scales[12], u8 qs[128] (144 bytes, 256 weights); chunk
// j is sub-block j % 8 of block j / 8 (ggml's get_scale_min_k4 for its scale and min)
const Q4_K: &str = r#"
fn deq(base: u32, j: u32, v: ptr<function, array<f32, 32>>) {
    let b = base + (j / 8u) * 144u;
    let s = j % 8u;
    let d = f16_at(b);
    let dmin = f16_at(b + 2u);
    let sc = b + 4u;
    var scale: u32;
    var mn: u32;
    if (s < 4u) {
        scale = byte_at(sc + s) & 63u;
        mn = byte_at(sc + s + 4u) & 63u;
    } else {
        scale = (byte_at(sc + s + 4u) & 15u) | ((byte_at(sc + s - 4u) >> 6u) << 4u);
        mn = (byte_at(sc + s + 4u) >> 4u) | ((byte_at(sc + s) >> 6u) << 4u);
    }
    let d1 = d * f32(scale);
    let m1 = dmin * f32(mn);
    let q = b + 16u + (s / 2u) * 32u;
    let shift = (s % 2u) * 4u;
    for (var i = 0u; i < 32u; i++) {
        (*v)[i] = d1 * f32((byte_at(q + i) >> shift) & 15u) - m1;
    }
}
"#;

// block_q6_K: u8 ql[128], u8 qh[64], i8 scales[16], f16 d (210 bytes, 256 weights); chunk
// j is quarter k = s % 4 of half n = s / 4 of block j / 8 (s = j % 8), as ggml's
// dequantize_row_q6_K lays them out
const Q6_K: &str = r#"
fn deq(base: u32, j: u32, v: ptr<function, array<f32, 32>>) {
    let b = base + (j / 8u) * 210u;
    let s = j % 8u;
    let n = s / 4u;
    let k = s % 4u;
    let d = f16_at(b + 208u);
    let ql = b + 64u * n + (k & 1u) * 32u;
    let qh = b + 128u + 32u * n;
    let nshift = (k / 2u) * 4u;
    for (var l = 0u; l < 32u; l++) {
        let lo = (byte_at(ql + l) >> nshift) & 15u;
        let hi = (byte_at(qh + l) >> (2u * k)) & 3u;
        let q = f32(i32(lo | (hi << 4u)) - 32);
        let scale = i8_at(b + 192u + 8u * n + l / 16u + 2u * k);
        (*v)[l] = d * scale * q;
    }
}
"#;

// bf16: the high half of an f32
const BF16: &str = r#"
fn deq(base: u32, j: u32, v: ptr<function, array<f32, 32>>) {
    for (var i = 0u; i < 32u; i++) {
        let e = j * 32u + i;
        (*v)[i] = select(0.0, bitcast<f32>(u16_at(base + 2u * min(e, p.n_in - 1u)) << 16u), e < p.n_in);
    }
}
"#;

// block_q2_K: u8 scales[16], u8 qs[64], f16 d, f16 dmin (84 bytes, 256 weights). Chunk j
// is s = j % 8 of block j / 8: half s / 4 (32 bytes of qs each), 2-bit field s % 4 of
// those bytes; weights 0..15 take scale 2 s, 16..31 scale 2 s + 1 (low nibble: scale,
// high: min), as ggml's dequantize_row_q2_K
const Q2_K: &str = r#"
fn deq(base: u32, j: u32, v: ptr<function, array<f32, 32>>) {
    let b = base + (j / 8u) * 84u;
    let s = j % 8u;
    let d = f16_at(b + 80u);
    let dmin = f16_at(b + 82u);
    let q = b + 16u + (s / 4u) * 32u;
    let shift = (s % 4u) * 2u;
    for (var h = 0u; h < 2u; h++) {
        let sc = byte_at(b + 2u * s + h);
        let dl = d * f32(sc & 15u);
        let ml = dmin * f32(sc >> 4u);
        for (var l = 0u; l < 16u; l++) {
            let i = h * 16u + l;
            (*v)[i] = dl * f32((byte_at(q + i) >> shift) & 3u) - ml;
        }
    }
}
"#;

// block_q3_K: u8 hmask[32], u8 qs[64], u8 scales[12] (16 six-bit scales), f16 d (110
// bytes). Chunk s = j % 8: 2-bit field s % 4 of qs bytes 32 (s / 4) .. +32, high bit s of
// hmask (set: +0, clear: -4); scales 2 s and 2 s + 1 (minus 32), as ggml's
// dequantize_row_q3_K unpacks them
const Q3_K: &str = r#"
fn deq(base: u32, j: u32, v: ptr<function, array<f32, 32>>) {
    let b = base + (j / 8u) * 110u;
    let s = j % 8u;
    let d = f16_at(b + 108u);
    let q = b + 32u + (s / 4u) * 32u;
    let shift = (s % 4u) * 2u;
    for (var h = 0u; h < 2u; h++) {
        let k = 2u * s + h;
        let lo = (byte_at(b + 96u + k % 8u) >> (4u * (k / 8u))) & 15u;
        let hi = (byte_at(b + 104u + k % 4u) >> (2u * (k / 4u))) & 3u;
        let dl = d * f32(i32(lo | (hi << 4u)) - 32);
        for (var l = 0u; l < 16u; l++) {
            let i = h * 16u + l;
            let m = select(4, 0, ((byte_at(b + i) >> s) & 1u) != 0u);
            (*v)[i] = dl * f32(i32((byte_at(q + i) >> shift) & 3u) - m);
        }
    }
}
"#;

// block_q5_K: f16 d, f16 dmin, u8 scales[12], u8 qh[32], u8 qs[128] (176 bytes). Chunk s =
// j % 8: nibble s % 2 of qs bytes 32 (s / 2) .. +32, fifth bit s of qh, scale and min s
// (get_scale_min_k4), as ggml's dequantize_row_q5_K
const Q5_K: &str = r#"
fn deq(base: u32, j: u32, v: ptr<function, array<f32, 32>>) {
    let b = base + (j / 8u) * 176u;
    let s = j % 8u;
    let d = f16_at(b);
    let dmin = f16_at(b + 2u);
    let sc = b + 4u;
    var scale: u32;
    var mn: u32;
    if (s < 4u) {
        scale = byte_at(sc + s) & 63u;
        mn = byte_at(sc + s + 4u) & 63u;
    } else {
        scale = (byte_at(sc + s + 4u) & 15u) | ((byte_at(sc + s - 4u) >> 6u) << 4u);
        mn = (byte_at(sc + s + 4u) >> 4u) | ((byte_at(sc + s) >> 6u) << 4u);
    }
    let d1 = d * f32(scale);
    let m1 = dmin * f32(mn);
    let q = b + 48u + (s / 2u) * 32u;
    let shift = (s % 2u) * 4u;
    for (var i = 0u; i < 32u; i++) {
        let hb = ((byte_at(b + 16u + i) >> s) & 1u) << 4u;
        (*v)[i] = d1 * f32(((byte_at(q + i) >> shift) & 15u) + hb) - m1;
    }
}
"#;

const IQ4_TABLE: &str = r#"
var<private> KV_IQ4: array<f32, 16> = array<f32, 16>(-127.0, -104.0, -83.0, -65.0, -49.0, -35.0, -22.0, -10.0,
    1.0, 13.0, 25.0, 38.0, 53.0, 69.0, 89.0, 113.0);
"#;

// block_iq4_nl: f16 d, u8 qs[16] (18 bytes): d * kvalues_iq4nl[nibble], low nibbles first
const IQ4_NL: &str = r#"
fn deq(base: u32, j: u32, v: ptr<function, array<f32, 32>>) {
    let b = base + j * 18u;
    let d = f16_at(b);
    for (var i = 0u; i < 16u; i++) {
        let q = byte_at(b + 2u + i);
        (*v)[i] = d * KV_IQ4[q & 15u];
        (*v)[i + 16u] = d * KV_IQ4[q >> 4u];
    }
}
"#;

// block_iq4_xs: f16 d, u16 scales_h, u8 scales_l[4], u8 qs[128] (136 bytes, 256 weights):
// sub-block s = j % 8 has the six-bit scale (low nibble s % 2 of scales_l[s / 2], two high
// bits s of scales_h) minus 32, and qs bytes 16 s .. +16 as in IQ4_NL
const IQ4_XS: &str = r#"
fn deq(base: u32, j: u32, v: ptr<function, array<f32, 32>>) {
    let b = base + (j / 8u) * 136u;
    let s = j % 8u;
    let d = f16_at(b);
    let ls = ((byte_at(b + 4u + s / 2u) >> (4u * (s % 2u))) & 15u) | (((u16_at(b + 2u) >> (2u * s)) & 3u) << 4u);
    let dl = d * f32(i32(ls) - 32);
    let q = b + 8u + 16u * s;
    for (var i = 0u; i < 16u; i++) {
        let x = byte_at(q + i);
        (*v)[i] = dl * KV_IQ4[x & 15u];
        (*v)[i + 16u] = dl * KV_IQ4[x >> 4u];
    }
}
"#;

/// The weight formats with a GPU kernel.
pub fn supported(ty: GgmlType) -> bool {
    deq_source(ty).is_some()
}

fn deq_source(ty: GgmlType) -> Option<&'static str> {
    Some(match ty {
        GgmlType::F32 => F32,
        GgmlType::F16 => F16,
        GgmlType::Q8_0 => Q8_0,
        GgmlType::Q4_0 => Q4_0,
        GgmlType::Q4_1 => Q4_1,
        GgmlType::Q5_0 => Q5_0,
        GgmlType::Q5_1 => Q5_1,
        GgmlType::Q4_K => Q4_K,
        GgmlType::Q6_K => Q6_K,
        GgmlType::BF16 => BF16,
        GgmlType::Q2_K => Q2_K,
        GgmlType::Q3_K => Q3_K,
        GgmlType::Q5_K => Q5_K,
        GgmlType::IQ4_NL => IQ4_NL,
        GgmlType::IQ4_XS => IQ4_XS,
        _ => return None,
    })
}

/// Rows per workgroup of the kernel for `tn` tokens per workgroup: 1 for the
/// matrix-vector kernel (tn = 1, matmul.wgsl), 64 for the tiled one (mm_tiled.wgsl).
pub fn rows_per_group(tn: u32) -> usize {
    if tn == 1 {
        1
    } else {
        64
    }
}

/// The workgroup reductions (`Lanes`, `wg_sum`, `wg_max`) of the matrix-vector and
/// attention kernels: with `subgroups` (the device was opened with wgpu's
/// Features::SUBGROUP) reduce_sg.wgsl, else reduce_wg.wgsl (a tree in workgroup memory).
/// naga (wgpu 30) takes the subgroup built-ins without WGSL's `enable subgroups;`
/// directive (it refuses that as not yet implemented) and checks them against the device's
/// features.
pub fn reduce_source(subgroups: bool) -> &'static str {
    if subgroups {
        include_str!("reduce_sg.wgsl")
    } else {
        include_str!("reduce_wg.wgsl")
    }
}

/// The full shader for `ty` with `tn` tokens per workgroup: tn = 1 is the matrix-vector
/// kernel (its reduction with subgroup operations when `subgroups`), 2..=32 the tiled
/// matrix-matrix one (no reduction).
pub fn matmul_source(ty: GgmlType, tn: u32, subgroups: bool) -> Option<String> {
    debug_assert!((1..=32).contains(&tn));
    let deq = deq_source(ty)?;
    let table = if matches!(ty, GgmlType::IQ4_NL | GgmlType::IQ4_XS) { IQ4_TABLE } else { "" };
    let (kernel, reduce) = if tn == 1 {
        (include_str!("matmul.wgsl"), reduce_source(subgroups))
    } else {
        (include_str!("mm_tiled.wgsl"), "")
    };
    Some(format!(
        "const TN: u32 = {tn}u;\n{}\n{}\n{reduce}\n{kernel}\n{table}{deq}",
        include_str!("f16.wgsl"),
        include_str!("mm_common.wgsl")
    ))
}
