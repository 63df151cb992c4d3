//! Kernel tests: SIMD == scalar reference (exactly for the activation quantizers, within
//! float-summation error for vec_dot), the NC-column kernels == the single-column ones bit
//! for bit, and quantize -> dequantize errors within ggml's budgets.

use super::*;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn byte(&mut self) -> u8 {
        (self.next() >> 24) as u8
    }
    /// Roughly normal, N(0, 1).
    fn normal(&mut self) -> f32 {
        let mut s = 0.0;
        for _ in 0..4 {
            s += (self.next() >> 40) as f32 / (1u64 << 24) as f32;
        }
        (s - 2.0) * 1.73
    }
}

/// The table of `set` built with these builds and no options (tests compare builds).
fn built(set: KernelSet, vnni: bool, dotprod: bool) -> table::KernelTable {
    table::build(set, table::Options { vnni, dotprod, llamacpp_order: false, no_cols: false, no_rows: false, no_rb: false })
}

/// (single-column, TILE-column) kernels of `ty` in `set`'s table (`b`: the VNNI builds on
/// x86, the dotprod builds on aarch64).
fn dot_pair(set: KernelSet, b: bool, ty: GgmlType) -> Option<(DotN, DotN)> {
    built(set, b, b).get(ty).tiled.map(|t| (t.one(), t.cols[TILE].expect("every tile is at least TILE wide")))
}

/// llama.cpp's vec_dot-order kernels of `ty` (what `PYLLAMA_ORDER=llamacpp` runs below
/// `SMALL_BATCH` rows), where they differ from the default ones: the grid types.
#[cfg(target_arch = "x86_64")]
fn vec_dot_order_pair(ty: GgmlType) -> Option<(DotN, DotN)> {
    let opt = table::Options { vnni: false, dotprod: false, llamacpp_order: true, no_cols: false, no_rows: false, no_rb: false };
    let t = table::build(KernelSet::Avx2, opt);
    let e = t.get(ty);
    let (small, large) = (e.tiled_small?, e.tiled?);
    (small.one() as usize != large.one() as usize).then(|| (small.one(), small.many()))
}

/// Byte offsets of the f16 scale fields in a block (made finite in random data).
fn f16_fields(ty: GgmlType) -> &'static [usize] {
    use GgmlType::*;
    match ty {
        Q4_0 | Q5_0 | Q8_0 | IQ4_NL | Q4_K | Q5_K | IQ4_XS => &[0, 2][..if matches!(ty, Q4_K | Q5_K) { 2 } else { 1 }],
        Q4_1 | Q5_1 => &[0, 2],
        Q2_K => &[80, 82],
        Q3_K => &[108],
        Q6_K => &[208],
        IQ2_XXS | IQ2_XS | IQ2_S | IQ3_XXS | IQ3_S | IQ1_S | Q1_0 | Q2_0 => &[0],
        TQ1_0 => &[52],
        TQ2_0 => &[64],
        _ => &[],
    }
}

/// The kernel sets this CPU runs: the scalar one, then its SIMD sets.
fn cpu_sets() -> Vec<KernelSet> {
    let mut sets = vec![KernelSet::Ref];
    if avx2_available() {
        sets.push(KernelSet::Avx2);
    }
    if avx512_available() {
        sets.push(KernelSet::Avx512);
    }
    if crate::quant::avx512bw_available() {
        sets.push(KernelSet::Avx512Bw);
    }
    if neon_available() {
        sets.push(KernelSet::Neon);
    }
    sets
}

fn random_row(ty: GgmlType, n: usize, rng: &mut Rng) -> Vec<u8> {
    use GgmlType::*;
    let mut x = vec![0f32; n];
    for v in x.iter_mut() {
        *v = rng.normal();
    }
    match ty {
        F32 | F16 | BF16 => {
            let mut b = vec![0u8; ty.row_size(n).unwrap()];
            quantize_row(ty, &x, &mut b).unwrap();
            b
        }
        _ => {
            let ts = ty.type_size();
            let mut b: Vec<u8> = (0..ty.row_size(n).unwrap()).map(|_| rng.byte()).collect();
            for blk in b.chunks_exact_mut(ts) {
                for &o in f16_fields(ty) {
                    let v = fp::f32_to_f16(rng.normal() * 0.05);
                    blk[o..o + 2].copy_from_slice(&v.to_le_bytes());
                }
                match ty {
                    // IQ1_M: the f16 scale is the top nibbles of the 4 scale words
                    IQ1_M => {
                        let v = fp::f32_to_f16(rng.normal() * 0.05);
                        for k in 0..4 {
                            let o = 48 + 2 * k;
                            let w = (u16::from_le_bytes([blk[o], blk[o + 1]]) & 0x0FFF) | (((v >> (4 * k)) & 0xF) << 12);
                            blk[o..o + 2].copy_from_slice(&w.to_le_bytes());
                        }
                    }
                    // MXFP4: an E8M0 exponent near 1 (2^-8 .. 2^1)
                    MXFP4 => blk[0] = 119 + (rng.byte() % 10),
                    _ => {}
                }
            }
            b
        }
    }
}

const WEIGHT_TYPES: [GgmlType; 15] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::IQ4_NL,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::IQ4_XS,
];

fn activations(ty: GgmlType, x: &[f32], set: KernelSet) -> Vec<u8> {
    let vdt = vec_dot_type(ty);
    let mut b = vec![0u8; vdt.row_size(x.len()).unwrap()];
    quantize_act_fn(vdt, set).unwrap()(x, &mut b);
    b
}

/// sum |w_i * x_i| in f64 from the dequantized rows: the scale of the rounding error.
fn mass(ty: GgmlType, w: &[u8], xq: &[u8], n: usize) -> f64 {
    let mut wf = vec![0f32; n];
    let mut xf = vec![0f32; n];
    dequantize_row(ty, w, &mut wf).unwrap();
    dequantize_row(vec_dot_type(ty), xq, &mut xf).unwrap();
    wf.iter().zip(&xf).map(|(a, b)| (*a as f64 * *b as f64).abs()).sum()
}

#[test]
fn simd_vec_dot_matches_ref_on_random_blocks_and_odd_lengths() {
    if !avx2_available() {
        eprintln!("no AVX2 on this CPU: nothing to compare");
        return;
    }
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    for ty in WEIGHT_TYPES {
        let bs = if ty.block_size() == 1 { 32 } else { ty.block_size() };
        for nblocks in [1usize, 2, 3, 5, 7, 9] {
            for extra in [0usize, 3, 17] {
                // float rows also get lengths that are not multiples of 16 (the scalar tail)
                if extra != 0 && ty.block_size() != 1 {
                    continue;
                }
                let n = bs * nblocks + extra;
                for _ in 0..8 {
                    let w = random_row(ty, n, &mut rng);
                    let x: Vec<f32> = (0..n).map(|_| rng.normal()).collect();
                    let xq = activations(ty, &x, KernelSet::Ref);
                    let r = vec_dot_fn_ref(ty).unwrap()(n, &w, &xq);
                    let s = vec_dot_fn(ty, KernelSet::Avx2).unwrap()(n, &w, &xq);
                    let m = mass(ty, &w, &xq, n);
                    let tol = (n / ty.block_size() + 16) as f64 * f32::EPSILON as f64 * m + 1e-30;
                    assert!(
                        ((r - s) as f64).abs() <= tol,
                        "{ty} n={n}: ref {r} simd {s} diff {} tol {tol}",
                        (r - s).abs()
                    );
                }
            }
        }
    }
}

#[test]
fn tiled_kernels_equal_single_column_kernels_bit_for_bit() {
    #[cfg(target_arch = "x86_64")]
    {
        if !avx2_available() {
            return;
        }
        let mut rng = Rng(42);
        for ty in WEIGHT_TYPES {
            let (one, many) = dot_pair(KernelSet::Avx2, avx2::vnni_available(), ty).unwrap();
            let bs = if ty.block_size() == 1 { 32 } else { ty.block_size() };
            let n = bs * 3;
            let w = random_row(ty, n, &mut rng);
            let xs: Vec<u8> = (0..avx2::TILE)
                .flat_map(|_| {
                    let x: Vec<f32> = (0..n).map(|_| rng.normal()).collect();
                    activations(ty, &x, KernelSet::Avx2)
                })
                .collect();
            let stride = xs.len() / avx2::TILE;
            let mut tiled = [0f32; avx2::TILE];
            unsafe { many(n, w.as_ptr(), xs.as_ptr(), stride, std::ptr::null(), 0, tiled.as_mut_ptr()) };
            for (c, t) in tiled.iter().enumerate() {
                let mut single = 0f32;
                unsafe { one(n, w.as_ptr(), xs.as_ptr().add(c * stride), 0, std::ptr::null(), 0, &mut single) };
                assert_eq!(t.to_bits(), single.to_bits(), "{ty} column {c}");
            }
        }
    }
}

#[test]
fn simd_activation_quantizers_equal_scalar_bytes() {
    if !avx2_available() {
        return;
    }
    let mut rng = Rng(7);
    for ty in [GgmlType::Q8_0, GgmlType::Q8_1, GgmlType::Q8_K, GgmlType::F16] {
        for round in 0..200 {
            let n = 512;
            let scale = (2f32).powi((round % 40) - 20);
            let mut x: Vec<f32> = (0..n).map(|_| rng.normal() * scale).collect();
            if round % 7 == 0 {
                x[..256].fill(0.0); // zero blocks
            }
            if round % 5 == 0 {
                // exact ties after scaling: x = k + 0.5 with amax 127
                for (i, v) in x.iter_mut().enumerate() {
                    *v = ((i % 255) as f32 - 127.0) + if i % 3 == 0 { 0.5 } else { 0.0 };
                }
            }
            if round % 13 == 0 {
                // 127/amax overflows to inf: the quants are llama.cpp's garbage, but the same
                x[32..64].fill(1.1754944e-38);
                x[64] = f32::MIN_POSITIVE / 4.0;
            }
            if round % 11 == 0 {
                x[3] = -x.iter().fold(0f32, |a, v| a.max(v.abs())); // negative first maximum
                x[300] = -x[3];
            }
            if round % 17 == 0 {
                // the maximum twice in one block, signs differing: the first one's sign counts
                let m = 2.0 * x.iter().fold(0f32, |a, v| a.max(v.abs()));
                x[37 + round as usize % 50] = -m;
                x[200] = m;
            }
            let mut a = vec![0u8; ty.row_size(n).unwrap()];
            let mut b = a.clone();
            quantize_act_fn(ty, KernelSet::Ref).unwrap()(&x, &mut a);
            quantize_act_fn(ty, KernelSet::Avx2).unwrap()(&x, &mut b);
            assert_eq!(a, b, "{ty} round {round}");
        }
    }
}

#[test]
fn quantize_dequantize_error_within_ggml_budgets() {
    // tests/test-quantize-fns.cpp: data 0.1 + 2 cos(i + offset), error = sqrt(sum d^2) / n
    // must stay under MAX_QUANTIZATION_TOTAL_ERROR = 0.002 (the 2/3-bit budgets are larger,
    // but those formats have no quantizer here).
    let n = 4096;
    let x: Vec<f32> = (0..n).map(|i| 0.1 + 2.0 * (i as f32).cos()).collect();
    for ty in [
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q8_1,
        GgmlType::Q8_K,
        GgmlType::IQ4_NL,
        GgmlType::F16,
        GgmlType::BF16,
    ] {
        let mut q = vec![0u8; ty.row_size(n).unwrap()];
        quantize_row(ty, &x, &mut q).unwrap();
        let mut y = vec![0f32; n];
        dequantize_row(ty, &q, &mut y).unwrap();
        let err = (x.iter().zip(&y).map(|(a, b)| ((a - b) as f64).powi(2)).sum::<f64>()).sqrt() / n as f64;
        assert!(err < 0.002, "{ty}: {err}");
    }
}

#[test]
fn vec_dot_matches_dequantized_dot_product() {
    // vec_dot(ref) against the f64 dot product of the dequantized rows: the kernels decode
    // the blocks exactly as the dequantizers do.
    let mut rng = Rng(99);
    for ty in WEIGHT_TYPES {
        let bs = if ty.block_size() == 1 { 32 } else { ty.block_size() };
        let n = bs * 4;
        let w = random_row(ty, n, &mut rng);
        let x: Vec<f32> = (0..n).map(|_| rng.normal()).collect();
        let xq = activations(ty, &x, KernelSet::Ref);
        let mut wf = vec![0f32; n];
        let mut xf = vec![0f32; n];
        dequantize_row(ty, &w, &mut wf).unwrap();
        dequantize_row(vec_dot_type(ty), &xq, &mut xf).unwrap();
        let exact: f64 = wf.iter().zip(&xf).map(|(a, b)| *a as f64 * *b as f64).sum();
        let got = vec_dot_fn_ref(ty).unwrap()(n, &w, &xq) as f64;
        let m = mass(ty, &w, &xq, n);
        // Q4_1/Q5_1 use the f16-rounded block sum s of the activations: 2^-11 relative.
        let rel = if matches!(ty, GgmlType::Q4_1 | GgmlType::Q5_1) { 1e-3 } else { 1e-5 };
        assert!((got - exact).abs() <= rel * m + 1e-30, "{ty}: {got} vs {exact} (mass {m})");
    }
}

#[test]
fn unsupported_types_are_named() {
    let e = quantize_row(GgmlType::Q4_K, &[0f32; 256], &mut [0u8; 144]).unwrap_err();
    assert!(e.to_string().contains("Q4_K"), "{e}");
    assert!(vec_dot_fn(GgmlType::I32, kernel_set()).is_none());
    assert!(!GgmlType::I32.is_supported() && !GgmlType::F64.is_supported());
}

#[test]
fn simd_float_dequantize_is_exact() {
    #[cfg(target_arch = "x86_64")]
    {
        if !avx2_available() {
            return;
        }
        let all: Vec<u8> = (0..=u16::MAX).flat_map(|h| h.to_le_bytes()).chain([1u8, 2, 3, 4, 5, 6]).collect();
        let n = all.len() / 2;
        for (ty, simd, scalar) in [
            (GgmlType::F16, avx2::dequantize_f16 as fn(&[u8], &mut [f32]), float::dequantize_f16 as fn(&[u8], &mut [f32])),
            (GgmlType::BF16, avx2::dequantize_bf16, float::dequantize_bf16),
        ] {
            let mut a = vec![0f32; n];
            let mut b = vec![0f32; n];
            simd(&all, &mut a);
            scalar(&all, &mut b);
            for i in 0..n {
                assert_eq!(a[i].to_bits(), b[i].to_bits(), "{ty} element {i}");
            }
        }
    }
}

#[test]
fn matmul_elements_equal_single_vec_dot_bit_for_bit() {
    // The matmul (4-token tiles, precomputed activation scales, 2 threads) must give each
    // element exactly what one vec_dot call gives (F32 weights in the SIMD sets: what
    // the tile matmul's scalar twin gives): the determinism the forward pass needs.
    use crate::model::TensorView;
    use crate::ops::matmul::matmul_with;
    use crate::threadpool::ThreadPool;
    let pool = ThreadPool::new(2);
    let mut rng = Rng(1234);
    let sets = cpu_sets();
    for set in sets {
        for (ty, n_tok) in WEIGHT_TYPES.iter().flat_map(|&t| [(t, 10), (t, 1)]) {
            let bs = if ty.block_size() == 1 { 32 } else { ty.block_size() };
            let (n_in, n_out) = (bs * 3, 7);
            let w: Vec<u8> = (0..n_out).flat_map(|_| random_row(ty, n_in, &mut rng)).collect();
            let x: Vec<f32> = (0..n_in * n_tok).map(|_| rng.normal()).collect();
            let tv = TensorView { name: "w", ty, ne: [n_in, n_out, 1, 1], data: &w, layout: crate::model::Layout::Plain };
            let mut out = vec![0f32; n_out * n_tok];
            let mut scratch = Vec::new();
            matmul_with(&pool, set, &tv, &x, n_tok, &mut out, n_out, 0..n_out, &mut scratch).unwrap();
            let dot = vec_dot_fn(ty, set).unwrap();
            let wrow = ty.row_size(n_in).unwrap();
            for t in 0..n_tok {
                let xq = activations(ty, &x[t * n_in..(t + 1) * n_in], set);
                for r in 0..n_out {
                    let wr = &w[r * wrow..(r + 1) * wrow];
                    let v = if crate::ops::sgemm::applies(set, ty, n_in) {
                        // F32 weights: the tile matmul's order (ops/sgemm.rs), one
                        // element at a time in its scalar twin
                        let (mut wf, mut xf) = (vec![0f32; n_in], vec![0f32; n_in]);
                        dequantize_row(ty, wr, &mut wf).unwrap();
                        dequantize_row(vec_dot_type(ty), &xq, &mut xf).unwrap();
                        crate::ops::sgemm::dot_scalar(n_in, &wf, &xf)
                    } else {
                        dot(n_in, wr, &xq)
                    };
                    assert_eq!(v.to_bits(), out[t * n_out + r].to_bits(), "{ty} {set:?} t={t} r={r}");
                }
            }
        }
    }
}

#[test]
fn vnni_kernels_equal_plain_avx2_bit_for_bit() {
    #[cfg(target_arch = "x86_64")]
    {
        if !avx2_available() || !cpu::features().avxvnni {
            eprintln!("no AVX-VNNI on this CPU: nothing to compare");
            return;
        }
        let mut rng = Rng(77);
        for ty in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0, GgmlType::IQ4_NL] {
            let (p1, p4) = dot_pair(KernelSet::Avx2, false, ty).unwrap();
            let (v1, v4) = dot_pair(KernelSet::Avx2, true, ty).unwrap();
            for nblocks in [1usize, 3, 8] {
                let n = 32 * nblocks;
                for _ in 0..20 {
                    let w = random_row(ty, n, &mut rng); // random bytes: includes -128 quants
                    let xs: Vec<u8> = (0..avx2::TILE)
                        .flat_map(|_| {
                            let x: Vec<f32> = (0..n).map(|_| rng.normal()).collect();
                            activations(ty, &x, KernelSet::Avx2)
                        })
                        .collect();
                    let stride = xs.len() / avx2::TILE;
                    let (mut a, mut b) = ([0f32; avx2::TILE], [0f32; avx2::TILE]);
                    let (mut c, mut d) = (0f32, 0f32);
                    unsafe {
                        p4(n, w.as_ptr(), xs.as_ptr(), stride, std::ptr::null(), 0, a.as_mut_ptr());
                        v4(n, w.as_ptr(), xs.as_ptr(), stride, std::ptr::null(), 0, b.as_mut_ptr());
                        p1(n, w.as_ptr(), xs.as_ptr(), 0, std::ptr::null(), 0, &mut c);
                        v1(n, w.as_ptr(), xs.as_ptr(), 0, std::ptr::null(), 0, &mut d);
                    }
                    assert_eq!(a.map(f32::to_bits), b.map(f32::to_bits), "{ty} n={n}");
                    assert_eq!(c.to_bits(), d.to_bits(), "{ty} n={n}");
                    assert_eq!(c.to_bits(), a[0].to_bits(), "{ty} n={n}");
                }
            }
        }
    }
}

#[test]
fn q4_k_and_q6_k_simd_equal_ref_bit_for_bit() {
    // Both follow llama.cpp's batch-matmul order (Q4_K: repacked gemm, per 64 elements;
    // Q6_K: tiled, per super-block), so the scalar and AVX2 kernels agree exactly.
    #[cfg(target_arch = "x86_64")]
    {
        if !avx2_available() {
            return;
        }
        let mut rng = Rng(7);
        for ty in [GgmlType::Q4_K, GgmlType::Q6_K] {
            for nb in [1usize, 2, 5, 11] {
                let n = 256 * nb;
                let w = random_row(ty, n, &mut rng);
                let x: Vec<f32> = (0..n).map(|_| rng.normal() * 3.0).collect();
                let xq = activations(ty, &x, KernelSet::Ref);
                let r = vec_dot_fn_ref(ty).unwrap()(n, &w, &xq);
                let s = vec_dot_fn(ty, KernelSet::Avx2).unwrap()(n, &w, &xq);
                assert_eq!(r.to_bits(), s.to_bits(), "{ty} n={n}: ref {r} simd {s}");
            }
        }
    }
}

/// The f32 activation block scales the matmul precomputes (`DotN`'s `xd`): Q8_0 d per
/// block, Q8_1 (d, s) per block; empty for other activation types.
#[cfg(target_arch = "x86_64")]
fn act_scales(vdt: GgmlType, row: &[u8]) -> Vec<f32> {
    let h = |o: usize| fp::f16_to_f32(u16::from_le_bytes([row[o], row[o + 1]]));
    match vdt {
        GgmlType::Q8_0 => row.chunks_exact(34).enumerate().map(|(k, _)| h(34 * k)).collect(),
        GgmlType::Q8_1 => row.chunks_exact(36).enumerate().flat_map(|(k, _)| [h(36 * k), h(36 * k + 2)]).collect(),
        _ => Vec::new(),
    }
}

const AVX512_TYPES: [GgmlType; 8] =
    [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0, GgmlType::IQ4_NL, GgmlType::Q6_K, GgmlType::Q4_K];

#[test]
fn avx512_kernels_equal_avx2_bit_for_bit() {
    // The AVX-512 kernels promise the AVX2 kernels' exact f32 results (logits must not depend
    // on the CPU): 1 and TILE columns, with and without precomputed activation scales, odd
    // block counts (the 2-blocks-per-zmm loop's tail), random bytes (Q8_0 weights of -128).
    #[cfg(target_arch = "x86_64")]
    {
        if !avx512_available() {
            eprintln!("no AVX-512 (F/BW/VL/VNNI) on this CPU: nothing to compare");
            return;
        }
        let mut rng = Rng(0xA5A5_0512);
        for ty in AVX512_TYPES {
            let Some((b1, b4)) = dot_pair(KernelSet::Avx512, false, ty).filter(|k| Some(k.0 as usize) != dot_pair(KernelSet::Avx2, false, ty).map(|a| a.0 as usize)) else { continue };
            let (a1, a4) = dot_pair(KernelSet::Avx2, false, ty).unwrap();
            let vdt = vec_dot_type(ty);
            for nblocks in [1usize, 2, 3, 4, 5, 7, 8, 9, 16, 33] {
                if ty.block_size() == 256 && nblocks > 9 {
                    continue;
                }
                let n = ty.block_size() * nblocks;
                for round in 0..12 {
                    let w = random_row(ty, n, &mut rng);
                    let xs: Vec<u8> = (0..avx2::TILE)
                        .flat_map(|c| {
                            let scale = if round % 3 == 0 { 1e3 } else { 1.0 };
                            let x: Vec<f32> = (0..n).map(|k| if (k + c) % 97 == 0 { 0.0 } else { rng.normal() * scale }).collect();
                            activations(ty, &x, KernelSet::Avx2)
                        })
                        .collect();
                    let stride = xs.len() / avx2::TILE;
                    let sc: Vec<f32> = xs.chunks_exact(stride).flat_map(|r| act_scales(vdt, r)).collect();
                    let nsc = sc.len() / avx2::TILE;
                    for (xd, xds) in [(std::ptr::null(), 0), (sc.as_ptr(), nsc)] {
                        if !xd.is_null() && nsc == 0 {
                            continue;
                        }
                        let (mut a, mut b) = ([0f32; avx2::TILE], [0f32; avx2::TILE]);
                        unsafe {
                            a4(n, w.as_ptr(), xs.as_ptr(), stride, xd, xds, a.as_mut_ptr());
                            b4(n, w.as_ptr(), xs.as_ptr(), stride, xd, xds, b.as_mut_ptr());
                        }
                        assert_eq!(a.map(f32::to_bits), b.map(f32::to_bits), "{ty} n={n} tile, xd={}", !xd.is_null());
                        for c in 0..avx2::TILE {
                            let (mut s, mut t) = (0f32, 0f32);
                            let xdc = if xd.is_null() { xd } else { unsafe { xd.add(c * nsc) } };
                            unsafe {
                                a1(n, w.as_ptr(), xs.as_ptr().add(c * stride), 0, xdc, 0, &mut s);
                                b1(n, w.as_ptr(), xs.as_ptr().add(c * stride), 0, xdc, 0, &mut t);
                            }
                            assert_eq!(s.to_bits(), t.to_bits(), "{ty} n={n} column {c}: avx2 {s} avx512 {t}");
                            assert_eq!(s.to_bits(), a[c].to_bits(), "{ty} n={n} column {c}");
                        }
                    }
                    // the safe single-row entry points too
                    let x0 = &xs[..stride];
                    let s = vec_dot_fn(ty, KernelSet::Avx2).unwrap()(n, &w, x0);
                    let t = vec_dot_fn(ty, KernelSet::Avx512).unwrap()(n, &w, x0);
                    assert_eq!(s.to_bits(), t.to_bits(), "{ty} n={n} vec_dot");
                }
            }
        }
    }
}

#[test]
fn avx2_multi_row_kernels_equal_single_row_bit_for_bit() {
    // The AVX2 single-token kernels that interleave 4 weight rows (Q4_K: 8): every row's
    // result is the single-row kernel's, plain AVX2 and AVX-VNNI builds, for every row count.
    #[cfg(target_arch = "x86_64")]
    {
        if !avx2_available() {
            eprintln!("no AVX2 on this CPU: nothing to compare");
            return;
        }
        let mut rng = Rng(0x0a2_0001);
        for vnni in [false, true] {
            if vnni && !cpu::features().avxvnni {
                continue;
            }
            // (Q4_K: 8 rows per pass, so up to two passes and a remainder)
            for ty in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0, GgmlType::IQ4_NL, GgmlType::Q4_K] {
                let rows = built(KernelSet::Avx2, vnni, false).get(ty).rows.expect("a multi-row kernel");
                let (a1, _) = dot_pair(KernelSet::Avx2, vnni, ty).unwrap();
                let vdt = vec_dot_type(ty);
                for nblocks in [1usize, 2, 3, 7, 20] {
                    let n = ty.block_size() * nblocks;
                    let wrow = ty.row_size(n).unwrap();
                    for nrows in 1..=17 {
                        let w: Vec<u8> = (0..nrows).flat_map(|_| random_row(ty, n, &mut rng)).collect();
                        let x: Vec<f32> = (0..n).map(|_| rng.normal()).collect();
                        let xq = activations(ty, &x, KernelSet::Avx2);
                        let sc = act_scales(vdt, &xq);
                        for xd in [std::ptr::null(), sc.as_ptr()] {
                            let mut got = vec![f32::NAN; nrows];
                            unsafe { rows(n, w.as_ptr(), wrow, nrows, xq.as_ptr(), xd, got.as_mut_ptr()) };
                            for r in 0..nrows {
                                let mut want = 0f32;
                                unsafe { a1(n, w.as_ptr().add(r * wrow), xq.as_ptr(), 0, std::ptr::null(), 0, &mut want) };
                                assert_eq!(want.to_bits(), got[r].to_bits(), "{ty} vnni={vnni} n={n} nrows={nrows} row {r}");
                            }
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn avx512_multi_row_kernels_equal_avx2_single_row_bit_for_bit() {
    // The single-token kernels that interleave 2 and 4 weight rows: every row's result is
    // the AVX2 single-row kernel's, for every row count (4-row groups, a pair, a last row).
    #[cfg(target_arch = "x86_64")]
    {
        if !avx512_available() {
            eprintln!("no AVX-512 (F/BW/VL/VNNI) on this CPU: nothing to compare");
            return;
        }
        let mut rng = Rng(0x0512_0001);
        for ty in AVX512_TYPES {
            let Some(rows) = built(KernelSet::Avx512, false, false).get(ty).rows else { continue };
            let (a1, _) = dot_pair(KernelSet::Avx2, false, ty).unwrap();
            let vdt = vec_dot_type(ty);
            // (64 and 65 blocks: the signed family's offset sums on the stack and on the heap)
            for nblocks in [1usize, 2, 3, 7, 8, 20, 64, 65, 72] {
                let n = 32 * nblocks;
                // (the K-quants' super-blocks are 256 long)
                if n % ty.block_size() != 0 {
                    continue;
                }
                let wrow = ty.row_size(n).unwrap();
                for nrows in 1..=19 {
                    let w: Vec<u8> = (0..nrows).flat_map(|_| random_row(ty, n, &mut rng)).collect();
                    let x: Vec<f32> = (0..n).map(|_| rng.normal()).collect();
                    let xq = activations(ty, &x, KernelSet::Avx2);
                    let sc = act_scales(vdt, &xq);
                    for xd in [std::ptr::null(), sc.as_ptr()] {
                        let mut got = vec![f32::NAN; nrows];
                        unsafe { rows(n, w.as_ptr(), wrow, nrows, xq.as_ptr(), xd, got.as_mut_ptr()) };
                        for r in 0..nrows {
                            let mut want = 0f32;
                            unsafe { a1(n, w.as_ptr().add(r * wrow), xq.as_ptr(), 0, std::ptr::null(), 0, &mut want) };
                            assert_eq!(want.to_bits(), got[r].to_bits(), "{ty} n={n} nrows={nrows} row {r}: {want} vs {}", got[r]);
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn matmul_of_a_large_x4_weight_unpacks_in_pieces_with_the_same_bits() {
    // A prompt's matmul of an x4 weight larger than the unpack piece (8 MiB: a large model's
    // FFN projection) goes piece by piece; every element still has the plain weight's bits,
    // the row range on group boundaries or not.
    use super::repack::{repack_x4, Layout};
    use crate::model::TensorView;
    use crate::ops::matmul::matmul_with;
    use crate::threadpool::ThreadPool;
    let pool = ThreadPool::new(2);
    let mut rng = Rng(0x0512_00a6);
    let (ty, n_in, n_out) = (GgmlType::Q5_0, 896usize, 16_003usize); // 9.9 MB
    let w: Vec<u8> = (0..n_out).flat_map(|_| random_row(ty, n_in, &mut rng)).collect();
    let mut w4 = vec![0u8; w.len()];
    repack_x4(ty, n_in, &w, &mut w4).unwrap();
    let plain = TensorView { name: "w", ty, ne: [n_in, n_out, 1, 1], data: &w, layout: Layout::Plain };
    let packed = TensorView { name: "w4", ty, ne: [n_in, n_out, 1, 1], data: &w4, layout: Layout::X4 };
    for n_tok in [1usize, 2, 40] {
    let x: Vec<f32> = (0..n_in * n_tok).map(|_| rng.normal()).collect();
    for rows in [0..n_out, 3..n_out - 2] {
        let nr = rows.len();
        let (mut a, mut b) = (vec![0f32; nr * n_tok], vec![0f32; nr * n_tok]);
        let mut scratch = Vec::new();
        matmul_with(&pool, KernelSet::Ref, &plain, &x, n_tok, &mut a, nr, rows.clone(), &mut scratch).unwrap();
        matmul_with(&pool, kernel_set(), &packed, &x, n_tok, &mut b, nr, rows.clone(), &mut scratch).unwrap();
        let mut c = vec![0f32; nr * n_tok];
        matmul_with(&pool, kernel_set(), &plain, &x, n_tok, &mut c, nr, rows.clone(), &mut scratch).unwrap();
        for k in 0..b.len() {
            assert_eq!(c[k].to_bits(), b[k].to_bits(), "rows {rows:?} element {k}");
        }
        // (and the plain product itself is the reference's within rounding: a wrong piece
        // offset would put whole rows in the wrong place)
        let bad = (0..a.len()).filter(|&k| (a[k] - b[k]).abs() > 1e-2 * (1.0 + a[k].abs())).count();
        assert_eq!(bad, 0, "rows {rows:?}");
    }
    }
}

#[cfg(target_arch = "x86_64")]
#[test]
fn x4_kernels_equal_avx2_single_row_bit_for_bit() {
    // The single-token kernels over the x4 row-group layouts (`repack`): every row's result
    // is the AVX2 single-row kernel's on the plain row, for row counts 1..=13 (whole groups
    // and a plain tail of 1-3 rows), with and without precomputed activation scales.
    use super::repack::{repack_x4, x4_kernel, x4_offsets};
    let mut rng = Rng(0x0512_00a4);
    for ty in [GgmlType::Q5_0, GgmlType::Q4_1, GgmlType::Q4_K] {
        let Some(k4) = x4_kernel(ty) else {
            eprintln!("no x4 kernel for {ty} on this CPU: nothing to compare");
            continue;
        };
        let (a1, _) = dot_pair(KernelSet::Avx2, false, ty).unwrap();
        let vdt = vec_dot_type(ty);
        let blocks: &[usize] = if ty == GgmlType::Q4_K { &[1, 2, 3, 4, 7] } else { &[1, 2, 3, 18, 28, 65] };
        for &nblocks in blocks {
            let n = ty.block_size() * nblocks;
            let wrow = ty.row_size(n).unwrap();
            for nrows in 1..=13 {
                let w: Vec<u8> = (0..nrows).flat_map(|_| random_row(ty, n, &mut rng)).collect();
                let mut w4 = vec![0u8; w.len()];
                repack_x4(ty, n, &w, &mut w4).unwrap();
                let x: Vec<f32> = (0..n).map(|_| rng.normal()).collect();
                let xq = activations(ty, &x, KernelSet::Avx2);
                let sc = act_scales(vdt, &xq);
                let mut tn = Vec::new();
                x4_offsets(ty, n, xq.as_ptr(), 0, 1, &mut tn);
                for xd in [std::ptr::null(), sc.as_ptr()] {
                    let mut got = vec![f32::NAN; nrows];
                    unsafe { k4(n, w4.as_ptr(), wrow, nrows, xq.as_ptr(), 0, xd, 0, tn.as_ptr(), 1, got.as_mut_ptr(), 0) };
                    for r in 0..nrows {
                        let mut want = 0f32;
                        unsafe { a1(n, w.as_ptr().add(r * wrow), xq.as_ptr(), 0, std::ptr::null(), 0, &mut want) };
                        assert_eq!(want.to_bits(), got[r].to_bits(), "{ty} n={n} nrows={nrows} row {r}: {want} vs {}", got[r]);
                    }
                }
            }
        }
    }
}

#[test]
fn matmul_of_x4_weights_equals_plain_bit_for_bit() {
    // A weight repacked into the x4 layout gives the plain weight's bits through every
    // matmul path: one token (the x4 kernel; rows on and off group boundaries), a few tokens
    // (the x4 chunks), a prompt (unpacked, then the prefill kernels), another kernel set
    // (unpacked), 1 and 2 threads, and the fused single-token matmul.
    use super::repack::{repack_x4, Layout};
    use crate::model::TensorView;
    use crate::ops::matmul::{matmul_single_fused_with, matmul_with, FusedPart};
    use crate::threadpool::ThreadPool;
    let pools = [ThreadPool::new(1), ThreadPool::new(2)];
    let mut rng = Rng(0x0512_00a5);
    let mut sets = vec![KernelSet::Ref];
    #[cfg(target_arch = "x86_64")]
    {
        if avx2_available() {
            sets.push(KernelSet::Avx2);
        }
        if avx512_available() {
            sets.push(KernelSet::Avx512);
        }
    }
    for ty in [GgmlType::Q5_0, GgmlType::Q4_1, GgmlType::Q4_K] {
        let shapes: [(usize, usize); 3] = if ty == GgmlType::Q4_K { [(256, 13), (1024, 40), (512, 23)] } else { [(96, 13), (896, 40), (576, 7)] };
        for (n_in, n_out) in shapes {
            let w: Vec<u8> = (0..n_out).flat_map(|_| random_row(ty, n_in, &mut rng)).collect();
            let mut w4 = vec![0u8; w.len()];
            repack_x4(ty, n_in, &w, &mut w4).unwrap();
            let plain = TensorView { name: "w", ty, ne: [n_in, n_out, 1, 1], data: &w, layout: Layout::Plain };
            let packed = TensorView { name: "w4", ty, ne: [n_in, n_out, 1, 1], data: &w4, layout: Layout::X4 };
            for &set in &sets {
                for n_tok in [1usize, 2, 3, 5, 6, 16, 33, 40] {
                    let x: Vec<f32> = (0..n_in * n_tok).map(|_| rng.normal()).collect();
                    for rows in [0..n_out, 4..n_out, 4..8.min(n_out), 1..n_out - 1, 3..5] {
                        for pool in &pools {
                            let nr = rows.len();
                            let (mut a, mut b) = (vec![0f32; nr * n_tok], vec![0f32; nr * n_tok]);
                            let mut scratch = Vec::new();
                            matmul_with(pool, set, &plain, &x, n_tok, &mut a, nr, rows.clone(), &mut scratch).unwrap();
                            matmul_with(pool, set, &packed, &x, n_tok, &mut b, nr, rows.clone(), &mut scratch).unwrap();
                            for k in 0..a.len() {
                                assert_eq!(a[k].to_bits(), b[k].to_bits(), "{ty} {n_in}x{n_out} {set:?} n_tok={n_tok} rows {rows:?} element {k}");
                            }
                        }
                    }
                    if n_tok == 1 {
                        // fused: the x4 weight beside the plain one, on group boundaries and off
                        for rows in [0..n_out, 4..n_out, 1..n_out] {
                            let (mut a, mut b) = (vec![0f32; rows.len()], vec![0f32; rows.len()]);
                            let mut want = vec![0f32; rows.len()];
                            let mut scratch = Vec::new();
                            matmul_with(&pools[1], set, &plain, &x, 1, &mut want, rows.len(), rows.clone(), &mut scratch).unwrap();
                            let mut parts = [
                                FusedPart { w: &packed, rows: rows.clone(), out: &mut a },
                                FusedPart { w: &plain, rows: rows.clone(), out: &mut b },
                            ];
                            if matmul_single_fused_with(&pools[1], set, &mut parts, &x, &mut scratch).unwrap() {
                                assert_eq!(a.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), "{ty} fused x4 {set:?} {rows:?}");
                                assert_eq!(b.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), "{ty} fused plain {set:?} {rows:?}");
                            } else {
                                assert!(rows.start % 4 != 0 || set != KernelSet::Avx512, "{ty} {set:?} {rows:?}: the fused path declined an x4 weight on group boundaries");
                            }
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn matmul_avx512_equals_avx2_bit_for_bit() {
    // Whole matmuls (1 token: the multi-row path; 10 tokens: tiles and tail; 16 and 21
    // tokens: the decode-step path that reads each weight row once for 2-3 packed groups; 1
    // and 2 threads) give the same bits with either kernel set, for every weight format.
    use crate::model::TensorView;
    use crate::ops::matmul::matmul_with;
    use crate::threadpool::ThreadPool;
    if !avx512_available() {
        eprintln!("no AVX-512 (F/BW/VL/VNNI) on this CPU: nothing to compare");
        return;
    }
    let pools = [ThreadPool::new(1), ThreadPool::new(2)];
    let mut rng = Rng(0x0512_0002);
    for ty in WEIGHT_TYPES {
        let bs = if ty.block_size() == 1 { 32 } else { ty.block_size() };
        for (n_in, n_out) in [(bs * 3, 7), (bs * 8, 13)] {
            let w: Vec<u8> = (0..n_out).flat_map(|_| random_row(ty, n_in, &mut rng)).collect();
            let tv = TensorView { name: "w", ty, ne: [n_in, n_out, 1, 1], data: &w, layout: crate::model::Layout::Plain };
            for n_tok in [1usize, 10, 16, 21] {
                let x: Vec<f32> = (0..n_in * n_tok).map(|_| rng.normal()).collect();
                for pool in &pools {
                    let mut outs = Vec::new();
                    for set in [KernelSet::Avx2, KernelSet::Avx512] {
                        let mut out = vec![0f32; n_out * n_tok];
                        let mut scratch = Vec::new();
                        matmul_with(pool, set, &tv, &x, n_tok, &mut out, n_out, 0..n_out, &mut scratch).unwrap();
                        outs.push(out);
                    }
                    let (a, b) = (&outs[0], &outs[1]);
                    for k in 0..a.len() {
                        assert_eq!(a[k].to_bits(), b[k].to_bits(), "{ty} n_in={n_in} n_tok={n_tok} element {k}: {} vs {}", a[k], b[k]);
                    }
                }
            }
        }
    }
}

// ---------------------------------------------------------------- NEON (aarch64)
// Run on an x86 host with `cargo test --release -p pyllama-core --target
// aarch64-unknown-linux-gnu` (qemu, see .cargo/config.toml); `QEMU_CPU=cortex-a53` emulates
// a CPU without dotprod, the default (`max`) one with it.

#[cfg(target_arch = "aarch64")]
const NEON_TYPES: [GgmlType; 16] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::IQ4_NL,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::Q8_K,
    GgmlType::IQ4_XS,
];

/// The NEON builds this CPU can run: plain (always) and dotprod (where present).
#[cfg(target_arch = "aarch64")]
fn neon_builds() -> Vec<bool> {
    let mut v = vec![false];
    if cpu::features().dotprod {
        v.push(true);
    } else {
        eprintln!("no dotprod on this CPU: only the plain NEON build is tested");
    }
    v
}

/// A weight row for the NEON tests: `random_row`, except Q8_K (whose f32 scale random bytes
/// could make NaN), which is quantized from normal data.
#[cfg(target_arch = "aarch64")]
fn neon_weight_row(ty: GgmlType, n: usize, rng: &mut Rng) -> Vec<u8> {
    if ty == GgmlType::Q8_K {
        let x: Vec<f32> = (0..n).map(|_| rng.normal()).collect();
        let mut b = vec![0u8; ty.row_size(n).unwrap()];
        quantize_row(ty, &x, &mut b).unwrap();
        return b;
    }
    random_row(ty, n, rng)
}

/// f32 copies of a Q8_0/Q8_1 activation row's block scales (what the matmul passes as xd).
#[cfg(target_arch = "aarch64")]
fn act_scales(ty: GgmlType, xq: &[u8]) -> Vec<f32> {
    match vec_dot_type(ty) {
        GgmlType::Q8_0 => xq.chunks_exact(34).map(|b| fp::rd_f16(b, 0)).collect(),
        GgmlType::Q8_1 => xq.chunks_exact(36).flat_map(|b| [fp::rd_f16(b, 0), fp::rd_f16(b, 2)]).collect(),
        _ => Vec::new(),
    }
}

#[test]
#[cfg(target_arch = "aarch64")]
fn neon_vec_dot_matches_ref_on_random_blocks_and_odd_lengths() {
    // All formats within the tolerance the AVX2 test uses; Q4_K/Q6_K/Q8_K bit-identical to
    // _ref (same order), the other quantized formats to the x86 order (`x86_order_dot`),
    // with and without dotprod, with and without precomputed activation scales.
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    for dp in neon_builds() {
        for ty in NEON_TYPES {
            let (one, _) = dot_pair(KernelSet::Neon, dp, ty).unwrap();
            let float = ty.block_size() == 1;
            let bs = if float { 32 } else { ty.block_size() };
            for nblocks in [1usize, 2, 3, 5, 7] {
                for extra in [0usize, 3, 17] {
                    if extra != 0 && !float {
                        continue;
                    }
                    let n = bs * nblocks + extra;
                    for _ in 0..4 {
                        let w = neon_weight_row(ty, n, &mut rng);
                        let x: Vec<f32> = (0..n).map(|_| rng.normal()).collect();
                        let xq = activations(ty, &x, KernelSet::Neon);
                        let r = vec_dot_fn_ref(ty).unwrap()(n, &w, &xq);
                        let mut s = 0f32;
                        unsafe { one(n, w.as_ptr(), xq.as_ptr(), 0, std::ptr::null(), 0, &mut s) };
                        let m = mass(ty, &w, &xq, n);
                        let tol = (n / ty.block_size() + 16) as f64 * f32::EPSILON as f64 * m + 1e-30;
                        assert!(((r - s) as f64).abs() <= tol, "{ty} dp={dp} n={n}: ref {r} neon {s} tol {tol}");
                        if matches!(ty, GgmlType::Q4_K | GgmlType::Q6_K | GgmlType::Q8_K) {
                            assert_eq!(r.to_bits(), s.to_bits(), "{ty} dp={dp} n={n}: ref {r} neon {s}");
                        } else if !float {
                            assert_eq!(x86_order_dot(ty, n, &w, &xq).to_bits(), s.to_bits(), "{ty} dp={dp} n={n}: x86 order");
                            let xd = act_scales(ty, &xq);
                            if !xd.is_empty() {
                                let mut t = 0f32;
                                unsafe { one(n, w.as_ptr(), xq.as_ptr(), 0, xd.as_ptr(), 0, &mut t) };
                                assert_eq!(t.to_bits(), s.to_bits(), "{ty} dp={dp} n={n}: with f32 scales");
                            }
                        }
                    }
                }
            }
        }
    }
    // The safe dispatch (kernel_set() is Neon on aarch64 unless PYLLAMA_KERNELS=ref).
    for ty in NEON_TYPES {
        assert!(table::table(KernelSet::Neon).get(ty).vec_dot.is_some(), "{ty}");
    }
}

#[test]
#[cfg(target_arch = "aarch64")]
fn neon_tiled_kernels_equal_single_column_kernels_bit_for_bit() {
    let mut rng = Rng(42);
    for dp in neon_builds() {
        for ty in NEON_TYPES {
            let (one, many) = dot_pair(KernelSet::Neon, dp, ty).unwrap();
            let bs = if ty.block_size() == 1 { 32 } else { ty.block_size() };
            for n in [bs, bs * 3 + if ty.block_size() == 1 { 5 } else { 0 }] {
                let w = neon_weight_row(ty, n, &mut rng);
                let rows: Vec<Vec<u8>> = (0..TILE)
                    .map(|_| {
                        let x: Vec<f32> = (0..n).map(|_| rng.normal()).collect();
                        activations(ty, &x, KernelSet::Neon)
                    })
                    .collect();
                let stride = rows[0].len();
                let xs: Vec<u8> = rows.concat();
                let sc: Vec<f32> = rows.iter().flat_map(|r| act_scales(ty, r)).collect();
                let sstride = sc.len() / TILE;
                for with_scales in [false, true] {
                    if with_scales && sc.is_empty() {
                        continue;
                    }
                    let xd = if with_scales { sc.as_ptr() } else { std::ptr::null() };
                    let mut tiled = [0f32; TILE];
                    unsafe { many(n, w.as_ptr(), xs.as_ptr(), stride, xd, sstride, tiled.as_mut_ptr()) };
                    for (c, t) in tiled.iter().enumerate() {
                        let mut single = 0f32;
                        let xdc = if with_scales { sc[c * sstride..].as_ptr() } else { std::ptr::null() };
                        unsafe { one(n, w.as_ptr(), xs.as_ptr().add(c * stride), 0, xdc, 0, &mut single) };
                        assert_eq!(t.to_bits(), single.to_bits(), "{ty} dp={dp} n={n} column {c} scales={with_scales}");
                    }
                }
            }
        }
    }
}

#[test]
#[cfg(target_arch = "aarch64")]
fn neon_dotprod_and_plain_builds_agree_bit_for_bit() {
    if !cpu::features().dotprod {
        eprintln!("no dotprod on this CPU: nothing to compare");
        return;
    }
    // Extreme quants: all-max and all-min bytes (Q8_0 -128 weights, nibbles 0 and 15).
    let mut rng = Rng(77);
    for ty in NEON_TYPES {
        if ty.block_size() == 1 {
            continue;
        }
        let n = ty.block_size() * 4;
        for fill in [None, Some(0x00u8), Some(0xFF), Some(0x80)] {
            let mut w = neon_weight_row(ty, n, &mut rng);
            if let Some(f) = fill {
                if ty != GgmlType::Q8_K {
                    let keep = f16_fields(ty);
                    for blk in w.chunks_exact_mut(ty.type_size()) {
                        for (i, b) in blk.iter_mut().enumerate() {
                            if !keep.iter().any(|&o| i == o || i == o + 1) {
                                *b = f;
                            }
                        }
                    }
                }
            }
            let x: Vec<f32> = (0..n).map(|_| rng.normal() * 10.0).collect();
            let xq = activations(ty, &x, KernelSet::Neon);
            let (p1, _) = dot_pair(KernelSet::Neon, false, ty).unwrap();
            let (d1, _) = dot_pair(KernelSet::Neon, true, ty).unwrap();
            let (mut a, mut b) = (0f32, 0f32);
            unsafe {
                p1(n, w.as_ptr(), xq.as_ptr(), 0, std::ptr::null(), 0, &mut a);
                d1(n, w.as_ptr(), xq.as_ptr(), 0, std::ptr::null(), 0, &mut b);
            }
            assert_eq!(a.to_bits(), b.to_bits(), "{ty} fill {fill:?}");
            let r = match ty {
                GgmlType::Q4_K | GgmlType::Q6_K | GgmlType::Q8_K => vec_dot_fn_ref(ty).unwrap()(n, &w, &xq),
                _ => x86_order_dot(ty, n, &w, &xq),
            };
            assert_eq!(a.to_bits(), r.to_bits(), "{ty} fill {fill:?}: neon {a} expected {r}");
        }
    }
}

#[test]
#[cfg(target_arch = "aarch64")]
fn neon_matmul_equals_ref_matmul_for_k_quants() {
    // Whole matmuls (tiled path, odd row and token counts, 2 threads): NEON == scalar bit
    // for bit for the K-quants (same order), so their results do not depend on the set.
    use crate::model::TensorView;
    use crate::ops::matmul::matmul_with;
    use crate::threadpool::ThreadPool;
    let pool = ThreadPool::new(2);
    let mut rng = Rng(2024);
    for ty in [GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::Q8_K] {
        let (n_in, n_out, n_tok) = (ty.block_size() * 2, 5, 7);
        let w: Vec<u8> = (0..n_out).flat_map(|_| neon_weight_row(ty, n_in, &mut rng)).collect();
        let x: Vec<f32> = (0..n_in * n_tok).map(|_| rng.normal()).collect();
        let tv = TensorView { name: "w", ty, ne: [n_in, n_out, 1, 1], data: &w, layout: crate::model::Layout::Plain };
        let (mut a, mut b) = (vec![0f32; n_out * n_tok], vec![0f32; n_out * n_tok]);
        let mut scratch = Vec::new();
        matmul_with(&pool, KernelSet::Ref, &tv, &x, n_tok, &mut a, n_out, 0..n_out, &mut scratch).unwrap();
        matmul_with(&pool, KernelSet::Neon, &tv, &x, n_tok, &mut b, n_out, 0..n_out, &mut scratch).unwrap();
        assert_eq!(a.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), b.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), "{ty}");
    }
}

/// ggml's x86 (AVX2) float order for the 32-element block formats and F32/F16/BF16, in
/// scalar code: what avx2.rs computes and neon.rs mirrors. Legacy blocks: per block, 8
/// lanes of exact sums of 4 adjacent products (obtained from the scalar reference on a block
/// whose scales are 1 and whose other activations are 0), each FMA'd with d_w * d_x into 8
/// accumulators; Q4_1/Q5_1 add the sequential sum of m_w * s_x after the horizontal sum.
/// Floats: two 8-lane FMA accumulators over 16 elements per step, then a scalar tail.
/// The horizontal sum of 8 lanes is ((v4 + v0) + (v6 + v2)) + ((v5 + v1) + (v7 + v3)).
fn x86_order_dot(ty: GgmlType, n: usize, w: &[u8], xq: &[u8]) -> f32 {
    let hsum = |v: [f32; 8]| ((v[4] + v[0]) + (v[6] + v[2])) + ((v[5] + v[1]) + (v[7] + v[3]));
    if ty.block_size() == 1 {
        let (mut wf, mut xf) = (vec![0f32; n], vec![0f32; n]);
        dequantize_row(ty, w, &mut wf).unwrap();
        dequantize_row(vec_dot_type(ty), xq, &mut xf).unwrap();
        let (mut a0, mut a1) = ([0f32; 8], [0f32; 8]);
        let n16 = n / 16 * 16;
        for k in (0..n16).step_by(16) {
            for l in 0..8 {
                a0[l] = wf[k + l].mul_add(xf[k + l], a0[l]);
                a1[l] = wf[k + 8 + l].mul_add(xf[k + 8 + l], a1[l]);
            }
        }
        let mut s = hsum(std::array::from_fn(|l| a0[l] + a1[l]));
        for k in n16..n {
            s += wf[k] * xf[k];
        }
        return s;
    }
    if ty.block_size() == 256 {
        return x86_order_dot_k(ty, n, w, xq, hsum);
    }
    let vdt = vec_dot_type(ty);
    let (ts, xs) = (ty.type_size(), vdt.type_size());
    let min = vdt == GgmlType::Q8_1;
    let xq_off = if min { 4 } else { 2 };
    let one = fp::f32_to_f16(1.0).to_le_bytes();
    let dot_ref = vec_dot_fn_ref(ty).unwrap();
    let mut acc = [0f32; 8];
    let mut summ = 0f32;
    for (bw, bx) in w.chunks_exact(ts).zip(xq.chunks_exact(xs)).take(n / 32) {
        let mut w1 = bw.to_vec();
        w1[0..2].copy_from_slice(&one);
        if min {
            w1[2..4].fill(0); // m = 0
        }
        let d = fp::rd_f16(bw, 0) * fp::rd_f16(bx, 0);
        for (k, a) in acc.iter_mut().enumerate() {
            let mut x1 = bx.to_vec();
            x1[0..2].copy_from_slice(&one);
            if min {
                x1[2..4].fill(0);
            }
            for (j, q) in x1[xq_off..].iter_mut().enumerate() {
                if j / 4 != k {
                    *q = 0;
                }
            }
            let lane = dot_ref(32, &w1, &x1); // the exact integer sum of the 4 products
            *a = lane.mul_add(d, *a);
        }
        if min {
            summ += fp::rd_f16(bw, 2) * fp::rd_f16(bx, 2);
        }
    }
    hsum(acc) + summ
}

/// `x86_order_dot` for Q2_K, Q3_K, Q5_K and IQ4_XS (against Q8_K): per super-block, 8 i32
/// lanes, lane k = the scaled products at positions 4k..4k+4 of every 32-element chunk
/// (from the reference kernel on a block with d = 1, dmin = 0 and the other activations 0),
/// FMA'd with d_w * d_a; Q2_K first FMAs 8 lanes of min * bsum pairs with -(d_a * dmin_w),
/// Q5_K 4 such lanes into a separate accumulator added after the horizontal sum.
fn x86_order_dot_k(ty: GgmlType, n: usize, w: &[u8], xq: &[u8], hsum: impl Fn([f32; 8]) -> f32) -> f32 {
    use GgmlType::*;
    let ts = ty.type_size();
    let (d_off, dmin_off) = match ty {
        Q2_K => (80, Some(82)),
        Q3_K => (108, None),
        Q5_K => (0, Some(2)),
        IQ4_XS => (0, None),
        _ => panic!("{ty}: not an AVX2-order K-quant"),
    };
    let one = fp::f32_to_f16(1.0).to_le_bytes();
    let dot_ref = vec_dot_fn_ref(ty).unwrap();
    let (mut acc, mut acc_m) = ([0f32; 8], [0f32; 4]);
    for (bw, bx) in w.chunks_exact(ts).zip(xq.chunks_exact(292)).take(n / 256) {
        let yd = fp::rd_f32(bx, 0);
        let dw = fp::rd_f16(bw, d_off);
        let bs: Vec<i32> = (0..16).map(|j| i16::from_le_bytes([bx[260 + 2 * j], bx[261 + 2 * j]]) as i32).collect();
        let mut w1 = bw.to_vec();
        w1[d_off..d_off + 2].copy_from_slice(&one);
        if let Some(o) = dmin_off {
            w1[o..o + 2].fill(0);
        }
        let mut lanes = [0f32; 8];
        for (k, l) in lanes.iter_mut().enumerate() {
            let mut x1 = bx.to_vec();
            x1[0..4].copy_from_slice(&1f32.to_le_bytes());
            for e in 0..256 {
                if (e % 32) / 4 != k {
                    x1[4 + e] = 0;
                }
            }
            *l = dot_ref(256, &w1, &x1); // exact integer
        }
        match ty {
            Q2_K => {
                let dminw = fp::rd_f16(bw, 82);
                for (k, a) in acc.iter_mut().enumerate() {
                    let p = (bw[2 * k] >> 4) as i32 * bs[2 * k] + (bw[2 * k + 1] >> 4) as i32 * bs[2 * k + 1];
                    *a = (p as f32).mul_add(-yd * dminw, *a);
                }
            }
            Q5_K => {
                let dminw = fp::rd_f16(bw, 2);
                for (p, a) in acc_m.iter_mut().enumerate() {
                    let m = |j: usize| kquants::scale_min_k4(j, &bw[4..16]).1 as i32;
                    let v = m(2 * p) * (bs[4 * p] + bs[4 * p + 1]) + m(2 * p + 1) * (bs[4 * p + 2] + bs[4 * p + 3]);
                    *a = (v as f32).mul_add(-yd * dminw, *a);
                }
            }
            _ => {}
        }
        for (a, l) in acc.iter_mut().zip(lanes) {
            *a = l.mul_add(yd * dw, *a);
        }
    }
    hsum(acc) + ((acc_m[0] + acc_m[2]) + (acc_m[1] + acc_m[3]))
}

#[test]
fn simd_legacy_and_float_kernels_follow_the_x86_order_bit_for_bit() {
    // On x86 this checks the AVX2 kernels against `x86_order_dot`, on aarch64 the NEON
    // ones: together, an aarch64 build computes the same floats as an x86 one.
    let kernels = |ty: GgmlType| -> Option<super::DotN> {
        #[cfg(target_arch = "x86_64")]
        if avx2_available() {
            return dot_pair(KernelSet::Avx2, avx2::vnni_available(), ty).map(|k| k.0);
        }
        #[cfg(target_arch = "aarch64")]
        return dot_pair(KernelSet::Neon, neon::dotprod_available(), ty).map(|k| k.0);
        #[allow(unreachable_code)]
        {
            let _ = ty;
            None
        }
    };
    let mut rng = Rng(31337);
    for ty in [
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::IQ4_NL,
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::BF16,
        GgmlType::Q2_K,
        GgmlType::Q3_K,
        GgmlType::Q5_K,
        GgmlType::IQ4_XS,
    ] {
        let Some(one) = kernels(ty) else {
            eprintln!("no SIMD kernels here: nothing to compare");
            return;
        };
        for n in [32usize, 96, 160, 35, 51, 256, 768] {
            if n % ty.block_size() != 0 && ty.block_size() != 1 {
                continue;
            }
            for _ in 0..6 {
                let w = random_row(ty, n, &mut rng);
                let x: Vec<f32> = (0..n).map(|_| rng.normal()).collect();
                let xq = activations(ty, &x, KernelSet::Ref);
                let mut s = 0f32;
                unsafe { one(n, w.as_ptr(), xq.as_ptr(), 0, std::ptr::null(), 0, &mut s) };
                let e = x86_order_dot(ty, n, &w, &xq);
                assert_eq!(s.to_bits(), e.to_bits(), "{ty} n={n}: simd {s} x86 order {e}");
            }
        }
    }
}

#[test]
#[cfg(target_arch = "aarch64")]
fn neon_f16_scale_conversion_is_exact() {
    // The NEON kernels convert block scales with `fcvt`: equal to the scalar conversion for
    // every f16 (NaNs: both NaN).
    for h in 0..=u16::MAX {
        let a = unsafe { neon::f16_at(h.to_le_bytes().as_ptr()) };
        let b = fp::f16_to_f32(h);
        assert!(a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()), "{h:#06x}: {a} vs {b}");
    }
}

// ---------------------------------------------------------------- small batches (decode of K sequences)

/// Activation rows of the extreme cases (`case`): random, all at +amax (every q8 quant
/// 127), alternating signs, huge (1e30: f16 scales overflow), tiny (1e-40, subnormal), zero,
/// one large value among small ones.
fn extreme_row(n: usize, case: usize, rng: &mut Rng) -> Vec<f32> {
    (0..n)
        .map(|k| match case {
            1 => 1.0,
            2 => if k % 2 == 0 { -1.0 } else { 1.0 },
            3 => 1e30 * if k % 3 == 0 { -1.0 } else { 1.0 },
            4 => 1e-40,
            5 => 0.0,
            6 => if k == n / 2 { 1e4 } else { rng.normal() * 1e-3 },
            _ => rng.normal(),
        })
        .collect()
}

/// Weight rows of the extreme cases: random, every byte 0xFF (top quants; NaN scales too),
/// zeros, random quants with the largest finite f16 scales.
fn extreme_weights(ty: GgmlType, n: usize, case: usize, rng: &mut Rng) -> Vec<u8> {
    let mut w = random_row(ty, n, rng);
    if matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16) {
        return w;
    }
    match case {
        1 => w.fill(0xFF),
        2 => w.fill(0),
        3 => {
            for blk in w.chunks_exact_mut(ty.type_size()) {
                for &o in f16_fields(ty) {
                    blk[o..o + 2].copy_from_slice(&0x7BFFu16.to_le_bytes()); // 65504
                }
            }
        }
        _ => {}
    }
    w
}

#[test]
fn cols_kernels_equal_single_column_kernels_bit_for_bit() {
    // The kernels over 2..7 tokens at once (the matmul's leftover tokens after its tiles, and
    // whole batches of sequences decoding together) give every column exactly the single-
    // column kernel's bits: every weight type, plain AVX2, AVX-VNNI and AVX-512 builds, with
    // and without precomputed activation scales, at extreme weights and activations.
    #[cfg(target_arch = "x86_64")]
    {
        if !avx2_available() {
            eprintln!("no AVX2 on this CPU: nothing to compare");
            return;
        }
        let mut rng = Rng(0xC015_0001);
        // (name, cols kernel of width nc, single-column kernel)
        let mut builds: Vec<(&str, Box<dyn Fn(GgmlType, usize) -> Option<DotN>>, Box<dyn Fn(GgmlType) -> DotN>)> = vec![(
            "avx2",
            Box::new(|ty, nc| built(KernelSet::Avx2, false, false).get(ty).tiled.and_then(|t| t.cols[nc])),
            Box::new(|ty| dot_pair(KernelSet::Avx2, false, ty).unwrap().0),
        )];
        if cpu::features().avxvnni {
            builds.push((
                "avx2vnni",
                Box::new(|ty, nc| built(KernelSet::Avx2, true, false).get(ty).tiled.and_then(|t| t.cols[nc])),
                Box::new(|ty| dot_pair(KernelSet::Avx2, false, ty).unwrap().0),
            ));
        }
        if avx512_available() {
            builds.push(("avx512", Box::new(|ty, nc| built(KernelSet::Avx512, false, false).get(ty).tiled.and_then(|t| t.cols[nc])), Box::new(|ty| dot_pair(KernelSet::Avx2, false, ty).unwrap().0)));
        }
        let mut checked = 0;
        for (name, cols, one_of) in &builds {
            for ty in WEIGHT_TYPES {
                let one = one_of(ty);
                let vdt = vec_dot_type(ty);
                let bs = if ty.block_size() == 1 { 32 } else { ty.block_size() };
                for nblocks in [1usize, 3, 8] {
                    let n = bs * nblocks;
                    for nc in 1..=7 {
                        let Some(k) = cols(ty, nc) else { continue };
                        for wcase in 0..4 {
                            let w = extreme_weights(ty, n, wcase, &mut rng);
                            for xcase in 0..8 {
                                // columns of mixed cases: xcase for column 0, then others
                                let xs: Vec<u8> = (0..nc)
                                    .flat_map(|c| activations(ty, &extreme_row(n, (xcase + 3 * c) % 8, &mut rng), KernelSet::Avx2))
                                    .collect();
                                let stride = xs.len() / nc;
                                let sc: Vec<f32> = xs.chunks_exact(stride).flat_map(|r| act_scales(vdt, r)).collect();
                                let nsc = sc.len() / nc;
                                for (xd, xds) in [(std::ptr::null(), 0), (sc.as_ptr(), nsc)] {
                                    if !xd.is_null() && nsc == 0 {
                                        continue;
                                    }
                                    let mut got = [f32::NAN; 8];
                                    unsafe { k(n, w.as_ptr(), xs.as_ptr(), stride, xd, xds, got.as_mut_ptr()) };
                                    for c in 0..nc {
                                        let mut want = 0f32;
                                        let xdc = if xd.is_null() { xd } else { unsafe { xd.add(c * nsc) } };
                                        unsafe { one(n, w.as_ptr(), xs.as_ptr().add(c * stride), 0, xdc, 0, &mut want) };
                                        assert_eq!(
                                            want.to_bits(),
                                            got[c].to_bits(),
                                            "{name} {ty} n={n} nc={nc} w{wcase} x{xcase} column {c}: {want} vs {}",
                                            got[c]
                                        );
                                        checked += 1;
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
        assert!(checked > 0);
    }
}

#[test]
fn matmul_small_batches_equal_single_token_matmuls_bit_for_bit() {
    // Batch invariance for the batch sizes of several sequences decoding together: a matmul
    // over n_tok = 1..=17 tokens (single-token rows kernels, leftover-token kernels, tiles,
    // packed groups, 1 and 2 threads) gives every token exactly what a matmul of that token
    // alone gives, in every kernel set this CPU runs, with extreme rows in the batch.
    use crate::model::TensorView;
    use crate::ops::matmul::matmul_with;
    use crate::threadpool::ThreadPool;
    let pools = [ThreadPool::new(1), ThreadPool::new(2)];
    let mut rng = Rng(0xC015_0002);
    let sets = cpu_sets();
    for set in sets {
        for ty in WEIGHT_TYPES {
            let bs = if ty.block_size() == 1 { 32 } else { ty.block_size() };
            let (n_in, n_out) = (bs * 3, 11);
            let w: Vec<u8> = (0..n_out).flat_map(|_| random_row(ty, n_in, &mut rng)).collect();
            let tv = TensorView { name: "w", ty, ne: [n_in, n_out, 1, 1], data: &w, layout: crate::model::Layout::Plain };
            let x: Vec<f32> = (0..17).flat_map(|t| extreme_row(n_in, if t % 5 == 4 { t % 8 } else { 0 }, &mut rng)).collect();
            let mut scratch = Vec::new();
            // each token alone (1 thread)
            let mut alone = vec![0f32; 17 * n_out];
            for t in 0..17 {
                let (xt, ot) = (&x[t * n_in..(t + 1) * n_in], &mut alone[t * n_out..(t + 1) * n_out]);
                matmul_with(&pools[0], set, &tv, xt, 1, ot, n_out, 0..n_out, &mut scratch).unwrap();
            }
            for n_tok in 1..=17 {
                for pool in &pools {
                    let mut out = vec![f32::NAN; n_tok * n_out];
                    matmul_with(pool, set, &tv, &x[..n_tok * n_in], n_tok, &mut out, n_out, 0..n_out, &mut scratch).unwrap();
                    for k in 0..out.len() {
                        assert_eq!(
                            alone[k].to_bits(),
                            out[k].to_bits(),
                            "{ty} {set:?} n_tok={n_tok} threads={} token {} row {}: {} vs {}",
                            pool.n_threads(),
                            k / n_out,
                            k % n_out,
                            alone[k],
                            out[k]
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn iq4_nl_x86_order_matches_ref() {
    // the KV cache's IQ4_NL q.k (ggml's two-accumulator AVX2 order) is the same dot product
    // within float-summation error, for even and odd block counts
    let mut rng = Rng(0x1234_5678_9abc_def1);
    for nblocks in [1usize, 2, 3, 8] {
        let n = 32 * nblocks;
        for _ in 0..16 {
            let w = random_row(GgmlType::IQ4_NL, n, &mut rng);
            let x: Vec<f32> = (0..n).map(|_| rng.normal()).collect();
            let xq = activations(GgmlType::IQ4_NL, &x, KernelSet::Ref);
            let r = vec_dot_fn_ref(GgmlType::IQ4_NL).unwrap()(n, &w, &xq);
            let s = legacy::vec_dot_iq4_nl_q8_0_x86(n, &w, &xq);
            let m = mass(GgmlType::IQ4_NL, &w, &xq, n);
            let tol = (nblocks + 16) as f64 * f32::EPSILON as f64 * m + 1e-30;
            assert!(((r - s) as f64).abs() <= tol, "n={n}: ref {r} x86 {s}");
        }
    }
}


/// The grid / ternary / MXFP4 types of `iquants.rs`.
const IQ_TYPES: [GgmlType; 10] = [
    GgmlType::IQ2_XXS,
    GgmlType::IQ2_XS,
    GgmlType::IQ2_S,
    GgmlType::IQ3_XXS,
    GgmlType::IQ3_S,
    GgmlType::IQ1_S,
    GgmlType::IQ1_M,
    GgmlType::TQ1_0,
    GgmlType::TQ2_0,
    GgmlType::MXFP4,
];

/// A random row of `ty` and Q8 activations: the generic-order and x86-order vec_dots agree
/// within `k` ulps of the mass, and the generic one with the f64 dot of the dequantized rows
/// (within that plus `rel` of the mass). Returns (weights, activations, generic result, tol).
fn twins_agree(ty: GgmlType, n: usize, k: f64, rel: f64, rng: &mut Rng) -> (Vec<u8>, Vec<u8>, f32, f64) {
    let w = random_row(ty, n, rng);
    let x: Vec<f32> = (0..n).map(|_| rng.normal()).collect();
    let xq = activations(ty, &x, KernelSet::Ref);
    let r = vec_dot_fn_ref(ty).unwrap()(n, &w, &xq);
    let t = vec_dot_fn_x86_order(ty).unwrap()(n, &w, &xq);
    let m = mass(ty, &w, &xq, n);
    let tol = k * f32::EPSILON as f64 * m + 1e-30;
    assert!(((r - t) as f64).abs() <= tol, "{ty} n={n}: ref {r} x86 {t} tol {tol}");
    let (mut wf, mut xf) = (vec![0f32; n], vec![0f32; n]);
    dequantize_row(ty, &w, &mut wf).unwrap();
    dequantize_row(vec_dot_type(ty), &xq, &mut xf).unwrap();
    let exact: f64 = wf.iter().zip(&xf).map(|(a, b)| *a as f64 * *b as f64).sum();
    assert!((r as f64 - exact).abs() <= tol + rel * m, "{ty} n={n}: ref {r} exact {exact}");
    (w, xq, r, tol)
}

#[test]
fn iq_x86_order_twins_match_ggml_generic_order_within_rounding() {
    // The x86-order scalar twins (what the SIMD kernels compute) and the generic-order
    // references are the same dot product up to float summation, and both equal the f64
    // dot product of the dequantized rows within it.
    let mut rng = Rng(0xA1B2_C3D4_E5F6_0718);
    for ty in IQ_TYPES {
        for nblocks in [1usize, 2, 3, 5, 8] {
            let n = ty.block_size() * nblocks;
            for _ in 0..6 {
                let (w, xq, r, tol) = twins_agree(ty, n, (nblocks + 16) as f64, 1e-6, &mut rng);
                if ty.block_size() == 256 {
                    let v = iquants::vec_dot_k_x86(ty, n, &w, &xq);
                    assert!(((r - v) as f64).abs() <= tol, "{ty} n={n}: ref {r} vec_dot order {v} tol {tol}");
                }
            }
        }
    }
}

#[test]
fn iq_simd_kernels_equal_x86_order_twins_bit_for_bit() {
    // AVX2 (and so the AVX-512 set, which runs them): the single-column, tile and 1..3-column
    // kernels and the safe vec_dot give exactly the x86-order twin's bits, at random and
    // extreme weights (every byte 0xFF: top grid indices, NaN scales; zeros) and activations
    // (every quant 127, alternating signs, huge, tiny, zero).
    #[cfg(target_arch = "x86_64")]
    {
        if !avx2_available() {
            eprintln!("no AVX2 on this CPU: nothing to compare");
            return;
        }
        let same = |a: f32, b: f32| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan());
        let mut rng = Rng(0x0DDB_A11C_0FFE_E123);
        for ty in IQ_TYPES {
            let vdt = vec_dot_type(ty);
            let twin = vec_dot_fn_x86_order(ty).unwrap();
            let (one, many) = dot_pair(KernelSet::Avx2, avx2::vnni_available(), ty).unwrap();
            for nblocks in [1usize, 2, 3, 4, 7] {
                let n = ty.block_size() * nblocks;
                let xrow = vdt.row_size(n).unwrap();
                for wcase in 0..4 {
                    for xcase in 0..7 {
                        let w = extreme_weights(ty, n, wcase, &mut rng);
                        let mut xq = vec![0u8; xrow * TILE];
                        for c in 0..TILE {
                            let x = extreme_row(n, if c == 0 { xcase } else { 0 }, &mut rng);
                            xq[c * xrow..(c + 1) * xrow].copy_from_slice(&activations(ty, &x, KernelSet::Avx2));
                        }
                        let want: Vec<f32> = (0..TILE).map(|c| twin(n, &w, &xq[c * xrow..(c + 1) * xrow])).collect();
                        let mut got = [0f32; TILE];
                        unsafe { many(n, w.as_ptr(), xq.as_ptr(), xrow, std::ptr::null(), 0, got.as_mut_ptr()) };
                        for c in 0..TILE {
                            assert!(same(got[c], want[c]), "{ty} n={n} w{wcase} x{xcase} tile column {c}: {} vs {}", got[c], want[c]);
                            let mut s = 0f32;
                            unsafe { one(n, w.as_ptr(), xq.as_ptr().add(c * xrow), 0, std::ptr::null(), 0, &mut s) };
                            assert!(same(s, want[c]), "{ty} n={n} w{wcase} x{xcase} single column {c}: {s} vs {}", want[c]);
                        }
                        for nc in 1..TILE {
                            let k = built(KernelSet::Avx2, false, false).get(ty).tiled.and_then(|t| t.cols[nc]).unwrap();
                            let mut g = [0f32; TILE];
                            unsafe { k(n, w.as_ptr(), xq.as_ptr(), xrow, std::ptr::null(), 0, g.as_mut_ptr()) };
                            for c in 0..nc {
                                assert!(same(g[c], want[c]), "{ty} n={n} cols {nc} column {c}");
                            }
                        }
                        for set in [KernelSet::Avx2, KernelSet::Avx512] {
                            if set == KernelSet::Avx512 && !avx512_available() {
                                continue;
                            }
                            let v = vec_dot_fn(ty, set).unwrap()(n, &w, &xq[..xrow]);
                            assert!(same(v, want[0]), "{ty} n={n} {set:?} vec_dot");
                        }
                        // the grid types' llama.cpp vec_dot-order builds (PYLLAMA_ORDER=llamacpp,
                        // below 8 rows) against that order's twin
                        if let Some((one_vd, many_vd)) = vec_dot_order_pair(ty) {
                            let mut g = [0f32; TILE];
                            unsafe { many_vd(n, w.as_ptr(), xq.as_ptr(), xrow, std::ptr::null(), 0, g.as_mut_ptr()) };
                            for c in 0..TILE {
                                let e = iquants::vec_dot_k_x86(ty, n, &w, &xq[c * xrow..(c + 1) * xrow]);
                                assert!(same(g[c], e), "{ty} n={n} vec_dot order column {c}: {} vs {e}", g[c]);
                                let mut s = 0f32;
                                unsafe { one_vd(n, w.as_ptr(), xq.as_ptr().add(c * xrow), 0, std::ptr::null(), 0, &mut s) };
                                assert!(same(s, e), "{ty} n={n} vec_dot order single column {c}");
                            }
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn iq_matmul_elements_equal_single_vec_dot_bit_for_bit() {
    // The matmul (one token, tiles of 4 plus leftovers, threads) gives every element the
    // single-row vec_dot's bits for every kernel set this CPU runs.
    use crate::model::TensorView;
    use crate::threadpool::ThreadPool;
    let mut rng = Rng(77);
    let sets = cpu_sets();
    let pool = ThreadPool::new(3);
    for ty in IQ_TYPES {
        let n_in = ty.block_size() * if ty.block_size() == 32 { 9 } else { 2 };
        let n_out = 5;
        let w: Vec<u8> = (0..n_out).flat_map(|_| random_row(ty, n_in, &mut rng)).collect();
        let view = TensorView { name: "w", ty, ne: [n_in, n_out, 1, 1], data: &w, layout: crate::model::Layout::Plain };
        for n_tok in [1usize, 3, 6] {
            let x: Vec<f32> = (0..n_tok * n_in).map(|_| rng.normal()).collect();
            for &set in &sets {
                let mut out = vec![0f32; n_tok * n_out];
                let mut scratch = Vec::new();
                crate::ops::matmul::matmul_with(&pool, set, &view, &x, n_tok, &mut out, n_out, 0..n_out, &mut scratch).unwrap();
                let wrow = ty.row_size(n_in).unwrap();
                for t in 0..n_tok {
                    let xq = activations(ty, &x[t * n_in..(t + 1) * n_in], set);
                    for r in 0..n_out {
                        let v = vec_dot_fn(ty, set).unwrap()(n_in, &w[r * wrow..(r + 1) * wrow], &xq);
                        assert_eq!(v.to_bits(), out[t * n_out + r].to_bits(), "{ty} {set:?} t={t} r={r}");
                    }
                }
            }
        }
    }
}


#[test]
fn iq_chunk_parts_agree_with_block_ints() {
    // `iquants::chunk_parts` (what the NEON kernels decode) gives every element the
    // integer `block_ints` gives it (which the dequantize tests tie to gguf-py)
    let mut rng = Rng(0x5EED_1234);
    for ty in IQ_TYPES {
        if ty.block_size() != 256 {
            continue;
        }
        for _ in 0..20 {
            let b = random_row(ty, 256, &mut rng);
            let ints = iquants::block_ints(ty, &b);
            for c in 0..8 {
                let p = iquants::chunk_parts(ty, &b, c);
                for e in 0..32 {
                    let byte = |v: &[u64; 4]| (v[e / 8] >> (8 * (e % 8))) as u8;
                    let mag = if matches!(ty, GgmlType::IQ1_S | GgmlType::IQ1_M) { byte(&p.mag) as i8 as i32 } else { byte(&p.mag) as i32 };
                    let sgn = byte(&p.sgn) as i8 as i32;
                    let sc = p.sc[e / 16];
                    assert_eq!(mag * sgn * sc, ints.q[32 * c + e], "{ty} chunk {c} element {e}");
                    match ty {
                        GgmlType::IQ1_M => assert_eq!(byte(&p.dl) as i8 as i32 * sc, ints.dq[32 * c + e], "{ty} delta {c} {e}"),
                        GgmlType::IQ1_S => assert_eq!(p.dsc, ints.dq[32 * c + e], "{ty} delta {c} {e}"),
                        _ => {}
                    }
                }
            }
        }
    }
}

#[test]
#[cfg(target_arch = "aarch64")]
fn neon_iq_kernels_equal_x86_order_twins_bit_for_bit() {
    // the NEON kernels of the grid / ternary / MXFP4 types compute the x86 kernels' floats
    let same = |a: f32, b: f32| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan());
    let mut rng = Rng(0xAA55_1234_5678);
    for ty in IQ_TYPES {
        let vdt = vec_dot_type(ty);
        let twin = vec_dot_fn_x86_order(ty).unwrap();
        let (one, many) = dot_pair(KernelSet::Neon, neon::dotprod_available(), ty).unwrap();
        for nblocks in [1usize, 2, 3, 5] {
            let n = ty.block_size() * nblocks;
            let xrow = vdt.row_size(n).unwrap();
            for case in 0..5 {
                let w = extreme_weights(ty, n, case % 4, &mut rng);
                let mut xq = vec![0u8; xrow * TILE];
                for c in 0..TILE {
                    let x = extreme_row(n, if c == 0 { case } else { 0 }, &mut rng);
                    xq[c * xrow..(c + 1) * xrow].copy_from_slice(&activations(ty, &x, KernelSet::Neon));
                }
                let mut got = [0f32; TILE];
                unsafe { many(n, w.as_ptr(), xq.as_ptr(), xrow, std::ptr::null(), 0, got.as_mut_ptr()) };
                for c in 0..TILE {
                    let want = twin(n, &w, &xq[c * xrow..(c + 1) * xrow]);
                    assert!(same(got[c], want), "{ty} n={n} case {case} column {c}: {} vs {want}", got[c]);
                    let mut s = 0f32;
                    unsafe { one(n, w.as_ptr(), xq.as_ptr().add(c * xrow), 0, std::ptr::null(), 0, &mut s) };
                    assert!(same(s, want), "{ty} n={n} case {case} single column {c}");
                }
            }
        }
    }
}

#[test]
fn lowbit_x86_order_twins_match_ggml_generic_order_within_rounding() {
    // Q1_0, Q2_0, NVFP4: the x86-order scalars (what every SIMD set runs; llama.cpp's x86
    // build bit for bit on the tiny-iq fixtures) and ggml's generic order are the same dot
    // product up to float summation, and equal the f64 dot of the dequantized rows within it.
    let mut rng = Rng(0x5EED_0F10_2030_4050);
    for ty in [GgmlType::Q1_0, GgmlType::Q2_0, GgmlType::NVFP4] {
        assert_eq!(vec_dot_fn(ty, KernelSet::Ref).unwrap() as usize, vec_dot_fn_ref(ty).unwrap() as usize);
        let simd = if cfg!(target_arch = "aarch64") { KernelSet::Neon } else { KernelSet::Avx2 };
        let simd_ok = cfg!(target_arch = "aarch64") || avx2_available();
        for nblocks in [1usize, 2, 3, 7] {
            let n = ty.block_size() * nblocks;
            for _ in 0..6 {
                let (w, xq, _, _) = twins_agree(ty, n, (n / 8 + 16) as f64, 0.0, &mut rng);
                if simd_ok {
                    // the SIMD set's kernel (AVX2: ggml's Q1_0 / NVFP4 ones) is the twin bit for bit
                    let (a, b) = (vec_dot_fn(ty, simd).unwrap()(n, &w, &xq), vec_dot_fn_x86_order(ty).unwrap()(n, &w, &xq));
                    assert_eq!(a.to_bits(), b.to_bits(), "{ty} n={n}: SIMD {a} twin {b}");
                }
            }
        }
    }
}

#[test]
fn lowbit_quantizers_round_trip() {
    // ggml's reference quantizers: Q1_0 keeps each sign and the mean |x|; Q2_0 rounds x / amax
    // to {-1, 0, 1} (2 only at ties above 1.5, never for |x| <= amax); NVFP4 stays within half
    // an E2M1 step of each value (the step at 6 is 2, times the UE4M3 scale of amax / 6).
    let mut rng = Rng(0x0123_4567_89AB_CDEF);
    let x: Vec<f32> = (0..256).map(|_| rng.normal()).collect();
    let mut b = vec![0u8; GgmlType::Q1_0.row_size(256).unwrap()];
    quantize_row(GgmlType::Q1_0, &x, &mut b).unwrap();
    let mut y = vec![0f32; 256];
    dequantize_row(GgmlType::Q1_0, &b, &mut y).unwrap();
    for (blk, (xs, ys)) in x.chunks(128).zip(y.chunks(128)).enumerate() {
        let d = fp::f16_to_f32(fp::f32_to_f16(xs.iter().fold(0f32, |s, v| s + v.abs()) / 128.0));
        for (a, c) in xs.iter().zip(ys) {
            assert_eq!(*c, if *a >= 0.0 { d } else { -d }, "Q1_0 block {blk}");
        }
    }
    let mut b = vec![0u8; GgmlType::Q2_0.row_size(256).unwrap()];
    quantize_row(GgmlType::Q2_0, &x, &mut b).unwrap();
    dequantize_row(GgmlType::Q2_0, &b, &mut y).unwrap();
    for (xs, ys) in x.chunks(64).zip(y.chunks(64)) {
        let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = fp::f16_to_f32(fp::f32_to_f16(amax));
        for (a, c) in xs.iter().zip(ys) {
            assert_eq!(*c, (a / amax).round() * d, "Q2_0 {a}");
        }
    }
    let mut b = vec![0u8; GgmlType::NVFP4.row_size(256).unwrap()];
    quantize_row(GgmlType::NVFP4, &x, &mut b).unwrap();
    dequantize_row(GgmlType::NVFP4, &b, &mut y).unwrap();
    for (k, (xs, ys)) in x.chunks(16).zip(y.chunks(16)).enumerate() {
        let d = lowbit::ue4m3_to_f32(b[36 * (k / 4) + k % 4]);
        for (a, c) in xs.iter().zip(ys) {
            assert!((a - c).abs() <= 2.0 * d * 1.0001 + 1e-6, "NVFP4 sub-block {k}: {a} -> {c} (d {d})");
        }
    }
}

#[test]
fn fused_single_token_products_equal_separate_matmuls_bit_for_bit() {
    // q/k/v (or gate/up) of one token in one region (`matmul_single_fused`): every part,
    // of any weight type mix and row range, must equal its own matmul bit for bit, with 2
    // and 3 threads; where the fused path does not apply it must leave out untouched.
    use crate::model::TensorView;
    use crate::ops::matmul::{matmul_single_fused_with, matmul_with, FusedPart};
    use crate::threadpool::ThreadPool;
    let mut rng = Rng(4321);
    let sets = cpu_sets();
    let n_in = 512;
    let types: Vec<GgmlType> = WEIGHT_TYPES.iter().copied().filter(|t| n_in % t.block_size().max(1) == 0).collect();
    let mut fused_seen = 0;
    for nth in [2, 3] {
        let pool = ThreadPool::new(nth);
        for set in &sets {
            for (i, &t0) in types.iter().enumerate() {
                // three parts of this type, then of this and two others (vec_dot types mix)
                for tys in [[t0; 3], [t0, types[(i + 1) % types.len()], types[(i + 5) % types.len()]]] {
                let n_rows = [130usize, 8, 1100];
                let ranges = [0..130usize, 3..8, 40..1100];
                let ws: Vec<Vec<u8>> = (0..3).map(|p| (0..n_rows[p]).flat_map(|_| random_row(tys[p], n_in, &mut rng)).collect()).collect();
                let tvs: Vec<TensorView> = (0..3).map(|p| TensorView { name: "w", ty: tys[p], ne: [n_in, n_rows[p], 1, 1], data: &ws[p], layout: crate::model::Layout::Plain }).collect();
                let x: Vec<f32> = (0..n_in).map(|_| rng.normal()).collect();
                let mut outs: Vec<Vec<f32>> = ranges.iter().map(|r| vec![f32::NAN; r.len()]).collect();
                let mut scratch = vec![0xA5u8; 7];
                let done = {
                    let [a, b, c] = &mut outs[..] else { unreachable!() };
                    let mut parts = [
                        FusedPart { w: &tvs[0], rows: ranges[0].clone(), out: a },
                        FusedPart { w: &tvs[1], rows: ranges[1].clone(), out: b },
                        FusedPart { w: &tvs[2], rows: ranges[2].clone(), out: c },
                    ];
                    matmul_single_fused_with(&pool, *set, &mut parts, &x, &mut scratch).unwrap()
                };
                for p in 0..3 {
                    if !done {
                        assert!(outs[p].iter().all(|v| v.is_nan()), "{tys:?} {set:?}: not fused but written");
                        continue;
                    }
                    let mut want = vec![0f32; ranges[p].len()];
                    let mut s2 = Vec::new();
                    matmul_with(&pool, *set, &tvs[p], &x, 1, &mut want, ranges[p].len(), ranges[p].clone(), &mut s2).unwrap();
                    for (r, (g, w)) in outs[p].iter().zip(&want).enumerate() {
                        assert_eq!(g.to_bits(), w.to_bits(), "{tys:?} {set:?} {nth} threads: part {p} row {r}");
                    }
                }
                fused_seen += done as usize;
                }
            }
        }
    }
    if avx2_available() {
        assert!(fused_seen > 0, "the fused path never applied");
    }
}

#[test]
fn simd_dequantizers_match_the_reference_bit_for_bit() {
    // Every type's dequantizer in every set this CPU runs gives the scalar reference's bits
    // (the KV cache's rows and the GGUF reader go through them), on quantized random rows
    // with NaN / inf / subnormal block scales mixed in.
    let mut r = 0x1234_5678u64;
    let mut rnd = move || {
        r ^= r << 13;
        r ^= r >> 7;
        r ^= r << 17;
        (r >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    };
    for set in [KernelSet::Ref, kernel_set()] {
        let t = table::table(set);
        for ty in [GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::IQ4_NL, GgmlType::F16, GgmlType::BF16] {
            let (Some(f), Some(reference)) = (t.get(ty).dequant, dequantize_fn_ref(ty)) else { continue };
            let n = 256;
            let src: Vec<f32> = (0..n).map(|_| rnd() * 3.0).collect();
            let mut q = vec![0u8; ty.row_size(n).unwrap()];
            quantize_row(ty, &src, &mut q).unwrap();
            if ty == GgmlType::Q8_0 {
                // odd scales in blocks 1..4: NaN, -inf, a subnormal, 0
                for (blk, d) in [(1usize, 0x7e00u16), (2, 0xfc00), (3, 0x0001), (4, 0x0000)] {
                    q[blk * 34..blk * 34 + 2].copy_from_slice(&d.to_le_bytes());
                }
            }
            let (mut a, mut b) = (vec![0f32; n], vec![0f32; n]);
            f(&q, &mut a);
            reference(&q, &mut b);
            let bad = a.iter().zip(&b).position(|(x, y)| x.to_bits() != y.to_bits());
            assert!(bad.is_none(), "{ty} in {set:?}: element {bad:?}");
        }
    }
}
