// Attention over the device-held KV cache of an offloaded decoder layer (gpu/kv.rs).
//
// The cache of one layer is two buffers of rows [n_stream * size][n_embd_{k,v}_gqa], in
// the host cache's byte layout: F32, F16 (two halves per u32 word, the low one first), or
// the blocks of Q8_0 / Q4_0 / Q4_1 / Q5_0 / Q5_1 (32 elements each, rows of whole blocks;
// blocks need not start on a word: they are read byte by byte, and kv_store.wgsl writes
// them). f16.wgsl, kv_params.wgsl and a reduction (reduce_wg.wgsl, or reduce_sg.wgsl where
// the device has subgroup operations) are prepended by gpu/kv.rs.
//
// tab (u32, the `Meta` buffer) holds, per micro-batch: the cells of every sequence's sorted key list
// (KvCache::keys_of, concatenated), then per mask variant the visible key range [lo, hi)
// of each token (causal / sliding window, computed on the host as the CPU path does), then
// each token's first cache row (stream * size).
//
// attn: one workgroup per (head, token); a streaming ("flash") softmax over the visible
// keys in chunks of 64, one key per thread for the scores, each thread then owning output
// dimensions li, li + 64, ... of the value accumulator.

@group(0) @binding(0) var<storage, read> src: array<f32>;
@group(0) @binding(1) var<storage, read> kc: array<u32>;
@group(0) @binding(2) var<storage, read> vc: array<u32>;
@group(0) @binding(3) var<storage, read> tab: array<u32>;
@group(0) @binding(4) var<storage, read_write> dst: array<u32>;
@group(0) @binding(5) var<uniform> p: P;

// byte o of the K (v = false) or V (v = true) cache
fn cbyte(v: bool, o: u32) -> u32 {
    var w: u32;
    if (v) {
        w = vc[o >> 2u];
    } else {
        w = kc[o >> 2u];
    }
    return (w >> ((o & 3u) * 8u)) & 0xffu;
}

fn cf16(v: bool, o: u32) -> f32 {
    return f16_val(cbyte(v, o) | (cbyte(v, o + 1u) << 8u));
}

// Block fields of element i of a cache of quantized type ty (2..6), as ggml's
// dequantize_row_* reads them: the element is qraw * qd (+ qm for Q4_1 / Q5_1).
fn qbytes(ty: u32) -> u32 {
    return array<u32, 7>(4u, 2u, 34u, 18u, 20u, 22u, 24u)[ty];
}

fn qd(v: bool, ty: u32, i: u32) -> f32 {
    return cf16(v, (i / 32u) * qbytes(ty));
}

fn qm(v: bool, ty: u32, i: u32) -> f32 {
    if (ty == 4u || ty == 6u) {
        return cf16(v, (i / 32u) * qbytes(ty) + 2u);
    }
    return 0.0;
}

fn qraw(v: bool, ty: u32, i: u32) -> f32 {
    let b = (i / 32u) * qbytes(ty);
    let j = i % 32u;
    let lo = j % 16u; // 4-bit types: byte lo of qs, low nibble for j < 16
    let sh = (j / 16u) * 4u;
    switch ty {
        case 2u: { // Q8_0: f16 d, i8 qs[32]
            return f32(bitcast<i32>(cbyte(v, b + 2u + j) << 24u) >> 24u);
        }
        case 3u: { // Q4_0: f16 d, qs[16]; q - 8
            return f32((cbyte(v, b + 2u + lo) >> sh) & 15u) - 8.0;
        }
        case 4u: { // Q4_1: f16 d, f16 m, qs[16]; q
            return f32((cbyte(v, b + 4u + lo) >> sh) & 15u);
        }
        case 5u: { // Q5_0: f16 d, u8 qh[4] (fifth bit of element j in bit j), qs[16]; q - 16
            let q = ((cbyte(v, b + 6u + lo) >> sh) & 15u) | (((cbyte(v, b + 2u + j / 8u) >> (j % 8u)) & 1u) << 4u);
            return f32(i32(q) - 16);
        }
        default: { // Q5_1: f16 d, f16 m, u8 qh[4], qs[16]; q
            let q = ((cbyte(v, b + 8u + lo) >> sh) & 15u) | (((cbyte(v, b + 4u + j / 8u) >> (j % 8u)) & 1u) << 4u);
            return f32(q);
        }
    }
}

// K / V taken as f16: an F16 cache, or an F32 one under flash attention
fn k16() -> bool {
    return p.tk == 1u || (p.tk == 0u && p.f16cast == 1u);
}

fn v16() -> bool {
    return p.tv == 1u || (p.tv == 0u && p.f16cast == 1u);
}

fn kval(i: u32) -> f32 {
    if (p.tk == 0u) {
        let x = bitcast<f32>(kc[i]);
        return select(x, f16_val(f16_bits(x)), p.f16cast == 1u);
    }
    if (p.tk == 1u) {
        return f16_val((kc[i >> 1u] >> ((i & 1u) * 16u)) & 0xffffu);
    }
    return qraw(false, p.tk, i) * qd(false, p.tk, i) + qm(false, p.tk, i);
}

fn vval(i: u32) -> f32 {
    if (p.tv == 0u) {
        let x = bitcast<f32>(vc[i]);
        return select(x, f16_val(f16_bits(x)), p.f16cast == 1u);
    }
    if (p.tv == 1u) {
        return f16_val((vc[i >> 1u] >> ((i & 1u) * 16u)) & 0xffffu);
    }
    return qraw(true, p.tv, i) * qd(true, p.tv, i) + qm(true, p.tv, i);
}

const NEG: f32 = -3.0e38;

var<workgroup> qs: array<f32, 256>;
var<workgroup> qsd: array<f32, 8>; // quantized K: q's block scales (f16 values)
var<workgroup> qss: array<f32, 8>; // and d * sum of its quants (Q8_1's s), f16 values
var<workgroup> ps: array<f32, 64>;
var<workgroup> pm: array<f32, 64>; // F16 V: the running max after each key of a chunk, then ms
var<workgroup> rows: array<u32, 64>;
var<workgroup> wlo: u32;
var<workgroup> whi: u32;
var<workgroup> wm: f32;

// Quantized K: q (in qs) to K's vec_dot type as ggml-cpu's flash attention does: Q8_0
// (for Q8_0 / Q4_0 / Q5_0 K) or Q8_1 (Q4_1 / Q5_1), the x86 quantizers: d = amax / 127
// (stored f16), quants round(x * 127 / amax) half to even, Q8_1's s = f16(d * sum).
// Thread li < hd_k / 32 does block li; the quants replace q in qs.
fn quantize_q(li: u32) {
    workgroupBarrier();
    if (li < p.hd_k / 32u) {
        let b = li * 32u;
        var amax = 0.0;
        for (var j = 0u; j < 32u; j++) {
            amax = max(amax, abs(qs[b + j]));
        }
        let d = div_cr(amax, 127.0);
        let id = select(0.0, div_cr(127.0, amax), amax != 0.0);
        var sum = 0.0;
        for (var j = 0u; j < 32u; j++) {
            let q = clamp(round(qs[b + j] * id), -128.0, 127.0);
            qs[b + j] = q;
            sum += q;
        }
        qsd[li] = f16_val(f16_bits(d));
        qss[li] = f16_val(f16_bits(d * sum));
    }
}

// attn: src = q [n_tok, qw], dst = out [n_tok, ow] (f32 bits)
@compute @workgroup_size(64)
fn attn(@builtin(workgroup_id) wg: vec3<u32>, lanes: Lanes) {
    let li = lanes.li;
    let h = wg.x;
    let t = wg.y;
    let g = h / p.group;
    if (li == 0u) {
        wlo = tab[p.rng_off + 2u * t];
        whi = tab[p.rng_off + 2u * t + 1u];
    }
    for (var d = li; d < p.hd_k; d += 64u) {
        let x = src[t * p.qw + h * p.hd_k + d];
        // f16 K: q in K's vec_dot type (f16), as the CPU path converts it
        qs[d] = select(x, f16_val(f16_bits(x)), k16());
    }
    if (p.tk >= 2u) {
        quantize_q(li);
    }
    let lo = workgroupUniformLoad(&wlo);
    let hi = workgroupUniformLoad(&whi);
    let srow = tab[p.row_off + t];
    var m = NEG;
    var ssum = 0.0;
    var acc = array<f32, 4>(0.0, 0.0, 0.0, 0.0);
    for (var base = lo; base < hi; base += 64u) {
        let j = base + li;
        var s = NEG;
        if (j < hi) {
            let r = srow + tab[j];
            rows[li] = r;
            let ko = r * p.ek + g * p.hd_k;
            var dot = 0.0;
            if (p.tk >= 2u) {
                // the vec_dot of K's type with q in its vec_dot type: per block, the
                // integer dot times both scales (+ K's min times q's sum for Q4_1 / Q5_1)
                for (var b = 0u; b < p.hd_k; b += 32u) {
                    var isum = 0.0;
                    for (var d = 0u; d < 32u; d += 1u) {
                        isum += qraw(false, p.tk, ko + b + d) * qs[b + d];
                    }
                    dot += isum * (qd(false, p.tk, ko + b) * qsd[b / 32u]) + qm(false, p.tk, ko + b) * qss[b / 32u];
                }
            } else {
                for (var d = 0u; d < p.hd_k; d += 1u) {
                    dot = fma(kval(ko + d), qs[d], dot);
                }
            }
            s = dot * p.kscale;
            if (p.softcap != 0.0) {
                s = p.softcap * tanh(s);
            }
            s = s * p.post;
        }
        if (v16()) {
            // f16 V: the CPU path's (llama.cpp's one_chunk) order, key by key: the running
            // max M_j; a new max scales the f16 accumulator by ms = exp(M_{j-1} - M_j)
            // (f16(acc * ms)); acc = f16(fma(v, vs, acc)) with vs = exp(s_j - M_j);
            // S = fma(S, ms, vs). M_j is a prefix max over the chunk's scores, each key's
            // ms and vs one thread's; every thread then walks the keys for its dimensions.
            pm[li] = s;
            for (var st = 1u; st < 64u; st <<= 1u) {
                workgroupBarrier();
                var v = pm[li];
                if (li >= st) {
                    v = max(v, pm[li - st]);
                }
                workgroupBarrier();
                pm[li] = v;
            }
            workgroupBarrier();
            let mj = max(m, pm[li]);
            var mprev = m;
            if (li > 0u) {
                mprev = max(m, pm[li - 1u]);
            }
            let cnt = min(64u, hi - base);
            if (li == cnt - 1u) {
                wm = mj;
            }
            workgroupBarrier();
            if (s > mprev) {
                pm[li] = exp(mprev - s); // ms (vs = exp(0) = 1)
                ps[li] = 1.0;
            } else {
                pm[li] = -1.0; // no new max: no scaling
                ps[li] = exp(s - mprev);
            }
            let mlast = workgroupUniformLoad(&wm);
            for (var jj = 0u; jj < cnt; jj += 1u) {
                let ms = pm[jj];
                let vs = ps[jj];
                var msum = 1.0;
                if (ms >= 0.0) {
                    msum = ms;
                    for (var k = 0u; k < 4u; k += 1u) {
                        acc[k] = f16_val(f16_bits(acc[k] * ms));
                    }
                }
                let vo = rows[jj] * p.ev + g * p.hd_v;
                for (var k = 0u; k < 4u; k += 1u) {
                    let d = li + 64u * k;
                    if (d < p.hd_v) {
                        acc[k] = f16_val(f16_bits(fma(vval(vo + d), vs, acc[k])));
                    }
                }
                ssum = fma(ssum, msum, vs);
            }
            m = mlast;
            workgroupBarrier();
            continue;
        }
        let mnew = max(m, wg_max(s, lanes));
        var pj = 0.0;
        if (j < hi) {
            pj = exp(s - mnew);
        }
        ps[li] = pj; // and rows[li]: visible to all after wg_sum's barrier
        let corr = exp(m - mnew);
        ssum = ssum * corr + wg_sum(pj, lanes);
        for (var k = 0u; k < 4u; k += 1u) {
            acc[k] *= corr;
        }
        let cnt = min(64u, hi - base);
        for (var jj = 0u; jj < cnt; jj += 1u) {
            let vo = rows[jj] * p.ev + g * p.hd_v;
            let pv = ps[jj];
            for (var k = 0u; k < 4u; k += 1u) {
                let d = li + 64u * k;
                if (d < p.hd_v) {
                    acc[k] = fma(pv, vval(vo + d), acc[k]);
                }
            }
        }
        m = mnew;
        workgroupBarrier();
    }
    var inv = 0.0;
    if (ssum > 0.0) {
        inv = 1.0 / ssum;
    }
    for (var k = 0u; k < 4u; k += 1u) {
        let d = li + 64u * k;
        if (d < p.hd_v) {
            dst[t * p.ow + h * p.hd_v + d] = bitcast<u32>(acc[k] * inv);
        }
    }
}
