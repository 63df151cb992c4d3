//! Batched-decode matmul benchmark (not a test): `cargo bench -p pyllama-core --bench batched
//! [-- FILTER]`. The decode shapes of Gemma 3 270M, SmolLM2 135M and Qwen2.5-Coder 0.5B
//! (n_in, n_out, weight type), and a 7B model's 4096 x 4096 Q4_K, with n_tokens = 1..16
//! (`BATCH_TOKENS=1,2,32` picks others; K sequences decoding one token each,
//! llama-batched-bench's npl) on ONE thread: the best CPU time of several repetitions, in
//! microseconds per matmul and per token. The output projections (Gemma: 262144 x 640 Q8_0,
//! 178 MB) stream from RAM as in a real decode step; the small layer matrices sit in cache.
//! `PYLLAMA_NO_COLS=1` runs the leftover tokens one by one (the path before the multi-token
//! kernels), `PYLLAMA_KERNELS=avx2|avx512|ref` picks the kernel set. Formats with an x4
//! row-group layout on this CPU (`quant::repack`) run a second line with it (" x4").

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

/// CPU time of the calling thread (the 1-thread pool runs the matmul on it).
fn thread_cpu_seconds() -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: plain syscall filling a local struct.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

fn main() {
    let filter: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
    let shapes: [(&str, GgmlType, usize, usize); 11] = [
        ("gemma q5_0 gate/up", GgmlType::Q5_0, 640, 2048),
        ("gemma q4_k down", GgmlType::Q4_K, 2048, 640),
        ("gemma q6_k down", GgmlType::Q6_K, 2048, 640),
        ("gemma q4_k attn_out", GgmlType::Q4_K, 1024, 640),
        ("gemma q8_0 v", GgmlType::Q8_0, 640, 256),
        ("gemma q8_0 output", GgmlType::Q8_0, 640, 262144),
        ("smollm2 q4_1 gate/up", GgmlType::Q4_1, 576, 1536),
        ("smollm2 q4_1 down", GgmlType::Q4_1, 1536, 576),
        ("smollm2 q8_0 output", GgmlType::Q8_0, 576, 49152),
        ("qwen q5_0 gate/up", GgmlType::Q5_0, 896, 4864),
        ("7b q4_k attn", GgmlType::Q4_K, 4096, 4096),
    ];
    let pool = ThreadPool::new(1);
    println!("kernels: {:?}, no_cols {}", quant::kernel_set(), std::env::var_os("PYLLAMA_NO_COLS").is_some());
    println!("{:24} {:>6} {:>16} | us per matmul (us per token) for n_tokens =", "", "", "");
    // BATCH_TOKENS=16,32,64 times other token counts
    let ks: Vec<usize> = std::env::var("BATCH_TOKENS").ok().map(|v| v.split(',').filter_map(|x| x.trim().parse().ok()).collect()).unwrap_or_else(|| vec![1, 2, 3, 4, 6, 8, 16]);
    print!("{:24} {:>6} {:>16} |", "", "", "");
    for &k in &ks {
        print!(" {k:>16}");
    }
    println!();
    for (name, ty, n_in, n_out) in shapes {
        if !filter.is_empty() && !filter.iter().any(|f| name.contains(f.as_str())) {
            continue;
        }
        let data = random_weights(ty, n_in, n_out);
        let mut packed = vec![0u8; data.len()];
        // the x4 row-group layout too, where this CPU has its kernel (`quant::repack`)
        let x4 = quant::repack::x4_kernel(ty).is_some() && quant::repack::repack_x4(ty, n_in, &data, &mut packed).is_ok();
        let big = data.len() > 16 << 20;
        for (label, bytes, layout) in [("", &data, pyllama_core::model::Layout::Plain), (" x4", &packed, pyllama_core::model::Layout::X4)] {
        if layout == pyllama_core::model::Layout::X4 && !x4 {
            continue;
        }
        let w = TensorView { name: "w", ty, ne: [n_in, n_out, 1, 1], data: bytes, layout };
        print!("{:24} {ty:>6} [{n_in:5} x {n_out:6}] |", format!("{name}{label}"));
        for &k in &ks {
            let x: Vec<f32> = (0..n_in * k).map(|i| ((i * 37) % 101) as f32 * 0.01 - 0.5).collect();
            let mut out = vec![0f32; n_out * k];
            let mut scratch = Vec::new();
            let mut best = f64::INFINITY;
            for _ in 0..if big { 5 } else { 30 } {
                let t0 = thread_cpu_seconds();
                matmul(&pool, &w, &x, k, &mut out, &mut scratch);
                best = best.min(thread_cpu_seconds() - t0);
                black_box(&out);
            }
            print!(" {:>8.0} ({:>5.0})", best * 1e6, best * 1e6 / k as f64);
        }
        println!();
        }
    }
}
