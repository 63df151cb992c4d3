// y[t, r] = dot(dequantized weight row r0 + r, x[t]) for one weight format (the `deq`
// function, `const TN`, mm_common.wgsl and a reduction (reduce_wg.wgsl or reduce_sg.wgsl)
// are prepended by gpu/shaders.rs): the matrix-vector kernel (token generation, TN = 1;
// mm_tiled.wgsl is the prompts' one).
//
// One workgroup of WG threads per (output row, tile of TN tokens): each thread walks the
// row in chunks of 32 weights, dequantizes a chunk into registers once and uses it for
// every token of the tile; the partial sums are reduced with subgroup operations where
// the device has them, else in workgroup memory (`wg_sum`).

const WG: u32 = 64u;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, lanes: Lanes) {
    let li = lanes.li;
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
        let r = wg_sum(acc[t], lanes);
        let tok = t0 + t;
        if (li == 0u && tok < p.n_tok) {
            y[tok * p.n_rows + rr] = r;
        }
    }
}
