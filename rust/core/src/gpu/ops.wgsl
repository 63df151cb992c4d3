// The non-matmul operations of an offloaded decoder layer (gpu/resident.rs), each an
// entry point over one read-write buffer `d` (changed in place) and one read-only operand
// `a` (a weight, a bias, a second activation or a rope table; a dummy when unused).
//
// Element-wise entry points: one thread per element, 64 per workgroup, workgroups laid
// out as (x, y) with nx columns (index = (wg.y * nx + wg.x) * 64 + local). rms_norm: one
// workgroup per row.

struct P {
    n: u32,   // elements (rows for rms_norm, rotated pairs for rope)
    w: u32,   // row width (bias width, norm width, head size for rope)
    nx: u32,  // workgroups along x
    a0: u32,  // rms_norm: 1 = multiply by a[i % w]; rope: rotated dimensions
    a1: u32,  // rope: 1 = neox
    a2: u32,  // rope: heads per token row
    f0: f32,  // rms_norm: eps; scale: the factor
    f1: f32,
}

@group(0) @binding(0) var<storage, read_write> d: array<f32>;
@group(0) @binding(1) var<storage, read> a: array<f32>;
@group(0) @binding(2) var<uniform> p: P;

var<workgroup> red: array<f32, 64>;

fn gidx(wg: vec3<u32>, li: u32) -> u32 {
    return (wg.y * p.nx + wg.x) * 64u + li;
}

// d[row] = d[row] / sqrt(mean(d[row]^2) + eps) (* a[i] when a0 == 1), rows of width w
@compute @workgroup_size(64)
fn rms_norm(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let row = wg.y * p.nx + wg.x;
    if (row >= p.n) {
        return; // uniform across the workgroup
    }
    let o = row * p.w;
    var s = 0.0;
    for (var i = li; i < p.w; i += 64u) {
        let v = d[o + i];
        s += v * v;
    }
    red[li] = s;
    workgroupBarrier();
    for (var k = 32u; k > 0u; k >>= 1u) {
        if (li < k) {
            red[li] += red[li + k];
        }
        workgroupBarrier();
    }
    let scale = 1.0 / sqrt(red[0] / f32(p.w) + p.f0);
    for (var i = li; i < p.w; i += 64u) {
        var v = d[o + i] * scale;
        if (p.a0 == 1u) {
            v = v * a[i];
        }
        d[o + i] = v;
    }
}

// d[i] += a[i % w] (a bias per row of width w)
@compute @workgroup_size(64)
fn add_bias(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let i = gidx(wg, li);
    if (i < p.n) {
        d[i] += a[i % p.w];
    }
}

// d[i] += a[i]
@compute @workgroup_size(64)
fn add(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let i = gidx(wg, li);
    if (i < p.n) {
        d[i] += a[i];
    }
}

// d[i] *= f0
@compute @workgroup_size(64)
fn scale(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let i = gidx(wg, li);
    if (i < p.n) {
        d[i] *= p.f0;
    }
}

// d[i] = silu(d[i]) * a[i] (gate in d, up in a)
@compute @workgroup_size(64)
fn swiglu(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let i = gidx(wg, li);
    if (i < p.n) {
        let g = d[i];
        d[i] = g / (1.0 + exp(-g)) * a[i];
    }
}

// d[i] = gelu_tanh(d[i]) * a[i]
@compute @workgroup_size(64)
fn geglu(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let i = gidx(wg, li);
    if (i < p.n) {
        let x = d[i];
        let t = clamp(0.7978845608028654 * x * (1.0 + 0.044715 * x * x), -15.0, 15.0);
        d[i] = 0.5 * x * (1.0 + tanh(t)) * a[i];
    }
}

// Rotary embedding of rows [tokens, a2 heads * w]: one thread per rotated pair; a holds
// per token the cos/sin pairs of RopeParams::fill_cache ([tokens, w]).
@compute @workgroup_size(64)
fn rope(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let i = gidx(wg, li);
    if (i >= p.n) {
        return;
    }
    let half = p.a0 / 2u;
    let pair = i % half;
    let rest = i / half;
    let h = rest % p.a2;
    let t = rest / p.a2;
    let base = (t * p.a2 + h) * p.w;
    let c = a[t * p.w + 2u * pair];
    let s = a[t * p.w + 2u * pair + 1u];
    var i0: u32;
    var i1: u32;
    if (p.a1 == 1u) {
        i0 = base + pair;
        i1 = base + pair + half;
    } else {
        i0 = base + 2u * pair;
        i1 = i0 + 1u;
    }
    let x0 = d[i0];
    let x1 = d[i1];
    d[i0] = fma(x0, c, -(x1 * s));
    d[i1] = fma(x0, s, x1 * c);
}

// d times the orthonormal Walsh-Hadamard matrix of size w (a power of two), chunk by chunk
// of w values: one thread per chunk (n chunks), in kv_cache::fwht's float order (each
// value times 1/sqrt(w) (f0), then the butterflies (u + v, u - v) for len = 1, 2, 4, ...),
// so the result is the CPU's bit for bit. llama.cpp's rotation of q/K/V for quantized caches.
@compute @workgroup_size(64)
fn fwht(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let c = gidx(wg, li);
    if (c >= p.n) {
        return;
    }
    let o = c * p.w;
    for (var i = 0u; i < p.w; i++) {
        d[o + i] *= p.f0;
    }
    for (var len = 1u; len < p.w; len <<= 1u) {
        for (var i = 0u; i < p.w; i += 2u * len) {
            for (var j = i; j < i + len; j++) {
                let u = d[o + j];
                let v = d[o + j + len];
                d[o + j] = u + v;
                d[o + j + len] = u - v;
            }
        }
    }
}
