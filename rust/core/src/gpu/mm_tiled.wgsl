// y[t, r] = dot(dequantized weight row r0 + r, x[t]) for prompts: the tiled matrix-matrix
// kernel (`deq` for the weight format and `const TN` are prepended by gpu/shaders.rs; the
// bindings, `Params` and the byte readers are matmul.wgsl's).
//
// One workgroup of RM threads per tile of RM rows x TN tokens; thread li owns row
// rb + li. The workgroup stages KC chunks (32 weights each) of its TN tokens' activations
// in workgroup memory; each thread then dequantizes its row's chunk into registers once
// and multiplies it with every token of the tile. Weights are read once per TN tokens and
// the activations once per RM rows (matmul.wgsl with TN = 1 reads both once per row),
// and every thread reads the same staged activation at the same time (a broadcast).

const RM: u32 = 64u;
const KC: u32 = 4u;
const XS: u32 = KC * 32u; // staged activations per token
var<workgroup> xs: array<f32, XS * TN>; // [TN, KC * 32]

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let rb = (wg.x + wg.y * p.nx) * RM;
    if (rb >= p.n_rows) {
        return; // uniform: the whole workgroup is past the last row
    }
    let rr = rb + li;
    let live = rr < p.n_rows;
    let base = (p.r0 + min(rr, p.n_rows - 1u)) * p.row_bytes;
    let t0 = wg.z * TN;
    let nchunk = (p.n_in + 31u) / 32u;
    var acc: array<f32, TN>;
    for (var t = 0u; t < TN; t++) {
        acc[t] = 0.0;
    }
    var v: array<f32, 32>;
    for (var c0 = 0u; c0 < nchunk; c0 += KC) {
        for (var i = li; i < XS * TN; i += RM) {
            let tok = t0 + i / XS;
            let k = c0 * 32u + i % XS;
            var xv = 0.0;
            if (tok < p.n_tok && k < p.n_in) {
                xv = x[tok * p.n_in + k];
            }
            xs[i] = xv;
        }
        workgroupBarrier();
        if (live) {
            for (var c = 0u; c < KC; c++) {
                if (c0 + c < nchunk) {
                    deq(base, c0 + c, &v);
                    for (var t = 0u; t < TN; t++) {
                        let xo = t * XS + c * 32u;
                        var s = 0.0;
                        for (var i = 0u; i < 32u; i++) {
                            s += v[i] * xs[xo + i];
                        }
                        acc[t] += s;
                    }
                }
            }
        }
        workgroupBarrier();
    }
    if (live) {
        for (var t = 0u; t < TN; t++) {
            let tok = t0 + t;
            if (tok < p.n_tok) {
                y[tok * p.n_rows + rr] = acc[t];
            }
        }
    }
}
