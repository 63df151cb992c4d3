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

/// Byte offsets of the f16 scale fields in a block (made finite in random data).
fn f16_fields(ty: GgmlType) -> &'static [usize] {
    use GgmlType::*;
    match ty {
        Q4_0 | Q5_0 | Q8_0 | IQ4_NL | Q4_K | Q5_K | IQ4_XS => &[0, 2][..if matches!(ty, Q4_K | Q5_K) { 2 } else { 1 }],
        Q4_1 | Q5_1 => &[0, 2],
        Q2_K => &[80, 82],
        Q3_K => &[108],
        Q6_K => &[208],
        _ => &[],
    }
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
            let (one, many) = avx2::dot_kernels(ty).unwrap();
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
    let e = dequantize_row(GgmlType::IQ2_XXS, &[0u8; 66], &mut [0f32; 256]).unwrap_err();
    assert!(e.to_string().contains("unsupported tensor type IQ2_XXS"), "{e}");
    let e = quantize_row(GgmlType::Q4_K, &[0f32; 256], &mut [0u8; 144]).unwrap_err();
    assert!(e.to_string().contains("Q4_K"), "{e}");
    assert!(vec_dot_fn(GgmlType::MXFP4, kernel_set()).is_none());
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
    // element exactly what one vec_dot call gives: the determinism the forward pass needs.
    use crate::model::TensorView;
    use crate::ops::matmul::matmul_with;
    use crate::threadpool::ThreadPool;
    let pool = ThreadPool::new(2);
    let mut rng = Rng(1234);
    let sets: Vec<KernelSet> = if avx2_available() { vec![KernelSet::Ref, KernelSet::Avx2] } else { vec![KernelSet::Ref] };
    for set in sets {
        for ty in WEIGHT_TYPES {
            let bs = if ty.block_size() == 1 { 32 } else { ty.block_size() };
            let (n_in, n_out, n_tok) = (bs * 3, 7, 10);
            let w: Vec<u8> = (0..n_out).flat_map(|_| random_row(ty, n_in, &mut rng)).collect();
            let x: Vec<f32> = (0..n_in * n_tok).map(|_| rng.normal()).collect();
            let tv = TensorView { name: "w", ty, ne: [n_in, n_out, 1, 1], data: &w };
            let mut out = vec![0f32; n_out * n_tok];
            let mut scratch = Vec::new();
            matmul_with(&pool, set, &tv, &x, n_tok, &mut out, n_out, 0..n_out, &mut scratch).unwrap();
            let dot = vec_dot_fn(ty, set).unwrap();
            let wrow = ty.row_size(n_in).unwrap();
            for t in 0..n_tok {
                let xq = activations(ty, &x[t * n_in..(t + 1) * n_in], set);
                for r in 0..n_out {
                    let v = dot(n_in, &w[r * wrow..(r + 1) * wrow], &xq);
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
        if !avx2_available() || !is_x86_feature_detected!("avxvnni") {
            eprintln!("no AVX-VNNI on this CPU: nothing to compare");
            return;
        }
        let mut rng = Rng(77);
        for ty in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0, GgmlType::IQ4_NL] {
            let (p1, p4) = avx2::dot_kernels_with(ty, false).unwrap();
            let (v1, v4) = avx2::dot_kernels_with(ty, true).unwrap();
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
