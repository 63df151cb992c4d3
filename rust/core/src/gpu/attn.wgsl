// Attention over the device-held KV cache of an offloaded decoder layer (gpu/kv.rs).
//
// The cache of one layer is two buffers of rows [n_stream * size][n_embd_{k,v}_gqa], in
// the host cache's byte layout: F16 (two halves per u32 word, the low one first) or F32.
//
// tab (u32, the `Meta` buffer) holds, per micro-batch: the cells of every sequence's sorted key list
// (KvCache::keys_of, concatenated), then per mask variant the visible key range [lo, hi)
// of each token (causal / sliding window, computed on the host as the CPU path does), then
// each token's first cache row (stream * size).
//
// store: one thread per element (F32) or element pair (F16) of the micro-batch's K or V
// rows, written to the token's cell.
// attn: one workgroup per (head, token); a streaming ("flash") softmax over the visible
// keys in chunks of 64, one key per thread for the scores, each thread then owning output
// dimensions li, li + 64, ... of the value accumulator.

struct P {
    n_tok: u32,
    n_head: u32,
    group: u32,   // query heads per KV head
    hd_k: u32,
    hd_v: u32,
    ek: u32,      // K row length (n_embd_k_gqa)
    ev: u32,      // V row length
    f16k: u32,    // 1: K rows are F16
    f16v: u32,
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

@group(0) @binding(0) var<storage, read> src: array<f32>;
@group(0) @binding(1) var<storage, read> kc: array<u32>;
@group(0) @binding(2) var<storage, read> vc: array<u32>;
@group(0) @binding(3) var<storage, read> tab: array<u32>;
@group(0) @binding(4) var<storage, read_write> dst: array<u32>;
@group(0) @binding(5) var<uniform> p: P;

// store: src = the f32 rows [n_tok, row] (row = ek), dst = the cache; f16k says its type
@compute @workgroup_size(64)
fn store(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let i = (wg.y * p.nx + wg.x) * 64u + li;
    var per = p.ek;
    if (p.f16k == 1u) {
        per = p.ek / 2u;
    }
    if (i >= p.n_tok * per) {
        return;
    }
    let t = i / per;
    let k = i % per;
    let r = tab[p.row_off + t];
    if (p.f16k == 1u) {
        let s = t * p.ek + 2u * k;
        dst[r * per + k] = pack2x16float(vec2<f32>(src[s], src[s + 1u]));
    } else {
        dst[r * per + k] = bitcast<u32>(src[t * p.ek + k]);
    }
}

fn kval(i: u32) -> f32 {
    if (p.f16k == 1u) {
        let v = unpack2x16float(kc[i >> 1u]);
        return select(v.x, v.y, (i & 1u) == 1u);
    }
    return bitcast<f32>(kc[i]);
}

fn vval(i: u32) -> f32 {
    if (p.f16v == 1u) {
        let v = unpack2x16float(vc[i >> 1u]);
        return select(v.x, v.y, (i & 1u) == 1u);
    }
    return bitcast<f32>(vc[i]);
}

const NEG: f32 = -3.0e38;

var<workgroup> qs: array<f32, 256>;
var<workgroup> ps: array<f32, 64>;
var<workgroup> rows: array<u32, 64>;
var<workgroup> red: array<f32, 64>;
var<workgroup> wlo: u32;
var<workgroup> whi: u32;

// attn: src = q [n_tok, qw], dst = out [n_tok, ow] (f32 bits)
@compute @workgroup_size(64)
fn attn(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let h = wg.x;
    let t = wg.y;
    let g = h / p.group;
    if (li == 0u) {
        wlo = tab[p.rng_off + 2u * t];
        whi = tab[p.rng_off + 2u * t + 1u];
    }
    for (var d = li; d < p.hd_k; d += 64u) {
        qs[d] = src[t * p.qw + h * p.hd_k + d];
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
            for (var d = 0u; d < p.hd_k; d += 1u) {
                dot = fma(kval(ko + d), qs[d], dot);
            }
            s = dot * p.kscale;
            if (p.softcap != 0.0) {
                s = p.softcap * tanh(s);
            }
            s = s * p.post;
        }
        red[li] = s;
        workgroupBarrier();
        for (var k = 32u; k > 0u; k >>= 1u) {
            if (li < k) {
                red[li] = max(red[li], red[li + k]);
            }
            workgroupBarrier();
        }
        let mnew = max(m, red[0]);
        workgroupBarrier();
        var pj = 0.0;
        if (j < hi) {
            pj = exp(s - mnew);
        }
        ps[li] = pj;
        red[li] = pj;
        workgroupBarrier();
        for (var k = 32u; k > 0u; k >>= 1u) {
            if (li < k) {
                red[li] += red[li + k];
            }
            workgroupBarrier();
        }
        let corr = exp(m - mnew);
        ssum = ssum * corr + red[0];
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
