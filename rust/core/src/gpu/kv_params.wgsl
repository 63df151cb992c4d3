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
    f16cast: u32, // 1: flash attention, which reads an F32 cache as f16 (llama.cpp's cast)
    pad1: u32,
    pad2: u32,
}

