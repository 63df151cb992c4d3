// f16 bits -> f32, subnormals included: unpack2x16float may flush them to zero, and small
// values give subnormal block scales (Q4_K's dmin, a KV block of small activations).
fn f16_val(h: u32) -> f32 {
    if ((h & 0x7c00u) == 0u) {
        return select(1.0, -1.0, (h & 0x8000u) != 0u) * f32(h & 0x3ffu) * 5.9604645e-8;
    }
    return unpack2x16float(h).x;
}
