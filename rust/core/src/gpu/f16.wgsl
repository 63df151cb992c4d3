// f16 bits -> f32, subnormals included: unpack2x16float may flush them to zero, and small
// values give subnormal block scales (Q4_K's dmin, a KV block of small activations).
fn f16_val(h: u32) -> f32 {
    if ((h & 0x7c00u) == 0u) {
        return select(1.0, -1.0, (h & 0x8000u) != 0u) * f32(h & 0x3ffu) * 5.9604645e-8;
    }
    return unpack2x16float(h).x;
}

// f32 -> f16 bits, round to nearest even (ggml's FP32_TO_FP16 / F16C)
fn f16_bits(f: f32) -> u32 {
    let x = bitcast<u32>(f);
    let sign = (x >> 16u) & 0x8000u;
    let ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) {
        return sign | 0x7e00u;
    }
    if (ax >= 0x477ff000u) {
        return sign | 0x7c00u; // >= 65520 (and inf): inf
    }
    if (ax < 0x38800000u) { // below 2^-14: a subnormal half, round(|f| 2^24)
        let e = ax >> 23u;
        if (e < 102u) {
            return sign;
        }
        let m = (ax & 0x7fffffu) | 0x800000u;
        let sh = 126u - e;
        let q = m >> sh;
        let rem = m & ((1u << sh) - 1u);
        let hw = 1u << (sh - 1u);
        return sign | (q + select(0u, 1u, rem > hw || (rem == hw && (q & 1u) == 1u)));
    }
    let r = ax - 0x38000000u; // rebias the exponent 127 -> 15
    let q = r >> 13u;
    let rem = r & 0x1fffu;
    return sign | (q + select(0u, 1u, rem > 0x1000u || (rem == 0x1000u && (q & 1u) == 1u)));
}

// a / b correctly rounded (as the CPU's division is): WGSL allows 2.5 ULP for `/`, and a
// quantizer's 127 / amax one ULP off moves a quant that sits near .5 to the next integer.
// Two corrections by the exact residual fma(-q, b, a) give the rounded quotient.
fn div_cr(a: f32, b: f32) -> f32 {
    var q = a / b;
    let y = 1.0 / b;
    for (var i = 0u; i < 2u; i++) {
        let r = fma(-q, b, a);
        q = fma(r, y, q);
    }
    return q;
}
