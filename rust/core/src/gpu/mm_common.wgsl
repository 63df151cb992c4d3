// What every matmul kernel shares (prepended by gpu/shaders.rs before the kernel):
// the bindings, the parameter block and readers of the packed GGUF block fields
// (f16.wgsl is prepended too).
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

fn byte_at(o: u32) -> u32 {
    return (w[o >> 2u] >> ((o & 3u) * 8u)) & 0xffu;
}
fn u16_at(o: u32) -> u32 {
    return byte_at(o) | (byte_at(o + 1u) << 8u);
}
fn f16_at(o: u32) -> f32 {
    return f16_val(u16_at(o));
}
fn i8_at(o: u32) -> f32 {
    return f32(bitcast<i32>(byte_at(o) << 24u) >> 24u);
}
