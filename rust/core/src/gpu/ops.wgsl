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
        // ggml's CPU GELU (act.rs gelu_lut): 0 at or below -10, x at or above 10, else the
        // f16 table: gelu of the f16-rounded input, rounded to f16
        let x = d[i];
        var g = x;
        if (x <= -10.0) {
            g = 0.0;
        } else if (x < 10.0) {
            let h = f16_val(f16_bits(x));
            let t = clamp(0.7978845608028654 * h * fma(0.044715 * h, h, 1.0), -15.0, 15.0);
            g = f16_val(f16_bits(0.5 * h * (1.0 + tanh(t))));
        }
        d[i] = g * a[i];
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

// d = a rounded to the activation format the CPU path multiplies a weight type with (its
// vec_dot_type, `quant::vec_dot_type`), then widened back to f32: the matmul then sees the
// values the CPU's integer / f16 dot products see, so offloaded layers give the CPU path's
// numbers up to summation order (not f32 activations' slightly different ones).
// a0 = 1: f16 (round to nearest even), n elements; 2: bf16 (ggml's rounding), n elements;
// 3: Q8_0 / Q8_1 as llama.cpp's x86 quantizer (d = f16(amax / 127), quants
// round_even(x * 127 / amax) clamped to i8), n blocks of 32;
// 4: Q8_K (iscale = -127 / the signed value of largest magnitude, quants
// min(round_even(iscale * x), 127), d = 1 / iscale in f32), n blocks of 256.
@compute @workgroup_size(64)
fn round_act(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let i = gidx(wg, li);
    if (i >= p.n) {
        return;
    }
    if (p.a0 == 1u) {
        d[i] = f16_val(f16_bits(a[i]));
    } else if (p.a0 == 2u) {
        let u = bitcast<u32>(a[i]);
        var h: u32;
        if ((u & 0x7fffffffu) > 0x7f800000u) {
            h = (u >> 16u) | 64u;
        } else {
            h = (u + (0x7fffu + ((u >> 16u) & 1u))) >> 16u;
        }
        d[i] = bitcast<f32>(h << 16u);
    } else if (p.a0 == 3u) {
        let o = i * 32u;
        var amax = 0.0;
        for (var j = 0u; j < 32u; j++) {
            amax = max(amax, abs(a[o + j]));
        }
        let ds = f16_val(f16_bits(div_cr(amax, 127.0)));
        let id = select(0.0, div_cr(127.0, amax), amax != 0.0);
        for (var j = 0u; j < 32u; j++) {
            d[o + j] = clamp(round(a[o + j] * id), -128.0, 127.0) * ds;
        }
    } else {
        let o = i * 256u;
        var amax = 0.0;
        var mx = 0.0;
        for (var j = 0u; j < 256u; j++) {
            let v = a[o + j];
            if (abs(v) > amax) {
                amax = abs(v);
                mx = v;
            }
        }
        if (amax == 0.0) {
            for (var j = 0u; j < 256u; j++) {
                d[o + j] = 0.0;
            }
            return;
        }
        let iscale = div_cr(-127.0, mx);
        let ds = div_cr(1.0, iscale);
        for (var j = 0u; j < 256u; j++) {
            d[o + j] = min(round(iscale * a[o + j]), 127.0) * ds;
        }
    }
}
