// y[t, r] = dot(dequantized weight row r0 + r, x[t]) for one weight format (the `deq`
// function prepended by gpu/shaders.rs) and TN tokens per workgroup (prepended `const TN`).
//
// One workgroup of WG threads per (output row, tile of TN tokens): each thread walks the
// row in chunks of 32 weights, dequantizes a chunk into registers once and uses it for
// every token of the tile; the partial sums are reduced in workgroup memory. TN = 1 is the
// matrix-vector kernel (token generation), TN = 8 the matrix-matrix one (prompts).
//
// The weights are the GGUF bytes as uploaded (array<u32>, little endian); `byte_at` and
// friends read the packed block fields wherever they fall.

struct Params {
    n_in: u32,      // row length in weights
    n_rows: u32,    // rows computed (the range r0 .. r0 + n_rows)
    r0: u32,        // first row
    n_tok: u32,     // tokens in x
    row_bytes: u32, // bytes of one weight row
    nx: u32,        // workgroups along x (rows = wg.x + wg.y * nx)
    _p0: u32,
    _p1: u32,
}

@group(0) @binding(0) var<storage, read> w: array<u32>;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;

const WG: u32 = 64u;
var<workgroup> red: array<f32, 512>; // WG * TN, TN <= 8

fn byte_at(o: u32) -> u32 {
    return (w[o >> 2u] >> ((o & 3u) * 8u)) & 0xffu;
}
fn u16_at(o: u32) -> u32 {
    return byte_at(o) | (byte_at(o + 1u) << 8u);
}
fn f16_at(o: u32) -> f32 {
    return unpack2x16float(u16_at(o)).x;
}
fn i8_at(o: u32) -> f32 {
    return f32(bitcast<i32>(byte_at(o) << 24u) >> 24u);
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let rr = wg.x + wg.y * p.nx;
    if (rr >= p.n_rows) {
        return; // uniform: every thread of the workgroup has the same rr
    }
    let base = (p.r0 + rr) * p.row_bytes;
    let t0 = wg.z * TN;
    let nchunk = (p.n_in + 31u) / 32u;
    var acc: array<f32, TN>;
    for (var t = 0u; t < TN; t++) {
        acc[t] = 0.0;
    }
    var v: array<f32, 32>;
    for (var j = li; j < nchunk; j += WG) {
        deq(base, j, &v);
        let lim = min(32u, p.n_in - j * 32u);
        for (var t = 0u; t < TN; t++) {
            let tok = t0 + t;
            if (tok < p.n_tok) {
                let xo = tok * p.n_in + j * 32u;
                var s = 0.0;
                for (var i = 0u; i < lim; i++) {
                    s += v[i] * x[xo + i];
                }
                acc[t] += s;
            }
        }
    }
    for (var t = 0u; t < TN; t++) {
        red[t * WG + li] = acc[t];
    }
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (li < s) {
            for (var t = 0u; t < TN; t++) {
                red[t * WG + li] += red[t * WG + li + s];
            }
        }
        workgroupBarrier();
    }
    if (li < TN) {
        let tok = t0 + li;
        if (tok < p.n_tok) {
            y[tok * p.n_rows + rr] = red[li * WG];
        }
    }
}
