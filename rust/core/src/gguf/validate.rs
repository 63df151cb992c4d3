//! `check_tensors`: the data checks of ggml's `ggml_validate_row_data`
//! (ggml/src/ggml-quants.c): no NaN or Inf in float tensors, nor in the f16 scale
//! fields (`d`, and `m`/`dmin` where a format has one) of quantized blocks.

use crate::ggml_type::GgmlType;

/// Byte offsets of the f16 scale fields inside one block of `ty`, from the block structs
/// in ggml-common.h (e.g. block_q6_K is ql[128] qh[64] scales[16] d: d at 208).
fn f16_scale_offsets(ty: GgmlType) -> &'static [usize] {
    use GgmlType::*;
    match ty {
        Q4_0 | Q5_0 | Q8_0 | IQ4_NL | IQ4_XS | IQ2_XXS | IQ2_XS | IQ2_S | IQ3_XXS | IQ3_S | IQ1_S => &[0],
        Q4_1 | Q5_1 | Q4_K | Q5_K => &[0, 2],
        Q2_K => &[80, 82],
        Q3_K => &[108],
        Q6_K => &[208],
        TQ1_0 => &[52],
        TQ2_0 => &[64],
        Q1_0 | Q2_0 => &[0],
        _ => &[],
    }
}

fn f16_bad(h: u16) -> Option<&'static str> {
    if h & 0x7c00 == 0x7c00 {
        Some(if h & 0x03ff == 0 { "inf" } else { "nan" })
    } else {
        None
    }
}

fn f32_bad(x: f32) -> Option<&'static str> {
    if x.is_nan() {
        Some("nan")
    } else if x.is_infinite() {
        Some("inf")
    } else {
        None
    }
}

/// Ok, or a message saying which value (element or block index) is bad.
pub fn validate_row_data(ty: GgmlType, data: &[u8]) -> std::result::Result<(), String> {
    let ts = ty.type_size();
    if data.len() % ts != 0 {
        return Err(format!("size {} is not a multiple of the {} type size {ts}", data.len(), ty));
    }
    let u16_at = |b: &[u8], o: usize| u16::from_le_bytes([b[o], b[o + 1]]);
    let what = if ty.block_size() == 1 { "value" } else { "block" };
    for (i, b) in data.chunks_exact(ts).enumerate() {
        let bad = match ty {
            GgmlType::F32 => f32_bad(f32::from_le_bytes(b.try_into().unwrap())),
            GgmlType::F64 => {
                let x = f64::from_le_bytes(b.try_into().unwrap());
                if x.is_nan() {
                    Some("nan")
                } else {
                    x.is_infinite().then_some("inf")
                }
            }
            GgmlType::F16 => f16_bad(u16_at(b, 0)),
            GgmlType::BF16 => {
                let h = u16_at(b, 0) & 0x7fff;
                if h > 0x7f80 {
                    Some("nan")
                } else if h == 0x7f80 {
                    Some("inf")
                } else {
                    None
                }
            }
            GgmlType::Q8_K => f32_bad(f32::from_le_bytes(b[..4].try_into().unwrap())),
            GgmlType::MXFP4 => (b[0] == 0xff).then_some("invalid e8m0 scale"),
            GgmlType::IQ1_M => {
                // The f16 scale is spread over the top nibbles of the 4 u16 scales words.
                let sc = |k: usize| u16_at(b, 48 + 2 * k);
                f16_bad((sc(0) >> 12) | ((sc(1) >> 8) & 0x00f0) | ((sc(2) >> 4) & 0x0f00) | (sc(3) & 0xf000))
            }
            _ => f16_scale_offsets(ty).iter().find_map(|&o| f16_bad(u16_at(b, o))),
        };
        if let Some(kind) = bad {
            return Err(format!("found {kind} at {what} {i}"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f32_nan_and_inf_found() {
        let mut d: Vec<u8> = [1.0f32, 2.0, 3.0].iter().flat_map(|x| x.to_le_bytes()).collect();
        assert!(validate_row_data(GgmlType::F32, &d).is_ok());
        d[4..8].copy_from_slice(&f32::NAN.to_le_bytes());
        assert_eq!(validate_row_data(GgmlType::F32, &d).unwrap_err(), "found nan at value 1");
        d[4..8].copy_from_slice(&f32::INFINITY.to_le_bytes());
        assert_eq!(validate_row_data(GgmlType::F32, &d).unwrap_err(), "found inf at value 1");
    }

    #[test]
    fn quant_scales_checked() {
        // Two Q6_K blocks; the second block's d (offset 208) is f16 +inf (0x7c00).
        let mut d = vec![0u8; 2 * 210];
        assert!(validate_row_data(GgmlType::Q6_K, &d).is_ok());
        d[210 + 208..210 + 210].copy_from_slice(&0x7c00u16.to_le_bytes());
        assert_eq!(validate_row_data(GgmlType::Q6_K, &d).unwrap_err(), "found inf at block 1");
        // Q4_1: m at offset 2, a NaN (0x7e00).
        let mut d = vec![0u8; 20];
        d[2..4].copy_from_slice(&0x7e00u16.to_le_bytes());
        assert_eq!(validate_row_data(GgmlType::Q4_1, &d).unwrap_err(), "found nan at block 0");
        // Quantized bytes that are not scales are never checked.
        let mut d = vec![0xffu8; 18];
        d[0..2].copy_from_slice(&0x3c00u16.to_le_bytes());
        assert!(validate_row_data(GgmlType::Q4_0, &d).is_ok());
    }
}
