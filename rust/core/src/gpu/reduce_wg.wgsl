// Workgroup reductions of the matrix-vector and attention kernels (64 threads), the
// fallback: a tree in workgroup memory (gpu/shaders.rs prepends this or reduce_sg.wgsl).
// Call in uniform control flow: they hold barriers. Every thread gets the result.

struct Lanes {
    @builtin(local_invocation_index) li: u32,
}

var<workgroup> red_t: array<f32, 64>;

fn wg_sum(v: f32, l: Lanes) -> f32 {
    red_t[l.li] = v;
    workgroupBarrier();
    for (var k = 32u; k > 0u; k >>= 1u) {
        if (l.li < k) {
            red_t[l.li] += red_t[l.li + k];
        }
        workgroupBarrier();
    }
    let r = red_t[0];
    workgroupBarrier(); // red_t is free for the next call
    return r;
}

fn wg_max(v: f32, l: Lanes) -> f32 {
    red_t[l.li] = v;
    workgroupBarrier();
    for (var k = 32u; k > 0u; k >>= 1u) {
        if (l.li < k) {
            red_t[l.li] = max(red_t[l.li], red_t[l.li + k]);
        }
        workgroupBarrier();
    }
    let r = red_t[0];
    workgroupBarrier();
    return r;
}
