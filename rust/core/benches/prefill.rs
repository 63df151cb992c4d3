//! Prefill matmul benchmark (not a test): `cargo bench -p pyllama-core --bench prefill [-- FILTER]`.
//!
//! The pp512 shapes of Gemma 3 270M and SmolLM2 135M (n_in, n_out, weight type), and rows of
//! a 7B-class model's length (4096) in four types, with 512 tokens on ONE thread: the best of several repetitions, in GMAC/s (multiply-adds of the
//! product per second). One thread and the best CPU time keep the number steady on a shared
//! machine; the model's pp512 runs on the thread pool, which only splits the rows.
//! `PYLLAMA_KERNELS=avx2` measures the plain AVX2 kernels (no AVX-VNNI), `=ref` the scalar ones.

use pyllama_core::ggml_type::GgmlType;
use pyllama_core::model::TensorView;
use pyllama_core::ops::matmul::matmul;
use pyllama_core::quant::{self, fp};
use pyllama_core::threadpool::ThreadPool;
use std::hint::black_box;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Random blocks whose f16 scales are small and finite (no NaN/inf slow paths).
fn random_weights(ty: GgmlType, n_in: usize, n_out: usize) -> Vec<u8> {
    let mut rng = Rng(0x1234_5678_9abc_def1);
    let bytes = ty.row_size(n_in).unwrap() * n_out;
    let mut v: Vec<u8> = (0..bytes).map(|_| (rng.next() >> 32) as u8).collect();
    let fields: &[usize] = match ty {
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 | GgmlType::IQ4_NL | GgmlType::IQ4_XS => &[0],
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
        GgmlType::Q6_K => &[208],
        _ => &[],
    };
    for blk in v.chunks_exact_mut(ty.type_size()) {
        for &o in fields {
            let h = fp::f32_to_f16(((rng.next() >> 40) as f32 / (1u64 << 24) as f32) * 0.01);
            blk[o..o + 2].copy_from_slice(&h.to_le_bytes());
        }
    }
    v
}

/// CPU time of the calling thread (the 1-thread pool runs the matmul on it): unlike wall
/// time, not inflated when other processes share the cores.
fn thread_cpu_seconds() -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: plain syscall filling a local struct.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

fn main() {
    let filter: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
    let shapes: [(&str, GgmlType, usize, usize); 16] = [
        ("gemma q5_0 gate/up", GgmlType::Q5_0, 640, 2048),
        ("gemma q5_0 q", GgmlType::Q5_0, 640, 1024),
        ("gemma q8_0 v", GgmlType::Q8_0, 640, 256),
        ("gemma q4_k down", GgmlType::Q4_K, 2048, 640),
        ("gemma q6_k down", GgmlType::Q6_K, 2048, 640),
        ("gemma q4_k out", GgmlType::Q4_K, 1024, 640),
        ("smollm2 q4_1 gate/up", GgmlType::Q4_1, 576, 1536),
        ("smollm2 q4_1 down", GgmlType::Q4_1, 1536, 576),
        // the other 32-element types in SmolLM2's shapes (quantized from the same weights)
        ("q5_1 gate/up", GgmlType::Q5_1, 576, 1536),
        ("q5_1 down", GgmlType::Q5_1, 1536, 576),
        ("q4_0 gate/up", GgmlType::Q4_0, 576, 1536),
        ("q4_0 down", GgmlType::Q4_0, 1536, 576),
        // a 7B-class model's row length (a packed group of 128 blocks: past L1 in the
        // interleaved pairs' layouts, 576 / 640 bytes a block)
        ("7b q4_0 4096", GgmlType::Q4_0, 4096, 1024),
        ("7b q8_0 4096", GgmlType::Q8_0, 4096, 1024),
        ("7b q4_1 4096", GgmlType::Q4_1, 4096, 1024),
        ("7b q4_k 4096", GgmlType::Q4_K, 4096, 1024),
    ];
    let pool = ThreadPool::new(1);
    let n_tokens = 512;
    println!("kernels: {:?} (vnni {})", quant::kernel_set(), {
        #[cfg(target_arch = "x86_64")]
        {
            quant::avx2::vnni_available()
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    });
    for (name, ty, n_in, n_out) in shapes {
        if !filter.is_empty() && !filter.iter().any(|f| name.contains(f.as_str())) {
            continue;
        }
        let data = random_weights(ty, n_in, n_out);
        let w = TensorView { name: "w", ty, ne: [n_in, n_out, 1, 1], data: &data, layout: pyllama_core::model::Layout::Plain };
        let x: Vec<f32> = (0..n_in * n_tokens).map(|i| ((i * 37) % 101) as f32 * 0.01 - 0.5).collect();
        let mut out = vec![0f32; n_out * n_tokens];
        let mut scratch = Vec::new();
        let mut best = f64::INFINITY;
        for _ in 0..15 {
            let t0 = thread_cpu_seconds();
            matmul(&pool, &w, &x, n_tokens, &mut out, &mut scratch);
            best = best.min(thread_cpu_seconds() - t0);
            black_box(&out);
        }
        let macs = (n_in * n_out * n_tokens) as f64;
        println!("{name:24} {ty:>6} [{n_in:5} x {n_out:5}] x {n_tokens}: {:7.2} ms  {:6.1} GMAC/s", best * 1e3, macs / best / 1e9);
    }
}
