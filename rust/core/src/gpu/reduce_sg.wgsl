// Workgroup reductions of the matrix-vector and attention kernels (64 threads) with
// subgroup operations (wgpu's Features::SUBGROUP; gpu/shaders.rs prepends this instead of
// reduce_wg.wgsl where the device was opened with it): each subgroup reduces in registers,
// its first lane leaves the result in workgroup memory, and every thread combines those
// (64 / subgroup size of them, in subgroup order). Call in uniform control flow: they hold
// barriers. Every thread gets the result.

struct Lanes {
    @builtin(local_invocation_index) li: u32,
    @builtin(subgroup_id) sg: u32,
    @builtin(subgroup_invocation_id) lane: u32,
    @builtin(num_subgroups) n_sg: u32,
}

var<workgroup> red_t: array<f32, 64>;

fn wg_sum(v: f32, l: Lanes) -> f32 {
    let s = subgroupAdd(v);
    if (l.lane == 0u) {
        red_t[l.sg] = s;
    }
    workgroupBarrier();
    var r = red_t[0];
    for (var i = 1u; i < l.n_sg; i++) {
        r += red_t[i];
    }
    workgroupBarrier(); // red_t is free for the next call
    return r;
}

fn wg_max(v: f32, l: Lanes) -> f32 {
    let s = subgroupMax(v);
    if (l.lane == 0u) {
        red_t[l.sg] = s;
    }
    workgroupBarrier();
    var r = red_t[0];
    for (var i = 1u; i < l.n_sg; i++) {
        r = max(r, red_t[i]);
    }
    workgroupBarrier();
    return r;
}
