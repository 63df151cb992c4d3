// Store a micro-batch's K or V rows (f32, [n_tok, ek]) at the tokens' cells of a layer's
// device cache (gpu/kv.rs; f16.wgsl and kv_params.wgsl are prepended; `tk` is the cache's type whether
// it holds K or V), as the host quantizes its copy (ggml-cpu's from_float), so the two
// copies hold the same bytes:
// - F32, F16: one thread per element (pair), whole words; f16 rounded to nearest even
//   (f16_bits: pack2x16float's rounding is left open by WGSL);
// - Q8_0, Q4_0, Q4_1, Q5_0, Q5_1: one thread per block; Q8_0 as ggml's x86
//   quantize_row_q8_0 (127 / amax, round half to even), the others as the _ref
//   quantizers (truncating casts), f16 scales rounded to nearest even. Vulkan lets a
//   division be 2.5 ulp off, so on some devices a rare element may land one step from
//   the host's (equal on lavapipe: kv.rs's test); the next host upload replaces it.
//
// Quantized blocks are 18..34 bytes and need not start on a word, so two threads can share
// a word: each writes its bytes with atomic and/or (the cache is the attention's cache
// buffer, read there as array<u32>).

@group(0) @binding(0) var<storage, read> src: array<f32>;
@group(0) @binding(3) var<storage, read> tab: array<u32>;
@group(0) @binding(4) var<storage, read_write> dst: array<atomic<u32>>;
@group(0) @binding(5) var<uniform> p: P;

// C's (int8_t)(float) (truncation toward zero), as an int
fn trunc_i8(v: f32) -> i32 {
    return (i32(trunc(v)) << 24u) >> 24u;
}

fn store_float(i: u32) {
    var per = p.ek;
    if (p.tk == 1u) {
        per = p.ek / 2u;
    }
    if (i >= p.n_tok * per) {
        return;
    }
    let t = i / per;
    let k = i % per;
    let r = tab[p.row_off + t];
    if (p.tk == 1u) {
        let s = t * p.ek + 2u * k;
        atomicStore(&dst[r * per + k], f16_bits(src[s]) | (f16_bits(src[s + 1u]) << 16u));
    } else {
        atomicStore(&dst[r * per + k], bitcast<u32>(src[t * p.ek + k]));
    }
}

@compute @workgroup_size(64)
fn store(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let i = (wg.y * p.nx + wg.x) * 64u + li;
    if (p.tk <= 1u) {
        store_float(i);
        return;
    }
    let nb = p.ek / 32u; // blocks per row
    if (i >= p.n_tok * nb) {
        return;
    }
    let t = i / nb;
    let blk = i % nb;
    var x: array<f32, 32>;
    var amax = 0.0;
    var smax = 0.0; // the first element of largest |x|, signed
    var mn = 3.4028235e38;
    var mx = -3.4028235e38;
    for (var j = 0u; j < 32u; j++) {
        let v = src[t * p.ek + blk * 32u + j];
        x[j] = v;
        if (amax < abs(v)) {
            amax = abs(v);
            smax = v;
        }
        mn = min(mn, v);
        mx = max(mx, v);
    }
    var by: array<u32, 34>;
    var bs = 34u;
    switch p.tk {
        case 2u: { // Q8_0
            let d = div_cr(amax, 127.0);
            let id = select(0.0, div_cr(127.0, amax), amax != 0.0);
            let h = f16_bits(d);
            by[0] = h & 0xffu;
            by[1] = h >> 8u;
            for (var j = 0u; j < 32u; j++) {
                by[2u + j] = u32(clamp(i32(round(x[j] * id)), -128, 127)) & 0xffu;
            }
        }
        case 3u, 5u: { // Q4_0 / Q5_0: d = max / -8 (-16), q = x / d + 8.5 (16.5)
            let five = p.tk == 5u;
            let off = select(8.0, 16.0, five);
            let top = select(15, 31, five);
            let d = div_cr(smax, -off);
            let id = select(0.0, div_cr(1.0, d), d != 0.0);
            let h = f16_bits(d);
            by[0] = h & 0xffu;
            by[1] = h >> 8u;
            let qs = select(2u, 6u, five);
            var qh = 0u;
            for (var j = 0u; j < 16u; j++) {
                let x0 = u32(min(trunc_i8(x[j] * id + off + 0.5), top));
                let x1 = u32(min(trunc_i8(x[j + 16u] * id + off + 0.5), top));
                by[qs + j] = (x0 & 15u) | ((x1 & 15u) << 4u);
                qh |= ((x0 >> 4u) & 1u) << j;
                qh |= ((x1 >> 4u) & 1u) << (j + 16u);
            }
            if (five) {
                for (var k = 0u; k < 4u; k++) {
                    by[2u + k] = (qh >> (8u * k)) & 0xffu;
                }
                bs = 22u;
            } else {
                bs = 18u;
            }
        }
        default: { // Q4_1 / Q5_1: d = (max - min) / 15 (31), q = (x - min) / d + 0.5
            let five = p.tk == 6u;
            let d = div_cr(mx - mn, select(15.0, 31.0, five));
            let id = select(0.0, div_cr(1.0, d), d != 0.0);
            let hd = f16_bits(d);
            let hm = f16_bits(mn);
            by[0] = hd & 0xffu;
            by[1] = hd >> 8u;
            by[2] = hm & 0xffu;
            by[3] = hm >> 8u;
            let qs = select(4u, 8u, five);
            var qh = 0u;
            for (var j = 0u; j < 16u; j++) {
                // Q4_1 clamps to 15; Q5_1 casts straight to uint8_t (at most 31.5 -> 31)
                var x0 = u32(trunc_i8((x[j] - mn) * id + 0.5));
                var x1 = u32(trunc_i8((x[j + 16u] - mn) * id + 0.5));
                if (!five) {
                    x0 = min(x0, 15u);
                    x1 = min(x1, 15u);
                }
                by[qs + j] = (x0 & 15u) | ((x1 & 15u) << 4u);
                qh |= ((x0 >> 4u) & 1u) << j;
                qh |= ((x1 >> 4u) & 1u) << (j + 16u);
            }
            if (five) {
                for (var k = 0u; k < 4u; k++) {
                    by[4u + k] = (qh >> (8u * k)) & 0xffu;
                }
                bs = 24u;
            } else {
                bs = 20u;
            }
        }
    }
    // the block's bytes o0 .. o0 + bs of the cache, by word
    let o0 = (tab[p.row_off + t] * nb + blk) * bs;
    let o1 = o0 + bs;
    for (var wi = o0 / 4u; wi * 4u < o1; wi++) {
        var val = 0u;
        var mask = 0u;
        for (var k = 0u; k < 4u; k++) {
            let o = wi * 4u + k;
            if (o >= o0 && o < o1) {
                val |= by[o - o0] << (8u * k);
                mask |= 0xffu << (8u * k);
            }
        }
        if (mask == 0xffffffffu) {
            atomicStore(&dst[wi], val);
        } else {
            atomicAnd(&dst[wi], ~mask);
            atomicOr(&dst[wi], val);
        }
    }
}
