// What attn.wgsl and kv_store.wgsl share: the parameter block (gpu/kv.rs `kv_params`
// fills it) and the f32 -> f16 rounding of the host's cache and quantizers.

struct P {
    n_tok: u32,
    n_head: u32,
    group: u32,   // query heads per KV head
    hd_k: u32,
    hd_v: u32,
    ek: u32,      // K row length (n_embd_k_gqa)
    ev: u32,      // V row length
    tk: u32,      // K cache type: 0 F32, 1 F16, 2 Q8_0, 3 Q4_0, 4 Q4_1, 5 Q5_0, 6 Q5_1
    tv: u32,      // V cache type (the same codes)
    rng_off: u32, // meta offset of the tokens' (lo, hi) pairs
    row_off: u32, // meta offset of the tokens' first rows (store: the cell rows)
    qw: u32,      // q row width (n_head * hd_k)
    ow: u32,      // output row width (n_head * hd_v)
    nx: u32,      // store: workgroups along x
    kscale: f32,  // multiplies q.k first
    softcap: f32, // then s = softcap * tanh(s) (0 = none)
    post: f32,    // then s *= post
    pad0: u32,
    pad1: u32,
    pad2: u32,
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
